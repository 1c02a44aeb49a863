/*
 * coordinator_pools.c - CPU pools: the local DataServers of one host whose
 * workers share the same CPUs, gated together (docs/placement.md "CPU
 * pools", issue 21 item 3).
 *
 * Why: several ranks' DataServers on one machine each run their own
 * workers, and the kernel time-shares the CPUs among all of them.  When the
 * CPUs are short, a rank that is ahead keeps decoding its later steps and
 * slows the sample another rank's next step waits for; the step waits for
 * its slowest rank.  With a pool's tasks in flight capped at its CPUs, the
 * Coordinator's queue (ordered by deadline under the deadline policy)
 * decides what runs next, across the ranks, and a task runs at a full
 * CPU's speed instead of a share of one.
 *
 * The cap follows what the tasks measured (Heartbeat.cpu_fraction): tasks
 * that wait on I/O for half their runnable time get twice as many slots,
 * so a pool never holds CPUs idle that time-sharing would have used.
 *
 * Locking: none (see coordinator_internal.h).
 */
#include <math.h>
#include <string.h>

#include "core/log.h"
#include "runtime/coordinator_internal.h"

/* The most slots a pool gets however little CPU its tasks take. */
#define POOL_CAP_MAX 65536
/* A running task stops counting against its pool after this many times
 * its predicted work (learned ratio included), and at least HOLD_MIN_MS. */
#define HOLD_FACTOR 10.0
#define HOLD_MIN_MS 2000.0

int32_t dh__co_pool_cap(uint32_t cpus, double cpu_fraction)
{
    double cap;

    if (cpus == 0)
        return 0;
    if (!(cpu_fraction > 0) || cpu_fraction >= 1)
        return (int32_t)(cpus > POOL_CAP_MAX ? POOL_CAP_MAX : cpus);
    cap = floor((double)cpus / cpu_fraction + 0.5);
    if (cap < cpus)
        cap = cpus;
    return cap > POOL_CAP_MAX ? POOL_CAP_MAX : (int32_t)cap;
}

static void pool_apply(struct dh_coordinator *c, int32_t id)
{
    struct co_pool *p = &c->pools[id];
    double f = p->known ? p->frac_sum / p->known : 0;
    int32_t cap = p->members ? dh__co_pool_cap(p->cpus, f) : 0;

    /* Workers waiting for arena room hold no CPU: their tasks do not
     * count (or a rank holding its batches would stall the others). */
    if (cap > 0)
        cap += (int32_t)(p->slot_waiting > POOL_CAP_MAX ? POOL_CAP_MAX
                                                        : p->slot_waiting);

    if (cap == p->cap)
        return;
    if (dh_place_pool_cap(c->place, id, cap) < 0)
        return; /* cannot happen: id and cap are in range */
    dh__log(DH_LOG_DEBUG,
            "coordinator: CPU pool %d (%s, %u CPUs, %u servers): %d tasks "
            "at once (CPU share of their time %.2f, %u waiting for arena "
            "room)",
            (int)id, p->host, p->cpus, p->members, (int)cap, f,
            p->slot_waiting);
    p->cap = cap;
}

void dh__co_pool_join(struct dh_coordinator *c, int slot,
                      const struct dh_wire_register_server *r)
{
    int32_t id = -1, free_id = -1;

    c->servers[slot].pool = -1;
    c->servers[slot].cpu_fraction = 0;
    c->servers[slot].slot_waiting = 0;
    c->servers[slot].cpus = r->cpus;
    c->servers[slot].workers = r->workers;
    if (!c->cpu_pools || r->role != DH_WIRE_ROLE_LOCAL || r->cpus == 0 ||
        r->cpu_set == 0)
        return;
    for (int32_t i = 0; i < c->max_servers && id < 0; i++) {
        const struct co_pool *p = &c->pools[i];

        if (!p->members) {
            if (free_id < 0)
                free_id = i;
        } else if (p->cpu_set == r->cpu_set && !strcmp(p->host, r->host)) {
            id = i;
        }
    }
    if (id < 0) {
        if ((id = free_id) < 0)
            return; /* cannot happen: a pool per server at most */
        c->pools[id] = (struct co_pool){.cpus = r->cpus, .cpu_set = r->cpu_set};
        snprintf(c->pools[id].host, sizeof(c->pools[id].host), "%s", r->host);
    }
    if (dh_place_set_pool(c->place, slot, id, NULL) < 0)
        return;
    c->pools[id].members++;
    if (r->cpus < c->pools[id].cpus)
        c->pools[id].cpus = r->cpus;
    c->servers[slot].pool = id;
    pool_apply(c, id);
}

