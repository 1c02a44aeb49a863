/*
 * cmd_index.c - `datahelix index`: builds the .dhx index of a descriptor
 * table (include/datahelix/index.h) and/or verifies an existing one.
 *
 * Design: arguments are validated before any file is touched (usage errors
 * exit 2); bad input data or I/O failures exit 1 with one stderr line.  The
 * build summary goes to stderr like other subcommands; --verify's report is
 * the command's output and goes to stdout.
 * Locking: the build runs on the main thread; a watcher thread (progress
 * only) reads how far the kernel says the table's file has been read
 * (/proc/self/fdinfo) and shares nothing else but the atomic `done`.
 */
#include <dirent.h>
#include <getopt.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"
#include "datahelix/index.h"

#define CMD "index"

struct args {
    const char *in;
    const char *out;
    const char *verify;
    int renumber;
};

static void usage(FILE *f)
{
    fprintf(
        f,
        "usage: datahelix index [--renumber] M.jsonl -o M.dhx\n"
        "       datahelix index --verify M.dhx\n\n"
        "Writes the compact, mmap-able binary index of a descriptor table\n"
        "(docs/index-format.md), shared by every process on a host.  Ids must\n"
        "be dense from 0 unless --renumber.  The output is written atomically\n"
        "(tmp + rename).\n\n"
        "  -o, --out FILE     index to write\n"
        "      --renumber     number the samples 0..n-1 in file order, so a\n"
        "                     table with lines removed (ids not dense) or\n"
        "                     duplicate ids still builds; paths stay the\n"
        "                     stable key, ids may change (a notice on stderr\n"
        "                     says how many)\n"
        "      --verify FILE  open FILE with full checksum verification and\n"
        "                     print its sample count and profiles (may be\n"
        "                     combined with a build: verifies after it)\n"
        "  -h, --help         this text\n");
}

