/*
 * coordinator_route.c - what the Coordinator does with tasks: placement of
 * descriptor requests (place.h), the FIFO of requests waiting for capacity,
 * Routes to servers and acks to clients, first-result-wins completion
 * (inflight.h) and re-routing the tasks of a dead server (DESIGN.md 3, 8).
 *
 * Design: every task the Coordinator knows is one struct co_task in a map
 * keyed by task id (core/idmap.h; it holds pointers, since the FIFO points
 * at the same co_task), from arrival until its first completion.  The
 * in-flight table says where a running task runs; the co_task keeps what
 * re-routing needs (the request and the client's routing id).  Waiting
 * tasks sit in a ring, oldest first, re-routes in front of new requests.
 * A drain tries each waiting task once, but once one task of a rank meets
 * backpressure the rank's later ones wait without a try, and at most
 * DRAIN_BLOCKED_MAX ranks are tried in vain per drain: the ranks not
 * reached then go first next time, so no rank's queue holds back another's
 * (issue 13: 65 requests of one stuck rank starved every rank).
 * Authorization (docs/wire-protocol.md "Authorization"): a request comes
 * from its rank's registered client and names that rank; a completion
 * comes from the server the task runs on or from its delivery target.
 * A request whose rank's local server takes no payloads (registered as
 * "local:...") or that says local_only is decided among that local server
 * alone: a remote server could not deliver its batch.
 *
 * Locking: none (see coordinator_internal.h).
 */
#include <math.h>
#include <string.h>
#include <time.h>

#include "core/log.h"
#include "core/alloc.h"
#include "runtime/coordinator_internal.h"
#include "runtime/keys.h"

/* ---- the task map ---- */

static struct co_task *task_find(const struct dh_coordinator *c, uint64_t id)
{
    struct co_task **p = dh__idmap_get(&c->tasks, id);

    return p ? *p : NULL;
}

static void task_remove(struct dh_coordinator *c, uint64_t id)
{
    (void)dh__idmap_del(&c->tasks, id);
}

/* Frees what the decoder allocated for the request (as dh_wire_msg_fini()
 * would: both arrays come from the library's allocation seam). */
static void task_free(struct dh_coordinator *c, struct co_task *t)
{
    struct co_rank *k = c->ranks[t->req.requester_rank];

    if (t->counted_rank && k) { /* the rank's caps get it back */
        k->tasks--;
        k->ids -= t->req.n_samples;
    }
    dh__free(t->req.sample_ids);
    dh__free(t->req.spare_ids);
    dh__free(t->req.plan.indices);
    dh__free(t);
}

int dh__co_tasks_init(struct dh_coordinator *c, size_t max_inflight,
                      size_t max_pending, struct dh_err *e)
{
    /* Reserved at its limit, so a put never allocates; and never meets a
     * full map: the tasks in it are in the in-flight table (running or
     * waiting for a re-route, <= max_inflight) or new ones in the FIFO
     * (admit() keeps them < max_pending). */
    size_t limit = max_inflight + max_pending;

    if (dh__idmap_init(&c->tasks, sizeof(struct co_task *), limit, limit) < 0)
        return dh_err_set(e, DH_ENOMEM, "coordinator: out of memory");
    c->fifo_cap = max_inflight + max_pending;
    c->max_pending = max_pending;
    c->dead_cap = 1024;
    c->fifo = dh__calloc(c->fifo_cap, sizeof(*c->fifo));
    c->drain_buf = dh__calloc(c->fifo_cap, sizeof(*c->drain_buf));
    c->drain_blocked = dh__calloc(DH_WIRE_MAX_RANKS / 8, 1);
    c->dead_buf = dh__calloc(c->dead_cap, sizeof(*c->dead_buf));
    if (!c->fifo || !c->dead_buf || !c->drain_buf || !c->drain_blocked)
        return dh_err_set(e, DH_ENOMEM, "coordinator: out of memory");
    return 0;
}

