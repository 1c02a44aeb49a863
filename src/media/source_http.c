/*
 * source_http.c - the HTTP(S) backend of the source interface (source.h):
 * an object read with ranged GETs on libcurl, through a small read-ahead
 * cache of blocks, on one connection a media worker keeps across objects.
 *
 * Why blocks: FFmpeg reads through a 32-64 KiB AVIO buffer, and a request
 * to a store costs 20-100 ms before its first byte.  A miss fetches a
 * block (1 MiB, doubling on a sequential run up to 8 MiB: AWS's advice
 * for throughput per connection), and the few blocks kept answer the
 * header, the frames and an MP4's tail (its moov) without a request each.
 * The blocks belong to one URL: the members of one remote shard read one
 * after another share them.
 *
 * What can fail is retried (connection errors, resets, timeouts, 408, 429
 * and 5xx) with full-jitter backoff honouring Retry-After (core/http_retry.h),
 * a short body is resumed from where it stopped, and every wait gives up
 * at the sample's watchdog (the source's overdue callback, polled by
 * libcurl's progress callback and between tries).  Messages name the URL
 * without credentials or query (core/url.h).
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <errno.h>
#include <sys/random.h>

#include <curl/curl.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/hash.h"
#include "core/http_retry.h"
#include "core/url.h"
#include "core/s3_xml.h"
#include "media/cache.h"
#include "media/s3_config.h"
#include "media/source.h"

#define NBLOCKS 3
#define BLOCK_ALIGN (64 << 10)
#define ERR_BODY 2048
#define WHOLE_MAX (64 << 20) /* an S3 listing page is ~1000 keys */

struct block {
    int64_t off, len; /* bytes of the object held; len 0: empty */
    uint8_t *buf;
    size_t cap;
    uint64_t used; /* for LRU */
};

struct dh_remote {
    CURL *curl;
    char *url; /* the object the blocks and `total` belong to */
    size_t url_cap;
    char *req; /* the URL requested: url, or an s3:// one's endpoint URL */
    size_t req_cap;
    struct curl_slist *headers; /* S3: the payload hash, a session token */
    /* a whole answer kept (an S3 listing), not a range */
    int whole;
    char *sink;
    size_t sink_len, sink_cap;
    struct block blk[NBLOCKS];
    uint64_t tick;
    int64_t total;    /* the object's bytes as the server said; -1 unknown */
    int64_t next_seq; /* where the last fetch ended (a sequential run) */
    int64_t run;      /* bytes the next sequential fetch asks for */
    uint64_t rng;
    struct dh_source *src;
    /* what the open object must hold (the table's word): its exact size
     * (0: not known), or the end of a shard member within it (0: none) */
    int64_t want_total, want_end;
    int size_kept; /* the cache has `total` (cache.h) */
    /* one request */
    uint8_t *dst;
    size_t want, got;
    int64_t at;   /* the first byte asked for */
    int64_t from; /* where this try's answer starts (a resumed read) */
    long status;
    int range_ok; /* the answer is the range asked for */
    int extra;    /* the server sent more than asked (200 to a range) */
    int watchdog; /* the sample's watchdog cut the request or the wait */
    int64_t cr_first, cr_total, retry_after_ms;
    /* the object's version: its ETag from the first answer (or the
     * cache), sent as If-Match with every later request for it, so that a
     * read never mixes the bytes of two versions (412: it changed) */
    char etag[DH_CACHE_ETAG_MAX], etag_seen[DH_CACHE_ETAG_MAX];
    int changed;
    char body[ERR_BODY];
    size_t body_len;
    char cerr[CURL_ERROR_SIZE];
};

/* ---- settings, read once per process ---- */

static struct {
    long connect_ms, timeout_ms;
    int retries;
    int64_t block, block_max;
    const char *ca_bundle;
} cfg;
static pthread_once_t cfg_once = PTHREAD_ONCE_INIT;
static int curl_ok;

static long env_long(const char *name, long lo, long hi, long dflt)
{
    const char *s = getenv(name);
    char *end = NULL;
    long v;

    if (!s || !*s)
        return dflt;
    errno = 0;
    v = strtol(s, &end, 10);
    if (errno || *end || v < lo || v > hi)
        return dflt;
    return v;
}

