/* test_ds_exec.c - the DataServer's executor contract
 * (src/runtime/dataserver_internal.h) on the C decode pool executor,
 * driven without a loop or sockets through a recording sink:
 *   - every submitted job ends exactly once, at the sink, never at submit;
 *   - a decoded batch is a RESULT whose slot holds dims [B,T,H,W,3] of
 *     the plan's bytes, with the job's ids and valid frames;
 *   - a sample the index does not have is an ERROR naming that sample,
 *     marked for the quarantine;
 *   - destroy with jobs in flight reports nothing more and leaks nothing
 *     (ASan).
 * Every wait has a timeout. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "datahelix/batch.h"
#include "datahelix/gendata.h"
#include "datahelix/index.h"
#include "runtime/dataserver_internal.h"

#define NCLIPS 3

#include "clip_fixture.h"

struct rec {
    int n, results, errors;
    struct ds_done last[8];
    uint64_t ids0[8];
    uint32_t valid0[8];
    char msg[8][DH_ERR_MSG_MAX];
};

static void rec_done(void *arg, const struct ds_done *d)
{
    struct rec *r = arg;

    assert_true(r->n < 8);
    r->last[r->n] = *d;
    if (d->kind == DS_DONE_RESULT) {
        r->results++;
        r->ids0[r->n] = d->res.ids[0];
        r->valid0[r->n] = d->res.valid[0];
    } else {
        r->errors++;
        snprintf(r->msg[r->n], sizeof(r->msg[0]), "%s", d->msg);
    }
    r->n++;
    if (d->job)
        d->job->used = 0; /* what the core does: the job is over */
}

struct rig {
    struct ds_stats st;
    struct ds_env env;
    struct ds_exec *x;
    struct rec rec;
    struct ds_job jobs[4];
};

static void rig_open(struct rig *g)
{
    struct dh_err e;

    memset(g, 0, sizeof(*g));
    g->env = (struct ds_env){.server_id = 7,
                             .ix = ix,
                             .st = &g->st,
                             .alloc_timeout_ms = 5000,
                             .sample_timeout_ms = 30000};
    assert_int_equal(dh_arena_create((size_t)16 << 20, &g->env.arena, &e), 0);
    assert_int_equal(dh__ds_pool_create(&g->env, 2, 8, 4,
                                        (struct ds_sink){rec_done, &g->rec},
                                        &g->x, &e),
                     0);
}

static void rig_close(struct rig *g)
{
    g->x->ops->destroy(g->x);
    for (int i = 0; i < 4; i++)
        free(g->jobs[i].ids); /* the core's table would */
    dh_arena_destroy(g->env.arena);
}

static void job_make(struct ds_job *j, uint32_t step, const uint64_t *ids,
                     uint32_t n)
{
    struct dh_err e;

    memset(j, 0, sizeof(*j));
    assert_int_equal(dh_wire_task_make(&j->task, 0, 0, step, 0, 0, &e), 0);
    j->ids = malloc(n * sizeof(*ids));
    assert_non_null(j->ids);
    memcpy(j->ids, ids, n * sizeof(*ids));
    j->n = n;
    j->plan = fixture_plan();
    j->used = 1;
}

static void wait_for(struct rig *g, int n)
{
    for (int i = 0; i < 3000 && g->rec.n < n; i++) {
        g->x->ops->drain(g->x);
        nanosleep(&(struct timespec){0, 5000000}, NULL);
    }
    assert_int_equal(g->rec.n, n);
}

static void test_result_and_error(void **state)
{
    static const uint64_t good[] = {1, 2}, bad[] = {0, 99};
    struct rig g;
    struct dh_err e;
    struct dh_media_plan p = fixture_plan();
    const struct ds_done *r, *f;

    (void)state;
    rig_open(&g);
    job_make(&g.jobs[0], 1, good, 2);
    job_make(&g.jobs[1], 2, bad, 2);
    assert_int_equal(g.x->ops->submit(g.x, &g.jobs[0], &e), 0);
    assert_int_equal(g.x->ops->submit(g.x, &g.jobs[1], &e), 0);
    assert_int_equal(g.rec.n, 0); /* nothing reported at submit */
    wait_for(&g, 2);
    g.x->ops->drain(g.x);
    assert_int_equal(g.rec.n, 2); /* each job once */
    assert_int_equal(g.rec.results, 1);
    assert_int_equal(g.rec.errors, 1);
    r = g.rec.last[0].kind == DS_DONE_RESULT ? &g.rec.last[0] : &g.rec.last[1];
    f = r == &g.rec.last[0] ? &g.rec.last[1] : &g.rec.last[0];
    assert_ptr_equal(r->job, &g.jobs[0]);
    assert_int_equal(r->task.id, g.jobs[0].task.id);
    assert_int_equal(r->res.ndims, 5);
    assert_int_equal(r->res.dims[0], 2);
    assert_int_equal(r->res.dims[1], 4);
    assert_int_equal(r->res.dims[2], 24);
    assert_int_equal(r->res.dims[3], 32);
    assert_int_equal(r->res.n, 2);
    assert_true(r->res.slot.len >= dh_batch_bytes(&p, 2));
    assert_int_equal(g.rec.ids0[r - g.rec.last], 1);
    assert_true(g.rec.valid0[r - g.rec.last] > 0);
    assert_true(r->latency_ms >= 0);
    assert_ptr_equal(f->job, &g.jobs[1]);
    assert_int_equal(f->sample, 99);
    assert_true(f->code < 0);
    assert_true(f->quarantine);
    dh__ds_release(&g.env, &r->res.slot); /* the core's part */
    rig_close(&g);
}

static void test_destroy_in_flight(void **state)
{
    static const uint64_t ids[] = {0, 1, 2};
    struct rig g;
    struct dh_err e;
    uint64_t queued = 0, busy = 0;

    (void)state;
    rig_open(&g);
    for (int i = 0; i < 4; i++) {
        job_make(&g.jobs[i], (uint32_t)i + 1, ids, 3);
        assert_int_equal(g.x->ops->submit(g.x, &g.jobs[i], &e), 0);
    }
    g.x->ops->load(g.x, &queued, &busy);
    assert_true(queued + busy <= 4);
    assert_int_equal(g.x->ops->pollitems(g.x, NULL, 0), 0);
    assert_null(g.x->ops->links);
    rig_close(&g); /* no report, no leak */
    assert_int_equal(g.rec.n, 0);
}

static int setup(void **state)
{
    (void)state;
    return clip_fixture_setup("ds_exec", 11);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_result_and_error),
        cmocka_unit_test(test_destroy_in_flight),
    };

    return cmocka_run_group_tests(tests, setup, clip_fixture_teardown);
}
