/* dh_attacker.c - issue 13's attacks from a separate process, for
 * tests/integration/test_attacks.py: a peer with no key and no token that
 * speaks the wire codec to a Coordinator while a real job runs.  For
 * `seconds` it repeatedly: sends Shutdown; registers as the local
 * DataServer and as the client of every rank below `world` (its own
 * token); sends error notices and results for those ranks' likely task
 * ids (passes 0..3, steps 0..15); asks for their tasks with chosen ids.
 * Each socket is a fresh DEALER, so nothing depends on an answer; every
 * send is non-blocking (a full queue drops).  Prints one line with what it
 * sent and exits 0.  Usage: dh_attacker ENDPOINT WORLD SECONDS */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <zmq.h>

#include "datahelix/wire.h"

static unsigned long sent;

static void send_msg(void *s, const struct dh_wire_msg *m)
{
    uint8_t *buf = NULL;
    size_t len = 0;

    if (dh_wire_encode(m, &buf, &len, NULL) < 0)
        return;
    if (zmq_send(s, buf, len, ZMQ_DONTWAIT) == (int)len)
        sent++;
    dh_wire_free(buf);
}

static double now_s(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void one_round(void *ctx, const char *ep, uint32_t world, unsigned k)
{
    void *s = zmq_socket(ctx, ZMQ_DEALER);
    int one = 1, linger = 500;
    struct dh_wire_msg m;
    uint64_t ids[24];
    zmq_pollitem_t it;

    if (!s)
        return;
    /* Queue only on a finished connection, and let what was queued out
     * before the socket closes (bounded). */
    zmq_setsockopt(s, ZMQ_IMMEDIATE, &one, sizeof(one));
    zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof(linger));
    it = (zmq_pollitem_t){.socket = s, .events = ZMQ_POLLOUT};
    if (zmq_connect(s, ep) != 0 || zmq_poll(&it, 1, 2000) != 1) {
        zmq_close(s);
        return;
    }
    for (int i = 0; i < 24; i++)
        ids[i] = 0; /* "train on one sample 24 times" */
    dh_wire_msg_init(&m, DH_WIRE_SHUTDOWN);
    snprintf(m.u.shutdown.reason, sizeof(m.u.shutdown.reason), "attacker");
    send_msg(s, &m);
    for (uint32_t r = 0; r < world; r++) {
        dh_wire_msg_init(&m, DH_WIRE_REGISTER_SERVER);
        m.u.register_server.server_id = 1000 + r + k * world;
        snprintf(m.u.register_server.addr, sizeof(m.u.register_server.addr),
                 "tcp://127.0.0.1:9");
        m.u.register_server.role = DH_WIRE_ROLE_LOCAL;
        m.u.register_server.rank = r;
        m.u.register_server.workers = 1;
        m.u.register_server.arena_bytes = 1 << 20;
        snprintf(m.u.register_server.token, sizeof(m.u.register_server.token),
                 "%032x", 0xbad0000u + k);
        send_msg(s, &m);
        dh_wire_msg_init(&m, DH_WIRE_REGISTER_CLIENT);
        m.u.register_client.rank = r;
        m.u.register_client.world_size = world;
        snprintf(m.u.register_client.token, sizeof(m.u.register_client.token),
                 "%032x", 0xbad0000u + k);
        send_msg(s, &m);
        for (uint32_t pass = 0; pass < 4; pass++)
            for (uint32_t step = 0; step < 16; step++) {
                struct dh_wire_task t;

                if (dh_wire_task_make(&t, 0, pass, step, r, 0, NULL) < 0)
                    continue;
                dh_wire_msg_init(&m, DH_WIRE_ERROR_NOTICE);
                m.u.error.task = t;
                m.u.error.server_id = r + 1;
                m.u.error.cause = DH_EIO;
                send_msg(s, &m);
                dh_wire_msg_init(&m, DH_WIRE_DESCRIPTOR_REQUEST);
                m.u.request.task = t;
                m.u.request.requester_rank = r;
                if (dh_wire_set_samples(&m.u.request, ids, 24, NULL) == 0)
                    send_msg(s, &m);
                dh_wire_msg_fini(&m);
            }
    }
    zmq_close(s);
}

int main(int argc, char **argv)
{
    void *ctx;
    double end, secs = 0;
    unsigned long world = 0;
    unsigned k = 0;
    char *e1 = NULL, *e2 = NULL;

    if (argc == 4) {
        world = strtoul(argv[2], &e1, 10);
        secs = strtod(argv[3], &e2);
    }
    if (argc != 4 || *e1 || *e2 || world < 1 || world > 64 || secs <= 0 ||
        secs > 600) {
        fprintf(stderr, "usage: dh_attacker ENDPOINT WORLD(1..64) "
                        "SECONDS(0..600]\n");
        return 2;
    }
    if (!(ctx = zmq_ctx_new()))
        return 1;
    end = now_s() + secs;
    while (now_s() < end) {
        struct timespec ts = {0, 20000000};

        one_round(ctx, argv[1], (uint32_t)world, k++);
        nanosleep(&ts, NULL);
    }
    zmq_ctx_term(ctx);
    printf("dh_attacker: %u rounds, %lu messages sent\n", k, sent);
    return 0;
}
