/*
 * calibrate.c - the measured decode behind `probe --calibrate`: the real
 * media pipeline (media.h) running the probe's sampling plan, timed in
 * thread CPU time so that a noisy shared machine does not skew the fit.
 * So est_cpu_ms predicts what a DataServer worker will actually spend.
 *
 * Thread-safety: reentrant; every call owns its dh_media.
 */
#include <string.h>
#include <time.h>

#include "core/alloc.h"
#include "datahelix/estimate.h"
#include "datahelix/media.h"
#include "datahelix/probe.h"

static double thread_cpu_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* The probe's plan (frames N | fps:F | all, size WxH | native) in the
 * pipeline's terms: a fixed size is the loader's default crop, native size
 * is the picture as displayed. */
static void media_plan_of(const struct dh_sample_plan *sp,
                          const struct dh_desc *d, struct dh_media_plan *mp)
{
    int64_t frames;
    int32_t w, h;

    dh_media_plan_init(mp);
    /* It times the table's own plan, whatever that costs: the per-sample
     * cap is for training workers, not for the fit. */
    mp->max_pixels = INT64_MAX;
    dh_sample_plan_output(sp, d, &frames, &w, &h);
    if (sp->frames > 0) {
        mp->kind = DH_PLAN_UNIFORM;
        mp->frames = sp->frames < DH_MEDIA_MAX_FRAMES ? sp->frames
                                                      : DH_MEDIA_MAX_FRAMES;
    } else if (sp->fps > 0) {
        mp->kind = DH_PLAN_FPS;
        mp->fps = sp->fps;
        mp->frames = sp->max_frames > 0 && sp->max_frames < DH_MEDIA_MAX_FRAMES
                         ? sp->max_frames
                         : DH_MEDIA_MAX_FRAMES;
    } else {
        mp->kind = DH_PLAN_ALL;
    }
    mp->width = w;
    mp->height = h;
    mp->geometry = sp->width > 0 ? DH_GEOM_CROP : DH_GEOM_STRETCH;
}

int dh_calibrate_decode(const struct dh_desc *d,
                        const struct dh_sample_plan *plan, double *cpu_ms,
                        struct dh_err *e)
{
    struct dh_media *m = NULL;
    struct dh_source_ref ref;
    struct dh_media_plan mp;
    uint8_t *buf = NULL;
    int64_t frames;
    size_t len;
    double t0;
    int rc;

    media_plan_of(plan, d, &mp);
    if ((rc = dh_media_create(&m, e)))
        return rc;
    t0 = thread_cpu_ms();
    dh_desc_source(d, &ref);
    rc = dh_media_open_ref(m, &ref, e);
    if (!rc)
        rc = dh_media_select(m, &mp, &frames, e);
    if (!rc) {
        len = dh_media_plan_bytes(&mp, frames) + DH_MEDIA_DST_PAD;
        buf = dh__malloc(len);
        rc = buf ? dh_media_decode(m, &mp, buf, len, NULL, e)
                 : dh_err_set(e, DH_ENOMEM, "%s: out of memory", d->path);
    }
    if (!rc)
        *cpu_ms = thread_cpu_ms() - t0;
    dh__free(buf);
    dh_media_destroy(m);
    return rc;
}
