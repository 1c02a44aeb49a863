/* test_batch_packed.c - variable-shape samples in one slot: each sample's
 * bytes equal the sample decoded alone at its own native size, the samples
 * lie back to back after the table (used == table + samples), the table
 * reads back and a damaged one is refused, and the one rounding rule of
 * native sizes (dh_media_native_size). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "datahelix/batch.h"
#include "datahelix/batch_packed.h"
#include "datahelix/gendata.h"
#include "datahelix/index.h"
#include "datahelix/probe.h"

#define NCLIPS 2

static char dir[512], dhx[600];
static char paths[NCLIPS][600];
static struct dh_index *ix;

/* An S clip (400x224, ~2 s) and an M clip (600x336, ~4 s), probed, so the
 * index has their real sizes. */
static int setup(void **state)
{
    const char *tmp = getenv("DH_TEST_TMP");
    struct dh_gen_opts o = {0};
    struct dh_index_builder *b;
    struct dh_desc d;
    struct dh_err e;
    static const char *names[NCLIPS] = {"S", "M"};

    (void)state;
    snprintf(dir, sizeof(dir), "%s/packed", tmp ? tmp : "/tmp");
    o.out_dir = dir;
    o.profiles = "S,M";
    o.count = NCLIPS;
    o.seed = 5;
    if (dh_gen_data(&o, &(struct dh_gen_stats){0}, &e))
        fail_msg("gen-data: %s", e.msg);
    assert_int_equal(dh_index_builder_create(&b, &e), 0);
    for (int i = 0; i < NCLIPS; i++) {
        snprintf(paths[i], sizeof(paths[i]), "%s/%06d_%s.mp4", dir, i,
                 names[i]);
        dh_desc_init(&d);
        if (dh_probe_file(paths[i], &d, &e))
            fail_msg("probe: %s", e.msg);
        d.id = i;
        assert_int_equal(dh_index_builder_add(b, &d, &e), 0);
        dh_desc_fini(&d);
    }
    snprintf(dhx, sizeof(dhx), "%s/m.dhx", dir);
    if (dh_index_builder_finish(b, dhx, &e))
        fail_msg("index: %s", e.msg);
    dh_index_builder_destroy(b);
    assert_int_equal(dh_index_open(dhx, 0, &ix, &e), 0);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    dh_index_close(ix);
    return 0;
}

/* fps:1 with a cap of 8, native size bounded by max_side 600, patch 28:
 * S is 392x224, M 588x336. */
static struct dh_media_plan native_plan(void)
{
    struct dh_media_plan p;

    dh_media_plan_init(&p);
    p.kind = DH_PLAN_FPS;
    p.fps = 1;
    p.frames = 8;
    p.geometry = DH_GEOM_NATIVE;
    p.width = p.height = 0;
    p.max_side = 600;
    p.patch = 28;
    return p;
}

/* Sample `id` decoded alone through the public calls, as `decode` does. */
static uint8_t *alone(struct dh_media *m, uint64_t id,
                      const struct dh_media_plan *p, struct dh_media_plan *rp,
                      int64_t *frames, size_t *len)
{
    struct dh_media_plan sp;
    struct dh_media_info info;
    struct dh_err e;
    uint8_t *buf;

    dh_batch_sample_plan(p, 0, id, &sp);
    assert_int_equal(dh_media_open(m, paths[id], &e), 0);
    assert_int_equal(dh_media_info(m, &info), 0);
    assert_int_equal(dh_media_plan_resolve(&sp, &info, rp, &e), 0);
    assert_int_equal(dh_media_select(m, rp, frames, &e), 0);
    *len = dh_media_plan_bytes(rp, *frames);
    buf = calloc(1, *len + DH_MEDIA_DST_PAD);
    assert_non_null(buf);
    assert_int_equal(
        dh_media_decode(m, rp, buf, *len + DH_MEDIA_DST_PAD, NULL, &e), 0);
    dh_media_close(m);
    return buf;
}

static void samples_back_to_back_equal_decoded_alone(void **state)
{
    struct dh_media_plan p = native_plan();
    uint64_t ids[3] = {1, 0, 1};
    struct dh_packed_entry en[3];
    size_t bound = dh_batch_packed_bound(ix, ids, 3, &p), used = 0, sum = 0;
    size_t cap = bound + DH_MEDIA_DST_PAD;
    uint8_t *dst = malloc(cap);
    struct dh_media *m;
    struct dh_err e;
    int32_t valid[3];
    uint32_t at = 99;

    (void)state;
    assert_non_null(dst);
    assert_true(bound > dh_packed_table_bytes(3) && bound != SIZE_MAX);
    assert_int_equal(dh_media_create(&m, &e), 0);
    if (dh_batch_packed_decode(m, ix, 0, ids, 3, &p, dst, cap, &used, valid,
                               &at, &e))
        fail_msg("packed: %s", e.msg);
    assert_int_equal(dh_packed_table_read(dst, used, 3, 1, en, &e), 0);
    for (int i = 0; i < 3; i++) {
        struct dh_media_plan rp;
        int64_t frames;
        size_t len;
        uint8_t *ref = alone(m, ids[i], &p, &rp, &frames, &len);

        assert_int_equal(en[i].offset, dh_packed_table_bytes(3) + sum);
        assert_int_equal(en[i].t, frames);
        assert_int_equal(en[i].h, rp.height);
        assert_int_equal(en[i].w, rp.width);
        assert_int_equal(en[i].h % 28, 0);
        assert_int_equal(en[i].w % 28, 0);
        assert_int_equal(valid[i], en[i].valid_frames);
        assert_int_equal(len,
                         dh_packed_sample_bytes(&p, en[i].t, en[i].h, en[i].w));
        assert_memory_equal(dst + en[i].offset, ref, len);
        sum += len;
        free(ref);
    }
    /* No padding: the slot's used bytes are the table and the samples. */
    assert_int_equal(used, dh_packed_table_bytes(3) + sum);
    assert_true(used <= bound);
    /* The S and M clips differ in T and in size: really variable. */
    assert_true(en[0].t != en[1].t);
    assert_true(en[0].w != en[1].w || en[0].h != en[1].h);
    dh_media_destroy(m);
    free(dst);
}

