/*
 * place.c - the placement table and its decisions (paper Sec. 3.3, Eq. 1;
 * DESIGN.md 3 "Placement rule").
 *
 * Design notes
 * - Servers live in an array indexed by their caller-chosen id; a local
 *   server also owns a column of the link table (server -> local target).
 * - Remote servers sit in binary min-heaps, one per delivery target (each
 *   local server, plus one for requests without one), keyed by Eq. 1 for a
 *   reference request: r_i * (work in flight / workers + key_cpu_ms) +
 *   key_bytes / bw(i -> target) + latency.  C_net dominates T for large
 *   payloads, so a single target-blind order loses much quality (measured
 *   in bench_place).  Least-request keeps one heap keyed by tasks in
 *   flight.  A server at its queue cap has key +inf and sinks.  A feedback
 *   call re-keys one server in O(L log n), L = active heaps; a link sample
 *   in O(log n) (place_feedback.c).
 * - A decision scores the requester's local server, the k_best smallest
 *   keys of its target's heap (read off the heap with a k-entry frontier, never popping) and
 *   k_random remotes sampled uniformly (link diversity: the key knows
 *   nothing of the requester's links).  full_scan scores everyone.
 * - Scoring is streamed through `struct acc`: best by (miss, T), best by T
 *   among remotes, the local terms, and the telemetry top list.  Nothing is
 *   allocated after dh_place_create().
 * Locking: none; one owner serializes calls (see place.h).
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/place_internal.h"

#define TIE_EPS 1e-9

const char *dh_place_reason_name(enum dh_place_reason r)
{
    switch (r) {
    case DH_PLACE_REASON_LOCAL_MEETS:
        return "local_meets";
    case DH_PLACE_REASON_REMOTE_GAIN:
        return "remote_gain";
    case DH_PLACE_REASON_LEAST_MISS:
        return "least_miss";
    case DH_PLACE_REASON_EARLIEST_FINISH:
        return "earliest_finish";
    case DH_PLACE_REASON_BACKPRESSURE:
        return "backpressure";
    case DH_PLACE_REASON_ROUND_ROBIN:
        return "round_robin";
    case DH_PLACE_REASON_LEAST_REQUEST:
        return "least_request";
    }
    return "unknown";
}

static const char *const policy_names[] = {"round-robin", "least-request",
                                           "deadline"};

const char *dh_place_policy_name(enum dh_place_policy p)
{
    if ((unsigned)p < sizeof(policy_names) / sizeof(policy_names[0]))
        return policy_names[p];
    return "unknown";
}

int dh_place_policy_parse(const char *s, enum dh_place_policy *out,
                          struct dh_err *e)
{
    for (unsigned i = 0; s && i < 3; i++) {
        if (strcmp(s, policy_names[i]) == 0) {
            *out = (enum dh_place_policy)i;
            return 0;
        }
    }
    return dh_err_set(e, DH_EINVAL,
                      "placement policy '%s': expected round-robin, "
                      "least-request or deadline",
                      s ? s : "(null)");
}

void dh_place_opts_default(struct dh_place_opts *o)
{
    memset(o, 0, sizeof(*o));
    o->policy = DH_PLACE_POLICY_DEADLINE;
    o->remote_gain_ms = 5.0;
    o->ratio_alpha = 0.3;
    o->link_alpha = 0.3;
    o->default_bw_mbps = 1000.0;
    o->default_latency_ms = 0.2;
    o->small_xfer_bytes = 65536.0;
    o->key_cpu_ms = 20.0;
    o->key_bytes = 32e6;
    o->k_best = 8;
    o->k_random = 2;
    o->max_local = 64;
    o->seed = 1;
}

/* ---- the heaps of remotes ---- */

static void heap_swap(struct dh__place_heap *h, int32_t i, int32_t j)
{
    int32_t a = h->heap[i], b = h->heap[j];

    h->heap[i] = b;
    h->heap[j] = a;
    h->pos[b] = i;
    h->pos[a] = j;
}

static void sift_up(struct dh__place_heap *h, int32_t i)
{
    while (i > 0) {
        int32_t up = (i - 1) / 2;
        if (!(h->key[h->heap[i]] < h->key[h->heap[up]]))
            break;
        heap_swap(h, i, up);
        i = up;
    }
}

static void sift_down(struct dh__place_heap *h, int32_t n, int32_t i)
{
    for (;;) {
        int32_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && h->key[h->heap[l]] < h->key[h->heap[m]])
            m = l;
        if (r < n && h->key[h->heap[r]] < h->key[h->heap[m]])
            m = r;
        if (m == i)
            return;
        heap_swap(h, i, m);
        i = m;
    }
}

