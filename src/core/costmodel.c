/*
 * costmodel.c - the C_cpu term of Eq. 1 before any feedback: a linear model
 * of decode + scale cost in source pixels, input bytes and output pixels,
 * with a non-negative least-squares fit for `probe --calibrate`.
 * Pure; no allocation (the fit works on a fixed 4x4 system).
 */
#include <math.h>
#include <string.h>

#include "datahelix/estimate.h"

#define NF 4 /* base, src_mpx, in_mb, out_mpx */

void dh_cost_model_default(struct dh_cost_model *m)
{
    memset(m, 0, sizeof(*m));
    /* `datahelix probe --calibrate 4 demo-data/videos ../shared/data/videos`
     * on the reference 2-core machine: the media pipeline running the
     * default plan (8 fps, native size) on 39 clips of H.264, HEVC, VP8/9,
     * AV1 and MPEG-4; rmse about 28 ms, two runs averaged.  Compressed
     * bytes carry most of the signal: entropy decoding scales with them. */
    m->base_ms = 0.5;
    m->ms_per_src_mpx = 1.5;
    m->ms_per_in_mb = 100.0;
    m->ms_per_out_mpx = 0.0;
    /* `make bench-audio`: a 5 s window decoded and resampled to 16 kHz in
     * 7.4 ms (median over AAC, MP3, Vorbis, Opus, FLAC, WAV) */
    m->ms_per_audio_s = 1.5;
}

void dh_cost_features_of(const struct dh_desc *d, int64_t out_frames,
                         int32_t out_w, int32_t out_h,
                         struct dh_cost_features *f)
{
    /* A sampled decode still decodes every frame of each GOP it touches, so
     * the whole clip is the honest upper bound the scheduler plans with. */
    int64_t src_frames = d->kind == DH_KIND_IMAGE ? 1 : d->frames;

    memset(f, 0, sizeof(*f));
    if (d->kind == DH_KIND_TEXT || d->kind == DH_KIND_AUDIO) {
        f->in_mb = (double)d->bytes / 1e6; /* sound: its bytes decoded */
        return;
    }
    f->src_mpx = (double)src_frames * d->width * d->height / 1e6;
    f->in_mb = (double)d->bytes / 1e6;
    f->out_mpx = (double)out_frames * out_w * out_h / 1e6;
}

static void feature_row(const struct dh_cost_features *f, double x[NF])
{
    x[0] = 1.0;
    x[1] = f->src_mpx;
    x[2] = f->in_mb;
    x[3] = f->out_mpx;
}

double dh_cost_model_predict(const struct dh_cost_model *m,
                             const struct dh_cost_features *f)
{
    return m->base_ms + m->ms_per_src_mpx * f->src_mpx +
           m->ms_per_in_mb * f->in_mb + m->ms_per_out_mpx * f->out_mpx +
           m->ms_per_audio_s * f->audio_s;
}

/* Solves a (k x k) system in place by Gaussian elimination with partial
 * pivoting; returns -1 when singular. */
static int solve(double a[NF][NF], double b[NF], int k)
{
    for (int c = 0; c < k; c++) {
        int piv = c;
        for (int r = c + 1; r < k; r++)
            if (fabs(a[r][c]) > fabs(a[piv][c]))
                piv = r;
        if (fabs(a[piv][c]) < 1e-12)
            return -1;
        for (int j = 0; j < k; j++) {
            double t = a[c][j];
            a[c][j] = a[piv][j];
            a[piv][j] = t;
        }
        double tb = b[c];
        b[c] = b[piv];
        b[piv] = tb;
        for (int r = c + 1; r < k; r++) {
            double f = a[r][c] / a[c][c];
            for (int j = c; j < k; j++)
                a[r][j] -= f * a[c][j];
            b[r] -= f * b[c];
        }
    }
    for (int c = k - 1; c >= 0; c--) {
        for (int j = c + 1; j < k; j++)
            b[c] -= a[c][j] * b[j];
        b[c] /= a[c][c];
    }
    return 0;
}

