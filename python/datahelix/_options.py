"""torch.utils.data.DataLoader's vocabulary for datahelix.DataLoader
(docs/python.md "Torch's arguments"): every argument of torch's constructor
is either taken with torch's meaning or refused with a message that says
what to use instead - never ignored silently.  Also the page-locking of
the arena for pin_memory=True (_Pinner).
"""
import os
import time
import warnings

import torch

_DTYPES = {"uint8": "uint8", "float32": "float32",
           torch.uint8: "uint8", torch.float32: "float32"}
MAX_SIDE = 16384  # dh_media_plan: output sides 1..16384

# torch arguments that have no meaning here: refused unless left at torch's
# default (None), with what to use instead.
REFUSED = {
    "sampler": "the plan orders and batches the epoch (token balance across "
               "ranks): use shuffle=, seed= / generator= and set_epoch(); "
               "for a sampler of your own, datahelix.DistributedDataLoader "
               "over a torch Dataset",
    "batch_sampler": "the plan makes the batches (token balance across "
                     "ranks): use batch_size= and balance=; for a batch "
                     "sampler of your own, datahelix.DistributedDataLoader "
                     "over a torch Dataset",
    "worker_init_fn": "the DataServer's workers are datahelix's own "
                      "(C threads, or with transform= Python processes "
                      "that seed random / torch / numpy per sample): "
                      "per-sample Python goes in transform=; a Python "
                      "dataset with worker_init_fn in "
                      "datahelix.DistributedDataLoader",
    "multiprocessing_context": "this loader starts no worker processes of "
                               "its own (the DataServer, a separate "
                               "program, decodes): drop the argument",
}


def refuse(name, value):
    if value is not None:
        raise ValueError(f"datahelix.DataLoader: {name}= is not supported: "
                         f"{REFUSED[name]}")


def trace_path(trace, rank):
    """DataLoader(trace=...): a path (str or os.PathLike) whose "{rank}" is
    this rank, or None.  The file is written when the loader closes."""
    if trace is None or trace is False:
        return None
    if not isinstance(trace, (str, os.PathLike)):
        raise TypeError(f"trace={trace!r}: a file path (str or "
                        "os.PathLike), e.g. 'trace-{rank}.json'")
    return os.fspath(trace).replace("{rank}", str(rank))


def check_manifest(manifest):
    if isinstance(manifest, (torch.utils.data.Dataset,
                             torch.utils.data.IterableDataset)):
        raise TypeError(
            "datahelix.DataLoader reads a manifest (a .jsonl descriptor "
            "table or a .dhx index), not a torch Dataset: use "
            "datahelix.DistributedDataLoader(dataset, ...) for a Dataset")


def size_hw(size):
    """(H, W) from size=: (H, W) as torchvision, or an int for a square.
    The command line's "WxH" string is refused, not reordered."""
    if isinstance(size, str):
        raise ValueError(
            f"size={size!r}: a 'WxH' string is the command line's form; "
            "pass size=(H, W) as torchvision does (height first)")
    if isinstance(size, int) and not isinstance(size, bool):
        size = (size, size)
    try:
        h, w = size
    except (TypeError, ValueError):
        raise ValueError(f"size={size!r}: expected (H, W), two ints") \
            from None
    for v in (h, w):
        if isinstance(v, bool) or not isinstance(v, int) or \
                not 1 <= v <= MAX_SIDE:
            raise ValueError(f"size={size!r}: (H, W), each an int in "
                             f"1..{MAX_SIDE}")
    return h, w


def dtype_name(dtype):
    try:
        return _DTYPES[dtype]
    except (KeyError, TypeError):
        raise ValueError(f"dtype={dtype!r}: torch.uint8 or torch.float32 "
                         "(or 'uint8' / 'float32')") from None


def decode_threads(num_workers, workers):
    """num_workers (torch's name) or workers (the older one, an alias):
    the local DataServer's decode threads.  0 means 1: decoding never runs
    in the training process."""
    if num_workers is not None and workers is not None and \
            num_workers != workers:
        raise ValueError(f"num_workers={num_workers} and workers={workers}:"
                         " one name for one thing (workers is an alias)")
    n = num_workers if num_workers is not None else workers
    n = 2 if n is None else n
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"num_workers={n!r}: an int >= 0")
    return max(1, n)


