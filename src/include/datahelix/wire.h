/*
 * datahelix/wire.h - the control-plane wire codec: plain C structs for the
 * messages of proto/datahelix.proto and an encoder/decoder that checks every
 * count, length, enum and number against the caps below
 * (docs/wire-protocol.md).
 *
 * Design notes:
 *   - One struct dh_wire_msg holds any message: `type` says which member of
 *     the union is valid.  It is caller-owned: dh_wire_msg_init() before
 *     use, dh_wire_msg_fini() after.  Text fields are fixed arrays inside the
 *     struct; the only heap memory a message owns are its variable-length
 *     arrays (sample ids, plan indices, peer links, valid-frame counts), set
 *     by the dh_wire_set_*() helpers (which copy) or by dh_wire_decode().
 *   - The codec is pure: no I/O, no locks, no globals except the atomic
 *     rejection counter.  Every allocation goes through the library's seam;
 *     memory used by one decode is bounded by a small multiple of
 *     DH_WIRE_MAX_MSG.
 *   - The bytes are never a C struct: decoding goes through the generated
 *     protobuf-c code, then through the checks, then into these structs.
 *     Encoding runs the same checks first, so a message this codec encodes
 *     is one it would accept.
 *   - A task's identity is (epoch, pass, step, rank, microbatch) and its id
 *     is derived from it, never from a counter that restarts (DESIGN.md 8);
 *     see dh_wire_task_id() for the bit layout and why the epoch is not in
 *     it.
 *
 * Thread-safety: every function is thread-safe on distinct messages.
 */
#ifndef DATAHELIX_WIRE_H
#define DATAHELIX_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "datahelix/error.h"
#include "datahelix/media.h"

/* Envelope.version this build speaks; any other is DH_EVERSION. */
#define DH_WIRE_VERSION 2u

/* ---- caps (checked on encode and decode) ---- */
#define DH_WIRE_MAX_MSG (1u << 20)     /* bytes of one encoded envelope */
#define DH_WIRE_MAX_SAMPLES 65536u     /* sample ids per request / result */
#define DH_WIRE_MAX_PEERS 4096u        /* peer links per heartbeat */
#define DH_WIRE_MAX_PATH 4096u         /* bytes of a path */
#define DH_WIRE_MAX_TEXT 4096u         /* bytes of a message / reason */
#define DH_WIRE_MAX_ADDR 1024u         /* bytes of a ZeroMQ endpoint */
#define DH_WIRE_MAX_HOST 255u          /* bytes of a host name */
#define DH_WIRE_MAX_RANKS 65536u       /* world size; ranks are below it */
#define DH_WIRE_MAX_WORKERS 4096u      /* workers of one DataServer */
#define DH_WIRE_MAX_QUEUE (1u << 20)   /* queue depth in a heartbeat */
#define DH_WIRE_MAX_FRAMES 4096u       /* plan frames (DH_MEDIA_MAX_FRAMES) */
#define DH_WIRE_MAX_DIM 16384u         /* plan width / height */
#define DH_WIRE_MAX_DIMS 8u            /* tensor rank of a result */
#define DH_WIRE_MAX_BYTES (1ull << 48) /* any byte count, offset or rate */
#define DH_WIRE_MAX_SLACK_MS 86400000  /* |slack_ms|: one day */
#define DH_WIRE_MAX_LATENCY_MS 1e9     /* heartbeat latency EWMA */
#define DH_WIRE_TOKEN_LEN 32u          /* hex digits of a rank token */
/* A Shutdown refusing a registration whose reason starts so may be tried
 * again (the server id is held by a live process that may soon be
 * declared dead): the DataServer sends its registration again until its
 * register timeout. */
#define DH_WIRE_RETRY_REASON "registration refused: try again: "
/* The environment variable that hands a spawned DataServer its rank's
 * token (set in that child's environment only, never on a command line). */
#define DH_RANK_TOKEN_ENV "DATAHELIX_RANK_TOKEN"
#define DH_WIRE_MAX_SPARES                                                     \
    64u /* spares per request, substitutions
                                          per result (skip policy) */

