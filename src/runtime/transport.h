/*
 * transport.h - the control plane's thin transport over ZeroMQ, used alike
 * by the client, the Coordinator and the DataServer (docs/wire-protocol.md
 * "Framing"): socket setup per role, multipart framing (routing ids,
 * payload frames), encode + send of a wire message, receive + decode with
 * the size caps, and the one seam where issue "trust" adds CURVE.
 *
 * Internal (not under include/).  All functions take the raw ZeroMQ socket
 * (`void *`) their caller owns; a socket is used by one thread at a time,
 * like any ZeroMQ socket, and nothing here keeps state of its own.
 */
#ifndef DH_RUNTIME_TRANSPORT_H
#define DH_RUNTIME_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>

#include <zmq.h>

#include "datahelix/error.h"
#include "datahelix/wire.h"
#include "runtime/keys.h"
#include "runtime/zap.h"

/* The roles a socket plays.  Each fixes its ZeroMQ type, bind or connect,
 * and options (transport.c, `kinds[]`); the values are today's. */
enum dh_tp_kind {
    DH_TP_CLIENT_CTL,  /* a client's DEALER to the Coordinator */
    DH_TP_COORD,       /* the Coordinator's ROUTER, bound */
    DH_TP_SERVER_CTL,  /* a DataServer's DEALER to the Coordinator */
    DH_TP_PAYLOAD_IN,  /* a local DataServer's payload ROUTER, bound */
    DH_TP_PAYLOAD_OUT, /* a remote DataServer's DEALER to a target */
};

/* The job's CURVE key and this context's ZAP handler (DESIGN.md 9,
 * docs/security.md).  One per ZeroMQ context whose sockets use the key:
 * dh__tp_open() makes every socket of a bound kind a CURVE server with it
 * (and starts the context's ZAP handler on the first one), every connecting
 * socket a CURVE client with it.  The owner calls dh__tp_auth_fini() after
 * closing the context's sockets and before zmq_ctx_term(). */
struct dh_tp_auth {
    struct dh_keys keys;
    struct dh_zap *zap; /* started by dh__tp_open(); NULL before */
    char who[32];       /* the owner, for the ZAP handler's log lines */
};

/* Loads the key dh__keys_path(keyfile) names into a: 1 (a key: use `a`),
 * 0 (none configured: pass no auth), or the key file's error. */
int dh__tp_auth_init(struct dh_tp_auth *a, const char *keyfile, const char *who,
                     struct dh_err *e) DH_MUST_CHECK;
/* Stops the ZAP handler, wipes the key.  Idempotent. */
void dh__tp_auth_fini(struct dh_tp_auth *a);
/* Peers the ZAP handler refused so far (0 without one). */
uint64_t dh__tp_auth_refused(const struct dh_tp_auth *a);

/* 1 if binding `addr` exposes nothing beyond this host: ipc://, inproc://,
 * tcp:// on 127.0.0.0/8, ::1 or localhost.  Anything else (a wildcard, an
 * interface, a routable address or name) is 0. */
int dh__tp_addr_is_local(const char *addr);

struct dh_tp_opts {
    enum dh_tp_kind kind;
    const char *addr; /* the endpoint to bind or connect */
    const char *who;  /* this process, for messages ("coordinator") */
    const char *peer; /* the far end, for connect messages ("coordinator",
                         "the delivery target, server 7 at") */
    int64_t max_msg;  /* DH_TP_PAYLOAD_IN: ZMQ_MAXMSGSIZE (0: the kind's) */
    struct dh_tp_auth *auth; /* the job's key; NULL: none (plain) */
    int insecure; /* a bound kind without auth on a non-local address:
                     0 refuses it (DH_EINVAL), 1 binds with a warning */
};

/* A ROUTER peer: its routing id and, for messages, the transport address
 * ZeroMQ reports for it ("Peer-Address"; "" if unknown). */
#define DH_TP_MAX_ID 255
struct dh_tp_from {
    uint8_t id_len;
    uint8_t id[DH_TP_MAX_ID];
    char addr[64];
    /* The key the peer authenticated with: DH_ZAP_USER_JOB ("job"),
     * DH_ZAP_USER_ADMIN ("admin"), or "" on a socket without CURVE. */
    char user[16];
    /* The connection's socket in ZeroMQ's I/O thread (ZMQ_SRCFD), to name
     * it (dh__zap_conn_name) and to know its close; -1 if unknown. */
    int fd;
};

