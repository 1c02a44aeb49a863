/*
 * arena_internal.h - test hooks of the shared-memory arena (internal; only
 * tests include this).
 */
#ifndef DH_RUNTIME_ARENA_INTERNAL_H
#define DH_RUNTIME_ARENA_INTERNAL_H

#include "datahelix/arena.h"

/*
 * Takes the arena lock and returns holding it, for a test that then kills
 * the calling process (robust-mutex recovery).  With `scribble`, also
 * overwrites the derived allocator state (head, tail, used, live counts)
 * and a descriptor outside the live window, as a process killed half way
 * through an update would leave them.  Returns 0 or a DH_E* code.
 */
int dh__arena_test_lock(struct dh_arena *a, int scribble);

#endif