/* ---- task ids ---- */
#define DH_WIRE_PASS_BITS 16
#define DH_WIRE_STEP_BITS 24
#define DH_WIRE_RANK_BITS 16
#define DH_WIRE_MICROBATCH_BITS 8
/* Passes one client may start in a job (0..65535), steps of one epoch. */
#define DH_WIRE_MAX_PASSES (1u << DH_WIRE_PASS_BITS)
#define DH_WIRE_MAX_STEPS (1u << DH_WIRE_STEP_BITS)

/*
 * A task's identity (DESIGN.md 8): step `step` of the plan of `epoch`, part
 * `microbatch` of it, consumed by `rank`, in the client's pass `pass`.  `id`
 * is derived from the tuple by dh_wire_task_id(); a message whose id does
 * not match its tuple, or whose fields are out of range, is rejected.  Fill
 * it with dh_wire_task_make().
 *
 * A pass is one schedule a client was given (dh_client_start_pass(): every
 * iteration, re-planned rest or resume is a new one).  A client numbers its
 * passes itself, one more each time, never reusing one in its job; the
 * epoch is carried beside the id, not inside it, because a pass belongs to
 * exactly one epoch.  So any epoch count works: distinct tasks of one job
 * have distinct ids as long as each rank starts at most DH_WIRE_MAX_PASSES
 * passes (the client refuses the next one with DH_ETOOBIG, it never wraps).
 */
struct dh_wire_task {
    uint32_t epoch, pass, step, rank, microbatch;
    uint64_t id;
};

/*
 * *out = pass << 48 | step << 24 | rank << 8 | microbatch.
 *
 *   bits 63..48  pass        0..65535 (DH_WIRE_MAX_PASSES - 1)
 *   bits 47..24  step        0..16,777,215 (global step in the epoch)
 *   bits 23..8   rank        0..65535 (DH_WIRE_MAX_RANKS - 1)
 *   bits  7..0   microbatch  0..255
 *
 * A pure, injective function of (pass, step, rank, microbatch); ids sort in
 * that order, so one rank's ids sort in its request order.  The one place
 * that packs task ids: nothing else shifts these bits.  A field that does
 * not fit is DH_ETOOBIG (named in `e`) and *out is not written.
 */
int dh_wire_task_id(uint64_t pass, uint64_t step, uint64_t rank,
                    uint64_t microbatch, uint64_t *out,
                    struct dh_err *e) DH_MUST_CHECK;

/* Fills *t from the tuple and its derived id; DH_ETOOBIG as above, and for
 * an epoch above UINT32_MAX (then *t is not written). */
int dh_wire_task_make(struct dh_wire_task *t, uint64_t epoch, uint64_t pass,
                      uint64_t step, uint64_t rank, uint64_t microbatch,
                      struct dh_err *e) DH_MUST_CHECK;

/* Splits an id back into (pass, step, rank, microbatch) and `id` (never
 * fails: every u64 splits).  The epoch is not in the id: out->epoch is set
 * to 0; the caller knows it from its pass. */
void dh_wire_task_split(uint64_t id, struct dh_wire_task *out);

/* ---- messages ---- */
enum dh_wire_type {
    DH_WIRE_NONE = 0, /* after init with no type; never encoded */
    DH_WIRE_REGISTER_CLIENT,
    DH_WIRE_REGISTER_SERVER,
    DH_WIRE_HEARTBEAT,
    DH_WIRE_DESCRIPTOR_REQUEST,
    DH_WIRE_ROUTE,
    DH_WIRE_RESULT_NOTICE,
    DH_WIRE_ERROR_NOTICE,
    DH_WIRE_RELEASE,
    DH_WIRE_SHUTDOWN,
};

/* "register_client", ... ("none" for DH_WIRE_NONE, "?" out of range). */
const char *dh_wire_type_name(enum dh_wire_type t);

enum dh_wire_role { DH_WIRE_ROLE_LOCAL = 1, DH_WIRE_ROLE_REMOTE = 2 };

