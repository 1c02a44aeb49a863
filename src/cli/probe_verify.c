/*
 * probe_verify.c - `datahelix probe --verify`: a full decode of every
 * probed video and image (dh_media_verify), so that a file that opens but
 * does not decode is left out of the table before a training job meets it
 * at some step on some rank.
 *
 * Design: a second pass over the probed items, on --jobs threads that each
 * own one dh_media (one decoder thread each: the pass is parallel across
 * files, which scales better than threads within one decode).  Workers
 * claim items through an atomic counter and write only their item's slot.
 * Before decoding, a worker looks the file up in the resume cache
 * (verify_cache.h) by path, size and mtime; after decoding it appends the
 * verdict at once, so a run killed at any point resumes where it was.
 * Only verdicts about the file are cached: a failure that says nothing
 * about it (out of memory, I/O, watchdog) is retried by the next run.
 * Images are verified too (one picture: cheap, and a truncated JPEG is as
 * useless as a truncated MP4); text is not decoded.
 *
 * Locking: `lock` serialises stderr (error lines and the progress line);
 * counters are atomics; the cache has its own lock.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "cli/cli.h"
#include "cli/probe_verify.h"
#include "cli/verify_cache.h"
#include "core/alloc.h"
#include "core/url.h"
#include "datahelix/media.h"
#include "datahelix/probe.h"

struct vitem {
    struct dh_verify_entry v;
    int have; /* v holds this run's verdict */
    int keep; /* ... and it belongs in the cache */
};

struct vpass {
    const struct dh_probe_list *list;
    const struct dh_desc *descs;
    int *ok;
    const struct probe_verify_opts *o;
    struct dh_verify_cache *cache; /* NULL: none */
    struct vitem *res;             /* one per list item */
    size_t *todo, ntodo;
    atomic_size_t next, done, failed, cached, decoded;
    atomic_uint_least64_t media_us;
    atomic_int stop, cache_off;
    pthread_mutex_t lock;
};

/* ---- stderr ---- */

static void say(struct vpass *p, const char *path, const char *reason)
{
    pthread_mutex_lock(&p->lock);
    if (path)
        dh_cli_error_line("probe", "%s: %s", path, reason);
    else
        dh_cli_error_line("probe", "%s", reason);
    pthread_mutex_unlock(&p->lock);
}

/* e->msg without the "PATH: " it starts with (dh_media names the file):
 * the cache stores the reason, the line adds the path back. */
static const char *reason_of(const char *path, const char *msg)
{
    size_t n = strlen(path);

    if (!strncmp(msg, path, n) && msg[n] == ':' && msg[n + 1] == ' ')
        return msg + n + 2;
    return msg[0] ? msg : "failed";
}

/* ---- one file ---- */

/* Codes that say something about the file, not about this run. */
static int is_verdict(int rc)
{
    return rc != DH_ENOMEM && rc != DH_EIO && rc != DH_ETIMEOUT &&
           rc != DH_ENOTFOUND;
}

static void decode(struct vpass *p, struct dh_media *m, size_t i,
                   struct vitem *it)
{
    const struct dh_probe_item *in = &p->list->items[i];
    struct dh_source_ref ref = {in->path, in->member, in->offset, in->size};
    struct dh_media_verify r;
    struct dh_err e;
    int rc;

    memset(&r, 0, sizeof(r));
    dh_err_clear(&e);
    rc = dh_media_open_ref(m, &ref, &e);
    if (rc == 0)
        rc = dh_media_verify(m, &r, &e);
    dh_media_close(m);
    it->v.ok = rc == 0;
    it->v.frames = r.frames;
    it->v.media_s = r.media_s;
    it->keep = rc == 0 || is_verdict(rc);
    if (rc) /* checksrc: ok alloc - say() reports NULL as "out of memory" */
        it->v.reason = dh__strdup(reason_of(dh_probe_item_name(in), e.msg));
    else if (r.media_s > 0 && p->descs[i].kind == DH_KIND_VIDEO)
        atomic_fetch_add(&p->media_us, (uint64_t)(r.media_s * 1e6));
    atomic_fetch_add(&p->decoded, 1);
}

