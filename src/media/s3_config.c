/*
 * s3_config.c - endpoint, region, addressing and credentials of an s3://
 * URL (see s3_config.h).  Reads the environment and, once per process,
 * the AWS files and the per-source settings.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "core/alloc.h"
#include "core/aws_ini.h"
#include "core/url.h"
#include "media/s3_config.h"

#define FILE_MAX (1 << 20)

static struct {
    char *credentials, *config; /* file texts, NULL when absent */
    char cred_path[1024], conf_path[1024];
    json_t *sources; /* $DATAHELIX_S3_SOURCES, NULL when unset */
    char sources_err[DH_ERR_MSG_MAX];
} files;
static pthread_once_t files_once = PTHREAD_ONCE_INIT;

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "re");
    char *buf = NULL;
    size_t n;

    if (!f)
        return NULL;
    if ((buf = dh__malloc(FILE_MAX + 1))) {
        n = fread(buf, 1, FILE_MAX, f);
        buf[n] = '\0';
    }
    fclose(f);
    return buf;
}

static void file_path(const char *var, const char *rel, char *out, size_t cap)
{
    const char *v = getenv(var), *home = getenv("HOME");

    if (v && *v)
        snprintf(out, cap, "%s", v);
    else if (home && *home)
        snprintf(out, cap, "%s/.aws/%s", home, rel);
    else
        out[0] = '\0';
}

static const char *const source_keys[] = {"profile", "endpoint_url", "region",
                                          "addressing_style"};

/* The per-source file: an object of prefix -> settings (strings, the keys
 * above); anything else is an error named when a URL is resolved. */
static void load_sources(const char *path)
{
    json_error_t je;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    const char *prefix;
    json_t *v;

    if (!root) {
        snprintf(files.sources_err, sizeof(files.sources_err),
                 "DATAHELIX_S3_SOURCES=%s: %s (line %d)", path, je.text,
                 je.line);
        return;
    }
    if (!json_is_object(root)) {
        snprintf(files.sources_err, sizeof(files.sources_err),
                 "DATAHELIX_S3_SOURCES=%s: expected an object of "
                 "\"s3://bucket/prefix\": {settings}",
                 path);
        json_decref(root);
        return;
    }
    json_object_foreach(root, prefix, v)
    {
        const char *k;
        json_t *x;

        if (strncmp(prefix, "s3://", 5) || !json_is_object(v)) {
            snprintf(files.sources_err, sizeof(files.sources_err),
                     "DATAHELIX_S3_SOURCES=%s: \"%.200s\": expected an "
                     "s3:// prefix with an object of settings",
                     path, prefix);
            break;
        }
        json_object_foreach(v, k, x)
        {
            size_t i;

            for (i = 0; i < sizeof(source_keys) / sizeof(*source_keys); i++)
                if (!strcmp(k, source_keys[i]))
                    break;
            if (i == sizeof(source_keys) / sizeof(*source_keys) ||
                !json_is_string(x)) {
                snprintf(files.sources_err, sizeof(files.sources_err),
                         "DATAHELIX_S3_SOURCES=%s: \"%.200s\": \"%.64s\" is "
                         "not a setting (profile, endpoint_url, region, "
                         "addressing_style: strings; credentials belong in "
                         "the AWS credentials file, under a profile)",
                         path, prefix, k);
                break;
            }
        }
        if (files.sources_err[0])
            break;
    }
    if (files.sources_err[0])
        json_decref(root);
    else
        files.sources = root;
}

static void load_files(void)
{
    const char *src = getenv("DATAHELIX_S3_SOURCES");

    file_path("AWS_SHARED_CREDENTIALS_FILE", "credentials", files.cred_path,
              sizeof(files.cred_path));
    file_path("AWS_CONFIG_FILE", "config", files.conf_path,
              sizeof(files.conf_path));
    if (files.cred_path[0])
        files.credentials = slurp(files.cred_path);
    if (files.conf_path[0])
        files.config = slurp(files.conf_path);
    if (src && *src)
        load_sources(src);
}

/* The settings of the longest prefix of url in the per-source file. */
static json_t *source_for(const char *url)
{
    const char *prefix, *best = NULL;
    json_t *v, *out = NULL;

    if (!files.sources)
        return NULL;
    json_object_foreach(files.sources, prefix, v)
    {
        if (!strncmp(url, prefix, strlen(prefix)) &&
            (!best || strlen(prefix) > strlen(best))) {
            best = prefix;
            out = v;
        }
    }
    return out;
}

