/*
 * client_trace.c - why a step was late, and the critical-path trace
 * (issue 18 item 4; docs/trace.md).
 *
 * Design notes
 * - One timing system: the stage times are the DataServer's own
 *   measurements, carried in ResultNotice.stages (proto/datahelix.proto),
 *   plus the client's request and arrival times and the consumer's wait
 *   and window (the DESIGN 4.4 telemetry).  Nothing here measures again.
 * - Hot path: dh__cl_trace_step() runs under `mu` when a step is consumed.
 *   It finds the late cause of a missed step (O(samples of the step)) and,
 *   when tracing, copies the step's numbers into preallocated-and-grown
 *   arrays - no formatting, no I/O.  The JSON is written once, at
 *   destroy, after the I/O thread has stopped.  The buffer keeps at most
 *   DH_CLIENT_TRACE_MAX_STEPS steps; later ones are counted, left out,
 *   and the file says so (otherData.truncated).
 * - Clocks: every time is this host's CLOCK_MONOTONIC.  A local part's
 *   server spans end at its ready time (the local server's reading, same
 *   host).  A remote part's spans start at the request (routing assumed
 *   ~0: the Coordinator decides in microseconds), so the gap before its
 *   payload arrived is drawn as its transfer; no clock of another host is
 *   ever compared with ours.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "core/alloc.h"
#include "core/clock.h"
#include "core/trace_cause.h"
#include "runtime/client_internal.h"

/* Trace process ids: rank r is r + 1, DataServer s is SERVER_PID0 + s
 * (ranks < 65536), so the files of a job's ranks can be merged. */
#define RANK_PID (t->rank_pid)
#define SERVER_PID0 100000
/* Rank tracks. */
enum { TID_STEP = 1, TID_WAIT, TID_DEADLINE, TID_DELIVERY };

struct tr_step {
    uint32_t epoch;
    uint64_t step;
    double t_call, wait, window, deadline_at; /* deadline_at: 0 unknown */
    int miss;
    struct dh_client_late late; /* miss only */
    size_t p0;
    uint32_t n_parts;
};

struct cl_trace {
    struct tr_step *steps;
    struct dh__tr_part *parts;
    struct dh__tr_sample *samples;
    size_t n_steps, n_parts, n_samples;
    size_t cap_steps, cap_parts, cap_samples;
    uint64_t dropped; /* steps left out: over the cap, or out of memory */
    size_t max_steps; /* DH_CLIENT_TRACE_MAX_STEPS, or less by env */
    double cost_ms, cost_max_ms; /* dh__cl_trace_step's own time */
    uint64_t calls;
    int rank_pid;
    uint32_t servers[CL_MAX_LOAD];
    int server_remote[CL_MAX_LOAD];
    size_t n_servers;
};

int dh__cl_trace_open(struct dh_client *c, struct dh_err *e)
{
    const char *env = getenv("DATAHELIX_TRACE_MAX_STEPS");
    char *end = NULL;
    unsigned long v;

    if (!(c->trace = dh__calloc(1, sizeof(*c->trace))))
        return dh_err_set(e, DH_ENOMEM, "out of memory");
    c->trace->max_steps = DH_CLIENT_TRACE_MAX_STEPS;
    c->trace->rank_pid = (int)c->rank + 1;
    /* a smaller bound (tests, small memory); never a larger one */
    if (env && *env) {
        v = strtoul(env, &end, 10);
        if (*end == '\0' && v < DH_CLIENT_TRACE_MAX_STEPS)
            c->trace->max_steps = v;
    }
    return 0;
}

/* Room for `more` entries of an array (doubling); 0 or DH_ENOMEM. */
static int grow(void **arr, size_t *cap, size_t n, size_t more, size_t size)
{
    size_t want = *cap ? *cap : 256;
    void *p;

    if (n + more <= *cap)
        return 0;
    while (want < n + more)
        want *= 2;
    if (!(p = dh__realloc(*arr, want * size)))
        return DH_ENOMEM;
    *arr = p;
    *cap = want;
    return 0;
}

