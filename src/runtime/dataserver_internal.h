/*
 * dataserver_internal.h - the parts of a DataServer
 * (src/include/datahelix/dataserver.h), local or remote, and the one small
 * interface between its core loop and the executors that run its jobs:
 *
 *   dataserver.c          the core: options, create / destroy, the loop,
 *                         dispatch of control messages, completions
 *   dataserver_jobs.c     the core's tables: admitted jobs, the slots
 *                         handed to the client, the quarantine
 *   dataserver_ctl.c      the sender: the Coordinator link, the only code
 *                         that builds and sends a control message
 *   dataserver_link.c     the local link that hands the arena to the client
 *   dataserver_payload.c  local --listen: payloads from remote servers into
 *                         the arena (DESIGN.md 8: the one copy on arrival)
 *   executors (struct ds_exec_ops):
 *   dataserver_pool.c     the C decode pool (workers.h)
 *   dataserver_python.c   Python worker processes (DistributedDataLoader)
 *   dataserver_remote.c   remote forwarding: the pool's batches sent
 *                         zero-copy from the private staging arena to their
 *                         delivery target
 *
 * Calls go one way: the core calls the sender, the inbox, the link, its
 * tables and the executors (through ops); an executor reports completions
 * to the sink it was given (a function pointer the core set), never by
 * calling a file of the core; the forwarding executor drives a pool
 * executor the same way.  Every part keeps its own state; what all may
 * read is struct ds_env, fixed at create (the counters in it are atomics).
 *
 * Locking: none.  Everything is owned by the thread in dh_dataserver_run()
 * (create / destroy by the same caller); only the atomic counters are read
 * from other threads, and the staging slots are released from ZeroMQ's I/O
 * thread through dh_arena_release() (thread-safe).
 */
#ifndef DH_RUNTIME_DATASERVER_INTERNAL_H
#define DH_RUNTIME_DATASERVER_INTERNAL_H

#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include <zmq.h>

#include "core/log.h"
#include "datahelix/arena.h"
#include "datahelix/dataserver.h"
#include "datahelix/index.h"
#include "datahelix/media.h"
#include "datahelix/wire.h"
#include "datahelix/workers.h"
#include "runtime/transport.h"

/* The loop's tick for what no descriptor signals (retries, watchdogs, a
 * payload waiting for space, heartbeats); completions wake it at once. */
#define DS_POLL_MS 5
#define DS_QUEUE_PER_THREAD 4
#define DS_N_SENT ((int)DH_ARENA_MAX_SLOTS + 1)
#define DS_MAX_PEERS 256 /* delivery targets with a cached socket */
#define DS_MAX_FRAMES 64 /* payload frames in one message */
#define DS_BURST 64      /* messages read per socket per loop turn */
/* A payload may overtake its task's Route to this server (they travel
 * apart: Coordinator -> here, Coordinator -> sidecar -> here); it waits
 * this long for it, holding the inbox, before it is refused. */
#define DS_ROUTE_WAIT_MS 1000
#define DS_PY_JOBS                                                             \
    512 /* jobs in Python mode (the client's prefetch
                            window is at most 256 steps) */
#define DS_PY_MAX_WORKERS 64

/* Several entries a line, which clang-format 14 re-breaks by one more on
 * every run: kept out of its reach. */
/* clang-format off */
#define DS_STATS(X)                                                        \
    X(malformed) X(routes) X(results) X(errors) X(releases) X(heartbeats)  \
    X(payloads) X(cross_ds_bytes) X(forwarded) X(forwarded_bytes)          \
    X(quarantined) X(quarantine_hits) X(substituted)                   \
    X(parts_in) X(parts_out)
/* clang-format on */

struct ds_stats {
#define DS_STAT_FIELD_(n) _Atomic uint64_t st_##n;
    DS_STATS(DS_STAT_FIELD_)
#undef DS_STAT_FIELD_
};

#define DS_ADD(env, n, v)                                                      \
    atomic_fetch_add_explicit(&(env)->st->st_##n, (uint64_t)(v),               \
                              memory_order_relaxed)
#define DS_INC(env, n) DS_ADD(env, n, 1)

/* What every part may read: set by the core at create, then fixed (but
 * client_gone, which the core sets when the client's link closes). */
