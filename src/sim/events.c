/*
 * events.c - the simulator's event queue: a binary min-heap ordered by
 * (time, push sequence), so events at the same simulated time pop in the
 * order they were pushed (stable; the runs are deterministic).
 * Memory grows by doubling through the allocation seam.  Single-threaded.
 */
#include "sim/sim.h"

#include "core/alloc.h"

void dh__sim_evq_init(struct dh_sim_evq *q)
{
    q->h = NULL;
    q->n = q->cap = q->seq = 0;
}

void dh__sim_evq_fini(struct dh_sim_evq *q)
{
    dh__free(q->h);
    dh__sim_evq_init(q);
}

static int before(const struct dh_sim_event *x, const struct dh_sim_event *y)
{
    return x->t < y->t || (x->t == y->t && x->seq < y->seq);
}

int dh__sim_evq_push(struct dh_sim_evq *q, double t, uint32_t type, uint32_t a,
                     uint64_t b)
{
    struct dh_sim_event ev = {t, q->seq, type, a, b};
    uint64_t i;

    if (q->n == q->cap) {
        uint64_t cap = q->cap ? 2 * q->cap : 256;
        void *p = dh__realloc(q->h, cap * sizeof(*q->h));

        if (!p)
            return DH_ENOMEM;
        q->h = p;
        q->cap = cap;
    }
    q->seq++;
    for (i = q->n++; i > 0; i = (i - 1) / 2) { /* sift up */
        if (!before(&ev, &q->h[(i - 1) / 2]))
            break;
        q->h[i] = q->h[(i - 1) / 2];
    }
    q->h[i] = ev;
    return 0;
}

int dh__sim_evq_pop(struct dh_sim_evq *q, struct dh_sim_event *ev)
{
    struct dh_sim_event last;
    uint64_t i = 0;

    if (q->n == 0)
        return 0;
    *ev = q->h[0];
    last = q->h[--q->n];
    for (;;) { /* sift the last element down from the root */
        uint64_t c = 2 * i + 1;

        if (c >= q->n)
            break;
        if (c + 1 < q->n && before(&q->h[c + 1], &q->h[c]))
            c++;
        if (!before(&q->h[c], &last))
            break;
        q->h[i] = q->h[c];
        i = c;
    }
    if (q->n)
        q->h[i] = last;
    return 1;
}
