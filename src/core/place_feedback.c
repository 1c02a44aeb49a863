/*
 * place_feedback.c - the online half of Eq. 1 (paper Sec. 3.3, 4.5):
 * assignments and completions move a server's work in flight and its EWMA
 * of actual / predicted time; forwarded payloads move link EWMAs;
 * heartbeats add work the table did not assign.  Plus the GPU window
 * (DESIGN.md 3): the EWMA of the compute window and slack.
 *
 * Each feedback call touches one server and re-keys it in the remote
 * heaps (O(L log n); a link sample only its target's heap); nothing
 * allocates.  Locking: none (see place.h).
 */
#include <math.h>

#include "core/place_internal.h"

#define RATIO_MIN 0.05
#define RATIO_MAX 50.0

static struct dh__place_srv *srv_of(struct dh_place *p, int32_t id)
{
    if (id < 0 || id >= p->max_servers || !p->srv[id].used)
        return NULL;
    return &p->srv[id];
}

int dh_place_assign(struct dh_place *p, int32_t server, double work_ms)
{
    struct dh__place_srv *s = srv_of(p, server);

    if (!s)
        return DH_ENOTFOUND;
    if (!(work_ms >= 0) || !(work_ms <= DH_PLACE_MAX_MS))
        return DH_EINVAL;
    s->tasks++;
    if (s->pool >= 0)
        p->pools[s->pool].tasks++;
    s->inflight_ms += work_ms;
    dh__place_rekey(p, server);
    return 0;
}

static double clamp(double x, double lo, double hi)
{
    return x < lo ? lo : x > hi ? hi : x;
}

int dh_place_complete(struct dh_place *p, int32_t server, double predicted_ms,
                      double actual_ms)
{
    struct dh__place_srv *s = srv_of(p, server);
    double a = p->o.ratio_alpha;

    if (!s)
        return DH_ENOTFOUND;
    if (!(predicted_ms >= 0) || !(predicted_ms <= DH_PLACE_MAX_MS) ||
        !(actual_ms >= 0) || !(actual_ms <= DH_PLACE_MAX_MS))
        return DH_EINVAL;
    if (s->tasks > 0) {
        s->tasks--;
        if (s->pool >= 0)
            p->pools[s->pool].tasks--;
        if (s->released > s->tasks) /* cannot happen: the caller reholds */
            s->released = s->tasks;
    }
    s->inflight_ms -= predicted_ms;
    /* Float drift (and completions of tasks from before a restart) must
     * never leave negative work, or an idle server would look faster. */
    if (s->inflight_ms < 0 || s->tasks == 0)
        s->inflight_ms = 0;
    if (predicted_ms > 0) {
        double r = clamp(actual_ms / predicted_ms, RATIO_MIN, RATIO_MAX);
        s->ratio = (1 - a) * s->ratio + a * r;
    }
    dh__place_rekey(p, server);
    return 0;
}

/* Small transfers measure latency; large ones bandwidth net of it. */
int dh_place_link(struct dh_place *p, int32_t from, int32_t to, double bytes,
                  double seconds)
{
    struct dh__place_link *l;
    struct dh__place_srv *t = srv_of(p, to);
    double a = p->o.link_alpha, ms = seconds * 1e3, lat, bw;

    if (!srv_of(p, from) || !t)
        return DH_ENOTFOUND;
    if (t->lslot < 0 || !(bytes >= 0) || !(seconds > 0) || !isfinite(bytes) ||
        !isfinite(seconds))
        return DH_EINVAL;
    l = &p->links[(size_t)from * p->o.max_local + t->lslot];
    if (bytes < p->o.small_xfer_bytes) {
        l->lat_ms = l->lat_ms < 0 ? ms : (1 - a) * l->lat_ms + a * ms;
        dh__place_rekey_link(p, from, to);
        return 0;
    }
    lat = l->lat_ms >= 0 ? l->lat_ms : p->o.default_latency_ms;
    /* Latency cannot explain more than half of a large transfer. */
    bw = bytes / fmax(ms - lat, ms * 0.5);
    l->bw = l->bw <= 0 ? bw : (1 - a) * l->bw + a * bw;
    dh__place_rekey_link(p, from, to);
    return 0;
}

int dh_place_read_rate(struct dh_place *p, int32_t server, double ms_per_mb)
{
    struct dh__place_srv *s = srv_of(p, server);

    if (!s)
        return DH_ENOTFOUND;
    if (!(ms_per_mb >= 0) || !(ms_per_mb <= DH_PLACE_MAX_MS))
        return DH_EINVAL;
    s->read_ms_per_mb = ms_per_mb;
    dh__place_rekey(p, server);
    return 0;
}

int dh_place_heartbeat(struct dh_place *p, int32_t server, int32_t queue_depth,
                       int32_t busy_workers, double recent_latency_ms)
{
    struct dh__place_srv *s = srv_of(p, server);
    int64_t reported;
    double each;

    if (!s)
        return DH_ENOTFOUND;
    if (queue_depth < 0 || busy_workers < 0 || !(recent_latency_ms >= 0) ||
        !(recent_latency_ms <= DH_PLACE_MAX_MS))
        return DH_EINVAL;
    reported = (int64_t)queue_depth + busy_workers;
    s->ext_tasks = reported > s->tasks ? reported - s->tasks : 0;
    each = recent_latency_ms > 0 ? recent_latency_ms
           : s->tasks > 0        ? s->inflight_ms / (double)s->tasks
                                 : 0;
    s->ext_ms = (double)s->ext_tasks * each;
    dh__place_rekey(p, server);
    return 0;
}

/* ---- the GPU window and the deadline model (place.h) ---- */

void dh_window_init(struct dh_window *w, double alpha)
{
    w->alpha = alpha > 0 && alpha <= 1 ? alpha : DH_WINDOW_ALPHA;
    w->ewma_ms = 0;
    w->samples = 0;
    w->hint_ms = 0;
    w->step_deadline_ms = 0;
}

void dh_window_assume(struct dh_window *w, double hint_ms,
                      double step_deadline_ms)
{
    w->hint_ms = hint_ms > 0 && isfinite(hint_ms) ? hint_ms : 0;
    w->step_deadline_ms = step_deadline_ms > 0 && isfinite(step_deadline_ms)
                              ? step_deadline_ms
                              : 0;
}

void dh_window_update(struct dh_window *w, double period_ms)
{
    if (!(period_ms >= 0) || !isfinite(period_ms))
        return;
    if (w->samples++ == 0)
        w->ewma_ms = period_ms;
    else
        w->ewma_ms = (1 - w->alpha) * w->ewma_ms + w->alpha * period_ms;
}

double dh_window_period_ms(const struct dh_window *w)
{
    if (w->step_deadline_ms > 0)
        return w->step_deadline_ms;
    if (w->samples > 0)
        return w->ewma_ms;
    return w->hint_ms > 0 ? w->hint_ms : INFINITY;
}

double dh_window_slack_ms(const struct dh_window *w, int steps_ahead,
                          double elapsed_ms)
{
    double period = dh_window_period_ms(w);

    if (isinf(period))
        return INFINITY;
    return (double)steps_ahead * period - elapsed_ms;
}

int dh_window_is_miss(double input_wait_ms, double ddl_ms)
{
    return input_wait_ms > ddl_ms;
}
