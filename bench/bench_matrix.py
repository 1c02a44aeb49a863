#!/usr/bin/python3
"""`make bench`: issue 7's evaluation matrix, sized for this 2-core machine
(<= 15 minutes).

Runs `datahelix bench` (bench/datahelix_bench: every system side by side
under one CPU budget, the paper's metrics) on each (workload, model)
cell, then aggregates across cells in the paper's Table 2 form --
geometric mean of throughput, arithmetic means of the rest -- and adds
the simulator's
Table 2 at the paper's scale (`datahelix sim --workload paper`).  Every
cell also runs `--validate` (the same configuration simulated).

Output (--out, default bench/out/matrix): results.json, table.md,
throughput.png (per cell and system), miss_rate.png, and each cell's own
directory (per-rank records, telemetry, per-rank input-wait timelines).
"""
import argparse
import json
import math
import pathlib
import subprocess
import sys
import time

# bench/datahelix_bench, beside this script
from datahelix_bench.report import fmt
from datahelix_bench.sources import dask_available
from datahelix_bench.validate import handover_arg

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
CELLS = ("mixed/videomae", "mixed/qwen-vl", "shared/dit")
MEAN_KEYS = ("input_wait_p95_ms", "batch_ready_p95_ms", "ddl_miss_rate",
             "cross_ds_gb_per_100_steps", "scheduler_overhead_us")
BUDGET_S = 15 * 60


def log(msg):
    print(f"bench-matrix: {msg}", file=sys.stderr, flush=True)


def parse_args(argv):
    ap = argparse.ArgumentParser(
        prog="bench_matrix.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default=str(ROOT / "build" / "datahelix"))
    ap.add_argument("--cells", default=",".join(CELLS),
                    help="comma-separated WORKLOAD/MODEL (default %(default)s)")
    ap.add_argument("--steps", type=int, default=22)
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--out", default=str(ROOT / "bench" / "out" / "matrix"))
    a = ap.parse_args(argv)
    a.cells = [c.strip() for c in a.cells.split(",") if c.strip()]
    for c in a.cells:
        if c.count("/") != 1:
            ap.error(f"--cells: '{c}' is not WORKLOAD/MODEL")
    return a


def run_cell(a, cell, out):
    workload, model = cell.split("/")
    cmd = [a.bin, "bench", "--workload", workload, "--model", model,
           "--steps", str(a.steps), "--warmup", str(a.warmup), "--json",
           "--plots", "--validate", "--out", str(out)]
    log(f"{cell}: {' '.join(cmd[1:])}")
    t = time.monotonic()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, text=True,
                       timeout=BUDGET_S)
    if p.returncode != 0:
        raise RuntimeError(f"{cell}: datahelix bench exited {p.returncode}")
    res = json.loads(p.stdout)
    log(f"{cell}: done in {time.monotonic() - t:.0f} s")
    return res


def aggregate(cells):
    """{system: Table 2 row} over the cells where the system ran; a system
    missing from some cell is left out (its mean would not compare)."""
    names = None
    for res in cells.values():
        ok = {n for n, m in res["systems"].items() if m.get("status") == "ok"}
        names = ok if names is None else names & ok
    rows = {}
    for n in sorted(names or (), key=lambda x: list(
            next(iter(cells.values()))["systems"]).index(x)):
        ms = [res["systems"][n] for res in cells.values()]
        row = {"throughput_geomean": math.exp(
            sum(math.log(m["throughput_samples_per_s"]) for m in ms) /
            len(ms))}
        for k in MEAN_KEYS:
            v = [m[k] for m in ms if m.get(k) is not None]
            row[k] = sum(v) / len(v) if v else None
        rows[n] = row
    base = rows.get("native")
    for row in rows.values():
        row["throughput_vs_native"] = (
            row["throughput_geomean"] / base["throughput_geomean"]
            if base else None)
    return rows


