"""How a Python batch lies in an arena slot: written by a DataServer's
Python worker (datahelix._worker), read by the rank's
DistributedDataLoader without a copy (docs/python.md "DistributedDataLoader",
"The slot format").

    slot = MAGIC "DHPYSLT2" (8 bytes) | meta length (u64, little-endian)
           | meta (JSON, UTF-8) | padding to 64 | data

    meta = {"v": 2, "kind": "batch", "root": NODE,
            "tensors": [[dtype, shape, offset, nbytes], ...],
            "arrays":  [[dtype, shape, offset, nbytes], ...],
            "bytes":   [[offset, nbytes], ...]}
        or {"v": 2, "kind": "error", "name", "module", "qualname",
            "message", "traceback", "worker_id", "pid", "sample", "where"}
        or {"v": 2, "kind": "end", "worker_id"}   an IterableDataset
            worker's stream is exhausted (no batch for this step)
    A batch of an IterableDataset step may carry "state": NODE (its
    worker's dataset.state_dict() after the batch: the loader's resume).

    NODE = null | true | false | a JSON number | a JSON string
         | {"l": [NODE...]}            a list
         | {"t": [NODE...]}            a tuple
         | {"nt": name, "f": [field...], "v": [NODE...]}   a namedtuple
           (and "m": module, "q": qualname: its class, when loaded)
         | {"d": [[KEY, NODE]...]}     a dict (KEY: a NODE of a hashable)
         | {"T": k}  torch tensor k    | {"N": k}  numpy array k
         | {"S": k}  numpy scalar (array k, 0-d)  | {"B": k}  bytes k

Offsets are relative to the data start and 64-aligned.  Nothing here can
run code: the metadata is parsed by the json module, a namedtuple is its
own class when the reading process has already loaded that module (found
by dict lookups in sys.modules, never imported, and only if it is a
namedtuple of the same name and fields), else rebuilt by name and field
names with collections.namedtuple; dtypes come from an allow-list, and every offset,
length, shape, count and depth is checked against the slot before a view
is made.  A tensor or array is a view of the slot itself
(torch.frombuffer / numpy.frombuffer); bytes are copied (they are
immutable).  What the format cannot carry fails in the worker, naming its
place in the batch (batch["meta"][2]: type Foo).
"""
import collections
import json
import keyword
import sys
import traceback

import torch

MAGIC = b"DHPYSLT2"
VERSION = 2
ALIGN = 64
MAX_DEPTH = 64            # containers inside containers
MAX_NODES = 1 << 20       # values in one batch
MAX_BUFFERS = 1 << 16     # tensors + arrays + bytes in one batch
MAX_DIMS = 32
MAX_META = 32 << 20       # bytes of JSON
MAX_TEXT = 1 << 20        # an error's traceback / message, characters
MAX_NAME = 256            # a namedtuple's or a field's name
MAX_FIELDS = 4096         # a namedtuple's fields

ALLOWED = ("None, bool, int, float, str, bytes, torch.Tensor (strided), "
           "numpy.ndarray / numpy scalar of a numeric or bool dtype, and "
           "dict / list / tuple / namedtuple of these")

# dtype name in the slot -> torch dtype (what torch of this process has).
_TORCH = {n: getattr(torch, n) for n in (
    "bool", "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32",
    "uint64", "float16", "bfloat16", "float32", "float64", "complex64",
    "complex128") if isinstance(getattr(torch, n, None), torch.dtype)}
_TORCH_NAME = {v: k for k, v in _TORCH.items()}
_TORCH_SIZE = {k: torch.empty((), dtype=v).element_size()
               for k, v in _TORCH.items()}
# numpy dtype names allowed (native little-endian, numeric or bool).
_NUMPY = ("bool", "uint8", "int8", "uint16", "int16", "uint32", "int32",
          "uint64", "int64", "float16", "float32", "float64", "complex64",
          "complex128")


class SlotError(ValueError):
    """A slot that is not a well-formed Python batch (the cause in the
    message)."""


class EncodeError(TypeError):
    """A batch the format cannot carry (its place and type named)."""


def _align(n):
    return (n + ALIGN - 1) & ~(ALIGN - 1)


def _np():
    return sys.modules.get("numpy")


# ---- writing ---------------------------------------------------------------


