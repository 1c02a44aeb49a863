/*
 * datahelix/dataserver.h - a DataServer (DESIGN.md 2, issue 4 item 3): the
 * process beside training rank R that decodes the batches routed to it
 * into its shared-memory arena and tells the Coordinator where they are
 * (local mode), or a CPU sidecar anywhere that decodes routed batches and
 * sends them to the requester's local DataServer (remote mode, DESIGN.md
 * 2 "Remote path").
 *
 * Design notes:
 *   - One DEALER socket to the Coordinator (docs/wire-protocol.md).  create()
 *     sends RegisterServer (role LOCAL with the rank served, or REMOTE with
 *     rank 0 and arena_bytes = its staging bytes) and waits, bounded by
 *     register_timeout_ms, for the echo that acknowledges it; a refusal
 *     (a Shutdown) or silence is an error, never a hang.
 *   - run() is one loop, the same in both modes: zmq_poll() for at most
 *     5 ms, then control messages, payloads (local --listen), worker
 *     completions, batches waiting for their target (remote), and a
 *     Heartbeat whenever heartbeat_ms has passed (queue depth, busy
 *     workers, EWMA of decode latency; remote: `links`, the bytes/s EWMA
 *     sent to each delivery target).
 *       Route with an embedded DescriptorRequest -> a job for the worker
 *           pool (workers.h), plan from dh_wire_plan_to_media().
 *       completion (local) -> ResultNotice (task, slot offset/length/
 *           generation, dims [B,T,H,W,3] for THWC or [B,T,3,H,W] for TCHW,
 *           dtype, layout, sample ids and valid frames) whose slot
 *           reference passes to the client with the notice; or ErrorNotice
 *           (task, failed sample id, its path, cause code, message).
 *       completion (remote) -> the batch goes to the Route's delivery
 *           target (target_server_id / target_addr): one multipart
 *           message on a DEALER socket cached per target, frame 0 a
 *           ResultNotice (this server's id, arena_offset 0, length = tensor
 *           bytes, dims etc. as above), frame 1 the tensor, sent zero-copy
 *           from the private staging arena (ZeroMQ's free callback
 *           releases the slot).  A target that cannot be connected, or
 *           does not take the batch within deliver_timeout_ms, gives an
 *           ErrorNotice to the Coordinator; nothing is dropped silently.
 *       Release (offset, generation) -> that slot goes back to the arena
 *           (the Coordinator sends it for a duplicate result, DESIGN.md 8).
 *       Shutdown -> run() returns 0.
 *     Anything else, or bytes that do not decode, is counted in
 *     dh_dataserver_stats.malformed and logged as one stderr line.
 *   - A request that cannot be queued (pool queue full, bad plan) is
 *     answered at once with an ErrorNotice; it is never dropped.
 *
 *   - Payloads (local with `listen`): a ROUTER socket bound to `listen`
 *     takes the batches remote servers prepared for this rank.  The
 *     address announced in RegisterServer is `advertise`, else the endpoint
 *     actually bound (tcp port 0 resolved); a wildcard bind needs
 *     `advertise`.  Without `listen` the announced address is `addr` or
 *     "local:rank-R", and the Coordinator never places this rank's
 *     requests on a remote server (it could not deliver).  Each payload's
 *     header is checked (a ResultNotice for this rank, length within the
 *     arena, dims matching length, data frames adding up to length); a bad
 *     one is counted in `malformed`, logged and dropped.  A good one is
 *     copied into a new slot (waiting for space at most alloc_timeout_ms,
 *     without blocking the loop; past it the Coordinator gets an
 *     ErrorNotice) - the one copy on arrival (DESIGN.md 8), counted in
 *     `cross_ds_bytes` - and the Coordinator gets a ResultNotice exactly
 *     like a local completion, with server_id = THIS server's id: the
 *     client finds the arena by the notice's server_id.
 *
 *   - The client link (src/runtime/local_link.h, local mode only): after
 *     registering, the server hands its arena's memfd to the client over a
 *     Unix socket (SCM_RIGHTS): on `client_fd` at once (embedded mode: the
 *     client spawned this server), or to the first client that connects to
 *     the abstract name `client_socket` (external mode).  When that client
 *     goes away (EOF on the link, SIGKILL included) run() returns 0: a
 *     server serves one client's lifetime, since the slots a dead client
 *     held cannot be reclaimed.  A remote server's staging arena is never
 *     handed to anyone.
 *
 * Thread-safety: create / run / destroy from one thread at a time;
 * dh_dataserver_arena_fd(), dh_dataserver_endpoint(), dh_dataserver_id()
 * and dh_dataserver_stats() from any thread between create and destroy.
 */
