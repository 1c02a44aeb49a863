/* test_inflight.c - the Coordinator's in-flight table: every API edge
 * (full table, duplicates, unknown ids, dead servers, overdue tasks), the
 * hash table against a reference model under churn, allocation-freedom
 * after create, and the "epoch exactly once" property at the logic level:
 * an epoch simulated over dying servers, re-routes, late duplicates and
 * restarts, fed through this table and the client's reorder buffer
 * (DESIGN.md 8, docs/exactly-once.md). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/alloc.h"
#include "datahelix/inflight.h"
#include "datahelix/reorder.h"
#include "datahelix/wire.h"

static struct dh_inflight *mk(size_t cap)
{
    struct dh_inflight *t = NULL;
    struct dh_err e;

    assert_int_equal(dh_inflight_create(cap, &t, &e), 0);
    return t;
}

static void add(struct dh_inflight *t, uint64_t id, uint32_t srv, uint64_t now)
{
    assert_int_equal(dh_inflight_add(t, id, srv, now, NULL), 0);
}

static int done(struct dh_inflight *t, uint64_t id, uint32_t srv)
{
    int first = -1;

    assert_int_equal(dh_inflight_done(t, id, srv, &first), 0);
    return first;
}

static void create_rejects_bad_args(void **state)
{
    struct dh_inflight *t = NULL;
    struct dh_err e;

    (void)state;
    assert_int_equal(dh_inflight_create(0, &t, &e), DH_EINVAL);
    assert_int_equal(e.code, DH_EINVAL);
    assert_int_equal(dh_inflight_create(DH_INFLIGHT_MAX_CAPACITY + 1ul, &t, &e),
                     DH_ETOOBIG);
    assert_int_equal(dh_inflight_create(4, NULL, NULL), DH_EINVAL);
    assert_null(t);
    for (long n = 0; n < 2; n++) {
        dh__alloc_fail_after(n);
        assert_int_equal(dh_inflight_create(4, &t, &e), DH_ENOMEM);
        dh__alloc_fail_reset();
        assert_null(t);
    }
    dh_inflight_destroy(NULL);
    assert_int_equal(dh_inflight_count(NULL), 0);
}

static void add_done_get(void **state)
{
    struct dh_inflight *t = mk(8);
    struct dh_inflight_info in;

    (void)state;
    add(t, 0, 3, 100); /* id 0 is a valid task id (pass 0, step 0, ...) */
    add(t, UINT64_MAX, 4, 101);
    assert_int_equal(dh_inflight_count(t), 2);
    assert_int_equal(dh_inflight_get(t, 0, &in), 0);
    assert_int_equal(in.server, 3);
    assert_int_equal(in.orphaned, 0);
    assert_int_equal(in.since_ms, 100);
    assert_int_equal(in.routes, 1);
    assert_int_equal(dh_inflight_get(t, 7, &in), DH_ENOTFOUND);
    /* A duplicate add is refused and changes nothing. */
    assert_int_equal(dh_inflight_add(t, 0, 9, 555, NULL), DH_EDUP);
    assert_int_equal(dh_inflight_get(t, 0, &in), 0);
    assert_int_equal(in.server, 3);
    /* First completion wins, from any server; later ones are duplicates. */
    assert_int_equal(done(t, 0, 8), 1);
    assert_int_equal(done(t, 0, 3), 0);
    assert_int_equal(done(t, 12345, 3), 0); /* never added */
    assert_int_equal(dh_inflight_count(t), 1);
    assert_int_equal(done(t, UINT64_MAX, 4), 1);
    assert_int_equal(dh_inflight_count(t), 0);
    assert_int_equal(dh_inflight_done(t, 1, 1, NULL), DH_EINVAL);
    assert_int_equal(dh_inflight_done(NULL, 1, 1, &(int){0}), DH_EINVAL);
    dh_inflight_destroy(t);
}

