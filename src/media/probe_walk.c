/*
 * probe_walk.c - expands probe INPUTs (files, folders, JSONL lists) into an
 * ordered list of (path, caption) items.
 *
 * Folders are walked in sorted order so that ids are reproducible; only
 * files with a media or text extension are kept from folders (an explicit
 * file is always probed).  Symbolic links to folders are not followed, so a
 * link cycle cannot make the walk endless.
 */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "core/alloc.h"
#include "core/url.h"
#include "core/tar.h"
#include "core/utf8.h"
#include "datahelix/probe.h"
#include "media/shard_walk.h"
#include "media/source.h"

#define WALK_MAX_DEPTH 64

static const char *const media_exts[] = {
    "mp4", "m4v",  "mov",  "mkv", "webm", "avi", "ts",  "mts", "m2ts",
    "flv", "mpg",  "mpeg", "wmv", "3gp",  "ogv", "gif", "jpg", "jpeg",
    "png", "webp", "bmp",  "tif", "tiff", "txt", "tar",
};

/* Sound: in a folder, an audio sample of its own; in a shard, the sound of
 * its key's clip (a key with only sound is reported, not probed). */
static const char *const audio_exts[] = {"wav", "flac", "mp3", "m4a",
                                         "ogg", "opus", "aac"};

/* Largest caption or metadata member read from a shard. */
#define CAPTION_MAX ((int64_t)DH_TABLE_LINE_MAX)

void dh_probe_list_init(struct dh_probe_list *l)
{
    memset(l, 0, sizeof(*l));
}

void dh_probe_list_fini(struct dh_probe_list *l)
{
    for (size_t i = 0; i < l->count; i++) {
        dh__free(l->items[i].path);
        dh__free(l->items[i].text);
        dh__free(l->items[i].member);
        dh__free(l->items[i].name);
        dh__free(l->items[i].extra_json);
        dh__free(l->items[i].audio_member);
    }
    for (size_t i = 0; i < l->nproblems; i++)
        dh__free(l->problems[i]);
    dh__free(l->problems);
    dh__free(l->items);
    dh_probe_list_init(l);
}

/* `path` made absolute against the working directory (taken over), so a
 * table works from any directory and in any process that reads it; NULL
 * when out of memory or the directory is unknown (then `path` is kept). */
static char *absolute(char *path)
{
    char cwd[4096], *out;
    size_t a, b;

    if (path[0] == '/' || dh__url_kind(path) != DH_URL_NONE ||
        !getcwd(cwd, sizeof(cwd)))
        return path;
    a = strlen(cwd);
    b = strlen(path);
    if (path[0] == '.' && path[1] == '/') { /* "./x" -> "cwd/x" */
        if (!(out = dh__malloc(a + b)))
            return NULL;
        memcpy(out, cwd, a);
        memcpy(out + a, path + 1, b); /* "/x" and the NUL */
    } else {
        if (!(out = dh__malloc(a + b + 2)))
            return NULL;
        memcpy(out, cwd, a);
        out[a] = '/';
        memcpy(out + a + 1, path, b + 1);
    }
    dh__free(path);
    return out;
}

/* Takes ownership of path and text (also on failure). */
static int push(struct dh_probe_list *l, char *path, char *text,
                struct dh_err *e)
{
    char *abs = absolute(path);

    if (!abs) {
        dh__free(path);
        dh__free(text);
        return dh_err_set(e, DH_ENOMEM, "input list: out of memory");
    }
    path = abs;
    if (l->count == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 256;
        void *p = dh__realloc(l->items, cap * sizeof(*l->items));
        if (!p) {
            dh__free(path);
            dh__free(text);
            return dh_err_set(e, DH_ENOMEM, "input list: out of memory");
        }
        l->items = p;
        l->cap = cap;
    }
    l->items[l->count] = (struct dh_probe_item){.path = path, .text = text};
    l->count++;
    return 0;
}

