/*
 * wire.c - the control-plane codec (see datahelix/wire.h and
 * docs/wire-protocol.md): task ids, message life cycle, encode and decode.
 *
 * Design: three layers, each short.
 *   1. protobuf-c parses the bytes (code generated from
 *      proto/datahelix.proto), with an allocator that goes through the
 *      library's seam and stops at a budget proportional to the input, so a
 *      decode never allocates more than DECODE_BUDGET(len) bytes whatever
 *      the bytes say.
 *   2. wire_pb.c copies the parsed message into our plain structs, refusing
 *      counts and strings over their caps before copying anything.
 *   3. wire_check.c validates numbers, enums and cross-field rules on our
 *      structs.  Encode runs the same checks, so whatever this codec sends
 *      it would also accept.
 * Pure: no I/O.  The only global is the atomic rejection counter.
 */
#include "datahelix/wire.h"

#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "alloc.h"
#include "datahelix/media_stages.h"
#include "wire_internal.h"

/* Our enums travel as their numeric values: keep them equal. */
_Static_assert((int)DH_PLAN_ALL == DATAHELIX__WIRE__PLAN_KIND__PLAN_ALL,
               "plan kinds");
_Static_assert((int)DH_GEOM_NATIVE == DATAHELIX__WIRE__GEOMETRY__GEOM_NATIVE,
               "geometry");
_Static_assert((int)DH_SNAP_KEY == DATAHELIX__WIRE__SNAP__SNAP_KEY, "snap");
_Static_assert((int)DH_DTYPE_F32 == DATAHELIX__WIRE__DTYPE__DTYPE_F32, "dtype");
_Static_assert((int)DH_LAYOUT_TCHW == DATAHELIX__WIRE__LAYOUT__LAYOUT_TCHW,
               "layout");
_Static_assert((int)DH_PAD_ZERO == DATAHELIX__WIRE__PAD__PAD_ZERO, "pad");
_Static_assert((int)DH_WIRE_ROLE_REMOTE ==
                   DATAHELIX__WIRE__SERVER_ROLE__SERVER_ROLE_REMOTE,
               "role");
_Static_assert(DH_WIRE_MAX_FRAMES == DH_MEDIA_MAX_FRAMES, "frame cap");
_Static_assert(DH_WIRE_PASS_BITS + DH_WIRE_STEP_BITS + DH_WIRE_RANK_BITS +
                       DH_WIRE_MICROBATCH_BITS ==
                   64,
               "task id bits");
_Static_assert((1u << DH_WIRE_RANK_BITS) == DH_WIRE_MAX_RANKS, "rank bits");

/* Most bytes protobuf-c may allocate to decode `len` input bytes.  The
 * densest valid message (a heartbeat of minimal peer links) needs about
 * 12 bytes per input byte; anything beyond 16x is hostile. */
#define DECODE_BUDGET(len) ((size_t)(len)*16 + 65536)

static atomic_uint_fast64_t rejected_count;

uint64_t dh_wire_rejected(void)
{
    return (uint64_t)atomic_load(&rejected_count);
}

/* ------------------------------------------------------------------ */
/* task ids                                                            */

#define FIELD_MAX(bits) ((UINT64_C(1) << (bits)) - 1)

int dh_wire_task_id(uint64_t pass, uint64_t step, uint64_t rank,
                    uint64_t microbatch, uint64_t *out, struct dh_err *e)
{
    static const char *const names[4] = {"pass", "step", "rank", "microbatch"};
    static const int bits[4] = {DH_WIRE_PASS_BITS, DH_WIRE_STEP_BITS,
                                DH_WIRE_RANK_BITS, DH_WIRE_MICROBATCH_BITS};
    const uint64_t v[4] = {pass, step, rank, microbatch};
    uint64_t id = 0;

    for (int i = 0; i < 4; i++) {
        if (v[i] > FIELD_MAX(bits[i]))
            return dh_err_set(e, DH_ETOOBIG,
                              "wire: task %s %" PRIu64
                              " does not fit in %d bits (max %" PRIu64 ")",
                              names[i], v[i], bits[i], FIELD_MAX(bits[i]));
        id = (id << bits[i]) | v[i];
    }
    *out = id;
    return 0;
}

