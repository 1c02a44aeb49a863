/*
 * workers.c - a DataServer's fixed worker pool (src/include/datahelix/workers.h).
 *
 * Design notes
 * - A job node is allocated once, at submit: the copied ids and plan, and
 *   the valid-frame array the worker fills.  The same node travels from the
 *   job queue to the completion list; dh_workers_wait() hands its
 *   valid-frame array to the caller and frees the node.  A worker allocates
 *   nothing: its arena slot is the only per-job resource it creates, and
 *   it releases that slot itself if the decode fails.
 * - Locking: one mutex `mu` guards everything shared.  The job queue has
 *   two condvars (`job_cv`: a job or stop for the workers; `space_cv`: room
 *   for submitters); the completion list has one (`done_cv`: a completion
 *   for waiters, or a thread exiting for destroy).  All are CLOCK_MONOTONIC
 *   and every wait is timed.  No lock is held across an arena allocation or
 *   a decode (DESIGN 6): a worker takes `mu` only to pop a job and to post
 *   its completion.
 * - Stop: destroy sets `stopping`; workers finish the job in hand, then
 *   exit without taking queued jobs; destroy waits (bounded) for `alive` to
 *   reach 0, then joins.
 * - Stuck workers (issue 36 item 4): the media watchdog is cooperative (it
 *   is checked between reads), so a thread blocked inside a system call -
 *   an open() or read() that never returns - never sees it.  Each
 *   dh_workers_wait() therefore looks at the threads that are decoding: one
 *   whose media worker made no progress (dh__media_progress: no sample
 *   position ended) for its watchdog plus STUCK_GRACE_MS is abandoned.
 *   Its job completes at once with DH_ETIMEOUT naming the sample it was
 *   on, the pool starts a replacement thread (up to `spare` in the pool's
 *   life), and when the blocked call returns the old thread releases what
 *   it holds and exits.  A thread still blocked at destroy is detached,
 *   as before.
 * - Wake: `done_fd` (an eventfd) is written under `mu` with each
 *   completion and drained under `mu` by the dh_workers_wait() that empties
 *   the list, so a caller polling it (a DataServer's zmq_poll) sees it
 *   readable exactly while completions may be waiting: no lost wake-up, and
 *   no fixed poll period between a decode's end and its notice.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "datahelix/batch.h"
#include "datahelix/batch_packed.h"
#include "datahelix/media_stages.h"
#include "datahelix/workers.h"
#include "media/prefetch.h"
#include "runtime/cpu_pool.h"

/* Workers wake this often to re-check `stopping` even without a signal. */
#define IDLE_WAKE_MS 500
/* Beyond its watchdog, how long a sample may make no progress before its
 * thread counts as blocked in a system call (at least this, or the
 * watchdog again, whichever is longer). */
#define STUCK_GRACE_MS 2000

struct job {
    struct job *next;
    uint64_t task_id, epoch;
    uint64_t *ids;
    uint32_t n;
    struct dh_media_plan plan;
    int alloc_timeout_ms, sample_timeout_ms;
    /* Filled by the worker. */
    int code;
    uint32_t failed_at;
    struct dh_slot_ref slot;
    size_t used; /* bytes of the batch in the slot */
    int32_t *valid;
    double decode_ms;
    /* Stage times (docs/trace.md): submitted (monotonic ms), queued,
     * waiting for the slot, per-sample rows (media_stages.h), worker. */
    double submit_ms, queue_ms, alloc_ms, done_ms;
    float *stage;
    uint64_t *read_bytes; /* per sample position */
    uint32_t worker;
    char msg[DH_ERR_MSG_MAX];
    /* Skip policy: spares and known failures (owned), substitutions. */
    uint64_t *spares;
    int32_t *known;
    struct dh_batch_subs *subs;
};

struct fifo {
    struct job *head, *tail;
    uint64_t count;
};

struct thread {
    struct dh_workers *w;
    struct dh_media *media;
    uint32_t index;
    pthread_t tid;
    int started;
    /* under mu: the job in hand; abandoned: given up as stuck */
    struct job *cur;
    int abandoned;
    _Atomic int decoding; /* 1 while in the job's decode (not its alloc) */
};

