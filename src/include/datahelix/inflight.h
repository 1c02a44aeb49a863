/*
 * datahelix/inflight.h - the Coordinator's in-flight table: which DataServer
 * runs each outstanding task (DESIGN.md 8 "Exactly once = at-least-once
 * delivery + idempotent consumption"; docs/exactly-once.md).
 *
 * Design notes:
 *   - Keyed by the task id of dh_wire_task_id() (any u64, 0 included): an
 *     open-addressing hash table with linear probing and backward-shift
 *     deletion (no tombstones), load factor <= 1/2.  add / done / reroute /
 *     get are O(1) on average; server_dead and overdue scan the table
 *     (O(capacity)) and are meant for the rare heartbeat-timeout path.
 *   - Bounded: at most `capacity` tasks; one more is DH_ETOOBIG.  All memory
 *     is taken by dh_inflight_create(); no other call allocates.
 *   - The first completion of a task removes it (`first` = 1), whichever
 *     server sent it (a "dead" server's late result counts if it is first).
 *     Any later completion of the same id finds nothing (`first` = 0): the
 *     caller releases that payload.  The table keeps no history, so a
 *     completion for an id that was never added also reads `first` = 0.
 *   - A task of a dead server is "orphaned" until dh_inflight_reroute()
 *     gives it a new server: it is listed once by dh_inflight_server_dead()
 *     and never by dh_inflight_overdue().
 *   - Pure logic: no I/O, no clock (callers pass now_ms), no threads.
 *
 * Server ids are any uint32_t the caller chooses (wire server_id or a
 * placement slot id).
 *
 * Thread-safety: none.  The Coordinator's event loop owns a table and
 * serializes every call on it; distinct tables are independent.
 */
#ifndef DATAHELIX_INFLIGHT_H
#define DATAHELIX_INFLIGHT_H

#include <stddef.h>
#include <stdint.h>

#include "datahelix/error.h"

/* Largest capacity dh_inflight_create() accepts. */
#define DH_INFLIGHT_MAX_CAPACITY (1u << 24)

struct dh_inflight; /* opaque */

/* What the table knows about one task (dh_inflight_get()). */
struct dh_inflight_info {
    uint32_t server;   /* current (or, if orphaned, last) server */
    int orphaned;      /* 1: its server died, waiting for a reroute */
    uint64_t since_ms; /* now_ms of the last add / reroute */
    uint32_t routes;   /* 1 + number of reroutes */
};

/*
 * Creates a table for up to `capacity` tasks (1..DH_INFLIGHT_MAX_CAPACITY,
 * else DH_EINVAL / DH_ETOOBIG).  DH_ENOMEM if allocation fails.  On success
 * *out owns the table (dh_inflight_destroy()); on error *out is untouched.
 */
int dh_inflight_create(size_t capacity, struct dh_inflight **out,
                       struct dh_err *e) DH_MUST_CHECK;

/* Frees the table.  Accepts NULL. */
void dh_inflight_destroy(struct dh_inflight *t);

/*
 * Records that `task_id` now runs on `server`, started at now_ms.
 * DH_EDUP if the id is already in flight (the entry is unchanged);
 * DH_ETOOBIG if the table holds `capacity` tasks.
 */
int dh_inflight_add(struct dh_inflight *t, uint64_t task_id, uint32_t server,
                    uint64_t now_ms, struct dh_err *e) DH_MUST_CHECK;

/*
 * A completion (result or error) of `task_id` reported by `server`.
 * *first = 1 if the task was in flight: it is removed and this completion
 * is the one to keep.  *first = 0 if it is not in flight: a late duplicate
 * (or an unknown id) whose payload the caller releases.  `server` need not
 * be the task's current server.  DH_EINVAL if t or first is NULL.
 */
int dh_inflight_done(struct dh_inflight *t, uint64_t task_id, uint32_t server,
                     int *first) DH_MUST_CHECK;

/*
 * `server` was declared dead: writes the ids of up to `cap` of the
 * non-orphaned tasks it holds into out_tasks, marks exactly those orphaned
 * and sets *n to their number.  If *n == cap, call again: marked tasks are
 * not listed twice, so repeated calls drain the list (*n < cap ends it).
 * Each listed task must be given a new server with dh_inflight_reroute().
 */
int dh_inflight_server_dead(struct dh_inflight *t, uint32_t server,
                            uint64_t *out_tasks, size_t cap,
                            size_t *n) DH_MUST_CHECK;

/*
 * Moves `task_id` (orphaned or not: a speculative re-route of an overdue
 * task is fine) to `new_server`, restarts its clock at now_ms and counts
 * the route.  DH_ENOTFOUND if it is not in flight (it completed meanwhile:
 * nothing to do).
 */
int dh_inflight_reroute(struct dh_inflight *t, uint64_t task_id,
                        uint32_t new_server, uint64_t now_ms) DH_MUST_CHECK;

/*
 * Lists up to `cap` non-orphaned tasks whose clock is at least timeout_ms
 * old at now_ms (a clock in the future is not overdue).  Changes nothing:
 * re-routing a listed task restarts its clock, so with *n == cap a later
 * call lists the others.
 */
int dh_inflight_overdue(const struct dh_inflight *t, uint64_t now_ms,
                        uint64_t timeout_ms, uint64_t *out, size_t cap,
                        size_t *n) DH_MUST_CHECK;

/* Fills *out for an in-flight task; DH_ENOTFOUND (and *out untouched) if
 * it is not in flight. */
int dh_inflight_get(const struct dh_inflight *t, uint64_t task_id,
                    struct dh_inflight_info *out) DH_MUST_CHECK;

/* Tasks in flight (orphans included); 0 for NULL. */
size_t dh_inflight_count(const struct dh_inflight *t);

#endif
