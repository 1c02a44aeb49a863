/* co_fixture.h - a Coordinator run in a thread of the test on
 * tcp://127.0.0.1:0, and fake DataServers and clients as DEALER sockets
 * speaking the wire codec (test_coordinator.c, test_attacks.c).  Every
 * receive has a timeout. */
#ifndef DH_TEST_CO_FIXTURE_H
#define DH_TEST_CO_FIXTURE_H

#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>
#include <zmq.h>

#include "datahelix/coordinator.h"
#include "datahelix/wire.h"

#define WAIT_MS 3000 /* a message that should come */
#define QUIET_MS 250 /* how long "nothing comes" is watched */

/* Counters move on the coordinator's thread, a moment after the message
 * that caused them is sent: poll (bounded), then assert. */
#define ASSERT_STAT(f, field, want)                                            \
    do {                                                                       \
        uint64_t end_ = now_ms() + WAIT_MS;                                    \
        while ((uint64_t)stats(f).field != (uint64_t)(want) &&                 \
               now_ms() < end_) {                                              \
            struct timespec ts_ = {0, 5000000};                                \
            nanosleep(&ts_, NULL);                                             \
        }                                                                      \
        assert_int_equal(stats(f).field, (want));                              \
    } while (0)

struct fx {
    struct dh_coordinator *c;
    pthread_t th;
    volatile int stop;
    volatile int finished;
    int run_rc;
    void *ctx;
    FILE *tel;
};

static inline uint64_t now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static inline void *run_thread(void *arg)
{
    struct fx *f = arg;
    struct dh_err e;

    f->run_rc = dh_coordinator_run(f->c, &f->stop, &e);
    __atomic_store_n(&f->finished, 1, __ATOMIC_SEQ_CST);
    return NULL;
}

/* Set before start() to change its options (0: the default / off). */
static size_t start_max_pending;
static int start_exit_unused;
static void (*start_tweak)(struct dh_coordinator_opts *o);

static inline struct fx *start(const char *policy, int hb_ms, int per_worker)
{
    struct fx *f = calloc(1, sizeof(*f));
    struct dh_coordinator_opts o;
    struct dh_err e;

    assert_non_null(f);
    f->tel = tmpfile();
    assert_non_null(f->tel);
    dh_coordinator_opts_default(&o);
    o.listen = "tcp://127.0.0.1:0";
    o.policy = policy;
    o.heartbeat_timeout_ms = hb_ms;
    o.queue_per_worker = per_worker;
    o.telemetry = f->tel;
    if (start_max_pending)
        o.max_pending = start_max_pending;
    o.exit_when_unused_ms = start_exit_unused;
    if (start_tweak)
        start_tweak(&o);
    assert_int_equal(dh_coordinator_create(&o, &f->c, &e), 0);
    assert_non_null(strstr(dh_coordinator_endpoint(f->c), "127.0.0.1:"));
    assert_null(strstr(dh_coordinator_endpoint(f->c), ":0"));
    f->ctx = zmq_ctx_new();
    assert_non_null(f->ctx);
    assert_int_equal(pthread_create(&f->th, NULL, run_thread, f), 0);
    return f;
}

/* Waits (bounded) for run() to return; 1 if it did. */
static inline int wait_finished(struct fx *f, int ms)
{
    uint64_t end = now_ms() + (uint64_t)ms;

    while (!__atomic_load_n(&f->finished, __ATOMIC_SEQ_CST) && now_ms() < end) {
        struct timespec ts = {0, 5000000};

        nanosleep(&ts, NULL);
    }
    return __atomic_load_n(&f->finished, __ATOMIC_SEQ_CST);
}

/* Sets the stop flag, checks that run() returns within 1 s, frees all. */
static inline void stop_and_free(struct fx *f)
{
    uint64_t t0 = now_ms();

    f->stop = 1;
    assert_true(wait_finished(f, 1000));
    assert_true(now_ms() - t0 < 1000);
    pthread_join(f->th, NULL);
    assert_int_equal(f->run_rc, 0);
    dh_coordinator_destroy(f->c);
    zmq_ctx_term(f->ctx);
    fclose(f->tel);
    free(f);
}

static inline void *peer(struct fx *f)
{
    void *s = zmq_socket(f->ctx, ZMQ_DEALER);
    int zero = 0, to = 1000;

    assert_non_null(s);
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_setsockopt(s, ZMQ_SNDTIMEO, &to, sizeof(to));
    assert_int_equal(zmq_connect(s, dh_coordinator_endpoint(f->c)), 0);
    return s;
}

