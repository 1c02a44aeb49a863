/* test_rb_link.c - Tier 2's exchange over ZeroMQ (datahelix/rb_link.h):
 * three ranks (threads) exchange uneven, partly empty splits for several
 * rounds and each gets exactly the bytes meant for it, in source order; a
 * peer's message of the next round, arriving while this one still waits
 * for a slow third rank, is kept for that round; a message of the wrong
 * length is DH_EPROTO naming its sender; a rank that never comes is
 * DH_ETIMEOUT naming it, within the timeout; a non-local address is
 * refused (no CURVE on this path). */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#include <cmocka.h>

#include "core/clock.h"
#include "core/le.h"
#include "datahelix/rb_link.h"

#define N 3
#define ROUNDS 5

static const char *const addrs[N] = {"inproc://rb0", "inproc://rb1",
                                     "inproc://rb2"};

struct rank {
    void *ctx;
    uint32_t me;
    pthread_barrier_t *bar;
    int rc, bad;
};

/* Bytes rank s sends rank d in round k: (s * 7 + d * 3 + k) % 5 * 1000,
 * byte i of it = s * 64 + d * 8 + (i + k) % 8 (names its pair). */
static uint64_t size_of(uint32_t s, uint32_t d, uint64_t k)
{
    return s == d ? 0 : (s * 7 + d * 3 + k) % 5 * 1000;
}

static unsigned char byte_of(uint32_t s, uint32_t d, uint64_t k, uint64_t i)
{
    return (unsigned char)(s * 64 + d * 8 + (i + k) % 8);
}

static int one_round(struct dh_rb_link *l, uint32_t me, uint64_t k)
{
    unsigned char send[N * 5000], recv[N * 5000];
    uint64_t ss[N], rs[N], off = 0;
    struct dh_err e = {0};
    int bad = 0;

    for (uint32_t d = 0; d < N; d++) {
        ss[d] = size_of(me, d, k);
        rs[d] = size_of(d, me, k);
        for (uint64_t i = 0; i < ss[d]; i++)
            send[off + i] = byte_of(me, d, k, i);
        off += ss[d];
    }
    if (dh_rb_link_exchange(l, k, send, ss, recv, rs, 10000, &e) != 0) {
        fprintf(stderr, "%s\n", e.msg);
        return -1;
    }
    off = 0;
    for (uint32_t s = 0; s < N; s++) {
        for (uint64_t i = 0; i < rs[s]; i++)
            bad += recv[off + i] != byte_of(s, me, k, i);
        off += rs[s];
    }
    return bad;
}

static void *run_rank(void *arg)
{
    struct rank *r = arg;
    struct dh_rb_link *l = NULL;
    struct dh_err e = {0};

    r->rc = dh_rb_link_create(r->ctx, addrs, N, r->me, &l, &e);
    pthread_barrier_wait(r->bar); /* inproc: every bind before a send */
    for (uint64_t k = 0; r->rc == 0 && k < ROUNDS; k++) {
        int b = one_round(l, r->me, k);

        if (b < 0)
            r->rc = -1;
        else
            r->bad += b;
    }
    dh_rb_link_destroy(l);
    return NULL;
}

static void three_ranks_exchange_rounds(void **state)
{
    void *ctx = zmq_ctx_new();
    pthread_barrier_t bar;
    pthread_t th[N];
    struct rank rk[N];

    (void)state;
    pthread_barrier_init(&bar, NULL, N);
    for (uint32_t i = 0; i < N; i++) {
        rk[i] = (struct rank){ctx, i, &bar, 0, 0};
        assert_int_equal(pthread_create(&th[i], NULL, run_rank, &rk[i]), 0);
    }
    for (uint32_t i = 0; i < N; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(rk[i].rc, 0);
        assert_int_equal(rk[i].bad, 0);
    }
    pthread_barrier_destroy(&bar);
    zmq_ctx_term(ctx);
}

/* A hand-made rank 2: round 0 to rank 0 at once, to rank 1 only once
 * rank 0 has had time to finish round 0 and send rank 1 its round 1. */
static void raw_send(void *push, uint64_t round, uint32_t src, uint64_t len,
                     unsigned char fill)
{
    unsigned char h[20], body[64];
    int ms = 5000; /* a peer gone is a failure here, not a hang */

    zmq_setsockopt(push, ZMQ_SNDTIMEO, &ms, sizeof(ms));
    dh__put_le64(h, round);
    dh__put_le32(h + 8, src);
    dh__put_le64(h + 12, len);
    memset(body, fill, sizeof(body));
    assert_int_equal(zmq_send(push, h, 20, ZMQ_SNDMORE), 20);
    assert_int_equal(zmq_send(push, body, len, 0), (int)len);
}

struct two {
    void *ctx;
    uint32_t me;
    const char *const *a;
    pthread_barrier_t *bar;
    int rc, bad;
};

/* Ranks 0 and 1: 2 rounds, 30 bytes to each other, 20 from rank 2. */
static void *run_two(void *arg)
{
    struct two *r = arg;
    struct dh_rb_link *l = NULL;
    struct dh_err e = {0};
    unsigned char send[30], recv[50];
    uint64_t ss[N] = {30, 30, 0}, rs[N] = {30, 30, 20};

    ss[r->me] = rs[r->me] = 0;
    r->rc = dh_rb_link_create(r->ctx, r->a, N, r->me, &l, &e);
    pthread_barrier_wait(r->bar);
    for (uint64_t k = 0; r->rc == 0 && k < 2; k++) {
        memset(send, (int)(10 * r->me + k), sizeof(send));
        r->rc = dh_rb_link_exchange(l, k, send, ss, recv, rs, 10000, &e);
        for (int i = 0; r->rc == 0 && i < 30; i++) /* from the other */
            r->bad += recv[i] != 10 * (1 - r->me) + k;
        for (int i = 30; r->rc == 0 && i < 50; i++) /* from rank 2 */
            r->bad += recv[i] != 100 + k;
    }
    if (r->rc)
        fprintf(stderr, "%s\n", e.msg);
    dh_rb_link_destroy(l);
    return NULL;
}

