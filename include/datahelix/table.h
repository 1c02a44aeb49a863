/*
 * datahelix/table.h - the descriptor table (DESIGN 4.2): one record per
 * sample, stored as JSONL, read and written as a stream in bounded memory.
 *
 * A descriptor is a plain value record (like struct stat), not a handle: the
 * caller owns it, dh_desc_init() / dh_desc_fini() manage the strings it owns.
 *
 * File format: one JSON object per line.  The first line may be a header
 * record `{"datahelix_header": {...}}` (version, sampling plan, token model,
 * cost-model coefficients); it is not a sample.  Unknown fields of a sample
 * are kept verbatim in `extra_json` and written back, so tools that add
 * fields survive a round trip.  Ids are dense from 0 and unique, unless a
 * reader renumbers (dh_table_reader_set_renumber): a table that lost lines
 * stays usable, with each sample's path as its stable key.
 *
 * Thread-safety: a reader or writer is used by one thread at a time;
 * different readers/writers are independent.
 */
#ifndef DATAHELIX_TABLE_H
#define DATAHELIX_TABLE_H

#include <stddef.h>
#include <stdint.h>

#include "datahelix/error.h"

/* DH_KIND_AUDIO: a file of sound alone (issue 38), no frames. */
enum dh_kind {
    DH_KIND_VIDEO = 0,
    DH_KIND_IMAGE = 1,
    DH_KIND_TEXT = 2,
    DH_KIND_AUDIO = 3
};

/* "video" / "image" / "text"; NULL for an unknown value. */
DH_API const char *dh_kind_name(enum dh_kind k);
/* Parses a kind name; returns 0 or DH_EINVAL. */
DH_API int dh_kind_parse(const char *s, enum dh_kind *out) DH_MUST_CHECK;

#define DH_CODEC_MAX 32
#define DH_PROFILE_MAX 32
#define DH_TABLE_LINE_MAX (1u << 20)       /* longest accepted JSONL line */
#define DH_TABLE_ID_MAX ((int64_t)1 << 32) /* ids must be below this */

struct dh_desc {
    int64_t id;     /* dense from 0 (see renumbering) */
    char *path;     /* owned; NULL only for inline text; a shard's path
                   when `member` is set */
    char *member;   /* owned; the media member's name in the tar shard
                       `path`, NULL when path is the file itself */
    int64_t offset; /* the member's data offset in the shard (bytes) */
    enum dh_kind kind;
    int64_t bytes;            /* file size (a member's size) */
    char codec[DH_CODEC_MAX]; /* FFmpeg codec name, "" for text */
    int32_t width, height;    /* coded size, as ffprobe reports it */
    int32_t rotation;         /* display rotation in degrees, 0 if none */
    double fps;
    double duration_s;
    int64_t frames;               /* exact: 1 for images, 0 for text */
    char *text;                   /* owned caption / text, may be NULL */
    char profile[DH_PROFILE_MAX]; /* planning bucket, e.g. "32x336" */
    double est_cpu_ms;
    int64_t est_out_bytes;
    int64_t est_tokens;
    char *extra_json; /* owned JSON object text of unknown fields,
                                     NULL if none */
    int64_t mtime_ns; /* the file's (shard's) modification time at probe,
                         ns since the epoch; 0: not recorded */
    /* The clip's main audio stream as probe found it ("" codec: none):
     * codec name, sample rate (Hz), channels, duration and start time (s,
     * on the container's clock, as the video's frames are). */
    char audio_codec[DH_CODEC_MAX];
    int32_t audio_rate, audio_channels;
    double audio_duration_s, audio_start_s;
};

/* Where a sample's bytes are: a whole local file, or a member of a tar
 * shard (WebDataset), `size` bytes of its data at byte `offset` of the
 * shard.  Messages name a member "SHARD:MEMBER". */
struct dh_source_ref {
    const char *path;   /* the file, or the shard */
    const char *member; /* the member's name; NULL: the whole file */
    int64_t offset;     /* a member's data offset in the shard */
    int64_t size;       /* a member's size in bytes; for a whole file the
                           size the table recorded (0: not checked): a
                           file of another size changed since probe */
    int64_t mtime_ns;   /* the file's (shard's) modification time the
                           table recorded (0: not checked): another one
                           means the file changed since probe */
};

