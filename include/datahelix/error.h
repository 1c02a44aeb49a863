/*
 * datahelix/error.h - error codes and the caller-owned error buffer.
 *
 * Every fallible function returns 0 or a negative DH_E* code.  Functions that
 * can say more than a code also take a `struct dh_err *` into which they write
 * a one-line human message naming the file / sample / address and the cause.
 * The message never ends with a newline.  A NULL `struct dh_err *` is allowed
 * everywhere and means "code only".
 *
 * Thread-safety: all functions here are thread-safe (no shared state).
 */
#ifndef DATAHELIX_ERROR_H
#define DATAHELIX_ERROR_H

#include <stddef.h>

#include "datahelix/export.h"

#if defined(__GNUC__)
#define DH_MUST_CHECK __attribute__((warn_unused_result))
#define DH_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define DH_MUST_CHECK
#define DH_PRINTF(f, a)
#endif

/* One table drives the enum and dh_strerror() (libuv style). */
#define DH_ERRNO_MAP(X)                                                        \
    X(NOMEM, 1, "out of memory")                                               \
    X(INVAL, 2, "invalid argument")                                            \
    X(IO, 3, "input/output error")                                             \
    X(FORMAT, 4, "malformed input")                                            \
    X(MEDIA, 5, "media could not be read")                                     \
    X(NOTFOUND, 6, "not found")                                                \
    X(TOOBIG, 7, "value or size over its limit")                               \
    X(VERSION, 8, "unsupported format version")                                \
    X(CHECKSUM, 9, "checksum mismatch")                                        \
    X(DUP, 10, "duplicate")                                                    \
    X(NOTIMPL, 11, "not implemented")                                          \
    X(EMPTY, 12, "nothing to do")                                              \
    X(UNSUPPORTED, 13, "unsupported")                                          \
    X(TIMEOUT, 14, "timed out")                                                \
    X(PEERDEAD, 15, "peer closed the connection or died")                      \
    X(SAMPLE, 16, "a sample could not be prepared")                            \
    X(ARENA, 17, "arena exhausted")                                            \
    X(PROTO, 18, "protocol error: a malformed message from a peer")

enum dh_errno {
    DH_OK = 0,
#define DH_ERR_ENUM_(name, val, text) DH_E##name = -(val),
    DH_ERRNO_MAP(DH_ERR_ENUM_)
#undef DH_ERR_ENUM_
};

/* Static text for a code; never NULL, unknown codes give "unknown error". */
DH_API const char *dh_strerror(int code);

#define DH_ERR_MSG_MAX 512

/* Caller-owned.  `code` is the last code recorded, `msg` its message. */
struct dh_err {
    int code;
    char msg[DH_ERR_MSG_MAX];
};

/* Clears `e` (code 0, empty message).  Accepts NULL. */
DH_API void dh_err_clear(struct dh_err *e);

/*
 * Records `code` and a printf-style message into `e` (truncated to fit) and
 * returns `code`, so that error paths read `return dh_err_set(e, DH_EIO, ...)`.
 * Accepts e == NULL.
 */
DH_API int dh_err_set(struct dh_err *e, int code, const char *fmt, ...)
    DH_PRINTF(3, 4);

#endif