/* Text fields: NUL-terminated, at most the cap in bytes, no embedded NUL
 * (so a decoded field is exactly the bytes that were sent). */
struct dh_wire_register_client {
    uint32_t rank, world_size; /* rank < world_size <= DH_WIRE_MAX_RANKS */
    uint32_t pid;
    char host[DH_WIRE_MAX_HOST + 1];
    char server_addr[DH_WIRE_MAX_ADDR + 1]; /* local DataServer; may be "" */
    uint64_t incarnation; /* the Coordinator's, in its ack; 0 from a client */
    /* The rank's secret: "" or DH_WIRE_TOKEN_LEN lower-case hex digits
     * (docs/wire-protocol.md "Authorization"). */
    char token[DH_WIRE_TOKEN_LEN + 1];
};

struct dh_wire_register_server {
    uint32_t server_id;              /* >= 1 */
    char addr[DH_WIRE_MAX_ADDR + 1]; /* non-empty */
    enum dh_wire_role role;
    uint32_t rank;        /* LOCAL: rank served; REMOTE: 0 */
    uint32_t workers;     /* 1..DH_WIRE_MAX_WORKERS */
    uint64_t arena_bytes; /* LOCAL: 1..DH_WIRE_MAX_BYTES; REMOTE: staging
                             bytes, 0..DH_WIRE_MAX_BYTES */
    char host[DH_WIRE_MAX_HOST + 1];
    char token[DH_WIRE_TOKEN_LEN + 1]; /* LOCAL: the rank's token; REMOTE: "" */
    uint32_t cpus;    /* CPUs its workers may run on, <= DH_WIRE_MAX_WORKERS;
                         0 = unknown */
    uint64_t cpu_set; /* which: hash of boot id + affinity mask; 0 = unknown */
    /* The server's own payload secret: "" or DH_WIRE_TOKEN_LEN lower-case
     * hex digits (docs/wire-protocol.md "Authorization"). */
    char sender_secret[DH_WIRE_TOKEN_LEN + 1];
};

struct dh_wire_link {
    uint32_t peer_server_id; /* >= 1 */
    uint64_t bytes_per_s;    /* <= DH_WIRE_MAX_BYTES */
};

struct dh_wire_heartbeat {
    uint32_t server_id; /* >= 1 */
    uint64_t seq;
    uint32_t queue_depth;       /* <= DH_WIRE_MAX_QUEUE */
    uint32_t busy_workers;      /* <= DH_WIRE_MAX_WORKERS */
    double latency_ms;          /* EWMA, finite, 0..DH_WIRE_MAX_LATENCY_MS */
    struct dh_wire_link *links; /* owned, n_links <= DH_WIRE_MAX_PEERS */
    uint32_t n_links;
    int leaving; /* 0 or 1: the server is stopping, drop it now */
    int unknown; /* 0 or 1, Coordinator -> server: not registered here */
    double cpu_fraction;   /* CPU / (task time not waiting for a CPU), 0..1;
                            0 = not measured */
    uint32_t slot_waiting; /* workers waiting for an arena slot now,
                              <= DH_WIRE_MAX_WORKERS */
    /* the workers' reads since the server started: bytes, reads, ms
     * (finite, 0..DH_WIRE_MAX_TOTAL_MS) */
    uint64_t read_bytes, reads;
    double read_ms;
    /* of them, remote: fetched bytes, cache chunk hits / misses */
    uint64_t fetched_bytes, cache_hits, cache_misses;
};

/* Largest cumulative time a heartbeat may state (ms: about 31,700 years). */
#define DH_WIRE_MAX_TOTAL_MS 1e15

