/* test_remote.c - the remote path (DESIGN.md 2 "Remote path"): a real
 * Coordinator (round-robin), a local DataServer listening for payloads on
 * tcp://127.0.0.1:0, a remote DataServer and a fake client DEALER speaking
 * the wire codec, each loop in its own thread.
 *   - A batch placed on the remote reaches the client as a ResultNotice
 *     naming the LOCAL server, whose slot in the local arena holds exactly
 *     what dh_batch_decode() of the same ids gives; cross-DS bytes are
 *     counted on both sides and the staging slot goes back.
 *   - Malformed payload messages (garbage header, wrong frame sizes, a
 *     header alone, too many frames, a length over the arena, dims that
 *     disagree, another rank's task, a header of the wrong type) are
 *     counted and the local server keeps serving.
 *   - A delivery target nobody listens on gives the client an ErrorNotice
 *     from the remote; so do a Route naming no target and a bad address
 *     (fake Coordinator), and the remote's heartbeats report the bytes/s
 *     of the link it used.
 *   - --listen / --advertise / --remote option rules.
 * Every receive and every wait has a timeout. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <zmq.h>

#include "datahelix/arena.h"
#include "datahelix/batch.h"
#include "datahelix/coordinator.h"
#include "datahelix/dataserver.h"
#include "datahelix/gendata.h"
#include "datahelix/index.h"
#include "datahelix/wire.h"

/* The rank token the fake client and the local server share. */
#define RANK_TOKEN "0123456789abcdef0123456789abcdef"
#define NCLIPS 2
#define WAIT_MS 10000 /* a message that should come (decode under ASan) */
#define LOCAL_ID 1
#define REMOTE_ID 9
#define ARENA_BYTES (4u << 20)
/* Set: main() runs only a test that fails with its cluster up, then exits
 * with the number of loops still running (a_failed_test_leaves_nothing). */
#define LEFT_ENV "DH_TEST_REMOTE_LEFT"

#include "loop_fixture.h"
#include "runtime/keys.h"
#include "runtime/transport.h"

static int setup(void **state)
{
    (void)state;
    return loop_fixture_setup(getenv(LEFT_ENV) ? "remote-left" : "remote", 11);
}

/* ---- what a test leaves when an assertion ends it early ----
 *
 * cmocka leaves a failing test by a longjmp: the lines that stop its loops
 * and free its servers never run, and the loops would go on beside the
 * next tests.  So every loop, ZeroMQ context and key file a test starts is
 * listed here (each in static storage: the test's frame is gone by then)
 * and the teardown stops, frees and removes whatever is still listed: a
 * loop that stops is joined and its server freed; a context is shut down
 * (not terminated: a socket the test left open would block that). */
#define LEFT_MAX 8

static struct {
    struct runner *runners[LEFT_MAX];
    void *ctxs[LEFT_MAX];
    char files[LEFT_MAX][700];
    size_t n_runners, n_ctxs, n_files;
} left;

static void run(struct runner *r)
{
    assert_true(left.n_runners < LEFT_MAX);
    start_runner(r);
    left.runners[left.n_runners++] = r;
}

/* The test's own stop: the loop must stop within 1 s and return 0. */
static void halt(struct runner *r)
{
    for (size_t i = 0; i < left.n_runners; i++)
        if (left.runners[i] == r)
            left.runners[i] = left.runners[--left.n_runners];
    stop_runner(r);
}

static void *new_ctx(void)
{
    void *ctx = zmq_ctx_new();

    assert_non_null(ctx);
    assert_true(left.n_ctxs < LEFT_MAX);
    left.ctxs[left.n_ctxs++] = ctx;
    return ctx;
}

static void end_ctx(void *ctx)
{
    for (size_t i = 0; i < left.n_ctxs; i++)
        if (left.ctxs[i] == ctx)
            left.ctxs[i] = left.ctxs[--left.n_ctxs];
    zmq_ctx_term(ctx);
}

static void left_file(const char *path)
{
    if (left.n_files < LEFT_MAX)
        snprintf(left.files[left.n_files++], sizeof(left.files[0]), "%s", path);
}

static int teardown(void **state)
{
    int rc = 0;

    (void)state;
    while (left.n_runners) {
        struct runner *r = left.runners[--left.n_runners];

        if (runner_stop(r, 2000) < 0) {
            rc = -1; /* still running: its server must stay */
            continue;
        }
        if (r->c)
            dh_coordinator_destroy(r->c);
        if (r->s)
            dh_dataserver_destroy(r->s);
        r->c = NULL;
        r->s = NULL;
    }
    while (left.n_ctxs)
        zmq_ctx_shutdown(left.ctxs[--left.n_ctxs]);
    while (left.n_files)
        unlink(left.files[--left.n_files]);
    return rc;
}

static void local_opts(struct dh_dataserver_opts *o, const char *coord)
{
    dh_dataserver_opts_default(o);
    o->token = RANK_TOKEN;
    o->coordinator = coord;
    o->index_path = dhx;
    o->rank = 0;
    o->server_id = LOCAL_ID;
    o->workers = 1;
    o->arena_bytes = ARENA_BYTES;
    o->heartbeat_ms = 50;
    o->register_timeout_ms = WAIT_MS;
    o->listen = "tcp://127.0.0.1:0";
}

static void remote_opts(struct dh_dataserver_opts *o, const char *coord)
{
    dh_dataserver_opts_default(o);
    o->coordinator = coord;
    o->index_path = dhx;
    o->remote = 1;
    o->server_id = REMOTE_ID;
    o->workers = 1;
    o->arena_bytes = ARENA_BYTES;
    o->heartbeat_ms = 50;
    o->register_timeout_ms = WAIT_MS;
}

static struct dh_dataserver *make(const struct dh_dataserver_opts *o)
{
    struct dh_dataserver *s = NULL;
    struct dh_err e;

    if (dh_dataserver_create(o, &s, &e))
        fail_msg("dataserver: %s", e.msg);
    return s;
}

/* ---- the fake peers' side of the wire ---- */

static void send_msg(void *s, const struct dh_wire_msg *m, int flags)
{
    uint8_t *buf = NULL;
    size_t len = 0;
    struct dh_err e;

    if (dh_wire_encode(m, &buf, &len, &e))
        fail_msg("encode: %s", e.msg);
    assert_int_equal(zmq_send(s, buf, len, flags), (int)len);
    dh_wire_free(buf);
}

/* The next message within ms (a ROUTER's identity frame into id/idlen;
 * further frames into extra/extra_len, at most one kept): 0 or -1. */
static int recv_msg(void *s, int router, uint8_t *id, size_t *idlen,
                    struct dh_wire_msg *m, uint8_t *extra, size_t *extra_len,
                    int ms)
{
    uint64_t end = now_ms() + (uint64_t)ms;
    static uint8_t buf[1 << 16];
    zmq_pollitem_t it = {.socket = s, .events = ZMQ_POLLIN};
    int n, more = 0;
    size_t sz = sizeof(more);

    do {
        uint64_t now = now_ms();

        if (now >= end || zmq_poll(&it, 1, (long)(end - now)) <= 0)
            return -1;
        if (router && (n = zmq_recv(s, id, 256, ZMQ_DONTWAIT)) >= 0)
            *idlen = (size_t)n;
        n = zmq_recv(s, buf, sizeof(buf), ZMQ_DONTWAIT);
    } while (n < 0);
    assert_true((size_t)n <= sizeof(buf));
    assert_int_equal(dh_wire_decode(buf, (size_t)n, m, NULL), 0);
    zmq_getsockopt(s, ZMQ_RCVMORE, &more, &sz);
    if (extra_len)
        *extra_len = 0;
    while (more) {
        static uint8_t junk[1];

        n = extra ? zmq_recv(s, extra, 1 << 20, 0)
                  : zmq_recv(s, junk, sizeof(junk), 0);
        assert_true(n >= 0);
        if (extra_len) {
            assert_int_equal(*extra_len, 0); /* one data frame */
            *extra_len = (size_t)n;
        }
        zmq_getsockopt(s, ZMQ_RCVMORE, &more, &sz);
    }
    return 0;
}

/* The next message of `type` within ms (others skipped): 0 or -1. */
static int recv_type(void *s, int router, uint8_t *id, size_t *idlen,
                     enum dh_wire_type type, struct dh_wire_msg *m, int ms)
{
    uint64_t end = now_ms() + (uint64_t)ms;

