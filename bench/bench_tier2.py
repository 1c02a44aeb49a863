#!/usr/bin/python3
"""Tier 2 live (issue 17 "Benchmarks"; docs/rebalance.md "Live"): the
training step's time p50/p95 and the cross-DS GB per 100 steps with Tier 2
off and on, on a mix whose estimates are wrong and on one whose estimates
are right.  Never pass/fail.

4 ranks under torchrun (gloo, CPU), each a datahelix.DataLoader over the
same generated set (S clips, --frames x --side^2, batch 2), each step:
next(), then the GPU step of the rank's batch, --us-per-token per true
token, then an all_reduce (the gradient sync: the step lasts as long as
its slowest rank).  The GPU step is emulated as `datahelix bench`
emulates its window (--step gpu, the default: a wait that burns no CPU,
as a real GPU step leaves the cores to decode), or, --step busy, as
busy compute on the CPU (torch.mm on one thread, its count calibrated on
this rank's CPU clock, so the work is fixed whatever the load: 4 ranks'
compute and the decode then share the 2 cores, a CPU-bound job, not a
GPU one).  Rank 0's time between consecutive all_reduce returns is the
step time, the first step of an epoch timed from iter(); every step is
counted but a run's very first (the loader's start).

  * wrong estimates: the manifest's estimates (and so Tier 1's plan) say
    every clip costs the same; the truth, which feature_fn gives Tier 2
    (as a user's model knows its text tokens), is that ids divisible by 4
    cost 20x.  Tier 1 cannot see it, Tier 2 can.
  * right estimates: every clip costs what the plan thinks (the same, the
    wrong mix's mean, so both mixes are the same work): Tier 2 gathers
    features each round and finds nothing worth moving; what it costs is
    its round buffer and its all-gather.

The four runs (mix x off/on) are interleaved, --reps times, in one job;
step times are pooled over the repeats.  Tier 2's per-round verdicts,
bytes moved and max/mean before/after come from stats()["tier2"]; the
cross-DS bytes are stats()["cross_ds_bytes"] summed over the ranks (a
rank's counts the samples Tier 2 brought it: the group's bytes moved).

Usage: bench_tier2.py [--bin build/datahelix] [--reps 2] [--json]
"""
import argparse
import json
import os
import pathlib
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
RUNS = [("wrong", "off"), ("wrong", "on"), ("right", "off"),
        ("right", "on")]
BIG, SMALL = 20000, 1000  # true tokens of a heavy / an ordinary clip
EVEN = (BIG + 3 * SMALL) / 4  # the right mix's: the same work in all


def truth(mix, i):
    if mix == "right":
        return EVEN
    return BIG if i % 4 == 0 else SMALL


def pct(xs, q):
    xs = sorted(xs)
    if not xs:
        return float("nan")
    k = min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))
    return xs[k]


# ---- one rank (under torchrun) -------------------------------------------

class Burn:
    """Busy compute of a fixed amount of CPU work: `n` torch.mm of 64x64
    on one thread, n from this rank's CPU clock (time.thread_time, so that
    the other ranks' load does not change the calibration)."""

    def __init__(self, torch):
        torch.set_num_threads(1)
        self.a = torch.rand(64, 64)
        self.b = torch.rand(64, 64)
        self.torch = torch
        for _ in range(50):  # warm
            torch.mm(self.a, self.b)
        t0, n = time.thread_time(), 0
        while time.thread_time() - t0 < 0.2:
            for _ in range(100):
                torch.mm(self.a, self.b)
            n += 100
        self.us_per_mm = (time.thread_time() - t0) * 1e6 / n

    def __call__(self, us):
        for _ in range(max(0, round(us / self.us_per_mm))):
            self.torch.mm(self.a, self.b)


