/*
 * wire_pb.c - conversions between our message structs and the structs that
 * protobuf-c generates from proto/datahelix.proto (see wire_internal.h).
 *
 * Design: encoding builds protobuf-c structs that borrow our memory (no
 * copies but the peer-link pointer array); decoding copies out of the
 * unpacked protobuf-c tree into our structs, refusing a count or a string
 * over its cap before copying it.  Values are checked afterwards, in one
 * place, by dh__wire_check().
 * Pure: no I/O; allocation only through the seam.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "alloc.h"
#include "wire_internal.h"

static ProtobufCBinaryData text_pb(const char *s)
{
    ProtobufCBinaryData b = {strlen(s), (uint8_t *)(uintptr_t)s};

    return b;
}

static PbTask *task_pb(PbTask *pb, const struct dh_wire_task *t)
{
    datahelix__wire__task_id__init(pb);
    pb->epoch = t->epoch;
    pb->pass = t->pass;
    pb->step = t->step;
    pb->rank = t->rank;
    pb->microbatch = t->microbatch;
    pb->id = t->id;
    return pb;
}

static PbPlan *plan_pb(PbPlan *pb, const struct dh_wire_plan *p)
{
    datahelix__wire__sampling_plan__init(pb);
    pb->kind = (Datahelix__Wire__PlanKind)p->kind;
    pb->frames = p->frames;
    pb->fps = p->fps;
    pb->n_indices = p->n_indices;
    pb->indices = p->indices;
    pb->seed = p->seed;
    pb->pad = (Datahelix__Wire__Pad)p->pad;
    pb->width = p->width;
    pb->height = p->height;
    pb->geometry = (Datahelix__Wire__Geometry)p->geometry;
    pb->layout = (Datahelix__Wire__Layout)p->layout;
    pb->dtype = (Datahelix__Wire__DType)p->dtype;
    pb->n_mean = 3;
    pb->mean = (float *)(uintptr_t)p->mean;
    pb->n_std = 3;
    pb->std = (float *)(uintptr_t)p->std;
    pb->snap = (Datahelix__Wire__Snap)p->snap;
    pb->snap_tol = p->snap_tol;
    pb->max_side = p->max_side;
    pb->max_area = p->max_area;
    pb->patch = p->patch;
    pb->audio_rate = p->audio_rate;
    pb->audio_channels = p->audio_channels;
    pb->audio_samples = p->audio_samples;
    pb->audio_required = p->audio_required != 0;
    pb->audio_feature = p->audio_feature;
    pb->audio_n_fft = p->audio_n_fft;
    pb->audio_hop = p->audio_hop;
    pb->audio_mels = p->audio_mels;
    pb->audio_crop = p->audio_crop;
    return pb;
}

static PbRequest *request_pb(struct dh__wire_pb_out *o,
                             const struct dh_wire_request *r)
{
    PbRequest *pb = &o->req;

    datahelix__wire__descriptor_request__init(pb);
    datahelix__wire__deadline_hints__init(&o->hints);
    pb->task = task_pb(&o->req_task, &r->task);
    pb->requester_rank = r->requester_rank;
    pb->n_sample_ids = r->n_samples;
    pb->sample_ids = r->sample_ids;
    pb->plan = plan_pb(&o->plan, &r->plan);
    pb->slack_ms = r->slack_ms;
    pb->n_spare_ids = r->n_spares;
    pb->spare_ids = r->spare_ids;
    o->hints.est_cpu_ms = r->hints.est_cpu_ms;
    o->hints.est_in_bytes = r->hints.est_in_bytes;
    o->hints.est_out_bytes = r->hints.est_out_bytes;
    o->hints.steps_ahead = r->hints.steps_ahead;
    o->hints.local_only = r->hints.local_only ? 1 : 0;
    pb->hints = &o->hints;
    if (r->has_report) {
        datahelix__wire__rank_report__init(&o->report);
        o->report.steps = r->report.steps;
        o->report.misses = r->report.misses;
        o->report.input_wait_ms = r->report.input_wait_ms;
        o->report.window_ms = r->report.window_ms;
        pb->report = &o->report;
    }
    return pb;
}

static void register_client_pb(struct dh__wire_pb_out *o,
                               const struct dh_wire_register_client *r)
{
    Datahelix__Wire__RegisterClient *pb = &o->b.register_client;

    datahelix__wire__register_client__init(pb);
    pb->rank = r->rank;
    pb->world_size = r->world_size;
    pb->pid = r->pid;
    pb->host = text_pb(r->host);
    pb->server_address = text_pb(r->server_addr);
    pb->incarnation = r->incarnation;
    pb->token = text_pb(r->token);
    o->env.register_client = pb;
}

static void register_server_pb(struct dh__wire_pb_out *o,
                               const struct dh_wire_register_server *r)
{
    Datahelix__Wire__RegisterServer *pb = &o->b.register_server;

    datahelix__wire__register_server__init(pb);
    pb->server_id = r->server_id;
    pb->address = text_pb(r->addr);
    pb->role = (Datahelix__Wire__ServerRole)r->role;
    pb->rank = r->rank;
    pb->workers = r->workers;
    pb->arena_bytes = r->arena_bytes;
    pb->host = text_pb(r->host);
    pb->token = text_pb(r->token);
    pb->cpus = r->cpus;
    pb->cpu_set = r->cpu_set;
    pb->sender_secret = text_pb(r->sender_secret);
    o->env.register_server = pb;
}

static int heartbeat_pb(struct dh__wire_pb_out *o,
                        const struct dh_wire_heartbeat *h, struct dh_err *e)
{
    Datahelix__Wire__Heartbeat *pb = &o->b.heartbeat;
    size_t n = h->n_links;

    datahelix__wire__heartbeat__init(pb);
    if (n > 0) {
        o->links = dh__calloc(n, sizeof(*o->links));
        o->link_ptrs = dh__calloc(n, sizeof(*o->link_ptrs));
        if (!o->links || !o->link_ptrs)
            return dh_err_set(e, DH_ENOMEM,
                              "wire: heartbeat: out of memory "
                              "for %zu links",
                              n);
    }
    for (size_t i = 0; i < n; i++) {
        datahelix__wire__peer_link__init(&o->links[i]);
        o->links[i].peer_server_id = h->links[i].peer_server_id;
        o->links[i].bytes_per_s = h->links[i].bytes_per_s;
        o->link_ptrs[i] = &o->links[i];
    }
    pb->server_id = h->server_id;
    pb->seq = h->seq;
    pb->queue_depth = h->queue_depth;
    pb->busy_workers = h->busy_workers;
    pb->latency_ms = h->latency_ms;
    pb->n_links = n;
    pb->links = o->link_ptrs;
    pb->leaving = h->leaving != 0;
    pb->unknown = h->unknown != 0;
    pb->cpu_fraction = h->cpu_fraction;
    pb->slot_waiting = h->slot_waiting;
    pb->read_bytes = h->read_bytes;
    pb->reads = h->reads;
    pb->read_ms = h->read_ms;
    pb->fetched_bytes = h->fetched_bytes;
    pb->cache_hits = h->cache_hits;
    pb->cache_misses = h->cache_misses;
    o->env.heartbeat = pb;
    return 0;
}

static void route_pb(struct dh__wire_pb_out *o, const struct dh_wire_route *r)
{
    Datahelix__Wire__Route *pb = &o->b.route;

    datahelix__wire__route__init(pb);
    pb->task = task_pb(&o->task, &r->task);
    pb->server_id = r->server_id;
    pb->target_server_id = r->target_server_id;
    pb->target_address = text_pb(r->target_addr);
    pb->request = r->has_request ? request_pb(o, &r->request) : NULL;
    pb->sender_token = text_pb(r->sender_token);
    o->env.route = pb;
}

static Datahelix__Wire__StageTimes *stages_pb(struct dh__wire_pb_out *o,
                                              const struct dh_wire_stages *s)
{
    Datahelix__Wire__StageTimes *pb = &o->stages;

    datahelix__wire__stage_times__init(pb);
    pb->queue_ms = s->queue_ms;
    pb->alloc_ms = s->alloc_ms;
    pb->collate_ms = s->collate_ms;
    pb->place_ms = s->place_ms;
    pb->notify_ms = s->notify_ms;
    pb->server_id = s->server_id;
    pb->worker = s->worker;
    pb->ready_us = s->ready_us;
    pb->n_read_ms = pb->n_decode_ms = pb->n_scale_ms = s->n_sample_times;
    pb->n_audio_ms = s->audio_ms ? s->n_sample_times : 0;
    pb->audio_ms = s->audio_ms;
    pb->read_ms = s->read_ms;
    pb->decode_ms = s->decode_ms;
    pb->scale_ms = s->scale_ms;
    pb->n_read_bytes = s->read_bytes ? s->n_sample_times : 0;
    pb->read_bytes = s->read_bytes;
    return pb;
}

static void result_pb(struct dh__wire_pb_out *o, const struct dh_wire_result *r)
{
    Datahelix__Wire__ResultNotice *pb = &o->b.result;

    datahelix__wire__result_notice__init(pb);
    pb->task = task_pb(&o->task, &r->task);
    pb->server_id = r->server_id;
    pb->arena_offset = r->arena_offset;
    pb->length = r->length;
    pb->slot_generation = r->slot_generation;
    pb->n_dims = r->ndims;
    pb->dims = (uint64_t *)(uintptr_t)r->dims;
    pb->dtype = (Datahelix__Wire__DType)r->dtype;
    pb->layout = (Datahelix__Wire__Layout)r->layout;
    pb->n_sample_ids = r->n_samples;
    pb->sample_ids = r->sample_ids;
    pb->n_valid_frames = r->n_samples;
    pb->valid_frames = r->valid_frames;
    pb->service_ms = r->service_ms;
    pb->n_sub_positions = r->n_subs;
    pb->sub_positions = r->sub_pos;
    pb->n_sub_failed_ids = r->n_subs;
    pb->sub_failed_ids = r->sub_failed;
    pb->n_sub_causes = r->n_subs;
    pb->sub_causes = r->sub_cause;
    pb->stages = r->stages.present ? stages_pb(o, &r->stages) : NULL;
    pb->sender_token = text_pb(r->sender_token);
    o->env.result_notice = pb;
}

static void error_pb(struct dh__wire_pb_out *o, const struct dh_wire_error *r)
{
    Datahelix__Wire__ErrorNotice *pb = &o->b.error;

    datahelix__wire__error_notice__init(pb);
    pb->task = task_pb(&o->task, &r->task);
    pb->server_id = r->server_id;
    pb->sample_id = r->sample_id;
    pb->path = text_pb(r->path);
    pb->cause = r->cause;
    pb->message = text_pb(r->message);
    o->env.error_notice = pb;
}

static void release_pb(struct dh__wire_pb_out *o,
                       const struct dh_wire_release *r)
{
    Datahelix__Wire__Release *pb = &o->b.release;

    datahelix__wire__release__init(pb);
    pb->task = task_pb(&o->task, &r->task);
    pb->slot_offset = r->slot_offset;
    pb->generation = r->generation;
    o->env.release = pb;
}

static void shutdown_pb(struct dh__wire_pb_out *o,
                        const struct dh_wire_shutdown *r)
{
    datahelix__wire__shutdown__init(&o->b.shutdown);
    o->b.shutdown.reason = text_pb(r->reason);
    o->env.shutdown = &o->b.shutdown;
}

/* Envelope body case of each message type (field numbers 2..10). */
static const Datahelix__Wire__Envelope__BodyCase body_case_of[] = {
    [DH_WIRE_REGISTER_CLIENT] = DATAHELIX__WIRE__ENVELOPE__BODY_REGISTER_CLIENT,
    [DH_WIRE_REGISTER_SERVER] = DATAHELIX__WIRE__ENVELOPE__BODY_REGISTER_SERVER,
    [DH_WIRE_HEARTBEAT] = DATAHELIX__WIRE__ENVELOPE__BODY_HEARTBEAT,
    [DH_WIRE_DESCRIPTOR_REQUEST] =
        DATAHELIX__WIRE__ENVELOPE__BODY_DESCRIPTOR_REQUEST,
    [DH_WIRE_ROUTE] = DATAHELIX__WIRE__ENVELOPE__BODY_ROUTE,
    [DH_WIRE_RESULT_NOTICE] = DATAHELIX__WIRE__ENVELOPE__BODY_RESULT_NOTICE,
    [DH_WIRE_ERROR_NOTICE] = DATAHELIX__WIRE__ENVELOPE__BODY_ERROR_NOTICE,
    [DH_WIRE_RELEASE] = DATAHELIX__WIRE__ENVELOPE__BODY_RELEASE,
    [DH_WIRE_SHUTDOWN] = DATAHELIX__WIRE__ENVELOPE__BODY_SHUTDOWN,
};

