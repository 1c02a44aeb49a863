/* test_workers.c - the DataServer worker pool: every job completes once with
 * the bytes an inline decode gives, errors name the sample and free the
 * slot, a held arena gives "arena exhausted" instead of a hang, a full queue
 * times submit out, destroy with queued jobs is prompt and leak-free, and
 * the completion descriptor is readable exactly while completions wait. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <time.h>

#include <cmocka.h>

#include "core/alloc.h"
#include "datahelix/batch.h"
#include "datahelix/gendata.h"
#include "datahelix/index.h"
#include "datahelix/workers.h"

#define NCLIPS 3

#include "clip_fixture.h"

static double now_ms(void)
{
    struct timespec t;

    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static int setup(void **state)
{
    (void)state;
    return clip_fixture_setup("workers", 5);
}

static struct dh_media_plan small_plan(void)
{
    struct dh_media_plan p;

    dh_media_plan_init(&p);
    p.kind = DH_PLAN_JITTER; /* bytes depend on (seed, epoch, id) */
    p.geometry = DH_GEOM_RANDOM_CROP;
    p.frames = 4;
    p.width = 32;
    p.height = 24;
    return p;
}

static struct dh_work job_of(uint64_t task, uint64_t epoch, const uint64_t *ids,
                             uint32_t n, const struct dh_media_plan *p,
                             int alloc_ms)
{
    struct dh_work j = {task, epoch, ids, n, p, alloc_ms};
    return j;
}

static void assert_live_slots(struct dh_arena *a, uint32_t want)
{
    struct dh_arena_stats st;

    assert_int_equal(dh_arena_stats(a, &st), 0);
    assert_int_equal(st.live_slots, want);
}

#define NJOBS 20

static void all_jobs_complete_with_inline_bytes(void **state)
{
    struct dh_media_plan p = small_plan();
    uint64_t ids[NJOBS][3];
    int seen[NJOBS] = {0};
    size_t bytes = dh_batch_bytes(&p, 3);
    struct dh_workers_stats ws;
    struct dh_workers *w;
    struct dh_arena *a;
    struct dh_media *m;
    struct dh_err e;
    uint8_t *ref = malloc(bytes + DH_MEDIA_DST_PAD);

    (void)state;
    assert_non_null(ref);
    assert_int_equal(dh_arena_create(4u << 20, &a, &e), 0);
    assert_int_equal(dh_media_create(&m, &e), 0);
    if (dh_workers_create(2, ix, a, 4, &w, &e))
        fail_msg("create: %s", e.msg);
    for (int i = 0; i < NJOBS; i++) {
        struct dh_work j;

        for (int k = 0; k < 3; k++)
            ids[i][k] = (uint64_t)(i + k) % NCLIPS;
        j = job_of(1000 + i, (uint64_t)i, ids[i], 3, &p, 5000);
        if (dh_workers_submit(w, &j, 10000, &e))
            fail_msg("submit %d: %s", i, e.msg);
    }
    for (int c = 0; c < NJOBS; c++) {
        struct dh_work_done d;
        int32_t valid[3];
        int i;
        uint8_t *got;

        assert_int_equal(dh_workers_wait(w, &d, 20000), 0);
        if (d.code)
            fail_msg("%s", d.msg);
        i = (int)(d.task_id - 1000);
        assert_true(i >= 0 && i < NJOBS && !seen[i]);
        seen[i] = 1;
        assert_int_equal(d.slot.len, bytes + DH_MEDIA_DST_PAD);
        assert_int_equal(d.n, 3);
        got = dh_arena_ptr(a, &d.slot);
        assert_non_null(got);
        if (dh_batch_decode(m, ix, (uint64_t)i, ids[i], 3, &p, ref,
                            bytes + DH_MEDIA_DST_PAD, valid, NULL, &e))
            fail_msg("inline: %s", e.msg);
        assert_memory_equal(got, ref, bytes);
        assert_memory_equal(d.valid_frames, valid, sizeof(valid));
        assert_true(d.decode_ms >= 0);
        assert_int_equal(dh_arena_release(a, &d.slot, &e), 0);
        dh_work_done_fini(&d);
    }
    struct dh_work_done none;
    assert_int_equal(dh_workers_wait(w, &none, 0), DH_ETIMEOUT);
    dh_workers_stats(w, &ws);
    assert_int_equal(ws.done, NJOBS);
    assert_int_equal(ws.failed, 0);
    assert_int_equal(ws.queued + ws.running + ws.pending, 0);
    dh_workers_destroy(w);
    assert_live_slots(a, 0);
    dh_media_destroy(m);
    dh_arena_destroy(a);
    free(ref);
}