int dh__place_at_cap(const struct dh_place *p, const struct dh__place_srv *s)
{
    const struct dh__place_pool *pl = s->pool >= 0 ? &p->pools[s->pool] : NULL;

    /* In a pool, a server takes no more than its workers can start: a
     * task queued behind its own would hold a slot another could use. */
    return (s->queue_cap > 0 && s->tasks + s->ext_tasks >= s->queue_cap) ||
           (pl && pl->cap > 0 &&
            (pl->tasks >= pl->cap || s->tasks >= s->workers));
}

/* C_net of `bytes` from server `id` to the local server owning column
 * `lslot`: measured EWMAs, or the defaults before any sample. */
static double link_ms(const struct dh_place *p, int32_t id, int32_t lslot,
                      double bytes)
{
    const struct dh__place_link *l =
        &p->links[(size_t)id * p->o.max_local + lslot];
    double bw = l->bw > 0 ? l->bw : p->o.default_bw_mbps * 1e3; /* B/ms */
    double lat = l->lat_ms >= 0 ? l->lat_ms : p->o.default_latency_ms;

    return bytes / bw + lat;
}

/* Heap `hi`'s key for server `id`: Eq. 1 for the reference request
 * (key_cpu_ms, key_bytes) delivered to that heap's target. */
static double key_of(const struct dh_place *p, int32_t hi, int32_t id)
{
    const struct dh__place_srv *s = &p->srv[id];
    double k;

    if (dh__place_at_cap(p, s))
        return INFINITY;
    if (p->o.policy != DH_PLACE_POLICY_DEADLINE)
        return (double)(s->tasks + s->ext_tasks);
    k = s->ratio *
        ((s->inflight_ms + s->ext_ms) / s->workers + p->o.key_cpu_ms);
    if (hi < p->o.max_local)
        k += link_ms(p, id, hi, p->o.key_bytes);
    return k;
}

static void heap_rekey(struct dh_place *p, int32_t hi, int32_t id)
{
    struct dh__place_heap *h = &p->heaps[hi];
    int32_t i;
    double old;

    if (!h->active || (i = h->pos[id]) < 0)
        return;
    old = h->key[id];
    h->key[id] = key_of(p, hi, id);
    if (h->key[id] < old)
        sift_up(h, i);
    else
        sift_down(h, p->nremote, i);
}

void dh__place_rekey(struct dh_place *p, int32_t id)
{
    if (p->rpos[id] < 0)
        return;
    for (int32_t hi = 0; hi <= p->o.max_local; hi++)
        heap_rekey(p, hi, id);
}

void dh__place_rekey_link(struct dh_place *p, int32_t id, int32_t to)
{
    if (p->rpos[id] >= 0 && p->srv[to].lslot >= 0)
        heap_rekey(p, p->srv[to].lslot, id);
}

/* Fills heap `hi` with every remote and heapifies it (Floyd, O(n)). */
static void heap_build(struct dh_place *p, int32_t hi)
{
    struct dh__place_heap *h = &p->heaps[hi];

    h->active = 1;
    for (int32_t i = 0; i < p->nremote; i++) {
        int32_t id = p->remotes[i];
        h->heap[i] = id;
        h->pos[id] = i;
        h->key[id] = key_of(p, hi, id);
    }
    for (int32_t i = p->nremote / 2 - 1; i >= 0; i--)
        sift_down(h, p->nremote, i);
}

static void heap_push(struct dh_place *p, int32_t hi, int32_t id)
{
    struct dh__place_heap *h = &p->heaps[hi];
    int32_t n = p->nremote - 1; /* the caller has counted it already */

    h->heap[n] = id;
    h->pos[id] = n;
    h->key[id] = key_of(p, hi, id);
    sift_up(h, n);
}

/* Removes `id`; nremote still counts it. */
static void heap_drop(struct dh_place *p, int32_t hi, int32_t id)
{
    struct dh__place_heap *h = &p->heaps[hi];
    int32_t i = h->pos[id], last = p->nremote - 1;

    heap_swap(h, i, last);
    h->pos[id] = -1;
    if (i < last) {
        sift_up(h, i);
        sift_down(h, last, i);
    }
}

/* ---- create / destroy / servers ---- */

static int check_opts(const struct dh_place_opts *o, struct dh_err *e)
{
    if (!(o->remote_gain_ms >= 0) || !(o->ratio_alpha > 0) ||
        !(o->ratio_alpha <= 1) || !(o->link_alpha > 0) ||
        !(o->link_alpha <= 1) || !(o->default_bw_mbps > 0) ||
        !(o->default_latency_ms >= 0) || !(o->key_cpu_ms >= 0) ||
        !(o->key_bytes >= 0) || !isfinite(o->key_bytes) ||
        !isfinite(o->remote_gain_ms) || !isfinite(o->key_cpu_ms))
        return dh_err_set(e, DH_EINVAL, "placement options out of range");
    if (o->k_best < 1 || o->k_best > DH_PLACE_K_MAX || o->k_random < 0 ||
        o->k_random > DH_PLACE_K_MAX || o->max_local < 1 ||
        o->max_local > 65536 || (unsigned)o->policy > 2)
        return dh_err_set(e, DH_EINVAL,
                          "placement options: k_best 1..%d, k_random 0..%d, "
                          "max_local 1..65536, known policy",
                          DH_PLACE_K_MAX, DH_PLACE_K_MAX);
    return 0;
}

