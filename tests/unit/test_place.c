/* test_place.c - deadline-aware placement (Eq. 1, DESIGN 3) on constructed
 * scenarios, the baseline policies, feedback, the remote index against a
 * full scan, allocation-freedom of the decide path, and the GPU window. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/alloc.h"
#include "datahelix/place.h"

#define MB 1e6

/* Local server 0 (rank 0) + remotes 1..nremote, `workers` each. */
static struct dh_place *mk(enum dh_place_policy pol, int nremote, int cap,
                           double gain)
{
    struct dh_place_opts o;
    struct dh_place *p = NULL;
    struct dh_err e;

    dh_place_opts_default(&o);
    o.policy = pol;
    o.remote_gain_ms = gain;
    assert_int_equal(dh_place_create(64, &o, &p, &e), 0);
    assert_int_equal(
        dh_place_add_server(p, 0, DH_PLACE_ROLE_LOCAL, 0, 1, cap, &e), 0);
    for (int i = 1; i <= nremote; i++)
        assert_int_equal(
            dh_place_add_server(p, i, DH_PLACE_ROLE_REMOTE, -1, 1, cap, &e), 0);
    return p;
}

static struct dh_place_req req_of(double cpu, double deadline)
{
    struct dh_place_req r = {.rank = 0,
                             .local_server = 0,
                             .cpu_ms = cpu,
                             .io_ms = 0,
                             .out_bytes = 1 * MB,
                             .deadline_ms = deadline};
    return r;
}

static void load(struct dh_place *p, int32_t id, double work_ms)
{
    assert_int_equal(dh_place_assign(p, id, work_ms), 0);
}

static struct dh_place_decision decide(struct dh_place *p,
                                       const struct dh_place_req *r)
{
    struct dh_place_decision d;

    assert_int_equal(dh_place_decide(p, r, &d), 0);
    return d;
}

static void local_meets_stays_local(void **state)
{
    struct dh_place *p = mk(DH_PLACE_POLICY_DEADLINE, 2, 0, 5);
    struct dh_place_req r = req_of(10, 100);
    struct dh_place_decision d = decide(p, &r);

    (void)state;
    assert_int_equal(d.server, 0);
    assert_int_equal(d.reason, DH_PLACE_REASON_LOCAL_MEETS);
    assert_true(fabs(d.t_pred_ms - 10) < 1e-9);
    assert_true(d.miss_ms == 0);
    assert_int_equal(d.scored, 3);
    assert_true(d.work_ms == 10);
    dh_place_destroy(p);
}

static void local_misses_remote_meets(void **state)
{
    struct dh_place *p = mk(DH_PLACE_POLICY_DEADLINE, 2, 0, 5);
    struct dh_place_req r = req_of(10, 100);
    struct dh_place_decision d;

    (void)state;
    load(p, 0, 200); /* local T = 210 > 100 */
    load(p, 2, 30);  /* remote 2 meets too but finishes later */
    d = decide(p, &r);
    assert_int_equal(d.server, 1);
    assert_int_equal(d.reason, DH_PLACE_REASON_LEAST_MISS);
    assert_true(d.miss_ms == 0);
    /* C_net: 1 MB at the default 1000 MB/s + 0.2 ms latency. */
    assert_true(fabs(d.t_pred_ms - (10 + 1 + 0.2)) < 1e-9);
    assert_int_equal(d.top[0].server, 1);
    dh_place_destroy(p);
}

static void all_miss_earliest_finish(void **state)
{
    struct dh_place *p = mk(DH_PLACE_POLICY_DEADLINE, 2, 0, 5);
    struct dh_place_req r = req_of(10, 50);
    struct dh_place_decision d;

    (void)state;
    load(p, 0, 300);
    load(p, 1, 200);
    load(p, 2, 150);
    d = decide(p, &r);
    assert_int_equal(d.server, 2);
    assert_int_equal(d.reason, DH_PLACE_REASON_EARLIEST_FINISH);
    assert_true(d.miss_ms > 0);
    assert_true(fabs(d.miss_ms - (d.t_pred_ms - 50)) < 1e-9);
    assert_int_equal(d.ntop, 3);
    assert_true(d.top[0].t_pred_ms <= d.top[1].t_pred_ms);
    assert_true(d.top[1].t_pred_ms <= d.top[2].t_pred_ms);
    dh_place_destroy(p);
}

