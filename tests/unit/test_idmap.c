/* test_idmap.c - the u64 id map behind the reorder buffer, the in-flight
 * table and the Coordinator's task index: argument and allocation edges,
 * removal in the middle of a colliding run (the backward shift, across the
 * table's wrap-around), growth and its failure, the full-capacity bound,
 * and random put / del / get / iterate sequences checked against a sorted
 * array over many seeds, with colliding, clustered and random keys. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/alloc.h"
#include "core/hash.h"
#include "core/idmap.h"

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 2685821657736338717ull;
}

static struct dh_idmap mk(size_t vsize, size_t reserve, size_t limit)
{
    struct dh_idmap m;

    assert_int_equal(dh__idmap_init(&m, vsize, reserve, limit), 0);
    return m;
}

static void put_u64(struct dh_idmap *m, uint64_t key, uint64_t v)
{
    void *p = NULL;

    assert_int_equal(dh__idmap_put(m, key, &p), 0);
    assert_non_null(p);
    assert_int_equal(*(uint64_t *)p, 0); /* a new value starts zeroed */
    *(uint64_t *)p = v;
}

/* get(key) must give v. */
static void has_u64(const struct dh_idmap *m, uint64_t key, uint64_t v)
{
    const uint64_t *p = dh__idmap_get(m, key);

    assert_non_null(p);
    assert_int_equal(*p, v);
}

/* The home slot the map gives `key` in a table of mask + 1 slots. */
static size_t home_of(uint64_t key, size_t mask)
{
    return (size_t)dh__mix64(key) & mask;
}

/* Fills out[0..n) with the keys from `from` upwards whose home is h. */
static void keys_homed_at(size_t h, size_t mask, uint64_t from, uint64_t *out,
                          size_t n)
{
    for (uint64_t k = from; n > 0; k++)
        if (home_of(k, mask) == h) {
            *out++ = k;
            n--;
        }
}

static void init_rejects_bad_args(void **state)
{
    struct dh_idmap m;
    void *p = &m;
    size_t pos = 0;

    (void)state;
    assert_int_equal(dh__idmap_init(NULL, 8, 0, 4), DH_EINVAL);
    assert_int_equal(dh__idmap_init(&m, 0, 0, 4), DH_EINVAL);
    assert_int_equal(dh__idmap_init(&m, 8, 0, 0), DH_EINVAL);
    assert_int_equal(dh__idmap_init(&m, 8, 5, 4), DH_EINVAL);
    assert_int_equal(dh__idmap_init(&m, 8, 0, DH_IDMAP_MAX_LIMIT + 1ul),
                     DH_ETOOBIG);
    assert_int_equal(dh__idmap_init(&m, SIZE_MAX / 2, 0, 4), DH_ETOOBIG);
    dh__alloc_fail_after(0);
    assert_int_equal(dh__idmap_init(&m, 8, 4, 4), DH_ENOMEM);
    dh__alloc_fail_reset();
    /* A failed init leaves a zeroed map: every call is safe on it. */
    assert_null(m.keys);
    assert_int_equal(dh__idmap_count(&m), 0);
    assert_null(dh__idmap_get(&m, 0));
    assert_int_equal(dh__idmap_del(&m, 0), DH_ENOTFOUND);
    assert_null(dh__idmap_next(&m, &pos, NULL));
    assert_int_equal(dh__idmap_put(&m, 0, &p), DH_EINVAL);
    assert_ptr_equal(p, &m); /* not written */
    dh__idmap_fini(&m);
    dh__idmap_fini(NULL);
    assert_int_equal(dh__idmap_count(NULL), 0);
    assert_null(dh__idmap_get(NULL, 0));
    assert_int_equal(dh__idmap_del(NULL, 0), DH_ENOTFOUND);
    m = mk(8, 0, 4);
    assert_int_equal(dh__idmap_put(&m, 1, NULL), DH_EINVAL);
    assert_int_equal(dh__idmap_count(&m), 0);
    dh__idmap_fini(&m);
}

