#!/usr/bin/python3
"""Sampled decode speed, side by side in one run (issue 3, item 5).

Sets: the gen-data mixed set, ../shared/data/videos, and "containers": the
first gen clips re-muxed (stream copy) into MPEG-TS, fragmented MP4 and FLV,
and re-encoded to MPEG-2 in TS and PS (CONTAINERS).
Systems, each turning one clip into frames at 224x224 RGB:
  ffmpeg CLI -threads 1: full decode + scale to rawvideo, and pure decode
      (-f null); process wall time, and ffmpeg's own -benchmark rtime
      (which leaves out process start and the input open/probe)
  PyAV sampled: 16 exact uniform frames; seek to the keyframe before a
      target only when it lies past the current GOP, else decode forward;
      to_ndarray(width, height) -- what a Dataset.__getitem__ does today
  PyAV sampled + skip_frame=NONREF on packets before the next target (the
      fastest exact approach we could write with PyAV)
  PyAV naive: decode every frame, pick 16
  torchvision.io.read_video of the clip + index 16 + interpolate
  datahelix decode --json --repeat R: 16 exact, --snap key, --snap ref,
      and --plan all (full decode + scale)
All at 224x224 stretched (the peers' geometry).  The whole process and its
children are pinned to one CPU, decoders are asked for one thread.  Python
and datahelix time in-process (open to last frame, interpreter start
excluded).  Per file: median of R runs; ms/file: mean of those medians
over the files every system decoded.  Ratios: peer ms / datahelix exact-16
ms (> 1: datahelix is faster).  Never pass/fail.
"""
import argparse
import bisect
import json
import os
import re
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VIDEO_EXT = (".mp4", ".mkv", ".mov", ".avi", ".webm", ".ts", ".mpg", ".flv")
# The "containers" set: the first gen clips' own x264 streams re-muxed into
# the containers recorders and broadcast write (no re-encode: the same
# pictures as in the gen set, only the container differs), and MPEG-2 where
# that is what such files carry.
CONTAINERS = [
    ("ts", ["-c", "copy", "-f", "mpegts"]),
    ("frag.mp4", ["-c", "copy", "-movflags", "frag_keyframe+empty_moov"]),
    ("flv", ["-c", "copy"]),
    ("mpeg2.ts", ["-c:v", "mpeg2video", "-q:v", "3", "-g", "15", "-bf", "2",
                  "-f", "mpegts"]),
    ("mpg", ["-c:v", "mpeg2video", "-q:v", "3", "-g", "15", "-bf", "2",
             "-f", "vob"]),
]
CONTAINER_CLIPS = 4
N, W, H = 16, 224, 224


def uniform(n, k=N):
    """The plan's formula: floor((i + 0.5) * n / k), clamped to the clip."""
    return [min(int((i + 0.5) * n / k), n - 1) for i in range(k)]


# ---- peers: each takes a path, returns nothing, raises on failure ----

def ffmpeg_cmd(path, scale):
    cmd = ["ffmpeg", "-nostdin", "-hide_banner", "-v", "info", "-benchmark",
           "-filter_threads", "1", "-threads", "1", "-i", path,
           "-map", "0:v:0"]
    if scale:
        return cmd + ["-vf", f"scale={W}:{H}", "-f", "rawvideo",
                      "-pix_fmt", "rgb24", "-y", "/dev/null"]
    return cmd + ["-f", "null", "-"]


def run_ffmpeg(path, scale):
    """(wall ms, -benchmark rtime ms) of one ffmpeg process."""
    t0 = time.perf_counter()
    p = subprocess.run(ffmpeg_cmd(path, scale), capture_output=True,
                       text=True, errors="replace")
    wall = (time.perf_counter() - t0) * 1e3
    m = re.search(r"rtime=([0-9.]+)s", p.stderr)
    if p.returncode or not m:
        last = p.stderr.strip().splitlines()[-1:] or ["?"]
        raise RuntimeError(f"ffmpeg exit {p.returncode}: {last[0][:100]}")
    return wall, float(m.group(1)) * 1e3


def open_single(path):
    import av
    c = av.open(path)
    s = c.streams.video[0]
    s.codec_context.thread_type = "NONE"
    s.codec_context.thread_count = 1
    return c, s


def frame_table(c, s):
    """Presentation pts of every frame and of the keyframes (demux only)."""
    pts, keys = [], []
    for p in c.demux(s):
        if p.size == 0:
            continue
        if p.pts is None:
            raise RuntimeError("packet without pts")
        pts.append(p.pts)
        if p.is_keyframe:
            keys.append(p.pts)
    if not pts:
        raise RuntimeError("no video packets")
    pts.sort()
    keys.sort()
    return pts, keys or pts[:1]


