"""scripts/checksrc.py (make lint): every rule fires on a small bad file,
with `file:line: rule:` and exit 1; clean code, the allowlist marker and
code inside comments or strings pass with exit 0; and the tree itself is
clean."""
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "checksrc.py"


def checksrc(*args, cwd=None):
    return subprocess.run(["/usr/bin/python3", str(SCRIPT), *map(str, args)],
                          capture_output=True, text=True, timeout=60,
                          cwd=cwd)


def check_one(tmp_path, text, name="x.c"):
    f = tmp_path / name
    f.write_bytes(text.encode() if isinstance(text, str) else text)
    return checksrc(f), f


CLEAN = """\
#include <stdio.h>
#include <stdlib.h>

/* strcpy(a, b) in a comment is prose, not a call */
static int f(char *dst, size_t n, const char *s)
{
    char *p = malloc(n);
    char *q;

    if (!p)
        return -1;
    if (!(q = strdup(s))) {
        free(p);
        return -1;
    }
    snprintf(dst, n, "%s: sprintf(x) and atoi(y) in a string", q);
    free(q);
    free(p);
    return (int)strtol(s, NULL, 10);
}
"""


def test_clean_code_passes(tmp_path):
    p, _ = check_one(tmp_path, CLEAN)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout == ""


@pytest.mark.parametrize("call", ["strcpy(d, s)", "strcat(d, s)",
                                  "sprintf(d, \"%d\", 1)",
                                  "vsprintf(d, f, ap)", "gets(d)",
                                  "atoi(s)", "atol(s)", "atof(s)",
                                  "strtok(s, \",\")", "strncpy(d, s, 4)",
                                  "localtime(&t)", "alloca(64)",
                                  "system(\"ls\")"])
def test_banned_calls(tmp_path, call):
    name = call.split("(")[0]
    p, f = check_one(tmp_path, f"void g(void)\n{{\n    (void){call};\n}}\n")
    assert p.returncode == 1
    assert p.stdout.startswith(f"{f}:3: banned: {name}(): "), p.stdout
    assert p.stdout.count("\n") == 1


@pytest.mark.parametrize("call", ["strcmp(r->token, t)",
                                  "strncmp(token, got, 32)",
                                  "memcmp(k->sec, s, 40)",
                                  "memcmp(a.secret, b, n)",
                                  "bcmp(x, peer_token, 32)"])
def test_comparing_a_secret_needs_constant_time(tmp_path, call):
    name = call.split("(")[0]
    p, f = check_one(tmp_path, f"int g(void)\n{{\n    return {call};\n}}\n")
    assert p.returncode == 1
    assert p.stdout.startswith(f"{f}:3: secret-cmp: {name}() on a secret"), \
        p.stdout
    assert "dh__secret_eq" in p.stdout


def test_constant_time_and_other_compares_pass(tmp_path):
    p, _ = check_one(tmp_path, "int g(void)\n{\n"
                     "    if (!dh__secret_eq(r->token, t))\n        return 1;\n"
                     "    if (strncmp(env, DH_RANK_TOKEN_ENV \"=\", 4))\n"
                     "        return 2;\n"
                     "    return strcmp(name, \"token\") + memcmp(a, b, 4) +\n"
                     "           strcmp(o->section, s);\n}\n")
    assert p.returncode == 0, p.stdout


def test_lookalikes_are_not_banned(tmp_path):
    p, _ = check_one(tmp_path, "void g(void)\n{\n    snprintf(d, 4, \"x\");\n"
                     "    s.atoi(1);\n    p->gets(2);\n    my_strcpy(d);\n"
                     "    strtok_r(s, \",\", &save);\n    localtime_r(&t, "
                     "&tm);\n}\n")
    assert p.returncode == 0, p.stdout


