/*
 * dhpy_module.c - module `datahelix._C`: planning an epoch (the same C
 * planner every rank and the simulator run), building an index from a
 * JSONL table, reading an index (Index), and the exception types.
 *
 * Locking: the GIL; released while the planner or the index builder run.
 */
#include "python/dhpy.h"

#include <stdlib.h>
#include <string.h>

#include "datahelix/batch.h"
#include "datahelix/batch_packed.h"
#include "datahelix/estimate.h"
#include "datahelix/index.h"
#include "datahelix/media.h"
#include "datahelix/plan.h"
#include "runtime/keys.h"

PyObject *dhpy_DataError, *dhpy_SampleError, *dhpy_ArenaExhausted,
    *dhpy_TimeoutError;

PyTypeObject *dhpy_add_type(PyObject *m, PyType_Spec *spec)
{
    const char *dot = strrchr(spec->name, '.');
    PyObject *t = PyType_FromSpec(spec);

    if (!t)
        return NULL;
    if (PyModule_AddObjectRef(m, dot ? dot + 1 : spec->name, t) < 0) {
        Py_DECREF(t);
        return NULL;
    }
    return (PyTypeObject *)t;
}

void dhpy_free(PyObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    freefunc f = (freefunc)PyType_GetSlot(tp, Py_tp_free);

    f(self);
    Py_DECREF(tp);
}

PyObject *dhpy_raise(int rc, const struct dh_err *e)
{
    const char *msg = e && e->msg[0] ? e->msg : dh_strerror(rc);
    PyObject *type;

    switch (rc) {
    case DH_ETIMEOUT:
        type = dhpy_TimeoutError;
        break;
    case DH_EARENA:
        type = dhpy_ArenaExhausted;
        break;
    case DH_ESAMPLE:
        type = dhpy_SampleError;
        break;
    case DH_ENOMEM:
        return PyErr_NoMemory();
    case DH_EINVAL:
        type = PyExc_ValueError;
        break;
    case DH_ENOTFOUND:
        type = PyExc_FileNotFoundError;
        break;
    case DH_EIO:
        type = PyExc_OSError;
        break;
    default:
        type = dhpy_DataError;
    }
    PyErr_SetString(type, msg);
    return NULL;
}

PyObject *dhpy_raise_code(int rc, const struct dh_err *e)
{
    PyObject *exc, *val, *tb, *code;

    dhpy_raise(rc, e);
    PyErr_Fetch(&exc, &val, &tb);
    PyErr_NormalizeException(&exc, &val, &tb);
    if (val && (code = PyLong_FromLong(rc))) {
        if (PyObject_SetAttrString(val, "code", code) < 0)
            PyErr_Clear();
        Py_DECREF(code);
    }
    PyErr_Restore(exc, val, tb);
    return NULL;
}

/* ---- schedule ---- */