static void error_names_sample_and_frees_slot(void **state)
{
    struct dh_media_plan p = small_plan();
    uint64_t good[2] = {0, 1}, bad[3] = {1, NCLIPS, 0};
    struct dh_work_done d[3];
    struct dh_workers_stats ws;
    struct dh_workers *w;
    struct dh_arena *a;
    struct dh_err e;
    char want[700];
    int nbad = 0;

    (void)state;
    assert_int_equal(dh_arena_create(1u << 20, &a, &e), 0);
    assert_int_equal(dh_workers_create(2, ix, a, 4, &w, &e), 0);
    struct dh_work jobs[3] = {job_of(1, 0, good, 2, &p, 1000),
                              job_of(2, 0, bad, 3, &p, 1000),
                              job_of(3, 0, good, 2, &p, 1000)};
    for (int i = 0; i < 3; i++)
        assert_int_equal(dh_workers_submit(w, &jobs[i], 5000, &e), 0);
    snprintf(want, sizeof(want), "sample %d (%s): ", NCLIPS, paths[NCLIPS]);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(dh_workers_wait(w, &d[i], 20000), 0);
        if (d[i].task_id != 2) {
            assert_int_equal(d[i].code, 0);
            continue;
        }
        nbad++;
        assert_int_not_equal(d[i].code, 0);
        if (!strstr(d[i].msg, want))
            fail_msg("message lacks '%s': %s", want, d[i].msg);
        assert_non_null(strstr(d[i].msg, "task 2"));
        assert_int_equal(d[i].failed_at, 1);
        assert_int_equal(d[i].slot.len, 0);
    }
    assert_int_equal(nbad, 1);
    assert_live_slots(a, 2); /* the good ones only */
    for (int i = 0; i < 3; i++) {
        if (!d[i].code)
            assert_int_equal(dh_arena_release(a, &d[i].slot, &e), 0);
        dh_work_done_fini(&d[i]);
    }
    assert_live_slots(a, 0);
    dh_workers_stats(w, &ws);
    assert_int_equal(ws.done, 2);
    assert_int_equal(ws.failed, 1);
    dh_workers_destroy(w);
    dh_arena_destroy(a);
}

static void bad_jobs_are_refused(void **state)
{
    struct dh_media_plan p = small_plan(), q;
    int64_t idx[4] = {0, 1, 2, 3};
    uint64_t ids[1] = {0};
    struct dh_workers *w;
    struct dh_arena *a;
    struct dh_err e;
    struct dh_work j;

    (void)state;
    assert_int_equal(dh_arena_create(1u << 20, &a, &e), 0);
    assert_int_equal(dh_workers_create(0, ix, a, 4, &w, &e), DH_EINVAL);
    assert_int_equal(dh_workers_create(1, ix, a, 0, &w, &e), DH_EINVAL);
    assert_int_equal(dh_workers_create(1, ix, a, 4, &w, &e), 0);
    q = p;
    q.kind = DH_PLAN_INDICES;
    q.indices = idx;
    j = job_of(1, 0, ids, 1, &q, 100);
    assert_int_equal(dh_workers_submit(w, &j, 0, &e), DH_EINVAL);
    assert_non_null(strstr(e.msg, "not supported"));
    j = job_of(1, 0, ids, 0, &p, 100);
    assert_int_equal(dh_workers_submit(w, &j, 0, &e), DH_EINVAL);
    j = job_of(1, 0, ids, 1, &p, -1);
    assert_int_equal(dh_workers_submit(w, &j, 0, &e), DH_EINVAL);
    dh_workers_destroy(w);
    dh_workers_destroy(NULL);
    dh_arena_destroy(a);
}

