/*
 * audio_features.c - the shape and the checks of a sound's spectrogram
 * features (audio.h), apart from their computation (media/audio_mel.c):
 * the plan checks and the batch layout use them without FFmpeg.
 */
#include "datahelix/audio.h"

int64_t dh_audio_feature_frames(const struct dh_audio_features *c,
                                int64_t samples)
{
    if (c->kind == DH_AUDIO_NO_FEATURES || c->hop < 1 || samples < 1)
        return 0;
    return samples / c->hop + (c->kind == DH_AUDIO_WHISPER ? 0 : 1);
}

int dh_audio_features_check(const struct dh_audio_features *c, int64_t samples,
                            struct dh_err *e)
{
    if (c->kind == DH_AUDIO_NO_FEATURES)
        return 0;
    if (c->kind < DH_AUDIO_MEL || c->kind > DH_AUDIO_WHISPER)
        return dh_err_set(e, DH_EINVAL, "audio features: kind %d", c->kind);
    if (c->n_fft < 16 || c->n_fft > DH_AUDIO_MAX_FFT || c->n_fft % 2)
        return dh_err_set(e, DH_EINVAL,
                          "audio features: n_fft %d (an even number, "
                          "16..%d)",
                          c->n_fft, DH_AUDIO_MAX_FFT);
    if (c->hop < 1 || c->hop > c->n_fft)
        return dh_err_set(e, DH_EINVAL, "audio features: hop %d (1..n_fft %d)",
                          c->hop, c->n_fft);
    if (c->n_mels < 1 || c->n_mels > DH_AUDIO_MAX_MELS)
        return dh_err_set(e, DH_EINVAL, "audio features: n_mels %d (1..%d)",
                          c->n_mels, DH_AUDIO_MAX_MELS);
    if (samples <= c->n_fft / 2)
        return dh_err_set(e, DH_EINVAL,
                          "audio features: a row of %lld samples is not "
                          "longer than n_fft / 2 (%d)",
                          (long long)samples, c->n_fft / 2);
    return 0;
}
