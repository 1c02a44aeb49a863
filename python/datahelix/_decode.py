"""datahelix.decode: the C media pipeline for your own Dataset (issue 35
item 5; docs/python.md "Decoding in your own Dataset").

    table = datahelix.Table("manifest.jsonl")     # or a .dhx index
    video = datahelix.decode(table.source(i), frames=8, size=(224, 224))
    with datahelix.open(table.source(i)) as f:   # the raw bytes, seekable
        ...

A source is a path, a shard member (``datahelix.Source(shard, member,
offset, size)``, a table row dict, ``Table.source(i)``) or the bytes of a
file.  Each thread keeps one decoder (``datahelix.Decoder``), so a file
takes over the previous file's decoder and a shard stays open for its next
member, as on the DataServers.
"""
import io
import os
import threading

from . import _C
from ._services import ensure_index

__all__ = ["Source", "Table", "Decoder", "decode", "decode_audio",
           "audio_features", "open"]


class Source:
    """Where a sample's bytes are: a file (member None) or `size` bytes at
    `offset` of a tar shard (its member `member`).  A file's `size` and
    `mtime_ns` (what a table recorded; 0: unchecked) that differ from the
    file's say it changed since probe: decoding it is an error."""

    __slots__ = ("path", "member", "offset", "size", "mtime_ns")

    def __init__(self, path, member=None, offset=0, size=0, mtime_ns=0):
        self.path = os.fspath(path)
        self.member = member
        self.offset = int(offset)
        self.size = int(size)
        self.mtime_ns = int(mtime_ns)
        if member is not None and (self.offset < 0 or self.size <= 0):
            raise ValueError(f"datahelix.Source: {self.path}:{member}: a "
                             "shard member needs offset >= 0 and size > 0")

    @classmethod
    def of(cls, x):
        """A Source from a Source, a path, a table row (a dict with "path"
        and, for a shard member, "member", "offset" and "bytes"; its
        "mtime_ns" is checked) or a (path, member, offset, size[,
        mtime_ns]) tuple."""
        if isinstance(x, cls):
            return x
        if isinstance(x, (str, bytes, os.PathLike)):
            return cls(x)
        if isinstance(x, dict):
            if "path" not in x:
                raise ValueError("datahelix: a table row without 'path'")
            return cls(x["path"], x.get("member"), x.get("offset", 0),
                       x.get("bytes", 0) if x.get("member") else 0,
                       x.get("mtime_ns", 0))
        if isinstance(x, tuple) and len(x) in (4, 5):
            return cls(*x)
        raise TypeError(f"datahelix: not a source: {type(x).__name__} (a "
                        "path, a datahelix.Source, a table row or bytes)")

    @property
    def name(self):
        return f"{self.path}:{self.member}" if self.member else self.path

    def __repr__(self):
        if self.member is None:
            return f"Source({self.path!r})"
        return (f"Source({self.path!r}, {self.member!r}, {self.offset}, "
                f"{self.size})")

    def __eq__(self, other):
        return isinstance(other, Source) and \
            (self.path, self.member, self.offset, self.size,
             self.mtime_ns) == (other.path, other.member, other.offset,
                                other.size, other.mtime_ns)


class Table:
    """A descriptor table (.jsonl, compiled to its .dhx index beside it as
    the loaders do) or an index, opened read-only: len(), source(i),
    text(i), path(i)."""

    def __init__(self, manifest):
        self.index_path = ensure_index(manifest)
        self._ix = _C.Index(self.index_path)

    def __len__(self):
        return len(self._ix)

    def _id(self, i):
        i = int(i)
        if not 0 <= i < len(self._ix):
            raise IndexError(f"datahelix.Table: sample {i} of "
                             f"{len(self._ix)}")
        return i

    def source(self, i):
        return Source(*self._ix.source(self._id(i)))

    def path(self, i):
        return self._ix.path(self._id(i))

    def text(self, i):
        return self._ix.text(self._id(i))


class Decoder(_C.Decoder):
    """One media context, reused across files (one per thread): decode()
    as the module function, on this decoder."""

    def decode(self, source, **kw):
        return _decode(self, source, **kw)


_local = threading.local()


def _thread_decoder():
    d = getattr(_local, "decoder", None)
    if d is None:
        d = _local.decoder = Decoder()
    return d


