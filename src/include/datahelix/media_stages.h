/*
 * datahelix/media_stages.h - where a media worker's time went, per sample
 * (issue 18 item 4: the critical-path trace; docs/trace.md).
 *
 * The media pipeline adds up its own time in three stages while it works:
 * read (dh_media_open and dh_media_select: stat, demux the header, build
 * the frame table, choose the frames), decode (dh_media_decode without
 * the conversion) and scale (swscale and the layout/dtype transform into
 * the slot, per frame, inside dh_media_decode).  A caller that wants them
 * per sample gives the worker a sink of rows (three floats each, in ms)
 * and, after each sample position, moves what was added up into that
 * position's row.  Without a sink the sums are only kept (a few clock
 * reads per frame: ~20 ns each) and dropped by the next note.
 */
#ifndef DATAHELIX_MEDIA_STAGES_H
#define DATAHELIX_MEDIA_STAGES_H

#include <stdint.h>

#include "datahelix/media.h"

/* DH_MS_AUDIO: a sample's sound, decoded, resampled (and its features)
 * beside its frames (issue 38). */
enum {
    DH_MS_READ = 0,
    DH_MS_DECODE = 1,
    DH_MS_SCALE = 2,
    DH_MS_AUDIO = 3,
    DH_MS_COUNT = 4
};

/* rows: n x DH_MS_COUNT floats the caller owns, or NULL (no sink).  The
 * pending sums are dropped. */
void dh__media_stage_sink(struct dh_media *m, float *rows, uint32_t n);
/* A sink of per-position read bytes beside the rows: n entries the caller
 * owns, or NULL.  What the source delivered since is counted from now. */
void dh__media_bytes_sink(struct dh_media *m, uint64_t *bytes, uint32_t n);
/* What the worker's sources have read since dh_media_create: bytes, reads
 * (calls into a source) and their time in ms. */
void dh__media_read_totals(const struct dh_media *m, uint64_t *bytes,
                           uint64_t *reads, double *ms);
/* Of those, what came from S3 / HTTP(S) (docs/remote.md): bytes fetched
 * over the network, and chunks found in / fetched into the host cache. */
void dh__media_remote_totals(const struct dh_media *m, uint64_t *fetched,
                             uint64_t *cache_hits, uint64_t *cache_misses);
/* Adds the sums since the last note into row `pos` (ignored beyond n or
 * without a sink) and resets them; the bytes read since into bytes[pos].  A
 * position decoded twice (a spare
 * after a failure) adds up both attempts. */
void dh__media_stage_note(struct dh_media *m, uint32_t pos);
/* Adds `ms` of work done outside the worker's own pipeline (a sample's
 * sound, decoded beside its frames) to `stage`. */
void dh__media_stage_add(struct dh_media *m, int stage, double ms);
/* Progress, readable from another thread while the worker decodes (a
 * pool's check for a thread blocked in a system call): the position being
 * worked on (notes so far since the sink was set) and when the worker last
 * showed progress (the sink set, a sample opened, a position noted;
 * CLOCK_MONOTONIC ms, 0: never). */
void dh__media_progress(const struct dh_media *m, uint32_t *pos,
                        uint64_t *since_ms);

#endif
