/*
 * source.h - where a sample's bytes come from (internal): one small table
 * of operations (open, read at an offset, close) under the media layer,
 * as nng does for its transports.  FFmpeg reads every input through one
 * AVIOContext over a dh_source (media_open.c, probe.c), so a demuxer
 * touches only the bytes it asks for.
 *
 * Backends: a local file, a member of a tar shard (a byte range of a local
 * file: the same backend with a window), a buffer in memory, and an object
 * over HTTP(S) (source_http.c: ranged GETs on libcurl; a remote shard's
 * member is a window of it).  What a backend caches per worker lives in the
 * dh_source, which a media worker keeps across files: the file backend
 * keeps the shard it read last open, so the members of one shard cost one
 * open(2) between them; the HTTP backend keeps its connection and its
 * read-ahead blocks.
 *
 * Designed for sources whose reads cost 20-100 ms (the object-storage
 * backends plug in here): read_at() takes any offset, so a backend can
 * serve the AVIO buffer's reads from a read-ahead window of its own and
 * answer an MP4's tail read (moov at the end) with one ranged request.
 * Every read is bounded by the sample's watchdog: read_at() is given the
 * deadline and a backend that can block must give up by then.
 *
 * Thread-safety: one dh_source per media worker (thread).
 */
#ifndef DH_MEDIA_SOURCE_H
#define DH_MEDIA_SOURCE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>

#include <libavformat/avio.h>

#include "datahelix/error.h"
#include "datahelix/media.h"

struct dh_source;
struct dh_remote; /* the HTTP backend's per-worker state (source_http.c) */
struct dh_cache;  /* the host-local cache (cache.h) */

struct dh_source_ops {
    /* Opens `ref` (the previous input is closed).  Sets s->size.  DH_E*
     * with `e` naming the input and the cause. */
    int (*open)(struct dh_source *s, const struct dh_source_ref *ref,
                struct dh_err *e);
    /* Up to len bytes at off into buf, 0 < len <= s->size - off (the
     * caller clips): the count, or a negative DH_E* with `e` set. */
    int64_t (*read_at)(struct dh_source *s, int64_t off, void *buf, size_t len,
                       struct dh_err *e);
    /* Ends the input; what the backend caches per worker may stay
     * (dh__source_fini frees it). */
    void (*close)(struct dh_source *s);
};

struct dh_source {
    const struct dh_source_ops *ops; /* NULL: nothing open */
    char *name;                      /* "path" or "shard.tar:member" */
    size_t name_cap;
    int64_t size; /* bytes of the open input */
    int64_t pos;  /* the AVIO read position */
    /* file backend: the file (or shard) kept open */
    int fd;        /* -1: none */
    char *fd_path; /* "" when no fd is kept; its buffer stays */
    size_t fd_path_cap;
    dev_t dev;
    ino_t ino;
    int64_t base; /* a member's data offset in its shard */
    int keep_fd;  /* a shard: keep the fd for its next member */
    /* memory backend */
    const uint8_t *data;
    /* remote backends: connection and read-ahead kept across objects */
    struct dh_remote *remote;
    struct dh_cache *cache; /* NULL: the process's (cache.h), if any */
    /* counters, added up since the source was made: bytes given to the
     * reader, reads; remote: bytes fetched, requests, retries among them */
    int64_t bytes, reads;
    int64_t fetched, requests, retries, cache_hits, cache_misses;
    double read_ms;
    /* reads through AVIO (dh__source_avio) */
    int (*overdue)(void *arg); /* non-zero: the watchdog fired; may be NULL */
    void *overdue_arg;
    struct dh_err err; /* why a read failed (FFmpeg only hears EIO) */
    int failed;
};

extern const struct dh_source_ops dh__http_source_ops;
void dh__remote_free(struct dh_remote *r);

/* Every object under an s3://BUCKET/PREFIX (ListObjectsV2, page by page,
 * signed like the reads): fn(arg, key, size) per object, in the store's
 * (lexicographic) order; fn's non-zero return stops it.  0, fn's return,
 * or a negative DH_E* with e naming the prefix and the cause. */
int dh__s3_list(const char *prefix_url,
                int (*fn)(void *arg, const char *key, int64_t size), void *arg,
                struct dh_err *e);

void dh__source_init(struct dh_source *s);
void dh__source_fini(struct dh_source *s);

/* Opens `ref` through the backend its path names: a local file, an
 * http(s):// object (either whole or a shard member's window of it); an
 * s3:// or other URL is DH_EUNSUPPORTED.  dh__source_open_mem() opens a
 * buffer instead (len bytes, `name` in messages). */
/* A file's modification time as a table records it (mtime_ns); 0 (not
 * recorded, not checked) for a time before 1970, which the table's field
 * cannot hold. */
static inline int64_t dh__mtime_ns(const struct stat *st)
{
    int64_t t = (int64_t)st->st_mtim.tv_sec * 1000000000 + st->st_mtim.tv_nsec;

    return t > 0 ? t : 0;
}

int dh__source_open(struct dh_source *s, const struct dh_source_ref *ref,
                    struct dh_err *e) DH_MUST_CHECK;
int dh__source_open_mem(struct dh_source *s, const void *data, size_t len,
                        const char *name, struct dh_err *e) DH_MUST_CHECK;
void dh__source_close(struct dh_source *s);

/* read_at() clipped to the input, with the counters kept: the count, 0 at
 * the end, or a negative DH_E* with `e` set. */
int64_t dh__source_read(struct dh_source *s, int64_t off, void *buf, size_t len,
                        struct dh_err *e);

/* An AVIOContext over `s` reading from position 0 (s->pos), seekable,
 * with a buffer of `buf` bytes; NULL when out of memory.  Free it with
 * dh__source_avio_free(). */
AVIOContext *dh__source_avio(struct dh_source *s, int buf);
void dh__source_avio_free(AVIOContext **pb);

/* An FFmpeg call on the input over dh__source_avio() failed with averr:
 * the source's own error where one of its reads failed, else "NAME:
 * reason" (with the hint for a playlist's name, dh__av_list_hint). */
int dh__source_input_error(struct dh_source *s, int averr, struct dh_err *e);

#endif
