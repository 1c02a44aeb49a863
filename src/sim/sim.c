/*
 * sim.c - the discrete-event simulation of issue 7 item 4 (docs/sim.md).
 *
 * Design: R ranks step in lock-step.  Step k starts for every rank when the
 * all-reduce of step k-1 ends; a rank computes as soon as its batch k has
 * fully arrived at its local DataServer (the wait is its input wait), and
 * requests batch k + prefetch at that moment (the iterator's next()).  The
 * step ends when the slowest rank finishes.  DataServers are FIFO queues of
 * sample tasks served by `cores` workers; a sample prepared anywhere but
 * the requester's local server crosses that server's outgoing link
 * (serialized: bytes / bandwidth, plus latency) and counts as cross-DS.
 *
 * Systems (docs/sim.md): native = rank-local servers holding the whole CPU
 * budget, random split; pool = least-request over every server, random
 * split; datahelix = Tier-1 plan (dh_plan_create, default window) +
 * deadline placement (dh_place_decide, Eq. 1) with assign / complete / link
 * feedback and the GPU-window EWMA as the slack.  Placement tables hold at
 * most 64 local servers (place.h's max_local default): past that, ranks
 * form placement domains of <= 64 local servers and a share of the
 * remotes, one table (one Coordinator) each.
 *
 * Hand-over (config.handover, per system): CPU per sample added to its
 * service time, and a next() time a rank blocks for once its batch is
 * ready.  replay_order: every system takes the workload's order as its
 * split instead of the planner's or a random one (a live run replayed).
 *
 * Single-threaded; all memory through the allocation seam.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "datahelix/place.h"
#include "datahelix/plan.h"
#include "sim/sim.h"
#include "core/hash.h"

#define DOMAIN_LOCAL_MAX 64

enum { EV_STEP, EV_DONE, EV_ARRIVE, EV_HANDED, EV_COMPUTED };

struct srv {
    uint32_t cores, busy;
    uint64_t *q, qhead, qlen, qcap; /* FIFO ring of sample ids */
    double link_free;               /* outgoing link busy until */
    int32_t tab, pid;               /* placement table and id there */
};

struct rank {
    uint32_t local;   /* index of its local server */
    int64_t consumed; /* step being computed (-1 before the first) */
    int waiting;
    double last_next;
    struct dh_window w;
};

struct tab {
    struct dh_place *p;
    uint32_t *srv_of; /* placement id -> server index */
    int32_t n;
};

struct sim {
    const struct dh_sim_config *c;
    const struct dh_sim_workload *w;
    enum dh_sim_system sys;
    struct dh_err *e;
    struct dh_plan *plan;
    uint64_t *seq; /* replay_order: 0, 1, ..., nsamp - 1; else NULL */
    uint64_t nsamp, nsteps, nbatch;
    uint32_t nsrv, ntab;
    struct srv *srv;
    struct rank *rk;
    struct tab *tab;
    /* per sample */
    uint32_t *s_batch;
    double *s_work, *s_start;
    uint8_t *s_done;
    /* per batch (step x ranks + rank) */
    uint32_t *b_left;
    double *b_req, *b_ready;
    /* per step */
    double *step_start, *step_end, *wait;
    /* Tier 2 (tier2.c): per batch GPU ms, per step exchange ms */
    double *b_gpu, *step_x;
    struct dh_sim_tier2 t2;
    uint64_t cur_step;
    uint32_t done_ranks;
    struct dh_sim_evq q;
    double now;
    uint64_t cross_all, cross_measured, events;
};

static const char *system_names[] = {"native", "pool", "datahelix"};

const char *dh_sim_system_name(enum dh_sim_system s)
{
    return system_names[s];
}

int dh_sim_system_parse(const char *s, enum dh_sim_system *out)
{
    for (int i = 0; i < DH_SIM_NSYSTEMS; i++)
        if (!strcmp(s, system_names[i])) {
            *out = (enum dh_sim_system)i;
            return 0;
        }
    return DH_EINVAL;
}

