/*
 * bench_route.c - the Coordinator's routing throughput (issue 4: "64
 * registered DataServers, requests from 8 clients: requests/s and
 * µs/decision").  Never pass/fail; prints a markdown table (and, with
 * --json, one JSON line after it).
 *
 * Setup per run: a real Coordinator (dh_coordinator_create, run on its own
 * thread, listening on tcp://127.0.0.1:0 or an ipc:// socket in a temp
 * folder, telemetry into a file there).  On the main thread, 64 fake
 * DataServers - ZeroMQ DEALERs speaking the wire codec: servers 1..8 are
 * LOCAL to ranks 0..7, 9..64 REMOTE, 4 workers each (queue cap 4 x 4 = 16
 * tasks) - register, heartbeat every 500 ms and answer every Route that
 * carries a request with an immediate ResultNotice; 8 fake clients
 * (ranks 0..7) register, then keep K descriptor requests each in flight
 * (distinct task ids from dh_wire_task_make: epoch = pass = phase, step = the
 * client's sequence, rank) and send the next one as each result arrives.
 * All 72 peers share one zmq_poll loop.
 *
 * Measured per run, after a warm-up phase (default 10,000 requests):
 * requests completed per second end to end (DescriptorRequest sent ->
 * Route -> ResultNotice forwarded back to the client) over N requests
 * (default 100,000), the end-to-end latency of each request, the CPU time
 * of the coordinator's thread per request (its ZeroMQ I/O thread not
 * included), and the coordinator's own decision time: its telemetry line
 * per decision carries decide_us (fill the request + dh_place_decide),
 * parsed after the run.  R runs per policy (round-robin, least-request,
 * deadline; default R = 5); requests/s and CPU/request are medians of the
 * R runs, decide_us and latency percentiles are over every timed decision
 * / request of the R runs.  Peer: the same runs with telemetry off
 * (interleaved), which prices the telemetry line the coordinator formats
 * and flushes per decision.  On 2 cores the peers, the coordinator and
 * two ZeroMQ I/O threads share the CPU: requests/s is the whole loop's,
 * the coordinator's CPU/request is its own share.
 *
 * Every wait is bounded: setup 5 s, no completion for 5 s fails the run,
 * the coordinator thread must stop within 2 s.  Errors end the bench with
 * "bench_route: <what>: <why>" and exit status 1.
 *
 * Cost of security (issue 13, docs/security.md): after the policy table,
 * the same routing runs (least-request, telemetry off, --sec-requests
 * requests after a 5,000 warm-up) with every peer on CURVE (a job key, the
 * Coordinator's ZAP handler) and without, interleaved, R runs each; and
 * the real payload path (bench_payload.c): a sidecar's payload link
 * streaming 4 MiB batches (64 per run after 8 untimed) into a local
 * DataServer's inbox and arena over tcp://127.0.0.1, each end in its own
 * context as in two processes, unstriped (1 connection) and striped (a
 * DataServer's default width, or --stripes), CURVE on and off
 * interleaved; the CPU time per byte of each (getrusage over the timed
 * batches, both ends), which bounds each rate on this machine's CPUs; and
 * one core's cipher, AES-256-GCM and memcpy rates.
 * Medians and ratios.
 *
 * Cost of the metrics endpoint (--metrics-only; docs/metrics.md): the same
 * routing runs (least-request, telemetry off, --sec-requests requests) with
 * the metrics figures off, and on with a publication every 10 ms (50 times
 * the default) and a reader thread taking the text every 10 ms (what one
 * HTTP scrape does, 100 a second), interleaved, R runs each: requests/s
 * and the coordinator thread's CPU per request, medians and ratios.
 *
 * Usage: bench_route [--requests N] [--warmup N] [--reps R] [--inflight K]
 *                    [--policy P[,P...]] [--ipc] [--no-peer] [--json]
 *                    [--security-only | --no-security] [--sec-requests N]
 *                    [--stripes N] [--pay-count N] [--metrics-only]
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <zmq.h>

#include "datahelix/coordinator.h"
#include "datahelix/wire.h"
#include "runtime/keys.h"
#include "runtime/transport.h"

#include "bench_payload.h"

#define NSERVERS 64
#define NCLIENTS 8
#define NLOCAL 8 /* servers 1..NLOCAL are local to ranks 0..NLOCAL-1 */
#define WORKERS 4
#define SAMPLES 4 /* sample ids per request */
#define HB_MS 500.0
#define HB_TIMEOUT_MS 10000 /* generous: 2 noisy cores */
#define SETUP_MS 5000.0
#define STALL_MS 5000.0
#define STOP_MS 2000.0
#define BURST 64
#define MAX_REPS 101
#define MAX_POLICIES 3
#define EPOCH_WARMUP 1u
#define EPOCH_TIMED 2u
#define NPEERS (NSERVERS + NCLIENTS)

struct opts {
    long requests, warmup;
    int reps, inflight, ipc, peer, json;
    int curve;   /* this run: every peer on CURVE with a job key */
    int metrics; /* this run: metrics on, a reader every 10 ms */
    int metrics_only;
    int security; /* 1: also the CURVE section, 2: only it, 0: not */
    long sec_requests;
    unsigned stripes; /* payload link width (0: a DataServer's default) */
    int pay_count;    /* timed payload batches per run */
    const char *policy[MAX_POLICIES];
    int npolicy;
};

struct peer {
    void *sock;
    uint32_t id;      /* server: wire id */
    int32_t rank;     /* client: rank; server: rank served, or -1 */
    long share, sent; /* client: requests of this phase, sent so far */
    int inflight;
};

/* One phase (warm-up or timed) of a run. */
struct phase {
    uint32_t epoch;
    long n, completed;
    double *sent_us; /* by step * NCLIENTS + rank; < 0: completed */
    double *lat_us;  /* end-to-end latency of each completed request */
    uint64_t routes, local_routes;
    double last_progress_us;
};

/* One Coordinator and its fake peers. */
struct run {
    const struct opts *o;
    struct dh_coordinator *c;
    pthread_t th, reader;
    int started, reading;
    volatile int stop_reader;
    long reads;
    volatile int stop;
    int finished; /* atomic */
    int run_rc;
    struct dh_err run_err;
    void *ctx;
    struct peer peers[NPEERS]; /* servers first, then clients */
    zmq_pollitem_t items[NPEERS];
    char dir[64], tel_path[96], key_path[96];
    struct dh_keys keys; /* o->curve: the job key every peer holds */
    FILE *tel;
    double next_hb_us;
    uint64_t hb_seq;
    struct phase ph;
};

/* What one run yields. */
struct sample {
    double req_per_s;
    double *decide_us; /* owned; timed decisions */
    size_t ndecide, backpressure;
    double *lat_us; /* owned; timed requests */
    size_t nlat;
    double local_pct;
    double co_cpu_us; /* coordinator thread CPU per timed request */
};

/* ---- small helpers ---- */

