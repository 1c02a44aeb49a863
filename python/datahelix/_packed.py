"""Sampling for VLMs: ``frames="fps:F"`` and ``size=None`` (native size,
bounded by ``max_side`` / ``max_pixels`` and rounded to ``patch``, the
Qwen-VL way), and the packed batches such a loader yields.

A native-size batch arrives as one slot (src/include/datahelix/batch_packed.h):
a table of (offset, T, H, W, valid_frames) per sample, then the samples back
to back with no padding.  Every tensor below is a view of that slot (no
copy); the slot returns to the arena when the last of them is freed.
docs/python.md "Native resolution (VLMs)".
"""
import array
import json
import math
import os
import struct
import warnings

import torch

from . import _C

MAX_SIDE = 16384
MAX_AREA = 1 << 28          # DH_MEDIA_MAX_PIXELS
MAX_PATCH = 1024            # DH_MEDIA_MAX_PATCH
MAX_FRAMES = 4096           # DH_MEDIA_MAX_FRAMES
DEFAULT_MAX_FRAMES = 32     # the cap of an fps plan when none is given
TABLE_ALIGN = 64


def parse_frames(frames):
    """(count, fps): an int N (uniform, fps 0) or "fps:F" (fps F, count 0:
    the cap comes from max_frames)."""
    if isinstance(frames, str):
        if not frames.startswith("fps:"):
            raise ValueError(f"frames={frames!r}: an int, or 'fps:F'")
        try:
            fps = float(frames[4:])
        except ValueError:
            fps = float("nan")
        if not (math.isfinite(fps) and 0 < fps <= 1000):
            raise ValueError(f"frames={frames!r}: 'fps:F' with F in "
                             "(0, 1000]")
        return 0, fps
    if isinstance(frames, bool) or not isinstance(frames, int) or \
            not 1 <= frames <= MAX_FRAMES:
        raise ValueError(f"frames={frames!r}: an int in 1..{MAX_FRAMES}, "
                         "or 'fps:F'")
    return frames, 0.0


def _bound(name, v, hi):
    if v is None:
        return 0
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= hi:
        raise ValueError(f"{name}={v!r}: an int in 0..{hi} (0 or None: no "
                         "bound)")
    return v


def sampling(frames, size, max_side, max_pixels, patch, max_frames):
    """The client options of a sampling: {"frames", "fps", "native",
    "max_side", "max_area", "patch"} (native 0 for a fixed size, whose
    (H, W) the caller parses as before).  max_pixels is per frame, as
    Qwen-VL's; the per-sample cap stays the library's."""
    count, fps = parse_frames(frames)
    if fps > 0:
        cap = DEFAULT_MAX_FRAMES if max_frames is None else max_frames
        count = _bound("max_frames", cap, MAX_FRAMES)
        if count < 1:
            raise ValueError(f"max_frames={max_frames!r}: an fps plan needs "
                             "a frame cap of 1..4096 to be batched")
    elif max_frames is not None:
        raise ValueError("max_frames= caps an fps plan: pass "
                         "frames='fps:F' too, or frames=N alone")
    native = size is None
    bounds = dict(max_side=_bound("max_side", max_side, MAX_SIDE),
                  max_area=_bound("max_pixels", max_pixels, MAX_AREA),
                  patch=_bound("patch", patch, MAX_PATCH))
    if not native and any(bounds.values()):
        raise ValueError("max_side, max_pixels and patch bound a native "
                         "size: pass size=None with them (or drop them for "
                         f"size={size!r})")
    out = dict(frames=count, fps=fps, native=int(native))
    if native:
        out.update(bounds)
    return out


