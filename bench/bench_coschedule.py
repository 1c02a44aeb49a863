#!/usr/bin/python3
"""Co-scheduling live, side by side (issue 6; moved out of CI by issue 19
item 6: a timing comparison on a shared machine is a benchmark).

4 `datahelix consume` ranks on a heavy-tailed mixed set (6 S and 2 L
clips, L ~12x the decode, repeated under new ids), run against a real
Coordinator in two configurations that differ only in the plan and the
policy:
  least-request + none   the permutation cut in chunks (a
                         DistributedSampler) and the least-loaded server
  deadline + fixed       the token-balanced plan and deadline placement
Everything else is equal: a local DataServer per rank with one decode
worker that also takes remote work (`--listen`), 2 steps prefetched, the
same emulated GPU window.  The window is sized from this machine's decode
times with every CPU busy, so that a step's decode work needs about
1/LOAD of the CPUs; the data deadline is a tenth of the window.

Per configuration: DDL miss rate and input-wait p95 over all seeds of a
round, the median over rounds, and the ratio least-request / deadline;
beside them what `datahelix sim` predicts for the same set (its decode
times measured here), window and deadline, with --cpu-scale = workers /
CPUs (the property tests/integration/test_coschedule.py asserts).  Never
pass/fail.  Seen when this was a test: with this fixed (not
token-proportional) window a third seed's plan, whose windows held more
long clips than alternation can pair with short ones, missed more than
the random split; --seeds 1,2,3 shows it.
"""
import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RANKS, BATCH, WARMUP = 4, 2, 3
FRAMES, SIZE = "16", "224x224"
CONFIGS = (("least-request", "none"), ("deadline", "fixed"))


def cpus():
    return min(len(os.sched_getaffinity(0)), RANKS)


def make_set(dh, work, steps):
    """The clips, a manifest of one run's samples and the mean decode ms of
    a clip here with every CPU busy (per clip the fastest of cpus()
    processes, so another tenant's burst does not stretch the window)."""
    subprocess.run([dh, "gen-data", "--out", f"{work}/v", "--profiles",
                    "S,S,S,L", "--count", "8", "--seed", "5"], check=True,
                   capture_output=True)
    subprocess.run([dh, "probe", "--quiet", "--tokens", "qwen-vl", "--out",
                    f"{work}/p.jsonl", f"{work}/v"], check=True)
    with open(f"{work}/p.jsonl") as f:
        lines = f.read().splitlines()
    header = [x for x in lines if '"datahelix_header"' in x]
    rows = [json.loads(x) for x in lines if '"datahelix_header"' not in x]
    with open(f"{work}/m.jsonl", "w") as f:
        f.writelines(h + "\n" for h in header)
        for k in range((WARMUP + steps + 4) * RANKS * BATCH):
            f.write(json.dumps(dict(rows[k % len(rows)], id=k)) + "\n")
    subprocess.run([dh, "index", f"{work}/m.jsonl", "-o", f"{work}/m.dhx"],
                   check=True, capture_output=True)
    cmd = [dh, "decode", "--json", "--repeat", "5", "--frames", FRAMES,
           "--size", SIZE, *sorted(f"{work}/v/{x}"
                                   for x in os.listdir(f"{work}/v")
                                   if x.endswith(".mp4"))]
    ps = [subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
          for _ in range(cpus())]
    best = {}
    for p in ps:
        out, _ = p.communicate(timeout=300)
        if p.returncode:
            raise RuntimeError("datahelix decode failed")
        for x in out.splitlines():
            j = json.loads(x)
            if "decode_ms" in j:
                best[j["path"]] = min(best.get(j["path"], 1e9),
                                      j["decode_ms"])
    ms = [best[r["path"]] for r in rows]
    # The simulator's table: each clip's est_cpu_ms replaced by its decode
    # time measured here (what `datahelix bench --validate` does).
    with open(f"{work}/sim.jsonl", "w") as f:
        f.writelines(h + "\n" for h in header)
        for r in rows:
            f.write(json.dumps(dict(r, est_cpu_ms=best[r["path"]])) + "\n")
    return f"{work}/m.dhx", f"{work}/sim.jsonl", sum(ms) / len(ms)


def wait_for(path, seconds):
    end = time.monotonic() + seconds
    while not os.path.exists(path) and time.monotonic() < end:
        time.sleep(0.01)
    return os.path.exists(path)


