/*
 * test_cpu_pools.c - CPU pools (docs/placement.md "CPU pools", issue 21
 * item 3): the DataServer side's parsers, the pool cap, the placement
 * table's pool gate, and the Coordinator running a shared pool's tasks
 * the earliest due first, as many at once as its CPUs.
 */
#include "co_fixture.h"

#include <math.h>
#include <stdarg.h>

#include "datahelix/place.h"
#include "runtime/coordinator_internal.h"
#include "runtime/cpu_pool.h"

static void quota_and_schedstat_text(void **state)
{
    uint64_t c = 0, w = 0;

    (void)state;
    assert_int_equal(dh__cpu_quota_cpus("max 100000\n"), 0);
    assert_int_equal(dh__cpu_quota_cpus("150000 100000\n"), 2);
    assert_int_equal(dh__cpu_quota_cpus("100000 100000"), 1);
    assert_int_equal(dh__cpu_quota_cpus("50000 100000"), 1);
    assert_int_equal(dh__cpu_quota_cpus("400000 100000"), 4);
    assert_int_equal(dh__cpu_quota_cpus("garbage"), 0);
    assert_int_equal(dh__cpu_quota_cpus("100000 0"), 0);
    assert_int_equal(dh__cpu_quota_cpus(""), 0);
    assert_int_equal(dh__cpu_quota_cpus(NULL), 0);
    assert_int_equal(dh__schedstat_parse("139522 77 2\n", &c, &w), 0);
    assert_int_equal(c, 139522);
    assert_int_equal(w, 77);
    assert_int_equal(dh__schedstat_parse("x", &c, &w), -1);
    assert_int_equal(dh__schedstat_parse(NULL, &c, &w), -1);
}

static void this_process_has_cpus_and_a_key(void **state)
{
    uint32_t cpus, cpus2;
    uint64_t key, key2, cpu0, wait0, cpu1, wait1;
    volatile double x = 1;

    (void)state;
    dh__cpu_pool_probe(&cpus, &key);
    dh__cpu_pool_probe(&cpus2, &key2);
    assert_true(cpus >= 1);
    assert_int_equal(cpus, cpus2);
    assert_true(key == key2); /* the same CPUs: the same pool */
    if (key == 0)
        skip(); /* no boot id readable: this server would join no pool */
    if (dh__thread_sched(&cpu0, &wait0) < 0)
        skip(); /* a kernel without schedstat: pools stay at their CPUs */
    for (int i = 0; i < 20000000; i++)
        x = x * 1.0000001;
    assert_int_equal(dh__thread_sched(&cpu1, &wait1), 0);
    assert_true(cpu1 > cpu0); /* the loop's CPU is seen */
    assert_true(wait1 >= wait0);
}

static void cap_follows_the_cpu_share(void **state)
{
    (void)state;
    assert_int_equal(dh__co_pool_cap(0, 0.5), 0); /* no CPUs named: none */
    assert_int_equal(dh__co_pool_cap(1, 0), 1);   /* not measured yet */
    assert_int_equal(dh__co_pool_cap(1, 1), 1);   /* pure compute */
    assert_int_equal(dh__co_pool_cap(1, 0.9), 1); /* near it */
    assert_int_equal(dh__co_pool_cap(2, 0.5), 4); /* half waits on I/O */
    assert_int_equal(dh__co_pool_cap(2, 0.6), 3); /* 3.33 */
    assert_int_equal(dh__co_pool_cap(4, 0.01), 400);
    assert_int_equal(dh__co_pool_cap(4, NAN), 4);
    assert_int_equal(dh__co_pool_cap(64, 1e-9), 65536); /* bounded */
}

