/*
 * bench_payload.c - the payload half of bench_route's "cost of security"
 * section (bench_payload.h, docs/benchmarks.md "Cost of security").
 *
 * What runs is the real payload path, not a model of it: the sender is a
 * payload link (dh__tp_link_open / dh__tp_link_send, what a sidecar's
 * dataserver_remote.c sends with) in its own ZeroMQ context tuned as a
 * DataServer tunes its own (dh__tp_ctx_tune: one I/O thread per stripe);
 * the receiver is a local DataServer's payload inbox (dh__ds_inbox_open /
 * dh__ds_inbox_serve, dataserver_payload.c) in a second context, which
 * checks each header, reassembles striped parts, copies the batch into a
 * slot of a real arena and reports it to a sink that releases the slot as
 * the client would.  Each batch is its own task (distinct task ids, as on
 * the job's wire), 4 MiB of uint8.  With CURVE both ends hold one job key
 * and the inbox's context runs the ZAP handler.  One thread drives both
 * loops, as two processes' loops would, sleeping in zmq_poll on the inbox
 * when the link is full (so the I/O threads have the cores).
 *
 * Every wait is bounded: no batch placed for STALL_MS fails the run.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <sys/resource.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <zmq.h>

#ifdef DH_BENCH_SODIUM
#include <sodium.h>
#endif

#include "bench_payload.h"
#include "core/clock.h"
#include "datahelix/arena.h"
#include "datahelix/dataserver.h"
#include "datahelix/wire.h"
#include "runtime/dataserver_internal.h"
#include "runtime/keys.h"
#include "runtime/transport.h"

#define STALL_MS 5000
#define ARENA_BYTES (64u << 20) /* 16 batches */
#define SERVER_LOCAL 1
#define SERVER_REMOTE 9
/* The remote's payload secret: its headers carry the token derived from
 * it for SERVER_LOCAL, as the Coordinator tells the inbox. */
#define REMOTE_SECRET "99999999999999999999999999999999"

static uint8_t batch[BENCH_PAY_BYTES];

/* The receiving side: a local DataServer's inbox and its arena. */
struct rx {
    void *ctx;
    struct ds_env env;
    struct ds_stats st;
    struct dh_tp_auth auth;
    struct ds_inbox *in;
    uint64_t placed, refused;
    char why[DH_ERR_MSG_MAX + 16];
};

/* The sending side: a sidecar's payload link. */
struct tx {
    void *ctx;
    struct dh_tp_auth auth;
    struct dh_tp_link *link;
};

static void rx_done(void *arg, const struct ds_done *d)
{
    struct rx *r = arg;
    struct dh_err e;

    if (d->kind != DS_DONE_RESULT || d->res.slot.len < BENCH_PAY_BYTES) {
        r->refused++;
        snprintf(r->why, sizeof(r->why), "%s",
                 d->msg ? d->msg : "a slot of the wrong size");
        if (d->kind == DS_DONE_RESULT &&
            dh_arena_release(r->env.arena, &d->res.slot, &e) < 0)
            fprintf(stderr, "bench_route: release: %s\n", e.msg);
        return;
    }
    if (dh_arena_release(r->env.arena, &d->res.slot, &e) < 0) {
        r->refused++;
        snprintf(r->why, sizeof(r->why), "release: %s", e.msg);
        return;
    }
    r->placed++;
}

static void no_free(void *data, void *hint)
{
    (void)data;
    (void)hint;
}

/* The batch's header as a sidecar encodes it: task `step` of rank 0. */
static int encode_header(uint32_t step, uint8_t **buf, size_t *len,
                         struct dh_err *e)
{
    struct dh_wire_msg m;
    uint64_t id = step;
    uint32_t valid = 1;
    int rc;

    dh_wire_msg_init(&m, DH_WIRE_RESULT_NOTICE);
    if ((rc = dh_wire_task_make(&m.u.result.task, 0, 0, step, 0, 0, e)) == 0 &&
        (rc = dh_wire_set_result_samples(&m.u.result, &id, &valid, 1, e)) ==
            0) {
        m.u.result.server_id = SERVER_REMOTE;
        dh__payload_token(REMOTE_SECRET, SERVER_LOCAL, m.u.result.sender_token);
        m.u.result.length = BENCH_PAY_BYTES;
        m.u.result.ndims = 2;
        m.u.result.dims[0] = 1;
        m.u.result.dims[1] = BENCH_PAY_BYTES;
        m.u.result.dtype = DH_DTYPE_U8;
        rc = dh_wire_encode(&m, buf, len, e);
    }
    dh_wire_msg_fini(&m);
    return rc;
}