/* push() for member `member` of shard `path` (taken too), named
 * "SHARD:MEMBER". */
static int push_member(struct dh_probe_list *l, char *path, char *text,
                       char *member, int64_t offset, int64_t size,
                       struct dh_err *e)
{
    struct dh_probe_item *it;
    size_t n;
    int rc = push(l, path, text, e);

    if (rc) {
        dh__free(member);
        return rc;
    }
    it = &l->items[l->count - 1];
    it->member = member;
    it->offset = offset;
    it->size = size;
    n = strlen(it->path) + strlen(member) + 2;
    if (!(it->name = dh__malloc(n)))
        return dh_err_set(e, DH_ENOMEM, "input list: out of memory");
    snprintf(it->name, n, "%s:%s", it->path, member);
    return 0;
}

static int push_copy(struct dh_probe_list *l, const char *path,
                     const char *text, struct dh_err *e)
{
    char *p = dh__strdup(path);
    char *t = text ? dh__strdup(text) : NULL;

    if (!p || (text && !t)) {
        dh__free(p);
        dh__free(t);
        return dh_err_set(e, DH_ENOMEM, "%s: out of memory", path);
    }
    return push(l, p, t, e);
}

static int ext_is(const char *name, const char *ext)
{
    const char *dot = strrchr(name, '.');

    return dot && !strcasecmp(dot + 1, ext);
}

static int wanted_in_folder(const char *name)
{
    for (size_t i = 0; i < sizeof(media_exts) / sizeof(media_exts[0]); i++)
        if (ext_is(name, media_exts[i]))
            return 1;
    for (size_t i = 0; i < sizeof(audio_exts) / sizeof(audio_exts[0]); i++)
        if (ext_is(name, audio_exts[i]))
            return 1;
    return 0;
}

static char *join(const char *dir, const char *name)
{
    size_t n = strlen(dir), m = strlen(name);
    int slash = n > 0 && dir[n - 1] != '/';
    char *s = dh__malloc(n + (size_t)slash + m + 1);

    if (!s)
        return NULL;
    memcpy(s, dir, n);
    if (slash)
        s[n] = '/';
    memcpy(s + n + (size_t)slash, name, m + 1);
    return s;
}

/* ---- remote inputs ---- */

static int is_url(const char *s)
{
    return dh__url_kind(s) != DH_URL_NONE;
}

/* 0 when `url` names an object this build reads, else why not. */
static int url_check(const char *url, struct dh_err *e)
{
    char shown[2048], path[2048];

    dh__url_redact(url, shown, sizeof(shown));
    dh__url_path(url, path, sizeof(path));
    switch (dh__url_kind(url)) {
    case DH_URL_HTTP:
    case DH_URL_HTTPS:
        break;
    case DH_URL_S3:
        return 0; /* a prefix ending in '/' is listed */
    default:
        return dh_err_set(e, DH_EUNSUPPORTED,
                          "%s: not a path, nor an http(s):// or s3:// URL",
                          shown);
    }
    if (dh__url_has_userinfo(url))
        return dh_err_set(e, DH_EINVAL,
                          "%s: a URL with user:password@ is refused (the "
                          "table and every message would carry the "
                          "password)",
                          shown);
    if (!path[0] || path[strlen(path) - 1] == '/')
        return dh_err_set(e, DH_EUNSUPPORTED,
                          "%s: an HTTP server has no listing to read: name "
                          "each object (or a .jsonl list of them)",
                          shown);
    return 0;
}

/* A URL input: a remote shard is indexed in place, an object probed. */
static int expand_shard(struct dh_probe_list *l, const char *path,
                        struct dh_err *e);

static int add_url(struct dh_probe_list *l, const char *url, const char *text,
                   struct dh_err *e);

/* One object of an S3 listing: a media file or a shard becomes an input. */
struct listing {
    struct dh_probe_list *l;
    const char *bucket;
    size_t found;
    struct dh_err *e;
};

