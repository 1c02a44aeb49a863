/*
 * table_reader.c - streaming reader of the JSONL descriptor table.
 *
 * Design: the file is read through a fixed 64 KiB buffer into a line buffer
 * that grows geometrically up to DH_TABLE_LINE_MAX, so memory is bounded by
 * the longest line, plus one bit per id for duplicate detection (grown
 * geometrically to the largest id seen).  Each line is parsed once; an object
 * whose key is "datahelix_header" is the header record and is only accepted
 * as the first non-blank line.  At EOF the bitmap tells whether ids are dense.
 * Renumbering replaces each id by its sample's position in file order and
 * keeps no bitmap: a table that lost lines is read as if it never had them.
 * Errors are sticky: after a failure every call returns the same code.
 *
 * Locking: none; one thread per reader.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/desc_json.h"
#include "datahelix/table.h"

#define RBUF_SIZE 65536

struct dh_table_reader {
    int fd;
    int own_fd;
    int err;      /* sticky error code, 0 if none */
    int eof;      /* end of input reached */
    long line;    /* 1-based number of the line last read */
    int any_line; /* a non-blank line was seen */
    char *name;
    char *header; /* compact JSON of the header object, or NULL */
    char *lbuf;   /* current line */
    size_t llen, lcap;
    char rbuf[RBUF_SIZE];
    size_t rpos, rlen;
    uint64_t *seen; /* one bit per id */
    size_t seen_words;
    int64_t max_id;
    int64_t nsamples;
    int64_t id_limit;    /* ids at or above cannot be dense; -1: unknown */
    int renumber;        /* ids are positions in file order */
    uint64_t renumbered; /* samples whose id changed */
};

static int reader_fail(struct dh_table_reader *r, struct dh_err *e, int code,
                       const char *why)
{
    r->err = code;
    return dh_err_set(e, code, "%s:%ld: %s", r->name, r->line, why);
}

static int open_fd(const char *path, int *fd, int *own, struct dh_err *e)
{
    if (strcmp(path, "-") == 0) {
        *fd = STDIN_FILENO;
        *own = 0;
        return 0;
    }
    *fd = open(path, O_RDONLY | O_CLOEXEC);
    if (*fd < 0)
        return dh_err_set(e, errno == ENOENT ? DH_ENOTFOUND : DH_EIO,
                          "%s: cannot open: %s", path, strerror(errno));
    *own = 1;
    return 0;
}

/* The shortest sample line, {"id":0,"kind":"text","text":""}, is 33
 * bytes: a file of S bytes holds fewer than S / 32 samples, so a dense id
 * is below that.  Checking it bounds the duplicate bitmap by the file. */
static int64_t id_limit_of(int fd)
{
    struct stat st;

    if (fstat(fd, &st) || !S_ISREG(st.st_mode))
        return -1;
    return (int64_t)st.st_size / 32 + 1;
}

int dh_table_reader_open(const char *path, struct dh_table_reader **out,
                         struct dh_err *e)
{
    struct dh_table_reader *r;
    int rc;

    dh__alloc_init();
    r = dh__calloc(1, sizeof(*r));
    if (!r)
        return dh_err_set(e, DH_ENOMEM, "%s: out of memory", path);
    r->max_id = -1;
    r->fd = -1;
    r->name = dh__strdup(strcmp(path, "-") == 0 ? "<stdin>" : path);
    if (!r->name) {
        rc = dh_err_set(e, DH_ENOMEM, "%s: out of memory", path);
        goto out_free_reader;
    }
    if ((rc = open_fd(path, &r->fd, &r->own_fd, e)) != 0)
        goto out_free_reader;
    r->id_limit = id_limit_of(r->fd);
    *out = r;
    return 0;
out_free_reader:
    dh_table_reader_destroy(r);
    return rc;
}

void dh_table_reader_destroy(struct dh_table_reader *r)
{
    if (!r)
        return;
    if (r->own_fd && r->fd >= 0)
        close(r->fd);
    dh__free(r->name);
    dh__free(r->header);
    dh__free(r->lbuf);
    dh__free(r->seen);
    dh__free(r);
}

