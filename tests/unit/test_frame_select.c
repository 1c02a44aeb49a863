/* test_frame_select.c - media plan defaults, checks and sizes; which frames
 * each plan kind takes (hand-computed); snapping to candidate frames. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "core/frame_select.h"
#include "datahelix/media.h"

/* ---- helpers ---- */

struct run {
    int64_t out[DH_MEDIA_MAX_FRAMES];
    int64_t count, valid;
    double stride;
    struct dh_err e;
};

static int plan_run(struct run *r, const struct dh_media_plan *p,
                    const struct dh__clip_frames *c)
{
    r->count = r->valid = -7;
    r->stride = -7;
    return dh__frames_plan(p, c, r->out, &r->count, &r->valid, &r->stride,
                           &r->e);
}

static struct dh__clip_frames clip_fps(int64_t n, double fps)
{
    struct dh__clip_frames c = {.n = n, .fps = fps};
    return c;
}

static struct dh_media_plan plan_of(enum dh_plan_kind kind, int64_t frames)
{
    struct dh_media_plan p;
    dh_media_plan_init(&p);
    p.kind = kind;
    p.frames = frames;
    return p;
}

static void expect_out(const struct run *r, const int64_t *want, int64_t n)
{
    assert_int_equal(r->count, n);
    for (int64_t i = 0; i < n; i++) {
        if (r->out[i] != want[i])
            fail_msg("out[%lld] = %lld, want %lld", (long long)i,
                     (long long)r->out[i], (long long)want[i]);
    }
}

static int near(double a, double b)
{
    return fabs(a - b) < 1e-9 * (1 + fabs(b));
}

/* ---- UNIFORM ---- */

static void uniform_takes_segment_centres(void **state)
{
    static struct run r;
    struct dh_media_plan p = plan_of(DH_PLAN_UNIFORM, 4);
    struct dh__clip_frames c = clip_fps(100, 25);
    const int64_t w4[] = {12, 37, 62, 87}, w3[] = {1, 3, 5};
    const int64_t w5[] = {0, 1, 2, 3, 4};

    (void)state;
    assert_int_equal(plan_run(&r, &p, &c), 0);
    expect_out(&r, w4, 4);
    assert_int_equal(r.valid, 4);
    assert_true(near(r.stride, 25));
    /* 7 frames in 3 segments: floor(7/6), floor(21/6), floor(35/6). */
    p.frames = 3;
    c.n = 7;
    assert_int_equal(plan_run(&r, &p, &c), 0);
    expect_out(&r, w3, 3);
    assert_true(near(r.stride, 7.0 / 3));
    p.frames = 5;
    c.n = 5;
    assert_int_equal(plan_run(&r, &p, &c), 0);
    expect_out(&r, w5, 5);
    assert_int_equal(r.valid, 5);
}

static void uniform_huge_clip_does_not_overflow(void **state)
{
    static struct run r;
    struct dh_media_plan p = plan_of(DH_PLAN_UNIFORM, DH_MEDIA_MAX_FRAMES);
    struct dh__clip_frames c = clip_fps(INT64_C(1) << 62, 25);

    (void)state;
    assert_int_equal(plan_run(&r, &p, &c), 0);
    assert_int_equal(r.count, DH_MEDIA_MAX_FRAMES);
    /* (2i + 1) 2^62 / 8192 = (2i + 1) 2^49 */
    assert_true(r.out[0] == INT64_C(1) << 49);
    assert_true(r.out[4095] == INT64_C(8191) << 49);
}

static void uniform_short_clip_pads(void **state)
{
    static struct run r;
    struct dh_media_plan p = plan_of(DH_PLAN_UNIFORM, 6);
    struct dh__clip_frames c = clip_fps(3, 25);
    const int64_t rep[] = {0, 1, 2, 2, 2, 2}, zero[] = {0, 1, 2, -1, -1, -1};

    (void)state;
    assert_int_equal(plan_run(&r, &p, &c), 0);
    expect_out(&r, rep, 6);
    assert_int_equal(r.valid, 3);
    assert_true(near(r.stride, 1));
    p.pad = DH_PAD_ZERO;
    assert_int_equal(plan_run(&r, &p, &c), 0);
    expect_out(&r, zero, 6);
    assert_int_equal(r.valid, 3);
}

