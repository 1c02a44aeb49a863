/* test_coordinator.c - the Coordinator's event loop over real ZeroMQ
 * sockets: it runs in a thread on tcp://127.0.0.1:0 (the bound port read
 * back with dh_coordinator_endpoint()), and fake DataServers and a fake
 * client are DEALER sockets in the test speaking the wire codec.
 * Registration acks; a request placed on the requester's local server and
 * forwarded with the embedded request; its result forwarded to the client
 * exactly once, byte for byte as the server sent it; a duplicate from a
 * second server released, not delivered; a silent server declared dead
 * and its task re-routed; backpressure
 * queueing; malformed input counted while the loop keeps serving; Shutdown
 * from a peer refused, the stop flag ends run() promptly.  Every receive has a timeout. */
#include "co_fixture.h"

static void routed_locally_result_once_duplicate_released(void **state)
{
    struct fx *f = start("deadline", 5000, 4);
    void *a = server(f, 1, DH_WIRE_ROLE_LOCAL, 0);
    void *b = server(f, 2, DH_WIRE_ROLE_REMOTE, 0);
    void *cl = client(f, 0);
    struct dh_wire_msg m;

    (void)state;
    request(cl, 0);
    expect_route(a, 0, 1); /* the local server: local meets the deadline */
    expect(cl, DH_WIRE_ROUTE, &m); /* the ack, without the request */
    assert_int_equal(m.u.route.has_request, 0);
    assert_int_equal(m.u.route.server_id, 1);
    assert_int_equal(m.u.route.target_server_id, 1);
    assert_string_equal(m.u.route.target_addr, "ipc://server-1");
    dh_wire_msg_fini(&m);
    expect_none(b, DH_WIRE_ROUTE);

    result(a, 0, 1);
    expect_result(cl, 0, 1);
    expect_none(cl, DH_WIRE_RESULT_NOTICE); /* exactly once */

    result(b, 0, 2); /* a late duplicate from another server */
    expect(b, DH_WIRE_RELEASE, &m);
    assert_int_equal(m.u.release.task.id, task(0).id);
    assert_int_equal(m.u.release.slot_offset, 4096 * 2);
    assert_int_equal(m.u.release.generation, 7);
    dh_wire_msg_fini(&m);
    expect_none(cl, DH_WIRE_RESULT_NOTICE);

    ASSERT_STAT(f, results, 1);
    ASSERT_STAT(f, duplicates, 1);
    ASSERT_STAT(f, servers, 2);
    ASSERT_STAT(f, inflight, 0);
    zmq_close(a);
    zmq_close(b);
    zmq_close(cl);
    stop_and_free(f);
}

/* A result reaches the client as the server sent it: the same bytes, an
 * extra field the codec does not know included (re-encoding the decoded
 * notice would drop it), so the Coordinator forwards without encoding. */
static void a_result_is_forwarded_as_sent(void **state)
{
    struct fx *f = start("deadline", 5000, 4);
    void *a = server(f, 1, DH_WIRE_ROLE_LOCAL, 0);
    void *cl = client(f, 0);
    uint8_t sent[512], got[512];
    uint8_t *buf = NULL;
    size_t len = 0;
    struct dh_wire_msg m;
    struct dh_err e;
    int n = -1;

    (void)state;
    request(cl, 0);
    expect_route(a, 0, 1);
    result_msg(&m, 0, 1);
    assert_int_equal(dh_wire_encode(&m, &buf, &len, &e), 0);
    dh_wire_msg_fini(&m);
    assert_true(len + 2 <= sizeof(sent));
    memcpy(sent, buf, len);
    dh_wire_free(buf);
    sent[len++] = 15 << 3; /* Envelope field 15 (unknown), varint */
    sent[len++] = 42;
    assert_int_equal(zmq_send(a, sent, len, 0), (int)len);
    {
        uint64_t end = now_ms() + WAIT_MS;

        while (now_ms() < end) { /* the ack of the request comes first */
            zmq_pollitem_t it = {.socket = cl, .events = ZMQ_POLLIN};

            if (zmq_poll(&it, 1, (long)(end - now_ms())) <= 0)
                break;
            n = zmq_recv(cl, got, sizeof(got), ZMQ_DONTWAIT);
            if (n < 0 || dh_wire_decode(got, (size_t)n, &m, NULL))
                continue;
            if (m.type == DH_WIRE_RESULT_NOTICE) {
                dh_wire_msg_fini(&m);
                break;
            }
            dh_wire_msg_fini(&m);
            n = -1;
        }
    }
    assert_int_equal(n, (int)len);
    assert_memory_equal(got, sent, len);
    ASSERT_STAT(f, results, 1);
    zmq_close(a);
    zmq_close(cl);
    stop_and_free(f);
}

static void telemetry_has_one_line_per_decision(void **state)
{
    struct fx *f = start("least-request", 5000, 4);
    void *a = server(f, 1, DH_WIRE_ROLE_LOCAL, 0);
    void *cl = client(f, 0);
    char line[4096];
    int lines = 0;
    FILE *tel = f->tel;

    (void)state;
    request(cl, 3);
    expect_route(a, 3, 1);
    zmq_close(a);
    zmq_close(cl);
    f->stop = 1;
    assert_true(wait_finished(f, 1000));
    pthread_join(f->th, NULL);
    rewind(tel);
    while (fgets(line, sizeof(line), tel)) {
        assert_non_null(strstr(line, "\"candidates\":[{\"server\":1,"));
        assert_non_null(strstr(line, "\"chosen\":1,"));
        assert_non_null(strstr(line, "\"reason\":\"least_request\""));
        assert_non_null(strstr(line, "\"decide_us\":"));
        lines++;
    }
    assert_int_equal(lines, 1);
    fclose(tel);
    dh_coordinator_destroy(f->c);
    zmq_ctx_term(f->ctx);
    free(f);
}

