/* test_client.c - the client library (client.h) in one process, external
 * mode: a real Coordinator (tcp://127.0.0.1:0) and a local DataServer for
 * rank 0 (listening on a unique abstract socket), each on its own thread,
 * and the client attached to that server.  Steps come back exactly once and
 * in order with the bytes an inline decode gives (also split into
 * microbatches); a sample error surfaces at its step, naming the sample and
 * its path, and the epoch goes on; a full arena gives "arena exhausted"
 * instead of a hang and recovers once batches are released; an unreachable
 * Coordinator and bad options fail cleanly (no thread or fd left); a new
 * epoch abandons the old one without leaking arena slots (also when the
 * abandoned results come back after the new epoch's prefetch is full); the
 * DataServer going away is an error, never a hang.  Every wait is bounded;
 * every test's servers are torn down by its teardown even if it fails. */
#include <dirent.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <zmq.h>

#include "datahelix/arena.h"
#include "datahelix/batch.h"
#include "datahelix/client.h"
#include "datahelix/coordinator.h"
#include "datahelix/dataserver.h"
#include "datahelix/gendata.h"
#include "datahelix/index.h"
#include "datahelix/place.h"
#include "datahelix/spare.h"
#include "datahelix/wire.h"

#define NCLIPS 12 /* ids 0..11 good, id 12 = cut.mp4 (truncated) */

#include "clip_fixture.h"
#include "loop_runner.h"

#define WAIT_MS                                                                \
    20000            /* something that should happen (decode under ASan on
                         a noisy machine) */
#define STOP_MS 5000 /* a loop told to stop returns within this */
#define FRAMES 4
#define SIDE 32

static int group_setup(void **state)
{
    (void)state;
    return clip_fixture_setup("client", 11);
}

static struct dh_media_plan small_plan(void)
{
    struct dh_media_plan p;

    dh_media_plan_init(&p);
    p.frames = FRAMES;
    p.width = SIDE;
    p.height = SIDE;
    return p;
}

/* ---- one test's world: Coordinator, DataServer, client ---- */

#define MAX_HELD 16

struct env {
    struct runner co, ds;
    char sock[64];
    struct dh_client *cl;
    struct dh_client_batch *held[MAX_HELD];
    size_t n_held;
    struct dh_arena *view; /* a second view of the DataServer's arena */
    struct liar *liar;     /* a lying Coordinator, or NULL */
};

static void liar_down(struct liar *l);

static int env_setup(void **state)
{
    struct env *v = calloc(1, sizeof(*v));

    if (!v)
        return -1;
    *state = v;
    return 0;
}

static int env_teardown(void **state)
{
    struct env *v = *state;
    int rc = 0;

    for (size_t i = 0; i < v->n_held; i++)
        dh_client_batch_release(v->held[i]);
    dh_client_destroy(v->cl); /* closes the link: the server's run() ends */
    dh_arena_destroy(v->view);
    liar_down(v->liar);
    if (runner_stop(&v->ds, STOP_MS) < 0)
        rc = -1;
    else
        dh_dataserver_destroy(v->ds.s);
    if (runner_stop(&v->co, STOP_MS) < 0)
        rc = -1;
    else
        dh_coordinator_destroy(v->co.c);
    if (rc == 0)
        free(v);
    return rc;
}

/* Starts the Coordinator and a DataServer for rank 0 on a fresh abstract
 * socket; the arena and the allocation bound as given. */
static void env_up(struct env *v, size_t arena_bytes, int alloc_timeout_ms)
{
    static int serial;
    struct dh_coordinator_opts co;
    struct dh_dataserver_opts so;
    struct dh_err e;

    dh_coordinator_opts_default(&co);
    co.listen = "tcp://127.0.0.1:0";
    co.heartbeat_timeout_ms = 60000; /* a noisy machine is not a death */
    if (dh_coordinator_create(&co, &v->co.c, &e))
        fail_msg("coordinator: %s", e.msg);
    start_runner(&v->co);

    snprintf(v->sock, sizeof(v->sock), "dh-test-%d-%d", (int)getpid(),
             ++serial);
    dh_dataserver_opts_default(&so);
    so.coordinator = dh_coordinator_endpoint(v->co.c);
    so.index_path = dhx;
    so.rank = 0;
    so.workers = 2;
    so.arena_bytes = arena_bytes;
    so.alloc_timeout_ms = alloc_timeout_ms;
    so.heartbeat_ms = 100;
    so.register_timeout_ms = WAIT_MS;
    so.client_socket = v->sock;
    if (dh_dataserver_create(&so, &v->ds.s, &e))
        fail_msg("dataserver: %s", e.msg);
    start_runner(&v->ds);
    assert_int_equal(
        dh_arena_attach(dh_dataserver_arena_fd(v->ds.s), &v->view, &e), 0);
}

static void client_opts(const struct env *v, struct dh_client_opts *o)
{
    dh_client_opts_default(o);
    o->coordinator = dh_coordinator_endpoint(v->co.c);
    o->index_path = dhx;
    o->rank = 0;
    o->world_size = 1;
    o->dataserver = v->sock;
    o->plan = small_plan();
    o->prefetch = 2;
    o->microbatches = 1;
    o->timeout_ms = WAIT_MS;
    o->start_timeout_ms = WAIT_MS;
}

static void client_up(struct env *v, const struct dh_client_opts *o)
{
    struct dh_err e;

    if (dh_client_create(o, &v->cl, &e))
        fail_msg("client: %s", e.msg);
}

/* Keeps b until teardown (or release_held). */
static void hold(struct env *v, struct dh_client_batch *b)
{
    assert_true(v->n_held < MAX_HELD);
    v->held[v->n_held++] = b;
}

static void release_held(struct env *v)
{
    for (size_t i = 0; i < v->n_held; i++)
        dh_client_batch_release(v->held[i]);
    v->n_held = 0;
}

static struct dh_arena_stats arena_stats(struct env *v)
{
    struct dh_arena_stats st;

    assert_int_equal(dh_arena_stats(v->view, &st), 0);
    return st;
}

/* Every slot back in the DataServer's arena (bounded wait: late results
 * are released by the client's I/O thread as they come). */
static void assert_arena_drains(struct env *v)
{
    uint64_t end = now_ms() + WAIT_MS;
    struct dh_arena_stats st;

    do {
        st = arena_stats(v);
        if (st.live_slots == 0 && st.used == 0)
            break;
        sleep_ms(10);
    } while (now_ms() < end);
    if (st.live_slots != 0 || st.used != 0)
        fail_msg("arena did not drain: %u live slots, %llu bytes used",
                 st.live_slots, (unsigned long long)st.used);
    assert_int_equal(st.bad_releases, 0);
}

#define ASSERT_CO_STAT(v, field, want)                                         \
    do {                                                                       \
        struct dh_coordinator_stats st_;                                       \
        uint64_t end_ = now_ms() + WAIT_MS;                                    \
        do {                                                                   \
            dh_coordinator_stats((v)->co.c, &st_);                             \
            if (st_.field == (uint64_t)(want))                                 \
                break;                                                         \
            sleep_ms(5);                                                       \
        } while (now_ms() < end_);                                             \
        assert_int_equal(st_.field, (want));                                   \
    } while (0)

/* ---- schedules and checks ---- */

/* offsets of n steps of `per` ids each */
static void even_offsets(uint64_t *offs, uint64_t n, uint64_t per)
{
    for (uint64_t k = 0; k <= n; k++)
        offs[k] = k * per;
}

static int all_zero(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i])
            return 0;
    return 1;
}

