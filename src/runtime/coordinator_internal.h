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
    /* its payload secret (RegisterServer.sender_secret): the targets of
     * its payloads are told the token derived from it */
    char sender_secret[DH_WIRE_TOKEN_LEN + 1];
    int32_t pool;           /* CPU pool (coordinator_pools.c), or -1 */
    double cpu_fraction;    /* last measured (heartbeat), 0 = none yet */
    uint32_t slot_waiting;  /* workers waiting for arena room (heartbeat) */
    uint32_t cpus, workers; /* as registered */
    /* its workers' reads at the last rate sample (heartbeat totals), and
     * the measured read cost, ms per MB (EWMA; 0 = none yet) */
    uint64_t read_bytes;
    double read_ms, read_ms_per_mb;
    /* answers out of line (coordinator_doubt.c); demoted: no new tasks */
    uint32_t strikes;
    int demoted;
    /* A local server's connection, watched for its close (the ZAP
     * handler's monitor, dh__zap_closed): conn_fd -1 when not watched
     * (no key, or a message fed in), else the fd and dh__zap_conn_name()
     * at registration.  Its close is the process's end; silence alone
     * kills it only after local_silence_ms (a busy CPU delays heartbeats,
     * not a close). */
    int conn_fd;
    uint64_t conn_ino;
    char conn[64];
};

/* A CPU pool (coordinator_pools.c): the local servers of one host name
 * whose workers share the same CPUs (RegisterServer.cpus / cpu_set). */
struct co_pool {
    uint32_t members, known; /* servers; of them with a cpu_fraction */
    uint32_t cpus;           /* the fewest any member reported */
    uint64_t cpu_set;
    double frac_sum;       /* of the known members' cpu_fraction */
    uint32_t slot_waiting; /* the members' workers waiting for arena room */
    int32_t cap;           /* as set in placement */
    char host[DH_WIRE_MAX_HOST + 1];
};

/* Who speaks for a rank (coordinator_guard.c): the claim's token, proved
 * by the rank's client and its local DataServer at registration, and what
 * the rank holds here (its per-rank caps). */
struct co_rank {
    char token[DH_WIRE_TOKEN_LEN + 1];
    uint64_t seen_ms; /* last message of its client or local server */
    int has_client;
    struct co_peer client;
    uint32_t tasks; /* its tasks in the map */
    uint64_t ids;   /* their sample ids */
};

struct co_rate;    /* coordinator_guard.c */
struct co_metrics; /* coordinator_metrics.c */

enum co_state { CO_PENDING_NEW, CO_PENDING_REROUTE, CO_RUNNING };

/* rank_local[] of a rank whose local server left (its client went away or
 * it was told to stop): no server will come for its tasks, which fail
 * instead of waiting, until a client registers the rank anew. */
#define CO_RANK_LEFT (-2)

/* One task the Coordinator knows: waiting in the FIFO or running. */
struct co_task {
    struct dh_wire_request req; /* owns its arrays */
    struct co_peer client;
    enum co_state state;
    int cancelled;     /* completed while in the FIFO: the FIFO frees it */
    int bp_logged;     /* a BACKPRESSURE decision was already in telemetry */
    int counted_new;   /* counted in pending_new while in the FIFO */
    int counted_rank;  /* counted in its co_rank's tasks / ids */
    int pool_released; /* running past its bound: its CPU pool no longer
                          counts it (coordinator_pools.c) */
    int32_t server;    /* placement slot while running, else -1 */
    uint64_t server_gen;
    double work_ms;
    uint64_t arrived_ms, since_ms;
    /* a remote's verdict against it is being checked on the rank's local
     * server (coordinator_doubt.c): that remote's slot and registration */
    int doubted;
    int32_t doubt_slot;
    uint64_t doubt_gen;
};

/* Several entries a line, which clang-format 14 re-breaks by one more on
 * every run: kept out of its reach. */
/* clang-format off */
#define CO_STATS(X)                                                         \
    X(malformed) X(requests) X(routed) X(rerouted) X(results)               \
    X(duplicates) X(dead_servers) X(queue_full) X(send_failures)            \
    X(heartbeats) X(refused) X(rate_limited) X(expired) X(capped)          \
    X(servers) X(clients) X(inflight) X(pending) X(rechecked) X(overdue)    \
    X(demoted)
