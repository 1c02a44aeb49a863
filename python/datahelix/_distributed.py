"""datahelix.DistributedDataLoader: torch.utils.data.DataLoader's interface
over any map-style Dataset or IterableDataset, whose samples are loaded by
Python worker processes of the rank's local DataServer and handed over
through its shared-memory arena without a copy (DESIGN.md 4.3 and 8,
docs/python.md "DistributedDataLoader").

An IterableDataset (_StreamIter): each worker iterates its own copy (its
shard, as get_worker_info() tells it), and the steps go to the workers in
turn as torch's do, each step pinned to its worker (the second id: bit 63,
the iteration, the worker, the step's place in its stream); a worker whose
stream is exhausted answers "end" and is left out of the turn from then.

Per iteration, this process runs the sampler / batch sampler (torch's own
classes, so the order is torch's) and gives the client the steps: each a
header id (bit 63 set, the iteration's base seed below it) followed by the
dataset indices of one batch.  The Coordinator routes each step to this
rank's DataServer, which started with `--python-dataset FILE` (the dataset
pickled here, into a folder only this user can write) and hands the step
to one of its Python workers (datahelix._worker); the worker writes the
collated batch into an arena slot (datahelix._slot) and this process wraps
the slot's tensors with torch.frombuffer().
"""
import array
import builtins
import itertools
import math
import multiprocessing
import os
import re
import select
import shutil
import signal
import sys
import tempfile
import time
import typing
import warnings
import weakref

import torch
from torch.utils.data import (BatchSampler, DistributedSampler,
                              RandomSampler, SequentialSampler)
from torch.utils.data.dataloader import _InfiniteConstantSampler
from torch.utils.data._utils.collate import default_collate, default_convert

from . import _C, _forkserver, _passes, _slot
from ._options import Meter
from ._ship import dataset_file_bytes  # noqa: F401 (_loader, _video)
from ._ship import fork_only_file_bytes
from ._C import ArenaExhausted, DataError, SampleError
from ._C import TimeoutError as DataTimeoutError
from ._jobkey import JobKey
from . import _log
from ._log import LOGGER
from ._cache import cache_stats
from ._services import (Closing, Coordinator, binary, claim_coordinator,
                        coordinator_address, find_coordinator, loader_ordinal,
                        metrics_args, release_coordinator, remove_args,
                        serve_coordinator, service_binary)

_HDR = 1 << 63
_M63 = _HDR - 1
_CHUNK = 1024                  # steps given to the client at a time
_MAX_STEP = (1 << 16) - 1      # indices per step (the header takes one id)
_DEFAULT_WORKER_TIMEOUT = 600.0
_MAX_WORKERS = 64  # DS_PY_MAX_WORKERS
_STARTUP_S = 60.0  # more for the first batch: workers import and unpickle
_FORKS_S = 10.0  # `_workers` waits so long for the forks it names
_PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_SEQ_BITS, _WORKER_BITS = 32, 6
_ITER_MASK = (1 << (63 - _SEQ_BITS - _WORKER_BITS)) - 1
_STREAM_CHUNK_MAX = 1024
_STATE_VERSION = 1
_RECLAIM_S = 40.0  # a restarted client waits so long for its rank's claim
# (a shared Coordinator's: its claim timeout is 30 s)
_KILLED = re.compile(r"\(pid (\d+)\) was killed by signal \d+ \(([^)]*)\)")
T_co = typing.TypeVar("T_co", covariant=True)


class DataLoaderTimeout(DataTimeoutError):
    """No batch within `timeout` seconds (torch raises RuntimeError: this
    is a RuntimeError, a datahelix.DataError, a datahelix.TimeoutError and
    a builtins.TimeoutError)."""


def _mix(a, b):
    """splitmix64 of two integers, 63 bits (the base seed of an epoch)."""
    m = (1 << 64) - 1
    z = (a * 0x9E3779B97F4A7C15 + b + 0x632BE59BD9B4E019) & m
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
    return (z ^ (z >> 31)) & _M63


class _ShardSampler(torch.utils.data.Sampler):
    """DistributedSampler's share for several ranks with a user generator:
    the permutation is drawn from `generator` (seed it alike on every
    rank), padded or cut to a multiple of the world size, then strided."""

    def __init__(self, n, world, rank, generator, drop_last):
        self.n, self.world, self.rank = n, world, rank
        self.generator, self.drop_last = generator, drop_last
        if drop_last and n % world:
            self.num_samples = math.ceil((n - world) / world)
        else:
            self.num_samples = math.ceil(n / world)
        self.total = self.num_samples * world

    def __iter__(self):
        idx = torch.randperm(self.n, generator=self.generator).tolist()
        if self.drop_last:
            idx = idx[:self.total]
        elif idx:
            idx += (idx * math.ceil(self.total / len(idx)))[
                :self.total - len(idx)]
        return iter(idx[self.rank:self.total:self.world])

    def __len__(self):
        return self.num_samples


class _LiveSampler(DistributedSampler):
    """DistributedSampler (the same order) whose length follows the
    dataset's, as torch's RandomSampler's does: a dataset that grows after
    the loader is made is sampled whole (torch's test_growing_dataset)."""

    def _refresh(self):
        n = len(self.dataset)
        if self.drop_last and n % self.num_replicas:
            self.num_samples = math.ceil((n - self.num_replicas) /
                                         self.num_replicas)
        else:
            self.num_samples = math.ceil(n / self.num_replicas)
        self.total_size = self.num_samples * self.num_replicas

    def __iter__(self):
        self._refresh()
        return super().__iter__()

    def __len__(self):
        self._refresh()
        return self.num_samples


def _error_type(module, qualname):
    """The exception class a worker raised, if this process already has it:
    looked up by name among the builtins and the modules already imported,
    never imported (a name from a slot must not run a module's code)."""
    try:
        obj = builtins if module == "builtins" else sys.modules.get(module)
        for i, part in enumerate(qualname.split(".") if obj is not None
                                 else ()):
            # A qualname walks the module, then nested classes only: not
            # through __class__, __builtins__, or into other modules.
            if part.startswith("__") or (i and not isinstance(obj, type)):
                return None
            obj = getattr(obj, part)
        return obj if isinstance(obj, type) and \
            issubclass(obj, Exception) else None
    except Exception:
        return None


class _KeyErrorMessage(str):
    def __repr__(self):
        return self


_hybrids = {}


def _hybrid(exc_type):
    """A class that is both datahelix.SampleError and `exc_type`, so that
    `except ValueError` (torch's behaviour) and `except SampleError` both
    catch a dataset's ValueError; None where that cannot be."""
    if exc_type is None or issubclass(exc_type, SampleError):
        return exc_type
    if issubclass(exc_type, (StopIteration, StopAsyncIteration,
                             GeneratorExit)):
        return None  # would end the user's for loop silently
    if exc_type not in _hybrids:
        try:
            _hybrids[exc_type] = type(exc_type.__name__,
                                      (SampleError, exc_type),
                                      {"__module__": exc_type.__module__})
        except TypeError:
            _hybrids[exc_type] = None
    return _hybrids[exc_type]


