/*
 * dataserver_internal.h - state shared by the files of a DataServer
 * (include/datahelix/dataserver.h), local or remote:
 *
 *   dataserver.c          options, create / destroy, the serving loop
 *   dataserver_ctl.c      the Coordinator link: registration, heartbeats,
 *                         notices, receiving and dispatching control messages
 *   dataserver_jobs.c     the job table (Routes -> worker pool ->
 *                         completions) and the slots handed to the client
 *   dataserver_link.c     the local link that hands the arena to the client
 *   dataserver_payload.c  local --listen: payloads from remote servers into
 *                         the arena (DESIGN.md 8: the one copy on arrival)
 *   dataserver_remote.c   remote mode: batches sent zero-copy from the
 *                         private staging arena to their delivery target
 *   dataserver_python.c   Python-dataset mode: jobs run by Python worker
 *                         processes this server starts (DistributedDataLoader)
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

#include <zmq.h>

#include "datahelix/arena.h"
#include "datahelix/dataserver.h"
#include "datahelix/index.h"
#include "datahelix/media.h"
#include "datahelix/wire.h"
#include "datahelix/workers.h"

#define DS_POLL_MS 5
#define DS_QUEUE_PER_THREAD 4
#define DS_N_SENT ((int)DH_ARENA_MAX_SLOTS + 1)
#define DS_MAX_PEERS 256 /* delivery targets with a cached socket */
#define DS_MAX_FRAMES 64 /* payload frames in one message */
#define DS_BURST 64      /* messages read per socket per loop turn */

/* A job in the pool: what its completion needs to become a notice, and
 * (remote) where the batch goes and its state while it waits for the
 * target to take it. */
struct ds_job {
    int used;
    struct dh_wire_task task;
    uint64_t *ids; /* owned */
    uint32_t n;
    struct dh_media_plan plan; /* indices never set (refused by the pool) */
    uint32_t target_id;        /* Route.target_server_id */
    char target_addr[DH_WIRE_MAX_ADDR + 1];
    /* remote, completed, waiting for the target (job->parked): */
    int parked;
    struct dh_slot_ref slot; /* staging slot, one reference held */
    size_t payload_len;      /* tensor bytes at the start of the slot */
    uint8_t *hdr;            /* the encoded ResultNotice (dh_wire_free) */
    size_t hdr_len;
    uint64_t give_up_ms;
};

/* A slot handed to the client with a ResultNotice. */
struct ds_sent {
    int used;
    struct dh_slot_ref ref;
};

/* Remote: a cached DEALER socket to one delivery target. */
struct ds_peer {
    int used;
    uint32_t server_id;
    char addr[DH_WIRE_MAX_ADDR + 1];
    void *sock;
    uint64_t last_use_ms;
    uint64_t bytes;       /* payload bytes handed to ZeroMQ for it */
    uint64_t bytes_at_hb; /* ... as of the last heartbeat */
    double bps;           /* EWMA of bytes/s over heartbeat periods that
                             carried traffic */
};

/* Local: one payload message waiting for arena space. */
struct ds_inbox {
    int held;
    struct dh_wire_msg hdr; /* its decoded ResultNotice */
    zmq_msg_t frames[DS_MAX_FRAMES];
    int n_frames;
    uint64_t give_up_ms;
    uint64_t tries, releases_seen; /* arena releases at the last try */
    char from[96]; /* the sender, for logs */
};

/* Several entries a line, which clang-format 14 re-breaks by one more on
 * every run: kept out of its reach. */
/* clang-format off */
#define DS_STATS(X)                                                        \
    X(malformed) X(routes) X(results) X(errors) X(releases) X(heartbeats)  \
    X(payloads) X(cross_ds_bytes) X(forwarded) X(forwarded_bytes)          \
    X(quarantined) X(quarantine_hits)
/* clang-format on */

/* Samples that failed here, so a request naming one again fails at once
 * instead of paying for the decode twice (a ring: the oldest go first). */
#define DS_QUARANTINE 256
struct ds_quarantine {
    uint64_t id;
    int code; /* 0: empty entry */
    char msg[256];
};

