/*
 * dataserver.c - a DataServer (src/include/datahelix/dataserver.h), local to
 * one rank or a remote sidecar: the core loop, options, create / destroy.
 *
 * Design notes:
 *   - What it owns: the loop, the dispatch of control messages, the job
 *     table, the slots handed to the client and the quarantine
 *     (dataserver_jobs.c), the latency EWMA, and the order in which the
 *     parts start and stop.  The parts (dataserver_internal.h) each own
 *     their state: the sender (dataserver_ctl.c, the only code that
 *     writes to the Coordinator), the payload inbox, the client link, and
 *     one executor that runs the jobs - the C decode pool, the Python
 *     workers, or forwarding (a pool whose batches go to their target).
 *   - Flow: a Route passes the quarantine and the job table, then goes to
 *     the executor's submit(); every completion comes back through the
 *     sink (on_done()), the one place that turns completions - the
 *     executor's and the inbox's - into ResultNotices (the slot passes to
 *     the client), ErrorNotices, or nothing (forwarded).  Nothing calls
 *     back into this file but through that function pointer.
 *   - Each turn: zmq_poll() for at most DS_POLL_MS over the Coordinator
 *     socket, the client link, the payload socket (local --listen, unless
 *     a payload waits for space) and the executor's descriptors (the
 *     decode pool's completion eventfd, the Python workers' sockets); then
 *     control messages, payloads, the executor's drain() (completions,
 *     retries, watchdogs), and a heartbeat when one is due.  A completion
 *     wakes the poll at once; the DS_POLL_MS tick is only for what no
 *     descriptor signals (retries, watchdogs, a payload waiting for arena
 *     space, the heartbeat).  Local and remote run the same loop; only
 *     the executor differs.
 *   - Invariants: a job is in the table from admission until its
 *     completion is reported, so a request is admitted or answered at
 *     once, never dropped; every slot reference is with exactly one part
 *     (an executor, the inbox, the client through a notice, or released).
 *
 * Threading: single-threaded loop; the decode pool has its own threads
 * behind workers.h.  Counters are atomics for stats().
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/log.h"
#include "core/alloc.h"
#include "core/clock.h"
#include "runtime/dataserver_internal.h"
#include "runtime/local_link.h"

#define EWMA_ALPHA 0.2

struct dh_dataserver {
    struct ds_env env;
    struct ds_stats st;
    char coord[DH_WIRE_MAX_ADDR + 1];
    int heartbeat_ms;
    void *ctx;
    struct dh_tp_auth auth; /* env.auth points here when keyed */
    struct ds_ctl *ctl;
    struct ds_inbox *inbox; /* local --listen, or NULL */
    struct ds_exec *exec;
    struct ds_link link;
    struct ds_jobs jobs;
    struct ds_backlog backlog; /* local: Routes waiting for a job entry */
    struct ds_slots slots;
    struct ds_quarantines quar;
    double latency_ms;
    uint64_t cpu_last[3]; /* the executor's task / cpu / wait ns, last sent */
    uint64_t next_hb_ms;
    int shutdown;
};

void dh_dataserver_opts_default(struct dh_dataserver_opts *o)
{
    memset(o, 0, sizeof(*o));
    o->workers = 2;
    o->arena_bytes = (size_t)256 << 20;
    o->heartbeat_ms = 500;
    o->register_timeout_ms = 5000;
    o->alloc_timeout_ms = 30000;
    o->sample_timeout_ms = 60000;
    o->deliver_timeout_ms = 5000;
    o->route_wait_ms = DS_ROUTE_WAIT_MS;
    o->client_fd = -1;
    o->python_workers = 1;
    o->python_job_timeout_ms = 600000;
}

/* ---- completions ---- */

/* A result's substituted samples failed here: remembered (also those of a
 * job that failed later on).  A remote's word that they failed is not
 * (the Coordinator has it checked here first: docs/security.md "Sidecars
 * checked"), so a lying sidecar cannot quarantine good samples. */
