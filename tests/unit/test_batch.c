/* test_batch.c - a request's samples into one [B,T,H,W,3] tensor: each
 * slice equals the sample decoded alone, padding and masks, determinism
 * from (seed, sample id), and errors naming the sample. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "datahelix/batch.h"
#include "datahelix/gendata.h"
#include "datahelix/index.h"
#include "datahelix/probe.h"

#define NCLIPS 3

#include "clip_fixture.h"

static int setup(void **state)
{
    (void)state;
    return clip_fixture_setup("batch", 3);
}

/* Sample `id` decoded alone, as the batch must have done it. */
static uint8_t *alone(struct dh_media *m, uint64_t id,
                      const struct dh_media_plan *p, size_t *len)
{
    struct dh_media_plan sp;
    struct dh_err e;
    int64_t frames;
    uint8_t *buf;

    dh_batch_sample_plan(p, 0, id, &sp);
    assert_int_equal(dh_media_open(m, paths[id], &e), 0);
    assert_int_equal(dh_media_select(m, &sp, &frames, &e), 0);
    *len = dh_media_plan_bytes(&sp, frames);
    buf = calloc(1, *len + DH_MEDIA_DST_PAD);
    assert_non_null(buf);
    assert_int_equal(
        dh_media_decode(m, &sp, buf, *len + DH_MEDIA_DST_PAD, NULL, &e), 0);
    dh_media_close(m);
    return buf;
}

static void slices_equal_samples_decoded_alone(void **state)
{
    struct dh_media_plan plans[2] = {fixture_plan(), fixture_plan()};
    uint64_t ids[3] = {2, 0, 1};
    struct dh_media *m;
    struct dh_err e;

    (void)state;
    plans[1].kind = DH_PLAN_JITTER; /* the seed matters here */
    plans[1].geometry = DH_GEOM_RANDOM_CROP;
    assert_int_equal(dh_media_create(&m, &e), 0);
    for (int k = 0; k < 2; k++) {
        size_t one = dh_batch_bytes(&plans[k], 1), len;
        size_t cap = dh_batch_bytes(&plans[k], 3) + DH_MEDIA_DST_PAD;
        uint8_t *dst = malloc(cap);
        int32_t valid[3];
        uint32_t at = 99;

        assert_non_null(dst);
        if (dh_batch_decode(m, ix, 0, ids, 3, &plans[k], dst, cap, valid, &at,
                            &e))
            fail_msg("batch: %s", e.msg);
        for (int i = 0; i < 3; i++) {
            uint8_t *ref = alone(m, ids[i], &plans[k], &len);
            assert_int_equal(len, one);
            assert_memory_equal(dst + (size_t)i * one, ref, one);
            assert_int_equal(valid[i], 4);
            free(ref);
        }
        free(dst);
    }
    dh_media_destroy(m);
}

static void jitter_depends_on_seed_epoch_and_id(void **state)
{
    struct dh_media_plan p = fixture_plan(), a, b, c;

    (void)state;
    p.kind = DH_PLAN_JITTER;
    p.seed = 11;
    dh_batch_sample_plan(&p, 0, 5, &a);
    dh_batch_sample_plan(&p, 0, 5, &b);
    dh_batch_sample_plan(&p, 0, 6, &c);
    assert_true(a.seed == b.seed);
    assert_true(a.seed != c.seed);
    dh_batch_sample_plan(&p, 1, 5, &c); /* a new epoch, a new draw */
    assert_true(a.seed != c.seed);
    p.seed = 12;
    dh_batch_sample_plan(&p, 0, 5, &b);
    assert_true(a.seed != b.seed);
}