/* clang-format on */

struct dh_coordinator {
    void *ctx, *sock;
    struct dh_tp_auth auth; /* the job key (docs/security.md) */
    int keyed;              /* 1: auth holds a key: CURVE */
    char endpoint[DH_WIRE_MAX_ADDR + 1];
    FILE *telemetry;
    int tel_dirty;  /* lines buffered since the loop turn's flush */
    int tel_failed; /* a telemetry write failed (said once) */
    int hb_timeout_ms, queue_per_worker;
    int local_silence_ms; /* see struct co_server.conn_fd */
    int overdue_ms;       /* coordinator_doubt.c */
    int cpu_pools;        /* 1: gate local servers by CPU pool */
    int edf;              /* 1: new requests wait in due order */
    uint64_t next_pool_tick_ms;
    struct co_pool *pools;    /* [max_servers], by pool id */
    int exit_unused_ms;       /* see dh_coordinator_opts */
    int had_local;            /* a local server registered at some time */
    uint64_t unused_since_ms; /* no local server since then (0: some) */
    int shutdown;
    int quiet;            /* 1: failed sends are counted, not logged */
    int bound;            /* the endpoint is ours (ipc file to remove) */
    uint64_t incarnation; /* random, never 0: told to clients in acks, so
                             they see a restart (docs/exactly-once.md) */

    struct dh_place *place;
    struct dh_inflight *inflight;
    int max_servers, max_clients, max_remote, max_orphan_local;
    struct co_server *servers; /* indexed by placement slot */
    int32_t *rank_local;       /* rank -> slot of its local server, or -1
                               (none yet, or it died: its tasks wait for
                               the next), or CO_RANK_LEFT */
    struct co_rank **ranks;    /* by rank; NULL: never registered */
    size_t n_ranks;
    int claim_timeout_ms, pending_timeout_ms, peer_rate;
    uint32_t rank_max_tasks;
    uint64_t rank_max_ids, next_expire_ms;
    struct co_rate *rates;
    uint64_t log_window_ms, log_lines, log_suppressed;
    uint8_t *drain_blocked; /* rank bitmap of one drain */
    int drain_again;        /* the last drain left ranks untried */
    struct co_task **drain_buf;
    uint64_t next_gen;

    struct dh_idmap tasks; /* task id -> struct co_task *, all but the
                               cancelled ones; limit inflight + pending */
    struct co_task **fifo; /* ring of waiting tasks */
    size_t fifo_cap, fifo_head, fifo_len, pending_new, max_pending;
    uint64_t *dead_buf;
    size_t dead_cap;

    const char *cur_addr; /* Peer-Address of the message being handled */
    int cur_fd;           /* its connection's fd (dh_tp_from.fd), or -1 */
    const char *cur_type; /* its type name, for refusals */
    /* 1: the message being handled comes from a peer that authenticated
     * with an admin key (the ZAP handler's user id, DH_ZAP_USER_ADMIN);
     * the owner's own process stops the Coordinator through
     * dh_coordinator_run()'s stop flag (a signal). */
    int cur_admin;
    /* The Envelope frame `in` was decoded from, while it is handled (NULL
     * when fed): a notice passes on to its client as these bytes. */
    zmq_msg_t *cur_raw;
    struct dh_wire_msg in, out;
    struct co_metrics *mx; /* NULL: no metrics (metrics_interval_ms 0) */

#define CO_STAT_FIELD_(n) _Atomic uint64_t st_##n;
    CO_STATS(CO_STAT_FIELD_)
#undef CO_STAT_FIELD_
};