static int on_object(void *arg, const char *key, int64_t size)
{
    struct listing *g = arg;
    char url[2200];
    const char *base = strrchr(key, '/');

    base = base ? base + 1 : key;
    if (size == 0 || base[0] == '.' ||
        !(wanted_in_folder(base) || ext_is(base, "tar")) || ext_is(base, "txt"))
        return 0; /* folders' markers, hidden and other objects */
    if (snprintf(url, sizeof(url), "s3://%s/%s", g->bucket, key) >=
        (int)sizeof(url))
        return dh_err_set(g->e, DH_ETOOBIG, "s3://%s/%s: key too long",
                          g->bucket, key);
    g->found++;
    return add_url(g->l, url, NULL, g->e);
}

static int list_s3(struct dh_probe_list *l, const char *url, struct dh_err *e)
{
    char bucket[64], prefix[2048], shown[2048];
    struct listing g = {.l = l, .bucket = bucket, .e = e};
    int rc;

    dh__url_redact(url, shown, sizeof(shown));
    if (dh__url_s3_split(url, bucket, sizeof(bucket), prefix, sizeof(prefix)))
        return dh_err_set(e, DH_EINVAL,
                          "%s: not s3://BUCKET/PREFIX/ (a bucket name of "
                          "3-63 characters a-z 0-9 . -)",
                          shown);
    rc = dh__s3_list(url, on_object, &g, e);
    if (!rc && !g.found)
        rc = dh_err_set(e, DH_EEMPTY,
                        "%s: no media objects or shards under this prefix",
                        shown);
    return rc;
}

static int add_url(struct dh_probe_list *l, const char *url, const char *text,
                   struct dh_err *e)
{
    char path[2048];
    int rc = url_check(url, e);

    if (rc)
        return rc;
    dh__url_path(url, path, sizeof(path));
    if (dh__url_kind(url) == DH_URL_S3 &&
        (!strchr(url + 5, '/') || url[strlen(url) - 1] == '/'))
        return list_s3(l, url, e);
    if (ext_is(path, "tar"))
        return expand_shard(l, url, e);
    return push_copy(l, url, text, e);
}

/* ---- tar shards ---- */

static int problem(struct dh_probe_list *l, const char *msg)
{
    char *m = dh__strdup(msg);

    if (m && l->nproblems == l->problems_cap) {
        size_t cap = l->problems_cap ? l->problems_cap * 2 : 16;
        char **p = dh__realloc(l->problems, cap * sizeof(*p));

        if (!p) {
            dh__free(m);
            m = NULL;
        } else {
            l->problems = p;
            l->problems_cap = cap;
        }
    }
    if (!m)
        return DH_ENOMEM;
    l->problems[l->nproblems++] = m;
    return 0;
}

static int ext_in(const char *ext, const char *const *list, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!strcasecmp(ext, list[i]))
            return 1;
    return 0;
}

/* One WebDataset sample being gathered: the members of one key. */
struct group {
    struct dh_probe_list *l;
    const char *shard; /* absolute */
    char key[DH_TAR_NAME_MAX];
    int open;
    char media[DH_TAR_NAME_MAX];
    int64_t moff, msize;
    int has_media, has_audio;
    char audio[DH_TAR_NAME_MAX]; /* the first audio member, kept in the row */
    int64_t aoff, asize;
    char *text;      /* from KEY.txt, else KEY.json's caption / text */
    int text_is_txt; /* a .txt caption wins over the JSON's */
    char *bad;       /* why this key is not a sample (a message) */
};

static void group_reset(struct group *g)
{
    dh__free(g->text);
    dh__free(g->bad);
    g->text = g->bad = NULL;
    g->open = g->has_media = g->has_audio = g->text_is_txt = 0;
}

/* The key's audio member, kept in the row for the audio decode that will
 * read it (audio_member, audio_offset, audio_bytes); DH_ENOMEM. */
