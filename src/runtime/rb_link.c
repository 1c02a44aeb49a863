/*
 * rb_link.c - Tier 2's all_to_all over ZeroMQ PUSH/PULL (see
 * datahelix/rb_link.h).  Design notes: PUSH/PULL and not a ROUTER mesh
 * because every pair sends exactly one message a round and nobody
 * answers; one PUSH per peer so that a send goes to that peer (a single
 * PUSH connected to all would round-robin).  The round number in every
 * header is what keeps a fast peer's next round apart from this one.
 * Single-threaded per link; every wait is bounded by the call's timeout.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <zmq.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/le.h"
#include "datahelix/rb_link.h"

#define HDR 20
#define MAX_RANKS 1024

struct ahead { /* a peer's message of the next round */
    unsigned char *buf;
    uint64_t len;
    int has;
};

struct dh_rb_link {
    void *pull, **push;
    uint32_t n, me;
    struct ahead *next;
    char addr[256];
};

/* ipc://, inproc://, or tcp:// on 127.0.0.1 / localhost / [::1]. */
static int local_address(const char *a)
{
    static const char *const ok[] = {"ipc://", "inproc://", "tcp://127.0.0.1:",
                                     "tcp://localhost:", "tcp://[::1]:"};

    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++)
        if (!strncmp(a, ok[i], strlen(ok[i])))
            return 1;
    return 0;
}

static int set_int(void *s, int opt, int v)
{
    return zmq_setsockopt(s, opt, &v, sizeof(v));
}

static int check_args(const char *const *addrs, uint32_t n, uint32_t me,
                      struct dh_err *e)
{
    if (n < 1 || n > MAX_RANKS || me >= n)
        return dh_err_set(e, DH_EINVAL, "rb_link: rank %u of %u (1..%d)", me, n,
                          MAX_RANKS);
    for (uint32_t j = 0; j < n; j++) {
        if (!addrs[j] || strlen(addrs[j]) >= 256)
            return dh_err_set(e, DH_EINVAL,
                              "rb_link: rank %u's address is missing or "
                              "over 255 bytes",
                              j);
        if (!local_address(addrs[j]))
            return dh_err_set(e, DH_EUNSUPPORTED,
                              "rb_link: rank %u's address %s is not local "
                              "(ipc://, inproc:// or loopback tcp://; the "
                              "exchange has no CURVE)",
                              j, addrs[j]);
    }
    return 0;
}

static int open_sockets(struct dh_rb_link *l, void *zctx,
                        const char *const *addrs, struct dh_err *e)
{
    if (!(l->pull = zmq_socket(zctx, ZMQ_PULL)) ||
        set_int(l->pull, ZMQ_LINGER, 0) < 0 ||
        zmq_bind(l->pull, addrs[l->me]) < 0)
        return dh_err_set(e, DH_EIO, "rb_link: rank %u cannot bind %s: %s",
                          l->me, addrs[l->me], zmq_strerror(zmq_errno()));
    for (uint32_t j = 0; j < l->n; j++) {
        if (j == l->me)
            continue;
        if (!(l->push[j] = zmq_socket(zctx, ZMQ_PUSH)) ||
            set_int(l->push[j], ZMQ_LINGER, 0) < 0 ||
            zmq_connect(l->push[j], addrs[j]) < 0)
            return dh_err_set(e, DH_EIO,
                              "rb_link: rank %u cannot connect to rank "
                              "%u at %s: %s",
                              l->me, j, addrs[j], zmq_strerror(zmq_errno()));
    }
    return 0;
}

int dh_rb_link_create(void *zctx, const char *const *addrs, uint32_t n,
                      uint32_t me, struct dh_rb_link **out, struct dh_err *e)
{
    struct dh_rb_link *l;
    int rc;

    if ((rc = check_args(addrs, n, me, e)) != 0)
        return rc;
    if (!(l = dh__calloc(1, sizeof(*l))) ||
        !(l->push = dh__calloc(n, sizeof(*l->push))) ||
        !(l->next = dh__calloc(n, sizeof(*l->next)))) {
        dh_rb_link_destroy(l);
        return dh_err_set(e, DH_ENOMEM, "rb_link: out of memory");
    }
    l->n = n;
    l->me = me;
    snprintf(l->addr, sizeof(l->addr), "%s", addrs[me]);
    if ((rc = open_sockets(l, zctx, addrs, e)) != 0) {
        dh_rb_link_destroy(l);
        return rc;
    }
    *out = l;
    return 0;
}