static void cfg_init(void)
{
    const char *ca = getenv("DATAHELIX_CA_BUNDLE");

    curl_ok = curl_global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK;
    cfg.connect_ms = env_long("DATAHELIX_HTTP_CONNECT_TIMEOUT_MS", 100, 600000,
                              10000);
    cfg.timeout_ms = env_long("DATAHELIX_HTTP_TIMEOUT_MS", 100, 3600000, 60000);
    cfg.retries = (int)env_long("DATAHELIX_HTTP_RETRIES", 0, 20, 5);
    cfg.block = (int64_t)env_long("DATAHELIX_HTTP_BLOCK_KIB", 64, 65536, 1024)
                << 10;
    cfg.block_max = cfg.block > (8 << 20) ? cfg.block : (8 << 20);
    if (!ca || !*ca)
        ca = getenv("CURL_CA_BUNDLE");
    cfg.ca_bundle = ca && *ca ? ca : NULL;
}

/* ---- the answer, as libcurl hands it over ---- */

static size_t on_header(char *p, size_t size, size_t n, void *arg)
{
    struct dh_remote *r = arg;
    size_t len = size * n;
    char line[256];

    if (len >= sizeof(line))
        return len; /* no header we read is that long */
    memcpy(line, p, len);
    line[len] = '\0';
    if (!strncmp(line, "HTTP/", 5)) { /* a new answer (after a redirect) */
        r->cr_first = r->cr_total = r->retry_after_ms = -1;
        r->etag_seen[0] = '\0';
    } else if (!strncasecmp(line, "content-range:", 14)) {
        int64_t first, last, total;

        if (!dh__http_content_range(line + 14, &first, &last, &total)) {
            r->cr_first = first;
            r->cr_total = total;
        }
    } else if (!strncasecmp(line, "retry-after:", 12)) {
        r->retry_after_ms = dh__http_retry_after_ms(line + 12);
    } else if (!strncasecmp(line, "etag:", 5)) {
        const char *v = line + 5;
        size_t k;

        while (*v == ' ' || *v == '\t')
            v++;
        k = strcspn(v, "\r\n");
        if (k < sizeof(r->etag_seen)) {
            memcpy(r->etag_seen, v, k);
            r->etag_seen[k] = '\0';
        }
    }
    return len;
}

static size_t on_body(char *p, size_t size, size_t n, void *arg)
{
    struct dh_remote *r = arg;
    size_t len = size * n, take;

    if (!r->status)
        curl_easy_getinfo(r->curl, CURLINFO_RESPONSE_CODE, &r->status);
    if (!r->whole && (r->status == 206 || (r->status == 200 && r->from == 0))) {
        if (r->status == 206 && r->cr_first != r->from)
            return 0; /* another range than asked: refused below */
        r->range_ok = 1;
        take = len < r->want - r->got ? len : r->want - r->got;
        memcpy(r->dst + r->got, p, take);
        r->got += take;
        if (take < len) {
            r->extra = 1; /* enough: the rest is not wanted */
            return 0;
        }
        return len;
    }
    if (r->status == 200 && r->whole) {
        if (len > WHOLE_MAX - r->sink_len)
            return 0; /* over the bound: refused below */
        if (r->sink_len + len + 1 > r->sink_cap) {
            size_t cap = r->sink_cap ? r->sink_cap : 1 << 16;
            char *p2;

            while (cap < r->sink_len + len + 1)
                cap *= 2;
            if (!(p2 = dh__realloc(r->sink, cap)))
                return 0;
            r->sink = p2;
            r->sink_cap = cap;
        }
        memcpy(r->sink + r->sink_len, p, len);
        r->sink_len += len;
        r->sink[r->sink_len] = '\0';
        return len;
    }
    take = len < sizeof(r->body) - 1 - r->body_len
               ? len
               : sizeof(r->body) - 1 - r->body_len;
    memcpy(r->body + r->body_len, p, take);
    r->body_len += take;
    r->body[r->body_len] = '\0';
    return len;
}

static int on_progress(void *arg, curl_off_t dt, curl_off_t dn, curl_off_t ut,
                       curl_off_t un)
{
    struct dh_remote *r = arg;

    (void)dt, (void)dn, (void)ut, (void)un;
    return r->src && r->src->overdue && r->src->overdue(r->src->overdue_arg);
}

/* ---- one worker's connection ---- */

void dh__remote_free(struct dh_remote *r)
{
    if (!r)
        return;
    if (r->curl)
        curl_easy_cleanup(r->curl);
    curl_slist_free_all(r->headers);
    for (int i = 0; i < NBLOCKS; i++)
        dh__free(r->blk[i].buf);
    dh__free(r->url);
    dh__free(r->req);
    dh__free(r->sink);
    dh__free(r);
}