_PLAN_KINDS = ("uniform", "jitter", "all")


def _plan(frames, size, fps, indices, seed, geometry, layout, dtype, pad,
          max_side, max_pixels, patch):
    kw = dict(seed=seed, layout=layout.lower(), dtype=dtype, pad=pad,
              geometry=geometry)
    if indices is not None:
        kw.update(kind="indices", indices=[int(i) for i in indices])
    elif fps is not None:
        kw.update(kind="fps", fps=float(fps), frames=int(frames or 0))
    elif isinstance(frames, str):
        if frames.startswith("fps:"):
            kw.update(kind="fps", fps=float(frames[4:]), frames=0)
        elif frames in _PLAN_KINDS:
            kw.update(kind=frames, frames=16 if frames == "jitter" else 0)
        else:
            raise ValueError(f"datahelix.decode: frames={frames!r}: a count, "
                             "'fps:F', 'all' or 'jitter'")
    else:
        kw.update(kind="uniform", frames=int(frames))
    if size is None or size == "native":
        kw.update(geometry="native", width=0, height=0, max_side=max_side,
                  max_area=max_pixels, patch=patch)
    else:
        h, w = size  # (H, W), as torchvision
        kw.update(width=int(w), height=int(h))
    return kw


def _decode(dec, source, frames=16, size=(224, 224), *, fps=None,
            indices=None, seed=0, geometry="crop", layout="thwc",
            dtype="uint8", pad="repeat", max_side=0, max_pixels=0, patch=0,
            info=False):
    import torch
    if isinstance(source, (bytes, bytearray, memoryview)):
        meta = dec.open_bytes(bytes(source), "<bytes>")
    else:
        s = Source.of(source)
        meta = dec.open(s.path, s.member, s.offset, s.size, s.mtime_ns)
    try:
        shape, nbytes = dec.prepare(**_plan(
            frames, size, fps, indices, seed, geometry, layout, dtype, pad,
            max_side, max_pixels, patch))
        # swscale may store a little past the last row: the room is in the
        # storage, the tensor is the frames alone
        buf = torch.empty(nbytes + _C.MEDIA_DST_PAD, dtype=torch.uint8)
        res = dec.decode_into(buf.numpy())
    finally:
        dec.close()
    t = buf[:nbytes]
    t = (t.view(torch.float32) if dtype == "float32" else t).view(shape)
    if info:
        return t, dict(res, clip=meta)
    return t


def decode(source, frames=16, size=(224, 224), **kw):
    """Decodes the frames a plan picks from `source` into a tensor, with
    the pipeline the loaders run: uint8 [T, H, W, 3] by default.

    frames: a count (uniform over the clip), "fps:F", "all" or "jitter";
    or fps=F (frames is then a cap), or indices=[...].  size: (H, W), or
    None for each clip's native size (bounded by max_side / max_pixels,
    rounded to a multiple of patch).  geometry "crop" | "stretch" |
    "random-crop"; layout "thwc" | "tchw"; dtype "uint8" | "float32";
    pad "repeat" | "zero" for a clip shorter than the plan; seed for
    jitter and random-crop.  info=True returns (tensor, dict): frames,
    valid_frames, decoded_frames, seeks, indices (the clip's frame of each
    output frame, -1 for zero padding) and clip (the file's facts: kind,
    frames, keyframes, width, height, rotation, fps, duration_s, codec).
    Errors name the file (or SHARD:MEMBER) and the cause: OSError when it
    cannot be read (as open() would raise), datahelix.DataError for bad
    media or a plan it cannot hold, ValueError for a bad argument."""
    return _decode(_thread_decoder(), source, frames, size, **kw)


