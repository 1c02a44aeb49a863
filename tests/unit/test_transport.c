/* test_transport.c - the control plane's transport (src/runtime/
 * transport.h) over real ZeroMQ sockets on loopback:
 *   - a DEALER (client role) and the Coordinator's ROUTER exchange wire
 *     messages both ways; the ROUTER sees the routing id and the peer's
 *     address; a bind to port 0 reports the port it got;
 *   - bad input is one dropped message with a typed error (garbage,
 *     several frames), never a desynchronised stream or a socket error;
 *   - multipart payload framing: frames past the cap are counted, a frame
 *     over the kind's size limit never arrives, zero-copy frees its data;
 *   - bind / connect errors;
 *   - CURVE (docs/security.md): a peer with the job's key is admitted and
 *     its messages say so (User-Id "job"; an admin key: "admin"); no key,
 *     a stranger's key pair and another job's key are refused and counted
 *     by the ZAP handler, for the Coordinator's and the payload kinds,
 *     while the job's own peer keeps working beside them;
 *   - a bind others could reach is refused without a key, warned with
 *     --insecure, and loopback / ipc binds need no key.
 * Every wait has a timeout. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <zmq.h>

#include "runtime/transport.h"

#define WAIT_MS 2000

struct pair {
    void *ctx, *router, *dealer;
    char bound[DH_WIRE_MAX_ADDR + 1];
};

static void pair_open(struct pair *p, enum dh_tp_kind rk, enum dh_tp_kind dk,
                      int64_t max_msg)
{
    struct dh_tp_opts ro = {.kind = rk,
                            .addr = "tcp://127.0.0.1:0",
                            .who = "test",
                            .max_msg = max_msg};
    struct dh_tp_opts dopt = {.kind = dk, .who = "test", .peer = "router"};
    struct dh_err e;

    memset(p, 0, sizeof(*p));
    assert_non_null(p->ctx = zmq_ctx_new());
    assert_int_equal(
        dh__tp_open(p->ctx, &ro, &p->router, p->bound, sizeof(p->bound), &e),
        0);
    assert_null(strstr(p->bound, ":0")); /* the port it got */
    dopt.addr = p->bound;
    assert_int_equal(dh__tp_open(p->ctx, &dopt, &p->dealer, NULL, 0, &e), 0);
}

static void pair_close(struct pair *p)
{
    dh__tp_close(&p->router, 0);
    dh__tp_close(&p->dealer, 0);
    assert_null(p->router);
    zmq_ctx_term(p->ctx);
}

static void shutdown_msg(struct dh_wire_msg *m, const char *why)
{
    dh_wire_msg_init(m, DH_WIRE_SHUTDOWN);
    snprintf(m->u.shutdown.reason, sizeof(m->u.shutdown.reason), "%s", why);
}

/* Waits for and receives one message on `sock`. */
static int recv_wait(void *sock, struct dh_tp_from *from, struct dh_wire_msg *m,
                     struct dh_err *e)
{
    assert_int_equal(dh__tp_wait(sock, WAIT_MS, e), 1);
    return dh__tp_recv(sock, from, m, "peer", e);
}

static void test_roundtrip(void **state)
{
    struct pair p;
    struct dh_wire_msg m;
    struct dh_tp_from from;
    struct dh_err e;

    (void)state;
    pair_open(&p, DH_TP_COORD, DH_TP_CLIENT_CTL, 0);
    assert_int_equal(dh__tp_recv(p.router, &from, &m, NULL, &e), 0);
    shutdown_msg(&m, "ping");
    assert_int_equal(dh__tp_send(p.dealer, NULL, &m, "router", &e), 0);
    dh_wire_msg_fini(&m);
    assert_int_equal(recv_wait(p.router, &from, &m, &e), 1);
    assert_int_equal(m.type, DH_WIRE_SHUTDOWN);
    assert_string_equal(m.u.shutdown.reason, "ping");
    assert_true(from.id_len > 0);
    assert_string_equal(from.addr, "127.0.0.1");
    dh_wire_msg_fini(&m);
    shutdown_msg(&m, "pong"); /* back through the routing id */
    assert_int_equal(dh__tp_send(p.router, &from, &m, NULL, &e), 0);
    dh_wire_msg_fini(&m);
    assert_int_equal(recv_wait(p.dealer, NULL, &m, &e), 1);
    assert_string_equal(m.u.shutdown.reason, "pong");
    dh_wire_msg_fini(&m);
    pair_close(&p);
}