void dh_rb_link_destroy(struct dh_rb_link *l)
{
    if (!l)
        return;
    if (l->pull)
        zmq_close(l->pull);
    for (uint32_t j = 0; l->push && j < l->n; j++)
        if (l->push[j])
            zmq_close(l->push[j]);
    for (uint32_t j = 0; l->next && j < l->n; j++)
        dh__free(l->next[j].buf);
    dh__free(l->push);
    dh__free(l->next);
    dh__free(l);
}

/* ---- one round ---- */

static int remaining(uint64_t deadline)
{
    uint64_t now = dh__mono_ms();

    return now >= deadline ? 0 : (int)(deadline - now);
}

static int send_all(struct dh_rb_link *l, uint64_t round,
                    const unsigned char *send, const uint64_t *split,
                    uint64_t deadline, struct dh_err *e)
{
    uint64_t off = 0;

    for (uint32_t j = 0; j < l->n; j++) {
        unsigned char h[HDR];

        if (j == l->me)
            continue;
        dh__put_le64(h, round);
        dh__put_le32(h + 8, l->me);
        dh__put_le64(h + 12, split[j]);
        /* blocks until the peer is connected: bounded by the deadline */
        set_int(l->push[j], ZMQ_SNDTIMEO, remaining(deadline) + 1);
        if (zmq_send(l->push[j], h, HDR, ZMQ_SNDMORE) < 0 ||
            zmq_send(l->push[j], split[j] ? send + off : h, split[j], 0) < 0)
            return dh_err_set(
                e, zmq_errno() == EAGAIN ? DH_ETIMEOUT : DH_EIO,
                "rb_link: rank %u could not send round %llu to rank %u: %s",
                l->me, (unsigned long long)round, j,
                zmq_errno() == EAGAIN ? "no connection within the timeout"
                                      : zmq_strerror(zmq_errno()));
        off += split[j];
    }
    return 0;
}

static uint64_t offset_of(const uint64_t *split, uint32_t src)
{
    uint64_t off = 0;

    for (uint32_t s = 0; s < src; s++)
        off += split[s];
    return off;
}

/* Reads one message (header + payload) into h and *body (the caller
 * closes it); DH_EPROTO if it is not two frames with a 20-byte header. */
static int read_msg(struct dh_rb_link *l, unsigned char *h, zmq_msg_t *body,
                    struct dh_err *e)
{
    zmq_msg_t hm;
    int more, ok;

    zmq_msg_init(&hm);
    if (zmq_msg_recv(&hm, l->pull, ZMQ_DONTWAIT) < 0) {
        zmq_msg_close(&hm);
        return zmq_errno() == EAGAIN ? 1 : DH_EIO;
    }
    ok = zmq_msg_size(&hm) == HDR && zmq_msg_more(&hm);
    if (ok)
        memcpy(h, zmq_msg_data(&hm), HDR);
    more = zmq_msg_more(&hm);
    zmq_msg_close(&hm);
    zmq_msg_init(body);
    if (more && zmq_msg_recv(body, l->pull, 0) < 0)
        ok = 0;
    if (!ok || zmq_msg_more(body)) {
        zmq_msg_close(body);
        return dh_err_set(e, DH_EPROTO,
                          "rb_link: rank %u at %s got a malformed message "
                          "(not a 20-byte header and one payload)",
                          l->me, l->addr);
    }
    return 0;
}

struct want {
    uint64_t round;
    unsigned char *recv;
    const uint64_t *split;
    unsigned char *got;
    uint32_t left;
};

/* Files one message: this round's into recv, the next one's aside. */
static int file_msg(struct dh_rb_link *l, const unsigned char *h,
                    const void *data, uint64_t len, struct want *w,
                    struct dh_err *e)
{
    uint64_t round = dh__get_le64(h), hlen = dh__get_le64(h + 12);
    uint32_t src = dh__get_le32(h + 8);

