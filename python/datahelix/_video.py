"""A DataLoader's transform= on its DataServer (not a public module;
docs/python.md "transform and collate_fn").

A DataLoader given transform= starts its local DataServer in the Python
mode DistributedDataLoader uses (src/runtime/dataserver_python.c,
datahelix._worker), with a Clips dataset as its dataset: each of the
server's num_workers Python worker processes decodes the samples of a step
with the C media pipeline (datahelix._C.SampleDecoder: the same decode, per
sample plan seed, crop and frame padding as the C pool) into a buffer of
its own, calls the transform on a zero-copy uint8 view of it, stacks the
results (or runs collate_fn) and writes the batch into an arena slot
(datahelix._slot); the training process wraps the slot's tensors without a
copy.  So the transform runs in parallel with decode and with training, on
the DataServer's CPUs, and next() only does the hand-over.

A step's job is its ids after a header id (bit 63; the worker's "base
seed": the epoch and the global step, so that the worker's per-sample
seeding of random / torch / numpy is (epoch, step, id)-determined), then,
with on_error="skip", the step's spares with SPARE set (the client's own
choice, datahelix/spare.h).  A sample whose decode or transform fails is
then replaced in its position by the first spare that succeeds, as the C
pool does; in raise mode its exception travels in the slot with the sample
named and the loader raises it at its step.
"""
import os
import time

import torch
from torch.utils.data import default_collate
from torch.utils.data._utils import worker as _tworker

from . import _C

HDR = 1 << 63
SPARE = 1 << 62
STEP_BITS = 24
EPOCH_MASK = (1 << (62 - STEP_BITS)) - 1
# A note added to the exception of a failing transform, so that the
# training process can tell the stage apart from the decode's (its type
# is the user's own: `except ValueError` catches it as torch would).
TRANSFORM_NOTE = "datahelix: raised by transform="


def header(epoch, step):
    """The header id of a step's job (HDR | epoch | global step)."""
    return HDR | (epoch & EPOCH_MASK) << STEP_BITS | step & \
        ((1 << STEP_BITS) - 1)


def _epoch_of(base):
    return (base >> STEP_BITS) & EPOCH_MASK


class AllSparesFailed(RuntimeError):
    """on_error="skip": a sample failed and none of its step's spares could
    take its place (the loader drops the step, stats()["skipped"])."""


class _Failed:
    """A sample that failed under on_error="skip", for collate to replace."""

    def __init__(self, sid, stage, exc):
        self.id, self.stage = sid, stage
        self.cause = f"{type(exc).__name__}: {exc}"
        self.code = getattr(exc, "code", None)


