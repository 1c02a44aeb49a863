/*
 * dataserver_remote.c - the remote path of a DataServer (DESIGN.md 2
 * "Remote path", docs/wire-protocol.md "Framing"): a remote sidecar
 * decodes a routed request into its PRIVATE staging arena and sends the
 * batch to the Route's delivery target, the requester's local DataServer,
 * which copies it into the arena its client maps.
 *
 * Design:
 *   - One DEALER socket per target (cached by server id and address, at
 *     most DS_MAX_PEERS, least recently used evicted), ZMQ_IMMEDIATE so a
 *     message is only queued to a connected target, a small send HWM and
 *     linger 0: nothing piles up behind a target that is gone.
 *   - A batch is one multipart message: frame 0 the encoded ResultNotice
 *     (task, this server's id, arena_offset 0, length = tensor bytes, dims,
 *     dtype, layout, sample ids, valid frames), frame 1 the tensor bytes,
 *     sent zero-copy with zmq_msg_init_data() straight from the staging
 *     slot; ZeroMQ's free callback releases the slot (from its I/O thread:
 *     dh_arena_release() is thread-safe).  The staging arena outlives the
 *     sockets: destroy terminates the context before freeing it.
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

#include "core/alloc.h"
#include "core/clock.h"
#include "datahelix/batch.h"
#include "runtime/dataserver_internal.h"
#include "runtime/transport.h"

#define EVICT_LINGER_MS 1000  /* an evicted target may still flush */
#define LINK_ALPHA 0.3

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
        fprintf(stderr, "datahelix: dataserver %u: staging slot: %s\n",
                st->server_id, e.msg);
    dh__free(st);
}

int dh__ds_remote_init(struct dh_dataserver *s, struct dh_err *e)
{
    if (!(s->peers = dh__calloc(DS_MAX_PEERS, sizeof(*s->peers))))
        return dh_err_set(e, DH_ENOMEM, "out of memory");
    return 0;
}

static void peer_close(struct ds_peer *p, int linger_ms)
{
    dh__tp_close(&p->sock, linger_ms);
    memset(p, 0, sizeof(*p));
}

void dh__ds_remote_fini(struct dh_dataserver *s)
{
    for (int i = 0; s->peers && i < DS_MAX_PEERS; i++)
        if (s->peers[i].used)
            peer_close(&s->peers[i], 0);
    dh__free(s->peers);
    s->peers = NULL;
}

/* ---- the socket cache ---- */

/* The entry to (re)use for a new target: a free one, else the least
 * recently used. */
static struct ds_peer *peer_victim(struct dh_dataserver *s)
{
    struct ds_peer *v = NULL;

    for (int i = 0; i < DS_MAX_PEERS; i++) {
        struct ds_peer *p = &s->peers[i];

        if (!p->used)
            return p;
        if (!v || p->last_use_ms < v->last_use_ms)
            v = p;
    }
    peer_close(v, EVICT_LINGER_MS);
    return v;
}

/* The socket's options (ZMQ_IMMEDIATE, send HWM 8, no send timeout) are
 * the DH_TP_PAYLOAD_OUT kind's (transport.c). */
static int peer_open(struct dh_dataserver *s, struct ds_peer *p, uint32_t id,
                     const char *addr, struct dh_err *e)
{
    char peer[64];
    struct dh_tp_opts o = {.kind = DH_TP_PAYLOAD_OUT, .addr = addr,
                           .who = "dataserver", .peer = peer};
    int rc;

    snprintf(peer, sizeof(peer), "the delivery target, server %u at", id);
    if ((rc = dh__tp_open(s->ctx, &o, &p->sock, NULL, 0, e)) < 0) {
        peer_close(p, 0);
        return rc;
    }
    p->used = 1;
    p->server_id = id;
    snprintf(p->addr, sizeof(p->addr), "%s", addr);
    return 0;
}

static struct ds_peer *peer_get(struct dh_dataserver *s, uint32_t id,
                                const char *addr, struct dh_err *e)
{
    struct ds_peer *p = NULL;

    for (int i = 0; i < DS_MAX_PEERS && !p; i++)
        if (s->peers[i].used && s->peers[i].server_id == id)
            p = &s->peers[i];
    if (p && !strcmp(p->addr, addr))
        return p;
    if (p) /* the target moved (re-registered elsewhere) */
        peer_close(p, 0);
    else
        p = peer_victim(s);
    return peer_open(s, p, id, addr, e) < 0 ? NULL : p;
}

/* ---- sending one batch ---- */

static int encode_header(struct dh_dataserver *s, struct ds_job *j,
                         const struct dh_work_done *d, struct dh_err *e)
{
    int rc = dh__ds_result_fill(&s->out, j, d, s->server_id, e);

    if (rc < 0)
        return rc;
    s->out.u.result.arena_offset = 0;
    s->out.u.result.length = j->payload_len;
    s->out.u.result.slot_generation = 0;
    return dh_wire_encode(&s->out, &j->hdr, &j->hdr_len, e);
}

/* Sends frame 1 (the header is queued): the slot passes to ZeroMQ.  On
 * failure the peer is closed, which drops the half-sent message. */
static int send_payload(struct dh_dataserver *s, struct ds_job *j,
                        struct ds_peer *p, struct dh_err *e)
{
    void *data = dh_arena_ptr(s->arena, &j->slot);
    struct staging *st = data ? dh__malloc(sizeof(*st)) : NULL;
    struct dh_err se;
    int rc = DH_ENOMEM;