static void basics_and_edge_keys(void **state)
{
    struct dh_idmap m = mk(sizeof(uint64_t), 4, 4);
    void *p = NULL, *q = NULL;

    (void)state;
    put_u64(&m, 0, 100); /* 0 and UINT64_MAX are keys like any other */
    put_u64(&m, UINT64_MAX, 200);
    assert_int_equal(dh__idmap_count(&m), 2);
    has_u64(&m, 0, 100);
    has_u64(&m, UINT64_MAX, 200);
    assert_null(dh__idmap_get(&m, 1));
    assert_int_equal(dh__idmap_put(&m, 0, &p), DH_EDUP);
    assert_null(p);
    has_u64(&m, 0, 100); /* the duplicate changed nothing */
    assert_int_equal(dh__idmap_del(&m, 0), 0);
    assert_int_equal(dh__idmap_del(&m, 0), DH_ENOTFOUND);
    assert_null(dh__idmap_get(&m, 0));
    assert_int_equal(dh__idmap_put(&m, 0, &q), 0);
    assert_int_equal(*(uint64_t *)q, 0); /* zeroed again, not the old 100 */
    assert_int_equal(dh__idmap_count(&m), 2);
    dh__idmap_fini(&m);
    assert_int_equal(dh__idmap_count(&m), 0);
    assert_null(m.keys);
}

/* Five keys sharing the last slot as home, so their run wraps to slot 0,
 * and one homed at slot 0 behind them: removing any one of the run must
 * keep all the others reachable, whatever the order. */
static void del_mid_run_shifts_back(void **state)
{
    enum { LIMIT = 8, SLOTS = 16, RUN = 5 };
    uint64_t run[RUN + 1];

    (void)state;
    keys_homed_at(SLOTS - 1, SLOTS - 1, 1000, run, RUN);
    keys_homed_at(0, SLOTS - 1, 5000, run + RUN, 1);
    for (size_t victim = 0; victim <= RUN; victim++) {
        struct dh_idmap m = mk(sizeof(uint64_t), LIMIT, LIMIT);

        assert_int_equal(m.mask, SLOTS - 1);
        for (size_t i = 0; i <= RUN; i++)
            put_u64(&m, run[i], run[i] * 3);
        assert_int_equal(dh__idmap_del(&m, run[victim]), 0);
        assert_null(dh__idmap_get(&m, run[victim]));
        for (size_t i = 0; i <= RUN; i++)
            if (i != victim)
                has_u64(&m, run[i], run[i] * 3);
        /* The run is contiguous again: no hole before its last entry. */
        for (size_t i = 0, slot = SLOTS - 1; i < RUN; i++) {
            assert_int_equal(m.used[slot], 1);
            slot = (slot + 1) & (SLOTS - 1);
        }
        assert_int_equal(m.used[(SLOTS - 1 + RUN) & (SLOTS - 1)], 0);
        dh__idmap_fini(&m);
    }
}

/* From no table to the limit: every key stays reachable across each
 * doubling, a failed doubling changes nothing, the limit is DH_ETOOBIG. */
static void grows_to_its_limit(void **state)
{
    enum { LIMIT = 1000 };
    struct dh_idmap m = mk(sizeof(uint64_t), 0, LIMIT);
    size_t grew = 0, failed = 0;
    void *p;

    (void)state;
    assert_null(m.keys); /* reserve 0: nothing allocated yet */
    for (uint64_t i = 0; i < LIMIT; i++) {
        uint64_t key = i << 24; /* step-like ids: only high bits vary */
        size_t mask = m.mask;

        if (2 * (m.count + 1) > mask + 1 && failed < 3) {
            dh__alloc_fail_after(0);
            assert_int_equal(dh__idmap_put(&m, key, &p), DH_ENOMEM);
            dh__alloc_fail_reset();
            assert_int_equal(m.mask, mask);
            assert_int_equal(dh__idmap_count(&m), i);
            failed++;
        }
        put_u64(&m, key, ~key);
        grew += m.mask != mask;
        assert_true(2 * m.count <= m.mask + 1);
        if ((i & (i + 1)) == 0) /* after each power of two */
            for (uint64_t j = 0; j <= i; j++)
                has_u64(&m, j << 24, ~(j << 24));
    }
    assert_int_equal(grew, 11); /* 2, 4, ..., 2048 slots */
    assert_int_equal(m.mask + 1, 2048);
    assert_int_equal(dh__idmap_put(&m, 1, &p), DH_ETOOBIG);
    assert_int_equal(dh__idmap_put(&m, 0, &p), DH_EDUP); /* dup first */
    assert_int_equal(dh__idmap_del(&m, 5u << 24), 0);
    put_u64(&m, 1, 7);
    assert_int_equal(m.mask + 1, 2048); /* the limit caps the table */
    dh__idmap_fini(&m);
}

