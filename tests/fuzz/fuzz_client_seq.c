/*
 * fuzz_client_seq.c - libFuzzer target (issue 13 item 8): SEQUENCES of
 * messages into the client's result handling (client_io.c: results,
 * errors, routes, registration acks) interleaved with the consumer's calls
 * (next, release, a new pass), on a client with no Coordinator, server or
 * I/O thread (dh__cl_create_detached): the script plays the Coordinator,
 * the server that fills the arena and the I/O thread's turns.  Each input:
 *
 *   cfg:u8, then records  op:u8 a:u8 b:u8 c:u8
 *     cfg            prefetch cfg % 4 + 1, microbatches (cfg >> 2) % 2 + 1,
 *                    spares (cfg >> 3) & 1
 *     op % 12 == 0   the right result for step a % STEPS, part b: a fresh
 *                    slot of the arena, filled, ids and shape as asked
 *     op % 12 == 1   the same with the lies of mask c (an id, the count,
 *                    the dtype, the leading dim, a substitute where none
 *                    was asked, another pass, another epoch; bit 7 a real
 *                    substitute)
 *     op % 12 == 2   a notice sent before again (a duplicate; a with
 *                    another task's id when b & 1)
 *     op % 12 == 3   a result naming a slot that is not there
 *     op % 12 == 4   a result in an arena the client does not know
 *     op % 12 == 5   an error notice for step a, part b (cause by c)
 *     op % 12 == 6   a route (the task's server)
 *     op % 12 == 7   a registration ack (incarnation: same, new, none)
 *     op % 12 == 8   next() without waiting; a batch is kept (at most 6)
 *     op % 12 == 9   a kept batch released
 *     op % 12 == 10  a new pass (the old one abandoned)
 *     op % 12 == 11  the record's 3 bytes and what follows, up to a bytes,
 *                    as a message from the Coordinator (mostly malformed)
 *
 * Every built message goes through the wire codec (encode, decode) first:
 * the client only ever sees what the decoder accepts.  Every slot handed
 * to the client with a notice is the client's (exactly once); the harness
 * keeps nothing else.  Findings: a crash or leak (ASan/LSan in the replay
 * under build-asan); a batch whose ids are not the step's (data that was
 * not asked for), whose part is not a live slot, or not the bytes the
 * harness wrote for it; and at the end (every batch released, the client
 * destroyed) a live slot (a leak) or a release of a stale slot (a double
 * release) in the arena.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <zmq.h>

#include "datahelix/arena.h"
#include "datahelix/batch.h"
#include "datahelix/client.h"
#include "datahelix/coordinator.h"
#include "datahelix/index.h"
#include "datahelix/wire.h"
#include "fuzz_cursor.h"
#include "runtime/client_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define STEPS 6
#define PER 2 /* ids a step */
#define NIDS 16
#define SERVER 1
#define ARENA (1u << 20)
#define KEEP 6  /* batches the consumer holds at most */
#define HIST 16 /* notices remembered for duplicates */

static char dhx[256];

/* A descriptor index of NIDS rows (nothing decodes here: the client reads
 * only its cost columns). */
static const char *index_path(void)
{
    struct dh_index_builder *b;
    struct dh_desc d;
    struct dh_err e;

    if (dhx[0])
        return dhx;
    snprintf(dhx, sizeof(dhx), "/tmp/fuzz-client-seq-%d.dhx", (int)getpid());
    if (dh_index_builder_create(&b, &e) < 0)
        abort();
    for (int i = 0; i < NIDS; i++) {
        dh_desc_init(&d);
        d.path = "/nonexistent/clip.mp4";
        d.id = (uint64_t)i;
        d.kind = DH_KIND_VIDEO;
        snprintf(d.profile, sizeof(d.profile), "16x224");
        if (dh_index_builder_add(b, &d, &e) < 0)
            abort();
    }
    if (dh_index_builder_finish(b, dhx, &e) < 0)
        abort();
    dh_index_builder_destroy(b);
    return dhx;
}

