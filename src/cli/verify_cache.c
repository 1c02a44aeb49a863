/*
 * verify_cache.c - the resume file of `datahelix probe --verify`
 * (verify_cache.h).
 *
 * Design: the whole file is loaded into an open-addressing hash table keyed
 * by path (latest line wins) that is never changed after open, so worker
 * threads look up without a lock while others append.  Each append is one
 * JSON line handed to write(2) on an O_APPEND descriptor: a process killed
 * mid-run leaves whole lines and at worst one torn last line, which the
 * next load skips.  No fsync per line: the file is a cache, and a lost tail
 * after a power cut only costs decoding those files again.
 *
 * Locking: `lock` serialises appends; the table is read-only after open.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "cli/verify_cache.h"
#include "core/alloc.h"
#include "core/desc_json.h"
#include "core/hash.h"

/* Bump with any change to what dh_media_verify() accepts, as well as to the
 * line format: a verdict under other rules must be decided again. */
#define CACHE_VERSION 2

struct slot {
    char *path; /* NULL: empty */
    struct dh_verify_entry v;
};

struct dh_verify_cache {
    char *path;
    int fd;
    struct slot *slots;
    size_t cap; /* a power of two, or 0 */
    size_t count;
    size_t lines;
    int torn; /* the file ends inside a line (killed mid-write) */
    pthread_mutex_t lock;
};

void dh_verify_entry_fini(struct dh_verify_entry *v)
{
    dh__free(v->reason);
    v->reason = NULL;
}

/* ---- the table ---- */

static size_t home(const struct dh_verify_cache *c, const char *path)
{
    return (size_t)dh__hash64(path, strlen(path), 0) & (c->cap - 1);
}

static struct slot *lookup(const struct dh_verify_cache *c, const char *path)
{
    size_t i;

    if (!c->cap)
        return NULL;
    for (i = home(c, path); c->slots[i].path; i = (i + 1) & (c->cap - 1))
        if (!strcmp(c->slots[i].path, path))
            return &c->slots[i];
    return &c->slots[i];
}

static int grow(struct dh_verify_cache *c)
{
    size_t ncap = c->cap ? 2 * c->cap : 1024, oldcap = c->cap;
    struct slot *old = c->slots;

    if (!(c->slots = dh__calloc(ncap, sizeof(*c->slots)))) {
        c->slots = old;
        return DH_ENOMEM;
    }
    c->cap = ncap;
    for (size_t i = 0; i < oldcap; i++)
        if (old[i].path)
            *lookup(c, old[i].path) = old[i];
    dh__free(old);
    return 0;
}

/* Takes `path` and `v` (their strings) whether or not it succeeds. */
static int put(struct dh_verify_cache *c, char *path, struct dh_verify_entry *v)
{
    struct slot *s;

    if ((c->count + 1) * 2 > c->cap && grow(c)) {
        dh__free(path);
        dh_verify_entry_fini(v);
        return DH_ENOMEM;
    }
    s = lookup(c, path);
    if (s->path) { /* a later line for the same file */
        dh__free(path);
        dh_verify_entry_fini(&s->v);
    } else {
        s->path = path;
        c->count++;
    }
    s->v = *v;
    return 0;
}

/* ---- lines ---- */

static int get_i64(json_t *o, const char *key, int64_t *out)
{
    json_t *x = json_object_get(o, key);

    if (!json_is_integer(x))
        return -1;
    *out = (int64_t)json_integer_value(x);
    return 0;
}

/* One line into (path, entry): 0; 1 for anything this version did not
 * write (a torn line, another version), which the caller skips; DH_ENOMEM.
 */
static int parse_line(const char *line, size_t len, char **path,
                      struct dh_verify_entry *v)
{
    json_error_t je;
    json_t *o = json_loadb(line, len, 0, &je), *reason;
    int64_t ver = 0;
    int rc = 1;

