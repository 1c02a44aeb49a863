/*
 * media_plan.c - defaults, validation and output size of a media sampling
 * plan (struct dh_media_plan, see datahelix/media.h).
 *
 * Design: pure; no I/O, no allocation, no globals.  dh_media_plan_check()
 * looks at the plan alone (sizes, counts, enums, normalisation); what
 * depends on the clip (an index past its end, an fps plan that would ask
 * for too many frames) is checked by dh__frames_plan() in frame_select.c.
 * dh_media_plan_bytes() saturates at SIZE_MAX instead of wrapping, so a
 * caller comparing it against a buffer length fails safe.
 * dh_media_native_size() is the one rounding rule of native-size plans:
 * the decoder (via dh_media_plan_resolve) and the token estimate
 * (sample_plan.c) both call it, so what the planner balances is what is
 * decoded.
 */
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "datahelix/audio.h"
#include "datahelix/media.h"

#define DIM_MAX 16384

void dh_media_plan_init(struct dh_media_plan *p)
{
    static const float mean[3] = {0.485f, 0.456f, 0.406f};
    static const float std[3] = {0.229f, 0.224f, 0.225f};

    memset(p, 0, sizeof(*p));
    p->kind = DH_PLAN_UNIFORM;
    p->frames = 16;
    p->fps = 0;
    p->indices = NULL;
    p->seed = 0;
    p->pad = DH_PAD_REPEAT;
    p->width = 224;
    p->height = 224;
    p->geometry = DH_GEOM_CROP;
    p->layout = DH_LAYOUT_THWC;
    p->dtype = DH_DTYPE_U8;
    memcpy(p->mean, mean, sizeof(mean));
    memcpy(p->std, std, sizeof(std));
    p->snap = DH_SNAP_EXACT;
    p->snap_tol = 0;
}

/* A native plan's bounds; its width / height are not used. */
static int check_native(const struct dh_media_plan *p, struct dh_err *e)
{
    if (p->max_side < 0 || p->max_side > DIM_MAX)
        return dh_err_set(e, DH_EINVAL,
                          "plan: max_side %" PRId32 " out of range 0..%d",
                          p->max_side, DIM_MAX);
    if (p->max_area < 0 || p->max_area > DH_MEDIA_MAX_PIXELS)
        return dh_err_set(e, DH_EINVAL,
                          "plan: max_area %" PRId64 " out of range 0..%" PRId64,
                          p->max_area, DH_MEDIA_MAX_PIXELS);
    if (p->patch < 0 || p->patch > DH_MEDIA_MAX_PATCH)
        return dh_err_set(e, DH_EINVAL,
                          "plan: patch %" PRId32 " out of range 0..%d",
                          p->patch, DH_MEDIA_MAX_PATCH);
    return 0;
}

static int check_dims(const struct dh_media_plan *p, struct dh_err *e)
{
    if (p->geometry == DH_GEOM_NATIVE)
        return check_native(p, e);
    if (p->width < 1 || p->width > DIM_MAX)
        return dh_err_set(e, DH_EINVAL,
                          "plan: width %" PRId32 " out of range 1..%d",
                          p->width, DIM_MAX);
    if (p->height < 1 || p->height > DIM_MAX)
        return dh_err_set(e, DH_EINVAL,
                          "plan: height %" PRId32 " out of range 1..%d",
                          p->height, DIM_MAX);
    return 0;
}

/* One enum field against its last valid value (all start at 0). */
static int check_enum(int v, int max, const char *what, struct dh_err *e)
{
    if (v < 0 || v > max)
        return dh_err_set(e, DH_EINVAL, "plan: %s %d is not a valid %s", what,
                          v, what);
    return 0;
}