    while (now_ms() < end) {
        if (recv_msg(s, router, id, idlen, m, NULL, NULL,
                     (int)(end - now_ms())) < 0)
            return -1;
        if (m->type == type)
            return 0;
        dh_wire_msg_fini(m);
    }
    return -1;
}

/* A DEALER that is a CURVE client holding `k` (NULL: plain), as
 * transport.c makes one. */
static void *keyed_dealer(void *ctx, const char *endpoint,
                          const struct dh_keys *k)
{
    void *s;
    int zero = 0, to = 1000;

    if (!k)
        return dealer(ctx, endpoint);
    assert_non_null(s = zmq_socket(ctx, ZMQ_DEALER));
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_setsockopt(s, ZMQ_SNDTIMEO, &to, sizeof(to));
    assert_int_equal(zmq_setsockopt(s, ZMQ_CURVE_SERVERKEY, dh__keys_server(k),
                                    DH_KEY_Z85_LEN),
                     0);
    assert_int_equal(
        zmq_setsockopt(s, ZMQ_CURVE_PUBLICKEY, k->pub, DH_KEY_Z85_LEN), 0);
    assert_int_equal(
        zmq_setsockopt(s, ZMQ_CURVE_SECRETKEY, k->sec, DH_KEY_Z85_LEN), 0);
    assert_int_equal(zmq_connect(s, endpoint), 0);
    return s;
}

static void *client(void *ctx, const char *endpoint, const struct dh_keys *k)
{
    void *s = keyed_dealer(ctx, endpoint, k);
    struct dh_wire_msg m;

    dh_wire_msg_init(&m, DH_WIRE_REGISTER_CLIENT);
    m.u.register_client.rank = 0;
    m.u.register_client.world_size = 1;
    m.u.register_client.pid = (uint32_t)getpid();
    snprintf(m.u.register_client.token, sizeof(m.u.register_client.token), "%s",
             RANK_TOKEN);
    send_msg(s, &m, 0);
    dh_wire_msg_fini(&m);
    assert_int_equal(
        recv_type(s, 0, NULL, NULL, DH_WIRE_REGISTER_CLIENT, &m, WAIT_MS), 0);
    dh_wire_msg_fini(&m);
    return s;
}

/* Sends a request; returns the server its Route ack names. */
static uint32_t send_request(void *cl, uint32_t step, const uint64_t *ids,
                             uint32_t n)
{
    struct dh_wire_msg m;
    uint32_t to;

    dh_wire_msg_init(&m, DH_WIRE_DESCRIPTOR_REQUEST);
    fill_request(&m.u.request, step, ids, n);
    send_msg(cl, &m, 0);
    dh_wire_msg_fini(&m);
    assert_int_equal(recv_type(cl, 0, NULL, NULL, DH_WIRE_ROUTE, &m, WAIT_MS),
                     0);
    assert_int_equal(m.u.route.task.step, step);
    to = m.u.route.server_id;
    dh_wire_msg_fini(&m);
    return to;
}

/* The next ResultNotice or ErrorNotice within ms: 0 or -1. */
static int next_done(void *cl, struct dh_wire_msg *done, int ms)
{
    uint64_t end = now_ms() + (uint64_t)ms;

    while (now_ms() < end) {
        if (recv_msg(cl, 0, NULL, NULL, done, NULL, NULL,
                     (int)(end - now_ms())) < 0)
            return -1;
        if (done->type == DH_WIRE_RESULT_NOTICE ||
            done->type == DH_WIRE_ERROR_NOTICE)
            return 0;
        dh_wire_msg_fini(done);
    }
    return -1;
}

/* Sends a request; *routed_to is the server of its Route ack and *done
 * its ResultNotice or ErrorNotice. */
static void request(void *cl, uint32_t step, const uint64_t *ids, uint32_t n,
                    uint32_t *routed_to, struct dh_wire_msg *done)
{
    *routed_to = send_request(cl, step, ids, n);
    if (next_done(cl, done, WAIT_MS) < 0)
        fail_msg("no completion for step %u", step);
    assert_int_equal(done->type == DH_WIRE_RESULT_NOTICE
                         ? done->u.result.task.step
                         : done->u.error.task.step,
                     step);
}

/* The reference: the batch decoded inline with plan p. */
static uint8_t *reference_plan(const struct dh_media_plan p,
                               const uint64_t *ids, uint32_t n, int32_t *valid,
                               size_t *bytes)
{
    uint8_t *dst;
    struct dh_media *m;
    struct dh_err e;

    *bytes = dh_batch_bytes(&p, n);
    dst = malloc(*bytes + DH_MEDIA_DST_PAD);
    assert_non_null(dst);
    assert_int_equal(dh_media_create(&m, &e), 0);
    if (dh_batch_decode(m, ix, 0, ids, n, &p, dst, *bytes + DH_MEDIA_DST_PAD,
                        valid, NULL, &e))
        fail_msg("inline: %s", e.msg);
    dh_media_destroy(m);
    return dst;
}

static uint8_t *reference(const uint64_t *ids, uint32_t n, int32_t *valid,
                          size_t *bytes)
{
    return reference_plan(fixture_plan(), ids, n, valid, bytes);
}

/* The notice's slot in the local arena (mapped like the client does, by
 * the notice's server_id) equals the reference; then releases it. */
static size_t check_slot(struct dh_dataserver *local,
                         const struct dh_wire_result *r, const uint64_t *ids,
                         uint32_t n)
{
    int32_t valid[4];
    size_t bytes;
    uint8_t *want = reference(ids, n, valid, &bytes);
    struct dh_slot_ref ref = {r->arena_offset, r->length, r->slot_generation};
    struct dh_arena *a;
    struct dh_err e;
    uint8_t *got;

    assert_int_equal(r->server_id, dh_dataserver_id(local));
    assert_int_equal(dh_arena_attach(dh_dataserver_arena_fd(local), &a, &e), 0);
    assert_true(r->length >= bytes);
    got = dh_arena_ptr(a, &ref);
    assert_non_null(got);
    assert_memory_equal(got, want, bytes);
    assert_int_equal(r->ndims, 5);
    assert_int_equal(r->dims[0], n);
    assert_int_equal(r->n_samples, n);
    for (uint32_t i = 0; i < n; i++) {
        assert_int_equal(r->sample_ids[i], ids[i]);
        assert_int_equal(r->valid_frames[i], (uint32_t)valid[i]);
    }
    assert_int_equal(dh_arena_release(a, &ref, &e), 0); /* the consumer */
    dh_arena_destroy(a);
    free(want);
    return bytes;
}

/* Live slots of a server's arena (bounded wait until it is `want`). */
static uint32_t live_slots(struct dh_dataserver *s, uint32_t want)
{
    struct dh_arena *a;
    struct dh_arena_stats st;
    struct dh_err e;
    uint64_t end = now_ms() + WAIT_MS;

    assert_int_equal(dh_arena_attach(dh_dataserver_arena_fd(s), &a, &e), 0);
    do {
        assert_int_equal(dh_arena_stats(a, &st), 0);
        if (st.live_slots == want)
            break;
        sleep_ms(5);
    } while (now_ms() < end);
    dh_arena_destroy(a);
    return st.live_slots;
}

/* ---- the cluster: coordinator + local (listening) + remote + client ---- */

struct cluster {
    struct runner co, local, remote;
    void *ctx, *cl;
    struct dh_keys keys; /* cfg->keyfile's, for the test's client */
};

struct cluster_cfg {
    const char *keyfile;   /* the job key of every part, or NULL */
    const char *advertise; /* the local's announced address, or NULL */
    int deliver_ms;        /* the remote's deliver_timeout_ms */
    size_t arena_bytes;    /* the local's arena */
    int alloc_ms;          /* the local's alloc_timeout_ms */
    unsigned stripes;      /* both servers' payload_stripes (0: default) */
    int local_deliver_ms;  /* the local's (its part timeout), 0: default */
    int route_wait_ms;     /* the local's, 0: default */
};

