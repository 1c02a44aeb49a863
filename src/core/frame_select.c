/*
 * frame_select.c - which source frames a sampling plan takes, and snapping
 * planned frames to cheap-to-decode ones (see frame_select.h).
 *
 * Design: pure; no I/O, no allocation, no globals.  Out-params other than
 * the `out` array are written only on success.
 *  - UNIFORM is TSN's test-time sampling: the clip cut into N equal
 *    segments, the middle frame of each, in integer math so that no float
 *    rounding moves an index.
 *  - FPS samples times k / fps and takes the nearest frame by presentation
 *    time (binary search over pts, ties to the earlier frame), so variable
 *    frame rate clips are sampled in time, not in frame count.
 *  - JITTER draws a stride and an offset from SplitMix64(seed) (a local
 *    copy: src/core does not include src/media), unbiased by rejection.
 *  - Snapping is greedy in target order and keeps the output ascending by
 *    bounding each target's candidates between the previous output and the
 *    next target (see snap_one()).
 */
#include <inttypes.h>
#include <math.h>
#include <stdint.h>

#include "core/frame_select.h"
#include "core/hash.h"

#define MAXF DH_MEDIA_MAX_FRAMES

/* ---- random numbers (SplitMix64, Steele et al. 2014) ---- */

/* Uniform in [0, m), m >= 1, without modulo bias. */
static uint64_t rand_below(uint64_t *s, uint64_t m)
{
    uint64_t lim = (0 - m) % m; /* 2^64 mod m: drop the short last lap */
    uint64_t r;

    do
        r = dh__splitmix64(s);
    while (r < lim);
    return r % m;
}

/* ---- shared pieces ---- */

/* out[valid..count) as padding: the last valid index, or -1. */
static void pad_out(int64_t *out, int64_t valid, int64_t count, enum dh_pad pad)
{
    int64_t v = pad == DH_PAD_ZERO ? -1 : out[valid - 1];

    for (int64_t i = valid; i < count; i++)
        out[i] = v;
}

/* A clip shorter than the plan: every frame, then padding. */
static void short_clip(const struct dh_media_plan *p, int64_t n, int64_t *out,
                       int64_t *count, int64_t *valid)
{
    for (int64_t i = 0; i < n; i++)
        out[i] = i;
    pad_out(out, n, p->frames, p->pad);
    *count = p->frames;
    *valid = n;
}

static int check_plan(const struct dh_media_plan *p,
                      const struct dh__clip_frames *c, struct dh_err *e)
{
    if (c->n < 1)
        return dh_err_set(e, DH_EINVAL, "plan: the clip has no frames");
    switch (p->kind) {
    case DH_PLAN_ALL:
        return 0;
    case DH_PLAN_FPS:
        if (!(p->fps > 0) || !isfinite(p->fps))
            return dh_err_set(e, DH_EINVAL,
                              "plan: fps %g must be positive "
                              "and finite",
                              p->fps);
        if (p->frames < 0 || p->frames > MAXF)
            return dh_err_set(e, DH_EINVAL,
                              "plan: frame cap %" PRId64 " out of range 0..%d",
                              p->frames, MAXF);
        return 0;
    case DH_PLAN_UNIFORM:
    case DH_PLAN_INDICES:
    case DH_PLAN_JITTER:
        if (p->frames < 1 || p->frames > MAXF)
            return dh_err_set(e, DH_EINVAL,
                              "plan: frames %" PRId64 " out of range 1..%d",
                              p->frames, MAXF);
        if (p->kind == DH_PLAN_INDICES && !p->indices)
            return dh_err_set(e, DH_EINVAL,
                              "plan: an index plan has no "
                              "indices");
        return 0;
    }
    return dh_err_set(e, DH_EINVAL, "plan: kind %d is not a plan kind",
                      (int)p->kind);
}

/* ---- UNIFORM ---- */

/*
 * floor((2i + 1) n / 2N) without overflow: with n = q 2N + r it is
 * (2i + 1) q + floor((2i + 1) r / 2N), and (2i + 1) r < (2 MAXF)^2.
 */
static void plan_uniform(const struct dh_media_plan *p, int64_t n, int64_t *out,
                         int64_t *count, int64_t *valid, double *stride)
{
    int64_t big_n = p->frames, q = n / (2 * big_n), r = n % (2 * big_n);

    if (n < big_n) {
        short_clip(p, n, out, count, valid);
        *stride = 1;
        return;
    }
    for (int64_t i = 0; i < big_n; i++)
        out[i] = (2 * i + 1) * q + (2 * i + 1) * r / (2 * big_n);
    *count = *valid = big_n;
    *stride = (double)n / (double)big_n;
}

/* ---- FPS ---- */

/*
 * Positions are in "clip units": pts units from pts[0] with a pts table,
 * frame numbers without.  Sample times and the duration are converted to
 * the same units so that frame positions stay exact integers.
 */
