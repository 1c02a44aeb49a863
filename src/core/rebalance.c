/*
 * rebalance.c - Tier-2's proposal, cost gate and redistribution plan (see
 * datahelix/rebalance.h, docs/rebalance.md; paper Sec. 3.4-3.5).
 *
 * Design notes: the proposal works one step of the round at a time because
 * ranks meet at every step's all-reduce: moving load between steps would
 * not shorten a step.  Two greedy min-max proposals per step, both
 * keeping every rank's count: pairwise swaps from the current assignment
 * (the most loaded rank gives its sample, the least loaded one returns a
 * smaller one; moves little) and LPT with a count per bin (the classic
 * 4/3-approximation, whose bins are then named after the ranks already
 * holding most of their bytes, greedy matching on overlap).  LPT is taken
 * only when its max is strictly lower: a moved sample costs bytes.  Both
 * are cheap enough to run on every rank on the all-gathered features.
 * The gate charges one collective at the busiest rank's max(sent,
 * received) bytes over the measured bandwidth, plus its measured latency:
 * that is what all_to_all_single waits for.
 *
 * No I/O; scratch through the allocation seam, freed before return.
 */
#include <math.h>
#include <string.h>

#include "core/alloc.h"
#include "datahelix/rebalance.h"

static const char *const verdict_names[] = {"keep", "move", "unmeasured",
                                            "balanced"};

const char *dh_rb_verdict_name(enum dh_rb_verdict v)
{
    return (unsigned)v < 4 ? verdict_names[v] : "unknown";
}

static int check_sizes(size_t n, uint32_t nranks, uint32_t nsteps,
                       struct dh_err *e)
{
    if (nranks == 0 || nranks > DH_RB_MAX_RANKS || nsteps == 0 ||
        nsteps > DH_RB_MAX_STEPS || n > (size_t)UINT32_MAX)
        return dh_err_set(e, DH_EINVAL,
                          "rebalance: %u ranks x %u steps (%zu samples) is "
                          "outside 1..%d ranks, 1..%d steps",
                          nranks, nsteps, n, DH_RB_MAX_RANKS, DH_RB_MAX_STEPS);
    return 0;
}

static int check_samples(const struct dh_rb_sample *s, size_t n,
                         uint32_t nranks, uint32_t nsteps, struct dh_err *e)
{
    for (size_t i = 0; i < n; i++)
        if (s[i].rank >= nranks || s[i].step >= nsteps || !(s[i].tokens >= 0) ||
            !isfinite(s[i].tokens))
            return dh_err_set(e, DH_EINVAL,
                              "rebalance: sample %zu of the round has rank "
                              "%u, step %u, tokens %g (ranks < %u, steps "
                              "< %u, tokens finite and >= 0)",
                              i, s[i].rank, s[i].step, s[i].tokens, nranks,
                              nsteps);
    return 0;
}

/* ---- the proposal ---- */

/* idx[0..m) by tokens descending, then by index (insertion sort: a step
 * holds ranks x batch samples, a few hundred at most). */
static void sort_desc(const struct dh_rb_sample *s, uint32_t *idx, size_t m)
{
    for (size_t i = 1; i < m; i++) {
        uint32_t v = idx[i];
        size_t j = i;

        while (j > 0 &&
               (s[idx[j - 1]].tokens < s[v].tokens ||
                (s[idx[j - 1]].tokens == s[v].tokens && idx[j - 1] > v))) {
            idx[j] = idx[j - 1];
            j--;
        }
        idx[j] = v;
    }
}

/* LPT into bins: bin b takes count[b] samples (the step's count at rank
 * b), each next largest sample to the least loaded bin with room. */
static void lpt(const struct dh_rb_sample *s, const uint32_t *idx, size_t m,
                uint32_t nranks, const double *count, double *load,
                double *left, uint32_t *bin)
{
    for (uint32_t r = 0; r < nranks; r++) {
        load[r] = 0;
        left[r] = count[r];
    }
    for (size_t k = 0; k < m; k++) {
        uint32_t best = UINT32_MAX;

        for (uint32_t r = 0; r < nranks; r++)
            if (left[r] > 0 && (best == UINT32_MAX || load[r] < load[best]))
                best = r;
        bin[idx[k]] = best; /* some bin has room: sum of counts is m */
        load[best] += s[idx[k]].tokens;
        left[best] -= 1;
    }
}

/* Names bin b after rank name[b]: greedily the (bin, rank) pair of equal
 * counts whose samples overlap in most bytes (ov: nranks^2, consumed). */
