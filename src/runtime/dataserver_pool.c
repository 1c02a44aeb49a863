/*
 * dataserver_pool.c - the executor that runs a DataServer's jobs on the C
 * decode pool (workers.h): fetch -> decode -> sample -> resize -> collate
 * into a slot of the server's arena.
 *
 * Design: submit() hands the job's ids and plan to the pool (which copies
 * the plan) and keeps the job in `run` until the pool's completion for its
 * task id comes back; drain() turns each completion into a RESULT (dims
 * [B,T,H,W,3] for THWC, [B,T,3,H,W] for TCHW, the plan's dtype and layout,
 * the valid frames, the decode time) or an ERROR naming the failed sample
 * (quarantined by the core: a sample's own failure).  Completions wake
 * the loop's poll through the pool's eventfd (dh_workers_fd()), so a
 * decode's end is noticed at once, not on the loop's DS_POLL_MS tick.
 *
 * Locking: none; the pool's own threads are behind workers.h.
 */
#include <stdio.h>
#include <string.h>

#include "core/log.h"
#include "core/alloc.h"
#include "datahelix/batch.h"
#include "datahelix/batch_packed.h"
#include "datahelix/media_stages.h"
#include "runtime/dataserver_internal.h"

struct ds_pool {
    struct ds_exec x; /* first */
    const struct ds_env *env;
    struct ds_sink sink;
    struct dh_workers *w;
    struct ds_job **run; /* jobs in the pool */
    size_t cap;
};

static int pool_submit(struct ds_exec *x, struct ds_job *j, struct dh_err *e)
{
    struct ds_pool *p = (struct ds_pool *)x;
    struct dh_work w = {.task_id = j->task.id,
                        .epoch = j->task.epoch,
                        .ids = j->ids,
                        .n = j->n,
                        .plan = &j->plan,
                        .alloc_timeout_ms = p->env->alloc_timeout_ms,
                        .sample_timeout_ms = p->env->sample_timeout_ms,
                        .spares = j->spares,
                        .n_spares = j->n_spares,
                        .known = j->known};
    size_t i = 0;

    while (i < p->cap && p->run[i])
        i++;
    if (i == p->cap) /* cannot happen: cap = the core's job table */
        return dh_err_set(e, DH_ETOOBIG, "dataserver %u busy",
                          p->env->server_id);
    if (dh_workers_submit(p->w, &w, 0, e) < 0)
        return e->code < 0 ? e->code : DH_EIO;
    p->run[i] = j;
    return 0;
}

static struct ds_job *take_job(struct ds_pool *p, uint64_t task_id)
{
    for (size_t i = 0; i < p->cap; i++)
        if (p->run[i] && p->run[i]->task.id == task_id) {
            struct ds_job *j = p->run[i];

            p->run[i] = NULL;
            return j;
        }
    return NULL;
}

/* dims of the tensor a job's slot holds; a packed batch (batch_packed.h)
 * is one flat run of `used` bytes, table included, in elements of its
 * dtype: the client reads the shapes from the table. */