static struct dh_remote *remote_new(struct dh_err *e)
{
    struct dh_remote *r;
    CURL *c;
    uint64_t seed = 0;

    pthread_once(&cfg_once, cfg_init);
    if (!curl_ok) {
        dh_err_set(e, DH_EIO, "HTTP: libcurl could not be initialised");
        return NULL;
    }
    if (!(r = dh__calloc(1, sizeof(*r))) || !(c = r->curl = curl_easy_init())) {
        dh__free(r);
        dh_err_set(e, DH_ENOMEM, "HTTP: out of memory");
        return NULL;
    }
    if (getrandom(&seed, sizeof(seed), GRND_NONBLOCK) != sizeof(seed))
        seed = dh__mono_ms() ^ (uint64_t)(uintptr_t)r;
    r->rng = seed;
    /* http(s) only, also after a redirect; no netrc, no cookies, no
     * signals (threads); TLS verified unless the user's CA bundle says
     * whom to trust */
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(c, CURLOPT_MAXREDIRS, 5L);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_NETRC, (long)CURL_NETRC_IGNORED);
    curl_easy_setopt(c, CURLOPT_SSL_VERIFYPEER, 1L);
    curl_easy_setopt(c, CURLOPT_SSL_VERIFYHOST, 2L);
    if (cfg.ca_bundle)
        curl_easy_setopt(c, CURLOPT_CAINFO, cfg.ca_bundle);
    curl_easy_setopt(c, CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_2TLS);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, cfg.connect_ms);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, cfg.timeout_ms);
    curl_easy_setopt(c, CURLOPT_TCP_KEEPALIVE, 1L);
    curl_easy_setopt(c, CURLOPT_ACCEPT_ENCODING, NULL); /* bytes as stored */
    curl_easy_setopt(c, CURLOPT_USERAGENT, "datahelix/0.1");
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, r);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, r);
    curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, on_progress);
    curl_easy_setopt(c, CURLOPT_XFERINFODATA, r);
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, r->cerr);
    return r;
}

/* ---- requests ---- */

static int overdue(const struct dh_remote *r)
{
    return r->src->overdue && r->src->overdue(r->src->overdue_arg);
}

/* Sleeps ms in slices, giving up at the watchdog: 0, or -1 when overdue. */
static int backoff_sleep(struct dh_remote *r, int64_t ms)
{
    uint64_t end = dh__mono_ms() + (uint64_t)ms;

    while (!overdue(r)) {
        uint64_t now = dh__mono_ms();
        int64_t left = now >= end ? 0 : (int64_t)(end - now);
        struct timespec ts;

        if (!left)
            return 0;
        if (left > 50)
            left = 50;
        ts.tv_sec = 0;
        ts.tv_nsec = (long)left * 1000000L;
        nanosleep(&ts, NULL);
    }
    return -1;
}

static const char *reason(long status)
{
    switch (status) {
    case 400:
        return "Bad Request";
    case 401:
        return "Unauthorized";
    case 403:
        return "Forbidden";
    case 404:
        return "Not Found";
    case 408:
        return "Request Timeout";
    case 410:
        return "Gone";
    case 416:
        return "Range Not Satisfiable";
    case 429:
        return "Too Many Requests";
    case 500:
        return "Internal Server Error";
    case 502:
        return "Bad Gateway";
    case 503:
        return "Service Unavailable";
    case 504:
        return "Gateway Timeout";
    default:
        return "";
    }
}

/* The status an answer ended with, as a message's cause. */
static void status_cause(const struct dh_remote *r, char *out, size_t cap)
{
    char code[64], msg[160];

    dh__xml_text(r->body, "Code", code, sizeof(code));
    dh__xml_text(r->body, "Message", msg, sizeof(msg));
    if (code[0])
        snprintf(out, cap, "HTTP %ld %s (%s%s%s)", r->status, reason(r->status),
                 code, msg[0] ? ": " : "", msg);
    else
        snprintf(out, cap, "HTTP %ld%s%s", r->status,
                 reason(r->status)[0] ? " " : "", reason(r->status));
}

static int curl_retryable(CURLcode rc)
{
    switch (rc) {
    case CURLE_COULDNT_CONNECT:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_RECV_ERROR:
    case CURLE_SEND_ERROR:
    case CURLE_PARTIAL_FILE:
    case CURLE_GOT_NOTHING:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
    case CURLE_SSL_CONNECT_ERROR:
        return 1;
    default:
        return 0;
    }
}

