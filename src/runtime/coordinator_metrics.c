/*
 * coordinator_metrics.c - the Coordinator's live telemetry figures and
 * their published snapshot (issue 18 item 3; docs/metrics.md).
 *
 * Design: the event loop calls small hooks (a decision, a heartbeat, a
 * request, a completion, a server joining or dying) that update plain
 * counters here, owned by the loop's thread, with no lock and no
 * allocation on those paths beyond a rank's first appearance.  At most
 * every publish_ms the loop copies them into `pub` under a mutex it only
 * try-locks: if a reader holds it (a copy of a few KiB), the loop skips
 * this publication and tries again on its next turn, so a reader never
 * delays the loop.  Readers (dh_coordinator_metrics_text(), from the
 * HTTP thread) copy `pub` under the mutex and format outside it.
 *
 * Servers are tracked by wire id, beyond their registration: a dead or
 * departed one stays listed (up 0) until its entry is needed for a new
 * server and it is the oldest gone.  Ranks are tracked from their first
 * request, at most MAX_RANKS of them.
 *
 * Locking: `mu` guards `pub` only; everything else is the loop's.
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "runtime/coordinator_internal.h"
#include "runtime/metrics_snap.h"

#define MAX_SERVERS 4096 /* entries listed, alive or gone */
#define MAX_RANKS 65536  /* DH_WIRE_MAX_RANKS */
#define RATE_MS 1000     /* bytes/s over windows of about this long */

struct co_mx_rate {
    uint64_t t_ms, out0, in0;
};

struct co_metrics {
    int publish_ms;
    uint64_t created_ms, last_pub_ms;
    struct dh_mx_snap live;   /* servers: n_servers entries, by arrival */
    struct co_mx_rate *rates; /* beside live.servers */
    int32_t *slot_entry;      /* placement slot -> live.servers index */
    int32_t *rank_entry;      /* rank -> live.ranks index, or -1 */
    uint64_t *gone_at;        /* beside live.servers: when it went (0) */
    pthread_mutex_t mu;
    struct dh_mx_snap pub;
};

/* Frees c->mx and what it holds, all but its mutex. */
static void mx_free(struct dh_coordinator *c)
{
    struct co_metrics *m = c->mx;

    dh__mx_snap_fini(&m->live);
    dh__mx_snap_fini(&m->pub);
    dh__free(m->rates);
    dh__free(m->gone_at);
    dh__free(m->slot_entry);
    dh__free(m->rank_entry);
    dh__free(m);
    c->mx = NULL;
}

int dh__co_mx_init(struct dh_coordinator *c, int publish_ms, struct dh_err *e)
{
    struct co_metrics *m;
    size_t ns = (size_t)(c->max_servers * 2 < MAX_SERVERS ? c->max_servers * 2
                                                          : MAX_SERVERS);

    if (publish_ms <= 0)
        return 0;
    if (!(m = dh__calloc(1, sizeof(*m))))
        return dh_err_set(e, DH_ENOMEM, "coordinator: out of memory");
    c->mx = m;
    m->publish_ms = publish_ms;
    m->created_ms = dh__mono_ms();
    m->live.servers = dh__calloc(ns, sizeof(*m->live.servers));
    m->live.cap_servers = ns;
    m->rates = dh__calloc(ns, sizeof(*m->rates));
    m->gone_at = dh__calloc(ns, sizeof(*m->gone_at));
    m->slot_entry = dh__malloc((size_t)c->max_servers * sizeof(int32_t));
    m->rank_entry = dh__malloc(MAX_RANKS * sizeof(int32_t));
    if (!m->live.servers || !m->rates || !m->gone_at || !m->slot_entry ||
        !m->rank_entry || pthread_mutex_init(&m->mu, NULL) != 0) {
        mx_free(c); /* the mutex is not set up: no destroy */
        return dh_err_set(e, DH_ENOMEM, "coordinator: out of memory");
    }
    for (int i = 0; i < c->max_servers; i++)
        m->slot_entry[i] = -1;
    for (int i = 0; i < MAX_RANKS; i++)
        m->rank_entry[i] = -1;
    return 0;
}

void dh__co_mx_fini(struct dh_coordinator *c)
{
    struct co_metrics *m = c->mx;

    if (!m)
        return;
    pthread_mutex_destroy(&m->mu);
    mx_free(c);
}

static struct dh_mx_server *entry_of(struct dh_coordinator *c, int32_t slot)
{
    struct co_metrics *m = c->mx;

    if (!m || slot < 0 || slot >= c->max_servers || m->slot_entry[slot] < 0)
        return NULL;
    return &m->live.servers[m->slot_entry[slot]];
}