static const char *setting(json_t *src, const char *key)
{
    json_t *v = src ? json_object_get(src, key) : NULL;

    return json_is_string(v) && json_string_value(v)[0] ? json_string_value(v)
                                                        : NULL;
}

static const char *env(const char *name)
{
    const char *v = getenv(name);

    return v && *v ? v : NULL;
}

/* A profile's key: the credentials file's [name], then the config file's
 * [profile name] ([default] in both for "default"). */
static int profile_get(const char *profile, const char *key, int cred_first,
                       char *out, size_t cap)
{
    char section[160];

    snprintf(section, sizeof(section), "%s%s",
             strcmp(profile, "default") ? "profile " : "", profile);
    if (cred_first && files.credentials &&
        dh__aws_ini_get(files.credentials, profile, key, out, cap))
        return 1;
    if (files.config && dh__aws_ini_get(files.config, section, key, out, cap))
        return 1;
    return !cred_first && files.credentials &&
           dh__aws_ini_get(files.credentials, profile, key, out, cap);
}

static int profile_exists(const char *profile)
{
    char section[160];

    snprintf(section, sizeof(section), "[%s]", profile);
    if (files.credentials && strstr(files.credentials, section))
        return 1;
    snprintf(section, sizeof(section), "[%s%s]",
             strcmp(profile, "default") ? "profile " : "", profile);
    return files.config && strstr(files.config, section);
}

static int credentials(struct dh_s3_target *t, const char *src_profile,
                       const char *shown, struct dh_err *e)
{
    const char *profile = src_profile ? src_profile : env("AWS_PROFILE");

    if (!src_profile && env("AWS_ACCESS_KEY_ID") &&
        env("AWS_SECRET_ACCESS_KEY")) {
        snprintf(t->access_key, sizeof(t->access_key), "%s",
                 env("AWS_ACCESS_KEY_ID"));
        snprintf(t->secret_key, sizeof(t->secret_key), "%s",
                 env("AWS_SECRET_ACCESS_KEY"));
        snprintf(t->token, sizeof(t->token), "%s",
                 env("AWS_SESSION_TOKEN") ? env("AWS_SESSION_TOKEN") : "");
        snprintf(t->profile, sizeof(t->profile), "the environment");
        return 0;
    }
    if (!profile)
        profile = "default";
    snprintf(t->profile, sizeof(t->profile), "profile %s", profile);
    if (!profile_get(profile, "aws_access_key_id", 1, t->access_key,
                     sizeof(t->access_key)) ||
        !profile_get(profile, "aws_secret_access_key", 1, t->secret_key,
                     sizeof(t->secret_key))) {
        if (strcmp(profile, "default") || profile_exists(profile))
            return dh_err_set(e, DH_EINVAL,
                              "%s: no credentials for profile '%s' (looked "
                              "in %s and %s: aws_access_key_id and "
                              "aws_secret_access_key)",
                              shown, profile,
                              files.cred_path[0] ? files.cred_path : "-",
                              files.conf_path[0] ? files.conf_path : "-");
        t->anonymous = 1; /* nothing anywhere: a public bucket */
        snprintf(t->profile, sizeof(t->profile), "no credentials");
        t->access_key[0] = t->secret_key[0] = '\0';
        return 0;
    }
    if (!profile_get(profile, "aws_session_token", 1, t->token,
                     sizeof(t->token)))
        t->token[0] = '\0';
    return 0;
}

int dh__s3_resolve(const char *s3url, const char *query, struct dh_s3_target *t,
                   struct dh_err *e)
{
    char bucket[64], key[2048], ekey[3 * 2048], shown[2048], style[32] = "";
    char region[64] = "", endpoint[1024] = "", def_endpoint[160];
    const char *profile, *v, *scheme_end, *host;
    json_t *src;
    int path_style, n, rc;

