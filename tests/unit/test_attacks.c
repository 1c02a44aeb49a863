/* test_attacks.c - issue 13's attacks on the control plane, each against
 * an in-process Coordinator (co_fixture.h) spoken to with raw DEALER
 * sockets and the wire codec, each beside a legitimate epoch that must
 * still complete exactly once (legit_step(): rank 0's client and local
 * server, one request routed, its result forwarded once).  Every attack
 * here succeeded before the rules of docs/wire-protocol.md
 * "Authorization" and "Bounds": each test fails on that code. */
#include <fcntl.h>
#include <unistd.h>

#include "co_fixture.h"

/* A request of `rank`'s client for task (epoch, step) of `task_rank`,
 * with ids base + 0..n-1. */
static void request_as(void *s, uint32_t rank, uint32_t task_rank,
                       uint32_t epoch, uint32_t step, uint64_t base, uint32_t n,
                       int local_only)
{
    struct dh_wire_msg m;
    uint64_t *ids = calloc(n, sizeof(*ids));

    assert_non_null(ids);
    for (uint32_t i = 0; i < n; i++)
        ids[i] = base + i;
    dh_wire_msg_init(&m, DH_WIRE_DESCRIPTOR_REQUEST);
    assert_int_equal(dh_wire_task_make(&m.u.request.task, epoch, 0, step,
                                       task_rank, 0, NULL),
                     0);
    m.u.request.requester_rank = rank;
    assert_int_equal(dh_wire_set_samples(&m.u.request, ids, n, NULL), 0);
    m.u.request.slack_ms = 100000;
    m.u.request.hints.local_only = local_only;
    send_msg(s, &m);
    dh_wire_msg_fini(&m);
    free(ids);
}

/* Registration with an explicit token; returns the answer's type. */
static enum dh_wire_type register_as(void *s, int server, uint32_t id,
                                     enum dh_wire_role role, uint32_t rank,
                                     const char *token)
{
    struct dh_wire_msg m, a;
    enum dh_wire_type t;

    dh_wire_msg_init(&m, server ? DH_WIRE_REGISTER_SERVER
                                : DH_WIRE_REGISTER_CLIENT);
    if (server) {
        struct dh_wire_register_server *r = &m.u.register_server;

        r->server_id = id;
        snprintf(r->addr, sizeof(r->addr), "tcp://127.0.0.1:%u", 9000 + id);
        r->role = role;
        r->rank = role == DH_WIRE_ROLE_LOCAL ? rank : 0;
        r->workers = 1;
        r->arena_bytes = 1 << 20;
        snprintf(r->token, sizeof(r->token), "%s", token);
    } else {
        m.u.register_client.rank = rank;
        m.u.register_client.world_size = rank + 1;
        snprintf(m.u.register_client.token, sizeof(m.u.register_client.token),
                 "%s", token);
    }
    send_msg(s, &m);
    dh_wire_msg_fini(&m);
    /* The answer is the echo (accepted) or a Shutdown (refused). */
    {
        zmq_pollitem_t it = {.socket = s, .events = ZMQ_POLLIN};
        uint8_t buf[8192];
        int n;

        assert_int_equal(zmq_poll(&it, 1, WAIT_MS), 1);
        n = zmq_recv(s, buf, sizeof(buf), 0);
        assert_true(n > 0 && (size_t)n <= sizeof(buf));
        assert_int_equal(dh_wire_decode(buf, (size_t)n, &a, NULL), 0);
    }
    t = a.type;
    dh_wire_msg_fini(&a);
    return t;
}

/* The legitimate epoch beside an attack: rank 0's step `step` is routed
 * to its local server `a` (id 1) and its result reaches `cl` once (the
 * `before`-th result forwarded). */
static void legit_step(struct fx *f, void *a, void *cl, uint32_t step,
                       uint64_t before)
{
    request(cl, step);
    expect_route(a, step, 1);
    result(a, step, 1);
    expect_result(cl, step, 1);
    expect_none(cl, DH_WIRE_RESULT_NOTICE); /* exactly once */
    ASSERT_STAT(f, results, before + 1);
}