/* Part j's bytes equal dh_batch_decode() of its ids inline. */
static void check_part(const struct dh_client_part *pt, uint32_t epoch,
                       const uint64_t *ids, uint32_t n, const uint32_t *valid)
{
    struct dh_media_plan p = small_plan();
    size_t bytes = dh_batch_bytes(&p, n);
    uint8_t *dst = malloc(bytes + DH_MEDIA_DST_PAD);
    int32_t want_valid[DH_CLIENT_MAX_PARTS];
    struct dh_media *m;
    struct dh_err e;

    assert_non_null(dst);
    assert_true(n <= DH_CLIENT_MAX_PARTS);
    assert_int_equal(pt->n_samples, n);
    assert_int_equal(pt->ndims, 5);
    assert_int_equal(pt->dims[0], n);
    assert_int_equal(pt->dims[1], FRAMES);
    assert_int_equal(pt->dims[2], SIDE);
    assert_int_equal(pt->dims[3], SIDE);
    assert_int_equal(pt->dims[4], 3);
    assert_int_equal(pt->dtype, DH_DTYPE_U8);
    assert_int_equal(pt->layout, DH_LAYOUT_THWC);
    assert_int_equal(pt->server_id, 1);
    assert_non_null(pt->data);
    assert_true(pt->len >= bytes);
    assert_false(all_zero(pt->data, bytes));
    assert_int_equal(dh_media_create(&m, &e), 0);
    if (dh_batch_decode(m, ix, epoch, ids, n, &p, dst, bytes + DH_MEDIA_DST_PAD,
                        want_valid, NULL, &e))
        fail_msg("inline decode: %s", e.msg);
    assert_memory_equal(pt->data, dst, bytes);
    for (uint32_t i = 0; i < n; i++) {
        assert_int_equal(valid[i], (uint32_t)want_valid[i]);
        assert_int_equal(valid[i], FRAMES); /* S clips are ~50 frames */
    }
    dh_media_destroy(m);
    free(dst);
}

/* b is step `step` of `epoch` with ids[0..n) in `parts` microbatches (the
 * client's split: part j holds [n*j/parts, n*(j+1)/parts)). */
static void check_batch(const struct dh_client_batch *b, uint32_t epoch,
                        uint64_t step, const uint64_t *ids, uint32_t n,
                        uint32_t parts)
{
    assert_non_null(b);
    assert_int_equal(b->epoch, epoch);
    assert_int_equal(b->step, step);
    assert_int_equal(b->n_samples, n);
    assert_int_equal(b->n_parts, parts);
    assert_true(b->input_wait_ms >= 0);
    for (uint32_t i = 0; i < n; i++)
        assert_int_equal(b->sample_ids[i], ids[i]);
    for (uint32_t j = 0; j < parts; j++) {
        uint32_t lo = n * j / parts, hi = n * (j + 1) / parts;

        check_part(&b->parts[j], epoch, ids + lo, hi - lo,
                   b->valid_frames + lo);
    }
}

