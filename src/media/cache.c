/*
 * cache.c - the host-local read-through cache of remote object chunks
 * (see cache.h).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/hash.h"
#include "core/log.h"
#include "media/cache.h"

#define STATS_MAGIC 0x44484341u /* "DHCA" */
#define TOUCH_S 60
#define TMP_STALE_S 60

/* The folder's `stats` file, mapped shared by every process. */
struct shared {
    uint32_t magic, version;
    _Atomic uint64_t hits, misses, fetched_bytes, evictions, bytes;
};

struct dh_cache {
    char dir[1024];
    uint64_t bound;
    struct shared *sh;
};

/* The caches this process opened, one per folder, never closed (a few;
 * every loader of a job names the same one). */
#define MAX_CACHES 8
static struct dh_cache caches[MAX_CACHES];
static int ncaches;
static pthread_mutex_t caches_mu = PTHREAD_MUTEX_INITIALIZER;
static struct dh_cache *env_cache;
static pthread_once_t cache_once = PTHREAD_ONCE_INIT;

static int map_stats(const char *dir, int create, struct shared **out)
{
    char path[1100];
    int fd, rc = -1;
    struct stat st;
    void *p;

    snprintf(path, sizeof(path), "%s/stats", dir);
    fd = open(path, (create ? O_RDWR | O_CREAT : O_RDONLY) | O_CLOEXEC, 0644);
    if (fd < 0)
        return -1;
    /* the first process sizes it; a racing one sees 0 or the full size */
    if (create && flock(fd, LOCK_EX) == 0) {
        if (!fstat(fd, &st) && st.st_size < (off_t)sizeof(struct shared) &&
            ftruncate(fd, sizeof(struct shared)) == 0) {
            struct shared init = {.magic = STATS_MAGIC, .version = 1};

            if (pwrite(fd, &init, sizeof(init), 0) != (ssize_t)sizeof(init))
                goto out;
        }
        flock(fd, LOCK_UN);
    }
    if (fstat(fd, &st) || st.st_size < (off_t)sizeof(struct shared))
        goto out;
    p = mmap(NULL, sizeof(struct shared),
             create ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED)
        goto out;
    if (((struct shared *)p)->magic != STATS_MAGIC) {
        munmap(p, sizeof(struct shared));
        goto out;
    }
    *out = p;
    rc = 0;
out:
    close(fd);
    return rc;
}

struct dh_cache *dh__cache_open(const char *dir, uint64_t bound)
{
    struct dh_cache *c = NULL;

    if (!bound)
        bound = 10ULL << 30;
    if (bound < DH_CACHE_CHUNK)
        bound = DH_CACHE_CHUNK;
    pthread_mutex_lock(&caches_mu);
    for (int i = 0; i < ncaches; i++)
        if (!strcmp(caches[i].dir, dir)) {
            c = &caches[i];
            goto out;
        }
    if (ncaches == MAX_CACHES) {
        dh__log(DH_LOG_WARN,
                "cache: %s: more than %d cache folders in one "
                "process: not cached",
                dir, MAX_CACHES);
        goto out;
    }
    if (mkdir(dir, 0755) && errno != EEXIST) {
        dh__log(DH_LOG_WARN, "cache: %s: %s: not cached", dir, strerror(errno));
        goto out;
    }
    if (snprintf(caches[ncaches].dir, sizeof(caches[ncaches].dir), "%s", dir) >=
            (int)sizeof(caches[ncaches].dir) ||
        map_stats(dir, 1, &caches[ncaches].sh)) {
        dh__log(DH_LOG_WARN,
                "cache: %s/stats: cannot be made or mapped: "
                "not cached",
                dir);
        goto out;
    }
    caches[ncaches].bound = bound;
    c = &caches[ncaches++];
out:
    pthread_mutex_unlock(&caches_mu);
    return c;
}

static void cache_init(void)
{
    const char *dir = getenv("DATAHELIX_CACHE_DIR");
    const char *bytes = getenv("DATAHELIX_CACHE_BYTES");
    char *end = NULL;
    unsigned long long b = 10ULL << 30;

    if (!dir || !*dir)
        return;
    if (bytes && *bytes) {
        errno = 0;
        b = strtoull(bytes, &end, 10);
        if (errno || *end || b < DH_CACHE_CHUNK) {
            dh__log(DH_LOG_WARN,
                    "cache: DATAHELIX_CACHE_BYTES=%s: expected a byte count "
                    "of at least %d: no cache",
                    bytes, DH_CACHE_CHUNK);
            return;
        }
    }
    env_cache = dh__cache_open(dir, b);
}

