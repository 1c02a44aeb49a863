/*
 * client.c - the consumer's side of the client (client.h): create and
 * destroy, epochs, next() in request order, batch release, statistics.
 * The I/O thread is in client_io.c, the local server in client_spawn.c.
 *
 * Design: next() returns one of four things, each its own code (typed
 * errors): a batch; a step that failed and is consumed (DH_ESAMPLE, or
 * DH_EARENA from the server), with dh_client_failure() as fields; the
 * consumer holding the arena up (DH_EARENA at once, the step still next:
 * arena_held_up()); or a wait that ran out (DH_ETIMEOUT, nothing else).
 * Request slack comes from the one deadline model of place.h (the
 * dh_window in c->win), which the simulator calls too; ddl_ms is only the
 * miss threshold.  A schedule is a pass of an epoch (the task identity).
 *
 * Locking: see client_internal.h.  next() waits on c->cv with a deadline;
 * a batch holds a reference on the client so the memory it points into
 * stays mapped after destroy(); held bytes per arena are atomics, so a
 * release needs no lock.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include <zmq.h>

#include "core/log.h"
#include "core/alloc.h"
#include "core/err_kind.h"
#include "core/clock.h"
#include "datahelix/batch.h"
#include "datahelix/media_stages.h"
#include "media/cache.h"
#include "media/prefetch.h"
#include "runtime/client_internal.h"
#include "runtime/transport.h"

#define MIN_ARENA ((size_t)64 << 20)
#define DEFAULT_ARENA ((size_t)256 << 20)

/* A sample's time at its server: its stages' sum (media_stages.h). */
static float sample_ms(const float *row)
{
    return row[DH_MS_READ] + row[DH_MS_DECODE] + row[DH_MS_SCALE] +
           row[DH_MS_AUDIO];
}

/* What a batch owns: its parts' slots and a reference on the client. */
struct cl_batch {
    struct dh_client_batch pub;
    struct dh_client *c;
    struct cl_batch *prev, *next; /* c->batches: live ones (mu) */
    int arena[DH_CLIENT_MAX_PARTS];
    struct dh_slot_ref ref[DH_CLIENT_MAX_PARTS];
};

void dh_client_opts_default(struct dh_client_opts *o)
{
    memset(o, 0, sizeof(*o));
    o->world_size = 1;
    o->ds_workers = 2;
    dh_media_plan_init(&o->plan);
    o->prefetch = 4;
    o->microbatches = 1;
    o->timeout_ms = 60000;
    o->start_timeout_ms = 15000;
    o->max_restarts = 3;
    o->step_ms_hint = 100;
    o->ddl_ms = DH_CLIENT_DDL_MS;
}

/* ---- create / destroy ---- */

static int check_opts(const struct dh_client_opts *o, struct dh_err *e)
{
    if (!o || !o->coordinator || !o->coordinator[0] || !o->index_path ||
        !o->index_path[0])
        return dh_err_set(e, DH_EINVAL,
                          "client: the coordinator address and "
                          "the index path are required");
    if (strlen(o->coordinator) > DH_WIRE_MAX_ADDR)
        return dh_err_set(e, DH_EINVAL,
                          "client: coordinator address too "
                          "long");
    if (o->world_size < 1 || o->world_size > DH_WIRE_MAX_RANKS ||
        o->rank >= o->world_size)
        return dh_err_set(e, DH_EINVAL, "client: rank %u of world size %u",
                          o->rank, o->world_size);
    if (o->prefetch < 1 || o->prefetch > DH_CLIENT_MAX_PREFETCH ||
        o->microbatches < 1 || o->microbatches > DH_CLIENT_MAX_MICROBATCHES)
        return dh_err_set(e, DH_EINVAL,
                          "client: prefetch %u (1..%u) or "
                          "microbatches %u (1..%u) out of range",
                          o->prefetch, DH_CLIENT_MAX_PREFETCH, o->microbatches,
                          DH_CLIENT_MAX_MICROBATCHES);
    if (o->timeout_ms < 1 || o->start_timeout_ms < 1 || o->max_restarts < 0 ||
        o->ds_workers < 1 || !(o->step_ms_hint >= 0) ||
        !(o->step_ms_hint <= DH_CLIENT_MAX_STEP_MS) ||
        !(o->step_deadline_ms >= 0 &&
          o->step_deadline_ms <= DH_CLIENT_MAX_STEP_MS) ||
        !(o->ddl_ms >= 0 && o->ddl_ms <= DH_CLIENT_MAX_STEP_MS))
        return dh_err_set(e, DH_EINVAL,
                          "client: timeouts must be >= 1 ms, "
                          "workers >= 1, restarts >= 0, and the step hint, "
                          "step deadline and ddl_ms in [0, %.0f] ms",
                          DH_CLIENT_MAX_STEP_MS);
    if (o->held > DH_CLIENT_MAX_PREFETCH)
        return dh_err_set(e, DH_EINVAL, "client: held %u (0..%u)", o->held,
                          DH_CLIENT_MAX_PREFETCH);
    if (o->spares > DH_CLIENT_MAX_SPARES)
        return dh_err_set(e, DH_EINVAL, "client: %u spares (at most %u)",
                          o->spares, DH_CLIENT_MAX_SPARES);
    if (o->server_log && strcmp(o->server_log, "debug") &&
        strcmp(o->server_log, "info") && strcmp(o->server_log, "warn") &&
        strcmp(o->server_log, "error"))
        return dh_err_set(e, DH_EINVAL,
                          "client: server_log '%s' is not debug, info, warn "
                          "or error",
                          o->server_log);

    if (dh_media_plan_check(&o->plan, e) < 0)
        return DH_EINVAL;
    if (dh_batch_frames(&o->plan) <= 0)
        return dh_err_set(e, DH_EINVAL,
                          "client: the plan has no frame "
                          "bound, so its samples cannot be batched");
    return 0;
}

