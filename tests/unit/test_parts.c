/* test_parts.c - striped payloads (src/runtime/transport.h "Striped
 * payloads", transport_parts.c, docs/wire-protocol.md "Payload parts"):
 *   - the cut: parts cover the payload exactly, in order, sizes within one
 *     byte; when a payload is cut at all; bad cuts refused;
 *   - the part frame: round trip, an envelope is not a part frame, a
 *     malformed one is a protocol error;
 *   - reassembly: parts in order and out of order give the payload's
 *     frames in index order; two payloads interleaved; a duplicate part,
 *     a part of the wrong size, count or header drop the set; a part from
 *     another sender is refused alone while the genuine set completes; the
 *     caps on sets and bytes; a set missing a part expires after exactly
 *     its timeout, never before;
 *   - the sender's link over real sockets: a large payload goes as one
 *     part per socket (each on its own connection), reassembles to the
 *     same bytes, and its buffer is freed exactly once; small ones go
 *     whole, each on the next connection in turn; nothing is sent (and
 *     nothing freed) while a socket of the link is not connected.
 * Every wait has a timeout. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>
#include <zmq.h>

#include "runtime/transport.h"

#define WAIT_MS 5000
#define TIMEOUT_MS 1000
#define HOST_A "10.0.0.1"
#define HOST_B "10.0.0.2"

static uint64_t now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* ---- the cut and the part frame ---- */

static void cut_covers_the_payload(void **state)
{
    static const uint64_t lengths[] = {2, 3, 4097, 1u << 20, (1u << 20) + 7};
    uint64_t off, len;

    (void)state;
    for (size_t k = 0; k < sizeof(lengths) / sizeof(lengths[0]); k++)
        for (uint32_t count = 1; count <= DH_TP_MAX_PARTS; count++) {
            uint64_t next = 0, lo = UINT64_MAX, hi = 0;

            if (count > lengths[k])
                break;
            for (uint32_t i = 0; i < count; i++) {
                assert_int_equal(
                    dh__tp_part_span(lengths[k], count, i, &off, &len), 0);
                assert_int_equal(off, next); /* contiguous, in order */
                assert_true(len >= 1);
                next = off + len;
                lo = len < lo ? len : lo;
                hi = len > hi ? len : hi;
            }
            assert_int_equal(next, lengths[k]);
            assert_true(hi - lo <= 1);
        }
    assert_int_equal(dh__tp_part_span(3, 4, 0, &off, &len), DH_EINVAL);
    assert_int_equal(dh__tp_part_span(100, 2, 2, &off, &len), DH_EINVAL);
    assert_int_equal(dh__tp_part_span(100, 0, 0, &off, &len), DH_EINVAL);
    assert_int_equal(dh__tp_part_span(1000, DH_TP_MAX_PARTS + 1, 0, &off, &len),
                     DH_EINVAL);
    /* Small payloads and one-stripe links go whole. */
    assert_int_equal(dh__tp_part_count(DH_TP_STRIPE_MIN - 1, 4), 1);
    assert_int_equal(dh__tp_part_count(DH_TP_STRIPE_MIN, 4), 4);
    assert_int_equal(dh__tp_part_count(1u << 30, 1), 1);
    assert_int_equal(dh__tp_stripes(3), 3);
    assert_true(dh__tp_stripes(0) >= 1 &&
                dh__tp_stripes(0) <= DH_TP_MAX_STRIPES);
}

static void part_frame_round_trip(void **state)
{
    uint8_t pf[DH_TP_PART_HDR];
    uint8_t envelope[DH_TP_PART_HDR] = {0x08, 0x01};
    uint32_t index = 0, count = 0;
    struct dh_err e;

    (void)state;
    dh__tp_part_encode(pf, 5, 7);
    assert_int_equal(dh__tp_part_decode(pf, sizeof(pf), &index, &count, &e), 1);
    assert_int_equal(index, 5);
    assert_int_equal(count, 7);
    /* An envelope (version field first) is no part frame. */
    assert_int_equal(
        dh__tp_part_decode(envelope, sizeof(envelope), &index, &count, &e), 0);
    /* Starts like one, but is not version 1's 16 bytes. */
    assert_int_equal(dh__tp_part_decode(pf, sizeof(pf) - 1, &index, &count, &e),
                     DH_EPROTO);
    pf[4] = 2;
    assert_int_equal(dh__tp_part_decode(pf, sizeof(pf), &index, &count, &e),
                     DH_EPROTO);
    assert_non_null(strstr(e.msg, "version 1"));
}

