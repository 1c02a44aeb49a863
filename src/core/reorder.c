/*
 * reorder.c - the client's reorder buffer (datahelix/reorder.h, DESIGN.md 8
 * "Ordering", docs/exactly-once.md).
 *
 * Design notes
 * - `ring` holds the window in request order: slot (head + k) % depth is
 *   the k-th oldest outstanding task.  A slot's state is PENDING until the
 *   first outcome (ARRIVED with a payload, or FAILED with a code).
 * - `index` maps task id -> ring slot (core/idmap.h), reserved for `depth`
 *   ids at create so that no later call allocates.
 * Locking: none; the owner serializes calls (see reorder.h).
 */
#include "datahelix/reorder.h"
#include "core/alloc.h"
#include "core/idmap.h"

enum state { PENDING, ARRIVED, FAILED };

struct slot {
    uint64_t id;
    uint64_t payload;
    int code;
    enum state state;
};

struct dh_reorder {
    struct slot *ring;
    struct dh_idmap index; /* task id -> uint32_t ring slot */
    size_t depth, head, count;
};

static struct slot *find(const struct dh_reorder *r, uint64_t id)
{
    const uint32_t *s = dh__idmap_get(&r->index, id);

    return s ? &r->ring[*s] : NULL;
}

int dh_reorder_create(size_t depth, struct dh_reorder **out, struct dh_err *e)
{
    struct dh_reorder *r;

    if (!out || depth == 0)
        return dh_err_set(e, DH_EINVAL, "reorder: depth must be >= 1");
    if (depth > DH_REORDER_MAX_DEPTH)
        return dh_err_set(e, DH_ETOOBIG, "reorder: depth %zu over %u", depth,
                          DH_REORDER_MAX_DEPTH);
    r = dh__calloc(1, sizeof(*r));
    if (!r)
        goto out_nomem;
    r->ring = dh__calloc(depth, sizeof(*r->ring));
    if (!r->ring)
        goto out_free_buffer;
    if (dh__idmap_init(&r->index, sizeof(uint32_t), depth, depth) < 0)
        goto out_free_ring;
    r->depth = depth;
    *out = r;
    return 0;

out_free_ring:
    dh__free(r->ring);
out_free_buffer:
    dh__free(r);
out_nomem:
    return dh_err_set(e, DH_ENOMEM, "reorder: no memory for depth %zu", depth);
}

void dh_reorder_destroy(struct dh_reorder *r)
{
    if (!r)
        return;
    dh__idmap_fini(&r->index);
    dh__free(r->ring);
    dh__free(r);
}

int dh_reorder_expect(struct dh_reorder *r, uint64_t task_id)
{
    size_t s;
    void *v;
    int rc;

    if (!r)
        return DH_EINVAL;
    /* The index holds exactly the window, limited to depth: DH_EDUP for
     * an outstanding id, DH_ETOOBIG for a full window. */
    if ((rc = dh__idmap_put(&r->index, task_id, &v)) < 0)
        return rc;
    s = (r->head + r->count) % r->depth;
    r->ring[s] = (struct slot){.id = task_id, .state = PENDING};
    *(uint32_t *)v = (uint32_t)s;
    r->count++;
    return 0;
}

int dh_reorder_arrive(struct dh_reorder *r, uint64_t task_id, uint64_t payload,
                      int *accepted)
{
    struct slot *s;

    if (!r || !accepted)
        return DH_EINVAL;
    s = find(r, task_id);
    if (!s || s->state != PENDING) {
        *accepted = 0;
        return 0;
    }
    s->payload = payload;
    s->state = ARRIVED;
    *accepted = 1;
    return 0;
}

int dh_reorder_fail(struct dh_reorder *r, uint64_t task_id, int code)
{
    struct slot *s;

    if (!r || code >= 0 || code == DH_EEMPTY)
        return DH_EINVAL;
    s = find(r, task_id);
    if (!s)
        return DH_ENOTFOUND;
    if (s->state != PENDING)
        return DH_EDUP;
    s->code = code;
    s->state = FAILED;
    return 0;
}

int dh_reorder_next(struct dh_reorder *r, uint64_t *task_id, uint64_t *payload)
{
    struct slot *s;

    if (!r || !task_id || !payload)
        return DH_EINVAL;
    if (r->count == 0 || r->ring[r->head].state == PENDING)
        return DH_EEMPTY;
    s = &r->ring[r->head];
    (void)dh__idmap_del(&r->index, s->id);
    r->head = (r->head + 1) % r->depth;
    r->count--;
    *task_id = s->id;
    if (s->state == FAILED)
        return s->code;
    *payload = s->payload;
    return 0;
}

int dh_reorder_pending(const struct dh_reorder *r, uint64_t *out, size_t cap,
                       size_t *n)
{
    size_t got = 0;

    if (!r || !n || (cap && !out))
        return DH_EINVAL;
    for (size_t k = 0; k < r->count; k++)
        got += r->ring[(r->head + k) % r->depth].state == PENDING;
    if (got > cap)
        return DH_ETOOBIG;
    got = 0;
    for (size_t k = 0; k < r->count; k++) {
        const struct slot *s = &r->ring[(r->head + k) % r->depth];

        if (s->state == PENDING)
            out[got++] = s->id;
    }
    *n = got;
    return 0;
}

size_t dh_reorder_count(const struct dh_reorder *r)
{
    return r ? r->count : 0;
}

size_t dh_reorder_depth(const struct dh_reorder *r)
{
    return r ? r->depth : 0;
}