struct ds_env {
    uint32_t server_id, rank;
    int remote;
    struct dh_index *ix;
    struct dh_arena *arena; /* local: shared with the client; remote:
                               private staging, never handed to anyone */
    uint64_t arena_cap;
    char token[DH_WIRE_TOKEN_LEN + 1]; /* local: the rank's token */
    /* its own payload secret, drawn at create: told to the Coordinator
     * only; the payloads it sends carry tokens derived from it
     * (dh__payload_token) */
    char sender_secret[DH_WIRE_TOKEN_LEN + 1];
    int alloc_timeout_ms, sample_timeout_ms, deliver_timeout_ms;
    int route_wait_ms; /* a payload of a task not expected (yet) waits this
                          long for its Route (dataserver_payload.c) */
    int client_gone;
    struct ds_stats *st;
    struct dh_tp_auth *auth; /* the job key for every socket; NULL: none */
    int insecure;            /* a non-local --listen without a key: warn */
    uint32_t stripes;        /* payload link width (dh__tp_stripes()) */
};

/* Releases a slot no notice carries; a failure is only logged. */
static inline void dh__ds_release(const struct ds_env *env,
                                  const struct dh_slot_ref *r)
{
    struct dh_err e;

    if (dh_arena_release(env->arena, r, &e) < 0)
        dh__log(DH_LOG_ERROR, "dataserver %u: %s", env->server_id, e.msg);
}

/* A Route the core admitted.  The core's job table owns it (ids, plan)
 * from admission until its completion has been reported; an executor holds
 * a pointer meanwhile and never frees it. */
struct ds_job {
    int used;
    struct dh_wire_task task;
    uint64_t *ids; /* owned */
    uint32_t n;
    struct dh_media_plan plan; /* .indices borrowed from the Route until
                                  submit() returns, NULL after */
    uint32_t target_id;        /* Route.target_server_id */
    char target_addr[DH_WIRE_MAX_ADDR + 1];
    uint64_t *spares; /* owned: the request's spares (skip policy) */
    uint32_t n_spares;
    int32_t *known;   /* owned, n entries or NULL: the quarantine's cause of
                       each sample (0: not quarantined), with spares only */
    unsigned retries; /* Python mode: runs again after its worker died */
};

/* A tensor in an arena slot, as a ResultNotice describes it. */
struct ds_result {
    struct dh_slot_ref slot; /* arena_offset, length, slot_generation */
    uint32_t ndims;
    uint64_t dims[DH_WIRE_MAX_DIMS];
    enum dh_dtype dtype;
    enum dh_layout layout;
    const uint64_t *ids;   /* borrowed: n sample ids */
    const uint32_t *valid; /* borrowed: n valid-frame counts */
    uint32_t n;
    double service_ms; /* 0: unknown */
    /* Substitutions (borrowed, n_subs entries each): positions, the failed
     * ids, their causes; ids[] already holds the substitutes. */
    const uint32_t *sub_pos;
    const uint64_t *sub_failed;
    const int32_t *sub_cause;
    uint32_t n_subs;
    /* Stage times (docs/trace.md), borrowed: the scalars, and the
     * per-sample times either as stage_rows (n rows of read, decode,
     * scale: the pool's) or as stages' own arrays (a remote's header);
     * stages.present 0: none. */
    struct dh_wire_stages stages;
    const float *stage_rows;
    const uint64_t *read_bytes; /* with stage_rows: n entries, or NULL */
    double done_ms; /* this host's CLOCK_MONOTONIC (ms) when the batch was
                       complete here; 0: unknown */
};

enum ds_done_kind {
    DS_DONE_RESULT,    /* res is in this server's arena: notify */
    DS_DONE_ERROR,     /* the task failed: an ErrorNotice */
    DS_DONE_FORWARDED, /* the batch went to its target: nothing to send */
};

/* One completion, as an executor (or the inbox) reports it.  Everything it
 * points to is borrowed for the duration of the sink call. */
struct ds_done {
    enum ds_done_kind kind;
    struct ds_job *job; /* the job it ends (the core frees it); NULL for
                           a payload from a remote server (the core
                           counts it in payloads / cross_ds_bytes) */
    struct dh_wire_task task;
    struct ds_result res; /* RESULT: its slot reference passes to the
                             core, which hands it to the client; ERROR:
                             only the substitutions made before the
                             failure (ids, sub_*), to quarantine */
    int code;             /* ERROR: a DH_E* code */
    uint64_t sample;      /* ERROR: the sample it names */
    const char *msg;      /* ERROR: one line */
    int quarantine;       /* ERROR: the sample's own failure: remember it */
    double latency_ms;    /* the work's time, for the EWMA; < 0: none */
};

