/*
 * dataserver.c - a local DataServer (include/datahelix/dataserver.h):
 * registration with the Coordinator, the serving loop, the job table that
 * turns worker completions into notices, and the table of slots handed to
 * the client so that a Release (offset, generation) can find its length.
 *
 * Design: single-threaded loop over one DEALER socket; the worker pool
 * (workers.h) does the decoding on its own threads.  Completions do not
 * wake zmq_poll(), so the poll waits at most POLL_MS.  The job table is
 * sized to the jobs that can be in the pool at once (queue + threads), so
 * a request is either admitted or answered with an ErrorNotice at once.
 * Locking: none of its own; counters are atomics for stats().
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <zmq.h>

#include "core/alloc.h"
#include "datahelix/arena.h"
#include "datahelix/batch.h"
#include "datahelix/dataserver.h"
#include "datahelix/index.h"
#include "datahelix/wire.h"
#include "datahelix/workers.h"

#define POLL_MS 5
#define QUEUE_PER_THREAD 4
#define N_SENT ((int)DH_ARENA_MAX_SLOTS + 1)
#define EWMA_ALPHA 0.2

/* A job in the pool: what its completion needs to become a notice. */
struct ds_job {
    int used;
    struct dh_wire_task task;
    uint64_t *ids; /* owned */
    uint32_t n;
    struct dh_media_plan plan; /* indices never set (refused by the pool) */
};

/* A slot handed to the client with a ResultNotice. */
struct ds_sent {
    int used;
    struct dh_slot_ref ref;
};

struct dh_dataserver {
    char coord[DH_WIRE_MAX_ADDR + 1];
    uint32_t server_id;
    int heartbeat_ms, alloc_timeout_ms;
    struct dh_index *ix;
    struct dh_arena *arena;
    struct dh_workers *pool;
    unsigned nthreads;
    void *ctx, *sock;
    struct ds_job *jobs;
    size_t n_jobs;
    struct ds_sent sent[N_SENT];
    struct dh_wire_msg in, out;
    uint64_t hb_seq, next_hb_ms;
    double latency_ms;
    int shutdown;
    _Atomic uint64_t st_malformed, st_routes, st_results, st_errors,
        st_releases, st_heartbeats;
};

static uint64_t now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

void dh_dataserver_opts_default(struct dh_dataserver_opts *o)
{
    memset(o, 0, sizeof(*o));
    o->workers = 2;
    o->arena_bytes = (size_t)256 << 20;
    o->heartbeat_ms = 500;
    o->register_timeout_ms = 5000;
    o->alloc_timeout_ms = 30000;
}

static void malformed(struct dh_dataserver *s, const char *fmt, const char *a)
{
    atomic_fetch_add(&s->st_malformed, 1);
    fprintf(stderr, "datahelix: dataserver %u: malformed message from the "
            "coordinator: ", s->server_id);
    fprintf(stderr, fmt, a);
    fputc('\n', stderr);
}

/* ---- sending ---- */

static int send_msg(struct dh_dataserver *s, const struct dh_wire_msg *m,
                    struct dh_err *e)
{
    uint8_t *buf = NULL;
    size_t len = 0;
    int rc = dh_wire_encode(m, &buf, &len, e);

    if (rc < 0)
        return rc;
    if (zmq_send(s->sock, buf, len, ZMQ_DONTWAIT) < 0)
        rc = dh_err_set(e, DH_EIO, "sending %s to coordinator %s: %s",
                        dh_wire_type_name(m->type), s->coord,
                        zmq_strerror(zmq_errno()));
    dh_wire_free(buf);
    return rc;
}

/* Sends s->out; a failure is logged, not fatal (the peer may come back). */
static void send_out(struct dh_dataserver *s)
{
    struct dh_err e;

    if (send_msg(s, &s->out, &e) < 0)
        fprintf(stderr, "datahelix: dataserver %u: %s\n", s->server_id,
                e.msg);
}

