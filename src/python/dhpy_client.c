/*
 * dhpy_client.c - datahelix._C.Client (include/datahelix/client.h), Batch
 * (one consumed step) and Part (one microbatch's tensor bytes, exported
 * with the buffer protocol so torch.frombuffer() wraps the arena memory
 * without a copy).
 *
 * Ownership: a Part holds its Batch; the Batch holds the C batch, whose
 * arena slots go back when the Batch is freed - that is, when the last
 * tensor made from any of its parts dies (DESIGN 8 "Arena lifetime").
 * The C client outlives the Python Client until its batches are gone.
 *
 * Locking: the GIL, released around next() (in 100 ms slices, checking for
 * signals between them), create and close.  `busy` refuses a second
 * concurrent next() on one Client.
 */
#include "python/dhpy.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

#include "datahelix/client.h"

#define SLICE_MS 100

/* ---- Batch and Part ---- */

typedef struct {
    PyObject_HEAD struct dh_client_batch *b;
} BatchObject;

typedef struct {
    PyObject_HEAD BatchObject *batch; /* owned reference */
    uint32_t j;
    Py_ssize_t len; /* bytes of the tensor (not of the slot) */
} PartObject;

static size_t elem_size(enum dh_dtype t)
{
    return t == DH_DTYPE_F32 ? 4 : 1;
}

static Py_ssize_t tensor_bytes(const struct dh_client_part *p)
{
    uint64_t n = elem_size(p->dtype);

    for (uint32_t i = 0; i < p->ndims; i++)
        n *= p->dims[i];
    return n <= p->len ? (Py_ssize_t)n : -1;
}

static void batch_dealloc(BatchObject *self)
{
    dh_client_batch_release(self->b);
    dhpy_free((PyObject *)self);
}

/* The heap types (dhpy_client_init). */
static PyTypeObject *PartType, *BatchType;

/* Part j's frames (whole 0) or its whole slot (whole 1: the sound after
 * the frames, docs/arena.md "Batch layout"). */
static PyObject *new_part(BatchObject *self, PyObject *arg, int whole)
{
    long j = PyLong_AsLong(arg);
    PartObject *p;

    if (PyErr_Occurred())
        return NULL;
    if (j < 0 || (unsigned long)j >= self->b->n_parts)
        return PyErr_Format(PyExc_IndexError, "part %ld of %u", j,
                            self->b->n_parts);
    if (!(p = PyObject_New(PartObject, PartType)))
        return NULL;
    Py_INCREF((PyObject *)self);
    p->batch = self;
    p->j = (uint32_t)j;
    p->len = tensor_bytes(&self->b->parts[j]);
    if (whole && p->len >= 0 && self->b->parts[j].len <= PY_SSIZE_T_MAX)
        p->len = (Py_ssize_t)self->b->parts[j].len;
    if (p->len < 0) {
        Py_DECREF(p);
        return PyErr_Format(dhpy_DataError,
                            "step %llu part %ld: the shape "
                            "does not fit its slot",
                            (unsigned long long)self->b->step, j);
    }
    return (PyObject *)p;
}

static PyObject *batch_part(BatchObject *self, PyObject *arg)
{
    return new_part(self, arg, 0);
}

static PyObject *batch_slot(BatchObject *self, PyObject *arg)
{
    return new_part(self, arg, 1);
}

static PyObject *batch_dims(BatchObject *self, PyObject *arg)
{
    long j = PyLong_AsLong(arg);
    const struct dh_client_part *p;
    PyObject *t;

    if (PyErr_Occurred())
        return NULL;
    if (j < 0 || (unsigned long)j >= self->b->n_parts)
        return PyErr_Format(PyExc_IndexError, "part %ld of %u", j,
                            self->b->n_parts);
    p = &self->b->parts[j];
    if (!(t = PyTuple_New(p->ndims)))
        return NULL;
    for (uint32_t i = 0; i < p->ndims; i++) {
        PyObject *d = PyLong_FromUnsignedLongLong(p->dims[i]);

        if (!d) {
            Py_DECREF(t);
            return NULL;
        }
        PyTuple_SetItem(t, i, d); /* steals d */
    }
    return t;
}

