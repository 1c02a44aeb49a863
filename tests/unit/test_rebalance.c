/* test_rebalance.c - Tier-2's proposal, gate and plan
 * (datahelix/rebalance.h, docs/rebalance.md): a skewed round is evened out
 * with few moves and accepted when the measured link is fast, kept when it
 * is slow, kept as "unmeasured" with no bandwidth; a balanced round moves
 * nothing; a proposal that changes a rank's count is refused; the plan's
 * split sizes and offsets pack and unpack the same samples; on random
 * rounds the proposal never raises a step's max and keeps every count. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "core/alloc.h"
#include "datahelix/rebalance.h"

#define NEAR(a, b) assert_true((a) - (b) < 1e-9 && (b) - (a) < 1e-9)

/* 4 ranks, 1 step, 2 samples each of 1,000 bytes; rank 0 holds two
 * 1,000-token samples (the manifest said small), the rest 100 each. */
static void skewed(struct dh_rb_sample s[8])
{
    for (uint32_t i = 0; i < 8; i++)
        s[i] = (struct dh_rb_sample){i < 2 ? 1000 : 100, 1000, i / 2, 0};
}

static const struct dh_rb_gate fast = {
    .ms_per_token = 0.01, .bytes_per_ms = 1e6, .latency_ms = 1, .margin = 1.5};

static void skewed_round_moves_on_a_fast_link(void **state)
{
    struct dh_rb_sample s[8];
    struct dh_rb_decision d;
    struct dh_err e = {0};
    uint32_t to[8];

    (void)state;
    skewed(s);
    assert_int_equal(dh_rb_propose(s, 8, 4, 1, to, &e), 0);
    /* one 1,000-token sample swaps with a 100-token one of rank 1 (the
     * least loaded, lowest index); ranks 2 and 3 keep theirs */
    uint32_t want[8] = {1, 0, 0, 1, 2, 2, 3, 3};
    assert_memory_equal(to, want, sizeof(want));
    assert_int_equal(dh_rb_decide(s, to, 8, 4, 1, &fast, &d, &e), 0);
    assert_int_equal(d.verdict, DH_RB_MOVE);
    NEAR(d.before_ms, 2000 * 0.01);
    NEAR(d.after_ms, 1100 * 0.01);
    NEAR(d.gain_ms, 9);
    assert_int_equal(d.moved, 2);
    assert_int_equal(d.moved_bytes, 2000);
    assert_int_equal(d.max_rank_bytes, 1000); /* sends one, receives one */
    NEAR(d.cost_ms, 1 + 1000 / 1e6);
    NEAR(d.ratio_before, 2000 / 650.0);
    NEAR(d.ratio_after, 1100 / 650.0);
    assert_string_equal(dh_rb_verdict_name(d.verdict), "move");
}

static void slow_link_keeps_and_unmeasured_keeps(void **state)
{
    struct dh_rb_sample s[8];
    struct dh_rb_decision d;
    struct dh_rb_gate g = fast;
    uint32_t to[8];

    (void)state;
    skewed(s);
    assert_int_equal(dh_rb_propose(s, 8, 4, 1, to, NULL), 0);
    g.bytes_per_ms = 1000.0 / 6; /* 6 ms for 1,000 bytes: 7 x 1.5 > 9 */
    assert_int_equal(dh_rb_decide(s, to, 8, 4, 1, &g, &d, NULL), 0);
    assert_int_equal(d.verdict, DH_RB_KEEP);
    NEAR(d.cost_ms, 7);
    NEAR(d.gain_ms, 9);
    g.margin = 1.2; /* 7 x 1.2 = 8.4 < 9: the margin decides */
    assert_int_equal(dh_rb_decide(s, to, 8, 4, 1, &g, &d, NULL), 0);
    assert_int_equal(d.verdict, DH_RB_MOVE);
    g.bytes_per_ms = 0;
    assert_int_equal(dh_rb_decide(s, to, 8, 4, 1, &g, &d, NULL), 0);
    assert_int_equal(d.verdict, DH_RB_UNMEASURED);
    assert_string_equal(dh_rb_verdict_name(d.verdict), "unmeasured");
}

