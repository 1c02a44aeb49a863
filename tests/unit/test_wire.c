/*
 * test_wire.c - the wire codec: round trip of every message type with edge
 * values; every rejection rule, with the bad message built through the
 * generated protobuf-c API so the bytes are well-formed protobuf that break
 * only our caps; truncation at every length; random bytes and bit flips;
 * the task-id layout; allocation failure at every step of decode and encode.
 */
#include <inttypes.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/alloc.h"
#include "datahelix.pb-c.h"
#include "datahelix/media_stages.h"
#include "datahelix/wire.h"

#define ALL_TYPES_N 10 /* message types, and a route with a request */

/* ---- valid messages with edge values ---- */

static void fill_text(char *dst, size_t n, char c)
{
    memset(dst, c, n);
    dst[n] = '\0';
}

static void task_max(struct dh_wire_task *t)
{
    assert_int_equal(dh_wire_task_make(t, UINT32_MAX, 65535, (1u << 24) - 1,
                                       65535, 255, NULL),
                     0);
}

static void fill_request(struct dh_wire_request *r, size_t n)
{
    uint64_t *ids = calloc(n, sizeof(*ids));
    const int64_t idx[3] = {0, 7, INT64_MAX};

    assert_non_null(ids);
    for (size_t i = 0; i < n; i++)
        ids[i] = i == 0 ? UINT64_MAX : i * 977;
    task_max(&r->task);
    r->requester_rank = 65535;
    assert_int_equal(dh_wire_set_samples(r, ids, n, NULL), 0);
    free(ids);
    r->plan.kind = DH_PLAN_INDICES;
    r->plan.frames = 3;
    assert_int_equal(dh_wire_set_indices(&r->plan, idx, 3, NULL), 0);
    r->plan.seed = UINT64_MAX;
    r->plan.pad = DH_PAD_ZERO;
    r->plan.width = DH_WIRE_MAX_DIM;
    r->plan.height = 1;
    r->plan.geometry = DH_GEOM_RANDOM_CROP;
    r->plan.layout = DH_LAYOUT_TCHW;
    r->plan.dtype = DH_DTYPE_F32;
    r->plan.mean[2] = -0.5f;
    r->plan.std[0] = 3.0f;
    r->plan.snap = DH_SNAP_KEY;
    r->plan.snap_tol = -1.5;
    r->slack_ms = -DH_WIRE_MAX_SLACK_MS;
    r->hints.est_cpu_ms = 12.25;
    r->hints.est_in_bytes = DH_WIRE_MAX_BYTES;
    r->hints.est_out_bytes = 1;
    r->hints.steps_ahead = UINT32_MAX;
    r->hints.local_only = 1;
    r->has_report = 1;
    r->report.steps = DH_WIRE_MAX_BYTES;
    r->report.misses = DH_WIRE_MAX_BYTES;
    r->report.input_wait_ms = 12.5;
    r->report.window_ms = DH_WIRE_MAX_LATENCY_MS;
    {
        uint64_t sp[DH_WIRE_MAX_SPARES];

        for (size_t i = 0; i < DH_WIRE_MAX_SPARES; i++)
            sp[i] = i == 0 ? UINT64_MAX : 5 + i;
        assert_int_equal(dh_wire_set_spares(r, sp, DH_WIRE_MAX_SPARES, NULL),
                         0);
    }
}

static void fill_heartbeat(struct dh_wire_heartbeat *h)
{
    struct dh_wire_link *l = calloc(DH_WIRE_MAX_PEERS, sizeof(*l));

    assert_non_null(l);
    for (uint32_t i = 0; i < DH_WIRE_MAX_PEERS; i++) {
        l[i].peer_server_id = i == 0 ? UINT32_MAX : i;
        l[i].bytes_per_s = i == 1 ? DH_WIRE_MAX_BYTES : i * 1000u;
    }
    h->server_id = UINT32_MAX;
    h->seq = UINT64_MAX;
    h->read_bytes = UINT64_MAX;
    h->reads = 12345;
    h->read_ms = DH_WIRE_MAX_TOTAL_MS;
    h->queue_depth = DH_WIRE_MAX_QUEUE;
    h->busy_workers = DH_WIRE_MAX_WORKERS;
    h->latency_ms = DH_WIRE_MAX_LATENCY_MS;
    h->leaving = 1;
    assert_int_equal(dh_wire_set_links(h, l, DH_WIRE_MAX_PEERS, NULL), 0);
    free(l);
}

static void fill_result(struct dh_wire_result *r)
{
    static const uint64_t ids[3] = {0, 1, UINT64_MAX};
    static const uint32_t vf[3] = {0, 16, DH_WIRE_MAX_FRAMES};

    task_max(&r->task);
    fill_text(r->sender_token, DH_WIRE_TOKEN_LEN, 'c');
    r->server_id = 1;
    r->arena_offset = DH_WIRE_MAX_BYTES;
    r->slot_generation = UINT32_MAX;
    r->ndims = 5;
    r->dims[0] = 3;
    r->dims[1] = 16;
    r->dims[2] = 2;
    r->dims[3] = 4;
    r->dims[4] = 3;
    r->dtype = DH_DTYPE_F32;
    r->layout = DH_LAYOUT_TCHW;
    r->length = 3 * 16 * 2 * 4 * 3 * 4; /* exactly the tensor */
    r->service_ms = 12.5;
    assert_int_equal(dh_wire_set_result_samples(r, ids, vf, 3, NULL), 0);
    {
        static const uint32_t pos[2] = {0, 2};
        static const uint64_t failed[2] = {UINT64_MAX - 1, 7};
        static const int32_t cause[2] = {INT32_MIN, -1};

        assert_int_equal(
            dh_wire_set_result_subs(r, pos, failed, cause, 2, NULL), 0);
    }
    {
        /* stage times (docs/trace.md): rows of read, decode, scale,
         * audio (DH_MS_COUNT) */
        static const float rows[12] = {0.5f, 30.25f, 2,    0,    0,      0,
                                       0,    1.5f,   1.5f, 1e6f, 0.125f, 0};

        r->stages = (struct dh_wire_stages){.present = 1,
                                            .queue_ms = 3.5,
                                            .alloc_ms = 0.25,
                                            .collate_ms = 1e9,
                                            .place_ms = 7,
                                            .notify_ms = 4.5,
                                            .worker = DH_WIRE_MAX_WORKERS - 1,
                                            .server_id = UINT32_MAX,
                                            .ready_us = UINT64_MAX};
        assert_int_equal(dh_wire_set_result_stages(r, rows, 3, NULL), 0);
        assert_non_null(r->stages.audio_ms); /* one sample had sound */
        assert_true(r->stages.audio_ms[1] == 1.5f);
        {
            const uint64_t rb[3] = {0, 1, UINT64_MAX};

            assert_int_equal(dh_wire_set_result_read_bytes(r, rb, 2, NULL),
                             DH_EINVAL); /* not the times' count */
            assert_int_equal(dh_wire_set_result_read_bytes(r, rb, 3, NULL), 0);
        }
    }
}

/* Message number `i` of ALL_TYPES_N, with edge values. */
static void fill_msg(struct dh_wire_msg *m, int i)
{
    enum dh_wire_type t = i < 9 ? (enum dh_wire_type)(i + 1) : DH_WIRE_ROUTE;

    dh_wire_msg_init(m, t);
    switch (t) {
    case DH_WIRE_REGISTER_CLIENT:
        m->u.register_client.rank = DH_WIRE_MAX_RANKS - 1;
        m->u.register_client.world_size = DH_WIRE_MAX_RANKS;
        m->u.register_client.pid = UINT32_MAX;
        fill_text(m->u.register_client.host, DH_WIRE_MAX_HOST, 'h');
        fill_text(m->u.register_client.server_addr, DH_WIRE_MAX_ADDR, 'a');
        fill_text(m->u.register_client.token, DH_WIRE_TOKEN_LEN, 'f');
        break;
    case DH_WIRE_REGISTER_SERVER:
        m->u.register_server.server_id = 1;
        snprintf(m->u.register_server.addr, sizeof(m->u.register_server.addr),
                 "%s", "tcp://127.0.0.1:7501");
        m->u.register_server.role = DH_WIRE_ROLE_LOCAL;
        m->u.register_server.rank = DH_WIRE_MAX_RANKS - 1;
        m->u.register_server.workers = DH_WIRE_MAX_WORKERS;
        m->u.register_server.arena_bytes = DH_WIRE_MAX_BYTES;
        fill_text(m->u.register_server.token, DH_WIRE_TOKEN_LEN, '0');
        fill_text(m->u.register_server.sender_secret, DH_WIRE_TOKEN_LEN, '9');
        break;
    case DH_WIRE_HEARTBEAT:
        fill_heartbeat(&m->u.heartbeat);
        break;
    case DH_WIRE_DESCRIPTOR_REQUEST:
        fill_request(&m->u.request, DH_WIRE_MAX_SAMPLES);
        break;
    case DH_WIRE_ROUTE:
        task_max(&m->u.route.task);
        m->u.route.server_id = UINT32_MAX;
        m->u.route.target_server_id = 1;
        fill_text(m->u.route.sender_token, DH_WIRE_TOKEN_LEN, 'a');
        if (i == 9) {
            snprintf(m->u.route.target_addr, sizeof(m->u.route.target_addr),
                     "%s", "ipc:///run/dh/0");
            m->u.route.has_request = 1;
            fill_request(&m->u.route.request, 2);
        }
        break;
    case DH_WIRE_RESULT_NOTICE:
        fill_result(&m->u.result);
        break;
    case DH_WIRE_ERROR_NOTICE:
        task_max(&m->u.error.task);
        m->u.error.server_id = 7;
        m->u.error.sample_id = UINT64_MAX;
        fill_text(m->u.error.path, DH_WIRE_MAX_PATH, 'p');
        m->u.error.cause = INT32_MIN;
        fill_text(m->u.error.message, DH_WIRE_MAX_TEXT, 'm');
        break;
    case DH_WIRE_RELEASE:
        task_max(&m->u.release.task);
        m->u.release.slot_offset = DH_WIRE_MAX_BYTES;
        m->u.release.generation = UINT32_MAX;
        break;
    default:
        snprintf(m->u.shutdown.reason, sizeof(m->u.shutdown.reason), "%s",
                 "SIGTERM \xc3\xa9");
        break;
    }
}

/* ---- deep equality ---- */

static void assert_task_eq(const struct dh_wire_task *a,
                           const struct dh_wire_task *b)
{
    assert_int_equal(a->epoch, b->epoch);
    assert_int_equal(a->pass, b->pass);
    assert_int_equal(a->step, b->step);
    assert_int_equal(a->rank, b->rank);
    assert_int_equal(a->microbatch, b->microbatch);
    assert_int_equal(a->id, b->id);
}

