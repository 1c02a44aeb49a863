/*
 * inflight.c - the Coordinator's in-flight table (datahelix/inflight.h,
 * DESIGN.md 8, docs/exactly-once.md).
 *
 * Design notes
 * - One flat array of `size` = power of two >= 2 * capacity entries; linear
 *   probing from dh__mix64(id).  Task ids pack (epoch, step, rank, microbatch)
 *   into bit fields, so the low bits alone would cluster: the splitmix64
 *   finalizer spreads them.
 * - Deletion shifts the following run back (Knuth 6.4 algorithm R) instead
 *   of leaving tombstones, so probe lengths stay those of a table that
 *   never deleted, however long the Coordinator runs.
 * - Since load <= 1/2 there is always an empty entry: every probe ends.
 * Locking: none; one owner serializes calls (see inflight.h).
 */
#include "datahelix/inflight.h"
#include "core/alloc.h"
#include "core/hash.h"

struct entry {
    uint64_t id;
    uint64_t since_ms;
    uint32_t server;
    uint32_t routes;
    unsigned char used;
    unsigned char orphaned;
};

struct dh_inflight {
    struct entry *e;
    size_t mask;     /* size - 1 */
    size_t capacity; /* most tasks held */
    size_t count;
};

/* Index of `id`'s entry, or of the empty entry ending its probe run. */
static size_t probe(const struct dh_inflight *t, uint64_t id)
{
    size_t i = (size_t)dh__mix64(id) & t->mask;

    while (t->e[i].used && t->e[i].id != id)
        i = (i + 1) & t->mask;
    return i;
}

static struct entry *find(const struct dh_inflight *t, uint64_t id)
{
    struct entry *en = &t->e[probe(t, id)];

    return en->used ? en : NULL;
}

/* Removes entry i and shifts back the run after it. */
static void erase(struct dh_inflight *t, size_t i)
{
    size_t j = i;

    for (;;) {
        j = (j + 1) & t->mask;
        if (!t->e[j].used)
            break;
        size_t k = (size_t)dh__mix64(t->e[j].id) & t->mask;
        /* Entry j may stay if its home k lies cyclically in (i, j]. */
        if (i <= j ? (i < k && k <= j) : (i < k || k <= j))
            continue;
        t->e[i] = t->e[j];
        i = j;
    }
    t->e[i] = (struct entry){0};
    t->count--;
}

int dh_inflight_create(size_t capacity, struct dh_inflight **out,
                       struct dh_err *e)
{
    struct dh_inflight *t;
    size_t size = 2;

    if (!out || capacity == 0)
        return dh_err_set(e, DH_EINVAL, "inflight: capacity must be >= 1");
    if (capacity > DH_INFLIGHT_MAX_CAPACITY)
        return dh_err_set(e, DH_ETOOBIG, "inflight: capacity %zu over %u",
                          capacity, DH_INFLIGHT_MAX_CAPACITY);
    while (size < 2 * capacity)
        size *= 2;
    t = dh__calloc(1, sizeof(*t));
    if (!t)
        goto out_nomem;
    t->e = dh__calloc(size, sizeof(*t->e));
    if (!t->e)
        goto out_free_table;
    t->mask = size - 1;
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
    dh__free(t->e);
    dh__free(t);
}

int dh_inflight_add(struct dh_inflight *t, uint64_t task_id, uint32_t server,
                    uint64_t now_ms, struct dh_err *e)
{
    struct entry *en;

    if (!t)
        return dh_err_set(e, DH_EINVAL, "inflight: NULL table");
    en = &t->e[probe(t, task_id)];
    if (en->used)
        return dh_err_set(e, DH_EDUP,
                          "inflight: task %016llx already in flight on "
                          "server %u",
                          (unsigned long long)task_id, en->server);
    if (t->count >= t->capacity)
        return dh_err_set(e, DH_ETOOBIG,
                          "inflight: table full (%zu tasks), task %016llx",
                          t->capacity, (unsigned long long)task_id);
    en->id = task_id;
    en->since_ms = now_ms;
    en->server = server;
    en->routes = 1;
    en->orphaned = 0;
    en->used = 1;
    t->count++;
    return 0;
}

int dh_inflight_done(struct dh_inflight *t, uint64_t task_id, uint32_t server,
                     int *first)
{
    size_t i;

    /* Any server's completion counts if it is the first (DESIGN 8). */
    (void)server;
    if (!t || !first)
        return DH_EINVAL;
    i = probe(t, task_id);
    *first = t->e[i].used;
    if (t->e[i].used)
        erase(t, i);
    return 0;
}

int dh_inflight_server_dead(struct dh_inflight *t, uint32_t server,
                            uint64_t *out_tasks, size_t cap, size_t *n)
{
    size_t got = 0;

    if (!t || !n || (cap && !out_tasks))
        return DH_EINVAL;
    for (size_t i = 0; i <= t->mask && got < cap; i++) {
        struct entry *en = &t->e[i];

        if (!en->used || en->orphaned || en->server != server)
            continue;
        en->orphaned = 1;
        out_tasks[got++] = en->id;
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
    en = find(t, task_id);
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
    size_t got = 0;

    if (!t || !n || (cap && !out))
        return DH_EINVAL;
    for (size_t i = 0; i <= t->mask && got < cap; i++) {
        const struct entry *en = &t->e[i];

        if (!en->used || en->orphaned || now_ms < en->since_ms)
            continue;
        if (now_ms - en->since_ms >= timeout_ms)
            out[got++] = en->id;
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
    en = find(t, task_id);
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
    return t ? t->count : 0;
}