_LOAD_FAILED = re.compile(r"cannot load the dataset: ([A-Za-z_][\w.]*): ")
_load_hybrids = {}


def _load_error(e):
    """Workers that could not load the dataset (its unpickling or
    worker_init_fn raised): as torch re-raises that exception's type at
    next(), the DataError is also of that type when this process has it
    (_error_type: builtins and imported modules, looked up, never
    imported); else `e` itself."""
    m = _LOAD_FAILED.search(str(e))
    base = type(e)
    if not m or base not in (DataError, SampleError):
        return e
    mod, _, name = m.group(1).rpartition(".")
    cls = _error_type(mod or "builtins", name)
    if cls is None or issubclass(cls, (DataError, StopIteration,
                                       StopAsyncIteration, GeneratorExit)):
        return e
    if (base, cls) not in _load_hybrids:
        try:
            _load_hybrids[base, cls] = type(cls.__name__, (base, cls),
                                            {"__module__": cls.__module__})
        except TypeError:
            _load_hybrids[base, cls] = None
    h = _load_hybrids[base, cls]
    if h is None:
        return e
    try:
        out = h(str(e))
    except Exception:
        return e
    for f in ("code", "sample_id", "path", "stage", "cause", "server",
              "consumed", "epoch", "step", "rank"):
        if hasattr(e, f):
            try:
                setattr(out, f, getattr(e, f))
            except AttributeError:
                pass
    return out


def _raise_worker_error(err, rank, epoch, step):
    """Re-raises what a dataset / collate_fn raised in a worker, as torch
    does ("Caught X in ...", then the original traceback), with the type
    combined with SampleError (stage "dataset", or "collate" when no sample
    is named, or "encode": the batch holds a value the slot format cannot
    carry).  The type is the worker's only if this process has it already
    (builtins, imported modules: _error_type); else SampleError."""
    stage = err.get("stage") or ("dataset" if err["sample"] is not None
                                 else "collate")
    where = (f"{err['where']} (pid {err['pid']}) for rank {rank} epoch "
             f"{epoch} step {step}" +
             {"dataset": f" sample {err['sample']}",
              "collate": " (in collate_fn)",
              "encode": " (writing the batch into its slot)"}[stage])
    msg = f"Caught {err['name']} {where}.\nOriginal {err['traceback']}"
    cls = _hybrid(_error_type(err["module"], err["qualname"]))
    exc = None
    if cls is not None:
        try:
            exc = cls(_KeyErrorMessage(msg) if issubclass(cls, KeyError)
                      else msg)
            if msg not in str(exc):
                exc = None
        except Exception:
            exc = None
    if exc is None:
        exc = SampleError(msg)
    lines = err["traceback"].strip().splitlines()
    exc.sample_id = err["sample"]
    exc.path = None
    exc.stage = stage
    exc.cause = lines[-1] if lines else err["name"]
    exc.code = None
    exc.server = None
    exc.worker_traceback = err["traceback"]
    exc.epoch, exc.step, exc.rank = epoch, step, rank
    raise exc


def _gen_hex(g):
    return bytes(g.get_state().tolist()).hex()


def _gen_load(g, h):
    g.set_state(torch.tensor(list(bytes.fromhex(h)), dtype=torch.uint8))


def _plain(obj):
    """A worker's dataset state as this process keeps it: tensors copied
    out of the arena slot (the slot goes back), containers rebuilt."""
    if isinstance(obj, torch.Tensor):
        return obj.clone()
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_plain(v) for v in obj]
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return tuple(_plain(v) for v in obj)
    return obj


class _WorkerProcess:
    """A Python worker's process as torch's iterator lists them
    (`it._workers`, multiprocessing.Process's reading side): pid,
    is_alive(), join(timeout), exitcode, terminate().  It is the fork
    server's child, not this process's: its end is seen through a pidfd,
    its exit status through the fork server (_forkserver.Events)."""

    def __init__(self, events, pid):
        self.pid, self._events = pid, events
        try:
            self._pidfd = os.pidfd_open(pid)
        except OSError:
            self._pidfd = None  # already gone

    def is_alive(self):
        if self._pidfd is None:
            return False
        r, _, _ = select.select([self._pidfd], [], [], 0)
        return not r

    def join(self, timeout=None):
        if self._pidfd is not None:
            select.select([self._pidfd], [], [], timeout)

    @property
    def exitcode(self):
        """None while it runs (or if the fork server could not say), else
        as multiprocessing's: the exit code, or -N if signal N ended it."""
        if self.is_alive():
            return None
        end = time.monotonic() + 2.0  # the fork server reaps it, then says
        while self.pid not in self._events.status and \
                time.monotonic() < end and self._events.fd is not None:
            self._events.poll(0.05)
        st = self._events.status.get(self.pid)
        return None if st is None else os.waitstatus_to_exitcode(st)

    def _signal(self, sig):
        if self.is_alive():
            try:
                signal.pidfd_send_signal(self._pidfd, sig)
            except OSError:
                pass

    def terminate(self):
        self._signal(signal.SIGTERM)

    def kill(self):
        self._signal(signal.SIGKILL)

    def __del__(self):
        if getattr(self, "_pidfd", None) is not None:
            os.close(self._pidfd)
            self._pidfd = None

    def __repr__(self):
        return f"<datahelix worker process {self.pid}>"