void dh_sim_config_default(struct dh_sim_config *c)
{
    memset(c, 0, sizeof(*c));
    c->ranks = 8;
    c->local = 8;
    c->remote = 16;
    c->cores = 4;
    c->batch = 2;
    c->steps = 100;
    c->warmup = 20;
    c->prefetch = 2;
    c->link_gbps = 10;
    c->link_lat_ms = 0.2;
    c->ddl_ms = 0;
    c->noise_sigma = 0.3;
    c->cpu_scale = 1;
    c->allreduce_ms = 0;
    c->seed = 1;
    c->tier2_round = 4;
    c->tier2_margin = 1.5;
}

uint64_t dh_sim_samples_needed(const struct dh_sim_config *c)
{
    return ((uint64_t)c->steps + c->warmup) * c->ranks * c->batch;
}

/* ---- randomness: a pure function of (seed, sample) ---- */
/* Actual / estimated CPU time of sample k: lognormal with mean 1. */
static double noise(const struct dh_sim_config *c, uint64_t k)
{
    uint64_t h = dh__mix64(c->seed * 0xd1342543de82ef95ull ^ dh__mix64(k));
    double u1 = ((double)(h >> 11) + 0.5) * 0x1p-53;
    double u2 = (double)(dh__mix64(h) >> 11) * 0x1p-53;
    double z = sqrt(-2 * log(u1)) * cos(2 * M_PI * u2);
    double s = c->noise_sigma;

    return exp(s * z - s * s / 2);
}

static double cpu_est(const struct sim *s, uint64_t id)
{
    return s->w->s[id].cpu_ms * s->c->cpu_scale;
}

/* ---- servers ---- */
static int fifo_push(struct srv *v, uint64_t id)
{
    if (v->qlen == v->qcap) {
        uint64_t cap = v->qcap ? 2 * v->qcap : 16;
        uint64_t *q = dh__malloc(cap * sizeof(*q));

        if (!q)
            return DH_ENOMEM;
        for (uint64_t i = 0; i < v->qlen; i++)
            q[i] = v->q[(v->qhead + i) % v->qcap];
        dh__free(v->q);
        v->q = q;
        v->qhead = 0;
        v->qcap = cap;
    }
    v->q[(v->qhead + v->qlen++) % v->qcap] = id;
    return 0;
}

static uint64_t fifo_pop(struct srv *v)
{
    uint64_t id = v->q[v->qhead];

    v->qhead = (v->qhead + 1) % v->qcap;
    v->qlen--;
    return id;
}

/* The system's hand-over CPU for sample id, before --cpu-scale. */
static double handover_cpu(const struct sim *s, uint64_t id)
{
    const struct dh_sim_handover *h = &s->c->handover[s->sys];

    return h->cpu_ms + h->cpu_ms_per_mb * s->w->s[id].out_bytes / 1e6;
}

static int start_task(struct sim *s, uint32_t sv, uint64_t id)
{
    double t = cpu_est(s, id) * noise(s->c, id) +
               handover_cpu(s, id) * s->c->cpu_scale;

    s->srv[sv].busy++;
    s->s_start[id] = s->now;
    return dh__sim_evq_push(&s->q, s->now + t, EV_DONE, sv, id);
}

static int dispatch(struct sim *s, uint32_t sv, uint64_t id)
{
    if (s->srv[sv].busy < s->srv[sv].cores)
        return start_task(s, sv, id);
    return fifo_push(&s->srv[sv], id);
}

