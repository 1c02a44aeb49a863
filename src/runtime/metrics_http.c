/*
 * metrics_http.c - the metrics endpoint's HTTP server (metrics_http.h).
 *
 * Design: we bind and listen ourselves (so a busy or foreign address is
 * reported with its errno, and port 0 resolves), then hand the socket to
 * libmicrohttpd, which runs one internal polling thread (epoll on Linux)
 * with non-blocking I/O: a slow or hostile client holds one of
 * MAX_CONNS connections until timeout_s, never the thread.  Each GET
 * /metrics calls the render callback, which copies a published snapshot
 * and formats it (coordinator_metrics.c), so the Coordinator's event loop
 * is never involved.  Only GET and HEAD of /metrics are served: other
 * paths 404, other methods 405, a missing or wrong token 401.
 *
 * Slowloris (issue 36 item 7): libmicrohttpd's timeout is an idle one, so a
 * client that sends a byte now and then holds its connection for ever.
 * Every request must therefore be whole - headers and body, from the
 * connection's start or the previous reply - within DEADLINE_MS, or a
 * sweeper thread shuts the socket down (libmicrohttpd then closes it).
 * One address holds at most MAX_CONNS_PER_IP connections, and addresses
 * other than loopback together at most MAX_CONNS - LOOPBACK_RESERVED (the
 * accept policy), so local scrapes (Prometheus' node agent, `datahelix
 * top`) always find a slot however many hosts stall.
 *
 * Locking: libmicrohttpd serialises its callbacks on its thread; the
 * connection table (`mu`) is shared with the sweeper, which only ever
 * shuts down a socket still in the table: libmicrohttpd reports a
 * connection closed (removing it, under `mu`) before it closes the fd.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/log.h"
#include "runtime/metrics_http.h"

#define MAX_CONNS 32
#define MAX_CONNS_PER_IP 8  /* one host cannot take every slot */
#define LOOPBACK_RESERVED 4 /* slots only loopback peers may take */
#define DEADLINE_MS                                                            \
    5000 /* a whole request, from the connection's
                                  start or the previous reply */
#define SWEEP_MS 200
#define HEADER_MEM (16u << 10) /* per connection: headers beyond it: 431 */
#define CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

/* A connection libmicrohttpd holds (its socket context). */
struct conn {
    int used, fd, loopback, answered, shut;
    uint64_t since_ms; /* its start, or its last reply's end */
};

struct dh_mhttp {
    struct MHD_Daemon *d;
    pthread_mutex_t mu;
    pthread_t sweeper;
    int sweeping, stop;               /* stop: atomic */
    struct conn conns[MAX_CONNS + 8]; /* > MAX_CONNS: a closing one's */
    uint64_t cut, log_ms;             /* under mu */
    int fd;
    char addr[300];
    char token[DH_MHTTP_TOKEN_MAX + 1];
    size_t token_len;
    dh_mhttp_render render;
    void *ctx;
};

/* ---- addresses ---- */

/* Splits "HOST:PORT" / "[V6]:PORT" into host and port. */
static int split(const char *in, char *host, size_t cap, const char **port)
{
    const char *colon;
    size_t n;

    if (!strncmp(in, "http://", 7))
        in += 7;
    if (in[0] == '[') {
        const char *end = strchr(in, ']');

        if (!end || end[1] != ':')
            return -1;
        n = (size_t)(end - in - 1);
        in++;
        colon = end + 1;
    } else {
        if (!(colon = strrchr(in, ':')))
            return -1;
        n = (size_t)(colon - in);
    }
    if (n == 0 || n >= cap || !colon[1])
        return -1;
    memcpy(host, in, n);
    host[n] = '\0';
    *port = colon + 1;
    return 0;
}

static int is_loopback(const struct sockaddr *sa)
{
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *v4 = (const struct sockaddr_in *)sa;

        return (ntohl(v4->sin_addr.s_addr) >> 24) == 127;
    }
    if (sa->sa_family == AF_INET6) {
        const struct in6_addr *a =
            &((const struct sockaddr_in6 *)sa)->sin6_addr;

        return IN6_IS_ADDR_LOOPBACK(a) ||
               (IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127);
    }
    return 0;
}