/* Heap memory: max_local + 1 heaps for the deadline policy (one per
 * delivery target + one without), a single one otherwise. */
static int alloc_heaps(struct dh_place *p)
{
    size_t n = (size_t)p->max_servers, nl = (size_t)p->o.max_local;
    size_t nh = p->o.policy == DH_PLACE_POLICY_DEADLINE ? nl + 1 : 1;

    p->heaps = dh__calloc(nl + 1, sizeof(*p->heaps));
    p->heap_mem = dh__malloc(nh * n * sizeof(int32_t));
    p->hpos_mem = dh__malloc(nh * n * sizeof(int32_t));
    p->key_mem = dh__malloc(nh * n * sizeof(double));
    if (!p->heaps || !p->heap_mem || !p->hpos_mem || !p->key_mem)
        return DH_ENOMEM;
    for (size_t i = 0; i < nh * n; i++)
        p->hpos_mem[i] = -1;
    for (size_t k = 0; k < nh; k++) {
        struct dh__place_heap *h = &p->heaps[nh == 1 ? nl : k];
        h->heap = p->heap_mem + k * n;
        h->pos = p->hpos_mem + k * n;
        h->key = p->key_mem + k * n;
    }
    p->heaps[nl].active = 1;
    return 0;
}

static int alloc_arrays(struct dh_place *p)
{
    size_t n = (size_t)p->max_servers, nl = (size_t)p->o.max_local;

    p->srv = dh__calloc(n, sizeof(*p->srv));
    p->pools = dh__calloc(n, sizeof(*p->pools));
    p->links = dh__malloc(n * nl * sizeof(*p->links));
    p->lslot_owner = dh__malloc(nl * sizeof(int32_t));
    p->remotes = dh__malloc(n * sizeof(int32_t));
    p->rpos = dh__malloc(n * sizeof(int32_t));
    if (!p->srv || !p->pools || !p->links || !p->lslot_owner || !p->remotes ||
        !p->rpos || alloc_heaps(p) < 0)
        return DH_ENOMEM;
    for (size_t i = 0; i < n * nl; i++)
        p->links[i] = (struct dh__place_link){.bw = 0, .lat_ms = -1};
    for (size_t i = 0; i < nl; i++)
        p->lslot_owner[i] = -1;
    for (size_t i = 0; i < n; i++)
        p->rpos[i] = -1;
    return 0;
}

int dh_place_create(int32_t max_servers, const struct dh_place_opts *o,
                    struct dh_place **out, struct dh_err *e)
{
    struct dh_place *p;
    int rc;

    if (max_servers < 1 || max_servers > (1 << 24))
        return dh_err_set(e, DH_EINVAL,
                          "placement: max_servers %d not in 1..16777216",
                          (int)max_servers);
    p = dh__calloc(1, sizeof(*p));
    if (!p)
        return dh_err_set(e, DH_ENOMEM, "placement table: out of memory");
    if (o)
        p->o = *o;
    else
        dh_place_opts_default(&p->o);
    p->max_servers = max_servers;
    rc = check_opts(&p->o, e);
    if (rc < 0)
        goto out_free;
    if (((double)max_servers * p->o.max_local) > (double)(1u << 25)) {
        rc = dh_err_set(e, DH_ETOOBIG,
                        "placement: link table %d x %d too large",
                        (int)max_servers, p->o.max_local);
        goto out_free;
    }
    p->rng = p->o.seed ? p->o.seed : 1;
    rc = alloc_arrays(p);
    if (rc < 0) {
        dh_err_set(e, rc, "placement table for %d servers: out of memory",
                   (int)max_servers);
        goto out_free;
    }
    *out = p;
    return 0;
out_free:
    dh_place_destroy(p);
    return rc;
}

void dh_place_destroy(struct dh_place *p)
{
    if (!p)
        return;
    dh__free(p->srv);
    dh__free(p->pools);
    dh__free(p->links);
    dh__free(p->lslot_owner);
    dh__free(p->remotes);
    dh__free(p->rpos);
    dh__free(p->heaps);
    dh__free(p->heap_mem);
    dh__free(p->hpos_mem);
    dh__free(p->key_mem);
    dh__free(p);
}

static int take_lslot(struct dh_place *p, int32_t id)
{
    for (int32_t i = 0; i < p->o.max_local; i++) {
        if (p->lslot_owner[i] < 0) {
            p->lslot_owner[i] = id;
            return i;
        }
    }
    return -1;
}