/* ---- placement ---- */
static int choose(struct sim *s, uint32_t r, uint64_t step, uint64_t id,
                  uint32_t *out)
{
    struct rank *k = &s->rk[r];
    struct dh_place_req req = {0};
    struct dh_place_decision d;
    struct tab *t;
    int rc;

    if (s->sys == DH_SIM_NATIVE) {
        *out = k->local;
        return 0;
    }
    t = &s->tab[s->srv[k->local].tab];
    req.rank = (int32_t)r;
    req.cpu_ms = cpu_est(s, id);
    req.out_bytes = s->w->s[id].out_bytes;
    req.local_server = -1;
    req.deadline_ms = INFINITY;
    if (s->sys == DH_SIM_DATAHELIX) {
        req.local_server = s->srv[k->local].pid;
        req.deadline_ms = dh_window_slack_ms(&k->w, (int)(step - k->consumed),
                                             0);
    }
    if ((rc = dh_place_decide(t->p, &req, &d)) != 0)
        return dh_err_set(s->e, rc, "sim: placement decision failed");
    *out = d.server < 0 ? k->local : t->srv_of[d.server];
    s->s_work[id] = d.work_ms;
    if ((rc = dh_place_assign(t->p, s->srv[*out].pid, d.work_ms)) != 0)
        return dh_err_set(s->e, rc, "sim: placement assign failed");
    return 0;
}

/* Rank r's samples of `step`: the plan's (or the random split's), or with
 * replay_order the workload's own order, B samples per (step, rank) in
 * turn. */
static const uint64_t *batch_ids(const struct sim *s, uint64_t step, uint32_t r,
                                 uint64_t *cnt)
{
    if (s->seq) {
        *cnt = s->c->batch;
        return s->seq + (step * s->c->ranks + r) * s->c->batch;
    }
    return dh_plan_rank_ids(s->plan, step, r, cnt);
}

static const uint64_t *batch_fn(void *ctx, uint64_t step, uint32_t r,
                                uint64_t *cnt)
{
    return batch_ids(ctx, step, r, cnt);
}

static int request_batch(struct sim *s, uint32_t r, uint64_t step)
{
    uint64_t b = step * s->c->ranks + r, cnt = 0;
    const uint64_t *ids = batch_ids(s, step, r, &cnt);
    int rc;

    s->b_left[b] = (uint32_t)cnt;
    s->b_req[b] = s->now;
    if (cnt == 0)
        s->b_ready[b] = s->now;
    for (uint64_t i = 0; i < cnt; i++) {
        uint32_t sv = 0;

        s->s_batch[ids[i]] = (uint32_t)b;
        if ((rc = choose(s, r, step, ids[i], &sv)) != 0 ||
            (rc = dispatch(s, sv, ids[i])) != 0)
            return rc;
    }
    return 0;
}

/* ---- ranks ---- */
static int begin_compute(struct sim *s, uint32_t r)
{
    struct rank *k = &s->rk[r];
    uint64_t step = s->cur_step, cnt = 0;
    const uint64_t *ids = batch_ids(s, step, r, &cnt);
    double gpu = 0;
    int rc;

    k->waiting = 0;
    if (step >= s->c->warmup)
        s->wait[(step - s->c->warmup) * s->c->ranks + r] = s->now -
                                                           s->step_start[step];
    if (k->consumed >= 0)
        dh_window_update(&k->w, s->now - k->last_next);
    k->last_next = s->now;
    k->consumed = (int64_t)step;
    if (step + s->c->prefetch < s->nsteps &&
        (rc = request_batch(s, r, step + s->c->prefetch)) != 0)
        return rc;
    if (s->b_gpu) /* Tier 2 decided the round (tier2.c) */
        gpu = s->b_gpu[step * s->c->ranks + r] + s->step_x[step];
    for (uint64_t i = 0; !s->b_gpu && i < cnt; i++)
        gpu += s->w->s[ids[i]].gpu_ms * dh__sim_est_error(s->c, ids[i]);
    return dh__sim_evq_push(&s->q, s->now + gpu, EV_COMPUTED, r, step);
}

/* Rank r's batch of the current step is ready: its next() returns after
 * the system's consumer-side hand-over (docs/sim.md "Hand-over"). */
static int batch_ready(struct sim *s, uint32_t r)
{
    const struct dh_sim_handover *h = &s->c->handover[s->sys];
    uint64_t cnt = 0;
    const uint64_t *ids = batch_ids(s, s->cur_step, r, &cnt);
    double bytes = 0, t;

    for (uint64_t i = 0; i < cnt; i++)
        bytes += s->w->s[ids[i]].out_bytes;
    t = h->next_ms + h->next_ms_per_mb * bytes / 1e6;
    s->rk[r].waiting = 0;
    if (t > 0)
        return dh__sim_evq_push(&s->q, s->now + t, EV_HANDED, r, s->cur_step);
    return begin_compute(s, r);
}