static void record(struct vpass *p, const char *path, const struct vitem *it)
{
    struct dh_err e;

    if (!p->cache || !it->keep || atomic_load(&p->cache_off))
        return;
    dh_err_clear(&e);
    if (dh_verify_cache_append(p->cache, path, &it->v, &e) == DH_EIO &&
        !atomic_exchange(&p->cache_off, 1))
        say(p, NULL, e.msg); /* once; verdicts stay right, resume is lost */
}

static int reuse(struct vpass *p, const char *path, struct vitem *it)
{
    const struct dh_verify_entry *hit;

    if (!p->cache || !(hit = dh_verify_cache_find(p->cache, path, it->v.size,
                                                  it->v.mtime_ns)))
        return 0;
    it->v.ok = hit->ok;
    it->v.frames = hit->frames;
    it->v.media_s = hit->media_s;
    it->v.reason = hit->reason ? dh__strdup(hit->reason) : NULL;
    it->keep = 1;
    atomic_fetch_add(&p->cached, 1);
    return 1;
}

static void verify_one(struct vpass *p, struct dh_media *m, size_t i)
{
    const char *file = p->list->items[i].path;
    const char *path = dh_probe_item_name(&p->list->items[i]);
    struct vitem *it = &p->res[i];
    struct stat st;

    /* A shard member is checked against its shard's size and mtime; a
     * remote object has no mtime to trust: decoded each time. */
    if (dh__url_kind(file) != DH_URL_NONE) {
        decode(p, m, i, it);
    } else if (stat(file, &st) != 0) {
        it->v.ok = 0;
        it->v.reason = dh__strdup(strerror(errno));
    } else {
        it->v.size = (int64_t)st.st_size;
        it->v.mtime_ns = (int64_t)st.st_mtim.tv_sec * 1000000000 +
                         st.st_mtim.tv_nsec;
        if (!reuse(p, path, it)) {
            decode(p, m, i, it);
            record(p, path, it);
        }
    }
    it->have = 1;
    if (it->v.ok)
        return;
    p->ok[i] = 0;
    say(p, path, it->v.reason ? it->v.reason : "out of memory");
    atomic_fetch_add(&p->failed, 1);
    if (!p->o->keep_going)
        atomic_store(&p->stop, 1);
}

static void *worker(void *arg)
{
    struct vpass *p = arg;
    struct dh_media *m = NULL;
    struct dh_err e;
    size_t k;

    dh_err_clear(&e);
    if (dh_media_create(&m, &e) != 0) {
        say(p, NULL, e.msg);
        atomic_store(&p->stop, 1);
        return NULL;
    }
    dh_media_set_threads(m, 1);
    while (!atomic_load(&p->stop) &&
           (k = atomic_fetch_add(&p->next, 1)) < p->ntodo) {
        verify_one(p, m, p->todo[k]);
        atomic_fetch_add(&p->done, 1);
    }
    dh_media_destroy(m);
    return NULL;
}

/* ---- the pass ---- */

static void show(struct vpass *p, struct dh_progress *bar)
{
    double el = dh_cli_now() - bar->t_start;
    double media = (double)atomic_load(&p->media_us) / 1e6;
    char note[64];

    snprintf(note, sizeof(note), "%.1fx real time", el > 0 ? media / el : 0);
    pthread_mutex_lock(&p->lock);
    dh_progress_set_note(bar, note);
    dh_progress_update(bar, atomic_load(&p->done), atomic_load(&p->failed));
    pthread_mutex_unlock(&p->lock);
}

static void wait_workers(void *arg)
{
    struct vpass *p = arg;
    struct timespec ts = {0, 50 * 1000 * 1000};
    struct dh_progress bar;

    dh_progress_start(&bar, "verify", p->ntodo);
    if (p->o->quiet)
        dh_progress_log_every(&bar, 0);
    while (atomic_load(&p->done) < p->ntodo && !atomic_load(&p->stop)) {
        show(p, &bar);
        nanosleep(&ts, NULL);
    }
    pthread_mutex_lock(&p->lock);
    dh_progress_finish(&bar);
    pthread_mutex_unlock(&p->lock);
}

static void run_workers(struct vpass *p)
{
    int64_t n = p->o->jobs;

    if ((size_t)n > p->ntodo)
        n = (int64_t)p->ntodo;
    dh_cli_run_threads(n, worker, wait_workers, p);
}

