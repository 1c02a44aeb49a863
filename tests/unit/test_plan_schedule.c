/* test_plan_schedule.c - dh_plan_schedule() (plan.h): a rank's flattened
 * share is exactly dh_plan_rank_ids() step by step; the ranks' shares
 * partition the epoch; a subset is planned over its own columns and named
 * by its ids (every subset id once over the ranks, none other); max_steps
 * truncates; bad ranks and subset ids are DH_EINVAL naming them. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "datahelix/plan.h"

#define N 203

static uint32_t tok[N];
static uint16_t prof[N];

static void columns(void)
{
    uint64_t x = 0x9E3779B97F4A7C15ull;

    for (int i = 0; i < N; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        tok[i] = 100 + (uint32_t)(x % 5000); /* a heavy-tailed-ish mix */
        prof[i] = (uint16_t)(x % 3);
    }
}

static void opts(struct dh_plan_opts *o, uint32_t world, int drop_last)
{
    dh_plan_opts_init(o);
    o->world_size = world;
    o->batch_size = 4;
    o->seed = 7;
    o->epoch = 3;
    o->drop_last = drop_last;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

    return x < y ? -1 : x > y;
}

static void flattened_is_the_plans_rank_ids(void **state)
{
    struct dh_plan_opts o;
    struct dh_plan *p;
    struct dh_err e;
    uint64_t seen = 0;

    (void)state;
    columns();
    opts(&o, 3, 1);
    assert_int_equal(dh_plan_create(tok, prof, N, &o, &p, &e), 0);
    for (uint32_t r = 0; r < 3; r++) {
        struct dh_plan_schedule s;

        assert_int_equal(
            dh_plan_schedule(tok, prof, N, NULL, 0, &o, r, 0, &s, &e), 0);
        assert_int_equal(s.n_steps, dh_plan_steps(p));
        assert_int_equal(s.offs[0], 0);
        for (uint64_t k = 0; k < s.n_steps; k++) {
            uint64_t cnt = 0;
            const uint64_t *ids = dh_plan_rank_ids(p, k, r, &cnt);

            assert_int_equal(s.offs[k + 1] - s.offs[k], cnt);
            assert_memory_equal(s.ids + s.offs[k], ids, cnt * 8);
        }
        assert_int_equal(s.offs[s.n_steps], s.n_ids);
        seen += s.n_ids;
        dh_plan_schedule_free(&s);
        assert_null(s.ids);
    }
    assert_int_equal(seen, dh_plan_kept(p));
    dh_plan_destroy(p);

    /* max_steps: the first steps of the same schedule. */
    {
        struct dh_plan_schedule all, two;

        assert_int_equal(
            dh_plan_schedule(tok, prof, N, NULL, 0, &o, 1, 0, &all, &e), 0);
        assert_int_equal(
            dh_plan_schedule(tok, prof, N, NULL, 0, &o, 1, 2, &two, &e), 0);
        assert_int_equal(two.n_steps, 2);
        assert_int_equal(two.n_ids, all.offs[2]);
        assert_memory_equal(two.ids, all.ids, two.n_ids * 8);
        dh_plan_schedule_free(&all);
        dh_plan_schedule_free(&two);
    }
}

/* The rest of an epoch (every third id from 5 on) re-planned over 2 ranks
 * without drop_last: each of its ids exactly once, named as itself. */
static void subset_is_planned_and_named_by_its_ids(void **state)
{
    uint64_t sub[N], n = 0, got[N], ngot = 0;
    struct dh_plan_opts o;
    struct dh_err e;

    (void)state;
    columns();
    for (uint64_t i = 5; i < N; i += 3)
        sub[n++] = i;
    opts(&o, 2, 0);
    for (uint32_t r = 0; r < 2; r++) {
        struct dh_plan_schedule s;

        assert_int_equal(
            dh_plan_schedule(tok, prof, N, sub, n, &o, r, 0, &s, &e), 0);
        assert_true(ngot + s.n_ids <= N);
        memcpy(got + ngot, s.ids, s.n_ids * 8);
        ngot += s.n_ids;
        dh_plan_schedule_free(&s);
    }
    assert_int_equal(ngot, n);
    qsort(got, ngot, 8, cmp_u64);
    assert_memory_equal(got, sub, n * 8); /* sub is sorted already */
}

static void bad_rank_and_subset_ids_are_einval(void **state)
{
    struct dh_plan_schedule s = {0};
    struct dh_plan_opts o;
    uint64_t sub[2] = {3, N};
    struct dh_err e;

    (void)state;
    columns();
    opts(&o, 2, 1);
    assert_int_equal(dh_plan_schedule(tok, prof, N, NULL, 0, &o, 2, 0, &s, &e),
                     DH_EINVAL);
    assert_non_null(strstr(e.msg, "rank 2 of world size 2"));
    assert_int_equal(dh_plan_schedule(tok, prof, N, sub, 2, &o, 0, 0, &s, &e),
                     DH_EINVAL);
    assert_non_null(strstr(e.msg, "subset id 203 is not in the index"));
    assert_null(s.ids); /* untouched on error */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(flattened_is_the_plans_rank_ids),
        cmocka_unit_test(subset_is_planned_and_named_by_its_ids),
        cmocka_unit_test(bad_rank_and_subset_ids_are_einval),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
