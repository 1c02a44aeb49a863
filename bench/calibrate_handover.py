#!/usr/bin/python3
"""What handing a prepared sample to its rank costs each live system of
`datahelix bench`, measured apart from the run it calibrates, for the
simulator's hand-over model (`datahelix sim --handover`, docs/sim.md
"Hand-over").

The live sources of datahelix_bench/sources.py (TorchSource for native,
DaskSource for dask-pool) run exactly as in a bench rank, except that
their decode is sources.NULL_CLIP: a zeroed payload of the run's size, no
decode.  So
what is left is the system's own work around a sample, which decode speed
cannot explain:

  cpu_ms    CPU time of every process of the system (this process, which
            plays the rank and, for the pool, hosts the Dask scheduler as
            the bench's parent does; the loader's or the cluster's worker
            processes) per sample, while the rank asks for batch after
            batch as fast as they come.  On a machine where decode has all
            the CPUs, this is CPU the decode loses.
  next_ms   median wall time of a rank's next() on a batch that is
            already ready (the ranks slept first): receive, deserialize,
            stack.  A rank blocks for it before every step.  Measured as a
            rank meets it in the run: --ranks rank processes (their own
            loaders, or clients of the one pool) take their batch at the
            same moment, as synchronous data-parallel ranks do after each
            all-reduce, while --workers-total decode streams of the run's
            clips keep the CPUs as busy as the run's workers do.  For the
            pool these streams are tasks on the pool's own workers, which
            also serve the ranks' fetches; for native, `datahelix decode`
            processes beside the loaders.  6 rounds; the median over
            ranks and rounds.

datahelix (dh-ddl, with --index) runs its real DataLoader on the run's
index, as one rank under the same load; only next_ms is measured there.
Its decode writes the sample straight into the shared-memory slot the
rank maps, so there is no payload work to separate from decode, and
cpu_ms is reported as 0 (its control path costs microseconds per
decision: bench_route.c).

Output: one JSON object {SYSTEM: {"cpu_ms", "next_ms", "samples",
"batches_ready"}} on stdout (--json) or a table.  Never pass/fail.

Usage: calibrate_handover.py --frames T --size WxH --batch-size B
           --workers-per-rank N --workers-total M --prefetch K
           [--load-clips M.jsonl] [--ranks R]
           [--systems native,dask-pool,dh-ddl] [--index I.dhx]
           [--bin build/datahelix] [--ready-sleep-ms MS]
           [--dh-ready-sleep-ms MS] [--batches N] [--json]
"""
import argparse
import contextlib
import itertools
import json
import os
import pathlib
import statistics
import subprocess
import sys
import threading
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "python"), str(HERE)]
from datahelix_bench import cli, processes, sources  # noqa: E402

SYSTEMS = ("native", "dask-pool", "dh-ddl")
CLK = os.sysconf("SC_CLK_TCK")


