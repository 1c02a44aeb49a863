/*
 * source.c - the source backends: a local file or a byte range of one (a
 * tar shard's member), and a buffer in memory (see source.h).
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>
#include <unistd.h>

#include <libavutil/mem.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/url.h"
#include "media/av_util.h"
#include "media/source.h"

void dh__source_init(struct dh_source *s)
{
    memset(s, 0, sizeof(*s));
    s->fd = -1;
}

/* s->name: "path" or "path:member", a URL without its credentials or
 * query (what every message shows). */
static int set_name(struct dh_source *s, const char *path, const char *member)
{
    size_t n = strlen(path) + (member ? strlen(member) + 1 : 0) + 1;
    char shown[2048];

    if (dh__url_kind(path) != DH_URL_NONE) {
        dh__url_redact(path, shown, sizeof(shown));
        path = shown;
    }
    if (dh__buf_reserve(&s->name, &s->name_cap, n))
        return DH_ENOMEM;
    if (member)
        snprintf(s->name, n, "%s:%s", path, member);
    else
        memmove(s->name, path, n);
    return 0;
}

/* ---- a local file, whole or a window of it ---- */

static void drop_fd(struct dh_source *s)
{
    if (s->fd >= 0)
        close(s->fd);
    s->fd = -1;
    if (s->fd_path)
        s->fd_path[0] = '\0';
}

/* s->fd_path = path, in a buffer kept across files (no allocation per
 * sample in the steady state). */
static int set_fd_path(struct dh_source *s, const char *path)
{
    size_t n = strlen(path) + 1;

    if (dh__buf_reserve(&s->fd_path, &s->fd_path_cap, n))
        return DH_ENOMEM;
    memcpy(s->fd_path, path, n);
    return 0;
}

/* The kept fd still names `path` (same file, not replaced since). */
static int kept_fd_is(const struct dh_source *s, const char *path,
                      const struct stat *st)
{
    return s->fd >= 0 && s->fd_path && !strcmp(s->fd_path, path) &&
           st->st_dev == s->dev && st->st_ino == s->ino;
}

/* O_NONBLOCK: a FIFO or device named by a table row (or swapped in after
 * the stat) cannot block the open; fstat of what was opened decides. */
static int open_regular(struct dh_source *s, const char *path, struct stat *st,
                        struct dh_err *e)
{
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);

    if (fd < 0)
        return dh_err_set(e, DH_EIO, "%s: %s", path, strerror(errno));
    if (fstat(fd, st)) {
        int err = errno;

        close(fd);
        return dh_err_set(e, DH_EIO, "%s: %s", path, strerror(err));
    }
    if (!S_ISREG(st->st_mode)) {
        close(fd);
        return dh_err_set(e, DH_EINVAL, "%s: not a regular file", path);
    }
    drop_fd(s);
    if (set_fd_path(s, path)) {
        close(fd);
        return dh_err_set(e, DH_ENOMEM, "%s: out of memory", path);
    }
    s->fd = fd;
    s->dev = st->st_dev;
    s->ino = st->st_ino;
    return 0;
}

/* Another file of the same size (re-encoded, replaced) would pass the
 * size check: the time is the table's too (whole files only: a shard
 * appended to keeps its members where they were). */
static int check_mtime(const struct dh_source_ref *ref, int64_t now,
                       struct dh_err *e)
{
    if (ref->mtime_ns <= 0 || now == ref->mtime_ns)
        return 0;
    return dh_err_set(e, DH_EMEDIA,
                      "%s: the file changed since probe (modified %.3f s "
                      "%s the time the table records): re-run `datahelix "
                      "probe` (a copy that kept no times, cp without -p, "
                      "looks changed too)",
                      ref->path, fabs((double)(now - ref->mtime_ns)) / 1e9,
                      now > ref->mtime_ns ? "after" : "before");
}

static int file_open(struct dh_source *s, const struct dh_source_ref *ref,
                     struct dh_err *e)
{
    struct stat st;
    int rc;

