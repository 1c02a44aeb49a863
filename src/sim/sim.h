/*
 * sim/sim.h - `datahelix sim`, a discrete-event simulator of synchronous
 * data-parallel training fed by rank-local and remote DataServers (issue 7
 * item 4; DESIGN 7; docs/sim.md).
 *
 * It calls the project's own pure code: the Tier-1 planner (plan.h) for the
 * rank split and the placement table (place.h: Eq. 1, least-request,
 * feedback, the GPU window) for where each sample is prepared.  It links
 * datahelix_core alone: no FFmpeg, no runtime, no clock, no threads.
 *
 * Determinism: every result is a pure function of (config, workload,
 * system); the same seed gives the same metrics bit for bit.
 *
 * Ownership: workloads are caller-owned structs whose sample array the
 * dh_sim_workload_* functions allocate (free with dh_sim_workload_fini).
 * Thread-safety: independent calls on different structs are reentrant.
 */
#ifndef DH_SIM_SIM_H
#define DH_SIM_SIM_H

#include <stdint.h>

#include "datahelix/error.h"

enum dh_sim_system {
    DH_SIM_NATIVE,
    DH_SIM_POOL,
    DH_SIM_DATAHELIX,
    DH_SIM_NSYSTEMS
};
enum dh_sim_model { DH_SIM_VIDEOMAE, DH_SIM_QWEN_VL, DH_SIM_DIT };

/* "native" / "pool" / "datahelix"; "videomae" / "qwen-vl" / "dit". */
const char *dh_sim_system_name(enum dh_sim_system s);
const char *dh_sim_model_name(enum dh_sim_model m);
int dh_sim_system_parse(const char *s, enum dh_sim_system *out);
int dh_sim_model_parse(const char *s, enum dh_sim_model *out);

/*
 * What handing a prepared sample to its rank costs a system besides the
 * preparation itself (docs/sim.md "Hand-over"; measured, not fitted, by
 * bench/calibrate_handover.py).  cpu_ms + cpu_ms_per_mb x MB of CPU per
 * sample, served by the preparing worker (serialization, scheduler and
 * transport work take CPU the decode would otherwise use), before
 * --cpu-scale; next_ms + next_ms_per_mb x MB of the batch, the time the
 * rank's next() blocks on a batch that is already ready (receive,
 * deserialize, stack).  All zero by default.
 */
struct dh_sim_handover {
    double cpu_ms, cpu_ms_per_mb, next_ms, next_ms_per_mb;
};

struct dh_sim_config {
    uint32_t ranks;        /* training ranks (default 8) */
    uint32_t local;        /* local DataServers (default = ranks) */
    uint32_t remote;       /* remote sidecar DataServers (default 16) */
    uint32_t cores;        /* workers per DataServer (default 4) */
    uint32_t batch;        /* samples per rank per step (default 2) */
    uint32_t steps;        /* measured steps (default 100) */
    uint32_t warmup;       /* warm-up steps, excluded (default 20) */
    uint32_t prefetch;     /* batches requested ahead (default 2) */
    double link_gbps;      /* remote link bandwidth, Gbit/s (default 10) */
    double link_lat_ms;    /* remote link latency (default 0.2) */
    double ddl_ms;         /* DDL miss: input wait > ddl_ms (default 0) */
    double noise_sigma;    /* lognormal sigma of actual/estimated CPU (0.3) */
    double cpu_scale;      /* multiplies every est_cpu_ms (default 1) */
    double allreduce_ms;   /* fixed all-reduce time per step (default 0) */
    uint32_t native_cores; /* native's cores per rank; 0 (default): the
                              whole (local + remote) x cores budget spread
                              over the ranks.  The paper's Native rd0 is
                              `cores`: each rank's own server alone */
    struct dh_sim_handover handover[DH_SIM_NSYSTEMS]; /* default 0 */
    int replay_order; /* every system splits the workload in its own
                            order: step k, rank r get samples (kR + r)B ..
                            (kR + r + 1)B - 1 (a live run's split or plan,
                            replayed); 0 (default): datahelix plans,
                            native and pool split at random */
    uint64_t seed;    /* default 1 */
    /* Tier 2 (docs/rebalance.md "In the simulator"): est_error is the
     * lognormal sigma (mean 1) of actual / estimated tokens and GPU time of
     * every sample, for every system (the Tier-1 plan sees estimates, the
     * step pays actuals); tier2 turns on datahelix's cost-gated exchange
     * every tier2_round steps (default 4), gated at tier2_margin (1.5)
     * over link_gbps and link_lat_ms as the measured collective. */
    double est_error;
    int tier2;
    uint32_t tier2_round;
    double tier2_margin;
};
void dh_sim_config_default(struct dh_sim_config *c);
/* Samples one run consumes: (steps + warmup) x ranks x batch. */
uint64_t dh_sim_samples_needed(const struct dh_sim_config *c);

/* One sample as the simulator sees it: estimates plus the GPU time it
 * costs under the workload's model. */
struct dh_sim_sample {
    double cpu_ms;    /* est_cpu_ms (single core) */
    double out_bytes; /* decoded payload */
    double gpu_ms;    /* GPU window share */
    uint32_t tokens;  /* est_tokens (the planner balances these) */
    uint16_t profile; /* planning bucket */
};

struct dh_sim_workload {
    char name[96];
    enum dh_sim_model model;
    uint64_t n;
    struct dh_sim_sample *s; /* n entries, owned */
};

