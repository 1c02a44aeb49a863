#!/bin/sh
# install-smoke.sh - `cmake --install` gives a usable, narrow C API, a CTest
# (abi_install; docs/c-api.md).
#
#   install-smoke.sh BUILD_DIR SOURCE_DIR CC PREFIX [CFLAG...]
#
# Installs BUILD_DIR into PREFIX (emptied first), checks that PREFIX holds
# exactly the public headers (SOURCE_DIR/include/datahelix/*.h) and none of
# the internal ones (SOURCE_DIR/src/include/datahelix/*.h), then compiles
# tests/abi/install_smoke.c with -I PREFIX/include alone, links it to
# PREFIX/lib/libdatahelix.so, and runs it.  CFLAGs are added to the compile
# and link (the sanitizer build passes its -fsanitize flags).
set -eu
[ $# -ge 4 ] || { echo "usage: $0 BUILD SOURCE CC PREFIX [CFLAG...]" >&2; exit 2; }
build=$1 src=$2 cc=$3 prefix=$4
shift 4
export LC_ALL=C

rm -rf "$prefix"
cmake --install "$build" --prefix "$prefix" >"$prefix.log" 2>&1 ||
    { cat "$prefix.log" >&2; echo "install: cmake --install failed" >&2; exit 1; }

status=0
(cd "$src/include/datahelix" && ls *.h) >"$prefix.want"
(cd "$prefix/include/datahelix" && ls) >"$prefix.got"
if ! cmp -s "$prefix.want" "$prefix.got"; then
    echo "install: installed headers differ from include/datahelix/:" >&2
    diff "$prefix.want" "$prefix.got" >&2 || true
    status=1
fi
for h in "$src"/src/include/datahelix/*.h; do
    if [ -e "$prefix/include/datahelix/${h##*/}" ]; then
        echo "install: internal header ${h##*/} was installed" >&2
        status=1
    fi
done

mkdir -p "$prefix/scratch"
"$cc" -std=c11 -pedantic -Wall -Wextra -Werror "$@" \
    -I "$prefix/include" "$src/tests/abi/install_smoke.c" \
    -L "$prefix/lib" -ldatahelix -Wl,-rpath,"$prefix/lib" \
    -o "$prefix/install_smoke"
# -ldatahelix picks the shared library over the archive beside it.
readelf -d "$prefix/install_smoke" | grep -q 'NEEDED.*libdatahelix\.so' ||
    { echo "install: install_smoke did not link libdatahelix.so" >&2; exit 1; }
"$prefix/install_smoke" "$prefix/scratch" || status=1
# The Python package: every module of python/datahelix/ installed, and
# the installed copy imports (a module left out of the install list
# breaks `import datahelix` only after `make install`).
pydir=$(ls -d "$prefix"/lib/python3*/dist-packages/datahelix 2>/dev/null | head -1)
if [ -n "$pydir" ]; then
    for m in "$src"/python/datahelix/*.py; do
        [ -e "$pydir/${m##*/}" ] ||
            { echo "install: python module ${m##*/} was not installed" >&2; status=1; }
    done
    (cd "$prefix/scratch" && PYTHONPATH="${pydir%/datahelix}" /usr/bin/python3 -c \
        "import datahelix, sys; sys.exit(datahelix.__file__.startswith('$pydir') is False)") ||
        { echo "install: the installed datahelix package does not import" >&2; status=1; }
fi
[ $status -eq 0 ] && echo "install: public headers only; a C program built against them runs"
exit $status
