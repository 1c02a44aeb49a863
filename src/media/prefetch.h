/*
 * prefetch.h - read-ahead of remote samples into the host cache
 * (internal).  A DataServer's jobs arrive ahead of their deadlines (the
 * client requests `prefetch` steps ahead, in step order); while its
 * workers decode the samples in hand, a few fetch threads bring the chunks
 * of the queued samples' S3 / HTTP(S) objects into the host-local cache
 * (cache.h), in the order the jobs arrived: the deadline order.  A worker
 * then reads a chunk from local disk, or waits on the chunk's lock for a
 * fetch already under way: never a second request for it.
 *
 * A sample whose object spans several 4 MiB chunks is split: the thread
 * that takes it fetches the first chunk and puts the others first in the
 * queue, where the other threads take them at once - a large object is
 * read in parallel ranges.
 *
 * Only with a cache (the cache's bytes are where the read-ahead goes: the
 * memory used is the fetch threads' blocks, not the read-ahead depth);
 * local rows are passed over.  The queue holds at most DH_PREFETCH_MAX
 * samples; past it the oldest are dropped (they are the next to be
 * decoded: fetching them now would race the worker).
 */
#ifndef DH_MEDIA_PREFETCH_H
#define DH_MEDIA_PREFETCH_H

#include <stddef.h>
#include <stdint.h>

#include "datahelix/error.h"
#include "datahelix/index.h"

#define DH_PREFETCH_MAX 1024

struct dh_prefetch;

struct dh_cache;

/* Fetch threads (DATAHELIX_PREFETCH_THREADS, default 4, 0: none) over the
 * samples of ix into `cache` (NULL: the process's): *out NULL when there
 * is no cache or no thread. */
int dh__prefetch_create(const struct dh_index *ix, struct dh_cache *cache,
                        struct dh_prefetch **out,
                        struct dh_err *e) DH_MUST_CHECK;
/* Queues samples for read-ahead (never blocks). */
void dh__prefetch_push(struct dh_prefetch *p, const uint64_t *ids, size_t n);
/* Samples read ahead so far, and chunks they fetched. */
void dh__prefetch_counts(struct dh_prefetch *p, uint64_t *samples,
                         uint64_t *chunks);
/* Stops the threads: a fetch in progress is cut at once (bounded). */
void dh__prefetch_destroy(struct dh_prefetch *p);

#endif
