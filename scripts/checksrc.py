#!/usr/bin/python3
"""checksrc: the house rules a compiler does not check, over the C tree.

    scripts/checksrc.py [FILE|DIR ...]     default: src include tests bench

Prints `file:line: rule: message` per finding and exits 1 if there was any
(0 when clean, 2 on a usage error).  Standard library only.

Rules (STYLE.md "Comments and formatting", curl's checksrc for the idea):
  banned        a call to a function with a safer replacement in this
                tree: no bounds (strcpy, strcat, sprintf, vsprintf, gets),
                truncation without a terminator (strncpy, strncat), no error
                report (atoi, atol, atoll, atof), hidden static state
                (strtok, asctime, ctime, localtime, gmtime), races on file
                names (tmpnam, tempnam, mktemp), the stack unbounded
                (alloca), a shell (system)
  alloc         the result of malloc/calloc/realloc/strdup/strndup (or the
                dh__ seam's) assigned to a variable that the next lines
                never test against NULL; `p = realloc(p, ...)` (the old
                block leaks when it fails).  A heuristic: it looks a few
                lines ahead of the call for `!p`, `p == NULL`, `if (p)`,
                `assert_non_null(p)` and the like.
  secret-cmp    strcmp, strncmp, memcmp, bcmp or strcasecmp on an operand
                that names a token or a secret (`token`, `secret`, `->sec`,
                `.sec`): its time says where the bytes first differ; use
                dh__secret_eq() (sodium_memcmp, runtime/keys.h)
  whitespace    trailing blanks; a tab (the style indents with spaces); a
                CR (CRLF line ends); no newline at the end of the file
  long-line     over 100 columns (the style's upper bound)

A line that means it says so: `/* checksrc: ok */` (or `// checksrc: ok`)
on the line, or on the line above, silences every rule for that line;
`checksrc: ok banned` (a rule's name after it) silences that rule alone.
Code inside comments and string literals is not checked for calls.
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_DIRS = ("src", "include", "tests", "bench")
SKIP_DIRS = {"corpus"}  # fuzz inputs are data, not code
MAX_COLUMNS = 100
LOOKAHEAD = 15  # lines after an allocation searched for its NULL check

BANNED = {
    "strcpy": "no bound: use snprintf(dst, sizeof(dst), \"%s\", src) or "
              "memcpy with a checked length",
    "strcat": "no bound: use snprintf at an offset",
    "strncpy": "leaves no terminator when it truncates: use snprintf",
    "strncat": "bound is the space left, easy to get wrong: use snprintf",
    "sprintf": "no bound: use snprintf",
    "vsprintf": "no bound: use vsnprintf",
    "gets": "no bound: use fgets",
    "atoi": "no error report: use strtol and check end and range",
    "atol": "no error report: use strtol and check end and range",
    "atoll": "no error report: use strtoll and check end and range",
    "atof": "no error report: use strtod and check end",
    "strtok": "hidden static state: use strtok_r or a scan",
    "asctime": "static buffer: use strftime",
    "ctime": "static buffer: use strftime with localtime_r",
    "localtime": "static result: use localtime_r",
    "gmtime": "static result: use gmtime_r",
    "tmpnam": "races on the name: use mkstemp",
    "tempnam": "races on the name: use mkstemp",
    "mktemp": "races on the name: use mkstemp",
    "alloca": "unbounded stack: use a fixed array or the heap",
    "system": "runs a shell: use posix_spawn or fork and exec",
}
ALLOCATORS = ("malloc", "calloc", "realloc", "strdup", "strndup",
              "dh__malloc", "dh__calloc", "dh__realloc", "dh__strdup",
              "dh__strndup")

CALL_RE = re.compile(r"(?<![\w.>])(" + "|".join(BANNED) + r")\s*\(")
CMP_RE = re.compile(r"(?<![\w.>])(strcmp|strncmp|memcmp|bcmp|strcasecmp)"
                    r"\s*\(([^;]*)")
SECRET_RE = re.compile(r"token|secret|(?:->|\.)sec\b")
ALLOC_RE = re.compile(
    r"(?:^|[;{(,]|\s)"                              # start of the target
    r"(?:[A-Za-z_][\w \t]*?[\s*]+)?"                # optional declaration
    r"(?P<var>[A-Za-z_][\w]*(?:(?:\.|->)[A-Za-z_]\w*|\[[^\]=]*\])*)"
    r"\s*=\s*(?:\([^()]*\)\s*)?"                    # optional cast
    r"(?P<fn>" + "|".join(ALLOCATORS) + r")\s*\((?P<args>.*)")
OK_RE = re.compile(r"checksrc:\s*ok\b([ \t]+[a-z-]+)?")


def strip_code(text):
    """`text` with comments and string/char literals blanked (newlines
    kept, so line numbers hold)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(c + re.sub(r"[^\n]", " ", text[i + 1:j - 1]) +
                       (c if j - 1 > i else ""))
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def allowed(raw_lines, k, rule):
    """Whether line k (0-based) or the one above carries the marker for
    `rule`."""
    for j in (k, k - 1):
        if 0 <= j < len(raw_lines):
            m = OK_RE.search(raw_lines[j])
            if m and (not m.group(1) or m.group(1).strip() == rule):
                return True
    return False


