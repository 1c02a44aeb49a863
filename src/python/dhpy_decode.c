/*
 * dhpy_decode.c - the C media pipeline for a user's own Dataset
 * (python/datahelix/_decode.py wraps it as datahelix.decode; docs/python.md
 * "Decoding in your own Dataset"):
 *
 *   Decoder(threads=1)     one media context, kept across files (so a file
 *                          takes over the previous one's decoder, and a
 *                          shard's file stays open for its next member)
 *   .open(path, member=None, offset=0, size=0) -> info dict
 *   .open_bytes(data, name) -> info dict   (data must stay alive: the
 *                          decoder holds a reference until close/next open)
 *   .prepare(**plan) -> (shape, nbytes)    resolves and selects the frames
 *   .decode_into(buffer) -> result dict    writes nbytes (+ DH_MEDIA_DST_PAD
 *                          of room) into a writable buffer the caller owns
 *   .close()
 *
 * Locking: the GIL; released around the media calls.  One call at a time
 * per Decoder (a `busy` flag refuses a second thread).
 */
#include "python/dhpy.h"

#include <string.h>

#include "datahelix/audio.h"
#include "datahelix/media.h"

typedef struct {
    PyObject_HEAD struct dh_media *m;
    struct dh_media_plan plan; /* the prepared (resolved) plan */
    int64_t *indices;          /* DH_PLAN_INDICES, owned */
    int64_t frames;            /* what decode writes */
    size_t nbytes;
    int opened, prepared, busy;
    PyObject *data; /* open_bytes: kept alive while open */
} DecoderObject;

static int dec_init(DecoderObject *self, PyObject *args, PyObject *kw)
{
    static char *names[] = {"threads", NULL};
    int threads = 1, rc;
    struct dh_err e;

    if (self->m)
        return 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|i", names, &threads))
        return -1;
    if (threads < 0 || threads > 64) {
        PyErr_Format(PyExc_ValueError, "threads %d: 0..64", threads);
        return -1;
    }
    Py_BEGIN_ALLOW_THREADS rc = dh_media_create(&self->m, &e);
    Py_END_ALLOW_THREADS if (rc < 0)
    {
        self->m = NULL;
        dhpy_raise(rc, &e);
        return -1;
    }
    dh_media_set_threads(self->m, threads);
    return 0;
}

static void reset(DecoderObject *self)
{
    if (self->m)
        dh_media_close(self->m);
    PyMem_Free(self->indices);
    self->indices = NULL;
    Py_CLEAR(self->data);
    self->opened = self->prepared = 0;
}

static void dec_dealloc(DecoderObject *self)
{
    reset(self);
    dh_media_destroy(self->m);
    dhpy_free((PyObject *)self);
}

static int usable(DecoderObject *self)
{
    if (!self->m) {
        PyErr_SetString(PyExc_RuntimeError, "Decoder not initialised");
        return 0;
    }
    if (self->busy) {
        PyErr_SetString(PyExc_RuntimeError,
                        "this Decoder is in use by another thread: make one "
                        "per thread");
        return 0;
    }
    return 1;
}

static PyObject *info_dict(DecoderObject *self)
{
    struct dh_media_info i;

    if (dh_media_info(self->m, &i))
        return PyErr_Format(PyExc_RuntimeError, "no file open");
    return Py_BuildValue("{s:s,s:L,s:L,s:i,s:i,s:i,s:d,s:d,s:s}", "kind",
                         dh_kind_name(i.kind), "frames", (long long)i.frames,
                         "keyframes", (long long)i.keyframes, "width", i.width,
                         "height", i.height, "rotation", i.rotation, "fps",
                         i.fps, "duration_s", i.duration_s, "codec", i.codec);
}

static PyObject *opened(DecoderObject *self, int rc, struct dh_err *e)
{
    self->busy = 0;
    if (rc < 0) {
        reset(self);
        return dhpy_raise(rc, e);
    }
    self->opened = 1;
    return info_dict(self);
}