static void quarantine_subs(struct dh_dataserver *s, const struct ds_result *r)
{
    if (r->stages.server_id && r->stages.server_id != s->env.server_id)
        return;
    for (uint32_t i = 0; i < r->n_subs; i++) {
        char msg[160];

        snprintf(msg, sizeof(msg),
                 "sample %llu: failed with code %d (substituted by %llu)",
                 (unsigned long long)r->sub_failed[i], (int)r->sub_cause[i],
                 (unsigned long long)r->ids[r->sub_pos[i]]);
        dh__ds_quarantine_add(&s->quar, &s->env, r->sub_failed[i],
                              r->sub_cause[i], msg);
    }
}

/* The sink of the executor and the inbox. */
static void on_done(void *arg, const struct ds_done *d)
{
    struct dh_dataserver *s = arg;
    struct dh_err e;

    if (d->latency_ms >= 0)
        s->latency_ms = s->latency_ms == 0 ? d->latency_ms
                                           : (1 - EWMA_ALPHA) * s->latency_ms +
                                                 EWMA_ALPHA * d->latency_ms;
    if (d->kind == DS_DONE_ERROR) {
        quarantine_subs(s, &d->res);
        if (d->quarantine)
            dh__ds_quarantine_add(&s->quar, &s->env, d->sample, d->code,
                                  d->msg);
        dh__ds_ctl_error(s->ctl, &d->task, d->sample, d->code, d->msg);
    } else if (d->kind == DS_DONE_RESULT) {
        quarantine_subs(s, &d->res);
        DS_ADD(&s->env, substituted, d->res.n_subs);
        if (dh__ds_ctl_result(s->ctl, &d->task, &d->res, &e) < 0) {
            dh__ds_release(&s->env, &d->res.slot);
            dh__ds_ctl_error(s->ctl, &d->task, d->res.ids[0], e.code, e.msg);
        } else {
            uint8_t *notice = NULL;
            size_t len = 0;

            if (dh__ds_ctl_last_notice(s->ctl, &notice, &len) < 0)
                notice = NULL; /* out of memory: no re-send for it */
            dh__ds_slot_remember(&s->slots, &s->env, &d->res.slot, d->task.id,
                                 notice, len);
            DS_INC(&s->env, results);
            if (!d->job) { /* a payload from a remote server */
                DS_INC(&s->env, payloads);
                DS_ADD(&s->env, cross_ds_bytes, d->res.slot.len);
            }
        }
    }
    if (d->job)
        dh__ds_job_clear(d->job);
}

static struct ds_sink sink_of(struct dh_dataserver *s)
{
    return (struct ds_sink){on_done, s};
}

/* ---- control messages ---- */

/* The request's spares, and the quarantine's word on each of its samples
 * (a known failure is substituted without decoding it again). */
static int admit_spares(struct dh_dataserver *s, struct ds_job *j,
                        const struct dh_wire_request *rq, struct dh_err *e)
{
    int any = 0;

    if (!(j->spares = dh__malloc(rq->n_spares * sizeof(*j->spares))))
        return dh_err_set(e, DH_ENOMEM, "out of memory");
    memcpy(j->spares, rq->spare_ids, rq->n_spares * sizeof(*j->spares));
    j->n_spares = rq->n_spares;
    for (uint32_t i = 0; i < rq->n_samples && !any; i++)
        any = dh__ds_quarantine_code(&s->quar, rq->sample_ids[i]) != 0;
    if (!any)
        return 0;
    if (!(j->known = dh__calloc(rq->n_samples, sizeof(*j->known))))
        return dh_err_set(e, DH_ENOMEM, "out of memory");
    for (uint32_t i = 0; i < rq->n_samples; i++)
        if ((j->known[i] = dh__ds_quarantine_code(&s->quar, rq->sample_ids[i])))
            DS_INC(&s->env, quarantine_hits);
    return 0;
}

/* A job for the Route's request: 0, or an error for the ErrorNotice. */
static int admit(struct dh_dataserver *s, const struct dh_wire_route *r,
                 struct dh_err *e)
{
    const struct dh_wire_request *rq = &r->request;
    struct ds_job *j = dh__ds_job_new(&s->jobs);
    int rc;