def pyav_sampled(path, nonref=False):
    c, s = open_single(path)
    cc = s.codec_context
    try:
        pts, keys = frame_table(c, s)
        targets = [pts[i] for i in uniform(len(pts))]
        out, packets, cur = [], None, None
        for t in targets:
            if out and t == cur:  # a short clip repeats its frame
                out.append(out[-1])
                continue
            kt = keys[max(bisect.bisect_right(keys, t) - 1, 0)]
            if packets is None or cur is None or kt > cur:
                c.seek(kt, backward=True, any_frame=False, stream=s)
                packets = c.demux(s)
            f = decode_until(cc, packets, t, nonref)
            cur = f.pts
            out.append(f.to_ndarray(format="rgb24", width=W, height=H))
        return out
    finally:
        c.close()


def decode_until(cc, packets, t, nonref):
    """Decodes forward to the first frame at or past pts t.  With nonref,
    packets presenting before t skip non-reference frames (never shown)."""
    for p in packets:
        if nonref:
            early = p.pts is not None and p.pts < t
            cc.skip_frame = "NONREF" if early else "DEFAULT"
        for f in cc.decode(p):
            if f.pts is not None and f.pts >= t:
                return f
    raise RuntimeError(f"pts {t} not reached")


def pyav_naive(path):
    c, s = open_single(path)
    try:
        frames = list(c.decode(s))
        return [frames[i].to_ndarray(format="rgb24", width=W, height=H)
                for i in uniform(len(frames))]
    finally:
        c.close()


def torchvision_read(path):
    import torch
    import torchvision.io
    v, _, _ = torchvision.io.read_video(path, pts_unit="sec",
                                        output_format="TCHW")
    if v.shape[0] == 0:
        raise RuntimeError("read_video returned no frames")
    x = v[uniform(v.shape[0])].float()
    x = torch.nn.functional.interpolate(x, size=(H, W), mode="bilinear",
                                        align_corners=False)
    return x.round().clamp(0, 255).to(torch.uint8)


# ---- timing ----

class Result:
    """ms[set][path] = median ms, failed[set][path] = reason."""

    def __init__(self, name):
        self.name = name
        self.ms, self.failed, self.extra = {}, {}, {}
        self.reduced = 0

    def put(self, st, path, ms):
        self.ms.setdefault(st, {})[path] = ms

    def fail(self, st, path, why):
        self.failed.setdefault(st, {})[path] = why


def runs_for(first_ms, a):
    """Slow peers get fewer runs so the whole bench fits its budget."""
    return a.slow_runs if first_ms > a.slow_ms else a.runs


def time_python(res, st, files, fn, a):
    for f in files:
        ts = []
        try:
            n = a.runs
            while len(ts) < n:
                t0 = time.perf_counter()
                fn(f)
                ts.append((time.perf_counter() - t0) * 1e3)
                n = runs_for(ts[0], a)
        except Exception as e:  # noqa: BLE001 - any failure skips the file
            res.fail(st, f, f"{type(e).__name__}: {str(e)[:100]}")
            continue
        res.reduced += len(ts) < a.runs
        res.put(st, f, statistics.median(ts))


def time_ffmpeg(wall, rtime, st, files, scale, a):
    for f in files:
        ws, rs = [], []
        try:
            n = a.runs
            while len(ws) < n:
                w, r = run_ffmpeg(f, scale)
                ws.append(w)
                rs.append(r)
                n = runs_for(ws[0], a)
        except RuntimeError as e:
            wall.fail(st, f, str(e))
            rtime.fail(st, f, str(e))
            continue
        wall.reduced += len(ws) < a.runs
        wall.put(st, f, statistics.median(ws))
        rtime.put(st, f, statistics.median(rs))


def time_datahelix(res, st, files, extra, a):
    cmd = [a.bin, "decode", "--json", "--repeat", str(a.runs), "--size",
           f"{W}x{H}", "--geometry", "stretch", "--threads", "1", *extra,
           *files]
    p = subprocess.run(cmd, capture_output=True, text=True, errors="replace")
    seen = {}
    for line in p.stdout.splitlines():
        o = json.loads(line)
        if "path" in o:
            seen[o["path"]] = o
    errs = [ln for ln in p.stderr.splitlines() if ln.startswith("datahelix:")]
    for f in files:
        if f in seen:
            res.put(st, f, seen[f]["decode_ms"])
            res.extra.setdefault(st, {})[f] = seen[f]
        else:
            why = next((e for e in errs if f in e), None)
            res.fail(st, f, (why or f"no output (exit {p.returncode})")[:160])


# ---- report ----

def available(results, st):
    """Systems that decoded at least one file of the set (a system that
    decodes none, e.g. a mode not implemented, must not empty the set)."""
    return [r for r in results if r.ms.get(st)]


