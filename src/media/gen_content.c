/*
 * gen_content.c - deterministic synthetic video frames, drawn in YUV420P.
 *
 * Design: a frame is a pure function of (width, height, frame, seed), so a
 * generated set is byte-identical across runs.  The scene has three layers,
 * chosen so that a real decoder does realistic work (motion everywhere, no
 * static background for the encoder to skip):
 *   1. a procedural texture (sums of waves plus a checker) seen through a
 *      camera that rotates and scrolls every frame;
 *   2. 3-6 boxes with striped fills bouncing off the frame edges;
 *   3. light luma noise, a hash of (x, y, frame, seed).
 * Only integer arithmetic is used (no libm), so output does not depend on
 * the platform's floating point: texture coordinates are 16.16 fixed point
 * in uint32 (wrap-around is defined and the waves are periodic in 2^16),
 * and sine is a parabola.  Cost: a table lookup or three and a hash per
 * pixel, small beside the encoder.
 *
 * The optional frame stamp (dh__gen_stamp_draw) is a separate layer the
 * encoder draws last, so clips made without it are unchanged.
 *
 * Locking: none; no shared state.
 */
#include "media/gen_content.h"

#include <stddef.h>
#include "core/hash.h"

#define MAX_BOXES 6

struct box {
    int w, h;        /* size in luma pixels (even) */
    int x0, y0;      /* start phase along each bounce path */
    int vx, vy;      /* pixels per frame */
    uint8_t y, u, v; /* fill colour */
};

struct scene {
    int16_t wave[256];  /* one period of a sine-like wave, -128..128 */
    uint32_t angle0;    /* camera angle at frame 0, 1/1024 turn */
    int32_t spin;       /* camera angle step per frame, 1/1024 turn */
    uint32_t su, sv;    /* scroll per frame, 16.16 texture pixels */
    uint32_t noise_key; /* per-seed noise salt */
    int nbox;
    struct box box[MAX_BOXES];
};

/* Camera for one frame: texture coords of pixel (0,0) and per-pixel steps. */
struct camera {
    uint32_t u0, v0;   /* texture coordinate of pixel (0, 0) */
    uint32_t dux, dvx; /* step for x + 1 */
    uint32_t duy, dvy; /* step for y + 1 */
};

/* Parabolic sine of p/1024 of a turn, in 16.16 (-65536..65536). */
static int32_t isin(uint32_t p)
{
    int32_t q = (int32_t)(p & 511);
    int32_t s = q * (512 - q); /* 0..65536, peak at q = 256 */

    return (p & 512) ? -s : s;
}

static uint8_t clamp_u8(int v, int lo, int hi)
{
    return (uint8_t)(v < lo ? lo : v > hi ? hi : v);
}

static void box_init(struct box *b, uint64_t r, int w, int h)
{
    b->w = (w / 10 + (int)(r % (uint64_t)(w / 6 + 1))) & ~1;
    b->h = (h / 10 + (int)((r >> 12) % (uint64_t)(h / 5 + 1))) & ~1;
    b->w = b->w < 2 ? 2 : b->w;
    b->h = b->h < 2 ? 2 : b->h;
    b->x0 = (int)((r >> 20) % (uint64_t)(2 * w));
    b->y0 = (int)((r >> 32) % (uint64_t)(2 * h));
    b->vx = 1 + (int)((r >> 44) % 6);
    b->vy = 1 + (int)((r >> 48) % 4);
    b->y = (uint8_t)(40 + (r >> 52) % 180);
    b->u = (uint8_t)(40 + (r >> 40) % 176);
    b->v = (uint8_t)(40 + (r >> 28) % 176);
}

static void scene_init(struct scene *s, int w, int h, uint64_t seed)
{
    uint64_t r = dh__mix64(seed ^ 0x67656E2D64617461ull); /* "gen-data" */

    for (uint32_t i = 0; i < 256; i++)
        s->wave[i] = (int16_t)(isin(i * 4) / 512);
    s->angle0 = (uint32_t)(r & 1023);
    s->spin = (int32_t)(1 + ((r >> 10) % 3)) * ((r >> 12) & 1 ? 1 : -1);
    s->su = (uint32_t)(0x8000 + (r >> 16) % (3u << 16));
    s->sv = (uint32_t)(0x4000 + (r >> 34) % (2u << 16));
    s->noise_key = (uint32_t)(r >> 32);
    r = dh__mix64(r);
    s->nbox = 3 + (int)(r % 4);
    for (int k = 0; k < s->nbox; k++)
        box_init(&s->box[k], dh__mix64(r + (uint64_t)k + 1), w, h);
}

