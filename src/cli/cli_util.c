/*
 * cli_util.c - one-line errors and strict number parsing for subcommands.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/stat.h>
#include <stdint.h>
#include <unistd.h>
#include <signal.h>
#include <getopt.h>
#include <math.h>
#include <stdarg.h>
#include <string.h>
#include <stdlib.h>
#include <time.h>

#include "cli/cli.h"
#include "core/log.h"
#include "datahelix/media.h"

void dh_cli_error(const char *what, const char *fmt, ...)
{
    char msg[4096];
    va_list ap;

    va_start(ap, fmt);
    dh__log_vformat(msg, sizeof(msg), fmt, ap); /* one line, whatever a
                                                   path in it holds */
    va_end(ap);
    fprintf(stderr, "datahelix: %s: %s\n", what, msg);
}

int dh_cli_usage_error(const char *cmd, const char *fmt, ...)
{
    va_list ap;

    fprintf(stderr, "datahelix: %s: ", cmd);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, " (see datahelix %s --help)\n", cmd);
    return DH_EXIT_USAGE;
}

int dh_cli_getopt_error(const char *cmd, int c, char **argv)
{
    /* optind has moved past the offending word by now */
    if (c == ':')
        return dh_cli_usage_error(cmd, "option '%s' needs a value",
                                  argv[optind - 1]);
    if (c == '?')
        return dh_cli_usage_error(cmd, "bad option '%s'", argv[optind - 1]);
    return 0;
}

int dh_cli_getopt(const struct dh_cli_cmd *cmd, int argc, char **argv,
                  void *ctx, int *first)
{
    int c, r, help = 0;

    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, cmd->optstring, cmd->longopts, NULL)) !=
           -1) {
        if ((r = dh_cli_getopt_error(cmd->name, c, argv)) != 0)
            return r;
        if (c == 'h')
            help = 1;
        else if ((r = cmd->opt(ctx, c)) != 0)
            return r;
    }
    if (help) {
        cmd->usage(stdout);
        return DH_EXIT_OK;
    }
    if (cmd->max_args >= 0 && argc - optind > cmd->max_args)
        return dh_cli_usage_error(cmd->name, "unexpected argument '%s'",
                                  argv[optind + cmd->max_args]);
    if (first)
        *first = optind;
    return DH_CLI_RUN;
}

int dh_cli_opt_ca_bundle(const char *cmd, const char *file)
{
    if (access(file, R_OK))
        return dh_cli_usage_error(cmd, "--ca-bundle '%s': %s", file,
                                  strerror(errno));
    if (setenv("DATAHELIX_CA_BUNDLE", file, 1))
        return dh_cli_usage_error(cmd, "--ca-bundle: %s", strerror(errno));
    return 0;
}

int dh_cli_opt_cache_dir(const char *cmd, const char *dir)
{
    if (!dir[0])
        return dh_cli_usage_error(cmd, "--cache-dir: an empty path");
    if (setenv("DATAHELIX_CACHE_DIR", dir, 1))
        return dh_cli_usage_error(cmd, "--cache-dir: %s", strerror(errno));
    return 0;
}

int dh_cli_opt_cache_bytes(const char *cmd, const char *n)
{
    int64_t v;

    if (dh_cli_parse_i64(n, 4 << 20, INT64_MAX, &v))
        return dh_cli_usage_error(cmd,
                                  "--cache-bytes '%s': expected a byte "
                                  "count of at least 4194304",
                                  n);
    if (setenv("DATAHELIX_CACHE_BYTES", n, 1))
        return dh_cli_usage_error(cmd, "--cache-bytes: %s", strerror(errno));
    return 0;
}