def _path(path):
    """batch['meta'][2] for the chain (((None, "[]", 'meta'), "[]", 2)):
    places are formatted only for an error message."""
    parts = []
    while path is not None:
        path, how, key = path
        parts.append(f"[{key!r}]" if how == "[]" else f".{key}")
    return "batch" + "".join(reversed(parts))


def _is_namedtuple(obj):
    f = getattr(type(obj), "_fields", None)
    return isinstance(obj, tuple) and isinstance(f, tuple) and \
        all(isinstance(x, str) for x in f)


def _nt_names_ok(name, fields):
    """What collections.namedtuple(name, fields) accepts (and the reader
    rebuilds), checked without making a class."""
    names = [name, *fields]
    return all(isinstance(n, str) and n.isidentifier() and
               not keyword.iskeyword(n) and len(n) <= MAX_NAME
               for n in names) and \
        not any(f.startswith("_") for f in fields) and \
        len(set(fields)) == len(fields) and len(fields) <= MAX_FIELDS


def _loaded_class(module, qualname, rebuilt):
    """The namedtuple class `module`.`qualname` if this process has that
    module loaded and the class there is a namedtuple of `rebuilt`'s name
    and fields; else `rebuilt`.  Dict lookups only (sys.modules and the
    objects' __dict__): nothing is imported and no code runs."""
    if type(module) is not str or type(qualname) is not str:
        raise SlotError("namedtuple: a module or qualname that is no string")
    top = obj = sys.modules.get(module)
    for part in qualname.split("."):
        obj = _ns_get(obj, part)
        if obj is None:
            break
    if _same_namedtuple(obj, rebuilt):
        return obj
    if "." not in qualname:
        # namedtuple() names its class by its typename alone, so one made
        # in a class body (class D: Batch = namedtuple("Batch", ...)) says
        # "Batch": the module's classes are looked in, one level down, and
        # the only match is taken
        found = [c for c in (_ns_get(v, qualname) for v in
                             list(_ns_values(top)) if isinstance(v, type))
                 if _same_namedtuple(c, rebuilt)]
        if len(found) == 1:
            return found[0]
    return rebuilt


def _ns_get(obj, name):
    ns = getattr(obj, "__dict__", None)
    return ns.get(name) if isinstance(ns, dict) or \
        type(ns).__name__ == "mappingproxy" else None


def _ns_values(obj):
    ns = getattr(obj, "__dict__", None)
    return ns.values() if isinstance(ns, dict) else ()


def _same_namedtuple(obj, rebuilt):
    return isinstance(obj, type) and issubclass(obj, tuple) and \
        obj.__dict__.get("_fields", getattr(obj, "_fields", None)) == \
        rebuilt._fields and obj.__name__ == rebuilt.__name__


