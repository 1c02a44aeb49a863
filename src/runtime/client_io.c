/*
 * client_io.c - the client's I/O thread (client.h): the paper's sender
 * (DescriptorRequests up to `prefetch` steps ahead of consumption) and
 * fetcher (notices into the reorder buffer) in one loop over the
 * Coordinator socket, the local link and a wake-up eventfd; and the
 * restart of a dead embedded DataServer.
 *
 * Locking: takes c->mu for every touch of the schedule, reorder buffer and
 * pool, never across a wait; owns the socket and the link.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <zmq.h>

#include "core/log.h"
#include "core/alloc.h"
#include "core/clock.h"
#include "datahelix/batch.h"
#include "datahelix/media_stages.h"
#include "datahelix/spare.h"
#include "media/prefetch.h"
#include "runtime/client_internal.h"
#include "runtime/transport.h"

#define POLL_MS 100
/* How often RegisterClient is repeated: what bounds the time a restarted
 * Coordinator waits to be refilled (docs/exactly-once.md "Restarts"), at
 * the cost of one small message per rank per period (as a heartbeat). */
#define KEEPALIVE_MS 500

void dh__cl_wake(struct dh_client *c)
{
    uint64_t one = 1;

    if (write(c->wake_fd, &one, sizeof(one)) < 0) {
        /* EAGAIN: the counter is already non-zero, the thread will wake */
    }
}

uint64_t dh__cl_task_id(const struct dh_client *c, uint64_t k, uint32_t j)
{
    uint64_t id;

    /* Cannot fail: send_request() made this task from the same fields. */
    if (dh_wire_task_id(c->pass, c->first_step + k, c->rank, j, &id, NULL) < 0)
        return UINT64_MAX;
    return id;
}

/* Sets the fatal error (mu held) and wakes next(). */
static void set_fatal(struct dh_client *c, int code, const char *msg)
{
    if (!c->fatal) {
        c->fatal = 1;
        dh_err_set(&c->fatal_e, code, "rank %u: %s", c->rank, msg);
    }
    pthread_cond_broadcast(&c->cv);
}

/* ---- requests ---- */

/* Bounds of microbatch j of step position k (mu held). */
static void part_range(const struct dh_client *c, uint64_t k, uint32_t j,
                       uint64_t *lo, uint64_t *hi)
{
    uint64_t a = c->offs[k], n = c->offs[k + 1] - a;

    *lo = a + n * j / c->mb;
    *hi = a + n * (j + 1) / c->mb;
}

/* The skip policy's spares of part j of step position k: slice j of the
 * step's spares (spare.h), so the parts of one step never share one. */
static int set_spares(struct dh_client *c, uint64_t k, uint32_t j,
                      struct dh_wire_request *r, struct dh_err *e)
{
    uint32_t n, lo = j * c->spares;

    if (!c->spares)
        return 0;
    n = dh_spare_choose(c->plan.seed, c->epoch, c->first_step + k, c->rank,
                        c->ids, c->offs, c->n_steps, k, c->spares * c->mb,
                        c->spare_buf);
    if (n <= lo)
        return 0;
    n -= lo;
    return dh_wire_set_spares(r, c->spare_buf + lo,
                              n < c->spares ? n : c->spares, e);
}

/* A figure the wire accepts (finite, 0..DH_WIRE_MAX_LATENCY_MS), else 0. */
static double report_ms(double v)
{
    return v >= 0 && v <= DH_WIRE_MAX_LATENCY_MS ? v : 0;
}

/* The rank's own figures ride on each request (RankReport): the
 * Coordinator shows them on its metrics endpoint (docs/metrics.md). */
static void set_report(const struct dh_client *c, struct dh_wire_request *r)
{
    r->has_report = 1;
    r->report.steps = c->st.steps;
    r->report.misses = c->st.misses < c->st.steps ? c->st.misses : c->st.steps;
    r->report.input_wait_ms = report_ms(c->last_wait_ms);
    r->report.window_ms = report_ms(dh_window_period_ms(&c->win));
}

/* Encodes and sends the request of (k, j) without blocking (mu held).
 * 0 sent; DH_EIO (ZeroMQ refused: try later) or an encode error. */
