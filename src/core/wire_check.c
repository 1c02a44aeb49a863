/*
 * wire_check.c - the value checks of the wire codec (see wire_internal.h).
 *
 * Design: one check per message on our own structs, run by dh_wire_encode()
 * before packing and by dh_wire_decode() after copying, so the two sides
 * can never disagree about what is valid.  Counts and sizes over a cap are
 * DH_ETOOBIG; any other bad value is the caller's `bad` code (DH_EINVAL
 * when encoding, DH_EFORMAT when decoding).  Every message names the field
 * ("wire: heartbeat.links[3].peer_server_id is 0").
 * Pure: no I/O, no allocation, no globals.
 */
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "wire_internal.h"

int dh__wire_fail(const struct dh__wire_ck *c, int code, const char *fmt, ...)
{
    char what[DH_ERR_MSG_MAX];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(what, sizeof(what), fmt, ap);
    va_end(ap);
    return dh_err_set(c->e, code, "wire: %s.%s", c->where, what);
}

static int ck_u64(const struct dh__wire_ck *c, const char *field, uint64_t v,
                  uint64_t lo, uint64_t hi)
{
    if (v < lo || v > hi)
        return WIRE_BAD(c, "%s %" PRIu64 " out of range %" PRIu64 "..%" PRIu64,
                        field, v, lo, hi);
    return 0;
}

static int ck_enum(const struct dh__wire_ck *c, const char *field, unsigned v,
                   unsigned lo, unsigned hi)
{
    if (v < lo || v > hi)
        return WIRE_BAD(c, "%s %d is not a valid value (%u..%u)", field, (int)v,
                        lo, hi);
    return 0;
}

static int ck_real(const struct dh__wire_ck *c, const char *field, double v,
                   double lo, double hi)
{
    if (!isfinite(v) || v < lo || v > hi)
        return WIRE_BAD(c, "%s %g out of range %g..%g", field, v, lo, hi);
    return 0;
}

/* A text field of a struct we hold: NUL-terminated within cap + 1. */
/* An array field of n entries: within its cap, and present when n > 0 (a
 * caller may set a count without the array; the decoder never does). */
static int ck_count(const struct dh__wire_ck *c, const char *field,
                    const void *arr, uint32_t n, uint32_t cap)
{
    if (n > cap)
        return WIRE_BIG(c, "%s: %" PRIu32 " entries over the cap of %" PRIu32,
                        field, n, cap);
    if (n > 0 && !arr)
        return WIRE_BAD(c, "%s is NULL with %" PRIu32 " entries", field, n);
    return 0;
}

int dh__wire_ck_text(const struct dh__wire_ck *c, const char *field,
                     const char *s, size_t cap, int nonempty)
{
    size_t n = strnlen(s, cap + 1);

    if (n > cap)
        return WIRE_BIG(c, "%s: longer than the cap of %zu bytes", field, cap);
    if (nonempty && n == 0)
        return WIRE_BAD(c, "%s is empty", field);
    return 0;
}

static int ck_task(const struct dh__wire_ck *c, const struct dh_wire_task *t)
{
    uint64_t id;

    /* The epoch is any u32 (wire.h): only the id's four fields are bounded. */
    if (dh_wire_task_id(t->pass, t->step, t->rank, t->microbatch, &id, NULL) <
        0)
        return WIRE_BAD(c,
                        "task (pass %" PRIu32 ", step %" PRIu32
                        ", rank %" PRIu32 ", microbatch %" PRIu32
                        ") does not fit the task id layout "
                        "(16/24/16/8 bits)",
                        t->pass, t->step, t->rank, t->microbatch);
    if (id != t->id)
        return WIRE_BAD(c,
                        "task.id %#" PRIx64 " does not match its tuple "
                        "(pass %" PRIu32 ", step %" PRIu32 ", rank %" PRIu32
                        ", microbatch %" PRIu32 ") = %#" PRIx64,
                        t->id, t->pass, t->step, t->rank, t->microbatch, id);
    return 0;
}