/* ---- FPS ---- */

static void fps_without_pts(void **state)
{
    static struct run r;
    struct dh_media_plan p = plan_of(DH_PLAN_FPS, 0);
    struct dh__clip_frames c = clip_fps(30, 30);
    const int64_t w10[] = {0, 3, 6, 9, 12, 15, 18, 21, 24, 27};
    /* 20 fps on 30: times at 1.5 k frames; the x.5 ties go to the earlier */
    const int64_t w20[] = {0,  1,  3,  4,  6,  7,  9,  10, 12, 13,
                           15, 16, 18, 19, 21, 22, 24, 25, 27, 28};
    const int64_t w7[] = {0, 4, 7};

    (void)state;
    p.fps = 10;
    assert_int_equal(plan_run(&r, &p, &c), 0);
    expect_out(&r, w10, 10);
    assert_int_equal(r.valid, 10);
    assert_true(near(r.stride, 3));
    p.fps = 20;
    assert_int_equal(plan_run(&r, &p, &c), 0);
    expect_out(&r, w20, 20);
    assert_true(near(r.stride, 1.5));
    /* Above the source rate: every frame twice (0.5 k, ties earlier). */
    p.fps = 60;
    assert_int_equal(plan_run(&r, &p, &c), 0);
    assert_int_equal(r.count, 60);
    for (int k = 0; k < 60; k++)
        assert_int_equal(r.out[k], k / 2);
    assert_true(near(r.stride, 0.5));
    /* 10 frames at 25 fps = 0.4 s; 7 fps samples 0, 1/7, 2/7 s, which are
     * frames 0, 3.57 and 7.14. */
    c = clip_fps(10, 25);
    p.fps = 7;
    assert_int_equal(plan_run(&r, &p, &c), 0);
    expect_out(&r, w7, 3);
    assert_true(near(r.stride, 25.0 / 7));
}

static void fps_with_constant_rate_pts(void **state)
{
    static struct run r;
    static int64_t pts[32];
    struct dh_media_plan p = plan_of(DH_PLAN_FPS, 0);
    struct dh__clip_frames c = {.n = 32, .pts = pts, .time_base = 1.0 / 1024};

    (void)state;
    /* 16 fps (64 units of 1/1024 s), starting at a non-zero pts: 2 s. */
    for (int i = 0; i < 32; i++)
        pts[i] = 5000 + 64 * i;
    p.fps = 4;
    assert_int_equal(plan_run(&r, &p, &c), 0);
    assert_int_equal(r.count, 8);
    assert_int_equal(r.valid, 8);
    for (int k = 0; k < 8; k++)
        assert_int_equal(r.out[k], 4 * k);
    assert_true(near(r.stride, 4));
}

static void fps_with_variable_rate_pts(void **state)
{
    static struct run r;
    /* ms: a burst, a gap, a burst; duration 340 + 340/9 = 377.8 ms. */
    static const int64_t pts[] = {77,  87,  97,  177, 187,
                                  377, 387, 397, 407, 417};
    struct dh_media_plan p = plan_of(DH_PLAN_FPS, 0);
    struct dh__clip_frames c = {.n = 10, .pts = pts, .time_base = 0.001};
    /* 0 ms -> 0; 100 -> frame 3 (100); 200 -> frame 4 (110, 90 away, not
     * frame 5 at 300, 100 away); 300 -> frame 5; 400 is past the end. */
    const int64_t want[] = {0, 3, 4, 5};

    (void)state;
    p.fps = 10;
    assert_int_equal(plan_run(&r, &p, &c), 0);
    expect_out(&r, want, 4);
    assert_int_equal(r.valid, 4);
    assert_true(fabs(r.stride - 10 / (0.34 * 10 / 9 * 10)) < 1e-9);
}

