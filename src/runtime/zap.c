/*
 * zap.c - the ZAP handler (zap.h, docs/security.md "Who is refused").
 *
 * Design notes:
 *   - Identity is the CURVE public key the peer proved it holds: the job's
 *     key -> User-Id "job", an admin key -> "admin"; anything else is
 *     refused (status 400).  The User-Id rides on every message of that
 *     connection, so an authorization layer reads it per message.
 *   - Not every refusal reaches ZAP: a peer with no CURVE at all (a
 *     mechanism mismatch) or with another job's key pair (it cannot even
 *     encrypt to our public key) fails the handshake first.  Those are seen
 *     on the bound socket's monitor: ZeroMQ's I/O thread emits "handshake
 *     failed" and then "disconnected (fd)" for that connection in one go,
 *     so a failure is paired with the next disconnect, whose fd names the
 *     peer recorded when it was accepted (getpeername at ACCEPTED; best
 *     effort: "?" if the connection was already gone).
 *   - Logging is rate-limited (dh__zap_rl_allow) and every refusal is
 *     counted, logged or not.
 *   - Bounded: one thread, at most ZAP_MAX_MON watched sockets, a fixed
 *     table of accepted fds; every wait is a 100 ms poll.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>

#include <zmq.h>

#include "core/log.h"
#include "core/alloc.h"
#include "runtime/peer_cred.h"
#include "runtime/zap.h"

#define ZAP_ENDPOINT "inproc://zeromq.zap.01"
#define ZAP_MAX_MON 8
#define ZAP_MAX_FDS 1024
#define ZAP_TICK_MS 100
#define ZAP_MON_EVENTS                                                         \
    (ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_ACCEPT_FAILED |   \
     ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |                                    \
     ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_MONITOR_STOPPED)

/* Names inproc endpoints uniquely in the process: a monitored socket's own
 * end of its monitor is closed asynchronously, so a name must never be
 * reused, not even by a handler allocated where a freed one was. */
static unsigned endpoint_seq; /* atomic */

static unsigned next_seq(void)
{
    return __atomic_fetch_add(&endpoint_seq, 1, __ATOMIC_RELAXED);
}

struct zap_fd {
    int fd;
    uint64_t ino;  /* dh__zap_conn_ino() at ACCEPTED */
    char addr[64]; /* dh__zap_conn_name() at ACCEPTED */
};

struct dh_zap {
    void *ctx, *rep, *wake; /* wake: PULL, a message = new monitors */
    char wake_ep[64];
    pthread_t th;
    int stop; /* atomic */
    char who[32];
    uint8_t job[32];
    uint8_t admin[DH_KEY_MAX_ADMIN][32];
    int n_admin;
    uint64_t refused, admitted; /* atomic */
    /* sockets handed to the thread by dh__zap_watch(), under mu */
    pthread_mutex_t mu;
    void *mon_new[ZAP_MAX_MON];
    int n_new;
    /* connections closed and not yet taken (dh__zap_closed), under mu */
    struct dh_zap_conn closed[DH_ZAP_MAX_CLOSED];
    int n_closed;
    /* the thread's own */
    void *mon[ZAP_MAX_MON];
    int n_mon;
    struct zap_fd fds[ZAP_MAX_FDS];
    int failed; /* a handshake failed; its disconnect comes next */
    uint64_t accept_failed, accept_log_ms; /* accept_failed() */
    struct dh_zap_rl rl;
};

/* ---- the rate limit ---- */

int dh__zap_rl_allow(struct dh_zap_rl *rl, uint64_t now_ms, uint64_t *skipped)
{
    if (now_ms - rl->window_ms >= DH_ZAP_LOG_WINDOW_MS ||
        now_ms < rl->window_ms) {
        rl->window_ms = now_ms;
        rl->lines = 0;
    }
    if (rl->lines >= DH_ZAP_LOG_BURST) {
        rl->skipped++;
        return 0;
    }
    rl->lines++;
    *skipped = rl->skipped;
    rl->skipped = 0;
    return 1;
}

