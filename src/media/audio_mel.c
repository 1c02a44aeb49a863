/*
 * audio_mel.c - mel spectrograms of a sample's sound (issue 38 item 2),
 * computed on the DataServer beside the decode, as torchaudio's
 * MelSpectrogram and Whisper's log_mel_spectrogram compute them.
 *
 * Design notes:
 *   - One definition of each step, the one those references use: a
 *     periodic Hann window of n_fft, frames centred on t x hop with the
 *     signal reflected at both ends (torch.stft(center=True,
 *     pad_mode="reflect")), the power of a real DFT (libavutil's av_tx),
 *     triangular mel filters between f_min = 0 and rate / 2 on the HTK
 *     scale without norm (torchaudio's default) or on Slaney's scale with
 *     Slaney's area norm (librosa's, Whisper's).
 *   - The filters are sparse: each band keeps the first and last bin it
 *     covers, so a frame costs its DFT plus the bins each band spans.
 *   - Whisper: the last frame dropped, log10 of max(x, 1e-10), floored at
 *     the sample's maximum - 8, then (x + 4) / 4.
 *   - No I/O; memory is the caller's output plus O(n_fft + n_mels x bins)
 *     scratch per call.
 */
#include <math.h>
#include <string.h>

#include <libavutil/mem.h>
#include <libavutil/tx.h>

#include "core/alloc.h"
#include "datahelix/audio.h"

static double hz_to_mel(double f, int slaney)
{
    if (!slaney)
        return 2595.0 * log10(1.0 + f / 700.0);
    if (f < 1000.0)
        return f / (200.0 / 3);
    return 15.0 + log(f / 1000.0) / (log(6.4) / 27.0);
}

static double mel_to_hz(double m, int slaney)
{
    if (!slaney)
        return 700.0 * (pow(10.0, m / 2595.0) - 1.0);
    if (m < 15.0)
        return m * (200.0 / 3);
    return 1000.0 * exp(log(6.4) / 27.0 * (m - 15.0));
}

struct bands {
    float *w;     /* n_mels x n_freqs weights */
    int *lo, *hi; /* each band's nonzero bins: [lo, hi) */
    int n_freqs;
};

/* torchaudio.functional.melscale_fbanks(n_freqs, 0, rate // 2, n_mels,
 * rate, norm, scale), transposed to band-major. */
/*
 * The power spectrum of one windowed frame.  libavutil's transforms are
 * fast for lengths of 2^k (times 3, 5 or 15); Whisper's and torchaudio's
 * n_fft of 400 is not one of them (av_tx then falls back to an O(n^2)
 * DFT, 40x torch's time), so other lengths take Bluestein's algorithm: the
 * DFT of length n as a convolution with a chirp, done with power-of-two
 * FFTs of m >= 2n - 1.
 */
struct dft {
    int n, m; /* m = 0: n itself is fast (RDFT) */
    AVTXContext *fwd, *inv;
    av_tx_fn f_fwd, f_inv;
    AVComplexFloat *chirp; /* w[k] = exp(-i pi k^2 / n), k < n */
    AVComplexFloat *kern;  /* FFT of the conjugate chirp, both ways */
    AVComplexFloat *a, *b; /* m scratch each */
    float *rin;            /* m = 0: the RDFT's input (it may be clobbered) */
};

static int fast_len(int n)
{
    while (n % 2 == 0)
        n /= 2;
    return n == 1 || n == 3 || n == 5 || n == 15;
}

static void dft_free(struct dft *d)
{
    av_tx_uninit(&d->fwd);
    av_tx_uninit(&d->inv);
    av_free(d->chirp);
    av_free(d->kern);
    av_free(d->a);
    av_free(d->b);
    av_free(d->rin);
}

static int dft_init(struct dft *d, int n)
{
    float one = 1.0f;

    memset(d, 0, sizeof(*d));
    d->n = n;
    if (fast_len(n))
        return (d->rin = av_malloc(sizeof(float) * (size_t)(n + 2))) == NULL
                   ? -1
                   : av_tx_init(&d->fwd, &d->f_fwd, AV_TX_FLOAT_RDFT, 0, n,
                                &one, 0);
    /* a power of two >= 2n - 1 (measured: 1024 beats 960 = 15 x 64) */
    for (d->m = 1; d->m < 2 * n - 1; d->m *= 2)
        ;
    if (!(d->chirp = av_malloc(sizeof(AVComplexFloat) * (size_t)n)) ||
        !(d->kern = av_malloc(sizeof(AVComplexFloat) * (size_t)d->m)) ||
        !(d->a = av_malloc(sizeof(AVComplexFloat) * (size_t)d->m)) ||
        !(d->b = av_malloc(sizeof(AVComplexFloat) * (size_t)d->m)) ||
        av_tx_init(&d->fwd, &d->f_fwd, AV_TX_FLOAT_FFT, 0, d->m, &one, 0) < 0 ||
        av_tx_init(&d->inv, &d->f_inv, AV_TX_FLOAT_FFT, 1, d->m, &one, 0) < 0)
        return -1;
    for (int k = 0; k < n; k++) { /* k^2 mod 2n keeps the angle exact */
        double ang = M_PI * (double)(((int64_t)k * k) % (2 * n)) / n;

        d->chirp[k].re = (float)cos(ang);
        d->chirp[k].im = (float)-sin(ang);
    }
    memset(d->b, 0, sizeof(AVComplexFloat) * (size_t)d->m);
    for (int k = 0; k < n; k++) {
        AVComplexFloat c = {d->chirp[k].re, -d->chirp[k].im};

        d->b[k] = c;
        if (k)
            d->b[d->m - k] = c;
    }
    d->f_fwd(d->fwd, d->kern, d->b, sizeof(AVComplexFloat));
    return 0;
}