/* ---- per step (mu held) ---- */

/* One part's numbers from the pool entry and its request. */
static void part_of(const struct dh_client *c, uint64_t k, uint32_t j,
                    const struct cl_result *r, struct dh__tr_part *p)
{
    const struct cl_sent *s = &c->sent[(k % c->prefetch) * c->mb + j];
    uint32_t local = c->arenas[r->arena].server_id;
    uint32_t server = r->st.present     ? r->st.server_id
                      : s->route_server ? s->route_server
                                        : local;

    *p = (struct dh__tr_part){.step = c->first_step + k,
                              .epoch = c->epoch,
                              .mb = j,
                              .server = server,
                              .worker = r->st.worker,
                              .n = r->st.rows ? r->n : 0,
                              .remote = server != local,
                              .present = r->st.present,
                              .sent = s->sent_msf,
                              .recv = r->arrived_msf,
                              .ready = r->st.ready_ms,
                              .queue = r->st.queue_ms,
                              .alloc = r->st.alloc_ms,
                              .collate = r->st.collate_ms,
                              .place = r->st.place_ms,
                              .notify = r->st.notify_ms,
                              .service = r->st.service_ms};
}

static void samples_of(const struct cl_result *r, struct dh__tr_sample *out)
{
    for (uint32_t i = 0; r->st.rows && i < r->n; i++) {
        out[i].id = r->ids[i];
        memcpy(out[i].ms, r->st.rows + (size_t)i * DH_MS_COUNT,
               sizeof(out[i].ms));
        out[i].bytes = r->st.bytes ? r->st.bytes[i] : 0;
    }
}

/* The late cause of step position k: the part that came in last. */
static void find_cause(struct dh_client *c, uint64_t k, double t_call,
                       double wait, const size_t *idx,
                       struct dh_client_late *out)
{
    struct dh__tr_sample buf[64], *s = NULL;
    const struct cl_result *last = NULL;
    struct dh__tr_part p;
    struct dh__tr_view v;
    uint32_t jl = 0, pos = 0;
    double ms;
    const char *stage;

    for (uint32_t j = 0; j < c->mb; j++) {
        const struct cl_result *r = &c->pool[idx[j]];

        if (!r->is_error && (!last || r->arrived_msf > last->arrived_msf))
            last = r, jl = j;
    }
    *out = (struct dh_client_late){.epoch = c->epoch,
                                   .step = c->first_step + k,
                                   .input_wait_ms = wait,
                                   .stage = "unknown",
                                   .sample_id = DH_CLIENT_NO_SAMPLE,
                                   .path = ""};
    if (!last)
        return;
    part_of(c, k, jl, last, &p);
    if (p.n && p.n <= sizeof(buf) / sizeof(buf[0]))
        s = buf;
    else if (p.n)
        s = dh__malloc(p.n * sizeof(*s));
    if (s)
        samples_of(last, s);
    else
        p.n = 0;
    dh__tr_place(&p, s, &v);
    stage = dh__tr_longest(&p, s, &v, &ms, &pos);
    out->microbatch = jl;
    out->server_id = p.server;
    out->remote = p.remote;
    out->worker = p.worker;
    out->stage = stage;
    out->stage_ms = ms;
    /* Every part was in before next() asked: no server made it late, the
     * wait was the client's own (taking it, a held-up arena). */
    if (last->arrived_msf <= t_call) {
        out->stage = "client";
        out->stage_ms = wait;
    }
    if (p.n) {
        const char *path = dh_index_path(c->ix, s[pos].id);

        out->sample_id = s[pos].id;
        out->path = path ? path : "";
        out->sample_ms = (double)s[pos].ms[0] + s[pos].ms[1] + s[pos].ms[2];
    } else if (last->n) {
        out->sample_id = last->ids[0];
    }
    if (s != buf)
        dh__free(s);
}

static void note_server(struct cl_trace *t, uint32_t id, int remote)
{
    for (size_t i = 0; i < t->n_servers; i++)
        if (t->servers[i] == id)
            return;
    if (t->n_servers < CL_MAX_LOAD) {
        t->server_remote[t->n_servers] = remote;
        t->servers[t->n_servers++] = id;
    }
}

