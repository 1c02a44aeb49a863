/*
 * idmap.c - u64 id -> inline value map (core/idmap.h).
 *
 * Design notes
 * - One calloc'd block per table: `slots` keys, then `slots` values, then
 *   `slots` used flags.  Keys need a flag of their own because every u64,
 *   0 included, is a valid task id.  The values start at slots * 8 bytes,
 *   a multiple of 16 since slots >= 2, so they keep malloc's alignment.
 * - Growth re-places every entry into a table twice the size: O(n), but
 *   only log2(limit) times over a map's life, and never for a map
 *   reserved at its limit.
 * Locking: none; the owner serializes calls (see idmap.h).
 */
#include <string.h>

#include "core/alloc.h"
#include "core/hash.h"
#include "core/idmap.h"

/* Slots for n entries at load <= 1/2: a power of two >= 2n, at least 2. */
static size_t slots_for(size_t n)
{
    size_t s = 2;

    while (s < 2 * n)
        s <<= 1;
    return s;
}

/* Bytes of a table of `slots` slots; 0 if that overflows. */
static size_t block_bytes(size_t slots, size_t vsize)
{
    size_t per;

    if (vsize > SIZE_MAX - sizeof(uint64_t) - 1)
        return 0;
    per = sizeof(uint64_t) + vsize + 1;
    return slots > SIZE_MAX / per ? 0 : slots * per;
}

/* Points m's arrays at a fresh all-zero table of `slots` slots. */
static int alloc_table(struct dh_idmap *m, size_t slots)
{
    unsigned char *b = dh__calloc(1, block_bytes(slots, m->vsize));

    if (!b)
        return DH_ENOMEM;
    m->keys = (uint64_t *)(void *)b;
    m->vals = b + slots * sizeof(uint64_t);
    m->used = m->vals + slots * m->vsize;
    m->mask = slots - 1;
    return 0;
}

static size_t home(const struct dh_idmap *m, uint64_t key)
{
    return (size_t)dh__mix64(key) & m->mask;
}

static void *val(const struct dh_idmap *m, size_t i)
{
    return m->vals + i * m->vsize;
}

/* Slot of `key`, or of the empty slot ending its run (a table exists). */
static size_t probe(const struct dh_idmap *m, uint64_t key)
{
    size_t i = home(m, key);

    while (m->used[i] && m->keys[i] != key)
        i = (i + 1) & m->mask;
    return i;
}

/* Doubles the table (or allocates the first one) and re-places every
 * entry; on DH_ENOMEM the old table stays as it was. */
static int grow(struct dh_idmap *m)
{
    struct dh_idmap n = *m;
    size_t slots = m->mask ? 2 * (m->mask + 1) : 2;

    if (alloc_table(&n, slots) < 0)
        return DH_ENOMEM;
    for (size_t i = 0; m->mask && i <= m->mask; i++) {
        size_t j;

        if (!m->used[i])
            continue;
        j = probe(&n, m->keys[i]);
        n.keys[j] = m->keys[i];
        n.used[j] = 1;
        memcpy(val(&n, j), val(m, i), m->vsize);
    }
    dh__free(m->keys);
    *m = n;
    return 0;
}

int dh__idmap_init(struct dh_idmap *m, size_t value_size, size_t reserve,
                   size_t limit)
{
    if (!m)
        return DH_EINVAL;
    memset(m, 0, sizeof(*m));
    if (!value_size || !limit || reserve > limit)
        return DH_EINVAL;
    if (limit > DH_IDMAP_MAX_LIMIT ||
        !block_bytes(slots_for(limit), value_size))
        return DH_ETOOBIG;
    m->vsize = value_size;
    if (reserve && alloc_table(m, slots_for(reserve)) < 0) {
        memset(m, 0, sizeof(*m));
        return DH_ENOMEM;
    }
    m->limit = limit;
    return 0;
}

void dh__idmap_fini(struct dh_idmap *m)
{
    if (!m)
        return;
    dh__free(m->keys);
    memset(m, 0, sizeof(*m));
}

void *dh__idmap_get(const struct dh_idmap *m, uint64_t key)
{
    size_t i;

    if (!m || !m->mask)
        return NULL;
    i = probe(m, key);
    return m->used[i] ? val(m, i) : NULL;
}

int dh__idmap_put(struct dh_idmap *m, uint64_t key, void **value)
{
    size_t i;

    if (!m || !value || !m->limit)
        return DH_EINVAL;
    if (m->mask && m->used[probe(m, key)])
        return DH_EDUP;
    if (m->count >= m->limit)
        return DH_ETOOBIG;
    /* Growing before the insert keeps a free slot at the end of every
     * run; count < limit bounds the table at slots_for(limit). */
    if (2 * (m->count + 1) > (m->mask ? m->mask + 1 : 0) && grow(m) < 0)
        return DH_ENOMEM;
    i = probe(m, key);
    m->keys[i] = key;
    m->used[i] = 1;
    memset(val(m, i), 0, m->vsize);
    m->count++;
    *value = val(m, i);
    return 0;
}

int dh__idmap_del(struct dh_idmap *m, uint64_t key)
{
    size_t i, j;

    if (!m || !m->mask)
        return DH_ENOTFOUND;
    i = probe(m, key);
    if (!m->used[i])
        return DH_ENOTFOUND;
    for (j = (i + 1) & m->mask; m->used[j]; j = (j + 1) & m->mask) {
        size_t k = home(m, m->keys[j]);

        /* Entry j may stay if its home k lies cyclically in (i, j]: a
         * probe from k still reaches it without crossing the hole at i. */
        if (i <= j ? (i < k && k <= j) : (i < k || k <= j))
            continue;
        m->keys[i] = m->keys[j];
        memcpy(val(m, i), val(m, j), m->vsize);
        i = j;
    }
    m->used[i] = 0;
    m->count--;
    return 0;
}

void *dh__idmap_next(const struct dh_idmap *m, size_t *pos, uint64_t *key)
{
    if (!m || !pos || !m->mask)
        return NULL;
    for (size_t i = *pos; i <= m->mask; i++) {
        if (!m->used[i])
            continue;
        *pos = i + 1;
        if (key)
            *key = m->keys[i];
        return val(m, i);
    }
    *pos = m->mask + 1;
    return NULL;
}

size_t dh__idmap_count(const struct dh_idmap *m)
{
    return m ? m->count : 0;
}