/* Field `name`: "" or exactly DH_WIRE_TOKEN_LEN lower-case hex digits. */
static int ck_hex(const struct dh__wire_ck *c, const char *name, const char *t)
{
    size_t n = strnlen(t, DH_WIRE_TOKEN_LEN + 1);

    if (n != 0 && n != DH_WIRE_TOKEN_LEN)
        return WIRE_BAD(c, "%s has %zu characters, not 0 or %u", name, n,
                        DH_WIRE_TOKEN_LEN);
    for (size_t i = 0; i < n; i++)
        if (!((t[i] >= '0' && t[i] <= '9') || (t[i] >= 'a' && t[i] <= 'f')))
            return WIRE_BAD(c, "%s is not lower-case hex", name);
    return 0;
}

static int ck_token(const struct dh__wire_ck *c, const char *t)
{
    return ck_hex(c, "token", t);
}

static int ck_register_client(const struct dh__wire_ck *c,
                              const struct dh_wire_register_client *r)
{
    int rc;

    if ((rc = ck_u64(c, "world_size", r->world_size, 1, DH_WIRE_MAX_RANKS)) < 0)
        return rc;
    if (r->rank >= r->world_size)
        return WIRE_BAD(c, "rank %" PRIu32 " is not below world_size %" PRIu32,
                        r->rank, r->world_size);
    if ((rc = dh__wire_ck_text(c, "host", r->host, DH_WIRE_MAX_HOST, 0)) < 0)
        return rc;
    if ((rc = dh__wire_ck_text(c, "server_address", r->server_addr,
                               DH_WIRE_MAX_ADDR, 0)) < 0)
        return rc;
    return ck_token(c, r->token);
}

static int ck_register_server(const struct dh__wire_ck *c,
                              const struct dh_wire_register_server *r)
{
    int local = r->role == DH_WIRE_ROLE_LOCAL;
    int rc;

    if ((rc = ck_u64(c, "server_id", r->server_id, 1, UINT32_MAX)) < 0 ||
        (rc = dh__wire_ck_text(c, "address", r->addr, DH_WIRE_MAX_ADDR, 1)) <
            0 ||
        (rc = dh__wire_ck_text(c, "host", r->host, DH_WIRE_MAX_HOST, 0)) < 0 ||
        (rc = ck_enum(c, "role", (unsigned)r->role, DH_WIRE_ROLE_LOCAL,
                      DH_WIRE_ROLE_REMOTE)) < 0 ||
        (rc = ck_u64(c, "workers", r->workers, 1, DH_WIRE_MAX_WORKERS)) < 0 ||
        (rc = ck_u64(c, "cpus", r->cpus, 0, DH_WIRE_MAX_WORKERS)) < 0 ||
        (rc = ck_u64(c, "rank", r->rank, 0,
                     local ? DH_WIRE_MAX_RANKS - 1 : 0)) < 0)
        return rc;
    if ((rc = ck_token(c, r->token)) < 0 ||
        (rc = ck_hex(c, "sender_secret", r->sender_secret)) < 0)
        return rc;
    if (!local && r->token[0])
        return WIRE_BAD(c, "a remote server carries no rank token");
    return ck_u64(c, "arena_bytes", r->arena_bytes, local ? 1 : 0,
                  DH_WIRE_MAX_BYTES);
}

