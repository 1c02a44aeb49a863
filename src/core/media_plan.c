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
 */
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

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

static int check_dims(const struct dh_media_plan *p, struct dh_err *e)
{
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
        (rc = check_enum((int)p->geometry, DH_GEOM_RANDOM_CROP, "geometry",
                         e)) < 0 ||
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
    /* An fps plan's `frames` is a cap, not its count. */
    if (p->kind == DH_PLAN_ALL || p->kind == DH_PLAN_FPS)
        return 0;
    return dh_media_plan_check_pixels(p, p->frames, e);
}

int dh_media_plan_check(const struct dh_media_plan *p, struct dh_err *e)
{
    int rc;

    if (!p)
        return dh_err_set(e, DH_EINVAL, "plan: NULL plan");
    if ((rc = check_dims(p, e)) < 0 || (rc = check_enums(p, e)) < 0 ||
        (rc = check_counts(p, e)) < 0 || (rc = check_norm(p, e)) < 0 ||
        (rc = check_fixed_pixels(p, e)) < 0)
        return rc;
    if (!isfinite(p->snap_tol))
        return dh_err_set(e, DH_EINVAL, "plan: snap_tol %g is not finite",
                          p->snap_tol);
    return 0;
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