void dh__co_tasks_fini(struct dh_coordinator *c)
{
    struct co_task **p;
    size_t pos = 0;

    /* Cancelled tasks live only in the FIFO, all others in the map. */
    for (size_t k = 0; c->fifo && k < c->fifo_len; k++) {
        struct co_task *t = c->fifo[(c->fifo_head + k) % c->fifo_cap];

        if (t->cancelled)
            task_free(c, t);
    }
    while ((p = dh__idmap_next(&c->tasks, &pos, NULL)))
        task_free(c, *p);
    dh__idmap_fini(&c->tasks);
    dh__free(c->fifo);
    dh__free(c->drain_buf);
    dh__free(c->drain_blocked);
    dh__free(c->dead_buf);
}

/* ---- the FIFO ---- */

static int fifo_push(struct dh_coordinator *c, struct co_task *t, int front)
{
    if (c->fifo_len == c->fifo_cap)
        return -1;
    if (front) {
        c->fifo_head = (c->fifo_head + c->fifo_cap - 1) % c->fifo_cap;
        c->fifo[c->fifo_head] = t;
    } else {
        c->fifo[(c->fifo_head + c->fifo_len) % c->fifo_cap] = t;
    }
    c->fifo_len++;
    if (t->state == CO_PENDING_NEW) {
        c->pending_new++;
        t->counted_new = 1;
    }
    CO_SET(c, pending, c->fifo_len);
    return 0;
}

/* When the task must be done by, on this clock (DESIGN 3 "Clocks"). */
static int64_t due_ms(const struct co_task *t)
{
    return (int64_t)t->arrived_ms + t->req.slack_ms;
}

/* Which of two tasks is due first: the earlier step of the epoch, then the
 * earlier deadline.  In a synchronous job every rank's step s is due at
 * the same moment, which each rank's own estimate (its slack, from the
 * EWMA of its periods) says only roughly: in a CPU-bound run the ranks'
 * slacks for one step differed by up to 3 s, the rank that had just
 * waited estimating the longest, so by deadline alone its next steps
 * went behind later steps of the others and it waited again
 * (docs/placement.md "CPU pools"). */
static int due_before(const struct co_task *a, const struct co_task *b)
{
    if (a->req.task.epoch != b->req.task.epoch)
        return a->req.task.epoch < b->req.task.epoch;
    if (a->req.task.step != b->req.task.step)
        return a->req.task.step < b->req.task.step;
    return due_ms(a) < due_ms(b);
}

/* A new task into the FIFO by due order (the deadline policy): behind
 * every waiting task due no later, so across ranks the earliest-due task
 * is tried first and each rank's own order is kept.  Re-routes in front
 * are not passed.  O(tasks passed); a new request is usually due last,
 * so O(1). */
static int fifo_insert_due(struct dh_coordinator *c, struct co_task *t)
{
    size_t i;

    if (fifo_push(c, t, 0) < 0)
        return -1;
    for (i = c->fifo_len - 1; i > 0; i--) {
        size_t at = (c->fifo_head + i) % c->fifo_cap,
               prev = (c->fifo_head + i - 1) % c->fifo_cap;
        struct co_task *p = c->fifo[prev];

        if (p->state != CO_PENDING_NEW || (!p->cancelled && !due_before(t, p)))
            break;
        c->fifo[at] = p;
        c->fifo[prev] = t;
    }
    return 0;
}

static void fifo_pop(struct dh_coordinator *c)
{
    struct co_task *t = c->fifo[c->fifo_head];

    /* By the task's flag, not its state: place_task() has already moved
     * a task it placed to CO_RUNNING when it is popped. */
    if (t->counted_new) {
        c->pending_new--;
        t->counted_new = 0;
    }
    c->fifo_head = (c->fifo_head + 1) % c->fifo_cap;
    c->fifo_len--;
    CO_SET(c, pending, c->fifo_len);
}

/* ---- messages to peers ---- */

/* `token`: 1 for the Route to the delivery target, which alone learns the
 * token the placed server's payload must carry. */
