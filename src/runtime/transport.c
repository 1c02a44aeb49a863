/*
 * transport.c - the control plane's transport (transport.h,
 * docs/wire-protocol.md "Framing").
 *
 * Design notes:
 *   - What it owns: how a ZeroMQ socket of each role is set up, how a
 *     message is framed, and how bytes become a decoded wire message and
 *     back.  It owns no socket: callers hold the `void *` and their event
 *     loops poll it; this file keeps no state at all.
 *   - Roles, not options at call sites: `kinds[]` is the one table of
 *     socket type, bind or connect, linger, HWMs, timeouts and the size
 *     limit.  ZMQ_MAXMSGSIZE makes ZeroMQ itself refuse (and disconnect) a
 *     peer whose frame is over the limit, before it is buffered; the codec
 *     checks DH_WIRE_MAX_MSG again on every envelope.
 *   - Framing: a control message is one frame holding one Envelope, after
 *     the routing id on a ROUTER socket; a payload is [id][Envelope][data
 *     frames...].  A message is always read whole (the frames ZeroMQ
 *     delivers atomically), so a bad one never desynchronises the next.
 *   - Errors are dh_ codes: DH_EIO is the socket's failure (the caller's
 *     loop decides), every other receive error means one message was read
 *     and dropped and is the sender's fault (DH_ENOMEM aside): counted and
 *     logged by the caller, which keeps serving.
 *   - Security: apply_auth() is the single place where CURVE keys and the
 *     ZAP domain are set on every socket, before it binds or connects
 *     (DESIGN.md 9, docs/security.md): with a job key every socket of every
 *     transport uses it; without one, a bind others could reach is refused
 *     unless the caller says insecure.  Each message's User-Id (which key
 *     the peer proved) is handed up in dh_tp_from.user.
 *
 * Threading: none of its own; each call works on the caller's socket from
 * the caller's thread.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "core/log.h"
#include "runtime/transport.h"

/* One role's socket (0 = leave ZeroMQ's default). */
struct tp_kind {
    int type, bind;
    int router_mandatory, immediate;
    int sndhwm, rcvhwm;
    int sndtimeo_ms, rcvtimeo_ms; /* -1: ZeroMQ's default (block) */
    int64_t max_msg;              /* 0: no limit set */
};

static const struct tp_kind kinds[] = {
    [DH_TP_CLIENT_CTL] = {ZMQ_DEALER, 0, 0, 0, 0, 0, -1, -1, DH_WIRE_MAX_MSG},
    [DH_TP_COORD] = {ZMQ_ROUTER, 1, 1, 0, 0, 0, 100, 100, DH_WIRE_MAX_MSG},
    [DH_TP_SERVER_CTL] = {ZMQ_DEALER, 0, 0, 0, 0, 0, 1000, 1000,
                          DH_WIRE_MAX_MSG},
    /* payloads queued before the senders wait; max_msg from the opts */
    [DH_TP_PAYLOAD_IN] = {ZMQ_ROUTER, 1, 0, 0, 0, 8, -1, -1, 0},
    /* ZMQ_IMMEDIATE: nothing queues for a target not yet connected */
    [DH_TP_PAYLOAD_OUT] = {ZMQ_DEALER, 0, 0, 1, 8, 0, 0, -1, 0},
};

/* ---- sockets ---- */

static void set_int(void *sock, int opt, int v)
{
    zmq_setsockopt(sock, opt, &v, sizeof(v));
}

static void set_options(void *sock, const struct tp_kind *k, int64_t maxmsg)
{
    set_int(sock, ZMQ_LINGER, 0);
    if (k->router_mandatory)
        set_int(sock, ZMQ_ROUTER_MANDATORY, 1);
    if (k->immediate)
        set_int(sock, ZMQ_IMMEDIATE, 1);
    if (k->sndhwm)
        set_int(sock, ZMQ_SNDHWM, k->sndhwm);
    if (k->rcvhwm)
        set_int(sock, ZMQ_RCVHWM, k->rcvhwm);
    if (k->sndtimeo_ms >= 0)
        set_int(sock, ZMQ_SNDTIMEO, k->sndtimeo_ms);
    if (k->rcvtimeo_ms >= 0)
        set_int(sock, ZMQ_RCVTIMEO, k->rcvtimeo_ms);
    if (maxmsg > 0)
        zmq_setsockopt(sock, ZMQ_MAXMSGSIZE, &maxmsg, sizeof(maxmsg));
}

/* ---- the security seam (DESIGN.md 9, docs/security.md) ---- */

