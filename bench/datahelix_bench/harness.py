"""One run of `datahelix bench`, on arguments cli.py has checked: pin the
CPU budget, prepare the data, run each system's ranks in turn
(processes.run_system), compute its metrics, validate against the
simulator when asked, then write results.json and table.md (and plots)
into --out and print the table or the JSON.

The CPU budget: --workers N decode workers in total for every system
(split across the ranks of rank-local systems, at least one each; the pool
gets the same total), and every process of the run pinned to N CPUs when
the machine has more.
"""
import json
import os
import pathlib
import subprocess
import sys
import time

from .common import CMD, HERE, ROOT, log
from .data import prepare_data
from .metrics import comparisons, metrics
from .processes import pin_cpus, run_system
from .report import (ceiling_table, comparison_text, late_text, plots,
                     table, validation_table)
from .sources import dask_available
from .validate import validate
from .window import gpu_model_doc


def worker_split(total, ranks):
    """Decode workers per rank: `total` spread over the ranks, at least
    one each (a rank-local loader cannot share a worker)."""
    return [max(1, total // ranks + (1 if r < total % ranks else 0))
            for r in range(ranks)]


def child_paths():
    """Every child (ranks, Dask workers) imports datahelix and this
    package: python/ and bench/ on PYTHONPATH, and on this sys.path."""
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT / "python"), str(HERE)] +
        ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []))
    sys.path[:0] = [str(ROOT / "python"), str(HERE)]


def run_systems(a, data, out, split, served=None):
    """{system: metrics, or status "skipped" / "failed" and the reason}."""
    systems = {}
    for name in a.systems:
        if name == "dask-pool":
            why = dask_available()
            if why:
                log(f"dask-pool skipped: {why}")
                systems[name] = {"status": "skipped", "reason": why}
                continue
        log(f"{name}: {a.ranks} ranks x {a.warmup}+{a.steps} steps ...")
        down0 = served.proxy.down if served else 0
        results, err, wall = run_system(name, a, data, out / name, split)
        if err:
            log(f"{name}: failed: {err}")
            systems[name] = {"status": "failed", "reason": err,
                             "wall_s": wall}
            continue
        systems[name] = metrics(name, results, a, out / name, wall, split)
        m = systems[name]
        if served:  # what came over the (emulated) network
            m["bytes_fetched"] = served.proxy.down - down0
        log(f"{name}: {m['throughput_samples_per_s']:.2f} samples/s, "
            f"wait p95 {m['input_wait_p95_ms']:.1f} ms, miss "
            f"{100 * m['ddl_miss_rate']:.0f} % ({wall:.0f} s)")
    return systems


def config_doc(a, split, cpus, distinct, need):
    return {"systems": a.systems, "ranks": a.ranks,
            "steps": a.steps, "warmup": a.warmup,
            "workload": a.workload, "model": a.model,
            "workers": a.workers, "decode_workers_per_rank": split,
            "cpus": cpus, "batch_size": a.batch_size,
            "frames": a.frames, "size": list(a.size),
            "prefetch": a.prefetch, "clips": distinct,
            "samples_in_manifest": need, "seed": a.seed,
            "ddl_ms": a.ddl_ms, "gpu_scale": a.gpu_scale,
            "cpu_pools": a.cpu_pools, "step_order": a.step_order,
            "serve": a.serve, "rtt_ms": a.rtt_ms,
            "cache_dir": a.cache_dir,
            "gpu_model": gpu_model_doc(a.model),
            "gpu_device": a.gpu_device if a.gpu else None}


def write_and_print(a, res, out, split, cpus, distinct):
    systems, comp, val = res["systems"], res["comparisons"], \
        res.get("validation")
    md = table(systems, a)
    md += ("\n\nThe ceiling - the lower of the CPUs' decode capacity (cores "
           "/ decode CPU per sample, measured in the run) and the GPU "
           "window's rate - and where the CPU went (docs/benchmarks.md "
           "\"Ceiling\"):\n\n" + ceiling_table(systems, a))
    if val and "systems" in val:
        md += ("\n\nSimulated (`datahelix sim`, the same configuration, "
               f"decode {val['mean_decode_ms']:.1f} ms a sample measured "
               f"here, CPU scale {val['cpu_scale']:g}) against live:\n\n" +
               validation_table(val))
    text = comparison_text(comp)
    why = late_text(systems)
    if why:
        text = (text + "\n\n" if text else "") + \
            "Why steps were late (warm-up included; docs/trace.md):\n" + why
    (out / "results.json").write_text(json.dumps(res, indent=1))
    (out / "table.md").write_text(md + "\n\n" + text + "\n")
    if a.plots:
        for f in plots(systems, a, out):
            log(f"wrote {f}")
    if a.json:
        slim = json.loads(json.dumps(res))
        for m in slim["systems"].values():
            m.pop("per_rank_wait", None)
        print(json.dumps(slim))
    else:
        print(f"{a.ranks} ranks x batch {a.batch_size}, {a.workload} "
              f"({distinct} clips), {a.model} window, {a.workers} decode "
              f"workers budget ({sum(split)} used) on {len(cpus)} CPUs, "
              f"{a.warmup} warm-up + {a.steps} measured steps\n")
        print(md)
        if text:
            print("\n" + text)


def run(a):
    """The whole run; the exit status: 0 when at least one system ran."""
    out = pathlib.Path(a.out)
    cpus = pin_cpus(a.workers)
    child_paths()
    os.environ["DATAHELIX_BIN"] = a.bin
    split = worker_split(a.workers, a.ranks)
    need = a.ranks * a.batch_size * (a.warmup + a.steps + 2)
    t_all = time.monotonic()
    try:
        man, dhx, distinct = prepare_data(a, need)
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        print(f"datahelix: {CMD}: data: {e}", file=sys.stderr)
        return 1
    if sum(split) != a.workers:
        log(f"{a.workers} decode workers for {a.ranks} ranks: a rank-local "
            f"loader needs one per rank, so every system gets {sum(split)} "
            f"workers, all on the same {len(cpus)} CPUs")
    served = None
    if a.serve != "local":
        from .remote import Served
        try:
            served = Served(a, man, out / "served")
        except (RuntimeError, OSError, subprocess.SubprocessError) as e:
            print(f"datahelix: {CMD}: --serve {a.serve}: {e}",
                  file=sys.stderr)
            return 1
        man, dhx = served.manifest, served.index
    data = {"manifest": man, "index": dhx,
            "keep_pids": [p.pid for p in served.procs] if served else []}
    try:
        systems = run_systems(a, data, out, split, served)
    finally:
        if served:
            served.stop()
    comp = comparisons(systems)
    val = None
    if a.validate:
        try:
            val = validate(a, systems, man, dhx, split, cpus,
                           out / "validate", out)
        except (RuntimeError, subprocess.TimeoutExpired, ValueError,
                KeyError) as e:
            val = {"error": str(e)}
            log(f"validate: failed: {e}")
    res = {"config": config_doc(a, split, cpus, distinct, need),
           "systems": systems, "comparisons": comp,
           "wall_s": time.monotonic() - t_all}
    if val is not None:
        res["validation"] = val
    write_and_print(a, res, out, split, cpus, distinct)
    ok = [n for n, m in systems.items() if m.get("status") == "ok"]
    return 0 if ok else 1