    if (!j)
        return dh_err_set(e, DH_ETOOBIG,
                          "dataserver %u busy: %zu jobs in "
                          "flight",
                          s->env.server_id, s->jobs.n);
    if (!(j->ids = dh__malloc(rq->n_samples * sizeof(*j->ids))))
        return dh_err_set(e, DH_ENOMEM, "out of memory");
    memcpy(j->ids, rq->sample_ids, rq->n_samples * sizeof(*j->ids));
    j->n = rq->n_samples;
    if (s->exec->ops->spares && rq->n_spares &&
        (rc = admit_spares(s, j, rq, e)) < 0) {
        dh__ds_job_clear(j);
        return rc;
    }
    j->task = rq->task;
    j->target_id = r->target_server_id;
    memcpy(j->target_addr, r->target_addr, sizeof(j->target_addr));
    dh_wire_plan_to_media(&rq->plan, &j->plan);
    j->used = 1;
    if ((rc = s->exec->ops->submit(s->exec, j, e)) < 0) {
        dh__ds_job_clear(j);
        return rc;
    }
    if (j->used)                /* (it may have ended already) */
        j->plan.indices = NULL; /* borrowed from rq: executors copied it */
    return 0;
}

/* The tail of a Route that could not be admitted: the Coordinator hears
 * why, for the task. */
static void admit_failed(struct dh_dataserver *s, const struct dh_wire_route *r,
                         int rc, struct dh_err *e)
{
    const struct dh_wire_request *rq = &r->request;

    /* A remote with no room - its job table (DH_ETOOBIG) or its workers'
     * queue (DH_ETIMEOUT) full: a restarted Coordinator does not know
     * what it still holds - says nothing about the samples: DH_EPEERDEAD,
     * which the Coordinator answers by re-routing the task to the rank's
     * local server (docs/exactly-once.md "Lost delivery target"), never a
     * sample error that the skip policy would drop. */
    if (s->env.remote && (rc == DH_ETOOBIG || rc == DH_ETIMEOUT))
        e->code = DH_EPEERDEAD;
    dh__ds_ctl_error(s->ctl, &rq->task, rq->sample_ids[0], e->code, e->msg);
}

/* 1 if admit() failed for want of room (a job entry, the queue). */
static int busy(int rc)
{
    return rc == DH_ETOOBIG || rc == DH_ETIMEOUT;
}

/* Admits the Routes that waited for room, oldest first, while there is. */
static void admit_backlog(struct dh_dataserver *s)
{
    struct dh_wire_msg *m;
    struct dh_err e;
    int rc;

    while ((m = dh__ds_backlog_front(&s->backlog)) &&
           dh__ds_job_new(&s->jobs)) {
        dh_err_clear(&e);
        if ((rc = admit(s, &m->u.route, &e)) == DH_ETIMEOUT)
            return; /* the queue is still full: on a later turn */
        if (rc == 0)
            DS_INC(&s->env, routes);
        else
            admit_failed(s, &m->u.route, rc, &e);
        dh__ds_backlog_pop(&s->backlog);
    }
}