/* Fills o->env from a checked message. */
int dh__wire_to_pb(struct dh__wire_pb_out *o, const struct dh_wire_msg *m,
                   struct dh_err *e)
{
    datahelix__wire__envelope__init(&o->env);
    o->env.version = DH_WIRE_VERSION;
    o->env.body_case = body_case_of[m->type];
    switch (m->type) {
    case DH_WIRE_REGISTER_CLIENT:
        register_client_pb(o, &m->u.register_client);
        return 0;
    case DH_WIRE_REGISTER_SERVER:
        register_server_pb(o, &m->u.register_server);
        return 0;
    case DH_WIRE_HEARTBEAT:
        return heartbeat_pb(o, &m->u.heartbeat, e);
    case DH_WIRE_DESCRIPTOR_REQUEST:
        o->env.descriptor_request = request_pb(o, &m->u.request);
        return 0;
    case DH_WIRE_ROUTE:
        route_pb(o, &m->u.route);
        return 0;
    case DH_WIRE_RESULT_NOTICE:
        result_pb(o, &m->u.result);
        return 0;
    case DH_WIRE_ERROR_NOTICE:
        error_pb(o, &m->u.error);
        return 0;
    case DH_WIRE_RELEASE:
        release_pb(o, &m->u.release);
        return 0;
    default: /* dh__wire_check() let nothing else through */
        shutdown_pb(o, &m->u.shutdown);
        return 0;
    }
}