/* ---- reassembly ---- */

#define TASK 77
#define SERVER 9
#define LENGTH 1003 /* not a multiple of the count */
#define COUNT 4

static uint8_t payload[LENGTH];

static void fill_payload(void)
{
    for (size_t i = 0; i < LENGTH; i++)
        payload[i] = (uint8_t)(i * 31 + 7);
}

struct fx {
    struct dh_tp_asm *a;
    zmq_msg_t out[DH_TP_MAX_PARTS + 1];
    int n_out;
    struct dh_err e;
};

static struct dh_tp_asm *make_asm(unsigned sets, uint64_t bytes)
{
    struct dh_tp_asm *a = NULL;
    struct dh_err e;

    assert_int_equal(
        dh__tp_asm_create(&(struct dh_tp_asm_opts){.max_sets = sets,
                                                   .max_bytes = bytes,
                                                   .timeout_ms = TIMEOUT_MS},
                          &a, &e),
        0);
    return a;
}

static int fx_setup(void **state)
{
    struct fx *f = calloc(1, sizeof(*f));

    if (!f)
        return -1;
    fill_payload();
    f->a = make_asm(4, 1u << 20);
    *state = f;
    return 0;
}

static int fx_teardown(void **state)
{
    struct fx *f = *state;

    dh__tp_asm_destroy(f->a);
    free(f);
    return 0;
}

/* Offers part `index` of `count` of task `task` (data: its cut of
 * `payload`, `delta` bytes more or fewer; header: "hdr-<task>" plus
 * `hdr_tag`) from server/host at time `now`.  Returns dh__tp_asm_add's. */
static int offer_ex(struct fx *f, uint64_t task, uint32_t server,
                    const char *host, uint32_t index, uint32_t count, int delta,
                    char hdr_tag, uint64_t now)
{
    char hdr[32];
    uint64_t off = 0, len = 0;
    zmq_msg_t h, d;
    int rc;

    snprintf(hdr, sizeof(hdr), "hdr-%llu%c", (unsigned long long)task, hdr_tag);
    if (dh__tp_part_span(LENGTH, count, index, &off, &len) < 0)
        off = 0, len = 10;
    len = (uint64_t)((int64_t)len + delta);
    zmq_msg_init_size(&h, strlen(hdr));
    memcpy(zmq_msg_data(&h), hdr, strlen(hdr));
    zmq_msg_init_size(&d, len);
    memcpy(zmq_msg_data(&d), payload + off, len);
    dh_err_clear(&f->e);
    rc = dh__tp_asm_add(f->a,
                        &(struct dh_tp_part){.task = task,
                                             .server = server,
                                             .host = host,
                                             .index = index,
                                             .count = count,
                                             .length = LENGTH,
                                             .hdr = &h,
                                             .data = &d},
                        now, f->out, &f->n_out, &f->e);
    zmq_msg_close(&h); /* the caller closes both, whatever came back */
    zmq_msg_close(&d);
    return rc;
}

static int offer(struct fx *f, uint64_t task, uint32_t index, uint64_t now)
{
    return offer_ex(f, task, SERVER, HOST_A, index, COUNT, 0, 0, now);
}

/* The completed set in f->out is the payload: header, data in order. */
static void expect_whole(struct fx *f, uint64_t task)
{
    char hdr[32];
    size_t off = 0;

    snprintf(hdr, sizeof(hdr), "hdr-%llu", (unsigned long long)task);
    assert_int_equal(f->n_out, COUNT + 1);
    assert_int_equal(zmq_msg_size(&f->out[0]), strlen(hdr));
    assert_memory_equal(zmq_msg_data(&f->out[0]), hdr, strlen(hdr));
    for (int i = 1; i < f->n_out; i++) {
        size_t n = zmq_msg_size(&f->out[i]);

        assert_true(off + n <= LENGTH);
        assert_memory_equal(zmq_msg_data(&f->out[i]), payload + off, n);
        off += n;
        zmq_msg_close(&f->out[i]);
    }
    zmq_msg_close(&f->out[0]);
    assert_int_equal(off, LENGTH);
}