static uint32_t fill_dims(const struct ds_job *j, size_t used, uint64_t *dims)
{
    uint64_t t = (uint64_t)dh_batch_frames(&j->plan);

    if (dh_batch_is_packed(&j->plan)) {
        dims[0] = used / (j->plan.dtype == DH_DTYPE_F32 ? 4 : 1);
        return 1;
    }

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

/* The sample a failed job names: the pool's failed_at, else (a whole-job
 * error such as an id the batch checks refuse up front) the first id that
 * is not in the index, else the first id. */
static uint64_t failed_sample(const struct ds_pool *p, const struct ds_job *j,
                              const struct dh_work_done *d)
{
    uint64_t count = dh_index_count(p->env->ix);

    if (d->failed_at < j->n)
        return j->ids[d->failed_at];
    for (uint32_t i = 0; i < j->n; i++)
        if (j->ids[i] >= count)
            return j->ids[i];
    return j->ids[0];
}

/* The substitutions of a completed job: the job's ids become the ones
 * delivered, the result points at the rest. */
static void apply_subs(struct ds_job *j, const struct dh_work_done *d,
                       struct ds_result *r)
{
    const struct dh_batch_subs *s = d->subs;

    if (!s || !s->n)
        return;
    for (uint32_t i = 0; i < s->n; i++)
        if (s->pos[i] < j->n)
            j->ids[s->pos[i]] = s->sub[i];
    r->sub_pos = s->pos;
    r->sub_failed = s->failed;
    r->sub_cause = s->cause;
    r->n_subs = s->n;
}

/* Where the job's time went: queued, slot, per sample, and the rest of
 * its service time (collate: padding, tables, the batch's own work). */
static void stage_times(const struct ds_job *j, const struct dh_work_done *d,
                        struct ds_result *r)
{
    double rest = d->decode_ms;

    if (!d->stage_ms)
        return;
    for (size_t i = 0; i < (size_t)j->n * DH_MS_COUNT; i++)
        rest -= d->stage_ms[i];
    r->stages = (struct dh_wire_stages){
        .present = 1,
        .queue_ms = d->queue_ms > 0 ? d->queue_ms : 0,
        .alloc_ms = d->alloc_ms > 0 ? d->alloc_ms : 0,
        .collate_ms = rest > 0 ? rest : 0,
        .worker = d->worker};
    r->stage_rows = d->stage_ms;
    r->read_bytes = d->read_bytes;
    r->done_ms = d->done_ms;
}

static void report(struct ds_pool *p, struct ds_job *j,
                   const struct dh_work_done *d)
{
    struct ds_done o = {.kind = DS_DONE_ERROR,
                        .job = j,
                        .task = j->task,
                        .code = d->code,
                        .msg = d->msg,
                        .quarantine = 1,
                        .latency_ms = d->decode_ms};
    uint32_t *valid = NULL;

    if (d->code < 0) {
        o.sample = failed_sample(p, j, d);
        o.res.ids = j->ids; /* the substitutions before the failure */
        apply_subs(j, d, &o.res);
    } else if (!(valid = dh__malloc(j->n * sizeof(*valid)))) {
        dh__ds_release(p->env, &d->slot);
        o = (struct ds_done){.kind = DS_DONE_ERROR,
                             .job = j,
                             .task = j->task,
                             .code = DH_ENOMEM,
                             .sample = j->ids[0],
                             .msg = "out of memory",
                             .latency_ms = -1};
    } else {
        for (uint32_t i = 0; i < j->n; i++)
            valid[i] = d->valid_frames[i] < 0 ? 0
                                              : (uint32_t)d->valid_frames[i];
        o.kind = DS_DONE_RESULT;
        o.res = (struct ds_result){.slot = d->slot,
                                   .dtype = j->plan.dtype,
                                   .layout = j->plan.layout,
                                   .ids = j->ids,
                                   .valid = valid,
                                   .n = j->n,
                                   .service_ms = d->decode_ms};
        o.res.ndims = fill_dims(j, d->used, o.res.dims);
        apply_subs(j, d, &o.res);
        stage_times(j, d, &o.res);
    }
    p->sink.done(p->sink.arg, &o);
    dh__free(valid);
}

static void pool_drain(struct ds_exec *x)
{
    struct ds_pool *p = (struct ds_pool *)x;
    struct dh_work_done d;

    while (dh_workers_wait(p->w, &d, 0) == 0) {
        struct ds_job *j = take_job(p, d.task_id);

        if (j) {
            report(p, j, &d);
        } else { /* cannot happen: every admitted job has an entry */
            dh__log(DH_LOG_ERROR,
                    "dataserver %u: completion of unknown "
                    "task %llu",
                    p->env->server_id, (unsigned long long)d.task_id);
            if (d.code == 0)
                dh__ds_release(p->env, &d.slot);
        }
        dh_work_done_fini(&d);
    }
}

static int pool_pollitems(struct ds_exec *x, zmq_pollitem_t *it, int cap)
{
    struct ds_pool *p = (struct ds_pool *)x;

    if (cap < 1)
        return 0; /* the loop's bounded tick still drains it */
    it[0] = (zmq_pollitem_t){.fd = dh_workers_fd(p->w), .events = ZMQ_POLLIN};
    return 1;
}

static void pool_load(struct ds_exec *x, uint64_t *queued, uint64_t *busy)
{
    struct ds_pool *p = (struct ds_pool *)x;
    struct dh_workers_stats ws;

    dh_workers_stats(p->w, &ws);
    *queued = ws.queued;
    *busy = ws.running;
}

static void pool_cpu(struct ds_exec *x, uint64_t *task_ns, uint64_t *cpu_ns,
                     uint64_t *wait_ns, uint32_t *slot_waiting)
{
    struct ds_pool *p = (struct ds_pool *)x;
    struct dh_workers_stats ws;

    dh_workers_stats(p->w, &ws);
    *task_ns = ws.task_ns;
    *cpu_ns = ws.cpu_ns;
    *wait_ns = ws.wait_ns;
    *slot_waiting = ws.slot_waiting;
}

static void pool_reads(struct ds_exec *x, struct ds_reads *out)
{
    struct ds_pool *p = (struct ds_pool *)x;
    struct dh_workers_stats ws;

    dh_workers_stats(p->w, &ws);
    out->bytes = ws.read_bytes;
    out->reads = ws.reads;
    out->ms = ws.read_ms;
    out->fetched_bytes = ws.fetched_bytes;
    out->cache_hits = ws.cache_hits;
    out->cache_misses = ws.cache_misses;
}

static void pool_destroy(struct ds_exec *x)
{
    struct ds_pool *p = (struct ds_pool *)x;

    if (!p)
        return;
    dh_workers_destroy(p->w); /* releases uncollected completions */
    dh__free(p->run);
    dh__free(p);
}

static const struct ds_exec_ops pool_ops = {
    .name = "pool",
    .spares = 1,
    .submit = pool_submit,
    .drain = pool_drain,
    .pollitems = pool_pollitems,
    .load = pool_load,
    .cpu = pool_cpu,
    .reads = pool_reads,
    .destroy = pool_destroy,
};

int dh__ds_pool_create(const struct ds_env *env, unsigned workers,
                       unsigned queue, size_t max_jobs, struct ds_sink sink,
                       struct ds_exec **out, struct dh_err *e)
{
    struct ds_pool *p = dh__calloc(1, sizeof(*p));
    int rc;

    if (!p || !(p->run = dh__calloc(max_jobs, sizeof(*p->run)))) {
        dh__free(p);
        return dh_err_set(e, DH_ENOMEM, "out of memory");
    }
    p->x.ops = &pool_ops;
    p->env = env;
    p->sink = sink;
    p->cap = max_jobs;
    if ((rc = dh_workers_create(workers, env->ix, env->arena, queue, &p->w,
                                e)) < 0) {
        pool_destroy(&p->x);
        return rc;
    }
    *out = &p->x;
    return 0;
}