static void saturated_server_is_skipped(void **state)
{
    struct dh_place *p = mk(DH_PLACE_POLICY_DEADLINE, 2, 2, 5);
    struct dh_place_req r = req_of(10, 50);
    struct dh_place_decision d;

    (void)state;
    load(p, 0, 100);
    load(p, 1, 80);
    load(p, 2, 0); /* the fastest, but at its cap of 2 */
    load(p, 2, 0);
    d = decide(p, &r);
    assert_int_equal(d.server, 1);
    for (int i = 0; i < d.ntop; i++)
        assert_int_not_equal(d.top[i].server, 2);
    assert_int_equal(d.scored, 2);
    /* One completion frees a slot and it wins again. */
    assert_int_equal(dh_place_complete(p, 2, 0, 0), 0);
    d = decide(p, &r);
    assert_int_equal(d.server, 2);
    dh_place_destroy(p);
}

static void all_saturated_backpressure(void **state)
{
    enum dh_place_policy pols[] = {DH_PLACE_POLICY_DEADLINE,
                                   DH_PLACE_POLICY_ROUND_ROBIN,
                                   DH_PLACE_POLICY_LEAST_REQUEST};

    (void)state;
    for (int k = 0; k < 3; k++) {
        struct dh_place *p = mk(pols[k], 3, 1, 5);
        struct dh_place_req r = req_of(10, 50);
        struct dh_place_decision d;
        for (int i = 0; i <= 3; i++)
            load(p, i, 5);
        d = decide(p, &r);
        assert_int_equal(d.server, -1);
        assert_int_equal(d.reason, DH_PLACE_REASON_BACKPRESSURE);
        assert_int_equal(dh_place_decide_full(p, &r, &d), 0);
        assert_int_equal(d.reason, DH_PLACE_REASON_BACKPRESSURE);
        dh_place_destroy(p);
    }
}

static void slow_link_pushes_back_to_local(void **state)
{
    struct dh_place *p = mk(DH_PLACE_POLICY_DEADLINE, 1, 0, 5);
    struct dh_place_req r = req_of(10, 50);
    struct dh_place_decision d;

    (void)state;
    r.out_bytes = 8 * MB;
    load(p, 0, 60); /* local: T = 70, misses by 20 */
    d = decide(p, &r);
    assert_int_equal(d.server, 1); /* 10 + 8 + 0.2 ms over a fast link */
    /* The link turns out to carry 5 MB/s: 8 MB now costs 1.6 s. */
    for (int i = 0; i < 4; i++)
        assert_int_equal(dh_place_link(p, 1, 0, 10 * MB, 2.0), 0);
    d = decide(p, &r);
    assert_int_equal(d.server, 0);
    assert_int_equal(d.reason, DH_PLACE_REASON_EARLIEST_FINISH);
    /* Small payloads update latency, not bandwidth. */
    assert_int_equal(dh_place_link(p, 1, 0, 100, 0.5), 0);
    {
        struct dh_cost_terms t;
        r.out_bytes = 0;
        assert_int_equal(dh_cost_predict(p, 1, &r, &t), 0);
        assert_true(t.net_ms > 100); /* 0.3 * 500 ms latency sample */
    }
    dh_place_destroy(p);
}

static void slowdown_feedback_moves_work(void **state)
{
    struct dh_place *p = mk(DH_PLACE_POLICY_DEADLINE, 2, 0, 5);
    struct dh_place_req r = req_of(10, 100);
    struct dh_place_decision d;
    int updates = 0;

    (void)state;
    r.local_server = -1; /* no local: remotes only, no C_net */
    load(p, 2, 5);       /* remote 1 is slightly better at first */
    d = decide(p, &r);
    assert_int_equal(d.server, 1);
    /* Remote 1 slows down: its tasks take 3x their prediction. */
    while (d.server == 1 && updates < 10) {
        load(p, 1, 10);
        assert_int_equal(dh_place_complete(p, 1, 10, 30), 0);
        updates++;
        d = decide(p, &r);
    }
    assert_int_equal(d.server, 2);
    assert_true(updates <= 3);
    dh_place_destroy(p);
}

