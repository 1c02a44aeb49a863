/*
 * datahelix/place.h - deadline-aware placement (paper Sec. 3.3, Eq. 1;
 * DESIGN.md 3 "Placement rule" and "The GPU window").
 *
 * For each descriptor request the Coordinator asks a placement table which
 * DataServer should materialize it.  Per candidate server i:
 *
 *   T_i = C_cpu * r_i + C_io + C_queue + C_net,     M_i = max(0, T_i - D)
 *
 *   C_cpu   the request's predicted CPU ms (dh_cost_model, from the probe)
 *   r_i     EWMA of actual / predicted task time on server i (completions)
 *   C_io    the request's predicted read ms
 *   C_queue r_i * (predicted work in flight on i) / workers_i
 *   C_net   0 on the requester's own local server, else
 *           out_bytes / bw(i -> local) + latency(i -> local)   (EWMAs)
 *   D       the request's relative deadline (its slack, see dh_window)
 *
 * This is pure logic: no I/O, no clock, no threads.  All memory is taken
 * by dh_place_create(); every other call is allocation-free.  A table is
 * not thread-safe: the Coordinator serializes calls on it (one owner).
 * The dh_window functions work on a caller-owned struct and are reentrant.
 *
 * Server ids are small integers in [0, max_servers) chosen by the caller
 * (nng style handles): a removed or never-added id is DH_ENOTFOUND, never a
 * stale pointer.  See docs/placement.md for the index and its trade-offs.
 */
#ifndef DATAHELIX_PLACE_H
#define DATAHELIX_PLACE_H

#include <stddef.h>
#include <stdint.h>

#include "datahelix/error.h"
#include "datahelix/estimate.h"
#include "datahelix/table.h"

/* Largest times and sizes the model accepts (calls beyond return
 * DH_EINVAL): keeps every Eq. 1 sum finite. */
#define DH_PLACE_MAX_MS 1e9
#define DH_PLACE_MAX_BYTES 1e15

struct dh_place; /* opaque */

enum dh_place_policy {
    DH_PLACE_POLICY_ROUND_ROBIN,   /* cycle over local + remote servers */
    DH_PLACE_POLICY_LEAST_REQUEST, /* fewest tasks in flight (paper default) */
    DH_PLACE_POLICY_DEADLINE,      /* Eq. 1 + the DESIGN 3 rule */
};

enum dh_place_role {
    DH_PLACE_ROLE_LOCAL,  /* a rank's own DataServer (delivery target) */
    DH_PLACE_ROLE_REMOTE, /* a remote CPU sidecar */
};

enum dh_place_reason {
    DH_PLACE_REASON_LOCAL_MEETS,     /* local meets D; no remote gains enough */
    DH_PLACE_REASON_REMOTE_GAIN,     /* local meets D, a remote gains more
                                        than remote_gain_ms */
    DH_PLACE_REASON_LEAST_MISS,      /* local misses (or is full); winner has
                                        the least predicted miss */
    DH_PLACE_REASON_EARLIEST_FINISH, /* every candidate misses: earliest T */
    DH_PLACE_REASON_BACKPRESSURE,    /* every candidate is at its queue cap:
                                        server = -1, the caller must wait */
    DH_PLACE_REASON_ROUND_ROBIN,
    DH_PLACE_REASON_LEAST_REQUEST,
};

/* Static name ("local_meets", "backpressure", ...) for telemetry. */
const char *dh_place_reason_name(enum dh_place_reason r);
const char *dh_place_policy_name(enum dh_place_policy p);
/* "round-robin", "least-request" or "deadline".  0 or DH_EINVAL. */
int dh_place_policy_parse(const char *s, enum dh_place_policy *out,
                          struct dh_err *e) DH_MUST_CHECK;

struct dh_place_opts {
    enum dh_place_policy policy;
    double remote_gain_ms;     /* local meets D: a remote must be this much
                              faster to win (default 5) */
    double ratio_alpha;        /* EWMA weight of a completion (default 0.3) */
    double link_alpha;         /* EWMA weight of a link sample (default 0.3) */
    double default_bw_mbps;    /* link bandwidth before any sample, MB/s
                                  (1e6 bytes/s; default 1000) */
    double default_latency_ms; /* link latency before any sample (0.2) */
    double small_xfer_bytes;   /* link samples under this size update the
                                  latency EWMA, larger ones the bandwidth
                                  (default 65536) */
    double key_cpu_ms; /* the reference request that orders remotes in */
    double key_bytes;  /* the index: cpu ms (default 20) and payload bytes
                          (default 32e6), see docs/placement.md */
    int k_best;        /* remotes taken from the index per decision
                          (default 8, max DH_PLACE_K_MAX) */
    int k_random;      /* extra remotes sampled at random (default 2) */
    int full_scan;     /* 1: score every server (reference; O(n)) */
    int max_local;     /* most local servers at once (default 64): sizes
                          the link table, max_servers x max_local */
    uint64_t seed;     /* for the random samples (default 1) */
};