static void full_table_is_toobig(void **state)
{
    struct dh_inflight *t = mk(3);
    struct dh_err e;

    (void)state;
    add(t, 1, 1, 0);
    add(t, 2, 1, 0);
    add(t, 3, 1, 0);
    assert_int_equal(dh_inflight_add(t, 4, 1, 0, &e), DH_ETOOBIG);
    assert_int_equal(e.code, DH_ETOOBIG);
    assert_non_null(strstr(e.msg, "full"));
    /* A duplicate in a full table is still DH_EDUP. */
    assert_int_equal(dh_inflight_add(t, 2, 1, 0, NULL), DH_EDUP);
    assert_int_equal(done(t, 2, 1), 1);
    add(t, 4, 1, 0);
    assert_int_equal(dh_inflight_count(t), 3);
    dh_inflight_destroy(t);
}

static int has(const uint64_t *v, size_t n, uint64_t x)
{
    for (size_t i = 0; i < n; i++)
        if (v[i] == x)
            return 1;
    return 0;
}

static void server_dead_drains_and_reroutes(void **state)
{
    struct dh_inflight *t = mk(64);
    struct dh_inflight_info in;
    uint64_t got[64], buf[3];
    size_t n, total = 0;

    (void)state;
    for (uint64_t i = 0; i < 10; i++)
        add(t, i << 24, 1, 0); /* ids that differ only in the step field */
    for (uint64_t i = 10; i < 15; i++)
        add(t, i << 24, 2, 0);
    do { /* drain with a small buffer */
        assert_int_equal(dh_inflight_server_dead(t, 1, buf, 3, &n), 0);
        for (size_t k = 0; k < n; k++) {
            assert_false(has(got, total, buf[k]));
            got[total++] = buf[k];
        }
    } while (n == 3);
    assert_int_equal(total, 10);
    for (uint64_t i = 0; i < 10; i++) {
        assert_true(has(got, total, i << 24));
        assert_int_equal(dh_inflight_get(t, i << 24, &in), 0);
        assert_int_equal(in.orphaned, 1);
    }
    /* Orphans are not listed twice, nor as overdue. */
    assert_int_equal(dh_inflight_server_dead(t, 1, buf, 3, &n), 0);
    assert_int_equal(n, 0);
    assert_int_equal(dh_inflight_overdue(t, 1000, 10, got, 64, &n), 0);
    assert_int_equal(n, 5);
    /* Re-route: adopted by the new server, clock restarted, route counted. */
    assert_int_equal(dh_inflight_reroute(t, 0, 2, 50), 0);
    assert_int_equal(dh_inflight_get(t, 0, &in), 0);
    assert_int_equal(in.server, 2);
    assert_int_equal(in.orphaned, 0);
    assert_int_equal(in.since_ms, 50);
    assert_int_equal(in.routes, 2);
    assert_int_equal(dh_inflight_reroute(t, 999, 2, 50), DH_ENOTFOUND);
    /* Server 2 now holds 6 tasks; a zero cap lists nothing, marks nothing. */
    assert_int_equal(dh_inflight_server_dead(t, 2, NULL, 0, &n), 0);
    assert_int_equal(n, 0);
    assert_int_equal(dh_inflight_server_dead(t, 2, got, 64, &n), 0);
    assert_int_equal(n, 6);
    assert_int_equal(dh_inflight_count(t), 15);
    /* A "dead" server's late result still counts if it is the first. */
    assert_int_equal(done(t, 3ull << 24, 1), 1);
    assert_int_equal(dh_inflight_server_dead(t, 3, NULL, 1, &n), DH_EINVAL);
    dh_inflight_destroy(t);
}

static void overdue_lists_old_tasks(void **state)
{
    struct dh_inflight *t = mk(16);
    uint64_t out[16];
    size_t n;

    (void)state;
    add(t, 1, 1, 100);
    add(t, 2, 1, 200);
    add(t, 3, 2, 300);
    add(t, 4, 2, 5000); /* clock "in the future": never overdue */
    assert_int_equal(dh_inflight_overdue(t, 300, 100, out, 16, &n), 0);
    assert_int_equal(n, 2);
    assert_true(has(out, n, 1) && has(out, n, 2));
    assert_int_equal(dh_inflight_overdue(t, 300, 0, out, 16, &n), 0);
    assert_int_equal(n, 3);
    /* A short buffer: listing changes nothing; re-routing moves on. */
    assert_int_equal(dh_inflight_overdue(t, 1000, 100, out, 1, &n), 0);
    assert_int_equal(n, 1);
    assert_int_equal(dh_inflight_reroute(t, out[0], 3, 1000), 0);
    assert_int_equal(dh_inflight_overdue(t, 1000, 100, out, 16, &n), 0);
    assert_int_equal(n, 2);
    assert_int_equal(dh_inflight_overdue(NULL, 0, 0, out, 16, &n), DH_EINVAL);
    dh_inflight_destroy(t);
}

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 2685821657736338717ull;
}

