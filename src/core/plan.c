/*
 * plan.c - the Tier-1 planner: epoch permutation, the plan object, the
 * `none` split and the driver of the windowed assignment (plan_window.c).
 * Contract: src/include/datahelix/plan.h; algorithm: docs/planner.md.
 *
 * Design: the plan is one array of ids (the permutation, rearranged window
 * by window in place, so memory is 8 bytes a sample) plus per (step, rank)
 * offsets and token sums.  Randomness comes from xoshiro256** seeded by
 * SplitMix64 over (seed, epoch, stream, index), never from rand() or a
 * clock, so every rank derives the same plan (DESIGN 8 "Determinism").
 * Locking: none; a finished plan is immutable.
 */
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/hash.h"
#include "core/plan_internal.h"

/* ---- randomness ---- */
void dh__rng_seed(struct dh__rng *r, uint64_t seed, uint64_t epoch,
                  uint64_t stream, uint64_t index)
{
    uint64_t x = seed;

    /* Chain the inputs through the mixer so that nearby tuples give
     * unrelated states. */
    x = dh__splitmix64(&x) ^ epoch;
    x = dh__splitmix64(&x) ^ stream;
    x = dh__splitmix64(&x) ^ index;
    for (int i = 0; i < 4; i++)
        r->s[i] = dh__splitmix64(&x);
}

static uint64_t rotl(uint64_t v, int k)
{
    return (v << k) | (v >> (64 - k));
}

uint64_t dh__rng_next(struct dh__rng *r)
{
    uint64_t *s = r->s, out = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;

    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return out;
}

uint64_t dh__rng_below(struct dh__rng *r, uint64_t bound)
{
    /* Lemire's multiply-shift with rejection: unbiased for every bound. */
    unsigned __int128 m = (unsigned __int128)dh__rng_next(r) * bound;
    uint64_t lo = (uint64_t)m;

    if (lo < bound) {
        uint64_t thresh = -bound % bound;

        while (lo < thresh) {
            m = (unsigned __int128)dh__rng_next(r) * bound;
            lo = (uint64_t)m;
        }
    }
    return (uint64_t)(m >> 64);
}

void dh_plan_permutation(uint64_t n, uint64_t seed, uint64_t epoch,
                         uint64_t *out)
{
    struct dh__rng rng;

    for (uint64_t i = 0; i < n; i++)
        out[i] = i;
    dh__rng_seed(&rng, seed, epoch, DH__RNG_PERMUTATION, 0);
    for (uint64_t i = n; i > 1; i--) {
        uint64_t j = dh__rng_below(&rng, i), t = out[i - 1];

        out[i - 1] = out[j];
        out[j] = t;
    }
}

/* ---- options ---- */
void dh_plan_opts_init(struct dh_plan_opts *o)
{
    memset(o, 0, sizeof(*o));
    o->world_size = 1;
    o->batch_size = 1;
    o->balance = DH_BALANCE_FIXED;
    o->drop_last = 1;
}

static int check_opts(const struct dh_plan_opts *o, uint64_t n,
                      struct dh_err *e)
{
    uint64_t step = (uint64_t)o->world_size * o->batch_size;

    if (o->world_size == 0 || o->world_size > DH_PLAN_WORLD_MAX)
        return dh_err_set(e, DH_EINVAL, "world size %u not in [1, %u]",
                          o->world_size, DH_PLAN_WORLD_MAX);
    if (o->batch_size == 0 || o->batch_size > DH_PLAN_BATCH_MAX)
        return dh_err_set(e, DH_EINVAL, "batch size %u not in [1, %u]",
                          o->batch_size, DH_PLAN_BATCH_MAX);
    if (step > DH_PLAN_STEP_MAX)
        return dh_err_set(e, DH_EINVAL,
                          "world size x batch size = %llu "
                          "is over %u",
                          (unsigned long long)step, DH_PLAN_STEP_MAX);
    if (o->balance < DH_BALANCE_FIXED || o->balance > DH_BALANCE_NONE)
        return dh_err_set(e, DH_EINVAL, "unknown balance mode %d", o->balance);
    if (o->order < DH_ORDER_ALTERNATE || o->order > DH_ORDER_SORTED)
        return dh_err_set(e, DH_EINVAL, "unknown step order %d", o->order);
    if (o->window > DH_PLAN_WINDOW_MAX)
        return dh_err_set(e, DH_EINVAL, "window %u is over %u", o->window,
                          DH_PLAN_WINDOW_MAX);
    if (n == 0)
        return dh_err_set(e, DH_EINVAL, "the manifest has no samples");
    if (o->drop_last && n < step)
        return dh_err_set(e, DH_EINVAL,
                          "a global step needs world size x "
                          "batch size = %llu samples but the epoch has %llu "
                          "(drop_last leaves no step)",
                          (unsigned long long)step, (unsigned long long)n);
    return 0;
}

/* ---- profile groups (Algorithm 1 line 2) ---- */

