/*
 * datahelix/coordinator.h - the control plane (DESIGN.md 2, 3; issue 4
 * item 2): one event loop on a ZeroMQ ROUTER socket that registers clients
 * and DataServers, routes every descriptor request through the placement
 * policy (place.h), keeps the in-flight table (inflight.h), forwards
 * results and errors to the requesting client, and re-routes the tasks of
 * a DataServer that stops heartbeating.  It never touches tensors.
 *
 * Protocol as the Coordinator speaks it (docs/wire-protocol.md; one
 * Envelope per ZeroMQ message, peers are DEALER sockets):
 *   RegisterServer / RegisterClient  the accepted message is echoed back as
 *       the ack; a refused one (registry full, role clash) is answered with
 *       a Shutdown whose reason says why.  A LOCAL server with a new id
 *       for a rank that already has one supersedes it (the rank's client
 *       restarted its DataServer: a new arena): the old one is declared
 *       dead at once and its tasks re-routed, delivered to the new one.
 *   Heartbeat  updates placement feedback and the server's last-seen time;
 *       one marked `leaving` drops the server at once (its tasks re-routed,
 *       not counted in dead_servers).
 *       Registrations and notices naming a registered server also
 *       count as signs of life.
 *   DescriptorRequest  placed, then a Route with the embedded request goes
 *       to the chosen DataServer and a Route without it (the ack) to the
 *       client.  If every candidate is at its queue cap (or no server is
 *       registered yet) the request waits in a bounded FIFO and is retried
 *       whenever capacity may have freed (each retry goes once round the
 *       FIFO, so a waiting request does not hold back requests behind it
 *       whose servers have room; the waiting ones keep their order); with the FIFO full the client
 *       gets an ErrorNotice (cause DH_ETOOBIG) from server_id
 *       DH_COORDINATOR_SERVER_ID.  A request for a task already known is
 *       not placed twice: its client identity is refreshed (and, if it is
 *       running, the Route ack is re-sent).
 *   ResultNotice / ErrorNotice  accepted only from the server the task
 *       is routed to or its delivery target, from the connection that
 *       registered it (docs/wire-protocol.md "Authorization"; a refused
 *       result's slot is released to its sender); the first completion of a task is
 *       forwarded to its client; a later duplicate is NOT forwarded: the
 *       Coordinator answers the peer that sent it with a Release of the
 *       notice's slot (offset, generation) so the slot returns to its arena
 *       (a duplicate ErrorNotice holds no slot and is just dropped).  So a
 *       client sees each task id at most once from the Coordinator.
 *   Shutdown  from a peer is refused (counted in `refused`) unless it
 *       holds an admin key of the job's key file; the owner ends run()
 *       through its stop flag; on exit every registered peer is
 *       sent a Shutdown (best effort, never blocking).
 *   Registrations of a rank's client and local server carry the rank's
 *       token; requests come only from the rank's registered client, for
 *       its own rank; per-rank and per-peer bounds ("Bounds" there).
 *   Anything else (undecodable bytes, wrong frame count, a message type a
 *       peer may not send, a heartbeat from an unregistered server) is
 *       counted in dh_coordinator_stats.malformed and logged as
 *       one stderr line naming the peer; the loop keeps serving.
 *
 * Dead servers: a server silent for heartbeat_timeout_ms is removed from
 * placement and from the registry; each of its in-flight tasks is placed
 * again (its local server excluded) and forwarded, or queued as above.
 * A rank's local server is judged by its process instead, where the job
 * has a key: its connection's close (the process ended) declares it dead
 * at once, and only a silence of local_silence_ms (a hung process) does
 * otherwise, so a busy CPU that delays heartbeats kills nothing.
 *
 * Thread-safety: create / run / destroy from one thread at a time; run()
 * owns the socket while it runs.  dh_coordinator_stats() and
 * dh_coordinator_endpoint() may be called from any thread at any time
 * between create and destroy.
 */
#ifndef DATAHELIX_COORDINATOR_H
#define DATAHELIX_COORDINATOR_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "datahelix/error.h"

#define DH_COORDINATOR_DEFAULT_LISTEN "tcp://127.0.0.1:7500"
/* server_id of ErrorNotices the Coordinator itself originates. */
#define DH_COORDINATOR_SERVER_ID UINT32_MAX

struct dh_coordinator; /* opaque */