/*
 * Creates a socket of o->kind in `ctx`, sets the kind's options, applies
 * the security seam (o->auth: CURVE; none: a non-local bind is refused
 * unless o->insecure, which warns on stderr), then binds or connects.  For a bound kind,
 * `bound` (if not NULL) gets the endpoint actually bound (port 0 resolved),
 * or o->addr if ZeroMQ cannot say.  On success *out is the socket (the
 * caller closes it with dh__tp_close()); on error nothing is left open.
 * Errors: DH_EIO (no socket, no ZAP handler; bind: address in use, not
 * available or not permitted), DH_EINVAL (a bad endpoint; a non-local bind
 * without a key and without o->insecure).
 */
int dh__tp_open(void *ctx, const struct dh_tp_opts *o, void **out, char *bound,
                size_t bound_len, struct dh_err *e) DH_MUST_CHECK;
/* Sets the linger (ms) and closes *sock; *sock becomes NULL.  NULL ok. */
void dh__tp_close(void **sock, int linger_ms);
/* Lets messages still queued go out for up to `ms` when the socket closes. */
void dh__tp_linger(void *sock, int ms);

/* 1: `sock` is readable within `ms`, 0: not (or EINTR), DH_EIO: failed. */
int dh__tp_wait(void *sock, long ms, struct dh_err *e) DH_MUST_CHECK;

/*
 * Encodes `m` and sends it without blocking, as one frame; with a routing
 * id (`to`, a ROUTER socket), as [id][envelope].  `peer` names the far end
 * in the message ("coordinator tcp://..."), or NULL.  0, or: the encoder's
 * DH_EINVAL / DH_ENOMEM, or DH_EIO (ZeroMQ refused it: full, gone).
 */
int dh__tp_send(void *sock, const struct dh_tp_from *to,
                const struct dh_wire_msg *m, const char *peer,
                struct dh_err *e) DH_MUST_CHECK;
/* Sends one frame of bytes already encoded, copied by ZeroMQ, more frames
 * to follow.  1: queued, 0: would block (not connected, HWM), DH_EIO. */
int dh__tp_send_more(void *sock, const void *buf, size_t len,
                     struct dh_err *e) DH_MUST_CHECK;
/* Sends the last frame zero-copy: ZeroMQ calls free_fn(data, hint) once
 * it is written.  0: sent; DH_ENOMEM: nothing was sent and the caller
 * still owns `data`; DH_EIO: not sent, and `data` was already freed. */
int dh__tp_send_zc(void *sock, void *data, size_t len,
                   void (*free_fn)(void *data, void *hint), void *hint,
                   struct dh_err *e) DH_MUST_CHECK;

/*
 * Reads one whole message without blocking.  On a ROUTER socket the first
 * frame is the routing id, copied into from->id.  Up to `cap` frames go to
 * f[0..*n) (initialised here; the caller closes them with
 * dh__tp_frames_close()); *extra counts the frames past `cap`, read and
 * dropped.  from->addr / from->user: the first kept frame's Peer-Address
 * and User-Id.  `from` may be
 * NULL.  1: a message, 0: none waiting, DH_EIO: the socket failed.
 */
int dh__tp_recv_frames(void *sock, struct dh_tp_from *from, zmq_msg_t *f,
                       int cap, int *n, int *extra,
                       struct dh_err *e) DH_MUST_CHECK;
void dh__tp_frames_close(zmq_msg_t *f, int n);
/* Decodes one frame as an Envelope (dh_wire_decode(): its caps, codes). */
int dh__tp_decode(const zmq_msg_t *f, struct dh_wire_msg *m,
                  struct dh_err *e) DH_MUST_CHECK;

/*
 * Reads one message that must be a single Envelope (after the routing id on
 * a ROUTER socket) and decodes it into `m` (which must own nothing: it is
 * initialised here).  1: `m` holds it (the caller
 * calls dh_wire_msg_fini()); 0: none waiting; DH_EIO: the socket failed;
 * any other code: one message was read and dropped, `m` is empty, e says
 * why: DH_EPROTO (the peer's fault: several frames, not an envelope, over
 * a cap, another version; the codec's reason in e) or DH_ENOMEM (not the
 * peer's).  `peer` names the far
 * end in a DH_EIO message, or NULL.
 */
