/*
 * bench_plan_time.c - how long the Tier-1 planner takes on a large epoch:
 * N samples of the heavy-tailed 224p/336p/448p/720p clip mix (qwen-vl
 * tokens), world 8 x batch 4, fixed counts, the default window; the
 * median of R plans, beside the plan's balance.  Generating the manifest
 * is not counted.  Moved here from tests/unit/test_plan.c (issue 19: a
 * timing is a benchmark, not a test); test_plan keeps a smaller epoch's
 * exactly-once check.  Never pass/fail.
 *
 *   bench_plan_time [N [R]]     defaults 1,000,000 and 3
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "datahelix/estimate.h"
#include "datahelix/plan.h"
#include "heavy_mix.h"

#define WORLD 8
#define BATCH 4
#define MAX_REPS 31

static double now_s(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;

    return (x > y) - (x < y);
}

/* A positive integer argument in [lo, hi], else the default. */
static unsigned long long arg(int argc, char **argv, int i,
                              unsigned long long def, unsigned long long lo,
                              unsigned long long hi)
{
    char *end;
    unsigned long long v;

    if (argc <= i)
        return def;
    v = strtoull(argv[i], &end, 10);
    if (*argv[i] == '\0' || *end != '\0' || v < lo || v > hi) {
        fprintf(stderr,
                "bench_plan_time: '%s': want an integer in "
                "%llu..%llu\n",
                argv[i], lo, hi);
        exit(2);
    }
    return v;
}

int main(int argc, char **argv)
{
    uint64_t n = arg(argc, argv, 1, 1000000, WORLD * BATCH, 100000000);
    int reps = (int)arg(argc, argv, 2, 3, 1, MAX_REPS);
    uint32_t *tok = malloc(n * sizeof(*tok));
    uint16_t *prof = malloc(n * sizeof(*prof));
    double secs[MAX_REPS], mean = 0, worst = 0;
    struct dh_plan_opts o;
    int rc = 1;

    if (!tok || !prof || heavy_mix(5, n, tok, prof)) {
        fprintf(stderr, "bench_plan_time: out of memory for %llu samples\n",
                (unsigned long long)n);
        goto out_free;
    }
    dh_plan_opts_init(&o);
    o.world_size = WORLD;
    o.batch_size = BATCH;
    for (int r = 0; r < reps; r++) {
        struct dh_plan *p = NULL;
        struct dh_err e;
        double t0 = now_s();

        if (dh_plan_create(tok, prof, n, &o, &p, &e)) {
            fprintf(stderr, "bench_plan_time: %s\n", e.msg);
            goto out_free;
        }
        secs[r] = now_s() - t0;
        dh_plan_balance(p, &mean, &worst);
        dh_plan_destroy(p);
    }
    qsort(secs, (size_t)reps, sizeof(secs[0]), cmp_double);
    printf("planning %llu samples (world %d x batch %d, W=%u, fixed): "
           "median %.3f s of %d (min %.3f, max %.3f), %.1f M samples/s; "
           "max/mean rank tokens %.3f mean / %.3f worst\n",
           (unsigned long long)n, WORLD, BATCH, DH_PLAN_WINDOW_DEFAULT,
           secs[reps / 2], reps, secs[0], secs[reps - 1],
           (double)n / secs[reps / 2] / 1e6, mean, worst);
    rc = 0;
out_free:
    free(tok);
    free(prof);
    return rc;
}