static void fps_single_frame_clip(void **state)
{
    static struct run r;
    static const int64_t pts[] = {900};
    struct dh_media_plan p = plan_of(DH_PLAN_FPS, 0);
    struct dh__clip_frames c = {
        .n = 1, .pts = pts, .time_base = 1.0 / 1024, .fps = 25};

    (void)state;
    /* One 40 ms frame sampled at 100 fps: 0, 10, 20, 30 ms. */
    p.fps = 100;
    assert_int_equal(plan_run(&r, &p, &c), 0);
    assert_int_equal(r.count, 4);
    for (int k = 0; k < 4; k++)
        assert_int_equal(r.out[k], 0);
    assert_true(near(r.stride, 0.25));
    /* No rate to go by: still one frame. */
    c.fps = 0;
    assert_int_equal(plan_run(&r, &p, &c), 0);
    assert_int_equal(r.count, 1);
    assert_int_equal(r.valid, 1);
    assert_int_equal(r.out[0], 0);
}

static void fps_cap_and_limit(void **state)
{
    static struct run r;
    struct dh_media_plan p = plan_of(DH_PLAN_FPS, 5);
    struct dh__clip_frames c = clip_fps(300, 30);
    const int64_t want[] = {0, 3, 6, 9, 12};

    (void)state;
    p.fps = 10;
    assert_int_equal(plan_run(&r, &p, &c), 0);
    expect_out(&r, want, 5);
    assert_int_equal(r.valid, 5);
    /* 120 s at 1000 fps without a cap is refused ... */
    c = clip_fps(3600, 30);
    p.fps = 1000;
    p.frames = 0;
    assert_int_equal(plan_run(&r, &p, &c), DH_EINVAL);
    assert_string_equal(r.e.msg, "plan: fps 1000 over a 120.0 s clip asks "
                                 "for 120000 frames, over the 4096 limit; "
                                 "set a frame cap");
    assert_int_equal(r.count, -7); /* untouched on error */
    /* ... and with one, capped: the last is 4095 * 30 / 1000 = 122.85. */
    p.frames = DH_MEDIA_MAX_FRAMES;
    assert_int_equal(plan_run(&r, &p, &c), 0);
    assert_int_equal(r.count, DH_MEDIA_MAX_FRAMES);
    assert_int_equal(r.out[DH_MEDIA_MAX_FRAMES - 1], 123);
    /* Exactly the limit without a cap is fine. */
    c = clip_fps(DH_MEDIA_MAX_FRAMES, 30);
    p.fps = 30;
    p.frames = 0;
    assert_int_equal(plan_run(&r, &p, &c), 0);
    assert_int_equal(r.count, DH_MEDIA_MAX_FRAMES);
    assert_int_equal(r.out[DH_MEDIA_MAX_FRAMES - 1], DH_MEDIA_MAX_FRAMES - 1);
}

/* ---- INDICES ---- */

static void indices_copied_in_order(void **state)
{
    static struct run r;
    static const int64_t idx[] = {5, 1, 9, 9};
    struct dh_media_plan p = plan_of(DH_PLAN_INDICES, 4);
    struct dh__clip_frames c = clip_fps(10, 25);

    (void)state;
    p.indices = idx;
    assert_int_equal(plan_run(&r, &p, &c), 0);
    expect_out(&r, idx, 4);
    assert_int_equal(r.valid, 4);
    assert_true(near(r.stride, (4 + 8 + 0) / 3.0));
    p.frames = 1;
    assert_int_equal(plan_run(&r, &p, &c), 0);
    expect_out(&r, idx, 1);
    assert_true(near(r.stride, 1));
}