int dh__tp_recv(void *sock, struct dh_tp_from *from, struct dh_wire_msg *m,
                const char *peer, struct dh_err *e) DH_MUST_CHECK;
/* dh__tp_recv() that, on 1, also leaves the received Envelope frame in
 * *raw (initialised here; the caller closes it with zmq_msg_close()), for
 * a relay that passes the message on as it came (dh__tp_send_frame()).
 * On any other result *raw is closed already. */
int dh__tp_recv_keep(void *sock, struct dh_tp_from *from, struct dh_wire_msg *m,
                     zmq_msg_t *raw, const char *peer,
                     struct dh_err *e) DH_MUST_CHECK;
/* Sends the frame *raw (kept by dh__tp_recv_keep(), still the caller's:
 * ZeroMQ shares its buffer, nothing is copied or encoded) to `to` (NULL on
 * a socket without routing ids) without blocking.  0 or DH_EIO. */
int dh__tp_send_frame(void *sock, const struct dh_tp_from *to, zmq_msg_t *raw,
                      struct dh_err *e) DH_MUST_CHECK;

/* 1 if a dh__tp_recv() result means a bad message was dropped (the caller
 * counts it and keeps serving), not a socket failure. */
static inline int dh__tp_dropped(int rc)
{
    return rc < 0 && rc != DH_EIO;
}

/* ---- striped payloads (transport.c, transport_parts.c;
 * docs/wire-protocol.md "Payload parts") ----
 *
 * With CURVE a connection's cipher runs on its one I/O thread, so a large
 * payload is cut into parts sent over several connections of one link,
 * each connection on its own I/O thread at both ends, and put back
 * together by the receiver. */
#define DH_TP_MAX_STRIPES 8           /* connections per link */
#define DH_TP_MAX_PARTS 16            /* parts a receiver accepts */
#define DH_TP_STRIPE_MIN (256u << 10) /* smaller payloads go whole */
#define DH_TP_PART_HDR 16             /* bytes of a part frame */
#define DH_TP_STRIPES_ENV "DATAHELIX_PAYLOAD_STRIPES"

/* The connections per payload link: `want` if 1..DH_TP_MAX_STRIPES, else
 * $DATAHELIX_PAYLOAD_STRIPES if set to one of those, else half the online
 * CPUs, 1..4 (the rest decode and train; on 2 CPUs one connection's two
 * I/O threads already keep both busy).  Never fails. */
uint32_t dh__tp_stripes(uint32_t want);
/* Sets a fresh context (no socket yet) up for `stripes`-way payloads: as
 * many I/O threads, and room for `sockets` sockets.  DH_EIO if ZeroMQ
 * refuses (the context keeps its defaults then). */
int dh__tp_ctx_tune(void *ctx, uint32_t stripes, int sockets,
                    struct dh_err *e) DH_MUST_CHECK;

/* The part frame: 0xff 'D' 'H' 'P' 1 0 0 0, index, count (LE u32). */
void dh__tp_part_encode(uint8_t out[DH_TP_PART_HDR], uint32_t index,
                        uint32_t count);
/* 1: `buf` is a part frame (*index, *count set, not yet checked against
 * anything), 0: it is not one (does not start with 0xff), DH_EPROTO: it
 * starts like one but is not version 1's 16 bytes. */
int dh__tp_part_decode(const void *buf, size_t len, uint32_t *index,
                       uint32_t *count, struct dh_err *e) DH_MUST_CHECK;
/* The parts a sender with `stripes` connections cuts `length` bytes into:
 * 1 (sent whole) below DH_TP_STRIPE_MIN or for one stripe, else stripes. */
uint32_t dh__tp_part_count(uint64_t length, uint32_t stripes);
/* Part `index` of `count` of `length` bytes: [*off, *off + *len).  Part i
 * holds length / count bytes, one more for i < length % count.
 * DH_EINVAL unless 1 <= count <= DH_TP_MAX_PARTS, index < count and
 * count <= length (no part is empty). */
int dh__tp_part_span(uint64_t length, uint32_t count, uint32_t index,
                     uint64_t *off, uint64_t *len) DH_MUST_CHECK;