struct dh_workers {
    pthread_mutex_t mu;
    pthread_cond_t job_cv, space_cv, done_cv;
    struct fifo jobs, dones;
    unsigned cap;
    int stopping;
    unsigned alive; /* threads not yet returned from their loop */
    uint64_t running, done, failed;
    /* Tasks' wall, on-CPU and waiting-for-CPU time (schedstat), where the
     * kernel keeps it: the Coordinator's CPU pools (cpu_pool.h). */
    uint64_t task_ns, cpu_ns, wait_ns;
    _Atomic uint32_t slot_waiting; /* threads in dh_arena_alloc now */
    /* the jobs' reads (under mu); of them, remote fetches and cache use */
    uint64_t read_bytes, reads;
    double read_ms;
    uint64_t fetched_bytes, cache_hits, cache_misses;
    const struct dh_index *ix;
    struct dh_arena *arena;
    unsigned nthreads;    /* started, replacements included */
    unsigned max_threads; /* room in `threads`: nthreads + spares */
    uint64_t abandoned;   /* threads given up as stuck */
    struct thread *threads;
    int done_fd; /* eventfd: readable while completions may wait */
    /* remote samples' chunks fetched ahead into the host cache, in the
     * order jobs arrive (media/prefetch.h); NULL: no cache */
    struct dh_prefetch *prefetch;
};

/* ---- small helpers ---- */

/* With `mu` held: a completion was posted / the list is empty.  The
 * eventfd's counter cannot overflow (one write per completion, reset when
 * the list empties) and a failed write is harmless: the caller's poll is
 * bounded and drains the list on every turn anyway. */
static void wake_post(struct dh_workers *w)
{
    uint64_t one = 1;

    if (w->done_fd >= 0 && write(w->done_fd, &one, sizeof(one)) < 0) {
        /* EAGAIN only: the counter is already non-zero */
    }
}

static void wake_clear(struct dh_workers *w)
{
    uint64_t v;

    if (w->done_fd >= 0 && read(w->done_fd, &v, sizeof(v)) < 0) {
        /* EAGAIN: nothing was posted */
    }
}

static void fifo_push(struct fifo *f, struct job *j)
{
    j->next = NULL;
    if (f->tail)
        f->tail->next = j;
    else
        f->head = j;
    f->tail = j;
    f->count++;
}

static struct job *fifo_pop(struct fifo *f)
{
    struct job *j = f->head;

    if (j) {
        f->head = j->next;
        if (!f->head)
            f->tail = NULL;
        f->count--;
    }
    return j;
}

static void job_free(struct job *j)
{
    if (!j)
        return;
    dh__free(j->ids);
    dh__free(j->valid);
    dh__free(j->spares);
    dh__free(j->known);
    dh__free(j->subs);
    dh__free(j->stage);
    dh__free(j->read_bytes);
    dh__free(j);
}

/* ---- the worker ---- */

/* The slot is ours alone: a failed release (stale ref, stuck lock) can only
 * leave it counted in the arena's stats, and there is no one to tell. */
static void release_slot(struct dh_arena *a, const struct dh_slot_ref *ref)
{
    int rc = dh_arena_release(a, ref, NULL);

    (void)rc;
}

/* The slot a job needs: a fixed batch's bytes, or a packed batch's bound
 * (batch_packed.h; an id the bound cannot size gets the table alone, and
 * the decode then says what is wrong with it). */
static size_t slot_bytes(const struct dh_workers *w, const struct job *j)
{
    size_t b;

    if (!dh_batch_is_packed(&j->plan))
        return dh_batch_bytes(&j->plan, j->n) + DH_MEDIA_DST_PAD;
    b = dh_batch_packed_bound(w->ix, j->ids, j->n, &j->plan);
    if (b == 0 || b > SIZE_MAX - DH_MEDIA_DST_PAD)
        b = dh_packed_table_bytes(j->n);
    return b + DH_MEDIA_DST_PAD;
}