int dh_wire_task_make(struct dh_wire_task *t, uint64_t epoch, uint64_t pass,
                      uint64_t step, uint64_t rank, uint64_t microbatch,
                      struct dh_err *e)
{
    uint64_t id;
    int rc;

    if (epoch > UINT32_MAX)
        return dh_err_set(e, DH_ETOOBIG,
                          "wire: task epoch %" PRIu64
                          " does not fit in 32 bits (max %" PRIu32 ")",
                          epoch, UINT32_MAX);
    if ((rc = dh_wire_task_id(pass, step, rank, microbatch, &id, e)) < 0)
        return rc;
    t->epoch = (uint32_t)epoch;
    t->pass = (uint32_t)pass;
    t->step = (uint32_t)step;
    t->rank = (uint32_t)rank;
    t->microbatch = (uint32_t)microbatch;
    t->id = id;
    return 0;
}

void dh_wire_task_split(uint64_t id, struct dh_wire_task *out)
{
    const int rank_at = DH_WIRE_MICROBATCH_BITS;
    const int step_at = rank_at + DH_WIRE_RANK_BITS;
    const int pass_at = step_at + DH_WIRE_STEP_BITS;

    out->microbatch = (uint32_t)(id & FIELD_MAX(DH_WIRE_MICROBATCH_BITS));
    out->rank = (uint32_t)((id >> rank_at) & FIELD_MAX(DH_WIRE_RANK_BITS));
    out->step = (uint32_t)((id >> step_at) & FIELD_MAX(DH_WIRE_STEP_BITS));
    out->pass = (uint32_t)(id >> pass_at);
    out->epoch = 0; /* not in the id (wire.h) */
    out->id = id;
}

/* ------------------------------------------------------------------ */
/* message life cycle and setters                                      */

const char *dh_wire_type_name(enum dh_wire_type t)
{
    static const char *const names[] = {
        "none",          "register_client",    "register_server",
        "heartbeat",     "descriptor_request", "route",
        "result_notice", "error_notice",       "release",
        "shutdown",
    };
    if ((unsigned)t >= sizeof(names) / sizeof(names[0]))
        return "?";
    return names[t];
}

static void plan_init(struct dh_wire_plan *w)
{
    struct dh_media_plan p;

    dh_media_plan_init(&p);
    memset(w, 0, sizeof(*w));
    w->kind = p.kind;
    w->frames = (uint32_t)p.frames;
    w->pad = p.pad;
    w->width = (uint32_t)p.width;
    w->height = (uint32_t)p.height;
    w->geometry = p.geometry;
    w->layout = p.layout;
    w->dtype = p.dtype;
    memcpy(w->mean, p.mean, sizeof(w->mean));
    memcpy(w->std, p.std, sizeof(w->std));
    w->snap = p.snap;
}

static void request_fini(struct dh_wire_request *r)
{
    dh__free(r->sample_ids);
    dh__free(r->spare_ids);
    dh__free(r->plan.indices);
}

static void result_fini(struct dh_wire_result *r)
{
    dh__free(r->sample_ids);
    dh__free(r->valid_frames);
    dh__free(r->sub_pos);
    dh__free(r->sub_failed);
    dh__free(r->sub_cause);
    dh__free(r->stages.read_ms);
    dh__free(r->stages.decode_ms);
    dh__free(r->stages.scale_ms);
    dh__free(r->stages.audio_ms);
    dh__free(r->stages.read_bytes);
}

void dh_wire_msg_init(struct dh_wire_msg *m, enum dh_wire_type type)
{
    memset(m, 0, sizeof(*m));
    m->type = type;
    if (type == DH_WIRE_DESCRIPTOR_REQUEST)
        plan_init(&m->u.request.plan);
    else if (type == DH_WIRE_ROUTE)
        plan_init(&m->u.route.request.plan);
}

void dh_wire_msg_fini(struct dh_wire_msg *m)
{
    if (!m)
        return;
    switch (m->type) {
    case DH_WIRE_HEARTBEAT:
        dh__free(m->u.heartbeat.links);
        break;
    case DH_WIRE_DESCRIPTOR_REQUEST:
        request_fini(&m->u.request);
        break;
    case DH_WIRE_ROUTE:
        request_fini(&m->u.route.request);
        break;
    case DH_WIRE_RESULT_NOTICE:
        result_fini(&m->u.result);
        break;
    default:
        break;
    }
    memset(m, 0, sizeof(*m));
}