static void metrics_fast(struct dh_coordinator_opts *o)
{
    o->metrics_interval_ms = 10;
}

/* The published metrics text, once it holds `want` (bounded), else the
 * last one; the caller frees it. */
static char *metrics_with(struct fx *f, const char *want)
{
    uint64_t end = now_ms() + WAIT_MS;
    char *t = NULL;
    size_t len;

    for (;;) {
        assert_int_equal(dh_coordinator_metrics_text(f->c, &t, &len), 0);
        if (strstr(t, want) || now_ms() > end)
            return t;
        free(t);
        struct timespec ts = {0, 5000000};
        nanosleep(&ts, NULL);
    }
}

/* The loop's hooks feed the published figures (docs/metrics.md): a
 * decision, a result and its bytes, a rank's own report, a server that
 * leaves staying listed as gone. */
static void metrics_follow_the_loop(void **state)
{
    struct fx *f;
    void *a, *b, *cl;
    struct dh_wire_msg m;
    uint64_t ids[2] = {100, 200};
    char *t;

    (void)state;
    start_tweak = metrics_fast;
    f = start("deadline", 5000, 4);
    start_tweak = NULL;
    a = server(f, 1, DH_WIRE_ROLE_LOCAL, 0);
    b = server(f, 2, DH_WIRE_ROLE_REMOTE, 0);
    cl = client(f, 0);
    dh_wire_msg_init(&m, DH_WIRE_DESCRIPTOR_REQUEST);
    m.u.request.task = task(0);
    assert_int_equal(dh_wire_set_samples(&m.u.request, ids, 2, NULL), 0);
    m.u.request.slack_ms = 100000;
    m.u.request.hints.local_only = 1;
    m.u.request.has_report = 1;
    m.u.request.report = (struct dh_wire_report){
        .steps = 9, .misses = 4, .input_wait_ms = 3.5, .window_ms = 20};
    send_msg(cl, &m);
    dh_wire_msg_fini(&m);
    expect_route(a, 0, 1);
    result(a, 0, 1);
    expect_result(cl, 0, 1);
    t = metrics_with(f, "datahelix_results_total 1\n");
    assert_non_null(strstr(t, "datahelix_results_total 1\n"));
    assert_non_null(
        strstr(t, "datahelix_decisions_total{reason=\"local_meets\"} 1\n"));
    assert_non_null(strstr(t, "datahelix_decision_us_count 1\n"));
    assert_non_null(strstr(t, "datahelix_payload_bytes_total 64\n"));
    assert_non_null(strstr(t, "datahelix_server_tasks_total{server=\"1\","
                              "role=\"local\",rank=\"0\","
                              "addr=\"ipc://server-1\"} 1\n"));
    assert_non_null(strstr(t, "datahelix_server_out_bytes_total{server=\"1\""));
    assert_non_null(strstr(t, "datahelix_server_up{server=\"2\","
                              "role=\"remote\",addr=\"ipc://server-2\"} 1\n"));
    assert_non_null(strstr(t, "datahelix_rank_steps{rank=\"0\"} 9\n"));
    assert_non_null(strstr(t, "datahelix_rank_misses{rank=\"0\"} 4\n"));
    assert_non_null(strstr(t, "datahelix_rank_input_wait_ms_bucket{rank=\"0\","
                              "le=\"5\"} 1\n"));
    assert_non_null(
        strstr(t, "datahelix_rank_completed_total{rank=\"0\"} 1\n"));
    free(t);

    dh_wire_msg_init(&m, DH_WIRE_HEARTBEAT); /* server 2 leaves */
    m.u.heartbeat.server_id = 2;
    m.u.heartbeat.leaving = 1;
    send_msg(b, &m);
    t = metrics_with(f, "datahelix_servers 1\n");
    assert_non_null(strstr(t, "datahelix_server_up{server=\"2\","
                              "role=\"remote\",addr=\"ipc://server-2\"} 0\n"));
    assert_non_null(strstr(t, "datahelix_server_dead{server=\"2\","
                              "role=\"remote\",addr=\"ipc://server-2\"} 0\n"));
    free(t);
    zmq_close(a);
    zmq_close(b);
    zmq_close(cl);
    stop_and_free(f);

    f = start("deadline", 5000, 4); /* metrics off: refused */
    assert_int_equal(dh_coordinator_metrics_text(f->c, &t, NULL), DH_EINVAL);
    stop_and_free(f);
}

/* The next Route for `step` on x or y (whichever gets it: the policy
 * decides); *on is the socket it came on. */
static void route_on_either(void *x, void *y, uint32_t step,
                            struct dh_wire_msg *m, void **on)
{
    uint64_t end = now_ms() + WAIT_MS;

    while (now_ms() < end) {
        void *s[2] = {x, y};

        for (int i = 0; i < 2; i++) {
            if (recv_type(s[i], DH_WIRE_ROUTE, m, 20) < 0)
                continue;
            /* the delivery target's word of a remote placement: the route
             * it names is the one looked for */
            if (m->u.route.task.id == task(step).id && m->u.route.has_request) {
                *on = s[i];
                return;
            }
            dh_wire_msg_fini(m);
        }
    }
    fail_msg("no route for step %u", step);
}