struct run {
    struct dh_client *c;
    struct dh_arena *a; /* the harness's view (the server's) */
    void *ctx, *coord;  /* the Coordinator end of the client's socket */
    struct dh_media_plan plan;
    uint64_t ids[STEPS * PER], offs[STEPS + 1];
    uint32_t epoch, pass, mb;
    uint64_t incarnation;
    struct dh_client_batch *kept[KEEP];
    size_t n_kept;
    uint8_t *hist[HIST]; /* encoded notices sent */
    size_t hist_len[HIST], n_hist;
};

/* Requests the client sent (the Coordinator's inbox) are dropped. */
static void drain(struct run *r)
{
    char buf[1 << 12];

    while (zmq_recv(r->coord, buf, sizeof(buf), ZMQ_DONTWAIT) >= 0) {
    }
}

/* Encodes m, decodes it as the wire would and feeds the client; keeps
 * the bytes of a result for duplicates.  0 fed, -1 refused by the codec. */
static int feed(struct run *r, const struct dh_wire_msg *m, int remember)
{
    struct dh_wire_msg got;
    uint8_t *buf = NULL;
    size_t len = 0;

    if (dh_wire_encode(m, &buf, &len, NULL) < 0)
        return -1;
    if (dh_wire_decode(buf, len, &got, NULL) < 0) {
        dh_wire_free(buf);
        return -1;
    }
    dh__cl_feed(r->c, &got);
    dh_wire_msg_fini(&got);
    if (remember && r->n_hist < HIST) {
        r->hist[r->n_hist] = buf;
        r->hist_len[r->n_hist++] = len;
    } else {
        dh_wire_free(buf);
    }
    return 0;
}

static void feed_bytes(struct run *r, const uint8_t *p, size_t n)
{
    struct dh_wire_msg got;

    if (dh_wire_decode(p, n, &got, NULL) < 0)
        return;
    dh__cl_feed(r->c, &got);
    dh_wire_msg_fini(&got);
}

/* The byte a slot of (pass, step, part) holds at i: what next() must
 * hand back. */
static uint8_t fill_byte(uint32_t pass, uint32_t step, uint32_t j, size_t i)
{
    return (uint8_t)(pass * 31 + step * 7 + j * 3 + i);
}

/* The lies of a result (op 1: any combination). */
enum {
    LIE_ID = 1,        /* its last id is not the one asked */
    LIE_COUNT = 2,     /* a sample short */
    LIE_DTYPE = 4,     /* f32 for u8 */
    LIE_DIM = 8,       /* a leading dim one more than the samples */
    LIE_SUB = 16,      /* a substitute for an id not asked */
    LIE_PASS = 32,     /* the next pass's task */
    LIE_EPOCH = 64,    /* another epoch's */
    LIE_REAL_SUB = 128 /* no lie: a substitute for the id asked */
};

/* The result of (step, part j) as asked, in a fresh slot of server `sid`
 * (another than SERVER: an arena the client does not know, released
 * here), with the lies in mask `lie`. */
