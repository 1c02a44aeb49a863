/*
 * dataserver_ctl.c - a DataServer's link to the Coordinator
 * (include/datahelix/dataserver.h, docs/wire-protocol.md): the DEALER
 * socket, registration (role local or remote) with its bounded wait for
 * the ack, heartbeats (queue depth, busy workers, decode latency EWMA and,
 * for a remote server, the bytes/s EWMA of each delivery target), error
 * notices, and receiving / dispatching control messages.  Local and
 * remote servers share all of it.
 *
 * Locking: none (dataserver_internal.h).
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/clock.h"
#include "runtime/dataserver_internal.h"
#include "runtime/transport.h"

void dh__ds_malformed(struct dh_dataserver *s, const char *from,
                      const char *fmt, ...)
{
    char why[DH_ERR_MSG_MAX];
    va_list ap;

    DS_INC(s, malformed);
    va_start(ap, fmt);
    vsnprintf(why, sizeof(why), fmt, ap);
    va_end(ap);
    fprintf(stderr, "datahelix: dataserver %u: malformed message from %s: "
            "%s\n", s->server_id, from, why);
}

/* ---- sending ---- */

int dh__ds_send_msg(struct dh_dataserver *s, const struct dh_wire_msg *m,
                    struct dh_err *e)
{
    return dh__tp_send(s->sock, NULL, m, s->coord_peer, e);
}

/* Sends s->out; a failure is logged, not fatal (the peer may come back). */
static void send_out(struct dh_dataserver *s)
{
    struct dh_err e;

    if (dh__ds_send_msg(s, &s->out, &e) < 0)
        fprintf(stderr, "datahelix: dataserver %u: %s\n", s->server_id,
                e.msg);
}

void dh__ds_send_error(struct dh_dataserver *s, const struct dh_wire_task *t,
                       uint64_t sample, int cause, const char *msg)
{
    struct dh_wire_error *er;
    const char *path = dh_index_path(s->ix, sample);

    dh_wire_msg_fini(&s->out);
    dh_wire_msg_init(&s->out, DH_WIRE_ERROR_NOTICE);
    er = &s->out.u.error;
    er->task = *t;
    er->server_id = s->server_id;
    er->sample_id = sample;
    er->cause = cause < 0 ? cause : DH_EIO;
    snprintf(er->path, sizeof(er->path), "%s", path ? path : "");
    snprintf(er->message, sizeof(er->message), "%s", msg);
    send_out(s);
    DS_INC(s, errors);
}

void dh__ds_heartbeat(struct dh_dataserver *s)
{
    struct dh_workers_stats ws;
    struct dh_wire_heartbeat *h;
    struct dh_wire_link links[DS_MAX_PEERS];
    uint32_t n = s->remote ? dh__ds_links(s, links, DS_MAX_PEERS) : 0;
    uint64_t depth;
    struct dh_err e;

    dh_workers_stats(s->pool, &ws);
    if (s->py) { /* the Python workers do the jobs, not the C pool */
        uint64_t q, b;

        dh__ds_py_load(s, &q, &b);
        ws.queued = q;
        ws.running = b;
    }
    depth = ws.queued + ws.running;
    dh_wire_msg_fini(&s->out);
    dh_wire_msg_init(&s->out, DH_WIRE_HEARTBEAT);
    h = &s->out.u.heartbeat;
    h->server_id = s->server_id;
    h->seq = ++s->hb_seq;
    h->queue_depth = (uint32_t)(depth > DH_WIRE_MAX_QUEUE ? DH_WIRE_MAX_QUEUE
                                                          : depth);
    h->busy_workers = (uint32_t)ws.running;
    h->latency_ms = s->latency_ms > DH_WIRE_MAX_LATENCY_MS
                        ? DH_WIRE_MAX_LATENCY_MS : s->latency_ms;
    if (n > 0 && dh_wire_set_links(h, links, n, &e) < 0)
        fprintf(stderr, "datahelix: dataserver %u: heartbeat links: %s\n",
                s->server_id, e.msg); /* sent without them */
    send_out(s);
    DS_INC(s, heartbeats);
}

void dh__ds_leave(struct dh_dataserver *s)
{
    if (!s->sock || !s->registered || s->coord_stopped)
        return;
    dh_wire_msg_fini(&s->out);
    dh_wire_msg_init(&s->out, DH_WIRE_HEARTBEAT);
    s->out.u.heartbeat.server_id = s->server_id;
    s->out.u.heartbeat.seq = ++s->hb_seq;
    s->out.u.heartbeat.leaving = 1;
    send_out(s);
    dh__tp_linger(s->sock, 200);
}

/* ---- receiving ---- */

static void dispatch(struct dh_dataserver *s)
{
    switch (s->in.type) {
    case DH_WIRE_ROUTE: dh__ds_on_route(s, &s->in.u.route); break;
    case DH_WIRE_RELEASE: dh__ds_on_release(s, &s->in.u.release); break;
    case DH_WIRE_REGISTER_SERVER: break; /* a repeated ack */
    case DH_WIRE_SHUTDOWN:
        fprintf(stderr, "datahelix: dataserver %u: shutdown requested: %s\n",
                s->server_id, s->in.u.shutdown.reason);
        s->shutdown = 1;
        s->coord_stopped = 1;
        break;
    default:
        dh__ds_malformed(s, "the coordinator", "the coordinator may not "
                         "send %s", dh_wire_type_name(s->in.type));
    }
}

