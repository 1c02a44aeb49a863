"""Container x codec x property matrix for `datahelix decode` and `probe`.

Every case is a tiny clip made here with the ffmpeg CLI (Debian 12's 5.1),
once per session and in parallel.  For each one:
  * the reference is ffmpeg's FULL decode of the first video stream in
    presentation order (`-map 0:v:0 -fps_mode passthrough`, autorotated, at
    the clip's own size): n frames;
  * `datahelix decode --plan indices:0,A,B,n-1 --geometry stretch` at that
    same size (so nothing scales) must give those frames: mean absolute
    difference <= MAD_TOL per frame;
  * `datahelix probe` must report `frames` == n.
Each generated clip is also checked for the property it stands for
(B-frames present, PTS wrap inside the clip, moof boxes, no edit list...),
so a case cannot pass because ffmpeg quietly made something plainer.

Cases that need an encoder or muxer Debian's ffmpeg lacks are left out of
CASES below (with a comment), never skipped at run time.
"""
import concurrent.futures
import json
import os
import pathlib
import shutil
import subprocess
import time
from dataclasses import dataclass

import numpy as np
import pytest

from conftest import run_dh

FFMPEG = shutil.which("ffmpeg")
FFPROBE = shutil.which("ffprobe")

# Same decoder (libavcodec) on both sides and no scaling: identical frames
# give 0.0.  testsrc2 alone is no good here: at 64x48 its neighbouring
# frames differ by ~0.16 (and libtheora drops the unchanged ones), so the
# top half of every clip carries the frame number as 8 black/white stripes
# (bit k of N in stripe k, gen-data --stamp's idea): any two frames then
# differ by >= ~10, checked per case by DISTINCT.
MAD_TOL = 1.0
DISTINCT = 5.0
STRIPES = ("format=yuv444p,geq="
           "lum='if(lt(Y,H/2),16+219*mod(floor(N/pow(2,floor(X*8/W))),2),"
           "lum(X,Y))':"
           "cb='if(lt(Y,H/2),128,cb(X,Y))':cr='if(lt(Y,H/2),128,cr(X,Y))'")
TIMEOUT = 60          # any single subprocess
# 2^33 ticks of 90 kHz: where a MPEG-TS/PS timestamp wraps.
PTS_WRAP_S = 2 ** 33 / 90000          # 95443.7176...
# ffmpeg's mpegts muxer starts the first PTS 1.4 s after the offset (its
# default muxdelay/preload), so an offset of PTS_WRAP_S - 1 would wrap
# before the first frame; PTS_WRAP_S - 2.7 puts the wrap 1.3 s into a 3 s
# clip (frame ~33 of 75), checked below by the "ptswrap" property.
WRAP_OFFSET = f"{PTS_WRAP_S - 2.7:.4f}"

X264 = ["-c:v", "libx264", "-preset", "veryfast", "-pix_fmt", "yuv420p"]
X264_B = X264 + ["-bf", "2", "-g", "12"]
X265 = ["-c:v", "libx265", "-preset", "ultrafast",
        "-x265-params", "log-level=none:bframes=2:keyint=12"]
MPEG2_B = ["-c:v", "mpeg2video", "-bf", "2", "-g", "12", "-q:v", "4"]
AUDIO_AAC = ["-c:a", "aac", "-b:a", "64k"]


@dataclass
class Case:
    id: str
    ext: str
    args: list                      # ffmpeg output options
    size: tuple = (64, 48)          # coded W, H
    rate: str = "25"
    secs: str = "1"
    src: str = "testsrc2"           # testsrc for odd sizes (testsrc2 evens)
    audio: str = ""                 # "", "after" (v then a), "first" (a, v)
    remux: list = None              # second pass, -c copy with these options
    concat: list = None             # a second part (negated, these extra
                                    # options) appended byte for byte
    props: tuple = ()               # properties the file must have
    shown: tuple = None             # size after rotation (default: size)

    @property
    def out_size(self):
        return self.shown or self.size


def C(*a, **k):
    return Case(*a, **k)