/* Issue 35 item 6: a server whose bytes are slow to reach predicts late
 * for a task that reads many bytes, and the work it is charged includes
 * its read term; a task that reads nothing is not moved. */
static void read_rate_is_part_of_the_cost(void **state)
{
    struct dh_place *p = mk(DH_PLACE_POLICY_DEADLINE, 1, 0, 5);
    struct dh_place_req r = req_of(10, 60);
    struct dh_place_decision d;
    struct dh_cost_terms t;

    (void)state;
    r.in_bytes = 50 * MB;
    assert_int_equal(decide(p, &r).server, 0); /* nothing measured yet */
    /* the local server's store: 2 ms per MB, 100 ms for this task */
    assert_int_equal(dh_place_read_rate(p, 0, 2.0), 0);
    assert_int_equal(dh_cost_predict(p, 0, &r, &t), 0);
    assert_true(fabs(t.io_ms - 100) < 1e-9);
    assert_true(fabs(t.t_ms - 110) < 1e-9);
    /* the remote (near the data): 0.1 ms per MB, 5 ms: it meets */
    assert_int_equal(dh_place_read_rate(p, 1, 0.1), 0);
    d = decide(p, &r);
    assert_int_equal(d.server, 1);
    assert_true(d.miss_ms == 0);
    assert_true(fabs(d.work_ms - (10 + 5)) < 1e-9);
    /* the same task reading nothing stays local */
    r.in_bytes = 0;
    d = decide(p, &r);
    assert_int_equal(d.server, 0);
    assert_true(d.work_ms == 10);
    /* forgetting the rate, and refusals */
    assert_int_equal(dh_place_read_rate(p, 0, 0), 0);
    r.in_bytes = 50 * MB;
    assert_int_equal(dh_cost_predict(p, 0, &r, &t), 0);
    assert_true(t.io_ms == 0);
    assert_int_equal(dh_place_read_rate(p, 0, -1), DH_EINVAL);
    assert_int_equal(dh_place_read_rate(p, 0, NAN), DH_EINVAL);
    assert_int_equal(dh_place_read_rate(p, 9, 1), DH_ENOTFOUND);
    r.in_bytes = -1;
    assert_int_equal(dh_place_decide(p, &r, &d), DH_EINVAL);
    dh_place_destroy(p);
}

static void heartbeat_adds_external_work(void **state)
{
    struct dh_place *p = mk(DH_PLACE_POLICY_DEADLINE, 2, 4, 5);
    struct dh_place_req r = req_of(10, 100);
    struct dh_place_decision d;

    (void)state;
    r.local_server = -1;
    load(p, 2, 5);
    assert_int_equal(decide(p, &r).server, 1);
    /* Server 1 reports 3 queued + 1 busy of work nobody here assigned. */
    assert_int_equal(dh_place_heartbeat(p, 1, 3, 1, 40), 0);
    d = decide(p, &r);
    assert_int_equal(d.server, 2);
    /* ...and those 4 tasks fill its cap of 4. */
    assert_int_equal(d.scored, 1);
    assert_int_equal(dh_place_heartbeat(p, 1, 0, 0, 40), 0);
    assert_int_equal(decide(p, &r).server, 1);
    dh_place_destroy(p);
}

static void remote_gain_threshold(void **state)
{
    struct dh_place_req r = req_of(10, 100);
    struct dh_place_decision d;
    struct dh_place *p;

    (void)state;
    /* Local T = 30 meets; remote T = 11.2: a gain of 18.8 ms. */
    p = mk(DH_PLACE_POLICY_DEADLINE, 1, 0, 25);
    load(p, 0, 20);
    d = decide(p, &r);
    assert_int_equal(d.server, 0);
    assert_int_equal(d.reason, DH_PLACE_REASON_LOCAL_MEETS);
    dh_place_destroy(p);
    p = mk(DH_PLACE_POLICY_DEADLINE, 1, 0, 15);
    load(p, 0, 20);
    d = decide(p, &r);
    assert_int_equal(d.server, 1);
    assert_int_equal(d.reason, DH_PLACE_REASON_REMOTE_GAIN);
    dh_place_destroy(p);
}