/* Random add / done / reroute against a plain array model, with ids from a
 * small clustered set so runs collide and deletions shift entries back. */
static void matches_model_under_churn(void **state)
{
    enum { CAP = 37, IDS = 64 };
    struct dh_inflight *t = mk(CAP);
    int in[IDS] = {0};
    uint32_t srv[IDS];
    size_t count = 0;
    uint64_t s = 0x9e3779b97f4a7c15ull;

    (void)state;
    for (int it = 0; it < 200000; it++) {
        int k = (int)(rng_next(&s) % IDS);
        uint64_t id = (uint64_t)k << 8; /* only the rank field varies */
        int op = (int)(rng_next(&s) % 3);
        struct dh_inflight_info info;

        if (op == 0) {
            int rc = dh_inflight_add(t, id, (uint32_t)it, 0, NULL);
            int want = in[k] ? DH_EDUP : count == CAP ? DH_ETOOBIG : 0;

            assert_int_equal(rc, want);
            if (rc == 0) {
                in[k] = 1;
                srv[k] = (uint32_t)it;
                count++;
            }
        } else if (op == 1) {
            assert_int_equal(done(t, id, 0), in[k]);
            count -= (size_t)in[k];
            in[k] = 0;
        } else {
            int rc = dh_inflight_reroute(t, id, (uint32_t)it, 0);

            assert_int_equal(rc, in[k] ? 0 : DH_ENOTFOUND);
            if (rc == 0)
                srv[k] = (uint32_t)it;
        }
        assert_int_equal(dh_inflight_count(t), count);
        if (it % 97 == 0)
            for (int j = 0; j < IDS; j++) {
                int rc = dh_inflight_get(t, (uint64_t)j << 8, &info);

                assert_int_equal(rc, in[j] ? 0 : DH_ENOTFOUND);
                if (in[j])
                    assert_int_equal(info.server, srv[j]);
            }
    }
    dh_inflight_destroy(t);
}

static void never_allocates_after_create(void **state)
{
    struct dh_inflight *t = mk(32);
    uint64_t out[32];
    size_t n;

    (void)state;
    dh__alloc_fail_after(0);
    for (uint64_t i = 0; i < 32; i++)
        add(t, i, (uint32_t)(i % 4), i);
    assert_int_equal(dh_inflight_server_dead(t, 1, out, 32, &n), 0);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(dh_inflight_reroute(t, out[i], 2, 100), 0);
    assert_int_equal(dh_inflight_overdue(t, 100, 10, out, 32, &n), 0);
    for (uint64_t i = 0; i < 32; i++)
        assert_int_equal(done(t, i, 0), 1);
    assert_int_equal(dh__alloc_failures(), 0);
    dh__alloc_fail_reset();
    dh_inflight_destroy(t);
}

/* ---- the epoch-exactly-once property ----
 *
 * One Coordinator table, R ranks each with its reorder buffer, servers that
 * die (their tasks re-routed), zombies (a dead server's executions, which
 * later complete or vanish), speculative re-routes of overdue tasks,
 * worker errors, Coordinator restarts (table refilled from the clients'
 * pending lists) and local DataServer restarts (its in-progress work lost,
 * the client re-issues its pending tasks).  Every completion goes through
 * dh_inflight_done() and then dh_reorder_arrive() / _fail(), as the
 * Coordinator and the client would see it. */

enum { MAXR = 3, MAXS = 32, EPOCH = 7 };
enum pstate { P_HELD, P_DELIVERED, P_RELEASED };

