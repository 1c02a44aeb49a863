/*
 * media_stages.c - per-sample stage sums of a media worker (see
 * datahelix/media_stages.h).  The sums are added where the work is done
 * (media_open.c, media_decode.c, media_scale.c); this file moves them
 * into the caller's rows.
 */
#include <stdatomic.h>
#include <string.h>

#include "datahelix/media_stages.h"
#include "core/clock.h"
#include "media/media_internal.h"

void dh__media_stage_sink(struct dh_media *m, float *rows, uint32_t n)
{
    atomic_store(&m->progress_pos, 0);
    atomic_store(&m->progress_ms, dh__mono_ms());
    m->stage_rows = rows;
    m->stage_n = rows ? n : 0;
    memset(m->stage_ms, 0, sizeof(m->stage_ms));
}

void dh__media_bytes_sink(struct dh_media *m, uint64_t *bytes, uint32_t n)
{
    m->stage_bytes = bytes;
    m->bytes_n = bytes ? n : 0;
    m->bytes_mark = m->src.bytes;
}

void dh__media_read_totals(const struct dh_media *m, uint64_t *bytes,
                           uint64_t *reads, double *ms)
{
    *bytes = (uint64_t)m->src.bytes;
    *reads = (uint64_t)m->src.reads;
    *ms = m->src.read_ms;
}

void dh__media_remote_totals(const struct dh_media *m, uint64_t *fetched,
                             uint64_t *cache_hits, uint64_t *cache_misses)
{
    *fetched = (uint64_t)m->src.fetched;
    *cache_hits = (uint64_t)m->src.cache_hits;
    *cache_misses = (uint64_t)m->src.cache_misses;
}

void dh__media_progress(const struct dh_media *m, uint32_t *pos,
                        uint64_t *since_ms)
{
    *pos = atomic_load(&m->progress_pos);
    *since_ms = atomic_load(&m->progress_ms);
}

void dh__media_stage_note(struct dh_media *m, uint32_t pos)
{
    atomic_store(&m->progress_pos, pos + 1);
    atomic_store(&m->progress_ms, dh__mono_ms());
    if (m->stage_bytes && pos < m->bytes_n)
        m->stage_bytes[pos] += (uint64_t)(m->src.bytes - m->bytes_mark);
    m->bytes_mark = m->src.bytes;
    /* decode was timed around the whole call, conversion included */
    double dec = m->stage_ms[DH_MS_DECODE] - m->stage_ms[DH_MS_SCALE];

    if (m->stage_rows && pos < m->stage_n) {
        float *row = m->stage_rows + (size_t)pos * DH_MS_COUNT;

        row[DH_MS_READ] += (float)m->stage_ms[DH_MS_READ];
        row[DH_MS_DECODE] += (float)(dec > 0 ? dec : 0);
        row[DH_MS_SCALE] += (float)m->stage_ms[DH_MS_SCALE];
        row[DH_MS_AUDIO] += (float)m->stage_ms[DH_MS_AUDIO];
    }
    memset(m->stage_ms, 0, sizeof(m->stage_ms));
}

void dh__media_stage_add(struct dh_media *m, int stage, double ms)
{
    if (stage >= 0 && stage < DH_MS_COUNT && ms > 0)
        m->stage_ms[stage] += ms;
}
