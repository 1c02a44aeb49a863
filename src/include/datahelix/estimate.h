/*
 * datahelix/estimate.h - what a sample will cost, decided while it is still
 * a descriptor (paper Sec. 2.1, 3.3, 4.5): the sampling plan's output shape,
 * the planning profile bucket, visual-token counts per model family, and the
 * CPU-cost model T_cpu = base + a*src_Mpx + b*input_MB + c*out_Mpx whose
 * coefficients `datahelix probe --calibrate` fits by really decoding files.
 *
 * Pure logic: no I/O, no allocation.  All functions are thread-safe.
 */
#ifndef DATAHELIX_ESTIMATE_H
#define DATAHELIX_ESTIMATE_H

#include <stddef.h>
#include <stdint.h>

#include "datahelix/error.h"
#include "datahelix/table.h"

/* ---- sampling plan (what the loader will produce from a sample) ---- */
struct dh_sample_plan {
    int64_t frames;     /* fixed frame count; 0 = derive from fps */
    double fps;         /* with frames == 0: round(duration * fps) frames;
                           0 = every source frame */
    int64_t max_frames; /* cap on derived counts; 0 = none */
    int32_t width;      /* output size; 0 x 0 = native (after rotation) */
    int32_t height;
    int32_t max_side; /* native only: shrink so the longer side <= this;
                           0 = none */
    int64_t max_area; /* native only: a frame's width x height <= this */
    int32_t patch;    /* native only: each side a multiple of this */
};

/* Defaults: frames "fps:8", max_frames 256, size "native", max_side 0.  At
 * 8 fps the paper's Kinetics mix (2 s 224p, 4 s 336p, 8 s 448p clips) gives
 * its 16x224 / 32x336 / 64x448 profiles. */
void dh_sample_plan_default(struct dh_sample_plan *p);

/* "16" (fixed count), "fps:F" or "all".  0 or DH_EINVAL with a message. */
int dh_sample_plan_parse_frames(const char *spec, struct dh_sample_plan *p,
                                struct dh_err *e) DH_MUST_CHECK;
/* "WxH" or "native".  0 or DH_EINVAL with a message. */
int dh_sample_plan_parse_size(const char *spec, struct dh_sample_plan *p,
                              struct dh_err *e) DH_MUST_CHECK;
/* Writes the plan back in the spec syntax above (for the table header). */
void dh_sample_plan_format_frames(const struct dh_sample_plan *p, char *buf,
                                  size_t len);
void dh_sample_plan_format_size(const struct dh_sample_plan *p, char *buf,
                                size_t len);

/* Output frames and size of `d` under `p`.  Images give 1 frame, text 0. */
void dh_sample_plan_output(const struct dh_sample_plan *p,
                           const struct dh_desc *d, int64_t *frames,
                           int32_t *width, int32_t *height);

/* Profile bucket "FxS": F = frames rounded to the nearest power of two (in
 * log space), S = the short side rounded to the nearest rung of
 * 144/224/336/448/576/720/1080/1440/2160.  Text gives "text". */
void dh_profile_name(enum dh_kind kind, int64_t frames, int32_t width,
                     int32_t height, char *buf, size_t len);

/* ---- visual-token models ---- */
enum dh_token_family {
    DH_TOKENS_QWEN_VL,  /* 2x28x28 (14 px patches merged 2x2), sides rounded
                           to multiples of 28 like Qwen2-VL's resize */
    DH_TOKENS_VIDEOMAE, /* 2x16x16 tubelets */
    DH_TOKENS_DIT,      /* causal VAE 4x8x8, then 2x2 patches */
    DH_TOKENS_PATCH,    /* patch=P,tpatch=T: ceil(T/t)*ceil(H/P)*ceil(W/P) */
};

struct dh_token_model {
    enum dh_token_family family;
    int32_t patch;  /* spatial pixels per token side (after the VAE) */
    int32_t tpatch; /* frames per token (after the VAE) */
    char name[32];
};

/* "qwen-vl", "videomae", "dit" or "patch=P,tpatch=T" (tpatch optional,
 * default 1).  0 or DH_EINVAL with a message listing the choices. */
int dh_token_model_parse(const char *spec, struct dh_token_model *m,
                         struct dh_err *e) DH_MUST_CHECK;

