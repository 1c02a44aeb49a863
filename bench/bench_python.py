#!/usr/bin/python3
"""`make bench-python`: the Python face of datahelix against
torch.utils.data.DataLoader, side by side in one run (issues 5 and 15).

1. Per-batch Python overhead of next() on a ready batch, every option of
   issue 15 off (no transform, collate_fn, pin_memory): `prefetch` batches
   are let get ready (the wait is outside the measure), then taken back to
   back; the time of `next(it)` in Python is what is left - the extension
   call, the tensor views (torch.frombuffer) and the dict.  A burst in
   which any batch was not ready after all (stats()["misses"] grew: it
   waited past ddl_ms) is left out and the next wait doubled.  Median and
   p95 over every kept call.  Target: <= 50 us.  Also cold: one batch
   after each --window-ms of other Python work (a spin loop).
2. End-to-end samples/s, consuming as fast as possible:
   datahelix.DataLoader (its DataServer decoding with N threads) against
   torch.utils.data.DataLoader with N worker processes whose __getitem__
   runs the decode of `datahelix bench`'s torch loader
   (datahelix_bench.sources: the same C decode, or PyAV with
   --torch-decode pyav), the same batch size and output.
3. The same with transform=: one per-sample function (TRANSFORM below: a
   centre crop, a horizontal flip, uint8 -> float32 normalised, CTHW),
   given to datahelix as transform= (it runs on the DataServer's N
   Python worker processes, which decode each sample with the C media
   pipeline and call it on a zero-copy view of the frames, then write the
   stacked batch into the arena: docs/python.md "transform and
   collate_fn") and called by torch's Dataset.__getitem__ in its N
   workers after the decode.  Reported: both rates, the ratio,
   datahelix's transform and stack cost per sample from stats() (per
   pass, measured in its workers) and the transform's own cost measured
   alone.

Equal CPU: the same N decode workers on each side (with transform=:
N Python workers on the datahelix side too), and this process (so
every DataServer and worker it starts) pinned to N CPUs when the machine
has more (datahelix_bench.processes.pin_cpus, as `datahelix bench` does);
one torch intra-op thread in the training process (as its ranks).
Rounds alternate the two loaders (both stay up), so that a noisy machine
slows both alike; figures are medians of --reps rounds, one epoch each.
Besides samples/s, each epoch's CPU time of this process and every
process under it (/proc; only one loader works at a time), per sample:
what "equal CPU" compares when other jobs load the machine and wall-clock
rates swing; and the training thread's own CPU time inside next(), per
sample: what the loader takes from the training loop.

The data sets are made with `datahelix gen-data` and cached under --work;
results.json and table.md go to --out (bench/out/python).
"""
import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(ROOT / "bench"))

import torch  # noqa: E402
import torch.utils.data as tud  # noqa: E402

import datahelix  # noqa: E402
from datahelix_bench.processes import pin_cpus  # noqa: E402
from datahelix_bench.sources import c_decode, pyav_decode  # noqa: E402


def gen_set(bin_path, d, profiles, count, seed):
    if not (d / "m.jsonl").exists():
        d.mkdir(parents=True, exist_ok=True)
        subprocess.run([bin_path, "gen-data", "--out", d / "videos",
                        "--profiles", profiles, "--count", str(count),
                        "--seed", str(seed)], check=True,
                       stdout=subprocess.DEVNULL)
        subprocess.run([bin_path, "probe", "--out", d / "m.jsonl",
                        d / "videos"], check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
    return d / "m.jsonl"


def dataset(bin_path, work, count):
    """Mixed S/M/L clips for the end-to-end rates."""
    return gen_set(bin_path, work / f"py-mixed-{count}", "mixed", count, 11)


def small_dataset(bin_path, work, count):
    """Tiny S clips for the overhead measure (content does not matter)."""
    name = "py-small" if count == 64 else f"py-small-{count}"
    return gen_set(bin_path, work / name, "S", count, 12)


# -- the transform, one definition for both loaders --------------------------

MEAN = torch.tensor([0.45, 0.45, 0.45]).view(3, 1, 1, 1)
STD = torch.tensor([0.225, 0.225, 0.225]).view(3, 1, 1, 1)


def TRANSFORM(v):
    """uint8 [T, H, W, 3] -> float32 [3, T, c, c], c = 7/8 of the shorter
    side: a centre crop (a view), a horizontal flip (a copy; fixed, not
    random, so that both loaders yield the same tensors), then to float,
    /255, normalised per channel: what a VideoMAE-style eval transform
    does on the CPU."""
    _, h, w, _ = v.shape
    c = min(h, w) * 7 // 8
    y0, x0 = (h - c) // 2, (w - c) // 2
    v = v[:, y0:y0 + c, x0:x0 + c].flip(2)
    x = v.permute(3, 0, 1, 2).float().div_(255)
    return x.sub_(MEAN).div_(STD)


class DecodeDataset(tud.Dataset):
    """One sample per __getitem__, decoded as `datahelix bench`'s torch
    loader decodes (datahelix_bench.sources), then `transform`."""

    def __init__(self, manifest, frames, size, decode="c", transform=None):
        rows = [json.loads(x) for x in open(manifest)]
        self.paths = [r["path"] for r in rows if "id" in r]
        self.frames, self.size = frames, size
        self.decode, self.transform = decode, transform

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        w, h = self.size
        if self.decode == "pyav":
            v = torch.from_numpy(pyav_decode(self.paths[i], self.frames, w, h))
        else:
            raw = c_decode(self.paths[i], self.frames, w, h)
            v = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
            v = v.view(self.frames, h, w, 3)
        if self.transform is not None:
            v = self.transform(v)
        return {"video": v, "ids": i}


# -- 1. next() overhead -------------------------------------------------------

def pct(xs, q):
    """Nearest-rank percentile."""
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q / 100 * len(s)) - 1))]


