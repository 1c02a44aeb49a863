#!/usr/bin/python3
"""`make bench-ddl`: datahelix.DistributedDataLoader against
torch.utils.data.DataLoader, the same dataset and num_workers, one run
(issue 16 item 5; docs/benchmarks.md "DistributedDataLoader").

The dataset: --samples images (uint8 3 x --side x --side, made from the
index) whose __getitem__ also spins --work-ms of CPU (a decode's stand-in).
Per loader, fresh each time (--repeats, medians reported):
  first batch   constructor + iter() + the first next(), split into
                iter() (ours: pickle the dataset, write the index, start
                the Coordinator and the DataServer) and the first next()
                (ours: the DataServer's Python workers start, import torch
                and unpickle the dataset; torch: fork its workers)
  epoch 1 rest  samples/s over the rest of the first epoch (ours: the
                other workers may still be starting)
  warm epoch 2  the second epoch's first batch, persistent_workers=True
                (ours: the workers stay up whatever it says)
  steady        samples/s over the rest of the second epoch
Row "datahelix+start": loader.start() at construction, then --setup-s of
the model's set-up (a wait), then the same measures from iter(): the
workers' start-up hidden behind the set-up, as a training script would.
Also: `python3 -c "import torch"` alone (what every worker of ours pays at
start, and torch's forked workers do not), and the split of a fresh
loader's iter() by phase (--split-runs loaders, each phase timed around
the loader's own method, medians).
"""
import argparse
import logging
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
sys.path.insert(0, HERE)

import torch  # noqa: E402

import datahelix  # noqa: E402
from bench_ddl_data import Images  # noqa: E402


def one(cls, a, early=False):
    ds = Images(a.samples, a.side, a.work_ms)
    kw = dict(batch_size=a.batch_size, num_workers=a.workers,
              persistent_workers=True, timeout=120)
    if early:  # start() at construction; the model's set-up meanwhile
        loader = cls(ds, **kw).start()
        time.sleep(a.setup_s)
        t0 = time.perf_counter()
    else:
        t0 = time.perf_counter()
        loader = cls(ds, **kw)
    it = iter(loader)
    t1 = time.perf_counter()
    first = next(it)
    t2 = time.perf_counter()
    n = len(first[1])
    for b in it:
        n += len(b[1])
    t3 = time.perf_counter()
    it = iter(loader)
    next(it)
    t4 = time.perf_counter()
    m = 0
    for b in it:
        m += len(b[1])
    t5 = time.perf_counter()
    if hasattr(loader, "close"):
        loader.close()
    del loader, it, first
    return {"iter_s": t1 - t0, "first_next_s": t2 - t1,
            "first_batch_s": t2 - t0,
            "epoch1_sps": (n - a.batch_size) / (t3 - t2),
            "warm_first_s": t4 - t3, "steady_sps": m / (t5 - t4)}


# The phases of a fresh DistributedDataLoader's iter(), each the loader's
# own method timed from outside: (label, class attribute).
PHASES = [("pickle the dataset", "_payload"), ("write the index", "_index"),
          ("job key, start the Coordinator, its listening line",
           "_coordinator_address"),
          ("fork the fork server", "_fork_server")]