static uint64_t mono_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void refuse(struct dh_zap *z, const char *addr, const char *why)
{
    uint64_t n = __atomic_add_fetch(&z->refused, 1, __ATOMIC_RELAXED), skip;

    if (!dh__zap_rl_allow(&z->rl, mono_ms(), &skip))
        return;
    if (skip)
        dh__log(DH_LOG_WARN, "%s: (%llu more refused peers not logged)", z->who,
                (unsigned long long)skip);
    dh__log(DH_LOG_WARN,
            "%s: refused a peer from %s: %s (%llu refused so "
            "far)",
            z->who, addr && *addr ? addr : "?", why, (unsigned long long)n);
}

/* ---- ZAP requests ---- */

static void send_str(void *s, const char *v, int more)
{
    zmq_send(s, v, strlen(v), more ? ZMQ_SNDMORE : 0);
}

/* The user id for a 32-byte CURVE public key, or NULL: not admitted. */
static const char *user_of(const struct dh_zap *z, const uint8_t *key)
{
    if (!memcmp(key, z->job, 32))
        return DH_ZAP_USER_JOB;
    for (int i = 0; i < z->n_admin; i++)
        if (!memcmp(key, z->admin[i], 32))
            return DH_ZAP_USER_ADMIN;
    return NULL;
}

/* One request: [version][request id][domain][address][identity]
 * [mechanism][credentials...] (RFC 27); answered on the same REP. */
static void serve_request(struct dh_zap *z)
{
    zmq_msg_t f[8];
    int n = 0, more = 1;
    size_t sz;
    const char *user = NULL;
    char addr[64] = "";

    while (more && n < 8) {
        zmq_msg_init(&f[n]);
        if (zmq_msg_recv(&f[n], z->rep, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&f[n]);
            break;
        }
        n++;
        sz = sizeof(more);
        if (zmq_getsockopt(z->rep, ZMQ_RCVMORE, &more, &sz) < 0)
            more = 0;
    }
    while (more) { /* more frames than RFC 27 has: drain, then refuse */
        zmq_msg_t junk;

        zmq_msg_init(&junk);
        if (zmq_msg_recv(&junk, z->rep, ZMQ_DONTWAIT) < 0)
            more = 0;
        zmq_msg_close(&junk);
        sz = sizeof(more);
        if (more && zmq_getsockopt(z->rep, ZMQ_RCVMORE, &more, &sz) < 0)
            more = 0;
    }
    if (n == 0)
        return;
    if (n >= 4) {
        size_t al = zmq_msg_size(&f[3]);

        al = al < sizeof(addr) - 1 ? al : sizeof(addr) - 1;
        memcpy(addr, zmq_msg_data(&f[3]), al);
        addr[al] = 0;
    }
    if (n == 7 && zmq_msg_size(&f[5]) == 5 &&
        !memcmp(zmq_msg_data(&f[5]), "CURVE", 5) && zmq_msg_size(&f[6]) == 32)
        user = user_of(z, zmq_msg_data(&f[6]));
    send_str(z->rep, "1.0", 1);
    if (n >= 2)
        zmq_send(z->rep, zmq_msg_data(&f[1]), zmq_msg_size(&f[1]), ZMQ_SNDMORE);
    else
        send_str(z->rep, "", 1);
    send_str(z->rep, user ? "200" : "400", 1);
    send_str(z->rep, user ? "OK" : "not a key of this job", 1);
    send_str(z->rep, user ? user : "", 1);
    send_str(z->rep, "", 0);
    if (user)
        __atomic_add_fetch(&z->admitted, 1, __ATOMIC_RELAXED);
    else
        refuse(z, addr, "its CURVE key is not a key of this job");
    for (int i = 0; i < n; i++)
        zmq_msg_close(&f[i]);
}

/* ---- monitors ---- */

uint64_t dh__zap_conn_ino(int fd)
{
    struct stat st;

    return fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode) ? (uint64_t)st.st_ino
                                                       : 0;
}

int dh__zap_conn_local(int fd)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);

    if (getpeername(fd, (struct sockaddr *)&ss, &sl) < 0)
        return 0;
    if (ss.ss_family == AF_UNIX)
        return 1;
    if (ss.ss_family == AF_INET)
        return (ntohl(((struct sockaddr_in *)&ss)->sin_addr.s_addr) >> 24) ==
               127;
    if (ss.ss_family == AF_INET6) {
        const struct in6_addr *a = &((struct sockaddr_in6 *)&ss)->sin6_addr;

        return IN6_IS_ADDR_LOOPBACK(a) ||
               (IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127);
    }
    return 0;
}