struct ds_sink {
    void (*done)(void *arg, const struct ds_done *d);
    void *arg;
};

/* What the workers read, in total (ds_exec_ops.reads). */
struct ds_reads {
    uint64_t bytes, reads;
    double ms;
    uint64_t fetched_bytes, cache_hits, cache_misses; /* remote sources */
};

/* ---- the executor interface ----
 * A way this server runs jobs.  Each implementation embeds struct ds_exec
 * first; all calls are from the loop's thread. */

struct ds_exec;
struct ds_exec_ops {
    const char *name;
    /* 1: jobs' spares are used (a failed sample is substituted); 0: they
     * are ignored and a failed sample fails its job. */
    int spares;
    /* Takes job j.  0: taken, and its completion goes to the sink later,
     * or before submit() returns; < 0: refused, nothing reported, j not
     * kept, e says why. */
    int (*submit)(struct ds_exec *x, struct ds_job *j, struct dh_err *e);
    /* Reports every completion that is ready and does the executor's
     * periodic work (retries, watchdogs).  Called every loop turn. */
    void (*drain)(struct ds_exec *x);
    /* POLLIN items whose readiness means work for drain() (at most cap);
     * returns how many. */
    int (*pollitems)(struct ds_exec *x, zmq_pollitem_t *it, int cap);
    /* Jobs waiting and jobs running, for the heartbeat. */
    void (*load)(struct ds_exec *x, uint64_t *queued, uint64_t *busy);
    /* What its workers read from their sources, in total (NULL: none). */
    void (*reads)(struct ds_exec *x, struct ds_reads *out);
    /* Jobs' wall, on-CPU and waiting-for-CPU ns in total (the heartbeat's
     * cpu_fraction), and the workers waiting for an arena slot now;
     * NULL: not measured. */
    void (*cpu)(struct ds_exec *x, uint64_t *task_ns, uint64_t *cpu_ns,
                uint64_t *wait_ns, uint32_t *slot_waiting);
    /* Heartbeat links (bytes/s per delivery target); NULL: none. */
    uint32_t (*links)(struct ds_exec *x, struct dh_wire_link *out,
                      uint32_t cap);
    /* Stops, releases every slot it holds and frees itself; jobs it has
     * not reported are not reported (the core frees them).  NULL ok. */
    void (*destroy)(struct ds_exec *x);
};
struct ds_exec {
    const struct ds_exec_ops *ops;
};

/* dataserver_pool.c: `workers` threads, up to `queue` jobs waiting. */
int dh__ds_pool_create(const struct ds_env *env, unsigned workers,
                       unsigned queue, size_t max_jobs, struct ds_sink sink,
                       struct ds_exec **out, struct dh_err *e) DH_MUST_CHECK;
/* dataserver_python.c: checks the python_* options and starts the workers
 * (they get ready in the background; jobs wait for them). */
int dh__ds_py_create(const struct ds_env *env,
                     const struct dh_dataserver_opts *o, size_t max_jobs,
                     struct ds_sink sink, struct ds_exec **out,
                     struct dh_err *e) DH_MUST_CHECK;
/* dataserver_remote.c: a pool (as above) whose batches are forwarded. */
int dh__ds_fwd_create(const struct ds_env *env, void *zmq_ctx, unsigned workers,
                      unsigned queue, size_t max_jobs, struct ds_sink sink,
                      struct ds_exec **out, struct dh_err *e) DH_MUST_CHECK;

/* ---- dataserver_ctl.c: the sender (and the Coordinator link) ---- */
struct ds_ctl;
/* Counts one malformed message and logs it on one line naming `from`. */
void dh__ds_malformed(const struct ds_env *env, const char *from,
                      const char *fmt, ...) DH_PRINTF(3, 4);
int dh__ds_ctl_open(const struct ds_env *env, void *zmq_ctx, const char *coord,
                    struct ds_ctl **out, struct dh_err *e) DH_MUST_CHECK;