static inline void send_msg(void *s, const struct dh_wire_msg *m)
{
    uint8_t *buf = NULL;
    size_t len = 0;
    struct dh_err e;

    assert_int_equal(dh_wire_encode(m, &buf, &len, &e), 0);
    assert_int_equal(zmq_send(s, buf, len, 0), (int)len);
    dh_wire_free(buf);
}

/* Receives the next message of `type` (others are skipped) within ms;
 * 0, or -1 on timeout. */
static inline int recv_type(void *s, enum dh_wire_type type,
                            struct dh_wire_msg *m, int ms)
{
    uint64_t end = now_ms() + (uint64_t)ms;
    uint8_t buf[65536];

    for (;;) {
        uint64_t now = now_ms();
        zmq_pollitem_t it = {.socket = s, .events = ZMQ_POLLIN};
        int n;

        if (now >= end || zmq_poll(&it, 1, (long)(end - now)) <= 0)
            return -1;
        n = zmq_recv(s, buf, sizeof(buf), ZMQ_DONTWAIT);
        if (n < 0)
            continue;
        assert_true((size_t)n <= sizeof(buf));
        assert_int_equal(dh_wire_decode(buf, (size_t)n, m, NULL), 0);
        if (m->type == type)
            return 0;
        dh_wire_msg_fini(m);
    }
}

static inline void expect(void *s, enum dh_wire_type type,
                          struct dh_wire_msg *m)
{
    assert_int_equal(recv_type(s, type, m, WAIT_MS), 0);
}

static inline void expect_none(void *s, enum dh_wire_type type)
{
    struct dh_wire_msg m;

    assert_int_equal(recv_type(s, type, &m, QUIET_MS), -1);
}

/* Rank `rank`'s token, which its fake client and local servers share. */
static inline const char *tok(uint32_t rank)
{
    static char buf[4][DH_WIRE_TOKEN_LEN + 1];
    static int k;
    char *b = buf[k++ & 3];

    snprintf(b, DH_WIRE_TOKEN_LEN + 1, "%032x", rank + 0xabcu);
    return b;
}

/* A fake server registered at `addr` (NULL: "ipc://server-ID"). */
static inline void *server_at(struct fx *f, uint32_t id, enum dh_wire_role role,
                              uint32_t rank, const char *addr)
{
    void *s = peer(f);
    struct dh_wire_msg m, ack;

    dh_wire_msg_init(&m, DH_WIRE_REGISTER_SERVER);
    m.u.register_server.server_id = id;
    if (addr)
        snprintf(m.u.register_server.addr, sizeof(m.u.register_server.addr),
                 "%s", addr);
    else
        snprintf(m.u.register_server.addr, sizeof(m.u.register_server.addr),
                 "ipc://server-%u", id);
    m.u.register_server.role = role;
    m.u.register_server.rank = role == DH_WIRE_ROLE_LOCAL ? rank : 0;
    if (role == DH_WIRE_ROLE_LOCAL)
        snprintf(m.u.register_server.token, sizeof(m.u.register_server.token),
                 "%s", tok(rank));
    m.u.register_server.workers = 1;
    m.u.register_server.arena_bytes = 1 << 20;
    send_msg(s, &m);
    expect(s, DH_WIRE_REGISTER_SERVER, &ack);
    assert_int_equal(ack.u.register_server.server_id, id);
    dh_wire_msg_fini(&ack);
    return s;
}

static inline void *server(struct fx *f, uint32_t id, enum dh_wire_role role,
                           uint32_t rank)
{
    return server_at(f, id, role, rank, NULL);
}

/* Registers `rank` on socket s (a new one if NULL); the incarnation the
 * ack names goes to *inc if not NULL. */
static inline void *client_on(struct fx *f, void *s, uint32_t rank,
                              uint64_t *inc)
{
    struct dh_wire_msg m, ack;

    if (!s)
        s = peer(f);
    dh_wire_msg_init(&m, DH_WIRE_REGISTER_CLIENT);
    m.u.register_client.rank = rank;
    m.u.register_client.world_size = rank + 1;
    m.u.register_client.pid = 1;
    snprintf(m.u.register_client.token, sizeof(m.u.register_client.token), "%s",
             tok(rank));
    send_msg(s, &m);
    expect(s, DH_WIRE_REGISTER_CLIENT, &ack);
    assert_int_equal(ack.u.register_client.rank, rank);
    if (inc)
        *inc = ack.u.register_client.incarnation;
    dh_wire_msg_fini(&ack);
    return s;
}

