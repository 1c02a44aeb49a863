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

#include "runtime/dataserver_internal.h"
#include "runtime/fdpass.h"
#include "runtime/local_link.h"

int dh__ds_send_hello(struct dh_dataserver *s, int fd, struct dh_err *e)
{
    unsigned char buf[DH_LINK_HELLO_BYTES];
    struct dh_link_hello h = {.server_id = s->server_id, .rank = s->rank,
                              .capacity = s->arena_cap};

    dh__link_hello_pack(buf, &h);
    return dh__fd_send(fd, dh_arena_fd(s->arena), buf, sizeof(buf), e);
}

/* A client connects (external mode): the first one gets the arena; while
 * it is connected, another is turned away (it sees EOF, no hello). */
void dh__ds_on_accept(struct dh_dataserver *s)
{
    struct dh_err e;
    int fd = accept4(s->listen_fd, NULL, NULL, SOCK_CLOEXEC);

    if (fd < 0)
        return;
    if (s->link_fd >= 0) {
        fprintf(stderr, "datahelix: dataserver %u: a second client tried to "
                "attach while rank %u's is connected; refused\n",
                s->server_id, s->rank);
        close(fd);
        return;
    }
    if (dh__ds_send_hello(s, fd, &e) < 0) {
        fprintf(stderr, "datahelix: dataserver %u: handing the arena to the "
                "client: %s\n", s->server_id, e.msg);
        close(fd);
        return;
    }
    s->link_fd = fd;
}

/* The client never sends on the link: readable means it went away (EOF
 * or an error). */
void dh__ds_on_link(struct dh_dataserver *s)
{
    char b[64];
    ssize_t n = recv(s->link_fd, b, sizeof(b), MSG_DONTWAIT);

    if (n > 0 || (n < 0 && (errno == EAGAIN || errno == EINTR)))
        return;
    fprintf(stderr, "datahelix: dataserver %u: the client of rank %u went "
            "away; stopping\n", s->server_id, s->rank);
    close(s->link_fd);
    s->link_fd = -1;
    s->shutdown = 1;
}
