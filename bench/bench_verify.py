#!/usr/bin/python3
"""`datahelix probe --verify` speed, side by side in one run (issue
"Real-world media", item 3: files/s and x real time on this machine).

Systems, each decoding every picture of every file once:
  datahelix probe --verify --jobs N   (one process; the cache removed
                                       before each run, so all is decoded)
  ffmpeg -v error -i F -map 0:v:0 -f null -, one process per file, N at
      a time, one decoder thread each (what a shell loop checking files
      does: `xargs -P N`)
Sets: the gen-data mixed set (24 clips) and ../shared/data (clips and
images).  "x real time" is the media seconds decoded per wall second.
Medians of R runs; the ratio is the peer's time over datahelix's.
Never pass/fail.
"""
import argparse
import concurrent.futures
import json
import os
import re
import statistics
import subprocess
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def gen_set(dh, work):
    d = os.path.join(work, "gen")
    if not os.path.isdir(d):
        subprocess.run([dh, "gen-data", "--out", d + ".tmp", "--profiles",
                        "mixed", "--count", "24", "--seed", "3"], check=True)
        os.rename(d + ".tmp", d)
    return d


def probe_table(dh, src, out):
    """The plain probe's rows: what --verify then decodes."""
    subprocess.run([dh, "probe", "--quiet", "--out", out, src], check=True)
    with open(out) as fh:
        rows = [json.loads(x) for x in fh if x.strip()]
    return [r for r in rows if "path" in r and r["kind"] != "text"]


def run_verify(dh, src, out, jobs):
    cache = out + ".verify.jsonl"
    if os.path.exists(cache):
        os.unlink(cache)
    t0 = time.perf_counter()
    p = subprocess.run([dh, "probe", "--verify", "--jobs", str(jobs),
                        "--out", out, src], capture_output=True, text=True)
    wall = time.perf_counter() - t0
    m = re.search(r"verified (\d+) files?, (\d+) left out", p.stderr)
    if p.returncode or not m:
        raise RuntimeError(f"probe --verify exited {p.returncode}: "
                           f"{p.stderr[-300:]}")
    return wall, int(m.group(1)), int(m.group(2))


def ffmpeg_null(path):
    r = subprocess.run(["ffmpeg", "-nostdin", "-v", "error", "-threads", "1",
                        "-i", path, "-map", "0:v:0", "-f", "null", "-"],
                       capture_output=True, text=True)
    return r.returncode == 0 and not r.stderr.strip()


def run_ffmpeg(paths, jobs):
    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(jobs) as ex:
        ok = list(ex.map(ffmpeg_null, paths))
    return time.perf_counter() - t0, len(paths), ok.count(False)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "datahelix"))
    ap.add_argument("--shared", default=os.path.join(
        os.path.dirname(ROOT), "shared", "data"))
    ap.add_argument("--jobs", type=int, default=os.cpu_count())
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--work", default=os.path.join(ROOT, "bench", "out",
                                                   "verify"))
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    sets = {"gen": gen_set(a.bin, a.work), "shared": a.shared}
    print(f"\n## probe --verify, {a.jobs} jobs, median of {a.runs} runs, "
          f"{os.cpu_count()} CPUs\n")
    print("| set | files | media s | system | wall s | files/s | "
          "x real time | left out / failed | datahelix is |")
    print("|---|---:|---:|---|---:|---:|---:|---:|---:|")
    for name, src in sets.items():
        out = os.path.join(a.work, f"{name}.jsonl")
        rows = probe_table(a.bin, src, os.path.join(a.work, f"{name}-p.jsonl"))
        media = sum(r.get("duration_s", 0) for r in rows
                    if r["kind"] == "video")
        dh = [run_verify(a.bin, src, out, a.jobs) for _ in range(a.runs)]
        ff = [run_ffmpeg([r["path"] for r in rows], a.jobs)
              for _ in range(a.runs)]
        t_dh = statistics.median(x[0] for x in dh)
        t_ff = statistics.median(x[0] for x in ff)
        rows_out = [(f"datahelix probe --verify -j {a.jobs}", t_dh, dh[0]),
                    (f"ffmpeg -f null per file, {a.jobs} at a time", t_ff,
                     ff[0])]
        for sysname, t, (_, n, bad) in rows_out:
            print(f"| {name} | {n} | {media:.1f} | {sysname} | {t:.2f} | "
                  f"{n / t:.1f} | {media / t:.0f}x | {bad} | "
                  f"{t / t_dh:.2f}x |")


if __name__ == "__main__":
    main()