/* A silent local server is declared dead.  Its task cannot go to the
 * remote while the rank has no local server (nobody could take the
 * remote's payload): it waits, then runs where the rank's next local
 * server can receive it. */
static void silent_server_is_dead_and_task_rerouted(void **state)
{
    struct fx *f = start("deadline", 500, 4);
    void *a = server(f, 1, DH_WIRE_ROLE_LOCAL, 0);
    void *b = server(f, 2, DH_WIRE_ROLE_REMOTE, 0);
    void *cl = client(f, 0);
    void *a2, *on = NULL;
    struct dh_wire_msg m;
    uint64_t end;

    (void)state;
    request(cl, 1);
    expect_route(a, 1, 1);
    /* b keeps heartbeating, a falls silent: a is declared dead. */
    for (end = now_ms() + WAIT_MS;
         stats(f).dead_servers < 1 && now_ms() < end;) {
        heartbeat(b, 2);
        expect_none(b, DH_WIRE_ROUTE); /* no delivery target: it waits */
    }
    /* b's last heartbeat can be QUIET_MS old here, and the next one is
     * another QUIET_MS away: without this one that is the whole 500 ms
     * timeout, and b too could be declared dead (a race). */
    heartbeat(b, 2);
    ASSERT_STAT(f, dead_servers, 1);
    ASSERT_STAT(f, pending, 1);
    expect_none(b, DH_WIRE_ROUTE);
    heartbeat(b, 2);
    a2 = server(f, 7, DH_WIRE_ROLE_LOCAL, 0);
    route_on_either(a2, b, 1, &m, &on);
    assert_int_equal(m.u.route.has_request, 1);
    assert_int_equal(m.u.route.request.sample_ids[0], 101);
    assert_int_equal(m.u.route.target_server_id, 7); /* a is gone */
    dh_wire_msg_fini(&m);
    ASSERT_STAT(f, rerouted, 1);
    ASSERT_STAT(f, servers, 2);

    result(a2, 1, 7); /* (a remote's batch lands at a2 and a2 notifies) */
    expect_result(cl, 1, 7);
    result(a, 1, 1); /* the "dead" server finishes after all: released */
    expect(a, DH_WIRE_RELEASE, &m);
    dh_wire_msg_fini(&m);
    expect_none(cl, DH_WIRE_RESULT_NOTICE);
    ASSERT_STAT(f, results, 1);
    zmq_close(a);
    zmq_close(a2);
    zmq_close(b);
    zmq_close(cl);
    stop_and_free(f);
}

/* A restarted local DataServer (new server id, same rank) supersedes the
 * old one at once: the old one's task is re-routed to the new one, which
 * is the delivery target from then on. */
static void new_local_server_supersedes_old(void **state)
{
    struct fx *f = start("least-request", 60000, 4);
    void *a = server(f, 1, DH_WIRE_ROLE_LOCAL, 0);
    void *cl = client(f, 0);
    void *a2;
    struct dh_wire_msg m;

    (void)state;
    request(cl, 1);
    expect_route(a, 1, 1);
    a2 = server(f, 7, DH_WIRE_ROLE_LOCAL, 0);
    assert_int_equal(recv_type(a2, DH_WIRE_ROUTE, &m, WAIT_MS), 0);
    assert_int_equal(m.u.route.task.id, task(1).id);
    assert_int_equal(m.u.route.server_id, 7);
    assert_int_equal(m.u.route.target_server_id, 7);
    assert_int_equal(m.u.route.has_request, 1);
    dh_wire_msg_fini(&m);
    ASSERT_STAT(f, dead_servers, 1);
    ASSERT_STAT(f, rerouted, 1);
    ASSERT_STAT(f, servers, 1);
    result(a2, 1, 7);
    expect_result(cl, 1, 7);
    zmq_close(a);
    zmq_close(a2);
    zmq_close(cl);
    stop_and_free(f);
}

/* The waiting-queue bound counts requests waiting, not requests ever
 * made: many more than max_pending, one at a time, all go through. */
static void pending_bound_counts_only_waiting_requests(void **state)
{
    struct fx *f;
    void *a, *cl;

    (void)state;
    start_max_pending = 2;
    f = start("least-request", 60000, 4);
    start_max_pending = 0;
    a = server(f, 1, DH_WIRE_ROLE_LOCAL, 0);
    cl = client(f, 0);
    for (uint32_t step = 0; step < 12; step++) {
        request(cl, step);
        expect_route(a, step, 1);
        result(a, step, 1);
        expect_result(cl, step, 1);
    }
    ASSERT_STAT(f, queue_full, 0);
    ASSERT_STAT(f, results, 12);
    zmq_close(a);
    zmq_close(cl);
    stop_and_free(f);
}

/* Round-robin alternates local and remote, but a remote cannot deliver
 * to a local server that takes no payloads ("local:" address), nor serve
 * a local_only request: those stay on the local server, queueing behind
 * its cap rather than going remote. */
