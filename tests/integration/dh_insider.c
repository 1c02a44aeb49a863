/* dh_insider.c - issue 36's insider, for tests/integration/
 * test_trust_round3.py and `make soak`: a process that holds the job's key
 * (so every door opens to it) and misbehaves in each way the red team
 * found, while a real job runs.  For `seconds` it:
 *   - is a remote sidecar (server SERVER_ID) that heartbeats as a healthy
 *     one and takes the tasks placed on it, answering every other one with
 *     a forged "corrupt media" ErrorNotice and never answering the rest;
 *   - races the real remote VICTIM_ID at each INBOX (the ranks' payload
 *     endpoints, given, or learnt from the Routes placed on it, which name
 *     their delivery targets) with payloads naming VICTIM_ID for the tasks
 *     of ranks 0..3, passes 0..1, steps 0..31, with made-up sender tokens;
 *   - parks payloads for tasks nobody placed there (the inbox stall).
 * A Coordinator that does not know it (restarted) gets its registration
 * again.  Every send is non-blocking; prints one line of counts and exits 0.
 * Usage: dh_insider KEYFILE COORDINATOR SECONDS SERVER_ID VICTIM_ID
 *        [INBOX...]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <zmq.h>

#include "datahelix/wire.h"
#include "runtime/keys.h"

#define MAX_INBOX 8

static unsigned long sent, lies, silent, routes, forged;
static void *ctx;
static const struct dh_keys *keys;
static void *in[MAX_INBOX];
static char in_addr[MAX_INBOX][DH_WIRE_MAX_ADDR + 1];
static int n_in;

static double now_s(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void *keyed(void *zctx, const char *ep, const struct dh_keys *k)
{
    void *s = zmq_socket(zctx, ZMQ_DEALER);
    int linger = 0, hwm = 64;

    if (!s)
        return NULL;
    zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof(linger));
    zmq_setsockopt(s, ZMQ_SNDHWM, &hwm, sizeof(hwm));
    zmq_setsockopt(s, ZMQ_CURVE_SERVERKEY, dh__keys_server(k), DH_KEY_Z85_LEN);
    zmq_setsockopt(s, ZMQ_CURVE_PUBLICKEY, k->pub, DH_KEY_Z85_LEN);
    zmq_setsockopt(s, ZMQ_CURVE_SECRETKEY, k->sec, DH_KEY_Z85_LEN);
    if (zmq_connect(s, ep) != 0) {
        zmq_close(s);
        return NULL;
    }
    return s;
}

static int send_msg(void *s, const struct dh_wire_msg *m, int more)
{
    uint8_t *buf = NULL;
    size_t len = 0;
    int ok;

    if (dh_wire_encode(m, &buf, &len, NULL) < 0)
        return -1;
    ok = zmq_send(s, buf, len, ZMQ_DONTWAIT | more) == (int)len;
    sent += ok;
    dh_wire_free(buf);
    return ok ? 0 : -1;
}

static void hex(char *out, size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] = "0123456789abcdef"[rand() & 15];
    out[n] = '\0';
}

static void register_server(void *s, uint32_t id)
{
    struct dh_wire_msg m;

    dh_wire_msg_init(&m, DH_WIRE_REGISTER_SERVER);
    m.u.register_server.server_id = id;
    snprintf(m.u.register_server.addr, sizeof(m.u.register_server.addr),
             "remote:server-%u", id);
    m.u.register_server.role = DH_WIRE_ROLE_REMOTE;
    m.u.register_server.workers = 4;
    hex(m.u.register_server.sender_secret, DH_WIRE_TOKEN_LEN);
    send_msg(s, &m, 0);
}

static void heartbeat(void *s, uint32_t id, uint64_t seq)
{
    struct dh_wire_msg m;

    dh_wire_msg_init(&m, DH_WIRE_HEARTBEAT);
    m.u.heartbeat.server_id = id;
    m.u.heartbeat.seq = seq;
    m.u.heartbeat.latency_ms = 1;
    send_msg(s, &m, 0);
}

static void *keyed(void *zctx, const char *ep, const struct dh_keys *k);

/* A payload endpoint to forge at, once. */
static void add_inbox(const char *ep)
{
    for (int i = 0; i < n_in; i++)
        if (!strcmp(in_addr[i], ep))
            return;
    if (n_in == MAX_INBOX || strncmp(ep, "tcp://", 6) ||
        !(in[n_in] = keyed(ctx, ep, keys)))
        return;
    snprintf(in_addr[n_in], sizeof(in_addr[n_in]), "%s", ep);
    n_in++;
}

static void register_server(void *s, uint32_t id);

/* The Routes placed on this "sidecar": every other one a lie, the rest
 * silence. */
