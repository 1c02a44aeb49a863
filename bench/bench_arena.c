/*
 * bench_arena.c - the cost of handing a ready batch to another process
 * through the shared-memory arena, next to copying it (issue 4,
 * "Benchmarks").  Never pass/fail: prints a markdown table with ratios.
 *
 * For each size (8, 64, 256 MiB): the parent creates an arena of that
 * size, passes its fd to a forked consumer once (SCM_RIGHTS; the consumer
 * attaches: mmap + header checks - reported as "attach, once"), allocates
 * one slot of the full size and fills it (a ready batch).  Hand-over, timed
 * 5 times: the parent sends the slot's ref (20 bytes) over a SOCK_SEQPACKET
 * socketpair, the consumer looks the pointer up (dh_arena_ptr) and reads
 * one byte of a page it has not touched yet (a real page fault in its
 * mapping), then answers with that byte; the clock stops when the answer
 * arrives - a full round trip, so the figure is an upper bound.
 * Peers: memcpy of the same size into a warm (pre-faulted) buffer - the
 * kindest copy - and into a freshly malloc'd buffer (what a copying
 * loader pays for a new tensor).  Medians of 5.
 * The torch.utils.data.DataLoader peer comes with the Python package.
 * Usage: bench_arena [--reps N] [--json]
 * --json: instead of the table, one JSON object per size on its own line
 * (medians in ms), for bench/bench_handover.py.
 */
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "datahelix/arena.h"
#include "runtime/fdpass.h"

#define MIB ((size_t)1 << 20)
#define MAX_REPS 101
#define WAIT_MS 10000

static double now(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;

    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(*v), cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/*
 * The consumer: attach, report the attach time, then answer each ref
 * ('R' + ref + page index) with one byte read from that page.
 */
static int consumer(int sock)
{
    unsigned char m[32];
    struct dh_arena *a = NULL;
    struct dh_err e;
    double t0;
    size_t n;
    int fd;

    if (dh__fd_recv(sock, &fd, m, sizeof(m), &n, WAIT_MS, &e) != 0 || fd < 0)
        return 10;
    t0 = now();
    if (dh_arena_attach(fd, &a, &e) != 0) {
        fprintf(stderr, "bench_arena: attach: %s\n", e.msg);
        return 11;
    }
    close(fd);
    t0 = now() - t0;
    if (dh__fd_send(sock, -1, &t0, sizeof(t0), &e) != 0)
        return 12;
    while (dh__fd_recv(sock, &fd, m, sizeof(m), &n, WAIT_MS, &e) == 0 &&
           n == 25 && m[0] == 'R') {
        struct dh_slot_ref r;
        uint32_t page;
        unsigned char *p;

        dh_slot_ref_unpack(m + 1, &r);
        memcpy(&page, m + 21, 4);
        p = dh_arena_ptr(a, &r);
        if (!p)
            return 13;
        m[0] = p[((size_t)page * 4096) % r.len];
        if (dh__fd_send(sock, -1, m, 1, &e) != 0)
            return 14;
    }
    dh_arena_destroy(a);
    return 0;
}

struct row {
    size_t bytes;
    double attach, handover, copy_warm, copy_fresh;
};

static int handover(int sock, const struct dh_slot_ref *r, uint32_t page,
                    double *took)
{
    unsigned char m[32];
    struct dh_err e;
    double t0 = now();
    size_t n;
    int fd;

    m[0] = 'R';
    dh_slot_ref_pack(m + 1, r);
    memcpy(m + 21, &page, 4);
    if (dh__fd_send(sock, -1, m, 25, &e) != 0 ||
        dh__fd_recv(sock, &fd, m, sizeof(m), &n, WAIT_MS, &e) != 0) {
        fprintf(stderr, "bench_arena: hand-over: %s\n", e.msg);
        return -1;
    }
    *took = now() - t0;
    return m[0] == 0x5A ? 0 : -1;
}

static int measure_arena(size_t bytes, int reps, struct row *row)
{
    struct dh_arena *a = NULL;
    struct dh_slot_ref r;
    struct dh_err e;
    double t[MAX_REPS];
    unsigned char m[16];
    int sv[2], fd, status, rc = -1;
    size_t n;
    pid_t pid;

    if (dh_arena_create(bytes, &a, &e) != 0 ||
        dh_arena_alloc(a, bytes, 0, &r, &e) != 0) {
        fprintf(stderr, "bench_arena: %s\n", e.msg);
        dh_arena_destroy(a);
        return -1;
    }
    memset(dh_arena_ptr(a, &r), 0x5A, bytes); /* the ready batch */
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0)
        goto out_destroy;
    pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        close(sv[0]);
        _exit(consumer(sv[1]));
    }
    close(sv[1]);
    if (pid < 0 || dh__fd_send(sv[0], dh_arena_fd(a), "A", 1, &e) != 0 ||
        dh__fd_recv(sv[0], &fd, m, sizeof(m), &n, WAIT_MS, &e) != 0 ||
        n != sizeof(double))
        goto out_reap;
    memcpy(&row->attach, m, sizeof(double));
    for (int i = 0; i < reps; i++)
        if (handover(sv[0], &r, (uint32_t)(i * 7919 + 1), &t[i]) != 0)
            goto out_reap;
    row->handover = median(t, reps);
    rc = 0;
