"""The media pipeline through `datahelix decode` (include/datahelix/media.h).

What is checked, and against what:
  * index exactness: gen-data --stamp clips carry each frame's index in their
    pixels; every output frame's stamp must equal the index the JSON reports,
    and the reported indices must follow the plan's formula;
  * pixels: the ffmpeg CLI is the reference (same frames, same scale), mean
    absolute difference per channel value below PIX_TOL;
  * every plan kind, geometry, layout, dtype, padding, images, rotation, odd
    sizes, 10-bit and full-range (yuvj) input, the codecs of shared/data;
  * snap modes: reported indices within tolerance, cheap frames, no repeats;
  * corrupt inputs under the ASan+UBSan binary: errors only.

Clips are tiny (gen-data S/M, or made here with the ffmpeg CLI) so the file
stays well under a minute on two shared cores.
"""
import json
import os
import pathlib
import random
import shutil
import subprocess

import numpy as np
import pytest

from conftest import SHARED_DATA, run_dh

# Mean |datahelix - ffmpeg| over all uint8 channel values (of 255).
# Measured against ffmpeg's bilinear scale: 0.0 for stretch, native size,
# rotation, 10-bit and yuvj; up to 1.0 (clips) and 2.1 (a high-frequency
# image) for the crop, where ffmpeg's `scale=-2:224` rounds the long side to
# even and datahelix may round it otherwise.  Legitimate scaler choices
# move it by <= 1.7 (bicubic or area instead of bilinear).  Bugs exceed it:
# a one-pixel crop shift 2.8..10, a limited/full range mix-up 2.7..8.4 (and
# the gain check below), a neighbouring frame 2..30 (and the per-frame
# check in assert_right_frames).
PIX_TOL = 3.0
# Per-channel gain of datahelix against ffmpeg (least squares): a range
# mix-up gives 0.78..0.89 (or its inverse) on natural clips, scaler
# choices 0.99..1.04.
GAIN_LO, GAIN_HI = 0.95, 1.06
# Same frame, same decoder, only the rotation differs.
ROT_TOL = 1.0
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
STAMP_W = 14 * 16   # 2 markers + 12 bits, 16 px each (docs/gen-data.md)

FFMPEG = shutil.which("ffmpeg")


# ---------------------------------------------------------------- helpers

class Decoded:
    """One file's JSON object and its tensor (T,H,W,C) or (T,C,H,W)."""

    def __init__(self, obj, arr):
        self.obj, self.arr = obj, arr

    @property
    def indices(self):
        return list(self.obj["indices"])


_counter = [0]


def decode(tmp_path, paths, *args, binary=None, layout="thwc",
           dtype="uint8", timeout=120):
    """`datahelix decode --json --out FILE ARGS PATHS`; returns [Decoded]
    and the final total object.  The raw output is split per file using
    the JSON shapes, so its length is checked exactly."""
    _counter[0] += 1
    out = pathlib.Path(tmp_path) / f"dec{_counter[0]}.raw"
    if isinstance(paths, (str, pathlib.Path)):
        paths = [paths]
    extra = []
    if layout != "thwc":
        extra += ["--layout", layout]
    if dtype != "uint8":
        extra += ["--dtype", dtype]
    p = run_dh("decode", "--json", "--out", out, *extra, *args, *paths,
               binary=binary, timeout=timeout)
    assert p.returncode == 0, (p.returncode, p.stderr)
    lines = [json.loads(s) for s in p.stdout.splitlines() if s.strip()]
    assert len(lines) == len(paths) + 1, p.stdout
    objs, total = lines[:-1], lines[-1]
    raw = out.read_bytes() if out.exists() else b""
    item = 4 if dtype == "float32" else 1
    res, off = [], 0
    for o in objs:
        t, h, w = o["frames"], o["height"], o["width"]
        n = t * h * w * 3 * item
        buf = np.frombuffer(raw[off:off + n],
                            np.float32 if item == 4 else np.uint8)
        assert buf.size * item == n, "output shorter than the JSON says"
        shape = (t, h, w, 3) if layout == "thwc" else (t, 3, h, w)
        res.append(Decoded(o, buf.reshape(shape)))
        off += n
    assert off == len(raw), f"{len(raw) - off} stray output bytes"
    assert total["files"] == len(paths)
    assert total["frames"] == sum(o["frames"] for o in objs)
    return res, total


def decode1(tmp_path, path, *args, **kw):
    return decode(tmp_path, [path], *args, **kw)[0][0]


def ffmpeg(*args, timeout=120):
    return subprocess.run([FFMPEG, "-v", "error", "-nostdin", "-y", *args],
                          capture_output=True, timeout=timeout, check=True)


def ffmpeg_rgb(path, indices, w, h, vf=None, pre=(), past_end_ok=False):
    """Frames `indices` (ffmpeg's output order n) of `path` as (T,H,W,3)
    uint8, scaled by `vf` (a filter chain ending at w x h), in the order
    given.  past_end_ok: indices past the clip's end are dropped (then the
    result is a dict index -> frame)."""
    uniq = sorted(set(indices))
    sel = "+".join(f"eq(n\\,{i})" for i in uniq)
    # Even at the clip's own size the conversion goes through a scale
    # filter: ffmpeg's default (bicubic) chroma upsampling differs from
    # bilinear by up to 2.6/255 on 10-bit and odd-sized testsrc clips.
    chain = f"select={sel}," + (vf or f"scale={w}:{h}:flags=bilinear")
    p = ffmpeg(*pre, "-i", str(path), "-vf", chain, "-vsync", "0",
               "-f", "rawvideo", "-pix_fmt", "rgb24", "-")
    a = np.frombuffer(p.stdout, np.uint8)
    if past_end_ok:
        return dict(zip(uniq, a.reshape(-1, h, w, 3)))
    assert a.size == len(uniq) * h * w * 3, (a.size, len(uniq), w, h)
    a = a.reshape(len(uniq), h, w, 3)
    pos = {i: k for k, i in enumerate(uniq)}
    return a[[pos[i] for i in indices]]