/* The camera rotates about the frame centre and scrolls with time. */
static void camera_at(struct camera *c, const struct scene *s, int w, int h,
                      int64_t t)
{
    uint32_t a = (uint32_t)(s->angle0 + (uint64_t)(s->spin * t)) & 1023;
    uint32_t co = (uint32_t)isin(a + 256), si = (uint32_t)isin(a);
    uint32_t cx = (uint32_t)(w / 2), cy = (uint32_t)(h / 2);

    c->dux = co;
    c->dvx = si;
    c->duy = 0u - si;
    c->dvy = co;
    c->u0 = (uint32_t)((uint64_t)t * s->su) - cx * c->dux - cy * c->duy;
    c->v0 = (uint32_t)((uint64_t)t * s->sv) - cx * c->dvx - cy * c->dvy;
}

static int noise(uint32_t x, uint32_t y, uint32_t key)
{
    uint32_t n = x * 0x9E3779B1u ^ y * 0x85EBCA77u ^ key;

    n ^= n >> 15;
    n *= 0x2C1B3C6Du;
    n ^= n >> 12;
    return (int)(n >> 29) - 4; /* -4..3 */
}

static uint8_t texture_luma(const struct scene *s, uint32_t u, uint32_t v)
{
    uint32_t iu = u >> 16, iv = v >> 16;
    int a = s->wave[(iu * 3 / 4) & 255];
    int b = s->wave[(iv + iu / 2) & 255];
    int d = s->wave[(iu * 7 + iv * 5) & 255];
    int chk = ((iu ^ iv) >> 5) & 1 ? 18 : -18;

    return (uint8_t)(126 + (a + b) * 9 / 32 + d / 8 + chk);
}

static void draw_luma(const struct dh__gen_planes *pl, const struct scene *s,
                      const struct camera *c, int64_t t)
{
    uint32_t key = s->noise_key ^ (uint32_t)dh__mix64((uint64_t)t);

    for (int y = 0; y < pl->height; y++) {
        uint8_t *row = pl->data[0] + (ptrdiff_t)y * pl->linesize[0];
        uint32_t u = c->u0 + (uint32_t)y * c->duy;
        uint32_t v = c->v0 + (uint32_t)y * c->dvy;

        for (int x = 0; x < pl->width; x++) {
            int px = texture_luma(s, u, v) +
                     noise((uint32_t)x, (uint32_t)y, key);
            row[x] = clamp_u8(px, 16, 235);
            u += c->dux;
            v += c->dvx;
        }
    }
}

/* Chroma drifts slowly in hue along the texture, sampled every 2 pixels. */
static void draw_chroma(const struct dh__gen_planes *pl, const struct scene *s,
                        const struct camera *c, int64_t t)
{
    int cw = (pl->width + 1) / 2, ch = (pl->height + 1) / 2;
    uint32_t ph = (uint32_t)t;

    for (int y = 0; y < ch; y++) {
        uint8_t *ru = pl->data[1] + (ptrdiff_t)y * pl->linesize[1];
        uint8_t *rv = pl->data[2] + (ptrdiff_t)y * pl->linesize[2];
        uint32_t u = c->u0 + 2u * (uint32_t)y * c->duy;
        uint32_t v = c->v0 + 2u * (uint32_t)y * c->dvy;

        for (int x = 0; x < cw; x++) {
            uint32_t iu = u >> 16, iv = v >> 16;

            ru[x] = (uint8_t)(128 + s->wave[(iu / 2 + ph) & 255] * 28 / 128);
            rv[x] = (uint8_t)(128 +
                              s->wave[(iv / 2 + 64 - 2 * ph) & 255] * 28 / 128);
            u += 2u * c->dux;
            v += 2u * c->dvx;
        }
    }
}

/* Position along a path bouncing between 0 and `range` (a triangle wave). */
static int bounce(int64_t start, int64_t speed, int64_t t, int range)
{
    int64_t p;

    if (range <= 0)
        return 0;
    p = (start + speed * t) % (2 * (int64_t)range);
    return (int)(p < range ? p : 2 * range - p);
}