static void serve(void *s, uint32_t id)
{
    for (int i = 0; i < 64; i++) {
        struct dh_wire_msg m, out;
        uint8_t buf[1 << 16];
        int n = zmq_recv(s, buf, sizeof(buf), ZMQ_DONTWAIT);

        if (n < 0)
            return;
        if (n > (int)sizeof(buf) || dh_wire_decode(buf, (size_t)n, &m, NULL))
            continue;
        if (m.type == DH_WIRE_HEARTBEAT && m.u.heartbeat.unknown)
            register_server(s, id); /* a restarted Coordinator */
        if (m.type == DH_WIRE_ROUTE && m.u.route.has_request &&
            m.u.route.server_id == id) {
            add_inbox(m.u.route.target_addr);
            if (routes++ % 2 == 0) {
                dh_wire_msg_init(&out, DH_WIRE_ERROR_NOTICE);
                out.u.error.task = m.u.route.task;
                out.u.error.server_id = id;
                out.u.error.sample_id = m.u.route.request.sample_ids[0];
                out.u.error.cause = DH_EMEDIA;
                snprintf(out.u.error.message, sizeof(out.u.error.message),
                         "corrupt media (a lie)");
                lies += send_msg(s, &out, 0) == 0;
            } else {
                silent++;
            }
        }
        dh_wire_msg_fini(&m);
    }
}

/* A 64-byte payload of one sample for task (pass, step, rank). */
static void forge(void *s, uint32_t victim, uint32_t pass, uint32_t step,
                  uint32_t rank)
{
    static const uint8_t data[64];
    struct dh_wire_msg m;
    uint64_t id = 0;
    uint32_t valid = 1;

    dh_wire_msg_init(&m, DH_WIRE_RESULT_NOTICE);
    if (dh_wire_task_make(&m.u.result.task, 0, pass, step, rank, 0, NULL) ||
        dh_wire_set_result_samples(&m.u.result, &id, &valid, 1, NULL)) {
        dh_wire_msg_fini(&m);
        return;
    }
    m.u.result.server_id = victim;
    m.u.result.length = sizeof(data);
    m.u.result.ndims = 2;
    m.u.result.dims[0] = 1;
    m.u.result.dims[1] = sizeof(data);
    hex(m.u.result.sender_token, DH_WIRE_TOKEN_LEN);
    if (send_msg(s, &m, ZMQ_SNDMORE) == 0 &&
        zmq_send(s, data, sizeof(data), ZMQ_DONTWAIT) == (int)sizeof(data))
        forged++;
    dh_wire_msg_fini(&m);
}

int main(int argc, char **argv)
{
    void *co;
    struct dh_keys k;
    struct dh_err e;
    double stop, secs = 0, next_hb = 0;
    unsigned long id, victim;
    uint64_t seq = 0;
    unsigned round = 0;
    char *end = NULL;

    if (argc >= 6)
        secs = strtod(argv[3], &end);
    if (argc < 6 || argc - 6 > MAX_INBOX || !end || *end || secs <= 0 ||
        secs > 600 || !(id = strtoul(argv[4], NULL, 10)) ||
        !(victim = strtoul(argv[5], NULL, 10))) {
        fprintf(stderr, "usage: dh_insider KEYFILE COORDINATOR SECONDS "
                        "SERVER_ID VICTIM_ID [INBOX...] (0..8)\n");
        return 2;
    }
    if (dh__keys_load(argv[1], &k, &e) < 0) {
        fprintf(stderr, "dh_insider: %s\n", e.msg);
        return 2;
    }
    srand((unsigned)getpid());
    keys = &k;
    if (!(ctx = zmq_ctx_new()) || !(co = keyed(ctx, argv[2], &k)))
        return 1;
    for (int i = 6; i < argc; i++)
        add_inbox(argv[i]);
    register_server(co, (uint32_t)id);
    stop = now_s() + secs;
    while (now_s() < stop) {
        struct timespec ts = {0, 20000000};

        if (now_s() >= next_hb) {
            heartbeat(co, (uint32_t)id, ++seq);
            next_hb = now_s() + 0.2;
        }
        serve(co, (uint32_t)id);
        for (int i = 0; i < n_in; i++) {
            uint32_t step = round % 32, pass = (round / 32) % 2;

            for (uint32_t r = 0; r < 4; r++)
                forge(in[i], (uint32_t)victim, pass, step, r);
            forge(in[i], (uint32_t)victim, 0, 900 + round % 64, 0);
        }
        round++;
        nanosleep(&ts, NULL);
    }
    for (int i = 0; i < n_in; i++)
        zmq_close(in[i]);
    zmq_close(co);
    zmq_ctx_term(ctx);
    dh__keys_wipe(&k);
    printf("dh_insider: %lu routes taken, %lu lies, %lu silent, %lu forged "
           "payloads, %lu messages sent\n",
           routes, lies, silent, forged, sent);
    return 0;
}
