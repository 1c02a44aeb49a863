#!/usr/bin/python3
"""`make bench-python`: the Python face of datahelix against
torch.utils.data.DataLoader, side by side in one run (issue 5).

1. Per-batch Python overhead of next() on a ready batch: the consumer holds
   each batch for a GPU window long enough that the next one is always
   ready, and the time of `next(it)` in Python is what is left - the
   extension call, the tensor views (torch.frombuffer) and the dict.
   Target: <= 50 us.
2. End-to-end samples/s over one epoch, consuming as fast as possible:
   datahelix.DataLoader (its DataServer decoding with N threads) against
   torch.utils.data.DataLoader with N worker processes whose __getitem__
   runs the same C decode through the binding (datahelix._C.decode), with
   the same batch size and output.  Medians of --reps runs.

The data set is made with `datahelix gen-data` (mixed S/M/L clips) and
cached under bench/out/.
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

import torch  # noqa: E402
import torch.utils.data as tud  # noqa: E402

import datahelix  # noqa: E402
from datahelix import _C  # noqa: E402


def dataset(bin_path, out, count):
    d = out / f"py-mixed-{count}"
    if not (d / "m.jsonl").exists():
        d.mkdir(parents=True, exist_ok=True)
        subprocess.run([bin_path, "gen-data", "--out", d / "videos",
                        "--profiles", "mixed", "--count", str(count),
                        "--seed", "11"], check=True,
                       stdout=subprocess.DEVNULL)
        subprocess.run([bin_path, "probe", "--out", d / "m.jsonl",
                        d / "videos"], check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
    return d / "m.jsonl"


def small_dataset(bin_path, out):
    """Tiny S clips for the overhead measure (content does not matter)."""
    d = out / "py-small"
    if not (d / "m.jsonl").exists():
        d.mkdir(parents=True, exist_ok=True)
        subprocess.run([bin_path, "gen-data", "--out", d / "videos",
                        "--profiles", "S", "--count", "64", "--seed", "12"],
                       check=True, stdout=subprocess.DEVNULL)
        subprocess.run([bin_path, "probe", "--out", d / "m.jsonl",
                        d / "videos"], check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
    return d / "m.jsonl"


class DecodeDataset(tud.Dataset):
    """The same decode as datahelix's, one sample per __getitem__."""

    def __init__(self, manifest, frames, size):
        rows = [json.loads(x) for x in open(manifest)]
        self.paths = [r["path"] for r in rows if "id" in r]
        self.frames, self.size = frames, size

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        w, h = self.size
        raw = _C.decode(self.paths[i], self.frames, w, h)
        v = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
        return {"video": v.view(self.frames, h, w, 3), "ids": i}


def overhead(manifest, args):
    """Median us of next() when the batch is already there.

    warm: `prefetch` batches are made ready (the consumer waits), then
    taken back to back - what a training loop that keeps the CPU busy
    with torch calls meets.  cold: one batch after each --window-ms of
    other Python work (a spin loop), which leaves torch's code paths out
    of the CPU caches; both are reported."""
    warm, cold = [], []
    depth = 16
    with datahelix.DataLoader(args.small, batch_size=2, frames=4,
                              size=(32, 32), prefetch=depth,
                              workers=args.workers) as loader:
        for _ in range(args.reps):
            it = iter(loader)
            left = len(loader)
            while left > 0:
                time.sleep(0.5)   # every prefetched batch gets ready
                for _ in range(min(depth, left)):
                    t0 = time.perf_counter()
                    b = next(it)
                    warm.append((time.perf_counter() - t0) * 1e6)
                    del b
                    left -= 1
            for _ in it:
                pass
        for _ in range(args.reps):
            it = iter(loader)
            next(it)
            for _ in range(len(loader) - 1):
                end = time.perf_counter() + args.window_ms / 1e3
                while time.perf_counter() < end:
                    pass
                t0 = time.perf_counter()
                b = next(it)
                cold.append((time.perf_counter() - t0) * 1e6)
                del b
    return statistics.median(warm), statistics.median(cold), len(warm)


def epochs_rate(loader, reps):
    """Median samples/s of `reps` whole epochs, after one batch that
    brings the loader's workers or services up (not timed)."""
    next(iter(loader))
    rates = []
    for _ in range(reps):
        n, t0 = 0, time.perf_counter()
        for b in loader:
            n += b["video"].shape[0]
        rates.append(n / (time.perf_counter() - t0))
    return statistics.median(rates)


def run_datahelix(manifest, args):
    with datahelix.DataLoader(manifest, batch_size=args.batch_size,
                              frames=args.frames,
                              size=(args.size[1], args.size[0]),  # (H, W)
                              prefetch=4, workers=args.workers) as loader:
        return epochs_rate(loader, args.reps)


def run_torch(manifest, args):
    ds = DecodeDataset(manifest, args.frames, args.size)
    loader = tud.DataLoader(ds, batch_size=args.batch_size, shuffle=True,
                            num_workers=args.workers, drop_last=True,
                            prefetch_factor=2, persistent_workers=True,
                            timeout=300)
    rate = epochs_rate(loader, args.reps)
    del loader
    return rate


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default=str(ROOT / "build" / "datahelix"))
    ap.add_argument("--count", type=int, default=24, help="clips")
    ap.add_argument("--workers", type=int, default=2,
                    help="decode threads / DataLoader worker processes")
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--frames", type=int, default=16)
    ap.add_argument("--size", type=int, nargs=2, default=(112, 112))
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--window-ms", type=float, default=60.0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    os.environ.setdefault("DATAHELIX_BIN", args.bin)
    manifest = dataset(args.bin, ROOT / "bench" / "out", args.count)
    args.small = small_dataset(args.bin, ROOT / "bench" / "out")

    us, cold_us, n = overhead(manifest, args)
    dh = run_datahelix(manifest, args)
    td = run_torch(manifest, args)
    res = {"next_overhead_us_p50": us, "next_cold_us_p50": cold_us,
           "next_samples": n,
           "datahelix_samples_per_s": dh, "torch_samples_per_s": td,
           "ratio": dh / td, "workers": args.workers,
           "batch_size": args.batch_size, "frames": args.frames,
           "size": list(args.size), "clips": args.count}
    if args.json:
        print(json.dumps(res))
        return
    print(f"datahelix.DataLoader, {args.count} mixed clips, batch "
          f"{args.batch_size} x {args.frames} frames at "
          f"{args.size[0]}x{args.size[1]}, {args.workers} decode workers "
          f"each; medians of {args.reps} epochs\n")
    print("| measure | datahelix | torch DataLoader (same C decode) | "
          "ratio |")
    print("|---|---:|---:|---:|")
    print(f"| next() on a ready batch, Python overhead (warm) | {us:.1f} us "
          f"(target <= 50) | | |")
    print(f"| the same after {args.window_ms:.0f} ms of other work (cold) | "
          f"{cold_us:.1f} us | | |")
    print(f"| end-to-end samples/s | {dh:.1f} | {td:.1f} | "
          f"{dh / td:.2f}x |")


if __name__ == "__main__":
    main()