/* A media plan as it travels: struct dh_media_plan with owned indices. */
struct dh_wire_plan {
    enum dh_plan_kind kind;
    uint32_t frames; /* <= DH_WIRE_MAX_FRAMES */
    double fps;
    int64_t *indices; /* owned; DH_PLAN_INDICES: n_indices == frames */
    uint32_t n_indices;
    uint64_t seed;
    enum dh_pad pad;
    uint32_t width, height; /* 1..DH_WIRE_MAX_DIM */
    enum dh_geometry geometry;
    enum dh_layout layout;
    enum dh_dtype dtype;
    float mean[3], std[3];
    enum dh_snap snap;
    double snap_tol;
    /* DH_GEOM_NATIVE (else 0): max_side <= DH_WIRE_MAX_DIM, max_area <=
     * DH_MEDIA_MAX_PIXELS, patch <= DH_MEDIA_MAX_PATCH; width / height 0 */
    uint32_t max_side;
    uint64_t max_area;
    uint32_t patch;
    /* sound (dh_media_plan): rate 0 = none, then the rest 0; else rate
     * DH_AUDIO_MIN_RATE..MAX, channels 1..2, samples 1..DH_AUDIO_MAX_ROW,
     * required 0 or 1 */
    uint32_t audio_rate, audio_channels;
    uint64_t audio_samples;
    uint32_t audio_required;
    /* its features: feature 0 = none, and then the rest 0 (dh_media_plan) */
    uint32_t audio_feature, audio_n_fft, audio_hop, audio_mels;
    uint32_t audio_crop; /* enum dh_audio_crop; 0 without sound */
};

struct dh_wire_hints {
    double est_cpu_ms;      /* >= 0, finite; 0: unknown */
    uint64_t est_in_bytes;  /* <= DH_WIRE_MAX_BYTES */
    uint64_t est_out_bytes; /* <= DH_WIRE_MAX_BYTES */
    uint32_t steps_ahead;
    int local_only; /* 0 or 1 */
};

/* A rank's own figures (RankReport): shown, never acted upon. */
struct dh_wire_report {
    uint64_t steps;       /* <= DH_WIRE_MAX_BYTES (2^48) */
    uint64_t misses;      /* <= steps */
    double input_wait_ms; /* finite, 0..DH_WIRE_MAX_LATENCY_MS */
    double window_ms;     /* finite, 0..DH_WIRE_MAX_LATENCY_MS */
};

struct dh_wire_request {
    struct dh_wire_task task;
    uint32_t requester_rank; /* < DH_WIRE_MAX_RANKS */
    uint64_t *sample_ids;    /* owned, 1..DH_WIRE_MAX_SAMPLES */
    uint32_t n_samples;
    struct dh_wire_plan plan;
    int64_t slack_ms; /* a duration; |slack_ms| <= DH_WIRE_MAX_SLACK_MS */
    struct dh_wire_hints hints;
    uint64_t *spare_ids; /* owned, n_spares <= DH_WIRE_MAX_SPARES: the skip
                            policy's substitutes, in the order to try */
    uint32_t n_spares;
    int has_report; /* 1: `report` is set (RankReport, optional) */
    struct dh_wire_report report;
};

struct dh_wire_route {
    struct dh_wire_task task;
    uint32_t server_id;        /* chosen, >= 1 */
    uint32_t target_server_id; /* delivery target, >= 1 */
    char target_addr[DH_WIRE_MAX_ADDR + 1];
    int has_request; /* 1: `request` is set (its task must equal `task`) */
    struct dh_wire_request request;
    /* To the delivery target only: the token the placed server's payload
     * must carry; "" or DH_WIRE_TOKEN_LEN lower-case hex digits. */
    char sender_token[DH_WIRE_TOKEN_LEN + 1];
};

/* ResultNotice.stages (proto/datahelix.proto StageTimes; docs/trace.md).
 * Durations finite, 0..DH_WIRE_MAX_LATENCY_MS; read/decode/scale either
 * NULL (n_sample_times 0) or one entry per sample of the result. */
struct dh_wire_stages {
    int present; /* 0: the notice carries none */
    double queue_ms, alloc_ms, collate_ms, place_ms, notify_ms;
    float *read_ms, *decode_ms, *scale_ms; /* owned */
    float *audio_ms;      /* owned; NULL (none), or n_sample_times entries */
    uint64_t *read_bytes; /* owned; NULL, or n_sample_times entries */
    uint32_t n_sample_times;
    uint32_t worker;    /* < DH_WIRE_MAX_WORKERS */
    uint32_t server_id; /* who prepared it, if not the notice's; 0 */
    uint64_t ready_us;  /* CLOCK_MONOTONIC at the rank's host; 0 unknown */
};

