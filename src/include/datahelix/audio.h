/*
 * audio.h - a sample's sound as float32 samples (issue 38; in-tree API,
 * src/media/audio_decode.c): the main audio stream of a source (a file, a
 * shard member, a remote object) decoded and resampled to the rate and
 * channels asked for, between two times on the container's clock.
 *
 * Thread-safety: each call is independent (FFmpeg contexts of its own).
 */
#ifndef DATAHELIX_AUDIO_H
#define DATAHELIX_AUDIO_H

#include <stdint.h>

#include "datahelix/error.h"
#include "datahelix/media.h"
#include "datahelix/table.h"

/* Per channel: 1 hour at 48 kHz, so a hostile header cannot make a decode
 * allocate without end. */
#define DH_AUDIO_MAX_SAMPLES ((int64_t)48000 * 3600)

struct dh_audio_opts {
    int rate;       /* output Hz, 1000..384000 */
    int channels;   /* 1 or 2 (downmixed or upmixed by libswresample) */
    double start_s; /* >= 0: the span's start, container clock */
    double end_s;   /* > start_s; <= 0: to the end of the stream */
    /* crop 1: instead, a window of crop_s seconds starting crop_u (0..1)
     * of the way through the room the stream leaves for it (0: its start,
     * 0.5: centred; a stream shorter than the window: all of it) */
    int crop;
    double crop_u, crop_s;
};

struct dh_audio {
    float *data[2]; /* planar float32 [channels][n], owned */
    int64_t n;      /* samples per channel */
    int rate, channels;
    double start_s; /* time of data[c][0] */
    int missing;    /* set with DH_EMEDIA when the source has no audio
                       stream (nothing else is set then) */
};

/* Decodes `ref`'s audio per `o` into *out (free with dh_audio_free).
 * Encoder priming and edit lists are dropped as a player drops them.
 * DH_EINVAL (options), DH_EMEDIA (no audio stream, undecodable),
 * DH_EUNSUPPORTED (no decoder), DH_ETOOBIG, DH_ENOMEM, or the source's
 * error (DH_EIO, a file changed since probe). */
int dh_audio_decode(const struct dh_source_ref *ref,
                    const struct dh_audio_opts *o, struct dh_audio *out,
                    struct dh_err *e) DH_MUST_CHECK;
void dh_audio_free(struct dh_audio *a);

/* dh_audio_decode() into the caller's planar rows dst[0..channels), each
 * of `cap` samples: *n = samples written, the span's first `cap` when it
 * is longer (a batch row's bound).  *missing = 1 when the error is that the
 * source has no audio stream (DH_EMEDIA), 0 otherwise. */
int dh_audio_decode_into(const struct dh_source_ref *ref,
                         const struct dh_audio_opts *o, float *const dst[2],
                         int64_t cap, int64_t *n, int *missing,
                         struct dh_err *e) DH_MUST_CHECK;

/*
 * Spectrogram features of a sound (src/media/audio_mel.c), as the
 * references compute them: DH_AUDIO_MEL is torchaudio's MelSpectrogram
 * (power 2, periodic Hann, centred reflect-padded frames, HTK mel scale,
 * no norm, f_min 0, f_max rate / 2), DH_AUDIO_LOG_MEL its log10 (floored
 * at 1e-10), DH_AUDIO_WHISPER Whisper's log_mel_spectrogram (Slaney scale
 * and norm, the last frame dropped, log10, floored at max - 8, (x + 4) / 4).
 */
struct dh_audio_features {
    int kind; /* enum dh_audio_feature (media.h) */
    int n_fft, hop, n_mels;
};

/* Frames of features of `samples` samples: samples / hop + 1 (Whisper:
 * without the last); 0 without features. */
int64_t dh_audio_feature_frames(const struct dh_audio_features *c,
                                int64_t samples);
/* The fields in range for rows of `samples` samples; DH_EINVAL saying
 * which is not. */
int dh_audio_features_check(const struct dh_audio_features *c, int64_t samples,
                            struct dh_err *e);
/* One channel x[0..n) at `rate` Hz into out [n_mels, frames] (row-major,
 * frames = dh_audio_feature_frames(c, n)).  DH_EINVAL, DH_ENOMEM. */
int dh_audio_features(const float *x, int64_t n, int rate,
                      const struct dh_audio_features *c, float *out,
                      struct dh_err *e) DH_MUST_CHECK;

struct dh_media;
struct dh_media_plan;
/* The span on the container's clock that the frames selected by the last
 * dh_media_decode() of the open file cover (media_decode.c): the first
 * valid frame's time to the last one's end (its duration; 1 / fps for an
 * fps plan).  DH_EINVAL when nothing was selected. */
int dh__media_span(const struct dh_media *m, const struct dh_media_plan *p,
                   double *start_s, double *end_s);

#endif