static void cluster_start(struct cluster *k, const struct cluster_cfg *cfg)
{
    struct dh_coordinator_opts co;
    struct dh_dataserver_opts o;
    struct dh_err e;
    const char *ep;

    memset(k, 0, sizeof(*k));
    dh_coordinator_opts_default(&co);
    co.listen = "tcp://127.0.0.1:0";
    co.policy = "round-robin"; /* local, remote, local, ... */
    co.keyfile = cfg->keyfile;
    assert_int_equal(dh_coordinator_create(&co, &k->co.c, &e), 0);
    run(&k->co);
    ep = dh_coordinator_endpoint(k->co.c);
    local_opts(&o, ep);
    o.advertise = cfg->advertise;
    o.keyfile = cfg->keyfile;
    if (cfg->arena_bytes)
        o.arena_bytes = cfg->arena_bytes;
    if (cfg->alloc_ms)
        o.alloc_timeout_ms = cfg->alloc_ms;
    o.payload_stripes = cfg->stripes;
    if (cfg->local_deliver_ms)
        o.deliver_timeout_ms = cfg->local_deliver_ms;
    if (cfg->route_wait_ms)
        o.route_wait_ms = cfg->route_wait_ms;
    k->local.s = make(&o);
    run(&k->local);
    remote_opts(&o, ep);
    o.deliver_timeout_ms = cfg->deliver_ms;
    o.keyfile = cfg->keyfile;
    o.payload_stripes = cfg->stripes;
    k->remote.s = make(&o);
    run(&k->remote);
    k->ctx = new_ctx();
    if (cfg->keyfile)
        assert_int_equal(dh__keys_load(cfg->keyfile, &k->keys, &e), 0);
    k->cl = client(k->ctx, ep, cfg->keyfile ? &k->keys : NULL);
}

static void cluster_stop(struct cluster *k)
{
    halt(&k->remote);
    halt(&k->local);
    halt(&k->co);
    zmq_close(k->cl);
    end_ctx(k->ctx);
    dh_dataserver_destroy(k->remote.s);
    dh_dataserver_destroy(k->local.s);
    dh_coordinator_destroy(k->co.c);
}

/* Round-robin (local, remote, local, ...): steps from 1 until one batch
 * came from each server, each checked in the local arena; both 2 samples
 * of `ids`.  Returns a batch's bytes. */
static size_t one_batch_each(struct cluster *k, const uint64_t *ids)
{
    uint32_t to, remote = 0, local = 0, step;
    struct dh_wire_msg m;
    size_t bytes = 0;

    for (step = 1; step <= 4 && (!remote || !local); step++) {
        request(k->cl, step, ids, 2, &to, &m);
        if (m.type == DH_WIRE_ERROR_NOTICE)
            fail_msg("step %u: %s", step, m.u.error.message);
        assert_true(to == LOCAL_ID || to == REMOTE_ID);
        /* Either way the notice names the local server and its arena. */
        bytes = check_slot(k->local.s, &m.u.result, ids, 2);
        if (to == REMOTE_ID)
            remote++;
        else
            local++;
        dh_wire_msg_fini(&m);
    }
    assert_int_equal(remote, 1);
    assert_int_equal(local, 1);
    return bytes;
}

/* ---- malformed payloads ---- */

/* A payload header: a ResultNotice of one sample whose tensor is
 * dims {1, bytes} u8 with `length` (bytes unless wrong on purpose). */
static void header(struct dh_wire_msg *m, uint32_t rank, uint64_t bytes,
                   uint64_t length)
{
    uint64_t id = 0;
    uint32_t valid = 1;

    dh_wire_msg_init(m, DH_WIRE_RESULT_NOTICE);
    assert_int_equal(
        dh_wire_task_make(&m->u.result.task, 0, 0, 50, rank, 0, NULL), 0);
    m->u.result.server_id = REMOTE_ID;
    m->u.result.length = length;
    m->u.result.ndims = 2;
    m->u.result.dims[0] = 1;
    m->u.result.dims[1] = bytes;
    assert_int_equal(
        dh_wire_set_result_samples(&m->u.result, &id, &valid, 1, NULL), 0);
}

static void send_frames(void *s, int n, size_t each)
{
    static const uint8_t zeros[128];

    assert_true(each <= sizeof(zeros));
    for (int i = 0; i < n; i++)
        assert_int_equal(zmq_send(s, zeros, each, i + 1 < n ? ZMQ_SNDMORE : 0),
                         (int)each);
}

static void send_header(void *s, uint32_t rank, uint64_t bytes, uint64_t length,
                        int more)
{
    struct dh_wire_msg m;

    header(&m, rank, bytes, length);
    send_msg(s, &m, more ? ZMQ_SNDMORE : 0);
    dh_wire_msg_fini(&m);
}

/* Nine hostile or broken payload messages, sent on `evil` (kept open
 * until they are counted: linger 0 would drop them). */
static int send_malformed(void *evil)
{
    struct dh_wire_msg hb;

    assert_int_equal(zmq_send(evil, "garbage", 7, 0), 7); /* one frame */
    assert_int_equal(zmq_send(evil, "\x01\x02junk", 6, ZMQ_SNDMORE), 6);
    send_frames(evil, 1, 10); /* header garbage */
    send_header(evil, 0, 100, 100, 1);
    send_frames(evil, 1, 50);          /* 50 of 100 bytes */
    send_header(evil, 0, 100, 100, 0); /* no data frame */
    send_header(evil, 0, 70, 70, 1);
    send_frames(evil, 70, 1); /* too many frames */
    send_header(evil, 0, 8u << 20, 8u << 20, 1);
    send_frames(evil, 1, 1); /* over the arena */
    send_header(evil, 0, 10, 20, 1);
    send_frames(evil, 1, 20); /* dims != length */
    send_header(evil, 3, 10, 10, 1);
    send_frames(evil, 1, 10); /* rank 3's task */
    dh_wire_msg_init(&hb, DH_WIRE_HEARTBEAT);
    hb.u.heartbeat.server_id = REMOTE_ID;
    send_msg(evil, &hb, ZMQ_SNDMORE);
    send_frames(evil, 1, 10); /* not a result */
    return 9;
}

/* Part `index` of `count` (docs/wire-protocol.md "Payload parts"): a
 * part frame, a header of rank 0's task 50 of `length` bytes claiming
 * server `sid`, and `data` bytes. */
static void send_part(void *s, uint32_t index, uint32_t count, uint32_t rank,
                      uint32_t sid, uint64_t length, size_t data)
{
    uint8_t pf[DH_TP_PART_HDR];
    struct dh_wire_msg m;

    dh__tp_part_encode(pf, index, count);
    assert_int_equal(zmq_send(s, pf, sizeof(pf), ZMQ_SNDMORE), (int)sizeof(pf));
    header(&m, rank, length, length);
    m.u.result.server_id = sid;
    send_msg(s, &m, data ? ZMQ_SNDMORE : 0);
    dh_wire_msg_fini(&m);
    if (data)
        send_frames(s, 1, data);
}

/* ---- tests ---- */

static void remote_batch_lands_in_local_arena(void **state)
{
    static struct cluster k; /* static: the teardown may stop it */
    struct dh_dataserver_stats ls, rs;
    const char *ep;
    uint64_t ids[2] = {1, 0};
    size_t bytes = 0;
    void *evil;
    int bad;

    (void)state;
    cluster_start(&k, &(struct cluster_cfg){.deliver_ms = WAIT_MS});
    ep = dh_dataserver_endpoint(k.local.s);
    assert_non_null(ep);
    assert_non_null(strstr(ep, "tcp://127.0.0.1:"));
    assert_null(strstr(ep, ":0"));
    assert_null(dh_dataserver_endpoint(k.remote.s));

    evil = dealer(k.ctx, ep);
    bad = send_malformed(evil);
    WAIT_STAT(k.local.s, malformed, (uint64_t)bad);
    zmq_close(evil);

    bytes = one_batch_each(&k, ids);
    WAIT_STAT(k.local.s, payloads, 1);
    WAIT_STAT(k.local.s, cross_ds_bytes, bytes);
    WAIT_STAT(k.remote.s, forwarded, 1);
    WAIT_STAT(k.remote.s, forwarded_bytes, bytes);
    WAIT_STAT(k.local.s, results, 2); /* its own batch and the remote's */
    WAIT_STAT(k.remote.s, routes, 1);
    dh_dataserver_stats(k.local.s, &ls);
    dh_dataserver_stats(k.remote.s, &rs);
    assert_int_equal(ls.malformed, (uint64_t)bad); /* nothing else */
    assert_int_equal(rs.results, 0);               /* the local one notifies */
    assert_int_equal(rs.errors, 0);
    assert_int_equal(rs.malformed, 0);
    assert_int_equal(live_slots(k.remote.s, 0), 0); /* staging returned */
    assert_int_equal(live_slots(k.local.s, 0), 0);  /* the client released */
    cluster_stop(&k);
}