#ifndef DATAHELIX_DATASERVER_H
#define DATAHELIX_DATASERVER_H

#include <stddef.h>
#include <stdint.h>

#include "datahelix/error.h"

struct dh_dataserver; /* opaque */

struct dh_dataserver_opts {
    const char *coordinator;   /* ZeroMQ endpoint of the Coordinator */
    const char *index_path;    /* the .dhx index the sample ids refer to */
    const char *addr;          /* address announced in RegisterServer
                                 when not listening; NULL: "local:rank-R"
                                 (remote: "remote:server-ID").  Not with
                                 `listen` */
    uint32_t server_id;        /* 1..UINT32_MAX-1; 0: rank + 1 (remote: a
                                 hash of host name and pid, >= 2^31) */
    uint32_t rank;             /* the rank served (< DH_WIRE_MAX_RANKS);
                                 ignored by a remote server */
    int remote;                /* 1: remote sidecar (DESIGN.md 2) */
    unsigned workers;          /* decode threads (default 2) */
    size_t arena_bytes;        /* data area of the arena (default 256 MiB);
                                 remote: of the private staging arena */
    int heartbeat_ms;          /* heartbeat period (default 500) */
    int register_timeout_ms;   /* bound on the registration ack (def. 5000) */
    int sample_timeout_ms;     /* per-sample decode watchdog: a sample still
                                 decoding after this is abandoned and its
                                 job fails with DH_ETIMEOUT (default
                                 60000; 0: none) */
    int alloc_timeout_ms;      /* bound on waiting for arena space per job
                                 or payload (default 30000) */
    int deliver_timeout_ms;    /* remote: bound on a delivery target taking
                                 a batch; local with listen: on the next
                                 part of a striped payload arriving
                                 (default 5000) */
    const char *listen;        /* local: ZeroMQ endpoint to bind for
                                 payloads from remote servers (NULL: none) */
    const char *advertise;     /* local with listen: the address announced
                                 instead of the bound one (required for a
                                 wildcard bind such as tcp://0.0.0.0:7600) */
    int client_fd;             /* embedded mode: a connected SOCK_SEQPACKET
                                 Unix socket to the client (one end of a
                                 socketpair); create() takes it over, in
                                 every case.  -1 (default): none */
    const char *client_socket; /* external mode: abstract Unix socket name
                                 the client attaches on (NULL: none); a
                                 connecting process must be of this
                                 server's uid (SO_PEERCRED) ... */
    int client_pid;            /* ... or, if > 0, be this pid (0: any
                                 process of this uid) */
    const char *token;         /* local: the rank's token, DH_WIRE_TOKEN_LEN
                                 lower-case hex digits, that proves this
                                 server is its client's (docs/wire-protocol.md
                                 "Authorization"); the CLI takes it from
                                 DATAHELIX_RANK_TOKEN.  NULL: drawn here and
                                 handed to the client in the hello */
    /* Python-dataset mode (datahelix.DistributedDataLoader; docs/python.md
     * "DistributedDataLoader"): requests go to python_workers Python
     * processes this server starts and owns (`python -m datahelix._worker`)
     * instead of the media pipeline.  A request's first id is a header
     * (bit 63 set, the iteration's base seed below it), the others are
     * indices of the pickled dataset; a worker writes the collated batch
     * into a slot of the arena and the ResultNotice names it as one uint8
     * tensor, dims [slot bytes].  Unpickling runs code, so the file must
     * come from this server's own client: Python mode needs client_fd,
     * and takes no `listen` (its rank reads every slot as a Python batch,
     * so none may come from the network). */
    const char *python_dataset;    /* the pickled dataset (NULL: C media) */
    const char *python;            /* interpreter (default: python3 on PATH) */
    const char *python_path;       /* put first on the workers' PYTHONPATH
                                   (where the datahelix package is) */
    unsigned python_workers;       /* worker processes (default 1, <= 64) */
    int python_job_timeout_ms;     /* watchdog: a worker still on one job
                                   after this is killed and replaced, the
                                   job fails (default 600000) */
    uint64_t python_seed;          /* base seed before the first request */
    const char *python_forkserver; /* a fork server's socket (a process of
                                   this uid): workers are forked from it,
                                   not exec'd, while it answers (docs/
                                   python.md "Start-up"); NULL: exec */
    int python_unlink;             /* 1: when the client has gone, remove
                                   python_dataset (and index_path if it is
                                   in the same folder, and that folder if
                                   then empty) */
    const char *keyfile;           /* the job key (docs/security.md): the
                                   Coordinator link, the payload endpoint
                                   and deliveries use CURVE with it.  NULL:
                                   $DATAHELIX_KEYFILE if set, else none */
    int insecure;                  /* 1: `listen` on a non-local address
                                   without a key (warned); 0: refused */
    unsigned payload_stripes;      /* connections (and ZeroMQ I/O threads) a
                                   payload link uses, 1..8 (docs/
                                   dataserver.md "Striped payloads"); 0
                                   (default): $DATAHELIX_PAYLOAD_STRIPES,
                                   else half the CPUs, 1..4 */
    int route_wait_ms;             /* local with listen: how long a payload
                                   that came before its task's Route waits
                                   for it, parked (it never holds other
                                   payloads up), before it is refused
                                   (default 1000) */
};

