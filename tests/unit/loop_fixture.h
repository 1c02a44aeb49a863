/*
 * loop_fixture.h - what the tests that run real Coordinator and DataServer
 * loops on threads share (test_dataserver.c, test_remote.c): a small
 * indexed clip set, clocks, a small plan, a runner thread whose loop
 * must stop within 1 s of its flag, a DEALER peer and a request filler.  Header-only test code: define NCLIPS,
 * then include it once (after cmocka.h and zmq.h).
 */
#ifndef DH_TEST_LOOP_FIXTURE_H
#define DH_TEST_LOOP_FIXTURE_H

static char dir[512], dhx[600];
static struct dh_index *ix;

static uint64_t now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};

    nanosleep(&ts, NULL);
}

/* NCLIPS small S clips from gen-data in $DH_TEST_TMP/sub, indexed as
 * ids 0..NCLIPS-1 into `dhx` and opened as `ix`. */
static int loop_fixture_setup(const char *sub, uint64_t seed)
{
    const char *tmp = getenv("DH_TEST_TMP");
    struct dh_gen_opts o = {0};
    struct dh_index_builder *b;
    struct dh_desc d;
    struct dh_err e;
    char path[NCLIPS][700];

    snprintf(dir, sizeof(dir), "%s/%s", tmp ? tmp : "/tmp", sub);
    o.out_dir = dir;
    o.profiles = "S";
    o.count = NCLIPS;
    o.seed = seed;
    if (dh_gen_data(&o, &(struct dh_gen_stats){0}, &e))
        fail_msg("gen-data: %s", e.msg);
    assert_int_equal(dh_index_builder_create(&b, &e), 0);
    for (int i = 0; i < NCLIPS; i++) {
        snprintf(path[i], sizeof(path[i]), "%s/%06d_S.mp4", dir, i);
        dh_desc_init(&d);
        d.path = path[i];
        d.id = (uint64_t)i;
        d.kind = DH_KIND_VIDEO;
        snprintf(d.profile, sizeof(d.profile), "16x224");
        assert_int_equal(dh_index_builder_add(b, &d, &e), 0);
    }
    snprintf(dhx, sizeof(dhx), "%s/m.dhx", dir);
    if (dh_index_builder_finish(b, dhx, &e))
        fail_msg("index: %s", e.msg);
    dh_index_builder_destroy(b);
    assert_int_equal(dh_index_open(dhx, 0, &ix, &e), 0);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    dh_index_close(ix);
    return 0;
}

static struct dh_media_plan small_plan(void)
{
    struct dh_media_plan p;

    dh_media_plan_init(&p);
    p.frames = 4;
    p.width = 32;
    p.height = 24;
    return p;
}

/* ---- threads running the Coordinator's and DataServers' loops ---- */

struct runner {
    pthread_t th;
    struct dh_coordinator *c; /* one of the two */
    struct dh_dataserver *s;
    volatile int stop;
    int finished; /* atomic */
    int rc;
};

static void *run_thread(void *arg)
{
    struct runner *r = arg;
    struct dh_err e;

    r->rc = r->c ? dh_coordinator_run(r->c, &r->stop, &e)
                 : dh_dataserver_run(r->s, &r->stop, &e);
    __atomic_store_n(&r->finished, 1, __ATOMIC_SEQ_CST);
    return NULL;
}

static void start_runner(struct runner *r)
{
    assert_int_equal(pthread_create(&r->th, NULL, run_thread, r), 0);
}

/* Sets the stop flag; run() must return within 1 s, with 0. */
static void stop_runner(struct runner *r)
{
    uint64_t end = now_ms() + 1000;

    r->stop = 1;
    while (!__atomic_load_n(&r->finished, __ATOMIC_SEQ_CST) &&
           now_ms() < end)
        sleep_ms(5);
    assert_true(__atomic_load_n(&r->finished, __ATOMIC_SEQ_CST));
    pthread_join(r->th, NULL);
    assert_int_equal(r->rc, 0);
}

/* ---- peers speaking the wire codec ---- */

static void *dealer(void *ctx, const char *endpoint)
{
    void *s = zmq_socket(ctx, ZMQ_DEALER);
    int zero = 0, to = 1000;

    assert_non_null(s);
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_setsockopt(s, ZMQ_SNDTIMEO, &to, sizeof(to));
    assert_int_equal(zmq_connect(s, endpoint), 0);
    return s;
}

static void fill_request(struct dh_wire_request *rq, uint32_t step,
                         const uint64_t *ids, uint32_t n)
{
    struct dh_media_plan p = small_plan();
    struct dh_err e;

    assert_int_equal(dh_wire_task_make(&rq->task, 0, step, 0, 0, &e), 0);
    rq->requester_rank = 0;
    assert_int_equal(dh_wire_set_samples(rq, ids, n, &e), 0);
    assert_int_equal(dh_wire_plan_from_media(&rq->plan, &p, &e), 0);
    rq->slack_ms = 1000;
}

#endif
