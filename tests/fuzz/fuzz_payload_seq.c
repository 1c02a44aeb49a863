/*
 * fuzz_payload_seq.c - libFuzzer target (issue 13 item 8): SEQUENCES of
 * payload messages into a local DataServer's payload acceptance (the
 * inbox of dataserver_payload.c, over a real ZeroMQ socket pair in one
 * process), the path a remote sidecar's batches - or a stranger's bytes -
 * take into the arena the client maps.  Each input is a script:
 *
 *   frames:u8 mode:u8, then per frame  len:u8 bytes[len]
 *     frames % 4 + 1 frames make one message
 *     frames & 16 the Coordinator placed the header's task on its sender
 *                 (server 7) before the message: the inbox expects it
 *     frames & 32 ... on server 8 (so server 7's payload is a stranger's);
 *                 a header carries server 7's token for this server, or
 *                 (lie 4) server 8's: a job member forging as server 7
 *                 neither: a task nobody placed, refused (the inbox does
 *                 not wait for a Route here: route_wait_ms 0)
 *     mode & 1   frame 0 is a well-formed ResultNotice built from its
 *                bytes (this server's rank or another, sample count, dims,
 *                length, dtype), else the bytes as they are
 *     mode & 2   frame 1 holds exactly the header's `length` bytes (so
 *                scripts reach the arena), else its own bytes
 *     mode & 4   a part frame goes first (docs/wire-protocol.md "Payload
 *                parts"): index (mode >> 3) & 3 of count (mode >> 5) + 1;
 *                with mode & 2 the data frame holds that part's cut, so
 *                scripts complete sets, break them (duplicates, another
 *                count, a header that changed) and leave them open
 *
 * After each message the inbox is served; every payload it places must be
 * a slot of the arena of exactly the header's length, and is released as
 * the client would; every refusal must name the task.  At the end nothing
 * may be left in the arena.  A crash, leak (ASan/LSan in the replay under
 * build-asan), a slot outside the arena or a leftover slot is a finding.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <zmq.h>

#include "datahelix/arena.h"
#include "datahelix/dataserver.h"
#include "datahelix/wire.h"
#include "fuzz_cursor.h"
#include "runtime/dataserver_internal.h"
#include "runtime/keys.h"
#include "runtime/transport.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define ARENA (1u << 20)
#define RANK 1
/* The payload secrets of remote servers 7 and 8. */
#define SECRET_7 "77777777777777777777777777777777"
#define SECRET_8 "88888888888888888888888888888888"

struct state {
    struct ds_env env;
    uint64_t placed, refused, want_len;
};

static void done(void *arg, const struct ds_done *d)
{
    struct state *s = arg;
    struct dh_err e;

    if (d->kind == DS_DONE_RESULT) {
        if (!dh_arena_ptr(s->env.arena, &d->res.slot) ||
            d->res.slot.len > s->env.arena_cap ||
            (s->want_len != UINT64_MAX && d->res.slot.len != s->want_len))
            abort(); /* a slot outside the arena, or of another size */
        if (dh_arena_release(s->env.arena, &d->res.slot, &e) < 0)
            abort();
        s->placed++;
    } else {
        if (!d->msg || !d->msg[0] || d->code >= 0)
            abort(); /* a refusal must say why */
        s->refused++;
    }
}

