/*
 * dataserver_jobs.c - a DataServer's job table and client slots
 * (include/datahelix/dataserver.h): a Route becomes a job for the worker
 * pool (workers.h); its completion becomes a ResultNotice naming the slot
 * (local), a forward to the delivery target (remote, dataserver_remote.c)
 * or an ErrorNotice.  The slots handed to the client are remembered so
 * that a Release (offset, generation) finds its length.
 *
 * Design: the job table is sized to the jobs that can be in the pool at
 * once (queue + threads), so a request is either admitted or answered
 * with an ErrorNotice at once, never dropped.  A remote job stays in the
 * table while its batch waits for the target (job->parked).
 *
 * Locking: none (dataserver_internal.h).
 */
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "datahelix/batch.h"
#include "runtime/dataserver_internal.h"

#define EWMA_ALPHA 0.2

int dh__ds_jobs_init(struct dh_dataserver *s, size_t n, struct dh_err *e)
{
    s->n_jobs = n;
    if (!(s->jobs = dh__calloc(n, sizeof(*s->jobs))))
        return dh_err_set(e, DH_ENOMEM, "out of memory");
    return 0;
}

void dh__ds_jobs_fini(struct dh_dataserver *s)
{
    for (size_t i = 0; s->jobs && i < s->n_jobs; i++)
        dh__ds_job_clear(s, &s->jobs[i]);
    dh__free(s->jobs);
    s->jobs = NULL;
}

/* ---- slots handed to the client ---- */

void dh__ds_remember_slot(struct dh_dataserver *s, const struct dh_slot_ref *r)
{
    int victim = -1;

    for (int i = 0; i < DS_N_SENT && victim < 0; i++)
        if (!s->sent[i].used)
            victim = i;
    /* Full: forget one the client has released already.  There are at
     * most DH_ARENA_MAX_SLOTS live slots, so one of DS_N_SENT is dead. */
    for (int i = 0; i < DS_N_SENT && victim < 0; i++)
        if (!dh_arena_ptr(s->arena, &s->sent[i].ref))
            victim = i;
    if (victim < 0)
        victim = 0; /* lock timed out everywhere: overwrite the oldest */
    s->sent[victim] = (struct ds_sent){.used = 1, .ref = *r};
}

void dh__ds_on_release(struct dh_dataserver *s,
                       const struct dh_wire_release *r)
{
    struct dh_err e;

    for (int i = 0; i < DS_N_SENT; i++) {
        struct ds_sent *t = &s->sent[i];

        if (!t->used || t->ref.offset != r->slot_offset ||
            t->ref.gen != r->generation)
            continue;
        t->used = 0;
        if (dh_arena_release(s->arena, &t->ref, &e) < 0)
            fprintf(stderr, "datahelix: dataserver %u: release of task "
                    "%llu: %s\n", s->server_id,
                    (unsigned long long)r->task.id, e.msg);
        else
            DS_INC(s, releases);
        return;
    }
    fprintf(stderr, "datahelix: dataserver %u: release of unknown slot "
            "(offset %llu, generation %u) for task %llu ignored\n",
            s->server_id, (unsigned long long)r->slot_offset,
            r->generation, (unsigned long long)r->task.id);
}

void dh__ds_drop_slot(struct dh_dataserver *s, const struct dh_slot_ref *r)
{
    struct dh_err e;

    if (dh_arena_release(s->arena, r, &e) < 0)
        fprintf(stderr, "datahelix: dataserver %u: %s\n", s->server_id,
                e.msg);
}

/* ---- jobs ---- */

static struct ds_job *job_free_slot(struct dh_dataserver *s)
{
    for (size_t i = 0; i < s->n_jobs; i++)
        if (!s->jobs[i].used)
            return &s->jobs[i];
    return NULL;
}

static struct ds_job *job_find(struct dh_dataserver *s, uint64_t task_id)
{
    for (size_t i = 0; i < s->n_jobs; i++)
        if (s->jobs[i].used && !s->jobs[i].parked &&
            s->jobs[i].task.id == task_id)
            return &s->jobs[i];
    return NULL;
}

void dh__ds_job_clear(struct dh_dataserver *s, struct ds_job *j)
{
    if (j->parked)
        dh__ds_drop_slot(s, &j->slot);
    dh_wire_free(j->hdr);
    dh__free(j->ids);
    memset(j, 0, sizeof(*j));
}

