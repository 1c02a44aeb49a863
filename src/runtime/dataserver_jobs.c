/*
 * dataserver_jobs.c - the DataServer core's tables
 * (dataserver_internal.h): the jobs it admitted, the slots it handed to
 * the client, and the quarantine of samples that failed here.
 *
 * Design: the job table is sized to the jobs that can be in an executor at
 * once (queue + threads, or DS_PY_JOBS); a local server's Route that finds
 * it full waits in the backlog (a ring of the Routes themselves, taken
 * over without a copy) until a job ends, so a request is admitted, waits,
 * or is answered with an ErrorNotice, never dropped; a job stays in
 * it until its executor reports its completion (a remote one while its
 * batch waits for the target, too).  The slots handed to the client are
 * remembered so that a Release (offset, generation) finds its length.
 * Pure bookkeeping: nothing here sends or calls another part.
 *
 * Locking: none (dataserver_internal.h).
 */
#include <stdio.h>
#include <string.h>

#include "core/log.h"
#include "core/alloc.h"
#include "core/err_kind.h"
#include "runtime/dataserver_internal.h"

/* ---- jobs ---- */

int dh__ds_jobs_init(struct ds_jobs *t, size_t n, struct dh_err *e)
{
    t->n = n;
    if (!(t->v = dh__calloc(n, sizeof(*t->v))))
        return dh_err_set(e, DH_ENOMEM, "out of memory");
    return 0;
}

void dh__ds_jobs_fini(struct ds_jobs *t)
{
    for (size_t i = 0; t->v && i < t->n; i++)
        dh__ds_job_clear(&t->v[i]);
    dh__free(t->v);
    t->v = NULL;
}

struct ds_job *dh__ds_job_new(struct ds_jobs *t)
{
    for (size_t i = 0; i < t->n; i++)
        if (!t->v[i].used)
            return &t->v[i];
    return NULL;
}

struct ds_job *dh__ds_job_find(struct ds_jobs *t, uint64_t task)
{
    for (size_t i = 0; i < t->n; i++)
        if (t->v[i].used && t->v[i].task.id == task)
            return &t->v[i];
    return NULL;
}

/* ---- routes waiting for a job entry ---- */

int dh__ds_backlog_init(struct ds_backlog *b, size_t cap, struct dh_err *e)
{
    memset(b, 0, sizeof(*b));
    if (!(b->v = dh__calloc(cap, sizeof(*b->v))))
        return dh_err_set(e, DH_ENOMEM, "out of memory");
    b->cap = cap;
    return 0;
}

void dh__ds_backlog_fini(struct ds_backlog *b)
{
    while (b->n)
        dh__ds_backlog_pop(b);
    dh__free(b->v);
    memset(b, 0, sizeof(*b));
}

int dh__ds_backlog_push(struct ds_backlog *b, struct dh_wire_msg *m)
{
    if (b->n == b->cap)
        return DH_ETOOBIG;
    b->v[(b->head + b->n) % b->cap] = *m;
    b->n++;
    dh_wire_msg_init(m, DH_WIRE_NONE); /* the backlog owns its arrays */
    return 0;
}

struct dh_wire_msg *dh__ds_backlog_front(struct ds_backlog *b)
{
    return b->n ? &b->v[b->head] : NULL;
}

void dh__ds_backlog_pop(struct ds_backlog *b)
{
    if (!b->n)
        return;
    dh_wire_msg_fini(&b->v[b->head]);
    b->head = (b->head + 1) % b->cap;
    b->n--;
}

int dh__ds_backlog_has(const struct ds_backlog *b, uint64_t task)
{
    for (size_t i = 0; i < b->n; i++)
        if (b->v[(b->head + i) % b->cap].u.route.task.id == task)
            return 1;
    return 0;
}

void dh__ds_job_clear(struct ds_job *j)
{
    dh__free(j->ids);
    dh__free(j->spares);
    dh__free(j->known);
    memset(j, 0, sizeof(*j));
}

/* ---- slots handed to the client ---- */

static void sent_clear(struct ds_sent *s)
{
    dh_wire_free(s->notice);
    *s = (struct ds_sent){0};
}