static double now_s(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* next() that must return a batch. */
static struct dh_client_batch *next_ok(struct dh_client *c)
{
    struct dh_client_batch *b = (struct dh_client_batch *)&b;
    struct dh_err e;
    int rc;

    dh_err_clear(&e);
    rc = dh_client_next(c, &b, &e);
    if (rc)
        fail_msg("next: %d: %s", rc, e.msg);
    assert_non_null(b);
    return b;
}

static size_t count_dir(const char *path)
{
    DIR *d = opendir(path);
    struct dirent *de;
    size_t n = 0;

    assert_non_null(d);
    while ((de = readdir(d)))
        if (de->d_name[0] != '.')
            n++;
    closedir(d);
    return n;
}

/* Threads and fds of this process come back to (n_th, n_fd) (bounded). */
static void assert_nothing_left(size_t n_th, size_t n_fd)
{
    uint64_t end = now_ms() + STOP_MS;

    while ((count_dir("/proc/self/task") != n_th ||
            count_dir("/proc/self/fd") != n_fd) &&
           now_ms() < end)
        sleep_ms(10);
    assert_int_equal(count_dir("/proc/self/task"), n_th);
    assert_int_equal(count_dir("/proc/self/fd"), n_fd);
}

/* ---- tests ---- */

/* 5 steps of 2 distinct ids, prefetch 2: steps 0..4 in order with the
 * right ids and bytes, then DH_EEMPTY; a batch outlives destroy(). */
static void steps_exactly_once_in_order(void **state)
{
    struct env *v = *state;
    struct dh_client_opts o;
    struct dh_client_stats st;
    struct dh_client_batch *b, *last = NULL;
    uint64_t ids[10] = {3, 7, 0, 11, 5, 1, 9, 2, 10, 4}, offs[6];
    struct dh_err e;

    env_up(v, 4u << 20, WAIT_MS);
    client_opts(v, &o);
    client_up(v, &o);
    even_offsets(offs, 5, 2);
    assert_int_equal(dh_client_start_epoch(v->cl, 0, 0, 5, ids, offs, &e), 0);
    for (uint64_t k = 0; k < 5; k++) {
        b = next_ok(v->cl);
        check_batch(b, 0, k, ids + 2 * k, 2, 1);
        if (k < 4)
            dh_client_batch_release(b);
        else
            last = b;
    }
    b = (struct dh_client_batch *)&b;
    assert_int_equal(dh_client_next(v->cl, &b, &e), DH_EEMPTY);
    assert_null(b);
    assert_int_equal(dh_client_next(v->cl, &b, &e), DH_EEMPTY);
    dh_client_stats(v->cl, &st);
    assert_int_equal(st.steps, 5);
    assert_int_equal(st.errors, 0);
    assert_int_equal(st.requests, 5);
    assert_int_equal(st.quarantined, 0);
    assert_int_equal(st.restarts, 0);
    assert_int_equal(dh_client_quarantine(v->cl, NULL, 0), 0);
    ASSERT_CO_STAT(v, results, 5);

    /* The last batch outlives the client: still mapped, then released. */
    dh_client_destroy(v->cl);
    v->cl = NULL;
    check_batch(last, 0, 4, ids + 8, 2, 1);
    dh_client_batch_release(last);
    assert_arena_drains(v);
}

/* microbatches 2, 4 samples a step: 2 parts of 2, ids in batch order. */
static void microbatches_split_a_step(void **state)
{
    struct env *v = *state;
    struct dh_client_opts o;
    struct dh_client_stats st;
    struct dh_client_batch *b;
    uint64_t ids[12] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, offs[4];
    uint64_t bad_offs[3] = {0, 4, 5}; /* step 1 has 1 sample < 2 parts */
    struct dh_err e;

    env_up(v, 4u << 20, WAIT_MS);
    client_opts(v, &o);
    o.microbatches = 2;
    client_up(v, &o);
    assert_int_equal(dh_client_start_epoch(v->cl, 0, 0, 2, ids, bad_offs, &e),
                     DH_EINVAL);
    even_offsets(offs, 3, 4);
    assert_int_equal(dh_client_start_epoch(v->cl, 0, 0, 3, ids, offs, &e), 0);
    for (uint64_t k = 0; k < 3; k++) {
        b = next_ok(v->cl);
        check_batch(b, 0, k, ids + 4 * k, 4, 2);
        assert_int_equal(b->parts[0].n_samples, 2);
        assert_int_equal(b->parts[1].n_samples, 2);
        dh_client_batch_release(b);
    }
    assert_int_equal(dh_client_next(v->cl, &b, &e), DH_EEMPTY);
    dh_client_stats(v->cl, &st);
    assert_int_equal(st.steps, 3);
    assert_int_equal(st.requests, 6);
    assert_int_equal(st.errors, 0);
    assert_arena_drains(v);
}

/* Step 2 holds the truncated clip: steps 0, 1 fine, step 2 an error naming
 * the sample and its path, step 3 fine, the id quarantined. */
static void sample_error_at_its_step(void **state)
{
    struct env *v = *state;
    struct dh_client_opts o;
    struct dh_client_stats st;
    struct dh_client_batch *b;
    uint64_t ids[8] = {0, 1, 2, 3, 4, NCLIPS, 5, 6}, offs[5], q[4] = {0};
    char want[800];
    struct dh_client_failure f;
    struct dh_err e;
    int rc;

    env_up(v, 4u << 20, WAIT_MS);
    client_opts(v, &o);
    client_up(v, &o);
    even_offsets(offs, 4, 2);
    assert_int_equal(dh_client_start_epoch(v->cl, 0, 0, 4, ids, offs, &e), 0);
    for (uint64_t k = 0; k < 2; k++) {
        b = next_ok(v->cl);
        check_batch(b, 0, k, ids + 2 * k, 2, 1);
        dh_client_batch_release(b);
    }
    assert_int_equal(dh_client_failure(v->cl, &f), DH_ENOTFOUND);
    b = (struct dh_client_batch *)&b;
    dh_err_clear(&e);
    rc = dh_client_next(v->cl, &b, &e);
    assert_null(b);
    assert_int_equal(rc, DH_ESAMPLE); /* its kind, not the server's cause */
    assert_int_equal(e.code, rc);
    snprintf(want, sizeof(want), "sample %d (%s)", NCLIPS, paths[NCLIPS]);
    if (!strstr(e.msg, want) || !strstr(e.msg, "step 2"))
        fail_msg("error does not name '%s' at step 2: %s", want, e.msg);
    assert_int_equal(dh_client_failure(v->cl, &f), 0);
    assert_int_equal(f.epoch, 0);
    assert_int_equal(f.step, 2);
    assert_int_equal(f.sample_id, NCLIPS);
    assert_string_equal(f.path, paths[NCLIPS]);
    assert_true(f.cause < 0 && f.cause != DH_ESAMPLE);
    assert_int_equal(f.stage, DH_STAGE_DECODE); /* a truncated clip */
    assert_string_equal(dh_stage_name(f.stage), "decode");
    assert_int_equal(f.server_id, dh_dataserver_id(v->ds.s));
    assert_true(f.message[0] && strstr(e.msg, f.message));
    b = next_ok(v->cl);
    check_batch(b, 0, 3, ids + 6, 2, 1);
    dh_client_batch_release(b);
    assert_int_equal(dh_client_next(v->cl, &b, &e), DH_EEMPTY);
    assert_int_equal(dh_client_quarantine(v->cl, q, 4), 1);
    assert_int_equal(q[0], NCLIPS);
    dh_client_stats(v->cl, &st);
    assert_int_equal(st.steps, 3);
    assert_int_equal(st.errors, 1);
    assert_int_equal(st.quarantined, 1);
    assert_arena_drains(v);
}

/* The skip policy (issue 15 item 2): with spares, the step holding the
 * truncated clip comes back full-size, the clip replaced in its position
 * by the first spare the plan gives (dh_spare_choose), with the bytes an
 * inline decode of the delivered ids gives; the substitution is reported
 * (position, failed id, substitute, cause, stage) and counted by client
 * and server; the failed id is quarantined on both.  A second pass over
 * the same schedule gets the same substitute, from the server's
 * quarantine without decoding the clip again. */
static void skip_substitutes_at_full_size(void **state)
{
    struct env *v = *state;
    struct dh_client_opts o;
    struct dh_client_stats st;
    struct dh_dataserver_stats ds;
    struct dh_client_batch *b;
    uint64_t ids[8] = {0, 1, 2, 3, 4, NCLIPS, 5, 6}, offs[5], q[4] = {0};
    uint64_t spares[2], want[2];
    struct dh_err e;

    env_up(v, 4u << 20, WAIT_MS);
    client_opts(v, &o);
    o.spares = 2;
    client_up(v, &o);
    even_offsets(offs, 4, 2);
    assert_int_equal(
        dh_spare_choose(o.plan.seed, 0, 2, 0, ids, offs, 4, 2, 2, spares), 2);
    for (int pass = 0; pass < 2; pass++) {
        assert_int_equal(dh_client_start_epoch(v->cl, 0, 0, 4, ids, offs, &e),
                         0);
        for (uint64_t k = 0; k < 4; k++) {
            b = next_ok(v->cl);
            memcpy(want, ids + 2 * k, sizeof(want));
            if (k == 2)
                want[1] = spares[0];
            check_batch(b, 0, k, want, 2, 1); /* full size, decoded bytes */
            if (k != 2) {
                assert_int_equal(b->n_subs, 0);
                assert_null(b->subs);
            } else {
                assert_int_equal(b->n_subs, 1);
                assert_int_equal(b->subs[0].position, 1);
                assert_int_equal(b->subs[0].failed_id, NCLIPS);
                assert_int_equal(b->subs[0].substitute_id, spares[0]);
                assert_true(b->subs[0].cause < 0);
                assert_int_equal(b->subs[0].stage, DH_STAGE_DECODE);
            }
            dh_client_batch_release(b);
        }
        assert_int_equal(dh_client_next(v->cl, &b, &e), DH_EEMPTY);
    }
    assert_int_equal(dh_client_quarantine(v->cl, q, 4), 1);
    assert_int_equal(q[0], NCLIPS);
    dh_client_stats(v->cl, &st);
    assert_int_equal(st.steps, 8);
    assert_int_equal(st.errors, 0);
    assert_int_equal(st.substituted, 2);
    assert_int_equal(st.quarantined, 1);
    dh_dataserver_stats(v->ds.s, &ds);
    assert_int_equal(ds.substituted, 2);
    assert_int_equal(ds.quarantined, 1);
    assert_int_equal(ds.quarantine_hits, 1); /* pass 2: not decoded again */
    assert_int_equal(ds.errors, 0);
    assert_arena_drains(v);
}

/* The consumer holds the whole arena (2 slots, 2 batches held) while the
 * server would wait 20 s for room: next() says DH_EARENA at once, naming
 * what is held, and the step is not consumed; once the batches go back,
 * the same step comes, then the rest in order, and no slot leaks. */
static void full_arena_is_an_error_then_recovers(void **state)
{
    struct env *v = *state;
    struct dh_media_plan p = small_plan();
    size_t slot = (dh_batch_bytes(&p, 2) + DH_MEDIA_DST_PAD + DH_ARENA_ALIGN -
                   1) /
                  DH_ARENA_ALIGN * DH_ARENA_ALIGN;
    struct dh_client_opts o;
    struct dh_arena_stats as;
    struct dh_client_batch *b;
    uint64_t ids[12] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, offs[7];
    struct dh_client_failure f;
    struct dh_err e;
    double t0;
    int rc;

    env_up(v, 2 * slot, WAIT_MS);
    as = arena_stats(v);
    assert_true(as.capacity >= 2 * slot);
    assert_true(as.capacity < 3 * slot); /* the test means what it says */
    client_opts(v, &o);
    client_up(v, &o);
    even_offsets(offs, 6, 2);
    assert_int_equal(dh_client_start_epoch(v->cl, 0, 0, 6, ids, offs, &e), 0);
    for (uint64_t k = 0; k < 2; k++) {
        b = next_ok(v->cl);
        check_batch(b, 0, k, ids + 2 * k, 2, 1);
        hold(v, b); /* the arena is full now */
    }
    as = arena_stats(v);
    assert_int_equal(as.live_slots, 2); /* the two held */
    assert_true(as.used <= as.capacity);
    b = (struct dh_client_batch *)&b;
    dh_err_clear(&e);
    t0 = now_s();
    rc = dh_client_next(v->cl, &b, &e);
    assert_null(b);
    if (rc != DH_EARENA || !strstr(e.msg, "still held by the consumer") ||
        !strstr(e.msg, "step 2"))
        fail_msg("want DH_EARENA at step 2, got %d: %s", rc, e.msg);
    assert_true(now_s() - t0 < WAIT_MS / 4000.0); /* not the server's 20 s */
    assert_int_equal(dh_client_failure(v->cl, &f), 0);
    assert_int_equal(f.step, 2);
    assert_int_equal(f.consumed, 0);
    assert_int_equal(f.sample_id, DH_CLIENT_NO_SAMPLE);
    assert_int_equal(f.cause, DH_EARENA);
    assert_int_equal(f.stage, DH_STAGE_ARENA);
    assert_non_null(strstr(f.message, "2 batch parts"));
    as = arena_stats(v);
    assert_true(as.waiting >= 1); /* the server is still waiting */
    assert_int_equal(as.timeouts, 0);

    release_held(v);
    for (uint64_t k = 2; k < 6; k++) { /* step 2 again: not consumed */
        b = next_ok(v->cl);
        check_batch(b, 0, k, ids + 2 * k, 2, 1);
        dh_client_batch_release(b);
    }
    assert_int_equal(dh_client_next(v->cl, &b, &e), DH_EEMPTY);
    as = arena_stats(v);
    assert_true(as.used <= as.capacity);
    assert_int_equal(as.bad_releases, 0);
    assert_arena_drains(v);
}

/* Nobody binds the Coordinator's address: DH_ETIMEOUT after about
 * start_timeout_ms, *out untouched, no thread or fd left. */
static void unreachable_coordinator_times_out(void **state)
{
    struct dh_client_opts o;
    struct dh_client *c, *const sentinel = (struct dh_client *)&c;
    char ep[700];
    size_t n_th, n_fd;
    uint64_t t0, dt;
    struct dh_err e;
    int rc;

    (void)state;
    snprintf(ep, sizeof(ep), "ipc://%s/nobody-%d.sock", dir, (int)getpid());
    unlink(ep + 6);
    dh_client_opts_default(&o);
    o.coordinator = ep;
    o.index_path = dhx;
    o.plan = small_plan(); /* embedded: it registers before it spawns */
    o.start_timeout_ms = 300;
    n_th = count_dir("/proc/self/task");
    n_fd = count_dir("/proc/self/fd");
    c = sentinel;
    t0 = now_ms();
    rc = dh_client_create(&o, &c, &e);
    dt = now_ms() - t0;
    assert_int_equal(rc, DH_ETIMEOUT);
    assert_ptr_equal(c, sentinel);
    assert_non_null(strstr(e.msg, ep));
    assert_non_null(strstr(e.msg, "did not answer within 300 ms"));
    assert_true(dt >= 290);
    assert_true(dt < 300 + 3000);
    assert_nothing_left(n_th, n_fd);
}

/* Bad options are DH_EINVAL at once, *out untouched, nothing left. */
static void bad_options_are_einval(void **state)
{
    struct dh_client_opts o;
    struct dh_client *c, *const sentinel = (struct dh_client *)&c;
    char missing[700];
    size_t n_th = count_dir("/proc/self/task");
    size_t n_fd = count_dir("/proc/self/fd");
    struct dh_err e;
    int rc;

    (void)state;
    c = sentinel;
#define BASE()                                                                 \
    do {                                                                       \
        dh_client_opts_default(&o);                                            \
        o.coordinator = "tcp://127.0.0.1:1";                                   \
        o.index_path = dhx;                                                    \
        o.plan = small_plan();                                                 \
        o.start_timeout_ms = 300;                                              \
    } while (0)
    BASE();
    o.rank = 1; /* of world 1 */
    assert_int_equal(dh_client_create(&o, &c, &e), DH_EINVAL);
    assert_non_null(strstr(e.msg, "rank 1 of world size 1"));
    BASE();
    o.world_size = 4;
    o.rank = 4;
    assert_int_equal(dh_client_create(&o, &c, &e), DH_EINVAL);
    BASE();
    o.prefetch = 0;
    assert_int_equal(dh_client_create(&o, &c, &e), DH_EINVAL);
    assert_non_null(strstr(e.msg, "prefetch 0"));
    BASE();
    o.microbatches = 0;
    assert_int_equal(dh_client_create(&o, &c, &e), DH_EINVAL);
    BASE();
    o.held = DH_CLIENT_MAX_PREFETCH + 1;
    assert_int_equal(dh_client_create(&o, &c, &e), DH_EINVAL);
    assert_non_null(strstr(e.msg, "held 257"));
    BASE();
    o.index_path = NULL;
    assert_int_equal(dh_client_create(&o, &c, &e), DH_EINVAL);
    BASE();
    o.index_path = "";
    assert_int_equal(dh_client_create(&o, &c, &e), DH_EINVAL);
    BASE();
    o.coordinator = NULL;
    assert_int_equal(dh_client_create(&o, &c, &e), DH_EINVAL);
    BASE();
    o.timeout_ms = 0;
    assert_int_equal(dh_client_create(&o, &c, &e), DH_EINVAL);
    BASE();
    o.plan.frames = 0; /* no frame bound: cannot be batched */
    assert_int_equal(dh_client_create(&o, &c, &e), DH_EINVAL);
    assert_int_equal(dh_client_create(NULL, &c, &e), DH_EINVAL);
    /* An index that is not there: its error, before any network wait. */
    BASE();
    snprintf(missing, sizeof(missing), "%s/no-such.dhx", dir);
    o.index_path = missing;
    rc = dh_client_create(&o, &c, &e);
    assert_true(rc < 0);
    assert_int_not_equal(rc, DH_ETIMEOUT);
    assert_non_null(strstr(e.msg, "no-such.dhx"));
#undef BASE
    assert_ptr_equal(c, sentinel);
    assert_nothing_left(n_th, n_fd);
}

/* One step of a 6-step epoch consumed (and kept), then epoch 1 from the
 * start: its steps in order; no slot leaks once all is released. */
static void new_epoch_abandons_the_old(void **state)
{
    struct env *v = *state;
    struct dh_client_opts o;
    struct dh_client_stats st;
    struct dh_client_batch *b, *first;
    uint64_t ids0[12] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, offs0[7];
    uint64_t ids1[10] = {11, 9, 7, 5, 3, 1, 10, 8, 6, 4}, offs1[6];
    struct dh_err e;

    env_up(v, 4u << 20, WAIT_MS);
    client_opts(v, &o);
    client_up(v, &o);
    even_offsets(offs0, 6, 2);
    even_offsets(offs1, 5, 2);
    assert_int_equal(dh_client_start_epoch(v->cl, 0, 0, 6, ids0, offs0, &e), 0);
    first = next_ok(v->cl);
    check_batch(first, 0, 0, ids0, 2, 1);
    assert_int_equal(dh_client_start_epoch(v->cl, 1, 0, 5, ids1, offs1, &e), 0);
    for (uint64_t k = 0; k < 5; k++) {
        b = next_ok(v->cl);
        check_batch(b, 1, k, ids1 + 2 * k, 2, 1);
        dh_client_batch_release(b);
    }
    assert_int_equal(dh_client_next(v->cl, &b, &e), DH_EEMPTY);
    /* The batch of the abandoned epoch is still good. */
    check_batch(first, 0, 0, ids0, 2, 1);
    dh_client_batch_release(first);
    dh_client_stats(v->cl, &st);
    assert_int_equal(st.steps, 6);
    assert_int_equal(st.errors, 0);
    assert_arena_drains(v);
}

/* The same epoch started again (a new `for` loop, a resume) with other
 * samples under the same step numbers: a new pass, so the results still
 * coming for the first one are released, never taken for the second's
 * steps (with task ids of (epoch, step, rank) they would be).  Pass 0's
 * steps 1 and 2 are 12 samples each and occupy both workers when pass 1
 * starts, so they finish before pass 1's steps of one sample. */
static void same_epoch_again_is_a_new_pass(void **state)
{
    struct env *v = *state;
    struct dh_client_opts o;
    struct dh_client_stats st;
    struct dh_client_batch *b;
    uint64_t ids0[25] = {0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9,  10, 11,
                         0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
    uint64_t offs0[4] = {0, 1, 13, 25};
    uint64_t ids1[3] = {4, 7, 9}, offs1[4] = {0, 1, 2, 3};
    struct dh_err e;

    env_up(v, 4u << 20, WAIT_MS);
    client_opts(v, &o);
    client_up(v, &o);
    assert_int_equal(dh_client_start_pass(v->cl, 0, 0, 0, 3, ids0, offs0, &e),
                     0);
    b = next_ok(v->cl);
    check_batch(b, 0, 0, ids0, 1, 1);
    dh_client_batch_release(b);
    /* at once: steps 1 and 2 of pass 0 are still being prepared */
    assert_int_equal(dh_client_start_epoch(v->cl, 0, 0, 3, ids1, offs1, &e), 0);
    for (uint64_t k = 0; k < 3; k++) {
        b = next_ok(v->cl);
        check_batch(b, 0, k, ids1 + k, 1, 1);
        dh_client_batch_release(b);
    }
    assert_int_equal(dh_client_next(v->cl, &b, &e), DH_EEMPTY);
    ASSERT_CO_STAT(v, results, 6); /* pass 0's late ones came back too */
    dh_client_stats(v->cl, &st);
    assert_int_equal(st.steps, 4);
    assert_int_equal(st.errors, 0);
    assert_arena_drains(v);
}

/* dh_client_start_pass(): a pass is new or the current one continued with
 * later steps of its epoch; a reused pass, a continuation that goes back or
 * changes epoch, pass 65,536 and an epoch past 32 bits are refused, and a
 * refused call changes nothing (the pass in progress goes on). */
static void passes_are_never_reused(void **state)
{
    struct env *v = *state;
    struct dh_client_opts o;
    struct dh_client_batch *b;
    uint64_t ids[8] = {0, 1, 2, 3, 4, 5, 6, 7}, offs[5];
    struct dh_err e;

    env_up(v, 4u << 20, WAIT_MS);
    client_opts(v, &o);
    client_up(v, &o);
    even_offsets(offs, 4, 2);
    assert_int_equal(dh_client_start_pass(v->cl, 7, 5, 0, 2, ids, offs, &e), 0);
    assert_int_equal(dh_client_start_pass(v->cl, 7, 4, 2, 2, ids, offs, &e),
                     DH_EINVAL);
    assert_non_null(strstr(e.msg, "pass 4 was started before"));
    assert_int_equal(dh_client_start_pass(v->cl, 7, 5, 1, 2, ids, offs, &e),
                     DH_EINVAL); /* steps 1.. were given already */
    assert_non_null(strstr(e.msg, "pass 5 continued"));
    assert_int_equal(dh_client_start_pass(v->cl, 8, 5, 2, 2, ids, offs, &e),
                     DH_EINVAL); /* a pass names one epoch */
    assert_int_equal(
        dh_client_start_pass(v->cl, 7, DH_WIRE_MAX_PASSES, 0, 2, ids, offs, &e),
        DH_ETOOBIG);
    assert_non_null(strstr(e.msg, "pass 65536"));
    assert_int_equal(
        dh_client_start_pass(v->cl, UINT64_C(1) << 32, 6, 0, 2, ids, offs, &e),
        DH_ETOOBIG);
    assert_int_equal(dh_client_start_pass(v->cl, 7, 6, DH_WIRE_MAX_STEPS - 1, 2,
                                          ids, offs, &e),
                     DH_ETOOBIG);
    b = next_ok(v->cl); /* pass 5 still runs */
    check_batch(b, 7, 0, ids, 2, 1);
    dh_client_batch_release(b);
    /* continued with steps 2..3: the chunk after the first */
    assert_int_equal(dh_client_start_pass(v->cl, 7, 5, 2, 2, ids, offs + 2, &e),
                     0);
    for (uint64_t k = 2; k < 4; k++) {
        b = next_ok(v->cl);
        check_batch(b, 7, k, ids + 2 * k, 2, 1);
        dh_client_batch_release(b);
    }
    /* the last pass a rank may start, then no more */
    assert_int_equal(dh_client_start_pass(v->cl, 9, DH_WIRE_MAX_PASSES - 1, 0,
                                          1, ids, offs, &e),
                     0);
    b = next_ok(v->cl);
    check_batch(b, 9, 0, ids, 2, 1);
    dh_client_batch_release(b);
    assert_int_equal(dh_client_start_epoch(v->cl, 10, 0, 1, ids, offs, &e),
                     DH_ETOOBIG);
    assert_arena_drains(v);
}

/* The abandoned epoch's last result comes back after the new epoch's whole
 * prefetch window has arrived (epoch 0 step 2 is 10 samples, epoch 1's
 * steps 1 sample each, and nothing of epoch 1 is consumed until every
 * result has been forwarded): its slot must still go back to the arena. */
static void late_result_with_full_window_is_released(void **state)
{
    struct env *v = *state;
    struct dh_client_opts o;
    struct dh_client_stats st;
    struct dh_client_batch *b;
    uint64_t ids0[12] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
    uint64_t offs0[4] = {0, 1, 2, 12};
    uint64_t ids1[2] = {4, 7}, offs1[3] = {0, 1, 2};
    struct dh_err e;

    env_up(v, 4u << 20, WAIT_MS);
    client_opts(v, &o);
    client_up(v, &o);
    assert_int_equal(dh_client_start_epoch(v->cl, 0, 0, 3, ids0, offs0, &e), 0);
    b = next_ok(v->cl);
    check_batch(b, 0, 0, ids0, 1, 1);
    dh_client_batch_release(b); /* step 2 (10 samples) is asked for now */
    assert_int_equal(dh_client_start_epoch(v->cl, 1, 0, 2, ids1, offs1, &e), 0);
    /* e0s0, e0s1, e0s2, e1s0, e1s1 all forwarded to the client. */
    ASSERT_CO_STAT(v, results, 5);
    for (uint64_t k = 0; k < 2; k++) {
        b = next_ok(v->cl);
        check_batch(b, 1, k, ids1 + k, 1, 1);
        dh_client_batch_release(b);
    }
    assert_int_equal(dh_client_next(v->cl, &b, &e), DH_EEMPTY);
    dh_client_stats(v->cl, &st);
    assert_int_equal(st.steps, 3);
    assert_arena_drains(v);
}

/* The local DataServer goes away: next() says so (DH_EPEERDEAD, "went
 * away") well within its timeout, and keeps saying so; a batch taken
 * before stays readable and can be released. */
static void dataserver_going_away_is_an_error(void **state)
{
    struct env *v = *state;
    struct dh_client_opts o;
    struct dh_client_batch *b, *kept;
    uint64_t ids[12] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, offs[7];
    uint64_t t0;
    struct dh_err e;
    int rc = 0;

    env_up(v, 4u << 20, WAIT_MS);
    client_opts(v, &o);
    o.timeout_ms = 5000; /* a hang would show as DH_ETIMEOUT */
    client_up(v, &o);
    even_offsets(offs, 6, 2);
    assert_int_equal(dh_client_start_epoch(v->cl, 0, 0, 6, ids, offs, &e), 0);
    kept = next_ok(v->cl);
    check_batch(kept, 0, 0, ids, 2, 1);

    assert_int_equal(runner_stop(&v->ds, STOP_MS), 0);
    assert_int_equal(v->ds.rc, 0);
    dh_arena_destroy(v->view);
    v->view = NULL;
    dh_dataserver_destroy(v->ds.s);
    v->ds.s = NULL;

    /* Results that were in before the server went may still come out
     * (at most the prefetch window); then the error. */
    t0 = now_ms();
    for (int i = 0; i <= 2; i++) {
        b = (struct dh_client_batch *)&b;
        dh_err_clear(&e);
        if ((rc = dh_client_next(v->cl, &b, &e)) != 0)
            break;
        check_batch(b, 0, b->step, ids + 2 * b->step, 2, 1);
        dh_client_batch_release(b);
    }
    assert_null(b);
    if (rc != DH_EPEERDEAD || !strstr(e.msg, "went away") ||
        !strstr(e.msg, v->sock))
        fail_msg("want DH_EPEERDEAD naming @%s 'went away', got %d: %s",
                 v->sock, rc, e.msg);
    assert_true(now_ms() - t0 < 5000);
    assert_int_equal(dh_client_next(v->cl, &b, &e), DH_EPEERDEAD);
    assert_non_null(strstr(e.msg, "went away"));
    check_batch(kept, 0, 0, ids, 2, 1); /* the client's own mapping */
    dh_client_batch_release(kept);
}

/* ---- the deadline model (place.h): the live client's slack ---- */

#define SLACK_STEPS 8

struct tel_step {
    double wait, window;
    long long slack;
};

/* Reads the client's telemetry lines back (DESIGN 4.4 field order). */
static void read_telemetry(FILE *f, struct tel_step *t, size_t n)
{
    char line[1024];
    size_t got = 0;

    rewind(f);
    while (got < n && fgets(line, sizeof(line), f)) {
        unsigned long long step;
        struct tel_step x;

        if (sscanf(line,
                   "{\"rank\":%*u,\"epoch\":%*u,\"step\":%llu,"
                   "\"input_wait_ms\":%lf,\"window_ms\":%lf,"
                   "\"deadline_ms\":%lld",
                   &step, &x.wait, &x.window, &x.slack) != 4)
            fail_msg("telemetry line not understood: %s", line);
        assert_int_equal(step, got);
        t[got++] = x;
    }
    assert_int_equal(got, n);
}

/* The model's slack for step k issued when `consumed` steps had been
 * returned: the periods of steps 1..consumed-1 (step 0 has no window
 * before it) fed to a dh_window. */
static double model_slack(const struct tel_step *t, uint64_t consumed,
                          uint64_t k, double hint, double fixed)
{
    struct dh_window w;

    dh_window_init(&w, DH_WINDOW_ALPHA);
    dh_window_assume(&w, hint, fixed);
    for (uint64_t i = 1; i < consumed; i++)
        dh_window_update(&w, t[i].window + t[i].wait);
    return dh_window_slack_ms(&w, (int)(k - consumed + 1), 0);
}

/* The I/O thread issues step k once step k - prefetch is consumed, or (on
 * a slow machine) a step or so later: the slack must be the model's for
 * one of those states -- within the telemetry's rounding (1 us per period,
 * the slack truncated to whole ms). */
static void assert_slack_is_the_models(const struct tel_step *t, uint64_t k,
                                       unsigned prefetch, double hint,
                                       double fixed)
{
    uint64_t lo = k >= prefetch ? k - prefetch + 1 : 0;

    for (uint64_t c = lo; c <= k; c++) {
        double m = model_slack(t, c, k, hint, fixed);

        if ((double)t[k].slack <= m + 0.01 && (double)t[k].slack > m - 1.01)
            return;
    }
    fail_msg("step %llu: slack %lld ms is not the model's (%.3f ms when "
             "issued after step %llu)",
             (unsigned long long)k, t[k].slack,
             model_slack(t, lo, k, hint, fixed), (unsigned long long)lo);
}

/* Windows of 5..60 ms between next() calls (a GPU step's compute: the
 * sleep is the behaviour here), prefetch 2, a step hint of 37 ms: every
 * request's slack is dh_window_slack_ms() of the periods the client
 * measured (telemetry), the first prefetch steps' from the hint; with a
 * fixed step deadline every slack is 2 x that once running.  The miss
 * threshold is ddl_ms. */
static void run_slack_steps(struct env *v, double fixed, double ddl_ms,
                            struct dh_client_stats *st)
{
    static const int hold_ms[SLACK_STEPS] = {5, 40, 10, 60, 5, 30, 50, 0};
    struct dh_client_opts o;
    struct tel_step t[SLACK_STEPS];
    uint64_t ids[SLACK_STEPS], offs[SLACK_STEPS + 1];
    FILE *tel = tmpfile();
    struct dh_err e;

    assert_non_null(tel);
    env_up(v, 4u << 20, WAIT_MS);
    client_opts(v, &o);
    o.step_ms_hint = 37;
    o.step_deadline_ms = fixed;
    o.ddl_ms = ddl_ms;
    o.telemetry = tel;
    client_up(v, &o);
    for (uint64_t i = 0; i < SLACK_STEPS; i++)
        ids[i] = i;
    even_offsets(offs, SLACK_STEPS, 1);
    assert_int_equal(
        dh_client_start_epoch(v->cl, 0, 0, SLACK_STEPS, ids, offs, &e), 0);
    for (int k = 0; k < SLACK_STEPS; k++) {
        struct dh_client_batch *b = next_ok(v->cl);
        struct timespec ts = {0, hold_ms[k] * 1000000L};

        nanosleep(&ts, NULL);
        dh_client_batch_release(b);
    }
    dh_client_stats(v->cl, st);
    dh_client_destroy(v->cl);
    v->cl = NULL;
    read_telemetry(tel, t, SLACK_STEPS);
    fclose(tel);
    for (uint64_t k = 0; k < SLACK_STEPS; k++)
        assert_slack_is_the_models(t, k, o.prefetch, 37, fixed);
    if (fixed > 0)
        assert_int_equal(t[SLACK_STEPS - 1].slack, (long long)(2 * fixed));
    else /* the measured periods, not the hint, once there are some */
        assert_int_not_equal(t[SLACK_STEPS - 1].slack, 2 * 37);
}

/* The measured period; ddl_ms 0 counts the first step's decode wait. */
static void slack_follows_the_measured_period(void **state)
{
    struct dh_client_stats st;

    run_slack_steps(*state, 0, 0, &st);
    assert_true(st.misses >= 1);
}

/* A fixed step deadline of 23 ms; ddl_ms 1e6 counts no step a miss. */
static void slack_follows_a_fixed_step_deadline(void **state)
{
    struct dh_client_stats st;

    run_slack_steps(*state, 23, 1e6, &st);
    assert_int_equal(st.misses, 0);
}

/* ---- a result that is not what was asked (issue 13) ---- */

/* A Coordinator that relays like the real one, but lies about step 0's
 * result as `mode` says. */
enum liar_mode {
    LIE_WRONG_ID,   /* adds 1000 to its first sample id */
    LIE_DUP,        /* relays it twice (the same slot) */
    LIE_DUP_ERROR,  /* relays it, then an error notice for the same task */
    LIE_DUP_FORGED, /* relays it, then a copy with step 1's ids naming the
                       same slot (step 1's own result comes too) */
    LIE_LOSE        /* "dies" with it unforwarded: the next acks carry a
                       new incarnation (a restarted Coordinator), and the
                       re-issued task's result is relayed */
};

struct liar {
    void *ctx, *sock;
    char ep[64];
    pthread_t th;
    int started;
    enum liar_mode mode;
    uint64_t incarnation; /* in RegisterClient acks (0: none) */
    int lost;             /* LIE_LOSE: step 0's first result dropped */
    volatile int stop;
};

static void liar_send(struct liar *l, const uint8_t *id, size_t n,
                      const struct dh_wire_msg *m)
{
    uint8_t *buf = NULL;
    size_t len = 0;

    assert_int_equal(dh_wire_encode(m, &buf, &len, NULL), 0);
    zmq_send(l->sock, id, n, ZMQ_SNDMORE);
    zmq_send(l->sock, buf, len, 0);
    dh_wire_free(buf);
}

/* Step 0's result `m` (to the client `cl`), as the mode lies about it. */
static void liar_relay0(struct liar *l, const uint8_t *cl, size_t ncl,
                        struct dh_wire_msg *m)
{
    struct dh_wire_msg x;

    if (l->mode == LIE_WRONG_ID)
        m->u.result.sample_ids[0] += 1000;
    if (l->mode == LIE_LOSE && !l->lost) {
        l->lost = 1;
        l->incarnation = 2;
        return;
    }
    liar_send(l, cl, ncl, m);
    switch (l->mode) {
    case LIE_DUP:
        liar_send(l, cl, ncl, m);
        break;
    case LIE_DUP_ERROR:
        dh_wire_msg_init(&x, DH_WIRE_ERROR_NOTICE);
        x.u.error.task = m->u.result.task;
        x.u.error.server_id = m->u.result.server_id;
        x.u.error.sample_id = m->u.result.sample_ids[0];
        x.u.error.cause = DH_EMEDIA;
        snprintf(x.u.error.message, sizeof(x.u.error.message), "forged");
        liar_send(l, cl, ncl, &x);
        break;
    case LIE_DUP_FORGED: {
        struct dh_wire_task t;

        /* step 1 asks ids {0, 11} (the tests' schedule) */
        dh_wire_task_split(m->u.result.task.id, &t);
        assert_int_equal(
            dh_wire_task_id(t.pass, 1, t.rank, 0, &m->u.result.task.id, NULL),
            0);
        m->u.result.task.step = 1;
        m->u.result.sample_ids[0] = 0;
        m->u.result.sample_ids[1] = 11;
        liar_send(l, cl, ncl, m);
        break;
    }
    default:
        break;
    }
}

static void *liar_main(void *arg)
{
    struct liar *l = arg;
    uint8_t cl[256], ds[256], id[256], buf[1 << 16];
    int ncl = 0, nds = 0;

    while (!l->stop) {
        zmq_pollitem_t it = {.socket = l->sock, .events = ZMQ_POLLIN};
        struct dh_wire_msg m;
        int n, len;

        if (zmq_poll(&it, 1, 20) <= 0)
            continue;
        n = zmq_recv(l->sock, id, sizeof(id), 0);
        len = zmq_recv(l->sock, buf, sizeof(buf), 0);
        if (n <= 0 || len <= 0 ||
            dh_wire_decode(buf, (size_t)len, &m, NULL) < 0)
            continue;
        if (m.type == DH_WIRE_REGISTER_CLIENT ||
            m.type == DH_WIRE_REGISTER_SERVER) {
            memcpy(m.type == DH_WIRE_REGISTER_CLIENT ? cl : ds, id, (size_t)n);
            *(m.type == DH_WIRE_REGISTER_CLIENT ? &ncl : &nds) = n;
            if (m.type == DH_WIRE_REGISTER_CLIENT)
                m.u.register_client.incarnation = l->incarnation;
            liar_send(l, id, (size_t)n, &m); /* the ack */
        } else if (m.type == DH_WIRE_DESCRIPTOR_REQUEST && nds) {
            struct dh_wire_msg r;

            dh_wire_msg_init(&r, DH_WIRE_ROUTE);
            r.u.route.task = m.u.request.task;
            r.u.route.server_id = r.u.route.target_server_id = 1;
            snprintf(r.u.route.target_addr, sizeof(r.u.route.target_addr),
                     "local:rank-0");
            r.u.route.has_request = 1;
            r.u.route.request = m.u.request; /* borrowed */
            liar_send(l, ds, (size_t)nds, &r);
            r.u.route.has_request = 0;
            liar_send(l, id, (size_t)n, &r);
        } else if (m.type == DH_WIRE_RESULT_NOTICE && ncl) {
            if (m.u.result.task.step == 0)
                liar_relay0(l, cl, (size_t)ncl, &m);
            else
                liar_send(l, cl, (size_t)ncl, &m);
        }
        dh_wire_msg_fini(&m);
    }
    return NULL;
}

/* Stops and frees a liar (NULL: none); the teardown's, so that a failed
 * assertion leaves no thread or socket behind. */
static void liar_down(struct liar *l)
{
    if (!l)
        return;
    l->stop = 1;
    if (l->started)
        pthread_join(l->th, NULL);
    if (l->sock)
        zmq_close(l->sock);
    if (l->ctx)
        zmq_ctx_term(l->ctx);
    free(l);
}

/* A liar in `mode`, a DataServer for rank 0 registered with it, and the
 * client attached (prefetch 2, one microbatch); v->view sees the arena. */
static void liar_up(struct env *v, enum liar_mode mode)
{
    struct dh_dataserver_opts so;
    struct dh_client_opts o;
    struct liar *l;
    size_t len;
    struct dh_err e;
    int zero = 0;

    l = calloc(1, sizeof(*l));
    if (!l)
        fail_msg("out of memory");
    v->liar = l;
    l->mode = mode;
    l->incarnation = mode == LIE_LOSE ? 1 : 0;
    len = sizeof(l->ep);
    assert_non_null(l->ctx = zmq_ctx_new());
    assert_non_null(l->sock = zmq_socket(l->ctx, ZMQ_ROUTER));
    zmq_setsockopt(l->sock, ZMQ_LINGER, &zero, sizeof(zero));
    assert_int_equal(zmq_bind(l->sock, "tcp://127.0.0.1:0"), 0);
    assert_int_equal(zmq_getsockopt(l->sock, ZMQ_LAST_ENDPOINT, l->ep, &len),
                     0);
    assert_int_equal(pthread_create(&l->th, NULL, liar_main, l), 0);
    l->started = 1;

    snprintf(v->sock, sizeof(v->sock), "dh-test-%d-liar%d", (int)getpid(),
             (int)mode);
    dh_dataserver_opts_default(&so);
    so.coordinator = l->ep;
    so.index_path = dhx;
    so.workers = 1;
    so.arena_bytes = 4u << 20;
    so.register_timeout_ms = WAIT_MS;
    so.client_socket = v->sock;
    if (dh_dataserver_create(&so, &v->ds.s, &e))
        fail_msg("dataserver: %s", e.msg);
    start_runner(&v->ds);
    assert_int_equal(
        dh_arena_attach(dh_dataserver_arena_fd(v->ds.s), &v->view, &e), 0);
    dh_client_opts_default(&o);
    o.coordinator = l->ep;
    o.index_path = dhx;
    o.dataserver = v->sock;
    o.plan = small_plan();
    o.prefetch = 2;
    o.timeout_ms = WAIT_MS;
    o.start_timeout_ms = WAIT_MS;
    client_up(v, &o);
}

/* Waits (bounded) until the client counts `want` protocol errors. */
static void wait_protocol_errors(struct env *v, uint64_t want)
{
    uint64_t end = now_ms() + WAIT_MS;
    struct dh_client_stats st;

    do {
        dh_client_stats(v->cl, &st);
        if (st.protocol_errors >= want)
            break;
        sleep_ms(5);
    } while (now_ms() < end);
    assert_int_equal(st.protocol_errors, want);
}

static void mismatched_result_is_a_protocol_error(void **state)
{
    struct env *v = *state;
    struct dh_client_stats st;
    struct dh_client_batch *b = NULL;
    struct dh_client_failure f;
    uint64_t ids[4] = {3, 7, 0, 11}, offs[3] = {0, 2, 4};
    struct dh_err e;

    liar_up(v, LIE_WRONG_ID);
    assert_int_equal(dh_client_start_epoch(v->cl, 0, 0, 2, ids, offs, &e), 0);
    /* The step fails (consumed), as a transfer error: not data, and no
     * sample is blamed or quarantined for it. */
    assert_int_equal(dh_client_next(v->cl, &b, &e), DH_ESAMPLE);
    assert_null(b);
    if (!strstr(e.msg, "does not match the request"))
        fail_msg("next(): %s", e.msg);
    assert_int_equal(dh_client_failure(v->cl, &f), 0);
    assert_int_equal(f.cause, DH_EPROTO);
    assert_int_equal(f.stage, DH_STAGE_TRANSFER);
    assert_int_equal(dh_client_quarantine(v->cl, NULL, 0), 0);
    b = next_ok(v->cl);
    check_batch(b, 0, 1, ids + 2, 2, 1);
    dh_client_batch_release(b);
    dh_client_stats(v->cl, &st);
    assert_int_equal(st.protocol_errors, 1);
    assert_int_equal(st.steps, 1);
    assert_arena_drains(v);
}

/* A second notice for a task that has its outcome already, from a server
 * that was never asked again (the same slot twice, an error after the
 * result, or another task's result naming the held slot): a protocol
 * error, counted; the first outcome is the step, read intact while the
 * duplicate comes and goes, and its slot is released exactly once (no
 * stale release in the arena, nothing left live). */
static void duplicate_notice_is_a_protocol_error(void **state)
{
    static const enum liar_mode modes[] = {LIE_DUP, LIE_DUP_ERROR,
                                           LIE_DUP_FORGED};
    static int round;
    struct env *v = *state;
    enum liar_mode mode = modes[round++ % 3];
    struct dh_client_stats st;
    struct dh_client_batch *b0, *b1;
    uint64_t ids[4] = {3, 7, 0, 11}, offs[3] = {0, 2, 4};
    struct dh_err e;

    liar_up(v, mode);
    assert_int_equal(dh_client_start_epoch(v->cl, 0, 0, 2, ids, offs, &e), 0);
    b0 = next_ok(v->cl);
    hold(v, b0);
    wait_protocol_errors(v, 1); /* the duplicate came while b0 is held */
    /* b0's slot is still the client's: live, and its bytes b0's. */
    assert_true(arena_stats(v).live_slots >= 1);
    check_batch(b0, 0, 0, ids, 2, 1);
    b1 = next_ok(v->cl);
    check_batch(b1, 0, 1, ids + 2, 2, 1);
    dh_client_batch_release(b1);
    release_held(v);
    assert_int_equal(dh_client_next(v->cl, &b1, &e), DH_EEMPTY);
    dh_client_stats(v->cl, &st);
    assert_int_equal(st.steps, 2);
    assert_int_equal(st.errors, 0);
    assert_int_equal(st.protocol_errors, 1);
    assert_arena_drains(v);
}

/* Issue 13: the Coordinator dies with step 0's ResultNotice unforwarded
 * (its slot is the client's now, but the client never heard of it) and
 * comes back empty.  The client re-issues the step; its local server has
 * the batch already and sends the same notice again, so the step arrives
 * once, in the same slot, and after the epoch nothing is left in the
 * arena (no slot reserved for the lost notice). */
static void lost_notice_leaves_no_slot_behind(void **state)
{
    struct env *v = *state;
    struct dh_client_stats st;
    struct dh_client_batch *b;
    uint64_t ids[4] = {3, 7, 0, 11}, offs[3] = {0, 2, 4};
    struct dh_err e;

    liar_up(v, LIE_LOSE);
    assert_int_equal(dh_client_start_epoch(v->cl, 0, 0, 2, ids, offs, &e), 0);
    for (uint64_t k = 0; k < 2; k++) {
        b = next_ok(v->cl);
        check_batch(b, 0, k, ids + 2 * k, 2, 1);
        dh_client_batch_release(b);
    }
    assert_int_equal(dh_client_next(v->cl, &b, &e), DH_EEMPTY);
    dh_client_stats(v->cl, &st);
    assert_int_equal(st.coordinator_restarts, 1);
    assert_true(st.reissued >= 1);
    assert_int_equal(st.steps, 2);
    assert_int_equal(st.protocol_errors, 0);
    assert_arena_drains(v);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(mismatched_result_is_a_protocol_error,
                                        env_setup, env_teardown),
        cmocka_unit_test_setup_teardown(duplicate_notice_is_a_protocol_error,
                                        env_setup, env_teardown),
        cmocka_unit_test_setup_teardown(duplicate_notice_is_a_protocol_error,
                                        env_setup, env_teardown),
        cmocka_unit_test_setup_teardown(duplicate_notice_is_a_protocol_error,
                                        env_setup, env_teardown),
        cmocka_unit_test_setup_teardown(lost_notice_leaves_no_slot_behind,
                                        env_setup, env_teardown),
        cmocka_unit_test_setup_teardown(steps_exactly_once_in_order, env_setup,
                                        env_teardown),
        cmocka_unit_test_setup_teardown(microbatches_split_a_step, env_setup,
                                        env_teardown),
        cmocka_unit_test_setup_teardown(sample_error_at_its_step, env_setup,
                                        env_teardown),
        cmocka_unit_test_setup_teardown(skip_substitutes_at_full_size,
                                        env_setup, env_teardown),
        cmocka_unit_test_setup_teardown(full_arena_is_an_error_then_recovers,
                                        env_setup, env_teardown),
        cmocka_unit_test_setup_teardown(slack_follows_the_measured_period,
                                        env_setup, env_teardown),
        cmocka_unit_test_setup_teardown(slack_follows_a_fixed_step_deadline,
                                        env_setup, env_teardown),
        cmocka_unit_test(unreachable_coordinator_times_out),
        cmocka_unit_test(bad_options_are_einval),
        cmocka_unit_test_setup_teardown(new_epoch_abandons_the_old, env_setup,
                                        env_teardown),
        cmocka_unit_test_setup_teardown(same_epoch_again_is_a_new_pass,
                                        env_setup, env_teardown),
        cmocka_unit_test_setup_teardown(passes_are_never_reused, env_setup,
                                        env_teardown),
        cmocka_unit_test_setup_teardown(
            late_result_with_full_window_is_released, env_setup, env_teardown),
        cmocka_unit_test_setup_teardown(dataserver_going_away_is_an_error,
                                        env_setup, env_teardown),
    };

    return cmocka_run_group_tests(tests, group_setup, clip_fixture_teardown);
}