static int decode_into(struct dh_workers *w, struct dh_media *m, struct job *j,
                       uint8_t *dst, size_t need, struct dh_err *e)
{
    if (dh_batch_is_packed(&j->plan))
        return dh_batch_packed_decode(m, w->ix, j->epoch, j->ids, j->n,
                                      &j->plan, dst, need, &j->used, j->valid,
                                      &j->failed_at, e);
    j->used = dh_batch_bytes(&j->plan, j->n);
    /* spares (the skip policy) substitute in fixed-shape batches only */
    return dh_batch_decode_subs(m, w->ix, j->epoch, j->ids, j->n, &j->plan, dst,
                                need, j->valid, j->subs, &j->failed_at, e);
}

/* The media worker's read totals before a job, to add the job's to the
 * pool's (dh_workers_stats) after it. */
struct read_mark {
    uint64_t bytes, reads, fetched, hits, misses;
    double ms;
};

static void read_mark(const struct dh_media *m, struct read_mark *rm)
{
    dh__media_read_totals(m, &rm->bytes, &rm->reads, &rm->ms);
    dh__media_remote_totals(m, &rm->fetched, &rm->hits, &rm->misses);
}

static void read_count(struct dh_workers *w, const struct dh_media *m,
                       const struct read_mark *rm)
{
    struct read_mark now;

    read_mark(m, &now);
    pthread_mutex_lock(&w->mu);
    w->read_bytes += now.bytes - rm->bytes;
    w->reads += now.reads - rm->reads;
    w->read_ms += now.ms - rm->ms;
    w->fetched_bytes += now.fetched - rm->fetched;
    w->cache_hits += now.hits - rm->hits;
    w->cache_misses += now.misses - rm->misses;
    pthread_mutex_unlock(&w->mu);
}

/* Allocates the slot, decodes into it; on error the slot is released. */
static void run_job(struct dh_workers *w, struct thread *t, struct job *j)
{
    struct dh_media *m = t->media;
    size_t need = slot_bytes(w, j);
    struct read_mark rm;
    struct dh_err e;
    struct dh_slot_ref ref;
    uint8_t *dst;
    double t0 = dh__mono_msf();

    dh_err_clear(&e);
    j->queue_ms = t0 - j->submit_ms;
    j->failed_at = DH_WORK_NO_SAMPLE;
    atomic_fetch_add(&w->slot_waiting, 1);
    j->code = dh_arena_alloc(w->arena, need, j->alloc_timeout_ms, &ref, &e);
    atomic_fetch_sub(&w->slot_waiting, 1);
    j->alloc_ms = dh__mono_msf() - t0;
    if (j->code)
        goto out;
    dst = dh_arena_ptr(w->arena, &ref);
    if (!dst) {
        j->code = dh_err_set(&e, DH_EINVAL, "slot at offset %llu vanished",
                             (unsigned long long)ref.offset);
        goto out_release;
    }
    t0 = dh__mono_msf();
    dh_media_set_watchdog(m, j->sample_timeout_ms);
    dh__media_stage_sink(m, j->stage, j->stage ? j->n : 0);
    dh__media_bytes_sink(m, j->read_bytes, j->read_bytes ? j->n : 0);
    read_mark(m, &rm);
    atomic_store(&t->decoding, 1);
    j->code = decode_into(w, m, j, dst, need, &e);
    atomic_store(&t->decoding, 0);
    read_count(w, m, &rm);
    dh__media_stage_sink(m, NULL, 0);
    dh__media_bytes_sink(m, NULL, 0);
    j->decode_ms = dh__mono_msf() - t0;
    j->done_ms = dh__mono_msf();
    if (j->code)
        goto out_release;
    j->slot = ref;
    return;
out_release:
    release_slot(w->arena, &ref);
out:
    snprintf(j->msg, sizeof(j->msg), "task %llu: %.480s",
             (unsigned long long)j->task_id, e.msg);
}

/* Next job, or NULL when stopping.  Called and returns with `mu` held. */
static struct job *next_job(struct dh_workers *w)
{
    struct timespec d;

