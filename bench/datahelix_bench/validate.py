"""--validate: the run just made, simulated with `datahelix sim` and set
against the live systems (native, pool against dask-pool, datahelix
against dh-ddl): the clips' decode times measured here, each system
replaying its own live split, with its hand-over measured apart by
bench/calibrate_handover.py (docs/sim.md "Validation against the live
system").
"""
import json
import pathlib
import subprocess
import sys

from .common import HERE
from .window import sim_gpu_ms


# live system -> the simulator's model of it
SIM_OF = {"native": "native", "dask-pool": "pool", "dh-ddl": "datahelix"}


VALIDATE_TOLERANCE = 0.15  # issue 7: throughput within 15 %


def live_order(a, rank_files):
    """The manifest rows in the order a live system's ranks took them, from
    their step records: row ((k R + r) B + j) is rank r's j-th sample of
    step k, the layout `datahelix sim --replay-order` splits by.  None when
    a step did not hold B samples (nothing to replay exactly)."""
    per = [json.loads(pathlib.Path(f).read_text())["steps"]
           for f in rank_files]
    order = []
    for k in range(min(len(x) for x in per)):
        for steps in per:
            ids = steps[k].get("ids")
            if ids is None or len(ids) != a.batch_size:
                return None
            order += ids
    return order


def clip_decode_ms(a, paths):
    """{path: this machine's decode ms} (`datahelix decode`, median of 3,
    the run's frames and size)."""
    r = subprocess.run([a.bin, "decode", "--json", "--repeat", "3",
                        "--frames", str(a.frames), "--size",
                        f"{a.size[0]}x{a.size[1]}", *paths],
                       capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f"decode: {r.stderr.strip()[-300:]}")
    ms = {}
    for x in r.stdout.splitlines():
        j = json.loads(x)
        if "decode_ms" in j:
            ms[j["path"]] = j["decode_ms"]
    missing = [p for p in paths if p not in ms]
    if missing:
        raise RuntimeError(f"decode: no time for {missing[0]}")
    return ms


def measured_manifest(header, rows, ms, order, f):
    """The run's manifest (its header lines and rows) into f with
    est_cpu_ms replaced by each clip's measured decode ms (the simulator
    then costs what the live run cost), its rows in `order` (row ids) when
    given: the live split, replayed.  On a small set a few long clips on
    one rank move throughput by +-15 %, so only the live split compares
    like for like."""
    if order is not None:
        rows = [rows[i] for i in order]
    with open(f, "w") as w:
        for x in header:
            w.write(x + "\n")
        for pos, row in enumerate(rows):  # ids dense again, in order
            w.write(json.dumps(dict(row, id=pos, live_id=row["id"],
                                    est_cpu_ms=ms[row["path"]])) + "\n")
    return f


def dh_ready_sleep_ms(a, split, cpus, max_ms):
    """How long a datahelix rank sleeps before timing next() so that its
    batch is ready: two of its batches' decode of the longest clips, on
    the CPU share its decode gets beside the calibration's load streams
    (one per worker of the run), 10 s at most.  Without the share (a flat
    2 s cap), on 1 CPU a batch of two L clips took ~2.8 s among five
    decoders and next() measured the decode: 190 ms "on a ready batch"."""
    share = max(1.0, (sum(split) + 1) / max(1, len(cpus)))
    return min(10000.0, 100 + 2 * a.batch_size * max_ms * share)