static PyObject *py_schedule(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *names[] = {"index",  "world_size", "batch_size", "rank",
                            "epoch",  "seed",       "balance",    "drop_last",
                            "subset", "tokens",     "order",      NULL};
    const char *path;
    unsigned world, batch, rank;
    unsigned long long epoch = 0, seed = 0;
    int balance = DH_BALANCE_FIXED, drop_last = 1, rc;
    int order = DH_ORDER_ALTERNATE;
    struct dh_index *ix = NULL;
    struct dh_plan_schedule sc = {0};
    struct dh_plan_opts po;
    struct dh_index_columns col;
    struct dh_err e;
    PyObject *out = NULL;
    Py_buffer sub = {0}, tok = {0};
    const uint32_t *tokens = NULL;

    (void)self;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "sIII|KKipy*y*i", names, &path,
                                     &world, &batch, &rank, &epoch, &seed,
                                     &balance, &drop_last, &sub, &tok, &order))
        return NULL;
    if (tok.buf && tok.len % 4) {
        PyBuffer_Release(&sub);
        PyBuffer_Release(&tok);
        return PyErr_Format(PyExc_ValueError, "tokens: native uint32 "
                                              "bytes expected");
    }
    if (sub.buf && sub.len % 8) {
        PyBuffer_Release(&sub);
        return PyErr_Format(PyExc_ValueError, "subset: native uint64 "
                                              "bytes expected");
    }
    dh_plan_opts_init(&po);
    po.world_size = world;
    po.batch_size = batch;
    po.epoch = epoch;
    po.seed = seed;
    po.balance = balance;
    po.drop_last = drop_last;
    po.order = order;
    Py_BEGIN_ALLOW_THREADS rc = dh_index_open(path, 0, &ix, &e);
    if (rc == 0) {
        dh_index_columns(ix, &col);
        /* tokens=: the loader's own estimate (its sampling), one per row */
        tokens = col.est_tokens;
        if (tok.buf && (uint64_t)tok.len / 4 == col.count)
            tokens = tok.buf;
        else if (tok.buf)
            rc = dh_err_set(&e, DH_EINVAL, "tokens: %llu for %llu rows",
                            (unsigned long long)tok.len / 4,
                            (unsigned long long)col.count);
    }
    if (rc == 0) {
        rc = dh_plan_schedule(tokens, col.profile, col.count, sub.buf,
                              (uint64_t)sub.len / 8, &po, rank, 0, &sc, &e);
    }
    Py_END_ALLOW_THREADS if (rc == 0) out = Py_BuildValue(
        "(y#y#)", (const char *)sc.ids, (Py_ssize_t)(sc.n_ids * 8),
        (const char *)sc.offs, (Py_ssize_t)((sc.n_steps + 1) * 8));
    dh_plan_schedule_free(&sc);
    PyBuffer_Release(&sub);
    PyBuffer_Release(&tok);
    dh_index_close(ix);
    if (rc < 0)
        return dhpy_raise(rc, &e);
    return out;
}

static PyObject *py_build_index(PyObject *self, PyObject *args)
{
    const char *jsonl, *dhx;
    struct dh_err e;
    int rc;

    (void)self;
    if (!PyArg_ParseTuple(args, "ss", &jsonl, &dhx))
        return NULL;
    Py_BEGIN_ALLOW_THREADS rc = dh_index_build_from_table(jsonl, dhx, &e);
    Py_END_ALLOW_THREADS if (rc < 0) return dhpy_raise(rc, &e);
    Py_RETURN_NONE;
}

/* decode(path, frames=16, width=224, height=224) -> bytes: one clip through
 * the media pipeline (uniform frames, centre crop, THWC uint8), for peers
 * that want "the same decode" outside the data plane (bench_python.py). */
static PyObject *py_decode(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *names[] = {"path", "frames", "width", "height", NULL};
    const char *path;
    long long frames = 16;
    int w = 224, h = 224, rc;
    struct dh_media *m = NULL;
    struct dh_media_plan p;
    struct dh_err e;
    PyObject *out = NULL;
    int64_t got = 0;
    size_t len;
    uint8_t *buf = NULL;

    (void)self;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "s|Lii", names, &path, &frames,
                                     &w, &h))
        return NULL;
    dh_media_plan_init(&p);
    p.frames = frames;
    p.width = w;
    p.height = h;
    if (dh_media_plan_check(&p, &e) < 0)
        return dhpy_raise(DH_EINVAL, &e);
    len = dh_media_plan_bytes(&p, frames);
    /* PyMem_Malloc (the limited API has no PyMem_RawMalloc): allocated and
     * freed with the GIL held; only written while it is released. */
    if (!(buf = PyMem_Malloc(len + DH_MEDIA_DST_PAD)))
        return PyErr_NoMemory();
    Py_BEGIN_ALLOW_THREADS rc = dh_media_create(&m, &e);
    if (rc == 0)
        rc = dh_media_open(m, path, &e);
    if (rc == 0)
        rc = dh_media_select(m, &p, &got, &e);
    if (rc == 0)
        rc = dh_media_decode(m, &p, buf, len + DH_MEDIA_DST_PAD, NULL, &e);
    dh_media_destroy(m);
    Py_END_ALLOW_THREADS if (rc == 0)
        out = PyBytes_FromStringAndSize((const char *)buf, (Py_ssize_t)len);
    PyMem_Free(buf);
    return rc < 0 ? dhpy_raise(rc, &e) : out;
}