static void send_error(struct dh_dataserver *s, const struct dh_wire_task *t,
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
    atomic_fetch_add(&s->st_errors, 1);
}

static void send_heartbeat(struct dh_dataserver *s)
{
    struct dh_workers_stats ws;
    struct dh_wire_heartbeat *h;
    uint64_t depth;

    dh_workers_stats(s->pool, &ws);
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
    send_out(s);
    atomic_fetch_add(&s->st_heartbeats, 1);
}

/* ---- slots handed to the client ---- */

static void remember_slot(struct dh_dataserver *s, const struct dh_slot_ref *r)
{
    int victim = -1;

    for (int i = 0; i < N_SENT && victim < 0; i++)
        if (!s->sent[i].used)
            victim = i;
    /* Full: forget one the client has released already.  There are at
     * most DH_ARENA_MAX_SLOTS live slots, so one of N_SENT is dead. */
    for (int i = 0; i < N_SENT && victim < 0; i++)
        if (!dh_arena_ptr(s->arena, &s->sent[i].ref))
            victim = i;
    if (victim < 0)
        victim = 0; /* lock timed out everywhere: overwrite the oldest */
    s->sent[victim] = (struct ds_sent){.used = 1, .ref = *r};
}

static void on_release(struct dh_dataserver *s,
                       const struct dh_wire_release *r)
{
    struct dh_err e;

    for (int i = 0; i < N_SENT; i++) {
        struct ds_sent *t = &s->sent[i];

        if (!t->used || t->ref.offset != r->slot_offset ||
            t->ref.gen != r->generation)
            continue;
        t->used = 0;
        if (dh_arena_release(s->arena, &t->ref, &e) < 0)
            fprintf(stderr, "datahelix: dataserver %u: release of task "
                    "%llu: %s\n", s->server_id,
                    (unsigned long long)r->task.id, e.msg);
        else
            atomic_fetch_add(&s->st_releases, 1);
        return;
    }
    fprintf(stderr, "datahelix: dataserver %u: release of unknown slot "
            "(offset %llu, generation %u) for task %llu ignored\n",
            s->server_id, (unsigned long long)r->slot_offset,
            r->generation, (unsigned long long)r->task.id);
}

/* Releases a slot no notice carries; a failure is only logged. */
static void drop_slot(struct dh_dataserver *s, const struct dh_slot_ref *r)
{
    struct dh_err e;

    if (dh_arena_release(s->arena, r, &e) < 0)
        fprintf(stderr, "datahelix: dataserver %u: %s\n", s->server_id,
                e.msg);
}

/* ---- jobs ---- */

static struct ds_job *job_free_slot(struct dh_dataserver *s)
{
    for (size_t i = 0; i < s->n_jobs; i++)
        if (!s->jobs[i].used)
            return &s->jobs[i];
    return NULL;
}

static struct ds_job *job_find(struct dh_dataserver *s, uint64_t task_id)
{
    for (size_t i = 0; i < s->n_jobs; i++)
        if (s->jobs[i].used && s->jobs[i].task.id == task_id)
            return &s->jobs[i];
    return NULL;
}

static void job_clear(struct ds_job *j)
{
    dh__free(j->ids);
    memset(j, 0, sizeof(*j));
}

static int job_submit(struct dh_dataserver *s, struct ds_job *j,
                      const struct dh_wire_request *rq, struct dh_err *e)
{
    struct dh_work w;

    if (!(j->ids = dh__malloc(rq->n_samples * sizeof(*j->ids))))
        return dh_err_set(e, DH_ENOMEM, "out of memory");
    memcpy(j->ids, rq->sample_ids, rq->n_samples * sizeof(*j->ids));
    j->n = rq->n_samples;
    j->task = rq->task;
    dh_wire_plan_to_media(&rq->plan, &j->plan);
    w = (struct dh_work){.task_id = rq->task.id, .epoch = rq->task.epoch,
                         .ids = j->ids, .n = j->n, .plan = &j->plan,
                         .alloc_timeout_ms = s->alloc_timeout_ms};
    j->used = 1;
    if (dh_workers_submit(s->pool, &w, 0, e) < 0) {
        job_clear(j);
        return e->code < 0 ? e->code : DH_EIO;
    }
    j->plan.indices = NULL; /* borrowed from rq; the pool copied the plan */
    return 0;
}