def rank_main(a):
    import warnings

    import torch
    import torch.distributed as dist
    sys.path.insert(0, str(ROOT / "python"))
    import datahelix
    warnings.simplefilter("ignore")  # est_tokens of another sampling
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if a.step == "busy":
        burn = Burn(torch)
        out = {"us_per_mm": burn.us_per_mm, "runs": []}
    else:  # the GPU's time: the cores stay free for decode
        def burn(us):
            time.sleep(us / 1e6)
        out = {"runs": []}
    for rep in range(a.reps):
        for mix, t2 in RUNS:
            lb = None
            if t2 == "on":
                lb = {"feature_fn":
                      lambda s, mix=mix: {"tokens": truth(mix, s["id"])},
                      "buffer_size": a.buffer}
            loader = datahelix.DataLoader(
                a.manifest, batch_size=2, frames=a.frames,
                size=(a.side, a.side), timeout=120, load_balance=lb)
            steps, waits, n_steps = [], [], 0
            for epoch in range(a.epochs):
                loader.set_epoch(epoch)
                prev = time.perf_counter()  # the first step from iter()
                it = iter(loader)
                while True:
                    t_in = time.perf_counter()
                    try:
                        b = next(it)
                    except StopIteration:
                        break
                    got = time.perf_counter()
                    tok = sum(truth(mix, i) for i in b["ids"].tolist())
                    burn(tok * a.us_per_token)
                    dist.all_reduce(torch.tensor([float(tok)]))
                    now = time.perf_counter()
                    if epoch or n_steps:  # not the loader's start
                        steps.append((now - prev) * 1e3)
                        waits.append((got - t_in) * 1e3)
                    prev = now
                    n_steps += 1
                    del b
            st = loader.stats()
            loader.close()
            t = st.get("tier2") or {}
            out["runs"].append({
                "rep": rep, "mix": mix, "tier2": t2, "step_ms": steps,
                "wait_ms": waits,
                "steps": n_steps, "cross_ds_bytes": st["cross_ds_bytes"],
                "tier2_stats": {k: t[k] for k in (
                    "rounds", "move", "keep", "balanced", "unmeasured",
                    "uneven", "bytes_moved", "samples_moved",
                    "exchange_ms", "max_mean_before", "max_mean_after",
                    "ms_per_token", "bandwidth_bytes_per_ms")
                    if k in t}})
            dist.barrier()
    with open(os.path.join(a.out, f"rank{rank}.json"), "w") as f:
        json.dump(out, f)
    dist.destroy_process_group()


# ---- the driver ------------------------------------------------------------

def dataset(bin_, d, clips, copies):
    def run(*args):
        p = subprocess.run([bin_, *map(str, args)], capture_output=True,
                           text=True, timeout=600)
        if p.returncode:
            sys.exit(f"bench_tier2: datahelix {args[0]} failed:\n"
                     f"{p.stderr[-2000:]}")
    run("gen-data", "--out", d / "videos", "--profiles", "S", "--count",
        clips, "--seed", 11)
    run("probe", "--out", d / "p.jsonl", d / "videos")
    # each file `copies` times (ids c * clips + id): epochs of many steps
    # from few files, so that an epoch's start (its first round) is not
    # what the step times' p95 measures
    lines = (d / "p.jsonl").read_text().splitlines()
    head, rows = lines[0], [json.loads(x) for x in lines[1:] if x.strip()]
    with open(d / "m.jsonl", "w") as f:
        f.write(head + "\n")
        for c in range(copies):
            for r in rows:
                f.write(json.dumps(dict(r, id=c * len(rows) + r["id"])) +
                        "\n")
    return d / "m.jsonl"


def quiet_port(span=8):
    """A port P below the ephemeral range (32768 on) with P .. P + span
    free: the loaders' Coordinators listen on MASTER_PORT + 1 + i, and a
    job's own outgoing connections (gloo opens many) take ephemeral ports
    that could be those.  (test_rebalance.py uses this one too.)"""
    import random
    for _ in range(200):
        p = random.randrange(20000, 32000 - span)
        try:
            for q in range(p, p + span + 1):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", q))
            return p
        except OSError:
            continue
    raise RuntimeError("no free port block below 32000")


def summarize(ranks):
    rows = {}
    for run in RUNS:
        mix, t2 = run
        mine = [r for r in ranks[0]["runs"]
                if (r["mix"], r["tier2"]) == run]
        steps = [x for r in mine for x in r["step_ms"]]
        waits = [x for r in mine for x in r["wait_ms"]]
        n = sum(r["steps"] for r in mine)
        # every rank's: its loader counts the samples Tier 2 brought it
        xds = sum(r["cross_ds_bytes"] for rk in ranks for r in rk["runs"]
                  if (r["mix"], r["tier2"]) == run)
        t = {}
        for r in mine:
            for k, v in r["tier2_stats"].items():
                t.setdefault(k, []).append(v)
        rows[run] = {
            "steps_timed": len(steps), "p50_ms": pct(steps, 0.5),
            "p95_ms": pct(steps, 0.95), "mean_ms": statistics.fmean(steps)
            if steps else float("nan"), "wait_p50_ms": pct(waits, 0.5),
            "wait_p95_ms": pct(waits, 0.95),
            "cross_ds_gb_per_100_steps": xds / max(1, n) * 100 / 1e9,
            "tier2": {k: (sum(v) if k in ("rounds", "move", "keep",
                                          "balanced", "unmeasured",
                                          "uneven", "bytes_moved",
                                          "samples_moved", "exchange_ms")
                          else statistics.fmean(v)) for k, v in t.items()}}
    return rows