/* A sender's link to one payload target: `stripes` DH_TP_PAYLOAD_OUT
 * sockets connected to o->addr.  Opaque; one thread at a time. */
struct dh_tp_link;
/* Opens the link (every socket, or none: on error nothing is left open).
 * Errors: dh__tp_open()'s, DH_ENOMEM. */
int dh__tp_link_open(void *ctx, const struct dh_tp_opts *o, uint32_t stripes,
                     struct dh_tp_link **out, struct dh_err *e) DH_MUST_CHECK;
/* Closes every socket with `linger_ms` (queued parts may still go out for
 * that long); *l becomes NULL.  NULL ok. */
void dh__tp_link_close(struct dh_tp_link **l, int linger_ms);
uint32_t dh__tp_link_stripes(const struct dh_tp_link *l);
/*
 * Sends one payload without blocking: the encoded envelope `hdr` (copied)
 * and `len` bytes of `data` (zero-copy).  Whole ([hdr][data], on the next
 * socket in turn) when dh__tp_part_count(len, stripes) is 1, else part i
 * ([part frame][hdr][its cut of data]) on socket i, all or none: only when
 * every socket can take one.  free_fn(data, hint) runs once, from a
 * ZeroMQ I/O thread, after the last part is written (or dropped).
 * 1: sent, ZeroMQ owns `data`; 0: a socket is not connected or full,
 * nothing sent, the caller still owns `data`; DH_ENOMEM: nothing sent,
 * the caller owns `data`; DH_EIO: failed (part way, or a socket did):
 * free_fn has run or will run, parts may be queued, the caller closes the
 * link (which drops them).
 */
int dh__tp_link_send(struct dh_tp_link *l, const void *hdr, size_t hdr_len,
                     void *data, size_t len,
                     void (*free_fn)(void *data, void *hint), void *hint,
                     struct dh_err *e) DH_MUST_CHECK;

/* The receiver's reassembly table (transport_parts.c). */
struct dh_tp_asm_opts {
    unsigned max_sets;   /* payloads being assembled at once */
    uint64_t max_bytes;  /* data bytes they may hold together */
    uint64_t timeout_ms; /* a set with no new part for this long expires */
};
struct dh_tp_asm;
int dh__tp_asm_create(const struct dh_tp_asm_opts *o, struct dh_tp_asm **out,
                      struct dh_err *e) DH_MUST_CHECK;
void dh__tp_asm_destroy(struct dh_tp_asm *a); /* NULL ok; drops every set */
/* Sets being assembled now. */
unsigned dh__tp_asm_open(const struct dh_tp_asm *a);

/* One received part, its header already decoded and checked by the caller
 * (task, server, length are the envelope's; host the Peer-Address). */
struct dh_tp_part {
    uint64_t task;
    uint32_t server;
    const char *host;
    uint32_t index, count;
    uint64_t length;
    zmq_msg_t *hdr;  /* the envelope frame */
    zmq_msg_t *data; /* the data frame */
};
/*
 * Adds part p to its task's set (keyed by task id; a set belongs to its
 * first part's server and host).  The frames it keeps are moved out of
 * *p->hdr / *p->data; the caller closes both after the call whatever it
 * returns (a moved-from frame is empty).  1: the set is complete:
 * out[0] = the header, out[1..count] = the data frames in index order
 * (the caller closes them), *n_out = count + 1, and the set is gone;
 * 0: kept, more to come; DH_EPROTO: refused, e says why (a part claiming
 * another sender for a set in progress is refused alone; the sender's own
 * inconsistent part - another count or length, a different header, a
 * wrong size, a duplicate index - or a part past the caps drops its whole
 * set, and e says so).  `out` has room for DH_TP_MAX_PARTS + 1 frames.
 */
int dh__tp_asm_add(struct dh_tp_asm *a, const struct dh_tp_part *p,
                   uint64_t now_ms, zmq_msg_t *out, int *n_out,
                   struct dh_err *e) DH_MUST_CHECK;
/* Drops one set that saw no part for timeout_ms: 1 (e: DH_ETIMEOUT, which
 * task, sender, parts), or 0: none.  Call until 0. */
int dh__tp_asm_expire(struct dh_tp_asm *a, uint64_t now_ms, struct dh_err *e);

#endif
