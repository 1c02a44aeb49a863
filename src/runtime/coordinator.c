/*
 * coordinator.c - the Coordinator's socket, event loop and registry
 * (src/include/datahelix/coordinator.h; DESIGN.md 2, 3).
 *
 * Design: one ZMQ_ROUTER socket; every peer (client or DataServer) is a
 * DEALER and each ZeroMQ message is [routing id][one Envelope].  The loop
 * waits in zmq_poll() for at most 50 ms, handles up to a burst of messages
 * without blocking, then checks heartbeats.  Sends never block
 * (ZMQ_DONTWAIT, ZMQ_ROUTER_MANDATORY so an unknown peer is an error, not a
 * silent drop).  Messages over DH_WIRE_MAX_MSG are refused by ZeroMQ itself
 * (ZMQ_MAXMSGSIZE: the peer is disconnected).  Socket setup, framing and
 * the codec calls are the transport's (transport.h).  Placement, the task
 * table and completions live in coordinator_route.c.
 *
 * Locking: none; the thread in dh_coordinator_run() owns all state, other
 * threads only read the atomic counters.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include <zmq.h>

#include "core/log.h"
#include "core/alloc.h"
#include "core/clock.h"
#include "runtime/coordinator_internal.h"
#include "runtime/transport.h"
#include "runtime/zap.h"

#define POLL_MS 50
#define BURST 256
/* The bounds' defaults (coordinator.h), also for an option left 0. */
#define DEF_CLAIM_MS 30000
#define DEF_PENDING_MS 120000
#define DEF_PEER_RATE 100000
#define DEF_RANK_TASKS 4096
#define DEF_RANK_IDS (1u << 21)

void dh_coordinator_opts_default(struct dh_coordinator_opts *o)
{
    memset(o, 0, sizeof(*o));
    o->heartbeat_timeout_ms = 3000;
    o->overdue_ms = 5000;
    o->max_servers = 1024;
    o->max_clients = 4096;
    o->max_inflight = 65536;
    o->max_pending = 4096;
    o->queue_per_worker = 4;
    o->cpu_pools = 1;
    o->claim_timeout_ms = DEF_CLAIM_MS;
    o->pending_timeout_ms = DEF_PENDING_MS;
    o->peer_msgs_per_s = DEF_PEER_RATE;
    o->max_tasks_per_rank = DEF_RANK_TASKS;
    o->max_ids_per_rank = DEF_RANK_IDS;
}

/* ---- logging ---- */

/* "127.0.0.1 id 0080000001": the transport address when ZeroMQ knows it
 * (addr: of the message being handled, or NULL) and the routing id. */
void dh__co_peer_name(const char *addr, const struct co_peer *p, char *buf,
                      size_t len)
{
    size_t n = 0;

    n = (size_t)snprintf(buf, len, "%s id ", addr && addr[0] ? addr : "peer");
    for (size_t i = 0; p && i < p->len && i < 32 && n + 3 < len; i++)
        n += (size_t)snprintf(buf + n, len - n, "%02x", p->id[i]);
}

void dh__co_malformed(struct dh_coordinator *c, const struct co_peer *from,
                      const char *fmt, ...)
{
    char who[128], why[DH_ERR_MSG_MAX];
    va_list ap;

    CO_INC(c, malformed);
    va_start(ap, fmt);
    vsnprintf(why, sizeof(why), fmt, ap);
    va_end(ap);
    dh__co_peer_name(c->cur_addr, from, who, sizeof(who));
    dh__co_logf(c, "coordinator: malformed message from %s: %s", who, why);
}

/* ---- sending ---- */

/* A send's outcome, counted and (unless quiet) logged naming the peer. */
static int sent(struct dh_coordinator *c, int rc, const struct co_peer *to,
                enum dh_wire_type type, const struct dh_err *e)
{
    if (rc < 0)
        CO_INC(c, send_failures);
    if (rc < 0 && !c->quiet) {
        char who[128];

        dh__co_peer_name(NULL, to, who, sizeof(who));
        dh__co_logf(c, "coordinator: cannot send %s to %s: %s",
                    dh_wire_type_name(type), who, e->msg);
    }
    return rc;
}

int dh__co_send(struct dh_coordinator *c, const struct co_peer *to,
                const struct dh_wire_msg *m)
{
    struct dh_tp_from dst;
    struct dh_err e;

    dst.id_len = to->len;
    memcpy(dst.id, to->id, to->len);
    return sent(c, dh__tp_send(c->sock, &dst, m, NULL, &e), to, m->type, &e);
}

int dh__co_forward(struct dh_coordinator *c, const struct co_peer *to,
                   const struct dh_wire_msg *m)
{
    struct dh_tp_from dst;
    struct dh_err e;

    if (!c->cur_raw || m != &c->in)
        return dh__co_send(c, to, m);
    dst.id_len = to->len;
    memcpy(dst.id, to->id, to->len);
    return sent(c, dh__tp_send_frame(c->sock, &dst, c->cur_raw, &e), to,
                c->in.type, &e);
}

