/*
 * datahelix/media.h - the media pipeline: open a file, choose frames by a
 * sampling plan, decode only what the plan needs, and scale straight into a
 * caller-owned destination (later a slot of the shared-memory arena).
 *
 * Life cycle, per worker thread:
 *
 *     struct dh_media *m;  dh_media_create(&m, &e);        once per worker
 *     dh_media_open(m, path, &e);                          per file
 *     dh_media_select(m, &plan, &frames, &e);              how many frames
 *     dh_media_decode(m, &plan, dst, dst_len, &res, &e);   into dst
 *     dh_media_close(m);                                   (or next open)
 *     dh_media_destroy(m);
 *
 * A dh_media keeps its packet, frames, scaler and scratch buffers across
 * files, so the steady state allocates nothing per frame.
 *
 * Frame indices are presentation-order positions 0..frames-1 as `ffmpeg`
 * outputs them.  Exact mode (the default) returns exactly the planned
 * frames; snap modes trade exactness for speed (see enum dh_snap).
 *
 * Errors name the file, the frame / time position and FFmpeg's reason.
 * Thread-safety: one dh_media per thread; different ones are independent.
 */
#ifndef DATAHELIX_MEDIA_H
#define DATAHELIX_MEDIA_H

#include <stddef.h>
#include <stdint.h>

#include "datahelix/error.h"
#include "datahelix/table.h"

/* Most frames one plan may produce. */
#define DH_MEDIA_MAX_FRAMES 4096
/* Default cap on one sample's output: frames x width x height, 2^28 pixels
 * (768 MiB as uint8 RGB; 16 frames of 4096x4096, 4,096 of 256x256).  A
 * plan over it is refused before anything is decoded or allocated. */
#define DH_MEDIA_MAX_PIXELS ((int64_t)1 << 28)
/* Slack the destination must have past dh_media_plan_bytes(): swscale's
 * vector stores may run a little past the last row. */
#define DH_MEDIA_DST_PAD 64

enum dh_plan_kind {
    DH_PLAN_UNIFORM, /* `frames` frames spread evenly over the clip */
    DH_PLAN_FPS,     /* one frame every 1/fps s, at most `frames` (0: no cap) */
    DH_PLAN_INDICES, /* the `frames` indices in `indices` */
    DH_PLAN_JITTER,  /* training jitter: a random stride and offset, from
                        `seed`, `frames` frames evenly strided */
    DH_PLAN_ALL,     /* every frame (at most DH_MEDIA_MAX_FRAMES) */
};

enum dh_pad {
    DH_PAD_REPEAT, /* a clip shorter than the plan repeats its last frame */
    DH_PAD_ZERO,   /* ... or the rest is zeros */
};

enum dh_geometry {
    DH_GEOM_CROP,        /* shorter-side resize, then center crop (default) */
    DH_GEOM_STRETCH,     /* resize to width x height, aspect not kept */
    DH_GEOM_RANDOM_CROP, /* shorter-side resize, crop at a seeded offset */
    DH_GEOM_NATIVE,      /* each clip at its own size, bounded by max_side
                            and max_area and rounded to a multiple of
                            `patch` (dh_media_native_size); width / height
                            are not used.  Resolve per file with
                            dh_media_plan_resolve() before select/decode. */
};

enum dh_layout { DH_LAYOUT_THWC, DH_LAYOUT_TCHW };
enum dh_dtype { DH_DTYPE_U8, DH_DTYPE_F32 };

enum dh_snap {
    DH_SNAP_EXACT, /* the planned frames, exactly (default) */
    DH_SNAP_REF,   /* nearest reference frame within the tolerance */
    DH_SNAP_KEY,   /* nearest keyframe within the tolerance */
};

