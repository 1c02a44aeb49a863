/*
 * s3_config.h - where an s3:// object is and who reads it (internal): the
 * endpoint, region, addressing style and credentials for a bucket, found
 * the way AWS's own tools find them, plus per-source settings so that two
 * datasets on two endpoints (or accounts) are read in one job.
 *
 * Order, first found wins:
 *  - settings: the longest prefix of the URL in the per-source file
 *    ($DATAHELIX_S3_SOURCES, JSON: {"s3://bucket/prefix/": {"profile",
 *    "endpoint_url", "region", "addressing_style"}}: no secrets in it);
 *  - credentials: the source's profile; else AWS_ACCESS_KEY_ID +
 *    AWS_SECRET_ACCESS_KEY (+ AWS_SESSION_TOKEN); else the profile
 *    AWS_PROFILE names (or "default") in the shared credentials file
 *    ($AWS_SHARED_CREDENTIALS_FILE, ~/.aws/credentials) or config file
 *    ($AWS_CONFIG_FILE, ~/.aws/config); none: unsigned requests (a public
 *    bucket);
 *  - region: the source's; AWS_REGION; AWS_DEFAULT_REGION; the profile's
 *    `region`; us-east-1;
 *  - endpoint: the source's; AWS_ENDPOINT_URL_S3; AWS_ENDPOINT_URL; the
 *    profile's `endpoint_url`; AWS's regional endpoint;
 *  - addressing: the source's; DATAHELIX_S3_ADDRESSING; the profile's
 *    `s3.addressing_style`; virtual-host on AWS's endpoint, path-style on
 *    any other (what S3-compatible stores serve).  A bucket name with a
 *    dot is addressed by path over https (a certificate cannot name it).
 *
 * The files are read once per process.  Secrets stay in this process's
 * memory and libcurl's; nothing here prints them.
 */
#ifndef DH_MEDIA_S3_CONFIG_H
#define DH_MEDIA_S3_CONFIG_H

#include "datahelix/error.h"

#define DH_S3_URL_MAX 4096

struct dh_s3_target {
    char url[DH_S3_URL_MAX]; /* the HTTP(S) URL of the object or bucket */
    char region[64];
    char access_key[256], secret_key[256];
    char token[4096];  /* "" without a session token */
    int anonymous;     /* no credentials found: unsigned */
    char profile[128]; /* where the credentials came from, for messages */
};

/* Resolves `s3url` (s3://bucket/key) into t.  With `query` (a canonical
 * query string, e.g. "list-type=2&prefix=a%2F") the URL is the bucket's
 * with the query; the settings are still those of s3url's prefix.
 * 0, or DH_EINVAL / DH_EFORMAT / DH_EIO with e naming the URL and what
 * to fix. */
int dh__s3_resolve(const char *s3url, const char *query, struct dh_s3_target *t,
                   struct dh_err *e);

/* Wipes the secrets of t. */
void dh__s3_target_wipe(struct dh_s3_target *t);

#endif