static void send_refusal(struct dh_coordinator *c, const struct co_peer *to,
                         const char *why)
{
    dh_wire_msg_fini(&c->out);
    dh_wire_msg_init(&c->out, DH_WIRE_SHUTDOWN);
    snprintf(c->out.u.shutdown.reason, sizeof(c->out.u.shutdown.reason),
             "registration refused: %s", why);
    (void)dh__co_send(c, to, &c->out);
    dh__co_refused(c, to, "%s", why);
}

/* ---- registry ---- */

static int find_server(const struct dh_coordinator *c, uint32_t wire_id)
{
    for (int i = 0; i < c->max_servers; i++)
        if (c->servers[i].used && c->servers[i].wire_id == wire_id)
            return i;
    return -1;
}

static int free_slot_server(const struct dh_coordinator *c)
{
    for (int i = 0; i < c->max_servers; i++)
        if (!c->servers[i].used)
            return i;
    return -1;
}

/* A local server's connection is watched for its close when the ZAP
 * handler monitors the socket (a key) and ZeroMQ names the message's
 * fd; a remote server is judged by its heartbeats alone (a host or
 * network can fail without a close). */
static void watch_conn(struct dh_coordinator *c, struct co_server *s)
{
    s->conn_fd = -1;
    s->conn[0] = 0;
    /* only a peer on this host: a host that fails closes nothing */
    if (s->role != DH_WIRE_ROLE_LOCAL || !c->keyed || !c->auth.zap ||
        c->cur_fd < 0 || !dh__zap_conn_local(c->cur_fd))
        return;
    dh__zap_conn_name(c->cur_fd, s->conn, sizeof(s->conn));
    s->conn_ino = dh__zap_conn_ino(c->cur_fd);
    if (strcmp(s->conn, "?") && s->conn_ino)
        s->conn_fd = c->cur_fd;
}

/* A known server registering again (a reconnect): same role and rank. */
static int reregister(struct dh_coordinator *c, int slot,
                      const struct co_peer *from,
                      const struct dh_wire_register_server *r, uint64_t now)
{
    struct co_server *s = &c->servers[slot];
    const char *why = NULL;

    if (s->role != r->role || s->rank != r->rank) {
        send_refusal(c, from,
                     "server id already registered with another "
                     "role or rank");
        return -1;
    }
    if (s->role == DH_WIRE_ROLE_LOCAL &&
        !dh__co_claim(c, r->rank, r->token, now, &why)) {
        send_refusal(c, from, why);
        return -1;
    }
    s->peer = *from;
    s->last_seen_ms = now;
    watch_conn(c, s);
    snprintf(s->addr, sizeof(s->addr), "%s", r->addr);
    memcpy(s->sender_secret, r->sender_secret, sizeof(s->sender_secret));
    dh__co_mx_server_up(c, slot, r->workers);
    return 0;
}

static void declare_dead(struct dh_coordinator *c, int slot, uint64_t now,
                         const char *why);

/* Why a new registration may not take a slot (NULL: it may).  A
 * connection registers one server; remote servers hold at most
 * max_remote slots, local servers of ranks no client has claimed at most
 * max_orphan_local, so strangers never take the slots of the job's local
 * servers; a local server must prove its rank's token. */
static const char *registry_bound(struct dh_coordinator *c,
                                  const struct co_peer *from,
                                  const struct dh_wire_register_server *r,
                                  uint64_t now)
{
    int remotes = 0, orphans = 0;
    const char *why = NULL;

    for (int i = 0; i < c->max_servers; i++) {
        const struct co_server *s = &c->servers[i];

        if (!s->used)
            continue;
        if (dh__co_same_peer(&s->peer, from) && s->wire_id != r->server_id)
            return "this connection already registered another server";
        remotes += s->role == DH_WIRE_ROLE_REMOTE;
        orphans += s->role == DH_WIRE_ROLE_LOCAL &&
                   !(c->ranks[s->rank] && c->ranks[s->rank]->has_client);
    }
    if (r->role == DH_WIRE_ROLE_REMOTE)
        return remotes >= c->max_remote ? "no room for another remote server"
                                        : NULL;
    if (!(c->ranks[r->rank] && c->ranks[r->rank]->has_client) &&
        !dh__co_claim_live(c, r->rank, now) && orphans >= c->max_orphan_local)
        return "no room for another local server of a rank without a client";
    (void)dh__co_claim(c, r->rank, r->token, now, &why);
    return why;
}

/* A new local server for a rank that has one supersedes it: the rank's
 * client restarted its DataServer (a new arena), so whatever ran on the
 * old one is re-routed with the new one as delivery target. */
