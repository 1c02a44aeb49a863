/*
 * datahelix/plan.h - the Tier-1 planner (paper Sec. 3.4, Algorithm 1 lines
 * 1-9; DESIGN 3 "Tier 1 contract"; docs/planner.md).
 *
 * For each global step of an epoch the planner draws world_size x
 * batch_size sample ids from the epoch permutation (seed, epoch) and
 * assigns them to ranks so that every rank gets about the same number of
 * estimated tokens.  Beyond Algorithm 1, a planning window W balances W
 * steps at once: the next W x world x batch ids fill W x world bins
 * (largest first into the lightest bin), bins of similar load form a step,
 * and the W steps run in a seeded random order.
 *
 * Determinism: the plan is a pure function of (tokens, profile, n, opts):
 * every rank computes the same plan without talking to the others, on any
 * host, in any process.  Pure logic: no I/O; allocation only through the
 * library's allocation seam.
 *
 * Exactly once: over an epoch every id in [0, n) appears at most once, and
 * every id of the kept part (all of them with drop_last = 0) exactly once.
 *
 * Thread-safety: dh_plan_create() and dh_plan_permutation() are reentrant.
 * A created plan is immutable: its read functions may be called from any
 * number of threads at once; dh_plan_destroy() must not race with them.
 */
#ifndef DATAHELIX_PLAN_H
#define DATAHELIX_PLAN_H

#include <stdint.h>

#include "datahelix/error.h"

enum dh_balance {
    DH_BALANCE_FIXED = 0, /* exactly batch_size per rank (LPT with a
                             cardinality cap); the default */
    DH_BALANCE_FREE = 1,  /* counts may differ (each rank >= 1), tokens
                             equalised; planned step by step (the window is
                             ignored) so every step keeps world x batch */
    DH_BALANCE_NONE = 2,  /* random split: the permutation cut into
                             contiguous chunks (the baseline) */
};

/* The order of a planning window's steps (docs/planner.md "Step order"). */
enum dh_step_order {
    DH_ORDER_ALTERNATE = 0, /* heavy, light, heavy, light: for a GPU step
                               whose time does not follow tokens (a light
                               step's spare decode time covers the next
                               heavy one); the default */
    DH_ORDER_SORTED = 1,    /* heaviest to lightest, the next window back
                               up: for a GPU step whose time follows tokens
                               (VLMs), where a heavy step after a light one
                               finds no time banked when the CPUs are short */
};

#define DH_PLAN_WINDOW_DEFAULT 16u /* chosen by measurement: docs/planner.md */
#define DH_PLAN_WINDOW_MAX 4096u
#define DH_PLAN_WORLD_MAX (1u << 20)
#define DH_PLAN_BATCH_MAX (1u << 20)
#define DH_PLAN_STEP_MAX (1u << 24)   /* world x batch */
#define DH_PLAN_WINDOW_IDS (1u << 26) /* window x world x batch */

/* Caller-owned options; dh_plan_opts_init() sets the defaults. */
struct dh_plan_opts {
    uint32_t world_size; /* ranks, >= 1 */
    uint32_t batch_size; /* samples per rank per step, >= 1 */
    uint64_t seed;
    uint64_t epoch;
    int balance;     /* enum dh_balance */
    uint32_t window; /* steps planned together; 0 = default; 1 =
                            per-step greedy (Algorithm 1 exactly).  Ignored
                            with DH_BALANCE_NONE. */
    int drop_last;   /* 1 (default): floor(n / (world x batch)) steps,
                            the remainder is not delivered this epoch.
                            0: one more, partial, last step (see below) */
    int order;       /* enum dh_step_order (default DH_ORDER_ALTERNATE);
                            with DH_BALANCE_FIXED and a window > 1 */
};

/*
 * Defaults: world 1, batch 1, seed 0, epoch 0, DH_BALANCE_FIXED, window 0
 * (= DH_PLAN_WINDOW_DEFAULT), drop_last 1.
 *
 * The partial last step (drop_last = 0, remainder r, 0 < r < world x
 * batch): with `fixed` and `none`, rank k gets floor(r / world) samples,
 * plus one if k < r mod world (so with r < world the last ranks get none);
 * with `free`, counts follow the token balance (every rank gets >= 1 when
 * r >= world).  It is planned on its own (window 1).
 */
void dh_plan_opts_init(struct dh_plan_opts *o);

struct dh_plan;

