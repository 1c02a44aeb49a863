/*
 * batch.c - one request's samples into one tensor (see batch.h).
 *
 * Design: the batch is B slices of T frames; each sample is decoded by the
 * media pipeline straight into its slice (no per-sample buffer), then the
 * frames it lacks are zeroed.  A sample whose plan yields more than T
 * frames cannot happen: T is the plan's count or cap.  Pure orchestration:
 * all I/O is the media pipeline's.
 */
#include <string.h>

#include "datahelix/audio.h"
#include "datahelix/batch.h"
#include "datahelix/media_stages.h"
#include "core/clock.h"
#include "core/hash.h"

int64_t dh_batch_frames(const struct dh_media_plan *p)
{
    switch (p->kind) {
    case DH_PLAN_UNIFORM:
    case DH_PLAN_JITTER:
    case DH_PLAN_INDICES:
        return p->frames;
    case DH_PLAN_FPS:
        return p->frames; /* the cap; 0 = none: not batchable */
    case DH_PLAN_ALL:
        return DH_MEDIA_MAX_FRAMES;
    }
    return 0;
}

/* Bytes of one sample's frames; 0 or SIZE_MAX as dh_batch_bytes. */
static size_t video_one(const struct dh_media_plan *p)
{
    int64_t t = dh_batch_frames(p);

    return t <= 0 ? 0 : dh_media_plan_bytes(p, t);
}

static size_t align64(size_t v)
{
    return (v + 63) & ~(size_t)63;
}

int dh_batch_layout(const struct dh_media_plan *p, uint32_t n,
                    struct dh_batch_layout *out)
{
    size_t one = video_one(p), row;
    const size_t lim = SIZE_MAX / 4;
    int64_t frames;

    memset(out, 0, sizeof(*out));
    if (one == 0 || one == SIZE_MAX || (n && one > lim / n))
        return -1;
    out->video = out->total = one * n;
    if (p->audio_rate <= 0)
        return 0;
    if (p->audio_channels < 1 || p->audio_channels > 2 ||
        p->audio_samples < 1 || p->audio_samples > DH_AUDIO_MAX_ROW)
        return -1;
    row = (size_t)p->audio_channels * (size_t)p->audio_samples * sizeof(float);
    if (n && row > lim / n)
        return -1;
    out->lengths = align64(out->video);
    out->audio = align64(out->lengths + (size_t)n * sizeof(int64_t));
    if (out->audio > lim - row * n)
        return -1;
    out->total = out->audio + row * n;
    if (p->audio_feature == DH_AUDIO_NO_FEATURES)
        return 0;
    frames = dh_audio_feature_frames(
        &(struct dh_audio_features){.kind = p->audio_feature,
                                    .hop = p->audio_hop},
        p->audio_samples);
    if (frames < 1 || p->audio_mels < 1 || p->audio_mels > DH_AUDIO_MAX_MELS)
        return -1;
    row = (size_t)p->audio_channels * (size_t)p->audio_mels * (size_t)frames *
          sizeof(float);
    out->features = align64(out->total);
    if ((n && row > lim / n) || out->features > lim - row * n)
        return -1;
    out->total = out->features + row * n;
    return 0;
}

size_t dh_batch_bytes(const struct dh_media_plan *p, uint32_t n)
{
    struct dh_batch_layout l;

    if (video_one(p) == 0)
        return 0;
    return dh_batch_layout(p, n, &l) ? SIZE_MAX : l.total;
}

void dh_batch_sample_plan(const struct dh_media_plan *p, uint64_t epoch,
                          uint64_t id, struct dh_media_plan *out)
{
    *out = *p;
    out->seed = dh__mix64(p->seed ^ dh__mix64(epoch ^ dh__mix64(id)));
}

int dh__batch_check_ids(const struct dh_index *ix, const uint64_t *ids,
                        uint32_t n, const struct dh_media_plan *p,
                        struct dh_err *e)
{
    int rc;

