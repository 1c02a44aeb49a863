/*
 * datahelix/index.h - the compact binary index (.dhx) of a descriptor table
 * (DESIGN 4.1 `datahelix index`).  Format: docs/index-format.md.
 *
 * Row i of the index is sample id i (ids are dense), so the id column is
 * implicit.  The planning columns are fixed-width arrays that a reader maps
 * straight out of the file with mmap(MAP_SHARED, PROT_READ): every process
 * on a host shares one copy in the page cache and opening costs O(1)
 * (header and section bounds only), whatever the sample count.
 *
 * Stored per sample: est_tokens (u32, saturating), est_cpu_ms (f32),
 * est_out_bytes (u64), profile (u16 index into the profile-name table),
 * frames (u32, saturating), width/height (u16, saturating), kind (u8), and
 * path / text strings.  Not stored: bytes, codec, fps, duration_s,
 * rotation, extra fields (read the JSONL table for those).
 *
 * Checksums: the header checksum is always verified on open.  The body
 * checksum (all column and string bytes) is verified only with
 * DH_INDEX_VERIFY, because it reads the whole file (~0.1-0.3 s per GB warm)
 * whereas a plain open stays O(1).  Without VERIFY, reads stay memory-safe
 * on a corrupt body: string offsets are checked per access against the
 * string table, whose last byte is checked to be NUL on open; profile and
 * kind values are checked where they are decoded (dh_index_get,
 * dh_index_profile_name).  Raw column users must bound profile values by
 * dh_index_profile_count() themselves.  Verification is NOT the default:
 * `datahelix index --verify` and loaders that want it pass the flag.
 *
 * Only little-endian hosts are supported (open fails with DH_EUNSUPPORTED
 * elsewhere).
 *
 * Thread-safety: a builder is used by one thread.  An open index is
 * immutable: every read function may be called from any number of threads
 * at once; dh_index_close() must not race with them.
 */
#ifndef DATAHELIX_INDEX_H
#define DATAHELIX_INDEX_H

#include <stddef.h>
#include <stdint.h>

#include "datahelix/error.h"
#include "datahelix/table.h"

#define DH_INDEX_FORMAT_VERSION 3u
#define DH_INDEX_PROFILE_MAX 65535u /* distinct profile names per index */

/* ---- building ---- */
struct dh_index_builder;

/* Creates an empty builder; *out owned by the caller (destroy). */
DH_API int dh_index_builder_create(struct dh_index_builder **out,
                                   struct dh_err *e) DH_MUST_CHECK;

/*
 * Stores the table's header record (a JSON object text, copied) in the
 * index, where dh_index_header() returns it.  Optional.
 */
DH_API int dh_index_builder_set_header(struct dh_index_builder *b,
                                       const char *header_json,
                                       struct dh_err *e) DH_MUST_CHECK;

/*
 * Adds sample `d` as row d->id (rows may arrive in any order; values are
 * copied).  DH_EDUP for an id already added, DH_EINVAL for a bad id or
 * kind, DH_ETOOBIG past DH_INDEX_PROFILE_MAX profiles, DH_ENOMEM.  On error
 * the builder is unchanged.
 */
DH_API int dh_index_builder_add(struct dh_index_builder *b,
                                const struct dh_desc *d,
                                struct dh_err *e) DH_MUST_CHECK;

/* Number of samples added so far. */
DH_API uint64_t dh_index_builder_count(const struct dh_index_builder *b);

/*
 * Checks that ids are dense (DH_EFORMAT "ids are not dense: id N is
 * missing" otherwise) and writes the index to `path` atomically
 * (PATH.tmp.<pid>, fsync, rename).  The builder stays valid and must still
 * be destroyed.
 */
DH_API int dh_index_builder_finish(struct dh_index_builder *b, const char *path,
                                   struct dh_err *e) DH_MUST_CHECK;

/* Frees the builder.  Accepts NULL. */
DH_API void dh_index_builder_destroy(struct dh_index_builder *b);

/* Reads a JSONL table (dh_table_reader rules) and writes its index. */
DH_API int dh_index_build_from_table(const char *jsonl_path,
                                     const char *dhx_path,
                                     struct dh_err *e) DH_MUST_CHECK;

/* dh_index_build() flags. */
#define DH_INDEX_BUILD_RENUMBER 1u /* row i = the i-th sample in file order */

/* What dh_index_build() did. */
struct dh_index_build_info {
    uint64_t samples;    /* rows written */
    uint64_t renumbered; /* rows whose id differs from the table's `id` */
};