static int on_step(struct sim *s, uint64_t step)
{
    int rc;

    s->cur_step = step;
    s->step_start[step] = s->now;
    s->done_ranks = 0;
    for (uint32_t r = 0; r < s->c->ranks; r++) {
        if (s->b_left[step * s->c->ranks + r] == 0) {
            if ((rc = batch_ready(s, r)) != 0)
                return rc;
        } else {
            s->rk[r].waiting = 1;
        }
    }
    return 0;
}

static int on_computed(struct sim *s)
{
    double end = s->now + s->c->allreduce_ms;

    if (++s->done_ranks < s->c->ranks)
        return 0;
    s->step_end[s->cur_step] = end;
    if (s->cur_step + 1 == s->nsteps)
        return 0;
    return dh__sim_evq_push(&s->q, end, EV_STEP, 0, s->cur_step + 1);
}

static int on_arrive(struct sim *s, uint64_t id)
{
    uint32_t b = s->s_batch[id], r = b % s->c->ranks;

    if (--s->b_left[b] > 0)
        return 0;
    s->b_ready[b] = s->now;
    if (s->rk[r].waiting && b / s->c->ranks == s->cur_step)
        return batch_ready(s, r);
    return 0;
}

/* Sends a finished sample to its requester's local server. */
static int deliver(struct sim *s, uint32_t sv, uint64_t id)
{
    uint32_t b = s->s_batch[id], local = s->rk[b % s->c->ranks].local;
    double bytes = s->w->s[id].out_bytes, t0, arrive;
    struct srv *v = &s->srv[sv];
    int rc;

    if (sv == local)
        return on_arrive(s, id); /* shared memory: no copy */
    t0 = s->now > v->link_free ? s->now : v->link_free;
    v->link_free = t0 + bytes / (s->c->link_gbps * 1e9 / 8) * 1000;
    arrive = v->link_free + s->c->link_lat_ms;
    s->cross_all += (uint64_t)bytes;
    if (b / s->c->ranks >= s->c->warmup)
        s->cross_measured += (uint64_t)bytes;
    if (s->sys == DH_SIM_DATAHELIX &&
        (rc = dh_place_link(s->tab[v->tab].p, v->pid, s->srv[local].pid, bytes,
                            (arrive - s->now) / 1000)) != 0)
        return dh_err_set(s->e, rc, "sim: link feedback failed");
    return dh__sim_evq_push(&s->q, arrive, EV_ARRIVE, sv, id);
}

static int on_done(struct sim *s, uint32_t sv, uint64_t id)
{
    struct srv *v = &s->srv[sv];
    int rc;

    v->busy--;
    s->s_done[id]++;
    if (s->sys != DH_SIM_NATIVE &&
        (rc = dh_place_complete(s->tab[v->tab].p, v->pid, s->s_work[id],
                                s->now - s->s_start[id])) != 0)
        return dh_err_set(s->e, rc, "sim: completion feedback failed");
    /* the freed worker takes the queue's head before the delivery can
     * trigger new requests (FIFO) */
    if (v->qlen && (rc = start_task(s, sv, fifo_pop(v))) != 0)
        return rc;
    return deliver(s, sv, id);
}

static int loop(struct sim *s)
{
    struct dh_sim_event ev;
    int rc = 0;

    while (rc == 0 && dh__sim_evq_pop(&s->q, &ev)) {
        s->now = ev.t;
        s->events++;
        switch (ev.type) {
        case EV_STEP:
            rc = on_step(s, ev.b);
            break;
        case EV_DONE:
            rc = on_done(s, ev.a, ev.b);
            break;
        case EV_ARRIVE:
            rc = on_arrive(s, ev.b);
            break;
        case EV_HANDED:
            rc = begin_compute(s, ev.a);
            break;
        default:
            rc = on_computed(s);
            break;
        }
    }
    if (rc == DH_ENOMEM)
        dh_err_set(s->e, rc, "sim: out of memory");
    return rc;
}

