/*
 * test_verify_cache.c - the resume file of `probe --verify`
 * (src/cli/verify_cache.c): verdicts survive a reopen, a later line wins,
 * a changed size or mtime misses, torn and foreign lines are skipped and do
 * not swallow the next append, rewrite keeps only what it is given, and
 * allocation failures while loading clean up.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "cli/verify_cache.h"
#include "core/alloc.h"

static void tmp_path(char *buf, size_t n, const char *name)
{
    const char *dir = getenv("DH_TEST_TMP");

    snprintf(buf, n, "%s/vcache-%s", dir ? dir : "/tmp", name);
    unlink(buf);
}

static struct dh_verify_cache *open_ok(const char *path)
{
    struct dh_verify_cache *c = NULL;
    struct dh_err e;

    if (dh_verify_cache_open(path, &c, &e) != 0)
        fail_msg("open: %s", e.msg);
    return c;
}

static void add(struct dh_verify_cache *c, const char *file, int64_t size,
                int ok, const char *reason)
{
    struct dh_verify_entry v = {size,      1000 + size, ok,
                                10 * size, 0.5,         (char *)reason};
    struct dh_err e;

    assert_int_equal(dh_verify_cache_append(c, file, &v, &e), 0);
}

static void append_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "a");

    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void reopen_finds_verdicts(void **state)
{
    char path[512];
    struct dh_verify_cache *c;
    const struct dh_verify_entry *v;

    (void)state;
    tmp_path(path, sizeof(path), "a.jsonl");
    c = open_ok(path);
    assert_null(dh_verify_cache_find(c, "/x.mp4", 5, 1005));
    add(c, "/x.mp4", 5, 1, NULL);
    add(c, "/y.mp4", 7, 0, "frame 3 (0.120 s): damaged");
    add(c, "/x.mp4", 6, 0, "later line wins");
    dh_verify_cache_close(c);

    c = open_ok(path);
    assert_int_equal(dh_verify_cache_loaded(c), 2);
    assert_int_equal(dh_verify_cache_lines(c), 3);
    assert_null(dh_verify_cache_find(c, "/x.mp4", 5, 1005)); /* replaced */
    v = dh_verify_cache_find(c, "/x.mp4", 6, 1006);
    assert_non_null(v);
    assert_false(v->ok);
    assert_string_equal(v->reason, "later line wins");
    v = dh_verify_cache_find(c, "/y.mp4", 7, 1007);
    assert_non_null(v);
    assert_int_equal(v->frames, 70);
    assert_string_equal(v->reason, "frame 3 (0.120 s): damaged");
    assert_null(dh_verify_cache_find(c, "/y.mp4", 7, 1008)); /* mtime */
    assert_null(dh_verify_cache_find(c, "/y.mp4", 8, 1007)); /* size */
    dh_verify_cache_close(c);
}

static void torn_and_foreign_lines_skipped(void **state)
{
    char path[512];
    struct dh_verify_cache *c;

    (void)state;
    tmp_path(path, sizeof(path), "torn.jsonl");
    c = open_ok(path);
    add(c, "/a.mp4", 1, 1, NULL);
    dh_verify_cache_close(c);
    append_text(path, "{\"v\":999,\"path\":\"/b.mp4\",\"size\":1,"
                      "\"mtime_ns\":1001,\"ok\":true}\n"
                      "not json\n"
                      "{\"v\":1,\"path\":\"/c.m"); /* killed mid-write */
    c = open_ok(path);
    assert_int_equal(dh_verify_cache_loaded(c), 1);
    assert_null(dh_verify_cache_find(c, "/b.mp4", 1, 1001));
    add(c, "/d.mp4", 4, 1, NULL); /* must not join the torn line */
    dh_verify_cache_close(c);
    c = open_ok(path);
    assert_non_null(dh_verify_cache_find(c, "/a.mp4", 1, 1001));
    assert_non_null(dh_verify_cache_find(c, "/d.mp4", 4, 1004));
    dh_verify_cache_close(c);
}

struct keep {
    const char *paths[3];
    struct dh_verify_entry v[3];
};

