/*
 * dataserver.c - a DataServer (include/datahelix/dataserver.h), local to
 * one rank or a remote sidecar: options, create / destroy and the serving
 * loop.  The parts live in their own files (dataserver_internal.h lists
 * them): the Coordinator link, the job table, the client link, the payload
 * inbox (local --listen) and forwarding (remote).
 *
 * Design: single-threaded loop; the worker pool (workers.h) decodes on its
 * own threads.  Each turn: zmq_poll() for at most DS_POLL_MS over the
 * Coordinator socket, the client link, and (local --listen) the payload
 * socket; then control messages, payloads, worker completions (which do
 * not wake the poll), batches waiting for their target (remote), and a
 * heartbeat when one is due.  Local and remote run the same loop; only
 * what a completion turns into differs.
 * Locking: none of its own; counters are atomics for stats().
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "runtime/dataserver_internal.h"
#include "runtime/local_link.h"

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
    o->client_fd = -1;
    o->python_workers = 1;
    o->python_job_timeout_ms = 600000;
}

/* ---- the loop ---- */

static int serve_once(struct dh_dataserver *s, struct dh_err *e)
{
    zmq_pollitem_t it[4 + DS_PY_MAX_WORKERS] = {
        {.socket = s->sock, .events = ZMQ_POLLIN}};
    int n = 1, li = -1, ai = -1, rc;

    if (s->link_fd >= 0) {
        li = n;
        it[n++] = (zmq_pollitem_t){.fd = s->link_fd, .events = ZMQ_POLLIN};
    }
    if (s->listen_fd >= 0) {
        ai = n;
        it[n++] = (zmq_pollitem_t){.fd = s->listen_fd, .events = ZMQ_POLLIN};
    }
    if (dh__ds_payload_wants_input(s))
        it[n++] = (zmq_pollitem_t){.socket = s->psock, .events = ZMQ_POLLIN};
    if (s->py) /* a worker's message wakes the loop (dh__ds_collect) */
        n += dh__ds_py_pollitems(s, it + n);
    if (zmq_poll(it, n, DS_POLL_MS) < 0 && zmq_errno() != EINTR)
        return dh_err_set(e, DH_EIO, "polling coordinator %s: %s", s->coord,
                          zmq_strerror(zmq_errno()));
    if (li >= 0 && (it[li].revents & (ZMQ_POLLIN | ZMQ_POLLERR)))
        dh__ds_on_link(s);
    if (ai >= 0 && (it[ai].revents & ZMQ_POLLIN))
        dh__ds_on_accept(s);
    if ((rc = dh__ds_recv_ctl(s, e)) < 0)
        return rc;
    dh__ds_payload_serve(s);
    dh__ds_collect(s);
    if (s->remote)
        dh__ds_forward_retry(s);
    if (dh__mono_ms() >= s->next_hb_ms) {
        dh__ds_heartbeat(s);
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
    if (o->remote && (o->listen || o->advertise || o->client_fd >= 0 ||
                      o->client_socket))
        return dh_err_set(e, DH_EINVAL, "dataserver: a remote server takes "
                          "no --listen, --advertise or client link");
    if (o->advertise && !o->listen)
        return dh_err_set(e, DH_EINVAL, "dataserver: --advertise needs "
                          "--listen");
    if (o->listen && o->addr)
        return dh_err_set(e, DH_EINVAL, "dataserver: with --listen the "
                          "announced address is the bound one or "
                          "--advertise, not `addr`");
    /* Unpickling runs code: only a dataset named by the client that
     * started this server (its command line) is accepted. */
    if (o->python_dataset && (o->remote || o->client_fd < 0))
        return dh_err_set(e, DH_EINVAL, "dataserver: --python-dataset needs "
                          "--client-fd (a dataset is accepted only from the "
                          "client that started this server)");
    return 0;
}

static int check_opts(const struct dh_dataserver_opts *o, struct dh_err *e)
{
    if (!o || !o->coordinator || !o->coordinator[0] || !o->index_path)
        return dh_err_set(e, DH_EINVAL, "dataserver: coordinator endpoint "
                          "and index path are required");
    if (bad_addr(o->coordinator) || bad_addr(o->addr) ||
        bad_addr(o->listen) || bad_addr(o->advertise))
        return dh_err_set(e, DH_EINVAL, "dataserver: bad address (empty or "
                          "over %u bytes)", DH_WIRE_MAX_ADDR);
    if (o->rank >= DH_WIRE_MAX_RANKS || o->workers < 1 ||
        o->workers > DH_WORKERS_MAX_THREADS || o->arena_bytes == 0 ||
        o->heartbeat_ms < 1 || o->register_timeout_ms < 1 ||
        o->alloc_timeout_ms < 0 || o->deliver_timeout_ms < 1 ||
        (o->client_fd >= 0 && o->client_socket) ||
        o->server_id == UINT32_MAX) /* the Coordinator's own notices */
        return dh_err_set(e, DH_EINVAL, "dataserver: option out of range "
                          "(rank %u, workers %u, heartbeat %d ms)", o->rank,
                          o->workers, o->heartbeat_ms);
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

    if (dh_arena_stats(s->arena, &st) < 0)
        return dh_err_set(e, DH_ETIMEOUT, "dataserver %u: arena lock stuck",
                          s->server_id);
    s->arena_cap = st.capacity;
    return 0;
}

static int open_sockets(struct dh_dataserver *s,
                        const struct dh_dataserver_opts *o, struct dh_err *e)
{
    int rc;

    if (!(s->ctx = zmq_ctx_new()))
        return dh_err_set(e, DH_EIO, "dataserver: zmq: %s",
                          zmq_strerror(zmq_errno()));
    if ((rc = dh__ds_open_ctl(s, e)) < 0)
        return rc;
    if (o->listen && (rc = dh__ds_payload_open(s, o, e)) < 0)
        return rc;
    if (s->remote && (rc = dh__ds_remote_init(s, e)) < 0)
        return rc;
    return 0;
}

static int open_parts(struct dh_dataserver *s,
                      const struct dh_dataserver_opts *o, struct dh_err *e)
{
    int rc;

    size_t jobs = (size_t)o->workers * (DS_QUEUE_PER_THREAD + 1);

    if (o->python_dataset && jobs < DS_PY_JOBS)
        jobs = DS_PY_JOBS;
    if ((rc = dh__ds_jobs_init(s, jobs, e)) < 0 ||
        (rc = dh_index_open(o->index_path, 0, &s->ix, e)) < 0 ||
        (rc = dh_arena_create(o->arena_bytes, &s->arena, e)) < 0 ||
        (rc = arena_capacity(s, e)) < 0 ||
        (rc = dh_workers_create(o->workers, s->ix, s->arena,
                                o->workers * DS_QUEUE_PER_THREAD, &s->pool,
                                e)) < 0 ||
        (rc = open_sockets(s, o, e)) < 0 ||
        (o->python_dataset && (rc = dh__ds_py_create(s, o, e)) < 0))
        return rc;
    if (o->client_socket &&
        (s->listen_fd = dh__link_listen(o->client_socket, e)) < 0)
        return s->listen_fd;
    if ((rc = dh__ds_register(s, o, e)) < 0)
        return rc;
    s->registered = 1;
    if (s->link_fd >= 0 && (rc = dh__ds_send_hello(s, s->link_fd, e)) < 0)
        return rc;
    return 0;
}

static struct dh_dataserver *alloc_server(const struct dh_dataserver_opts *o)
{
    struct dh_dataserver *s = dh__calloc(1, sizeof(*s));

    if (!s)
        return NULL;
    s->link_fd = o->client_fd;
    s->listen_fd = -1;
    s->remote = o->remote ? 1 : 0;
    s->rank = o->remote ? 0 : o->rank;
    snprintf(s->coord, sizeof(s->coord), "%s", o->coordinator);
    s->server_id = o->server_id ? o->server_id
                   : o->remote  ? default_remote_id()
                                : o->rank + 1;
    s->heartbeat_ms = o->heartbeat_ms;
    s->alloc_timeout_ms = o->alloc_timeout_ms;
    s->sample_timeout_ms = o->sample_timeout_ms < 0 ? 0
                                                    : o->sample_timeout_ms;
    s->deliver_timeout_ms = o->deliver_timeout_ms;
    dh_wire_msg_init(&s->in, DH_WIRE_NONE);
    dh_wire_msg_init(&s->out, DH_WIRE_NONE);
    dh_wire_msg_init(&s->inbox.hdr, DH_WIRE_NONE);
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
    if ((rc = open_parts(s, o, e)) < 0) {
        dh_dataserver_destroy(s);
        return rc;
    }
    *out = s;
    return 0;
}

int dh_dataserver_arena_fd(const struct dh_dataserver *s)
{
    return dh_arena_fd(s->arena);
}

const char *dh_dataserver_endpoint(const struct dh_dataserver *s)
{
    return s->endpoint[0] ? s->endpoint : NULL;
}

uint32_t dh_dataserver_id(const struct dh_dataserver *s)
{
    return s->server_id;
}

void dh_dataserver_stats(const struct dh_dataserver *s,
                         struct dh_dataserver_stats *out)
{
    struct dh_dataserver *m = (struct dh_dataserver *)s;

#define DS_LOAD_(n) out->n = atomic_load_explicit(&m->st_##n, \
                                                  memory_order_relaxed);
    DS_STATS(DS_LOAD_)
#undef DS_LOAD_
}

/* Sockets close before the context ends, and the context ends before the
 * arena goes: ZeroMQ's free callbacks of staging slots still queued
 * (remote) run inside zmq_ctx_term(). */
void dh_dataserver_destroy(struct dh_dataserver *s)
{
    if (!s)
        return;
    dh__ds_py_destroy(s); /* its workers use the arena; link_fd says
                             whether the client went away */
    if (s->link_fd >= 0)
        close(s->link_fd);
    if (s->listen_fd >= 0)
        close(s->listen_fd);
    dh__ds_payload_close(s);
    dh__ds_remote_fini(s);
    dh__ds_leave(s);
    if (s->sock)
        zmq_close(s->sock);
    if (s->ctx)
        zmq_ctx_term(s->ctx);
    dh_workers_destroy(s->pool); /* releases uncollected completions */
    dh__ds_jobs_fini(s);         /* and parked batches' staging slots */
    dh_arena_destroy(s->arena);
    dh_index_close(s->ix);
    dh_wire_msg_fini(&s->in);
    dh_wire_msg_fini(&s->out);
    dh__free(s);
}