/* ---- setup ---- */
static int check_config(const struct dh_sim_config *c,
                        const struct dh_sim_workload *w, struct dh_err *e)
{
    if (c->ranks < 1 || c->batch < 1 || c->cores < 1 || c->steps < 1 ||
        c->prefetch < 1 || c->local < 1 || c->local > c->ranks)
        return dh_err_set(e, DH_EINVAL,
                          "sim: ranks, batch, cores, steps, "
                          "prefetch >= 1 and 1 <= local <= ranks needed");
    if ((uint64_t)c->local + c->remote > (1u << 20) || !(c->link_gbps > 0) ||
        !(c->link_lat_ms >= 0) || !(c->cpu_scale > 0) ||
        !(c->noise_sigma >= 0) || !(c->allreduce_ms >= 0) ||
        !(c->ddl_ms >= 0) || !(c->est_error >= 0) || !(c->est_error <= 3) ||
        !(c->tier2_margin >= 0) || !(c->tier2_margin < INFINITY) ||
        c->tier2_round < 1 || c->tier2_round > 4096)
        return dh_err_set(e, DH_EINVAL, "sim: a size or rate out of range");
    for (int i = 0; i < DH_SIM_NSYSTEMS; i++) {
        const struct dh_sim_handover *h = &c->handover[i];

        if (!(h->cpu_ms >= 0 && h->cpu_ms_per_mb >= 0 && h->next_ms >= 0 &&
              h->next_ms_per_mb >= 0 &&
              h->cpu_ms + h->cpu_ms_per_mb + h->next_ms + h->next_ms_per_mb <
                  INFINITY))
            return dh_err_set(e, DH_EINVAL,
                              "sim: %s's hand-over costs must "
                              "be finite and >= 0",
                              system_names[i]);
    }
    if (dh_sim_samples_needed(c) > UINT32_MAX)
        return dh_err_set(e, DH_ETOOBIG,
                          "sim: (steps + warmup) x ranks x "
                          "batch over 2^32");
    if (!w->s || w->n < dh_sim_samples_needed(c))
        return dh_err_set(e, DH_EINVAL,
                          "sim: workload has %llu samples, "
                          "the run needs %llu",
                          (unsigned long long)w->n,
                          (unsigned long long)dh_sim_samples_needed(c));
    return 0;
}

/* Native: the whole budget (local + remote) x cores on R rank-local
 * servers, split as evenly as integers allow (at least 1 each); or
 * native_cores each when set. */
static void layout_native(struct sim *s)
{
    const struct dh_sim_config *c = s->c;
    uint64_t total = c->native_cores
                         ? (uint64_t)c->native_cores * c->ranks
                         : ((uint64_t)c->local + c->remote) * c->cores;

    s->nsrv = c->ranks;
    for (uint32_t r = 0; r < c->ranks; r++) {
        uint64_t k = total / c->ranks + (r < total % c->ranks);

        s->srv[r].cores = k ? (uint32_t)k : 1;
        s->rk[r].local = r;
    }
}

