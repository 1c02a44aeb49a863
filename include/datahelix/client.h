/*
 * datahelix/client.h - the training rank's side of the data plane (DESIGN.md
 * 2 and 8; issue 4 item 5; docs/client.md): requests batches ahead of
 * consumption, gets them back in request order as zero-copy views of its
 * local DataServer's shared-memory arena.
 *
 * Design notes:
 *   - The caller gives the client an epoch's schedule: for each step the
 *     sample ids this rank consumes (any schedule; the datahelix tools
 *     use the Tier-1 planner, an internal module).  An I/O
 *     thread (the paper's sender and fetcher in one, since a ZeroMQ socket
 *     belongs to one thread) keeps up to `prefetch` steps requested ahead
 *     of consumption, each as `microbatches` DescriptorRequests (task
 *     (epoch, pass, step, rank, microbatch), wire.h), and files the notices that come
 *     back into a reorder buffer (reorder.h).
 *   - dh_client_next() blocks, bounded by timeout_ms, until every part of
 *     the next step is in, and returns a view: one part per microbatch,
 *     each a tensor in the arena (no copy: DESIGN.md 6).  The parts are
 *     not merged into one buffer, which would be a copy; a part's samples
 *     are contiguous in batch order.
 *   - The local DataServer: embedded (default) - the client starts
 *     `datahelix dataserver --client-fd N` itself, in its own process
 *     group, and if it dies starts a new one (a new server id, which the
 *     Coordinator lets supersede the old) and re-issues the steps still
 *     outstanding; external - the client attaches to a running server's
 *     abstract socket, and that server's death is an error.  Either way
 *     the server exits when the client does (local_link.h).
 *   - Errors surface at the next() of the step they belong to, naming
 *     sample id, path and cause; that step is then consumed and the next
 *     call goes on with the following step (a `skip` policy is the
 *     caller's loop).  The failing sample ids are remembered
 *     (dh_client_quarantine()).
 *   - Telemetry (DESIGN.md 4.4): input wait (time blocked in next()) and
 *     window (time between one next() returning and the following call)
 *     per step, as JSONL if `telemetry` is set, and as percentiles in
 *     dh_client_stats().
 *
 * Ownership: a batch from next() holds its arena slots until
 * dh_client_batch_release(); the client stays allocated until it is
 * destroyed and every batch released (so a batch may outlive destroy()).
 *
 * Thread-safety: next(), start_pass(), start_epoch() and stats() from one consumer
 * thread at a time; dh_client_batch_release() from any thread.
 */
#ifndef DATAHELIX_CLIENT_H
#define DATAHELIX_CLIENT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "datahelix/error.h"
#include "datahelix/media.h"

#define DH_CLIENT_MAX_PREFETCH 256u
/* Largest step hint, step deadline and ddl_ms accepted (one day). */
#define DH_CLIENT_MAX_STEP_MS 86400000.0
#define DH_CLIENT_MAX_MICROBATCHES 255u
#define DH_CLIENT_MAX_PARTS DH_CLIENT_MAX_MICROBATCHES
/* Most sample ids of one step (the wire's cap on a request). */
#define DH_CLIENT_MAX_STEP_SAMPLES 65536u
/* Most spares per request (the wire's cap). */
#define DH_CLIENT_MAX_SPARES 64u

struct dh_client; /* opaque */

/* Most extra arguments opts.ds_args may give the embedded DataServer. */
#define DH_CLIENT_MAX_DS_ARGS 24