class _Encoder:
    def __init__(self):
        self.tensors, self.arrays, self.bytes = [], [], []
        self.tmeta, self.ameta, self.bmeta = [], [], []
        self.at = 0  # data bytes so far
        self.nodes = 0

    def _room(self, path):
        n = len(self.tensors) + len(self.arrays) + len(self.bytes)
        if n >= MAX_BUFFERS:
            raise EncodeError(f"{_path(path)}: more than {MAX_BUFFERS} "
                              "tensors, arrays and bytes in one batch")

    def _place(self, nb):
        off = self.at
        self.at = _align(self.at + nb)
        return off

    def _tensor(self, t, path):
        if t.layout != torch.strided or t.is_quantized:
            raise EncodeError(f"{_path(path)}: a {t.layout} tensor cannot "
                              "travel (strided dense tensors only)")
        name = _TORCH_NAME.get(t.dtype)
        if name is None:
            raise EncodeError(f"{_path(path)}: tensor dtype {t.dtype} cannot "
                              f"travel (allowed: {', '.join(_TORCH)})")
        if t.ndim > MAX_DIMS:
            raise EncodeError(f"{_path(path)}: a tensor of {t.ndim} dims "
                              f"(at most {MAX_DIMS})")
        t = t.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        self._room(path)
        nb = t.numel() * t.element_size()
        off = self._place(nb)
        self.tmeta.append([name, list(t.shape), off, nb])
        self.tensors.append((t, off, nb))
        return {"T": len(self.tensors) - 1}

    def _array(self, a, path, scalar=False):
        np = _np()
        name = a.dtype.name
        if name not in _NUMPY or a.dtype.byteorder == ">" or \
                a.dtype.fields is not None:
            raise EncodeError(f"{_path(path)}: numpy dtype {a.dtype} cannot "
                              f"travel (allowed: {', '.join(_NUMPY)}, native "
                              "byte order)")
        if a.ndim > MAX_DIMS:
            raise EncodeError(f"{_path(path)}: an array of {a.ndim} dims "
                              f"(at most {MAX_DIMS})")
        shape = list(a.shape)
        a = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
        self._room(path)
        nb = a.nbytes
        off = self._place(nb)
        self.ameta.append([name, shape, off, nb])
        self.arrays.append((a, off, nb))
        return {"S" if scalar else "N": len(self.arrays) - 1}

    def node(self, obj, path, depth):
        self.nodes += 1
        if self.nodes > MAX_NODES:
            raise EncodeError(f"{_path(path)}: more than {MAX_NODES} values "
                              "in one batch")
        t = type(obj)
        if obj is None or t is str or t is bool or t is int:
            return obj  # the common leaves first
        if t is torch.Tensor:
            return self._tensor(obj, path)
        if isinstance(obj, (bool, str)):
            return obj
        if isinstance(obj, torch.Tensor):
            return self._tensor(obj, path)
        np = _np()  # before float: numpy.float64 is a float
        if np is not None and isinstance(obj, np.ndarray):
            return self._array(obj, path)
        if np is not None and isinstance(obj, np.generic):
            return self._array(np.asarray(obj), path, scalar=True)
        if isinstance(obj, int):
            return int(obj)
        if isinstance(obj, float):
            return float(obj)
        if isinstance(obj, (bytes, bytearray)):
            self._room(path)
            m = memoryview(obj)
            off = self._place(m.nbytes)
            self.bmeta.append([off, m.nbytes])
            self.bytes.append((m, off, m.nbytes))
            return {"B": len(self.bytes) - 1}
        if depth >= MAX_DEPTH:
            raise EncodeError(f"{_path(path)}: nested deeper than "
                              f"{MAX_DEPTH} containers")
        if isinstance(obj, dict):
            items = []
            for k, v in obj.items():
                kp = (path, "[]", k)
                items.append([self.key(k, kp, depth + 1),
                              self.node(v, kp, depth + 1)])
            return {"d": items}
        if _is_namedtuple(obj):
            name = type(obj).__name__
            if not _nt_names_ok(name, type(obj)._fields):
                raise EncodeError(f"{_path(path)}: namedtuple {name} with "
                                  f"fields {type(obj)._fields} cannot be "
                                  "rebuilt by collections.namedtuple "
                                  "(names: identifiers, fields not "
                                  "starting with '_')")
            node = {"nt": name, "f": list(type(obj)._fields),
                    "v": [self.node(v, (path, ".", f), depth + 1)
                          for f, v in zip(type(obj)._fields, obj)]}
            mod = getattr(type(obj), "__module__", None)
            qual = getattr(type(obj), "__qualname__", None)
            if isinstance(mod, str) and isinstance(qual, str) and \
                    len(mod) <= MAX_NAME and len(qual) <= MAX_NAME:
                node.update(m=mod, q=qual)
            return node
        if isinstance(obj, (list, tuple)):
            return {"l" if isinstance(obj, list) else "t":
                    [self.node(v, (path, "[]", i), depth + 1)
                     for i, v in enumerate(obj)]}
        raise EncodeError(f"{_path(path)}: type {type(obj).__module__}."
                          f"{type(obj).__qualname__} cannot travel in a "
                          f"DistributedDataLoader batch; allowed: {ALLOWED}")

    def key(self, k, path, depth):
        if k is None or type(k) is str or \
                isinstance(k, (bool, int, float, str, bytes)) or \
                (isinstance(k, tuple) and not _is_namedtuple(k)):
            return self.node(k, path, depth)
        raise EncodeError(f"{_path(path)}: a dict key of type "
                          f"{type(k).__qualname__} cannot travel (keys: "
                          "None, bool, int, float, str, bytes, tuples of "
                          "these)")


