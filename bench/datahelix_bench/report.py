"""What a run prints and writes: the per-system table (table.md, the
terminal), dh-ddl's comparisons, the validation table, and with --plots
throughput.png, miss_rate.png and input_wait_timeline.png.
"""
from .common import log
from .metrics import ratio


def fmt(v, spec, none="n/a"):
    return none if v is None else format(v, spec)


def table(systems, a):
    nat = systems.get("native", {})
    base = nat.get("throughput_samples_per_s") if nat.get("status") == "ok" \
        else None
    lines = ["| system | samples/s | vs native | input-wait p50 / p95 ms | "
             "batch-ready p95 ms | DDL miss (rank-steps) | steps with a miss | "
             "cross-DS GB / 100 steps | sched. µs / decision | step p50 ms |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name in a.systems:
        m = systems.get(name, {})
        if m.get("status") != "ok":
            lines.append(f"| {name} | {m.get('status', '?')}: "
                         f"{m.get('reason', '')} |||||||||")
            continue
        tp = m["throughput_samples_per_s"]
        lines.append(
            f"| {name} | {tp:.2f} | "
            f"{fmt(ratio(tp, base), '.2f')}{'×' if base else ''} | "
            f"{m['input_wait_p50_ms']:.1f} / {m['input_wait_p95_ms']:.1f} | "
            f"{fmt(m['batch_ready_p95_ms'], '.0f')} | "
            f"{100 * m['ddl_miss_rate']:.1f} % | "
            f"{100 * m['step_miss_rate']:.1f} % | "
            f"{m['cross_ds_gb_per_100_steps']:.2f} | "
            f"{fmt(m['scheduler_overhead_us'], '.2f')} | "
            f"{m['step_ms_p50']:.0f} |")
    return "\n".join(lines)


def ceiling_table(systems, a):
    """Each system's ceiling and share, and where its CPU went."""
    from .cpuacct import KINDS
    lines = ["| system | samples/s | ceiling (bound) | share | decode CPU "
             "ms / sample | " + " | ".join(f"{k} s" for k in KINDS) +
             " | sum s | getrusage s | outside the run s |",
             "|---|---:|---:|---:|---:|" + "---:|" * (len(KINDS) + 3)]
    for name in a.systems:
        m = systems.get(name, {})
        if m.get("status") != "ok":
            continue
        acct = m.get("cpu_account") or {}
        top = m.get("ceiling_samples_per_s")
        share = m.get("ceiling_share")
        lines.append(
            f"| {name} | {m['throughput_samples_per_s']:.2f} | "
            f"{fmt(top, '.2f')} ({m.get('ceiling_bound') or 'n/a'}) | "
            f"{fmt(None if share is None else 100 * share, '.0f')} % | "
            f"{fmt(m.get('decode_cpu_ms_per_sample'), '.1f')} | " +
            " | ".join(fmt(acct.get(k), '.1f') for k in KINDS) +
            f" | {fmt(acct.get('total_s'), '.1f')} | "
            f"{fmt(acct.get('usage_total_s'), '.1f')} | "
            f"{fmt(acct.get('outside_run_s'), '.1f')} |")
    return "\n".join(lines)


def comparison_text(comp):
    out = []
    for key, c in comp.items():
        peer = key.split("_vs_")[1]
        tg = ", ".join(f"{k}: {'met' if v else 'not met' if v is not None else 'n/a'}"
                       for k, v in c["targets"].items())
        out.append(
            f"dh-ddl vs {peer}: throughput {fmt(c['throughput_x'], '.2f')}×, "
            f"input-wait p95 {pct_change(c['input_wait_p95_change'])}, "
            f"DDL miss {pct_change(c['ddl_miss_change'])}, "
            f"batch-ready p95 {pct_change(c['batch_ready_p95_change'])} "
            f"({tg})")
    return "\n".join(out)


def late_text(systems):
    """One line per datahelix system: why its late steps were late."""
    out = []
    for name, m in systems.items():
        late = m.get("late") if isinstance(m, dict) else None
        if not late or not late.get("steps"):
            continue
        by = ", ".join(f"{k} {v}" for k, v in sorted(
            late["by_stage"].items(), key=lambda kv: -kv[1]))
        line = f"{name}: {late['steps']} late steps by cause: {by}"
        w = late.get("worst")
        if w:
            line += (f"; worst: rank {w['rank']} step {w['step']} waited "
                     f"{w['input_wait_ms']:.0f} ms: {w['stage']} "
                     f"{w['stage_ms']:.0f} ms")
            if w.get("sample") is not None:
                line += f" of sample {w['sample']} ({w['path']})"
            line += f" on server {w['server']}"
        out.append(line)
    return "\n".join(out)


def pct_change(v):
    return "n/a" if v is None else f"{100 * v:+.0f} %"


def validation_table(v):
    if not v:
        return ""
    out = ["| live system | sim system | hand-over: CPU ms / sample, next() "
           "ms | samples/s live | sim | sim vs live "
           "| input-wait p95 ms live / sim | DDL miss live / sim "
           "| batch-ready p95 ms live / sim |",
           "|---|---|---|---:|---:|---:|---|---|---|"]
    for n, r in v["systems"].items():
        h = v.get("handover", {}).get(n)
        hand = f"{h['cpu_ms']:.1f}, {h['next_ms']:.1f}" if h else "n/a"
        d = r["throughput_diff"]
        ok = ("" if r["within_tolerance"] else
              f" (over {100 * v['tolerance']:g} %)")
        ready = r["live_ready_p95_ms"]
        out.append(
            f"| {n} | {r['sim_system']} | {hand} | "
            f"{r['live_throughput']:.2f} | "
            f"{r['sim_throughput']:.2f} | "
            f"{fmt(None if d is None else 100 * d, '+.1f')} %{ok} | "
            f"{r['live_input_wait_p95_ms']:.1f} / "
            f"{r['sim_input_wait_p95_ms']:.1f} | "
            f"{100 * r['live_ddl_miss_rate']:.1f} / "
            f"{100 * r['sim_ddl_miss_rate']:.1f} % | "
            f"{fmt(ready, '.0f')} / {r['sim_ready_p95_ms']:.0f} |")
    return "\n".join(out)


def plots(systems, a, out):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        log(f"--plots: matplotlib is not importable ({e}); no plots "
            "(scripts/setup-deps.sh bench installs python3-matplotlib)")
        return []
    ok = [n for n in a.systems if systems.get(n, {}).get("status") == "ok"]
    if not ok:
        return []
    files = []
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.bar(ok, [systems[n]["throughput_samples_per_s"] for n in ok])
    ax.set_ylabel("samples/s")
    ax.set_title(f"throughput, {a.ranks} ranks, {a.workers}-CPU budget, "
                 f"{a.workload}/{a.model}")
    ax.tick_params(axis="x", rotation=30)
    fig.tight_layout()
    files.append(out / "throughput.png")
    fig.savefig(files[-1])
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(8, 4))
    ax.bar(ok, [100 * systems[n]["ddl_miss_rate"] for n in ok])
    ax.set_ylabel("DDL miss rate, % of rank-steps")
    ax.set_title(f"DDL misses (input wait > {a.ddl_ms:g} ms)")
    ax.tick_params(axis="x", rotation=30)
    fig.tight_layout()
    files.append(out / "miss_rate.png")
    fig.savefig(files[-1])
    plt.close(fig)

    fig, axes = plt.subplots(len(ok), 1, figsize=(9, 2.2 * len(ok)),
                             sharex=True, squeeze=False)
    for ax, n in zip(axes[:, 0], ok):
        for r, pts in sorted(systems[n]["per_rank_wait"].items()):
            ax.plot([p[0] for p in pts], [p[1] for p in pts],
                    label=f"rank {r}", lw=1)
        ax.set_ylabel("wait ms")
        ax.set_title(n, fontsize=9)
    axes[-1, 0].set_xlabel("step")
    axes[0, 0].legend(fontsize=7, ncol=min(a.ranks, 8))
    fig.tight_layout()
    files.append(out / "input_wait_timeline.png")
    fig.savefig(files[-1])
    plt.close(fig)
    return files