/* Waits until `s` has refused more than `n` peers (bounded). */
static uint64_t wait_refused(struct dh_dataserver *s, uint64_t n)
{
    struct dh_dataserver_stats st;
    uint64_t end = now_ms() + WAIT_MS;

    do {
        dh_dataserver_stats(s, &st);
        if (st.refused_peers > n)
            break;
        sleep_ms(5);
    } while (now_ms() < end);
    assert_true(st.refused_peers > n);
    return st.refused_peers;
}

static void write_key(const char *name, char *path, size_t len,
                      struct dh_keys *k)
{
    struct dh_err e;

    snprintf(path, len, "%s/%s", dir, name);
    unlink(path);
    left_file(path);
    assert_int_equal(dh__keys_generate(k, &e), 0);
    assert_int_equal(dh__keys_write(path, k, 0, &e), 0);
}

/* Every part with the job key (docs/security.md): the remote's payload
 * reaches the local arena over CURVE, while at the local's payload
 * endpoint a peer without a key and one with another job's key are
 * refused before a byte of theirs is decoded, and a sidecar of another
 * job never registers with the Coordinator. */
static void keyed_cluster_refuses_strangers(void **state)
{
    char key[700], other[700];
    struct dh_keys kother;
    static struct cluster k; /* static: the teardown may stop it */
    struct dh_dataserver_stats ls;
    struct dh_coordinator_stats cs;
    struct dh_dataserver_opts o;
    struct dh_dataserver *fake = NULL;
    uint64_t ids[2] = {1, 0}, n;
    struct dh_err e;
    void *evil;

    (void)state;
    write_key("remote-job.key", key, sizeof(key), &k.keys);
    write_key("remote-other.key", other, sizeof(other), &kother);
    cluster_start(&k,
                  &(struct cluster_cfg){.keyfile = key, .deliver_ms = WAIT_MS});
    const char *ep = dh_dataserver_endpoint(k.local.s);

    evil = dealer(k.ctx, ep); /* no key at all */
    send_malformed(evil);
    n = wait_refused(k.local.s, 0);
    zmq_close(evil);
    evil = keyed_dealer(k.ctx, ep, &kother); /* another job's */
    send_malformed(evil);
    wait_refused(k.local.s, n);
    zmq_close(evil);

    remote_opts(&o, dh_coordinator_endpoint(k.co.c));
    o.server_id = REMOTE_ID + 1;
    o.keyfile = other;
    o.register_timeout_ms = 300;
    assert_true(dh_dataserver_create(&o, &fake, &e) < 0);
    assert_null(fake);
    dh_coordinator_stats(k.co.c, &cs);
    assert_true(cs.refused_peers >= 1);

    (void)one_batch_each(&k, ids);
    WAIT_STAT(k.local.s, payloads, 1);
    dh_dataserver_stats(k.local.s, &ls);
    assert_int_equal(ls.malformed, 0); /* the strangers never got through */
    dh_coordinator_stats(k.co.c, &cs);
    assert_int_equal(cs.servers, 2); /* the fake sidecar is not among them */
    cluster_stop(&k);
    dh__keys_wipe(&k.keys);
    unlink(key);
    unlink(other);
}

/* A batch of 2 x 4 frames at 320 x 240 (1.8 MB): over DH_TP_STRIPE_MIN. */
static struct dh_media_plan big_plan(void)
{
    struct dh_media_plan p = fixture_plan();

    p.width = 320;
    p.height = 240;
    return p;
}

/* Striped payloads (docs/wire-protocol.md "Payload parts") on the real
 * path, with the job key: a large batch the remote prepares goes to the
 * local as 3 parts over 3 CURVE connections, is put back together in the
 * local arena byte for byte as decoded inline, reaches the client once,
 * and leaves nothing behind: no part refused, no set still open, the
 * staging slot back. */
static void keyed_striped_payload_arrives_whole(void **state)
{
    struct dh_media_plan p = big_plan();
    uint64_t ids[2] = {1, 0};
    struct dh_dataserver_stats ls, rs;
    struct dh_wire_msg m;
    struct dh_keys keys;
    static struct cluster k; /* static: the teardown may stop it */
    char key[700];
    uint32_t to = 0, step;
    int32_t valid[2];
    size_t bytes;
    uint8_t *want = reference_plan(p, ids, 2, valid, &bytes);
    struct dh_err e;

    (void)state;
    assert_true(bytes >= DH_TP_STRIPE_MIN);
    write_key("striped-job.key", key, sizeof(key), &keys);
    cluster_start(&k, &(struct cluster_cfg){
                          .keyfile = key, .deliver_ms = WAIT_MS, .stripes = 3});
    for (step = 1; step <= 2 && to != REMOTE_ID; step++) {
        dh_wire_msg_init(&m, DH_WIRE_DESCRIPTOR_REQUEST);
        fill_request(&m.u.request, step, ids, 2);
        m.u.request.plan.width = p.width; /* the fixture's, larger */
        m.u.request.plan.height = p.height;
        send_msg(k.cl, &m, 0);
        dh_wire_msg_fini(&m);
        assert_int_equal(
            recv_type(k.cl, 0, NULL, NULL, DH_WIRE_ROUTE, &m, WAIT_MS), 0);
        to = m.u.route.server_id;
        dh_wire_msg_fini(&m);
        if (next_done(k.cl, &m, WAIT_MS) < 0)
            fail_msg("no completion for step %u", step);
        if (m.type == DH_WIRE_ERROR_NOTICE)
            fail_msg("step %u: %s", step, m.u.error.message);
        assert_int_equal(m.u.result.task.step, step);
        assert_int_equal(m.u.result.server_id, LOCAL_ID);
        {
            struct dh_slot_ref ref = {m.u.result.arena_offset,
                                      m.u.result.length,
                                      m.u.result.slot_generation};
            struct dh_arena *a;

            assert_int_equal(
                dh_arena_attach(dh_dataserver_arena_fd(k.local.s), &a, &e), 0);
            assert_non_null(dh_arena_ptr(a, &ref));
            assert_memory_equal(dh_arena_ptr(a, &ref), want, bytes);
            assert_int_equal(dh_arena_release(a, &ref, &e), 0);
            dh_arena_destroy(a);
        }
        dh_wire_msg_fini(&m);
    }
    assert_int_equal(to, REMOTE_ID);
    WAIT_STAT(k.local.s, payloads, 1);
    WAIT_STAT(k.local.s, parts_in, 3);
    WAIT_STAT(k.remote.s, parts_out, 3);
    assert_int_equal(live_slots(k.remote.s, 0), 0); /* staging slot back */
    /* Exactly once: no second completion. */
    assert_int_equal(next_done(k.cl, &m, 300), -1);
    dh_dataserver_stats(k.local.s, &ls);
    dh_dataserver_stats(k.remote.s, &rs);
    assert_int_equal(ls.malformed, 0);
    assert_int_equal(ls.payloads, 1);
    assert_int_equal(rs.forwarded, 1);
    assert_int_equal(rs.forwarded_bytes, bytes);
    cluster_stop(&k);
    dh__keys_wipe(&k.keys);
    dh__keys_wipe(&keys);
    unlink(key);
    free(want);
}

/* Hostile or broken payload parts at the local's inbox are refused and
 * counted, never placed: a part frame of the wrong size, a part without
 * its data, a part of the wrong size, another rank's part, and a part
 * claiming another sender for a set in progress (refused alone); the set
 * that never completes is dropped after the local's deliver_timeout_ms.
 * Legitimate traffic beside them is untouched. */
