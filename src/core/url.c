/*
 * url.c - table paths that are URLs (see url.h).  Pure.
 */
#include "core/url.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

/* The length of "scheme" in "scheme://...", 0 when s is no URL. */
static size_t scheme_len(const char *s)
{
    const char *p = strstr(s, "://");

    if (!p || p == s)
        return 0;
    for (const char *c = s; c < p; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') ||
              (*c >= '0' && *c <= '9') || *c == '+' || *c == '-' || *c == '.'))
            return 0;
    return (size_t)(p - s);
}

enum dh_url_kind dh__url_kind(const char *s)
{
    size_t n = s ? scheme_len(s) : 0;

    if (!n)
        return DH_URL_NONE;
    if (n == 4 && !strncasecmp(s, "http", 4))
        return DH_URL_HTTP;
    if (n == 5 && !strncasecmp(s, "https", 5))
        return DH_URL_HTTPS;
    if (n == 2 && !strncasecmp(s, "s3", 2))
        return DH_URL_S3;
    return DH_URL_OTHER;
}

/* Where the authority (host part) of a URL ends. */
static const char *authority_end(const char *auth)
{
    return auth + strcspn(auth, "/?#");
}

int dh__url_has_userinfo(const char *s)
{
    size_t n = scheme_len(s);
    const char *auth, *end, *at;

    if (!n)
        return 0;
    auth = s + n + 3;
    end = authority_end(auth);
    at = memchr(auth, '@', (size_t)(end - auth));
    return at != NULL;
}

void dh__url_redact(const char *s, char *out, size_t cap)
{
    size_t n = scheme_len(s), len;
    const char *auth, *end, *at, *q;

    if (!cap)
        return;
    if (!n) {
        snprintf(out, cap, "%s", s);
        return;
    }
    auth = s + n + 3;
    end = authority_end(auth);
    at = memchr(auth, '@', (size_t)(end - auth));
    if (at) {
        while (memchr(at + 1, '@', (size_t)(end - at - 1)))
            at = memchr(at + 1, '@', (size_t)(end - at - 1));
        auth = at + 1;
    }
    q = end + strcspn(end, "?#");
    len = (size_t)(q - auth);
    snprintf(out, cap, "%.*s://%.*s%s", (int)n, s, (int)len, auth,
             *q ? "?..." : "");
}

void dh__url_path(const char *s, char *out, size_t cap)
{
    size_t n = scheme_len(s);
    const char *p;

    if (!cap)
        return;
    p = n ? authority_end(s + n + 3) : s;
    snprintf(out, cap, "%.*s", (int)strcspn(p, "?#"), p);
}

int dh__url_s3_split(const char *s, char *bucket, size_t bcap, char *key,
                     size_t kcap)
{
    const char *b, *slash;
    size_t blen;

    if (dh__url_kind(s) != DH_URL_S3)
        return -1;
    b = s + 5;
    slash = strchr(b, '/');
    blen = slash ? (size_t)(slash - b) : strlen(b);
    if (blen < 3 || blen > 63 || blen >= bcap)
        return -1;
    for (size_t i = 0; i < blen; i++)
        if (!((b[i] >= 'a' && b[i] <= 'z') || (b[i] >= '0' && b[i] <= '9') ||
              b[i] == '.' || b[i] == '-'))
            return -1;
    memcpy(bucket, b, blen);
    bucket[blen] = '\0';
    if (snprintf(key, kcap, "%s", slash ? slash + 1 : "") >= (int)kcap)
        return -1;
    return 0;
}

int dh__url_encode(const char *s, int keep_slash, char *out, size_t cap)
{
    static const char hex[] = "0123456789ABCDEF";
    size_t n = 0;

    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        int plain = (*p >= 'A' && *p <= 'Z') || (*p >= 'a' && *p <= 'z') ||
                    (*p >= '0' && *p <= '9') || *p == '-' || *p == '_' ||
                    *p == '.' || *p == '~' || (keep_slash && *p == '/');

        if (n + (plain ? 1 : 3) >= cap)
            return -1;
        if (plain) {
            out[n++] = (char)*p;
        } else {
            out[n++] = '%';
            out[n++] = hex[*p >> 4];
            out[n++] = hex[*p & 15];
        }
    }
    if (n >= cap)
        return -1;
    out[n] = '\0';
    return 0;
}