    if (stat(ref->path, &st))
        return dh_err_set(e, DH_EIO, "%s: %s", ref->path, strerror(errno));
    if (!S_ISREG(st.st_mode))
        return dh_err_set(e, DH_EINVAL, "%s: not a regular file", ref->path);
    if (!kept_fd_is(s, ref->path, &st) &&
        (rc = open_regular(s, ref->path, &st, e)))
        return rc;
    s->keep_fd = ref->member != NULL;
    if (!ref->member) {
        s->base = 0;
        s->size = st.st_size;
        if (st.st_size == 0)
            return dh_err_set(e, DH_EMEDIA, "%s: empty file", ref->path);
        /* decoding another file than the one probed would pass silently
         * as data: the size is what a table records */
        if (ref->size > 0 && st.st_size != ref->size)
            return dh_err_set(e, DH_EMEDIA,
                              "%s: the file changed since probe (%lld bytes, "
                              "the table says %lld): re-run `datahelix "
                              "probe`",
                              ref->path, (long long)st.st_size,
                              (long long)ref->size);
        return check_mtime(ref, dh__mtime_ns(&st), e);
    }
    if (ref->offset < 0 || ref->size <= 0 || ref->offset > st.st_size ||
        ref->size > st.st_size - ref->offset)
        return dh_err_set(e, DH_EMEDIA,
                          "%s:%s: the member's %lld bytes at byte %lld lie "
                          "past the shard's end (%lld bytes): the shard "
                          "changed since probe; re-run `datahelix probe`",
                          ref->path, ref->member, (long long)ref->size,
                          (long long)ref->offset, (long long)st.st_size);
    s->base = ref->offset;
    s->size = ref->size;
    return 0;
}

static int64_t file_read_at(struct dh_source *s, int64_t off, void *buf,
                            size_t len, struct dh_err *e)
{
    ssize_t n;

    do
        n = pread(s->fd, buf, len, (off_t)(s->base + off));
    while (n < 0 && errno == EINTR);
    if (n < 0)
        return dh_err_set(e, DH_EIO, "%s: read at byte %lld: %s", s->name,
                          (long long)off, strerror(errno));
    return n;
}

static void file_close(struct dh_source *s)
{
    if (!s->keep_fd)
        drop_fd(s);
}

static const struct dh_source_ops file_ops = {
    .open = file_open,
    .read_at = file_read_at,
    .close = file_close,
};

/* ---- memory ---- */

static int64_t mem_read_at(struct dh_source *s, int64_t off, void *buf,
                           size_t len, struct dh_err *e)
{
    (void)e;
    memcpy(buf, s->data + off, len);
    return (int64_t)len;
}

static void mem_close(struct dh_source *s)
{
    s->data = NULL;
}

static const struct dh_source_ops mem_ops = {
    .read_at = mem_read_at,
    .close = mem_close,
};

/* ---- the interface ---- */

void dh__source_close(struct dh_source *s)
{
    if (s->ops)
        s->ops->close(s);
    s->ops = NULL;
    s->size = s->pos = 0;
}

void dh__source_fini(struct dh_source *s)
{
    dh__source_close(s);
    drop_fd(s);
    dh__remote_free(s->remote);
    dh__free(s->fd_path);
    dh__free(s->name);
    dh__source_init(s);
}

/* The backend for a path: a local file or an http(s) object. */
static const struct dh_source_ops *backend(const char *path, const char *name,
                                           struct dh_err *e)
{
    switch (dh__url_kind(path)) {
    case DH_URL_NONE:
        return &file_ops;
    case DH_URL_HTTP:
    case DH_URL_HTTPS:
    case DH_URL_S3:
        return &dh__http_source_ops;
    default:
        dh_err_set(e, DH_EUNSUPPORTED,
                   "%s: not a path, nor an http(s):// or s3:// URL: its "
                   "scheme is not read",
                   name);
        return NULL;
    }
}

int dh__source_open(struct dh_source *s, const struct dh_source_ref *ref,
                    struct dh_err *e)
{
    const struct dh_source_ops *ops;
    int rc;

    dh__source_close(s);
    if (!ref->path || !ref->path[0])
        return dh_err_set(e, DH_EINVAL, "source: no path");
    if (set_name(s, ref->path, ref->member))
        return dh_err_set(e, DH_ENOMEM, "%s: out of memory", ref->path);
    if (!(ops = backend(ref->path, s->name, e)))
        return e->code;
    rc = ops->open(s, ref, e);
    if (rc) {
        drop_fd(s); /* an input that failed is not kept */
        return rc;
    }
    s->ops = ops;
    return 0;
}