static const struct dh_verify_entry *kept_item(void *arg, size_t i,
                                               const char **path)
{
    const struct vpass *p = arg;

    *path = dh_probe_item_name(&p->list->items[i]);
    return p->res[i].have && p->res[i].keep ? &p->res[i].v : NULL;
}

/* Drops stale and duplicate lines once the run has seen every file, so
 * the cache stays one line per file however often files change. */
static void compact(struct vpass *p)
{
    size_t keep = 0;
    struct dh_err e;

    if (!p->cache || atomic_load(&p->stop) || atomic_load(&p->cache_off))
        return;
    for (size_t i = 0; i < p->list->count; i++)
        keep += p->res[i].have && p->res[i].keep;
    if (dh_verify_cache_lines(p->cache) == keep)
        return;
    dh_err_clear(&e);
    if (dh_verify_cache_rewrite(p->cache, p->list->count, kept_item, p, &e))
        say(p, NULL, e.msg);
}

static int plan_todo(struct vpass *p)
{
    size_t n = p->list->count;

    p->res = dh__calloc(n ? n : 1, sizeof(*p->res));
    p->todo = dh__calloc(n ? n : 1, sizeof(*p->todo));
    if (!p->res || !p->todo)
        return -1;
    for (size_t i = 0; i < n; i++)
        if (p->ok[i] && p->descs[i].kind != DH_KIND_TEXT)
            p->todo[p->ntodo++] = i;
    return 0;
}

static void fill_stats(struct vpass *p, double t0,
                       struct probe_verify_stats *st)
{
    memset(st, 0, sizeof(*st));
    st->files = atomic_load(&p->done);
    st->left_out = atomic_load(&p->failed);
    st->cached = atomic_load(&p->cached);
    st->decoded = atomic_load(&p->decoded);
    st->media_s = (double)atomic_load(&p->media_us) / 1e6;
    st->wall_s = dh_cli_now() - t0;
    st->stopped = atomic_load(&p->stop);
}

static void closing_line(const struct probe_verify_opts *o,
                         const struct probe_verify_stats *st)
{
    double w = st->wall_s > 0 ? st->wall_s : 1e-9;

    if (o->quiet)
        return;
    fprintf(stderr,
            "probe: verified %zu file%s, %zu left out, %zu reused "
            "from the cache",
            st->files, st->files == 1 ? "" : "s", st->left_out, st->cached);
    if (st->decoded)
        fprintf(stderr,
                "; decoded %zu in %.2f s: %.1f files/s, %.1f s of "
                "media = %.1fx real time",
                st->decoded, st->wall_s, (double)st->decoded / w, st->media_s,
                st->media_s / w);
    fputc('\n', stderr);
}

int dh_cli_probe_verify(const struct dh_probe_list *list,
                        const struct dh_desc *descs, int *ok,
                        const struct probe_verify_opts *o,
                        struct probe_verify_stats *st)
{
    struct vpass p = {.list = list, .descs = descs, .ok = ok, .o = o};
    double t0 = dh_cli_now();
    struct dh_err e;
    int rc = 0;

    pthread_mutex_init(&p.lock, NULL);
    dh_err_clear(&e);
    if (plan_todo(&p)) {
        dh_cli_error("probe", "verify: out of memory for %zu files",
                     list->count);
        rc = DH_EXIT_FAIL;
        goto out_free;
    }
    if (o->cache_path &&
        dh_verify_cache_open(o->cache_path, &p.cache, &e) != 0) {
        dh_cli_error("probe", "%s", e.msg);
        rc = DH_EXIT_FAIL;
        goto out_free;
    }
    if (p.ntodo)
        run_workers(&p);
    compact(&p);
    fill_stats(&p, t0, st);
    closing_line(o, st);
out_free:
    if (rc)
        fill_stats(&p, t0, st);
    dh_verify_cache_close(p.cache);
    for (size_t i = 0; p.res && i < list->count; i++)
        dh_verify_entry_fini(&p.res[i].v);
    dh__free(p.res);
    dh__free(p.todo);
    pthread_mutex_destroy(&p.lock);
    return rc;
}