/*
 * Plans the whole epoch of n samples: tokens[i] is the estimated token
 * count of sample id i (est_tokens of the index), profile[i] its profile
 * bucket (may be NULL: one profile).  The arrays are only read during the
 * call.  Memory O(n): 8 bytes per sample plus O(steps x world).
 *
 * Errors: DH_EINVAL (world/batch 0 or over their caps, bad balance, window
 * over DH_PLAN_WINDOW_MAX, n = 0, or a step bigger than the epoch with
 * drop_last = 1), DH_ETOOBIG (window x world x batch over
 * DH_PLAN_WINDOW_IDS), DH_ENOMEM.  On success *out is owned by the caller
 * (dh_plan_destroy); on error *out is untouched.
 */
int dh_plan_create(const uint32_t *tokens, const uint16_t *profile, uint64_t n,
                   const struct dh_plan_opts *o, struct dh_plan **out,
                   struct dh_err *e) DH_MUST_CHECK;

/* Frees the plan.  Accepts NULL.  Invalidates every borrowed pointer. */
void dh_plan_destroy(struct dh_plan *p);

/* Global steps in the epoch. */
uint64_t dh_plan_steps(const struct dh_plan *p);
uint32_t dh_plan_world_size(const struct dh_plan *p);
/* Ids delivered over the epoch (n minus what drop_last dropped). */
uint64_t dh_plan_kept(const struct dh_plan *p);
/* The window actually used (1 with DH_BALANCE_NONE). */
uint32_t dh_plan_window(const struct dh_plan *p);

/*
 * Sample ids of `rank` in global step `step`, *count of them; borrowed
 * until dh_plan_destroy().  NULL with *count = 0 for an out-of-range
 * step/rank.
 */
const uint64_t *dh_plan_rank_ids(const struct dh_plan *p, uint64_t step,
                                 uint32_t rank, uint64_t *count);

/* Sum of the estimated tokens of that list (0 out of range). */
uint64_t dh_plan_rank_tokens(const struct dh_plan *p, uint64_t step,
                             uint32_t rank);

/* max / mean rank tokens of one step (1.0 when the step has no tokens or
 * is out of range). */
double dh_plan_step_ratio(const struct dh_plan *p, uint64_t step);

/* Mean and worst of dh_plan_step_ratio over every step (partial last step
 * included).  Either pointer may be NULL. */
void dh_plan_balance(const struct dh_plan *p, double *mean_ratio,
                     double *worst_ratio);

/* ---- one rank's schedule (plan_schedule.c) ---- */

/* A rank's share of a plan, flattened: step k's ids are
 * ids[offs[k] .. offs[k + 1]) for k < n_steps.  Owned by the caller, freed
 * with dh_plan_schedule_free(). */
struct dh_plan_schedule {
    uint64_t *ids;  /* n_ids (at least 1 allocated) */
    uint64_t *offs; /* n_steps + 1 */
    uint64_t n_steps, n_ids;
};

/*
 * Plans the n samples of (tokens, profile) -- or, with `subset`, only the
 * n_subset samples whose ids it lists (the rest of an epoch re-planned for
 * another world size; every id < n, else DH_EINVAL naming it) -- and
 * flattens `rank`'s share of the first max_steps steps (0: all) into *out,
 * naming the samples by their ids either way.  The loaders' one way from
 * a plan to what dh_client_start_epoch() takes.  Errors as
 * dh_plan_create(), DH_EINVAL for rank >= world_size; *out is written only
 * on success.  Reentrant.
 */
int dh_plan_schedule(const uint32_t *tokens, const uint16_t *profile,
                     uint64_t n, const uint64_t *subset, uint64_t n_subset,
                     const struct dh_plan_opts *o, uint32_t rank,
                     uint64_t max_steps, struct dh_plan_schedule *out,
                     struct dh_err *e) DH_MUST_CHECK;
/* Frees what *s owns and zeroes it.  Accepts NULL. */
void dh_plan_schedule_free(struct dh_plan_schedule *s);

/*
 * The epoch permutation itself: out[k] for k in [0, n) is a permutation of
 * [0, n), a Fisher-Yates shuffle driven by xoshiro256** seeded through
 * SplitMix64 from (seed, epoch).  Pure and allocation-free.  The plan
 * consumes it in order: step g draws entries [g x world x batch, ...).
 */
void dh_plan_permutation(uint64_t n, uint64_t seed, uint64_t epoch,
                         uint64_t *out);

#endif