/* Least squares over the active features, on RMS-normalised columns with a
 * tiny ridge so that collinear features (pixels and bytes move together)
 * cannot make the system singular. */
static int fit_active(const struct dh_cost_features *f, const double *ms,
                      size_t n, const int active[NF], double coef[NF])
{
    int idx[NF] = {0}, k = 0;
    double scale[NF] = {0}, a[NF][NF] = {{0}}, b[NF] = {0}, x[NF];

    for (int j = 0; j < NF; j++)
        if (active[j])
            idx[k++] = j;
    for (size_t i = 0; i < n; i++) {
        feature_row(&f[i], x);
        for (int j = 0; j < NF; j++)
            scale[j] += x[j] * x[j];
    }
    for (int j = 0; j < NF; j++)
        scale[j] = scale[j] > 0 ? sqrt(scale[j] / (double)n) : 1.0;
    for (size_t i = 0; i < n; i++) {
        feature_row(&f[i], x);
        for (int p = 0; p < k; p++) {
            double xp = x[idx[p]] / scale[idx[p]];
            b[p] += xp * ms[i];
            for (int q = 0; q < k; q++)
                a[p][q] += xp * x[idx[q]] / scale[idx[q]];
        }
    }
    for (int p = 0; p < k; p++)
        a[p][p] += 1e-6 * (double)n;
    if (solve(a, b, k))
        return -1;
    memset(coef, 0, sizeof(double) * NF);
    for (int p = 0; p < k; p++)
        coef[idx[p]] = b[p] / scale[idx[p]];
    return 0;
}

static double rmse(const struct dh_cost_features *f, const double *ms, size_t n,
                   const struct dh_cost_model *m)
{
    double s = 0;

    for (size_t i = 0; i < n; i++) {
        double d = dh_cost_model_predict(m, &f[i]) - ms[i];
        s += d * d;
    }
    return sqrt(s / (double)n);
}

int dh_cost_model_fit(const struct dh_cost_features *f, const double *ms,
                      size_t n, struct dh_cost_model *out, struct dh_err *e)
{
    int active[NF] = {1, 1, 1, 1};
    double coef[NF];
    struct dh_cost_model m;

    if (n < 2)
        return dh_err_set(e, DH_EINVAL,
                          "cost model fit needs at least 2 measurements, "
                          "got %zu",
                          n);
    for (size_t i = 0; i < n; i++)
        if (!isfinite(ms[i]) || ms[i] < 0)
            return dh_err_set(e, DH_EINVAL,
                              "measurement %zu is not a "
                              "finite non-negative time",
                              i);
    for (int round = 0; round < NF; round++) {
        int worst = -1;
        if (fit_active(f, ms, n, active, coef))
            return dh_err_set(e, DH_EINVAL, "cost model fit is singular");
        for (int j = 0; j < NF; j++)
            if (active[j] && coef[j] < 0 &&
                (worst < 0 || coef[j] < coef[worst]))
                worst = j;
        if (worst < 0)
            break;
        active[worst] = 0; /* a negative cost has no meaning: drop, refit */
        coef[worst] = 0;
    }
    memset(&m, 0, sizeof(m));
    m.base_ms = coef[0] > 0 ? coef[0] : 0;
    m.ms_per_src_mpx = coef[1] > 0 ? coef[1] : 0;
    m.ms_per_in_mb = coef[2] > 0 ? coef[2] : 0;
    m.ms_per_out_mpx = coef[3] > 0 ? coef[3] : 0;
    /* the calibration decodes frames only: the sound keeps its measure */
    m.ms_per_audio_s = out->ms_per_audio_s;
    m.calibrated = 1;
    m.fit_samples = (int64_t)n;
    m.fit_rmse_ms = rmse(f, ms, n, &m);
    *out = m;
    return 0;
}