static void hostile_parts_are_refused(void **state)
{
    static const uint8_t short_pf[DH_TP_PART_HDR - 1] = {0xff, 'D', 'H', 'P'};
    struct dh_dataserver_stats ls;
    uint64_t ids[2] = {1, 0};
    static struct cluster k; /* static: the teardown may stop it */
    uint64_t t0;
    void *evil;

    (void)state;
    cluster_start(&k, &(struct cluster_cfg){.deliver_ms = WAIT_MS,
                                            .local_deliver_ms = 300});
    evil = dealer(k.ctx, dh_dataserver_endpoint(k.local.s));
    assert_int_equal(zmq_send(evil, short_pf, sizeof(short_pf), ZMQ_SNDMORE),
                     (int)sizeof(short_pf));
    send_header(evil, 0, 100, 100, 1);
    send_frames(evil, 1, 100);                        /* 1: a bad part frame */
    send_part(evil, 0, 2, 0, REMOTE_ID, 100, 0);      /* 2: no data frame */
    send_part(evil, 0, 2, 0, REMOTE_ID, 100, 30);     /* 3: its cut is 50 */
    send_part(evil, 0, 2, 3, REMOTE_ID, 100, 50);     /* 4: rank 3's */
    send_part(evil, 0, 2, 0, REMOTE_ID, 100, 50);     /* kept: a set begins */
    send_part(evil, 1, 2, 0, REMOTE_ID + 1, 100, 50); /* 5: another sender */
    t0 = now_ms();
    WAIT_STAT(k.local.s, malformed, 5);
    WAIT_STAT(k.local.s, malformed, 6); /* 6: the set expired */
    assert_true(now_ms() - t0 >= 250);
    zmq_close(evil);
    dh_dataserver_stats(k.local.s, &ls);
    assert_int_equal(ls.payloads, 0);
    assert_int_equal(ls.parts_in, 0);

    (void)one_batch_each(&k, ids);
    WAIT_STAT(k.local.s, payloads, 1);
    dh_dataserver_stats(k.local.s, &ls);
    assert_int_equal(ls.malformed, 6);
    cluster_stop(&k);
}

/* A well-formed payload of rank 0's task `step`, claiming server `sid`. */
/* A payload of 100 bytes for rank 0's task of `step`, naming server
 * `sid`, with `token` as its sender token (NULL: none). */
static void send_forged(void *s, uint32_t step, uint32_t sid, const char *token)
{
    struct dh_wire_msg m;

    header(&m, 0, 100, 100);
    assert_int_equal(
        dh_wire_task_make(&m.u.result.task, 0, 0, step, 0, 0, NULL), 0);
    m.u.result.server_id = sid;
    if (token)
        snprintf(m.u.result.sender_token, sizeof(m.u.result.sender_token), "%s",
                 token);
    send_msg(s, &m, ZMQ_SNDMORE);
    dh_wire_msg_fini(&m);
    send_frames(s, 1, 100);
}

/* Issue 13 item 2: the local server takes a payload for a task only from
 * the server the Coordinator placed it on, and once.  A well-formed
 * payload for a task nobody placed (refused once its Route has had time
 * to come), one for a task placed on the remote but claiming another
 * server, and the remote's own payload sent again are refused and counted,
 * never placed; the client hears of none of them and gets each legitimate
 * batch exactly once. */
static void payloads_only_from_the_placed_server_once(void **state)
{
    struct dh_dataserver_stats ls;
    uint64_t ids[2] = {1, 0};
    struct dh_wire_msg m;
    static struct cluster k; /* static: the teardown may stop it */
    uint32_t step, to = 0;
    uint64_t t0;
    void *evil;

    (void)state;
    cluster_start(&k, &(struct cluster_cfg){.deliver_ms = WAIT_MS});
    evil = dealer(k.ctx, dh_dataserver_endpoint(k.local.s));
    t0 = now_ms();
    send_forged(evil, 50, REMOTE_ID, NULL); /* 1: never placed anywhere */
    WAIT_STAT(k.local.s, malformed, 1);
    assert_true(now_ms() - t0 >= 900); /* it waited for a Route */
    /* A task placed on the remote, and a stranger claiming to be another
     * server racing the remote's payload: refused whichever comes first. */
    for (step = 1; step <= 2 && to != REMOTE_ID; step++) {
        to = send_request(k.cl, step, ids, 2);
        if (to == REMOTE_ID)
            send_forged(evil, step, REMOTE_ID + 1,
                        NULL); /* 2: not its server */
        if (next_done(k.cl, &m, WAIT_MS) < 0)
            fail_msg("no completion for step %u", step);
        if (m.type == DH_WIRE_ERROR_NOTICE)
            fail_msg("step %u: %s", step, m.u.error.message);
        assert_int_equal(m.u.result.task.step, step);
        check_slot(k.local.s, &m.u.result, ids, 2);
        dh_wire_msg_fini(&m);
    }
    assert_int_equal(to, REMOTE_ID);
    WAIT_STAT(k.local.s, malformed, 2);
    WAIT_STAT(k.local.s, payloads, 1);
    t0 = now_ms();
    send_forged(evil, step - 1, REMOTE_ID, NULL); /* 3: delivered already */
    WAIT_STAT(k.local.s, malformed, 3);
    assert_true(now_ms() - t0 < 900);               /* known: refused at once */
    assert_int_equal(next_done(k.cl, &m, 300), -1); /* nothing more */
    zmq_close(evil);
    dh_dataserver_stats(k.local.s, &ls);
    assert_int_equal(ls.payloads, 1);
    assert_int_equal(ls.results, 2);
    assert_int_equal(live_slots(k.local.s, 0), 0);
    cluster_stop(&k);
}

/* Issue 36 items 1 and 3: a member of the job (it holds the job's key)
 * races the placed remote with payloads that name the remote's server id,
 * one without a sender token and one with a made-up token, after parking
 * payloads for tasks nobody placed from three connections.  Neither forged
 * payload is placed; the remote's own batch is (not refused as a
 * duplicate), while the parked ones still wait for their Route: they never
 * held the inbox up. */
static void a_job_member_cannot_send_as_another_server(void **state)
{
    static struct cluster k; /* static: the teardown may stop it */
    struct dh_dataserver_stats ls;
    struct dh_keys keys;
    uint64_t ids[2] = {1, 0};
    struct dh_wire_msg m;
    uint32_t step, to = 0;
    void *ins[3];
    char key[700];

    (void)state;
    write_key("insider-job.key", key, sizeof(key), &keys);
    cluster_start(&k, &(struct cluster_cfg){.keyfile = key,
                                            .deliver_ms = WAIT_MS,
                                            .route_wait_ms = 600000});
    for (uint32_t i = 0; i < 3; i++) {
        ins[i] = keyed_dealer(k.ctx, dh_dataserver_endpoint(k.local.s), &keys);
        send_forged(ins[i], 60 + 2 * i, REMOTE_ID, NULL); /* parked */
        send_forged(ins[i], 61 + 2 * i, REMOTE_ID, NULL);
    }
    for (step = 1; step <= 2 && to != REMOTE_ID; step++) {
        to = send_request(k.cl, step, ids, 2);
        if (to == REMOTE_ID) {
            send_forged(ins[0], step, REMOTE_ID, NULL);
            send_forged(ins[1], step, REMOTE_ID,
                        "0123456789abcdef0123456789abcdef");
        }
        if (next_done(k.cl, &m, WAIT_MS) < 0)
            fail_msg("no completion for step %u", step);
        if (m.type == DH_WIRE_ERROR_NOTICE)
            fail_msg("step %u: %s", step, m.u.error.message);
        assert_int_equal(m.u.result.task.step, step);
        check_slot(k.local.s, &m.u.result, ids, 2); /* the decoded bytes */
        dh_wire_msg_fini(&m);
    }
    assert_int_equal(to, REMOTE_ID);
    WAIT_STAT(k.local.s, malformed, 2);
    dh_dataserver_stats(k.local.s, &ls);
    assert_int_equal(ls.payloads, 1);
    assert_int_equal(ls.malformed, 2); /* the six parked still wait */
    assert_int_equal(next_done(k.cl, &m, 300), -1); /* nothing more */
    for (int i = 0; i < 3; i++)
        zmq_close(ins[i]);
    assert_int_equal(live_slots(k.local.s, 0), 0);
    cluster_stop(&k);
    dh__keys_wipe(&keys);
    unlink(key);
}

/* Only the job's owner stops the Coordinator (issue 13 item 2): a
 * Shutdown from a peer holding the job's key is refused and counted; one
 * from the holder of an admin key the job's file lists is obeyed. */