def run_ranks(dh, work, manifest, policy, balance, window_ms, seed, steps):
    """One run: every measured (rank, step) input wait in ms."""
    tag = f"{policy}-{balance}-{seed}-{time.monotonic_ns()}"
    sock = f"{work}/{tag}.sock"
    coord = subprocess.Popen([dh, "coordinator", "--listen", f"ipc://{sock}",
                              "--policy", policy], stderr=subprocess.DEVNULL)
    procs = []
    try:
        if not wait_for(sock, 10):
            raise RuntimeError("coordinator did not start")
        for r in range(RANKS):
            procs.append(subprocess.Popen(
                [dh, "consume", "--coordinator", f"ipc://{sock}",
                 "--manifest", manifest, "--rank", str(r), "--world-size",
                 str(RANKS), "--batch-size", str(BATCH), "--json",
                 "--frames", FRAMES, "--size", SIZE, "--seed", str(seed),
                 "--steps", str(WARMUP + steps), "--prefetch", "2",
                 "--workers", "1", "--window-ms", f"{window_ms:.0f}",
                 "--balance", balance,
                 "--listen", f"ipc://{work}/{tag}-ds{r}.sock"],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        waits = []
        for p in procs:
            out, err = p.communicate(timeout=600)
            if p.returncode:
                raise RuntimeError(f"consume exited {p.returncode}: "
                                   f"{err[-2000:]}")
            for line in out.splitlines():
                j = json.loads(line)
                if "input_wait_ms" in j and j.get("step", 0) >= WARMUP:
                    waits.append(j["input_wait_ms"])
        return waits
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
        coord.terminate()
        try:
            coord.wait(timeout=5)
        except subprocess.TimeoutExpired:
            coord.kill()
            coord.wait(timeout=5)


def p95(xs):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(0.95 * len(xs)))]


def simulated(dh, table, window, ddl, seeds, steps):
    """`datahelix sim` of the same set, window and deadline: per system
    (miss, p95 ms), the mean over the seeds."""
    res = {"pool": [], "datahelix": []}
    for seed in seeds:
        p = subprocess.run(
            [dh, "sim", "--manifest", table, "--ranks", str(RANKS),
             "--local", str(RANKS), "--remote", "0", "--cores", "1",
             "--batch-size", str(BATCH), "--steps", str(steps), "--warmup",
             str(WARMUP), "--gpu-ms", f"{window / BATCH:.1f},0,0",
             "--ddl-ms", f"{ddl:.1f}", "--cpu-scale", str(RANKS / cpus()),
             "--systems", "pool,datahelix", "--seed", str(seed), "--json"],
            check=True, capture_output=True, text=True)
        agg = json.loads(p.stdout)["aggregate"]
        for s in res:
            res[s].append((agg[s]["ddl_miss_rate"],
                           agg[s]["input_wait_p95_s"] * 1e3))
    return {s: tuple(statistics.mean(x[i] for x in v) for i in range(2))
            for s, v in res.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "datahelix"))
    ap.add_argument("--seeds", default="1,2", help="plan seeds of a round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--load", type=float, default=1.2,
                    help="window / (a step's decode work per CPU)")
    ap.add_argument("--ddl-share", type=float, default=0.1)
    a = ap.parse_args()
    seeds = [int(x) for x in a.seeds.split(",")]
    with tempfile.TemporaryDirectory(prefix="bench-cosched-") as work:
        manifest, table, mean_ms = make_set(a.bin, work, a.steps)
        window = a.load * RANKS * BATCH * mean_ms / cpus()
        ddl = a.ddl_share * window
        rounds = {c: [] for c in CONFIGS}
        for _ in range(a.rounds):
            for policy, balance in CONFIGS:
                w = [x for seed in seeds
                     for x in run_ranks(a.bin, work, manifest, policy,
                                        balance, window, seed, a.steps)]
                rounds[policy, balance].append(
                    (sum(x > ddl for x in w) / len(w), p95(w)))
        sim = simulated(a.bin, table, window, ddl, seeds, a.steps)
    print(f"\n## co-scheduling live: {RANKS} ranks x batch {BATCH}, "
          f"{a.steps} measured steps x seeds {a.seeds}, median of "
          f"{a.rounds} rounds; window {window:.0f} ms, deadline {ddl:.0f} "
          f"ms (mean decode {mean_ms:.1f} ms, {cpus()} CPUs)\n")
    print("| configuration | DDL miss % | input-wait p95 ms | sim DDL miss % "
          "| sim p95 ms |")
    print("|---|---:|---:|---:|---:|")
    med = {}
    for (policy, balance), sim_name in zip(CONFIGS, ("pool", "datahelix")):
        r = rounds[policy, balance]
        med[policy] = (statistics.median(x[0] for x in r),
                       statistics.median(x[1] for x in r))
        print(f"| {policy} + {balance} | {100 * med[policy][0]:.1f} | "
              f"{med[policy][1]:.1f} | {100 * sim[sim_name][0]:.1f} | "
              f"{sim[sim_name][1]:.1f} |")
    lr, dl = med["least-request"], med["deadline"]
    ratio = (lambda x, y: f"{x / y:.2f}x" if y > 0 else "inf")
    print(f"\nleast-request / deadline: DDL miss {ratio(lr[0], dl[0])}, "
          f"input-wait p95 {ratio(lr[1], dl[1])} (> 1: co-scheduling "
          "waits less)")


if __name__ == "__main__":
    main()