def check_native(layout, microbatches, transform, collate_fn):
    """What a packed batch does not do (yet): say so at construction."""
    if layout != "THWC":
        raise ValueError("size=None (native) batches are THWC: "
                         f"layout={layout!r} is not supported with them")
    if microbatches != 1:
        raise ValueError("size=None (native) batches travel as one part: "
                         "microbatches=1")
    if transform is not None or collate_fn is not None:
        raise ValueError("size=None (native): transform= and collate_fn= "
                         "are not supported yet; use batch['video'] (a list "
                         "of [T, H, W, 3] views)")


def arena_bytes(opts, batch_size, prefetch, elem):
    """A default arena for native batches: each slot is reserved at the
    plan's bound (cap frames x a frame of at most max_pixels, else
    max_side^2, else 1920x1088), for prefetch + 2 batches, at least 64 MiB,
    at most 8 GiB.  arena_mb= overrides it."""
    area = opts["max_area"] or (opts["max_side"] ** 2) or 1920 * 1088
    one = batch_size * opts["frames"] * area * 3 * elem + (1 << 16)
    return int(min(max((prefetch + 2) * one, 64 << 20), 8 << 30))


def plan_keys(opts):
    """What state_dict()["plan"]["sampling"] adds for this module's
    sampling (nothing for a fixed-size, fixed-count loader, so its states
    stay as they were): the frame cap of an fps plan, the native bounds."""
    out = {}
    if opts.get("fps", 0) > 0:
        out["max_frames"] = opts["frames"]
    if opts.get("native"):
        out.update(max_side=opts["max_side"], max_pixels=opts["max_area"],
                   patch=opts["patch"])
    return out


def table_bytes(n):
    return (16 + 24 * n + TABLE_ALIGN - 1) // TABLE_ALIGN * TABLE_ALIGN