struct dh_cache *dh__cache_get(void)
{
    pthread_once(&cache_once, cache_init);
    return env_cache;
}

int dh__cache_read_stats(const char *dir, struct dh_cache_stats *out,
                         struct dh_err *e)
{
    struct shared *sh;

    memset(out, 0, sizeof(*out));
    if (map_stats(dir, 0, &sh))
        return dh_err_set(e, DH_EIO, "%s/stats: not a datahelix cache", dir);
    out->hits = atomic_load(&sh->hits);
    out->misses = atomic_load(&sh->misses);
    out->fetched_bytes = atomic_load(&sh->fetched_bytes);
    out->evictions = atomic_load(&sh->evictions);
    out->bytes = atomic_load(&sh->bytes);
    munmap(sh, sizeof(*sh));
    return 0;
}

/* ---- names ---- */

/* dir/XX/NAME-IDX (a chunk; idx < 0: NAME.size): XX the first byte of
 * the name (256 sub-folders, made by the first write into one:
 * create_in_sub; a lookup makes nothing). */
static int chunk_path(const struct dh_cache *c, const char *url, int64_t idx,
                      char *out, size_t cap)
{
    size_t n = strlen(url);
    uint64_t a = dh__hash64(url, n, 0x6461746168656c69ull);
    uint64_t b = dh__hash64(url, n, 0x63616368650a0a0aull);
    char sub[1100];
    int w;

    snprintf(sub, sizeof(sub), "%s/%02x", c->dir, (unsigned)(a >> 56));
    if (idx < 0)
        w = snprintf(out, cap, "%s/%016" PRIx64 "%016" PRIx64 ".size", sub, a,
                     b);
    else
        w = snprintf(out, cap, "%s/%016" PRIx64 "%016" PRIx64 "-%" PRId64, sub,
                     a, b, idx);
    return w < (int)cap ? 0 : -1;
}

/* open(path, flags | O_CREAT, 0644) of a file in a sub-folder, making
 * the sub-folder when it is not there yet. */
static int create_in_sub(const char *path, int flags)
{
    int fd = open(path, flags | O_CREAT | O_CLOEXEC, 0644);
    char sub[1400];
    const char *slash;

    if (fd >= 0 || errno != ENOENT || !(slash = strrchr(path, '/')))
        return fd;
    snprintf(sub, sizeof(sub), "%.*s", (int)(slash - path), path);
    if (mkdir(sub, 0755) && errno != EEXIST)
        return -1;
    return open(path, flags | O_CREAT | O_CLOEXEC, 0644);
}

/* ---- eviction ---- */

struct entry {
    time_t mtime;
    off_t size;
    char path[1400];
};

static int by_age(const void *a, const void *b)
{
    const struct entry *x = a, *y = b;

    return x->mtime < y->mtime ? -1 : x->mtime > y->mtime;
}

/* A temporary file whose writer is gone (NAME.tmp.PID.N). */
static int stale_tmp(const char *name, const struct stat *st, time_t now)
{
    const char *t = strstr(name, ".tmp.");
    long pid;

    if (!t)
        return 0;
    pid = strtol(t + 5, NULL, 10);
    return now - st->st_mtime > TMP_STALE_S ||
           (pid > 0 && kill((pid_t)pid, 0) && errno == ESRCH);
}