static double now_us(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static void die(const char *what, const char *why)
{
    fprintf(stderr, "bench_route: %s: %s\n", what, why);
    exit(1);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;

    return (x > y) - (x < y);
}

/* The q-quantile of v (sorted in place); 0 for an empty set. */
static double quantile(double *v, size_t n, double q)
{
    size_t i;

    if (n == 0)
        return 0;
    qsort(v, n, sizeof(*v), cmp_double);
    i = (size_t)(q * (double)(n - 1) + 0.5);
    return v[i < n ? i : n - 1];
}

static double median(double *v, size_t n)
{
    if (n == 0)
        return 0;
    qsort(v, n, sizeof(*v), cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* CPU seconds the coordinator thread has used (0 if unknown). */
static double thread_cpu_s(pthread_t th)
{
    struct timespec ts;
    clockid_t id;

    if (pthread_getcpuclockid(th, &id) != 0 || clock_gettime(id, &ts) != 0)
        return 0;
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- the wire ---- */

static int send_msg(void *sock, const struct dh_wire_msg *m, struct dh_err *e)
{
    uint8_t *buf = NULL;
    size_t len = 0;
    int rc = dh_wire_encode(m, &buf, &len, e);

    if (rc < 0)
        return rc;
    if (zmq_send(sock, buf, len, 0) != (int)len)
        rc = dh_err_set(e, DH_EIO, "send %s: %s", dh_wire_type_name(m->type),
                        zmq_strerror(zmq_errno()));
    dh_wire_free(buf);
    return rc;
}

/* 1: *m holds a message (dh_wire_msg_fini it), 0: none waiting, <0. */
static int recv_msg(void *sock, struct dh_wire_msg *m, struct dh_err *e)
{
    zmq_msg_t f;
    int rc;

    zmq_msg_init(&f);
    if (zmq_msg_recv(&f, sock, ZMQ_DONTWAIT) < 0) {
        rc = zmq_errno() == EAGAIN || zmq_errno() == EINTR
                 ? 0
                 : dh_err_set(e, DH_EIO, "receive: %s",
                              zmq_strerror(zmq_errno()));
    } else {
        rc = dh_wire_decode(zmq_msg_data(&f), zmq_msg_size(&f), m, e);
        rc = rc < 0 ? rc : 1;
    }
    zmq_msg_close(&f);
    return rc;
}

/* ---- the coordinator thread ---- */

/* What an HTTP scrape costs the process: the published text, every
 * 10 ms, on a thread of its own. */
static void *metrics_reader(void *arg)
{
    struct run *r = arg;
    struct timespec ts = {0, 10000000};

    while (!r->stop_reader) {
        char *t = NULL;
        size_t len;

        if (dh_coordinator_metrics_text(r->c, &t, &len) == 0) {
            free(t);
            r->reads++;
        }
        nanosleep(&ts, NULL);
    }
    return NULL;
}

static void *coordinator_main(void *arg)
{
    struct run *r = arg;

    r->run_rc = dh_coordinator_run(r->c, &r->stop, &r->run_err);
    __atomic_store_n(&r->finished, 1, __ATOMIC_SEQ_CST);
    return NULL;
}

static int start_coordinator(struct run *r, const char *policy, int tel,
                             struct dh_err *e)
{
    struct dh_coordinator_opts co;
    char listen[128];
    int rc;

    snprintf(r->dir, sizeof(r->dir), "%s/bench_route.XXXXXX",
             getenv("TMPDIR") && strlen(getenv("TMPDIR")) < 32
                 ? getenv("TMPDIR")
                 : "/tmp");
    if (!mkdtemp(r->dir)) {
        r->dir[0] = '\0';
        return dh_err_set(e, DH_EIO, "mkdtemp: %s", strerror(errno));
    }
    snprintf(r->tel_path, sizeof(r->tel_path), "%s/telemetry.jsonl", r->dir);
    if (tel && !(r->tel = fopen(r->tel_path, "w+")))
        return dh_err_set(e, DH_EIO, "%s: %s", r->tel_path, strerror(errno));
    snprintf(listen, sizeof(listen), "ipc://%s/co.sock", r->dir);
    dh_coordinator_opts_default(&co);
    co.listen = r->o->ipc ? listen : "tcp://127.0.0.1:0";
    co.policy = policy;
    co.heartbeat_timeout_ms = HB_TIMEOUT_MS;
    co.telemetry = r->tel;
    if (r->o->curve) {
        snprintf(r->key_path, sizeof(r->key_path), "%s/job.key", r->dir);
        if ((rc = dh__keys_generate(&r->keys, e)) < 0 ||
            (rc = dh__keys_write(r->key_path, &r->keys, 0, e)) < 0)
            return rc;
        co.keyfile = r->key_path;
    }
    co.metrics_interval_ms = r->o->metrics ? 10 : 0;
    if ((rc = dh_coordinator_create(&co, &r->c, e)) < 0)
        return rc;
    if (pthread_create(&r->th, NULL, coordinator_main, r) != 0)
        return dh_err_set(e, DH_EIO, "pthread_create failed");
    r->started = 1;
    if (r->o->metrics) {
        if (pthread_create(&r->reader, NULL, metrics_reader, r) != 0)
            return dh_err_set(e, DH_EIO, "pthread_create failed");
        r->reading = 1;
    }
    return 0;
}

/* ---- peers: setup ---- */

static int open_peer(struct run *r, struct peer *p, struct dh_err *e)
{
    int zero = 0, to = 1000, hwm = 100000;

    if (!(p->sock = zmq_socket(r->ctx, ZMQ_DEALER)))
        return dh_err_set(e, DH_EIO, "socket: %s", zmq_strerror(zmq_errno()));
    zmq_setsockopt(p->sock, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_setsockopt(p->sock, ZMQ_SNDTIMEO, &to, sizeof(to));
    zmq_setsockopt(p->sock, ZMQ_SNDHWM, &hwm, sizeof(hwm));
    zmq_setsockopt(p->sock, ZMQ_RCVHWM, &hwm, sizeof(hwm));
    if (r->o->curve && /* what transport.c sets on a connecting socket */
        (zmq_setsockopt(p->sock, ZMQ_CURVE_SERVERKEY, r->keys.pub, 40) < 0 ||
         zmq_setsockopt(p->sock, ZMQ_CURVE_PUBLICKEY, r->keys.pub, 40) < 0 ||
         zmq_setsockopt(p->sock, ZMQ_CURVE_SECRETKEY, r->keys.sec, 40) < 0))
        return dh_err_set(e, DH_EIO, "curve: %s", zmq_strerror(zmq_errno()));
    if (zmq_connect(p->sock, dh_coordinator_endpoint(r->c)) < 0)
        return dh_err_set(e, DH_EIO, "connect %s: %s",
                          dh_coordinator_endpoint(r->c),
                          zmq_strerror(zmq_errno()));
    return 0;
}

static int register_server(struct peer *p, struct dh_err *e)
{
    struct dh_wire_msg m;
    struct dh_wire_register_server *s = &m.u.register_server;

    dh_wire_msg_init(&m, DH_WIRE_REGISTER_SERVER);
    s->server_id = p->id;
    snprintf(s->addr, sizeof(s->addr), "ipc://bench-server-%u", p->id);
    s->role = p->rank >= 0 ? DH_WIRE_ROLE_LOCAL : DH_WIRE_ROLE_REMOTE;
    s->rank = p->rank >= 0 ? (uint32_t)p->rank : 0;
    s->workers = WORKERS;
    s->arena_bytes = (uint64_t)1 << 30;
    snprintf(s->host, sizeof(s->host), "bench");
    if (p->rank >= 0) /* the rank's token, shared with its client */
        snprintf(s->token, sizeof(s->token), "%032x", (unsigned)p->rank + 1);
    return send_msg(p->sock, &m, e);
}

static int register_client(struct peer *p, struct dh_err *e)
{
    struct dh_wire_msg m;
    struct dh_wire_register_client *c = &m.u.register_client;

    dh_wire_msg_init(&m, DH_WIRE_REGISTER_CLIENT);
    c->rank = (uint32_t)p->rank;
    c->world_size = NCLIENTS;
    c->pid = (uint32_t)getpid();
    snprintf(c->host, sizeof(c->host), "bench");
    snprintf(c->server_addr, sizeof(c->server_addr), "ipc://bench-server-%d",
             p->rank + 1);
    snprintf(c->token, sizeof(c->token), "%032x", (unsigned)p->rank + 1);
    return send_msg(p->sock, &m, e);
}

/* Waits (bounded) for the echo of every registration. */
static int wait_acks(struct run *r, struct dh_err *e)
{
    int acked[NPEERS] = {0}, left = NPEERS;
    double end = now_us() + SETUP_MS * 1e3;

    while (left > 0) {
        double t = now_us();

        if (t >= end)
            return dh_err_set(e, DH_ETIMEOUT,
                              "%d of %d peers not "
                              "registered after %.0f ms",
                              left, NPEERS, SETUP_MS);
        if (zmq_poll(r->items, NPEERS, (long)((end - t) / 1e3) + 1) < 0 &&
            zmq_errno() != EINTR)
            return dh_err_set(e, DH_EIO, "poll: %s", zmq_strerror(zmq_errno()));
        for (int i = 0; i < NPEERS; i++) {
            struct dh_wire_msg m;
            int rc = recv_msg(r->peers[i].sock, &m, e);
            enum dh_wire_type want = i < NSERVERS ? DH_WIRE_REGISTER_SERVER
                                                  : DH_WIRE_REGISTER_CLIENT;

            if (rc < 0)
                return rc;
            if (rc == 0)
                continue;
            if (m.type == DH_WIRE_SHUTDOWN)
                rc = dh_err_set(e, DH_EIO, "peer %d refused: %s", i,
                                m.u.shutdown.reason);
            else if (m.type == want && !acked[i]) {
                acked[i] = 1;
                left--;
            }
            dh_wire_msg_fini(&m);
            if (rc < 0)
                return rc;
        }
    }
    return 0;
}

static int open_peers(struct run *r, struct dh_err *e)
{
    int rc;

    if (!(r->ctx = zmq_ctx_new()))
        return dh_err_set(e, DH_EIO, "zmq_ctx_new: %s",
                          zmq_strerror(zmq_errno()));
    for (int i = 0; i < NPEERS; i++) {
        struct peer *p = &r->peers[i];

        p->id = i < NSERVERS ? (uint32_t)i + 1 : 0;
        p->rank = i < NLOCAL ? i : i >= NSERVERS ? i - NSERVERS : -1;
        if ((rc = open_peer(r, p, e)) < 0 ||
            (rc = i < NSERVERS ? register_server(p, e)
                               : register_client(p, e)) < 0)
            return rc;
        r->items[i] = (zmq_pollitem_t){.socket = p->sock, .events = ZMQ_POLLIN};
    }
    return wait_acks(r, e);
}

/* ---- peers: the steady state ---- */

static int heartbeats(struct run *r, struct dh_err *e)
{
    struct dh_wire_msg m;
    int rc = 0;

    r->hb_seq++;
    for (int i = 0; rc == 0 && i < NSERVERS; i++) {
        dh_wire_msg_init(&m, DH_WIRE_HEARTBEAT);
        m.u.heartbeat.server_id = r->peers[i].id;
        m.u.heartbeat.seq = r->hb_seq;
        m.u.heartbeat.latency_ms = 1.0;
        rc = send_msg(r->peers[i].sock, &m, e);
    }
    r->next_hb_us = now_us() + HB_MS * 1e3;
    return rc;
}

static int send_request(struct run *r, struct peer *p, struct dh_err *e)
{
    struct phase *ph = &r->ph;
    long step = p->sent;
    uint64_t ids[SAMPLES];
    struct dh_wire_msg m;
    int rc;

    dh_wire_msg_init(&m, DH_WIRE_DESCRIPTOR_REQUEST);
    for (int i = 0; i < SAMPLES; i++)
        ids[i] = (uint64_t)step * SAMPLES + (uint64_t)i;
    if ((rc = dh_wire_task_make(&m.u.request.task, ph->epoch, ph->epoch,
                                (uint64_t)step, (uint64_t)p->rank, 0, e)) < 0 ||
        (rc = dh_wire_set_samples(&m.u.request, ids, SAMPLES, e)) < 0)
        goto out;
    m.u.request.requester_rank = (uint32_t)p->rank;
    m.u.request.slack_ms = 1000;
    m.u.request.hints.est_cpu_ms = 20;
    m.u.request.hints.est_in_bytes = 1u << 20;
    m.u.request.hints.est_out_bytes = 4u << 20;
    m.u.request.hints.steps_ahead = 1;
    ph->sent_us[step * NCLIENTS + p->rank] = now_us();
    if ((rc = send_msg(p->sock, &m, e)) == 0) {
        p->sent++;
        p->inflight++;
    }
out:
    dh_wire_msg_fini(&m);
    return rc;
}

static int top_up(struct run *r, struct peer *p, struct dh_err *e)
{
    int rc = 0;

    while (rc == 0 && p->inflight < r->o->inflight && p->sent < p->share)
        rc = send_request(r, p, e);
    return rc;
}

/* A server answers a routed request at once. */
static int serve_route(struct run *r, struct peer *p,
                       const struct dh_wire_route *rt, struct dh_err *e)
{
    struct dh_wire_msg m;
    struct dh_wire_result *res = &m.u.result;
    int rc;

    /* A rank's local server hears which remote will send it a task's
     * payload (docs/security.md "Who may send a payload"): nothing to do
     * here, where remotes answer the Coordinator themselves. */
    if (!rt->has_request && rt->target_server_id == p->id &&
        rt->server_id != p->id)
        return 0;
    if (!rt->has_request)
        return dh_err_set(e, DH_EFORMAT,
                          "server %u got a route without a "
                          "request",
                          p->id);
    if (rt->server_id != p->id)
        return dh_err_set(e, DH_EFORMAT,
                          "server %u got a route for server "
                          "%u",
                          p->id, rt->server_id);
    r->ph.routes++;
    r->ph.local_routes += p->rank >= 0 &&
                          rt->request.requester_rank == (uint32_t)p->rank;
    dh_wire_msg_init(&m, DH_WIRE_RESULT_NOTICE);
    res->task = rt->task;
    res->server_id = p->id;
    res->arena_offset = (uint64_t)(rt->task.step % 1024) * 4096;
    res->length = 4096;
    res->slot_generation = 1;
    res->dims[0] = 4096;
    res->ndims = 1;
    res->dtype = DH_DTYPE_U8;
    rc = dh_wire_set_result_samples(res, rt->request.sample_ids, NULL,
                                    rt->request.n_samples, e);
    if (rc == 0)
        rc = send_msg(p->sock, &m, e);
    dh_wire_msg_fini(&m);
    return rc;
}

/* A client takes its result, records the latency, sends the next. */
static int client_result(struct run *r, struct peer *p,
                         const struct dh_wire_result *res, struct dh_err *e)
{
    struct phase *ph = &r->ph;
    long slot = (long)res->task.step * NCLIENTS + p->rank;
    double t = now_us();

    if (res->task.epoch != ph->epoch || (int32_t)res->task.rank != p->rank ||
        (long)res->task.step >= p->sent || ph->sent_us[slot] < 0)
        return dh_err_set(e, DH_EFORMAT,
                          "client %d: unexpected or duplicate "
                          "result for task %#" PRIx64,
                          p->rank, res->task.id);
    ph->lat_us[ph->completed++] = t - ph->sent_us[slot];
    ph->sent_us[slot] = -1;
    ph->last_progress_us = t;
    p->inflight--;
    return top_up(r, p, e);
}

static int on_message(struct run *r, struct peer *p, int is_server,
                      const struct dh_wire_msg *m, struct dh_err *e)
{
    switch (m->type) {
    case DH_WIRE_ROUTE:
        return is_server ? serve_route(r, p, &m->u.route, e) : 0; /* ack */
    case DH_WIRE_RESULT_NOTICE:
        if (!is_server)
            return client_result(r, p, &m->u.result, e);
        break;
    case DH_WIRE_ERROR_NOTICE:
        return dh_err_set(e, DH_EIO,
                          "client %d got an error for task %#" PRIx64 ": %s",
                          p->rank, m->u.error.task.id, m->u.error.message);
    case DH_WIRE_SHUTDOWN:
        return dh_err_set(e, DH_EIO, "the coordinator sent shutdown: %s",
                          m->u.shutdown.reason);
    default:
        break;
    }
    return dh_err_set(e, DH_EFORMAT, "%s %d got an unexpected %s",
                      is_server ? "server" : "client",
                      is_server ? (int)p->id : (int)p->rank,
                      dh_wire_type_name(m->type));
}

/* Handles up to BURST waiting messages of peer i. */
static int drain_peer(struct run *r, int i, struct dh_err *e)
{
    struct peer *p = &r->peers[i];
    int rc = 0;

    for (int k = 0; rc == 0 && k < BURST; k++) {
        struct dh_wire_msg m;

        if ((rc = recv_msg(p->sock, &m, e)) <= 0)
            return rc;
        rc = on_message(r, p, i < NSERVERS, &m, e);
        dh_wire_msg_fini(&m);
    }
    return rc;
}

static int phase_alloc(struct phase *ph, uint32_t epoch, long n,
                       struct dh_err *e)
{
    size_t slots = ((size_t)n / NCLIENTS + 1) * NCLIENTS;

    free(ph->sent_us);
    free(ph->lat_us);
    memset(ph, 0, sizeof(*ph));
    ph->epoch = epoch;
    ph->n = n;
    ph->sent_us = malloc(slots * sizeof(*ph->sent_us));
    ph->lat_us = malloc((size_t)n * sizeof(*ph->lat_us) + 1);
    if (!ph->sent_us || !ph->lat_us)
        return dh_err_set(e, DH_ENOMEM, "out of memory for %ld requests", n);
    return 0;
}

static int stalled(struct run *r, struct dh_err *e)
{
    struct dh_coordinator_stats st;

    dh_coordinator_stats(r->c, &st);
    return dh_err_set(
        e, DH_ETIMEOUT,
        "no result for %.0f ms after %ld of "
        "%ld requests (coordinator: requests %" PRIu64 ", routed %" PRIu64
        ", results %" PRIu64 ", send "
        "failures %" PRIu64 ", pending %" PRIu64 ", servers %" PRIu64 ")",
        STALL_MS, r->ph.completed, r->ph.n, st.requests, st.routed, st.results,
        st.send_failures, st.pending, st.servers);
}

/* Runs n requests of `epoch` to completion; *secs: first send to last
 * result. */
static int pump(struct run *r, uint32_t epoch, long n, double *secs,
                struct dh_err *e)
{
    struct phase *ph = &r->ph;
    double t0;
    int rc;

    if ((rc = phase_alloc(ph, epoch, n, e)) < 0)
        return rc;
    t0 = ph->last_progress_us = now_us();
    for (int c = 0; c < NCLIENTS; c++) {
        struct peer *p = &r->peers[NSERVERS + c];

        p->share = n / NCLIENTS + (c < n % NCLIENTS);
        p->sent = p->inflight = 0;
        if ((rc = top_up(r, p, e)) < 0)
            return rc;
    }
    while (ph->completed < n) {
        double t = now_us();

        if (t >= r->next_hb_us && (rc = heartbeats(r, e)) < 0)
            return rc;
        if (t - ph->last_progress_us > STALL_MS * 1e3)
            return stalled(r, e);
        if (zmq_poll(r->items, NPEERS, 100) < 0 && zmq_errno() != EINTR)
            return dh_err_set(e, DH_EIO, "poll: %s", zmq_strerror(zmq_errno()));
        for (int i = 0; i < NPEERS; i++)
            if ((r->items[i].revents & ZMQ_POLLIN) &&
                (rc = drain_peer(r, i, e)) < 0)
                return rc;
    }
    *secs = (now_us() - t0) / 1e6;
    return 0;
}

/* ---- teardown ---- */

/* Stops the coordinator thread (bounded).  One that does not stop is
 * fatal: its thread cannot be joined. */
static int stop_coordinator(struct run *r, struct dh_err *e)
{
    double end = now_us() + STOP_MS * 1e3;

    if (r->reading) {
        r->stop_reader = 1;
        pthread_join(r->reader, NULL);
        r->reading = 0;
    }
    if (!r->started)
        return 0;
    r->stop = 1;
    while (!__atomic_load_n(&r->finished, __ATOMIC_SEQ_CST) && now_us() < end) {
        struct timespec ts = {0, 2000000};

        nanosleep(&ts, NULL);
    }
    if (!__atomic_load_n(&r->finished, __ATOMIC_SEQ_CST))
        die("coordinator", "run() did not return within 2 s of stop");
    pthread_join(r->th, NULL);
    r->started = 0;
    if (r->run_rc < 0)
        return dh_err_set(e, r->run_rc, "coordinator run: %s", r->run_err.msg);
    return 0;
}

/* Closes every socket and frees the run (the coordinator has stopped). */
static void run_free(struct run *r)
{
    for (int i = 0; i < NPEERS; i++)
        if (r->peers[i].sock)
            zmq_close(r->peers[i].sock);
    if (r->ctx)
        zmq_ctx_term(r->ctx);
    dh_coordinator_destroy(r->c);
    if (r->tel)
        fclose(r->tel);
    if (r->dir[0]) {
        unlink(r->tel_path);
        if (r->key_path[0])
            unlink(r->key_path);
        rmdir(r->dir);
    }
    dh__keys_wipe(&r->keys);
    free(r->ph.sent_us);
    free(r->ph.lat_us);
}

/* ---- telemetry ---- */

static int push(double **v, size_t *n, size_t *cap, double x)
{
    if (*n == *cap) {
        size_t nc = *cap ? *cap * 2 : 1024;
        double *nv = realloc(*v, nc * sizeof(**v));

        if (!nv)
            return -1;
        *v = nv;
        *cap = nc;
    }
    (*v)[(*n)++] = x;
    return 0;
}

/* decide_us of every decision on a task of `epoch` (the timed phase);
 * run() has returned, so the file is complete and flushed. */
static int parse_telemetry(FILE *f, uint32_t epoch, struct sample *s,
                           struct dh_err *e)
{
    char line[4096];
    size_t cap = 0;

    rewind(f);
    while (fgets(line, sizeof(line), f)) {
        const char *task = strstr(line, "\"task\":");
        const char *us = strstr(line, "\"decide_us\":");
        unsigned long long id;

        if (!task || !us)
            return dh_err_set(e, DH_EFORMAT,
                              "telemetry line without task "
                              "or decide_us: %.80s",
                              line);
        id = strtoull(task + 7, NULL, 10);
        if ((uint32_t)(id >> 48) != epoch)
            continue;
        s->backpressure += strstr(line, "\"reason\":\"backpressure\"") != 0;
        if (push(&s->decide_us, &s->ndecide, &cap, strtod(us + 12, NULL)))
            return dh_err_set(e, DH_ENOMEM, "out of memory (telemetry)");
    }
    if (ferror(f))
        return dh_err_set(e, DH_EIO, "telemetry: read error");
    return 0;
}

/* ---- one run ---- */

/* Anything but clean routing means the figures measure something else. */
static int check_stats(struct run *r, struct dh_err *e)
{
    struct dh_coordinator_stats st;

    dh_coordinator_stats(r->c, &st);
    if (st.malformed || st.duplicates || st.queue_full || st.send_failures ||
        st.dead_servers || st.rerouted)
        return dh_err_set(e, DH_EIO,
                          "coordinator counters: malformed %" PRIu64
                          ", duplicates %" PRIu64 ", queue full %" PRIu64
                          ", send failures %" PRIu64 ", dead servers %" PRIu64
                          ", rerouted %" PRIu64 " (want all 0)",
                          st.malformed, st.duplicates, st.queue_full,
                          st.send_failures, st.dead_servers, st.rerouted);
    return 0;
}

static void sample_fini(struct sample *s)
{
    free(s->decide_us);
    free(s->lat_us);
    memset(s, 0, sizeof(*s));
}

/* Warm-up, then the timed phase, on a started run. */
static int measure(struct run *r, struct sample *s, struct dh_err *e)
{
    const struct opts *o = r->o;
    double warm_s, secs, cpu0;
    int rc;

    if (o->warmup > 0 &&
        (rc = pump(r, EPOCH_WARMUP, o->warmup, &warm_s, e)) < 0)
        return rc;
    cpu0 = thread_cpu_s(r->th);
    if ((rc = pump(r, EPOCH_TIMED, o->requests, &secs, e)) < 0 ||
        (rc = check_stats(r, e)) < 0)
        return rc;
    s->co_cpu_us = (thread_cpu_s(r->th) - cpu0) * 1e6 / (double)o->requests;
    s->req_per_s = (double)o->requests / secs;
    s->local_pct = r->ph.routes ? 100.0 * (double)r->ph.local_routes /
                                      (double)r->ph.routes
                                : 0;
    s->lat_us = r->ph.lat_us; /* taken */
    s->nlat = (size_t)r->ph.completed;
    r->ph.lat_us = NULL;
    return 0;
}

/* One coordinator and its peers, measured.  On success *s owns its arrays
 * (sample_fini); on error they are freed. */
static int run_once(const struct opts *o, const char *policy, int tel,
                    struct sample *s, struct dh_err *e)
{
    struct run r;
    int rc;

    memset(&r, 0, sizeof(r));
    memset(s, 0, sizeof(*s));
    r.o = o;
    if ((rc = start_coordinator(&r, policy, tel, e)) == 0 &&
        (rc = open_peers(&r, e)) == 0 && (rc = heartbeats(&r, e)) == 0)
        rc = measure(&r, s, e);
    /* A stop failure is reported unless an earlier error already is. */
    if (stop_coordinator(&r, rc < 0 ? NULL : e) < 0)
        rc = -1;
    if (rc == 0 && tel) /* run() flushed the file when it returned */
        rc = parse_telemetry(r.tel, EPOCH_TIMED, s, e);
    run_free(&r);
    if (rc < 0)
        sample_fini(s);
    return rc;
}

/* ---- per policy ---- */

struct result {
    const char *policy;
    double rps[MAX_REPS], rps_off[MAX_REPS];
    double rps_med, rps_min, rps_max, rps_off_med;
    double dec_p50, dec_p95, dec_p99, lat_p50, lat_p99, local_pct;
    double co_cpu[MAX_REPS], co_cpu_off[MAX_REPS];
    double co_cpu_med, co_cpu_off_med;
    size_t ndecide, backpressure;
};

/* Appends src[0..n) to *dst (of *len). */
static int append(double **dst, size_t *len, const double *src, size_t n)
{
    double *v = realloc(*dst, (*len + n + 1) * sizeof(**dst));

    if (!v)
        return -1;
    memcpy(v + *len, src, n * sizeof(*src));
    *dst = v;
    *len += n;
    return 0;
}

static void summarize(struct result *res, int reps, double *dec, size_t nd,
                      double *lat, size_t nl)
{
    double tmp[MAX_REPS];

    memcpy(tmp, res->rps, (size_t)reps * sizeof(double));
    res->rps_med = median(tmp, (size_t)reps);
    res->rps_min = tmp[0];
    res->rps_max = tmp[reps - 1];
    memcpy(tmp, res->rps_off, (size_t)reps * sizeof(double));
    res->rps_off_med = median(tmp, (size_t)reps);
    memcpy(tmp, res->co_cpu, (size_t)reps * sizeof(double));
    res->co_cpu_med = median(tmp, (size_t)reps);
    memcpy(tmp, res->co_cpu_off, (size_t)reps * sizeof(double));
    res->co_cpu_off_med = median(tmp, (size_t)reps);
    res->ndecide = nd;
    res->dec_p50 = quantile(dec, nd, 0.50);
    res->dec_p95 = quantile(dec, nd, 0.95);
    res->dec_p99 = quantile(dec, nd, 0.99);
    res->lat_p50 = quantile(lat, nl, 0.50);
    res->lat_p99 = quantile(lat, nl, 0.99);
    res->local_pct /= reps;
}

/* R runs with telemetry (and, interleaved, R without: the peer). */
static void measure_policy(const struct opts *o, struct result *res)
{
    double *dec = NULL, *lat = NULL;
    size_t nd = 0, nl = 0;
    struct dh_err e;

    int rc = 0;

    for (int i = 0; rc == 0 && i < o->reps; i++) {
        struct sample s;

        if ((rc = run_once(o, res->policy, 1, &s, &e)) < 0)
            break;
        res->rps[i] = s.req_per_s;
        res->co_cpu[i] = s.co_cpu_us;
        res->local_pct += s.local_pct;
        res->backpressure += s.backpressure;
        if (append(&dec, &nd, s.decide_us, s.ndecide) < 0 ||
            append(&lat, &nl, s.lat_us, s.nlat) < 0)
            rc = dh_err_set(&e, DH_ENOMEM, "out of memory");
        sample_fini(&s);
        if (rc == 0 && o->peer &&
            (rc = run_once(o, res->policy, 0, &s, &e)) == 0) {
            res->rps_off[i] = s.req_per_s;
            res->co_cpu_off[i] = s.co_cpu_us;
            sample_fini(&s);
        }
    }
    if (rc == 0)
        summarize(res, o->reps, dec, nd, lat, nl);
    free(dec);
    free(lat);
    if (rc < 0)
        die(res->policy, e.msg);
}

/* ---- output ---- */

static void print_table(const struct opts *o, const struct result *res)
{
    printf("## coordinator routing: %d DataServers (%d local + %d remote, %d "
           "workers, queue cap %d), %d clients x %d in flight, %s; %ld "
           "requests per run after %ld warm-up, median of %d runs\n\n",
           NSERVERS, NLOCAL, NSERVERS - NLOCAL, WORKERS, 4 * WORKERS, NCLIENTS,
           o->inflight, o->ipc ? "ipc" : "tcp loopback", o->requests, o->warmup,
           o->reps);
    printf("| policy | requests/s | min .. max | wall us/request "
           "| coordinator CPU us/request | decide us p50 | p95 | local %% |%s"
           "\n",
           o->peer ? " telemetry off: requests/s | coordinator CPU "
                     "us/request | CPU on / off |"
                   : "");
    printf("|---|---:|---:|---:|---:|---:|---:|---:|%s\n",
           o->peer ? "---:|---:|---:|" : "");
    for (int i = 0; i < o->npolicy; i++) {
        const struct result *r = &res[i];

        printf("| %s | %.0f | %.0f .. %.0f | %.2f | %.2f | %.3f | %.3f | "
               "%.1f |",
               r->policy, r->rps_med, r->rps_min, r->rps_max, 1e6 / r->rps_med,
               r->co_cpu_med, r->dec_p50, r->dec_p95, r->local_pct);
        if (o->peer)
            printf(" %.0f | %.2f | %.2fx |", r->rps_off_med, r->co_cpu_off_med,
                   r->co_cpu_med / r->co_cpu_off_med);
        printf("\n");
    }
    printf("\n");
    for (int i = 0; i < o->npolicy; i++)
        printf("%s: %zu decisions timed (%zu backpressure), decide us p99 "
               "%.3f; request -> result latency us p50 %.0f, p99 %.0f\n",
               res[i].policy, res[i].ndecide, res[i].backpressure,
               res[i].dec_p99, res[i].lat_p50, res[i].lat_p99);
}

static void print_json(const struct opts *o, const struct result *res)
{
    printf("{\"bench\":\"route\",\"servers\":%d,\"local_servers\":%d,"
           "\"clients\":%d,\"workers\":%d,\"inflight_per_client\":%d,"
           "\"transport\":\"%s\",\"requests\":%ld,\"warmup\":%ld,"
           "\"reps\":%d,\"policies\":[",
           NSERVERS, NLOCAL, NCLIENTS, WORKERS, o->inflight,
           o->ipc ? "ipc" : "tcp", o->requests, o->warmup, o->reps);
    for (int i = 0; i < o->npolicy; i++) {
        const struct result *r = &res[i];

        printf("%s{\"policy\":\"%s\",\"requests_per_s\":%.1f,"
               "\"requests_per_s_min\":%.1f,\"requests_per_s_max\":%.1f,"
               "\"us_per_request\":%.3f,\"coordinator_cpu_us_per_request\":"
               "%.3f,\"decide_us_p50\":%.3f,"
               "\"decide_us_p95\":%.3f,\"decide_us_p99\":%.3f,"
               "\"decisions\":%zu,\"backpressure_decisions\":%zu,"
               "\"latency_us_p50\":%.1f,\"latency_us_p99\":%.1f,"
               "\"local_pct\":%.2f,\"requests_per_s_runs\":[",
               i ? "," : "", r->policy, r->rps_med, r->rps_min, r->rps_max,
               1e6 / r->rps_med, r->co_cpu_med, r->dec_p50, r->dec_p95,
               r->dec_p99, r->ndecide, r->backpressure, r->lat_p50, r->lat_p99,
               r->local_pct);
        for (int k = 0; k < o->reps; k++)
            printf("%s%.1f", k ? "," : "", r->rps[k]);
        printf("]");
        if (o->peer)
            printf(",\"requests_per_s_telemetry_off\":%.1f,"
                   "\"coordinator_cpu_us_per_request_telemetry_off\":%.3f",
                   r->rps_off_med, r->co_cpu_off_med);
        printf("}");
    }
    printf("]}\n");
}

/* ---- the cost of security ---- */

#define PAY_WARMUP 8

/* Payload configurations, side by side: [0] one connection (one I/O
 * thread at each end: the path before striping), [1] the striped link a
 * DataServer uses by default (or --stripes). */
#define NPAY 2

struct security {
    double route_plain[MAX_REPS], route_curve[MAX_REPS];
    double pay_plain[NPAY][MAX_REPS], pay_curve[NPAY][MAX_REPS];
    double route_plain_med, route_curve_med;
    double pay_plain_med[NPAY], pay_curve_med[NPAY];
    /* CPU ns per byte moved (both ends), by configuration and run */
    double cpu_plain[NPAY][MAX_REPS], cpu_curve[NPAY][MAX_REPS];
    double cpu_plain_med[NPAY], cpu_curve_med[NPAY];
    uint32_t stripes[NPAY];
    uint64_t parts[NPAY];
    int npay, reps;
    uint32_t def_stripes; /* a DataServer's default width here */
    double cipher_mbps, aes_mbps, memcpy_mbps;
    long cpus;
};

static void pay_run(const struct opts *o, struct security *s, int c, int curve,
                    int rep)
{
    struct dh_err e;
    struct bench_pay r;

    if (bench_pay_once(curve, s->stripes[c], PAY_WARMUP, o->pay_count, &r, &e) <
        0) {
        char what[64];

        snprintf(what, sizeof(what), "payload%s, %u stripe(s)",
                 curve ? " with CURVE" : "", s->stripes[c]);
        die(what, e.msg);
    }
    /* The striped path really ran: every batch arrived as its parts. */
    if (r.parts != (s->stripes[c] > 1
                        ? (uint64_t)(PAY_WARMUP + o->pay_count) * s->stripes[c]
                        : 0)) {
        char why[96];

        snprintf(why, sizeof(why), "%llu parts reassembled for %d batches",
                 (unsigned long long)r.parts, PAY_WARMUP + o->pay_count);
        die("payload", why);
    }
    (curve ? s->pay_curve : s->pay_plain)[c][rep] = r.mbps;
    (curve ? s->cpu_curve : s->cpu_plain)[c][rep] = r.cpu_ns_per_byte;
    s->parts[c] = r.parts;
}

/* R routing runs and R payload runs of each configuration each way,
 * interleaved (the order alternates, so a drift of the machine favours
 * neither). */
static void measure_security(const struct opts *o, struct security *s)
{
    struct opts ro = *o;
    struct dh_err e;
    double tmp[MAX_REPS];

    ro.requests = o->sec_requests;
    ro.warmup = 5000;
    s->reps = o->reps;
    s->stripes[0] = 1;
    /* The striped row runs even where a DataServer's default is 1. */
    s->stripes[1] = o->stripes ? o->stripes : dh__tp_stripes(0);
    if (!o->stripes && s->stripes[1] < 2)
        s->stripes[1] = 2;
    s->def_stripes = dh__tp_stripes(0);
    s->npay = s->stripes[1] > 1 ? 2 : 1;
    s->cpus = sysconf(_SC_NPROCESSORS_ONLN);
    s->cipher_mbps = bench_cipher_mbps();
    s->aes_mbps = bench_aes_mbps();
    s->memcpy_mbps = bench_memcpy_mbps();
    for (int i = 0; i < o->reps; i++) {
        for (int k = 0; k < 2; k++) {
            int curve = (i + k) % 2;
            struct sample smp;

            ro.curve = curve;
            if (run_once(&ro, "least-request", 0, &smp, &e) < 0)
                die(curve ? "routing with CURVE" : "routing", e.msg);
            (curve ? s->route_curve : s->route_plain)[i] = smp.req_per_s;
            sample_fini(&smp);
            for (int c = 0; c < s->npay; c++)
                pay_run(o, s, (c + i) % s->npay, curve, i);
        }
    }
#define SEC_MED_(dst, a)                                                       \
    memcpy(tmp, a, (size_t)o->reps * sizeof(double));                          \
    dst = median(tmp, (size_t)o->reps);
    SEC_MED_(s->route_plain_med, s->route_plain)
    SEC_MED_(s->route_curve_med, s->route_curve)
    for (int c = 0; c < s->npay; c++) {
        SEC_MED_(s->pay_plain_med[c], s->pay_plain[c])
        SEC_MED_(s->pay_curve_med[c], s->pay_curve[c])
        SEC_MED_(s->cpu_plain_med[c], s->cpu_plain[c])
        SEC_MED_(s->cpu_curve_med[c], s->cpu_curve[c])
    }
#undef SEC_MED_
}

static void print_security(const struct opts *o, const struct security *s)
{
    int last = s->npay - 1;
    /* Every byte costs the process cpu_curve CPU-ns however it is spread
     * over threads: on `cpus` cores CURVE cannot move more than this (and
     * plain no more than cpus / cpu_plain). */
    double bound = (double)s->cpus * 1e3 / s->cpu_curve_med[last];

    printf("\n## cost of security: CURVE (job key + ZAP) vs plain, tcp "
           "loopback, median of %d interleaved runs each\n\n",
           s->reps);
    printf("| measure | plain | CURVE | CURVE / plain | target |\n");
    printf("|---|---:|---:|---:|---:|\n");
    printf("| routing, requests/s (least-request, %d DataServers, %d clients "
           "x %d, %ld requests) | %.0f | %.0f | %.1f %% | >= 90 %% |\n",
           NSERVERS, NCLIENTS, o->inflight, o->sec_requests, s->route_plain_med,
           s->route_curve_med, 100.0 * s->route_curve_med / s->route_plain_med);
    for (int c = 0; c < s->npay; c++)
        printf("| payload, MB/s (%u MiB batches, %d per run, %u "
               "connection%s and I/O thread%s each end%s) | %.0f | %.0f | "
               "%.1f %% | >= 70 %% |\n",
               BENCH_PAY_BYTES >> 20, o->pay_count, s->stripes[c],
               s->stripes[c] > 1 ? "s" : "", s->stripes[c] > 1 ? "s" : "",
               s->stripes[c] == s->def_stripes ? ", a DataServer's default"
                                               : "",
               s->pay_plain_med[c], s->pay_curve_med[c],
               100.0 * s->pay_curve_med[c] / s->pay_plain_med[c]);
    for (int c = 0; c < s->npay; c++)
        printf("| payload, CPU ns per byte (both ends, %u connection%s) | "
               "%.2f | %.2f | x %.1f | |\n",
               s->stripes[c], s->stripes[c] > 1 ? "s" : "", s->cpu_plain_med[c],
               s->cpu_curve_med[c], s->cpu_curve_med[c] / s->cpu_plain_med[c]);
    printf("\nwhy (the striped link): CPU per byte moved, both ends: plain "
           "%.2f ns, CURVE %.2f ns (x %.1f).  No run beats CPUs / its cost: "
           "plain <= %.0f MB/s, CURVE <= %.0f MB/s on these %ld CPUs, so "
           "CURVE / plain <= %.1f %% wherever plain is CPU-bound; 70 %% "
           "needs CURVE at <= 1.43 x plain's CPU per byte, i.e. a cipher "
           "of >= %.1f GB/s a core (boxing + unboxing in %.2f ns).  One "
           "core, 4 "
           "MiB, best of 5: XSalsa20-Poly1305 (CURVE's cipher) %.0f MB/s, "
           "so boxing and unboxing cost %.2f ns a byte; AES-256-GCM %.0f "
           "MB/s; memcpy %.0f MB/s.  Each batch arrived as %u parts.\n",
           s->cpu_plain_med[last], s->cpu_curve_med[last],
           s->cpu_curve_med[last] / s->cpu_plain_med[last],
           (double)s->cpus * 1e3 / s->cpu_plain_med[last], bound, s->cpus,
           100.0 * s->cpu_plain_med[last] / s->cpu_curve_med[last],
           2.0 / (s->cpu_plain_med[last] * (1 / 0.7 - 1)),
           s->cpu_plain_med[last] * (1 / 0.7 - 1), s->cipher_mbps,
           s->cipher_mbps > 0 ? 2e3 / s->cipher_mbps : 0, s->aes_mbps,
           s->memcpy_mbps, s->stripes[last]);
    if (o->json)
        printf("{\"security\":{\"route_plain\":%.1f,\"route_curve\":%.1f,"
               "\"route_ratio\":%.4f,\"default_stripes\":%u,"
               "\"payload_stripes\":%u,"
               "\"payload_plain_mbps\":%.1f,\"payload_curve_mbps\":%.1f,"
               "\"payload_ratio\":%.4f,\"payload1_plain_mbps\":%.1f,"
               "\"payload1_curve_mbps\":%.1f,\"payload1_ratio\":%.4f,"
               "\"cpu_ns_plain\":%.3f,\"cpu_ns_curve\":%.3f,"
               "\"curve_bound_mbps\":%.1f,\"cipher_needed_mbps\":%.1f,"
               "\"cipher_mbps\":%.1f,"
               "\"aes_mbps\":%.1f,\"memcpy_mbps\":%.1f,\"cpus\":%ld,"
               "\"reps\":%d}}\n",
               s->route_plain_med, s->route_curve_med,
               s->route_curve_med / s->route_plain_med, s->def_stripes,
               s->stripes[last], s->pay_plain_med[last], s->pay_curve_med[last],
               s->pay_curve_med[last] / s->pay_plain_med[last],
               s->pay_plain_med[0], s->pay_curve_med[0],
               s->pay_curve_med[0] / s->pay_plain_med[0],
               s->cpu_plain_med[last], s->cpu_curve_med[last], bound,
               2e3 / (s->cpu_plain_med[last] * (1 / 0.7 - 1)), s->cipher_mbps,
               s->aes_mbps, s->memcpy_mbps, s->cpus, s->reps);
}

/* ---- the cost of the metrics endpoint ---- */

static void measure_metrics(const struct opts *o)
{
    double rps[2][MAX_REPS], cpu[2][MAX_REPS], med[2][2];
    struct opts ro = *o;
    struct dh_err e;

    ro.requests = o->sec_requests;
    ro.warmup = 5000;
    for (int i = 0; i < o->reps; i++)
        for (int on = 0; on < 2; on++) {
            struct sample smp;

            ro.metrics = on;
            if (run_once(&ro, "least-request", 0, &smp, &e) < 0)
                die(on ? "routing with metrics" : "routing", e.msg);
            rps[on][i] = smp.req_per_s;
            cpu[on][i] = smp.co_cpu_us;
            sample_fini(&smp);
        }
    for (int on = 0; on < 2; on++) {
        med[on][0] = median(rps[on], (size_t)o->reps);
        med[on][1] = median(cpu[on], (size_t)o->reps);
    }
    printf("\n## cost of the metrics endpoint: figures published every 10 "
           "ms and read every 10 ms vs off, median of %d interleaved runs "
           "each\n\n",
           o->reps);
    printf("| measure | off | on | on / off |\n|---|---:|---:|---:|\n");
    printf("| routing, requests/s (least-request, %d DataServers, %d clients "
           "x %d, %ld requests) | %.0f | %.0f | %.1f %% |\n",
           NSERVERS, NCLIENTS, o->inflight, o->sec_requests, med[0][0],
           med[1][0], 100.0 * med[1][0] / med[0][0]);
    printf("| coordinator thread CPU per request, us | %.2f | %.2f | %.1f %% "
           "|\n",
           med[0][1], med[1][1], 100.0 * med[1][1] / med[0][1]);
    if (o->json)
        printf("{\"metrics\":{\"rps_off\":%.1f,\"rps_on\":%.1f,"
               "\"cpu_us_off\":%.3f,\"cpu_us_on\":%.3f,\"reps\":%d}}\n",
               med[0][0], med[1][0], med[0][1], med[1][1], o->reps);
}

/* ---- options ---- */

static void usage(int status)
{
    fprintf(status ? stderr : stdout,
            "usage: bench_route [--requests N] [--warmup N] [--reps R] "
            "[--inflight K] [--policy P[,P...]] [--ipc] [--no-peer] "
            "[--json]\n"
            "                   [--security-only | --no-security] "
            "[--sec-requests N]\n"
            "  --requests N  timed requests per run (default 100000)\n"
            "  --warmup N    untimed requests first (default 10000)\n"
            "  --reps R      runs per policy, median reported (default 5, "
            "max %d)\n"
            "  --inflight K  requests in flight per client (default 32, "
            "max 256)\n"
            "  --policy      round-robin,least-request,deadline (default: "
            "all three)\n"
            "  --ipc         ipc:// instead of tcp://127.0.0.1\n"
            "  --no-peer     skip the runs with telemetry off\n"
            "  --json        one JSON line after the table\n"
            "  --security-only  only the CURVE vs plain section\n"
            "  --no-security    skip it\n"
            "  --sec-requests N routing requests per run there (default "
            "30000)\n"
            "  --stripes N   striped payload link width (default: a "
            "DataServer's, at least 2)\n"
            "  --pay-count N timed 4 MiB payload batches per run (default "
            "64)\n"
            "  --metrics-only   only the metrics on vs off section (as "
            "many requests)\n",
            MAX_REPS);
    exit(status);
}

static long num(const char *flag, const char *s, long lo, long hi)
{
    char *end = NULL;
    long v;

    errno = 0;
    v = s ? strtol(s, &end, 10) : 0;
    if (!s || errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr,
                "bench_route: %s: want an integer in %ld..%ld, got "
                "'%s'\n",
                flag, lo, hi, s ? s : "");
        exit(1);
    }
    return v;
}

/* Splits a comma list of policies (pointers into `list`, kept alive by
 * argv). */
static void parse_policies(struct opts *o, char *list)
{
    o->npolicy = 0;
    for (char *p = list, *comma; p && *p; p = comma ? comma + 1 : NULL) {
        if ((comma = strchr(p, ',')))
            *comma = '\0';
        if (o->npolicy == MAX_POLICIES)
            die("--policy", "at most 3 policies");
        if (strcmp(p, "round-robin") && strcmp(p, "least-request") &&
            strcmp(p, "deadline"))
            die("--policy", "want round-robin, least-request or deadline");
        o->policy[o->npolicy++] = p;
    }
    if (o->npolicy == 0)
        die("--policy", "empty list");
}

static void parse_args(int argc, char **argv, struct opts *o)
{
    *o = (struct opts){.requests = 100000,
                       .warmup = 10000,
                       .reps = 5,
                       .inflight = 32,
                       .peer = 1,
                       .security = 1,
                       .sec_requests = 30000,
                       .pay_count = 64,
                       .npolicy = 3,
                       .policy = {"round-robin", "least-request", "deadline"}};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;

        if (!strcmp(a, "--requests") && ++i)
            o->requests = num(a, v, NCLIENTS, 8000000L);
        else if (!strcmp(a, "--warmup") && ++i)
            o->warmup = num(a, v, 0, 8000000L);
        else if (!strcmp(a, "--reps") && ++i)
            o->reps = (int)num(a, v, 1, MAX_REPS);
        else if (!strcmp(a, "--inflight") && ++i)
            o->inflight = (int)num(a, v, 1, 256);
        else if (!strcmp(a, "--policy") && ++i && v)
            parse_policies(o, argv[i]);
        else if (!strcmp(a, "--ipc"))
            o->ipc = 1;
        else if (!strcmp(a, "--no-peer"))
            o->peer = 0;
        else if (!strcmp(a, "--json"))
            o->json = 1;
        else if (!strcmp(a, "--security-only"))
            o->security = 2;
        else if (!strcmp(a, "--no-security"))
            o->security = 0;
        else if (!strcmp(a, "--stripes") && ++i)
            o->stripes = (unsigned)num(a, v, 1, DH_TP_MAX_STRIPES);
        else if (!strcmp(a, "--pay-count") && ++i)
            o->pay_count = (int)num(a, v, 1, 100000);
        else if (!strcmp(a, "--metrics-only"))
            o->metrics_only = 1;
        else if (!strcmp(a, "--sec-requests") && ++i)
            o->sec_requests = num(a, v, NCLIENTS, 8000000L);
        else if (!strcmp(a, "--help") || !strcmp(a, "-h"))
            usage(0);
        else
            usage(1);
    }
}

int main(int argc, char **argv)
{
    static struct result res[MAX_POLICIES];
    static struct security sec;
    struct opts o;

    parse_args(argc, argv, &o);
    if (o.metrics_only) {
        measure_metrics(&o);
        return 0;
    }
    for (int i = 0; o.security < 2 && i < o.npolicy; i++) {
        res[i].policy = o.policy[i];
        measure_policy(&o, &res[i]);
        fprintf(stderr, "bench_route: %s done\n", o.policy[i]);
    }
    if (o.security < 2) {
        print_table(&o, res);
        if (o.json)
            print_json(&o, res);
    }
    if (o.security) {
        measure_security(&o, &sec);
        fprintf(stderr, "bench_route: security done\n");
        print_security(&o, &sec);
    }
    return 0;
}