static int copy_opts(struct dh_client *c, const struct dh_client_opts *o,
                     struct dh_err *e)
{
    snprintf(c->coord, sizeof(c->coord), "%s", o->coordinator);
    if (o->server_log)
        snprintf(c->env_log, sizeof(c->env_log), "DATAHELIX_LOG=%s",
                 o->server_log);
    c->rank = o->rank;
    c->world = o->world_size;
    c->ds_workers = o->ds_workers;
    c->prefetch = o->prefetch;
    c->mb = o->microbatches;
    c->plan = o->plan;
    c->timeout_ms = o->timeout_ms;
    c->start_timeout_ms = o->start_timeout_ms;
    c->max_restarts = o->max_restarts;
    dh_window_init(&c->win, DH_WINDOW_ALPHA);
    dh_window_assume(&c->win, o->step_ms_hint, o->step_deadline_ms);
    c->ddl_ms = o->ddl_ms;
    c->spares = o->spares;
    c->telemetry = o->telemetry;
    c->link_fd = -1;
    c->wake_fd = -1;
    c->child = -1;
    if (!(c->index_path = dh__strdup(o->index_path)) ||
        (o->dataserver && !(c->ds_name = dh__strdup(o->dataserver))) ||
        (o->datahelix_bin && !(c->bin = dh__strdup(o->datahelix_bin))) ||
        (o->ds_listen && !(c->ds_listen = dh__strdup(o->ds_listen))) ||
        (o->trace && !(c->trace_path = dh__strdup(o->trace))) ||
        (dh__keys_path(o->keyfile) &&
         !(c->keyfile = dh__strdup(dh__keys_path(o->keyfile)))))
        return dh_err_set(e, DH_ENOMEM, "out of memory");
    if (o->cache_dir && !(c->cache_dir = dh__strdup(o->cache_dir)))
        return dh_err_set(e, DH_ENOMEM, "out of memory");
    if (o->cache_bytes)
        snprintf(c->cache_bytes, sizeof(c->cache_bytes), "%llu",
                 (unsigned long long)o->cache_bytes);
    for (int i = 0; o->ds_args && o->ds_args[i]; i++) {
        if (i >= DH_CLIENT_MAX_DS_ARGS)
            return dh_err_set(e, DH_EINVAL,
                              "client: more than %d extra "
                              "dataserver arguments",
                              DH_CLIENT_MAX_DS_ARGS);
        if (!(c->ds_args[i] = dh__strdup(o->ds_args[i])))
            return dh_err_set(e, DH_ENOMEM, "out of memory");
    }
    if (o->plan.kind == DH_PLAN_INDICES && o->plan.frames > 0) {
        size_t n = (size_t)o->plan.frames;

        if (!(c->plan_indices = dh__malloc(n * sizeof(int64_t))))
            return dh_err_set(e, DH_ENOMEM, "out of memory");
        memcpy(c->plan_indices, o->plan.indices, n * sizeof(int64_t));
        c->plan.indices = c->plan_indices;
    }
    c->arena_bytes = o->arena_bytes;
    if (!c->arena_bytes && o->max_batch) {
        uint32_t part = (o->max_batch + c->mb - 1) / c->mb;
        size_t b = dh_batch_bytes(&c->plan, part);

        c->arena_bytes = b && b != SIZE_MAX
                             ? dh_arena_default_size((c->prefetch + o->held) *
                                                         c->mb,
                                                     b + DH_MEDIA_DST_PAD)
                             : 0;
        if (c->arena_bytes && c->arena_bytes < MIN_ARENA)
            c->arena_bytes = MIN_ARENA;
    }
    if (!c->arena_bytes)
        c->arena_bytes = DEFAULT_ARENA;
    if (c->spares && !(c->spare_buf = dh__malloc((size_t)c->spares * c->mb *
                                                 sizeof(*c->spare_buf))))
        return dh_err_set(e, DH_ENOMEM, "out of memory");
    return 0;
}

static int alloc_state(struct dh_client *c, struct dh_err *e)
{
    pthread_condattr_t ca;
    int rc;

    c->pool_n = (size_t)c->prefetch * c->mb;
    if (!(c->pool = dh__calloc(c->pool_n, sizeof(*c->pool))) ||
        !(c->sent = dh__calloc(c->pool_n, sizeof(*c->sent))) ||
        !(c->pend = dh__calloc(c->pool_n, sizeof(*c->pend))))
        return dh_err_set(e, DH_ENOMEM, "out of memory");
    if ((rc = dh_reorder_create(c->pool_n, &c->ro, e)) < 0)
        return rc;
    if ((c->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) < 0)
        return dh_err_set(e, DH_EIO, "client: eventfd: %s", strerror(errno));
    pthread_mutex_init(&c->mu, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&c->cv, &ca);
    pthread_condattr_destroy(&ca);
    return 0;
}

/* Sends RegisterClient and waits (bounded) for its echo. */
static int do_register(struct dh_client *c, struct dh_err *e)
{
    struct dh_tp_opts o = {.kind = DH_TP_CLIENT_CTL,
                           .addr = c->coord,
                           .who = "client",
                           .peer = "coordinator"};
    struct dh_wire_msg m;
    char peer[DH_WIRE_MAX_ADDR + 16];
    uint64_t end = dh__mono_ms() + (uint64_t)c->start_timeout_ms, t;
    int rc;

    if ((rc = dh__tp_auth_init(&c->auth, c->keyfile, "client", e)) < 0)
        return rc;
    o.auth = rc ? &c->auth : NULL;
    if (!(c->ctx = zmq_ctx_new()))
        return dh_err_set(e, DH_EIO, "client: zmq: %s",
                          zmq_strerror(zmq_errno()));
    if ((rc = dh__tp_open(c->ctx, &o, &c->sock, NULL, 0, e)) < 0)
        return rc;
    snprintf(peer, sizeof(peer), "coordinator %s", c->coord);
    if ((rc = dh__cl_send_register(c, peer, e)) < 0)
        return rc;
    while ((t = dh__mono_ms()) < end) {
        struct dh_err de;

        if (dh__tp_wait(c->sock, (long)(end - t), &de) <= 0 ||
            dh__tp_recv(c->sock, NULL, &m, peer, &de) <= 0)
            continue;
        if (m.type == DH_WIRE_REGISTER_CLIENT &&
            m.u.register_client.rank == c->rank) {
            c->incarnation = m.u.register_client.incarnation;
            rc = 1;
        } else if (m.type == DH_WIRE_SHUTDOWN)
            rc = dh_err_set(e, DH_EIO, "coordinator %s refused rank %u: %s",
                            c->coord, c->rank, m.u.shutdown.reason);
        else
            rc = 0;
        dh_wire_msg_fini(&m);
        if (rc != 0)
            return rc < 0 ? rc : 0;
    }
    return dh_err_set(e, DH_ETIMEOUT,
                      "coordinator %s did not answer within "
                      "%d ms%s%s%s",
                      c->coord, c->start_timeout_ms,
                      c->keyfile ? " (is it running with the key of " : "",
                      c->keyfile ? c->keyfile : "",
                      c->keyfile ? "? a Coordinator refuses other keys)" : "");
}

