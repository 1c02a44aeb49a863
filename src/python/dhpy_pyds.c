/*
 * dhpy_pyds.c - what datahelix.DistributedDataLoader needs from C
 * (docs/python.md "DistributedDataLoader"):
 *
 *   Arena(fd)      a DataServer Python worker's view of its server's arena
 *                  (the memfd inherited at spawn, src/include/datahelix/arena.h):
 *                  alloc() a slot, view() it as a writable memoryview,
 *                  release() it.  The arena is process-shared and
 *                  thread-safe; a slot's reference passes to the client
 *                  with the notice the server sends for it.
 *   python_index() the .dhx index of a Python dataset: one row per index,
 *                  path "NAME[i]" (so errors name the sample), est_cpu_ms
 *                  from the dataset's cost estimates (the client sums them
 *                  into each request's hints for the cost model).
 *
 * Locking: the GIL; released while alloc() waits for space and while the
 * index is written.
 */
#include "python/dhpy.h"

#include <stdio.h>
#include <string.h>

#include "datahelix/arena.h"
#include "datahelix/index.h"
#include "datahelix/table.h"

/* ---- Arena ---- */

typedef struct {
    PyObject_HEAD struct dh_arena *a;
} ArenaObject;

/* A slot's bytes, exported writable with the buffer protocol; holds the
 * Arena so that the mapping outlives every view. */
typedef struct {
    PyObject_HEAD ArenaObject *arena;
    void *p;
    Py_ssize_t len;
} SlotViewObject;

static int arena_init(ArenaObject *self, PyObject *args, PyObject *kw)
{
    static char *names[] = {"fd", NULL};
    int fd, rc;
    struct dh_err e;

    if (!PyArg_ParseTupleAndKeywords(args, kw, "i", names, &fd))
        return -1;
    if (self->a) {
        PyErr_SetString(PyExc_RuntimeError, "Arena already attached");
        return -1;
    }
    if ((rc = dh_arena_attach(fd, &self->a, &e)) < 0) {
        self->a = NULL;
        dhpy_raise_code(rc, &e);
        return -1;
    }
    return 0;
}

static void arena_dealloc(ArenaObject *self)
{
    dh_arena_destroy(self->a);
    dhpy_free((PyObject *)self);
}

static int arena_ready(const ArenaObject *self)
{
    if (!self->a) {
        PyErr_SetString(PyExc_ValueError, "the arena is not attached");
        return -1;
    }
    return 0;
}

/* alloc(nbytes, timeout_ms) -> (offset, len, gen) */
static PyObject *arena_alloc(ArenaObject *self, PyObject *args)
{
    unsigned long long n;
    int timeout_ms, rc;
    struct dh_slot_ref r;
    struct dh_err e;

    if (arena_ready(self) < 0 || !PyArg_ParseTuple(args, "Ki", &n, &timeout_ms))
        return NULL;
    Py_BEGIN_ALLOW_THREADS rc = dh_arena_alloc(self->a, (size_t)n, timeout_ms,
                                               &r, &e);
    Py_END_ALLOW_THREADS if (rc < 0) return dhpy_raise_code(rc, &e);
    return Py_BuildValue("(KKI)", (unsigned long long)r.offset,
                         (unsigned long long)r.len, (unsigned)r.gen);
}

static int parse_ref(PyObject *args, struct dh_slot_ref *r)
{
    unsigned long long off, len;
    unsigned gen;

    if (!PyArg_ParseTuple(args, "KKI", &off, &len, &gen))
        return -1;
    *r = (struct dh_slot_ref){.offset = off, .len = len, .gen = gen};
    return 0;
}

/* A heap type (dhpy_pyds_init), not in the module: only view() makes one. */
static PyTypeObject *SlotViewType;

/* view(offset, len, gen) -> writable memoryview of the live slot */
static PyObject *arena_view(ArenaObject *self, PyObject *args)
{
    struct dh_slot_ref r;
    SlotViewObject *v;
    PyObject *mv;
    void *p;

    if (arena_ready(self) < 0 || parse_ref(args, &r) < 0)
        return NULL;
    if (!(p = dh_arena_ptr(self->a, &r)) || r.len > PY_SSIZE_T_MAX)
        return PyErr_Format(PyExc_ValueError,
                            "slot (offset %llu, %llu "
                            "bytes, generation %u) is not live",
                            (unsigned long long)r.offset,
                            (unsigned long long)r.len, r.gen);
    if (!(v = PyObject_New(SlotViewObject, SlotViewType)))
        return NULL;
    Py_INCREF((PyObject *)self);
    v->arena = self;
    v->p = p;
    v->len = (Py_ssize_t)r.len;
    mv = PyMemoryView_FromObject((PyObject *)v);
    Py_DECREF(v);
    return mv;
}

static PyObject *arena_release(ArenaObject *self, PyObject *args)
{
    struct dh_slot_ref r;
    struct dh_err e;
    int rc;

    if (arena_ready(self) < 0 || parse_ref(args, &r) < 0)
        return NULL;
    if ((rc = dh_arena_release(self->a, &r, &e)) < 0)
        return dhpy_raise_code(rc, &e);
    Py_RETURN_NONE;
}