    if (src >= l->n || src == l->me || hlen != len)
        return dh_err_set(e, DH_EPROTO,
                          "rb_link: rank %u got a message from rank %u of "
                          "%u (length %llu, header says %llu)",
                          l->me, src, l->n, (unsigned long long)len,
                          (unsigned long long)hlen);
    if (round == w->round + 1 && !l->next[src].has) {
        if (!(l->next[src].buf = dh__malloc(len ? len : 1)))
            return dh_err_set(e, DH_ENOMEM, "rb_link: out of memory");
        if (len)
            memcpy(l->next[src].buf, data, len);
        l->next[src].len = len;
        l->next[src].has = 1;
        return 0;
    }
    if (round != w->round || w->got[src] || len != w->split[src])
        return dh_err_set(e, DH_EPROTO,
                          "rb_link: rank %u, round %llu: rank %u sent "
                          "round %llu, %llu bytes (expected %llu%s)",
                          l->me, (unsigned long long)w->round, src,
                          (unsigned long long)round, (unsigned long long)len,
                          (unsigned long long)w->split[src],
                          w->got[src] ? ", and it had sent this round" : "");
    if (len)
        memcpy(w->recv + offset_of(w->split, src), data, len);
    w->got[src] = 1;
    w->left--;
    return 0;
}

/* The messages a fast peer sent ahead, if they are this round's. */
static int take_ahead(struct dh_rb_link *l, struct want *w, struct dh_err *e)
{
    for (uint32_t s = 0; s < l->n; s++) {
        struct ahead a = l->next[s];
        unsigned char h[HDR];
        int rc;

        if (!a.has)
            continue;
        l->next[s] = (struct ahead){0};
        dh__put_le64(h, w->round);
        dh__put_le32(h + 8, s);
        dh__put_le64(h + 12, a.len);
        rc = file_msg(l, h, a.buf, a.len, w, e);
        dh__free(a.buf);
        if (rc)
            return rc;
    }
    return 0;
}

static int missing(const struct dh_rb_link *l, const struct want *w,
                   struct dh_err *e)
{
    char list[256] = "";
    size_t at = 0;

    for (uint32_t s = 0; s < l->n && at < sizeof(list) - 12; s++)
        if (s != l->me && !w->got[s])
            at += (size_t)snprintf(list + at, sizeof(list) - at, "%srank %u",
                                   at ? ", " : "", s);
    return dh_err_set(e, DH_ETIMEOUT,
                      "rb_link: rank %u, round %llu: no message from %s "
                      "within the timeout (dead or stalled)",
                      l->me, (unsigned long long)w->round, list);
}

static int recv_all(struct dh_rb_link *l, struct want *w, uint64_t deadline,
                    struct dh_err *e)
{
    int rc = take_ahead(l, w, e);

    while (rc == 0 && w->left > 0) {
        zmq_pollitem_t it = {.socket = l->pull, .events = ZMQ_POLLIN};
        unsigned char h[HDR];
        zmq_msg_t body;
        int t = remaining(deadline);

        if (t == 0)
            return missing(l, w, e);
        if (zmq_poll(&it, 1, t) < 0 && zmq_errno() != EINTR)
            return dh_err_set(e, DH_EIO, "rb_link: poll: %s",
                              zmq_strerror(zmq_errno()));
        while (rc == 0 && w->left > 0 && (rc = read_msg(l, h, &body, e)) == 0) {
            rc = file_msg(l, h, zmq_msg_data(&body), zmq_msg_size(&body), w, e);
            zmq_msg_close(&body);
        }
        if (rc == 1) /* drained */
            rc = 0;
        else if (rc == DH_EIO)
            dh_err_set(e, rc, "rb_link: receive: %s",
                       zmq_strerror(zmq_errno()));
    }
    return rc;
}

int dh_rb_link_exchange(struct dh_rb_link *l, uint64_t round, const void *send,
                        const uint64_t *send_split, void *recv,
                        const uint64_t *recv_split, int timeout_ms,
                        struct dh_err *e)
{
    uint64_t deadline = dh__mono_ms() +
                        (uint64_t)(timeout_ms > 0 ? timeout_ms : 0);
    struct want w = {round, recv, recv_split, NULL, l->n - 1};
    int rc;

    if (!(w.got = dh__calloc(l->n, 1)))
        return dh_err_set(e, DH_ENOMEM, "rb_link: out of memory");
    if ((rc = send_all(l, round, send, send_split, deadline, e)) == 0)
        rc = recv_all(l, &w, deadline, e);
    dh__free(w.got);
    return rc;
}