/* Copies the step into the trace buffer; a step that does not fit is
 * counted as dropped. */
static void record(struct dh_client *c, uint64_t k, const struct tr_step *st,
                   const size_t *idx)
{
    struct cl_trace *t = c->trace;
    size_t ns = 0;

    for (uint32_t j = 0; j < c->mb; j++) {
        const struct cl_result *r = &c->pool[idx[j]];

        ns += r->is_error || !r->st.rows ? 0 : r->n;
    }
    if (t->n_steps >= t->max_steps ||
        grow((void **)&t->steps, &t->cap_steps, t->n_steps, 1,
             sizeof(*t->steps)) ||
        grow((void **)&t->parts, &t->cap_parts, t->n_parts, c->mb,
             sizeof(*t->parts)) ||
        grow((void **)&t->samples, &t->cap_samples, t->n_samples, ns,
             sizeof(*t->samples))) {
        t->dropped++;
        return;
    }
    t->steps[t->n_steps] = *st;
    t->steps[t->n_steps].p0 = t->n_parts;
    t->steps[t->n_steps].n_parts = 0;
    for (uint32_t j = 0; j < c->mb; j++) {
        const struct cl_result *r = &c->pool[idx[j]];
        struct dh__tr_part *p = &t->parts[t->n_parts];

        if (r->is_error)
            continue;
        part_of(c, k, j, r, p);
        p->s0 = t->n_samples;
        samples_of(r, &t->samples[t->n_samples]);
        t->n_samples += p->n;
        note_server(t, p->server, p->remote);
        t->n_parts++;
        t->steps[t->n_steps].n_parts++;
    }
    t->n_steps++;
}

void dh__cl_trace_step(struct dh_client *c, uint64_t k, double t_call,
                       double wait, double window, const size_t *idx)
{
    double t0 = c->trace ? dh__mono_msf() : 0;
    struct tr_step st = {.epoch = c->epoch,
                         .step = c->first_step + k,
                         .t_call = t_call,
                         .wait = wait,
                         .window = window,
                         .miss = dh_window_is_miss(wait, c->ddl_ms)};
    const struct cl_sent *s0 = &c->sent[(k % c->prefetch) * c->mb];

    if (s0->slack_ms < DH_WIRE_MAX_SLACK_MS)
        st.deadline_at = s0->sent_msf + (double)s0->slack_ms;
    if (st.miss) {
        struct dh_client_late *l = &c->late[c->late_head];

        find_cause(c, k, t_call, wait, idx, l);
        st.late = *l;
        c->late_head = (c->late_head + 1) % DH_CLIENT_MAX_LATE;
        if (c->n_late < DH_CLIENT_MAX_LATE)
            c->n_late++;
        c->late_total++;
    }
    if (c->trace) {
        double took;

        record(c, k, &st, idx);
        /* what tracing costs the consumer, said in the file */
        took = dh__mono_msf() - t0;
        c->trace->cost_ms += took;
        c->trace->calls++;
        if (took > c->trace->cost_max_ms)
            c->trace->cost_max_ms = took;
    }
}

size_t dh_client_late(struct dh_client *c, struct dh_client_late *out,
                      size_t cap, uint64_t *total)
{
    size_t n, first;

    pthread_mutex_lock(&c->mu);
    n = c->n_late;
    first = (c->late_head + DH_CLIENT_MAX_LATE - n) % DH_CLIENT_MAX_LATE;
    for (size_t i = 0; out && i < n && i < cap; i++)
        out[i] = c->late[(first + i) % DH_CLIENT_MAX_LATE];
    if (total)
        *total = c->late_total;
    pthread_mutex_unlock(&c->mu);
    return n;
}

/* ---- the file ---- */

/* Chrome trace-event JSON wants µs; ours are ms of CLOCK_MONOTONIC. */
static double us(double ms)
{
    return ms * 1e3;
}