def report(rows, a, secs):
    print(f"Tier 2 live: 4 ranks (gloo), {a.clips} S clips, batch 2 x "
          f"{a.frames} x {a.side}^2, {a.step} step {a.us_per_token} us a "
          f"true token, {a.epochs} epochs of {a.clips * a.copies // 8} steps "
          f"({a.clips} files x {a.copies}) x {a.reps} reps, {secs:.0f} s")
    print(f"{'mix':<7}{'tier2':<7}{'steps':>6}{'p50 ms':>9}{'p95 ms':>9}"
          f"{'mean ms':>9}{'wait p50/p95':>14}{'GB/100 st':>11}{'moves':>7}"
          f"{'max/mean':>14}")
    for (mix, t2), r in rows.items():
        t = r["tier2"]
        mm = (f"{t['max_mean_before']:.2f}->{t['max_mean_after']:.2f}"
              if t else "")
        print(f"{mix:<7}{t2:<7}{r['steps_timed']:>6}{r['p50_ms']:>9.1f}"
              f"{r['p95_ms']:>9.1f}{r['mean_ms']:>9.1f}"
              f"{r['wait_p50_ms']:>7.1f}/{r['wait_p95_ms']:<6.1f}"
              f"{r['cross_ds_gb_per_100_steps']:>11.4f}"
              f"{t.get('move', 0) if t else '':>7}{mm:>14}")
    for mix in ("wrong", "right"):
        off, on = rows[(mix, "off")], rows[(mix, "on")]
        print(f"{mix} estimates: Tier 2 on/off p50 "
              f"{on['p50_ms'] / off['p50_ms']:.2f}x, p95 "
              f"{on['p95_ms'] / off['p95_ms']:.2f}x "
              f"({(on['p95_ms'] / off['p95_ms'] - 1) * 100:+.1f} %)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default=str(ROOT / "build" / "datahelix"))
    ap.add_argument("--clips", type=int, default=128, help="files made")
    ap.add_argument("--copies", type=int, default=4,
                    help="samples per file in the manifest")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--frames", type=int, default=4)
    ap.add_argument("--side", type=int, default=112)
    ap.add_argument("--buffer", type=int, default=8,
                    help="Tier 2's buffer_size (samples a rank holds)")
    ap.add_argument("--us-per-token", type=float, default=10.0)
    ap.add_argument("--step", choices=("gpu", "busy"), default="gpu",
                    help="the emulated GPU step: a wait (gpu) or CPU work")
    ap.add_argument("--timeout", type=float, default=1200)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--rank-main", action="store_true",
                    help=argparse.SUPPRESS)
    ap.add_argument("--manifest", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.rank_main:
        return rank_main(a)
    if a.epochs < 1 or a.copies < 1 or a.clips < 8:
        ap.error("--epochs and --copies >= 1, --clips >= 8")
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="dh-bench-tier2-") as tmp:
        d = pathlib.Path(tmp)
        print(f"bench_tier2: generating {a.clips} clips ...", flush=True)
        manifest = dataset(a.bin, d, a.clips, a.copies)
        env = dict(os.environ, DATAHELIX_BIN=os.path.abspath(a.bin))
        try:
            port = quiet_port()
        except RuntimeError as e:
            sys.exit(f"bench_tier2: {e}")
        cmd = [sys.executable, "-m", "torch.distributed.run",
               "--nproc_per_node", "4", "--redirects", "1", "--tee", "1",
               "--master_port", str(port), __file__, "--rank-main",
               "--manifest", str(manifest), "--out", tmp]
        for k in ("reps", "frames", "side", "buffer", "epochs",
                  "us_per_token", "step"):
            cmd += [f"--{k.replace('_', '-')}", str(getattr(a, k))]
        print("bench_tier2: 4 ranks, 4 runs x "
              f"{a.reps} ...", flush=True)
        # its own session: on a timeout, torchrun and its ranks end by
        # their process group (the loaders' services end with them)
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env,
                             start_new_session=True)
        try:
            _, err = p.communicate(timeout=a.timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.communicate(timeout=30)
            sys.exit(f"bench_tier2: the job ran past {a.timeout:.0f} s")
        if p.returncode:
            sys.exit(f"bench_tier2: the job failed:\n{err[-4000:]}")
        ranks = [json.loads((d / f"rank{r}.json").read_text())
                 for r in range(4)]
    rows = summarize(ranks)
    if a.json:
        print(json.dumps({f"{m}/{t}": r for (m, t), r in rows.items()},
                         indent=1))
    report(rows, a, time.monotonic() - t0)


if __name__ == "__main__":
    main()