static void indices_out_of_range(void **state)
{
    static struct run r;
    static const int64_t hi[] = {3, 120}, neg[] = {-1};
    struct dh_media_plan p = plan_of(DH_PLAN_INDICES, 2);
    struct dh__clip_frames c = clip_fps(100, 25);

    (void)state;
    p.indices = hi;
    assert_int_equal(plan_run(&r, &p, &c), DH_EINVAL);
    assert_string_equal(r.e.msg, "plan: frame index 120 out of range (the "
                                 "clip has 100 frames)");
    assert_int_equal(r.count, -7);
    assert_int_equal(r.valid, -7);
    p.indices = neg;
    p.frames = 1;
    assert_int_equal(plan_run(&r, &p, &c), DH_EINVAL);
    assert_non_null(strstr(r.e.msg, "index -1 out of range"));
    p.indices = NULL;
    assert_int_equal(plan_run(&r, &p, &c), DH_EINVAL);
}

/* ---- JITTER ---- */

static void jitter_is_deterministic_per_seed(void **state)
{
    static struct run a, b;
    struct dh_media_plan p = plan_of(DH_PLAN_JITTER, 8);
    struct dh__clip_frames c = clip_fps(10000, 30);
    int64_t seen_off[64], seen_s[64];
    int distinct = 0;

    (void)state;
    p.seed = 42;
    assert_int_equal(plan_run(&a, &p, &c), 0);
    assert_int_equal(plan_run(&b, &p, &c), 0);
    assert_memory_equal(a.out, b.out, 8 * sizeof(int64_t));
    p.seed = 43;
    assert_int_equal(plan_run(&b, &p, &c), 0);
    assert_true(a.out[0] != b.out[0] || a.stride != b.stride);
    /* 64 seeds: (offset, stride) nearly all different. */
    for (uint64_t s = 0; s < 64; s++) {
        int dup = 0;
        p.seed = s * 0x100000001ULL;
        assert_int_equal(plan_run(&a, &p, &c), 0);
        for (int i = 0; i < distinct; i++)
            dup |= seen_off[i] == a.out[0] && seen_s[i] == a.out[1] - a.out[0];
        if (!dup) {
            seen_off[distinct] = a.out[0];
            seen_s[distinct++] = a.out[1] - a.out[0];
        }
    }
    assert_true(distinct >= 60);
}

static void jitter_check_one(const struct run *r, int64_t n, int64_t big_n)
{
    assert_int_equal(r->count, big_n);
    if (n <= big_n) {
        assert_int_equal(r->valid, n);
        for (int64_t i = 0; i < big_n; i++)
            assert_int_equal(r->out[i], i < n ? i : n - 1);
        return;
    }
    assert_int_equal(r->valid, big_n);
    for (int64_t i = 0; i < big_n; i++)
        assert_true(r->out[i] >= 0 && r->out[i] < n);
    if (big_n == 1)
        return;
    int64_t s = r->out[1] - r->out[0];
    assert_true(s >= 1 && s <= (n - 1) / (big_n - 1));
    assert_true(near(r->stride, (double)s));
    for (int64_t i = 1; i < big_n; i++)
        assert_int_equal(r->out[i] - r->out[i - 1], s);
}

static void jitter_stays_in_bounds(void **state)
{
    static struct run r;
    static const int64_t lens[] = {1, 2, 5, 8, 9, 10, 17, 100, 1000, 12345};
    static const int64_t counts[] = {1, 2, 8, 16};
    struct dh_media_plan p = plan_of(DH_PLAN_JITTER, 8);

    (void)state;
    for (int li = 0; li < 10; li++) {
        for (int ci = 0; ci < 4; ci++) {
            struct dh__clip_frames c = clip_fps(lens[li], 30);
            p.frames = counts[ci];
            for (uint64_t s = 0; s < 200; s++) {
                p.seed = s;
                assert_int_equal(plan_run(&r, &p, &c), 0);
                jitter_check_one(&r, lens[li], counts[ci]);
            }
        }
    }
}