static int send_request(struct dh_client *c, uint64_t k, uint32_t j,
                        int64_t slack_ms, struct dh_err *e)
{
    struct dh_wire_msg m;
    struct dh_wire_request *r;
    struct dh_index_columns col;
    uint64_t lo, hi, in = 0;
    double cpu = 0;
    int rc;

    part_range(c, k, j, &lo, &hi);
    dh_index_columns(c->ix, &col);
    for (uint64_t i = lo; i < hi; i++) {
        cpu += c->ids[i] < col.count ? col.est_cpu_ms[c->ids[i]] : 0;
        in += dh_index_bytes(c->ix, c->ids[i]);
    }
    dh_wire_msg_init(&m, DH_WIRE_DESCRIPTOR_REQUEST);
    r = &m.u.request;
    r->requester_rank = c->rank;
    r->slack_ms = slack_ms;
    r->hints.est_cpu_ms = cpu > 0 && cpu < DH_WIRE_MAX_LATENCY_MS ? cpu : 0;
    r->hints.est_out_bytes = dh_batch_bytes(&c->plan, (uint32_t)(hi - lo));
    r->hints.est_in_bytes = in < DH_WIRE_MAX_BYTES ? in : DH_WIRE_MAX_BYTES;
    r->hints.steps_ahead = (uint32_t)(k - c->next_consume);
    /* A packed batch (native size) is not forwarded between servers yet:
     * the payload check wants a [B, ...] tensor (batch_packed.h). */
    r->hints.local_only = c->plan.geometry == DH_GEOM_NATIVE;
    set_report(c, r);
    if ((rc = dh_wire_task_make(&r->task, c->epoch, c->pass, c->first_step + k,
                                c->rank, j, e)) < 0 ||
        (rc = dh_wire_set_samples(r, c->ids + lo, hi - lo, e)) < 0 ||
        (rc = dh_wire_plan_from_media(&r->plan, &c->plan, e)) < 0 ||
        (rc = set_spares(c, k, j, r, e)) < 0)
        goto out;
    if ((rc = dh__tp_send(c->sock, NULL, &m, c->coord, e)) == 0) {
        c->st.requests++;
        /* its remote samples' bytes start toward the host cache now */
        dh__prefetch_push(c->ahead, c->ids + lo, (size_t)(hi - lo));
    }
out:
    dh_wire_msg_fini(&m);
    return rc;
}

int64_t dh__cl_slack_ms(const struct dh_client *c, uint64_t k)
{
    /* next_consume - 1 is the step being computed; issued at the start of
     * its window (place.h), so elapsed is 0, as in the simulator. */
    double s = dh_window_slack_ms(&c->win, (int)(k - c->next_consume + 1), 0);

    if (!(s < DH_WIRE_MAX_SLACK_MS)) /* INFINITY: no deadline known */
        return DH_WIRE_MAX_SLACK_MS;
    return s > -DH_WIRE_MAX_SLACK_MS ? (int64_t)s : -DH_WIRE_MAX_SLACK_MS;
}

/* Requests steps until `prefetch` are outstanding (mu held). */
static void issue(struct dh_client *c)
{
    struct dh_err e;

    while (!c->fatal && c->ids && c->next_issue < c->n_steps &&
           c->next_issue - c->next_consume < c->prefetch) {
        uint64_t k = c->next_issue;
        int64_t slack = dh__cl_slack_ms(c, k);

        for (uint32_t j = 0; j < c->mb; j++) {
            struct cl_sent *s = &c->sent[(k % c->prefetch) * c->mb + j];
            int rc = send_request(c, k, j, slack, &e);

            if (rc == DH_EIO && j == 0)
                return; /* socket full: retry on the next round */
            if (rc < 0) {
                set_fatal(c, rc, e.msg);
                return;
            }
            /* Cannot fail: the window has room for this step's parts. */
            if (dh_reorder_expect(c->ro, dh__cl_task_id(c, k, j)) < 0) {
                set_fatal(c, DH_EIO, "reorder window out of step");
                return;
            }
            *s = (struct cl_sent){.task_id = dh__cl_task_id(c, k, j),
                                  .sent_ms = dh__mono_ms(),
                                  .sent_msf = dh__mono_msf(),
                                  .slack_ms = slack,
                                  .reissued = 0};
        }
        c->next_issue++;
    }
}

/* Re-sends every outstanding task without an outcome of this pass;
 * returns how many it tried (mu held). */
