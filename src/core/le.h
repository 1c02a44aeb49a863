/*
 * le.h - little-endian packing of integers into byte buffers, for the
 * small binary messages that are not protobuf (the local link's hello, the
 * DataServer <-> Python worker frames).  Never a struct cast.
 */
#ifndef DH_CORE_LE_H
#define DH_CORE_LE_H

#include <stdint.h>

static inline void dh__put_le32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static inline void dh__put_le64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static inline uint32_t dh__get_le32(const unsigned char *p)
{
    uint32_t v = 0;

    for (int i = 3; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static inline uint64_t dh__get_le64(const unsigned char *p)
{
    uint64_t v = 0;

    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

#endif