    memset(t, 0, sizeof(*t));
    dh__url_redact(s3url, shown, sizeof(shown));
    pthread_once(&files_once, load_files);
    if (files.sources_err[0])
        return dh_err_set(e, DH_EFORMAT, "%s: %s", shown, files.sources_err);
    if (dh__url_s3_split(s3url, bucket, sizeof(bucket), key, sizeof(key)))
        return dh_err_set(e, DH_EINVAL,
                          "%s: not s3://BUCKET/KEY (a bucket name of 3-63 "
                          "characters a-z 0-9 . -)",
                          shown);
    src = source_for(s3url);
    profile = setting(src, "profile");
    if ((rc = credentials(t, profile, shown, e)))
        return rc;
    if (!profile)
        profile = env("AWS_PROFILE") ? env("AWS_PROFILE") : "default";

    if ((v = setting(src, "region")) || (v = env("AWS_REGION")) ||
        (v = env("AWS_DEFAULT_REGION")))
        snprintf(region, sizeof(region), "%s", v);
    else if (!profile_get(profile, "region", 0, region, sizeof(region)))
        snprintf(region, sizeof(region), "us-east-1");
    for (const char *c = region; *c; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9') ||
              *c == '-'))
            return dh_err_set(e, DH_EINVAL, "%s: region '%s' is not a region",
                              shown, region);
    snprintf(t->region, sizeof(t->region), "%s", region);

    snprintf(def_endpoint, sizeof(def_endpoint), "https://s3.%s.amazonaws.com",
             region);
    if ((v = setting(src, "endpoint_url")) ||
        (v = env("AWS_ENDPOINT_URL_S3")) || (v = env("AWS_ENDPOINT_URL")))
        snprintf(endpoint, sizeof(endpoint), "%s", v);
    else if (!profile_get(profile, "endpoint_url", 0, endpoint,
                          sizeof(endpoint)))
        snprintf(endpoint, sizeof(endpoint), "%s", def_endpoint);
    n = (int)strlen(endpoint);
    while (n > 0 && endpoint[n - 1] == '/')
        endpoint[--n] = '\0';
    if ((dh__url_kind(endpoint) != DH_URL_HTTP &&
         dh__url_kind(endpoint) != DH_URL_HTTPS) ||
        strchr(endpoint + strlen("http://"), '/') ||
        dh__url_has_userinfo(endpoint))
        return dh_err_set(e, DH_EINVAL,
                          "%s: endpoint '%s' is not http(s)://HOST[:PORT]",
                          shown, endpoint);

    if ((v = setting(src, "addressing_style")) ||
        (v = env("DATAHELIX_S3_ADDRESSING")))
        snprintf(style, sizeof(style), "%s", v);
    else
        profile_get(profile, "s3.addressing_style", 0, style, sizeof(style));
    if (!style[0] || !strcmp(style, "auto"))
        snprintf(style, sizeof(style), "%s",
                 strcmp(endpoint, def_endpoint) ? "path" : "virtual");
    if (strcmp(style, "path") && strcmp(style, "virtual"))
        return dh_err_set(e, DH_EINVAL,
                          "%s: addressing style '%s': expected path, "
                          "virtual or auto",
                          shown, style);
    path_style = !strcmp(style, "path") ||
                 (strchr(bucket, '.') &&
                  dh__url_kind(endpoint) == DH_URL_HTTPS);

    if (query)
        key[0] = '\0'; /* a bucket's request (a listing) */
    if (dh__url_encode(key, 1, ekey, sizeof(ekey)))
        return dh_err_set(e, DH_ETOOBIG, "%s: key too long", shown);
    scheme_end = strstr(endpoint, "://") + 3;
    host = scheme_end;
    if (path_style) /* a bucket's own URL has no slash after its name */
        n = snprintf(t->url, sizeof(t->url), "%s/%s%s%s%s%s", endpoint, bucket,
                     ekey[0] ? "/" : "", ekey, query ? "?" : "",
                     query ? query : "");
    else
        n = snprintf(t->url, sizeof(t->url), "%.*s%s.%s/%s%s%s",
                     (int)(scheme_end - endpoint), endpoint, bucket, host, ekey,
                     query ? "?" : "", query ? query : "");
    if (n < 0 || (size_t)n >= sizeof(t->url))
        return dh_err_set(e, DH_ETOOBIG, "%s: URL too long", shown);
    return 0;
}

void dh__s3_target_wipe(struct dh_s3_target *t)
{
    explicit_bzero(t->secret_key, sizeof(t->secret_key));
    explicit_bzero(t->token, sizeof(t->token));
}