static void balanced_round_moves_nothing(void **state)
{
    struct dh_rb_sample s[8];
    struct dh_rb_decision d;
    uint32_t to[8];

    (void)state;
    for (uint32_t i = 0; i < 8; i++) /* 300 + 100 tokens on every rank */
        s[i] = (struct dh_rb_sample){i % 2 ? 100 : 300, 10, i / 2, 0};
    assert_int_equal(dh_rb_propose(s, 8, 4, 1, to, NULL), 0);
    for (uint32_t i = 0; i < 8; i++)
        assert_int_equal(to[i], s[i].rank);
    assert_int_equal(dh_rb_decide(s, to, 8, 4, 1, &fast, &d, NULL), 0);
    assert_int_equal(d.verdict, DH_RB_BALANCED);
    assert_int_equal(d.moved, 0);
    NEAR(d.cost_ms, 0);
    NEAR(d.ratio_before, 1);
}

static void steps_are_balanced_apart(void **state)
{
    /* 2 ranks, 2 steps: rank 0 is heavy at step 0, rank 1 at step 1;
     * the round's totals are equal, but each step waits for its slowest */
    struct dh_rb_sample s[8] = {
        {500, 1, 0, 0}, {500, 1, 0, 0}, {10, 1, 1, 0},  {10, 1, 1, 0},
        {10, 1, 0, 1},  {10, 1, 0, 1},  {500, 1, 1, 1}, {500, 1, 1, 1},
    };
    struct dh_rb_decision d;
    uint32_t to[8];

    (void)state;
    assert_int_equal(dh_rb_propose(s, 8, 2, 2, to, NULL), 0);
    assert_int_equal(dh_rb_decide(s, to, 8, 2, 2, &fast, &d, NULL), 0);
    NEAR(d.before_ms, (1000 + 1000) * 0.01);
    NEAR(d.after_ms, (510 + 510) * 0.01);
    assert_int_equal(d.moved, 4); /* one swap per step */
    assert_int_equal(d.verdict, DH_RB_MOVE);
}

static void count_change_is_refused(void **state)
{
    struct dh_rb_sample s[8];
    struct dh_rb_decision d;
    struct dh_err e = {0};
    uint32_t to[8] = {1, 1, 1, 1, 2, 2, 3, 3}; /* rank 0 loses both */

    (void)state;
    skewed(s);
    assert_int_equal(dh_rb_decide(s, to, 8, 4, 1, &fast, &d, &e), DH_EINVAL);
    assert_non_null(strstr(e.msg, "counts per rank and step"));
    to[0] = 7;
    assert_int_equal(dh_rb_decide(s, to, 8, 4, 1, &fast, &d, &e), DH_EINVAL);
    assert_non_null(strstr(e.msg, "sample 0"));
    s[3].rank = 9;
    assert_int_equal(dh_rb_propose(s, 8, 4, 1, to, &e), DH_EINVAL);
    assert_non_null(strstr(e.msg, "sample 3"));
    skewed(s);
    struct dh_rb_gate g = fast;
    g.ms_per_token = -1;
    assert_int_equal(dh_rb_decide(s, to, 8, 4, 1, &g, &d, &e), DH_EINVAL);
    assert_int_equal(dh_rb_propose(s, 8, 0, 1, to, &e), DH_EINVAL);
}