static void remote_only_when_local_takes_payloads(void **state)
{
    struct fx *f = start("round-robin", 60000, 2); /* cap 2 x 1 worker */
    void *a = server_at(f, 1, DH_WIRE_ROLE_LOCAL, 0, "local:rank-0");
    void *b = server(f, 2, DH_WIRE_ROLE_REMOTE, 0);
    void *cl = client(f, 0);
    void *a2;

    (void)state;
    request(cl, 0);
    request(cl, 1);
    expect_route(a, 0, 1);
    expect_route(a, 1, 1); /* not b: a has no payload address */
    request(cl, 2);        /* a is at its cap: waits, not remote */
    ASSERT_STAT(f, pending, 1);
    expect_none(b, DH_WIRE_ROUTE);
    result(a, 0, 1);
    expect_route(a, 2, 1);
    ASSERT_STAT(f, pending, 0);
    result(a, 1, 1);
    result(a, 2, 1);
    ASSERT_STAT(f, inflight, 0);

    /* The rank's server restarts with a payload address: round-robin now
     * reaches the remote, except for a request marked local_only. */
    a2 = server_at(f, 7, DH_WIRE_ROLE_LOCAL, 0, "tcp://127.0.0.1:9");
    request(cl, 3);
    request(cl, 4);
    expect_route(a2, 3, 7);
    expect_route(b, 4, 2);
    expect_placed_on(a2, 4, 2); /* the payload a2 may take, and from whom */
    request_hinted(cl, 5, 1);
    expect_route(a2, 5, 7);
    expect_none(b, DH_WIRE_ROUTE);
    zmq_close(a);
    zmq_close(a2);
    zmq_close(b);
    zmq_close(cl);
    stop_and_free(f);
}

/* exit_when_unused: not before a local server came, not while one is
 * there, soon after the last one is gone (declared dead). */
static void exits_when_no_local_server_is_left(void **state)
{
    struct fx *f;
    void *a;
    uint64_t t0, last = 0;

    (void)state;
    start_exit_unused = 300;
    f = start("least-request", 400, 4);
    start_exit_unused = 0;
    assert_false(wait_finished(f, 600)); /* nobody came yet: keeps going */
    a = server(f, 1, DH_WIRE_ROLE_LOCAL, 0);
    for (t0 = now_ms(); now_ms() - t0 < 900;) { /* alive: keeps going */
        heartbeat(a, 1);
        last = now_ms();
        assert_false(wait_finished(f, 100));
    }
    /* Silent since the last heartbeat: dead 400 ms after it, exit 300 ms
     * later (measured from the heartbeat, not from the loop's end, which
     * is up to 100 ms after it). */
    assert_true(wait_finished(f, 5000));
    assert_true(now_ms() - last >= 600);
    ASSERT_STAT(f, dead_servers, 1);
    zmq_close(a);
    pthread_join(f->th, NULL);
    assert_int_equal(f->run_rc, 0);
    dh_coordinator_destroy(f->c);
    zmq_ctx_term(f->ctx);
    fclose(f->tel);
    free(f);
}

/* A heartbeat's queue_depth counts the running tasks too (wire.h): with
 * 1 worker and a cap of 4, three tasks in flight (one running, two
 * queued) leave room for a fourth; counting the running one twice would
 * hold it back. */
static void heartbeat_queue_depth_includes_running_tasks(void **state)
{
    struct fx *f = start("least-request", 60000, 4);
    void *a = server(f, 1, DH_WIRE_ROLE_LOCAL, 0);
    void *cl = client(f, 0);
    struct dh_wire_msg m;

    (void)state;
    for (uint32_t step = 0; step < 3; step++) {
        request(cl, step);
        expect_route(a, step, 1);
    }
    dh_wire_msg_init(&m, DH_WIRE_HEARTBEAT);
    m.u.heartbeat.server_id = 1;
    m.u.heartbeat.seq = 1;
    m.u.heartbeat.queue_depth = 3;
    m.u.heartbeat.busy_workers = 1;
    send_msg(a, &m);
    /* The heartbeat and the request travel on different sockets: wait
     * (bounded) until the heartbeat has been handled before asking. */
    ASSERT_STAT(f, heartbeats, 1);
    ASSERT_STAT(f, malformed, 0);
    request(cl, 3);
    expect_route(a, 3, 1);
    ASSERT_STAT(f, pending, 0);
    zmq_close(a);
    zmq_close(cl);
    stop_and_free(f);
}

/* A request that must wait (its rank's local server is full) does not hold
 * back another rank's request behind it, whose server has room. */
static void a_waiting_request_does_not_block_other_ranks(void **state)
{
    struct fx *f = start("least-request", 60000, 1); /* cap 1 x 1 worker */
    void *a = server(f, 1, DH_WIRE_ROLE_LOCAL, 0);
    void *b = server(f, 2, DH_WIRE_ROLE_LOCAL, 1);
    void *c0 = client(f, 0), *c1 = client(f, 1);
    struct dh_wire_msg m;
    uint64_t ids[1] = {7};

    (void)state;
    request(c0, 0);
    expect_route(a, 0, 1);
    request(c0, 1); /* a is full: waits */
    ASSERT_STAT(f, pending, 1);
    dh_wire_msg_init(&m, DH_WIRE_DESCRIPTOR_REQUEST);
    assert_int_equal(dh_wire_task_make(&m.u.request.task, 0, 0, 0, 1, 0, NULL),
                     0);
    m.u.request.requester_rank = 1;
    assert_int_equal(dh_wire_set_samples(&m.u.request, ids, 1, NULL), 0);
    m.u.request.slack_ms = 100000;
    send_msg(c1, &m);
    dh_wire_msg_fini(&m);
    assert_int_equal(recv_type(b, DH_WIRE_ROUTE, &m, WAIT_MS), 0);
    assert_int_equal(m.u.route.task.rank, 1);
    assert_int_equal(m.u.route.server_id, 2);
    dh_wire_msg_fini(&m);
    ASSERT_STAT(f, pending, 1); /* rank 0's step 1 still waits, in place */
    result(a, 0, 1);
    expect_result(c0, 0, 1);
    expect_route(a, 1, 1);
    ASSERT_STAT(f, pending, 0);
    zmq_close(a);
    zmq_close(b);
    zmq_close(c0);
    zmq_close(c1);
    stop_and_free(f);
}

