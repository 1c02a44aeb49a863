/*
 * bench_index.c - the .dhx index at scale, next to the JSONL table it
 * replaces for planning.  Never pass/fail: prints figures and ratios.
 *
 * Builds a synthetic index (default 10,000,000 samples), then measures
 * build time, size, open time (plain and verified, median of 5 with a warm
 * page cache, plus one after posix_fadvise(DONTNEED)), a full scan of
 * est_tokens and the RSS growth; and for comparison writes and parses a
 * JSONL table (default 1,000,000 rows) and extrapolates per sample.
 * Usage: bench_index [--count N] [--jsonl-count M]
 */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "datahelix/index.h"

static const char *profiles[] = {"8x224",  "16x224", "32x336",
                                 "64x448", "image",  "text"};

static double now(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static long rss_kb(void)
{
    char line[256];
    long kb = -1;
    FILE *f = fopen("/proc/self/status", "r");

    while (f && fgets(line, sizeof(line), f))
        if (strncmp(line, "VmRSS:", 6) == 0)
            kb = strtol(line + 6, NULL, 10);
    if (f)
        fclose(f);
    return kb;
}

static uint64_t rng(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* A plausible sample: mostly videos, some images, a little text. */
static void synth(struct dh_desc *d, int64_t id, char *path, size_t n,
                  uint64_t *s)
{
    uint64_t r = rng(s);
    unsigned p = (unsigned)(r % 6);

    dh_desc_init(d);
    d->id = id;
    d->kind = p == 4 ? DH_KIND_IMAGE : p == 5 ? DH_KIND_TEXT : DH_KIND_VIDEO;
    snprintf(path, n, "videos/%09lld.mp4", (long long)id);
    d->path = path;
    d->width = 320 + (int32_t)(r >> 8 & 1023);
    d->height = 240 + (int32_t)(r >> 20 & 511);
    d->fps = 25.0;
    d->duration_s = (double)(r >> 32 & 0xffff) / 1000.0;
    d->frames = d->kind == DH_KIND_IMAGE ? 1 : (int64_t)(d->duration_s * 25);
    snprintf(d->profile, sizeof(d->profile), "%s", profiles[p]);
    snprintf(d->codec, sizeof(d->codec), "h264");
    d->est_cpu_ms = 0.5 + (double)(r >> 40 & 0xfff) / 16.0;
    d->est_out_bytes = (int64_t)(r >> 24 & 0xffffff) * 64;
    d->est_tokens = (int64_t)(r >> 48 & 0x3fff);
    d->bytes = (int64_t)(r & 0xffffff) * 8;
}

static int build(const char *dhx, int64_t count, double *secs)
{
    struct dh_index_builder *b;
    struct dh_desc d;
    struct dh_err e;
    uint64_t s = 88172645463325252ULL;
    char path[64];
    double t0 = now();

    if (dh_index_builder_create(&b, &e) != 0)
        goto out_fail;
    for (int64_t i = 0; i < count; i++) {
        synth(&d, i, path, sizeof(path), &s);
        if (dh_index_builder_add(b, &d, &e) != 0)
            goto out_destroy;
    }
    if (dh_index_builder_finish(b, dhx, &e) != 0)
        goto out_destroy;
    dh_index_builder_destroy(b);
    *secs = now() - t0;
    return 0;
out_destroy:
    dh_index_builder_destroy(b);
out_fail:
    fprintf(stderr, "bench_index: %s\n", e.msg);
    return -1;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double time_open(const char *dhx, unsigned flags)
{
    struct dh_index *ix;
    struct dh_err e;
    double t0 = now(), t;

    if (dh_index_open(dhx, flags, &ix, &e) != 0) {
        fprintf(stderr, "bench_index: %s\n", e.msg);
        exit(1);
    }
    t = now() - t0;
    dh_index_close(ix);
    return t;
}

static double median_open(const char *dhx, unsigned flags)
{
    double t[5];

    for (int i = 0; i < 5; i++)
        t[i] = time_open(dhx, flags);
    qsort(t, 5, sizeof(t[0]), cmp_d);
    return t[2];
}

static double cold_open(const char *dhx)
{
    int fd = open(dhx, O_RDONLY);

    if (fd >= 0) {
        (void)posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        close(fd);
    }
    return time_open(dhx, DH_INDEX_VERIFY);
}

struct scan {
    double secs;
    long rss_open_kb, rss_scan_kb;
    uint64_t sum;
};

static void scan_tokens(const char *dhx, struct scan *sc)
{
    struct dh_index_columns c;
    struct dh_index *ix;
    struct dh_err e;
    long r0 = rss_kb();
    double t0;

    if (dh_index_open(dhx, 0, &ix, &e) != 0)
        exit(1);
    sc->rss_open_kb = rss_kb() - r0;
    dh_index_columns(ix, &c);
    t0 = now();
    sc->sum = 0;
    for (uint64_t i = 0; i < c.count; i++)
        sc->sum += c.est_tokens[i];
    sc->secs = now() - t0;
    sc->rss_scan_kb = rss_kb() - r0;
    dh_index_close(ix);
}

struct jsonl {
    double write_s, parse_s, bytes;
    long rss_kb;
};

static int jsonl_side(const char *path, int64_t count, struct jsonl *j)
{
    struct dh_table_writer *w;
    struct dh_table_reader *r;
    struct dh_desc d;
    struct dh_err e;
    uint64_t s = 88172645463325252ULL, sum = 0;
    char p[64];
    long r0;
    double t0 = now();
    FILE *f;
    int rc;

    if (dh_table_writer_open(path, "{\"v\":1}", &w, &e) != 0)
        goto out_fail;
    for (int64_t i = 0; i < count; i++) {
        synth(&d, i, p, sizeof(p), &s);
        if (dh_table_writer_write(w, &d, &e) != 0) {
            dh_table_writer_abort(w);
            goto out_fail;
        }
    }
    if (dh_table_writer_close(w, &e) != 0)
        goto out_fail;
    j->write_s = now() - t0;
    r0 = rss_kb();
    t0 = now();
    if (dh_table_reader_open(path, &r, &e) != 0)
        goto out_fail;
    dh_desc_init(&d);
    while ((rc = dh_table_reader_next(r, &d, &e)) == 1)
        sum += (uint64_t)d.est_tokens;
    dh_desc_fini(&d);
    dh_table_reader_destroy(r);
    if (rc != 0)
        goto out_fail;
    j->parse_s = now() - t0;
    j->rss_kb = rss_kb() - r0;
    f = fopen(path, "rb");
    fseek(f, 0, SEEK_END);
    j->bytes = (double)ftell(f);
    fclose(f);
    return sum ? 0 : -1;
out_fail:
    fprintf(stderr, "bench_index: %s\n", e.msg);
    return -1;
}

static void report(int64_t n, int64_t m, double build_s, uint64_t size,
                   double open_s, double open_v_s, double cold_s,
                   const struct scan *sc, const struct jsonl *j)
{
    double per_ix = (double)size / (double)n, per_js = j->bytes / (double)m;
    double parse_n = j->parse_s / (double)m * (double)n;

    printf("index: %lld samples, build %.2f s, file %.1f MB\n", (long long)n,
           build_s, (double)size / 1e6);
    printf("JSONL: %lld rows, write %.2f s, parse %.2f s, %.1f MB "
           "(parse RSS growth %ld KiB)\n\n",
           (long long)m, j->write_s, j->parse_s, j->bytes / 1e6, j->rss_kb);
    printf("| measure | .dhx index | JSONL table | ratio |\n");
    printf("|---|---|---|---|\n");
    printf("| planning bytes/sample | 27 | %.1f | %.1fx |\n", per_js,
           per_js / 27.0);
    printf("| total bytes/sample | %.1f | %.1f | %.1fx |\n", per_ix, per_js,
           per_js / per_ix);
    printf("| open, %lld samples (warm, median of 5) | %.3f ms | %.2f s "
           "(parse, extrapolated) | %.0fx |\n",
           (long long)n, open_s * 1e3, parse_n, parse_n / open_s);
    printf("| open + verify body checksum (warm) | %.1f ms | | %.0fx |\n",
           open_v_s * 1e3, parse_n / open_v_s);
    printf("| open + verify after fadvise(DONTNEED) | %.1f ms | | |\n",
           cold_s * 1e3);
    printf("| sum est_tokens over all rows (= %llu) | %.1f ms | | |\n",
           (unsigned long long)sc->sum, sc->secs * 1e3);
    printf("| per sample: load planning data | %.2f ns (scan) | %.0f ns "
           "(parse) | %.0fx |\n",
           sc->secs / (double)n * 1e9, j->parse_s / (double)m * 1e9,
           (j->parse_s / (double)m) / (sc->secs / (double)n));
    printf("| RSS growth after open / after scan | %ld / %ld KiB | | |\n",
           sc->rss_open_kb, sc->rss_scan_kb);
}

int main(int argc, char **argv)
{
    int64_t n = 10000000, m = 1000000;
    const char *dir = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    char dhx[512], jl[512];
    struct jsonl j = {0};
    struct scan sc;
    double build_s, open_s, open_v_s, cold_s;
    uint64_t size;
    FILE *f;

    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--count") == 0)
            n = strtoll(argv[i + 1], NULL, 10);
        else if (strcmp(argv[i], "--jsonl-count") == 0)
            m = strtoll(argv[i + 1], NULL, 10);
    }
    if (n < 1 || m < 1) {
        fprintf(stderr, "usage: bench_index [--count N] [--jsonl-count M]\n");
        return 2;
    }
    snprintf(dhx, sizeof(dhx), "%s/bench_index.%ld.dhx", dir, (long)getpid());
    snprintf(jl, sizeof(jl), "%s/bench_index.%ld.jsonl", dir, (long)getpid());
    if (build(dhx, n, &build_s) != 0)
        return 1;
    f = fopen(dhx, "rb");
    fseek(f, 0, SEEK_END);
    size = (uint64_t)ftell(f);
    fclose(f);
    open_v_s = median_open(dhx, DH_INDEX_VERIFY); /* also warms the cache */
    open_s = median_open(dhx, 0);
    scan_tokens(dhx, &sc);
    cold_s = cold_open(dhx);
    if (jsonl_side(jl, m, &j) != 0) {
        unlink(dhx);
        unlink(jl);
        return 1;
    }
    report(n, m, build_s, size, open_s, open_v_s, cold_s, &sc, &j);
    unlink(dhx);
    unlink(jl);
    return 0;
}
