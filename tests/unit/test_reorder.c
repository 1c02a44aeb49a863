/* test_reorder.c - the client's reorder buffer: request order restored
 * from any arrival order, the prefetch bound, duplicates and unknown ids
 * handed back for release, errors surfacing at exactly their next(), the
 * pending list, ring wrap-around against a model, allocation-freedom after
 * create.  The epoch property with the in-flight table is in
 * test_inflight.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/alloc.h"
#include "datahelix/reorder.h"

static struct dh_reorder *mk(size_t depth)
{
    struct dh_reorder *r = NULL;
    struct dh_err e;

    assert_int_equal(dh_reorder_create(depth, &r, &e), 0);
    return r;
}

static void expect(struct dh_reorder *r, uint64_t id)
{
    assert_int_equal(dh_reorder_expect(r, id), 0);
}

static int arrive(struct dh_reorder *r, uint64_t id, uint64_t payload)
{
    int acc = -1;

    assert_int_equal(dh_reorder_arrive(r, id, payload, &acc), 0);
    return acc;
}

/* next() must give (id, payload). */
static void next_is(struct dh_reorder *r, uint64_t id, uint64_t payload)
{
    uint64_t i = 0, p = 0;

    assert_int_equal(dh_reorder_next(r, &i, &p), 0);
    assert_int_equal(i, id);
    assert_int_equal(p, payload);
}

static void next_empty(struct dh_reorder *r)
{
    uint64_t i = 77, p = 88;

    assert_int_equal(dh_reorder_next(r, &i, &p), DH_EEMPTY);
    assert_int_equal(i, 77); /* nothing written */
    assert_int_equal(p, 88);
}

static void create_rejects_bad_args(void **state)
{
    struct dh_reorder *r = NULL;
    struct dh_err e;

    (void)state;
    assert_int_equal(dh_reorder_create(0, &r, &e), DH_EINVAL);
    assert_int_equal(e.code, DH_EINVAL);
    assert_int_equal(dh_reorder_create(DH_REORDER_MAX_DEPTH + 1ul, &r, &e),
                     DH_ETOOBIG);
    assert_int_equal(dh_reorder_create(4, NULL, NULL), DH_EINVAL);
    for (long n = 0; n < 3; n++) {
        dh__alloc_fail_after(n);
        assert_int_equal(dh_reorder_create(4, &r, &e), DH_ENOMEM);
        dh__alloc_fail_reset();
    }
    assert_null(r);
    dh_reorder_destroy(NULL);
    assert_int_equal(dh_reorder_count(NULL), 0);
    assert_int_equal(dh_reorder_depth(NULL), 0);
}

static void restores_request_order(void **state)
{
    struct dh_reorder *r = mk(4);

    (void)state;
    next_empty(r); /* nothing expected */
    expect(r, 30);
    expect(r, 10);
    expect(r, 20);
    expect(r, 0);
    assert_int_equal(dh_reorder_count(r), 4);
    assert_int_equal(arrive(r, 20, 200), 1);
    assert_int_equal(arrive(r, 0, 1000), 1);
    next_empty(r); /* head (30) pending */
    assert_int_equal(arrive(r, 10, 100), 1);
    next_empty(r);
    assert_int_equal(arrive(r, 30, 300), 1);
    next_is(r, 30, 300);
    next_is(r, 10, 100);
    next_is(r, 20, 200);
    next_is(r, 0, 1000);
    next_empty(r);
    assert_int_equal(dh_reorder_count(r), 0);
    dh_reorder_destroy(r);
}

static void bound_and_duplicate_expect(void **state)
{
    struct dh_reorder *r = mk(2);

    (void)state;
    expect(r, 1);
    assert_int_equal(dh_reorder_expect(r, 1), DH_EDUP);
    expect(r, 2);
    assert_int_equal(dh_reorder_expect(r, 3), DH_ETOOBIG);
    assert_int_equal(dh_reorder_expect(r, 2), DH_EDUP);
    assert_int_equal(arrive(r, 1, 11), 1);
    next_is(r, 1, 11);
    expect(r, 3); /* room again */
    /* A returned id is no longer outstanding: it may be expected again. */
    assert_int_equal(dh_reorder_expect(r, 1), DH_ETOOBIG);
    assert_int_equal(dh_reorder_expect(NULL, 1), DH_EINVAL);
    dh_reorder_destroy(r);
}

static void duplicates_and_unknown_are_refused(void **state)
{
    struct dh_reorder *r = mk(4);
    int acc;

    (void)state;
    expect(r, 5);
    expect(r, 6);
    assert_int_equal(arrive(r, 99, 1), 0); /* never expected */
    assert_int_equal(arrive(r, 6, 60), 1);
    assert_int_equal(arrive(r, 6, 61), 0); /* duplicate: caller releases */
    assert_int_equal(arrive(r, 5, 50), 1);
    next_is(r, 5, 50);
    assert_int_equal(arrive(r, 5, 51), 0); /* already returned */
    next_is(r, 6, 60);                     /* the first result was kept */
    assert_int_equal(dh_reorder_arrive(r, 5, 0, NULL), DH_EINVAL);
    assert_int_equal(dh_reorder_arrive(NULL, 5, 0, &acc), DH_EINVAL);
    dh_reorder_destroy(r);
}