struct dh_client_opts {
    const char *coordinator; /* ZeroMQ endpoint, required */
    const char *index_path;  /* the .dhx the sample ids refer to, required */
    uint32_t rank, world_size;
    const char *dataserver;     /* NULL: embedded; else the abstract socket
                                name of a running local DataServer */
    const char *datahelix_bin;  /* embedded: program to start; NULL:
                                  $DATAHELIX_BIN, else `datahelix` on PATH */
    unsigned ds_workers;        /* embedded server's decode threads (def. 2) */
    const char *const *ds_args; /* embedded: more arguments for the
                                   server's command line (NULL-terminated,
                                   copied; at most 16); NULL: none */
    const char *ds_listen;      /* embedded: endpoint where the server takes
                                payloads from remote DataServers
                                (`dataserver --listen`); NULL: none, so
                                this rank is served locally only */
    size_t arena_bytes;         /* embedded: 0 = dh_arena_default_size(
                                (prefetch + held) x microbatches, the
                                bytes of a
                                part of max_batch samples), at least
                                64 MiB; 256 MiB when max_batch is 0 */
    uint32_t max_batch;         /* most samples of a step (sizes the arena;
                                0: unknown) */
    struct dh_media_plan plan;  /* how every sample is prepared (indices
                                  are copied) */
    unsigned prefetch;          /* steps requested ahead (default 4) */
    unsigned microbatches;      /* requests per step (default 1) */
    int timeout_ms;             /* bound on one next() (default 60000) */
    int start_timeout_ms;       /* bound on registering and on starting the
                                embedded server (default 15000) */
    int max_restarts;           /* embedded server restarts (default 3) */
    double step_ms_hint;        /* step period assumed before one is
                                measured, for request slack (default
                                100; the deadline model in place.h) */
    double step_deadline_ms;    /* > 0: a fixed step period: a request for
                                the step k steps after the one being
                                computed carries slack k x this.  0
                                (default): the measured period (EWMA of
                                window + input wait) instead */
    double ddl_ms;              /* the miss threshold: a step whose input
                                wait exceeds it is a DDL miss (default
                                DH_CLIENT_DDL_MS) */
    FILE *telemetry;            /* JSONL per consumed step; NULL: none.
                                Borrowed: must outlive the client */
    unsigned spares;            /* the skip policy: spare ids sent with each
                                request (0..DH_CLIENT_MAX_SPARES; default 0:
                                off, a failed sample fails its step).  A
                                sample that fails is replaced in its position
                                by a spare of this rank's schedule (chosen by
                                the plan: docs/dataserver.md "Substitutes"),
                                so the step keeps its size; the batch says
                                so (dh_client_batch.subs) */
    const char *keyfile;        /* the job key (docs/security.md): the
                                Coordinator connection uses CURVE with it,
                                and the embedded server gets it as
                                --keyfile.  NULL: $DATAHELIX_KEYFILE if set,
                                else none */
    const char *trace;          /* Chrome trace-event JSON of the run
                                (docs/trace.md), written when the client
                                is destroyed; kept in memory until then,
                                at most DH_CLIENT_TRACE_MAX_STEPS steps
                                (later ones are left out and the file
                                says so).  NULL: none (the late-step
                                causes of dh_client_late() are kept
                                either way) */
    unsigned held;              /* steps the consumer holds beyond the one
                                it is computing (Tier 2's round buffer):
                                the default arena has room for them as
                                well as for prefetch (default 0) */
    const char *server_log;     /* embedded: DATAHELIX_LOG of the server it
                                starts (debug, info, warn, error; the
                                Python loaders pass warn unless the user set
                                one); NULL: as this process's */
    const char *cache_dir;      /* the host-local cache of S3 / HTTP(S)
                                objects (docs/remote.md "The cache"): the
                                embedded server gets --cache-dir, and this
                                client reads the remote samples of the steps
                                it requests ahead into it, in step order.
                                NULL: none (a server may still have one from
                                its environment) */
    uint64_t cache_bytes;       /* its bound; 0: 10 GiB */
};

/* Most steps a trace keeps: ~0.4 KiB of memory and ~5 KiB of file each
 * with 8 samples a step (~100 MB of JSON at the bound). */
#define DH_CLIENT_TRACE_MAX_STEPS 20000u
/* Most late steps dh_client_late() keeps (the latest ones). */
#define DH_CLIENT_MAX_LATE 1024u

/* Fills the defaults above (pointers NULL, rank 0, world 1, plan from
 * dh_media_plan_init()). */
DH_API void dh_client_opts_default(struct dh_client_opts *o);

/* One microbatch's tensor in the arena. */
struct dh_client_part {
    const void *data; /* in this process's mapping of the arena */
    uint64_t len;     /* bytes of the slot (>= the tensor) */
    uint64_t dims[8];
    uint32_t ndims; /* [B,T,H,W,3] (THWC) or [B,T,3,H,W] (TCHW) */
    enum dh_dtype dtype;
    enum dh_layout layout;
    uint32_t n_samples; /* dims[0] */
    uint32_t server_id; /* the arena's server */
};