static PyObject *dec_open(DecoderObject *self, PyObject *args, PyObject *kw)
{
    static char *names[] = {"path", "member",   "offset",
                            "size", "mtime_ns", NULL};
    struct dh_source_ref ref = {0};
    long long offset = 0, size = 0, mtime_ns = 0;
    struct dh_err e;
    int rc;

    if (!PyArg_ParseTupleAndKeywords(args, kw, "s|zLLL", names, &ref.path,
                                     &ref.member, &offset, &size, &mtime_ns))
        return NULL;
    if (!usable(self))
        return NULL;
    if (ref.member && (offset < 0 || size <= 0))
        return PyErr_Format(PyExc_ValueError,
                            "%s:%s: a member needs offset >= 0 and size > 0",
                            ref.path, ref.member);
    ref.offset = offset;
    ref.size = size;
    ref.mtime_ns = mtime_ns > 0 ? mtime_ns : 0;
    reset(self);
    self->busy = 1;
    Py_BEGIN_ALLOW_THREADS rc = dh_media_open_ref(self->m, &ref, &e);
    Py_END_ALLOW_THREADS return opened(self, rc, &e);
}

static PyObject *dec_open_bytes(DecoderObject *self, PyObject *args)
{
    PyObject *data;
    const char *name;
    Py_buffer b;
    struct dh_err e;
    int rc;

    if (!PyArg_ParseTuple(args, "Os", &data, &name))
        return NULL;
    if (!usable(self))
        return NULL;
    /* The buffer is released at once but `data` is kept: a bytes object
     * does not move or change while referenced. */
    if (!PyBytes_Check(data))
        return PyErr_Format(PyExc_TypeError, "open_bytes: bytes expected");
    if (PyObject_GetBuffer(data, &b, PyBUF_SIMPLE) < 0)
        return NULL;
    reset(self);
    Py_INCREF(data);
    self->data = data;
    self->busy = 1;
    Py_BEGIN_ALLOW_THREADS rc = dh_media_open_mem(self->m, b.buf, (size_t)b.len,
                                                  name, &e);
    Py_END_ALLOW_THREADS PyBuffer_Release(&b);
    return opened(self, rc, &e);
}

struct names_map {
    const char *name;
    int value;
};

static int pick(const char *what, const char *s, const struct names_map *m,
                int *out)
{
    for (; m->name; m++)
        if (!strcmp(s, m->name)) {
            *out = m->value;
            return 0;
        }
    PyErr_Format(PyExc_ValueError, "%s: unknown value '%s'", what, s);
    return -1;
}

static const struct names_map kinds[] = {
    {"uniform", DH_PLAN_UNIFORM}, {"fps", DH_PLAN_FPS},
    {"indices", DH_PLAN_INDICES}, {"jitter", DH_PLAN_JITTER},
    {"all", DH_PLAN_ALL},         {NULL, 0}};
static const struct names_map geoms[] = {{"crop", DH_GEOM_CROP},
                                         {"stretch", DH_GEOM_STRETCH},
                                         {"random-crop", DH_GEOM_RANDOM_CROP},
                                         {"native", DH_GEOM_NATIVE},
                                         {NULL, 0}};
static const struct names_map layouts[] = {
    {"thwc", DH_LAYOUT_THWC}, {"tchw", DH_LAYOUT_TCHW}, {NULL, 0}};
static const struct names_map dtypes[] = {
    {"uint8", DH_DTYPE_U8}, {"float32", DH_DTYPE_F32}, {NULL, 0}};
static const struct names_map pads[] = {
    {"repeat", DH_PAD_REPEAT}, {"zero", DH_PAD_ZERO}, {NULL, 0}};

/* indices (a sequence of ints) into a PyMem array of *n. */
static int take_indices(PyObject *seq, int64_t **out, int64_t *n)
{
    Py_ssize_t len = PySequence_Size(seq);

    if (len < 0)
        return -1;
    if (len < 1 || len > DH_MEDIA_MAX_FRAMES) {
        PyErr_Format(PyExc_ValueError, "indices: 1..%d of them",
                     DH_MEDIA_MAX_FRAMES);
        return -1;
    }
    if (!(*out = PyMem_Malloc((size_t)len * sizeof(**out)))) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < len; i++) {
        PyObject *it = PySequence_GetItem(seq, i);
        long long v = it ? PyLong_AsLongLong(it) : -1;

        Py_XDECREF(it);
        if (v == -1 && PyErr_Occurred())
            return -1;
        (*out)[i] = v;
    }
    *n = len;
    return 0;
}