int dh_cli_parse_i64(const char *s, int64_t lo, int64_t hi, int64_t *out)
{
    char *end;
    long long v;

    if (!s || !*s)
        return -1;
    errno = 0;
    v = strtoll(s, &end, 10);
    if (errno || *end || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

int dh_cli_parse_double(const char *s, double lo, double hi, double *out)
{
    char *end;
    double v;

    if (!s || !*s)
        return -1;
    errno = 0;
    v = strtod(s, &end);
    if (errno || *end || !isfinite(v) || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

int dh_cli_opt_i64(const char *cmd, const char *name, const char *s, int64_t lo,
                   int64_t hi, int64_t *out)
{
    if (dh_cli_parse_i64(s, lo, hi, out))
        return dh_cli_usage_error(cmd,
                                  "%s must be an integer in [%lld, "
                                  "%lld], not '%s'",
                                  name, (long long)lo, (long long)hi,
                                  s ? s : "");
    return 0;
}

double dh_cli_now(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static volatile int stop_flag;

static void on_stop_signal(int sig)
{
    (void)sig;
    stop_flag = 1;
}

const volatile int *dh_cli_stop_on_signals(void)
{
    struct sigaction sa;

    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0; /* no SA_RESTART: poll must return EINTR */
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    return &stop_flag;
}

int dh_cli_remove_add(struct dh_cli_remove *r, const char *cmd, const char *dir)
{
    if (r->n >= DH_CLI_MAX_REMOVE)
        return dh_cli_usage_error(cmd, "--remove-at-exit at most %d times",
                                  DH_CLI_MAX_REMOVE);
    r->dir[r->n++] = dir;
    return 0;
}

static void remove_owned_dir(const char *dir)
{
    const char *base = strrchr(dir, '/');
    struct dirent *d;
    struct stat st;
    DIR *h;
    int fd;

    base = base ? base + 1 : dir;
    if (strncmp(base, "datahelix-", 10) ||
        (fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)) < 0)
        return;
    if (fstat(fd, &st) || st.st_uid != geteuid() ||
        (st.st_mode & 07777) != 0700 || !(h = fdopendir(fd))) {
        close(fd);
        return;
    }
    while ((d = readdir(h)))
        if (strcmp(d->d_name, ".") && strcmp(d->d_name, ".."))
            unlinkat(fd, d->d_name, 0); /* a sub-folder stays: so does dir */
    closedir(h);
    rmdir(dir);
}

void dh_cli_remove_run(const struct dh_cli_remove *r)
{
    for (int i = 0; i < r->n; i++)
        remove_owned_dir(r->dir[i]);
}

void dh_cli_ignore_sigpipe(void)
{
    struct sigaction sa;

    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = SIG_IGN;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGPIPE, &sa, NULL);
}

/* Polls the parent's pid: when it changes the parent died (we were
 * re-parented), so stop as a signal would.  100 ms is fast enough for a
 * cleanup path and costs nothing. */
static void *watch_parent(void *arg)
{
    pid_t parent = (pid_t)(intptr_t)arg;
    struct timespec ts = {0, 100000000};

    while (getppid() == parent)
        nanosleep(&ts, NULL);
    stop_flag = 1;
    return NULL;
}

int dh_cli_stop_with_parent(void)
{
    pthread_t th;
    sigset_t all, old;
    int rc;

    /* The watcher takes no signals: they belong to the main loop. */
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    rc = pthread_create(&th, NULL, watch_parent, (void *)(intptr_t)getppid());
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0)
        return -1;
    pthread_detach(th);
    return 0;
}

int dh_cli_opt_size(const char *cmd, const char *s, struct dh_media_plan *p)
{
    char w[16];
    const char *x = strchr(s, 'x');
    int64_t wv, hv;

    if (!x || (size_t)(x - s) >= sizeof(w))
        goto bad;
    memcpy(w, s, (size_t)(x - s));
    w[x - s] = '\0';
    if (dh_cli_parse_i64(w, 1, 16384, &wv) ||
        dh_cli_parse_i64(x + 1, 1, 16384, &hv))
        goto bad;
    p->width = (int32_t)wv;
    p->height = (int32_t)hv;
    return 0;
bad:
    return dh_cli_usage_error(cmd,
                              "--size '%s': expected WxH, each "
                              "1..16384",
                              s);
}

void dh_cli_run_threads(int64_t n, void *(*work)(void *), void (*wait)(void *),
                        void *arg)
{
    pthread_t th[DH_CLI_MAX_THREADS];
    int64_t started = 0;

    if (n > DH_CLI_MAX_THREADS)
        n = DH_CLI_MAX_THREADS;
    for (; started < n; started++)
        if (pthread_create(&th[started], NULL, work, arg))
            break;
    if (started == 0)
        work(arg);
    else
        wait(arg);
    for (int64_t i = 0; i < started; i++)
        pthread_join(th[i], NULL);
}

void dh_cli_error_line(const char *cmd, const char *fmt, ...)
{
    va_list ap;

    char msg[4096];

    if (isatty(STDERR_FILENO))
        fprintf(stderr, "\r\033[K");
    va_start(ap, fmt);
    dh__log_vformat(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    fprintf(stderr, "datahelix: %s: %s\n", cmd, msg);
}