def mad(a, b):
    return float(np.abs(a.astype(np.int16) - b.astype(np.int16)).mean())


def gains(a, b):
    """Per channel, the slope of a least-squares fit a = g * b + c."""
    a = a.reshape(-1, 3).astype(np.float64)
    b = b.reshape(-1, 3).astype(np.float64)
    out = []
    for c in range(3):
        var = b[:, c].var()
        if var >= 1.0:
            out.append(float(np.cov(b[:, c], a[:, c])[0, 1] / var))
    return out


def assert_pixels(a, b, what):
    """Close to ffmpeg's frames: mean |diff| <= PIX_TOL, and the same
    levels (a limited/full range mix-up scales values by 255/219 or its
    inverse, a gain of 0.78..0.89 measured on natural clips, while the
    choice of scaler moves the gain by at most 0.04)."""
    assert a.shape == b.shape, (what, a.shape, b.shape)
    m = mad(a, b)
    assert m <= PIX_TOL, f"{what}: mean abs diff {m:.3f} > {PIX_TOL}"
    for g in gains(a, b):
        assert GAIN_LO <= g <= GAIN_HI, f"{what}: levels differ, gain {g:.3f}"


def assert_right_frames(d, ref, path, w, h):
    """Each output frame is closer to ffmpeg's frame of the reported index
    than to that frame's neighbours: an off-by-one shows even when the
    overall difference is small."""
    near = [j for i in d.indices for j in (i - 1, i + 1) if j >= 0]
    nb = ffmpeg_rgb(path, near, w, h, f"scale={w}:{h}:flags=bilinear",
                    past_end_ok=True)
    for k, i in enumerate(d.indices):
        own = mad(d.arr[k], ref[k])
        for j in (i - 1, i + 1):
            if j in nb and mad(nb[j], ref[k]) > 1.0:  # frames that differ
                assert own < mad(d.arr[k], nb[j]), \
                    f"{path.name}: output {k} (index {i}) looks like {j}"