void dh__ds_slot_remember(struct ds_slots *t, const struct ds_env *env,
                          const struct dh_slot_ref *r, uint64_t task,
                          uint8_t *notice, size_t notice_len)
{
    int victim = -1;

    for (int i = 0; i < DS_N_SENT && victim < 0; i++)
        if (!t->v[i].used)
            victim = i;
    /* Full: forget one the client has released already.  There are at
     * most DH_ARENA_MAX_SLOTS live slots, so one of DS_N_SENT is dead. */
    for (int i = 0; i < DS_N_SENT && victim < 0; i++)
        if (!dh_arena_ptr(env->arena, &t->v[i].ref))
            victim = i;
    if (victim < 0)
        victim = 0; /* lock timed out everywhere: overwrite the oldest */
    sent_clear(&t->v[victim]);
    t->v[victim] = (struct ds_sent){.used = 1,
                                    .ref = *r,
                                    .task = task,
                                    .notice = notice,
                                    .notice_len = notice_len};
}

const struct ds_sent *dh__ds_slot_of_task(const struct ds_slots *t,
                                          const struct ds_env *env,
                                          uint64_t task)
{
    for (int i = 0; i < DS_N_SENT; i++)
        if (t->v[i].used && t->v[i].notice && t->v[i].task == task &&
            dh_arena_ptr(env->arena, &t->v[i].ref))
            return &t->v[i];
    return NULL;
}

void dh__ds_slots_fini(struct ds_slots *t)
{
    for (int i = 0; i < DS_N_SENT; i++)
        sent_clear(&t->v[i]);
}

void dh__ds_slot_release(struct ds_slots *t, const struct ds_env *env,
                         const struct dh_wire_release *r)
{
    struct dh_err e;

    for (int i = 0; i < DS_N_SENT; i++) {
        struct ds_sent *s = &t->v[i];

        struct dh_slot_ref ref = s->ref;

        if (!s->used || s->ref.offset != r->slot_offset ||
            s->ref.gen != r->generation)
            continue;
        sent_clear(s);
        if (dh_arena_release(env->arena, &ref, &e) < 0)
            dh__log(DH_LOG_ERROR,
                    "dataserver %u: release of task "
                    "%llu: %s",
                    env->server_id, (unsigned long long)r->task.id, e.msg);
        else
            DS_INC(env, releases);
        return;
    }
    dh__log(DH_LOG_WARN,
            "dataserver %u: release of unknown slot "
            "(offset %llu, generation %u) for task %llu ignored",
            env->server_id, (unsigned long long)r->slot_offset, r->generation,
            (unsigned long long)r->task.id);
}

/* ---- quarantine ---- */

/* Resource errors (a full arena or queue, memory) say nothing about the
 * sample they name, so only a sample's own failure is remembered. */
void dh__ds_quarantine_add(struct ds_quarantines *q, const struct ds_env *env,
                           uint64_t id, int code, const char *msg)
{
    struct ds_quarantine *x;

    if (!dh__err_blames_sample(code))
        return;
    for (size_t i = 0; i < DS_QUARANTINE; i++)
        if (q->v[i].code && q->v[i].id == id)
            return;
    x = &q->v[q->next];
    q->next = (q->next + 1) % DS_QUARANTINE;
    x->id = id;
    x->code = code;
    snprintf(x->msg, sizeof(x->msg), "%.250s", msg);
    DS_INC(env, quarantined);
}

const struct ds_quarantine *
dh__ds_quarantine_find(const struct ds_quarantines *q,
                       const struct dh_wire_request *rq)
{
    for (uint32_t k = 0; k < rq->n_samples; k++)
        for (size_t i = 0; i < DS_QUARANTINE; i++)
            if (q->v[i].code && q->v[i].id == rq->sample_ids[k])
                return &q->v[i];
    return NULL;
}

int dh__ds_quarantine_code(const struct ds_quarantines *q, uint64_t id)
{
    for (size_t i = 0; i < DS_QUARANTINE; i++)
        if (q->v[i].code && q->v[i].id == id)
            return q->v[i].code;
    return 0;
}