static void assert_plan_eq(const struct dh_wire_plan *a,
                           const struct dh_wire_plan *b)
{
    assert_int_equal(a->kind, b->kind);
    assert_int_equal(a->frames, b->frames);
    assert_true(a->fps == b->fps);
    assert_int_equal(a->n_indices, b->n_indices);
    if (a->n_indices)
        assert_memory_equal(a->indices, b->indices,
                            a->n_indices * sizeof(*a->indices));
    assert_int_equal(a->seed, b->seed);
    assert_int_equal(a->pad, b->pad);
    assert_int_equal(a->width, b->width);
    assert_int_equal(a->height, b->height);
    assert_int_equal(a->geometry, b->geometry);
    assert_int_equal(a->layout, b->layout);
    assert_int_equal(a->dtype, b->dtype);
    assert_memory_equal(a->mean, b->mean, sizeof(a->mean));
    assert_memory_equal(a->std, b->std, sizeof(a->std));
    assert_int_equal(a->snap, b->snap);
    assert_true(a->snap_tol == b->snap_tol);
    assert_int_equal(a->max_side, b->max_side);
    assert_int_equal(a->max_area, b->max_area);
    assert_int_equal(a->patch, b->patch);
    assert_int_equal(a->audio_rate, b->audio_rate);
    assert_int_equal(a->audio_channels, b->audio_channels);
    assert_int_equal(a->audio_samples, b->audio_samples);
    assert_int_equal(a->audio_required, b->audio_required);
    assert_int_equal(a->audio_feature, b->audio_feature);
    assert_int_equal(a->audio_n_fft, b->audio_n_fft);
    assert_int_equal(a->audio_hop, b->audio_hop);
    assert_int_equal(a->audio_mels, b->audio_mels);
    assert_int_equal(a->audio_crop, b->audio_crop);
}

static void assert_request_eq(const struct dh_wire_request *a,
                              const struct dh_wire_request *b)
{
    assert_task_eq(&a->task, &b->task);
    assert_int_equal(a->requester_rank, b->requester_rank);
    assert_int_equal(a->n_samples, b->n_samples);
    assert_memory_equal(a->sample_ids, b->sample_ids,
                        a->n_samples * sizeof(*a->sample_ids));
    assert_plan_eq(&a->plan, &b->plan);
    assert_int_equal(a->slack_ms, b->slack_ms);
    assert_true(a->hints.est_cpu_ms == b->hints.est_cpu_ms);
    assert_int_equal(a->hints.est_in_bytes, b->hints.est_in_bytes);
    assert_int_equal(a->hints.est_out_bytes, b->hints.est_out_bytes);
    assert_int_equal(a->hints.steps_ahead, b->hints.steps_ahead);
    assert_int_equal(a->hints.local_only, b->hints.local_only);
    assert_int_equal(a->has_report, b->has_report);
    assert_int_equal(a->report.steps, b->report.steps);
    assert_int_equal(a->report.misses, b->report.misses);
    assert_true(a->report.input_wait_ms == b->report.input_wait_ms);
    assert_true(a->report.window_ms == b->report.window_ms);
    assert_int_equal(a->n_spares, b->n_spares);
    if (a->n_spares)
        assert_memory_equal(a->spare_ids, b->spare_ids,
                            a->n_spares * sizeof(*a->spare_ids));
}

static void assert_heartbeat_eq(const struct dh_wire_heartbeat *a,
                                const struct dh_wire_heartbeat *b)
{
    assert_int_equal(a->server_id, b->server_id);
    assert_int_equal(a->seq, b->seq);
    assert_int_equal(a->queue_depth, b->queue_depth);
    assert_int_equal(a->busy_workers, b->busy_workers);
    assert_true(a->latency_ms == b->latency_ms);
    assert_int_equal(a->leaving, b->leaving);
    assert_int_equal(a->read_bytes, b->read_bytes);
    assert_int_equal(a->reads, b->reads);
    assert_true(a->read_ms == b->read_ms);
    assert_int_equal(a->n_links, b->n_links);
    for (uint32_t i = 0; i < a->n_links; i++) {
        assert_int_equal(a->links[i].peer_server_id,
                         b->links[i].peer_server_id);
        assert_int_equal(a->links[i].bytes_per_s, b->links[i].bytes_per_s);
    }
}

static void assert_result_eq(const struct dh_wire_result *a,
                             const struct dh_wire_result *b)
{
    assert_task_eq(&a->task, &b->task);
    assert_int_equal(a->server_id, b->server_id);
    assert_string_equal(a->sender_token, b->sender_token);
    assert_int_equal(a->arena_offset, b->arena_offset);
    assert_int_equal(a->length, b->length);
    assert_int_equal(a->slot_generation, b->slot_generation);
    assert_int_equal(a->ndims, b->ndims);
    assert_memory_equal(a->dims, b->dims, a->ndims * sizeof(a->dims[0]));
    assert_int_equal(a->dtype, b->dtype);
    assert_int_equal(a->layout, b->layout);
    assert_true(a->service_ms == b->service_ms);
    assert_int_equal(a->n_samples, b->n_samples);
    assert_memory_equal(a->sample_ids, b->sample_ids,
                        a->n_samples * sizeof(*a->sample_ids));
    assert_memory_equal(a->valid_frames, b->valid_frames,
                        a->n_samples * sizeof(*a->valid_frames));
    assert_int_equal(a->stages.present, b->stages.present);
    assert_true(a->stages.queue_ms == b->stages.queue_ms &&
                a->stages.alloc_ms == b->stages.alloc_ms &&
                a->stages.collate_ms == b->stages.collate_ms &&
                a->stages.place_ms == b->stages.place_ms &&
                a->stages.notify_ms == b->stages.notify_ms);
    assert_int_equal(a->stages.worker, b->stages.worker);
    assert_int_equal(a->stages.server_id, b->stages.server_id);
    assert_int_equal(a->stages.ready_us, b->stages.ready_us);
    assert_int_equal(a->stages.n_sample_times, b->stages.n_sample_times);
    if (a->stages.n_sample_times) {
        size_t n = a->stages.n_sample_times * sizeof(float);

        assert_memory_equal(a->stages.read_ms, b->stages.read_ms, n);
        assert_memory_equal(a->stages.decode_ms, b->stages.decode_ms, n);
        assert_memory_equal(a->stages.scale_ms, b->stages.scale_ms, n);
        assert_true(!a->stages.audio_ms == !b->stages.audio_ms);
        if (a->stages.audio_ms)
            assert_memory_equal(a->stages.audio_ms, b->stages.audio_ms, n);
        assert_true(!a->stages.read_bytes == !b->stages.read_bytes);
        if (a->stages.read_bytes)
            assert_memory_equal(a->stages.read_bytes, b->stages.read_bytes,
                                a->stages.n_sample_times * sizeof(uint64_t));
    }
    assert_int_equal(a->n_subs, b->n_subs);
    if (a->n_subs) {
        assert_memory_equal(a->sub_pos, b->sub_pos,
                            a->n_subs * sizeof(*a->sub_pos));
        assert_memory_equal(a->sub_failed, b->sub_failed,
                            a->n_subs * sizeof(*a->sub_failed));
        assert_memory_equal(a->sub_cause, b->sub_cause,
                            a->n_subs * sizeof(*a->sub_cause));
    }
}

static void assert_msg_eq(const struct dh_wire_msg *a,
                          const struct dh_wire_msg *b)
{
    const struct dh_wire_register_client *ca = &a->u.register_client,
                                         *cb = &b->u.register_client;
    const struct dh_wire_register_server *sa = &a->u.register_server,
                                         *sb = &b->u.register_server;

    assert_int_equal(a->type, b->type);
    switch (a->type) {
    case DH_WIRE_REGISTER_CLIENT:
        assert_int_equal(ca->rank, cb->rank);
        assert_int_equal(ca->world_size, cb->world_size);
        assert_int_equal(ca->pid, cb->pid);
        assert_string_equal(ca->host, cb->host);
        assert_string_equal(ca->server_addr, cb->server_addr);
        assert_string_equal(ca->token, cb->token);
        break;
    case DH_WIRE_REGISTER_SERVER:
        assert_int_equal(sa->server_id, sb->server_id);
        assert_string_equal(sa->addr, sb->addr);
        assert_int_equal(sa->role, sb->role);
        assert_int_equal(sa->rank, sb->rank);
        assert_int_equal(sa->workers, sb->workers);
        assert_int_equal(sa->arena_bytes, sb->arena_bytes);
        assert_string_equal(sa->host, sb->host);
        assert_string_equal(sa->token, sb->token);
        assert_string_equal(sa->sender_secret, sb->sender_secret);
        break;
    case DH_WIRE_HEARTBEAT:
        assert_heartbeat_eq(&a->u.heartbeat, &b->u.heartbeat);
        break;
    case DH_WIRE_DESCRIPTOR_REQUEST:
        assert_request_eq(&a->u.request, &b->u.request);
        break;
    case DH_WIRE_ROUTE:
        assert_task_eq(&a->u.route.task, &b->u.route.task);
        assert_int_equal(a->u.route.server_id, b->u.route.server_id);
        assert_int_equal(a->u.route.target_server_id,
                         b->u.route.target_server_id);
        assert_string_equal(a->u.route.target_addr, b->u.route.target_addr);
        assert_string_equal(a->u.route.sender_token, b->u.route.sender_token);
        assert_int_equal(a->u.route.has_request, b->u.route.has_request);
        if (a->u.route.has_request)
            assert_request_eq(&a->u.route.request, &b->u.route.request);
        break;
    case DH_WIRE_RESULT_NOTICE:
        assert_result_eq(&a->u.result, &b->u.result);
        break;
    case DH_WIRE_ERROR_NOTICE:
        assert_task_eq(&a->u.error.task, &b->u.error.task);
        assert_int_equal(a->u.error.server_id, b->u.error.server_id);
        assert_int_equal(a->u.error.sample_id, b->u.error.sample_id);
        assert_string_equal(a->u.error.path, b->u.error.path);
        assert_int_equal(a->u.error.cause, b->u.error.cause);
        assert_string_equal(a->u.error.message, b->u.error.message);
        break;
    case DH_WIRE_RELEASE:
        assert_task_eq(&a->u.release.task, &b->u.release.task);
        assert_int_equal(a->u.release.slot_offset, b->u.release.slot_offset);
        assert_int_equal(a->u.release.generation, b->u.release.generation);
        break;
    default:
        assert_string_equal(a->u.shutdown.reason, b->u.shutdown.reason);
        break;
    }
}

/* ---- round trips ---- */

static void round_trip_every_type(void **state)
{
    struct dh_wire_msg m, back;
    uint8_t *buf;
    size_t len;
    struct dh_err e;

    (void)state;
    for (int i = 0; i < ALL_TYPES_N; i++) {
        fill_msg(&m, i);
        assert_int_equal(dh_wire_encode(&m, &buf, &len, &e), 0);
        assert_true(len <= DH_WIRE_MAX_MSG);
        memset(&back, 0x5a, sizeof(back)); /* out need not be initialised */
        assert_int_equal(dh_wire_decode(buf, len, &back, &e), 0);
        assert_msg_eq(&m, &back);
        dh_wire_free(buf);
        dh_wire_msg_fini(&back);
        dh_wire_msg_fini(&m);
        dh_wire_msg_fini(&m); /* twice is fine */
    }
    dh_wire_msg_fini(NULL);
}