struct dh_dataserver {
    char coord[DH_WIRE_MAX_ADDR + 1];
    char coord_peer[DH_WIRE_MAX_ADDR + 16]; /* "coordinator ADDR" */
    char endpoint[DH_WIRE_MAX_ADDR + 1]; /* announced payload address */
    char bound[DH_WIRE_MAX_ADDR + 1];    /* what the payload socket bound */
    uint32_t server_id, rank;
    int remote;
    int heartbeat_ms, alloc_timeout_ms, deliver_timeout_ms;
    int sample_timeout_ms;
    int link_fd;   /* the client's end of the local link, or -1 */
    int listen_fd; /* external mode: the abstract socket, or -1 */
    struct dh_index *ix;
    struct dh_arena *arena; /* local: shared with the client; remote:
                               private staging, never handed to anyone */
    uint64_t arena_cap;
    struct dh_workers *pool;
    void *ctx, *sock; /* DEALER to the Coordinator */
    void *psock;      /* local --listen: ROUTER for payloads, or NULL */
    struct ds_job *jobs;
    size_t n_jobs;
    struct ds_py *py; /* Python-dataset mode (dataserver_python.c), or NULL */
    struct ds_sent sent[DS_N_SENT];
    struct ds_peer *peers; /* remote: DS_MAX_PEERS */
    struct ds_inbox inbox;
    struct ds_quarantine quar[DS_QUARANTINE];
    size_t quar_next;
    struct dh_wire_msg in, out;
    uint64_t hb_seq, next_hb_ms, last_hb_ms;
    double latency_ms;
    int shutdown;
    int registered;    /* the Coordinator acknowledged us */
    int coord_stopped; /* it told us to stop: no goodbye to send */

#define DS_STAT_FIELD_(n) _Atomic uint64_t st_##n;
    DS_STATS(DS_STAT_FIELD_)
#undef DS_STAT_FIELD_
};

#define DS_ADD(s, n, v) atomic_fetch_add_explicit(&(s)->st_##n, (uint64_t)(v), \
                                                  memory_order_relaxed)
#define DS_INC(s, n) DS_ADD(s, n, 1)

/* ---- dataserver_ctl.c: the Coordinator link ---- */
/* Counts one malformed message and logs it on one line naming `from`. */
void dh__ds_malformed(struct dh_dataserver *s, const char *from,
                      const char *fmt, ...) DH_PRINTF(3, 4);
int dh__ds_open_ctl(struct dh_dataserver *s, struct dh_err *e) DH_MUST_CHECK;
/* Sends RegisterServer (role, address from `o` and s) and waits, bounded
 * by o->register_timeout_ms, for its echo. */
int dh__ds_register(struct dh_dataserver *s,
                    const struct dh_dataserver_opts *o,
                    struct dh_err *e) DH_MUST_CHECK;
/* Encodes and sends `m` to the Coordinator without blocking. */
int dh__ds_send_msg(struct dh_dataserver *s, const struct dh_wire_msg *m,
                    struct dh_err *e) DH_MUST_CHECK;
/* An ErrorNotice from this server (counted); a send failure is logged. */
void dh__ds_send_error(struct dh_dataserver *s, const struct dh_wire_task *t,
                       uint64_t sample, int cause, const char *msg);
void dh__ds_heartbeat(struct dh_dataserver *s);
/* A last heartbeat marked `leaving`, so the Coordinator drops this server
 * at once; best effort (the socket lingers briefly to send it). */
void dh__ds_leave(struct dh_dataserver *s);
/* Handles up to DS_BURST control messages; < 0 if the socket failed. */
int dh__ds_recv_ctl(struct dh_dataserver *s, struct dh_err *e) DH_MUST_CHECK;

/* ---- dataserver_jobs.c: jobs and client slots ---- */
int dh__ds_jobs_init(struct dh_dataserver *s, size_t n,
                     struct dh_err *e) DH_MUST_CHECK;
void dh__ds_jobs_fini(struct dh_dataserver *s);
/* Frees what the job owns (a parked job's staging slot included). */
void dh__ds_job_clear(struct dh_dataserver *s, struct ds_job *j);
void dh__ds_on_route(struct dh_dataserver *s, const struct dh_wire_route *r);
void dh__ds_on_release(struct dh_dataserver *s,
                       const struct dh_wire_release *r);
/* Turns every worker completion waiting into a notice or a forward. */
void dh__ds_collect(struct dh_dataserver *s);
/* A slot the client now holds (a Release may name it later). */
void dh__ds_remember_slot(struct dh_dataserver *s,
                          const struct dh_slot_ref *r);