/* One sample of a batch that was substituted (the skip policy). */
struct dh_client_subst {
    uint32_t position;      /* in the batch, over all parts */
    uint64_t failed_id;     /* the sample the plan put there, which failed */
    uint64_t substitute_id; /* the one delivered: sample_ids[position] */
    int cause;              /* the failed sample's DH_E* code */
    int stage;              /* enum dh_stage of the cause */
};

/* A consumed step.  Read-only; release with dh_client_batch_release(). */
struct dh_client_batch {
    uint32_t epoch;
    uint64_t step;
    uint32_t n_parts;
    struct dh_client_part *parts;
    uint32_t n_samples;                 /* over all parts */
    const uint64_t *sample_ids;         /* n_samples, batch order */
    const uint32_t *valid_frames;       /* n_samples: frames from the clip; the
                                     rest of T is padding */
    double input_wait_ms;               /* time this next() blocked */
    uint32_t n_subs;                    /* samples substituted (skip policy) */
    const struct dh_client_subst *subs; /* n_subs, by position */
    const float *sample_ms; /* n_samples: each sample's read + decode +
                               scale ms on the server that prepared it;
                               -1 where that server sent no times */
};

struct dh_client_stats {
    uint64_t steps;  /* next() calls that returned a batch */
    uint64_t errors; /* next() calls that returned a sample error */
    uint64_t misses; /* steps whose batch was not ready (input
                              wait > ddl_ms) */
    double input_wait_p50_ms, input_wait_p95_ms, input_wait_max_ms;
    double window_p50_ms;     /* time between steps, as measured */
    uint64_t requests;        /* DescriptorRequests sent (re-issues included) */
    uint64_t reissued;        /* requests re-sent after a server or
                                 Coordinator restart */
    uint64_t restarts;        /* embedded server restarts */
    uint64_t late_released;   /* expected duplicates (a task re-sent after
                                 a restart) or stale results (an abandoned
                                 pass's) released */
    uint64_t quarantined;     /* distinct samples that failed */
    uint64_t cross_ds_bytes;  /* bytes of parts prepared on a server other
                                than the one whose arena holds them */
    uint64_t batch_bytes;     /* bytes of every part delivered */
    double elapsed_s;         /* since the first next() */
    uint64_t arena_bytes;     /* the local arena's data area (0: none yet) */
    uint64_t held_bytes;      /* arena slots of batches not released */
    uint64_t substituted;     /* samples replaced by a spare (skip policy) */
    uint64_t protocol_errors; /* results that did not match their request
                                 (count, ids, dtype, dims): failed with
                                 DH_EPROTO, never used as data; and
                                 notices dropped: a second outcome of a
                                 task not re-sent, one for a step not
                                 asked, a result naming a slot this client
                                 holds already or no live slot */
    uint64_t coordinator_restarts; /* restarted Coordinators this client
                                      refilled (docs/exactly-once.md) */
    /* The read stage of the samples delivered (their servers' measures):
     * bytes taken from their sources (files, shard members), the stage's
     * time in ms, and the samples whose server reported it. */
    uint64_t read_bytes;
    double read_ms;
    uint64_t read_samples;
};

/* The default miss threshold: a ready batch's next() costs 0.05-0.3 ms
 * here, which is no miss; the simulator's waits are exact, its default is
 * 0. */
#define DH_CLIENT_DDL_MS 1.0

/*
 * Registers with the Coordinator and starts (or attaches to) the local
 * DataServer; both bounded by start_timeout_ms.  On error *out is
 * untouched, nothing is left running, and `e` says why: DH_EINVAL (bad
 * option), DH_ETIMEOUT ("coordinator ADDR did not answer within N ms"),
 * DH_EIO (cannot start or reach the local DataServer, with its exit
 * status), the index's codes, DH_ENOMEM.
 */
DH_API int dh_client_create(const struct dh_client_opts *o,
                            struct dh_client **out,
                            struct dh_err *e) DH_MUST_CHECK;