static void only_an_admin_key_stops_the_coordinator(void **state)
{
    char key[700], admin_path[700];
    struct dh_keys job, admin;
    struct dh_coordinator_opts co;
    struct dh_coordinator_stats cs;
    static struct runner r; /* static: the teardown may stop it */
    struct dh_wire_msg m;
    struct dh_err e;
    void *ctx, *s;
    uint64_t end;

    (void)state;
    write_key("admin-job.key", key, sizeof(key), &job);
    write_key("admin-own.key", admin_path, sizeof(admin_path), &admin);
    memcpy(job.admin[0], admin.pub, sizeof(admin.pub));
    job.n_admin = 1;
    unlink(key);
    assert_int_equal(dh__keys_write(key, &job, 0, &e), 0);
    memcpy(admin.server, job.pub, sizeof(job.pub));
    dh_coordinator_opts_default(&co);
    co.listen = "tcp://127.0.0.1:0";
    co.keyfile = key;
    r = (struct runner){0};
    assert_int_equal(dh_coordinator_create(&co, &r.c, &e), 0);
    run(&r);
    ctx = new_ctx();
    dh_wire_msg_init(&m, DH_WIRE_SHUTDOWN);
    snprintf(m.u.shutdown.reason, sizeof(m.u.shutdown.reason), "a job peer");
    s = keyed_dealer(ctx, dh_coordinator_endpoint(r.c), &job);
    send_msg(s, &m, 0);
    end = now_ms() + WAIT_MS;
    do {
        dh_coordinator_stats(r.c, &cs);
        if (cs.refused >= 1)
            break;
        sleep_ms(5);
    } while (now_ms() < end);
    assert_true(cs.refused >= 1);
    sleep_ms(100);
    assert_false(__atomic_load_n(&r.finished, __ATOMIC_SEQ_CST));
    zmq_close(s);
    s = keyed_dealer(ctx, dh_coordinator_endpoint(r.c), &admin);
    send_msg(s, &m, 0);
    end = now_ms() + WAIT_MS;
    while (!__atomic_load_n(&r.finished, __ATOMIC_SEQ_CST) && now_ms() < end)
        sleep_ms(5);
    assert_true(__atomic_load_n(&r.finished, __ATOMIC_SEQ_CST));
    assert_int_equal(r.rc, 0);
    dh_wire_msg_fini(&m);
    zmq_close(s);
    halt(&r);
    end_ctx(ctx);
    dh_coordinator_destroy(r.c);
    dh__keys_wipe(&job);
    dh__keys_wipe(&admin);
    unlink(key);
    unlink(admin_path);
}

/* The local server announces an address nobody listens on: the remote
 * cannot deliver.  That says nothing about the samples (issue 13 item 6):
 * the client never sees the remote's error; the Coordinator re-routes the
 * task to the rank's local server, whose result arrives instead, after
 * the remote's bounded wait. */
static void unreachable_target_is_rerouted_to_the_local_server(void **state)
{
    static struct cluster k; /* static: the teardown may stop it */
    uint64_t ids[1] = {0};
    uint32_t to = 0, step;
    struct dh_wire_msg m;
    struct dh_dataserver_stats rs;
    struct dh_coordinator_stats cs;

    (void)state;
    cluster_start(&k, &(struct cluster_cfg){.advertise = "tcp://127.0.0.1:1",
                                            .deliver_ms = 300});
    assert_string_equal(dh_dataserver_endpoint(k.local.s), "tcp://127.0.0.1:1");
    for (step = 1; step <= 2 && to != REMOTE_ID; step++) {
        uint64_t t0 = now_ms();

        request(k.cl, step, ids, 1, &to, &m);
        if (m.type == DH_WIRE_ERROR_NOTICE)
            fail_msg("step %u: the client got the remote's error: %s", step,
                     m.u.error.message);
        /* Either way the batch is the local server's. */
        assert_int_equal(m.u.result.server_id, LOCAL_ID);
        check_slot(k.local.s, &m.u.result, ids, 1);
        if (to == REMOTE_ID)
            assert_true(now_ms() - t0 >= 300); /* the remote did wait */
        dh_wire_msg_fini(&m);
    }
    assert_int_equal(to, REMOTE_ID);
    WAIT_STAT(k.remote.s, errors, 1); /* counted just after the send */
    dh_dataserver_stats(k.remote.s, &rs);
    assert_int_equal(rs.forwarded, 0);
    assert_int_equal(live_slots(k.remote.s, 0), 0);
    dh_coordinator_stats(k.co.c, &cs);
    assert_int_equal(cs.rerouted, 1);
    cluster_stop(&k);
}

/* Holds slot `r` of the local arena, as a client that has not released
 * it yet; release_held() lets it go. */
static struct dh_slot_ref held(const struct dh_wire_msg *m)
{
    assert_int_equal(m->type, DH_WIRE_RESULT_NOTICE);
    return (struct dh_slot_ref){m->u.result.arena_offset, m->u.result.length,
                                m->u.result.slot_generation};
}

static void release_held(struct dh_dataserver *local,
                         const struct dh_slot_ref *ref)
{
    struct dh_arena *a;
    struct dh_err e;

    assert_int_equal(dh_arena_attach(dh_dataserver_arena_fd(local), &a, &e), 0);
    assert_int_equal(dh_arena_release(a, ref, &e), 0);
    dh_arena_destroy(a);
}

/* The local arena holds one batch: a payload arriving while the client
 * holds it waits (the loop keeps serving), lands once the slot is
 * released, and past alloc_timeout_ms becomes an ErrorNotice from the
 * local server. */
static void payload_waits_for_arena_space(void **state)
{
    static struct cluster k; /* static: the teardown may stop it */
    uint64_t ids[1] = {1}, t0;
    struct dh_wire_msg m;
    struct dh_slot_ref ref;
    struct dh_dataserver_stats ls;

    (void)state;
    cluster_start(&k, &(struct cluster_cfg){.deliver_ms = WAIT_MS,
                                            .arena_bytes = 16384,
                                            .alloc_ms = 1500});
    request(k.cl, 1, ids, 1, &(uint32_t){0}, &m); /* round-robin: local */
    ref = held(&m);
    dh_wire_msg_fini(&m);
    assert_int_equal(send_request(k.cl, 2, ids, 1), REMOTE_ID);
    assert_int_equal(next_done(k.cl, &m, 300), -1); /* waiting for space */
    WAIT_STAT(k.remote.s, forwarded, 1);
    release_held(k.local.s, &ref);
    assert_int_equal(next_done(k.cl, &m, WAIT_MS), 0);
    assert_int_equal(m.u.result.task.step, 2);
    check_slot(k.local.s, &m.u.result, ids, 1);
    dh_wire_msg_fini(&m);

    assert_int_equal(send_request(k.cl, 3, ids, 1), LOCAL_ID);
    assert_int_equal(next_done(k.cl, &m, WAIT_MS), 0);
    ref = held(&m);
    dh_wire_msg_fini(&m);
    t0 = now_ms();
    assert_int_equal(send_request(k.cl, 4, ids, 1), REMOTE_ID);
    assert_int_equal(next_done(k.cl, &m, WAIT_MS), 0);
    assert_int_equal(m.type, DH_WIRE_ERROR_NOTICE);
    assert_int_equal(m.u.error.task.step, 4);
    assert_int_equal(m.u.error.server_id, LOCAL_ID);
    assert_int_equal(m.u.error.cause, DH_EARENA);
    assert_non_null(strstr(m.u.error.message, "arena exhausted"));
    assert_true(now_ms() - t0 >= 1500);
    dh_wire_msg_fini(&m);
    release_held(k.local.s, &ref);
    WAIT_STAT(k.local.s, payloads, 1);
    WAIT_STAT(k.local.s, errors, 1);
    dh_dataserver_stats(k.local.s, &ls);
    assert_int_equal(ls.malformed, 0);
    assert_int_equal(live_slots(k.local.s, 0), 0);
    cluster_stop(&k);
}

/* ---- the remote alone, against a fake Coordinator and a fake target ---- */

struct create_args {
    struct dh_dataserver_opts o;
    struct dh_dataserver *s;
    int rc;
    struct dh_err e;
};

static void *create_thread(void *arg)
{
    struct create_args *ca = arg;

    ca->rc = dh_dataserver_create(&ca->o, &ca->s, &ca->e);
    return NULL;
}