    memset(v, 0, sizeof(*v));
    if (!o)
        return dh__json_error_is_oom(&je) ? DH_ENOMEM : 1;
    if (!json_is_object(o) || get_i64(o, "v", &ver) || ver != CACHE_VERSION ||
        !json_is_string(json_object_get(o, "path")) ||
        get_i64(o, "size", &v->size) || get_i64(o, "mtime_ns", &v->mtime_ns) ||
        !json_is_boolean(json_object_get(o, "ok")))
        goto out;
    v->ok = json_is_true(json_object_get(o, "ok"));
    if (get_i64(o, "frames", &v->frames))
        v->frames = 0;
    v->media_s = json_number_value(json_object_get(o, "media_s"));
    reason = json_object_get(o, "reason");
    rc = DH_ENOMEM;
    if (!v->ok &&
        !(v->reason = dh__strdup(
              json_is_string(reason) ? json_string_value(reason) : "failed")))
        goto out;
    if (!(*path = dh__strdup(json_string_value(json_object_get(o, "path")))))
        goto out;
    rc = 0;
out:
    if (rc)
        dh_verify_entry_fini(v);
    json_decref(o);
    return rc;
}

static int load(struct dh_verify_cache *c, struct dh_err *e)
{
    FILE *f = fopen(c->path, "r");
    char *line = NULL, *path;
    size_t cap = 0;
    ssize_t n;
    int rc = 0;

    if (!f)
        return errno == ENOENT ? 0
                               : dh_err_set(e, DH_EIO, "%s: cannot read: %s",
                                            c->path, strerror(errno));
    while (!rc && (n = getline(&line, &cap, f)) >= 0) {
        struct dh_verify_entry v;

        c->torn = line[n - 1] != '\n';
        if (n <= 1)
            continue;
        c->lines++;
        rc = parse_line(line, (size_t)n, &path, &v);
        if (rc == 0)
            rc = put(c, path, &v);
        if (rc == DH_ENOMEM)
            dh_err_set(e, DH_ENOMEM, "%s: out of memory", c->path);
        else
            rc = 0; /* 1: a line this version did not write */
    }
    if (!rc && ferror(f))
        rc = dh_err_set(e, DH_EIO, "%s: read failed: %s", c->path,
                        strerror(errno));
    free(line); /* getline's buffer: libc's malloc */
    fclose(f);
    return rc;
}

/* `v` for `file` as one line with its newline, in a dh__malloc'd buffer. */
static int format_line(const char *file, const struct dh_verify_entry *v,
                       char **out, size_t *len)
{
    json_t *o = json_pack(
        "{s:i, s:s, s:I, s:I, s:b, s:I, s:f}", "v", CACHE_VERSION, "path", file,
        "size", (json_int_t)v->size, "mtime_ns", (json_int_t)v->mtime_ns, "ok",
        v->ok, "frames", (json_int_t)v->frames, "media_s", v->media_s);
    char *s, *nl;
    size_t n;

    if (!o) /* a path JSON cannot hold (not UTF-8) */
        return DH_EINVAL;
    if (!v->ok &&
        json_object_set_new(o, "reason",
                            json_string(v->reason ? v->reason : "failed"))) {
        json_decref(o);
        return DH_EINVAL;
    }
    s = json_dumps(o,
                   JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(9));
    json_decref(o);
    if (!s)
        return DH_ENOMEM;
    n = strlen(s);
    if (!(nl = dh__realloc(s, n + 2))) {
        dh__free(s);
        return DH_ENOMEM;
    }
    nl[n] = '\n';
    nl[n + 1] = '\0';
    *out = nl;
    *len = n + 1;
    return 0;
}

static int write_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t k = write(fd, p, n);

        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return -1;
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

/* ---- public ---- */

int dh_verify_cache_open(const char *path, struct dh_verify_cache **out,
                         struct dh_err *e)
{
    struct dh_verify_cache *c = dh__calloc(1, sizeof(*c));
    int rc;

    if (!c || !(c->path = dh__strdup(path))) {
        dh__free(c);
        return dh_err_set(e, DH_ENOMEM, "%s: out of memory", path);
    }
    c->fd = -1;
    pthread_mutex_init(&c->lock, NULL);
    if ((rc = load(c, e)))
        goto out_close;
    c->fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    /* End a torn last line, or the next append would join it and be
     * skipped with it on the next load. */
    if (c->fd >= 0 && c->torn && write_all(c->fd, "\n", 1) != 0) {
        close(c->fd);
        c->fd = -1;
    }
    if (c->fd < 0) {
        rc = dh_err_set(e, DH_EIO, "%s: cannot write: %s", path,
                        strerror(errno));
        goto out_close;
    }
    *out = c;
    return 0;
out_close:
    dh_verify_cache_close(c);
    return rc;
}