struct fps_walk {
    const struct dh__clip_frames *c;
    double fps;   /* the plan's sampling rate */
    double dur_u; /* clip duration, clip units */
    double dur_s; /* clip duration, seconds */
};

static double frame_pos(const struct dh__clip_frames *c, int64_t i)
{
    return c->pts ? (double)(c->pts[i] - c->pts[0]) : (double)i;
}

/* Time k / fps in clip units. */
static double sample_pos(const struct fps_walk *w, int64_t k)
{
    if (w->c->pts)
        return (double)k / (w->fps * w->c->time_base);
    return (double)k * w->c->fps / w->fps;
}

/* The frame nearest to clip position u (ties: the earlier frame). */
static int64_t nearest_frame(const struct dh__clip_frames *c, double u)
{
    int64_t lo = 0, hi = c->n; /* first i with pos(i) >= u, in [lo, hi] */

    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (frame_pos(c, mid) >= u)
            hi = mid;
        else
            lo = mid + 1;
    }
    if (lo == c->n)
        return c->n - 1;
    if (lo > 0 && u - frame_pos(c, lo - 1) <= frame_pos(c, lo) - u)
        return lo - 1;
    return lo;
}

/* Duration = last frame's start + one frame (the mean gap, or 1 / fps). */
static int fps_walk_init(struct fps_walk *w, const struct dh_media_plan *p,
                         const struct dh__clip_frames *c, struct dh_err *e)
{
    w->c = c;
    w->fps = p->fps;
    if (!c->pts) {
        if (!(c->fps > 0) || !isfinite(c->fps))
            return dh_err_set(e, DH_EINVAL,
                              "plan: the clip has neither "
                              "timestamps nor a frame rate");
        w->dur_u = (double)c->n;
        w->dur_s = (double)c->n / c->fps;
        return 0;
    }
    if (!(c->time_base > 0) || !isfinite(c->time_base))
        return dh_err_set(e, DH_EINVAL,
                          "plan: time base %g must be "
                          "positive",
                          c->time_base);
    double span = frame_pos(c, c->n - 1);
    if (c->n > 1)
        w->dur_u = span + span / (double)(c->n - 1);
    else if (c->fps > 0 && isfinite(c->fps))
        w->dur_u = 1.0 / (c->fps * c->time_base);
    else
        w->dur_u = 0; /* nothing to go by: one frame below */
    w->dur_s = w->dur_u * c->time_base;
    return 0;
}

static int plan_fps(const struct dh_media_plan *p,
                    const struct dh__clip_frames *c, int64_t *out,
                    int64_t *count, double *stride, struct dh_err *e)
{
    struct fps_walk w = {0};
    int64_t cap = p->frames > 0 ? p->frames : MAXF, k;
    int rc = fps_walk_init(&w, p, c, e);

    if (rc < 0)
        return rc;
    for (k = 0; k < cap; k++) {
        double u = sample_pos(&w, k);
        if (!(u < w.dur_u))
            break;
        out[k] = nearest_frame(c, u);
    }
    if (p->frames == 0 && k == cap && sample_pos(&w, k) < w.dur_u)
        return dh_err_set(e, DH_EINVAL,
                          "plan: fps %g over a %.1f s clip "
                          "asks for %.0f frames, over the %d limit; set a "
                          "frame cap",
                          p->fps, w.dur_s, ceil(w.dur_s * p->fps), MAXF);
    if (k == 0)
        out[k++] = 0; /* at least one frame */
    *count = k;
    *stride = w.dur_s > 0 ? (double)c->n / (w.dur_s * p->fps) : 1;
    return 0;
}

/* ---- INDICES ---- */

static int plan_indices(const struct dh_media_plan *p, int64_t n, int64_t *out,
                        double *stride, struct dh_err *e)
{
    double gaps = 0;

    for (int64_t i = 0; i < p->frames; i++) {
        int64_t v = p->indices[i];
        if (v < 0 || v >= n)
            return dh_err_set(e, DH_EINVAL,
                              "plan: frame index %" PRId64
                              " out of range (the clip has %" PRId64 " frames)",
                              v, n);
    }
    for (int64_t i = 0; i < p->frames; i++) {
        out[i] = p->indices[i];
        if (i > 0)
            gaps += fabs((double)out[i] - (double)out[i - 1]);
    }
    *stride = p->frames > 1 ? gaps / (double)(p->frames - 1) : 1;
    return 0;
}

/* ---- JITTER ---- */

static void plan_jitter(const struct dh_media_plan *p, int64_t n, int64_t *out,
                        int64_t *count, int64_t *valid, double *stride)
{
    int64_t big_n = p->frames, s, off;
    uint64_t rng = p->seed;

    if (n <= big_n) {
        short_clip(p, n, out, count, valid);
        *stride = 1;
        return;
    }
    if (big_n == 1) {
        out[0] = (int64_t)rand_below(&rng, (uint64_t)n);
        *count = *valid = 1;
        *stride = (double)n; /* as UNIFORM with one frame */
        return;
    }
    s = 1 + (int64_t)rand_below(&rng, (uint64_t)((n - 1) / (big_n - 1)));
    off = (int64_t)rand_below(&rng, (uint64_t)(n - (big_n - 1) * s));
    for (int64_t i = 0; i < big_n; i++)
        out[i] = off + i * s;
    *count = *valid = big_n;
    *stride = (double)s;
}