static int ck_heartbeat(const struct dh__wire_ck *c,
                        const struct dh_wire_heartbeat *h)
{
    char field[64];
    int rc;

    if ((rc = ck_u64(c, "server_id", h->server_id, 1, UINT32_MAX)) < 0 ||
        (rc = ck_u64(c, "queue_depth", h->queue_depth, 0, DH_WIRE_MAX_QUEUE)) <
            0 ||
        (rc = ck_u64(c, "busy_workers", h->busy_workers, 0,
                     DH_WIRE_MAX_WORKERS)) < 0 ||
        (rc = ck_real(c, "latency_ms", h->latency_ms, 0,
                      DH_WIRE_MAX_LATENCY_MS)) < 0 ||
        (rc = ck_real(c, "cpu_fraction", h->cpu_fraction, 0, 1)) < 0 ||
        (rc = ck_u64(c, "slot_waiting", h->slot_waiting, 0,
                     DH_WIRE_MAX_WORKERS)) < 0 ||
        (rc = ck_real(c, "read_ms", h->read_ms, 0, DH_WIRE_MAX_TOTAL_MS)) < 0)
        return rc;
    if ((rc = ck_count(c, "links", h->links, h->n_links, DH_WIRE_MAX_PEERS)) <
        0)
        return rc;
    for (uint32_t i = 0; i < h->n_links; i++) {
        snprintf(field, sizeof(field), "links[%" PRIu32 "].", i);
        if (h->links[i].peer_server_id == 0)
            return WIRE_BAD(c, "%speer_server_id is 0", field);
        if (h->links[i].bytes_per_s > DH_WIRE_MAX_BYTES)
            return WIRE_BAD(c, "%sbytes_per_s %" PRIu64 " over 2^48", field,
                            h->links[i].bytes_per_s);
    }
    return 0;
}

static int ck_plan_enums(const struct dh__wire_ck *c,
                         const struct dh_wire_plan *p)
{
    int rc;

    if ((rc = ck_enum(c, "plan.kind", (unsigned)p->kind, 0, DH_PLAN_ALL)) < 0 ||
        (rc = ck_enum(c, "plan.pad", (unsigned)p->pad, 0, DH_PAD_ZERO)) < 0 ||
        (rc = ck_enum(c, "plan.geometry", (unsigned)p->geometry, 0,
                      DH_GEOM_NATIVE)) < 0 ||
        (rc = ck_enum(c, "plan.layout", (unsigned)p->layout, 0,
                      DH_LAYOUT_TCHW)) < 0 ||
        (rc = ck_enum(c, "plan.dtype", (unsigned)p->dtype, 0, DH_DTYPE_F32)) <
            0)
        return rc;
    return ck_enum(c, "plan.snap", (unsigned)p->snap, 0, DH_SNAP_KEY);
}

static int ck_plan_indices(const struct dh__wire_ck *c,
                           const struct dh_wire_plan *p)
{
    int rc = ck_count(c, "plan.indices", p->indices, p->n_indices,
                      DH_WIRE_MAX_FRAMES);

    if (rc < 0)
        return rc;
    if (p->kind != DH_PLAN_INDICES) {
        if (p->n_indices != 0)
            return WIRE_BAD(c,
                            "plan.indices: %" PRIu32 " indices for a plan "
                            "that is not an index plan",
                            p->n_indices);
        return 0;
    }
    if (p->n_indices != p->frames)
        return WIRE_BAD(
            c, "plan.indices: %" PRIu32 " indices for %" PRIu32 " frames",
            p->n_indices, p->frames);
    for (uint32_t i = 0; i < p->n_indices; i++)
        if (p->indices[i] < 0)
            return WIRE_BAD(c,
                            "plan.indices[%" PRIu32 "] %" PRId64 " is negative",
                            i, p->indices[i]);
    return 0;
}

/* The size fields: width x height for a fixed size; for a native one the
 * bounds, with width / height 0 (and the bounds 0 otherwise), so that no
 * field means something the geometry does not use. */
