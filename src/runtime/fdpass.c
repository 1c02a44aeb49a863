/*
 * fdpass.c - SCM_RIGHTS descriptor passing (fdpass.h).
 *
 * Design: the socket is driven with MSG_DONTWAIT and poll(), so that
 * every wait has a deadline whether or not the caller made the socket
 * non-blocking.  The receive control buffer has room for DH_FD_RECV_ROOM
 * descriptors so that a peer sending several is seen (and all of them
 * closed) rather than silently truncated; descriptors beyond that room
 * are dropped by the kernel itself (MSG_CTRUNC), which is also refused.
 *
 * Locking: none.
 */
#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "runtime/fdpass.h"

#define DH_FD_RECV_ROOM 16

static int64_t now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* poll() for `events` until the absolute deadline (ms, monotonic). */
static int wait_sock(int sock, short events, int64_t deadline, struct dh_err *e)
{
    struct pollfd p = {.fd = sock, .events = events};

    for (;;) {
        int64_t left = deadline - now_ms();
        int n;

        if (left < 0)
            left = 0;
        n = poll(&p, 1, (int)(left > INT32_MAX ? INT32_MAX : left));
        if (n > 0 && (p.revents & POLLNVAL))
            return dh_err_set(e, DH_EINVAL, "socket %d: not open", sock);
        if (n > 0)
            return 0;
        if (n == 0 && left == 0)
            return dh_err_set(e, DH_ETIMEOUT,
                              "socket %d: nothing %s within "
                              "the timeout",
                              sock, events == POLLIN ? "received" : "sent");
        if (n < 0 && errno != EINTR)
            return dh_err_set(e, DH_EIO, "socket %d: poll: %s", sock,
                              strerror(errno));
    }
}

static void attach_fds(struct msghdr *mh, char *buf, size_t room,
                       const int *fds, int nfds)
{
    struct cmsghdr *c;

    memset(buf, 0, room);
    mh->msg_control = buf;
    mh->msg_controllen = CMSG_SPACE((size_t)nfds * sizeof(int));
    c = CMSG_FIRSTHDR(mh);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN((size_t)nfds * sizeof(int));
    memcpy(CMSG_DATA(c), fds, (size_t)nfds * sizeof(int));
}

int dh__fd_send(int sock, int fd, const void *msg, size_t len, struct dh_err *e)
{
    return dh__fds_send(sock, &fd, fd >= 0, msg, len, e);
}

int dh__fds_send(int sock, const int *fds, int nfds, const void *msg,
                 size_t len, struct dh_err *e)
{
    union {
        struct cmsghdr align;
        char buf[CMSG_SPACE(DH_FD_SEND_MAX * sizeof(int))];
    } ctl;
    struct msghdr mh = {0};
    struct iovec iov = {.iov_base = (void *)msg, .iov_len = len};
    int64_t deadline = now_ms() + DH_FD_SEND_TIMEOUT_MS;
    int rc;

    if (sock < 0 || !msg || len == 0 || len > DH_FD_MSG_MAX || nfds < 0 ||
        nfds > DH_FD_SEND_MAX || (nfds && !fds))
        return dh_err_set(e, DH_EINVAL,
                          "fd send: bad socket, message "
                          "length %zu or %d descriptors",
                          len, nfds);
    for (int i = 0; i < nfds; i++)
        if (fds[i] < 0)
            return dh_err_set(e, DH_EINVAL,
                              "fd send: descriptor %d of %d "
                              "is not open",
                              i, nfds);
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    if (nfds)
        attach_fds(&mh, ctl.buf, sizeof(ctl.buf), fds, nfds);
    while (iov.iov_len > 0) {
        ssize_t n = sendmsg(sock, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);

        if (n >= 0) {
            /* stream sockets may take a prefix; the fd went with it */
            iov.iov_base = (char *)iov.iov_base + n;
            iov.iov_len -= (size_t)n;
            mh.msg_control = NULL;
            mh.msg_controllen = 0;
            continue;
        }
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            rc = wait_sock(sock, POLLOUT, deadline, e);
            if (rc)
                return rc;
            continue;
        }
        if (errno == EPIPE || errno == ECONNRESET || errno == ENOTCONN)
            return dh_err_set(e, DH_EPEERDEAD,
                              "socket %d: peer closed the "
                              "connection",
                              sock);
        return dh_err_set(e, DH_EIO, "socket %d: sendmsg: %s", sock,
                          strerror(errno));
    }
    return 0;
}

