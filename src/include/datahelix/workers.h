/*
 * datahelix/workers.h - a DataServer's fixed worker pool (issue 4 item 3,
 * DESIGN 2 "Local path").
 *
 * N threads, each with its own struct dh_media, take jobs from one bounded
 * FIFO.  A job is one request: its samples are decoded by dh_batch_decode()
 * straight into a freshly allocated slot of the shared-memory arena.  Every
 * job that was accepted by dh_workers_submit() yields exactly one
 * completion (success or error), which dh_workers_wait() hands out in
 * completion order (not task order: the client reorders by task id).
 *
 * Backpressure: a full job queue blocks dh_workers_submit() (bounded by its
 * timeout); a full arena blocks the worker inside dh_arena_alloc() (bounded
 * by the job's alloc_timeout_ms), after which the job completes with
 * DH_ETIMEOUT and the arena's "arena exhausted: ..." message.
 *
 * Thread-safety: submit, wait and stats may be called from any threads at
 * once; dh_workers_destroy() must not race with other calls on the handle.
 */
#ifndef DATAHELIX_WORKERS_H
#define DATAHELIX_WORKERS_H

#include <stddef.h>
#include <stdint.h>

#include "datahelix/arena.h"
#include "datahelix/batch.h"
#include "datahelix/error.h"
#include "datahelix/index.h"
#include "datahelix/media.h"

/* Most threads in one pool, most jobs in one queue. */
#define DH_WORKERS_MAX_THREADS 256
#define DH_WORKERS_MAX_QUEUE 65536
/* How long dh_workers_destroy() waits for running jobs to finish. */
#define DH_WORKERS_STOP_TIMEOUT_MS 10000
/* failed_at of a completion whose error is not one sample's. */
#define DH_WORK_NO_SAMPLE UINT32_MAX

struct dh_workers;

/* A job, as the caller describes it.  Everything is copied by submit. */
struct dh_work {
    uint64_t task_id;
    uint64_t epoch;
    const uint64_t *ids;              /* n sample ids (copied) */
    uint32_t n;                       /* 1..DH_BATCH_MAX_SAMPLES */
    const struct dh_media_plan *plan; /* copied; DH_PLAN_INDICES refused */
    int alloc_timeout_ms;             /* bound on waiting for arena space */
    int sample_timeout_ms;            /* per-sample watchdog (media.h
                                        dh_media_set_watchdog); 0: none */
    const uint64_t *spares; /* skip policy: substitutes to try (copied),
                               n_spares <= DH_BATCH_MAX_SPARES; NULL: none */
    uint32_t n_spares;
    const int32_t *known; /* with spares: n causes of samples known to
                             fail (0: unknown), not decoded again; NULL */
};

/*
 * A completion.  code == 0: `slot` holds the batch (dh_batch_bytes(plan, n)
 * bytes of tensor followed by DH_MEDIA_DST_PAD bytes of slack; slot.len is
 * the sum) and the caller owns its one arena reference (release it, or
 * hand it on with the notice).  code < 0: `msg` names the failed sample id,
 * its path and the cause, failed_at is its position in the job (or
 * DH_WORK_NO_SAMPLE, e.g. arena exhausted), and no slot is held (slot is
 * zeroed).  valid_frames (n entries, valid for the samples before
 * failed_at) and stage_ms are owned by the struct: free them with
 * dh_work_done_fini().
 */
struct dh_work_done {
    uint64_t task_id;
    int code;
    char msg[DH_ERR_MSG_MAX];
    uint32_t failed_at;
    struct dh_slot_ref slot;
    size_t used; /* bytes of the batch from the slot's start: a fixed
                    batch's tensor, or a packed one's table + samples */
    uint32_t n;
    int32_t *valid_frames;
    double decode_ms; /* arena wait excluded */
    /* Stage times (docs/trace.md): queued before a thread took the job,
     * waiting for the arena slot, the thread's index, and per sample
     * position n rows of DH_MS_COUNT floats (read, decode, scale ms;
     * datahelix/media_stages.h), owned, NULL if out of memory. */
    double queue_ms, alloc_ms;
    double done_ms; /* CLOCK_MONOTONIC (ms) when the decode ended */
    uint32_t worker;
    float *stage_ms;
    uint64_t *read_bytes; /* per sample position, owned; NULL: none */
    /* A job with spares: its substitutions (owned, also on error: the
     * ones made before the failure); NULL for a job without spares. */
    struct dh_batch_subs *subs;
};