static size_t reissue(struct dh_client *c)
{
    uint64_t *ids = c->pend;
    size_t n = 0, tried = 0;
    struct dh_err e;

    if (!c->ro || dh_reorder_pending(c->ro, ids, c->pool_n, &n) < 0)
        n = 0;
    for (size_t i = 0; i < n; i++) {
        struct dh_wire_task t;
        uint64_t k;

        dh_wire_task_split(ids[i], &t);
        k = t.step - c->first_step;
        if (t.pass != c->pass || k >= c->n_steps)
            continue;
        tried++;
        /* Set before sending: the old execution's outcome may come first. */
        c->sent[(k % c->prefetch) * c->mb + t.microbatch].reissued = 1;
        if (send_request(
                c, k, t.microbatch,
                c->sent[(k % c->prefetch) * c->mb + t.microbatch].slack_ms,
                &e) < 0)
            dh__log(DH_LOG_ERROR,
                    "client %u: re-issuing task %llu: "
                    "%s",
                    c->rank, (unsigned long long)ids[i], e.msg);
        else
            c->st.reissued++;
    }
    return tried;
}

/* ---- the Coordinator's view of this client ---- */

int dh__cl_send_register(struct dh_client *c, const char *peer,
                         struct dh_err *e)
{
    struct dh_wire_msg m;
    int rc;

    dh_wire_msg_init(&m, DH_WIRE_REGISTER_CLIENT);
    m.u.register_client.rank = c->rank;
    m.u.register_client.world_size = c->world;
    m.u.register_client.pid = (uint32_t)getpid();
    memcpy(m.u.register_client.token, c->token, sizeof(c->token));
    if (gethostname(m.u.register_client.host,
                    sizeof(m.u.register_client.host) - 1) < 0)
        m.u.register_client.host[0] = 0;
    rc = dh__tp_send(c->sock, NULL, &m, peer, e);
    dh_wire_msg_fini(&m);
    return rc;
}

/* The keepalive: a repeated registration, answered by every Coordinator
 * with its incarnation.  A failed send is no news (the Coordinator may be
 * down; the next period tries again). */
static void keepalive(struct dh_client *c)
{
    uint64_t now = dh__mono_ms();
    struct dh_err e;

    if (now < c->next_keepalive_ms)
        return;
    c->next_keepalive_ms = now + KEEPALIVE_MS;
    (void)dh__cl_send_register(c, NULL, &e);
}

/* An ack of this rank's registration.  Another incarnation than before is
 * a Coordinator that restarted and knows nothing of our tasks: this
 * client's reorder buffer is the authoritative list of what is
 * outstanding, so every task without an outcome is sent again, under its
 * own id.  A result that then arrives twice (the old execution's and the
 * new one's) is released by the reorder buffer, not delivered twice. */
static void on_register_ack(struct dh_client *c,
                            const struct dh_wire_register_client *r)
{
    size_t n;

    if (r->rank != c->rank || !r->incarnation ||
        r->incarnation == c->incarnation)
        return;
    c->incarnation = r->incarnation;
    pthread_mutex_lock(&c->mu);
    c->st.coordinator_restarts++;
    n = reissue(c);
    pthread_mutex_unlock(&c->mu);
    dh__log(DH_LOG_INFO,
            "client %u: coordinator %s restarted: registered "
            "again, re-issued %zu outstanding tasks",
            c->rank, c->coord, n);
}

/* ---- notices ---- */

static int arena_of(const struct dh_client *c, uint32_t server_id)
{
    int n = atomic_load(&c->n_arenas);

    for (int i = n - 1; i >= 0; i--)
        if (c->arenas[i].server_id == server_id)
            return i;
    return -1;
}

static struct cl_result *pool_get(struct dh_client *c)
{
    for (size_t i = 0; i < c->pool_n; i++)
        if (!c->pool[i].used) {
            memset(&c->pool[i], 0, sizeof(c->pool[i]));
            c->pool[i].used = 1;
            return &c->pool[i];
        }
    return NULL;
}

/* The request entry of task `id` when it is one of this pass's tasks
 * this client has sent (NULL: an abandoned pass's, or one long consumed);
 * *asked = 0 when it names a step not requested yet (mu held). */
static const struct cl_sent *sent_of(const struct dh_client *c, uint64_t id,
                                     int *asked)
{
    struct dh_wire_task t;
    const struct cl_sent *s;
    uint64_t k;

    *asked = 1;
    dh_wire_task_split(id, &t);
    if (!c->ids || t.rank != c->rank || t.pass != c->pass ||
        t.step < c->first_step || t.step - c->first_step >= c->n_steps ||
        t.microbatch >= c->mb)
        return NULL;
    k = t.step - c->first_step;
    if (k >= c->next_issue) {
        *asked = 0;
        return NULL;
    }
    s = &c->sent[(k % c->prefetch) * c->mb + t.microbatch];
    return s->task_id == id ? s : NULL;
}

