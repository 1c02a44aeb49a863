/*
 * bench_plan_balance.c - Tier-1 balance on heavy-tailed mixes: random
 * split vs per-step greedy (Algorithm 1) vs windowed plans.  Two figures
 * per plan: the mean over steps of max/mean rank tokens, and
 * sum(max)/sum(mean) over the epoch - the step-time overhead a
 * synchronous job actually pays (a step lasts as long as its heaviest
 * rank).  Never pass/fail.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "datahelix/estimate.h"
#include "datahelix/plan.h"

#define N 200000
#define WORLD 8

static uint64_t rng = 12345;

static double u01(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) * (1.0 / 9007199254740992.0);
}

/* 224p/336p/448p/720p at 50/25/15/10 %, aspect 4:3..16:9; frames from the
 * four-bucket mix (16/32/64/64), Pareto(1.5) on [8, 512] or
 * lognormal(ln 32, 1) on [4, 1024]. */
static void make_mix(int kind, uint32_t *tok, uint16_t *prof)
{
    static const int side[] = {224, 336, 448, 720}, bucket[] = {16, 32, 64, 64};
    struct dh_token_model m;
    struct dh_err e;

    if (dh_token_model_parse("qwen-vl", &m, &e))
        exit(1);
    for (int i = 0; i < N; i++) {
        double u = u01(), f;
        int k = u < .5 ? 0 : u < .75 ? 1 : u < .9 ? 2 : 3;
        int h = side[k],
            w = (int)(h * (4.0 / 3 + (16.0 / 9 - 4.0 / 3) * u01()));
        if (kind == 0)
            f = bucket[k];
        else if (kind == 1)
            f = fmin(512, 8.0 / pow(1 - u01(), 1 / 1.5));
        else
            f = fmin(1024,
                     fmax(4, exp(log(32) + sqrt(-2 * log(u01() + 1e-300)) *
                                               cos(6.283185307 * u01()))));
        tok[i] = (uint32_t)dh_token_model_count(&m, (int64_t)f, w, h);
        prof[i] = (uint16_t)k;
    }
}

static void run(const uint32_t *tok, const uint16_t *prof, int balance,
                uint32_t window, uint32_t batch, const char *name)
{
    struct dh_plan_opts o;
    struct dh_plan *p;
    struct dh_err e;
    double mean, worst, smax = 0, smean = 0;

    dh_plan_opts_init(&o);
    o.world_size = WORLD;
    o.batch_size = batch;
    o.seed = 7;
    o.balance = balance;
    o.window = window;
    if (dh_plan_create(tok, prof, N, &o, &p, &e)) {
        printf("| %s | error: %s |\n", name, e.msg);
        return;
    }
    dh_plan_balance(p, &mean, &worst);
    for (uint64_t g = 0; g < dh_plan_steps(p); g++) {
        double mx = 0, sum = 0;
        for (uint32_t r = 0; r < WORLD; r++) {
            double t = (double)dh_plan_rank_tokens(p, g, r);
            mx = t > mx ? t : mx;
            sum += t;
        }
        smax += mx;
        smean += sum / WORLD;
    }
    printf("| %s | %.3f | %.3f | %.3f |\n", name, mean, worst, smax / smean);
    dh_plan_destroy(p);
}

int main(void)
{
    static uint32_t tok[N];
    static uint16_t prof[N];
    static const char *mixes[] = {"four buckets (16/32/64/64 frames)",
                                  "Pareto(1.5) frames", "lognormal frames"};

    for (int mix = 0; mix < 3; mix++) {
        make_mix(mix, tok, prof);
        printf("\n%s, %d samples, world %d x batch 4, fixed counts\n\n",
               mixes[mix], N, WORLD);
        printf("| plan | mean max/mean | worst | sum(max)/sum(mean) |\n");
        printf("|---|---:|---:|---:|\n");
        run(tok, prof, DH_BALANCE_NONE, 0, 4, "random split");
        run(tok, prof, DH_BALANCE_FIXED, 1, 4, "per-step greedy (W=1)");
        run(tok, prof, DH_BALANCE_FIXED, 8, 4, "W=8");
        run(tok, prof, DH_BALANCE_FIXED, 16, 4, "W=16");
        run(tok, prof, DH_BALANCE_FIXED, 32, 4, "W=32");
    }
    return 0;
}