def prefetch_depth(prefetch, prefetch_factor, threads):
    """Steps requested ahead: `prefetch` itself, else torch's
    prefetch_factor (default 2) batches per worker."""
    if prefetch is not None and prefetch_factor is not None:
        raise ValueError("prefetch= (steps ahead) and prefetch_factor= "
                         "(batches per worker, torch's) both given: pass "
                         "one")
    if prefetch is None:
        f = 2 if prefetch_factor is None else prefetch_factor
        if isinstance(f, bool) or not isinstance(f, int) or f < 1:
            raise ValueError(f"prefetch_factor={f!r}: an int >= 1")
        prefetch = f * threads
    return min(256, prefetch)  # DH_CLIENT_MAX_PREFETCH


def plan_seed(seed, generator):
    """The plan's seed: seed=, else one draw from generator= (as torch
    draws its base seed from it), else 0."""
    if generator is None:
        return 0 if seed is None else int(seed)
    if seed is not None:
        raise ValueError("seed= and generator= both given: the plan's seed "
                         "comes from one of them")
    if not isinstance(generator, torch.Generator):
        raise ValueError(f"generator={generator!r}: a torch.Generator")
    return int(torch.empty((), dtype=torch.int64)
               .random_(generator=generator).item())


def timeout_ms(timeout):
    """One batch's bound: timeout > 0 seconds; 0 or None waits forever
    (torch's 0), -1 to the binding."""
    if timeout is None or timeout == 0:
        return -1
    if not timeout > 0:
        raise ValueError(f"timeout={timeout!r}: seconds > 0, or 0 to wait "
                         "without bound (torch's default)")
    return max(1, int(timeout * 1000))


AUDIO_MIN_RATE, AUDIO_MAX_RATE = 1000, 384000   # datahelix/media.h
AUDIO_MAX_ROW = 48000 * 600                      # DH_AUDIO_MAX_ROW
AUDIO_SECONDS = 30.0  # a row's default bound: Whisper's window


# audio_features= -> (the plan's kind, default n_fft, hop, n_mels): the
# references' own defaults (torchaudio's MelSpectrogram; Whisper's)
AUDIO_FEATURES = {"mel": (1, 400, 200, 128), "log-mel": (2, 400, 200, 128),
                  "whisper": (3, 400, 160, 80)}


def audio_feature_opts(audio, features, n_mels, n_fft, hop_length, samples):
    """The client's feature options ({"audio_feature": 0, ...} without
    features); docs/python.md "Sound"."""
    none = dict(audio_feature=0, audio_n_fft=0, audio_hop=0, audio_mels=0)
    if features is None:
        if (n_mels, n_fft, hop_length) != (None, None, None):
            raise ValueError("n_mels, n_fft and hop_length shape "
                             "audio_features=; pass it too")
        return none
    if features not in AUDIO_FEATURES:
        raise ValueError(f"audio_features={features!r}: None or one of "
                         f"{list(AUDIO_FEATURES)}")
    if not audio:
        raise ValueError("audio_features= needs audio=True")
    kind, fft, hop, mels = AUDIO_FEATURES[features]
    fft = fft if n_fft is None else n_fft
    hop = hop if hop_length is None else hop_length
    mels = mels if n_mels is None else n_mels
    for name, v, lo, hi in (("n_fft", fft, 16, 8192),
                            ("hop_length", hop, 1, fft),
                            ("n_mels", mels, 1, 512)):
        if (not isinstance(v, int) or isinstance(v, bool)
                or not lo <= v <= hi):
            raise ValueError(f"{name}={v!r}: an int in {lo}..{hi}")
    if fft % 2:
        raise ValueError(f"n_fft={fft}: an even number")
    if samples <= fft // 2:
        raise ValueError(f"audio_seconds: a row of {samples} samples is "
                         f"not longer than n_fft / 2 ({fft // 2})")
    return dict(audio_feature=kind, audio_n_fft=fft, audio_hop=hop,
                audio_mels=mels)


AUDIO_CROPS = {"start": 0, "center": 1, "random": 2}