struct exec {
    uint64_t id;
    uint32_t server;
};

struct sim {
    uint64_t rng, now;
    struct dh_inflight *t;
    struct dh_reorder *rb[MAXR];
    int nranks;
    uint32_t steps, issued[MAXR], delivered[MAXR];
    size_t depth;
    int alive[MAXS];
    uint32_t nservers; /* ids 0..nservers-1 used so far */
    struct exec *ex;
    size_t nex, capex;
    unsigned char *pay; /* enum pstate per payload */
    size_t npay, cappay;
    long dups, deaths, reroutes, fails, crestarts, lrestarts, zombies_done;
};

static uint32_t rnd(struct sim *s, uint32_t n)
{
    return (uint32_t)(rng_next(&s->rng) % n);
}

static uint64_t task_of(int rank, uint32_t step)
{
    uint64_t id;

    assert_int_equal(dh_wire_task_id(EPOCH, step, (uint64_t)rank, 0, &id, NULL),
                     0);
    return id;
}

static uint32_t pick_alive(struct sim *s, uint32_t avoid)
{
    uint32_t cand[MAXS], n = 0;

    for (uint32_t i = 0; i < s->nservers; i++)
        if (s->alive[i] && i != avoid)
            cand[n++] = i;
    if (n == 0)
        return avoid; /* only `avoid` is alive */
    return cand[rnd(s, n)];
}

static void push_exec(struct sim *s, uint64_t id, uint32_t server)
{
    if (s->nex == s->capex) {
        s->capex = s->capex ? 2 * s->capex : 64;
        void *p = realloc(s->ex, s->capex * sizeof(*s->ex));

        assert_non_null(p);
        s->ex = p;
    }
    s->ex[s->nex++] = (struct exec){id, server};
}

static uint64_t new_payload(struct sim *s)
{
    if (s->npay == s->cappay) {
        s->cappay = s->cappay ? 2 * s->cappay : 256;
        void *p = realloc(s->pay, s->cappay);

        assert_non_null(p);
        s->pay = p;
    }
    s->pay[s->npay] = P_HELD;
    return s->npay++;
}

static void issue(struct sim *s, int r)
{
    while (dh_reorder_count(s->rb[r]) < s->depth && s->issued[r] < s->steps) {
        uint64_t id = task_of(r, s->issued[r]++);
        uint32_t srv = pick_alive(s, UINT32_MAX);

        assert_int_equal(dh_reorder_expect(s->rb[r], id), 0);
        add(s->t, id, srv, s->now);
        push_exec(s, id, srv);
    }
    if (s->issued[r] < s->steps) /* the window is the bound */
        assert_int_equal(dh_reorder_expect(s->rb[r], task_of(r, s->issued[r])),
                         DH_ETOOBIG);
}

static void complete_one(struct sim *s)
{
    struct dh_wire_task w;
    struct exec x;
    int first, accepted;
    size_t k;

    if (s->nex == 0)
        return;
    k = rnd(s, (uint32_t)s->nex);
    x = s->ex[k];
    s->ex[k] = s->ex[--s->nex];
    if (!s->alive[x.server] && rnd(s, 2)) /* a zombie that never answers */
        return;
    s->zombies_done += !s->alive[x.server];
    dh_wire_task_split(x.id, &w);
    assert_int_equal(dh_inflight_done(s->t, x.id, x.server, &first), 0);
    if (rnd(s, 25) == 0) { /* a worker error instead of a result */
        int rc = dh_reorder_fail(s->rb[w.rank], x.id, DH_EMEDIA);

        if (first) {
            assert_int_equal(rc, 0);
            s->fails++;
        } else {
            assert_true(rc == DH_EDUP || rc == DH_ENOTFOUND);
        }
        return;
    }
    uint64_t p = new_payload(s);

    assert_int_equal(dh_reorder_arrive(s->rb[w.rank], x.id, p, &accepted), 0);
    /* The Coordinator and the client agree on which result is first. */
    assert_int_equal(accepted, first);
    if (!accepted) { /* the caller releases a duplicate: exactly once */
        assert_int_equal(s->pay[p], P_HELD);
        s->pay[p] = P_RELEASED;
        s->dups++;
    }
}

