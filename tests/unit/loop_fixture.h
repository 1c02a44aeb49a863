/*
 * loop_fixture.h - what the tests that run real Coordinator and DataServer
 * loops on threads and speak the wire codec share (test_dataserver.c,
 * test_remote.c): the clip set of clip_fixture.h without the truncated
 * clip, the runners of loop_runner.h, a DEALER peer, a request filler and
 * WAIT_STAT (a server counter, awaited).
 * Header-only test code: define NCLIPS, then include it once (after
 * cmocka.h and zmq.h).
 */
#ifndef DH_TEST_LOOP_FIXTURE_H
#define DH_TEST_LOOP_FIXTURE_H

#include "clip_fixture.h"
#include "loop_runner.h"

/* NCLIPS small S clips from gen-data in $DH_TEST_TMP/sub, indexed as
 * ids 0..NCLIPS-1 into `dhx` and opened as `ix`. */
static int loop_fixture_setup(const char *sub, uint64_t seed)
{
    return clip_fixture_build(sub, seed, 0);
}

/* Counters move on the server's thread a moment after the message they
 * count is sent: poll up to the test's WAIT_MS, then assert. */
#define WAIT_STAT(s, field, want)                                              \
    do {                                                                       \
        struct dh_dataserver_stats st_;                                        \
        uint64_t end_ = now_ms() + WAIT_MS;                                    \
        do {                                                                   \
            dh_dataserver_stats((s), &st_);                                    \
            if (st_.field == (uint64_t)(want))                                 \
                break;                                                         \
            sleep_ms(5);                                                       \
        } while (now_ms() < end_);                                             \
        assert_int_equal(st_.field, (want));                                   \
    } while (0)

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
    struct dh_media_plan p = fixture_plan();
    struct dh_err e;

    assert_int_equal(dh_wire_task_make(&rq->task, 0, 0, step, 0, 0, &e), 0);
    rq->requester_rank = 0;
    assert_int_equal(dh_wire_set_samples(rq, ids, n, &e), 0);
    assert_int_equal(dh_wire_plan_from_media(&rq->plan, &p, &e), 0);
    rq->slack_ms = 1000;
}

#endif