/* "One unauthenticated 7-byte Shutdown stops the Coordinator." */
static void peer_shutdown_is_refused(void **state)
{
    struct fx *f = start("least-request", 5000, 4);
    void *a = server(f, 1, DH_WIRE_ROLE_LOCAL, 0), *cl = client(f, 0);
    void *x = peer(f); /* never registered */
    struct dh_wire_msg m;

    (void)state;
    dh_wire_msg_init(&m, DH_WIRE_SHUTDOWN);
    send_msg(x, &m);
    send_msg(a, &m); /* a registered server is no owner either */
    ASSERT_STAT(f, refused, 2);
    assert_false(wait_finished(f, QUIET_MS));
    legit_step(f, a, cl, 0, 0);
    zmq_close(x);
    zmq_close(a);
    zmq_close(cl);
    stop_and_free(f);
}

/* "Registering as the local DataServer of rank 0 supersedes the real
 * one": without the rank's token a new local server is refused, and a
 * heartbeat with the real server's id from another connection does not
 * take its Routes. */
static void stranger_cannot_supersede_local_server(void **state)
{
    struct fx *f = start("least-request", 5000, 4);
    void *a = server(f, 1, DH_WIRE_ROLE_LOCAL, 0), *cl = client(f, 0);
    void *x = peer(f), *y = peer(f), *z = peer(f);

    (void)state;
    assert_int_equal(register_as(x, 1, 7, DH_WIRE_ROLE_LOCAL, 0,
                                 "ffffffffffffffffffffffffffffffff"),
                     DH_WIRE_SHUTDOWN);
    assert_int_equal(register_as(y, 1, 1, DH_WIRE_ROLE_LOCAL, 0, ""),
                     DH_WIRE_SHUTDOWN); /* the real id, no token */
    heartbeat(z, 1);
    ASSERT_STAT(f, refused, 3);
    ASSERT_STAT(f, dead_servers, 0);
    ASSERT_STAT(f, servers, 1);
    legit_step(f, a, cl, 0, 0);
    expect_none(z, DH_WIRE_ROUTE);
    zmq_close(x);
    zmq_close(y);
    zmq_close(z);
    zmq_close(a);
    zmq_close(cl);
    stop_and_free(f);
}

/* "Registering as rank 0's client steals its results." */
static void stranger_cannot_steal_client(void **state)
{
    struct fx *f = start("least-request", 5000, 4);
    void *a = server(f, 1, DH_WIRE_ROLE_LOCAL, 0), *cl = client(f, 0);
    void *x = peer(f);

    (void)state;
    assert_int_equal(register_as(x, 0, 0, DH_WIRE_ROLE_LOCAL, 0,
                                 "00000000000000000000000000000001"),
                     DH_WIRE_SHUTDOWN);
    ASSERT_STAT(f, refused, 1);
    legit_step(f, a, cl, 0, 0);
    expect_none(x, DH_WIRE_RESULT_NOTICE);
    zmq_close(x);
    zmq_close(a);
    zmq_close(cl);
    stop_and_free(f);
}

/* "Forged tensors labelled with made-up sample ids are accepted": a
 * result from a server the task was not routed to (a registered sidecar)
 * or from a peer that never registered is not forwarded. */
static void forged_results_are_refused(void **state)
{
    struct fx *f = start("least-request", 5000, 4);
    void *a = server(f, 1, DH_WIRE_ROLE_LOCAL, 0), *cl = client(f, 0);
    void *side = server(f, 9, DH_WIRE_ROLE_REMOTE, 0), *x = peer(f);
    struct dh_wire_msg m;

    (void)state;
    request(cl, 0);
    expect_route(a, 0, 1);
    result(side, 0, 9); /* routed to a, not to the sidecar */
    result(x, 0, 1);    /* claims to be a */
    ASSERT_STAT(f, refused, 2);
    expect(side, DH_WIRE_RELEASE, &m); /* its own slot goes back */
    dh_wire_msg_fini(&m);
    expect_none(cl, DH_WIRE_RESULT_NOTICE);
    result(a, 0, 1);
    expect_result(cl, 0, 1);
    expect_none(cl, DH_WIRE_RESULT_NOTICE);
    legit_step(f, a, cl, 1, 1);
    zmq_close(x);
    zmq_close(side);
    zmq_close(a);
    zmq_close(cl);
    stop_and_free(f);
}

/* "A request that claims a victim's future task id with chosen sample
 * ids", and "foreign-epoch requests pin arena slots of another rank": a
 * request is taken only from its rank's registered client, for its own
 * rank, so the victim's own request for that id is routed with its ids. */