static void reassembles_in_order(void **state)
{
    struct fx *f = *state;

    for (uint32_t i = 0; i + 1 < COUNT; i++) {
        assert_int_equal(offer(f, TASK, i, 0), 0);
        assert_int_equal(dh__tp_asm_open(f->a), 1);
    }
    assert_int_equal(offer(f, TASK, COUNT - 1, 0), 1);
    expect_whole(f, TASK);
    assert_int_equal(dh__tp_asm_open(f->a), 0);
}

static void reassembles_out_of_order(void **state)
{
    static const uint32_t order[COUNT] = {3, 1, 0, 2};
    struct fx *f = *state;

    for (int i = 0; i < COUNT; i++)
        assert_int_equal(offer(f, TASK, order[i], 0), i + 1 == COUNT);
    expect_whole(f, TASK);
    /* Two payloads interleaved, each whole and in order. */
    for (uint32_t i = 0; i + 1 < COUNT; i++) {
        assert_int_equal(offer(f, TASK + 1, COUNT - 1 - i, 0), 0);
        assert_int_equal(offer(f, TASK + 2, i, 0), 0);
    }
    assert_int_equal(dh__tp_asm_open(f->a), 2);
    assert_int_equal(offer(f, TASK + 2, COUNT - 1, 0), 1);
    expect_whole(f, TASK + 2);
    assert_int_equal(offer(f, TASK + 1, 0, 0), 1);
    expect_whole(f, TASK + 1);
}

static void duplicate_part_drops_the_set(void **state)
{
    struct fx *f = *state;

    assert_int_equal(offer(f, TASK, 0, 0), 0);
    assert_int_equal(offer(f, TASK, 1, 0), 0);
    assert_int_equal(offer(f, TASK, 1, 0), DH_EPROTO);
    assert_non_null(strstr(f->e.msg, "part 1 of 4 came twice"));
    assert_non_null(strstr(f->e.msg, "dropped"));
    assert_int_equal(dh__tp_asm_open(f->a), 0);
    /* What is left of it cannot complete a payload any more. */
    assert_int_equal(offer(f, TASK, 2, 0), 0);
    assert_int_equal(offer(f, TASK, 3, 0), 0);
    assert_int_equal(dh__tp_asm_open(f->a), 1);
}

static void missing_part_times_out(void **state)
{
    struct fx *f = *state;
    uint64_t t0 = 1000;

    assert_int_equal(offer(f, TASK, 0, t0), 0);
    assert_int_equal(offer(f, TASK, 2, t0 + 400), 0);
    assert_int_equal(offer(f, TASK, 3, t0 + 500), 0);
    /* The timeout runs from the last part that came. */
    assert_int_equal(dh__tp_asm_expire(f->a, t0 + 500 + TIMEOUT_MS - 1, &f->e),
                     0);
    assert_int_equal(dh__tp_asm_open(f->a), 1);
    assert_int_equal(dh__tp_asm_expire(f->a, t0 + 500 + TIMEOUT_MS, &f->e), 1);
    assert_int_equal(f->e.code, DH_ETIMEOUT);
    assert_non_null(strstr(f->e.msg, "task 77 from server 9 at " HOST_A));
    assert_non_null(strstr(f->e.msg, "3 of 4"));
    assert_int_equal(dh__tp_asm_open(f->a), 0);
    assert_int_equal(dh__tp_asm_expire(f->a, UINT64_MAX, &f->e), 0);
    /* The late part starts a set of its own, which never completes. */
    assert_int_equal(offer(f, TASK, 1, t0 + 5000), 0);
    assert_int_equal(dh__tp_asm_expire(f->a, t0 + 5000 + TIMEOUT_MS, &f->e), 1);
}

