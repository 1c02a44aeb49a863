#!/bin/sh
# make-bundle.sh - `make bundle`: a relocatable tree and tarball of a build
# that runs on another glibc >= 2.36 Linux x86-64 without Debian's packages
# (docs/bundle.md).
#
#   make-bundle.sh BUILD OUTDIR   -> OUTDIR/datahelix-V-linux-ARCH/ and
#                                    OUTDIR/datahelix-V-linux-ARCH.tar.gz
#
#   bin/datahelix, bin/datahelix-svc RUNPATH $ORIGIN/../lib
#   lib/libdatahelix.so*             the C library (RUNPATH $ORIGIN)
#   lib/lib*.so.N                    every shared library those need that is
#                                    not in SYSTEM below (FFmpeg, ZeroMQ,
#                                    libsodium, protobuf-c, jansson, ...),
#                                    copied from this machine, RUNPATH $ORIGIN
#   python/datahelix/                the Python package; _C.abi3.so (stable
#                                    ABI, CPython >= 3.11) RUNPATH
#                                    $ORIGIN/../../lib; bin/datahelix{,-svc}
#                                    link to ../../../bin/datahelix{,-svc}
#   include/datahelix/               the public C headers
#   REQUIRES                         what the host must still give: the
#                                    SYSTEM libraries and the newest symbol
#                                    versions the bundle uses from them
#
# BUNDLE_GZIP=N sets the tarball's gzip level (default 1).
# It reuses BUILD (make build): nothing is compiled here; our own ELF files
# lose their debug info (strip -g), the copied ones are Debian's, stripped.
set -eu
[ $# -eq 2 ] || { echo "usage: $0 BUILD OUTDIR" >&2; exit 2; }
build=$1 out=$2
for t in patchelf ldd strip objdump tar gzip; do
    command -v $t >/dev/null 2>&1 ||
        { echo "make-bundle: $t not found (scripts/setup-deps.sh installs it)" >&2; exit 1; }
done
here=$(cd "$(dirname "$0")/.." && pwd)
ext="$here/python/datahelix/_C.abi3.so"
for f in "$build/datahelix" "$build/datahelix-svc" "$build/libdatahelix.so" "$ext"; do
    [ -e "$f" ] || { echo "make-bundle: $f missing (run make build first)" >&2; exit 1; }
done

# What every glibc >= 2.36 distribution has, and what must not be doubled in
# one process (a second libc or libstdc++ beside torch's breaks it): these
# stay the host's.  Everything else the ELF files need is bundled.
SYSTEM="linux-vdso.so.1 ld-linux-x86-64.so.2 libc.so.6 libm.so.6
libpthread.so.0 libdl.so.2 librt.so.1 libresolv.so.2 libutil.so.1
libanl.so.1 libstdc++.so.6 libgcc_s.so.1"

version=$("$build/datahelix" --version | awk '{print $2}')
name="datahelix-$version-linux-$(uname -m)"
mkdir -p "$out"
out=$(cd "$out" && pwd)
root="$out/$name"
rm -rf "$root" "$root.tar" "$root.tar.gz"
mkdir -p "$root/bin" "$root/lib" "$root/python/datahelix/bin" "$root/include"

cp "$build/datahelix" "$build/datahelix-svc" "$root/bin/"
cp -P "$build"/libdatahelix.so* "$root/lib/"
cp "$here"/python/datahelix/*.py "$ext" "$root/python/datahelix/"
ln -s ../../../bin/datahelix "$root/python/datahelix/bin/datahelix"
ln -s ../../../bin/datahelix-svc "$root/python/datahelix/bin/datahelix-svc"
cp -R "$here/include/datahelix" "$root/include/"
real_lib=$(readlink -f "$build/libdatahelix.so")
strip -g "$root/bin/datahelix" "$root/bin/datahelix-svc" "$root/lib/$(basename "$real_lib")" \
    "$root/python/datahelix/_C.abi3.so"

is_system() {
    for s in $SYSTEM; do [ "$1" = "$s" ] && return 0; done
    return 1
}

# ldd lists the whole closure of each of our ELF files; each
# library is copied under its soname (the name DT_NEEDED asks for).
n=0
for elf in "$build/datahelix" "$build/datahelix-svc" "$real_lib" "$ext"; do
    env -u LD_LIBRARY_PATH ldd "$elf" >"$out/.ldd.$$" ||
        { echo "make-bundle: ldd $elf failed" >&2; rm -f "$out/.ldd.$$"; exit 1; }
    if grep -q 'not found' "$out/.ldd.$$"; then
        echo "make-bundle: $elf: a library is missing here:" >&2
        grep 'not found' "$out/.ldd.$$" >&2
        rm -f "$out/.ldd.$$"
        exit 1
    fi
    while read -r so _ path _; do
        is_system "$so" && continue
        case $so in libdatahelix.so*) continue ;; esac
        [ -e "$root/lib/$so" ] && continue
        cp -L "$path" "$root/lib/$so"
        chmod u+w "$root/lib/$so"
        n=$((n + 1))
    done <<EOF
$(awk '$2 == "=>" && $3 ~ /^\// {print $1, $2, $3}' "$out/.ldd.$$")
EOF
done
rm -f "$out/.ldd.$$"

# RUNPATH (not RPATH): each object finds its own needs next to itself, and
# LD_LIBRARY_PATH still wins for a user who wants another FFmpeg.
# $ORIGIN is for the dynamic loader, not the shell:
# shellcheck disable=SC2016
patchelf --set-rpath '$ORIGIN/../lib' "$root/bin/datahelix"
# shellcheck disable=SC2016
patchelf --set-rpath '$ORIGIN/../lib' "$root/bin/datahelix-svc"
# shellcheck disable=SC2016
patchelf --set-rpath '$ORIGIN/../../lib' "$root/python/datahelix/_C.abi3.so"
for f in "$root"/lib/*; do
    # shellcheck disable=SC2016
    [ -L "$f" ] || patchelf --set-rpath '$ORIGIN' "$f"
done

# REQUIRES: the newest GLIBC_ / GLIBCXX_ / GCC_ versions any bundled file
# asks for (objdump -T: the dynamic symbols' version references).
req() {
    find "$root" -type f \( -name '*.so*' -o -path '*/bin/*' \) -exec objdump -T {} + 2>/dev/null |
        grep -o "($1_[0-9.]*)" | tr -d '()' | sed "s/^$1_//" | sort -t. -k1,1n -k2,2n -k3,3n -u | tail -1
}
{
    echo "datahelix $version bundle for Linux $(uname -m)"
    # shellcheck disable=SC1091
    echo "built on: $(. /etc/os-release && echo "$PRETTY_NAME")"
    echo "the host must have: $SYSTEM" | tr '\n' ' '
    echo
    echo "newest versions used: GLIBC_$(req GLIBC) GLIBCXX_$(req GLIBCXX) GCC_$(req GCC)"
    echo "Python: CPython >= 3.11 (python/datahelix/_C.abi3.so, stable ABI)"
} >"$root/REQUIRES"

# gzip -1 by default: 4x faster than -6 for 8% more bytes (CI builds one
# on every `make test`); BUNDLE_GZIP=9 for a release.
tar -C "$out" -cf "$root.tar" "$name"
gzip -f "-${BUNDLE_GZIP:-1}" "$root.tar"
echo "bundle: $root ($n libraries bundled, $(du -sh "$root" | cut -f1)); $root.tar.gz ($(du -h "$root.tar.gz" | cut -f1))"
