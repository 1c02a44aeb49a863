/*
 * http_retry.c - retry timing and ranged answers (see http_retry.h).  Pure.
 */
#include "core/http_retry.h"

#include <ctype.h>
#include <string.h>
#include <strings.h>

int dh__http_status_retryable(long status)
{
    if (status == 408 || status == 429)
        return 1;
    return status >= 500 && status <= 599 && status != 501 && status != 505;
}

int64_t dh__http_backoff_ms(int attempt, uint64_t rnd, int64_t retry_after_ms)
{
    int64_t cap = DH_HTTP_BACKOFF_BASE_MS, d;

    for (int i = 1; i < attempt && cap < DH_HTTP_BACKOFF_CAP_MS; i++)
        cap *= 2;
    if (cap > DH_HTTP_BACKOFF_CAP_MS)
        cap = DH_HTTP_BACKOFF_CAP_MS;
    d = (int64_t)(rnd % (uint64_t)(cap + 1));
    if (retry_after_ms > d)
        d = retry_after_ms < DH_HTTP_RETRY_AFTER_MAX_MS
                ? retry_after_ms
                : DH_HTTP_RETRY_AFTER_MAX_MS;
    return d;
}

/* A decimal number of at most 18 digits at *p (moved past it): 0, or -1. */
static int number(const char **p, int64_t *out)
{
    int64_t v = 0;
    int n = 0;

    while (isdigit((unsigned char)**p)) {
        if (++n > 18)
            return -1;
        v = v * 10 + (**p - '0');
        (*p)++;
    }
    if (!n)
        return -1;
    *out = v;
    return 0;
}

static const char *blanks(const char *p)
{
    while (*p == ' ' || *p == '\t')
        p++;
    return p;
}

/* Only trailing blanks (or the CRLF of a header line) are left. */
static int at_end(const char *p)
{
    return !p[strspn(p, " \t\r\n")];
}

int64_t dh__http_retry_after_ms(const char *value)
{
    const char *p;
    int64_t s;

    if (!value)
        return -1;
    p = blanks(value);
    if (number(&p, &s) || !at_end(p) || s > 86400)
        return -1;
    return s * 1000;
}

int dh__http_content_range(const char *value, int64_t *first, int64_t *last,
                           int64_t *total)
{
    const char *p = blanks(value);

    if (strncasecmp(p, "bytes", 5))
        return -1;
    p = blanks(p + 5);
    if (number(&p, first) || *p++ != '-' || number(&p, last) || *p++ != '/')
        return -1;
    if (*p == '*') {
        *total = -1;
        p++;
    } else if (number(&p, total)) {
        return -1;
    }
    if (!at_end(p) || *last < *first || (*total >= 0 && *last >= *total))
        return -1;
    return 0;
}
