/*
 * datahelix/rebalance.h - Tier-2 rebalancing (DDLB): the cost gate and the
 * redistribution planner (issue 17; paper Sec. 3.4 "Balance correction",
 * Algorithm 1 lines 10-14, Sec. 3.5; docs/rebalance.md).
 *
 * A round is the samples that R steps of every rank of one group hold once
 * materialized.  Each sample has its measured features (actual tokens,
 * decoded bytes) and its current place (rank, step of the round).  Ranks
 * step in lock-step, so a step costs its slowest rank: the round's
 * predicted GPU time is sum over steps of max over ranks of the tokens
 * there, times the measured per-token step time.
 *
 *   dh_rb_propose  the default policy's proposal: per step, greedy min-max
 *                  on tokens (largest first to the least loaded rank that
 *                  still has room), every (rank, step) keeping its count;
 *                  the resulting bins are then given to the ranks that
 *                  already hold most of their bytes, so that as little as
 *                  possible moves.
 *   dh_rb_decide   the gate: predicted gain (slowest-rank time before less
 *                  after) against the predicted transfer time of what
 *                  would move, from the group's MEASURED bandwidth; the
 *                  proposal is accepted only if gain > cost x margin.
 *                  Without a measured bandwidth or step time it keeps.
 *   dh_rb_plan     an accepted assignment as sends / receives / keeps: the
 *                  bytes each rank sends each other rank (all_to_all_single
 *                  split sizes) and every sample's place in its sender's
 *                  and receiver's buffers.
 *
 * All three are pure functions of their inputs (same inputs, same result on
 * every rank: each rank runs them on the all-gathered features and reaches
 * the same verdict without another message).  Scratch memory through the
 * allocation seam, freed before return; thread-safety: reentrant.
 */
#ifndef DATAHELIX_REBALANCE_H
#define DATAHELIX_REBALANCE_H

#include <stddef.h>
#include <stdint.h>

#include "datahelix/error.h"

#define DH_RB_MAX_RANKS 256
#define DH_RB_MAX_STEPS 4096

/* One materialized sample of the round. */
struct dh_rb_sample {
    double tokens;  /* actual (post-decode) tokens */
    uint64_t bytes; /* decoded size, what moving it costs */
    uint32_t rank;  /* where it is now (0 .. nranks-1) */
    uint32_t step;  /* its step within the round (0 .. nsteps-1) */
};

/* The gate's measured inputs. */
struct dh_rb_gate {
    double ms_per_token; /* measured GPU step time per token */
    double bytes_per_ms; /* measured collective bandwidth; <= 0: none */
    double latency_ms;   /* measured fixed cost of one collective */
    double margin;       /* accept iff gain > cost x margin (>= 1) */
};

enum dh_rb_verdict {
    DH_RB_KEEP,       /* the gain does not pay for the move */
    DH_RB_MOVE,       /* accepted */
    DH_RB_UNMEASURED, /* no bandwidth or step time measured yet: keep */
    DH_RB_BALANCED    /* the proposal moves nothing or gains nothing */
};

/* "keep", "move", "unmeasured", "balanced". */
const char *dh_rb_verdict_name(enum dh_rb_verdict v);

struct dh_rb_decision {
    enum dh_rb_verdict verdict;
    double gain_ms;      /* predicted slowest-rank time saved (>= 0) */
    double cost_ms;      /* predicted exchange time (0 if nothing moves) */
    double before_ms;    /* predicted round GPU time, current */
    double after_ms;     /* predicted round GPU time, proposed */
    double ratio_before; /* mean over steps of max/mean tokens */
    double ratio_after;
    uint64_t moved;          /* samples that change rank */
    uint64_t moved_bytes;    /* their bytes */
    uint64_t max_rank_bytes; /* the busiest rank's max(sent, received) */
};

/*
 * Writes into to[i] the proposed rank of s[i] (n samples over nranks ranks
 * and nsteps steps).  0, DH_ENOMEM, or DH_EINVAL (a sample's rank or step
 * out of range, sizes past DH_RB_MAX_*) with e naming the sample; to[] is
 * written only on success.
 */
int dh_rb_propose(const struct dh_rb_sample *s, size_t n, uint32_t nranks,
                  uint32_t nsteps, uint32_t *to,
                  struct dh_err *e) DH_MUST_CHECK;

/*
 * The gate: decides on moving s[i] to to[i].  0 and *d written, DH_ENOMEM,
 * or DH_EINVAL (bad sizes, a rank out of range, a proposal that changes a
 * (rank, step) count, a negative or non-finite input) with e saying which.
 */
int dh_rb_decide(const struct dh_rb_sample *s, const uint32_t *to, size_t n,
                 uint32_t nranks, uint32_t nsteps, const struct dh_rb_gate *g,
                 struct dh_rb_decision *d, struct dh_err *e) DH_MUST_CHECK;

/* Where the exchange puts each sample (all_to_all_single's layout: rank r's
 * send buffer is its outgoing samples by destination, then by index; its
 * receive buffer is the incoming ones by source, then by index). */
struct dh_rb_route {
    uint32_t src, dst;
    uint64_t send_off; /* byte offset in src's send buffer (moved only) */
    uint64_t recv_off; /* byte offset in dst's receive buffer */
};

/*
 * The plan of moving s[i] to to[i]: split[src * nranks + dst] = bytes src
 * sends dst (diagonal: 0, keeps do not travel) and route[i] for every
 * sample (a kept one has src == dst and offsets 0).  split: nranks^2,
 * route: n, both the caller's.  0, DH_ENOMEM, or DH_EINVAL (a rank out of
 * range).
 */
int dh_rb_plan(const struct dh_rb_sample *s, const uint32_t *to, size_t n,
               uint32_t nranks, uint64_t *split, struct dh_rb_route *route,
               struct dh_err *e) DH_MUST_CHECK;

#endif