class Clips:
    """The built-in dataset of a DataLoader with transform= (pickled to the
    DataServer's workers with the transform and collate_fn inside).
    dataset[i]: sample i decoded and transformed; collate: the step."""

    def __init__(self, index_path, plan, transform, collate_fn, skip):
        self.index_path, self.plan = index_path, dict(plan)
        self.transform, self.collate_fn = transform, collate_fn
        self.skip = bool(skip)
        self._dec = self._ix = None

    def __getstate__(self):
        d = dict(self.__dict__)
        d["_dec"] = d["_ix"] = d["_out"] = d["_out_key"] = None
        d.pop("_bufs", None)
        return d

    def __len__(self):
        return len(self._index())

    def _index(self):
        if self._ix is None:
            self._ix = _C.Index(self.index_path)
        return self._ix

    def _decoder(self):
        if self._dec is None:
            self._dec = _C.SampleDecoder(self.index_path, **self.plan)
            self._bufs = []      # one per position of a step (reused)
            self._pos = 0
            self._t_ms = 0.0
        return self._dec

    def _epoch(self):
        info = _tworker.get_worker_info()
        return _epoch_of(info.seed - info.id) if info is not None else 0

    def _sample(self, sid):
        """(output, valid_frames, transform ms) of sample sid; raises as
        its decode or transform does (the transform's error noted)."""
        dec = self._decoder()
        if self._pos == len(self._bufs):
            self._bufs.append(bytearray(dec.nbytes + _C.MEDIA_DST_PAD))
        buf = self._bufs[self._pos]
        self._pos += 1
        valid = dec.decode_into(sid, self._epoch(), buf)
        d = self.plan
        item = 4 if d["dtype"] == "float32" else 1
        v = torch.frombuffer(buf, dtype=torch.uint8, count=dec.nbytes)
        v = v.view(torch.float32 if item == 4 else torch.uint8)
        shape = ((d["frames"], d["height"], d["width"], 3)
                 if d["layout"] == "THWC"
                 else (d["frames"], 3, d["height"], d["width"]))
        v = v.view(shape)
        if self.transform is None:
            return v, valid, 0.0
        t0 = time.perf_counter()
        try:
            out = self.transform(v)
        except Exception as e:
            if hasattr(e, "add_note"):
                e.add_note(f"{TRANSFORM_NOTE} on sample {sid}")
            raise
        return out, valid, (time.perf_counter() - t0) * 1e3

    def __getitem__(self, i):
        if i & SPARE:
            return ("spare", i & ~SPARE)
        try:
            return ("ok", i) + self._sample(i)
        except Exception as e:
            if not self.skip:
                raise
            noted = TRANSFORM_NOTE in "".join(getattr(e, "__notes__", []))
            return ("failed", _Failed(i, "transform" if noted else "decode",
                                      e))

    def collate(self, data):
        """The step's batch: its samples (a failed one replaced by the
        next spare that succeeds), stacked or collate_fn'd, with what the
        loader reports (ids delivered, valid frames, substitutions, the
        transform's and collate's time, this process)."""
        self._pos = 0
        spares = [x[1] for x in data if x[0] == "spare"]
        items = [x for x in data if x[0] != "spare"]
        outs, ids, valid, subs, t_ms = [], [], [], [], 0.0
        for pos, x in enumerate(items):
            if x[0] == "failed":
                x = self._substitute(pos, x[1], spares, subs)
            _, sid, out, vf, ms = x
            outs.append(out)
            ids.append(sid)
            valid.append(vf)
            t_ms += ms
        t0 = time.perf_counter()
        res = {"ids": torch.tensor(ids, dtype=torch.int64),
               "valid_frames": torch.tensor(valid, dtype=torch.int32),
               "substituted": subs, "pid": os.getpid()}
        if self.collate_fn is None:
            res["video"] = self._stack(outs)
        else:
            info = _tworker.get_worker_info()
            ep, step = (_epoch_of(info.seed - info.id),
                        (info.seed - info.id) & ((1 << STEP_BITS) - 1)) \
                if info is not None else (0, 0)
            ix = self._index()
            res["user"] = self.collate_fn([
                {"video": v, "valid_frames": int(f), "id": int(i),
                 "tokens": int(ix.tokens(i)), "text": ix.text(i),
                 "epoch": ep, "step": step}
                for v, f, i in zip(outs, valid, ids)])
        res["transform_ms"] = t_ms
        res["collate_ms"] = (time.perf_counter() - t0) * 1e3
        return res

    def _substitute(self, pos, failed, spares, subs):
        while spares:
            sid = spares.pop(0)
            try:
                x = ("ok", sid) + self._sample(sid)
            except Exception:
                continue  # a spare that fails too is passed over
            subs.append({"position": pos, "failed_id": failed.id,
                         "substitute_id": sid, "stage": failed.stage,
                         "cause": failed.cause, "code": failed.code})
            return x
        ix = self._index()
        raise AllSparesFailed(
            f"sample {failed.id} ({ix.path(failed.id)}) failed in its "
            f"{failed.stage} ({failed.cause}) and no spare of the step "
            "could replace it")

    def _stack(self, outs):
        """The step's outputs as one batch: torch.stack for tensors, into
        a buffer this worker reuses step after step (its bytes are copied
        into the arena slot before the next step, and a fresh one would
        cost page faults each step); default_collate for anything else
        (without the shared-memory allocation it makes in a worker: the
        batch is written into the arena next)."""
        if all(isinstance(o, torch.Tensor) for o in outs):
            shapes = {(tuple(o.shape), o.dtype) for o in outs}
            if len(shapes) > 1:
                raise RuntimeError(
                    "transform= returned tensors of different shapes in "
                    f"one step ({sorted(str(s) for s in shapes)}): a "
                    "batch stacks them; give collate_fn= to batch them "
                    "otherwise")
            shape, dtype = shapes.pop()
            key = ((len(outs),) + shape, dtype)
            if getattr(self, "_out_key", None) != key:
                self._out = torch.empty(key[0], dtype=dtype)
                self._out_key = key
            return torch.stack(outs, out=self._out)
        info, _tworker._worker_info = _tworker._worker_info, None
        try:
            return default_collate(outs)
        finally:
            _tworker._worker_info = info