/* Hands `r` to the reorder buffer; frees it (and releases its slot) if
 * the task is not outstanding or already has an outcome (mu held).  A
 * second outcome is expected only for a task sent again (a restart); for
 * any other task of this pass, or one not asked yet, it is a protocol
 * error from `server` (counted, logged, never data); `counted`: the
 * caller's own protocol error, counted already. */
static void file_result(struct dh_client *c, struct cl_result *r,
                        uint32_t server, int counted)
{
    const struct cl_sent *s;
    int accepted = 0, asked;

    r->arrived_ms = dh__mono_ms();
    r->arrived_msf = dh__mono_msf();
    if (c->ro && dh_reorder_arrive(c->ro, r->task_id, (uint64_t)(r - c->pool),
                                   &accepted) < 0)
        accepted = 0;
    if (accepted) {
        pthread_cond_broadcast(&c->cv);
        return;
    }
    s = sent_of(c, r->task_id, &asked);
    if (counted) {
        /* the caller's protocol error, already counted and logged */
    } else if (!asked || (s && !s->reissued)) {
        c->st.protocol_errors++;
        dh__log(DH_LOG_WARN,
                "client %u: protocol error: %s for task %llu from server %u "
                "(via coordinator %s) %s; not used",
                c->rank, r->is_error ? "an error" : "a result",
                (unsigned long long)r->task_id, server, c->coord,
                asked ? "which already has its outcome"
                      : "which was not asked");
    } else if (!r->is_error) {
        c->st.late_released++;
    }
    if (!r->is_error) {
        struct dh_err e;

        if (dh_arena_release(c->arenas[r->arena].a, &r->ref, &e) < 0)
            dh__log(DH_LOG_ERROR, "client %u: %s", c->rank, e.msg);
    }
    dh__cl_result_free(r);
}

void dh__cl_result_free(struct cl_result *r)
{
    dh__free(r->ids);
    dh__free(r->valid);
    dh__free(r->fail);
    dh__free(r->subs);
    dh__free(r->st.rows);
    dh__free(r->st.bytes);
    r->st.rows = NULL;
    r->st.bytes = NULL;
    r->ids = NULL;
    r->valid = NULL;
    r->fail = NULL;
    r->subs = NULL;
    r->n_subs = 0;
    r->used = 0;
}

/* The notice's substitutions (out of memory for them: the batch is still
 * good, only not annotated). */
static void take_subs(struct cl_result *r, const struct dh_wire_result *w)
{
    if (!w->n_subs || !(r->subs = dh__calloc(w->n_subs, sizeof(*r->subs))))
        return;
    for (uint32_t i = 0; i < w->n_subs; i++)
        r->subs[i] = (struct dh_client_subst){
            .position = w->sub_pos[i],
            .failed_id = w->sub_failed[i],
            .substitute_id = w->sample_ids[w->sub_pos[i]],
            .cause = w->sub_cause[i],
            .stage = (int)dh__stage_of(w->sub_cause[i])};
    r->n_subs = w->n_subs;
}

/* The notice's stage times (out of memory for the per-sample ones: the
 * task's alone; the batch is good either way). */
static void take_stages(struct cl_result *r, const struct dh_wire_result *w)
{
    const struct dh_wire_stages *s = &w->stages;
    uint32_t n = s->n_sample_times;

    r->st = (struct cl_stages){.present = s->present,
                               .server_id = s->server_id ? s->server_id
                                                         : w->server_id,
                               .worker = s->worker,
                               .queue_ms = s->queue_ms,
                               .alloc_ms = s->alloc_ms,
                               .collate_ms = s->collate_ms,
                               .place_ms = s->place_ms,
                               .notify_ms = s->notify_ms,
                               .service_ms = w->service_ms,
                               .ready_ms = (double)s->ready_us / 1e3};
    if (!s->present || !n || n != w->n_samples ||
        !(r->st.rows = dh__malloc((size_t)n * DH_MS_COUNT * sizeof(float))))
        return;
    for (uint32_t i = 0; i < n; i++) {
        float *row = r->st.rows + (size_t)i * DH_MS_COUNT;

        row[DH_MS_READ] = s->read_ms[i];
        row[DH_MS_DECODE] = s->decode_ms[i];
        row[DH_MS_SCALE] = s->scale_ms[i];
        row[DH_MS_AUDIO] = s->audio_ms ? s->audio_ms[i] : 0;
    }
    if (s->read_bytes && (r->st.bytes = dh__malloc((size_t)n * 8)))
        memcpy(r->st.bytes, s->read_bytes, (size_t)n * 8);
}