/* A server that says it is leaving is dropped at once and does not count
 * as dead; its rank's task, with nowhere to go, fails at once. */
static void a_leaving_server_is_dropped_at_once(void **state)
{
    struct fx *f = start("deadline", 60000, 4);
    void *a = server(f, 1, DH_WIRE_ROLE_LOCAL, 0);
    void *b = server(f, 2, DH_WIRE_ROLE_REMOTE, 0);
    void *cl = client(f, 0);
    void *a2, *cl2, *on = NULL;
    struct dh_wire_msg m;

    (void)state;
    request(cl, 1);
    expect_route(a, 1, 1); /* the local server meets the deadline */
    dh_wire_msg_init(&m, DH_WIRE_HEARTBEAT);
    m.u.heartbeat.server_id = 1;
    m.u.heartbeat.seq = 2;
    m.u.heartbeat.leaving = 1;
    send_msg(a, &m);
    ASSERT_STAT(f, servers, 1);
    /* Rank 0's server left (its client went away): no server will come
     * for the task, and no remote could deliver it, so it fails at once
     * rather than waiting in the queue for ever. */
    expect(cl, DH_WIRE_ERROR_NOTICE, &m);
    assert_int_equal(m.u.error.task.id, task(1).id);
    assert_int_equal(m.u.error.cause, DH_EPEERDEAD);
    assert_non_null(strstr(m.u.error.message, "local DataServer left"));
    dh_wire_msg_fini(&m);
    expect_none(b, DH_WIRE_ROUTE);
    ASSERT_STAT(f, pending, 0);
    ASSERT_STAT(f, dead_servers, 0);
    ASSERT_STAT(f, malformed, 0);
    /* A new client of rank 0 and its server: served again. */
    cl2 = client(f, 0);
    a2 = server(f, 7, DH_WIRE_ROLE_LOCAL, 0);
    request(cl2, 2);
    route_on_either(a2, b, 2, &m, &on);
    assert_int_equal(m.u.route.target_server_id, 7);
    dh_wire_msg_fini(&m);
    zmq_close(a);
    zmq_close(a2);
    zmq_close(b);
    zmq_close(cl);
    zmq_close(cl2);
    stop_and_free(f);
}

static void backpressure_queues_then_routes(void **state)
{
    struct fx *f = start("least-request", 5000, 1); /* cap 1 x 1 worker */
    void *a = server(f, 1, DH_WIRE_ROLE_LOCAL, 0);
    void *cl = client(f, 0);

    (void)state;
    request(cl, 0);
    request(cl, 1);
    expect_route(a, 0, 1);
    expect_none(a, DH_WIRE_ROUTE); /* step 1 waits: the server is full */
    /* Under load the second request may still be on its way. */
    ASSERT_STAT(f, pending, 1);
    expect_none(a, DH_WIRE_ROUTE);
    result(a, 0, 1);
    expect_result(cl, 0, 1);
    expect_route(a, 1, 1); /* capacity freed: the queued one goes */
    ASSERT_STAT(f, pending, 0);
    result(a, 1, 1);
    expect_result(cl, 1, 1);
    zmq_close(a);
    zmq_close(cl);
    stop_and_free(f);
}

static void malformed_is_counted_and_loop_keeps_serving(void **state)
{
    struct fx *f = start("round-robin", 5000, 4);
    void *bad = peer(f);
    struct dh_wire_msg m;
    void *a;

    (void)state;
    assert_int_equal(zmq_send(bad, "\x01\x02garbage", 9, 0), 9);
    assert_int_equal(zmq_send(bad, "x", 1, ZMQ_SNDMORE), 1);
    assert_int_equal(zmq_send(bad, "y", 1, 0), 1);
    dh_wire_msg_init(&m, DH_WIRE_RELEASE); /* not for the coordinator */
    m.u.release.task = task(0);
    send_msg(bad, &m);
    /* From a server nobody registered: not malformed (a restarted
     * Coordinator hears such heartbeats), answered "unknown". */
    heartbeat(bad, 9);
    expect(bad, DH_WIRE_HEARTBEAT, &m);
    assert_int_equal(m.u.heartbeat.server_id, 9);
    assert_int_equal(m.u.heartbeat.unknown, 1);
    dh_wire_msg_fini(&m);
    a = server(f, 1, DH_WIRE_ROLE_LOCAL, 0); /* still serving */
    ASSERT_STAT(f, malformed, 3);
    ASSERT_STAT(f, servers, 1);
    zmq_close(bad);
    zmq_close(a);
    stop_and_free(f);
}

/* A Shutdown from a peer is refused (counted, logged): only the owner
 * stops the Coordinator, through run()'s stop flag (issue 13). */
static void shutdown_from_a_peer_is_refused(void **state)
{
    struct fx *f = start("least-request", 5000, 4);
    void *a = server(f, 1, DH_WIRE_ROLE_REMOTE, 0);
    struct dh_wire_msg m;

    (void)state;
    dh_wire_msg_init(&m, DH_WIRE_SHUTDOWN);
    snprintf(m.u.shutdown.reason, sizeof(m.u.shutdown.reason), "test");
    send_msg(a, &m);
    ASSERT_STAT(f, refused, 1);
    assert_false(wait_finished(f, QUIET_MS));
    f->stop = 1; /* the owner's way */
    assert_true(wait_finished(f, 2000));
    expect(a, DH_WIRE_SHUTDOWN, &m); /* peers are told */
    dh_wire_msg_fini(&m);
    zmq_close(a);
    stop_and_free(f);
}