/* The bind's policy (docs/security.md): loopback, or a token, or
 * --insecure with a warning naming what anyone reaching it can read. */
static int check_exposure(const struct dh_mhttp_opts *o,
                          const struct sockaddr *sa, struct dh_err *e)
{
    if (is_loopback(sa) || (o->token && o->token[0]))
        return 0;
    if (!o->insecure)
        return dh_err_set(
            e, DH_EINVAL,
            "metrics: refusing to listen on %s without a token: anyone who "
            "can reach that address could read the job's metrics (server "
            "addresses, ranks, rates).  Give --metrics-token-file FILE, or "
            "--insecure to accept that",
            o->listen);
    dh__log(DH_LOG_WARN,
            "metrics: listening on %s without a token "
            "(--insecure): anyone who can reach that address can read this "
            "job's metrics (DataServer addresses, ranks, queue depths, "
            "rates, error counts)",
            o->listen);
    return 0;
}

static int open_listener(struct dh_mhttp *h, const struct dh_mhttp_opts *o,
                         struct dh_err *e)
{
    char host[256], shown[INET6_ADDRSTRLEN];
    const char *port;
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *ai = NULL;
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    int one = 1, rc, fd = -1;

    if (split(o->listen, host, sizeof(host), &port) < 0)
        return dh_err_set(e, DH_EINVAL,
                          "metrics: '%s' is not HOST:PORT (IPv6 as "
                          "[ADDR]:PORT)",
                          o->listen);
    if ((rc = getaddrinfo(host, port, &hints, &ai)) != 0)
        return dh_err_set(e, DH_EINVAL, "metrics: cannot resolve %s: %s",
                          o->listen, gai_strerror(rc));
    if ((rc = check_exposure(o, ai->ai_addr, e)) < 0)
        goto out;
    fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, 0);
    if (fd < 0 ||
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) < 0 ||
        bind(fd, ai->ai_addr, ai->ai_addrlen) < 0 || listen(fd, 64) < 0 ||
        getsockname(fd, (struct sockaddr *)&ss, &sl) < 0) {
        rc = dh_err_set(e, DH_EIO, "metrics: cannot listen on %s: %s",
                        o->listen, strerror(errno));
        goto out;
    }
    if (ss.ss_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)&ss;

        inet_ntop(AF_INET6, &a->sin6_addr, shown, sizeof(shown));
        snprintf(h->addr, sizeof(h->addr), "[%s]:%u", shown,
                 ntohs(a->sin6_port));
    } else {
        const struct sockaddr_in *a = (const struct sockaddr_in *)&ss;

        inet_ntop(AF_INET, &a->sin_addr, shown, sizeof(shown));
        snprintf(h->addr, sizeof(h->addr), "%s:%u", shown, ntohs(a->sin_port));
    }
    h->fd = fd;
    fd = -1;
    rc = 0;
out:
    if (fd >= 0)
        close(fd);
    freeaddrinfo(ai);
    return rc;
}

/* ---- requests ---- */

/* Equal in time independent of where they differ (length aside). */
static int token_ok(const struct dh_mhttp *h, const char *auth)
{
    static const char pre[] = "Bearer ";
    size_t n;
    unsigned diff = 0;

    if (!auth || strncmp(auth, pre, sizeof(pre) - 1))
        return 0;
    auth += sizeof(pre) - 1;
    n = strlen(auth);
    diff = (unsigned)(n != h->token_len);
    for (size_t i = 0; i < h->token_len; i++)
        diff |= (unsigned)(unsigned char)h->token[i] ^
                (unsigned)(unsigned char)(i < n ? auth[i] : 0);
    return diff == 0;
}

/* ---- the connection table (slowloris) ---- */

static uint64_t mono_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* Refuses a peer other than loopback when the others hold every slot but
 * the reserved ones. */