struct dh_media_plan {
    enum dh_plan_kind kind;
    int64_t frames;         /* see enum dh_plan_kind */
    double fps;             /* DH_PLAN_FPS */
    const int64_t *indices; /* DH_PLAN_INDICES: borrowed, `frames` long */
    uint64_t seed;          /* jitter and random crop */
    enum dh_pad pad;
    int32_t width, height; /* output size, 1..16384 */
    enum dh_geometry geometry;
    enum dh_layout layout;
    enum dh_dtype dtype;
    float mean[3], std[3]; /* F32 only: value = (x / 255 - mean) / std */
    enum dh_snap snap;
    double snap_tol;    /* in frames; <= 0: half the sampling stride */
    int64_t max_pixels; /* cap on frames x width x height of one sample;
                               0: DH_MEDIA_MAX_PIXELS (DH_ETOOBIG over it) */
    /* DH_GEOM_NATIVE only (0 = no bound / no rounding): */
    int32_t max_side; /* the longer side <= this, 0..16384 */
    int64_t max_area; /* width x height of one frame <= this (Qwen-VL's
                         max_pixels), 0..DH_MEDIA_MAX_PIXELS */
    int32_t patch;    /* each side a multiple of this (28 for Qwen-VL),
                         0..DH_MEDIA_MAX_PATCH; 0 and 1: any size */
    /* Sound (issue 38; batches only, docs/media.md "Audio"): audio_rate 0:
     * none.  Else each sample's audio over the span its frames cover,
     * resampled to audio_rate Hz (DH_AUDIO_MIN_RATE..DH_AUDIO_MAX_RATE)
     * and audio_channels (1 or 2), at most audio_samples per channel
     * (1..DH_AUDIO_MAX_ROW); a clip without sound is zeros (length 0)
     * unless audio_required, which makes it a DH_EMEDIA sample error. */
    int32_t audio_rate, audio_channels;
    int64_t audio_samples;
    int32_t audio_required;
    /* Spectrogram features of each row (with audio_rate > 0), after the
     * rows: enum dh_audio_feature (DH_AUDIO_NO_FEATURES: none), n_fft
     * (even, 16..8192), hop (1..n_fft), n_mels (1..512). */
    int32_t audio_feature, audio_n_fft, audio_hop, audio_mels;
    /* An audio-only sample's window: DH_AUDIO_CROP_START (its first
     * audio_samples), _CENTER, or _RANDOM (from the seed, the epoch and
     * the id, as every draw: DESIGN 8). */
    int32_t audio_crop;
};

enum dh_audio_crop {
    DH_AUDIO_CROP_START = 0,
    DH_AUDIO_CROP_CENTER = 1,
    DH_AUDIO_CROP_RANDOM = 2
};

enum dh_audio_feature {
    DH_AUDIO_NO_FEATURES = 0,
    DH_AUDIO_MEL = 1,     /* torchaudio's MelSpectrogram (power) */
    DH_AUDIO_LOG_MEL = 2, /* its log10 */
    DH_AUDIO_WHISPER = 3  /* Whisper's normalised log-mel */
};

#define DH_AUDIO_MIN_RATE 1000
#define DH_AUDIO_MAX_RATE 384000
/* Spectrogram features' bounds (audio_n_fft, audio_mels). */
#define DH_AUDIO_MAX_FFT 8192
#define DH_AUDIO_MAX_MELS 512
/* Most audio samples per channel of one batch row: 10 minutes at 48 kHz. */
#define DH_AUDIO_MAX_ROW ((int64_t)48000 * 600)

/* Largest `patch` of a native plan. */
#define DH_MEDIA_MAX_PATCH 1024

/* uniform 16 frames, 224x224, crop, THWC, uint8, exact, repeat-pad,
 * ImageNet mean/std for the float option. */
DH_API void dh_media_plan_init(struct dh_media_plan *p);

/* Checks a plan's fields (sizes, counts, enums); 0 or DH_EINVAL, and
 * DH_ETOOBIG when a plan of a fixed frame count (uniform, jitter, indices)
 * is over its pixel cap.  fps and all plans are held to it on select. */
DH_API int dh_media_plan_check(const struct dh_media_plan *p,
                               struct dh_err *e) DH_MUST_CHECK;