/* |X[k]|^2, k <= n / 2, of the real frames x1 and x2 (NULL: one frame)
 * into p1 and p2.  Bluestein takes both at once as one complex signal
 * x1 + i x2, whose DFT Z splits into X1[k] = (Z[k] + Z*[n-k]) / 2 and
 * X2[k] = (Z[k] - Z*[n-k]) / 2i: two frames for the price of one. */
static void dft_power(struct dft *d, const float *x1, const float *x2,
                      AVComplexFloat *spec, float *p1, float *p2)
{
    int nf = d->n / 2 + 1, n = d->n;
    float s = d->m ? 1.0f / (float)d->m : 1.0f;

    if (!d->m) {
        for (int j = 0; j < 2; j++) {
            const float *x = j ? x2 : x1;
            float *pw = j ? p2 : p1;

            if (!x)
                break;
            float ny = 0;

            memcpy(d->rin, x, sizeof(float) * (size_t)n);
            d->f_fwd(d->fwd, spec, d->rin, sizeof(float));
            /* the Nyquist bin, which libavutil 57's real DFT leaves
             * unwritten: sum of (-1)^i x[i] */
            for (int i = 0; i < n; i += 2)
                ny += x[i] - x[i + 1];
            spec[nf - 1].re = ny;
            spec[nf - 1].im = 0;
            for (int k = 0; k < nf; k++)
                pw[k] = spec[k].re * spec[k].re + spec[k].im * spec[k].im;
        }
        return;
    }
    for (int k = 0; k < n; k++) {
        float re = x1[k], im = x2 ? x2[k] : 0.0f;

        d->a[k].re = re * d->chirp[k].re - im * d->chirp[k].im;
        d->a[k].im = re * d->chirp[k].im + im * d->chirp[k].re;
    }
    memset(d->a + n, 0, sizeof(AVComplexFloat) * (size_t)(d->m - n));
    d->f_fwd(d->fwd, d->b, d->a, sizeof(AVComplexFloat));
    for (int k = 0; k < d->m; k++) {
        AVComplexFloat p = d->b[k], q = d->kern[k];

        d->b[k].re = p.re * q.re - p.im * q.im;
        d->b[k].im = p.re * q.im + p.im * q.re;
    }
    d->f_inv(d->inv, d->a, d->b, sizeof(AVComplexFloat));
    for (int k = 0; k < n; k++) {
        AVComplexFloat p = d->a[k], w = d->chirp[k];

        spec[k].re = (p.re * w.re - p.im * w.im) * s;
        spec[k].im = (p.re * w.im + p.im * w.re) * s;
    }
    for (int k = 0; k < nf; k++) {
        AVComplexFloat z = spec[k], r = spec[(n - k) % n];
        float ar = z.re + r.re, ai = z.im - r.im; /* Z[k] + Z*[n-k] */
        float br = z.re - r.re, bi = z.im + r.im; /* Z[k] - Z*[n-k] */

        p1[k] = (ar * ar + ai * ai) * 0.25f;
        if (p2)
            p2[k] = (br * br + bi * bi) * 0.25f;
    }
}

static int make_bands(const struct dh_audio_features *c, int rate,
                      struct bands *b)
{
    int nf = c->n_fft / 2 + 1, nm = c->n_mels,
        slaney = c->kind == DH_AUDIO_WHISPER;
    double f_max = (double)(rate / 2), m_max = hz_to_mel(f_max, slaney);
    double *fp = dh__malloc(sizeof(double) * (size_t)(nm + 2));