/* NULL if result `w` matches this client's own request for its task, or
 * names a task of no current request (the reorder buffer releases those);
 * else what differs.  A result is the count, ids (a substitute only at a
 * position the notice marks, for the id asked there), dtype and leading
 * dim the request implies (mu held). */
static const char *mismatch(const struct dh_client *c,
                            const struct dh_wire_result *w, char *buf,
                            size_t len)
{
    struct dh_wire_task t;
    uint64_t k, lo, hi;
    uint32_t s = 0;
    int opaque = 0;

    dh_wire_task_split(w->task.id, &t);
    if (t.rank != c->rank || t.pass != c->pass || t.step < c->first_step ||
        t.step - c->first_step >= c->n_steps || t.microbatch >= c->mb)
        return NULL;
    /* The task id leaves the epoch out (its pass names it): a result under
     * this pass's id but another epoch would be filed as this pass's
     * task, so it is checked like any other (found by fuzz_client_seq). */
    if (w->task.epoch != c->epoch) {
        snprintf(buf, len, "epoch %u, %u asked", w->task.epoch, c->epoch);
        return buf;
    }
    k = t.step - c->first_step;
    part_range(c, k, t.microbatch, &lo, &hi);
    /* A Python-dataset request's first id is a header (bit 63; the
     * iteration's seed), which its result leaves out: the batch is one
     * opaque uint8 slot (docs/python.md), so ids and count are all there
     * is to check. */
    if (hi - lo > 1 && c->ids[lo] >> 63) {
        opaque = 1;
        lo++;
    }
    if (w->n_samples != hi - lo) {
        snprintf(buf, len, "%u samples, %llu asked", w->n_samples,
                 (unsigned long long)(hi - lo));
        return buf;
    }
    for (uint32_t i = 0; i < w->n_samples; i++) {
        int sub = s < w->n_subs && w->sub_pos[s] == i;

        if (sub && w->sub_failed[s++] != c->ids[lo + i]) {
            snprintf(buf, len, "a substitute for sample %llu, not asked",
                     (unsigned long long)w->sub_failed[s - 1]);
            return buf;
        }
        if (!sub && w->sample_ids[i] != c->ids[lo + i]) {
            snprintf(buf, len, "sample %llu at position %u, %llu asked",
                     (unsigned long long)w->sample_ids[i], i,
                     (unsigned long long)c->ids[lo + i]);
            return buf;
        }
    }
    if (opaque)
        return NULL;
    if (w->dtype != c->plan.dtype) {
        snprintf(buf, len, "dtype %d, %d asked", (int)w->dtype,
                 (int)c->plan.dtype);
        return buf;
    }
    /* A packed batch (native geometry) is one flat tensor; any other has
     * the samples as its leading dim. */
    if (c->plan.geometry != DH_GEOM_NATIVE && w->dims[0] != w->n_samples) {
        snprintf(buf, len, "leading dim %llu for %u samples",
                 (unsigned long long)w->dims[0], w->n_samples);
        return buf;
    }
    /* the sound lies after the frames: a slot without room for it (a
     * server that does not know the plan's audio fields) is refused */
    if (c->plan.audio_rate > 0 &&
        w->length < dh_batch_bytes(&c->plan, w->n_samples)) {
        snprintf(buf, len, "a slot of %llu bytes, %zu needed with sound",
                 (unsigned long long)w->length,
                 dh_batch_bytes(&c->plan, w->n_samples));
        return buf;
    }
    return NULL;
}

/* A result that is not what was asked: its slot goes back and the task
 * fails with DH_EPROTO (mu held). */
