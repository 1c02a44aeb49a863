"""The paper's metrics (5.1), over the measured steps of all ranks:
throughput (samples/s), input-wait p50/p95, batch-ready p95 (request ->
ready: datahelix from its client telemetry; torch from the batch
sampler's hand-out to the worker's collate end; Dask from submit to the
last task's completion), DDL miss rate (the share of rank-steps whose
input wait exceeds --ddl-ms, default 1 ms: the batch was not ready when
the step began), cross-DS GB per 100 steps (datahelix telemetry
cross_ds_bytes; payload bytes a pool ships from its workers; 0 for
rank-local loaders), scheduler overhead (datahelix: the Coordinator's
decide_us per decision from its telemetry; n/a for the others); and
dh-ddl's ratios to native and dask-pool against the issue's targets.
"""
import json
import math
import os


def read_jsonl(path):
    out = []
    try:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line:
                    try:
                        out.append(json.loads(line))
                    except ValueError:
                        pass
    except OSError:
        pass
    return out


def pct(values, q):
    v = sorted(x for x in values if x is not None)
    if not v:
        return None
    if len(v) == 1:
        return v[0]
    k = (len(v) - 1) * q / 100.0
    lo = int(math.floor(k))
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def late_causes(results):
    """Why the late steps were late (the loaders' stats()["late"],
    docs/trace.md): counts by stage over every rank, warm-up included, and
    the worst step."""
    by, worst, total = {}, None, 0
    for res in results:
        st = res.get("stats") or {}
        total += st.get("late_steps", 0)
        for k, v in (st.get("late_by_stage") or {}).items():
            by[k] = by.get(k, 0) + v
        for e in st.get("late") or []:
            if worst is None or e["input_wait_ms"] > worst["input_wait_ms"]:
                worst = dict(e, rank=res["rank"])
    return {"steps": total, "by_stage": by, "worst": worst}


def tier2_summary(results):
    """dh-ddlb: the rounds of the bench's one Tier-2 group (every rank),
    from stats()["tier2"] (docs/rebalance.md): each rank counts the
    group's decisions, so every rank's figures are the group's - the
    lowest rank's are reported, with the ranks' agreement checked."""
    keys = ("rounds", "move", "keep", "unmeasured", "balanced", "uneven",
            "samples_moved", "bytes_moved")
    per = [(res.get("stats") or {}).get("tier2") or {}
           for res in sorted(results, key=lambda r: r["rank"])]
    out = {k: per[0].get(k, 0) for k in keys} if per else {}
    out["ranks_agree"] = all({k: t.get(k, 0) for k in keys} ==
                             {k: per[0].get(k, 0) for k in keys}
                             for t in per)
    for k in ("max_mean_before", "max_mean_after"):
        out[k] = per[0].get(k) if per and per[0].get("rounds") else None
    out["exchange_ms"] = max((t.get("exchange_ms", 0.0) for t in per),
                             default=0.0)
    return out


def metrics(name, results, a, sysdir, wall, split):
    W, N = a.warmup, a.steps
    recs = []
    for res in results:
        r = res["rank"]
        tel = {}
        if name.startswith("dh-"):
            for t in read_jsonl(sysdir / f"telemetry-rank{r}.jsonl"):
                tel[t.get("step")] = t
        for s in res["steps"]:
            if s["step"] < W:
                continue
            s = dict(s, rank=r)
            t = tel.get(s["step"])
            if t is not None:
                s["ready_ms"] = t.get("ready_latency_ms")
                s["cross_bytes"] = t.get("cross_ds_bytes", 0)
            else:
                s["cross_bytes"] = s.get("payload_bytes", 0)
            recs.append(s)
    if not recs:
        return {"status": "failed", "reason": "no measured steps"}
    t0 = min(s["t0"] for s in recs)
    t1 = max(s["t_end"] for s in recs)
    samples = sum(s["samples"] for s in recs)
    waits = [s["wait_ms"] for s in recs]
    ready = [s["ready_ms"] for s in recs if s.get("ready_ms") is not None]
    cross = sum(s["cross_bytes"] or 0 for s in recs)
    m = {
        "status": "ok",
        "throughput_samples_per_s": samples / (t1 - t0),
        "input_wait_p50_ms": pct(waits, 50),
        "input_wait_p95_ms": pct(waits, 95),
        "batch_ready_p95_ms": pct(ready, 95) if ready else None,
        "ddl_miss_rate": sum(1 for w in waits if w > a.ddl_ms) / len(waits),
        "miss_rate_over_10ms": sum(1 for w in waits if w > 10) / len(waits),
        "step_miss_rate": None,
        "cross_ds_gb_per_100_steps": cross / 1e9 / N * 100,
        "scheduler_overhead_us": None,
        "scheduler_decisions": None,
        "step_ms_p50": pct([s["step_ms"] for s in recs], 50),
        "sync_wait_p95_ms": pct([s["sync_ms"] for s in recs], 95),
        "window_ms_mean": sum(s["window_ms"] for s in recs) / len(recs),
        "measured_steps": N, "ranks": a.ranks, "samples": samples,
        "decode_workers": sum(split), "wall_s": wall,
    }
    # A global step missed if any rank waited.
    by_step = {}
    for s in recs:
        by_step[s["step"]] = by_step.get(s["step"], False) or \
            s["wait_ms"] > a.ddl_ms
    m["step_miss_rate"] = sum(by_step.values()) / len(by_step)
    gm = [r["gpu"] for r in results if r.get("gpu")]
    if gm:
        m["gpu_model"] = gm[0]
    if name.startswith("dh-"):
        dec = [d["decide_us"] for d in read_jsonl(sysdir / "coordinator.jsonl")
               if "decide_us" in d]
        if dec:
            m["scheduler_overhead_us"] = sum(dec) / len(dec)
            m["scheduler_decisions"] = len(dec)
            m["scheduler_overhead_us_p95"] = pct(dec, 95)
    if name.startswith("dh-"):
        m["late"] = late_causes(results)
    if name == "dh-ddlb":  # what the exchange moved is cross-DS traffic
        m["tier2"] = tier2_summary(results)
        m["cross_ds_gb_per_100_steps"] += \
            m["tier2"].get("bytes_moved", 0) / 1e9 / N * 100
    m.update(ceiling(m, results, sysdir, len(os.sched_getaffinity(0))))
    m["per_rank_wait"] = {str(r): [(s["step"], s["wait_ms"]) for s in recs
                                   if s["rank"] == r]
                          for r in range(a.ranks)}
    return m