/* A text field from the wire: at most `cap` bytes, no NUL. */
static int text_from_pb(const struct dh__wire_ck *c, const char *field,
                        char *dst, size_t cap, const ProtobufCBinaryData *b)
{
    if (b->len > cap)
        return WIRE_BIG(c, "%s: %zu bytes over the cap of %zu", field, b->len,
                        cap);
    if (b->len > 0 && memchr(b->data, '\0', b->len))
        return WIRE_BAD(c, "%s contains a NUL byte", field);
    if (b->len > 0)
        memcpy(dst, b->data, b->len);
    dst[b->len] = '\0';
    return 0;
}

static int task_from_pb(const struct dh__wire_ck *c, struct dh_wire_task *t,
                        const PbTask *pb)
{
    if (!pb)
        return WIRE_BAD(c, "task is missing");
    t->epoch = pb->epoch;
    t->pass = pb->pass;
    t->step = pb->step;
    t->rank = pb->rank;
    t->microbatch = pb->microbatch;
    t->id = pb->id;
    return 0;
}

/* dh__wire_copy_array() with the field named under c->where. */
static int array_from_pb(const struct dh__wire_ck *c, const char *field,
                         void **out, const void *src, size_t n, size_t size,
                         size_t cap)
{
    char name[96];

    snprintf(name, sizeof(name), "%s.%s", c->where, field);
    return dh__wire_copy_array(out, src, n, size, cap, name, c->e);
}