static void result(struct run *r, uint32_t step, uint32_t j, uint32_t sid,
                   int lie)
{
    uint64_t lo = r->offs[step] + PER * j / r->mb;
    uint64_t hi = r->offs[step] + PER * (j + 1) / r->mb;
    uint32_t n = (uint32_t)(hi - lo), valid[PER] = {2, 2};
    uint64_t ids[PER + 1];
    size_t len = dh_batch_bytes(&r->plan, n);
    struct dh_slot_ref ref;
    struct dh_wire_msg m;
    uint8_t *p;

    if (dh_arena_alloc(r->a, len, 0, &ref, NULL) < 0)
        return; /* full: the consumer holds it up */
    p = dh_arena_ptr(r->a, &ref);
    for (size_t i = 0; i < len; i++)
        p[i] = fill_byte(r->pass, step, j, i);
    memcpy(ids, r->ids + lo, n * sizeof(*ids));
    dh_wire_msg_init(&m, DH_WIRE_RESULT_NOTICE);
    if (dh_wire_task_make(&m.u.result.task, r->epoch + !!(lie & LIE_EPOCH),
                          r->pass + !!(lie & LIE_PASS), step, 0, j, NULL) < 0)
        goto out;
    m.u.result.server_id = sid;
    m.u.result.arena_offset = ref.offset;
    m.u.result.length = ref.len;
    m.u.result.slot_generation = ref.gen;
    m.u.result.ndims = 5;
    m.u.result.dims[0] = lie & LIE_DIM ? n + 1 : n;
    m.u.result.dims[1] = r->plan.frames;
    m.u.result.dims[2] = r->plan.height;
    m.u.result.dims[3] = r->plan.width;
    m.u.result.dims[4] = 3;
    m.u.result.dtype = lie & LIE_DTYPE ? DH_DTYPE_F32 : r->plan.dtype;
    if (lie & LIE_ID)
        ids[n - 1] += 100;
    if (dh_wire_set_result_samples(&m.u.result, ids, valid,
                                   lie & LIE_COUNT && n > 1 ? n - 1 : n,
                                   NULL) < 0)
        goto out;
    if (lie & (LIE_SUB | LIE_REAL_SUB)) { /* position 0 replaces ids[0] */
        uint32_t pos = 0;
        uint64_t failed = lie & LIE_SUB ? r->ids[lo] + 1 : r->ids[lo];
        int32_t cause = DH_EMEDIA;

        m.u.result.sample_ids[0] = NIDS + 1; /* the substitute */
        if (dh_wire_set_result_subs(&m.u.result, &pos, &failed, &cause, 1,
                                    NULL) < 0)
            goto out;
    }
    if ((feed(r, &m, 1) < 0 || sid != SERVER) &&
        dh_arena_release(r->a, &ref, NULL) < 0)
        abort(); /* never the client's: still ours */
out:
    dh_wire_msg_fini(&m);
}

static void duplicate(struct run *r, uint8_t which, uint8_t forge)
{
    struct dh_wire_msg m;

    if (!r->n_hist)
        return;
    if (dh_wire_decode(r->hist[which % r->n_hist],
                       r->hist_len[which % r->n_hist], &m, NULL) < 0)
        abort(); /* it decoded before */
    if (forge & 1) {
        struct dh_wire_task t = m.u.result.task;

        if (dh_wire_task_make(&m.u.result.task, t.epoch, t.pass,
                              (t.step + 1) % STEPS, t.rank, t.microbatch,
                              NULL) < 0)
            m.u.result.task = t;
    }
    (void)feed(r, &m, 0);
    dh_wire_msg_fini(&m);
}

static void no_slot(struct run *r, uint8_t a, uint8_t b)
{
    struct dh_wire_msg m;
    uint64_t id = r->ids[0];

    dh_wire_msg_init(&m, DH_WIRE_RESULT_NOTICE);
    if (dh_wire_task_make(&m.u.result.task, r->epoch, r->pass, a % STEPS, 0, 0,
                          NULL) == 0 &&
        dh_wire_set_result_samples(&m.u.result, &id, NULL, 1, NULL) == 0) {
        m.u.result.server_id = SERVER;
        m.u.result.arena_offset = (uint64_t)a * 4096 + b;
        m.u.result.length = 64;
        m.u.result.slot_generation = b;
        m.u.result.ndims = 1;
        m.u.result.dims[0] = 1;
        m.u.result.dtype = DH_DTYPE_U8;
        (void)feed(r, &m, 0);
    }
    dh_wire_msg_fini(&m);
}

static void error_notice(struct run *r, uint8_t a, uint8_t b, uint8_t c)
{
    static const int32_t causes[] = {DH_EMEDIA,   DH_EFORMAT,   DH_EARENA,
                                     DH_ETIMEOUT, DH_EPEERDEAD, DH_EIO};
    struct dh_wire_msg m;

    dh_wire_msg_init(&m, DH_WIRE_ERROR_NOTICE);
    if (dh_wire_task_make(&m.u.error.task, r->epoch, r->pass, a % STEPS, 0,
                          b % r->mb, NULL) == 0) {
        m.u.error.server_id = c & 1 ? SERVER : DH_COORDINATOR_SERVER_ID;
        m.u.error.sample_id = r->ids[(a % STEPS) * PER];
        m.u.error.cause = causes[c % 6];
        snprintf(m.u.error.path, sizeof(m.u.error.path), "clip.mp4");
        snprintf(m.u.error.message, sizeof(m.u.error.message), "task 1: x");
        (void)feed(r, &m, 0);
    }
    dh_wire_msg_fini(&m);
}