def audio_opts(audio, rate, channels, seconds, missing, crop="start"):
    """The client's sound options ({"audio_rate": 0, ...} without sound):
    rate Hz, 1 or 2 channels, rows of ceil(seconds * rate) samples,
    missing "zeros" (an empty row, audio_mask False) or "error" (a
    SampleError).  docs/python.md "Sound"."""
    if audio not in (True, False):
        raise ValueError(f"audio={audio!r}: True or False")
    if missing not in ("zeros", "error"):
        raise ValueError(f"audio_missing={missing!r}: 'zeros' (an empty "
                         "row, audio_mask False) or 'error' (SampleError)")
    if crop not in AUDIO_CROPS:
        raise ValueError(f"audio_crop={crop!r}: one of {list(AUDIO_CROPS)} "
                         "(an audio-only sample's window)")
    if not audio:
        return dict(audio_rate=0, audio_channels=0, audio_samples=0,
                    audio_required=False, audio_crop=0)
    if (not isinstance(rate, int) or isinstance(rate, bool) or
            not AUDIO_MIN_RATE <= rate <= AUDIO_MAX_RATE):
        raise ValueError(f"audio_rate={rate!r}: an int of Hz in "
                         f"{AUDIO_MIN_RATE}..{AUDIO_MAX_RATE}")
    if channels not in (1, 2) or isinstance(channels, bool):
        raise ValueError(f"audio_channels={channels!r}: 1 (mono) or 2")
    seconds = AUDIO_SECONDS if seconds is None else seconds
    if (not isinstance(seconds, (int, float)) or isinstance(seconds, bool)
            or not seconds > 0 or seconds * rate > AUDIO_MAX_ROW):
        raise ValueError(f"audio_seconds={seconds!r}: > 0 seconds, at most "
                         f"{AUDIO_MAX_ROW} samples a row at {rate} Hz")
    return dict(audio_rate=rate, audio_channels=channels,
                audio_samples=max(1, int(-(-seconds * rate // 1))),
                audio_required=missing == "error",
                audio_crop=AUDIO_CROPS[crop])


def check_callable(name, f):
    if f is not None and not callable(f):
        raise ValueError(f"{name}={f!r}: a callable (or None)")


def check_pin_device(pin_memory, device):
    if device and not str(device).startswith("cuda"):
        raise ValueError(f"pin_memory_device={device!r}: '' or 'cuda[:N]' "
                         "(page-locked host memory serves CUDA copies)")
    if pin_memory and not torch.cuda.is_available():
        warnings.warn("datahelix.DataLoader: pin_memory=True but CUDA is "
                      "not available (torch.cuda.is_available() is False): "
                      "nothing is page-locked", stacklevel=3)
        return False
    return bool(pin_memory)


# -- pin_memory ---------------------------------------------------------

def _mapping_of(ptr, length):
    """(start, end) of the run of this process's mappings of one file
    (the arena's memfd) that holds [ptr, ptr + length), from
    /proc/self/maps; None if no single file's mapping does."""
    rows = []
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(maxsplit=5)
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            rows.append((lo, hi, parts[3], parts[4]))
    for k, (lo, hi, dev, ino) in enumerate(rows):
        if lo <= ptr < hi:
            if ino == "0":
                return None  # anonymous memory: not the arena
            start, end, j = lo, hi, k
            while end < ptr + length and j + 1 < len(rows) and \
                    rows[j + 1][0] == end and rows[j + 1][2:] == (dev, ino):
                j += 1
                end = rows[j][1]
            return (start, end) if end >= ptr + length else None
    return None


class Pinner:
    """pin_memory=True with CUDA: each arena mapping this process sees is
    page-locked once, in place (cudaHostRegister through torch's own CUDA
    runtime bindings), so batch["video"].cuda(non_blocking=True) copies
    asynchronously from the arena itself, no copy to a staging buffer.
    Tensors that are not in the arena (the small int tensors, or what
    transform= / collate_fn= made) are pinned as torch does, by a copy
    into pinned memory.  unregister_all() before the arena is unmapped."""

    PORTABLE = 1  # cudaHostRegisterPortable: pinned for every device

    def __init__(self, device=""):
        self.device = device or None
        self.regions = []  # (start, end) registered
        self.failed = False

    def _cudart(self):
        return torch.cuda.cudart()

    def _check(self, rc, what):
        if int(rc) != 0:
            raise RuntimeError(f"{what} returned CUDA error {int(rc)}")

    def covers(self, t):
        p, n = t.data_ptr(), t.numel() * t.element_size()
        return any(s <= p and p + n <= e for s, e in self.regions)

    def register(self, t):
        """Page-locks the arena mapping under `t`; False if it is not in
        one or CUDA refused (then it is pinned by copy, as torch does)."""
        if self.covers(t):
            return True
        if self.failed:
            return False
        r = _mapping_of(t.data_ptr(), t.numel() * t.element_size())
        if r is None:
            return False
        try:
            self._check(self._cudart().cudaHostRegister(
                r[0], r[1] - r[0], self.PORTABLE), "cudaHostRegister")
        except RuntimeError as e:
            self.failed = True
            warnings.warn(f"datahelix.DataLoader: pin_memory: the arena "
                          f"could not be page-locked ({e}); batches are "
                          "copied into pinned memory instead", stacklevel=4)
            return False
        self.regions.append(r)
        return True

    def pin(self, obj):
        """obj with each tensor page-locked: in place if it is in the
        arena, else a pinned copy (torch's pin_memory)."""
        if isinstance(obj, torch.Tensor):
            return obj if self.register(obj) else self._pin_copy(obj)
        if isinstance(obj, dict):
            return {k: self.pin(v) for k, v in obj.items()}
        if isinstance(obj, list):
            return [self.pin(v) for v in obj]
        if isinstance(obj, tuple):
            return tuple(self.pin(v) for v in obj)
        return obj

    def _pin_copy(self, t):
        return t.pin_memory(self.device) if self.device else t.pin_memory()

    def unregister_all(self):
        regions, self.regions = self.regions, []
        for start, _ in regions:
            try:
                self._cudart().cudaHostUnregister(start)
            except RuntimeError:
                pass


# -- stats() ------------------------------------------------------------

# The client's counters that a pass's figures are differences of.
COUNTERS = ("steps", "errors", "misses", "requests", "reissued", "restarts",
            "late_released", "quarantined", "cross_ds_bytes", "batch_bytes",
            "read_bytes", "read_ms", "read_samples")
HISTORY = 100  # finished passes kept in stats()["epochs"]


def _pct(sorted_v, p):
    """Nearest-rank percentile (as the client's), 0 for no values."""
    if not sorted_v:
        return 0.0
    k = max(0, min(len(sorted_v) - 1, int(-(-p * len(sorted_v) // 100)) - 1))
    return sorted_v[k]


class Meter:
    """stats()'s figures per pass and over the loader's life.  A pass
    (one iter(): a whole epoch, or its rest after a resume) starts from a
    snapshot of the client's cumulative counters; its figures are the
    differences, its input-wait percentiles its own batches' waits."""

    def __init__(self):
        self.cur = None
        self.done = []
        self.py = {"transform_ms": 0.0, "collate_ms": 0.0}
        self.last = None  # the client's counters at close()

    def start(self, epoch, number, client):
        self.finish(client)
        self.cur = {"epoch": epoch, "pass": number, "skipped": 0,
                    "transform_ms": 0.0, "collate_ms": 0.0,
                    "base": {k: client.get(k, 0) for k in COUNTERS},
                    "waits": [], "t0": time.monotonic(), "t1": None}

    def batch(self, wait_ms):
        if self.cur is not None:
            self.cur["waits"].append(wait_ms)
            self.cur["t1"] = time.monotonic()

    def skipped(self):
        if self.cur is not None:
            self.cur["skipped"] += 1

    def add_python(self, transform_s, collate_s):
        self.py["transform_ms"] += transform_s * 1e3
        self.py["collate_ms"] += collate_s * 1e3
        if self.cur is not None:
            self.cur["transform_ms"] += transform_s * 1e3
            self.cur["collate_ms"] += collate_s * 1e3

    def figures(self, client):
        """The current pass's dict (None before the first iter())."""
        c = self.cur
        if c is None:
            return None
        w = sorted(c["waits"])
        out = {"epoch": c["epoch"], "pass": c["pass"]}
        out.update({k: client.get(k, 0) - c["base"][k] for k in COUNTERS})
        out.update(skipped=c["skipped"],
                   input_wait_p50_ms=_pct(w, 50),
                   input_wait_p95_ms=_pct(w, 95),
                   input_wait_max_ms=w[-1] if w else 0.0,
                   elapsed_s=round((c["t1"] or c["t0"]) - c["t0"], 3),
                   transform_ms=c["transform_ms"],
                   collate_ms=c["collate_ms"])
        return out

    def finish(self, client):
        f = self.figures(client)
        if f is not None:
            self.done.append(f)
            del self.done[:-HISTORY]
        self.cur = None
