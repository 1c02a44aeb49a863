/*
 * metrics_text.c - a Coordinator snapshot (metrics_snap.h) as Prometheus
 * text exposition, format 0.0.4 (docs/metrics.md names every metric).
 *
 * Design: pure (no I/O, no clock): a growable buffer with a hard cap,
 * one helper per metric shape (counter, gauge, histogram), label values
 * escaped as the format asks (backslash, double quote, newline).  Each
 * family is written once with its HELP and TYPE lines and every labelled
 * sample of it, so a parser sees no family twice.
 *
 * Locking: none.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "datahelix/error.h"
#include "runtime/metrics_snap.h"

#define OUT_CAP (64u << 20) /* 64 MiB: far above 4096 servers and ranks */

static const double B_US[] = {1,   2,   5,   10,   20,   50,
                              100, 200, 500, 1000, 5000, 20000};
static const double B_MS[] = {0.1, 0.5, 1,   2,    5,    10,   20,   50,
                              100, 200, 500, 1000, 2000, 5000, 10000};
static const double B_DEPTH[] = {0,  1,  2,   4,   8,   16,
                                 32, 64, 128, 256, 512, 1024};

static const double *bounds(enum dh_mx_buckets b, size_t *n)
{
    switch (b) {
    case DH_MX_B_US:
        *n = sizeof(B_US) / sizeof(B_US[0]);
        return B_US;
    case DH_MX_B_MS:
        *n = sizeof(B_MS) / sizeof(B_MS[0]);
        return B_MS;
    default:
        *n = sizeof(B_DEPTH) / sizeof(B_DEPTH[0]);
        return B_DEPTH;
    }
}

void dh__mx_observe(struct dh_mx_hist *h, enum dh_mx_buckets b, double v)
{
    size_t n, i;
    const double *ub = bounds(b, &n);

    if (!(v >= 0)) /* NaN or negative: nothing sensible to count */
        v = 0;
    for (i = 0; i < n && v > ub[i]; i++)
        ;
    h->n[i]++;
    h->count++;
    h->sum += v;
}

/* ---- snapshot copies ---- */

static int grow(void **p, size_t *cap, size_t need, size_t size)
{
    void *q;

    if (need <= *cap)
        return 0;
    if (!(q = dh__realloc(*p, need * size)))
        return DH_ENOMEM;
    *p = q;
    *cap = need;
    return 0;
}

int dh__mx_snap_copy(struct dh_mx_snap *dst, const struct dh_mx_snap *src)
{
    struct dh_mx_server *sv = dst->servers;
    struct dh_mx_rank *rk = dst->ranks;
    size_t cs = dst->cap_servers, cr = dst->cap_ranks;

    if (grow((void **)&sv, &cs, src->n_servers, sizeof(*sv)) < 0)
        return DH_ENOMEM;
    dst->servers = sv;
    dst->cap_servers = cs;
    if (grow((void **)&rk, &cr, src->n_ranks, sizeof(*rk)) < 0)
        return DH_ENOMEM;
    dst->ranks = rk;
    dst->cap_ranks = cr;
    *dst = *src;
    dst->servers = sv;
    dst->cap_servers = cs;
    dst->ranks = rk;
    dst->cap_ranks = cr;
    if (src->n_servers)
        memcpy(sv, src->servers, src->n_servers * sizeof(*sv));
    if (src->n_ranks)
        memcpy(rk, src->ranks, src->n_ranks * sizeof(*rk));
    return 0;
}

void dh__mx_snap_fini(struct dh_mx_snap *s)
{
    if (!s)
        return;
    dh__free(s->servers);
    dh__free(s->ranks);
    memset(s, 0, sizeof(*s));
}

/* ---- the output buffer ---- */

struct out {
    char *buf;
    size_t len, cap;
    int failed;
};

static void put(struct out *o, const char *fmt, ...) DH_PRINTF(2, 3);