/* A copy of n elements of `size` bytes, cap-checked; NULL *out for n == 0. */
int dh__wire_copy_array(void **out, const void *src, size_t n, size_t size,
                        size_t cap, const char *field, struct dh_err *e)
{
    void *p;

    if (n > cap)
        return dh_err_set(e, DH_ETOOBIG,
                          "wire: %s: %zu entries over the cap"
                          " of %zu",
                          field, n, cap);
    if (n == 0) {
        *out = NULL;
        return 0;
    }
    if (!(p = dh__malloc(n * size)))
        return dh_err_set(e, DH_ENOMEM,
                          "wire: %s: out of memory for %zu "
                          "entries",
                          field, n);
    if (src)
        memcpy(p, src, n * size);
    else
        memset(p, 0, n * size);
    *out = p;
    return 0;
}

int dh_wire_set_samples(struct dh_wire_request *r, const uint64_t *ids,
                        size_t n, struct dh_err *e)
{
    void *p = NULL; /* GCC, inlining the copy, cannot tell rc < 0 */
    int rc = dh__wire_copy_array(&p, ids, n, sizeof(*ids), DH_WIRE_MAX_SAMPLES,
                                 "descriptor_request.sample_ids", e);

    if (rc < 0)
        return rc;
    dh__free(r->sample_ids);
    r->sample_ids = p;
    r->n_samples = (uint32_t)n;
    return 0;
}

int dh_wire_set_indices(struct dh_wire_plan *w, const int64_t *idx, size_t n,
                        struct dh_err *e)
{
    void *p = NULL; /* GCC, inlining the copy, cannot tell rc < 0 */
    int rc = dh__wire_copy_array(&p, idx, n, sizeof(*idx), DH_WIRE_MAX_FRAMES,
                                 "plan.indices", e);

    if (rc < 0)
        return rc;
    dh__free(w->indices);
    w->indices = p;
    w->n_indices = (uint32_t)n;
    return 0;
}

int dh_wire_set_links(struct dh_wire_heartbeat *h,
                      const struct dh_wire_link *links, size_t n,
                      struct dh_err *e)
{
    void *p = NULL; /* GCC, inlining the copy, cannot tell rc < 0 */
    int rc = dh__wire_copy_array(&p, links, n, sizeof(*links),
                                 DH_WIRE_MAX_PEERS, "heartbeat.links", e);

    if (rc < 0)
        return rc;
    dh__free(h->links);
    h->links = p;
    h->n_links = (uint32_t)n;
    return 0;
}

int dh_wire_set_result_samples(struct dh_wire_result *r, const uint64_t *ids,
                               const uint32_t *valid_frames, size_t n,
                               struct dh_err *e)
{
    void *pi = NULL, *pv = NULL;
    int rc;

    if ((rc = dh__wire_copy_array(&pi, ids, n, sizeof(*ids),
                                  DH_WIRE_MAX_SAMPLES,
                                  "result_notice.sample_ids", e)) < 0)
        return rc;
    if ((rc = dh__wire_copy_array(&pv, valid_frames, n, sizeof(*valid_frames),
                                  DH_WIRE_MAX_SAMPLES,
                                  "result_notice.valid_frames", e)) < 0) {
        dh__free(pi);
        return rc;
    }
    dh__free(r->sample_ids);
    dh__free(r->valid_frames);
    r->sample_ids = pi;
    r->valid_frames = pv;
    r->n_samples = (uint32_t)n;
    return 0;
}

int dh_wire_set_spares(struct dh_wire_request *r, const uint64_t *ids, size_t n,
                       struct dh_err *e)
{
    void *p = NULL;
    int rc = dh__wire_copy_array(&p, ids, n, sizeof(*ids), DH_WIRE_MAX_SPARES,
                                 "descriptor_request.spare_ids", e);

    if (rc < 0)
        return rc;
    dh__free(r->spare_ids);
    r->spare_ids = p;
    r->n_spares = (uint32_t)n;
    return 0;
}