def ceiling(m, results, sysdir, cores):
    """The run's physical limit and the system's share of it (issue 21):
    the lower of the CPU decode capacity - cores / the decode CPU a sample
    took in this run (the account's decode seconds over every sample the
    ranks took, warm-up included) - and the GPU window's rate (the samples
    of a step over its mean window).  And the CPU account itself."""
    try:
        acct = json.loads((sysdir / "cpu.json").read_text())
    except (OSError, ValueError):
        acct = None
    taken = sum(s["samples"] for r in results for s in r["steps"])
    steps = m["measured_steps"]
    win = m["window_ms_mean"]
    gpu = m["samples"] / steps / (win / 1e3) if steps and win > 0 else None
    dec = acct.get("decode") if acct else None
    cpu_ms = 1e3 * dec / taken if dec and taken else None
    cpu = cores / (cpu_ms / 1e3) if cpu_ms else None
    bounds = [(v, k) for v, k in ((cpu, "cpu"), (gpu, "gpu")) if v]
    top, bound = min(bounds) if bounds else (None, None)
    return {"cpu_account": acct, "cores": cores,
            "decode_cpu_ms_per_sample": cpu_ms,
            "cpu_rate_samples_per_s": cpu,
            "window_rate_samples_per_s": gpu,
            "ceiling_samples_per_s": top, "ceiling_bound": bound,
            "ceiling_share": ratio(m["throughput_samples_per_s"], top)}


def ratio(x, y):
    if x is None or y is None or y == 0:
        return None
    return x / y


def comparisons(systems):
    """dh-ddl against native and dask-pool, and the issue's targets."""
    dh = systems.get("dh-ddl", {})
    out = {}
    for peer in ("native", "dask-pool"):
        p = systems.get(peer, {})
        if dh.get("status") != "ok" or p.get("status") != "ok":
            continue
        c = {
            "throughput_x": ratio(dh["throughput_samples_per_s"],
                                  p["throughput_samples_per_s"]),
            "input_wait_p95_change": change(dh["input_wait_p95_ms"],
                                            p["input_wait_p95_ms"]),
            "ddl_miss_change": change(dh["ddl_miss_rate"],
                                      p["ddl_miss_rate"]),
            "batch_ready_p95_change": change(dh["batch_ready_p95_ms"],
                                             p["batch_ready_p95_ms"]),
        }
        if peer == "native":
            c["targets"] = {
                "ddl_miss_-70%": met(c["ddl_miss_change"], lambda v: v <= -0.70),
                "input_wait_p95_-90%": met(c["input_wait_p95_change"],
                                           lambda v: v <= -0.90),
                "throughput_1.3x": met(c["throughput_x"], lambda v: v >= 1.3),
            }
        else:
            c["targets"] = {
                "throughput_1.2x": met(c["throughput_x"], lambda v: v >= 1.2),
                "lower_ddl_miss": dh["ddl_miss_rate"] < p["ddl_miss_rate"],
            }
        out[f"dh-ddl_vs_{peer}"] = c
    return out


def change(x, y):
    """Relative change of x against y (-0.7 = 70 % lower)."""
    if x is None or y is None:
        return None
    if y == 0:
        return 0.0 if x == 0 else None
    return x / y - 1.0


def met(v, test):
    return None if v is None else bool(test(v))