/* Frees everything; the last reference does it. */
static void client_free(struct dh_client *c)
{
    int n = atomic_load(&c->n_arenas);

    for (int i = 0; i < n; i++)
        dh_arena_destroy(c->arenas[i].a);
    if (c->wake_fd >= 0) {
        close(c->wake_fd);
        pthread_mutex_destroy(&c->mu);
        pthread_cond_destroy(&c->cv);
    }
    dh_reorder_destroy(c->ro);
    dh__prefetch_destroy(c->ahead); /* before the index it reads */
    dh__free(c->cache_dir);
    dh_index_close(c->ix);
    dh__free(c->pool);
    dh__free(c->sent);
    dh__free(c->pend);
    dh__free(c->ids);
    dh__free(c->offs);
    dh__free(c->waits);
    dh__free(c->windows);
    dh__free(c->quar);
    dh__free(c->spare_buf);
    dh__free(c->plan_indices);
    dh__free(c->index_path);
    dh__free(c->ds_name);
    dh__free(c->bin);
    dh__free(c->ds_listen);
    dh__free(c->keyfile);
    dh__free(c->trace_path);
    for (int i = 0; c->ds_args[i]; i++)
        dh__free(c->ds_args[i]);
    dh__free(c);
}

static void unref(struct dh_client *c)
{
    if (atomic_fetch_sub(&c->refs, 1) == 1)
        client_free(c);
}

int dh__cl_slot_held(const struct dh_client *c, int arena,
                     const struct dh_slot_ref *ref)
{
    for (size_t i = 0; i < c->pool_n; i++) {
        const struct cl_result *r = &c->pool[i];

        if (r->used && !r->is_error && r->arena == arena &&
            r->ref.offset == ref->offset && r->ref.gen == ref->gen)
            return 1;
    }
    for (const struct cl_batch *b = c->batches; b; b = b->next)
        for (uint32_t j = 0; j < b->pub.n_parts; j++)
            if (b->arena[j] == arena && b->ref[j].offset == ref->offset &&
                b->ref[j].gen == ref->gen)
                return 1;
    return 0;
}

/* Gives back the slots of every pooled outcome and empties the pool
 * (mu held, or no other thread). */
static void drop_pool(struct dh_client *c)
{
    struct dh_err e;

    for (size_t i = 0; c->pool && i < c->pool_n; i++) {
        struct cl_result *r = &c->pool[i];

        if (!r->used)
            continue;
        if (!r->is_error &&
            dh_arena_release(c->arenas[r->arena].a, &r->ref, &e) < 0)
            dh__log(DH_LOG_ERROR, "client %u: %s", c->rank, e.msg);
        dh__cl_result_free(r);
    }
}

void dh_client_destroy(struct dh_client *c)
{
    char why[128];

    if (!c)
        return;
    if (c->io_started) {
        atomic_store(&c->stop, 1);
        dh__cl_wake(c);
        pthread_join(c->io, NULL);
    }
    if (c->link_fd >= 0) { /* the server sees EOF and stops */
        close(c->link_fd);
        c->link_fd = -1;
    }
    dh__cl_reap(c, 2000, why, sizeof(why));
    dh__tp_close(&c->sock, 0);
    dh__tp_auth_fini(&c->auth);
    if (c->ctx)
        zmq_ctx_term(c->ctx);
    c->ctx = NULL;
    drop_pool(c);
    dh__cl_trace_close(c); /* the file is written here, off the loop */
    unref(c);
}

/* A client with its options, state and index, and no link yet: what
 * dh_client_create() and the fuzzer's detached client share. */
static int client_new(const struct dh_client_opts *o, struct dh_client **out,
                      struct dh_err *e)
{
    struct dh_client *c;
    int rc;

    *out = NULL;
    if ((rc = check_opts(o, e)) < 0)
        return rc;
    if (!(c = dh__calloc(1, sizeof(*c))))
        return dh_err_set(e, DH_ENOMEM, "out of memory");
    atomic_store(&c->refs, 1);
    if ((rc = copy_opts(c, o, e)) < 0 || (rc = alloc_state(c, e)) < 0 ||
        (rc = dh_index_open(c->index_path, 0, &c->ix, e)) < 0) {
        dh_client_destroy(c);
        return rc;
    }
    *out = c;
    return 0;
}

int dh_client_create(const struct dh_client_opts *o, struct dh_client **out,
                     struct dh_err *e)
{
    struct dh_client *c;
    int rc;

    if ((rc = client_new(o, &c, e)) < 0)
        return rc;
    if (c->trace_path && (rc = dh__cl_trace_open(c, e)) < 0)
        goto fail;
    if (c->cache_dir &&
        (rc = dh__prefetch_create(c->ix,
                                  dh__cache_open(c->cache_dir, o->cache_bytes),
                                  &c->ahead, e)) < 0)
        goto fail;
    /* Embedded: the client draws the rank's token, registers with it and
     * hands it to the server it starts.  External: the server drew it and
     * says it in its hello, so the client attaches first. */
    if (c->ds_name)
        rc = dh__cl_attach_server(c, e);
    else if ((rc = dh__link_token_new(c->token, e)) == 0 &&
             (rc = do_register(c, e)) == 0)
        rc = dh__cl_start_server(c, c->rank + 1, e);
    if (rc == 0 && c->ds_name)
        rc = do_register(c, e);
    if (rc < 0)
        goto fail;
    if (pthread_create(&c->io, NULL, dh__cl_io_main, c) != 0) {
        rc = dh_err_set(e, DH_EIO, "client: cannot start its I/O thread");
        goto fail;
    }
    c->io_started = 1;
    *out = c;
    return 0;
fail:
    dh_client_destroy(c);
    return rc;
}