#ifndef ZMQ_ZAP_ENFORCE_DOMAIN
#define ZMQ_ZAP_ENFORCE_DOMAIN 93 /* a DRAFT option in libzmq 4.3 */
#endif
#define DH_ZAP_DOMAIN "datahelix"

int dh__tp_auth_init(struct dh_tp_auth *a, const char *keyfile, const char *who,
                     struct dh_err *e)
{
    int have = 0, rc;

    memset(a, 0, sizeof(*a));
    snprintf(a->who, sizeof(a->who), "%s", who ? who : "datahelix");
    if ((rc = dh__keys_resolve(keyfile, &a->keys, &have, e)) < 0)
        return rc;
    return have;
}

void dh__tp_auth_fini(struct dh_tp_auth *a)
{
    if (!a)
        return;
    dh__zap_stop(a->zap);
    a->zap = NULL;
    dh__keys_wipe(&a->keys);
}

uint64_t dh__tp_auth_refused(const struct dh_tp_auth *a)
{
    return a ? dh__zap_refused(a->zap) : 0;
}

int dh__tp_addr_is_local(const char *addr)
{
    static const char *const local[] = {
        "ipc://",       "inproc://",  "tcp://127.",         "tcp://localhost:",
        "tcp://[::1]:", "tcp://::1:", "tcp://[::ffff:127.",
    };

    for (size_t i = 0; i < sizeof(local) / sizeof(local[0]); i++)
        if (!strncmp(addr, local[i], strlen(local[i])))
            return 1;
    return 0;
}

static int set_str(void *sock, int opt, const char *v)
{
    return zmq_setsockopt(sock, opt, v, strlen(v));
}

/* A bound kind is a CURVE server with the job's secret, and the context's
 * ZAP handler (started on the first one) decides who is admitted; a
 * connecting kind is a CURVE client holding the job's key pair.  Without a
 * key, a bind that other hosts can reach is refused unless o->insecure. */
static int apply_auth(void *ctx, void *sock, const struct dh_tp_opts *o,
                      int bind, struct dh_err *e)
{
    struct dh_tp_auth *a = o->auth;
    int one = 1, rc;

    if (!a) {
        if (!bind || dh__tp_addr_is_local(o->addr))
            return 0;
        if (!o->insecure)
            return dh_err_set(
                e, DH_EINVAL,
                "%s: refusing to listen on %s without a key: anyone who can "
                "reach that address could join or stop the job.  Give "
                "--keyfile FILE (datahelix keygen FILE) or $%s, or "
                "--insecure to accept that",
                o->who, o->addr, DH_KEYFILE_ENV);
        dh__log(DH_LOG_WARN,
                "%s: listening on %s without "
                "authentication or encryption (--insecure): anyone who can "
                "reach that address owns this job (can register, read and "
                "forge its data, stop it)",
                o->who, o->addr);
        return 0;
    }
    if (!bind) {
        if (set_str(sock, ZMQ_CURVE_SERVERKEY, dh__keys_server(&a->keys)) < 0 ||
            set_str(sock, ZMQ_CURVE_PUBLICKEY, a->keys.pub) < 0 ||
            set_str(sock, ZMQ_CURVE_SECRETKEY, a->keys.sec) < 0)
            return dh_err_set(e, DH_EIO, "%s: cannot set the CURVE key: %s",
                              o->who, zmq_strerror(zmq_errno()));
        return 0;
    }
    if (!a->zap && (rc = dh__zap_start(ctx, &a->keys, a->who, &a->zap, e)) < 0)
        return rc;
    if ((rc = dh__zap_watch(a->zap, sock, e)) < 0)
        return rc;
    if (zmq_setsockopt(sock, ZMQ_CURVE_SERVER, &one, sizeof(one)) < 0 ||
        set_str(sock, ZMQ_CURVE_SECRETKEY, a->keys.sec) < 0 ||
        set_str(sock, ZMQ_ZAP_DOMAIN, DH_ZAP_DOMAIN) < 0)
        return dh_err_set(e, DH_EIO, "%s: cannot set the CURVE key: %s", o->who,
                          zmq_strerror(zmq_errno()));
    /* Where libzmq has it, a missing handler refuses instead of admits. */
    (void)zmq_setsockopt(sock, ZMQ_ZAP_ENFORCE_DOMAIN, &one, sizeof(one));
    return 0;
}

static int do_bind(void *sock, const struct dh_tp_opts *o, char *bound,
                   size_t bound_len, struct dh_err *e)
{
    size_t len = bound_len;

    if (zmq_bind(sock, o->addr) < 0) {
        int err = zmq_errno();

        return dh_err_set(
            e,
            err == EADDRINUSE || err == EADDRNOTAVAIL || err == EACCES
                ? DH_EIO
                : DH_EINVAL,
            "%s: cannot listen on %s: %s", o->who, o->addr, zmq_strerror(err));
    }
    if (bound && zmq_getsockopt(sock, ZMQ_LAST_ENDPOINT, bound, &len) < 0)
        snprintf(bound, bound_len, "%s", o->addr);
    return 0;
}