const struct dh_verify_entry *
dh_verify_cache_find(const struct dh_verify_cache *c, const char *file,
                     int64_t size, int64_t mtime_ns)
{
    const struct slot *s = lookup(c, file);

    if (!s || !s->path || s->v.size != size || s->v.mtime_ns != mtime_ns)
        return NULL;
    return &s->v;
}

size_t dh_verify_cache_loaded(const struct dh_verify_cache *c)
{
    return c->count;
}

size_t dh_verify_cache_lines(const struct dh_verify_cache *c)
{
    return c->lines;
}

int dh_verify_cache_append(struct dh_verify_cache *c, const char *file,
                           const struct dh_verify_entry *v, struct dh_err *e)
{
    char *line;
    size_t len;
    int rc = format_line(file, v, &line, &len);

    if (rc)
        return dh_err_set(e, rc, "%s: %s: cannot record it: %s", c->path, file,
                          rc == DH_ENOMEM ? "out of memory"
                                          : "not valid UTF-8");
    pthread_mutex_lock(&c->lock);
    if (write_all(c->fd, line, len) == 0)
        c->lines++;
    else
        rc = dh_err_set(e, DH_EIO, "%s: write failed: %s", c->path,
                        strerror(errno));
    pthread_mutex_unlock(&c->lock);
    dh__free(line);
    return rc;
}

static int write_items(int fd, size_t n, dh_verify_cache_item_fn item,
                       void *arg, size_t *lines)
{
    for (size_t i = 0; i < n; i++) {
        const char *path;
        const struct dh_verify_entry *v = item(arg, i, &path);
        char *line;
        size_t len;
        int rc;

        if (!v)
            continue;
        if ((rc = format_line(path, v, &line, &len)) == DH_EINVAL)
            continue; /* never appended either */
        if (rc)
            return rc;
        rc = write_all(fd, line, len) ? DH_EIO : 0;
        dh__free(line);
        if (rc)
            return rc;
        (*lines)++;
    }
    return 0;
}

int dh_verify_cache_rewrite(struct dh_verify_cache *c, size_t n,
                            dh_verify_cache_item_fn item, void *arg,
                            struct dh_err *e)
{
    char tmp[4096];
    size_t lines = 0;
    int fd, rc;

    if ((size_t)snprintf(tmp, sizeof(tmp), "%s.tmp.%ld", c->path,
                         (long)getpid()) >= sizeof(tmp))
        return dh_err_set(e, DH_ETOOBIG, "%s: path too long", c->path);
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return dh_err_set(e, DH_EIO, "%s: cannot write: %s", tmp,
                          strerror(errno));
    rc = write_items(fd, n, item, arg, &lines);
    if (close(fd) && !rc)
        rc = DH_EIO;
    if (!rc && rename(tmp, c->path))
        rc = DH_EIO;
    if (rc) {
        unlink(tmp);
        return dh_err_set(e, rc, "%s: rewrite failed: %s", c->path,
                          rc == DH_ENOMEM ? "out of memory" : strerror(errno));
    }
    pthread_mutex_lock(&c->lock);
    close(c->fd);
    c->fd = open(c->path, O_WRONLY | O_APPEND | O_CLOEXEC);
    c->lines = lines;
    pthread_mutex_unlock(&c->lock);
    return c->fd < 0 ? dh_err_set(e, DH_EIO, "%s: cannot reopen: %s", c->path,
                                  strerror(errno))
                     : 0;
}

void dh_verify_cache_close(struct dh_verify_cache *c)
{
    if (!c)
        return;
    if (c->fd >= 0)
        close(c->fd);
    for (size_t i = 0; i < c->cap; i++)
        if (c->slots[i].path) {
            dh__free(c->slots[i].path);
            dh_verify_entry_fini(&c->slots[i].v);
        }
    dh__free(c->slots);
    dh__free(c->path);
    pthread_mutex_destroy(&c->lock);
    dh__free(c);
}