static enum MHD_Result on_accept(void *cls, const struct sockaddr *addr,
                                 socklen_t len)
{
    struct dh_mhttp *h = cls;
    int others = 0;

    (void)len;
    if (!addr || is_loopback(addr))
        return MHD_YES;
    pthread_mutex_lock(&h->mu);
    for (size_t i = 0; i < sizeof(h->conns) / sizeof(h->conns[0]); i++)
        others += h->conns[i].used && !h->conns[i].loopback;
    pthread_mutex_unlock(&h->mu);
    return others < MAX_CONNS - LOOPBACK_RESERVED ? MHD_YES : MHD_NO;
}

static void on_connection(void *cls, struct MHD_Connection *conn,
                          void **socket_context,
                          enum MHD_ConnectionNotificationCode toe)
{
    struct dh_mhttp *h = cls;
    const union MHD_ConnectionInfo *fd = MHD_get_connection_info(
        conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    const union MHD_ConnectionInfo *peer = MHD_get_connection_info(
        conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    struct conn *c = *socket_context;

    pthread_mutex_lock(&h->mu);
    if (toe == MHD_CONNECTION_NOTIFY_CLOSED && c) {
        c->used = 0;
        *socket_context = NULL;
    }
    for (size_t i = 0; toe == MHD_CONNECTION_NOTIFY_STARTED && !c &&
                       i < sizeof(h->conns) / sizeof(h->conns[0]);
         i++)
        if (!h->conns[i].used) {
            c = &h->conns[i];
            *c = (struct conn){.used = 1,
                               .fd = fd ? fd->connect_fd : -1,
                               .loopback = peer && peer->client_addr &&
                                           is_loopback(peer->client_addr),
                               .since_ms = mono_ms()};
            *socket_context = c;
        }
    pthread_mutex_unlock(&h->mu);
}

/* A reply was queued on `conn` (it met its deadline), or completed (the
 * next request's deadline starts). */
static void mark(struct dh_mhttp *h, struct MHD_Connection *conn, int answered)
{
    const union MHD_ConnectionInfo *i = MHD_get_connection_info(
        conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    struct conn *c = i ? i->socket_context : NULL;

    if (!c)
        return;
    pthread_mutex_lock(&h->mu);
    c->answered = answered;
    if (!answered)
        c->since_ms = mono_ms();
    pthread_mutex_unlock(&h->mu);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **state,
                         enum MHD_RequestTerminationCode toe)
{
    (void)state;
    (void)toe;
    mark(cls, conn, 0);
}

static void *sweep(void *arg)
{
    struct dh_mhttp *h = arg;
    struct timespec ts = {0, SWEEP_MS * 1000000L};

    while (!__atomic_load_n(&h->stop, __ATOMIC_ACQUIRE)) {
        uint64_t now = mono_ms(), cut = 0;

        pthread_mutex_lock(&h->mu);
        for (size_t i = 0; i < sizeof(h->conns) / sizeof(h->conns[0]); i++) {
            struct conn *c = &h->conns[i];

            if (c->used && !c->answered && !c->shut && c->fd >= 0 &&
                now - c->since_ms > DEADLINE_MS) {
                shutdown(c->fd, SHUT_RDWR); /* libmicrohttpd closes it */
                c->shut = 1;
                cut++;
            }
        }
        h->cut += cut;
        if (h->cut && now - h->log_ms >= 10000) {
            dh__log(DH_LOG_WARN,
                    "metrics: closed %llu connections that sent no whole "
                    "request within %d ms (a slow or stalled client)",
                    (unsigned long long)h->cut, DEADLINE_MS);
            h->cut = 0;
            h->log_ms = now;
        }
        pthread_mutex_unlock(&h->mu);
        nanosleep(&ts, NULL);
    }
    return NULL;
}

static enum MHD_Result reply(struct dh_mhttp *h, struct MHD_Connection *conn,
                             unsigned status, char *body, size_t len, int owned)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(
        len, body, owned ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
    enum MHD_Result ok;

    if (!r) {
        if (owned)
            free(body);
        return MHD_NO;
    }
    if (status == MHD_HTTP_OK)
        MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, CONTENT_TYPE);
    else
        MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE,
                                "text/plain; charset=utf-8");
    if (status == MHD_HTTP_UNAUTHORIZED)
        MHD_add_response_header(r, MHD_HTTP_HEADER_WWW_AUTHENTICATE,
                                "Bearer realm=\"datahelix\"");
    if (status == MHD_HTTP_METHOD_NOT_ALLOWED)
        MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
    ok = MHD_queue_response(conn, status, r);
    MHD_destroy_response(r);
    if (ok == MHD_YES)
        mark(h, conn, 1);
    return ok;
}

static char *lit(const char *s)
{
    return (char *)(uintptr_t)s; /* MHD_RESPMEM_PERSISTENT: never written */
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn,
                                  const char *url, const char *method,
                                  const char *version, const char *upload,
                                  size_t *upload_len, void **state)
{
    static const char m401[] = "unauthorized: a bearer token is needed\n";
    static const char m404[] = "not found: the metrics are at /metrics\n";
    static const char m405[] = "method not allowed: GET /metrics\n";
    static const char m500[] = "metrics unavailable\n";
    struct dh_mhttp *h = cls;
    char *body = NULL;
    size_t len = 0;

    (void)version;
    (void)upload;
    if (!*state) { /* first call: headers only; answer on the next */
        *state = h;
        return MHD_YES;
    }
    if (*upload_len) { /* a body is never wanted: discard it */
        *upload_len = 0;
        return MHD_YES;
    }
    if (h->token_len &&
        !token_ok(h, MHD_lookup_connection_value(
                         conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION)))
        return reply(h, conn, MHD_HTTP_UNAUTHORIZED, lit(m401),
                     sizeof(m401) - 1, 0);
    if (strcmp(method, MHD_HTTP_METHOD_GET) &&
        strcmp(method, MHD_HTTP_METHOD_HEAD))
        return reply(h, conn, MHD_HTTP_METHOD_NOT_ALLOWED, lit(m405),
                     sizeof(m405) - 1, 0);
    if (strcmp(url, "/metrics"))
        return reply(h, conn, MHD_HTTP_NOT_FOUND, lit(m404), sizeof(m404) - 1,
                     0);
    if (h->render(h->ctx, &body, &len) < 0)
        return reply(h, conn, MHD_HTTP_INTERNAL_SERVER_ERROR, lit(m500),
                     sizeof(m500) - 1, 0);
    return reply(h, conn, MHD_HTTP_OK, body, len, 1);
}

/* ---- lifetime ---- */

int dh__mhttp_start(const struct dh_mhttp_opts *o, struct dh_mhttp **out,
                    struct dh_err *e)
{
    struct dh_mhttp *h;
    int rc;

