/*
 * test_table.c - descriptor JSON and the JSONL table reader/writer: round
 * trip, malformed input (line numbers and reasons), allocation failures.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/alloc.h"
#include "datahelix/table.h"

static void tmp_path(char *buf, size_t n, const char *name)
{
    const char *dir = getenv("DH_TEST_TMP");

    snprintf(buf, n, "%s/table-%s", dir ? dir : "/tmp", name);
}

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");

    assert_non_null(f);
    assert_int_equal(fwrite(text, 1, strlen(text), f), strlen(text));
    assert_int_equal(fclose(f), 0);
}

static const char *captions[] = {
    "a \"quoted\" caption",
    "line one\nline two\ttab",
    "unicode: héllo 世界 🎬",
    "backslash \\ and / slash",
    "",
};

static void make_desc(struct dh_desc *d, int64_t id)
{
    dh_desc_init(d);
    d->id = id;
    d->kind = (enum dh_kind)(id % 3);
    if (d->kind != DH_KIND_TEXT || id % 2) {
        char p[64];
        snprintf(p, sizeof(p), "videos/%09lld.mp4", (long long)id);
        d->path = dh__strdup(p);
        assert_non_null(d->path);
    }
    if (d->kind == DH_KIND_TEXT || id % 4 == 1) {
        d->text = dh__strdup(captions[id % 5]);
        assert_non_null(d->text);
    }
    d->bytes = id * 1000003;
    snprintf(d->codec, sizeof(d->codec), "%s", id % 2 ? "h264" : "mpeg4");
    d->width = (int32_t)(320 + id);
    d->height = (int32_t)(240 + id);
    d->rotation = id % 7 == 0 ? 90 : 0;
    d->fps = id % 2 ? 29.97 : 1.0 / 3.0;
    d->duration_s = 0.1 * (double)id;
    d->frames = id * 3;
    snprintf(d->profile, sizeof(d->profile), "%dx336", (int)(id % 4) * 8);
    d->est_cpu_ms = 1e-300 + (double)id / 7.0;
    d->est_out_bytes = id << 20;
    d->est_tokens = id * 17;
    if (id % 3 == 1) {
        d->extra_json = dh__strdup(
            "{\"foo\":[1,2,{\"x\":null}],\"bar\":\"é\"}");
        assert_non_null(d->extra_json);
    }
}

static void assert_desc_equal(const struct dh_desc *a, const struct dh_desc *b)
{
    assert_int_equal(a->id, b->id);
    assert_int_equal(a->kind, b->kind);
    if (a->path || b->path)
        assert_string_equal(a->path, b->path);
    if (a->text || b->text)
        assert_string_equal(a->text, b->text);
    if (a->extra_json || b->extra_json)
        assert_string_equal(a->extra_json, b->extra_json);
    assert_int_equal(a->bytes, b->bytes);
    assert_string_equal(a->codec, b->codec);
    assert_string_equal(a->profile, b->profile);
    assert_int_equal(a->width, b->width);
    assert_int_equal(a->height, b->height);
    assert_int_equal(a->rotation, b->rotation);
    assert_true(a->fps == b->fps);
    assert_true(a->duration_s == b->duration_s);
    assert_true(a->est_cpu_ms == b->est_cpu_ms);
    assert_int_equal(a->frames, b->frames);
    assert_int_equal(a->est_out_bytes, b->est_out_bytes);
    assert_int_equal(a->est_tokens, b->est_tokens);
}

#define HEADER "{\"version\":1,\"tokens\":{\"model\":\"x\",\"k\":[1.5,2]}}"

static void write_table(const char *path, int n, const char *header)
{
    struct dh_table_writer *w;
    struct dh_desc d;
    struct dh_err e;

    assert_int_equal(dh_table_writer_open(path, header, &w, &e), 0);
    for (int i = n - 1; i >= 0; i--) { /* any order is fine */
        make_desc(&d, i);
        assert_int_equal(dh_table_writer_write(w, &d, &e), 0);
        dh_desc_fini(&d);
    }
    assert_int_equal(dh_table_writer_close(w, &e), 0);
}