static int job_submit(struct dh_dataserver *s, struct ds_job *j,
                      const struct dh_wire_route *r, struct dh_err *e)
{
    const struct dh_wire_request *rq = &r->request;
    struct dh_work w;

    if (!(j->ids = dh__malloc(rq->n_samples * sizeof(*j->ids))))
        return dh_err_set(e, DH_ENOMEM, "out of memory");
    memcpy(j->ids, rq->sample_ids, rq->n_samples * sizeof(*j->ids));
    j->n = rq->n_samples;
    j->task = rq->task;
    j->target_id = r->target_server_id;
    memcpy(j->target_addr, r->target_addr, sizeof(j->target_addr));
    if (s->py) { /* Python-dataset mode: the plan does not apply */
        j->used = 1;
        dh__ds_py_submit(s, j);
        return 0;
    }
    dh_wire_plan_to_media(&rq->plan, &j->plan);
    w = (struct dh_work){.task_id = rq->task.id, .epoch = rq->task.epoch,
                         .ids = j->ids, .n = j->n, .plan = &j->plan,
                         .alloc_timeout_ms = s->alloc_timeout_ms,
                         .sample_timeout_ms = s->sample_timeout_ms};
    j->used = 1;
    if (dh_workers_submit(s->pool, &w, 0, e) < 0) {
        dh__ds_job_clear(s, j);
        return e->code < 0 ? e->code : DH_EIO;
    }
    j->plan.indices = NULL; /* borrowed from rq; the pool copied the plan */
    return 0;
}

/* ---- quarantine ---- */

/* Resource errors (a full arena or queue, memory) say nothing about the
 * sample they name, so only a sample's own failure is remembered. */
static void quarantine_add(struct dh_dataserver *s, uint64_t id, int code,
                           const char *msg)
{
    struct ds_quarantine *q;

    if (code == DH_ETIMEOUT || code == DH_ENOMEM || code == DH_ETOOBIG ||
        code == DH_EARENA || code >= 0)
        return;
    for (size_t i = 0; i < DS_QUARANTINE; i++)
        if (s->quar[i].code && s->quar[i].id == id)
            return;
    q = &s->quar[s->quar_next];
    s->quar_next = (s->quar_next + 1) % DS_QUARANTINE;
    q->id = id;
    q->code = code;
    snprintf(q->msg, sizeof(q->msg), "%.250s", msg);
    DS_INC(s, quarantined);
}

static const struct ds_quarantine *quarantine_find(
    const struct dh_dataserver *s, const struct dh_wire_request *rq)
{
    for (uint32_t k = 0; k < rq->n_samples; k++)
        for (size_t i = 0; i < DS_QUARANTINE; i++)
            if (s->quar[i].code && s->quar[i].id == rq->sample_ids[k])
                return &s->quar[i];
    return NULL;
}

void dh__ds_on_route(struct dh_dataserver *s, const struct dh_wire_route *r)
{
    const struct dh_wire_request *rq = &r->request;
    const struct ds_quarantine *q;
    struct ds_job *j;
    struct dh_err e;

    if (!r->has_request) {
        dh__ds_malformed(s, "the coordinator", "route without a request");
        return;
    }
    if ((q = quarantine_find(s, rq))) {
        char msg[DH_WIRE_MAX_TEXT];

        DS_INC(s, quarantine_hits);
        snprintf(msg, sizeof(msg), "%s (failed before; quarantined)", q->msg);
        dh__ds_send_error(s, &rq->task, q->id, q->code, msg);
        return;
    }
    dh_err_clear(&e);
    if (!(j = job_free_slot(s)))
        dh_err_set(&e, DH_ETOOBIG, "dataserver %u busy: %zu jobs in flight",
                   s->server_id, s->n_jobs);
    else if (job_submit(s, j, r, &e) == 0) {
        DS_INC(s, routes);
        return;
    }
    dh__ds_send_error(s, &rq->task, rq->sample_ids[0], e.code, e.msg);
}

/* ---- completions ---- */

/* dims of the tensor a job's slot holds. */
static uint32_t fill_dims(const struct ds_job *j, uint64_t *dims)
{
    uint64_t t = (uint64_t)dh_batch_frames(&j->plan);

    dims[0] = j->n;
    dims[1] = t;
    if (j->plan.layout == DH_LAYOUT_TCHW) {
        dims[2] = 3;
        dims[3] = j->plan.height;
        dims[4] = j->plan.width;
    } else {
        dims[2] = j->plan.height;
        dims[3] = j->plan.width;
        dims[4] = 3;
    }
    return 5;
}