void dh__zap_conn_name(int fd, char *out, size_t cap)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    char host[INET6_ADDRSTRLEN] = "?";
    unsigned port = 0;

    snprintf(out, cap, "?");
    if (getpeername(fd, (struct sockaddr *)&ss, &sl) < 0)
        return;
    if (ss.ss_family == AF_INET) {
        struct sockaddr_in *a = (struct sockaddr_in *)&ss;

        inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
        port = ntohs(a->sin_port);
    } else if (ss.ss_family == AF_INET6) {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;

        inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
        port = ntohs(a->sin6_port);
    } else {
        struct dh_peer_cred pc;
        struct dh_err e;

        if (ss.ss_family == AF_UNIX && dh__peer_cred(fd, &pc, &e) == 0)
            snprintf(out, cap, "a local socket (pid %ld)", (long)pc.pid);
        else
            snprintf(out, cap, "a local socket");
        return;
    }
    snprintf(out, cap, "%s:%u", host, port);
}

/* The listener could not accept a connection (errno `err`): ZeroMQ
 * retries at once, so this comes in a burst.  Said once per
 * DH_ZAP_LOG_WINDOW_MS with the count, naming what to do. */
static void accept_failed(struct dh_zap *z, int err)
{
    uint64_t now = mono_ms();
    struct rlimit rl = {0, 0};

    z->accept_failed++;
    if (z->accept_log_ms && now - z->accept_log_ms < DH_ZAP_LOG_WINDOW_MS)
        return;
    z->accept_log_ms = now;
    (void)getrlimit(RLIMIT_NOFILE, &rl);
    dh__log(DH_LOG_WARN,
            "%s: cannot accept connections: %s (%llu times since the last "
            "such line)%s; open files limit %llu",
            z->who, strerror(err), (unsigned long long)z->accept_failed,
            err == EMFILE || err == ENFILE
                ? ": every file descriptor is in use - raise the limit "
                  "(ulimit -n) or find who holds so many connections"
                : "",
            (unsigned long long)rl.rlim_cur);
    z->accept_failed = 0;
}

/* Kept for dh__zap_closed(); when the table is full the oldest goes (its
 * owner then falls back on its own timeouts). */
static void note_closed(struct dh_zap *z, const struct zap_fd *s)
{
    pthread_mutex_lock(&z->mu);
    if (z->n_closed == DH_ZAP_MAX_CLOSED) {
        memmove(&z->closed[0], &z->closed[1],
                sizeof(z->closed[0]) * (DH_ZAP_MAX_CLOSED - 1));
        z->n_closed--;
    }
    z->closed[z->n_closed].fd = s->fd;
    z->closed[z->n_closed].ino = s->ino;
    _Static_assert(sizeof(z->closed[0].name) == sizeof(s->addr), "names");
    memcpy(z->closed[z->n_closed].name, s->addr, sizeof(s->addr));
    z->n_closed++;
    pthread_mutex_unlock(&z->mu);
}

int dh__zap_closed(struct dh_zap *z, struct dh_zap_conn *out, int cap)
{
    int n;

    pthread_mutex_lock(&z->mu);
    n = z->n_closed < cap ? z->n_closed : cap;
    memcpy(out, z->closed, sizeof(*out) * (size_t)n);
    memmove(&z->closed[0], &z->closed[n],
            sizeof(z->closed[0]) * (size_t)(z->n_closed - n));
    z->n_closed -= n;
    pthread_mutex_unlock(&z->mu);
    return n;
}