static PyObject *dec_prepare(DecoderObject *self, PyObject *args, PyObject *kw)
{
    static char *names[] = {"frames",   "kind",  "fps",        "indices",
                            "seed",     "width", "height",     "geometry",
                            "layout",   "dtype", "pad",        "max_side",
                            "max_area", "patch", "max_pixels", NULL};
    const char *kind = "uniform", *geom = "crop", *layout = "thwc",
               *dtype = "uint8", *pad = "repeat";
    long long frames = 16, max_area = 0, max_pixels = 0;
    unsigned long long seed = 0;
    int w = 224, h = 224, max_side = 0, patch = 0, v;
    double fps = 0;
    PyObject *indices = Py_None;
    struct dh_media_plan p, rp;
    struct dh_media_info info;
    struct dh_err e;
    int rc;

    if (!PyArg_ParseTupleAndKeywords(args, kw, "|LsdOKiissssiLiL", names,
                                     &frames, &kind, &fps, &indices, &seed, &w,
                                     &h, &geom, &layout, &dtype, &pad,
                                     &max_side, &max_area, &patch, &max_pixels))
        return NULL;
    if (!usable(self))
        return NULL;
    if (!self->opened)
        return PyErr_Format(PyExc_RuntimeError, "prepare: no file open");
    dh_media_plan_init(&p);
    PyMem_Free(self->indices);
    self->indices = NULL;
    self->prepared = 0;
    if (pick("kind", kind, kinds, &v))
        return NULL;
    p.kind = (enum dh_plan_kind)v;
    if (pick("geometry", geom, geoms, &v))
        return NULL;
    p.geometry = (enum dh_geometry)v;
    if (pick("layout", layout, layouts, &v))
        return NULL;
    p.layout = (enum dh_layout)v;
    if (pick("dtype", dtype, dtypes, &v))
        return NULL;
    p.dtype = (enum dh_dtype)v;
    if (pick("pad", pad, pads, &v))
        return NULL;
    p.pad = (enum dh_pad)v;
    p.frames = frames;
    if (p.kind == DH_PLAN_INDICES) {
        if (indices == Py_None)
            return PyErr_Format(PyExc_ValueError, "kind 'indices' needs "
                                                  "indices");
        if (take_indices(indices, &self->indices, &p.frames) < 0)
            return NULL;
        p.indices = self->indices;
    }
    p.fps = fps;
    p.seed = seed;
    p.width = w;
    p.height = h;
    p.max_side = max_side;
    p.max_area = max_area;
    p.patch = patch;
    p.max_pixels = max_pixels;
    self->busy = 1;
    Py_BEGIN_ALLOW_THREADS rc = dh_media_info(self->m, &info);
    if (rc == 0)
        rc = dh_media_plan_resolve(&p, &info, &rp, &e);
    else
        dh_err_set(&e, rc, "no file open");
    if (rc == 0)
        rc = dh_media_select(self->m, &rp, &self->frames, &e);
    Py_END_ALLOW_THREADS self->busy = 0;
    if (rc < 0)
        return dhpy_raise(rc, &e);
    self->plan = rp;
    self->nbytes = dh_media_plan_bytes(&rp, self->frames);
    self->prepared = 1;
    if (rp.layout == DH_LAYOUT_THWC)
        return Py_BuildValue("(LiiI)n", (long long)self->frames, rp.height,
                             rp.width, 3u, (Py_ssize_t)self->nbytes);
    return Py_BuildValue("(LIii)n", (long long)self->frames, 3u, rp.height,
                         rp.width, (Py_ssize_t)self->nbytes);
}