static void match(uint32_t nranks, const double *count, double *ov,
                  double *name)
{
    for (uint32_t b = 0; b < nranks; b++)
        for (uint32_t r = 0; r < nranks; r++)
            if (count[b] != count[r])
                ov[b * nranks + r] = -1;
    for (uint32_t k = 0; k < nranks; k++) {
        double best = -1;
        uint32_t bb = 0, br = 0;

        for (uint32_t i = 0; i < nranks * nranks; i++)
            if (ov[i] > best) {
                best = ov[i];
                bb = i / nranks;
                br = i % nranks;
            }
        if (best < 0)
            break; /* every bin is named */
        name[bb] = br;
        for (uint32_t i = 0; i < nranks; i++)
            ov[bb * nranks + i] = ov[i * nranks + br] = -1;
    }
}

static double max_of(const double *v, uint32_t n)
{
    double mx = 0;

    for (uint32_t r = 0; r < n; r++)
        mx = v[r] > mx ? v[r] : mx;
    return mx;
}

/* The swap search: from the current assignment, repeatedly swap the pair
 * (one sample of the most loaded rank, one of the least) whose token
 * difference is nearest half their gap, while one exists.  Moves little
 * and keeps counts; sw[] gets the result, its max load the return. */
static double swaps(const struct dh_rb_sample *s, const uint32_t *idx, size_t m,
                    uint32_t nranks, double *load, uint32_t *sw)
{
    for (uint32_t r = 0; r < nranks; r++)
        load[r] = 0;
    for (size_t k = 0; k < m; k++) {
        sw[idx[k]] = s[idx[k]].rank;
        load[s[idx[k]].rank] += s[idx[k]].tokens;
    }
    for (size_t it = 0; it < m * m + 1; it++) {
        uint32_t hi = 0, lo = 0, ba = 0, bb = 0;
        double gap, best = 0;

        for (uint32_t r = 1; r < nranks; r++) {
            hi = load[r] > load[hi] ? r : hi;
            lo = load[r] < load[lo] ? r : lo;
        }
        gap = load[hi] - load[lo];
        for (size_t a = 0; a < m; a++)
            for (size_t b = 0; b < m && sw[idx[a]] == hi; b++) {
                double d = s[idx[a]].tokens - s[idx[b]].tokens;
                double v = d < gap - d ? d : gap - d;

                if (sw[idx[b]] == lo && v > best) {
                    best = v;
                    ba = idx[a];
                    bb = idx[b];
                }
            }
        if (best <= 0)
            break;
        sw[ba] = lo;
        sw[bb] = hi;
        load[hi] -= s[ba].tokens - s[bb].tokens;
        load[lo] += s[ba].tokens - s[bb].tokens;
    }
    return max_of(load, nranks);
}

static void propose_step(const struct dh_rb_sample *s, size_t n, uint32_t t,
                         uint32_t nranks, double *w, uint32_t *idx,
                         uint32_t *to, uint32_t *sw)
{
    double *count = w, *load = w + nranks, *left = w + 2 * nranks;
    double *name = w + 3 * nranks, *ov = w + 4 * nranks, lp;
    size_t m = 0;

    memset(w, 0, (size_t)nranks * (4 + nranks) * sizeof(*w));
    for (size_t i = 0; i < n; i++)
        if (s[i].step == t) {
            idx[m++] = (uint32_t)i;
            count[s[i].rank] += 1;
        }
    if (m == 0)
        return;
    sort_desc(s, idx, m);
    lpt(s, idx, m, nranks, count, load, left, to);
    lp = max_of(load, nranks);
    if (swaps(s, idx, m, nranks, left, sw) <= lp) {
        /* the swaps do as well as LPT (or keeping beats both) and move
         * less */
        for (size_t k = 0; k < m; k++)
            to[idx[k]] = sw[idx[k]];
        return;
    }
    for (size_t k = 0; k < m; k++) /* to[] holds bins here */
        ov[to[idx[k]] * nranks + s[idx[k]].rank] += (double)s[idx[k]].bytes +
                                                    1; /* +1: count too */
    match(nranks, count, ov, name);
    for (size_t k = 0; k < m; k++)
        to[idx[k]] = (uint32_t)name[to[idx[k]]];
}