static void *bound_router(void *ctx, char *ep, size_t eplen)
{
    void *rt = zmq_socket(ctx, ZMQ_ROUTER);
    int zero = 0;

    assert_non_null(rt);
    zmq_setsockopt(rt, ZMQ_LINGER, &zero, sizeof(zero));
    assert_int_equal(zmq_bind(rt, "tcp://127.0.0.1:0"), 0);
    assert_int_equal(zmq_getsockopt(rt, ZMQ_LAST_ENDPOINT, ep, &eplen), 0);
    return rt;
}

static void router_send(void *rt, const uint8_t *id, size_t idlen,
                        const struct dh_wire_msg *m)
{
    assert_int_equal(zmq_send(rt, id, idlen, ZMQ_SNDMORE), (int)idlen);
    send_msg(rt, m, 0);
}

static void route_to(void *rt, const uint8_t *id, size_t idlen, uint32_t step,
                     const uint64_t *ids, uint32_t n, uint32_t target,
                     const char *addr)
{
    struct dh_wire_msg m;

    dh_wire_msg_init(&m, DH_WIRE_ROUTE);
    fill_request(&m.u.route.request, step, ids, n);
    m.u.route.has_request = 1;
    m.u.route.task = m.u.route.request.task;
    m.u.route.server_id = REMOTE_ID;
    m.u.route.target_server_id = target;
    snprintf(m.u.route.target_addr, sizeof(m.u.route.target_addr), "%s", addr);
    router_send(rt, id, idlen, &m);
    dh_wire_msg_fini(&m);
}

/* A heartbeat whose links report bytes/s towards LOCAL_ID (bounded). */
static void expect_link(void *rt, uint8_t *id, size_t *idlen)
{
    uint64_t end = now_ms() + WAIT_MS;
    struct dh_wire_msg m;

    while (now_ms() < end) {
        assert_int_equal(
            recv_type(rt, 1, id, idlen, DH_WIRE_HEARTBEAT, &m, WAIT_MS), 0);
        assert_int_equal(m.u.heartbeat.server_id, REMOTE_ID);
        if (m.u.heartbeat.n_links == 1) {
            assert_int_equal(m.u.heartbeat.links[0].peer_server_id, LOCAL_ID);
            assert_true(m.u.heartbeat.links[0].bytes_per_s > 0);
            dh_wire_msg_fini(&m);
            return;
        }
        dh_wire_msg_fini(&m);
    }
    fail_msg("no heartbeat reported the link");
}

static void expect_error(void *rt, uint8_t *id, size_t *idlen, uint32_t step,
                         const char *needle)
{
    struct dh_wire_msg m;

    assert_int_equal(
        recv_type(rt, 1, id, idlen, DH_WIRE_ERROR_NOTICE, &m, WAIT_MS), 0);
    assert_int_equal(m.u.error.task.step, step);
    assert_int_equal(m.u.error.server_id, REMOTE_ID);
    assert_true(m.u.error.cause < 0);
    if (!strstr(m.u.error.message, needle))
        fail_msg("'%s' does not say '%s'", m.u.error.message, needle);
    dh_wire_msg_fini(&m);
}

/* Receives the payload on the fake target: header + one data frame equal
 * to the reference decode. */
static void expect_payload(void *tg, const uint64_t *ids, uint32_t n)
{
    static uint8_t data[1 << 20];
    uint8_t id[256];
    size_t idlen = 0, len = 0, bytes;
    int32_t valid[4];
    uint8_t *want = reference(ids, n, valid, &bytes);
    struct dh_wire_msg m;

    assert_int_equal(recv_msg(tg, 1, id, &idlen, &m, data, &len, WAIT_MS), 0);
    assert_int_equal(m.type, DH_WIRE_RESULT_NOTICE);
    assert_int_equal(m.u.result.server_id, REMOTE_ID);
    assert_int_equal(m.u.result.arena_offset, 0);
    assert_int_equal(m.u.result.length, bytes);
    assert_int_equal(m.u.result.ndims, 5);
    assert_int_equal(m.u.result.dims[0], n);
    assert_int_equal(m.u.result.dims[4], 3);
    assert_int_equal(m.u.result.n_samples, n);
    for (uint32_t i = 0; i < n; i++)
        assert_int_equal(m.u.result.valid_frames[i], (uint32_t)valid[i]);
    assert_int_equal(len, bytes);
    assert_memory_equal(data, want, bytes);
    dh_wire_msg_fini(&m);
    free(want);
}

static void remote_against_fake_peers(void **state)
{
    void *ctx = new_ctx(), *co, *tg;
    char coep[256], tgep[256];
    uint8_t id[256];
    size_t idlen = 0;
    uint64_t ids[2] = {0, 1};
    struct create_args ca = {0};
    static struct runner rs; /* static: the teardown may stop it */
    struct dh_wire_msg m;
    pthread_t th;

    (void)state;
    rs = (struct runner){0};
    co = bound_router(ctx, coep, sizeof(coep));
    tg = bound_router(ctx, tgep, sizeof(tgep));
    remote_opts(&ca.o, coep);
    assert_int_equal(pthread_create(&th, NULL, create_thread, &ca), 0);
    assert_int_equal(
        recv_type(co, 1, id, &idlen, DH_WIRE_REGISTER_SERVER, &m, WAIT_MS), 0);
    assert_int_equal(m.u.register_server.role, DH_WIRE_ROLE_REMOTE);
    assert_int_equal(m.u.register_server.rank, 0);
    assert_int_equal(m.u.register_server.server_id, REMOTE_ID);
    assert_int_equal(m.u.register_server.arena_bytes, ARENA_BYTES);
    assert_string_equal(m.u.register_server.addr, "remote:server-9");
    router_send(co, id, idlen, &m); /* the ack */
    dh_wire_msg_fini(&m);
    pthread_join(th, NULL);
    if (ca.rc)
        fail_msg("remote: %s", ca.e.msg);
    rs.s = ca.s;
    run(&rs);

    route_to(co, id, idlen, 1, ids, 2, LOCAL_ID, tgep);
    expect_payload(tg, ids, 2);
    expect_link(co, id, &idlen);
    assert_int_equal(live_slots(rs.s, 0), 0); /* ZeroMQ let it go */

    route_to(co, id, idlen, 2, ids, 1, REMOTE_ID, "remote:server-9");
    expect_error(co, id, &idlen, 2, "no delivery target");
    route_to(co, id, idlen, 3, ids, 1, 5, "bogus://nowhere");
    expect_error(co, id, &idlen, 3, "bogus://nowhere");
    WAIT_STAT(rs.s, errors, 2);
    WAIT_STAT(rs.s, forwarded, 1);
    assert_int_equal(live_slots(rs.s, 0), 0);

    halt(&rs);
    dh_dataserver_destroy(rs.s);
    zmq_close(co);
    zmq_close(tg);
    end_ctx(ctx);
}

/* A remote with no room (a restarted Coordinator does not know what it
 * still holds) refuses a Route with DH_EPEERDEAD, which the Coordinator
 * re-routes to the rank's local server: never a sample error the skip
 * policy would drop (issue 13 item 6; the chaos soak found it).  Which
 * fills first - its job table ("busy") or its workers' queue ("job queue
 * full") - depends on how fast the worker takes the first job: either
 * refusal must say DH_EPEERDEAD. */
static void a_full_remote_asks_for_a_reroute(void **state)
{
    void *ctx = new_ctx(), *co;
    char coep[256];
    uint8_t id[256];
    size_t idlen = 0;
    uint64_t ids[1] = {0};
    struct create_args ca = {0};
    static struct runner rs; /* static: the teardown may stop it */
    struct dh_wire_msg m;
    pthread_t th;
    int busy = 0;

    (void)state;
    rs = (struct runner){0};
    co = bound_router(ctx, coep, sizeof(coep));
    remote_opts(&ca.o, coep);
    ca.o.deliver_timeout_ms = 3000; /* the jobs wait: nobody listens */
    assert_int_equal(pthread_create(&th, NULL, create_thread, &ca), 0);
    assert_int_equal(
        recv_type(co, 1, id, &idlen, DH_WIRE_REGISTER_SERVER, &m, WAIT_MS), 0);
    router_send(co, id, idlen, &m); /* the ack */
    dh_wire_msg_fini(&m);
    pthread_join(th, NULL);
    if (ca.rc)
        fail_msg("remote: %s", ca.e.msg);
    rs.s = ca.s;
    run(&rs);
    for (uint32_t step = 1; step <= 16; step++)
        route_to(co, id, idlen, step, ids, 1, LOCAL_ID, "tcp://127.0.0.1:9");
    while (!busy && recv_type(co, 1, id, &idlen, DH_WIRE_ERROR_NOTICE, &m,
                              WAIT_MS) == 0) {
        if (strstr(m.u.error.message, "busy") ||
            strstr(m.u.error.message, "job queue full")) {
            assert_int_equal(m.u.error.cause, DH_EPEERDEAD);
            busy = 1;
        }
        dh_wire_msg_fini(&m);
    }
    assert_true(busy);
    halt(&rs);
    dh_dataserver_destroy(rs.s);
    zmq_close(co);
    end_ctx(ctx);
}

