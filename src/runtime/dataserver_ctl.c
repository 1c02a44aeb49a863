/*
 * dataserver_ctl.c - the DataServer's sender: its link to the Coordinator
 * (src/include/datahelix/dataserver.h, docs/wire-protocol.md).  The DEALER
 * socket, registration (role local or remote) with its bounded wait for
 * the ack, heartbeats (queue depth, busy workers, decode latency EWMA and,
 * for a remote server, the bytes/s EWMA of each delivery target), result
 * and error notices, the last `leaving` heartbeat, and reading control
 * messages for the core loop, which dispatches them.
 *
 * Design: the only code of the DataServer that builds a message for the
 * Coordinator; its scratch message is its own.  It calls nothing of the
 * core or the executors.  A send failure is returned or logged, never
 * fatal (the Coordinator may come back).
 *
 * Locking: none (dataserver_internal.h).
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/log.h"
#include "core/alloc.h"
#include "core/clock.h"
#include "datahelix/media_stages.h"
#include "runtime/cpu_pool.h"
#include "runtime/dataserver_internal.h"
#include "runtime/transport.h"

struct ds_ctl {
    const struct ds_env *env;
    void *sock;
    char coord[DH_WIRE_MAX_ADDR + 1];
    char peer[DH_WIRE_MAX_ADDR + 16]; /* "coordinator ADDR", for logs */
    struct dh_wire_msg out;
    uint64_t hb_seq;
    int registered;    /* the Coordinator acknowledged us */
    int coord_stopped; /* it told us to stop: no goodbye to send */
    int left;          /* the goodbye went */
    struct dh_wire_register_server reg; /* what we registered (no arrays) */
    uint64_t reregister_ms; /* when the last re-registration went, or 0 */
};

/* At most one re-registration per this many ms: a restarted Coordinator
 * answers every queued heartbeat with "unknown". */
#define REREGISTER_MS 200

void dh__ds_malformed(const struct ds_env *env, const char *from,
                      const char *fmt, ...)
{
    char why[DH_ERR_MSG_MAX];
    va_list ap;

    DS_INC(env, malformed);
    va_start(ap, fmt);
    vsnprintf(why, sizeof(why), fmt, ap);
    va_end(ap);
    dh__log(DH_LOG_WARN,
            "dataserver %u: malformed message from %s: "
            "%s",
            env->server_id, from, why);
}

/* ---- sending ---- */

static int send_msg(struct ds_ctl *c, const struct dh_wire_msg *m,
                    struct dh_err *e)
{
    return dh__tp_send(c->sock, NULL, m, c->peer, e);
}

/* Sends c->out; a failure is logged, not fatal (the peer may come back). */
static void send_out(struct ds_ctl *c)
{
    struct dh_err e;

    if (send_msg(c, &c->out, &e) < 0)
        dh__log(DH_LOG_ERROR, "dataserver %u: %s", c->env->server_id, e.msg);
}

static double ms_ok(double v)
{
    return v > 0 && v < DH_WIRE_MAX_LATENCY_MS ? v : 0;
}

/* The result's stage times into notice n (docs/trace.md): durations the
 * wire cannot carry (not finite, out of range) become 0. */
static int stages_fill(struct dh_wire_result *n, const struct ds_result *r,
                       struct dh_err *e)
{
    const struct dh_wire_stages *s = &r->stages;
    float *rows;
    int rc;

