/*
 * batch_packed.c - variable-shape samples back to back in one slot (see
 * batch_packed.h for the layout).
 *
 * Design: the table goes first so a reader finds it at offset 0 whatever
 * the samples' sizes; samples follow in batch order, each written by the
 * media pipeline straight into its place (no per-sample buffer), so the
 * only bytes in the slot that are not pixels are the table's.  The frame
 * count of an fps plan is only known once a file is open, so the slot is
 * reserved by an upper bound from the index and `used` says how much of it
 * the batch took.  Pure orchestration, as batch.c: all I/O is the media
 * pipeline's.  batch.c (the fixed-shape batch) is not touched: a plan of
 * geometry DH_GEOM_NATIVE comes here instead.
 */
#include <string.h>

#include "core/le.h"
#include "datahelix/batch.h"
#include "datahelix/batch_packed.h"
#include "datahelix/media_stages.h"

#define ALIGN 64u

int dh_batch_is_packed(const struct dh_media_plan *p)
{
    return p->geometry == DH_GEOM_NATIVE;
}

size_t dh_packed_table_bytes(uint32_t n)
{
    size_t b = DH_PACKED_HEADER + (size_t)n * DH_PACKED_ENTRY;

    return (b + ALIGN - 1) / ALIGN * ALIGN;
}

/* t*h*w*3*elem, or SIZE_MAX when it does not fit. */
static size_t sample_bytes(uint64_t t, uint64_t h, uint64_t w, uint64_t elem)
{
    /* Each factor < 2^32: check each product against the next one. */
    uint64_t v = t * h; /* < 2^64 */

    if (h && v / h != t)
        return SIZE_MAX;
    if (w && v > UINT64_MAX / w)
        return SIZE_MAX;
    v *= w;
    if (v > UINT64_MAX / (3 * elem) || v * 3 * elem > SIZE_MAX)
        return SIZE_MAX;
    return (size_t)(v * 3 * elem);
}

static uint64_t elem_of(const struct dh_media_plan *p)
{
    return p->dtype == DH_DTYPE_F32 ? 4 : 1;
}

size_t dh_packed_sample_bytes(const struct dh_media_plan *p, uint32_t t,
                              uint32_t h, uint32_t w)
{
    return sample_bytes(t, h, w, elem_of(p));
}

/* The largest sample `id` can be under `p`: its native size from the index
 * (rotation does not change the area) times the plan's frame cap. */
static size_t sample_bound(const struct dh_index_columns *c, uint64_t id,
                           const struct dh_media_plan *p, int64_t frames)
{
    int32_t w, h;

    dh_media_native_size(c->width[id], c->height[id], 0, p->max_side,
                         p->max_area, p->patch, &w, &h);
    if (c->kind[id] == DH_KIND_IMAGE)
        frames = 1;
    if (w <= 0 || h <= 0)
        return 0; /* decoding it fails; its room is the pipeline's check */
    return sample_bytes((uint64_t)frames, (uint64_t)h, (uint64_t)w, elem_of(p));
}

size_t dh_batch_packed_bound(const struct dh_index *ix, const uint64_t *ids,
                             uint32_t n, const struct dh_media_plan *p)
{
    int64_t frames = dh_batch_frames(p);
    struct dh_index_columns c;
    size_t sum = dh_packed_table_bytes(n);

    if (frames <= 0)
        return 0;
    dh_index_columns(ix, &c);
    for (uint32_t i = 0; i < n; i++) {
        size_t b;

        if (ids[i] >= c.count)
            return SIZE_MAX;
        b = sample_bound(&c, ids[i], p, frames);
        if (b == SIZE_MAX || b > SIZE_MAX - sum)
            return SIZE_MAX;
        sum += b;
    }
    return sum;
}

static void put_entry(uint8_t *slot, uint32_t i,
                      const struct dh_packed_entry *en)
{
    unsigned char *q = slot + DH_PACKED_HEADER + (size_t)i * DH_PACKED_ENTRY;

    dh__put_le64(q, en->offset);
    dh__put_le32(q + 8, en->t);
    dh__put_le32(q + 12, en->h);
    dh__put_le32(q + 16, en->w);
    dh__put_le32(q + 20, en->valid_frames);
}

static void get_entry(const uint8_t *slot, uint32_t i,
                      struct dh_packed_entry *en)
{
    const unsigned char *q = slot + DH_PACKED_HEADER +
                             (size_t)i * DH_PACKED_ENTRY;

    en->offset = dh__get_le64(q);
    en->t = dh__get_le32(q + 8);
    en->h = dh__get_le32(q + 12);
    en->w = dh__get_le32(q + 16);
    en->valid_frames = dh__get_le32(q + 20);
}

static int check_args(const struct dh_index *ix, const uint64_t *ids,
                      uint32_t n, const struct dh_media_plan *p, size_t dst_len,
                      struct dh_err *e)
{
    int rc;

    if (!dh_batch_is_packed(p) && dh_media_plan_check(p, e) == 0)
        return dh_err_set(e, DH_EINVAL,
                          "batch: a packed batch needs a native-size plan");
    if ((rc = dh__batch_check_ids(ix, ids, n, p, e)))
        return rc;
    return dh__batch_check_room(dh_batch_packed_bound(ix, ids, n, p), dst_len,
                                n, "packed samples need up to", e);
}

