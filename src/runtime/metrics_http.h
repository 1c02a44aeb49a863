/*
 * metrics_http.h - the Coordinator's metrics endpoint: one HTTP server
 * (libmicrohttpd, its own thread) answering GET /metrics with the text a
 * render callback returns (docs/metrics.md; issue 18 item 3).
 *
 * Trust (docs/security.md): a loopback bind needs nothing; any other is
 * refused unless a bearer token is set (every request must then carry
 * "Authorization: Bearer TOKEN", compared in constant time; a token also
 * binds a loopback endpoint) or insecure is set (warned on stderr,
 * naming what is exposed).  Bounds: 32 connections (16 per client
 * address), an idle connection closed after timeout_s, request headers
 * within a fixed memory budget (431 and the connection closed beyond).
 *
 * Thread-safety: start / stop from one thread; the render callback runs
 * on the server's thread.
 */
#ifndef DH_RUNTIME_METRICS_HTTP_H
#define DH_RUNTIME_METRICS_HTTP_H

#include <stddef.h>

#include "datahelix/error.h"

#define DH_MHTTP_DEFAULT_LISTEN "127.0.0.1:9464"
#define DH_MHTTP_TOKEN_MAX 512 /* bytes of a bearer token */

/* Writes the body into a buffer it allocates with malloc (*out, *len);
 * the server frees it.  0, or a negative code (answered 500). */
typedef int (*dh_mhttp_render)(void *ctx, char **out, size_t *len);

struct dh_mhttp_opts {
    const char *listen; /* "HOST:PORT" (IPv6 as [ADDR]:PORT; port 0: any) */
    const char *token;  /* bearer token, NULL: none */
    int insecure;       /* 1: a non-loopback bind without a token (warned) */
    int timeout_s;      /* idle connection timeout (0: 5 s) */
    dh_mhttp_render render;
    void *ctx;
};

struct dh_mhttp; /* opaque */

/*
 * Binds o->listen and starts serving.  On success *out owns the server
 * (dh__mhttp_stop); on error *out is untouched and `e` names the address
 * and the cause: DH_EINVAL (bad address, a refused bind), DH_EIO (cannot
 * bind: busy, not local), DH_ENOMEM.
 */
int dh__mhttp_start(const struct dh_mhttp_opts *o, struct dh_mhttp **out,
                    struct dh_err *e) DH_MUST_CHECK;

/* "127.0.0.1:9464", the port resolved.  Borrowed until stop. */
const char *dh__mhttp_addr(const struct dh_mhttp *h);

/* Stops the thread, closes every connection, frees.  Accepts NULL. */
void dh__mhttp_stop(struct dh_mhttp *h);

/*
 * Reads a bearer token from `path`: a regular file of this user that
 * group and others cannot read (as the job key file, docs/security.md),
 * its first line, 16..DH_MHTTP_TOKEN_MAX printable bytes, stripped of the
 * newline.  0, or DH_EIO / DH_EINVAL naming the file and the cause.
 */
int dh__mhttp_load_token(const char *path, char *buf, size_t cap,
                         struct dh_err *e) DH_MUST_CHECK;

#endif