struct dh_wire_result {
    struct dh_wire_task task;
    uint32_t server_id;            /* >= 1 */
    uint64_t arena_offset, length; /* no overflow, <= DH_WIRE_MAX_BYTES */
    uint32_t slot_generation;
    uint64_t dims[DH_WIRE_MAX_DIMS]; /* each 1..2^32 */
    uint32_t ndims;                  /* 1..DH_WIRE_MAX_DIMS */
    enum dh_dtype dtype; /* product(dims) x element size <= length */
    enum dh_layout layout;
    uint64_t *sample_ids;   /* owned, n_samples <= DH_WIRE_MAX_SAMPLES */
    uint32_t *valid_frames; /* owned, n_samples, each <= DH_WIRE_MAX_FRAMES */
    uint32_t n_samples;
    double service_ms; /* the task's own time at its server, not queueing;
                          finite, 0..DH_WIRE_MAX_LATENCY_MS; 0: unknown */
    /* Substitutions (skip policy), n_subs <= min(n_samples,
     * DH_WIRE_MAX_SPARES), all owned: sub_pos strictly increasing and
     * < n_samples; sample_ids[sub_pos[i]] is the substitute delivered for
     * sub_failed[i] (never equal to it), which failed with sub_cause[i]
     * (< 0). */
    uint32_t *sub_pos;
    uint64_t *sub_failed;
    int32_t *sub_cause;
    uint32_t n_subs;
    struct dh_wire_stages stages;
    /* A payload header's sender token (Route.sender_token); "" elsewhere. */
    char sender_token[DH_WIRE_TOKEN_LEN + 1];
};

struct dh_wire_error {
    struct dh_wire_task task;
    uint32_t server_id; /* >= 1 */
    uint64_t sample_id;
    char path[DH_WIRE_MAX_PATH + 1];
    int32_t cause; /* a DH_E* code, < 0 */
    char message[DH_WIRE_MAX_TEXT + 1];
};

struct dh_wire_release {
    struct dh_wire_task task;
    uint64_t slot_offset; /* <= DH_WIRE_MAX_BYTES */
    uint32_t generation;
};

struct dh_wire_shutdown {
    char reason[DH_WIRE_MAX_TEXT + 1];
};

struct dh_wire_msg {
    enum dh_wire_type type;
    union {
        struct dh_wire_register_client register_client;
        struct dh_wire_register_server register_server;
        struct dh_wire_heartbeat heartbeat;
        struct dh_wire_request request;
        struct dh_wire_route route;
        struct dh_wire_result result;
        struct dh_wire_error error;
        struct dh_wire_release release;
        struct dh_wire_shutdown shutdown;
    } u;
};

/*
 * Zeroes *m and sets its type; a request's (and a route's embedded
 * request's) plan gets dh_media_plan_init()'s defaults.  Never fails.
 */
void dh_wire_msg_init(struct dh_wire_msg *m, enum dh_wire_type type);
/* Frees the arrays *m owns and leaves it as after init(m, DH_WIRE_NONE).
 * Accepts NULL; safe to call twice. */
void dh_wire_msg_fini(struct dh_wire_msg *m);

/*
 * Array setters: copy `n` elements into memory the message owns (freeing
 * what the field held).  DH_ETOOBIG over the field's cap, DH_ENOMEM; on
 * error the field is unchanged.  n == 0 empties the field.
 */
int dh_wire_set_samples(struct dh_wire_request *r, const uint64_t *ids,
                        size_t n, struct dh_err *e) DH_MUST_CHECK;
int dh_wire_set_indices(struct dh_wire_plan *p, const int64_t *idx, size_t n,
                        struct dh_err *e) DH_MUST_CHECK;