static int floats3_from_pb(const struct dh__wire_ck *c, const char *field,
                           float *dst, const float *src, size_t n)
{
    if (n != 0 && n != 3)
        return WIRE_BAD(c, "%s has %zu values, not 0 or 3", field, n);
    if (n == 3)
        memcpy(dst, src, 3 * sizeof(*dst));
    return 0;
}

static int plan_from_pb(const struct dh__wire_ck *c, struct dh_wire_plan *p,
                        const PbPlan *pb)
{
    void *idx;
    int rc;

    if (!pb)
        return WIRE_BAD(c, "plan is missing");
    if ((rc = floats3_from_pb(c, "plan.mean", p->mean, pb->mean, pb->n_mean)) <
            0 ||
        (rc = floats3_from_pb(c, "plan.std", p->std, pb->std, pb->n_std)) < 0 ||
        (rc = array_from_pb(c, "plan.indices", &idx, pb->indices, pb->n_indices,
                            sizeof(*pb->indices), DH_WIRE_MAX_FRAMES)) < 0)
        return rc;
    p->indices = idx;
    p->n_indices = (uint32_t)pb->n_indices;
    /* Enums are stored as sent; dh__wire_check() rejects the out-of-range ones.
     */
    p->kind = (enum dh_plan_kind)pb->kind;
    p->frames = pb->frames;
    p->fps = pb->fps;
    p->seed = pb->seed;
    p->pad = (enum dh_pad)pb->pad;
    p->width = pb->width;
    p->height = pb->height;
    p->geometry = (enum dh_geometry)pb->geometry;
    p->layout = (enum dh_layout)pb->layout;
    p->dtype = (enum dh_dtype)pb->dtype;
    p->snap = (enum dh_snap)pb->snap;
    p->snap_tol = pb->snap_tol;
    p->max_side = pb->max_side;
    p->max_area = pb->max_area;
    p->patch = pb->patch;
    p->audio_rate = pb->audio_rate;
    p->audio_channels = pb->audio_channels;
    p->audio_samples = pb->audio_samples;
    p->audio_required = pb->audio_required;
    p->audio_feature = pb->audio_feature;
    p->audio_n_fft = pb->audio_n_fft;
    p->audio_hop = pb->audio_hop;
    p->audio_mels = pb->audio_mels;
    p->audio_crop = pb->audio_crop;
    return 0;
}

