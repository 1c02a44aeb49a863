/*
 * log.c - log lines with a level (see log.h).  The threshold is read
 * from $DATAHELIX_LOG once per process; a value it does not know is said
 * once (by the first line written), and info is used.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <errno.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "core/log.h"

#define LINE_MAX_BYTES 4096

static pthread_once_t once = PTHREAD_ONCE_INIT;
static int threshold = DH_LOG_INFO;
static const char *job;       /* $DATAHELIX_JOB, or NULL */
static _Atomic int bad_level; /* $DATAHELIX_LOG was something else */

static const char *const names[] = {"debug", "info", "warn", "error"};

const char *dh__log_level_name(enum dh_log_level l)
{
    return (unsigned)l < 4 ? names[l] : "info";
}

static void read_env(void)
{
    const char *s = getenv("DATAHELIX_LOG");
    const char *j = getenv("DATAHELIX_JOB");

    job = j && *j ? j : NULL;
    if (!s || !*s)
        return;
    for (int i = 0; i < 4; i++)
        if (!strcasecmp(s, names[i])) {
            threshold = i;
            return;
        }
    if (!strcasecmp(s, "warning"))
        threshold = DH_LOG_WARN;
    else
        atomic_store(&bad_level, 1); /* said once, by the first line */
}

int dh__log_on(enum dh_log_level l)
{
    pthread_once(&once, read_env);
    return (int)l >= threshold;
}

/* All of buf[0..n) to stderr; a short write is retried, an error ends it
 * (nobody to tell). */
static void put(const char *buf, size_t n)
{
    while (n > 0) {
        ssize_t w = write(STDERR_FILENO, buf, n);

        if (w <= 0)
            return;
        buf += w;
        n -= (size_t)w;
    }
}

/* A line is one line: a newline or another control byte in what it
 * quotes (a sample's path, a peer's words) is written escaped (\n, \r,
 * \t, \xHH), so no path can forge a line of its own (issue 36 item 8).
 * In place from `in` to `out` (cap bytes, NUL-terminated). */
void dh__log_escape(const char *in, char *out, size_t cap)
{
    static const char hex[] = "0123456789abcdef";
    size_t o = 0;

    for (; *in && o + 5 < cap; in++) {
        unsigned char c = (unsigned char)*in;

        if (c >= 0x20 && c != 0x7f) {
            out[o++] = (char)c;
            continue;
        }
        out[o++] = '\\';
        if (c == '\n' || c == '\r' || c == '\t') {
            out[o++] = c == '\n' ? 'n' : c == '\r' ? 'r' : 't';
        } else {
            out[o++] = 'x';
            out[o++] = hex[c >> 4];
            out[o++] = hex[c & 15];
        }
    }
    out[o] = '\0';
}

void dh__log_vformat(char *out, size_t cap, const char *fmt, va_list ap)
{
    char raw[LINE_MAX_BYTES];

    vsnprintf(raw, sizeof(raw), fmt, ap);
    dh__log_escape(raw, out, cap);
}

int dh__log_flush(FILE *f, int *said, const char *who, const char *what)
{
    int err = fflush(f) != 0 ? errno : 0;

    if (!err && !ferror(f))
        return 0;
    if (!*said) {
        *said = 1;
        dh__log(DH_LOG_WARN,
                "%s: %s: a write failed (%s): its records from here on are "
                "lost; the run goes on",
                who, what, err ? strerror(err) : "a stream error");
    }
    return -1;
}

void dh__vlog(enum dh_log_level l, const char *fmt, va_list ap)
{
    char msg[LINE_MAX_BYTES], line[LINE_MAX_BYTES + 64];
    const char *cut;
    int n;

    if (!dh__log_on(l))
        return;
    if (atomic_load(&bad_level) && atomic_exchange(&bad_level, 0)) {
        dh__log(DH_LOG_WARN,
                "log: DATAHELIX_LOG='%s' is not debug, info, warn or error; "
                "using info",
                getenv("DATAHELIX_LOG"));
    }
    dh__log_vformat(msg, sizeof(msg), fmt, ap);
    cut = strstr(msg, ": ");
    if (cut)
        n = snprintf(line, sizeof(line), "datahelix: %s%s%s%.*s: %s: %s\n",
                     job ? "[" : "", job ? job : "", job ? "] " : "",
                     (int)(cut - msg), msg, dh__log_level_name(l), cut + 2);
    else
        n = snprintf(line, sizeof(line), "datahelix: %s%s%s%s: %s\n",
                     job ? "[" : "", job ? job : "", job ? "] " : "",
                     dh__log_level_name(l), msg);
    if (n < 0)
        return;
    if ((size_t)n >= sizeof(line)) {
        n = (int)sizeof(line) - 1;
        line[n - 1] = '\n';
    }
    put(line, (size_t)n);
}

void dh__log(enum dh_log_level l, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    dh__vlog(l, fmt, ap);
    va_end(ap);
}