static void fill_rect(uint8_t *plane, int stride, int x0, int y0, int w, int h,
                      uint8_t val)
{
    for (int y = y0; y < y0 + h; y++) {
        uint8_t *row = plane + (ptrdiff_t)y * stride;

        for (int x = x0; x < x0 + w; x++)
            row[x] = val;
    }
}

/* Diagonal stripes that move with the box, so its inside has edges too. */
static void stripe_luma(const struct dh__gen_planes *pl, const struct box *b,
                        int bx, int by, int w, int h)
{
    for (int y = 0; y < h; y++) {
        uint8_t *row = pl->data[0] + (ptrdiff_t)(by + y) * pl->linesize[0];

        for (int x = 0; x < w; x++)
            row[bx + x] = (uint8_t)(b->y + ((((x + y) >> 3) & 1) ? 12 : -12));
    }
}

static void draw_box(const struct dh__gen_planes *pl, const struct box *b,
                     int64_t t)
{
    int w = b->w < pl->width ? b->w : pl->width & ~1;
    int h = b->h < pl->height ? b->h : pl->height & ~1;
    int bx = bounce(b->x0, b->vx, t, pl->width - w) & ~1;
    int by = bounce(b->y0, b->vy, t, pl->height - h) & ~1;

    if (w <= 0 || h <= 0)
        return;
    stripe_luma(pl, b, bx, by, w, h);
    fill_rect(pl->data[1], pl->linesize[1], bx / 2, by / 2, w / 2, h / 2, b->u);
    fill_rect(pl->data[2], pl->linesize[2], bx / 2, by / 2, w / 2, h / 2, b->v);
}

void dh__gen_content_fill(const struct dh__gen_planes *pl, int64_t frame,
                          uint64_t seed)
{
    struct scene s;
    struct camera c;

    scene_init(&s, pl->width, pl->height, seed);
    camera_at(&c, &s, pl->width, pl->height, frame);
    draw_luma(pl, &s, &c, frame);
    draw_chroma(pl, &s, &c, frame);
    for (int k = 0; k < s.nbox; k++)
        draw_box(pl, &s.box[k], frame);
}

/* Block k of the stamp row: 0 and BITS + 1 are markers, 1..BITS the bits. */
static uint8_t stamp_luma(int k, int64_t frame)
{
    int bit;

    if (k == 0 || k == DH__GEN_STAMP_BITS + 1)
        return 235;
    bit = DH__GEN_STAMP_BITS - k; /* most significant first */
    return ((uint64_t)frame >> bit) & 1 ? 235 : 16;
}

/* fill_rect() clipped to a w x h plane. */
static void fill_clipped(uint8_t *plane, int stride, int pw, int ph, int x0,
                         int y0, int w, int h, uint8_t val)
{
    int x1 = x0 + w > pw ? pw : x0 + w, y1 = y0 + h > ph ? ph : y0 + h;

    x0 = x0 < 0 ? 0 : x0;
    y0 = y0 < 0 ? 0 : y0;
    if (x1 > x0 && y1 > y0)
        fill_rect(plane, stride, x0, y0, x1 - x0, y1 - y0, val);
}

void dh__gen_stamp_draw(const struct dh__gen_planes *pl, int64_t frame)
{
    const int b = DH__GEN_STAMP_BLOCK, y0 = DH__GEN_STAMP_Y;
    int cw = (pl->width + 1) / 2, ch = (pl->height + 1) / 2;
    /* Even, so every block covers whole chroma samples. */
    int x0 = ((pl->width - DH__GEN_STAMP_W) / 2) & ~1;

    for (int k = 0; k < DH__GEN_STAMP_BITS + 2; k++) {
        int x = x0 + k * b;

        fill_clipped(pl->data[0], pl->linesize[0], pl->width, pl->height, x, y0,
                     b, b, stamp_luma(k, frame));
        fill_clipped(pl->data[1], pl->linesize[1], cw, ch, x / 2, y0 / 2, b / 2,
                     b / 2, 128);
        fill_clipped(pl->data[2], pl->linesize[2], cw, ch, x / 2, y0 / 2, b / 2,
                     b / 2, 128);
    }
}