static void next_round_message_is_kept(void **state)
{
    const char *const a[N] = {"inproc://a0", "inproc://a1", "inproc://a2"};
    void *ctx = zmq_ctx_new();
    void *pull = zmq_socket(ctx, ZMQ_PULL);
    void *p0 = zmq_socket(ctx, ZMQ_PUSH), *p1 = zmq_socket(ctx, ZMQ_PUSH);
    pthread_barrier_t bar;
    pthread_t th[2];
    struct two rk[2];
    int zero = 0;

    (void)state;
    assert_int_equal(zmq_bind(pull, a[2]), 0);
    pthread_barrier_init(&bar, NULL, 3);
    for (uint32_t i = 0; i < 2; i++) {
        rk[i] = (struct two){ctx, i, a, &bar, 0, 0};
        assert_int_equal(pthread_create(&th[i], NULL, run_two, &rk[i]), 0);
    }
    pthread_barrier_wait(&bar);
    assert_int_equal(zmq_connect(p0, a[0]), 0);
    assert_int_equal(zmq_connect(p1, a[1]), 0);
    raw_send(p0, 0, 2, 20, 100);
    /* let rank 0 finish round 0 and send round 1 to rank 1, which still
     * waits for rank 2's round 0 */
    {
        struct timespec ts = {0, 200 * 1000 * 1000};

        nanosleep(&ts, NULL);
    }
    raw_send(p1, 0, 2, 20, 100);
    raw_send(p0, 1, 2, 20, 101);
    raw_send(p1, 1, 2, 20, 101);
    for (uint32_t i = 0; i < 2; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(rk[i].rc, 0);
        assert_int_equal(rk[i].bad, 0);
    }
    pthread_barrier_destroy(&bar);
    zmq_setsockopt(p0, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_setsockopt(p1, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_setsockopt(pull, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_close(p0);
    zmq_close(p1);
    zmq_close(pull);
    zmq_ctx_term(ctx);
}

static void wrong_length_is_a_protocol_error(void **state)
{
    const char *const a[2] = {"inproc://w0", "inproc://w1"};
    void *ctx = zmq_ctx_new();
    void *push = zmq_socket(ctx, ZMQ_PUSH), *pull = zmq_socket(ctx, ZMQ_PULL);
    struct dh_rb_link *l = NULL;
    struct dh_err e = {0};
    unsigned char buf[16] = {0};
    uint64_t split[2] = {0, 8};
    int zero = 0;

    (void)state;
    assert_int_equal(zmq_bind(pull, a[1]), 0);
    assert_int_equal(dh_rb_link_create(ctx, a, 2, 0, &l, &e), 0);
    assert_int_equal(zmq_connect(push, a[0]), 0);
    raw_send(push, 0, 1, 5, 7); /* 5 bytes where the split says 8 */
    assert_int_equal(
        dh_rb_link_exchange(l, 0, buf, split, buf, split, 5000, &e), DH_EPROTO);
    assert_non_null(strstr(e.msg, "rank 1 sent"));
    dh_rb_link_destroy(l);
    zmq_setsockopt(push, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_setsockopt(pull, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_close(push);
    zmq_close(pull);
    zmq_ctx_term(ctx);
}

static void missing_rank_times_out_naming_it(void **state)
{
    void *ctx = zmq_ctx_new();
    struct dh_rb_link *l = NULL;
    struct dh_err e = {0};
    unsigned char buf[16] = {0};
    uint64_t split[N] = {0, 4, 4};
    const char *const two[N] = {"inproc://m0", "inproc://m1", "inproc://m2"};
    uint64_t t0;

    (void)state;
    /* rank 0 alone: ranks 1 and 2 never bind */
    assert_int_equal(dh_rb_link_create(ctx, two, N, 0, &l, &e), 0);
    t0 = dh__mono_ms();
    assert_int_equal(dh_rb_link_exchange(l, 0, buf, split, buf, split, 300, &e),
                     DH_ETIMEOUT);
    assert_true(dh__mono_ms() - t0 < 300 + 1000);
    assert_non_null(strstr(e.msg, "rank 1"));
    dh_rb_link_destroy(l);
    zmq_ctx_term(ctx);
}

static void non_local_address_refused(void **state)
{
    void *ctx = zmq_ctx_new();
    struct dh_rb_link *l = NULL;
    struct dh_err e = {0};
    const char *const far[2] = {"tcp://127.0.0.1:1", "tcp://10.0.0.2:5555"};

    (void)state;
    assert_int_equal(dh_rb_link_create(ctx, far, 2, 0, &l, &e),
                     DH_EUNSUPPORTED);
    assert_non_null(strstr(e.msg, "10.0.0.2"));
    assert_int_equal(dh_rb_link_create(ctx, far, 2, 2, &l, &e), DH_EINVAL);
    zmq_ctx_term(ctx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(three_ranks_exchange_rounds),
        cmocka_unit_test(next_round_message_is_kept),
        cmocka_unit_test(wrong_length_is_a_protocol_error),
        cmocka_unit_test(missing_rank_times_out_naming_it),
        cmocka_unit_test(non_local_address_refused),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