int dh__source_open_mem(struct dh_source *s, const void *data, size_t len,
                        const char *name, struct dh_err *e)
{
    dh__source_close(s);
    if (set_name(s, name, NULL))
        return dh_err_set(e, DH_ENOMEM, "%s: out of memory", name);
    if (!data || len == 0)
        return dh_err_set(e, DH_EMEDIA, "%s: empty input", name);
    s->data = data;
    s->size = (int64_t)len;
    s->ops = &mem_ops;
    return 0;
}

/* ---- FFmpeg's view ---- */

static int avio_read_cb(void *opaque, uint8_t *buf, int size)
{
    struct dh_source *s = opaque;
    int64_t n;

    if (s->overdue && s->overdue(s->overdue_arg))
        return AVERROR_EXIT;
    n = dh__source_read(s, s->pos, buf, (size_t)size, &s->err);
    if (n < 0) {
        s->failed = 1;
        return AVERROR(EIO);
    }
    if (n == 0)
        return AVERROR_EOF;
    s->pos += n;
    return (int)n;
}

static int64_t avio_seek_cb(void *opaque, int64_t off, int whence)
{
    struct dh_source *s = opaque;
    int64_t base;

    whence &= ~AVSEEK_FORCE;
    if (whence == AVSEEK_SIZE)
        return s->size;
    if (whence != SEEK_SET && whence != SEEK_CUR && whence != SEEK_END)
        return AVERROR(EINVAL);
    base = whence == SEEK_CUR ? s->pos : whence == SEEK_END ? s->size : 0;
    if (off > s->size - base || base + off < 0)
        return AVERROR(EINVAL);
    s->pos = base + off;
    return s->pos;
}

AVIOContext *dh__source_avio(struct dh_source *s, int buf)
{
    uint8_t *iobuf = av_malloc((size_t)buf);
    AVIOContext *pb;

    s->pos = 0;
    s->failed = 0;
    if (!iobuf)
        return NULL;
    pb = avio_alloc_context(iobuf, buf, 0, s, avio_read_cb, NULL, avio_seek_cb);
    if (!pb)
        av_free(iobuf);
    return pb;
}

void dh__source_avio_free(AVIOContext **pb)
{
    if (*pb) {
        av_freep(&(*pb)->buffer);
        avio_context_free(pb);
    }
}

int dh__source_input_error(struct dh_source *s, int averr, struct dh_err *e)
{
    char buf[128];

    if (s->failed) {
        s->failed = 0;
        return dh_err_set(e, s->err.code ? s->err.code : DH_EIO, "%s",
                          s->err.msg);
    }
    return dh_err_set(e, DH_EMEDIA, "%s: %s%s", s->name,
                      dh__av_errstr(averr, buf, sizeof(buf)),
                      dh__av_list_hint(s->name));
}

/* DATAHELIX_READ_DELAY_MS=N: every read of a file source sleeps N ms
 * first (0..10000), as a store with that latency would; read once per
 * process.  For tests and benchmarks of read-bound runs (docs/shards.md):
 * the sleep is inside the read, so the read stage, stats and placement's
 * read term all see it. */
static int read_delay_ms(void)
{
    static _Atomic int cached = -1;
    int v = atomic_load(&cached);

    if (v < 0) {
        const char *s = getenv("DATAHELIX_READ_DELAY_MS");
        char *end = NULL;
        long n = s ? strtol(s, &end, 10) : 0;

        v = s && end != s && !*end && n > 0 && n <= 10000 ? (int)n : 0;
        atomic_store(&cached, v);
    }
    return v;
}

int64_t dh__source_read(struct dh_source *s, int64_t off, void *buf, size_t len,
                        struct dh_err *e)
{
    double t0 = dh__mono_msf();
    int delay = s->ops == &file_ops ? read_delay_ms() : 0;
    int64_t n = 0;

    if (delay) {
        struct timespec ts = {delay / 1000, (long)(delay % 1000) * 1000000};

        while (nanosleep(&ts, &ts) && errno == EINTR)
            ;
    }
    /* the backends see only reads inside the input */
    if ((int64_t)len > s->size - off)
        len = off < s->size ? (size_t)(s->size - off) : 0;
    if (len > 0)
        n = s->ops->read_at(s, off, buf, len, e);

    s->read_ms += dh__mono_msf() - t0;
    s->reads++;
    if (n > 0)
        s->bytes += n;
    return n;
}