int dh_wire_set_result_stages(struct dh_wire_result *r, const float *rows,
                              size_t n, struct dh_err *e)
{
    float *v[DH_MS_COUNT] = {NULL};
    int sound = 0;

    if (!rows)
        n = 0;
    if (n > DH_WIRE_MAX_SAMPLES)
        return dh_err_set(e, DH_ETOOBIG,
                          "result_notice.stages: %zu samples over the cap "
                          "of %u",
                          n, DH_WIRE_MAX_SAMPLES);
    for (size_t i = 0; i < n && !sound; i++)
        sound = rows[i * DH_MS_COUNT + DH_MS_AUDIO] != 0;
    for (int k = 0; n && k < DH_MS_COUNT; k++) {
        if (k == DH_MS_AUDIO && !sound)
            break; /* no sound: no audio_ms, as an older server sends */
        if (!(v[k] = dh__malloc(n * sizeof(float)))) {
            for (int j = 0; j < k; j++)
                dh__free(v[j]);
            return dh_err_set(e, DH_ENOMEM,
                              "result_notice.stages: out of "
                              "memory");
        }
        for (size_t i = 0; i < n; i++)
            v[k][i] = rows[i * DH_MS_COUNT + (size_t)k];
    }
    dh__free(r->stages.read_ms);
    dh__free(r->stages.decode_ms);
    dh__free(r->stages.scale_ms);
    dh__free(r->stages.audio_ms);
    r->stages.read_ms = v[DH_MS_READ];
    r->stages.decode_ms = v[DH_MS_DECODE];
    r->stages.scale_ms = v[DH_MS_SCALE];
    r->stages.audio_ms = v[DH_MS_AUDIO];
    r->stages.n_sample_times = (uint32_t)n;
    return 0;
}

int dh_wire_set_result_read_bytes(struct dh_wire_result *r,
                                  const uint64_t *bytes, size_t n,
                                  struct dh_err *e)
{
    uint64_t *v = NULL;

    if (!bytes)
        n = 0;
    if (n && n != r->stages.n_sample_times)
        return dh_err_set(e, DH_EINVAL,
                          "result_notice.stages: %zu read sizes for %u "
                          "sample times",
                          n, r->stages.n_sample_times);
    if (n && !(v = dh__malloc(n * sizeof(*v))))
        return dh_err_set(e, DH_ENOMEM, "result_notice.stages: out of memory");
    if (n)
        memcpy(v, bytes, n * sizeof(*v));
    dh__free(r->stages.read_bytes);
    r->stages.read_bytes = v;
    return 0;
}

int dh_wire_set_result_subs(struct dh_wire_result *r, const uint32_t *pos,
                            const uint64_t *failed, const int32_t *cause,
                            size_t n, struct dh_err *e)
{
    void *pp = NULL, *pf = NULL, *pc = NULL;
    int rc;

    if ((rc = dh__wire_copy_array(&pp, pos, n, sizeof(*pos), DH_WIRE_MAX_SPARES,
                                  "result_notice.sub_positions", e)) < 0 ||
        (rc = dh__wire_copy_array(&pf, failed, n, sizeof(*failed),
                                  DH_WIRE_MAX_SPARES,
                                  "result_notice.sub_failed_ids", e)) < 0 ||
        (rc = dh__wire_copy_array(&pc, cause, n, sizeof(*cause),
                                  DH_WIRE_MAX_SPARES,
                                  "result_notice.sub_causes", e)) < 0) {
        dh__free(pp);
        dh__free(pf);
        return rc;
    }
    dh__free(r->sub_pos);
    dh__free(r->sub_failed);
    dh__free(r->sub_cause);
    r->sub_pos = pp;
    r->sub_failed = pf;
    r->sub_cause = pc;
    r->n_subs = (uint32_t)n;
    return 0;
}