int dh__cl_create_detached(const struct dh_client_opts *o,
                           struct dh_client **out, struct dh_err *e)
{
    return client_new(o, out, e);
}

/* ---- epochs and passes ---- */

static int check_schedule(const struct dh_client *c, uint64_t first_step,
                          uint64_t n_steps, const uint64_t *ids,
                          const uint64_t *offs, struct dh_err *e)
{
    if (first_step > DH_WIRE_MAX_STEPS || n_steps > DH_WIRE_MAX_STEPS ||
        first_step + n_steps > DH_WIRE_MAX_STEPS)
        return dh_err_set(e, DH_ETOOBIG,
                          "client: steps %llu..%llu beyond "
                          "the task id's range (%u steps an epoch)",
                          (unsigned long long)first_step,
                          (unsigned long long)(first_step + n_steps),
                          DH_WIRE_MAX_STEPS);
    if (n_steps && (!ids || !offs))
        return dh_err_set(e, DH_EINVAL, "client: no schedule given");
    for (uint64_t k = 0; k < n_steps; k++) {
        uint64_t n = offs[k + 1] - offs[k];

        if (offs[k + 1] < offs[k] || n < c->mb || n > DH_WIRE_MAX_SAMPLES)
            return dh_err_set(e, DH_EINVAL,
                              "client: step %llu has %lld "
                              "samples (want %u..%u)",
                              (unsigned long long)(first_step + k),
                              (long long)(offs[k + 1] - offs[k]), c->mb,
                              DH_WIRE_MAX_SAMPLES);
    }
    return 0;
}

/* A pass is new (>= pass_next) or the current one continued with later
 * steps of its epoch; never a reused one (client.h).  Consumer thread: the
 * fields read here are written only by start_pass on that thread. */
static int check_pass(const struct dh_client *c, uint64_t epoch, uint64_t pass,
                      uint64_t first_step, struct dh_err *e)
{
    if (epoch > UINT32_MAX)
        return dh_err_set(e, DH_ETOOBIG,
                          "client: epoch %llu beyond "
                          "UINT32_MAX",
                          (unsigned long long)epoch);
    if (pass >= DH_WIRE_MAX_PASSES)
        return dh_err_set(e, DH_ETOOBIG,
                          "client: pass %llu: a rank starts "
                          "at most %u passes (iterations, re-plans, "
                          "resumes) in a job, after which task ids would "
                          "repeat",
                          (unsigned long long)pass, DH_WIRE_MAX_PASSES);
    if (c->pass_next && pass == c->pass) {
        if (epoch != c->epoch || first_step < c->first_step + c->n_steps)
            return dh_err_set(e, DH_EINVAL,
                              "client: pass %llu continued "
                              "with epoch %llu steps %llu.., but it is epoch "
                              "%u and was given steps up to %llu",
                              (unsigned long long)pass,
                              (unsigned long long)epoch,
                              (unsigned long long)first_step, c->epoch,
                              (unsigned long long)(c->first_step + c->n_steps));
        return 0;
    }
    if (pass < c->pass_next)
        return dh_err_set(e, DH_EINVAL,
                          "client: pass %llu was started "
                          "before (the next new pass is %llu): a reused "
                          "pass would give two schedules one task id",
                          (unsigned long long)pass,
                          (unsigned long long)c->pass_next);
    return 0;
}

int dh_client_start_epoch(struct dh_client *c, uint32_t epoch,
                          uint64_t first_step, uint64_t n_steps,
                          const uint64_t *ids, const uint64_t *offsets,
                          struct dh_err *e)
{
    return dh_client_start_pass(c, epoch, c->pass_next, first_step, n_steps,
                                ids, offsets, e);
}

int dh_client_start_pass(struct dh_client *c, uint64_t epoch, uint64_t pass,
                         uint64_t first_step, uint64_t n_steps,
                         const uint64_t *ids, const uint64_t *offsets,
                         struct dh_err *e)
{
    uint64_t *nid = NULL, *noff = NULL, total, base;
    struct dh_reorder *ro = NULL;
    int rc;

    if ((rc = check_pass(c, epoch, pass, first_step, e)) < 0 ||
        (rc = check_schedule(c, first_step, n_steps, ids, offsets, e)) < 0)
        return rc;
    base = n_steps ? offsets[0] : 0;
    total = n_steps ? offsets[n_steps] - base : 0;
    if (!(noff = dh__malloc((n_steps + 1) * sizeof(*noff))) ||
        !(nid = dh__malloc((total + 1) * sizeof(*nid)))) {
        rc = dh_err_set(e, DH_ENOMEM, "out of memory");
        goto fail;
    }
    for (uint64_t k = 0; k <= n_steps; k++)
        noff[k] = n_steps ? offsets[k] - base : 0;
    if (total)
        memcpy(nid, ids + base, total * sizeof(*nid));
    if ((rc = dh_reorder_create(c->pool_n, &ro, e)) < 0)
        goto fail;
    pthread_mutex_lock(&c->mu);
    drop_pool(c); /* outcomes of the abandoned steps */
    c->n_taken = 0;
    c->step_t_call = 0;
    dh_reorder_destroy(c->ro);
    c->ro = ro;
    dh__free(c->ids);
    dh__free(c->offs);
    c->ids = nid;
    c->offs = noff;
    c->epoch = (uint32_t)epoch;
    c->pass = (uint32_t)pass;
    c->pass_next = pass + 1;
    c->first_step = first_step;
    c->n_steps = n_steps;
    c->next_issue = c->next_consume = 0;
    memset(c->sent, 0, c->pool_n * sizeof(*c->sent));
    pthread_mutex_unlock(&c->mu);
    dh__cl_wake(c);
    return 0;
fail:
    dh__free(nid);
    dh__free(noff);
    return rc;
}

/* ---- next ---- */