/* ((position, failed id, substitute id, stage, code, cause), ...). */
static PyObject *batch_subs(const struct dh_client_batch *b)
{
    PyObject *t = PyTuple_New(b->n_subs);

    for (uint32_t i = 0; t && i < b->n_subs; i++) {
        const struct dh_client_subst *x = &b->subs[i];
        PyObject *v = Py_BuildValue("(IKKsis)", x->position,
                                    (unsigned long long)x->failed_id,
                                    (unsigned long long)x->substitute_id,
                                    dh_stage_name((enum dh_stage)x->stage),
                                    x->cause, dh_strerror(x->cause));

        if (!v) {
            Py_DECREF(t);
            return NULL;
        }
        PyTuple_SetItem(t, i, v); /* steals v */
    }
    return t;
}

static PyObject *batch_get(BatchObject *self, void *what)
{
    const struct dh_client_batch *b = self->b;
    const char *w = what;

    if (!strcmp(w, "epoch"))
        return PyLong_FromUnsignedLong(b->epoch);
    if (!strcmp(w, "step"))
        return PyLong_FromUnsignedLongLong(b->step);
    if (!strcmp(w, "n_parts"))
        return PyLong_FromUnsignedLong(b->n_parts);
    if (!strcmp(w, "n_samples"))
        return PyLong_FromUnsignedLong(b->n_samples);
    if (!strcmp(w, "input_wait_ms"))
        return PyFloat_FromDouble(b->input_wait_ms);
    if (!strcmp(w, "sample_ids"))
        return PyBytes_FromStringAndSize((const char *)b->sample_ids,
                                         (Py_ssize_t)b->n_samples * 8);
    if (!strcmp(w, "valid_frames"))
        return PyBytes_FromStringAndSize((const char *)b->valid_frames,
                                         (Py_ssize_t)b->n_samples * 4);
    if (!strcmp(w, "sample_ms"))
        return PyBytes_FromStringAndSize((const char *)b->sample_ms,
                                         (Py_ssize_t)b->n_samples * 4);
    if (!strcmp(w, "substitutions"))
        return batch_subs(b);
    if (!strcmp(w, "dtype"))
        return PyUnicode_FromString(
            b->parts[0].dtype == DH_DTYPE_F32 ? "float32" : "uint8");
    return PyUnicode_FromString(b->parts[0].layout == DH_LAYOUT_TCHW ? "TCHW"
                                                                     : "THWC");
}

