/*
 * plan_window.c - the windowed Tier-1 assignment (docs/planner.md).
 *
 * Design: one routine serves Algorithm 1 (window 1) and the planning
 * window (W > 1).  The window's ids are sorted largest first (with W = 1
 * grouped by profile first, heaviest profile group first, as Algorithm 1
 * lines 2-4 do) and each goes to the currently lightest bin that still has
 * room (a binary min-heap keyed by (tokens, count, bin)); a full bin leaves
 * the heap, which is the cardinality cap of `fixed`.  Empty bins sort
 * first among equal loads, so in `free` every bin gets >= 1 sample.
 *
 * Then the W x world bins are sorted by load and consecutive `world` bins
 * form a step (bins of similar load share a step), the heaviest bin of
 * global step g goes to rank g mod world and the next ones follow (so no
 * rank is always the heavy one).  The W steps then run heavy, light,
 * heavy, light: the heaviest paired with the lightest, the pairs in a
 * seeded random order (stream DH__RNG_WINDOW_ORDER, index = first step),
 * so that decode work comes evenly and no long-range load ordering leaks
 * into training (interleave_steps).
 *
 * Every tie is broken by an index (of equal tokens, by the position in
 * the epoch's seeded permutation), never by memory addresses or qsort's
 * instability, so the result is the same on every rank.
 * Locking: none (caller-owned memory only).
 */
#include <assert.h>
#include <stdlib.h>

#include "core/alloc.h"
#include "core/plan_internal.h"

struct item {
    uint64_t key; /* group rank << 32 | (UINT32_MAX - tokens) */
    uint64_t pos; /* in the epoch's seeded permutation: breaks key ties */
    uint64_t id;
};

struct bin {
    uint64_t load;
    uint32_t count, cap;
};

struct load_idx {
    uint64_t load;
    uint32_t idx;
};

struct dh__plan_scratch {
    struct item *items;
    struct load_idx *by_load;
    uint32_t *bin_of; /* per item */
    struct bin *bins;
    uint32_t *heap;     /* bin indices */
    uint32_t *order;    /* bins by load, then per (step, rank) */
    uint32_t *step_seq; /* position in the window -> step (load rank) */
    uint64_t *cursor;   /* per bin: next write position */
};

int dh__plan_scratch_create(uint64_t max_items, uint64_t max_bins,
                            struct dh__plan_scratch **out)
{
    struct dh__plan_scratch *s = dh__calloc(1, sizeof(*s));

    if (!s)
        return DH_ENOMEM;
    s->items = dh__malloc(max_items * sizeof(*s->items));
    s->by_load = dh__malloc(max_bins * sizeof(*s->by_load));
    s->bin_of = dh__malloc(max_items * sizeof(*s->bin_of));
    s->bins = dh__malloc(max_bins * sizeof(*s->bins));
    s->heap = dh__malloc(max_bins * sizeof(*s->heap));
    s->order = dh__malloc(2 * max_bins * sizeof(*s->order));
    s->step_seq = dh__malloc(max_bins * sizeof(*s->step_seq));
    s->cursor = dh__malloc(max_bins * sizeof(*s->cursor));
    if (!s->items || !s->by_load || !s->bin_of || !s->bins || !s->heap ||
        !s->order || !s->step_seq || !s->cursor) {
        dh__plan_scratch_destroy(s);
        return DH_ENOMEM;
    }
    *out = s;
    return 0;
}

void dh__plan_scratch_destroy(struct dh__plan_scratch *s)
{
    if (!s)
        return;
    dh__free(s->items);
    dh__free(s->by_load);
    dh__free(s->bin_of);
    dh__free(s->bins);
    dh__free(s->heap);
    dh__free(s->order);
    dh__free(s->step_seq);
    dh__free(s->cursor);
    dh__free(s);
}

static int item_cmp(const void *a, const void *b)
{
    const struct item *x = a, *y = b;

    if (x->key != y->key)
        return x->key < y->key ? -1 : 1;
    /* By the permutation, not the id: equal tokens are the common case
     * (every clip at one fixed size), and an id order would give those
     * the same plan in every epoch and for every seed. */
    return x->pos < y->pos ? -1 : x->pos > y->pos;
}