static void wrong_size_or_count_is_refused(void **state)
{
    struct fx *f = *state;

    /* Alone: an oversized part, a short one, counts out of range. */
    assert_int_equal(offer_ex(f, TASK, SERVER, HOST_A, 0, COUNT, 1, 0, 0),
                     DH_EPROTO);
    assert_non_null(strstr(f->e.msg, "part 0 of 4 holds 252 bytes"));
    assert_int_equal(offer_ex(f, TASK, SERVER, HOST_A, 0, COUNT, -1, 0, 0),
                     DH_EPROTO);
    assert_int_equal(offer_ex(f, TASK, SERVER, HOST_A, 4, COUNT, 0, 0, 0),
                     DH_EPROTO);
    assert_int_equal(offer_ex(f, TASK, SERVER, HOST_A, 0, 1, 0, 0, 0),
                     DH_EPROTO);
    assert_int_equal(
        offer_ex(f, TASK, SERVER, HOST_A, 0, DH_TP_MAX_PARTS + 1, 0, 0, 0),
        DH_EPROTO);
    assert_int_equal(dh__tp_asm_open(f->a), 0);
    /* Within a set: an oversized part drops it; so does another count. */
    assert_int_equal(offer(f, TASK, 0, 0), 0);
    assert_int_equal(offer_ex(f, TASK, SERVER, HOST_A, 1, COUNT, 5, 0, 0),
                     DH_EPROTO);
    assert_int_equal(dh__tp_asm_open(f->a), 0);
    assert_int_equal(offer(f, TASK, 0, 0), 0);
    assert_int_equal(offer_ex(f, TASK, SERVER, HOST_A, 1, COUNT + 1, 0, 0, 0),
                     DH_EPROTO);
    assert_non_null(strstr(f->e.msg, "the first said 4"));
    assert_int_equal(dh__tp_asm_open(f->a), 0);
    /* A header that differs by a byte drops it too. */
    assert_int_equal(offer(f, TASK, 0, 0), 0);
    assert_int_equal(offer_ex(f, TASK, SERVER, HOST_A, 1, COUNT, 0, 'x', 0),
                     DH_EPROTO);
    assert_non_null(strstr(f->e.msg, "header differs"));
    assert_int_equal(dh__tp_asm_open(f->a), 0);
}

static void part_from_another_sender_is_refused(void **state)
{
    struct fx *f = *state;

    assert_int_equal(offer(f, TASK, 0, 0), 0);
    assert_int_equal(offer(f, TASK, 1, 0), 0);
    /* Another server id, then the right id from another host. */
    assert_int_equal(offer_ex(f, TASK, SERVER + 1, HOST_A, 2, COUNT, 0, 0, 0),
                     DH_EPROTO);
    assert_non_null(strstr(f->e.msg, "claims server 10"));
    assert_int_equal(offer_ex(f, TASK, SERVER, HOST_B, 2, COUNT, 0, 0, 0),
                     DH_EPROTO);
    assert_non_null(strstr(f->e.msg, "from server 9 at " HOST_A));
    /* ... and a duplicate of theirs does not harm the genuine set. */
    assert_int_equal(offer_ex(f, TASK, SERVER + 1, HOST_B, 1, COUNT, 0, 0, 0),
                     DH_EPROTO);
    assert_int_equal(dh__tp_asm_open(f->a), 1);
    assert_int_equal(offer(f, TASK, 2, 0), 0);
    assert_int_equal(offer(f, TASK, 3, 0), 1);
    expect_whole(f, TASK);
}

static void caps_on_sets_and_bytes(void **state)
{
    struct fx *f = *state;
    struct dh_tp_asm *roomy = f->a;

    /* 4 sets at most. */
    for (uint64_t t = 0; t < 4; t++)
        assert_int_equal(offer(f, TASK + t, 0, 0), 0);
    assert_int_equal(offer(f, TASK + 4, 0, 0), DH_EPROTO);
    assert_non_null(strstr(f->e.msg, "4 payloads are being assembled"));
    assert_int_equal(dh__tp_asm_open(f->a), 4);
    /* 600 bytes at most: the third part of 251 would pass the cap, and
     * its set goes. */
    f->a = make_asm(4, 600);
    assert_int_equal(offer(f, TASK, 0, 0), 0);
    assert_int_equal(offer(f, TASK, 1, 0), 0);
    assert_int_equal(offer(f, TASK, 2, 0), DH_EPROTO);
    assert_non_null(strstr(f->e.msg, "cap 600"));
    assert_int_equal(dh__tp_asm_open(f->a), 0);
    assert_int_equal(offer(f, TASK + 1, 0, 0), 0); /* the bytes came back */
    dh__tp_asm_destroy(f->a);
    f->a = roomy;
}