/* One monitor event; 0, or -1 once the monitor has stopped. */
static int serve_monitor(struct dh_zap *z, void *mon)
{
    zmq_msg_t ev, ep;
    uint16_t event = 0;
    uint32_t value = 0;
    int more = 0, rc = 0;
    size_t sz = sizeof(more);

    zmq_msg_init(&ev);
    if (zmq_msg_recv(&ev, mon, ZMQ_DONTWAIT) < 0) {
        zmq_msg_close(&ev);
        return 0;
    }
    if (zmq_msg_size(&ev) >= 6) {
        memcpy(&event, zmq_msg_data(&ev), 2);
        memcpy(&value, (uint8_t *)zmq_msg_data(&ev) + 2, 4);
    }
    zmq_msg_close(&ev);
    if (zmq_getsockopt(mon, ZMQ_RCVMORE, &more, &sz) == 0 && more) {
        zmq_msg_init(&ep);
        (void)zmq_msg_recv(&ep, mon, ZMQ_DONTWAIT);
        zmq_msg_close(&ep);
    }
    switch (event) {
    case ZMQ_EVENT_ACCEPTED: {
        struct zap_fd *s = &z->fds[value % ZAP_MAX_FDS];

        s->fd = (int)value;
        dh__zap_conn_name((int)value, s->addr, sizeof(s->addr));
        s->ino = dh__zap_conn_ino((int)value);
        break;
    }
    case ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL:
    case ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL:
        z->failed = 1;
        break;
    case ZMQ_EVENT_DISCONNECTED: {
        struct zap_fd *s = &z->fds[value % ZAP_MAX_FDS];

        if (z->failed)
            refuse(z, s->fd == (int)value ? s->addr : "?",
                   "the CURVE handshake failed (no key, or another job's)");
        z->failed = 0;
        if (s->fd == (int)value)
            note_closed(z, s);
        s->fd = -1;
        break;
    }
    case ZMQ_EVENT_ACCEPT_FAILED:
        accept_failed(z, (int)value);
        break;
    case ZMQ_EVENT_MONITOR_STOPPED:
        rc = -1;
        break;
    default:
        break;
    }
    return rc;
}

static void take_new_monitors(struct dh_zap *z)
{
    pthread_mutex_lock(&z->mu);
    for (int i = 0; i < z->n_new; i++) {
        if (z->n_mon < ZAP_MAX_MON)
            z->mon[z->n_mon++] = z->mon_new[i];
        else /* watch() counts both lists, so only in a race: not kept */
            zmq_close(z->mon_new[i]);
    }
    z->n_new = 0;
    pthread_mutex_unlock(&z->mu);
}

static void *zap_main(void *arg)
{
    struct dh_zap *z = arg;
    zmq_pollitem_t it[2 + ZAP_MAX_MON];

    while (!__atomic_load_n(&z->stop, __ATOMIC_ACQUIRE)) {
        int n = 1;

        take_new_monitors(z);
        it[0] = (zmq_pollitem_t){.socket = z->rep, .events = ZMQ_POLLIN};
        it[n++] = (zmq_pollitem_t){.socket = z->wake, .events = ZMQ_POLLIN};
        for (int i = 0; i < z->n_mon; i++)
            it[n++] = (zmq_pollitem_t){.socket = z->mon[i],
                                       .events = ZMQ_POLLIN};
        if (zmq_poll(it, n, ZAP_TICK_MS) <= 0)
            continue;
        if (it[0].revents & ZMQ_POLLIN)
            serve_request(z);
        if (it[1].revents & ZMQ_POLLIN) { /* taken at the loop's top */
            char b;

            while (zmq_recv(z->wake, &b, 1, ZMQ_DONTWAIT) >= 0)
                ;
        }
        for (int i = z->n_mon - 1; i >= 0; i--) {
            if (!(it[2 + i].revents & ZMQ_POLLIN) ||
                serve_monitor(z, z->mon[i]) == 0)
                continue;
            zmq_close(z->mon[i]);       /* its socket is gone */
            pthread_mutex_lock(&z->mu); /* watch() reads n_mon */
            z->mon[i] = z->mon[--z->n_mon];
            pthread_mutex_unlock(&z->mu);
        }
    }
    return NULL;
}

/* ---- lifetime ---- */

static void zap_free(struct dh_zap *z)
{
    /* Unbound first: a close frees an inproc name only once the socket is
     * reaped, and the next context user may bind it again at once. */
    if (z->rep) {
        zmq_unbind(z->rep, ZAP_ENDPOINT);
        zmq_close(z->rep);
    }
    if (z->wake) {
        zmq_unbind(z->wake, z->wake_ep);
        zmq_close(z->wake);
    }
    for (int i = 0; i < z->n_mon; i++)
        zmq_close(z->mon[i]);
    for (int i = 0; i < z->n_new; i++)
        zmq_close(z->mon_new[i]);
    pthread_mutex_destroy(&z->mu);
    memset(z->job, 0, sizeof(z->job));
    dh__free(z);
}

