"""How a Python batch lies in an arena slot: written by a DataServer's
Python worker (datahelix._worker), read by the rank's
DistributedDataLoader without a copy (docs/python.md
"DistributedDataLoader").

    slot = MAGIC (8 bytes) | meta length (u64, little-endian) | meta
           | padding to 64 | data
    meta = pickle of {"kind": "batch", "obj": <pickle of the batch>,
                      "tensors": [(dtype, shape, offset, nbytes)],
                      "buffers": [(offset, nbytes)]}
        or {"kind": "error", ...}   (an exception and its traceback)

In the batch pickle every strided CPU tensor is a persistent id: its bytes
lie in `data` at `offset` (relative to the data start, 64-aligned), and the
reader rebuilds it with torch.frombuffer() over the slot itself.  Other
objects that support pickle protocol 5 out-of-band buffers (numpy arrays)
go the same way through `buffers`.  Everything else (ints, strings, the
structure of dicts / tuples / namedtuples) is in the pickle.
"""
import io
import pickle
import traceback

import torch

MAGIC = b"DHPYSLT1"
ALIGN = 64


def _align(n):
    return (n + ALIGN - 1) & ~(ALIGN - 1)


def _dtype_name(dt):
    return str(dt).rsplit(".", 1)[-1]


class _Pickler(pickle.Pickler):
    def __init__(self, f, tensors, buffers):
        super().__init__(f, protocol=5, buffer_callback=buffers.append)
        self._tensors = tensors

    def persistent_id(self, obj):
        if isinstance(obj, torch.Tensor) and obj.layout == torch.strided \
                and not obj.is_quantized:
            self._tensors.append(obj.detach())
            return ("T", len(self._tensors) - 1)
        return None


class _Unpickler(pickle.Unpickler):
    def __init__(self, f, tensors, buffers):
        super().__init__(f, buffers=buffers)
        self._tensors = tensors

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) == 2 and pid[0] == "T"):
            raise pickle.UnpicklingError(f"unknown persistent id {pid!r}")
        return self._tensors[pid[1]]


class Plan:
    """A batch laid out for a slot: nbytes to allocate, then write()."""

    def __init__(self, meta, tensors, buffers, data_bytes):
        self.meta = meta
        self.tensors = tensors      # [(tensor, offset, nbytes)]
        self.buffers = buffers      # [(memoryview, offset, nbytes)]
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


def plan_batch(obj):
    """Lays out `obj` (the collated batch).  Raises what pickling raises
    for an object that cannot be sent."""
    tensors, bufs = [], []
    f = io.BytesIO()
    _Pickler(f, tensors, bufs).dump(obj)
    at, te, be, tmeta, bmeta = 0, [], [], [], []
    for t in tensors:
        if t.device.type != "cpu":
            t = t.cpu()
        nb = t.numel() * t.element_size()
        tmeta.append((_dtype_name(t.dtype), tuple(t.shape), at, nb))
        te.append((t, at, nb))
        at = _align(at + nb)
    for b in bufs:
        m = b.raw()
        bmeta.append((at, m.nbytes))
        be.append((m, at, m.nbytes))
        at = _align(at + m.nbytes)
    meta = pickle.dumps({"kind": "batch", "obj": f.getvalue(),
                         "tensors": tmeta, "buffers": bmeta}, protocol=5)
    return Plan(meta, te, be, at)


def plan_error(exc_info, worker_id, pid, sample, where):
    """Lays out an exception raised by the dataset or collate_fn: its
    type (module and name, to re-raise it as that type), message and
    formatted traceback."""
    et, ev, tb = exc_info
    text = "".join(traceback.format_exception(et, ev, tb))
    meta = pickle.dumps({"kind": "error", "module": et.__module__,
                         "qualname": et.__qualname__, "name": et.__name__,
                         "traceback": text, "worker_id": worker_id,
                         "pid": pid, "sample": sample, "where": where},
                        protocol=5)
    return Plan(meta, [], [], 0)


def decode(part):
    """The batch in `part` (a buffer over the slot: datahelix._C.Part) as
    an object whose tensors are views of the slot, or the error dict
    (kind "error").  Raises ValueError for a slot that is not one."""
    mv = memoryview(part)
    if len(mv) < 16 or bytes(mv[:8]) != MAGIC:
        raise ValueError("not a Python batch (bad magic)")
    ml = int.from_bytes(mv[8:16], "little")
    if 16 + ml > len(mv):
        raise ValueError("Python batch header runs past its slot")
    meta = pickle.loads(mv[16:16 + ml])
    if meta.get("kind") == "error":
        return meta
    start = _align(16 + ml)
    tensors = []
    for dt, shape, off, nb in meta["tensors"]:
        dtype = getattr(torch, dt)
        if start + off + nb > len(mv):
            raise ValueError("Python batch tensor runs past its slot")
        if nb == 0:
            tensors.append(torch.empty(shape, dtype=dtype))
        else:
            tensors.append(torch.frombuffer(part, dtype=torch.uint8, count=nb,
                                            offset=start + off)
                           .view(dtype).view(shape))
    bufs = [mv[start + off:start + off + nb] for off, nb in meta["buffers"]]
    return {"kind": "batch",
            "obj": _Unpickler(io.BytesIO(meta["obj"]), tensors, bufs).load()}