static void foreign_task_ids_are_refused(void **state)
{
    struct fx *f = start("least-request", 5000, 4);
    void *a = server(f, 1, DH_WIRE_ROLE_LOCAL, 0), *cl = client(f, 0);
    void *x = client(f, 1), *y = peer(f);
    struct dh_wire_msg m;

    (void)state;
    request_as(x, 0, 0, 0, 5, 900, 24, 0); /* victim's step 5 */
    request_as(x, 1, 0, 0, 6, 900, 24, 0); /* its own rank, victim's id */
    request_as(y, 0, 0, 7, 7, 900, 24, 0); /* foreign epoch, unregistered */
    ASSERT_STAT(f, refused, 3);
    expect_none(a, DH_WIRE_ROUTE);
    ASSERT_STAT(f, requests, 0);
    request(cl, 5);
    expect(a, DH_WIRE_ROUTE, &m);
    assert_int_equal(m.u.route.task.id, task(5).id);
    assert_int_equal(m.u.route.request.n_samples, 2);
    assert_int_equal(m.u.route.request.sample_ids[0], 105);
    dh_wire_msg_fini(&m);
    result(a, 5, 1);
    expect_result(cl, 5, 1);
    legit_step(f, a, cl, 6, 1);
    zmq_close(x);
    zmq_close(y);
    zmq_close(a);
    zmq_close(cl);
    stop_and_free(f);
}

/* "4,000 forged error notices from a peer that never registered fail the
 * victim's epoch." */
static void forged_error_notices_are_refused(void **state)
{
    struct fx *f = start("least-request", 5000, 4);
    void *a = server(f, 1, DH_WIRE_ROLE_LOCAL, 0), *cl = client(f, 0);
    void *x = peer(f);
    struct dh_wire_msg m;

    (void)state;
    request(cl, 0);
    expect_route(a, 0, 1);
    dh_wire_msg_init(&m, DH_WIRE_ERROR_NOTICE);
    m.u.error.server_id = 1;
    m.u.error.cause = DH_EIO;
    for (uint32_t i = 0; i < 4000; i++) {
        m.u.error.task = task(i % 8);
        send_msg(x, &m);
    }
    dh_wire_msg_fini(&m);
    ASSERT_STAT(f, refused, 4000);
    expect_none(cl, DH_WIRE_ERROR_NOTICE);
    result(a, 0, 1);
    expect_result(cl, 0, 1);
    legit_step(f, a, cl, 1, 1);
    zmq_close(x);
    zmq_close(a);
    zmq_close(cl);
    stop_and_free(f);
}

/* "65 requests for a rank with no server starve every rank": one stuck
 * rank with 200 waiting requests, and 100 stuck ranks, hold back no other
 * rank's request. */
static void stuck_ranks_do_not_starve_others(void **state)
{
    struct fx *f = start("least-request", 60000, 4);
    void *a = server(f, 1, DH_WIRE_ROLE_LOCAL, 0), *cl = client(f, 0);
    void *stuck[100];

    (void)state;
    for (uint32_t r = 0; r < 100; r++) {
        stuck[r] = client(f, 10 + r);
        for (uint32_t k = 0; k < (r == 0 ? 200u : 1u); k++)
            request_as(stuck[r], 10 + r, 10 + r, 0, k, 1, 1, 1);
    }
    ASSERT_STAT(f, pending, 299);
    legit_step(f, a, cl, 0, 0);
    legit_step(f, a, cl, 1, 1);
    ASSERT_STAT(f, pending, 299);
    for (uint32_t r = 0; r < 100; r++)
        zmq_close(stuck[r]);
    zmq_close(a);
    zmq_close(cl);
    stop_and_free(f);
}

static void small_caps(struct dh_coordinator_opts *o)
{
    o->max_tasks_per_rank = 16;
    o->pending_timeout_ms = 300;
}

/* "Pending requests never expire (200 requests of 65,536 ids hold 102 MiB
 * for ever)": a rank holds at most its caps (2^21 ids by default: 32 such
 * requests, 16 MiB), and what waits for a server expires. */
