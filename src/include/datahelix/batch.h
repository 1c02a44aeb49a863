/*
 * datahelix/batch.h - a DataServer worker's unit of work: the samples of one
 * request, decoded by the media pipeline straight into one destination (a
 * slot of the shared-memory arena) as a single [B, T, H, W, 3] tensor, with
 * the valid-frame count of every sample (the mask for variable-length
 * clips).
 *
 * Determinism (DESIGN 8): the random draws of a sample (jitter, random
 * crop) derive from (plan seed, epoch, sample id) only, never from which worker
 * ran it or when, so a re-routed or resumed request yields the same bytes.
 *
 * Thread-safety: one dh_media per thread; the index may be shared.
 */
#ifndef DATAHELIX_BATCH_H
#define DATAHELIX_BATCH_H

#include <stddef.h>
#include <stdint.h>

#include "datahelix/error.h"
#include "datahelix/index.h"
#include "datahelix/media.h"

/* Most samples in one request. */
#define DH_BATCH_MAX_SAMPLES 65536
/* Most spares of one request, and so substitutions (= DH_WIRE_MAX_SPARES). */
#define DH_BATCH_MAX_SPARES 64

/*
 * The skip policy's substitutes for one batch (docs/dataserver.md
 * "Substitutes").  In: `spares` (the request's, in the order to try) and
 * optionally `known` (n entries, one per position: 0, or the cause of a
 * sample known to fail - quarantined - which is then not decoded again).
 * Out: every position whose sample failed and was filled by a spare, in
 * increasing position order: the failed id, its cause, the spare delivered.
 * A spare that fails too is passed over; `next` counts the spares used.
 */
struct dh_batch_subs {
    const uint64_t *spares;
    uint32_t n_spares;
    const int32_t *known; /* NULL: none known */
    uint32_t next;        /* out: spares tried */
    uint32_t n;           /* out: substitutions */
    uint32_t pos[DH_BATCH_MAX_SPARES];
    uint64_t failed[DH_BATCH_MAX_SPARES];
    int32_t cause[DH_BATCH_MAX_SPARES];
    uint64_t sub[DH_BATCH_MAX_SPARES];
};

/*
 * Frames per sample in a batch of plan `p`: the plan's count (uniform,
 * jitter, indices) or its cap (fps, all); 0 when the plan has no bound, which
 * cannot be batched.
 */
int64_t dh_batch_frames(const struct dh_media_plan *p);

/* Bytes of a batch of `n` samples (without DH_MEDIA_DST_PAD), its sound
 * included; SIZE_MAX on overflow, 0 when the plan cannot be batched. */
size_t dh_batch_bytes(const struct dh_media_plan *p, uint32_t n);

/*
 * Where the parts of a batch of `n` samples lie in its slot (docs/arena.md
 * "Batch layout"):
 *
 *   [0, video)              the frames, sample i at i * video / n
 *   [lengths, +8n)          int64 [n]: audio samples per channel per row
 *   [audio, +4nCS)          float32 [n, channels, samples], zero-padded
 *   [features, total)       float32 [n, channels, n_mels, frames]: the
 *                           spectrogram of each whole row (with features)
 *
 * lengths, audio and features 64-aligned; 0 where the plan has no sound
 * (or no features), total the end of the last part.
 * 0, or -1 when the plan cannot be batched or the sizes overflow.
 */
struct dh_batch_layout {
    size_t video, lengths, audio, features, total;
};
int dh_batch_layout(const struct dh_media_plan *p, uint32_t n,
                    struct dh_batch_layout *out);

/* The plan sample `id` runs under in `epoch`: `p` with its seed mixed with
 * the epoch and the id (a new augmentation every epoch, the same one on any
 * worker). */
void dh_batch_sample_plan(const struct dh_media_plan *p, uint64_t epoch,
                          uint64_t id, struct dh_media_plan *out);

/*
 * Decodes samples ids[0..n) of index `ix` in `epoch` with plan `p` into `dst`
 * (dst_len >= dh_batch_bytes(p, n) + DH_MEDIA_DST_PAD), laid out as
 * dh_batch_layout() says.  A sample with fewer frames than the batch is
 * zero-padded along T; valid_frames[i] says how many of its frames are
 * real.  With sound in the plan, row i holds the audio of the span sample
 * i's frames cover (dh__media_span) and lengths[i] its sample count.
 * On the first failing sample, returns its code with `e` naming the
 * sample id, its path and the cause, and *failed_at = its position (the
 * samples before it are complete).  `m` is the caller's per-thread media
 * worker.
 */
int dh_batch_decode(struct dh_media *m, const struct dh_index *ix,
                    uint64_t epoch, const uint64_t *ids, uint32_t n,
                    const struct dh_media_plan *p, uint8_t *dst, size_t dst_len,
                    int32_t *valid_frames, uint32_t *failed_at,
                    struct dh_err *e) DH_MUST_CHECK;

/*
 * dh_batch_decode() with substitutes: a sample that fails for its own
 * reasons (any code but DH_ENOMEM) is replaced in its slice by the next
 * spare of `subs` that decodes, and recorded there; only when the spares
 * run out does the batch fail, with the first sample's error (and
 * *failed_at its position).  subs == NULL: exactly dh_batch_decode().
 * The ids given are not changed: the delivered ones are ids with
 * subs->sub[i] at subs->pos[i].
 */
int dh_batch_decode_subs(struct dh_media *m, const struct dh_index *ix,
                         uint64_t epoch, const uint64_t *ids, uint32_t n,
                         const struct dh_media_plan *p, uint8_t *dst,
                         size_t dst_len, int32_t *valid_frames,
                         struct dh_batch_subs *subs, uint32_t *failed_at,
                         struct dh_err *e) DH_MUST_CHECK;

/* The argument checks both batch layouts make (batch.c): the plan, the
 * count (1..DH_BATCH_MAX_SAMPLES) and every id in the index; then that a
 * destination of dst_len holds `need` bytes + DH_MEDIA_DST_PAD (need 0:
 * an fps plan without a frame cap), the message saying "N <what> X". */
int dh__batch_check_ids(const struct dh_index *ix, const uint64_t *ids,
                        uint32_t n, const struct dh_media_plan *p,
                        struct dh_err *e);
/* dh_media_open_ref() of sample `id`'s file or shard member. */
int dh__batch_open(struct dh_media *m, const struct dh_index *ix, uint64_t id,
                   struct dh_err *e) DH_MUST_CHECK;
int dh__batch_check_room(size_t need, size_t dst_len, uint32_t n,
                         const char *what, struct dh_err *e);

#endif