static void put(struct out *o, const char *fmt, ...)
{
    va_list ap;
    int n;

    if (o->failed)
        return;
    for (;;) {
        size_t room = o->cap - o->len;
        char *nb;

        va_start(ap, fmt);
        n = vsnprintf(o->buf + o->len, room, fmt, ap);
        va_end(ap);
        if (n < 0) {
            o->failed = 1;
            return;
        }
        if ((size_t)n < room) {
            o->len += (size_t)n;
            return;
        }
        if (o->cap >= OUT_CAP || !(nb = dh__realloc(o->buf, o->cap * 2))) {
            o->failed = 1;
            return;
        }
        o->buf = nb;
        o->cap *= 2;
    }
}

/* A label value as the format wants it: \\, \" and \n escaped. */
static void esc(const char *s, char *dst, size_t cap)
{
    size_t j = 0;

    for (; *s && j + 3 < cap; s++) {
        if (*s == '\\' || *s == '"') {
            dst[j++] = '\\';
            dst[j++] = *s;
        } else if (*s == '\n') {
            dst[j++] = '\\';
            dst[j++] = 'n';
        } else {
            dst[j++] = *s;
        }
    }
    dst[j] = '\0';
}

static void family(struct out *o, const char *name, const char *type,
                   const char *help)
{
    put(o, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* A float the format accepts (%g is fine; +Inf/NaN never reach here). */
static void sample(struct out *o, const char *name, const char *labels,
                   double v)
{
    if (labels && *labels)
        put(o, "%s{%s} %.17g\n", name, labels, v);
    else
        put(o, "%s %.17g\n", name, v);
}

static void sample_u(struct out *o, const char *name, const char *labels,
                     uint64_t v)
{
    if (labels && *labels)
        put(o, "%s{%s} %" PRIu64 "\n", name, labels, v);
    else
        put(o, "%s %" PRIu64 "\n", name, v);
}

/* One histogram's samples (its family lines written by the caller);
 * labels: "" or 'rank="3"', to which le= is added. */
static void hist(struct out *o, const char *name, const char *labels,
                 const struct dh_mx_hist *h, enum dh_mx_buckets b)
{
    size_t n;
    const double *ub = bounds(b, &n);
    uint64_t cum = 0;
    const char *sep = labels && *labels ? "," : "";

    for (size_t i = 0; i < n; i++) {
        cum += h->n[i];
        put(o, "%s_bucket{%s%sle=\"%g\"} %" PRIu64 "\n", name,
            labels ? labels : "", sep, ub[i], cum);
    }
    put(o, "%s_bucket{%s%sle=\"+Inf\"} %" PRIu64 "\n", name,
        labels ? labels : "", sep, h->count);
    put(o, "%s_sum%s%s%s %.17g\n", name, *sep ? "{" : "", labels ? labels : "",
        *sep ? "}" : "", h->sum);
    put(o, "%s_count%s%s%s %" PRIu64 "\n", name, *sep ? "{" : "",
        labels ? labels : "", *sep ? "}" : "", h->count);
}

/* ---- the families ---- */

static void coord_counters(struct out *o, const struct dh_mx_snap *s)
{
    const struct dh_coordinator_stats *st = &s->st;
    static const struct {
        const char *name, *help;
        size_t off;
    } C[] = {
#define C_(f, h)                                                               \
    {"datahelix_" #f "_total", h, offsetof(struct dh_coordinator_stats, f)}
        C_(requests, "Descriptor requests accepted."),
        C_(routed, "Routes sent to DataServers (re-routes included)."),
        C_(rerouted, "Tasks re-routed off a dead or unreachable server."),
        C_(results, "First completions forwarded to clients."),
        C_(duplicates, "Late or duplicate completions released or dropped."),
        C_(dead_servers, "DataServers declared dead."),
        C_(queue_full, "Requests refused: the waiting FIFO was full."),
        C_(send_failures, "Sends ZeroMQ refused."),
        C_(heartbeats, "Heartbeats of registered servers applied."),
        C_(malformed, "Messages rejected as malformed."),
        C_(refused, "Messages refused by an authorization rule."),
        C_(rate_limited, "Messages dropped over a peer's rate cap."),
        C_(expired, "Requests failed after waiting too long for a server."),
        C_(capped, "Requests refused over a rank's caps."),
        C_(refused_peers, "Connections refused: not the job's key."),
        C_(rechecked, "Remote verdicts against samples checked on the "
                      "rank's local server."),
        C_(overdue, "Tasks re-routed off a live remote: no answer in time."),
        C_(demoted, "Remote servers demoted: answers out of line."),
#undef C_
    };

    for (size_t i = 0; i < sizeof(C) / sizeof(C[0]); i++) {
        uint64_t v;

        memcpy(&v, (const char *)st + C[i].off, sizeof(v));
        family(o, C[i].name, "counter", C[i].help);
        sample_u(o, C[i].name, NULL, v);
    }
}

static void coord_gauges(struct out *o, const struct dh_mx_snap *s)
{
    family(o, "datahelix_servers", "gauge", "DataServers registered now.");
    sample_u(o, "datahelix_servers", NULL, s->st.servers);
    family(o, "datahelix_clients", "gauge", "Clients registered now.");
    sample_u(o, "datahelix_clients", NULL, s->st.clients);
    family(o, "datahelix_inflight_tasks", "gauge",
           "Tasks routed and not completed.");
    sample_u(o, "datahelix_inflight_tasks", NULL, s->st.inflight);
    family(o, "datahelix_pending_requests", "gauge",
           "Requests waiting for a server with room (the Coordinator's "
           "queue depth).");
    sample_u(o, "datahelix_pending_requests", NULL, s->st.pending);
    family(o, "datahelix_uptime_seconds", "gauge",
           "Seconds since the Coordinator was created.");
    sample(o, "datahelix_uptime_seconds", NULL, (double)s->uptime_ms / 1e3);
}

static void coord_figures(struct out *o, const struct dh_mx_snap *s)
{
    char lb[64];

    family(o, "datahelix_decisions_total", "counter",
           "Placement decisions, by reason.");
    for (int r = 0; r < DH_MX_REASONS; r++) {
        const char *nm = dh_place_reason_name((enum dh_place_reason)r);

        if (!nm || !strcmp(nm, "?") || !strcmp(nm, "unknown"))
            continue;
        snprintf(lb, sizeof(lb), "reason=\"%s\"", nm);
        sample_u(o, "datahelix_decisions_total", lb, s->decisions[r]);
    }
    family(o, "datahelix_decision_us", "histogram",
           "Time of one placement decision, microseconds.");
    hist(o, "datahelix_decision_us", "", &s->decide_us, DH_MX_B_US);
    family(o, "datahelix_task_latency_ms", "histogram",
           "Route to first completion of a task, milliseconds.");
    hist(o, "datahelix_task_latency_ms", "", &s->task_ms, DH_MX_B_MS);
    family(o, "datahelix_heartbeat_queue_depth", "histogram",
           "Queue depth (queued and running tasks) of each applied "
           "heartbeat.");
    hist(o, "datahelix_heartbeat_queue_depth", "", &s->queue_depth,
         DH_MX_B_DEPTH);
    family(o, "datahelix_task_errors_total", "counter",
           "Sample errors (ErrorNotices) forwarded to clients.");
    sample_u(o, "datahelix_task_errors_total", NULL, s->task_errors);
    family(o, "datahelix_deadline_misses_total", "counter",
           "First completions that arrived after their request's slack "
           "ran out (as the Coordinator sees it).");
    sample_u(o, "datahelix_deadline_misses_total", NULL, s->late);
    family(o, "datahelix_payload_bytes_total", "counter",
           "Payload bytes of the results forwarded to clients.");
    sample_u(o, "datahelix_payload_bytes_total", NULL, s->bytes_out);
}

/* ---- per server ---- */

typedef double (*srv_get)(const struct dh_mx_server *);

#define SG_(f)                                                                 \
    static double sg_##f(const struct dh_mx_server *v)                         \
    {                                                                          \
        return (double)v->f;                                                   \
    }
SG_(alive)
SG_(queue_depth)
SG_(busy_workers)
SG_(workers)
SG_(latency_ms)
SG_(out_bps)
SG_(in_bps)
SG_(tasks)
SG_(errors)
SG_(bytes_out)
SG_(bytes_in)
SG_(routed)
SG_(heartbeats)
SG_(dead)
SG_(read_bytes)
SG_(reads)
SG_(read_s)
SG_(fetched_bytes)
SG_(cache_hits)
SG_(cache_misses)
#undef SG_

static void server_labels(const struct dh_mx_server *v, char *lb, size_t cap)
{
    char addr[2 * DH_MX_ADDR_LEN + 2];

    esc(v->addr, addr, sizeof(addr));
    if (v->remote)
        snprintf(lb, cap, "server=\"%u\",role=\"remote\",addr=\"%s\"", v->id,
                 addr);
    else
        snprintf(lb, cap,
                 "server=\"%u\",role=\"local\",rank=\"%u\",addr=\"%s\"", v->id,
                 v->rank, addr);
}

static void servers(struct out *o, const struct dh_mx_snap *s)
{
    static const struct {
        const char *name, *type, *help;
        srv_get get;
    } F[] = {
        {"datahelix_server_up", "gauge",
         "1: registered and heartbeating; 0: dead or left.", sg_alive},
        {"datahelix_server_dead", "gauge",
         "1: declared dead (silent past the heartbeat timeout).", sg_dead},
        {"datahelix_server_queue_depth", "gauge",
         "Tasks queued or running, last heartbeat.", sg_queue_depth},
        {"datahelix_server_busy_workers", "gauge",
         "Workers running a task, last heartbeat.", sg_busy_workers},
        {"datahelix_server_workers", "gauge", "Worker threads registered.",
         sg_workers},
        {"datahelix_server_latency_ewma_ms", "gauge",
         "Task latency EWMA the server reports, milliseconds.", sg_latency_ms},
        {"datahelix_server_out_bytes_per_second", "gauge",
         "Payload bytes of its results per second, recent.", sg_out_bps},
        {"datahelix_server_in_bytes_per_second", "gauge",
         "Payload bytes other servers prepared for its arena (a local "
         "server's cross-DS input) per second, recent.",
         sg_in_bps},
        {"datahelix_server_tasks_total", "counter",
         "First completions (results and errors) it sent.", sg_tasks},
        {"datahelix_server_errors_total", "counter",
         "Sample errors (ErrorNotices) it sent first.", sg_errors},
        {"datahelix_server_out_bytes_total", "counter",
         "Payload bytes of its results.", sg_bytes_out},
        {"datahelix_server_in_bytes_total", "counter",
         "Payload bytes other servers prepared for its arena.", sg_bytes_in},
        {"datahelix_server_routed_total", "counter",
         "Tasks routed to it (re-routes included).", sg_routed},
        {"datahelix_server_heartbeats_total", "counter", "Heartbeats applied.",
         sg_heartbeats},
        {"datahelix_server_read_bytes_total", "counter",
         "Bytes its workers read from their sources (files, shard members).",
         sg_read_bytes},
        {"datahelix_server_reads_total", "counter",
         "Reads its workers made from their sources.", sg_reads},
        {"datahelix_server_read_seconds_total", "counter",
         "Time its workers spent in those reads, seconds.", sg_read_s},
        {"datahelix_server_fetched_bytes_total", "counter",
         "Bytes its workers fetched from S3 / HTTP(S) (a cache hit "
         "fetches none).",
         sg_fetched_bytes},
        {"datahelix_server_cache_hits_total", "counter",
         "Chunks of remote objects its workers found in the host cache.",
         sg_cache_hits},
        {"datahelix_server_cache_misses_total", "counter",
         "Chunks of remote objects its workers fetched into the host cache.",
         sg_cache_misses},
    };
    char lb[3 * DH_MX_ADDR_LEN + 128];

    for (size_t f = 0; f < sizeof(F) / sizeof(F[0]); f++) {
        family(o, F[f].name, F[f].type, F[f].help);
        for (size_t i = 0; i < s->n_servers; i++) {
            server_labels(&s->servers[i], lb, sizeof(lb));
            sample(o, F[f].name, lb, F[f].get(&s->servers[i]));
        }
    }
}

/* ---- per rank ---- */

static void ranks(struct out *o, const struct dh_mx_snap *s)
{
    static const struct {
        const char *name, *type, *help;
        int reported; /* 1: from the rank's own report */
        size_t off;
        int is_double;
    } F[] = {
#define RF_(n, t, h, rep, f, d)                                                \
    {n, t, h, rep, offsetof(struct dh_mx_rank, f), d}
        RF_("datahelix_rank_requests_total", "counter",
            "Descriptor requests accepted from the rank.", 0, requests, 0),
        RF_("datahelix_rank_completed_total", "counter",
            "Its tasks' first completions forwarded.", 0, completed, 0),
        RF_("datahelix_rank_late_total", "counter",
            "Of them, after the request's slack ran out.", 0, late, 0),
        RF_("datahelix_rank_inflight_tasks", "gauge",
            "Tasks the rank holds at the Coordinator now.", 0, inflight, 0),
        RF_("datahelix_rank_steps", "gauge",
            "Steps the rank consumed (its last report).", 1, steps, 0),
        RF_("datahelix_rank_misses", "gauge",
            "Of them, DDL misses: input wait over the miss threshold (its "
            "last report).",
            1, misses, 0),
        RF_("datahelix_rank_window_ms", "gauge",
            "The rank's step window estimate, milliseconds (its last "
            "report).",
            1, window_ms, 1),
        RF_("datahelix_rank_last_input_wait_ms", "gauge",
            "Input wait of the rank's last consumed step, milliseconds.", 1,
            input_wait_ms, 1),
#undef RF_
    };
    char lb[32];

    for (size_t f = 0; f < sizeof(F) / sizeof(F[0]); f++) {
        family(o, F[f].name, F[f].type, F[f].help);
        for (size_t i = 0; i < s->n_ranks; i++) {
            const char *p = (const char *)&s->ranks[i] + F[f].off;

            if (F[f].reported && !s->ranks[i].reported)
                continue;
            snprintf(lb, sizeof(lb), "rank=\"%u\"", s->ranks[i].rank);
            if (F[f].is_double) {
                double v;

                memcpy(&v, p, sizeof(v));
                sample(o, F[f].name, lb, v);
            } else {
                uint64_t v;

                memcpy(&v, p, sizeof(v));
                sample_u(o, F[f].name, lb, v);
            }
        }
    }
    family(o, "datahelix_rank_input_wait_ms", "histogram",
           "Input wait of the rank's consumed steps, milliseconds (one "
           "observation per request that reports a new step).");
    for (size_t i = 0; i < s->n_ranks; i++) {
        if (!s->ranks[i].reported)
            continue;
        snprintf(lb, sizeof(lb), "rank=\"%u\"", s->ranks[i].rank);
        hist(o, "datahelix_rank_input_wait_ms", lb, &s->ranks[i].input_wait,
             DH_MX_B_MS);
    }
}

int dh__mx_format(const struct dh_mx_snap *s, char **out, size_t *len)
{
    struct out o = {.cap = 16384};

    if (!(o.buf = dh__malloc(o.cap)))
        return DH_ENOMEM;
    o.buf[0] = '\0';
    coord_counters(&o, s);
    coord_gauges(&o, s);
    coord_figures(&o, s);
    servers(&o, s);
    ranks(&o, s);
    if (o.failed) {
        dh__free(o.buf);
        return DH_ENOMEM;
    }
    *out = o.buf;
    *len = o.len;
    return 0;
}