static int ck_plan_size(const struct dh__wire_ck *c,
                        const struct dh_wire_plan *p)
{
    int rc;

    if (p->geometry != DH_GEOM_NATIVE) {
        if ((rc = ck_u64(c, "plan.width", p->width, 1, DH_WIRE_MAX_DIM)) < 0 ||
            (rc = ck_u64(c, "plan.height", p->height, 1, DH_WIRE_MAX_DIM)) <
                0 ||
            (rc = ck_u64(c, "plan.max_side", p->max_side, 0, 0)) < 0 ||
            (rc = ck_u64(c, "plan.max_area", p->max_area, 0, 0)) < 0 ||
            (rc = ck_u64(c, "plan.patch", p->patch, 0, 0)) < 0)
            return rc;
        return 0;
    }
    if ((rc = ck_u64(c, "plan.width", p->width, 0, 0)) < 0 ||
        (rc = ck_u64(c, "plan.height", p->height, 0, 0)) < 0 ||
        (rc = ck_u64(c, "plan.max_side", p->max_side, 0, DH_WIRE_MAX_DIM)) <
            0 ||
        (rc = ck_u64(c, "plan.max_area", p->max_area, 0,
                     (uint64_t)DH_MEDIA_MAX_PIXELS)) < 0 ||
        (rc = ck_u64(c, "plan.patch", p->patch, 0, DH_MEDIA_MAX_PATCH)) < 0)
        return rc;
    return 0;
}

/* Sound: all four 0, or each in range (wire.h). */
static int ck_plan_audio(const struct dh__wire_ck *c,
                         const struct dh_wire_plan *p)
{
    int rc;

    if (p->audio_rate == 0) {
        if ((rc = ck_u64(c, "plan.audio_channels", p->audio_channels, 0, 0)) <
                0 ||
            (rc = ck_u64(c, "plan.audio_samples", p->audio_samples, 0, 0)) <
                0 ||
            (rc = ck_u64(c, "plan.audio_required", p->audio_required, 0, 0)) <
                0)
            return rc;
    }
    if ((rc = ck_u64(c, "plan.audio_crop", p->audio_crop, 0,
                     p->audio_rate ? DH_AUDIO_CROP_RANDOM : 0)) < 0)
        return rc;
    if (p->audio_rate == 0 || p->audio_feature == 0) {
        if ((rc = ck_u64(c, "plan.audio_feature", p->audio_feature, 0, 0)) <
                0 ||
            (rc = ck_u64(c, "plan.audio_n_fft", p->audio_n_fft, 0, 0)) < 0 ||
            (rc = ck_u64(c, "plan.audio_hop", p->audio_hop, 0, 0)) < 0 ||
            (rc = ck_u64(c, "plan.audio_mels", p->audio_mels, 0, 0)) < 0)
            return rc;
        if (p->audio_rate == 0)
            return 0;
    } else if ((rc = ck_u64(c, "plan.audio_feature", p->audio_feature, 1,
                            DH_AUDIO_WHISPER)) < 0 ||
               (rc = ck_u64(c, "plan.audio_n_fft", p->audio_n_fft, 16,
                            DH_AUDIO_MAX_FFT)) < 0 ||
               (rc = ck_u64(c, "plan.audio_hop", p->audio_hop, 1,
                            p->audio_n_fft)) < 0 ||
               (rc = ck_u64(c, "plan.audio_mels", p->audio_mels, 1,
                            DH_AUDIO_MAX_MELS)) < 0) {
        return rc;
    }
    if ((rc = ck_u64(c, "plan.audio_rate", p->audio_rate, DH_AUDIO_MIN_RATE,
                     DH_AUDIO_MAX_RATE)) < 0 ||
        (rc = ck_u64(c, "plan.audio_channels", p->audio_channels, 1, 2)) < 0 ||
        (rc = ck_u64(c, "plan.audio_samples", p->audio_samples, 1,
                     (uint64_t)DH_AUDIO_MAX_ROW)) < 0 ||
        (rc = ck_u64(c, "plan.audio_required", p->audio_required, 0, 1)) < 0)
        return rc;
    return 0;
}

