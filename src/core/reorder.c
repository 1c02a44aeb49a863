/*
 * reorder.c - the client's reorder buffer (datahelix/reorder.h, DESIGN.md 8
 * "Ordering", docs/exactly-once.md).
 *
 * Design notes
 * - `ring` holds the window in request order: slot (head + k) % depth is
 *   the k-th oldest outstanding task.  A slot's state is PENDING until the
 *   first outcome (ARRIVED with a payload, or FAILED with a code).
 * - `index` maps task id -> ring slot: a power-of-two array (>= 2 * depth)
 *   of slot numbers + 1 (0 = empty), linear probing from dh__mix64(id), deletion
 *   by backward shift (no tombstones).  The key of an index entry is read
 *   from its ring slot.
 * Locking: none; the owner serializes calls (see reorder.h).
 */
#include "datahelix/reorder.h"
#include "core/alloc.h"
#include "core/hash.h"

enum state { PENDING, ARRIVED, FAILED };

struct slot {
    uint64_t id;
    uint64_t payload;
    int code;
    enum state state;
};

struct dh_reorder {
    struct slot *ring;
    uint32_t *index;
    size_t depth, head, count;
    size_t mask; /* index size - 1 */
};

static size_t home(const struct dh_reorder *r, uint64_t id)
{
    return (size_t)dh__mix64(id) & r->mask;
}

/* Index position of `id`, or of the empty entry ending its run. */
static size_t probe(const struct dh_reorder *r, uint64_t id)
{
    size_t i = home(r, id);

    while (r->index[i] && r->ring[r->index[i] - 1].id != id)
        i = (i + 1) & r->mask;
    return i;
}

static struct slot *find(const struct dh_reorder *r, uint64_t id)
{
    size_t i = probe(r, id);

    return r->index[i] ? &r->ring[r->index[i] - 1] : NULL;
}

/* Removes index entry i and shifts back the run after it. */
static void unindex(struct dh_reorder *r, size_t i)
{
    size_t j = i;

    for (;;) {
        j = (j + 1) & r->mask;
        if (!r->index[j])
            break;
        size_t k = home(r, r->ring[r->index[j] - 1].id);
        /* Entry j may stay if its home k lies cyclically in (i, j]. */
        if (i <= j ? (i < k && k <= j) : (i < k || k <= j))
            continue;
        r->index[i] = r->index[j];
        i = j;
    }
    r->index[i] = 0;
}

int dh_reorder_create(size_t depth, struct dh_reorder **out, struct dh_err *e)
{
    struct dh_reorder *r;
    size_t size = 2;

    if (!out || depth == 0)
        return dh_err_set(e, DH_EINVAL, "reorder: depth must be >= 1");
    if (depth > DH_REORDER_MAX_DEPTH)
        return dh_err_set(e, DH_ETOOBIG, "reorder: depth %zu over %u", depth,
                          DH_REORDER_MAX_DEPTH);
    while (size < 2 * depth)
        size *= 2;
    r = dh__calloc(1, sizeof(*r));
    if (!r)
        goto out_nomem;
    r->ring = dh__calloc(depth, sizeof(*r->ring));
    if (!r->ring)
        goto out_free_buffer;
    r->index = dh__calloc(size, sizeof(*r->index));
    if (!r->index)
        goto out_free_ring;
    r->depth = depth;
    r->mask = size - 1;
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
    dh__free(r->index);
    dh__free(r->ring);
    dh__free(r);
}

int dh_reorder_expect(struct dh_reorder *r, uint64_t task_id)
{
    size_t i, s;

    if (!r)
        return DH_EINVAL;
    i = probe(r, task_id);
    if (r->index[i])
        return DH_EDUP;
    if (r->count >= r->depth)
        return DH_ETOOBIG;
    s = (r->head + r->count) % r->depth;
    r->ring[s] = (struct slot){.id = task_id, .state = PENDING};
    r->index[i] = (uint32_t)(s + 1);
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
    unindex(r, probe(r, s->id));
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