/* Collects every SCM_RIGHTS descriptor of `mh` into fds; returns count. */
static int take_fds(struct msghdr *mh, int *fds, int room)
{
    struct cmsghdr *c;
    int n = 0;

    for (c = CMSG_FIRSTHDR(mh); c; c = CMSG_NXTHDR(mh, c)) {
        size_t k, i;

        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
            continue;
        k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (i = 0; i < k; i++) {
            int fd;

            memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(fd));
            if (n < room)
                fds[n++] = fd;
            else
                close(fd);
        }
    }
    return n;
}

static void close_all(const int *fds, int n)
{
    for (int i = 0; i < n; i++)
        close(fds[i]);
}

/* One recvmsg once the socket is readable; n < 0 with errno on error. */
static ssize_t recv_one(int sock, struct msghdr *mh, int64_t deadline,
                        struct dh_err *e, int *rc)
{
    for (;;) {
        ssize_t n;

        *rc = wait_sock(sock, POLLIN, deadline, e);
        if (*rc)
            return -1;
        n = recvmsg(sock, mh, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
        if (n >= 0 ||
            (errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK))
            return n;
    }
}

/* Refuses a received message: closes its descriptors, records why. */
static int refuse(int sock, ssize_t n, int flags, const int *fds, int nfds,
                  size_t cap, struct dh_err *e)
{
    close_all(fds, nfds);
    if (flags & MSG_CTRUNC)
        return dh_err_set(e, DH_EPROTO,
                          "socket %d: peer sent more "
                          "descriptors than fit; all closed",
                          sock);
    if (nfds > 1)
        return dh_err_set(e, DH_EPROTO,
                          "socket %d: peer sent %d "
                          "descriptors with one message, expected at most "
                          "one; all closed",
                          sock, nfds);
    if (n == 0)
        return dh_err_set(e, DH_EPEERDEAD,
                          "socket %d: peer closed the "
                          "connection",
                          sock);
    return dh_err_set(e, DH_ETOOBIG,
                      "socket %d: message longer than %zu "
                      "bytes",
                      sock, cap);
}

int dh__fd_recv(int sock, int *fd, void *msg, size_t cap, size_t *len,
                int timeout_ms, struct dh_err *e)
{
    union {
        struct cmsghdr align;
        char buf[CMSG_SPACE(DH_FD_RECV_ROOM * sizeof(int))];
    } ctl;
    struct iovec iov = {.iov_base = msg, .iov_len = cap};
    struct msghdr mh = {0};
    int fds[DH_FD_RECV_ROOM], nfds, rc = 0;
    ssize_t n;

    if (sock < 0 || !fd || !msg || cap == 0 || !len || timeout_ms < 0)
        return dh_err_set(e, DH_EINVAL, "fd recv: bad arguments");
    memset(&ctl, 0, sizeof(ctl));
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    mh.msg_control = ctl.buf;
    mh.msg_controllen = sizeof(ctl.buf);
    n = recv_one(sock, &mh, now_ms() + timeout_ms, e, &rc);
    if (rc)
        return rc;
    if (n < 0)
        return dh_err_set(e, errno == ECONNRESET ? DH_EPEERDEAD : DH_EIO,
                          "socket %d: recvmsg: %s", sock, strerror(errno));
    nfds = take_fds(&mh, fds, DH_FD_RECV_ROOM);
    if ((mh.msg_flags & (MSG_CTRUNC | MSG_TRUNC)) || nfds > 1 || n == 0)
        return refuse(sock, n, mh.msg_flags, fds, nfds, cap, e);
    *fd = nfds ? fds[0] : -1;
    *len = (size_t)n;
    return 0;
}
