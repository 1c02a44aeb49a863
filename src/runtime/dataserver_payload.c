/*
 * dataserver_payload.c - a local DataServer's payload inbox (DESIGN.md 2
 * "Remote path", 8 "Remote payloads"; docs/wire-protocol.md "Framing"):
 * with --listen it binds a ROUTER socket where remote DataServers send the
 * batches they prepared for this server's rank, copies each into a slot of
 * the arena the client maps (the one unavoidable copy on arrival, counted
 * as cross-DS bytes) and tells the Coordinator with a ResultNotice exactly
 * like a local completion, naming THIS server (the client finds the arena
 * by the notice's server_id).
 *
 * Design:
 *   - A payload message is [routing id][ResultNotice][data frames...]; the
 *     header is checked before anything is allocated: a ResultNotice for
 *     this server's rank, 1 <= length <= the arena's capacity, dims whose
 *     bytes are exactly `length`, dims[0] = the sample count, and data
 *     frames (1..DS_MAX_FRAMES - 1) adding up to `length`.  Anything else
 *     is counted in stats.malformed, logged with the sender's address and
 *     dropped; the loop keeps serving.  ZMQ_MAXMSGSIZE caps every frame at
 *     the arena's capacity, so a hostile frame is refused by ZeroMQ itself.
 *   - Arena space is asked for without blocking the loop: with the arena
 *     full, the message waits in the inbox (and the socket is not read, so
 *     backpressure reaches the senders through the HWM) and is retried
 *     every loop turn until alloc_timeout_ms; then the Coordinator gets an
 *     ErrorNotice for the task with the arena's "exhausted" message.
 *   - The announced address is --advertise, else the endpoint actually
 *     bound (ZMQ_LAST_ENDPOINT: port 0 resolved); a wildcard bind without
 *     --advertise is refused, since nobody could reach "0.0.0.0".
 *
 * Locking: none (dataserver_internal.h).
 */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/clock.h"
#include "runtime/dataserver_internal.h"
#include "runtime/transport.h"

/* ---- the socket ---- */

static int is_wildcard(const char *ep)
{
    static const char *const any[] = {"tcp://*", "tcp://0.0.0.0:",
                                      "tcp://[::]:", "tcp://[*]",
                                      "tcp://::"};

    for (size_t i = 0; i < sizeof(any) / sizeof(any[0]); i++)
        if (!strncmp(ep, any[i], strlen(any[i])))
            return 1;
    return 0;
}

/* The receive HWM (payload messages queued before senders wait) is the
 * DH_TP_PAYLOAD_IN kind's; every frame is capped at the arena's size. */
static int bind_payload(struct dh_dataserver *s, const char *addr,
                        struct dh_err *e)
{
    struct dh_tp_opts o = {
        .kind = DH_TP_PAYLOAD_IN, .addr = addr, .who = "dataserver",
        .max_msg = s->arena_cap > DH_WIRE_MAX_MSG ? (int64_t)s->arena_cap
                                                  : DH_WIRE_MAX_MSG};

    return dh__tp_open(s->ctx, &o, &s->psock, s->bound, sizeof(s->bound),
                       e);
}

int dh__ds_payload_open(struct dh_dataserver *s,
                        const struct dh_dataserver_opts *o, struct dh_err *e)
{
    int rc;

    if (!o->advertise && is_wildcard(o->listen))
        return dh_err_set(e, DH_EINVAL, "dataserver: --listen %s binds "
                          "every interface: --advertise ADDR must say where "
                          "remote servers reach it", o->listen);
    if ((rc = bind_payload(s, o->listen, e)) < 0)
        return rc;
    if (!o->advertise && is_wildcard(s->bound))
        return dh_err_set(e, DH_EINVAL, "dataserver: --listen %s bound %s: "
                          "--advertise ADDR is required", o->listen,
                          s->bound);
    snprintf(s->endpoint, sizeof(s->endpoint), "%s",
             o->advertise ? o->advertise : s->bound);
    return 0;
}

static void inbox_clear(struct ds_inbox *in)
{
    dh__tp_frames_close(in->frames, in->n_frames);
    in->n_frames = 0;
    dh_wire_msg_fini(&in->hdr);
    in->held = 0;
    in->tries = 0;
}