void dh_table_reader_set_renumber(struct dh_table_reader *r, int on)
{
    r->renumber = on != 0;
}

uint64_t dh_table_reader_renumbered(const struct dh_table_reader *r)
{
    return r->renumbered;
}

const char *dh_table_reader_header(const struct dh_table_reader *r)
{
    return r->header;
}

long dh_table_reader_line(const struct dh_table_reader *r)
{
    return r->line;
}

/* ---- line assembly ---- */

static int fill(struct dh_table_reader *r, struct dh_err *e)
{
    ssize_t n;

    do
        n = read(r->fd, r->rbuf, sizeof(r->rbuf));
    while (n < 0 && errno == EINTR);
    if (n < 0) {
        r->err = DH_EIO;
        return dh_err_set(e, DH_EIO, "%s:%ld: read failed: %s", r->name,
                          r->line, strerror(errno));
    }
    r->rpos = 0;
    r->rlen = (size_t)n;
    r->eof = n == 0;
    return 0;
}

static int append(struct dh_table_reader *r, const char *p, size_t n,
                  struct dh_err *e)
{
    char msg[64];

    if (r->llen + n > DH_TABLE_LINE_MAX) {
        snprintf(msg, sizeof(msg), "line longer than %u bytes",
                 DH_TABLE_LINE_MAX);
        return reader_fail(r, e, DH_ETOOBIG, msg);
    }
    if (r->llen + n + 1 > r->lcap) {
        size_t cap = r->lcap ? r->lcap : 4096;
        char *nb;

        while (cap < r->llen + n + 1)
            cap *= 2;
        if (!(nb = dh__realloc(r->lbuf, cap)))
            return reader_fail(r, e, DH_ENOMEM, "out of memory");
        r->lbuf = nb;
        r->lcap = cap;
    }
    memcpy(r->lbuf + r->llen, p, n);
    r->llen += n;
    r->lbuf[r->llen] = '\0';
    return 0;
}

/* Reads the next line into lbuf.  Returns 1 (line), 0 (EOF) or an error. */
static int read_line(struct dh_table_reader *r, struct dh_err *e)
{
    int rc, got = 0;

    r->llen = 0;
    for (;;) {
        const char *p = r->rbuf + r->rpos, *nl;
        size_t avail = r->rlen - r->rpos;

        if (avail == 0) {
            if (r->eof || (rc = fill(r, e)) != 0 || r->eof)
                return r->err ? r->err : got;
            continue;
        }
        if (!got) {
            got = 1;
            r->line++;
        }
        nl = memchr(p, '\n', avail);
        if ((rc = append(r, p, nl ? (size_t)(nl - p) : avail, e)) != 0)
            return rc;
        r->rpos += nl ? (size_t)(nl - p) + 1 : avail;
        if (nl)
            return 1;
    }
}

static int is_blank(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r')
            return 0;
    return 1;
}

/* ---- per-line handling ---- */

