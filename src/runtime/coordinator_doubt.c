/*
 * coordinator_doubt.c - remote servers are not taken at their word
 * (issue 36 item 2; docs/security.md "Sidecars checked").  A sidecar
 * holds the job's key, so it can register, take tasks and answer them;
 * what it says about a sample, and whether it answers at all, is checked:
 *
 *   - A remote's verdict against a sample - an ErrorNotice, or a result
 *     whose substitutions say its samples failed - never reaches the
 *     client as is: the task goes once to its rank's local server (the
 *     process the rank trusts: it started it), whose answer is final.  A
 *     result's slot is given back first.  A remote that said "failed" for
 *     a task the local server then prepared gets a strike.
 *   - A task on a live remote that neither answers nor is declared dead
 *     (it heartbeats, and keeps its tasks) is re-routed to the local
 *     server once it has run opts.overdue_ms and then either
 *     CO_OVERDUE_FACTOR x its predicted time or until its deadline,
 *     whichever comes first: speculative, the first result wins
 *     (docs/exactly-once.md).  A strike too.
 *   - CO_DEMOTE_STRIKES strikes demote the server: it is reported, and
 *     placement sends it no new task (they go to the rank's local server).
 *
 * Pure Coordinator state; sends only through the routing helpers.
 */
#include <math.h>
#include <stdio.h>

#include "core/log.h"
#include "runtime/coordinator_internal.h"

#define CO_OVERDUE_FACTOR 4
#define CO_DEMOTE_STRIKES 3

/* The remote task t runs on, if it still runs there: its slot, else -1. */
static int32_t on_remote(const struct dh_coordinator *c,
                         const struct co_task *t)
{
    const struct co_server *s;

    if (t->state != CO_RUNNING || t->server < 0)
        return -1;
    s = &c->servers[t->server];
    return s->used && s->gen == t->server_gen && s->role == DH_WIRE_ROLE_REMOTE
               ? t->server
               : -1;
}

static void strike(struct dh_coordinator *c, int32_t slot, uint64_t gen,
                   const char *what)
{
    struct co_server *s = slot >= 0 ? &c->servers[slot] : NULL;

    if (!s || !s->used || s->gen != gen)
        return;
    s->strikes++;
    if (s->demoted || s->strikes < CO_DEMOTE_STRIKES)
        return;
    s->demoted = 1;
    CO_INC(c, demoted);
    dh__log(DH_LOG_WARN,
            "coordinator: server %u (%s) demoted: %u of its answers were out "
            "of line (the last: %s); no new task goes to it",
            s->wire_id, s->addr, s->strikes, what);
}

int dh__co_demoted(const struct dh_coordinator *c, int32_t slot)
{
    return slot >= 0 && c->servers[slot].used && c->servers[slot].demoted;
}

int dh__co_doubt(struct dh_coordinator *c, struct co_task *t,
                 const struct co_peer *from, int32_t from_slot,
                 const struct dh_wire_msg *m, uint64_t now)
{
    int is_result = m->type == DH_WIRE_RESULT_NOTICE;
    int32_t slot = t ? on_remote(c, t) : -1;
    char said[160];

    /* An error is the remote's own word; a result with substitutions
     * comes through the rank's local server, which placed its payload
     * (that server's own errors - its arena - are its own word). */
    if (slot < 0 || t->doubted || (is_result && m->u.result.n_subs == 0) ||
        (!is_result && from_slot != slot))
        return 0;
    if (is_result)
        snprintf(said, sizeof(said), "%u of its samples failed (sample %llu)",
                 m->u.result.n_subs,
                 (unsigned long long)m->u.result.sub_failed[0]);
    else
        snprintf(said, sizeof(said), "sample %llu failed: %.100s",
                 (unsigned long long)m->u.error.sample_id, m->u.error.message);
    t->doubted = 1;
    t->doubt_slot = slot;
    t->doubt_gen = t->server_gen;
    CO_INC(c, rechecked);
    dh__log(DH_LOG_WARN,
            "coordinator: remote server %u says task %llu of rank %u: %s; "
            "checking it on the rank's local server before the client hears "
            "of it",
            c->servers[slot].wire_id, (unsigned long long)t->req.task.id,
            t->req.requester_rank, said);
    if (is_result) /* the local server's slot: given back */
        dh__co_send_release(c, from, &m->u.result);
    dh__co_to_local(c, t, now);
    dh__co_drain(c, now);
    return 1;
}

void dh__co_doubt_settled(struct dh_coordinator *c, const struct co_task *t,
                          const struct dh_wire_msg *m)
{
    char what[96];

    if (!t->doubted || m->type != DH_WIRE_RESULT_NOTICE ||
        m->u.result.n_subs > 0)
        return; /* the local server agreed, or never answered */
    snprintf(what, sizeof(what),
             "task %llu failed there, and its rank's local server prepared "
             "it",
             (unsigned long long)t->req.task.id);
    strike(c, t->doubt_slot, t->doubt_gen, what);
}

void dh__co_overdue(struct dh_coordinator *c, uint64_t now)
{
    struct co_task **p;
    size_t pos = 0, n = 0;
    char what[96];

    while ((p = dh__idmap_next(&c->tasks, &pos, NULL))) {
        struct co_task *t = *p;
        int32_t slot = on_remote(c, t);
        uint64_t ran = now - t->since_ms;
        uint64_t due = t->arrived_ms +
                       (t->req.slack_ms > 0 ? (uint64_t)t->req.slack_ms : 0);

        /* at least overdue_ms, then until 4 x predicted or the deadline,
         * whichever comes first */
        if (slot < 0 || ran < (uint64_t)c->overdue_ms ||
            ((double)ran < CO_OVERDUE_FACTOR * t->work_ms && now < due))
            continue;
        dh__log(DH_LOG_WARN,
                "coordinator: task %llu of rank %u has run %llu ms on live "
                "server %u without an answer (predicted %.0f ms): "
                "re-routing it to the rank's local server",
                (unsigned long long)t->req.task.id, t->req.requester_rank,
                (unsigned long long)(now - t->since_ms),
                c->servers[slot].wire_id, t->work_ms);
        snprintf(what, sizeof(what), "task %llu overdue",
                 (unsigned long long)t->req.task.id);
        strike(c, slot, t->server_gen, what);
        CO_INC(c, overdue);
        dh__co_to_local(c, t, now);
        n++;
    }
    if (n)
        dh__co_drain(c, now);
}
