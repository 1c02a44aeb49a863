/*
 * sample_plan.c - the sampling plan's output shape and the profile bucket
 * (Algorithm 1's BucketByProfile keys on frame count x resolution).
 * Pure; no allocation.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "datahelix/estimate.h"
#include "datahelix/media.h"

#define PLAN_MAX_FRAMES 1000000
#define PLAN_MAX_SIDE 16384

void dh_sample_plan_default(struct dh_sample_plan *p)
{
    memset(p, 0, sizeof(*p));
    p->fps = 8.0;
    p->max_frames = 256;
}

static int parse_pos_double(const char *s, double hi, double *out)
{
    char *end;
    double v = strtod(s, &end);

    if (end == s || *end || !isfinite(v) || v <= 0 || v > hi)
        return -1;
    *out = v;
    return 0;
}

static int parse_pos_int(const char *s, char stop, long hi, long *out,
                         const char **rest)
{
    char *end;
    long v;

    if (*s < '0' || *s > '9')
        return -1;
    v = strtol(s, &end, 10);
    if (*end != stop || v <= 0 || v > hi)
        return -1;
    *out = v;
    if (rest)
        *rest = end;
    return 0;
}

int dh_sample_plan_parse_frames(const char *spec, struct dh_sample_plan *p,
                                struct dh_err *e)
{
    long n;
    double fps;

    if (!strcmp(spec, "all")) {
        p->frames = 0;
        p->fps = 0;
        return 0;
    }
    if (!strncmp(spec, "fps:", 4)) {
        if (parse_pos_double(spec + 4, 1000.0, &fps))
            goto bad;
        p->frames = 0;
        p->fps = fps;
        return 0;
    }
    if (parse_pos_int(spec, '\0', PLAN_MAX_FRAMES, &n, NULL))
        goto bad;
    p->frames = n;
    return 0;
bad:
    return dh_err_set(e, DH_EINVAL,
                      "frames '%s': expected a count (16), fps:F (fps:8) "
                      "or all",
                      spec);
}

int dh_sample_plan_parse_size(const char *spec, struct dh_sample_plan *p,
                              struct dh_err *e)
{
    long w, h;
    const char *rest;

    if (!strcmp(spec, "native")) {
        p->width = p->height = 0;
        return 0;
    }
    if (parse_pos_int(spec, 'x', PLAN_MAX_SIDE, &w, &rest) ||
        parse_pos_int(rest + 1, '\0', PLAN_MAX_SIDE, &h, NULL))
        return dh_err_set(e, DH_EINVAL,
                          "size '%s': expected WxH (224x224) or native", spec);
    p->width = (int32_t)w;
    p->height = (int32_t)h;
    return 0;
}

void dh_sample_plan_format_frames(const struct dh_sample_plan *p, char *buf,
                                  size_t len)
{
    if (p->frames > 0)
        snprintf(buf, len, "%lld", (long long)p->frames);
    else if (p->fps > 0)
        snprintf(buf, len, "fps:%g", p->fps);
    else
        snprintf(buf, len, "all");
}

void dh_sample_plan_format_size(const struct dh_sample_plan *p, char *buf,
                                size_t len)
{
    if (p->width > 0 && p->height > 0)
        snprintf(buf, len, "%dx%d", p->width, p->height);
    else
        snprintf(buf, len, "native");
}

static int64_t plan_frames(const struct dh_sample_plan *p,
                           const struct dh_desc *d)
{
    int64_t n;

    if (p->frames > 0)
        return p->frames; /* short clips repeat or pad to the count */
    if (p->fps > 0 && d->frames > 0 && d->fps > 0)
        n = dh_media_fps_count(d->frames, d->fps, p->fps,
                               p->max_frames > 0 ? p->max_frames
                                                 : PLAN_MAX_FRAMES);
    else if (p->fps > 0 && d->duration_s > 0)
        n = (int64_t)llround(d->duration_s * p->fps);
    else
        n = d->frames;
    if (d->frames > 0 && n > d->frames)
        n = d->frames; /* cannot sample more frames than exist */
    if (n < 1)
        n = 1;
    if (p->fps > 0 && p->max_frames > 0 && n > p->max_frames)
        n = p->max_frames; /* the cap is on fps-derived counts, not "all" */
    return n;
}

