/*
 * dhpy_rebalance.c - datahelix._C.rebalance(): Tier-2's gate and planner
 * (datahelix/rebalance.h) for python/datahelix/_rebalance.py.  Thin: the
 * round's features come in as native-endian bytes (tokens float64, bytes
 * uint64, rank and step uint32), the verdict and the plan go back as a
 * dict.  Pure and short: runs with the GIL held.
 */
#include "python/dhpy.h"

#include <string.h>

#include "core/alloc.h"
#include "datahelix/rebalance.h"

struct bufs {
    Py_buffer tok, nb, rk, st, to;
};

static void release(struct bufs *b)
{
    PyBuffer_Release(&b->tok);
    PyBuffer_Release(&b->nb);
    PyBuffer_Release(&b->rk);
    PyBuffer_Release(&b->st);
    PyBuffer_Release(&b->to);
}

/* The round as dh_rb_sample[n] (n from the tokens buffer); NULL with an
 * exception on a size mismatch or no memory. */
static struct dh_rb_sample *samples(const struct bufs *b, size_t *n)
{
    const double *tok = b->tok.buf;
    const uint64_t *nb = b->nb.buf;
    const uint32_t *rk = b->rk.buf, *st = b->st.buf;
    struct dh_rb_sample *s;

    *n = (size_t)b->tok.len / 8;
    if (b->tok.len % 8 || b->nb.len != (Py_ssize_t)(*n * 8) ||
        b->rk.len != (Py_ssize_t)(*n * 4) ||
        b->st.len != (Py_ssize_t)(*n * 4) ||
        (b->to.buf && b->to.len != (Py_ssize_t)(*n * 4))) {
        PyErr_Format(PyExc_ValueError,
                     "rebalance: tokens (float64), bytes (uint64), ranks, "
                     "steps and to (uint32) must describe the same %zu "
                     "samples",
                     *n);
        return NULL;
    }
    if (!(s = dh__malloc((*n ? *n : 1) * sizeof(*s)))) {
        PyErr_NoMemory();
        return NULL;
    }
    for (size_t i = 0; i < *n; i++)
        s[i] = (struct dh_rb_sample){tok[i], nb[i], rk[i], st[i]};
    return s;
}

static PyObject *result(const struct dh_rb_decision *d, const uint32_t *to,
                        size_t n, const uint64_t *split, uint32_t nranks)
{
    return Py_BuildValue(
        "{s:s,s:d,s:d,s:d,s:d,s:d,s:d,s:K,s:K,s:K,s:y#,s:y#}", "verdict",
        dh_rb_verdict_name(d->verdict), "gain_ms", d->gain_ms, "cost_ms",
        d->cost_ms, "before_ms", d->before_ms, "after_ms", d->after_ms,
        "ratio_before", d->ratio_before, "ratio_after", d->ratio_after, "moved",
        (unsigned long long)d->moved, "moved_bytes",
        (unsigned long long)d->moved_bytes, "max_rank_bytes",
        (unsigned long long)d->max_rank_bytes, "to", (const char *)to,
        (Py_ssize_t)(n * 4), "split", (const char *)split,
        (Py_ssize_t)((size_t)nranks * nranks * 8));
}

static PyObject *py_rebalance(PyObject *mod, PyObject *args, PyObject *kw)
{
    static char *names[] = {"tokens",       "nbytes",       "ranks",
                            "steps",        "nranks",       "nsteps",
                            "ms_per_token", "bytes_per_ms", "latency_ms",
                            "margin",       "to",           NULL};
    struct bufs b = {0};
    struct dh_rb_gate g;
    struct dh_rb_decision d;
    struct dh_rb_sample *s = NULL;
    struct dh_rb_route *route = NULL;
    uint32_t *to = NULL;
    uint64_t *split = NULL;
    unsigned nranks, nsteps;
    struct dh_err e = {0};
    PyObject *out = NULL;
    size_t n = 0;
    int rc;

    (void)mod;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "y*y*y*y*IIdddd|z*", names,
                                     &b.tok, &b.nb, &b.rk, &b.st, &nranks,
                                     &nsteps, &g.ms_per_token, &g.bytes_per_ms,
                                     &g.latency_ms, &g.margin, &b.to))
        return NULL;
    if (!(s = samples(&b, &n)))
        goto out;
    if (nranks == 0 || nranks > DH_RB_MAX_RANKS) {
        PyErr_Format(PyExc_ValueError, "rebalance: nranks %u (1..%d)", nranks,
                     DH_RB_MAX_RANKS);
        goto out;
    }
    to = dh__malloc((n ? n : 1) * sizeof(*to));
    split = dh__malloc((size_t)nranks * nranks * sizeof(*split));
    route = dh__malloc((n ? n : 1) * sizeof(*route));
    if (!to || !split || !route) {
        PyErr_NoMemory();
        goto out;
    }
    /* to=: the user policy's proposal; else the default one */
    if (b.to.buf)
        memcpy(to, b.to.buf, n * sizeof(*to));
    else if ((rc = dh_rb_propose(s, n, nranks, nsteps, to, &e)) != 0)
        goto fail;
    if ((rc = dh_rb_decide(s, to, n, nranks, nsteps, &g, &d, &e)) != 0)
        goto fail;
    if (d.verdict != DH_RB_MOVE) /* kept: nothing travels */
        for (size_t i = 0; i < n; i++)
            to[i] = s[i].rank;
    if ((rc = dh_rb_plan(s, to, n, nranks, split, route, &e)) != 0)
        goto fail;
    out = result(&d, to, n, split, nranks);
    goto out;
fail:
    dhpy_raise(rc, &e);
out:
    dh__free(s);
    dh__free(to);
    dh__free(split);
    dh__free(route);
    release(&b);
    return out;
}

static PyMethodDef methods[] = {
    {"rebalance", (PyCFunction)(void (*)(void))py_rebalance,
     METH_VARARGS | METH_KEYWORDS,
     "rebalance(tokens, nbytes, ranks, steps, nranks, nsteps, ms_per_token, "
     "bytes_per_ms, latency_ms, margin, to=None) -> dict: Tier-2's verdict "
     "on a round (docs/rebalance.md): verdict, gain_ms, cost_ms, before_ms, "
     "after_ms, ratio_before, ratio_after, moved, moved_bytes, "
     "max_rank_bytes, to (uint32 bytes: each sample's rank after the "
     "verdict), split (uint64 bytes, nranks x nranks: bytes src sends dst). "
     "to=: a policy's own proposal, else greedy min-max"},
    {NULL, NULL, 0, NULL},
};

int dhpy_rebalance_init(PyObject *m)
{
    return PyModule_AddFunctions(m, methods);
}