static int add_server(struct dh_coordinator *c, const struct co_peer *from,
                      const struct dh_wire_register_server *r, uint64_t now)
{
    int local = r->role == DH_WIRE_ROLE_LOCAL;
    int slot;
    const char *why_s;
    struct dh_err e;
    char why[DH_ERR_MSG_MAX + 64];
    int32_t cap = c->queue_per_worker * (int32_t)r->workers;

    if ((why_s = registry_bound(c, from, r, now))) {
        send_refusal(c, from, why_s);
        return -1;
    }
    if (local && r->rank < DH_WIRE_MAX_RANKS && c->rank_local[r->rank] >= 0) {
        snprintf(why, sizeof(why), "superseded by server %u for rank %u",
                 r->server_id, r->rank);
        declare_dead(c, c->rank_local[r->rank], now, why);
    }
    slot = free_slot_server(c);
    if (slot < 0)
        snprintf(why, sizeof(why), "registry full (%d servers)",
                 c->max_servers);
    else if (dh_place_add_server(c->place, slot,
                                 local ? DH_PLACE_ROLE_LOCAL
                                       : DH_PLACE_ROLE_REMOTE,
                                 local ? (int32_t)r->rank : -1,
                                 (int32_t)r->workers, cap, &e) < 0)
        snprintf(why, sizeof(why), "server %u: %s", r->server_id, e.msg);
    else
        goto added;
    send_refusal(c, from, why);
    return -1;
added:
    c->servers[slot] = (struct co_server){.used = 1,
                                          .wire_id = r->server_id,
                                          .gen = ++c->next_gen,
                                          .peer = *from,
                                          .role = r->role,
                                          .rank = r->rank,
                                          .last_seen_ms = now};
    snprintf(c->servers[slot].addr, sizeof(c->servers[slot].addr), "%s",
             r->addr);
    watch_conn(c, &c->servers[slot]);
    memcpy(c->servers[slot].sender_secret, r->sender_secret,
           sizeof(c->servers[slot].sender_secret));
    dh__co_pool_join(c, slot, r);
    if (local)
        c->rank_local[r->rank] = slot;
    dh__co_mx_server_up(c, slot, r->workers);
    CO_INC(c, servers);
    return 0;
}

int dh__co_same_peer(const struct co_peer *a, const struct co_peer *b)
{
    return a->len == b->len && !memcmp(a->id, b->id, a->len);
}

/* A server registers once per process (a ZeroMQ reconnect is invisible
 * here), so a known id from another peer is a new process - a restart
 * whose predecessor's tasks died with it: it supersedes the old entry.
 * The same peer registering again (a lost ack) is just acknowledged. */
static void on_register_server(struct dh_coordinator *c,
                               const struct co_peer *from,
                               const struct dh_wire_msg *m, uint64_t now)
{
    const struct dh_wire_register_server *r = &m->u.register_server;
    int slot = find_server(c, r->server_id);
    int rc;
    const char *why = NULL;

    /* A local server's new process must prove the rank's token before it
     * may end the old one (registry_bound() checks it again).  A remote
     * has no token: its new process may take over a live one's id only
     * with that one's own payload secret (the same process, reconnected);
     * another waits until the live one is declared dead (issue 36: a job
     * member cannot push a live sidecar out and take its tasks). */
    if (slot >= 0 && !dh__co_same_peer(&c->servers[slot].peer, from) &&
        c->servers[slot].role == r->role && c->servers[slot].rank == r->rank) {
        if (r->role == DH_WIRE_ROLE_LOCAL &&
            !dh__co_claim(c, r->rank, r->token, now, &why)) {
            send_refusal(c, from, why);
            return;
        }
        if (r->role == DH_WIRE_ROLE_REMOTE &&
            !(r->sender_secret[0] &&
              dh__secret_eq(c->servers[slot].sender_secret,
                            r->sender_secret)) &&
            now - c->servers[slot].last_seen_ms < (uint64_t)c->hb_timeout_ms) {
            send_refusal(c, from,
                         "try again: server id is held by a live remote "
                         "server (another process); a restart registers "
                         "once that one is declared dead");
            return;
        }
        declare_dead(c, slot, now, "registered again by a new process");
        slot = -1;
    }
    rc = slot >= 0 ? reregister(c, slot, from, r, now)
                   : add_server(c, from, r, now);

    if (rc == 0 && slot < 0) {
        char role[40] = "remote";

        if (r->role == DH_WIRE_ROLE_LOCAL)
            snprintf(role, sizeof(role), "local to rank %u", r->rank);
        dh__log(DH_LOG_INFO,
                "coordinator: server %u (%s) joined: %s, %u workers",
                r->server_id, r->addr, role, r->workers);
    }
    if (rc == 0) {
        (void)dh__co_send(c, from, m); /* the ack: the message echoed */
        dh__co_drain(c, now);
    }
}

/* A client proves its rank's token: the first registration of a rank (or
 * one after its claim lapsed) sets it, any later one must carry it, so a
 * stranger cannot take a live rank's results.  The same client from a new
 * connection (a restart in the same job) keeps the rank's tasks. */
static void on_register_client(struct dh_coordinator *c,
                               const struct co_peer *from,
                               const struct dh_wire_msg *m, uint64_t now)
{
    const struct dh_wire_register_client *r = &m->u.register_client;
    const char *why = NULL;
    struct co_rank *k = dh__co_claim(c, r->rank, r->token, now, &why);

    if (!k) {
        send_refusal(c, from, why);
        return;
    }
    if (!k->has_client || !dh__co_same_peer(&k->client, from)) {
        /* A new client of the rank: a local server will come again. */
        if (c->rank_local[r->rank] == CO_RANK_LEFT)
            c->rank_local[r->rank] = -1;
        if (!k->has_client)
            CO_INC(c, clients);
        else
            dh__co_client_moved(c, r->rank, from); /* a restarted client */
        dh__log(DH_LOG_INFO, "coordinator: rank %u's client %s (pid %u on %s)",
                r->rank, k->has_client ? "restarted" : "joined", r->pid,
                r->host[0] ? r->host : "?");
    }
    k->has_client = 1;
    k->client = *from;
    /* The ack: the message echoed, with this process's incarnation (a
     * client that sees it change refills this Coordinator). */
    dh_wire_msg_fini(&c->out);
    dh_wire_msg_init(&c->out, DH_WIRE_REGISTER_CLIENT);
    c->out.u.register_client = *r;
    c->out.u.register_client.incarnation = c->incarnation;
    (void)dh__co_send(c, from, &c->out);
}