static int request_from_pb(const struct dh__wire_ck *c,
                           struct dh_wire_request *r, const PbRequest *pb)
{
    void *ids;
    int rc;

    if ((rc = task_from_pb(c, &r->task, pb->task)) < 0 ||
        (rc = plan_from_pb(c, &r->plan, pb->plan)) < 0 ||
        (rc = array_from_pb(c, "sample_ids", &ids, pb->sample_ids,
                            pb->n_sample_ids, sizeof(*pb->sample_ids),
                            DH_WIRE_MAX_SAMPLES)) < 0)
        return rc;
    r->sample_ids = ids;
    r->n_samples = (uint32_t)pb->n_sample_ids;
    if ((rc = array_from_pb(c, "spare_ids", &ids, pb->spare_ids,
                            pb->n_spare_ids, sizeof(*pb->spare_ids),
                            DH_WIRE_MAX_SPARES)) < 0)
        return rc;
    r->spare_ids = ids;
    r->n_spares = (uint32_t)pb->n_spare_ids;
    r->requester_rank = pb->requester_rank;
    r->slack_ms = pb->slack_ms;
    if (pb->hints) {
        r->hints.est_cpu_ms = pb->hints->est_cpu_ms;
        r->hints.est_in_bytes = pb->hints->est_in_bytes;
        r->hints.est_out_bytes = pb->hints->est_out_bytes;
        r->hints.steps_ahead = pb->hints->steps_ahead;
        r->hints.local_only = pb->hints->local_only ? 1 : 0;
    }
    if (pb->report) {
        r->has_report = 1;
        r->report.steps = pb->report->steps;
        r->report.misses = pb->report->misses;
        r->report.input_wait_ms = pb->report->input_wait_ms;
        r->report.window_ms = pb->report->window_ms;
    }
    return 0;
}

static int register_client_from_pb(const struct dh__wire_ck *c,
                                   struct dh_wire_register_client *r,
                                   const Datahelix__Wire__RegisterClient *pb)
{
    int rc;

    r->rank = pb->rank;
    r->world_size = pb->world_size;
    r->pid = pb->pid;
    r->incarnation = pb->incarnation;
    if ((rc = text_from_pb(c, "host", r->host, DH_WIRE_MAX_HOST, &pb->host)) <
        0)
        return rc;
    if ((rc = text_from_pb(c, "server_address", r->server_addr,
                           DH_WIRE_MAX_ADDR, &pb->server_address)) < 0)
        return rc;
    return text_from_pb(c, "token", r->token, DH_WIRE_TOKEN_LEN, &pb->token);
}