/* Down to 90 % of the bound, oldest first; the one scan at a time. */
static void evict(struct dh_cache *c)
{
    char lock[1100];
    struct entry *v = NULL;
    size_t n = 0, cap = 0;
    uint64_t total = 0, target = c->bound / 10 * 9;
    time_t now = time(NULL);
    int lfd;

    snprintf(lock, sizeof(lock), "%s/evict.lock", c->dir);
    lfd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (lfd < 0)
        return;
    if (flock(lfd, LOCK_EX | LOCK_NB)) {
        close(lfd); /* another process scans */
        return;
    }
    for (int s = 0; s < 256; s++) {
        char sub[1100];
        DIR *d;
        struct dirent *de;

        snprintf(sub, sizeof(sub), "%s/%02x", c->dir, s);
        if (!(d = opendir(sub)))
            continue;
        while ((de = readdir(d))) {
            struct stat st;
            char path[1400];

            if (de->d_name[0] == '.')
                continue;
            snprintf(path, sizeof(path), "%s/%s", sub, de->d_name);
            if (lstat(path, &st) || !S_ISREG(st.st_mode))
                continue;
            if (strstr(de->d_name, ".lock") || strstr(de->d_name, ".size"))
                continue; /* a few bytes each: they go with their chunks */
            if (strstr(de->d_name, ".tmp.")) {
                if (stale_tmp(de->d_name, &st, now))
                    unlink(path);
                continue;
            }
            if (n == cap) {
                size_t nc = cap ? cap * 2 : 256;
                struct entry *nv = dh__realloc(v, nc * sizeof(*v));

                if (!nv)
                    break;
                v = nv;
                cap = nc;
            }
            v[n].mtime = st.st_mtime;
            v[n].size = st.st_size;
            snprintf(v[n].path, sizeof(v[n].path), "%s", path);
            total += (uint64_t)st.st_size;
            n++;
        }
        closedir(d);
    }
    if (v)
        qsort(v, n, sizeof(*v), by_age);
    for (size_t i = 0; i < n && total > target; i++) {
        if (unlink(v[i].path) == 0) {
            char lk[1500];

            total -= (uint64_t)v[i].size;
            atomic_fetch_add(&c->sh->evictions, 1);
            /* its lock goes too: at worst a waiter on the old one and a
             * new fetcher both fetch it, each writing it whole */
            snprintf(lk, sizeof(lk), "%s.lock", v[i].path);
            unlink(lk);
        }
    }
    atomic_store(&c->sh->bytes, total);
    dh__free(v);
    flock(lfd, LOCK_UN);
    close(lfd);
}

/* ---- a chunk ---- */

static int64_t read_chunk(int fd, uint8_t *buf, const char *path,
                          struct dh_err *e)
{
    struct stat st;
    size_t got = 0;

    if (fstat(fd, &st) || st.st_size <= 0 || st.st_size > DH_CACHE_CHUNK)
        return dh_err_set(e, DH_EIO, "cache: %s: not a chunk", path);
    while (got < (size_t)st.st_size) {
        ssize_t r = pread(fd, buf + got, (size_t)st.st_size - got, (off_t)got);

        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return dh_err_set(e, DH_EIO, "cache: %s: %s", path,
                              r ? strerror(errno) : "cut short");
        got += (size_t)r;
    }
    if (time(NULL) - st.st_mtime > TOUCH_S)
        futimens(fd, NULL); /* recently used: evicted last */
    return (int64_t)got;
}

static int64_t try_hit(const char *path, uint8_t *buf, struct dh_err *e)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    int64_t n;

    if (fd < 0)
        return 0;
    n = read_chunk(fd, buf, path, e);
    close(fd);
    return n;
}

/* Writes the file under a temporary name and renames it: whole or not at
 * all.  A failure to keep it is not the sample's: logged once a minute.
 * 1 when kept. */
static int write_whole(struct dh_cache *c, const char *path, const uint8_t *buf,
                       size_t len)
{
    static _Atomic uint64_t last_warn;
    static _Atomic unsigned seq;
    char tmp[1500];
    int fd, ok = 0;

    snprintf(tmp, sizeof(tmp), "%s.tmp.%ld.%u", path, (long)getpid(),
             atomic_fetch_add(&seq, 1));
    fd = create_in_sub(tmp, O_WRONLY | O_EXCL);
    if (fd >= 0) {
        size_t put = 0;

        while (put < len) {
            ssize_t w = write(fd, buf + put, len - put);

            if (w < 0 && errno == EINTR)
                continue;
            if (w <= 0)
                break;
            put += (size_t)w;
        }
        ok = put == len && close(fd) == 0 && rename(tmp, path) == 0;
        if (!ok)
            unlink(tmp);
    }
    if (!ok) {
        uint64_t now = dh__mono_ms(), was = atomic_load(&last_warn);

        if ((!was || now - was > 60000) &&
            atomic_compare_exchange_strong(&last_warn, &was, now))
            dh__log(DH_LOG_WARN, "cache: %s: cannot keep a chunk: %s", c->dir,
                    strerror(errno));
        return 0;
    }
    return 1;
}

static void keep(struct dh_cache *c, const char *path, const uint8_t *buf,
                 size_t len)
{
    if (write_whole(c, path, buf, len) &&
        atomic_fetch_add(&c->sh->bytes, len) + len > c->bound)
        evict(c);
}