def parse_args(argv):
    ap = argparse.ArgumentParser(prog="calibrate_handover.py",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--frames", type=int, required=True)
    ap.add_argument("--size", type=cli.size_arg, required=True)
    ap.add_argument("--batch-size", type=int, required=True)
    ap.add_argument("--workers-per-rank", type=int, required=True)
    ap.add_argument("--workers-total", type=int, required=True)
    ap.add_argument("--prefetch", type=int, required=True)
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--index", help="the run's index (needed for dh-ddl)")
    ap.add_argument("--ranks", type=int, default=1,
                    help="ranks taking their batch at once (default 1)")
    ap.add_argument("--load-clips", metavar="M.jsonl",
                    help="a manifest whose clips make the other ranks' "
                    "load (default: no load)")
    ap.add_argument("--bin", default=str(HERE.parent / "build" / "datahelix"),
                    help="the datahelix program (dh-ddl)")
    ap.add_argument("--ready-sleep-ms", type=float, default=300,
                    help="sleep before a timed next() of a null batch "
                    "(default 300)")
    ap.add_argument("--dh-ready-sleep-ms", type=float, default=1000,
                    help="sleep before a timed next() of datahelix, whose "
                    "batches are decoded for real (default 1000)")
    ap.add_argument("--batches", type=int, default=16,
                    help="batches in the CPU measure (default 16)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    a.systems = [s for s in a.systems.split(",") if s]
    for s in a.systems:
        if s not in SYSTEMS:
            ap.error(f"--systems: '{s}' is not one of {', '.join(SYSTEMS)}")
    if "dh-ddl" in a.systems and not a.index:
        ap.error("--systems dh-ddl needs --index")
    a.clips = []
    if a.load_clips:
        try:
            rows = [json.loads(x) for x in open(a.load_clips)]
        except (OSError, ValueError) as e:
            ap.error(f"--load-clips {a.load_clips}: {e}")
        a.clips = sorted({r["path"] for r in rows if "path" in r})
        if not a.clips:
            ap.error(f"--load-clips {a.load_clips}: no clip paths")
    for k in ("frames", "batch_size", "workers_per_rank", "workers_total",
              "prefetch", "batches", "ranks"):
        if getattr(a, k) < 1:
            ap.error(f"--{k.replace('_', '-')} must be >= 1")
    return a


def cpu_s(pids):
    """utime + stime of the live pids, all threads (s)."""
    t = 0
    for p in pids:
        f = processes.proc_stat(p)
        if f is not None:
            t += int(f[11]) + int(f[12])
    return t / CLK


def load_streams(a):
    """The run's decode workers, all busy while the ranks take a batch."""
    return a.workers_total if a.clips else 0


@contextlib.contextmanager
def process_load(a):
    """load_streams(a) `datahelix decode` processes over the run's clips,
    ended (by pid) on exit."""
    procs = []
    try:
        for i in range(load_streams(a)):
            clips = a.clips[i % len(a.clips):] + a.clips[:i % len(a.clips)]
            procs.append(subprocess.Popen(
                [a.bin, "decode", "--frames", str(a.frames), "--size",
                 f"{a.size[0]}x{a.size[1]}", "--repeat", "1000", *clips],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait(timeout=10)


@contextlib.contextmanager
def dask_load(a, addr):
    """load_streams(a) decode tasks of the run's clips kept in flight on
    the pool by another client (the other ranks), stopped on exit."""
    n = load_streams(a)
    if not n:
        yield
        return
    from distributed import Client
    client = Client(addr, timeout=60, set_as_default=False)
    stop = threading.Event()
    clips = itertools.cycle(a.clips)
    T, (w, h) = a.frames, a.size

    def feed():
        futs = []
        while not stop.is_set():
            while len(futs) < n:
                futs.append(client.submit(sources.dask_decode,
                                          next(clips), T, w, h, pure=False))
            futs.pop(0).result(timeout=120)
        for f in futs:
            f.cancel()

    th = threading.Thread(target=feed, daemon=True)
    th.start()
    try:
        time.sleep(1.0)  # the workers busy before the first timed next()
        yield
    finally:
        stop.set()
        th.join(timeout=130)
        client.close(timeout=10)


def warm_up(src):
    """Two batches, untimed: the loader's workers or clients are up."""
    for _ in range(2):
        src.next()


def measure_cpu(src, a):
    """Two warm-up batches, then the CPU per sample of this process and its
    descendants over --batches chained next() calls."""
    warm_up(src)
    pids = [os.getpid(), *processes.descendants(os.getpid())]
    c0 = cpu_s(pids)
    for _ in range(a.batches):
        src.next()
    return (cpu_s(pids) - c0) * 1e3 / (a.batches * a.batch_size)


def timed_next(src, a, barrier, sleep_ms):
    """6 rounds: sleep (the batch gets ready), meet the other ranks, time
    next()."""
    out = []
    for _ in range(6):
        time.sleep(sleep_ms / 1e3)
        if barrier is not None:
            barrier.wait(timeout=120)
        t = time.perf_counter()
        src.next()
        out.append((time.perf_counter() - t) * 1e3)
    return out


def make_source(a, system, rank, addr=None):
    if system == "native":
        return sources.TorchSource(cfg_for(a, "native", rank=rank),
                                      null_rows(a))
    return sources.DaskSource(cfg_for(a, "dask-pool", rank=rank,
                                         dask=addr), null_rows(a))


def rank_child(a, system, rank, addr, barrier, q):
    """Ranks 1..R-1 (spawned): own source, two warm-up batches, the timed
    rounds; the times (or the error) into q."""
    try:
        src = make_source(a, system, rank, addr)
        try:
            warm_up(src)
            barrier.wait(timeout=120)  # every rank warm
            q.put(timed_next(src, a, barrier, a.ready_sleep_ms))
        finally:
            src.close()
    except Exception as e:  # noqa: BLE001 - reported by the parent
        barrier.abort()
        q.put(f"rank {rank}: {type(e).__name__}: {e}")


def measure(a, system, load, addr=None):
    """CPU per sample on rank 0 alone; then next() on a ready batch with
    --ranks ranks at once under `load`."""
    import multiprocessing as mp
    out = {"ranks": a.ranks}
    src = make_source(a, system, 0, addr)
    try:
        out["cpu_ms"] = measure_cpu(src, a)
        out["samples"] = a.batches * a.batch_size
        ctx = mp.get_context("spawn")
        barrier = ctx.Barrier(a.ranks) if a.ranks > 1 else None
        q = ctx.Queue()
        kids = [ctx.Process(target=rank_child,
                            args=(a, system, r, addr, barrier, q))
                for r in range(1, a.ranks)]
        for k in kids:
            k.start()
        times = []
        try:
            with load:
                if barrier is not None:
                    barrier.wait(timeout=120)
                times += timed_next(src, a, barrier, a.ready_sleep_ms)
            for _ in kids:
                got = q.get(timeout=120)
                if isinstance(got, str):
                    raise RuntimeError(got)
                times += got
        finally:
            for k in kids:
                k.join(timeout=30)
                if k.is_alive():
                    k.kill()
                    k.join(timeout=10)
    finally:
        src.close()
    out["next_ms"] = statistics.median(times)
    out["batches_ready"] = len(times)
    out["load_streams"] = load_streams(a)
    return out


def measure_dh(a, load):
    """datahelix: next() on a ready batch of one real DataLoader rank."""
    os.environ["DATAHELIX_BIN"] = a.bin
    src = sources.DatahelixSource(
        cfg_for(a, "dh-ddl", world=1, index=a.index, coordinator=None,
                telemetry=None), None)
    try:
        warm_up(src)
        with load:
            times = timed_next(src, a, None, a.dh_ready_sleep_ms)
    finally:
        src.close()
    return {"cpu_ms": 0.0, "samples": 0, "ranks": 1,
            "next_ms": statistics.median(times),
            "batches_ready": len(times), "load_streams": load_streams(a)}


def cfg_for(a, system, rank=0, world=None, **kw):
    return dict(system=system, frames=a.frames, size=list(a.size),
                batch=a.batch_size, rank=rank, world=world or a.ranks, seed=0,
                workers_rank=a.workers_per_rank, prefetch=a.prefetch,
                batch_timeout=60, **kw)


def null_rows(a):
    n = (2 + a.batches + 6 + a.prefetch + 2) * a.batch_size * a.ranks
    return [{"path": sources.NULL_CLIP, "est_tokens": 1}
            for _ in range(n)]


def calibrate(a, system):
    if system == "native":
        return measure(a, system, process_load(a))
    if system == "dask-pool":
        services = processes.Services()
        try:
            addr = services.dask(a.workers_total)
            return measure(a, system, dask_load(a, addr), addr)
        finally:
            services.stop()
    return measure_dh(a, process_load(a))


def main(argv=None):
    a = parse_args(argv)
    res = {}
    for s in a.systems:
        t = time.monotonic()
        res[s] = calibrate(a, s)
        print(f"calibrate-handover: {s}: {res[s]['cpu_ms']:.2f} ms CPU per "
              f"sample, next() on a ready batch {res[s]['next_ms']:.2f} ms "
              f"({time.monotonic() - t:.1f} s)", file=sys.stderr, flush=True)
    if a.json:
        print(json.dumps(res))
    else:
        print("| system | CPU ms / sample | next() ms on a ready batch |")
        print("|---|---:|---:|")
        for s, r in res.items():
            print(f"| {s} | {r['cpu_ms']:.2f} | {r['next_ms']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