static void round_trip(void **state)
{
    struct dh_table_reader *r;
    struct dh_desc got, want;
    struct dh_err e;
    char path[512];
    int n = 0, rc;

    (void)state;
    tmp_path(path, sizeof(path), "rt.jsonl");
    write_table(path, 60, HEADER);
    assert_int_equal(dh_table_reader_open(path, &r, &e), 0);
    dh_desc_init(&got);
    while ((rc = dh_table_reader_next(r, &got, &e)) == 1) {
        make_desc(&want, 59 - n);
        assert_desc_equal(&got, &want);
        dh_desc_fini(&want);
        n++;
    }
    assert_int_equal(rc, 0);
    assert_int_equal(n, 60);
    assert_string_equal(dh_table_reader_header(r), HEADER);
    assert_int_equal(dh_table_reader_line(r), 61);
    dh_desc_fini(&got);
    dh_table_reader_destroy(r);
}

static void desc_json_rules(void **state)
{
    struct dh_desc d, back;
    struct dh_err e;
    char *s = NULL;
    const char *ok = "{\"id\":3,\"kind\":\"text\",\"text\":\"hi\",\"z\":1}";

    (void)state;
    dh_desc_init(&d);
    dh_desc_init(&back);
    assert_int_equal(dh_desc_from_json(ok, strlen(ok), &d, &e), 0);
    assert_null(d.path);
    assert_string_equal(d.extra_json, "{\"z\":1}");
    assert_int_equal(dh_desc_to_json(&d, &s), 0);
    assert_string_equal(s, "{\"id\":3,\"kind\":\"text\",\"bytes\":0,"
                           "\"codec\":\"\",\"width\":0,\"height\":0,"
                           "\"fps\":0.0,\"duration_s\":0.0,\"frames\":0,"
                           "\"text\":\"hi\",\"profile\":\"\","
                           "\"est_cpu_ms\":0.0,\"est_out_bytes\":0,"
                           "\"est_tokens\":0,\"z\":1}");
    assert_int_equal(dh_desc_from_json(s, strlen(s), &back, &e), 0);
    assert_desc_equal(&d, &back);
    free(s);
    dh__free(d.extra_json);
    d.extra_json = NULL;
    d.fps = 0.1; /* 15 digits suffice: readable output */
    assert_int_equal(dh_desc_to_json(&d, &s), 0);
    assert_non_null(strstr(s, "\"fps\":0.1,"));
    free(s);
    d.extra_json = dh__strdup("{\"id\":9}"); /* would shadow a field */
    assert_non_null(d.extra_json);
    assert_int_equal(dh_desc_to_json(&d, &s), DH_EINVAL);
    dh_desc_fini(&d);
    dh_desc_fini(&back);
}

/* The header's key is not a descriptor's extra field: one that read it so
 * could not be written back (found by fuzz_desc_json). */
static void desc_refuses_header_key(void **state)
{
    struct dh_desc d;
    struct dh_err e;
    const char *s = "{\"id\":3,\"kind\":\"text\",\"text\":\"hi\","
                    "\"datahelix_header\":1}";

    (void)state;
    dh_desc_init(&d);
    assert_int_equal(dh_desc_from_json(s, strlen(s), &d, &e), DH_EFORMAT);
    assert_non_null(strstr(e.msg, "'datahelix_header' is reserved"));
    assert_null(d.extra_json);
    dh_desc_fini(&d);
}

struct bad_case {
    const char *text;
    int code;
    const char *msg; /* expected suffix after the file name */
};