out_reap:
    close(sv[0]); /* the consumer's recv sees the close and exits */
    if (pid > 0 && waitpid(pid, &status, 0) == pid &&
        !(WIFEXITED(status) && WEXITSTATUS(status) == 0))
        rc = -1;
out_destroy:
    dh_arena_destroy(a);
    return rc;
}

static int measure_copy(size_t bytes, int reps, struct row *row)
{
    unsigned char *src = malloc(bytes), *dst = malloc(bytes);
    double t[MAX_REPS];

    if (!src || !dst) {
        free(src);
        free(dst);
        return -1;
    }
    memset(src, 0x5A, bytes);
    memset(dst, 0, bytes);
    for (int i = 0; i < reps; i++) {
        double t0 = now();

        memcpy(dst, src, bytes);
        t[i] = now() - t0;
    }
    row->copy_warm = median(t, reps);
    for (int i = 0; i < reps; i++) {
        double t0 = now();
        unsigned char *fresh = malloc(bytes);

        if (!fresh)
            break;
        memcpy(fresh, src, bytes);
        t[i] = now() - t0;
        dst[i] ^= fresh[bytes - 1 - (size_t)i]; /* keep the copy alive */
        free(fresh);
    }
    row->copy_fresh = median(t, reps);
    free(src);
    free(dst);
    return 0;
}

int main(int argc, char **argv)
{
    static const size_t sizes[] = {8 * MIB, 64 * MIB, 256 * MIB};
    struct row rows[3];
    int reps = 5, json = 0;

    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc) {
            char *end;
            long v = strtol(argv[++i], &end, 10);

            /* not a number in range: the default, below */
            reps = *end || end == argv[i] || v < 1 || v > MAX_REPS ? 0 : (int)v;
        } else if (strcmp(argv[i], "--json") == 0) {
            json = 1;
        } else {
            fprintf(stderr, "usage: bench_arena [--reps N] [--json]\n");
            return 2;
        }
    }
    if (reps < 1 || reps > MAX_REPS)
        reps = 5;
    for (int i = 0; i < 3; i++) {
        rows[i].bytes = sizes[i];
        if (measure_arena(sizes[i], reps, &rows[i]) != 0 ||
            measure_copy(sizes[i], reps, &rows[i]) != 0) {
            fprintf(stderr, "bench_arena: %zu MiB failed\n", sizes[i] / MIB);
            return 1;
        }
    }
    if (json) {
        for (int i = 0; i < 3; i++)
            printf("{\"bench\":\"arena\",\"mib\":%zu,\"bytes\":%zu,"
                   "\"reps\":%d,\"handover_ms\":%.6f,"
                   "\"memcpy_warm_ms\":%.6f,\"memcpy_fresh_ms\":%.6f,"
                   "\"attach_ms\":%.6f}\n",
                   rows[i].bytes / MIB, rows[i].bytes, reps,
                   rows[i].handover * 1e3, rows[i].copy_warm * 1e3,
                   rows[i].copy_fresh * 1e3, rows[i].attach * 1e3);
        return 0;
    }
    printf(
        "## Hand-over of a ready batch to another process (median of %d)\n\n",
        reps);
    printf("| batch | arena hand-over | memcpy (warm dst) | memcpy (fresh dst) "
           "| warm / hand-over | fresh / hand-over | arena attach, once |\n");
    printf("|---:|---:|---:|---:|---:|---:|---:|\n");
    for (int i = 0; i < 3; i++)
        printf("| %zu MiB | %.3f ms | %.2f ms | %.2f ms | %.0fx | %.0fx "
               "| %.3f ms |\n",
               rows[i].bytes / MIB, rows[i].handover * 1e3,
               rows[i].copy_warm * 1e3, rows[i].copy_fresh * 1e3,
               rows[i].copy_warm / rows[i].handover,
               rows[i].copy_fresh / rows[i].handover, rows[i].attach * 1e3);
    printf("\nHand-over = send a 20-byte slot ref over a socketpair, the "
           "consumer looks up the pointer\nand touches one new page, "
           "answers; a round trip.  The torch.utils.data.DataLoader peer\n"
           "comes later with the Python package (issue 4, client/Python "
           "layer).\n");
    return 0;
}
