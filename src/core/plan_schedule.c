/*
 * plan_schedule.c - one rank's share of a plan, flattened (plan.h): what
 * the Python loaders, `consume` and any C user hand to
 * dh_client_start_epoch().  A subset is planned by position (0..n-1 over
 * its own columns) and mapped back to its ids, so that re-planning the
 * rest of an epoch uses the same planner as a whole epoch.
 * Locking: none (caller-owned memory only).
 */
#include <string.h>

#include "core/alloc.h"
#include "datahelix/plan.h"

/* The subset's own columns (positions 0..n_subset-1). */
static int subset_columns(const uint32_t *tokens, const uint16_t *profile,
                          uint64_t n, const uint64_t *subset, uint64_t n_subset,
                          uint32_t **stok, uint16_t **sprof, struct dh_err *e)
{
    for (uint64_t i = 0; i < n_subset; i++)
        if (subset[i] >= n)
            return dh_err_set(e, DH_EINVAL,
                              "subset id %llu is not in the "
                              "index (%llu samples)",
                              (unsigned long long)subset[i],
                              (unsigned long long)n);
    *stok = dh__malloc((n_subset + 1) * sizeof(**stok));
    *sprof = dh__malloc((n_subset + 1) * sizeof(**sprof));
    if (!*stok || !*sprof)
        return dh_err_set(e, DH_ENOMEM, "out of memory");
    for (uint64_t i = 0; i < n_subset; i++) {
        (*stok)[i] = tokens[subset[i]];
        (*sprof)[i] = profile[subset[i]];
    }
    return 0;
}

static int flatten(const struct dh_plan *p, uint32_t rank, uint64_t steps,
                   const uint64_t *subset, struct dh_plan_schedule *s,
                   struct dh_err *e)
{
    uint64_t total = 0, at = 0;

    for (uint64_t k = 0; k < steps; k++) {
        uint64_t cnt = 0;

        dh_plan_rank_ids(p, k, rank, &cnt);
        total += cnt;
    }
    s->ids = dh__malloc((total + 1) * sizeof(*s->ids));
    s->offs = dh__malloc((steps + 1) * sizeof(*s->offs));
    if (!s->ids || !s->offs)
        return dh_err_set(e, DH_ENOMEM, "out of memory");
    for (uint64_t k = 0; k < steps; k++) {
        uint64_t cnt = 0;
        const uint64_t *r = dh_plan_rank_ids(p, k, rank, &cnt);

        s->offs[k] = at;
        for (uint64_t i = 0; i < cnt; i++)
            s->ids[at + i] = subset ? subset[r[i]] : r[i];
        at += cnt;
    }
    s->offs[steps] = at;
    s->n_steps = steps;
    s->n_ids = total;
    return 0;
}

int dh_plan_schedule(const uint32_t *tokens, const uint16_t *profile,
                     uint64_t n, const uint64_t *subset, uint64_t n_subset,
                     const struct dh_plan_opts *o, uint32_t rank,
                     uint64_t max_steps, struct dh_plan_schedule *out,
                     struct dh_err *e)
{
    struct dh_plan_schedule s = {0};
    struct dh_plan *p = NULL;
    uint32_t *stok = NULL;
    uint16_t *sprof = NULL;
    uint64_t steps;
    int rc;

    if (!o || !out || rank >= o->world_size) {
        rc = dh_err_set(e, DH_EINVAL, "rank %u of world size %u", rank,
                        o ? o->world_size : 0);
        goto cleanup;
    }
    if (subset && (rc = subset_columns(tokens, profile, n, subset, n_subset,
                                       &stok, &sprof, e)) < 0)
        goto cleanup;
    rc = subset ? dh_plan_create(stok, sprof, n_subset, o, &p, e)
                : dh_plan_create(tokens, profile, n, o, &p, e);
    if (rc < 0)
        goto cleanup;
    steps = dh_plan_steps(p);
    if (max_steps > 0 && max_steps < steps)
        steps = max_steps;
    if ((rc = flatten(p, rank, steps, subset, &s, e)) < 0)
        goto cleanup;
    *out = s;
    s = (struct dh_plan_schedule){0};
cleanup:
    dh_plan_schedule_free(&s);
    dh_plan_destroy(p);
    dh__free(stok);
    dh__free(sprof);
    return rc;
}

void dh_plan_schedule_free(struct dh_plan_schedule *s)
{
    if (!s)
        return;
    dh__free(s->ids);
    dh__free(s->offs);
    *s = (struct dh_plan_schedule){0};
}