/* A heartbeat names a server not registered here: this Coordinator was
 * restarted (or dropped it as dead).  Told so, the server registers
 * again; its late heartbeats are no fault of its own, so not malformed. */
static void send_unknown(struct dh_coordinator *c, const struct co_peer *from,
                         uint32_t server_id)
{
    char who[128];

    dh__co_peer_name(c->cur_addr, from, who, sizeof(who));
    dh__co_logf(c,
                "coordinator: heartbeat from unregistered server "
                "%u (%s): told to register again",
                server_id, who);
    dh_wire_msg_fini(&c->out);
    dh_wire_msg_init(&c->out, DH_WIRE_HEARTBEAT);
    c->out.u.heartbeat.server_id = server_id;
    c->out.u.heartbeat.unknown = 1;
    (void)dh__co_send(c, from, &c->out);
}

/* The server's read cost from its heartbeats' totals: a sample once at
 * least 1 MB was read since the last one, into an EWMA (alpha 0.3) that
 * placement adds as C_io (dh_place_read_rate).  Totals that went down (a
 * restarted server under the same id) start the count again. */
#define READ_RATE_MIN_BYTES 1000000u
#define READ_RATE_ALPHA 0.3

static void read_rate(struct dh_coordinator *c, int32_t slot,
                      const struct dh_wire_heartbeat *h)
{
    struct co_server *s = &c->servers[slot];
    double mb, ms, v;

    if (h->read_bytes < s->read_bytes || h->read_ms < s->read_ms) {
        s->read_bytes = h->read_bytes;
        s->read_ms = h->read_ms;
        return;
    }
    if (h->read_bytes - s->read_bytes < READ_RATE_MIN_BYTES)
        return;
    mb = (double)(h->read_bytes - s->read_bytes) / 1e6;
    ms = h->read_ms - s->read_ms;
    s->read_bytes = h->read_bytes;
    s->read_ms = h->read_ms;
    v = ms / mb;
    s->read_ms_per_mb = s->read_ms_per_mb > 0
                            ? s->read_ms_per_mb +
                                  READ_RATE_ALPHA * (v - s->read_ms_per_mb)
                            : v;
    if (dh_place_read_rate(c->place, slot, s->read_ms_per_mb) < 0)
        s->read_ms_per_mb = 0; /* out of range: not used */
}

static void on_heartbeat(struct dh_coordinator *c, const struct co_peer *from,
                         const struct dh_wire_msg *m, uint64_t now)
{
    const struct dh_wire_heartbeat *h = &m->u.heartbeat;
    int slot = find_server(c, h->server_id);

    if (slot < 0) {
        if (!h->leaving) /* a leaving one may have been dropped already */
            send_unknown(c, from, h->server_id);
        return;
    }
    /* Only the connection that registered the server speaks for it: a
     * heartbeat from another would take its Routes. */
    if (!dh__co_same_peer(&c->servers[slot].peer, from)) {
        dh__co_refused(c, from, "server %u is registered by another connection",
                       h->server_id);
        return;
    }
    /* the connection it speaks on now (a reconnect has another) */
    if (c->servers[slot].conn_fd >= 0 && c->cur_fd >= 0 &&
        c->cur_fd != c->servers[slot].conn_fd)
        watch_conn(c, &c->servers[slot]);
    if (h->leaving) {
        struct co_server *s = &c->servers[slot];

        /* A local server leaves when its client went away (or was told
         * to stop): the rank is free for the next job's client at once,
         * not after claim_timeout_ms. */
        if (s->role == DH_WIRE_ROLE_LOCAL && c->ranks[s->rank] &&
            c->rank_local[s->rank] == slot)
            c->ranks[s->rank]->token[0] = '\0';
        declare_dead(c, slot, now, NULL);
        dh__co_drain(c, now);
        return;
    }
    c->servers[slot].last_seen_ms = now;
    if (c->servers[slot].role == DH_WIRE_ROLE_LOCAL &&
        c->ranks[c->servers[slot].rank])
        c->ranks[c->servers[slot].rank]->seen_ms = now;
    /* The wire's queue_depth counts running tasks too; placement wants
     * the queued ones beside the busy workers. */
    if (dh_place_heartbeat(c->place, slot,
                           (int32_t)(h->queue_depth > h->busy_workers
                                         ? h->queue_depth - h->busy_workers
                                         : 0),
                           (int32_t)h->busy_workers, h->latency_ms) < 0)
        dh__co_malformed(c, from, "heartbeat of server %u out of range",
                         h->server_id);
    dh__co_pool_heartbeat(c, slot, h->cpu_fraction, h->slot_waiting);
    read_rate(c, slot, h);
    dh__co_mx_heartbeat(c, slot, h);
    for (uint32_t i = 0; i < h->n_links; i++) {
        int to = find_server(c, h->links[i].peer_server_id);

        /* Only links into a local server feed C_net; others are ignored. */
        if (to >= 0 && c->servers[to].role == DH_WIRE_ROLE_LOCAL &&
            h->links[i].bytes_per_s > 0 &&
            dh_place_link(c->place, slot, to, (double)h->links[i].bytes_per_s,
                          1.0) < 0)
            break;
    }
    dh__co_drain(c, now);
    CO_INC(c, heartbeats); /* after: a test waiting on it sees the drain */
}