static int rx_open(struct rx *r, const struct dh_keys *k, uint32_t stripes,
                   struct dh_err *e)
{
    struct dh_dataserver_opts o;
    struct dh_arena_stats as;
    int rc;

    memset(r, 0, sizeof(*r));
    snprintf(r->auth.who, sizeof(r->auth.who), "bench inbox");
    if (k)
        r->auth.keys = *k;
    if (!(r->ctx = zmq_ctx_new()))
        return dh_err_set(e, DH_EIO, "zmq context");
    if ((rc = dh__tp_ctx_tune(r->ctx, stripes, 0, e)) < 0 ||
        (rc = dh_arena_create(ARENA_BYTES, &r->env.arena, e)) < 0 ||
        (rc = dh_arena_stats(r->env.arena, &as)) < 0)
        return rc < 0 ? rc : dh_err_set(e, DH_EIO, "arena stats");
    r->env = (struct ds_env){.server_id = SERVER_LOCAL,
                             .rank = 0,
                             .arena = r->env.arena,
                             .arena_cap = as.capacity,
                             .alloc_timeout_ms = STALL_MS,
                             .deliver_timeout_ms = STALL_MS,
                             .st = &r->st,
                             .auth = k ? &r->auth : NULL,
                             .stripes = stripes};
    dh_dataserver_opts_default(&o);
    o.listen = "tcp://127.0.0.1:0";
    return dh__ds_inbox_open(&r->env, r->ctx, &o, &r->in, e);
}

static void rx_close(struct rx *r)
{
    dh__ds_inbox_close(r->in);
    dh__tp_auth_fini(&r->auth);
    if (r->ctx)
        zmq_ctx_term(r->ctx);
    dh_arena_destroy(r->env.arena);
}

static int tx_open(struct tx *t, const struct dh_keys *k, uint32_t stripes,
                   const char *addr, struct dh_err *e)
{
    struct dh_tp_opts o = {.kind = DH_TP_PAYLOAD_OUT,
                           .addr = addr,
                           .who = "bench sidecar",
                           .peer = "the bench inbox at"};
    int rc;

    memset(t, 0, sizeof(*t));
    if (k) {
        t->auth.keys = *k;
        o.auth = &t->auth;
    }
    if (!(t->ctx = zmq_ctx_new()))
        return dh_err_set(e, DH_EIO, "zmq context");
    if ((rc = dh__tp_ctx_tune(t->ctx, stripes, 0, e)) < 0)
        return rc;
    return dh__tp_link_open(t->ctx, &o, stripes, &t->link, e);
}

static void tx_close(struct tx *t)
{
    dh__tp_link_close(&t->link, 0);
    dh__keys_wipe(&t->auth.keys);
    if (t->ctx)
        zmq_ctx_term(t->ctx);
}

/* Sends what the link takes now, from batch `*sent` on (of `n`).  Each
 * task is first announced to the inbox as placed on the sender, as the
 * Coordinator does (the inbox takes a payload only from its task's
 * server: docs/security.md "Who may send a payload"). */
static int send_some(struct tx *t, struct rx *r, uint32_t first, int n,
                     int *sent, struct dh_err *e)
{
    while (*sent < n) {
        uint32_t step = first + (uint32_t)*sent;
        uint8_t *hdr = NULL;
        size_t len = 0;
        uint64_t id;
        int rc;

        if ((rc = dh_wire_task_id(0, step, 0, 0, &id, e)) < 0 ||
            (rc = encode_header(step, &hdr, &len, e)) < 0)
            return rc;
        char tok[DH_WIRE_TOKEN_LEN + 1];

        dh__payload_token(REMOTE_SECRET, SERVER_LOCAL, tok);
        dh__ds_inbox_expect(r->in, id, SERVER_REMOTE, tok);
        rc = dh__tp_link_send(t->link, hdr, len, batch, sizeof(batch), no_free,
                              NULL, e);
        dh_wire_free(hdr);
        if (rc <= 0)
            return rc;
        (*sent)++;
    }
    return 0;
}

/* Moves `n` batches (task ids from `first`) through; 0 or the error. */
static int pump(struct tx *t, struct rx *r, uint32_t first, int n,
                struct dh_err *e)
{
    uint64_t base = r->placed, last = dh__mono_ms();
    int sent = 0, rc;

