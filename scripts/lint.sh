#!/bin/sh
# make lint: the checks a compiler does not make, over the C tree (src/,
# include/, tests/, bench/; the fuzz corpora are data).
#
#   1. scripts/checksrc.py: banned calls, unchecked allocations,
#      whitespace, long lines.  Always enforced.
#   2. clang-format --dry-run -Werror with the checked-in .clang-format.
#      FORMAT_CHECK=on enforces it (a file that would change fails lint);
#      FORMAT_CHECK=off (the default until the tree has been reformatted
#      once, `make format`) only counts the files that would change.
#
# `scripts/lint.sh --files` prints the C files both checks cover, one a
# line (what `make format` reformats).
set -eu
cd "$(dirname "$0")/.."
PY=/usr/bin/python3
FORMAT_CHECK=${FORMAT_CHECK:-off}
CLANG_FORMAT=${CLANG_FORMAT:-clang-format}

c_files() {
    find src include tests bench -name corpus -prune -o \
         -type f \( -name '*.c' -o -name '*.h' \) -print | LC_ALL=C sort
}

if [ "${1:-}" = --files ]; then
    c_files
    exit 0
fi

case $FORMAT_CHECK in
on|off) ;;
*) echo "lint: FORMAT_CHECK=$FORMAT_CHECK: want on or off" >&2; exit 2 ;;
esac

status=0
echo "== checksrc"
$PY scripts/checksrc.py || status=1

echo "== clang-format (FORMAT_CHECK=$FORMAT_CHECK)"
if ! command -v "$CLANG_FORMAT" >/dev/null 2>&1; then
    echo "lint: $CLANG_FORMAT not found (scripts/setup-deps.sh installs it)" >&2
    [ "$FORMAT_CHECK" = on ] && status=1
    exit $status
fi
log=$(mktemp)
trap 'rm -f "$log"' EXIT
# One clang-format for every file: it reports each file that would change
# as FILE:LINE:COL: error: lines, and goes on to the next.
# shellcheck disable=SC2046
cf_rc=0
"$CLANG_FORMAT" --dry-run -Werror $(c_files) 2>"$log" || cf_rc=$?
total=$(c_files | wc -l)
bad=$(grep -oE '^[^: ]+:[0-9]+:[0-9]+: error' "$log" | cut -d: -f1 |
      sort -u | wc -l)
if [ "$cf_rc" -ne 0 ] && [ "$bad" -eq 0 ]; then
    # Failed without naming a file: a bad .clang-format or a crash.
    cat "$log" >&2
    echo "lint: $CLANG_FORMAT failed (exit $cf_rc)" >&2
    exit 1
fi
if [ "$FORMAT_CHECK" = on ]; then
    if [ "$bad" -gt 0 ]; then
        # The first place in each file, as clang-format says.
        awk -F: '/^[^: ]+:[0-9]+:[0-9]+: error/ && !seen[$1]++ { n = 3 }
                 n > 0 { print; n-- }' "$log"
        echo "lint: $bad of $total C files are not clang-formatted" \
             "(make format fixes them)" >&2
        status=1
    else
        echo "all $total C files clang-formatted"
    fi
else
    echo "$bad of $total C files would change under make format" \
         "(not enforced: FORMAT_CHECK=off)"
fi
exit $status