static void on_route(struct dh_dataserver *s, struct dh_wire_msg *m)
{
    const struct dh_wire_route *r = &m->u.route;
    const struct dh_wire_request *rq = &r->request;
    const struct ds_quarantine *q;
    const struct ds_sent *sent;
    struct dh_err e;
    int rc;

    /* A task whose batch is here already, in a slot the client has not
     * released: its notice was lost with a Coordinator that died, and the
     * client re-issued the task to the new one.  The same notice again
     * (the same slot, nothing decoded twice, no slot left behind). */
    if ((sent = dh__ds_slot_of_task(&s->slots, &s->env, r->task.id))) {
        dh__log(DH_LOG_INFO,
                "dataserver %u: task %llu is done already (slot %llu): its "
                "notice again",
                s->env.server_id, (unsigned long long)r->task.id,
                (unsigned long long)sent->ref.offset);
        dh__ds_ctl_resend(s->ctl, sent->notice, sent->notice_len);
        DS_INC(&s->env, routes);
        if (r->has_request)
            return;
    }
    if (!r->has_request) {
        /* A task of this rank placed on a remote that delivers here: the
         * one payload the inbox takes for it (docs/security.md "Who may
         * send a payload"). */
        if (s->inbox && r->target_server_id == s->env.server_id &&
            r->server_id != s->env.server_id && r->task.rank == s->env.rank) {
            dh__ds_inbox_expect(s->inbox, r->task.id, r->server_id,
                                r->sender_token);
            return;
        }
        dh__ds_malformed(&s->env, "the coordinator",
                         "route without a "
                         "request");
        return;
    }
    /* Routed here again while this server still holds it: it was declared
     * dead (a stopped or starved process) and came back, and the
     * Coordinator re-routed what it held.  Its result will come from the
     * job already running (issue 36 item 5: never decoded twice, never a
     * second job entry). */
    if (dh__ds_job_find(&s->jobs, r->task.id) ||
        dh__ds_backlog_has(&s->backlog, r->task.id)) {
        dh__log(DH_LOG_INFO,
                "dataserver %u: task %llu routed here again while it is in "
                "flight here: its result comes from the job running",
                s->env.server_id, (unsigned long long)r->task.id);
        return;
    }
    /* With spares the job substitutes a quarantined sample (admit()). */
    if (!(rq->n_spares && s->exec->ops->spares) &&
        (q = dh__ds_quarantine_find(&s->quar, rq))) {
        char msg[DH_WIRE_MAX_TEXT];

        DS_INC(&s->env, quarantine_hits);
        snprintf(msg, sizeof(msg), "%s (failed before; quarantined)", q->msg);
        dh__ds_ctl_error(s->ctl, &rq->task, q->id, q->code, msg);
        return;
    }
    dh_err_clear(&e);
    /* A local server with Routes waiting keeps their order. */
    rc = s->backlog.n ? DH_ETOOBIG : admit(s, r, &e);
    if (rc == 0) {
        DS_INC(&s->env, routes);
        return;
    }
    /* A local server with no room: the Route waits for a job to end. */
    if (!s->env.remote && busy(rc) &&
        dh__ds_backlog_push(&s->backlog, m) == 0) {
        dh__log(DH_LOG_DEBUG,
                "dataserver %u: task %llu waits for a free job entry "
                "(%zu waiting)",
                s->env.server_id, (unsigned long long)m->u.route.task.id,
                s->backlog.n);
        return;
    }
    if (rc == DH_ETOOBIG && s->backlog.n && !e.msg[0])
        dh_err_set(&e, DH_ETOOBIG,
                   "dataserver %u busy: %zu jobs in flight and %zu "
                   "routes waiting",
                   s->env.server_id, s->jobs.n, s->backlog.n);
    admit_failed(s, r, rc, &e);
}

static void dispatch(struct dh_dataserver *s, struct dh_wire_msg *m)
{
    switch (m->type) {
    case DH_WIRE_ROUTE:
        on_route(s, m);
        break;
    case DH_WIRE_RELEASE:
        dh__ds_slot_release(&s->slots, &s->env, &m->u.release);
        break;
    case DH_WIRE_REGISTER_SERVER:
        break; /* a repeated ack */
    case DH_WIRE_SHUTDOWN:
        dh__log(DH_LOG_INFO, "dataserver %u: shutdown requested: %s",
                s->env.server_id, m->u.shutdown.reason);
        s->shutdown = 1;
        break;
    default:
        dh__ds_malformed(&s->env, "the coordinator",
                         "the coordinator may "
                         "not send %s",
                         dh_wire_type_name(m->type));
    }
}

/* Handles up to DS_BURST control messages; < 0 if the socket failed. */
static int recv_ctl(struct dh_dataserver *s, struct dh_err *e)
{
    int rc = 0;

    for (int i = 0; i < DS_BURST && !s->shutdown; i++) {
        struct dh_wire_msg m;

        if ((rc = dh__ds_ctl_recv(s->ctl, &m, e)) <= 0)
            break;
        if (m.type != DH_WIRE_NONE)
            dispatch(s, &m);
        dh_wire_msg_fini(&m);
    }
    return rc < 0 ? rc : 0;
}

/* ---- the loop ---- */

/* The CPU the jobs since the last heartbeat took over their time not
 * spent waiting for a CPU (cpu_pool.h), or 0: not measured, or under 10 ms
 * of such time (too little to say). */