/* An entry for a new server: a free one, else the one gone longest. */
static int32_t take_entry(struct co_metrics *m)
{
    int32_t best = -1;

    if (m->live.n_servers < m->live.cap_servers)
        return (int32_t)m->live.n_servers++;
    for (size_t i = 0; i < m->live.n_servers; i++)
        if (m->gone_at[i] &&
            (best < 0 || m->gone_at[i] < m->gone_at[(size_t)best]))
            best = (int32_t)i;
    return best;
}

void dh__co_mx_server_up(struct dh_coordinator *c, int32_t slot,
                         uint32_t workers)
{
    struct co_metrics *m = c->mx;
    const struct co_server *s = &c->servers[slot];
    struct dh_mx_server *v;
    int32_t k = -1;

    if (!m)
        return;
    /* The same server registering again (a restarted Coordinator's
     * refill, a re-registration) keeps its entry and counters. */
    for (size_t i = 0; i < m->live.n_servers && k < 0; i++)
        if (m->live.servers[i].id == s->wire_id)
            k = (int32_t)i;
    if (k < 0 && (k = take_entry(m)) < 0) {
        m->slot_entry[slot] = -1; /* every entry alive: not listed */
        return;
    }
    v = &m->live.servers[k];
    if (v->id != s->wire_id) {
        memset(v, 0, sizeof(*v));
        memset(&m->rates[k], 0, sizeof(m->rates[k]));
    }
    v->id = s->wire_id;
    v->alive = 1;
    v->dead = 0;
    v->remote = s->role == DH_WIRE_ROLE_REMOTE;
    v->rank = s->rank;
    v->workers = workers;
    snprintf(v->addr, sizeof(v->addr), "%.*s", DH_MX_ADDR_LEN, s->addr);
    m->gone_at[k] = 0;
    m->slot_entry[slot] = k;
}

void dh__co_mx_server_down(struct dh_coordinator *c, int32_t slot, int dead)
{
    struct dh_mx_server *v = entry_of(c, slot);

    if (!v)
        return;
    v->alive = 0;
    v->dead = dead;
    v->queue_depth = v->busy_workers = 0;
    c->mx->gone_at[c->mx->slot_entry[slot]] = dh__mono_ms() | 1;
    c->mx->slot_entry[slot] = -1;
}

void dh__co_mx_heartbeat(struct dh_coordinator *c, int32_t slot,
                         const struct dh_wire_heartbeat *h)
{
    struct dh_mx_server *v = entry_of(c, slot);

    if (!v)
        return;
    v->queue_depth = h->queue_depth;
    v->busy_workers = h->busy_workers;
    v->latency_ms = h->latency_ms;
    v->heartbeats++;
    v->read_bytes = h->read_bytes;
    v->reads = h->reads;
    v->read_s = h->read_ms / 1e3;
    v->fetched_bytes = h->fetched_bytes;
    v->cache_hits = h->cache_hits;
    v->cache_misses = h->cache_misses;
    dh__mx_observe(&c->mx->live.queue_depth, DH_MX_B_DEPTH,
                   (double)h->queue_depth);
}

void dh__co_mx_decision(struct dh_coordinator *c, int32_t slot, int reason,
                        double us)
{
    struct dh_mx_server *v = entry_of(c, slot);

    if (!c->mx)
        return;
    if (reason >= 0 && reason < DH_MX_REASONS)
        c->mx->live.decisions[reason]++;
    dh__mx_observe(&c->mx->live.decide_us, DH_MX_B_US, us);
    if (v)
        v->routed++;
}

static struct dh_mx_rank *rank_of(struct dh_coordinator *c, uint32_t rank)
{
    struct co_metrics *m = c->mx;
    struct dh_mx_rank *r;
    size_t k;

    if (!m || rank >= MAX_RANKS)
        return NULL;
    if (m->rank_entry[rank] >= 0)
        return &m->live.ranks[m->rank_entry[rank]];
    k = m->live.n_ranks;
    if (k == m->live.cap_ranks) {
        size_t cap = k ? k * 2 : 16;
        struct dh_mx_rank *nr = dh__realloc(m->live.ranks, cap * sizeof(*nr));

        if (!nr)
            return NULL; /* only the figures are lost */
        m->live.ranks = nr;
        m->live.cap_ranks = cap;
    }
    r = &m->live.ranks[k];
    memset(r, 0, sizeof(*r));
    r->rank = rank;
    m->rank_entry[rank] = (int32_t)k;
    m->live.n_ranks++;
    return r;
}