def test_unchecked_allocations(tmp_path):
    p, f = check_one(tmp_path, """\
void g(size_t n)
{
    char *a = malloc(n);
    struct s *b = (struct s *)calloc(1, n);

    o->name = dh__strdup("x");
    a[0] = b->c = o->name[0];
}
""")
    assert p.returncode == 1
    lines = p.stdout.splitlines()
    assert [x.split(": ")[0:2] for x in lines] == [
        [f"{f}:3", "alloc"], [f"{f}:4", "alloc"], [f"{f}:6", "alloc"]]
    assert "'a'" in lines[0] and "malloc()" in lines[0]
    assert "'b'" in lines[1] and "'o->name'" in lines[2]


def test_checked_allocations_pass(tmp_path):
    p, _ = check_one(tmp_path, """\
int g(size_t n)
{
    char *a = malloc(n), *b;
    int *c = calloc(n, 4);
    void *d;

    if (!a || c == NULL)
        return -1;
    if ((b = malloc(n)) == NULL)
        return -1;
    if (n && (d = realloc(a, 2 * n)))
        a = d;
    o->p = dh__malloc(n);
    assert_non_null(o->p);
    return 0;
}
""")
    assert p.returncode == 0, p.stdout


def test_realloc_onto_itself(tmp_path):
    p, f = check_one(tmp_path, "void g(void)\n{\n    s->v = realloc(s->v, 8);"
                     "\n    if (!s->v)\n        abort();\n}\n")
    assert p.returncode == 1
    assert p.stdout.startswith(f"{f}:3: alloc: s->v = realloc(s->v, ...) "
                               "leaks"), p.stdout


def test_whitespace_rules(tmp_path):
    p, f = check_one(tmp_path, b"int a; \nint\tb;\r\nint c;\nint d;")
    assert p.returncode == 1
    got = [x.split(": ", 2) for x in p.stdout.splitlines()]
    assert [(loc, rule) for loc, rule, _ in got] == [
        (f"{f}:4", "whitespace"), (f"{f}:1", "whitespace"),
        (f"{f}:2", "whitespace"), (f"{f}:2", "whitespace")]
    msgs = [m for _, _, m in got]
    assert "no newline at the end" in msgs[0]
    assert msgs[1] == "trailing whitespace"
    assert msgs[2].startswith("CR at the end") and msgs[3].startswith("tab")


def test_long_line(tmp_path):
    p, f = check_one(tmp_path, "int x; /* " + "y" * 95 + " */\n")
    assert p.returncode == 1
    assert p.stdout.startswith(f"{f}:1: long-line: 108 columns")


def test_allowlist_marker(tmp_path):
    p, _ = check_one(tmp_path, """\
void g(void)
{
    char *a = malloc(8); /* checksrc: ok alloc - a test ends on NULL */
    /* checksrc: ok */
    strcpy(d, "x");
    s = dh__strdup(t); /* checksrc: ok */
}
""")
    assert p.returncode == 0, p.stdout
    # A marker for one rule leaves the others on.
    p, f = check_one(tmp_path, "void g(void)\n{\n    strcpy(d, s); /* "
                     "checksrc: ok alloc */\n}\n")
    assert p.returncode == 1 and f"{f}:3: banned: strcpy()" in p.stdout


def test_folders_and_errors(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "bad.h").write_text("int x;  \n")
    (tmp_path / "a" / "notes.txt").write_text("strcpy(  \n")
    (tmp_path / "a" / "corpus").mkdir()  # fuzz inputs are skipped
    (tmp_path / "a" / "corpus" / "seed.c").write_text("gets(x);\n")
    p = checksrc(tmp_path / "a")
    assert p.returncode == 1
    assert p.stdout == f"{tmp_path / 'a' / 'bad.h'}:1: whitespace: " \
                       "trailing whitespace\n"
    p = checksrc(tmp_path / "missing")
    assert p.returncode == 2 and "no such file" in p.stderr


def test_the_tree_is_clean():
    p = checksrc(cwd=ROOT)
    assert p.returncode == 0, p.stdout
