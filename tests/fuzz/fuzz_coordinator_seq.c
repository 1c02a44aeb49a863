/*
 * fuzz_coordinator_seq.c - libFuzzer target (issue 13 item 8): SEQUENCES of
 * messages into the Coordinator's handlers, not single frames into the
 * decoder.  Each input is a script of records for one fresh Coordinator:
 *
 *   op:u8 peer:u8 len:u8 bytes[len]
 *     op % 4 == 0  raw: `bytes` as a received envelope (mostly malformed)
 *     op % 4 == 1  built: a well-formed message chosen and filled from
 *                  `bytes` (type, rank, server id, step, token right or
 *                  wrong, ids, causes), so that scripts reach registered
 *                  servers, routed tasks, results, re-routes and refusals
 *     op % 4 == 2  time passes: bytes[0] x 16 ms, then the timers run
 *                  (heartbeat deaths, request expiry)
 *     op % 4 == 3  built, from the admin key (the owner)
 *
 * from one of 6 routing ids (`peer` % 6), through dh__co_feed(), which does
 * what the event loop does with a received frame.  Replies go to routing
 * ids nobody holds and are dropped.  After every record the counters must
 * hold their bounds; at the end everything is freed (ASan/LSan in the
 * replay under build-asan).  A crash, hang, leak or broken bound is a
 * finding.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "datahelix/coordinator.h"
#include "datahelix/wire.h"
#include "fuzz_cursor.h"
#include "runtime/coordinator_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define PEERS 6
#define MAX_INFLIGHT 64
#define MAX_PENDING 32

/* Rank r's token as the job's client and server hold it; odd bytes give
 * a stranger's. */
static void token(char *out, uint32_t rank, int wrong)
{
    for (unsigned i = 0; i < DH_WIRE_TOKEN_LEN; i++)
        out[i] = "0123456789abcdef"[(rank * 7 + i + (wrong ? 3 : 0)) & 15];
    out[DH_WIRE_TOKEN_LEN] = 0;
}

static struct dh_wire_task task_of(struct cursor *c, uint32_t rank)
{
    struct dh_wire_task t;
    /* One at a time: the order of a call's arguments is unspecified. */
    uint8_t epoch = take(c) & 1, pass = take(c) & 1;
    uint8_t step = take(c) & 15, mb = take(c) & 1;

    if (dh_wire_task_make(&t, epoch, pass, step, rank, mb, NULL) < 0)
        memset(&t, 0, sizeof(t));
    return t;
}

/* A well-formed message built from the cursor; 0, or -1 if none. */
static int build(struct cursor *c, struct dh_wire_msg *m)
{
    uint8_t kind = take(c) % 9;
    uint32_t rank = take(c) % 3;
    uint32_t sid = take(c) % 5 + 1;
    uint64_t ids[4];
    uint32_t n = take(c) % 4 + 1;

    for (uint32_t i = 0; i < n; i++)
        ids[i] = take(c) % 24;
    switch (kind) {
    case 0:
        dh_wire_msg_init(m, DH_WIRE_REGISTER_CLIENT);
        m->u.register_client.rank = rank;
        m->u.register_client.world_size = 3;
        m->u.register_client.pid = 1;
        token(m->u.register_client.token, rank, take(c) & 1);
        return 0;
    case 1:
    case 2: {
        int local = kind == 1;

        dh_wire_msg_init(m, DH_WIRE_REGISTER_SERVER);
        m->u.register_server.server_id = sid;
        snprintf(m->u.register_server.addr, sizeof(m->u.register_server.addr),
                 "tcp://127.0.0.1:%u", 9000 + sid);
        m->u.register_server.role = local ? DH_WIRE_ROLE_LOCAL
                                          : DH_WIRE_ROLE_REMOTE;
        m->u.register_server.rank = local ? rank : 0;
        m->u.register_server.workers = take(c) % 3 + 1;
        m->u.register_server.arena_bytes = local ? 1u << 20 : 0;
        if (local)
            token(m->u.register_server.token, rank, take(c) & 1);
        return 0;
    }
    case 3:
        dh_wire_msg_init(m, DH_WIRE_HEARTBEAT);
        m->u.heartbeat.server_id = sid;
        m->u.heartbeat.seq = take(c);
        m->u.heartbeat.queue_depth = take(c) % 8;
        m->u.heartbeat.busy_workers = take(c) % 3;
        m->u.heartbeat.latency_ms = take(c);
        m->u.heartbeat.leaving = (take(c) & 7) == 0;
        return 0;
    case 4:
        dh_wire_msg_init(m, DH_WIRE_DESCRIPTOR_REQUEST);
        m->u.request.task = task_of(c, rank);
        m->u.request.requester_rank = (take(c) & 7) ? rank : (rank + 1) % 3;
        m->u.request.slack_ms = (int64_t)take(c) * 10 - 500;
        m->u.request.hints.est_cpu_ms = take(c);
        m->u.request.hints.local_only = take(c) & 1;
        return dh_wire_set_samples(&m->u.request, ids, n, NULL) < 0 ? -1 : 0;
    case 5:
    case 6:
        dh_wire_msg_init(m, DH_WIRE_RESULT_NOTICE);
        m->u.result.task = task_of(c, rank);
        m->u.result.server_id = sid;
        m->u.result.arena_offset = 4096u * take(c);
        m->u.result.length = 64;
        m->u.result.slot_generation = take(c);
        m->u.result.dims[0] = 64;
        m->u.result.ndims = 1;
        m->u.result.dtype = DH_DTYPE_U8;
        return dh_wire_set_result_samples(&m->u.result, ids, NULL, n, NULL) < 0
                   ? -1
                   : 0;
    case 7:
        dh_wire_msg_init(m, DH_WIRE_ERROR_NOTICE);
        m->u.error.task = task_of(c, rank);
        m->u.error.server_id = sid;
        m->u.error.sample_id = ids[0];
        m->u.error.cause = (take(c) & 1) ? DH_EPEERDEAD : DH_EMEDIA;
        snprintf(m->u.error.message, sizeof(m->u.error.message), "fuzz");
        return 0;
    default:
        dh_wire_msg_init(m, DH_WIRE_SHUTDOWN);
        snprintf(m->u.shutdown.reason, sizeof(m->u.shutdown.reason), "fuzz");
        return 0;
    }
}