/* Receives one message into s->in (type DH_WIRE_NONE if it was bad).
 * 1: got one, 0: none waiting, < 0: socket error. */
static int recv_one(struct dh_dataserver *s, struct dh_err *e)
{
    struct dh_err de;
    int rc;

    dh_wire_msg_fini(&s->in);
    rc = dh__tp_recv(s->sock, NULL, &s->in, s->coord_peer, &de);
    if (dh__tp_dropped(rc)) {
        dh__ds_malformed(s, "the coordinator", "%s", de.msg);
        return 1; /* s->in is DH_WIRE_NONE */
    }
    if (rc < 0)
        return dh_err_set(e, rc, "%s", de.msg);
    return rc;
}

int dh__ds_recv_ctl(struct dh_dataserver *s, struct dh_err *e)
{
    int rc = 0;

    for (int i = 0; i < DS_BURST && !s->shutdown; i++) {
        if ((rc = recv_one(s, e)) <= 0)
            break;
        if (s->in.type != DH_WIRE_NONE)
            dispatch(s);
        dh_wire_msg_fini(&s->in);
    }
    return rc < 0 ? rc : 0;
}

/* ---- socket and registration ---- */

int dh__ds_open_ctl(struct dh_dataserver *s, struct dh_err *e)
{
    struct dh_tp_opts o = {.kind = DH_TP_SERVER_CTL, .addr = s->coord,
                           .who = "dataserver", .peer = "coordinator"};

    snprintf(s->coord_peer, sizeof(s->coord_peer), "coordinator %s",
             s->coord);
    return dh__tp_open(s->ctx, &o, &s->sock, NULL, 0, e);
}

/* The address a server announces: its payload endpoint (local with
 * --listen), o->addr, or a name that says it takes no payloads. */
static void announced_addr(const struct dh_dataserver *s,
                           const struct dh_dataserver_opts *o, char *buf,
                           size_t len)
{
    if (s->endpoint[0])
        snprintf(buf, len, "%s", s->endpoint);
    else if (o->addr)
        snprintf(buf, len, "%s", o->addr);
    else if (s->remote)
        snprintf(buf, len, "remote:server-%u", s->server_id);
    else
        snprintf(buf, len, "local:rank-%u", o->rank);
}

static void fill_register(struct dh_dataserver *s,
                          const struct dh_dataserver_opts *o)
{
    struct dh_wire_register_server *r;

    dh_wire_msg_fini(&s->out);
    dh_wire_msg_init(&s->out, DH_WIRE_REGISTER_SERVER);
    r = &s->out.u.register_server;
    r->server_id = s->server_id;
    announced_addr(s, o, r->addr, sizeof(r->addr));
    r->role = s->remote ? DH_WIRE_ROLE_REMOTE : DH_WIRE_ROLE_LOCAL;
    r->rank = s->remote ? 0 : o->rank;
    r->workers = o->workers;
    r->arena_bytes = o->arena_bytes; /* remote: staging bytes */
    if (gethostname(r->host, sizeof(r->host) - 1) < 0)
        r->host[0] = 0;
}

/* 1: the ack, 0: keep waiting, < 0: refused. */
static int check_ack(struct dh_dataserver *s, struct dh_err *e)
{
    if (s->in.type == DH_WIRE_REGISTER_SERVER &&
        s->in.u.register_server.server_id == s->server_id)
        return 1;
    if (s->in.type == DH_WIRE_SHUTDOWN)
        return dh_err_set(e, DH_EIO, "coordinator %s refused server %u: %s",
                          s->coord, s->server_id, s->in.u.shutdown.reason);
    if (s->in.type != DH_WIRE_NONE)
        dh__ds_malformed(s, "the coordinator", "%s before the registration "
                         "ack", dh_wire_type_name(s->in.type));
    return 0;
}

int dh__ds_register(struct dh_dataserver *s,
                    const struct dh_dataserver_opts *o, struct dh_err *e)
{
    uint64_t end = dh__mono_ms() + (uint64_t)o->register_timeout_ms, t;
    int rc;

    fill_register(s, o);
    if ((rc = dh__ds_send_msg(s, &s->out, e)) < 0)
        return rc;
    while ((t = dh__mono_ms()) < end) {
        if (dh__tp_wait(s->sock, (long)(end - t), e) < 0)
            break;
        if ((rc = recv_one(s, e)) < 0)
            return rc;
        if (rc == 0)
            continue;
        rc = check_ack(s, e);
        dh_wire_msg_fini(&s->in);
        if (rc != 0)
            return rc < 0 ? rc : 0;
    }
    return dh_err_set(e, DH_ETIMEOUT, "coordinator %s did not answer within "
                      "%d ms", s->coord, o->register_timeout_ms);
}