/* A path as a JSON string body (quotes, backslashes, control bytes). */
static void put_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (; s && *s; s++) {
        unsigned char ch = (unsigned char)*s;

        if (ch == '"' || ch == '\\')
            fprintf(f, "\\%c", ch);
        else if (ch < 0x20)
            fprintf(f, "\\u%04x", ch);
        else
            fputc(ch, f);
    }
    fputc('"', f);
}

static void meta(FILE *f, int pid, int tid, const char *what, const char *name)
{
    fprintf(f,
            ",\n{\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"name\":\"%s\","
            "\"args\":{\"name\":\"%s\"}}",
            pid, tid, what, name);
}

/* A complete event, left open for args: the caller closes it with "}"
 * or ",\"args\":{...}}". */
static void span(FILE *f, int pid, int tid, const char *cat, double t0,
                 double dur, const char *name)
{
    fprintf(f,
            ",\n{\"ph\":\"X\",\"cat\":\"%s\",\"pid\":%d,\"tid\":%d,"
            "\"ts\":%.3f,\"dur\":%.3f,\"name\":\"%s\"",
            cat, pid, tid, us(t0), us(dur > 0 ? dur : 0), name);
}

static void write_late(FILE *f, const struct dh_client_late *l)
{
    fprintf(f,
            "{\"epoch\":%" PRIu32 ",\"step\":%" PRIu64
            ",\"input_wait_ms\":%.3f,\"microbatch\":%" PRIu32
            ",\"server\":%" PRIu32 ",\"remote\":%s,\"worker\":%" PRIu32
            ",\"stage\":\"%s\",\"stage_ms\":%.3f,\"sample\":",
            l->epoch, l->step, l->input_wait_ms, l->microbatch, l->server_id,
            l->remote ? "true" : "false", l->worker, l->stage, l->stage_ms);
    if (l->sample_id == DH_CLIENT_NO_SAMPLE)
        fputs("null", f);
    else
        fprintf(f, "%" PRIu64, l->sample_id);
    fputs(",\"path\":", f);
    put_str(f, l->path);
    fprintf(f, ",\"sample_ms\":%.3f}", l->sample_ms);
}