enum outcome { DONE, RETRY, FAIL };

/* The object's headers (S3's) and If-Match with its ETag once known: a
 * list this request owns; NULL when there is none (or no memory). */
static struct curl_slist *request_headers(const struct dh_remote *r)
{
    struct curl_slist *l = NULL, *n;
    char line[DH_CACHE_ETAG_MAX + 16];

    for (const struct curl_slist *h = r->headers; h; h = h->next) {
        if (!(n = curl_slist_append(l, h->data)))
            goto fail;
        l = n;
    }
    if (!r->whole && r->etag[0]) {
        snprintf(line, sizeof(line), "If-Match: %s", r->etag);
        if (!(n = curl_slist_append(l, line)))
            goto fail;
        l = n;
    }
    return l;
fail:
    curl_slist_free_all(l);
    return NULL;
}

/* One GET of bytes [at, at + want) (less at the object's end) into dst,
 * resumed from r->got: what to do next, with `cause` set unless DONE. */
static enum outcome get_once(struct dh_remote *r, char *cause, size_t cap)
{
    char range[64];
    int64_t from = r->at + (int64_t)r->got;
    struct curl_slist *hdrs;
    CURLcode rc;

    r->from = from;
    r->status = 0;
    r->range_ok = r->extra = 0;
    r->body_len = 0;
    r->body[0] = r->cerr[0] = '\0';
    r->cr_first = r->cr_total = r->retry_after_ms = -1;
    r->etag_seen[0] = '\0';
    snprintf(range, sizeof(range), "%lld-%lld", (long long)from,
             (long long)(r->at + (int64_t)r->want - 1));
    curl_easy_setopt(r->curl, CURLOPT_URL, r->req);
    curl_easy_setopt(r->curl, CURLOPT_RANGE, r->whole ? NULL : range);
    if ((hdrs = request_headers(r)) == NULL && (r->headers || r->etag[0])) {
        snprintf(cause, cap, "out of memory");
        return FAIL;
    }
    curl_easy_setopt(r->curl, CURLOPT_HTTPHEADER, hdrs);
    r->sink_len = 0;
    rc = curl_easy_perform(r->curl);
    curl_easy_setopt(r->curl, CURLOPT_HTTPHEADER, NULL);
    curl_slist_free_all(hdrs);
    curl_easy_getinfo(r->curl, CURLINFO_RESPONSE_CODE, &r->status);
    if (rc == CURLE_ABORTED_BY_CALLBACK) {
        r->watchdog = 1;
        snprintf(cause, cap, "the sample's watchdog expired during the read");
        return FAIL;
    }
    if (rc == CURLE_WRITE_ERROR && r->status == 206 && !r->extra &&
        r->cr_first != from) {
        snprintf(cause, cap,
                 "the server answered another range than bytes %lld-",
                 (long long)from);
        return FAIL;
    }
    if (r->whole && r->status == 200) {
        if (rc == CURLE_OK && r->sink_len)
            return DONE;
        if (rc == CURLE_WRITE_ERROR) {
            snprintf(cause, cap, "the answer is over %d MiB (or out of memory)",
                     WHOLE_MAX >> 20);
            return FAIL;
        }
    }
    if (rc == CURLE_OK || (rc == CURLE_WRITE_ERROR && r->extra)) {
        if (r->range_ok && !r->etag[0] && r->etag_seen[0])
            memcpy(r->etag, r->etag_seen, sizeof(r->etag)); /* its version */
        if (r->range_ok) {
            if (r->status == 200) {
                curl_off_t cl = -1;

                curl_easy_getinfo(r->curl, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T,
                                  &cl);
                r->cr_total = cl;
            }
            if (r->cr_total >= 0)
                r->total = r->cr_total;
            if (r->got == r->want ||
                (r->total >= 0 && r->at + (int64_t)r->got >= r->total))
                return DONE;
            snprintf(cause, cap, "the answer ended after %zu of %zu bytes",
                     r->got, r->want);
            return RETRY; /* resumed from where it stopped */
        }
        if (r->status == 200) {
            snprintf(cause, cap,
                     "the server does not serve byte ranges (it answered "
                     "200 to a ranged GET at byte %lld)",
                     (long long)from);
            return FAIL;
        }
        status_cause(r, cause, cap);
        if (r->status == 412) {
            r->changed = 1;
            snprintf(cause + strlen(cause), cap - strlen(cause),
                     ": the object changed while it was read (its ETag is "
                     "not %s any more)",
                     r->etag);
        }
        if (r->status == 416)
            snprintf(cause + strlen(cause), cap - strlen(cause),
                     ": the object is shorter than the table says; re-run "
                     "`datahelix probe`");
        return dh__http_status_retryable(r->status) ? RETRY : FAIL;
    }
    if (rc == CURLE_PEER_FAILED_VERIFICATION)
        snprintf(cause, cap,
                 "%s (for a private CA, set DATAHELIX_CA_BUNDLE or pass "
                 "--ca-bundle FILE)",
                 r->cerr[0] ? r->cerr : curl_easy_strerror(rc));
    else
        snprintf(cause, cap, "%s",
                 r->cerr[0] ? r->cerr : curl_easy_strerror(rc));
    return curl_retryable(rc) ? RETRY : FAIL;
}

