/*
 * test_index.c - the .dhx index: build -> open -> same data as the table;
 * corrupt, truncated, hostile and wrong-version files are refused cleanly;
 * allocation failures clean up.
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
#include "core/hash.h"
#include "core/index_format.h"
#include "datahelix/index.h"

#define N 300

static void tmp_path(char *buf, size_t n, const char *name)
{
    const char *dir = getenv("DH_TEST_TMP");

    snprintf(buf, n, "%s/index-%s", dir ? dir : "/tmp", name);
}

static void make_desc(struct dh_desc *d, int64_t id)
{
    char p[64];

    dh_desc_init(d);
    d->id = id;
    d->kind = (enum dh_kind)(id % 3);
    if (d->kind != DH_KIND_TEXT) {
        snprintf(p, sizeof(p), "videos/%09lld.mp4", (long long)id);
        d->path = dh__strdup(p);
        assert_non_null(d->path);
    }
    if (id % 2 == 0 || d->kind == DH_KIND_TEXT) {
        d->text = dh__strdup(id % 4 ? "caption \"é\"\nline" : "");
        assert_non_null(d->text);
    }
    d->width = id == 7 ? 65535 : (int32_t)(100 + id);
    d->height = (int32_t)(50 + id);
    d->frames = id == 8 ? (int64_t)UINT32_MAX : id;
    snprintf(d->profile, sizeof(d->profile), "%dx336", (int)(id % 5) * 8);
    d->est_cpu_ms = 0.25 * (double)id;
    d->est_out_bytes = id << 33;
    d->est_tokens = id == 9 ? (int64_t)UINT32_MAX : id * 11;
}

static void write_table(const char *path, int n)
{
    struct dh_table_writer *w;
    struct dh_desc d;
    struct dh_err e;

    assert_int_equal(dh_table_writer_open(path, "{\"v\":1}", &w, &e), 0);
    for (int i = 0; i < n; i++) {
        make_desc(&d, (i * 7) % n); /* 7 is prime to N: a permutation */
        assert_int_equal(dh_table_writer_write(w, &d, &e), 0);
        dh_desc_fini(&d);
    }
    if (dh_table_writer_close(w, &e) != 0)
        fail_msg("close: %s", e.msg);
}

static void build(const char *dhx, int n)
{
    char jsonl[512];
    struct dh_err e;

    tmp_path(jsonl, sizeof(jsonl), "t.jsonl");
    write_table(jsonl, n);
    if (dh_index_build_from_table(jsonl, dhx, &e) != 0)
        fail_msg("build: %s", e.msg);
}

static unsigned char *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    unsigned char *buf;
    long len;

    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    len = ftell(f);
    rewind(f);
    buf = aligned_alloc(8, ((size_t)len + 8) & ~(size_t)7);
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, (size_t)len, f), (size_t)len);
    fclose(f);
    *n = (size_t)len;
    return buf;
}

static void check_row(const struct dh_index *ix, int64_t id)
{
    struct dh_index_columns c;
    struct dh_desc want, got;
    struct dh_err e;

    make_desc(&want, id);
    dh_index_columns(ix, &c);
    assert_int_equal(c.est_tokens[id], id == 9 ? UINT32_MAX : id * 11);
    assert_true(c.est_cpu_ms[id] == (float)want.est_cpu_ms);
    assert_int_equal(c.est_out_bytes[id], (uint64_t)want.est_out_bytes);
    assert_string_equal(dh_index_profile_name(ix, c.profile[id]), want.profile);
    assert_int_equal(c.frames[id], id == 8 ? UINT32_MAX : id);
    assert_int_equal(c.width[id], id == 7 ? 65535 : want.width);
    assert_int_equal(c.height[id], want.height);
    assert_int_equal(c.kind[id], want.kind);
    if (want.path)
        assert_string_equal(dh_index_path(ix, (uint64_t)id), want.path);
    else
        assert_null(dh_index_path(ix, (uint64_t)id));
    if (want.text)
        assert_string_equal(dh_index_text(ix, (uint64_t)id), want.text);
    else
        assert_null(dh_index_text(ix, (uint64_t)id));
    dh_desc_init(&got);
    assert_int_equal(dh_index_get(ix, (uint64_t)id, &got, &e), 0);
    assert_int_equal(got.id, id);
    assert_string_equal(got.profile, want.profile);
    assert_int_equal(got.est_out_bytes, want.est_out_bytes);
    dh_desc_fini(&got);
    dh_desc_fini(&want);
}