static int ck_plan(const struct dh__wire_ck *c, const struct dh_wire_plan *p)
{
    struct dh_media_plan mp;
    struct dh_err me;
    int rc;

    if (p->frames > DH_WIRE_MAX_FRAMES)
        return WIRE_BIG(c, "plan.frames %" PRIu32 " over the cap of %u",
                        p->frames, DH_WIRE_MAX_FRAMES);
    if ((rc = ck_plan_enums(c, p)) < 0 || (rc = ck_plan_size(c, p)) < 0 ||
        (rc = ck_plan_indices(c, p)) < 0 || (rc = ck_plan_audio(c, p)) < 0 ||
        (rc = ck_real(c, "plan.fps", p->fps, 0, 1e6)) < 0 ||
        (rc = ck_real(c, "plan.snap_tol", p->snap_tol, -1e9, 1e9)) < 0)
        return rc;
    /* The remaining rules are the media pipeline's own (fps > 0 for an fps
     * plan, frames >= 1 where needed, mean/std for float output). */
    dh_wire_plan_to_media(p, &mp);
    if (dh_media_plan_check(&mp, &me) < 0)
        return WIRE_BAD(c, "plan rejected by the media pipeline: %s", me.msg);
    return 0;
}

static int ck_hints(const struct dh__wire_ck *c, const struct dh_wire_hints *h)
{
    int rc;

    if ((rc = ck_real(c, "hints.est_cpu_ms", h->est_cpu_ms, 0,
                      DH_WIRE_MAX_LATENCY_MS)) < 0 ||
        (rc = ck_u64(c, "hints.est_in_bytes", h->est_in_bytes, 0,
                     DH_WIRE_MAX_BYTES)) < 0 ||
        (rc = ck_u64(c, "hints.est_out_bytes", h->est_out_bytes, 0,
                     DH_WIRE_MAX_BYTES)) < 0)
        return rc;
    return ck_enum(c, "hints.local_only", (unsigned)h->local_only, 0, 1);
}

static int ck_report(const struct dh__wire_ck *c,
                     const struct dh_wire_report *r)
{
    int rc;

    if ((rc = ck_u64(c, "report.steps", r->steps, 0, DH_WIRE_MAX_BYTES)) < 0 ||
        (rc = ck_u64(c, "report.misses", r->misses, 0, r->steps)) < 0 ||
        (rc = ck_real(c, "report.input_wait_ms", r->input_wait_ms, 0,
                      DH_WIRE_MAX_LATENCY_MS)) < 0)
        return rc;
    return ck_real(c, "report.window_ms", r->window_ms, 0,
                   DH_WIRE_MAX_LATENCY_MS);
}

static int ck_request(const struct dh__wire_ck *c,
                      const struct dh_wire_request *r)
{
    int rc;

    if ((rc = ck_task(c, &r->task)) < 0 ||
        (rc = ck_u64(c, "requester_rank", r->requester_rank, 0,
                     DH_WIRE_MAX_RANKS - 1)) < 0)
        return rc;
    if ((rc = ck_count(c, "sample_ids", r->sample_ids, r->n_samples,
                       DH_WIRE_MAX_SAMPLES)) < 0)
        return rc;
    if (r->n_samples == 0)
        return WIRE_BAD(c, "sample_ids is empty");
    if (r->slack_ms < -DH_WIRE_MAX_SLACK_MS ||
        r->slack_ms > DH_WIRE_MAX_SLACK_MS)
        return WIRE_BAD(c, "slack_ms %" PRId64 " out of range +-%d",
                        r->slack_ms, DH_WIRE_MAX_SLACK_MS);
    if ((rc = ck_count(c, "spare_ids", r->spare_ids, r->n_spares,
                       DH_WIRE_MAX_SPARES)) < 0 ||
        (rc = ck_plan(c, &r->plan)) < 0)
        return rc;
    if ((rc = ck_hints(c, &r->hints)) < 0)
        return rc;
    return r->has_report ? ck_report(c, &r->report) : 0;
}

