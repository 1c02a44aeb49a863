/*
 * datahelix/reorder.h - the client's reorder buffer: results come back in
 * any order, next() hands them out in request order, each task exactly once
 * (DESIGN.md 8 "Exactly once" and "Ordering"; docs/exactly-once.md).
 *
 * Design notes:
 *   - The client registers each task id it requests, in request order, with
 *     dh_reorder_expect(); at most `depth` (the prefetch depth) are expected
 *     and not yet returned by dh_reorder_next().  That window is the client's
 *     authoritative list of outstanding tasks: dh_reorder_pending() lists
 *     the ones without an outcome, to re-issue after a local DataServer
 *     restart or to refill a restarted Coordinator.
 *   - A task's outcome is its first result (dh_reorder_arrive()) or error
 *     (dh_reorder_fail()); anything after that for the same id, and anything
 *     for an id outside the window (unknown or already returned), is not
 *     accepted and its payload goes back to the caller to release.
 *   - A ring of `depth` slots plus an open-addressing index id -> slot
 *     (linear probing, backward-shift deletion): every call is O(1) on
 *     average except dh_reorder_pending(), O(depth).  All memory is taken by
 *     dh_reorder_create(); no other call allocates.
 *   - Payloads are opaque u64 handles (e.g. an arena slot offset); the
 *     buffer never looks inside.
 *   - Pure logic: no I/O, no clock, no threads.
 *
 * Thread-safety: none.  The client's fetcher and next() must serialize
 * calls on one buffer (e.g. under the client's lock).
 */
#ifndef DATAHELIX_REORDER_H
#define DATAHELIX_REORDER_H

#include <stddef.h>
#include <stdint.h>

#include "datahelix/error.h"

/* Largest depth dh_reorder_create() accepts. */
#define DH_REORDER_MAX_DEPTH (1u << 20)

struct dh_reorder; /* opaque */

/*
 * Creates a buffer for up to `depth` outstanding tasks
 * (1..DH_REORDER_MAX_DEPTH, else DH_EINVAL / DH_ETOOBIG); DH_ENOMEM if
 * allocation fails.  On success *out owns the buffer
 * (dh_reorder_destroy()); on error *out is untouched.
 */
int dh_reorder_create(size_t depth, struct dh_reorder **out,
                      struct dh_err *e) DH_MUST_CHECK;

/* Frees the buffer (payloads it still holds are the caller's to release:
 * drain with dh_reorder_next() first).  Accepts NULL. */
void dh_reorder_destroy(struct dh_reorder *r);

/*
 * Appends `task_id` to the request order.  DH_ETOOBIG if `depth` tasks are
 * outstanding; DH_EDUP if the id is already outstanding.  Nothing changes
 * on error.
 */
int dh_reorder_expect(struct dh_reorder *r, uint64_t task_id) DH_MUST_CHECK;

/*
 * A result for `task_id` carrying `payload`.  *accepted = 1: the buffer
 * now holds the payload until next() returns it.  *accepted = 0: a
 * duplicate (the task already has an outcome), or an id that is not
 * outstanding (unknown, or already returned by next()): the payload stays
 * the caller's, who releases it.  DH_EINVAL if r or accepted is NULL.
 */
int dh_reorder_arrive(struct dh_reorder *r, uint64_t task_id, uint64_t payload,
                      int *accepted) DH_MUST_CHECK;

/*
 * An error for `task_id`: `code` (negative DH_E*, not DH_EEMPTY) is what
 * the next() for that task returns.  0 if recorded; DH_EDUP if the task
 * already has an outcome (the first one stands); DH_ENOTFOUND if the id is
 * not outstanding; DH_EINVAL for a bad code.
 */
int dh_reorder_fail(struct dh_reorder *r, uint64_t task_id,
                    int code) DH_MUST_CHECK;

/*
 * The oldest outstanding task, once it has an outcome; it then leaves the
 * window.  DH_OK: *task_id and *payload are set, and the payload is the
 * caller's.  The task's error code (from dh_reorder_fail()): *task_id is
 * set (so the error can name its task), *payload is not.  DH_EEMPTY: no
 * task is outstanding or the oldest has no outcome yet; nothing is
 * written.
 */
int dh_reorder_next(struct dh_reorder *r, uint64_t *task_id,
                    uint64_t *payload) DH_MUST_CHECK;

/*
 * Writes the outstanding tasks without an outcome, in request order, into
 * out and their number into *n.  DH_ETOOBIG (nothing written) if there are
 * more than `cap`; a cap of `depth` always suffices.
 */
int dh_reorder_pending(const struct dh_reorder *r, uint64_t *out, size_t cap,
                       size_t *n) DH_MUST_CHECK;

/* Outstanding tasks (expected, not yet returned by next()); 0 for NULL. */
size_t dh_reorder_count(const struct dh_reorder *r);

/* The depth given at creation; 0 for NULL. */
size_t dh_reorder_depth(const struct dh_reorder *r);

#endif
