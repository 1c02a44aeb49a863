/*
 * http_retry.h - when and how long a remote read waits before it tries
 * again, and what a ranged answer says (internal, pure: no I/O, no clock;
 * the HTTP backend, media/source_http.c, does the requests).
 *
 * Retries follow AWS's guidance for S3 and any HTTP store: exponential
 * backoff with full jitter (a delay drawn in [0, min(cap, base * 2^n)]),
 * so that many workers refused at once do not come back at once; a
 * Retry-After the server sends is honoured, bounded.
 */
#ifndef DH_CORE_HTTP_RETRY_H
#define DH_CORE_HTTP_RETRY_H

#include <stdint.h>

#define DH_HTTP_BACKOFF_BASE_MS 100
#define DH_HTTP_BACKOFF_CAP_MS 5000
#define DH_HTTP_RETRY_AFTER_MAX_MS 20000

/* 1 for an answer worth another try: 408, 429 and 5xx but 501 and 505
 * (a request the server will never serve). */
int dh__http_status_retryable(long status);

/* The wait before try `attempt` + 1 (attempt >= 1 tries made so far),
 * from a uniform 64-bit random `rnd`; at least `retry_after_ms` (the
 * server's Retry-After, -1 when none) up to DH_HTTP_RETRY_AFTER_MAX_MS. */
int64_t dh__http_backoff_ms(int attempt, uint64_t rnd, int64_t retry_after_ms);

/* A Retry-After header value in delay-seconds form ("3"): milliseconds,
 * or -1 (absent, a date, malformed).  Leading/trailing blanks allowed. */
int64_t dh__http_retry_after_ms(const char *value);

/* A Content-Range value "bytes FIRST-LAST/TOTAL" (TOTAL may be "*": -1).
 * 0, or -1 when malformed or LAST < FIRST or LAST >= TOTAL. */
int dh__http_content_range(const char *value, int64_t *first, int64_t *last,
                           int64_t *total);

#endif