static double cpu_fraction(struct dh_dataserver *s, uint32_t *slot_waiting)
{
    uint64_t now[3], d[3];
    double f;

    *slot_waiting = 0;
    if (!s->exec->ops->cpu)
        return 0;
    s->exec->ops->cpu(s->exec, &now[0], &now[1], &now[2], slot_waiting);
    for (int i = 0; i < 3; i++)
        d[i] = now[i] - s->cpu_last[i];
    if (d[0] <= d[2] || d[0] - d[2] < 10000000ull)
        return 0; /* kept for the next heartbeat */
    memcpy(s->cpu_last, now, sizeof(now));
    f = (double)d[1] / (double)(d[0] - d[2]);
    return f > 1 ? 1 : f < 1e-3 ? 1e-3 : f;
}

static void heartbeat(struct dh_dataserver *s)
{
    struct dh_wire_link links[DS_MAX_PEERS];
    const struct ds_exec_ops *ops = s->exec->ops;
    uint64_t queued = 0, busy = 0;
    uint32_t n = ops->links ? ops->links(s->exec, links, DS_MAX_PEERS) : 0;
    struct ds_reads rd = {0};
    uint32_t waiting;
    double f = cpu_fraction(s, &waiting);

    ops->load(s->exec, &queued, &busy);
    if (ops->reads)
        ops->reads(s->exec, &rd);
    dh__ds_ctl_heartbeat(s->ctl, queued, busy, s->latency_ms, f, waiting, &rd,
                         links, n);
}

static int serve_once(struct dh_dataserver *s, struct dh_err *e)
{
    zmq_pollitem_t it[4 + DS_PY_MAX_WORKERS] = {
        {.socket = dh__ds_ctl_socket(s->ctl), .events = ZMQ_POLLIN}};
    void *psock = s->inbox ? dh__ds_inbox_socket(s->inbox) : NULL;
    int n = 1, li = -1, ai = -1, rc;

    if (s->link.fd >= 0) {
        li = n;
        it[n++] = (zmq_pollitem_t){.fd = s->link.fd, .events = ZMQ_POLLIN};
    }
    if (s->link.listen_fd >= 0) {
        ai = n;
        it[n++] = (zmq_pollitem_t){.fd = s->link.listen_fd,
                                   .events = ZMQ_POLLIN};
    }
    if (psock)
        it[n++] = (zmq_pollitem_t){.socket = psock, .events = ZMQ_POLLIN};
    n += s->exec->ops->pollitems(s->exec, it + n, DS_PY_MAX_WORKERS);
    if (zmq_poll(it, n, DS_POLL_MS) < 0 && zmq_errno() != EINTR)
        return dh_err_set(e, DH_EIO, "polling coordinator %s: %s", s->coord,
                          zmq_strerror(zmq_errno()));
    if (li >= 0 && (it[li].revents & (ZMQ_POLLIN | ZMQ_POLLERR)) &&
        dh__ds_link_gone(&s->link, &s->env)) {
        s->env.client_gone = 1;
        s->shutdown = 1;
    }
    if (ai >= 0 && (it[ai].revents & ZMQ_POLLIN))
        dh__ds_link_accept(&s->link, &s->env);
    if ((rc = recv_ctl(s, e)) < 0)
        return rc;
    dh__ds_inbox_serve(s->inbox, sink_of(s));
    s->exec->ops->drain(s->exec);
    admit_backlog(s);
    if (dh__mono_ms() >= s->next_hb_ms) {
        heartbeat(s);
        s->next_hb_ms = dh__mono_ms() + (uint64_t)s->heartbeat_ms;
    }
    return 0;
}

int dh_dataserver_run(struct dh_dataserver *s, const volatile int *stop,
                      struct dh_err *e)
{
    s->shutdown = 0;
    s->next_hb_ms = dh__mono_ms();
    while (!s->shutdown && !(stop && *stop)) {
        int rc = serve_once(s, e);

        if (rc < 0)
            return rc;
    }
    return 0;
}

/* ---- create / destroy ---- */