/* 20 frames, 8 samples: stride 1 or 2; offsets 0..12 or 0..5. */
static void jitter_reaches_both_ends(void **state)
{
    static struct run r;
    struct dh_media_plan p = plan_of(DH_PLAN_JITTER, 8);
    struct dh__clip_frames c = clip_fps(20, 30);
    int s1 = 0, s2 = 0, off0 = 0, off_max = 0, single[20] = {0}, hit = 0;

    (void)state;
    for (uint64_t s = 0; s < 400; s++) {
        p.seed = s;
        assert_int_equal(plan_run(&r, &p, &c), 0);
        int64_t st = r.out[1] - r.out[0];
        s1 |= st == 1;
        s2 |= st == 2;
        off0 |= r.out[0] == 0;
        off_max |= r.out[7] == 19;
    }
    assert_true(s1 && s2 && off0 && off_max);
    p.frames = 1;
    for (uint64_t s = 0; s < 400; s++) {
        p.seed = s;
        assert_int_equal(plan_run(&r, &p, &c), 0);
        single[r.out[0]] = 1;
    }
    for (int i = 0; i < 20; i++)
        hit += single[i];
    assert_int_equal(hit, 20);
}

/* ---- ALL and bad input ---- */

static void all_is_capped(void **state)
{
    static struct run r;
    struct dh_media_plan p = plan_of(DH_PLAN_ALL, 0);
    struct dh__clip_frames c = clip_fps(10, 25);

    (void)state;
    assert_int_equal(plan_run(&r, &p, &c), 0);
    assert_int_equal(r.count, 10);
    assert_int_equal(r.valid, 10);
    for (int i = 0; i < 10; i++)
        assert_int_equal(r.out[i], i);
    c.n = 5000;
    assert_int_equal(plan_run(&r, &p, &c), 0);
    assert_int_equal(r.count, DH_MEDIA_MAX_FRAMES);
    assert_int_equal(r.valid, DH_MEDIA_MAX_FRAMES);
    assert_int_equal(r.out[DH_MEDIA_MAX_FRAMES - 1], DH_MEDIA_MAX_FRAMES - 1);
}

static void plan_rejects_bad_input(void **state)
{
    static struct run r;
    struct dh_media_plan p = plan_of(DH_PLAN_UNIFORM, 4);
    struct dh__clip_frames c = clip_fps(0, 25);

    (void)state;
    assert_int_equal(plan_run(&r, &p, &c), DH_EINVAL); /* empty clip */
    c.n = 10;
    p.frames = 0;
    assert_int_equal(plan_run(&r, &p, &c), DH_EINVAL);
    p.frames = DH_MEDIA_MAX_FRAMES + 1;
    assert_int_equal(plan_run(&r, &p, &c), DH_EINVAL);
    p.kind = DH_PLAN_JITTER;
    assert_int_equal(plan_run(&r, &p, &c), DH_EINVAL);
    p.kind = (enum dh_plan_kind)99;
    p.frames = 4;
    assert_int_equal(plan_run(&r, &p, &c), DH_EINVAL);
    p.kind = DH_PLAN_FPS;
    p.fps = 0;
    assert_int_equal(plan_run(&r, &p, &c), DH_EINVAL);
    p.fps = 10;
    c.fps = 0; /* neither pts nor a rate */
    assert_int_equal(plan_run(&r, &p, &c), DH_EINVAL);
    assert_int_equal(r.count, -7);
}

/* ---- snapping ---- */

static void snap_to_nearest_in_reach(void **state)
{
    int64_t idx[] = {10, 50, 90};
    const int64_t key[] = {0, 12, 45, 60, 100};

    (void)state;
    /* 10 -> 12; 50 -> 45 (not 60); 90: nothing within 8, stays. */
    assert_true(near(dh__frames_snap(idx, 3, key, 5, 8), 7.0 / 3));
    assert_int_equal(idx[0], 12);
    assert_int_equal(idx[1], 45);
    assert_int_equal(idx[2], 90);
}

static void snap_ties_and_reach(void **state)
{
    int64_t one[] = {10}, two[] = {5, 7}, far[] = {5};
    const int64_t tie[] = {8, 12}, ex[] = {5, 6}, k20[] = {20};

    (void)state;
    assert_true(near(dh__frames_snap(one, 1, tie, 2, 5), 2));
    assert_int_equal(one[0], 8);
    /* tol 0: only exact matches. */
    assert_true(near(dh__frames_snap(two, 2, ex, 2, 0), 0));
    assert_int_equal(two[0], 5);
    assert_int_equal(two[1], 7);
    assert_true(near(dh__frames_snap(far, 1, k20, 1, 3), 0));
    assert_int_equal(far[0], 5);
    assert_true(near(dh__frames_snap(far, 0, k20, 1, 3), 0));
    assert_true(near(dh__frames_snap(far, 1, NULL, 0, 3), 0));
    assert_int_equal(far[0], 5);
}

