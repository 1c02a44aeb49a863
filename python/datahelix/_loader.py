"""datahelix.DataLoader: the `for batch in loader:` face of the data plane
(DESIGN.md 4.3, docs/python.md)."""
import array
import os
import shutil

import torch

from . import _C, _passes
from ._services import (Closing, Coordinator, binary, coordinator_address,
                        ensure_index)

_BALANCE = {"fixed": _C.BALANCE_FIXED, "free": _C.BALANCE_FREE,
            "none": _C.BALANCE_NONE}
_POLICIES = ("deadline", "least-request", "round-robin")
_DTYPES = {"uint8": torch.uint8, "float32": torch.float32}

# The paper's ablation ladder (Table 3), as presets of the switches:
# base = a least-request worker pool handing batches over by copy, no
# prefetch, no token balance; then + zero-copy transport; + prefetch and
# token-aware batching; + cost/deadline placement (the default).
ABLATIONS = {
    "base": dict(policy="least-request", transport="copy", prefetch=1,
                 balance="none"),
    "transport": dict(policy="least-request", transport="shm", prefetch=1,
                      balance="none"),
    "prefetch": dict(policy="least-request", transport="shm", prefetch=4,
                     balance="fixed"),
    "ddl": dict(policy="deadline", transport="shm", prefetch=4,
                balance="fixed"),
}


# Spares per request under on_error="skip" (docs/dataserver.md
# "Substitutes"): substitutes tried, in order, for a step's failed samples.
_SKIP_SPARES = 4


class _Steps:
    """The iterator of one pass: each next() is one step.  Not a
    generator, so that a SampleError raised by one next() leaves it usable:
    the next call yields the following step (torch's habit)."""

    def __init__(self, next_step):
        self._next_step, self._done = next_step, False

    def __iter__(self):
        return self

    def __next__(self):
        b = None if self._done else self._next_step()
        if b is None:
            self._done = True
            raise StopIteration
        return b


def _rank_world(rank, world_size):
    """(rank, world_size): the given ones, the missing ones from
    torch.distributed, else torchrun's environment, else (0, 1); checked."""
    if rank is None or world_size is None:
        r, w = None, None
        try:
            import torch.distributed as dist
            if dist.is_available() and dist.is_initialized():
                r, w = dist.get_rank(), dist.get_world_size()
        except ImportError:
            pass
        if r is None:
            r = int(os.environ.get("RANK", "0"))
            w = int(os.environ.get("WORLD_SIZE", "1"))
        rank = r if rank is None else rank
        world_size = w if world_size is None else world_size
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} of world size {world_size}")
    return rank, world_size


def _arena_bytes(arena_mb):
    """arena_mb in bytes for the binding (0: the client's default)."""
    if arena_mb is None:
        return 0
    if not (isinstance(arena_mb, (int, float)) and 0 < arena_mb <= 1 << 20):
        raise ValueError(f"arena_mb={arena_mb!r}: a number of MiB in "
                         "(0, 1048576]")
    return int(arena_mb * (1 << 20))