static void check_bounds(const struct dh_coordinator *c)
{
    struct dh_coordinator_stats s;

    dh_coordinator_stats(c, &s);
    if (s.inflight > MAX_INFLIGHT || s.pending > MAX_PENDING + MAX_INFLIGHT ||
        s.servers > 16 || s.results > s.requests)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct dh_coordinator_opts o;
    struct dh_coordinator *c = NULL;
    struct dh_err e;
    struct cursor in = {data, size};
    char ep[64];
    uint64_t now = 1000000;

    dh_coordinator_opts_default(&o);
    snprintf(ep, sizeof(ep), "inproc://fuzz-co-%d", (int)getpid());
    o.listen = ep;
    o.max_servers = 16;
    o.max_clients = 8;
    o.max_inflight = MAX_INFLIGHT;
    o.max_pending = MAX_PENDING;
    o.heartbeat_timeout_ms = 1000;
    o.metrics_interval_ms = 1; /* the metrics hooks ride along */
    if (dh_coordinator_create(&o, &c, &e) < 0)
        abort();
    /* Replies go to routing ids nobody holds: counted, not logged (the
     * refusal lines are rate-limited by the Coordinator itself). */
    c->quiet = !getenv("DH_FUZZ_VERBOSE");
    while (in.n >= 3) {
        uint8_t op = take(&in);
        uint8_t who = take(&in) % PEERS;
        uint8_t len = take(&in);
        uint8_t id[2] = {'p', (uint8_t)('0' + who)};
        struct cursor rec = {in.p, len < in.n ? len : in.n};
        struct dh_wire_msg m;
        uint8_t *buf = NULL;
        size_t n = 0;

        in.p += rec.n;
        in.n -= rec.n;
        switch (op % 4) {
        case 0:
            dh__co_feed(c, id, sizeof(id), rec.p, rec.n, 0, now);
            break;
        case 2:
            now += 16u * take(&rec);
            dh__co_tick(c, now);
            dh__co_mx_tick(c, now);
            break;
        default:
            if (build(&rec, &m) == 0 && dh_wire_encode(&m, &buf, &n, &e) == 0)
                dh__co_feed(c, id, sizeof(id), buf, n, op % 4 == 3, now);
            dh_wire_free(buf);
            dh_wire_msg_fini(&m);
        }
        check_bounds(c);
        now += 1;
    }
    {
        char *text = NULL;
        size_t len = 0;

        dh__co_mx_tick(c, now + 1000);
        if (dh_coordinator_metrics_text(c, &text, &len) < 0 || !len ||
            text[len - 1] != '\n')
            abort(); /* every published figure formats */
        free(text);
    }
    dh_coordinator_destroy(c);
    return 0;
}