/* Zero and default values survive too (proto3 omits them on the wire). */
static void round_trip_defaults(void **state)
{
    struct dh_wire_msg m, back;
    uint8_t *buf;
    size_t len;
    struct dh_err e;
    const uint64_t id = 0;

    (void)state;
    dh_wire_msg_init(&m, DH_WIRE_DESCRIPTOR_REQUEST);
    assert_int_equal(dh_wire_set_samples(&m.u.request, &id, 1, &e), 0);
    assert_int_equal(dh_wire_encode(&m, &buf, &len, &e), 0);
    assert_int_equal(dh_wire_decode(buf, len, &back, &e), 0);
    assert_msg_eq(&m, &back);
    assert_int_equal(back.u.request.plan.frames, 16);
    assert_int_equal(back.u.request.plan.width, 224);
    dh_wire_free(buf);
    dh_wire_msg_fini(&back);
    dh_wire_msg_fini(&m);

    dh_wire_msg_init(&m, DH_WIRE_SHUTDOWN);
    assert_int_equal(dh_wire_encode(&m, &buf, &len, &e), 0);
    assert_int_equal(dh_wire_decode(buf, len, &back, &e), 0);
    assert_int_equal(back.type, DH_WIRE_SHUTDOWN);
    assert_string_equal(back.u.shutdown.reason, "");
    dh_wire_free(buf);
}

/* ---- rejections: valid protobuf that breaks one of our rules ---- */

/* A valid envelope of each type, built with the generated API alone. */
struct pb {
    Datahelix__Wire__Envelope env;
    Datahelix__Wire__TaskId task, req_task;
    Datahelix__Wire__RegisterClient rc;
    Datahelix__Wire__RegisterServer rs;
    Datahelix__Wire__Heartbeat hb;
    Datahelix__Wire__PeerLink link, *linkp;
    Datahelix__Wire__SamplingPlan plan;
    Datahelix__Wire__DeadlineHints hints;
    Datahelix__Wire__DescriptorRequest req;
    Datahelix__Wire__Route route;
    Datahelix__Wire__ResultNotice res;
    Datahelix__Wire__ErrorNotice err;
    Datahelix__Wire__Release rel;
    Datahelix__Wire__Shutdown sd;
    uint64_t ids[2], dims[3];
    uint32_t vf[2];
    uint32_t subp[3];
    uint64_t subf[3], spares[DH_WIRE_MAX_SPARES + 1];
    int32_t subc[3];
    Datahelix__Wire__StageTimes st;
    float st_ms[3][2];
};

static ProtobufCBinaryData bin(const char *s)
{
    ProtobufCBinaryData b = {strlen(s), (uint8_t *)(uintptr_t)s};
    return b;
}

static void pb_task(Datahelix__Wire__TaskId *t)
{
    datahelix__wire__task_id__init(t);
    t->epoch = 70000; /* any u32: not in the id */
    t->pass = 1;
    t->step = 2;
    t->rank = 3;
    t->microbatch = 4;
    t->id = (UINT64_C(1) << 48) | (UINT64_C(2) << 24) | (3u << 8) | 4u;
}

static void pb_request(struct pb *p)
{
    datahelix__wire__descriptor_request__init(&p->req);
    datahelix__wire__sampling_plan__init(&p->plan);
    datahelix__wire__deadline_hints__init(&p->hints);
    pb_task(&p->req_task);
    p->plan.frames = 8;
    p->plan.width = 64;
    p->plan.height = 48;
    p->ids[0] = 10;
    p->ids[1] = 11;
    p->req.task = &p->req_task;
    p->req.n_sample_ids = 2;
    p->req.sample_ids = p->ids;
    p->req.plan = &p->plan;
    p->req.hints = &p->hints;
    p->req.slack_ms = 250;
}

static void pb_valid(struct pb *p, enum dh_wire_type t)
{
    Datahelix__Wire__Envelope *env = &p->env;

    memset(p, 0, sizeof(*p));
    datahelix__wire__envelope__init(env);
    env->version = DH_WIRE_VERSION;
    pb_task(&p->task);
    pb_request(p);
    switch (t) {
    case DH_WIRE_REGISTER_CLIENT:
        datahelix__wire__register_client__init(&p->rc);
        p->rc.rank = 1;
        p->rc.world_size = 2;
        p->rc.host = bin("node1");
        env->body_case = DATAHELIX__WIRE__ENVELOPE__BODY_REGISTER_CLIENT;
        env->register_client = &p->rc;
        break;
    case DH_WIRE_REGISTER_SERVER:
        datahelix__wire__register_server__init(&p->rs);
        p->rs.server_id = 5;
        p->rs.address = bin("tcp://127.0.0.1:7600");
        p->rs.role = DATAHELIX__WIRE__SERVER_ROLE__SERVER_ROLE_LOCAL;
        p->rs.workers = 4;
        p->rs.arena_bytes = 1 << 20;
        env->body_case = DATAHELIX__WIRE__ENVELOPE__BODY_REGISTER_SERVER;
        env->register_server = &p->rs;
        break;
    case DH_WIRE_HEARTBEAT:
        datahelix__wire__heartbeat__init(&p->hb);
        datahelix__wire__peer_link__init(&p->link);
        p->link.peer_server_id = 2;
        p->link.bytes_per_s = 1000;
        p->linkp = &p->link;
        p->hb.server_id = 1;
        p->hb.latency_ms = 3.5;
        p->hb.n_links = 1;
        p->hb.links = &p->linkp;
        env->body_case = DATAHELIX__WIRE__ENVELOPE__BODY_HEARTBEAT;
        env->heartbeat = &p->hb;
        break;
    case DH_WIRE_DESCRIPTOR_REQUEST:
        env->body_case = DATAHELIX__WIRE__ENVELOPE__BODY_DESCRIPTOR_REQUEST;
        env->descriptor_request = &p->req;
        break;
    case DH_WIRE_ROUTE:
        datahelix__wire__route__init(&p->route);
        p->route.task = &p->task;
        p->route.server_id = 2;
        p->route.target_server_id = 1;
        p->route.request = &p->req;
        env->body_case = DATAHELIX__WIRE__ENVELOPE__BODY_ROUTE;
        env->route = &p->route;
        break;
    case DH_WIRE_RESULT_NOTICE:
        datahelix__wire__result_notice__init(&p->res);
        p->res.task = &p->task;
        p->res.server_id = 1;
        p->res.length = 2 * 8 * 3;
        p->dims[0] = 2;
        p->dims[1] = 8;
        p->dims[2] = 3;
        p->res.n_dims = 3;
        p->res.dims = p->dims;
        p->vf[0] = 8;
        p->vf[1] = 5;
        p->res.n_sample_ids = p->res.n_valid_frames = 2;
        p->res.sample_ids = p->ids;
        p->res.valid_frames = p->vf;
        env->body_case = DATAHELIX__WIRE__ENVELOPE__BODY_RESULT_NOTICE;
        env->result_notice = &p->res;
        break;
    case DH_WIRE_ERROR_NOTICE:
        datahelix__wire__error_notice__init(&p->err);
        p->err.task = &p->task;
        p->err.server_id = 1;
        p->err.path = bin("/data/a.mp4");
        p->err.cause = -5;
        p->err.message = bin("moov atom not found");
        env->body_case = DATAHELIX__WIRE__ENVELOPE__BODY_ERROR_NOTICE;
        env->error_notice = &p->err;
        break;
    case DH_WIRE_RELEASE:
        datahelix__wire__release__init(&p->rel);
        p->rel.task = &p->task;
        p->rel.slot_offset = 4096;
        env->body_case = DATAHELIX__WIRE__ENVELOPE__BODY_RELEASE;
        env->release = &p->rel;
        break;
    default:
        datahelix__wire__shutdown__init(&p->sd);
        p->sd.reason = bin("done");
        env->body_case = DATAHELIX__WIRE__ENVELOPE__BODY_SHUTDOWN;
        env->shutdown = &p->sd;
        break;
    }
}

/* Packs p->env and decodes it; returns the code, e holds the message. */
static int pb_decode(struct pb *p, struct dh_err *e)
{
    size_t n = protobuf_c_message_get_packed_size(&p->env.base);
    uint8_t *buf = malloc(n ? n : 1);
    struct dh_wire_msg m;
    int rc;

    assert_non_null(buf);
    protobuf_c_message_pack(&p->env.base, buf);
    dh_err_clear(e);
    rc = dh_wire_decode(buf, n, &m, e);
    if (rc == 0)
        dh_wire_msg_fini(&m);
    free(buf);
    return rc;
}

static void valid_pb_messages_decode(void **state)
{
    struct pb p;
    struct dh_err e;

    (void)state;
    for (int t = DH_WIRE_REGISTER_CLIENT; t <= DH_WIRE_SHUTDOWN; t++) {
        pb_valid(&p, (enum dh_wire_type)t);
        if (pb_decode(&p, &e) != 0)
            fail_msg("type %d: %s", t, e.msg);
    }
}

static char big_text[DH_WIRE_MAX_MSG];
static uint64_t big_ids[DH_WIRE_MAX_SAMPLES + 1];
static uint32_t big_vf[DH_WIRE_MAX_SAMPLES + 1];
static Datahelix__Wire__PeerLink *big_links[DH_WIRE_MAX_PEERS + 1];
static int64_t some_idx[8];
static float two_floats[2] = {1, 2};

/* One rule: a mutation of a valid message and the error it must cause. */
struct rule {
    enum dh_wire_type type;
    int id;
    int code;
    const char *needle; /* in the error message */
};

static ProtobufCBinaryData bin_n(size_t n)
{
    ProtobufCBinaryData b = {n, (uint8_t *)big_text};
    return b;
}

/* n valid substitutions in a valid result notice of 2 samples. */
static void subs_pb(struct pb *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        p->subp[i] = (uint32_t)i;
        p->subf[i] = 1000 + i;
        p->subc[i] = -5;
    }
    p->res.n_sub_positions = p->res.n_sub_failed_ids = p->res.n_sub_causes = n;
    p->res.sub_positions = p->subp;
    p->res.sub_failed_ids = p->subf;
    p->res.sub_causes = p->subc;
}

/* Stage times with n per-sample entries in a valid result notice. */
static void stages_pb(struct pb *p, size_t n)
{
    datahelix__wire__stage_times__init(&p->st);
    memset(p->st_ms, 0, sizeof(p->st_ms));
    p->st.queue_ms = 1;
    p->st.n_read_ms = p->st.n_decode_ms = p->st.n_scale_ms = n;
    p->st.read_ms = p->st_ms[0];
    p->st.decode_ms = p->st_ms[1];
    p->st.scale_ms = p->st_ms[2];
    p->res.stages = &p->st;
}