/* ---- heartbeat timeouts ---- */

/* The silence after which server s is declared dead. */
static uint64_t silence_limit_ms(const struct dh_coordinator *c,
                                 const struct co_server *s)
{
    return (uint64_t)(s->conn_fd >= 0 ? c->local_silence_ms : c->hb_timeout_ms);
}

static void declare_dead(struct dh_coordinator *c, int slot, uint64_t now,
                         const char *why)
{
    struct co_server *s = &c->servers[slot];
    int dead = why || now - s->last_seen_ms >= silence_limit_ms(c, s);

    if (!dead)
        dh__log(DH_LOG_INFO, "coordinator: server %u (%s) left", s->wire_id,
                s->addr); /* it said so: not a failure */
    else if (why)
        dh__log(DH_LOG_WARN,
                "coordinator: server %u (%s) %s: "
                "declared dead, re-routing its tasks",
                s->wire_id, s->addr, why);
    else
        dh__log(DH_LOG_WARN,
                "coordinator: server %u (%s) silent for "
                "%llu ms: declared dead, re-routing its tasks",
                s->wire_id, s->addr,
                (unsigned long long)(now - s->last_seen_ms));
    dh__co_pool_leave(c, slot);
    if (dh_place_remove_server(c->place, slot, NULL) < 0)
        dh__log(DH_LOG_ERROR,
                "coordinator: server %u was not in "
                "placement",
                s->wire_id); /* cannot happen */
    if (s->role == DH_WIRE_ROLE_LOCAL && s->rank < DH_WIRE_MAX_RANKS &&
        c->rank_local[s->rank] == slot)
        c->rank_local[s->rank] = dead ? -1 : CO_RANK_LEFT;
    s->used = 0;
    dh__co_mx_server_down(c, slot, dead);
    atomic_fetch_sub(&c->st_servers, 1);
    if (dead)
        CO_INC(c, dead_servers); /* one that left is not counted */
    dh__co_orphan_tasks(c, slot);
    /* A local server that died (not one that left: its client is gone)
     * was the delivery target of its rank's tasks on remote servers. */
    if (s->role == DH_WIRE_ROLE_LOCAL && dead)
        dh__co_target_lost(c, s->rank, now);
}

/* Local servers whose connection closed: their process ended (a kill -9
 * included), whatever their last heartbeat said. */
static int check_closed(struct dh_coordinator *c, uint64_t now)
{
    struct dh_zap_conn gone[32];
    int n, any = 0;

    if (!c->keyed || !c->auth.zap)
        return 0;
    while ((n = dh__zap_closed(c->auth.zap, gone, 32)) > 0)
        for (int k = 0; k < n; k++)
            for (int i = 0; i < c->max_servers; i++) {
                struct co_server *s = &c->servers[i];

                /* the same connection (fd, inode, name), and closed now:
                 * not one that took its fd since, nor one still open */
                if (!s->used || s->conn_fd != gone[k].fd ||
                    s->conn_ino != gone[k].ino ||
                    strcmp(s->conn, gone[k].name) ||
                    dh__zap_conn_ino(s->conn_fd) == s->conn_ino)
                    continue;
                declare_dead(c, i, now,
                             "closed its connection (its process ended)");
                any = 1;
            }
    return any;
}

static void check_heartbeats(struct dh_coordinator *c, uint64_t now)
{
    int any = check_closed(c, now);

    for (int i = 0; i < c->max_servers; i++)
        if (c->servers[i].used && now - c->servers[i].last_seen_ms >=
                                      silence_limit_ms(c, &c->servers[i])) {
            declare_dead(c, i, now, NULL);
            any = 1;
        }
    if (any)
        dh__co_drain(c, now);
}

/* ---- receiving ---- */

static void dispatch(struct dh_coordinator *c, const struct co_peer *from,
                     uint64_t now)
{
    struct dh_wire_msg *m = &c->in;

    switch (m->type) {
    case DH_WIRE_REGISTER_SERVER:
        on_register_server(c, from, m, now);
        break;
    case DH_WIRE_REGISTER_CLIENT:
        on_register_client(c, from, m, now);
        break;
    case DH_WIRE_HEARTBEAT:
        on_heartbeat(c, from, m, now);
        break;
    case DH_WIRE_DESCRIPTOR_REQUEST:
        dh__co_on_request(c, from, m, now);
        break;
    case DH_WIRE_RESULT_NOTICE:
    case DH_WIRE_ERROR_NOTICE:
        dh__co_on_done(c, from, m, now);
        break;
    case DH_WIRE_SHUTDOWN:
        /* Only the job's owner stops the job (issue 13 item 2): the
         * process that has the stop flag (a signal), or a peer that holds
         * an admin key (docs/security.md). */
        if (!c->cur_admin) {
            dh__co_refused(c, from,
                           "only the job's owner may stop the coordinator "
                           "(it stops on SIGINT / SIGTERM)");
            break;
        }
        dh__log(DH_LOG_INFO, "coordinator: shutdown requested: %s",
                m->u.shutdown.reason);
        c->shutdown = 1;
        break;
    default:
        dh__co_malformed(c, from,
                         "a peer may not send %s to the "
                         "coordinator",
                         dh_wire_type_name(m->type));
    }
}