static void protocol_error(struct dh_client *c, const struct dh_wire_result *w,
                           int ai, const struct dh_slot_ref *ref,
                           const char *why)
{
    struct cl_result *r;
    struct dh_err e;

    if (dh_arena_release(c->arenas[ai].a, ref, &e) < 0)
        dh__log(DH_LOG_ERROR, "client %u: %s", c->rank, e.msg);
    c->st.protocol_errors++;
    dh__log(DH_LOG_WARN,
            "client %u: protocol error: the result of task %llu "
            "from server %u (via coordinator %s) does not match the "
            "request (%s); not used",
            c->rank, (unsigned long long)w->task.id, w->server_id, c->coord,
            why);
    if (!(r = pool_get(c)))
        return;
    r->task_id = w->task.id;
    r->is_error = 1;
    r->code = DH_EPROTO;
    r->sample_id = w->n_samples ? w->sample_ids[0] : 0;
    snprintf(r->msg, sizeof(r->msg),
             "protocol error: server %u's result does not match the request "
             "(%.200s)",
             w->server_id, why);
    file_result(c, r, w->server_id, 1);
}

/* A result that names no slot this client may take: counted and logged,
 * nothing released and nothing filed (mu held).  `what`: the slot it
 * names, said after "names". */
static void protocol_drop(struct dh_client *c, const struct dh_wire_result *w,
                          const char *what)
{
    c->st.protocol_errors++;
    dh__log(DH_LOG_WARN,
            "client %u: protocol error: the result of task %llu from "
            "server %u (via coordinator %s) names %s; not used",
            c->rank, (unsigned long long)w->task.id, w->server_id, c->coord,
            what);
}

static void on_result(struct dh_client *c, const struct dh_wire_result *w)
{
    char why[160];
    const char *bad;
    int ai = arena_of(c, w->server_id);
    struct dh_slot_ref ref = {
        .offset = w->arena_offset, .len = w->length, .gen = w->slot_generation};
    struct cl_result *r;

    if (ai < 0 || !dh_arena_ptr(c->arenas[ai].a, &ref)) {
        /* Not in an arena we know: nothing to release, nothing to use. */
        snprintf(why, sizeof(why), "%s (offset %llu)",
                 ai < 0 ? "an unknown arena" : "no live slot",
                 (unsigned long long)w->arena_offset);
        pthread_mutex_lock(&c->mu);
        protocol_drop(c, w, why);
        pthread_mutex_unlock(&c->mu);
        return;
    }
    pthread_mutex_lock(&c->mu);
    if (dh__cl_slot_held(c, ai, &ref)) {
        /* A notice for a slot this client already holds (a duplicate, or
         * a forgery naming it): the holder keeps it, nothing is released
         * (that would free memory the consumer reads) and nothing filed. */
        snprintf(why, sizeof(why), "slot %llu, which this client already holds",
                 (unsigned long long)w->arena_offset);
        protocol_drop(c, w, why);
        pthread_mutex_unlock(&c->mu);
        return;
    }
    if ((bad = mismatch(c, w, why, sizeof(why)))) {
        protocol_error(c, w, ai, &ref, bad);
        pthread_mutex_unlock(&c->mu);
        return;
    }
    if (!(r = pool_get(c))) {
        /* Every entry holds the outcome of a step in the window, so this
         * result is not for one of them (e.g. an abandoned epoch's, come
         * back after the new epoch's whole window): give its slot back. */
        struct dh_err e;

        if (dh_arena_release(c->arenas[ai].a, &ref, &e) < 0)
            dh__log(DH_LOG_ERROR, "client %u: %s", c->rank, e.msg);
        c->st.late_released++;
        pthread_mutex_unlock(&c->mu);
        return;
    }
    r->task_id = w->task.id;
    r->arena = ai;
    r->ref = ref;
    memcpy(r->dims, w->dims, sizeof(r->dims));
    r->ndims = w->ndims;
    r->dtype = w->dtype;
    r->layout = w->layout;
    r->n = w->n_samples;
    r->ids = dh__malloc((w->n_samples + 1) * sizeof(*r->ids));
    r->valid = dh__malloc((w->n_samples + 1) * sizeof(*r->valid));
    if (!r->ids || !r->valid) {
        r->is_error = 1; /* the slot still goes back */
        if (dh_arena_release(c->arenas[ai].a, &ref, NULL) < 0) {
            /* stale already: nothing more to give back */
        }
        r->code = DH_ENOMEM;
        snprintf(r->msg, sizeof(r->msg), "out of memory for task %llu",
                 (unsigned long long)w->task.id);
    } else {
        memcpy(r->ids, w->sample_ids, w->n_samples * sizeof(*r->ids));
        memcpy(r->valid, w->valid_frames, w->n_samples * sizeof(*r->valid));
        take_subs(r, w);
        take_stages(r, w);
    }
    file_result(c, r, w->server_id, 0);
    pthread_mutex_unlock(&c->mu);
}