/* An arena with room for 2 batches, both held: the third job fails with the
 * arena's timeout rather than hanging. */
static void held_arena_gives_exhausted_not_hang(void **state)
{
    struct dh_media_plan p = small_plan();
    uint64_t ids[1] = {2};
    size_t slot = dh_batch_bytes(&p, 1) + DH_MEDIA_DST_PAD;
    struct dh_work_done d[3];
    struct dh_workers *w;
    struct dh_arena *a;
    struct dh_err e;
    int ok = 0, timedout = 0;
    double t0;

    (void)state;
    slot = (slot + DH_ARENA_ALIGN - 1) / DH_ARENA_ALIGN * DH_ARENA_ALIGN;
    assert_int_equal(dh_arena_create(2 * slot, &a, &e), 0);
    {
        struct dh_arena_stats st;
        assert_int_equal(dh_arena_stats(a, &st), 0);
        assert_true(st.capacity >= 2 * slot && st.capacity < 3 * slot);
    }
    assert_int_equal(dh_workers_create(2, ix, a, 4, &w, &e), 0);
    t0 = now_ms();
    for (int i = 0; i < 3; i++) {
        struct dh_work j = job_of((uint64_t)i, 0, ids, 1, &p, 300);
        assert_int_equal(dh_workers_submit(w, &j, 5000, &e), 0);
    }
    for (int i = 0; i < 3; i++) {
        assert_int_equal(dh_workers_wait(w, &d[i], 20000), 0);
        if (!d[i].code) {
            ok++;
            continue;
        }
        timedout++;
        assert_int_equal(d[i].code, DH_EARENA);
        if (!strstr(d[i].msg, "arena exhausted"))
            fail_msg("not an arena message: %s", d[i].msg);
        assert_int_equal(d[i].failed_at, DH_WORK_NO_SAMPLE);
    }
    assert_true(now_ms() - t0 < 15000);
    assert_int_equal(ok, 2);
    assert_int_equal(timedout, 1);
    for (int i = 0; i < 3; i++) {
        if (!d[i].code)
            assert_int_equal(dh_arena_release(a, &d[i].slot, &e), 0);
        dh_work_done_fini(&d[i]);
    }
    assert_live_slots(a, 0);
    dh_workers_destroy(w);
    dh_arena_destroy(a);
}

/* Queue of 1, one thread busy with a slow job, one job queued: the next
 * submit times out; destroy then drops the queued job promptly. */
#define SLOW_N 64

static void full_queue_times_out_and_destroy_is_prompt(void **state)
{
    struct dh_media_plan p = small_plan();
    uint64_t slow[SLOW_N], one[1] = {1};
    struct dh_workers_stats ws;
    struct dh_workers *w;
    struct dh_arena *a;
    struct dh_err e;
    struct dh_work j;
    double t0, dt;

    (void)state;
    for (int i = 0; i < SLOW_N; i++)
        slow[i] = (uint64_t)i % NCLIPS;
    assert_int_equal(dh_arena_create(4u << 20, &a, &e), 0);
    assert_int_equal(dh_workers_create(1, ix, a, 1, &w, &e), 0);
    j = job_of(1, 0, slow, SLOW_N, &p, 1000);
    assert_int_equal(dh_workers_submit(w, &j, 5000, &e), 0);
    j = job_of(2, 0, one, 1, &p, 1000);
    assert_int_equal(dh_workers_submit(w, &j, 5000, &e), 0); /* waits for
                                                      the worker to pop #1 */
    j = job_of(3, 0, one, 1, &p, 1000);
    t0 = now_ms();
    assert_int_equal(dh_workers_submit(w, &j, 50, &e), DH_ETIMEOUT);
    dt = now_ms() - t0;
    assert_true(dt >= 45 && dt < 2000);
    assert_non_null(strstr(e.msg, "queue full"));
    assert_int_equal(dh_workers_submit(w, &j, 0, &e), DH_ETIMEOUT);
    dh_workers_stats(w, &ws);
    assert_int_equal(ws.queued, 1);
    t0 = now_ms();
    dh_workers_destroy(w); /* #1 finishes, #2 is dropped; ASan: no leak */
    assert_true(now_ms() - t0 < 5000);
    assert_live_slots(a, 0); /* #1's uncollected slot was released */
    dh_arena_destroy(a);
}

