/*
 * index_format.h - on-disk layout constants of the .dhx index (internal;
 * shared by index_builder.c and index_reader.c; see docs/index-format.md).
 *
 * All integers little-endian.  Header (DHX_HEADER_SIZE bytes):
 *   0 magic "DHXINDEX"        8 u32 version        12 u32 header_size
 *  16 u64 flags (must be 0)  24 u64 count          32 u64 file_size
 *  40 u32 profile_count      44 u32 section_count  48 u64 header_json_off
 *  56 u64 body_checksum      64 section table: 16 x {u64 offset, u64 size}
 * 320 reserved (zero)       504 u64 header_checksum of bytes [0, 504)
 * Body: sections in table order, each at an 8-aligned offset, zero padding.
 *
 * Thread-safety: constants only.
 */
#ifndef DH_CORE_INDEX_FORMAT_H
#define DH_CORE_INDEX_FORMAT_H

#include <stdint.h>
#include <string.h>

#define DHX_MAGIC "DHXINDEX"
#define DHX_HEADER_SIZE 512u
#define DHX_SECTION_SLOTS 16u
#define DHX_OFF_VERSION 8
#define DHX_OFF_HEADER_SIZE 12
#define DHX_OFF_FLAGS 16
#define DHX_OFF_COUNT 24
#define DHX_OFF_FILE_SIZE 32
#define DHX_OFF_PROFILE_COUNT 40
#define DHX_OFF_SECTION_COUNT 44
#define DHX_OFF_HEADER_JSON 48
#define DHX_OFF_BODY_SUM 56
#define DHX_OFF_SECTIONS 64
#define DHX_OFF_HEADER_SUM 504
#define DHX_SEED_HEADER 0x6468782d68647200ULL /* "dhx-hdr" */
#define DHX_SEED_BODY 0x6468782d626f6479ULL   /* "dhx-body" */
#define DHX_NONE UINT64_MAX /* string offset meaning "no string" */

enum dhx_section {
    DHX_S_EST_TOKENS,    /* u32[count] */
    DHX_S_EST_CPU_MS,    /* f32[count] */
    DHX_S_EST_OUT_BYTES, /* u64[count] */
    DHX_S_PROFILE,       /* u16[count] */
    DHX_S_FRAMES,        /* u32[count] */
    DHX_S_WIDTH,         /* u16[count] */
    DHX_S_HEIGHT,        /* u16[count] */
    DHX_S_KIND,          /* u8[count] */
    DHX_S_PATH_OFF,      /* u64[count] into STRINGS, DHX_NONE if none */
    DHX_S_TEXT_OFF,      /* u64[count] into STRINGS, DHX_NONE if none */
    DHX_S_MEMBER_OFF,    /* u64[count] into STRINGS: a shard member's
                            name, DHX_NONE for a whole file */
    DHX_S_DATA_OFF,      /* u64[count]: the member's offset in its shard */
    DHX_S_BYTES,         /* u64[count]: the file's (member's) size */
    DHX_S_MTIME,         /* u64[count]: the file's (shard's) mtime at
                            probe, ns; 0: not recorded */
    DHX_S_PROFILE_NAMES, /* u64[profile_count] into STRINGS */
    DHX_S_STRINGS,       /* NUL-terminated strings; last byte is NUL */
    DHX_NSECTIONS
};

/* Element size of a per-sample section, 0 for the others. */
static inline unsigned dhx_elem_size(unsigned s)
{
    static const unsigned char sz[DHX_NSECTIONS] = {4, 4, 8, 2, 4, 2, 2, 1,
                                                    8, 8, 8, 8, 8, 8, 0, 0};
    return s < DHX_NSECTIONS ? sz[s] : 0;
}

static inline uint64_t dhx_get64(const unsigned char *p)
{
    uint64_t v;
    memcpy(&v, p, sizeof(v));
    return v; /* little-endian hosts only (checked at open/build) */
}

static inline uint32_t dhx_get32(const unsigned char *p)
{
    uint32_t v;
    memcpy(&v, p, sizeof(v));
    return v;
}

static inline void dhx_put64(unsigned char *p, uint64_t v)
{
    memcpy(p, &v, sizeof(v));
}

static inline void dhx_put32(unsigned char *p, uint32_t v)
{
    memcpy(p, &v, sizeof(v));
}

static inline int dhx_host_is_le(void)
{
    const uint16_t one = 1;
    unsigned char b;
    memcpy(&b, &one, 1);
    return b == 1;
}

#endif
