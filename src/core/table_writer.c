/*
 * table_writer.c - streaming writer of the JSONL descriptor table.
 *
 * Design: records are serialised by dh_desc_to_json() into a 64 KiB output
 * buffer and written with write(2) to `PATH.tmp.<pid>` (O_EXCL).  Closing
 * flushes, fsyncs, renames into place and fsyncs the directory, so readers
 * see either the old table or the whole new one.  "-" writes to stdout with
 * no rename.  The writer does not check id density; the reader does.
 *
 * Locking: none; one thread per writer.
 */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/fileio.h"
#include "core/utf8.h"
#include "core/desc_json.h"
#include "datahelix/table.h"

#define WBUF_SIZE 65536

struct dh_table_writer {
    int fd;
    int to_stdout;
    int direct;  /* a device or FIFO: written in place, not renamed */
    int created; /* tmp exists and is ours to remove */
    char *path;
    char *tmp;
    size_t wlen;
    char wbuf[WBUF_SIZE];
};

static int flush_buf(struct dh_table_writer *w, struct dh_err *e)
{
    if (dh__write_all(w->fd, w->wbuf, w->wlen) != 0)
        return dh_err_set(e, DH_EIO, "%s: write failed: %s", w->path,
                          strerror(errno));
    w->wlen = 0;
    return 0;
}

/* Appends `s` and a newline, spilling through the buffer. */
static int put_line(struct dh_table_writer *w, const char *s, struct dh_err *e)
{
    size_t n = strlen(s);
    int rc;

    if (w->wlen + n + 1 > sizeof(w->wbuf) && (rc = flush_buf(w, e)) != 0)
        return rc;
    if (n + 1 > sizeof(w->wbuf)) {
        if (dh__write_all(w->fd, s, n) != 0 ||
            dh__write_all(w->fd, "\n", 1) != 0)
            return dh_err_set(e, DH_EIO, "%s: write failed: %s", w->path,
                              strerror(errno));
        return 0;
    }
    memcpy(w->wbuf + w->wlen, s, n);
    w->wbuf[w->wlen + n] = '\n';
    w->wlen += n + 1;
    return 0;
}

static int open_target(struct dh_table_writer *w, const char *path,
                       struct dh_err *e)
{
    char pid[32];
    size_t n;

    struct stat st;

    if (strcmp(path, "-") == 0) {
        w->to_stdout = 1;
        w->fd = STDOUT_FILENO;
        return 0;
    }
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode)) {
        /* /dev/null, a FIFO: renaming a file over it would replace it. */
        if (S_ISDIR(st.st_mode))
            return dh_err_set(e, DH_EINVAL, "%s: is a folder", path);
        w->fd = open(path, O_WRONLY | O_CLOEXEC);
        if (w->fd < 0)
            return dh_err_set(e, DH_EIO, "%s: cannot open: %s", path,
                              strerror(errno));
        w->direct = 1;
        return 0;
    }
    n = (size_t)snprintf(pid, sizeof(pid), ".tmp.%ld", (long)getpid());
    if (!(w->tmp = dh__malloc(strlen(path) + n + 1)))
        return dh_err_set(e, DH_ENOMEM, "%s: out of memory", path);
    memcpy(w->tmp, path, strlen(path));
    memcpy(w->tmp + strlen(path), pid, n + 1);
    w->fd = open(w->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (w->fd < 0)
        return dh_err_set(e, DH_EIO,
                          "%s: cannot create its temporary file "
                          "%s: %s",
                          path, w->tmp, strerror(errno));
    w->created = 1;
    return 0;
}

static int write_header(struct dh_table_writer *w, const char *header_json,
                        struct dh_err *e)
{
    json_t *h, *rec = NULL;
    char *text = NULL;
    json_error_t je;
    int rc;

