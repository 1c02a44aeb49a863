/*
 * peer_cred.h - who may use the local link's abstract Unix socket
 * (internal; docs/security.md "Local links and IPC endpoints").
 *
 * An abstract-namespace name is open to every process of the machine (no
 * file mode guards it), and the DataServer hands the first client that
 * connects its arena memfd, read-write.  So each side asks the kernel who
 * the other is (SO_PEERCRED, the credentials at connect / listen time) and
 * admits only:
 *   - the pid it was told to serve (`--client-pid`), when told one; else
 *   - a process of its own uid.
 * The rule is pure logic (dh__peer_check), unit tested with fabricated
 * credentials; dh__peer_cred() is the one kernel call.
 *
 * Thread-safety: no state.
 */
#ifndef DH_RUNTIME_PEER_CRED_H
#define DH_RUNTIME_PEER_CRED_H

#include <sys/types.h>

#include "datahelix/error.h"

struct dh_peer_cred {
    pid_t pid;
    uid_t uid;
    gid_t gid;
};

/* The credentials of the peer of the connected Unix socket `fd`.  DH_EIO
 * (naming the cause) if the kernel cannot say. */
int dh__peer_cred(int fd, struct dh_peer_cred *out,
                  struct dh_err *e) DH_MUST_CHECK;

/* 0 if `peer` may use the link of a process of uid `self_uid`: peer->pid
 * == want_pid when want_pid > 0, else peer->uid == self_uid.  Otherwise
 * DH_EINVAL with a message that names `who` (the peer's role: "client",
 * "dataserver @name"), its pid and uid, and the rule it failed. */
int dh__peer_check(const struct dh_peer_cred *peer, uid_t self_uid,
                   pid_t want_pid, const char *who,
                   struct dh_err *e) DH_MUST_CHECK;

#endif
