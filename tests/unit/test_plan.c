/* test_plan.c - the Tier-1 planner (src/include/datahelix/plan.h): property
 * tests over random manifests, world sizes, batch sizes, seeds and
 * drop_last (exactly once, determinism, fixed counts, epochs differ, `none`
 * = contiguous chunks), allocation failures, and the balance on a
 * heavy-tailed 224p/336p/448p/720p mix, printed beside the random split
 * and per-step greedy; a 100,003-sample epoch planned exactly once.  The
 * planning time of a large epoch is bench/bench_plan_time.c's. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/alloc.h"
#include "datahelix/estimate.h"
#include "datahelix/plan.h"
#include "heavy_mix.h"

/* A small local generator for the test's manifests (not the planner's). */
static void random_manifest(uint64_t *s, uint64_t n, uint32_t *tok,
                            uint16_t *prof)
{
    for (uint64_t i = 0; i < n; i++) {
        prof[i] = (uint16_t)(heavy_mix_rnd(s) % 5);
        tok[i] = (uint32_t)(heavy_mix_rnd(s) % 4
                                ? heavy_mix_rnd(s) % (1000u << prof[i])
                                : heavy_mix_rnd(s) % 3); /* some zero/tiny */
    }
}

static struct dh_plan *make(const uint32_t *tok, const uint16_t *prof,
                            uint64_t n, const struct dh_plan_opts *o)
{
    struct dh_plan *p = NULL;
    struct dh_err e;

    assert_int_equal(dh_plan_create(tok, prof, n, o, &p, &e), 0);
    return p;
}

/* Every id at most once, all of the kept part, counts and token sums. */
static void check_exactly_once(const struct dh_plan *p, const uint32_t *tok,
                               uint64_t n, const struct dh_plan_opts *o)
{
    unsigned char *seen = calloc(n, 1);
    uint64_t per = (uint64_t)o->world_size * o->batch_size, total = 0;

    assert_non_null(seen);
    assert_int_equal(dh_plan_steps(p),
                     o->drop_last ? n / per : (n + per - 1) / per);
    assert_int_equal(dh_plan_kept(p), o->drop_last ? n / per * per : n);
    for (uint64_t g = 0; g < dh_plan_steps(p); g++) {
        uint64_t step_total = 0;

        for (uint32_t r = 0; r < o->world_size; r++) {
            uint64_t c, sum = 0;
            const uint64_t *ids = dh_plan_rank_ids(p, g, r, &c);

            for (uint64_t i = 0; i < c; i++) {
                assert_true(ids[i] < n);
                assert_int_equal(seen[ids[i]], 0);
                seen[ids[i]] = 1;
                sum += tok[ids[i]];
            }
            assert_int_equal(sum, dh_plan_rank_tokens(p, g, r));
            if (g + 1 < dh_plan_steps(p) || n % per == 0 || o->drop_last) {
                if (o->balance == DH_BALANCE_FREE)
                    assert_true(c >= 1);
                else
                    assert_int_equal(c, o->batch_size);
            }
            step_total += c;
            total += c;
        }
        if (o->balance != DH_BALANCE_FREE || o->window == 1)
            assert_true(step_total == per || g + 1 == dh_plan_steps(p));
    }
    assert_int_equal(total, dh_plan_kept(p));
    free(seen);
}

static int same_plan(const struct dh_plan *a, const struct dh_plan *b)
{
    if (dh_plan_steps(a) != dh_plan_steps(b))
        return 0;
    for (uint64_t g = 0; g < dh_plan_steps(a); g++)
        for (uint32_t r = 0; r < dh_plan_world_size(a); r++) {
            uint64_t ca, cb;
            const uint64_t *x = dh_plan_rank_ids(a, g, r, &ca);
            const uint64_t *y = dh_plan_rank_ids(b, g, r, &cb);

            if (ca != cb || (ca && memcmp(x, y, ca * sizeof(*x))))
                return 0;
        }
    return 1;
}

static void random_opts(uint64_t *s, struct dh_plan_opts *o)
{
    dh_plan_opts_init(o);
    o->world_size = 1 + (uint32_t)(heavy_mix_rnd(s) % 9);
    o->batch_size = 1 + (uint32_t)(heavy_mix_rnd(s) % 7);
    o->seed = heavy_mix_rnd(s);
    o->epoch = heavy_mix_rnd(s) % 5;
    o->balance = (int)(heavy_mix_rnd(s) % 3);
    o->window = (uint32_t)(heavy_mix_rnd(s) % 6); /* 0 = default */
    o->drop_last = (int)(heavy_mix_rnd(s) % 2);
    o->order = (int)(heavy_mix_rnd(s) % 2);
}