    h = json_loads(header_json, JSON_REJECT_DUPLICATES, &je);
    if (!h && dh__json_error_is_oom(&je))
        return dh_err_set(e, DH_ENOMEM, "%s: out of memory", w->path);
    if (!h || !json_is_object(h)) {
        json_decref(h);
        return dh_err_set(e, DH_EINVAL, "%s: header is not a JSON object",
                          w->path);
    }
    rec = json_object();
    /* json_object_set_new() takes `h` even when it fails */
    rc = rec ? json_object_set_new(rec, "datahelix_header", h) : -1;
    h = rec ? NULL : h;
    if (rc != 0) {
        rc = dh_err_set(e, DH_ENOMEM, "%s: out of memory", w->path);
        goto out_free_rec;
    }
    /* Header reals are coefficients and settings: 15 digits, not binary
     * noise such as 0.90000000000000002. */
    text = json_dumps(rec, JSON_COMPACT | JSON_PRESERVE_ORDER |
                               JSON_REAL_PRECISION(15));
    rc = text ? put_line(w, text, e)
              : dh_err_set(e, DH_ENOMEM, "%s: out of memory", w->path);
    dh__free(text);
out_free_rec:
    json_decref(h);
    json_decref(rec);
    return rc;
}

int dh_table_writer_open(const char *path, const char *header_json,
                         struct dh_table_writer **out, struct dh_err *e)
{
    struct dh_table_writer *w;
    int rc;

    dh__alloc_init();
    if (!(w = dh__calloc(1, sizeof(*w))))
        return dh_err_set(e, DH_ENOMEM, "%s: out of memory", path);
    w->fd = -1;
    if (!(w->path = dh__strdup(path))) {
        rc = dh_err_set(e, DH_ENOMEM, "%s: out of memory", path);
        goto out_abort;
    }
    if ((rc = open_target(w, path, e)) != 0)
        goto out_abort;
    if (header_json && (rc = write_header(w, header_json, e)) != 0)
        goto out_abort;
    *out = w;
    return 0;
out_abort:
    dh_table_writer_abort(w);
    return rc;
}

int dh_table_writer_write(struct dh_table_writer *w, const struct dh_desc *d,
                          struct dh_err *e)
{
    char *text = NULL;
    int rc = dh_desc_to_json(d, &text);

    if (rc == DH_EINVAL)
        return dh_err_set(e, rc,
                          "%s: sample %lld (%s): invalid descriptor "
                          "(a field out of range, or text that is not UTF-8)",
                          w->path, (long long)d->id,
                          d->path && dh__utf8_valid(d->path) ? d->path : "?");
    if (rc)
        return dh_err_set(e, rc, "%s: %s", w->path, dh_strerror(rc));
    rc = put_line(w, text, e);
    dh__free(text);
    return rc;
}

static void fsync_dir(const char *path)
{
    const char *slash = strrchr(path, '/');
    char dir[4096];
    int fd;

    if (!slash)
        snprintf(dir, sizeof(dir), ".");
    else
        snprintf(dir, sizeof(dir), "%.*s", (int)(slash - path + 1), path);
    fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        (void)fsync(fd); /* best effort: the data itself is already synced */
        close(fd);
    }
}

static int commit(struct dh_table_writer *w, struct dh_err *e)
{
    int rc = flush_buf(w, e);

    if (rc || w->to_stdout || w->direct)
        return rc;
    if (fsync(w->fd) != 0)
        return dh_err_set(e, DH_EIO, "%s: fsync failed: %s", w->tmp,
                          strerror(errno));
    rc = close(w->fd);
    w->fd = -1;
    if (rc != 0)
        return dh_err_set(e, DH_EIO, "%s: close failed: %s", w->tmp,
                          strerror(errno));
    if (rename(w->tmp, w->path) != 0)
        return dh_err_set(e, DH_EIO, "%s: rename failed: %s", w->path,
                          strerror(errno));
    w->created = 0; /* nothing left to remove */
    fsync_dir(w->path);
    return 0;
}

int dh_table_writer_close(struct dh_table_writer *w, struct dh_err *e)
{
    int rc = commit(w, e);

    dh_table_writer_abort(w);
    return rc;
}

void dh_table_writer_abort(struct dh_table_writer *w)
{
    if (!w)
        return;
    if (!w->to_stdout && w->fd >= 0)
        close(w->fd);
    if (w->created)
        unlink(w->tmp);
    dh__free(w->tmp);
    dh__free(w->path);
    dh__free(w);
}