    if ((rc = dh_media_plan_check(p, e)))
        return rc;
    if (n == 0 || n > DH_BATCH_MAX_SAMPLES)
        return dh_err_set(e, DH_EINVAL, "batch: %u samples (1..%d)", n,
                          DH_BATCH_MAX_SAMPLES);
    for (uint32_t i = 0; i < n; i++)
        if (ids[i] >= dh_index_count(ix))
            return dh_err_set(e, DH_EINVAL,
                              "batch: sample id %llu is not "
                              "in the index (%llu samples)",
                              (unsigned long long)ids[i],
                              (unsigned long long)dh_index_count(ix));
    return 0;
}

int dh__batch_check_room(size_t need, size_t dst_len, uint32_t n,
                         const char *what, struct dh_err *e)
{
    if (need == 0)
        return dh_err_set(e, DH_EINVAL,
                          "batch: an fps plan needs a frame "
                          "cap to be batched");
    if (need == SIZE_MAX || dst_len < need + DH_MEDIA_DST_PAD)
        return dh_err_set(e, DH_EINVAL,
                          "batch: destination holds %zu "
                          "bytes, %u %s %zu + %d",
                          dst_len, n, what, need, DH_MEDIA_DST_PAD);
    return 0;
}

int dh__batch_open(struct dh_media *m, const struct dh_index *ix, uint64_t id,
                   struct dh_err *e)
{
    struct dh_source_ref ref;

    if (dh_index_source(ix, id, &ref))
        return dh_err_set(e, DH_EFORMAT,
                          "no path or a bad member in the "
                          "index");
    return dh_media_open_ref(m, &ref, e);
}

static int check_args(const struct dh_index *ix, const uint64_t *ids,
                      uint32_t n, const struct dh_media_plan *p, size_t dst_len,
                      struct dh_err *e)
{
    int rc = dh__batch_check_ids(ix, ids, n, p, e);

    return rc ? rc
              : dh__batch_check_room(dh_batch_bytes(p, n), dst_len, n,
                                     "samples need", e);
}

/* Where a batch goes: its slot and the slot's layout (dh_batch_layout). */
struct dest {
    uint8_t *dst;
    size_t dst_len;
    struct dh_batch_layout l;
    uint32_t n;
};

/* Row i's spectrogram, channel by channel, over the whole row (its zero
 * padding included, as Whisper pads to its window). */
static int features_row(const struct dh_media_plan *p, float *const rows[2],
                        const struct dest *d, uint32_t i, struct dh_err *e)
{
    struct dh_audio_features fc = {.kind = p->audio_feature,
                                   .n_fft = p->audio_n_fft,
                                   .hop = p->audio_hop,
                                   .n_mels = p->audio_mels};
    size_t one = (size_t)p->audio_mels *
                 (size_t)dh_audio_feature_frames(&fc, p->audio_samples);
    float *out = (float *)(void *)(d->dst + d->l.features) +
                 one * (size_t)p->audio_channels * i;
    int rc;

    for (int c = 0; c < p->audio_channels; c++)
        if ((rc = dh_audio_features(rows[c], p->audio_samples, p->audio_rate,
                                    &fc, out + one * (size_t)c, e)))
            return rc;
    return 0;
}

/* An audio-only sample's window (dh_audio_opts.crop): from its start (to
 * the row's end), centred, or where a draw of (seed, epoch, id) puts it in
 * the room its sound leaves. */
static struct dh_audio_opts window(const struct dh_media_plan *p,
                                   uint64_t epoch, uint64_t id)
{
    struct dh_audio_opts w = {.crop = p->audio_crop != DH_AUDIO_CROP_START,
                              .crop_u = 0.5,
                              .crop_s = (double)p->audio_samples /
                                        p->audio_rate};
    struct dh_media_plan sp;

    if (p->audio_crop == DH_AUDIO_CROP_RANDOM) {
        dh_batch_sample_plan(p, epoch, id, &sp);
        w.crop_u = (double)(dh__mix64(sp.seed ^ 0x617564696fULL) >> 11) *
                   0x1p-53;
    }
    return w;
}

/* Row i's sound: the span `span` names (start_s, end_s, or a crop) of
 * sample `id`'s source, resampled into the row, its length in lengths[i];
 * the rest of the row zeros.  A source without sound is an empty row, or
 * with audio_required the sample's error. */
