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

/* Adds the Client, Batch and Part types to `m`; -1 on error. */
int dhpy_client_init(PyObject *m);

/* Adds Arena and python_index() (dhpy_pyds.c: what DistributedDataLoader
 * and its DataServer workers need); -1 on error. */
int dhpy_pyds_init(PyObject *m);

/* Adds SampleDecoder, spares() and MEDIA_DST_PAD (dhpy_sample.c: what a
 * DataLoader's transform= runs on the DataServer's Python workers); -1 on
 * error. */
int dhpy_sample_init(PyObject *m);

#endif