/* grank[p]: 0 for the profile with the highest mean tokens, 1 next, ...
 * ties by profile value.  *out owned by the caller. */
struct prof_mean {
    double mean;
    uint32_t prof;
};

static int prof_cmp(const void *a, const void *b)
{
    const struct prof_mean *x = a, *y = b;

    if (x->mean != y->mean)
        return x->mean > y->mean ? -1 : 1;
    return x->prof < y->prof ? -1 : x->prof > y->prof;
}

static int group_ranks(const uint32_t *tokens, const uint16_t *profile,
                       uint64_t n, uint16_t **out)
{
    double *sum = dh__calloc(65536, sizeof(*sum));
    uint64_t *cnt = dh__calloc(65536, sizeof(*cnt));
    struct prof_mean *pm = dh__malloc(65536 * sizeof(*pm));
    uint16_t *grank = dh__calloc(65536, sizeof(*grank));
    uint32_t np = 0;
    int rc = DH_ENOMEM;

    if (!sum || !cnt || !pm || !grank)
        goto out_free;
    for (uint64_t i = 0; i < n; i++) {
        sum[profile[i]] += tokens[i];
        cnt[profile[i]]++;
    }
    for (uint32_t p = 0; p < 65536; p++)
        if (cnt[p])
            pm[np++] = (struct prof_mean){sum[p] / (double)cnt[p], p};
    qsort(pm, np, sizeof(*pm), prof_cmp);
    for (uint32_t k = 0; k < np; k++)
        grank[pm[k].prof] = (uint16_t)k;
    *out = grank;
    grank = NULL;
    rc = 0;
out_free:
    dh__free(sum);
    dh__free(cnt);
    dh__free(pm);
    dh__free(grank);
    return rc;
}

/* ---- the plan ---- */

/* Caps of the partial last step's ranks (fixed / none; see plan.h). */
static uint32_t partial_cap(uint64_t r, uint32_t world, uint32_t rank)
{
    return (uint32_t)(r / world) + (rank < r % world ? 1 : 0);
}

static void plan_none(struct dh_plan *p)
{
    uint64_t full = p->n / ((uint64_t)p->world * p->batch);

    for (uint64_t g = 0; g < p->steps; g++)
        for (uint32_t r = 0; r < p->world; r++) {
            uint64_t k = g * p->world + r;
            uint64_t c = g < full
                             ? p->batch
                             : partial_cap(p->kept - full * p->world * p->batch,
                                           p->world, r);
            p->off[k + 1] = p->off[k] + c;
        }
}

static int plan_windows(struct dh_plan *p, const struct dh__plan_input *in)
{
    uint64_t per_step = (uint64_t)p->world * p->batch;
    uint64_t full = p->n / per_step;
    /* Scratch for the largest window actually planned: O(n), not
     * O(window x world x batch), when the epoch is short. */
    uint32_t wmax = full == 0          ? 1
                    : full < p->window ? (uint32_t)full
                                       : p->window;
    uint32_t nb = wmax * p->world;
    struct dh__plan_scratch *s = NULL;
    uint32_t *caps = dh__malloc(nb * sizeof(*caps));
    int rc = DH_ENOMEM;

    if (!caps || dh__plan_scratch_create(wmax * per_step, nb, &s))
        goto out_free;
    for (uint64_t g = 0; g < full; g += p->window) {
        uint32_t w = (uint32_t)(full - g < p->window ? full - g : p->window);

        for (uint32_t b = 0; b < w * p->world; b++)
            caps[b] = p->balance == DH_BALANCE_FIXED ? p->batch : UINT32_MAX;
        dh__plan_window(p, s, in, g, w, w * per_step, caps, 0);
    }
    if (p->steps > full) { /* the partial last step */
        uint64_t r = p->kept - full * per_step;

        for (uint32_t k = 0; k < p->world; k++)
            caps[k] = p->balance == DH_BALANCE_FIXED
                          ? partial_cap(r, p->world, k)
                          : UINT32_MAX;
        dh__plan_window(p, s, in, full, 1, r, caps, 1);
    }
    rc = 0;
out_free:
    dh__plan_scratch_destroy(s);
    dh__free(caps);
    return rc;
}

static void sum_tokens(struct dh_plan *p, const uint32_t *tokens)
{
    for (uint64_t k = 0; k < p->steps * p->world; k++) {
        uint64_t t = 0;

        for (uint64_t j = p->off[k]; j < p->off[k + 1]; j++)
            t += tokens[p->ids[j]];
        p->tok[k] = t;
    }
}

static int plan_alloc(const struct dh_plan_opts *o, uint64_t n,
                      struct dh_plan **out)
{
    struct dh_plan *p = dh__calloc(1, sizeof(*p));
    uint64_t per_step = (uint64_t)o->world_size * o->batch_size;