void dh_wire_plan_to_media(const struct dh_wire_plan *w,
                           struct dh_media_plan *out)
{
    out->kind = w->kind;
    out->frames = w->frames;
    out->fps = w->fps;
    out->indices = w->indices;
    out->seed = w->seed;
    out->pad = w->pad;
    out->width = (int32_t)w->width;
    out->height = (int32_t)w->height;
    out->geometry = w->geometry;
    out->layout = w->layout;
    out->dtype = w->dtype;
    memcpy(out->mean, w->mean, sizeof(out->mean));
    memcpy(out->std, w->std, sizeof(out->std));
    out->snap = w->snap;
    out->snap_tol = w->snap_tol;
    out->max_side = (int32_t)w->max_side;
    out->max_area = (int64_t)w->max_area;
    out->patch = (int32_t)w->patch;
    out->audio_rate = (int32_t)w->audio_rate;
    out->audio_channels = (int32_t)w->audio_channels;
    out->audio_samples = (int64_t)w->audio_samples;
    out->audio_required = (int32_t)w->audio_required;
    out->audio_feature = (int32_t)w->audio_feature;
    out->audio_n_fft = (int32_t)w->audio_n_fft;
    out->audio_hop = (int32_t)w->audio_hop;
    out->audio_mels = (int32_t)w->audio_mels;
    out->audio_crop = (int32_t)w->audio_crop;
    /* The wire carries no cap: a DataServer holds every plan it is sent to
     * its own default, DH_MEDIA_MAX_PIXELS, whatever a peer would like. */
    out->max_pixels = 0;
}

int dh_wire_plan_from_media(struct dh_wire_plan *w,
                            const struct dh_media_plan *p, struct dh_err *e)
{
    int native, feat;
    int rc;

    if ((rc = dh_media_plan_check(p, e)) < 0)
        return rc;
    if (p->frames < 0 || p->frames > (int64_t)DH_WIRE_MAX_FRAMES)
        return dh_err_set(e, DH_ETOOBIG,
                          "wire: plan.frames %" PRId64 " out of range 0..%u",
                          p->frames, DH_WIRE_MAX_FRAMES);
    if (p->kind == DH_PLAN_INDICES &&
        (rc = dh_wire_set_indices(w, p->indices, (size_t)p->frames, e)) < 0)
        return rc;
    if (p->kind != DH_PLAN_INDICES) {
        dh__free(w->indices);
        w->indices = NULL;
        w->n_indices = 0;
    }
    w->kind = p->kind;
    w->frames = (uint32_t)p->frames;
    w->fps = p->fps;
    w->seed = p->seed;
    w->pad = p->pad;
    w->width = (uint32_t)p->width;
    w->height = (uint32_t)p->height;
    w->geometry = p->geometry;
    w->layout = p->layout;
    w->dtype = p->dtype;
    native = p->geometry == DH_GEOM_NATIVE;
    w->width = native ? 0 : w->width;
    w->height = native ? 0 : w->height;
    w->max_side = native ? (uint32_t)p->max_side : 0;
    w->max_area = native ? (uint64_t)p->max_area : 0;
    w->patch = native ? (uint32_t)p->patch : 0;
    memcpy(w->mean, p->mean, sizeof(w->mean));
    memcpy(w->std, p->std, sizeof(w->std));
    w->snap = p->snap;
    w->snap_tol = p->snap_tol;
    w->audio_rate = (uint32_t)p->audio_rate;
    w->audio_channels = p->audio_rate ? (uint32_t)p->audio_channels : 0;
    w->audio_samples = p->audio_rate ? (uint64_t)p->audio_samples : 0;
    w->audio_required = p->audio_rate ? (uint32_t)(p->audio_required != 0) : 0;
    feat = p->audio_rate && p->audio_feature;
    w->audio_feature = feat ? (uint32_t)p->audio_feature : 0;
    w->audio_n_fft = feat ? (uint32_t)p->audio_n_fft : 0;
    w->audio_hop = feat ? (uint32_t)p->audio_hop : 0;
    w->audio_mels = feat ? (uint32_t)p->audio_mels : 0;
    w->audio_crop = p->audio_rate ? (uint32_t)p->audio_crop : 0;
    return 0;
}

/* ------------------------------------------------------------------ */
/* encode and decode                                                   */

int dh_wire_encode(const struct dh_wire_msg *m, uint8_t **buf, size_t *len,
                   struct dh_err *e)
{
    struct dh__wire_pb_out o;
    uint8_t *out;
    size_t n;
    int rc;