/* Frees out->valid_frames, out->subs and zeroes the struct.  Accepts NULL. */
void dh_work_done_fini(struct dh_work_done *d);

struct dh_workers_stats {
    uint64_t queued;  /* jobs waiting for a thread now */
    uint64_t running; /* jobs a thread is working on now */
    uint64_t pending; /* completions not yet collected by dh_workers_wait */
    uint64_t done;    /* jobs completed successfully, in total */
    uint64_t failed;  /* jobs completed with an error, in total */
    /* Over the jobs whose thread the kernel's schedstat covers, in total:
     * wall time, time on a CPU, time waiting for one (ns). */
    uint64_t task_ns, cpu_ns, wait_ns;
    uint32_t slot_waiting; /* threads waiting for an arena slot now */
    /* What the jobs read from their sources (files, shard members), in
     * total: bytes, reads, and the reads' time in ms. */
    uint64_t read_bytes, reads;
    double read_ms;
    /* Of them, S3 / HTTP(S): bytes fetched over the network, and chunks
     * found in / fetched into the host cache (docs/remote.md). */
    uint64_t fetched_bytes, cache_hits, cache_misses;
    /* Threads given up as blocked in a system call (their jobs failed with
     * DH_ETIMEOUT), and threads started in all, replacements included. */
    uint64_t abandoned;
    uint32_t threads;
};

/*
 * Starts `nthreads` (1..DH_WORKERS_MAX_THREADS) workers over index `ix` and
 * arena `arena`, both borrowed: they must outlive the pool.  queue_cap
 * (1..DH_WORKERS_MAX_QUEUE) bounds the jobs waiting for a thread.  On
 * success *out is owned by the caller (dh_workers_destroy).  DH_EINVAL,
 * DH_ENOMEM, DH_EIO (thread creation), or dh_media_create's code.  On error
 * no thread is left running.
 */
int dh_workers_create(unsigned nthreads, const struct dh_index *ix,
                      struct dh_arena *arena, unsigned queue_cap,
                      struct dh_workers **out, struct dh_err *e) DH_MUST_CHECK;

/*
 * Queues a copy of `job`.  Blocks up to timeout_ms (0: not at all) while
 * the queue is full, then DH_ETIMEOUT.  DH_EINVAL for a bad job (n, plan
 * that fails dh_media_plan_check or cannot be batched, DH_PLAN_INDICES,
 * alloc_timeout_ms < 0) or a pool being destroyed; DH_ENOMEM.  On error
 * nothing was queued and no completion will come for this job.
 */
int dh_workers_submit(struct dh_workers *w, const struct dh_work *job,
                      int timeout_ms, struct dh_err *e) DH_MUST_CHECK;

/*
 * Pops the next completion into *out (which the caller then owns: see
 * struct dh_work_done).  Waits up to timeout_ms (0: not at all); DH_ETIMEOUT
 * if none came.  *out is written only on success.
 */
int dh_workers_wait(struct dh_workers *w, struct dh_work_done *out,
                    int timeout_ms) DH_MUST_CHECK;

/*
 * A descriptor to poll (POLLIN) for completions: readable while a
 * completion may be waiting for dh_workers_wait(), reset by the
 * dh_workers_wait() that takes the last one.  Owned by the pool (never
 * read or close it); valid until dh_workers_destroy().  Lets a caller's
 * event loop wake on a decode's end instead of polling on a period.
 */
int dh_workers_fd(const struct dh_workers *w);

/* A consistent snapshot of the counters. */
void dh_workers_stats(struct dh_workers *w, struct dh_workers_stats *out);

/*
 * Stops accepting jobs, drops the queued ones (they never get a
 * completion), waits up to DH_WORKERS_STOP_TIMEOUT_MS for the running ones
 * to finish, joins the threads and releases the arena slots of completions
 * nobody collected.  Accepts NULL.  If a decode is stuck past the bound,
 * its thread is detached and the pool's memory is left to it (leaked, not
 * freed under it); the index and arena must then stay alive.
 */
void dh_workers_destroy(struct dh_workers *w);

#endif