static int bad_addr(const char *a)
{
    return a && (!a[0] || strlen(a) > DH_WIRE_MAX_ADDR);
}

/* Options that only make sense in one mode. */
static int check_mode(const struct dh_dataserver_opts *o, struct dh_err *e)
{
    if (o->remote &&
        (o->listen || o->advertise || o->client_fd >= 0 || o->client_socket))
        return dh_err_set(e, DH_EINVAL,
                          "dataserver: a remote server takes "
                          "no --listen, --advertise or client link");
    if (o->advertise && !o->listen)
        return dh_err_set(e, DH_EINVAL,
                          "dataserver: --advertise needs "
                          "--listen");
    if (o->client_pid && (o->client_pid < 0 || !o->client_socket))
        return dh_err_set(e, DH_EINVAL,
                          "dataserver: --client-pid %d needs "
                          "--client-socket (and a pid > 0)",
                          o->client_pid);
    if (o->listen && o->addr)
        return dh_err_set(e, DH_EINVAL,
                          "dataserver: with --listen the "
                          "announced address is the bound one or "
                          "--advertise, not `addr`");
    /* Unpickling runs code: only a dataset named by the client that
     * started this server (its command line) is accepted. */
    if (o->python_dataset && (o->remote || o->client_fd < 0))
        return dh_err_set(e, DH_EINVAL,
                          "dataserver: --python-dataset needs "
                          "--client-fd (a dataset is accepted only from the "
                          "client that started this server)");
    /* Its rank reads every slot as a Python batch: no slot may come from
     * a sender on the network. */
    if (o->python_dataset && o->listen)
        return dh_err_set(e, DH_EINVAL,
                          "dataserver: --python-dataset excludes --listen "
                          "%s (a Python-dataset server takes batches only "
                          "from its own workers, never payloads from the "
                          "network)",
                          o->listen);
    return 0;
}

static int check_opts(const struct dh_dataserver_opts *o, struct dh_err *e)
{
    if (!o || !o->coordinator || !o->coordinator[0] || !o->index_path)
        return dh_err_set(e, DH_EINVAL,
                          "dataserver: coordinator endpoint "
                          "and index path are required");
    if (bad_addr(o->coordinator) || bad_addr(o->addr) || bad_addr(o->listen) ||
        bad_addr(o->advertise))
        return dh_err_set(e, DH_EINVAL,
                          "dataserver: bad address (empty or "
                          "over %u bytes)",
                          DH_WIRE_MAX_ADDR);
    if (o->rank >= DH_WIRE_MAX_RANKS || o->workers < 1 ||
        o->workers > DH_WORKERS_MAX_THREADS || o->arena_bytes == 0 ||
        o->heartbeat_ms < 1 || o->register_timeout_ms < 1 ||
        o->alloc_timeout_ms < 0 || o->deliver_timeout_ms < 1 ||
        o->route_wait_ms < 0 || (o->client_fd >= 0 && o->client_socket) ||
        o->server_id == UINT32_MAX) /* the Coordinator's own notices */
        return dh_err_set(e, DH_EINVAL,
                          "dataserver: option out of range "
                          "(rank %u, workers %u, heartbeat %d ms)",
                          o->rank, o->workers, o->heartbeat_ms);
    if (o->token && !dh__link_token_ok(o->token))
        return dh_err_set(e, DH_EINVAL,
                          "dataserver: the rank token is not %u lower-case "
                          "hex digits",
                          DH_WIRE_TOKEN_LEN);
    return check_mode(o, e);
}

/* A remote server without --server-id: a hash of host name and pid in
 * [2^31, 2^32 - 2], clear of the ids local servers take by default. */
static uint32_t default_remote_id(void)
{
    char host[256] = "";
    uint64_t h = 1469598103934665603ull; /* FNV-1a */

    if (gethostname(host, sizeof(host) - 1) < 0)
        host[0] = 0;
    for (const char *p = host; *p; p++)
        h = (h ^ (unsigned char)*p) * 1099511628211ull;
    h = (h ^ (uint64_t)getpid()) * 1099511628211ull;
    return 0x80000000u | (uint32_t)(h % 0x7fffffffu);
}