/*
 * Starts pass `pass` of `epoch`: n_steps steps, numbered first_step.. (the
 * global step within the epoch; first_step > 0 resumes mid-epoch), step k
 * consuming ids[offsets[k] .. offsets[k+1]) (offsets has n_steps + 1
 * entries; each step 1..DH_CLIENT_MAX_STEP_SAMPLES ids, at least
 * `microbatches`).  Copied.  Steps given before and not consumed yet are
 * abandoned: their results are released as they come.
 *
 * The pass names this schedule's task ids (wire.h: the id is (pass, step,
 * rank, microbatch); the epoch travels beside it), so a late result of an
 * abandoned schedule can never stand for a step of this one.  A pass is
 * either new - above every pass this client started before - or the
 * current one continued: the same epoch, first_step at or after the end
 * of the steps it was given (a long pass handed over in chunks).
 * DH_EINVAL for a pass used before otherwise, or for a bad schedule;
 * DH_ETOOBIG for pass >= DH_WIRE_MAX_PASSES (65,536: every task id of
 * this rank would be taken), an epoch above UINT32_MAX or steps beyond
 * DH_WIRE_MAX_STEPS; DH_ENOMEM.  On error nothing changes.
 */
DH_API int dh_client_start_pass(struct dh_client *c, uint64_t epoch,
                                uint64_t pass, uint64_t first_step,
                                uint64_t n_steps, const uint64_t *ids,
                                const uint64_t *offsets,
                                struct dh_err *e) DH_MUST_CHECK;

/* dh_client_start_pass() with a new pass: one more than the last this
 * client started (0 for its first).  Errors as there. */
DH_API int dh_client_start_epoch(struct dh_client *c, uint32_t epoch,
                                 uint64_t first_step, uint64_t n_steps,
                                 const uint64_t *ids, const uint64_t *offsets,
                                 struct dh_err *e) DH_MUST_CHECK;

/*
 * The next step's batch.  0: *out is set (release it).  DH_EEMPTY: the
 * epoch is done.  The step failed and is consumed: DH_ESAMPLE (a sample
 * could not be prepared: a decode or read error, its watchdog, a limit)
 * or DH_EARENA (the arena stayed full: the consumer holds too many
 * batches); `e` names the step, the sample id, path and cause, and
 * dh_client_failure() has them as fields.  DH_EARENA also comes at once,
 * the step not consumed, when a server waits for room in an arena that
 * holds nothing but this consumer's unreleased batches and results (no
 * batch could come before one is released).  DH_ETIMEOUT only when this
 * wait ran out (timeout_ms; the step stays next: calling again waits
 * again).  DH_EIO / DH_EPEERDEAD: the data plane failed (Coordinator shut
 * down, local server died and could not be restarted); every later call
 * returns it.
 */
DH_API int dh_client_next(struct dh_client *c, struct dh_client_batch **out,
                          struct dh_err *e) DH_MUST_CHECK;

/* next() with its own bound (>= 0 ms) instead of timeout_ms: call it in
 * short slices to stay responsive to signals.  A step's input wait is
 * measured from the first call that asked for it. */
DH_API int dh_client_next_for(struct dh_client *c, int timeout_ms,
                              struct dh_client_batch **out,
                              struct dh_err *e) DH_MUST_CHECK;

/* Gives the batch's slots back to the arena and frees it.  Any thread.
 * Accepts NULL. */
DH_API void dh_client_batch_release(struct dh_client_batch *b);

DH_API void dh_client_stats(struct dh_client *c, struct dh_client_stats *out);

/* stats.errors alone, cheaply (stats() sorts every measured wait). */
DH_API uint64_t dh_client_errors(struct dh_client *c);

/* Where a failed step's error arose, derived from its cause code. */
enum dh_stage {
    DH_STAGE_PREPARE = 0, /* anything else on the server */
    DH_STAGE_READ,        /* DH_EIO, DH_ENOTFOUND: opening, reading */
    DH_STAGE_DECODE,      /* DH_EMEDIA, DH_EFORMAT, DH_EUNSUPPORTED */
    DH_STAGE_WATCHDOG,    /* DH_ETIMEOUT: the sample's decode watchdog */
    DH_STAGE_LIMIT,       /* DH_ETOOBIG: a size over its limit */
    DH_STAGE_ARENA,       /* DH_EARENA: no room in the arena */
    DH_STAGE_MEMORY,      /* DH_ENOMEM */
    DH_STAGE_TRANSFER,    /* DH_EPROTO, DH_EPEERDEAD: between servers */
};