    b->n_freqs = nf;
    b->w = dh__calloc((size_t)nm * (size_t)nf, sizeof(float));
    b->lo = dh__malloc(sizeof(int) * (size_t)nm);
    b->hi = dh__malloc(sizeof(int) * (size_t)nm);
    if (!fp || !b->w || !b->lo || !b->hi) {
        dh__free(fp);
        return DH_ENOMEM;
    }
    for (int i = 0; i < nm + 2; i++)
        fp[i] = mel_to_hz(m_max * i / (nm + 1), slaney);
    for (int m = 0; m < nm; m++) {
        double enorm = slaney ? 2.0 / (fp[m + 2] - fp[m]) : 1.0;

        b->lo[m] = nf;
        b->hi[m] = 0;
        for (int k = 0; k < nf; k++) {
            double f = f_max * k / (nf - 1);
            double down = (f - fp[m]) / (fp[m + 1] - fp[m]);
            double up = (fp[m + 2] - f) / (fp[m + 2] - fp[m + 1]);
            double v = down < up ? down : up;

            if (v <= 0)
                continue;
            b->w[(size_t)m * nf + k] = (float)(v * enorm);
            if (k < b->lo[m])
                b->lo[m] = k;
            b->hi[m] = k + 1;
        }
    }
    dh__free(fp);
    return 0;
}

static void free_bands(struct bands *b)
{
    dh__free(b->w);
    dh__free(b->lo);
    dh__free(b->hi);
}

/* x[i] of the signal reflected at both ends (torch's "reflect": the edge
 * sample is not repeated). */
static float reflected(const float *x, int64_t n, int64_t i)
{
    while (i < 0 || i >= n) {
        if (i < 0)
            i = -i;
        if (i >= n)
            i = 2 * (n - 1) - i;
    }
    return x[i];
}

/* One frame's bands from its power spectrum, into out[m * stride]. */
static void mel_frame(const struct bands *b, int n_mels, const float *pw,
                      float *out, int64_t stride)
{
    for (int m = 0; m < n_mels; m++) {
        const float *w = b->w + (size_t)m * (size_t)b->n_freqs;
        float acc = 0;

        for (int k = b->lo[m]; k < b->hi[m]; k++)
            acc += w[k] * pw[k];
        out[(size_t)m * (size_t)stride] = acc;
    }
}

/* Whisper's normalisation of one channel's [n_mels, frames] in place. */
static void whisper_norm(float *out, size_t n)
{
    float top = -INFINITY;

    for (size_t i = 0; i < n; i++) {
        out[i] = log10f(out[i] > 1e-10f ? out[i] : 1e-10f);
        top = out[i] > top ? out[i] : top;
    }
    for (size_t i = 0; i < n; i++)
        out[i] = ((out[i] > top - 8.0f ? out[i] : top - 8.0f) + 4.0f) / 4.0f;
}

int dh_audio_features(const float *x, int64_t n, int rate,
                      const struct dh_audio_features *c, float *out,
                      struct dh_err *e)
{
    int64_t frames = dh_audio_feature_frames(c, n);
    int nfft = c->n_fft, nf = nfft / 2 + 1, rc;
    struct bands b = {0};
    struct dft dft = {0};
    float *win = NULL, *in = NULL, *pow2 = NULL;
    AVComplexFloat *spec = NULL;

    if ((rc = dh_audio_features_check(c, n, e)))
        return rc;
    if ((rc = make_bands(c, rate, &b)) ||
        !(win = dh__malloc(sizeof(float) * (size_t)nfft)) ||
        !(in = av_malloc(sizeof(float) * (size_t)(2 * nfft + 2))) ||
        !(spec = av_malloc(sizeof(AVComplexFloat) * (size_t)(nfft + 1))) ||
        !(pow2 = dh__malloc(sizeof(float) * (size_t)(2 * nf))) ||
        dft_init(&dft, nfft) < 0) {
        rc = dh_err_set(e, DH_ENOMEM, "audio features: out of memory");
        goto out;
    }
    for (int i = 0; i < nfft; i++) /* periodic Hann: torch.hann_window */
        win[i] = (float)(0.5 - 0.5 * cos(2.0 * M_PI * i / nfft));
    for (int64_t t = 0; t < frames; t += 2) {
        int two = t + 1 < frames;

        for (int j = 0; j <= two; j++) {
            int64_t at = (t + j) * c->hop - nfft / 2;
            float *f = in + (size_t)j * (size_t)nfft;

            for (int i = 0; i < nfft; i++)
                f[i] = win[i] * (at >= 0 && at + nfft <= n
                                     ? x[at + i]
                                     : reflected(x, n, at + i));
        }
        dft_power(&dft, in, two ? in + nfft : NULL, spec, pow2, pow2 + nf);
        for (int j = 0; j <= two; j++)
            mel_frame(&b, c->n_mels, pow2 + (size_t)j * (size_t)nf, out + t + j,
                      frames);
    }
    if (c->kind == DH_AUDIO_LOG_MEL)
        for (size_t i = 0; i < (size_t)c->n_mels * (size_t)frames; i++)
            out[i] = log10f(out[i] > 1e-10f ? out[i] : 1e-10f);
    else if (c->kind == DH_AUDIO_WHISPER)
        whisper_norm(out, (size_t)c->n_mels * (size_t)frames);
out:
    dft_free(&dft);
    free_bands(&b);
    dh__free(win);
    dh__free(pow2);
    av_free(in);
    av_free(spec);
    return rc;
}