CASES = [
    # --- MPEG-TS
    C("ts-h264-bframes", "ts", X264_B, props=("bframes",)),
    C("ts-mpeg2-bframes", "ts", MPEG2_B, props=("bframes",)),
    C("ts-h264-offset10", "ts", X264_B + ["-output_ts_offset", "10"],
      props=("offset10", "bframes")),
    C("ts-h264-ptswrap", "ts", X264_B + ["-output_ts_offset", WRAP_OFFSET],
      secs="3", props=("ptswrap", "bframes")),
    C("ts-h264-aac", "ts", X264_B + AUDIO_AAC, audio="after",
      props=("audio", "bframes")),
    C("ts-hevc-bframes", "ts", X265, props=("bframes",)),
    # two recordings joined end to end (cat a.ts b.ts): the second
    # timeline starts before the first one ends, a discontinuity
    C("ts-h264-concat-discont", "ts", X264_B,
      concat=["-output_ts_offset", "0.3"], props=("discont", "bframes")),
    # elementary streams: no container, no timestamps at all
    C("raw-h264-annexb-nopts", "h264", X264_B, props=("nopts", "bframes")),
    C("raw-mpeg2-m2v", "m2v", MPEG2_B, props=("bframes",)),  # parser-made pts
    C("ts-mpeg2-interlaced-2997", "ts",
      MPEG2_B + ["-flags", "+ildct+ilme", "-top", "1"], size=(64, 64),
      rate="30000/1001", props=("interlaced", "ntsc")),
    # --- MPEG program stream
    C("ps-mpeg2-bframes", "mpg", MPEG2_B + ["-c:a", "mp2"], audio="after",
      props=("bframes", "audio")),
    # --- fragmented MP4, MP4 without edit list
    C("mp4-h264-frag", "mp4",
      X264_B + ["-movflags", "frag_keyframe+empty_moov"],
      props=("frag", "bframes")),
    C("mp4-h264-frag-dbm", "mp4",
      X264_B + ["-movflags", "frag_keyframe+empty_moov+default_base_moof"],
      props=("frag", "bframes")),
    C("mp4-h264-noeditlist-bframes", "mp4", X264_B + ["-use_editlist", "0"],
      props=("noeditlist", "bframes")),
    # --- FLV, MXF, Ogg
    C("flv-h264-bframes", "flv", X264_B, props=("bframes",)),
    C("mxf-mpeg2-bframes", "mxf", MPEG2_B, props=("bframes",)),
    C("ogv-theora", "ogv", ["-c:v", "libtheora", "-q:v", "7", "-g", "12"]),
    # --- H.264 in MP4/MOV/MKV/AVI, with one property each
    C("mp4-h264-bframes", "mp4", X264_B, props=("bframes",)),
    C("mov-h264-aac", "mov", X264_B + AUDIO_AAC, audio="after",
      props=("audio", "bframes")),
    C("mkv-h264-audio-first", "mkv", X264_B + AUDIO_AAC, audio="first",
      props=("audio-first", "bframes")),
    C("avi-h264-bframes", "avi", X264_B, props=("bframes",)),
    C("mp4-h264-opengop", "mp4",
      X264 + ["-bf", "3", "-g", "12", "-x264-params",
              "open-gop=1:b-adapt=0:scenecut=0"], secs="2",
      props=("bframes",)),
    C("mkv-h264-interlaced", "mkv",
      X264_B + ["-flags", "+ildct+ilme", "-top", "1"], size=(64, 64),
      props=("interlaced",)),
    C("mp4-h264-2997", "mp4", X264_B, rate="30000/1001", props=("ntsc",)),
    C("mkv-h264-vfr-setpts", "mkv",
      ["-vf", "settb=1/1000,setpts='N*40+floor(N/4)*25'", "-fps_mode", "vfr",
       "-enc_time_base", "1/1000"] + X264_B, props=("vfr",)),
    C("mp4-h264-vfr-select", "mp4",
      ["-vf", r"select='not(eq(mod(n\,5)\,2))'", "-fps_mode", "vfr"] + X264_B,
      props=("vfr",)),
    C("mp4-h264-10bit", "mp4",
      ["-c:v", "libx264", "-preset", "veryfast", "-bf", "2",
       "-pix_fmt", "yuv420p10le"], props=("10bit",)),
    C("mp4-h264-444-odd", "mp4",
      ["-c:v", "libx264", "-preset", "veryfast", "-bf", "2",
       "-pix_fmt", "yuv444p"], size=(63, 47), src="testsrc",
      props=("444", "odd")),
    C("mkv-h264-fullrange", "mkv", X264_B + ["-color_range", "pc"],
      props=("fullrange",)),
    # rotation: 5.1 only keeps a rotate tag when stream-copying, hence the
    # remux; ffmpeg autorotates, so the shown size is H x W
    C("mp4-h264-rot90", "mp4", X264_B,
      remux=["-metadata:s:v:0", "rotate=90"], shown=(48, 64),
      props=("rot90",)),
    # --- HEVC, VP9, AV1
    C("mp4-hevc-bframes", "mp4", X265 + ["-tag:v", "hvc1"],
      props=("bframes",)),
    C("mkv-hevc-10bit", "mkv", X265 + ["-pix_fmt", "yuv420p10le"],
      props=("10bit",)),
    C("webm-vp9-opus", "webm",
      ["-c:v", "libvpx-vp9", "-deadline", "realtime", "-cpu-used", "8",
       "-b:v", "200k", "-g", "12", "-c:a", "libopus"], audio="after",
      props=("audio",)),
    C("mkv-vp9-444", "mkv",
      ["-c:v", "libvpx-vp9", "-deadline", "realtime", "-cpu-used", "8",
       "-b:v", "300k", "-pix_fmt", "yuv444p"], props=("444",)),
    C("webm-vp9-odd", "webm",
      ["-c:v", "libvpx-vp9", "-deadline", "realtime", "-cpu-used", "8",
       "-b:v", "200k"], size=(63, 47), src="testsrc", props=("odd",)),
    # libaom in its default "good" mode (alt-ref / hidden frames), at its
    # fastest speed; SVT-AV1 needs at least 64x64
    C("mp4-av1-aom", "mp4",
      ["-c:v", "libaom-av1", "-cpu-used", "8", "-g", "12", "-crf", "35"]),
    C("mkv-av1-svt", "mkv",
      ["-c:v", "libsvtav1", "-preset", "12", "-g", "12",
       "-svtav1-params", "loglevel=0"], size=(64, 64)),
    # --- intra codecs: ProRes, MJPEG; older ones: H.263, MPEG-4 part 2
    C("mov-prores-422-10bit", "mov",
      ["-c:v", "prores_ks", "-profile:v", "2", "-pix_fmt", "yuv422p10le"],
      props=("10bit",)),
    C("mov-prores-4444", "mov",
      ["-c:v", "prores_ks", "-profile:v", "4", "-pix_fmt", "yuv444p10le"],
      props=("444", "12bit")),  # ProRes 4444 decodes as yuv444p12le
    C("avi-mjpeg-yuvj", "avi",
      ["-c:v", "mjpeg", "-q:v", "3", "-pix_fmt", "yuvj420p"],
      props=("fullrange",)),
    C("mkv-mjpeg-yuvj422-odd", "mkv",
      ["-c:v", "mjpeg", "-q:v", "3", "-pix_fmt", "yuvj422p"],
      size=(63, 47), src="testsrc", props=("fullrange", "odd")),
    C("3gp-h263", "3gp", ["-c:v", "h263", "-q:v", "5", "-g", "12"],
      size=(176, 144)),
    C("mp4-mpeg4-bframes", "mp4",
      ["-c:v", "mpeg4", "-bf", "2", "-g", "12", "-q:v", "4"],
      props=("bframes",)),
    C("avi-mpeg4-bframes", "avi",
      ["-c:v", "mpeg4", "-bf", "2", "-g", "12", "-q:v", "4"],
      props=("bframes",)),
    # lossless, odd size
    C("mkv-ffv1-odd", "mkv", ["-c:v", "ffv1"], size=(63, 47), src="testsrc",
      props=("odd",)),
]
# Encoders/muxers this needs, all in Debian 12's ffmpeg 5.1 (checked with
# `ffmpeg -encoders` / `-muxers`): libx264 libx265 mpeg2video libvpx-vp9
# libaom-av1 libsvtav1 prores_ks mjpeg h263 mpeg4 ffv1 libtheora aac mp2
# libopus; mpegts mpeg mp4 mov matroska webm avi flv mxf ogg 3gp.
# Nothing is left out.