static int audio_row(struct dh_media *m, const struct dh_index *ix, uint64_t id,
                     const struct dh_media_plan *p, struct dh_audio_opts span,
                     const struct dest *d, uint32_t i, struct dh_err *e)
{
    size_t row = (size_t)p->audio_channels * (size_t)p->audio_samples;
    float *base = (float *)(void *)(d->dst + d->l.audio) + row * i;
    float *rows[2] = {base, base + p->audio_samples};
    struct dh_audio_opts ao = span;
    struct dh_source_ref ref;
    int64_t got = 0, len;
    int missing = 0, rc;
    double ms = dh__mono_msf();

    ao.rate = p->audio_rate;
    ao.channels = p->audio_channels;
    if (dh_index_source(ix, id, &ref))
        return dh_err_set(e, DH_EFORMAT,
                          "no path or a bad member in the "
                          "index");
    rc = dh_audio_decode_into(&ref, &ao, rows, p->audio_samples, &got, &missing,
                              e);
    if (rc && missing && !p->audio_required) {
        dh_err_clear(e);
        rc = 0;
        got = 0;
    } else if (rc && missing) {
        return dh_err_set(e, rc,
                          "no audio stream (the loader asks for "
                          "sound in every sample: audio_missing)");
    }
    if (rc)
        return rc;
    for (int c = 0; c < p->audio_channels; c++)
        memset(rows[c] + got, 0,
               (size_t)(p->audio_samples - got) * sizeof(float));
    len = got;
    memcpy(d->dst + d->l.lengths + (size_t)i * sizeof(int64_t), &len,
           sizeof(len));
    if (p->audio_feature != DH_AUDIO_NO_FEATURES)
        rc = features_row(p, rows, d, i, e);
    dh__media_stage_add(m, DH_MS_AUDIO, dh__mono_msf() - ms);
    return rc;
}

/* One sample into position i: its frames into their slice (the frames it
 * does not fill zeroed), then its sound into its row. */
static int one_sample(struct dh_media *m, const struct dh_index *ix,
                      const char *path, uint64_t epoch, uint64_t id,
                      const struct dh_media_plan *p, const struct dest *d,
                      uint32_t i, int32_t *valid, struct dh_err *e)
{
    size_t one = d->l.video / d->n;
    uint8_t *slice = d->dst + (size_t)i * one;
    struct dh_media_plan sp;
    struct dh_media_result res;
    struct dh_index_columns cols;
    int64_t frames;
    struct dh_audio_opts span = {0};
    size_t used;
    int rc;

    dh_index_columns(ix, &cols);
    if (cols.kind && cols.kind[id] == DH_KIND_AUDIO) {
        /* sound alone: no frames; the row from the sound's start */
        memset(slice, 0, one);
        *valid = 0;
        if (p->audio_rate <= 0)
            return dh_err_set(e, DH_EUNSUPPORTED,
                              "%s: an audio sample (sound alone), and this "
                              "loader decodes no sound (audio=True)",
                              path);
        return audio_row(m, ix, id, p, window(p, epoch, id), d, i, e);
    }
    dh_batch_sample_plan(p, epoch, id, &sp);
    rc = dh__batch_open(m, ix, id, e);
    if (!rc)
        rc = dh_media_select(m, &sp, &frames, e);
    if (!rc && frames > dh_batch_frames(p))
        rc = dh_err_set(e, DH_ETOOBIG, "%s: %lld frames, the batch holds %lld",
                        path, (long long)frames, (long long)dh_batch_frames(p));
    /* The slice plus the pad of the whole buffer bounds swscale's stores. */
    if (!rc)
        rc = dh_media_decode(m, &sp, slice, d->dst_len - (size_t)i * one, &res,
                             e);
    if (!rc && p->audio_rate > 0 &&
        dh__media_span(m, &sp, &span.start_s, &span.end_s))
        rc = dh_err_set(e, DH_EMEDIA, "%s: no frame to time the sound by",
                        path);
    dh_media_close(m);
    if (rc)
        return rc;
    used = dh_media_plan_bytes(p, res.frames);
    memset(slice + used, 0, one - used);
    *valid = (int32_t)res.valid_frames;
    return p->audio_rate > 0 ? audio_row(m, ix, id, p, span, d, i, e) : 0;
}

