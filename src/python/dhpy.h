/*
 * dhpy.h - the CPython extension `datahelix._C` (python/datahelix/ is the
 * package around it; docs/python.md): types and helpers shared by
 * dhpy_module.c (module functions, Index) and dhpy_client.c (Client,
 * Batch, Part).
 *
 * Locking: the GIL, released around every call that may wait (next(),
 * create, close, planning).  A Client refuses a second concurrent next().
 */
#ifndef DH_PYTHON_DHPY_H
#define DH_PYTHON_DHPY_H

/* The stable ABI (abi3): one build of the extension loads on every CPython
 * from 3.11 on (docs/bundle.md).  3.11 is the first whose limited API has
 * the buffer protocol (Py_buffer, Py_bf_getbuffer) that Part and SlotView
 * need.  The build defines it too; this keeps a stray compile honest. */
#ifndef Py_LIMITED_API
#define Py_LIMITED_API 0x030B0000
#endif
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "datahelix/error.h"

/* datahelix._C.DataError: a sample failed, or the data plane did; its
 * subclasses SampleError (a step failed by a sample: fields sample_id,
 * path, stage, cause, code, server, epoch, step, rank), ArenaExhausted
 * (a step failed for want of arena room: the same fields) and
 * TimeoutError (a wait ran out; also a builtins.TimeoutError). */
extern PyObject *dhpy_DataError, *dhpy_SampleError, *dhpy_ArenaExhausted,
    *dhpy_TimeoutError;

/* Raises the Python exception for code `rc` with e's message: TimeoutError
 * for DH_ETIMEOUT, MemoryError, ValueError for DH_EINVAL, OSError for
 * DH_ENOTFOUND / DH_EIO, else DataError.  Returns NULL. */
PyObject *dhpy_raise(int rc, const struct dh_err *e);

/* dhpy_raise(), and sets the exception's `code` attribute to rc (the
 * DH_E* code a caller can report, as the C pool's notices carry it). */
PyObject *dhpy_raise_code(int rc, const struct dh_err *e);

/* A heap type made from `spec` (the limited API has no static types) and
 * added to `m` under the name after the spec's last dot.  Returns the type
 * (a reference the caller keeps for the process's life: the module is
 * single-phase and never unloaded), or NULL with an exception set. */
PyTypeObject *dhpy_add_type(PyObject *m, PyType_Spec *spec);

/* The last step of every tp_dealloc here: the type's tp_free (read with
 * PyType_GetSlot: PyTypeObject is opaque in the limited API), then the
 * reference each instance of a heap type holds on its type. */
void dhpy_free(PyObject *self);

/* Adds the Client, Batch and Part types to `m`; -1 on error. */
int dhpy_client_init(PyObject *m);

/* Adds Arena and python_index() (dhpy_pyds.c: what DistributedDataLoader
 * and its DataServer workers need); -1 on error. */
int dhpy_pyds_init(PyObject *m);

/* Adds SampleDecoder, spares() and MEDIA_DST_PAD (dhpy_sample.c: what a
 * DataLoader's transform= runs on the DataServer's Python workers); -1 on
 * error. */
int dhpy_sample_init(PyObject *m);
/* Registers Decoder (dhpy_decode.c); 0 or -1 with an exception. */
int dhpy_decode_init(PyObject *m);

/* Adds rebalance() (dhpy_rebalance.c: Tier-2's gate and planner for
 * _rebalance.py); -1 on error. */
int dhpy_rebalance_init(PyObject *m);

/* Adds RbLink (dhpy_rblink.c: Tier 2's ZeroMQ exchange without a process
 * group); -1 on error. */
int dhpy_rblink_init(PyObject *m);

#endif