static void push_remote(struct dh_place *p, int32_t id)
{
    int32_t n = p->nremote++;

    p->remotes[n] = id;
    p->rpos[id] = n;
    for (int32_t hi = 0; hi <= p->o.max_local; hi++)
        if (p->heaps[hi].active)
            heap_push(p, hi, id);
}

int dh_place_add_server(struct dh_place *p, int32_t id, enum dh_place_role role,
                        int32_t local_rank, int32_t workers, int32_t queue_cap,
                        struct dh_err *e)
{
    struct dh__place_srv *s;

    if (id < 0 || id >= p->max_servers || workers < 1 || queue_cap < 0 ||
        (role != DH_PLACE_ROLE_LOCAL && role != DH_PLACE_ROLE_REMOTE))
        return dh_err_set(e, DH_EINVAL,
                          "server %d: id must be in 0..%d, workers >= 1, "
                          "queue cap >= 0",
                          (int)id, (int)p->max_servers - 1);
    s = &p->srv[id];
    if (s->used)
        return dh_err_set(e, DH_EDUP, "server %d already registered", (int)id);
    memset(s, 0, sizeof(*s));
    s->lslot = -1;
    if (role == DH_PLACE_ROLE_LOCAL) {
        s->lslot = take_lslot(p, id);
        if (s->lslot < 0)
            return dh_err_set(e, DH_ETOOBIG,
                              "server %d: more than %d local servers", (int)id,
                              p->o.max_local);
    }
    s->used = 1;
    s->role = role;
    s->local_rank = role == DH_PLACE_ROLE_LOCAL ? local_rank : -1;
    s->workers = workers;
    s->queue_cap = queue_cap;
    s->ratio = 1.0;
    s->pool = -1;
    for (int32_t t = 0; t < p->o.max_local; t++)
        p->links[(size_t)id * p->o.max_local + t] = (struct dh__place_link){
            .bw = 0, .lat_ms = -1};
    if (role == DH_PLACE_ROLE_REMOTE)
        push_remote(p, id);
    else if (p->o.policy == DH_PLACE_POLICY_DEADLINE)
        heap_build(p, s->lslot); /* its links are fresh: defaults */
    return 0;
}

static void drop_remote(struct dh_place *p, int32_t id)
{
    int32_t i = p->rpos[id], last = p->remotes[p->nremote - 1];

    for (int32_t hi = 0; hi <= p->o.max_local; hi++)
        if (p->heaps[hi].active)
            heap_drop(p, hi, id);
    p->remotes[i] = last;
    p->rpos[last] = i;
    p->rpos[id] = -1;
    p->nremote--;
}

int dh_place_remove_server(struct dh_place *p, int32_t id, struct dh_err *e)
{
    struct dh__place_srv *s;

    if (id < 0 || id >= p->max_servers || !p->srv[id].used)
        return dh_err_set(e, DH_ENOTFOUND, "server %d not registered", (int)id);
    s = &p->srv[id];
    if (s->pool >= 0)
        p->pools[s->pool].tasks -= s->tasks - s->released;
    if (s->role == DH_PLACE_ROLE_REMOTE)
        drop_remote(p, id);
    if (s->lslot >= 0) {
        for (int32_t i = 0; i < p->max_servers; i++)
            p->links[(size_t)i * p->o.max_local + s->lslot] =
                (struct dh__place_link){.bw = 0, .lat_ms = -1};
        p->lslot_owner[s->lslot] = -1;
        p->heaps[s->lslot].active = 0;
    }
    s->used = 0;
    return 0;
}

int dh_place_set_pool(struct dh_place *p, int32_t server, int32_t pool,
                      struct dh_err *e)
{
    struct dh__place_srv *s;

    if (server < 0 || server >= p->max_servers || !p->srv[server].used)
        return dh_err_set(e, DH_ENOTFOUND, "server %d not registered",
                          (int)server);
    s = &p->srv[server];
    if (pool < -1 || pool >= p->max_servers ||
        (pool >= 0 && s->role != DH_PLACE_ROLE_LOCAL))
        return dh_err_set(e, DH_EINVAL,
                          "server %d: pool %d (a local server, a pool in "
                          "-1..%d)",
                          (int)server, (int)pool, (int)p->max_servers - 1);
    if (s->pool >= 0)
        p->pools[s->pool].tasks -= s->tasks - s->released;
    s->pool = pool;
    if (pool >= 0)
        p->pools[pool].tasks += s->tasks - s->released;
    return 0;
}

/* One of `server`'s tasks leaves its pool's count (release 1) or comes
 * back to it (release 0). */
