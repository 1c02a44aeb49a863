/*
 * log.h - the one place the library's processes write their log lines
 * (issue 18 item 5; docs/usage.md "Logs").
 *
 * A line is `datahelix: WHO: LEVEL: MESSAGE` on stderr, written with one
 * write(2) so that lines of different threads never interleave; with
 * $DATAHELIX_JOB set, `datahelix: [JOB] WHO: LEVEL: MESSAGE`.  WHO names
 * the process and its rank or server ("coordinator", "dataserver 3",
 * "client 0").  $DATAHELIX_LOG = debug | info (default) | warn | error
 * selects the lowest level written; events that matter (a server joined,
 * left or declared dead, a task re-routed, an error, a restart) are info or
 * above, and nothing per batch is above debug.
 */
#ifndef DH_CORE_LOG_H
#define DH_CORE_LOG_H

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>

#include "datahelix/error.h"

enum dh_log_level {
    DH_LOG_DEBUG = 0,
    DH_LOG_INFO = 1,
    DH_LOG_WARN = 2,
    DH_LOG_ERROR = 3,
};

/* 1 if a line of level `l` is written ($DATAHELIX_LOG, read once). */
int dh__log_on(enum dh_log_level l);

/* Writes one line of level `l`.  fmt starts with "WHO: " (the first ": "
 * of the formatted text ends WHO; the level goes after it); a trailing
 * newline is added.  Lines over 4 KiB are cut. */
void dh__log(enum dh_log_level l, const char *fmt, ...) DH_PRINTF(2, 3);
/* `in` with newlines and other control bytes escaped (\n, \r, \t, \xHH)
 * into `out` (cap bytes, NUL-terminated, cut to fit): what a log or error
 * line quotes (a path, a peer's words) cannot start a line of its own. */
void dh__log_escape(const char *in, char *out, size_t cap);
/* vsnprintf, then dh__log_escape: one line's text, safe to write. */
void dh__log_vformat(char *out, size_t cap, const char *fmt, va_list ap);

/* fflush(f) and its error state: the first failure of a stream that
 * cannot fail silently (telemetry, a trace) is said once, as a warning
 * naming `who` and `what`, and *said is set; later ones stay quiet.
 * 0, or -1 when the stream failed (now or before). */
int dh__log_flush(FILE *f, int *said, const char *who, const char *what);
void dh__vlog(enum dh_log_level l, const char *fmt, va_list ap);

/* "debug", "info", "warn", "error". */
const char *dh__log_level_name(enum dh_log_level l);

#endif