static int check_enums(const struct dh_media_plan *p, struct dh_err *e)
{
    int rc;

    if ((rc = check_enum((int)p->kind, DH_PLAN_ALL, "kind", e)) < 0 ||
        (rc = check_enum((int)p->pad, DH_PAD_ZERO, "pad", e)) < 0 ||
        (rc = check_enum((int)p->geometry, DH_GEOM_NATIVE, "geometry", e)) <
            0 ||
        (rc = check_enum((int)p->layout, DH_LAYOUT_TCHW, "layout", e)) < 0 ||
        (rc = check_enum((int)p->dtype, DH_DTYPE_F32, "dtype", e)) < 0 ||
        (rc = check_enum((int)p->snap, DH_SNAP_KEY, "snap", e)) < 0)
        return rc;
    return 0;
}

/* `frames` (and fps / indices) as the plan kind needs them. */
static int check_counts(const struct dh_media_plan *p, struct dh_err *e)
{
    switch (p->kind) {
    case DH_PLAN_ALL:
        return 0; /* `frames` is not used */
    case DH_PLAN_FPS:
        if (!(p->fps > 0) || !isfinite(p->fps))
            return dh_err_set(e, DH_EINVAL,
                              "plan: fps %g must be positive "
                              "and finite",
                              p->fps);
        if (p->frames < 0 || p->frames > DH_MEDIA_MAX_FRAMES)
            return dh_err_set(e, DH_EINVAL,
                              "plan: frames %" PRId64
                              " out of range 0..%d (0: no cap)",
                              p->frames, DH_MEDIA_MAX_FRAMES);
        return 0;
    default:
        break;
    }
    if (p->frames < 1 || p->frames > DH_MEDIA_MAX_FRAMES)
        return dh_err_set(e, DH_EINVAL,
                          "plan: frames %" PRId64 " out of range 1..%d",
                          p->frames, DH_MEDIA_MAX_FRAMES);
    if (p->kind == DH_PLAN_INDICES && !p->indices)
        return dh_err_set(e, DH_EINVAL,
                          "plan: an index plan of %" PRId64
                          " frames has no indices",
                          p->frames);
    return 0;
}

/* Normalisation only matters for float output. */
static int check_norm(const struct dh_media_plan *p, struct dh_err *e)
{
    if (p->dtype != DH_DTYPE_F32)
        return 0;
    for (int i = 0; i < 3; i++) {
        if (!isfinite(p->mean[i]))
            return dh_err_set(e, DH_EINVAL,
                              "plan: mean[%d] %g is not "
                              "finite",
                              i, (double)p->mean[i]);
        if (!(p->std[i] > 0) || !isfinite(p->std[i]))
            return dh_err_set(e, DH_EINVAL,
                              "plan: std[%d] %g must be "
                              "positive and finite",
                              i, (double)p->std[i]);
    }
    return 0;
}

int dh_media_plan_check_pixels(const struct dh_media_plan *p, int64_t frames,
                               struct dh_err *e)
{
    int64_t cap = p->max_pixels > 0 ? p->max_pixels : DH_MEDIA_MAX_PIXELS;
    /* frames <= 4096 and each side <= 16384: no overflow in int64. */
    int64_t px = frames * (int64_t)p->width * p->height;

    if (px <= cap)
        return 0;
    return dh_err_set(e, DH_ETOOBIG,
                      "plan: %" PRId64 " frames of %" PRId32 "x%" PRId32
                      " are %" PRId64 " pixels, over the cap of %" PRId64
                      " per sample (ask for fewer frames or a smaller "
                      "size, or raise max_pixels / --max-pixels)",
                      frames, p->width, p->height, px, cap);
}

/* Plans whose frame count does not depend on the clip (uniform, jitter,
 * indices) are held to the pixel cap now; the others when
 * dh_media_select() knows the count. */
static int check_fixed_pixels(const struct dh_media_plan *p, struct dh_err *e)
{
    if (p->max_pixels < 0)
        return dh_err_set(e, DH_EINVAL,
                          "plan: max_pixels %" PRId64 " is negative",
                          p->max_pixels);
    /* An fps plan's `frames` is a cap, not its count; a native plan's
     * size is the file's (held to the cap once resolved). */
    if (p->kind == DH_PLAN_ALL || p->kind == DH_PLAN_FPS ||
        p->geometry == DH_GEOM_NATIVE)
        return 0;
    return dh_media_plan_check_pixels(p, p->frames, e);
}