static void round_robin_cycles(void **state)
{
    struct dh_place *p = mk(DH_PLACE_POLICY_ROUND_ROBIN, 2, 0, 5);
    struct dh_place_req r = req_of(10, 100);
    int seen[3] = {0};

    (void)state;
    for (int i = 0; i < 9; i++) {
        struct dh_place_decision d = decide(p, &r);
        assert_int_equal(d.reason, DH_PLACE_REASON_ROUND_ROBIN);
        assert_int_equal(d.server, i % 3);
        seen[d.server]++;
    }
    assert_int_equal(seen[0] + seen[1] + seen[2], 9);
    assert_int_equal(seen[1], 3);
    dh_place_destroy(p);
}

static void least_request_picks_least_loaded(void **state)
{
    struct dh_place *p = mk(DH_PLACE_POLICY_LEAST_REQUEST, 3, 0, 5);
    struct dh_place_req r = req_of(10, 100);
    struct dh_place_decision d;
    int n[4] = {3, 2, 1, 2};

    (void)state;
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < n[i]; j++)
            load(p, i, 1);
    d = decide(p, &r);
    assert_int_equal(d.server, 2);
    assert_int_equal(d.reason, DH_PLACE_REASON_LEAST_REQUEST);
    load(p, 2, 1);
    load(p, 2, 1); /* now 3: servers 1 and 3 have 2 */
    d = decide(p, &r);
    assert_true(d.server == 1 || d.server == 3);
    dh_place_destroy(p);
}

/* The heap must survive arbitrary add/remove/assign/complete: under
 * least-request the indexed answer's load equals the full scan's. */
static void index_matches_full_scan_under_churn(void **state)
{
    struct dh_place_opts o;
    struct dh_place *p = NULL;
    struct dh_place_req r = req_of(10, 100);
    int used[200] = {0};
    int64_t tasks[200] = {0};

    (void)state;
    srand(7);
    dh_place_opts_default(&o);
    o.policy = DH_PLACE_POLICY_LEAST_REQUEST;
    assert_int_equal(dh_place_create(200, &o, &p, NULL), 0);
    r.local_server = -1;
    for (int step = 0; step < 20000; step++) {
        int id = rand() % 200, op = rand() % 4;
        struct dh_place_decision a, b;
        if (!used[id]) {
            assert_int_equal(dh_place_add_server(p, id, DH_PLACE_ROLE_REMOTE,
                                                 -1, 1 + id % 4, 0, NULL),
                             0);
            used[id] = 1;
            tasks[id] = 0;
        } else if (op == 0 && rand() % 8 == 0) {
            assert_int_equal(dh_place_remove_server(p, id, NULL), 0);
            used[id] = 0;
        } else if (op <= 1 && tasks[id] > 0) {
            assert_int_equal(dh_place_complete(p, id, 1, 1), 0);
            tasks[id]--;
        } else {
            load(p, id, 1);
            tasks[id]++;
        }
        assert_int_equal(dh_place_decide(p, &r, &a), 0);
        assert_int_equal(dh_place_decide_full(p, &r, &b), 0);
        assert_true(a.server >= 0 && b.server >= 0);
        assert_true(tasks[a.server] == tasks[b.server]);
    }
    dh_place_destroy(p);
}

/* With every remote inside k_best the deadline index is exact. */
static void deadline_index_exact_when_small(void **state)
{
    struct dh_place *p = mk(DH_PLACE_POLICY_DEADLINE, 6, 0, 5);

    (void)state;
    srand(11);
    for (int step = 0; step < 2000; step++) {
        struct dh_place_req r = req_of(rand() % 50, rand() % 120);
        struct dh_place_decision a, b;
        int id = rand() % 7;
        r.out_bytes = (rand() % 20) * MB;
        if (rand() % 3 == 0 && decide(p, &r).server >= 0) {
            struct dh_place_server_info si;
            assert_int_equal(dh_place_server_info(p, id, &si), 0);
            if (si.tasks > 0)
                assert_int_equal(
                    dh_place_complete(p, id, si.inflight_ms / si.tasks,
                                      (rand() % 30) / 10.0 * si.inflight_ms /
                                          si.tasks),
                    0);
        } else {
            load(p, id, rand() % 40);
        }
        assert_int_equal(dh_place_decide(p, &r, &a), 0);
        assert_int_equal(dh_place_decide_full(p, &r, &b), 0);
        /* Exact ties may go to either server: compare the scores. */
        assert_true(fabs(a.t_pred_ms - b.t_pred_ms) < 1e-9);
        assert_true(fabs(a.miss_ms - b.miss_ms) < 1e-9);
        assert_int_equal(a.reason, b.reason);
    }
    dh_place_destroy(p);
}