static int alloc_arrays(struct sim *s)
{
    uint64_t nsrv = (uint64_t)s->c->local + s->c->remote;
    uint64_t nmeas = (uint64_t)s->c->steps * s->c->ranks;

    if (nsrv < s->c->ranks)
        nsrv = s->c->ranks;
    s->srv = dh__calloc(nsrv, sizeof(*s->srv));
    s->rk = dh__calloc(s->c->ranks, sizeof(*s->rk));
    s->s_batch = dh__calloc(s->nsamp, sizeof(*s->s_batch));
    s->s_work = dh__calloc(s->nsamp, sizeof(*s->s_work));
    s->s_start = dh__calloc(s->nsamp, sizeof(*s->s_start));
    s->s_done = dh__calloc(s->nsamp, sizeof(*s->s_done));
    s->b_left = dh__calloc(s->nbatch, sizeof(*s->b_left));
    s->b_req = dh__calloc(s->nbatch, sizeof(*s->b_req));
    s->b_ready = dh__calloc(s->nbatch, sizeof(*s->b_ready));
    s->step_start = dh__calloc(s->nsteps, sizeof(*s->step_start));
    s->step_end = dh__calloc(s->nsteps, sizeof(*s->step_end));
    s->wait = dh__calloc(nmeas, sizeof(*s->wait));
    if (!s->srv || !s->rk || !s->s_batch || !s->s_work || !s->s_start ||
        !s->s_done || !s->b_left || !s->b_req || !s->b_ready ||
        !s->step_start || !s->step_end || !s->wait)
        return dh_err_set(s->e, DH_ENOMEM, "sim: out of memory");
    for (uint64_t b = 0; b < s->nbatch; b++)
        s->b_left[b] = UINT32_MAX; /* not requested yet */
    return 0;
}

static void place_opts(const struct sim *s, int32_t nlocal,
                       struct dh_place_opts *o)
{
    double cpu = 0, bytes = 0;

    for (uint64_t i = 0; i < s->nsamp; i++) {
        cpu += cpu_est(s, i);
        bytes += s->w->s[i].out_bytes;
    }
    dh_place_opts_default(o);
    o->policy = s->sys == DH_SIM_POOL ? DH_PLACE_POLICY_LEAST_REQUEST
                                      : DH_PLACE_POLICY_DEADLINE;
    o->key_cpu_ms = cpu / (double)s->nsamp;  /* the mix's mean, as */
    o->key_bytes = bytes / (double)s->nsamp; /* docs/placement.md asks */
    o->default_bw_mbps = s->c->link_gbps * 1000 / 8;
    o->default_latency_ms = s->c->link_lat_ms;
    o->max_local = nlocal > 0 ? nlocal : 1;
    o->seed = s->c->seed;
}

/* Domain of server i (locals first, then remotes), table count nt. */
static uint32_t domain_of(const struct sim *s, uint32_t i, uint32_t nt)
{
    return i < s->c->local ? i % nt : (i - s->c->local) % nt;
}

static int make_table(struct sim *s, uint32_t t, uint32_t nt)
{
    struct dh_place_opts o;
    struct tab *tb = &s->tab[t];
    int32_t nloc = 0;
    int rc;

    for (uint32_t i = 0; i < s->nsrv; i++)
        if (domain_of(s, i, nt) == t) {
            s->srv[i].tab = (int32_t)t;
            s->srv[i].pid = tb->n++;
            nloc += i < s->c->local;
        }
    place_opts(s, s->sys == DH_SIM_POOL ? 1 : nloc, &o);
    tb->srv_of = dh__calloc((size_t)tb->n, sizeof(*tb->srv_of));
    if (!tb->srv_of)
        return dh_err_set(s->e, DH_ENOMEM, "sim: out of memory");
    if ((rc = dh_place_create(tb->n, &o, &tb->p, s->e)) != 0)
        return rc;
    for (uint32_t i = 0; i < s->nsrv; i++) {
        struct srv *v = &s->srv[i];
        int loc = i < s->c->local && s->sys == DH_SIM_DATAHELIX;

        if (domain_of(s, i, nt) != t)
            continue;
        tb->srv_of[v->pid] = i;
        rc = dh_place_add_server(
            tb->p, v->pid, loc ? DH_PLACE_ROLE_LOCAL : DH_PLACE_ROLE_REMOTE,
            loc ? (int32_t)i : -1, (int32_t)v->cores, 0, s->e);
        if (rc)
            return rc;
    }
    return 0;
}