/* Bytes [at, at + want) of the object into dst, retried as http_retry.h
 * says: the count (less than want only at the object's end), or a
 * negative DH_E* with `e` naming the URL and the cause. */
static int64_t get(struct dh_source *s, struct dh_remote *r, int64_t at,
                   size_t want, uint8_t *dst, struct dh_err *e)
{
    char cause[400] = "";
    uint64_t t0 = dh__mono_ms();
    int tries = 0;

    r->src = s;
    r->dst = dst;
    r->at = at;
    r->want = want;
    r->got = 0;
    r->watchdog = 0;
    for (;;) {
        enum outcome o = get_once(r, cause, sizeof(cause));

        tries++;
        s->requests++;
        if (o == DONE)
            return (int64_t)r->got;
        if (o == FAIL || tries > cfg.retries)
            break;
        s->retries++;
        if (backoff_sleep(r, dh__http_backoff_ms(tries, dh__splitmix64(&r->rng),
                                                 r->retry_after_ms))) {
            snprintf(cause + strlen(cause), sizeof(cause) - strlen(cause),
                     "; the sample's watchdog expired before the next try");
            r->watchdog = 1;
            break;
        }
    }
    if (tries > 1)
        return dh_err_set(e, r->watchdog ? DH_ETIMEOUT : DH_EIO,
                          "%s: read at byte %lld: %s (gave up after %d tries "
                          "in %.1f s)",
                          s->name, (long long)(at - s->base), cause, tries,
                          (double)(dh__mono_ms() - t0) / 1000.0);
    return dh_err_set(e, r->watchdog ? DH_ETIMEOUT : DH_EIO,
                      "%s: read at byte %lld: %s", s->name,
                      (long long)(at - s->base), cause);
}

/* The object's size, once an answer said it, must hold what the table
 * says lies in it: a file replaced after probing is not decoded as data. */
static int check_total(struct dh_source *s, const struct dh_remote *r,
                       struct dh_err *e)
{
    if (r->total < 0)
        return 0;
    if (r->want_end && r->want_end > r->total)
        return dh_err_set(e, DH_EMEDIA,
                          "%s: the member's %lld bytes at byte %lld lie past "
                          "the shard's end (%lld bytes): the shard changed "
                          "since probe; re-run `datahelix probe`",
                          s->name, (long long)s->size, (long long)s->base,
                          (long long)r->total);
    if (r->want_total && r->total != r->want_total)
        return dh_err_set(e, DH_EMEDIA,
                          "%s: the object changed since probe (%lld bytes, "
                          "the table says %lld): re-run `datahelix probe`",
                          s->name, (long long)r->total,
                          (long long)r->want_total);
    return 0;
}

/* ---- the backend ---- */

static void drop_blocks(struct dh_remote *r)
{
    for (int i = 0; i < NBLOCKS; i++)
        r->blk[i].len = 0;
    r->total = -1;
    r->size_kept = 0;
    r->etag[0] = '\0';
    r->changed = 0;
    r->next_seq = -1;
    r->run = cfg.block;
}

/* Fetches the block holding absolute byte `at` (at < end): 0, or DH_E*. */
/* The source's cache: its own, else the process's. */
static struct dh_cache *source_cache(const struct dh_source *s)
{
    return s->cache ? s->cache : dh__cache_get();
}

/* The cache's fetch: the chunk's bytes from the server. */
struct chunk_fetch {
    struct dh_source *s;
    struct dh_remote *r;
    int64_t start;
};