static void on_route(struct dh_dataserver *s, const struct dh_wire_route *r)
{
    const struct dh_wire_request *rq = &r->request;
    struct ds_job *j;
    struct dh_err e;

    if (!r->has_request) {
        malformed(s, "%s", "route without a request");
        return;
    }
    dh_err_clear(&e);
    if (!(j = job_free_slot(s)))
        dh_err_set(&e, DH_ETOOBIG, "dataserver %u busy: %zu jobs in flight",
                   s->server_id, s->n_jobs);
    else if (job_submit(s, j, rq, &e) == 0) {
        atomic_fetch_add(&s->st_routes, 1);
        return;
    }
    send_error(s, &rq->task, rq->sample_ids[0], e.code, e.msg);
}

/* dims of the tensor a job's slot holds. */
static uint32_t fill_dims(const struct ds_job *j, uint64_t *dims)
{
    uint64_t t = (uint64_t)dh_batch_frames(&j->plan);

    dims[0] = j->n;
    dims[1] = t;
    if (j->plan.layout == DH_LAYOUT_TCHW) {
        dims[2] = 3;
        dims[3] = j->plan.height;
        dims[4] = j->plan.width;
    } else {
        dims[2] = j->plan.height;
        dims[3] = j->plan.width;
        dims[4] = 3;
    }
    return 5;
}

static int send_result(struct dh_dataserver *s, const struct ds_job *j,
                       const struct dh_work_done *d, struct dh_err *e)
{
    struct dh_wire_result *r;
    uint32_t *valid = dh__malloc(j->n * sizeof(*valid));
    int rc;

    if (!valid)
        return dh_err_set(e, DH_ENOMEM, "out of memory");
    for (uint32_t i = 0; i < j->n; i++)
        valid[i] = d->valid_frames[i] < 0 ? 0 : (uint32_t)d->valid_frames[i];
    dh_wire_msg_fini(&s->out);
    dh_wire_msg_init(&s->out, DH_WIRE_RESULT_NOTICE);
    r = &s->out.u.result;
    r->task = j->task;
    r->server_id = s->server_id;
    r->arena_offset = d->slot.offset;
    r->length = d->slot.len;
    r->slot_generation = d->slot.gen;
    r->ndims = fill_dims(j, r->dims);
    r->dtype = j->plan.dtype;
    r->layout = j->plan.layout;
    rc = dh_wire_set_result_samples(r, j->ids, valid, j->n, e);
    dh__free(valid);
    if (rc == 0)
        rc = send_msg(s, &s->out, e);
    return rc;
}

/* The sample a failed job names: the pool's failed_at, else (a whole-job
 * error such as an id the batch checks refuse up front) the first id that
 * is not in the index, else the first id. */
static uint64_t failed_sample(const struct dh_dataserver *s,
                              const struct ds_job *j,
                              const struct dh_work_done *d)
{
    uint64_t count = dh_index_count(s->ix);

    if (d->failed_at < j->n)
        return j->ids[d->failed_at];
    for (uint32_t i = 0; i < j->n; i++)
        if (j->ids[i] >= count)
            return j->ids[i];
    return j->ids[0];
}