    if (!s->present)
        return 0;
    n->stages.present = 1;
    n->stages.queue_ms = ms_ok(s->queue_ms);
    n->stages.alloc_ms = ms_ok(s->alloc_ms);
    n->stages.collate_ms = ms_ok(s->collate_ms);
    n->stages.place_ms = ms_ok(s->place_ms);
    n->stages.worker = s->worker < DH_WIRE_MAX_WORKERS ? s->worker : 0;
    n->stages.server_id = s->server_id;
    if (r->stage_rows) {
        rc = dh_wire_set_result_stages(n, r->stage_rows, r->n, e);
        return rc ? rc
                  : dh_wire_set_result_read_bytes(n, r->read_bytes, r->n, e);
    }
    if (!s->n_sample_times || s->n_sample_times != r->n)
        return 0;
    if (!(rows = dh__malloc((size_t)r->n * DH_MS_COUNT * sizeof(*rows))))
        return dh_err_set(e, DH_ENOMEM, "out of memory");
    for (uint32_t i = 0; i < r->n; i++) {
        float *row = rows + (size_t)i * DH_MS_COUNT;

        row[DH_MS_READ] = s->read_ms[i];
        row[DH_MS_DECODE] = s->decode_ms[i];
        row[DH_MS_SCALE] = s->scale_ms[i];
        row[DH_MS_AUDIO] = s->audio_ms ? s->audio_ms[i] : 0;
    }
    rc = dh_wire_set_result_stages(n, rows, r->n, e);
    if (!rc)
        rc = dh_wire_set_result_read_bytes(n, s->read_bytes, r->n, e);
    dh__free(rows);
    return rc;
}

int dh__ds_notice_fill(struct dh_wire_msg *m, uint32_t server_id,
                       const struct dh_wire_task *t, const struct ds_result *r,
                       struct dh_err *e)
{
    struct dh_wire_result *n;
    int rc;

    dh_wire_msg_fini(m);
    dh_wire_msg_init(m, DH_WIRE_RESULT_NOTICE);
    n = &m->u.result;
    n->task = *t;
    n->server_id = server_id;
    n->arena_offset = r->slot.offset;
    n->length = r->slot.len;
    n->slot_generation = r->slot.gen;
    n->ndims = r->ndims;
    memcpy(n->dims, r->dims, sizeof(n->dims));
    n->dtype = r->dtype;
    n->layout = r->layout;
    n->service_ms = r->service_ms > 0 && r->service_ms < DH_WIRE_MAX_LATENCY_MS
                        ? r->service_ms
                        : 0;
    if (r->n_subs &&
        (rc = dh_wire_set_result_subs(n, r->sub_pos, r->sub_failed,
                                      r->sub_cause, r->n_subs, e)) < 0)
        return rc;
    if ((rc = stages_fill(n, r, e)) < 0)
        return rc;
    return dh_wire_set_result_samples(n, r->ids, r->valid, r->n, e);
}

int dh__ds_ctl_result(struct ds_ctl *c, const struct dh_wire_task *t,
                      const struct ds_result *r, struct dh_err *e)
{
    int rc = dh__ds_notice_fill(&c->out, c->env->server_id, t, r, e);

    if (rc < 0)
        return rc;
    /* The batch is complete in this rank's arena now: a reading of the
     * rank's own clock (docs/trace.md "Clocks"). */
    dh__log(DH_LOG_DEBUG,
            "dataserver %u: task %llu ready (%u samples, %.1f ms "
            "of service)",
            c->env->server_id, (unsigned long long)t->id, r->n, r->service_ms);
    if (c->out.u.result.stages.present) {
        double now = dh__mono_msf();

        c->out.u.result.stages.ready_us = (uint64_t)(now * 1e3);
        c->out.u.result.stages.notify_ms = r->done_ms > 0
                                               ? ms_ok(now - r->done_ms)
                                               : 0;
    }
    return send_msg(c, &c->out, e);
}

int dh__ds_ctl_last_notice(struct ds_ctl *c, uint8_t **buf, size_t *len)
{
    *buf = NULL;
    if (c->out.type != DH_WIRE_RESULT_NOTICE)
        return DH_EINVAL;
    return dh_wire_encode(&c->out, buf, len, NULL);
}

void dh__ds_ctl_resend(struct ds_ctl *c, const uint8_t *buf, size_t len)
{
    struct dh_err e;

    dh_wire_msg_fini(&c->out);
    if (dh_wire_decode(buf, len, &c->out, &e) < 0) {
        dh__log(DH_LOG_ERROR, "dataserver %u: a kept notice: %s",
                c->env->server_id, e.msg);
        return;
    }
    send_out(c);
}