/* Destroy drops queued jobs: it takes about one job's time, not the ~20
 * jobs' time that draining the queue would take. */
static void destroy_with_many_queued_is_prompt(void **state)
{
    struct dh_media_plan p = small_plan();
    uint64_t ids[SLOW_N];
    struct dh_work_done d;
    struct dh_workers *w;
    struct dh_arena *a;
    struct dh_err e;
    struct dh_work j;
    double t0, one, dt;

    (void)state;
    for (int i = 0; i < SLOW_N; i++)
        ids[i] = (uint64_t)i % NCLIPS;
    assert_int_equal(dh_arena_create(4u << 20, &a, &e), 0);
    assert_int_equal(dh_workers_create(2, ix, a, 64, &w, &e), 0);
    j = job_of(0, 0, ids, SLOW_N, &p, 1000);
    t0 = now_ms();
    assert_int_equal(dh_workers_submit(w, &j, 0, &e), 0);
    assert_int_equal(dh_workers_wait(w, &d, 20000), 0);
    one = now_ms() - t0; /* one slow job, end to end */
    assert_int_equal(dh_arena_release(a, &d.slot, &e), 0);
    dh_work_done_fini(&d);
    for (int i = 1; i <= 40; i++) {
        j = job_of((uint64_t)i, 0, ids, SLOW_N, &p, 1000);
        assert_int_equal(dh_workers_submit(w, &j, 0, &e), 0);
    }
    t0 = now_ms();
    dh_workers_destroy(w);
    dt = now_ms() - t0;
    if (dt > 5000 || dt > 6 * one + 500)
        fail_msg("destroy took %.0f ms (one job: %.0f ms)", dt, one);
    assert_live_slots(a, 0);
    dh_arena_destroy(a);
}

/* Runs `jobs` jobs of n samples each through w, one at a time, and
 * returns the library allocations they made (dh__alloc_count()). */
static long allocs_for(struct dh_workers *w, struct dh_arena *a,
                       const struct dh_media_plan *p, uint32_t n, int jobs)
{
    uint64_t ids[3] = {0, 1, 2};
    struct dh_err e;
    long count;

    dh__alloc_fail_after(1L << 40); /* counts; never fails */
    for (int i = 0; i < jobs; i++) {
        struct dh_work j = job_of(50 + (uint64_t)i, 0, ids, n, p, 5000);
        struct dh_work_done d;

        if (dh_workers_submit(w, &j, 10000, &e))
            fail_msg("submit: %s", e.msg);
        assert_int_equal(dh_workers_wait(w, &d, 20000), 0);
        if (d.code)
            fail_msg("%s", d.msg);
        assert_int_equal(dh_arena_release(a, &d.slot, &e), 0);
        dh_work_done_fini(&d);
    }
    count = dh__alloc_count();
    dh__alloc_fail_reset();
    assert_int_equal(dh__alloc_failures(), 0);
    return count;
}

/* Steady state (issue 21 item 2): a job's allocations are the job's own
 * (its node and arrays, a fixed number), none per sample: jobs of 3
 * samples allocate exactly what jobs of 1 do, the same every round. */