/* One message from `peer` (rc: 1 decoded into c->in, < 0 dropped with
 * the reason in de), under the peer's rate cap. */
static void handle(struct dh_coordinator *c, const struct co_peer *peer, int rc,
                   const struct dh_err *de, uint64_t now)
{
    if (!dh__co_rate_ok(c, peer, now)) {
        CO_INC(c, rate_limited); /* not logged: a flood must not be */
        if (rc > 0)
            dh_wire_msg_fini(&c->in);
    } else if (rc < 0) {
        dh__co_malformed(c, peer, "%s", de->msg);
    } else {
        c->cur_type = dh_wire_type_name(c->in.type);
        dispatch(c, peer, now);
        dh_wire_msg_fini(&c->in);
    }
    c->cur_addr = NULL;
    c->cur_type = NULL;
}

/* 1: a message was handled (or a bad one dropped), 0: none waiting, <0:
 * socket error. */
static int recv_one(struct dh_coordinator *c, struct dh_err *e)
{
    struct dh_tp_from from;
    struct co_peer peer = {0};
    struct dh_err de;
    zmq_msg_t raw;
    int rc = dh__tp_recv_keep(c->sock, &from, &c->in, &raw, NULL, &de);

    if (rc == 0)
        return 0;
    if (!dh__tp_dropped(rc) && rc < 0)
        return dh_err_set(e, DH_EIO, "coordinator %s: %s", c->endpoint, de.msg);
    peer.len = from.id_len;
    memcpy(peer.id, from.id, peer.len);
    c->cur_addr = from.addr;
    c->cur_fd = from.fd;
    /* The ZAP handler's user id: only an admin key's holder is the owner. */
    c->cur_admin = !strcmp(from.user, DH_ZAP_USER_ADMIN);
    c->cur_raw = rc == 1 ? &raw : NULL;
    handle(c, &peer, rc, &de, dh__mono_ms());
    if (rc == 1)
        zmq_msg_close(&raw);
    c->cur_raw = NULL;
    return 1;
}

void dh__co_feed(struct dh_coordinator *c, const uint8_t *id, size_t id_len,
                 const uint8_t *buf, size_t len, int admin, uint64_t now)
{
    struct co_peer peer = {0};
    struct dh_err de = {0};
    int rc;

    peer.len = (uint8_t)(id_len < sizeof(peer.id) ? id_len : sizeof(peer.id));
    memcpy(peer.id, id, peer.len);
    rc = dh_wire_decode(buf, len, &c->in, &de);
    c->cur_addr = "fed";
    c->cur_fd = -1;
    c->cur_admin = admin;
    handle(c, &peer, rc == 0 ? 1 : rc, &de, now);
}

void dh__co_tick(struct dh_coordinator *c, uint64_t now)
{
    check_heartbeats(c, now);
    dh__co_expire(c, now);
    dh__co_pool_tick(c, now);
}

static void broadcast_shutdown(struct dh_coordinator *c)
{
    dh_wire_msg_fini(&c->out);
    dh_wire_msg_init(&c->out, DH_WIRE_SHUTDOWN);
    snprintf(c->out.u.shutdown.reason, sizeof(c->out.u.shutdown.reason),
             "coordinator exiting");
    c->quiet = 1; /* peers that already left are no news */
    for (int i = 0; i < c->max_servers; i++)
        if (c->servers[i].used)
            (void)dh__co_send(c, &c->servers[i].peer, &c->out);
    for (size_t i = 0; i < DH_WIRE_MAX_RANKS; i++)
        if (c->ranks[i] && c->ranks[i]->has_client)
            (void)dh__co_send(c, &c->ranks[i]->client, &c->out);
    c->quiet = 0;
}

/* 1 when no LOCAL server has been registered for exit_unused_ms, after
 * one was. */
static int unused_for_long(struct dh_coordinator *c, uint64_t now)
{
    int locals = 0;

    for (int i = 0; i < c->max_servers && !locals; i++)
        locals = c->servers[i].used && c->servers[i].role == DH_WIRE_ROLE_LOCAL;
    if (locals) {
        c->had_local = 1;
        c->unused_since_ms = 0;
        return 0;
    }
    if (!c->had_local)
        return 0;
    if (!c->unused_since_ms)
        c->unused_since_ms = now;
    return now - c->unused_since_ms >= (uint64_t)c->exit_unused_ms;
}

int dh_coordinator_run(struct dh_coordinator *c, const volatile int *stop,
                       struct dh_err *e)
{
    int timeout = c->hb_timeout_ms / 4 < POLL_MS ? c->hb_timeout_ms / 4
                                                 : POLL_MS;
    int rc = 0;