static int ck_route(const struct dh__wire_ck *c, const struct dh_wire_route *r)
{
    struct dh__wire_ck sub = {c->bad, "route.request", c->e};
    int rc;

    if ((rc = ck_task(c, &r->task)) < 0 ||
        (rc = ck_u64(c, "server_id", r->server_id, 1, UINT32_MAX)) < 0 ||
        (rc = ck_u64(c, "target_server_id", r->target_server_id, 1,
                     UINT32_MAX)) < 0 ||
        (rc = dh__wire_ck_text(c, "target_address", r->target_addr,
                               DH_WIRE_MAX_ADDR, 0)) < 0 ||
        (rc = ck_hex(c, "sender_token", r->sender_token)) < 0 ||
        (rc = ck_enum(c, "has_request", (unsigned)r->has_request, 0, 1)) < 0)
        return rc;
    if (!r->has_request)
        return 0;
    if ((rc = ck_request(&sub, &r->request)) < 0)
        return rc;
    if (r->request.task.id != r->task.id)
        return WIRE_BAD(c,
                        "request.task.id %#" PRIx64 " is not the route's "
                        "task %#" PRIx64,
                        r->request.task.id, r->task.id);
    if (r->request.task.epoch != r->task.epoch)
        return WIRE_BAD(c,
                        "request.task (epoch %" PRIu32 ", id %#" PRIx64
                        ") is not the route's task (epoch %" PRIu32 ")",
                        r->request.task.epoch, r->request.task.id,
                        r->task.epoch);
    return 0;
}

/* product(dims) x element size <= length, without overflow. */
static int ck_result_shape(const struct dh__wire_ck *c,
                           const struct dh_wire_result *r)
{
    uint64_t bytes = r->dtype == DH_DTYPE_F32 ? 4 : 1;
    char field[32];
    int rc;

    if (r->ndims > DH_WIRE_MAX_DIMS)
        return WIRE_BIG(c, "dims: %" PRIu32 " dims over the cap of %u",
                        r->ndims, DH_WIRE_MAX_DIMS);
    if (r->ndims == 0)
        return WIRE_BAD(c, "dims is empty");
    for (uint32_t i = 0; i < r->ndims; i++) {
        snprintf(field, sizeof(field), "dims[%" PRIu32 "]", i);
        if ((rc = ck_u64(c, field, r->dims[i], 1, UINT64_C(1) << 32)) < 0)
            return rc;
        if (bytes > r->length / r->dims[i]) /* bytes * dims[i] > length */
            return WIRE_BAD(
                c, "dims: the tensor needs more than length %" PRIu64 " bytes",
                r->length);
        bytes *= r->dims[i];
    }
    return 0;
}

/* Substitutions: at most one per position, positions increasing, each
 * naming a failed id other than the one delivered there, with its cause. */
static int ck_subs(const struct dh__wire_ck *c, const struct dh_wire_result *r)
{
    int rc;

    if ((rc = ck_count(c, "sub_positions", r->sub_pos, r->n_subs,
                       DH_WIRE_MAX_SPARES)) < 0 ||
        (rc = ck_count(c, "sub_failed_ids", r->sub_failed, r->n_subs,
                       DH_WIRE_MAX_SPARES)) < 0 ||
        (rc = ck_count(c, "sub_causes", r->sub_cause, r->n_subs,
                       DH_WIRE_MAX_SPARES)) < 0)
        return rc;
    if (r->n_subs > r->n_samples)
        return WIRE_BAD(c, "%" PRIu32 " substitutions for %" PRIu32 " samples",
                        r->n_subs, r->n_samples);
    for (uint32_t i = 0; i < r->n_subs; i++) {
        uint32_t p = r->sub_pos[i];

        if (p >= r->n_samples || (i > 0 && p <= r->sub_pos[i - 1]))
            return WIRE_BAD(c,
                            "sub_positions[%" PRIu32 "] %" PRIu32
                            " is not increasing below %" PRIu32,
                            i, p, r->n_samples);
        if (r->sub_failed[i] == r->sample_ids[p])
            return WIRE_BAD(c,
                            "substitution %" PRIu32 " names sample %" PRIu64
                            " as both failed and delivered",
                            i, r->sub_failed[i]);
        if (r->sub_cause[i] >= 0)
            return WIRE_BAD(c,
                            "sub_causes[%" PRIu32 "] %" PRId32
                            " is not an error code (< 0)",
                            i, r->sub_cause[i]);
    }
    return 0;
}

