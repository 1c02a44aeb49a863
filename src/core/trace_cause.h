/*
 * trace_cause.h - where one task's stages lie on the rank's clock and
 * which of them made a step late (docs/trace.md "Late steps", "Clocks").
 * Pure: the client's trace (src/runtime/client_trace.c) feeds it the
 * server's stage times and its own request / arrival times.
 */
#ifndef DH_CORE_TRACE_CAUSE_H
#define DH_CORE_TRACE_CAUSE_H

#include "datahelix/media_stages.h"

#include <stddef.h>
#include <stdint.h>

/* One part (microbatch) of a consumed step; times in ms of the rank's
 * CLOCK_MONOTONIC, durations in ms. */
struct dh__tr_part {
    uint64_t step;
    uint32_t epoch, mb, server, worker, n;
    int remote, present;
    double sent, recv, ready; /* ready: the batch complete here (ms) */
    double queue, alloc, collate, place, notify, service;
    size_t s0; /* first of its n samples in samples[] */
};

struct dh__tr_sample {
    uint64_t id;
    float ms[DH_MS_COUNT]; /* read, decode, scale, audio (media_stages.h) */
    uint64_t bytes;        /* the read stage's bytes; 0: not reported */
};

/* Where the part's spans lie, and the gaps no server measured. */
struct dh__tr_view {
    double sent, recv, ready;
    double work_start, work_end; /* the slot wait begins; collate ends */
    double transfer, route;
    uint32_t slowest; /* sample position */
    double slowest_ms;
};

/* "read", "decode", "scale", "audio": the per-sample stages, by index. */
extern const char *const dh__tr_sample_stages[DH_MS_COUNT];

/*
 * Places part p (s: its p->n samples, or NULL): a local part's work ends
 * at its ready time less notify and place; a remote part's starts at the
 * request plus its queue (routing taken as ~0), and the rest up to its
 * arrival here is its transfer.  Gaps below 0 are 0.
 */
void dh__tr_place(const struct dh__tr_part *p, const struct dh__tr_sample *s,
                  struct dh__tr_view *v);

/*
 * The longest stage of part p (placed in v): "queue", "alloc", "collate",
 * "place", "notify", "transfer", "route", or a sample's "read", "decode",
 * "scale" (its position in *pos; else *pos is the slowest sample's);
 * "unknown" with the request-to-arrival time when p has no stage times.
 * *ms: that stage's time.
 */
const char *dh__tr_longest(const struct dh__tr_part *p,
                           const struct dh__tr_sample *s,
                           const struct dh__tr_view *v, double *ms,
                           uint32_t *pos);

#endif