/* The table's gate: a pool at its cap makes each of its servers at cap. */
static void place_gates_a_pool(void **state)
{
    struct dh_place *p;
    struct dh_place_req q = {
        .rank = 0, .local_server = 0, .cpu_ms = 10, .deadline_ms = 100};
    struct dh_cost_terms ct;
    int64_t n = -1;

    (void)state;
    assert_int_equal(dh_place_create(8, NULL, &p, NULL), 0);
    for (int i = 0; i < 3; i++)
        assert_int_equal(
            dh_place_add_server(p, i, DH_PLACE_ROLE_LOCAL, i, 1, 0, NULL), 0);
    assert_int_equal(
        dh_place_add_server(p, 3, DH_PLACE_ROLE_REMOTE, -1, 1, 0, NULL), 0);
    assert_int_equal(dh_place_set_pool(p, 3, 0, NULL), DH_EINVAL); /* remote */
    assert_int_equal(dh_place_set_pool(p, 0, 8, NULL), DH_EINVAL);
    assert_int_equal(dh_place_set_pool(p, 5, 0, NULL), DH_ENOTFOUND);
    assert_int_equal(dh_place_pool_cap(p, 0, -1), DH_EINVAL);
    assert_int_equal(dh_place_set_pool(p, 0, 0, NULL), 0);
    assert_int_equal(dh_place_set_pool(p, 1, 0, NULL), 0);
    assert_int_equal(dh_place_pool_cap(p, 0, 1), 0);
    assert_int_equal(dh_cost_predict(p, 1, &q, &ct), 0);
    assert_false(ct.at_cap);
    assert_int_equal(dh_place_assign(p, 0, 10), 0);
    assert_int_equal(dh_place_pool_tasks(p, 0, &n), 0);
    assert_int_equal(n, 1);
    q.local_server = 1;
    assert_int_equal(dh_cost_predict(p, 1, &q, &ct), 0);
    assert_true(ct.at_cap); /* its pool's one CPU is taken by server 0 */
    assert_int_equal(dh_cost_predict(p, 2, &q, &ct), 0);
    assert_false(ct.at_cap); /* server 2 is in no pool */
    assert_int_equal(dh_place_pool_cap(p, 0, 2), 0);
    assert_int_equal(dh_cost_predict(p, 1, &q, &ct), 0);
    assert_false(ct.at_cap);
    assert_int_equal(dh_place_pool_cap(p, 0, 1), 0);
    /* Its tasks leave with a server that moves out, or is removed. */
    assert_int_equal(dh_place_set_pool(p, 0, -1, NULL), 0);
    assert_int_equal(dh_place_pool_tasks(p, 0, &n), 0);
    assert_int_equal(n, 0);
    assert_int_equal(dh_place_set_pool(p, 0, 0, NULL), 0);
    assert_int_equal(dh_place_pool_tasks(p, 0, &n), 0);
    assert_int_equal(n, 1);
    assert_int_equal(dh_place_remove_server(p, 0, NULL), 0);
    assert_int_equal(dh_place_pool_tasks(p, 0, &n), 0);
    assert_int_equal(n, 0);
    assert_int_equal(dh_cost_predict(p, 1, &q, &ct), 0);
    assert_false(ct.at_cap);
    /* A completion frees the slot. */
    assert_int_equal(dh_place_assign(p, 1, 10), 0);
    assert_int_equal(dh_cost_predict(p, 1, &q, &ct), 0);
    assert_true(ct.at_cap);
    assert_int_equal(dh_place_complete(p, 1, 10, 12), 0);
    assert_int_equal(dh_cost_predict(p, 1, &q, &ct), 0);
    assert_false(ct.at_cap);
    /* A released task leaves the pool's count, not its server's; it
     * counts again before it completes, and a removed server takes only
     * what it still counted. */
    assert_int_equal(dh_place_pool_release(p, 1), DH_EINVAL);
    assert_int_equal(
        dh_place_add_server(p, 0, DH_PLACE_ROLE_LOCAL, 0, 4, 0, NULL), 0);
    assert_int_equal(dh_place_set_pool(p, 0, 0, NULL), 0);
    assert_int_equal(dh_place_assign(p, 1, 10), 0);
    assert_int_equal(dh_place_pool_release(p, 1), 0);
    assert_int_equal(dh_place_pool_release(p, 1), DH_EINVAL); /* one task */
    assert_int_equal(dh_place_pool_tasks(p, 0, &n), 0);
    assert_int_equal(n, 0);
    assert_int_equal(dh_cost_predict(p, 0, &q, &ct), 0);
    assert_false(ct.at_cap); /* the pool's one CPU is free again */
    assert_int_equal(dh_place_assign(p, 0, 10), 0);
    assert_int_equal(dh_place_pool_rehold(p, 1), 0);
    assert_int_equal(dh_place_pool_rehold(p, 1), DH_EINVAL);
    assert_int_equal(dh_place_pool_tasks(p, 0, &n), 0);
    assert_int_equal(n, 2);
    assert_int_equal(dh_place_complete(p, 1, 10, 5000), 0);
    assert_int_equal(dh_place_pool_release(p, 0), 0);
    assert_int_equal(dh_place_remove_server(p, 0, NULL), 0);
    assert_int_equal(dh_place_pool_tasks(p, 0, &n), 0);
    assert_int_equal(n, 0);
    dh_place_destroy(p);
}