int dh__zap_start(void *ctx, const struct dh_keys *k, const char *who,
                  struct dh_zap **out, struct dh_err *e)
{
    struct dh_zap *z = dh__calloc(1, sizeof(*z));
    int zero = 0;

    if (!z)
        return dh_err_set(e, DH_ENOMEM, "out of memory");
    pthread_mutex_init(&z->mu, NULL);
    z->ctx = ctx;
    snprintf(z->who, sizeof(z->who), "%s", who ? who : "datahelix");
    for (int i = 0; i < ZAP_MAX_FDS; i++)
        z->fds[i].fd = -1;
    snprintf(z->wake_ep, sizeof(z->wake_ep), "inproc://datahelix-zap-wake-%u",
             next_seq());
    zmq_z85_decode(z->job, k->pub);
    for (int i = 0; i < k->n_admin; i++)
        zmq_z85_decode(z->admin[z->n_admin++], k->admin[i]);
    if (!(z->rep = zmq_socket(ctx, ZMQ_REP)) ||
        zmq_setsockopt(z->rep, ZMQ_LINGER, &zero, sizeof(zero)) < 0 ||
        zmq_bind(z->rep, ZAP_ENDPOINT) < 0 ||
        !(z->wake = zmq_socket(ctx, ZMQ_PULL)) ||
        zmq_setsockopt(z->wake, ZMQ_LINGER, &zero, sizeof(zero)) < 0 ||
        zmq_bind(z->wake, z->wake_ep) < 0) {
        int err = zmq_errno();

        zap_free(z);
        return dh_err_set(e, DH_EIO, "%s: cannot start the ZAP handler: %s",
                          who, zmq_strerror(err));
    }
    if (pthread_create(&z->th, NULL, zap_main, z) != 0) {
        zap_free(z);
        return dh_err_set(e, DH_EIO, "%s: cannot start the ZAP thread", who);
    }
    *out = z;
    return 0;
}

/* A short-lived PUSH of the caller's thread (sockets are not shared). */
static void wake(struct dh_zap *z)
{
    void *s = zmq_socket(z->ctx, ZMQ_PUSH);
    int linger = 100;

    if (!s)
        return; /* it looks at the list within a tick anyway */
    zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof(linger));
    if (zmq_connect(s, z->wake_ep) == 0)
        zmq_send(s, "w", 1, ZMQ_DONTWAIT);
    zmq_close(s);
}

int dh__zap_watch(struct dh_zap *z, void *sock, struct dh_err *e)
{
    char ep[64];
    void *mon = NULL;
    int zero = 0, rc = 0;

    pthread_mutex_lock(&z->mu);
    snprintf(ep, sizeof(ep), "inproc://datahelix-zap-mon-%u", next_seq());
    if (z->n_new + z->n_mon >= ZAP_MAX_MON) {
        rc = dh_err_set(e, DH_EIO, "%s: more than %d bound sockets watched",
                        z->who, ZAP_MAX_MON);
        goto out;
    }
    /* Connected here, before `sock` binds, so no event is lost. */
    if (zmq_socket_monitor(sock, ep, ZAP_MON_EVENTS) < 0 ||
        !(mon = zmq_socket(z->ctx, ZMQ_PAIR)) ||
        zmq_setsockopt(mon, ZMQ_LINGER, &zero, sizeof(zero)) < 0 ||
        zmq_connect(mon, ep) < 0) {
        rc = dh_err_set(e, DH_EIO, "%s: cannot monitor a socket: %s", z->who,
                        zmq_strerror(zmq_errno()));
        if (mon)
            zmq_close(mon);
        goto out;
    }
    z->mon_new[z->n_new++] = mon;
out:
    pthread_mutex_unlock(&z->mu);
    if (rc == 0)
        wake(z); /* so it polls the monitor before the first accept */
    return rc;
}

void dh__zap_stop(struct dh_zap *z)
{
    if (!z)
        return;
    __atomic_store_n(&z->stop, 1, __ATOMIC_RELEASE);
    pthread_join(z->th, NULL);
    zap_free(z);
}

uint64_t dh__zap_refused(const struct dh_zap *z)
{
    return z ? __atomic_load_n(&z->refused, __ATOMIC_RELAXED) : 0;
}

uint64_t dh__zap_admitted(const struct dh_zap *z)
{
    return z ? __atomic_load_n(&z->admitted, __ATOMIC_RELAXED) : 0;
}