def common_files(results, st, files):
    return [f for f in files
            if all(f in r.ms.get(st, {}) for r in available(results, st))]


def mean_ms(r, st, files):
    ms = r.ms.get(st, {})
    if not files or any(f not in ms for f in files):
        return None  # a system that decoded none of the set
    return statistics.mean(ms[f] for f in files)


def fmt(v, spec):
    return "-" if v is None else format(v, spec)


def print_table(results, sets, base, out):
    means = {st: (common_files(results, st, fl)) for st, fl in sets.items()}
    hdr = "| system |"
    for st in sets:
        hdr += f" ms/file ({st}) | x ({st}) |"
    lines = [hdr, "|" + "---|" * (1 + 2 * len(sets))]
    for r in results:
        row = f"| {r.name} |"
        for st, fl in means.items():
            m, b = mean_ms(r, st, fl), mean_ms(base, st, fl)
            ratio = m / b if m is not None and b else None
            row += f" {fmt(m, '.1f')} | {fmt(ratio, '.2f')} |"
        lines.append(row)
    text = "\n".join(lines)
    print(text)
    with open(out, "w") as fh:
        fh.write(text + "\n")
    return means


def print_skips(results, sets):
    for st, fl in sets.items():
        for r in results:
            if r not in available(results, st):
                why = next(iter(r.failed.get(st, {}).values()), "no files")
                print(f"  {r.name} ({st}): no file decoded, e.g. {why}")
        for f in fl:
            who = [r for r in available(results, st)
                   if f in r.failed.get(st, {})]
            if who:  # one reason is enough: the others are alike
                print(f"  skipped ({st}) {os.path.basename(f)}: failed in "
                      f"{', '.join(r.name for r in who)}; e.g. "
                      f"{who[0].failed[st][f][-110:]}")


def print_snap(dh, means):
    for r in dh:
        for st, fl in means.items():
            ex = r.extra.get(st, {})
            sh = [ex[f]["mean_abs_shift"] for f in fl
                  if "mean_abs_shift" in ex.get(f, {})]
            dec = [ex[f]["decoded_frames"] for f in fl if f in ex]
            seeks = [ex[f]["seeks"] for f in fl if f in ex]
            line = (f"  {r.name} ({st}): decoded {fmt(mean(dec), '.1f')} "
                    f"frames/file, {fmt(mean(seeks), '.1f')} seeks/file")
            if sh:
                line += f", mean index deviation {mean(sh):.2f} frames"
            print(line)


def print_pairs(results, means):
    """The issue's comparisons, as ratios (> 1: datahelix faster)."""
    by = {r.name: r for r in results}
    pairs = [("datahelix exact 16", "PyAV sampled 16 + skip NONREF"),
             ("datahelix exact 16", "PyAV sampled 16 (seek+decode)"),
             ("datahelix exact 16", "ffmpeg CLI pure decode (rtime)"),
             ("datahelix snap key 16", "PyAV sampled 16 + skip NONREF"),
             ("datahelix all (full)", "ffmpeg CLI decode+scale (rtime)"),
             ("datahelix all (full)", "ffmpeg CLI decode+scale (wall)")]
    print()
    for d, peer in pairs:
        cells = []
        for st, fl in means.items():
            a, b = mean_ms(by[d], st, fl), mean_ms(by[peer], st, fl)
            cells.append(f"{st} {fmt(b / a if a and b else None, '.2f')}x")
        print(f"  {peer} / {d}: " + ", ".join(cells))


def mean(v):
    return statistics.mean(v) if v else None


# ---- main ----

def list_videos(d):
    out = []
    for base, _, names in os.walk(d):
        out += [os.path.join(base, n) for n in names
                if n.lower().endswith(VIDEO_EXT)]
    return sorted(out)


def gen_set(a):
    d = os.path.join(a.work, "gen")
    if not os.path.isdir(d):
        subprocess.run([a.bin, "gen-data", "--out", d + ".tmp", "--count",
                        "12", "--profiles", "mixed", "--seed", "1"],
                       check=True)
        os.rename(d + ".tmp", d)
    return list_videos(d)


def container_set(a, gen):
    """CONTAINERS of the first CONTAINER_CLIPS gen clips, made once."""
    d = os.path.join(a.work, "containers")
    if not os.path.isdir(d):
        os.makedirs(d + ".tmp", exist_ok=True)
        for src in gen[:CONTAINER_CLIPS]:
            stem = os.path.splitext(os.path.basename(src))[0]
            for suffix, args in CONTAINERS:
                subprocess.run(["ffmpeg", "-nostdin", "-v", "error", "-y",
                                "-i", src, "-map", "0:v:0", *args,
                                os.path.join(d + ".tmp", f"{stem}.{suffix}")],
                               check=True)
        os.rename(d + ".tmp", d)
    return list_videos(d)