static void decide_never_allocates(void **state)
{
    enum dh_place_policy pols[] = {DH_PLACE_POLICY_DEADLINE,
                                   DH_PLACE_POLICY_ROUND_ROBIN,
                                   DH_PLACE_POLICY_LEAST_REQUEST};

    (void)state;
    for (int k = 0; k < 3; k++) {
        struct dh_place *p = mk(pols[k], 40, 0, 5);
        struct dh_place_req r = req_of(10, 30);
        char buf[512];
        dh__alloc_fail_after(0);
        for (int i = 0; i < 200; i++) {
            struct dh_place_decision d;
            assert_int_equal(dh_place_decide(p, &r, &d), 0);
            assert_true(d.server >= 0);
            load(p, d.server, 10);
            assert_int_equal(dh_place_link(p, d.server, 0, MB, 0.01), 0);
            assert_int_equal(dh_place_heartbeat(p, d.server, 1, 1, 10), 0);
            if (i % 3 == 0)
                assert_int_equal(dh_place_complete(p, d.server, 10, 12), 0);
            assert_true(dh_place_decision_format(&d, i, 1.5, buf, sizeof(buf)) <
                        sizeof(buf));
        }
        assert_int_equal(dh__alloc_failures(), 0);
        dh__alloc_fail_reset();
        dh_place_destroy(p);
    }
}

static void create_fails_cleanly(void **state)
{
    struct dh_place *p = NULL;
    struct dh_err e;

    (void)state;
    for (long n = 0; n < 9; n++) {
        dh__alloc_fail_after(n);
        int rc = dh_place_create(100, NULL, &p, &e);
        dh__alloc_fail_reset();
        if (rc == 0) {
            dh_place_destroy(p);
            break;
        }
        assert_int_equal(rc, DH_ENOMEM);
        assert_null(p);
    }
}

static void bad_input_is_rejected(void **state)
{
    struct dh_place *p = mk(DH_PLACE_POLICY_DEADLINE, 1, 0, 5);
    struct dh_place_req r = req_of(NAN, 10);
    struct dh_place_decision d;
    struct dh_err e;
    enum dh_place_policy pol;

    (void)state;
    assert_int_equal(dh_place_decide(p, &r, &d), DH_EINVAL);
    assert_int_equal(
        dh_place_add_server(p, 1, DH_PLACE_ROLE_REMOTE, -1, 1, 0, &e), DH_EDUP);
    assert_int_equal(
        dh_place_add_server(p, 64, DH_PLACE_ROLE_REMOTE, -1, 1, 0, &e),
        DH_EINVAL);
    assert_int_equal(
        dh_place_add_server(p, 5, DH_PLACE_ROLE_REMOTE, -1, 0, 0, &e),
        DH_EINVAL);
    assert_int_equal(dh_place_assign(p, 9, 1), DH_ENOTFOUND);
    assert_int_equal(dh_place_assign(p, 1, -1), DH_EINVAL);
    assert_int_equal(dh_place_link(p, 0, 1, 10, 1), DH_EINVAL); /* to remote */
    assert_int_equal(dh_place_remove_server(p, 1, &e), 0);
    assert_int_equal(dh_place_remove_server(p, 1, &e), DH_ENOTFOUND);
    assert_int_equal(dh_place_policy_parse("deadline", &pol, &e), 0);
    assert_int_equal(pol, DH_PLACE_POLICY_DEADLINE);
    assert_int_equal(dh_place_policy_parse("least-request", &pol, &e), 0);
    assert_int_equal(pol, DH_PLACE_POLICY_LEAST_REQUEST);
    assert_int_equal(dh_place_policy_parse("fastest", &pol, &e), DH_EINVAL);
    assert_non_null(strstr(e.msg, "round-robin"));
    dh_place_destroy(p);
    dh_place_destroy(NULL);
}

