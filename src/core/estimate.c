/*
 * estimate.c - applies plan, token model and cost model to a descriptor.
 * Pure; no allocation.
 */
#include <math.h>
#include <string.h>

#include "datahelix/estimate.h"

void dh_estimate_features(const struct dh_estimator *est,
                          const struct dh_desc *d, int64_t frames, int32_t w,
                          int32_t h, struct dh_cost_features *f)
{
    dh_cost_features_of(d, frames, w, h, f);
    /* the sound's decode: an audio sample's, or - when the table counts
     * audio tokens, so the loaders will decode it - a clip's span */
    if (d->kind == DH_KIND_AUDIO)
        f->audio_s = d->audio_duration_s > 0 ? d->audio_duration_s : 0;
    else if (est->audio.per_s > 0 && d->kind == DH_KIND_VIDEO)
        f->audio_s = dh_audio_span_s(&est->plan, d, frames);
}

void dh_estimate(const struct dh_estimator *est, struct dh_desc *d)
{
    int64_t frames;
    int32_t w, h;
    struct dh_cost_features f;
    int64_t text_bytes = d->text ? (int64_t)strlen(d->text) : 0;

    dh_sample_plan_output(&est->plan, d, &frames, &w, &h);
    dh_profile_name(d->kind, frames, w, h, d->profile, sizeof(d->profile));
    dh_estimate_features(est, d, frames, w, h, &f);
    /* Microsecond resolution is plenty and keeps the table readable. */
    d->est_cpu_ms = round(dh_cost_model_predict(&est->cost, &f) * 1e3) / 1e3;
    if (d->kind == DH_KIND_TEXT) {
        d->est_out_bytes = d->bytes + text_bytes;
        d->est_tokens = dh_text_tokens(d->bytes + text_bytes);
        return;
    }
    if (d->kind == DH_KIND_AUDIO) { /* 16 kHz mono float32, its tokens */
        double per_s = est->audio.per_s > 0 ? est->audio.per_s
                                            : DH_AUDIO_ONLY_TOKENS_PER_S;

        d->est_out_bytes = (int64_t)ceil(d->audio_duration_s * 16000) * 4;
        d->est_tokens = (int64_t)ceil(d->audio_duration_s * per_s - 1e-9) +
                        dh_text_tokens(text_bytes);
        return;
    }
    d->est_out_bytes = frames * (int64_t)w * h * 3;
    d->est_tokens = dh_token_model_count(&est->tokens, frames, w, h) +
                    dh_text_tokens(text_bytes);
    if (est->audio.per_s > 0 && d->kind == DH_KIND_VIDEO)
        d->est_tokens += (int64_t)ceil(
            dh_audio_span_s(&est->plan, d, frames) * est->audio.per_s - 1e-9);
}

double dh_audio_span_s(const struct dh_sample_plan *p, const struct dh_desc *d,
                       int64_t frames)
{
    double span = d->duration_s > 0 ? d->duration_s : d->audio_duration_s;

    if (!d->audio_codec[0] || d->audio_duration_s <= 0)
        return 0;
    if (p->frames == 0 && p->fps > 0 && frames > 0 &&
        (double)frames / p->fps < span)
        span = (double)frames / p->fps;
    return span < d->audio_duration_s ? span : d->audio_duration_s;
}