#define CO_INC(c, n)                                                           \
    atomic_fetch_add_explicit(&(c)->st_##n, 1, memory_order_relaxed)
#define CO_SET(c, n, v)                                                        \
    atomic_store_explicit(&(c)->st_##n, (uint64_t)(v), memory_order_relaxed)

/* ---- coordinator_pools.c (docs/placement.md "CPU pools") ---- */
/* Puts the local server just added at `slot` in the pool of its host and
 * CPUs (a new one if none), when pools are on and it named its CPUs. */
void dh__co_pool_join(struct dh_coordinator *c, int slot,
                      const struct dh_wire_register_server *r);
/* The server at `slot` heartbeat: its tasks' `cpu_fraction` (0: nothing
 * new) and its workers waiting for arena room now. */
void dh__co_pool_heartbeat(struct dh_coordinator *c, int slot,
                           double cpu_fraction, uint32_t slot_waiting);
/* The server at `slot` is leaving (before its slot is freed). */
void dh__co_pool_leave(struct dh_coordinator *c, int slot);
/* Once a second: a running task far past its prediction stops counting
 * against its pool, so one stuck task cannot hold other ranks' CPUs. */
void dh__co_pool_tick(struct dh_coordinator *c, uint64_t now);
/* Before a running task leaves its server's count (dh_place_complete). */
void dh__co_pool_unrelease(struct dh_coordinator *c, struct co_task *t);
/* A pool's cap: its CPUs over the CPU share of its tasks' runnable time,
 * rounded, at least cpus (pure; tested). */
int32_t dh__co_pool_cap(uint32_t cpus, double cpu_fraction);

/* ---- coordinator.c ---- */
/* The event loop's two steps without the socket, for the stateful fuzzer
 * (tests/fuzz/fuzz_coordinator_seq.c): one encoded envelope as received
 * from routing id `id` (decoded, rate-capped and dispatched as recv_one()
 * does; `admin`: the transport authenticated the owner's key), and the
 * timers (heartbeat deaths, request expiry) at `now`. */
void dh__co_feed(struct dh_coordinator *c, const uint8_t *id, size_t id_len,
                 const uint8_t *buf, size_t len, int admin, uint64_t now);
void dh__co_tick(struct dh_coordinator *c, uint64_t now);

/* Encodes `m` and sends it to `to` without blocking.  0 or negative
 * (counted in send_failures and logged). */
int dh__co_send(struct dh_coordinator *c, const struct co_peer *to,
                const struct dh_wire_msg *m);
/* Passes `m` on to `to`: when it is the message being handled (c->in),
 * as it came - its received frame, neither encoded again nor copied;
 * else (or fed, no frame kept) encoded.  As dh__co_send() otherwise. */
int dh__co_forward(struct dh_coordinator *c, const struct co_peer *to,
                   const struct dh_wire_msg *m);
/* Counts one malformed message from `from` and logs it on one line. */
void dh__co_malformed(struct dh_coordinator *c, const struct co_peer *from,
                      const char *fmt, ...) DH_PRINTF(3, 4);

int dh__co_same_peer(const struct co_peer *a, const struct co_peer *b);
/* "127.0.0.1 id 0080000001" (addr may be NULL). */
void dh__co_peer_name(const char *addr, const struct co_peer *p, char *buf,
                      size_t len);

/* ---- coordinator_guard.c ---- */
int dh__co_guard_init(struct dh_coordinator *c, struct dh_err *e);
void dh__co_guard_fini(struct dh_coordinator *c);
/* 1: `from` may send one more message now (its token bucket: peer_rate
 * a second, as many in a burst); 0: drop it. */
int dh__co_rate_ok(struct dh_coordinator *c, const struct co_peer *from,
                   uint64_t now);
/* Counts one refusal (stats.refused) and logs it, rate-limited. */
void dh__co_refused(struct dh_coordinator *c, const struct co_peer *from,
                    const char *fmt, ...) DH_PRINTF(3, 4);
/* One stderr line, rate-limited with the refusals. */
void dh__co_logf(struct dh_coordinator *c, const char *fmt, ...)
    DH_PRINTF(2, 3);
/* 1: `rank` is claimed and its claim is alive (a local server registered,
 * or its client / server seen within claim_timeout_ms). */
int dh__co_claim_live(const struct dh_coordinator *c, uint32_t rank,
                      uint64_t now);
/* The claim of `rank` for `token`: the live claim if the token matches,
 * else a free or lapsed one taken over; NULL (and *why) if refused. */
struct co_rank *dh__co_claim(struct dh_coordinator *c, uint32_t rank,
                             const char *token, uint64_t now, const char **why);
/* The rank's claim if `from` is its registered client, else NULL. */
struct co_rank *dh__co_client_of(const struct dh_coordinator *c, uint32_t rank,
                                 const struct co_peer *from);

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
/* Fails waiting requests older than pending_timeout_ms (DH_ETIMEOUT to
 * their clients); cheap to call often (it runs once a second). */
void dh__co_expire(struct dh_coordinator *c, uint64_t now);
/* Places waiting tasks, oldest first; see the drain in coordinator_route.c. */
void dh__co_drain(struct dh_coordinator *c, uint64_t now);
/* The client of `rank` is now `to` (a new process): every known task of
 * that rank answers there, so late results reach a client that releases
 * them. */
void dh__co_client_moved(struct dh_coordinator *c, uint32_t rank,
                         const struct co_peer *to);
/* Queues the in-flight tasks of dead slot `slot` for re-routing (the slot
 * has already left placement and the registry). */
void dh__co_orphan_tasks(struct dh_coordinator *c, int32_t slot);
/* Task t leaves its server for its rank's local server (local_only),
 * re-queued; and a slot given back to the server that holds it. */
void dh__co_to_local(struct dh_coordinator *c, struct co_task *t, uint64_t now);
void dh__co_send_release(struct dh_coordinator *c, const struct co_peer *to,
                         const struct dh_wire_result *res);

/* ---- coordinator_doubt.c: remote servers not taken at their word ---- */
/* A remote's notice against task t's samples (m: an ErrorNotice, or a
 * ResultNotice with substitutions, received from `from`, registered in
 * slot `from_slot`): 1 if the task
 * went to its rank's local server to be checked (the notice is dropped),
 * 0 if it goes on as usual. */
int dh__co_doubt(struct dh_coordinator *c, struct co_task *t,
                 const struct co_peer *from, int32_t from_slot,
                 const struct dh_wire_msg *m, uint64_t now);
/* Task t completed with m: a strike for the remote whose verdict the
 * local server overruled. */
void dh__co_doubt_settled(struct dh_coordinator *c, const struct co_task *t,
                          const struct dh_wire_msg *m);
/* Tasks overdue on live remotes go to their ranks' local servers. */
void dh__co_overdue(struct dh_coordinator *c, uint64_t now);
/* 1 if the server in `slot` is demoted: placement sends it nothing new. */
int dh__co_demoted(const struct dh_coordinator *c, int32_t slot);
/* The local server of `rank` died: its tasks running on other servers can
 * no longer be delivered (their payloads went, or would go, to the dead
 * one), so each is re-routed to the rank's next local server. */
void dh__co_target_lost(struct dh_coordinator *c, uint32_t rank, uint64_t now);

/* ---- coordinator_metrics.c (docs/metrics.md) ----
 * Hooks of the event loop; each is a no-op when c->mx is NULL. */
int dh__co_mx_init(struct dh_coordinator *c, int publish_ms, struct dh_err *e);
void dh__co_mx_fini(struct dh_coordinator *c);
void dh__co_mx_server_up(struct dh_coordinator *c, int32_t slot,
                         uint32_t workers);
/* dead: declared dead (0: it left). */
void dh__co_mx_server_down(struct dh_coordinator *c, int32_t slot, int dead);
void dh__co_mx_heartbeat(struct dh_coordinator *c, int32_t slot,
                         const struct dh_wire_heartbeat *h);
/* slot: the chosen server, -1 under backpressure. */
void dh__co_mx_decision(struct dh_coordinator *c, int32_t slot, int reason,
                        double us);
void dh__co_mx_request(struct dh_coordinator *c,
                       const struct dh_wire_request *q);
/* A task's first completion `m` (ResultNotice or ErrorNotice), before
 * the task is freed. */
void dh__co_mx_done(struct dh_coordinator *c, const struct co_task *t,
                    const struct dh_wire_msg *m, uint64_t now);
/* Publishes the figures for readers at most every publish_ms. */
void dh__co_mx_tick(struct dh_coordinator *c, uint64_t now);

#endif