    if (!o || !o->listen || !o->render || !out)
        return dh_err_set(e, DH_EINVAL, "metrics: no address or renderer");
    if (o->token && strlen(o->token) > DH_MHTTP_TOKEN_MAX)
        return dh_err_set(e, DH_EINVAL, "metrics: token over %d bytes",
                          DH_MHTTP_TOKEN_MAX);
    if (!(h = dh__calloc(1, sizeof(*h))))
        return dh_err_set(e, DH_ENOMEM, "metrics: out of memory");
    pthread_mutex_init(&h->mu, NULL);
    h->fd = -1;
    h->render = o->render;
    h->ctx = o->ctx;
    if (o->token) {
        h->token_len = strlen(o->token);
        memcpy(h->token, o->token, h->token_len);
    }
    if ((rc = open_listener(h, o, e)) < 0)
        goto fail;
    h->d = MHD_start_daemon(
        MHD_USE_AUTO_INTERNAL_THREAD, 0, on_accept, h, on_request, h,
        MHD_OPTION_LISTEN_SOCKET, h->fd, MHD_OPTION_CONNECTION_LIMIT,
        (unsigned)MAX_CONNS, MHD_OPTION_PER_IP_CONNECTION_LIMIT,
        (unsigned)MAX_CONNS_PER_IP, MHD_OPTION_CONNECTION_TIMEOUT,
        (unsigned)(o->timeout_s > 0 ? o->timeout_s : 5),
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)HEADER_MEM,
        MHD_OPTION_NOTIFY_CONNECTION, on_connection, h,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, h, MHD_OPTION_END);
    if (!h->d) {
        rc = dh_err_set(e, DH_EIO,
                        "metrics: cannot start the HTTP server on %s", h->addr);
        goto fail;
    }
    h->fd = -1; /* the daemon's now: MHD_stop_daemon closes it */
    if (pthread_create(&h->sweeper, NULL, sweep, h) != 0) {
        rc = dh_err_set(e, DH_EIO, "metrics: cannot start a thread");
        goto fail;
    }
    h->sweeping = 1;
    *out = h;
    return 0;
fail:
    if (h->d)
        MHD_stop_daemon(h->d);
    if (h->fd >= 0)
        close(h->fd);
    pthread_mutex_destroy(&h->mu);
    dh__free(h);
    return rc;
}