def calibrate_handover(a, names, man, index, split, ms, out, cpus):
    """Each live system's hand-over, measured apart from the run by
    calibrate_handover.py (the same sources; the CPU beyond decode with
    the run's clips decoded by the run's ranks, each clip's decode alone
    taken from `ms`; next() on a ready batch under the other ranks'
    decode load): {name: {"cpu_ms", "next_ms", ...}}."""
    msf = out / "decode_ms.json"
    msf.write_text(json.dumps(ms))
    max_ms = max(ms.values())
    cmd = [sys.executable, str(HERE / "calibrate_handover.py"), "--json",
           "--frames", str(a.frames), "--size", f"{a.size[0]}x{a.size[1]}",
           "--batch-size", str(a.batch_size), "--workers-per-rank",
           str(max(split)), "--workers-total", str(sum(split)),
           "--prefetch", str(a.prefetch), "--systems", ",".join(names),
           "--index", str(index), "--load-clips", str(man), "--bin", a.bin,
           "--ranks", str(a.ranks), "--decode-ms", str(msf),
           "--dh-ready-sleep-ms",
           f"{dh_ready_sleep_ms(a, split, cpus, max_ms):.0f}"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        raise RuntimeError(f"calibrate_handover: {r.stderr.strip()[-300:]}")
    return json.loads(r.stdout)


def handover_arg(sim, terms):
    """`datahelix sim --handover SIM=A,B,C,D` for the four terms."""
    return ["--handover", f"{sim}=" + ",".join(f"{x:.6g}" for x in terms)]


def handover_args(cal):
    """--handover for the simulator from a calibration: per sample CPU and
    next() per batch, at the run's (fixed) sample size, so the per-MB
    terms are 0."""
    out = []
    for n, c in cal.items():
        out += handover_arg(SIM_OF[n], (c["cpu_ms"], 0, c["next_ms"], 0))
    return out


def validate(a, systems, man, index, split, cpus, out, live_dir):
    """Simulates the live configuration, each system replaying its own live
    split (its ranks' step records in live_dir) with its hand-over
    measured apart (calibrate_handover.py), and compares, system by
    system.  None when no comparable live system ran."""
    live = {n: systems[n] for n in SIM_OF
            if systems.get(n, {}).get("status") == "ok"}
    if not live:
        return None
    out.mkdir(parents=True, exist_ok=True)
    lines = pathlib.Path(man).read_text().splitlines()
    header = [x for x in lines if '"datahelix_header"' in x]
    rows_all = [json.loads(x) for x in lines
                if '"datahelix_header"' not in x]
    ms = clip_decode_ms(a, sorted({r["path"] for r in rows_all}))
    mean_ms = sum(ms[r["path"]] for r in rows_all) / len(rows_all)
    cal = calibrate_handover(a, list(live), man, index, split, ms, out,
                             cpus)
    # CPUs shared by more workers than there are CPUs: each worker runs at
    # CPUs / workers of full speed when all are busy (the model's servers
    # own their cores).
    scale = max(1.0, sum(split) / len(cpus))
    rows, cmds = {}, {}
    for n, m in live.items():
        order = live_order(a, [live_dir / n / f"rank{r}.json"
                               for r in range(a.ranks)])
        simman = measured_manifest(header, rows_all, ms, order,
                                   out / f"sim-{n}.jsonl")
        cmd = [a.bin, "sim", "--manifest", str(simman), "--ranks",
               str(a.ranks), "--local", str(a.ranks), "--remote", "0",
               "--cores", str(round(sum(split) / a.ranks)), "--batch-size",
               str(a.batch_size), "--steps", str(a.steps), "--warmup",
               str(a.warmup), "--prefetch", str(a.prefetch), "--ddl-ms",
               str(a.ddl_ms), "--cpu-scale", f"{scale:g}", "--noise", "0.1",
               "--gpu-ms", ",".join(f"{x:.9g}" for x in sim_gpu_ms(a)),
               "--seed", str(a.seed + 1),
               *(["--replay-order"] if order is not None else []),
               "--systems", SIM_OF[n], *handover_args({n: cal[n]}), "--json"]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            raise RuntimeError(f"sim: {r.stderr.strip()[-300:]}")
        cmds[n] = cmd
        s = json.loads(r.stdout)["aggregate"][SIM_OF[n]]
        t_live, t_sim = m["throughput_samples_per_s"], s["throughput"]
        rows[n] = {
            "sim_system": SIM_OF[n],
            "live_throughput": t_live, "sim_throughput": t_sim,
            "throughput_diff": t_sim / t_live - 1 if t_live else None,
            "live_input_wait_p95_ms": m["input_wait_p95_ms"],
            "sim_input_wait_p95_ms": 1000 * s["input_wait_p95_s"],
            "live_ddl_miss_rate": m["ddl_miss_rate"],
            "sim_ddl_miss_rate": s["ddl_miss_rate"],
            "live_ready_p95_ms": m.get("batch_ready_p95_ms"),
            "sim_ready_p95_ms": 1000 * s["ready_p95_s"],
        }
        d = rows[n]["throughput_diff"]
        rows[n]["within_tolerance"] = (d is not None and
                                       abs(d) <= VALIDATE_TOLERANCE)
        rows[n]["replayed_split"] = order is not None
    return {"commands": cmds, "cpu_scale": scale,
            "mean_decode_ms": mean_ms, "tolerance": VALIDATE_TOLERANCE,
            "handover": cal, "systems": rows}