int dh_rb_propose(const struct dh_rb_sample *s, size_t n, uint32_t nranks,
                  uint32_t nsteps, uint32_t *to, struct dh_err *e)
{
    double *w = NULL;
    uint32_t *idx = NULL, *tmp = NULL, *sw = NULL;
    int rc;

    if ((rc = check_sizes(n, nranks, nsteps, e)) != 0 ||
        (rc = check_samples(s, n, nranks, nsteps, e)) != 0)
        return rc;
    w = dh__malloc((size_t)nranks * (4 + nranks) * sizeof(*w));
    idx = dh__malloc((n ? n : 1) * sizeof(*idx));
    tmp = dh__malloc((n ? n : 1) * sizeof(*tmp));
    sw = dh__malloc((n ? n : 1) * sizeof(*sw));
    if (!w || !idx || !tmp || !sw) {
        rc = dh_err_set(e, DH_ENOMEM,
                        "rebalance: out of memory proposing "
                        "a round");
        goto out_free;
    }
    for (uint32_t t = 0; t < nsteps; t++)
        propose_step(s, n, t, nranks, w, idx, tmp, sw);
    memcpy(to, tmp, n * sizeof(*to));
out_free:
    dh__free(w);
    dh__free(idx);
    dh__free(tmp);
    dh__free(sw);
    return rc;
}

/* ---- the gate ---- */

static int check_gate(const struct dh_rb_gate *g, struct dh_err *e)
{
    if (!(g->ms_per_token >= 0) || !isfinite(g->ms_per_token) ||
        !(g->latency_ms >= 0) || !isfinite(g->latency_ms) ||
        !(g->margin >= 0) || !isfinite(g->margin) || isnan(g->bytes_per_ms))
        return dh_err_set(e, DH_EINVAL,
                          "rebalance: gate inputs ms_per_token %g, "
                          "latency_ms %g, margin %g must be finite and >= 0",
                          g->ms_per_token, g->latency_ms, g->margin);
    return 0;
}

/* Mean over steps of max/mean load (1 for a step with no tokens), and the
 * sum over steps of the max: load[(t * nranks + r)]. */
static void step_stats(const double *load, uint32_t nranks, uint32_t nsteps,
                       double *sum_max, double *ratio)
{
    *sum_max = 0;
    *ratio = 0;
    for (uint32_t t = 0; t < nsteps; t++) {
        double mx = 0, tot = 0;

        for (uint32_t r = 0; r < nranks; r++) {
            double v = load[(size_t)t * nranks + r];

            mx = v > mx ? v : mx;
            tot += v;
        }
        *sum_max += mx;
        *ratio += tot > 0 ? mx / (tot / nranks) : 1;
    }
    *ratio /= nsteps;
}

/* Loads and counts of both assignments; DH_EINVAL if a count changed. */
static int fill_loads(const struct dh_rb_sample *s, const uint32_t *to,
                      size_t n, uint32_t nranks, uint32_t nsteps, double *w,
                      struct dh_err *e)
{
    size_t cells = (size_t)nranks * nsteps;
    double *before = w, *after = w + cells;
    double *cnt = w + 2 * cells;

    for (size_t i = 0; i < n; i++) {
        size_t a = (size_t)s[i].step * nranks + s[i].rank;
        size_t b = (size_t)s[i].step * nranks + to[i];

        before[a] += s[i].tokens;
        after[b] += s[i].tokens;
        cnt[a] += 1;
        cnt[b] -= 1;
    }
    for (size_t c = 0; c < cells; c++)
        if (cnt[c] != 0)
            return dh_err_set(e, DH_EINVAL,
                              "rebalance: the proposal gives rank %zu %+.0f "
                              "samples at step %zu of the round (counts per "
                              "rank and step must stay as planned)",
                              c % nranks, -cnt[c], c / nranks);
    return 0;
}

static void traffic(const struct dh_rb_sample *s, const uint32_t *to, size_t n,
                    uint32_t nranks, double *w, struct dh_rb_decision *d)
{
    double *sent = w, *recv = w + nranks;

    for (size_t i = 0; i < n; i++) {
        if (to[i] == s[i].rank)
            continue;
        d->moved++;
        d->moved_bytes += s[i].bytes;
        sent[s[i].rank] += (double)s[i].bytes;
        recv[to[i]] += (double)s[i].bytes;
    }
    for (uint32_t r = 0; r < nranks; r++) {
        double m = sent[r] > recv[r] ? sent[r] : recv[r];

        if (m > (double)d->max_rank_bytes)
            d->max_rank_bytes = (uint64_t)m;
    }
}

/* before_ms / after_ms hold tokens on entry (a gain in tokens is a gain
 * whatever the step time), ms on return. */