class Plan:
    """A batch laid out for a slot: nbytes to allocate, then write()."""

    def __init__(self, meta, tensors, buffers, data_bytes):
        self.meta = meta
        self.tensors = tensors      # [(tensor, offset, nbytes)]
        self.buffers = buffers      # [(memoryview-able, offset, nbytes)]
        self.start = _align(16 + len(meta))
        self.nbytes = self.start + data_bytes

    def write(self, view):
        """Writes the batch into `view` (a writable buffer of nbytes)."""
        view[0:8] = MAGIC
        view[8:16] = len(self.meta).to_bytes(8, "little")
        view[16:16 + len(self.meta)] = self.meta
        for t, off, nb in self.tensors:
            if nb:
                dst = torch.frombuffer(view, dtype=torch.uint8, count=nb,
                                       offset=self.start + off)
                dst.view(t.dtype).view(t.shape).copy_(t)
        for m, off, nb in self.buffers:
            if nb:
                a = self.start + off
                view[a:a + nb] = m


def _dumps(meta):
    b = json.dumps(meta, separators=(",", ":"), ensure_ascii=False,
                   allow_nan=True).encode("utf-8", "surrogatepass")
    if len(b) > MAX_META:
        raise EncodeError(f"batch: its description is {len(b)} bytes of "
                          f"JSON (at most {MAX_META}): too many values")
    return b


def plan_batch(obj, state=None):
    """Lays out `obj` (the collated batch; `state`, when not None, the
    worker's dataset state beside it).  Raises EncodeError (a TypeError)
    naming the place and type of a value that cannot travel."""
    enc = _Encoder()
    root = enc.node(obj, None, 0)
    meta = {"v": VERSION, "kind": "batch", "root": root}
    if state is not None:
        meta["state"] = enc.node(state, None, 0)
    meta.update({"tensors": enc.tmeta, "arrays": enc.ameta,
                 "bytes": enc.bmeta})
    meta = _dumps(meta)
    bufs = [(memoryview(a), off, nb) for a, off, nb in enc.arrays] + \
        enc.bytes
    return Plan(meta, enc.tensors, bufs, enc.at)


def plan_error(exc_info, worker_id, pid, sample, where, stage=None):
    """Lays out an exception raised by the dataset or collate_fn: its
    type's name (and module, qualname: only looked up, never imported, on
    the reader), message and formatted traceback, as text.  stage: None
    (the dataset if a sample is named, else collate_fn) or "encode" (the
    batch could not be laid out)."""
    et, ev, tb = exc_info
    text = "".join(traceback.format_exception(et, ev, tb))[-MAX_TEXT:]
    try:
        msg = str(ev)[-MAX_TEXT:]
    except Exception:  # a __str__ that raises
        msg = "<the exception's message cannot be formatted>"
    meta = _dumps({"v": VERSION, "kind": "error", "module": et.__module__,
                   "qualname": et.__qualname__, "name": et.__name__,
                   "message": msg, "traceback": text,
                   "worker_id": int(worker_id), "pid": int(pid),
                   "sample": None if sample is None else int(sample),
                   "where": str(where), "stage": stage})
    return Plan(meta, [], [], 0)


def plan_end(worker_id):
    """The slot of a step whose worker's stream has ended."""
    return Plan(_dumps({"v": VERSION, "kind": "end",
                        "worker_id": int(worker_id)}), [], [], 0)


# ---- reading ---------------------------------------------------------------


def _int(v, what, lo=0, hi=(1 << 63) - 1):
    if type(v) is not int or not lo <= v <= hi:
        raise SlotError(f"{what}: {v!r} is not an integer in {lo}..{hi}")
    return v


def _str(v, what, cap=MAX_TEXT):
    if type(v) is not str or len(v) > cap:
        raise SlotError(f"{what}: not a string of at most {cap} characters")
    return v


def _entries(meta, key, size):
    v = meta.get(key, [])
    if type(v) is not list or len(v) > MAX_BUFFERS:
        raise SlotError(f"'{key}' is not a list of at most {MAX_BUFFERS}")
    for i, x in enumerate(v):
        if type(x) is not list or len(x) != size:
            raise SlotError(f"{key}[{i}]: not a list of {size}")
    return v


_MAX_INT = (1 << 63) - 1
_MAX_DIM = 1 << 62

# The checks below run per tensor: the common case takes no formatting,
# the message is built only when a check fails.


def _region(off, nb, kind, k, start, total):
    if type(off) is not int or type(nb) is not int or \
            not 0 <= off <= _MAX_INT or not 0 <= nb <= _MAX_INT:
        _int(off, f"{kind} {k} offset")
        _int(nb, f"{kind} {k} length")
    if off % ALIGN or start + off + nb > total:
        raise SlotError(f"{kind} {k}: bytes {off}..{off + nb} (from {start}) "
                        f"lie outside the slot of {total} bytes")
    return start + off