static const struct bad_case bad_cases[] = {
    {"{\"id\":0,\"path\":\"a\",\"kind\":\"video\"}\n{bad\n", DH_EFORMAT,
     ":2: bad JSON at column"},
    {"\n\n{\"path\":\"a\",\"kind\":\"video\"}\n", DH_EFORMAT,
     ":3: missing field 'id'"},
    {"{\"id\":0,\"kind\":\"video\"}\n", DH_EFORMAT, ":1: missing field 'path'"},
    {"{\"id\":0,\"path\":\"a\"}\n", DH_EFORMAT, ":1: missing field 'kind'"},
    {"{\"id\":0,\"path\":\"a\",\"kind\":\"video\",\"width\":\"7\"}\n",
     DH_EFORMAT, ":1: field 'width': expected integer, got string"},
    {"{\"id\":0,\"path\":\"a\",\"kind\":\"video\",\"width\":3.0}\n", DH_EFORMAT,
     ":1: field 'width': expected integer, got real"},
    {"{\"id\":0,\"path\":\"a\",\"kind\":\"video\",\"fps\":true}\n", DH_EFORMAT,
     ":1: field 'fps': expected number, got boolean"},
    {"{\"id\":-1,\"path\":\"a\",\"kind\":\"video\"}\n", DH_EFORMAT,
     ":1: field 'id': value out of range"},
    {"{\"id\":4294967296,\"path\":\"a\",\"kind\":\"video\"}\n", DH_EFORMAT,
     ":1: field 'id': value out of range"},
    {"{\"id\":0,\"path\":\"a\",\"kind\":\"sound\"}\n", DH_EFORMAT,
     ":1: field 'kind': expected video, image, text or audio"},
    {"{\"id\":0,\"path\":\"a\",\"kind\":\"video\",\"codec\":"
     "\"0123456789012345678901234567890123\"}\n",
     DH_EFORMAT, ":1: field 'codec': string longer than 31 bytes"},
    {"{\"id\":0,\"path\":\"a\",\"kind\":\"video\",\"id\":1}\n", DH_EFORMAT,
     ":1: bad JSON at column"},
    {"[1,2]\n", DH_EFORMAT, ":1: expected a JSON object, got array"},
    {"{\"id\":0,\"path\":\"a\",\"kind\":\"video\"}\n"
     "{\"id\":1,\"path\":\"a\",\"kind\":\"video\"}\n"
     "{\"id\":1,\"path\":\"b\",\"kind\":\"video\"}\n",
     DH_EDUP, ":3: duplicate id 1"},
    {"{\"id\":0,\"path\":\"a\",\"kind\":\"video\"}\n"
     "{\"id\":2,\"path\":\"a\",\"kind\":\"video\"}\n",
     DH_EFORMAT, ": ids are not dense: id 1 is missing"},
    {"{\"id\":0,\"path\":\"a\",\"kind\":\"video\"}\n"
     "{\"datahelix_header\":{}}\n",
     DH_EFORMAT, ":2: header record only allowed on the first line"},
    {"{\"datahelix_header\":[]}\n", DH_EFORMAT,
     ":1: field 'datahelix_header': expected object"},
    {"{\"datahelix_header\":{},\"id\":0}\n", DH_EFORMAT,
     ":1: header record must have the single key 'datahelix_header'"},
};

/* Reads `path` to the end; returns the first error code (or 0). */
static int read_all(const char *path, struct dh_err *e, int *samples)
{
    struct dh_table_reader *r;
    struct dh_desc d;
    int rc;

    *samples = 0;
    if ((rc = dh_table_reader_open(path, &r, e)) != 0)
        return rc;
    dh_desc_init(&d);
    while ((rc = dh_table_reader_next(r, &d, e)) == 1)
        (*samples)++;
    dh_desc_fini(&d);
    dh_table_reader_destroy(r);
    return rc;
}

static void assert_error(const char *path, int code, const char *suffix)
{
    char want[1024];
    struct dh_err e;
    int n;

    dh_err_clear(&e);
    snprintf(want, sizeof(want), "%s%s", path, suffix);
    assert_int_equal(read_all(path, &e, &n), code);
    assert_int_equal(e.code, code);
    if (strncmp(e.msg, want, strlen(want)) != 0)
        fail_msg("got '%s', want prefix '%s'", e.msg, want);
}

static void malformed_lines(void **state)
{
    char path[512];

    (void)state;
    tmp_path(path, sizeof(path), "bad.jsonl");
    for (size_t i = 0; i < sizeof(bad_cases) / sizeof(bad_cases[0]); i++) {
        write_text(path, bad_cases[i].text);
        assert_error(path, bad_cases[i].code, bad_cases[i].msg);
    }
}