def read_stamp(frame):
    """The gen-data --stamp index of one (H,W,3) uint8 frame at the clip's
    own size, or None when the marker blocks are not where they belong."""
    h, w, _ = frame.shape
    x0 = ((w - STAMP_W) // 2) & ~1
    gray = frame.astype(np.float32).mean(axis=2)
    vals = [gray[12:20, x0 + 16 * k + 4:x0 + 16 * k + 12].mean()
            for k in range(14)]
    bits = [v > 128 for v in vals]
    if not (bits[0] and bits[13]):
        return None
    n = 0
    for b in bits[1:13]:
        n = 2 * n + int(b)
    return n


def probe(ffprobe, path):
    p = subprocess.run(
        [ffprobe, "-v", "error", "-select_streams", "v:0", "-count_packets",
         "-show_entries", "stream=width,height,nb_read_packets,pix_fmt",
         "-of", "json", str(path)],
        capture_output=True, text=True, timeout=60, check=True)
    s = json.loads(p.stdout)["streams"][0]
    return int(s["width"]), int(s["height"]), int(s["nb_read_packets"])


def keyframes(ffprobe, path):
    """Presentation indices of the keyframes (by sorted pts)."""
    p = subprocess.run(
        [ffprobe, "-v", "error", "-select_streams", "v:0", "-show_entries",
         "packet=pts,flags", "-of", "csv=p=0", str(path)],
        capture_output=True, text=True, timeout=60, check=True)
    rows = [r.split(",") for r in p.stdout.split()]
    pts = sorted(int(r[0]) for r in rows)
    order = {t: i for i, t in enumerate(pts)}
    return sorted(order[int(r[0])] for r in rows if "K" in r[1])


def uniform(n, count):
    return [((2 * i + 1) * n) // (2 * count) for i in range(count)]


def size_arg(w, h):
    return ["--size", f"{w}x{h}"]


# Plan name -> CLI arguments.
PLANS = {
    "uniform16": ["--plan", "uniform", "--frames", "16"],
    "indices": ["--plan", "indices:0,7,30,49"],
    "fps5": ["--plan", "fps:5"],
    "jitter": ["--plan", "jitter", "--frames", "8", "--seed", "11"],
    "all": ["--plan", "all"],
}


# --------------------------------------------------------------- fixtures

class Clip:
    def __init__(self, path, w, h, n):
        self.path, self.w, self.h, self.n = path, w, h, n

    def __repr__(self):
        return f"Clip({self.path.name} {self.w}x{self.h} n={self.n})"


@pytest.fixture(scope="module")
def stamped(tmp_path_factory, ffprobe):
    """gen-data --stamp: one S (400x224) and one M (600x336) clip."""
    d = tmp_path_factory.mktemp("stamped")
    run_dh("gen-data", "--out", d, "--profiles", "S,M", "--count", 2,
           "--seed", 0, "--stamp", check=True, timeout=300)
    clips = {}
    for f in sorted(d.glob("*.mp4")):
        w, h, n = probe(ffprobe, f)
        assert n > 49, f"{f}: too short for the index plan"
        clips[f.stem.split("_")[1]] = Clip(f, w, h, n)
    return clips


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """Clips made here with the ffmpeg CLI, on demand, once per module."""
    d = tmp_path_factory.mktemp("made")
    cache = {}

    def make(name, *args, src="testsrc2=size=160x96:rate=25", secs="1"):
        if name not in cache:
            out = d / name
            ffmpeg("-f", "lavfi", "-i", src, "-t", secs, *args, str(out))
            cache[name] = out
        return cache[name]
    return make


@pytest.fixture(scope="module")
def images():
    d = SHARED_DATA / "images"
    if not d.is_dir():
        pytest.skip(f"{d} not present")
    return d


# ---------------------------------------------------- the stamp itself

def test_stamp_reads_back_through_ffmpeg(stamped):
    """The oracle: every frame of a stamped clip, decoded by ffmpeg, reads
    back as its own index (else nothing below means anything)."""
    for c in stamped.values():
        p = ffmpeg("-i", str(c.path), "-f", "rawvideo", "-pix_fmt", "rgb24",
                   "-")
        a = np.frombuffer(p.stdout, np.uint8).reshape(-1, c.h, c.w, 3)
        assert len(a) == c.n
        assert [read_stamp(f) for f in a] == list(range(c.n)), c


# ---------------------------------------------------- index exactness

@pytest.mark.parametrize("plan", list(PLANS))
@pytest.mark.parametrize("prof", ["S", "M"])
def test_index_exactness(tmp_path, stamped, plan, prof):
    c = stamped[prof]
    d = decode1(tmp_path, c.path, *PLANS[plan], "--geometry", "stretch",
                *size_arg(c.w, c.h))
    idx = d.indices
    assert d.obj["width"] == c.w and d.obj["height"] == c.h
    assert d.obj["frames"] == len(idx) == d.arr.shape[0]
    assert d.obj["valid_frames"] == len(idx)
    stamps = [read_stamp(f) for f in d.arr]
    assert stamps == idx, f"{plan}: frames returned are not those reported"
    if plan == "uniform16":
        assert idx == uniform(c.n, 16)
    elif plan == "indices":
        assert idx == [0, 7, 30, 49]
    elif plan == "fps5":
        assert idx == list(range(0, c.n, 5))  # 25 fps source, every 5th
    elif plan == "all":
        assert idx == list(range(c.n))
    elif plan == "jitter":
        assert len(idx) == 8 and 0 <= idx[0] and idx[-1] < c.n
        steps = np.diff(idx)
        assert (steps >= 1).all(), idx
        assert steps.max() - steps.min() <= 1, f"not evenly strided: {idx}"


def test_jitter_is_seeded(tmp_path, stamped):
    c = stamped["M"]
    runs = {}
    for seed in (1, 2, 3, 4, 1):
        d = decode1(tmp_path, c.path, "--plan", "jitter", "--frames", "8",
                    "--seed", str(seed), *size_arg(32, 32))
        if seed in runs:
            assert d.indices == runs[seed], "same seed, different frames"
        runs[seed] = d.indices
    assert len({tuple(v) for v in runs.values()}) > 1, \
        f"jitter ignores the seed: {runs}"


def test_exact_is_default_and_reports_no_shift(tmp_path, stamped):
    c = stamped["M"]
    a = decode1(tmp_path, c.path, "--geometry", "stretch",
                *size_arg(c.w, c.h))
    b = decode1(tmp_path, c.path, "--snap", "exact", "--geometry", "stretch",
                *size_arg(c.w, c.h))
    assert a.indices == b.indices == uniform(c.n, 16)
    assert a.obj.get("mean_abs_shift", 0) == 0
    assert np.array_equal(a.arr, b.arr)
    assert [read_stamp(f) for f in a.arr] == a.indices


def test_index_out_of_range_is_an_error(tmp_path, stamped):
    c = stamped["S"]
    p = run_dh("decode", "--json", "--plan", f"indices:0,{c.n}", c.path)
    assert p.returncode == 1, p.stderr
    lines = p.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("datahelix: decode: ")
    assert str(c.path) in lines[0] or c.path.name in lines[0]


def test_two_files_in_one_run(tmp_path, stamped):
    s, m = stamped["S"], stamped["M"]
    res, total = decode(tmp_path, [s.path, m.path], "--geometry", "stretch",
                        *size_arg(400, 224))
    for d, c in zip(res, (s, m)):
        assert d.obj["path"] == str(c.path)
        assert d.indices == uniform(c.n, 16)
    assert [read_stamp(f) for f in res[0].arr] == res[0].indices
    assert total["frames"] == 32 and total["seconds"] > 0
    assert total["frames_per_s"] > 0


# ---------------------------------------------------- pixels vs ffmpeg

def real_clip(shared_videos, name):
    p = shared_videos / name
    if not p.exists():
        pytest.skip(f"{p} missing")
    return p


def test_pixels_stretch_match_ffmpeg(tmp_path, stamped, shared_videos):
    for path in (stamped["S"].path, stamped["M"].path,
                 real_clip(shared_videos, "mmaction2__part_0.mp4")):
        d = decode1(tmp_path, path, "--geometry", "stretch",
                    *size_arg(224, 224))
        ref = ffmpeg_rgb(path, d.indices, 224, 224,
                         "scale=224:224:flags=bilinear")
        assert_pixels(d.arr, ref, path.name)
        # ... and each frame is closer to its own reference than to the
        # neighbouring frame's (a one-frame shift is caught even where
        # frames are alike).
        for k in range(len(d.arr) - 1):
            assert mad(d.arr[k], ref[k]) < mad(d.arr[k], ref[k + 1]) or \
                d.indices[k] == d.indices[k + 1]


def test_pixels_crop_match_ffmpeg(tmp_path, stamped, shared_videos):
    """Default geometry: shorter side to 224, centre crop 224x224."""
    for path in (stamped["S"].path, stamped["M"].path,
                 real_clip(shared_videos, "mmaction2__part_0.mp4")):
        d = decode1(tmp_path, path)  # all defaults
        assert d.obj["width"] == 224 and d.obj["height"] == 224
        ref = ffmpeg_rgb(path, d.indices, 224, 224,
                         "scale=-2:224:flags=bilinear,crop=224:224")
        assert_pixels(d.arr, ref, path.name)


def test_random_crop_seeded_and_inside(tmp_path, stamped):
    c = stamped["M"]  # 600x336 -> 400x224 before the crop
    args = ["--geometry", "random-crop", *size_arg(224, 224),
            "--plan", "indices:3,40,90"]
    a = decode1(tmp_path, c.path, *args, "--seed", "5")
    b = decode1(tmp_path, c.path, *args, "--seed", "5")
    assert np.array_equal(a.arr, b.arr), "same seed, different crop"
    others = [decode1(tmp_path, c.path, *args, "--seed", str(s)).arr
              for s in (6, 7, 8)]
    assert any(not np.array_equal(a.arr, o) for o in others), \
        "random crop ignores the seed"
    full = ffmpeg_rgb(c.path, [3, 40, 90], 400, 224,
                      "scale=400:224:flags=bilinear")
    best = []
    for k in range(3):
        errs = [mad(a.arr[k], full[k][:, x:x + 224]) for x in range(177)]
        best.append(int(np.argmin(errs)))
        assert min(errs) <= PIX_TOL, f"frame {k}: not a window of the frame"
    assert len(set(best)) == 1, f"crop moves between frames: {best}"


def test_layout_tchw_is_thwc_transposed(tmp_path, stamped):
    c = stamped["S"]
    a = decode1(tmp_path, c.path, *size_arg(96, 64), "--geometry", "stretch")
    b = decode1(tmp_path, c.path, *size_arg(96, 64), "--geometry", "stretch",
                layout="tchw")
    assert b.arr.shape == (16, 3, 64, 96)
    assert np.array_equal(a.arr, b.arr.transpose(0, 2, 3, 1))


@pytest.mark.parametrize("layout", ["thwc", "tchw"])
def test_float32_is_normalised_uint8(tmp_path, stamped, layout):
    c = stamped["S"]
    u = decode1(tmp_path, c.path, *size_arg(64, 48), layout=layout)
    f = decode1(tmp_path, c.path, *size_arg(64, 48), layout=layout,
                dtype="float32")
    assert f.arr.dtype == np.float32 and f.arr.shape == u.arr.shape
    shape = (1, 1, 1, 3) if layout == "thwc" else (1, 3, 1, 1)
    mean = np.array(IMAGENET_MEAN, np.float64).reshape(shape)
    std = np.array(IMAGENET_STD, np.float64).reshape(shape)
    want = (u.arr.astype(np.float64) / 255 - mean) / std
    err = np.abs(f.arr.astype(np.float64) - want).max()
    assert err <= 1e-5, err


# ---------------------------------------------------- short clips

@pytest.mark.parametrize("pad", ["repeat", "zero"])
def test_short_clip_padding(tmp_path, made, pad):
    clip = made("six.mp4", "-frames:v", "6", "-c:v", "libx264", "-g", "3",
                "-pix_fmt", "yuv420p")
    d = decode1(tmp_path, clip, "--frames", "10", "--pad", pad,
                "--geometry", "stretch", *size_arg(160, 96))
    assert d.obj["frames"] == 10 and d.obj["valid_frames"] == 6
    ref = ffmpeg_rgb(clip, list(range(6)), 160, 96)
    assert_pixels(d.arr[:6], ref, clip.name)
    if pad == "repeat":
        assert d.indices == [0, 1, 2, 3, 4, 5, 5, 5, 5, 5]
        for k in range(6, 10):
            assert np.array_equal(d.arr[k], d.arr[5])
    else:
        assert d.indices == [0, 1, 2, 3, 4, 5, -1, -1, -1, -1]
        assert not d.arr[6:].any()


# ---------------------------------------------------- images

def image_files(images):
    files = sorted(p for p in images.iterdir()
                   if p.suffix.lower() in (".jpg", ".jpeg", ".png", ".webp"))
    assert files
    return files


def test_images_decode_and_match(tmp_path, images):
    files = image_files(images)
    res, _ = decode(tmp_path, files)
    for f, d in zip(files, res):
        assert d.obj["valid_frames"] == 1, f
        assert set(d.indices) <= {0, -1}, (f, d.indices)
        ref = ffmpeg_rgb(f, [0], 224, 224,
                         "scale=-2:224:flags=bilinear,crop=224:224")
        assert_pixels(d.arr[:1], ref, f.name)


def test_image_is_one_frame(tmp_path, images):
    """Issue 3: images go "through the same API as T = 1": the default
    plan (uniform 16) on an image gives one frame, not 16 padded ones."""
    f = images / "mmaction2__img_00001.jpg"
    d = decode1(tmp_path, f)
    assert (d.obj["frames"], d.obj["valid_frames"]) == (1, 1), d.obj


def test_image_at_native_size(tmp_path, images, ffprobe):
    f = images / "moviepy__afterimage.png"
    w, h, _ = probe(ffprobe, f)
    d = decode1(tmp_path, f, "--geometry", "stretch", *size_arg(w, h))
    ref = ffmpeg_rgb(f, [0], w, h)
    assert_pixels(d.arr[:1], ref, f.name)


def test_webp_image(tmp_path, images):
    src = images / "mmaction2__img_00001.jpg"
    out = pathlib.Path(tmp_path) / "img.webp"
    try:
        ffmpeg("-i", str(src), "-c:v", "libwebp", str(out))
    except subprocess.CalledProcessError:
        pytest.skip("this ffmpeg has no libwebp encoder")
    d = decode1(tmp_path, out, "--geometry", "stretch", *size_arg(64, 64))
    assert d.obj["valid_frames"] == 1
    ref = ffmpeg_rgb(out, [0], 64, 64, "scale=64:64:flags=bilinear")
    assert_pixels(d.arr[:1], ref, out.name)


# ---------------------------------------------------- rotation

def test_rotation_of_phone_clips(tmp_path, shared_videos):
    """The decord clips are four different recordings (checked: their raw
    frames differ by ~45/255), so each is compared with ffmpeg's own
    autorotated output, not with video_0."""
    for deg, (w, h) in ((0, (568, 320)), (90, (320, 568)),
                        (180, (568, 320)), (270, (320, 568))):
        f = real_clip(shared_videos, f"decord__video_{deg}.mov")
        d = decode1(tmp_path, f, "--plan", "all", "--geometry", "stretch",
                    *size_arg(w, h))
        assert d.arr.shape == (3, h, w, 3)
        ref = ffmpeg_rgb(f, d.indices, w, h)  # ffmpeg autorotates
        assert_pixels(d.arr, ref, deg)
        if deg in (90, 270):
            # stretched into the coded 568x320 would not look like this
            raw = ffmpeg_rgb(f, d.indices, h, w, pre=["-noautorotate"])
            for k in (1, 3):
                wrong = np.rot90(raw, k, axes=(1, 2))
                if mad(wrong, ref) > 10:
                    assert mad(d.arr, wrong) > 10, f"{deg}: wrong direction"
            # default crop: portrait after rotation, so width is shorter
            d = decode1(tmp_path, f, "--plan", "all")
            ref = ffmpeg_rgb(f, d.indices, 224, 224,
                             "scale=224:-2:flags=bilinear,crop=224:224")
            assert_pixels(d.arr, ref, f"{deg} crop")


@pytest.mark.parametrize("rot", [90, 180, 270])
def test_rotation_metadata_on_a_known_clip(tmp_path, stamped, rot):
    """The stamped S clip remuxed with a rotation tag: the output must be
    the untagged clip's output turned the way ffmpeg turns it."""
    c = stamped["S"]
    tagged = pathlib.Path(tmp_path) / f"rot{rot}.mp4"
    ffmpeg("-i", str(c.path), "-c", "copy", "-metadata:s:v:0",
           f"rotate={rot}", str(tagged))
    w, h = (c.h, c.w) if rot in (90, 270) else (c.w, c.h)
    plan = ["--plan", "indices:0,20,41", "--geometry", "stretch"]
    d = decode1(tmp_path, tagged, *plan, *size_arg(w, h))
    base = decode1(tmp_path, c.path, *plan, *size_arg(c.w, c.h))
    ref = ffmpeg_rgb(tagged, [0, 20, 41], w, h)
    assert_pixels(d.arr, ref, "test_rotation_metadata_on_a_known_clip")
    turned = {k: np.rot90(base.arr, k, axes=(1, 2)) for k in (1, 2, 3)}
    k = [k for k, t in turned.items()
         if t.shape == ref.shape and mad(t, ref) <= PIX_TOL]
    assert len(k) == 1
    assert mad(d.arr, np.rot90(base.arr, k[0], axes=(1, 2))) <= ROT_TOL


# ---------------------------------------------------- pixel formats, sizes

# testsrc, not testsrc2: testsrc2 rounds its size down to even.
ODD = "testsrc=size=225x129:rate=25"


@pytest.mark.parametrize("name,args", [
    ("odd444.mp4", ["-pix_fmt", "yuv444p", "-c:v", "libx264"]),
    ("oddj420.avi", ["-pix_fmt", "yuvj420p", "-c:v", "mjpeg"]),
    ("odd420.mkv", ["-pix_fmt", "yuv420p", "-c:v", "ffv1"]),
])
def test_odd_sizes(tmp_path, made, name, args):
    clip = made(name, *args, src=ODD, secs="0.4")
    d = decode1(tmp_path, clip, "--plan", "all", "--geometry", "stretch",
                *size_arg(225, 129))
    assert d.arr.shape == (10, 129, 225, 3)
    ref = ffmpeg_rgb(clip, d.indices, 225, 129)
    assert_pixels(d.arr, ref, "test_odd_sizes")
    d = decode1(tmp_path, clip, "--plan", "all", "--geometry", "stretch",
                *size_arg(97, 33))
    ref = ffmpeg_rgb(clip, d.indices, 97, 33, "scale=97:33:flags=bilinear")
    assert_pixels(d.arr, ref, "test_odd_sizes")
    d = decode1(tmp_path, clip, "--plan", "all", *size_arg(224, 224))
    assert d.arr.shape == (10, 224, 224, 3)


@pytest.mark.parametrize("name,args", [
    ("h264_10.mp4", ["-pix_fmt", "yuv420p10le", "-c:v", "libx264"]),
    ("hevc_10.mp4", ["-pix_fmt", "yuv420p10le", "-c:v", "libx265",
                     "-x265-params", "log-level=none"]),
])
def test_ten_bit(tmp_path, made, name, args):
    clip = made(name, *args, secs="0.4")
    d = decode1(tmp_path, clip, "--plan", "all", "--geometry", "stretch",
                *size_arg(160, 96))
    assert d.obj["frames"] == 10
    ref = ffmpeg_rgb(clip, d.indices, 160, 96)
    assert_pixels(d.arr, ref, "test_ten_bit")


def test_yuvj_full_range(tmp_path, made, shared_videos):
    """yuvj is full range: treating it as limited range shifts every value
    (caught by comparing with ffmpeg, which gets it right)."""
    mine = made("j.avi", "-pix_fmt", "yuvj420p", "-c:v", "mjpeg",
                "-q:v", "2", secs="0.4")
    for clip in (mine, shared_videos / "derived" / "derived_nasa_mjpeg.avi"):
        d = decode1(tmp_path, clip, "--frames", "4", "--geometry", "stretch",
                    *size_arg(160, 96))
        ref = ffmpeg_rgb(clip, d.indices, 160, 96,
                         "scale=160:96:flags=bilinear")
        assert_pixels(d.arr, ref, clip.name)


@pytest.mark.parametrize("name", [
    "derived/derived_chaplin_vp9.webm", "moviepy__transparent.webm",
    "torchcodec__av1_video.mkv", "torchcodec__h265_video.mp4",
    "torchcodec__h265_10bits.mp4", "derived/derived_bikes_hevc.mkv",
    "derived/derived_demo_hevc.mp4", "moviepy__big_buck_bunny_432_433.webm",
    "derived/derived_pancake_mpeg4_bframes.avi", "mmaction2__test.avi",
])
def test_codecs_decode_and_match(tmp_path, shared_videos, name):
    f = real_clip(shared_videos, name)
    d = decode1(tmp_path, f, "--frames", "6", "--geometry", "stretch",
                *size_arg(128, 96))
    assert d.obj["frames"] == 6 and d.obj["valid_frames"] == 6
    assert d.indices == sorted(d.indices)
    ref = ffmpeg_rgb(f, d.indices, 128, 96, "scale=128:96:flags=bilinear")
    assert_right_frames(d, ref, f, 128, 96)
    assert_pixels(d.arr, ref, name)


# ---------------------------------------------------- snap modes

@pytest.fixture(scope="module")
def short_gop(stamped, tmp_path_factory, ffprobe):
    """The stamped S clip re-encoded with a keyframe every 6 frames (and
    B-frames), so every target has a keyframe within half a stride."""
    out = tmp_path_factory.mktemp("gop") / "gop6.mp4"
    ffmpeg("-i", str(stamped["S"].path), "-c:v", "libx264", "-preset",
           "ultrafast", "-g", "6", "-keyint_min", "6", "-sc_threshold", "0",
           "-bf", "2", "-crf", "18", str(out))
    w, h, n = probe(ffprobe, out)
    return Clip(out, w, h, n), keyframes(ffprobe, out)


@pytest.mark.parametrize("snap", ["key", "ref"])
def test_snap(tmp_path, short_gop, snap):
    c, keys = short_gop
    count = 8
    exact = uniform(c.n, count)
    tol = c.n / count / 2
    d = decode1(tmp_path, c.path, "--frames", str(count), "--snap", snap,
                "--geometry", "stretch", *size_arg(c.w, c.h))
    idx = d.indices
    assert len(idx) == count == d.obj["valid_frames"]
    assert [read_stamp(f) for f in d.arr] == idx, "reported != returned"
    assert len(set(idx)) == count, f"duplicates: {idx}"
    shifts = [abs(a - b) for a, b in zip(idx, exact)]
    assert max(shifts) <= tol, (idx, exact)
    assert d.obj["mean_abs_shift"] == pytest.approx(np.mean(shifts),
                                                    abs=1e-6)
    # the point of snapping: never more decode work than exact mode
    ex = decode1(tmp_path, c.path, "--frames", str(count), *size_arg(32, 32))
    assert d.obj["decoded_frames"] <= ex.obj["decoded_frames"], \
        (snap, d.obj["decoded_frames"], ex.obj["decoded_frames"])
    if snap == "key":
        assert set(idx) <= set(keys), (idx, keys)
        # every target had a keyframe in reach: only keyframes decoded
        assert d.obj["decoded_frames"] == count, d.obj


def test_snap_key_explicit_tolerance(tmp_path, short_gop):
    """--snap-tol 1: a target moves at most one frame, and only onto a
    keyframe; with keyframes every 6 frames most targets stay put."""
    c, keys = short_gop
    want = uniform(c.n, 8)
    d = decode1(tmp_path, c.path, "--frames", "8", "--snap", "key",
                "--snap-tol", "1", "--geometry", "stretch",
                *size_arg(c.w, c.h))
    assert [read_stamp(f) for f in d.arr] == d.indices
    for got, exact in zip(d.indices, want):
        assert abs(got - exact) <= 1, (d.indices, want)
        assert got == exact or got in keys, (d.indices, want, keys)


def test_snap_dense_targets_keep_indices(tmp_path, stamped):
    """GOP 50 and 16 targets: most targets have no keyframe in reach and
    keep their exact index; still no repeats and the stamps agree."""
    c = stamped["M"]
    d = decode1(tmp_path, c.path, "--frames", "16", "--snap", "key",
                "--geometry", "stretch", *size_arg(c.w, c.h))
    assert [read_stamp(f) for f in d.arr] == d.indices
    assert len(set(d.indices)) == 16
    tol = c.n / 16 / 2
    assert all(abs(a - b) <= tol
               for a, b in zip(d.indices, uniform(c.n, 16)))


# ---------------------------------------------------- errors, corrupt input

SAN_MARKERS = ("AddressSanitizer", "LeakSanitizer", "runtime error:",
               "UndefinedBehaviorSanitizer", "SUMMARY:")


@pytest.fixture(scope="module")
def asan_bin():
    b = os.environ.get("DATAHELIX_ASAN_BIN")
    if not b or not os.access(b, os.X_OK):
        pytest.skip("DATAHELIX_ASAN_BIN not set (make test sets it)")
    return b


def run_asan(binary, path, *args):
    env = dict(os.environ,
               ASAN_OPTIONS="detect_leaks=1:exitcode=86:abort_on_error=0",
               UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:exitcode=87")
    try:
        return run_dh("decode", "--json", *args, path, binary=binary,
                      timeout=60, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{path}: decode hangs (> 60 s)")


def check_error(p, path, allow_ok=False):
    assert not any(m in p.stderr for m in SAN_MARKERS), p.stderr
    assert p.returncode in ((0, 1) if allow_ok else (1,)), \
        (path, p.returncode, p.stderr[-2000:])
    if p.returncode == 1:
        lines = p.stderr.splitlines()
        assert len(lines) == 1, p.stderr
        assert lines[0].startswith("datahelix: decode: "), lines[0]
        assert pathlib.Path(path).name in lines[0], lines[0]


GOOD = {  # name -> ffmpeg output options; 160x96, 1 s, 25 frames
    "good.mp4": ["-c:v", "libx264", "-g", "10", "-bf", "2", "-pix_fmt",
                 "yuv420p", "-movflags", "+faststart"],  # moov first
    "good.webm": ["-c:v", "libvpx", "-g", "10", "-b:v", "200k"],
    "good.avi": ["-c:v", "mpeg4", "-g", "10", "-bf", "2", "-q:v", "5"],
}


@pytest.mark.parametrize("name", list(GOOD))
def test_corrupt_truncated(tmp_path, asan_bin, made, name):
    data = made(name, *GOOD[name]).read_bytes()
    cuts = sorted({1, 8, 40, 200, 1000} |
                  {int(len(data) * f) for f in (0.2, 0.4, 0.6, 0.8, 0.9)})
    for cut in cuts:
        f = pathlib.Path(tmp_path) / f"trunc_{cut}_{name}"
        f.write_bytes(data[:cut])
        # every frame is planned, so a missing one cannot go unnoticed
        check_error(run_asan(asan_bin, f, "--plan", "all",
                             *size_arg(32, 32)), f)


@pytest.mark.parametrize("name", list(GOOD))
def test_corrupt_bit_flips(tmp_path, asan_bin, made, name):
    data = made(name, *GOOD[name]).read_bytes()
    rng = random.Random(1234)
    for k in range(10):
        b = bytearray(data)
        for _ in range(1 + k * 3):
            pos = rng.randrange(len(b))
            b[pos] ^= 1 << rng.randrange(8)
        f = pathlib.Path(tmp_path) / f"flip_{k}_{name}"
        f.write_bytes(bytes(b))
        # concealed errors may decode: exit 0 is fine, a report is not
        check_error(run_asan(asan_bin, f, *size_arg(32, 32)), f,
                    allow_ok=True)


def test_corrupt_not_media(tmp_path, asan_bin):
    d = pathlib.Path(tmp_path)
    (d / "empty.mp4").write_bytes(b"")
    (d / "text.mp4").write_text("this is not a video\n" * 50)
    (d / "x.mp4").mkdir()
    (d / "zeros.mp4").write_bytes(bytes(4096))
    for name in ("empty.mp4", "text.mp4", "x.mp4", "zeros.mp4",
                 "missing.mp4"):
        check_error(run_asan(asan_bin, d / name), d / name)


def test_shared_corrupted_clip(tmp_path, asan_bin, shared_videos):
    """49 of its 50 frames decode: either an error naming the file or
    output, never a sanitizer report."""
    f = real_clip(shared_videos, "decord__corrupted.mp4")
    check_error(run_asan(asan_bin, f, "--plan", "all", *size_arg(32, 32)),
                f, allow_ok=True)


def test_error_exit_release_binary(tmp_path):
    f = pathlib.Path(tmp_path) / "nope.mp4"
    f.write_text("nope")
    p = run_dh("decode", "--json", f)
    check_error(p, f)


@pytest.mark.parametrize("args", [
    ["--size", "0x5"], ["--size", "abc"], ["--geometry", "fish"],
    ["--layout", "hwc"], ["--frames", "-1"], ["--bogus"],
    ["--plan", "nonsense"], ["--snap", "maybe"],
])
def test_bad_arguments_exit_2(tmp_path, stamped, args):
    p = run_dh("decode", *args, stamped["S"].path)
    assert p.returncode == 2, (args, p.returncode, p.stderr)
    lines = p.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("datahelix: decode: ")


def test_failed_file_is_skipped_and_run_goes_on(tmp_path, stamped):
    """docs/media.md: a failing file is one stderr line, the next file is
    still decoded, the exit status is 1."""
    bad = pathlib.Path(tmp_path) / "bad.mp4"
    bad.write_text("not a video")
    s = stamped["S"]
    out = pathlib.Path(tmp_path) / "out.raw"
    p = run_dh("decode", "--json", "--out", out, *size_arg(32, 32),
               s.path, bad, s.path)
    assert p.returncode == 1, p.stderr
    check_error(p, bad)
    lines = [json.loads(x) for x in p.stdout.splitlines()]
    assert [o["path"] for o in lines[:-1]] == [str(s.path)] * 2
    assert lines[-1]["files"] == 2 and lines[-1]["failed"] == 1
    assert out.stat().st_size == 2 * 16 * 32 * 32 * 3


# ---- stream structures that defeat naive frame identification ----------
# (open GOPs, edit lists, a stream cut mid-GOP, H.264 in Matroska): every
# output frame must be ffmpeg's frame of the reported index.

@pytest.fixture(scope="module")
def tricky(tmp_path_factory):
    d = tmp_path_factory.mktemp("tricky")
    src = ["-f", "lavfi", "-i", "testsrc=size=192x108:rate=25:duration=12",
           "-pix_fmt", "yuv420p", "-c:v", "libx264"]
    ffmpeg(*src, "-g", "24", "-bf", "3", "-x264-params",
           "open-gop=1:b-adapt=0:scenecut=0", str(d / "open_gop.mp4"))
    ffmpeg(*src, "-g", "50", "-bf", "3", str(d / "closed.mp4"))
    ffmpeg("-ss", "3.3", "-i", str(d / "closed.mp4"), "-c", "copy", "-t", "4",
           str(d / "edit_list.mp4"))
    ffmpeg("-i", str(d / "closed.mp4"), "-ss", "3.3", "-c", "copy",
           "-copyinkf", "-t", "4", str(d / "mid_gop_start.mp4"))
    ffmpeg("-i", str(d / "open_gop.mp4"), "-c", "copy",
           str(d / "open_gop.mkv"))
    return d


def ffmpeg_all(path, w, h):
    p = ffmpeg("-i", str(path), "-vf", f"scale={w}:{h}:flags=bilinear",
               "-vsync", "passthrough", "-f", "rawvideo", "-pix_fmt",
               "rgb24", "-")
    return np.frombuffer(p.stdout, np.uint8).reshape(-1, h, w, 3)


@pytest.mark.parametrize("name,plan", [
    ("open_gop.mp4", "indices:0,21,22,23,24,45,46,47,48,141,142,143,200"),
    ("open_gop.mkv", "indices:0,21,22,23,24,45,46,47,48,141,142,143,200"),
    ("edit_list.mp4", "indices:0,1,2,10,40,60,99"),
    ("mid_gop_start.mp4", "indices:0,1,10,30,60,84"),
    ("open_gop.mp4", "uniform"),
    ("edit_list.mp4", "all"),
])
@pytest.mark.parametrize("snap", ["exact", "key", "ref"])
def test_tricky_streams_give_the_reported_frames(tmp_path, tricky, name,
                                                 plan, snap):
    if snap != "exact" and plan.startswith("indices"):
        plan = "uniform"
    path = tricky / name
    ref = ffmpeg_all(path, 96, 54)
    d = decode1(tmp_path, path, "--plan", plan, "--snap", snap,
                "--geometry", "stretch", "--size", "96x54")
    if plan == "all":
        assert d.obj["frames"] == len(ref)
    for k, i in enumerate(d.indices):
        assert 0 <= i < len(ref), (name, k, i, len(ref))
        diffs = [mad(d.arr[k], ref[j]) for j in range(len(ref))]
        assert diffs[i] == min(diffs) and diffs[i] < 1.0, \
            (name, snap, k, i, int(np.argmin(diffs)))


def test_matroska_h264_seeks_rather_than_decoding_from_the_start(tmp_path,
                                                                 tricky):
    d = decode1(tmp_path, tricky / "open_gop.mkv", "--plan", "indices:280",
                "--size", "32x32")
    assert d.obj["seeks"] >= 1 and d.obj["decoded_frames"] < 60, d.obj


def test_snap_ref_repeated_decodes_agree(tmp_path, stamped):
    path = stamped["M"].path
    p = run_dh("decode", "--json", "--snap", "ref", "--repeat", "3",
               "--frames", "16", path, check=True)
    once = run_dh("decode", "--json", "--snap", "ref", "--frames", "16", path,
                  check=True)
    a, b = json.loads(p.stdout.splitlines()[0]), json.loads(
        once.stdout.splitlines()[0])
    assert a["indices"] == b["indices"]
    assert a["mean_abs_shift"] == b["mean_abs_shift"]


def test_decode_reports_the_open_part_of_each_file(tmp_path, stamped):
    """open_ms: what a file costs before its first frame (container, frame
    table, decoder), the part reuse across files could save; inside
    decode_ms, which also selects and decodes the frames."""
    paths = [stamped[k].path for k in ("S", "M")]
    p = run_dh("decode", "--json", "--repeat", "3", "--frames", "16",
               *paths, check=True)
    objs = [json.loads(x) for x in p.stdout.splitlines()[:-1]]
    assert len(objs) == 2
    for o in objs:
        assert 0 < o["open_ms"] < o["decode_ms"], o
    text = run_dh("decode", "--frames", "4", paths[0], check=True)
    assert "(open " in text.stderr, text.stderr


def _decodable(videos):
    """shared/data's clips that decode (the corrupted one is tested on its
    own), derived/ included, in a fixed order."""
    bad = {"decord__corrupted.mp4"}
    return sorted(p for p in videos.rglob("*")
                  if p.is_file() and p.suffix != ".tsv" and p.name not in bad)


def test_decoder_reuse_gives_a_fresh_decoders_bytes(tmp_path, shared_videos,
                                                    gen_set):
    """Issue 21 item 2: a file takes over the previous file's decoder when
    their codec parameters match.  Every clip of shared/data (H.264, HEVC
    8/10-bit, VP9, AV1, MPEG-4 with B-frames, MJPEG; MP4, MKV, WebM, AVI,
    MOV), each twice in a row, then gen-data's clips (same-profile files
    share their parameters): the tensors must be byte-identical to those of
    a decoder opened per file, and most files must have taken one over."""
    clips = _decodable(shared_videos)
    assert len(clips) >= 20, clips
    paths = [p for c in clips for p in (c, c)]
    paths += sorted(gen_set.glob("*_S.mp4")) + sorted(gen_set.glob("*.mp4"))
    args = ("--frames", "6", "--size", "48x40")
    reused, on = decode(tmp_path, paths, *args)
    fresh, off = decode(tmp_path, paths, *args, "--no-decoder-reuse")
    for a, b in zip(reused, fresh):
        assert a.obj["indices"] == b.obj["indices"], a.obj["path"]
        assert np.array_equal(a.arr, b.arr), a.obj["path"]
    assert off["decoder_reuses"] == 0 and off["decoder_opens"] == len(paths)
    # The second of each pair at least; a file only ever opens or reuses.
    assert on["decoder_reuses"] >= len(clips), on
    assert on["decoder_opens"] + on["decoder_reuses"] == len(paths), on
    assert sum(o.obj["decoder_reused"] for o in reused) == \
        on["decoder_reuses"]
    # Different parameters never share: S then M then L each open one.
    mixed = sorted(gen_set.glob("*.mp4"))[:3]
    _, t = decode(tmp_path, mixed, *args)
    assert (t["decoder_opens"], t["decoder_reuses"]) == (3, 0), t


def _damaged(src, dst, how):
    data = bytearray(src.read_bytes())
    if how == "cut":  # the index intact, the samples cut short
        data = data[:len(data) * 2 // 3]
    else:  # bytes flipped in the samples: the decoder conceals
        r = random.Random(1)
        for _ in range(40):
            data[r.randrange(len(data) // 3, len(data) - 100)] ^= 0xFF
    dst.write_bytes(bytes(data))
    return dst


@pytest.mark.parametrize("how", ["cut", "flipped"])
def test_a_bad_files_decoder_is_not_carried_over(tmp_path, gen_set, how):
    """A decoder that failed (a cut file) or concealed damage (flipped
    bytes: no error, pictures flagged) goes with its file: the next file of
    the same parameters opens its own, and decodes as a fresh one would."""
    s = sorted(gen_set.glob("*_S.mp4"))
    assert len(s) >= 2, s
    bad = _damaged(s[0], tmp_path / f"{how}.mp4", how)
    args = ["--json", "--plan", "all", "--size", "48x40"]
    p = run_dh("decode", *args, "--out", tmp_path / "a.raw", s[0], bad, s[1])
    assert p.returncode == (1 if how == "cut" else 0), p.stderr
    total = json.loads(p.stdout.splitlines()[-1])
    # s[0] opens, the bad file takes it over, s[1] must open its own.
    assert (total["decoder_opens"], total["decoder_reuses"]) == (2, 1), total
    after = json.loads(p.stdout.splitlines()[-2])
    assert after["path"] == str(s[1]) and after["decoder_reused"] == 0
    alone = decode1(tmp_path, s[1], "--plan", "all", "--size", "48x40")
    n = alone.arr.nbytes
    assert (tmp_path / "a.raw").read_bytes()[-n:] == alone.arr.tobytes()


def test_snap_ref_out_of_order_slots_are_clean(tmp_path, stamped):
    """Targets no reference frame reaches are decoded afterwards into
    earlier slots: their bytes must equal a plain decode of those frames."""
    path = stamped["S"].path
    d = decode1(tmp_path, path, "--snap", "ref", "--snap-tol", "0.1",
                "--frames", "12", "--size", "223x224")
    e = decode1(tmp_path, path, "--plan",
                "indices:" + ",".join(map(str, d.indices)), "--size",
                "223x224")
    assert np.array_equal(d.arr, e.arr)