static PyGetSetDef batch_getset[] = {
    {"epoch", (getter)batch_get, NULL, "epoch", "epoch"},
    {"step", (getter)batch_get, NULL, "global step in the epoch", "step"},
    {"n_parts", (getter)batch_get, NULL, "microbatches", "n_parts"},
    {"n_samples", (getter)batch_get, NULL, "samples", "n_samples"},
    {"input_wait_ms", (getter)batch_get, NULL, "time next() blocked",
     "input_wait_ms"},
    {"sample_ids", (getter)batch_get, NULL, "native uint64 bytes",
     "sample_ids"},
    {"valid_frames", (getter)batch_get, NULL, "native uint32 bytes",
     "valid_frames"},
    {"sample_ms", (getter)batch_get, NULL,
     "native float32 bytes: read + decode + scale ms (-1: unknown)",
     "sample_ms"},
    {"substitutions", (getter)batch_get, NULL,
     "skip policy: ((position, failed_id, substitute_id, stage, code, "
     "cause), ...)",
     "substitutions"},
    {"dtype", (getter)batch_get, NULL, "'uint8' or 'float32'", "dtype"},
    {"layout", (getter)batch_get, NULL, "'THWC' or 'TCHW'", "layout"},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef batch_methods[] = {
    {"part", (PyCFunction)batch_part, METH_O,
     "part(j): microbatch j's tensor bytes (buffer protocol, no copy)"},
    {"slot", (PyCFunction)batch_slot, METH_O,
     "slot(j): microbatch j's whole slot, the sound after the frames"},
    {"dims", (PyCFunction)batch_dims, METH_O, "dims(j): part j's shape"},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot batch_slots[] = {
    {Py_tp_doc,
     (void *)"One consumed step; its arena slots return when it is freed."},
    {Py_tp_dealloc, (void *)batch_dealloc},
    {Py_tp_methods, (void *)batch_methods},
    {Py_tp_getset, (void *)batch_getset},
    {0, NULL},
};

/* Made by Client.next() alone, as the static type was (it had no tp_new). */
static PyType_Spec batch_spec = {
    .name = "datahelix._C.Batch",
    .basicsize = sizeof(BatchObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE |
             Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = batch_slots,
};

static void part_dealloc(PartObject *self)
{
    Py_XDECREF((PyObject *)self->batch);
    dhpy_free((PyObject *)self);
}

static int part_getbuffer(PartObject *self, Py_buffer *view, int flags)
{
    const struct dh_client_part *p = &self->batch->b->parts[self->j];

    /* Writable: the slot is this consumer's until released (in-place
     * normalisation is fine); torch.frombuffer() wants it so. */
    return PyBuffer_FillInfo(view, (PyObject *)self, (void *)p->data, self->len,
                             0, flags);
}

static PyType_Slot part_slots[] = {
    {Py_tp_doc,
     (void *)"A microbatch's tensor in shared memory (buffer protocol)."},
    {Py_tp_dealloc, (void *)part_dealloc},
    {Py_bf_getbuffer, (void *)part_getbuffer},
    {0, NULL},
};

static PyType_Spec part_spec = {
    .name = "datahelix._C.Part",
    .basicsize = sizeof(PartObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE |
             Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = part_slots,
};

/* ---- Client ---- */

typedef struct {
    PyObject_HEAD struct dh_client *c;
    FILE *telemetry;
    int busy;
    unsigned rank;
} ClientObject;

static int parse_enum(const char *s, const char *a, const char *b,
                      const char *what, int *out)
{
    if (!strcmp(s, a))
        *out = 0;
    else if (!strcmp(s, b))
        *out = 1;
    else {
        PyErr_Format(PyExc_ValueError, "%s '%s': expected '%s' or '%s'", what,
                     s, a, b);
        return -1;
    }
    return 0;
}

/* dataserver_args: a sequence of at most 16 str / bytes / path-likes ->
 * bytes objects in `keep` (owned; the caller drops them) and their
 * NULL-terminated char pointers in `argv`. */
static int dataserver_args(PyObject *seq,
                           PyObject *keep[DH_CLIENT_MAX_DS_ARGS + 1],
                           const char *argv[DH_CLIENT_MAX_DS_ARGS + 1])
{
    PyObject *f = PySequence_Fast(seq, "dataserver_args must be a sequence "
                                       "of strings");
    Py_ssize_t n;

    if (!f)
        return -1;
    if ((n = PySequence_Size(f)) < 0) {
        Py_DECREF(f);
        return -1;
    }
    if (n > DH_CLIENT_MAX_DS_ARGS) {
        Py_DECREF(f);
        PyErr_Format(PyExc_ValueError, "dataserver_args: at most %d",
                     DH_CLIENT_MAX_DS_ARGS);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        /* PySequence_Fast gave a list or tuple: GetItem cannot fail for
         * i < n.  A new reference (the _GET_ITEM macro is not in the
         * limited API). */
        PyObject *item = PySequence_GetItem(f, i);
        int ok = item && PyUnicode_FSConverter(item, &keep[i]);

        Py_XDECREF(item);
        if (!ok) {
            Py_DECREF(f);
            for (Py_ssize_t k = 0; k < i; k++)
                Py_CLEAR(keep[k]);
            return -1;
        }
        argv[i] = PyBytes_AsString(keep[i]); /* keep[i] is bytes */
    }
    argv[n] = NULL;
    Py_DECREF(f);
    return 0;
}

static int client_init(ClientObject *self, PyObject *args, PyObject *kw)
{
    static char *names[] = {"coordinator",
                            "index",
                            "rank",
                            "world_size",
                            "frames",
                            "width",
                            "height",
                            "layout",
                            "dtype",
                            "prefetch",
                            "microbatches",
                            "timeout_ms",
                            "start_timeout_ms",
                            "dataserver",
                            "datahelix_bin",
                            "workers",
                            "max_batch",
                            "listen",
                            "seed",
                            "telemetry",
                            "max_restarts",
                            "random_crop",
                            "arena_bytes",
                            "dataserver_args",
                            "ddl_ms",
                            "step_deadline_ms",
                            "spares",
                            "fps",
                            "native",
                            "max_side",
                            "max_area",
                            "patch",
                            "keyfile",
                            "trace",
                            "held",
                            "server_log",
                            "cache_dir",
                            "cache_bytes",
                            "audio_rate",
                            "audio_channels",
                            "audio_samples",
                            "audio_required",
                            "audio_feature",
                            "audio_n_fft",
                            "audio_hop",
                            "audio_mels",
                            "audio_crop",
                            NULL};
    struct dh_client_opts o;
    const char *layout = "THWC", *dtype = "uint8", *tel = NULL;
    unsigned long long seed = 0;
    long long frames = 16;
    int w = 224, h = 224, lay = 0, dt = 0, rc, random_crop = 0;
    unsigned long long arena_bytes = 0, cache_bytes = 0;
    double fps = 0; /* > 0: an fps plan, `frames` its cap */
    int native = 0, max_side = 0, patch = 0;
    long long max_area = 0, audio_samples = 0;
    int audio_rate = 0, audio_channels = 0, audio_required = 0;
    int audio_feature = 0, audio_n_fft = 0, audio_hop = 0, audio_mels = 0;
    int audio_crop = 0;
    PyObject *ds_args = NULL, *ds_bytes[DH_CLIENT_MAX_DS_ARGS + 1] = {NULL};
    const char *ds_argv[DH_CLIENT_MAX_DS_ARGS + 1] = {NULL};
    struct dh_err e;

    if (self->c) {
        PyErr_SetString(PyExc_RuntimeError, "Client already initialised");
        return -1;
    }
    dh_client_opts_default(&o);
    if (!PyArg_ParseTupleAndKeywords(
            args, kw, "ss|IILiissIIiizzIIzKzipKOddIdpiLizzIzzKiiLpiiiii", names,
            &o.coordinator, &o.index_path, &o.rank, &o.world_size, &frames, &w,
            &h, &layout, &dtype, &o.prefetch, &o.microbatches, &o.timeout_ms,
            &o.start_timeout_ms, &o.dataserver, &o.datahelix_bin, &o.ds_workers,
            &o.max_batch, &o.ds_listen, &seed, &tel, &o.max_restarts,
            &random_crop, &arena_bytes, &ds_args, &o.ddl_ms,
            &o.step_deadline_ms, &o.spares, &fps, &native, &max_side, &max_area,
            &patch, &o.keyfile, &o.trace, &o.held, &o.server_log, &o.cache_dir,
            &cache_bytes, &audio_rate, &audio_channels, &audio_samples,
            &audio_required, &audio_feature, &audio_n_fft, &audio_hop,
            &audio_mels, &audio_crop))
        return -1;
    o.arena_bytes = (size_t)arena_bytes;
    o.cache_bytes = cache_bytes;
    if (parse_enum(layout, "THWC", "TCHW", "layout", &lay) < 0 ||
        parse_enum(dtype, "uint8", "float32", "dtype", &dt) < 0)
        return -1;
    o.plan.frames = frames;
    o.plan.width = w;
    o.plan.height = h;
    o.plan.layout = lay ? DH_LAYOUT_TCHW : DH_LAYOUT_THWC;
    o.plan.dtype = dt ? DH_DTYPE_F32 : DH_DTYPE_U8;
    o.plan.seed = seed;
    if (random_crop)
        o.plan.geometry = DH_GEOM_RANDOM_CROP;
    if (fps > 0) {
        o.plan.kind = DH_PLAN_FPS;
        o.plan.fps = fps;
    }
    o.plan.audio_rate = audio_rate;
    o.plan.audio_channels = audio_channels;
    o.plan.audio_samples = audio_samples;
    o.plan.audio_required = audio_required;
    o.plan.audio_feature = audio_feature;
    o.plan.audio_n_fft = audio_n_fft;
    o.plan.audio_hop = audio_hop;
    o.plan.audio_mels = audio_mels;
    o.plan.audio_crop = audio_crop;
    if (native) { /* a packed batch: batch_packed.h */
        o.plan.geometry = DH_GEOM_NATIVE;
        o.plan.width = o.plan.height = 0;
        o.plan.max_side = max_side;
        o.plan.max_area = max_area;
        o.plan.patch = patch;
    }
    /* Appended, never truncated: ranks (or runs) given one path add
     * their records rather than overwrite each other's. */
    if (tel && !(self->telemetry = fopen(tel, "a"))) {
        PyErr_SetFromErrnoWithFilename(PyExc_OSError, tel);
        return -1;
    }
    o.telemetry = self->telemetry;
    /* Last before create: nothing between holds the converted strings. */
    if (ds_args && ds_args != Py_None &&
        dataserver_args(ds_args, ds_bytes, ds_argv) < 0)
        return -1;
    o.ds_args = ds_argv[0] ? ds_argv : NULL;
    Py_BEGIN_ALLOW_THREADS self->rank = o.rank;
    rc = dh_client_create(&o, &self->c, &e);
    Py_END_ALLOW_THREADS for (int i = 0; i < DH_CLIENT_MAX_DS_ARGS + 1;
                              i++) /* the client copied them */
        Py_XDECREF(ds_bytes[i]);
    if (rc < 0) {
        self->c = NULL;
        dhpy_raise(rc, &e);
        return -1;
    }
    return 0;
}

static void client_close_c(ClientObject *self)
{
    struct dh_client *c = self->c;

    self->c = NULL;
    if (c) {
        Py_BEGIN_ALLOW_THREADS dh_client_destroy(c);
        Py_END_ALLOW_THREADS
    }
    if (self->telemetry) {
        fclose(self->telemetry);
        self->telemetry = NULL;
    }
}

static void client_dealloc(ClientObject *self)
{
    client_close_c(self);
    dhpy_free((PyObject *)self);
}

static int check_open(const ClientObject *self)
{
    if (!self->c) {
        PyErr_SetString(PyExc_ValueError, "the client is closed");
        return -1;
    }
    if (self->busy) {
        PyErr_SetString(PyExc_RuntimeError, "next() is already running on "
                                            "this client in another thread");
        return -1;
    }
    return 0;
}

static PyObject *client_close(ClientObject *self, PyObject *unused)
{
    (void)unused;
    if (self->busy) {
        PyErr_SetString(PyExc_RuntimeError, "close() while next() runs");
        return NULL;
    }
    client_close_c(self);
    Py_RETURN_NONE;
}

/* start_epoch(epoch, first, ids, offs) and start_pass(epoch, pass, first,
 * ids, offs): the ranges are dh_client_start_pass()'s to check. */
static PyObject *client_start(ClientObject *self, PyObject *args, int with_pass)
{
    unsigned long long epoch, pass = 0, first;
    Py_buffer ids = {0}, offs = {0};
    struct dh_err e;
    int rc = 0, ok;
    uint64_t n;

    if (check_open(self) < 0)
        return NULL;
    ok = with_pass
             ? PyArg_ParseTuple(args, "KKKy*y*", &epoch, &pass, &first, &ids,
                                &offs)
             : PyArg_ParseTuple(args, "KKy*y*", &epoch, &first, &ids, &offs);
    if (!ok)
        return NULL;
    if (offs.len < 8 || offs.len % 8 || ids.len % 8) {
        PyErr_SetString(PyExc_ValueError,
                        "ids and offsets must be native "
                        "uint64 bytes, offsets at least one entry");
        rc = -1;
        goto out;
    }
    n = (uint64_t)offs.len / 8 - 1;
    if (n && ((const uint64_t *)offs.buf)[n] > (uint64_t)ids.len / 8) {
        PyErr_SetString(PyExc_ValueError, "offsets point past the ids");
        rc = -1;
        goto out;
    }
    if (!with_pass && epoch > UINT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "epoch beyond UINT32_MAX");
        rc = -1;
        goto out;
    }
    Py_BEGIN_ALLOW_THREADS rc =
        with_pass ? dh_client_start_pass(self->c, epoch, pass, first, n,
                                         ids.buf, offs.buf, &e)
                  : dh_client_start_epoch(self->c, (uint32_t)epoch, first, n,
                                          ids.buf, offs.buf, &e);
    Py_END_ALLOW_THREADS if (rc < 0) dhpy_raise(rc, &e);
out:
    PyBuffer_Release(&ids);
    PyBuffer_Release(&offs);
    if (rc < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *client_start_epoch(ClientObject *self, PyObject *args)
{
    return client_start(self, args, 0);
}

static PyObject *client_start_pass(ClientObject *self, PyObject *args)
{
    return client_start(self, args, 1);
}

static double now_s(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Sets `name` on `exc` to a new reference `v` (stolen); -1 if either
 * failed. */
static int set_field(PyObject *exc, const char *name, PyObject *v)
{
    int rc = v ? PyObject_SetAttrString(exc, name, v) : -1;

    Py_XDECREF(v);
    return rc;
}

/* SampleError / ArenaExhausted for a failed (consumed) step, its fields
 * from dh_client_failure(). */
static PyObject *raise_failure(ClientObject *self, int rc,
                               const struct dh_err *e)
{
    PyObject *type = rc == DH_EARENA ? dhpy_ArenaExhausted : dhpy_SampleError;
    struct dh_client_failure f;
    PyObject *exc;

    if (dh_client_failure(self->c, &f) < 0)
        return dhpy_raise(rc, e);
    if (!(exc = PyObject_CallFunction(type, "s", e->msg)))
        return NULL;
    if (set_field(exc, "sample_id",
                  f.sample_id == DH_CLIENT_NO_SAMPLE
                      ? Py_NewRef(Py_None)
                      : PyLong_FromUnsignedLongLong(f.sample_id)) < 0 ||
        set_field(exc, "consumed", PyBool_FromLong(f.consumed)) < 0 ||
        set_field(exc, "path",
                  f.path[0] ? PyUnicode_DecodeFSDefault(f.path)
                            : Py_NewRef(Py_None)) < 0 ||
        set_field(exc, "stage", PyUnicode_FromString(dh_stage_name(f.stage))) <
            0 ||
        set_field(exc, "cause",
                  PyUnicode_DecodeUTF8(f.message, strlen(f.message),
                                       "replace")) < 0 ||
        set_field(exc, "code", PyLong_FromLong(f.cause)) < 0 ||
        set_field(exc, "server", PyLong_FromUnsignedLong(f.server_id)) < 0 ||
        set_field(exc, "epoch", PyLong_FromUnsignedLong(f.epoch)) < 0 ||
        set_field(exc, "step", PyLong_FromUnsignedLongLong(f.step)) < 0 ||
        set_field(exc, "rank", PyLong_FromUnsignedLong(self->rank)) < 0) {
        Py_DECREF(exc);
        return NULL;
    }
    PyErr_SetObject(type, exc);
    Py_DECREF(exc);
    return NULL;
}

/* next(timeout_ms=-1): a Batch, or None at the end of the epoch.  Raises
 * SampleError or ArenaExhausted (the step failed and is consumed),
 * datahelix.TimeoutError (the wait ran out; the step stays next),
 * DataError (the data plane failed), or KeyboardInterrupt between
 * slices. */
static PyObject *client_next(ClientObject *self, PyObject *args)
{
    int timeout_ms = -1, rc;
    struct dh_client_batch *b = NULL;
    struct dh_err e;
    double t0 = now_s();
    BatchObject *bo;

    if (check_open(self) < 0 || !PyArg_ParseTuple(args, "|i", &timeout_ms))
        return NULL;
    self->busy = 1;
    for (;;) {
        Py_BEGIN_ALLOW_THREADS rc = dh_client_next_for(self->c, SLICE_MS, &b,
                                                       &e);
        Py_END_ALLOW_THREADS if (rc !=
                                 DH_ETIMEOUT) /* only a slice that ran out */
            break;
        if (PyErr_CheckSignals() < 0) {
            self->busy = 0;
            return NULL;
        }
        if (timeout_ms >= 0 && (now_s() - t0) * 1e3 >= timeout_ms)
            break;
    }
    self->busy = 0;
    if (rc == DH_EEMPTY)
        Py_RETURN_NONE;
    if (rc == DH_ESAMPLE || rc == DH_EARENA)
        return raise_failure(self, rc, &e);
    if (rc == DH_ETIMEOUT)
        return dhpy_raise(rc, &e);
    if (rc < 0) {
        PyObject *exc;

        /* The data plane failed: DataError with the code. */
        if (!(exc = PyObject_CallFunction(dhpy_DataError, "s",
                                          e.msg[0] ? e.msg : dh_strerror(rc))))
            return NULL;
        if (set_field(exc, "code", PyLong_FromLong(rc)) < 0) {
            Py_DECREF(exc);
            return NULL;
        }
        PyErr_SetObject(dhpy_DataError, exc);
        Py_DECREF(exc);
        return NULL;
    }
    if (!(bo = PyObject_New(BatchObject, BatchType))) {
        dh_client_batch_release(b);
        return NULL;
    }
    bo->b = b;
    return (PyObject *)bo;
}

/* One late step's cause as a dict (docs/trace.md "Late steps"). */
static PyObject *late_dict(const struct dh_client_late *l)
{
    PyObject *sample = l->sample_id == DH_CLIENT_NO_SAMPLE
                           ? (Py_INCREF(Py_None), Py_None)
                           : PyLong_FromUnsignedLongLong(l->sample_id);

    if (!sample)
        return NULL;
    return Py_BuildValue("{sIsKsdsIsIsOsIsssdsNsssd}", "epoch", l->epoch,
                         "step", (unsigned long long)l->step, "input_wait_ms",
                         l->input_wait_ms, "microbatch", l->microbatch,
                         "server", l->server_id, "remote",
                         l->remote ? Py_True : Py_False, "worker", l->worker,
                         "stage", l->stage, "stage_ms", l->stage_ms, "sample",
                         sample, "path", l->path, "sample_ms", l->sample_ms);
}

/* stats()["late"] (the kept causes, oldest first), ["late_steps"] (all
 * seen) and ["late_by_stage"] (counts over the kept ones). */
static int add_late(struct dh_client *c, PyObject *d)
{
    struct dh_client_late *late;
    uint64_t total = 0;
    size_t n = dh_client_late(c, NULL, 0, NULL);
    PyObject *list = NULL, *by = NULL, *v;
    int rc = -1;

    if (!(late = PyMem_Calloc(n ? n : 1, sizeof(*late))))
        return PyErr_NoMemory(), -1;
    n = dh_client_late(c, late, n, &total);
    if (!(list = PyList_New(0)) || !(by = PyDict_New()))
        goto out;
    for (size_t i = 0; i < n; i++) {
        PyObject *one = late_dict(&late[i]), *cnt;
        long prev = 0;
        int bad;

        if (!one)
            goto out;
        bad = PyList_Append(list, one);
        Py_DECREF(one);
        if (bad)
            goto out;
        if ((cnt = PyDict_GetItemString(by, late[i].stage)))
            prev = PyLong_AsLong(cnt);
        if (!(cnt = PyLong_FromLong(prev + 1)))
            goto out;
        bad = PyDict_SetItemString(by, late[i].stage, cnt);
        Py_DECREF(cnt);
        if (bad)
            goto out;
    }
    v = PyLong_FromUnsignedLongLong(total);
    if (!v || PyDict_SetItemString(d, "late_steps", v) < 0) {
        Py_XDECREF(v);
        goto out;
    }
    Py_DECREF(v);
    if (PyDict_SetItemString(d, "late", list) < 0 ||
        PyDict_SetItemString(d, "late_by_stage", by) < 0)
        goto out;
    rc = 0;
out:
    Py_XDECREF(list);
    Py_XDECREF(by);
    PyMem_Free(late);
    return rc;
}

static PyObject *client_stats(ClientObject *self, PyObject *unused)
{
    struct dh_client_stats s;
    PyObject *d = NULL, *load = NULL;
    uint32_t ids[256];
    uint64_t parts[256];
    size_t n;

    (void)unused;
    if (!self->c) {
        PyErr_SetString(PyExc_ValueError, "the client is closed");
        return NULL;
    }
    dh_client_stats(self->c, &s);
    d = Py_BuildValue(
        "{sKsKsKsdsdsdsdsKsKsKsKsKsdsKsKsKsK}", "steps", s.steps, "errors",
        s.errors, "misses", s.misses, "input_wait_p50_ms", s.input_wait_p50_ms,
        "input_wait_p95_ms", s.input_wait_p95_ms, "input_wait_max_ms",
        s.input_wait_max_ms, "window_p50_ms", s.window_p50_ms, "requests",
        s.requests, "reissued", s.reissued, "restarts", s.restarts,
        "late_released", s.late_released, "quarantined", s.quarantined,
        "elapsed_s", s.elapsed_s, "cross_ds_bytes", s.cross_ds_bytes,
        "batch_bytes", s.batch_bytes, "arena_bytes", s.arena_bytes,
        "held_bytes", s.held_bytes);
    if (!d || !(load = PyDict_New()))
        goto fail;
    {
        PyObject *v = PyLong_FromUnsignedLongLong(s.substituted);
        PyObject *w = PyLong_FromUnsignedLongLong(s.protocol_errors);
        int rc = v && w ? PyDict_SetItemString(d, "substituted", v) : -1;

        if (rc == 0)
            rc = PyDict_SetItemString(d, "protocol_errors", w);
        Py_XDECREF(v);
        Py_XDECREF(w);
        if (rc < 0)
            goto fail;
        v = PyLong_FromUnsignedLongLong(s.coordinator_restarts);
        rc = v ? PyDict_SetItemString(d, "coordinator_restarts", v) : -1;
        Py_XDECREF(v);
        if (rc < 0)
            goto fail;
        v = Py_BuildValue("{sKsdsK}", "read_bytes", s.read_bytes, "read_ms",
                          s.read_ms, "read_samples", s.read_samples);
        rc = v ? PyDict_Update(d, v) : -1;
        Py_XDECREF(v);
        if (rc < 0)
            goto fail;
    }
    n = dh_client_server_load(self->c, ids, parts, 256);
    for (size_t i = 0; i < n && i < 256; i++) {
        PyObject *k = PyLong_FromUnsignedLong(ids[i]);
        PyObject *v = PyLong_FromUnsignedLongLong(parts[i]);
        int rc = k && v ? PyDict_SetItem(load, k, v) : -1;

        Py_XDECREF(k);
        Py_XDECREF(v);
        if (rc < 0)
            goto fail;
    }
    if (PyDict_SetItemString(d, "server_parts", load) < 0)
        goto fail;
    Py_DECREF(load);
    load = NULL;
    if (add_late(self->c, d) < 0)
        goto fail;
    return d;
fail:
    Py_XDECREF(load);
    Py_XDECREF(d);
    return NULL;
}

static PyObject *client_quarantine(ClientObject *self, PyObject *unused)
{
    uint64_t ids[4096];
    size_t n;
    PyObject *l;

    (void)unused;
    if (!self->c) {
        PyErr_SetString(PyExc_ValueError, "the client is closed");
        return NULL;
    }
    n = dh_client_quarantine(self->c, ids, 4096);
    if (n > 4096)
        n = 4096;
    if (!(l = PyList_New((Py_ssize_t)n)))
        return NULL;
    for (size_t i = 0; i < n; i++) {
        PyObject *v = PyLong_FromUnsignedLongLong(ids[i]);

        if (!v) {
            Py_DECREF(l);
            return NULL;
        }
        PyList_SetItem(l, (Py_ssize_t)i, v); /* steals v */
    }
    return l;
}

static PyMethodDef client_methods[] = {
    {"start_epoch", (PyCFunction)client_start_epoch, METH_VARARGS,
     "start_epoch(epoch, first_step, ids, offsets): this rank's schedule, "
     "as a new pass"},
    {"start_pass", (PyCFunction)client_start_pass, METH_VARARGS,
     "start_pass(epoch, pass, first_step, ids, offsets): this rank's "
     "schedule as pass `pass` (new, or the current one continued with "
     "later steps; ValueError for a pass used before, DataError for "
     "pass >= 65536 or steps beyond 2^24)"},
    {"next", (PyCFunction)client_next, METH_VARARGS,
     "next(timeout_ms=-1) -> Batch, or None at the end of the epoch"},
    {"stats", (PyCFunction)client_stats, METH_NOARGS, "counters (dict)"},
    {"quarantine", (PyCFunction)client_quarantine, METH_NOARGS,
     "sample ids that failed so far"},
    {"close", (PyCFunction)client_close, METH_NOARGS,
     "stop the client and its embedded DataServer"},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot client_slots[] = {
    {Py_tp_doc, (void *)"Client(coordinator, index, ...): a training rank's "
                        "side of the data plane (include/datahelix/client.h)."},
    {Py_tp_new, (void *)PyType_GenericNew},
    {Py_tp_init, (void *)client_init},
    {Py_tp_dealloc, (void *)client_dealloc},
    {Py_tp_methods, (void *)client_methods},
    {0, NULL},
};

static PyType_Spec client_spec = {
    .name = "datahelix._C.Client",
    .basicsize = sizeof(ClientObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = client_slots,
};

int dhpy_client_init(PyObject *m)
{
    if (!dhpy_add_type(m, &client_spec) ||
        !(BatchType = dhpy_add_type(m, &batch_spec)) ||
        !(PartType = dhpy_add_type(m, &part_spec)))
        return -1;
    return 0;
}