/* ---- option rules ---- */

static void listen_and_remote_options(void **state)
{
    static struct runner co; /* static: the teardown may stop it */
    struct dh_coordinator_opts cop;
    struct dh_dataserver_opts o;
    struct dh_dataserver *s = NULL;
    struct dh_err e;
    const char *ep;

    (void)state;
    co = (struct runner){0};
    dh_coordinator_opts_default(&cop);
    cop.listen = "tcp://127.0.0.1:0";
    assert_int_equal(dh_coordinator_create(&cop, &co.c, &e), 0);
    run(&co);
    ep = dh_coordinator_endpoint(co.c);

    local_opts(&o, ep);
    o.listen = "tcp://*:0"; /* nobody can reach "0.0.0.0" */
    assert_int_equal(dh_dataserver_create(&o, &s, &e), DH_EINVAL);
    assert_non_null(strstr(e.msg, "--advertise"));
    o.listen = NULL;
    o.advertise = "tcp://127.0.0.1:5";
    assert_int_equal(dh_dataserver_create(&o, &s, &e), DH_EINVAL);
    o.listen = "tcp://127.0.0.1:0";
    o.advertise = NULL;
    o.addr = "tcp://elsewhere:1";
    assert_int_equal(dh_dataserver_create(&o, &s, &e), DH_EINVAL);
    remote_opts(&o, ep);
    o.listen = "tcp://127.0.0.1:0";
    assert_int_equal(dh_dataserver_create(&o, &s, &e), DH_EINVAL);
    assert_null(s);

    /* A Python-dataset server never takes payloads from the network (its
     * rank reads every slot as a Python batch). */
    int sv[2];

    assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv), 0);
    local_opts(&o, ep);
    o.listen = "tcp://127.0.0.1:0";
    o.client_fd = sv[1]; /* create() takes it over */
    o.python_dataset = "/nonexistent/ds.pkl";
    assert_int_equal(dh_dataserver_create(&o, &s, &e), DH_EINVAL);
    assert_non_null(strstr(e.msg, "--python-dataset excludes --listen"));
    assert_null(s);
    close(sv[0]);

    local_opts(&o, ep);
    o.listen = "tcp://*:0";
    o.advertise = "tcp://127.0.0.1:7777";
    /* every interface without a key: refused unless insecure */
    assert_int_equal(dh_dataserver_create(&o, &s, &e), DH_EINVAL);
    assert_non_null(strstr(e.msg, "refusing to listen on tcp://*:0"));
    o.insecure = 1;
    assert_int_equal(dh_dataserver_create(&o, &s, &e), 0);
    assert_string_equal(dh_dataserver_endpoint(s), "tcp://127.0.0.1:7777");
    dh_dataserver_destroy(s);
    s = NULL;

    local_opts(&o, ep); /* not listening: no payload address */
    o.listen = NULL;
    assert_int_equal(dh_dataserver_create(&o, &s, &e), 0);
    assert_null(dh_dataserver_endpoint(s));
    dh_dataserver_destroy(s);

    halt(&co);
    dh_coordinator_destroy(co.c);
}

/* ---- a failed test leaves nothing running ---- */

/* Run alone in a child (LEFT_ENV): fails with its whole cluster up. */
static void fails_with_its_cluster_up(void **state)
{
    static struct cluster k;

    (void)state;
    cluster_start(&k, &(struct cluster_cfg){.deliver_ms = WAIT_MS});
    fail_msg("on purpose: the teardown must stop what this test started");
}

/* Loops of this process still running (loop_runner.h names them). */
static int loops_running(void)
{
    DIR *d = opendir("/proc/self/task");
    struct dirent *de;
    int n = 0;

    if (!d)
        return 100;
    while ((de = readdir(d))) {
        char path[300], comm[32] = "";
        FILE *f;

        if (de->d_name[0] == '.')
            continue;
        snprintf(path, sizeof(path), "/proc/self/task/%s/comm", de->d_name);
        if ((f = fopen(path, "r"))) {
            if (!fgets(comm, sizeof(comm), f))
                comm[0] = 0;
            fclose(f);
        }
        n += !strcmp(comm, "dh-test-loop\n");
    }
    closedir(d);
    return n;
}

/* This binary runs itself with LEFT_ENV: a test that fails with a
 * Coordinator, a local and a remote DataServer running; its exit status
 * is the number of their loops still running after its teardown, which
 * must be 0 (without the teardown it was 3). */
static void a_failed_test_leaves_no_loop_running(void **state)
{
    char *argv[] = {"test_remote", NULL};
    extern char **environ;
    posix_spawn_file_actions_t fa;
    uint64_t end = now_ms() + 6 * WAIT_MS;
    char asan[512], old_asan[512] = "";
    int status = 0, rc, had_asan = getenv("ASAN_OPTIONS") != NULL;
    pid_t pid, r;

    (void)state;
    if (had_asan)
        snprintf(old_asan, sizeof(old_asan), "%s", getenv("ASAN_OPTIONS"));
    assert_int_equal(posix_spawn_file_actions_init(&fa), 0);
    /* its on-purpose failure is not this run's news */
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
    /* The child's sockets and contexts stay (a failed test's): what it
     * is asked is its loops, not LeakSanitizer's report of those. */
    snprintf(asan, sizeof(asan), "%s:detect_leaks=0",
             getenv("ASAN_OPTIONS") ? getenv("ASAN_OPTIONS") : "");
    setenv(LEFT_ENV, "1", 1);
    setenv("ASAN_OPTIONS", asan + (asan[0] == ':'), 1);
    rc = posix_spawn(&pid, "/proc/self/exe", &fa, NULL, argv, environ);
    unsetenv(LEFT_ENV);
    if (had_asan)
        setenv("ASAN_OPTIONS", old_asan, 1);
    else
        unsetenv("ASAN_OPTIONS");
    assert_int_equal(rc, 0);
    posix_spawn_file_actions_destroy(&fa);
    while ((r = waitpid(pid, &status, WNOHANG)) == 0 && now_ms() < end)
        sleep_ms(20);
    if (r == 0) { /* ours, by pid */
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        fail_msg("the child did not end within %d ms", 6 * WAIT_MS);
    }
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}

int main(void)
{
    if (getenv(LEFT_ENV)) {
        const struct CMUnitTest one[] = {
            cmocka_unit_test_teardown(fails_with_its_cluster_up, teardown)};

        (void)cmocka_run_group_tests(one, setup, clip_fixture_teardown);
        return loops_running();
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(remote_batch_lands_in_local_arena, teardown),
        cmocka_unit_test_teardown(
            unreachable_target_is_rerouted_to_the_local_server, teardown),
        cmocka_unit_test_teardown(keyed_cluster_refuses_strangers, teardown),
        cmocka_unit_test_teardown(keyed_striped_payload_arrives_whole,
                                  teardown),
        cmocka_unit_test_teardown(hostile_parts_are_refused, teardown),
        cmocka_unit_test_teardown(payloads_only_from_the_placed_server_once,
                                  teardown),
        cmocka_unit_test_teardown(a_job_member_cannot_send_as_another_server,
                                  teardown),
        cmocka_unit_test_teardown(only_an_admin_key_stops_the_coordinator,
                                  teardown),
        cmocka_unit_test_teardown(a_full_remote_asks_for_a_reroute, teardown),
        cmocka_unit_test_teardown(payload_waits_for_arena_space, teardown),
        cmocka_unit_test_teardown(remote_against_fake_peers, teardown),
        cmocka_unit_test_teardown(listen_and_remote_options, teardown),
        cmocka_unit_test(a_failed_test_leaves_no_loop_running),
    };

    return cmocka_run_group_tests(tests, setup, clip_fixture_teardown);
}
