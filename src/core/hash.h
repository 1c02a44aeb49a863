/*
 * hash.h - fast non-cryptographic 64-bit checksum (internal).
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

#endif
