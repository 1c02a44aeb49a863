/*
 * test_gen_content.c - the gen-data frame generator (determinism, motion,
 * seed sensitivity, value ranges, every pixel written, nothing outside the
 * picture touched) and the profile helpers of datahelix/gendata.h.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "datahelix/gendata.h"
#include "media/gen_content.h"
#include "core/hash.h"

#define W 400
#define H 224
#define PAD 24 /* stride padding, checked to stay untouched */
#define GUARD 0xA5

/* One picture with padded strides; static storage keeps the stack small. */
struct pic {
    uint8_t y[H * (W + PAD)];
    uint8_t u[(H / 2) * (W / 2 + PAD)];
    uint8_t v[(H / 2) * (W / 2 + PAD)];
    struct dh__gen_planes pl;
};

static struct pic pa, pb;

static void pic_init(struct pic *p, int w, int h, uint8_t fill)
{
    memset(p->y, fill, sizeof(p->y));
    memset(p->u, fill, sizeof(p->u));
    memset(p->v, fill, sizeof(p->v));
    p->pl = (struct dh__gen_planes){
        {p->y, p->u, p->v},
        {w + PAD, (w + 1) / 2 + PAD, (w + 1) / 2 + PAD},
        w,
        h};
}

static void render(struct pic *p, int w, int h, uint8_t fill, int64_t t,
                   uint64_t seed)
{
    pic_init(p, w, h, fill);
    dh__gen_content_fill(&p->pl, t, seed);
}

/* Fraction of luma pixels whose values differ by more than `thr`. */
static double luma_changed(const struct pic *a, const struct pic *b, int thr)
{
    long n = 0;

    for (int y = 0; y < a->pl.height; y++)
        for (int x = 0; x < a->pl.width; x++) {
            int i = y * a->pl.linesize[0] + x;

            n += abs((int)a->y[i] - (int)b->y[i]) > thr;
        }
    return (double)n / ((double)a->pl.width * a->pl.height);
}

static int planes_equal(const struct pic *a, const struct pic *b)
{
    return !memcmp(a->y, b->y, sizeof(a->y)) &&
           !memcmp(a->u, b->u, sizeof(a->u)) &&
           !memcmp(a->v, b->v, sizeof(a->v));
}

static void deterministic_and_covers_every_pixel(void **state)
{
    (void)state;
    for (int64_t t = 0; t < 200; t += 37) {
        render(&pa, W, H, 0x00, t, 42);
        render(&pb, W, H, 0xFF, t, 42);
        /* Picture areas match although the buffers started different... */
        for (int y = 0; y < H; y++)
            assert_memory_equal(pa.y + y * (W + PAD), pb.y + y * (W + PAD), W);
        for (int y = 0; y < H / 2; y++) {
            assert_memory_equal(pa.u + y * (W / 2 + PAD),
                                pb.u + y * (W / 2 + PAD), W / 2);
            assert_memory_equal(pa.v + y * (W / 2 + PAD),
                                pb.v + y * (W / 2 + PAD), W / 2);
        }
        /* ...and a second run from the same start is identical bytes. */
        render(&pb, W, H, 0x00, t, 42);
        assert_true(planes_equal(&pa, &pb));
    }
}

static void consecutive_frames_move(void **state)
{
    (void)state;
    for (uint64_t seed = 0; seed < 4; seed++)
        for (int64_t t = 0; t < 300; t += 49) {
            render(&pa, W, H, 0, t, seed);
            render(&pb, W, H, 0, t + 1, seed);
            /* Beyond the +-4 noise: real motion over much of the frame. */
            assert_true(luma_changed(&pa, &pb, 8) > 0.2);
        }
}

static void seeds_differ(void **state)
{
    (void)state;
    render(&pa, W, H, 0, 0, 1);
    render(&pb, W, H, 0, 0, 2);
    assert_true(luma_changed(&pa, &pb, 8) > 0.3);
    assert_true(dh__mix64(1) != dh__mix64(2));
}

static void check_range(const uint8_t *p, int w, int h, int stride, int lo,
                        int hi)
{
    for (int y = 0; y < h; y++) {
        for (int x = 0; x < w; x++) {
            assert_in_range(p[y * stride + x], lo, hi);
        }
        for (int x = w; x < stride; x++)
            assert_int_equal(p[y * stride + x], GUARD);
    }
}

static void values_in_limited_range(void **state)
{
    static const int sizes[][2] = {{W, H}, {37, 21}, {16, 16}, {2, 2}};

    (void)state;
    for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
        int w = sizes[s][0], h = sizes[s][1], cw = (w + 1) / 2;

        for (int64_t t = 0; t < 400; t += 23) {
            render(&pa, w, h, GUARD, t, (uint64_t)t * 7919u);
            check_range(pa.y, w, h, pa.pl.linesize[0], 16, 235);
            check_range(pa.u, cw, (h + 1) / 2, pa.pl.linesize[1], 16, 240);
            check_range(pa.v, cw, (h + 1) / 2, pa.pl.linesize[2], 16, 240);
            /* Rows below the picture are untouched too. */
            if (h < H)
                assert_int_equal(pa.y[h * pa.pl.linesize[0]], GUARD);
        }
    }
}

static void profiles_parse(void **state)
{
    struct dh_gen_profile_list l = {0};
    struct dh_err e;

    (void)state;
    assert_int_equal(dh_gen_profiles_parse("mixed", &l, &e), 0);
    assert_int_equal(l.n, 3);
    assert_string_equal(l.p[0]->name, "S");
    assert_string_equal(l.p[2]->name, "L");
    assert_int_equal(dh_gen_profiles_parse(NULL, &l, &e), 0);
    assert_int_equal(l.n, 3);
    assert_int_equal(dh_gen_profiles_parse("xl,s,Mixed", &l, &e), 0);
    assert_int_equal(l.n, 5);
    assert_int_equal(l.p[0]->width, 1280);
    assert_int_equal(l.p[0]->height, 720);
    assert_int_equal(dh_gen_profiles_parse("S,Q", &l, &e), DH_EINVAL);
    assert_non_null(strstr(e.msg, "'Q'"));
    assert_int_equal(dh_gen_profiles_parse("S,,M", &l, &e), DH_EINVAL);
    assert_int_equal(dh_gen_profiles_parse("", &l, &e), DH_EINVAL);
    assert_int_equal(dh_gen_profiles_parse("averyveryverylongname", &l, &e),
                     DH_EINVAL);
    assert_null(dh_gen_profile_find("mixed"));
    assert_int_equal(dh_gen_profile_find("m")->height, 336);
}

static void frames_jittered_within_20_percent(void **state)
{
    const struct dh_gen_profile *s = dh_gen_profile_find("S");
    int64_t lo = 1000, hi = 0;

    (void)state;
    for (int64_t i = 0; i < 1000; i++) {
        int64_t n = dh_gen_file_frames(s, 5, i);

        assert_in_range(n, 40, 60);
        lo = n < lo ? n : lo;
        hi = n > hi ? n : hi;
        assert_int_equal(n, dh_gen_file_frames(s, 5, i));
    }
    assert_true(hi - lo >= 15); /* it does vary */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(deterministic_and_covers_every_pixel),
        cmocka_unit_test(consecutive_frames_move),
        cmocka_unit_test(seeds_differ),
        cmocka_unit_test(values_in_limited_range),
        cmocka_unit_test(profiles_parse),
        cmocka_unit_test(frames_jittered_within_20_percent),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