int dh__tp_open(void *ctx, const struct dh_tp_opts *o, void **out, char *bound,
                size_t bound_len, struct dh_err *e)
{
    const struct tp_kind *k = &kinds[o->kind];
    void *sock = zmq_socket(ctx, k->type);
    int rc;

    if (!sock)
        return dh_err_set(e, DH_EIO, "%s: zmq: %s", o->who,
                          zmq_strerror(zmq_errno()));
    set_options(sock, k, o->max_msg > 0 ? o->max_msg : k->max_msg);
    if ((rc = apply_auth(ctx, sock, o, k->bind, e)) < 0)
        goto out_close;
    if (k->bind) {
        if ((rc = do_bind(sock, o, bound, bound_len, e)) < 0)
            goto out_close;
    } else if (zmq_connect(sock, o->addr) < 0) {
        rc = dh_err_set(e, DH_EINVAL, "cannot connect to %s %s: %s", o->peer,
                        o->addr, zmq_strerror(zmq_errno()));
        goto out_close;
    }
    *out = sock;
    return 0;
out_close:
    zmq_close(sock);
    return rc;
}

void dh__tp_linger(void *sock, int ms)
{
    if (sock)
        set_int(sock, ZMQ_LINGER, ms);
}

void dh__tp_close(void **sock, int linger_ms)
{
    if (!*sock)
        return;
    dh__tp_linger(*sock, linger_ms);
    zmq_close(*sock);
    *sock = NULL;
}

int dh__tp_wait(void *sock, long ms, struct dh_err *e)
{
    zmq_pollitem_t it = {.socket = sock, .events = ZMQ_POLLIN};
    int rc = zmq_poll(&it, 1, ms);

    if (rc < 0 && zmq_errno() != EINTR)
        return dh_err_set(e, DH_EIO, "poll: %s", zmq_strerror(zmq_errno()));
    return rc > 0 && (it.revents & ZMQ_POLLIN) ? 1 : 0;
}

/* ---- sending ---- */