static void build_open_matches_table(void **state)
{
    struct dh_index *ix;
    struct dh_desc d;
    char dhx[512];
    struct dh_err e;

    (void)state;
    tmp_path(dhx, sizeof(dhx), "a.dhx");
    build(dhx, N);
    assert_int_equal(dh_index_open(dhx, DH_INDEX_VERIFY, &ix, &e), 0);
    assert_int_equal(dh_index_count(ix), N);
    assert_int_equal(dh_index_profile_count(ix), 5);
    assert_string_equal(dh_index_header(ix), "{\"v\":1}");
    for (int64_t id = 0; id < N; id++)
        check_row(ix, id);
    assert_null(dh_index_path(ix, N));
    assert_null(dh_index_profile_name(ix, 5));
    dh_desc_init(&d);
    assert_int_equal(dh_index_get(ix, N, &d, &e), DH_EINVAL);
    dh_index_close(ix);
    dh_index_close(NULL);
}

static void empty_index(void **state)
{
    struct dh_index_builder *b;
    struct dh_index *ix;
    char dhx[512];
    struct dh_err e;

    (void)state;
    tmp_path(dhx, sizeof(dhx), "empty.dhx");
    assert_int_equal(dh_index_builder_create(&b, &e), 0);
    assert_int_equal(dh_index_builder_finish(b, dhx, &e), 0);
    dh_index_builder_destroy(b);
    assert_int_equal(dh_index_open(dhx, DH_INDEX_VERIFY, &ix, &e), 0);
    assert_int_equal(dh_index_count(ix), 0);
    assert_null(dh_index_header(ix));
    dh_index_close(ix);
}

static void builder_rejects_dup_and_gaps(void **state)
{
    struct dh_index_builder *b;
    struct dh_desc d;
    char dhx[512];
    struct dh_err e;

    (void)state;
    tmp_path(dhx, sizeof(dhx), "gap.dhx");
    assert_int_equal(dh_index_builder_create(&b, &e), 0);
    make_desc(&d, 3);
    assert_int_equal(dh_index_builder_add(b, &d, &e), 0);
    assert_int_equal(dh_index_builder_add(b, &d, &e), DH_EDUP);
    dh_desc_fini(&d);
    make_desc(&d, 0);
    assert_int_equal(dh_index_builder_add(b, &d, &e), 0);
    dh_desc_fini(&d);
    assert_int_equal(dh_index_builder_count(b), 2);
    assert_int_equal(dh_index_builder_finish(b, dhx, &e), DH_EFORMAT);
    assert_string_equal(e.msg, "index: ids are not dense: id 1 is missing");
    dh_index_builder_destroy(b);
}

/* A table with a line removed: refused as it is, built with renumbering as
 * the remaining rows in file order; the digest tells the two tables apart
 * and ignores est_cpu_ms. */
static void renumbered_build_and_digest(void **state)
{
    char jsonl[512], dhx[512], dhx2[512];
    struct dh_index_build_info info = {99, 99};
    struct dh_table_writer *w;
    struct dh_index *ix, *ix2;
    struct dh_desc d;
    struct dh_err e;
    uint64_t digest;

    (void)state;
    tmp_path(jsonl, sizeof(jsonl), "gap.jsonl");
    tmp_path(dhx, sizeof(dhx), "gap.dhx");
    tmp_path(dhx2, sizeof(dhx2), "full.dhx");
    build(dhx2, 10);
    assert_int_equal(dh_table_writer_open(jsonl, NULL, &w, &e), 0);
    for (int id = 0; id < 10; id++) {
        if (id == 4)
            continue; /* the bad file someone removed */
        make_desc(&d, id);
        assert_int_equal(dh_table_writer_write(w, &d, &e), 0);
        dh_desc_fini(&d);
    }
    assert_int_equal(dh_table_writer_close(w, &e), 0);
    assert_int_equal(dh_index_build(jsonl, dhx, 0, &info, &e), DH_EFORMAT);
    assert_non_null(strstr(e.msg, "ids are not dense: id 4 is missing"));
    assert_int_equal(info.samples, 99); /* untouched on error */
    assert_int_equal(
        dh_index_build(jsonl, dhx, DH_INDEX_BUILD_RENUMBER, &info, &e), 0);
    assert_int_equal(info.samples, 9);
    assert_int_equal(info.renumbered, 5);
    assert_int_equal(dh_index_open(dhx, DH_INDEX_VERIFY, &ix, &e), 0);
    assert_int_equal(dh_index_count(ix), 9);
    for (uint64_t i = 0; i < 9; i++) {
        char p[64];

        make_desc(&d, (int64_t)(i < 4 ? i : i + 1));
        snprintf(p, sizeof(p), "%s", d.path ? d.path : "");
        if (d.path)
            assert_string_equal(dh_index_path(ix, i), p);
        else
            assert_null(dh_index_path(ix, i));
        dh_desc_fini(&d);
    }
    digest = dh_index_digest(ix);
    assert_int_equal(dh_index_open(dhx2, 0, &ix2, &e), 0);
    assert_true(dh_index_digest(ix2) != digest);
    dh_index_close(ix2);
    dh_index_close(ix);

    /* Same rows, other est_cpu_ms: same digest. */
    assert_int_equal(dh_table_writer_open(jsonl, NULL, &w, &e), 0);
    for (int id = 0; id < 10; id++) {
        make_desc(&d, id);
        d.est_cpu_ms += 1000.0;
        assert_int_equal(dh_table_writer_write(w, &d, &e), 0);
        dh_desc_fini(&d);
    }
    assert_int_equal(dh_table_writer_close(w, &e), 0);
    assert_int_equal(dh_index_build(jsonl, dhx, 0, NULL, &e), 0);
    assert_int_equal(dh_index_open(dhx, 0, &ix, &e), 0);
    assert_int_equal(dh_index_open(dhx2, 0, &ix2, &e), 0);
    assert_true(dh_index_digest(ix) == dh_index_digest(ix2));
    dh_index_close(ix2);
    dh_index_close(ix);
}