BY_ID = {c.id: c for c in CASES}


# ---------------------------------------------------------------- helpers

def _run(cmd, what, binary_out=False):
    p = subprocess.run(cmd, capture_output=True, timeout=TIMEOUT,
                       text=not binary_out)
    if p.returncode != 0:
        err = p.stderr if not binary_out else p.stderr.decode("replace")
        raise RuntimeError(f"{what}: {' '.join(map(str, cmd))} exited "
                           f"{p.returncode}: {err.strip()[-800:]}")
    return p.stdout


def ffprobe_json(path, *args):
    out = _run([FFPROBE, "-v", "error", *args, "-of", "json", str(path)],
               f"ffprobe {path.name}")
    return json.loads(out)


def video_pts(path):
    """Presentation timestamps (seconds) of the first video stream's
    packets, as ffprobe reports them (wrap-corrected), in file order."""
    j = ffprobe_json(path, "-select_streams", "v:0",
                     "-show_entries", "packet=pts_time")
    return [float(p["pts_time"]) for p in j.get("packets", [])
            if p.get("pts_time") not in (None, "N/A")]


def frames_info(path):
    j = ffprobe_json(path, "-select_streams", "v:0", "-show_entries",
                     "frame=pict_type,interlaced_frame")
    return j.get("frames", [])