static int arena_capacity(struct dh_dataserver *s, struct dh_err *e)
{
    struct dh_arena_stats st;

    if (dh_arena_stats(s->env.arena, &st) < 0)
        return dh_err_set(e, DH_ETIMEOUT, "dataserver %u: arena lock stuck",
                          s->env.server_id);
    s->env.arena_cap = st.capacity;
    return 0;
}

static int open_sockets(struct dh_dataserver *s,
                        const struct dh_dataserver_opts *o, struct dh_err *e)
{
    int rc;

    if ((rc = dh__tp_auth_init(&s->auth, o->keyfile, "dataserver", e)) < 0)
        return rc;
    s->env.auth = rc ? &s->auth : NULL;
    s->env.insecure = o->insecure;
    if (!(s->ctx = zmq_ctx_new()))
        return dh_err_set(e, DH_EIO, "dataserver: zmq: %s",
                          zmq_strerror(zmq_errno()));
    /* One I/O thread per stripe at either end of a payload link (a
     * remote's sockets to every target, a listening local's incoming
     * connections); a local that takes no payloads keeps one. */
    if ((o->remote || o->listen) &&
        (rc = dh__tp_ctx_tune(s->ctx, s->env.stripes,
                              DS_MAX_PEERS * (int)s->env.stripes + 64, e)) < 0)
        return rc;
    if ((rc = dh__ds_ctl_open(&s->env, s->ctx, s->coord, &s->ctl, e)) < 0)
        return rc;
    if (o->listen &&
        (rc = dh__ds_inbox_open(&s->env, s->ctx, o, &s->inbox, e)) < 0)
        return rc;
    return 0;
}

/* The executor for this mode: Python workers, forwarding, or the pool. */
static int open_exec(struct dh_dataserver *s,
                     const struct dh_dataserver_opts *o, struct dh_err *e)
{
    unsigned queue = o->workers * DS_QUEUE_PER_THREAD;

    if (o->python_dataset)
        return dh__ds_py_create(&s->env, o, s->jobs.n, sink_of(s), &s->exec, e);
    if (s->env.remote)
        return dh__ds_fwd_create(&s->env, s->ctx, o->workers, queue, s->jobs.n,
                                 sink_of(s), &s->exec, e);
    return dh__ds_pool_create(&s->env, o->workers, queue, s->jobs.n, sink_of(s),
                              &s->exec, e);
}

static int open_parts(struct dh_dataserver *s,
                      const struct dh_dataserver_opts *o, struct dh_err *e)
{
    size_t jobs = (size_t)o->workers * (DS_QUEUE_PER_THREAD + 1);
    int rc;

    if (o->python_dataset && jobs < DS_PY_JOBS)
        jobs = DS_PY_JOBS;
    if ((rc = dh__ds_jobs_init(&s->jobs, jobs, e)) < 0 ||
        (rc = dh__ds_backlog_init(&s->backlog, jobs * DS_BACKLOG_PER_JOB, e)) <
            0 ||
        (rc = dh_index_open(o->index_path, 0, &s->env.ix, e)) < 0 ||
        (rc = dh_arena_create(o->arena_bytes, &s->env.arena, e)) < 0 ||
        (rc = arena_capacity(s, e)) < 0 || (rc = open_sockets(s, o, e)) < 0 ||
        (rc = open_exec(s, o, e)) < 0)
        return rc;
    if (o->client_socket &&
        (s->link.listen_fd = dh__link_listen(o->client_socket, e)) < 0)
        return s->link.listen_fd;
    if ((rc = dh__ds_ctl_register(
             s->ctl, o, s->inbox ? dh__ds_inbox_endpoint(s->inbox) : NULL, e)) <
        0)
        return rc;
    if (s->link.fd >= 0 && (rc = dh__ds_link_hello(&s->env, s->link.fd, e)) < 0)
        return rc;
    return 0;
}

static struct dh_dataserver *alloc_server(const struct dh_dataserver_opts *o)
{
    struct dh_dataserver *s = dh__calloc(1, sizeof(*s));
    struct ds_env *env;