static void bad_options_and_busy_address(void **state)
{
    struct dh_coordinator_opts o;
    struct dh_coordinator *c = NULL, *c2 = NULL;
    struct dh_err e;

    (void)state;
    dh_coordinator_opts_default(&o);
    o.policy = "fastest";
    assert_int_equal(dh_coordinator_create(&o, &c, &e), DH_EINVAL);
    o.policy = NULL;
    o.listen = "nonsense://x";
    assert_int_equal(dh_coordinator_create(&o, &c, &e), DH_EINVAL);
    assert_null(c);
    o.listen = "tcp://127.0.0.1:0";
    assert_int_equal(dh_coordinator_create(&o, &c, &e), 0);
    o.listen = dh_coordinator_endpoint(c);
    assert_int_equal(dh_coordinator_create(&o, &c2, &e), DH_EIO);
    assert_non_null(strstr(e.msg, o.listen));
    assert_null(c2);
    dh_coordinator_destroy(c);
    dh_coordinator_destroy(NULL);
}

/* What a restart looks like to a peer (issue 13 item 5): every ack of a
 * client's (repeated) registration names the Coordinator's incarnation,
 * the same for the life of one Coordinator and another for the next one
 * on the same address; a server it does not know is told so. */
static void a_restart_is_visible_to_clients_and_servers(void **state)
{
    struct fx *f = start("least-request", 60000, 4);
    struct fx *f2;
    uint64_t i1 = 0, i1b = 0, i2 = 0;
    struct dh_wire_msg m;
    void *cl, *s;

    (void)state;
    cl = client_on(f, NULL, 0, &i1);
    assert_true(i1 != 0);
    client_on(f, cl, 0, &i1b); /* the keepalive: same process, same one */
    assert_true(i1b == i1);
    ASSERT_STAT(f, clients, 1);
    zmq_close(cl);
    stop_and_free(f);

    f2 = start("least-request", 60000, 4);
    cl = client_on(f2, NULL, 0, &i2);
    assert_true(i2 != 0 && i2 != i1); /* a new process: refill it */
    s = peer(f2);
    heartbeat(s, 5); /* a server the old one knew */
    expect(s, DH_WIRE_HEARTBEAT, &m);
    assert_int_equal(m.u.heartbeat.server_id, 5);
    assert_int_equal(m.u.heartbeat.unknown, 1);
    dh_wire_msg_fini(&m);
    ASSERT_STAT(f2, malformed, 0);
    zmq_close(s);
    zmq_close(cl);
    stop_and_free(f2);
}

static void error_from(void *s, uint32_t step, uint32_t server_id, int cause)
{
    struct dh_wire_msg m;

    dh_wire_msg_init(&m, DH_WIRE_ERROR_NOTICE);
    m.u.error.task = task(step);
    m.u.error.server_id = server_id;
    m.u.error.sample_id = 100 + step;
    m.u.error.cause = cause;
    snprintf(m.u.error.message, sizeof(m.u.error.message), "test");
    send_msg(s, &m);
    dh_wire_msg_fini(&m);
}

/* Issue 13 item 6: a remote that cannot deliver (DH_EPEERDEAD) does not
 * fail the task: the client never hears of it, and the task runs on the
 * requester's local server.  A late word of the same kind from a server
 * the task no longer runs on changes nothing. */
static void an_undelivered_task_goes_to_the_local_server(void **state)
{
    struct fx *f = start("round-robin", 60000, 4);
    void *a = server_at(f, 1, DH_WIRE_ROLE_LOCAL, 0, "tcp://127.0.0.1:9");
    void *b = server(f, 2, DH_WIRE_ROLE_REMOTE, 0);
    void *cl = client(f, 0);
    struct dh_wire_msg m;
    void *on = NULL;
    uint32_t remote_step = 0;

    (void)state;
    request(cl, 0);
    request(cl, 1);
    route_on_either(a, b, 0, &m, &on);
    remote_step = on == b ? 0 : 1;
    dh_wire_msg_fini(&m);
    route_on_either(a, b, 1, &m, &on);
    dh_wire_msg_fini(&m);
    assert_true(on == (remote_step == 1 ? b : a)); /* one each */

    error_from(b, remote_step, 2, DH_EPEERDEAD);
    expect_route(a, remote_step, 1);
    expect_none(cl, DH_WIRE_ERROR_NOTICE);
    ASSERT_STAT(f, rerouted, 1);
    error_from(b, remote_step, 2, DH_EPEERDEAD); /* late: ignored */
    result(a, remote_step, 1);
    expect_result(cl, remote_step, 1);
    expect_none(cl, DH_WIRE_ERROR_NOTICE);
    ASSERT_STAT(f, rerouted, 1);
    ASSERT_STAT(f, results, 1);
    /* A sample's failure on the remote is the client's to hear once the
     * rank's local server agrees (issue 36 item 2: a remote's verdict is
     * checked there first): the next task round-robin puts on the remote
     * fails there, goes to the local server, and fails there too. */
    on = NULL;
    for (uint32_t step = 2; step < 4 && on != b; step++) {
        request(cl, step);
        route_on_either(a, b, step, &m, &on);
        dh_wire_msg_fini(&m);
        remote_step = step;
    }
    assert_true(on == b);
    error_from(b, remote_step, 2, DH_EMEDIA);
    expect_route(a, remote_step, 1);
    expect_none(cl, DH_WIRE_ERROR_NOTICE);
    ASSERT_STAT(f, rechecked, 1);
    error_from(a, remote_step, 1, DH_EMEDIA);
    expect(cl, DH_WIRE_ERROR_NOTICE, &m);
    assert_int_equal(m.u.error.cause, DH_EMEDIA);
    assert_int_equal(m.u.error.server_id, 1);
    dh_wire_msg_fini(&m);
    /* ... and the remote may not fail a task it does not hold. */
    error_from(b, 1 - (remote_step & 1), 2, DH_EMEDIA);
    expect_none(cl, DH_WIRE_ERROR_NOTICE);
    zmq_close(a);
    zmq_close(b);
    zmq_close(cl);
    stop_and_free(f);
}