static void snap_uses_each_candidate_once(void **state)
{
    int64_t a[] = {10, 11}, b[] = {10, 11};
    const int64_t ka[] = {10, 13}, kb[] = {10};

    (void)state;
    /* 11 would take 10 too; it takes the other one within reach. */
    assert_true(near(dh__frames_snap(a, 2, ka, 2, 3), 1));
    assert_int_equal(a[0], 10);
    assert_int_equal(a[1], 13);
    /* Nothing else in reach: it keeps its own index. */
    assert_true(near(dh__frames_snap(b, 2, kb, 1, 3), 0));
    assert_int_equal(b[0], 10);
    assert_int_equal(b[1], 11);
}

static void snap_stays_ascending(void **state)
{
    int64_t a[] = {10, 12, 12}, d[] = {6, 6, 6};
    const int64_t ka[] = {13}, kd[] = {4, 6, 8};

    (void)state;
    /* Nearest-first would move 10 to 13, past 12.  a[2] is REPEAT padding
     * (valid = 2): left for the caller. */
    assert_true(near(dh__frames_snap(a, 2, ka, 1, 3), 0.5));
    assert_int_equal(a[0], 10);
    assert_int_equal(a[1], 13);
    assert_int_equal(a[2], 12);
    /* A repeated frame (FPS above the source rate). */
    assert_true(near(dh__frames_snap(d, 3, kd, 3, 3), 2.0 / 3));
    assert_int_equal(d[0], 6);
    assert_int_equal(d[1], 6);
    assert_int_equal(d[2], 8);
}

static uint64_t lcg(uint64_t *s)
{
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return *s >> 33;
}

/* Random targets and candidates: order kept, moves within reach onto
 * candidates, no candidate taken twice, the mean shift as returned. */
static void snap_properties(void **state)
{
    static int64_t idx[64], old[64], cand[64];
    uint64_t rng = 1;

    (void)state;
    for (int round = 0; round < 2000; round++) {
        int64_t nv = 1 + (int64_t)(lcg(&rng) % 64);
        int64_t nc = (int64_t)(lcg(&rng) % 64), v = 0, k = 0;
        double tol = (double)(lcg(&rng) % 12) / 2, sum = 0;
        for (int64_t i = 0; i < nv; i++)
            old[i] = idx[i] = v += (int64_t)(lcg(&rng) % 4);
        for (int64_t i = 0; i < nc; i++)
            cand[i] = k += 1 + (int64_t)(lcg(&rng) % 5);
        double got = dh__frames_snap(idx, nv, cand, nc, tol);
        for (int64_t i = 0; i < nv; i++) {
            sum += fabs((double)(idx[i] - old[i]));
            assert_true(i == 0 || idx[i] >= idx[i - 1]);
            assert_true(fabs((double)(idx[i] - old[i])) <= tol);
            if (idx[i] == old[i])
                continue;
            int found = 0;
            for (int64_t j = 0; j < nc; j++)
                found |= cand[j] == idx[i];
            assert_true(found);
            for (int64_t j = 0; j < i; j++)
                assert_true(idx[j] != idx[i] || idx[j] == old[j]);
        }
        assert_true(near(got, sum / (double)nv));
    }
}

/* ---- plan defaults, checks, sizes ---- */