/* The cause in a server's message, without the prefixes that repeat what
 * the client says itself ("task N: ", "sample N (PATH): ", "PATH: "). */
static const char *cause_of(const struct dh_wire_error *w)
{
    const char *m = w->message;
    char pre[DH_WIRE_MAX_PATH + 64];
    size_t n;

    if (!strncmp(m, "task ", 5) && m[5] >= '0' && m[5] <= '9') {
        const char *p = m + 5;

        while (*p >= '0' && *p <= '9')
            p++;
        if (p[0] == ':' && p[1] == ' ')
            m = p + 2;
    }
    n = (size_t)snprintf(pre, sizeof(pre),
                         "sample %llu (%s): ", (unsigned long long)w->sample_id,
                         w->path);
    if (n < sizeof(pre) && !strncmp(m, pre, n))
        m += n;
    n = (size_t)snprintf(pre, sizeof(pre), "%s: ", w->path);
    if (w->path[0] && n < sizeof(pre) && !strncmp(m, pre, n))
        m += n;
    return m;
}

static void on_error(struct dh_client *c, const struct dh_wire_error *w)
{
    struct cl_result *r;

    pthread_mutex_lock(&c->mu);
    if ((r = pool_get(c))) {
        r->task_id = w->task.id;
        r->is_error = 1;
        r->code = w->cause;
        r->sample_id = w->sample_id;
        snprintf(r->msg, sizeof(r->msg), "sample %llu (%.200s): %.280s",
                 (unsigned long long)w->sample_id,
                 w->path[0] ? w->path : "no path", cause_of(w));
        if ((r->fail = dh__calloc(1, sizeof(*r->fail)))) {
            r->fail->sample_id = w->sample_id;
            snprintf(r->fail->path, sizeof(r->fail->path), "%s", w->path);
            r->fail->cause = w->cause;
            r->fail->stage = dh__stage_of(w->cause);
            r->fail->server_id = w->server_id;
            snprintf(r->fail->message, sizeof(r->fail->message), "%s",
                     cause_of(w));
        }
        file_result(c, r, w->server_id, 0);
    }
    pthread_mutex_unlock(&c->mu);
}

static void on_route(struct dh_client *c, const struct dh_wire_route *w)
{
    pthread_mutex_lock(&c->mu);
    for (size_t i = 0; i < c->pool_n; i++)
        if (c->sent[i].task_id == w->task.id)
            c->sent[i].route_server = w->server_id;
    pthread_mutex_unlock(&c->mu);
}

static void dispatch(struct dh_client *c, const struct dh_wire_msg *m)
{
    char why[512];

    switch (m->type) {
    case DH_WIRE_RESULT_NOTICE:
        on_result(c, &m->u.result);
        break;
    case DH_WIRE_ERROR_NOTICE:
        on_error(c, &m->u.error);
        break;
    case DH_WIRE_ROUTE:
        on_route(c, &m->u.route);
        break;
    case DH_WIRE_REGISTER_CLIENT:
        on_register_ack(c, &m->u.register_client);
        break;
    case DH_WIRE_SHUTDOWN:
        snprintf(why, sizeof(why), "coordinator %.200s shut down: %.200s",
                 c->coord, m->u.shutdown.reason);
        pthread_mutex_lock(&c->mu);
        set_fatal(c, DH_EIO, why);
        pthread_mutex_unlock(&c->mu);
        break;
    default:
        dh__log(DH_LOG_WARN,
                "client %u: the coordinator may not send "
                "%s; ignored",
                c->rank, dh_wire_type_name(m->type));
    }
}

void dh__cl_feed(struct dh_client *c, const struct dh_wire_msg *m)
{
    dispatch(c, m);
}

void dh__cl_pump(struct dh_client *c)
{
    pthread_mutex_lock(&c->mu);
    issue(c);
    pthread_mutex_unlock(&c->mu);
}

/* Receives every waiting message.  < 0 if the socket failed. */
static int drain(struct dh_client *c)
{
    for (int i = 0; i < 256; i++) {
        struct dh_wire_msg m;
        struct dh_err e;
        int rc = dh__tp_recv(c->sock, NULL, &m, c->coord, &e);

        if (rc == 0 || rc == DH_EIO)
            return rc == 0 ? 0 : -1;
        if (rc < 0) {
            dh__log(DH_LOG_WARN,
                    "client %u: malformed message from "
                    "the coordinator: %s",
                    c->rank, e.msg);
        } else {
            dispatch(c, &m);
            dh_wire_msg_fini(&m);
        }
    }
    return 0;
}