void dh__co_mx_request(struct dh_coordinator *c,
                       const struct dh_wire_request *q)
{
    struct dh_mx_rank *r = rank_of(c, q->requester_rank);

    if (!r)
        return;
    r->requests++;
    if (!q->has_report)
        return;
    /* A new step since the last report: its input wait is one more
     * observation (several steps between two requests count once). */
    if (!r->reported || q->report.steps > r->steps)
        dh__mx_observe(&r->input_wait, DH_MX_B_MS, q->report.input_wait_ms);
    r->reported = 1;
    r->steps = q->report.steps;
    r->misses = q->report.misses;
    r->window_ms = q->report.window_ms;
    r->input_wait_ms = q->report.input_wait_ms;
}

void dh__co_mx_done(struct dh_coordinator *c, const struct co_task *t,
                    const struct dh_wire_msg *m, uint64_t now)
{
    struct dh_mx_server *v = entry_of(c, t->server), *tv;
    struct dh_mx_rank *r = rank_of(c, t->req.requester_rank);
    int late = (int64_t)(now - t->arrived_ms) > t->req.slack_ms;
    int err = m->type == DH_WIRE_ERROR_NOTICE;

    if (!c->mx)
        return;
    if (t->state == CO_RUNNING)
        dh__mx_observe(&c->mx->live.task_ms, DH_MX_B_MS,
                       (double)(now - t->since_ms));
    c->mx->live.late += (uint64_t)late;
    c->mx->live.task_errors += (uint64_t)err;
    if (!err)
        c->mx->live.bytes_out += m->u.result.length;
    if (r) {
        r->completed++;
        r->late += (uint64_t)late;
    }
    if (!v)
        return;
    v->tasks++;
    v->errors += (uint64_t)err;
    if (err)
        return;
    v->bytes_out += m->u.result.length;
    /* Prepared elsewhere for this rank's arena: it crossed into the
     * rank's local server (DESIGN 8 "Remote payloads"). */
    if (r && t->req.requester_rank < DH_WIRE_MAX_RANKS &&
        c->rank_local[t->req.requester_rank] != t->server &&
        (tv = entry_of(c, c->rank_local[t->req.requester_rank])))
        tv->bytes_in += m->u.result.length;
}

/* Bytes/s of each live server over the window since its last update. */
static void rates(struct co_metrics *m, uint64_t now)
{
    for (size_t i = 0; i < m->live.n_servers; i++) {
        struct dh_mx_server *v = &m->live.servers[i];
        struct co_mx_rate *r = &m->rates[i];
        double dt = (double)(now - r->t_ms) / 1e3;

        if (!v->alive) {
            v->out_bps = v->in_bps = 0;
            continue;
        }
        if (!r->t_ms) {
            *r = (struct co_mx_rate){now, v->bytes_out, v->bytes_in};
            continue;
        }
        if (now - r->t_ms < RATE_MS)
            continue;
        v->out_bps = (double)(v->bytes_out - r->out0) / dt;
        v->in_bps = (double)(v->bytes_in - r->in0) / dt;
        *r = (struct co_mx_rate){now, v->bytes_out, v->bytes_in};
    }
}

void dh__co_mx_tick(struct dh_coordinator *c, uint64_t now)
{
    struct co_metrics *m = c->mx;

    if (!m || now - m->last_pub_ms < (uint64_t)m->publish_ms)
        return;
    rates(m, now);
    for (size_t i = 0; i < m->live.n_ranks; i++) {
        struct dh_mx_rank *r = &m->live.ranks[i];
        struct co_rank *cr = c->ranks[r->rank]; /* rank < MAX_RANKS */

        r->inflight = cr ? cr->tasks : 0;
    }
    m->live.uptime_ms = now > m->created_ms ? now - m->created_ms : 0;
    dh_coordinator_stats(c, &m->live.st);
    /* Never wait for a reader: skip this turn instead. */
    if (pthread_mutex_trylock(&m->mu) != 0)
        return;
    if (dh__mx_snap_copy(&m->pub, &m->live) == 0)
        m->last_pub_ms = now;
    pthread_mutex_unlock(&m->mu);
}

int dh_coordinator_metrics_text(struct dh_coordinator *c, char **out,
                                size_t *len)
{
    struct dh_mx_snap s;
    int rc;

    if (!c->mx)
        return DH_EINVAL;
    memset(&s, 0, sizeof(s));
    pthread_mutex_lock(&c->mx->mu);
    rc = dh__mx_snap_copy(&s, &c->mx->pub);
    pthread_mutex_unlock(&c->mx->mu);
    if (rc == 0)
        rc = dh__mx_format(&s, out, len);
    dh__mx_snap_fini(&s);
    return rc;
}