static int take_header(struct dh_table_reader *r, json_t *obj, struct dh_err *e)
{
    json_t *h = json_object_get(obj, "datahelix_header");

    if (r->any_line)
        return reader_fail(r, e, DH_EFORMAT,
                           "header record only allowed on the first line");
    if (json_object_size(obj) != 1)
        return reader_fail(r, e, DH_EFORMAT,
                           "header record must have the single key "
                           "'datahelix_header'");
    if (!json_is_object(h))
        return reader_fail(r, e, DH_EFORMAT,
                           "field 'datahelix_header': expected object");
    r->header = json_dumps(h, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (!r->header)
        return reader_fail(r, e, DH_ENOMEM, "out of memory");
    return 0;
}

static int mark_id(struct dh_table_reader *r, int64_t id, struct dh_err *e)
{
    size_t w = (size_t)((uint64_t)id >> 6);
    uint64_t bit = (uint64_t)1 << (id & 63);
    char msg[192];

    if (r->id_limit >= 0 && id >= r->id_limit) {
        snprintf(msg, sizeof(msg),
                 "id %lld cannot be dense: a file this "
                 "size holds fewer than %lld samples; renumber the samples "
                 "in file order with `datahelix index --renumber`",
                 (long long)id, (long long)r->id_limit);
        return reader_fail(r, e, DH_EFORMAT, msg);
    }
    if (w >= r->seen_words) {
        size_t n = r->seen_words ? r->seen_words * 2 : 64;
        uint64_t *nb;

        while (n <= w)
            n *= 2;
        if (!(nb = dh__realloc(r->seen, n * sizeof(*nb))))
            return reader_fail(r, e, DH_ENOMEM, "out of memory");
        memset(nb + r->seen_words, 0, (n - r->seen_words) * sizeof(*nb));
        r->seen = nb;
        r->seen_words = n;
    }
    if (r->seen[w] & bit) {
        snprintf(msg, sizeof(msg), "duplicate id %lld", (long long)id);
        return reader_fail(r, e, DH_EDUP, msg);
    }
    r->seen[w] |= bit;
    r->nsamples++;
    if (id > r->max_id)
        r->max_id = id;
    return 0;
}

static int take_sample(struct dh_table_reader *r, json_t *obj,
                       struct dh_desc *d, struct dh_err *e)
{
    struct dh_err sub;
    int rc;

    dh_err_clear(&sub);
    if ((rc = dh__desc_from_object(obj, d, &sub)) != 0)
        return reader_fail(r, e, rc, sub.msg);
    if (r->renumber) {
        r->renumbered += d->id != r->nsamples;
        d->id = r->nsamples++;
        return 0;
    }
    if ((rc = mark_id(r, d->id, e)) != 0)
        dh_desc_fini(d);
    return rc;
}

/* Parses the current line: 1 = sample, 0 = header consumed, <0 = error. */
static int take_line(struct dh_table_reader *r, struct dh_desc *d,
                     struct dh_err *e)
{
    struct dh_err sub;
    json_error_t je;
    json_t *obj;
    int rc;

    obj = json_loadb(r->lbuf, r->llen, JSON_REJECT_DUPLICATES, &je);
    if (!obj) {
        dh_err_clear(&sub);
        rc = dh__json_load_error(&je, &sub);
        return reader_fail(r, e, rc, sub.msg);
    }
    if (json_is_object(obj) && json_object_get(obj, "datahelix_header"))
        rc = take_header(r, obj, e);
    else
        rc = take_sample(r, obj, d, e) == 0 ? 1 : r->err;
    r->any_line = 1;
    json_decref(obj);
    return rc;
}

/* The message names the first gap and the way out, so that a table with a
 * line removed by hand is one command away from usable again. */
static int check_dense(struct dh_table_reader *r, struct dh_err *e)
{
    int64_t id = 0;

    if (r->renumber || r->nsamples == r->max_id + 1)
        return 0;
    while (r->seen[id >> 6] & ((uint64_t)1 << (id & 63)))
        id++;
    r->err = DH_EFORMAT;
    return dh_err_set(e, DH_EFORMAT,
                      "%s: ids are not dense: id %lld is "
                      "missing (%lld of ids 0..%lld missing); renumber the "
                      "samples in file order with `datahelix index "
                      "--renumber`",
                      r->name, (long long)id,
                      (long long)(r->max_id + 1 - r->nsamples),
                      (long long)r->max_id);
}

int dh_table_reader_next(struct dh_table_reader *r, struct dh_desc *d,
                         struct dh_err *e)
{
    int rc;

    dh_desc_fini(d);
    if (r->err)
        return dh_err_set(e, r->err, "%s:%ld: reader already failed", r->name,
                          r->line);
    for (;;) {
        rc = read_line(r, e);
        if (rc < 0)
            return rc;
        if (rc == 0)
            return check_dense(r, e);
        if (is_blank(r->lbuf, r->llen))
            continue;
        rc = take_line(r, d, e);
        if (rc != 0)
            return rc;
    }
}
