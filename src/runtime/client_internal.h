/*
 * client_internal.h - state shared by client.c (the consumer's side:
 * create, epochs, next, release), client_io.c (the I/O thread: requests,
 * notices, restarts of the embedded server) and client_spawn.c (starting,
 * reaping and greeting the embedded DataServer).
 *
 * Locking: `mu` guards the schedule, the reorder buffer, the result pool,
 * the fatal error and the counters; `cv` signals a new outcome or a fatal
 * error to next().  The ZeroMQ socket and the link belong to the I/O
 * thread once it runs (before that, to create()).  `arenas` is append-
 * only: an entry is complete before n_arenas (atomic) counts it, so
 * release() reads it without the lock.
 */
#ifndef DH_RUNTIME_CLIENT_INTERNAL_H
#define DH_RUNTIME_CLIENT_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/types.h>

#include "datahelix/arena.h"
#include "datahelix/client.h"
#include "datahelix/index.h"
#include "datahelix/place.h"
#include "datahelix/reorder.h"
#include "datahelix/wire.h"
#include "runtime/local_link.h"
#include "runtime/transport.h"

/* The public header states the step cap without the (internal) wire codec. */
_Static_assert(DH_CLIENT_MAX_STEP_SAMPLES == DH_WIRE_MAX_SAMPLES,
               "client.h's step cap is the wire's request cap");

#define CL_MAX_ARENAS 64 /* the first server and its restarts */
#define CL_MAX_LOAD 256  /* servers tracked in the per-server load */

struct cl_arena {
    uint32_t server_id;
    struct dh_arena *a;
    _Atomic uint64_t held_bytes; /* slots of unreleased batches */
    _Atomic uint32_t held;       /* parts of unreleased batches */
};

/* ResultNotice.stages as the client keeps them (rows: n x 3 ms, owned). */
struct cl_stages {
    int present;
    uint32_t server_id, worker;
    double queue_ms, alloc_ms, collate_ms, place_ms, notify_ms, service_ms;
    double ready_ms; /* this host's CLOCK_MONOTONIC; 0: unknown */
    float *rows;
    uint64_t *bytes; /* per sample, read from its source; NULL: not sent */
};

struct cl_trace; /* client_trace.c */
struct cl_batch; /* client.c */

/* An outcome waiting in the reorder buffer (the payload is its index). */
struct cl_result {
    int used, is_error;
    uint64_t task_id;
    int arena;
    struct dh_slot_ref ref;
    uint64_t dims[DH_WIRE_MAX_DIMS];
    uint32_t ndims;
    enum dh_dtype dtype;
    enum dh_layout layout;
    uint32_t n;
    uint64_t *ids;   /* owned */
    uint32_t *valid; /* owned */
    int code;        /* is_error */
    uint64_t sample_id;
    char msg[DH_ERR_MSG_MAX];
    struct dh_client_failure *fail; /* owned, is_error from a server; NULL
                                       when out of memory for it */
    uint64_t arrived_ms;
    double arrived_msf;
    struct cl_stages st; /* the server's stage times (docs/trace.md) */
    uint32_t n_subs;     /* substitutions (positions within this part) */
    struct dh_client_subst *subs; /* owned */
};

/* Per outstanding task (ring by request position): for telemetry. */
struct cl_sent {
    double sent_msf;
    uint64_t task_id, sent_ms;
    int64_t slack_ms;
    uint32_t route_server;
    int reissued; /* sent again (a restart): a second outcome is expected */
};

struct dh_client {
    /* options (copied) */
    char coord[DH_WIRE_MAX_ADDR + 1];
    /* The rank's secret (docs/wire-protocol.md "Authorization"): drawn
     * here and handed to the DataServer this client starts, or taken from
     * the hello of the external one it attaches to. */
    char token[DH_WIRE_TOKEN_LEN + 1];
    char env_token[sizeof(DH_RANK_TOKEN_ENV) + DH_WIRE_TOKEN_LEN + 1];
    char env_log[32]; /* "DATAHELIX_LOG=LEVEL" for the server; "": none */
    char *index_path, *ds_name, *bin, *ds_listen;
    char *keyfile;          /* the job key's file (o->keyfile or
                               $DATAHELIX_KEYFILE), also the embedded
                               server's --keyfile; NULL: no key */
    struct dh_tp_auth auth; /* loaded from keyfile when registering */
    char *ds_args[DH_CLIENT_MAX_DS_ARGS + 1]; /* NULL-terminated copies */
    char *cache_dir;      /* o->cache_dir: also the server's --cache-dir */
    char cache_bytes[24]; /* its --cache-bytes ("" : the default) */
    /* this rank's remote samples read ahead into the cache as their steps
     * are requested (media/prefetch.h); NULL: no cache */
    struct dh_prefetch *ahead;
    uint32_t rank, world;
    unsigned ds_workers, prefetch, mb;
    size_t arena_bytes;
    struct dh_media_plan plan;
    int64_t *plan_indices;
    int timeout_ms, start_timeout_ms, max_restarts;
    double ddl_ms;       /* the miss threshold */
    unsigned spares;     /* per request; 0: no skip policy */
    uint64_t *spare_buf; /* spares x microbatches: scratch (mu) */
    FILE *telemetry;
    int tel_failed; /* a telemetry write failed (said once) */

    struct dh_index *ix;
    void *ctx, *sock;
    uint64_t incarnation;       /* the Coordinator's, from its last ack */
    uint64_t next_keepalive_ms; /* I/O thread: the next RegisterClient */
    int link_fd, wake_fd;
    pid_t child; /* embedded server, or -1 */
    uint32_t server_id;
    struct cl_arena arenas[CL_MAX_ARENAS];
    _Atomic int n_arenas;
    pthread_t io;
    int io_started;
    _Atomic int stop;
    _Atomic int refs; /* 1 for the client + 1 per live batch */

