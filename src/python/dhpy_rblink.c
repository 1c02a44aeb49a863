/*
 * dhpy_rblink.c - datahelix._C.RbLink: Tier 2's ZeroMQ exchange
 * (datahelix/rb_link.h) for _rebalance.py when there is no
 * torch.distributed process group.  Thin: argument checks and buffer
 * lifetimes; the GIL is released while the exchange waits.  Each link owns
 * its ZeroMQ context (terminated after the sockets close).
 */
#include "python/dhpy.h"

#include <stdint.h>
#include <string.h>
#include <zmq.h>

#include "core/alloc.h"
#include "datahelix/rb_link.h"

typedef struct {
    PyObject_HEAD void *ctx;
    struct dh_rb_link *link;
    uint32_t n;
} RbLinkObject;

static void link_close(RbLinkObject *self)
{
    dh_rb_link_destroy(self->link);
    self->link = NULL;
    if (self->ctx)
        zmq_ctx_term(self->ctx);
    self->ctx = NULL;
}

/* addrs (a list of str) as n borrowed UTF-8 pointers into out[]. */
static int read_addrs(PyObject *list, const char **out, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *s = PyList_GetItem(list, i);

        if (!s || !PyUnicode_Check(s) ||
            !(out[i] = PyUnicode_AsUTF8AndSize(s, NULL))) {
            PyErr_SetString(PyExc_TypeError, "RbLink: addrs must be a list "
                                             "of str");
            return -1;
        }
    }
    return 0;
}

static int link_init(RbLinkObject *self, PyObject *args, PyObject *kw)
{
    static char *names[] = {"addrs", "me", NULL};
    PyObject *list;
    unsigned me;
    const char **addrs = NULL;
    struct dh_err e = {0};
    Py_ssize_t n;
    int rc = -1;

    if (!PyArg_ParseTupleAndKeywords(args, kw, "O!I", names, &PyList_Type,
                                     &list, &me))
        return -1;
    if (self->link) {
        PyErr_SetString(PyExc_RuntimeError, "RbLink already open");
        return -1;
    }
    n = PyList_Size(list);
    if (n < 1 || n > 1024) {
        PyErr_SetString(PyExc_ValueError, "RbLink: 1 to 1024 addresses");
        return -1;
    }
    if (!(addrs = dh__calloc((size_t)n, sizeof(*addrs)))) {
        PyErr_NoMemory();
        return -1;
    }
    if (read_addrs(list, addrs, n) < 0)
        goto out;
    if (!(self->ctx = zmq_ctx_new())) {
        PyErr_SetString(PyExc_OSError, "RbLink: no ZeroMQ context");
        goto out;
    }
    self->n = (uint32_t)n;
    if ((rc = dh_rb_link_create(self->ctx, addrs, (uint32_t)n, me, &self->link,
                                &e)) != 0) {
        link_close(self);
        dhpy_raise_code(rc, &e);
        rc = -1;
    }
out:
    dh__free(addrs);
    return rc;
}

static void link_dealloc(RbLinkObject *self)
{
    link_close(self);
    dhpy_free((PyObject *)self);
}

/* A list of n non-negative ints into out[]; their sum into *sum. */
static int read_split(PyObject *list, uint32_t n, uint64_t *out, uint64_t *sum)
{
    if (!PyList_Check(list) || PyList_Size(list) != (Py_ssize_t)n) {
        PyErr_Format(PyExc_ValueError,
                     "RbLink: a split is a list of %u "
                     "ints",
                     n);
        return -1;
    }
    *sum = 0;
    for (uint32_t i = 0; i < n; i++) {
        unsigned long long v = PyLong_AsUnsignedLongLong(
            PyList_GetItem(list, i));

        if (PyErr_Occurred())
            return -1;
        out[i] = v;
        *sum += v;
    }
    return 0;
}

static PyObject *link_exchange(RbLinkObject *self, PyObject *args)
{
    unsigned long long round;
    Py_buffer send = {0};
    PyObject *ss, *rs, *out = NULL;
    uint64_t *split = NULL, stot, rtot;
    int timeout_ms, rc;
    struct dh_err e = {0};
    void *recv = NULL;

    if (!PyArg_ParseTuple(args, "Ky*OOi", &round, &send, &ss, &rs, &timeout_ms))
        return NULL;
    if (!self->link) {
        PyErr_SetString(PyExc_ValueError, "RbLink is closed");
        goto out;
    }
    if (!(split = dh__calloc(2 * (size_t)self->n, sizeof(*split)))) {
        PyErr_NoMemory();
        goto out;
    }
    if (read_split(ss, self->n, split, &stot) < 0 ||
        read_split(rs, self->n, split + self->n, &rtot) < 0)
        goto out;
    if (stot > (uint64_t)send.len) {
        PyErr_Format(PyExc_ValueError,
                     "RbLink: the send split adds to "
                     "%llu bytes, the buffer has %zd",
                     (unsigned long long)stot, send.len);
        goto out;
    }
    if (!(recv = dh__malloc(rtot ? rtot : 1))) {
        PyErr_NoMemory();
        goto out;
    }
    Py_BEGIN_ALLOW_THREADS rc = dh_rb_link_exchange(
        self->link, round, send.buf, split, recv, split + self->n, timeout_ms,
        &e);
    Py_END_ALLOW_THREADS if (rc != 0) dhpy_raise_code(rc, &e);
    else out = PyBytes_FromStringAndSize(recv, (Py_ssize_t)rtot);
out:
    dh__free(recv);
    dh__free(split);
    PyBuffer_Release(&send);
    return out;
}

static PyObject *link_close_py(RbLinkObject *self, PyObject *noargs)
{
    (void)noargs;
    link_close(self);
    Py_RETURN_NONE;
}

static PyMethodDef link_methods[] = {
    {"exchange", (PyCFunction)link_exchange, METH_VARARGS,
     "exchange(round, send, send_split, recv_split, timeout_ms) -> bytes: "
     "one all_to_all over the link (datahelix/rb_link.h); send_split[j] "
     "bytes of send go to rank j in rank order, the result holds "
     "recv_split[s] bytes from every rank s in rank order"},
    {"close", (PyCFunction)link_close_py, METH_NOARGS,
     "close(): the sockets and the context"},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot link_slots[] = {
    {Py_tp_doc, (void *)"RbLink(addrs, me): Tier 2's ZeroMQ exchange among "
                        "len(addrs) ranks; binds addrs[me]."},
    {Py_tp_new, (void *)PyType_GenericNew},
    {Py_tp_init, (void *)link_init},
    {Py_tp_dealloc, (void *)link_dealloc},
    {Py_tp_methods, (void *)link_methods},
    {0, NULL},
};

static PyType_Spec link_spec = {
    .name = "datahelix._C.RbLink",
    .basicsize = sizeof(RbLinkObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = link_slots,
};

int dhpy_rblink_init(PyObject *m)
{
    return dhpy_add_type(m, &link_spec) ? 0 : -1;
}
