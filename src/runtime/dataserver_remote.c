/*
 * dataserver_remote.c - the remote path of a DataServer (DESIGN.md 2
 * "Remote path", docs/wire-protocol.md "Framing"): a remote sidecar
 * decodes a routed request into its PRIVATE staging arena and sends the
 * batch to the Route's delivery target, the requester's local DataServer,
 * which copies it into the arena its client maps.
 *
 * Design:
 *   - One payload link per target (transport.h: env->stripes DEALER
 *     sockets, cached by server id and address, at most DS_MAX_PEERS,
 *     least recently used evicted), ZMQ_IMMEDIATE so a message is only
 *     queued to a connected target, a small send HWM and linger 0: nothing
 *     piles up behind a target that is gone.
 *   - A batch is the encoded ResultNotice (task, this server's id,
 *     arena_offset 0, length = tensor bytes, dims, dtype, layout, sample
 *     ids, valid frames) and the tensor bytes, sent zero-copy straight from
 *     the staging slot by dh__tp_link_send(): whole, or a large one cut
 *     into one part per socket so CURVE's cipher runs on several I/O
 *     threads (docs/wire-protocol.md "Payload parts").  ZeroMQ's free
 *     callback of the last part written releases the slot (from an I/O
 *     thread: dh_arena_release() is thread-safe).  The staging arena outlives the
 *     sockets: destroy terminates the context before freeing it.
 *   - An executor (dataserver_internal.h) that wraps a pool executor: jobs
 *     go to the pool; the pool's results come to this file's sink, which
 *     sends them on; what ends a job (delivered: FORWARDED, or an ERROR)
 *     goes to the core's sink.  Parked batches are this file's own state.
 *   - Sends never block the loop.  A target that is not connected yet, or
 *     whose queue is full, parks the job (its slot and encoded header kept)
 *     and the loop retries it every turn; after deliver_timeout_ms, or at
 *     once for a target that cannot be connected at all, the Coordinator
 *     gets an ErrorNotice for the task.  Nothing is dropped silently.  (A
 *     message ZeroMQ accepted can still be lost if the connection breaks
 *     before it is written; the Coordinator's re-routing covers that.)
 *   - Bytes handed to ZeroMQ are counted per target; each heartbeat turns
 *     them into a bytes/s sample per period with traffic and reports the
 *     EWMA in Heartbeat.links (paper 3.3: link bandwidth feedback).
 *
 * Locking: none (dataserver_internal.h); see above for the free callback.
 */
#include <stdio.h>
#include <string.h>

#include "core/log.h"
#include "core/alloc.h"
#include "core/clock.h"
#include "datahelix/batch.h"
#include "runtime/dataserver_internal.h"
#include "runtime/keys.h"
#include "runtime/transport.h"

#define EVICT_LINGER_MS 1000 /* an evicted target may still flush */
#define LINK_ALPHA 0.3

/* A cached DEALER socket to one delivery target. */
struct ds_peer {
    int used;
    uint32_t server_id;
    char addr[DH_WIRE_MAX_ADDR + 1];
    struct dh_tp_link *link;
    uint64_t last_use_ms;
    uint64_t bytes;       /* payload bytes handed to ZeroMQ for it */
    uint64_t bytes_at_hb; /* ... as of the last heartbeat */
    double bps;           /* EWMA of bytes/s over heartbeat periods that
                             carried traffic */
};

/* A completed job whose batch waits for its target to take it. */
struct ds_parked {
    struct ds_job *job; /* NULL: a free entry */
    int parked;         /* the entry holds the slot's reference */
    struct dh_slot_ref slot;
    size_t payload_len; /* tensor bytes at the start of the slot */
    uint8_t *hdr;       /* the encoded ResultNotice (dh_wire_free) */
    size_t hdr_len;
    uint64_t give_up_ms;
    double latency_ms;
};