static void properties_hold_over_random_inputs(void **state)
{
    uint64_t s = 12345;

    (void)state;
    for (int iter = 0; iter < 300; iter++) {
        struct dh_plan_opts o;
        uint64_t n = 1 + heavy_mix_rnd(&s) % 400;
        uint32_t *tok = malloc(n * sizeof(*tok));
        uint16_t *prof = malloc(n * sizeof(*prof));

        assert_non_null(tok);
        assert_non_null(prof);
        random_opts(&s, &o);
        random_manifest(&s, n, tok, prof);
        if (o.drop_last && n < (uint64_t)o.world_size * o.batch_size)
            o.drop_last = 0; /* that is an error case, tested below */
        struct dh_plan *a = make(tok, iter % 7 ? prof : NULL, n, &o);
        struct dh_plan *b = make(tok, iter % 7 ? prof : NULL, n, &o);

        check_exactly_once(a, tok, n, &o);
        /* "two ranks": the same inputs give the same plan */
        assert_true(same_plan(a, b));
        dh_plan_destroy(a);
        dh_plan_destroy(b);
        free(tok);
        free(prof);
    }
}

static void fixed_counts_exact_and_free_nonempty(void **state)
{
    enum { N = 5000 };
    static uint32_t tok[N];
    static uint16_t prof[N];
    struct dh_plan_opts o;

    (void)state;
    assert_int_equal(heavy_mix(3, N, tok, prof), 0);
    dh_plan_opts_init(&o);
    o.world_size = 7;
    o.batch_size = 5;
    for (int bal = DH_BALANCE_FIXED; bal <= DH_BALANCE_FREE; bal++)
        for (uint32_t w = 1; w <= 16; w *= 2) {
            o.balance = bal;
            o.window = w;
            struct dh_plan *p = make(tok, prof, N, &o);

            check_exactly_once(p, tok, N, &o);
            dh_plan_destroy(p);
        }
}

static void epochs_and_seeds_differ(void **state)
{
    enum { N = 1000 };
    uint64_t a[N], b[N], c[N];

    (void)state;
    dh_plan_permutation(N, 7, 0, a);
    dh_plan_permutation(N, 7, 1, b);
    dh_plan_permutation(N, 8, 0, c);
    assert_true(memcmp(a, b, sizeof(a)) != 0);
    assert_true(memcmp(a, c, sizeof(a)) != 0);
    dh_plan_permutation(N, 7, 1, c);
    assert_memory_equal(b, c, sizeof(b)); /* deterministic */
    /* a permutation */
    memset(c, 0, sizeof(c));
    for (int i = 0; i < N; i++)
        c[a[i]]++;
    for (int i = 0; i < N; i++)
        assert_int_equal(c[i], 1);
}

/* Equal tokens (every clip sampled at one size) are the common case: the
 * plan, not only the permutation under it, must change with the epoch and
 * the seed, and stay the same for the same inputs. */
static void equal_tokens_plans_differ_by_epoch_and_seed(void **state)
{
    enum { N = 32 };
    uint32_t tok[N];
    struct dh_plan_opts o;

    (void)state;
    for (int i = 0; i < N; i++)
        tok[i] = 1904;
    tok[5] = 2016;
    dh_plan_opts_init(&o);
    o.world_size = 4;
    o.batch_size = 2;
    for (int bal = DH_BALANCE_FIXED; bal <= DH_BALANCE_FREE; bal++) {
        o.balance = bal;
        o.seed = 0;
        o.epoch = 0;
        struct dh_plan *a = make(tok, NULL, N, &o);
        struct dh_plan *a2 = make(tok, NULL, N, &o);
        o.epoch = 1;
        struct dh_plan *b = make(tok, NULL, N, &o);
        o.epoch = 0;
        o.seed = 5;
        struct dh_plan *c = make(tok, NULL, N, &o);

        assert_true(same_plan(a, a2));
        assert_false(same_plan(a, b));
        assert_false(same_plan(a, c));
        check_exactly_once(b, tok, N, &o);
        dh_plan_destroy(a);
        dh_plan_destroy(a2);
        dh_plan_destroy(b);
        dh_plan_destroy(c);
    }
}