#define DH_PLACE_K_MAX 32
#define DH_PLACE_TOP 4

/* Fills the defaults above (policy deadline). */
void dh_place_opts_default(struct dh_place_opts *o);

/*
 * Creates a table for server ids in [0, max_servers).  Memory is about
 * max_servers x max_local x 32 bytes for the deadline policy (link table
 * and one index per delivery target).  `o` may be NULL
 * (defaults).  On success *out owns the table (free with dh_place_destroy);
 * on error *out is untouched.  DH_EINVAL for bad sizes/options, DH_ENOMEM.
 */
int dh_place_create(int32_t max_servers, const struct dh_place_opts *o,
                    struct dh_place **out, struct dh_err *e) DH_MUST_CHECK;
/* Accepts NULL. */
void dh_place_destroy(struct dh_place *p);

/*
 * Registers server `id`: role, the rank it serves (local) or -1 (remote),
 * its worker count (>= 1) and queue cap (tasks in flight; 0 = no cap).
 * DH_EINVAL (bad args), DH_EDUP (id in use), DH_ETOOBIG (more than
 * max_local local servers).  O(log n).
 */
int dh_place_add_server(struct dh_place *p, int32_t id, enum dh_place_role role,
                        int32_t local_rank, int32_t workers, int32_t queue_cap,
                        struct dh_err *e) DH_MUST_CHECK;
/* Forgets `id` (its in-flight work too).  DH_ENOTFOUND.  O(L log n), or
 * O(max_servers) for a local server (its link column is reset).  Adding a
 * local server builds its index in O(n). */
int dh_place_remove_server(struct dh_place *p, int32_t id,
                           struct dh_err *e) DH_MUST_CHECK;

/*
 * CPU pools (docs/placement.md "CPU pools"): local servers whose workers
 * share the same CPUs.  A pool's cap bounds the tasks in flight on all its
 * servers together: a server whose pool is at its cap counts as at its
 * queue cap (the decisions skip it, or return BACKPRESSURE), so the
 * caller's queue, not the CPUs' time-sharing, says which task runs next.
 * Pool ids are the caller's, 0..max_servers - 1; a pool starts with cap 0
 * (none).  Only local servers take a pool (remotes stay in the index's
 * heaps, whose keys a pool's state does not enter).
 */
/* Moves `server` (a local one) to `pool`, or out of any with -1; its
 * tasks in flight move with it.  DH_ENOTFOUND, DH_EINVAL.  O(1). */
int dh_place_set_pool(struct dh_place *p, int32_t server, int32_t pool,
                      struct dh_err *e) DH_MUST_CHECK;
/* Sets pool `pool`'s cap (0 = none).  DH_EINVAL.  O(1). */
int dh_place_pool_cap(struct dh_place *p, int32_t pool,
                      int32_t cap) DH_MUST_CHECK;
/* One of `server`'s tasks in flight stops counting against its pool (it
 * ran far past its prediction: a stuck read, a lost message; the caller
 * decides), or counts again (before its dh_place_complete(), which takes
 * it off the pool's count as any other).  DH_ENOTFOUND; DH_EINVAL when the
 * server has no such task (or no pool, for a release).  O(1). */
int dh_place_pool_release(struct dh_place *p, int32_t server) DH_MUST_CHECK;
int dh_place_pool_rehold(struct dh_place *p, int32_t server) DH_MUST_CHECK;
/* The tasks in flight on pool `pool`'s servers.  DH_EINVAL. */
int dh_place_pool_tasks(const struct dh_place *p, int32_t pool,
                        int64_t *tasks) DH_MUST_CHECK;

/* ---- feedback: each O(L log n), L = local servers (deadline policy;
 * L = 1 otherwise); dh_place_link O(log n) ---- */