static void test_malformed(void **state)
{
    struct pair p;
    struct dh_wire_msg m;
    struct dh_tp_from from;
    struct dh_err e;
    int rc;

    (void)state;
    pair_open(&p, DH_TP_COORD, DH_TP_CLIENT_CTL, 0);
    assert_int_equal(zmq_send(p.dealer, "garbage!", 8, 0), 8);
    rc = recv_wait(p.router, &from, &m, &e);
    assert_true(dh__tp_dropped(rc));
    assert_int_equal(rc, DH_EPROTO); /* the peer's fault, typed so */
    assert_int_equal(e.code, DH_EPROTO);
    assert_int_equal(m.type, DH_WIRE_NONE);
    assert_int_equal(zmq_send(p.dealer, "a", 1, ZMQ_SNDMORE), 1);
    assert_int_equal(zmq_send(p.dealer, "b", 1, 0), 1);
    rc = recv_wait(p.router, &from, &m, &e);
    assert_int_equal(rc, DH_EPROTO);
    assert_non_null(strstr(e.msg, "2 frames"));
    shutdown_msg(&m, "still here"); /* the stream is not out of step */
    assert_int_equal(dh__tp_send(p.dealer, NULL, &m, NULL, &e), 0);
    dh_wire_msg_fini(&m);
    assert_int_equal(recv_wait(p.router, &from, &m, &e), 1);
    assert_string_equal(m.u.shutdown.reason, "still here");
    dh_wire_msg_fini(&m);
    pair_close(&p);
}

static int freed;
static void free_cb(void *data, void *hint)
{
    (void)data;
    (void)hint;
    freed++;
}

static void test_payload_frames(void **state)
{
    static char data[100] = "tensor bytes";
    struct pair p;
    struct dh_tp_from from;
    struct dh_err e;
    zmq_msg_t f[2];
    char big[8192] = {0};
    int n, extra;

    (void)state;
    pair_open(&p, DH_TP_PAYLOAD_IN, DH_TP_PAYLOAD_OUT, 4096);
    /* ZMQ_IMMEDIATE: wait until the DEALER is connected */
    for (int i = 0; i < 200; i++) {
        int rc = dh__tp_send_more(p.dealer, "hdr", 3, &e);

        assert_true(rc >= 0);
        if (rc == 1)
            break;
        zmq_poll(NULL, 0, 10);
    }
    assert_int_equal(dh__tp_send_more(p.dealer, "x", 1, &e), 1);
    assert_int_equal(dh__tp_send_more(p.dealer, "y", 1, &e), 1);
    assert_int_equal(
        dh__tp_send_zc(p.dealer, data, sizeof(data), free_cb, NULL, &e), 0);
    assert_int_equal(dh__tp_wait(p.router, WAIT_MS, &e), 1);
    assert_int_equal(dh__tp_recv_frames(p.router, &from, f, 2, &n, &extra, &e),
                     1);
    assert_int_equal(n, 2);
    assert_int_equal(extra, 2);
    assert_int_equal(zmq_msg_size(&f[0]), 3);
    assert_memory_equal(zmq_msg_data(&f[0]), "hdr", 3);
    dh__tp_frames_close(f, n);
    /* A frame over the inbox's limit is refused by ZeroMQ: never seen. */
    assert_int_equal(dh__tp_send_more(p.dealer, "hdr", 3, &e), 1);
    (void)zmq_send(p.dealer, big, sizeof(big), ZMQ_DONTWAIT);
    assert_int_equal(dh__tp_wait(p.router, 300, &e), 0);
    pair_close(&p);
    assert_int_equal(freed, 1);
}

static void test_open_errors(void **state)
{
    void *ctx = zmq_ctx_new(), *a = NULL, *b = NULL;
    char bound[DH_WIRE_MAX_ADDR + 1];
    struct dh_tp_opts o = {
        .kind = DH_TP_COORD, .addr = "tcp://127.0.0.1:0", .who = "coordinator"};
    struct dh_err e;

    (void)state;
    assert_int_equal(dh__tp_open(ctx, &o, &a, bound, sizeof(bound), &e), 0);
    o.addr = bound;
    assert_int_equal(dh__tp_open(ctx, &o, &b, NULL, 0, &e), DH_EIO);
    assert_non_null(strstr(e.msg, "cannot listen on"));
    assert_null(b);
    o.addr = "nonsense";
    assert_int_equal(dh__tp_open(ctx, &o, &b, NULL, 0, &e), DH_EINVAL);
    o = (struct dh_tp_opts){.kind = DH_TP_SERVER_CTL,
                            .addr = "bogus://x",
                            .who = "dataserver",
                            .peer = "coordinator"};
    assert_int_equal(dh__tp_open(ctx, &o, &b, NULL, 0, &e), DH_EINVAL);
    assert_non_null(strstr(e.msg, "cannot connect to coordinator "
                                  "bogus://x"));
    dh__tp_close(&a, 0);
    dh__tp_close(&b, 0); /* NULL is fine */
    zmq_ctx_term(ctx);
}

