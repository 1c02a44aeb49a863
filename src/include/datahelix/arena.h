/*
 * datahelix/arena.h - the shared-memory arena between a local DataServer
 * (the producer) and its training rank's client (the consumer), DESIGN 2
 * "Local path", DESIGN 8 "Arena lifetime".  Design notes: docs/arena.md.
 *
 * An arena is one anonymous memfd (no name in /dev/shm, ever), sealed
 * against shrinking and growing, mapped MAP_SHARED by both processes: a
 * header (magic, version, sizes, a process-shared robust mutex and condvar,
 * the allocator state and the slot table) followed by the data area.  The
 * creator hands the fd to its peer over a Unix socket (SCM_RIGHTS, see
 * src/runtime/fdpass.h); the peer calls dh_arena_attach().
 *
 * Slots are carved from the data area by a ring allocator: allocation from
 * the head, release in any order, the tail advances over released slots.
 * A slot is named by a `struct dh_slot_ref` - a plain value (offset, len,
 * generation) to send over the wire; it is never a pointer.  Each slot has
 * a reference count (1 after dh_arena_alloc) and a generation: a ref whose
 * generation, offset or length does not match a live slot is stale, and
 * using it is an error (DH_EINVAL, counted), never a double free.
 *
 * Ownership of references: dh_arena_alloc() returns a ref holding one
 * reference.  Sending a ref to the peer hands that reference over with the
 * message (the receiver releases it); a holder that wants to keep using a
 * slot after handing a ref on calls dh_arena_retain() first.  A pointer
 * from dh_arena_ptr() is borrowed: valid while the caller (or whoever it
 * trusts) still holds a reference to that slot.  The arena cannot stop a
 * process from writing through a pointer after releasing; the generation
 * check only catches stale *refs*.
 *
 * Backpressure: when the arena is full, dh_arena_alloc() waits (bounded by
 * its timeout) until the peer releases; it never drops or overwrites.
 *
 * Robustness: if a process dies while holding the arena lock, the next
 * locker repairs the allocator state (docs/arena.md "Robustness") and the
 * arena stays usable.  Slots held by a dead process are NOT reclaimed: the
 * DataServer recreates the arena for a restarted client.  Every lock
 * acquisition is bounded by DH_ARENA_LOCK_TIMEOUT_MS (a peer that is
 * stopped inside the lock gives DH_ETIMEOUT, not a hang).
 *
 * Thread-safety: every function may be called from any thread of either
 * process at once, except dh_arena_destroy(), which must not race with
 * other calls on the same handle.
 */
#ifndef DATAHELIX_ARENA_H
#define DATAHELIX_ARENA_H

#include <stddef.h>
#include <stdint.h>

#include "datahelix/error.h"

#define DH_ARENA_VERSION 2u
/* Slot data offsets are multiples of this (cache line, AVX-512 loads). */
#define DH_ARENA_ALIGN 64u
/* Most slots allocated and not yet returned to the ring at once. */
#define DH_ARENA_MAX_SLOTS 1024u
/* Bound on acquiring the arena lock (held for microseconds normally). */
#define DH_ARENA_LOCK_TIMEOUT_MS 2000

struct dh_arena;

/*
 * A slot, as a value to put in a message.  offset: byte offset of the
 * slot's data from the start of the arena fd (so a receiver may also
 * mmap it directly); len: the length asked of dh_arena_alloc(); gen: the
 * slot's generation.  Encode the three fields explicitly on the wire.
 */
struct dh_slot_ref {
    uint64_t offset;
    uint64_t len;
    uint32_t gen;
};

struct dh_arena_stats {
    uint64_t capacity;     /* bytes of the data area */
    uint64_t used;         /* bytes the ring has not got back yet (slots
                              alive or released behind a live one,
                              alignment and wrap padding) */
    uint64_t live_bytes;   /* sum of len over slots with references */
    uint32_t live_slots;   /* slots with a reference count > 0 */
    uint64_t allocs;       /* successful dh_arena_alloc() calls */
    uint64_t releases;     /* slots whose count dropped to 0 */
    uint64_t waits;        /* allocs that had to wait for space */
    uint64_t timeouts;     /* allocs that gave up with DH_EARENA */
    uint32_t waiting;      /* allocs waiting for room right now */
    uint64_t bad_releases; /* retains/releases refused (stale or bogus ref) */
    uint64_t recoveries;   /* lock owner died; state repaired */
};

/*
 * Data-area size for a consumer prefetching `prefetch_depth` batches of at
 * most `batch_bytes`: (prefetch_depth + 2) slots - the prefetched batches,
 * the one the training step is using and the one a worker is writing -
 * each rounded up to DH_ARENA_ALIGN, the total rounded up to the page
 * size.  Returns 0 for batch_bytes == 0 or on overflow.
 */