/* A task of `work_ms` predicted work (dh_place_decision.work_ms) was sent
 * to `server`.  DH_ENOTFOUND, DH_EINVAL (work < 0 or not finite). */
int dh_place_assign(struct dh_place *p, int32_t server,
                    double work_ms) DH_MUST_CHECK;
/* The task assigned with `predicted_ms` finished after `actual_ms` of
 * service: its work leaves the queue and the EWMA of actual/predicted
 * moves (the ratio sample is clamped to [0.05, 50]). */
int dh_place_complete(struct dh_place *p, int32_t server, double predicted_ms,
                      double actual_ms) DH_MUST_CHECK;
/* `bytes` took `seconds` from `from` to the local server `to`. */
int dh_place_link(struct dh_place *p, int32_t from, int32_t to, double bytes,
                  double seconds) DH_MUST_CHECK;
/* The server's own view: tasks queued, workers busy, recent task latency.
 * Tasks it reports beyond those assigned through this table (another
 * coordinator, restarts) count as external work of recent_latency_ms
 * each, and against the queue cap, until the next heartbeat. */
/* The server's measured read cost, ms per MB (10^6 bytes) its workers
 * take from their sources (files, shard members; later object storage);
 * 0 forgets it.  A task's C_io on that server is then in_bytes x this: a
 * server whose bytes are slow to reach predicts late.  DH_EINVAL for a
 * negative or non-finite rate. */
int dh_place_read_rate(struct dh_place *p, int32_t server,
                       double ms_per_mb) DH_MUST_CHECK;
int dh_place_heartbeat(struct dh_place *p, int32_t server, int32_t queue_depth,
                       int32_t busy_workers,
                       double recent_latency_ms) DH_MUST_CHECK;

/* ---- decisions ---- */

struct dh_place_req {
    int32_t rank;         /* requester */
    int32_t local_server; /* its local DataServer id, -1 if none */
    double cpu_ms;        /* C_cpu before feedback (dh_cost_req_from_desc) */
    double io_ms;         /* C_io known up front (0 on the live system) */
    double in_bytes;      /* bytes the task reads from its sources: each
                             server's measured read rate (dh_place_read_rate)
                             times this adds to its C_io */
    double out_bytes;     /* decoded payload size (C_net) */
    double deadline_ms;   /* D, relative: now + slack on the coordinator's
                             clock minus now; INFINITY = no deadline */
};

struct dh_place_cand {
    int32_t server;
    double t_pred_ms;
    double miss_ms;
};

struct dh_place_decision {
    int32_t server; /* -1 only with DH_PLACE_REASON_BACKPRESSURE */
    enum dh_place_reason reason;
    double t_pred_ms; /* winner's T and M (0 for round-robin etc. only if */
    double miss_ms;   /* the server has no prediction: they are filled) */
    double work_ms;   /* cpu_ms + io_ms: pass to dh_place_assign/complete */
    int32_t scored;   /* candidates evaluated */
    int32_t ntop;     /* entries in top, best first by (miss, T) */
    struct dh_place_cand top[DH_PLACE_TOP];
};

/*
 * Chooses a server for `req` under the table's policy and writes *out.
 * Does not assign: the caller calls dh_place_assign(out->server,
 * out->work_ms) when it sends the task.  Returns 0 (also for
 * BACKPRESSURE: check out->reason / out->server == -1), or DH_EINVAL for
 * a bad request (negative or non-finite costs).  Allocation-free; with
 * full_scan = 0 it evaluates the local server + k_best + k_random remotes
 * (O(k log k + k^2)), else every server.
 */
int dh_place_decide(struct dh_place *p, const struct dh_place_req *req,
                    struct dh_place_decision *out) DH_MUST_CHECK;
/* Same rule over every registered server whatever full_scan says (the
 * reference the index is measured against).  O(n). */
int dh_place_decide_full(struct dh_place *p, const struct dh_place_req *req,
                         struct dh_place_decision *out) DH_MUST_CHECK;

/* Eq. 1 for one server, term by term (tests, telemetry, the simulator). */
struct dh_cost_terms {
    double cpu_ms, io_ms, queue_ms, net_ms, t_ms, miss_ms;
    int at_cap; /* 1 if the server is at its queue cap */
};
int dh_cost_predict(const struct dh_place *p, int32_t server,
                    const struct dh_place_req *req,
                    struct dh_cost_terms *out) DH_MUST_CHECK;