static void short_samples_are_zero_padded_with_masks(void **state)
{
    struct dh_media_plan p = fixture_plan();
    struct dh_media *m;
    struct dh_err e;
    uint64_t ids[2] = {0, 1};
    int32_t valid[2];
    size_t one, cap;
    uint8_t *dst;

    (void)state;
    p.kind = DH_PLAN_FPS;
    p.fps = 4;     /* about 8 frames from a ~2 s clip */
    p.frames = 40; /* the batch's T */
    one = dh_batch_bytes(&p, 1);
    cap = dh_batch_bytes(&p, 2) + DH_MEDIA_DST_PAD;
    dst = malloc(cap);
    assert_non_null(dst);
    memset(dst, 0xAB, cap);
    assert_int_equal(dh_media_create(&m, &e), 0);
    if (dh_batch_decode(m, ix, 0, ids, 2, &p, dst, cap, valid, NULL, &e))
        fail_msg("batch: %s", e.msg);
    for (int i = 0; i < 2; i++) {
        size_t used = (size_t)valid[i] * 32 * 24 * 3;
        assert_true(valid[i] >= 6 && valid[i] <= 12);
        for (size_t j = used; j < one; j++)
            if (dst[(size_t)i * one + j] != 0)
                fail_msg("sample %d: byte %zu past its %d frames is %d", i, j,
                         valid[i], dst[(size_t)i * one + j]);
    }
    p.frames = 0; /* no cap: no fixed T */
    assert_int_equal(dh_batch_bytes(&p, 2), 0);
    assert_int_equal(
        dh_batch_decode(m, ix, 0, ids, 2, &p, dst, cap, valid, NULL, &e),
        DH_EINVAL);
    assert_non_null(strstr(e.msg, "frame cap"));
    dh_media_destroy(m);
    free(dst);
}

static void errors_name_the_sample(void **state)
{
    struct dh_media_plan p = fixture_plan();
    struct dh_media *m;
    struct dh_err e;
    uint64_t ids[3] = {1, NCLIPS, 0}; /* the middle one is cut short */
    uint64_t bad_id[1] = {999};
    int32_t valid[3];
    uint32_t at = 99;
    size_t cap = dh_batch_bytes(&p, 3) + DH_MEDIA_DST_PAD;
    uint8_t *dst = malloc(cap);
    char want[700];

    (void)state;
    assert_non_null(dst);
    assert_int_equal(dh_media_create(&m, &e), 0);
    dh_err_clear(&e);
    assert_int_not_equal(
        dh_batch_decode(m, ix, 0, ids, 3, &p, dst, cap, valid, &at, &e), 0);
    assert_int_equal(at, 1);
    snprintf(want, sizeof(want), "sample %d (%s): ", NCLIPS, paths[NCLIPS]);
    assert_non_null(strstr(e.msg, want));
    assert_int_equal(
        dh_batch_decode(m, ix, 0, bad_id, 1, &p, dst, cap, valid, NULL, &e),
        DH_EINVAL);
    assert_non_null(strstr(e.msg, "sample id 999"));
    assert_int_equal(dh_batch_decode(m, ix, 0, ids, 3, &p, dst,
                                     dh_batch_bytes(&p, 3), valid, NULL, &e),
                     DH_EINVAL);
    assert_non_null(strstr(e.msg, "destination holds"));
    dh_media_destroy(m);
    free(dst);
}

/* The skip policy's substitutes (dh_batch_decode_subs): the cut clip's
 * slice gets the first spare that decodes, a failing spare (the cut clip
 * itself, an id not in the index) is passed over, and the slice equals
 * that spare decoded alone; a known failure is not decoded again; spares
 * used up: the batch fails naming the sample left without one, as
 * without spares. */
static void spares_fill_failed_slices(void **state)
{
    struct dh_media_plan p = fixture_plan();
    struct dh_media *m;
    struct dh_err e;
    uint64_t ids[3] = {1, NCLIPS, 0}, spares[3] = {NCLIPS, 999, 2};
    int32_t valid[3], known[3] = {0, 0, DH_EMEDIA};
    size_t one = dh_batch_bytes(&p, 1),
           cap = dh_batch_bytes(&p, 3) + DH_MEDIA_DST_PAD, len;
    uint8_t *dst = malloc(cap), *want;
    struct dh_batch_subs subs = {.spares = spares, .n_spares = 3};
    uint32_t at = 99;
    int rc;

    (void)state;
    assert_non_null(dst);
    assert_int_equal(dh_media_create(&m, &e), 0);
    assert_int_equal(dh_batch_decode_subs(m, ix, 0, ids, 3, &p, dst, cap, valid,
                                          &subs, &at, &e),
                     0);
    assert_int_equal(subs.n, 1);
    assert_int_equal(subs.next, 3); /* two spares failed first */
    assert_int_equal(subs.pos[0], 1);
    assert_int_equal(subs.failed[0], NCLIPS);
    assert_int_equal(subs.sub[0], 2);
    assert_true(subs.cause[0] < 0);
    want = alone(m, 2, &p, &len);
    assert_true(len <= one);
    assert_memory_equal(dst + one, want, len);
    free(want);
    /* position 1 fails and takes the one spare; position 2 is known to
     * fail (not decoded) and finds none left: the error names it */
    subs = (struct dh_batch_subs){
        .spares = spares + 2, .n_spares = 1, .known = known};
    rc = dh_batch_decode_subs(m, ix, 0, ids, 3, &p, dst, cap, valid, &subs, &at,
                              &e);
    assert_int_equal(rc, DH_EMEDIA);
    assert_int_equal(e.code, rc);
    assert_int_equal(at, 2);
    assert_int_equal(subs.n, 1);
    assert_int_equal(subs.pos[0], 1);
    assert_non_null(strstr(e.msg, "sample 0 ("));
    dh_media_destroy(m);
    free(dst);
}

