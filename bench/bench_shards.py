#!/usr/bin/python3
"""Shards against files, side by side in one run (issue 35's benchmark):

  1. the bench-live cell (4 ranks, 2 decode workers, mixed clips, the
     videomae window) with dh-ddl reading a folder of files, and reading
     the same clips from 1 GiB WebDataset shards in place (`datahelix
     bench --shards`): samples/s, input-wait p95, decode CPU and all CPU
     per sample.  The two runs alternate, R times; medians.  Twice: with
     the cell's window (GPU-bound here: the window caps samples/s) and
     with every window a quarter as long (--gpu-scale 0.25: CPU-bound,
     where a slower read would show in samples/s).
  2. `datahelix probe --jobs 2` of N clips (3,000: hard links to 24
     generated clips) as files in a folder against the same clips in
     1 GiB shards: files/s (samples/s), medians of 5 alternated runs.

Target (issue 35): shards within 3 % of files on every figure of 1, and
probe of shards at least the folder's files/s.  Never pass/fail: the
figures and their ratios go to bench/out/shards/{results.json,table.md}.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GIB = 1 << 30
FIGS = (("throughput_samples_per_s", "samples/s", "higher"),
        ("input_wait_p95_ms", "input-wait p95 ms", "lower"),
        ("decode_cpu_ms_per_sample", "decode CPU ms / sample", "lower"),
        ("cpu_ms_per_sample", "all CPU ms / sample", "lower"))


CELLS = (("gpu-bound", 1.0), ("cpu-bound", 0.25))


def live(a, shards, out, scale):
    cmd = [a.bin, "bench", "--systems", "dh-ddl", "--workload", "mixed",
           "--ranks", "4", "--workers", "2", "--batch-size", "2",
           "--steps", str(a.steps), "--warmup", "5", "--model", "videomae",
           "--gpu-scale", str(scale), "--json", "--out", out]
    if shards:
        cmd += ["--shards", str(GIB)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if p.returncode != 0:
        sys.exit(f"bench_shards: {' '.join(cmd)} failed:\n{p.stderr[-2000:]}")
    s = json.loads(p.stdout)["systems"]["dh-ddl"]
    acct = s["cpu_account"]
    s["cpu_ms_per_sample"] = 1e3 * acct["total_s"] / max(1, s["samples"])
    return {k: s[k] for k, _, _ in FIGS}


def probe_sets(a, work):
    """N clips as hard links in a folder, and the same clips in shards."""
    src = os.path.join(work, "src")
    if not os.path.isdir(src):
        subprocess.run([a.bin, "gen-data", "--out", src, "--profiles",
                        "mixed", "--count", "24", "--seed", "1"], check=True,
                       capture_output=True, timeout=900)
    folder = os.path.join(work, f"files-{a.files}")
    if not os.path.isdir(folder):
        base = sorted(f for f in os.listdir(src) if f.endswith(".mp4"))
        os.makedirs(folder + ".tmp", exist_ok=True)
        for i in range(a.files):
            os.link(os.path.join(src, base[i % len(base)]),
                    os.path.join(folder + ".tmp", f"{i:06d}.mp4"))
        os.rename(folder + ".tmp", folder)
    shards = os.path.join(work, f"shards-{a.files}")
    subprocess.run([a.bin, "shard", "--quiet", "--shard-bytes", str(GIB),
                    "--out", shards, folder], check=True, timeout=900)
    return folder, shards


def probe_rate(a, inp, out):
    t0 = time.perf_counter()
    p = subprocess.run([a.bin, "probe", "--quiet", "--jobs", "2", "--out",
                        out, inp], capture_output=True, text=True,
                       timeout=900)
    dt = time.perf_counter() - t0
    if p.returncode != 0:
        sys.exit(f"bench_shards: probe {inp} failed:\n{p.stderr[-2000:]}")
    rows = sum(1 for x in open(out) if '"datahelix_header"' not in x)
    if rows != a.files:
        sys.exit(f"bench_shards: probe {inp}: {rows} rows, want {a.files}")
    return rows / dt


def ratio(x, y):
    return x / y if y else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "datahelix"))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--files", type=int, default=3000)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "out",
                                                  "shards"))
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    work = os.path.join(a.out, "data")
    os.makedirs(work, exist_ok=True)
    runs = {c: {"files": [], "shards": []} for c, _ in CELLS}
    for cell, scale in CELLS:
        for r in range(a.runs):  # alternate: load drift hits both alike
            for kind in ("files", "shards") if r % 2 == 0 else ("shards",
                                                                "files"):
                res = live(a, kind == "shards",
                           os.path.join(a.out, cell, kind), scale)
                runs[cell][kind].append(res)
                print(f"bench_shards: {cell} run {r + 1} {kind}: " +
                      ", ".join(f"{lab} {res[k]:.1f}"
                                for k, lab, _ in FIGS), file=sys.stderr)
    folder, shards = probe_sets(a, work)
    rates = {"files": [], "shards": []}
    for r in range(max(5, a.runs)):
        for kind, inp in (("files", folder), ("shards", shards)):
            rates[kind].append(probe_rate(a, inp, os.path.join(
                work, f"probe-{kind}.jsonl")))
    med = {c: {k: {f: statistics.median(x[f] for x in v) for f, _, _ in FIGS}
               for k, v in kinds.items()} for c, kinds in runs.items()}
    spread = {c: {k: {f: [min(x[f] for x in v), max(x[f] for x in v)]
                      for f, _, _ in FIGS} for k, v in kinds.items()}
              for c, kinds in runs.items()}
    prb = {k: statistics.median(v) for k, v in rates.items()}
    res = {"runs": runs, "median": med, "range": spread,
           "probe_files_per_s": rates, "probe_median": prb,
           "ratio_shards_over_files": {
               c: {f: ratio(m["shards"][f], m["files"][f])
                   for f, _, _ in FIGS} for c, m in med.items()},
           "probe_ratio_shards_over_files": ratio(prb["shards"],
                                                  prb["files"]),
           "config": {"runs": a.runs, "steps": a.steps, "files": a.files,
                      "shard_bytes": GIB, "cells": dict(CELLS)}}
    lines = ["| cell | figure (median of %d; range) | files | 1 GiB shards "
             "| shards / files |" % a.runs, "|---|---|---:|---:|---:|"]
    for cell, _ in CELLS:
        for f, lab, better in FIGS:
            rf, rs = spread[cell]["files"][f], spread[cell]["shards"][f]
            lines.append(
                f"| {cell} | {lab} ({better} is better) | "
                f"{med[cell]['files'][f]:.1f} ({rf[0]:.1f}-{rf[1]:.1f}) | "
                f"{med[cell]['shards'][f]:.1f} ({rs[0]:.1f}-{rs[1]:.1f}) | "
                f"{res['ratio_shards_over_files'][cell][f]:.3f} |")
    lines.append(f"| probe | --jobs 2, {a.files} clips, files/s | "
                 f"{prb['files']:.0f} | {prb['shards']:.0f} | "
                 f"{res['probe_ratio_shards_over_files']:.3f} |")
    table = "\n".join(lines) + "\n"
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump(res, f, indent=1)
    with open(os.path.join(a.out, "table.md"), "w") as f:
        f.write(table)
    print(table)
    shutil.rmtree(os.path.join(work, f"shards-{a.files}"),
                  ignore_errors=True)


if __name__ == "__main__":
    main()