static int ck_times(const struct dh__wire_ck *c, const char *field,
                    const float *v, uint32_t n)
{
    char name[40];

    for (uint32_t i = 0; i < n; i++)
        if (!isfinite(v[i]) || v[i] < 0 || v[i] > DH_WIRE_MAX_LATENCY_MS) {
            snprintf(name, sizeof(name), "stages.%s[%" PRIu32 "]", field, i);
            return ck_real(c, name, v[i], 0, DH_WIRE_MAX_LATENCY_MS);
        }
    return 0;
}

/* Stage times: finite durations, per-sample arrays none or one per sample. */
static int ck_stages(const struct dh__wire_ck *c,
                     const struct dh_wire_result *r)
{
    const struct dh_wire_stages *s = &r->stages;
    uint32_t n = s->n_sample_times;
    int rc;

    if ((rc = ck_real(c, "stages.queue_ms", s->queue_ms, 0,
                      DH_WIRE_MAX_LATENCY_MS)) < 0 ||
        (rc = ck_real(c, "stages.alloc_ms", s->alloc_ms, 0,
                      DH_WIRE_MAX_LATENCY_MS)) < 0 ||
        (rc = ck_real(c, "stages.collate_ms", s->collate_ms, 0,
                      DH_WIRE_MAX_LATENCY_MS)) < 0 ||
        (rc = ck_real(c, "stages.place_ms", s->place_ms, 0,
                      DH_WIRE_MAX_LATENCY_MS)) < 0 ||
        (rc = ck_real(c, "stages.notify_ms", s->notify_ms, 0,
                      DH_WIRE_MAX_LATENCY_MS)) < 0 ||
        (rc = ck_u64(c, "stages.worker", s->worker, 0,
                     DH_WIRE_MAX_WORKERS - 1)) < 0)
        return rc;
    if (n != 0 && n != r->n_samples)
        return WIRE_BAD(
            c, "stages: %" PRIu32 " sample times for %" PRIu32 " samples", n,
            r->n_samples);
    if ((rc = ck_count(c, "stages.read_ms", s->read_ms, n,
                       DH_WIRE_MAX_SAMPLES)) < 0 ||
        (rc = ck_count(c, "stages.decode_ms", s->decode_ms, n,
                       DH_WIRE_MAX_SAMPLES)) < 0 ||
        (rc = ck_count(c, "stages.scale_ms", s->scale_ms, n,
                       DH_WIRE_MAX_SAMPLES)) < 0)
        return rc;
    if (s->read_bytes && (rc = ck_count(c, "stages.read_bytes", s->read_bytes,
                                        n, DH_WIRE_MAX_SAMPLES)) < 0)
        return rc;
    if (s->audio_ms && ((rc = ck_count(c, "stages.audio_ms", s->audio_ms, n,
                                       DH_WIRE_MAX_SAMPLES)) < 0 ||
                        (rc = ck_times(c, "audio_ms", s->audio_ms, n)) < 0))
        return rc;
    if ((rc = ck_times(c, "read_ms", s->read_ms, n)) < 0 ||
        (rc = ck_times(c, "decode_ms", s->decode_ms, n)) < 0)
        return rc;
    return ck_times(c, "scale_ms", s->scale_ms, n);
}