/* Reserved at the limit: full is DH_ETOOBIG with nothing changed, and
 * churn at full load never allocates. */
static void full_capacity_never_allocates(void **state)
{
    enum { LIMIT = 5 };
    struct dh_idmap m = mk(sizeof(uint64_t), LIMIT, LIMIT);
    uint64_t s = 12345;
    void *p = NULL;

    (void)state;
    dh__alloc_fail_after(0);
    for (uint64_t k = 0; k < LIMIT; k++)
        put_u64(&m, k, k);
    for (int it = 0; it < 2000; it++) {
        uint64_t gone = rng_next(&s) % LIMIT, extra = LIMIT + gone;

        assert_int_equal(dh__idmap_put(&m, extra, &p), DH_ETOOBIG);
        assert_null(p);
        assert_int_equal(dh__idmap_count(&m), LIMIT);
        assert_int_equal(dh__idmap_del(&m, gone), 0);
        put_u64(&m, extra, it);
        assert_int_equal(dh__idmap_del(&m, extra), 0);
        put_u64(&m, gone, gone);
    }
    for (uint64_t k = 0; k < LIMIT; k++)
        has_u64(&m, k, k);
    assert_int_equal(dh__alloc_failures(), 0);
    dh__alloc_fail_reset();
    dh__idmap_fini(&m);
}

/* ---- against a reference model ---- */

/* The model: a sorted array of (key, tag); a value's bytes derive from
 * its tag, so a value moved without all its bytes is caught. */
struct model {
    uint64_t key[64], tag[64];
    size_t n;
};

/* Position of key in the model, or where it would go; *found says which. */
static size_t model_find(const struct model *md, uint64_t key, int *found)
{
    size_t lo = 0, hi = md->n;

    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;

        if (md->key[mid] < key)
            lo = mid + 1;
        else
            hi = mid;
    }
    *found = lo < md->n && md->key[lo] == key;
    return lo;
}

static void fill(unsigned char *p, size_t vsize, uint64_t tag)
{
    for (size_t b = 0; b < vsize; b++)
        p[b] = (unsigned char)((tag >> (b % 8 * 8)) ^ b);
}

static void check_val(const unsigned char *p, size_t vsize, uint64_t tag)
{
    unsigned char want[32];

    assert_non_null(p);
    fill(want, vsize, tag);
    assert_memory_equal(p, want, vsize);
}

/* Every model entry by get, every map entry once by next. */
static void check_all(const struct dh_idmap *m, const struct model *md,
                      size_t vsize)
{
    unsigned char seen[64] = {0};
    size_t pos = 0, visited = 0;
    uint64_t key;
    const unsigned char *p;

    assert_int_equal(dh__idmap_count(m), md->n);
    for (size_t i = 0; i < md->n; i++)
        check_val(dh__idmap_get(m, md->key[i]), vsize, md->tag[i]);
    while ((p = dh__idmap_next(m, &pos, &key))) {
        int found;
        size_t i = model_find(md, key, &found);

        assert_true(found);
        assert_int_equal(seen[i], 0);
        seen[i] = 1;
        check_val(p, vsize, md->tag[i]);
        visited++;
    }
    assert_int_equal(visited, md->n);
}

enum keys { K_SMALL, K_STEPS, K_COLLIDE, K_RANDOM, K_KINDS };

/* A pool of keys for one run.  K_COLLIDE: keys homed in the last two and
 * first two slots of the largest table, so they pile up in a run that
 * wraps, in every smaller table too (homes keep their low bits). */
static void make_pool(enum keys kind, size_t limit, uint64_t *s, uint64_t *pool,
                      size_t n)
{
    size_t mask = 1, got = 0;

    while (mask + 1 < 2 * limit)
        mask = 2 * mask + 1;
    for (uint64_t k = rng_next(s) % 1000; got < n; k++) {
        size_t h = home_of(k, mask);

        if (kind == K_SMALL)
            pool[got++] = k;
        else if (kind == K_STEPS)
            pool[got++] = (k << 24) | (k % 3) << 8;
        else if (kind == K_RANDOM)
            pool[got++] = rng_next(s);
        else if (h + 2 > mask || h < 2)
            pool[got++] = k;
    }
    if (kind == K_RANDOM) { /* the edges of the key space */
        pool[0] = 0;
        pool[1] = UINT64_MAX;
    }
}

