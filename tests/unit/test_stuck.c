/* test_stuck.c - a worker blocked in a system call (issue 36 item 4).  The
 * media watchdog is cooperative: a thread asleep in a read that does not
 * return never sees it.  Every read here sleeps 10 s
 * (DATAHELIX_READ_DELAY_MS, set before the first read: it is read once per
 * process) and the job's watchdog is 300 ms: the pool gives the thread up
 * long before its read returns, fails the job with DH_ETIMEOUT naming the
 * sample, starts a replacement, and the old thread releases its slot and
 * leaves when its reads return (the test waits for that: ~20 s). */
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
#include "datahelix/workers.h"

#define NCLIPS 1

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
    return clip_fixture_setup("stuck", 5);
}

static void a_blocked_worker_is_replaced_and_its_sample_failed(void **state)
{
    struct dh_media_plan p;
    struct dh_workers *w = NULL;
    struct dh_workers_stats st;
    struct dh_work_done d;
    struct dh_arena *a;
    struct dh_err e;
    uint64_t ids[1] = {0};
    struct dh_work job = {.task_id = 7,
                          .ids = ids,
                          .n = 1,
                          .plan = &p,
                          .alloc_timeout_ms = 1000,
                          .sample_timeout_ms = 300};
    double t0;
    int rc = DH_ETIMEOUT;

    (void)state;
    dh_media_plan_init(&p);
    p.frames = 2;
    p.width = 32;
    p.height = 24;
    assert_int_equal(dh_arena_create(4u << 20, &a, &e), 0);
    assert_int_equal(dh_workers_create(1, ix, a, 4, &w, &e), 0);
    t0 = now_ms();
    assert_int_equal(dh_workers_submit(w, &job, 1000, &e), 0);
    while (rc == DH_ETIMEOUT && now_ms() - t0 < 9000)
        rc = dh_workers_wait(w, &d, 100);
    assert_int_equal(rc, 0); /* long before the 10 s read returns */
    assert_int_equal(d.task_id, 7);
    assert_int_equal(d.code, DH_ETIMEOUT);
    assert_int_equal(d.failed_at, 0);
    assert_non_null(strstr(d.msg, "blocked in a system call"));
    assert_non_null(strstr(d.msg, "sample 0"));
    dh_work_done_fini(&d);
    dh_workers_stats(w, &st);
    assert_int_equal(st.abandoned, 1);
    assert_int_equal(st.threads, 2); /* the replacement */
    assert_int_equal(st.running, 0);
    assert_int_equal(st.failed, 1);
    {
        /* The old thread releases its slot once its reads return (two of
         * them sleep: ~20 s), then leaves; bounded. */
        struct dh_arena_stats as = {.live_slots = 1};

        while (as.live_slots && now_ms() - t0 < 40000) {
            struct timespec ts = {0, 100000000};

            assert_int_equal(dh_arena_stats(a, &as), 0);
            nanosleep(&ts, NULL);
        }
        assert_int_equal(as.live_slots, 0);
    }
    dh_workers_destroy(w);
    dh_arena_destroy(a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(a_blocked_worker_is_replaced_and_its_sample_failed),
    };

    setenv("DATAHELIX_READ_DELAY_MS", "10000", 1);
    return cmocka_run_group_tests(tests, setup, clip_fixture_teardown);
}