/* ---- Index ---- */

typedef struct {
    PyObject_HEAD struct dh_index *ix;
    struct dh_index_columns col;
} IndexObject;

static int index_init(IndexObject *self, PyObject *args, PyObject *kw)
{
    static char *names[] = {"path", NULL};
    const char *path;
    struct dh_err e;
    int rc;

    if (!PyArg_ParseTupleAndKeywords(args, kw, "s", names, &path))
        return -1;
    if (self->ix)
        return 0;
    if ((rc = dh_index_open(path, 0, &self->ix, &e)) < 0) {
        dhpy_raise(rc, &e);
        return -1;
    }
    dh_index_columns(self->ix, &self->col);
    return 0;
}

static void index_dealloc(IndexObject *self)
{
    dh_index_close(self->ix);
    dhpy_free((PyObject *)self);
}

static Py_ssize_t index_len(IndexObject *self)
{
    return self->ix ? (Py_ssize_t)self->col.count : 0;
}

static int index_id(IndexObject *self, PyObject *arg, uint64_t *id)
{
    unsigned long long v = PyLong_AsUnsignedLongLong(arg);

    if (PyErr_Occurred())
        return -1;
    if (!self->ix || v >= self->col.count) {
        PyErr_Format(PyExc_IndexError, "sample id %llu out of range", v);
        return -1;
    }
    *id = v;
    return 0;
}

static PyObject *str_or_none(const char *s)
{
    if (!s)
        Py_RETURN_NONE;
    return PyUnicode_DecodeFSDefault(s);
}

static PyObject *index_path(IndexObject *self, PyObject *arg)
{
    uint64_t id;

    return index_id(self, arg, &id) < 0
               ? NULL
               : str_or_none(dh_index_path(self->ix, id));
}

/* source(id) -> (path, member, offset, size, mtime_ns): where the
 * sample's bytes are (member None for a whole file), and the file's size
 * and time as probed. */
static PyObject *index_source(IndexObject *self, PyObject *arg)
{
    struct dh_source_ref ref;
    uint64_t id;

    if (index_id(self, arg, &id) < 0)
        return NULL;
    if (dh_index_source(self->ix, id, &ref))
        return PyErr_Format(PyExc_ValueError,
                            "sample %llu: no path or a bad member in the "
                            "index",
                            (unsigned long long)id);
    return Py_BuildValue(
        "(NNLLL)", PyUnicode_DecodeFSDefault(ref.path),
        ref.member ? PyUnicode_DecodeFSDefault(ref.member) : Py_NewRef(Py_None),
        (long long)ref.offset, (long long)ref.size, (long long)ref.mtime_ns);
}

static PyObject *index_text(IndexObject *self, PyObject *arg)
{
    uint64_t id;
    const char *t;

    if (index_id(self, arg, &id) < 0)
        return NULL;
    if (!(t = dh_index_text(self->ix, id)))
        Py_RETURN_NONE;
    return PyUnicode_DecodeUTF8(t, (Py_ssize_t)strlen(t), "replace");
}

static PyObject *index_tokens(IndexObject *self, PyObject *arg)
{
    uint64_t id;

    return index_id(self, arg, &id) < 0
               ? NULL
               : PyLong_FromUnsignedLong(self->col.est_tokens[id]);
}

static PyObject *index_digest(IndexObject *self, PyObject *noargs)
{
    uint64_t h;

    (void)noargs;
    if (!self->ix)
        return PyErr_Format(PyExc_ValueError, "index not open");
    Py_BEGIN_ALLOW_THREADS h = dh_index_digest(self->ix);
    Py_END_ALLOW_THREADS return PyLong_FromUnsignedLongLong(h);
}

