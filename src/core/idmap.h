/*
 * idmap.h - a map from u64 ids (task ids, any value, 0 included) to small
 * fixed-size values stored inline (internal).  The one hash table behind
 * the client's reorder buffer, the Coordinator's in-flight table and its
 * task index.
 *
 * Design notes:
 *   - Open addressing, linear probing from dh__mix64(key): task ids pack
 *     (pass, step, rank, microbatch) into bit fields, so the low bits
 *     alone would cluster.  Deletion shifts the rest of the run back
 *     (Knuth 6.4, algorithm R) instead of leaving tombstones, so probe
 *     lengths stay those of a table that never deleted, however long a
 *     daemon runs.
 *   - The load stays <= 1/2: there is always an empty slot, every probe
 *     ends.  The table is a power of two of slots; when a put would pass
 *     half of it, it doubles, but never beyond what `limit` entries need:
 *     past `limit` entries a put is DH_ETOOBIG, so the memory of a map is
 *     bounded at init.  With reserve == limit every slot is allocated by
 *     dh__idmap_init() and no other call allocates (what the reorder
 *     buffer and the in-flight table promise their callers).
 *   - Values are `value_size` opaque bytes per entry, in an array of their
 *     own, so a value of type T is aligned as T is (value_size = sizeof(T)).
 *     A value that must stay put (a struct others point to) is stored by
 *     pointer: entries move on put and del.
 *   - Pure logic: no I/O, no clock, no threads.  Memory comes from the
 *     library's allocation seam (core/alloc.h), one block per table.
 *
 * Ownership: the caller owns the struct (on its stack or inside its own
 * object) and the map owns its table.  A value pointer returned by get,
 * put or next is borrowed: valid until the next put, del or fini on the
 * map.  The map never looks inside values and never frees what they point
 * to.
 *
 * Thread-safety: none.  The owner serializes calls that change the map
 * (put, del, fini); get, next and count only read and may run together
 * while nothing changes it.  Distinct maps are independent.
 */
#ifndef DH_CORE_IDMAP_H
#define DH_CORE_IDMAP_H

#include <stddef.h>
#include <stdint.h>

#include "datahelix/error.h"

/* Largest `limit` dh__idmap_init() accepts. */
#define DH_IDMAP_MAX_LIMIT (1u << 28)

/* Fields are private to idmap.c; an all-zero struct is a map that was
 * never initialized (dh__idmap_fini() accepts it). */
struct dh_idmap {
    uint64_t *keys;      /* slots of them; also the start of the block */
    unsigned char *vals; /* slots * vsize */
    unsigned char *used; /* slots flags: 1 = the slot holds an entry */
    size_t mask;         /* slots - 1; 0 while no table is allocated */
    size_t count, limit, vsize;
};

/*
 * Sets up an empty map for at most `limit` entries (1..DH_IDMAP_MAX_LIMIT)
 * of `value_size` bytes each (>= 1), with room for `reserve` (<= limit)
 * allocated now: 0 allocates on the first put.  DH_EINVAL for m == NULL,
 * value_size == 0, limit == 0 or reserve > limit; DH_ETOOBIG for a limit
 * over the maximum or a table whose size overflows; DH_ENOMEM.  On error
 * *m is left all zero (safe to fini).
 */
int dh__idmap_init(struct dh_idmap *m, size_t value_size, size_t reserve,
                   size_t limit) DH_MUST_CHECK;

/* Frees the table and zeroes *m.  Accepts NULL and an all-zero struct. */
void dh__idmap_fini(struct dh_idmap *m);

/* The value of `key`, or NULL if it is not in the map.  Borrowed (see
 * the top). */
void *dh__idmap_get(const struct dh_idmap *m, uint64_t key);

/*
 * Adds `key` with an all-zero value and points *value at it for the caller
 * to fill (borrowed, see the top).  DH_EDUP if the key is present,
 * DH_ETOOBIG if `limit` entries are, DH_ENOMEM if the table had to grow
 * and could not, DH_EINVAL for a NULL m or value or a map never
 * initialized; on any error nothing changes and *value is not written.
 * May move other entries (growth).
 */
int dh__idmap_put(struct dh_idmap *m, uint64_t key, void **value) DH_MUST_CHECK;

/*
 * Removes `key` and its value: 0, or DH_ENOTFOUND (nothing changes).  May
 * move other entries (the backward shift).  Never allocates or frees.
 */
int dh__idmap_del(struct dh_idmap *m, uint64_t key);

/*
 * Iteration: start with *pos = 0; each call returns the value of the next
 * entry (writing its key to *key unless key is NULL) and advances *pos,
 * then NULL once all were seen.  The order is the table's, fixed for a
 * given history of puts and dels, otherwise unspecified.  Values may be
 * changed during an iteration; a put or del ends it (entries may then be
 * skipped or seen twice).
 */
void *dh__idmap_next(const struct dh_idmap *m, size_t *pos, uint64_t *key);

/* Entries in the map; 0 for NULL. */
size_t dh__idmap_count(const struct dh_idmap *m);

#endif