/* ---- the sender's link over real sockets ---- */

static atomic_int freed;

static void count_free(void *data, void *hint)
{
    (void)data;
    (void)hint;
    atomic_fetch_add(&freed, 1);
}

/* Receives one message from `in` within WAIT_MS into f[0..*n). */
static void recv_one(void *in, struct dh_tp_from *from, zmq_msg_t *f, int *n)
{
    int extra = 0;
    struct dh_err e;

    assert_int_equal(dh__tp_wait(in, WAIT_MS, &e), 1);
    assert_int_equal(dh__tp_recv_frames(in, from, f, 4, n, &extra, &e), 1);
    assert_int_equal(extra, 0);
}

static void link_stripes_a_large_payload(void **state)
{
    enum { STRIPES = 3, BIG = 1u << 20 };
    struct dh_tp_opts io = {.kind = DH_TP_PAYLOAD_IN,
                            .addr = "tcp://127.0.0.1:0",
                            .who = "test in",
                            .max_msg = BIG};
    struct dh_tp_opts oo = {
        .kind = DH_TP_PAYLOAD_OUT, .who = "test out", .peer = "test in"};
    char bound[DH_WIRE_MAX_ADDR + 1];
    static const char hdr[] = "the header";
    uint8_t *big = malloc(BIG);
    struct dh_tp_link *l = NULL;
    struct dh_tp_asm *a = make_asm(4, 2 * BIG);
    zmq_msg_t f[4], out[DH_TP_MAX_PARTS + 1];
    uint8_t ids[STRIPES][DH_TP_MAX_ID];
    void *ctx = zmq_ctx_new(), *in = NULL;
    int n = 0, n_out = 0, rc = 0;
    uint64_t end;
    size_t off = 0;
    struct dh_err e;

    (void)state;
    assert_non_null(big);
    for (size_t i = 0; i < BIG; i++)
        big[i] = (uint8_t)(i ^ (i >> 9));
    assert_int_equal(dh__tp_ctx_tune(ctx, STRIPES, 64, &e), 0);
    assert_int_equal(dh__tp_open(ctx, &io, &in, bound, sizeof(bound), &e), 0);
    oo.addr = bound;
    assert_int_equal(dh__tp_link_open(ctx, &oo, STRIPES, &l, &e), 0);
    assert_int_equal(dh__tp_link_stripes(l), STRIPES);
    atomic_store(&freed, 0);
    end = now_ms() + WAIT_MS; /* ZMQ_IMMEDIATE: 0 until all connect */
    while ((rc = dh__tp_link_send(l, hdr, sizeof(hdr), big, BIG, count_free,
                                  NULL, &e)) == 0 &&
           now_ms() < end)
        assert_true(dh__tp_wait(in, 10, &e) >= 0);
    assert_int_equal(rc, 1);
    for (int p = 0; p < STRIPES; p++) {
        struct dh_tp_from from;
        uint32_t index, count;

        recv_one(in, &from, f, &n);
        assert_int_equal(n, 3); /* [part][hdr][data] */
        memcpy(ids[p], from.id, DH_TP_MAX_ID);
        for (int q = 0; q < p; q++) /* each part on its own connection */
            assert_memory_not_equal(ids[q], ids[p], from.id_len);
        assert_int_equal(dh__tp_part_decode(zmq_msg_data(&f[0]),
                                            zmq_msg_size(&f[0]), &index, &count,
                                            &e),
                         1);
        assert_int_equal(count, STRIPES);
        assert_int_equal(zmq_msg_size(&f[1]), sizeof(hdr));
        rc = dh__tp_asm_add(a,
                            &(struct dh_tp_part){.task = 1,
                                                 .server = 2,
                                                 .host = from.addr,
                                                 .index = index,
                                                 .count = count,
                                                 .length = BIG,
                                                 .hdr = &f[1],
                                                 .data = &f[2]},
                            now_ms(), out, &n_out, &e);
        dh__tp_frames_close(f, n);
        assert_int_equal(rc, p + 1 == STRIPES);
    }
    assert_int_equal(n_out, STRIPES + 1);
    for (int i = 1; i < n_out; i++) {
        assert_memory_equal(zmq_msg_data(&out[i]), big + off,
                            zmq_msg_size(&out[i]));
        off += zmq_msg_size(&out[i]);
    }
    assert_int_equal(off, BIG);
    dh__tp_frames_close(out, n_out);
    end = now_ms() + WAIT_MS; /* written: freed once, by an I/O thread */
    while (atomic_load(&freed) == 0 && now_ms() < end)
        assert_true(dh__tp_wait(in, 10, &e) >= 0);
    assert_int_equal(atomic_load(&freed), 1);

    /* Small payloads go whole, each on the next socket in turn. */
    for (int p = 0; p < STRIPES; p++) {
        struct dh_tp_from from;

        end = now_ms() + WAIT_MS;
        while ((rc = dh__tp_link_send(l, hdr, sizeof(hdr), big, 1000,
                                      count_free, NULL, &e)) == 0 &&
               now_ms() < end)
            assert_true(dh__tp_wait(in, 10, &e) >= 0);
        assert_int_equal(rc, 1);
        recv_one(in, &from, f, &n);
        assert_int_equal(n, 2); /* [hdr][data] */
        assert_int_equal(zmq_msg_size(&f[1]), 1000);
        dh__tp_frames_close(f, n);
        memcpy(ids[p], from.id, DH_TP_MAX_ID);
        for (int q = 0; q < p; q++)
            assert_memory_not_equal(ids[q], ids[p], from.id_len);
    }
    end = now_ms() + WAIT_MS;
    while (atomic_load(&freed) < 1 + STRIPES && now_ms() < end)
        assert_true(dh__tp_wait(in, 10, &e) >= 0);
    assert_int_equal(atomic_load(&freed), 1 + STRIPES);

    dh__tp_link_close(&l, 0);
    assert_null(l);
    dh__tp_close(&in, 0);
    dh__tp_asm_destroy(a);
    zmq_ctx_term(ctx);
    free(big);
}

