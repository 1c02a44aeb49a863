/*
 * metrics_snap.h - one published view of a Coordinator's telemetry
 * (DESIGN.md 4.4; issue 18 item 3; docs/metrics.md lists every metric):
 * the figures the event loop keeps (coordinator_metrics.c), copied as
 * plain values so that another thread (the HTTP server,
 * metrics_http.c) can format them as Prometheus text exposition
 * (metrics_text.c) without touching the loop's state.
 *
 * Ownership: a snapshot owns its two arrays (dh__mx_snap_fini frees
 * them).  Thread-safety: none; the publisher guards the copy.
 */
#ifndef DH_RUNTIME_METRICS_SNAP_H
#define DH_RUNTIME_METRICS_SNAP_H

#include <stddef.h>
#include <stdint.h>

#include "datahelix/coordinator.h"
#include "datahelix/place.h"

/* Upper bounds of a histogram's buckets (the last, +Inf, is implied). */
#define DH_MX_HIST_MAX 16
#define DH_MX_ADDR_LEN 127 /* a server's address as labelled (truncated) */
#define DH_MX_REASONS 8    /* enum dh_place_reason values */

struct dh_mx_hist {
    uint64_t n[DH_MX_HIST_MAX + 1]; /* per bucket (not cumulative); the
                                       last is above every bound */
    uint64_t count;
    double sum;
};

/* Bucket sets (metrics_text.c): each a fixed list of upper bounds. */
enum dh_mx_buckets {
    DH_MX_B_US,    /* decision time, microseconds */
    DH_MX_B_MS,    /* input wait, task latency, milliseconds */
    DH_MX_B_DEPTH, /* queue depth, tasks */
};

struct dh_mx_server {
    uint32_t id; /* wire server id */
    int alive;   /* 1: registered and heartbeating */
    int dead;    /* 1: declared dead (0 and !alive: it left) */
    int remote;  /* 1: a remote sidecar, 0: a rank's local server */
    uint32_t rank;
    uint32_t workers;
    char addr[DH_MX_ADDR_LEN + 1];
    uint32_t queue_depth, busy_workers; /* last heartbeat */
    double latency_ms;                  /* last heartbeat's EWMA */
    uint64_t tasks, errors;             /* completions it sent first */
    uint64_t bytes_out;                 /* payload bytes of its results */
    uint64_t bytes_in;                  /* payload bytes other servers
                                           prepared for its arena */
    double out_bps, in_bps;             /* over the last second or so */
    uint64_t routed;                    /* tasks routed to it */
    uint64_t heartbeats;
    uint64_t read_bytes, reads; /* its workers' reads, last heartbeat */
    double read_s;
    uint64_t fetched_bytes, cache_hits, cache_misses; /* remote sources */
};

struct dh_mx_rank {
    uint32_t rank;
    uint64_t requests;  /* descriptor requests accepted */
    uint64_t completed; /* first completions forwarded (results, errors) */
    uint64_t late;      /* of them, after the request's slack ran out */
    uint64_t inflight;  /* tasks the rank holds here now */
    /* The rank's own figures (its client's RankReport, last seen): */
    int reported;
    uint64_t steps, misses;
    double window_ms, input_wait_ms;
    struct dh_mx_hist input_wait; /* one observation per new step seen */
};

struct dh_mx_snap {
    uint64_t uptime_ms;
    struct dh_coordinator_stats st;
    uint64_t decisions[DH_MX_REASONS];
    struct dh_mx_hist decide_us;   /* per placement decision */
    struct dh_mx_hist task_ms;     /* route to first completion */
    struct dh_mx_hist queue_depth; /* per applied heartbeat */
    uint64_t task_errors;          /* ErrorNotices forwarded */
    uint64_t late;                 /* completions after their slack */
    uint64_t bytes_out;            /* payload bytes of forwarded results */
    size_t n_servers, cap_servers;
    struct dh_mx_server *servers;
    size_t n_ranks, cap_ranks;
    struct dh_mx_rank *ranks;
};

/* Counts `v` in `h`, whose bounds are set `b`. */
void dh__mx_observe(struct dh_mx_hist *h, enum dh_mx_buckets b, double v);

/* Makes `dst` a copy of `src` (arrays grown as needed).  0, or DH_ENOMEM
 * (dst keeps its previous content). */
int dh__mx_snap_copy(struct dh_mx_snap *dst, const struct dh_mx_snap *src);
void dh__mx_snap_fini(struct dh_mx_snap *s);

/*
 * Writes `s` as Prometheus text exposition (format 0.0.4) into a buffer
 * it allocates: *out (NUL-terminated, *len bytes without the NUL), owned
 * by the caller (dh__free).  0, or DH_ENOMEM (*out untouched).  Pure: no
 * I/O.
 */
int dh__mx_format(const struct dh_mx_snap *s, char **out, size_t *len);

#endif