static int pool_move(struct dh_place *p, int32_t server, int release)
{
    struct dh__place_srv *s;

    if (server < 0 || server >= p->max_servers || !p->srv[server].used)
        return DH_ENOTFOUND;
    s = &p->srv[server];
    if (release ? s->pool < 0 || s->released >= s->tasks : s->released <= 0)
        return DH_EINVAL;
    s->released += release ? 1 : -1;
    if (s->pool >= 0)
        p->pools[s->pool].tasks += release ? -1 : 1;
    return 0;
}

int dh_place_pool_release(struct dh_place *p, int32_t server)
{
    return pool_move(p, server, 1);
}

int dh_place_pool_rehold(struct dh_place *p, int32_t server)
{
    return pool_move(p, server, 0);
}

int dh_place_pool_cap(struct dh_place *p, int32_t pool, int32_t cap)
{
    if (pool < 0 || pool >= p->max_servers || cap < 0)
        return DH_EINVAL;
    p->pools[pool].cap = cap;
    return 0;
}

int dh_place_pool_tasks(const struct dh_place *p, int32_t pool, int64_t *tasks)
{
    if (pool < 0 || pool >= p->max_servers)
        return DH_EINVAL;
    *tasks = p->pools[pool].tasks;
    return 0;
}

int dh_place_server_info(const struct dh_place *p, int32_t server,
                         struct dh_place_server_info *out)
{
    const struct dh__place_srv *s;

    if (server < 0 || server >= p->max_servers || !p->srv[server].used)
        return DH_ENOTFOUND;
    s = &p->srv[server];
    out->role = s->role;
    out->local_rank = s->local_rank;
    out->workers = s->workers;
    out->queue_cap = s->queue_cap;
    out->tasks = s->tasks;
    out->inflight_ms = s->inflight_ms;
    out->ratio = s->ratio;
    return 0;
}

/* ---- Eq. 1 ---- */

static double net_ms(const struct dh_place *p, int32_t id,
                     const struct dh_place_req *r)
{
    int32_t to = r->local_server;

    if (id == to || to < 0 || to >= p->max_servers || !p->srv[to].used ||
        p->srv[to].lslot < 0)
        return 0;
    return link_ms(p, id, p->srv[to].lslot, r->out_bytes);
}

static void predict(const struct dh_place *p, int32_t id,
                    const struct dh_place_req *r, struct dh_cost_terms *t)
{
    const struct dh__place_srv *s = &p->srv[id];

    t->cpu_ms = r->cpu_ms * s->ratio;
    t->io_ms = r->io_ms + r->in_bytes / 1e6 * s->read_ms_per_mb;
    t->queue_ms = s->ratio * (s->inflight_ms + s->ext_ms) / s->workers;
    t->net_ms = net_ms(p, id, r);
    t->t_ms = t->cpu_ms + t->io_ms + t->queue_ms + t->net_ms;
    t->miss_ms = t->t_ms > r->deadline_ms ? t->t_ms - r->deadline_ms : 0;
    t->at_cap = dh__place_at_cap(p, s);
}

/* Bounded inputs keep every sum finite: no NaN can "meet" a deadline. */
static int req_ok(const struct dh_place_req *r)
{
    return r && r->cpu_ms >= 0 && r->io_ms >= 0 && r->out_bytes >= 0 &&
           r->in_bytes >= 0 && r->cpu_ms <= DH_PLACE_MAX_MS &&
           r->io_ms <= DH_PLACE_MAX_MS && r->out_bytes <= DH_PLACE_MAX_BYTES &&
           r->in_bytes <= DH_PLACE_MAX_BYTES && !isnan(r->deadline_ms);
}

int dh_cost_predict(const struct dh_place *p, int32_t server,
                    const struct dh_place_req *req, struct dh_cost_terms *out)
{
    if (server < 0 || server >= p->max_servers || !p->srv[server].used)
        return DH_ENOTFOUND;
    if (!req_ok(req))
        return DH_EINVAL;
    predict(p, server, req, out);
    return 0;
}

void dh_cost_req_from_desc(const struct dh_estimator *est,
                           const struct dh_desc *d, struct dh_place_req *req)
{
    struct dh_cost_features f;
    int64_t frames;
    int32_t w, h;

    dh_sample_plan_output(&est->plan, d, &frames, &w, &h);
    dh_estimate_features(est, d, frames, w, h, &f);
    req->cpu_ms = dh_cost_model_predict(&est->cost, &f);
    req->out_bytes = (double)d->est_out_bytes;
    req->in_bytes = d->bytes > 0 ? (double)d->bytes : 0;
}

/* ---- streamed scoring ---- */

struct cand {
    int32_t id;
    double t, m;
};

struct acc {
    int32_t scored;
    int has_local;
    struct cand local;
    struct cand best;   /* by (miss, T) over every candidate */
    struct cand fast_r; /* by T over remotes (the REMOTE_GAIN test) */
    int32_t ntop;
    struct dh_place_cand top[DH_PLACE_TOP];
};