    while (!w->stopping && !w->jobs.count) {
        dh__mono_deadline(&d, IDLE_WAKE_MS);
        (void)pthread_cond_timedwait(&w->job_cv, &w->mu, &d);
    }
    return w->stopping ? NULL : fifo_pop(&w->jobs);
}

static void *worker_main(void *arg)
{
    struct thread *t = arg;
    struct dh_workers *w = t->w;
    struct job *j;
    uint64_t cpu0 = 0, wait0 = 0, cpu1 = 0, wait1 = 0;
    double t0, t1;
    int sched0, sched1;

    pthread_mutex_lock(&w->mu);
    while ((j = next_job(w))) {
        w->running++;
        t->cur = j;
        pthread_cond_signal(&w->space_cv);
        pthread_mutex_unlock(&w->mu);
        j->worker = t->index;
        sched0 = dh__thread_sched(&cpu0, &wait0) == 0;
        t0 = dh__mono_msf();
        run_job(w, t, j); /* no lock held: DESIGN 6 */
        t1 = dh__mono_msf();
        sched1 = sched0 && dh__thread_sched(&cpu1, &wait1) == 0;
        pthread_mutex_lock(&w->mu);
        t->cur = NULL;
        if (t->abandoned) { /* its job was failed for it: just leave */
            if (!j->code)
                release_slot(w->arena, &j->slot);
            job_free(j);
            break;
        }
        /* Less the wait for an arena slot: the rank holds its batches,
         * which says nothing of what the task itself waits on. */
        t1 -= j->alloc_ms;
        if (sched1 && cpu1 >= cpu0 && wait1 >= wait0 && t1 > t0) {
            w->task_ns += (uint64_t)((t1 - t0) * 1e6);
            w->cpu_ns += cpu1 - cpu0;
            w->wait_ns += wait1 - wait0;
        }
        w->running--;
        if (j->code)
            w->failed++;
        else
            w->done++;
        fifo_push(&w->dones, j);
        wake_post(w);
        pthread_cond_broadcast(&w->done_cv);
    }
    w->alive--;
    pthread_cond_broadcast(&w->done_cv);
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

/* ---- create / destroy ---- */

static int init_sync(struct dh_workers *w, struct dh_err *e)
{
    pthread_condattr_t ca;
    int rc = 0;

    if (pthread_condattr_init(&ca))
        return dh_err_set(e, DH_ENOMEM, "workers: condattr");
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    if (pthread_mutex_init(&w->mu, NULL))
        rc = DH_ENOMEM;
    else if (pthread_cond_init(&w->job_cv, &ca))
        rc = DH_ENOMEM, pthread_mutex_destroy(&w->mu);
    else if (pthread_cond_init(&w->space_cv, &ca))
        rc = DH_ENOMEM, pthread_cond_destroy(&w->job_cv),
        pthread_mutex_destroy(&w->mu);
    else if (pthread_cond_init(&w->done_cv, &ca))
        rc = DH_ENOMEM, pthread_cond_destroy(&w->space_cv),
        pthread_cond_destroy(&w->job_cv), pthread_mutex_destroy(&w->mu);
    pthread_condattr_destroy(&ca);
    return rc ? dh_err_set(e, rc, "workers: cannot create locks") : 0;
}

/* Starts thread `i` of `threads`; with `mu` held or not (`locked`). */
static int start_thread(struct dh_workers *w, unsigned i, int locked,
                        struct dh_err *e)
{
    struct thread *t = &w->threads[i];
    int rc;

    t->w = w;
    t->index = i;
    if ((rc = dh_media_create(&t->media, e)))
        return rc;
    if (!locked)
        pthread_mutex_lock(&w->mu);
    w->alive++;
    if (pthread_create(&t->tid, NULL, worker_main, t)) {
        w->alive--;
        if (!locked)
            pthread_mutex_unlock(&w->mu);
        return dh_err_set(e, DH_EIO, "workers: cannot start thread %u", i);
    }
    t->started = 1;
    if (!locked)
        pthread_mutex_unlock(&w->mu);
    /* Named so that a CPU account (/proc/PID/task/TID/comm: `datahelix
     * bench`) tells decode from the loop; a failure costs only that. */
    (void)pthread_setname_np(t->tid, "dh-decode");
    return 0;
}

static int start_threads(struct dh_workers *w, struct dh_err *e)
{
    int rc;

    for (unsigned i = 0; i < w->nthreads; i++)
        if ((rc = start_thread(w, i, 0, e)))
            return rc;
    return 0;
}

/* ---- stuck threads ---- */

/* With `mu` held: thread t, stuck on job j at sample position pos for
 * `ms`, is given up: j completes now with DH_ETIMEOUT (a copy: the thread
 * still holds j), and a replacement starts if there is room. */
static void abandon(struct dh_workers *w, struct thread *t, uint32_t pos,
                    uint64_t ms)
{
    const struct job *j = t->cur;
    struct job *d = dh__calloc(1, sizeof(*d));
    struct dh_err e;

    t->abandoned = 1;
    w->abandoned++;
    if (!d || !(d->ids = dh__malloc(j->n * sizeof(*d->ids))) ||
        !(d->valid = dh__calloc(j->n, sizeof(*d->valid)))) {
        job_free(d); /* no completion: the task is re-routed at its time */
    } else {
        memcpy(d->ids, j->ids, j->n * sizeof(*d->ids));
        d->task_id = j->task_id;
        d->epoch = j->epoch;
        d->n = j->n;
        d->code = DH_ETIMEOUT;
        d->failed_at = pos < j->n ? pos : DH_WORK_NO_SAMPLE;
        d->worker = t->index;
        d->done_ms = dh__mono_msf();
        snprintf(d->msg, sizeof(d->msg),
                 "task %llu: sample %llu: no progress for %llu ms, past its "
                 "%d ms watchdog: its worker is blocked in a system call (a "
                 "FIFO, a hung mount?); abandoned, and the worker replaced",
                 (unsigned long long)j->task_id,
                 (unsigned long long)j->ids[pos < j->n ? pos : 0],
                 (unsigned long long)ms, j->sample_timeout_ms);
        w->running--;
        w->failed++;
        fifo_push(&w->dones, d);
        wake_post(w);
        pthread_cond_broadcast(&w->done_cv);
    }
    dh_err_clear(&e);
    if (w->nthreads < w->max_threads &&
        start_thread(w, w->nthreads, 1, &e) == 0)
        w->nthreads++;
}

/* With `mu` held: every decoding thread whose sample made no progress for
 * its watchdog plus the grace is abandoned. */
static void check_stuck(struct dh_workers *w)
{
    uint64_t now = dh__mono_ms();

    for (unsigned i = 0; i < w->nthreads; i++) {
        struct thread *t = &w->threads[i];
        uint64_t since = 0, bound;
        uint32_t pos = 0;
        int ms;

        if (!t->started || t->abandoned || !t->cur ||
            !atomic_load(&t->decoding) || (ms = t->cur->sample_timeout_ms) <= 0)
            continue;
        dh__media_progress(t->media, &pos, &since);
        bound = (uint64_t)ms +
                (ms > STUCK_GRACE_MS ? (uint64_t)ms : STUCK_GRACE_MS);
        if (since && now > since && now - since > bound)
            abandon(w, t, pos, now - since);
    }
}

/* Waits (bounded) for every thread to leave its loop; 0 if they all did. */
static int wait_threads_exit(struct dh_workers *w)
{
    struct timespec d;
    int rc = 0;

    dh__mono_deadline(&d, DH_WORKERS_STOP_TIMEOUT_MS);
    pthread_mutex_lock(&w->mu);
    w->stopping = 1;
    pthread_cond_broadcast(&w->job_cv);
    pthread_cond_broadcast(&w->space_cv);
    while (w->alive && rc == 0)
        rc = pthread_cond_timedwait(&w->done_cv, &w->mu, &d);
    rc = w->alive ? DH_ETIMEOUT : 0;
    pthread_mutex_unlock(&w->mu);
    return rc;
}

/* Frees the queue, releases uncollected completions' slots, frees all. */
static void free_pool(struct dh_workers *w)
{
    struct job *j;

    while ((j = fifo_pop(&w->jobs)))
        job_free(j);
    while ((j = fifo_pop(&w->dones))) {
        if (!j->code)
            release_slot(w->arena, &j->slot);
        job_free(j);
    }
    for (unsigned i = 0; i < w->nthreads; i++)
        dh_media_destroy(w->threads[i].media);
    pthread_cond_destroy(&w->done_cv);
    pthread_cond_destroy(&w->space_cv);
    pthread_cond_destroy(&w->job_cv);
    pthread_mutex_destroy(&w->mu);
    if (w->done_fd >= 0)
        close(w->done_fd);
    dh__free(w->threads);
    dh__free(w);
}

void dh_workers_destroy(struct dh_workers *w)
{
    if (!w)
        return;
    dh__prefetch_destroy(w->prefetch); /* its fetches cut, its threads joined */
    w->prefetch = NULL;
    if (wait_threads_exit(w)) {
        /* A decode is stuck: never free memory a thread still uses. */
        for (unsigned i = 0; i < w->nthreads; i++)
            if (w->threads[i].started)
                pthread_detach(w->threads[i].tid);
        return;
    }
    for (unsigned i = 0; i < w->nthreads; i++)
        if (w->threads[i].started)
            pthread_join(w->threads[i].tid, NULL);
    free_pool(w);
}

int dh_workers_create(unsigned nthreads, const struct dh_index *ix,
                      struct dh_arena *arena, unsigned queue_cap,
                      struct dh_workers **out, struct dh_err *e)
{
    struct dh_workers *w;
    int rc;

    if (!ix || !arena || !out || nthreads < 1 ||
        nthreads > DH_WORKERS_MAX_THREADS || queue_cap < 1 ||
        queue_cap > DH_WORKERS_MAX_QUEUE)
        return dh_err_set(e, DH_EINVAL,
                          "workers: %u threads (1..%d), queue "
                          "%u (1..%d), index and arena required",
                          nthreads, DH_WORKERS_MAX_THREADS, queue_cap,
                          DH_WORKERS_MAX_QUEUE);
    w = dh__calloc(1, sizeof(*w));
    if (!w)
        return dh_err_set(e, DH_ENOMEM, "workers: out of memory");
    /* room for replacements of threads found stuck */
    w->max_threads = nthreads + (nthreads > 4 ? nthreads : 4);
    w->threads = dh__calloc(w->max_threads, sizeof(*w->threads));
    if (!w->threads) {
        dh__free(w);
        return dh_err_set(e, DH_ENOMEM, "workers: out of memory");
    }
    if ((rc = init_sync(w, e))) {
        dh__free(w->threads);
        dh__free(w);
        return rc;
    }
    w->ix = ix;
    w->arena = arena;
    w->cap = queue_cap;
    w->nthreads = nthreads;
    if ((w->done_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) < 0) {
        rc = dh_err_set(e, DH_EIO, "workers: cannot create eventfd: %s",
                        strerror(errno));
        dh_workers_destroy(w); /* no thread started yet */
        return rc;
    }
    if ((rc = start_threads(w, e)) ||
        (rc = dh__prefetch_create(ix, NULL, &w->prefetch, e))) {
        dh_workers_destroy(w); /* threads hold nothing yet: never stuck */
        return rc;
    }
    *out = w;
    return 0;
}

/* ---- submit / wait / stats ---- */

static int check_job(const struct dh_work *job, struct dh_err *e)
{
    size_t need;
    int rc;

    if (!job || !job->plan || !job->ids)
        return dh_err_set(e, DH_EINVAL, "workers: job, ids and plan needed");
    if ((rc = dh_media_plan_check(job->plan, e)))
        return rc;
    if (job->plan->kind == DH_PLAN_INDICES)
        return dh_err_set(e, DH_EINVAL,
                          "task %llu: index-list plans are not "
                          "supported by the worker pool",
                          (unsigned long long)job->task_id);
    if (job->n < 1 || job->n > DH_BATCH_MAX_SAMPLES ||
        job->alloc_timeout_ms < 0 || job->n_spares > DH_BATCH_MAX_SPARES ||
        (job->n_spares && !job->spares))
        return dh_err_set(e, DH_EINVAL,
                          "task %llu: %u samples (1..%d), "
                          "alloc timeout %d ms",
                          (unsigned long long)job->task_id, job->n,
                          DH_BATCH_MAX_SAMPLES, job->alloc_timeout_ms);
    need = dh_batch_is_packed(job->plan) ? (size_t)dh_batch_frames(job->plan)
                                         : dh_batch_bytes(job->plan, job->n);
    if (need == 0 || need > SIZE_MAX - DH_MEDIA_DST_PAD)
        return dh_err_set(e, DH_EINVAL,
                          "task %llu: the plan cannot be batched "
                          "(no frame cap, or too large)",
                          (unsigned long long)job->task_id);
    return 0;
}

/* The skip policy's part of a job: spares, known failures, the record. */
static int copy_spares(struct job *j, const struct dh_work *job)
{
    if (!(j->subs = dh__calloc(1, sizeof(*j->subs))) ||
        !(j->spares = dh__malloc(sizeof(*j->spares) * job->n_spares)))
        return DH_ENOMEM;
    memcpy(j->spares, job->spares, sizeof(*j->spares) * job->n_spares);
    if (job->known) {
        if (!(j->known = dh__malloc(sizeof(*j->known) * job->n)))
            return DH_ENOMEM;
        memcpy(j->known, job->known, sizeof(*j->known) * job->n);
    }
    j->subs->spares = j->spares;
    j->subs->n_spares = job->n_spares;
    j->subs->known = j->known;
    return 0;
}

static struct job *job_copy(const struct dh_work *job)
{
    struct job *j = dh__calloc(1, sizeof(*j));

    if (!j)
        return NULL;
    j->ids = dh__malloc(sizeof(*j->ids) * job->n);
    j->valid = dh__calloc(job->n, sizeof(*j->valid));
    /* allocated with the job, as ids are: the worker allocates nothing */
    j->stage = dh__calloc((size_t)job->n * DH_MS_COUNT, sizeof(*j->stage));
    j->read_bytes = dh__calloc(job->n, sizeof(*j->read_bytes));
    if (!j->ids || !j->valid || !j->stage || !j->read_bytes) {
        job_free(j);
        return NULL;
    }
    memcpy(j->ids, job->ids, sizeof(*j->ids) * job->n);
    if (job->n_spares && copy_spares(j, job) < 0) {
        job_free(j);
        return NULL;
    }
    j->task_id = job->task_id;
    j->epoch = job->epoch;
    j->n = job->n;
    j->plan = *job->plan;
    j->plan.indices = NULL;
    j->alloc_timeout_ms = job->alloc_timeout_ms;
    j->sample_timeout_ms = job->sample_timeout_ms;
    j->submit_ms = dh__mono_msf();
    return j;
}

/* Waits for room in the queue; called and returns with `mu` held. */
static int wait_space(struct dh_workers *w, int timeout_ms)
{
    struct timespec d;

    dh__mono_deadline(&d, timeout_ms);
    while (!w->stopping && w->jobs.count >= w->cap)
        if (timeout_ms == 0 ||
            pthread_cond_timedwait(&w->space_cv, &w->mu, &d) == ETIMEDOUT)
            break;
    if (w->stopping)
        return DH_EINVAL;
    return w->jobs.count >= w->cap ? DH_ETIMEOUT : 0;
}

int dh_workers_submit(struct dh_workers *w, const struct dh_work *job,
                      int timeout_ms, struct dh_err *e)
{
    struct job *j;
    int rc;

    if (!w || timeout_ms < 0)
        return dh_err_set(e, DH_EINVAL, "workers: bad submit arguments");
    if ((rc = check_job(job, e)))
        return rc;
    if (!(j = job_copy(job)))
        return dh_err_set(e, DH_ENOMEM, "task %llu: out of memory",
                          (unsigned long long)job->task_id);
    pthread_mutex_lock(&w->mu);
    rc = wait_space(w, timeout_ms);
    if (!rc) {
        fifo_push(&w->jobs, j);
        pthread_cond_signal(&w->job_cv);
    }
    pthread_mutex_unlock(&w->mu);
    if (!rc) {
        /* ids of a submitted job are the caller's and stay valid here */
        dh__prefetch_push(w->prefetch, job->ids, job->n);
        return 0;
    }
    job_free(j);
    if (rc == DH_ETIMEOUT)
        return dh_err_set(e, rc,
                          "task %llu: job queue full (%u jobs) for "
                          "%d ms",
                          (unsigned long long)job->task_id, w->cap, timeout_ms);
    return dh_err_set(e, rc, "task %llu: worker pool is shutting down",
                      (unsigned long long)job->task_id);
}

static void fill_done(struct job *j, struct dh_work_done *out)
{
    memset(out, 0, sizeof(*out));
    out->task_id = j->task_id;
    out->code = j->code;
    memcpy(out->msg, j->msg, sizeof(out->msg));
    out->failed_at = j->failed_at;
    if (!j->code)
        out->slot = j->slot;
    out->used = j->code ? 0 : j->used;
    out->n = j->n;
    out->valid_frames = j->valid; /* handed over */
    out->decode_ms = j->decode_ms;
    out->queue_ms = j->queue_ms;
    out->alloc_ms = j->alloc_ms;
    out->done_ms = j->done_ms;
    out->worker = j->worker;
    out->stage_ms = j->stage; /* handed over */
    j->stage = NULL;
    out->read_bytes = j->read_bytes; /* handed over */
    j->read_bytes = NULL;
    out->subs = j->subs; /* handed over */
    if (out->subs) {     /* its inputs stay with the job */
        out->subs->spares = NULL;
        out->subs->known = NULL;
    }
    j->valid = NULL;
    j->subs = NULL;
}

int dh_workers_wait(struct dh_workers *w, struct dh_work_done *out,
                    int timeout_ms)
{
    struct timespec d;
    struct job *j;

    if (!w || !out || timeout_ms < 0)
        return DH_EINVAL;
    dh__mono_deadline(&d, timeout_ms);
    pthread_mutex_lock(&w->mu);
    check_stuck(w);
    while (!w->dones.count && timeout_ms > 0)
        if (pthread_cond_timedwait(&w->done_cv, &w->mu, &d) == ETIMEDOUT)
            break;
    j = fifo_pop(&w->dones);
    if (!w->dones.count)
        wake_clear(w);
    pthread_mutex_unlock(&w->mu);
    if (!j)
        return DH_ETIMEOUT;
    fill_done(j, out);
    job_free(j);
    return 0;
}

int dh_workers_fd(const struct dh_workers *w)
{
    return w ? w->done_fd : -1;
}

void dh_workers_stats(struct dh_workers *w, struct dh_workers_stats *out)
{
    pthread_mutex_lock(&w->mu);
    out->queued = w->jobs.count;
    out->running = w->running;
    out->pending = w->dones.count;
    out->done = w->done;
    out->failed = w->failed;
    out->task_ns = w->task_ns;
    out->cpu_ns = w->cpu_ns;
    out->wait_ns = w->wait_ns;
    out->slot_waiting = atomic_load(&w->slot_waiting);
    out->read_bytes = w->read_bytes;
    out->reads = w->reads;
    out->read_ms = w->read_ms;
    out->fetched_bytes = w->fetched_bytes;
    out->cache_hits = w->cache_hits;
    out->cache_misses = w->cache_misses;
    out->abandoned = w->abandoned;
    out->threads = w->nthreads;
    pthread_mutex_unlock(&w->mu);
}

void dh_work_done_fini(struct dh_work_done *d)
{
    if (!d)
        return;
    dh__free(d->valid_frames);
    dh__free(d->subs);
    dh__free(d->stage_ms);
    dh__free(d->read_bytes);
    memset(d, 0, sizeof(*d));
}