static PyObject *dec_decode_into(DecoderObject *self, PyObject *args)
{
    struct dh_media_result res;
    PyObject *idx = NULL, *out = NULL;
    const int64_t *ix;
    Py_buffer b;
    struct dh_err e;
    int rc;

    if (!PyArg_ParseTuple(args, "w*", &b))
        return NULL;
    if (!usable(self) || !self->prepared) {
        PyBuffer_Release(&b);
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_RuntimeError, "decode_into: prepare first");
        return NULL;
    }
    if ((size_t)b.len < self->nbytes + DH_MEDIA_DST_PAD) {
        PyBuffer_Release(&b);
        return PyErr_Format(PyExc_ValueError,
                            "decode_into: a buffer of %zd bytes, the frames "
                            "need %zu + %d",
                            b.len, self->nbytes, DH_MEDIA_DST_PAD);
    }
    self->busy = 1;
    Py_BEGIN_ALLOW_THREADS rc = dh_media_decode(self->m, &self->plan, b.buf,
                                                (size_t)b.len, &res, &e);
    Py_END_ALLOW_THREADS self->busy = 0;
    PyBuffer_Release(&b);
    if (rc < 0)
        return dhpy_raise(rc, &e);
    ix = dh_media_indices(self->m);
    if (!(idx = PyList_New((Py_ssize_t)res.frames)))
        return NULL;
    for (int64_t i = 0; i < res.frames; i++) {
        PyObject *n = PyLong_FromLongLong(ix ? ix[i] : -1);

        if (!n) {
            Py_DECREF(idx);
            return NULL;
        }
        PyList_SetItem(idx, (Py_ssize_t)i, n);
    }
    out = Py_BuildValue("{s:L,s:L,s:L,s:L,s:O}", "frames",
                        (long long)res.frames, "valid_frames",
                        (long long)res.valid_frames, "decoded_frames",
                        (long long)res.decoded_frames, "seeks",
                        (long long)res.seeks, "indices", idx);
    Py_DECREF(idx);
    return out;
}

static PyObject *dec_close(DecoderObject *self, PyObject *noargs)
{
    (void)noargs;
    if (!usable(self))
        return NULL;
    reset(self);
    Py_RETURN_NONE;
}