    while (r->placed < base + (uint64_t)n) {
        uint64_t before = r->placed;
        void *s;

        if ((rc = send_some(t, r, first, n, &sent, e)) < 0)
            return rc;
        if ((s = dh__ds_inbox_socket(r->in))) {
            if ((rc = dh__tp_wait(s, 1, e)) < 0)
                return rc;
        } else {
            usleep(200); /* holding a batch for arena space */
        }
        dh__ds_inbox_serve(r->in, (struct ds_sink){rx_done, r});
        if (r->refused)
            return dh_err_set(e, DH_EIO, "the inbox refused a batch: %s",
                              r->why);
        if (atomic_load(&r->st.st_malformed))
            return dh_err_set(e, DH_EPROTO, "the inbox dropped a message");
        if (r->placed > before)
            last = dh__mono_ms();
        else if (dh__mono_ms() - last > STALL_MS)
            return dh_err_set(e, DH_ETIMEOUT,
                              "payload: nothing placed for %d ms (%llu "
                              "placed, %d sent of %d)",
                              STALL_MS, (unsigned long long)(r->placed - base),
                              sent, n);
    }
    return 0;
}

/* CPU seconds this process has used, every thread, user and system. */
static double cpu_s(void)
{
    struct rusage ru;

    if (getrusage(RUSAGE_SELF, &ru) < 0)
        return 0;
    return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
           (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
}

int bench_pay_once(int curve, uint32_t stripes, int warmup, int count,
                   struct bench_pay *out, struct dh_err *e)
{
    double c0, bytes = (double)count * BENCH_PAY_BYTES;
    struct dh_keys keys, *k = NULL;
    struct rx r;
    struct tx t;
    double t0;
    int rc;

    memset(&r, 0, sizeof(r));
    memset(&t, 0, sizeof(t));
    memset(batch, 0x5a, sizeof(batch));
    if (curve) {
        if ((rc = dh__keys_generate(&keys, e)) < 0)
            return rc;
        k = &keys;
    }
    if ((rc = rx_open(&r, k, stripes, e)) < 0 ||
        (rc = tx_open(&t, k, stripes, dh__ds_inbox_endpoint(r.in), e)) < 0 ||
        (rc = pump(&t, &r, 1, warmup, e)) < 0)
        goto out;
    t0 = dh__mono_msf();
    c0 = cpu_s();
    if ((rc = pump(&t, &r, 1 + (uint32_t)warmup, count, e)) < 0)
        goto out;
    out->mbps = bytes / ((dh__mono_msf() - t0) * 1e3);
    out->cpu_ns_per_byte = (cpu_s() - c0) * 1e9 / bytes;
    out->parts = atomic_load(&r.st.st_parts_in);
out:
    tx_close(&t);
    rx_close(&r);
    if (k)
        dh__keys_wipe(k);
    return rc;
}

/* ---- the ceilings ---- */

static double secs(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#ifdef DH_BENCH_SODIUM
static uint8_t sealed[BENCH_PAY_BYTES + 64];

static void box_salsa(const uint8_t *key, const uint8_t *nonce)
{
    crypto_secretbox_easy(sealed, batch, sizeof(batch), nonce, key);
}

static void box_aes(const uint8_t *key, const uint8_t *nonce)
{
    crypto_aead_aes256gcm_encrypt(sealed, NULL, batch, sizeof(batch), NULL, 0,
                                  NULL, nonce, key);
}

/* MB/s of `box` on 4 MiB, the best of 5 (a quiet core). */
static double rate(void (*box)(const uint8_t *key, const uint8_t *nonce))
{
    uint8_t key[32], nonce[24];
    double best = 0;

    randombytes_buf(key, sizeof(key));
    randombytes_buf(nonce, sizeof(nonce));
    for (int rep = 0; rep < 5; rep++) {
        double t0 = secs(), v;

        for (int i = 0; i < 8; i++)
            box(key, nonce);
        v = 8.0 * sizeof(batch) / (secs() - t0) / 1e6;
        best = v > best ? v : best;
    }
    return best;
}
#endif

double bench_cipher_mbps(void)
{
#ifdef DH_BENCH_SODIUM
    return sodium_init() < 0 ? 0 : rate(box_salsa);
#else
    return 0;
#endif
}

double bench_aes_mbps(void)
{
#ifdef DH_BENCH_SODIUM
    if (sodium_init() < 0 || !crypto_aead_aes256gcm_is_available())
        return 0;
    return rate(box_aes);
#else
    return 0;
#endif
}

double bench_memcpy_mbps(void)
{
    /* Through a volatile pointer: the compiler cannot drop the copies. */
    static void *(*volatile copy)(void *, const void *, size_t) = memcpy;
    static uint8_t out[BENCH_PAY_BYTES];
    unsigned sum = 0;
    double t0, best = 0;

    for (int rep = 0; rep < 5; rep++) {
        t0 = secs();
        for (int i = 0; i < 8; i++) {
            batch[i] = (uint8_t)rep;
            copy(out, batch, sizeof(batch));
            sum += out[i];
        }
        double v = 8.0 * sizeof(batch) / (secs() - t0) / 1e6;

        best = v > best ? v : best;
    }
    return sum == UINT32_MAX ? 0 : best;
}