static int64_t fetch_chunk(void *arg, uint8_t *buf, size_t len,
                           struct dh_err *e)
{
    struct chunk_fetch *f = arg;
    int64_t n = get(f->s, f->r, f->start, len, buf, e);

    /* the size first: whoever sees the chunk (kept after this returns)
     * finds the size too */
    if (n > 0 && f->r->total >= 0 && !f->r->size_kept) {
        dh__cache_set_size(source_cache(f->s), f->r->url, f->r->total,
                           f->r->etag);
        f->r->size_kept = 1;
    }
    return n;
}

static int source_overdue(void *arg)
{
    struct dh_source *s = arg;

    return s->overdue && s->overdue(s->overdue_arg);
}

/* Where block b's bytes start and how many to ask for: through the cache,
 * a whole aligned chunk (its length where the object's end is known); else
 * from the 64 KiB boundary below `at`, a block that doubles on a
 * sequential run. */
static int64_t span(struct dh_source *s, struct dh_remote *r, int64_t at,
                    int64_t end, int cached, int64_t *start)
{
    int64_t len;

    if (cached) {
        int64_t known = r->total >= 0         ? r->total
                        : !s->base && s->size ? s->size
                                              : -1;

        *start = at - at % DH_CACHE_CHUNK;
        len = DH_CACHE_CHUNK;
        if (known >= 0 && known - *start < len)
            len = known - *start;
        return len;
    }
    *start = at - at % BLOCK_ALIGN;
    if (*start < s->base)
        *start = s->base;
    r->run = at == r->next_seq && r->run < cfg.block_max ? r->run * 2
                                                         : cfg.block;
    if (r->run > cfg.block_max)
        r->run = cfg.block_max;
    len = end - *start < r->run ? end - *start : r->run;
    if (at - *start >= len)
        len = at - *start + 1;
    return len;
}

/* Fetches the block holding absolute byte `at` (at < end): 0, or DH_E*. */
static int fill(struct dh_source *s, struct dh_remote *r, int64_t at,
                int64_t end, struct block **out, struct dh_err *e)
{
    struct dh_cache *cache = r->whole ? NULL : source_cache(s);
    struct block *b = &r->blk[0];
    int64_t start, len = span(s, r, at, end, cache != NULL, &start), n;
    size_t room = cache ? DH_CACHE_CHUNK : (size_t)len;
    int rc, hit = 0;

    for (int i = 1; i < NBLOCKS; i++)
        if (r->blk[i].used < b->used)
            b = &r->blk[i];
    b->len = 0;
    if (room > b->cap) {
        uint8_t *p = dh__realloc(b->buf, room);

        if (!p)
            return dh_err_set(e, DH_ENOMEM, "%s: out of memory", s->name);
        b->buf = p;
        b->cap = room;
    }
    if (cache) {
        struct chunk_fetch f = {s, r, start};

        n = dh__cache_chunk(cache, r->url, start / DH_CACHE_CHUNK, (size_t)len,
                            b->buf, fetch_chunk, &f, source_overdue, s, &hit,
                            e);
        if (hit)
            s->cache_hits++;
        else if (n > 0)
            s->cache_misses++;
    } else {
        n = get(s, r, start, (size_t)len, b->buf, e);
    }
    if (n < 0) {
        if (cache && r->changed) { /* its cached chunks are another version */
            dh__cache_forget(cache, r->url, r->total >= 0 ? r->total : 0);
            r->url[0] = '\0'; /* aimed afresh at the next open */
        }
        return (int)n;
    }
    if (n <= at - start)
        return dh_err_set(e, DH_EMEDIA,
                          "%s: the object ends at byte %lld, before byte "
                          "%lld the table says it holds: re-run "
                          "`datahelix probe`",
                          s->name, (long long)(start + n - s->base),
                          (long long)(at - s->base));
    b->off = start;
    b->len = n;
    if (!hit && (rc = check_total(s, r, e))) {
        b->len = 0;
        return rc;
    }
    if (!hit)
        s->fetched += b->len;
    r->next_seq = b->off + b->len;
    *out = b;
    return 0;
}