/* ---- the Coordinator ---- */

/* Closes the sockets given, up to a NULL. */
static void close_all(void *s, ...)
{
    va_list ap;

    va_start(ap, s);
    for (; s; s = va_arg(ap, void *))
        zmq_close(s);
    va_end(ap);
}

static void *pool_server_w(struct fx *f, uint32_t id, uint32_t rank,
                           uint64_t cpu_set, uint32_t workers)
{
    void *s = peer(f);
    struct dh_wire_msg m, ack;

    dh_wire_msg_init(&m, DH_WIRE_REGISTER_SERVER);
    m.u.register_server.server_id = id;
    snprintf(m.u.register_server.addr, sizeof(m.u.register_server.addr),
             "ipc://server-%u", id);
    m.u.register_server.role = DH_WIRE_ROLE_LOCAL;
    m.u.register_server.rank = rank;
    snprintf(m.u.register_server.token, sizeof(m.u.register_server.token), "%s",
             tok(rank));
    snprintf(m.u.register_server.host, sizeof(m.u.register_server.host),
             "node-a");
    m.u.register_server.workers = workers;
    m.u.register_server.arena_bytes = 1 << 20;
    m.u.register_server.cpus = 1;
    m.u.register_server.cpu_set = cpu_set;
    send_msg(s, &m);
    expect(s, DH_WIRE_REGISTER_SERVER, &ack);
    dh_wire_msg_fini(&ack);
    return s;
}

static void *pool_server(struct fx *f, uint32_t id, uint32_t rank,
                         uint64_t cpu_set)
{
    return pool_server_w(f, id, rank, cpu_set, 2);
}

static struct dh_wire_task rtask(uint32_t rank, uint32_t step)
{
    struct dh_wire_task t;

    assert_int_equal(dh_wire_task_make(&t, 0, 0, step, rank, 0, NULL), 0);
    return t;
}

static void *rank_client(struct fx *f, uint32_t rank)
{
    return client_on(f, NULL, rank, NULL);
}

static void rank_request(void *s, uint32_t rank, uint32_t step, int64_t slack)
{
    struct dh_wire_msg m;
    uint64_t ids[1] = {1000 * rank + step};

    dh_wire_msg_init(&m, DH_WIRE_DESCRIPTOR_REQUEST);
    m.u.request.task = rtask(rank, step);
    m.u.request.requester_rank = rank;
    assert_int_equal(dh_wire_set_samples(&m.u.request, ids, 1, NULL), 0);
    m.u.request.slack_ms = slack;
    m.u.request.hints.est_cpu_ms = 10;
    send_msg(s, &m);
    dh_wire_msg_fini(&m);
}

static void rank_result(void *s, uint32_t rank, uint32_t step, uint32_t sid)
{
    struct dh_wire_msg m;
    uint64_t ids[1] = {1000 * rank + step};

    dh_wire_msg_init(&m, DH_WIRE_RESULT_NOTICE);
    m.u.result.task = rtask(rank, step);
    m.u.result.server_id = sid;
    m.u.result.arena_offset = 4096;
    m.u.result.length = 64;
    m.u.result.slot_generation = 7;
    m.u.result.dims[0] = 64;
    m.u.result.ndims = 1;
    m.u.result.dtype = DH_DTYPE_U8;
    assert_int_equal(
        dh_wire_set_result_samples(&m.u.result, ids, NULL, 1, NULL), 0);
    send_msg(s, &m);
    dh_wire_msg_fini(&m);
}

static void expect_rank_route(void *s, uint32_t rank, uint32_t step)
{
    struct dh_wire_msg m;

    expect(s, DH_WIRE_ROUTE, &m);
    assert_int_equal(m.u.route.task.id, rtask(rank, step).id);
    dh_wire_msg_fini(&m);
}