void dh__ds_payload_close(struct dh_dataserver *s)
{
    inbox_clear(&s->inbox);
    if (!s->psock)
        return;
    dh__tp_close(&s->psock, 0);
    /* ZeroMQ leaves the socket file of an ipc:// endpoint it bound. */
    if (!strncmp(s->bound, "ipc://", 6) && s->bound[6] != '@' &&
        s->bound[6] != '\0')
        unlink(s->bound + 6);
}

int dh__ds_payload_wants_input(const struct dh_dataserver *s)
{
    return s->psock && !s->inbox.held;
}

/* ---- receiving ---- */

/* Reads one whole message into the inbox: the routing id is dropped, at
 * most DS_MAX_FRAMES frames are kept, *extra counts the rest (read and
 * dropped).  1: got one, 0: none waiting (or the socket failed: the
 * loop's poll reports that). */
static int recv_message(struct dh_dataserver *s, int *extra)
{
    struct ds_inbox *in = &s->inbox;
    struct dh_tp_from from;

    if (dh__tp_recv_frames(s->psock, &from, in->frames, DS_MAX_FRAMES,
                           &in->n_frames, extra, NULL) <= 0)
        return 0;
    snprintf(in->from, sizeof(in->from), "payload sender %s",
             from.addr[0] ? from.addr : "(address unknown)");
    return 1;
}

/* The header's tensor: dims consistent with length and the samples. */
static int check_shape(const struct dh_dataserver *s,
                       const struct dh_wire_result *r, struct dh_err *e)
{
    uint64_t bytes = r->dtype == DH_DTYPE_F32 ? 4 : 1;

    if (r->length == 0 || r->length > s->arena_cap)
        return dh_err_set(e, DH_ETOOBIG, "task %llu: length %llu is not in "
                          "1..%llu (the arena)",
                          (unsigned long long)r->task.id,
                          (unsigned long long)r->length,
                          (unsigned long long)s->arena_cap);
    for (uint32_t i = 0; i < r->ndims; i++) /* <= length: the codec */
        bytes *= r->dims[i];
    if (bytes != r->length)
        return dh_err_set(e, DH_EFORMAT, "task %llu: dims hold %llu bytes, "
                          "length says %llu", (unsigned long long)r->task.id,
                          (unsigned long long)bytes,
                          (unsigned long long)r->length);
    if (r->n_samples == 0 || r->dims[0] != r->n_samples)
        return dh_err_set(e, DH_EFORMAT, "task %llu: dims[0] %llu for %u "
                          "samples", (unsigned long long)r->task.id,
                          (unsigned long long)r->dims[0], r->n_samples);
    return 0;
}

static int check_payload(struct dh_dataserver *s, int extra,
                         struct dh_err *e)
{
    struct ds_inbox *in = &s->inbox;
    const struct dh_wire_result *r = &in->hdr.u.result;
    uint64_t sum = 0;
    int rc;

    if (in->n_frames < 2 || extra > 0)
        return dh_err_set(e, DH_EFORMAT, "%d frames: a payload is a header "
                          "and 1..%d data frames", in->n_frames + extra,
                          DS_MAX_FRAMES - 1);
    if ((rc = dh__tp_decode(&in->frames[0], &in->hdr, e)) < 0)
        return rc;
    if (in->hdr.type != DH_WIRE_RESULT_NOTICE)
        return dh_err_set(e, DH_EFORMAT, "a %s header, not a result_notice",
                          dh_wire_type_name(in->hdr.type));
    if (r->task.rank != s->rank)
        return dh_err_set(e, DH_EFORMAT, "task %llu is rank %u's; this "
                          "server serves rank %u",
                          (unsigned long long)r->task.id, r->task.rank,
                          s->rank);
    if ((rc = check_shape(s, r, e)) < 0)
        return rc;
    for (int i = 1; i < in->n_frames; i++)
        sum += zmq_msg_size(&in->frames[i]);
    if (sum != r->length)
        return dh_err_set(e, DH_EFORMAT, "task %llu: data frames hold %llu "
                          "bytes, length says %llu",
                          (unsigned long long)r->task.id,
                          (unsigned long long)sum,
                          (unsigned long long)r->length);
    return 0;
}