/* The per-sample watchdog runs from the open: past it, decoding stops
 * with DH_ETIMEOUT naming the file; off, the same decode succeeds. */
static void watchdog_abandons_a_slow_sample(void **state)
{
    struct dh_media *m;
    struct dh_media_plan p;
    struct dh_err e;
    int64_t frames = 0;
    size_t len;
    uint8_t *buf;
    struct timespec ts = {0, 20000000};

    (void)state;
    assert_int_equal(dh_media_create(&m, &e), 0);
    dh_media_plan_init(&p);
    p.frames = 8;
    p.width = p.height = 32;
    len = dh_media_plan_bytes(&p, 8) + DH_MEDIA_DST_PAD;
    buf = malloc(len);
    assert_non_null(buf);
    dh_media_set_watchdog(m, 5);
    assert_int_equal(dh_media_open(m, paths[1], &e), 0);
    /* The sleep is the behaviour under test, not a wait: the sample
     * "takes" longer than the 5 ms watchdog. */
    nanosleep(&ts, NULL);
    assert_int_equal(dh_media_select(m, &p, &frames, &e), 0);
    assert_int_equal(dh_media_decode(m, &p, buf, len, NULL, &e), DH_ETIMEOUT);
    assert_non_null(strstr(e.msg, "watchdog"));
    assert_non_null(strstr(e.msg, paths[1]));
    dh_media_set_watchdog(m, 0);
    assert_int_equal(dh_media_open(m, paths[1], &e), 0);
    nanosleep(&ts, NULL); /* as slow again, with no watchdog: no error */
    assert_int_equal(dh_media_select(m, &p, &frames, &e), 0);
    assert_int_equal(dh_media_decode(m, &p, buf, len, NULL, &e), 0);
    free(buf);
    dh_media_destroy(m);
}

/* The sound's place in the slot: after the frames, 64-aligned lengths
 * then rows; the frames where they were; a plan out of range refused. */
static void layout_puts_the_sound_after_the_frames(void **state)
{
    struct dh_media_plan p = fixture_plan();
    struct dh_batch_layout l;
    size_t video = dh_batch_bytes(&p, 3);

    (void)state;
    assert_int_equal(dh_batch_layout(&p, 3, &l), 0);
    assert_int_equal(l.total, video);
    assert_int_equal(l.lengths, 0);
    p.audio_rate = 16000;
    p.audio_channels = 2;
    p.audio_samples = 1001;
    assert_int_equal(dh_batch_layout(&p, 3, &l), 0);
    assert_int_equal(l.video, video);
    assert_true(l.lengths >= video && l.lengths % 64 == 0);
    assert_true(l.audio >= l.lengths + 3 * 8 && l.audio % 64 == 0);
    assert_int_equal(l.total, l.audio + 3 * 2 * 1001 * sizeof(float));
    assert_int_equal(dh_batch_bytes(&p, 3), l.total);
    p.audio_feature = DH_AUDIO_LOG_MEL; /* features after the rows */
    p.audio_n_fft = 400;
    p.audio_hop = 200;
    p.audio_mels = 16;
    assert_int_equal(dh_batch_layout(&p, 3, &l), 0);
    assert_true(l.features >= l.audio + 3 * 2 * 1001 * sizeof(float));
    assert_int_equal(l.features % 64, 0);
    assert_int_equal(l.total, l.features + 3 * 2 * 16 * (1001 / 200 + 1) *
                                               sizeof(float));
    p.audio_feature = DH_AUDIO_NO_FEATURES;
    p.audio_channels = 5; /* not a plan */
    assert_int_equal(dh_batch_layout(&p, 3, &l), -1);
    assert_true(dh_batch_bytes(&p, 3) == SIZE_MAX);
}