static void fraction(void *s, uint32_t id, double f, uint32_t waiting)
{
    struct dh_wire_msg m;

    dh_wire_msg_init(&m, DH_WIRE_HEARTBEAT);
    m.u.heartbeat.server_id = id;
    m.u.heartbeat.cpu_fraction = f;
    m.u.heartbeat.slot_waiting = waiting;
    send_msg(s, &m);
}

/* Two ranks' servers on one CPU: one task at a time, the earliest due
 * first across the ranks; a third server on other CPUs is not held. */
static void a_shared_cpu_runs_the_earliest_due_first(void **state)
{
    struct fx *f = start("deadline", 5000, 4);
    void *a = pool_server(f, 1, 0, 42), *b = pool_server(f, 2, 1, 42);
    void *c3 = pool_server(f, 3, 2, 43);
    void *k0 = rank_client(f, 0), *k1 = rank_client(f, 1);
    void *k2 = rank_client(f, 2);

    (void)state;
    rank_request(k0, 0, 0, 1000);
    expect_rank_route(a, 0, 0);
    rank_request(k0, 0, 1, 3000);
    rank_request(k0, 0, 2, 5000);
    ASSERT_STAT(f, pending, 2);
    rank_request(k1, 1, 0, 2000); /* due before rank 0's step 1 */
    ASSERT_STAT(f, pending, 3);
    expect_none(a, DH_WIRE_ROUTE); /* the one CPU is taken */
    expect_none(b, DH_WIRE_ROUTE);
    rank_request(k2, 2, 0, 1000);
    expect_rank_route(c3, 2, 0); /* other CPUs: not held */
    heartbeat(c3, 3);            /* alive, whatever the sanitizers' pace */
    rank_result(a, 0, 0, 1);
    expect_rank_route(b, 1, 0); /* earliest due, another rank */
    expect_none(a, DH_WIRE_ROUTE);
    /* A later step is not run first for a shorter slack: the ranks'
     * estimates of one moment differ, their steps do not. */
    rank_request(k1, 1, 2, 100);
    ASSERT_STAT(f, pending, 3);
    rank_result(b, 1, 0, 2);
    expect_rank_route(a, 0, 1);
    expect_none(a, DH_WIRE_ROUTE);
    expect_none(b, DH_WIRE_ROUTE);
    rank_result(a, 0, 1, 1);
    expect_rank_route(b, 1, 2); /* step 2: the earlier due of the two */
    rank_result(b, 1, 2, 2);
    expect_rank_route(a, 0, 2);
    rank_result(a, 0, 2, 1);
    rank_request(k0, 0, 3, 3000);
    expect_rank_route(a, 0, 3);
    rank_request(k0, 0, 4, 5000);
    ASSERT_STAT(f, pending, 1);
    /* Tasks that wait on I/O half their time: two at once. */
    fraction(a, 1, 0.5, 0);
    fraction(b, 2, 0.5, 0);
    expect_rank_route(a, 0, 4);
    rank_result(a, 0, 3, 1);
    rank_result(a, 0, 4, 1);
    rank_result(c3, 2, 0, 3);
    ASSERT_STAT(f, results, 8);
    ASSERT_STAT(f, pending, 0);
    close_all(a, b, c3, k0, k1, k2, NULL);
    stop_and_free(f);
}

/* A worker waiting for room in its rank's arena holds no CPU: its task
 * leaves the pool's count, so another rank is not held behind it; and a
 * pooled server never takes more tasks than its workers can start. */
static void waiting_workers_and_busy_servers_free_the_cpu(void **state)
{
    struct fx *f = start("deadline", 5000, 4);
    void *a = pool_server_w(f, 1, 0, 42, 1), *b = pool_server_w(f, 2, 1, 42, 1);
    void *k0 = rank_client(f, 0), *k1 = rank_client(f, 1);

    (void)state;
    rank_request(k0, 0, 0, 1000);
    expect_rank_route(a, 0, 0);
    rank_request(k1, 1, 0, 2000);
    ASSERT_STAT(f, pending, 1);
    expect_none(b, DH_WIRE_ROUTE);
    fraction(a, 1, 0, 4096); /* a's one worker waits for arena room */
    expect_rank_route(b, 1, 0);
    rank_request(k1, 1, 1, 3000);
    expect_none(b, DH_WIRE_ROUTE); /* b's one worker is busy */
    fraction(a, 1, 0, 0);
    /* Tasks at a quarter CPU: 4 at once, but a has one worker. */
    fraction(a, 1, 0.25, 0);
    rank_request(k0, 0, 1, 3000);
    rank_request(k0, 0, 2, 4000);
    ASSERT_STAT(f, pending, 3);
    expect_none(a, DH_WIRE_ROUTE);
    rank_result(a, 0, 0, 1);
    expect_rank_route(a, 0, 1);
    expect_none(a, DH_WIRE_ROUTE);
    rank_result(a, 0, 1, 1);
    expect_rank_route(a, 0, 2);
    rank_result(a, 0, 2, 1);
    rank_result(b, 1, 0, 2);
    expect_rank_route(b, 1, 1);
    rank_result(b, 1, 1, 2);
    ASSERT_STAT(f, results, 5);
    close_all(a, b, k0, k1, NULL);
    stop_and_free(f);
}