def aggregate_table(rows, ncells):
    out = [f"Aggregate over {ncells} cells (Table 2 form: geometric mean of "
           "throughput, arithmetic means of the rest):", "",
           "| system | samples/s (geo. mean) | vs native | input-wait p95 ms "
           "| batch-ready p95 ms | DDL miss | cross-DS GB / 100 steps "
           "| sched. µs / decision |",
           "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for n, r in rows.items():
        miss = r["ddl_miss_rate"]
        out.append(
            f"| {n} | {r['throughput_geomean']:.2f} | "
            f"{fmt(r['throughput_vs_native'], '.2f')}× | "
            f"{fmt(r['input_wait_p95_ms'], '.1f')} | "
            f"{fmt(r['batch_ready_p95_ms'], '.0f')} | "
            f"{fmt(None if miss is None else 100 * miss, '.1f')} % | "
            f"{fmt(r['cross_ds_gb_per_100_steps'], '.2f')} | "
            f"{fmt(r['scheduler_overhead_us'], '.2f')} |")
    return "\n".join(out)


def validation_table(cells):
    out = ["Simulator against the live run (`--validate`, throughput):", "",
           "| cell | live system | live samples/s | sim | sim vs live |",
           "|---|---|---:|---:|---:|"]
    for cell, res in cells.items():
        v = res.get("validation") or {}
        for n, r in (v.get("systems") or {}).items():
            d = r["throughput_diff"]
            flag = ("" if r["within_tolerance"] else
                    f" (over {100 * v['tolerance']:g} %)")
            out.append(f"| {cell} | {n} | {r['live_throughput']:.2f} | "
                       f"{r['sim_throughput']:.2f} | "
                       f"{fmt(None if d is None else 100 * d, '+.1f')} %"
                       f"{flag} |")
    return "\n".join(out)


# The simulator's paper-scale runs: its default (equal budget, the C
# decode's costs, 2 batches ahead) and the paper's regime as far as the
# paper states it -- Native rd0 (rank-local loaders on each rank's own 4
# cores), CPU-bound (decode 10x the C estimate), deep prefetch.
PAPER_REGIME = ["--native-cores", "4", "--cpu-scale", "10", "--prefetch",
                "16"]
SIM_RUNS = (
    ("default: equal budget, C-decode costs, prefetch 2", []),
    ("paper regime: Native rd0, CPU x10, prefetch 16", PAPER_REGIME),
)
# The sample sizes (frames, WxH) the paper-scale hand-over is measured at.
FIT_SIZES = ((16, (224, 224)), (16, (448, 448)))


def paper_handover(a):
    """The baselines' hand-over for the paper-scale run: measured here by
    calibrate_handover.py with one rank and no load (the work itself, not
    this 2-CPU machine's contention) at two sample sizes, and fitted as A
    + B MB of CPU per sample and C + D MB of next() per batch (MB of the
    batch), each term >= 0.  Returns ({sim system: [A, B, C, D]},
    --handover arguments)."""
    systems = "native" + ("" if dask_available() else ",dask-pool")
    pts = []
    for frames, (w, h) in FIT_SIZES:
        cmd = [sys.executable, str(HERE / "calibrate_handover.py"),
               "--json", "--systems", systems, "--frames", str(frames),
               "--size", f"{w}x{h}", "--batch-size", "2",
               "--workers-per-rank", "1", "--workers-total", "4",
               "--prefetch", "4", "--bin", a.bin]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if p.returncode != 0:
            raise RuntimeError(f"calibrate_handover: {p.stderr[-300:]}")
        pts.append((frames * w * h * 3 / 1e6, json.loads(p.stdout)))
    return fit_handover(pts)


def fit_handover(pts):
    """Two calibrations [(MB per sample, {live system: {"cpu_ms",
    "next_ms"}})] (batch 2) -> the line through them per system, each
    term clamped at 0: ({sim system: [A, B, C, D]}, --handover args)."""
    (mb1, c1), (mb2, c2) = pts
    fit, args = {}, []
    for live, sim in (("native", "native"), ("dask-pool", "pool")):
        if live not in c1:
            continue
        b = max(0.0, (c2[live]["cpu_ms"] - c1[live]["cpu_ms"]) / (mb2 - mb1))
        d = max(0.0, (c2[live]["next_ms"] - c1[live]["next_ms"]) /
                (2 * (mb2 - mb1)))
        fit[sim] = [max(0.0, c1[live]["cpu_ms"] - b * mb1), b,
                    max(0.0, c1[live]["next_ms"] - d * 2 * mb1), d]
        args += handover_arg(sim, fit[sim])
    return fit, args


def sim_paper(a, handover_args=()):
    aggs, out = {}, ["Simulator at the paper's setup (`datahelix sim "
                     "--workload paper`: 8 ranks, 8 local + 16 remote "
                     "DataServers x 4 cores, 11 workloads):", "",
                     "| run | system | samples/s (geo. mean) | vs native "
                     "| vs pool | input-wait p95 s | batch-ready p95 s "
                     "| DDL miss | cross-DS GB / 100 steps |",
                     "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    runs = list(SIM_RUNS)
    if handover_args:
        runs.append(("paper regime + the baselines' hand-over measured "
                     "here", PAPER_REGIME + list(handover_args)))
    for label, extra in runs:
        cmd = [a.bin, "sim", "--workload", "paper", *extra, "--json"]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if p.returncode != 0:
            raise RuntimeError(f"sim: {p.stderr.strip()}")
        agg = json.loads(p.stdout)["aggregate"]
        aggs[label] = {"args": extra, "aggregate": agg}
        base, pool = agg["native"]["throughput"], agg["pool"]["throughput"]
        for n, r in agg.items():
            out.append(f"| {label} | {n} | {r['throughput']:.2f} | "
                       f"{r['throughput'] / base:.2f}× | "
                       f"{r['throughput'] / pool:.2f}× | "
                       f"{r['input_wait_p95_s']:.3f} | "
                       f"{r['ready_p95_s']:.3f} | "
                       f"{100 * r['ddl_miss_rate']:.1f} % | "
                       f"{r['cross_ds_gb_per_100_steps']:.2f} |")
    return aggs, "\n".join(out)


def plots(cells, out):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        log(f"no plots: matplotlib is not importable ({e})")
        return []
    names = []
    for res in cells.values():
        for n, m in res["systems"].items():
            if m.get("status") == "ok" and n not in names:
                names.append(n)
    files = []
    for key, label, scale, fname in (
            ("throughput_samples_per_s", "samples/s", 1, "throughput.png"),
            ("ddl_miss_rate", "DDL miss, % of rank-steps", 100,
             "miss_rate.png")):
        fig, ax = plt.subplots(figsize=(10, 4))
        width = 0.8 / max(1, len(names))
        for i, n in enumerate(names):
            xs, ys = [], []
            for c, (cell, res) in enumerate(cells.items()):
                m = res["systems"].get(n, {})
                if m.get("status") == "ok":
                    xs.append(c + i * width)
                    ys.append(scale * m[key])
            ax.bar(xs, ys, width, label=n)
        ax.set_xticks([c + 0.4 - width / 2 for c in range(len(cells))])
        ax.set_xticklabels(list(cells))
        ax.set_ylabel(label)
        ax.legend(fontsize=7, ncol=4)
        fig.tight_layout()
        files.append(out / fname)
        fig.savefig(files[-1])
        plt.close(fig)
    return files


def main(argv=None):
    a = parse_args(argv)
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    cells = {}
    for cell in a.cells:
        try:
            cells[cell] = run_cell(a, cell, out / cell.replace("/", "-"))
        except (RuntimeError, ValueError, subprocess.TimeoutExpired) as e:
            log(f"{cell}: failed: {e}")
    if not cells:
        print("datahelix: bench-matrix: no cell ran", file=sys.stderr)
        return 1
    rows = aggregate(cells)
    try:
        fit, hand = paper_handover(a)
        log(f"hand-over for the paper-scale run: {' '.join(hand)}")
    except (RuntimeError, ValueError, KeyError,
            subprocess.TimeoutExpired) as e:
        log(f"hand-over measure failed ({e}); the paper-scale run goes "
            "without it")
        fit, hand = {"error": str(e)}, []
    try:
        sim, sim_md = sim_paper(a, hand)
        sim["handover_fit"] = fit
    except (RuntimeError, ValueError, subprocess.TimeoutExpired) as e:
        sim, sim_md = {"error": str(e)}, f"Simulator: failed: {e}"
    wall = time.monotonic() - t0
    parts = [f"`make bench`: {len(cells)} cells x every system, 4 ranks x "
             f"batch 2, {a.warmup} warm-up + {a.steps} measured steps, "
             f"{wall / 60:.1f} min on this machine", ""]
    for cell, res in cells.items():
        text = (out / cell.replace("/", "-") / "table.md").read_text()
        parts += [f"### {cell}", "", text.strip(), ""]
    parts += [aggregate_table(rows, len(cells)), "",
              validation_table(cells), "", sim_md]
    md = "\n".join(parts) + "\n"
    res = {"cells": {c: {k: v for k, v in r.items() if k != "systems"} |
                     {"systems": {n: {k: v for k, v in m.items()
                                      if k != "per_rank_wait"}
                                  for n, m in r["systems"].items()}}
                     for c, r in cells.items()},
           "aggregate": rows, "sim_paper": sim, "wall_s": wall,
           "steps": a.steps, "warmup": a.warmup}
    (out / "results.json").write_text(json.dumps(res, indent=1))
    (out / "table.md").write_text(md)
    for f in plots(cells, out):
        log(f"wrote {f}")
    print(md)
    if wall > BUDGET_S:
        log(f"took {wall / 60:.1f} min, over the 15-minute budget")
    return 0


if __name__ == "__main__":
    sys.exit(main())