size_t dh_arena_default_size(unsigned prefetch_depth, size_t batch_bytes);

/*
 * Creates an arena whose data area holds `bytes` (rounded up to the page
 * size; 0 is DH_EINVAL) and maps it.  *out is owned by the caller
 * (dh_arena_destroy).  DH_EIO (memfd_create, ftruncate, seals, mmap
 * failing: e.g. out of memory), DH_ETOOBIG (size overflow), DH_ENOMEM.
 */
int dh_arena_create(size_t bytes, struct dh_arena **out,
                    struct dh_err *e) DH_MUST_CHECK;

/*
 * Attaches to the arena behind `fd` (typically received with dh_fd_recv).
 * The arena keeps its own duplicate of fd; the caller still owns `fd` and
 * may close it at once.  Validates before trusting anything: the fd is a
 * memfd sealed against shrinking (so the mapping can never SIGBUS), its
 * size, and the header's magic, version, layout and sizes against fstat.
 * A hostile or corrupt fd gives DH_EFORMAT / DH_EVERSION / DH_EIO, never a
 * crash; DH_EINVAL for fd < 0.  The fd must be open read-write.
 */
int dh_arena_attach(int fd, struct dh_arena **out,
                    struct dh_err *e) DH_MUST_CHECK;

/* The arena's fd (borrowed: valid until dh_arena_destroy). */
int dh_arena_fd(const struct dh_arena *a);

/*
 * Unmaps and closes this process's view; the other process's view stays
 * valid (the memory lives until the last mapping and fd are gone).
 * Accepts NULL.  Must not race with other calls on `a`.
 */
void dh_arena_destroy(struct dh_arena *a);

/*
 * Allocates a slot of `len` bytes (reference count 1) and writes its ref
 * to *out.  Waits up to timeout_ms (0: do not wait) while the arena is
 * full; then DH_EARENA with "arena exhausted: N slots (X MiB) still held
 * by the consumer ...".  len > capacity is DH_ETOOBIG at once; len == 0 or
 * timeout_ms < 0 is DH_EINVAL.  DH_ETIMEOUT also if the lock cannot be
 * taken within DH_ARENA_LOCK_TIMEOUT_MS; DH_EFORMAT if the shared state is
 * found corrupt.  *out is written only on success.  The slot's bytes are
 * not cleared.
 */
int dh_arena_alloc(struct dh_arena *a, size_t len, int timeout_ms,
                   struct dh_slot_ref *out, struct dh_err *e) DH_MUST_CHECK;

/*
 * The slot's data in this process's mapping (len bytes, DH_ARENA_ALIGN
 * aligned), or NULL if `ref` is not a live slot (stale generation, bogus
 * offset or length) or the lock timed out.  Borrowed: see the top.
 */
void *dh_arena_ptr(struct dh_arena *a, const struct dh_slot_ref *ref);

/*
 * Adds one reference to a live slot.  DH_EINVAL (counted in bad_releases)
 * for a stale or bogus ref, DH_ETOOBIG if the count would overflow.
 */
int dh_arena_retain(struct dh_arena *a, const struct dh_slot_ref *ref,
                    struct dh_err *e) DH_MUST_CHECK;

/*
 * Drops one reference; at 0 the slot goes back to the ring and waiting
 * allocators wake.  A stale or bogus ref (wrong generation, offset or
 * length; already released) is DH_EINVAL, counted in bad_releases, and
 * changes nothing else.
 */
int dh_arena_release(struct dh_arena *a, const struct dh_slot_ref *ref,
                     struct dh_err *e) DH_MUST_CHECK;

/*
 * Releases n refs under one lock acquisition (DESIGN 8: "releases may be
 * batched").  Every ref is tried; returns 0 or the first error.
 */
int dh_arena_release_many(struct dh_arena *a, const struct dh_slot_ref *refs,
                          size_t n, struct dh_err *e) DH_MUST_CHECK;

/* A consistent snapshot of the counters.  DH_ETIMEOUT if the lock is stuck. */
int dh_arena_stats(struct dh_arena *a,
                   struct dh_arena_stats *out) DH_MUST_CHECK;

/* A slot reference as bytes, for messages that are not protobuf (fd
 * passing): 8 + 8 + 4 bytes little-endian, never a struct cast. */
#define DH_SLOT_REF_BYTES 20
void dh_slot_ref_pack(unsigned char *out, const struct dh_slot_ref *r);
void dh_slot_ref_unpack(const unsigned char *in, struct dh_slot_ref *r);

#endif
