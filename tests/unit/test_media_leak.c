/*
 * test_media_leak.c - repeated open / select / decode / close with one
 * dh_media keeps resident memory flat (issue 3: "no leak: repeated
 * open/decode/close of 1,000 files keeps resident memory flat").
 *
 * Design: one tiny gen-data clip (profile S) is written to $DH_TEST_TMP,
 * read into memory once, then decoded ITERS times, alternating
 * dh_media_open() and dh_media_open_mem(); every 10th iteration also opens
 * a truncated copy and asks for its last frame, which must fail, so error
 * paths are in the loop too.
 * VmRSS (/proc/self/status) is read after iteration WARMUP and at the end;
 * the growth must stay under RSS_SLACK.  Under AddressSanitizer freed
 * memory sits in ASan's quarantine (256 MiB by default), so RSS grows
 * whatever the code does: there RSS is only printed, and LeakSanitizer at
 * exit (make test-asan) is the leak check.  Cost: ~5 s, ~10 s under ASan.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "datahelix/gendata.h"
#include "datahelix/media.h"

#if defined(__SANITIZE_ADDRESS__)
#define DH_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define DH_TEST_ASAN 1
#endif
#endif

#define ITERS 1000
#define WARMUP 100
#define RSS_SLACK_KB (4 * 1024)
#define OUT_W 32
#define OUT_H 32

static const int64_t plan_idx[] = {0, 2, 5, 9};
static char clip_path[4096];
static unsigned char *clip_data;
static size_t clip_len;
static unsigned char *out_buf;
static size_t out_len;

/* VmRSS in KiB, or -1. */
static long rss_kb(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kb = -1;

    if (!f)
        return -1;
    while (fgets(line, sizeof(line), f))
        if (sscanf(line, "VmRSS: %ld kB", &kb) == 1)
            break;
    fclose(f);
    return kb;
}

static void read_clip(void)
{
    FILE *f = fopen(clip_path, "rb");
    long n;

    assert_non_null(f);
    assert_int_equal(fseek(f, 0, SEEK_END), 0);
    n = ftell(f);
    assert_true(n > 0);
    rewind(f);
    clip_data = malloc((size_t)n);
    assert_non_null(clip_data);
    assert_int_equal(fread(clip_data, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    clip_len = (size_t)n;
}

static int setup(void **state)
{
    const char *tmp = getenv("DH_TEST_TMP");
    char dir[3800];
    struct dh_gen_opts o;
    struct dh_err e;

    (void)state;
    snprintf(dir, sizeof(dir), "%s/media_leak", tmp ? tmp : "/tmp");
    memset(&o, 0, sizeof(o));
    o.out_dir = dir;
    o.profiles = "S";
    o.count = 1;
    o.seed = 0;
    if (dh_gen_data(&o, NULL, &e) != 0) {
        fprintf(stderr, "gen-data: %s\n", e.msg);
        return -1;
    }
    snprintf(clip_path, sizeof(clip_path), "%s/000000_S.mp4", dir);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    free(clip_data);
    free(out_buf);
    return 0;
}

static void plan_make(struct dh_media_plan *p)
{
    dh_media_plan_init(p);
    p->kind = DH_PLAN_INDICES;
    p->indices = plan_idx;
    p->frames = (int64_t)(sizeof(plan_idx) / sizeof(plan_idx[0]));
    p->width = OUT_W;
    p->height = OUT_H;
}

/* One file's worth of work; `mem` picks dh_media_open_mem(). */
static void one_round(struct dh_media *m, const struct dh_media_plan *p,
                      int mem)
{
    struct dh_media_result res;
    struct dh_err e;
    int64_t frames = 0;
    int r;

    r = mem ? dh_media_open_mem(m, clip_data, clip_len, "leak.mp4", &e)
            : dh_media_open(m, clip_path, &e);
    if (r != 0)
        fail_msg("open: %s", e.msg);
    r = dh_media_select(m, p, &frames, &e);
    if (r != 0)
        fail_msg("select: %s", e.msg);
    assert_int_equal(frames, p->frames);
    r = dh_media_decode(m, p, out_buf, out_len, &res, &e);
    if (r != 0)
        fail_msg("decode: %s", e.msg);
    assert_int_equal(res.valid_frames, p->frames);
    dh_media_close(m);
}

/*
 * The first third of the file (the index is at the front, so it opens)
 * with a plan that needs the last frame, whose packets are gone: must fail
 * at select or decode, naming the file, never crash.
 */
static void bad_round(struct dh_media *m)
{
    struct dh_media_plan p;
    struct dh_media_result res;
    struct dh_media_info info;
    struct dh_err e;
    int64_t last, frames = 0;
    int r;

    plan_make(&p);
    p.frames = 1;
    p.indices = &last;
    r = dh_media_open_mem(m, clip_data, clip_len / 3, "cut.mp4", &e);
    if (r == 0) {
        r = dh_media_info(m, &info);
        assert_int_equal(r, 0);
        last = info.frames - 1;
        r = dh_media_select(m, &p, &frames, &e);
    }
    if (r == 0)
        r = dh_media_decode(m, &p, out_buf, out_len, &res, &e);
    assert_true(r < 0);
    assert_non_null(strstr(e.msg, "cut.mp4"));
    dh_media_close(m);
}

static void test_media_rss_flat(void **state)
{
    struct dh_media_plan p;
    struct dh_media *m = NULL;
    struct dh_err e;
    long rss_warm = -1, rss_end;

    (void)state;
    read_clip();
    plan_make(&p);
    out_len = dh_media_plan_bytes(&p, p.frames) + DH_MEDIA_DST_PAD;
    out_buf = malloc(out_len);
    assert_non_null(out_buf);
    if (dh_media_create(&m, &e) != 0)
        fail_msg("create: %s", e.msg);
    for (int i = 1; i <= ITERS; i++) {
        one_round(m, &p, i & 1);
        if (i % 10 == 0)
            bad_round(m);
        if (i == WARMUP)
            rss_warm = rss_kb();
    }
    rss_end = rss_kb();
    dh_media_destroy(m);
    fprintf(stderr,
            "test_media_leak: %d rounds, VmRSS %ld kB after %d, "
            "%ld kB at the end (+%ld kB)\n",
            ITERS, rss_warm, WARMUP, rss_end, rss_end - rss_warm);
    assert_true(rss_warm > 0 && rss_end > 0);
#ifndef DH_TEST_ASAN
    assert_true(rss_end - rss_warm < RSS_SLACK_KB);
#endif
}

/* dh_media_destroy(NULL) and close without open are harmless. */
static void test_media_null_and_idle(void **state)
{
    struct dh_media *m = NULL;
    struct dh_media_info info;
    struct dh_err e;

    (void)state;
    dh_media_destroy(NULL);
    if (dh_media_create(&m, &e) != 0)
        fail_msg("create: %s", e.msg);
    dh_media_close(m);
    assert_int_equal(dh_media_info(m, &info), DH_EINVAL);
    dh_media_destroy(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_media_null_and_idle),
        cmocka_unit_test(test_media_rss_flat),
    };

    return cmocka_run_group_tests(tests, setup, teardown);
}
