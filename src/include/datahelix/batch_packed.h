/*
 * datahelix/batch_packed.h - a batch of variable-shape samples in one slot:
 * each sample keeps its own frame count T (an fps plan) and size H x W (a
 * native-size plan, DH_GEOM_NATIVE), written back to back after a small
 * table, with no padding between samples.  The fixed-shape [B, T, H, W, 3]
 * batch of batch.h is unchanged; a plan of geometry DH_GEOM_NATIVE is a
 * packed batch, any other a fixed one (dh_batch_is_packed).
 *
 * The slot (all integers little-endian, offsets from the slot's start):
 *
 *     0   u32 magic DH_PACKED_MAGIC     4  u32 n (samples)
 *     8   u64 used (table + samples: the bytes the ResultNotice's length
 *         says; the rest of the slot, if any, is not part of the batch)
 *     16  n entries of DH_PACKED_ENTRY bytes:
 *           u64 offset, u32 t, u32 h, u32 w, u32 valid_frames
 *     ..  zeros up to dh_packed_table_bytes(n), a multiple of 64, so that
 *         sample 0 starts aligned
 *     then sample i at entry i's offset, t*h*w*3 elements (THWC; TCHW:
 *         t*3*h*w), each sample's offset the previous one's end.
 *
 * So used == dh_packed_table_bytes(n) + sum of the samples' bytes, exactly.
 * Slot size: the worker cannot know T before it opens each file, so it
 * reserves dh_batch_packed_bound() (the plan's frame cap times each
 * sample's native size from the index) and the ResultNotice names only the
 * `used` bytes.
 *
 * Determinism as batch.h: the plan of a sample is dh_batch_sample_plan().
 * Thread-safety: one dh_media per thread; the index may be shared; the
 * table functions are pure.
 */
#ifndef DATAHELIX_BATCH_PACKED_H
#define DATAHELIX_BATCH_PACKED_H

#include <stddef.h>
#include <stdint.h>

#include "datahelix/error.h"
#include "datahelix/index.h"
#include "datahelix/media.h"

#define DH_PACKED_MAGIC 0x4b504844u /* "DHPK" */
#define DH_PACKED_HEADER 16u
#define DH_PACKED_ENTRY 24u

/* One sample of a packed batch. */
struct dh_packed_entry {
    uint64_t offset; /* from the slot's start */
    uint32_t t, h, w;
    uint32_t valid_frames;
};

/* 1 when plan `p` makes a packed batch (its geometry is DH_GEOM_NATIVE). */
int dh_batch_is_packed(const struct dh_media_plan *p);

/* Bytes of the table of `n` samples, header included, rounded up to 64. */
size_t dh_packed_table_bytes(uint32_t n);

/* Bytes of one sample of t frames of h x w under `p`'s dtype. */
size_t dh_packed_sample_bytes(const struct dh_media_plan *p, uint32_t t,
                              uint32_t h, uint32_t w);

/*
 * The slot a packed batch of ids[0..n) needs at most (without
 * DH_MEDIA_DST_PAD): the table plus, per sample, the plan's frame cap (an
 * fps plan's `frames`; 1 for an image) times its native size from the
 * index's width and height.  0 when the plan has no frame cap (not
 * batchable), SIZE_MAX on overflow or an id not in the index.
 */
size_t dh_batch_packed_bound(const struct dh_index *ix, const uint64_t *ids,
                             uint32_t n, const struct dh_media_plan *p);

/*
 * Decodes ids[0..n) of `ix` in `epoch` with native plan `p` into `dst`
 * (dst_len >= the bound + DH_MEDIA_DST_PAD) as the layout above; each
 * sample's plan is resolved against its own file (dh_media_plan_resolve).
 * *used = the table plus the samples' bytes; valid_frames[i] as in
 * dh_batch_decode().  Errors as dh_batch_decode(): the first failing
 * sample's code, `e` naming its id, path and cause, *failed_at its position.
 */
int dh_batch_packed_decode(struct dh_media *m, const struct dh_index *ix,
                           uint64_t epoch, const uint64_t *ids, uint32_t n,
                           const struct dh_media_plan *p, uint8_t *dst,
                           size_t dst_len, size_t *used, int32_t *valid_frames,
                           uint32_t *failed_at, struct dh_err *e) DH_MUST_CHECK;

/*
 * Reads and checks the table of a packed slot of `len` bytes holding `n`
 * samples of element size `elem` (1 uint8, 4 float32) into out[0..n):
 * the magic, the count, every offset the previous sample's end (the first
 * at dh_packed_table_bytes(n)), each size t*h*w*3*elem without overflow,
 * valid_frames <= t, and `used` equal to the last end and <= len.  For a
 * client reading a slot a server wrote: nothing in it is trusted.  0 or
 * DH_EPROTO naming what is wrong; `out` is written only on success.
 */
int dh_packed_table_read(const uint8_t *slot, size_t len, uint32_t n,
                         uint32_t elem, struct dh_packed_entry *out,
                         struct dh_err *e) DH_MUST_CHECK;

#endif