static int audio_extra(struct dh_probe_item *it, const struct group *g)
{
    json_t *o = json_pack("{s:s,s:I,s:I}", "audio_member", g->audio,
                          "audio_offset", (json_int_t)g->aoff, "audio_bytes",
                          (json_int_t)g->asize);

    if (o)
        it->extra_json = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(o);
    it->audio_member = dh__strdup(g->audio);
    it->audio_offset = g->aoff;
    it->audio_size = g->asize;
    return it->extra_json && it->audio_member ? 0 : DH_ENOMEM;
}

static int group_flush(struct group *g, struct dh_err *e)
{
    struct dh_probe_list *l = g->l;
    char msg[DH_TAR_NAME_MAX + 4200];
    char *path = NULL, *member = NULL;
    int rc = 0;

    if (!g->open)
        return 0;
    if (g->bad || !g->has_media) {
        snprintf(msg, sizeof(msg), "%s: sample '%s': %s", g->shard, g->key,
                 g->bad         ? g->bad
                 : g->has_audio ? "an audio-only sample (audio is not "
                                  "decoded yet): left out"
                                : "no video or image member: left out");
        rc = problem(l, msg);
    } else if (!(path = dh__strdup(g->shard))) {
        rc = DH_ENOMEM;
    } else if (!(member = dh__strdup(g->media))) {
        dh__free(path);
        rc = DH_ENOMEM;
    } else {
        rc = push_member(l, path, g->text, member, g->moff, g->msize, e);
        g->text = NULL; /* taken */
        if (!rc && g->has_audio && audio_extra(&l->items[l->count - 1], g))
            rc = DH_ENOMEM;
    }
    group_reset(g);
    if (rc == DH_ENOMEM)
        return dh_err_set(e, DH_ENOMEM, "%s: out of memory", g->shard);
    return rc;
}

static void group_bad(struct group *g, const char *fmt, const char *name,
                      const char *why)
{
    char msg[DH_TAR_NAME_MAX + 512];

    if (g->bad)
        return; /* the first reason is the one reported */
    snprintf(msg, sizeof(msg), fmt, name, why);
    /* NULL when out of memory: the key is then kept as a sample */
    g->bad = dh__strdup(msg); /* checksrc: ok alloc */
}

/* A caption: KEY.txt's text, or KEY.json's "caption" / "text". */
static void group_caption(struct group *g, const char *name, int64_t off,
                          int64_t size, int json)
{
    struct dh_err sub;
    char *buf = NULL;
    json_t *o, *c;

    if ((json && g->text) || (!json && g->text_is_txt))
        return;
    if (dh__shard_read_member(g->shard, name, off, size, CAPTION_MAX, &buf,
                              &sub)) {
        group_bad(g, "member '%s': %s", name, sub.msg);
        return;
    }
    if (!json) {
        if (!dh__utf8_valid(buf)) {
            group_bad(g, "member '%s': %s", name, "not valid UTF-8");
            dh__free(buf);
            return;
        }
        dh__free(g->text);
        g->text = buf;
        g->text_is_txt = 1;
        return;
    }
    o = json_loads(buf, 0, NULL);
    dh__free(buf);
    c = json_object_get(o, "caption");
    if (!json_is_string(c))
        c = json_object_get(o, "text");
    if (!o)
        group_bad(g, "member '%s': %s", name, "not valid JSON");
    else if (json_is_string(c) && !(g->text = dh__strdup(json_string_value(c))))
        group_bad(g, "member '%s': %s", name, "out of memory");
    json_decref(o);
}

static int on_member(void *arg, const char *name, int64_t off, int64_t size,
                     struct dh_err *e)
{
    struct group *g = arg;
    char key[DH_TAR_NAME_MAX];
    const char *ext, *last;
    int rc;

