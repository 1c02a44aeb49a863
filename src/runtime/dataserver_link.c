/*
 * dataserver_link.c - how a local DataServer hands its arena to the
 * client of its rank (src/runtime/local_link.h): the hello with the
 * arena's memfd, the accept of external mode, and noticing that the
 * client went away (then the server stops: it serves one client's
 * lifetime, since the slots a dead client held cannot be reclaimed).
 * A remote server has no client link.
 *
 * Locking: none (dataserver_internal.h).
 */
#include <errno.h>
#include <stdio.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string.h>

#include "core/log.h"
#include "runtime/dataserver_internal.h"
#include "runtime/fdpass.h"
#include "runtime/local_link.h"
#include "runtime/peer_cred.h"

int dh__ds_link_hello(const struct ds_env *env, int fd, struct dh_err *e)
{
    unsigned char buf[DH_LINK_HELLO_BYTES];
    struct dh_link_hello h = {.server_id = env->server_id,
                              .rank = env->rank,
                              .capacity = env->arena_cap};

    memcpy(h.token, env->token, sizeof(h.token));
    dh__link_hello_pack(buf, &h);
    return dh__fd_send(fd, dh_arena_fd(env->arena), buf, sizeof(buf), e);
}

/* A client connects (external mode): the first one the credential rule
 * admits gets the arena (peer_cred.h: anyone may connect to an abstract
 * name); while it is connected, another is turned away (it sees EOF, no
 * hello). */
void dh__ds_link_accept(struct ds_link *l, const struct ds_env *env)
{
    struct dh_err e;
    struct dh_peer_cred pc;
    int fd = accept4(l->listen_fd, NULL, NULL, SOCK_CLOEXEC);

    if (fd < 0)
        return;
    if (dh__peer_cred(fd, &pc, &e) < 0 ||
        dh__peer_check(&pc, getuid(), l->want_pid, "a client", &e) < 0) {
        dh__log(DH_LOG_ERROR,
                "dataserver %u: rank %u's link: %s; its arena is "
                "not handed over",
                env->server_id, env->rank, e.msg);
        close(fd);
        return;
    }
    if (l->fd >= 0) {
        dh__log(DH_LOG_WARN,
                "dataserver %u: a second client tried to "
                "attach while rank %u's is connected; refused",
                env->server_id, env->rank);
        close(fd);
        return;
    }
    if (dh__ds_link_hello(env, fd, &e) < 0) {
        dh__log(DH_LOG_ERROR,
                "dataserver %u: handing the arena to the "
                "client: %s",
                env->server_id, e.msg);
        close(fd);
        return;
    }
    l->fd = fd;
}

/* The client never sends on the link: readable means it went away (EOF
 * or an error). */
int dh__ds_link_gone(struct ds_link *l, const struct ds_env *env)
{
    char b[64];
    ssize_t n = recv(l->fd, b, sizeof(b), MSG_DONTWAIT);

    if (n > 0 || (n < 0 && (errno == EAGAIN || errno == EINTR)))
        return 0;
    dh__log(DH_LOG_INFO,
            "dataserver %u: the client of rank %u went "
            "away; stopping",
            env->server_id, env->rank);
    close(l->fd);
    l->fd = -1;
    return 1;
}