int64_t dh__cache_size(struct dh_cache *c, const char *url, char *etag)
{
    char path[1400], buf[DH_CACHE_ETAG_MAX + 40], *nl;
    int fd;
    ssize_t n;
    long long v;
    char *end;

    etag[0] = '\0';
    if (chunk_path(c, url, -1, path, sizeof(path)) ||
        (fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
        return -1;
    n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0)
        return -1;
    buf[n] = '\0';
    v = strtoll(buf, &end, 10);
    if (end == buf || *end != '\n' || v < 0)
        return -1;
    if ((nl = strchr(end + 1, '\n')) && nl - (end + 1) < DH_CACHE_ETAG_MAX) {
        memcpy(etag, end + 1, (size_t)(nl - (end + 1)));
        etag[nl - (end + 1)] = '\0';
    }
    return (int64_t)v;
}

void dh__cache_set_size(struct dh_cache *c, const char *url, int64_t size,
                        const char *etag)
{
    char path[1400], buf[DH_CACHE_ETAG_MAX + 40];
    int n = snprintf(buf, sizeof(buf), "%lld\n%s\n", (long long)size,
                     etag ? etag : "");

    if (n > 0 && n < (int)sizeof(buf) &&
        !chunk_path(c, url, -1, path, sizeof(path)))
        write_whole(c, path, (const uint8_t *)buf, (size_t)n);
}

int dh__cache_has(struct dh_cache *c, const char *url, int64_t idx)
{
    char path[1400];
    struct stat st;

    return !chunk_path(c, url, idx, path, sizeof(path)) && !stat(path, &st) &&
           S_ISREG(st.st_mode) && st.st_size > 0;
}

void dh__cache_forget(struct dh_cache *c, const char *url, int64_t size)
{
    char path[1400];
    struct stat st;

    if (!chunk_path(c, url, -1, path, sizeof(path)))
        unlink(path);
    for (int64_t i = 0; i * DH_CACHE_CHUNK < size; i++)
        if (!chunk_path(c, url, i, path, sizeof(path)) && !stat(path, &st) &&
            !unlink(path))
            atomic_fetch_sub(&c->sh->bytes, (uint64_t)st.st_size);
}

/* The chunk's lock, waited for in slices, bounded by the watchdog (or a
 * minute without one): the fd, or -1 (then fetch without it). */
static int lock_chunk(const char *path, int (*overdue)(void *), void *oarg)
{
    char lock[1500];
    uint64_t end = dh__mono_ms() + 60000;
    int fd;

    snprintf(lock, sizeof(lock), "%s.lock", path);
    fd = create_in_sub(lock, O_RDWR);
    if (fd < 0)
        return -1;
    while (flock(fd, LOCK_EX | LOCK_NB)) {
        struct timespec ts = {0, 5 * 1000000L};

        if (errno != EWOULDBLOCK || (overdue && overdue(oarg)) ||
            dh__mono_ms() > end) {
            close(fd);
            return -1;
        }
        nanosleep(&ts, NULL);
    }
    return fd;
}

int64_t dh__cache_chunk(struct dh_cache *c, const char *url, int64_t idx,
                        size_t want, uint8_t *buf, dh_cache_fetch_fn fetch,
                        void *arg, int (*overdue)(void *), void *oarg, int *hit,
                        struct dh_err *e)
{
    char path[1400];
    int64_t n;
    int lfd;

    *hit = 0;
    if (chunk_path(c, url, idx, path, sizeof(path)))
        return fetch(arg, buf, want, e); /* no room for it: uncached */
    if ((n = try_hit(path, buf, e)) != 0)
        goto found;
    lfd = lock_chunk(path, overdue, oarg);
    /* another process may have fetched it while we waited */
    if (lfd >= 0 && (n = try_hit(path, buf, e)) != 0) {
        flock(lfd, LOCK_UN);
        close(lfd);
        goto found;
    }
    n = fetch(arg, buf, want, e);
    if (n > 0) {
        atomic_fetch_add(&c->sh->misses, 1);
        atomic_fetch_add(&c->sh->fetched_bytes, (uint64_t)n);
        keep(c, path, buf, (size_t)n);
    }
    if (lfd >= 0) {
        flock(lfd, LOCK_UN);
        close(lfd);
    }
    return n;
found:
    if (n > 0) {
        *hit = 1;
        atomic_fetch_add(&c->sh->hits, 1);
    }
    return n;
}