/* ---- CURVE ---- */

static void auth_new(struct dh_tp_auth *a, const char *who)
{
    struct dh_err e;

    memset(a, 0, sizeof(*a));
    snprintf(a->who, sizeof(a->who), "%s", who);
    assert_int_equal(dh__keys_generate(&a->keys, &e), 0);
}

/* Waits until `a` has refused at least `n` connections (bounded; a
 * refused peer's socket reconnects, and each attempt counts). */
static void wait_refused(const struct dh_tp_auth *a, uint64_t n)
{
    for (int i = 0; i < WAIT_MS / 10 && dh__tp_auth_refused(a) < n; i++)
        zmq_poll(NULL, 0, 10);
    assert_true(dh__tp_auth_refused(a) >= n);
}

/* A connecting socket of kind `k` in its own context, keyed with `a` (or
 * none), that sends one Shutdown to `addr`. */
struct conn {
    void *ctx, *sock;
};

static void conn_open(struct conn *c, enum dh_tp_kind k, const char *addr,
                      struct dh_tp_auth *a)
{
    struct dh_tp_opts o = {
        .kind = k, .addr = addr, .who = "test", .peer = "server", .auth = a};
    struct dh_err e;

    assert_non_null(c->ctx = zmq_ctx_new());
    if (dh__tp_open(c->ctx, &o, &c->sock, NULL, 0, &e) < 0)
        fail_msg("%s", e.msg);
}

/* Sends; a payload kind (ZMQ_IMMEDIATE) only once it is connected, so a
 * refused peer's send may never go: `must` says whether it has to. */
static void conn_send(struct conn *c, const char *why, int must)
{
    struct dh_wire_msg m;
    struct dh_err e;
    int rc = -1;

    shutdown_msg(&m, why);
    for (int i = 0; i < (must ? WAIT_MS / 10 : 1) && rc < 0; i++)
        if ((rc = dh__tp_send(c->sock, NULL, &m, NULL, &e)) < 0)
            zmq_poll(NULL, 0, 10);
    if (must)
        assert_int_equal(rc, 0);
}

static void conn_close(struct conn *c)
{
    dh__tp_close(&c->sock, 0);
    zmq_ctx_term(c->ctx);
}

/* The only message the server gets is the job peer's, with its User-Id. */
static void expect_only(void *srv, const char *why, const char *user)
{
    struct dh_wire_msg m;
    struct dh_tp_from from;
    struct dh_err e;

    assert_int_equal(recv_wait(srv, &from, &m, &e), 1);
    assert_string_equal(m.u.shutdown.reason, why);
    assert_string_equal(from.user, user);
    dh_wire_msg_fini(&m);
    assert_int_equal(dh__tp_wait(srv, 200, &e), 0);
}