/* Clips without sound: rows of zeros and length 0 whatever the slot held
 * before, the frames as without sound; with audio_required, the sample's
 * error names it. */
static void clips_without_sound_get_empty_rows(void **state)
{
    struct dh_media_plan p = fixture_plan();
    struct dh_batch_layout l;
    struct dh_media *m;
    struct dh_err e;
    uint64_t ids[2] = {1, 0};
    int32_t valid[2];
    uint32_t at = 99;
    size_t cap;
    uint8_t *dst, *ref;
    int64_t len[2];

    (void)state;
    p.audio_rate = 8000;
    p.audio_channels = 1;
    p.audio_samples = 100;
    assert_int_equal(dh_batch_layout(&p, 2, &l), 0);
    cap = l.total + DH_MEDIA_DST_PAD;
    dst = malloc(cap);
    assert_non_null(dst);
    memset(dst, 0xff, cap);
    assert_int_equal(dh_media_create(&m, &e), 0);
    if (dh_batch_decode(m, ix, 0, ids, 2, &p, dst, cap, valid, &at, &e))
        fail_msg("batch: %s", e.msg);
    memcpy(len, dst + l.lengths, sizeof(len));
    assert_int_equal(len[0], 0);
    assert_int_equal(len[1], 0);
    for (size_t i = l.audio; i < l.total; i++)
        assert_int_equal(dst[i], 0);
    for (int i = 0; i < 2; i++) {
        size_t n;

        ref = alone(m, ids[i], &p, &n);
        assert_memory_equal(dst + (size_t)i * (l.video / 2), ref, n);
        free(ref);
    }
    /* with log-mel features: each silent row's are the floor, log10 1e-10 */
    free(dst);
    p.audio_feature = DH_AUDIO_LOG_MEL;
    p.audio_n_fft = 22; /* 2 x 11: Bluestein's path */
    p.audio_hop = 10;
    p.audio_mels = 4;
    assert_int_equal(dh_batch_layout(&p, 2, &l), 0);
    cap = l.total + DH_MEDIA_DST_PAD;
    dst = malloc(cap);
    assert_non_null(dst);
    memset(dst, 0xff, cap);
    if (dh_batch_decode(m, ix, 0, ids, 2, &p, dst, cap, valid, &at, &e))
        fail_msg("batch: %s", e.msg);
    assert_int_equal((l.total - l.features) / sizeof(float), 2 * 4 * 11);
    for (size_t i = l.features; i < l.total; i += sizeof(float)) {
        float v;

        memcpy(&v, dst + i, sizeof(v));
        assert_true(v == -10.0f);
    }
    p.audio_feature = DH_AUDIO_NO_FEATURES;
    p.audio_required = 1;
    assert_int_equal(
        dh_batch_decode(m, ix, 0, ids, 2, &p, dst, cap, valid, &at, &e),
        DH_EMEDIA);
    assert_int_equal(at, 0);
    assert_non_null(strstr(e.msg, "sample 1 ("));
    assert_non_null(strstr(e.msg, "no audio stream"));
    dh_media_destroy(m);
    free(dst);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(slices_equal_samples_decoded_alone),
        cmocka_unit_test(jitter_depends_on_seed_epoch_and_id),
        cmocka_unit_test(short_samples_are_zero_padded_with_masks),
        cmocka_unit_test(errors_name_the_sample),
        cmocka_unit_test(spares_fill_failed_slices),
        cmocka_unit_test(watchdog_abandons_a_slow_sample),
        cmocka_unit_test(layout_puts_the_sound_after_the_frames),
        cmocka_unit_test(clips_without_sound_get_empty_rows),
    };
    return cmocka_run_group_tests(tests, setup, clip_fixture_teardown);
}