/* Fills req->cpu_ms (the static model of estimate.h on the sample plan's
 * output), req->out_bytes (d->est_out_bytes) and req->in_bytes (d->bytes)
 * for descriptor `d`; other
 * fields are untouched. */
void dh_cost_req_from_desc(const struct dh_estimator *est,
                           const struct dh_desc *d, struct dh_place_req *req);

/* Read-only view of a server's state (tests, `datahelix top`). */
struct dh_place_server_info {
    enum dh_place_role role;
    int32_t local_rank, workers, queue_cap;
    int64_t tasks;      /* assigned and not completed */
    double inflight_ms; /* their predicted work */
    double ratio;       /* EWMA actual / predicted */
};
int dh_place_server_info(const struct dh_place *p, int32_t server,
                         struct dh_place_server_info *out) DH_MUST_CHECK;

/*
 * Telemetry (DESIGN 4.4): writes one JSON line (no newline)
 * {"task":T,"candidates":[{"server":S,"t_pred_ms":x,"miss_ms":y},...],
 *  "chosen":S,"reason":"...","decide_us":u}.  The caller times the decide
 * call (this library reads no clock).  Returns the length that the full
 * record needs, like snprintf; the record is complete iff that is < len.
 */
size_t dh_place_decision_format(const struct dh_place_decision *d, int64_t task,
                                double decide_us, char *buf, size_t len);

/* ---- the GPU window and the deadline model (DESIGN 3) ----
 *
 * One model, called by the live client (client_io.c) and the simulator
 * (sim.c) alike, so that "the simulator calls the same code" holds for D:
 *
 *   period   one next() return to the next: the compute window plus the
 *            input wait of the following step.  Its EWMA is the model.
 *   slack    of a request for the step `steps_ahead` steps after the one
 *            being computed: steps_ahead x period - elapsed.  A request is
 *            issued when next() returns (the client's I/O thread is woken
 *            then; the simulator issues at begin_compute), so both pass
 *            elapsed 0.  The Coordinator turns slack into a deadline on
 *            its own clock (now + slack, less the time the request queued)
 *            -- no cross-host clock sync.
 *   step_deadline_ms  > 0: a fixed period replaces the EWMA (a user who
 *            knows the step time; `consume --step-deadline-ms`,
 *            DataLoader(step_deadline_ms=)).
 *   hint_ms  the period assumed before the first sample (client default
 *            100 ms); 0: no deadline is known until then (INFINITY).
 *   ddl_ms   the miss threshold, and only that: a step is a DDL miss when
 *            its input wait exceeds ddl_ms.
 */

/* Caller-owned; reentrant; one struct per iterator (rank). */
struct dh_window {
    double alpha;   /* weight of a new sample */
    double ewma_ms; /* of the period; 0 until the first sample */
    int64_t samples;
    double hint_ms;          /* period before the first sample; 0: none */
    double step_deadline_ms; /* > 0: fixed period, the EWMA unused */
};

/* alpha in (0, 1]; anything else gives the default DH_WINDOW_ALPHA.  No
 * hint, no fixed step deadline. */
#define DH_WINDOW_ALPHA 0.2
void dh_window_init(struct dh_window *w, double alpha);
/* The period assumed before the first sample (negative or non-finite: 0,
 * none) and a fixed step deadline (<= 0 or non-finite: none). */
void dh_window_assume(struct dh_window *w, double hint_ms,
                      double step_deadline_ms);
/* Adds one measured period; negative or non-finite values are ignored.
 * The first sample sets the EWMA directly. */
void dh_window_update(struct dh_window *w, double period_ms);
/* The period the model predicts now: the fixed step deadline, else the
 * EWMA, else the hint; INFINITY when none is known. */
double dh_window_period_ms(const struct dh_window *w);
/*
 * Slack of a request for the batch consumed `steps_ahead` steps from now,
 * `elapsed_ms` into the current window: steps_ahead x period - elapsed
 * (may be negative: already late).  The Coordinator passes deadline - now
 * at decision time as dh_place_req.deadline_ms.  INFINITY when no period
 * is known.
 */
double dh_window_slack_ms(const struct dh_window *w, int steps_ahead,
                          double elapsed_ms);
/* A step is a DDL miss when its input wait exceeds ddl_ms. */
int dh_window_is_miss(double input_wait_ms, double ddl_ms);

#endif