void dh__ds_ctl_error(struct ds_ctl *c, const struct dh_wire_task *t,
                      uint64_t sample, int cause, const char *msg)
{
    struct dh_wire_error *er;
    const char *path = dh_index_path(c->env->ix, sample);

    dh_wire_msg_fini(&c->out);
    dh_wire_msg_init(&c->out, DH_WIRE_ERROR_NOTICE);
    er = &c->out.u.error;
    er->task = *t;
    er->server_id = c->env->server_id;
    er->sample_id = sample;
    er->cause = cause < 0 ? cause : DH_EIO;
    snprintf(er->path, sizeof(er->path), "%s", path ? path : "");
    snprintf(er->message, sizeof(er->message), "%s", msg);
    send_out(c);
    DS_INC(c->env, errors);
}

void dh__ds_ctl_heartbeat(struct ds_ctl *c, uint64_t queued, uint64_t busy,
                          double latency_ms, double cpu_fraction,
                          uint32_t slot_waiting, const struct ds_reads *rd,
                          const struct dh_wire_link *links, uint32_t n_links)
{
    struct dh_wire_heartbeat *h;
    uint64_t depth = queued + busy;
    struct dh_err e;

    dh_wire_msg_fini(&c->out);
    dh_wire_msg_init(&c->out, DH_WIRE_HEARTBEAT);
    h = &c->out.u.heartbeat;
    h->server_id = c->env->server_id;
    h->seq = ++c->hb_seq;
    h->queue_depth = (uint32_t)(depth > DH_WIRE_MAX_QUEUE ? DH_WIRE_MAX_QUEUE
                                                          : depth);
    h->busy_workers = (uint32_t)busy;
    h->latency_ms = latency_ms > DH_WIRE_MAX_LATENCY_MS ? DH_WIRE_MAX_LATENCY_MS
                                                        : latency_ms;
    h->cpu_fraction = cpu_fraction;
    h->slot_waiting = slot_waiting;
    h->read_bytes = rd->bytes;
    h->reads = rd->reads;
    h->fetched_bytes = rd->fetched_bytes;
    h->cache_hits = rd->cache_hits;
    h->cache_misses = rd->cache_misses;
    h->read_ms = rd->ms < 0                      ? 0
                 : rd->ms > DH_WIRE_MAX_TOTAL_MS ? DH_WIRE_MAX_TOTAL_MS
                                                 : rd->ms;
    if (n_links > 0 && dh_wire_set_links(h, links, n_links, &e) < 0)
        dh__log(DH_LOG_WARN, "dataserver %u: heartbeat links: %s",
                c->env->server_id, e.msg); /* sent without them */
    send_out(c);
    DS_INC(c->env, heartbeats);
}

void dh__ds_ctl_leave(struct ds_ctl *c)
{
    if (!c || !c->sock || !c->registered || c->coord_stopped || c->left)
        return;
    c->left = 1;
    dh_wire_msg_fini(&c->out);
    dh_wire_msg_init(&c->out, DH_WIRE_HEARTBEAT);
    c->out.u.heartbeat.server_id = c->env->server_id;
    c->out.u.heartbeat.seq = ++c->hb_seq;
    c->out.u.heartbeat.leaving = 1;
    send_out(c);
    dh__tp_linger(c->sock, 200);
}

/* ---- receiving ---- */

/* The Coordinator does not know this server (it restarted, or took it
 * for dead): registering again puts it back in placement, so its rank's
 * refilled tasks can run (docs/exactly-once.md "Restarts").  Not blocking:
 * the ack arrives like any control message. */
static void on_unknown(struct ds_ctl *c, const struct dh_wire_heartbeat *h)
{
    uint64_t now = dh__mono_ms();

    if (!h->unknown || h->server_id != c->env->server_id) {
        dh__ds_malformed(c->env, "the coordinator",
                         "a heartbeat that is not an \"unknown server\" "
                         "answer for this server");
        return;
    }
    if (!c->reg.server_id || c->coord_stopped ||
        (c->reregister_ms && now - c->reregister_ms < REREGISTER_MS))
        return;
    c->reregister_ms = now;
    c->registered = 0;
    dh__log(DH_LOG_INFO,
            "dataserver %u: coordinator %s does not know this "
            "server (restarted?): registering again",
            c->env->server_id, c->coord);
    dh_wire_msg_fini(&c->out);
    dh_wire_msg_init(&c->out, DH_WIRE_REGISTER_SERVER);
    c->out.u.register_server = c->reg;
    send_out(c);
}