class Info:
    """What ffprobe says about one generated file."""

    def __init__(self, path):
        j = ffprobe_json(path, "-show_entries",
                         "stream=index,codec_type,codec_name,width,height,"
                         "pix_fmt,color_range,r_frame_rate:"
                         "stream_side_data=rotation:format=start_time")
        self.streams = j["streams"]
        self.video = [s for s in self.streams if s["codec_type"] == "video"]
        self.v = self.video[0]
        self.rotation = 0
        for sd in self.v.get("side_data_list", []):
            if "rotation" in sd:
                self.rotation = int(float(sd["rotation"]))
        self.start = float(j.get("format", {}).get("start_time", 0) or 0)


def check_props(case, path, info):
    """Raises if the generated file lacks a property its case stands for."""
    v = info.v
    bad = []
    for prop in case.props:
        if prop == "bframes":
            types = [f.get("pict_type") for f in frames_info(path)]
            if "B" not in types:
                bad.append(f"no B-frames ({''.join(map(str, types))})")
        elif prop == "interlaced":
            if not any(int(f.get("interlaced_frame", 0))
                       for f in frames_info(path)):
                bad.append("no interlaced frame")
        elif prop == "vfr":
            pts = sorted(video_pts(path))
            steps = {round(b - a, 4) for a, b in zip(pts, pts[1:])}
            if len(steps) < 2:
                bad.append(f"constant frame duration {steps}")
        elif prop == "ptswrap":
            pts = video_pts(path)
            # ffprobe shows the pre-wrap part as negative times
            if not (min(pts) < 0 < max(pts)):
                bad.append(f"PTS do not wrap: {min(pts)}..{max(pts)}")
        elif prop == "discont":
            pts = video_pts(path)
            half = len(pts) // 2
            if not min(pts[half:]) < max(pts[:half]):
                bad.append("the second part does not start before the "
                           "first ends")
        elif prop == "nopts":
            j = ffprobe_json(path, "-select_streams", "v:0",
                             "-show_entries", "packet=pts")
            if any(q.get("pts") not in (None, "N/A")
                   for q in j.get("packets", [])):
                bad.append("packets still carry pts")
        elif prop == "offset10":
            if not info.start >= 10:
                bad.append(f"start_time {info.start} < 10")
        elif prop == "frag":
            if path.read_bytes().count(b"moof") < 2:
                bad.append("fewer than 2 moof boxes")
        elif prop == "noeditlist":
            if b"elst" in path.read_bytes():
                bad.append("has an edit list")
            if not info.start > 0:
                bad.append(f"start_time {info.start}: no B-frame delay")
        elif prop == "audio":
            if not any(s["codec_type"] == "audio" for s in info.streams):
                bad.append("no audio stream")
        elif prop == "audio-first":
            if info.streams[0]["codec_type"] != "audio":
                bad.append("stream 0 is not audio")
        elif prop == "10bit":
            if "10" not in v.get("pix_fmt", ""):
                bad.append(f"pix_fmt {v.get('pix_fmt')}")
        elif prop == "12bit":
            if "12" not in v.get("pix_fmt", ""):
                bad.append(f"pix_fmt {v.get('pix_fmt')}")
        elif prop == "444":
            if "444" not in v.get("pix_fmt", ""):
                bad.append(f"pix_fmt {v.get('pix_fmt')}")
        elif prop == "fullrange":
            if v.get("color_range") != "pc":
                bad.append(f"color_range {v.get('color_range')}")
        elif prop == "odd":
            if not (v["width"] % 2 and v["height"] % 2):
                bad.append(f"size {v['width']}x{v['height']}")
        elif prop == "ntsc":
            if v.get("r_frame_rate") != "30000/1001":
                bad.append(f"r_frame_rate {v.get('r_frame_rate')}")
        elif prop == "rot90":
            if abs(info.rotation) != 90:
                bad.append(f"rotation {info.rotation}")
        else:
            bad.append(f"unknown property {prop}")
    if bad:
        raise RuntimeError(f"generated file lacks its property: "
                           f"{'; '.join(bad)}")