static void curve_refusals(enum dh_tp_kind sk, enum dh_tp_kind ck)
{
    struct dh_tp_auth job, other, admin, stranger;
    struct dh_tp_opts o = {.kind = sk,
                           .addr = "tcp://127.0.0.1:0",
                           .who = "test server",
                           .max_msg = DH_WIRE_MAX_MSG,
                           .auth = &job};
    char bound[DH_WIRE_MAX_ADDR + 1];
    struct conn good, plain, wrong, thief, adm;
    void *ctx = zmq_ctx_new(), *srv = NULL;
    struct dh_err e;
    uint64_t n;

    auth_new(&job, "test server");
    auth_new(&other, "other job");
    auth_new(&admin, "admin");
    auth_new(&stranger, "stranger");
    /* the admin's file: its own pair, the job's server key; the job's
     * file lists the admin's public key */
    memcpy(admin.keys.server, job.keys.pub, sizeof(job.keys.pub));
    memcpy(job.keys.admin[0], admin.keys.pub, sizeof(admin.keys.pub));
    job.keys.n_admin = 1;
    /* a stranger who learnt the job's public key but not its secret */
    memcpy(stranger.keys.server, job.keys.pub, sizeof(job.keys.pub));

    assert_int_equal(dh__tp_open(ctx, &o, &srv, bound, sizeof(bound), &e), 0);
    assert_non_null(job.zap); /* started with the first bound socket */

    conn_open(&plain, ck, bound, NULL);
    conn_send(&plain, "no key", 0);
    wait_refused(&job, 1);
    conn_close(&plain);
    n = dh__tp_auth_refused(&job);
    conn_open(&wrong, ck, bound, &other);
    conn_send(&wrong, "another job", 0);
    wait_refused(&job, n + 1);
    conn_close(&wrong);
    n = dh__tp_auth_refused(&job);
    conn_open(&thief, ck, bound, &stranger);
    conn_send(&thief, "stranger", 0);
    wait_refused(&job, n + 1);

    conn_open(&good, ck, bound, &job);
    conn_send(&good, "the job", 1);
    expect_only(srv, "the job", DH_ZAP_USER_JOB);
    conn_open(&adm, ck, bound, &admin);
    conn_send(&adm, "the admin", 1);
    expect_only(srv, "the admin", DH_ZAP_USER_ADMIN);
    assert_true(dh__zap_admitted(job.zap) >= 2);

    conn_close(&good);
    conn_close(&adm);
    conn_close(&thief);
    dh__tp_close(&srv, 0);
    dh__tp_auth_fini(&job);
    assert_null(job.zap);
    zmq_ctx_term(ctx);
}

static void test_curve_coordinator(void **state)
{
    (void)state;
    curve_refusals(DH_TP_COORD, DH_TP_CLIENT_CTL);
    curve_refusals(DH_TP_COORD, DH_TP_SERVER_CTL);
}

static void test_curve_payload(void **state)
{
    (void)state;
    curve_refusals(DH_TP_PAYLOAD_IN, DH_TP_PAYLOAD_OUT);
}

/* A second keyed bound socket in one context shares its ZAP handler; a
 * second context gets its own. */
static void test_curve_two_sockets(void **state)
{
    struct dh_tp_auth a;
    struct dh_tp_opts o = {.kind = DH_TP_COORD,
                           .addr = "tcp://127.0.0.1:0",
                           .who = "test",
                           .auth = &a};
    char b1[DH_WIRE_MAX_ADDR + 1], b2[DH_WIRE_MAX_ADDR + 1];
    void *ctx = zmq_ctx_new(), *s1 = NULL, *s2 = NULL;
    struct dh_zap *zap;
    struct conn c;
    struct dh_err e;

    (void)state;
    auth_new(&a, "test");
    assert_int_equal(dh__tp_open(ctx, &o, &s1, b1, sizeof(b1), &e), 0);
    zap = a.zap;
    o.kind = DH_TP_PAYLOAD_IN;
    assert_int_equal(dh__tp_open(ctx, &o, &s2, b2, sizeof(b2), &e), 0);
    assert_ptr_equal(a.zap, zap);
    conn_open(&c, DH_TP_PAYLOAD_OUT, b2, NULL);
    conn_send(&c, "x", 0);
    wait_refused(&a, 1);
    conn_close(&c);
    dh__tp_close(&s1, 0);
    dh__tp_close(&s2, 0);
    dh__tp_auth_fini(&a);
    dh__tp_auth_fini(&a); /* idempotent */
    zmq_ctx_term(ctx);
}

/* Inside a CURVE session a peer holding the job key may still send
 * garbage: 2,000 hostile messages (random bytes, random frame counts),
 * each one dropped with a typed error, and the stream stays in step. */
