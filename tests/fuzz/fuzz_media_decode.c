/*
 * fuzz_media_decode.c - libFuzzer target over the media open + decode path:
 * dh_media_open_mem() on arbitrary bytes, then select and decode a tiny
 * plan (4 frames at 32x32) into a static buffer, so a hostile file can
 * only be refused, never crash, hang or leak.  One dh_media lives for the
 * whole process, as in a worker, so state carried from one input to the
 * next is fuzzed too.  The plan alternates with the input's size between
 * uniform/crop/uint8 and indices/stretch/float/TCHW to reach both scalers.
 * Corpus: tests/fuzz/corpus/fuzz_media_decode/ (tiny real clips + broken
 * ones); ctest replays it (fuzz_media_decode_replay).
 */
#include <stdint.h>
#include <stdlib.h>

#include "datahelix/media.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define OUT_W 32
#define OUT_H 32
#define OUT_T 4

static unsigned char out[OUT_T * OUT_W * OUT_H * 3 * 4 + DH_MEDIA_DST_PAD];
static const int64_t idx[OUT_T] = {0, 1, 5, 9};

static void plan_for(struct dh_media_plan *p, size_t size)
{
    dh_media_plan_init(p);
    p->frames = OUT_T;
    p->width = OUT_W;
    p->height = OUT_H;
    if (size & 1) {
        p->kind = DH_PLAN_INDICES;
        p->indices = idx;
        p->geometry = DH_GEOM_STRETCH;
        p->layout = DH_LAYOUT_TCHW;
        p->dtype = DH_DTYPE_F32;
        p->pad = DH_PAD_ZERO;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static struct dh_media *m;
    struct dh_media_plan p;
    struct dh_media_result res;
    struct dh_err e;
    int64_t frames;

    if (!m && dh_media_create(&m, &e) != 0)
        abort(); /* cannot fuzz without one */
    plan_for(&p, size);
    if (dh_media_open_mem(m, data, size, "fuzz.bin", &e) != 0)
        return 0;
    if (dh_media_select(m, &p, &frames, &e) == 0 && frames <= OUT_T &&
        dh_media_plan_bytes(&p, frames) + DH_MEDIA_DST_PAD <= sizeof(out))
        (void)!dh_media_decode(m, &p, out, sizeof(out), &res, &e);
    dh_media_close(m);
    return 0;
}