/* Receives one message into m (type DH_WIRE_NONE if it was bad).
 * 1: got one, 0: none waiting, < 0: socket error. */
static int recv_one(struct ds_ctl *c, struct dh_wire_msg *m, struct dh_err *e)
{
    struct dh_err de;
    int rc = dh__tp_recv(c->sock, NULL, m, c->peer, &de);

    if (dh__tp_dropped(rc)) {
        dh__ds_malformed(c->env, "the coordinator", "%s", de.msg);
        return 1; /* m is DH_WIRE_NONE */
    }
    if (rc < 0)
        return dh_err_set(e, rc, "%s", de.msg);
    if (m->type == DH_WIRE_SHUTDOWN)
        c->coord_stopped = 1;
    if (rc > 0 && m->type == DH_WIRE_HEARTBEAT) {
        on_unknown(c, &m->u.heartbeat);
        dh_wire_msg_fini(m); /* handled here: nothing for the core */
        dh_wire_msg_init(m, DH_WIRE_NONE);
    } else if (rc > 0 && m->type == DH_WIRE_REGISTER_SERVER &&
               c->reregister_ms && !c->registered &&
               m->u.register_server.server_id == c->env->server_id) {
        c->registered = 1;
        dh__log(DH_LOG_INFO,
                "dataserver %u: registered again with "
                "coordinator %s",
                c->env->server_id, c->coord);
    }
    return rc;
}

int dh__ds_ctl_recv(struct ds_ctl *c, struct dh_wire_msg *m, struct dh_err *e)
{
    return recv_one(c, m, e);
}

/* ---- socket and registration ---- */

int dh__ds_ctl_open(const struct ds_env *env, void *zmq_ctx, const char *coord,
                    struct ds_ctl **out, struct dh_err *e)
{
    struct dh_tp_opts o = {.kind = DH_TP_SERVER_CTL,
                           .addr = coord,
                           .who = "dataserver",
                           .peer = "coordinator",
                           .auth = env->auth};
    struct ds_ctl *c = dh__calloc(1, sizeof(*c));
    int rc;

    if (!c)
        return dh_err_set(e, DH_ENOMEM, "out of memory");
    c->env = env;
    dh_wire_msg_init(&c->out, DH_WIRE_NONE);
    snprintf(c->coord, sizeof(c->coord), "%s", coord);
    snprintf(c->peer, sizeof(c->peer), "coordinator %s", coord);
    if ((rc = dh__tp_open(zmq_ctx, &o, &c->sock, NULL, 0, e)) < 0) {
        dh__ds_ctl_close(c);
        return rc;
    }
    *out = c;
    return 0;
}

void dh__ds_ctl_close(struct ds_ctl *c)
{
    if (!c)
        return;
    dh__ds_ctl_leave(c);
    if (c->sock)
        zmq_close(c->sock); /* with the linger leave set */
    dh_wire_msg_fini(&c->out);
    dh__free(c);
}

void *dh__ds_ctl_socket(const struct ds_ctl *c)
{
    return c->sock;
}

/* The address a server announces: its payload endpoint (local with
 * --listen), o->addr, or a name that says it takes no payloads. */
static void announced_addr(const struct ds_ctl *c,
                           const struct dh_dataserver_opts *o,
                           const char *endpoint, char *buf, size_t len)
{
    if (endpoint && endpoint[0])
        snprintf(buf, len, "%s", endpoint);
    else if (o->addr)
        snprintf(buf, len, "%s", o->addr);
    else if (c->env->remote)
        snprintf(buf, len, "remote:server-%u", c->env->server_id);
    else
        snprintf(buf, len, "local:rank-%u", o->rank);
}

