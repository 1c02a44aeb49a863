/*
 * datahelix/probe.h - turns media files into descriptors (DESIGN 4.1
 * `datahelix probe`, 4.2): container headers through libavformat, exact
 * frame counts, input expansion (files, folders, JSONL lists), and the
 * calibration decode that fits the CPU-cost model.
 *
 * Thread-safety: every function may run concurrently on different
 * arguments (probe workers do).  A dh_probe_list is not shared while built.
 */
#ifndef DATAHELIX_PROBE_H
#define DATAHELIX_PROBE_H

#include <stddef.h>
#include <stdint.h>

#include "datahelix/error.h"
#include "datahelix/table.h"

/*
 * Probes one file into `d` (init'ed by the caller; fini'ed first): path,
 * kind, bytes, codec, width, height, rotation, fps, duration_s, frames.
 * Frames come from the container index where it has one (MP4/MOV) and
 * otherwise by counting the video stream's packets, so they equal
 * `ffprobe -count_packets`.  `.txt` files are kind text.  Leaves id, text
 * and the estimates alone.  On error `e` names the file and FFmpeg's reason.
 */
int dh_probe_file(const char *path, struct dh_desc *d,
                  struct dh_err *e) DH_MUST_CHECK;

/* What the cheap checks of one probe could not establish. */
struct dh_probe_notes {
    int unchecked; /* 1: nothing in the file (no index, no duration, no
                      frame count) can tell a cut-off file from a whole
                      one; only a full decode (dh_media_verify) can */
};

/* dh_probe_file(), also filling `notes` (may be NULL). */
int dh_probe_file_notes(const char *path, struct dh_desc *d,
                        struct dh_probe_notes *notes,
                        struct dh_err *e) DH_MUST_CHECK;

/* dh_probe_file_notes() of a file or a tar shard's member (read in place:
 * the row gets path = the shard, member, offset and bytes = its size). */
int dh_probe_ref_notes(const struct dh_source_ref *ref, struct dh_desc *d,
                       struct dh_probe_notes *notes,
                       struct dh_err *e) DH_MUST_CHECK;

/* The audio_* fields of `d` from the main audio stream of `ref` (a
 * WebDataset key's KEY.wav beside its clip); DH_EMEDIA if it has none. */
int dh_probe_audio_ref(const struct dh_source_ref *ref, struct dh_desc *d,
                       struct dh_err *e) DH_MUST_CHECK;

/* One input sample: a path (or a shard and its member) and an optional
 * caption. */
struct dh_probe_item {
    char *path;
    char *text;
    char *member; /* NULL: path is the file */
    int64_t offset, size;
    char *name;       /* "SHARD:MEMBER" for a member (messages, caches); NULL
                   for a file: its path is its name */
    char *extra_json; /* fields for the row beside the probed ones (a
                         shard key's audio member), or NULL */
    /* A table row's "bytes" and "mtime_ns" for a whole file (0: none):
     * what `decode TABLE` checks the file against; probe reads the file
     * as it is now. */
    int64_t row_size, row_mtime_ns;
    /* a shard key's audio member beside its media (KEY.wav), or NULL */
    char *audio_member;
    int64_t audio_offset, audio_size;
};

/* The name of an item in messages and caches. */
static inline const char *dh_probe_item_name(const struct dh_probe_item *it)
{
    return it->name ? it->name : it->path;
}

/* The expanded input list; owns its strings. */
struct dh_probe_list {
    struct dh_probe_item *items;
    size_t count;
    size_t cap;
    /* What a shard held that is not a sample, or where it was damaged:
     * one message each, for the caller to report as failures (the good
     * members are in items). */
    char **problems;
    size_t nproblems, problems_cap;
    size_t shards; /* tar shards expanded */
};

void dh_probe_list_init(struct dh_probe_list *l);
void dh_probe_list_fini(struct dh_probe_list *l);

/*
 * Adds one command-line INPUT: a regular file (probed whatever its
 * extension, except `.jsonl`, read as a list of {"path", "text"} objects
 * with paths relative to the list's folder), or a folder, walked
 * recursively in sorted order, keeping files with a media or text
 * extension and skipping hidden entries and `.jsonl` files.  A tar shard
 * (a `.tar` name, or a file that starts with a tar header) anywhere among
 * them is expanded in place into one item per WebDataset key (docs/shards.md):
 * its video or image member, its caption from `KEY.txt` or the `caption` /
 * `text` of `KEY.json`; a damaged shard keeps its good members and adds
 * a problem naming the shard and the member.
 * A missing input or an unreadable list is an error naming it; a folder
 * with no media gives DH_EEMPTY.
 */
int dh_probe_list_add_input(struct dh_probe_list *l, const char *input,
                            struct dh_err *e) DH_MUST_CHECK;

/*
 * Calibration: runs the media pipeline (media.h) on `d` with one decoder
 * thread and the probe's sampling plan `plan` (a fixed size as the default
 * centre crop, native size as displayed), and returns the CPU time of open,
 * select and decode in *cpu_ms.
 */
struct dh_sample_plan;
int dh_calibrate_decode(const struct dh_desc *d,
                        const struct dh_sample_plan *plan, double *cpu_ms,
                        struct dh_err *e) DH_MUST_CHECK;

#endif