static int better(const struct cand *a, const struct cand *b)
{
    if (b->id < 0)
        return 1;
    if (a->m < b->m - TIE_EPS)
        return 1;
    if (a->m > b->m + TIE_EPS)
        return 0;
    if (a->t != b->t)
        return a->t < b->t;
    return a->id < b->id; /* exact ties: the same answer however visited */
}

static struct cand cand_of(const struct dh_place_cand *t)
{
    return (struct cand){t->server, t->t_pred_ms, t->miss_ms};
}

/* Keeps the DH_PLACE_TOP best candidates, best first, for telemetry. */
static void top_insert(struct acc *a, const struct cand *c)
{
    int32_t i;
    struct cand prev;

    if (a->ntop == DH_PLACE_TOP) {
        prev = cand_of(&a->top[DH_PLACE_TOP - 1]);
        if (!better(c, &prev))
            return;
        i = DH_PLACE_TOP - 1;
    } else {
        i = a->ntop++;
    }
    for (; i > 0; i--) {
        prev = cand_of(&a->top[i - 1]);
        if (!better(c, &prev))
            break;
        a->top[i] = a->top[i - 1];
    }
    a->top[i] = (struct dh_place_cand){c->id, c->t, c->m};
}

static void acc_init(struct acc *a)
{
    memset(a, 0, sizeof(*a));
    a->best.id = a->fast_r.id = a->local.id = -1;
}

static void consider(struct acc *a, const struct dh_place *p, int32_t id,
                     const struct dh_place_req *r)
{
    struct dh_cost_terms t;
    struct cand c;

    predict(p, id, r, &t);
    if (t.at_cap)
        return;
    c = (struct cand){id, t.t_ms, t.miss_ms};
    a->scored++;
    top_insert(a, &c);
    if (better(&c, &a->best))
        a->best = c;
    if (id == r->local_server) {
        a->has_local = 1;
        a->local = c;
    } else if (a->fast_r.id < 0 || c.t < a->fast_r.t) {
        a->fast_r = c;
    }
}

static void set_out(struct dh_place_decision *o, const struct cand *c,
                    enum dh_place_reason why)
{
    o->server = c->id;
    o->reason = why;
    o->t_pred_ms = c->t;
    o->miss_ms = c->m;
}

/* DESIGN 3: local meets -> keep it unless a remote is remote_gain_ms
 * faster; otherwise least miss, ties to earliest finish; nothing under its
 * cap -> backpressure. */
static void apply_rule(const struct dh_place *p, const struct acc *a,
                       struct dh_place_decision *o)
{
    if (a->has_local && a->local.m <= 0) {
        if (a->fast_r.id >= 0 && a->local.t - a->fast_r.t > p->o.remote_gain_ms)
            set_out(o, &a->fast_r, DH_PLACE_REASON_REMOTE_GAIN);
        else
            set_out(o, &a->local, DH_PLACE_REASON_LOCAL_MEETS);
    } else if (a->best.id >= 0) {
        set_out(o, &a->best,
                a->best.m > 0 ? DH_PLACE_REASON_EARLIEST_FINISH
                              : DH_PLACE_REASON_LEAST_MISS);
    } else {
        o->server = -1;
        o->reason = DH_PLACE_REASON_BACKPRESSURE;
    }
}

static void out_init(struct dh_place_decision *o, const struct dh_place_req *r)
{
    memset(o, 0, sizeof(*o));
    o->server = -1;
    o->work_ms = r->cpu_ms + r->io_ms;
}

static void acc_finish(const struct acc *a, struct dh_place_decision *o)
{
    o->scored = a->scored;
    o->ntop = a->ntop;
    memcpy(o->top, a->top, sizeof(o->top));
}

static int local_ok(const struct dh_place *p, const struct dh_place_req *r)
{
    int32_t l = r->local_server;

    /* A remote named as "local" must not win with a free network term. */
    return l >= 0 && l < p->max_servers && p->srv[l].used &&
           p->srv[l].role == DH_PLACE_ROLE_LOCAL;
}

static uint64_t rng_next(struct dh_place *p)
{
    uint64_t x = p->rng;

    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    p->rng = x;
    return x;
}

/* The k smallest keys of heap `h`, read through a frontier of at most
 * k + 1 heap positions (each pop adds two children).  Stops at +inf keys:
 * everything below is at its cap. */