/* Fills the defaults above (pointers NULL, rank 0, server_id 0, local,
 * client_fd -1). */
void dh_dataserver_opts_default(struct dh_dataserver_opts *o);

struct dh_dataserver_stats {
    uint64_t malformed;       /* messages rejected and logged */
    uint64_t routes;          /* requests accepted from Routes */
    uint64_t results;         /* ResultNotices sent to the Coordinator
                            (a remote's payload headers are `forwarded`) */
    uint64_t errors;          /* ErrorNotices sent */
    uint64_t releases;        /* Releases applied to the arena */
    uint64_t heartbeats;      /* Heartbeats sent */
    uint64_t payloads;        /* local: batches from remote servers placed in
                            the arena (each also counts in results) */
    uint64_t cross_ds_bytes;  /* local: their bytes, copied on arrival */
    uint64_t forwarded;       /* remote: batches handed to ZeroMQ for
                                 their target */
    uint64_t forwarded_bytes; /* remote: their tensor bytes */
    uint64_t quarantined;     /* samples that failed here (remembered) */
    uint64_t quarantine_hits; /* requests failed at once because they
                                 named a remembered sample (with spares:
                                 samples substituted without a decode) */
    uint64_t substituted;     /* samples replaced by a spare (skip policy) */
    uint64_t refused_peers;   /* connections to `listen` refused: not the
                                 job's key (docs/security.md) */
    uint64_t parts_in;        /* local: payload parts taken into complete
                                 striped payloads (docs/dataserver.md
                                 "Striped payloads") */
    uint64_t parts_out;       /* remote: payload parts sent (a batch cut
                                 into N counts N; a whole one 0) */
};

/*
 * Opens the index, creates the arena and the worker pool, binds `listen`
 * (if set), connects to the Coordinator and registers.  On success *out
 * owns it all (dh_dataserver_destroy()); on error *out is untouched,
 * nothing is left running and `e` says why: DH_EINVAL (bad option or
 * combination: remote with listen / advertise / a client link, advertise
 * without listen, a wildcard listen without advertise), the index's or
 * arena's code, DH_EIO (socket; `listen` busy), DH_ETIMEOUT ("coordinator
 * ADDR did not answer within N ms"), DH_EIO with the Coordinator's reason
 * for a refused registration, DH_ENOMEM.
 */
int dh_dataserver_create(const struct dh_dataserver_opts *o,
                         struct dh_dataserver **out,
                         struct dh_err *e) DH_MUST_CHECK;

/* The arena's memfd (borrowed: valid until dh_dataserver_destroy()); the
 * client maps it with dh_arena_attach().  A remote server's is its
 * private staging arena. */
int dh_dataserver_arena_fd(const struct dh_dataserver *s);

/* The payload address announced to the Coordinator (local with `listen`),
 * else NULL.  Borrowed: valid until dh_dataserver_destroy(). */
const char *dh_dataserver_endpoint(const struct dh_dataserver *s);

/* The server id registered (the default resolved). */
uint32_t dh_dataserver_id(const struct dh_dataserver *s);

/*
 * Serves until *stop becomes non-zero (checked at least every 5 ms and
 * after every signal-interrupted wait; stop may be NULL) or a Shutdown
 * arrives; returns 0 then.  DH_EIO if the socket fails.  May be called
 * again after it returns.
 */
int dh_dataserver_run(struct dh_dataserver *s, const volatile int *stop,
                      struct dh_err *e) DH_MUST_CHECK;

void dh_dataserver_stats(const struct dh_dataserver *s,
                         struct dh_dataserver_stats *out);

/* Closes the sockets (linger 0: batches still queued to a target are
 * dropped and their staging slots released), stops the workers, frees
 * everything.  Accepts NULL. */
void dh_dataserver_destroy(struct dh_dataserver *s);

#endif