/* ---- the local server died ---- */

static void on_link_dead(struct dh_client *c)
{
    char why[160], msg[DH_ERR_MSG_MAX];
    struct dh_err e;
    uint32_t next_id;
    uint64_t restarts;

    close(c->link_fd);
    c->link_fd = -1;
    if (c->child <= 0) {
        pthread_mutex_lock(&c->mu);
        snprintf(msg, sizeof(msg), "local dataserver @%s went away",
                 c->ds_name ? c->ds_name : "?");
        set_fatal(c, DH_EPEERDEAD, msg);
        pthread_mutex_unlock(&c->mu);
        return;
    }
    /* Exit status 0: it was asked to stop (a Shutdown from the
     * Coordinator, a signal it handles), so it is not restarted. */
    if (dh__cl_reap(c, 2000, why, sizeof(why)) == 0) {
        snprintf(msg, sizeof(msg),
                 "local dataserver stopped (%s): the "
                 "coordinator %.200s shut down or it was told to stop",
                 why, c->coord);
        pthread_mutex_lock(&c->mu);
        set_fatal(c, DH_EIO, msg);
        pthread_mutex_unlock(&c->mu);
        return;
    }
    pthread_mutex_lock(&c->mu);
    restarts = c->st.restarts;
    pthread_mutex_unlock(&c->mu);
    if ((int)restarts >= c->max_restarts || restarts + 1 >= CL_MAX_ARENAS) {
        snprintf(msg, sizeof(msg),
                 "local dataserver died (%s) and %llu "
                 "restarts are used up",
                 why, (unsigned long long)restarts);
        pthread_mutex_lock(&c->mu);
        set_fatal(c, DH_EPEERDEAD, msg);
        pthread_mutex_unlock(&c->mu);
        return;
    }
    dh__log(DH_LOG_WARN,
            "client %u: local dataserver died (%s); "
            "starting a new one (restart %llu of %d)",
            c->rank, why, (unsigned long long)restarts + 1, c->max_restarts);
    /* A new server id: the Coordinator lets it supersede the old one. */
    next_id = c->server_id + (1u << 16);
    if (dh__cl_start_server(c, next_id, &e) < 0) {
        snprintf(msg, sizeof(msg), "restarting the local dataserver: %.400s",
                 e.msg);
        pthread_mutex_lock(&c->mu);
        set_fatal(c, DH_EPEERDEAD, msg);
        pthread_mutex_unlock(&c->mu);
        return;
    }
    pthread_mutex_lock(&c->mu);
    c->st.restarts++;
    (void)reissue(c);
    pthread_mutex_unlock(&c->mu);
}

void *dh__cl_io_main(void *arg)
{
    struct dh_client *c = arg;
    sigset_t all;

    /* Signals are the training process's business, not this thread's. */
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL);
    while (!atomic_load(&c->stop)) {
        zmq_pollitem_t it[3] = {{.socket = c->sock, .events = ZMQ_POLLIN},
                                {.fd = c->wake_fd, .events = ZMQ_POLLIN}};
        int n = 2;

        if (c->link_fd >= 0)
            it[n++] = (zmq_pollitem_t){.fd = c->link_fd, .events = ZMQ_POLLIN};
        if (zmq_poll(it, n, POLL_MS) < 0 && zmq_errno() != EINTR) {
            pthread_mutex_lock(&c->mu);
            set_fatal(c, DH_EIO, "polling the coordinator socket failed");
            pthread_mutex_unlock(&c->mu);
            break;
        }
        if (it[1].revents & ZMQ_POLLIN) {
            uint64_t v;

            if (read(c->wake_fd, &v, sizeof(v)) < 0) {
                /* EAGAIN: someone else drained it */
            }
        }
        if (n == 3 && (it[2].revents & (ZMQ_POLLIN | ZMQ_POLLERR)))
            on_link_dead(c);
        if (drain(c) < 0) {
            pthread_mutex_lock(&c->mu);
            set_fatal(c, DH_EIO, "receiving from the coordinator failed");
            pthread_mutex_unlock(&c->mu);
            break;
        }
        keepalive(c);
        pthread_mutex_lock(&c->mu);
        issue(c);
        pthread_mutex_unlock(&c->mu);
    }
    return NULL;
}