static void route(struct run *r, uint8_t a, uint8_t b)
{
    struct dh_wire_msg m;

    dh_wire_msg_init(&m, DH_WIRE_ROUTE);
    if (dh_wire_task_make(&m.u.route.task, r->epoch, r->pass, a % STEPS, 0,
                          b % r->mb, NULL) == 0) {
        m.u.route.server_id = m.u.route.target_server_id = b % 3 + 1;
        snprintf(m.u.route.target_addr, sizeof(m.u.route.target_addr),
                 "local:rank-0");
        (void)feed(r, &m, 0);
    }
    dh_wire_msg_fini(&m);
}

static void ack(struct run *r, uint8_t a)
{
    struct dh_wire_msg m;

    if (a % 3 == 1)
        r->incarnation++;
    dh_wire_msg_init(&m, DH_WIRE_REGISTER_CLIENT);
    m.u.register_client.rank = 0;
    m.u.register_client.world_size = 1;
    m.u.register_client.incarnation = a % 3 == 2 ? 0 : r->incarnation;
    (void)feed(r, &m, 0);
    dh_wire_msg_fini(&m);
}

/* A batch next() hands out: the step's ids (a substitute only where the
 * batch says), each part a live slot holding what was written for it. */
static void check_batch(struct run *r, const struct dh_client_batch *b)
{
    uint64_t k = b->step;
    uint32_t at = 0;

    if (b->epoch != r->epoch || k >= STEPS || b->n_parts != r->mb ||
        b->n_samples != PER)
        abort();
    for (uint32_t i = 0; i < b->n_samples; i++) {
        int sub = 0;

        for (uint32_t s = 0; s < b->n_subs; s++)
            sub |= b->subs[s].position == i &&
                   b->subs[s].failed_id == r->ids[k * PER + i];
        if (!sub && b->sample_ids[i] != r->ids[k * PER + i])
            abort(); /* data that was not asked for */
    }
    for (uint32_t j = 0; j < b->n_parts; j++) {
        const struct dh_client_part *pt = &b->parts[j];
        const uint8_t *p = pt->data;

        if (!p || pt->len != dh_batch_bytes(&r->plan, pt->n_samples))
            abort();
        for (size_t i = 0; i < pt->len; i += 97)
            if (p[i] != fill_byte(r->pass, (uint32_t)k, j, i))
                abort(); /* another slot's bytes, or a reused slot */
        at += pt->n_samples;
    }
    if (at != b->n_samples)
        abort();
}

static void next(struct run *r)
{
    struct dh_client_batch *b = NULL;
    struct dh_err e;

    if (dh_client_next_for(r->c, 0, &b, &e) < 0 || !b)
        return;
    check_batch(r, b);
    if (r->n_kept == KEEP) {
        dh_client_batch_release(r->kept[0]);
        memmove(r->kept, r->kept + 1, (KEEP - 1) * sizeof(*r->kept));
        r->n_kept--;
    }
    r->kept[r->n_kept++] = b;
}

static void release(struct run *r, uint8_t a)
{
    size_t i;

    if (!r->n_kept)
        return;
    i = a % r->n_kept;
    dh_client_batch_release(r->kept[i]);
    r->kept[i] = r->kept[--r->n_kept];
}

static int new_pass(struct run *r)
{
    struct dh_err e;

    /* A batch kept from the old pass stays valid; its bytes were checked
     * when it was handed out (the pass in fill_byte is the new one now). */
    r->epoch++;
    r->pass++;
    return dh_client_start_pass(r->c, r->epoch, r->pass, 0, STEPS, r->ids,
                                r->offs, &e);
}