class _Iter:
    """One pass over a map-style loader (what iter(loader) returns)."""

    def __init__(self, loader):
        self._loader = loader
        resume = loader._begin_pass("map")
        # What the order comes from, as it was before this pass drew from
        # it: state_dict() saves these and the steps consumed.
        self._sources = loader._snapshot_sources()
        # As torch: the sampler's iterator first, then the base seed (from
        # the generator, which a RandomSampler then also draws from).
        self._batches = iter(loader._index_sampler)
        self._base_seed = loader._iteration_seed()
        self._pass = loader._new_pass()
        self._epoch = loader._epoch
        self._off = 0        # steps of this epoch before this pass (resume)
        if resume is not None:
            self._off = int(resume["step"])
            for _ in itertools.islice(self._batches, self._off):
                pass
        try:
            self._len = len(loader) - self._off
        except TypeError:  # a sampler without len(), as torch allows
            self._len = None
        self._k = 0          # steps consumed
        self._given = 0      # steps given to the client
        self._done = False
        loader._current = self
        loader._meter.start(self._epoch, loader._passes + 1,
                            loader._client_stats())
        loader._passes += 1

    def __iter__(self):
        return self

    def __del__(self):
        # The loader holds its pass weakly (so that dropping both ends
        # the workers at once, as torch's do, without waiting for the
        # garbage collector); a pass left unfinished (a break) leaves its
        # state for state_dict().
        try:
            L = self._loader
            # only the latest pass speaks (an older one may die after it)
            if L._current in (None, self) and \
                    L.__dict__.get("_current_pass") == self._pass:
                L._dropped = None if self._done else self._state()
        except Exception:
            pass

    @property
    def _workers(self):
        """torch's iterator's list of its worker processes (tests read it
        to see workers end): _WorkerProcess objects, by worker id."""
        return self._loader._worker_processes()

    def __len__(self):
        if self._len is None:
            raise TypeError("the sampler has no len()")
        return self._len

    def _state(self):
        return {"version": _STATE_VERSION, "kind": "map",
                "epoch": self._epoch, "step": self._off + self._k,
                "sources": self._sources}

    def _refill(self):
        L = self._loader
        chunk = list(itertools.islice(self._batches, _CHUNK))
        if not chunk:
            return False
        ids = array.array("Q")
        offs = array.array("Q", [0])
        hdr = _HDR | self._base_seed
        for b in chunk:
            idx = list(b) if L._auto_collation else [b]
            if len(idx) > _MAX_STEP:
                raise ValueError(f"a batch of {len(idx)} samples: at most "
                                 f"{_MAX_STEP} per step")
            ids.append(hdr)
            for i in idx:
                i = int(i)
                if not 0 <= i < _HDR:
                    raise ValueError(f"sample index {i}: DistributedData"
                                     "Loader takes indices 0 .. 2^63-1")
                ids.append(i)
            offs.append(len(ids))
        if self._given + len(chunk) > (1 << 24):
            raise ValueError("more than 2^24 steps in one epoch")
        # One pass per iteration; its chunks continue it (later steps).
        L._client.start_pass(self._epoch, self._pass, self._given,
                             ids.tobytes(), offs.tobytes())
        self._given += len(chunk)
        return True

    def _check_current(self):
        L = self._loader
        if L._current is not self or L._client is None:
            raise RuntimeError("this DistributedDataLoader iterator was "
                               "superseded by a newer iter(loader) (or the "
                               "loader was closed): one pass at a time")

    def __next__(self):
        L = self._loader
        if self._done:
            raise StopIteration
        self._check_current()
        if self._k == self._given and not self._refill():
            self._done = True
            L._pass_ended()
            raise StopIteration
        return L._next_batch(self)["obj"]


class _StreamIter(_Iter):
    """One pass over an IterableDataset loader: worker w's stream gives
    the steps pinned to it, in turn over the workers whose streams have
    not ended (torch's order: round robin, a worker left out once its
    StopIteration arrives)."""

    def __init__(self, loader):
        self._loader = loader
        resume = loader._begin_pass("iterable")
        self._sources = loader._snapshot_sources()
        self._base_seed = loader._iteration_seed()
        W = self._W = loader._stream_workers()
        self._seq = [0] * W        # steps given, per worker
        self._cons = [0] * W       # batches (or its end) consumed
        self._states = [None] * W  # each worker's dataset state after them
        self._ended = [False] * W  # its end consumed
        self._rr = 0               # the worker of the next step
        self._off = 0
        if resume is not None:
            # The same base seed: a worker that replays its stream draws
            # as it did.
            self._base_seed = int(resume["base_seed"])
            ws = resume["workers"]
            if len(ws) != W:
                raise ValueError(f"load_state_dict(): a state of {len(ws)} "
                                 f"workers, this loader runs {W}")
            for w, st in enumerate(ws):
                self._seq[w] = self._cons[w] = int(st["seq"])
                self._ended[w] = bool(st["ended"])
                self._states[w] = st.get("state")
            self._rr = int(resume["rr"]) % W
            self._off = int(resume["step"])
        self._issue_rr = self._rr
        self._pass = loader._new_pass()
        self._epoch = loader._epoch
        self._iteration = loader._new_iteration()
        self._plan = []            # (worker, seq) of each step given
        self._chunk = max(8, 2 * loader._prefetch())
        self._k = self._given = 0
        self._yielded = 0
        self._len_called = loader._IterableDataset_len_called
        self._done = False
        self._len = None
        loader._current = self
        loader._meter.start(self._epoch, loader._passes + 1,
                            loader._client_stats())
        loader._passes += 1

    def __len__(self):
        return len(self._loader)

    def _state(self):
        W = self._W
        return {"version": _STATE_VERSION, "kind": "iterable",
                "epoch": self._epoch, "step": self._off + self._k,
                "base_seed": self._base_seed, "rr": self._rr,
                "sources": self._sources,
                "workers": [{"seq": self._cons[w], "ended": self._ended[w],
                             "state": self._states[w]} for w in range(W)]}

    def _refill(self):
        L = self._loader
        live = [w for w in range(self._W) if not self._ended[w]]
        if not live:
            return False
        ids = array.array("Q")
        offs = array.array("Q", [0])
        hdr = _HDR | self._base_seed
        it = (self._iteration & _ITER_MASK) << (_SEQ_BITS + _WORKER_BITS)
        w = self._issue_rr
        for _ in range(self._chunk):
            while self._ended[w]:
                w = (w + 1) % self._W
            if self._seq[w] >= 1 << _SEQ_BITS:
                raise ValueError(f"worker {w}: more than 2^32 batches")
            ids.append(hdr)
            ids.append(_HDR | it | (w << _SEQ_BITS) | self._seq[w])
            offs.append(len(ids))
            self._plan.append((w, self._seq[w]))
            self._seq[w] += 1
            w = (w + 1) % self._W
        self._issue_rr = w
        if self._given + self._chunk > (1 << 24):
            raise ValueError("more than 2^24 steps in one epoch")
        L._client.start_pass(self._epoch, self._pass, self._given,
                             ids.tobytes(), offs.tobytes())
        self._given += self._chunk
        self._chunk = min(_STREAM_CHUNK_MAX, self._chunk * 2)
        return True

    def __next__(self):
        L = self._loader
        if self._done:
            raise StopIteration
        self._check_current()
        while True:
            if self._k == self._given:
                # The steps given to workers whose end came are dropped:
                # the next turn starts after the last worker consumed.
                self._issue_rr = self._rr
                self._seq = list(self._cons)
                if not self._refill():
                    self._done = True
                    L._pass_ended()
                    raise StopIteration
            w, seq = self._plan[self._k]
            if self._ended[w]:
                # given before its end came: the worker answers "end".
                L._next_batch(self, stream=True)
                L._ends += 1
                continue
            k = self._k
            try:
                out = L._next_batch(self, stream=True)
            except BaseException:
                if self._k > k:  # the step is consumed (its error raised)
                    self._cons[w] = seq + 1
                    self._rr = (w + 1) % self._W
                raise
            self._cons[w] = seq + 1
            self._rr = (w + 1) % self._W
            if out["kind"] == "end":
                self._ended[w] = True
                L._ends += 1
                continue
            if "state" in out:
                self._states[w] = _plain(out["state"])
            self._yielded += 1
            n = self._len_called
            if n is not None and self._yielded > n:
                msg = (f"Length of IterableDataset {L.dataset} was reported "
                       f"to be {n} (when accessing len(dataloader)), but "
                       f"{self._yielded} samples have been fetched. ")
                if L.num_workers > 0:
                    msg += ("For multiprocessing data-loading, this could be "
                            "caused by not properly configuring the "
                            "IterableDataset replica at each worker. Please "
                            "see https://pytorch.org/docs/stable/data.html"
                            "#torch.utils.data.IterableDataset for examples.")
                warnings.warn(msg)
            return out["obj"]


