/*
 * fdpass.h - handing file descriptors (the arena's memfd; a fork server
 * request's sockets) and a small message to another process over a Unix
 * socket with SCM_RIGHTS (internal: used by the DataServer, the client
 * and tests; docs/arena.md).
 *
 * Use a SOCK_SEQPACKET (or SOCK_DGRAM) socket so that a message arrives
 * whole or not at all; on SOCK_STREAM the bytes of one dh__fd_recv() are
 * whatever has arrived and the caller frames them.  Descriptors arrive
 * with FD_CLOEXEC set (MSG_CMSG_CLOEXEC).  EINTR is retried; every wait
 * is bounded.
 *
 * Thread-safety: as safe as sendmsg/recvmsg on the socket; one sender and
 * one receiver per socket at a time.
 */
#ifndef DH_RUNTIME_FDPASS_H
#define DH_RUNTIME_FDPASS_H

#include <stddef.h>

#include "datahelix/error.h"

#define DH_FD_MSG_MAX 65536        /* bytes of message per send */
#define DH_FD_SEND_TIMEOUT_MS 5000 /* bound on a full socket buffer */
#define DH_FD_SEND_MAX 4           /* descriptors per dh__fds_send() */

/*
 * Sends `len` (1..DH_FD_MSG_MAX) bytes of `msg` with `fd` attached, or
 * with no descriptor if fd < 0.  The caller keeps `fd` (the kernel passes
 * a duplicate).  Waits at most DH_FD_SEND_TIMEOUT_MS for buffer space
 * (DH_ETIMEOUT).  DH_EPEERDEAD if the peer closed its end (no SIGPIPE),
 * DH_EINVAL for bad arguments, DH_EIO otherwise.
 */
int dh__fd_send(int sock, int fd, const void *msg, size_t len,
                struct dh_err *e) DH_MUST_CHECK;

/*
 * As dh__fd_send(), with the `nfds` (0..DH_FD_SEND_MAX, each open)
 * descriptors of `fds` attached in that order (the fork server's
 * request: docs/python.md "Start-up").
 */
int dh__fds_send(int sock, const int *fds, int nfds, const void *msg,
                 size_t len, struct dh_err *e) DH_MUST_CHECK;

/*
 * Receives one message of at most `cap` bytes into `msg` and the
 * descriptor that came with it: *fd = the new descriptor (owned by the
 * caller) or -1 if none came, *len = bytes received.  Waits at most
 * timeout_ms (>= 0; DH_ETIMEOUT).  A message carrying more than one
 * descriptor is refused (DH_EFORMAT) and every descriptor that came with
 * it is closed; a message longer than `cap` (datagram sockets) is refused
 * with DH_ETOOBIG, its descriptor closed.  DH_EPEERDEAD when the peer
 * closed the socket.  Out-params are written only on success.
 */
int dh__fd_recv(int sock, int *fd, void *msg, size_t cap, size_t *len,
                int timeout_ms, struct dh_err *e) DH_MUST_CHECK;

#endif