int dh__tp_send(void *sock, const struct dh_tp_from *to,
                const struct dh_wire_msg *m, const char *peer, struct dh_err *e)
{
    uint8_t *buf = NULL;
    size_t len = 0;
    int rc = dh_wire_encode(m, &buf, &len, e);

    if (rc < 0)
        return rc;
    if ((to &&
         zmq_send(sock, to->id, to->id_len, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0) ||
        zmq_send(sock, buf, len, ZMQ_DONTWAIT) < 0)
        rc = peer ? dh_err_set(e, DH_EIO, "sending %s to %s: %s",
                               dh_wire_type_name(m->type), peer,
                               zmq_strerror(zmq_errno()))
                  : dh_err_set(e, DH_EIO, "%s", zmq_strerror(zmq_errno()));
    dh_wire_free(buf);
    return rc;
}

int dh__tp_send_more(void *sock, const void *buf, size_t len, struct dh_err *e)
{
    if (zmq_send(sock, buf, len, ZMQ_SNDMORE | ZMQ_DONTWAIT) >= 0)
        return 1;
    if (zmq_errno() == EAGAIN || zmq_errno() == EINTR)
        return 0;
    return dh_err_set(e, DH_EIO, "%s", zmq_strerror(zmq_errno()));
}

int dh__tp_send_zc(void *sock, void *data, size_t len,
                   void (*free_fn)(void *data, void *hint), void *hint,
                   struct dh_err *e)
{
    zmq_msg_t msg;

    if (zmq_msg_init_data(&msg, data, len, free_fn, hint) < 0)
        return dh_err_set(e, DH_ENOMEM, "out of memory");
    if (zmq_msg_send(&msg, sock, ZMQ_DONTWAIT) < 0) {
        int err = zmq_errno();

        zmq_msg_close(&msg); /* frees data through free_fn */
        return dh_err_set(e, DH_EIO, "%s", zmq_strerror(err));
    }
    return 0;
}

/* ---- receiving ---- */

static int more_frames(void *sock)
{
    int more = 0;
    size_t sz = sizeof(more);

    return zmq_getsockopt(sock, ZMQ_RCVMORE, &more, &sz) == 0 && more;
}

static int is_router(void *sock)
{
    int type = 0;
    size_t sz = sizeof(type);

    return zmq_getsockopt(sock, ZMQ_TYPE, &type, &sz) == 0 &&
           type == ZMQ_ROUTER;
}

/* Reads the first frame (the routing id on a ROUTER).  1, 0, DH_EIO. */
static int recv_first(void *sock, zmq_msg_t *f, const char *peer,
                      struct dh_err *e)
{
    int err;

    zmq_msg_init(f);
    if (zmq_msg_recv(f, sock, ZMQ_DONTWAIT) >= 0)
        return 1;
    err = zmq_errno();
    zmq_msg_close(f);
    if (err == EAGAIN || err == EINTR)
        return 0;
    return dh_err_set(e, DH_EIO, "receiving from %s: %s",
                      peer ? peer : "a peer", zmq_strerror(err));
}

static void keep_id(struct dh_tp_from *from, zmq_msg_t *idf)
{
    size_t n = zmq_msg_size(idf);

    from->id_len = (uint8_t)(n > DH_TP_MAX_ID ? DH_TP_MAX_ID : n);
    memcpy(from->id, zmq_msg_data(idf), from->id_len);
}

/* Reads the frames after the first into f[*n..cap), then drops the rest. */
static void recv_rest(void *sock, zmq_msg_t *f, int cap, int *n, int *extra)
{
    zmq_msg_t junk;

    zmq_msg_init(&junk);
    while (more_frames(sock)) {
        zmq_msg_t *t = *n < cap ? &f[*n] : &junk;

        if (t != &junk)
            zmq_msg_init(t);
        if (zmq_msg_recv(t, sock, ZMQ_DONTWAIT) < 0) {
            if (t != &junk)
                zmq_msg_close(t);
            break;
        }
        if (t == &junk)
            (*extra)++;
        else
            (*n)++;
    }
    zmq_msg_close(&junk);
}

static int recv_frames(void *sock, struct dh_tp_from *from, zmq_msg_t *f,
                       int cap, int *n, int *extra, const char *peer,
                       struct dh_err *e)
{
    zmq_msg_t first;
    const char *addr;
    int rc = recv_first(sock, &first, peer, e);

    *n = *extra = 0;
    if (rc <= 0)
        return rc;
    if (is_router(sock)) {
        if (from)
            keep_id(from, &first);
        zmq_msg_close(&first);
    } else if (cap > 0) {
        zmq_msg_init(&f[0]);
        zmq_msg_move(&f[0], &first);
        zmq_msg_close(&first);
        *n = 1;
    } else {
        zmq_msg_close(&first);
        (*extra)++;
    }
    recv_rest(sock, f, cap, n, extra);
    if (from) {
        /* Frames from the wire carry the connection's metadata. */
        addr = *n > 0 ? zmq_msg_gets(&f[0], "Peer-Address") : NULL;
        snprintf(from->addr, sizeof(from->addr), "%s", addr ? addr : "");
        addr = *n > 0 ? zmq_msg_gets(&f[0], "User-Id") : NULL;
        snprintf(from->user, sizeof(from->user), "%s", addr ? addr : "");
    }
    return 1;
}

int dh__tp_recv_frames(void *sock, struct dh_tp_from *from, zmq_msg_t *f,
                       int cap, int *n, int *extra, struct dh_err *e)
{
    return recv_frames(sock, from, f, cap, n, extra, NULL, e);
}

void dh__tp_frames_close(zmq_msg_t *f, int n)
{
    for (int i = 0; i < n; i++)
        zmq_msg_close(&f[i]);
}

int dh__tp_decode(const zmq_msg_t *f, struct dh_wire_msg *m, struct dh_err *e)
{
    zmq_msg_t *mf = (zmq_msg_t *)f; /* zmq_msg_data() takes no const */

    return dh_wire_decode(zmq_msg_data(mf), zmq_msg_size(mf), m, e);
}

int dh__tp_recv(void *sock, struct dh_tp_from *from, struct dh_wire_msg *m,
                const char *peer, struct dh_err *e)
{
    zmq_msg_t f;
    int n, extra, rc;

    dh_wire_msg_init(m, DH_WIRE_NONE);
    rc = recv_frames(sock, from, &f, 1, &n, &extra, peer, e);
    if (rc <= 0)
        return rc;
    if (n != 1 || extra > 0)
        rc = dh_err_set(e, DH_EPROTO, "%d frames, expected one envelope",
                        n + extra);
    else if ((rc = dh__tp_decode(&f, m, e)) == 0)
        rc = 1;
    else if (rc != DH_ENOMEM) /* the peer's fault, whatever the codec said */
        rc = e ? (e->code = DH_EPROTO) : DH_EPROTO;
    dh__tp_frames_close(&f, n);
    return rc;
}
