/*
 * inflight.c - the Coordinator's in-flight table (datahelix/inflight.h,
 * DESIGN.md 8, docs/exactly-once.md).
 *
 * Design notes
 * - One core/idmap from task id to its entry, reserved for `capacity` ids
 *   at create: the map's limit is the table's bound, and no later call
 *   allocates.  The map's open addressing with backward-shift deletion
 *   keeps probe lengths those of a table that never deleted, however
 *   long the Coordinator runs.
 * - server_dead and overdue walk the map in its slot order.
 * Locking: none; one owner serializes calls (see inflight.h).
 */
#include "datahelix/inflight.h"
#include "core/alloc.h"
#include "core/idmap.h"

struct entry {
    uint64_t since_ms;
    uint32_t server;
    uint32_t routes;
    unsigned char orphaned;
};

struct dh_inflight {
    struct dh_idmap map; /* task id -> struct entry */
    size_t capacity;     /* most tasks held: the map's limit */
};

int dh_inflight_create(size_t capacity, struct dh_inflight **out,
                       struct dh_err *e)
{
    struct dh_inflight *t;

    if (!out || capacity == 0)
        return dh_err_set(e, DH_EINVAL, "inflight: capacity must be >= 1");
    if (capacity > DH_INFLIGHT_MAX_CAPACITY)
        return dh_err_set(e, DH_ETOOBIG, "inflight: capacity %zu over %u",
                          capacity, DH_INFLIGHT_MAX_CAPACITY);
    t = dh__calloc(1, sizeof(*t));
    if (!t)
        goto out_nomem;
    if (dh__idmap_init(&t->map, sizeof(struct entry), capacity, capacity) < 0)
        goto out_free_table;
    t->capacity = capacity;
    *out = t;
    return 0;

out_free_table:
    dh__free(t);
out_nomem:
    return dh_err_set(e, DH_ENOMEM, "inflight: no memory for %zu tasks",
                      capacity);
}

void dh_inflight_destroy(struct dh_inflight *t)
{
    if (!t)
        return;
    dh__idmap_fini(&t->map);
    dh__free(t);
}

int dh_inflight_add(struct dh_inflight *t, uint64_t task_id, uint32_t server,
                    uint64_t now_ms, struct dh_err *e)
{
    struct entry *en;
    void *v;
    int rc;

    if (!t)
        return dh_err_set(e, DH_EINVAL, "inflight: NULL table");
    if ((en = dh__idmap_get(&t->map, task_id)))
        return dh_err_set(e, DH_EDUP,
                          "inflight: task %016llx already in flight on "
                          "server %u",
                          (unsigned long long)task_id, en->server);
    /* The map was reserved at its limit: full is the only way to fail. */
    if ((rc = dh__idmap_put(&t->map, task_id, &v)) < 0)
        return dh_err_set(e, rc,
                          "inflight: table full (%zu tasks), task %016llx",
                          t->capacity, (unsigned long long)task_id);
    en = v;
    en->since_ms = now_ms;
    en->server = server;
    en->routes = 1;
    return 0;
}

int dh_inflight_done(struct dh_inflight *t, uint64_t task_id, uint32_t server,
                     int *first)
{
    /* Any server's completion counts if it is the first (DESIGN 8). */
    (void)server;
    if (!t || !first)
        return DH_EINVAL;
    *first = dh__idmap_del(&t->map, task_id) == 0;
    return 0;
}

int dh_inflight_server_dead(struct dh_inflight *t, uint32_t server,
                            uint64_t *out_tasks, size_t cap, size_t *n)
{
    size_t got = 0, pos = 0;
    struct entry *en;
    uint64_t id;

    if (!t || !n || (cap && !out_tasks))
        return DH_EINVAL;
    while (got < cap && (en = dh__idmap_next(&t->map, &pos, &id))) {
        if (en->orphaned || en->server != server)
            continue;
        en->orphaned = 1;
        out_tasks[got++] = id;
    }
    *n = got;
    return 0;
}

int dh_inflight_reroute(struct dh_inflight *t, uint64_t task_id,
                        uint32_t new_server, uint64_t now_ms)
{
    struct entry *en;

    if (!t)
        return DH_EINVAL;
    en = dh__idmap_get(&t->map, task_id);
    if (!en)
        return DH_ENOTFOUND;
    en->server = new_server;
    en->since_ms = now_ms;
    en->orphaned = 0;
    if (en->routes < UINT32_MAX)
        en->routes++;
    return 0;
}

int dh_inflight_overdue(const struct dh_inflight *t, uint64_t now_ms,
                        uint64_t timeout_ms, uint64_t *out, size_t cap,
                        size_t *n)
{
    size_t got = 0, pos = 0;
    const struct entry *en;
    uint64_t id;

    if (!t || !n || (cap && !out))
        return DH_EINVAL;
    while (got < cap && (en = dh__idmap_next(&t->map, &pos, &id))) {
        if (en->orphaned || now_ms < en->since_ms)
            continue;
        if (now_ms - en->since_ms >= timeout_ms)
            out[got++] = id;
    }
    *n = got;
    return 0;
}

int dh_inflight_get(const struct dh_inflight *t, uint64_t task_id,
                    struct dh_inflight_info *out)
{
    const struct entry *en;

    if (!t || !out)
        return DH_EINVAL;
    en = dh__idmap_get(&t->map, task_id);
    if (!en)
        return DH_ENOTFOUND;
    out->server = en->server;
    out->orphaned = en->orphaned;
    out->since_ms = en->since_ms;
    out->routes = en->routes;
    return 0;
}

size_t dh_inflight_count(const struct dh_inflight *t)
{
    return t ? dh__idmap_count(&t->map) : 0;
}