static void mutate(struct pb *p, int id)
{
    switch (id) {
    case 1:
        p->env.version = 0;
        break;
    case 2:
        p->env.version = DH_WIRE_VERSION + 1;
        break;
    case 3:
        p->env.body_case = DATAHELIX__WIRE__ENVELOPE__BODY__NOT_SET;
        break;
    case 10:
        p->rc.rank = 2;
        break;
    case 11:
        p->rc.world_size = 0;
        p->rc.rank = 0;
        break;
    case 12:
        p->rc.world_size = DH_WIRE_MAX_RANKS + 1;
        break;
    case 13:
        p->rc.host = bin_n(DH_WIRE_MAX_HOST + 1);
        break;
    case 14:
        p->rc.server_address.len = 3;
        p->rc.server_address.data = (uint8_t *)"a\0b";
        break;
    case 20:
        p->rs.role = 0;
        break;
    case 21:
        p->rs.role = 7;
        break;
    case 22:
        p->rs.server_id = 0;
        break;
    case 23:
        p->rs.workers = 0;
        break;
    case 24:
        p->rs.workers = DH_WIRE_MAX_WORKERS + 1;
        break;
    case 25:
        p->rs.arena_bytes = 0;
        break;
    case 26:
        p->rs.role = DATAHELIX__WIRE__SERVER_ROLE__SERVER_ROLE_REMOTE;
        p->rs.rank = 3;
        break;
    case 27:
        p->rs.address = bin("");
        break;
    case 28:
        p->rs.address = bin_n(DH_WIRE_MAX_ADDR + 1);
        break;
    case 29:
        p->rs.rank = DH_WIRE_MAX_RANKS;
        break;
    case 30:
        p->hb.n_links = DH_WIRE_MAX_PEERS + 1;
        p->hb.links = big_links;
        break;
    case 31:
        p->hb.latency_ms = NAN;
        break;
    case 32:
        p->hb.latency_ms = -1;
        break;
    case 33:
        p->link.peer_server_id = 0;
        break;
    case 34:
        p->hb.busy_workers = DH_WIRE_MAX_WORKERS + 1;
        break;
    case 35:
        p->hb.queue_depth = DH_WIRE_MAX_QUEUE + 1;
        break;
    case 36:
        p->link.bytes_per_s = DH_WIRE_MAX_BYTES + 1;
        break;
    case 37:
        p->hb.server_id = 0;
        break;
    case 40:
        p->req.n_sample_ids = DH_WIRE_MAX_SAMPLES + 1;
        p->req.sample_ids = big_ids;
        break;
    case 41:
        p->req.n_sample_ids = 0;
        break;
    case 42:
        p->req.plan = NULL;
        break;
    case 43:
        p->req.task = NULL;
        break;
    case 44:
        p->req_task.id ^= 1;
        break;
    case 45:
        p->req_task.step = 1u << 24;
        break;
    case 46:
        p->plan.frames = DH_WIRE_MAX_FRAMES + 1;
        break;
    case 47:
        p->plan.width = DH_WIRE_MAX_DIM + 1;
        break;
    case 48:
        p->plan.height = 0;
        break;
    case 49:
        p->plan.kind = 99;
        break;
    case 50:
        p->plan.dtype = -1;
        break;
    case 51:
        p->plan.geometry = 4;
        break;
    case 52:
        p->plan.layout = 2;
        break;
    case 53:
        p->plan.snap = 3;
        break;
    case 54:
        p->plan.pad = 2;
        break;
    case 55:
        p->plan.kind = DATAHELIX__WIRE__PLAN_KIND__PLAN_INDICES;
        p->plan.n_indices = 7;
        p->plan.indices = some_idx;
        break;
    case 56:
        p->plan.kind = DATAHELIX__WIRE__PLAN_KIND__PLAN_INDICES;
        some_idx[3] = -1;
        p->plan.n_indices = 8;
        p->plan.indices = some_idx;
        break;
    case 57:
        p->plan.fps = NAN;
        break;
    case 58:
        p->plan.kind = DATAHELIX__WIRE__PLAN_KIND__PLAN_FPS;
        break;
    case 59:
        p->plan.n_mean = 2;
        p->plan.mean = two_floats;
        break;
    case 60:
        p->req.slack_ms = DH_WIRE_MAX_SLACK_MS + 1;
        break;
    case 61:
        p->req.slack_ms = INT64_MIN;
        break;
    case 62:
        p->hints.est_cpu_ms = -1;
        break;
    case 63:
        p->req.requester_rank = DH_WIRE_MAX_RANKS;
        break;
    case 64:
        p->plan.n_indices = 2;
        p->plan.indices = some_idx;
        break;
    case 65:
        p->hints.est_out_bytes = DH_WIRE_MAX_BYTES + 1;
        break;
    case 66:
        p->plan.snap_tol = INFINITY;
        break;
    case 67:
        p->plan.n_indices = DH_WIRE_MAX_FRAMES + 1;
        p->plan.indices = (int64_t *)big_ids;
        break;
    case 70:
        p->route.server_id = 0;
        break;
    case 71:
        p->route.target_server_id = 0;
        break;
    case 72:
        p->route.target_address = bin_n(DH_WIRE_MAX_ADDR + 1);
        break;
    case 68:
        p->req_task.pass = 1u << 16;
        break;
    case 69:
        p->req_task.pass = 2;
        break; /* in range, but the id is pass 1's */
    case 76:
        p->req_task.epoch = 9;
        break; /* the same id, another epoch */
    case 77:   /* a native plan's size is its bounds, never width x height */
        p->plan.geometry = 3; /* GEOM_NATIVE */
        break;
    case 78:
        p->plan.geometry = 3; /* GEOM_NATIVE */
        p->plan.width = p->plan.height = 0;
        p->plan.patch = DH_MEDIA_MAX_PATCH + 1;
        break;
    case 79: /* a fixed plan with a native bound set */
        p->plan.max_side = 64;
        break;
    case 160: /* sound off, yet a field of it set */
        p->plan.audio_samples = 16000;
        break;
    case 161:
        p->plan.audio_rate = 999;
        p->plan.audio_channels = 1;
        p->plan.audio_samples = 1;
        break;
    case 162:
        p->plan.audio_rate = 16000;
        p->plan.audio_channels = 3;
        p->plan.audio_samples = 1;
        break;
    case 163: /* a row no batch may hold */
        p->plan.audio_rate = 16000;
        p->plan.audio_channels = 1;
        p->plan.audio_samples = UINT64_MAX;
        break;
    case 166: /* a crop no plan has */
        p->plan.audio_rate = 16000;
        p->plan.audio_channels = 1;
        p->plan.audio_samples = 16000;
        p->plan.audio_crop = 3;
        break;
    case 164: /* features of no sound */
        p->plan.audio_feature = 1;
        break;
    case 165: /* a hop past the frame */
        p->plan.audio_rate = 16000;
        p->plan.audio_channels = 1;
        p->plan.audio_samples = 16000;
        p->plan.audio_feature = 3;
        p->plan.audio_n_fft = 400;
        p->plan.audio_hop = 401;
        p->plan.audio_mels = 80;
        break;
    case 73:
        p->req_task.microbatch = 5;
        p->req_task.id += 1;
        break; /* consistent, but not the route's */
    case 74:
        p->plan.width = 0;
        break;
    case 75:
        p->route.task = NULL;
        break;
    case 80:
        p->res.n_dims = DH_WIRE_MAX_DIMS + 1;
        p->res.dims = big_ids;
        break;
    case 81:
        p->res.n_dims = 0;
        break;
    case 82:
        p->dims[1] = 0;
        break;
    case 83:
        p->res.length -= 1;
        break;
    case 84:
        p->res.arena_offset = DH_WIRE_MAX_BYTES + 1;
        break;
    case 85:
        p->res.n_valid_frames = 1;
        break;
    case 86:
        p->vf[1] = DH_WIRE_MAX_FRAMES + 1;
        break;
    case 87:
        p->res.dtype = 5;
        break;
    case 88:
        p->res.n_sample_ids = p->res.n_valid_frames = DH_WIRE_MAX_SAMPLES + 1;
        p->res.sample_ids = big_ids;
        p->res.valid_frames = big_vf;
        break;
    case 89:
        p->dims[0] = UINT64_C(1) << 33;
        break;
    case 90:
        p->res.length = DH_WIRE_MAX_BYTES + 1;
        break;
    case 91:
        p->res.layout = 9;
        break;
    case 92:
        p->dims[0] = p->dims[1] = p->dims[2] = UINT64_C(1) << 32;
        p->res.length = DH_WIRE_MAX_BYTES;
        break; /* 2^96 bytes */
    case 93:
        p->res.server_id = 0;
        break;
    case 94:
        p->res.service_ms = -1;
        break;
    case 95:
        p->res.service_ms = 2e9;
        break;
    case 130: /* a substitution per position, and one more */
        subs_pb(p, 3);
        break;
    case 131:
        subs_pb(p, 2);
        p->res.n_sub_causes = 1;
        break;
    case 132:
        subs_pb(p, 1);
        p->subp[0] = 2; /* past the 2 samples */
        break;
    case 133:
        subs_pb(p, 2);
        p->subp[1] = 0; /* not increasing */
        break;
    case 134:
        subs_pb(p, 1);
        p->subf[0] = p->ids[0]; /* failed and delivered */
        break;
    case 135:
        subs_pb(p, 1);
        p->subc[0] = 0;
        break;
    case 136:
        subs_pb(p, 2);
        p->res.n_sub_positions = p->res.n_sub_failed_ids = p->res.n_sub_causes =
            DH_WIRE_MAX_SPARES + 1;
        p->res.sub_positions = big_vf;
        p->res.sub_failed_ids = big_ids;
        p->res.sub_causes = (int32_t *)big_vf;
        break;
    case 140: /* stage times: one per sample or none */
        stages_pb(p, 1);
        break;
    case 141:
        stages_pb(p, 2);
        p->st.n_scale_ms = 1;
        break;
    case 142:
        stages_pb(p, 2);
        p->st_ms[1][1] = NAN;
        break;
    case 143:
        stages_pb(p, 0);
        p->st.queue_ms = -1;
        break;
    case 144:
        stages_pb(p, 0);
        p->st.worker = DH_WIRE_MAX_WORKERS;
        break;
    case 145:
        stages_pb(p, 2);
        p->st.notify_ms = 2e9;
        break;
    case 146: /* read sizes for a sample count other than the times' */
        stages_pb(p, 2);
        p->st.n_read_bytes = 1;
        p->st.read_bytes = p->spares;
        break;
    case 147:
        p->hb.read_ms = -1;
        break;
    case 148:
        p->hb.read_ms = NAN;
        break;
    case 137:
        p->req.n_spare_ids = DH_WIRE_MAX_SPARES + 1;
        p->req.spare_ids = p->spares;
        break;
    case 100:
        p->err.path = bin_n(DH_WIRE_MAX_PATH + 1);
        break;
    case 101:
        p->err.message = bin_n(DH_WIRE_MAX_TEXT + 1);
        break;
    case 102:
        p->err.path.len = 4;
        p->err.path.data = (uint8_t *)"/a\0b";
        break;
    case 103:
        p->err.cause = 0;
        break;
    case 104:
        p->err.task = NULL;
        break;
    case 105:
        p->err.message.len = 1;
        p->err.message.data = (uint8_t *)"";
        break;
    case 110:
        p->rel.slot_offset = DH_WIRE_MAX_BYTES + 1;
        break;
    case 111:
        p->rel.task = NULL;
        break;
    case 112:
        p->task.rank = 9;
        break; /* id no longer matches */
    case 120:
        p->sd.reason = bin_n(DH_WIRE_MAX_TEXT + 1);
        break;
    case 121:
        p->sd.reason.len = 2;
        p->sd.reason.data = (uint8_t *)"\0x";
        break;
    default:
        fail_msg("no mutation %d", id);
    }
}