static uint32_t item_tokens(const struct item *it)
{
    return UINT32_MAX - (uint32_t)(it->key & UINT32_MAX);
}

/* ---- the bin heap: lightest, then emptiest, then lowest index ---- */
static int bin_less(const struct bin *bins, uint32_t a, uint32_t b)
{
    if (bins[a].load != bins[b].load)
        return bins[a].load < bins[b].load;
    if (bins[a].count != bins[b].count)
        return bins[a].count < bins[b].count;
    return a < b;
}

static void sift_down(const struct bin *bins, uint32_t *h, uint32_t n,
                      uint32_t i)
{
    for (;;) {
        uint32_t l = 2 * i + 1, r = l + 1, m = i;

        if (l < n && bin_less(bins, h[l], h[m]))
            m = l;
        if (r < n && bin_less(bins, h[r], h[m]))
            m = r;
        if (m == i)
            return;
        uint32_t t = h[i];
        h[i] = h[m];
        h[m] = t;
        i = m;
    }
}

/* Largest first into the lightest bin with room (LPT, cardinality cap). */
static void fill_bins(struct dh__plan_scratch *s, uint64_t nitems,
                      uint32_t nbins, const uint32_t *caps)
{
    uint32_t hn = 0;

    for (uint32_t b = 0; b < nbins; b++) {
        s->bins[b].load = 0;
        s->bins[b].count = 0;
        s->bins[b].cap = caps[b];
        if (caps[b] > 0)
            s->heap[hn++] = b; /* all equal but the index: already a heap */
    }
    for (uint64_t i = 0; i < nitems; i++) {
        assert(hn > 0); /* the caps sum to at least nitems */
        uint32_t b = s->heap[0];
        struct bin *bn = &s->bins[b];

        s->bin_of[i] = b;
        bn->load += item_tokens(&s->items[i]);
        if (++bn->count >= bn->cap)
            s->heap[0] = s->heap[--hn];
        sift_down(s->bins, s->heap, hn, 0);
    }
}

static int load_cmp(const void *a, const void *b)
{
    const struct load_idx *x = a, *y = b;

    if (x->load != y->load)
        return x->load > y->load ? -1 : 1;
    return x->idx < y->idx ? -1 : x->idx > y->idx;
}

/* Sorts bin indices by load, heaviest first, ties by index. */
static void order_bins_by_load(struct dh__plan_scratch *s, uint32_t nbins)
{
    for (uint32_t i = 0; i < nbins; i++) {
        s->by_load[i].load = s->bins[i].load;
        s->by_load[i].idx = i;
    }
    qsort(s->by_load, nbins, sizeof(*s->by_load), load_cmp);
    for (uint32_t i = 0; i < nbins; i++)
        s->order[i] = s->by_load[i].idx;
}

/*
 * seq[pos] = the load rank (0 = heaviest) of the window's step at position
 * pos.  Steps pair up heaviest with lightest, second with second-lightest,
 * and so on; the pairs take a seeded random order and each runs heavy then
 * light (an odd window's median step last).  Why not a plain shuffle: bins
 * of similar load share a step, so a window's steps differ in total load by
 * up to an order of magnitude on a heavy-tailed mix, and a shuffle lets
 * several heavy steps run back to back -- a burst of decode work that
 * prefetch cannot absorb when the GPU window does not grow with tokens.
 * Alternating bounds any two consecutive steps to about twice the mean
 * load.  The pairs are expanded in place from the back, which never
 * overwrites a pair not yet read.
 */
