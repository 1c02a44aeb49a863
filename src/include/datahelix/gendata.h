/*
 * datahelix/gendata.h - synthetic heterogeneous video sets (`gen-data`).
 *
 * Writes real, decodable MP4 files (H.264 via libx264 when the linked FFmpeg
 * has it, else MPEG-4 Part 2) whose resolutions and lengths follow the
 * paper's Kinetics mixes: "mixed alternates 16-frame 224p, 32-frame 336p,
 * and 64-frame 448p samples".  Output is a pure function of the options:
 * the same options give byte-identical files.  docs/gen-data.md has the
 * content model and the profile table.
 *
 * Thread-safety: every function here is reentrant (no shared mutable state);
 * dh_gen_data() runs on the calling thread and may be called concurrently
 * for different output directories.
 */
#ifndef DATAHELIX_GENDATA_H
#define DATAHELIX_GENDATA_H

#include <stdint.h>

#include "datahelix/error.h"

/* Frame rate and GOP of every generated file. */
#define DH_GEN_FPS 25
#define DH_GEN_GOP 50
/* Upper bounds of dh_gen_opts.count and of a parsed profile list. */
#define DH_GEN_MAX_COUNT 100000
#define DH_GEN_MAX_LIST 64

/* One resolution/length bucket.  Instances are static and immutable. */
struct dh_gen_profile {
    const char *name; /* "S", "M", "L", "XL" */
    int width;
    int height;
    double seconds; /* nominal duration; each file is jittered +-20% */
};

/* A parsed `--profiles` list, cycled through in order.  Caller-owned. */
struct dh_gen_profile_list {
    int n;
    const struct dh_gen_profile *p[DH_GEN_MAX_LIST];
};

struct dh_gen_opts {
    const char *out_dir;  /* created with parents if missing */
    const char *profiles; /* comma list of S,M,L,XL,mixed; NULL = "mixed" */
    int64_t count;        /* files to write, 1..DH_GEN_MAX_COUNT */
    uint64_t seed;
    int captions; /* non-zero: also write out_dir/captions.jsonl */
    /* Optional; called on the calling thread after each finished file. */
    void (*progress)(void *ctx, int64_t done, int64_t total);
    void *progress_ctx;
    /* Non-zero: draw each frame's index over its top rows (12 bits between
     * two marker blocks, docs/gen-data.md "Frame stamp"), so tests can read
     * back which frame a decoder returned.  0 (default): files unchanged. */
    int stamp;
};

struct dh_gen_stats {
    int64_t files;       /* files written under their final names */
    uint64_t bytes;      /* their total size (captions not included) */
    int64_t frames;      /* frames encoded in all files */
    const char *encoder; /* static string: "libx264" or "mpeg4" */
};

/*
 * Looks up a profile by name (case-insensitive: "s", "XL", ...).  Returns a
 * pointer to static storage, valid for the life of the process, or NULL if
 * the name is unknown ("mixed" is a list, not a profile: NULL).
 */
const struct dh_gen_profile *dh_gen_profile_find(const char *name);

/*
 * Parses a comma list such as "S,M,L", "mixed" (= S,M,L) or "mixed,XL" into
 * `out`.  Names are case-insensitive; empty items are rejected.  Errors:
 * DH_EINVAL (unknown name, empty item; the message names it), DH_ETOOBIG
 * (more than DH_GEN_MAX_LIST entries after expansion).  `out` is written
 * only on success.
 */
DH_MUST_CHECK int dh_gen_profiles_parse(const char *spec,
                                        struct dh_gen_profile_list *out,
                                        struct dh_err *e);

/*
 * Number of frames file `index` of a set with `seed` gets for profile `p`:
 * round(p->seconds * DH_GEN_FPS * j), j in [0.8, 1.2] a deterministic
 * function of (seed, index).  Pure; always >= 1.
 */
int64_t dh_gen_file_frames(const struct dh_gen_profile *p, uint64_t seed,
                           int64_t index);

/*
 * Writes o->count files DIR/NNNNNN_<profile>.mp4 (and captions.jsonl when
 * asked) into o->out_dir.  Each file is written to a hidden temporary name
 * and renamed into place, so a killed run never leaves a partial file under
 * a final name; existing files of the same names are replaced.
 *
 * Returns 0, or DH_EINVAL (bad options), DH_EIO (directory or file I/O),
 * DH_EMEDIA (encoder/muxer failure), DH_ENOMEM; `e` then names the file and
 * the cause.  `st` (may be NULL) is filled on success and on failure with
 * what was finished before the failure.
 */
DH_MUST_CHECK int dh_gen_data(const struct dh_gen_opts *o,
                              struct dh_gen_stats *st, struct dh_err *e);

#endif