static const struct rule rules[] = {
    {DH_WIRE_SHUTDOWN, 1, DH_EVERSION, "version 0 is missing"},
    {DH_WIRE_SHUTDOWN, 2, DH_EVERSION, "version 3 is not supported"},
    {DH_WIRE_SHUTDOWN, 3, DH_EFORMAT, "no body"},
    {DH_WIRE_REGISTER_CLIENT, 10, DH_EFORMAT, "register_client.rank 2"},
    {DH_WIRE_REGISTER_CLIENT, 11, DH_EFORMAT, "register_client.world_size"},
    {DH_WIRE_REGISTER_CLIENT, 12, DH_EFORMAT, "register_client.world_size"},
    {DH_WIRE_REGISTER_CLIENT, 13, DH_ETOOBIG, "register_client.host"},
    {DH_WIRE_REGISTER_CLIENT, 14, DH_EFORMAT,
     "register_client.server_address contains a NUL"},
    {DH_WIRE_REGISTER_SERVER, 20, DH_EFORMAT, "register_server.role 0"},
    {DH_WIRE_REGISTER_SERVER, 21, DH_EFORMAT, "register_server.role 7"},
    {DH_WIRE_REGISTER_SERVER, 22, DH_EFORMAT, "register_server.server_id"},
    {DH_WIRE_REGISTER_SERVER, 23, DH_EFORMAT, "register_server.workers 0"},
    {DH_WIRE_REGISTER_SERVER, 24, DH_EFORMAT, "register_server.workers"},
    {DH_WIRE_REGISTER_SERVER, 25, DH_EFORMAT, "register_server.arena_bytes"},
    {DH_WIRE_REGISTER_SERVER, 26, DH_EFORMAT, "register_server.rank 3"},
    {DH_WIRE_REGISTER_SERVER, 27, DH_EFORMAT,
     "register_server.address is empty"},
    {DH_WIRE_REGISTER_SERVER, 28, DH_ETOOBIG, "register_server.address"},
    {DH_WIRE_REGISTER_SERVER, 29, DH_EFORMAT, "register_server.rank 65536"},
    {DH_WIRE_HEARTBEAT, 30, DH_ETOOBIG, "heartbeat.links: 4097"},
    {DH_WIRE_HEARTBEAT, 31, DH_EFORMAT, "heartbeat.latency_ms nan"},
    {DH_WIRE_HEARTBEAT, 32, DH_EFORMAT, "heartbeat.latency_ms -1"},
    {DH_WIRE_HEARTBEAT, 33, DH_EFORMAT, "heartbeat.links[0].peer_server_id"},
    {DH_WIRE_HEARTBEAT, 34, DH_EFORMAT, "heartbeat.busy_workers"},
    {DH_WIRE_HEARTBEAT, 35, DH_EFORMAT, "heartbeat.queue_depth"},
    {DH_WIRE_HEARTBEAT, 36, DH_EFORMAT, "heartbeat.links[0].bytes_per_s"},
    {DH_WIRE_HEARTBEAT, 37, DH_EFORMAT, "heartbeat.server_id 0"},
    {DH_WIRE_DESCRIPTOR_REQUEST, 40, DH_ETOOBIG,
     "descriptor_request.sample_ids: 65537"},
    {DH_WIRE_DESCRIPTOR_REQUEST, 41, DH_EFORMAT,
     "descriptor_request.sample_ids is empty"},
    {DH_WIRE_DESCRIPTOR_REQUEST, 42, DH_EFORMAT,
     "descriptor_request.plan is missing"},
    {DH_WIRE_DESCRIPTOR_REQUEST, 43, DH_EFORMAT,
     "descriptor_request.task is missing"},
    {DH_WIRE_DESCRIPTOR_REQUEST, 44, DH_EFORMAT, "descriptor_request.task.id"},
    {DH_WIRE_DESCRIPTOR_REQUEST, 45, DH_EFORMAT, "task id layout"},
    {DH_WIRE_DESCRIPTOR_REQUEST, 46, DH_ETOOBIG,
     "descriptor_request.plan.frames 4097"},
    {DH_WIRE_DESCRIPTOR_REQUEST, 47, DH_EFORMAT,
     "descriptor_request.plan.width 16385"},
    {DH_WIRE_DESCRIPTOR_REQUEST, 48, DH_EFORMAT, "plan.height 0"},
    {DH_WIRE_DESCRIPTOR_REQUEST, 49, DH_EFORMAT, "plan.kind 99"},
    {DH_WIRE_DESCRIPTOR_REQUEST, 50, DH_EFORMAT, "plan.dtype -1"},
    {DH_WIRE_DESCRIPTOR_REQUEST, 51, DH_EFORMAT, "plan.geometry 4"},
    {DH_WIRE_DESCRIPTOR_REQUEST, 52, DH_EFORMAT, "plan.layout 2"},
    {DH_WIRE_DESCRIPTOR_REQUEST, 53, DH_EFORMAT, "plan.snap 3"},
    {DH_WIRE_DESCRIPTOR_REQUEST, 54, DH_EFORMAT, "plan.pad 2"},
    {DH_WIRE_DESCRIPTOR_REQUEST, 55, DH_EFORMAT,
     "plan.indices: 7 indices for 8 frames"},
    {DH_WIRE_DESCRIPTOR_REQUEST, 56, DH_EFORMAT, "plan.indices[3] -1"},
    {DH_WIRE_DESCRIPTOR_REQUEST, 57, DH_EFORMAT, "plan.fps nan"},
    {DH_WIRE_DESCRIPTOR_REQUEST, 58, DH_EFORMAT, "media pipeline: plan: fps"},
    {DH_WIRE_DESCRIPTOR_REQUEST, 59, DH_EFORMAT, "plan.mean has 2 values"},
    {DH_WIRE_DESCRIPTOR_REQUEST, 60, DH_EFORMAT, "slack_ms 86400001"},
    {DH_WIRE_DESCRIPTOR_REQUEST, 61, DH_EFORMAT, "slack_ms"},
    {DH_WIRE_DESCRIPTOR_REQUEST, 62, DH_EFORMAT, "hints.est_cpu_ms -1"},
    {DH_WIRE_DESCRIPTOR_REQUEST, 63, DH_EFORMAT, "requester_rank 65536"},
    {DH_WIRE_DESCRIPTOR_REQUEST, 64, DH_EFORMAT, "not an index plan"},
    {DH_WIRE_DESCRIPTOR_REQUEST, 65, DH_EFORMAT, "hints.est_out_bytes"},
    {DH_WIRE_DESCRIPTOR_REQUEST, 66, DH_EFORMAT, "plan.snap_tol inf"},
    {DH_WIRE_DESCRIPTOR_REQUEST, 67, DH_ETOOBIG, "plan.indices: 4097"},
    {DH_WIRE_DESCRIPTOR_REQUEST, 68, DH_EFORMAT,
     "descriptor_request.task (pass 65536, step 2"},
    {DH_WIRE_DESCRIPTOR_REQUEST, 69, DH_EFORMAT,
     "descriptor_request.task.id 0x1000002000304 does not match its tuple "
     "(pass 2,"},
    {DH_WIRE_DESCRIPTOR_REQUEST, 77, DH_EFORMAT, "plan.width"},
    {DH_WIRE_DESCRIPTOR_REQUEST, 78, DH_EFORMAT, "plan.patch 1025"},
    {DH_WIRE_DESCRIPTOR_REQUEST, 79, DH_EFORMAT, "plan.max_side 64"},
    {DH_WIRE_DESCRIPTOR_REQUEST, 160, DH_EFORMAT, "plan.audio_samples 16000"},
    {DH_WIRE_DESCRIPTOR_REQUEST, 161, DH_EFORMAT, "plan.audio_rate 999"},
    {DH_WIRE_DESCRIPTOR_REQUEST, 162, DH_EFORMAT, "plan.audio_channels 3"},
    {DH_WIRE_DESCRIPTOR_REQUEST, 163, DH_EFORMAT, "plan.audio_samples"},
    {DH_WIRE_DESCRIPTOR_REQUEST, 164, DH_EFORMAT, "plan.audio_feature 1"},
    {DH_WIRE_DESCRIPTOR_REQUEST, 165, DH_EFORMAT, "plan.audio_hop 401"},
    {DH_WIRE_DESCRIPTOR_REQUEST, 166, DH_EFORMAT, "plan.audio_crop 3"},
    {DH_WIRE_ROUTE, 70, DH_EFORMAT, "route.server_id 0"},
    {DH_WIRE_ROUTE, 71, DH_EFORMAT, "route.target_server_id 0"},
    {DH_WIRE_ROUTE, 72, DH_ETOOBIG, "route.target_address"},
    {DH_WIRE_ROUTE, 73, DH_EFORMAT, "route.request.task.id"},
    {DH_WIRE_ROUTE, 74, DH_EFORMAT, "route.request.plan.width 0"},
    {DH_WIRE_ROUTE, 75, DH_EFORMAT, "route.task is missing"},
    {DH_WIRE_ROUTE, 76, DH_EFORMAT,
     "route.request.task (epoch 9, id 0x1000002000304) is not the route's "
     "task (epoch 70000"},
    {DH_WIRE_RESULT_NOTICE, 80, DH_ETOOBIG, "result_notice.dims: 9"},
    {DH_WIRE_RESULT_NOTICE, 81, DH_EFORMAT, "result_notice.dims is empty"},
    {DH_WIRE_RESULT_NOTICE, 82, DH_EFORMAT, "result_notice.dims[1] 0"},
    {DH_WIRE_RESULT_NOTICE, 83, DH_EFORMAT, "more than length 47"},
    {DH_WIRE_RESULT_NOTICE, 84, DH_EFORMAT, "result_notice.arena_offset"},
    {DH_WIRE_RESULT_NOTICE, 85, DH_EFORMAT, "valid_frames has 1 entries for 2"},
    {DH_WIRE_RESULT_NOTICE, 86, DH_EFORMAT, "valid_frames[1] 4097"},
    {DH_WIRE_RESULT_NOTICE, 87, DH_EFORMAT, "result_notice.dtype 5"},
    {DH_WIRE_RESULT_NOTICE, 88, DH_ETOOBIG, "result_notice.sample_ids"},
    {DH_WIRE_RESULT_NOTICE, 89, DH_EFORMAT, "result_notice.dims[0]"},
    {DH_WIRE_RESULT_NOTICE, 90, DH_EFORMAT, "result_notice.length"},
    {DH_WIRE_RESULT_NOTICE, 91, DH_EFORMAT, "result_notice.layout 9"},
    {DH_WIRE_RESULT_NOTICE, 92, DH_EFORMAT, "more than length"},
    {DH_WIRE_RESULT_NOTICE, 93, DH_EFORMAT, "result_notice.server_id 0"},
    {DH_WIRE_RESULT_NOTICE, 94, DH_EFORMAT, "result_notice.service_ms -1"},
    {DH_WIRE_RESULT_NOTICE, 95, DH_EFORMAT, "result_notice.service_ms 2e+09"},
    {DH_WIRE_RESULT_NOTICE, 130, DH_EFORMAT, "3 substitutions for 2 samples"},
    {DH_WIRE_RESULT_NOTICE, 131, DH_EFORMAT, "have 2, 2 and 1 entries"},
    {DH_WIRE_RESULT_NOTICE, 132, DH_EFORMAT, "sub_positions[0] 2 is not"},
    {DH_WIRE_RESULT_NOTICE, 133, DH_EFORMAT, "sub_positions[1] 0 is not"},
    {DH_WIRE_RESULT_NOTICE, 134, DH_EFORMAT, "as both failed and delivered"},
    {DH_WIRE_RESULT_NOTICE, 135, DH_EFORMAT, "sub_causes[0] 0 is not"},
    {DH_WIRE_RESULT_NOTICE, 136, DH_ETOOBIG, "result_notice.sub_positions: 65"},
    {DH_WIRE_RESULT_NOTICE, 140, DH_EFORMAT, "1 sample times for 2 samples"},
    {DH_WIRE_RESULT_NOTICE, 141, DH_EFORMAT, "have 2, 2 and 1 entries"},
    {DH_WIRE_RESULT_NOTICE, 142, DH_EFORMAT, "stages.decode_ms[1] nan"},
    {DH_WIRE_RESULT_NOTICE, 143, DH_EFORMAT, "stages.queue_ms -1"},
    {DH_WIRE_RESULT_NOTICE, 144, DH_EFORMAT, "stages.worker 4096"},
    {DH_WIRE_RESULT_NOTICE, 145, DH_EFORMAT, "stages.notify_ms 2e+09"},
    {DH_WIRE_RESULT_NOTICE, 146, DH_EFORMAT, "read_bytes has 1 entries"},
    {DH_WIRE_HEARTBEAT, 147, DH_EFORMAT, "heartbeat.read_ms -1"},
    {DH_WIRE_HEARTBEAT, 148, DH_EFORMAT, "heartbeat.read_ms nan"},
    {DH_WIRE_DESCRIPTOR_REQUEST, 137, DH_ETOOBIG,
     "descriptor_request.spare_ids: 65"},
    {DH_WIRE_ERROR_NOTICE, 100, DH_ETOOBIG, "error_notice.path: 4097"},
    {DH_WIRE_ERROR_NOTICE, 101, DH_ETOOBIG, "error_notice.message: 4097"},
    {DH_WIRE_ERROR_NOTICE, 102, DH_EFORMAT, "error_notice.path contains"},
    {DH_WIRE_ERROR_NOTICE, 103, DH_EFORMAT, "error_notice.cause 0"},
    {DH_WIRE_ERROR_NOTICE, 104, DH_EFORMAT, "error_notice.task is missing"},
    {DH_WIRE_ERROR_NOTICE, 105, DH_EFORMAT, "error_notice.message contains"},
    {DH_WIRE_RELEASE, 110, DH_EFORMAT, "release.slot_offset"},
    {DH_WIRE_RELEASE, 111, DH_EFORMAT, "release.task is missing"},
    {DH_WIRE_RELEASE, 112, DH_EFORMAT, "release.task.id"},
    {DH_WIRE_SHUTDOWN, 120, DH_ETOOBIG, "shutdown.reason: 4097"},
    {DH_WIRE_SHUTDOWN, 121, DH_EFORMAT, "shutdown.reason contains a NUL"},
};