static void plan_init_defaults(void **state)
{
    struct dh_media_plan p;
    struct dh_err e;

    (void)state;
    memset(&p, 0xa5, sizeof(p));
    dh_media_plan_init(&p);
    assert_int_equal(p.kind, DH_PLAN_UNIFORM);
    assert_int_equal(p.frames, 16);
    assert_int_equal(p.width, 224);
    assert_int_equal(p.height, 224);
    assert_int_equal(p.geometry, DH_GEOM_CROP);
    assert_int_equal(p.layout, DH_LAYOUT_THWC);
    assert_int_equal(p.dtype, DH_DTYPE_U8);
    assert_int_equal(p.snap, DH_SNAP_EXACT);
    assert_int_equal(p.pad, DH_PAD_REPEAT);
    assert_true(p.fps == 0 && p.seed == 0 && p.indices == NULL);
    assert_true(p.snap_tol == 0);
    assert_true(p.mean[0] == 0.485f && p.mean[1] == 0.456f &&
                p.mean[2] == 0.406f);
    assert_true(p.std[0] == 0.229f && p.std[1] == 0.224f && p.std[2] == 0.225f);
    assert_int_equal(dh_media_plan_check(&p, &e), 0);
}

static void expect_bad(const struct dh_media_plan *p, const char *needle)
{
    struct dh_err e;

    dh_err_clear(&e);
    assert_int_equal(dh_media_plan_check(p, &e), DH_EINVAL);
    if (!strstr(e.msg, needle))
        fail_msg("message '%s' lacks '%s'", e.msg, needle);
}

static void plan_check_sizes_and_counts(void **state)
{
    struct dh_media_plan p;
    struct dh_err e;

    (void)state;
    dh_media_plan_init(&p);
    p.width = 0;
    expect_bad(&p, "plan: width 0 out of range 1..16384");
    p.width = 16384;
    p.height = 16385;
    expect_bad(&p, "plan: height 16385 out of range 1..16384");
    p.height = 1;
    assert_int_equal(dh_media_plan_check(&p, &e), 0);
    p.frames = 0;
    expect_bad(&p, "frames 0 out of range 1..4096");
    p.frames = 4097;
    expect_bad(&p, "frames 4097");
    p.kind = DH_PLAN_JITTER;
    expect_bad(&p, "frames 4097");
    p.kind = DH_PLAN_INDICES;
    p.frames = 3;
    expect_bad(&p, "no indices");
    p.kind = DH_PLAN_ALL;
    p.frames = 0; /* not used */
    assert_int_equal(dh_media_plan_check(&p, &e), 0);
    p.kind = DH_PLAN_FPS;
    expect_bad(&p, "fps 0 must be positive");
    p.fps = NAN;
    expect_bad(&p, "fps");
    p.fps = INFINITY;
    expect_bad(&p, "fps");
    p.fps = 2.5;
    assert_int_equal(dh_media_plan_check(&p, &e), 0); /* 0: no cap */
    p.frames = -1;
    expect_bad(&p, "frames -1 out of range 0..4096");
    p.frames = 4096;
    assert_int_equal(dh_media_plan_check(&p, &e), 0);
    assert_int_equal(dh_media_plan_check(NULL, &e), DH_EINVAL);
}

static void plan_check_enums_and_floats(void **state)
{
    struct dh_media_plan p, q;
    struct dh_err e;

    (void)state;
    dh_media_plan_init(&q);
    p = q;
    p.kind = (enum dh_plan_kind)5;
    expect_bad(&p, "kind 5");
    p = q;
    p.pad = (enum dh_pad)2;
    expect_bad(&p, "pad 2");
    p = q;
    p.geometry = (enum dh_geometry)(DH_GEOM_NATIVE + 1);
    expect_bad(&p, "geometry 4");
    p = q; /* a native plan's bounds; its width / height are not used */
    p.geometry = DH_GEOM_NATIVE;
    p.width = p.height = 0;
    p.patch = DH_MEDIA_MAX_PATCH + 1;
    expect_bad(&p, "plan: patch 1025 out of range");
    p.patch = 28;
    p.max_side = -1;
    expect_bad(&p, "plan: max_side -1 out of range");
    p.max_side = 0;
    p.max_area = DH_MEDIA_MAX_PIXELS + 1;
    expect_bad(&p, "plan: max_area");
    p = q;
    p.layout = (enum dh_layout) - 1;
    expect_bad(&p, "layout");
    p = q;
    p.dtype = (enum dh_dtype)2;
    expect_bad(&p, "dtype 2");
    p = q;
    p.snap = (enum dh_snap)3;
    expect_bad(&p, "snap 3");
    p = q;
    p.std[1] = 0; /* u8 output ignores normalisation */
    assert_int_equal(dh_media_plan_check(&p, &e), 0);
    p.dtype = DH_DTYPE_F32;
    expect_bad(&p, "std[1] 0 must be positive");
    p.std[1] = INFINITY;
    expect_bad(&p, "std[1]");
    p.std[1] = 1;
    p.mean[2] = NAN;
    expect_bad(&p, "mean[2]");
    p.mean[2] = 0.5f;
    assert_int_equal(dh_media_plan_check(&p, &e), 0);
    p.snap_tol = NAN;
    expect_bad(&p, "snap_tol");
    p.snap_tol = -1; /* <= 0 means half the stride */
    assert_int_equal(dh_media_plan_check(&p, &e), 0);
}