static PyMethodDef dec_methods[] = {
    {"open", (PyCFunction)(void (*)(void))dec_open,
     METH_VARARGS | METH_KEYWORDS,
     "open(path, member=None, offset=0, size=0) -> info: a file or a shard "
     "member"},
    {"open_bytes", (PyCFunction)dec_open_bytes, METH_VARARGS,
     "open_bytes(data, name) -> info: a file's bytes in memory"},
    {"prepare", (PyCFunction)(void (*)(void))dec_prepare,
     METH_VARARGS | METH_KEYWORDS,
     "prepare(**plan) -> (shape, nbytes): the frames the plan picks"},
    {"decode_into", (PyCFunction)dec_decode_into, METH_VARARGS,
     "decode_into(buffer) -> result: the prepared frames into buffer "
     "(nbytes + 64 of room)"},
    {"close", (PyCFunction)dec_close, METH_NOARGS, "close(): ends the file"},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot dec_slots[] = {
    {Py_tp_doc, (void *)"Decoder(threads=1): the C media pipeline on one "
                        "file at a time (see datahelix.decode)."},
    {Py_tp_new, (void *)PyType_GenericNew},
    {Py_tp_init, (void *)dec_init},
    {Py_tp_dealloc, (void *)dec_dealloc},
    {Py_tp_methods, (void *)dec_methods},
    {0, NULL},
};

static PyType_Spec dec_spec = {
    .name = "datahelix._C.Decoder",
    .basicsize = sizeof(DecoderObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE |
             Py_TPFLAGS_BASETYPE,
    .slots = dec_slots,
};

/* decode_audio(path, member, offset, size, mtime_ns, rate, channels,
 * start, end) -> (bytes, channels, n, start_s): planar float32, channel
 * after channel (issue 38; src/include/datahelix/audio.h). */
static PyObject *py_decode_audio(PyObject *self, PyObject *args)
{
    struct dh_source_ref ref = {0};
    struct dh_audio_opts o = {0};
    struct dh_audio a;
    struct dh_err e;
    long long offset, size, mtime;
    int64_t n;
    PyObject *buf;
    char *p;
    int rc;

    (void)self;
    if (!PyArg_ParseTuple(args, "szLLLiidd", &ref.path, &ref.member, &offset,
                          &size, &mtime, &o.rate, &o.channels, &o.start_s,
                          &o.end_s))
        return NULL;
    ref.offset = offset;
    ref.size = size;
    ref.mtime_ns = mtime > 0 ? mtime : 0;
    Py_BEGIN_ALLOW_THREADS rc = dh_audio_decode(&ref, &o, &a, &e);
    Py_END_ALLOW_THREADS if (rc) return dhpy_raise(rc, &e);
    buf = PyBytes_FromStringAndSize(
        NULL, (Py_ssize_t)(a.n * a.channels * (int64_t)sizeof(float)));
    if (!buf) {
        dh_audio_free(&a);
        return NULL;
    }
    p = PyBytes_AsString(buf);
    for (int c = 0; c < a.channels && a.n > 0; c++)
        memcpy(p + (size_t)c * (size_t)a.n * sizeof(float), a.data[c],
               (size_t)a.n * sizeof(float));
    n = a.n;
    dh_audio_free(&a);
    return Py_BuildValue("(NiLd)", buf, a.channels, (long long)n, a.start_s);
}

/* audio_features(samples, rate, kind, n_fft, hop, n_mels) -> (bytearray,
 * frames): one channel's float32 samples (a C-contiguous buffer) as float32
 * [n_mels, frames] (src/include/datahelix/audio.h). */
static PyObject *py_audio_features(PyObject *self, PyObject *args)
{
    struct dh_audio_features c = {0};
    struct dh_err e;
    Py_buffer in;
    PyObject *out = NULL;
    int64_t n, frames;
    int rate, rc;

    (void)self;
    if (!PyArg_ParseTuple(args, "y*iiiii", &in, &rate, &c.kind, &c.n_fft,
                          &c.hop, &c.n_mels))
        return NULL;
    n = (int64_t)(in.len / (Py_ssize_t)sizeof(float));
    if ((rc = dh_audio_features_check(&c, n, &e)) ||
        (c.kind == DH_AUDIO_NO_FEATURES &&
         (rc = dh_err_set(&e, DH_EINVAL, "audio features: no kind"))))
        goto out;
    frames = dh_audio_feature_frames(&c, n);
    /* a bytearray: writable, so torch.frombuffer() views it as is */
    if (!(out = PyByteArray_FromStringAndSize(
              NULL,
              (Py_ssize_t)((size_t)c.n_mels * (size_t)frames * sizeof(float)))))
        goto out;
    Py_BEGIN_ALLOW_THREADS rc = dh_audio_features(
        (const float *)in.buf, n, rate, &c,
        (float *)(void *)PyByteArray_AsString(out), &e);
    Py_END_ALLOW_THREADS if (rc)
    {
        Py_CLEAR(out);
    }
out:
    PyBuffer_Release(&in);
    if (rc)
        return dhpy_raise(rc, &e);
    return out ? Py_BuildValue("(NL)", out, (long long)frames) : NULL;
}

static PyMethodDef audio_methods[] = {
    {"audio_features", py_audio_features, METH_VARARGS,
     "audio_features(samples, rate, kind, n_fft, hop, n_mels) -> (bytearray, "
     "frames): float32 [n_mels, frames]"},
    {"decode_audio", py_decode_audio, METH_VARARGS,
     "decode_audio(path, member, offset, size, mtime_ns, rate, channels, "
     "start, end) -> (bytes, channels, n, start_s): the source's sound, "
     "planar float32"},
    {NULL, NULL, 0, NULL},
};

int dhpy_decode_init(PyObject *m)
{
    if (!dhpy_add_type(m, &dec_spec) ||
        PyModule_AddFunctions(m, audio_methods) < 0)
        return -1;
    return PyModule_AddIntConstant(m, "MEDIA_DST_PAD", DH_MEDIA_DST_PAD);
}