static void model_insert(struct model *md, size_t i, uint64_t key, uint64_t tag)
{
    memmove(md->key + i + 1, md->key + i, (md->n - i) * sizeof(*md->key));
    memmove(md->tag + i + 1, md->tag + i, (md->n - i) * sizeof(*md->tag));
    md->key[i] = key;
    md->tag[i] = tag;
    md->n++;
}

static void model_remove(struct model *md, size_t i)
{
    md->n--;
    memmove(md->key + i, md->key + i + 1, (md->n - i) * sizeof(*md->key));
    memmove(md->tag + i, md->tag + i + 1, (md->n - i) * sizeof(*md->tag));
}

/* A put, sometimes with every allocation failing: the map must answer
 * what the model predicts, DH_ENOMEM only when allocation was refused. */
static void step_put(struct dh_idmap *m, struct model *md, uint64_t key,
                     uint64_t r)
{
    int found, fail = (r >> 8) % 16 == 0, rc;
    size_t i = model_find(md, key, &found);
    void *p = NULL;

    dh__alloc_fail_after(fail ? 0 : -1);
    rc = dh__idmap_put(m, key, &p);
    dh__alloc_fail_reset();
    if (found || md->n == m->limit) {
        assert_int_equal(rc, found ? DH_EDUP : DH_ETOOBIG);
        assert_null(p);
    } else if (rc == DH_ENOMEM) {
        assert_true(fail); /* and nothing changed: check_all() sees it */
        assert_null(p);
    } else {
        assert_int_equal(rc, 0);
        fill(p, m->vsize, r);
        model_insert(md, i, key, r);
    }
}

static void step_del(struct dh_idmap *m, struct model *md, uint64_t key)
{
    int found;
    size_t i = model_find(md, key, &found);

    assert_int_equal(dh__idmap_del(m, key), found ? 0 : DH_ENOTFOUND);
    if (found)
        model_remove(md, i);
}

/* A get, and if the key is there a new value written in place. */
static void step_get(struct dh_idmap *m, struct model *md, uint64_t key,
                     uint64_t r)
{
    int found;
    size_t i = model_find(md, key, &found);
    unsigned char *p = dh__idmap_get(m, key);

    assert_int_equal(p != NULL, found);
    if (p) {
        check_val(p, m->vsize, md->tag[i]);
        fill(p, m->vsize, r);
        md->tag[i] = r;
    }
}

/* One random sequence (map shape, key kind and operations from the
 * seed) against the model, checked in full every 16 steps. */
static void run_seed(uint64_t seed)
{
    static const size_t vsizes[] = {1, 3, 8, 24};
    uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1, pool[96];
    size_t limit = 1 + rng_next(&s) % 48, vsize = vsizes[rng_next(&s) % 4];
    size_t reserve = rng_next(&s) % 2 ? limit : rng_next(&s) % (limit + 1);
    size_t npool = limit + 1 + rng_next(&s) % limit;
    struct dh_idmap m = mk(vsize, reserve, limit);
    struct model md = {.n = 0};

    make_pool((enum keys)(seed % K_KINDS), limit, &s, pool, npool);
    for (int it = 0; it < 400; it++) {
        uint64_t key = pool[rng_next(&s) % npool], r = rng_next(&s);

        if (r % 8 < 4)
            step_put(&m, &md, key, r);
        else if (r % 8 < 7)
            step_del(&m, &md, key);
        else
            step_get(&m, &md, key, r);
        assert_true(2 * md.n <= m.mask + 1); /* load <= 1/2 */
        if (it % 16 == 0)
            check_all(&m, &md, vsize);
    }
    check_all(&m, &md, vsize);
    dh__idmap_fini(&m);
}

static void matches_model_over_seeds(void **state)
{
    (void)state;
    for (uint64_t seed = 0; seed < 1000; seed++)
        run_seed(seed);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(init_rejects_bad_args),
        cmocka_unit_test(basics_and_edge_keys),
        cmocka_unit_test(del_mid_run_shifts_back),
        cmocka_unit_test(grows_to_its_limit),
        cmocka_unit_test(full_capacity_never_allocates),
        cmocka_unit_test(matches_model_over_seeds),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