static void link_sends_nothing_until_every_socket_connects(void **state)
{
    struct dh_tp_opts oo = {.kind = DH_TP_PAYLOAD_OUT,
                            .addr = "tcp://127.0.0.1:1", /* nobody there */
                            .who = "test out",
                            .peer = "nobody"};
    static uint8_t big[DH_TP_STRIPE_MIN];
    struct dh_tp_link *l = NULL;
    void *ctx = zmq_ctx_new();
    struct dh_err e;

    (void)state;
    assert_int_equal(dh__tp_ctx_tune(ctx, 2, 64, &e), 0);
    assert_int_equal(dh__tp_link_open(ctx, &oo, 2, &l, &e), 0);
    atomic_store(&freed, 0);
    assert_int_equal(
        dh__tp_link_send(l, "h", 1, big, sizeof(big), count_free, NULL, &e), 0);
    assert_int_equal(
        dh__tp_link_send(l, "h", 1, big, 100, count_free, NULL, &e), 0);
    dh__tp_link_close(&l, 0);
    zmq_ctx_term(ctx);
    assert_int_equal(atomic_load(&freed), 0); /* the caller kept it */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(cut_covers_the_payload),
        cmocka_unit_test(part_frame_round_trip),
        cmocka_unit_test_setup_teardown(reassembles_in_order, fx_setup,
                                        fx_teardown),
        cmocka_unit_test_setup_teardown(reassembles_out_of_order, fx_setup,
                                        fx_teardown),
        cmocka_unit_test_setup_teardown(duplicate_part_drops_the_set, fx_setup,
                                        fx_teardown),
        cmocka_unit_test_setup_teardown(missing_part_times_out, fx_setup,
                                        fx_teardown),
        cmocka_unit_test_setup_teardown(wrong_size_or_count_is_refused,
                                        fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(part_from_another_sender_is_refused,
                                        fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(caps_on_sets_and_bytes, fx_setup,
                                        fx_teardown),
        cmocka_unit_test(link_stripes_a_large_payload),
        cmocka_unit_test(link_sends_nothing_until_every_socket_connects),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