static void verdict(const struct dh_rb_gate *g, struct dh_rb_decision *d)
{
    int gains = d->after_ms < d->before_ms;

    d->before_ms *= g->ms_per_token;
    d->after_ms *= g->ms_per_token;
    d->gain_ms = gains ? d->before_ms - d->after_ms : 0;
    if (d->moved == 0 || !gains) {
        d->verdict = DH_RB_BALANCED;
        return;
    }
    if (!(g->bytes_per_ms > 0) || !(g->ms_per_token > 0)) {
        d->verdict = DH_RB_UNMEASURED;
        return;
    }
    d->cost_ms = g->latency_ms + (double)d->max_rank_bytes / g->bytes_per_ms;
    d->verdict = d->gain_ms > d->cost_ms * g->margin ? DH_RB_MOVE : DH_RB_KEEP;
}

int dh_rb_decide(const struct dh_rb_sample *s, const uint32_t *to, size_t n,
                 uint32_t nranks, uint32_t nsteps, const struct dh_rb_gate *g,
                 struct dh_rb_decision *d, struct dh_err *e)
{
    size_t cells = (size_t)nranks * nsteps;
    struct dh_rb_decision out;
    double *w = NULL;
    int rc;

    if ((rc = check_sizes(n, nranks, nsteps, e)) != 0 ||
        (rc = check_samples(s, n, nranks, nsteps, e)) != 0 ||
        (rc = check_gate(g, e)) != 0)
        return rc;
    for (size_t i = 0; i < n; i++)
        if (to[i] >= nranks)
            return dh_err_set(e, DH_EINVAL,
                              "rebalance: the proposal sends sample %zu to "
                              "rank %u of %u",
                              i, to[i], nranks);
    if (!(w = dh__calloc(3 * cells + 2 * (size_t)nranks, sizeof(*w))))
        return dh_err_set(e, DH_ENOMEM,
                          "rebalance: out of memory in the "
                          "gate");
    if ((rc = fill_loads(s, to, n, nranks, nsteps, w, e)) != 0)
        goto out_free;
    memset(&out, 0, sizeof(out));
    step_stats(w, nranks, nsteps, &out.before_ms, &out.ratio_before);
    step_stats(w + cells, nranks, nsteps, &out.after_ms, &out.ratio_after);
    traffic(s, to, n, nranks, w + 3 * cells, &out);
    verdict(g, &out);
    *d = out;
out_free:
    dh__free(w);
    return rc;
}

/* ---- the plan ---- */

int dh_rb_plan(const struct dh_rb_sample *s, const uint32_t *to, size_t n,
               uint32_t nranks, uint64_t *split, struct dh_rb_route *route,
               struct dh_err *e)
{
    size_t cells = (size_t)nranks * nranks;
    uint64_t *soff, *roff;

    if (nranks == 0 || nranks > DH_RB_MAX_RANKS)
        return dh_err_set(e, DH_EINVAL, "rebalance: %u ranks (1..%d)", nranks,
                          DH_RB_MAX_RANKS);
    for (size_t i = 0; i < n; i++)
        if (s[i].rank >= nranks || to[i] >= nranks)
            return dh_err_set(e, DH_EINVAL,
                              "rebalance: sample %zu moves from rank %u to "
                              "%u of %u",
                              i, s[i].rank, to[i], nranks);
    if (!(soff = dh__calloc(2 * cells, sizeof(*soff))))
        return dh_err_set(e, DH_ENOMEM, "rebalance: out of memory planning");
    roff = soff + cells;
    memset(split, 0, cells * sizeof(*split));
    for (size_t i = 0; i < n; i++)
        if (to[i] != s[i].rank)
            split[(size_t)s[i].rank * nranks + to[i]] += s[i].bytes;
    /* segment starts: src's by destination, dst's by source */
    for (uint32_t a = 0; a < nranks; a++)
        for (uint32_t b = 1; b < nranks; b++) {
            soff[a * nranks + b] = soff[a * nranks + b - 1] +
                                   split[a * nranks + b - 1];
            roff[a * nranks + b] = roff[a * nranks + b - 1] +
                                   split[(size_t)(b - 1) * nranks + a];
        }
    for (size_t i = 0; i < n; i++) {
        uint32_t a = s[i].rank, b = to[i];

        route[i] = (struct dh_rb_route){a, b, 0, 0};
        if (a == b)
            continue;
        route[i].send_off = soff[a * nranks + b];
        route[i].recv_off = roff[b * nranks + a];
        soff[a * nranks + b] += s[i].bytes;
        roff[b * nranks + a] += s[i].bytes;
    }
    dh__free(soff);
    return 0;
}