    dh__tar_split_key(name, key, &ext);
    if (g->open && strcmp(key, g->key) && (rc = group_flush(g, e)))
        return rc;
    if (!g->open) {
        memcpy(g->key, key, strlen(key) + 1);
        g->open = 1;
    }
    last = strrchr(ext, '.') ? strrchr(ext, '.') + 1 : ext;
    if (!strcasecmp(last, "txt") || !strcasecmp(last, "json")) {
        group_caption(g, name, off, size, !strcasecmp(last, "json"));
    } else if (ext_in(last, audio_exts,
                      sizeof(audio_exts) / sizeof(audio_exts[0]))) {
        if (!g->has_audio && size > 0) {
            memcpy(g->audio, name, strlen(name) + 1);
            g->aoff = off;
            g->asize = size;
            g->has_audio = 1;
        }
    } else if (strcasecmp(last, "tar") &&
               ext_in(last, media_exts,
                      sizeof(media_exts) / sizeof(media_exts[0]))) {
        if (size == 0)
            group_bad(g, "member '%s': %s", name, "empty");
        else if (!g->has_media) {
            memcpy(g->media, name, strlen(name) + 1);
            g->moff = off;
            g->msize = size;
            g->has_media = 1;
        }
    }
    return 0; /* .cls and other metadata: not part of the row */
}

static int expand_shard(struct dh_probe_list *l, const char *path,
                        struct dh_err *e)
{
    struct group g = {.l = l};
    char *abs = dh__strdup(path);
    struct dh_err sub;
    int rc;

    if (!abs || !(abs = absolute(abs)))
        return dh_err_set(e, DH_ENOMEM, "%s: out of memory", path);
    g.shard = abs;
    l->shards++;
    dh_err_clear(&sub);
    rc = dh__shard_walk(abs, on_member, &g, &sub);
    if (rc == DH_ENOMEM) {
        dh_err_set(e, rc, "%s", sub.msg);
    } else {
        /* A damaged shard: the members before the damage are samples,
         * the damage is a problem; a shard that cannot be opened too. */
        int frc = group_flush(&g, e);

        if (rc && !frc)
            frc = problem(l, sub.msg)
                      ? dh_err_set(e, DH_ENOMEM, "%s: out of memory", path)
                      : 0;
        rc = frc;
    }
    group_reset(&g);
    dh__free(abs);
    return rc;
}

static int is_shard(const char *path)
{
    return ext_is(path, "tar") || dh__shard_sniff(path);
}

static int not_hidden(const struct dirent *d)
{
    return d->d_name[0] != '.';
}

static int walk(struct dh_probe_list *l, const char *dir, int depth,
                struct dh_err *e);

static int walk_entry(struct dh_probe_list *l, const char *dir,
                      const char *name, int depth, struct dh_err *e)
{
    struct stat st;
    char *path = join(dir, name);
    int rc = 0, wanted = wanted_in_folder(name) && !ext_is(name, "jsonl");

    if (!path)
        return dh_err_set(e, DH_ENOMEM, "%s: out of memory", dir);
    if (lstat(path, &st) == 0 && S_ISLNK(st.st_mode) && stat(path, &st) == 0 &&
        S_ISDIR(st.st_mode))
        goto out_free; /* no link-to-folder: no cycles */
    if (stat(path, &st)) {
        /* A dangling link or a link loop: a media name is handed to the
         * probe, which reports it like any unreadable file; anything else
         * is not ours to complain about. */
        if (wanted) {
            rc = push(l, path, NULL, e);
            path = NULL;
        }
    } else if (S_ISDIR(st.st_mode)) {
        rc = walk(l, path, depth + 1, e);
    } else if (wanted && ext_is(name, "tar")) {
        rc = expand_shard(l, path, e);
    } else if (wanted) {
        rc = push(l, path, NULL, e);
        path = NULL; /* taken */
    }
out_free:
    dh__free(path);
    return rc;
}

static int walk(struct dh_probe_list *l, const char *dir, int depth,
                struct dh_err *e)
{
    struct dirent **ents = NULL;
    int n, rc = 0;

