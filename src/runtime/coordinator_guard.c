/*
 * coordinator_guard.c - what the Coordinator checks before it believes a
 * peer (docs/wire-protocol.md "Authorization" and "Bounds"; issue 13
 * items 2 and 3): per-peer message rates, the rank claims (which client
 * and which local DataServer speak for a rank, proved by the rank's
 * token), and the rate-limited log line of every refusal.
 *
 * Design: peers are ZeroMQ routing ids, so the rate table is a small
 * open-addressed hash of them (fixed size, no allocation after create);
 * a peer that is not in it takes a free entry of its probe window or the
 * least recently seen one, so a flood of new peers costs them their own
 * budget, never the Coordinator memory.  Rank claims live in a table
 * indexed by rank, allocated on a rank's first registration and bounded
 * by max_clients.
 *
 * Locking: none (see coordinator_internal.h).
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/log.h"
#include "core/alloc.h"
#include "core/clock.h"
#include "runtime/coordinator_internal.h"
#include "runtime/keys.h"

#define RATE_SLOTS 4096u /* peers tracked at once (a power of two) */
#define RATE_PROBE 8u    /* entries tried per lookup */
#define LOG_PER_S 20u    /* refusal / malformed lines per second, at most */

struct co_rate {
    struct co_peer peer;
    double tokens;
    uint64_t last_ms;
};

int dh__co_guard_init(struct dh_coordinator *c, struct dh_err *e)
{
    c->rates = dh__calloc(RATE_SLOTS, sizeof(*c->rates));
    c->ranks = dh__calloc(DH_WIRE_MAX_RANKS, sizeof(*c->ranks));
    if (!c->rates || !c->ranks)
        return dh_err_set(e, DH_ENOMEM, "coordinator: out of memory");
    return 0;
}

void dh__co_guard_fini(struct dh_coordinator *c)
{
    for (size_t i = 0; c->ranks && i < DH_WIRE_MAX_RANKS; i++)
        dh__free(c->ranks[i]);
    dh__free(c->ranks);
    dh__free(c->rates);
}

/* ---- rate caps ---- */

static uint32_t peer_hash(const struct co_peer *p)
{
    uint32_t h = 2166136261u; /* FNV-1a */

    for (size_t i = 0; i < p->len; i++)
        h = (h ^ p->id[i]) * 16777619u;
    return h;
}

int dh__co_rate_ok(struct dh_coordinator *c, const struct co_peer *from,
                   uint64_t now)
{
    uint32_t h = peer_hash(from);
    struct co_rate *r = NULL, *old = NULL;
    double burst = (double)c->peer_rate;

    if (c->peer_rate <= 0)
        return 1;
    for (uint32_t k = 0; k < RATE_PROBE && !r; k++) {
        struct co_rate *x = &c->rates[(h + k) & (RATE_SLOTS - 1)];

        if (x->peer.len && dh__co_same_peer(&x->peer, from))
            r = x;
        else if (!x->peer.len) /* a free entry beats any used one */
            old = old && !old->peer.len ? old : x;
        else if (!old || (old->peer.len && x->last_ms < old->last_ms))
            old = x;
    }
    if (!r) { /* a new peer (or one evicted): a full bucket */
        r = old;
        r->peer = *from;
        r->tokens = burst;
        r->last_ms = now;
    }
    r->tokens += (double)(now - r->last_ms) * (double)c->peer_rate / 1000.0;
    if (r->tokens > burst)
        r->tokens = burst;
    r->last_ms = now;
    if (r->tokens < 1.0)
        return 0;
    r->tokens -= 1.0;
    return 1;
}

/* ---- logging ---- */

/* 1: this line may be written.  At most LOG_PER_S a second; the first
 * line of a new second says how many were suppressed before it. */