struct dh_coordinator_opts {
    const char *listen;       /* ZeroMQ endpoint to bind; NULL: default above */
    const char *policy;       /* "round-robin", "least-request" (default when
                            NULL) or "deadline" */
    int heartbeat_timeout_ms; /* silence that kills a server (default 3000;
                                 1..3,600,000) */
    FILE *telemetry;          /* one JSON line per placement decision; NULL:
                            none.  Borrowed: must outlive the coordinator */
    int max_servers;          /* registered DataServers (default 1024) */
    int max_clients;          /* registered clients (default 4096) */
    size_t max_inflight;  /* tasks placed and not completed (default 65536) */
    size_t max_pending;   /* requests waiting for capacity (default 4096) */
    int queue_per_worker; /* queue cap of a server: this x its workers
                             tasks in flight (default 4; 0 = no cap) */
    int cpu_pools;        /* 1 (default): under the deadline policy, the
                             local servers of a host that share CPUs take
                             as many tasks at once as the CPUs can run
                             (docs/placement.md "CPU pools"); 0: off */
    int exit_when_unused_ms; /* > 0: run() returns once no LOCAL server has
                                been registered for this long, after the
                                first one registered (the embedded
                                Coordinator of a multi-rank job: local
                                servers end with their ranks).  0: off */
    /* Bounds against hostile or broken peers (docs/wire-protocol.md
     * "Bounds"); 0 takes the default. */
    int claim_timeout_ms;        /* a rank with no local server and no message
                                  from its client for this long may be
                                  claimed by another token (default 30000) */
    int pending_timeout_ms;      /* a request waiting this long for a server
                                  fails with DH_ETIMEOUT (default 120000) */
    int peer_msgs_per_s;         /* messages one peer may send a second, and
                                  in a burst (default 100000; < 0: no cap) */
    uint32_t max_tasks_per_rank; /* tasks one rank may hold (default 4096) */
    uint64_t max_ids_per_rank;   /* sample ids they may hold (default 2^21) */
    int max_remote_servers;      /* registry slots remote servers may hold
                                  (default max_servers / 2: the rest is
                                  kept for local servers) */
    const char *keyfile;     /* the job key (docs/security.md): every peer must
                            hold it (CURVE).  NULL: $DATAHELIX_KEYFILE if
                            set, else no key */
    int insecure;            /* 1: bind a non-local address without a key
                            (warned); 0 (default): refused */
    int metrics_interval_ms; /* > 0: keep telemetry figures and publish
                                them for dh_coordinator_metrics_text()
                                at most this often (docs/metrics.md);
                                0 (default): none */
    int overdue_ms;       /* a task on a live remote server with no answer after
                       this, and past 4 x its predicted time or its
                       deadline, is re-routed to its rank's local server
                       (docs/security.md "Sidecars checked"); 0: the
                       default, 5000 */
    int local_silence_ms; /* a local server whose connection is watched
                             (a key) is declared dead after this long
                             silent; its connection's close kills it at
                             once.  0: the default, 10 x
                             heartbeat_timeout_ms, at least 30000 */
};

/* Fills the defaults above (listen / policy NULL, telemetry NULL). */
void dh_coordinator_opts_default(struct dh_coordinator_opts *o);

/* Counters since create (each read atomically). */
struct dh_coordinator_stats {
    uint64_t malformed;     /* messages rejected and logged */
    uint64_t requests;      /* descriptor requests accepted */
    uint64_t routed;        /* Routes sent to servers (reroutes included) */
    uint64_t rerouted;      /* tasks moved off a dead server */
    uint64_t results;       /* completions forwarded to clients */
    uint64_t duplicates;    /* late completions released / dropped */
    uint64_t dead_servers;  /* servers declared dead */
    uint64_t queue_full;    /* requests refused: FIFO full */
    uint64_t send_failures; /* sends ZeroMQ refused (peer gone, HWM) */
    uint64_t heartbeats;    /* heartbeats of registered servers applied */
    uint64_t refused;       /* messages refused by an authorization rule */
    uint64_t rate_limited;  /* messages dropped over a peer's rate cap */
    uint64_t expired;       /* requests failed after pending_timeout_ms */
    uint64_t capped;        /* requests refused over a rank's caps */
    uint64_t servers, clients, inflight, pending; /* current sizes */
    uint64_t refused_peers; /* connections refused: not the job's key */
    uint64_t rechecked;     /* remote verdicts against samples checked on the
                           rank's local server (docs/security.md) */
    uint64_t overdue;       /* tasks re-routed off a live remote, overdue */
    uint64_t demoted;       /* remote servers demoted: answers out of line */
};

/*
 * Creates a Coordinator bound to o->listen (o may be NULL: defaults).
 * On success *out owns it (dh_coordinator_destroy()); on error *out is
 * untouched and `e` names the address and the cause: DH_EINVAL (bad
 * option, policy or endpoint), DH_EIO (the address is busy or cannot be
 * bound), DH_ENOMEM.
 */
int dh_coordinator_create(const struct dh_coordinator_opts *o,
                          struct dh_coordinator **out,
                          struct dh_err *e) DH_MUST_CHECK;

/*
 * Runs the event loop until *stop becomes non-zero (checked at least every
 * 50 ms and after every signal-interrupted wait; stop may be NULL) or a
 * Shutdown message arrives.  Returns 0 then; DH_EIO if the socket fails
 * (named in `e`).  May be called again after it returns.
 */
int dh_coordinator_run(struct dh_coordinator *c, const volatile int *stop,
                       struct dh_err *e) DH_MUST_CHECK;

/* The endpoint actually bound (tcp port 0 resolved: ZMQ_LAST_ENDPOINT).
 * Borrowed: valid until dh_coordinator_destroy(). */
const char *dh_coordinator_endpoint(const struct dh_coordinator *c);

void dh_coordinator_stats(const struct dh_coordinator *c,
                          struct dh_coordinator_stats *out);

/*
 * The figures last published by run() (at most metrics_interval_ms old)
 * as Prometheus text exposition, in a buffer it allocates: *out
 * (NUL-terminated, *len bytes), freed by the caller with free().  Any
 * thread, while the Coordinator exists; it never delays run(), which
 * skips a publication rather than wait for a reader.  DH_EINVAL if
 * metrics are off, DH_ENOMEM.
 */
int dh_coordinator_metrics_text(struct dh_coordinator *c, char **out,
                                size_t *len) DH_MUST_CHECK;

/* Closes the socket (linger 0) and frees everything.  Accepts NULL. */
void dh_coordinator_destroy(struct dh_coordinator *c);

#endif
