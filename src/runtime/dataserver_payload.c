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
 *   - A striped payload (docs/wire-protocol.md "Payload parts") arrives as
 *     parts, [routing id][part frame][ResultNotice][data], one per
 *     connection of the sender's link.  Each part's header gets the same
 *     checks as a whole payload's (rank, shape) before it is kept; the
 *     transport's reassembly table (transport_parts.c) holds the parts'
 *     frames until the set is complete, then the set is handled exactly as
 *     a whole payload of [header][data frames in index order].  A part
 *     refused or a set dropped (wrong sender, duplicate, wrong size, over
 *     the caps, no new part within deliver_timeout_ms) is counted in
 *     stats.malformed and logged; the task is not notified (as for a
 *     message lost with its connection: it completes through a re-route,
 *     or fails at the client's timeout).  A
 *     set expires only on a turn that found the socket empty, so parts
 *     still queued while the arena was full never count as missing.
 *   - Who may send a payload: only the server the Coordinator placed the
 *     task on, and once.  The Coordinator tells this server (a Route
 *     without a request, target = this server) when it places a task of
 *     this rank on a remote, with the token that server's payload must
 *     carry: a keyed hash of this server's id under the placed server's
 *     own secret (dh__payload_token), which only that process and the
 *     Coordinator know.  So a job member holding the job's key, who can
 *     connect and name any server id in a header, still cannot send as
 *     another server.  The inbox keeps the last DS_EXPECT expectations
 *     (a hash map: a lookup costs O(1)).  A payload whose header names
 *     another server, carries another token, or is for a task delivered
 *     already is refused (counted in stats.malformed, logged with the
 *     sender's address, rate-limited), never placed, and leaves the
 *     expectation as it was, so the placed server's payload is still taken;
 *     the Coordinator hears nothing of it (a stranger cannot fail a task).
 *   - The Route and the payload travel apart, so a payload for a task not
 *     expected yet is parked: up to DS_PARK of them (DS_PARK_PER_PEER per
 *     connection, their bytes within the arena's size; the oldest makes
 *     room), each for env->route_wait_ms.  Parking costs O(1) and never
 *     holds the inbox: payloads behind it are read and placed at once.  Its
 *     Route makes it ready, placed before anything new is read; a park
 *     that saw no Route in time is refused.
 *   - Arena space is asked for without blocking the loop: with the arena
 *     full, the message waits in the inbox (and the socket is not read, so
 *     backpressure reaches the senders through the HWM) and is retried
 *     every loop turn until alloc_timeout_ms; then the Coordinator gets an
 *     ErrorNotice for the task with the arena's "exhausted" message.
 *   - A placed payload is reported to the core's sink as a RESULT with no
 *     job (the core sends the notice and remembers the slot, as for a
 *     local completion); a refused one as an ERROR.  This file sends
 *     nothing itself.
 *   - The announced address is --advertise, else the endpoint actually
 *     bound (ZMQ_LAST_ENDPOINT: port 0 resolved); a wildcard bind without
 *     --advertise is refused, since nobody could reach "0.0.0.0".
 *
 * Locking: none (dataserver_internal.h).
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/log.h"
#include "core/alloc.h"
#include "core/clock.h"
#include "core/idmap.h"
#include "runtime/dataserver_internal.h"
#include "runtime/keys.h"
#include "runtime/transport.h"
#include "runtime/zap.h"

/* Expectations kept: above the tasks of one rank that can be in flight
 * at once (its client's prefetch window); the oldest goes first. */
#define DS_EXPECT 2048
#define DS_PARK 8          /* payloads waiting for their Route */
#define DS_PARK_PER_PEER 2 /* of them from one connection */

struct ds_expect {
    uint64_t task;
    uint32_t server;
    int state; /* 0 free, 1 expected, 2 delivered */
    char token[DH_WIRE_TOKEN_LEN + 1];
};

/* One payload message, as received: the inbox's held one, or a parked
 * one (msg_move() passes it between them). */
struct ds_msg {
    struct dh_wire_msg hdr; /* its decoded ResultNotice */
    zmq_msg_t frames[DS_MAX_FRAMES];
    int n_frames;
    double arrived_ms;      /* when it came in (its place_ms) */
    struct dh_tp_from peer; /* its connection and Peer-Address */
    char from[96];          /* the sender, for logs */
};

/* A payload parked until its Route comes (or route_wait_ms passes). */
struct ds_park {
    int used, ready; /* ready: its Route came */
    struct ds_msg m;
    uint64_t until_ms, bytes;
};

/* One payload message waiting for arena space. */
struct ds_inbox {
    const struct ds_env *env;
    void *sock;                          /* ROUTER */
    char endpoint[DH_WIRE_MAX_ADDR + 1]; /* announced payload address */
    char bound[DH_WIRE_MAX_ADDR + 1];    /* what the socket bound */
    int held;
    struct ds_msg m; /* the payload in hand */
    uint64_t give_up_ms;
    uint64_t tries, releases_seen; /* arena releases at the last try */
    struct dh_tp_asm *parts;       /* striped payloads being assembled */
    struct ds_expect *exp;         /* DS_EXPECT: who may send what */
    struct dh_idmap exp_map;       /* task -> index in exp */
    size_t exp_next;               /* the next entry to reuse */
    struct ds_park park[DS_PARK];
    uint64_t park_bytes;
    struct dh_zap_rl rl; /* refusals' log lines */
};

/* Striped payloads being assembled at once (docs/dataserver.md "Striped
 * payloads"); a set may wait deliver_timeout_ms for its next part. */
#define DS_PART_SETS 64

/* ---- the socket ---- */

static int is_wildcard(const char *ep)
{
    static const char *const any[] = {
        "tcp://*", "tcp://0.0.0.0:", "tcp://[::]:", "tcp://[*]", "tcp://::"};

    for (size_t i = 0; i < sizeof(any) / sizeof(any[0]); i++)
        if (!strncmp(ep, any[i], strlen(any[i])))
            return 1;
    return 0;
}

/* The receive HWM (payload messages queued before senders wait) is the
 * DH_TP_PAYLOAD_IN kind's; every frame is capped at the arena's size. */
static int bind_payload(struct ds_inbox *in, void *ctx, const char *addr,
                        struct dh_err *e)
{
    uint64_t cap = in->env->arena_cap;
    struct dh_tp_opts o = {.kind = DH_TP_PAYLOAD_IN,
                           .addr = addr,
                           .who = "dataserver",
                           .max_msg = cap > DH_WIRE_MAX_MSG ? (int64_t)cap
                                                            : DH_WIRE_MAX_MSG,
                           .auth = in->env->auth,
                           .insecure = in->env->insecure};

    return dh__tp_open(ctx, &o, &in->sock, in->bound, sizeof(in->bound), e);
}

/* How long a set waits for its next part: deliver_timeout_ms, or its
 * default for an env that leaves it 0. */
static uint64_t part_timeout(const struct ds_env *env)
{
    return env->deliver_timeout_ms > 0 ? (uint64_t)env->deliver_timeout_ms
                                       : 5000;
}

static int inbox_bind(struct ds_inbox *in, void *ctx,
                      const struct dh_dataserver_opts *o, struct dh_err *e)
{
    int rc;

    if (!o->advertise && is_wildcard(o->listen))
        return dh_err_set(e, DH_EINVAL,
                          "dataserver: --listen %s binds "
                          "every interface: --advertise ADDR must say where "
                          "remote servers reach it",
                          o->listen);
    if ((rc = bind_payload(in, ctx, o->listen, e)) < 0)
        return rc;
    if (!o->advertise && is_wildcard(in->bound))
        return dh_err_set(e, DH_EINVAL,
                          "dataserver: --listen %s bound %s: "
                          "--advertise ADDR is required",
                          o->listen, in->bound);
    snprintf(in->endpoint, sizeof(in->endpoint), "%s",
             o->advertise ? o->advertise : in->bound);
    return 0;
}

int dh__ds_inbox_open(const struct ds_env *env, void *zmq_ctx,
                      const struct dh_dataserver_opts *o, struct ds_inbox **out,
                      struct dh_err *e)
{
    struct ds_inbox *in = dh__calloc(1, sizeof(*in));
    int rc;

    if (!in)
        return dh_err_set(e, DH_ENOMEM, "out of memory");
    in->env = env;
    dh_wire_msg_init(&in->m.hdr, DH_WIRE_NONE);
    for (int i = 0; i < DS_PARK; i++)
        dh_wire_msg_init(&in->park[i].m.hdr, DH_WIRE_NONE);
    if (!(in->exp = dh__calloc(DS_EXPECT, sizeof(*in->exp))) ||
        dh__idmap_init(&in->exp_map, sizeof(uint32_t), DS_EXPECT, DS_EXPECT) <
            0) {
        dh__free(in->exp);
        dh__free(in);
        return dh_err_set(e, DH_ENOMEM, "out of memory");
    }
    /* Sets hold ZeroMQ's frames until complete: at most twice the arena. */
    if ((rc = dh__tp_asm_create(
             &(struct dh_tp_asm_opts){.max_sets = DS_PART_SETS,
                                      .max_bytes = 2 * env->arena_cap,
                                      .timeout_ms = part_timeout(env)},
             &in->parts, e)) < 0 ||
        (rc = inbox_bind(in, zmq_ctx, o, e)) < 0) {
        dh__ds_inbox_close(in);
        return rc;
    }
    *out = in;
    return 0;
}

static void inbox_clear(struct ds_inbox *in)
{
    dh__tp_frames_close(in->m.frames, in->m.n_frames);
    in->m.n_frames = 0;
    dh_wire_msg_fini(&in->m.hdr);
    in->held = 0;
    in->tries = 0;
}

static void park_free(struct ds_inbox *in, struct ds_park *p)
{
    dh__tp_frames_close(p->m.frames, p->m.n_frames);
    p->m.n_frames = 0;
    dh_wire_msg_fini(&p->m.hdr);
    in->park_bytes -= p->bytes;
    p->used = p->ready = 0;
}

void dh__ds_inbox_close(struct ds_inbox *in)
{
    if (!in)
        return;
    inbox_clear(in);
    for (int i = 0; i < DS_PARK; i++)
        if (in->park[i].used)
            park_free(in, &in->park[i]);
    dh__tp_asm_destroy(in->parts);
    dh__idmap_fini(&in->exp_map);
    dh__free(in->exp);
    if (in->sock) {
        dh__tp_close(&in->sock, 0);
        /* ZeroMQ leaves the socket file of an ipc:// endpoint it bound. */
        if (!strncmp(in->bound, "ipc://", 6) && in->bound[6] != '@' &&
            in->bound[6] != '\0')
            unlink(in->bound + 6);
    }
    dh__free(in);
}

const char *dh__ds_inbox_endpoint(const struct ds_inbox *in)
{
    return in->endpoint;
}

void *dh__ds_inbox_socket(const struct ds_inbox *in)
{
    return in->held ? NULL : in->sock;
}

/* ---- receiving ---- */

/* Reads one whole message into the inbox: the routing id is dropped, at
 * most DS_MAX_FRAMES frames are kept, *extra counts the rest (read and
 * dropped).  1: got one, 0: none waiting (or the socket failed: the
 * loop's poll reports that). */
static int recv_message(struct ds_inbox *in, int *extra)
{
    if (dh__tp_recv_frames(in->sock, &in->m.peer, in->m.frames, DS_MAX_FRAMES,
                           &in->m.n_frames, extra, NULL) <= 0)
        return 0;
    snprintf(in->m.from, sizeof(in->m.from), "payload sender %s",
             in->m.peer.addr[0] ? in->m.peer.addr : "(address unknown)");
    return 1;
}

/* The header's tensor: dims consistent with length and the samples.  The
 * length may pass the frames' bytes: a plan with sound has its rows after
 * them (docs/arena.md "Batch layout"), which only the rank's client knows
 * the size of and checks (client_io.c); the arena bounds it here. */
static int check_shape(const struct ds_inbox *in,
                       const struct dh_wire_result *r, struct dh_err *e)
{
    uint64_t cap = in->env->arena_cap;
    uint64_t bytes = r->dtype == DH_DTYPE_F32 ? 4 : 1;

    if (r->length == 0 || r->length > cap)
        return dh_err_set(e, DH_EPROTO,
                          "task %llu: length %llu is not in "
                          "1..%llu (the arena)",
                          (unsigned long long)r->task.id,
                          (unsigned long long)r->length,
                          (unsigned long long)cap);
    for (uint32_t i = 0; i < r->ndims; i++) /* <= length: the codec */
        bytes *= r->dims[i];
    if (bytes > r->length)
        return dh_err_set(e, DH_EPROTO,
                          "task %llu: dims hold %llu bytes, "
                          "length says %llu",
                          (unsigned long long)r->task.id,
                          (unsigned long long)bytes,
                          (unsigned long long)r->length);
    if (r->n_samples == 0 || r->dims[0] != r->n_samples)
        return dh_err_set(e, DH_EPROTO,
                          "task %llu: dims[0] %llu for %u "
                          "samples",
                          (unsigned long long)r->task.id,
                          (unsigned long long)r->dims[0], r->n_samples);
    return 0;
}

/* Decodes header frame `f` into in->m.hdr and checks it: a ResultNotice
 * for this server's rank with a consistent shape. */
static int check_header(struct ds_inbox *in, const zmq_msg_t *f,
                        struct dh_err *e)
{
    const struct dh_wire_result *r = &in->m.hdr.u.result;
    int rc;

    dh_wire_msg_fini(&in->m.hdr);
    if ((rc = dh__tp_decode(f, &in->m.hdr, e)) < 0)
        return rc;
    if (in->m.hdr.type != DH_WIRE_RESULT_NOTICE)
        return dh_err_set(e, DH_EPROTO, "a %s header, not a result_notice",
                          dh_wire_type_name(in->m.hdr.type));
    if (r->task.rank != in->env->rank)
        return dh_err_set(e, DH_EPROTO,
                          "task %llu is rank %u's; this "
                          "server serves rank %u",
                          (unsigned long long)r->task.id, r->task.rank,
                          in->env->rank);
    return check_shape(in, r, e);
}

static int check_payload(struct ds_inbox *in, int extra, struct dh_err *e)
{
    const struct dh_wire_result *r = &in->m.hdr.u.result;
    uint64_t sum = 0;
    int rc;

    if (in->m.n_frames < 2 || extra > 0)
        return dh_err_set(e, DH_EPROTO,
                          "%d frames: a payload is a header "
                          "and 1..%d data frames",
                          in->m.n_frames + extra, DS_MAX_FRAMES - 1);
    if ((rc = check_header(in, &in->m.frames[0], e)) < 0)
        return rc;
    for (int i = 1; i < in->m.n_frames; i++)
        sum += zmq_msg_size(&in->m.frames[i]);
    if (sum != r->length)
        return dh_err_set(e, DH_EPROTO,
                          "task %llu: data frames hold %llu "
                          "bytes, length says %llu",
                          (unsigned long long)r->task.id,
                          (unsigned long long)sum,
                          (unsigned long long)r->length);
    return 0;
}

/* ---- striped payloads ---- */

/* The message in in->m.frames, if it is a part (frame 0 a part frame): its
 * header is checked, the part goes to the reassembly table and the
 * message's frames are closed.  2: not a part (a whole payload: check it
 * as one); 1: it completed its set, which in->m.frames now holds as a whole
 * payload (header, data frames in order); 0: kept, more to come; < 0:
 * refused (e says why). */
static int take_part(struct ds_inbox *in, int extra, struct dh_err *e)
{
    zmq_msg_t set[DH_TP_MAX_PARTS + 1];
    uint32_t index = 0, count = 0;
    int n = 0, rc;

    if (in->m.n_frames < 1)
        return 2;
    if ((rc = dh__tp_part_decode(zmq_msg_data(&in->m.frames[0]),
                                 zmq_msg_size(&in->m.frames[0]), &index, &count,
                                 e)) <= 0)
        return rc < 0 ? rc : 2;
    if (in->m.n_frames != 3 || extra > 0)
        rc = dh_err_set(e, DH_EPROTO,
                        "%d frames: a payload part is a part frame, a header "
                        "and one data frame",
                        in->m.n_frames + extra);
    else if ((rc = check_header(in, &in->m.frames[1], e)) == 0)
        rc = dh__tp_asm_add(
            in->parts,
            &(struct dh_tp_part){.task = in->m.hdr.u.result.task.id,
                                 .server = in->m.hdr.u.result.server_id,
                                 .host = in->m.peer.addr,
                                 .index = index,
                                 .count = count,
                                 .length = in->m.hdr.u.result.length,
                                 .hdr = &in->m.frames[1],
                                 .data = &in->m.frames[2]},
            dh__mono_ms(), set, &n, e);
    dh__tp_frames_close(in->m.frames, in->m.n_frames);
    dh_wire_msg_fini(&in->m.hdr);
    in->m.n_frames = 0;
    if (rc <= 0)
        return rc;
    DS_ADD(in->env, parts_in, n - 1);
    for (int i = 0; i < n; i++) {
        zmq_msg_init(&in->m.frames[i]);
        zmq_msg_move(&in->m.frames[i], &set[i]);
        zmq_msg_close(&set[i]);
    }
    in->m.n_frames = n;
    return 1;
}

/* Sets that saw no part for deliver_timeout_ms are dropped, each logged. */
static void expire_parts(struct ds_inbox *in)
{
    uint64_t now = dh__mono_ms();
    struct dh_err e;

    dh_err_clear(&e);
    while (dh__tp_asm_expire(in->parts, now, &e) > 0) {
        dh__ds_malformed(in->env, "payload reassembly", "%s", e.msg);
        dh_err_clear(&e);
    }
}

/* ---- placing a payload ---- */

/* The payload could not be placed: the Coordinator hears it for the task
 * (never a silent drop). */
static void refuse(struct ds_inbox *in, struct ds_sink sink, int rc,
                   const char *why)
{
    const struct dh_wire_result *r = &in->m.hdr.u.result;
    char msg[DH_ERR_MSG_MAX + 64];

    snprintf(msg, sizeof(msg), "payload from remote server %u: %s",
             r->server_id, why);
    dh__log(DH_LOG_WARN, "dataserver %u: %s", in->env->server_id, msg);
    sink.done(sink.arg, &(struct ds_done){.kind = DS_DONE_ERROR,
                                          .task = r->task,
                                          .code = rc,
                                          .sample = r->sample_ids[0],
                                          .msg = msg,
                                          .latency_ms = -1});
}

/* Copies the data frames into `ref` and reports the result. */
static void deliver(struct ds_inbox *in, struct ds_sink sink,
                    const struct dh_slot_ref *ref, uint8_t *dst)
{
    const struct dh_wire_result *r = &in->m.hdr.u.result;
    struct ds_done d = {
        .kind = DS_DONE_RESULT, .task = r->task, .latency_ms = -1};
    size_t off = 0;

    for (int i = 1; i < in->m.n_frames; i++) {
        memcpy(dst + off, zmq_msg_data(&in->m.frames[i]),
               zmq_msg_size(&in->m.frames[i]));
        off += zmq_msg_size(&in->m.frames[i]);
    }
    d.res = (struct ds_result){.slot = *ref,
                               .ndims = r->ndims,
                               .dtype = r->dtype,
                               .layout = r->layout,
                               .ids = r->sample_ids,
                               .valid = r->valid_frames,
                               .n = r->n_samples,
                               .service_ms = r->service_ms,
                               .sub_pos = r->sub_pos,
                               .sub_failed = r->sub_failed,
                               .sub_cause = r->sub_cause,
                               .n_subs = r->n_subs,
                               .stages = r->stages};
    /* the remote's times travel on; placing it here is this server's */
    d.res.done_ms = dh__mono_msf();
    d.res.stages.place_ms = d.res.done_ms - in->m.arrived_ms;
    d.res.stages.server_id = r->server_id; /* the remote that prepared it */
    memcpy(d.res.dims, r->dims, sizeof(d.res.dims));
    sink.done(sink.arg, &d); /* the slot's reference goes with it */
}

/* 1 if nothing was released since the last try (no point asking the
 * arena again, which would count one more timeout in its stats). */
static int nothing_freed(struct ds_inbox *in, uint64_t now)
{
    struct dh_arena_stats st;

    if (dh_arena_stats(in->env->arena, &st) < 0)
        return now < in->give_up_ms;
    if (in->tries > 0 && st.releases == in->releases_seen &&
        now < in->give_up_ms)
        return 1;
    in->releases_seen = st.releases;
    in->tries++;
    return 0;
}

/* ---- who may send a payload ---- */

/* A refusal of the sender: counted always, logged at most
 * DH_ZAP_LOG_BURST times per window, so a flood cannot fill the log. */
static void refuse_sender(struct ds_inbox *in, const char *from,
                          const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void refuse_sender(struct ds_inbox *in, const char *from,
                          const char *fmt, ...)
{
    char why[DH_ERR_MSG_MAX];
    uint64_t skipped = 0;
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(why, sizeof(why), fmt, ap);
    va_end(ap);
    if (!dh__zap_rl_allow(&in->rl, dh__mono_ms(), &skipped)) {
        DS_INC(in->env, malformed);
        return;
    }
    if (skipped)
        dh__log(DH_LOG_WARN,
                "dataserver %u: %llu more payloads refused (not logged)",
                in->env->server_id, (unsigned long long)skipped);
    dh__ds_malformed(in->env, from, "%s", why);
}

static struct ds_expect *expect_find(struct ds_inbox *in, uint64_t task)
{
    uint32_t *i = dh__idmap_get(&in->exp_map, task);

    return i ? &in->exp[*i] : NULL;
}

void dh__ds_inbox_expect(struct ds_inbox *in, uint64_t task, uint32_t server,
                         const char *token)
{
    struct ds_expect *x = expect_find(in, task);
    uint32_t *slot;

    if (!x) {
        x = &in->exp[in->exp_next];
        if (x->state)
            (void)dh__idmap_del(&in->exp_map, x->task);
        if (dh__idmap_put(&in->exp_map, task, (void **)&slot) < 0)
            return; /* cannot happen: one entry per ring slot */
        *slot = (uint32_t)in->exp_next;
        in->exp_next = (in->exp_next + 1) % DS_EXPECT;
    }
    *x = (struct ds_expect){.task = task, .server = server, .state = 1};
    snprintf(x->token, sizeof(x->token), "%s", token ? token : "");
    for (int i = 0; i < DS_PARK; i++)
        if (in->park[i].used && in->park[i].m.hdr.u.result.task.id == task)
            in->park[i].ready = 1;
}

/* The held payload's sender: 1 the task's placed server (the expectation
 * is used up), 0 not known yet (park it, if `may_park`), -1 refused
 * (logged and counted; the inbox is cleared, the expectation kept). */
static int check_sender(struct ds_inbox *in, int may_park)
{
    const struct dh_wire_result *r = &in->m.hdr.u.result;
    struct ds_expect *x = expect_find(in, r->task.id);

    if (x && x->state == 1 && x->server == r->server_id && x->token[0] &&
        dh__secret_eq(x->token, r->sender_token)) {
        x->state = 2;
        in->give_up_ms = dh__mono_ms() + (uint64_t)in->env->alloc_timeout_ms;
        return 1;
    }
    if (!x && may_park)
        return 0;
    if (!x)
        refuse_sender(in, in->m.from,
                      "task %llu from server %u: no such task of rank %u "
                      "was placed on a remote server delivering here "
                      "within %d ms; refused",
                      (unsigned long long)r->task.id, r->server_id,
                      in->env->rank, in->env->route_wait_ms);
    else if (x->state == 2)
        refuse_sender(in, in->m.from,
                      "task %llu from server %u: its payload was "
                      "delivered already; refused",
                      (unsigned long long)r->task.id, r->server_id);
    else if (x->server != r->server_id)
        refuse_sender(in, in->m.from,
                      "task %llu from server %u: it was placed on server "
                      "%u; refused",
                      (unsigned long long)r->task.id, r->server_id, x->server);
    else
        refuse_sender(in, in->m.from,
                      "task %llu claims server %u, but its sender token is "
                      "%s: not sent by that server (another member of the "
                      "job?); refused",
                      (unsigned long long)r->task.id, r->server_id,
                      r->sender_token[0] ? "not that server's" : "missing");
    inbox_clear(in);
    return -1;
}

/* ---- parked payloads ---- */

/* Moves message *src into *dst (which owns nothing): the header's arrays
 * and the frames go with it; *src's frames are left empty (closing them
 * frees nothing). */
static void msg_move(struct ds_msg *dst, struct ds_msg *src)
{
    dst->hdr = src->hdr;
    dh_wire_msg_init(&src->hdr, DH_WIRE_NONE);
    for (int i = 0; i < src->n_frames; i++) {
        zmq_msg_init(&dst->frames[i]);
        zmq_msg_move(&dst->frames[i], &src->frames[i]);
    }
    dst->n_frames = src->n_frames; /* src's closes close empties */
    dst->arrived_ms = src->arrived_ms;
    dst->peer = src->peer;
    memcpy(dst->from, src->from, sizeof(dst->from));
}

static int park_count(const struct ds_inbox *in, const struct dh_tp_from *p)
{
    int n = 0;

    for (int i = 0; i < DS_PARK; i++)
        n += in->park[i].used && in->park[i].m.peer.id_len == p->id_len &&
             !memcmp(in->park[i].m.peer.id, p->id, p->id_len);
    return n;
}

static struct ds_park *park_oldest(struct ds_inbox *in)
{
    struct ds_park *o = NULL;

    for (int i = 0; i < DS_PARK; i++)
        if (in->park[i].used &&
            (!o || in->park[i].m.arrived_ms < o->m.arrived_ms))
            o = &in->park[i];
    return o;
}

static void park_refuse(struct ds_inbox *in, struct ds_park *p, const char *why)
{
    refuse_sender(in, p->m.from, "task %llu from server %u: %s; refused",
                  (unsigned long long)p->m.hdr.u.result.task.id,
                  p->m.hdr.u.result.server_id, why);
    park_free(in, p);
}

/* Moves the held payload into a park entry (the inbox is free again), or
 * refuses it: too many from its connection. */
static void park(struct ds_inbox *in)
{
    uint64_t bytes = in->m.hdr.u.result.length;
    struct ds_park *p = NULL;

    if (park_count(in, &in->m.peer) >= DS_PARK_PER_PEER) {
        refuse_sender(in, in->m.from,
                      "task %llu from server %u: %d payloads of this "
                      "connection wait for their Route already; refused",
                      (unsigned long long)in->m.hdr.u.result.task.id,
                      in->m.hdr.u.result.server_id, DS_PARK_PER_PEER);
        inbox_clear(in);
        return;
    }
    for (int i = 0; i < DS_PARK && !p; i++)
        if (!in->park[i].used)
            p = &in->park[i];
    while ((!p || in->park_bytes + bytes > in->env->arena_cap) &&
           park_oldest(in)) {
        struct ds_park *o = park_oldest(in);

        park_refuse(in, o,
                    "made room for a newer payload before its Route "
                    "came");
        p = p ? p : o;
    }
    p->used = 1;
    p->ready = 0;
    msg_move(&p->m, &in->m);
    p->until_ms = dh__mono_ms() + (uint64_t)in->env->route_wait_ms;
    p->bytes = bytes;
    in->park_bytes += bytes;
    inbox_clear(in);
}

/* Moves a ready park entry back into the inbox as the held payload. */
static void unpark(struct ds_inbox *in, struct ds_park *p)
{
    msg_move(&in->m, &p->m);
    park_free(in, p);
    in->held = 1;
}

static void expire_parked(struct ds_inbox *in, uint64_t now)
{
    char why[96];

    for (int i = 0; i < DS_PARK; i++)
        if (in->park[i].used && !in->park[i].ready &&
            now >= in->park[i].until_ms) {
            snprintf(why, sizeof(why),
                     "no such task of rank %u was placed on a remote "
                     "server delivering here within %d ms",
                     in->env->rank, in->env->route_wait_ms);
            park_refuse(in, &in->park[i], why);
        }
}

/* ---- placing ---- */

/* The held payload, its sender checked: 1 done with it (placed or
 * refused), 0 still waiting for arena space. */
static int try_place(struct ds_inbox *in, struct ds_sink sink)
{
    uint64_t now = dh__mono_ms();
    struct dh_slot_ref ref;
    struct dh_err e;
    uint8_t *dst;
    int rc;

    if (nothing_freed(in, now))
        return 0;
    rc = dh_arena_alloc(in->env->arena, in->m.hdr.u.result.length, 0, &ref, &e);
    if (rc == DH_EARENA && now < in->give_up_ms)
        return 0;
    if (rc == DH_EARENA) {
        size_t n = strlen(e.msg);

        snprintf(e.msg + n, sizeof(e.msg) - n, "; the payload waited %d ms",
                 in->env->alloc_timeout_ms);
    }
    if (rc < 0)
        refuse(in, sink, rc, e.msg);
    else if (!(dst = dh_arena_ptr(in->env->arena, &ref))) {
        dh__ds_release(in->env, &ref);
        refuse(in, sink, DH_EIO, "arena slot lost");
    } else {
        deliver(in, sink, &ref, dst);
    }
    inbox_clear(in);
    return 1;
}

/* Parked payloads whose Route came, oldest first: 1 all placed or
 * refused, 0 one waits for arena space (held). */
static int place_ready(struct ds_inbox *in, struct ds_sink sink)
{
    struct ds_park *p;

    for (;;) {
        p = NULL;
        for (int i = 0; i < DS_PARK; i++)
            if (in->park[i].used && in->park[i].ready &&
                (!p || in->park[i].m.arrived_ms < p->m.arrived_ms))
                p = &in->park[i];
        if (!p)
            return 1;
        unpark(in, p);
        if (check_sender(in, 0) > 0 && !try_place(in, sink))
            return 0;
    }
}

void dh__ds_inbox_serve(struct ds_inbox *in, struct ds_sink sink)
{
    struct dh_err e;
    int extra = 0, drained = 0, rc;

    if (!in || (in->held && !try_place(in, sink)) || !place_ready(in, sink))
        return;
    for (int i = 0; i < DS_BURST; i++) {
        if (!recv_message(in, &extra)) {
            drained = 1;
            break;
        }
        dh_err_clear(&e);
        if ((rc = take_part(in, extra, &e)) == 0)
            continue; /* a part kept */
        if (rc == 1)
            extra = 0; /* a set completed: a whole payload now */
        if (rc < 0 || check_payload(in, extra, &e) < 0) {
            refuse_sender(in, in->m.from, "%s", e.msg);
            inbox_clear(in);
            continue;
        }
        in->held = 1;
        in->m.arrived_ms = dh__mono_msf();
        if ((rc = check_sender(in, 1)) == 0)
            park(in);
        if (rc > 0 && !try_place(in, sink))
            break;
    }
    expire_parked(in, dh__mono_ms());
    if (drained)
        expire_parts(in);
}
