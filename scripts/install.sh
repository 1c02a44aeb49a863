#!/bin/sh
# install.sh - `make install` / `make uninstall` (README "Installing").
#
#   install.sh install BUILD PREFIX     cmake --install BUILD into PREFIX and
#                                       record every file in
#                                       PREFIX/share/datahelix/installed-files
#   install.sh uninstall BUILD PREFIX   remove the recorded files, then the
#                                       folders that are left empty
#
# The record lives in the install tree, so an install elsewhere (a test's
# temporary prefix) never replaces the record of the one in /usr/local.
set -eu
[ $# -eq 3 ] || { echo "usage: $0 install|uninstall BUILD PREFIX" >&2; exit 2; }
verb=$1 build=$2 prefix=$3
record="$prefix/share/datahelix/installed-files"

case $verb in
install)
    cmake --install "$build" --prefix "$prefix"
    mkdir -p "$(dirname "$record")"
    # CMake's manifest has no newline after its last line.
    { cat "$build/install_manifest.txt"; echo; echo "$record"; } |
        grep -v '^$' >"$record.tmp"
    mv "$record.tmp" "$record"
    echo "install: $(wc -l <"$record") files under $prefix (make uninstall PREFIX=$prefix removes them)"
    ;;
uninstall)
    [ -f "$record" ] || {
        echo "uninstall: no record of an install under $prefix ($record): nothing removed" >&2
        exit 1; }
    list=$(mktemp)
    trap 'rm -f "$list"' EXIT
    cp "$record" "$list"
    n=0
    while IFS= read -r f; do
        case $f in
        "$prefix"/*) ;;
        *) echo "uninstall: $f is not under $prefix: left alone" >&2; continue ;;
        esac
        if [ -e "$f" ] || [ -L "$f" ]; then rm -f "$f" && n=$((n + 1)); fi
    done <"$list"
    # Folders the install made and that are empty now; never $prefix itself.
    sed 's|/[^/]*$||' "$list" | sort -ru | while IFS= read -r d; do
        while [ "$d" != "$prefix" ] && [ "${d#"$prefix"/}" != "$d" ]; do
            rmdir "$d" 2>/dev/null || break
            d=${d%/*}
        done
    done
    echo "uninstall: removed $n files from $prefix"
    ;;
*) echo "usage: $0 install|uninstall BUILD PREFIX" >&2; exit 2 ;;
esac
