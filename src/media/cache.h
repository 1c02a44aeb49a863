/*
 * cache.h - the host-local read-through cache of remote objects
 * (internal): chunks of S3 and HTTP(S) objects kept as files in one folder
 * that every DataServer (every process) of a host shares.
 *
 * - Unit: a 4 MiB chunk of an object (the chunk's bytes at index * 4 MiB;
 *   the last one shorter), named by a 128-bit hash of the object's URL, so
 *   a clip is one chunk and a 1 GiB shard is read in place a chunk at a
 *   time, never fetched whole for a member.  Beside them, the object's size
 *   as the server said it (NAME.size): an object whose size is not the
 *   table's any more (a new version) has its chunks forgotten and fetched
 *   again, and then checked against the table like any fetch.
 * - One fetch per chunk on a host: the fetching process holds the chunk's
 *   lock (flock on its .lock file); a second asker waits for it, bounded
 *   by its sample's watchdog, then reads the file.
 * - Never a half chunk: a chunk is written under a temporary name and
 *   renamed when whole, so a kill -9 mid-fetch leaves a temporary file
 *   (removed by the next eviction scan once its writer is gone) and no
 *   chunk.
 * - Bounded: when the bytes held pass the bound, one process scans the
 *   folder and removes the least recently used chunks (a hit refreshes
 *   a chunk's mtime at most once a minute) down to 90 % of it.
 * - Counted: hits, misses, bytes fetched and evictions of every process,
 *   and the bytes held, in the folder's `stats` file (shared memory
 *   counters); `dh__cache_read_stats` and Python's stats() read it.
 *
 * Set by DATAHELIX_CACHE_DIR (none: no cache) and DATAHELIX_CACHE_BYTES
 * (default 10 GiB), read once per process; `--cache-dir` / `--cache-bytes`
 * and the loaders' cache_dir= / cache_bytes= set them.
 */
#ifndef DH_MEDIA_CACHE_H
#define DH_MEDIA_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "datahelix/error.h"

#define DH_CACHE_CHUNK (4 << 20)

struct dh_cache;

struct dh_cache_stats {
    uint64_t hits, misses, fetched_bytes, evictions, bytes;
};

/* The process's cache ($DATAHELIX_CACHE_DIR), NULL when none is set (or
 * it cannot be used: the first use logs why, once). */
struct dh_cache *dh__cache_get(void);
/* The cache in `dir` (made if missing), bounded by `bound` bytes (0: 10
 * GiB); one handle per folder per process.  NULL when it cannot be used
 * (logged). */
struct dh_cache *dh__cache_open(const char *dir, uint64_t bound);

/* Fetches `len` bytes of the object into buf: the count, or a negative
 * DH_E* with e set. */
typedef int64_t (*dh_cache_fetch_fn)(void *arg, uint8_t *buf, size_t len,
                                     struct dh_err *e);

#define DH_CACHE_ETAG_MAX 160

/* The object's size the cache recorded, -1 when none; its ETag into etag
 * (DH_CACHE_ETAG_MAX bytes; "" when the server sent none). */
int64_t dh__cache_size(struct dh_cache *c, const char *url, char *etag);
/* Records them (whole or not at all). */
void dh__cache_set_size(struct dh_cache *c, const char *url, int64_t size,
                        const char *etag);
/* 1 when chunk `idx` of the object at `url` is in the cache (a stat: the
 * read-ahead's check, no bytes read). */
int dh__cache_has(struct dh_cache *c, const char *url, int64_t idx);
/* Forgets the object: its size and its chunks (of an object of `size`). */
void dh__cache_forget(struct dh_cache *c, const char *url, int64_t size);

/* Chunk `idx` of the object at `url` into buf (DH_CACHE_CHUNK bytes of
 * room): from the cache, or
 * fetched with fetch(arg, buf, want) and kept.  `want` is the chunk's
 * length where the object's end is known, else DH_CACHE_CHUNK.  overdue
 * (may be NULL) ends a wait for another process's fetch.  The bytes held
 * (> 0), or a negative DH_E*; *hit says where they came from. */
int64_t dh__cache_chunk(struct dh_cache *c, const char *url, int64_t idx,
                        size_t want, uint8_t *buf, dh_cache_fetch_fn fetch,
                        void *arg, int (*overdue)(void *), void *oarg, int *hit,
                        struct dh_err *e);

/* The folder's counters (every process's).  0, or DH_EIO. */
int dh__cache_read_stats(const char *dir, struct dh_cache_stats *out,
                         struct dh_err *e);

#endif