static int32_t heap_top_k(const struct dh_place *p,
                          const struct dh__place_heap *h, int32_t k,
                          int32_t *ids)
{
    int32_t fr[DH_PLACE_K_MAX + 2], nf = 0, got = 0;

    if (p->nremote > 0)
        fr[nf++] = 0;
    while (got < k && nf > 0) {
        int32_t b = 0, i;
        for (int32_t j = 1; j < nf; j++)
            if (h->key[h->heap[fr[j]]] < h->key[h->heap[fr[b]]])
                b = j;
        i = fr[b];
        fr[b] = fr[--nf];
        if (isinf(h->key[h->heap[i]]))
            break;
        ids[got++] = h->heap[i];
        if (2 * i + 1 < p->nremote)
            fr[nf++] = 2 * i + 1;
        if (2 * i + 2 < p->nremote)
            fr[nf++] = 2 * i + 2;
    }
    return got;
}

/* The heap ordered for this request's delivery target. */
static const struct dh__place_heap *heap_for(const struct dh_place *p,
                                             const struct dh_place_req *r)
{
    int32_t l = r->local_server;

    if (l >= 0 && l < p->max_servers && p->srv[l].used &&
        p->srv[l].lslot >= 0 && p->heaps[p->srv[l].lslot].active)
        return &p->heaps[p->srv[l].lslot];
    return &p->heaps[p->o.max_local];
}

static int seen(const int32_t *ids, int32_t n, int32_t id)
{
    for (int32_t i = 0; i < n; i++)
        if (ids[i] == id)
            return 1;
    return 0;
}

static int32_t pick_indexed(struct dh_place *p, const struct dh_place_req *r,
                            int32_t *ids)
{
    int32_t n = heap_top_k(p, heap_for(p, r), p->o.k_best, ids);

    for (int32_t i = 0; i < p->o.k_random && p->nremote > 0; i++) {
        int32_t id = p->remotes[rng_next(p) % (uint64_t)p->nremote];
        if (!seen(ids, n, id) && !dh__place_at_cap(p, &p->srv[id]))
            ids[n++] = id;
    }
    return n;
}

static void decide_deadline(struct dh_place *p, const struct dh_place_req *r,
                            int full, struct dh_place_decision *o)
{
    struct acc a;
    int32_t ids[2 * DH_PLACE_K_MAX], n;

    acc_init(&a);
    if (local_ok(p, r))
        consider(&a, p, r->local_server, r);
    if (full) {
        for (int32_t i = 0; i < p->nremote; i++)
            consider(&a, p, p->remotes[i], r);
    } else {
        n = pick_indexed(p, r, ids);
        for (int32_t i = 0; i < n; i++)
            consider(&a, p, ids[i], r);
    }
    apply_rule(p, &a, o);
    acc_finish(&a, o);
}

/* ---- baseline policies ---- */

static void fill_winner(const struct dh_place *p, const struct dh_place_req *r,
                        int32_t id, enum dh_place_reason why, int32_t scored,
                        struct dh_place_decision *o)
{
    struct dh_cost_terms t;

    o->scored = scored;
    if (id < 0) {
        o->server = -1;
        o->reason = DH_PLACE_REASON_BACKPRESSURE;
        return;
    }
    predict(p, id, r, &t);
    o->server = id;
    o->reason = why;
    o->t_pred_ms = t.t_ms;
    o->miss_ms = t.miss_ms;
    o->ntop = 1;
    o->top[0] = (struct dh_place_cand){id, t.t_ms, t.miss_ms};
}

static void decide_rr(struct dh_place *p, const struct dh_place_req *r,
                      struct dh_place_decision *o)
{
    int32_t hl = local_ok(p, r), n = hl + p->nremote, id = -1, tries = 0;

    while (tries < n) {
        int32_t pos = (int32_t)(p->rr++ % (uint32_t)n);
        int32_t c = (hl && pos == 0) ? r->local_server : p->remotes[pos - hl];
        tries++;
        if (!dh__place_at_cap(p, &p->srv[c])) {
            id = c;
            break;
        }
    }
    fill_winner(p, r, id, DH_PLACE_REASON_ROUND_ROBIN, tries, o);
}

static int64_t load_of(const struct dh__place_srv *s)
{
    return s->tasks + s->ext_tasks;
}

/* Fewest tasks in flight, ties to the local server then the lower slot. */
static void decide_lr(struct dh_place *p, const struct dh_place_req *r,
                      int full, struct dh_place_decision *o)
{
    int32_t id = -1, scored = 0;
    int64_t best = INT64_MAX;

    if (local_ok(p, r) && !dh__place_at_cap(p, &p->srv[r->local_server])) {
        id = r->local_server;
        best = load_of(&p->srv[id]);
        scored++;
    }
    if (full) {
        for (int32_t i = 0; i < p->nremote; i++) {
            const struct dh__place_srv *s = &p->srv[p->remotes[i]];
            if (dh__place_at_cap(p, s))
                continue;
            scored++;
            if (load_of(s) < best) {
                best = load_of(s);
                id = p->remotes[i];
            }
        }
    } else if (p->nremote > 0) {
        const struct dh__place_heap *h = &p->heaps[p->o.max_local];
        if (!isinf(h->key[h->heap[0]])) {
            scored++;
            if (load_of(&p->srv[h->heap[0]]) < best)
                id = h->heap[0];
        }
    }
    fill_winner(p, r, id, DH_PLACE_REASON_LEAST_REQUEST, scored, o);
}

