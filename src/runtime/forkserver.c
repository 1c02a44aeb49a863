/*
 * forkserver.c - the DataServer's side of the fork server (forkserver.h).
 *
 * Design: one connected SOCK_SEQPACKET socket, non-blocking; a fork
 * request waits for its "P"/"E" answer (bounded), setting aside the exit
 * notices that arrive first, in a small ring that dh__fs_exit() empties
 * before it reads the socket.  A ring that overflows drops the oldest
 * notice: its worker is then found dead through its pidfd instead.
 *
 * Locking: none.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "runtime/fdpass.h"
#include "runtime/forkserver.h"
#include "runtime/peer_cred.h"

#define FS_MSG_MAX 512
#define FS_RING 128

struct exit_note {
    pid_t pid;
    int status;
};

struct dh_forkserver {
    int fd;
    struct exit_note ring[FS_RING];
    unsigned head, len;
};

int dh__fs_connect(const char *path, struct dh_forkserver **out,
                   struct dh_err *e)
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    struct dh_peer_cred c;
    struct dh_forkserver *fs = NULL;
    int fd = -1, rc;

    if (strlen(path) >= sizeof(a.sun_path))
        return dh_err_set(e, DH_EINVAL, "fork server %s: path too long", path);
    memcpy(a.sun_path, path, strlen(path) + 1);
    fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        rc = dh_err_set(e, DH_EIO, "fork server %s: socket: %s", path,
                        strerror(errno));
        goto fail;
    }
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) < 0) {
        rc = dh_err_set(e, errno == ENOENT ? DH_ENOTFOUND : DH_EIO,
                        "fork server %s: connect: %s", path, strerror(errno));
        goto fail;
    }
    if ((rc = dh__peer_cred(fd, &c, e)) < 0 ||
        (rc = dh__peer_check(&c, getuid(), 0, "fork server", e)) < 0)
        goto fail;
    if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) < 0) {
        rc = dh_err_set(e, DH_EIO, "fork server %s: fcntl: %s", path,
                        strerror(errno));
        goto fail;
    }
    if (!(fs = dh__calloc(1, sizeof(*fs)))) {
        rc = dh_err_set(e, DH_ENOMEM, "out of memory");
        goto fail;
    }
    fs->fd = fd;
    unlink(path); /* it takes one connection: the name is not needed */
    *out = fs;
    return 0;
fail:
    if (fd >= 0)
        close(fd);
    return rc;
}

int dh__fs_fd(const struct dh_forkserver *fs)
{
    return fs->fd;
}

static void keep_exit(struct dh_forkserver *fs, pid_t pid, int status)
{
    if (fs->len == FS_RING) { /* drop the oldest (see Design) */
        fs->head = (fs->head + 1) % FS_RING;
        fs->len--;
    }
    fs->ring[(fs->head + fs->len) % FS_RING] = (struct exit_note){
        .pid = pid, .status = status};
    fs->len++;
}

/* One message: 'X' kept in the ring, 'P' / 'E' returned as they are.
 * timeout_ms 0: DH_ETIMEOUT if none is there. */
static int read_msg(struct dh_forkserver *fs, char *buf, int *fd,
                    int timeout_ms, struct dh_err *e)
{
    size_t len;
    int rc;
    long pid, status;

    for (;;) {
        rc = dh__fd_recv(fs->fd, fd, buf, FS_MSG_MAX - 1, &len, timeout_ms, e);
        if (rc < 0)
            return rc;
        buf[len] = 0;
        if (buf[0] != 'X')
            return 0;
        if (*fd >= 0)
            close(*fd);
        if (sscanf(buf, "X %ld %ld", &pid, &status) != 2 || pid <= 0)
            return dh_err_set(e, DH_EPROTO,
                              "fork server: malformed exit notice '%.60s'",
                              buf);
        keep_exit(fs, (pid_t)pid, (int)status);
        if (timeout_ms == 0)
            return dh_err_set(e, DH_ETIMEOUT, "fork server: no answer");
    }
}

int dh__fs_fork(struct dh_forkserver *fs, const char *args, const int *fds,
                pid_t *pid, int *pidfd, int timeout_ms, struct dh_err *e)
{
    char buf[FS_MSG_MAX];
    uint64_t end = dh__mono_ms() + (uint64_t)timeout_ms;
    int n, fd = -1, rc;
    long p;

    n = snprintf(buf, sizeof(buf), "F %s", args);
    if (n < 0 || (size_t)n >= sizeof(buf))
        return dh_err_set(e, DH_EINVAL, "fork server: request too long");
    if ((rc = dh__fds_send(fs->fd, fds, DH_FS_FDS, buf, (size_t)n, e)) < 0)
        return rc;
    for (;;) {
        uint64_t now = dh__mono_ms();

        if (now >= end)
            return dh_err_set(e, DH_ETIMEOUT,
                              "fork server: no answer within %d ms",
                              timeout_ms);
        rc = read_msg(fs, buf, &fd, (int)(end - now), e);
        if (rc == DH_ETIMEOUT)
            continue;
        if (rc < 0)
            return rc;
        if (buf[0] == 'P' && fd >= 0 && sscanf(buf, "P %ld", &p) == 1 &&
            p > 0) {
            *pid = (pid_t)p;
            *pidfd = fd;
            return 0;
        }
        if (fd >= 0)
            close(fd);
        if (buf[0] == 'E')
            return dh_err_set(e, DH_EIO, "fork server: %.300s", buf + 1);
        return dh_err_set(e, DH_EPROTO,
                          "fork server: unexpected answer "
                          "'%.60s'",
                          buf);
    }
}

int dh__fs_exit(struct dh_forkserver *fs, int from_socket, pid_t *pid,
                int *status, struct dh_err *e)
{
    char buf[FS_MSG_MAX];
    int fd = -1, rc;

    if (!fs->len && !from_socket)
        return 0;
    if (!fs->len) {
        rc = read_msg(fs, buf, &fd, 0, e);
        if (rc == DH_ETIMEOUT && !fs->len)
            return 0;
        if (rc < 0 && rc != DH_ETIMEOUT)
            return rc;
        if (rc == 0) { /* an answer nobody asked for */
            if (fd >= 0)
                close(fd);
            return dh_err_set(e, DH_EPROTO,
                              "fork server: unexpected "
                              "message '%.60s'",
                              buf);
        }
    }
    *pid = fs->ring[fs->head].pid;
    *status = fs->ring[fs->head].status;
    fs->head = (fs->head + 1) % FS_RING;
    fs->len--;
    return 1;
}

void dh__fs_close(struct dh_forkserver *fs)
{
    if (!fs)
        return;
    close(fs->fd);
    dh__free(fs);
}

void dh__proc_signal(int pidfd, pid_t pid, int sig)
{
    if (pidfd >= 0)
        syscall(SYS_pidfd_send_signal, pidfd, sig, NULL, 0);
    else if (pid > 0)
        kill(pid, sig);
}

int dh__pidfd_exited(int pidfd)
{
    struct pollfd p = {.fd = pidfd, .events = POLLIN};

    return poll(&p, 1, 0) > 0 && (p.revents & (POLLIN | POLLHUP));
}