/* Sends, once, a last heartbeat marked `leaving` if registered and not
 * told to stop, so the Coordinator drops this server at once (best effort:
 * the socket lingers briefly to send it).  NULL ok. */
void dh__ds_ctl_leave(struct ds_ctl *c);
/* Leaves (above), closes, frees.  NULL ok. */
void dh__ds_ctl_close(struct ds_ctl *c);
void *dh__ds_ctl_socket(const struct ds_ctl *c);
/* Sends RegisterServer (role, address: `endpoint`, else o->addr, else a
 * name that says it takes no payloads) and waits, bounded by
 * o->register_timeout_ms, for its echo. */
int dh__ds_ctl_register(struct ds_ctl *c, const struct dh_dataserver_opts *o,
                        const char *endpoint, struct dh_err *e) DH_MUST_CHECK;
/* Reads one control message for the core into m (which must own nothing).
 * 1: m holds it (the caller finis it; DH_WIRE_NONE: it was bad, already
 * counted and logged), 0: none waiting, < 0: the socket failed. */
int dh__ds_ctl_recv(struct ds_ctl *c, struct dh_wire_msg *m,
                    struct dh_err *e) DH_MUST_CHECK;
/* A ResultNotice for task t from this server (not counted). */
int dh__ds_ctl_result(struct ds_ctl *c, const struct dh_wire_task *t,
                      const struct ds_result *r,
                      struct dh_err *e) DH_MUST_CHECK;
/* The last ResultNotice sent, encoded into *buf (dh_wire_free()s it):
 * 0, or < 0 (nothing kept). */
int dh__ds_ctl_last_notice(struct ds_ctl *c, uint8_t **buf, size_t *len);
/* Sends an encoded ResultNotice again; a failure is logged. */
void dh__ds_ctl_resend(struct ds_ctl *c, const uint8_t *buf, size_t len);
/* An ErrorNotice from this server (counted); a send failure is logged. */
void dh__ds_ctl_error(struct ds_ctl *c, const struct dh_wire_task *t,
                      uint64_t sample, int cause, const char *msg);
void dh__ds_ctl_heartbeat(struct ds_ctl *c, uint64_t queued, uint64_t busy,
                          double latency_ms, double cpu_fraction,
                          uint32_t slot_waiting, const struct ds_reads *rd,
                          const struct dh_wire_link *links, uint32_t n_links);
/* Fills m with a ResultNotice for task t from `server_id` (also the
 * payload header a remote sends). */
int dh__ds_notice_fill(struct dh_wire_msg *m, uint32_t server_id,
                       const struct dh_wire_task *t, const struct ds_result *r,
                       struct dh_err *e) DH_MUST_CHECK;

/* ---- dataserver_jobs.c: the core's tables ---- */
struct ds_jobs {
    struct ds_job *v;
    size_t n;
};
int dh__ds_jobs_init(struct ds_jobs *t, size_t n,
                     struct dh_err *e) DH_MUST_CHECK;
void dh__ds_jobs_fini(struct ds_jobs *t);
/* A free entry, or NULL. */
struct ds_job *dh__ds_job_new(struct ds_jobs *t);
/* The job of task `task` in the table, or NULL. */
struct ds_job *dh__ds_job_find(struct ds_jobs *t, uint64_t task);
/* Frees what the job owns and marks it free. */
void dh__ds_job_clear(struct ds_job *j);

/* Routes that found every job entry (or the executor's queue) taken: they
 * wait here, in order, and are admitted as jobs end - "busy" is back-
 * pressure, never a sample's error.  Full only when the Coordinator sends
 * far more than the server's share (DS_BACKLOG_PER_JOB x the table). */
#define DS_BACKLOG_PER_JOB 4
struct ds_backlog {
    struct dh_wire_msg *v; /* cap entries, a ring */
    size_t head, n, cap;
};
int dh__ds_backlog_init(struct ds_backlog *b, size_t cap,
                        struct dh_err *e) DH_MUST_CHECK;
void dh__ds_backlog_fini(struct ds_backlog *b);
/* Takes *m over (it is left empty): 0, or DH_ETOOBIG (full: *m kept). */
int dh__ds_backlog_push(struct ds_backlog *b, struct dh_wire_msg *m);
/* The oldest waiting Route, or NULL. */
struct dh_wire_msg *dh__ds_backlog_front(struct ds_backlog *b);
void dh__ds_backlog_pop(struct ds_backlog *b);
/* 1 if a Route of task `task` waits here. */
int dh__ds_backlog_has(const struct ds_backlog *b, uint64_t task);