static void pending_requests_are_capped_and_expire(void **state)
{
    struct fx *f;
    void *a, *cl, *x;
    struct dh_wire_msg m;
    int errors = 0;

    (void)state;
    f = start("least-request", 60000, 4);
    x = client(f, 3);
    for (uint32_t k = 0; k < 40; k++)
        request_as(x, 3, 3, 0, k, 1, DH_WIRE_MAX_SAMPLES, 1);
    ASSERT_STAT(f, capped, 8);
    ASSERT_STAT(f, pending, 32);
    zmq_close(x);
    stop_and_free(f);

    start_tweak = small_caps;
    f = start("least-request", 60000, 4);
    start_tweak = NULL;
    a = server(f, 1, DH_WIRE_ROLE_LOCAL, 0);
    cl = client(f, 0);
    x = client(f, 3);
    for (uint32_t k = 0; k < 40; k++)
        request_as(x, 3, 3, 0, k, 1, 4, 1);
    ASSERT_STAT(f, capped, 24);
    ASSERT_STAT(f, expired, 16); /* after 300 ms, checked once a second */
    ASSERT_STAT(f, pending, 0);
    while (recv_type(x, DH_WIRE_ERROR_NOTICE, &m, QUIET_MS) == 0) {
        assert_true(m.u.error.cause == DH_ETOOBIG ||
                    m.u.error.cause == DH_ETIMEOUT);
        errors++;
        dh_wire_msg_fini(&m);
    }
    assert_int_equal(errors, 40); /* every request answered */
    legit_step(f, a, cl, 0, 0);
    zmq_close(x);
    zmq_close(a);
    zmq_close(cl);
    stop_and_free(f);
}

static void small_registry(struct dh_coordinator_opts *o)
{
    o->max_servers = 64;
}

/* "1,024 fake registrations fill the registry and the real DataServer is
 * refused": one connection registers one server; remote servers take at
 * most half the registry, local servers of ranks without a client a
 * quarter; the job's local server still gets in. */
static void fake_registrations_leave_room_for_the_job(void **state)
{
    struct fx *f;
    void *one, *many[80], *a, *cl;
    int ok = 0;
    char t[DH_WIRE_TOKEN_LEN + 1];

    (void)state;
    start_tweak = small_registry;
    f = start("least-request", 60000, 4);
    start_tweak = NULL;
    one = peer(f);
    for (uint32_t i = 0; i < 100; i++)
        ok += register_as(one, 1, 100 + i, DH_WIRE_ROLE_REMOTE, 0, "") ==
              DH_WIRE_REGISTER_SERVER;
    assert_int_equal(ok, 1);
    for (uint32_t i = 0; i < 80; i++) {
        many[i] = peer(f);
        snprintf(t, sizeof(t), "%032x", 0x5000u + i);
        ok += register_as(many[i], 1, 200 + i,
                          i < 40 ? DH_WIRE_ROLE_REMOTE : DH_WIRE_ROLE_LOCAL,
                          1000 + i, i < 40 ? "" : t) == DH_WIRE_REGISTER_SERVER;
    }
    assert_int_equal(ok, 32 + 16); /* 32 remote slots, 16 orphan local */
    cl = client(f, 0);
    a = server(f, 1, DH_WIRE_ROLE_LOCAL, 0);
    legit_step(f, a, cl, 0, 0);
    for (uint32_t i = 0; i < 80; i++)
        zmq_close(many[i]);
    zmq_close(one);
    zmq_close(a);
    zmq_close(cl);
    stop_and_free(f);
}

static void few_clients(struct dh_coordinator_opts *o)
{
    o->max_clients = 8;
    o->claim_timeout_ms = 300;
}

/* Fake client registrations fill the client registry only while they
 * live: claims that lapsed (claim_timeout_ms without a message) and hold
 * no task are reclaimed for the job's own rank. */
