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
 *   - Striped payloads: a payload link is several DH_TP_PAYLOAD_OUT sockets
 *     to one target (dh__tp_stripes(): half the CPUs, 1..4, by default), and the
 *     context of each end gets as many I/O threads (dh__tp_ctx_tune()), so
 *     libzmq places each connection on its own thread and CURVE's cipher
 *     runs on several cores at once.  A payload of DH_TP_STRIPE_MIN bytes
 *     or more goes as one part per socket, all or none, zero-copy from the
 *     caller's buffer; a shared count, decremented by ZeroMQ's free
 *     callback of each part (on whichever I/O thread wrote it), hands the
 *     buffer back once the last part is written.  The receiver's half is
 *     transport_parts.c.
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
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/alloc.h"
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

/* A connection to a bound socket that has not finished its handshake
 * (greeting, CURVE, ZAP) after this is dropped: idle or half-greeted
 * connections from strangers hold a file descriptor this long at most,
 * not ZeroMQ's 30 s (issue 36 item 6). */
#define TP_HANDSHAKE_MS 5000

static void set_options(void *sock, const struct tp_kind *k, int64_t maxmsg)
{
    set_int(sock, ZMQ_LINGER, 0);
    if (k->bind)
        set_int(sock, ZMQ_HANDSHAKE_IVL, TP_HANDSHAKE_MS);
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

/* A socket file's directory decides who may connect to it (the file's own
 * mode is the umask's): an ipc:// endpoint is bound only in a directory
 * of this user's that group and others cannot enter (issue 13 item 1).
 * Abstract sockets (ipc://@name) have no file: their peers' credentials
 * are checked instead (peer_cred.h). */
static int check_ipc_dir(const struct dh_tp_opts *o, struct dh_err *e)
{
    const char *path = o->addr + 6, *slash = strrchr(path, '/');
    char dir[DH_WIRE_MAX_ADDR + 1];
    struct stat st;

    if (strncmp(o->addr, "ipc://", 6) || path[0] == '@')
        return 0;
    if (!slash)
        snprintf(dir, sizeof(dir), ".");
    else if (slash == path)
        snprintf(dir, sizeof(dir), "/");
    else
        snprintf(dir, sizeof(dir), "%.*s", (int)(slash - path), path);
    if (lstat(dir, &st) < 0)
        return dh_err_set(e, DH_EINVAL, "%s: cannot listen on %s: %s: %s",
                          o->who, o->addr, dir, strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return dh_err_set(e, DH_EINVAL,
                          "%s: refusing to listen on %s: %s is not a "
                          "directory (a symlink is not followed)",
                          o->who, o->addr, dir);
    if (st.st_uid != geteuid())
        return dh_err_set(e, DH_EINVAL,
                          "%s: refusing to listen on %s: its directory %s "
                          "belongs to uid %u, not to this user (uid %u): "
                          "use a directory of your own, mode 0700",
                          o->who, o->addr, dir, (unsigned)st.st_uid,
                          (unsigned)geteuid());
    if (st.st_mode & 077)
        return dh_err_set(e, DH_EINVAL,
                          "%s: refusing to listen on %s: its directory %s "
                          "is mode %04o, so group or others could connect: "
                          "use a directory only you can enter (chmod 700 "
                          "%s, or mkdir -m 700)",
                          o->who, o->addr, dir, (unsigned)(st.st_mode & 07777),
                          dir);
    return 0;
}

static int do_bind(void *sock, const struct dh_tp_opts *o, char *bound,
                   size_t bound_len, struct dh_err *e)
{
    size_t len = bound_len;
    int rc;

    if ((rc = check_ipc_dir(o, e)) < 0)
        return rc;
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
        from->fd = *n > 0 ? zmq_msg_get(&f[0], ZMQ_SRCFD) : -1;
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

int dh__tp_recv_keep(void *sock, struct dh_tp_from *from, struct dh_wire_msg *m,
                     zmq_msg_t *raw, const char *peer, struct dh_err *e)
{
    int n, extra, rc;

    dh_wire_msg_init(m, DH_WIRE_NONE);
    zmq_msg_init(raw); /* recv_frames() may keep no frame in it */
    rc = recv_frames(sock, from, raw, 1, &n, &extra, peer, e);
    if (rc <= 0) {
        zmq_msg_close(raw);
        return rc;
    }
    if (n != 1 || extra > 0)
        rc = dh_err_set(e, DH_EPROTO, "%d frames, expected one envelope",
                        n + extra);
    else if ((rc = dh__tp_decode(raw, m, e)) == 0)
        return 1;
    else if (rc != DH_ENOMEM) /* the peer's fault, whatever the codec said */
        rc = e ? (e->code = DH_EPROTO) : DH_EPROTO;
    zmq_msg_close(raw); /* n is 0 or 1: *raw is initialised either way */
    return rc;
}

int dh__tp_recv(void *sock, struct dh_tp_from *from, struct dh_wire_msg *m,
                const char *peer, struct dh_err *e)
{
    zmq_msg_t f;
    int rc = dh__tp_recv_keep(sock, from, m, &f, peer, e);

    if (rc == 1)
        zmq_msg_close(&f);
    return rc;
}

int dh__tp_send_frame(void *sock, const struct dh_tp_from *to, zmq_msg_t *raw,
                      struct dh_err *e)
{
    zmq_msg_t out;
    int rc = 0;

    zmq_msg_init(&out);
    if (zmq_msg_copy(&out, raw) < 0 ||
        (to &&
         zmq_send(sock, to->id, to->id_len, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0) ||
        zmq_msg_send(&out, sock, ZMQ_DONTWAIT) < 0)
        rc = dh_err_set(e, DH_EIO, "%s", zmq_strerror(zmq_errno()));
    zmq_msg_close(&out); /* a no-op once sent */
    return rc;
}

/* ---- striped payloads: the sender's link ---- */

uint32_t dh__tp_stripes(uint32_t want)
{
    const char *env = getenv(DH_TP_STRIPES_ENV);
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);

    if (want >= 1 && want <= DH_TP_MAX_STRIPES)
        return want;
    if (env && *env) {
        char *end;
        long v = strtol(env, &end, 10);

        if (!*end && v >= 1 && v <= DH_TP_MAX_STRIPES)
            return (uint32_t)v;
    }
    if (cpus < 4)
        return 1;
    return cpus < 8 ? (uint32_t)(cpus / 2) : 4;
}

int dh__tp_ctx_tune(void *ctx, uint32_t stripes, int sockets, struct dh_err *e)
{
    if (zmq_ctx_set(ctx, ZMQ_IO_THREADS, (int)stripes) < 0 ||
        (sockets > 0 && zmq_ctx_set(ctx, ZMQ_MAX_SOCKETS, sockets) < 0))
        return dh_err_set(e, DH_EIO, "zmq context: %s",
                          zmq_strerror(zmq_errno()));
    return 0;
}

struct dh_tp_link {
    uint32_t n, next; /* sockets; the one a whole payload goes on next */
    void *sock[DH_TP_MAX_STRIPES];
};

/* One striped payload's buffer, shared by its parts' messages. */
struct tp_shared {
    atomic_uint left; /* parts not yet written (or dropped) */
    void *data, *hint;
    void (*free_fn)(void *data, void *hint);
};

static void part_done(void *data, void *hint)
{
    struct tp_shared *sh = hint;

    (void)data;
    if (atomic_fetch_sub(&sh->left, 1) == 1) {
        sh->free_fn(sh->data, sh->hint);
        dh__free(sh);
    }
}

int dh__tp_link_open(void *ctx, const struct dh_tp_opts *o, uint32_t stripes,
                     struct dh_tp_link **out, struct dh_err *e)
{
    struct dh_tp_link *l = dh__calloc(1, sizeof(*l));
    int rc = 0;

    if (!l)
        return dh_err_set(e, DH_ENOMEM, "out of memory");
    if (stripes < 1 || stripes > DH_TP_MAX_STRIPES)
        stripes = 1;
    for (l->n = 0; l->n < stripes; l->n++)
        if ((rc = dh__tp_open(ctx, o, &l->sock[l->n], NULL, 0, e)) < 0) {
            dh__tp_link_close(&l, 0);
            return rc;
        }
    *out = l;
    return 0;
}

void dh__tp_link_close(struct dh_tp_link **l, int linger_ms)
{
    if (!*l)
        return;
    for (uint32_t i = 0; i < (*l)->n; i++)
        dh__tp_close(&(*l)->sock[i], linger_ms);
    dh__free(*l);
    *l = NULL;
}

uint32_t dh__tp_link_stripes(const struct dh_tp_link *l)
{
    return l->n;
}

/* A whole payload on the next socket in turn: [hdr][data]. */
static int send_whole(struct dh_tp_link *l, const void *hdr, size_t hdr_len,
                      void *data, size_t len,
                      void (*free_fn)(void *data, void *hint), void *hint,
                      struct dh_err *e)
{
    void *sock = l->sock[l->next % l->n];
    int rc = dh__tp_send_more(sock, hdr, hdr_len, e);

    if (rc == 0)
        return 0; /* nothing queued */
    if (rc > 0) {
        if ((rc = dh__tp_send_zc(sock, data, len, free_fn, hint, e)) == 0) {
            l->next++;
            return 1;
        }
        if (rc != DH_ENOMEM)
            return DH_EIO; /* ZeroMQ freed it */
    }
    free_fn(data, hint); /* never handed over: DH_EIO's contract */
    return DH_EIO;
}

/* 1 if every socket can take a message now. */
static int all_writable(struct dh_tp_link *l, struct dh_err *e)
{
    zmq_pollitem_t it[DH_TP_MAX_STRIPES];

    for (uint32_t i = 0; i < l->n; i++)
        it[i] = (zmq_pollitem_t){.socket = l->sock[i], .events = ZMQ_POLLOUT};
    if (zmq_poll(it, (int)l->n, 0) < 0)
        return zmq_errno() == EINTR ? 0
                                    : dh_err_set(e, DH_EIO, "poll: %s",
                                                 zmq_strerror(zmq_errno()));
    for (uint32_t i = 0; i < l->n; i++)
        if (!(it[i].revents & ZMQ_POLLOUT))
            return 0;
    return 1;
}

/* Part i on socket i: [part frame][hdr][cut i of data].  1: queued (its
 * message holds one count of sh); 0: nothing of it queued; < 0: failed,
 * and *counted says whether its count of sh is already done. */
static int send_part(struct dh_tp_link *l, uint32_t i, uint32_t count,
                     const void *hdr, size_t hdr_len, uint8_t *data, size_t len,
                     struct tp_shared *sh, int *counted, struct dh_err *e)
{
    uint8_t pf[DH_TP_PART_HDR];
    uint64_t off = 0, n = 0;
    zmq_msg_t msg;
    int rc;

    *counted = 0;
    if (dh__tp_part_span(len, count, i, &off, &n) < 0)
        return dh_err_set(e, DH_EINVAL, "a payload of %zu bytes in %u parts",
                          len, count);
    dh__tp_part_encode(pf, i, count);
    if ((rc = dh__tp_send_more(l->sock[i], pf, sizeof(pf), e)) <= 0)
        return rc;
    if ((rc = dh__tp_send_more(l->sock[i], hdr, hdr_len, e)) <= 0)
        return rc < 0 ? rc : dh_err_set(e, DH_EIO, "part %u cut short", i);
    if (zmq_msg_init_data(&msg, data + off, (size_t)n, part_done, sh) < 0)
        return dh_err_set(e, DH_EIO, "part %u: out of memory", i);
    if (zmq_msg_send(&msg, l->sock[i], ZMQ_DONTWAIT) < 0) {
        rc = dh_err_set(e, DH_EIO, "part %u: %s", i, zmq_strerror(zmq_errno()));
        zmq_msg_close(&msg); /* counts the part done */
        *counted = 1;
        return rc;
    }
    return 1;
}

int dh__tp_link_send(struct dh_tp_link *l, const void *hdr, size_t hdr_len,
                     void *data, size_t len,
                     void (*free_fn)(void *data, void *hint), void *hint,
                     struct dh_err *e)
{
    uint32_t count = dh__tp_part_count(len, l->n), i;
    struct tp_shared *sh;
    int rc = 0, counted = 0;

    if (count == 1)
        return send_whole(l, hdr, hdr_len, data, len, free_fn, hint, e);
    if ((rc = all_writable(l, e)) < 0)
        free_fn(data, hint); /* DH_EIO's contract */
    if (rc <= 0)
        return rc;
    if (!(sh = dh__malloc(sizeof(*sh))))
        return dh_err_set(e, DH_ENOMEM, "out of memory");
    atomic_init(&sh->left, count);
    sh->data = data;
    sh->hint = hint;
    sh->free_fn = free_fn;
    for (i = 0; i < count; i++)
        if ((rc = send_part(l, i, count, hdr, hdr_len, data, len, sh, &counted,
                            e)) <= 0)
            break;
    if (i == count)
        return 1;
    if (i == 0 && rc == 0) { /* nothing queued: nothing holds sh */
        dh__free(sh);
        return 0;
    }
    /* Part way: the parts never handed to ZeroMQ are done now, so the
     * buffer goes back once the queued ones are written or dropped. */
    for (uint32_t k = i + (uint32_t)counted; k < count; k++)
        part_done(NULL, sh);
    if (rc == 0)
        dh_err_set(e, DH_EIO, "only %u of %u payload parts could be queued", i,
                   count);
    return DH_EIO;
}