static int64_t http_read_at(struct dh_source *s, int64_t off, void *buf,
                            size_t len, struct dh_err *e)
{
    struct dh_remote *r = s->remote;
    int64_t at = s->base + off, n;
    struct block *b = NULL;

    for (int i = 0; i < NBLOCKS; i++)
        if (r->blk[i].len && at >= r->blk[i].off &&
            at < r->blk[i].off + r->blk[i].len)
            b = &r->blk[i];
    if (!b) {
        int rc = fill(s, r, at, s->base + s->size, &b, e);

        if (rc)
            return rc;
    }
    b->used = ++r->tick;
    n = b->off + b->len - at;
    if (n > (int64_t)len)
        n = (int64_t)len;
    memcpy(buf, b->buf + (at - b->off), (size_t)n);
    return n;
}

/* The object's size from the cache, when it holds this version: one whose
 * size is not the table's any more is forgotten there (then fetched and
 * checked against the table). */
static void cached_size(struct dh_source *s, struct dh_remote *r)
{
    struct dh_cache *cache = source_cache(s);
    char etag[DH_CACHE_ETAG_MAX];
    int64_t size = cache ? dh__cache_size(cache, r->url, etag) : -1;

    if (size < 0)
        return;
    if ((r->want_total && size != r->want_total) ||
        (r->want_end && r->want_end > size)) {
        dh__cache_forget(cache, r->url, size);
        return;
    }
    r->total = size;
    r->size_kept = 1;
    memcpy(r->etag, etag, sizeof(r->etag)); /* missing chunks: this version */
}

static int set_req(struct dh_remote *r, const char *url)
{
    if (dh__buf_reserve(&r->req, &r->req_cap, strlen(url) + 1))
        return DH_ENOMEM;
    memcpy(r->req, url, strlen(url) + 1);
    return 0;
}

/* Points the handle at `url`: an http(s) URL as it is, without
 * credentials; an s3:// one at its endpoint, signed (SigV4 by libcurl)
 * with the credentials s3_config.h finds, `query` appended.  The secrets
 * go to libcurl only. */
static int aim(struct dh_remote *r, const char *url, const char *query,
               const char *shown, struct dh_err *e)
{
    struct dh_s3_target t;
    CURL *c = r->curl;
    char sigv4[128], hdr[4200];
    int rc = 0;

    curl_slist_free_all(r->headers);
    r->headers = NULL;
    curl_easy_setopt(c, CURLOPT_AWS_SIGV4, NULL);
    curl_easy_setopt(c, CURLOPT_USERNAME, NULL);
    curl_easy_setopt(c, CURLOPT_PASSWORD, NULL);
    curl_easy_setopt(c, CURLOPT_HTTPAUTH, (long)CURLAUTH_BASIC);
    if (dh__url_kind(url) != DH_URL_S3)
        return set_req(r, url)
                   ? dh_err_set(e, DH_ENOMEM, "%s: out of memory", shown)
                   : 0;
    if ((rc = dh__s3_resolve(url, query, &t, e)))
        goto out;
    if (set_req(r, t.url) ||
        !(r->headers = curl_slist_append(
              NULL, "x-amz-content-sha256: UNSIGNED-PAYLOAD"))) {
        rc = dh_err_set(e, DH_ENOMEM, "%s: out of memory", shown);
        goto out;
    }
    if (!t.anonymous) {
        snprintf(sigv4, sizeof(sigv4), "aws:amz:%s:s3", t.region);
        curl_easy_setopt(c, CURLOPT_AWS_SIGV4, sigv4);
        curl_easy_setopt(c, CURLOPT_USERNAME, t.access_key);
        curl_easy_setopt(c, CURLOPT_PASSWORD, t.secret_key);
    }
    if (t.token[0]) {
        struct curl_slist *l;

        snprintf(hdr, sizeof(hdr), "x-amz-security-token: %s", t.token);
        l = curl_slist_append(r->headers, hdr);
        explicit_bzero(hdr, sizeof(hdr));
        if (!l) {
            rc = dh_err_set(e, DH_ENOMEM, "%s: out of memory", shown);
            goto out;
        }
        r->headers = l;
    }
out:
    dh__s3_target_wipe(&t);
    return rc;
}

static int http_open(struct dh_source *s, const struct dh_source_ref *ref,
                     struct dh_err *e)
{
    struct dh_remote *r = s->remote;
    struct block *b;
    int rc;