# -- the training process's side ----------------------------------------------

_PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_JOB_TIMEOUT_MS = 600000  # one step on one worker (then killed, replaced)


def check(microbatches, dataserver, listen, transport):
    """What transform= does not go with: said at construction."""
    if microbatches != 1:
        raise ValueError("transform= runs on the local DataServer's Python "
                         "workers, one step each: microbatches=1")
    if dataserver is not None:
        raise ValueError("transform= runs on the local DataServer's Python "
                         "workers: it does not go with dataserver= (a "
                         "remote DataServer)")
    if listen is not None:
        raise ValueError("transform= runs on the local DataServer's Python "
                         "workers: it does not go with listen= (remote "
                         "DataServers would deliver untransformed batches)")
    if transport != "shm":
        raise ValueError("transform=: batches are handed over zero-copy "
                         "(transport='shm')")


def dataserver_args(loader, folder):
    """Writes the dataset file (Clips with the loader's transform and
    collate_fn, pickled as DistributedDataLoader pickles its dataset) into
    `folder` (private to this user), returns the DataServer's arguments
    that start its Python workers on it."""
    from ._distributed import dataset_file_bytes
    o = loader._opts
    plan = dict(frames=o["frames"], width=o["width"], height=o["height"],
                layout=o["layout"], dtype=o["dtype"], seed=o["seed"],
                random_crop=o["random_crop"], fps=float(o["fps"] or 0))
    ds = Clips(loader.index_path, plan, loader.transform, loader.collate_fn,
               loader.on_error == "skip")
    data = dataset_file_bytes({"dataset": ds, "collate_fn": ds.collate,
                               "worker_init_fn": None,
                               "auto_collation": True},
                              "DataLoader ships transform= and collate_fn= "
                              "to its DataServer's worker processes")
    path = os.path.join(folder, "transform.pkl")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    import sys
    return ["--python-dataset", path,
            "--python-workers", str(max(1, loader.num_workers)),
            "--python", sys.executable, "--python-path", _PACKAGE_PARENT,
            "--python-job-timeout-ms", str(_JOB_TIMEOUT_MS),
            "--python-seed", str(o["seed"] & (SPARE - 1)),
            "--python-unlink"]


def arena_bytes(loader):
    """The default arena with transform=: room for (prefetch + 2) steps of
    float32 output of the decoded size (a transform that makes floats of
    the frames makes 4x the bytes), at least 256 MiB."""
    o = loader._opts
    one = o["frames"] * o["width"] * o["height"] * 3 * 4
    return max(256 << 20, (loader.prefetch + 2) * loader.batch_size * one)


def jobs(loader, first_step, ids, offs):
    """The pass's schedule as Python jobs: each step's ids after its
    header, then (skip) its spares, the ones the client would choose."""
    import array
    o = array.array("Q", offs)
    src = array.array("Q", ids)
    want = loader._opts["spares"]
    out, outoffs = array.array("Q"), array.array("Q", [0])
    for k in range(len(o) - 1):
        out.append(header(loader._epoch, first_step + k))
        out.extend(src[o[k]:o[k + 1]])
        if want:
            sp = _C.spares(loader._opts["seed"], loader._epoch,
                           first_step + k, loader.rank, ids, offs, k, want)
            out.extend(s | SPARE for s in array.array("Q", sp))
        outoffs.append(len(out))
    return out.tobytes(), outoffs.tobytes()


def is_skippable(err):
    """A slot's error that on_error="skip" drops the step for: a sample's
    (decode or transform) that its spares could not replace."""
    return err["module"] == __name__ and err["name"] == "AllSparesFailed"


def raise_error(err, loader, step):
    """Raises a worker's error of step `step` as a SampleError (of the
    user's exception type too, as DistributedDataLoader raises them),
    naming the sample, its file and the stage."""
    from ._distributed import _raise_worker_error
    try:
        _raise_worker_error(err, loader.rank, loader._epoch, step)
    except _C.SampleError as e:
        sid = err["sample"]
        e.stage = ("transform" if TRANSFORM_NOTE in err["traceback"]
                   else "decode" if sid is not None else "collate")
        if sid is not None and 0 <= sid < len(loader._index):
            e.path = loader._index.path(sid)
            e.args = (f"rank {loader.rank} epoch {loader._epoch} step "
                      f"{step}: sample {sid} ({e.path}): {e.stage} failed: "
                      f"{e.cause}\n{e.args[0]}",) + e.args[1:]
        raise
