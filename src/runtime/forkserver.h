/*
 * forkserver.h - a DataServer's side of a DistributedDataLoader's fork
 * server (internal; docs/python.md "Start-up", python/datahelix/
 * _forkserver.py for the other side).
 *
 * The fork server is a copy of the training process (forked before the
 * DataServer starts, so it holds torch, the dataset and the collate_fn
 * already) that forks the DataServer's Python workers on request: a worker
 * starts in milliseconds instead of a fresh interpreter's seconds.  It
 * listens on a Unix socket in the client's private folder and takes one
 * connection, this server's.  Messages (SOCK_SEQPACKET, text):
 *     S->F "F <args>" + 4 descriptors   fork a worker: its socket, the
 *                                       arena memfd, stdout, stderr
 *     F->S "P <pid>" + its pidfd        forked
 *          "E <text>"                   could not fork
 *          "X <pid> <wait status>"      a worker it forked has exited
 * The server is not the workers' parent: it signals them through their
 * pidfd (no pid reuse) and learns their exit status from "X".
 *
 * Thread-safety: one thread per handle.
 */
#ifndef DH_RUNTIME_FORKSERVER_H
#define DH_RUNTIME_FORKSERVER_H

#include <sys/types.h>

#include "datahelix/error.h"

#define DH_FS_FDS 4 /* descriptors of a fork request */

struct dh_forkserver;

/* Connects to the fork server at `path`, which must be a process of this
 * uid (SO_PEERCRED), and removes the name.  DH_EIO / DH_ENOTFOUND naming the path and cause. */
int dh__fs_connect(const char *path, struct dh_forkserver **out,
                   struct dh_err *e) DH_MUST_CHECK;

/* The socket, for the serving loop's poll (readable: an exit notice). */
int dh__fs_fd(const struct dh_forkserver *fs);

/* Asks for a worker started with `args` (one line, no newline) and the
 * DH_FS_FDS descriptors `fds` (the caller keeps them); waits at most
 * timeout_ms for the answer: *pid and *pidfd (owned by the caller) on
 * success.  Exit notices read meanwhile are kept for dh__fs_exit().
 * DH_EIO with the fork server's words if it could not fork; any error
 * means the fork server is no longer to be used. */
int dh__fs_fork(struct dh_forkserver *fs, const char *args, const int *fds,
                pid_t *pid, int *pidfd, int timeout_ms,
                struct dh_err *e) DH_MUST_CHECK;

/* The next exit notice, without waiting: 1 with *pid, *status; 0 if none
 * has come; < 0 if the fork server is gone or broke the protocol.
 * from_socket 0: only those dh__fs_fork() set aside (all sent before its
 * answer, so none is about the worker it started). */
int dh__fs_exit(struct dh_forkserver *fs, int from_socket, pid_t *pid,
                int *status, struct dh_err *e) DH_MUST_CHECK;

/* Closes the connection (the fork server then kills the workers it
 * forked and exits).  NULL is a no-op. */
void dh__fs_close(struct dh_forkserver *fs);

/* Sends `sig` to the process of `pidfd` (or, if pidfd < 0, to `pid`). */
void dh__proc_signal(int pidfd, pid_t pid, int sig);

/* 1 if the process of `pidfd` has exited (its pidfd reads ready). */
int dh__pidfd_exited(int pidfd);

#endif
