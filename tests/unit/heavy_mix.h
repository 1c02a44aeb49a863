/*
 * heavy_mix.h - the heavy-tailed clip mix the planner is measured on
 * (test_plan.c, bench/bench_plan_time.c): 224p x16, 336p x32, 448p x64,
 * 720p x64 frames at 50/25/15/10 %, aspect 4:3..16:9 (portrait 1 in 8),
 * tokens by the qwen-vl model; profile = the resolution class.  One copy,
 * so the bench times the manifest the test checks.
 */
#ifndef DH_TESTS_HEAVY_MIX_H
#define DH_TESTS_HEAVY_MIX_H

#include <stdint.h>

#include "datahelix/estimate.h"

/* splitmix64 step. */
static inline uint64_t heavy_mix_rnd(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);

    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* n samples from `seed` into tok / prof; -1 if the token model is not
 * there. */
static inline int heavy_mix(uint64_t seed, uint64_t n, uint32_t *tok,
                            uint16_t *prof)
{
    static const int32_t side[] = {224, 336, 448, 720};
    static const int64_t frames[] = {16, 32, 64, 64};
    struct dh_token_model m;
    uint64_t s = seed;

    if (dh_token_model_parse("qwen-vl", &m, NULL))
        return -1;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t u = heavy_mix_rnd(&s) % 100;
        int k = u < 50 ? 0 : u < 75 ? 1 : u < 90 ? 2 : 3;
        double aspect = 4.0 / 3 + (16.0 / 9 - 4.0 / 3) *
                                      (double)(heavy_mix_rnd(&s) % 1000) /
                                      1000.0;
        int32_t h = side[k], w = (int32_t)(h * aspect);

        if (heavy_mix_rnd(&s) % 8 == 0) {
            int32_t t = w;
            w = h;
            h = t;
        }
        tok[i] = (uint32_t)dh_token_model_count(&m, frames[k], w, h);
        prof[i] = (uint16_t)k;
    }
    return 0;
}

#endif