const char *dh__mhttp_addr(const struct dh_mhttp *h)
{
    return h->addr;
}

void dh__mhttp_stop(struct dh_mhttp *h)
{
    if (!h)
        return;
    if (h->sweeping) { /* before the daemon: it shuts sockets down */
        __atomic_store_n(&h->stop, 1, __ATOMIC_RELEASE);
        pthread_join(h->sweeper, NULL);
    }
    if (h->d) /* joins its thread, closes the connections and the socket */
        MHD_stop_daemon(h->d);
    pthread_mutex_destroy(&h->mu);
    memset(h->token, 0, sizeof(h->token));
    dh__free(h);
}

/* ---- the token file ---- */

int dh__mhttp_load_token(const char *path, char *buf, size_t cap,
                         struct dh_err *e)
{
    struct stat st;
    char tmp[DH_MHTTP_TOKEN_MAX + 2];
    ssize_t n;
    size_t len = 0;
    int fd = open(path,
                  O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY | O_NONBLOCK),
        rc = 0;

    if (fd < 0)
        return dh_err_set(e, DH_EIO, "token file %s: cannot open: %s", path,
                          strerror(errno));
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        rc = dh_err_set(e, DH_EINVAL, "token file %s: not a regular file",
                        path);
        goto out;
    }
    if (st.st_uid != geteuid() || (st.st_mode & 077)) {
        rc = dh_err_set(e, DH_EINVAL,
                        "token file %s: must be owned by this user and not "
                        "readable by group or others (mode %04o): refused "
                        "(chmod 600 %s)",
                        path, (unsigned)(st.st_mode & 07777), path);
        goto out;
    }
    while (len < sizeof(tmp) - 1 &&
           (n = read(fd, tmp + len, sizeof(tmp) - 1 - len)) != 0) {
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            rc = dh_err_set(e, DH_EIO, "token file %s: %s", path,
                            strerror(errno));
            goto out;
        }
        len += (size_t)n;
    }
    tmp[len] = '\0';
    len = strcspn(tmp, "\r\n");
    tmp[len] = '\0';
    for (size_t i = 0; i < len && rc == 0; i++)
        if (tmp[i] <= ' ' || tmp[i] > '~')
            rc = dh_err_set(e, DH_EINVAL,
                            "token file %s: byte %zu is not a printable "
                            "character other than space",
                            path, i);
    if (rc == 0 && (len < 16 || len > DH_MHTTP_TOKEN_MAX || len >= cap))
        rc = dh_err_set(e, DH_EINVAL,
                        "token file %s: the token on its first line must be "
                        "16..%d bytes, not %zu",
                        path, DH_MHTTP_TOKEN_MAX, len);
    if (rc == 0)
        memcpy(buf, tmp, len + 1);
out:
    memset(tmp, 0, sizeof(tmp));
    close(fd);
    return rc;
}