static void telemetry_record(void **state)
{
    struct dh_place *p = mk(DH_PLACE_POLICY_DEADLINE, 2, 0, 5);
    struct dh_place_req r = req_of(10, 100);
    struct dh_place_decision d;
    char buf[512], small[16];
    size_t n;

    (void)state;
    load(p, 0, 200);
    d = decide(p, &r);
    n = dh_place_decision_format(&d, 42, 1.25, buf, sizeof(buf));
    assert_int_equal(n, strlen(buf));
    assert_non_null(strstr(buf, "{\"task\":42,\"candidates\":[{\"server\":1,"));
    assert_non_null(strstr(buf, "\"chosen\":1,\"reason\":\"least_miss\""));
    assert_non_null(strstr(buf, "\"decide_us\":1.250}"));
    assert_int_equal(
        dh_place_decision_format(&d, 42, 1.25, small, sizeof(small)), n);
    assert_int_equal(strlen(small), sizeof(small) - 1);
    dh_place_destroy(p);
}

/* The fixed-point line is the text printf's formats give: over random
 * candidates (negative, zero, large ids and times; no value within 1e-4
 * of a rounding tie, where the two may round apart) it equals the line
 * "%.3f" writes, and its length is what it would need. */
static void telemetry_line_equals_printf(void **state)
{
    uint64_t x = 88172645463325252ull;
    char got[1024], want[1024];

    (void)state;
    for (int it = 0; it < 5000; it++) {
        struct dh_place_decision d = {0};
        double v[2 * DH_PLACE_TOP + 1];
        int64_t task;
        int n = 0;

        for (int k = 0; k < 2 * DH_PLACE_TOP + 1; k++) {
            static const double frac[4] = {0.2, 0.35, 0.65, 0.8};
            uint64_t span = k % 3 ? 2000000001ull : 20001ull;
            int64_t q;

            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            q = (int64_t)(x % span) - (int64_t)(span / 2);
            v[k] = ((double)q + (q < 0 ? -1 : 1) * frac[x >> 62]) / 1000.0;
        }
        task = (int64_t)(x >> 1) * (it % 2 ? 1 : -1);
        d.ntop = it % (DH_PLACE_TOP + 1);
        d.server = (int32_t)(it % 7) - 1;
        d.reason = (enum dh_place_reason)(it % 5);
        d.scored = it;
        for (int32_t i = 0; i < d.ntop; i++)
            d.top[i] = (struct dh_place_cand){(int32_t)(x % 100000) - i,
                                              v[2 * i], v[2 * i + 1]};
        n += snprintf(want + n, sizeof(want) - (size_t)n,
                      "{\"task\":%lld,\"candidates\":[", (long long)task);
        for (int32_t i = 0; i < d.ntop; i++)
            n += snprintf(want + n, sizeof(want) - (size_t)n,
                          "%s{\"server\":%d,\"t_pred_ms\":%.3f,"
                          "\"miss_ms\":%.3f}",
                          i ? "," : "", (int)d.top[i].server,
                          d.top[i].t_pred_ms, d.top[i].miss_ms);
        n += snprintf(want + n, sizeof(want) - (size_t)n,
                      "],\"chosen\":%d,\"reason\":\"%s\",\"scored\":%d,"
                      "\"decide_us\":%.3f}",
                      (int)d.server, dh_place_reason_name(d.reason),
                      (int)d.scored, v[2 * DH_PLACE_TOP]);
        assert_int_equal(dh_place_decision_format(&d, task, v[2 * DH_PLACE_TOP],
                                                  got, sizeof(got)),
                         (size_t)n);
        assert_string_equal(got, want);
    }
}