static int setup(struct run *r, uint8_t cfg)
{
    struct dh_client_opts o;
    struct dh_arena *view = NULL;
    char ep[64];
    struct dh_err e;
    int zero = 0;

    dh_media_plan_init(&r->plan);
    r->plan.frames = 2;
    r->plan.width = 8;
    r->plan.height = 8;
    dh_client_opts_default(&o);
    o.coordinator = "inproc://unused";
    o.index_path = index_path();
    o.plan = r->plan;
    o.prefetch = cfg % 4 + 1;
    o.microbatches = (cfg >> 2) % 2 + 1;
    o.spares = (cfg >> 3) & 1;
    r->mb = o.microbatches;
    r->incarnation = 1;
    for (uint32_t i = 0; i < STEPS * PER; i++)
        r->ids[i] = (i * 5) % NIDS;
    for (uint32_t k = 0; k <= STEPS; k++)
        r->offs[k] = k * PER;
    if (dh__cl_create_detached(&o, &r->c, &e) < 0 ||
        dh_arena_create(ARENA, &r->a, &e) < 0 ||
        dh_arena_attach(dh_arena_fd(r->a), &view, &e) < 0)
        abort();
    r->c->arenas[0] = (struct cl_arena){.server_id = SERVER, .a = view};
    atomic_store(&r->c->n_arenas, 1);
    r->c->incarnation = r->incarnation;
    snprintf(ep, sizeof(ep), "inproc://fuzz-client-%p", (void *)r);
    if (!(r->ctx = r->c->ctx = zmq_ctx_new()) ||
        !(r->coord = zmq_socket(r->ctx, ZMQ_ROUTER)) ||
        !(r->c->sock = zmq_socket(r->ctx, ZMQ_DEALER)))
        abort();
    zmq_setsockopt(r->coord, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_setsockopt(r->c->sock, ZMQ_LINGER, &zero, sizeof(zero));
    if (zmq_bind(r->coord, ep) != 0 || zmq_connect(r->c->sock, ep) != 0)
        abort();
    return dh_client_start_pass(r->c, r->epoch, r->pass, 0, STEPS, r->ids,
                                r->offs, &e);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct cursor c = {data, size};
    struct run r = {0};
    struct dh_arena_stats st;

    if (setup(&r, take(&c)) < 0)
        abort();
    dh__cl_pump(r.c);
    while (c.n >= 4) {
        uint8_t op = take(&c) % 12, a = take(&c), b = take(&c), x = take(&c);

        switch (op) {
        case 0:
        case 1:
            result(&r, a % STEPS, b % r.mb, SERVER, op == 1 ? x : 0);
            break;
        case 2:
            duplicate(&r, a, b);
            break;
        case 3:
            no_slot(&r, a, b);
            break;
        case 4:
            result(&r, a % STEPS, b % r.mb, 99, 0);
            break;
        case 5:
            error_notice(&r, a, b, x);
            break;
        case 6:
            route(&r, a, b);
            break;
        case 7:
            ack(&r, a);
            break;
        case 8:
            next(&r);
            break;
        case 9:
            release(&r, a);
            break;
        case 10:
            if (r.pass < 32 && new_pass(&r) < 0)
                abort();
            break;
        default: {
            size_t n = a < c.n ? a : c.n;

            feed_bytes(&r, c.p, n);
            c.p += n;
            c.n -= n;
        }
        }
        dh__cl_pump(r.c);
        drain(&r);
    }
    for (size_t i = 0; i < r.n_kept; i++)
        dh_client_batch_release(r.kept[i]);
    zmq_close(r.coord);
    dh_client_destroy(r.c); /* closes its socket, ends ctx, drops the pool */
    for (size_t i = 0; i < r.n_hist; i++)
        dh_wire_free(r.hist[i]);
    if (dh_arena_stats(r.a, &st) < 0 || st.live_slots != 0 ||
        st.bad_releases != 0)
        abort(); /* a slot left behind, or released twice */
    dh_arena_destroy(r.a);
    return 0;
}
