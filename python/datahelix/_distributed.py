"""datahelix.DistributedDataLoader: torch.utils.data.DataLoader's interface
over any map-style Dataset, whose samples are loaded by Python worker
processes of the rank's local DataServer and handed over through its
shared-memory arena without a copy (DESIGN.md 4.3 and 8, docs/python.md
"DistributedDataLoader").

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
import os
import pickle
import shutil
import sys
import tempfile

import torch
from torch.utils.data import (BatchSampler, DistributedSampler,
                              RandomSampler, SequentialSampler)
from torch.utils.data._utils.collate import default_collate, default_convert

from . import _C, _passes, _slot
from ._C import ArenaExhausted, DataError, SampleError
from ._C import TimeoutError as DataTimeoutError
from ._jobkey import JobKey
from ._services import (Closing, binary, claim_coordinator,
                        coordinator_address, find_coordinator, loader_ordinal,
                        metrics_args, release_coordinator, serve_coordinator)

_HDR = 1 << 63
_M63 = _HDR - 1
_CHUNK = 1024                  # steps given to the client at a time
_MAX_STEP = (1 << 16) - 1      # indices per step (the header takes one id)
_DEFAULT_WORKER_TIMEOUT = 600.0
_MAX_WORKERS = 64  # DS_PY_MAX_WORKERS
_STARTUP_S = 60.0  # more for the first batch: workers import and unpickle
_PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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


class _Iter:
    """One pass over the loader (what iter(loader) returns)."""

    def __init__(self, loader):
        self._loader = loader
        loader._ensure_client()
        # As torch: the sampler's iterator first, then the base seed (from
        # the generator, which a RandomSampler then also draws from).
        self._batches = iter(loader._index_sampler)
        self._base_seed = loader._iteration_seed()
        self._pass = loader._new_pass()
        self._epoch = loader._epoch
        try:
            self._len = len(loader)
        except TypeError:  # a sampler without len(), as torch allows
            self._len = None
        self._k = 0          # steps consumed
        self._given = 0      # steps given to the client
        self._done = False
        loader._current = self

    def __iter__(self):
        return self

    def __len__(self):
        if self._len is None:
            raise TypeError("the sampler has no len()")
        return self._len

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

    def __next__(self):
        L = self._loader
        if self._done:
            raise StopIteration
        if L._current is not self or L._client is None:
            raise RuntimeError("this DistributedDataLoader iterator was "
                               "superseded by a newer iter(loader) (or the "
                               "loader was closed): one pass at a time")
        if self._k == self._given and not self._refill():
            self._done = True
            raise StopIteration
        return L._next_batch(self)


def dataset_file_bytes(inner, why):
    """A DataServer Python worker's dataset file (datahelix._worker
    load_config): `inner` pickled with cloudpickle when installed (so
    lambdas and classes of __main__ travel too), else pickle; `why` begins
    the TypeError for what cannot be pickled."""
    try:
        import cloudpickle
        dumps, how = cloudpickle.dumps, "cloudpickle"
    except ImportError:
        dumps, how = (lambda o: pickle.dumps(o, protocol=5)), "pickle"
    try:
        blob = dumps(inner)
    except Exception as e:
        raise TypeError(f"{why}, so they must be picklable ({how}): "
                        f"{type(e).__name__}: {e}") from e
    return pickle.dumps({"version": 1, "sys_path": list(sys.path),
                         "payload": blob, "pickler": how}, protocol=5)


class DistributedDataLoader(Closing):
    """torch.utils.data.DataLoader's arguments and behaviour over any
    map-style Dataset, with the samples loaded by Python worker processes
    of this rank's local DataServer and handed over through shared memory
    (zero copy).  See docs/python.md "DistributedDataLoader" for what
    differs from torch.

    Beyond torch's arguments (keyword only): ``estimate_cost`` (callable
    index -> CPU ms; default ``dataset.estimate_cost`` if it has one) feeds
    the placement cost model; ``rank`` / ``world_size`` (default:
    torch.distributed, else RANK / WORLD_SIZE) choose this rank's share of
    the default sampler; ``seed`` (shuffle and random draws derive from
    seed + epoch); ``coordinator``; ``arena_mb`` (shared memory for
    batches in flight and held); ``worker_timeout`` (seconds a worker may
    spend on one batch before it is killed and replaced); ``python``
    (the workers' interpreter); ``keyfile`` (the job key, as
    datahelix.DataLoader's: None makes one per job when this loader starts
    the Coordinator); ``metrics_listen`` / ``metrics_token_file`` (the
    Coordinator's metrics endpoint, as datahelix.DataLoader's).
    """

    def __init__(self, dataset, batch_size=1, shuffle=None, sampler=None,
                 batch_sampler=None, num_workers=0, collate_fn=None,
                 pin_memory=False, drop_last=False, timeout=0,
                 worker_init_fn=None, multiprocessing_context=None,
                 generator=None, *, prefetch_factor=2,
                 persistent_workers=False, pin_memory_device="",
                 estimate_cost=None, rank=None, world_size=None, seed=0,
                 coordinator=None, arena_mb=256, worker_timeout=None,
                 python=None, keyfile=None, metrics_listen=None,
                 metrics_token_file=None):
        if isinstance(dataset, torch.utils.data.IterableDataset) or \
                not hasattr(dataset, "__getitem__") or \
                not hasattr(dataset, "__len__"):
            raise ValueError("DistributedDataLoader takes a map-style "
                             "dataset (__getitem__ and __len__); "
                             f"{type(dataset).__name__} is not one")
        if num_workers < 0:
            raise ValueError("num_workers option should be non-negative; "
                             "use num_workers=0 to disable multiprocessing.")
        if num_workers > _MAX_WORKERS:
            raise ValueError(f"num_workers {num_workers}: a DataServer runs "
                             f"at most {_MAX_WORKERS} Python workers")
        if timeout < 0:
            raise ValueError("timeout option should be non-negative")
        if num_workers == 0 and prefetch_factor != 2:
            raise ValueError("prefetch_factor option could only be specified "
                             "in multiprocessing.let num_workers > 0 to "
                             "enable multiprocessing.")
        if prefetch_factor < 1:
            raise ValueError("prefetch_factor must be >= 1")
        if persistent_workers and num_workers == 0:
            raise ValueError("persistent_workers option needs num_workers "
                             "> 0")
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
        if arena_mb < 1:
            raise ValueError("arena_mb must be >= 1")
        from ._loader import _rank_world
        rank, world_size = _rank_world(rank, world_size)
        self.rank, self.world_size, self.seed = rank, world_size, int(seed)
        if sampler is None and batch_sampler is None:
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
                                          coordinator)
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
        self._coord_dir = None
        self._current = None

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
        return DistributedSampler(dataset, num_replicas=self.world_size,
                                  rank=self.rank, shuffle=bool(shuffle),
                                  seed=self.seed, drop_last=drop_last)

    @property
    def _auto_collation(self):
        return self.batch_sampler is not None

    @property
    def _index_sampler(self):
        return self.batch_sampler if self._auto_collation else self.sampler

    def __len__(self):
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
        return _Iter(self)

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

    def _next_batch(self, it):
        k, c = it._k, self._client
        extra = 0 if self._warm else int(_STARTUP_S * 1000)
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
            raise self._step_error(e, it, k) from None
        except DataError as e:
            self._warm = True
            e.epoch, e.step, e.rank = it._epoch, k, self.rank
            raise
        self._warm = True
        if b is None:  # cannot happen: steps are given before asked for
            raise DataError(f"rank {self.rank}: the client ended the epoch "
                            f"at step {k} of {it._given}")
        it._k += 1
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
        obj = out["obj"]
        if self.pin_memory and torch.cuda.is_available():
            from torch.utils.data._utils.pin_memory import pin_memory
            obj = pin_memory(obj, self.pin_memory_device or None)
        return obj

    def _step_error(self, e, it, k):
        """The same kind of error for a failed step, with this rank's epoch
        and step (not the wire's), from its fields."""
        who = ("" if e.sample_id is None else
               f"sample {e.sample_id} ({e.path or 'no path'}): ")
        err = type(e)(f"rank {self.rank} epoch {it._epoch} step {k}: {who}"
                      f"{e.cause}")
        for f in ("sample_id", "path", "stage", "cause", "code", "server",
                  "consumed"):
            setattr(err, f, getattr(e, f))
        err.epoch, err.step, err.rank = it._epoch, k, self.rank
        return err

    # -- services -----------------------------------------------------------

    def _payload(self):
        """The pickled dataset file's bytes (dataset_file_bytes)."""
        inner = {"dataset": self.dataset, "collate_fn": self.collate_fn,
                 "worker_init_fn": self.worker_init_fn,
                 "auto_collation": self._auto_collation}
        return dataset_file_bytes(inner, "DistributedDataLoader ships the "
                                  "dataset, collate_fn and worker_init_fn "
                                  "to the DataServer's worker processes")

    def _write_private(self, name, data):
        path = os.path.join(self._dir, name)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        return path

    def _index(self):
        n = len(self.dataset)
        cost = None
        if self.estimate_cost is not None:
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
                                            **self._metrics_args)
            addr = self._coord.listen
        elif self.coordinator is None:  # rank 0's, if it has one
            addr = find_coordinator(addr, self.world_size, self._instance)
        return addr

    def _ensure_client(self):
        if self._client is not None:
            return
        try:
            self._dir = tempfile.mkdtemp(prefix="datahelix-ds-")
            ds = self._write_private("dataset.pkl", self._payload())
            index = self._index()
            addr = self._coordinator_address()
            wt_ms = int(self.worker_timeout * 1000)
            args = ["--python-dataset", ds,
                    "--python-workers", str(max(1, self.num_workers)),
                    "--python", self.python,
                    "--python-path", _PACKAGE_PARENT,
                    "--python-job-timeout-ms", str(wt_ms),
                    "--python-seed", str(_mix(self.seed, 0)),
                    "--python-unlink"]
            prefetch = min(256, self.prefetch_factor *
                           max(1, self.num_workers))
            self._warm = False
            self._client = _C.Client(
                addr, index, rank=self.rank, world_size=self.world_size,
                prefetch=prefetch, microbatches=1,
                timeout_ms=self._timeout_ms(), workers=1, max_batch=1,
                seed=self.seed & ((1 << 64) - 1), datahelix_bin=binary(),
                arena_bytes=self.arena_mb << 20, dataserver_args=args,
                keyfile=self._key.path)
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

    def close(self):
        """Stops the client, its DataServer (and so its Python workers) and
        an embedded Coordinator.  Batches still held stay valid until they
        are freed."""
        if self._client is not None:
            self._client.close()
            self._client = None
        self._current = None
        release_coordinator(self._claim)
        self._claim = None
        if self._coord is not None:
            self._coord.stop()
            self._coord = None
        for d in ("_dir", "_coord_dir"):
            if getattr(self, d, None) is not None:
                shutil.rmtree(getattr(self, d), ignore_errors=True)
                setattr(self, d, None)
        if getattr(self, "_key", None) is not None:
            self._key.close()
            self._key = None
