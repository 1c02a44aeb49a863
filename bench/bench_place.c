/*
 * bench_place.c - decision latency and quality of the `deadline` placement
 * policy: the indexed decide (local + k_best from the free-time heap +
 * k_random samples) against a full scan of every server, at 64, 512 and
 * 8,192 registered DataServers.  Never pass/fail; prints a markdown table.
 *
 * Load model: 8 local servers (one per rank) + remote sidecars with 4..32
 * workers, a hidden true speed 0.7..2.5x the cost model (learned through
 * completions), per-link bandwidth 100..5000 MB/s; a stationary window of
 * 2 tasks per server in flight (the oldest completes as each new one is
 * assigned).  Requests: a heavy-tailed CPU mix (20/60/200/600 ms), 5..100
 * MB payloads, deadlines k x 100 ms - elapsed (k = 1..3).
 * Quality: on the same state, both deciders choose; the indexed choice is
 * assigned.  Reported: mean predicted T and miss of each choice.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "datahelix/place.h"

#define NLOCAL 8
#define WARMUP 2000
#define TIMED 20000
#define QUALITY 20000

struct task {
    int32_t server;
    double work, actual;
};

struct world {
    struct dh_place *p;
    int32_t n;
    double *speed;
    struct task *ring;
    int32_t ring_cap, ring_len, ring_head;
    uint64_t rng;
};

static double urand(struct world *w)
{
    w->rng ^= w->rng << 13;
    w->rng ^= w->rng >> 7;
    w->rng ^= w->rng << 17;
    return (double)(w->rng >> 11) / 9007199254740992.0;
}

static double now_us(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static void die(int rc, const char *what)
{
    if (rc < 0) {
        fprintf(stderr, "bench_place: %s: %s\n", what, dh_strerror(rc));
        exit(1);
    }
}

/* $name as a number, or `def` when unset; a value that is not a number
 * ends the run. */
static double env_num(const char *name, double def)
{
    const char *s = getenv(name);
    char *end;
    double v;

    if (!s)
        return def;
    v = strtod(s, &end);
    if (end == s || *end) {
        fprintf(stderr, "bench_place: %s=%s is not a number\n", name, s);
        exit(2);
    }
    return v;
}

static void world_init(struct world *w, int32_t n, int full)
{
    struct dh_place_opts o;

    memset(w, 0, sizeof(*w));
    w->n = n;
    w->rng = 0x9e3779b97f4a7c15ull;
    dh_place_opts_default(&o);
    o.full_scan = full;
    /* The index's reference request: this mix's mean (the coordinator
     * takes it from the manifest: mean est_cpu_ms and est_out_bytes). */
    o.key_cpu_ms = env_num("KEY_CPU", 126);
    o.key_bytes = env_num("KEY_BYTES", 52.5e6);
    o.k_best = (int)env_num("K_BEST", o.k_best);
    die(dh_place_create(n, &o, &w->p, NULL), "create");
    w->speed = calloc((size_t)n, sizeof(double));
    w->ring_cap = 2 * n;
    w->ring = calloc((size_t)w->ring_cap, sizeof(struct task));
    if (!w->speed || !w->ring)
        die(DH_ENOMEM, "world");
    for (int32_t i = 0; i < n; i++) {
        int local = i < NLOCAL;
        die(dh_place_add_server(
                w->p, i, local ? DH_PLACE_ROLE_LOCAL : DH_PLACE_ROLE_REMOTE,
                local ? i : -1, 4 + (int)(urand(w) * 29), 16, NULL),
            "add");
        w->speed[i] = 0.7 + 1.8 * urand(w);
    }
    for (int32_t i = 0; i < n; i++)
        for (int32_t t = 0; t < NLOCAL; t++)
            if (i != t)
                die(dh_place_link(w->p, i, t, 50e6,
                                  50e6 / ((100 + 4900 * urand(w)) * 1e6)),
                    "link");
}

static void world_fini(struct world *w)
{
    dh_place_destroy(w->p);
    free(w->speed);
    free(w->ring);
}

static struct dh_place_req next_req(struct world *w)
{
    static const double cpu[4] = {20, 60, 200, 600};
    static const double mix[4] = {0.4, 0.3, 0.2, 0.1};
    struct dh_place_req r;
    double u = urand(w), acc = 0;
    int c = 0;

    while (c < 3 && u > (acc += mix[c]))
        c++;
    r.rank = (int32_t)(urand(w) * NLOCAL);
    r.local_server = r.rank;
    r.cpu_ms = cpu[c] * (0.7 + 0.6 * urand(w));
    r.io_ms = 1 + 4 * urand(w);
    r.in_bytes = 0; /* no read rates are set: C_io is io_ms */
    r.out_bytes = (5 + 95 * urand(w)) * 1e6;
    r.deadline_ms = (1 + (int)(urand(w) * 3)) * 100.0 - 80 * urand(w);
    return r;
}

/* Assigns the decision and completes the oldest task when the window of
 * tasks in flight is full (its actual time from the hidden speed). */