static const struct option long_opts[] = {
    {"out", required_argument, NULL, 'o'},
    {"verify", required_argument, NULL, 'V'},
    {"renumber", no_argument, NULL, 'R'},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

static int check_args(struct args *a, int argc, char **argv)
{
    if (optind < argc) /* dh_cli_getopt() let one operand through */
        a->in = argv[optind];
    if (a->in && (!a->out || !*a->out))
        return dh_cli_usage_error(CMD, "-o FILE.dhx is required");
    if (!a->in && a->out)
        return dh_cli_usage_error(CMD, "-o given without an input table");
    if (!a->in && a->renumber)
        return dh_cli_usage_error(CMD, "--renumber given without an input "
                                       "table");
    if (!a->in && !a->verify)
        return dh_cli_usage_error(CMD, "an input table or --verify FILE is "
                                       "required");
    return DH_CLI_RUN;
}

static int take_option(void *ctx, int c)
{
    struct args *a = ctx;

    if (c == 'o')
        a->out = optarg;
    else if (c == 'V')
        a->verify = optarg;
    else if (c == 'R')
        a->renumber = 1;
    else
        return dh_cli_usage_error(CMD, "bad option");
    return 0;
}

DH_CLI_CMD(CMD, ":o:h", long_opts, take_option, 1, usage);

static int parse_args(struct args *a, int argc, char **argv)
{
    int r;

    if ((r = dh_cli_getopt(&cli_cmd, argc, argv, a, NULL)) != DH_CLI_RUN)
        return r;
    return check_args(a, argc, argv);
}

/* ---- progress: how much of the table the build has read ---- */

struct watch {
    char path[PATH_MAX]; /* the table, resolved */
    uint64_t size;
    _Atomic int done;
    int fd; /* the build's descriptor of it, once found; -1 */
};

/* The descriptor of this process open on w->path, or -1. */
static int find_fd(const struct watch *w)
{
    char link[300], target[PATH_MAX];
    struct dirent *d;
    DIR *dir = opendir("/proc/self/fd");
    int fd = -1;

    if (!dir)
        return -1;
    while (fd < 0 && (d = readdir(dir))) {
        ssize_t n;

        if (d->d_name[0] == '.')
            continue;
        snprintf(link, sizeof(link), "/proc/self/fd/%s", d->d_name);
        n = readlink(link, target, sizeof(target) - 1);
        if (n > 0) {
            char *end = NULL;
            long v = strtol(d->d_name, &end, 10);

            target[n] = 0;
            if (!strcmp(target, w->path) && *end == '\0' && v >= 0 &&
                v <= INT_MAX)
                fd = (int)v;
        }
    }
    closedir(dir);
    return fd;
}

/* The file offset of w->fd (what the build has read), or -1. */
static long long read_pos(const struct watch *w)
{
    char name[64], line[128];
    long long pos = -1;
    FILE *f;

    snprintf(name, sizeof(name), "/proc/self/fdinfo/%d", w->fd);
    if (!(f = fopen(name, "r")))
        return -1;
    while (fgets(line, sizeof(line), f))
        if (sscanf(line, "pos: %lld", &pos) == 1)
            break;
    fclose(f);
    return pos;
}

static void *watch_main(void *arg)
{
    struct watch *w = arg;
    struct timespec tick = {0, 100 * 1000 * 1000};
    struct dh_progress p;

    dh_progress_start(&p, "index", w->size >> 20);
    dh_progress_set_note(&p, "MiB of the table read");
    while (!atomic_load(&w->done)) {
        long long pos;

        nanosleep(&tick, NULL);
        if (w->fd < 0)
            w->fd = find_fd(w);
        pos = w->fd >= 0 ? read_pos(w) : -1;
        if (pos >= 0 && (uint64_t)pos < w->size) /* the last read: done */
            dh_progress_update(&p, (uint64_t)pos >> 20, 0);
    }
    dh_progress_finish(&p);
    return NULL;
}

/* Starts the watcher (1) unless the table cannot be sized or is under
 * 1 MiB, which takes no time worth telling (0). */
static int watch_start(struct watch *w, const char *in, pthread_t *t)
{
    struct stat st;

    memset(w, 0, sizeof(*w));
    w->fd = -1;
    if (!realpath(in, w->path) || stat(w->path, &st) || st.st_size < (1 << 20))
        return 0;
    w->size = (uint64_t)st.st_size;
    return pthread_create(t, NULL, watch_main, w) == 0;
}

static int build(const struct args *a)
{
    struct dh_index_build_info info;
    struct dh_index *ix;
    struct dh_err e;
    double t0 = dh_cli_now();
    uint64_t n, size;

    struct watch w;
    pthread_t wt;
    int watching, rc;

    dh_err_clear(&e);
    watching = watch_start(&w, a->in, &wt);
    rc = dh_index_build(a->in, a->out,
                        a->renumber ? DH_INDEX_BUILD_RENUMBER : 0, &info, &e);
    if (watching) {
        atomic_store(&w.done, 1);
        pthread_join(wt, NULL);
    }
    if (rc < 0 || dh_index_open(a->out, 0, &ix, &e) < 0) {
        dh_cli_error(CMD, "%s", e.msg);
        return DH_EXIT_FAIL;
    }
    n = dh_index_count(ix);
    size = dh_index_size(ix);
    dh_index_close(ix);
    /* Said even when nothing changed: ids in telemetry and errors now
     * name rows of this index, not necessarily the table's `id`s. */
    if (a->renumber)
        fprintf(stderr,
                "index: renumbered %llu samples 0..%lld in file "
                "order, %llu ids changed (paths are the stable key)\n",
                (unsigned long long)n, (long long)n - 1,
                (unsigned long long)info.renumbered);
    fprintf(stderr,
            "index: %llu samples, %llu bytes (%.1f bytes/sample), "
            "%.2f s -> %s\n",
            (unsigned long long)n, (unsigned long long)size,
            n ? (double)size / (double)n : 0.0, dh_cli_now() - t0, a->out);
    return DH_EXIT_OK;
}

static int verify(const char *path)
{
    struct dh_index *ix;
    struct dh_err e;
    unsigned np;

    dh_err_clear(&e);
    if (dh_index_open(path, DH_INDEX_VERIFY, &ix, &e) < 0) {
        dh_cli_error(CMD, "%s", e.msg);
        return DH_EXIT_FAIL;
    }
    np = dh_index_profile_count(ix);
    printf("%s: ok, %llu samples, %llu bytes, %u profiles", path,
           (unsigned long long)dh_index_count(ix),
           (unsigned long long)dh_index_size(ix), np);
    for (unsigned p = 0; p < np && p < 32; p++)
        printf("%s%s", p ? "," : ": ", dh_index_profile_name(ix, p));
    printf("%s\n", np > 32 ? ",..." : "");
    dh_index_close(ix);
    return DH_EXIT_OK;
}

int dh_cmd_index(int argc, char **argv)
{
    struct args a = {0};
    int r = parse_args(&a, argc, argv);

    if (r != DH_CLI_RUN)
        return r;
    if (a.in && (r = build(&a)) != 0)
        return r;
    return a.verify ? verify(a.verify) : DH_EXIT_OK;
}