static void interleave_steps(uint32_t *seq, uint32_t nsteps,
                             const struct dh__plan_input *in,
                             uint64_t first_step)
{
    uint32_t npairs = nsteps / 2, o = nsteps;
    struct dh__rng rng;

    for (uint32_t q = 0; q < npairs; q++)
        seq[q] = q;
    dh__rng_seed(&rng, in->seed, in->epoch, DH__RNG_WINDOW_ORDER, first_step);
    for (uint32_t k = npairs; k > 1; k--) {
        uint32_t j = (uint32_t)dh__rng_below(&rng, k), t = seq[k - 1];

        seq[k - 1] = seq[j];
        seq[j] = t;
    }
    if (nsteps % 2) /* the median step, unpaired, runs last */
        seq[--o] = npairs;
    for (uint32_t q = npairs; q-- > 0;) {
        seq[--o] = nsteps - 1 - seq[q];
        seq[--o] = seq[q];
    }
}

/*
 * DH_ORDER_SORTED: seq[pos] = pos (heaviest first), or the reverse in
 * every other window, so that a window ends with steps like those the next
 * begins with.  Why (docs/planner.md "Step order"): a step's decode
 * overlaps the GPU step before it, so with the CPUs short a step waits
 * about its decode time less the previous step's window; when windows
 * follow tokens, a heavy step after a light one waits the longest, and
 * alternating puts one there every other step.
 */
static void sort_steps(uint32_t *seq, uint32_t nsteps, uint64_t window_no)
{
    for (uint32_t q = 0; q < nsteps; q++)
        seq[q] = window_no % 2 ? nsteps - 1 - q : q;
}

/*
 * s->order[nbins + (pos x world + rank)] = the bin that rank `rank` of the
 * window's step at position `pos` gets.
 */
static void form_steps(struct dh_plan *p, struct dh__plan_scratch *s,
                       const struct dh__plan_input *in, uint64_t first_step,
                       uint32_t nsteps, int partial)
{
    uint32_t w = p->world, nbins = nsteps * w;
    uint32_t *rank_bin = s->order + nbins;

    if (partial) {
        for (uint32_t r = 0; r < w; r++)
            rank_bin[r] = r;
        return;
    }
    order_bins_by_load(s, nbins);
    if (in->order == DH_ORDER_SORTED)
        sort_steps(s->step_seq, nsteps, first_step / p->window);
    else
        interleave_steps(s->step_seq, nsteps, in, first_step);
    for (uint32_t pos = 0; pos < nsteps; pos++) {
        uint32_t k = s->step_seq[pos];
        uint64_t g = first_step + pos;

        for (uint32_t i = 0; i < w; i++)
            rank_bin[pos * w + (uint32_t)((i + g) % w)] = s->order[k * w + i];
    }
}

/* Offsets of the window's (step, rank) lists, then the ids in place. */
static void write_window(struct dh_plan *p, struct dh__plan_scratch *s,
                         uint64_t first_step, uint32_t nsteps, uint64_t nitems)
{
    uint32_t nbins = nsteps * p->world;
    const uint32_t *rank_bin = s->order + nbins;
    uint64_t base = first_step * p->world;
    uint64_t *dst = p->ids + p->off[base];

    for (uint32_t k = 0; k < nbins; k++) {
        uint32_t b = rank_bin[k];

        s->cursor[b] = p->off[base + k] - p->off[base];
        p->off[base + k + 1] = p->off[base + k] + s->bins[b].count;
    }
    for (uint64_t i = 0; i < nitems; i++)
        dst[s->cursor[s->bin_of[i]]++] = s->items[i].id;
}

void dh__plan_window(struct dh_plan *p, struct dh__plan_scratch *s,
                     const struct dh__plan_input *in, uint64_t first_step,
                     uint32_t nsteps, uint64_t nitems, const uint32_t *caps,
                     int partial)
{
    const uint64_t *src = p->ids + p->off[first_step * p->world];

    for (uint64_t i = 0; i < nitems; i++) {
        uint64_t id = src[i];
        uint64_t g = in->grank ? in->grank[in->profile[id]] : 0;

        s->items[i].key = g << 32 | (UINT32_MAX - in->tokens[id]);
        s->items[i].pos = i;
        s->items[i].id = id;
    }
    qsort(s->items, nitems, sizeof(*s->items), item_cmp);
    fill_bins(s, nitems, nsteps * p->world, caps);
    form_steps(p, s, in, first_step, nsteps, partial);
    write_window(p, s, first_step, nsteps, nitems);
}