/* The cap on `frames` frames of plan `p`: 0 when frames x width x height is
 * within p->max_pixels (or the default), else DH_ETOOBIG saying so. */
DH_API int dh_media_plan_check_pixels(const struct dh_media_plan *p,
                                      int64_t frames,
                                      struct dh_err *e) DH_MUST_CHECK;

/*
 * The output size of a native plan for a clip whose coded size is
 * width x height with display `rotation` (degrees; 90 and 270 swap the
 * sides), in display orientation.  The one rounding rule that the decoder
 * (dh_media_plan_resolve) and the token estimator (probe, the planner)
 * share, so a sample weighs in the plan exactly what it is decoded as:
 *
 *   1. longer side > max_side: scale both sides by max_side / longer,
 *      each rounded to nearest;
 *   2. width x height > max_area: scale both by sqrt(max_area / area),
 *      each rounded down;
 *   3. patch > 1: each side to the nearest multiple of patch (at least
 *      one patch); where that breaks max_side or max_area, both sides to
 *      the multiple below instead.
 *
 * With max_area 0 and patch 0 this is the probe's native size (step 1).
 * Sides <= 0 give 0 x 0.  Pure, never fails.
 */
DH_API void dh_media_native_size(int32_t width, int32_t height,
                                 int32_t rotation, int32_t max_side,
                                 int64_t max_area, int32_t patch,
                                 int32_t *out_w, int32_t *out_h);

/*
 * Frames an fps plan of rate `fps` takes from a constant-rate clip of
 * `frames` frames at `clip_fps`: the k = 0, 1, ... with k x clip_fps / fps
 * < frames (the decoder's walk in frame units, frame_select.c), at least
 * 1, at most `cap` (0: DH_MEDIA_MAX_FRAMES).  What the token estimate
 * counts for an fps plan, so a sample weighs what it is decoded as.  0 when
 * frames, clip_fps or fps is not positive.
 */
DH_API int64_t dh_media_fps_count(int64_t frames, double clip_fps, double fps,
                                  int64_t cap);

/*
 * The concrete plan a native plan `p` runs as on a file of `info`: `p` with
 * width x height = dh_media_native_size() of the file and geometry
 * DH_GEOM_STRETCH (the rounding moves the aspect by less than a patch).
 * A plan that is not native is copied as is.  0, or DH_EINVAL /
 * DH_ETOOBIG from dh_media_plan_check() of the result; *out is written
 * only on success.
 */
struct dh_media_info;
DH_API int dh_media_plan_resolve(const struct dh_media_plan *p,
                                 const struct dh_media_info *info,
                                 struct dh_media_plan *out,
                                 struct dh_err *e) DH_MUST_CHECK;

/* Bytes of output for `frames` frames under `p` (without DH_MEDIA_DST_PAD). */
DH_API size_t dh_media_plan_bytes(const struct dh_media_plan *p,
                                  int64_t frames);

struct dh_media;

DH_API int dh_media_create(struct dh_media **out,
                           struct dh_err *e) DH_MUST_CHECK;
/* Closes any open file and frees everything.  Accepts NULL. */
DH_API void dh_media_destroy(struct dh_media *m);

/* Decoder threads for the files opened from now on (default 1: the
 * scheduler runs one sample per core; 0 = FFmpeg's choice). */
DH_API void dh_media_set_threads(struct dh_media *m, int threads);

/* The per-sample watchdog: from each dh_media_open*() on, reading and
 * decoding that file stop with DH_ETIMEOUT ("... abandoned after N ms:
 * per-sample watchdog") once `ms` have passed.  Checked before every packet
 * and inside blocking reads (FFmpeg's interrupt callback); a single packet
 * whose decode never returns cannot be interrupted.  0 (default): off. */
DH_API void dh_media_set_watchdog(struct dh_media *m, int ms);

/* Opens a video or image file (closing the previous one) and reads its
 * frame table: container index where there is one, else a packet scan. */