/* ---- placing a payload ---- */

/* The payload could not be placed: the Coordinator hears it for the task
 * (never a silent drop). */
static void refuse(struct dh_dataserver *s, int rc, const char *why)
{
    const struct dh_wire_result *r = &s->inbox.hdr.u.result;
    char msg[DH_ERR_MSG_MAX + 64];

    snprintf(msg, sizeof(msg), "payload from remote server %u: %s",
             r->server_id, why);
    fprintf(stderr, "datahelix: dataserver %u: %s\n", s->server_id, msg);
    dh__ds_send_error(s, &r->task, r->sample_ids[0], rc, msg);
}

/* Copies the data frames into `ref` and sends the notice. */
static void deliver(struct dh_dataserver *s, const struct dh_slot_ref *ref,
                    uint8_t *dst)
{
    struct ds_inbox *in = &s->inbox;
    struct dh_wire_result *r = &in->hdr.u.result;
    struct dh_err e;
    size_t off = 0;

    for (int i = 1; i < in->n_frames; i++) {
        memcpy(dst + off, zmq_msg_data(&in->frames[i]),
               zmq_msg_size(&in->frames[i]));
        off += zmq_msg_size(&in->frames[i]);
    }
    r->server_id = s->server_id; /* the arena the client must map */
    r->arena_offset = ref->offset;
    r->length = ref->len;
    r->slot_generation = ref->gen;
    if (dh__ds_send_msg(s, &in->hdr, &e) < 0) {
        dh__ds_drop_slot(s, ref);
        refuse(s, e.code, e.msg);
        return;
    }
    dh__ds_remember_slot(s, ref);
    DS_INC(s, results);
    DS_INC(s, payloads);
    DS_ADD(s, cross_ds_bytes, ref->len);
}

/* 1 if nothing was released since the last try (no point asking the
 * arena again, which would count one more timeout in its stats). */
static int nothing_freed(struct dh_dataserver *s, uint64_t now)
{
    struct ds_inbox *in = &s->inbox;
    struct dh_arena_stats st;

    if (dh_arena_stats(s->arena, &st) < 0)
        return now < in->give_up_ms;
    if (in->tries > 0 && st.releases == in->releases_seen &&
        now < in->give_up_ms)
        return 1;
    in->releases_seen = st.releases;
    in->tries++;
    return 0;
}

/* 1: done with the inbox (placed or refused), 0: still waiting. */
static int try_place(struct dh_dataserver *s)
{
    struct ds_inbox *in = &s->inbox;
    uint64_t now = dh__mono_ms();
    struct dh_slot_ref ref;
    struct dh_err e;
    uint8_t *dst;
    int rc;

    if (nothing_freed(s, now))
        return 0;
    rc = dh_arena_alloc(s->arena, in->hdr.u.result.length, 0, &ref, &e);
    if (rc == DH_EARENA && now < in->give_up_ms)
        return 0;
    if (rc == DH_EARENA) {
        size_t n = strlen(e.msg);

        snprintf(e.msg + n, sizeof(e.msg) - n, "; the payload waited %d ms",
                 s->alloc_timeout_ms);
    }
    if (rc < 0)
        refuse(s, rc, e.msg);
    else if (!(dst = dh_arena_ptr(s->arena, &ref))) {
        dh__ds_drop_slot(s, &ref);
        refuse(s, DH_EIO, "arena slot lost");
    } else {
        deliver(s, &ref, dst);
    }
    inbox_clear(in);
    return 1;
}

void dh__ds_payload_serve(struct dh_dataserver *s)
{
    struct ds_inbox *in = &s->inbox;
    struct dh_err e;
    int extra = 0;

    if (!s->psock || (in->held && !try_place(s)))
        return;
    for (int i = 0; i < DS_BURST; i++) {
        if (!recv_message(s, &extra))
            break;
        dh_err_clear(&e);
        if (check_payload(s, extra, &e) < 0) {
            dh__ds_malformed(s, in->from, "%s", e.msg);
            inbox_clear(in);
            continue;
        }
        in->held = 1;
        in->give_up_ms = dh__mono_ms() + (uint64_t)s->alloc_timeout_ms;
        if (!try_place(s))
            break;
    }
}