static int register_server_from_pb(const struct dh__wire_ck *c,
                                   struct dh_wire_register_server *r,
                                   const Datahelix__Wire__RegisterServer *pb)
{
    int rc;

    r->server_id = pb->server_id;
    r->role = (enum dh_wire_role)pb->role;
    r->rank = pb->rank;
    r->workers = pb->workers;
    r->arena_bytes = pb->arena_bytes;
    r->cpus = pb->cpus;
    r->cpu_set = pb->cpu_set;
    if ((rc = text_from_pb(c, "address", r->addr, DH_WIRE_MAX_ADDR,
                           &pb->address)) < 0)
        return rc;
    if ((rc = text_from_pb(c, "host", r->host, DH_WIRE_MAX_HOST, &pb->host)) <
        0)
        return rc;
    if ((rc = text_from_pb(c, "sender_secret", r->sender_secret,
                           DH_WIRE_TOKEN_LEN, &pb->sender_secret)) < 0)
        return rc;
    return text_from_pb(c, "token", r->token, DH_WIRE_TOKEN_LEN, &pb->token);
}

static int heartbeat_from_pb(const struct dh__wire_ck *c,
                             struct dh_wire_heartbeat *h,
                             const Datahelix__Wire__Heartbeat *pb)
{
    void *links;
    int rc;

    if ((rc = array_from_pb(c, "links", &links, NULL, pb->n_links,
                            sizeof(*h->links), DH_WIRE_MAX_PEERS)) < 0)
        return rc;
    h->links = links;
    h->n_links = (uint32_t)pb->n_links;
    for (size_t i = 0; i < pb->n_links; i++) {
        h->links[i].peer_server_id = pb->links[i]->peer_server_id;
        h->links[i].bytes_per_s = pb->links[i]->bytes_per_s;
    }
    h->server_id = pb->server_id;
    h->seq = pb->seq;
    h->queue_depth = pb->queue_depth;
    h->busy_workers = pb->busy_workers;
    h->latency_ms = pb->latency_ms;
    h->leaving = pb->leaving != 0;
    h->unknown = pb->unknown != 0;
    h->cpu_fraction = pb->cpu_fraction;
    h->slot_waiting = pb->slot_waiting;
    h->read_bytes = pb->read_bytes;
    h->reads = pb->reads;
    h->read_ms = pb->read_ms;
    h->fetched_bytes = pb->fetched_bytes;
    h->cache_hits = pb->cache_hits;
    h->cache_misses = pb->cache_misses;
    return 0;
}

static int route_from_pb(const struct dh__wire_ck *c, struct dh_wire_route *r,
                         const Datahelix__Wire__Route *pb)
{
    struct dh__wire_ck sub = {c->bad, "route.request", c->e};
    int rc;

    if ((rc = task_from_pb(c, &r->task, pb->task)) < 0 ||
        (rc = text_from_pb(c, "target_address", r->target_addr,
                           DH_WIRE_MAX_ADDR, &pb->target_address)) < 0 ||
        (rc = text_from_pb(c, "sender_token", r->sender_token,
                           DH_WIRE_TOKEN_LEN, &pb->sender_token)) < 0)
        return rc;
    r->server_id = pb->server_id;
    r->target_server_id = pb->target_server_id;
    r->has_request = pb->request != NULL;
    return pb->request ? request_from_pb(&sub, &r->request, pb->request) : 0;
}

/* The three substitution arrays: one count, at most DH_WIRE_MAX_SPARES,
 * checked before anything is copied. */
static int subs_from_pb(const struct dh__wire_ck *c, struct dh_wire_result *r,
                        const Datahelix__Wire__ResultNotice *pb)
{
    void *p;
    int rc;

    if (pb->n_sub_failed_ids != pb->n_sub_positions ||
        pb->n_sub_causes != pb->n_sub_positions)
        return WIRE_BAD(c,
                        "sub_positions, sub_failed_ids and sub_causes have "
                        "%zu, %zu and %zu entries",
                        pb->n_sub_positions, pb->n_sub_failed_ids,
                        pb->n_sub_causes);
    if ((rc = array_from_pb(c, "sub_positions", &p, pb->sub_positions,
                            pb->n_sub_positions, sizeof(*pb->sub_positions),
                            DH_WIRE_MAX_SPARES)) < 0)
        return rc;
    r->sub_pos = p;
    if ((rc = array_from_pb(c, "sub_failed_ids", &p, pb->sub_failed_ids,
                            pb->n_sub_failed_ids, sizeof(*pb->sub_failed_ids),
                            DH_WIRE_MAX_SPARES)) < 0)
        return rc;
    r->sub_failed = p;
    if ((rc = array_from_pb(c, "sub_causes", &p, pb->sub_causes,
                            pb->n_sub_causes, sizeof(*pb->sub_causes),
                            DH_WIRE_MAX_SPARES)) < 0)
        return rc;
    r->sub_cause = p;
    r->n_subs = (uint32_t)pb->n_sub_positions;
    return 0;
}