int dh_wire_set_links(struct dh_wire_heartbeat *h,
                      const struct dh_wire_link *links, size_t n,
                      struct dh_err *e) DH_MUST_CHECK;
/* `valid_frames` may be NULL (all zero). */
int dh_wire_set_result_samples(struct dh_wire_result *r, const uint64_t *ids,
                               const uint32_t *valid_frames, size_t n,
                               struct dh_err *e) DH_MUST_CHECK;

/* The request's spares (copied; n <= DH_WIRE_MAX_SPARES). */
int dh_wire_set_spares(struct dh_wire_request *r, const uint64_t *ids, size_t n,
                       struct dh_err *e) DH_MUST_CHECK;
/* The result's substitutions (copied; n <= DH_WIRE_MAX_SPARES). */
int dh_wire_set_result_subs(struct dh_wire_result *r, const uint32_t *pos,
                            const uint64_t *failed, const int32_t *cause,
                            size_t n, struct dh_err *e) DH_MUST_CHECK;

/* The result's per-sample stage times: rows of 3 floats (read, decode,
 * scale ms) for n samples, copied; rows NULL or n 0 empties them.
 * DH_ETOOBIG, DH_ENOMEM. */
int dh_wire_set_result_stages(struct dh_wire_result *r, const float *rows,
                              size_t n, struct dh_err *e) DH_MUST_CHECK;
/* The result's per-sample read bytes (n entries, copied; NULL or n 0
 * empties them); n must be the stage times' count.  DH_EINVAL, DH_ENOMEM. */
int dh_wire_set_result_read_bytes(struct dh_wire_result *r,
                                  const uint64_t *bytes, size_t n,
                                  struct dh_err *e) DH_MUST_CHECK;

/* Plan conversions.  from_media copies p->indices (DH_ENOMEM, DH_ETOOBIG,
 * DH_EINVAL for a plan that fails dh_media_plan_check()); to_media fills
 * *out with indices borrowed from `w` (valid while `w` is unchanged). */
int dh_wire_plan_from_media(struct dh_wire_plan *w,
                            const struct dh_media_plan *p,
                            struct dh_err *e) DH_MUST_CHECK;
void dh_wire_plan_to_media(const struct dh_wire_plan *w,
                           struct dh_media_plan *out);

/*
 * Encodes `m` as one Envelope of version DH_WIRE_VERSION.  On success *buf
 * is a new buffer the caller frees with dh_wire_free() and *len its size
 * (<= DH_WIRE_MAX_MSG).  Checks `m` as the decoder would: DH_EINVAL for a
 * bad value, DH_ETOOBIG for a count or size over its cap, DH_ENOMEM; the
 * message names the field.  On error *buf and *len are not written.
 */
int dh_wire_encode(const struct dh_wire_msg *m, uint8_t **buf, size_t *len,
                   struct dh_err *e) DH_MUST_CHECK;

/* Frees a buffer from dh_wire_encode().  Accepts NULL. */
void dh_wire_free(uint8_t *buf);

/*
 * Decodes one Envelope from `buf` (network input: any bytes are safe).
 * `out` need not be initialised; on success it holds the message (release
 * it with dh_wire_msg_fini()); on error it is not written.
 *
 * Errors, each with a message naming the field and the value:
 *   DH_ETOOBIG   len > DH_WIRE_MAX_MSG, a count or string over its cap
 *   DH_EVERSION  version != DH_WIRE_VERSION (0: missing)
 *   DH_EFORMAT   not protobuf, no body, a missing sub-message, an enum or
 *                number out of range, a NUL inside text, a task id that
 *                does not match its tuple
 *   DH_ENOMEM    allocation failed (not counted as a rejection)
 * Every error but DH_ENOMEM increments dh_wire_rejected().
 */
int dh_wire_decode(const uint8_t *buf, size_t len, struct dh_wire_msg *out,
                   struct dh_err *e) DH_MUST_CHECK;

/* Messages dh_wire_decode() rejected in this process (atomic). */
uint64_t dh_wire_rejected(void);

#endif
