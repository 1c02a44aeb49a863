/*
 * plan_internal.h - pieces of the Tier-1 planner shared by plan.c (epoch
 * permutation, the plan object, the `none` split) and plan_window.c (the
 * windowed LPT bin filling).  Internal: not installed.
 *
 * Locking: none; everything here works on caller-owned memory.
 */
#ifndef DH_CORE_PLAN_INTERNAL_H
#define DH_CORE_PLAN_INTERNAL_H

#include <stdint.h>

#include "datahelix/plan.h"

/* xoshiro256** state, seeded through SplitMix64. */
struct dh__rng {
    uint64_t s[4];
};

/* Random streams: one per purpose, so that adding a use of randomness in
 * one place never shifts another's sequence. */
enum { DH__RNG_PERMUTATION = 1, DH__RNG_WINDOW_ORDER = 2 };

void dh__rng_seed(struct dh__rng *r, uint64_t seed, uint64_t epoch,
                  uint64_t stream, uint64_t index);
uint64_t dh__rng_next(struct dh__rng *r);
/* Uniform in [0, bound) without modulo bias (Lemire); bound >= 1. */
uint64_t dh__rng_below(struct dh__rng *r, uint64_t bound);

struct dh_plan {
    uint32_t world, batch, window;
    int balance;
    uint64_t n, steps, kept;
    uint64_t *ids; /* kept ids: step-major, then rank */
    uint64_t *off; /* steps x world + 1 offsets into ids */
    uint64_t *tok; /* steps x world token sums */
};

/* Scratch of the windowed planner, sized once for the largest window. */
struct dh__plan_scratch;

int dh__plan_scratch_create(uint64_t max_items, uint64_t max_bins,
                            struct dh__plan_scratch **out) DH_MUST_CHECK;
void dh__plan_scratch_destroy(struct dh__plan_scratch *s);

/* What a window reads: the manifest and the profile group order
 * (grank[profile]; NULL: no grouping, pure largest first). */
struct dh__plan_input {
    const uint32_t *tokens;
    const uint16_t *profile;
    const uint16_t *grank;
    uint64_t seed, epoch;
    int order; /* enum dh_step_order */
};

/*
 * Plans `nsteps` consecutive global steps from `first_step`, whose ids are
 * p->ids[p->off[first_step x world] ...] (`nitems` of them: the
 * permutation's order on entry, the plan's on return), and writes p->off
 * for those steps (p->off[first_step x world] must be set).  caps[b] is
 * the sample cap of bin b (nsteps x world bins; UINT32_MAX = no cap; the
 * caps sum to >= nitems).  `partial`: one step whose bin r is rank r (no
 * load sort, no rotation).
 */
void dh__plan_window(struct dh_plan *p, struct dh__plan_scratch *s,
                     const struct dh__plan_input *in, uint64_t first_step,
                     uint32_t nsteps, uint64_t nitems, const uint32_t *caps,
                     int partial);

#endif