/* The source of descriptor `d` (strings borrowed from it). */
DH_API void dh_desc_source(const struct dh_desc *d, struct dh_source_ref *out);

DH_API void dh_desc_init(struct dh_desc *d);
/* Frees what `d` owns and re-inits it.  Accepts NULL. */
DH_API void dh_desc_fini(struct dh_desc *d);

/*
 * Parses one JSON line into `d` (which must be init'ed; it is fini'ed first).
 * On error `d` is left init'ed-empty and `e` holds the reason (no file:line
 * prefix; the reader adds it).  Required: id, path (or text for kind text),
 * kind.  Wrong types are errors; unknown fields go to extra_json.
 */
DH_API int dh_desc_from_json(const char *line, size_t len, struct dh_desc *d,
                             struct dh_err *e) DH_MUST_CHECK;

/*
 * Serialises `d` as one compact JSON object (no newline) into a new string
 * (*out, caller frees with free()).  Returns 0, DH_ENOMEM or DH_EINVAL.
 */
DH_API int dh_desc_to_json(const struct dh_desc *d, char **out) DH_MUST_CHECK;

/* ---- streaming reader ---- */
struct dh_table_reader;

/* Opens `path` ("-" for stdin).  On success *out is the reader. */
DH_API int dh_table_reader_open(const char *path, struct dh_table_reader **out,
                                struct dh_err *e) DH_MUST_CHECK;

/*
 * Reads the next sample into `d` (init'ed by the caller; fini'ed first).
 * Returns 1 when a sample was read, 0 at the end of the table, or a negative
 * code with `e` set to "FILE:LINE: reason" (bad JSON, missing id, wrong
 * type, duplicate id, line too long).  At the end the reader checks that the
 * ids are dense from 0 and fails with the first missing id otherwise
 * (DH_EFORMAT "FILE: ids are not dense: id N is missing (...)", which says
 * how to renumber).  Blank lines are skipped.
 */
DH_API int dh_table_reader_next(struct dh_table_reader *r, struct dh_desc *d,
                                struct dh_err *e) DH_MUST_CHECK;

/*
 * Renumbering (on != 0): every sample read from now on gets as its id its
 * position among the table's samples in file order (0, 1, ...), whatever
 * its `id` field says; the field must still be a valid id, but duplicate
 * and missing ids are no longer errors.  For a table that lost lines (a bad
 * file removed by hand), so that it need not be probed again; the path, not
 * the id, is then a sample's stable key.  Call before the first
 * dh_table_reader_next().
 */
DH_API void dh_table_reader_set_renumber(struct dh_table_reader *r, int on);
/* Samples read so far whose id differs from their `id` field (0 unless
 * renumbering). */
DH_API uint64_t dh_table_reader_renumbered(const struct dh_table_reader *r);

/* JSON object text of the header record, or NULL; valid until destroy. */
DH_API const char *dh_table_reader_header(const struct dh_table_reader *r);
/* 1-based number of the line last read. */
DH_API long dh_table_reader_line(const struct dh_table_reader *r);
DH_API void dh_table_reader_destroy(struct dh_table_reader *r);

/* ---- streaming writer ---- */
struct dh_table_writer;

/*
 * Creates a writer for `path` ("-" for stdout).  Output goes to a temporary
 * file beside `path` that dh_table_writer_close() renames into place, so a
 * crash never leaves a half-written table under the final name.
 * `header_json`, if not NULL, is a JSON object written as the header record.
 */
DH_API int dh_table_writer_open(const char *path, const char *header_json,
                                struct dh_table_writer **out,
                                struct dh_err *e) DH_MUST_CHECK;
DH_API int dh_table_writer_write(struct dh_table_writer *w,
                                 const struct dh_desc *d,
                                 struct dh_err *e) DH_MUST_CHECK;
/* Flushes, renames into place and frees `w` (also on error). */
DH_API int dh_table_writer_close(struct dh_table_writer *w,
                                 struct dh_err *e) DH_MUST_CHECK;
/* Frees `w` and removes its temporary file.  Accepts NULL. */
DH_API void dh_table_writer_abort(struct dh_table_writer *w);

#endif