    if (depth > WALK_MAX_DEPTH)
        return dh_err_set(e, DH_EINVAL, "%s: folders nested deeper than %d",
                          dir, WALK_MAX_DEPTH);
    n = scandir(dir, &ents, not_hidden, alphasort);
    if (n < 0)
        return dh_err_set(e, DH_EIO, "%s: %s", dir, strerror(errno));
    for (int i = 0; i < n; i++) {
        if (!rc)
            rc = walk_entry(l, dir, ents[i]->d_name, depth, e);
        free(ents[i]);
    }
    free(ents);
    return rc;
}

static char *dirname_of(const char *path)
{
    const char *slash = strrchr(path, '/');

    if (!slash)
        return dh__strdup(".");
    return dh__strndup(path, slash == path ? 1 : (size_t)(slash - path));
}

/* A table row naming a shard member: {"path": SHARD, "member", "offset",
 * "bytes"} (what probe wrote), kept as that member. */
static int list_member(struct dh_probe_list *l, const char *list,
                       const char *base, json_t *o, long lineno,
                       struct dh_err *e)
{
    json_t *jp = json_object_get(o, "path"), *jm = json_object_get(o, "member");
    json_t *jo = json_object_get(o, "offset"),
           *jb = json_object_get(o, "bytes");
    json_t *jt = json_object_get(o, "text");
    char *path, *member = NULL, *text = NULL;

    if (!json_is_string(jp) || !json_is_string(jm) || !json_is_integer(jo) ||
        !json_is_integer(jb) || json_integer_value(jo) < 0 ||
        json_integer_value(jb) <= 0 || !json_string_length(jm))
        return dh_err_set(e, DH_EFORMAT,
                          "%s:%ld: a shard member needs \"path\", "
                          "\"member\", \"offset\" >= 0 and \"bytes\" > 0 "
                          "(as `datahelix probe` writes them)",
                          list, lineno);
    if (is_url(json_string_value(jp))) { /* a remote shard's member */
        struct dh_err sub;

        dh_err_clear(&sub);
        if (url_check(json_string_value(jp), &sub))
            return dh_err_set(e, sub.code, "%s:%ld: %s", list, lineno, sub.msg);
    }
    path = json_string_value(jp)[0] == '/' || is_url(json_string_value(jp))
               ? dh__strdup(json_string_value(jp))
               : join(base, json_string_value(jp));
    if (!path || !(member = dh__strdup(json_string_value(jm))) ||
        (json_is_string(jt) && !(text = dh__strdup(json_string_value(jt))))) {
        dh__free(path);
        dh__free(member);
        return dh_err_set(e, DH_ENOMEM, "%s: out of memory", list);
    }
    return push_member(l, path, text, member, (int64_t)json_integer_value(jo),
                       (int64_t)json_integer_value(jb), e);
}

/* What a table row recorded of its file (probe wrote them). */
static void row_checks(struct dh_probe_item *it, json_t *o)
{
    json_t *jb = json_object_get(o, "bytes"),
           *jm = json_object_get(o, "mtime_ns");

    if (json_is_integer(jb) && json_integer_value(jb) > 0)
        it->row_size = (int64_t)json_integer_value(jb);
    if (json_is_integer(jm) && json_integer_value(jm) > 0)
        it->row_mtime_ns = (int64_t)json_integer_value(jm);
}

