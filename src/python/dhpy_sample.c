/*
 * dhpy_sample.c - what a DataLoader with transform= needs from C on the
 * DataServer's Python workers (python/datahelix/_video.py; docs/python.md
 * "transform and collate_fn"):
 *
 *   SampleDecoder(index, frames, width, height, layout, dtype, seed,
 *                 random_crop, fps)
 *                  one clip at a time through the same batch decode the C
 *                  media pool runs (dh_batch_decode with one id: the same
 *                  per-sample plan seed, frame choice, crop and padding of
 *                  the frames a clip lacks), into a writable buffer the
 *                  caller owns, so the transform reads a zero-copy view.
 *   spares(seed, epoch, step, rank, ids, offs, k, want)
 *                  the skip policy's substitutes of step position k
 *                  (datahelix/spare.h), the ones the client would have
 *                  sent with the request.
 *
 * Locking: the GIL; released while a clip decodes.  A SampleDecoder is
 * one media context: one call at a time (a worker is single-threaded).
 */
#include "python/dhpy.h"

#include <string.h>

#include "datahelix/batch.h"
#include "datahelix/index.h"
#include "datahelix/media.h"
#include "datahelix/spare.h"

typedef struct {
    PyObject_HEAD struct dh_index *ix;
    struct dh_media *m;
    struct dh_media_plan plan;
    size_t one; /* bytes of one sample, without DH_MEDIA_DST_PAD */
    int busy;
} DecoderObject;

static int decoder_init(DecoderObject *self, PyObject *args, PyObject *kw)
{
    static char *names[] = {"index",  "frames", "width", "height",
                            "layout", "dtype",  "seed",  "random_crop",
                            "fps",    NULL};
    const char *path, *layout = "THWC", *dtype = "uint8";
    long long frames = 16;
    int w = 224, h = 224, random_crop = 0, rc;
    unsigned long long seed = 0;
    double fps = 0;
    struct dh_err e;

    if (self->ix) {
        PyErr_SetString(PyExc_RuntimeError, "SampleDecoder already open");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kw, "s|LiissKpd", names, &path,
                                     &frames, &w, &h, &layout, &dtype, &seed,
                                     &random_crop, &fps))
        return -1;
    dh_media_plan_init(&self->plan);
    self->plan.frames = frames;
    self->plan.width = w;
    self->plan.height = h;
    if (strcmp(layout, "THWC") && strcmp(layout, "TCHW")) {
        PyErr_Format(PyExc_ValueError, "layout %s: THWC or TCHW", layout);
        return -1;
    }
    if (strcmp(dtype, "uint8") && strcmp(dtype, "float32")) {
        PyErr_Format(PyExc_ValueError, "dtype %s: uint8 or float32", dtype);
        return -1;
    }
    self->plan.layout = strcmp(layout, "TCHW") ? DH_LAYOUT_THWC
                                               : DH_LAYOUT_TCHW;
    self->plan.dtype = strcmp(dtype, "float32") ? DH_DTYPE_U8 : DH_DTYPE_F32;
    self->plan.seed = seed;
    if (random_crop)
        self->plan.geometry = DH_GEOM_RANDOM_CROP;
    if (fps > 0) { /* `frames` is the cap, as the client's plan */
        self->plan.kind = DH_PLAN_FPS;
        self->plan.fps = fps;
    }
    if ((rc = dh_media_plan_check(&self->plan, &e)) < 0 ||
        (self->one = dh_batch_bytes(&self->plan, 1)) == 0 ||
        self->one == SIZE_MAX) {
        if (rc >= 0)
            dh_err_set(&e, DH_EINVAL, "the plan has no frame count or cap");
        dhpy_raise(DH_EINVAL, &e);
        return -1;
    }
    Py_BEGIN_ALLOW_THREADS rc = dh_index_open(path, 0, &self->ix, &e);
    if (rc == 0 && (rc = dh_media_create(&self->m, &e)) < 0) {
        dh_index_close(self->ix);
        self->ix = NULL;
    }
    Py_END_ALLOW_THREADS if (rc < 0)
    {
        self->ix = NULL;
        dhpy_raise(rc, &e);
        return -1;
    }
    return 0;
}

static void decoder_dealloc(DecoderObject *self)
{
    dh_media_destroy(self->m);
    dh_index_close(self->ix);
    dhpy_free((PyObject *)self);
}

