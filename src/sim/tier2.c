/*
 * tier2.c - Tier 2 in the simulator (issue 17; docs/rebalance.md "In the
 * simulator").  Runs the loader's own gate (core/rebalance.c) on every
 * round of the simulated run, before the event loop: which samples a rank
 * computes does not change when they arrive (the exchange happens after
 * materialization), so a round's verdict is a pure function of the plan,
 * the actual tokens and the measured rates, and the event loop needs only
 * each batch's resulting GPU time and each round's exchange time.
 *
 * Simplifications (documented): the round buffer's latency is taken as
 * covered by prefetch; the collective runs at link_gbps with link_lat_ms,
 * the rate Tier 2 would have measured; a sample's actual GPU time scales
 * with its actual tokens (gpu_ms x error).
 */
#include <math.h>
#include <string.h>

#include "core/alloc.h"
#include "core/hash.h"
#include "datahelix/rebalance.h"
#include "sim/sim.h"

double dh__sim_est_error(const struct dh_sim_config *c, uint64_t id)
{
    double sg = c->est_error;

    if (!(sg > 0))
        return 1;
    /* a stream of its own: not the CPU noise of the same sample */
    uint64_t h = dh__mix64(c->seed * 0x9e3779b97f4a7c15ull ^
                           dh__mix64(id ^ 0x7ddb1e5ull));
    double u1 = ((double)(h >> 11) + 0.5) * 0x1p-53;
    double u2 = (double)(dh__mix64(h) >> 11) * 0x1p-53;
    double z = sqrt(-2 * log(u1)) * cos(2 * M_PI * u2);

    return exp(sg * z - sg * sg / 2);
}

struct round {
    const struct dh_sim_config *c;
    const struct dh_sim_workload *w;
    dh_sim_batch_fn ids;
    void *ctx;
    struct dh_rb_sample *rs;
    uint64_t *sid; /* rs[i]'s sample id */
    uint32_t *to;
    size_t n;
};

/* The round's samples from step k0, nst steps (at most cap); the GPU ms
 * and tokens of the round added to *gms, *tok. */
static int gather(struct round *o, size_t cap, uint64_t k0, uint32_t nst,
                  double *gms, double *tok, struct dh_err *e)
{
    o->n = 0;
    for (uint32_t t = 0; t < nst; t++)
        for (uint32_t r = 0; r < o->c->ranks; r++) {
            uint64_t cnt = 0;
            const uint64_t *ids = o->ids(o->ctx, k0 + t, r, &cnt);

            if (cnt > cap - o->n)
                return dh_err_set(e, DH_EINVAL,
                                  "sim: tier 2: step %llu of rank %u holds "
                                  "%llu samples, over the round's %zu",
                                  (unsigned long long)(k0 + t), r,
                                  (unsigned long long)cnt, cap);
            for (uint64_t i = 0; i < cnt; i++) {
                double x = dh__sim_est_error(o->c, ids[i]);
                const struct dh_sim_sample *sm = &o->w->s[ids[i]];

                o->sid[o->n] = ids[i];
                o->rs[o->n++] = (struct dh_rb_sample){
                    sm->tokens * x, (uint64_t)sm->out_bytes, r, t};
                *gms += sm->gpu_ms * x;
                *tok += sm->tokens * x;
            }
        }
    return 0;
}

static void account(struct dh_sim_tier2 *t2, const struct dh_rb_decision *d)
{
    int move = d->verdict == DH_RB_MOVE;

    t2->rounds++;
    t2->moved += move;
    t2->kept += d->verdict == DH_RB_KEEP;
    t2->unmeasured += d->verdict == DH_RB_UNMEASURED;
    t2->balanced += d->verdict == DH_RB_BALANCED;
    t2->gain_ms += d->gain_ms;
    t2->cost_ms += d->cost_ms;
    t2->ratio_before += d->ratio_before;
    t2->ratio_after += move ? d->ratio_after : d->ratio_before;
    if (move) {
        t2->moved_samples += d->moved;
        t2->moved_bytes += d->moved_bytes;
    }
}

static int one_round(struct round *o, uint64_t k0, uint32_t nst, double mspt,
                     double *gpu, double *xfer, struct dh_sim_tier2 *t2,
                     struct dh_err *e)
{
    const struct dh_sim_config *c = o->c;
    struct dh_rb_gate g = {mspt, mspt > 0 ? c->link_gbps * 1.25e5 : 0,
                           c->link_lat_ms, c->tier2_margin};
    struct dh_rb_decision d;
    int rc;

    if ((rc = dh_rb_propose(o->rs, o->n, c->ranks, nst, o->to, e)) != 0 ||
        (rc = dh_rb_decide(o->rs, o->to, o->n, c->ranks, nst, &g, &d, e)) != 0)
        return rc;
    account(t2, &d);
    if (d.verdict == DH_RB_MOVE)
        xfer[k0] = d.cost_ms;
    for (size_t i = 0; i < o->n; i++) {
        uint32_t r = d.verdict == DH_RB_MOVE ? o->to[i] : o->rs[i].rank;
        uint64_t b = (k0 + o->rs[i].step) * c->ranks + r;

        gpu[b] += o->w->s[o->sid[i]].gpu_ms * dh__sim_est_error(c, o->sid[i]);
    }
    return 0;
}

int dh__sim_tier2(const struct dh_sim_config *c,
                  const struct dh_sim_workload *w, uint64_t nsteps,
                  dh_sim_batch_fn ids, void *ctx, double *gpu, double *xfer,
                  struct dh_sim_tier2 *t2, uint64_t *cross_all,
                  uint64_t *cross_from, uint64_t from, struct dh_err *e)
{
    uint32_t R = c->tier2_round ? c->tier2_round : 4;
    size_t cap = (size_t)R * c->ranks * c->batch * 2; /* plan slack */
    struct round o = {c, w, ids, ctx, NULL, NULL, NULL, 0};
    double gms = 0, tok = 0;
    int rc = 0;

    o.rs = dh__malloc(cap * sizeof(*o.rs));
    o.sid = dh__malloc(cap * sizeof(*o.sid));
    o.to = dh__malloc(cap * sizeof(*o.to));
    if (!o.rs || !o.sid || !o.to) {
        rc = dh_err_set(e, DH_ENOMEM, "sim: out of memory (tier 2)");
        goto out_free;
    }
    for (uint64_t k0 = 0; k0 < nsteps; k0 += R) {
        uint32_t nst = (uint32_t)(nsteps - k0 < R ? nsteps - k0 : R);
        double mspt = tok > 0 ? gms / tok : 0; /* previous rounds' */
        uint64_t before = t2->moved_bytes;

        if ((rc = gather(&o, cap, k0, nst, &gms, &tok, e)) != 0 ||
            (rc = one_round(&o, k0, nst, mspt, gpu, xfer, t2, e)) != 0)
            goto out_free;
        *cross_all += t2->moved_bytes - before;
        if (k0 >= from)
            *cross_from += t2->moved_bytes - before;
    }
    if (t2->rounds) {
        t2->ratio_before /= (double)t2->rounds;
        t2->ratio_after /= (double)t2->rounds;
    }
out_free:
    dh__free(o.rs);
    dh__free(o.sid);
    dh__free(o.to);
    return rc;
}