    if (!s)
        return NULL;
    env = &s->env;
    s->link.fd = o->client_fd;
    s->link.listen_fd = -1;
    s->link.want_pid = o->client_pid;
    env->st = &s->st;
    env->remote = o->remote ? 1 : 0;
    env->rank = o->remote ? 0 : o->rank;
    snprintf(s->coord, sizeof(s->coord), "%s", o->coordinator);
    env->server_id = o->server_id ? o->server_id
                     : o->remote  ? default_remote_id()
                                  : o->rank + 1;
    s->heartbeat_ms = o->heartbeat_ms;
    env->alloc_timeout_ms = o->alloc_timeout_ms;
    env->sample_timeout_ms = o->sample_timeout_ms < 0 ? 0
                                                      : o->sample_timeout_ms;
    env->deliver_timeout_ms = o->deliver_timeout_ms;
    env->route_wait_ms = o->route_wait_ms;
    env->stripes = dh__tp_stripes(o->payload_stripes);
    return s;
}

int dh_dataserver_create(const struct dh_dataserver_opts *o,
                         struct dh_dataserver **out, struct dh_err *e)
{
    struct dh_dataserver *s;
    int rc;

    if ((rc = check_opts(o, e)) < 0) {
        if (o && o->client_fd >= 0)
            close(o->client_fd);
        return rc;
    }
    if (!(s = alloc_server(o))) {
        if (o->client_fd >= 0)
            close(o->client_fd);
        return dh_err_set(e, DH_ENOMEM, "out of memory");
    }
    if (!s->env.remote && o->token)
        snprintf(s->env.token, sizeof(s->env.token), "%s", o->token);
    else if (!s->env.remote && (rc = dh__link_token_new(s->env.token, e)) < 0) {
        dh_dataserver_destroy(s);
        return rc;
    }
    if ((rc = dh__link_token_new(s->env.sender_secret, e)) < 0 ||
        (rc = open_parts(s, o, e)) < 0) {
        dh_dataserver_destroy(s);
        return rc;
    }
    *out = s;
    return 0;
}

int dh_dataserver_arena_fd(const struct dh_dataserver *s)
{
    return dh_arena_fd(s->env.arena);
}

const char *dh_dataserver_endpoint(const struct dh_dataserver *s)
{
    const char *ep = s->inbox ? dh__ds_inbox_endpoint(s->inbox) : NULL;

    return ep && ep[0] ? ep : NULL;
}

uint32_t dh_dataserver_id(const struct dh_dataserver *s)
{
    return s->env.server_id;
}

void dh_dataserver_stats(const struct dh_dataserver *s,
                         struct dh_dataserver_stats *out)
{
    struct dh_dataserver *m = (struct dh_dataserver *)s;

#define DS_LOAD_(n)                                                            \
    out->n = atomic_load_explicit(&m->st.st_##n, memory_order_relaxed);
    DS_STATS(DS_LOAD_)
#undef DS_LOAD_
    out->refused_peers = dh__tp_auth_refused(&m->auth);
}

/* The Coordinator hears first that this server leaves; then the executor
 * stops (its workers use the arena; python: whether the client went away
 * decides if the dataset files go), then the link, the inbox and the
 * sender close, then the context ends - ZeroMQ's free callbacks of staging
 * slots still queued (remote) run inside zmq_ctx_term() - and only then
 * the arena goes. */
void dh_dataserver_destroy(struct dh_dataserver *s)
{
    if (!s)
        return;
    dh__ds_ctl_leave(s->ctl);
    if (s->exec)
        s->exec->ops->destroy(s->exec);
    if (s->link.fd >= 0)
        close(s->link.fd);
    if (s->link.listen_fd >= 0)
        close(s->link.listen_fd);
    dh__ds_inbox_close(s->inbox);
    dh__ds_ctl_close(s->ctl);
    dh__tp_auth_fini(&s->auth); /* its ZAP socket, before the context */
    if (s->ctx)
        zmq_ctx_term(s->ctx);
    dh__ds_jobs_fini(&s->jobs);
    dh__ds_backlog_fini(&s->backlog);
    dh__ds_slots_fini(&s->slots);
    dh_arena_destroy(s->env.arena);
    dh_index_close(s->env.ix);
    dh__free(s);
}