/* Releases a slot no notice carries; a failure is only logged. */
void dh__ds_drop_slot(struct dh_dataserver *s, const struct dh_slot_ref *r);
/* A ResultNotice for job j's completion d from `server_id`: task, dims,
 * dtype, layout, sample ids and valid frames (slot fields left 0). */
int dh__ds_result_fill(struct dh_wire_msg *m, const struct ds_job *j,
                       const struct dh_work_done *d, uint32_t server_id,
                       struct dh_err *e) DH_MUST_CHECK;

/* ---- dataserver_python.c: Python-dataset mode ---- */
/* Jobs the table holds in Python mode (the client's prefetch window is at
 * most 256 steps, so a request is never turned away as "busy"). */
#define DS_PY_JOBS 512
#define DS_PY_MAX_WORKERS 64
struct ds_py;
/* Checks the python_* options and starts the workers (they get ready in
 * the background; jobs wait for them). */
int dh__ds_py_create(struct dh_dataserver *s,
                     const struct dh_dataserver_opts *o,
                     struct dh_err *e) DH_MUST_CHECK;
/* Closes the workers' sockets, waits a moment, SIGKILLs the rest and
 * reaps them all; releases slots they held.  Before the arena goes. */
void dh__ds_py_destroy(struct dh_dataserver *s);
/* Queues job j (ids, task set) for a worker; a job that cannot run (the
 * workers cannot start) is answered with an ErrorNotice and cleared. */
void dh__ds_py_submit(struct dh_dataserver *s, struct ds_job *j);
/* One turn: worker messages -> notices, deaths and the watchdog ->
 * ErrorNotices and replacements, queued jobs -> idle workers. */
void dh__ds_py_serve(struct dh_dataserver *s);
/* Adds a POLLIN item per live worker socket (at most DS_PY_MAX_WORKERS);
 * returns how many. */
int dh__ds_py_pollitems(const struct dh_dataserver *s, zmq_pollitem_t *it);
/* Jobs waiting for a Python worker and workers busy on one (heartbeat). */
void dh__ds_py_load(const struct dh_dataserver *s, uint64_t *queued,
                    uint64_t *busy);

/* ---- dataserver_link.c: handing the arena to the client ---- */
int dh__ds_send_hello(struct dh_dataserver *s, int fd,
                      struct dh_err *e) DH_MUST_CHECK;
void dh__ds_on_accept(struct dh_dataserver *s);
void dh__ds_on_link(struct dh_dataserver *s);

/* ---- dataserver_payload.c: local --listen ---- */
/* Binds o->listen and fills s->endpoint (o->advertise or the bound
 * endpoint).  DH_EINVAL for a wildcard bind without advertise. */
int dh__ds_payload_open(struct dh_dataserver *s,
                        const struct dh_dataserver_opts *o,
                        struct dh_err *e) DH_MUST_CHECK;
void dh__ds_payload_close(struct dh_dataserver *s);
/* 1 if the loop should poll the payload socket (no payload is waiting
 * for arena space). */
int dh__ds_payload_wants_input(const struct dh_dataserver *s);
/* Reads payload messages (up to DS_BURST) and retries a waiting one. */
void dh__ds_payload_serve(struct dh_dataserver *s);

/* ---- dataserver_remote.c: remote mode ---- */
int dh__ds_remote_init(struct dh_dataserver *s,
                       struct dh_err *e) DH_MUST_CHECK;
void dh__ds_remote_fini(struct dh_dataserver *s);
/* Job j completed with d (code 0): sends its batch to the target, or
 * parks j until the target takes it.  Takes d's slot; clears j when
 * done (an ErrorNotice goes to the Coordinator if it cannot deliver). */
void dh__ds_forward(struct dh_dataserver *s, struct ds_job *j,
                    const struct dh_work_done *d);
/* Retries parked jobs; gives up (ErrorNotice) past their deadline. */
void dh__ds_forward_retry(struct dh_dataserver *s);
/* Heartbeat links: updates the EWMAs and writes up to `cap` links. */
uint32_t dh__ds_links(struct dh_dataserver *s, struct dh_wire_link *out,
                      uint32_t cap);

#endif