static void consume(struct sim *s, int r)
{
    uint64_t id, p;
    int rc;

    while ((rc = dh_reorder_next(s->rb[r], &id, &p)) != DH_EEMPTY) {
        assert_true(s->delivered[r] < s->steps);
        /* Request order, each task once. */
        assert_int_equal(id, task_of(r, s->delivered[r]));
        s->delivered[r]++;
        if (rc == 0) {
            assert_true(p < s->npay);
            assert_int_equal(s->pay[p], P_HELD);
            s->pay[p] = P_DELIVERED;
        } else {
            assert_int_equal(rc, DH_EMEDIA);
        }
    }
    issue(s, r);
}

static void reroute_to_alive(struct sim *s, uint64_t id, uint32_t avoid)
{
    uint32_t srv = pick_alive(s, avoid);

    assert_int_equal(dh_inflight_reroute(s->t, id, srv, s->now), 0);
    push_exec(s, id, srv);
    s->reroutes++;
}

static void kill_server(struct sim *s)
{
    uint32_t victim = pick_alive(s, UINT32_MAX), alive = 0;
    uint64_t buf[4];
    size_t n, rounds = 0;

    for (uint32_t i = 0; i < s->nservers; i++)
        alive += (uint32_t)s->alive[i];
    if (alive < 2)
        return;
    s->alive[victim] = 0;
    s->deaths++;
    if (s->nservers < MAXS && rnd(s, 2))
        s->alive[s->nservers++] = 1; /* a replacement joins */
    do { /* its executions stay in s->ex as zombies */
        assert_int_equal(dh_inflight_server_dead(s->t, victim, buf, 4, &n), 0);
        for (size_t i = 0; i < n; i++)
            reroute_to_alive(s, buf[i], victim);
        assert_true(++rounds <= s->depth * (size_t)s->nranks);
    } while (n == 4);
}

static void speculate_overdue(struct sim *s)
{
    uint64_t buf[8];
    size_t n;

    s->now += rnd(s, 50);
    assert_int_equal(dh_inflight_overdue(s->t, s->now, 100, buf, 8, &n), 0);
    for (size_t i = 0; i < n; i++) {
        struct dh_inflight_info in;

        assert_int_equal(dh_inflight_get(s->t, buf[i], &in), 0);
        reroute_to_alive(s, buf[i], in.server); /* old one keeps running */
    }
}

static void restart_coordinator(struct sim *s)
{
    uint64_t buf[64];
    size_t n;

    dh_inflight_destroy(s->t);
    s->t = mk(s->depth * (size_t)s->nranks);
    for (int r = 0; r < s->nranks; r++) {
        assert_int_equal(dh_reorder_pending(s->rb[r], buf, 64, &n), 0);
        for (size_t i = 0; i < n; i++) {
            uint32_t srv = pick_alive(s, UINT32_MAX);

            add(s->t, buf[i], srv, s->now);
            push_exec(s, buf[i], srv);
        }
    }
    s->crestarts++;
}

static void restart_local(struct sim *s, int r)
{
    uint64_t buf[64];
    size_t n, k = 0;

    for (size_t i = 0; i < s->nex; i++) { /* its work in progress is lost */
        struct dh_wire_task w;

        dh_wire_task_split(s->ex[i].id, &w);
        if ((int)w.rank != r)
            s->ex[k++] = s->ex[i];
    }
    s->nex = k;
    assert_int_equal(dh_reorder_pending(s->rb[r], buf, 64, &n), 0);
    for (size_t i = 0; i < n; i++)
        reroute_to_alive(s, buf[i], UINT32_MAX);
    s->lrestarts++;
}

/* Nothing lost: every task a client still waits for is in the table, on a
 * live server (not orphaned), so some execution will answer it. */