/* The stage times: the three per-sample arrays share one count (0 or the
 * sample count: dh__wire_check() compares it with the result's). */
static int stages_from_pb(const struct dh__wire_ck *c, struct dh_wire_stages *s,
                          const Datahelix__Wire__StageTimes *pb)
{
    void *p;
    int rc;

    if (pb->n_decode_ms != pb->n_read_ms || pb->n_scale_ms != pb->n_read_ms)
        return WIRE_BAD(c,
                        "stages: read_ms, decode_ms and scale_ms have %zu, "
                        "%zu and %zu entries",
                        pb->n_read_ms, pb->n_decode_ms, pb->n_scale_ms);
    if ((rc = array_from_pb(c, "stages.read_ms", &p, pb->read_ms, pb->n_read_ms,
                            sizeof(float), DH_WIRE_MAX_SAMPLES)) < 0)
        return rc;
    s->read_ms = p;
    if ((rc = array_from_pb(c, "stages.decode_ms", &p, pb->decode_ms,
                            pb->n_decode_ms, sizeof(float),
                            DH_WIRE_MAX_SAMPLES)) < 0)
        return rc;
    s->decode_ms = p;
    if ((rc = array_from_pb(c, "stages.scale_ms", &p, pb->scale_ms,
                            pb->n_scale_ms, sizeof(float),
                            DH_WIRE_MAX_SAMPLES)) < 0)
        return rc;
    s->scale_ms = p;
    if (pb->n_read_bytes && pb->n_read_bytes != pb->n_read_ms)
        return WIRE_BAD(c, "stages: read_bytes has %zu entries, read_ms %zu",
                        pb->n_read_bytes, pb->n_read_ms);
    if (pb->n_audio_ms && pb->n_audio_ms != pb->n_read_ms)
        return WIRE_BAD(c, "stages: audio_ms has %zu entries, read_ms %zu",
                        pb->n_audio_ms, pb->n_read_ms);
    if (pb->n_audio_ms) {
        if ((rc = array_from_pb(c, "stages.audio_ms", &p, pb->audio_ms,
                                pb->n_audio_ms, sizeof(float),
                                DH_WIRE_MAX_SAMPLES)) < 0)
            return rc;
        s->audio_ms = p;
    }
    if (pb->n_read_bytes) {
        if ((rc = array_from_pb(c, "stages.read_bytes", &p, pb->read_bytes,
                                pb->n_read_bytes, sizeof(uint64_t),
                                DH_WIRE_MAX_SAMPLES)) < 0)
            return rc;
        s->read_bytes = p;
    }
    s->n_sample_times = (uint32_t)pb->n_read_ms;
    s->queue_ms = pb->queue_ms;
    s->alloc_ms = pb->alloc_ms;
    s->collate_ms = pb->collate_ms;
    s->place_ms = pb->place_ms;
    s->notify_ms = pb->notify_ms;
    s->server_id = pb->server_id;
    s->worker = pb->worker;
    s->ready_us = pb->ready_us;
    s->present = 1;
    return 0;
}