static void send_route(struct dh_coordinator *c, struct co_task *t,
                       const struct co_peer *to, int with_request, int token)
{
    const struct co_server *s = &c->servers[t->server];
    int32_t tgt = t->req.requester_rank < DH_WIRE_MAX_RANKS
                      ? c->rank_local[t->req.requester_rank]
                      : -1;
    struct dh_wire_route *r;

    if (tgt < 0)
        tgt = t->server; /* no local server: the chosen one delivers */
    dh_wire_msg_fini(&c->out);
    dh_wire_msg_init(&c->out, DH_WIRE_ROUTE);
    r = &c->out.u.route;
    r->task = t->req.task;
    r->server_id = s->wire_id;
    r->target_server_id = c->servers[tgt].wire_id;
    memcpy(r->target_addr, c->servers[tgt].addr, sizeof(r->target_addr));
    if (with_request) {
        r->has_request = 1;
        r->request = t->req; /* borrowed: cleared before any fini */
    }
    if (token)
        dh__payload_token(s->sender_secret, r->target_server_id,
                          r->sender_token);
    (void)dh__co_send(c, to, &c->out);
    dh_wire_msg_init(&c->out, DH_WIRE_NONE); /* drops the borrow */
}

static void send_error(struct dh_coordinator *c, struct co_task *t, int cause,
                       const char *why)
{
    struct dh_wire_error *er;

    dh_wire_msg_fini(&c->out);
    dh_wire_msg_init(&c->out, DH_WIRE_ERROR_NOTICE);
    er = &c->out.u.error;
    er->task = t->req.task;
    er->server_id = DH_COORDINATOR_SERVER_ID;
    er->sample_id = t->req.n_samples ? t->req.sample_ids[0] : 0;
    er->cause = cause < 0 ? cause : DH_EIO;
    snprintf(er->message, sizeof(er->message), "coordinator: %s", why);
    (void)dh__co_send(c, &t->client, &c->out);
}

void dh__co_send_release(struct dh_coordinator *c, const struct co_peer *to,
                         const struct dh_wire_result *res)
{
    dh_wire_msg_fini(&c->out);
    dh_wire_msg_init(&c->out, DH_WIRE_RELEASE);
    c->out.u.release.task = res->task;
    c->out.u.release.slot_offset = res->arena_offset;
    c->out.u.release.generation = res->slot_generation;
    (void)dh__co_send(c, to, &c->out);
}

/* ---- placement ---- */