/*
 * A profile mix by name ("kinetics-s", "kinetics-m", "kinetics-l",
 * "kinetics-mixed", "openvid-mixed"; see docs/sim.md) expanded to `n`
 * samples (sample k draws its profile from (seed, k)).  0, DH_EINVAL
 * (unknown name), DH_ENOMEM.  On success *w owns its array.
 */
int dh_sim_workload_mix(const char *name, enum dh_sim_model model, uint64_t n,
                        uint64_t seed, struct dh_sim_workload *w,
                        struct dh_err *e) DH_MUST_CHECK;
/* The descriptor table at `path` (est_cpu_ms, est_out_bytes, est_tokens,
 * profile), cycled to `n` samples.  DH_EIO / DH_EFORMAT / DH_EEMPTY /
 * DH_ENOMEM with the table reader's message. */
int dh_sim_workload_manifest(const char *path, enum dh_sim_model model,
                             uint64_t n, struct dh_sim_workload *w,
                             struct dh_err *e) DH_MUST_CHECK;
/* Frees the array; accepts NULL and zeroed structs. */
void dh_sim_workload_fini(struct dh_sim_workload *w);

/* The 11-workload matrix of issue 7: name (e.g. "kinetics-s/videomae"),
 * mix and model of entry i < DH_SIM_PAPER_N. */
#define DH_SIM_PAPER_N 11
void dh_sim_paper_entry(int i, const char **name, const char **mix,
                        enum dh_sim_model *model);

/* Tier 2's rounds, summed over the run (means for the ratios). */
struct dh_sim_tier2 {
    uint64_t rounds, moved, kept, unmeasured, balanced;
    uint64_t moved_samples, moved_bytes;
    double gain_ms, cost_ms;          /* predicted, summed over rounds */
    double ratio_before, ratio_after; /* mean max/mean tokens per step */
};

struct dh_sim_metrics {
    double throughput;       /* samples/s over the measured steps */
    double input_wait_p95_s; /* per (rank, measured step) */
    double ready_p95_s;      /* batch request -> ready, measured batches */
    double ddl_miss_rate;    /* (rank, step) pairs with wait > ddl_ms */
    double cross_ds_gb_per_100_steps; /* payload bytes not prepared on the
                                         requester's local server */
    uint64_t conservation_errors;    /* samples of the run prepared != 1 time */
    uint64_t cross_bytes;            /* over all steps (warm-up included) */
    uint64_t events;                 /* events processed */
    double sim_end_s;                /* simulated time at the end */
    double step_p50_ms, step_p95_ms; /* measured steps, start to end */
    struct dh_sim_tier2 tier2;       /* zero unless tier2 (datahelix) */
};

/*
 * Simulates `sys` on `w` (which must hold >= dh_sim_samples_needed(c)
 * samples; the first that many are used) and writes *out.  0, DH_EINVAL
 * (bad config), DH_ENOMEM, or an error of the planner / placement code.
 * *out is written only on success.
 */
int dh_sim_run(const struct dh_sim_config *c, const struct dh_sim_workload *w,
               enum dh_sim_system sys, struct dh_sim_metrics *out,
               struct dh_err *e) DH_MUST_CHECK;

/* ---- Tier 2 (internal; src/sim/tier2.c) ---- */
/* The step's batch of rank r: `cnt` sample ids, borrowed. */
typedef const uint64_t *(*dh_sim_batch_fn)(void *ctx, uint64_t step, uint32_t r,
                                           uint64_t *cnt);
/* Actual / estimated tokens of sample id (1 when est_error is 0). */
double dh__sim_est_error(const struct dh_sim_config *c, uint64_t id);
/*
 * Models Tier 2 over nsteps steps: for each round, the actual tokens of
 * its samples go through dh_rb_propose and dh_rb_decide (the same code as
 * the loader's gate, with the previous rounds' GPU ms per token as the
 * measured step time; the first round only measures).  Writes gpu[b], the
 * actual GPU ms of batch b = step x ranks + rank after the verdict, and
 * xfer[step], the exchange time paid at a round's first step; sums into
 * *t2 and adds the bytes of rounds from step `from` on to *cross.
 */
int dh__sim_tier2(const struct dh_sim_config *c,
                  const struct dh_sim_workload *w, uint64_t nsteps,
                  dh_sim_batch_fn ids, void *ctx, double *gpu, double *xfer,
                  struct dh_sim_tier2 *t2, uint64_t *cross_all,
                  uint64_t *cross_from, uint64_t from,
                  struct dh_err *e) DH_MUST_CHECK;

/* ---- the event queue (internal to the simulator; tested) ---- */
struct dh_sim_event {
    double t;     /* simulated ms */
    uint64_t seq; /* push order: ties at equal t pop first-in first-out */
    uint32_t type;
    uint32_t a;
    uint64_t b;
};
struct dh_sim_evq {
    struct dh_sim_event *h;
    uint64_t n, cap, seq;
};
void dh__sim_evq_init(struct dh_sim_evq *q);
void dh__sim_evq_fini(struct dh_sim_evq *q);
/* 0 or DH_ENOMEM (the queue is unchanged). */
int dh__sim_evq_push(struct dh_sim_evq *q, double t, uint32_t type, uint32_t a,
                     uint64_t b) DH_MUST_CHECK;
/* Earliest event (FIFO among equal times) into *ev; 0 when empty. */
int dh__sim_evq_pop(struct dh_sim_evq *q, struct dh_sim_event *ev);

#endif
