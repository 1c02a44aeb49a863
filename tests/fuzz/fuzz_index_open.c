/*
 * fuzz_index_open.c - libFuzzer target: dh_index_open_mem on arbitrary
 * bytes (with and without body verification), then every accessor over
 * every row, so a hostile .dhx can only be refused, never crash a reader.
 * Each input is also opened once with its checksums recomputed, so that
 * mutations reach the section and string validation behind the checksums.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/hash.h"
#include "core/index_format.h"
#include "datahelix/index.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void walk(const struct dh_index *ix)
{
    struct dh_index_columns c;
    volatile size_t sink = 0;
    struct dh_desc d;
    struct dh_err e;

    dh_index_columns(ix, &c);
    dh_desc_init(&d);
    for (uint64_t i = 0; i < c.count && i < 100000; i++) {
        const char *p = dh_index_path(ix, i), *t = dh_index_text(ix, i);

        sink += c.est_tokens[i] + c.est_out_bytes[i] + c.frames[i] +
                c.width[i] + c.height[i] + c.kind[i] + c.profile[i];
        sink += (p ? strlen(p) : 0) + (t ? strlen(t) : 0);
        if (dh_index_get(ix, i, &d, &e) == 0)
            sink += d.path ? strlen(d.path) : 0;
    }
    for (unsigned p = 0; p < dh_index_profile_count(ix); p++)
        sink += strlen(dh_index_profile_name(ix, p));
    if (dh_index_header(ix))
        sink += strlen(dh_index_header(ix));
    dh_desc_fini(&d);
    (void)sink;
}

static void try_open(const uint64_t *buf, size_t size, unsigned flags)
{
    struct dh_index *ix;
    struct dh_err e;

    if (dh_index_open_mem(buf, size, flags, &ix, &e) == 0) {
        walk(ix);
        dh_index_close(ix);
    }
}

/* What a forger would do: make both checksums match the mutated bytes. */
static void fix_checksums(unsigned char *p, size_t size)
{
    if (size < DHX_HEADER_SIZE)
        return;
    dhx_put64(
        p + DHX_OFF_BODY_SUM,
        dh__hash64(p + DHX_HEADER_SIZE, size - DHX_HEADER_SIZE, DHX_SEED_BODY));
    dhx_put64(p + DHX_OFF_HEADER_SUM,
              dh__hash64(p, DHX_OFF_HEADER_SUM, DHX_SEED_HEADER));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint64_t *buf = malloc(size + 8); /* malloc: 8-byte aligned */

    if (!buf)
        return 0;
    memcpy(buf, data, size); /* open_mem needs 8-byte alignment */
    try_open(buf, size, 0);
    try_open(buf, size, DH_INDEX_VERIFY);
    fix_checksums((unsigned char *)buf, size);
    try_open(buf, size, DH_INDEX_VERIFY);
    free(buf);
    return 0;
}