int dh__ds_result_fill(struct dh_wire_msg *m, const struct ds_job *j,
                       const struct dh_work_done *d, uint32_t server_id,
                       struct dh_err *e)
{
    struct dh_wire_result *r;
    uint32_t *valid = dh__malloc(j->n * sizeof(*valid));
    int rc;

    if (!valid)
        return dh_err_set(e, DH_ENOMEM, "out of memory");
    for (uint32_t i = 0; i < j->n; i++)
        valid[i] = d->valid_frames[i] < 0 ? 0 : (uint32_t)d->valid_frames[i];
    dh_wire_msg_fini(m);
    dh_wire_msg_init(m, DH_WIRE_RESULT_NOTICE);
    r = &m->u.result;
    r->task = j->task;
    r->server_id = server_id;
    r->ndims = fill_dims(j, r->dims);
    r->dtype = j->plan.dtype;
    r->layout = j->plan.layout;
    r->service_ms = d->decode_ms > 0 && d->decode_ms < DH_WIRE_MAX_LATENCY_MS
                        ? d->decode_ms : 0;
    rc = dh_wire_set_result_samples(r, j->ids, valid, j->n, e);
    dh__free(valid);
    return rc;
}

/* Local: the notice names the slot, whose reference passes to the client
 * with it. */
static int send_result(struct dh_dataserver *s, const struct ds_job *j,
                       const struct dh_work_done *d, struct dh_err *e)
{
    int rc = dh__ds_result_fill(&s->out, j, d, s->server_id, e);

    if (rc < 0)
        return rc;
    s->out.u.result.arena_offset = d->slot.offset;
    s->out.u.result.length = d->slot.len;
    s->out.u.result.slot_generation = d->slot.gen;
    return dh__ds_send_msg(s, &s->out, e);
}

/* The sample a failed job names: the pool's failed_at, else (a whole-job
 * error such as an id the batch checks refuse up front) the first id that
 * is not in the index, else the first id. */
static uint64_t failed_sample(const struct dh_dataserver *s,
                              const struct ds_job *j,
                              const struct dh_work_done *d)
{
    uint64_t count = dh_index_count(s->ix);

    if (d->failed_at < j->n)
        return j->ids[d->failed_at];
    for (uint32_t i = 0; i < j->n; i++)
        if (j->ids[i] >= count)
            return j->ids[i];
    return j->ids[0];
}

static void on_done(struct dh_dataserver *s, struct dh_work_done *d)
{
    struct ds_job *j = job_find(s, d->task_id);
    struct dh_err e;

    if (!j) { /* cannot happen: every admitted job has an entry */
        fprintf(stderr, "datahelix: dataserver %u: completion of unknown "
                "task %llu\n", s->server_id, (unsigned long long)d->task_id);
        if (d->code == 0)
            dh__ds_drop_slot(s, &d->slot);
        return;
    }
    s->latency_ms = s->latency_ms == 0 ? d->decode_ms
                    : (1 - EWMA_ALPHA) * s->latency_ms +
                      EWMA_ALPHA * d->decode_ms;
    if (d->code < 0) {
        uint64_t bad = failed_sample(s, j, d);

        quarantine_add(s, bad, d->code, d->msg);
        dh__ds_send_error(s, &j->task, bad, d->code, d->msg);
    } else if (s->remote) {
        dh__ds_forward(s, j, d); /* clears or parks j */
        return;
    } else if (send_result(s, j, d, &e) < 0) {
        dh__ds_drop_slot(s, &d->slot);
        dh__ds_send_error(s, &j->task, j->ids[0], e.code, e.msg);
    } else {
        dh__ds_remember_slot(s, &d->slot);
        DS_INC(s, results);
    }
    dh__ds_job_clear(s, j);
}

void dh__ds_collect(struct dh_dataserver *s)
{
    struct dh_work_done d;

    if (s->py)
        dh__ds_py_serve(s);
    while (dh_workers_wait(s->pool, &d, 0) == 0) {
        on_done(s, &d);
        dh_work_done_fini(&d);
    }
}