class DataLoader(Closing):
    """Batches of video clips for one training rank.

    Each step yields a dict: ``video`` (uint8 ``[B, T, H, W, 3]``, or
    ``[B, T, 3, H, W]`` with ``layout="TCHW"``; a zero-copy view of shared
    memory), ``valid_frames`` (int32 ``[B]``: frames from the clip, the rest
    of T repeats the last one), ``ids`` (int64 ``[B]``), ``tokens`` (int64
    ``[B]``, estimated), ``text`` (list of captions or None), ``epoch`` and
    ``step``.

    Every rank computes the same token-balanced plan of the epoch; rank r
    consumes its share, requested ``prefetch`` steps ahead through the
    Coordinator and prepared by its local DataServer (or a remote one) into
    a shared-memory arena.  ``len()``, ``set_epoch()``, iterating twice and
    ``drop_last`` behave as in ``torch.utils.data.DataLoader`` with a
    ``DistributedSampler``.

    coordinator: None starts one for this job (one rank: private; several:
    rank 0 serves it on MASTER_ADDR:MASTER_PORT+1, or $DATAHELIX_COORDINATOR
    names a running one); or a ZeroMQ address.
    on_error: "raise" (SampleError naming sample, path and cause, at the
    step it belongs to; the same iterator goes on with the next step) or
    "skip" (a failed sample is replaced in its position by a spare of this
    rank's plan, so every rank yields the same number of full-size steps;
    batch["substituted"] says which, stats()["substituted"] counts them; a
    step whose spares all fail is dropped, stats()["skipped"]).
    arena_mb: the local DataServer's arena (None: (prefetch + 2) batches,
    at least 64 MiB).  Holding more batches than it has raises
    ArenaExhausted at once, the step still next.
    """

    def __init__(self, manifest, batch_size=4, frames=16, size=(224, 224),
                 rank=None, world_size=None, coordinator=None, prefetch=4,
                 policy="deadline", balance="fixed", seed=0, drop_last=True,
                 on_error="raise", *, microbatches=1, workers=2,
                 timeout=60.0, layout="THWC", dtype="uint8",
                 random_crop=False, telemetry=None, dataserver=None,
                 listen=None, transport="shm", ablation=None, ddl_ms=1.0,
                 step_deadline_ms=0.0, arena_mb=None):
        if ablation is not None:
            if ablation not in ABLATIONS:
                raise ValueError(f"ablation={ablation!r}: one of "
                                 f"{list(ABLATIONS)}")
            a = ABLATIONS[ablation]
            policy, transport = a["policy"], a["transport"]
            prefetch, balance = a["prefetch"], a["balance"]
        if transport not in ("shm", "copy"):
            raise ValueError(f"transport={transport!r}: 'shm' (zero-copy) "
                             "or 'copy'")
        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error={on_error!r}: 'raise' or 'skip'")
        if balance not in _BALANCE:
            raise ValueError(f"balance={balance!r}: one of {list(_BALANCE)}")
        if policy not in _POLICIES:
            raise ValueError(f"policy={policy!r}: one of {list(_POLICIES)}")
        if dtype not in _DTYPES:
            raise ValueError(f"dtype={dtype!r}: 'uint8' or 'float32'")
        if batch_size < 1 or frames < 1 or prefetch < 1 or microbatches < 1:
            raise ValueError("batch_size, frames, prefetch and microbatches "
                             "must be >= 1")
        if batch_size < microbatches:
            raise ValueError(f"batch_size {batch_size} < microbatches "
                             f"{microbatches}")
        width, height = size
        rank, world_size = _rank_world(rank, world_size)
        self.batch_size, self.frames = batch_size, frames
        self.size = (width, height)
        self.rank, self.world_size = rank, world_size
        self.prefetch, self.policy, self.balance = prefetch, policy, balance
        self.seed, self.drop_last, self.on_error = seed, drop_last, on_error
        self._opts = dict(frames=frames, width=width, height=height,
                          layout=layout, dtype=dtype, prefetch=prefetch,
                          microbatches=microbatches,
                          timeout_ms=int(timeout * 1000), workers=workers,
                          max_batch=batch_size, seed=seed,
                          random_crop=bool(random_crop),
                          telemetry=os.fspath(telemetry) if telemetry else None,
                          dataserver=dataserver, listen=listen,
                          ddl_ms=float(ddl_ms),
                          step_deadline_ms=float(step_deadline_ms),
                          arena_bytes=_arena_bytes(arena_mb),
                          spares=_SKIP_SPARES if on_error == "skip" else 0)
        self._dtype = _DTYPES[dtype]
        self.transport = transport
        self._timeout_ms = int(timeout * 1000)
        self._coordinator_arg = coordinator
        self.index_path = ensure_index(manifest)
        self._index = _C.Index(self.index_path)
        self._digest = None      # _manifest_id(), computed once
        self._client = None
        self._coord = None
        self._tmpdir = None
        self._epoch = 0
        self._step = 0           # next step to consume in this epoch
        self._resume = False     # _step came from load_state_dict()
        # Earlier parts of this epoch planned for other world or batch
        # sizes: [(world_size, batch_size, step reached)], oldest first.
        self._chain = []
        self._skipped = 0
        self._len = None

    # -- plan ---------------------------------------------------------------

    def _schedule(self, epoch):
        """(ids, offsets, first step) of this rank for the rest of `epoch`.

        Normally the epoch's plan.  After a resume with another world or
        batch size, the samples the earlier plans had not reached yet are
        planned again across the ranks there are now (from the step
        reached on), so none is repeated and none skipped."""
        subset, first = None, 0
        for w, b, reached in self._chain:
            rest = []
            for r in range(w):
                ids, offs = self._plan(epoch, w, b, r, subset)
                o = array.array("Q", offs)
                k = min(max(reached - first, 0), len(o) - 1)
                rest.append(ids[o[k] * 8:])
            subset, first = b"".join(rest), reached
        ids, offs = self._plan(epoch, self.world_size, self.batch_size,
                               self.rank, subset)
        # A partial last step may give this rank nothing: it has one step
        # fewer (DistributedSampler would repeat samples to pad it).
        o = array.array("Q", offs)
        while len(o) > 1 and o[-1] == o[-2]:
            o.pop()
        return ids, o.tobytes(), first

    def _plan(self, epoch, world, batch, rank, subset):
        # A re-planned rest keeps its remainder (a partial last step).
        drop = self.drop_last if subset is None else False
        kw = {} if subset is None else {"subset": subset}
        return _C.schedule(self.index_path, world, batch, rank, epoch,
                           self.seed, _BALANCE[self.balance], drop, **kw)

    def __len__(self):
        if self._len is None:
            _, offs, _ = self._schedule(self._epoch)
            self._len = len(offs) // 8 - 1
        return self._len

    def set_epoch(self, epoch):
        """The epoch the next iteration plans (the permutation and every
        random crop derive from (seed, epoch, sample id))."""
        if epoch != self._epoch:
            self._epoch = int(epoch)
            self._step = 0
            self._resume = False
            self._chain = []
            self._len = None

    # -- services -----------------------------------------------------------

    def _ensure_client(self):
        if self._client is not None:
            return
        addr = self._coordinator_arg
        if addr is None:
            addr, start = coordinator_address(self.rank, self.world_size)
            if addr.startswith("ipc://"):
                self._tmpdir = os.path.dirname(addr[len("ipc://"):])
            if start:
                self._coord = Coordinator(addr, self.policy,
                                          shared=self.world_size > 1)
        self._client = _C.Client(addr, self.index_path, rank=self.rank,
                                 world_size=self.world_size,
                                 datahelix_bin=binary(), **self._opts)

    # -- iteration ----------------------------------------------------------

    def __iter__(self):
        self._ensure_client()
        if not self._resume and self._chain and \
                self._step >= self._chain_end():
            self._chain = []  # iterating again: the whole epoch, planned anew
            self._len = None
        ids, offs, base = self._schedule(self._epoch)
        n_steps = len(offs) // 8 - 1
        if not self._resume and self._step >= base + n_steps:
            self._step = base  # iterating again: the same epoch once more
        self._resume = False
        k = min(max(self._step - base, 0), n_steps)
        o = array.array("Q", offs)[k:]
        self._start_pass(base + k, ids, o.tobytes())
        return _Steps(self._next_step)

    def _next_step(self):
        """The next batch dict, or None at the end of the pass.  A
        SampleError consumes its step (raise mode: raised here, and the
        next call goes on with the following step, as torch's iterator
        does after a worker's exception)."""
        while True:
            try:
                b = self._client.next(self._timeout_ms)
            except _C.SampleError:
                self._step += 1  # the step is consumed
                if self.on_error == "skip":  # its spares all failed
                    self._skipped += 1
                    continue
                raise
            if b is None:
                return None
            self._step = b.step + 1
            return self._to_dict(b)

    def _video(self, b):
        parts = []
        for j in range(b.n_parts):
            t = torch.frombuffer(b.part(j), dtype=self._dtype)
            parts.append(t.view(b.dims(j)))
        # One microbatch: the arena's memory itself.  Several: one tensor
        # is a copy (merging slots of different servers cannot be free).
        # transport="copy" (the ablation's base) copies it out on purpose.
        if len(parts) > 1:
            return torch.cat(parts)
        return parts[0].clone() if self.transport == "copy" else parts[0]

    def _to_dict(self, b):
        raw = b.sample_ids
        ids = array.array("Q", raw)
        return {
            "video": self._video(b),
            "valid_frames": torch.frombuffer(bytearray(b.valid_frames),
                                             dtype=torch.int32),
            "ids": torch.frombuffer(bytearray(raw), dtype=torch.int64),
            "tokens": torch.tensor([self._index.tokens(i) for i in ids],
                                   dtype=torch.int64),
            "text": [self._index.text(i) for i in ids],
            "epoch": self._epoch,
            "step": b.step,
            # skip policy: the positions whose planned sample failed, with
            # the spare delivered there ("ids" holds the delivered ones)
            "substituted": [
                {"position": pos, "failed_id": failed, "substitute_id": sub,
                 "stage": stage, "cause": cause, "code": code}
                for pos, failed, sub, stage, code, cause in b.substitutions],
        }

    # -- state --------------------------------------------------------------

    def _chain_end(self):
        _, offs, base = self._schedule(self._epoch)
        return base + len(offs) // 8 - 1

    def _manifest_id(self):
        """{"samples", "digest"}: what the saved step refers to (the
        index's row count and dh_index_digest: per row path, tokens and
        profile).  A manifest that lost a line and was renumbered has other
        rows under the same ids, so its digest differs."""
        if self._digest is None:
            self._digest = f"{self._index.digest():016x}"
        return {"samples": len(self._index), "digest": self._digest}

    def state_dict(self):
        """Where this rank is: the next iteration after load_state_dict()
        resumes at exactly this step (the plan is a pure function of the
        manifest, the seed and the epoch).  Every rank saves the same
        epoch and step in synchronous training.  "manifest" and "plan"
        fingerprint what the saved step refers to (load_state_dict()
        checks them)."""
        return {"epoch": self._epoch, "step": self._step, "seed": self.seed,
                "world_size": self.world_size,
                "batch_size": self.batch_size, "rank": self.rank,
                "replanned": [list(x) for x in self._chain],
                "manifest": self._manifest_id(),
                "plan": self._plan_id()}

    def load_state_dict(self, state):
        """Resumes at the saved step.  With another world size or batch
        size, the epoch's samples not consumed yet are planned again
        across the ranks there are now: none repeated, none skipped.  A
        state saved once its epoch was consumed resumes at the first step
        of the next epoch, whatever the world size.  A state of another
        manifest, seed or sampling is refused (ValueError naming it)."""
        if state.get("seed", self.seed) != self.seed:
            raise ValueError(f"state_dict: saved with seed={state['seed']}, "
                             f"this loader has seed={self.seed}: the "
                             "epoch's permutation differs")
        saved = state.get("manifest")  # absent in states of older versions
        if saved is not None and saved != self._manifest_id():
            now = self._manifest_id()
            raise ValueError(
                f"state_dict: saved with another manifest, of "
                f"{saved['samples']} samples (digest {saved['digest']}), "
                f"this loader has {now['samples']} samples (digest "
                f"{now['digest']}): its epoch and step would name other "
                "samples here (a manifest with lines removed and "
                "renumbered is another manifest).  Resume with the "
                "manifest it was saved with, or drop state['manifest'] to "
                "start at that step of this manifest's plan anyway")
        plan = state.get("plan")  # absent in states of older versions
        if plan is not None:
            self._check_plan(plan, "sampling", "the saved step's samples "
                             "would be sampled otherwise")
        epoch, step = int(state["epoch"]), int(state["step"])
        chain = [tuple(int(v) for v in x)
                 for x in state.get("replanned", [])]
        w = int(state.get("world_size", self.world_size))
        b = int(state.get("batch_size", self.batch_size))
        if self._epoch_consumed(state, epoch, chain, w, b, step):
            epoch, step, chain = epoch + 1, 0, []
        else:
            if plan is not None and (step > 0 or chain):
                for key in ("balance", "drop_last"):
                    self._check_plan(plan, key, "the rest of its epoch "
                                     "would repeat some samples and skip "
                                     "others")
            if (w, b) != (self.world_size, self.batch_size):
                chain.append((w, b, step))
        self._epoch = epoch
        self._step = step
        self._chain = chain
        self._resume = True
        self._len = None

    def stats(self):
        """Input-wait percentiles, misses, errors, restarts (dict)."""
        s = self._client.stats() if self._client is not None else {}
        s["skipped"] = self._skipped
        s.setdefault("substituted", 0)
        s["quarantine"] = (self._client.quarantine()
                           if self._client is not None else [])
        return s

    # -- lifetime -----------------------------------------------------------

    def close(self):
        """Stops the client, its DataServer and an embedded Coordinator.
        Batches still held stay valid until they are freed."""
        if self._client is not None:
            self._client.close()
            self._client = None
        if self._coord is not None:
            self._coord.stop()
            self._coord = None
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None

    # -- task identity and resume checks ------------------------------------

    def _start_pass(self, first_step, ids, offs):
        """Gives the client this schedule as a new pass: the wire's task
        id is (pass, step, rank, part) with the epoch beside it, so no two
        schedules of this rank share an id, at any epoch count
        (_passes.py)."""
        self._client.start_pass(self._epoch, _passes.new_pass(), first_step,
                                ids, offs)

    def _plan_id(self):
        """The plan's inputs besides manifest, seed, world and batch size
        (which state_dict() has already): how the epoch's samples are put
        into steps, and how each is sampled."""
        size = getattr(self, "size", None)
        return {"balance": self.balance, "drop_last": bool(self.drop_last),
                "sampling": {
                    "frames": self.frames,
                    "size": list(size) if size is not None else None,
                    "random_crop": bool(self._opts.get("random_crop"))}}

    def _check_plan(self, saved, key, why):
        now = self._plan_id()
        if key not in saved or saved[key] == now[key]:
            return
        old, new = saved[key], now[key]
        if isinstance(old, dict) and isinstance(new, dict):
            diff = [k for k in sorted(set(old) | set(new))
                    if old.get(k) != new.get(k)]
            old = ", ".join(f"{k}={old.get(k)!r}" for k in diff)
            new = ", ".join(f"{k}={new.get(k)!r}" for k in diff)
        else:
            old, new = f"{key}={old!r}", f"{key}={new!r}"
        raise ValueError(f"state_dict: saved with {old}, this loader has "
                         f"{new}: {why}.  Make the loader as it was "
                         f"saved, or drop state['plan'] to resume anyway")

    def _epoch_consumed(self, state, epoch, chain, w, b, step):
        """Whether the saved step is past the saved epoch's last one: no
        saved rank has a step left.  The same walk over the saved re-plans
        as _schedule(), with the saved plan's balance and drop_last."""
        saved = state.get("plan") or {}
        balance = _BALANCE.get(saved.get("balance"), _BALANCE[self.balance])
        drop = saved.get("drop_last", self.drop_last)

        def plan(world, batch, rank, subset):
            kw = {} if subset is None else {"subset": subset}
            return _C.schedule(self.index_path, world, batch, rank, epoch,
                               self.seed, balance,
                               drop if subset is None else False, **kw)

        subset, first = None, 0
        for cw, cb, reached in chain:
            rest = []
            for r in range(cw):
                ids, offs = plan(cw, cb, r, subset)
                o = array.array("Q", offs)
                k = min(max(reached - first, 0), len(o) - 1)
                rest.append(ids[o[k] * 8:])
            subset, first = b"".join(rest), reached
            if not subset:
                return True
        # Every rank's plan has the plan's step count (a rank that a
        # partial last step leaves nothing has an empty step there).
        _, offs = plan(w, b, 0, subset)
        return step >= first + len(offs) // 8 - 1


# Any map-style torch Dataset on the DataServers' Python workers
# (DESIGN.md 4.3): _distributed.py.
from ._distributed import DistributedDataLoader  # noqa: E402,F401
