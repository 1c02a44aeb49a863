/*
 * loop_runner.h - the Coordinator and DataServer event loops on test
 * threads (test_dataserver.c, test_remote.c, test_client.c): start one,
 * stop it within a bound, clocks.  Header-only test code: include it once,
 * after cmocka.h and the coordinator.h / dataserver.h headers.
 */
#ifndef DH_TEST_LOOP_RUNNER_H
#define DH_TEST_LOOP_RUNNER_H

#include <pthread.h>
#include <stdio.h>
#include <time.h>

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

struct runner {
    pthread_t th;
    int started;
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

    /* the name a test counts to see that no loop was left running */
    pthread_setname_np(pthread_self(), "dh-test-loop");
    r->rc = r->c ? dh_coordinator_run(r->c, &r->stop, &e)
                 : dh_dataserver_run(r->s, &r->stop, &e);
    if (r->rc)
        fprintf(stderr, "a %s loop ended with %d: %s\n",
                r->c ? "Coordinator" : "DataServer", r->rc, e.msg);
    __atomic_store_n(&r->finished, 1, __ATOMIC_SEQ_CST);
    return NULL;
}

static void start_runner(struct runner *r)
{
    assert_int_equal(pthread_create(&r->th, NULL, run_thread, r), 0);
    r->started = 1;
}

/* Sets the stop flag and joins the loop if it returns within `ms`: 0
 * (also for a runner never started), or -1 when it did not (it is then
 * left running: its object must not be destroyed). */
static inline int runner_stop(struct runner *r, int ms)
{
    uint64_t end = now_ms() + (uint64_t)ms;

    if (!r->started)
        return 0;
    r->stop = 1;
    while (!__atomic_load_n(&r->finished, __ATOMIC_SEQ_CST) && now_ms() < end)
        sleep_ms(5);
    if (!__atomic_load_n(&r->finished, __ATOMIC_SEQ_CST)) {
        fprintf(stderr, "a loop did not stop within %d ms\n", ms);
        return -1;
    }
    pthread_join(r->th, NULL);
    r->started = 0;
    return 0;
}

/* The loop must stop within 1 s, having returned 0. */
static inline void stop_runner(struct runner *r)
{
    assert_int_equal(runner_stop(r, 1000), 0);
    assert_int_equal(r->rc, 0);
}

#endif