def warm_calls(loader, depth, reps):
    """Times of next() on ready batches (see the module's note 1)."""
    warm, dropped, wait = [], 0, 0.5
    for r in range(reps + 4):  # up to 4 more epochs if none was kept
        if r >= reps and warm:
            break
        it = iter(loader)
        left = len(loader)
        while left > 0:
            time.sleep(wait)   # not measured: the prefetched batches land
            k, burst = min(depth, left), []
            m0 = loader.stats()["misses"]
            for _ in range(k):
                t0 = time.perf_counter()
                b = next(it)
                burst.append((time.perf_counter() - t0) * 1e6)
                del b
            left -= k
            if loader.stats()["misses"] == m0:
                warm += burst
            else:
                dropped += k
                wait = min(wait * 2, 8.0)
        for _ in it:
            pass
    return warm, dropped


def cold_calls(loader, reps, window_ms):
    """One next() after each window of spinning; a call whose batch was
    not ready by then (a miss) is left out, as in warm_calls."""
    cold, dropped = [], 0
    for _ in range(reps):
        it = iter(loader)
        next(it)
        m0 = loader.stats()["misses"]
        for _ in range(len(loader) - 1):
            end = time.perf_counter() + window_ms / 1e3
            while time.perf_counter() < end:
                pass
            t0 = time.perf_counter()
            b = next(it)
            us = (time.perf_counter() - t0) * 1e6
            del b
            m = loader.stats()["misses"]
            if m == m0:
                cold.append(us)
            else:
                dropped += 1
            m0 = m
    return cold, dropped


def overhead(args):
    """next() on a ready batch, every issue-15 option at its default."""
    depth = 16
    with datahelix.DataLoader(args.small, batch_size=2, frames=4,
                              size=(32, 32), prefetch=depth,
                              workers=args.workers) as loader:
        warm, dropped = warm_calls(loader, depth, args.reps)
        cold, cold_dropped = cold_calls(loader, args.reps, args.window_ms)
    if not warm:
        raise SystemExit("bench_python: no burst of ready batches (every "
                         "one waited past ddl_ms); the machine is too busy")
    return {"next_overhead_us_p50": statistics.median(warm),
            "next_overhead_us_p95": pct(warm, 95),
            "next_samples": len(warm), "next_dropped": dropped,
            "next_cold_us_p50": statistics.median(cold or [float("nan")]),
            "next_cold_us_p95": pct(cold or [float("nan")], 95),
            "next_cold_samples": len(cold),
            "next_cold_dropped": cold_dropped}


# -- 2, 3. end to end, side by side -------------------------------------------

_TICK = os.sysconf("SC_CLK_TCK")