/* Pool and datahelix: L local + M remote servers of `cores` each. */
static int layout_shared(struct sim *s)
{
    const struct dh_sim_config *c = s->c;
    uint32_t nt = 1;
    int rc;

    s->nsrv = c->local + c->remote;
    for (uint32_t i = 0; i < s->nsrv; i++)
        s->srv[i].cores = c->cores;
    for (uint32_t r = 0; r < c->ranks; r++)
        s->rk[r].local = (uint32_t)((uint64_t)r * c->local / c->ranks);
    if (s->sys == DH_SIM_DATAHELIX)
        nt = (c->local + DOMAIN_LOCAL_MAX - 1) / DOMAIN_LOCAL_MAX;
    s->tab = dh__calloc(nt, sizeof(*s->tab));
    if (!s->tab)
        return dh_err_set(s->e, DH_ENOMEM, "sim: out of memory");
    s->ntab = nt;
    for (uint32_t t = 0; t < nt; t++)
        if ((rc = make_table(s, t, nt)) != 0)
            return rc;
    return 0;
}

static int make_plan(struct sim *s)
{
    if (s->c->replay_order) {
        if (!(s->seq = dh__malloc(s->nsamp * sizeof(*s->seq))))
            return dh_err_set(s->e, DH_ENOMEM, "sim: out of memory");
        for (uint64_t i = 0; i < s->nsamp; i++)
            s->seq[i] = i;
        return 0;
    }

    struct dh_plan_opts o;
    uint32_t *tok = dh__malloc(s->nsamp * sizeof(*tok));
    uint16_t *prof = dh__malloc(s->nsamp * sizeof(*prof));
    int rc = DH_ENOMEM;

    if (!tok || !prof) {
        dh_err_set(s->e, rc, "sim: out of memory");
        goto out_free;
    }
    for (uint64_t i = 0; i < s->nsamp; i++) {
        tok[i] = s->w->s[i].tokens;
        prof[i] = s->w->s[i].profile;
    }
    dh_plan_opts_init(&o);
    o.world_size = s->c->ranks;
    o.batch_size = s->c->batch;
    o.seed = s->c->seed;
    o.balance = s->sys == DH_SIM_DATAHELIX ? DH_BALANCE_FIXED : DH_BALANCE_NONE;
    rc = dh_plan_create(tok, prof, s->nsamp, &o, &s->plan, s->e);
out_free:
    dh__free(tok);
    dh__free(prof);
    return rc;
}

static int setup(struct sim *s)
{
    int rc;

    s->nsamp = dh_sim_samples_needed(s->c);
    s->nsteps = (uint64_t)s->c->steps + s->c->warmup;
    s->nbatch = s->nsteps * s->c->ranks;
    if ((rc = alloc_arrays(s)) != 0 || (rc = make_plan(s)) != 0)
        return rc;
    for (uint32_t r = 0; r < s->c->ranks; r++) {
        s->rk[r].consumed = -1;
        dh_window_init(&s->rk[r].w, 0.2);
    }
    if (s->sys == DH_SIM_NATIVE)
        layout_native(s);
    else if ((rc = layout_shared(s)) != 0)
        return rc;
    if (!s->c->tier2 || s->sys != DH_SIM_DATAHELIX)
        return 0;
    s->b_gpu = dh__calloc(s->nbatch, sizeof(*s->b_gpu));
    s->step_x = dh__calloc(s->nsteps, sizeof(*s->step_x));
    if (!s->b_gpu || !s->step_x)
        return dh_err_set(s->e, DH_ENOMEM, "sim: out of memory");
    return dh__sim_tier2(s->c, s->w, s->nsteps, batch_fn, s, s->b_gpu,
                         s->step_x, &s->t2, &s->cross_all, &s->cross_measured,
                         s->c->warmup, s->e);
}

static void teardown(struct sim *s)
{
    for (uint32_t i = 0; s->srv && i < s->nsrv; i++)
        dh__free(s->srv[i].q);
    for (uint32_t t = 0; s->tab && t < s->ntab; t++) {
        dh_place_destroy(s->tab[t].p);
        dh__free(s->tab[t].srv_of);
    }
    dh__free(s->tab);
    dh_plan_destroy(s->plan);
    dh__free(s->seq);
    dh__free(s->srv);
    dh__free(s->rk);
    dh__free(s->s_batch);
    dh__free(s->s_work);
    dh__free(s->s_start);
    dh__free(s->s_done);
    dh__free(s->b_left);
    dh__free(s->b_req);
    dh__free(s->b_ready);
    dh__free(s->step_start);
    dh__free(s->step_end);
    dh__free(s->wait);
    dh__free(s->b_gpu);
    dh__free(s->step_x);
    dh__sim_evq_fini(&s->q);
}