static void none_is_contiguous_chunks(void **state)
{
    enum { N = 1003 };
    static uint32_t tok[N];
    static uint16_t prof[N];
    uint64_t perm[N], s = 5;
    struct dh_plan_opts o;

    (void)state;
    random_manifest(&s, N, tok, prof);
    dh_plan_opts_init(&o);
    o.world_size = 4;
    o.batch_size = 10;
    o.seed = 42;
    o.epoch = 3;
    o.balance = DH_BALANCE_NONE;
    o.drop_last = 0;
    dh_plan_permutation(N, 42, 3, perm);
    struct dh_plan *p = make(tok, prof, N, &o);
    uint64_t k = 0;

    for (uint64_t g = 0; g < dh_plan_steps(p); g++)
        for (uint32_t r = 0; r < 4; r++) {
            uint64_t c;
            const uint64_t *ids = dh_plan_rank_ids(p, g, r, &c);

            for (uint64_t i = 0; i < c; i++)
                assert_int_equal(ids[i], perm[k++]);
        }
    assert_int_equal(k, N);
    /* partial last step: 1003 - 25 x 40 = 3 samples over 4 ranks */
    uint64_t c;
    (void)dh_plan_rank_ids(p, 25, 3, &c);
    assert_int_equal(c, 0);
    (void)dh_plan_rank_ids(p, 25, 0, &c);
    assert_int_equal(c, 1);
    dh_plan_destroy(p);
}

static void bad_options_are_errors(void **state)
{
    uint32_t tok[10] = {0};
    struct dh_plan_opts o;
    struct dh_plan *p = (struct dh_plan *)&o; /* untouched on error */
    struct dh_err e;

    (void)state;
    dh_plan_opts_init(&o);
    o.world_size = 0;
    assert_int_equal(dh_plan_create(tok, NULL, 10, &o, &p, &e), DH_EINVAL);
    assert_non_null(strstr(e.msg, "world size"));
    o.world_size = 4;
    o.batch_size = 3; /* 12 > 10 with drop_last */
    assert_int_equal(dh_plan_create(tok, NULL, 10, &o, &p, &e), DH_EINVAL);
    assert_non_null(strstr(e.msg, "drop_last"));
    o.batch_size = 1;
    assert_int_equal(dh_plan_create(tok, NULL, 0, &o, &p, &e), DH_EINVAL);
    o.balance = 9;
    assert_int_equal(dh_plan_create(tok, NULL, 10, &o, &p, &e), DH_EINVAL);
    o.balance = DH_BALANCE_FIXED;
    o.order = 2;
    assert_int_equal(dh_plan_create(tok, NULL, 10, &o, &p, &e), DH_EINVAL);
    assert_non_null(strstr(e.msg, "step order"));
    assert_ptr_equal(p, (struct dh_plan *)&o);
}

static void allocation_failures_are_clean(void **state)
{
    enum { N = 300 };
    static uint32_t tok[N];
    static uint16_t prof[N];
    uint64_t s = 1;
    struct dh_plan_opts o;

    (void)state;
    random_manifest(&s, N, tok, prof);
    dh_plan_opts_init(&o);
    o.world_size = 3;
    o.batch_size = 4;
    for (uint32_t w = 1; w <= 2; w++) {
        o.window = w;
        for (long k = 0; k < 40; k++) {
            struct dh_plan *p = NULL;
            int rc;

            dh__alloc_fail_after(k);
            rc = dh_plan_create(tok, prof, N, &o, &p, NULL);
            dh__alloc_fail_reset();
            if (rc == 0) {
                dh_plan_destroy(p);
                break;
            }
            assert_int_equal(rc, DH_ENOMEM);
        }
    }
}

/* ---- balance on the heavy-tailed mix ---- */
#define MIX_N 200000
#define MIX_WORLD 8
#define MIX_BATCH 4

/* Default options for the heavy mix's world and batch size. */
static void mix_opts(struct dh_plan_opts *o)
{
    dh_plan_opts_init(o);
    o->world_size = MIX_WORLD;
    o->batch_size = MIX_BATCH;
}

static double mix_balance(const uint32_t *tok, const uint16_t *prof,
                          int balance, uint32_t window, double *worst)
{
    struct dh_plan_opts o;
    double mean;

    mix_opts(&o);
    o.seed = 2024;
    o.balance = balance;
    o.window = window;
    struct dh_plan *p = make(tok, prof, MIX_N, &o);
    dh_plan_balance(p, &mean, worst);
    dh_plan_destroy(p);
    return mean;
}