DH_API int dh_media_open(struct dh_media *m, const char *path,
                         struct dh_err *e) DH_MUST_CHECK;
/* The same from memory (`data` must outlive the open file); `name` is used
 * in messages.  For payloads received over the network and for fuzzing. */
DH_API int dh_media_open_mem(struct dh_media *m, const void *data, size_t len,
                             const char *name, struct dh_err *e) DH_MUST_CHECK;
DH_API void dh_media_close(struct dh_media *m);

/* dh_media_open() of a file or a shard member (see dh_source_ref): the
 * member is read in place, through the shard's file kept open by this
 * worker for its next member; a member that lies past the shard's end is
 * DH_EMEDIA saying the shard changed since probe. */
DH_API int dh_media_open_ref(struct dh_media *m,
                             const struct dh_source_ref *ref,
                             struct dh_err *e) DH_MUST_CHECK;

struct dh_media_info {
    enum dh_kind kind; /* video or image */
    int64_t frames;    /* presentation frames */
    int64_t keyframes;
    int32_t width, height; /* coded size */
    int32_t rotation;      /* display rotation, degrees clockwise */
    double fps;
    double duration_s;
    char codec[DH_CODEC_MAX];
    char pix_fmt[32];
};

/* Facts about the open file.  DH_EINVAL when nothing is open. */
DH_API int dh_media_info(const struct dh_media *m,
                         struct dh_media_info *out) DH_MUST_CHECK;

/* Chooses the frames of `p` for the open file; *out_frames is how many
 * frames dh_media_decode() will write (padding included).  A native plan
 * must be resolved first (DH_EINVAL otherwise). */
DH_API int dh_media_select(struct dh_media *m, const struct dh_media_plan *p,
                           int64_t *out_frames, struct dh_err *e) DH_MUST_CHECK;

struct dh_media_result {
    int64_t frames;         /* frames written (padding included) */
    int64_t valid_frames;   /* frames that came from the clip */
    int64_t decoded_frames; /* frames the decoder produced (cost) */
    int64_t seeks;
    int64_t seek_fallbacks; /* a seek missed its frame (a container that
                               cannot seek reliably): decoded forward from
                               the start instead, and the file is not
                               sought in again while it stays open */
    double mean_abs_shift;  /* snap modes: mean |used - planned| index */
};

/*
 * Runs `p` on the open file into `dst` (dst_len >= dh_media_plan_bytes() +
 * DH_MEDIA_DST_PAD).  Selects first if dh_media_select() was not called
 * with the same plan.  On error dst holds partial output and `e` names the
 * file, the frame and the cause.
 */
DH_API int dh_media_decode(struct dh_media *m, const struct dh_media_plan *p,
                           void *dst, size_t dst_len,
                           struct dh_media_result *res,
                           struct dh_err *e) DH_MUST_CHECK;

/* What a full decode of the open file found (dh_media_verify). */
struct dh_media_verify {
    int64_t frames;  /* pictures the decoder produced, in presentation order */
    double media_s;  /* the clip's duration, seconds */
    int64_t packets; /* video packets read */
};

/*
 * Decodes every picture of the open file at its native size, scaling
 * nothing, and checks it against the frame table that dh_media_open() built
 * (and that `datahelix probe` counts): the same number of pictures, each
 * one at the table's timestamp, in order, none damaged by the decoder's own
 * account (every error it detects is fatal here, AV_EF_EXPLODE, where a
 * normal decode conceals it).  0 when the file gives
 * exactly its frames; DH_EMEDIA naming the file, the frame and the cause
 * otherwise (DH_ETIMEOUT from the watchdog).  Leaves the file open and
 * positioned for dh_media_decode().
 */
DH_API int dh_media_verify(struct dh_media *m, struct dh_media_verify *res,
                           struct dh_err *e) DH_MUST_CHECK;

/* Source frame index of each output frame of the last select/decode
 * (-1 for zero padding); valid until the next select, open or close. */
DH_API const int64_t *dh_media_indices(const struct dh_media *m);

#endif
