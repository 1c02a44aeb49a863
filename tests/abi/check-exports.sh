#!/bin/sh
# check-exports.sh - the dynamic symbols of libdatahelix.so are exactly the
# public C API (docs/c-api.md "Exported symbols"), a CTest (abi_exports).
#
#   check-exports.sh NM LIB LIST INCLUDE_DIR           check
#   check-exports.sh NM LIB LIST INCLUDE_DIR --update  rewrite LIST from LIB
#
# Fails when LIB exports a symbol LIST does not name or misses one it does,
# when an exported symbol does not start with dh_ (or is an internal dh__
# one), or when one is declared in no header under INCLUDE_DIR (the
# installed headers).  LIST is sorted, one symbol a line (LC_ALL=C order).
set -eu
[ $# -ge 4 ] || { echo "usage: $0 NM LIB LIST INCLUDE_DIR [--update]" >&2; exit 2; }
nm=$1 lib=$2 list=$3 incdir=$4 mode=${5:-check}
export LC_ALL=C
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Defined dynamic symbols only (what another program can link against).
"$nm" -D --defined-only "$lib" | awk 'NF >= 3 { print $3 }' | sort -u >"$tmp/got"
[ -s "$tmp/got" ] || { echo "abi: $lib exports nothing (not built?)" >&2; exit 1; }

if [ "$mode" = --update ]; then
    cp "$tmp/got" "$list"
    echo "abi: wrote $(wc -l <"$list") symbols to $list; review the diff"
    exit 0
fi

status=0
sort -u "$list" >"$tmp/want"
if ! cmp -s "$list" "$tmp/want"; then
    echo "abi: $list is not sorted and unique (LC_ALL=C sort -u)" >&2
    status=1
fi
comm -13 "$tmp/want" "$tmp/got" >"$tmp/extra"
comm -23 "$tmp/want" "$tmp/got" >"$tmp/missing"
if [ -s "$tmp/extra" ]; then
    echo "abi: $lib exports symbols that $list does not list:" >&2
    sed 's/^/  + /' "$tmp/extra" >&2
    status=1
fi
if [ -s "$tmp/missing" ]; then
    echo "abi: $lib no longer exports symbols that $list lists:" >&2
    sed 's/^/  - /' "$tmp/missing" >&2
    status=1
fi
# The prefix rule (STYLE.md "Names and headers"): public dh_, never dh__.
if grep -v '^dh_' "$tmp/got" >"$tmp/bad" || grep '^dh__' "$tmp/got" >>"$tmp/bad"; then
    if [ -s "$tmp/bad" ]; then
        echo "abi: exported symbols outside the public dh_ names (mark only" \
             "public declarations DH_API):" >&2
        sed 's/^/  ! /' "$tmp/bad" >&2
        status=1
    fi
fi
# Each export is declared in an installed header, or no user can call it.
cat "$incdir"/datahelix/*.h >"$tmp/headers"
while read -r sym; do
    grep -Eq "(^|[^A-Za-z0-9_])$sym[[:space:]]*\(" "$tmp/headers" ||
        echo "$sym" >>"$tmp/undeclared"
done <"$tmp/got"
if [ -s "$tmp/undeclared" ]; then
    echo "abi: exported but declared in no header of $incdir/datahelix:" >&2
    sed 's/^/  ? /' "$tmp/undeclared" >&2
    status=1
fi

if [ $status -ne 0 ]; then
    cat >&2 <<MSG
abi: the exported API changed.  If that is deliberate (a new public function
marked DH_API in include/datahelix/, or one removed), update the list and
commit it with the change:
    tests/abi/check-exports.sh $nm $lib $list $incdir --update
otherwise keep the function internal (no DH_API; a header in src/include/).
MSG
    exit 1
fi
echo "abi: $(wc -l <"$tmp/got") exported symbols, all public dh_, as listed"
