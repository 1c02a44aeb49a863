#!/usr/bin/python3
"""Issue 21 item 3, tails when the CPUs are short: dh-ddl on bench-live's
cell (24 mixed clips, 4 ranks x batch 2, the qwen-vl window, whose GPU
step follows tokens) with the CPU pools on and off (docs/placement.md
"CPU pools") and with the plan's steps alternating or sorted
(docs/planner.md "Step order"), on 1 CPU (CPU-bound) and on 2.  One
`datahelix bench` run per cell, one after another, never at once.

Per cell: throughput and its share of the ceiling; the ranks' input-wait
p50 / p95; and the step's wait (the longest input wait of its ranks,
which is what the synchronous step waits), p50 / p95 / max, beside the
mean GPU window.  Never pass/fail.

Usage: bench_tails.py [--bin build/datahelix] [--cpus 1,2]
                      [--out bench/out/tails] [--json]
"""
import argparse
import itertools
import json
import pathlib
import statistics
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
CELL = ["--workload", "mixed", "--ranks", "4", "--batch-size", "2",
        "--steps", "40", "--warmup", "5", "--model", "qwen-vl",
        "--systems", "dh-ddl"]


def quantile(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def step_waits(sysdir, ranks, warmup):
    """Per measured step, the longest input wait over the ranks (ms)."""
    per = [json.loads((sysdir / f"rank{r}.json").read_text())["steps"]
           for r in range(ranks)]
    n = min(len(p) for p in per)
    return [max(p[i]["wait_ms"] for p in per) for i in range(warmup, n)]


def run_cell(a, cpus, pools, order):
    out = pathlib.Path(a.out) / f"cpu{cpus}-pools-{pools}-{order}"
    cmd = [a.bin, "bench", *CELL, "--workers", str(cpus), "--cpu-pools",
           pools, "--step-order", order, "--out", str(out), "--json"]
    print(f"bench_tails: {cpus} CPU, pools {pools}, {order} ...",
          file=sys.stderr, flush=True)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True, timeout=1800)
    if p.returncode != 0:
        sys.exit(f"bench_tails: {' '.join(cmd)} failed ({p.returncode}):\n"
                 f"{p.stderr[-2000:]}")
    res = json.loads((out / "results.json").read_text())
    s = res["systems"]["dh-ddl"]
    w = step_waits(out / "dh-ddl", 4, 5)
    return {"cpus": cpus, "pools": pools, "order": order,
            "samples_per_s": s["throughput_samples_per_s"],
            "ceiling": s["ceiling_samples_per_s"],
            "share": s["ceiling_share"],
            "decode_cpu_ms": s["decode_cpu_ms_per_sample"],
            "wait_p50": s["input_wait_p50_ms"],
            "wait_p95": s["input_wait_p95_ms"],
            "step_wait_p50": quantile(w, 0.5),
            "step_wait_p95": quantile(w, 0.95),
            "step_wait_max": max(w), "step_wait_mean": statistics.mean(w),
            "window_ms": s["window_ms_mean"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", default=str(ROOT / "build" / "datahelix"))
    ap.add_argument("--cpus", default="1,2")
    ap.add_argument("--out", default=str(ROOT / "bench" / "out" / "tails"))
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    cpus = [int(x) for x in a.cpus.split(",")]
    rows = [run_cell(a, c, pools, order) for c, (pools, order) in
            itertools.product(cpus, [("off", "alternate"), ("on", "alternate"),
                                     ("off", "sorted"), ("on", "sorted")])]
    if a.json:
        print(json.dumps(rows, indent=1))
        return
    print("| CPUs | pools | step order | samples/s | ceiling | share | "
          "decode CPU ms / sample | input-wait p50 / p95 ms | step wait "
          "p50 / p95 / max ms | window ms |")
    print("|---:|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['cpus']} | {r['pools']} | {r['order']} | "
              f"{r['samples_per_s']:.2f} | {r['ceiling']:.2f} | "
              f"{100 * r['share']:.0f} % | {r['decode_cpu_ms']:.1f} | "
              f"{r['wait_p50']:.0f} / {r['wait_p95']:.0f} | "
              f"{r['step_wait_p50']:.0f} / {r['step_wait_p95']:.0f} / "
              f"{r['step_wait_max']:.0f} | {r['window_ms']:.0f} |")


if __name__ == "__main__":
    main()