def null_checked(var, code_lines, k):
    """Whether `var` is tested for NULL on line k (after the call) or in
    the LOOKAHEAD lines after it."""
    v = re.escape(var)
    tests = [r"!\s*\(?\s*" + v + r"\b(?!\s*(?:\.|->|\[))",
             r"\b" + v + r"\s*[!=]=\s*NULL\b",
             r"\bNULL\s*[!=]=\s*" + v + r"\b",
             r"\bif\s*\(\s*" + v + r"\s*\)",
             r"\bif\s*\(\s*" + v + r"\s*(?:&&|\|\|)",
             r"(?:&&|\|\|)\s*" + v + r"\s*(?:\)|&&|\|\|)",
             r"\bassert_non_null\s*\(\s*" + v + r"\s*\)",
             r"\bassert\s*\(\s*" + v + r"\s*\)",
             r"\bwhile\s*\(\s*" + v + r"\s*\)",
             r"\b" + v + r"\s*\?"]
    window = " ".join(code_lines[k:k + LOOKAHEAD + 1])
    return any(re.search(t, window) for t in tests)


def check_alloc(path, raw_lines, code_lines, k, out):
    line = code_lines[k]
    for m in ALLOC_RE.finditer(line):
        var, fn = m.group("var"), m.group("fn")
        if fn.endswith("realloc") and \
                re.match(r"\s*" + re.escape(var) + r"\s*,", m.group("args")):
            if not allowed(raw_lines, k, "alloc"):
                out.append(f"{path}:{k + 1}: alloc: {var} = {fn}({var}, "
                           "...) leaks the old block when it fails: assign "
                           "to a temporary first")
            continue
        before = line[:m.start("var")]
        if re.search(r"!\s*\((?:\s*[\w.>-]+\s*=)*\s*$", before) or \
                re.search(r"(?:&&|\|\||\b(?:if|while)\s*\()\s*\(\s*$",
                          before):
            continue  # `!(p = malloc(..))`, `if (n && (p = malloc(..)))`
        rest = [line[m.end():]] + code_lines[k + 1:]
        if re.search(r"\(\s*$", before) and \
                re.search(r"\)\s*[!=]=\s*NULL\b", rest[0]):
            continue  # `(p = malloc(...)) == NULL`
        if not null_checked(var, rest, 0) and \
                not allowed(raw_lines, k, "alloc"):
            out.append(f"{path}:{k + 1}: alloc: the result of {fn}() in "
                       f"'{var}' is not checked for NULL in the next "
                       f"{LOOKAHEAD} lines")


def check_text(path, text):
    """Findings for one file's text: a list of 'file:line: rule: msg'."""
    out = []
    raw_lines = text.split("\n")
    if raw_lines and raw_lines[-1] == "":
        raw_lines.pop()
    elif text:
        out.append(f"{path}:{len(raw_lines)}: whitespace: no newline at "
                   "the end of the file")
    code_lines = strip_code(text).split("\n")
    for k, raw in enumerate(raw_lines):
        def emit(rule, msg):
            if not allowed(raw_lines, k, rule):
                out.append(f"{path}:{k + 1}: {rule}: {msg}")

        if raw.endswith("\r"):
            emit("whitespace", "CR at the end of the line (CRLF): use LF")
            raw = raw[:-1]
        if raw != raw.rstrip(" \t\f\v"):
            emit("whitespace", "trailing whitespace")
        if "\t" in raw:
            emit("whitespace", "tab: the style indents with spaces")
        if len(raw) > MAX_COLUMNS:
            emit("long-line", f"{len(raw)} columns, over {MAX_COLUMNS}")
        code = code_lines[k] if k < len(code_lines) else ""
        for m in CALL_RE.finditer(code):
            emit("banned", f"{m.group(1)}(): {BANNED[m.group(1)]}")
        for m in CMP_RE.finditer(code):
            if SECRET_RE.search(m.group(2)):
                emit("secret-cmp", f"{m.group(1)}() on a secret takes time "
                     "that says where it differs: use dh__secret_eq() "
                     "(sodium_memcmp)")
        if "=" in code and "(" in code:
            check_alloc(path, raw_lines, code_lines, k, out)
    return out


def check_file(path):
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        return [f"{path}:0: io: {e.strerror}"]
    return check_text(path, data.decode("utf-8", errors="replace"))


def c_files(args):
    """The C files named or under the folders named, sorted."""
    found = []
    for a in args:
        if os.path.isdir(a):
            for d, subdirs, files in os.walk(a):
                subdirs[:] = sorted(s for s in subdirs if s not in SKIP_DIRS)
                found += [os.path.join(d, f) for f in sorted(files)
                          if f.endswith((".c", ".h"))]
        elif os.path.exists(a):
            found.append(a)
        else:
            raise FileNotFoundError(a)
    return found


def main(argv):
    if any(a in ("-h", "--help") for a in argv):
        print(__doc__.strip())
        return 0
    if argv:
        args = argv
    else:
        os.chdir(ROOT)
        args = [d for d in DEFAULT_DIRS if os.path.isdir(d)]
    try:
        files = c_files(args)
    except FileNotFoundError as e:
        print(f"checksrc: {e}: no such file or folder", file=sys.stderr)
        return 2
    findings = []
    for f in files:
        findings += check_file(f)
    for x in findings:
        print(x)
    if findings:
        print(f"checksrc: {len(findings)} finding(s) in {len(files)} files",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
