/*
 * shard_walk.c - the members of a tar shard, read in place (shard_walk.h).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/tar.h"
#include "media/shard_walk.h"
#include "media/source.h"

/* Exactly len bytes at off, or an error naming the shard and what. */
static int read_exact(struct dh_source *s, int64_t off, void *buf, size_t len,
                      const char *what, struct dh_err *e)
{
    size_t got = 0;

    while (got < len) {
        int64_t n = dh__source_read(s, off + (int64_t)got, (char *)buf + got,
                                    len - got, e);

        if (n < 0)
            return (int)n;
        if (n == 0)
            return dh_err_set(e, DH_EMEDIA,
                              "%s: %s at byte %lld is cut off: the shard "
                              "ends at byte %lld",
                              s->name, what, (long long)off,
                              (long long)s->size);
        got += (size_t)n;
    }
    return 0;
}

/* The data of an extension header (a GNU long name or pax records). */
static int read_ext(struct dh_source *s, int64_t off, int64_t size, char **buf,
                    struct dh_err *e)
{
    if (size > DH_TAR_EXT_MAX)
        return dh_err_set(e, DH_EFORMAT,
                          "%s: an extension header of %lld bytes at byte "
                          "%lld (at most %d)",
                          s->name, (long long)size, (long long)off,
                          DH_TAR_EXT_MAX);
    if (!(*buf = dh__malloc((size_t)size + 1)))
        return dh_err_set(e, DH_ENOMEM, "%s: out of memory", s->name);
    (*buf)[size] = '\0';
    return read_exact(s, off, *buf, (size_t)size, "an extension header", e);
}

static int long_name(struct dh_source *s, int64_t off, int64_t size,
                     struct dh_tar_pending *p, struct dh_err *e)
{
    char *buf = NULL;
    size_t n;
    int rc = read_ext(s, off, size, &buf, e);

    if (!rc) {
        n = strnlen(buf, (size_t)size);
        if (n == 0 || n >= DH_TAR_NAME_MAX)
            rc = dh_err_set(e, DH_EFORMAT,
                            "%s: a long name of %zu bytes at byte %lld",
                            s->name, n, (long long)off);
        else {
            memcpy(p->name, buf, n + 1);
            p->has_name = 1;
        }
    }
    dh__free(buf);
    return rc;
}

static int pax(struct dh_source *s, int64_t off, int64_t size,
               struct dh_tar_pending *p, struct dh_err *e)
{
    char *buf = NULL;
    struct dh_err sub;
    int rc = read_ext(s, off, size, &buf, e);

    if (!rc && (rc = dh__tar_pax(buf, (size_t)size, p, &sub)))
        dh_err_set(e, rc, "%s: byte %lld: %s", s->name, (long long)off,
                   sub.msg);
    dh__free(buf);
    return rc;
}

static int walk(struct dh_source *s, dh_shard_member_fn fn, void *arg,
                struct dh_err *e)
{
    unsigned char blk[DH_TAR_BLOCK];
    struct dh_tar_header h;
    struct dh_tar_pending p;
    char last[DH_TAR_NAME_MAX] = "";
    struct dh_err sub;
    int64_t at = 0;
    int rc;

    memset(&p, 0, sizeof(p));
    while (at + DH_TAR_BLOCK <= s->size) {
        int64_t data = at + DH_TAR_BLOCK;

        if ((rc = read_exact(s, at, blk, sizeof(blk), "a header", e)))
            return rc;
        if ((rc = dh__tar_parse(blk, &h, &sub)))
            return dh_err_set(e, rc, "%s: byte %lld%s%s%s: %s", s->name,
                              (long long)at, last[0] ? " (after member '" : "",
                              last, last[0] ? "')" : "", sub.msg);
        if (h.type == DH_TAR_END)
            return 0; /* what follows is padding */
        if (h.type != DH_TAR_PAX_GLOBAL)
            dh__tar_apply(&p, &h);
        if (h.size > s->size - data)
            return dh_err_set(e, DH_EMEDIA,
                              "%s: member '%s' (%lld bytes at byte %lld) is "
                              "cut off: the shard ends at byte %lld",
                              s->name, h.name, (long long)h.size,
                              (long long)data, (long long)s->size);
        switch (h.type) {
        case DH_TAR_LONGNAME:
            rc = long_name(s, data, h.size, &p, e);
            break;
        case DH_TAR_PAX:
            rc = pax(s, data, h.size, &p, e);
            break;
        case DH_TAR_FILE:
            rc = fn(arg, h.name, data, h.size, e);
            snprintf(last, sizeof(last), "%s", h.name);
            break;
        default:
            rc = 0; /* folders, links, global records: nothing to read */
        }
        if (rc)
            return rc;
        at = data + dh__tar_padded(h.size);
    }
    if (at < s->size)
        return dh_err_set(e, DH_EMEDIA,
                          "%s: a header at byte %lld is cut off: the shard "
                          "ends at byte %lld",
                          s->name, (long long)at, (long long)s->size);
    return 0; /* ends after a member, without the zero blocks */
}

int dh__shard_walk(const char *path, dh_shard_member_fn fn, void *arg,
                   struct dh_err *e)
{
    struct dh_source s;
    struct dh_source_ref ref = {.path = path};
    int rc;

    dh__source_init(&s);
    /* an empty file is a problem the caller reports ("empty file") */
    rc = dh__source_open(&s, &ref, e);
    if (!rc)
        rc = walk(&s, fn, arg, e);
    dh__source_fini(&s);
    return rc;
}

int dh__shard_sniff(const char *path)
{
    unsigned char blk[DH_TAR_BLOCK];
    struct dh_tar_header h;
    struct dh_err e;
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    ssize_t n;

    if (fd < 0)
        return 0;
    n = pread(fd, blk, sizeof(blk), 0);
    close(fd);
    if (n != (ssize_t)sizeof(blk) || memcmp(blk + 257, "ustar", 5))
        return 0;
    return dh__tar_parse(blk, &h, &e) == 0 && h.type != DH_TAR_END;
}

int dh__shard_read_member(const char *path, const char *member, int64_t offset,
                          int64_t size, int64_t max, char **out,
                          struct dh_err *e)
{
    struct dh_source s;
    struct dh_source_ref ref = {
        .path = path, .member = member, .offset = offset, .size = size};
    int rc;

    *out = NULL;
    if (size > max)
        return dh_err_set(e, DH_ETOOBIG, "%s:%s: %lld bytes (at most %lld)",
                          path, member, (long long)size, (long long)max);
    if (!(*out = dh__malloc((size_t)size + 1)))
        return dh_err_set(e, DH_ENOMEM, "%s: out of memory", path);
    (*out)[size] = '\0';
    if (size == 0)
        return 0;
    dh__source_init(&s);
    rc = dh__source_open(&s, &ref, e);
    if (!rc)
        rc = read_exact(&s, 0, *out, (size_t)size, "the member", e);
    dh__source_fini(&s);
    if (rc) {
        dh__free(*out);
        *out = NULL;
    }
    return rc;
}