static void error_surfaces_at_its_next(void **state)
{
    struct dh_reorder *r = mk(8);
    uint64_t id = 0, p = 4242;

    (void)state;
    for (uint64_t i = 1; i <= 4; i++)
        expect(r, i);
    assert_int_equal(dh_reorder_fail(r, 3, DH_EMEDIA), 0);
    assert_int_equal(arrive(r, 3, 33), 0); /* late result: released */
    assert_int_equal(dh_reorder_fail(r, 3, DH_EIO), DH_EDUP);
    assert_int_equal(arrive(r, 4, 44), 1);
    assert_int_equal(dh_reorder_fail(r, 4, DH_EIO), DH_EDUP); /* result kept */
    assert_int_equal(dh_reorder_fail(r, 9, DH_EIO), DH_ENOTFOUND);
    assert_int_equal(dh_reorder_fail(r, 2, 0), DH_EINVAL);
    assert_int_equal(dh_reorder_fail(r, 2, 5), DH_EINVAL);
    assert_int_equal(dh_reorder_fail(r, 2, DH_EEMPTY), DH_EINVAL);
    next_empty(r); /* 1 still pending: the error does not jump the queue */
    assert_int_equal(arrive(r, 1, 11), 1);
    assert_int_equal(dh_reorder_fail(r, 2, DH_ETIMEOUT), 0);
    next_is(r, 1, 11);
    assert_int_equal(dh_reorder_next(r, &id, &p), DH_ETIMEOUT);
    assert_int_equal(id, 2);
    assert_int_equal(p, 4242); /* no payload written for an error */
    assert_int_equal(dh_reorder_next(r, &id, &p), DH_EMEDIA);
    assert_int_equal(id, 3);
    next_is(r, 4, 44);
    next_empty(r);
    assert_int_equal(dh_reorder_fail(r, 3, DH_EIO), DH_ENOTFOUND);
    dh_reorder_destroy(r);
}

static void pending_lists_in_request_order(void **state)
{
    struct dh_reorder *r = mk(6);
    uint64_t out[6] = {0};
    size_t n = 99;

    (void)state;
    assert_int_equal(dh_reorder_pending(r, NULL, 0, &n), 0);
    assert_int_equal(n, 0);
    for (uint64_t i = 10; i < 16; i++)
        expect(r, i);
    assert_int_equal(arrive(r, 11, 1), 1);
    assert_int_equal(dh_reorder_fail(r, 13, DH_EIO), 0);
    assert_int_equal(arrive(r, 15, 1), 1);
    n = 99;
    assert_int_equal(dh_reorder_pending(r, out, 2, &n), DH_ETOOBIG);
    assert_int_equal(n, 99);
    assert_int_equal(dh_reorder_pending(r, out, 6, &n), 0);
    assert_int_equal(n, 3);
    assert_int_equal(out[0], 10);
    assert_int_equal(out[1], 12);
    assert_int_equal(out[2], 14);
    assert_int_equal(dh_reorder_pending(r, NULL, 6, &n), DH_EINVAL);
    dh_reorder_destroy(r);
}

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 2685821657736338717ull;
}

/* A long stream through small windows (the ring wraps many times, the
 * index shifts entries back on every next()): random arrival order, random
 * duplicates, every task returned once in order, no allocation. */
static void stream_wraps_ring(void **state)
{
    (void)state;
    for (size_t depth = 1; depth <= 9; depth++) {
        struct dh_reorder *r = mk(depth);
        uint64_t s = depth * 7919u + 1, issued = 0, got = 0;
        const uint64_t total = 5000;

        dh__alloc_fail_after(0);
        while (got < total) {
            uint64_t id, p, ids[16];
            size_t n;

            while (issued < total && dh_reorder_count(r) < depth)
                expect(r, (issued++) << 24); /* clustered, like step ids */
            assert_int_equal(dh_reorder_pending(r, ids, 16, &n), 0);
            if (n) {
                uint64_t pick = ids[rng_next(&s) % n];

                assert_int_equal(arrive(r, pick, pick + 1), 1);
                if (rng_next(&s) % 3 == 0)
                    assert_int_equal(arrive(r, pick, 0), 0);
            }
            while (dh_reorder_next(r, &id, &p) == 0) {
                assert_int_equal(id, got << 24);
                assert_int_equal(p, id + 1);
                got++;
            }
        }
        next_empty(r);
        assert_int_equal(dh__alloc_failures(), 0);
        dh__alloc_fail_reset();
        dh_reorder_destroy(r);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(create_rejects_bad_args),
        cmocka_unit_test(restores_request_order),
        cmocka_unit_test(bound_and_duplicate_expect),
        cmocka_unit_test(duplicates_and_unknown_are_refused),
        cmocka_unit_test(error_surfaces_at_its_next),
        cmocka_unit_test(pending_lists_in_request_order),
        cmocka_unit_test(stream_wraps_ring),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