/*
 * dh_index_build_from_table() with flags.  DH_INDEX_BUILD_RENUMBER numbers
 * the samples 0..n-1 in file order (dh_table_reader_set_renumber), so a
 * table whose ids are not dense (lines removed) or not unique still builds;
 * paths stay the samples' stable key, ids may name other samples than in
 * the table.  `info` (may be NULL) is written on success only.
 */
DH_API int dh_index_build(const char *jsonl_path, const char *dhx_path,
                          unsigned flags, struct dh_index_build_info *info,
                          struct dh_err *e) DH_MUST_CHECK;

/* ---- reading ---- */
struct dh_index;

#define DH_INDEX_VERIFY 1u /* verify the body checksum on open */

/*
 * Opens and maps `path`.  Errors: DH_ENOTFOUND / DH_EIO (open, mmap),
 * DH_EFORMAT (bad magic, sizes or offsets), DH_EVERSION (other format
 * version or unknown required flags), DH_ECHECKSUM (header, or body with
 * DH_INDEX_VERIFY), DH_ENOMEM.  On success *out is owned by the caller.
 */
DH_API int dh_index_open(const char *path, unsigned flags,
                         struct dh_index **out, struct dh_err *e) DH_MUST_CHECK;

/*
 * Same over `size` bytes at `data`, which the caller keeps alive and
 * unchanged until dh_index_close().  `data` must be 8-byte aligned.
 */
DH_API int dh_index_open_mem(const void *data, size_t size, unsigned flags,
                             struct dh_index **out,
                             struct dh_err *e) DH_MUST_CHECK;

/* Unmaps and frees.  Accepts NULL.  Invalidates every borrowed pointer. */
DH_API void dh_index_close(struct dh_index *ix);

DH_API uint64_t dh_index_count(const struct dh_index *ix);
/* Size in bytes of the mapped file. */
DH_API uint64_t dh_index_size(const struct dh_index *ix);

/* Column pointers, each `count` long, borrowed until dh_index_close(). */
struct dh_index_columns {
    uint64_t count;
    const uint32_t *est_tokens;
    const float *est_cpu_ms;
    const uint64_t *est_out_bytes;
    const uint16_t *profile; /* < dh_index_profile_count() if not corrupt */
    const uint32_t *frames;
    const uint16_t *width;
    const uint16_t *height;
    const uint8_t *kind; /* enum dh_kind values */
};
DH_API void dh_index_columns(const struct dh_index *ix,
                             struct dh_index_columns *out);

/*
 * Strings borrowed until dh_index_close().  dh_index_path() is NULL for an
 * id out of range, a sample without a path (inline text) or a corrupt
 * offset; dh_index_text() is NULL when the sample has no text.
 */
DH_API const char *dh_index_path(const struct dh_index *ix, uint64_t id);
DH_API const char *dh_index_text(const struct dh_index *ix, uint64_t id);
/* Where sample `id`'s bytes are: its file, or a member of the shard
 * dh_index_path() names (strings borrowed).  0, or DH_EINVAL for an id out
 * of range or a sample without a path, DH_EFORMAT for a corrupt offset. */
DH_API int dh_index_source(const struct dh_index *ix, uint64_t id,
                           struct dh_source_ref *out) DH_MUST_CHECK;
/* The file's (member's) size the table recorded, 0 when not known. */
DH_API uint64_t dh_index_bytes(const struct dh_index *ix, uint64_t id);

DH_API unsigned dh_index_profile_count(const struct dh_index *ix);
/* Profile name `p` ("" allowed), NULL if p is out of range. */
DH_API const char *dh_index_profile_name(const struct dh_index *ix, unsigned p);
/* Header record JSON stored by the builder, or NULL. */
DH_API const char *dh_index_header(const struct dh_index *ix);

/*
 * A 64-bit digest of what a plan over this index, and a position in that
 * plan, refer to: the sample count and, row by row, path, est_tokens and
 * profile name.  Equal digests mean the same rows name the same files with
 * the same plan inputs (a resume checkpoint's steps mean the same samples);
 * est_cpu_ms, sizes, captions and the header record are left out, so
 * re-probing or recalibrating the same files keeps it, while removing or
 * renumbering a sample changes it.  O(n); thread-safe.
 */
DH_API uint64_t dh_index_digest(const struct dh_index *ix);

/*
 * Fills `out` (init'ed by the caller; fini'ed first) with sample `id`.
 * Fields the index does not store are 0 / empty.  DH_EINVAL for an id out
 * of range, DH_EFORMAT for a corrupt row, DH_ENOMEM.
 */
DH_API int dh_index_get(const struct dh_index *ix, uint64_t id,
                        struct dh_desc *out, struct dh_err *e) DH_MUST_CHECK;

#endif
