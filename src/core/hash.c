/*
 * hash.c - 64-bit checksum over bytes (see hash.h).
 *
 * Design: four independent accumulators each take one 8-byte word of every
 * 32-byte stripe (xor with a multiplied word, rotate, multiply), so the
 * multiplies of different lanes overlap in the pipeline and the loop runs
 * at memory speed.  The lanes are folded together, the remaining whole words
 * and the final 0-7 bytes are mixed in one at a time, and a final avalanche
 * (xor-shift / multiply rounds) spreads every input bit over the result.
 * Words are read with memcpy, so any alignment is fine.
 *
 * Locking: none.
 */
#include <string.h>

#include "core/hash.h"

#define M1 0x9e3779b97f4a7c15ULL /* 2^64 / golden ratio */
#define M2 0xd6e8feb86659fd93ULL
#define M3 0xbf58476d1ce4e5b9ULL
#define M4 0x94d049bb133111ebULL

static inline uint64_t rotl64(uint64_t x, unsigned r)
{
    return (x << r) | (x >> (64 - r));
}

static inline uint64_t load64(const unsigned char *p)
{
    uint64_t v;

    memcpy(&v, p, sizeof(v));
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap64(v);
#endif
    return v;
}

static inline uint64_t lane_step(uint64_t acc, uint64_t w)
{
    acc ^= w * M2;
    acc = rotl64(acc, 29);
    return acc * M1;
}

static inline uint64_t fold(uint64_t h, uint64_t w)
{
    h ^= lane_step(0, w);
    return rotl64(h, 27) * M1 + M3;
}

static uint64_t avalanche(uint64_t h)
{
    h ^= h >> 31;
    h *= M3;
    h ^= h >> 29;
    h *= M4;
    h ^= h >> 32;
    return h;
}

static uint64_t stripes(const unsigned char **pp, size_t *np, uint64_t seed)
{
    uint64_t a = seed + M1 + M2, b = seed + M2, c = seed, d = seed - M1;
    const unsigned char *p = *pp;
    size_t n = *np;

    for (; n >= 32; n -= 32, p += 32) {
        a = lane_step(a, load64(p));
        b = lane_step(b, load64(p + 8));
        c = lane_step(c, load64(p + 16));
        d = lane_step(d, load64(p + 24));
    }
    *pp = p;
    *np = n;
    return fold(fold(fold(fold(rotl64(a, 1) + rotl64(b, 7) + rotl64(c, 12) +
                                   rotl64(d, 18),
                               a),
                          b),
                     c),
                d);
}

uint64_t dh__hash64(const void *data, size_t n, uint64_t seed)
{
    const unsigned char *p = data;
    uint64_t h, tail = 0;
    size_t len = n;

    if (n >= 32)
        h = stripes(&p, &n, seed);
    else
        h = seed + M4;
    h += (uint64_t)len;
    for (; n >= 8; n -= 8, p += 8)
        h = fold(h, load64(p));
    for (size_t i = 0; i < n; i++)
        tail |= (uint64_t)p[i] << (8 * i);
    if (n)
        h = fold(h, tail ^ ((uint64_t)n << 56));
    return avalanche(h);
}

uint64_t dh__splitmix64(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);

    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

uint64_t dh__mix64(uint64_t x)
{
    return dh__splitmix64(&x);
}