/* A part's server spans, its delivery and the flow to the step. */
static void write_part(FILE *f, const struct cl_trace *t,
                       const struct tr_step *st, const struct dh__tr_part *p,
                       uint64_t flow)
{
    const struct dh__tr_sample *s = p->n ? &t->samples[p->s0] : NULL;
    int pid = SERVER_PID0 + (int)p->server, tid = (int)p->worker + 1;
    struct dh__tr_view v;
    char nm[96];
    double at;

    dh__tr_place(p, s, &v);
    if (!p->present) { /* an older server: the whole wait, one span */
        snprintf(nm, sizeof(nm), "task step %" PRIu64 " (no stage times)",
                 p->step);
        span(f, RANK_PID, TID_DELIVERY, "delivery", v.sent, v.recv - v.sent,
             nm);
        fputs("}", f);
        return;
    }
    at = v.work_start - p->queue; /* work_start: the slot wait begins */
    snprintf(nm, sizeof(nm), "queue step %" PRIu64, p->step);
    span(f, pid, tid, "queue", at, p->queue, nm);
    fprintf(f, ",\"args\":{\"step\":%" PRIu64 ",\"microbatch\":%" PRIu32 "}}",
            p->step, p->mb);
    at += p->queue;
    snprintf(nm, sizeof(nm), "alloc step %" PRIu64, p->step);
    span(f, pid, tid, "alloc", at, p->alloc, nm);
    fputs("}", f);
    at += p->alloc;
    for (uint32_t i = 0; i < p->n; i++)
        for (int k = 0; k < DH_MS_COUNT; k++) {
            if (k == DH_MS_AUDIO && s[i].ms[k] <= 0)
                continue; /* no sound: no audio span */
            snprintf(nm, sizeof(nm), "%s %" PRIu64, dh__tr_sample_stages[k],
                     s[i].id);
            span(f, pid, tid, dh__tr_sample_stages[k], at, s[i].ms[k], nm);
            fprintf(f, ",\"args\":{\"sample\":%" PRIu64 ",\"step\":%" PRIu64,
                    s[i].id, p->step);
            if (k == 0) /* the read stage: what it read */
                fprintf(f, ",\"bytes\":%" PRIu64, s[i].bytes);
            fputs("}}", f);
            at += s[i].ms[k];
        }
    snprintf(nm, sizeof(nm), "collate step %" PRIu64, p->step);
    span(f, pid, tid, "collate", at, p->collate, nm);
    fputs("}", f);
    fprintf(f,
            ",\n{\"ph\":\"s\",\"cat\":\"flow\",\"name\":\"batch\","
            "\"id\":%" PRIu64 ",\"pid\":%d,\"tid\":%d,\"ts\":%.3f}",
            flow, pid, tid, us(v.work_end) - 0.001);
    if (p->remote) {
        snprintf(nm, sizeof(nm), "transfer step %" PRIu64, p->step);
        span(f, pid, tid, "transfer", v.work_end, v.transfer, nm);
        fputs("}", f);
    }
    if (p->place > 0) {
        snprintf(nm, sizeof(nm), "place step %" PRIu64, p->step);
        span(f, RANK_PID, TID_DELIVERY, "place", v.ready - p->notify - p->place,
             p->place, nm);
        fputs("}", f);
    }
    snprintf(nm, sizeof(nm), "notify step %" PRIu64, p->step);
    span(f, RANK_PID, TID_DELIVERY, "notify", v.ready - p->notify, p->notify,
         nm);
    fputs("}", f);
    snprintf(nm, sizeof(nm), "notice step %" PRIu64, p->step);
    span(f, RANK_PID, TID_DELIVERY, "transfer", v.ready, v.recv - v.ready, nm);
    fputs("}", f);
    /* the arrow ends on the step's input-wait span: where the notice came
     * in, or its start when the batch was there before it was asked for */
    at = v.recv < st->t_call ? st->t_call : v.recv;
    if (at > st->t_call + st->wait)
        at = st->t_call + st->wait;
    fprintf(f,
            ",\n{\"ph\":\"f\",\"bp\":\"e\",\"cat\":\"flow\",\"name\":"
            "\"batch\",\"id\":%" PRIu64 ",\"pid\":%d,\"tid\":%d,\"ts\":%.3f}",
            flow, RANK_PID, TID_WAIT, us(at));
}

static void write_step(FILE *f, const struct cl_trace *t,
                       const struct tr_step *st, uint64_t *flow)
{
    double ret = st->t_call + st->wait;
    char nm[96];

    snprintf(nm, sizeof(nm), "step %" PRIu64, st->step);
    span(f, RANK_PID, TID_STEP, "step", st->t_call - st->window,
         st->window + st->wait, nm);
    fprintf(f,
            ",\"args\":{\"epoch\":%" PRIu32 ",\"window_ms\":%.3f,"
            "\"input_wait_ms\":%.3f,\"miss\":%s}}",
            st->epoch, st->window, st->wait, st->miss ? "true" : "false");
    snprintf(nm, sizeof(nm), "input wait step %" PRIu64, st->step);
    span(f, RANK_PID, TID_WAIT, "wait", st->t_call, st->wait, nm);
    fputs(st->miss ? ",\"args\":{\"late\":" : "}", f);
    if (st->miss) {
        write_late(f, &st->late);
        fputs("}}", f);
    }
    if (st->deadline_at > 0 && st->n_parts) {
        double from = t->parts[st->p0].sent;

        snprintf(nm, sizeof(nm), "deadline window step %" PRIu64, st->step);
        span(f, RANK_PID, TID_DEADLINE, "deadline", from,
             st->deadline_at - from, nm);
        fputs("}", f);
    }
    if (st->miss) {
        fprintf(f,
                ",\n{\"ph\":\"i\",\"s\":\"g\",\"cat\":\"late\",\"pid\":%d,"
                "\"tid\":%d,\"ts\":%.3f,\"name\":\"late step %" PRIu64 ": %s",
                RANK_PID, TID_WAIT, us(ret), st->step, st->late.stage);
        if (st->late.sample_id != DH_CLIENT_NO_SAMPLE)
            fprintf(f, " of sample %" PRIu64, st->late.sample_id);
        fprintf(f, " on server %" PRIu32 "\",\"args\":", st->late.server_id);
        write_late(f, &st->late);
        fputs("}", f);
    }
    for (uint32_t j = 0; j < st->n_parts; j++)
        write_part(f, t, st, &t->parts[st->p0 + j], ++*flow);
}