static int push_meas(struct dh_client *c, double wait, double window)
{
    if (c->n_meas == c->cap_meas) {
        size_t cap = c->cap_meas ? 2 * c->cap_meas : 1024;
        double *w = dh__realloc(c->waits, cap * sizeof(*w));

        if (!w)
            return -1;
        c->waits = w;
        if (!(w = dh__realloc(c->windows, cap * sizeof(*w))))
            return -1;
        c->windows = w;
        c->cap_meas = cap;
    }
    c->waits[c->n_meas] = wait;
    c->windows[c->n_meas++] = window;
    return 0;
}

static void quarantine_add(struct dh_client *c, uint64_t id)
{
    for (size_t i = 0; i < c->n_quar; i++)
        if (c->quar[i] == id)
            return;
    if (c->n_quar == c->cap_quar) {
        size_t cap = c->cap_quar ? 2 * c->cap_quar : 64;
        uint64_t *q = dh__realloc(c->quar, cap * sizeof(*q));

        if (!q)
            return;
        c->quar = q;
        c->cap_quar = cap;
    }
    c->quar[c->n_quar++] = id;
    c->st.quarantined = c->n_quar;
}

/* Slot bytes of arena i in the pool: results not consumed yet (mu). */
static uint64_t pooled_bytes(const struct dh_client *c, int i)
{
    uint64_t n = 0;

    for (size_t k = 0; k < c->pool_n; k++) {
        const struct cl_result *r = &c->pool[k];

        if (r->used && !r->is_error && r->arena == i)
            n += r->ref.len;
    }
    return n;
}

/*
 * The consumer holds the arena up (mu held): a server waits for room in
 * an arena whose every live byte is a batch this client has not released
 * or a result waiting in its pool -- no batch can come before the
 * consumer releases one, so waiting out the server's allocation timeout
 * would only delay the same answer.  DH_EARENA naming what is held, the
 * step left next; 0 otherwise.
 */
static int arena_held_up(struct dh_client *c, struct dh_err *e)
{
    int n = atomic_load(&c->n_arenas);

    for (int i = 0; i < n; i++) {
        struct cl_arena *a = &c->arenas[i];
        struct dh_arena_stats st;
        uint64_t held = atomic_load(&a->held_bytes);
        uint32_t parts = atomic_load(&a->held);

        if (dh_arena_stats(a->a, &st) < 0 || st.waiting == 0 || parts == 0 ||
            st.live_bytes > held + pooled_bytes(c, i))
            continue;
        c->last_fail = (struct dh_client_failure){
            .epoch = c->epoch,
            .step = c->first_step + c->next_consume,
            .sample_id = DH_CLIENT_NO_SAMPLE,
            .cause = DH_EARENA,
            .stage = DH_STAGE_ARENA,
            .server_id = a->server_id};
        snprintf(c->last_fail.message, sizeof(c->last_fail.message),
                 "arena exhausted: %u batch part%s (%.1f MiB) still held by "
                 "the consumer, the arena holds %.1f MiB: release batches "
                 "(keep copies of what you keep) or give a bigger arena",
                 parts, parts == 1 ? "" : "s", (double)held / (1 << 20),
                 (double)st.capacity / (1 << 20));
        c->has_fail = 1;
        return dh_err_set(
            e, DH_EARENA, "rank %u epoch %u step %llu: %s", c->rank, c->epoch,
            (unsigned long long)c->last_fail.step, c->last_fail.message);
    }
    return 0;
}

/* How often a wait for the next outcome looks at the arenas. */
#define HELD_UP_CHECK_MS 100

/* Waits (mu held) until the reorder buffer yields the next outcome;
 * its pool index into *idx.  0, DH_ETIMEOUT, DH_EARENA (held up by the
 * consumer) or the fatal code. */
static int take_one(struct dh_client *c, const struct timespec *deadline,
                    size_t *idx, struct dh_err *e)
{
    for (;;) {
        struct timespec check;
        uint64_t tid, payload;
        int rc;

        if (c->fatal)
            return dh_err_set(e, c->fatal_e.code, "%s", c->fatal_e.msg);
        rc = dh_reorder_next(c->ro, &tid, &payload);
        if (rc == 0) {
            *idx = (size_t)payload;
            return 0;
        }
        if (rc != DH_EEMPTY)
            return dh_err_set(e, rc, "rank %u: task %llu failed", c->rank,
                              (unsigned long long)tid);
        if ((rc = arena_held_up(c, e)) < 0)
            return rc;
        dh__mono_deadline(&check, HELD_UP_CHECK_MS);
        if (dh__ts_before(deadline, &check))
            check = *deadline;
        if (pthread_cond_timedwait(&c->cv, &c->mu, &check) == ETIMEDOUT &&
            !dh__ts_before(&check, deadline))
            return DH_ETIMEOUT;
    }
}

/* The server that prepared a part: the one the Coordinator routed it to,
 * or, unrouted, the server whose arena holds it. */
static uint32_t part_server(const struct dh_client *c, const struct cl_sent *s,
                            const struct cl_result *r)
{
    return s->route_server ? s->route_server : c->arenas[r->arena].server_id;
}

/* A part prepared on a server other than the one whose arena holds it
 * crossed between DataServers. */
static int part_crossed(const struct dh_client *c, const struct cl_sent *s,
                        const struct cl_result *r)
{
    return part_server(c, s, r) != c->arenas[r->arena].server_id;
}

/* Adds the read stage of part r's samples to *ms and *bytes: how many
 * samples had stage rows (a server may send none). */
static uint32_t part_reads(const struct cl_result *r, double *ms,
                           uint64_t *bytes)
{
    uint32_t n = 0;

    for (; r->st.rows && n < r->n; n++) {
        *ms += r->st.rows[n * DH_MS_COUNT + DH_MS_READ];
        *bytes += r->st.bytes ? r->st.bytes[n] : 0;
    }
    return n;
}