/* Sample `id` into position i (e: the cause alone). */
static int decode_at(struct dh_media *m, const struct dh_index *ix,
                     uint64_t epoch, uint64_t id, const struct dh_media_plan *p,
                     const struct dest *d, uint32_t i, int32_t *valid,
                     struct dh_err *e)
{
    const char *path;

    if (id >= dh_index_count(ix))
        return dh_err_set(e, DH_EINVAL, "not in the index (%llu samples)",
                          (unsigned long long)dh_index_count(ix));
    if (!(path = dh_index_path(ix, id)))
        return dh_err_set(e, DH_EFORMAT, "no path in the index");
    return one_sample(m, ix, path, epoch, id, p, d, i, valid, e);
}

/* Position i failed with `code`: the next spare that decodes takes its
 * slice.  0 (recorded in subs) or `code` when none is left. */
static int substitute(struct dh_media *m, const struct dh_index *ix,
                      uint64_t epoch, uint64_t failed, int code,
                      const struct dh_media_plan *p, const struct dest *d,
                      uint32_t i, int32_t *valid, struct dh_batch_subs *subs)
{
    struct dh_err sub;

    if (!subs || code == DH_ENOMEM || subs->n >= DH_BATCH_MAX_SPARES)
        return code;
    while (subs->next < subs->n_spares) {
        uint64_t id = subs->spares[subs->next++];

        dh_err_clear(&sub);
        if (decode_at(m, ix, epoch, id, p, d, i, valid, &sub))
            continue; /* a spare that fails too is passed over */
        subs->pos[subs->n] = i;
        subs->failed[subs->n] = failed;
        subs->cause[subs->n] = code;
        subs->sub[subs->n] = id;
        subs->n++;
        return 0;
    }
    return code;
}

int dh_batch_decode_subs(struct dh_media *m, const struct dh_index *ix,
                         uint64_t epoch, const uint64_t *ids, uint32_t n,
                         const struct dh_media_plan *p, uint8_t *dst,
                         size_t dst_len, int32_t *valid_frames,
                         struct dh_batch_subs *subs, uint32_t *failed_at,
                         struct dh_err *e)
{
    struct dest d = {.dst = dst, .dst_len = dst_len, .n = n};
    struct dh_err sub;
    int rc;

    if (subs) {
        subs->next = subs->n = 0;
        if (subs->n_spares > DH_BATCH_MAX_SPARES)
            return dh_err_set(e, DH_EINVAL, "batch: %u spares (at most %d)",
                              subs->n_spares, DH_BATCH_MAX_SPARES);
    }
    if ((rc = check_args(ix, ids, n, p, dst_len, e)))
        return rc;
    if (dh_batch_layout(p, n, &d.l))
        return dh_err_set(e, DH_EINVAL, "batch: the plan's sizes overflow");
    for (uint32_t i = 0; i < n; i++) {
        const char *path = dh_index_path(ix, ids[i]);

        dh_err_clear(&sub);
        if (subs && subs->known && subs->known[i] < 0)
            rc = dh_err_set(&sub, subs->known[i], "failed before");
        else
            rc = decode_at(m, ix, epoch, ids[i], p, &d, i, &valid_frames[i],
                           &sub);
        if (rc)
            rc = substitute(m, ix, epoch, ids[i], rc, p, &d, i,
                            &valid_frames[i], subs);
        dh__media_stage_note(m, i); /* the spares' time is the position's */
        if (rc) {
            if (failed_at)
                *failed_at = i;
            return dh_err_set(e, rc, "sample %llu (%s): %s",
                              (unsigned long long)ids[i], path ? path : "?",
                              sub.msg);
        }
    }
    return 0;
}

int dh_batch_decode(struct dh_media *m, const struct dh_index *ix,
                    uint64_t epoch, const uint64_t *ids, uint32_t n,
                    const struct dh_media_plan *p, uint8_t *dst, size_t dst_len,
                    int32_t *valid_frames, uint32_t *failed_at,
                    struct dh_err *e)
{
    return dh_batch_decode_subs(m, ix, epoch, ids, n, p, dst, dst_len,
                                valid_frames, NULL, failed_at, e);
}