static void check_all_routed(const struct sim *s)
{
    uint64_t buf[64];
    size_t n;

    for (int r = 0; r < s->nranks; r++) {
        assert_int_equal(dh_reorder_pending(s->rb[r], buf, 64, &n), 0);
        for (size_t i = 0; i < n; i++) {
            struct dh_inflight_info in;

            assert_int_equal(dh_inflight_get(s->t, buf[i], &in), 0);
            assert_int_equal(in.orphaned, 0);
            assert_true(in.server < s->nservers && s->alive[in.server]);
        }
    }
}

/* Tasks returned by next() so far, all ranks. */
static uint64_t progress(const struct sim *s)
{
    uint64_t n = 0;

    for (int r = 0; r < s->nranks; r++)
        n += s->delivered[r];
    return n;
}

static void run_epoch(struct sim *s, uint64_t seed)
{
    long idle = 0;
    uint64_t seen = 0;

    memset(s, 0, sizeof(*s));
    s->rng = seed * 0x9e3779b97f4a7c15ull + 1;
    s->nranks = 1 + (int)rnd(s, MAXR);
    s->steps = 20 + rnd(s, 300);
    s->depth = 1 + rnd(s, 16);
    s->nservers = 1 + rnd(s, 6);
    for (uint32_t i = 0; i < s->nservers; i++)
        s->alive[i] = 1;
    s->t = mk(s->depth * (size_t)s->nranks);
    for (int r = 0; r < s->nranks; r++) {
        struct dh_err e;

        assert_int_equal(dh_reorder_create(s->depth, &s->rb[r], &e), 0);
        issue(s, r);
    }
    while (progress(s) < (uint64_t)s->nranks * s->steps) {
        uint32_t ev = rnd(s, 1000);

        /* A lost task would stall the epoch: fail instead of hanging. */
        idle = progress(s) == seen ? idle + 1 : 0;
        seen = progress(s);
        assert_true(idle < 100000);
        if (ev < 600)
            complete_one(s);
        else if (ev < 850)
            consume(s, (int)rnd(s, (uint32_t)s->nranks));
        else if (ev < 880)
            kill_server(s);
        else if (ev < 960)
            speculate_overdue(s);
        else if (ev < 965)
            restart_coordinator(s);
        else if (ev < 970)
            restart_local(s, (int)rnd(s, (uint32_t)s->nranks));
        else
            s->now++;
        check_all_routed(s);
    }
    /* Drain the zombies and duplicates still out there: all are released. */
    while (s->nex)
        complete_one(s);
    assert_int_equal(dh_inflight_count(s->t), 0);
    for (size_t p = 0; p < s->npay; p++)
        assert_int_not_equal(s->pay[p], P_HELD); /* nothing leaked */
    for (int r = 0; r < s->nranks; r++) {
        assert_int_equal(dh_reorder_count(s->rb[r]), 0);
        dh_reorder_destroy(s->rb[r]);
    }
    dh_inflight_destroy(s->t);
    free(s->ex);
    free(s->pay);
}

static void epoch_exactly_once(void **state)
{
    struct sim s;
    long dups = 0, deaths = 0, reroutes = 0, fails = 0, cr = 0, lr = 0, zd = 0;

    (void)state;
    for (uint64_t seed = 1; seed <= 300; seed++) {
        run_epoch(&s, seed);
        dups += s.dups;
        deaths += s.deaths;
        reroutes += s.reroutes;
        fails += s.fails;
        cr += s.crestarts;
        lr += s.lrestarts;
        zd += s.zombies_done;
    }
    /* The scenarios really happened (else the property is vacuous). */
    assert_true(dups > 100);
    assert_true(deaths > 50);
    assert_true(reroutes > 100);
    assert_true(fails > 50);
    assert_true(cr > 10 && lr > 10);
    assert_true(zd > 50);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(create_rejects_bad_args),
        cmocka_unit_test(add_done_get),
        cmocka_unit_test(full_table_is_toobig),
        cmocka_unit_test(server_dead_drains_and_reroutes),
        cmocka_unit_test(overdue_lists_old_tasks),
        cmocka_unit_test(matches_model_under_churn),
        cmocka_unit_test(never_allocates_after_create),
        cmocka_unit_test(epoch_exactly_once),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