static int open_bytes(const unsigned char *buf, size_t n, unsigned flags)
{
    struct dh_index *ix;
    struct dh_err e;
    int rc = dh_index_open_mem(buf, n, flags, &ix, &e);

    if (rc == 0) {
        for (uint64_t i = 0; i < dh_index_count(ix); i++)
            (void)dh_index_path(ix, i);
        dh_index_close(ix);
    }
    return rc;
}

static void corrupt_body_and_header(void **state)
{
    unsigned char *buf;
    char dhx[512];
    size_t n;

    (void)state;
    tmp_path(dhx, sizeof(dhx), "c.dhx");
    build(dhx, N);
    buf = slurp(dhx, &n);
    assert_int_equal(open_bytes(buf, n, DH_INDEX_VERIFY), 0);
    buf[DHX_HEADER_SIZE + 100] ^= 0x40; /* a column byte */
    assert_int_equal(open_bytes(buf, n, 0), 0);
    assert_int_equal(open_bytes(buf, n, DH_INDEX_VERIFY), DH_ECHECKSUM);
    buf[DHX_HEADER_SIZE + 100] ^= 0x40;
    buf[n - 2] ^= 0x01; /* inside the string table */
    assert_int_equal(open_bytes(buf, n, DH_INDEX_VERIFY), DH_ECHECKSUM);
    buf[n - 2] ^= 0x01;
    buf[DHX_OFF_COUNT] ^= 0x01;
    assert_int_equal(open_bytes(buf, n, 0), DH_ECHECKSUM);
    buf[DHX_OFF_COUNT] ^= 0x01;
    buf[0] = 'X';
    assert_int_equal(open_bytes(buf, n, 0), DH_EFORMAT);
    buf[0] = 'D';
    buf[DHX_OFF_VERSION] = DH_INDEX_FORMAT_VERSION + 1;
    assert_int_equal(open_bytes(buf, n, 0), DH_EVERSION);
    free(buf);
}

static void truncated_everywhere(void **state)
{
    struct dh_index *ix;
    unsigned char *buf;
    char dhx[512], cut[512];
    struct dh_err e;
    size_t n;
    FILE *f;

    (void)state;
    tmp_path(dhx, sizeof(dhx), "tr.dhx");
    tmp_path(cut, sizeof(cut), "cut.dhx");
    build(dhx, 40);
    buf = slurp(dhx, &n);
    for (size_t len = 0; len < n; len++) {
        assert_true(open_bytes(buf, len, 0) < 0);
        assert_true(open_bytes(buf, len, DH_INDEX_VERIFY) < 0);
    }
    for (size_t len = 0; len < n; len += 97) { /* through the file path */
        f = fopen(cut, "wb");
        assert_non_null(f);
        assert_int_equal(fwrite(buf, 1, len, f), len);
        fclose(f);
        assert_int_equal(dh_index_open(cut, 0, &ix, &e), DH_EFORMAT);
    }
    assert_int_equal(dh_index_open("/nonexistent.dhx", 0, &ix, &e),
                     DH_ENOTFOUND);
    free(buf);
}

/* Rewrites a header field and fixes the header checksum, like a forger. */
static void set64(unsigned char *buf, size_t off, uint64_t v)
{
    dhx_put64(buf + off, v);
    dhx_put64(buf + DHX_OFF_HEADER_SUM,
              dh__hash64(buf, DHX_OFF_HEADER_SUM, DHX_SEED_HEADER));
}