/* A ResultNotice from the cursor's bytes, encoded into *buf. */
static int header(struct cursor *c, uint8_t **buf, size_t *len,
                  uint64_t *length, uint64_t *task)
{
    struct dh_wire_msg m;
    struct dh_err e;
    uint64_t ids[4] = {1, 2, 3, 4};
    uint32_t n = take(c) % 4 + 1, rank = (take(c) & 3) ? RANK : RANK + 1;
    uint64_t per = (uint64_t)(take(c) % 64 + 1) * 64;
    uint8_t f32 = take(c) & 1;
    uint8_t lie = take(c) % 8;
    int rc;

    dh_wire_msg_init(&m, DH_WIRE_RESULT_NOTICE);
    if (dh_wire_task_make(&m.u.result.task, 0, 0, take(c) % 8, rank, 0, NULL) <
        0) {
        dh_wire_msg_fini(&m);
        return -1;
    }
    m.u.result.server_id = 7;
    /* server 7's token for this server (3), or now and then server 8's */
    dh__payload_token(lie == 4 ? SECRET_8 : SECRET_7, 3,
                      m.u.result.sender_token);
    *task = m.u.result.task.id;
    m.u.result.dtype = f32 ? DH_DTYPE_F32 : DH_DTYPE_U8;
    m.u.result.ndims = 2;
    m.u.result.dims[0] = lie == 1 ? n + 1 : n; /* lies, now and then */
    m.u.result.dims[1] = per;
    *length = (uint64_t)n * per * (f32 ? 4 : 1);
    if (lie == 2)
        *length += 1;
    if (lie == 3)
        *length = (uint64_t)ARENA * 2;
    m.u.result.length = *length;
    m.u.result.arena_offset = 0;
    rc = dh_wire_set_result_samples(&m.u.result, ids, NULL, n, NULL);
    if (rc == 0)
        rc = dh_wire_encode(&m, buf, len, &e);
    dh_wire_msg_fini(&m);
    return rc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static uint8_t fill[ARENA];
    struct state s = {0};
    struct ds_stats st = {0};
    struct dh_dataserver_opts o;
    struct ds_inbox *in = NULL;
    struct ds_sink sink = {done, &s};
    struct cursor c = {data, size};
    struct dh_err e;
    char ep[64];
    void *ctx = zmq_ctx_new(), *tx;
    int zero = 0;

    snprintf(ep, sizeof(ep), "inproc://fuzz-payload-%d", (int)getpid());
    s.env = (struct ds_env){.server_id = 3,
                            .rank = RANK,
                            .arena_cap = ARENA,
                            .alloc_timeout_ms = 0,
                            .deliver_timeout_ms = 1,
                            .st = &st};
    if (!ctx || dh_arena_create(ARENA, &s.env.arena, &e) < 0)
        abort();
    {
        struct dh_arena_stats as;

        if (dh_arena_stats(s.env.arena, &as) < 0)
            abort();
        s.env.arena_cap = as.capacity;
    }
    dh_dataserver_opts_default(&o);
    o.listen = ep;
    if (dh__ds_inbox_open(&s.env, ctx, &o, &in, &e) < 0)
        abort();
    tx = zmq_socket(ctx, ZMQ_DEALER);
    zmq_setsockopt(tx, ZMQ_LINGER, &zero, sizeof(zero));
    if (!tx || zmq_connect(tx, ep) != 0)
        abort();
    while (c.n >= 2) {
        uint8_t fb = take(&c);
        int frames = fb % 4 + 1;
        uint8_t mode = take(&c);
        uint64_t length = 0, off = 0, cut = 0;
        uint32_t index = (mode >> 3) & 3, count = (uint32_t)(mode >> 5) + 1;

        if (mode & 4) {
            uint8_t pf[DH_TP_PART_HDR];

            dh__tp_part_encode(pf, index, count);
            zmq_send(tx, pf, sizeof(pf), ZMQ_SNDMORE);
        }
        for (int f = 0; f < frames; f++) {
            int more = f + 1 < frames ? ZMQ_SNDMORE : 0;
            uint8_t n = take(&c);
            struct cursor part = {c.p, n < c.n ? n : c.n};

            c.p += part.n;
            c.n -= part.n;
            if (f == 0 && (mode & 1)) {
                uint8_t *buf = NULL;
                size_t len = 0;

                uint64_t task = 0;

                if (header(&part, &buf, &len, &length, &task) < 0) {
                    buf = NULL;
                    len = 0;
                } else if (fb & (16 | 32)) {
                    char tok[DH_WIRE_TOKEN_LEN + 1];

                    dh__payload_token((fb & 16) ? SECRET_7 : SECRET_8, 3, tok);
                    dh__ds_inbox_expect(in, task, (fb & 16) ? 7 : 8, tok);
                }
                zmq_send(tx, buf ? (const void *)buf : "", len, more);
                dh_wire_free(buf);
            } else if (f == 1 && (mode & 2) && length <= ARENA) {
                if (!(mode & 4) ||
                    dh__tp_part_span(length, count, index, &off, &cut) < 0)
                    cut = length;
                zmq_send(tx, fill, (size_t)cut, more);
            } else {
                zmq_send(tx, part.p, part.n, more);
            }
        }
        s.want_len = (mode & 1) ? length : UINT64_MAX;
        for (int turn = 0; turn < 3; turn++) /* the loop's turns */
            dh__ds_inbox_serve(in, sink);
    }
    if (getenv("DH_FUZZ_VERBOSE"))
        fprintf(stderr, "fuzz_payload_seq: %llu placed, %llu refused\n",
                (unsigned long long)s.placed, (unsigned long long)s.refused);
    zmq_close(tx);
    dh__ds_inbox_close(in);
    {
        struct dh_arena_stats as;

        if (dh_arena_stats(s.env.arena, &as) == 0 && as.live_slots != 0)
            abort(); /* every placed payload was released */
    }
    dh_arena_destroy(s.env.arena);
    zmq_ctx_term(ctx);
    return 0;
}