/* ---- metrics (paper Sec. 5.1) ---- */
static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;

    return (x > y) - (x < y);
}

/* Nearest-rank p95 of v[0..n) (sorts v). */
static double p95(double *v, uint64_t n)
{
    uint64_t k = (uint64_t)ceil(0.95 * (double)n);

    qsort(v, n, sizeof(*v), cmp_double);
    return v[k ? k - 1 : 0];
}

static void metrics(struct sim *s, struct dh_sim_metrics *m)
{
    const struct dh_sim_config *c = s->c;
    uint64_t nmeas = (uint64_t)c->steps * c->ranks, miss = 0, bad = 0;
    uint64_t b0 = (uint64_t)c->warmup * c->ranks;
    double t0 = c->warmup ? s->step_end[c->warmup - 1] : 0;
    double t1 = s->step_end[s->nsteps - 1];

    memset(m, 0, sizeof(*m));
    m->throughput = (double)nmeas * c->batch / ((t1 - t0) / 1000);
    for (uint64_t i = 0; i < nmeas; i++)
        miss += (uint64_t)dh_window_is_miss(s->wait[i], c->ddl_ms);
    m->ddl_miss_rate = (double)miss / (double)nmeas;
    m->input_wait_p95_s = p95(s->wait, nmeas) / 1000;
    for (uint64_t b = b0; b < s->nbatch; b++) /* reuse b_req as scratch */
        s->b_req[b - b0] = s->b_ready[b] - s->b_req[b];
    m->ready_p95_s = p95(s->b_req, nmeas) / 1000;
    for (uint64_t k = 0; k < c->steps; k++) /* and again for step times */
        s->b_req[k] = s->step_end[c->warmup + k] - s->step_start[c->warmup + k];
    m->step_p95_ms = p95(s->b_req, c->steps);
    m->step_p50_ms = s->b_req[(c->steps - 1) / 2]; /* sorted by p95() */
    m->tier2 = s->t2;
    m->cross_ds_gb_per_100_steps = (double)s->cross_measured / 1e9 * 100.0 /
                                   c->steps;
    for (uint64_t i = 0; i < s->nsamp; i++)
        bad += s->s_done[i] != 1;
    for (uint64_t b = 0; b < s->nbatch; b++)
        bad += s->b_left[b] != 0;
    m->conservation_errors = bad;
    m->cross_bytes = s->cross_all;
    m->events = s->events;
    m->sim_end_s = t1 / 1000;
}

int dh_sim_run(const struct dh_sim_config *c, const struct dh_sim_workload *w,
               enum dh_sim_system sys, struct dh_sim_metrics *out,
               struct dh_err *e)
{
    struct sim s;
    int rc;

    if ((unsigned)sys >= DH_SIM_NSYSTEMS)
        return dh_err_set(e, DH_EINVAL, "sim: unknown system %d", (int)sys);
    if ((rc = check_config(c, w, e)) != 0)
        return rc;
    memset(&s, 0, sizeof(s));
    s.c = c;
    s.w = w;
    s.sys = sys;
    s.e = e;
    dh__sim_evq_init(&s.q);
    if ((rc = setup(&s)) != 0)
        goto out;
    for (uint32_t p = 0; p < c->prefetch && p < s.nsteps; p++)
        for (uint32_t r = 0; r < c->ranks; r++)
            if ((rc = request_batch(&s, r, p)) != 0)
                goto out;
    if ((rc = dh__sim_evq_push(&s.q, 0, EV_STEP, 0, 0)) != 0 ||
        (rc = loop(&s)) != 0)
        goto out;
    metrics(&s, out);
out:
    if (rc == DH_ENOMEM && e && !e->code)
        dh_err_set(e, rc, "sim: out of memory");
    teardown(&s);
    return rc;
}