    c->shutdown = 0;
    if (timeout < 1)
        timeout = 1;
    while (rc == 0 && !c->shutdown && !(stop && *stop)) {
        zmq_pollitem_t it = {.socket = c->sock, .events = ZMQ_POLLIN};

        if (zmq_poll(&it, 1, timeout) < 0 && zmq_errno() != EINTR)
            rc = dh_err_set(e, DH_EIO, "coordinator %s: poll: %s", c->endpoint,
                            zmq_strerror(zmq_errno()));
        for (int i = 0; rc == 0 && i < BURST && !c->shutdown; i++) {
            int r = recv_one(c, e);

            if (r <= 0) {
                rc = r < 0 ? r : 0;
                break;
            }
        }
        dh__co_tick(c, dh__mono_ms());
        if (c->drain_again) /* ranks a drain could not reach go first */
            dh__co_drain(c, dh__mono_ms());
        dh__co_mx_tick(c, dh__mono_ms());
        if (c->tel_dirty) { /* the turn's lines in one write */
            dh__log_flush(c->telemetry, &c->tel_failed, "coordinator",
                          "telemetry");
            c->tel_dirty = 0;
        }
        if (c->exit_unused_ms > 0 && unused_for_long(c, dh__mono_ms())) {
            dh__log(DH_LOG_INFO,
                    "coordinator: no local dataserver "
                    "for %d ms: every rank is gone; exiting",
                    c->exit_unused_ms);
            break;
        }
    }
    broadcast_shutdown(c);
    if (c->telemetry)
        dh__log_flush(c->telemetry, &c->tel_failed, "coordinator", "telemetry");
    return rc;
}

/* ---- lifetime ---- */

static int check_opts(const struct dh_coordinator_opts *o,
                      enum dh_place_policy *pol, struct dh_err *e)
{
    if (o->heartbeat_timeout_ms < 1 || o->heartbeat_timeout_ms > 3600000)
        return dh_err_set(e, DH_EINVAL,
                          "heartbeat timeout %d ms is not in "
                          "1..3600000",
                          o->heartbeat_timeout_ms);
    if (o->max_servers < 1 || o->max_servers > 65536 || o->max_clients < 1 ||
        o->max_clients > 65536 || o->max_inflight < 1 ||
        o->max_inflight > DH_INFLIGHT_MAX_CAPACITY || o->max_pending < 1 ||
        o->max_pending > DH_INFLIGHT_MAX_CAPACITY || o->queue_per_worker < 0 ||
        o->queue_per_worker > 1000000 || o->claim_timeout_ms < 0 ||
        o->pending_timeout_ms < 0 || o->max_remote_servers < 0 ||
        o->max_remote_servers > o->max_servers || o->metrics_interval_ms < 0 ||
        o->metrics_interval_ms > 60000 || o->overdue_ms < 0 ||
        o->local_silence_ms < 0 || o->local_silence_ms > 36000000 ||
        o->overdue_ms > 3600000)
        return dh_err_set(e, DH_EINVAL,
                          "coordinator size limits out of "
                          "range");
    return dh_place_policy_parse(o->policy ? o->policy : "least-request", pol,
                                 e);
}

static int bind_socket(struct dh_coordinator *c,
                       const struct dh_coordinator_opts *co, struct dh_err *e)
{
    const char *addr = co->listen ? co->listen : DH_COORDINATOR_DEFAULT_LISTEN;
    struct dh_tp_opts o = {
        .kind = DH_TP_COORD, .addr = addr, .who = "coordinator"};
    int rc;

    if ((rc = dh__tp_auth_init(&c->auth, co->keyfile, "coordinator", e)) < 0)
        return rc;
    c->keyed = rc;
    o.auth = c->keyed ? &c->auth : NULL;
    o.insecure = co->insecure;
    if (!(c->ctx = zmq_ctx_new()))
        return dh_err_set(e, DH_ENOMEM, "coordinator: zmq: %s",
                          zmq_strerror(zmq_errno()));
    if ((rc = dh__tp_open(c->ctx, &o, &c->sock, c->endpoint,
                          sizeof(c->endpoint), e)) < 0)
        return rc;
    c->bound = 1;
    return 0;
}

static int alloc_tables(struct dh_coordinator *c,
                        const struct dh_coordinator_opts *o,
                        enum dh_place_policy pol, struct dh_err *e)
{
    struct dh_place_opts po;
    int rc;

    dh_place_opts_default(&po);
    po.policy = pol;
    if ((rc = dh_place_create(o->max_servers, &po, &c->place, e)) < 0 ||
        (rc = dh_inflight_create(o->max_inflight, &c->inflight, e)) < 0)
        return rc;
    c->servers = dh__calloc((size_t)o->max_servers, sizeof(*c->servers));
    c->pools = dh__calloc((size_t)o->max_servers, sizeof(*c->pools));
    c->rank_local = dh__malloc(DH_WIRE_MAX_RANKS * sizeof(*c->rank_local));
    if (!c->servers || !c->pools || !c->rank_local)
        return dh_err_set(e, DH_ENOMEM, "coordinator: out of memory");
    if ((rc = dh__co_guard_init(c, e)) < 0)
        return rc;
    for (size_t i = 0; i < DH_WIRE_MAX_RANKS; i++)
        c->rank_local[i] = -1;
    return dh__co_tasks_init(c, o->max_inflight, o->max_pending, e);
}