def split(a):
    """Medians over a.split_runs fresh loaders of iter(), the first
    next() and each phase of iter(), in ms."""
    from datahelix import _distributed as dd
    cls, times = dd.DistributedDataLoader, {}
    saved = {attr: getattr(cls, attr) for _, attr in PHASES}
    client = dd._C.Client

    def timed(key, f):
        def w(*args, **kw):
            t = time.perf_counter()
            try:
                return f(*args, **kw)
            finally:
                times.setdefault(key, []).append(time.perf_counter() - t)
        return w

    for label, attr in PHASES:
        setattr(cls, attr, timed(label, saved[attr]))
    dd._C.Client = timed("the client: register, start the DataServer "
                         "(its workers asked for, its own registration), "
                         "take its arena", client)
    try:
        for _ in range(a.split_runs):
            loader = cls(Images(a.samples, a.side, a.work_ms),
                         batch_size=a.batch_size, num_workers=a.workers,
                         timeout=120)
            t0 = time.perf_counter()
            it = iter(loader)
            t1 = time.perf_counter()
            next(it)
            t2 = time.perf_counter()
            times.setdefault("iter()", []).append(t1 - t0)
            times.setdefault("first next()", []).append(t2 - t1)
            loader.close()
            del it
    finally:
        for _, attr in PHASES:
            setattr(cls, attr, saved[attr])
        dd._C.Client = client
    return {k: statistics.median(v) * 1e3 for k, v in times.items()}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bin", default=None)
    p.add_argument("--samples", type=int, default=2048)
    p.add_argument("--side", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--work-ms", type=float, default=1.0)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--split-runs", type=int, default=7,
                   help="fresh loaders timed phase by phase (0: none)")
    p.add_argument("--setup-s", type=float, default=5.0,
                   help="the model's set-up between start() and iter() "
                   "in the 'datahelix+start' row (waiting, not CPU)")
    a = p.parse_args()
    if a.bin:
        os.environ["DATAHELIX_BIN"] = os.path.abspath(a.bin)
    os.environ.setdefault("DATAHELIX_LOG", "warn")
    # datahelix was imported above, its logger's level taken then
    logging.getLogger("datahelix").setLevel(logging.WARNING)
    imp = {}
    for what, code in (("python3 alone", "pass"),
                       ("import torch", "import torch"),
                       ("import torch and datahelix's worker modules",
                        "import torch, datahelix._worker, datahelix._slot, "
                        "datahelix._C")):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True,
                       env=dict(os.environ, PYTHONPATH=os.path.join(
                           HERE, "..", "python")))
        imp[what] = time.perf_counter() - t
    print(f"dataset: {a.samples} samples uint8 3x{a.side}x{a.side}, "
          f"{a.work_ms} ms CPU each; batch {a.batch_size}, num_workers "
          f"{a.workers}; medians of {a.repeats} runs, interleaved")
    print("a fresh worker interpreter (what each of ours starts with): " +
          ", ".join(f"{k} {v:.2f} s" for k, v in imp.items()))
    res = {"torch": [], "datahelix": [], "datahelix+start": []}
    for _ in range(a.repeats):
        res["torch"].append(one(torch.utils.data.DataLoader, a))
        res["datahelix"].append(one(datahelix.DistributedDataLoader, a))
        res["datahelix+start"].append(
            one(datahelix.DistributedDataLoader, a, early=True))
    med = {k: {f: statistics.median(r[f] for r in v) for f in v[0]}
           for k, v in res.items()}
    print(f"{'':16}{'iter()':>9}{'1st next':>10}{'1st batch':>11}"
          f"{'ep1 rest/s':>12}{'ep2 1st':>9}{'steady/s':>10}")
    for k, m in med.items():
        print(f"{k:16}{m['iter_s']:9.3f}{m['first_next_s']:10.3f}"
              f"{m['first_batch_s']:11.3f}{m['epoch1_sps']:12.0f}"
              f"{m['warm_first_s']:9.3f}{m['steady_sps']:10.0f}")
    t = med["torch"]
    for k in ("datahelix", "datahelix+start"):
        m = med[k]
        r = m['first_batch_s'] / t['first_batch_s']
        print(f"{k}: first batch {r:.2f}x torch's, steady samples/s "
              f"{m['steady_sps'] / t['steady_sps']:.2f}x torch's")
    if a.split_runs > 0:
        sp = split(a)
        print(f"a fresh DistributedDataLoader, medians of {a.split_runs}: "
              f"iter() {sp.pop('iter()'):.1f} ms, first next() "
              f"{sp.pop('first next()'):.1f} ms; iter()'s phases:")
        for k, v in sp.items():
            print(f"  {v:6.1f} ms  {k}")


if __name__ == "__main__":
    main()
