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
#include "datahelix/probe.h"

#define WALK_MAX_DEPTH 64

static const char *const media_exts[] = {
    "mp4",  "m4v",  "mov", "mkv",  "webm", "avi", "ts",   "mts",
    "m2ts", "flv",  "mpg", "mpeg", "wmv",  "3gp", "ogv",  "gif",
    "jpg",  "jpeg", "png", "webp", "bmp",  "tif", "tiff", "txt",
};

void dh_probe_list_init(struct dh_probe_list *l)
{
    memset(l, 0, sizeof(*l));
}

void dh_probe_list_fini(struct dh_probe_list *l)
{
    for (size_t i = 0; i < l->count; i++) {
        dh__free(l->items[i].path);
        dh__free(l->items[i].text);
    }
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

    if (path[0] == '/' || !getcwd(cwd, sizeof(cwd)))
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
    l->items[l->count].path = path;
    l->items[l->count].text = text;
    l->count++;
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
    jp = json_object_get(o, "path");
    jt = json_object_get(o, "text");
    if (!json_is_string(jp) ||
        (jt && !json_is_string(jt) && !json_is_null(jt))) {
        rc = dh_err_set(e, DH_EFORMAT,
                        "%s:%ld: expected {\"path\": string, "
                        "\"text\": string}",
                        list, lineno);
        goto out;
    }
    path = json_string_value(jp)[0] == '/' ? dh__strdup(json_string_value(jp))
                                           : join(base, json_string_value(jp));
    if (!path) {
        rc = dh_err_set(e, DH_ENOMEM, "%s: out of memory", list);
        goto out;
    }
    rc = push_copy(l, path, json_is_string(jt) ? json_string_value(jt) : NULL,
                   e);
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
    return push_copy(l, input, NULL, e);
}