static int list_line(struct dh_probe_list *l, const char *list,
                     const char *base, const char *line, size_t len,
                     long lineno, struct dh_err *e)
{
    json_error_t jerr;
    json_t *o = json_loadb(line, len, 0, &jerr);
    json_t *jp, *jt;
    char *path = NULL;
    int rc;

    if (!o || !json_is_object(o)) {
        rc = dh_err_set(e, DH_EFORMAT, "%s:%ld: %s", list, lineno,
                        o ? "expected a JSON object" : jerr.text);
        goto out;
    }
    if (json_object_get(o, "datahelix_header")) {
        rc = 0; /* a table's header record is not an input */
        goto out;
    }
    jp = json_object_get(o, "path");
    jt = json_object_get(o, "text");
    if (json_object_get(o, "member")) {
        rc = list_member(l, list, base, o, lineno, e);
        goto out;
    }
    if (!json_is_string(jp) ||
        (jt && !json_is_string(jt) && !json_is_null(jt))) {
        rc = dh_err_set(e, DH_EFORMAT,
                        "%s:%ld: expected {\"path\": string, "
                        "\"text\": string}",
                        list, lineno);
        goto out;
    }
    if (is_url(json_string_value(jp))) { /* never a path beside the list */
        struct dh_err sub;

        dh_err_clear(&sub);
        if (add_url(l, json_string_value(jp),
                    json_is_string(jt) ? json_string_value(jt) : NULL, &sub))
            rc = dh_err_set(e, sub.code, "%s:%ld: %s", list, lineno, sub.msg);
        else
            rc = 0;
        goto out;
    }
    path = json_string_value(jp)[0] == '/' ? dh__strdup(json_string_value(jp))
                                           : join(base, json_string_value(jp));
    if (!path) {
        rc = dh_err_set(e, DH_ENOMEM, "%s: out of memory", list);
        goto out;
    }
    if (is_shard(path))
        rc = expand_shard(l, path, e); /* captions come from the shard */
    else if (!(rc = push_copy(l, path,
                              json_is_string(jt) ? json_string_value(jt) : NULL,
                              e)))
        row_checks(&l->items[l->count - 1], o);
out:
    dh__free(path);
    json_decref(o);
    return rc;
}

static int read_list(struct dh_probe_list *l, const char *list,
                     struct dh_err *e)
{
    FILE *f = fopen(list, "r");
    char *line = NULL, *base = NULL;
    size_t cap = 0;
    ssize_t n;
    long lineno = 0;
    int rc = 0;

    if (!f)
        return dh_err_set(e, DH_EIO, "%s: %s", list, strerror(errno));
    base = dirname_of(list);
    if (!base) {
        rc = dh_err_set(e, DH_ENOMEM, "%s: out of memory", list);
        goto out_close;
    }
    while (!rc && (n = getline(&line, &cap, f)) >= 0) {
        lineno++;
        if ((size_t)n > DH_TABLE_LINE_MAX) {
            rc = dh_err_set(e, DH_ETOOBIG,
                            "%s:%ld: line longer than %u "
                            "bytes",
                            list, lineno, DH_TABLE_LINE_MAX);
            break;
        }
        if (strspn(line, " \t\r\n") == (size_t)n)
            continue;
        rc = list_line(l, list, base, line, (size_t)n, lineno, e);
    }
    if (!rc && ferror(f))
        rc = dh_err_set(e, DH_EIO, "%s: read error", list);
    free(line);
    dh__free(base);
out_close:
    fclose(f);
    return rc;
}

int dh_probe_list_add_input(struct dh_probe_list *l, const char *input,
                            struct dh_err *e)
{
    struct stat st;
    size_t before = l->count;
    int rc;

    if (is_url(input))
        return add_url(l, input, NULL, e);
    if (stat(input, &st))
        return dh_err_set(e, DH_EIO, "%s: %s", input, strerror(errno));
    if (S_ISDIR(st.st_mode)) {
        rc = walk(l, input, 0, e);
        if (!rc && l->count == before)
            rc = dh_err_set(e, DH_EEMPTY, "%s: no media files in this folder",
                            input);
        return rc;
    }
    if (ext_is(input, "jsonl"))
        return read_list(l, input, e);
    if (S_ISREG(st.st_mode) && is_shard(input))
        return expand_shard(l, input, e);
    return push_copy(l, input, NULL, e);
}