/* A task running far past its prediction (here 10 ms predicted: the 2 s
 * floor) stops holding its pool: another rank's task goes, and the late
 * result still completes and leaves the counts right. */
static void a_stuck_task_frees_its_pool_slot(void **state)
{
    struct fx *f = start("deadline", 10000, 4);
    void *a = pool_server_w(f, 1, 0, 42, 1), *b = pool_server_w(f, 2, 1, 42, 1);
    void *k0 = rank_client(f, 0), *k1 = rank_client(f, 1);
    uint64_t t0;

    (void)state;
    rank_request(k0, 0, 0, 1000);
    expect_rank_route(a, 0, 0);
    t0 = now_ms();
    rank_request(k1, 1, 0, 2000);
    ASSERT_STAT(f, pending, 1);
    for (int i = 0; i < 2; i++) { /* alive meanwhile */
        struct timespec ts = {1, 0};

        nanosleep(&ts, NULL);
        heartbeat(a, 1);
        heartbeat(b, 2);
    }
    expect_rank_route(b, 1, 0);
    assert_true(now_ms() - t0 >= 1900); /* not before the bound */
    rank_result(a, 0, 0, 1);
    rank_result(b, 1, 0, 2);
    ASSERT_STAT(f, results, 2);
    /* One CPU, one task at a time again. */
    rank_request(k0, 0, 1, 3000);
    expect_rank_route(a, 0, 1);
    rank_request(k1, 1, 1, 4000);
    ASSERT_STAT(f, pending, 1);
    expect_none(b, DH_WIRE_ROUTE);
    rank_result(a, 0, 1, 1);
    expect_rank_route(b, 1, 1);
    rank_result(b, 1, 1, 2);
    ASSERT_STAT(f, results, 4);
    close_all(a, b, k0, k1, NULL);
    stop_and_free(f);
}

static void no_cpu_pools(struct dh_coordinator_opts *o)
{
    o->cpu_pools = 0;
}

/* Off (--cpu-pools off), and under another policy: each server takes its
 * own queue's worth, as before. */
static void pools_off_hold_nothing(void **state)
{
    for (int pass = 0; pass < 2; pass++) {
        struct fx *f;
        void *a, *b, *k0, *k1;

        start_tweak = pass == 0 ? no_cpu_pools : NULL;
        f = start(pass == 0 ? "deadline" : "least-request", 5000, 4);
        start_tweak = NULL;
        a = pool_server(f, 1, 0, 42);
        b = pool_server(f, 2, 1, 42);
        k0 = rank_client(f, 0);
        k1 = rank_client(f, 1);
        (void)state;
        rank_request(k0, 0, 0, 1000);
        rank_request(k0, 0, 1, 3000);
        rank_request(k1, 1, 0, 2000);
        expect_rank_route(a, 0, 0);
        expect_rank_route(a, 0, 1);
        expect_rank_route(b, 1, 0);
        close_all(a, b, k0, k1, NULL);
        stop_and_free(f);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(quota_and_schedstat_text),
        cmocka_unit_test(this_process_has_cpus_and_a_key),
        cmocka_unit_test(cap_follows_the_cpu_share),
        cmocka_unit_test(place_gates_a_pool),
        cmocka_unit_test(a_shared_cpu_runs_the_earliest_due_first),
        cmocka_unit_test(waiting_workers_and_busy_servers_free_the_cpu),
        cmocka_unit_test(a_stuck_task_frees_its_pool_slot),
        cmocka_unit_test(pools_off_hold_nothing),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