static void lapsed_fake_clients_are_reclaimed(void **state)
{
    struct fx *f;
    void *fake[8], *a, *cl = NULL;
    char t[DH_WIRE_TOKEN_LEN + 1];

    (void)state;
    start_tweak = few_clients;
    f = start("least-request", 60000, 4);
    start_tweak = NULL;
    for (uint32_t i = 0; i < 8; i++) {
        fake[i] = peer(f);
        snprintf(t, sizeof(t), "%032x", 0x7000u + i);
        assert_int_equal(
            register_as(fake[i], 0, 0, DH_WIRE_ROLE_LOCAL, 100 + i, t),
            DH_WIRE_REGISTER_CLIENT);
    }
    a = peer(f);
    assert_int_equal(register_as(a, 0, 0, DH_WIRE_ROLE_LOCAL, 0, tok(0)),
                     DH_WIRE_SHUTDOWN); /* full while they live */
    zmq_close(a);
    {
        struct timespec ts = {0, 400 * 1000000};

        nanosleep(&ts, NULL); /* past claim_timeout_ms */
    }
    cl = client(f, 0);
    a = server(f, 1, DH_WIRE_ROLE_LOCAL, 0);
    legit_step(f, a, cl, 0, 0);
    for (uint32_t i = 0; i < 8; i++)
        zmq_close(fake[i]);
    zmq_close(a);
    zmq_close(cl);
    stop_and_free(f);
}

static void low_rate(struct dh_coordinator_opts *o)
{
    o->peer_msgs_per_s = 200;
}

/* Per-peer message rate caps: a flood from one peer is dropped (counted,
 * not logged), other peers are served. */
static void a_flooding_peer_is_rate_limited(void **state)
{
    struct fx *f;
    void *a, *cl, *x;

    (void)state;
    start_tweak = low_rate;
    f = start("least-request", 60000, 4);
    start_tweak = NULL;
    a = server(f, 1, DH_WIRE_ROLE_LOCAL, 0);
    cl = client(f, 0);
    x = peer(f);
    for (int i = 0; i < 2000; i++)
        heartbeat(x, 77);
    {
        struct dh_coordinator_stats s;
        uint64_t end = now_ms() + WAIT_MS;

        /* Every heartbeat is either dropped or answered "unknown" (a
         * restarted Coordinator's answer, docs/exactly-once.md): at 200
         * messages a second, most of 2,000 sent at once are dropped. */
        do
            s = stats(f);
        while (s.rate_limited < 1500 && now_ms() < end);
        assert_true(s.rate_limited >= 1500);
        assert_true(s.rate_limited <= 2000);
    }
    legit_step(f, a, cl, 0, 0);
    zmq_close(x);
    zmq_close(a);
    zmq_close(cl);
    stop_and_free(f);
}

/* A flood of refusals cannot fill or block the log: lines are capped per
 * second, the rest counted. */
static void refusal_log_is_rate_limited(void **state)
{
    struct fx *f = start("least-request", 60000, 4);
    void *a = server(f, 1, DH_WIRE_ROLE_LOCAL, 0), *cl = client(f, 0);
    void *x = peer(f);
    char path[] = "/tmp/dh-attacks-log-XXXXXX", line[1024];
    int fd = mkstemp(path), saved = dup(2), lines = 0;
    struct dh_wire_msg m;
    FILE *log;

    (void)state;
    assert_true(fd >= 0 && saved >= 0);
    fflush(stderr);
    assert_true(dup2(fd, 2) >= 0);
    dh_wire_msg_init(&m, DH_WIRE_SHUTDOWN);
    for (int i = 0; i < 500; i++)
        send_msg(x, &m);
    ASSERT_STAT(f, refused, 500);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    assert_non_null(log = fdopen(fd, "r"));
    rewind(log);
    while (fgets(line, sizeof(line), log))
        lines += strstr(line, "refused shutdown") != NULL;
    fclose(log);
    unlink(path);
    assert_true(lines >= 1);
    assert_true(lines <= 40); /* 20 a second; the test may span two */
    legit_step(f, a, cl, 0, 0);
    zmq_close(x);
    zmq_close(a);
    zmq_close(cl);
    stop_and_free(f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(peer_shutdown_is_refused),
        cmocka_unit_test(stranger_cannot_supersede_local_server),
        cmocka_unit_test(stranger_cannot_steal_client),
        cmocka_unit_test(forged_results_are_refused),
        cmocka_unit_test(foreign_task_ids_are_refused),
        cmocka_unit_test(forged_error_notices_are_refused),
        cmocka_unit_test(stuck_ranks_do_not_starve_others),
        cmocka_unit_test(pending_requests_are_capped_and_expire),
        cmocka_unit_test(fake_registrations_leave_room_for_the_job),
        cmocka_unit_test(lapsed_fake_clients_are_reclaimed),
        cmocka_unit_test(a_flooding_peer_is_rate_limited),
        cmocka_unit_test(refusal_log_is_rate_limited),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