static void plan_packs_and_unpacks(void **state)
{
    /* 3 ranks; bytes distinct so that offsets say which sample is where */
    struct dh_rb_sample s[6] = {
        {1, 10, 0, 0}, {1, 20, 0, 0}, {1, 30, 1, 0},
        {1, 40, 1, 0}, {1, 50, 2, 0}, {1, 60, 2, 0},
    };
    uint32_t to[6] = {2, 1, 0, 1, 0, 2}; /* keeps: 3, 5 */
    uint64_t split[9];
    struct dh_rb_route rt[6];
    uint64_t want[9] = {0, 20, 10, 30, 0, 0, 50, 0, 0};

    (void)state;
    assert_int_equal(dh_rb_plan(s, to, 6, 3, split, rt, NULL), 0);
    assert_memory_equal(split, want, sizeof(want));
    /* rank 0 sends [s1 to 1][s0 to 2]: by destination */
    assert_int_equal(rt[1].send_off, 0);
    assert_int_equal(rt[0].send_off, 20);
    /* rank 0 receives [s2 from 1][s4 from 2]: by source */
    assert_int_equal(rt[2].recv_off, 0);
    assert_int_equal(rt[4].recv_off, 30);
    assert_int_equal(rt[1].recv_off, 0); /* rank 1's only arrival */
    assert_int_equal(rt[0].recv_off, 0); /* rank 2's only arrival */
    assert_int_equal(rt[3].src, rt[3].dst);
    assert_int_equal(rt[5].send_off + rt[5].recv_off, 0);
    to[0] = 3;
    assert_int_equal(dh_rb_plan(s, to, 6, 3, split, rt, NULL), DH_EINVAL);
}

/* A small LCG: reproducible random rounds. */
static uint64_t lcg(uint64_t *x)
{
    *x = *x * 6364136223846793005ull + 1442695040888963407ull;
    return *x >> 33;
}

static void random_rounds_never_worse(void **state)
{
    enum { R = 8, T = 4, B = 3, N = R * T * B };
    struct dh_rb_sample s[N];
    uint32_t to[N];
    uint64_t split[R * R];
    struct dh_rb_route rt[N];
    uint64_t x = 7;

    (void)state;
    for (int round = 0; round < 200; round++) {
        struct dh_rb_decision d;
        uint64_t sent = 0;

        for (uint32_t i = 0; i < N; i++)
            s[i] = (struct dh_rb_sample){(double)(lcg(&x) % 5000),
                                         lcg(&x) % 100000, (i / B) % R,
                                         i / (R * B)};
        assert_int_equal(dh_rb_propose(s, N, R, T, to, NULL), 0);
        /* decide refuses any count change: success proves they hold */
        assert_int_equal(dh_rb_decide(s, to, N, R, T, &fast, &d, NULL), 0);
        assert_true(d.after_ms <= d.before_ms + 1e-9);
        assert_true(d.ratio_after <= d.ratio_before + 1e-9);
        assert_true(d.ratio_after >= 1 - 1e-9);
        assert_int_equal(dh_rb_plan(s, to, N, R, split, rt, NULL), 0);
        for (uint32_t i = 0; i < R * R; i++)
            sent += split[i];
        assert_int_equal(sent, d.moved_bytes);
    }
}

static void allocation_failure_is_an_error(void **state)
{
    struct dh_rb_sample s[8];
    struct dh_rb_decision d;
    struct dh_err e = {0};
    uint32_t to[8] = {0, 0, 1, 1, 2, 2, 3, 3};

    (void)state;
    skewed(s);
    dh__alloc_fail_after(0);
    assert_int_equal(dh_rb_propose(s, 8, 4, 1, to, &e), DH_ENOMEM);
    assert_int_equal(dh_rb_decide(s, to, 8, 4, 1, &fast, &d, &e), DH_ENOMEM);
    dh__alloc_fail_reset();
    assert_non_null(strstr(e.msg, "out of memory"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(skewed_round_moves_on_a_fast_link),
        cmocka_unit_test(slow_link_keeps_and_unmeasured_keeps),
        cmocka_unit_test(balanced_round_moves_nothing),
        cmocka_unit_test(steps_are_balanced_apart),
        cmocka_unit_test(count_change_is_refused),
        cmocka_unit_test(plan_packs_and_unpacks),
        cmocka_unit_test(random_rounds_never_worse),
        cmocka_unit_test(allocation_failure_is_an_error),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