static void overdue_fast(struct dh_coordinator_opts *o)
{
    o->overdue_ms = 300;
}

/* `s` gets the Route with the request for `step` on `server_id`; Routes
 * without a request (word of a remote placement) before it are skipped. */
static void expect_work(void *s, uint32_t step, uint32_t server_id)
{
    struct dh_wire_msg m;
    uint64_t end = now_ms() + WAIT_MS;

    while (now_ms() < end) {
        if (recv_type(s, DH_WIRE_ROUTE, &m, 100) < 0)
            continue;
        if (m.u.route.has_request) {
            assert_int_equal(m.u.route.task.id, task(step).id);
            assert_int_equal(m.u.route.server_id, server_id);
            dh_wire_msg_fini(&m);
            return;
        }
        dh_wire_msg_fini(&m);
    }
    fail_msg("no route with the request of step %u", step);
}

/* Issue 36 item 2: a remote holding the job's key is not taken at its
 * word.  A task it takes and never answers (it is not dead: the heartbeat
 * timeout is a minute) goes to the rank's local server once overdue.  Its
 * word that a good sample failed goes there too, and the client gets the
 * local server's batch, never the remote's error.  Three such strikes
 * demote it: every later task goes to the local server. */
static void a_silent_or_lying_remote_is_checked_and_demoted(void **state)
{
    struct fx *f;
    void *a, *b, *cl;
    struct dh_wire_msg m;
    void *on = NULL;
    uint32_t step = 0;
    int silent = 0, lies = 0;

    (void)state;
    start_tweak = overdue_fast;
    f = start("round-robin", 60000, 4);
    start_tweak = NULL;
    a = server_at(f, 1, DH_WIRE_ROLE_LOCAL, 0, "tcp://127.0.0.1:9");
    b = server(f, 2, DH_WIRE_ROLE_REMOTE, 0);
    cl = client(f, 0);
    for (; lies < 2 && step < 20; step++) {
        request(cl, step);
        route_on_either(a, b, step, &m, &on);
        dh_wire_msg_fini(&m);
        if (on == b && !silent) {
            silent = 1; /* never answered: overdue */
            expect_work(a, step, 1);
            ASSERT_STAT(f, overdue, 1);
        } else if (on == b) {
            lies++;
            error_from(b, step, 2, DH_EMEDIA);
            expect_work(a, step, 1);
            ASSERT_STAT(f, rechecked, (uint64_t)lies);
        }
        result(a, step, 1);
        expect_result(cl, step, 1);
        expect_none(cl, DH_WIRE_ERROR_NOTICE);
    }
    assert_int_equal(lies, 2);
    ASSERT_STAT(f, demoted, 1);
    for (uint32_t end = step + 4; step < end; step++) {
        request(cl, step);
        expect_work(a, step, 1); /* round-robin would give b every other */
        result(a, step, 1);
        expect_result(cl, step, 1);
    }
    expect_none(b, DH_WIRE_ROUTE);
    zmq_close(a);
    zmq_close(b);
    zmq_close(cl);
    stop_and_free(f);
}

/* Registers remote server `id` from a new peer with payload secret
 * `secret`; the Shutdown refusing it, or the ack, into *m. */
static void *remote_again(struct fx *f, uint32_t id, const char *secret,
                          struct dh_wire_msg *m)
{
    void *s = peer(f);
    struct dh_wire_msg r;
    uint64_t end = now_ms() + WAIT_MS;

    dh_wire_msg_init(&r, DH_WIRE_REGISTER_SERVER);
    r.u.register_server.server_id = id;
    snprintf(r.u.register_server.addr, sizeof(r.u.register_server.addr),
             "ipc://server-%u", id);
    r.u.register_server.role = DH_WIRE_ROLE_REMOTE;
    r.u.register_server.workers = 1;
    snprintf(r.u.register_server.sender_secret,
             sizeof(r.u.register_server.sender_secret), "%s", secret);
    send_msg(s, &r);
    while (now_ms() < end) {
        uint8_t buf[4096];
        zmq_pollitem_t it = {.socket = s, .events = ZMQ_POLLIN};
        int n;

        if (zmq_poll(&it, 1, 50) <= 0 ||
            (n = zmq_recv(s, buf, sizeof(buf), ZMQ_DONTWAIT)) < 0)
            continue;
        assert_true((size_t)n <= sizeof(buf));
        assert_int_equal(dh_wire_decode(buf, (size_t)n, m, NULL), 0);
        if (m->type == DH_WIRE_SHUTDOWN || m->type == DH_WIRE_REGISTER_SERVER)
            return s;
        dh_wire_msg_fini(m);
    }
    fail_msg("no answer to the registration of server %u", id);
    return s;
}

/* Issue 36: a job member cannot push a live remote out by registering its
 * server id from another connection: refused with "try again" while the
 * live one heartbeats (its tasks stay its own); the same process (its own
 * payload secret, a reconnect) may; and once the live one is declared
 * dead, any new process takes the id. */