def _shape(shape, kind, k):
    if type(shape) is not list or len(shape) > MAX_DIMS:
        raise SlotError(f"{kind} {k}: shape is not a list of at most "
                        f"{MAX_DIMS} dims")
    n = 1
    for d in shape:
        if type(d) is not int or not 0 <= d <= _MAX_DIM:
            _int(d, f"{kind} {k}: a dim", 0, _MAX_DIM)
        n *= d
    return n


# (name, fields) -> the class rebuilt for it, so that the batches of a
# loader share one class per namedtuple (bounded: a hostile stream of names
# gets classes of its own, uncached).
_NT = {}
MAX_NT = 1024


class _Decoder:
    def __init__(self, part, mv, meta, start):
        self.part, self.total, self.start = part, len(mv), start
        self.mv = mv
        self.nodes = 0
        self.t_ent = _entries(meta, "tensors", 4)
        self.a_ent = _entries(meta, "arrays", 4)
        self.b_ent = _entries(meta, "bytes", 2)

    def _idx(self, v, ent, what):
        if type(v) is int and 0 <= v < len(ent):
            return ent[v]
        return ent[_int(v, f"{what} index", 0, len(ent) - 1)]

    def tensor(self, k):
        dt, shape, off, nb = self._idx(k, self.t_ent, "tensor")
        dtype = _TORCH.get(dt) if type(dt) is str else None
        if dtype is None:
            raise SlotError(f"tensor {k}: dtype {dt!r} is not allowed")
        n = _shape(shape, "tensor", k)
        es = _TORCH_SIZE[dt]
        if n * es != nb:
            raise SlotError(f"tensor {k}: shape {shape} of {dt} is {n * es} "
                            f"bytes, not {nb}")
        a = _region(off, nb, "tensor", k, self.start, self.total)
        if nb == 0:
            return torch.empty(shape, dtype=dtype)
        return torch.frombuffer(self.part, dtype=torch.uint8, count=nb,
                                offset=a).view(dtype).view(shape)

    def array(self, k, scalar):
        np = _np()
        if np is None:
            import numpy as np  # the batch has arrays: numpy is needed
        dt, shape, off, nb = self._idx(k, self.a_ent, "array")
        if type(dt) is not str or dt not in _NUMPY:
            raise SlotError(f"array {k}: dtype {dt!r} is not allowed")
        dtype = np.dtype(dt)
        n = _shape(shape, "array", k)
        if n * dtype.itemsize != nb or (scalar and shape):
            raise SlotError(f"array {k}: shape {shape} of {dt} is "
                            f"{n * dtype.itemsize} bytes, not {nb}")
        a = _region(off, nb, "array", k, self.start, self.total)
        arr = np.frombuffer(self.part, dtype=dtype, count=n,
                            offset=a).reshape(shape)
        return arr[()] if scalar else arr

    def raw(self, k):
        off, nb = self._idx(k, self.b_ent, "bytes")
        a = _region(off, nb, "bytes", k, self.start, self.total)
        return bytes(self.mv[a:a + nb])

    def namedtuple(self, name, fields):
        _str(name, "namedtuple name", MAX_NAME)
        if type(fields) is not list or len(fields) > MAX_FIELDS:
            raise SlotError(f"namedtuple {name!r}: bad field list")
        for f in fields:
            _str(f, f"namedtuple {name!r} field", MAX_NAME)
        key = (name, tuple(fields))
        cls = _NT.get(key)
        if cls is None:
            if not name.isidentifier() or keyword.iskeyword(name):
                raise SlotError(f"namedtuple name {name!r} is not an "
                                "identifier")
            try:
                cls = collections.namedtuple(name, fields)
            except ValueError as e:
                raise SlotError(f"namedtuple {name!r}: {e}") from None
            if len(_NT) < MAX_NT:
                _NT[key] = cls
        return cls

    def node(self, n, depth):
        self.nodes += 1
        if self.nodes > MAX_NODES:
            raise SlotError(f"more than {MAX_NODES} values")
        if n is None or type(n) in (bool, int, float, str):
            return n
        if depth >= MAX_DEPTH:
            raise SlotError(f"nested deeper than {MAX_DEPTH}")
        if type(n) is not dict or len(n) not in (1, 3, 5):
            raise SlotError(f"a value that is no node: {str(n)[:80]}")
        if len(n) in (3, 5):
            if set(n) - {"m", "q"} != {"nt", "f", "v"} or \
                    type(n["v"]) is not list:
                raise SlotError(f"a value that is no node: {str(n)[:80]}")
            cls = self.namedtuple(n["nt"], n["f"])
            if len(n) == 5:
                cls = _loaded_class(n["m"], n["q"], cls)
            if len(n["v"]) != len(cls._fields):
                raise SlotError(f"namedtuple {n['nt']!r}: {len(n['v'])} "
                                f"values for {len(cls._fields)} fields")
            return cls(*(self.node(v, depth + 1) for v in n["v"]))
        (tag, v), = n.items()
        if tag in ("l", "t"):
            if type(v) is not list:
                raise SlotError(f"'{tag}' node is not a list")
            out = [self.node(x, depth + 1) for x in v]
            return out if tag == "l" else tuple(out)
        if tag == "d":
            if type(v) is not list:
                raise SlotError("'d' node is not a list")
            out = {}
            for kv in v:
                if type(kv) is not list or len(kv) != 2:
                    raise SlotError("a dict item is not a [key, value] pair")
                k = self.node(kv[0], depth + 1)
                val = self.node(kv[1], depth + 1)
                try:
                    out[k] = val
                except TypeError:  # an unhashable key (a list, a tensor)
                    raise SlotError(f"a dict key of type {type(k).__name__}"
                                    ) from None
            return out
        if tag == "T":
            return self.tensor(v)
        if tag in ("N", "S"):
            return self.array(v, tag == "S")
        if tag == "B":
            return self.raw(v)
        raise SlotError(f"unknown node tag {tag[:20]!r}")


