#!/bin/sh
# make-deb.sh - `make deb`: a Debian package of a CMake build, with Debian's
# own tools (dpkg-shlibdeps for the library dependencies, dpkg-deb to pack).
#
#   make-deb.sh BUILD OUTDIR      -> OUTDIR/datahelix_VERSION_ARCH.deb
#
# It holds what `make install` installs, under /usr: the `datahelix`
# program, libdatahelix.{so,a}, the public headers, and the Python package
# in /usr/lib/python3/dist-packages (Debian's place for it).  Install with
# `dpkg -i` (or `apt install ./FILE.deb`, which also fetches what it
# depends on), remove with `dpkg -r datahelix`.
set -eu
[ $# -eq 2 ] || { echo "usage: $0 BUILD OUTDIR" >&2; exit 2; }
build=$1 out=$2
for t in dpkg-deb dpkg-shlibdeps; do
    command -v $t >/dev/null 2>&1 ||
        { echo "make-deb: $t not found (apt install dpkg-dev)" >&2; exit 1; }
done
version=$("$build/datahelix" --version | awk '{print $2}')
arch=$(dpkg --print-architecture)
pyver=$(/usr/bin/python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
root="$work/root"

DESTDIR="$root" cmake --install "$build" --prefix /usr --strip >"$work/install.log" 2>&1 ||
    { cat "$work/install.log" >&2; echo "make-deb: cmake --install failed" >&2; exit 1; }
if [ -d "$root/usr/lib/python$pyver/dist-packages" ]; then
    mkdir -p "$root/usr/lib/python3/dist-packages"
    mv "$root/usr/lib/python$pyver/dist-packages/datahelix" "$root/usr/lib/python3/dist-packages/"
    rmdir -p "$root/usr/lib/python$pyver/dist-packages" 2>/dev/null || true
fi

# dpkg-shlibdeps reads debian/control; a minimal one in a scratch folder.
mkdir -p "$work/src/debian"
printf 'Source: datahelix\n\nPackage: datahelix\nArchitecture: any\n' >"$work/src/debian/control"
elves=$(find "$root" -type f \( -name '*.so*' -o -path '*/bin/*' \) -exec sh -c \
    'for f; do head -c4 "$f" | grep -q ELF && echo "$f"; done' sh {} +)
# shellcheck disable=SC2086
shlibs=$(cd "$work/src" && dpkg-shlibdeps -O $(for e in $elves; do printf -- '-e%s ' "$e"; done) 2>"$work/shlibdeps.log" |
    sed -n 's/^shlibs:Depends=//p') ||
    { cat "$work/shlibdeps.log" >&2; echo "make-deb: dpkg-shlibdeps failed" >&2; exit 1; }
[ -n "$shlibs" ] || { cat "$work/shlibdeps.log" >&2; echo "make-deb: no library dependencies found" >&2; exit 1; }

mkdir -p "$root/DEBIAN"
size=$(du -sk "$root/usr" | awk '{print $1}')
cat >"$root/DEBIAN/control" <<CTL
Package: datahelix
Version: $version
Architecture: $arch
Maintainer: datahelix developers <datahelix@localhost>
Section: science
Priority: optional
Installed-Size: $size
Depends: $shlibs, python3 (>= $pyver), python3 (<< ${pyver%.*}.$((${pyver#*.} + 1)))
Recommends: python3-torch, python3-numpy
Description: data plane for training video and multimodal models
 Plans batches while samples are still descriptors, decodes each rank's
 next batch inside its current GPU step on whichever CPU can make the
 deadline, and hands it over through shared memory without a copy.
 This package holds the datahelix program, libdatahelix and its headers,
 and the Python package (datahelix.DataLoader).
CTL
# Python writes byte-code caches that dpkg does not own; remove them with
# the package so `dpkg -r` leaves nothing behind.
cat >"$root/DEBIAN/prerm" <<'SH'
#!/bin/sh
set -e
rm -rf /usr/lib/python3/dist-packages/datahelix/__pycache__
SH
chmod 0755 "$root/DEBIAN/prerm"
# libdatahelix.so in /usr/lib: refresh the loader's cache on install/remove.
echo "activate-noawait ldconfig" >"$root/DEBIAN/triggers"
mkdir -p "$out"
deb="$out/datahelix_${version}_${arch}.deb"
dpkg-deb --root-owner-group --build "$root" "$deb" >/dev/null
echo "make-deb: $deb ($(du -k "$deb" | awk '{print $1}') KiB; dpkg -i $deb, dpkg -r datahelix)"
