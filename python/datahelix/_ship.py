"""Shipping a loader's dataset (and collate_fn, worker_init_fn, transform)
to the Python workers of the DataServer this same user started: the
dataset file (datahelix._worker load_config).  Pickled with cloudpickle,
so classes and functions of __main__, lambdas and closures travel by
value, as torch's fork-based workers would see them; plain pickle where
cloudpickle is not installed.  Only this direction is pickled: batches
come back in the slot format (datahelix._slot), never unpickled.

What cannot be pickled is named by its place: "dataset.handle (a
_thread.lock)", found by walking the object's attributes and items
(culprit) once the whole has failed.
"""
import pickle
import sys

_MAX_DEPTH = 12
_MAX_VISITS = 20000


def _dumps():
    try:
        import cloudpickle
        return cloudpickle.dumps, "cloudpickle"
    except ImportError:
        return (lambda o: pickle.dumps(o, protocol=5)), "pickle"


def _children(obj):
    """(label, child) pairs of a container or an object's attributes."""
    if isinstance(obj, dict):
        return [(f"[{k!r}]", v) for k, v in list(obj.items())[:1000]]
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [(f"[{i}]", v) for i, v in enumerate(list(obj)[:1000])]
    out = []
    d = getattr(obj, "__dict__", None)
    if isinstance(d, dict):
        out += [(f".{k}", v) for k, v in d.items()]
    for k in getattr(type(obj), "__slots__", ()) or ():
        if isinstance(k, str) and hasattr(obj, k):
            out.append((f".{k}", getattr(obj, k)))
    code = getattr(obj, "__code__", None)  # a function: its closure
    if code is not None and getattr(obj, "__closure__", None):
        for name, cell in zip(code.co_freevars, obj.__closure__):
            try:
                out.append((f"<closure {name}>", cell.cell_contents))
            except ValueError:  # an empty cell
                pass
    return out


def culprit(obj, path, dumps):
    """The deepest place under `obj` (named from `path`) that cannot be
    pickled, with its type: "dataset.files[2].fh (a _io.BufferedReader)";
    `path` itself when no part of it is to blame."""
    seen = set()

    def bad(o):
        try:
            dumps(o)
            return False
        except Exception:
            return True
        except RecursionError:
            return True

    def walk(o, p, depth):
        if depth >= _MAX_DEPTH or len(seen) > _MAX_VISITS:
            return p, o
        seen.add(id(o))
        for label, child in _children(o):
            if id(child) in seen:
                continue
            if bad(child):
                return walk(child, p + label, depth + 1)
        return p, o

    p, o = walk(obj, path, 0)
    t = type(o)
    return f"{p} (a {t.__module__}.{t.__qualname__})"


def fork_only_file_bytes(why):
    """The dataset file of a dataset that cannot be pickled, whose workers
    fork from the fork server and inherit it (as torch's forked workers
    do): a worker that must load it from the file (its fork server gone)
    fails saying so, with `why` (dataset_file_bytes' TypeError)."""
    return pickle.dumps({"version": 1, "sys_path": list(sys.path),
                         "payload": None, "unpicklable": why}, protocol=5)


def dataset_file_bytes(inner, why):
    """A DataServer Python worker's dataset file: `inner` (a dict of named
    parts) pickled with cloudpickle when installed, else pickle.  `why`
    begins the TypeError for what cannot be pickled, which names the
    attribute to blame."""
    dumps, how = _dumps()
    try:
        blob = dumps(inner)
    except Exception as e:
        where = "it"
        for k, v in inner.items():
            try:
                dumps(v)
            except Exception:
                where = culprit(v, k, dumps)
                break
        raise TypeError(f"{why}, so they must be picklable ({how}): "
                        f"{where} cannot be: {type(e).__name__}: {e}") \
            from e
    return pickle.dumps({"version": 1, "sys_path": list(sys.path),
                         "payload": blob, "pickler": how}, protocol=5)