static int log_allowed(struct dh_coordinator *c, uint64_t now)
{
    if (now - c->log_window_ms >= 1000) {
        if (c->log_suppressed)
            dh__log(DH_LOG_WARN,
                    "coordinator: %llu refusal / malformed lines "
                    "suppressed (counted in the stats)",
                    (unsigned long long)c->log_suppressed);
        c->log_window_ms = now;
        c->log_lines = 0;
        c->log_suppressed = 0;
    }
    if (c->log_lines >= LOG_PER_S) {
        c->log_suppressed++;
        return 0;
    }
    c->log_lines++;
    return 1;
}

void dh__co_logf(struct dh_coordinator *c, const char *fmt, ...)
{
    va_list ap;

    if (!log_allowed(c, dh__mono_ms()))
        return;
    va_start(ap, fmt);
    dh__vlog(DH_LOG_WARN, fmt, ap);
    va_end(ap);
}

void dh__co_refused(struct dh_coordinator *c, const struct co_peer *from,
                    const char *fmt, ...)
{
    char who[128], why[DH_ERR_MSG_MAX];
    va_list ap;

    CO_INC(c, refused);
    if (!log_allowed(c, dh__mono_ms()))
        return;
    va_start(ap, fmt);
    vsnprintf(why, sizeof(why), fmt, ap);
    va_end(ap);
    dh__co_peer_name(c->cur_addr, from, who, sizeof(who));
    dh__log(DH_LOG_WARN, "coordinator: refused %s from %s: %s",
            c->cur_type ? c->cur_type : "message", who, why);
}

/* ---- rank claims ---- */

int dh__co_claim_live(const struct dh_coordinator *c, uint32_t rank,
                      uint64_t now)
{
    const struct co_rank *r = rank < DH_WIRE_MAX_RANKS ? c->ranks[rank] : NULL;

    return r && r->token[0] &&
           (c->rank_local[rank] >= 0 ||
            now - r->seen_ms < (uint64_t)c->claim_timeout_ms);
}

/* Frees one lapsed claim that holds no task, so that ranks that came and
 * went (or strangers that stopped) never fill the table for good; 1 if
 * one was freed.  A scan of every rank, only when the table is full. */
static int reclaim(struct dh_coordinator *c, uint64_t now)
{
    for (uint32_t i = 0; i < DH_WIRE_MAX_RANKS; i++) {
        struct co_rank *r = c->ranks[i];

        if (!r || r->tasks || dh__co_claim_live(c, i, now))
            continue;
        if (r->has_client)
            atomic_fetch_sub(&c->st_clients, 1);
        dh__free(r);
        c->ranks[i] = NULL;
        c->n_ranks--;
        return 1;
    }
    return 0;
}

struct co_rank *dh__co_claim(struct dh_coordinator *c, uint32_t rank,
                             const char *token, uint64_t now, const char **why)
{
    struct co_rank *r;

    *why = NULL;
    if (rank >= DH_WIRE_MAX_RANKS) {
        *why = "rank out of range";
        return NULL;
    }
    if (!token[0]) {
        *why = "no rank token (every client and local DataServer carries "
               "its rank's token)";
        return NULL;
    }
    r = c->ranks[rank];
    if (r && dh__co_claim_live(c, rank, now)) {
        if (!dh__secret_eq(r->token, token)) {
            *why = "the rank is held by a live client whose token differs";
            return NULL;
        }
        r->seen_ms = now;
        return r;
    }
    if (!r) {
        if (c->n_ranks >= (size_t)c->max_clients && !reclaim(c, now)) {
            *why = "client registry full";
            return NULL;
        }
        if (!(r = dh__calloc(1, sizeof(*r)))) {
            *why = "out of memory";
            return NULL;
        }
        c->ranks[rank] = r;
        c->n_ranks++;
    }
    /* A free or lapsed claim: whoever proves a token now holds the rank. */
    snprintf(r->token, sizeof(r->token), "%s", token);
    r->seen_ms = now;
    return r;
}

struct co_rank *dh__co_client_of(const struct dh_coordinator *c, uint32_t rank,
                                 const struct co_peer *from)
{
    struct co_rank *r = rank < DH_WIRE_MAX_RANKS ? c->ranks[rank] : NULL;

    return r && r->has_client && dh__co_same_peer(&r->client, from) ? r : NULL;
}