/* Slots handed to the client with a ResultNotice (a Release names one),
 * each with its notice as sent: a Coordinator that dies with the notice
 * unforwarded routes the task here again when the client re-issues it,
 * and the same notice then carries the same slot (never a second one). */
struct ds_sent {
    int used;
    struct dh_slot_ref ref;
    uint64_t task;
    uint8_t *notice; /* encoded (dh_wire_encode), or NULL */
    size_t notice_len;
};
struct ds_slots {
    struct ds_sent v[DS_N_SENT];
};
/* Takes `notice` (NULL: none kept; freed with the entry). */
void dh__ds_slot_remember(struct ds_slots *t, const struct ds_env *env,
                          const struct dh_slot_ref *r, uint64_t task,
                          uint8_t *notice, size_t notice_len);
/* The entry of a slot sent for `task` that is still live (not released by
 * the client), or NULL. */
const struct ds_sent *dh__ds_slot_of_task(const struct ds_slots *t,
                                          const struct ds_env *env,
                                          uint64_t task);
void dh__ds_slots_fini(struct ds_slots *t);
void dh__ds_slot_release(struct ds_slots *t, const struct ds_env *env,
                         const struct dh_wire_release *r);

/* Samples that failed here, so a request naming one again fails at once
 * instead of paying for the decode twice (a ring: the oldest go first). */
#define DS_QUARANTINE 256
struct ds_quarantine {
    uint64_t id;
    int code; /* 0: empty entry */
    char msg[256];
};
struct ds_quarantines {
    struct ds_quarantine v[DS_QUARANTINE];
    size_t next;
};
void dh__ds_quarantine_add(struct ds_quarantines *q, const struct ds_env *env,
                           uint64_t id, int code, const char *msg);
const struct ds_quarantine *
dh__ds_quarantine_find(const struct ds_quarantines *q,
                       const struct dh_wire_request *rq);
/* The quarantine's cause of `id`, or 0. */
int dh__ds_quarantine_code(const struct ds_quarantines *q, uint64_t id);

/* ---- dataserver_link.c: handing the arena to the client ---- */
struct ds_link {
    int fd;         /* the client's end of the local link, or -1 */
    int listen_fd;  /* external mode: the abstract socket, or -1 */
    pid_t want_pid; /* external mode: the one client pid admitted (0: any
                       process of this uid; peer_cred.h) */
};
int dh__ds_link_hello(const struct ds_env *env, int fd,
                      struct dh_err *e) DH_MUST_CHECK;
void dh__ds_link_accept(struct ds_link *l, const struct ds_env *env);
/* The link is readable: 1 if the client went away (the link is closed). */
int dh__ds_link_gone(struct ds_link *l, const struct ds_env *env);

/* ---- dataserver_payload.c: local --listen ---- */
struct ds_inbox;
/* Binds o->listen.  DH_EINVAL for a wildcard bind without advertise. */
int dh__ds_inbox_open(const struct ds_env *env, void *zmq_ctx,
                      const struct dh_dataserver_opts *o, struct ds_inbox **out,
                      struct dh_err *e) DH_MUST_CHECK;
void dh__ds_inbox_close(struct ds_inbox *in);
/* The announced address: o->advertise or the endpoint bound. */
const char *dh__ds_inbox_endpoint(const struct ds_inbox *in);
/* The socket to poll, or NULL while a payload waits for arena space. */
void *dh__ds_inbox_socket(const struct ds_inbox *in);
/* The Coordinator placed `task` of this rank on remote server `server`
 * with this server as its delivery target: one payload for it, from that
 * server only (its header carries `token`, the Route's sender_token), is
 * taken (a re-route names the new server).  A payload parked for it is
 * placed on the next serve. */
void dh__ds_inbox_expect(struct ds_inbox *in, uint64_t task, uint32_t server,
                         const char *token);
/* Reads payloads (up to DS_BURST) and retries a waiting one; each placed
 * (RESULT, job NULL) or refused (ERROR) goes to the sink. */
void dh__ds_inbox_serve(struct ds_inbox *in, struct ds_sink sink);

#endif