/* A number no earlier Coordinator on this address is likely to have had:
 * from the kernel's random source, else from the clock and the pid. */
static uint64_t draw_incarnation(void)
{
    uint64_t v = 0;
    struct timespec ts;

    if (getrandom(&v, sizeof(v), GRND_NONBLOCK) != (ssize_t)sizeof(v)) {
        clock_gettime(CLOCK_REALTIME, &ts);
        v = ((uint64_t)ts.tv_sec << 32) ^ (uint64_t)ts.tv_nsec ^
            ((uint64_t)getpid() << 16);
    }
    return v ? v : 1;
}

int dh_coordinator_create(const struct dh_coordinator_opts *o,
                          struct dh_coordinator **out, struct dh_err *e)
{
    struct dh_coordinator_opts def;
    struct dh_coordinator *c;
    enum dh_place_policy pol;
    int rc;

    if (!o) {
        dh_coordinator_opts_default(&def);
        o = &def;
    }
    if (!out)
        return dh_err_set(e, DH_EINVAL, "coordinator: out is NULL");
    if ((rc = check_opts(o, &pol, e)) < 0)
        return rc;
    if (!(c = dh__calloc(1, sizeof(*c))))
        return dh_err_set(e, DH_ENOMEM, "coordinator: out of memory");
    c->telemetry = o->telemetry;
    c->hb_timeout_ms = o->heartbeat_timeout_ms;
    c->local_silence_ms = o->local_silence_ms > 0 ? o->local_silence_ms
                          : o->heartbeat_timeout_ms > 3000
                              ? 10 * o->heartbeat_timeout_ms
                              : 30000;
    c->overdue_ms = o->overdue_ms > 0 ? o->overdue_ms : 5000;
    c->queue_per_worker = o->queue_per_worker;
    c->cpu_pools = o->cpu_pools && pol == DH_PLACE_POLICY_DEADLINE;
    c->edf = c->cpu_pools; /* the pools' queue: --cpu-pools off is as before */
    c->exit_unused_ms = o->exit_when_unused_ms;
    c->max_servers = o->max_servers;
    c->max_clients = o->max_clients;
    c->incarnation = draw_incarnation();
    /* Remote servers never take the slots local ones need; local servers
     * of ranks without a client (external mode, before it attaches) never
     * take those of claimed ranks. */
    c->max_remote = o->max_remote_servers ? o->max_remote_servers
                                          : (o->max_servers + 1) / 2;
    c->max_orphan_local = (o->max_servers + 3) / 4;
    c->claim_timeout_ms = o->claim_timeout_ms ? o->claim_timeout_ms
                                              : DEF_CLAIM_MS;
    c->pending_timeout_ms = o->pending_timeout_ms ? o->pending_timeout_ms
                                                  : DEF_PENDING_MS;
    c->peer_rate = o->peer_msgs_per_s ? o->peer_msgs_per_s : DEF_PEER_RATE;
    c->rank_max_tasks = o->max_tasks_per_rank ? o->max_tasks_per_rank
                                              : DEF_RANK_TASKS;
    c->rank_max_ids = o->max_ids_per_rank ? o->max_ids_per_rank : DEF_RANK_IDS;
    dh_wire_msg_init(&c->in, DH_WIRE_NONE);
    dh_wire_msg_init(&c->out, DH_WIRE_NONE);
    if ((rc = alloc_tables(c, o, pol, e)) < 0 ||
        (rc = dh__co_mx_init(c, o->metrics_interval_ms, e)) < 0 ||
        (rc = bind_socket(c, o, e)) < 0) {
        dh_coordinator_destroy(c);
        return rc;
    }
    *out = c;
    return 0;
}

const char *dh_coordinator_endpoint(const struct dh_coordinator *c)
{
    return c->endpoint;
}

void dh_coordinator_stats(const struct dh_coordinator *c,
                          struct dh_coordinator_stats *out)
{
    struct dh_coordinator *m = (struct dh_coordinator *)c;

#define CO_LOAD_(n)                                                            \
    out->n = atomic_load_explicit(&m->st_##n, memory_order_relaxed);
    CO_STATS(CO_LOAD_)
#undef CO_LOAD_
    out->refused_peers = dh__tp_auth_refused(&m->auth);
}

void dh_coordinator_destroy(struct dh_coordinator *c)
{
    if (!c)
        return;
    dh__tp_close(&c->sock, 0);
    dh__tp_auth_fini(&c->auth); /* its ZAP socket, before the context */
    if (c->ctx)
        zmq_ctx_term(c->ctx);
    /* ZeroMQ leaves the socket file of an ipc:// endpoint we bound. */
    if (c->bound && !strncmp(c->endpoint, "ipc://", 6) && c->endpoint[6] != '@')
        unlink(c->endpoint + 6);
    dh__co_tasks_fini(c);
    dh_wire_msg_fini(&c->in);
    dh_wire_msg_fini(&c->out);
    dh_inflight_destroy(c->inflight);
    dh_place_destroy(c->place);
    dh__free(c->servers);
    dh__free(c->pools);
    dh__co_guard_fini(c);
    dh__co_mx_fini(c);
    dh__free(c->rank_local);
    dh__free(c);
}
