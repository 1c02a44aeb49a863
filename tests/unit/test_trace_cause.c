/* test_trace_cause.c - a part's timeline and its late cause
 * (core/trace_cause.h, docs/trace.md): a local part's work ends where its
 * server said the batch was ready, less notify; a remote part starts at
 * the request and its unexplained rest is transfer; the longest stage is
 * named with its sample, a task-wide one with the slowest sample; a part
 * without stage times is "unknown" with its whole request-to-arrival. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "core/trace_cause.h"

#define NEAR(a, b) assert_true((a) - (b) < 1e-6 && (b) - (a) < 1e-6)

/* Requested at 1000 ms, in at 1100: 2 samples, the second slow. */
static void local_part(struct dh__tr_part *p, struct dh__tr_sample s[2])
{
    memset(p, 0, sizeof(*p));
    p->present = 1;
    p->n = 2;
    p->sent = 1000;
    p->recv = 1100;
    p->ready = 1098; /* the local server sent the notice */
    p->queue = 4;
    p->alloc = 1;
    p->notify = 3;
    p->collate = 2;
    s[0] = (struct dh__tr_sample){.id = 10, .ms = {1, 10, 2}};
    s[1] = (struct dh__tr_sample){.id = 11, .ms = {2, 60, 5}};
    p->service = 1 + 10 + 2 + 2 + 60 + 5 + 2; /* samples + collate */
}

static void local_timeline(void **state)
{
    struct dh__tr_part p;
    struct dh__tr_sample s[2];
    struct dh__tr_view v;

    (void)state;
    local_part(&p, s);
    dh__tr_place(&p, s, &v);
    NEAR(v.work_end, 1098 - 3);             /* ready less notify */
    NEAR(v.work_start, 1095 - (1 + 82));    /* slot wait + service */
    NEAR(v.route, v.work_start - 4 - 1000); /* request to queue */
    NEAR(v.transfer, 2);                    /* notice to arrival */
    assert_int_equal(v.slowest, 1);
    NEAR(v.slowest_ms, 67);
}

static void longest_is_a_samples_stage(void **state)
{
    struct dh__tr_part p;
    struct dh__tr_sample s[2];
    struct dh__tr_view v;
    uint32_t pos = 99;
    double ms = 0;

    (void)state;
    local_part(&p, s);
    dh__tr_place(&p, s, &v);
    assert_string_equal(dh__tr_longest(&p, s, &v, &ms, &pos), "decode");
    assert_int_equal(pos, 1);
    NEAR(ms, 60);
    /* the queue growing past it takes over, naming the slowest sample */
    p.queue = 75;
    dh__tr_place(&p, s, &v);
    assert_string_equal(dh__tr_longest(&p, s, &v, &ms, &pos), "queue");
    assert_int_equal(pos, 1);
    NEAR(ms, 75);
    /* a slow first sample's scale */
    p.queue = 4;
    s[0].ms[2] = 90;
    assert_string_equal(dh__tr_longest(&p, s, &v, &ms, &pos), "scale");
    assert_int_equal(pos, 0);
}

static void remote_is_left_aligned_and_its_rest_transfer(void **state)
{
    struct dh__tr_part p;
    struct dh__tr_sample s[2];
    struct dh__tr_view v;
    uint32_t pos;
    double ms;

    (void)state;
    local_part(&p, s);
    p.remote = 1;
    p.place = 5;
    p.recv = 1300;
    p.ready = 1299;
    dh__tr_place(&p, s, &v);
    NEAR(v.work_start, 1000 + 4);
    NEAR(v.work_end, 1004 + 1 + 82);
    NEAR(v.transfer, 1299 - 3 - 5 - 1087);
    NEAR(v.route, 0);
    assert_string_equal(dh__tr_longest(&p, s, &v, &ms, &pos), "transfer");
    NEAR(ms, 204);
}

static void gaps_never_go_negative_and_ready_is_bounded(void **state)
{
    struct dh__tr_part p;
    struct dh__tr_sample s[2];
    struct dh__tr_view v;

    (void)state;
    local_part(&p, s);
    p.queue = 500;  /* more than request-to-arrival: clocks disagree */
    p.ready = 5000; /* after the arrival: not believed */
    dh__tr_place(&p, s, &v);
    NEAR(v.ready, p.recv);
    NEAR(v.route, 0);
    NEAR(v.transfer, 0);
    p.ready = 0; /* unknown: the arrival stands in */
    dh__tr_place(&p, s, &v);
    NEAR(v.ready, p.recv);
}

static void without_stage_times_it_is_unknown(void **state)
{
    struct dh__tr_part p;
    struct dh__tr_view v;
    uint32_t pos;
    double ms;

    (void)state;
    memset(&p, 0, sizeof(p));
    p.sent = 10;
    p.recv = 250;
    dh__tr_place(&p, NULL, &v);
    assert_string_equal(dh__tr_longest(&p, NULL, &v, &ms, &pos), "unknown");
    NEAR(ms, 240);
    assert_int_equal(pos, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(local_timeline),
        cmocka_unit_test(longest_is_a_samples_stage),
        cmocka_unit_test(remote_is_left_aligned_and_its_rest_transfer),
        cmocka_unit_test(gaps_never_go_negative_and_ready_is_bounded),
        cmocka_unit_test(without_stage_times_it_is_unknown),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
