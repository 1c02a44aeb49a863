"""datahelix.DataLoader: the `for batch in loader:` face of the data plane
(DESIGN.md 4.3, docs/python.md)."""
import array
import os
import shutil
import tempfile
import time

import torch

from . import _C, _cache, _log, _packed, _passes, _rebalance, _slot, _video
from . import _options as _opt
from ._jobkey import JobKey
from ._services import (Closing, binary, claim_coordinator, remove_args,
                        coordinator_address, ensure_index, find_coordinator,
                        loader_ordinal, metrics_args, release_coordinator,
                        serve_coordinator)

_BALANCE = {"fixed": _C.BALANCE_FIXED, "free": _C.BALANCE_FREE,
            "none": _C.BALANCE_NONE}
# The order of a planning window's steps (docs/planner.md "Step order").
_STEP_ORDER = {"alternate": _C.ORDER_ALTERNATE, "sorted": _C.ORDER_SORTED}
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


def _align64(v):
    return (v + 63) & ~63


def _feature_frames(o, samples):
    """Feature frames of `samples` samples (an int or a tensor): samples //
    hop + 1, Whisper's without the last (dh_audio_feature_frames); 0
    without features."""
    if not o["audio_feature"]:
        return 0
    return samples // o["audio_hop"] + (0 if o["audio_feature"] == 3 else 1)


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

    coordinator: None starts one for this loader (one rank: private;
    several: rank 0 serves it on MASTER_ADDR:MASTER_PORT+1+i for the i-th
    loader this process created, or $DATAHELIX_COORDINATOR names a running
    one); or a ZeroMQ address.  One Coordinator serves one loader.
    keyfile: the job key (`datahelix keygen FILE`; docs/security.md); None:
    $DATAHELIX_KEYFILE, else - when this loader starts the Coordinator - a
    key made for the job (several ranks: by rank 0, handed to the others
    through the torch.distributed store), else none.
    metrics_listen: HOST:PORT (e.g. "127.0.0.1:9464"; port 0: any, see
    ``metrics_address``) where the Coordinator this loader starts serves
    Prometheus metrics, for ``datahelix top`` (docs/metrics.md); in a
    multi-rank job the rank that starts it (rank 0) serves them.  Beyond
    loopback it needs metrics_token_file (a bearer token, mode 0600).
    cache_dir, cache_bytes: a folder for the host-local cache of S3 and
    HTTP(S) objects the table names, shared by every DataServer of the
    host (one fetch per chunk; kill -9 safe), bounded by cache_bytes
    (default 10 GiB): a second epoch over a set that fits reads no byte
    over the network.  stats()["cache"] has its counters.
    docs/remote.md "The cache".
    heartbeat_timeout: seconds a DataServer may be silent before the
    Coordinator this loader starts declares it dead and re-routes its
    tasks (default 3: a busy node delays heartbeats; 0.1 to 3600).
    on_error: "raise" (SampleError naming sample, path and cause, at the
    step it belongs to; the same iterator goes on with the next step) or
    "skip" (a failed sample is replaced in its position by a spare of this
    rank's plan, so every rank yields the same number of full-size steps;
    batch["substituted"] says which, stats()["substituted"] counts them; a
    step whose spares all fail is dropped, stats()["skipped"]).
    step_order: how the plan orders a window's steps of similar samples:
    "alternate" (heavy, light, heavy, ...: a light step's spare decode
    time covers the heavy one after it, when the GPU step does not follow
    tokens; the default) or "sorted" (heaviest to lightest, then back up:
    when the GPU step follows tokens, as a VLM's does, and the CPUs are
    short, a heavy step right after a light one waits longest;
    docs/planner.md "Step order").
    arena_mb: the local DataServer's arena (None: (prefetch + 2) batches,
    at least 64 MiB).  Holding more batches than it has raises
    ArenaExhausted at once, the step still next.

    Every argument of torch.utils.data.DataLoader is a parameter too, with
    torch's meaning (num_workers: decode threads, prefetch_factor, shuffle,
    generator, pin_memory, collate_fn, timeout, ...) or refused with what
    to use instead (sampler, batch_sampler, worker_init_fn,
    multiprocessing_context); size is (H, W) as torchvision.  transform
    (and with it collate_fn) runs on the local DataServer's num_workers
    Python worker processes, on a zero-copy view of each decoded sample,
    in parallel with decode and training (so it must be picklable);
    collate_fn alone runs in this process, in next().  docs/python.md
    "Torch's arguments", "transform and collate_fn".
    """

    def __init__(self, manifest, batch_size=4, frames=16, size=(224, 224),
                 rank=None, world_size=None, coordinator=None, prefetch=None,
                 policy="deadline", balance=None, seed=None, drop_last=True,
                 on_error="raise", *, num_workers=None, prefetch_factor=None,
                 shuffle=True, persistent_workers=True, pin_memory=False,
                 pin_memory_device="", collate_fn=None, transform=None,
                 generator=None, timeout=60.0, in_order=True, sampler=None,
                 batch_sampler=None, worker_init_fn=None,
                 multiprocessing_context=None, microbatches=1, workers=None,
                 layout="THWC", dtype="uint8", random_crop=False,
                 telemetry=None, dataserver=None, listen=None,
                 transport="shm", ablation=None, ddl_ms=1.0,
                 step_deadline_ms=0.0, arena_mb=None, max_side=None,
                 max_pixels=None, patch=None, max_frames=None, keyfile=None,
                 metrics_listen=None, metrics_token_file=None,
                 trace=None, load_balance=None, step_order="alternate",
                 heartbeat_timeout=None, cache_dir=None, cache_bytes=None,
                 audio=False, audio_rate=16000, audio_channels=1,
                 audio_seconds=None, audio_missing="zeros",
                 audio_features=None, n_mels=None, n_fft=None,
                 hop_length=None, audio_crop="start", audio_layout="padded"):
        _opt.check_manifest(manifest)
        if audio_layout not in ("padded", "packed"):
            raise ValueError(f"audio_layout={audio_layout!r}: 'padded' "
                             "([B, C, S] views of the slot) or 'packed' "
                             "([C, total] with audio_cu_seqlens, a copy)")
        sound = _opt.audio_opts(audio, audio_rate, audio_channels,
                                audio_seconds, audio_missing, audio_crop)
        sound.update(_opt.audio_feature_opts(
            audio, audio_features, n_mels, n_fft, hop_length,
            sound["audio_samples"]))
        cache_args = _cache.check(cache_dir, cache_bytes)
        self.cache_dir = cache_args[1] if cache_args else None
        self._cache_bytes = cache_bytes
        for name, v in (("sampler", sampler), ("batch_sampler",
                                               batch_sampler),
                        ("worker_init_fn", worker_init_fn),
                        ("multiprocessing_context",
                         multiprocessing_context)):
            _opt.refuse(name, v)
        if batch_size is None:
            raise ValueError("batch_size=None (torch's unbatched mode) is "
                             "not supported: use batch_size=1")
        _opt.check_callable("collate_fn", collate_fn)
        _opt.check_callable("transform", transform)
        threads = _opt.decode_threads(num_workers, workers)
        if ablation is not None:
            if ablation not in ABLATIONS:
                raise ValueError(f"ablation={ablation!r}: one of "
                                 f"{list(ABLATIONS)}")
            a = ABLATIONS[ablation]
            policy, transport = a["policy"], a["transport"]
            prefetch, balance = a["prefetch"], a["balance"]
        prefetch = _opt.prefetch_depth(prefetch, prefetch_factor, threads)
        shuffle = bool(shuffle)
        if balance is None:
            balance = "fixed" if shuffle else "none"
        if not shuffle and balance != "none":
            raise ValueError(
                f"shuffle=False with balance={balance!r}: the token "
                "balance is planned over the epoch's permutation; without "
                "a shuffle the plan is the manifest's order split as "
                "balance='none' does (pass balance='none', or leave it "
                "unset)")
        if transport not in ("shm", "copy"):
            raise ValueError(f"transport={transport!r}: 'shm' (zero-copy) "
                             "or 'copy'")
        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error={on_error!r}: 'raise' or 'skip'")
        if step_order not in _STEP_ORDER:
            raise ValueError(f"step_order={step_order!r}: one of "
                             f"{list(_STEP_ORDER)}")
        if balance not in _BALANCE:
            raise ValueError(f"balance={balance!r}: one of {list(_BALANCE)}")
        if policy not in _POLICIES:
            raise ValueError(f"policy={policy!r}: one of {list(_POLICIES)}")
        dtype = _opt.dtype_name(dtype)
        # frames="fps:F", size=None: _packed.py (native size, packed batches)
        samp = _packed.sampling(frames, size, max_side, max_pixels, patch,
                                max_frames)
        if samp["native"]:
            _packed.check_native(layout, microbatches, transform, collate_fn)
        if sound["audio_rate"] and (samp["native"] or transform is not None):
            raise NotImplementedError(
                "audio=True with " + ("size=None (packed batches)"
                                      if samp["native"] else "transform=") +
                " is not implemented yet: use a fixed size, without "
                "transform= (docs/python.md \"Sound\")")
        if transform is not None:  # on the DataServer's workers: _video.py
            _video.check(microbatches, dataserver, listen, transport)
            from ._distributed import dataset_file_bytes
            dataset_file_bytes({"transform": transform,
                                "collate_fn": collate_fn},
                               "transform= (and collate_fn= with it) run in "
                               "the DataServer's worker processes")
        if batch_size < 1 or prefetch < 1 or microbatches < 1:
            raise ValueError("batch_size, frames, prefetch and microbatches "
                             "must be >= 1")
        if batch_size < microbatches:
            raise ValueError(f"batch_size {batch_size} < microbatches "
                             f"{microbatches}")
        height, width = _opt.size_hw(size) if size is not None else (0, 0)
        seed = _opt.plan_seed(seed, generator)
        wait_ms = _opt.timeout_ms(timeout)
        rank, world_size = _rank_world(rank, world_size)
        self.batch_size, self.frames = batch_size, frames
        self.size = (height, width) if size is not None else None
        self._native, self._patch = samp["native"], samp.get("patch", 0)
        self.rank, self.world_size = rank, world_size
        self.prefetch, self.policy, self.balance = prefetch, policy, balance
        self.step_order = step_order
        self.seed, self.drop_last, self.on_error = seed, drop_last, on_error
        self.shuffle, self.num_workers = shuffle, threads
        self.persistent_workers = bool(persistent_workers)
        self.in_order = bool(in_order)  # batches always come in order
        self.collate_fn, self.transform = collate_fn, transform
        self.generator, self.timeout = generator, timeout
        self.pin_memory = _opt.check_pin_device(pin_memory,
                                                pin_memory_device)
        self.pin_memory_device = pin_memory_device
        self._pinner = _opt.Pinner(pin_memory_device) \
            if self.pin_memory else None
        if telemetry:  # one file per rank: "run-{rank}.jsonl"
            telemetry = os.fspath(telemetry).replace("{rank}", str(rank))
        self.telemetry = telemetry or None
        # Chrome trace-event JSON, written when the loader closes
        # (docs/trace.md); one file per rank: "trace-{rank}.json"
        self.trace = _opt.trace_path(trace, rank)
        self._opts = dict(frames=frames, width=width, height=height,
                          layout=layout, dtype=dtype, prefetch=prefetch,
                          microbatches=microbatches,
                          timeout_ms=wait_ms if wait_ms > 0 else 60000,
                          workers=threads, max_batch=batch_size,
                          seed=seed & ((1 << 64) - 1),
                          random_crop=bool(random_crop),
                          telemetry=self.telemetry,
                          trace=self.trace,
                          dataserver=dataserver, listen=listen,
                          ddl_ms=float(ddl_ms),
                          step_deadline_ms=float(step_deadline_ms),
                          arena_bytes=_arena_bytes(arena_mb),
                          spares=_SKIP_SPARES if on_error == "skip" else 0)
        self._opts.update(samp)
        self._opts.update(sound)
        self.audio = bool(sound["audio_rate"])
        self.audio_layout = audio_layout
        self._dtype = _DTYPES[dtype]
        self._tx = transform is not None
        self._tx_dir = None      # the dataset file's private folder
        self._substituted = 0    # transform=: counted here, not in C
        self._tx_failed = set()  # and the samples that failed
        if self._tx and arena_mb is None:
            self._opts["arena_bytes"] = _video.arena_bytes(self)
        if self._native and arena_mb is None:
            self._opts["arena_bytes"] = _packed.arena_bytes(
                samp, batch_size, prefetch, 4 if dtype == "float32" else 1)
        self.transport = transport
        self._timeout_ms = wait_ms
        self._coordinator_arg = coordinator
        self._keyfile_arg = keyfile
        self._metrics_args = metrics_args(metrics_listen, metrics_token_file,
                                          coordinator, heartbeat_timeout)
        self._key = None
        # Counted in creation order, as every rank creates its loaders: the
        # i-th loader of every rank shares one Coordinator port
        # (MASTER_PORT + 1 + i), no other loader's.
        self._ordinal = loader_ordinal()
        self._claim = None
        self._pass = 0           # the live iterator's number (one at a time)
        self.index_path = ensure_index(manifest)
        self._index = _C.Index(self.index_path)
        # None: plan by the index's est_tokens; else this sampling's own
        self._tokens = _packed.check_tokens(manifest, len(self._index),
                                            samp, self.size)
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
        self._meter = _opt.Meter()
        self._len = None
        # Tier 2 (_rebalance.py): checked now, its process groups made at
        # the first iteration (every rank iterates)
        self._lb = None if load_balance is None else \
            _rebalance.check(load_balance, batch_size, world_size)
        if self._lb is not None and (self._tx or self._native or
                                     collate_fn is not None):
            raise NotImplementedError(
                "load_balance= with transform=, collate_fn= or native-size "
                "packed batches is not implemented yet (Tier 2 exchanges "
                "fixed-size decoded clips; docs/rebalance.md)")
        if self._lb is not None:
            # A round is pulled at once: the next one must be in flight
            # while this one trains, or its first step waits for a whole
            # round of decodes (bench_tier2.py: p95 x1.9 with prefetch 2)
            self.prefetch = _opt.prefetch_depth(
                prefetch + self._lb["steps"], None, threads)
            self._opts["prefetch"] = self.prefetch
            # the round buffer holds arena slots (zero copy); the default
            # arena has room for them
            if self._arena_views():
                self._opts["held"] = min(
                    _rebalance.held_steps(self._lb["steps"]), 256)
        self._rb = None
        self._rb_state = None  # load_state_dict()'s Tier-2 state

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
        if not self.shuffle:
            order = (range(len(self._index)) if subset is None
                     else sorted(array.array("Q", subset)))
            return _unshuffled(order, world, batch, rank, drop)
        kw = {} if subset is None else {"subset": subset}
        if self._tokens is not None:  # this sampling's tokens
            kw["tokens"] = self._tokens.tobytes()
        return _C.schedule(self.index_path, world, batch, rank, epoch,
                           self.seed, _BALANCE[self.balance], drop,
                           order=_STEP_ORDER[self.step_order], **kw)

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
        addr, start = self._coordinator_arg, False
        if addr is None:
            addr, start = coordinator_address(self.rank, self.world_size,
                                              self._ordinal)
            if addr.startswith("ipc://"):
                self._tmpdir = os.path.dirname(addr[len("ipc://"):])
        self._claim = claim_coordinator(addr, self.rank, self,
                                        self._task_content())
        self._client_addr = addr
        # The job key (_jobkey.py): made for the job when this loader's
        # own Coordinator serves it, else the user's, else none.
        self._key = JobKey.resolve(
            self._keyfile_arg,
            self._coordinator_arg is None and
            not os.environ.get("DATAHELIX_COORDINATOR"),
            self.rank, self.world_size, self._ordinal, binary(), addr)
        if start:
            # a Coordinator shared by ranks outlives this one: it removes
            # nothing of this rank's
            mine = () if self.world_size > 1 else (self._tmpdir,
                                                   self._key.owned_dir)
            self._coord = serve_coordinator(addr, self.policy,
                                            self.world_size, self._ordinal,
                                            shared=self.world_size > 1,
                                            keyfile=self._key.path,
                                            remove_at_exit=mine,
                                            **self._metrics_args)
            addr = self._client_addr = self._coord.listen
        elif self._coordinator_arg is None:  # rank 0's, if it has one
            addr = self._client_addr = find_coordinator(
                addr, self.world_size, self._ordinal)
        opts = self._opts
        if self._tx:  # the DataServer's Python workers decode, transform
            self._tx_dir = tempfile.mkdtemp(prefix="datahelix-tx-")
            opts = dict(opts, spares=0, workers=1,
                        dataserver_args=_video.dataserver_args(
                            self, self._tx_dir))
        # the local DataServer ends with this rank's client, kill -9 or not
        opts = dict(opts, dataserver_args=list(
            opts.get("dataserver_args") or []) + remove_args(
                (self._key.owned_dir, self._tx_dir)))
        if self.cache_dir:  # the client reads ahead into it; its server too
            opts = dict(opts, cache_dir=self.cache_dir,
                        cache_bytes=self._cache_bytes or 0)
        self._client = _C.Client(addr, self.index_path, rank=self.rank,
                                 world_size=self.world_size,
                                 datahelix_bin=binary(),
                                 keyfile=self._key.path,
                                 server_log=_log.server_log(), **opts)

    # -- iteration ----------------------------------------------------------

    def __iter__(self):
        """A new pass, as torch's DataLoader: over the whole epoch, or -
        right after load_state_dict() - from the saved step on.  Breaking
        out of a `for` and starting another starts the epoch again."""
        self._ensure_client()
        resume, self._resume = self._resume, False
        if not resume:
            self._step = 0
            if self._chain:  # the re-planned rest is left: the whole epoch
                self._chain = []
                self._len = None
        ids, offs, base = self._schedule(self._epoch)
        n_steps = len(offs) // 8 - 1
        k = min(max(self._step - base, 0), n_steps)
        self._step = base + k
        o = array.array("Q", offs)[k:]
        # The pass's counters start before its first request goes out.
        self._meter.start(self._epoch, self._pass + 1, self._client_stats())
        self._start_pass(base + k, ids, o.tobytes())
        self._pass += 1
        if self._lb is not None:
            if self._rb is None:
                self._rb = _rebalance.Rebalancer(self._lb, self)
            self._rb.reset()
            st, self._rb_state = self._rb_state, None
            if resume and st is not None:
                self._rb.resume(st)
        return _Pass(self, self._pass)

    def _next(self, it):
        """The next batch of pass `it` (see _Pass.__next__)."""
        if it.number != self._pass:
            raise RuntimeError(
                "this iterator was superseded: a newer iter() of the same "
                "DataLoader started another pass (one pass at a time per "
                "loader; create a second loader to iterate two at once)")
        # Tier 2 may have pulled the pass's end while batches it holds
        # are still to come (the next round is pulled ahead)
        if it.done and (self._rb is None or not self._rb.holds()):
            raise StopIteration
        if self._client is None:
            raise ValueError("the DataLoader is closed")
        if self._rb is not None:  # Tier 2: through the round buffer
            try:
                return self._rb.next(lambda: self._next_one(it))
            except StopIteration:
                it.done = True
                raise
        return self._next_one(it)

    def _next_one(self, it):
        """The client's next batch of pass `it` as a dict."""
        if it.done:
            raise StopIteration
        while True:
            try:
                b = self._client.next(self._timeout_ms)
            except _C.ArenaExhausted as e:
                if e.consumed:  # the server gave up on room by itself
                    self._step = max(self._step, int(e.step) + 1)
                raise  # never skipped: no sample is to blame
            except _C.SampleError as e:
                # The step is consumed: the next next() goes on after it.
                self._step = max(self._step, int(e.step) + 1)
                if self.on_error == "skip":  # its spares all failed
                    self._skipped += 1
                    self._meter.skipped()
                    continue
                raise
            if b is None:
                it.done = True
                raise StopIteration
            self._step = b.step + 1
            self._meter.batch(b.input_wait_ms)
            if not self._tx:
                return self._to_dict(b)
            out = self._from_workers(b)
            if out is not None:
                return out
            self._skipped += 1  # skip: its spares all failed too
            self._meter.skipped()

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

    def _audio(self, b):
        """The sound of every part (docs/arena.md "Batch layout": int64
        lengths [n], float32 [n, C, S], then the features [n, C, n_mels,
        F], each 64-aligned after the frames): [audio, lengths, features
        or None], the audio and features views of the slot for one
        microbatch (the lengths a copy)."""
        o = self._opts
        c, s = o["audio_channels"], o["audio_samples"]
        mels, frames = o["audio_mels"], _feature_frames(o, s)
        sounds, lengths, feats = [], [], []
        for j in range(b.n_parts):
            n = b.dims(j)[0]
            slot = b.slot(j)
            at = _align64(len(memoryview(b.part(j))))
            lengths.append(torch.frombuffer(slot, dtype=torch.int64, count=n,
                                            offset=at).clone())
            at = _align64(at + 8 * n)
            sounds.append(torch.frombuffer(
                slot, dtype=torch.float32, count=n * c * s,
                offset=at).view(n, c, s))
            if frames:
                at = _align64(at + 4 * n * c * s)
                feats.append(torch.frombuffer(
                    slot, dtype=torch.float32, count=n * c * mels * frames,
                    offset=at).view(n, c, mels, frames))
        out = [sounds, lengths, feats]
        for k, parts in enumerate(out):
            if len(parts) > 1:
                out[k] = torch.cat(parts)
            elif parts:
                out[k] = parts[0].clone() if (
                    self.transport == "copy" and k != 1) else parts[0]
            else:
                out[k] = None
        return out

    def _arena_views(self):
        """Whether a batch's "video" is its arena slot itself (one
        microbatch, transport="shm": _video)."""
        return self.transport != "copy" and self._opts["microbatches"] == 1

    def _to_dict(self, b):
        raw = b.sample_ids
        ids = array.array("Q", raw)
        out = {
            "video": None if self._native else self._video(b),
            "valid_frames": torch.frombuffer(bytearray(b.valid_frames),
                                             dtype=torch.int32),
            # each sample's read + decode + scale on its DataServer
            "sample_ms": torch.frombuffer(bytearray(b.sample_ms),
                                          dtype=torch.float32),
            "ids": torch.frombuffer(bytearray(raw), dtype=torch.int64),
            "tokens": torch.tensor([self._index.tokens(i) if self._tokens
                                    is None else self._tokens[i]
                                    for i in ids], dtype=torch.int64),
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
        if self.audio:  # [B, C, S] zero-padded, valid samples per row
            out["audio"], out["audio_lengths"], feats = self._audio(b)
            out["audio_mask"] = out["audio_lengths"] > 0
            n = out["audio_lengths"]
            out["audio_cu_seqlens"] = torch.cat(
                [torch.zeros(1, dtype=torch.int32),
                 torch.cumsum(n, 0).to(torch.int32)])
            if self.audio_layout == "packed":  # the rows' samples, end on end
                out["audio"] = torch.cat(
                    [out["audio"][k, :, :int(n[k])] for k in range(len(n))],
                    dim=1)
            if feats is not None:  # [B, C, n_mels, frames]
                out["audio_features"] = feats
                out["audio_feature_lengths"] = torch.where(
                    n > 0, _feature_frames(self._opts, n).clamp(
                        max=feats.shape[-1]), 0)
        if self._native:  # a list of views, packed, cu_seqlens, thw
            out.update(_packed.video(b.part(0), len(ids), self._dtype,
                                     self._patch))
        if self.collate_fn is not None:
            out = self._per_sample(out)
        if self._pinner is not None:
            out = self._pinner.pin(out)
        return out

    def _from_workers(self, b):
        """transform=: the batch a Python worker wrote into the slot
        (_video.Clips.collate), its tensors views of the slot; None for a
        step on_error="skip" drops."""
        step = b.step
        try:
            got = _slot.decode(b.part(0))
        except (ValueError, AttributeError) as e:
            raise _C.DataError(f"rank {self.rank} epoch {self._epoch} step "
                               f"{step}: a batch that cannot be read: "
                               f"{e}") from None
        finally:
            del b
        if got["kind"] == "error":
            if got["sample"] is not None:
                self._tx_failed.add(got["sample"])
            if self.on_error == "skip" and _video.is_skippable(got):
                return None
            _video.raise_error(got, self, step)
        r = got["obj"]
        self._substituted += len(r["substituted"])
        self._tx_failed.update(x["failed_id"] for x in r["substituted"])
        self._meter.add_python(r["transform_ms"] / 1e3,
                               r["collate_ms"] / 1e3)
        if self.collate_fn is not None:
            out = r["user"]
        else:
            ids = r["ids"].tolist()
            out = {"video": r["video"], "valid_frames": r["valid_frames"],
                   "ids": r["ids"],
                   "tokens": torch.tensor(
                       [self._index.tokens(i) if self._tokens is None
                        else self._tokens[i] for i in ids],
                       dtype=torch.int64),
                   "text": [self._index.text(i) for i in ids],
                   "epoch": self._epoch, "step": step,
                   "substituted": r["substituted"]}
        if self._pinner is not None:
            out = self._pinner.pin(out)
        return out

    def _per_sample(self, batch):
        """collate_fn= without transform= over the samples (zero-copy
        views of the arena), in this process inside next() (docs/python.md
        "transform and collate_fn"; with transform= both run on the
        DataServer's workers, _from_workers)."""
        t0 = time.perf_counter()
        video = batch["video"]
        samples = [{"video": video[k], "valid_frames": int(f), "id": int(i),
                    "tokens": int(t), "text": x, "epoch": batch["epoch"],
                    "step": batch["step"]}
                   for k, (f, i, t, x) in enumerate(zip(
                       batch["valid_frames"], batch["ids"], batch["tokens"],
                       batch["text"]))]
        if self.audio:  # each sample's row, and its valid length
            cu = batch["audio_cu_seqlens"].tolist()
            for k, sample in enumerate(samples):
                sample["audio"] = batch["audio"][k] \
                    if self.audio_layout == "padded" \
                    else batch["audio"][:, cu[k]:cu[k + 1]]
                sample["audio_length"] = int(batch["audio_lengths"][k])
                if "audio_features" in batch:
                    sample["audio_features"] = batch["audio_features"][k]
        out = self.collate_fn(samples)
        self._meter.add_python(0.0, time.perf_counter() - t0)
        return out

    # -- state --------------------------------------------------------------

    def _task_content(self):
        """What a task id of this loader stands for besides (epoch, step,
        rank): the manifest and every input of the plan and of a sample's
        bytes (a Coordinator reused by another loader must not hand it
        tasks that name other samples, _services.claim_coordinator)."""
        o = self._opts
        return (self._manifest_id()["digest"], self.seed, self.shuffle,
                self.balance, self.step_order, self.batch_size, o["frames"],
                o["width"], o["height"], o["layout"], o["dtype"],
                o["random_crop"], o["microbatches"], o["fps"], o["native"],
                o.get("max_side"), o.get("max_area"), o.get("patch"),
                o["audio_rate"], o["audio_channels"], o["audio_samples"],
                o["audio_required"], o["audio_feature"], o["audio_n_fft"],
                o["audio_hop"], o["audio_mels"], o["audio_crop"])

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
        step, tier2 = self._step, None
        if self._rb is not None:
            first = self._rb.pending_step()  # pulled, not yielded yet
            if first is not None:
                step = first
            tier2 = self._rb.state()
        return {"epoch": self._epoch, "step": step, "seed": self.seed,
                "tier2": tier2,
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
                for key in ("balance", "drop_last", "step_order"):
                    self._check_plan(plan, key, "the rest of its epoch "
                                     "would repeat some samples and skip "
                                     "others")
            if (w, b) != (self.world_size, self.batch_size):
                chain.append((w, b, step))
        self._epoch = epoch
        self._step = step
        self._chain = chain
        self._resume = True
        # Tier 2 decides as the saved run did (same groups, same rounds)
        t2 = state.get("tier2")
        self._rb_state = None
        if t2 is not None and self._lb is not None and not chain and \
                (w, b) == (self.world_size, self.batch_size):
            self._rb_state = dict(t2, skip_to=step)
            if t2.get("round_step") is not None and step > 0:
                self._step = int(t2["round_step"])
        self._len = None

    def _client_stats(self):
        if self._client is not None:
            s = self._client.stats()
            s["quarantine"] = self._client.quarantine()
            if self._tx:  # substitutes are made by the Python workers
                s["substituted"] = self._substituted
                s["quarantine"] = sorted(set(s["quarantine"]) |
                                         self._tx_failed)
            if self._rb is not None:  # samples Tier 2 brought from other
                # ranks were prepared on their DataServers
                s["cross_ds_bytes"] += self._rb.totals["bytes_in"]
            return s
        return dict(self._meter.last or {})  # as close() left them

    def stats(self):
        """The loader's figures (dict; every field in docs/python.md
        "stats()"): cumulative over its life at the top level, this pass's
        under "epoch", finished passes under "epochs" (oldest first)."""
        s = self._client_stats()
        s.setdefault("quarantine", [])
        s["skipped"] = self._skipped
        s.update(self._meter.py)
        s["passes"] = self._pass
        s["epoch"] = self._meter.figures(s)
        s["epochs"] = list(self._meter.done)
        s.setdefault("substituted", 0)
        s["tier2"] = self._rb.stats() if self._rb is not None else None
        s["cache"] = (_cache.cache_stats(self.cache_dir)
                      if self.cache_dir else None)
        return s

    # -- lifetime -----------------------------------------------------------

    @property
    def metrics_address(self):
        """HOST:PORT of the metrics endpoint of the Coordinator this loader
        started (metrics_listen=), once it serves; None otherwise."""
        return self._coord.metrics_address if self._coord else None

    def close(self):
        """Stops the client, its DataServer and an embedded Coordinator.
        Batches still held stay valid until they are freed."""
        if self._pinner is not None:  # before the arena can be unmapped
            self._pinner.unregister_all()
        if self._rb is not None:  # Tier 2's sockets and folder
            self._rb.close()
            self._rb = None
        if self._client is not None:
            self._meter.last = self._client_stats()  # stats() after close
            self._client.close()
            self._client = None
        release_coordinator(self._claim)
        self._claim = None
        if self._coord is not None:
            self._coord.stop()
            self._coord = None
        for d in ("_tmpdir", "_tx_dir"):
            if getattr(self, d, None) is not None:
                shutil.rmtree(getattr(self, d), ignore_errors=True)
                setattr(self, d, None)
        if self._key is not None:
            self._key.close()
            self._key = None

    # -- task identity and resume checks ------------------------------------

    def _start_pass(self, first_step, ids, offs):
        """Gives the client this schedule as a new pass: the wire's task
        id is (pass, step, rank, part) with the epoch beside it, so no two
        schedules of this rank share an id, at any epoch count
        (_passes.py)."""
        if self._tx:  # Python jobs: a header, the ids, the spares
            ids, offs = _video.jobs(self, first_step, ids, offs)
        self._client.start_pass(self._epoch, _passes.new_pass(), first_step,
                                ids, offs)

    def _plan_id(self):
        """The plan's inputs besides manifest, seed, world and batch size
        (which state_dict() has already): how the epoch's samples are put
        into steps, and how each is sampled."""
        size = getattr(self, "size", None)
        sampling = {"frames": self.frames,
                    "size": list(size) if size is not None else None,
                    "random_crop": bool(self._opts.get("random_crop"))}
        sampling.update(_packed.plan_keys(self._opts))  # fps / native only
        return {"balance": self.balance, "drop_last": bool(self.drop_last),
                "step_order": self.step_order, "sampling": sampling}

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
        order = _STEP_ORDER.get(saved.get("step_order"),
                                _STEP_ORDER[self.step_order])

        def plan(world, batch, rank, subset):
            kw = {} if subset is None else {"subset": subset}
            if self._tokens is not None:  # this sampling's tokens
                kw["tokens"] = self._tokens.tobytes()
            return _C.schedule(self.index_path, world, batch, rank, epoch,
                               self.seed, balance,
                               drop if subset is None else False,
                               order=order, **kw)

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


def _unshuffled(order, world, batch, rank, drop_last):
    """shuffle=False: (ids, offsets) of `rank` when `order` (the manifest's
    ids in order, or a re-planned rest sorted) is cut as balance='none'
    cuts the permutation (docs/planner.md): step g takes the next
    world * batch ids, rank r the r-th run of `batch`; a partial last step
    gives rank r floor(rem / world) ids, one more if r < rem % world."""
    n, per = len(order), world * batch
    steps, rem = divmod(n, per)
    ids, offs = [], [0]
    for g in range(steps):
        at = g * per + rank * batch
        ids.extend(order[at:at + batch])
        offs.append(len(ids))
    if rem and not drop_last:
        q, r = divmod(rem, world)
        at = steps * per + rank * q + min(rank, r)
        ids.extend(order[at:at + q + (rank < r)])
        offs.append(len(ids))
    return (array.array("Q", ids).tobytes(),
            array.array("Q", offs).tobytes())


class _Pass:
    """What iter(DataLoader) returns: one pass over (the rest of) an epoch.
    An iterator object, not a generator, so that a SampleError raised by
    next() leaves it usable: the next next() yields the step after the
    failed one, as torch's DataLoader goes on after a worker's error."""

    def __init__(self, loader, number):
        self.loader, self.number, self.done = loader, number, False

    def __iter__(self):
        return self

    def __next__(self):
        return self.loader._next(self)

    def __len__(self):
        return len(self.loader)


# Any map-style torch Dataset on the DataServers' Python workers
# (DESIGN.md 4.3): _distributed.py.
from ._distributed import DistributedDataLoader  # noqa: E402,F401