static PyMethodDef index_methods[] = {
    {"path", (PyCFunction)index_path, METH_O, "path(id): the sample's file"},
    {"source", (PyCFunction)index_source, METH_O,
     "source(id) -> (path, member, offset, size): the sample's file, or its "
     "shard and member"},
    {"text", (PyCFunction)index_text, METH_O,
     "text(id): the sample's caption, or None"},
    {"tokens", (PyCFunction)index_tokens, METH_O,
     "tokens(id): the sample's estimated token count"},
    {"digest", (PyCFunction)index_digest, METH_NOARGS,
     "digest() -> int: what a plan position refers to (count, and per row "
     "path, tokens, profile); see dh_index_digest"},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot index_slots[] = {
    {Py_tp_doc, (void *)"Index(path): a .dhx index, read-only (mmap)."},
    {Py_tp_new, (void *)PyType_GenericNew},
    {Py_tp_init, (void *)index_init},
    {Py_tp_dealloc, (void *)index_dealloc},
    {Py_tp_methods, (void *)index_methods},
    {Py_sq_length, (void *)index_len},
    {0, NULL},
};

static PyType_Spec index_spec = {
    .name = "datahelix._C.Index",
    .basicsize = sizeof(IndexObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = index_slots,
};

/* packed_table(buffer, n, elem) -> [(offset, t, h, w, valid_frames)]: the
 * checked table of a packed slot (batch_packed.h); ValueError when the
 * buffer does not hold a valid one. */
static PyObject *py_packed_table(PyObject *mod, PyObject *args)
{
    struct dh_packed_entry *en = NULL;
    PyObject *out = NULL;
    unsigned n, elem;
    struct dh_err e;
    Py_buffer buf;

    (void)mod;
    if (!PyArg_ParseTuple(args, "y*II", &buf, &n, &elem))
        return NULL;
    if (n == 0 || n > DH_BATCH_MAX_SAMPLES || (elem != 1 && elem != 4)) {
        PyErr_Format(PyExc_ValueError, "packed_table: n %u, elem %u", n, elem);
        goto out_buf;
    }
    if (!(en = PyMem_Malloc(n * sizeof(*en)))) {
        PyErr_NoMemory();
        goto out_buf;
    }
    dh_err_clear(&e);
    if (dh_packed_table_read(buf.buf, (size_t)buf.len, n, elem, en, &e)) {
        PyErr_SetString(PyExc_ValueError, e.msg);
        goto out_free;
    }
    if (!(out = PyList_New(n)))
        goto out_free;
    for (unsigned i = 0; i < n; i++) {
        PyObject *t = Py_BuildValue("KIIII", (unsigned long long)en[i].offset,
                                    en[i].t, en[i].h, en[i].w,
                                    en[i].valid_frames);
        if (!t) {
            Py_CLEAR(out);
            break;
        }
        PyList_SetItem(out, i, t); /* steals t; i is in range */
    }
out_free:
    PyMem_Free(en);
out_buf:
    PyBuffer_Release(&buf);
    return out;
}

/* native_size(width, height, rotation, max_side, max_area, patch) ->
 * (w, h): dh_media_native_size, the decoder's own rounding. */
static PyObject *py_native_size(PyObject *mod, PyObject *args)
{
    int w, h, rot, side, patch;
    long long area;
    int32_t ow, oh;

    (void)mod;
    if (!PyArg_ParseTuple(args, "iiiiLi", &w, &h, &rot, &side, &area, &patch))
        return NULL;
    dh_media_native_size(w, h, rot, side, area, patch, &ow, &oh);
    return Py_BuildValue("ii", (int)ow, (int)oh);
}

/* estimate_tokens(kind, width, height, rotation, fps, duration_s, frames,
 * text_bytes, frames_spec, max_frames, size_spec, max_side, max_area,
 * patch, model) -> int: est_tokens as `datahelix probe` computes it
 * (dh_estimate) for one row under another sampling. */
static PyObject *py_estimate_tokens(PyObject *mod, PyObject *args)
{
    const char *kind, *fspec, *sspec, *model;
    int w, h, rot, side, patch;
    long long frames, text_bytes, max_frames, area;
    double fps, dur;
    struct dh_estimator est = {0};
    struct dh_desc d;
    struct dh_err e;
    int64_t tokens;

    (void)mod;
    if (!PyArg_ParseTuple(args, "siiiddLLsLsiLis", &kind, &w, &h, &rot, &fps,
                          &dur, &frames, &text_bytes, &fspec, &max_frames,
                          &sspec, &side, &area, &patch, &model))
        return NULL;
    dh_sample_plan_default(&est.plan);
    dh_cost_model_default(&est.cost);
    dh_err_clear(&e);
    if (dh_sample_plan_parse_frames(fspec, &est.plan, &e) ||
        dh_sample_plan_parse_size(sspec, &est.plan, &e) ||
        dh_token_model_parse(model, &est.tokens, &e))
        return PyErr_Format(PyExc_ValueError, "%s", e.msg);
    est.plan.max_frames = max_frames;
    est.plan.max_side = side;
    est.plan.max_area = area;
    est.plan.patch = patch;
    dh_desc_init(&d);
    d.kind = !strcmp(kind, "image")  ? DH_KIND_IMAGE
             : !strcmp(kind, "text") ? DH_KIND_TEXT
                                     : DH_KIND_VIDEO;
    d.width = w;
    d.height = h;
    d.rotation = rot;
    d.fps = fps;
    d.duration_s = dur;
    d.frames = frames;
    d.bytes = d.kind == DH_KIND_TEXT ? text_bytes : 0;
    dh_estimate(&est, &d);
    /* A caption's tokens: dh_estimate counts strlen(d.text), unset here. */
    tokens = d.est_tokens +
             (d.kind == DH_KIND_TEXT ? 0 : dh_text_tokens(text_bytes));
    dh_desc_fini(&d);
    return PyLong_FromLongLong((long long)tokens);
}

/* In-process `datahelix keygen`: the loader's job key without starting
 * the binary (about 65 ms here, most of it loading FFmpeg's libraries). */
static PyObject *py_keygen(PyObject *self, PyObject *args)
{
    const char *path;
    struct dh_keys k;
    struct dh_err e;
    int rc;

    (void)self;
    if (!PyArg_ParseTuple(args, "s", &path))
        return NULL;
    dh_err_clear(&e);
    Py_BEGIN_ALLOW_THREADS rc = dh__keys_generate(&k, &e);
    if (rc == 0)
        rc = dh__keys_write(path, &k, 0, &e);
    dh__keys_wipe(&k);
    Py_END_ALLOW_THREADS if (rc < 0) return PyErr_Format(
        PyExc_OSError, "datahelix: cannot make the job key: %s", e.msg);
    Py_RETURN_NONE;
}

/* ---- module ---- */

static PyMethodDef module_methods[] = {
    {"schedule", (PyCFunction)(void (*)(void))py_schedule,
     METH_VARARGS | METH_KEYWORDS,
     "schedule(index, world_size, batch_size, rank, epoch=0, seed=0, "
     "balance=0, drop_last=True, subset=None, tokens=None, order=0) -> "
     "(ids, offsets): rank's "
     "sample ids of the epoch's plan, step k = ids[offsets[k]:offsets[k+1]] "
     "(both bytes of native uint64); subset: plan only these ids"},
    {"decode", (PyCFunction)(void (*)(void))py_decode,
     METH_VARARGS | METH_KEYWORDS,
     "decode(path, frames=16, width=224, height=224) -> bytes: the clip's "
     "uniformly sampled frames, centre-cropped, THWC uint8"},
    {"packed_table", py_packed_table, METH_VARARGS,
     "packed_table(buffer, n, elem) -> [(offset, t, h, w, valid_frames)]: "
     "the checked table of a packed (native-size) batch"},
    {"estimate_tokens", py_estimate_tokens, METH_VARARGS,
     "estimate_tokens(kind, width, height, rotation, fps, duration_s, "
     "frames, text_bytes, frames_spec, max_frames, size_spec, max_side, "
     "max_area, patch, model) -> int: the probe's est_tokens of one row "
     "under another sampling"},
    {"native_size", py_native_size, METH_VARARGS,
     "native_size(width, height, rotation, max_side, max_area, patch) -> "
     "(w, h): the decoder's native-size rule"},
    {"keygen", py_keygen, METH_VARARGS,
     "keygen(path): write a new job key (mode 0600), as `datahelix "
     "keygen` does; an existing file is not replaced"},
    {"build_index", py_build_index, METH_VARARGS,
     "build_index(table.jsonl, out.dhx): compile a descriptor table"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    "datahelix._C",
    "datahelix's C core: planning, indexes and the client "
    "(see the datahelix package).",
    -1,
    module_methods,
    NULL,
    NULL,
    NULL,
    NULL,
};

/* The exception types (dhpy.h); the package re-exports them. */
static int add_errors(PyObject *m)
{
    PyObject *both = NULL;
    int rc = -1;

    dhpy_DataError = PyErr_NewExceptionWithDoc(
        "datahelix.DataError",
        "A batch could not be delivered: a step failed (SampleError, "
        "ArenaExhausted), a wait ran out (TimeoutError) or the data plane "
        "failed.",
        PyExc_RuntimeError, NULL);
    if (!dhpy_DataError)
        return -1;
    dhpy_SampleError = PyErr_NewExceptionWithDoc(
        "datahelix.SampleError",
        "A step failed because a sample could not be prepared; the step is "
        "consumed.  Fields: sample_id, path, stage ('read', 'decode', "
        "'watchdog', 'limit', 'memory', 'prepare'; 'dataset' or 'collate' "
        "for a Python dataset), cause (the server's words), code (its "
        "error code), server (the DataServer's id), epoch, step, rank.",
        dhpy_DataError, NULL);
    dhpy_ArenaExhausted = PyErr_NewExceptionWithDoc(
        "datahelix.ArenaExhausted",
        "A step failed because the DataServer's arena stayed full (the "
        "consumer holds too many batches); the step is consumed.  The "
        "fields of SampleError.",
        dhpy_DataError, NULL);
    if (!dhpy_SampleError || !dhpy_ArenaExhausted)
        return -1;
    if (!(both = PyTuple_Pack(2, dhpy_DataError, PyExc_TimeoutError)))
        return -1;
    dhpy_TimeoutError = PyErr_NewExceptionWithDoc(
        "datahelix.TimeoutError",
        "A wait ran out (no batch within the timeout, a service that did "
        "not answer); also a builtins.TimeoutError.",
        both, NULL);
    if (dhpy_TimeoutError &&
        PyModule_AddObjectRef(m, "DataError", dhpy_DataError) == 0 &&
        PyModule_AddObjectRef(m, "SampleError", dhpy_SampleError) == 0 &&
        PyModule_AddObjectRef(m, "ArenaExhausted", dhpy_ArenaExhausted) == 0 &&
        PyModule_AddObjectRef(m, "TimeoutError", dhpy_TimeoutError) == 0)
        rc = 0;
    Py_DECREF(both);
    return rc;
}

PyMODINIT_FUNC PyInit__C(void);

PyMODINIT_FUNC PyInit__C(void)
{
    PyObject *m = PyModule_Create(&module);

    if (!m)
        return NULL;
    if (!dhpy_add_type(m, &index_spec))
        goto fail;
    if (add_errors(m) < 0 ||
        PyModule_AddIntConstant(m, "BALANCE_FIXED", DH_BALANCE_FIXED) < 0 ||
        PyModule_AddIntConstant(m, "BALANCE_FREE", DH_BALANCE_FREE) < 0 ||
        PyModule_AddIntConstant(m, "BALANCE_NONE", DH_BALANCE_NONE) < 0 ||
        PyModule_AddIntConstant(m, "ORDER_ALTERNATE", DH_ORDER_ALTERNATE) < 0 ||
        PyModule_AddIntConstant(m, "ORDER_SORTED", DH_ORDER_SORTED) < 0 ||
        PyModule_AddIntConstant(m, "INDEX_FORMAT_VERSION",
                                DH_INDEX_FORMAT_VERSION) < 0 ||
        dhpy_client_init(m) < 0 || dhpy_pyds_init(m) < 0 ||
        dhpy_sample_init(m) < 0 || dhpy_decode_init(m) < 0 ||
        dhpy_rebalance_init(m) < 0 || dhpy_rblink_init(m) < 0)
        goto fail;
    return m;
fail:
    Py_DECREF(m);
    return NULL;
}