static void heavy_tailed_mix_is_balanced(void **state)
{
    uint32_t *tok = malloc(MIX_N * sizeof(*tok));
    uint16_t *prof = malloc(MIX_N * sizeof(*prof));
    double none, greedy, win, wn, wg, ww;

    (void)state;
    assert_non_null(tok);
    assert_non_null(prof);
    assert_int_equal(heavy_mix(11, MIX_N, tok, prof), 0);
    none = mix_balance(tok, prof, DH_BALANCE_NONE, 0, &wn);
    greedy = mix_balance(tok, prof, DH_BALANCE_FIXED, 1, &wg);
    win = mix_balance(tok, prof, DH_BALANCE_FIXED, 0, &ww);
    print_message("heavy-tailed mix, %d samples, world %d x batch %d, "
                  "fixed counts: max/mean rank tokens per step (mean / "
                  "worst)\n",
                  MIX_N, MIX_WORLD, MIX_BATCH);
    print_message("  random split (none)   %.3f / %.3f\n", none, wn);
    print_message("  per-step greedy (W=1) %.3f / %.3f\n", greedy, wg);
    print_message("  windowed (W=%u)        %.3f / %.3f\n",
                  DH_PLAN_WINDOW_DEFAULT, win, ww);
    for (uint32_t w = 2; w <= 32; w *= 2) {
        double m = mix_balance(tok, prof, DH_BALANCE_FIXED, w, &ww);
        double f = mix_balance(tok, prof, DH_BALANCE_FREE, w, &wg);

        print_message("  W=%-2u fixed %.3f / %.3f   free %.3f / %.3f\n", w, m,
                      ww, f, wg);
    }
    assert_true(win <= 1.10);
    assert_true(greedy < none);
    assert_true(win <= greedy);
    free(tok);
    free(prof);
}

/* The heaviest rank rotates: no rank is always the heavy one. */
static void heaviest_rank_rotates(void **state)
{
    enum { N = 20000 };
    static uint32_t tok[N];
    static uint16_t prof[N];
    uint64_t heavy[MIX_WORLD] = {0};
    struct dh_plan_opts o;

    (void)state;
    assert_int_equal(heavy_mix(17, N, tok, prof), 0);
    mix_opts(&o);
    for (uint32_t w = 1; w <= 8; w *= 8) {
        o.window = w;
        struct dh_plan *p = make(tok, prof, N, &o);
        uint64_t steps = dh_plan_steps(p), unique = 0;

        memset(heavy, 0, sizeof(heavy));
        for (uint64_t g = 0; g < steps; g++) {
            uint32_t arg = 0, ties = 0;

            for (uint32_t r = 1; r < MIX_WORLD; r++) {
                uint64_t t = dh_plan_rank_tokens(p, g, r);
                uint64_t m = dh_plan_rank_tokens(p, g, arg);

                ties = t == m ? ties + 1 : t > m ? 0 : ties;
                arg = t > m ? r : arg;
            }
            if (ties == 0) { /* a strict heaviest rank */
                heavy[arg]++;
                unique++;
            }
        }
        for (uint32_t r = 0; r < MIX_WORLD; r++)
            assert_true(heavy[r] > unique / MIX_WORLD / 2);
        dh_plan_destroy(p);
    }
}

/* A step's tokens over all ranks. */
static uint64_t step_tokens(const struct dh_plan *p, uint64_t g)
{
    uint64_t t = 0;

    for (uint32_t r = 0; r < MIX_WORLD; r++)
        t += dh_plan_rank_tokens(p, g, r);
    return t;
}

/*
 * Within a window the steps run heavy, light, heavy, light: every step at
 * an even position carries at least the tokens of every step at an odd
 * one, so decode work never comes as a run of heavy steps.
 */
static void steps_alternate_heavy_and_light(void **state)
{
    enum { N = 6000 };
    static uint32_t tok[N];
    static uint16_t prof[N];
    static const uint32_t windows[] = {16, 5, 2};
    struct dh_plan_opts o;

    (void)state;
    assert_int_equal(heavy_mix(23, N, tok, prof), 0);
    mix_opts(&o);
    for (size_t k = 0; k < sizeof(windows) / sizeof(windows[0]); k++) {
        o.window = windows[k];
        struct dh_plan *p = make(tok, prof, N, &o);
        uint64_t full = dh_plan_steps(p) / o.window;

        assert_true(full > 4);
        for (uint64_t wi = 0; wi < full; wi++) {
            uint64_t min_even = UINT64_MAX, max_odd = 0;

            for (uint32_t pos = 0; pos < o.window; pos++) {
                uint64_t t = step_tokens(p, wi * o.window + pos);

                if (pos % 2 == 0)
                    min_even = t < min_even ? t : min_even;
                else
                    max_odd = t > max_odd ? t : max_odd;
            }
            if (min_even < max_odd)
                print_message("W=%u window %llu: %llu < %llu tokens\n",
                              o.window, (unsigned long long)wi,
                              (unsigned long long)min_even,
                              (unsigned long long)max_odd);
            assert_true(min_even >= max_odd);
        }
        dh_plan_destroy(p);
    }
}