class _MemberIO(io.RawIOBase):
    """A shard member as a read-only, seekable raw file."""

    def __init__(self, path, offset, size):
        super().__init__()
        self._fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
        try:
            import stat
            st = os.fstat(self._fd)
            if not stat.S_ISREG(st.st_mode):
                raise OSError(f"{path}: not a regular file")
            if offset + size > st.st_size:
                raise OSError(f"{path}: the member's {size} bytes at byte "
                              f"{offset} lie past the shard's end "
                              f"({st.st_size} bytes): the shard changed "
                              "since probe; re-run `datahelix probe`")
        except BaseException:
            os.close(self._fd)
            raise
        self._off, self._size, self._pos = offset, size, 0

    def readable(self):
        return True

    def seekable(self):
        return True

    def readinto(self, b):
        n = max(0, min(len(b), self._size - self._pos))
        if n == 0:
            return 0
        data = os.pread(self._fd, n, self._off + self._pos)
        b[:len(data)] = data
        self._pos += len(data)
        return len(data)

    def seek(self, pos, whence=io.SEEK_SET):
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos,
                io.SEEK_END: self._size}[whence]
        if base + pos < 0:
            raise OSError("seek before the member's start")
        self._pos = base + pos
        return self._pos

    def tell(self):
        return self._pos

    def close(self):
        if not self.closed:
            os.close(self._fd)
        super().close()


def decode_audio(source, start=0.0, end=None, rate=16000, channels=1):
    """The sound of `source` (a path, a datahelix.Source, a table row,
    Table.source(i)) from `start` to `end` seconds on the container's
    clock (end None: to the end), resampled to `rate` Hz and `channels`
    (1 or 2): float32 [channels, samples].  Encoder priming and edit
    lists are dropped as a player drops them, so sample n is sample n of
    `ffmpeg -i FILE -ar RATE -ac CHANNELS` over the same span.  Errors as
    decode()'s; a source without sound is a datahelix.DataError."""
    import torch
    s = Source.of(source)
    if isinstance(rate, bool) or not isinstance(rate, int):
        raise TypeError("decode_audio: rate must be an int (Hz)")
    if channels not in (1, 2) or isinstance(channels, bool):
        raise ValueError("decode_audio: channels must be 1 or 2")
    buf, c, n, _ = _C.decode_audio(
        s.path, s.member, s.offset, s.size, s.mtime_ns, rate, channels,
        float(start), 0.0 if end is None else float(end))
    if n == 0:
        return torch.zeros((c, 0), dtype=torch.float32)
    return torch.frombuffer(bytearray(buf), dtype=torch.float32).view(c, n)


def audio_features(samples, rate=16000, kind="log-mel", n_mels=None,
                   n_fft=None, hop_length=None):
    """Spectrogram features of float32 sound (a tensor or array, [S] or
    [C, S]) at `rate` Hz, computed as DataLoader(audio_features=kind)
    computes them on the DataServer: "mel" (torchaudio's MelSpectrogram:
    power, periodic Hann, centred reflect-padded frames, HTK scale,
    defaults n_fft 400, hop 200, 128 mels), "log-mel" (its log10, floored
    at 1e-10) or "whisper" (Whisper's log_mel_spectrogram: n_fft 400, hop
    160, 80 Slaney mels, normalised).  float32 [n_mels, frames] (or [C,
    n_mels, frames]).  docs/python.md "Sound"."""
    import numpy as np
    import torch
    from ._options import AUDIO_FEATURES, audio_feature_opts
    if kind not in AUDIO_FEATURES:
        raise ValueError(f"kind={kind!r}: one of {list(AUDIO_FEATURES)}")
    x = samples.detach().cpu().numpy() if isinstance(samples, torch.Tensor) \
        else np.asarray(samples)
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim not in (1, 2):
        raise ValueError(f"samples of shape {x.shape}: [S] or [C, S]")
    o = audio_feature_opts(True, kind, n_mels, n_fft, hop_length,
                           x.shape[-1])
    rows = []
    for ch in (x if x.ndim == 2 else x[None]):
        buf, frames = _C.audio_features(
            np.ascontiguousarray(ch), int(rate), o["audio_feature"],
            o["audio_n_fft"], o["audio_hop"], o["audio_mels"])
        rows.append(torch.frombuffer(buf, dtype=torch.float32)
                    .view(o["audio_mels"], frames))
    return rows[0] if x.ndim == 1 else torch.stack(rows)


def open(source):  # noqa: A001 - datahelix.open, as io.open
    """The bytes of `source` (a path, a shard member, a table row) as a
    read-only, seekable binary file object: for libraries that want a file
    (PIL, soundfile, torchaudio) without unpacking a shard."""
    s = Source.of(source)
    if s.member is None:
        return io.open(s.path, "rb")
    return io.BufferedReader(_MemberIO(s.path, s.offset, s.size))
