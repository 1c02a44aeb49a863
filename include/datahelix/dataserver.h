/*
 * datahelix/dataserver.h - a local DataServer (DESIGN.md 2 "Local path",
 * issue 4 item 3, local mode): the process beside training rank R that
 * decodes the batches routed to it into its shared-memory arena and tells
 * the Coordinator where they are.
 *
 * Design notes:
 *   - One DEALER socket to the Coordinator (docs/wire-protocol.md).  create()
 *     sends RegisterServer (role local) and waits, bounded by
 *     register_timeout_ms, for the echo that acknowledges it; a refusal
 *     (a Shutdown) or silence is an error, never a hang.
 *   - run() is one loop: zmq_poll() for at most 5 ms, then collect worker
 *     completions, then a Heartbeat whenever heartbeat_ms has passed
 *     (queue depth, busy workers, EWMA of decode latency).
 *       Route with an embedded DescriptorRequest -> a job for the worker
 *           pool (workers.h), plan from dh_wire_plan_to_media().
 *       completion -> ResultNotice (task, slot offset/length/generation,
 *           dims [B,T,H,W,3] for THWC or [B,T,3,H,W] for TCHW, dtype,
 *           layout, sample ids and valid frames) whose slot reference
 *           passes to the client with the notice; or ErrorNotice (task,
 *           failed sample id, its path, cause code, message).
 *       Release (offset, generation) -> that slot goes back to the arena
 *           (the Coordinator sends it for a duplicate result, DESIGN.md 8).
 *       Shutdown -> run() returns 0.
 *     Anything else, or bytes that do not decode, is counted in
 *     dh_dataserver_stats.malformed and logged as one stderr line.
 *   - A request that cannot be queued (pool queue full, bad plan) is
 *     answered at once with an ErrorNotice; it is never dropped.
 *
 * Thread-safety: create / run / destroy from one thread at a time;
 * dh_dataserver_arena_fd() and dh_dataserver_stats() from any thread
 * between create and destroy.
 */
#ifndef DATAHELIX_DATASERVER_H
#define DATAHELIX_DATASERVER_H

#include <stddef.h>
#include <stdint.h>

#include "datahelix/error.h"

struct dh_dataserver; /* opaque */

struct dh_dataserver_opts {
    const char *coordinator;  /* ZeroMQ endpoint of the Coordinator */
    const char *index_path;   /* the .dhx index the sample ids refer to */
    const char *addr;         /* address announced in RegisterServer;
                                 NULL: "local:rank-R" */
    uint32_t server_id;       /* >= 1; 0: rank + 1 */
    uint32_t rank;            /* the rank served (< DH_WIRE_MAX_RANKS) */
    unsigned workers;         /* decode threads (default 2) */
    size_t arena_bytes;       /* data area of the arena (default 256 MiB) */
    int heartbeat_ms;         /* heartbeat period (default 500) */
    int register_timeout_ms;  /* bound on the registration ack (def. 5000) */
    int alloc_timeout_ms;     /* bound on waiting for arena space per job
                                 (default 30000) */
};

/* Fills the defaults above (pointers NULL, rank 0, server_id 0). */
void dh_dataserver_opts_default(struct dh_dataserver_opts *o);

struct dh_dataserver_stats {
    uint64_t malformed;  /* messages rejected and logged */
    uint64_t routes;     /* requests accepted from Routes */
    uint64_t results;    /* ResultNotices sent */
    uint64_t errors;     /* ErrorNotices sent */
    uint64_t releases;   /* Releases applied to the arena */
    uint64_t heartbeats; /* Heartbeats sent */
};

/*
 * Opens the index, creates the arena and the worker pool, connects to the
 * Coordinator and registers.  On success *out owns it all
 * (dh_dataserver_destroy()); on error *out is untouched, nothing is left
 * running and `e` says why: DH_EINVAL (bad option), the index's or
 * arena's code, DH_EIO (socket), DH_ETIMEOUT ("coordinator ADDR did not
 * answer within N ms"), DH_EIO with the Coordinator's reason for a
 * refused registration, DH_ENOMEM.
 */
int dh_dataserver_create(const struct dh_dataserver_opts *o,
                         struct dh_dataserver **out,
                         struct dh_err *e) DH_MUST_CHECK;

/* The arena's memfd (borrowed: valid until dh_dataserver_destroy()); the
 * client maps it with dh_arena_attach(). */
int dh_dataserver_arena_fd(const struct dh_dataserver *s);

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

/* Stops the workers, closes the socket (linger 0), frees everything.
 * Accepts NULL. */
void dh_dataserver_destroy(struct dh_dataserver *s);

#endif