static inline void *client(struct fx *f, uint32_t rank)
{
    return client_on(f, NULL, rank, NULL);
}

static inline void heartbeat(void *s, uint32_t id)
{
    struct dh_wire_msg m;

    dh_wire_msg_init(&m, DH_WIRE_HEARTBEAT);
    m.u.heartbeat.server_id = id;
    send_msg(s, &m);
}

static inline struct dh_wire_task task(uint32_t step)
{
    struct dh_wire_task t;

    assert_int_equal(dh_wire_task_make(&t, 0, 0, step, 0, 0, NULL), 0);
    return t;
}

static inline void request_hinted(void *s, uint32_t step, int local_only)
{
    struct dh_wire_msg m;
    uint64_t ids[2] = {100 + step, 200 + step};

    dh_wire_msg_init(&m, DH_WIRE_DESCRIPTOR_REQUEST);
    m.u.request.task = task(step);
    m.u.request.requester_rank = 0;
    assert_int_equal(dh_wire_set_samples(&m.u.request, ids, 2, NULL), 0);
    m.u.request.slack_ms = 100000;
    m.u.request.hints.est_cpu_ms = 10;
    m.u.request.hints.local_only = local_only;
    send_msg(s, &m);
    dh_wire_msg_fini(&m);
}

static inline void request(void *s, uint32_t step)
{
    request_hinted(s, step, 0);
}

/* The result notice `server_id` sends for `step` (samples 100 + step and
 * 200 + step, one 64-byte slot at 4096 x server_id); the caller finis it. */
static inline void result_msg(struct dh_wire_msg *m, uint32_t step,
                              uint32_t server_id)
{
    uint64_t ids[2] = {100 + step, 200 + step};

    dh_wire_msg_init(m, DH_WIRE_RESULT_NOTICE);
    m->u.result.task = task(step);
    m->u.result.server_id = server_id;
    m->u.result.arena_offset = 4096 * server_id;
    m->u.result.length = 64;
    m->u.result.slot_generation = 7;
    m->u.result.dims[0] = 64;
    m->u.result.ndims = 1;
    m->u.result.dtype = DH_DTYPE_U8;
    assert_int_equal(
        dh_wire_set_result_samples(&m->u.result, ids, NULL, 2, NULL), 0);
}

static inline void result(void *s, uint32_t step, uint32_t server_id)
{
    struct dh_wire_msg m;

    result_msg(&m, step, server_id);
    send_msg(s, &m);
    dh_wire_msg_fini(&m);
}

/* `s` gets a Route of `step` to `server_id`, with or without the request;
 * the caller finis *m. */
static inline void expect_route_msg(void *s, uint32_t step, uint32_t server_id,
                                    int has_request, struct dh_wire_msg *m)
{
    expect(s, DH_WIRE_ROUTE, m);
    assert_int_equal(m->u.route.task.id, task(step).id);
    assert_int_equal(m->u.route.server_id, server_id);
    assert_int_equal(m->u.route.has_request, has_request);
}

/* The server gets the Route with the embedded request for `step`. */
static inline void expect_route(void *s, uint32_t step, uint32_t server_id)
{
    struct dh_wire_msg m;

    expect_route_msg(s, step, server_id, 1, &m);
    assert_int_equal(m.u.route.request.n_samples, 2);
    assert_int_equal(m.u.route.request.sample_ids[0], 100 + step);
    assert_int_equal(m.u.route.request.sample_ids[1], 200 + step);
    dh_wire_msg_fini(&m);
}

/* The delivery target hears that `step` runs on remote `server_id` (a
 * Route without the request): the one payload it will take for it. */
static inline void expect_placed_on(void *s, uint32_t step, uint32_t server_id)
{
    struct dh_wire_msg m;

    expect_route_msg(s, step, server_id, 0, &m);
    dh_wire_msg_fini(&m);
}

static inline void expect_result(void *s, uint32_t step, uint32_t server_id)
{
    struct dh_wire_msg m;

    expect(s, DH_WIRE_RESULT_NOTICE, &m);
    assert_int_equal(m.u.result.task.id, task(step).id);
    assert_int_equal(m.u.result.server_id, server_id);
    assert_int_equal(m.u.result.sample_ids[1], 200 + step);
    dh_wire_msg_fini(&m);
}

static inline struct dh_coordinator_stats stats(struct fx *f)
{
    struct dh_coordinator_stats s;

    dh_coordinator_stats(f->c, &s);
    return s;
}

#endif