static void fill_register(struct ds_ctl *c, const struct dh_dataserver_opts *o,
                          const char *endpoint)
{
    struct dh_wire_register_server *r;

    dh_wire_msg_fini(&c->out);
    dh_wire_msg_init(&c->out, DH_WIRE_REGISTER_SERVER);
    r = &c->out.u.register_server;
    r->server_id = c->env->server_id;
    announced_addr(c, o, endpoint, r->addr, sizeof(r->addr));
    r->role = c->env->remote ? DH_WIRE_ROLE_REMOTE : DH_WIRE_ROLE_LOCAL;
    r->rank = c->env->remote ? 0 : o->rank;
    /* A Python dataset's tasks run on its Python workers: the
     * Coordinator's queue cap (4 per worker) must let every one of them
     * hold a task, or num_workers above 4 would leave workers idle (and a
     * dataset whose workers wait for each other would never finish). */
    r->workers = o->python_dataset && o->python_workers > o->workers
                     ? o->python_workers
                     : o->workers;
    r->arena_bytes = o->arena_bytes; /* remote: staging bytes */
    if (!c->env->remote)
        memcpy(r->token, c->env->token, sizeof(r->token));
    memcpy(r->sender_secret, c->env->sender_secret, sizeof(r->sender_secret));
    if (gethostname(r->host, sizeof(r->host) - 1) < 0)
        r->host[0] = 0;
    /* Only the C decode pool measures its tasks' CPU (the heartbeat's
     * cpu_fraction); Python workers' tasks may wait on anything, so their
     * server names no CPUs and joins no pool. */
    if (!o->python_dataset)
        dh__cpu_pool_probe(&r->cpus, &r->cpu_set);
    if (r->cpus > DH_WIRE_MAX_WORKERS)
        r->cpus = DH_WIRE_MAX_WORKERS;
}

/* 1: the ack, 0: keep waiting, 2: refused for now (try again), < 0:
 * refused. */
static int check_ack(struct ds_ctl *c, const struct dh_wire_msg *m,
                     struct dh_err *e)
{
    if (m->type == DH_WIRE_REGISTER_SERVER &&
        m->u.register_server.server_id == c->env->server_id)
        return 1;
    if (m->type == DH_WIRE_SHUTDOWN &&
        !strncmp(m->u.shutdown.reason, DH_WIRE_RETRY_REASON,
                 strlen(DH_WIRE_RETRY_REASON))) {
        dh_err_set(e, DH_EIO, "coordinator %s refused server %u: %s", c->coord,
                   c->env->server_id, m->u.shutdown.reason);
        return 2;
    }
    if (m->type == DH_WIRE_SHUTDOWN)
        return dh_err_set(e, DH_EIO, "coordinator %s refused server %u: %s",
                          c->coord, c->env->server_id, m->u.shutdown.reason);
    if (m->type != DH_WIRE_NONE)
        dh__ds_malformed(c->env, "the coordinator",
                         "%s before the "
                         "registration ack",
                         dh_wire_type_name(m->type));
    return 0;
}

int dh__ds_ctl_register(struct ds_ctl *c, const struct dh_dataserver_opts *o,
                        const char *endpoint, struct dh_err *e)
{
    uint64_t end = dh__mono_ms() + (uint64_t)o->register_timeout_ms, t;
    uint64_t again = 0; /* when to try again after "try again" (0: not) */
    int said = 0;
    struct dh_wire_msg in;
    int rc;

    fill_register(c, o, endpoint);
    c->reg = c->out.u.register_server;
    if ((rc = send_msg(c, &c->out, e)) < 0)
        return rc;
    while ((t = dh__mono_ms()) < end) {
        if (again && t >= again) { /* the live holder may be dead by now */
            again = 0;
            fill_register(c, o, endpoint);
            if ((rc = send_msg(c, &c->out, e)) < 0)
                return rc;
        }
        if (dh__tp_wait(c->sock, (long)((again ? again : end) - t), e) < 0)
            break;
        if ((rc = recv_one(c, &in, e)) < 0)
            return rc;
        if (rc == 0)
            continue;
        rc = check_ack(c, &in, e);
        dh_wire_msg_fini(&in);
        if (rc == 2) {
            if (!said++)
                dh__log(DH_LOG_INFO, "dataserver %u: %s; trying again",
                        c->env->server_id, e->msg);
            again = dh__mono_ms() + 250;
            continue;
        }
        if (rc != 0) {
            c->registered = rc > 0;
            return rc < 0 ? rc : 0;
        }
    }
    if (said)
        return e->code;
    return dh_err_set(e, DH_ETIMEOUT,
                      "coordinator %s did not answer within "
                      "%d ms",
                      c->coord, o->register_timeout_ms);
}