static void hostile_headers(void **state)
{
    const size_t sec = DHX_OFF_SECTIONS;
    unsigned char *buf, *orig;
    char dhx[512];
    size_t n;

    (void)state;
    tmp_path(dhx, sizeof(dhx), "h.dhx");
    build(dhx, 20);
    orig = slurp(dhx, &n);
    buf = slurp(dhx, &n);
    const struct {
        size_t off;
        uint64_t v;
        int rc;
    } cases[] = {
        {DHX_OFF_COUNT, 21, DH_EFORMAT},
        {DHX_OFF_COUNT, UINT64_MAX / 2, DH_EFORMAT},
        {DHX_OFF_FLAGS, 1, DH_EVERSION},
        {DHX_OFF_FILE_SIZE, n + 8, DH_EFORMAT},
        {sec + 16 * DHX_S_KIND, UINT64_MAX - 7, DH_EFORMAT},
        {sec + 16 * DHX_S_PATH_OFF, 4, DH_EFORMAT},
        {sec + 16 * DHX_S_STRINGS + 8, n, DH_EFORMAT},
        {sec + 16 * DHX_S_STRINGS + 8, 0, DH_EFORMAT},
        {DHX_OFF_HEADER_JSON, n * 2, DH_EFORMAT},
        {DHX_OFF_PROFILE_COUNT, 70000, DH_EFORMAT},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        memcpy(buf, orig, n);
        set64(buf, cases[i].off, cases[i].v);
        assert_int_equal(open_bytes(buf, n, 0), cases[i].rc);
    }
    free(buf);
    free(orig);
}

static void bad_string_offset_without_verify(void **state)
{
    struct dh_index *ix;
    unsigned char *buf;
    uint64_t path_sec;
    struct dh_desc d;
    struct dh_err e;
    char dhx[512];
    size_t n;

    (void)state;
    tmp_path(dhx, sizeof(dhx), "s.dhx");
    build(dhx, 20);
    buf = slurp(dhx, &n);
    path_sec = dhx_get64(buf + DHX_OFF_SECTIONS + 16 * DHX_S_PATH_OFF);
    dhx_put64(buf + path_sec + 8, (uint64_t)n * 4); /* row 1's path */
    assert_int_equal(dh_index_open_mem(buf, n, 0, &ix, &e), 0);
    assert_null(dh_index_path(ix, 1));
    dh_desc_init(&d);
    assert_int_equal(dh_index_get(ix, 1, &d, &e), DH_EFORMAT);
    dh_index_close(ix);
    free(buf);
}

static void alloc_failures(void **state)
{
    char jsonl[512], dhx[512];
    struct dh_index *ix;
    struct dh_err e;
    int rc = -1;
    long k;

    (void)state;
    tmp_path(jsonl, sizeof(jsonl), "t.jsonl");
    tmp_path(dhx, sizeof(dhx), "oom.dhx");
    write_table(jsonl, 12);
    for (k = 0; k < 100000 && rc != 0; k++) {
        dh__alloc_fail_after(k);
        rc = dh_index_build_from_table(jsonl, dhx, &e);
        if (rc == 0) {
            rc = dh_index_open(dhx, DH_INDEX_VERIFY, &ix, &e);
            if (rc == 0)
                dh_index_close(ix);
        }
        dh__alloc_fail_reset();
        if (rc != 0 && rc != DH_ENOMEM)
            fail_msg("fail_after(%ld): rc %d (%s)", k, rc, e.msg);
    }
    assert_int_equal(rc, 0);
}

/* Values the columns cannot hold are refused, naming the field, never
 * clipped. */
static void out_of_range_values_refused(void **state)
{
    struct dh_index_builder *b;
    struct dh_desc d;
    struct dh_err e;
    struct {
        const char *field;
        int64_t v;
    } cases[] = {{"width", 70000},
                 {"height", -1},
                 {"frames", 5000000000LL},
                 {"est_tokens", 9000000000LL}};

    (void)state;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        assert_int_equal(dh_index_builder_create(&b, &e), 0);
        make_desc(&d, 0);
        if (!strcmp(cases[i].field, "width"))
            d.width = (int32_t)cases[i].v;
        else if (!strcmp(cases[i].field, "height"))
            d.height = (int32_t)cases[i].v;
        else if (!strcmp(cases[i].field, "frames"))
            d.frames = cases[i].v;
        else
            d.est_tokens = cases[i].v;
        dh_err_clear(&e);
        assert_int_equal(dh_index_builder_add(b, &d, &e), DH_ETOOBIG);
        assert_non_null(strstr(e.msg, cases[i].field));
        dh_desc_fini(&d);
        dh_index_builder_destroy(b);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(build_open_matches_table),
        cmocka_unit_test(empty_index),
        cmocka_unit_test(builder_rejects_dup_and_gaps),
        cmocka_unit_test(renumbered_build_and_digest),
        cmocka_unit_test(corrupt_body_and_header),
        cmocka_unit_test(truncated_everywhere),
        cmocka_unit_test(hostile_headers),
        cmocka_unit_test(bad_string_offset_without_verify),
        cmocka_unit_test(alloc_failures),
        cmocka_unit_test(out_of_range_values_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