static void no_allocation_per_sample(void **state)
{
    struct dh_media_plan p = small_plan();
    struct dh_workers *w;
    struct dh_arena *a;
    struct dh_err e;
    long one, three, again;

    (void)state;
    assert_int_equal(dh_arena_create(4u << 20, &a, &e), 0);
    if (dh_workers_create(1, ix, a, 4, &w, &e))
        fail_msg("create: %s", e.msg);
    (void)allocs_for(w, a, &p, 3, 2); /* warm: tables grown, scaler made */
    one = allocs_for(w, a, &p, 1, 4);
    three = allocs_for(w, a, &p, 3, 4);
    again = allocs_for(w, a, &p, 1, 4);
    fprintf(stderr, "allocations per job: %ld (1 sample), %ld (3)\n", one / 4,
            three / 4);
    assert_true(one > 0 && one % 4 == 0);
    assert_int_equal(three, one);
    assert_int_equal(again, one);
    dh_workers_destroy(w);
    dh_arena_destroy(a);
}

static int fd_readable(int fd, int ms)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};

    return poll(&p, 1, ms) == 1 && (p.revents & POLLIN);
}

/* dh_workers_fd(): quiet while nothing completed, readable once a
 * completion is posted (a poll on it wakes, no period to wait out), still
 * readable while one of two is left, quiet again once the last is taken. */
static void completion_fd_wakes_and_resets(void **state)
{
    struct dh_media_plan p = small_plan();
    uint64_t ids[2] = {0, 1};
    struct dh_work_done d;
    struct dh_workers *w;
    struct dh_arena *a;
    struct dh_err e;
    int fd;

    (void)state;
    assert_int_equal(dh_arena_create(4u << 20, &a, &e), 0);
    if (dh_workers_create(1, ix, a, 4, &w, &e))
        fail_msg("create: %s", e.msg);
    fd = dh_workers_fd(w);
    assert_true(fd >= 0);
    assert_false(fd_readable(fd, 0));
    for (uint32_t i = 0; i < 2; i++) {
        struct dh_work j = job_of(1 + i, 0, &ids[i], 1, &p, 5000);

        if (dh_workers_submit(w, &j, 10000, &e))
            fail_msg("submit: %s", e.msg);
    }
    assert_true(fd_readable(fd, 20000)); /* the first completion */
    {
        struct dh_workers_stats ws;
        double end = now_ms() + 20000;

        do /* both in: the one thread ran them in turn */
            dh_workers_stats(w, &ws);
        while (ws.pending < 2 && now_ms() < end);
        assert_int_equal(ws.pending, 2);
    }
    assert_int_equal(dh_workers_wait(w, &d, 0), 0);
    assert_int_equal(dh_arena_release(a, &d.slot, &e), 0);
    dh_work_done_fini(&d);
    assert_true(fd_readable(fd, 0)); /* one still waits */
    assert_int_equal(dh_workers_wait(w, &d, 0), 0);
    assert_int_equal(dh_arena_release(a, &d.slot, &e), 0);
    dh_work_done_fini(&d);
    assert_false(fd_readable(fd, 0)); /* reset with the last */
    assert_int_equal(dh_workers_wait(w, &d, 0), DH_ETIMEOUT);
    dh_workers_destroy(w);
    dh_arena_destroy(a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(all_jobs_complete_with_inline_bytes),
        cmocka_unit_test(error_names_sample_and_frees_slot),
        cmocka_unit_test(bad_jobs_are_refused),
        cmocka_unit_test(held_arena_gives_exhausted_not_hang),
        cmocka_unit_test(full_queue_times_out_and_destroy_is_prompt),
        cmocka_unit_test(destroy_with_many_queued_is_prompt),
        cmocka_unit_test(completion_fd_wakes_and_resets),
        cmocka_unit_test(no_allocation_per_sample),
    };
    return cmocka_run_group_tests(tests, setup, clip_fixture_teardown);
}