def reference(path, w, h):
    """ffmpeg's full decode of the first video stream, presentation order,
    autorotated, w x h (the shown size: the scale filter converts only).
    Even at the clip's own size the conversion goes through an explicit
    bilinear scale (as in test_media.py): with plain `-pix_fmt rgb24`
    ffmpeg's default chroma upsampling differs from bilinear by 1.1..1.4 on
    the 10-bit 4:2:0 cases and 0.9 on the odd 4:2:2 MJPEG one (0.0 on the
    rest), which is as large as MAD_TOL itself."""
    raw = _run([FFMPEG, "-v", "error", "-nostdin", "-i", str(path),
                "-map", "0:v:0", "-fps_mode", "passthrough",
                "-vf", f"scale={w}:{h}:flags=bilinear",
                "-f", "rawvideo", "-pix_fmt", "rgb24", "-"],
               f"reference decode of {path.name}", binary_out=True)
    fb = w * h * 3
    assert len(raw) % fb == 0, f"{path.name}: {len(raw)} bytes, not k*{fb}"
    return np.frombuffer(raw, np.uint8).reshape(-1, h, w, 3)


@dataclass
class Made:
    case: Case
    path: pathlib.Path = None
    w: int = 0
    h: int = 0
    ref: np.ndarray = None
    error: str = ""
    seconds: float = 0.0

    @property
    def n(self):
        return len(self.ref)

    def __repr__(self):
        if self.error:
            return f"Made({self.case.id}: {self.error})"
        return f"Made({self.case.id} {self.w}x{self.h} n={self.n})"

    def indices(self):
        n = self.n
        return [0, n // 3, (2 * n) // 3, n - 1]


def make(case, d):
    """Generates one case into folder d, checks its properties and decodes
    the reference; errors are kept in .error (reported by the case's own
    tests), so one broken case does not take the others down."""
    t0 = time.monotonic()
    m = Made(case)
    try:
        w, h = case.size
        out = d / f"{case.id}.{case.ext}"
        cmd = [FFMPEG, "-v", "error", "-nostdin", "-y", "-f", "lavfi",
               "-i", f"{case.src}=size={w}x{h}:rate={case.rate},{STRIPES}"]
        if case.audio:
            cmd += ["-f", "lavfi", "-i",
                    "sine=frequency=440:sample_rate=48000"]
            cmd += (["-map", "1:a", "-map", "0:v"] if case.audio == "first"
                    else ["-map", "0:v", "-map", "1:a"])
        cmd += ["-t", case.secs, *case.args, str(out)]
        if case.remux is not None:
            tmp = d / f"{case.id}.pre.{case.ext}"
            _run(cmd[:-1] + [str(tmp)], f"{case.id}: generate")
            _run([FFMPEG, "-v", "error", "-nostdin", "-y", "-i", str(tmp),
                  "-map", "0", "-c", "copy", *case.remux, str(out)],
                 f"{case.id}: remux")
        else:
            _run(cmd, f"{case.id}: generate")
        if case.concat is not None:
            tail = d / f"{case.id}.part2.{case.ext}"
            src = cmd.index("-i") + 1
            part2 = cmd[:src] + [cmd[src] + ",negate"] + cmd[src + 1:-1]
            _run(part2 + [*case.concat, str(tail)], f"{case.id}: part 2")
            out.write_bytes(out.read_bytes() + tail.read_bytes())
        info = Info(out)
        check_props(case, out, info)
        cw, ch = int(info.v["width"]), int(info.v["height"])
        if abs(info.rotation) in (90, 270):
            cw, ch = ch, cw
        if (cw, ch) != tuple(case.out_size):
            raise RuntimeError(f"shown size {cw}x{ch}, case says "
                               f"{case.out_size}")
        m.path, m.w, m.h = out, cw, ch
        m.ref = reference(out, cw, ch)
        if len(m.ref) < 8:
            raise RuntimeError(f"only {len(m.ref)} reference frames")
        # the check means something only if a wrong frame cannot pass
        ref = m.ref.astype(np.int16)
        for i in m.indices():
            diffs = np.abs(ref - ref[i]).mean(axis=(1, 2, 3))
            diffs[i] = np.inf
            j = int(np.argmin(diffs))
            if diffs[j] <= DISTINCT:
                raise RuntimeError(f"reference frames {i} and {j} differ "
                                   f"by only {diffs[j]:.3f}")
    except (RuntimeError, AssertionError, subprocess.TimeoutExpired,
            KeyError, IndexError, ValueError) as e:
        m.error = f"{type(e).__name__}: {e}"
    m.seconds = time.monotonic() - t0
    return m


# --------------------------------------------------------------- fixtures

@pytest.fixture(scope="session")
def matrix(tmp_path_factory):
    """Every case generated (in parallel), property-checked and decoded by
    ffmpeg once per session: id -> Made (with .error when it failed)."""
    assert FFMPEG and FFPROBE, "ffmpeg/ffprobe missing"
    d = tmp_path_factory.mktemp("matrix")
    workers = max(2, os.cpu_count() or 2)
    with concurrent.futures.ThreadPoolExecutor(workers) as ex:
        made = list(ex.map(lambda c: make(c, d), CASES))
    return {m.case.id: m for m in made}


def ok(matrix, cid):
    m = matrix[cid]
    if m.error:
        pytest.fail(f"{cid}: could not make the case: {m.error}")
    return m


# ------------------------------------------------------------------ tests

def test_matrix_is_complete(matrix):
    assert len(CASES) >= 28, len(CASES)
    assert len(BY_ID) == len(CASES), "duplicate case ids"
    failed = {k: m.error for k, m in matrix.items() if m.error}
    made = len(CASES) - len(failed)
    # a case that failed to generate also fails its own two tests, by name
    assert made >= 24, f"only {made} cases generated: {failed}"


@pytest.mark.parametrize("cid", list(BY_ID))
def test_decode_matches_ffmpeg(tmp_path, matrix, cid):
    m = ok(matrix, cid)
    idx = m.indices()
    out = tmp_path / "out.raw"
    p = run_dh("decode", "--json", "--plan",
               "indices:" + ",".join(map(str, idx)),
               "--size", f"{m.w}x{m.h}", "--geometry", "stretch",
               "--out", out, m.path, timeout=TIMEOUT)
    assert p.returncode == 0, \
        f"{cid}: decode {idx} of n={m.n} exited {p.returncode}: " \
        f"{p.stderr.strip()}"
    obj = json.loads(p.stdout.splitlines()[0])
    assert obj["indices"] == idx, f"{cid}: reported {obj['indices']}"
    assert (obj["width"], obj["height"]) == (m.w, m.h), (cid, obj)
    raw = out.read_bytes()
    fb = m.w * m.h * 3
    assert len(raw) == len(idx) * fb, \
        f"{cid}: {len(raw)} output bytes, want {len(idx)} x {fb}"
    got = np.frombuffer(raw, np.uint8).reshape(len(idx), m.h, m.w, 3)
    ref = m.ref.astype(np.int16)
    bad = []
    for k, i in enumerate(idx):
        diffs = np.abs(ref - got[k].astype(np.int16)).mean(axis=(1, 2, 3))
        if diffs[i] > MAD_TOL:
            j = int(np.argmin(diffs))
            bad.append(f"index {i}: MAD {diffs[i]:.3f} > {MAD_TOL} "
                       f"(nearest reference frame {j}, MAD {diffs[j]:.3f})")
    assert not bad, f"{cid} (n={m.n}): " + "; ".join(bad)


@pytest.mark.parametrize("cid", list(BY_ID))
def test_probe_counts_frames(tmp_path, matrix, cid):
    """The cheap probe's count is the full decode's, and --verify (every
    picture decoded, every decoder complaint fatal) keeps the valid file."""
    m = ok(matrix, cid)
    out = tmp_path / "m.jsonl"
    p = run_dh("probe", "-q", "-j", "1", "--fail-fast", "--verify", "--out",
               out, m.path, timeout=TIMEOUT)
    assert p.returncode == 0, \
        f"{cid}: probe exited {p.returncode}: {p.stderr.strip()}"
    rows = [json.loads(s) for s in out.read_text().splitlines() if s.strip()]
    rows = [r for r in rows if "path" in r]
    assert len(rows) == 1, f"{cid}: {len(rows)} sample rows"
    assert rows[0]["frames"] == m.n, \
        f"{cid}: probe frames {rows[0]['frames']}, ffmpeg decodes {m.n}"