static PyObject *arena_capacity(ArenaObject *self, void *unused)
{
    struct dh_arena_stats st;

    (void)unused;
    if (arena_ready(self) < 0)
        return NULL;
    if (dh_arena_stats(self->a, &st) < 0) {
        PyErr_SetString(PyExc_TimeoutError, "arena lock stuck");
        return NULL;
    }
    return PyLong_FromUnsignedLongLong(st.capacity);
}

static PyMethodDef arena_methods[] = {
    {"alloc", (PyCFunction)arena_alloc, METH_VARARGS,
     "alloc(nbytes, timeout_ms) -> (offset, len, gen): a slot holding one "
     "reference; waits for space up to timeout_ms (datahelix.ArenaExhausted "
     "after)"},
    {"view", (PyCFunction)arena_view, METH_VARARGS,
     "view(offset, len, gen) -> writable memoryview of a live slot"},
    {"release", (PyCFunction)arena_release, METH_VARARGS,
     "release(offset, len, gen): drop one reference"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef arena_getset[] = {
    {"capacity", (getter)arena_capacity, NULL, "bytes of the data area", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot arena_slots[] = {
    {Py_tp_doc, (void *)"Arena(fd): attach a DataServer's arena (a memfd) to "
                        "write slots (DataServer Python workers)."},
    {Py_tp_new, (void *)PyType_GenericNew},
    {Py_tp_init, (void *)arena_init},
    {Py_tp_dealloc, (void *)arena_dealloc},
    {Py_tp_methods, (void *)arena_methods},
    {Py_tp_getset, (void *)arena_getset},
    {0, NULL},
};

static PyType_Spec arena_spec = {
    .name = "datahelix._C.Arena",
    .basicsize = sizeof(ArenaObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = arena_slots,
};

static void slotview_dealloc(SlotViewObject *self)
{
    Py_XDECREF((PyObject *)self->arena);
    dhpy_free((PyObject *)self);
}

static int slotview_getbuffer(SlotViewObject *self, Py_buffer *view, int flags)
{
    return PyBuffer_FillInfo(view, (PyObject *)self, self->p, self->len, 0,
                             flags);
}

static PyType_Slot slotview_slots[] = {
    {Py_tp_doc, (void *)"A slot's bytes (buffer protocol); see Arena.view()."},
    {Py_tp_dealloc, (void *)slotview_dealloc},
    {Py_bf_getbuffer, (void *)slotview_getbuffer},
    {0, NULL},
};

static PyType_Spec slotview_spec = {
    .name = "datahelix._C.SlotView",
    .basicsize = sizeof(SlotViewObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE |
             Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = slotview_slots,
};

/* ---- python_index ---- */

static int build_index(const char *path, uint64_t n, const double *cost,
                       const char *name, struct dh_err *e)
{
    struct dh_index_builder *b = NULL;
    struct dh_desc d;
    char p[160];
    int rc;

    if ((rc = dh_index_builder_create(&b, e)) < 0)
        return rc;
    dh_desc_init(&d);
    d.kind = DH_KIND_TEXT;
    d.path = p; /* borrowed: the builder copies it; never fini'ed */
    for (uint64_t i = 0; i < n && rc == 0; i++) {
        d.id = (int64_t)i;
        snprintf(p, sizeof(p), "%.120s[%llu]", name, (unsigned long long)i);
        d.est_cpu_ms = cost && cost[i] > 0 ? cost[i] : 0;
        rc = dh_index_builder_add(b, &d, e);
    }
    if (rc == 0)
        rc = dh_index_builder_finish(b, path, e);
    dh_index_builder_destroy(b);
    return rc;
}

/* python_index(path, n, est_cpu_ms=None, name="dataset") */
static PyObject *py_python_index(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *names[] = {"path", "n", "est_cpu_ms", "name", NULL};
    const char *path, *name = "dataset";
    unsigned long long n;
    Py_buffer cost = {0};
    struct dh_err e;
    int rc;

    (void)self;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "sK|z*s", names, &path, &n,
                                     &cost, &name))
        return NULL;
    if (n < 1 || n >= (unsigned long long)DH_TABLE_ID_MAX ||
        (cost.buf && (size_t)cost.len != n * sizeof(double))) {
        PyBuffer_Release(&cost);
        return PyErr_Format(PyExc_ValueError,
                            "python_index: %llu samples "
                            "(1..2^32-1), est_cpu_ms must be n native "
                            "doubles",
                            n);
    }
    Py_BEGIN_ALLOW_THREADS rc = build_index(path, n, cost.buf, name, &e);
    Py_END_ALLOW_THREADS PyBuffer_Release(&cost);
    if (rc < 0)
        return dhpy_raise(rc, &e);
    Py_RETURN_NONE;
}

static PyMethodDef pyds_functions[] = {
    {"python_index", (PyCFunction)(void (*)(void))py_python_index,
     METH_VARARGS | METH_KEYWORDS,
     "python_index(path, n, est_cpu_ms=None, name='dataset'): write the "
     ".dhx index of a Python dataset of n samples (est_cpu_ms: n native "
     "doubles, or None for 0: unknown)"},
    {NULL, NULL, 0, NULL},
};

int dhpy_pyds_init(PyObject *m)
{
    if (!dhpy_add_type(m, &arena_spec) ||
        !(SlotViewType = (PyTypeObject *)PyType_FromSpec(&slotview_spec)) ||
        PyModule_AddFunctions(m, pyds_functions) < 0)
        return -1;
    return 0;
}