static void telemetry_line(struct dh_client *c, uint64_t k, double wait,
                           double window, const size_t *idx)
{
    uint64_t ready = 0;
    int64_t slack = 0;
    uint64_t cross = 0, samples = 0, rbytes = 0;
    double rms = 0;
    char servers[256], late[160], sample[24];
    size_t off = 0;

    if (!c->telemetry)
        return;
    servers[0] = late[0] = 0;
    /* a missed step's cause (client_trace.c found it just before) */
    if (dh_window_is_miss(wait, c->ddl_ms) && c->n_late) {
        const struct dh_client_late *l =
            &c->late[(c->late_head + DH_CLIENT_MAX_LATE - 1) %
                     DH_CLIENT_MAX_LATE];

        if (l->sample_id != DH_CLIENT_NO_SAMPLE)
            snprintf(sample, sizeof(sample), "%llu",
                     (unsigned long long)l->sample_id);
        else
            snprintf(sample, sizeof(sample), "null");
        snprintf(late, sizeof(late),
                 ",\"late\":{\"stage\":\"%s\",\"stage_ms\":%.3f,"
                 "\"sample\":%s,\"server\":%u}",
                 l->stage, l->stage_ms, sample, l->server_id);
    }
    for (uint32_t j = 0; j < c->mb; j++) {
        const struct cl_sent *s = &c->sent[(k % c->prefetch) * c->mb + j];
        const struct cl_result *r = &c->pool[idx[j]];

        if (r->arrived_ms > s->sent_ms && r->arrived_ms - s->sent_ms > ready)
            ready = r->arrived_ms - s->sent_ms;
        slack = s->slack_ms;
        samples += r->n;
        part_reads(r, &rms, &rbytes);
        if (part_crossed(c, s, r))
            cross += r->ref.len;
        if (off < sizeof(servers) - 16)
            off += (size_t)snprintf(servers + off, sizeof(servers) - off,
                                    "%s%u", j ? "," : "", s->route_server);
    }
    fprintf(c->telemetry,
            "{\"rank\":%u,\"epoch\":%u,\"step\":%llu,\"input_wait_ms\":%.3f,"
            "\"window_ms\":%.3f,\"deadline_ms\":%lld,\"miss\":%s,"
            "\"ready_latency_ms\":%llu,\"samples\":%llu,\"servers\":[%s],"
            "\"cross_ds_bytes\":%llu,\"read_ms\":%.3f,\"read_bytes\":%llu%s}\n",
            c->rank, c->epoch, (unsigned long long)(c->first_step + k), wait,
            window, (long long)slack,
            dh_window_is_miss(wait, c->ddl_ms) ? "true" : "false",
            (unsigned long long)ready, (unsigned long long)samples, servers,
            (unsigned long long)cross, rms, (unsigned long long)rbytes, late);
    {
        char who[32];

        snprintf(who, sizeof(who), "client %u", c->rank);
        dh__log_flush(c->telemetry, &c->tel_failed, who, "telemetry");
    }
}

/* Bytes moved and the server each part came from (mu held). */
static void count_load(struct dh_client *c, const size_t *idx)
{
    uint64_t k = c->next_consume;

    for (uint32_t j = 0; j < c->mb; j++) {
        const struct cl_sent *s = &c->sent[(k % c->prefetch) * c->mb + j];
        const struct cl_result *r = &c->pool[idx[j]];
        uint32_t who = part_server(c, s, r);
        size_t i;

        c->st.batch_bytes += r->ref.len;
        c->st.read_samples += part_reads(r, &c->st.read_ms, &c->st.read_bytes);
        if (part_crossed(c, s, r))
            c->st.cross_ds_bytes += r->ref.len;
        for (i = 0; i < c->n_load && c->load[i].id != who; i++)
            ;
        if (i == c->n_load && c->n_load < CL_MAX_LOAD)
            c->load[c->n_load++].id = who;
        if (i < c->n_load)
            c->load[i].parts++;
    }
}

/* ---- typed failures ---- */

enum dh_stage dh__stage_of(int cause)
{
    switch (cause) {
    case DH_EIO:
    case DH_ENOTFOUND:
        return DH_STAGE_READ;
    case DH_EMEDIA:
    case DH_EFORMAT:
    case DH_EUNSUPPORTED:
        return DH_STAGE_DECODE;
    case DH_ETIMEOUT:
        return DH_STAGE_WATCHDOG;
    case DH_ETOOBIG:
        return DH_STAGE_LIMIT;
    case DH_EARENA:
        return DH_STAGE_ARENA;
    case DH_ENOMEM:
        return DH_STAGE_MEMORY;
    case DH_EPROTO:
    case DH_EPEERDEAD:
        return DH_STAGE_TRANSFER;
    default:
        return DH_STAGE_PREPARE;
    }
}

const char *dh_stage_name(enum dh_stage s)
{
    static const char *const names[] = {
        [DH_STAGE_PREPARE] = "prepare", [DH_STAGE_READ] = "read",
        [DH_STAGE_DECODE] = "decode",   [DH_STAGE_WATCHDOG] = "watchdog",
        [DH_STAGE_LIMIT] = "limit",     [DH_STAGE_ARENA] = "arena",
        [DH_STAGE_MEMORY] = "memory",   [DH_STAGE_TRANSFER] = "transfer"};

    if ((unsigned)s >= sizeof(names) / sizeof(names[0]))
        return "prepare";
    return names[s];
}

/* Keeps the failure of step position k for dh_client_failure (mu held);
 * without the server's fields (out of memory for them) the sample alone. */
static void record_failure(struct dh_client *c, const struct cl_result *bad,
                           uint64_t k)
{
    struct dh_client_failure *f = &c->last_fail;

    if (bad->fail)
        *f = *bad->fail;
    else
        *f = (struct dh_client_failure){.sample_id = bad->sample_id,
                                        .cause = bad->code,
                                        .stage = dh__stage_of(bad->code)};
    f->epoch = c->epoch;
    f->step = c->first_step + k;
    f->consumed = 1;
    c->has_fail = 1;
}