/* The decoder's own rule (dh_media_native_size): the estimate of a native
 * sample is the size a native plan of the same bounds decodes it at. */
static void native_size(const struct dh_sample_plan *p, const struct dh_desc *d,
                        int32_t *w, int32_t *h)
{
    dh_media_native_size(d->width, d->height, d->rotation, p->max_side,
                         p->max_area, p->patch, w, h);
}

/* Estimates describe what the media pipeline can produce: at most
 * DH_MEDIA_MAX_FRAMES frames, sides of at most 16,384 (aspect kept), and
 * DH_MEDIA_MAX_PIXELS per sample.  A header's claim past that (a damaged
 * or hostile size) must not weigh in the plan as millions of tokens. */
static void clamp_to_decodable(int64_t *frames, int32_t *w, int32_t *h)
{
    int32_t longer = *w > *h ? *w : *h;
    int64_t px;

    if (longer > PLAN_MAX_SIDE) {
        double s = (double)PLAN_MAX_SIDE / longer;
        *w = (int32_t)fmax(1, floor(*w * s));
        *h = (int32_t)fmax(1, floor(*h * s));
    }
    if (*frames > DH_MEDIA_MAX_FRAMES)
        *frames = DH_MEDIA_MAX_FRAMES;
    px = (int64_t)*w * *h;
    if (px > 0 && *frames * px > DH_MEDIA_MAX_PIXELS)
        *frames = DH_MEDIA_MAX_PIXELS / px > 0 ? DH_MEDIA_MAX_PIXELS / px : 1;
}

void dh_sample_plan_output(const struct dh_sample_plan *p,
                           const struct dh_desc *d, int64_t *frames,
                           int32_t *width, int32_t *height)
{
    if (d->kind == DH_KIND_TEXT || d->kind == DH_KIND_AUDIO) {
        *frames = 0;
        *width = *height = 0;
        return;
    }
    *frames = d->kind == DH_KIND_IMAGE ? 1 : plan_frames(p, d);
    if (p->width > 0 && p->height > 0) {
        *width = p->width;
        *height = p->height;
    } else {
        native_size(p, d, width, height);
    }
    clamp_to_decodable(frames, width, height);
}

static int64_t nearest_pow2(int64_t n)
{
    int64_t lo = 1;

    if (n <= 1)
        return 1;
    while (lo * 2 <= n)
        lo *= 2;
    /* Nearest in log space: n >= lo*sqrt(2) rounds up. */
    return (double)n >= (double)lo * M_SQRT2 ? lo * 2 : lo;
}

static int32_t nearest_rung(int32_t side)
{
    static const int32_t rungs[] = {144, 224,  336,  448, 576,
                                    720, 1080, 1440, 2160};
    size_t n = sizeof(rungs) / sizeof(rungs[0]);
    int32_t best = rungs[0];
    double bestd = INFINITY;

    if (side <= 0)
        return 0;
    for (size_t i = 0; i < n; i++) {
        double dist = fabs(log((double)side / rungs[i]));
        if (dist < bestd) {
            bestd = dist;
            best = rungs[i];
        }
    }
    return best;
}

void dh_profile_name(enum dh_kind kind, int64_t frames, int32_t width,
                     int32_t height, char *buf, size_t len)
{
    int32_t shorter = width < height ? width : height;

    if (kind == DH_KIND_TEXT || kind == DH_KIND_AUDIO) {
        snprintf(buf, len, kind == DH_KIND_TEXT ? "text" : "audio");
        return;
    }
    snprintf(buf, len, "%lldx%d", (long long)nearest_pow2(frames),
             nearest_rung(shorter));
}