    if (!p)
        return DH_ENOMEM;
    p->world = o->world_size;
    p->batch = o->batch_size;
    p->balance = o->balance;
    /* `free` plans step by step: pooling a window's bins would let a
     * step's total (the global batch) vary, not only the per-rank counts. */
    p->window = o->balance != DH_BALANCE_FIXED ? 1
                : o->window                    ? o->window
                                               : DH_PLAN_WINDOW_DEFAULT;
    p->n = n;
    p->kept = o->drop_last ? n / per_step * per_step : n;
    p->steps = (p->kept + per_step - 1) / per_step;
    p->ids = dh__malloc(n * sizeof(*p->ids));
    p->off = dh__calloc(p->steps * p->world + 1, sizeof(*p->off));
    p->tok = dh__calloc(p->steps * p->world, sizeof(*p->tok));
    if (!p->ids || !p->off || !p->tok) {
        dh_plan_destroy(p);
        return DH_ENOMEM;
    }
    *out = p;
    return 0;
}

int dh_plan_create(const uint32_t *tokens, const uint16_t *profile, uint64_t n,
                   const struct dh_plan_opts *o, struct dh_plan **out,
                   struct dh_err *e)
{
    struct dh_plan *p = NULL;
    struct dh__plan_input in = {tokens,  profile,  NULL,
                                o->seed, o->epoch, o->order};
    uint16_t *grank = NULL;
    int rc = check_opts(o, n, e);

    if (rc)
        return rc;
    if (o->balance != DH_BALANCE_NONE &&
        (uint64_t)(o->window ? o->window : DH_PLAN_WINDOW_DEFAULT) *
                o->world_size * o->batch_size >
            DH_PLAN_WINDOW_IDS)
        return dh_err_set(e, DH_ETOOBIG,
                          "window x world size x batch size "
                          "is over %u samples",
                          DH_PLAN_WINDOW_IDS);
    if ((rc = plan_alloc(o, n, &p)))
        goto out_nomem;
    dh_plan_permutation(n, o->seed, o->epoch, p->ids);
    if (p->balance == DH_BALANCE_NONE) {
        plan_none(p);
    } else {
        /* Algorithm 1 groups by profile; the window sorts by tokens alone
         * (the grouping would only cost balance across W steps). */
        if (p->window == 1 && profile) {
            if ((rc = group_ranks(tokens, profile, n, &grank)))
                goto out_nomem;
            in.grank = grank;
        }
        if ((rc = plan_windows(p, &in)))
            goto out_nomem;
    }
    sum_tokens(p, tokens);
    dh__free(grank);
    *out = p;
    return 0;
out_nomem:
    dh__free(grank);
    dh_plan_destroy(p);
    return dh_err_set(e, DH_ENOMEM, "out of memory planning %llu samples",
                      (unsigned long long)n);
}

void dh_plan_destroy(struct dh_plan *p)
{
    if (!p)
        return;
    dh__free(p->ids);
    dh__free(p->off);
    dh__free(p->tok);
    dh__free(p);
}

/* ---- reading ---- */
uint64_t dh_plan_steps(const struct dh_plan *p)
{
    return p->steps;
}
uint32_t dh_plan_world_size(const struct dh_plan *p)
{
    return p->world;
}
uint64_t dh_plan_kept(const struct dh_plan *p)
{
    return p->kept;
}
uint32_t dh_plan_window(const struct dh_plan *p)
{
    return p->window;
}

const uint64_t *dh_plan_rank_ids(const struct dh_plan *p, uint64_t step,
                                 uint32_t rank, uint64_t *count)
{
    if (step >= p->steps || rank >= p->world) {
        *count = 0;
        return NULL;
    }
    uint64_t k = step * p->world + rank;

    *count = p->off[k + 1] - p->off[k];
    return p->ids + p->off[k];
}

uint64_t dh_plan_rank_tokens(const struct dh_plan *p, uint64_t step,
                             uint32_t rank)
{
    if (step >= p->steps || rank >= p->world)
        return 0;
    return p->tok[step * p->world + rank];
}

double dh_plan_step_ratio(const struct dh_plan *p, uint64_t step)
{
    uint64_t max = 0, sum = 0;

    if (step >= p->steps)
        return 1.0;
    for (uint32_t r = 0; r < p->world; r++) {
        uint64_t t = p->tok[step * p->world + r];

        sum += t;
        max = t > max ? t : max;
    }
    return sum ? (double)max * p->world / (double)sum : 1.0;
}

void dh_plan_balance(const struct dh_plan *p, double *mean_ratio,
                     double *worst_ratio)
{
    double total = 0, worst = 0;

    for (uint64_t g = 0; g < p->steps; g++) {
        double r = dh_plan_step_ratio(p, g);

        total += r;
        worst = r > worst ? r : worst;
    }
    if (mean_ratio)
        *mean_ratio = p->steps ? total / (double)p->steps : 1.0;
    if (worst_ratio)
        *worst_ratio = p->steps ? worst : 1.0;
}