static int result_from_pb(const struct dh__wire_ck *c, struct dh_wire_result *r,
                          const Datahelix__Wire__ResultNotice *pb)
{
    void *ids, *vf;
    int rc;

    if ((rc = task_from_pb(c, &r->task, pb->task)) < 0 ||
        (rc = text_from_pb(c, "sender_token", r->sender_token,
                           DH_WIRE_TOKEN_LEN, &pb->sender_token)) < 0)
        return rc;
    if (pb->n_dims > DH_WIRE_MAX_DIMS)
        return WIRE_BIG(c, "dims: %zu dims over the cap of %u", pb->n_dims,
                        DH_WIRE_MAX_DIMS);
    if (pb->n_valid_frames != pb->n_sample_ids)
        return WIRE_BAD(c, "valid_frames has %zu entries for %zu sample_ids",
                        pb->n_valid_frames, pb->n_sample_ids);
    if ((rc = array_from_pb(c, "sample_ids", &ids, pb->sample_ids,
                            pb->n_sample_ids, sizeof(*pb->sample_ids),
                            DH_WIRE_MAX_SAMPLES)) < 0)
        return rc;
    r->sample_ids = ids; /* owned by r from here: fini frees it */
    if ((rc = array_from_pb(c, "valid_frames", &vf, pb->valid_frames,
                            pb->n_valid_frames, sizeof(*pb->valid_frames),
                            DH_WIRE_MAX_SAMPLES)) < 0)
        return rc;
    r->valid_frames = vf;
    r->n_samples = (uint32_t)pb->n_sample_ids;
    if (pb->n_dims > 0)
        memcpy(r->dims, pb->dims, pb->n_dims * sizeof(*pb->dims));
    r->ndims = (uint32_t)pb->n_dims;
    r->server_id = pb->server_id;
    r->arena_offset = pb->arena_offset;
    r->length = pb->length;
    r->slot_generation = pb->slot_generation;
    r->dtype = (enum dh_dtype)pb->dtype;
    r->layout = (enum dh_layout)pb->layout;
    r->service_ms = pb->service_ms;
    if ((rc = subs_from_pb(c, r, pb)) < 0)
        return rc;
    return pb->stages ? stages_from_pb(c, &r->stages, pb->stages) : 0;
}

static int error_from_pb(const struct dh__wire_ck *c, struct dh_wire_error *r,
                         const Datahelix__Wire__ErrorNotice *pb)
{
    int rc;

    if ((rc = task_from_pb(c, &r->task, pb->task)) < 0 ||
        (rc = text_from_pb(c, "path", r->path, DH_WIRE_MAX_PATH, &pb->path)) <
            0 ||
        (rc = text_from_pb(c, "message", r->message, DH_WIRE_MAX_TEXT,
                           &pb->message)) < 0)
        return rc;
    r->server_id = pb->server_id;
    r->sample_id = pb->sample_id;
    r->cause = pb->cause;
    return 0;
}

/* Our message type of an envelope's body (DH_WIRE_NONE: none). */
enum dh_wire_type dh__wire_type_of(Datahelix__Wire__Envelope__BodyCase bc)
{
    for (int t = DH_WIRE_REGISTER_CLIENT; t <= DH_WIRE_SHUTDOWN; t++)
        if (body_case_of[t] == bc)
            return (enum dh_wire_type)t;
    return DH_WIRE_NONE;
}

int dh__wire_from_pb(struct dh_wire_msg *m, const PbEnvelope *env,
                     struct dh_err *e)
{
    struct dh__wire_ck c = {DH_EFORMAT, dh_wire_type_name(m->type), e};

    switch (m->type) {
    case DH_WIRE_REGISTER_CLIENT:
        return register_client_from_pb(&c, &m->u.register_client,
                                       env->register_client);
    case DH_WIRE_REGISTER_SERVER:
        return register_server_from_pb(&c, &m->u.register_server,
                                       env->register_server);
    case DH_WIRE_HEARTBEAT:
        return heartbeat_from_pb(&c, &m->u.heartbeat, env->heartbeat);
    case DH_WIRE_DESCRIPTOR_REQUEST:
        return request_from_pb(&c, &m->u.request, env->descriptor_request);
    case DH_WIRE_ROUTE:
        return route_from_pb(&c, &m->u.route, env->route);
    case DH_WIRE_RESULT_NOTICE:
        return result_from_pb(&c, &m->u.result, env->result_notice);
    case DH_WIRE_ERROR_NOTICE:
        return error_from_pb(&c, &m->u.error, env->error_notice);
    case DH_WIRE_RELEASE:
        m->u.release.slot_offset = env->release->slot_offset;
        m->u.release.generation = env->release->generation;
        return task_from_pb(&c, &m->u.release.task, env->release->task);
    case DH_WIRE_SHUTDOWN:
        return text_from_pb(&c, "reason", m->u.shutdown.reason,
                            DH_WIRE_MAX_TEXT, &env->shutdown->reason);
    default:
        return dh_err_set(e, DH_EFORMAT,
                          "wire: envelope has no body (or "
                          "one this version does not know)");
    }
}