def _meta(mv):
    if len(mv) < 16 or bytes(mv[:8]) != MAGIC:
        raise SlotError("not a Python batch of this version (bad magic "
                        f"{bytes(mv[:8])!r}, want {MAGIC!r})")
    ml = int.from_bytes(mv[8:16], "little")
    if ml > MAX_META or 16 + ml > len(mv):
        raise SlotError(f"its description ({ml} bytes) runs past the slot "
                        f"of {len(mv)} bytes")
    try:
        meta = json.loads(bytes(mv[16:16 + ml]).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:  # JSONDecodeError too
        raise SlotError(f"its description is not JSON: {e}") from None
    except RecursionError:
        raise SlotError("its description nests too deep") from None
    if type(meta) is not dict or meta.get("v") != VERSION:
        raise SlotError(f"its description is not a version {VERSION} "
                        "batch or error")
    return meta, _align(16 + ml)


def _error(meta):
    out = {"kind": "error"}
    for k in ("module", "qualname", "name"):
        out[k] = _str(meta.get(k), f"error {k}", MAX_NAME)
    for k in ("message", "traceback", "where"):
        out[k] = _str(meta.get(k), f"error {k}")
    out["worker_id"] = _int(meta.get("worker_id"), "error worker_id")
    out["pid"] = _int(meta.get("pid"), "error pid")
    s = meta.get("sample")
    out["sample"] = None if s is None else _int(s, "error sample", 0,
                                                (1 << 64) - 1)
    st = meta.get("stage")
    if st not in (None, "encode"):
        raise SlotError(f"error stage {str(st)[:20]!r} is unknown")
    out["stage"] = st
    return out


def decode(part):
    """The batch in `part` (a buffer over the slot: datahelix._C.Part) as
    {"kind": "batch", "obj": <the batch, its tensors and arrays views of
    the slot>}, or the error (kind "error": name, module, qualname,
    message, traceback, worker_id, pid, sample, where, stage: plain
    values).
    Raises SlotError (a ValueError) naming the cause for a slot that is
    not a well-formed one; nothing in the slot can run code."""
    mv = memoryview(part).cast("B")
    meta, start = _meta(mv)
    kind = meta.get("kind")
    if kind == "error":
        return _error(meta)
    if kind == "end":
        return {"kind": "end",
                "worker_id": _int(meta.get("worker_id"), "end worker_id")}
    if kind != "batch" or "root" not in meta:
        raise SlotError(f"unknown kind {str(kind)[:40]!r}")
    try:
        dec = _Decoder(part, mv, meta, start)
        out = {"kind": "batch", "obj": dec.node(meta["root"], 0)}
        if "state" in meta:
            out["state"] = dec.node(meta["state"], 0)
        return out
    except RecursionError:
        raise SlotError("nests too deep") from None