static void every_rule_rejects(void **state)
{
    size_t n = sizeof(rules) / sizeof(rules[0]);
    uint64_t before = dh_wire_rejected();
    struct pb p;
    struct dh_err e;

    (void)state;
    memset(big_text, 'x', sizeof(big_text));
    for (size_t i = 0; i <= DH_WIRE_MAX_PEERS; i++)
        big_links[i] = &p.link;
    for (size_t i = 0; i < n; i++) {
        memset(some_idx, 0, sizeof(some_idx));
        pb_valid(&p, rules[i].type);
        mutate(&p, rules[i].id);
        int rc = pb_decode(&p, &e);
        if (rc != rules[i].code || !strstr(e.msg, rules[i].needle))
            fail_msg("rule %d: got %d \"%s\", want %d \"...%s...\"",
                     rules[i].id, rc, e.msg, rules[i].code, rules[i].needle);
        assert_int_equal(e.code, rc);
        assert_non_null(strstr(e.msg, "wire: "));
    }
    assert_int_equal(dh_wire_rejected() - before, n);
}

static void oversized_and_expanding_messages(void **state)
{
    size_t n = DH_WIRE_MAX_MSG;
    uint8_t *buf = calloc(n + 1, 1);
    struct dh_wire_msg m;
    struct dh_err e;
    size_t i = 0;

    (void)state;
    assert_non_null(buf);
    assert_int_equal(dh_wire_decode(buf, n + 1, &m, &e), DH_ETOOBIG);
    assert_non_null(strstr(e.msg, "over the cap of 1048576"));
    /* A heartbeat of ~262,000 empty peer links fits in 1 MiB but would make
     * protobuf-c allocate ~12 MiB: the decode budget stops it. */
    n -= 1;          /* an even body: 2 bytes per link */
    buf[i++] = 0x08; /* version */
    buf[i++] = DH_WIRE_VERSION;
    buf[i++] = 0x22; /* heartbeat, length-delimited */
    size_t body = n - i - 4;
    buf[i++] = (uint8_t)(0x80 | (body & 0x7f));
    buf[i++] = (uint8_t)(0x80 | ((body >> 7) & 0x7f));
    buf[i++] = (uint8_t)(0x80 | ((body >> 14) & 0x7f));
    buf[i++] = (uint8_t)(body >> 21);
    for (; i + 2 <= n; i += 2) {
        buf[i] = 0x32; /* links, empty */
        buf[i + 1] = 0x00;
    }
    assert_int_equal(i, n);
    assert_int_equal(dh_wire_decode(buf, n, &m, &e), DH_ETOOBIG);
    assert_non_null(strstr(e.msg, "decode budget"));
    free(buf);
}

/* The encoded form of message i of ALL_TYPES_N (small variants). */
static void encode_small(int i, uint8_t **buf, size_t *len)
{
    struct pb p;
    enum dh_wire_type t = i < 9 ? (enum dh_wire_type)(i + 1) : DH_WIRE_ROUTE;

    pb_valid(&p, t);
    if (i == 4)
        p.route.request = NULL;
    *len = protobuf_c_message_get_packed_size(&p.env.base);
    *buf = malloc(*len);
    protobuf_c_message_pack(&p.env.base, *buf);
}

static void truncated_at_every_length(void **state)
{
    struct dh_wire_msg m;
    struct dh_err e;
    uint8_t *buf;
    size_t len;

    (void)state;
    for (int i = 0; i < ALL_TYPES_N; i++) {
        encode_small(i, &buf, &len);
        for (size_t n = 0; n < len; n++) {
            /* Copy so ASan sees any read past the cut. */
            uint8_t *cut = malloc(n ? n : 1);
            assert_non_null(cut);
            memcpy(cut, buf, n);
            int rc = dh_wire_decode(n ? cut : NULL, n, &m, &e);
            if (rc == 0)
                fail_msg("type %d cut at %zu of %zu decoded", i, n, len);
            assert_true(rc == DH_EFORMAT || rc == DH_EVERSION);
            free(cut);
        }
        assert_int_equal(dh_wire_decode(buf, len, &m, &e), 0);
        dh_wire_msg_fini(&m);
        free(buf);
    }
}

static uint64_t rng_state = 0x9e3779b97f4a7c15u;