void dh__co_pool_heartbeat(struct dh_coordinator *c, int slot,
                           double cpu_fraction, uint32_t slot_waiting)
{
    struct co_server *s = &c->servers[slot];
    struct co_pool *p;

    if (s->pool < 0)
        return;
    p = &c->pools[s->pool];
    /* A server's waiting workers are at most its workers. */
    if (slot_waiting > s->workers)
        slot_waiting = s->workers;
    p->slot_waiting += slot_waiting - s->slot_waiting;
    s->slot_waiting = slot_waiting;
    if (cpu_fraction > 0) {
        if (s->cpu_fraction > 0)
            p->frac_sum -= s->cpu_fraction;
        else
            p->known++;
        p->frac_sum += cpu_fraction;
        s->cpu_fraction = cpu_fraction;
    }
    pool_apply(c, s->pool);
}

void dh__co_pool_leave(struct dh_coordinator *c, int slot)
{
    struct co_server *s = &c->servers[slot];
    struct co_pool *p;

    if (s->pool < 0)
        return;
    p = &c->pools[s->pool];
    if (s->cpu_fraction > 0) {
        p->frac_sum -= s->cpu_fraction;
        p->known--;
    }
    p->slot_waiting -= s->slot_waiting;
    p->members--;
    s->pool = -1;
    if (p->members) { /* the fewest CPUs of those left */
        p->cpus = UINT32_MAX;
        for (int i = 0; i < c->max_servers; i++)
            if (c->servers[i].used && i != slot &&
                c->servers[i].pool == (int32_t)(p - c->pools) &&
                c->servers[i].cpus < p->cpus)
                p->cpus = c->servers[i].cpus;
    }
    pool_apply(c, (int32_t)(p - c->pools));
    s->cpu_fraction = 0;
    s->slot_waiting = 0;
}

void dh__co_pool_unrelease(struct dh_coordinator *c, struct co_task *t)
{
    if (!t->pool_released)
        return;
    t->pool_released = 0;
    if (dh_place_pool_rehold(c->place, t->server) < 0)
        dh__log(DH_LOG_ERROR, "coordinator: CPU pool of slot %d lost a task",
                (int)t->server); /* cannot happen: it holds that task */
}

void dh__co_pool_tick(struct dh_coordinator *c, uint64_t now)
{
    struct co_task **pt;
    struct dh_place_server_info si;
    size_t pos = 0;
    int any = 0;

    if (!c->cpu_pools || now < c->next_pool_tick_ms)
        return;
    c->next_pool_tick_ms = now + 1000;
    while ((pt = dh__idmap_next(&c->tasks, &pos, NULL))) {
        struct co_task *t = *pt;
        const struct co_server *s;
        double bound;

        if (t->state != CO_RUNNING || t->pool_released || t->server < 0)
            continue;
        s = &c->servers[t->server];
        if (!s->used || s->gen != t->server_gen || s->pool < 0 ||
            dh_place_server_info(c->place, t->server, &si) < 0)
            continue;
        bound = HOLD_FACTOR * t->work_ms * si.ratio;
        if (bound < HOLD_MIN_MS)
            bound = HOLD_MIN_MS;
        if ((double)(now - t->since_ms) <= bound ||
            dh_place_pool_release(c->place, t->server) < 0)
            continue;
        t->pool_released = 1;
        any = 1;
        dh__log(DH_LOG_INFO,
                "coordinator: task %llu of rank %u has run %llu ms on server "
                "%u (predicted %.0f ms): its CPU pool no longer counts it",
                (unsigned long long)t->req.task.id, t->req.requester_rank,
                (unsigned long long)(now - t->since_ms), s->wire_id,
                t->work_ms * si.ratio);
    }
    if (any)
        dh__co_drain(c, now); /* a slot freed */
}