static void write_file(const struct dh_client *c, const struct cl_trace *t,
                       FILE *f)
{
    static const char *const rank_tracks[] = {
        [TID_STEP] = "step",
        [TID_WAIT] = "input wait",
        [TID_DEADLINE] = "deadline window",
        [TID_DELIVERY] = "delivery"};
    uint64_t flow = (uint64_t)c->rank << 40;
    char nm[64];

    fprintf(f,
            "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"rank\":%" PRIu32
            ",\"clock\":\"CLOCK_MONOTONIC\",\"steps\":%zu,"
            "\"truncated\":%s,\"dropped_steps\":%" PRIu64
            ",\"max_steps\":%zu,\"late_steps\":%" PRIu64
            ",\"record_us_mean\":%.2f,\"record_us_max\":%.2f},\n"
            "\"traceEvents\":[\n",
            c->rank, t->n_steps, t->dropped ? "true" : "false", t->dropped,
            t->max_steps, c->late_total,
            t->calls ? t->cost_ms * 1e3 / (double)t->calls : 0.0,
            t->cost_max_ms * 1e3);
    fprintf(f,
            "{\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"name\":\"process_name\","
            "\"args\":{\"name\":\"rank %" PRIu32 "\"}}",
            RANK_PID, c->rank);
    for (int i = TID_STEP; i <= TID_DELIVERY; i++)
        meta(f, RANK_PID, i, "thread_name", rank_tracks[i]);
    for (size_t i = 0; i < t->n_servers; i++) {
        int pid = SERVER_PID0 + (int)t->servers[i];
        uint64_t seen[DH_WIRE_MAX_WORKERS / 64] = {0};

        snprintf(nm, sizeof(nm), "DataServer %" PRIu32 " (%s)", t->servers[i],
                 t->server_remote[i] ? "remote" : "local");
        meta(f, pid, 0, "process_name", nm);
        for (size_t p = 0; p < t->n_parts; p++) {
            uint32_t w = t->parts[p].worker;

            if (t->parts[p].server != t->servers[i] || !t->parts[p].present ||
                w >= DH_WIRE_MAX_WORKERS || (seen[w / 64] >> (w % 64)) & 1)
                continue;
            seen[w / 64] |= UINT64_C(1) << (w % 64);
            snprintf(nm, sizeof(nm), "worker %" PRIu32, w);
            meta(f, pid, (int)w + 1, "thread_name", nm);
        }
    }
    for (size_t i = 0; i < t->n_steps; i++)
        write_step(f, t, &t->steps[i], &flow);
    fputs("\n]}\n", f);
}

void dh__cl_trace_close(struct dh_client *c)
{
    struct cl_trace *t = c->trace;
    FILE *f;

    if (!t)
        return;
    c->trace = NULL;
    if (!(f = fopen(c->trace_path, "w")))
        dh__log(DH_LOG_ERROR, "client %u: trace %s: cannot write", c->rank,
                c->trace_path);
    else {
        write_file(c, t, f);
        if (fclose(f) != 0)
            dh__log(DH_LOG_ERROR, "client %u: trace %s: write failed", c->rank,
                    c->trace_path);
        else if (t->dropped)
            dh__log(DH_LOG_WARN,
                    "client %u: trace %s: truncated after %zu "
                    "steps (%" PRIu64 " left out)",
                    c->rank, c->trace_path, t->n_steps, t->dropped);
    }
    dh__free(t->steps);
    dh__free(t->parts);
    dh__free(t->samples);
    dh__free(t);
}