static int decide(struct dh_place *p, const struct dh_place_req *req, int full,
                  struct dh_place_decision *out)
{
    if (!req_ok(req))
        return DH_EINVAL;
    out_init(out, req);
    switch (p->o.policy) {
    case DH_PLACE_POLICY_ROUND_ROBIN:
        decide_rr(p, req, out);
        break;
    case DH_PLACE_POLICY_LEAST_REQUEST:
        decide_lr(p, req, full, out);
        break;
    case DH_PLACE_POLICY_DEADLINE:
        decide_deadline(p, req, full, out);
        break;
    }
    /* the work the chosen server will do: its own read term included */
    if (out->server >= 0)
        out->work_ms = req->cpu_ms + req->io_ms +
                       req->in_bytes / 1e6 * p->srv[out->server].read_ms_per_mb;
    return 0;
}

int dh_place_decide(struct dh_place *p, const struct dh_place_req *req,
                    struct dh_place_decision *out)
{
    return decide(p, req, p->o.full_scan, out);
}

int dh_place_decide_full(struct dh_place *p, const struct dh_place_req *req,
                         struct dh_place_decision *out)
{
    return decide(p, req, 1, out);
}

/* ---- telemetry: the line, in fixed point (issue 21 item 2) ----
 * A Coordinator writes one line per decision on its loop; printf's
 * double conversions were most of its cost (1.5 us of ~10 us a
 * request).  The digits are written here instead: the same text as
 * "%lld" / "%d" / "%.3f" (a value that is not finite or too large for the
 * fixed point goes through "%.3f" / "%.3e"). */

#define LINE_MAX_FIXED 1024 /* > the longest line: 4 candidates, 64-bit ids */

static char *put_u64(char *p, uint64_t v)
{
    char d[20];
    int n = 0;

    do
        d[n++] = (char)('0' + v % 10);
    while ((v /= 10));
    while (n)
        *p++ = d[--n];
    return p;
}

static char *put_i64(char *p, int64_t v)
{
    if (v < 0) {
        *p++ = '-';
        return put_u64(p, (uint64_t)0 - (uint64_t)v);
    }
    return put_u64(p, (uint64_t)v);
}

static char *put_str(char *p, const char *s)
{
    size_t n = strlen(s);

    memcpy(p, s, n);
    return p + n;
}

/* v as "%.3f" writes it (rounded to the nearest thousandth). */
static char *put_ms3(char *p, double v)
{
    uint64_t q;
    int k;

    if (!isfinite(v) || fabs(v) >= 1e15) { /* "inf", "nan", "1.000e+20" */
        k = snprintf(p, 32, isfinite(v) ? "%.3e" : "%.3f", v);
        return p + (k < 0 ? 0 : k < 32 ? k : 31);
    }
    q = (uint64_t)llround(fabs(v) * 1000.0);
    if (v < 0 && q)
        *p++ = '-';
    p = put_u64(p, q / 1000);
    *p++ = '.';
    *p++ = (char)('0' + q / 100 % 10);
    *p++ = (char)('0' + q / 10 % 10);
    *p++ = (char)('0' + q % 10);
    return p;
}

size_t dh_place_decision_format(const struct dh_place_decision *d, int64_t task,
                                double decide_us, char *buf, size_t len)
{
    char line[LINE_MAX_FIXED], *p = line;
    size_t n;

    p = put_i64(put_str(p, "{\"task\":"), task);
    p = put_str(p, ",\"candidates\":[");
    for (int32_t i = 0; i < d->ntop && i < DH_PLACE_TOP; i++) {
        p = put_i64(put_str(p, i ? ",{\"server\":" : "{\"server\":"),
                    d->top[i].server);
        p = put_ms3(put_str(p, ",\"t_pred_ms\":"), d->top[i].t_pred_ms);
        p = put_ms3(put_str(p, ",\"miss_ms\":"), d->top[i].miss_ms);
        *p++ = '}';
    }
    p = put_i64(put_str(p, "],\"chosen\":"), d->server);
    p = put_str(put_str(p, ",\"reason\":\""), dh_place_reason_name(d->reason));
    p = put_i64(put_str(p, "\",\"scored\":"), d->scored);
    p = put_ms3(put_str(p, ",\"decide_us\":"), decide_us);
    *p++ = '}';
    n = (size_t)(p - line);
    if (len > 0) { /* snprintf's contract: truncated, terminated */
        size_t k = n < len - 1 ? n : len - 1;

        memcpy(buf, line, k);
        buf[k] = '\0';
    }
    return n;
}
