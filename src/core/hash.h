/*
 * hash.h - fast non-cryptographic 64-bit checksum and the SplitMix64
 * mixer used for seeds and hash tables (internal).
 *
 * Used for the .dhx index header and body checksums: it detects corruption
 * and truncation, not tampering.  The value is defined on the little-endian
 * reading of the bytes, so it is the same on every host.
 *
 * Thread-safety: pure function.
 */
#ifndef DH_CORE_HASH_H
#define DH_CORE_HASH_H

#include <stddef.h>
#include <stdint.h>

/* Hash of `n` bytes at `p` (p may be NULL when n == 0). */
uint64_t dh__hash64(const void *p, size_t n, uint64_t seed);

/* SplitMix64 (Steele et al. 2014): advances *state and returns the next
 * well-mixed 64-bit value.  The project's one small RNG and seed mixer. */
uint64_t dh__splitmix64(uint64_t *state);

/* One SplitMix64 step from x, without state: a well-mixed hash of x. */
uint64_t dh__mix64(uint64_t x);

#endif