/* Sound in batches: off (rate 0), or rate, channels and row length in
 * range; not yet with packed (native-size) batches. */
static int check_audio(const struct dh_media_plan *p, struct dh_err *e)
{
    if (p->audio_crop < DH_AUDIO_CROP_START ||
        p->audio_crop > DH_AUDIO_CROP_RANDOM ||
        (p->audio_crop && p->audio_rate == 0))
        return dh_err_set(e, DH_EINVAL,
                          "plan: audio_crop %" PRId32 " (0..2, with sound)",
                          p->audio_crop);
    if (p->audio_rate == 0)
        return p->audio_feature
                   ? dh_err_set(e, DH_EINVAL,
                                "plan: audio features without sound")
                   : 0;
    if (p->audio_rate < DH_AUDIO_MIN_RATE || p->audio_rate > DH_AUDIO_MAX_RATE)
        return dh_err_set(e, DH_EINVAL,
                          "plan: audio_rate %" PRId32 " out of range %d..%d Hz",
                          p->audio_rate, DH_AUDIO_MIN_RATE, DH_AUDIO_MAX_RATE);
    if (p->audio_channels < 1 || p->audio_channels > 2)
        return dh_err_set(e, DH_EINVAL,
                          "plan: audio_channels %" PRId32 " (1 or 2)",
                          p->audio_channels);
    if (p->audio_samples < 1 || p->audio_samples > DH_AUDIO_MAX_ROW)
        return dh_err_set(e, DH_EINVAL,
                          "plan: audio_samples %" PRId64 " out of range "
                          "1..%" PRId64,
                          p->audio_samples, DH_AUDIO_MAX_ROW);
    if (p->geometry == DH_GEOM_NATIVE)
        return dh_err_set(e, DH_ENOTIMPL,
                          "plan: audio in packed (native-size) batches is "
                          "not implemented yet; use a fixed size");
    return dh_audio_features_check(
        &(struct dh_audio_features){.kind = p->audio_feature,
                                    .n_fft = p->audio_n_fft,
                                    .hop = p->audio_hop,
                                    .n_mels = p->audio_mels},
        p->audio_samples, e);
}

int dh_media_plan_check(const struct dh_media_plan *p, struct dh_err *e)
{
    int rc;

    if (!p)
        return dh_err_set(e, DH_EINVAL, "plan: NULL plan");
    if ((rc = check_enums(p, e)) < 0 || (rc = check_dims(p, e)) < 0 ||
        (rc = check_counts(p, e)) < 0 || (rc = check_norm(p, e)) < 0 ||
        (rc = check_fixed_pixels(p, e)) < 0)
        return rc;
    if (!isfinite(p->snap_tol))
        return dh_err_set(e, DH_EINVAL, "plan: snap_tol %g is not finite",
                          p->snap_tol);
    return check_audio(p, e);
}

/* *acc *= v, saturating at SIZE_MAX; returns 0 once saturated. */
static int mul_sat(size_t *acc, uint64_t v)
{
#if SIZE_MAX < UINT64_MAX
    if (v > SIZE_MAX) {
        *acc = SIZE_MAX;
        return 0;
    }
#endif
    if (v != 0 && *acc > SIZE_MAX / (size_t)v) {
        *acc = SIZE_MAX;
        return 0;
    }
    *acc *= (size_t)v;
    return 1;
}

size_t dh_media_plan_bytes(const struct dh_media_plan *p, int64_t frames)
{
    size_t n = 1;

    if (frames <= 0 || p->width <= 0 || p->height <= 0)
        return 0;
    if (!mul_sat(&n, (uint64_t)frames) || !mul_sat(&n, (uint64_t)p->width) ||
        !mul_sat(&n, (uint64_t)p->height) || !mul_sat(&n, 3) ||
        !mul_sat(&n, p->dtype == DH_DTYPE_F32 ? 4 : 1))
        return SIZE_MAX;
    return n;
}