int dh_client_failure(struct dh_client *c, struct dh_client_failure *out)
{
    int rc = DH_ENOTFOUND;

    pthread_mutex_lock(&c->mu);
    if (c->has_fail) {
        *out = c->last_fail;
        rc = 0;
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

/* Part r's substitutions into the batch's list at subs[ns..), positions
 * offset by `at` (the part's first sample); the failed ids join the
 * quarantine when their cause blames them.  Returns the new count (mu
 * held). */
static uint32_t take_subs(struct dh_client *c, const struct cl_result *r,
                          uint32_t at, struct dh_client_subst *subs,
                          uint32_t ns)
{
    for (uint32_t i = 0; i < r->n_subs; i++) {
        subs[ns] = r->subs[i];
        subs[ns].position += at;
        if (dh__err_blames_sample(subs[ns].cause))
            quarantine_add(c, subs[ns].failed_id);
        c->st.substituted++;
        ns++;
    }
    return ns;
}

/* The step's parts are all in (mu held): builds the batch or the error,
 * empties the pool entries. */
static int finish_step(struct dh_client *c, const size_t *idx, double wait,
                       double window, struct dh_client_batch **out,
                       struct dh_err *e)
{
    uint64_t k = c->next_consume, total = 0, n_subs = 0;
    const struct cl_result *bad = NULL;
    struct cl_batch *b = NULL;
    int rc = 0;

    for (uint32_t j = 0; j < c->mb; j++) {
        const struct cl_result *r = &c->pool[idx[j]];

        if (r->is_error && !bad)
            bad = r;
        total += r->n;
        n_subs += r->is_error ? 0 : r->n_subs;
    }
    telemetry_line(c, k, wait, window, idx);
    if (!bad) {
        size_t sz = sizeof(*b) + c->mb * sizeof(struct dh_client_part) +
                    n_subs * sizeof(struct dh_client_subst) +
                    total *
                        (sizeof(uint64_t) + sizeof(uint32_t) + sizeof(float));

        if (!(b = dh__calloc(1, sz)))
            bad = NULL, rc = dh_err_set(e, DH_ENOMEM, "out of memory");
    }
    if (bad) {
        /* The kind, not the server's cause, is the code: a caller must
         * tell a consumed step from a wait that ran out (DH_ETIMEOUT is
         * also a watchdog's cause). */
        rc = dh_err_set(e, bad->code == DH_EARENA ? DH_EARENA : DH_ESAMPLE,
                        "rank %u epoch %u step %llu: %s", c->rank, c->epoch,
                        (unsigned long long)(c->first_step + k), bad->msg);
        record_failure(c, bad, k);
        /* Only a sample's own failure: resource errors (a full arena or
         * queue, memory) say nothing about the sample they name. */
        if (dh__err_blames_sample(bad->code))
            quarantine_add(c, bad->sample_id);
        c->st.errors++;
    }
    if (b) {
        struct dh_client_part *parts = (struct dh_client_part *)(b + 1);
        struct dh_client_subst *subs = (struct dh_client_subst *)(parts +
                                                                  c->mb);
        uint64_t *ids = (uint64_t *)(subs + n_subs);
        uint32_t *valid = (uint32_t *)(ids + total);
        float *ms = (float *)(valid + total);
        uint64_t at = 0;
        uint32_t ns = 0;

        b->c = c;
        b->pub = (struct dh_client_batch){.epoch = c->epoch,
                                          .step = c->first_step + k,
                                          .n_parts = c->mb,
                                          .parts = parts,
                                          .n_samples = (uint32_t)total,
                                          .sample_ids = ids,
                                          .valid_frames = valid,
                                          .input_wait_ms = wait,
                                          .n_subs = (uint32_t)n_subs,
                                          .subs = n_subs ? subs : NULL,
                                          .sample_ms = ms};
        for (uint32_t j = 0; j < c->mb; j++) {
            struct cl_result *r = &c->pool[idx[j]];
            struct cl_arena *a = &c->arenas[r->arena];

            parts[j] = (struct dh_client_part){
                .data = dh_arena_ptr(a->a, &r->ref),
                .len = r->ref.len,
                .ndims = r->ndims,
                .dtype = r->dtype,
                .layout = r->layout,
                .n_samples = r->n,
                .server_id = a->server_id};
            memcpy(parts[j].dims, r->dims, sizeof(parts[j].dims));
            memcpy(ids + at, r->ids, r->n * sizeof(*ids));
            memcpy(valid + at, r->valid, r->n * sizeof(*valid));
            for (uint32_t i = 0; i < r->n; i++)
                ms[at + i] = r->st.rows
                                 ? sample_ms(r->st.rows + i * DH_MS_COUNT)
                                 : -1.0f;
            ns = take_subs(c, r, (uint32_t)at, subs, ns);
            at += r->n;
            b->arena[j] = r->arena;
            b->ref[j] = r->ref;
            atomic_fetch_add(&a->held_bytes, r->ref.len);
            atomic_fetch_add(&a->held, 1);
            r->is_error = 1; /* the batch owns the slot now */
        }
        b->next = c->batches;
        if (b->next)
            b->next->prev = b;
        c->batches = b;
        atomic_fetch_add(&c->refs, 1);
        c->st.steps++;
        count_load(c, idx);
        *out = &b->pub;
    }
    for (uint32_t j = 0; j < c->mb; j++) {
        struct cl_result *r = &c->pool[idx[j]];
        struct dh_err re;

        if (!r->is_error &&
            dh_arena_release(c->arenas[r->arena].a, &r->ref, &re) < 0)
            dh__log(DH_LOG_ERROR, "client %u: %s", c->rank, re.msg);
        dh__cl_result_free(r);
    }
    return rc;
}

int dh_client_next(struct dh_client *c, struct dh_client_batch **out,
                   struct dh_err *e)
{
    return dh_client_next_for(c, c->timeout_ms, out, e);
}

int dh_client_next_for(struct dh_client *c, int timeout_ms,
                       struct dh_client_batch **out, struct dh_err *e)
{
    double t_call = dh__mono_msf(), wait, window;
    size_t *idx = c->taken;
    struct timespec deadline;
    int rc = 0;

    *out = NULL;
    dh__mono_deadline(&deadline, timeout_ms > 0 ? timeout_ms : 0);
    pthread_mutex_lock(&c->mu);
    /* A step's wait runs from the first call that asked for it, across
     * calls that timed out; its window ends there. */
    if (c->step_t_call == 0) {
        c->step_t_call = t_call;
        c->step_window = c->last_return_us
                             ? t_call - (double)c->last_return_us / 1e3
                             : 0;
    }
    t_call = c->step_t_call;
    window = c->step_window;
    if (!c->t0_ms)
        c->t0_ms = dh__mono_ms();
    if (c->fatal) {
        rc = dh_err_set(e, c->fatal_e.code, "%s", c->fatal_e.msg);
        goto out;
    }
    if (!c->ids || c->next_consume >= c->n_steps) {
        rc = dh_err_set(e, DH_EEMPTY, "rank %u: epoch %u is done", c->rank,
                        c->epoch);
        goto out;
    }
    /* Parts taken by an earlier call that timed out come first: a reorder
     * buffer only moves forward, so they wait in c->taken. */
    while (c->n_taken < c->mb) {
        if ((rc = take_one(c, &deadline, &idx[c->n_taken], e)) == DH_ETIMEOUT) {
            rc = dh_err_set(
                e, DH_ETIMEOUT,
                "rank %u: no batch for epoch %u "
                "step %llu after %.0f ms (coordinator %s)",
                c->rank, c->epoch,
                (unsigned long long)(c->first_step + c->next_consume),
                dh__mono_msf() - c->step_t_call, c->coord);
            break;
        }
        if (rc < 0)
            goto out;
        c->n_taken++;
    }
    if (c->n_taken < c->mb)
        goto out;
    c->n_taken = 0;
    c->step_t_call = 0;
    wait = dh__mono_msf() - t_call;
    dh__cl_trace_step(c, c->next_consume, t_call, wait, window, idx);
    dh__log(DH_LOG_DEBUG, "client %u: epoch %u step %llu in, waited %.2f ms",
            c->rank, c->epoch,
            (unsigned long long)(c->first_step + c->next_consume), wait);
    rc = finish_step(c, idx, wait, window, out, e);
    if (push_meas(c, wait, window) < 0) {
        /* out of memory for statistics only: the batch is still good */
    }
    if (dh_window_is_miss(wait, c->ddl_ms))
        c->st.misses++;
    c->last_wait_ms = wait;
    if (window > 0) /* the first step has no window before it */
        dh_window_update(&c->win, window + wait);
    c->next_consume++;
out:
    pthread_mutex_unlock(&c->mu);
    c->last_return_us = (uint64_t)(dh__mono_msf() * 1e3);
    dh__cl_wake(c);
    return rc;
}

/* ---- batches, statistics ---- */

void dh_client_batch_release(struct dh_client_batch *pub)
{
    struct cl_batch *b = (struct cl_batch *)pub;
    struct dh_client *c;
    struct dh_err e;

    if (!b)
        return;
    c = b->c;
    pthread_mutex_lock(&c->mu);
    if (b->prev)
        b->prev->next = b->next;
    else
        c->batches = b->next;
    if (b->next)
        b->next->prev = b->prev;
    pthread_mutex_unlock(&c->mu);
    for (uint32_t j = 0; j < pub->n_parts; j++) {
        struct cl_arena *a = &c->arenas[b->arena[j]];

        if (dh_arena_release(a->a, &b->ref[j], &e) < 0)
            dh__log(DH_LOG_ERROR, "client %u: releasing step %llu: %s", c->rank,
                    (unsigned long long)pub->step, e.msg);
        atomic_fetch_sub(&a->held_bytes, b->ref[j].len);
        atomic_fetch_sub(&a->held, 1);
    }
    dh__free(b);
    unref(c);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;

    return (x > y) - (x < y);
}

/* Nearest-rank percentile of v[0..n) (sorted in place). */
static double pct(double *v, size_t n, double p)
{
    size_t i;

    if (!n)
        return 0;
    qsort(v, n, sizeof(*v), cmp_double);
    i = (size_t)(p / 100.0 * (double)n + 0.999999);
    return v[i ? (i > n ? n - 1 : i - 1) : 0];
}

void dh_client_stats(struct dh_client *c, struct dh_client_stats *out)
{
    double *tmp;
    size_t n;

    pthread_mutex_lock(&c->mu);
    *out = c->st;
    n = c->n_meas;
    if (c->t0_ms)
        out->elapsed_s = (double)(dh__mono_ms() - c->t0_ms) / 1e3;
    for (int i = 0; i < atomic_load(&c->n_arenas); i++) {
        struct dh_arena_stats as;

        if (dh_arena_stats(c->arenas[i].a, &as) == 0)
            out->arena_bytes += as.capacity;
        out->held_bytes += atomic_load(&c->arenas[i].held_bytes);
    }
    if (n && (tmp = dh__malloc(n * sizeof(*tmp)))) {
        memcpy(tmp, c->waits, n * sizeof(*tmp));
        out->input_wait_p50_ms = pct(tmp, n, 50);
        out->input_wait_p95_ms = pct(tmp, n, 95);
        out->input_wait_max_ms = tmp[n - 1];
        memcpy(tmp, c->windows, n * sizeof(*tmp));
        out->window_p50_ms = pct(tmp, n, 50);
        dh__free(tmp);
    }
    pthread_mutex_unlock(&c->mu);
}

uint64_t dh_client_errors(struct dh_client *c)
{
    uint64_t n;

    pthread_mutex_lock(&c->mu);
    n = c->st.errors;
    pthread_mutex_unlock(&c->mu);
    return n;
}

size_t dh_client_server_load(struct dh_client *c, uint32_t *ids,
                             uint64_t *parts, size_t cap)
{
    size_t n;

    pthread_mutex_lock(&c->mu);
    n = c->n_load;
    for (size_t i = 0; i < n && i < cap; i++) {
        if (ids)
            ids[i] = c->load[i].id;
        if (parts)
            parts[i] = c->load[i].parts;
    }
    pthread_mutex_unlock(&c->mu);
    return n;
}

size_t dh_client_quarantine(struct dh_client *c, uint64_t *out, size_t cap)
{
    size_t n;

    pthread_mutex_lock(&c->mu);
    n = c->n_quar;
    if (out)
        memcpy(out, c->quar, (cap < n ? cap : n) * sizeof(*out));
    pthread_mutex_unlock(&c->mu);
    return n;
}
