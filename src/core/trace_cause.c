/*
 * trace_cause.c - a part's timeline and its longest stage (see
 * trace_cause.h).  No I/O, no allocation.
 */
#include <string.h>

#include "core/trace_cause.h"

const char *const dh__tr_sample_stages[DH_MS_COUNT] = {"read", "decode",
                                                       "scale", "audio"};

/* Where part p's spans lie on this host's clock (see the file's notes). */
void dh__tr_place(const struct dh__tr_part *p, const struct dh__tr_sample *s,
                  struct dh__tr_view *v)
{
    double work = p->alloc + p->service; /* service: samples + collate */

    memset(v, 0, sizeof(*v));
    v->sent = p->sent;
    v->recv = p->recv;
    v->ready = p->ready > 0 && p->ready <= p->recv ? p->ready : p->recv;
    for (uint32_t i = 0; i < p->n && s; i++) {
        double t = (double)s[i].ms[0] + s[i].ms[1] + s[i].ms[2];

        if (i == 0 || t > v->slowest_ms) {
            v->slowest = i;
            v->slowest_ms = t;
        }
    }
    if (p->remote) {
        v->work_start = p->sent + p->queue;
        v->work_end = v->work_start + work;
        v->transfer = v->ready - p->notify - p->place - v->work_end;
        v->route = 0;
    } else {
        v->work_end = v->ready - p->notify - p->place;
        v->work_start = v->work_end - work;
        v->route = v->work_start - p->queue - p->sent;
        v->transfer = v->recv - v->ready;
    }
    if (v->transfer < 0)
        v->transfer = 0;
    if (v->route < 0)
        v->route = 0;
}

/* The longest stage of part p: its name and ms; per-sample stages name
 * that sample's position in *pos (else the slowest sample's). */
const char *dh__tr_longest(const struct dh__tr_part *p,
                           const struct dh__tr_sample *s,
                           const struct dh__tr_view *v, double *ms,
                           uint32_t *pos)
{
    const char *best = "unknown";
    struct {
        const char *name;
        double ms;
    } whole[] = {{"queue", p->queue},     {"alloc", p->alloc},
                 {"collate", p->collate}, {"place", p->place},
                 {"notify", p->notify},   {"transfer", v->transfer},
                 {"route", v->route}};

    *ms = 0;
    *pos = v->slowest;
    if (!p->present) {
        *ms = v->recv - v->sent;
        return best;
    }
    for (size_t i = 0; i < sizeof(whole) / sizeof(whole[0]); i++)
        if (whole[i].ms > *ms) {
            best = whole[i].name;
            *ms = whole[i].ms;
        }
    for (uint32_t i = 0; i < p->n && s; i++)
        for (int k = 0; k < DH_MS_COUNT; k++)
            if (s[i].ms[k] > *ms) {
                best = dh__tr_sample_stages[k];
                *ms = s[i].ms[k];
                *pos = i;
            }
    return best;
}