static double now_us(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int32_t wire_id_of(const struct dh_coordinator *c, int32_t slot)
{
    return slot >= 0 && slot < c->max_servers && c->servers[slot].used
               ? (int32_t)c->servers[slot].wire_id
               : -1;
}

/* One line per decision (DESIGN 4.4), servers named by their wire ids; a
 * task waiting under backpressure is recorded once, not at every retry.
 * Buffered: the loop flushes once per turn (dh_coordinator_run()), one
 * write for a burst of decisions instead of one per decision (issue 21:
 * the flush was most of the telemetry's cost on the loop). */
static void telemetry(struct dh_coordinator *c, struct co_task *t,
                      const struct dh_place_decision *d, double us)
{
    struct dh_place_decision w = *d;
    char line[2048];
    size_t n;

    if (!c->telemetry || (d->server < 0 && t->bp_logged))
        return;
    t->bp_logged |= d->server < 0;
    w.server = wire_id_of(c, d->server);
    for (int32_t i = 0; i < w.ntop && i < DH_PLACE_TOP; i++)
        w.top[i].server = wire_id_of(c, d->top[i].server);
    n = dh_place_decision_format(&w, (int64_t)t->req.task.id, us, line,
                                 sizeof(line));
    if (n < sizeof(line)) {
        line[n] = '\n';
        fwrite(line, 1, n + 1, c->telemetry);
        c->tel_dirty = 1;
    }
}

static void fill_req(const struct dh_coordinator *c, const struct co_task *t,
                     uint64_t now, struct dh_place_req *q)
{
    uint32_t rank = t->req.requester_rank;

    q->rank = (int32_t)rank;
    q->local_server = rank < DH_WIRE_MAX_RANKS ? c->rank_local[rank] : -1;
    q->cpu_ms = t->req.hints.est_cpu_ms;
    q->io_ms = 0;
    q->in_bytes = (double)t->req.hints.est_in_bytes;
    q->out_bytes = (double)t->req.hints.est_out_bytes;
    /* Slack is relative to the request's arrival (DESIGN 3 "Clocks"); the
     * time it waited here is already spent. */
    q->deadline_ms = (double)t->req.slack_ms - (double)(now - t->arrived_ms);
}

/* A remote server delivers to the requester's local server at the
 * address it registered; "local:..." means it takes no payloads (it does
 * not listen), so a remote could not deliver.  Such a request, or one
 * marked local_only, may run on the requester's local server only. */
static int local_only(const struct dh_coordinator *c, const struct co_task *t,
                      const struct dh_place_req *q)
{
    /* No local server (yet, or no more: it is being restarted, or a
     * restarted Coordinator has not heard from it): nobody could take a
     * remote's payload, so the request waits for it. */
    return t->req.hints.local_only || q->local_server < 0 ||
           !strncmp(c->servers[q->local_server].addr, "local:", 6);
}

/* The decision among the local server alone: it, or backpressure when it
 * is at its queue cap or the rank has none (yet). */
static int decide_local(struct dh_coordinator *c, const struct dh_place_req *q,
                        struct dh_place_decision *d)
{
    struct dh_cost_terms ct;
    int rc;

    memset(d, 0, sizeof(*d));
    d->server = -1;
    d->reason = DH_PLACE_REASON_BACKPRESSURE;
    d->work_ms = q->cpu_ms + q->io_ms;
    if (q->local_server < 0)
        return 0;
    if ((rc = dh_cost_predict(c->place, q->local_server, q, &ct)) < 0)
        return rc;
    d->scored = 1;
    d->work_ms = q->cpu_ms + ct.io_ms;
    if (ct.at_cap)
        return 0;
    d->server = q->local_server;
    d->reason = ct.miss_ms > 0 ? DH_PLACE_REASON_EARLIEST_FINISH
                               : DH_PLACE_REASON_LOCAL_MEETS;
    d->t_pred_ms = ct.t_ms;
    d->miss_ms = ct.miss_ms;
    d->ntop = 1;
    d->top[0] = (struct dh_place_cand){d->server, ct.t_ms, ct.miss_ms};
    return 0;
}

/* 1: placed and sent, 0: backpressure (try later), <0: cannot place
 * (DH_EPEERDEAD: the requester's local server left). */
static int place_task(struct dh_coordinator *c, struct co_task *t, uint64_t now)
{
    struct dh_place_req q;
    struct dh_place_decision d;
    double t0 = now_us();
    int rc;

    fill_req(c, t, now, &q);
    if (q.local_server == CO_RANK_LEFT)
        return DH_EPEERDEAD; /* nobody will take its batch */
    rc = local_only(c, t, &q) ? decide_local(c, &q, &d)
                              : dh_place_decide(c->place, &q, &d);
    if (rc < 0)
        return rc;
    telemetry(c, t, &d, now_us() - t0);
    dh__co_mx_decision(c, d.server, (int)d.reason, now_us() - t0);
    /* A demoted remote gets nothing new: the rank's local server does. */
    if (d.server >= 0 && dh__co_demoted(c, d.server) && q.local_server >= 0 &&
        (rc = decide_local(c, &q, &d)) < 0)
        return rc;
    if (d.server < 0)
        return 0;
    rc = t->state == CO_PENDING_NEW
             ? dh_inflight_add(c->inflight, t->req.task.id, (uint32_t)d.server,
                               now, NULL)
             : dh_inflight_reroute(c->inflight, t->req.task.id,
                                   (uint32_t)d.server, now);
    if (rc == DH_ETOOBIG)
        return 0; /* in-flight table full: wait for a completion */
    if (rc < 0 || (rc = dh_place_assign(c->place, d.server, d.work_ms)) < 0)
        return rc;
    if (t->state == CO_PENDING_REROUTE)
        CO_INC(c, rerouted);
    dh__log(t->state == CO_PENDING_REROUTE ? DH_LOG_INFO : DH_LOG_DEBUG,
            "coordinator: task %llu of rank %u %s server %u (%s)",
            (unsigned long long)t->req.task.id, t->req.requester_rank,
            t->state == CO_PENDING_REROUTE ? "re-routed to" : "routed to",
            c->servers[d.server].wire_id, dh_place_reason_name(d.reason));
    t->state = CO_RUNNING;
    t->pool_released = 0;
    t->server = d.server;
    t->server_gen = c->servers[d.server].gen;
    t->work_ms = d.work_ms;
    t->since_ms = now;
    CO_INC(c, routed);
    CO_SET(c, inflight, dh_inflight_count(c->inflight));
    /* The delivery target hears first who will send the payload: it
     * takes one for the task from that server only (docs/security.md "Who
     * may send a payload"). */
    if (q.local_server >= 0 && q.local_server != d.server &&
        c->servers[q.local_server].used)
        send_route(c, t, &c->servers[q.local_server].peer, 0, 1);
    send_route(c, t, &c->servers[d.server].peer, 1, 0);
    send_route(c, t, &t->client, 0, 0);
    return 1;
}

static void fail_task(struct dh_coordinator *c, struct co_task *t, int rc,
                      const char *why)
{
    int first = 0;

    send_error(c, t, rc, why);
    if (t->state == CO_PENDING_REROUTE &&
        dh_inflight_done(c->inflight, t->req.task.id, 0, &first) < 0)
        first = 0;
    task_remove(c, t->req.task.id);
    task_free(c, t);
}

/* Ranks tried in vain per drain, at most: a long queue of blocked tasks
 * is not rescanned with placement on every event, and the ranks not
 * reached go first next time (see the file comment). */
#define DRAIN_BLOCKED_MAX 64

static int rank_blocked(const struct dh_coordinator *c, uint32_t r)
{
    return c->drain_blocked[r >> 3] >> (r & 7) & 1;
}

static void set_blocked(struct dh_coordinator *c, uint32_t r, int on)
{
    if (on)
        c->drain_blocked[r >> 3] |= (uint8_t)(1u << (r & 7));
    else
        c->drain_blocked[r >> 3] &= (uint8_t) ~(1u << (r & 7));
}

void dh__co_drain(struct dh_coordinator *c, uint64_t now)
{
    size_t n = c->fifo_len, blocked = 0, nb = 0;

    c->drain_again = 0;
    /* One turn of the ring: a task placed leaves it; one not tried (the
     * budget of ranks spent) goes back at once; one of a blocked rank is
     * set aside and goes back after them all, so each rank keeps its own
     * order and the untried ranks come first next time. */
    for (size_t i = 0; i < n && c->fifo_len > 0; i++) {
        struct co_task *t = c->fifo[c->fifo_head];
        uint32_t r = t->req.requester_rank;
        int rc = 0;

        fifo_pop(c);
        if (t->cancelled) {
            task_free(c, t);
            continue;
        }
        if (rank_blocked(c, r)) {
            c->drain_buf[nb++] = t;
            continue;
        }
        if (blocked >= DRAIN_BLOCKED_MAX) {
            c->drain_again = 1;         /* the loop drains again, from here */
            if (fifo_push(c, t, 0) < 0) /* cannot happen: it just left */
                fail_task(c, t, DH_ETOOBIG, "request queue full");
            continue;
        }
        rc = place_task(c, t, now);
        if (rc == 0) {
            blocked++;
            set_blocked(c, r, 1);
            c->drain_buf[nb++] = t;
        } else if (rc < 0) {
            fail_task(c, t, rc,
                      rc == DH_EPEERDEAD
                          ? "the requester's local DataServer left (its "
                            "client went away, or it was told to stop)"
                          : "request cannot be placed (bad cost hints)");
        }
    }
    for (size_t i = 0; i < nb; i++) {
        struct co_task *t = c->drain_buf[i];

        set_blocked(c, t->req.requester_rank, 0);
        if (fifo_push(c, t, 0) < 0) /* cannot happen: it just left */
            fail_task(c, t, DH_ETOOBIG, "request queue full");
    }
}

/* ---- expiry ---- */

void dh__co_expire(struct dh_coordinator *c, uint64_t now)
{
    char why[96];
    int any = 0;

    if (now < c->next_expire_ms)
        return;
    c->next_expire_ms = now + 1000;
    dh__co_overdue(c, now);
    for (size_t k = 0; k < c->fifo_len; k++) {
        struct co_task *t = c->fifo[(c->fifo_head + k) % c->fifo_cap];
        int first = 0;

        if (t->cancelled ||
            now - t->arrived_ms < (uint64_t)c->pending_timeout_ms)
            continue;
        snprintf(why, sizeof(why), "request waited %llu ms for a server",
                 (unsigned long long)(now - t->arrived_ms));
        send_error(c, t, DH_ETIMEOUT, why);
        if (t->state == CO_PENDING_REROUTE &&
            dh_inflight_done(c->inflight, t->req.task.id, 0, &first) < 0)
            first = 0;
        task_remove(c, t->req.task.id);
        t->cancelled = 1; /* the FIFO frees it */
        CO_INC(c, expired);
        any = 1;
    }
    CO_SET(c, inflight, dh_inflight_count(c->inflight));
    if (any)
        dh__co_drain(c, now); /* frees them, and room may have freed */
}

/* ---- requests ---- */

/* Puts a new task in the map and the FIFO, or in neither (queue full).
 * The map cannot be full (see dh__co_tasks_init). */
static int admit(struct dh_coordinator *c, struct co_task *t)
{
    void *v;

    if (c->pending_new >= c->max_pending ||
        dh__idmap_put(&c->tasks, t->req.task.id, &v) < 0)
        return DH_ETOOBIG;
    *(struct co_task **)v = t;
    if ((c->edf ? fifo_insert_due(c, t) : fifo_push(c, t, 0)) < 0) {
        task_remove(c, t->req.task.id);
        return DH_ETOOBIG;
    }
    return 0;
}

void dh__co_on_request(struct dh_coordinator *c, const struct co_peer *from,
                       struct dh_wire_msg *m, uint64_t now)
{
    const struct dh_wire_request *q = &m->u.request;
    struct co_rank *k = dh__co_client_of(c, q->requester_rank, from);
    struct co_task *t;

    /* A task id belongs to the rank in it, and only that rank's client
     * may ask for it (the rank bits: wire.h "task ids"). */
    if (!k || q->task.rank != q->requester_rank) {
        dh__co_refused(c, from,
                       "task %#llx for rank %u: the sender is not rank "
                       "%u's registered client",
                       (unsigned long long)q->task.id, q->requester_rank,
                       q->task.rank);
        return;
    }
    k->seen_ms = now;
    dh__co_mx_request(c, q);
    t = task_find(c, q->task.id);
    if (t) { /* a re-issue: refresh where the answer goes */
        t->client = *from;
        if (t->state == CO_RUNNING)
            send_route(c, t, from, 0, 0);
        return;
    }
    if (!(t = dh__calloc(1, sizeof(*t)))) {
        dh__log(DH_LOG_ERROR, "coordinator: out of memory");
        return;
    }
    t->req = m->u.request; /* take the arrays */
    m->u.request.sample_ids = NULL;
    m->u.request.spare_ids = NULL;
    m->u.request.plan.indices = NULL;
    t->client = *from;
    t->state = CO_PENDING_NEW;
    t->server = -1;
    t->arrived_ms = now;
    if (k->tasks >= c->rank_max_tasks ||
        k->ids + t->req.n_samples > c->rank_max_ids) {
        char why[128];

        CO_INC(c, capped);
        snprintf(why, sizeof(why),
                 "rank %u holds %u tasks of %llu sample ids (caps %u, %llu)",
                 t->req.requester_rank, k->tasks, (unsigned long long)k->ids,
                 c->rank_max_tasks, (unsigned long long)c->rank_max_ids);
        dh__co_logf(c, "coordinator: request refused: %s", why);
        send_error(c, t, DH_ETOOBIG, why);
        task_free(c, t);
        return;
    }
    if (admit(c, t) < 0) {
        CO_INC(c, queue_full);
        send_error(c, t, DH_ETOOBIG, "request queue full");
        task_free(c, t);
        return;
    }
    k->tasks++;
    k->ids += t->req.n_samples;
    t->counted_rank = 1;
    CO_INC(c, requests);
    dh__co_drain(c, now);
}

/* ---- completions ---- */

/* The slot of the server registered by `from` under wire id `sid`, or -1:
 * a notice is believed only from the connection that registered its
 * server id. */
static int sender_slot(const struct dh_coordinator *c,
                       const struct co_peer *from, uint32_t sid)
{
    for (int i = 0; i < c->max_servers; i++)
        if (c->servers[i].used && c->servers[i].wire_id == sid)
            return dh__co_same_peer(&c->servers[i].peer, from) ? i : -1;
    return -1;
}

/* 1: server `slot` may complete `t`: the task runs there (the same
 * registration), or it is the requester's local server, the delivery
 * target of a remote's payload.  A waiting task (never routed, or waiting
 * for a re-route) only from the latter: a late payload landed there. */
static int may_complete(const struct dh_coordinator *c, const struct co_task *t,
                        int slot)
{
    uint32_t r = t->req.requester_rank;

    if (t->state == CO_RUNNING && t->server == slot &&
        c->servers[slot].gen == t->server_gen)
        return 1;
    return t->state != CO_PENDING_NEW && c->rank_local[r] == slot;
}

/* Running task t's work leaves the queue of the server it runs on (its
 * CPU pool's count too), which learns from `actual_ms` - if that is still
 * the same registration; a server that died took its counts with it. */
static void off_server(struct dh_coordinator *c, struct co_task *t,
                       double actual_ms)
{
    const struct co_server *s = t->server >= 0 ? &c->servers[t->server] : NULL;

    if (!s || !s->used || s->gen != t->server_gen)
        return;
    dh__co_pool_unrelease(c, t);
    if (dh_place_complete(c->place, t->server, t->work_ms, actual_ms) < 0)
        dh__log(DH_LOG_ERROR,
                "coordinator: placement lost server "
                "slot %d",
                (int)t->server); /* cannot happen */
}

/* service_ms: the server's own time on the task (0: unknown, then the
 * time since routing, which includes its time queued there). */
static void complete_task(struct dh_coordinator *c, struct co_task *t,
                          uint64_t now, double service_ms)
{
    off_server(c, t, service_ms > 0 ? service_ms : (double)(now - t->since_ms));
    task_remove(c, t->req.task.id);
    if (t->state == CO_RUNNING)
        task_free(c, t);
    else
        t->cancelled = 1; /* still in the FIFO, which frees it */
}

/* Moves running task t off its server (alive, or it would be orphaned
 * already) to the front of the FIFO, to be placed on its rank's local
 * server only: the one place its batch can always be delivered.  The old
 * execution's work leaves that server's queue; if it still completes
 * first, that completion is kept as any other. */
void dh__co_to_local(struct dh_coordinator *c, struct co_task *t, uint64_t now)
{
    off_server(c, t, (double)(now - t->since_ms));
    t->req.hints.local_only = 1;
    t->state = CO_PENDING_REROUTE;
    t->server = -1;
    t->bp_logged = 0;
    if (fifo_push(c, t, 1) < 0) /* cannot happen: sized for all */
        fail_task(c, t, DH_ETOOBIG, "re-route queue full");
}

void dh__co_target_lost(struct dh_coordinator *c, uint32_t rank, uint64_t now)
{
    struct co_task **p;
    size_t pos = 0, n = 0;

    while ((p = dh__idmap_next(&c->tasks, &pos, NULL))) {
        struct co_task *t = *p;

        if (t->req.requester_rank != rank || t->state != CO_RUNNING ||
            t->server < 0 || c->servers[t->server].role != DH_WIRE_ROLE_REMOTE)
            continue;
        dh__co_to_local(c, t, now);
        n++;
    }
    if (n)
        dh__log(DH_LOG_WARN,
                "coordinator: rank %u lost its local server: "
                "%zu of its tasks on remote servers re-routed to its next "
                "one",
                rank, n);
}

/* A remote could not deliver task `w` (`t`, NULL if unknown) to its
 * target (the requester's local server died or cannot be reached:
 * DH_EPEERDEAD).  That says nothing about the samples, so the client never
 * hears of it: the task goes to the rank's local server.  From a server
 * the task no longer runs on (it was re-routed already) it is only a late
 * word. */
static void on_undelivered(struct dh_coordinator *c, struct co_task *t,
                           const struct dh_wire_error *w, uint64_t now)
{
    if (!t || t->state != CO_RUNNING || t->server < 0 ||
        c->servers[t->server].wire_id != w->server_id ||
        c->servers[t->server].gen != t->server_gen) {
        CO_INC(c, duplicates);
        return;
    }
    dh__log(DH_LOG_WARN,
            "coordinator: server %u could not deliver task %llu "
            "to rank %u (%s): re-routing it to that rank's local server",
            w->server_id, (unsigned long long)w->task.id, t->req.requester_rank,
            w->message);
    dh__co_to_local(c, t, now);
    dh__co_drain(c, now);
}

void dh__co_on_done(struct dh_coordinator *c, const struct co_peer *from,
                    const struct dh_wire_msg *m, uint64_t now)
{
    int is_result = m->type == DH_WIRE_RESULT_NOTICE;
    const struct dh_wire_task *task = is_result ? &m->u.result.task
                                                : &m->u.error.task;
    uint32_t sid = is_result ? m->u.result.server_id : m->u.error.server_id;
    struct co_task *t = NULL;
    int first = 0, from_slot = sender_slot(c, from, sid);

    if (from_slot < 0) {
        dh__co_refused(c, from,
                       "task %#llx: the sender is not registered as server "
                       "%u",
                       (unsigned long long)task->id, sid);
        /* A server declared dead may still finish: the slot it names is
         * its own, so it gets it back (a stranger learns nothing). */
        if (is_result)
            dh__co_send_release(c, from, &m->u.result);
        return;
    }
    c->servers[from_slot].last_seen_ms = now;
    t = task_find(c, task->id);
    if (t && !may_complete(c, t, from_slot)) {
        dh__co_refused(c, from,
                       "task %#llx was not routed to server %u, nor is it "
                       "its delivery target",
                       (unsigned long long)task->id, sid);
        if (is_result) /* its own slot: give it back */
            dh__co_send_release(c, from, &m->u.result);
        return;
    }
    /* Only a remote delivers to another server. */
    if (!is_result && m->u.error.cause == DH_EPEERDEAD &&
        c->servers[from_slot].role != DH_WIRE_ROLE_LOCAL) {
        on_undelivered(c, t, &m->u.error, now);
        return;
    }
    if (dh__co_doubt(c, t, from, from_slot, m, now))
        return;
    if (dh_inflight_done(c->inflight, task->id, sid, &first) < 0 || !first ||
        !t) {
        CO_INC(c, duplicates); /* late or unknown: never reaches a client */
        if (is_result)
            dh__co_send_release(c, from, &m->u.result);
        return;
    }
    CO_SET(c, inflight, dh_inflight_count(c->inflight));
    /* The notice goes to the client as the server sent it: nothing in it
     * changes on the way, so its bytes are not encoded again (the
     * decode above stays: authorization and first-result-wins need it). */
    (void)dh__co_forward(c, &t->client, m);
    CO_INC(c, results);
    dh__co_doubt_settled(c, t, m);
    dh__co_mx_done(c, t, m, now);
    complete_task(c, t, now, is_result ? m->u.result.service_ms : 0);
    dh__co_drain(c, now);
}

void dh__co_client_moved(struct dh_coordinator *c, uint32_t rank,
                         const struct co_peer *to)
{
    struct co_task **p;
    size_t pos = 0;

    while ((p = dh__idmap_next(&c->tasks, &pos, NULL)))
        if ((*p)->req.requester_rank == rank)
            (*p)->client = *to;
}

/* ---- dead servers ---- */

void dh__co_orphan_tasks(struct dh_coordinator *c, int32_t slot)
{
    size_t n = 0;

    do {
        if (dh_inflight_server_dead(c->inflight, (uint32_t)slot, c->dead_buf,
                                    c->dead_cap, &n) < 0)
            return;
        for (size_t i = 0; i < n; i++) {
            struct co_task *t = task_find(c, c->dead_buf[i]);

            if (!t)
                continue;
            t->state = CO_PENDING_REROUTE;
            t->server = -1;
            t->bp_logged = 0;
            if (fifo_push(c, t, 1) < 0) /* cannot happen: sized for all */
                fail_task(c, t, DH_ETOOBIG, "re-route queue full");
        }
    } while (n == c->dead_cap);
}