static void commit(struct world *w, const struct dh_place_decision *d)
{
    struct task *t;

    if (d->server < 0)
        return;
    if (w->ring_len == w->ring_cap) {
        t = &w->ring[w->ring_head];
        die(dh_place_complete(w->p, t->server, t->work, t->actual), "complete");
        w->ring_head = (w->ring_head + 1) % w->ring_cap;
        w->ring_len--;
    }
    die(dh_place_assign(w->p, d->server, d->work_ms), "assign");
    t = &w->ring[(w->ring_head + w->ring_len++) % w->ring_cap];
    *t = (struct task){d->server, d->work_ms,
                       d->work_ms * w->speed[d->server] *
                           (0.8 + 0.4 * urand(w))};
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;

    return (x > y) - (x < y);
}

struct timing {
    double p50, p99, scored;
};

static struct timing time_decide(int32_t n, int full, double *buf)
{
    struct world w;
    struct dh_place_decision d;
    struct timing t = {0, 0, 0};

    world_init(&w, n, full);
    for (int i = 0; i < WARMUP + TIMED; i++) {
        struct dh_place_req r = next_req(&w);
        double t0 = now_us();
        die(dh_place_decide(w.p, &r, &d), "decide");
        double t1 = now_us();
        if (i >= WARMUP) {
            buf[i - WARMUP] = t1 - t0;
            t.scored += d.scored;
        }
        commit(&w, &d);
    }
    qsort(buf, TIMED, sizeof(double), cmp_double);
    t.p50 = buf[TIMED / 2];
    t.p99 = buf[TIMED * 99 / 100];
    t.scored /= TIMED;
    world_fini(&w);
    return t;
}

struct quality {
    double t_idx, t_full, m_idx, m_full, same, miss_idx, miss_full;
};

static struct quality measure_quality(int32_t n)
{
    struct world w;
    struct quality q;
    struct dh_place_decision a, b;

    memset(&q, 0, sizeof(q));
    world_init(&w, n, 0);
    for (int i = 0; i < WARMUP + QUALITY; i++) {
        struct dh_place_req r = next_req(&w);
        die(dh_place_decide(w.p, &r, &a), "decide");
        die(dh_place_decide_full(w.p, &r, &b), "decide_full");
        if (i >= WARMUP && a.server >= 0 && b.server >= 0) {
            q.t_idx += a.t_pred_ms;
            q.t_full += b.t_pred_ms;
            q.m_idx += a.miss_ms;
            q.m_full += b.miss_ms;
            q.miss_idx += a.miss_ms > 0;
            q.miss_full += b.miss_ms > 0;
            q.same += fabs(a.t_pred_ms - b.t_pred_ms) < 1e-9;
        }
        commit(&w, &a);
    }
    q.t_idx /= QUALITY;
    q.t_full /= QUALITY;
    q.m_idx /= QUALITY;
    q.m_full /= QUALITY;
    q.same *= 100.0 / QUALITY;
    q.miss_idx *= 100.0 / QUALITY;
    q.miss_full *= 100.0 / QUALITY;
    world_fini(&w);
    return q;
}

static double ratio(double a, double b)
{
    return b > 0 ? a / b : (a > 0 ? INFINITY : 1.0);
}

int main(void)
{
    static const int32_t sizes[] = {64, 512, 8192};
    static double buf[TIMED];

    printf("## placement: indexed decide (local + 8 best + 2 random) vs "
           "full scan, policy deadline\n\n");
    printf("| servers | indexed p50 us | p99 us | full scan p50 us | p99 us "
           "| full/indexed | scored idx/full |\n");
    printf("|---:|---:|---:|---:|---:|---:|---:|\n");
    for (int i = 0; i < 3; i++) {
        struct timing a = time_decide(sizes[i], 0, buf);
        struct timing b = time_decide(sizes[i], 1, buf);
        printf("| %d | %.2f | %.2f | %.2f | %.2f | %.1fx | %.1f / %.0f |\n",
               (int)sizes[i], a.p50, a.p99, b.p50, b.p99, ratio(b.p50, a.p50),
               a.scored, b.scored);
        fflush(stdout);
    }
    printf("\n## decision quality on the same state (indexed choice "
           "assigned), %d decisions\n\n",
           QUALITY);
    printf("| servers | mean T idx ms | mean T full ms | T idx/full "
           "| mean miss idx ms | mean miss full ms | miss idx/full "
           "| miss rate idx %% | full %% | same score %% |\n");
    printf("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (int i = 0; i < 3; i++) {
        struct quality q = measure_quality(sizes[i]);
        printf("| %d | %.2f | %.2f | %.4f | %.3f | %.3f | %.3f | %.2f | "
               "%.2f | %.1f |\n",
               (int)sizes[i], q.t_idx, q.t_full, ratio(q.t_idx, q.t_full),
               q.m_idx, q.m_full, ratio(q.m_idx, q.m_full), q.miss_idx,
               q.miss_full, q.same);
        fflush(stdout);
    }
    return 0;
}