def tree_cpu_s():
    """CPU seconds (user + system) used so far by this process and every
    process under it (DataServers, their Python workers, Coordinators,
    torch's workers), from /proc: what a loader's epoch costs in CPU
    whatever else the machine runs (only one loader works at a time)."""
    parent, cpu = {}, {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                f_ = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        parent[int(d)] = int(f_[1])
        cpu[int(d)] = (int(f_[11]) + int(f_[12])) / _TICK
    tree, todo = set(), [os.getpid()]
    while todo:
        p = todo.pop()
        tree.add(p)
        todo += [c for c, pp in parent.items() if pp == p and c not in tree]
    return sum(cpu.get(p, 0.0) for p in tree)


def one_epoch(loader):
    """(samples, samples/s, CPU ms per sample of every process, CPU ms
    per sample the training thread spent inside next())."""
    n, in_next, c0, t0 = 0, 0.0, tree_cpu_s(), time.perf_counter()
    it = iter(loader)
    while True:
        u0 = time.thread_time()
        try:
            b = next(it)
        except StopIteration:
            break
        in_next += time.thread_time() - u0
        n += b["video"].shape[0]
    t1 = time.perf_counter()
    per = 1e3 / max(n, 1)
    return n, n / (t1 - t0), (tree_cpu_s() - c0) * per, in_next * per


def side_by_side(dh, td, reps):
    """Median samples/s of each over `reps` rounds, one epoch each per
    round, the two alternating (which goes first swaps every round).
    One untimed epoch each first brings workers and services up; a whole
    one, not a batch: the prefetch of an abandoned pass would still be
    decoding in the first timed round (the other loader's, too).  Also
    datahelix's per-pass transform/collate ms per sample."""
    for loader in (dh, td):
        for _ in loader:
            pass
    rates = {"dh": [], "torch": [], "cpu_ms_dh": [], "cpu_ms_torch": [],
             "next_cpu_ms_dh": [], "next_cpu_ms_torch": []}
    t_ms, c_ms = [], []
    for r in range(reps):
        order = ("dh", "torch") if r % 2 == 0 else ("torch", "dh")
        for who in order:
            n, rate, cpu_ms, next_ms = one_epoch(dh if who == "dh" else td)
            rates[who].append(rate)
            rates["cpu_ms_" + who].append(cpu_ms)
            rates["next_cpu_ms_" + who].append(next_ms)
            if who == "dh":
                e = dh.stats()["epoch"]
                t_ms.append(e["transform_ms"] / n)
                c_ms.append(e["collate_ms"] / n)
    rates["ratio_per_round"] = [a / b for a, b in zip(rates["dh"],
                                                      rates["torch"])]
    return (statistics.median(rates["dh"]), statistics.median(rates["torch"]),
            rates, statistics.median(t_ms), statistics.median(c_ms))


def loaders(manifest, args, transform):
    dh = datahelix.DataLoader(manifest, batch_size=args.batch_size,
                              frames=args.frames,
                              size=(args.size[1], args.size[0]),  # (H, W)
                              num_workers=args.workers, prefetch_factor=2,
                              transform=transform)
    ds = DecodeDataset(manifest, args.frames, args.size, args.torch_decode,
                       transform)
    td = tud.DataLoader(ds, batch_size=args.batch_size, shuffle=True,
                        num_workers=args.workers, drop_last=True,
                        prefetch_factor=2, persistent_workers=True,
                        timeout=300)
    return dh, td


def run_pair(manifest, args, transform):
    dh, td = loaders(manifest, args, transform)
    try:
        return side_by_side(dh, td, args.reps)
    finally:
        dh.close()
        del td


def transform_alone_us(args, n=40):
    """TRANSFORM's own time on one sample of the run's shape (median)."""
    w, h = args.size
    v = torch.randint(0, 256, (args.frames, h, w, 3), dtype=torch.uint8)
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        TRANSFORM(v)
        ts.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(ts)


# -- report -------------------------------------------------------------------

def spread(rates):
    """The range of the rounds' own ratios (each round pairs the two)."""
    q = rates["ratio_per_round"]
    return f"(rounds {min(q):.2f}-{max(q):.2f})" if len(q) > 1 else ""


def cpu(rates, who, what=""):
    v = statistics.median(rates[f"{what}cpu_ms_{who}"])
    return f"{v:.0f}" if v >= 10 else f"{v:.2f}"


def cpu_ratio(rates):
    """Samples per CPU-second, datahelix over torch (> 1: less CPU)."""
    q = statistics.median(rates["cpu_ms_torch"]) / \
        statistics.median(rates["cpu_ms_dh"])
    return f"{q:.2f}x"


def table(res, args):
    r = res
    dec = ("same C decode" if args.torch_decode == "c"
           else "PyAV decode")
    lines = [
        f"datahelix.DataLoader vs torch.utils.data.DataLoader, "
        f"{args.count} mixed clips, batch {args.batch_size} x {args.frames} "
        f"frames at {args.size[0]}x{args.size[1]}, {args.workers} decode "
        f"workers each on the same {len(r['cpus'])} CPUs; medians of "
        f"{args.reps} rounds (one epoch each, alternating)", "",
        f"| measure | datahelix | torch DataLoader ({dec}) | ratio |",
        "|---|---:|---:|---:|",
        f"| next() on a ready batch, Python overhead (warm), p50 / p95 | "
        f"{r['next_overhead_us_p50']:.1f} / {r['next_overhead_us_p95']:.1f}"
        f" us (target <= 50; {r['next_samples']} calls) | | |",
        f"| the same after {args.window_ms:.0f} ms of other work (cold), "
        f"p50 / p95 | {r['next_cold_us_p50']:.1f} / "
        f"{r['next_cold_us_p95']:.1f} us ({r['next_cold_samples']} calls) "
        "| | |",
        f"| end-to-end samples/s | {r['datahelix_samples_per_s']:.1f} | "
        f"{r['torch_samples_per_s']:.1f} | {r['ratio']:.2f}x "
        f"{spread(r['rates'])} |",
        f"| end-to-end samples/s, transform on | "
        f"{r['transform']['datahelix_samples_per_s']:.1f} | "
        f"{r['transform']['torch_samples_per_s']:.1f} | "
        f"{r['transform']['ratio']:.2f}x {spread(r['transform']['rates'])} |",
        f"| CPU ms per sample, every process, no transform / transform "
        f"on (ratio: samples per CPU-second, ours over torch's) | "
        f"{cpu(r['rates'], 'dh')} / {cpu(r['transform']['rates'], 'dh')} | "
        f"{cpu(r['rates'], 'torch')} / "
        f"{cpu(r['transform']['rates'], 'torch')} | "
        f"{cpu_ratio(r['rates'])} / {cpu_ratio(r['transform']['rates'])} |",
        f"| training thread's CPU ms per sample inside next(), no "
        f"transform / transform on | {cpu(r['rates'], 'dh', 'next_')} / "
        f"{cpu(r['transform']['rates'], 'dh', 'next_')} | "
        f"{cpu(r['rates'], 'torch', 'next_')} / "
        f"{cpu(r['transform']['rates'], 'torch', 'next_')} | |",
        f"| transform per sample (stats()[\"transform_ms\"]; alone: "
        f"{r['transform']['alone_ms_per_sample']:.2f} ms) | "
        f"{r['transform']['transform_ms_per_sample']:.2f} ms, in its "
        f"DataServer's workers | "
        f"in its workers | |",
        f"| stack per sample (stats()[\"collate_ms\"]) | "
        f"{r['transform']['collate_ms_per_sample']:.2f} ms, in its "
        f"DataServer's workers | "
        f"in its workers | |",
    ]
    if r["next_dropped"] or r["next_cold_dropped"]:
        lines.append("")
        lines.append(f"(left out, their batch or burst not ready in time: "
                     f"{r['next_dropped']} warm and "
                     f"{r['next_cold_dropped']} cold next() calls)")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default=str(ROOT / "build" / "datahelix"))
    ap.add_argument("--count", type=int, default=24, help="clips")
    ap.add_argument("--small-count", type=int, default=64,
                    help="S clips of the next() overhead measure")
    ap.add_argument("--workers", type=int, default=2,
                    help="decode threads / DataLoader worker processes, "
                    "and the CPUs pinned to")
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--frames", type=int, default=16)
    ap.add_argument("--size", type=int, nargs=2, default=(112, 112),
                    metavar=("W", "H"))
    ap.add_argument("--reps", type=int, default=3, help="rounds")
    ap.add_argument("--window-ms", type=float, default=60.0)
    ap.add_argument("--torch-decode", choices=("c", "pyav"), default="c",
                    help="the torch side's decode (datahelix_bench.sources)")
    ap.add_argument("--work", default=str(ROOT / "bench" / "out"),
                    help="where the generated clips are cached")
    ap.add_argument("--out", default=str(ROOT / "bench" / "out" / "python"))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    os.environ.setdefault("DATAHELIX_BIN", args.bin)
    cpus = pin_cpus(args.workers)
    torch.set_num_threads(1)
    work = pathlib.Path(args.work)
    manifest = dataset(args.bin, work, args.count)
    args.small = small_dataset(args.bin, work, args.small_count)

    res = overhead(args)
    dh, td, rates, _, _ = run_pair(manifest, args, None)
    tdh, ttd, trates, t_ms, c_ms = run_pair(manifest, args, TRANSFORM)
    res.update({
        "datahelix_samples_per_s": dh, "torch_samples_per_s": td,
        "ratio": dh / td, "rates": rates,
        "transform": {
            "datahelix_samples_per_s": tdh, "torch_samples_per_s": ttd,
            "ratio": tdh / ttd, "rates": trates,
            "transform_ms_per_sample": t_ms, "collate_ms_per_sample": c_ms,
            "alone_ms_per_sample": transform_alone_us(args) / 1e3},
        "workers": args.workers, "cpus": cpus, "torch_decode":
        args.torch_decode, "batch_size": args.batch_size,
        "frames": args.frames, "size": list(args.size), "clips": args.count,
        "reps": args.reps})
    text = table(res, args)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(res, indent=1) + "\n")
    (out / "table.md").write_text(text + "\n")
    print(json.dumps(res) if args.json else text)


if __name__ == "__main__":
    main()