static void overlong_line(void **state)
{
    size_t n = DH_TABLE_LINE_MAX + 10;
    char *big = malloc(n + 64), path[512], want[64];
    const char *first = "{\"id\":0,\"path\":\"a\",\"kind\":\"video\"}\n";

    (void)state;
    assert_non_null(big);
    memcpy(big, first, strlen(first));
    memset(big + strlen(first), ' ', n);
    big[strlen(first) + n] = '\0';
    tmp_path(path, sizeof(path), "long.jsonl");
    write_text(path, big);
    free(big);
    snprintf(want, sizeof(want), ":2: line longer than %u bytes",
             DH_TABLE_LINE_MAX);
    assert_error(path, DH_ETOOBIG, want);
}

static void empty_and_blank(void **state)
{
    char path[512];
    struct dh_err e;
    int n;

    (void)state;
    tmp_path(path, sizeof(path), "empty.jsonl");
    write_text(path, "");
    assert_int_equal(read_all(path, &e, &n), 0);
    assert_int_equal(n, 0);
    write_text(path, "{\"datahelix_header\":{\"v\":1}}\n \n\t\r\n");
    assert_int_equal(read_all(path, &e, &n), 0);
    assert_int_equal(n, 0);
    /* last line without newline, CRLF endings */
    write_text(path, "{\"id\":1,\"path\":\"a\",\"kind\":\"video\"}\r\n"
                     "{\"id\":0,\"path\":\"b\",\"kind\":\"image\"}");
    assert_int_equal(read_all(path, &e, &n), 0);
    assert_int_equal(n, 2);
    assert_int_equal(read_all("/nonexistent/x.jsonl", &e, &n), DH_ENOTFOUND);
}

/* Renumbering: ids become positions in file order, gaps and duplicates
 * are accepted; without it the gap error says how many are missing and
 * names the way out. */
static void renumber_gaps_and_duplicates(void **state)
{
    char path[512];
    struct dh_table_reader *r;
    struct dh_desc d;
    struct dh_err e;
    const char *want_paths[] = {"a", "c", "d", "e"};
    int rc, n = 0;

    (void)state;
    tmp_path(path, sizeof(path), "gap.jsonl");
    write_text(path, "{\"datahelix_header\":{\"v\":1}}\n"
                     "{\"id\":0,\"path\":\"a\",\"kind\":\"video\"}\n"
                     "{\"id\":2,\"path\":\"c\",\"kind\":\"video\"}\n"
                     "\n"
                     "{\"id\":2,\"path\":\"d\",\"kind\":\"image\"}\n"
                     "{\"id\":9,\"path\":\"e\",\"kind\":\"video\"}\n");
    assert_int_equal(read_all(path, &e, &n), DH_EDUP);
    assert_int_equal(dh_table_reader_open(path, &r, &e), 0);
    dh_table_reader_set_renumber(r, 1);
    dh_desc_init(&d);
    n = 0;
    while ((rc = dh_table_reader_next(r, &d, &e)) == 1) {
        assert_int_equal(d.id, n);
        assert_string_equal(d.path, want_paths[n]);
        n++;
    }
    assert_int_equal(rc, 0);
    assert_int_equal(n, 4);
    assert_int_equal(dh_table_reader_renumbered(r), 2); /* 2->1, 9->3 */
    assert_non_null(dh_table_reader_header(r));
    dh_desc_fini(&d);
    dh_table_reader_destroy(r);

    /* Paths long enough that id 3 fits the size bound (id_limit_of). */
    write_text(path, "{\"id\":0,\"path\":\"a.............................."
                     "\",\"kind\":\"video\"}\n"
                     "{\"id\":3,\"path\":\"d.............................."
                     "\",\"kind\":\"video\"}\n");
    assert_error(path, DH_EFORMAT,
                 ": ids are not dense: id 1 is missing "
                 "(2 of ids 0..3 missing); renumber the samples in file "
                 "order with `datahelix index --renumber`");
    /* An id the format refuses stays refused when renumbering. */
    write_text(path, "{\"id\":-1,\"path\":\"a\",\"kind\":\"video\"}\n");
    assert_int_equal(dh_table_reader_open(path, &r, &e), 0);
    dh_table_reader_set_renumber(r, 1);
    dh_desc_init(&d);
    assert_int_equal(dh_table_reader_next(r, &d, &e), DH_EFORMAT);
    dh_table_reader_destroy(r);
}