static int ck_result(const struct dh__wire_ck *c,
                     const struct dh_wire_result *r)
{
    int rc;

    if ((rc = ck_task(c, &r->task)) < 0 ||
        (rc = ck_u64(c, "server_id", r->server_id, 1, UINT32_MAX)) < 0 ||
        (rc = ck_u64(c, "arena_offset", r->arena_offset, 0,
                     DH_WIRE_MAX_BYTES)) < 0 ||
        (rc = ck_u64(c, "length", r->length, 0, DH_WIRE_MAX_BYTES)) < 0 ||
        (rc = ck_enum(c, "dtype", (unsigned)r->dtype, 0, DH_DTYPE_F32)) < 0 ||
        (rc = ck_enum(c, "layout", (unsigned)r->layout, 0, DH_LAYOUT_TCHW)) <
            0 ||
        (rc = ck_result_shape(c, r)) < 0 ||
        (rc = ck_real(c, "service_ms", r->service_ms, 0,
                      DH_WIRE_MAX_LATENCY_MS)) < 0 ||
        (rc = ck_hex(c, "sender_token", r->sender_token)) < 0)
        return rc;
    if ((rc = ck_count(c, "sample_ids", r->sample_ids, r->n_samples,
                       DH_WIRE_MAX_SAMPLES)) < 0 ||
        (rc = ck_count(c, "valid_frames", r->valid_frames, r->n_samples,
                       DH_WIRE_MAX_SAMPLES)) < 0)
        return rc;
    for (uint32_t i = 0; i < r->n_samples; i++)
        if (r->valid_frames[i] > DH_WIRE_MAX_FRAMES)
            return WIRE_BAD(c, "valid_frames[%" PRIu32 "] %" PRIu32 " over %u",
                            i, r->valid_frames[i], DH_WIRE_MAX_FRAMES);
    if ((rc = ck_subs(c, r)) < 0)
        return rc;
    return r->stages.present ? ck_stages(c, r) : 0;
}

static int ck_error(const struct dh__wire_ck *c, const struct dh_wire_error *r)
{
    int rc;

    if ((rc = ck_task(c, &r->task)) < 0 ||
        (rc = ck_u64(c, "server_id", r->server_id, 1, UINT32_MAX)) < 0 ||
        (rc = dh__wire_ck_text(c, "path", r->path, DH_WIRE_MAX_PATH, 0)) < 0 ||
        (rc = dh__wire_ck_text(c, "message", r->message, DH_WIRE_MAX_TEXT, 0)) <
            0)
        return rc;
    if (r->cause >= 0)
        return WIRE_BAD(c, "cause %" PRId32 " is not an error code (< 0)",
                        r->cause);
    return 0;
}

int dh__wire_check(const struct dh_wire_msg *m, int bad, struct dh_err *e)
{
    struct dh__wire_ck c = {bad, dh_wire_type_name(m->type), e};

    switch (m->type) {
    case DH_WIRE_REGISTER_CLIENT:
        return ck_register_client(&c, &m->u.register_client);
    case DH_WIRE_REGISTER_SERVER:
        return ck_register_server(&c, &m->u.register_server);
    case DH_WIRE_HEARTBEAT:
        return ck_heartbeat(&c, &m->u.heartbeat);
    case DH_WIRE_DESCRIPTOR_REQUEST:
        return ck_request(&c, &m->u.request);
    case DH_WIRE_ROUTE:
        return ck_route(&c, &m->u.route);
    case DH_WIRE_RESULT_NOTICE:
        return ck_result(&c, &m->u.result);
    case DH_WIRE_ERROR_NOTICE:
        return ck_error(&c, &m->u.error);
    case DH_WIRE_RELEASE:
        if (m->u.release.slot_offset > DH_WIRE_MAX_BYTES)
            return WIRE_BAD(&c, "slot_offset %" PRIu64 " over 2^48",
                            m->u.release.slot_offset);
        return ck_task(&c, &m->u.release.task);
    case DH_WIRE_SHUTDOWN:
        return dh__wire_ck_text(&c, "reason", m->u.shutdown.reason,
                                DH_WIRE_MAX_TEXT, 0);
    default:
        return dh_err_set(e, bad, "wire: message type %d is not a message",
                          (int)m->type);
    }
}
