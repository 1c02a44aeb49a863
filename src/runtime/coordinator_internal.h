/*
 * coordinator_internal.h - state shared by coordinator.c (socket, event
 * loop, registry, heartbeats) and coordinator_route.c (placement, the
 * task table, the FIFO of waiting requests, completions).
 *
 * Locking: none.  Everything here is owned by the thread in
 * dh_coordinator_run(); only the atomic counters are read from other
 * threads (dh_coordinator_stats()).
 */
#ifndef DH_RUNTIME_COORDINATOR_INTERNAL_H
#define DH_RUNTIME_COORDINATOR_INTERNAL_H

#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>

#include "core/idmap.h"
#include "datahelix/coordinator.h"
#include "datahelix/inflight.h"
#include "datahelix/place.h"
#include "datahelix/wire.h"
#include "runtime/transport.h"

/* A ZeroMQ ROUTER routing id (at most 255 bytes). */
struct co_peer {
    uint8_t len;
    uint8_t id[255];
};

struct co_server {
    int used;
    uint32_t wire_id;
    uint64_t gen; /* registration number: a reused slot is another server */
    struct co_peer peer;
    enum dh_wire_role role;
    uint32_t rank;
    uint64_t last_seen_ms;
    char addr[DH_WIRE_MAX_ADDR + 1];
};

struct co_client {
    int used;
    uint32_t rank;
    struct co_peer peer;
};

enum co_state { CO_PENDING_NEW, CO_PENDING_REROUTE, CO_RUNNING };

/* One task the Coordinator knows: waiting in the FIFO or running. */
struct co_task {
    struct dh_wire_request req; /* owns its arrays */
    struct co_peer client;
    enum co_state state;
    int cancelled;   /* completed while in the FIFO: the FIFO frees it */
    int bp_logged;   /* a BACKPRESSURE decision was already in telemetry */
    int counted_new; /* counted in pending_new while in the FIFO */
    int32_t server;  /* placement slot while running, else -1 */
    uint64_t server_gen;
    double work_ms;
    uint64_t arrived_ms, since_ms;
};

/* Several entries a line, which clang-format 14 re-breaks by one more on
 * every run: kept out of its reach. */
/* clang-format off */
#define CO_STATS(X)                                                         \
    X(malformed) X(requests) X(routed) X(rerouted) X(results)               \
    X(duplicates) X(dead_servers) X(queue_full) X(send_failures)            \
    X(heartbeats) X(servers) X(clients) X(inflight) X(pending)
/* clang-format on */

struct dh_coordinator {
    void *ctx, *sock;
    struct dh_tp_auth auth; /* the job key (docs/security.md) */
    int keyed;              /* 1: auth holds a key: CURVE */
    char endpoint[DH_WIRE_MAX_ADDR + 1];
    FILE *telemetry;
    int hb_timeout_ms, queue_per_worker;
    int exit_unused_ms;       /* see dh_coordinator_opts */
    int had_local;            /* a local server registered at some time */
    uint64_t unused_since_ms; /* no local server since then (0: some) */
    int shutdown;
    int quiet; /* 1: failed sends are counted, not logged */
    int bound; /* the endpoint is ours (ipc file to remove) */

    struct dh_place *place;
    struct dh_inflight *inflight;
    int max_servers, max_clients;
    struct co_server *servers; /* indexed by placement slot */
    struct co_client *clients;
    int32_t *rank_local; /* rank -> slot of its local server, or -1 */
    uint64_t next_gen;

    struct dh_idmap tasks; /* task id -> struct co_task *, all but the
                               cancelled ones; limit inflight + pending */
    struct co_task **fifo; /* ring of waiting tasks */
    size_t fifo_cap, fifo_head, fifo_len, pending_new, max_pending;
    uint64_t *dead_buf;
    size_t dead_cap;

    const char *cur_addr; /* Peer-Address of the message being handled */
    struct dh_wire_msg in, out;

#define CO_STAT_FIELD_(n) _Atomic uint64_t st_##n;
    CO_STATS(CO_STAT_FIELD_)
#undef CO_STAT_FIELD_
};

#define CO_INC(c, n)                                                           \
    atomic_fetch_add_explicit(&(c)->st_##n, 1, memory_order_relaxed)
#define CO_SET(c, n, v)                                                        \
    atomic_store_explicit(&(c)->st_##n, (uint64_t)(v), memory_order_relaxed)

/* ---- coordinator.c ---- */
/* Encodes `m` and sends it to `to` without blocking.  0 or negative
 * (counted in send_failures and logged). */
int dh__co_send(struct dh_coordinator *c, const struct co_peer *to,
                const struct dh_wire_msg *m);
/* Counts one malformed message from `from` and logs it on one line. */
void dh__co_malformed(struct dh_coordinator *c, const struct co_peer *from,
                      const char *fmt, ...) DH_PRINTF(3, 4);

/* ---- coordinator_route.c ---- */
int dh__co_tasks_init(struct dh_coordinator *c, size_t max_inflight,
                      size_t max_pending, struct dh_err *e);
void dh__co_tasks_fini(struct dh_coordinator *c);
/* Takes the request's arrays out of `m` (m is left empty). */
void dh__co_on_request(struct dh_coordinator *c, const struct co_peer *from,
                       struct dh_wire_msg *m, uint64_t now);
/* ResultNotice or ErrorNotice. */
void dh__co_on_done(struct dh_coordinator *c, const struct co_peer *from,
                    const struct dh_wire_msg *m, uint64_t now);
/* Places waiting tasks, oldest first, until one meets backpressure. */
void dh__co_drain(struct dh_coordinator *c, uint64_t now);
/* The client of `rank` is now `to` (a new process): every known task of
 * that rank answers there, so late results reach a client that releases
 * them. */
void dh__co_client_moved(struct dh_coordinator *c, uint32_t rank,
                         const struct co_peer *to);
/* Queues the in-flight tasks of dead slot `slot` for re-routing (the slot
 * has already left placement and the registry). */
void dh__co_orphan_tasks(struct dh_coordinator *c, int32_t slot);

#endif