static const struct dh_verify_entry *keep_item(void *arg, size_t i,
                                               const char **path)
{
    struct keep *k = arg;

    *path = k->paths[i];
    return i == 1 ? NULL : &k->v[i];
}

static void rewrite_keeps_what_it_is_given(void **state)
{
    char path[512];
    struct keep k = {{"/a.mp4", "/b.mp4", "/c.mp4"},
                     {{1, 1001, 1, 10, 0.5, NULL},
                      {2, 1002, 1, 20, 0.5, NULL},
                      {3, 1003, 0, 0, 0, "bad"}}};
    struct dh_verify_cache *c;
    struct dh_err e;

    (void)state;
    tmp_path(path, sizeof(path), "rw.jsonl");
    c = open_ok(path);
    for (int i = 0; i < 3; i++)
        add(c, k.paths[i], 9, 1, NULL); /* stale: other sizes */
    assert_int_equal(dh_verify_cache_rewrite(c, 3, keep_item, &k, &e), 0);
    assert_int_equal(dh_verify_cache_lines(c), 2);
    add(c, "/e.mp4", 5, 1, NULL); /* appends go to the new file */
    dh_verify_cache_close(c);
    c = open_ok(path);
    assert_int_equal(dh_verify_cache_lines(c), 3);
    assert_non_null(dh_verify_cache_find(c, "/a.mp4", 1, 1001));
    assert_null(dh_verify_cache_find(c, "/b.mp4", 9, 1009));
    assert_string_equal(dh_verify_cache_find(c, "/c.mp4", 3, 1003)->reason,
                        "bad");
    assert_non_null(dh_verify_cache_find(c, "/e.mp4", 5, 1005));
    dh_verify_cache_close(c);
}

static void bad_path_and_unwritable(void **state)
{
    struct dh_verify_entry v = {1, 1, 1, 1, 0, NULL};
    char path[512];
    struct dh_verify_cache *c;
    struct dh_err e;

    (void)state;
    tmp_path(path, sizeof(path), "bad.jsonl");
    c = open_ok(path);
    assert_int_equal(dh_verify_cache_append(c, "caf\xe9.mp4", &v, &e),
                     DH_EINVAL);
    assert_int_equal(dh_verify_cache_lines(c), 0);
    dh_verify_cache_close(c);
    assert_int_equal(dh_verify_cache_open("/nonexistent/dir/x.jsonl", &c, &e),
                     DH_EIO);
    dh_verify_cache_close(NULL);
}

/* Fail the Nth allocation of open: the error comes back, nothing leaks
 * (the ASan build checks), and a later open works. */
static void alloc_failures_on_load(void **state)
{
    char path[512];
    struct dh_verify_cache *c;
    struct dh_err e;
    int rc = -1;

    (void)state;
    tmp_path(path, sizeof(path), "alloc.jsonl");
    c = open_ok(path);
    for (int i = 0; i < 40; i++) {
        char f[32];

        snprintf(f, sizeof(f), "/%d.mp4", i);
        add(c, f, i, i % 3 != 0, i % 3 ? NULL : "why");
    }
    dh_verify_cache_close(c);
    for (long n = 0; rc != 0; n++) {
        dh__alloc_fail_after(n);
        rc = dh_verify_cache_open(path, &c, &e);
        dh__alloc_fail_reset();
        if (rc == 0) {
            assert_int_equal(dh_verify_cache_loaded(c), 40);
            dh_verify_cache_close(c);
        } else {
            assert_int_equal(rc, DH_ENOMEM);
        }
        assert_true(n < 100000);
    }
    c = open_ok(path);
    assert_int_equal(dh_verify_cache_loaded(c), 40);
    dh_verify_cache_close(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(reopen_finds_verdicts),
        cmocka_unit_test(torn_and_foreign_lines_skipped),
        cmocka_unit_test(rewrite_keeps_what_it_is_given),
        cmocka_unit_test(bad_path_and_unwritable),
        cmocka_unit_test(alloc_failures_on_load),
    };

    dh__alloc_init();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