static void plan_bytes_values(void **state)
{
    struct dh_media_plan p;

    (void)state;
    dh_media_plan_init(&p);
    assert_true(dh_media_plan_bytes(&p, 16) == (size_t)16 * 224 * 224 * 3);
    assert_true(dh_media_plan_bytes(&p, 1) == (size_t)224 * 224 * 3);
    assert_true(dh_media_plan_bytes(&p, 0) == 0);
    assert_true(dh_media_plan_bytes(&p, -5) == 0);
    p.dtype = DH_DTYPE_F32;
    p.width = 320;
    p.height = 240;
    assert_true(dh_media_plan_bytes(&p, 8) == (size_t)8 * 320 * 240 * 3 * 4);
    p.width = p.height = 16384;
    assert_true(dh_media_plan_bytes(&p, DH_MEDIA_MAX_FRAMES) ==
                (size_t)4096 * 16384 * 16384 * 12);
    assert_true(dh_media_plan_bytes(&p, INT64_C(1) << 40) == SIZE_MAX);
    assert_true(dh_media_plan_bytes(&p, INT64_MAX) == SIZE_MAX);
    p.dtype = DH_DTYPE_U8;
    p.width = p.height = 1;
    /* 3 x (2^63 - 1) overflows 64 bits by itself. */
    assert_true(dh_media_plan_bytes(&p, INT64_MAX) == SIZE_MAX);
    assert_true(dh_media_plan_bytes(&p, INT64_MAX / 3) ==
                (size_t)(INT64_MAX / 3) * 3);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(uniform_takes_segment_centres),
        cmocka_unit_test(uniform_huge_clip_does_not_overflow),
        cmocka_unit_test(uniform_short_clip_pads),
        cmocka_unit_test(fps_without_pts),
        cmocka_unit_test(fps_with_constant_rate_pts),
        cmocka_unit_test(fps_with_variable_rate_pts),
        cmocka_unit_test(fps_single_frame_clip),
        cmocka_unit_test(fps_cap_and_limit),
        cmocka_unit_test(indices_copied_in_order),
        cmocka_unit_test(indices_out_of_range),
        cmocka_unit_test(jitter_is_deterministic_per_seed),
        cmocka_unit_test(jitter_stays_in_bounds),
        cmocka_unit_test(jitter_reaches_both_ends),
        cmocka_unit_test(all_is_capped),
        cmocka_unit_test(plan_rejects_bad_input),
        cmocka_unit_test(snap_to_nearest_in_reach),
        cmocka_unit_test(snap_ties_and_reach),
        cmocka_unit_test(snap_uses_each_candidate_once),
        cmocka_unit_test(snap_stays_ascending),
        cmocka_unit_test(snap_properties),
        cmocka_unit_test(plan_init_defaults),
        cmocka_unit_test(plan_check_sizes_and_counts),
        cmocka_unit_test(plan_check_enums_and_floats),
        cmocka_unit_test(plan_bytes_values),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