static void test_curve_hostile_frames(void **state)
{
    struct dh_tp_auth job;
    struct dh_tp_opts o = {.kind = DH_TP_COORD,
                           .addr = "tcp://127.0.0.1:0",
                           .who = "test",
                           .auth = &job};
    char bound[DH_WIRE_MAX_ADDR + 1];
    void *ctx = zmq_ctx_new(), *srv = NULL;
    struct dh_wire_msg m;
    struct dh_tp_from from;
    struct conn c;
    struct dh_err e;
    uint32_t x = 12345;
    uint8_t buf[512];
    int dropped = 0;

    (void)state;
    auth_new(&job, "test");
    assert_int_equal(dh__tp_open(ctx, &o, &srv, bound, sizeof(bound), &e), 0);
    conn_open(&c, DH_TP_CLIENT_CTL, bound, &job);
    for (int round = 0; round < 20; round++) {
        for (int i = 0; i < 100; i++) {
            int frames = 1 + (int)((x = x * 1103515245u + 12345u) >> 29);

            for (int f = 0; f < frames; f++) {
                size_t n = 1 + ((x = x * 1103515245u + 12345u) >> 16) % 511;

                for (size_t k = 0; k < n; k++)
                    buf[k] = (uint8_t)((x = x * 1103515245u + 12345u) >> 24);
                buf[0] = 0xff; /* never a valid envelope's first byte */
                assert_int_equal(
                    zmq_send(c.sock, buf, n, f + 1 < frames ? ZMQ_SNDMORE : 0),
                    (int)n);
            }
        }
        for (int i = 0; i < 100; i++) {
            int rc = recv_wait(srv, &from, &m, &e);

            assert_true(dh__tp_dropped(rc));
            assert_string_equal(from.user, DH_ZAP_USER_JOB);
            dropped++;
        }
    }
    assert_int_equal(dropped, 2000);
    conn_send(&c, "still here", 1);
    assert_int_equal(recv_wait(srv, &from, &m, &e), 1);
    assert_string_equal(m.u.shutdown.reason, "still here");
    dh_wire_msg_fini(&m);
    conn_close(&c);
    dh__tp_close(&srv, 0);
    dh__tp_auth_fini(&job);
    zmq_ctx_term(ctx);
}

/* ---- binds without a key ---- */

/* dh__tp_open() must succeed; its message if not. */
static void open_ok(void *ctx, const struct dh_tp_opts *o, void **s)
{
    struct dh_err e;

    if (dh__tp_open(ctx, o, s, NULL, 0, &e) < 0)
        fail_msg("%s: %s", o->addr, e.msg);
}

static void test_insecure_bind(void **state)
{
    static const char *const exposed[] = {"tcp://0.0.0.0:0", "tcp://*:0",
                                          "tcp://[::]:0"};
    struct dh_tp_opts o = {.kind = DH_TP_COORD, .who = "coordinator"};
    void *ctx = zmq_ctx_new(), *s = NULL;
    struct dh_tp_auth a;
    struct dh_err e;
    int ipv6 = 1;

    (void)state;
    zmq_ctx_set(ctx, ZMQ_IPV6, 1);
    for (size_t i = 0; i < sizeof(exposed) / sizeof(exposed[0]); i++) {
        o.addr = exposed[i];
        o.insecure = 0;
        o.auth = NULL;
        assert_int_equal(dh__tp_open(ctx, &o, &s, NULL, 0, &e), DH_EINVAL);
        assert_null(s);
        assert_non_null(strstr(e.msg, "refusing to listen on"));
        assert_non_null(strstr(e.msg, exposed[i]));
        assert_non_null(strstr(e.msg, "--insecure"));
        o.insecure = 1; /* warns on stderr, binds */
        if (i == 2) {
            int rc = dh__tp_open(ctx, &o, &s, NULL, 0, &e);

            if (rc < 0) { /* no IPv6 on this host */
                ipv6 = 0;
                continue;
            }
        } else {
            open_ok(ctx, &o, &s);
        }
        dh__tp_close(&s, 0);
        o.insecure = 0; /* with a key: no flag needed */
        auth_new(&a, "coordinator");
        o.auth = &a;
        open_ok(ctx, &o, &s);
        dh__tp_close(&s, 0);
        dh__tp_auth_fini(&a);
    }
    (void)ipv6;
    o = (struct dh_tp_opts){.kind = DH_TP_PAYLOAD_IN,
                            .addr = "tcp://127.0.0.1:0",
                            .who = "dataserver"};
    open_ok(ctx, &o, &s); /* loopback */
    dh__tp_close(&s, 0);
    /* connecting anywhere needs no flag */
    o = (struct dh_tp_opts){.kind = DH_TP_CLIENT_CTL,
                            .addr = "tcp://192.0.2.1:9",
                            .who = "client",
                            .peer = "coordinator"};
    open_ok(ctx, &o, &s);
    dh__tp_close(&s, 0);
    zmq_ctx_term(ctx);
}

/* Issue 13 item 1: an ipc:// endpoint is bound only in a directory of
 * this user's that group and others cannot enter; anything else is
 * refused with the path and the reason.  An abstract socket has no
 * directory (its peers' credentials are checked: test_peer_cred). */
