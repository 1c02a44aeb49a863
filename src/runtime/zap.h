/*
 * zap.h - the ZAP handler of one ZeroMQ context (ZeroMQ RFC 27): admits a
 * CURVE peer only if it authenticated with the job's key or an admin key
 * (keys.h), and counts and logs every refused peer with its address,
 * rate-limited so a flood cannot fill the log (docs/security.md).
 *
 * One handler per context that has CURVE server sockets; the transport
 * starts it on the first such socket (transport.c, dh__tp_auth) and the
 * socket's owner stops it after closing its sockets, before
 * zmq_ctx_term().  Internal.
 *
 * Threading: one thread of its own, polling the ZAP socket and the
 * monitors of the watched sockets (100 ms ticks, so stop() returns within
 * ~100 ms).  dh__zap_watch(), dh__zap_closed() and the counters may be
 * called from any thread.
 */
#ifndef DH_RUNTIME_ZAP_H
#define DH_RUNTIME_ZAP_H

#include <stddef.h>
#include <stdint.h>

#include "datahelix/error.h"
#include "runtime/keys.h"

/* The User-Id the handler gives each admitted peer; a received message
 * carries it as its "User-Id" property (transport.h dh_tp_from.user). */
#define DH_ZAP_USER_JOB "job"
#define DH_ZAP_USER_ADMIN "admin"

struct dh_zap;

/* Binds inproc://zeromq.zap.01 in `ctx` and starts the thread.  `who`
 * ("coordinator") prefixes its log lines.  DH_EIO (a handler is already
 * bound there, or no thread), DH_ENOMEM. */
int dh__zap_start(void *ctx, const struct dh_keys *k, const char *who,
                  struct dh_zap **out, struct dh_err *e) DH_MUST_CHECK;
/* Also counts and logs the peers of bound socket `sock` that fail the
 * handshake before ZAP sees them (no key at all: a mechanism mismatch).
 * Call before `sock` binds.  0, DH_EIO, DH_ENOMEM. */
int dh__zap_watch(struct dh_zap *z, void *sock, struct dh_err *e) DH_MUST_CHECK;
/* Stops the thread and closes its sockets.  NULL ok. */
void dh__zap_stop(struct dh_zap *z);

/* A connection of a watched socket that closed: its fd then, and its
 * name (dh__zap_conn_name() when it was accepted).  An fd is reused by
 * the next connection, so the name tells them apart: a TCP peer's
 * address and port, a Unix peer's pid. */
struct dh_zap_conn {
    int fd;
    uint64_t ino; /* its socket's inode: unique while it is open */
    char name[64];
};
/* Takes up to `cap` closed connections, oldest first (the handler keeps
 * the last DH_ZAP_MAX_CLOSED not yet taken); returns how many. */
#define DH_ZAP_MAX_CLOSED 256
int dh__zap_closed(struct dh_zap *z, struct dh_zap_conn *out, int cap);
/* The name of connected socket `fd`: "ADDR:PORT" for TCP, "a local socket
 * (pid N)" for Unix (SO_PEERCRED: the kernel's word), "?" if it has none
 * (closed).  Used for log lines as well. */
void dh__zap_conn_name(int fd, char *out, size_t cap);
/* The inode of socket `fd` (0 if it has none: closed); with the fd it
 * names one connection: a later one on the same fd has another. */
uint64_t dh__zap_conn_ino(int fd);
/* 1 if the peer of `fd` is on this host (a Unix socket, or a loopback
 * address): its process's end closes the connection at once. */
int dh__zap_conn_local(int fd);

uint64_t dh__zap_refused(const struct dh_zap *z);  /* peers refused */
uint64_t dh__zap_admitted(const struct dh_zap *z); /* ZAP requests passed */

/* ---- the log's rate limit (pure, unit tested) ----
 * At most DH_ZAP_LOG_BURST lines per DH_ZAP_LOG_WINDOW_MS; the first line
 * of a later window says how many were left out before it. */
#define DH_ZAP_LOG_BURST 5
#define DH_ZAP_LOG_WINDOW_MS 10000
struct dh_zap_rl {
    uint64_t window_ms; /* start of the current window */
    unsigned lines;     /* logged in it */
    uint64_t skipped;   /* not logged since the last line */
};
/* 1: log this one (*skipped: how many were left out before it, then
 * reset); 0: leave it out (counted). */
int dh__zap_rl_allow(struct dh_zap_rl *rl, uint64_t now_ms, uint64_t *skipped);

#endif