def warm(files):
    for f in files:
        with open(f, "rb") as fh:
            while fh.read(1 << 20):
                pass


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "datahelix"))
    ap.add_argument("--videos", default=os.path.join(
        os.path.dirname(ROOT), "shared", "data", "videos"))
    ap.add_argument("--work", default=os.path.join(ROOT, "bench", "out",
                                                   "decode"))
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--slow-ms", type=float, default=1500,
                    help="a peer's file whose first run takes longer ...")
    ap.add_argument("--slow-runs", type=int, default=3,
                    help="... gets this many runs (budget: ~10 min)")
    ap.add_argument("--cpu", type=int, default=None,
                    help="CPU to pin to (default: the last one allowed)")
    return ap.parse_args()


def systems(a):
    """(Result, how to time it on (set, files)) in run order."""
    fw, fr = Result("ffmpeg CLI decode+scale (wall)"), \
        Result("ffmpeg CLI decode+scale (rtime)")
    nw, nr = Result("ffmpeg CLI pure decode (wall)"), \
        Result("ffmpeg CLI pure decode (rtime)")
    dh = [Result("datahelix exact 16"), Result("datahelix snap key 16"),
          Result("datahelix snap ref 16"), Result("datahelix all (full)")]
    dh_args = [[], ["--snap", "key"], ["--snap", "ref"], ["--plan", "all"]]
    py = [(Result("PyAV sampled 16 (seek+decode)"), pyav_sampled),
          (Result("PyAV sampled 16 + skip NONREF"),
           lambda f: pyav_sampled(f, nonref=True)),
          (Result("PyAV naive full decode + pick"), pyav_naive),
          (Result("torchvision read_video + pick"), torchvision_read)]
    steps = [(r, (lambda r, x: lambda st, fl: time_datahelix(r, st, fl, x, a))
              (r, x)) for r, x in zip(dh, dh_args)]
    steps += [(r, (lambda r, fn: lambda st, fl: time_python(r, st, fl, fn, a))
               (r, fn)) for r, fn in py]
    steps.append((fw, lambda st, fl: time_ffmpeg(fw, fr, st, fl, True, a)))
    steps.append((nw, lambda st, fl: time_ffmpeg(nw, nr, st, fl, False, a)))
    order = [r for r, _ in steps] + [fr, nr]
    return steps, order, dh


def main():
    a = parse_args()
    os.makedirs(a.work, exist_ok=True)
    cpu = a.cpu if a.cpu is not None else max(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpu})  # children inherit: one core for all
    import av  # imported here, not inside the first timing
    import av.logging
    av.logging.set_level(av.logging.PANIC)  # failures are reported per file
    import torch
    torch.set_num_threads(1)
    gen = gen_set(a)
    sets = {"gen": gen, "shared": list_videos(a.videos),
            "containers": container_set(a, gen)}
    for fl in sets.values():
        warm(fl)
    steps, order, dh = systems(a)
    t_all = time.perf_counter()
    for r, fn in steps:
        t0 = time.perf_counter()
        for st, fl in sets.items():
            fn(st, fl)
        print(f"  {r.name}: {time.perf_counter() - t0:.1f} s",
              file=sys.stderr)
    print(f"\n## Sampled decode, 224x224 RGB, one CPU (cpu {cpu}), "
          f"median of {a.runs} runs per file "
          f"({sum(len(v) for v in sets.values())} files, "
          f"{time.perf_counter() - t_all:.0f} s)\n")
    with open(os.path.join(a.work, "raw.json"), "w") as fh:
        json.dump({r.name: {"ms": r.ms, "failed": r.failed,
                            "extra": r.extra} for r in order}, fh)
    means = print_table(order, sets, dh[0],
                        os.path.join(a.work, "table.md"))
    print("\nx = system ms / datahelix exact-16 ms (> 1: datahelix faster); "
          "ms/file over the files every system decoded: "
          + ", ".join(f"{st} {len(fl)}/{len(sets[st])}"
                      for st, fl in means.items()))
    print_skips(order, sets)
    for r in order:
        if r.reduced:
            print(f"  {r.name}: {r.reduced} slow file(s) timed with "
                  f"{a.slow_runs} runs instead of {a.runs}")
    print_pairs(order, means)
    print("\ndatahelix plan cost (means over the same files):")
    print_snap(dh, means)
    print("\nScalers: datahelix as built (see docs/media.md), ffmpeg CLI "
          "bicubic, PyAV to_ndarray swscale default, torchvision bilinear "
          "interpolate on full-size RGB.  ffmpeg wall includes process "
          "start; rtime excludes start and input probing.")


if __name__ == "__main__":
    main()