static void test_ipc_dir_must_be_private(void **state)
{
    static const mode_t open_modes[] = {0755, 0770, 0701, 0777};
    char tmpl[] = "/tmp/dh-ipc-XXXXXX", addr[384], sub[128], link[128];
    struct dh_tp_opts o = {.kind = DH_TP_COORD, .who = "coordinator"};
    void *ctx = zmq_ctx_new(), *s = NULL;
    struct dh_err e;
    char *dir;

    (void)state;
    assert_non_null(dir = mkdtemp(tmpl)); /* 0700 */
    snprintf(addr, sizeof(addr), "ipc://%s/c.sock", dir);
    o.addr = addr;
    open_ok(ctx, &o, &s);
    dh__tp_close(&s, 0);
    unlink(addr + 6);
    for (size_t i = 0; i < sizeof(open_modes) / sizeof(open_modes[0]); i++) {
        char mode[8];

        assert_int_equal(chmod(dir, open_modes[i]), 0);
        assert_int_equal(dh__tp_open(ctx, &o, &s, NULL, 0, &e), DH_EINVAL);
        assert_null(s);
        snprintf(mode, sizeof(mode), "%04o", (unsigned)open_modes[i]);
        if (!strstr(e.msg, dir) || !strstr(e.msg, mode) ||
            !strstr(e.msg, "refusing to listen"))
            fail_msg("%s", e.msg);
        assert_int_equal(access(addr + 6, F_OK), -1); /* nothing bound */
    }
    assert_int_equal(chmod(dir, 0700), 0);
    /* A symlink to a private directory is not followed. */
    snprintf(sub, sizeof(sub), "%s/real", dir);
    snprintf(link, sizeof(link), "%s/link", dir);
    assert_int_equal(mkdir(sub, 0700), 0);
    assert_int_equal(symlink(sub, link), 0);
    snprintf(addr, sizeof(addr), "ipc://%s/c.sock", link);
    assert_int_equal(dh__tp_open(ctx, &o, &s, NULL, 0, &e), DH_EINVAL);
    assert_non_null(strstr(e.msg, "not a directory"));
    /* Another user's directory, even 0700 (only root can make one). */
    if (geteuid() == 0) {
        assert_int_equal(chown(sub, 65534, 65534), 0);
        snprintf(addr, sizeof(addr), "ipc://%s/c.sock", sub);
        assert_int_equal(dh__tp_open(ctx, &o, &s, NULL, 0, &e), DH_EINVAL);
        if (!strstr(e.msg, "belongs to uid 65534") || !strstr(e.msg, sub))
            fail_msg("%s", e.msg);
    }
    /* abstract: no directory to check */
    snprintf(addr, sizeof(addr), "ipc://@dh-test-ipc-%d", (int)getpid());
    open_ok(ctx, &o, &s);
    dh__tp_close(&s, 0);
    unlink(link);
    rmdir(sub);
    rmdir(dir);
    zmq_ctx_term(ctx);
}

static void test_addr_is_local(void **state)
{
    (void)state;
    assert_true(dh__tp_addr_is_local("tcp://127.0.0.1:7500"));
    assert_true(dh__tp_addr_is_local("tcp://127.1.2.3:0"));
    assert_true(dh__tp_addr_is_local("tcp://localhost:1"));
    assert_true(dh__tp_addr_is_local("tcp://[::1]:1"));
    assert_true(dh__tp_addr_is_local("ipc:///tmp/x.sock"));
    assert_true(dh__tp_addr_is_local("ipc://@abstract"));
    assert_false(dh__tp_addr_is_local("tcp://0.0.0.0:7500"));
    assert_false(dh__tp_addr_is_local("tcp://*:7500"));
    assert_false(dh__tp_addr_is_local("tcp://[::]:7500"));
    assert_false(dh__tp_addr_is_local("tcp://10.0.0.5:7500"));
    assert_false(dh__tp_addr_is_local("tcp://eth0:7500"));
    assert_false(dh__tp_addr_is_local("tcp://localhost.example.com:1"));
    assert_false(dh__tp_addr_is_local("tcp://1270.0.0.1:1"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip),
        cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_payload_frames),
        cmocka_unit_test(test_open_errors),
        cmocka_unit_test(test_curve_coordinator),
        cmocka_unit_test(test_curve_payload),
        cmocka_unit_test(test_curve_two_sockets),
        cmocka_unit_test(test_curve_hostile_frames),
        cmocka_unit_test(test_insecure_bind),
        cmocka_unit_test(test_addr_is_local),
        cmocka_unit_test(test_ipc_dir_must_be_private),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
