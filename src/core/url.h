/*
 * url.h - what a table path that is a URL names (internal, pure): its
 * kind, whether it carries credentials, and the form of it that messages
 * may show.  The remote source backends (media/source_http.c) read the
 * objects; this file only looks at strings.
 */
#ifndef DH_CORE_URL_H
#define DH_CORE_URL_H

#include <stddef.h>

enum dh_url_kind {
    DH_URL_NONE = 0, /* a local path */
    DH_URL_HTTP,     /* http:// */
    DH_URL_HTTPS,    /* https:// */
    DH_URL_S3,       /* s3://bucket/key */
    DH_URL_OTHER     /* another scheme://: not read */
};

/* What `s` names: a local path unless it starts with "scheme://" (letters,
 * digits, '+', '-', '.'); the scheme is matched without case. */
enum dh_url_kind dh__url_kind(const char *s);

/* 1 when an http(s) URL names user:password@ before its host (credentials
 * that every message and table row would repeat). */
int dh__url_has_userinfo(const char *s);

/* `s` as messages may show it: without user:password@, and with a query
 * (a presigned URL's signature) or fragment replaced by "?...".  Always
 * NUL-terminated; cut to cap-1 bytes. */
void dh__url_redact(const char *s, char *out, size_t cap);

/* The path part of a URL without its query: "https://h/a/b.mp4?x" ->
 * "/a/b.mp4" copied into out (FFmpeg guesses a format by the name's
 * extension); "" when there is none. */
void dh__url_path(const char *s, char *out, size_t cap);

/* An s3:// URL split: bucket into `bucket`, the key (without the leading
 * '/') into `key`.  0, or -1 when it is not "s3://BUCKET/..." with a
 * bucket name of 3..63 characters of [a-z0-9.-]. */
int dh__url_s3_split(const char *s, char *bucket, size_t bcap, char *key,
                     size_t kcap);

/* S3's URI encoding of s (every byte but A-Z a-z 0-9 - _ . ~ as %XX, and
 * '/' kept when keep_slash) into out: 0, or -1 when it does not fit. */
int dh__url_encode(const char *s, int keep_slash, char *out, size_t cap);

#endif
