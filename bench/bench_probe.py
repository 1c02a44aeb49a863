#!/usr/bin/python3
"""Probe speed, side by side in one run (issue: header-only probing of
local MP4 files >= 500 files/s on the reference 2-core machine).

Systems, all producing codec, size, duration and an exact frame count:
  datahelix probe --jobs 1 / --jobs 2   (one process for all files)
  PyAV in one Python process            (what a Dataset __init__ does today)
  ffprobe per file, header only         (what shell pipelines do)
  ffprobe per file with -count_packets  (exact frames the ffprobe way)

Files: a gen-data mixed set replicated by hard links to N distinct paths
(page cache warm for every system alike).  Medians of R runs; ratios are
datahelix --jobs 2 over each peer.  Never pass/fail.
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def timed(fn, runs):
    ts = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def make_files(dh, work, n):
    src = os.path.join(work, "src")
    if not os.path.isdir(src):
        subprocess.run([dh, "gen-data", "--out", src, "--profiles", "mixed",
                        "--count", "24", "--seed", "1"], check=True)
    files_dir = os.path.join(work, f"files-{n}")
    if not os.path.isdir(files_dir):
        os.makedirs(files_dir + ".tmp", exist_ok=True)
        base = sorted(f for f in os.listdir(src) if f.endswith(".mp4"))
        for i in range(n):
            os.link(os.path.join(src, base[i % len(base)]),
                    os.path.join(files_dir + ".tmp", f"{i:06d}.mp4"))
        os.rename(files_dir + ".tmp", files_dir)
    return files_dir, sorted(os.path.join(files_dir, f)
                             for f in os.listdir(files_dir))


def pyav_probe(files):
    import av
    for f in files:
        with av.open(f) as c:
            s = c.streams.video[0]
            _ = (s.codec_context.name, s.codec_context.width,
                 s.codec_context.height, s.frames, s.duration)


def ffprobe_probe(files, count):
    extra = ["-count_packets"] if count else []
    for f in files:
        subprocess.run(["ffprobe", "-v", "error", "-select_streams", "v:0",
                        *extra, "-show_entries",
                        "stream=codec_name,width,height,duration,nb_frames,"
                        "nb_read_packets", "-of", "json", f],
                       check=True, capture_output=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "datahelix"))
    ap.add_argument("--files", type=int, default=2000)
    ap.add_argument("--peer-files", type=int, default=300,
                    help="files timed for the per-process ffprobe peers")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--work", default=os.path.join(ROOT, "bench", "out",
                                                   "probe"))
    a = ap.parse_args()
    files_dir, files = make_files(a.bin, a.work, a.files)
    out = os.path.join(a.work, "m.jsonl")
    rates = {}
    for jobs in (1, 2):
        cmd = [a.bin, "probe", "--quiet", "--jobs", str(jobs), "--out", out,
               files_dir]
        t = timed(lambda: subprocess.run(cmd, check=True), a.runs)
        rates[f"datahelix probe --jobs {jobs}"] = len(files) / t
    try:
        import av  # noqa: F401
        t = timed(lambda: pyav_probe(files), a.runs)
        rates["PyAV, one process"] = len(files) / t
    except ImportError:
        print("PyAV (python3-av) missing: its row is left out",
              file=sys.stderr)
    sub = files[: a.peer_files]
    for count in (False, True):
        name = "ffprobe per file" + (" -count_packets" if count else "")
        t = timed(lambda: ffprobe_probe(sub, count), max(1, a.runs // 2))
        rates[name] = len(sub) / t
    ours = rates["datahelix probe --jobs 2"]
    print(f"\nprobe speed: {len(files)} local MP4 files (gen-data mixed, "
          f"hard-linked), median of {a.runs} runs, {os.cpu_count()} CPUs\n")
    print("| system | files/s | datahelix --jobs 2 is |")
    print("|---|---:|---:|")
    for k, v in rates.items():
        print(f"| {k} | {v:,.0f} | {ours / v:.2f}x |")
    if "--keep" not in sys.argv:
        shutil.rmtree(files_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