struct ds_fwd {
    struct ds_exec x; /* first */
    const struct ds_env *env;
    void *ctx;
    struct ds_sink sink;   /* the core's */
    struct ds_exec *pool;  /* reports to fwd_on_pool() */
    struct ds_peer *peers; /* DS_MAX_PEERS */
    struct ds_parked *parked;
    size_t cap;
    struct dh_wire_msg hdr; /* scratch for payload headers */
    uint64_t last_hb_ms;
};

/* What ZeroMQ's free callback needs to release a staging slot. */
struct staging {
    struct dh_arena *arena;
    struct dh_slot_ref ref;
    uint32_t server_id;
};

static void free_staging(void *data, void *hint)
{
    struct staging *st = hint;
    struct dh_err e;

    (void)data;
    if (dh_arena_release(st->arena, &st->ref, &e) < 0)
        dh__log(DH_LOG_ERROR, "dataserver %u: staging slot: %s", st->server_id,
                e.msg);
    dh__free(st);
}

static void peer_close(struct ds_peer *p, int linger_ms)
{
    dh__tp_link_close(&p->link, linger_ms);
    memset(p, 0, sizeof(*p));
}

/* ---- the socket cache ---- */

/* The entry to (re)use for a new target: a free one, else the least
 * recently used. */
static struct ds_peer *peer_victim(struct ds_fwd *f)
{
    struct ds_peer *v = NULL;

    for (int i = 0; i < DS_MAX_PEERS; i++) {
        struct ds_peer *p = &f->peers[i];

        if (!p->used)
            return p;
        if (!v || p->last_use_ms < v->last_use_ms)
            v = p;
    }
    peer_close(v, EVICT_LINGER_MS);
    return v;
}

/* The sockets' options (ZMQ_IMMEDIATE, send HWM 8, no send timeout) are
 * the DH_TP_PAYLOAD_OUT kind's (transport.c); env->stripes of them. */
static int peer_open(struct ds_fwd *f, struct ds_peer *p, uint32_t id,
                     const char *addr, struct dh_err *e)
{
    char peer[64];
    struct dh_tp_opts o = {.kind = DH_TP_PAYLOAD_OUT,
                           .addr = addr,
                           .who = "dataserver",
                           .peer = peer,
                           .auth = f->env->auth};
    int rc;

    snprintf(peer, sizeof(peer), "the delivery target, server %u at", id);
    if ((rc = dh__tp_link_open(f->ctx, &o, f->env->stripes, &p->link, e)) < 0) {
        peer_close(p, 0);
        return rc;
    }
    p->used = 1;
    p->server_id = id;
    snprintf(p->addr, sizeof(p->addr), "%s", addr);
    return 0;
}

static struct ds_peer *peer_get(struct ds_fwd *f, uint32_t id, const char *addr,
                                struct dh_err *e)
{
    struct ds_peer *p = NULL;

    for (int i = 0; i < DS_MAX_PEERS && !p; i++)
        if (f->peers[i].used && f->peers[i].server_id == id)
            p = &f->peers[i];
    if (p && !strcmp(p->addr, addr))
        return p;
    if (p) /* the target moved (re-registered elsewhere) */
        peer_close(p, 0);
    else
        p = peer_victim(f);
    return peer_open(f, p, id, addr, e) < 0 ? NULL : p;
}

/* ---- sending one batch ---- */

/* Sends the batch: header and slot.  1: sent, the slot passed to
 * ZeroMQ; 0: the target cannot take it yet (the entry keeps the slot);
 * < 0: it never will, the peer is closed (dropping whatever part of it was
 * queued). */
static int send_payload(struct ds_fwd *f, struct ds_parked *k,
                        struct ds_peer *p, struct dh_err *e)
{
    const struct ds_job *j = k->job;
    void *data = dh_arena_ptr(f->env->arena, &k->slot);
    struct staging *st = data ? dh__malloc(sizeof(*st)) : NULL;
    struct dh_err se;
    int rc = DH_ENOMEM;

