/*
 * alloc.h - the one allocation seam of the library (internal).
 *
 * Every allocation in src/ goes through these so that tests can make the Nth
 * allocation fail (SQLite-style fault injection) and check that each error
 * path cleans up.  jansson is pointed at the same seam by dh__alloc_init().
 *
 * Thread-safety: the failure counter is atomic; the seam itself is as
 * thread-safe as malloc.
 */
#ifndef DH_CORE_ALLOC_H
#define DH_CORE_ALLOC_H

#include <stddef.h>

void *dh__malloc(size_t n);
void *dh__calloc(size_t count, size_t size);
void *dh__realloc(void *p, size_t n);
void dh__free(void *p);
char *dh__strdup(const char *s);
char *dh__strndup(const char *s, size_t n);
/* Grows the kept buffer *buf (capacity *cap) to hold at least n bytes, so
 * that a per-file name costs no allocation in the steady state.  0, or
 * -1 (the buffer is unchanged) when out of memory. */
int dh__buf_reserve(char **buf, size_t *cap, size_t n);

/* Routes jansson's allocations through the seam; idempotent, thread-safe. */
void dh__alloc_init(void);

/*
 * Test hook: after `n` more successful allocations, every allocation fails
 * until dh__alloc_fail_reset().  n < 0 disables injection.
 */
void dh__alloc_fail_after(long n);
void dh__alloc_fail_reset(void);
/* Number of allocations refused since the last reset. */
long dh__alloc_failures(void);
/* Test hook: allocations made since dh__alloc_fail_after() (arm it with a
 * large n to count without failing: tests that a path allocates nothing
 * per sample); -1 when not armed.  jansson's count too, FFmpeg's do not. */
long dh__alloc_count(void);

#endif