    if (dh__url_has_userinfo(ref->path))
        return dh_err_set(e, DH_EINVAL,
                          "%s: a URL with user:password@ is refused (every "
                          "table row, log line and message would carry the "
                          "password): serve the data without it, or from "
                          "S3 with credentials in the environment",
                          s->name);
    if (!r && !(r = s->remote = remote_new(e)))
        return e->code;
    if (!r->url || strcmp(r->url, ref->path)) {
        if (r->url)
            r->url[0] = '\0'; /* not aimed until aim() succeeds */
        drop_blocks(r);
        if ((rc = aim(r, ref->path, NULL, s->name, e)))
            return rc;
        if (dh__buf_reserve(&r->url, &r->url_cap, strlen(ref->path) + 1))
            return dh_err_set(e, DH_ENOMEM, "%s: out of memory", s->name);
        memcpy(r->url, ref->path, strlen(ref->path) + 1);
    }
    r->want_total = ref->member ? 0 : ref->size > 0 ? ref->size : 0;
    r->want_end = ref->member ? ref->offset + ref->size : 0;
    if (r->total < 0)
        cached_size(s, r);
    if (ref->member) {
        if (ref->offset < 0 || ref->size <= 0)
            return dh_err_set(e, DH_EMEDIA, "%s: no member bytes", s->name);
        s->base = ref->offset;
        s->size = ref->size;
        return check_total(s, r, e);
    }
    s->base = 0;
    if (ref->size > 0 && r->total < 0) {
        /* the table knows the size: the first read tells the server's */
        s->size = ref->size;
        return 0;
    }
    if (r->total < 0) {
        s->size = INT64_MAX / 2;
        if ((rc = fill(s, r, 0, s->size, &b, e)))
            return rc;
        if (r->total < 0) /* another process fetched it meanwhile */
            cached_size(s, r);
        if (r->total < 0) { /* a cached chunk without its size: ask */
            uint8_t one;

            if ((rc = (int)get(s, r, 0, 1, &one, e)) < 0)
                return rc;
        }
        if (r->total < 0)
            return dh_err_set(e, DH_EIO,
                              "%s: the server did not say the object's size",
                              s->name);
    }
    s->size = r->total;
    if (s->size == 0)
        return dh_err_set(e, DH_EMEDIA, "%s: empty object", s->name);
    return check_total(s, r, e);
}

static void http_close(struct dh_source *s)
{
    (void)s; /* the connection and blocks stay for the next object */
}

const struct dh_source_ops dh__http_source_ops = {
    .open = http_open,
    .read_at = http_read_at,
    .close = http_close,
};

/* ---- S3 listings ---- */

int dh__s3_list(const char *prefix_url, dh_s3_object_fn fn, void *arg,
                struct dh_err *e)
{
    char bucket[64], prefix[2048], eprefix[3 * 2048], token[2048] = "";
    char etoken[3 * 2048], query[3 * 4096 + 64], shown[2048];
    struct dh_source s;
    struct dh_remote *r;
    int truncated = 1, rc = 0, pages = 0;

    dh__url_redact(prefix_url, shown, sizeof(shown));
    if (dh__url_s3_split(prefix_url, bucket, sizeof(bucket), prefix,
                         sizeof(prefix)) ||
        dh__url_encode(prefix, 0, eprefix, sizeof(eprefix)))
        return dh_err_set(e, DH_EINVAL, "%s: not s3://BUCKET/PREFIX", shown);
    dh__source_init(&s);
    s.name = dh__strdup(shown);
    if (!s.name || !(r = s.remote = remote_new(e))) {
        rc = s.name ? e->code : dh_err_set(e, DH_ENOMEM, "out of memory");
        goto out;
    }
    r->whole = 1;
    while (!rc && truncated) {
        /* the parameters in canonical (sorted) order: libcurl signs the
         * query as it stands */
        if (dh__url_encode(token, 0, etoken, sizeof(etoken))) {
            rc = dh_err_set(e, DH_ETOOBIG, "%s: listing token too long", shown);
            break;
        }
        snprintf(query, sizeof(query), "%s%s%slist-type=2&prefix=%s",
                 token[0] ? "continuation-token=" : "", etoken,
                 token[0] ? "&" : "", eprefix);
        if ((rc = aim(r, prefix_url, query, shown, e)))
            break;
        if ((rc = (int)get(&s, r, 0, 0, NULL, e)) < 0)
            break;
        rc = dh__s3_list_page(r->sink, fn, arg, &truncated, token,
                              sizeof(token));
        if (rc == -1)
            rc = dh_err_set(e, DH_EFORMAT,
                            "%s: page %d of the listing is not an S3 "
                            "ListObjectsV2 answer",
                            shown, pages + 1);
        pages++;
    }
out:
    dh__source_fini(&s);
    return rc;
}