static void a_live_remote_keeps_its_id(void **state)
{
    struct fx *f = start("round-robin", 600, 4);
    void *b, *x, *y;
    struct dh_wire_msg m;
    const char *mine = "0123456789abcdef0123456789abcdef";

    (void)state;
    b = peer(f);
    dh_wire_msg_init(&m, DH_WIRE_REGISTER_SERVER);
    m.u.register_server.server_id = 2;
    snprintf(m.u.register_server.addr, sizeof(m.u.register_server.addr),
             "ipc://server-2");
    m.u.register_server.role = DH_WIRE_ROLE_REMOTE;
    m.u.register_server.workers = 1;
    snprintf(m.u.register_server.sender_secret,
             sizeof(m.u.register_server.sender_secret), "%s", mine);
    send_msg(b, &m);
    expect(b, DH_WIRE_REGISTER_SERVER, &m);
    dh_wire_msg_fini(&m);
    x = remote_again(f, 2, "fedcba9876543210fedcba9876543210", &m);
    assert_int_equal(m.type, DH_WIRE_SHUTDOWN);
    assert_non_null(strstr(m.u.shutdown.reason, DH_WIRE_RETRY_REASON));
    dh_wire_msg_fini(&m);
    ASSERT_STAT(f, dead_servers, 0);
    y = remote_again(f, 2, mine, &m); /* the same process, reconnected */
    assert_int_equal(m.type, DH_WIRE_REGISTER_SERVER);
    dh_wire_msg_fini(&m);
    zmq_close(x);
    ASSERT_STAT(f, dead_servers, 1); /* its old registration, superseded */
    /* nobody heartbeats: once declared dead, a new process takes the id */
    ASSERT_STAT(f, dead_servers, 2);
    x = remote_again(f, 2, "fedcba9876543210fedcba9876543210", &m);
    assert_int_equal(m.type, DH_WIRE_REGISTER_SERVER);
    dh_wire_msg_fini(&m);
    zmq_close(b);
    zmq_close(x);
    zmq_close(y);
    stop_and_free(f);
}

/* The local server of a rank dies (here: superseded by its restart) while
 * a remote holds one of the rank's tasks: the remote's batch could only go
 * to the dead server, so that task is re-routed to the new local server at
 * once, without waiting for the remote to give up. */
static void a_dead_target_moves_the_remote_tasks_of_its_rank(void **state)
{
    struct fx *f = start("round-robin", 60000, 4);
    void *a = server_at(f, 1, DH_WIRE_ROLE_LOCAL, 0, "tcp://127.0.0.1:9");
    void *b = server(f, 2, DH_WIRE_ROLE_REMOTE, 0);
    void *cl = client(f, 0);
    struct dh_wire_msg m;
    void *on = NULL, *a2;
    uint32_t remote_step;

    (void)state;
    request(cl, 0);
    request(cl, 1);
    route_on_either(a, b, 0, &m, &on);
    remote_step = on == b ? 0 : 1;
    dh_wire_msg_fini(&m);
    route_on_either(a, b, 1, &m, &on);
    dh_wire_msg_fini(&m);
    a2 = server_at(f, 7, DH_WIRE_ROLE_LOCAL, 0, "tcp://127.0.0.1:10");
    for (int got = 0; got < 2;) { /* both steps reach a2 (local only) */
        expect(a2, DH_WIRE_ROUTE, &m);
        assert_int_equal(m.u.route.server_id, 7);
        assert_int_equal(m.u.route.target_server_id, 7);
        got += m.u.route.task.id == task(remote_step).id ||
               m.u.route.task.id == task(1 - remote_step).id;
        dh_wire_msg_fini(&m);
    }
    ASSERT_STAT(f, rerouted, 2);
    error_from(b, remote_step, 2, DH_EPEERDEAD); /* it gave up: no news */
    expect_none(cl, DH_WIRE_ERROR_NOTICE);
    result(a2, remote_step, 7);
    expect_result(cl, remote_step, 7);
    zmq_close(a);
    zmq_close(a2);
    zmq_close(b);
    zmq_close(cl);
    stop_and_free(f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(routed_locally_result_once_duplicate_released),
        cmocka_unit_test(a_result_is_forwarded_as_sent),
        cmocka_unit_test(metrics_follow_the_loop),
        cmocka_unit_test(telemetry_has_one_line_per_decision),
        cmocka_unit_test(silent_server_is_dead_and_task_rerouted),
        cmocka_unit_test(new_local_server_supersedes_old),
        cmocka_unit_test(pending_bound_counts_only_waiting_requests),
        cmocka_unit_test(exits_when_no_local_server_is_left),
        cmocka_unit_test(heartbeat_queue_depth_includes_running_tasks),
        cmocka_unit_test(a_waiting_request_does_not_block_other_ranks),
        cmocka_unit_test(a_leaving_server_is_dropped_at_once),
        cmocka_unit_test(remote_only_when_local_takes_payloads),
        cmocka_unit_test(backpressure_queues_then_routes),
        cmocka_unit_test(malformed_is_counted_and_loop_keeps_serving),
        cmocka_unit_test(shutdown_from_a_peer_is_refused),
        cmocka_unit_test(bad_options_and_busy_address),
        cmocka_unit_test(a_restart_is_visible_to_clients_and_servers),
        cmocka_unit_test(an_undelivered_task_goes_to_the_local_server),
        cmocka_unit_test(a_dead_target_moves_the_remote_tasks_of_its_rank),
        cmocka_unit_test(a_silent_or_lying_remote_is_checked_and_demoted),
        cmocka_unit_test(a_live_remote_keeps_its_id),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
