/*
 * place_internal.h - the placement table's layout, shared by place.c
 * (table, index, decisions) and place_feedback.c (feedback, GPU window).
 * Internal; not installed.
 */
#ifndef DH_CORE_PLACE_INTERNAL_H
#define DH_CORE_PLACE_INTERNAL_H

#include <stdint.h>

#include "datahelix/place.h"

struct dh__place_srv {
    int used;
    enum dh_place_role role;
    int32_t local_rank, workers, queue_cap;
    int32_t lslot;         /* column in the link table (local servers), or -1 */
    int64_t tasks;         /* assigned through the table, not completed */
    int64_t ext_tasks;     /* reported by heartbeat beyond `tasks` */
    double inflight_ms;    /* predicted work of `tasks` */
    double ext_ms;         /* work of ext_tasks */
    double ratio;          /* EWMA actual / predicted, starts at 1 */
    double read_ms_per_mb; /* measured read cost; 0: none */
    int32_t pool;          /* CPU pool, or -1 */
    int64_t released;      /* of `tasks`, those its pool no longer counts */
};

/* A CPU pool: servers whose workers share CPUs; `tasks` in flight on all
 * of them together, at most `cap` (0 = none). */
struct dh__place_pool {
    int64_t tasks;
    int32_t cap;
};

struct dh__place_link {
    double bw;     /* bytes per ms; 0 = no sample yet */
    double lat_ms; /* < 0 = no sample yet */
};

/* Remotes ordered by key: predicted free time for one delivery target
 * (deadline), or tasks in flight (least-request); +inf at the queue cap. */
struct dh__place_heap {
    int active;
    int32_t *heap; /* heap position -> server id */
    int32_t *pos;  /* server id -> heap position, -1 if absent */
    double *key;   /* server id -> key */
};

struct dh_place {
    struct dh_place_opts o;
    int32_t max_servers;
    struct dh__place_srv *srv;    /* [max_servers] */
    struct dh__place_pool *pools; /* [max_servers] */
    struct dh__place_link *links; /* [max_servers * o.max_local] */
    int32_t *lslot_owner;         /* [max_local]: server id or -1 */
    /* Remote servers: a dense list (round-robin, random samples, full
     * scans; rpos maps an id to its index or -1) and one binary min-heap
     * of all of them per delivery target: heaps[lslot] for each local
     * server, heaps[max_local] for requests without one.  The deadline
     * policy keeps every active heap; the others only the last. */
    int32_t *remotes, *rpos, nremote;
    struct dh__place_heap *heaps; /* [max_local + 1] */
    int32_t *heap_mem, *hpos_mem; /* [(max_local + 1) * max_servers] */
    double *key_mem;
    uint32_t rr;  /* round-robin cursor */
    uint64_t rng; /* xorshift64 state */
};

/* Capacity check: tasks + ext_tasks >= queue_cap (cap 0 = none), or the
 * server's CPU pool at its cap. */
int dh__place_at_cap(const struct dh_place *p, const struct dh__place_srv *s);
/* Recomputes a remote's keys and restores every active heap; no-op for a
 * local server.  O(active heaps x log n). */
void dh__place_rekey(struct dh_place *p, int32_t id);
/* Same, for the one heap of local server `to` (a link sample). */
void dh__place_rekey_link(struct dh_place *p, int32_t id, int32_t to);

#endif