/* One sample at dst + off, resolved against its own file; fills `en`. */
static int one_sample(struct dh_media *m, const struct dh_index *ix,
                      const char *path, uint64_t epoch, uint64_t id,
                      const struct dh_media_plan *p, uint8_t *dst,
                      size_t dst_len, size_t off, struct dh_packed_entry *en,
                      struct dh_err *e)
{
    struct dh_media_plan sp, rp;
    struct dh_media_info info;
    struct dh_media_result res;
    int64_t frames = 0;
    size_t bytes = 0;
    int rc;

    dh_batch_sample_plan(p, epoch, id, &sp);
    rc = dh__batch_open(m, ix, id, e);
    if (!rc && (rc = dh_media_info(m, &info)))
        dh_err_set(e, rc, "%s: no stream information", path);
    if (!rc)
        rc = dh_media_plan_resolve(&sp, &info, &rp, e);
    if (!rc)
        rc = dh_media_select(m, &rp, &frames, e);
    if (!rc && frames > dh_batch_frames(p))
        rc = dh_err_set(e, DH_ETOOBIG, "%s: %lld frames, the batch holds %lld",
                        path, (long long)frames, (long long)dh_batch_frames(p));
    if (!rc) {
        bytes = dh_media_plan_bytes(&rp, frames);
        if (bytes == SIZE_MAX || bytes > dst_len - DH_MEDIA_DST_PAD - off)
            rc = dh_err_set(e, DH_ETOOBIG,
                            "%s: %lld frames of %dx%d do not fit the "
                            "slot's room (the index's size is not the "
                            "file's?)",
                            path, (long long)frames, rp.width, rp.height);
    }
    if (!rc)
        rc = dh_media_decode(m, &rp, dst + off, dst_len - off, &res, e);
    dh_media_close(m);
    if (rc)
        return rc;
    *en = (struct dh_packed_entry){.offset = off,
                                   .t = (uint32_t)res.frames,
                                   .h = (uint32_t)rp.height,
                                   .w = (uint32_t)rp.width,
                                   .valid_frames = (uint32_t)res.valid_frames};
    return 0;
}

int dh_batch_packed_decode(struct dh_media *m, const struct dh_index *ix,
                           uint64_t epoch, const uint64_t *ids, uint32_t n,
                           const struct dh_media_plan *p, uint8_t *dst,
                           size_t dst_len, size_t *used, int32_t *valid_frames,
                           uint32_t *failed_at, struct dh_err *e)
{
    size_t off = dh_packed_table_bytes(n);
    struct dh_packed_entry en = {0};
    struct dh_err sub;
    int rc;

    if ((rc = check_args(ix, ids, n, p, dst_len, e)))
        return rc;
    memset(dst, 0, off);
    for (uint32_t i = 0; i < n; i++) {
        const char *path = dh_index_path(ix, ids[i]);

        dh_err_clear(&sub);
        rc = path ? one_sample(m, ix, path, epoch, ids[i], p, dst, dst_len, off,
                               &en, &sub)
                  : dh_err_set(&sub, DH_EFORMAT, "no path in the index");
        dh__media_stage_note(m, i);
        if (rc) {
            if (failed_at)
                *failed_at = i;
            return dh_err_set(e, rc, "sample %llu (%s): %s",
                              (unsigned long long)ids[i], path ? path : "?",
                              sub.msg);
        }
        put_entry(dst, i, &en);
        valid_frames[i] = (int32_t)en.valid_frames;
        off += dh_packed_sample_bytes(p, en.t, en.h, en.w);
    }
    dh__put_le32(dst, DH_PACKED_MAGIC);
    dh__put_le32(dst + 4, n);
    dh__put_le64(dst + 8, off);
    *used = off;
    return 0;
}

static int bad(struct dh_err *e, const char *what, uint32_t i)
{
    return dh_err_set(e, DH_EPROTO, "packed slot: sample %u: %s", i, what);
}

int dh_packed_table_read(const uint8_t *slot, size_t len, uint32_t n,
                         uint32_t elem, struct dh_packed_entry *out,
                         struct dh_err *e)
{
    size_t end = dh_packed_table_bytes(n);
    uint64_t used;

    if (n == 0 || n > DH_BATCH_MAX_SAMPLES || len < end)
        return dh_err_set(e, DH_EPROTO,
                          "packed slot: %zu bytes cannot hold a table of "
                          "%u samples",
                          len, n);
    if (dh__get_le32(slot) != DH_PACKED_MAGIC || dh__get_le32(slot + 4) != n)
        return dh_err_set(e, DH_EPROTO,
                          "packed slot: no table of %u samples at offset 0", n);
    for (uint32_t i = 0; i < n; i++) {
        struct dh_packed_entry en;
        size_t b;

        get_entry(slot, i, &en);
        if (en.offset != end)
            return bad(e, "offset is not the previous sample's end", i);
        if (!en.t || !en.h || !en.w || en.valid_frames > en.t)
            return bad(e, "empty shape or valid_frames over T", i);
        b = sample_bytes(en.t, en.h, en.w, elem);
        if (b == SIZE_MAX || b > len - end)
            return bad(e, "runs past the slot", i);
        end += b;
    }
    used = dh__get_le64(slot + 8);
    if (used != end)
        return dh_err_set(e, DH_EPROTO,
                          "packed slot: header says %llu bytes used, the "
                          "samples end at %zu",
                          (unsigned long long)used, end);
    for (uint32_t i = 0; i < n; i++)
        get_entry(slot, i, &out[i]);
    return 0;
}