    if (st) {
        *st = (struct staging){f->env->arena, k->slot, f->env->server_id};
        rc = dh__tp_link_send(p->link, k->hdr, k->hdr_len, data, k->payload_len,
                              free_staging, st, &se);
    }
    if (rc == 0) { /* not connected yet, or its queue is full */
        dh__free(st);
        return 0;
    }
    if (rc == DH_ENOMEM) { /* nothing sent: the entry still owns the slot */
        dh__free(st);
        peer_close(p, 0);
        return dh_err_set(e, data ? DH_ENOMEM : DH_EFORMAT, "task %llu: %s",
                          (unsigned long long)j->task.id,
                          data ? "out of memory" : "staging slot lost");
    }
    k->parked = 0; /* the message owned the slot: sent or released */
    if (rc < 0) {
        peer_close(p, 0);
        return dh_err_set(e, DH_EIO,
                          "sending task %llu to server %u at "
                          "%s: %s",
                          (unsigned long long)j->task.id, j->target_id,
                          j->target_addr, se.msg);
    }
    p->bytes += k->payload_len;
    if (dh__tp_part_count(k->payload_len, dh__tp_link_stripes(p->link)) > 1)
        DS_ADD(f->env, parts_out,
               dh__tp_part_count(k->payload_len, dh__tp_link_stripes(p->link)));
    DS_INC(f->env, forwarded);
    DS_ADD(f->env, forwarded_bytes, k->payload_len);
    return 1;
}

/* 1: sent, 0: the target cannot take it yet, < 0: it never will. */
static int try_deliver_once(struct ds_fwd *f, struct ds_parked *k,
                            struct dh_err *e)
{
    const struct ds_job *j = k->job;
    struct ds_peer *p;

    if (j->target_id == f->env->server_id)
        return dh_err_set(e, DH_EINVAL,
                          "remote dataserver %u has no "
                          "delivery target for task %llu (rank %u has no "
                          "local DataServer)",
                          f->env->server_id, (unsigned long long)j->task.id,
                          j->task.rank);
    if (!(p = peer_get(f, j->target_id, j->target_addr, e)))
        return e->code;
    p->last_use_ms = dh__mono_ms();
    return send_payload(f, k, p, e);
}

/* 1: sent, 0: the target cannot take it yet, < 0: it never will, and
 * then DH_EPEERDEAD (but for DH_ENOMEM, ours): the Coordinator takes that
 * for "undelivered", not for a failed sample, and re-routes the task to
 * where it can be delivered (docs/exactly-once.md "Lost delivery
 * target"). */
static int try_deliver(struct ds_fwd *f, struct ds_parked *k, struct dh_err *e)
{
    int rc = try_deliver_once(f, k, e);

    if (rc < 0 && rc != DH_ENOMEM)
        rc = e->code = DH_EPEERDEAD;
    return rc;
}

static void entry_clear(struct ds_fwd *f, struct ds_parked *k)
{
    if (k->parked)
        dh__ds_release(f->env, &k->slot);
    dh_wire_free(k->hdr);
    memset(k, 0, sizeof(*k));
}

/* rc > 0: delivered; rc < 0: the Coordinator hears why.  Ends the job
 * (the core's sink) and frees the entry. */
static void finish(struct ds_fwd *f, struct ds_parked *k, int rc,
                   const struct dh_err *e)
{
    struct ds_job *j = k->job;
    struct ds_done d = {.kind = DS_DONE_FORWARDED,
                        .job = j,
                        .task = j->task,
                        .latency_ms = k->latency_ms};

    if (rc < 0) {
        dh__log(DH_LOG_WARN, "dataserver %u: %s", f->env->server_id, e->msg);
        d.kind = DS_DONE_ERROR;
        d.code = rc;
        d.sample = j->ids[0];
        d.msg = e->msg;
    }
    entry_clear(f, k); /* releases the slot if still parked */
    f->sink.done(f->sink.arg, &d);
}

static struct ds_parked *entry_new(struct ds_fwd *f)
{
    for (size_t i = 0; i < f->cap; i++)
        if (!f->parked[i].job)
            return &f->parked[i];
    return NULL;
}

/* The header: the pool's result with this server's id, arena_offset 0,
 * length = the tensor's bytes and generation 0. */