/* decode_into(id, epoch, out) -> valid_frames */
static PyObject *decoder_decode_into(DecoderObject *self, PyObject *args)
{
    unsigned long long id, epoch;
    Py_buffer out = {0};
    int32_t valid = 0;
    struct dh_err e;
    uint64_t one_id;
    int rc;

    if (!PyArg_ParseTuple(args, "KKw*", &id, &epoch, &out))
        return NULL;
    if (!self->ix || self->busy) {
        PyBuffer_Release(&out);
        PyErr_SetString(PyExc_RuntimeError, self->ix
                                                ? "decode_into() is already "
                                                  "running on this decoder"
                                                : "SampleDecoder not open");
        return NULL;
    }
    if ((size_t)out.len < self->one + DH_MEDIA_DST_PAD) {
        PyBuffer_Release(&out);
        return PyErr_Format(PyExc_ValueError,
                            "decode_into: a buffer of %zd bytes, a sample "
                            "needs %zu + %d",
                            out.len, self->one, DH_MEDIA_DST_PAD);
    }
    one_id = id;
    self->busy = 1;
    Py_BEGIN_ALLOW_THREADS rc = dh_batch_decode(
        self->m, self->ix, epoch, &one_id, 1, &self->plan, out.buf,
        (size_t)out.len, &valid, NULL, &e);
    Py_END_ALLOW_THREADS self->busy = 0;
    PyBuffer_Release(&out);
    if (rc < 0)
        return dhpy_raise_code(rc, &e);
    return PyLong_FromLong(valid);
}

static PyObject *decoder_nbytes(DecoderObject *self, void *closure)
{
    (void)closure;
    return PyLong_FromSize_t(self->one);
}

static PyMethodDef decoder_methods[] = {
    {"decode_into", (PyCFunction)decoder_decode_into, METH_VARARGS,
     "decode_into(id, epoch, out) -> valid_frames: sample `id` of `epoch` "
     "into the writable buffer `out` (at least nbytes + pad bytes), as the "
     "C media pool decodes it into a batch's slice"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef decoder_getset[] = {
    {"nbytes", (getter)decoder_nbytes, NULL, "bytes of one sample", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot decoder_slots[] = {
    {Py_tp_doc,
     (void *)"SampleDecoder(index, frames=16, width=224, height=224, "
             "layout='THWC', dtype='uint8', seed=0, random_crop=False, "
             "fps=0): one clip at a time, as the media pool decodes it"},
    {Py_tp_new, (void *)PyType_GenericNew},
    {Py_tp_init, (void *)decoder_init},
    {Py_tp_dealloc, (void *)decoder_dealloc},
    {Py_tp_methods, (void *)decoder_methods},
    {Py_tp_getset, (void *)decoder_getset},
    {0, NULL},
};

static PyType_Spec decoder_spec = {
    .name = "datahelix._C.SampleDecoder",
    .basicsize = sizeof(DecoderObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = decoder_slots,
};

/* spares(seed, epoch, step, rank, ids, offs, k, want) -> bytes */
static PyObject *py_spares(PyObject *self, PyObject *args)
{
    unsigned long long seed, epoch, step, k;
    unsigned rank, want, n;
    Py_buffer ids = {0}, offs = {0};
    uint64_t *out;
    PyObject *res = NULL;

    (void)self;
    if (!PyArg_ParseTuple(args, "KKKIy*y*KI", &seed, &epoch, &step, &rank, &ids,
                          &offs, &k, &want))
        return NULL;
    if (ids.len % 8 || offs.len % 8 || offs.len < 16 ||
        k >= (unsigned long long)offs.len / 8 - 1 || want > 4096) {
        PyErr_SetString(PyExc_ValueError,
                        "spares: ids and offs are native uint64 bytes, "
                        "k a step of offs, want <= 4096");
        goto cleanup;
    }
    {
        const uint64_t *o = offs.buf;
        uint64_t n_steps = (uint64_t)offs.len / 8 - 1;

        if (o[n_steps] > (uint64_t)ids.len / 8) {
            PyErr_SetString(PyExc_ValueError, "spares: offs run past ids");
            goto cleanup;
        }
        if (!(out = PyMem_Malloc(((size_t)want + 1) * sizeof(*out)))) {
            PyErr_NoMemory();
            goto cleanup;
        }
        n = dh_spare_choose(seed, epoch, step, rank, ids.buf, o, n_steps, k,
                            want, out);
        res = PyBytes_FromStringAndSize((const char *)out, (Py_ssize_t)n * 8);
        PyMem_Free(out);
    }
cleanup:
    PyBuffer_Release(&ids);
    PyBuffer_Release(&offs);
    return res;
}

static PyMethodDef sample_methods[] = {
    {"spares", py_spares, METH_VARARGS,
     "spares(seed, epoch, step, rank, ids, offs, k, want) -> bytes: the "
     "skip policy's substitutes of step position k (native uint64), as "
     "the client chooses them (datahelix/spare.h)"},
    {NULL, NULL, 0, NULL},
};

int dhpy_sample_init(PyObject *m)
{
    if (!dhpy_add_type(m, &decoder_spec) ||
        PyModule_AddIntConstant(m, "MEDIA_DST_PAD", DH_MEDIA_DST_PAD) < 0)
        return -1;
    return PyModule_AddFunctions(m, sample_methods);
}