    if (st) {
        *st = (struct staging){s->arena, j->slot, s->server_id};
        rc = dh__tp_send_zc(p->sock, data, j->payload_len, free_staging, st,
                            &se);
    }
    if (rc == DH_ENOMEM) { /* nothing sent: the job still owns the slot */
        dh__free(st);
        peer_close(p, 0);
        return dh_err_set(e, data ? DH_ENOMEM : DH_EFORMAT, "task %llu: %s",
                          (unsigned long long)j->task.id,
                          data ? "out of memory" : "staging slot lost");
    }
    j->parked = 0; /* the message owned the slot: sent or released */
    if (rc < 0) {
        peer_close(p, 0);
        return dh_err_set(e, DH_EIO, "sending task %llu to server %u at "
                          "%s: %s", (unsigned long long)j->task.id,
                          j->target_id, j->target_addr, se.msg);
    }
    p->bytes += j->payload_len;
    DS_INC(s, forwarded);
    DS_ADD(s, forwarded_bytes, j->payload_len);
    return 1;
}

/* 1: sent, 0: the target cannot take it yet, < 0: it never will. */
static int try_deliver(struct dh_dataserver *s, struct ds_job *j,
                       struct dh_err *e)
{
    struct ds_peer *p;
    struct dh_err se;
    int rc;

    if (j->target_id == s->server_id)
        return dh_err_set(e, DH_EINVAL, "remote dataserver %u has no "
                          "delivery target for task %llu (rank %u has no "
                          "local DataServer)", s->server_id,
                          (unsigned long long)j->task.id, j->task.rank);
    if (!(p = peer_get(s, j->target_id, j->target_addr, e)))
        return e->code;
    p->last_use_ms = dh__mono_ms();
    if ((rc = dh__tp_send_more(p->sock, j->hdr, j->hdr_len, &se)) == 0)
        return 0; /* not connected yet, or its queue is full */
    if (rc < 0)
        return dh_err_set(e, DH_EIO, "sending task %llu to server %u at "
                          "%s: %s", (unsigned long long)j->task.id,
                          j->target_id, j->target_addr, se.msg);
    return send_payload(s, j, p, e);
}

/* rc > 0: delivered; rc < 0: the Coordinator hears why.  Clears j. */
static void finish(struct dh_dataserver *s, struct ds_job *j, int rc,
                   const struct dh_err *e)
{
    if (rc < 0) {
        fprintf(stderr, "datahelix: dataserver %u: %s\n", s->server_id,
                e->msg);
        dh__ds_send_error(s, &j->task, j->ids[0], rc, e->msg);
    }
    dh__ds_job_clear(s, j); /* releases the slot if still parked */
}

void dh__ds_forward(struct dh_dataserver *s, struct ds_job *j,
                    const struct dh_work_done *d)
{
    struct dh_err e;
    int rc;

    j->slot = d->slot;
    j->parked = 1; /* the job holds the slot's reference from here on */
    j->payload_len = dh_batch_bytes(&j->plan, j->n);
    j->give_up_ms = dh__mono_ms() + (uint64_t)s->deliver_timeout_ms;
    if (j->payload_len == 0 || j->payload_len > d->slot.len)
        rc = dh_err_set(&e, DH_EINVAL, "task %llu: batch of %zu bytes in a "
                        "slot of %llu", (unsigned long long)j->task.id,
                        j->payload_len, (unsigned long long)d->slot.len);
    else if ((rc = encode_header(s, j, d, &e)) == 0)
        rc = try_deliver(s, j, &e);
    if (rc != 0)
        finish(s, j, rc, &e);
}

void dh__ds_forward_retry(struct dh_dataserver *s)
{
    uint64_t now = dh__mono_ms();
    struct dh_err e;

    for (size_t i = 0; i < s->n_jobs; i++) {
        struct ds_job *j = &s->jobs[i];
        int rc;

        if (!j->used || !j->parked)
            continue;
        rc = try_deliver(s, j, &e);
        if (rc == 0 && now >= j->give_up_ms)
            rc = dh_err_set(&e, DH_ETIMEOUT, "remote dataserver %u: the "
                            "delivery target, server %u at %s, did not take "
                            "task %llu within %d ms (unreachable or full)",
                            s->server_id, j->target_id, j->target_addr,
                            (unsigned long long)j->task.id,
                            s->deliver_timeout_ms);
        if (rc != 0)
            finish(s, j, rc, &e);
    }
}

/* ---- link feedback ---- */

uint32_t dh__ds_links(struct dh_dataserver *s, struct dh_wire_link *out,
                      uint32_t cap)
{
    uint64_t now = dh__mono_ms();
    int first = s->last_hb_ms == 0; /* no period to divide by yet */
    double dt = (double)(now - s->last_hb_ms) / 1e3;
    uint32_t n = 0;

    s->last_hb_ms = now;
    if (dt < 1e-3)
        dt = 1e-3;
    for (int i = 0; i < DS_MAX_PEERS; i++) {
        struct ds_peer *p = &s->peers[i];
        uint64_t delta = p->bytes - p->bytes_at_hb;

        if (!p->used)
            continue;
        p->bytes_at_hb = p->bytes;
        if (delta > 0 && !first) { /* an idle link is not a slow one */
            double x = (double)delta / dt;

            p->bps = p->bps == 0 ? x : (1 - LINK_ALPHA) * p->bps +
                                       LINK_ALPHA * x;
        }
        if (p->bps >= 1 && n < cap)
            out[n++] = (struct dh_wire_link){
                .peer_server_id = p->server_id,
                .bytes_per_s = p->bps > (double)DH_WIRE_MAX_BYTES
                                   ? DH_WIRE_MAX_BYTES : (uint64_t)p->bps};
    }
    return n;
}