static int encode_header(struct ds_fwd *f, struct ds_parked *k,
                         const struct ds_done *d, struct dh_err *e)
{
    struct ds_result r = d->res;
    int rc;

    r.slot = (struct dh_slot_ref){.offset = 0, .len = k->payload_len};
    if ((rc = dh__ds_notice_fill(&f->hdr, f->env->server_id, &d->task, &r, e)) <
        0)
        return rc;
    dh__payload_token(f->env->sender_secret, k->job->target_id,
                      f->hdr.u.result.sender_token);
    return dh_wire_encode(&f->hdr, &k->hdr, &k->hdr_len, e);
}

/* The pool's sink: errors end the job at once; a result is sent to its
 * target, or parked until the target takes it. */
static void fwd_on_pool(void *arg, const struct ds_done *d)
{
    struct ds_fwd *f = arg;
    struct ds_job *j = d->job;
    struct ds_parked *k;
    struct dh_err e;
    int rc;

    if (d->kind != DS_DONE_RESULT) {
        f->sink.done(f->sink.arg, d);
        return;
    }
    if (!(k = entry_new(f))) { /* cannot happen: cap = the job table */
        dh__ds_release(f->env, &d->res.slot);
        f->sink.done(f->sink.arg,
                     &(struct ds_done){
                         .kind = DS_DONE_ERROR,
                         .job = j,
                         .task = j->task,
                         .code = DH_ETOOBIG,
                         .sample = j->ids[0],
                         .msg = "too many batches waiting for their target",
                         .latency_ms = d->latency_ms});
        return;
    }
    *k = (struct ds_parked){.job = j,
                            .parked = 1,
                            .slot = d->res.slot,
                            .payload_len = dh_batch_bytes(&j->plan, j->n),
                            .latency_ms = d->latency_ms};
    k->give_up_ms = dh__mono_ms() + (uint64_t)f->env->deliver_timeout_ms;
    if (k->payload_len == 0 || k->payload_len > d->res.slot.len)
        rc = dh_err_set(&e, DH_EINVAL,
                        "task %llu: batch of %zu bytes in a "
                        "slot of %llu",
                        (unsigned long long)j->task.id, k->payload_len,
                        (unsigned long long)d->res.slot.len);
    else if ((rc = encode_header(f, k, d, &e)) == 0)
        rc = try_deliver(f, k, &e);
    if (rc != 0)
        finish(f, k, rc, &e);
}

/* Retries parked batches; gives up (ErrorNotice) past their deadline. */
static void retry(struct ds_fwd *f)
{
    uint64_t now = dh__mono_ms();
    struct dh_err e;

    for (size_t i = 0; i < f->cap; i++) {
        struct ds_parked *k = &f->parked[i];
        int rc;

        if (!k->job)
            continue;
        rc = try_deliver(f, k, &e);
        if (rc == 0 && now >= k->give_up_ms)
            rc = dh_err_set(&e, DH_EPEERDEAD,
                            "remote dataserver %u: the "
                            "delivery target, server %u at %s, did not take "
                            "task %llu within %d ms (unreachable or full)",
                            f->env->server_id, k->job->target_id,
                            k->job->target_addr,
                            (unsigned long long)k->job->task.id,
                            f->env->deliver_timeout_ms);
        if (rc != 0)
            finish(f, k, rc, &e);
    }
}

/* ---- the executor ---- */

static int fwd_submit(struct ds_exec *x, struct ds_job *j, struct dh_err *e)
{
    struct ds_fwd *f = (struct ds_fwd *)x;

    return f->pool->ops->submit(f->pool, j, e);
}

static void fwd_drain(struct ds_exec *x)
{
    struct ds_fwd *f = (struct ds_fwd *)x;

    f->pool->ops->drain(f->pool);
    retry(f);
}

static int fwd_pollitems(struct ds_exec *x, zmq_pollitem_t *it, int cap)
{
    struct ds_fwd *f = (struct ds_fwd *)x;

    return f->pool->ops->pollitems(f->pool, it, cap);
}

