/*
 * peer_cred.c - the local link's peer-credential rule (peer_cred.h).
 *
 * Locking: none.
 */
#include <errno.h>
#include <string.h>
#include <sys/socket.h>

#include "runtime/peer_cred.h"

int dh__peer_cred(int fd, struct dh_peer_cred *out, struct dh_err *e)
{
    struct ucred uc;
    socklen_t len = sizeof(uc);

    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &uc, &len) < 0 ||
        len != sizeof(uc))
        return dh_err_set(e, DH_EIO,
                          "local link: cannot learn who the peer is "
                          "(SO_PEERCRED): %s",
                          strerror(errno));
    *out = (struct dh_peer_cred){.pid = uc.pid, .uid = uc.uid, .gid = uc.gid};
    return 0;
}

int dh__peer_check(const struct dh_peer_cred *peer, uid_t self_uid,
                   pid_t want_pid, const char *who, struct dh_err *e)
{
    if (want_pid > 0 && peer->pid != want_pid)
        return dh_err_set(e, DH_EINVAL,
                          "%s pid %ld (uid %lu) refused: this link serves "
                          "pid %ld only",
                          who, (long)peer->pid, (unsigned long)peer->uid,
                          (long)want_pid);
    /* A pid named by the one who started us is trusted whatever its uid
     * (a launcher of another account); else only our own uid. */
    if (want_pid <= 0 && peer->uid != self_uid)
        return dh_err_set(e, DH_EINVAL,
                          "%s pid %ld of uid %lu refused: only processes "
                          "of uid %lu may use this link",
                          who, (long)peer->pid, (unsigned long)peer->uid,
                          (unsigned long)self_uid);
    return 0;
}