/* Visual tokens for `frames` frames of width x height (0 if any is <= 0). */
int64_t dh_token_model_count(const struct dh_token_model *m, int64_t frames,
                             int32_t width, int32_t height);

/* Text tokens: ceil(bytes / 4), the usual BPE rule of thumb. */
int64_t dh_text_tokens(int64_t bytes);

/* ---- audio tokens (issue 38) ----
 * A model's audio tokens per second of sound: "whisper" (50: 20 ms
 * frames), "qwen-audio" (25: Whisper's encoder pooled 2x), a number > 0
 * (at most 10000), or "none" (0).  0 or DH_EINVAL naming the choices. */
struct dh_audio_tokens {
    double per_s; /* 0: audio not counted */
    char name[32];
};
/* An audio-only sample's tokens a second when no model was named: its
 * sound is all it has, so it is counted anyway, at Whisper's rate. */
#define DH_AUDIO_ONLY_TOKENS_PER_S 50.0
int dh_audio_tokens_parse(const char *spec, struct dh_audio_tokens *t,
                          struct dh_err *e) DH_MUST_CHECK;
/* Seconds of a video's sound that `frames` sampled frames under plan `p`
 * cover: the clip for a fixed count or every frame, the frames' window
 * (frames / F) with "fps:F"; never more than the audio stream's own
 * length; 0 without sound. */
double dh_audio_span_s(const struct dh_sample_plan *p, const struct dh_desc *d,
                       int64_t frames);

/* ---- CPU-cost model ---- */
struct dh_cost_features {
    double src_mpx; /* source pixels the decoder must produce, millions */
    double in_mb;   /* compressed input, MB (1e6 bytes) */
    double out_mpx; /* output pixels written by the scaler, millions */
    double audio_s; /* seconds of sound decoded and resampled */
};

struct dh_cost_model {
    double base_ms;
    double ms_per_src_mpx;
    double ms_per_in_mb;
    double ms_per_out_mpx;
    double ms_per_audio_s; /* measured (make bench-audio), not fitted */
    int calibrated;        /* 1 when fitted by --calibrate */
    int64_t fit_samples;   /* decodes the fit used */
    double fit_rmse_ms;
};

/* Coefficients measured on libx264 clips on a 2-core x86-64 machine. */
void dh_cost_model_default(struct dh_cost_model *m);

void dh_cost_features_of(const struct dh_desc *d, int64_t out_frames,
                         int32_t out_w, int32_t out_h,
                         struct dh_cost_features *f);

double dh_cost_model_predict(const struct dh_cost_model *m,
                             const struct dh_cost_features *f);

/*
 * Least-squares fit of the model to n measured (features, ms) pairs with
 * every coefficient kept >= 0 (a feature whose coefficient would go negative
 * is dropped and the rest refitted).  Needs n >= 2.  On success writes *out
 * (calibrated = 1; its ms_per_audio_s, which frames cannot fit, is kept:
 * *out must hold a model, e.g. dh_cost_model_default's); on error *out is
 * untouched.
 */
int dh_cost_model_fit(const struct dh_cost_features *f, const double *ms,
                      size_t n, struct dh_cost_model *out,
                      struct dh_err *e) DH_MUST_CHECK;

/* ---- everything probe estimates for one descriptor ---- */
struct dh_estimator {
    struct dh_sample_plan plan;
    struct dh_token_model tokens;
    struct dh_cost_model cost;
    struct dh_audio_tokens audio; /* zeroed: sound not counted */
};

/* Fills d->profile, est_cpu_ms, est_out_bytes and est_tokens (visual tokens
 * plus text tokens of the caption, plus the audio tokens of the sound the
 * sampled frames cover when est->audio.per_s > 0). */
void dh_estimate(const struct dh_estimator *est, struct dh_desc *d);
/* The cost model's features of `d` sampled to frames x w x h under `est`:
 * dh_cost_features_of() plus the seconds of sound the loaders decode (an
 * audio sample's length; a clip's span when est counts audio tokens). */
void dh_estimate_features(const struct dh_estimator *est,
                          const struct dh_desc *d, int64_t frames, int32_t w,
                          int32_t h, struct dh_cost_features *f);

#endif