static void writer_rejects_bad_header(void **state)
{
    struct dh_table_writer *w = NULL;
    char path[512];
    struct dh_err e;

    (void)state;
    tmp_path(path, sizeof(path), "hdr.jsonl");
    assert_int_equal(dh_table_writer_open(path, "[1]", &w, &e), DH_EINVAL);
    assert_int_equal(dh_table_writer_open(path, "{bad", &w, &e), DH_EINVAL);
    assert_null(w);
    dh_table_writer_abort(NULL);
}

#define SMALL_TABLE                                                               \
    "{\"datahelix_header\":{\"v\":1,\"m\":[\"a\"]}}\n"                            \
    "{\"id\":1,\"path\":\"b.mp4\",\"kind\":\"video\",\"fps\":29.97,"              \
    "\"width\":640,\"profile\":\"32x336\",\"x\":{\"y\":[1,2]}}\n\n"               \
    "{\"id\":0,\"kind\":\"text\",\"text\":\"h\u00e9 \\\"q\\\"\\n\",\"z\":null}\n" \
    "{\"id\":2,\"path\":\"c.jpg\",\"kind\":\"image\",\"frames\":1}\n"

static void alloc_failures_read(void **state)
{
    char path[512];
    struct dh_err e;
    int n, rc = -1;
    long k;

    (void)state;
    tmp_path(path, sizeof(path), "oom.jsonl");
    /* Numbers stay under 16 characters: jansson 2.14 asserts (load.c
     * lex_unget_unsave) when its token buffer cannot grow mid-number. */
    write_text(path, SMALL_TABLE);
    for (k = 0; k < 100000; k++) {
        dh__alloc_fail_after(k);
        rc = read_all(path, &e, &n);
        dh__alloc_fail_reset();
        if (rc == 0)
            break;
        if (rc != DH_ENOMEM)
            fail_msg("fail_after(%ld): rc %d (%s)", k, rc, e.msg);
    }
    assert_int_equal(rc, 0);
    assert_int_equal(n, 3);
    assert_true(k > 10);
}

static void alloc_failures_write(void **state)
{
    struct dh_table_writer *w;
    struct dh_desc ds[4];
    char path[512];
    struct dh_err e;
    int rc = -1;
    long k;

    (void)state;
    tmp_path(path, sizeof(path), "oomw.jsonl");
    for (int i = 0; i < 4; i++)
        make_desc(&ds[i], i);
    for (k = 0; k < 100000 && rc != 0; k++) {
        w = NULL;
        dh__alloc_fail_after(k);
        rc = dh_table_writer_open(path, HEADER, &w, &e);
        for (int i = 0; rc == 0 && i < 4; i++)
            rc = dh_table_writer_write(w, &ds[i], &e);
        if (w && rc == 0)
            rc = dh_table_writer_close(w, &e);
        else if (w)
            dh_table_writer_abort(w);
        dh__alloc_fail_reset();
        if (rc != 0 && rc != DH_ENOMEM)
            fail_msg("fail_after(%ld): rc %d (%s)", k, rc, e.msg);
    }
    assert_int_equal(rc, 0);
    for (int i = 0; i < 4; i++)
        dh_desc_fini(&ds[i]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(round_trip),
        cmocka_unit_test(desc_json_rules),
        cmocka_unit_test(desc_refuses_header_key),
        cmocka_unit_test(malformed_lines),
        cmocka_unit_test(overlong_line),
        cmocka_unit_test(empty_and_blank),
        cmocka_unit_test(renumber_gaps_and_duplicates),
        cmocka_unit_test(writer_rejects_bad_header),
        cmocka_unit_test(alloc_failures_read),
        cmocka_unit_test(alloc_failures_write),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
