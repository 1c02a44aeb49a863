/*
 * media_none.c - the media calls the runtime makes, for `datahelix-svc`
 * (main_svc.c), which links no FFmpeg so that it starts in a few ms.
 * Its commands decode nothing: a DataServer of Python workers never
 * creates a media context.  A video DataServer started with it fails at
 * its start with the reason, before any sample is taken.
 */
#include <stddef.h>

#include "datahelix/audio.h"
#include "datahelix/media.h"
#include "datahelix/media_stages.h"
#include "media/cache.h"
#include "media/prefetch.h"

int dh_media_create(struct dh_media **out, struct dh_err *e)
{
    *out = NULL;
    return dh_err_set(e, DH_EUNSUPPORTED,
                      "datahelix-svc decodes no media (it is linked without "
                      "FFmpeg, for the Coordinator and DataServers of "
                      "Python workers): run `datahelix dataserver` for "
                      "video");
}

/* Nothing below is reached without a media context. */
void dh_media_destroy(struct dh_media *m)
{
    (void)m;
}

void dh_media_set_watchdog(struct dh_media *m, int ms)
{
    (void)m;
    (void)ms;
}

static int no_media(struct dh_err *e)
{
    return dh_err_set(e, DH_EUNSUPPORTED, "datahelix-svc decodes no media");
}

int dh_media_open(struct dh_media *m, const char *path, struct dh_err *e)
{
    (void)m;
    (void)path;
    return no_media(e);
}

int dh_media_open_ref(struct dh_media *m, const struct dh_source_ref *ref,
                      struct dh_err *e)
{
    (void)m;
    (void)ref;
    return no_media(e);
}

void dh_media_close(struct dh_media *m)
{
    (void)m;
}

int dh_media_info(const struct dh_media *m, struct dh_media_info *out)
{
    (void)m;
    (void)out;
    return DH_EUNSUPPORTED;
}

int dh_media_select(struct dh_media *m, const struct dh_media_plan *p,
                    int64_t *out_frames, struct dh_err *e)
{
    (void)m;
    (void)p;
    (void)out_frames;
    return no_media(e);
}

int dh_media_decode(struct dh_media *m, const struct dh_media_plan *p,
                    void *dst, size_t dst_len, struct dh_media_result *res,
                    struct dh_err *e)
{
    (void)m;
    (void)p;
    (void)dst;
    (void)dst_len;
    (void)res;
    return no_media(e);
}

void dh__media_stage_sink(struct dh_media *m, float *rows, uint32_t n)
{
    (void)m;
    (void)rows;
    (void)n;
}

void dh__media_bytes_sink(struct dh_media *m, uint64_t *bytes, uint32_t n)
{
    (void)m;
    (void)bytes;
    (void)n;
}

void dh__media_read_totals(const struct dh_media *m, uint64_t *bytes,
                           uint64_t *reads, double *ms)
{
    (void)m;
    *bytes = *reads = 0;
    *ms = 0;
}

void dh__media_remote_totals(const struct dh_media *m, uint64_t *fetched,
                             uint64_t *cache_hits, uint64_t *cache_misses)
{
    (void)m;
    *fetched = *cache_hits = *cache_misses = 0;
}

void dh__media_progress(const struct dh_media *m, uint32_t *pos,
                        uint64_t *since_ms)
{
    (void)m;
    *pos = 0;
    *since_ms = 0;
}

void dh__media_stage_note(struct dh_media *m, uint32_t pos)
{
    (void)m;
    (void)pos;
}

void dh__media_stage_add(struct dh_media *m, int stage, double ms)
{
    (void)m;
    (void)stage;
    (void)ms;
}

int dh__media_span(const struct dh_media *m, const struct dh_media_plan *p,
                   double *start_s, double *end_s)
{
    (void)m;
    (void)p;
    *start_s = *end_s = 0;
    return DH_EUNSUPPORTED;
}

int dh_audio_decode_into(const struct dh_source_ref *ref,
                         const struct dh_audio_opts *o, float *const dst[2],
                         int64_t cap, int64_t *n, int *missing,
                         struct dh_err *e)
{
    (void)ref;
    (void)o;
    (void)dst;
    (void)cap;
    *n = 0;
    *missing = 0;
    return no_media(e);
}

int dh_audio_features(const float *x, int64_t n, int rate,
                      const struct dh_audio_features *c, float *out,
                      struct dh_err *e)
{
    (void)x;
    (void)n;
    (void)rate;
    (void)c;
    (void)out;
    return no_media(e);
}

/* No read-ahead, no cache without the media layer (prefetch.h). */
struct dh_cache *dh__cache_open(const char *dir, uint64_t bound)
{
    (void)dir;
    (void)bound;
    return NULL;
}

int dh__prefetch_create(const struct dh_index *ix, struct dh_cache *cache,
                        struct dh_prefetch **out, struct dh_err *e)
{
    (void)ix;
    (void)cache;
    (void)e;
    *out = NULL;
    return 0;
}

void dh__prefetch_push(struct dh_prefetch *p, const uint64_t *ids, size_t n)
{
    (void)p;
    (void)ids;
    (void)n;
}

void dh__prefetch_counts(struct dh_prefetch *p, uint64_t *samples,
                         uint64_t *chunks)
{
    (void)p;
    *samples = *chunks = 0;
}

void dh__prefetch_destroy(struct dh_prefetch *p)
{
    (void)p;
}