/* The same bins in a window, sorted (DH_ORDER_SORTED): heaviest first in
 * even windows, lightest first in odd ones, so a window ends with steps
 * like those the next begins with; the steps are those of the alternating
 * order (the same multiset of step token sums per window). */
static void sorted_steps_ramp_down_then_up(void **state)
{
    enum { N = 6000 };
    static uint32_t tok[N];
    static uint16_t prof[N];
    static const uint32_t windows[] = {16, 5};
    struct dh_plan_opts o;

    (void)state;
    assert_int_equal(heavy_mix(23, N, tok, prof), 0);
    mix_opts(&o);
    for (size_t k = 0; k < sizeof(windows) / sizeof(windows[0]); k++) {
        struct dh_plan *alt, *srt;
        uint64_t full;

        o.window = windows[k];
        o.order = DH_ORDER_ALTERNATE;
        alt = make(tok, prof, N, &o);
        o.order = DH_ORDER_SORTED;
        srt = make(tok, prof, N, &o);
        check_exactly_once(srt, tok, N, &o);
        full = dh_plan_steps(srt) / o.window;
        assert_true(full > 4);
        for (uint64_t wi = 0; wi < full; wi++) {
            uint64_t sum_a = 0, sum_s = 0, sq_a = 0, sq_s = 0, prev = 0;

            for (uint32_t pos = 0; pos < o.window; pos++) {
                uint64_t g = wi * o.window + pos;
                uint64_t ta = step_tokens(alt, g), ts = step_tokens(srt, g);

                if (pos > 0) {
                    if (wi % 2 == 0)
                        assert_true(ts <= prev);
                    else
                        assert_true(ts >= prev);
                }
                prev = ts;
                sum_a += ta, sum_s += ts;
                sq_a += ta * ta, sq_s += ts * ts;
            }
            assert_int_equal(sum_a, sum_s);
            assert_int_equal(sq_a, sq_s);
        }
        dh_plan_destroy(alt);
        dh_plan_destroy(srt);
    }
}

/*
 * A large epoch is planned completely: every id once, every rank's count
 * and token sum right, with the default window.  (How long planning takes
 * is bench/bench_plan_time.c's to say, `make bench-plan`.)
 */
static void large_epoch_is_exactly_once(void **state)
{
    enum { N = 100003 }; /* a partial last step too */
    uint32_t *tok = malloc(N * sizeof(*tok));
    uint16_t *prof = malloc(N * sizeof(*prof));
    struct dh_plan_opts o;

    (void)state;
    assert_non_null(tok);
    assert_non_null(prof);
    assert_int_equal(heavy_mix(5, N, tok, prof), 0);
    mix_opts(&o);
    o.drop_last = 0;
    struct dh_plan *p = make(tok, prof, N, &o);

    assert_int_equal(dh_plan_window(p), DH_PLAN_WINDOW_DEFAULT);
    check_exactly_once(p, tok, N, &o);
    dh_plan_destroy(p);
    free(tok);
    free(prof);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(properties_hold_over_random_inputs),
        cmocka_unit_test(fixed_counts_exact_and_free_nonempty),
        cmocka_unit_test(epochs_and_seeds_differ),
        cmocka_unit_test(equal_tokens_plans_differ_by_epoch_and_seed),
        cmocka_unit_test(none_is_contiguous_chunks),
        cmocka_unit_test(bad_options_are_errors),
        cmocka_unit_test(allocation_failures_are_clean),
        cmocka_unit_test(heavy_tailed_mix_is_balanced),
        cmocka_unit_test(heaviest_rank_rotates),
        cmocka_unit_test(steps_alternate_heavy_and_light),
        cmocka_unit_test(sorted_steps_ramp_down_then_up),
        cmocka_unit_test(large_epoch_is_exactly_once),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