def video(buf, n, dtype, patch):
    """The keys of a packed batch from its slot `buf` (a buffer of the
    slot's used bytes: table + samples):

    - "video": list of B views [T_i, H_i, W_i, 3];
    - "packed": one view [sum_i T_i*H_i*W_i, 3] (pixel rows, samples back
      to back: exactly the slot's bytes after the table);
    - "cu_seqlens": int32 [B+1], offsets in patches (patch x patch squares,
      T_i*(H_i/patch)*(W_i/patch) per sample; pixels when patch is 0/1), as
      flash-attn's varlen calls take them;
    - "thw": int64 [B, 3], (T_i, H_i, W_i);
    - "valid_frames": int32 [B].
    """
    elem = 4 if dtype == torch.float32 else 1
    table = _C.packed_table(buf, n, elem)
    flat = torch.frombuffer(buf, dtype=torch.uint8)
    videos, seq, thw, valid = [], [0], [], []
    p = patch if patch and patch > 1 else 1
    for off, t, h, w, v in table:
        nbytes = t * h * w * 3 * elem
        videos.append(flat[off:off + nbytes].view(dtype).view(t, h, w, 3))
        seq.append(seq[-1] + t * (h // p) * (w // p))
        thw.append((t, h, w))
        valid.append(v)
    start = table_bytes(n)
    end = table[-1][0] + videos[-1].numel() * elem
    packed = flat[start:end].view(dtype).view(-1, 3)
    return {
        "video": videos,
        "packed": packed,
        "cu_seqlens": torch.tensor(seq, dtype=torch.int32),
        "thw": torch.tensor(thw, dtype=torch.int64).view(n, 3),
        "valid_frames": torch.tensor(valid, dtype=torch.int32),
    }


def header_used(buf):
    """(magic, n, used) of a packed slot's header, for tests."""
    return struct.unpack_from("<IIQ", buf, 0)


# -- tokens: what Tier 1 balances ----------------------------------------


def _header(manifest):
    """(plan, token model) of a .jsonl table's header line, or None."""
    path = os.fspath(manifest)
    if not path.endswith(".jsonl"):
        return None
    with open(path, encoding="utf-8") as f:
        first = f.readline()
    try:
        h = json.loads(first)["datahelix_header"]
    except (ValueError, KeyError, TypeError):
        return None
    return h.get("plan") or {}, h.get("tokens") or "qwen-vl"


def _spec(samp, size):
    """This loader's sampling in the probe's terms (datahelix probe
    --frames / --max-frames / --size / --max-side, plus the native
    bounds the probe's header does not have yet)."""
    fps = samp["fps"] > 0
    return {"frames": f"fps:{samp['fps']:g}" if fps else str(samp["frames"]),
            "max_frames": samp["frames"] if fps else None,
            "size": "native" if size is None else f"{size[1]}x{size[0]}",
            "max_side": samp.get("max_side", 0),
            "max_area": samp.get("max_area", 0),
            "patch": samp.get("patch", 0)}


def _differs(plan, spec):
    """The first field where the header's plan is not this sampling."""
    for k in ("frames", "size", "max_side", "max_area", "patch",
              "max_frames"):
        want = spec[k]
        if want is None:
            continue
        have = plan.get(k, 0 if k in ("max_area", "patch") else None)
        if have != want:
            return k, have, want
    return None


def _reestimate(manifest, n, spec, model):
    """est_tokens of every row under `spec` (the probe's dh_estimate, the
    decoder's native-size rule): array('I') of n, or None when the table's
    rows are not ids 0..n-1."""
    out = array.array("I", bytes(4 * n))
    seen = 0
    with open(os.fspath(manifest), encoding="utf-8") as f:
        for line in f:
            r = json.loads(line)
            if "id" not in r:
                continue
            i = r["id"]
            if not (isinstance(i, int) and 0 <= i < n):
                return None
            text = (r.get("text") or "").encode()
            t = _C.estimate_tokens(
                r.get("kind", "video"), int(r.get("width", 0)),
                int(r.get("height", 0)), int(r.get("rotation", 0)),
                float(r.get("fps", 0)), float(r.get("duration_s", 0)),
                int(r.get("frames", 0)), len(text), spec["frames"],
                spec["max_frames"] or 0, spec["size"], spec["max_side"],
                spec["max_area"], spec["patch"], model)
            out[i] = min(t, (1 << 32) - 1)
            seen += 1
    return out if seen == n else None


# The loader's name of each field of the probe's plan, and the probe flag
# that sets it (None: the probe has none yet; issue 41: a warning names
# what the user can change).
_ARG = {"frames": "frames", "max_frames": "max_frames", "size": "size",
        "max_side": "max_side", "max_area": "max_pixels", "patch": "patch"}
_FLAG = {"frames": "--frames", "max_frames": "--max-frames",
         "size": "--size", "max_side": "--max-side", "max_area": None,
         "patch": None}


def check_tokens(manifest, n, samp, size):
    """Tier 1 balances the manifest's est_tokens, which the probe made with
    its own sampling (its header's "plan").  When that is not this
    loader's: a UserWarning, once per loader; and for an fps or native
    loader (this module's sampling) the tokens re-estimated here from the
    table's rows, with the probe's own code (None: keep the stored ones)."""
    h = _header(manifest)
    spec = _spec(samp, size)
    if h is None:
        return None
    plan, model = h
    diff = _differs(plan, spec)
    if diff is None:
        return None
    k, have, want = diff
    redo = samp["fps"] > 0 or samp["native"]
    tokens = _reestimate(manifest, n, spec, model) if redo else None
    flag = _FLAG[k]
    fix = (f"`datahelix probe {flag} {want} ...` makes them for it" if flag
           else "the probe has no flag for it yet")
    what = ("tokens re-estimated here for this sampling (the plan "
            f"balances those; {fix})" if tokens is not None else
            f"the plan balances the stored tokens; re-probe to fix: {fix}")
    warnings.warn(
        f"{os.fspath(manifest)}: est_tokens were made with "
        f"{_ARG[k]}={have!r}, this loader samples {_ARG[k]}={want!r}: "
        f"{what}", UserWarning, stacklevel=3)
    return tokens
