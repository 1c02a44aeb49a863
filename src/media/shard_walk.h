/*
 * shard_walk.h - walks the members of a tar shard in place (internal):
 * each regular file's name, data offset and size, read header by header
 * through a source (source.h), so only the headers' bytes are read.
 *
 * A shard that is cut short or whose header is corrupt stops the walk at
 * that member, after every good member before it was given: the caller
 * learns the shard, the member and the cause.  Offsets only grow, so the
 * walk ends on any input.
 */
#ifndef DH_MEDIA_SHARD_WALK_H
#define DH_MEDIA_SHARD_WALK_H

#include <stdint.h>

#include "datahelix/error.h"

/* One regular member; returns 0 to go on, non-zero to stop the walk with
 * that code (the callback sets `e`). */
typedef int (*dh_shard_member_fn)(void *arg, const char *name, int64_t offset,
                                  int64_t size, struct dh_err *e);

/*
 * Calls `fn` for each regular file of the shard at `path`, in archive
 * order.  0 when the whole shard was read; DH_EFORMAT / DH_EMEDIA when a
 * header is corrupt or a member is cut short (`e`: "PATH: member 'M' ...:
 * cause"), after the members before it; DH_EIO when the shard cannot be
 * read; the callback's code when it stopped the walk.
 */
int dh__shard_walk(const char *path, dh_shard_member_fn fn, void *arg,
                   struct dh_err *e) DH_MUST_CHECK;

/* 1 when the regular file at `path` starts with a tar header (ustar or GNU
 * magic and a valid checksum): a shard, whatever its name. */
int dh__shard_sniff(const char *path);

/* Reads a small member (a caption, JSON metadata) of at most `max` bytes
 * into a new NUL-terminated string (*out; dh__free).  DH_ETOOBIG over max. */
int dh__shard_read_member(const char *path, const char *member, int64_t offset,
                          int64_t size, int64_t max, char **out,
                          struct dh_err *e) DH_MUST_CHECK;

#endif