def _warn_workers(num_workers):
    """torch's warning for more workers than CPUs (it runs them anyway);
    past the DataServer's _MAX_WORKERS they are capped, and the warning
    says so (issue 41: a warning, not a refusal, as torch)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
        else (os.cpu_count() or 1)
    if num_workers <= cpus:
        return
    cap = (f" This DataServer runs at most {_MAX_WORKERS} Python workers: "
           f"{_MAX_WORKERS} will run." if num_workers > _MAX_WORKERS else "")
    warnings.warn(
        f"This DataLoader will create {num_workers} worker processes in "
        f"total. Our suggested max number of worker in current system is "
        f"{cpus}, which is smaller than what this DataLoader is going to "
        "create. Please be aware that excessive worker creation might get "
        "DataLoader running slow or even freeze, lower the worker number to "
        f"avoid potential slowness/freeze if necessary.{cap}", UserWarning,
        stacklevel=3)


def _check_context(ctx, num_workers):
    """torch's checks of multiprocessing_context.  Any valid one is
    accepted: the DataServer's workers always start as spawn's do (a fresh
    interpreter; the dataset shipped with cloudpickle), whatever it
    names."""
    if ctx is None:
        return
    if num_workers == 0:
        raise ValueError("multiprocessing_context can only be used with "
                         "multi-process loading (num_workers > 0), but got "
                         f"num_workers={num_workers}")
    if isinstance(ctx, str):
        methods = multiprocessing.get_all_start_methods()
        if ctx not in methods:
            raise ValueError("multiprocessing_context option should specify "
                             f"a valid start method in {methods!r}, but got "
                             f"multiprocessing_context={ctx!r}")
    elif not isinstance(ctx, multiprocessing.context.BaseContext):
        raise TypeError("multiprocessing_context option should be a valid "
                        "context object or a string specifying the start "
                        f"method, but got multiprocessing_context={ctx}")


class DistributedDataLoader(Closing, typing.Generic[T_co]):
    """torch.utils.data.DataLoader's arguments and behaviour over any
    map-style Dataset or IterableDataset, with the samples loaded by Python
    worker processes of this rank's local DataServer and handed over
    through shared memory (zero copy).  See docs/python.md
    "DistributedDataLoader" for what differs from torch.

    Beyond torch's arguments (keyword only): ``in_order`` (accepted; the
    batches always come in order); ``estimate_cost`` (callable
    index -> CPU ms; default ``dataset.estimate_cost`` if it has one) feeds
    the placement cost model; ``rank`` / ``world_size`` (default:
    torch.distributed, else RANK / WORLD_SIZE) choose this rank's share of
    the default sampler (of an IterableDataset: the rank's workers are
    workers rank * W .. rank * W + W - 1 of world * W in get_worker_info());
    ``seed`` (shuffle and random draws derive from seed + epoch);
    ``coordinator``; ``arena_mb`` (shared memory for batches in flight and
    held); ``worker_timeout`` (seconds a worker may spend on one batch
    before it is killed and replaced); ``python`` (the workers'
    interpreter); ``keyfile`` (the job key, as datahelix.DataLoader's: None
    makes one per job when this loader starts the Coordinator);
    ``metrics_listen`` / ``metrics_token_file`` (the Coordinator's metrics
    endpoint, as datahelix.DataLoader's).
    """

    __initialized = False

    def __init__(self, dataset, batch_size=1, shuffle=None, sampler=None,
                 batch_sampler=None, num_workers=0, collate_fn=None,
                 pin_memory=False, drop_last=False, timeout=0,
                 worker_init_fn=None, multiprocessing_context=None,
                 generator=None, *, prefetch_factor=2,
                 persistent_workers=False, pin_memory_device="",
                 in_order=True, estimate_cost=None, rank=None,
                 world_size=None, seed=0, coordinator=None, arena_mb=256,
                 worker_timeout=None, python=None, keyfile=None,
                 metrics_listen=None, metrics_token_file=None,
                 heartbeat_timeout=None):
        iterable = isinstance(dataset, torch.utils.data.IterableDataset)
        if not iterable and (not hasattr(dataset, "__getitem__") or
                             not hasattr(dataset, "__len__")):
            raise ValueError("DistributedDataLoader takes a map-style "
                             "dataset (__getitem__ and __len__) or a torch "
                             f"IterableDataset; {type(dataset).__name__} is "
                             "neither")
        if num_workers < 0:
            raise ValueError("num_workers option should be non-negative; "
                             "use num_workers=0 to disable multiprocessing.")
        _warn_workers(num_workers)
        if timeout < 0:
            raise ValueError("timeout option should be non-negative")
        if num_workers == 0 and prefetch_factor != 2:
            raise ValueError("prefetch_factor option could only be specified "
                             "in multiprocessing.let num_workers > 0 to "
                             "enable multiprocessing.")
        if prefetch_factor is None or prefetch_factor < 1:
            raise ValueError("prefetch_factor must be >= 1")
        if persistent_workers and num_workers == 0:
            raise ValueError("persistent_workers option needs num_workers "
                             "> 0")
        pipe = isinstance(dataset, torch.utils.data.IterDataPipe)
        if pipe and shuffle is not None:  # as torch: the pipe's shufflers
            dataset = torch.utils.data.graph_settings.apply_shuffle_settings(
                dataset, shuffle=shuffle)
        if iterable:
            if shuffle not in (None, False) and not pipe:
                raise ValueError("DataLoader with IterableDataset: expected "
                                 "unspecified shuffle option, but got "
                                 f"shuffle={shuffle}")
            if sampler is not None:
                raise ValueError("DataLoader with IterableDataset: expected "
                                 "unspecified sampler option, but got "
                                 f"sampler={sampler}")
            if batch_sampler is not None:
                raise ValueError("DataLoader with IterableDataset: expected "
                                 "unspecified batch_sampler option, but got "
                                 f"batch_sampler={batch_sampler}")
        if sampler is not None and shuffle:
            raise ValueError("sampler option is mutually exclusive with "
                             "shuffle")
        if batch_sampler is not None:
            if batch_size != 1 or shuffle or sampler is not None or \
                    drop_last:
                raise ValueError("batch_sampler option is mutually "
                                 "exclusive with batch_size, shuffle, "
                                 "sampler, and drop_last")
            batch_size, drop_last = None, False
        elif batch_size is None and drop_last:
            raise ValueError("batch_size=None option disables auto-batching "
                             "and is mutually exclusive with drop_last")
        _check_context(multiprocessing_context, num_workers)
        if arena_mb < 1:
            raise ValueError("arena_mb must be >= 1")
        self._iterable = iterable
        self.in_order = bool(in_order)
        from ._loader import _rank_world
        rank, world_size = _rank_world(rank, world_size)
        self.rank, self.world_size, self.seed = rank, world_size, int(seed)
        if iterable:
            sampler = _InfiniteConstantSampler()
        elif sampler is None and batch_sampler is None:
            sampler = self._default_sampler(dataset, shuffle, generator,
                                            drop_last)
        if batch_size is not None and batch_sampler is None:
            batch_sampler = BatchSampler(sampler, batch_size, drop_last)
        if collate_fn is None:
            collate_fn = default_collate if batch_sampler is not None \
                else default_convert
        self.dataset = dataset
        self.batch_size, self.drop_last = batch_size, drop_last
        self.sampler, self.batch_sampler = sampler, batch_sampler
        self.num_workers, self.collate_fn = num_workers, collate_fn
        self.pin_memory, self.pin_memory_device = pin_memory, pin_memory_device
        self.timeout, self.worker_init_fn = timeout, worker_init_fn
        self.multiprocessing_context = multiprocessing_context
        self.generator, self.prefetch_factor = generator, prefetch_factor
        self.persistent_workers = persistent_workers
        if estimate_cost is None:
            estimate_cost = getattr(dataset, "estimate_cost", None)
        self.estimate_cost = estimate_cost
        self.coordinator, self.arena_mb = coordinator, int(arena_mb)
        self._keyfile_arg, self._key = keyfile, None
        self._metrics_args = metrics_args(metrics_listen, metrics_token_file,
                                          coordinator, heartbeat_timeout)
        self.worker_timeout = float(worker_timeout if worker_timeout
                                    else _DEFAULT_WORKER_TIMEOUT)
        self.python = python or sys.executable
        self._instance = loader_ordinal()
        self._claim = None
        self._epoch = 0
        self._client = None
        self._warm = False  # a batch came since the client started
        self._coord = None
        self._dir = None
        self._fs = None  # the fork server of the current client
        self._must_fork = False  # the dataset cannot be pickled
        self._coord_dir = None
        self._current = None
        self._resume = None         # load_state_dict()'s, for the next pass
        self._resume_ship = None    # an IterableDataset's, for the workers
        self._iterations = 0
        self._passes = 0
        self._ends = 0  # stream steps that were a worker's end, not a batch
        self._addr = None
        self._restarts = 0
        self._old_dirs = []
        self._shipped = None  # the dataset file's bytes the workers have
        self._meter = Meter()
        self._IterableDataset_len_called = None
        self.__initialized = True

    @property
    def _current(self):
        """The pass under way (an _Iter), held weakly: see _Iter.__del__."""
        ref = self.__dict__.get("_current_ref")
        return ref() if ref is not None else None

    @_current.setter
    def _current(self, it):
        self.__dict__["_current_ref"] = None if it is None else \
            weakref.ref(it)
        self.__dict__["_current_pass"] = getattr(it, "_pass", None)
        self.__dict__["_dropped"] = None

    def __setattr__(self, attr, val):
        # As torch: these define the pass's steps and the workers' copy.
        if self.__initialized and attr in (
                "batch_size", "batch_sampler", "sampler", "drop_last",
                "dataset", "persistent_workers"):
            raise ValueError(f"{attr} attribute should not be set after "
                             f"{type(self).__name__} is initialized")
        super().__setattr__(attr, val)

    # -- torch.utils.data.DataLoader's view ---------------------------------

    def _default_sampler(self, dataset, shuffle, generator, drop_last):
        """Sequential, or shuffled from seed + epoch (DistributedSampler);
        with a generator and one rank, torch's RandomSampler; with several
        ranks, this rank's DistributedSampler-like share."""
        if self.world_size == 1:
            if not shuffle:
                return SequentialSampler(dataset)
            if generator is not None:
                return RandomSampler(dataset, generator=generator)
        if shuffle and generator is not None:
            return _ShardSampler(len(dataset), self.world_size, self.rank,
                                 generator, drop_last)
        return _LiveSampler(dataset, num_replicas=self.world_size,
                            rank=self.rank, shuffle=bool(shuffle),
                            seed=self.seed, drop_last=drop_last)

    @property
    def _auto_collation(self):
        return self.batch_sampler is not None

    @property
    def _index_sampler(self):
        return self.batch_sampler if self._auto_collation else self.sampler

    def __len__(self):
        if self._iterable:  # as torch: the dataset's, in batches
            n = self._IterableDataset_len_called = len(self.dataset)
            if self.batch_size is not None:
                n = n // self.batch_size if self.drop_last else \
                    math.ceil(n / self.batch_size)
            return n
        return len(self._index_sampler)

    def set_epoch(self, epoch):
        """The epoch the next iteration runs: the shuffle (seed + epoch)
        and every sample's random draws derive from it.  Passed on to the
        sampler if it has set_epoch (a DistributedSampler)."""
        self._epoch = int(epoch)
        done = set()
        for s in (self.sampler, self.batch_sampler,
                  getattr(self.batch_sampler, "sampler", None)):
            if s is not None and id(s) not in done and \
                    hasattr(s, "set_epoch"):
                done.add(id(s))
                s.set_epoch(self._epoch)

    def __iter__(self):
        self._reship()
        return _StreamIter(self) if self._iterable else _Iter(self)

    def start(self):
        """Starts this loader's DataServer and its Python workers now
        (they import torch and unpickle the dataset: seconds), so that
        the first iter() finds them ready - call it before building the
        model.  Optional: iter() starts them otherwise.  A dataset changed
        between start() and the first iter() is shipped again then."""
        self._ensure_client()
        return self

    def _reship(self):
        """As torch's workers, started at the first iter() and again for
        each pass unless persistent_workers, see the dataset as it is
        then: a dataset (or collate_fn, worker_init_fn) changed since the
        workers took it - one that grew between epochs - restarts them
        with the new one.  Persistent workers keep the copy of their
        first pass, as torch's do."""
        if self._client is None or (self.persistent_workers and
                                    self._passes > 0):
            return
        try:
            now = self._payload()
        except TypeError:
            # unpicklable: forked afresh for each pass, as torch's workers
            # (else the next start says why)
            if not isinstance(self._shipped, bytes):
                self._stop_client()
            return
        if now != self._shipped:
            self._stop_client()

    # -- per iteration ------------------------------------------------------

    def _iteration_seed(self):
        if self.generator is not None:  # as torch draws it
            return int(torch.empty((), dtype=torch.int64)
                       .random_(generator=self.generator).item()) & _M63
        return _mix(self.seed, self._epoch)

    def _new_pass(self):
        # Every iteration is a new pass, so it gets task ids of its own (the
        # wire's (pass, step, rank, part), the epoch beside it): a late
        # result of an abandoned pass can never stand for a step of this
        # one.  Never reused in this process, never wrapped (_passes.py).
        return _passes.new_pass()

    def _timeout_ms(self):
        t = self.timeout if self.timeout > 0 else self.worker_timeout + 60
        return max(1, int(t * 1000))

    def _next_batch(self, it, stream=False):
        """The step's decoded slot: {"kind": "batch", "obj", ["state"]} or,
        of a stream step, {"kind": "end"}; a worker's error raised."""
        k, c = it._off + it._k, self._client
        if self._fs is not None:
            self._fs.events.poll()  # the fork server's pipe never fills
        # The workers' start-up is allowed for only without timeout=: a
        # timeout the user set counts from next() on, as torch's does.
        extra = 0 if self._warm or self.timeout > 0 else \
            int(_STARTUP_S * 1000)
        try:
            b = c.next(self._timeout_ms() + extra)
        except DataTimeoutError:
            raise DataLoaderTimeout(
                f"DataLoader timed out after "
                f"{(self._timeout_ms() + extra) / 1000:g} seconds (rank "
                f"{self.rank} epoch {it._epoch} step {k}: no batch from the "
                "DataServer's Python workers" +
                ("" if self._warm else ", which were starting") + ")") \
                from None
        except (SampleError, ArenaExhausted) as e:
            self._warm = True
            if e.consumed:
                it._k += 1
            raise _load_error(self._step_error(e, it, k)) from None
        except DataError as e:
            self._warm = True
            e = _load_error(e)
            e.epoch, e.step, e.rank = it._epoch, k, self.rank
            raise e from None
        self._warm = True
        if b is None:  # cannot happen: steps are given before asked for
            raise DataError(f"rank {self.rank}: the client ended the epoch "
                            f"at step {k} of {it._given}")
        it._k += 1
        self._meter.batch(getattr(b, "input_wait_ms", 0.0))
        part = None
        try:
            part = b.part(0)
            out = _slot.decode(part)
        except (ValueError, TypeError, RuntimeError, MemoryError) as e:
            # A malformed slot (_slot.SlotError) and what torch / numpy say
            # of a view: an error of this step, never a crash.
            size = len(memoryview(part)) if part is not None else 0
            raise DataError(f"rank {self.rank} epoch {it._epoch} step {k}: "
                            f"the batch in its arena slot ({size} bytes) "
                            f"cannot be read: {e}") from None
        finally:
            del b, part
        if out["kind"] == "error":
            _raise_worker_error(out, self.rank, it._epoch, k)
        if out["kind"] == "end" and not stream:
            raise DataError(f"rank {self.rank} epoch {it._epoch} step {k}: "
                            "a stream's end for a map-style step")
        if out["kind"] == "batch" and self.pin_memory and \
                torch.cuda.is_available():
            from torch.utils.data._utils.pin_memory import pin_memory
            out["obj"] = pin_memory(out["obj"], self.pin_memory_device or
                                    None)
        return out

    def _step_error(self, e, it, k):
        """The same kind of error for a failed step, with this rank's epoch
        and step (not the wire's), from its fields."""
        who = ("" if e.sample_id is None or self._iterable else
               f"sample {e.sample_id} ({e.path or 'no path'}): ")
        msg = f"rank {self.rank} epoch {it._epoch} step {k}: {who}{e.cause}"
        m = _KILLED.search(str(e.cause))
        if m:  # torch's words first, ours after
            msg = (f"DataLoader worker (pid {m.group(1)}) is killed by "
                   f"signal: {m.group(2)}. ({msg})")
        err = type(e)(msg)
        for f in ("sample_id", "path", "stage", "cause", "code", "server",
                  "consumed"):
            setattr(err, f, getattr(e, f))
        err.epoch, err.step, err.rank = it._epoch, k, self.rank
        return err

    # -- services -----------------------------------------------------------

    def _payload_or_fork(self):
        """_payload(), or - where the workers fork (_forks) - the
        TypeError of a dataset that cannot be pickled (one holding a
        multiprocessing.Value, a lock, an open file): its workers inherit
        it from the fork server as torch's forked workers do, and see it
        as it is at each pass's start (_reship)."""
        try:
            payload = self._payload()
            self._must_fork = False
            return payload
        except TypeError as e:
            # Whatever the start method: spawn would have to pickle it
            # too (torch's spawn passes it at the workers' start).
            if self.python != sys.executable or \
                    not _forkserver.available():
                raise
            self._must_fork = True
            return e

    def _payload(self):
        """The pickled dataset file's bytes (dataset_file_bytes)."""
        return dataset_file_bytes(self._inner(), "DistributedDataLoader "
                                  "ships the dataset, collate_fn and "
                                  "worker_init_fn to the DataServer's "
                                  "worker processes")

    def _inner(self):
        """What the workers load: the dataset file's contents."""
        return {"dataset": self.dataset, "collate_fn": self.collate_fn,
                 "worker_init_fn": self.worker_init_fn,
                 "auto_collation": self._auto_collation,
                 "iterable": self._iterable, "batch_size": self.batch_size,
                 "drop_last": self.drop_last, "rank": self.rank,
                 "world_size": self.world_size,
                 # num_workers=0: the one worker stands for the main
                 # process (get_worker_info() is None, as torch's)
                 "main_process": self._iterable and self.num_workers == 0,
                 "resume": self._resume_ship}

    def _forks(self):
        """Whether the workers fork from a fork server (docs/python.md
        "Start-up"): where torch's would fork (multiprocessing_context
        'fork', or None where that is the default) and they run this
        interpreter; else each starts as a fresh one, as spawn's."""
        ctx = self.multiprocessing_context
        if isinstance(ctx, multiprocessing.context.BaseContext):
            ctx = ctx.get_start_method()
        if ctx is None:
            ctx = multiprocessing.get_start_method(allow_none=True) or \
                multiprocessing.get_all_start_methods()[0]
        return (ctx == "fork" or self._must_fork) and \
            self.python == sys.executable and _forkserver.available()

    def _stream_workers(self):
        """The Python workers that run: num_workers, at least 1 (the main
        process's stand-in), at most _MAX_WORKERS (_warn_workers)."""
        return min(_MAX_WORKERS, max(1, self.num_workers))

    def _prefetch(self):
        return min(256, self.prefetch_factor * self._stream_workers())

    def _new_iteration(self):
        self._iterations += 1
        return self._iterations

    def _snapshot_sources(self):
        """What the pass's order and seeds come from, as plain values:
        the generators' states and the samplers' own state_dict()s."""
        out = {"generators": [], "samplers": []}
        for g in self._generators():
            out["generators"].append(_gen_hex(g))
        for smp in self._samplers():
            f = getattr(smp, "state_dict", None)
            out["samplers"].append(f() if callable(f) else None)
        return out

    def _begin_pass(self, kind):
        """The client started, and the state load_state_dict() left for
        this pass (None: none), checked to be of a `kind`-style loader
        ("map" or "iterable") and its order's sources restored."""
        self._ensure_client()
        resume, self._resume = self._resume, None
        if resume is not None:
            other = resume["kind"]
            if other != kind:
                raise ValueError("load_state_dict(): a state of "
                                 f"{'an' if other == 'iterable' else 'a'} "
                                 f"{other}-style loader")
            self._restore_sources(resume)
        return resume

    def _worker_processes(self):
        """The Python workers' processes, by worker id (torch's
        iterator's `_workers`): forked ones only (else [])."""
        if self._fs is None:
            return []
        ev = self._fs.events
        n = self._stream_workers()
        ev.wait_workers(n, _FORKS_S)
        # a worker whose end was told is gone: its pid may be another's now
        return [_WorkerProcess(ev, ev.pids[i]) for i in range(n)
                if i in ev.pids and ev.pids[i] not in ev.status]

    def _restore_sources(self, state):
        src = state.get("sources") or {}
        gens, gs = self._generators(), src.get("generators", [])
        if len(gens) != len(gs):
            raise ValueError(f"load_state_dict(): a state of {len(gs)} "
                             f"generators, this loader has {len(gens)}")
        for g, h in zip(gens, gs):
            _gen_load(g, h)
        for smp, st in zip(self._samplers(), src.get("samplers", [])):
            if st is not None and callable(getattr(smp, "load_state_dict",
                                                   None)):
                smp.load_state_dict(st)

    def _generators(self):
        out = []
        for g in (self.generator, getattr(self.sampler, "generator", None)):
            if isinstance(g, torch.Generator) and \
                    all(g is not h for h in out):
                out.append(g)
        return out

    def _samplers(self):
        out = []
        for smp in (self.sampler, self.batch_sampler):
            if smp is not None and all(smp is not h for h in out):
                out.append(smp)
        return out

    def _pass_ended(self):
        self._meter.finish(self._client_stats())

    # -- resume, figures ----------------------------------------------------

    def state_dict(self):
        """Where the current pass is (torchdata StatefulDataLoader's
        contract): the steps consumed, the generators' states and the
        samplers' own state_dict()s at the pass's start; of an
        IterableDataset, each worker's place in its stream and its
        dataset's state_dict() (if it has one) after its last batch
        consumed.  Plain values (json- and torch.save-able, except what a
        dataset's state holds).  Before the first iter(), or after a pass
        ended, the state starts the next pass."""
        it = self._current
        if it is None and self._dropped is not None:
            return dict(self._dropped)  # a pass left (break), not ended
        if it is None or it._done:
            st = {"version": _STATE_VERSION,
                  "kind": "iterable" if self._iterable else "map",
                  "epoch": self._epoch, "step": 0, "fresh": True,
                  "sources": self._snapshot_sources()}
            return st
        return it._state()

    def load_state_dict(self, state):
        """The next iter() continues the pass `state` (state_dict()) was
        taken in, at its next step: a map-style pass draws the same order
        and skips the steps consumed; an IterableDataset's workers start
        from their dataset's saved state, or replay their streams to
        their place.  Restarts this loader's DataServer workers if they
        run (they take the state at start)."""
        if not isinstance(state, dict) or \
                state.get("version") != _STATE_VERSION:
            raise ValueError("load_state_dict(): not a state of this "
                             f"version ({_STATE_VERSION})")
        kind = "iterable" if self._iterable else "map"
        if state.get("kind") != kind:
            raise ValueError(f"load_state_dict(): a state of a "
                             f"{state.get('kind')}-style loader, this one "
                             f"is {kind}-style")
        self.set_epoch(int(state["epoch"]))
        if state.get("fresh"):
            self._restore_sources(state)
            self._resume = self._resume_ship = None
            return
        self._resume = state
        if self._iterable:
            W, base = self._stream_workers(), self.rank * \
                self._stream_workers()
            self._resume_ship = {
                "iteration": self._iterations + 1,
                "workers": {base + w: {"seq": int(x["seq"]),
                                       "ended": bool(x["ended"]),
                                       "state": x.get("state")}
                            for w, x in enumerate(state["workers"][:W])}}
            if self._client is not None:  # the workers read it at start
                self._stop_client()

    def _client_stats(self):
        if self._client is not None:
            s = self._client.stats()
            s["quarantine"] = self._client.quarantine()
            # A stream's end travels as a step; it is no batch.
            s["steps"] = s.get("steps", 0) - self._ends
            return s
        return dict(self._meter.last or {})

    def stats(self):
        """The loader's figures, with datahelix.DataLoader.stats()'s fields
        (docs/python.md "stats()"): cumulative at the top level, this
        pass's under "epoch", finished passes under "epochs"."""
        s = self._client_stats()
        s.setdefault("quarantine", [])
        s["skipped"] = 0
        s.update(self._meter.py)
        s["passes"] = self._passes
        s["epoch"] = self._meter.figures(s)
        s["epochs"] = list(self._meter.done)
        s.setdefault("substituted", 0)
        # a dataset's datahelix.decode() of S3 / HTTP(S) data uses the
        # cache $DATAHELIX_CACHE_DIR names, which its workers inherit
        d = os.environ.get("DATAHELIX_CACHE_DIR")
        s["cache"] = cache_stats(d) if d else None
        return s

    def _write_private(self, name, data):
        path = os.path.join(self._dir, name)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        return path

    def _index(self):
        # An IterableDataset's steps name no index: one row per worker.
        n = self._stream_workers() if self._iterable else len(self.dataset)
        cost = None
        if self.estimate_cost is not None and not self._iterable:
            est = self.estimate_cost
            cost = array.array("d", (max(0.0, float(est(i) or 0))
                                     for i in range(n)))
        path = os.path.join(self._dir, "index.dhx")
        _C.python_index(path, max(1, n), cost.tobytes() if cost else None,
                        type(self.dataset).__name__)
        return path

    def _coordinator_address(self):
        addr, start = self.coordinator, False
        if addr is None:
            addr, start = coordinator_address(self.rank, self.world_size,
                                              self._instance)
            if addr.startswith("ipc://"):
                self._coord_dir = os.path.dirname(addr[len("ipc://"):])
        self._claim = claim_coordinator(addr, self.rank, self)
        self._key = JobKey.resolve(
            self._keyfile_arg,
            self.coordinator is None and
            not os.environ.get("DATAHELIX_COORDINATOR"),
            self.rank, self.world_size, self._instance, binary(), addr)
        if start:
            self._coord = serve_coordinator(addr, "deadline",
                                            self.world_size, self._instance,
                                            shared=self.world_size > 1,
                                            keyfile=self._key.path,
                                            remove_at_exit=self._mine(),
                                            **self._metrics_args)
            addr = self._coord.listen
        elif self.coordinator is None:  # rank 0's, if it has one
            addr = find_coordinator(addr, self.world_size, self._instance)
        if self.world_size > 1 and self._key.owned_dir:
            # A shared Coordinator removes the key folder it was started
            # with (_mine); each start of this rank's DataServer gets its
            # own copy in its folder (_keyfile), which it removes as it
            # ends: a kill -9 of any rank leaves no key folder.
            self._key.hand_over(remove=self._coord is None)
        return addr

    def _keyfile(self):
        """The key for a new client and its DataServer: in multi-rank
        jobs a copy in this start's folder (see _coordinator_address)."""
        if self.world_size > 1:
            return self._key.copy_into(self._dir)
        return self._key.path

    def _ensure_client(self):
        if self._client is not None:
            return
        try:
            # A folder per start (the DataServer removes it once its client
            # is gone); the Coordinator is set up once per loader.
            if self._dir is not None:
                self._old_dirs.append(self._dir)
            self._dir = tempfile.mkdtemp(prefix="datahelix-ds-")
            self._shipped = self._payload_or_fork()
            ds = self._write_private(
                "dataset.pkl", self._shipped if isinstance(
                    self._shipped, bytes) else fork_only_file_bytes(
                        str(self._shipped)))
            index = self._index()
            if self._addr is None:
                self._addr = self._coordinator_address()
            addr = self._addr
            wt_ms = int(self.worker_timeout * 1000)
            args = ["--python-dataset", ds,
                    "--python-workers", str(self._stream_workers()),
                    "--python", self.python,
                    "--python-path", _PACKAGE_PARENT,
                    "--python-job-timeout-ms", str(wt_ms),
                    "--python-seed", str(_mix(self.seed, 0)),
                    "--python-unlink"]
            prefetch = self._prefetch()
            keyfile = self._keyfile()
            self._warm = False
            restart = self._restarts > 0
            self._restarts += 1
            if restart:
                self._renew_claim()
            end = time.monotonic() + _RECLAIM_S
            said = False
            while True:
                try:
                    self._client = _C.Client(
                        addr, index, rank=self.rank,
                        world_size=self.world_size, prefetch=prefetch,
                        microbatches=1, timeout_ms=self._timeout_ms(),
                        workers=1, max_batch=1,
                        seed=self.seed & ((1 << 64) - 1),
                        datahelix_bin=service_binary(),
                        arena_bytes=self.arena_mb << 20,
                        dataserver_args=args + self._fork_server(ds) +
                        remove_args([self._dir]),
                        keyfile=keyfile,
                        server_log=_log.server_log())
                    break
                except OSError as e:
                    # A restart (a dataset shipped again, a resume): the
                    # Coordinator may not have seen the old DataServer
                    # leave yet, and holds the rank for it a moment.
                    if not restart or "held by a live client" not in \
                            str(e) or time.monotonic() >= end:
                        raise
                    if not said:
                        said = True
                        LOGGER.warning(
                            "datahelix: DistributedDataLoader rank %d: its "
                            "workers restart (a dataset shipped again, a "
                            "resume); the shared Coordinator %s holds the "
                            "rank for its old client until that claim "
                            "lapses (up to %.0f s)", self.rank, addr,
                            _RECLAIM_S)
                    time.sleep(0.1)
        except BaseException:
            self.close()
            raise

    # -- lifetime -----------------------------------------------------------

    @property
    def metrics_address(self):
        """HOST:PORT of the metrics endpoint of the Coordinator this loader
        started (metrics_listen=, as datahelix.DataLoader's); None
        otherwise."""
        return self._coord.metrics_address if self._coord else None

    def _renew_claim(self):
        """Before a new client of this rank: a private Coordinator this
        loader started is started again (a new client draws a new rank
        token, which the old one's claim would refuse for its 30 s); a
        shared or given one is waited for (_ensure_client)."""
        if self._coord is None or self._coord.shared:
            return
        self._coord.kill()  # not stop(): it would remove _mine()
        self._coord = None
        self._coord = Coordinator(self._addr, "deadline", shared=False,
                                  keyfile=self._key.path,
                                  remove_at_exit=self._mine(),
                                  **self._metrics_args)

    def _mine(self):
        """What this loader's private Coordinator removes at its clean end
        - a kill -9 of the training process ends it so (--exit-with-parent)
        - its key and socket folders (issue 41 item 5); a shared one
        outlives this rank and removes only the key folder it was started
        with (the rank's DataServers use copies: _keyfile)."""
        if self.world_size > 1:  # it outlives this rank: its key only
            return (self._key.owned_dir,) if self._key else ()
        return (self._key.owned_dir if self._key else None, self._coord_dir)

    def _fork_server(self, dataset):
        """A new fork server for the DataServer about to start (one takes
        one connection: a retried start needs its own), as its options;
        [] where the workers do not fork (_forks)."""
        self._stop_fork_server(0)
        if not self._forks():
            return []
        self._fs = _forkserver.ForkServer(
            os.path.join(self._dir, "fork.sock"), self._inner(), dataset)
        return ["--python-forkserver", self._fs.path]

    def _stop_fork_server(self, grace):
        if getattr(self, "_fs", None) is not None:
            self._fs.stop(grace)
            self._fs = None

    def _stop_client(self):
        # A fork server whose DataServer started ends with it: a moment to
        # exit by itself; one that never got its DataServer is killed.
        grace = 0
        if getattr(self, "_client", None) is not None:
            self._meter.last = self._client_stats()  # stats() after close
            self._client.close()
            self._client = None
            self._ends = 0  # a new client counts from 0
            grace = _forkserver.STOP_S
        self._stop_fork_server(grace)
        self._current = None

    def close(self):
        """Stops the client, its DataServer (and so its Python workers) and
        an embedded Coordinator.  Batches still held stay valid until they
        are freed."""
        self._stop_client()
        release_coordinator(self._claim)
        self._claim = None
        if self._coord is not None:
            self._coord.stop()
            self._coord = None
        for d in getattr(self, "_old_dirs", ()):
            shutil.rmtree(d, ignore_errors=True)
        self._old_dirs = []
        self._addr = None
        for d in ("_dir", "_coord_dir"):
            if getattr(self, d, None) is not None:
                shutil.rmtree(getattr(self, d), ignore_errors=True)
                setattr(self, d, None)
        if getattr(self, "_key", None) is not None:
            self._key.close()
            self._key = None