    pthread_mutex_t mu;
    pthread_cond_t cv;
    /* the pass (mu): its epoch, its number, the lowest new one */
    uint32_t epoch, pass;
    uint64_t pass_next;
    uint64_t first_step, n_steps;
    uint64_t *ids, *offs;
    uint64_t next_issue, next_consume; /* step positions 0..n_steps */
    struct dh_reorder *ro;
    struct cl_result *pool;
    size_t pool_n;
    struct cl_sent *sent; /* pool_n, indexed by (k % prefetch) * mb + j */
    uint64_t *pend;       /* pool_n: scratch for dh_reorder_pending() */
    int fatal;
    struct dh_err fatal_e;
    /* consumer-side measurements (consumer thread; copied under mu) */
    uint64_t t0_ms, last_return_us;
    double step_t_call, step_window; /* of the step being waited for */
    double last_wait_ms; /* input wait of the last step (RankReport) */
    size_t taken[DH_CLIENT_MAX_PARTS]; /* parts of the head step in hand */
    uint32_t n_taken;
    double *waits, *windows;
    size_t n_meas, cap_meas;
    struct dh_window win; /* the deadline model (place.h) */
    uint64_t *quar;
    size_t n_quar, cap_quar;
    struct cl_batch *batches;           /* handed out, not released (mu) */
    struct dh_client_stats st;          /* counters (mu) */
    struct dh_client_failure last_fail; /* (mu) */
    int has_fail;
    struct {
        uint32_t id;
        uint64_t parts;
    } load[CL_MAX_LOAD]; /* (mu) */
    size_t n_load;
    /* late steps and the trace (client_trace.c; mu) */
    struct dh_client_late late[DH_CLIENT_MAX_LATE];
    size_t late_head, n_late;
    uint64_t late_total;
    struct cl_trace *trace; /* NULL: no trace */
    char *trace_path;
};

/* Frees a pool entry's owned parts and marks it unused (mu held); its
 * slot, if any, is the caller's to release first. */
void dh__cl_result_free(struct cl_result *r);
/* 1 if slot `ref` of arena `arena` is one this client holds already: a
 * pooled result's or a live batch's (mu held).  A notice naming it is a
 * duplicate, and releasing it would free memory the consumer reads. */
int dh__cl_slot_held(const struct dh_client *c, int arena,
                     const struct dh_slot_ref *ref);
/* The stage a server's cause code points at. */
enum dh_stage dh__stage_of(int cause);

/* ---- test seams (tests/fuzz/fuzz_client_seq.c) ---- */
/* A client with no Coordinator, no server and no I/O thread: the caller
 * sets c->ctx and c->sock (a DEALER the requests go to), appends arenas
 * and plays the I/O thread with dh__cl_feed() and dh__cl_pump(); then
 * dh_client_destroy(). */
int dh__cl_create_detached(const struct dh_client_opts *o,
                           struct dh_client **out, struct dh_err *e);
/* What the I/O thread does with one message from the Coordinator. */
void dh__cl_feed(struct dh_client *c, const struct dh_wire_msg *m);
/* What the I/O thread does after its receives: requests up to prefetch. */
void dh__cl_pump(struct dh_client *c);

/* ---- client_trace.c ---- */
/* Starts the trace buffer (c->trace_path set): DH_ENOMEM. */
int dh__cl_trace_open(struct dh_client *c, struct dh_err *e);
/* Step position k is consumed (mu held): its late cause when it missed,
 * its events when tracing.  t_call: when next() was first asked for it. */
void dh__cl_trace_step(struct dh_client *c, uint64_t k, double t_call,
                       double wait, double window, const size_t *idx);
/* Writes the trace file and frees the buffer (no other thread). */
void dh__cl_trace_close(struct dh_client *c);

/* ---- client_io.c ---- */
void *dh__cl_io_main(void *arg);
/* Sends RegisterClient for this rank (`peer` names the Coordinator in
 * errors): the first registration, and every keepalive after it. */
int dh__cl_send_register(struct dh_client *c, const char *peer,
                         struct dh_err *e);
/* Wakes the I/O thread (a step was consumed or the epoch changed). */
void dh__cl_wake(struct dh_client *c);
/* Task id of step position k, microbatch j of the current pass. */
uint64_t dh__cl_task_id(const struct dh_client *c, uint64_t k, uint32_t j);
/* The slack of step position k's requests, from the deadline model
 * (place.h), clamped to what the wire carries (mu held). */
int64_t dh__cl_slack_ms(const struct dh_client *c, uint64_t k);

/* ---- client_spawn.c ---- */
/*
 * Starts the embedded server (server id `server_id`) and waits, bounded by
 * start_timeout_ms, for its hello; then attaches its arena and appends it
 * to c->arenas.  Sets c->child, c->link_fd, c->server_id.  On error
 * nothing is left running.
 */
int dh__cl_start_server(struct dh_client *c, uint32_t server_id,
                        struct dh_err *e);
/* Attaches to an external server's abstract socket (c->ds_name). */
int dh__cl_attach_server(struct dh_client *c, struct dh_err *e);
/* Waits for the embedded child to end (it will: its link is closed or it
 * died), SIGKILL after grace_ms; writes how it ended into why.  Returns 0
 * when it exited with status 0, 1 otherwise (a signal, a failure, none). */
int dh__cl_reap(struct dh_client *c, int grace_ms, char *why, size_t n);

#endif