/* ---- ALL ---- */

static void plan_all(int64_t n, int64_t *out, int64_t *count)
{
    int64_t t = n < MAXF ? n : MAXF;

    for (int64_t i = 0; i < t; i++)
        out[i] = i;
    *count = t;
}

int dh__frames_plan(const struct dh_media_plan *p,
                    const struct dh__clip_frames *c, int64_t *out,
                    int64_t *count, int64_t *valid, double *stride,
                    struct dh_err *e)
{
    int64_t t = 0, v = 0;
    double st = 1;
    int rc = check_plan(p, c, e);

    if (rc < 0)
        return rc;
    switch (p->kind) {
    case DH_PLAN_UNIFORM:
        plan_uniform(p, c->n, out, &t, &v, &st);
        break;
    case DH_PLAN_FPS:
        rc = plan_fps(p, c, out, &t, &st, e);
        v = t;
        break;
    case DH_PLAN_INDICES:
        rc = plan_indices(p, c->n, out, &st, e);
        t = v = p->frames;
        break;
    case DH_PLAN_JITTER:
        plan_jitter(p, c->n, out, &t, &v, &st);
        break;
    case DH_PLAN_ALL:
        plan_all(c->n, out, &t);
        v = t;
        break;
    }
    if (rc < 0)
        return rc;
    *count = t;
    *valid = v;
    *stride = st;
    return 0;
}

/* ---- snapping ---- */

/* First i in [0, n) with a[i] > v, or n. */
static int64_t first_gt(const int64_t *a, int64_t n, int64_t v)
{
    int64_t lo = 0, hi = n;

    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (a[mid] > v)
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

/* First i in [0, n) with a[i] >= x (compared as doubles), or n. */
static int64_t first_ge(const int64_t *a, int64_t n, double x)
{
    int64_t lo = 0, hi = n;

    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if ((double)a[mid] >= x)
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

struct snap_bounds {
    int has_lo; /* candidates must be > lo (the previous output) */
    int64_t lo;
    int has_hi; /* ... and <= hi, or < hi when hi_strict */
    int64_t hi;
    int hi_strict;
};

static int under_hi(const struct snap_bounds *b, int64_t c)
{
    if (!b->has_hi)
        return 1;
    return b->hi_strict ? c < b->hi : c <= b->hi;
}

/*
 * The nearest candidate to t within tol and the bounds (ties: the
 * earlier), or t itself when none.  The allowed candidates form one
 * contiguous run of cand[]; its nearest member to t is the last one below
 * t or the first one at or above it.  (A candidate below t meets the upper
 * bounds whenever the targets are ascending; checked anyway.)
 */
static int64_t snap_one(int64_t t, const int64_t *cand, int64_t ncand,
                        double tol, const struct snap_bounds *b)
{
    int64_t i0 = first_ge(cand, ncand, (double)t - tol), r;

    if (b->has_lo) {
        int64_t g = first_gt(cand, ncand, b->lo);
        i0 = g > i0 ? g : i0;
    }
    r = first_ge(cand, ncand, (double)t);
    r = r > i0 ? r : i0;
    int right_ok = r < ncand && (double)cand[r] <= (double)t + tol &&
                   under_hi(b, cand[r]);
    int left_ok = r - 1 >= i0 && under_hi(b, cand[r - 1]);
    if (left_ok && (!right_ok || t - cand[r - 1] <= cand[r] - t))
        return cand[r - 1];
    return right_ok ? cand[r] : t;
}

/*
 * Target j may not move past target j + 1's planned index (which it keeps
 * when it finds no candidate): strictly before it when the targets differ,
 * at most onto it when they are equal (FPS plans repeat frames).  It must
 * land after the previous output, which also keeps candidates unreused.
 */
double dh__frames_snap(int64_t *idx, int64_t valid, const int64_t *cand,
                       int64_t ncand, double tol)
{
    struct snap_bounds b = {0};
    double sum = 0;

    if (valid <= 0)
        return 0;
    for (int64_t j = 0; j < valid; j++) {
        int64_t old = idx[j];
        b.has_hi = j + 1 < valid;
        if (b.has_hi) {
            b.hi = idx[j + 1];
            b.hi_strict = idx[j + 1] != old;
        }
        if (ncand > 0)
            idx[j] = snap_one(old, cand, ncand, tol, &b);
        sum += fabs((double)idx[j] - (double)old);
        b.has_lo = 1;
        b.lo = idx[j];
    }
    return sum / (double)valid;
}