/* Step 1 of dh_media_native_size: the longer side down to max_side. */
static void bound_side(int64_t *w, int64_t *h, int32_t max_side)
{
    int64_t longer = *w > *h ? *w : *h;
    double s;

    if (max_side <= 0 || longer <= max_side)
        return;
    s = (double)max_side / (double)longer;
    *w = llround((double)*w * s);
    *h = llround((double)*h * s);
}

/* Step 2: the area down to max_area, each side rounded down. */
static void bound_area(int64_t *w, int64_t *h, int64_t max_area)
{
    double s;

    if (max_area <= 0 || *w * *h <= max_area)
        return;
    s = sqrt((double)max_area / ((double)*w * (double)*h));
    *w = (int64_t)floor((double)*w * s);
    *h = (int64_t)floor((double)*h * s);
    /* sqrt's rounding may leave the product one ulp over: trim. */
    while (*w > 1 && *h > 1 && *w * *h > max_area) {
        if (*w >= *h)
            (*w)--;
        else
            (*h)--;
    }
}

static int64_t max64(int64_t a, int64_t b)
{
    return a > b ? a : b;
}

static int within(int64_t w, int64_t h, int32_t max_side, int64_t max_area)
{
    return (max_side <= 0 || (w <= max_side && h <= max_side)) &&
           (max_area <= 0 || w * h <= max_area);
}

/* Step 3: each side to a multiple of `patch`. */
static void round_patch(int64_t *w, int64_t *h, int32_t patch, int32_t max_side,
                        int64_t max_area)
{
    int64_t q = patch, rw, rh;

    if (patch <= 1)
        return;
    rw = max64(1, (*w + q / 2) / q) * q;
    rh = max64(1, (*h + q / 2) / q) * q;
    if (!within(rw, rh, max_side, max_area)) {
        rw = max64(1, *w / q) * q;
        rh = max64(1, *h / q) * q;
    }
    *w = rw;
    *h = rh;
}

void dh_media_native_size(int32_t width, int32_t height, int32_t rotation,
                          int32_t max_side, int64_t max_area, int32_t patch,
                          int32_t *out_w, int32_t *out_h)
{
    int64_t w = width, h = height;

    if (rotation == 90 || rotation == 270) {
        w = height;
        h = width;
    }
    if (w <= 0 || h <= 0) {
        *out_w = *out_h = 0;
        return;
    }
    bound_side(&w, &h, max_side);
    bound_area(&w, &h, max_area);
    w = max64(1, w);
    h = max64(1, h);
    round_patch(&w, &h, patch, max_side, max_area);
    /* Over 16,384 is the caller's to refuse (dh_media_plan_check) or clamp
     * with the aspect kept (the probe's estimate). */
    *out_w = (int32_t)(w > INT32_MAX ? INT32_MAX : w);
    *out_h = (int32_t)(h > INT32_MAX ? INT32_MAX : h);
}

int dh_media_plan_resolve(const struct dh_media_plan *p,
                          const struct dh_media_info *info,
                          struct dh_media_plan *out, struct dh_err *e)
{
    struct dh_media_plan r = *p;
    int rc;

    if (p->geometry == DH_GEOM_NATIVE) {
        dh_media_native_size(info->width, info->height, info->rotation,
                             p->max_side, p->max_area, p->patch, &r.width,
                             &r.height);
        r.geometry = DH_GEOM_STRETCH;
    }
    if ((rc = dh_media_plan_check(&r, e)))
        return rc;
    *out = r;
    return 0;
}

int64_t dh_media_fps_count(int64_t frames, double clip_fps, double fps,
                           int64_t cap)
{
    int64_t k = 0;

    if (frames <= 0 || !(clip_fps > 0) || !(fps > 0))
        return 0;
    if (cap <= 0 || cap > DH_MEDIA_MAX_FRAMES)
        cap = DH_MEDIA_MAX_FRAMES;
    /* The same expression as frame_select.c's sample_pos(), so the same
     * doubles decide. */
    while (k < cap && (double)k * clip_fps / fps < (double)frames)
        k++;
    return k > 0 ? k : 1;
}