static void on_done(struct dh_dataserver *s, struct dh_work_done *d)
{
    struct ds_job *j = job_find(s, d->task_id);
    struct dh_err e;

    if (!j) { /* cannot happen: every admitted job has an entry */
        fprintf(stderr, "datahelix: dataserver %u: completion of unknown "
                "task %llu\n", s->server_id, (unsigned long long)d->task_id);
        if (d->code == 0)
            drop_slot(s, &d->slot);
        return;
    }
    s->latency_ms = s->latency_ms == 0 ? d->decode_ms
                    : (1 - EWMA_ALPHA) * s->latency_ms +
                      EWMA_ALPHA * d->decode_ms;
    if (d->code < 0) {
        send_error(s, &j->task, failed_sample(s, j, d), d->code, d->msg);
    } else if (send_result(s, j, d, &e) < 0) {
        drop_slot(s, &d->slot);
        send_error(s, &j->task, j->ids[0], e.code, e.msg);
    } else {
        remember_slot(s, &d->slot);
        atomic_fetch_add(&s->st_results, 1);
    }
    job_clear(j);
}

static void collect(struct dh_dataserver *s)
{
    struct dh_work_done d;

    while (dh_workers_wait(s->pool, &d, 0) == 0) {
        on_done(s, &d);
        dh_work_done_fini(&d);
    }
}

/* ---- receiving ---- */

static void dispatch(struct dh_dataserver *s)
{
    switch (s->in.type) {
    case DH_WIRE_ROUTE: on_route(s, &s->in.u.route); break;
    case DH_WIRE_RELEASE: on_release(s, &s->in.u.release); break;
    case DH_WIRE_REGISTER_SERVER: break; /* a repeated ack */
    case DH_WIRE_SHUTDOWN:
        fprintf(stderr, "datahelix: dataserver %u: shutdown requested: %s\n",
                s->server_id, s->in.u.shutdown.reason);
        s->shutdown = 1;
        break;
    default:
        malformed(s, "the coordinator may not send %s",
                  dh_wire_type_name(s->in.type));
    }
}

/* Receives one message into s->in (type DH_WIRE_NONE if it was bad).
 * 1: got one, 0: none waiting, < 0: socket error. */
static int recv_one(struct dh_dataserver *s, struct dh_err *e)
{
    zmq_msg_t msg;
    int more = 0, rc = 1;
    size_t sz = sizeof(more);
    struct dh_err de;

    zmq_msg_init(&msg);
    if (zmq_msg_recv(&msg, s->sock, ZMQ_DONTWAIT) < 0) {
        int err = zmq_errno();

        zmq_msg_close(&msg);
        if (err == EAGAIN || err == EINTR)
            return 0;
        return dh_err_set(e, DH_EIO, "receiving from coordinator %s: %s",
                          s->coord, zmq_strerror(err));
    }
    dh_wire_msg_fini(&s->in);
    if (zmq_getsockopt(s->sock, ZMQ_RCVMORE, &more, &sz) == 0 && more) {
        malformed(s, "%s", "a multipart message");
        while (more && zmq_msg_recv(&msg, s->sock, ZMQ_DONTWAIT) >= 0 &&
               zmq_getsockopt(s->sock, ZMQ_RCVMORE, &more, &sz) == 0)
            ;
    } else if (dh_wire_decode(zmq_msg_data(&msg), zmq_msg_size(&msg), &s->in,
                              &de) < 0) {
        malformed(s, "%s", de.msg);
        dh_wire_msg_init(&s->in, DH_WIRE_NONE);
    }
    zmq_msg_close(&msg);
    return rc;
}

int dh_dataserver_run(struct dh_dataserver *s, const volatile int *stop,
                      struct dh_err *e)
{
    int rc = 0;

    s->shutdown = 0;
    s->next_hb_ms = now_ms();
    while (!s->shutdown && !(stop && *stop)) {
        zmq_pollitem_t it = {.socket = s->sock, .events = ZMQ_POLLIN};

        if (zmq_poll(&it, 1, POLL_MS) < 0 && zmq_errno() != EINTR)
            return dh_err_set(e, DH_EIO, "polling coordinator %s: %s",
                              s->coord, zmq_strerror(zmq_errno()));
        for (int i = 0; i < 64 && !s->shutdown; i++) {
            if ((rc = recv_one(s, e)) <= 0)
                break;
            if (s->in.type != DH_WIRE_NONE)
                dispatch(s);
            dh_wire_msg_fini(&s->in);
        }
        if (rc < 0)
            return rc;
        collect(s);
        if (now_ms() >= s->next_hb_ms) {
            send_heartbeat(s);
            s->next_hb_ms = now_ms() + (uint64_t)s->heartbeat_ms;
        }
    }
    return 0;
}

