/*
 * prefetch.c - read-ahead of remote samples into the host cache (see
 * prefetch.h).
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/log.h"
#include "core/url.h"
#include "media/cache.h"
#include "media/prefetch.h"
#include "media/source.h"

#define MAX_THREADS 16
#define WAKE_MS 200

/* A queued piece of work: a sample (chunk < 0: all of it, to be split)
 * or one chunk of its object. */
struct item {
    uint64_t id;
    int64_t chunk;
};

struct dh_prefetch {
    const struct dh_index *ix;
    struct dh_cache *cache;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct item ring[DH_PREFETCH_MAX];
    size_t head, count;
    _Atomic int stopping;
    unsigned nthreads;
    pthread_t threads[MAX_THREADS];
    _Atomic uint64_t samples, chunks;
};

static int stop_requested(void *arg)
{
    return atomic_load(&((struct dh_prefetch *)arg)->stopping);
}

/* The object bytes [first, end) sample `id` reads: 0, or -1 when it is
 * not remote (or not known). */
static int sample_span(struct dh_prefetch *p, uint64_t id,
                       struct dh_source_ref *ref, int64_t *first, int64_t *end)
{
    if (dh_index_source(p->ix, id, ref) ||
        dh__url_kind(ref->path) == DH_URL_NONE)
        return -1;
    *first = ref->member ? ref->offset : 0;
    *end = ref->member ? ref->offset + ref->size
                       : (int64_t)dh_index_bytes(p->ix, id);
    if (*end <= *first)
        *end = *first + 1; /* size not known: the first chunk, at least */
    return 0;
}

/* Chunk c of sample `id`'s object into the cache, unless it is there (a
 * stat): reading one byte of it makes the source fetch the chunk. */
static void fetch_chunk(struct dh_prefetch *p, struct dh_source *s, uint64_t id,
                        int64_t c)
{
    struct dh_source_ref ref;
    struct dh_err e;
    int64_t first, end, at, misses0 = s->cache_misses;
    uint8_t one;

    if (sample_span(p, id, &ref, &first, &end) ||
        dh__cache_has(p->cache, ref.path, c))
        return;
    at = c * DH_CACHE_CHUNK > first ? c * DH_CACHE_CHUNK : first;
    dh_err_clear(&e);
    if (dh__source_open(s, &ref, &e))
        return; /* the worker will meet the error and report it */
    if (at - s->base < s->size)
        (void)dh__source_read(s, at - s->base, &one, 1, &e);
    dh__source_close(s);
    atomic_fetch_add(&p->chunks, (uint64_t)(s->cache_misses - misses0));
}

/* Puts items at the front (they are due first): the chunks after a
 * sample's first, fetched by the other threads while this one fetches
 * the first (a large object in parallel ranges).  With p->mu held. */
static void push_front(struct dh_prefetch *p, uint64_t id, int64_t from,
                       int64_t to)
{
    for (int64_t c = to - 1; c >= from; c--) {
        if (p->count == DH_PREFETCH_MAX)
            return; /* full: the rest is read by the worker itself */
        p->head = (p->head + DH_PREFETCH_MAX - 1) % DH_PREFETCH_MAX;
        p->ring[p->head] = (struct item){id, c};
        p->count++;
    }
}

/* A sample popped: its first chunk here, the others queued first. */
static void fetch_sample(struct dh_prefetch *p, struct dh_source *s,
                         uint64_t id)
{
    struct dh_source_ref ref;
    int64_t first, end, c0, c1;

    if (sample_span(p, id, &ref, &first, &end))
        return;
    c0 = first / DH_CACHE_CHUNK;
    c1 = (end - 1) / DH_CACHE_CHUNK + 1;
    if (c1 - c0 > 1) {
        pthread_mutex_lock(&p->mu);
        push_front(p, id, c0 + 1, c1);
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
    fetch_chunk(p, s, id, c0);
    atomic_fetch_add(&p->samples, 1);
}

static void *prefetch_main(void *arg)
{
    struct dh_prefetch *p = arg;
    struct dh_source s;

    dh__source_init(&s);
    s.cache = p->cache;
    s.overdue = stop_requested;
    s.overdue_arg = p;
    for (;;) {
        struct item it;

        pthread_mutex_lock(&p->mu);
        while (!p->count && !atomic_load(&p->stopping)) {
            struct timespec d;

            dh__mono_deadline(&d, WAKE_MS);
            pthread_cond_timedwait(&p->cv, &p->mu, &d);
        }
        if (atomic_load(&p->stopping)) {
            pthread_mutex_unlock(&p->mu);
            break;
        }
        it = p->ring[p->head];
        p->head = (p->head + 1) % DH_PREFETCH_MAX;
        p->count--;
        pthread_mutex_unlock(&p->mu);
        if (it.chunk < 0)
            fetch_sample(p, &s, it.id);
        else
            fetch_chunk(p, &s, it.id, it.chunk);
    }
    dh__source_fini(&s);
    return NULL;
}

int dh__prefetch_create(const struct dh_index *ix, struct dh_cache *cache,
                        struct dh_prefetch **out, struct dh_err *e)
{
    const char *v = getenv("DATAHELIX_PREFETCH_THREADS");
    long n = v && *v ? strtol(v, NULL, 10) : 4;
    struct dh_prefetch *p;
    pthread_condattr_t ca;

    *out = NULL;
    if (!cache)
        cache = dh__cache_get();
    if (n <= 0 || !cache)
        return 0;
    if (n > MAX_THREADS)
        n = MAX_THREADS;
    if (!(p = dh__calloc(1, sizeof(*p))))
        return dh_err_set(e, DH_ENOMEM, "prefetch: out of memory");
    p->ix = ix;
    p->cache = cache;
    pthread_mutex_init(&p->mu, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&p->cv, &ca);
    pthread_condattr_destroy(&ca);
    for (long i = 0; i < n; i++) {
        if (pthread_create(&p->threads[i], NULL, prefetch_main, p))
            break;
        p->nthreads++;
    }
    if (!p->nthreads) {
        dh__prefetch_destroy(p);
        return dh_err_set(e, DH_EIO, "prefetch: cannot start a thread");
    }
    *out = p;
    return 0;
}

void dh__prefetch_push(struct dh_prefetch *p, const uint64_t *ids, size_t n)
{
    if (!p || !n)
        return;
    pthread_mutex_lock(&p->mu);
    for (size_t i = 0; i < n; i++) {
        if (p->count == DH_PREFETCH_MAX) { /* the oldest is due first */
            p->head = (p->head + 1) % DH_PREFETCH_MAX;
            p->count--;
        }
        p->ring[(p->head + p->count) % DH_PREFETCH_MAX] = (struct item){ids[i],
                                                                        -1};
        p->count++;
    }
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

void dh__prefetch_counts(struct dh_prefetch *p, uint64_t *samples,
                         uint64_t *chunks)
{
    *samples = p ? atomic_load(&p->samples) : 0;
    *chunks = p ? atomic_load(&p->chunks) : 0;
}

void dh__prefetch_destroy(struct dh_prefetch *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stopping, 1);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    /* a fetch in progress sees `stopping` in libcurl's progress callback
     * (about once a second at worst) and in its backoff sleeps */
    for (unsigned i = 0; i < p->nthreads; i++)
        pthread_join(p->threads[i], NULL);
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    dh__free(p);
}