static void gpu_window_and_slack(void **state)
{
    struct dh_window w;

    (void)state;
    dh_window_init(&w, 0.5);
    assert_true(isinf(dh_window_slack_ms(&w, 2, 0)));
    dh_window_update(&w, 100);
    assert_true(w.ewma_ms == 100);
    dh_window_update(&w, 200);
    assert_true(fabs(w.ewma_ms - 150) < 1e-9);
    dh_window_update(&w, -5);  /* ignored */
    dh_window_update(&w, NAN); /* ignored */
    assert_int_equal(w.samples, 2);
    assert_true(fabs(dh_window_slack_ms(&w, 3, 40) - 410) < 1e-9);
    assert_true(dh_window_slack_ms(&w, 0, 40) < 0);
    assert_int_equal(dh_window_is_miss(0, 0), 0);
    assert_int_equal(dh_window_is_miss(0.1, 0), 1);
    assert_int_equal(dh_window_is_miss(4, 5), 0);
    dh_window_init(&w, 7); /* out of range: default */
    assert_true(w.alpha == DH_WINDOW_ALPHA);

    /* The hint stands in before the first sample, then the EWMA. */
    dh_window_assume(&w, 50, 0);
    assert_true(fabs(dh_window_slack_ms(&w, 2, 10) - 90) < 1e-9);
    dh_window_update(&w, 20);
    assert_true(fabs(dh_window_period_ms(&w) - 20) < 1e-9);
    assert_true(fabs(dh_window_slack_ms(&w, 2, 0) - 40) < 1e-9);
    /* A fixed step deadline replaces both. */
    dh_window_assume(&w, 50, 30);
    assert_true(fabs(dh_window_slack_ms(&w, 3, 5) - 85) < 1e-9);
    /* Nonsense assumptions are none. */
    dh_window_init(&w, 0.2);
    dh_window_assume(&w, -1, NAN);
    assert_true(isinf(dh_window_period_ms(&w)));
    dh_window_assume(&w, INFINITY, -3);
    assert_true(isinf(dh_window_slack_ms(&w, 1, 0)));
}

static void request_from_descriptor(void **state)
{
    struct dh_estimator est;
    struct dh_desc d;
    struct dh_place_req r = req_of(0, 10);

    (void)state;
    dh_desc_init(&d);
    d.kind = DH_KIND_VIDEO;
    d.bytes = 4000000;
    d.width = 640;
    d.height = 360;
    d.fps = 30;
    d.duration_s = 4;
    d.frames = 120;
    d.est_out_bytes = 12345;
    dh_sample_plan_default(&est.plan);
    dh_cost_model_default(&est.cost);
    dh_cost_req_from_desc(&est, &d, &r);
    /* 0.5 + 1.5 * (120 * 0.2304 Mpx) + 100 * 4 MB */
    assert_true(fabs(r.cpu_ms - (0.5 + 1.5 * 120 * 0.2304 + 400)) < 1e-6);
    assert_true(r.out_bytes == 12345);
    assert_true(r.deadline_ms == 10);
    dh_desc_fini(&d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(local_meets_stays_local),
        cmocka_unit_test(local_misses_remote_meets),
        cmocka_unit_test(all_miss_earliest_finish),
        cmocka_unit_test(saturated_server_is_skipped),
        cmocka_unit_test(all_saturated_backpressure),
        cmocka_unit_test(slow_link_pushes_back_to_local),
        cmocka_unit_test(slowdown_feedback_moves_work),
        cmocka_unit_test(heartbeat_adds_external_work),
        cmocka_unit_test(read_rate_is_part_of_the_cost),
        cmocka_unit_test(remote_gain_threshold),
        cmocka_unit_test(round_robin_cycles),
        cmocka_unit_test(least_request_picks_least_loaded),
        cmocka_unit_test(index_matches_full_scan_under_churn),
        cmocka_unit_test(deadline_index_exact_when_small),
        cmocka_unit_test(decide_never_allocates),
        cmocka_unit_test(create_fails_cleanly),
        cmocka_unit_test(bad_input_is_rejected),
        cmocka_unit_test(telemetry_record),
        cmocka_unit_test(telemetry_line_equals_printf),
        cmocka_unit_test(gpu_window_and_slack),
        cmocka_unit_test(request_from_descriptor),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