static void a_damaged_table_is_refused(void **state)
{
    struct dh_media_plan p = native_plan();
    uint64_t ids[2] = {0, 1};
    size_t cap = dh_batch_packed_bound(ix, ids, 2, &p) + DH_MEDIA_DST_PAD;
    uint8_t *dst = malloc(cap);
    struct dh_packed_entry en[2];
    struct dh_media *m;
    struct dh_err e;
    int32_t valid[2];
    size_t used;

    (void)state;
    assert_non_null(dst);
    assert_int_equal(dh_media_create(&m, &e), 0);
    assert_int_equal(dh_batch_packed_decode(m, ix, 0, ids, 2, &p, dst, cap,
                                            &used, valid, NULL, &e),
                     0);
    assert_int_equal(dh_packed_table_read(dst, used, 2, 1, en, &e), 0);
    /* Too short, another count, an offset moved, a shape grown. */
    assert_int_equal(dh_packed_table_read(dst, used - 1, 2, 1, en, &e),
                     DH_EPROTO);
    assert_int_equal(dh_packed_table_read(dst, used, 1, 1, en, &e), DH_EPROTO);
    dst[DH_PACKED_HEADER + DH_PACKED_ENTRY] ^= 1; /* entry 1's offset */
    assert_int_equal(dh_packed_table_read(dst, used, 2, 1, en, &e), DH_EPROTO);
    dst[DH_PACKED_HEADER + DH_PACKED_ENTRY] ^= 1;
    dst[DH_PACKED_HEADER + 8] = 0xff; /* entry 0's T */
    assert_int_equal(dh_packed_table_read(dst, used, 2, 1, en, &e), DH_EPROTO);
    /* A fixed-shape plan is not a packed one. */
    p.geometry = DH_GEOM_CROP;
    p.width = p.height = 32;
    assert_int_equal(dh_batch_packed_decode(m, ix, 0, ids, 2, &p, dst, cap,
                                            &used, valid, NULL, &e),
                     DH_EINVAL);
    dh_media_destroy(m);
    free(dst);
}

static void native_size_rounding(void **state)
{
    int32_t w, h;

    (void)state;
    /* Qwen-VL: 28-multiples, nearest. */
    dh_media_native_size(400, 224, 0, 0, 0, 28, &w, &h);
    assert_int_equal(w, 392);
    assert_int_equal(h, 224);
    /* Rotation swaps; max_side bounds the longer side. */
    dh_media_native_size(600, 336, 90, 300, 0, 0, &w, &h);
    assert_int_equal(w, 168);
    assert_int_equal(h, 300);
    /* max_area: below it, and the patch rounds down when nearest would
     * break it. */
    dh_media_native_size(1920, 1080, 0, 0, 602112, 28, &w, &h);
    assert_true((int64_t)w * h <= 602112);
    assert_int_equal(w % 28, 0);
    assert_int_equal(h % 28, 0);
    assert_true((int64_t)w * h > 602112 / 2);
    /* Tiny clips keep one patch; nothing gives 0 x 0. */
    dh_media_native_size(5, 3, 0, 0, 0, 28, &w, &h);
    assert_int_equal(w, 28);
    assert_int_equal(h, 28);
    dh_media_native_size(0, 3, 0, 0, 0, 28, &w, &h);
    assert_int_equal(w, 0);
    /* Without area or patch: the probe's old rule (max_side, lround). */
    dh_media_native_size(1000, 333, 0, 500, 0, 0, &w, &h);
    assert_int_equal(w, 500);
    assert_int_equal(h, 167);
}

/* The fps count the estimate uses is what the decoder selects. */
static void fps_count_is_the_decoders(void **state)
{
    struct dh_media_plan p = native_plan();
    struct dh_media_info info;
    struct dh_media *m;
    struct dh_err e;

    (void)state;
    assert_int_equal(dh_media_fps_count(43, 25, 1, 8), 2);   /* 1.72 s */
    assert_int_equal(dh_media_fps_count(100, 25, 8, 0), 32); /* 4 s */
    assert_int_equal(dh_media_fps_count(101, 25, 8, 0), 33);
    assert_int_equal(dh_media_fps_count(100, 25, 8, 10), 10);
    assert_int_equal(dh_media_fps_count(1, 25, 0.5, 0), 1);
    assert_int_equal(dh_media_fps_count(0, 25, 1, 0), 0);
    assert_int_equal(dh_media_create(&m, &e), 0);
    for (int i = 0; i < NCLIPS; i++) {
        struct dh_media_plan rp;
        int64_t frames;

        assert_int_equal(dh_media_open(m, paths[i], &e), 0);
        assert_int_equal(dh_media_info(m, &info), 0);
        assert_int_equal(dh_media_plan_resolve(&p, &info, &rp, &e), 0);
        assert_int_equal(dh_media_select(m, &rp, &frames, &e), 0);
        assert_int_equal(
            frames, dh_media_fps_count(info.frames, info.fps, p.fps, p.frames));
        dh_media_close(m);
    }
    dh_media_destroy(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(native_size_rounding),
        cmocka_unit_test(fps_count_is_the_decoders),
        cmocka_unit_test(samples_back_to_back_equal_decoded_alone),
        cmocka_unit_test(a_damaged_table_is_refused),
    };

    return cmocka_run_group_tests(tests, setup, teardown);
}