static uint64_t rng(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

/* Decoded or not, never a crash, a leak or a half-written `out`; what
 * decodes encodes again. */
static void decode_any(const uint8_t *buf, size_t len)
{
    struct dh_wire_msg m;
    struct dh_err e;
    uint8_t *again;
    size_t n;
    int rc = dh_wire_decode(buf, len, &m, &e);

    if (rc != 0) {
        assert_true(rc == DH_EFORMAT || rc == DH_EVERSION || rc == DH_ETOOBIG);
        return;
    }
    assert_int_equal(dh_wire_encode(&m, &again, &n, &e), 0);
    dh_wire_free(again);
    dh_wire_msg_fini(&m);
}

static void random_bytes_and_bit_flips(void **state)
{
    uint8_t junk[512];
    uint8_t *buf;
    size_t len;

    (void)state;
    for (int r = 0; r < 20000; r++) {
        size_t n = rng() % sizeof(junk);
        for (size_t i = 0; i < n; i++)
            junk[i] = (uint8_t)rng();
        if (n > 2 && r % 2) { /* often a plausible envelope start */
            junk[0] = 0x08;
            junk[1] = 0x01;
        }
        decode_any(junk, n);
    }
    for (int i = 0; i < ALL_TYPES_N; i++) {
        encode_small(i, &buf, &len);
        for (int r = 0; r < 2000; r++) {
            size_t at = rng() % len;
            uint8_t bit = (uint8_t)(1u << (rng() % 8));
            buf[at] ^= bit;
            decode_any(buf, len);
            buf[at] ^= bit;
        }
        free(buf);
    }
}

/* ---- task ids: properties over random tuples ---- */

static uint64_t rng_next(uint64_t *x) /* xorshift64* */
{
    *x ^= *x >> 12;
    *x ^= *x << 25;
    *x ^= *x >> 27;
    return *x * UINT64_C(2685821657736338717);
}

/* A field value in 0..max, edges (0, 1, max - 1, max) half of the time. */
static uint64_t draw_field(uint64_t *x, uint64_t max)
{
    uint64_t r = rng_next(x);

    switch (r % 8) {
    case 0:
        return 0;
    case 1:
        return 1;
    case 2:
        return max - 1;
    case 3:
        return max;
    default:
        return (r >> 3) % (max + 1);
    }
}

struct tuple {
    uint64_t v[4]; /* pass, step, rank, microbatch */
    uint64_t id;
};

static const uint64_t field_max[4] = {
    DH_WIRE_MAX_PASSES - 1, DH_WIRE_MAX_STEPS - 1, DH_WIRE_MAX_RANKS - 1,
    (1u << DH_WIRE_MICROBATCH_BITS) - 1};

static int cmp_tuple_by_id(const void *a, const void *b)
{
    const struct tuple *x = a, *y = b;

    if (x->id != y->id)
        return x->id < y->id ? -1 : 1;
    return memcmp(x->v, y->v, sizeof(x->v));
}

static int cmp_fields(const struct tuple *x, const struct tuple *y)
{
    for (int f = 0; f < 4; f++)
        if (x->v[f] != y->v[f])
            return x->v[f] < y->v[f] ? -1 : 1;
    return 0;
}

/* Random tuples (edges over-drawn, so equal fields are common): every one
 * round-trips through make and split, the epoch rides along untouched, and
 * sorted by id the tuples are in lexicographic order - so distinct tuples
 * have distinct ids and equal ids mean equal tuples. */
static void task_id_random_tuples(void **state)
{
    enum { N = 200000 };
    struct tuple *t = calloc(N, sizeof(*t));
    uint64_t x = UINT64_C(0x9E3779B97F4A7C15);
    size_t same = 0;

    (void)state;
    assert_non_null(t);
    for (size_t i = 0; i < N; i++) {
        struct dh_wire_task w, back;
        uint64_t epoch = rng_next(&x) >> 32; /* any u32 */

        for (int f = 0; f < 4; f++)
            t[i].v[f] = draw_field(&x, field_max[f]);
        assert_int_equal(dh_wire_task_make(&w, epoch, t[i].v[0], t[i].v[1],
                                           t[i].v[2], t[i].v[3], NULL),
                         0);
        assert_int_equal(w.epoch, epoch);
        t[i].id = w.id;
        dh_wire_task_split(w.id, &back);
        assert_int_equal(back.pass, t[i].v[0]);
        assert_int_equal(back.step, t[i].v[1]);
        assert_int_equal(back.rank, t[i].v[2]);
        assert_int_equal(back.microbatch, t[i].v[3]);
        assert_int_equal(back.id, w.id);
        assert_int_equal(back.epoch, 0);
    }
    qsort(t, N, sizeof(*t), cmp_tuple_by_id);
    for (size_t i = 1; i < N; i++) {
        int c = cmp_fields(&t[i - 1], &t[i]);

        if (t[i - 1].id == t[i].id)
            assert_int_equal(c, 0); /* a collision would fail here */
        else
            assert_int_equal(c, -1); /* monotone in the tuple */
        same += c == 0;
    }
    assert_true(same > 0); /* the draw did repeat tuples: not vacuous */
    free(t);
}

/* Every split id is one make gives back: split is the exact inverse. */
static void task_id_split_inverts(void **state)
{
    uint64_t x = 12345, id;
    struct dh_wire_task w;

    (void)state;
    for (int i = 0; i < 100000; i++) {
        uint64_t raw = rng_next(&x);

        dh_wire_task_split(raw, &w);
        assert_int_equal(
            dh_wire_task_id(w.pass, w.step, w.rank, w.microbatch, &id, NULL),
            0);
        assert_int_equal(id, raw);
    }
    assert_int_equal(
        dh_wire_task_id(65535, (1u << 24) - 1, 65535, 255, &id, NULL), 0);
    assert_int_equal(id, UINT64_MAX);
    assert_int_equal(dh_wire_task_id(0, 0, 0, 0, &id, NULL), 0);
    assert_int_equal(id, 0);
}

/* A field above its range is DH_ETOOBIG naming it, and nothing is written;
 * also for random values above the range, and the epoch above 32 bits. */
static void task_id_rejects_overflow(void **state)
{
    static const char *const names[4] = {"pass", "step", "rank", "microbatch"};
    struct dh_wire_task t = {9, 9, 9, 9, 9, 9};
    struct dh_err e;
    uint64_t id = 42, x = 777;
    char want[64];

    (void)state;
    for (int i = 0; i < 4000; i++) {
        uint64_t v[4] = {0, 0, 0, 0};
        int f = i % 4;

        v[f] = field_max[f] + 1 +
               (i < 4 ? 0 : rng_next(&x) % (UINT64_MAX - field_max[f]));
        assert_int_equal(dh_wire_task_id(v[0], v[1], v[2], v[3], &id, &e),
                         DH_ETOOBIG);
        snprintf(want, sizeof(want), "task %s %" PRIu64, names[f], v[f]);
        if (!strstr(e.msg, want))
            fail_msg("\"%s\" does not name \"%s\"", e.msg, want);
        assert_int_equal(id, 42); /* not written */
        assert_int_equal(dh_wire_task_make(&t, 1, v[0], v[1], v[2], v[3], &e),
                         DH_ETOOBIG);
        assert_int_equal(t.id, 9);
    }
    assert_int_equal(dh_wire_task_make(&t, UINT64_C(1) << 32, 0, 0, 0, 0, &e),
                     DH_ETOOBIG);
    assert_non_null(strstr(e.msg, "task epoch 4294967296"));
    assert_int_equal(t.epoch, 9);
    assert_int_equal(dh_wire_task_make(&t, 70000, 3, 2, 1, 0, &e), 0);
    assert_int_equal(t.id, (UINT64_C(3) << 48) | (UINT64_C(2) << 24) | 256);
    assert_int_equal(t.epoch, 70000);
    assert_int_equal(t.pass, 3);
}

/* The collisions of the old layout (epoch in 16 bits, which the Python side
 * bit-packed with a re-plan depth) cannot happen: epochs 0 and 4096, or
 * 0x9000 and a re-plan of epoch 0x1000, are different passes, and one
 * epoch's passes are distinct ids; an encoded task keeps its epoch. */
static void task_id_epoch_beside_the_id(void **state)
{
    static const uint64_t epochs[] = {0,      4096,  0x9000,
                                      0x8000, 65536, UINT32_MAX};
    struct dh_wire_task t[6], back;
    struct dh_wire_msg m, d;
    uint8_t *buf;
    size_t len;
    struct dh_err e;

    (void)state;
    for (uint64_t p = 0; p < 6; p++) {
        assert_int_equal(dh_wire_task_make(&t[p], epochs[p], p, 7, 1, 0, &e),
                         0);
        for (uint64_t q = 0; q < p; q++)
            assert_true(t[p].id != t[q].id);
        dh_wire_msg_init(&m, DH_WIRE_RELEASE);
        m.u.release.task = t[p];
        assert_int_equal(dh_wire_encode(&m, &buf, &len, &e), 0);
        assert_int_equal(dh_wire_decode(buf, len, &d, &e), 0);
        back = d.u.release.task;
        assert_task_eq(&back, &t[p]);
        dh_wire_free(buf);
        dh_wire_msg_fini(&m);
        dh_wire_msg_fini(&d);
    }
}

/* ---- the encoder's own checks, setters, plan conversions ---- */

static void encode_rejects_bad_messages(void **state)
{
    struct dh_wire_msg m;
    struct dh_err e;
    uint8_t *buf = (uint8_t *)"untouched";
    size_t len = 77;

    (void)state;
    dh_wire_msg_init(&m, DH_WIRE_NONE);
    assert_int_equal(dh_wire_encode(&m, &buf, &len, &e), DH_EINVAL);
    fill_msg(&m, 0);
    m.u.register_client.rank = m.u.register_client.world_size;
    assert_int_equal(dh_wire_encode(&m, &buf, &len, &e), DH_EINVAL);
    assert_non_null(strstr(e.msg, "register_client.rank"));
    fill_msg(&m, 0);
    memset(m.u.register_client.host, 'h', sizeof(m.u.register_client.host));
    assert_int_equal(dh_wire_encode(&m, &buf, &len, &e), DH_ETOOBIG);
    assert_non_null(strstr(e.msg, "register_client.host"));
    /* A rank token is "" or exactly 32 lower-case hex digits, and a remote
     * server has none (docs/wire-protocol.md "Authorization"). */
    fill_msg(&m, 0);
    m.u.register_client.token[31] = '\0';
    assert_int_equal(dh_wire_encode(&m, &buf, &len, &e), DH_EINVAL);
    assert_non_null(strstr(e.msg, "token has 31 characters"));
    fill_msg(&m, 0);
    m.u.register_client.token[3] = 'F';
    assert_int_equal(dh_wire_encode(&m, &buf, &len, &e), DH_EINVAL);
    assert_non_null(strstr(e.msg, "not lower-case hex"));
    fill_msg(&m, 1);
    m.u.register_server.role = DH_WIRE_ROLE_REMOTE;
    m.u.register_server.rank = 0;
    assert_int_equal(dh_wire_encode(&m, &buf, &len, &e), DH_EINVAL);
    assert_non_null(strstr(e.msg, "remote server carries no rank token"));
    /* So are a server's payload secret and the sender tokens of Routes and
     * payload headers (docs/security.md "Who may send a payload"). */
    fill_msg(&m, 1);
    m.u.register_server.sender_secret[5] = 'g';
    assert_int_equal(dh_wire_encode(&m, &buf, &len, &e), DH_EINVAL);
    assert_non_null(strstr(e.msg, "sender_secret is not lower-case hex"));
    fill_msg(&m, 9);
    m.u.route.sender_token[20] = '\0';
    assert_int_equal(dh_wire_encode(&m, &buf, &len, &e), DH_EINVAL);
    assert_non_null(strstr(e.msg, "sender_token has 20 characters"));
    dh_wire_msg_fini(&m);
    fill_msg(&m, 5);
    assert_int_equal(m.type, DH_WIRE_RESULT_NOTICE);
    m.u.result.sender_token[0] = 'Z';
    assert_int_equal(dh_wire_encode(&m, &buf, &len, &e), DH_EINVAL);
    assert_non_null(strstr(e.msg, "sender_token is not lower-case hex"));
    dh_wire_msg_fini(&m);
    /* A RankReport's misses are some of its steps (issue 18). */
    fill_msg(&m, 3);
    m.u.request.report.misses = m.u.request.report.steps - 1;
    assert_int_equal(dh_wire_encode(&m, &buf, &len, NULL), 0);
    dh_wire_free(buf);
    buf = (uint8_t *)"untouched";
    len = 77;
    m.u.request.report.steps--;
    m.u.request.report.misses = m.u.request.report.steps + 1;
    assert_int_equal(dh_wire_encode(&m, &buf, &len, &e), DH_EINVAL);
    assert_non_null(strstr(e.msg, "report.misses"));
    m.u.request.report.misses = 0;
    m.u.request.report.input_wait_ms = -1;
    assert_int_equal(dh_wire_encode(&m, &buf, &len, &e), DH_EINVAL);
    assert_non_null(strstr(e.msg, "report.input_wait_ms"));
    dh_wire_msg_fini(&m);
    fill_msg(&m, 5);
    m.u.result.task.id++;
    assert_int_equal(dh_wire_encode(&m, &buf, &len, &e), DH_EINVAL);
    assert_non_null(strstr(e.msg, "result_notice.task.id"));
    dh_wire_msg_fini(&m);
    dh_wire_msg_init(&m, DH_WIRE_DESCRIPTOR_REQUEST);
    m.u.request.n_samples = 9; /* a count without its array */
    assert_int_equal(dh_wire_encode(&m, &buf, &len, &e), DH_EINVAL);
    assert_non_null(strstr(e.msg, "descriptor_request.sample_ids is NULL"));
    m.u.request.n_samples = 0;
    dh_wire_msg_fini(&m);
    assert_string_equal((const char *)buf, "untouched");
    assert_int_equal(len, 77);
}

static void setters_respect_caps(void **state)
{
    struct dh_wire_msg m;
    struct dh_err e;
    const uint64_t one = 5;

    (void)state;
    dh_wire_msg_init(&m, DH_WIRE_DESCRIPTOR_REQUEST);
    assert_int_equal(dh_wire_set_samples(&m.u.request, &one, 1, &e), 0);
    assert_int_equal(
        dh_wire_set_samples(&m.u.request, big_ids, DH_WIRE_MAX_SAMPLES + 1, &e),
        DH_ETOOBIG);
    assert_int_equal(m.u.request.n_samples, 1); /* unchanged */
    dh__alloc_fail_after(0);
    assert_int_equal(dh_wire_set_samples(&m.u.request, big_ids, 4, &e),
                     DH_ENOMEM);
    dh__alloc_fail_reset();
    assert_int_equal(m.u.request.sample_ids[0], 5);
    assert_int_equal(dh_wire_set_indices(&m.u.request.plan, NULL,
                                         DH_WIRE_MAX_FRAMES + 1, &e),
                     DH_ETOOBIG);
    assert_int_equal(dh_wire_set_spares(&m.u.request, &one, 1, &e), 0);
    assert_int_equal(
        dh_wire_set_spares(&m.u.request, big_ids, DH_WIRE_MAX_SPARES + 1, &e),
        DH_ETOOBIG);
    assert_int_equal(m.u.request.n_spares, 1); /* unchanged */
    assert_int_equal(m.u.request.spare_ids[0], 5);
    dh_wire_msg_fini(&m);
    dh_wire_msg_init(&m, DH_WIRE_HEARTBEAT);
    assert_int_equal(
        dh_wire_set_links(&m.u.heartbeat, NULL, DH_WIRE_MAX_PEERS + 1, &e),
        DH_ETOOBIG);
    dh_wire_msg_fini(&m);
    dh_wire_msg_init(&m, DH_WIRE_RESULT_NOTICE);
    assert_int_equal(dh_wire_set_result_samples(&m.u.result, &one, NULL, 1, &e),
                     0);
    assert_int_equal(m.u.result.valid_frames[0], 0);
    {
        const uint32_t pos = 0;
        const int32_t cause = -1;

        assert_int_equal(dh_wire_set_result_subs(&m.u.result, big_vf, big_ids,
                                                 (const int32_t *)big_vf,
                                                 DH_WIRE_MAX_SPARES + 1, &e),
                         DH_ETOOBIG);
        assert_int_equal(m.u.result.n_subs, 0);
        for (int fail = 0; fail < 3; fail++) { /* each of the 3 arrays */
            dh__alloc_fail_after(fail);
            assert_int_equal(
                dh_wire_set_result_subs(&m.u.result, &pos, &one, &cause, 1, &e),
                DH_ENOMEM);
            dh__alloc_fail_reset();
            assert_int_equal(m.u.result.n_subs, 0); /* unchanged */
        }
        assert_int_equal(
            dh_wire_set_result_subs(&m.u.result, &pos, &one, &cause, 1, &e), 0);
        assert_int_equal(m.u.result.n_subs, 1);
        assert_int_equal(m.u.result.sub_failed[0], 5);
    }
    dh_wire_msg_fini(&m);
    assert_string_equal(dh_wire_type_name(DH_WIRE_ERROR_NOTICE),
                        "error_notice");
    assert_string_equal(dh_wire_type_name((enum dh_wire_type)99), "?");
}

static void plan_converts_both_ways(void **state)
{
    struct dh_media_plan p, back;
    struct dh_wire_plan w;
    const int64_t idx[4] = {3, 1, 4, 1};
    struct dh_err e;

    (void)state;
    memset(&w, 0, sizeof(w));
    dh_media_plan_init(&p);
    p.kind = DH_PLAN_INDICES;
    p.frames = 4;
    p.indices = idx;
    p.width = 320;
    assert_int_equal(dh_wire_plan_from_media(&w, &p, &e), 0);
    assert_int_equal(w.n_indices, 4);
    assert_true(w.indices != idx);
    dh_wire_plan_to_media(&w, &back);
    assert_int_equal(back.kind, DH_PLAN_INDICES);
    assert_int_equal(back.width, 320);
    assert_memory_equal(back.indices, idx, sizeof(idx));
    assert_memory_equal(back.mean, p.mean, sizeof(p.mean));
    p.kind = DH_PLAN_UNIFORM; /* drops the indices */
    assert_int_equal(dh_wire_plan_from_media(&w, &p, &e), 0);
    assert_int_equal(w.n_indices, 0);
    assert_null(w.indices);
    p.width = 0;
    assert_int_equal(dh_wire_plan_from_media(&w, &p, &e), DH_EINVAL);
    /* A native plan travels as its bounds, width x height 0. */
    p.geometry = DH_GEOM_NATIVE;
    p.kind = DH_PLAN_FPS;
    p.fps = 2;
    p.frames = 32;
    p.width = 224;
    p.max_side = 448;
    p.max_area = 602112;
    p.patch = 28;
    assert_int_equal(dh_wire_plan_from_media(&w, &p, &e), 0);
    assert_int_equal(w.width, 0);
    assert_int_equal(w.patch, 28);
    dh_wire_plan_to_media(&w, &back);
    assert_int_equal(back.geometry, DH_GEOM_NATIVE);
    assert_int_equal(back.max_side, 448);
    assert_int_equal(back.max_area, 602112);
    assert_int_equal(back.patch, 28);
    /* A fixed plan carries no native bounds, whatever its struct holds. */
    p.geometry = DH_GEOM_CROP;
    assert_int_equal(dh_wire_plan_from_media(&w, &p, &e), 0);
    assert_int_equal(w.max_side, 0);
    assert_int_equal(w.patch, 0);
    /* Sound travels with the plan; off, its fields are all 0 */
    p.audio_channels = 2;
    p.audio_samples = 99;
    assert_int_equal(dh_wire_plan_from_media(&w, &p, &e), 0);
    assert_int_equal(w.audio_rate, 0);
    assert_int_equal(w.audio_samples, 0);
    p.audio_rate = 16000;
    p.audio_required = 7;
    assert_int_equal(dh_wire_plan_from_media(&w, &p, &e), 0);
    assert_int_equal(w.audio_required, 1);
    dh_wire_plan_to_media(&w, &back);
    assert_int_equal(back.audio_rate, 16000);
    assert_int_equal(back.audio_channels, 2);
    assert_int_equal(back.audio_samples, 99);
    p.audio_channels = 3;
    assert_int_equal(dh_wire_plan_from_media(&w, &p, &e), DH_EINVAL);
    p.audio_channels = 1;
    p.audio_samples = DH_AUDIO_MAX_ROW + 1;
    assert_int_equal(dh_wire_plan_from_media(&w, &p, &e), DH_EINVAL);
    p.audio_samples = 1000;
    p.audio_feature = DH_AUDIO_WHISPER;
    p.audio_n_fft = 400;
    p.audio_hop = 160;
    p.audio_mels = 80;
    assert_int_equal(dh_wire_plan_from_media(&w, &p, &e), 0);
    dh_wire_plan_to_media(&w, &back);
    assert_int_equal(back.audio_feature, DH_AUDIO_WHISPER);
    assert_int_equal(back.audio_hop, 160);
    assert_int_equal(back.audio_mels, 80);
    p.audio_n_fft = 401; /* odd */
    assert_int_equal(dh_wire_plan_from_media(&w, &p, &e), DH_EINVAL);
    p.audio_n_fft = 4000; /* a row not longer than half a frame */
    assert_int_equal(dh_wire_plan_from_media(&w, &p, &e), DH_EINVAL);
    p.audio_feature = 0;
    p.audio_samples = 1;
    p.geometry = DH_GEOM_NATIVE; /* packed batches: not yet */
    assert_int_equal(dh_wire_plan_from_media(&w, &p, &e), DH_ENOTIMPL);
}

/* ---- allocation failure at every step ---- */

static void decode_fails_cleanly_without_memory(void **state)
{
    struct dh_wire_msg m;
    struct dh_err e;
    uint8_t *buf;
    size_t len;

    (void)state;
    for (int i = 0; i < ALL_TYPES_N; i++) {
        encode_small(i, &buf, &len);
        for (long n = 0;; n++) {
            uint64_t before = dh_wire_rejected();
            dh__alloc_fail_after(n);
            int rc = dh_wire_decode(buf, len, &m, &e);
            long failed = dh__alloc_failures();
            dh__alloc_fail_reset();
            if (rc == 0) {
                assert_int_equal(failed, 0);
                dh_wire_msg_fini(&m);
                break;
            }
            if (rc != DH_ENOMEM)
                fail_msg("type %d, fail after %ld: %d %s", i, n, rc, e.msg);
            assert_int_equal(dh_wire_rejected(), before); /* not counted */
            assert_true(n < 1000);
        }
        free(buf);
    }
}

static void encode_fails_cleanly_without_memory(void **state)
{
    struct dh_wire_msg m;
    struct dh_err e;
    uint8_t *buf;
    size_t len;

    (void)state;
    for (int i = 0; i < ALL_TYPES_N; i++) {
        fill_msg(&m, i);
        for (long n = 0;; n++) {
            dh__alloc_fail_after(n);
            int rc = dh_wire_encode(&m, &buf, &len, &e);
            dh__alloc_fail_reset();
            if (rc == 0) {
                dh_wire_free(buf);
                break;
            }
            assert_int_equal(rc, DH_ENOMEM);
            assert_true(n < 100);
        }
        dh_wire_msg_fini(&m);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(round_trip_every_type),
        cmocka_unit_test(round_trip_defaults),
        cmocka_unit_test(valid_pb_messages_decode),
        cmocka_unit_test(every_rule_rejects),
        cmocka_unit_test(oversized_and_expanding_messages),
        cmocka_unit_test(truncated_at_every_length),
        cmocka_unit_test(random_bytes_and_bit_flips),
        cmocka_unit_test(task_id_random_tuples),
        cmocka_unit_test(task_id_split_inverts),
        cmocka_unit_test(task_id_rejects_overflow),
        cmocka_unit_test(task_id_epoch_beside_the_id),
        cmocka_unit_test(encode_rejects_bad_messages),
        cmocka_unit_test(setters_respect_caps),
        cmocka_unit_test(plan_converts_both_ways),
        cmocka_unit_test(decode_fails_cleanly_without_memory),
        cmocka_unit_test(encode_fails_cleanly_without_memory),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
