/* test_spare.c - the skip policy's choice of substitutes (spare.h): a pure
 * function of (seed, epoch, step, rank, schedule); spares are distinct,
 * come from this schedule's other steps only, never from the step they
 * stand in for; another seed, step or rank draws others; a one-step
 * schedule has none; the rule itself is pinned by a golden value, so a
 * change to it (which would change every skip run's batches) is seen. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "datahelix/spare.h"

#define STEPS 10
#define B 4
/* dh_spare_choose(0, 0, 3, 0, ...) of schedule(), k 3: 127 129 126 133. */
#define GOLDEN 3279500772610000690ull

/* Step q holds ids 100 + q * B .. 100 + q * B + B - 1. */
static void schedule(uint64_t *ids, uint64_t *offs)
{
    for (uint64_t q = 0; q <= STEPS; q++)
        offs[q] = q * B;
    for (uint64_t i = 0; i < STEPS * B; i++)
        ids[i] = 100 + i;
}

static void test_pure_and_from_other_steps(void **state)
{
    uint64_t ids[STEPS * B], offs[STEPS + 1], a[8], b[8];
    (void)state;

    schedule(ids, offs);
    for (uint64_t k = 0; k < STEPS; k++) {
        uint32_t n = dh_spare_choose(7, 3, 40 + k, 1, ids, offs, STEPS, k, 8,
                                     a);
        uint32_t m = dh_spare_choose(7, 3, 40 + k, 1, ids, offs, STEPS, k, 8,
                                     b);

        assert_int_equal(n, 8);
        assert_int_equal(m, n);
        assert_memory_equal(a, b, n * sizeof(*a));
        for (uint32_t i = 0; i < n; i++) {
            assert_true(a[i] >= 100 && a[i] < 100 + STEPS * B);
            /* never the step it stands in for */
            assert_false(a[i] >= 100 + k * B && a[i] < 100 + (k + 1) * B);
            for (uint32_t j = 0; j < i; j++)
                assert_true(a[i] != a[j]);
        }
    }
}

static int same(const uint64_t *a, const uint64_t *b, uint32_t n)
{
    return memcmp(a, b, n * sizeof(*a)) == 0;
}

static void test_inputs_matter(void **state)
{
    uint64_t ids[STEPS * B], offs[STEPS + 1], a[4], b[4];
    (void)state;

    schedule(ids, offs);
    assert_int_equal(dh_spare_choose(1, 0, 5, 0, ids, offs, STEPS, 5, 4, a), 4);
    assert_int_equal(dh_spare_choose(2, 0, 5, 0, ids, offs, STEPS, 5, 4, b), 4);
    assert_false(same(a, b, 4)); /* seed */
    assert_int_equal(dh_spare_choose(1, 1, 5, 0, ids, offs, STEPS, 5, 4, b), 4);
    assert_false(same(a, b, 4)); /* epoch */
    assert_int_equal(dh_spare_choose(1, 0, 5, 1, ids, offs, STEPS, 5, 4, b), 4);
    assert_false(same(a, b, 4)); /* rank */
    assert_int_equal(dh_spare_choose(1, 0, 6, 0, ids, offs, STEPS, 5, 4, b), 4);
    assert_false(same(a, b, 4)); /* global step */
}

static void test_edges(void **state)
{
    uint64_t ids[STEPS * B], offs[STEPS + 1], out[64];
    uint64_t two_ids[] = {1, 2, 3}, two_offs[] = {0, 2, 3};
    (void)state;

    schedule(ids, offs);
    /* one step: nothing else to draw from */
    assert_int_equal(dh_spare_choose(1, 0, 0, 0, ids, offs, 1, 0, 4, out), 0);
    assert_int_equal(
        dh_spare_choose(1, 0, 0, 0, ids, offs, STEPS, STEPS, 4, out),
        0); /* k out of range */
    assert_int_equal(dh_spare_choose(1, 0, 0, 0, ids, offs, STEPS, 0, 0, out),
                     0);
    /* two steps, the other holding one id: that one, once, whatever asked */
    assert_int_equal(
        dh_spare_choose(1, 0, 0, 0, two_ids, two_offs, 2, 0, 4, out), 1);
    assert_int_equal(out[0], 3);
    assert_int_equal(
        dh_spare_choose(1, 0, 1, 0, two_ids, two_offs, 2, 1, 4, out), 2);
    assert_true((out[0] == 1 && out[1] == 2) || (out[0] == 2 && out[1] == 1));
}

/* The rule, pinned: a change of dh_spare_choose() changes what every
 * skip run delivers, and must be deliberate (update the value and
 * docs/dataserver.md). */
static void test_golden(void **state)
{
    uint64_t ids[STEPS * B], offs[STEPS + 1], out[4],
        h = 1469598103934665603ull;
    uint32_t n;
    (void)state;

    schedule(ids, offs);
    n = dh_spare_choose(0, 0, 3, 0, ids, offs, STEPS, 3, 4, out);
    assert_int_equal(n, 4);
    for (uint32_t i = 0; i < n; i++)
        h = (h ^ out[i]) * 1099511628211ull;
    assert_int_equal(h, GOLDEN);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pure_and_from_other_steps),
        cmocka_unit_test(test_inputs_matter),
        cmocka_unit_test(test_edges),
        cmocka_unit_test(test_golden),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