/* "prepare", "read", "decode", "watchdog", "limit", "arena", "memory",
 * "transfer". */
DH_API const char *dh_stage_name(enum dh_stage s);

#define DH_CLIENT_MAX_PATH 4096
#define DH_CLIENT_MAX_CAUSE 512

/* No sample is to blame (dh_client_failure.sample_id). */
#define DH_CLIENT_NO_SAMPLE UINT64_MAX

/*
 * Why a step was late (docs/trace.md "Late steps"): for a step whose input
 * wait exceeded ddl_ms, the part that came in last and, in it, the stage
 * that took longest: "queue" (waiting for a worker at its server),
 * "alloc" (for arena room), "read", "decode", "scale" (one sample's),
 * "collate" (the batch's own work), "place" (a remote payload into this
 * rank's arena), "notify" (the local server's loop picking the finished
 * batch up and sending its notice), "transfer" (from the batch being ready to this client
 * having its notice; for a remote part: from the request to the payload's
 * arrival, less the remote's own time), "route" (a local part: from the
 * request to its server queueing it), "client" (every part was in before
 * next() was called: the wait was the client's own), "unknown" (the
 * server sent no times).  sample_id / path: the slowest sample of that part.
 */
struct dh_client_late {
    uint32_t epoch;
    uint64_t step;
    double input_wait_ms;
    uint32_t microbatch;
    uint32_t server_id; /* the server that prepared the part */
    int remote;         /* 1: not this rank's local server */
    uint32_t worker;    /* its worker thread */
    const char *stage;  /* a static string (above) */
    double stage_ms;
    uint64_t sample_id; /* DH_CLIENT_NO_SAMPLE: none known */
    const char *path;   /* the sample's file (valid while the client
                           lives), or "" */
    double sample_ms;   /* that sample's read + decode + scale */
};

/* Copies up to cap of the kept late steps (oldest first) into out (NULL:
 * counts only); returns how many are kept (<= DH_CLIENT_MAX_LATE); *total
 * (if not NULL) gets every late step seen, kept or not. */
DH_API size_t dh_client_late(struct dh_client *c, struct dh_client_late *out,
                             size_t cap, uint64_t *total);

/* The last step next() returned DH_ESAMPLE or DH_EARENA for. */
struct dh_client_failure {
    uint32_t epoch;
    uint64_t step;
    int consumed;       /* 1: the step failed and is gone; 0: it is
                            still next (DH_EARENA at once: the consumer
                            holds the arena; release and call again) */
    uint64_t sample_id; /* the sample the server named, or
                            DH_CLIENT_NO_SAMPLE */
    char path[DH_CLIENT_MAX_PATH + 1]; /* "" if the server had none */
    int cause;                         /* the server's DH_E* code */
    enum dh_stage stage;
    uint32_t server_id;                    /* the DataServer that reported it */
    char message[DH_CLIENT_MAX_CAUSE + 1]; /* the cause, in words */
};

/* Copies the last failure into *out: 0, or DH_ENOTFOUND if no step of
 * this client has failed.  Any thread. */
DH_API int dh_client_failure(struct dh_client *c,
                             struct dh_client_failure *out);

/* Per-server load: up to `cap` (server id, parts it prepared) pairs, the
 * servers the Coordinator routed this client's consumed parts to; returns
 * how many servers there are in all. */
DH_API size_t dh_client_server_load(struct dh_client *c, uint32_t *ids,
                                    uint64_t *parts, size_t cap);

/* Up to `cap` sample ids that failed so far (distinct, in order of
 * failure); returns how many there are in all. */
DH_API size_t dh_client_quarantine(struct dh_client *c, uint64_t *out,
                                   size_t cap);

/*
 * Stops the I/O thread, stops the embedded server (bounded: SIGKILL after
 * 2 s) and frees the client once every batch is released.  Accepts NULL.
 */
DH_API void dh_client_destroy(struct dh_client *c);

#endif