    memset(&o, 0, sizeof(o));
    if ((rc = dh__wire_check(m, DH_EINVAL, e)) < 0 ||
        (rc = dh__wire_to_pb(&o, m, e)) < 0)
        goto out_free_links;
    n = protobuf_c_message_get_packed_size(&o.env.base);
    if (n > DH_WIRE_MAX_MSG) {
        rc = dh_err_set(e, DH_ETOOBIG,
                        "wire: %s: %zu bytes encoded, over "
                        "the cap of %u",
                        dh_wire_type_name(m->type), n, DH_WIRE_MAX_MSG);
        goto out_free_links;
    }
    if (!(out = dh__malloc(n))) {
        rc = dh_err_set(e, DH_ENOMEM,
                        "wire: %s: out of memory for %zu "
                        "bytes",
                        dh_wire_type_name(m->type), n);
        goto out_free_links;
    }
    protobuf_c_message_pack(&o.env.base, out);
    *buf = out;
    *len = n;
out_free_links:
    dh__free(o.links);
    dh__free(o.link_ptrs);
    return rc;
}

void dh_wire_free(uint8_t *buf)
{
    dh__free(buf);
}

/* protobuf-c allocations go through the seam, within a budget. */
struct pb_alloc {
    size_t used, budget;
    int oom;  /* the seam refused: DH_ENOMEM */
    int over; /* the budget refused: DH_ETOOBIG */
};

static void *pb_alloc_fn(void *data, size_t size)
{
    struct pb_alloc *a = data;
    void *p;

    if (size > a->budget - a->used) {
        a->over = 1;
        return NULL;
    }
    if (!(p = dh__malloc(size))) {
        a->oom = 1;
        return NULL;
    }
    a->used += size;
    return p;
}

static void pb_free_fn(void *data, void *p)
{
    (void)data;
    dh__free(p);
}

static int unpack_failed(const struct pb_alloc *a, size_t len, struct dh_err *e)
{
    if (a->oom)
        return dh_err_set(e, DH_ENOMEM,
                          "wire: out of memory decoding a "
                          "%zu-byte message",
                          len);
    if (a->over)
        return dh_err_set(e, DH_ETOOBIG,
                          "wire: a %zu-byte message expands "
                          "past the decode budget of %zu bytes",
                          len, a->budget);
    return dh_err_set(e, DH_EFORMAT,
                      "wire: %zu bytes are not a valid "
                      "envelope (malformed protobuf)",
                      len);
}

int dh_wire_decode(const uint8_t *buf, size_t len, struct dh_wire_msg *out,
                   struct dh_err *e)
{
    static const uint8_t empty[1];
    struct pb_alloc a = {0, DECODE_BUDGET(len), 0, 0};
    ProtobufCAllocator al = {pb_alloc_fn, pb_free_fn, &a};
    struct dh_wire_msg m;
    PbEnvelope *env;
    int rc;

    if (len > DH_WIRE_MAX_MSG) {
        rc = dh_err_set(e, DH_ETOOBIG,
                        "wire: message of %zu bytes over the "
                        "cap of %u",
                        len, DH_WIRE_MAX_MSG);
        goto out_count;
    }
    if (!(env = datahelix__wire__envelope__unpack(&al, len,
                                                  buf ? buf : empty))) {
        rc = unpack_failed(&a, len, e);
        goto out_count;
    }
    if (env->version != DH_WIRE_VERSION) {
        rc = dh_err_set(
            e, DH_EVERSION,
            "wire: envelope version %" PRIu32 " %s (this build speaks %u)",
            env->version, env->version ? "is not supported" : "is missing",
            DH_WIRE_VERSION);
        goto out_free_env;
    }
    dh_wire_msg_init(&m, dh__wire_type_of(env->body_case));
    if ((rc = dh__wire_from_pb(&m, env, e)) < 0 ||
        (rc = dh__wire_check(&m, DH_EFORMAT, e)) < 0) {
        dh_wire_msg_fini(&m);
        goto out_free_env;
    }
    *out = m;
out_free_env:
    datahelix__wire__envelope__free_unpacked(env, &al);
out_count:
    if (rc < 0 && rc != DH_ENOMEM)
        atomic_fetch_add(&rejected_count, 1);
    return rc;
}