static void fwd_load(struct ds_exec *x, uint64_t *queued, uint64_t *busy)
{
    struct ds_fwd *f = (struct ds_fwd *)x;

    f->pool->ops->load(f->pool, queued, busy);
}

/* Heartbeat links: updates the EWMAs and writes up to `cap` links. */
static uint32_t fwd_links(struct ds_exec *x, struct dh_wire_link *out,
                          uint32_t cap)
{
    struct ds_fwd *f = (struct ds_fwd *)x;
    uint64_t now = dh__mono_ms();
    int first = f->last_hb_ms == 0; /* no period to divide by yet */
    double dt = (double)(now - f->last_hb_ms) / 1e3;
    uint32_t n = 0;

    f->last_hb_ms = now;
    if (dt < 1e-3)
        dt = 1e-3;
    for (int i = 0; i < DS_MAX_PEERS; i++) {
        struct ds_peer *p = &f->peers[i];
        uint64_t delta = p->bytes - p->bytes_at_hb;

        if (!p->used)
            continue;
        p->bytes_at_hb = p->bytes;
        if (delta > 0 && !first) { /* an idle link is not a slow one */
            double v = (double)delta / dt;

            p->bps = p->bps == 0 ? v
                                 : (1 - LINK_ALPHA) * p->bps + LINK_ALPHA * v;
        }
        if (p->bps >= 1 && n < cap)
            out[n++] = (struct dh_wire_link){
                .peer_server_id = p->server_id,
                .bytes_per_s = p->bps > (double)DH_WIRE_MAX_BYTES
                                   ? DH_WIRE_MAX_BYTES
                                   : (uint64_t)p->bps};
    }
    return n;
}

/* Sockets close with linger 0 (batches still queued to a target are
 * dropped; ZeroMQ releases their staging slots, at the latest when the
 * core ends the context), then the pool stops, then parked slots go. */
static void fwd_destroy(struct ds_exec *x)
{
    struct ds_fwd *f = (struct ds_fwd *)x;

    if (!f)
        return;
    for (int i = 0; f->peers && i < DS_MAX_PEERS; i++)
        if (f->peers[i].used)
            peer_close(&f->peers[i], 0);
    if (f->pool)
        f->pool->ops->destroy(f->pool);
    for (size_t i = 0; f->parked && i < f->cap; i++)
        entry_clear(f, &f->parked[i]);
    dh_wire_msg_fini(&f->hdr);
    dh__free(f->peers);
    dh__free(f->parked);
    dh__free(f);
}

static const struct ds_exec_ops fwd_ops = {
    .name = "forward",
    .spares = 1, /* its pool substitutes; the header carries them */
    .submit = fwd_submit,
    .drain = fwd_drain,
    .pollitems = fwd_pollitems,
    .load = fwd_load,
    .links = fwd_links,
    .destroy = fwd_destroy,
};

int dh__ds_fwd_create(const struct ds_env *env, void *zmq_ctx, unsigned workers,
                      unsigned queue, size_t max_jobs, struct ds_sink sink,
                      struct ds_exec **out, struct dh_err *e)
{
    struct ds_fwd *f = dh__calloc(1, sizeof(*f));
    int rc;

    if (!f)
        return dh_err_set(e, DH_ENOMEM, "out of memory");
    f->x.ops = &fwd_ops;
    f->env = env;
    f->ctx = zmq_ctx;
    f->sink = sink;
    f->cap = max_jobs;
    dh_wire_msg_init(&f->hdr, DH_WIRE_NONE);
    if (!(f->peers = dh__calloc(DS_MAX_PEERS, sizeof(*f->peers))) ||
        !(f->parked = dh__calloc(max_jobs, sizeof(*f->parked)))) {
        rc = dh_err_set(e, DH_ENOMEM, "out of memory");
        goto out_free;
    }
    if ((rc = dh__ds_pool_create(env, workers, queue, max_jobs,
                                 (struct ds_sink){fwd_on_pool, f}, &f->pool,
                                 e)) < 0)
        goto out_free;
    *out = &f->x;
    return 0;
out_free:
    fwd_destroy(&f->x);
    return rc;
}