/* ---- create / destroy ---- */

static int check_opts(const struct dh_dataserver_opts *o, struct dh_err *e)
{
    if (!o || !o->coordinator || !o->coordinator[0] || !o->index_path)
        return dh_err_set(e, DH_EINVAL, "dataserver: coordinator endpoint "
                          "and index path are required");
    if (strlen(o->coordinator) > DH_WIRE_MAX_ADDR ||
        (o->addr && (!o->addr[0] || strlen(o->addr) > DH_WIRE_MAX_ADDR)))
        return dh_err_set(e, DH_EINVAL, "dataserver: bad address");
    if (o->rank >= DH_WIRE_MAX_RANKS || o->workers < 1 ||
        o->workers > DH_WORKERS_MAX_THREADS || o->arena_bytes == 0 ||
        o->heartbeat_ms < 1 || o->register_timeout_ms < 1 ||
        o->alloc_timeout_ms < 0)
        return dh_err_set(e, DH_EINVAL, "dataserver: option out of range "
                          "(rank %u, workers %u, heartbeat %d ms)", o->rank,
                          o->workers, o->heartbeat_ms);
    return 0;
}

static int open_socket(struct dh_dataserver *s, struct dh_err *e)
{
    int zero = 0, to = 1000;
    int64_t maxmsg = DH_WIRE_MAX_MSG;

    if (!(s->ctx = zmq_ctx_new()) ||
        !(s->sock = zmq_socket(s->ctx, ZMQ_DEALER)))
        return dh_err_set(e, DH_EIO, "dataserver: zmq: %s",
                          zmq_strerror(zmq_errno()));
    zmq_setsockopt(s->sock, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_setsockopt(s->sock, ZMQ_SNDTIMEO, &to, sizeof(to));
    zmq_setsockopt(s->sock, ZMQ_RCVTIMEO, &to, sizeof(to));
    zmq_setsockopt(s->sock, ZMQ_MAXMSGSIZE, &maxmsg, sizeof(maxmsg));
    if (zmq_connect(s->sock, s->coord) < 0)
        return dh_err_set(e, DH_EINVAL, "cannot connect to coordinator %s: "
                          "%s", s->coord, zmq_strerror(zmq_errno()));
    return 0;
}

/* Sends RegisterServer and waits (bounded) for its echo. */
static int do_register(struct dh_dataserver *s,
                       const struct dh_dataserver_opts *o, struct dh_err *e)
{
    struct dh_wire_register_server *r;
    uint64_t end = now_ms() + (uint64_t)o->register_timeout_ms, t;
    int rc;

    dh_wire_msg_init(&s->out, DH_WIRE_REGISTER_SERVER);
    r = &s->out.u.register_server;
    r->server_id = s->server_id;
    if (o->addr)
        snprintf(r->addr, sizeof(r->addr), "%s", o->addr);
    else
        snprintf(r->addr, sizeof(r->addr), "local:rank-%u", o->rank);
    r->role = DH_WIRE_ROLE_LOCAL;
    r->rank = o->rank;
    r->workers = o->workers;
    r->arena_bytes = o->arena_bytes;
    if (gethostname(r->host, sizeof(r->host) - 1) < 0)
        r->host[0] = 0;
    if ((rc = send_msg(s, &s->out, e)) < 0)
        return rc;
    while ((t = now_ms()) < end) {
        zmq_pollitem_t it = {.socket = s->sock, .events = ZMQ_POLLIN};

        if (zmq_poll(&it, 1, (long)(end - t)) < 0 && zmq_errno() != EINTR)
            break;
        if ((rc = recv_one(s, e)) < 0)
            return rc;
        if (rc == 0)
            continue;
        if (s->in.type == DH_WIRE_REGISTER_SERVER &&
            s->in.u.register_server.server_id == s->server_id)
            return 0;
        if (s->in.type == DH_WIRE_SHUTDOWN)
            return dh_err_set(e, DH_EIO, "coordinator %s refused server %u: "
                              "%s", s->coord, s->server_id,
                              s->in.u.shutdown.reason);
        if (s->in.type != DH_WIRE_NONE)
            malformed(s, "%s before the registration ack",
                      dh_wire_type_name(s->in.type));
        dh_wire_msg_fini(&s->in);
    }
    return dh_err_set(e, DH_ETIMEOUT, "coordinator %s did not answer within "
                      "%d ms", s->coord, o->register_timeout_ms);
}

static int open_parts(struct dh_dataserver *s,
                      const struct dh_dataserver_opts *o, struct dh_err *e)
{
    int rc;

    s->n_jobs = (size_t)o->workers * (QUEUE_PER_THREAD + 1);
    if (!(s->jobs = dh__calloc(s->n_jobs, sizeof(*s->jobs))))
        return dh_err_set(e, DH_ENOMEM, "out of memory");
    if ((rc = dh_index_open(o->index_path, 0, &s->ix, e)) < 0 ||
        (rc = dh_arena_create(o->arena_bytes, &s->arena, e)) < 0 ||
        (rc = dh_workers_create(o->workers, s->ix, s->arena,
                                o->workers * QUEUE_PER_THREAD, &s->pool,
                                e)) < 0 ||
        (rc = open_socket(s, e)) < 0)
        return rc;
    return do_register(s, o, e);
}

int dh_dataserver_create(const struct dh_dataserver_opts *o,
                         struct dh_dataserver **out, struct dh_err *e)
{
    struct dh_dataserver *s;
    int rc;

    if ((rc = check_opts(o, e)) < 0)
        return rc;
    if (!(s = dh__calloc(1, sizeof(*s))))
        return dh_err_set(e, DH_ENOMEM, "out of memory");
    snprintf(s->coord, sizeof(s->coord), "%s", o->coordinator);
    s->server_id = o->server_id ? o->server_id : o->rank + 1;
    s->heartbeat_ms = o->heartbeat_ms;
    s->alloc_timeout_ms = o->alloc_timeout_ms;
    s->nthreads = o->workers;
    dh_wire_msg_init(&s->in, DH_WIRE_NONE);
    dh_wire_msg_init(&s->out, DH_WIRE_NONE);
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

void dh_dataserver_stats(const struct dh_dataserver *s,
                         struct dh_dataserver_stats *out)
{
    struct dh_dataserver *m = (struct dh_dataserver *)s;

    out->malformed = atomic_load(&m->st_malformed);
    out->routes = atomic_load(&m->st_routes);
    out->results = atomic_load(&m->st_results);
    out->errors = atomic_load(&m->st_errors);
    out->releases = atomic_load(&m->st_releases);
    out->heartbeats = atomic_load(&m->st_heartbeats);
}

void dh_dataserver_destroy(struct dh_dataserver *s)
{
    if (!s)
        return;
    if (s->sock)
        zmq_close(s->sock);
    if (s->ctx)
        zmq_ctx_term(s->ctx);
    dh_workers_destroy(s->pool); /* releases uncollected completions */
    for (size_t i = 0; s->jobs && i < s->n_jobs; i++)
        job_clear(&s->jobs[i]);
    dh__free(s->jobs);
    dh_arena_destroy(s->arena);
    dh_index_close(s->ix);
    dh_wire_msg_fini(&s->in);
    dh_wire_msg_fini(&s->out);
    dh__free(s);
}
