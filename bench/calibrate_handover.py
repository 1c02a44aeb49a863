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

  cpu_ms    CPU per sample that is not the decode, with the run's clips
            decoded for real (--load-clips): --ranks rank processes take
            --loaded-batches batches each, back to back, on the run's
            CPUs; every process of the system (this process, which plays
            rank 0 and, for the pool, hosts the Dask scheduler as the
            bench's parent does; the other ranks; the loaders' or the
            cluster's workers and nannies) is counted, less the decode of
            the samples taken, each at its time alone (--decode-ms, or
            `datahelix decode` here).  What is left is the system's own
            work around a sample, its processes' background (timers,
            heartbeats, monitors) at the rate samples come when the CPUs
            are short, and what decoding inside it costs beyond decoding
            alone: on a machine where decode has all the CPUs, CPU the
            decode loses.  Without --load-clips, the null-decode figure.
  cpu_null_ms
            the same with a null decode on rank 0 alone, batches as fast
            as they come: the work around a sample only.  With the CPUs
            short it is a fraction of cpu_ms (the pool on 1 CPU: 12-16 ms
            against 62-79), which is why the simulator takes cpu_ms.
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
index.  next_ms: one rank under the same load.  Its decode writes the
sample straight into the shared-memory slot the rank maps, so there is
no payload work to separate from decode, and cpu_null_ms is 0.  cpu_ms
(with --load-clips): the loaded measure above on --ranks ranks of one job,
as the bench runs it (a Coordinator with dh-ddl's policy, a gloo group),
counting the ranks, their DataServers and the Coordinator.

Output: one JSON object {SYSTEM: {"cpu_ms", "cpu_null_ms", "next_ms",
"samples", "batches_ready", ...}} on stdout (--json) or a table.  Never
pass/fail.

Usage: calibrate_handover.py --frames T --size WxH --batch-size B
           --workers-per-rank N --workers-total M --prefetch K
           [--load-clips M.jsonl] [--ranks R]
           [--systems native,dask-pool,dh-ddl] [--index I.dhx]
           [--bin build/datahelix] [--ready-sleep-ms MS]
           [--dh-ready-sleep-ms MS] [--batches N] [--loaded-batches N]
           [--decode-ms MS.json] [--json]
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
                    help="batches in the null-decode CPU measure "
                    "(default 16)")
    ap.add_argument("--loaded-batches", type=int, default=8,
                    help="batches each rank takes in the CPU measure with "
                    "the clips decoded (default 8)")
    ap.add_argument("--decode-ms", metavar="MS.json", dest="decode_ms_file",
                    help="{path: decode ms alone} of the --load-clips clips "
                    "(default: measured here with `datahelix decode`)")
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
        a.load_paths = [r["path"] for r in rows if "path" in r]
        # datahelix's batches name index ids, the manifest's row ids
        a.id_rows = {r["id"]: {"path": r["path"]} for r in rows
                     if "path" in r and "id" in r}
        a.clips = sorted(set(a.load_paths))
        if not a.clips:
            ap.error(f"--load-clips {a.load_clips}: no clip paths")
    a.decode_ms = None
    if a.decode_ms_file:
        if not a.clips:
            ap.error("--decode-ms needs --load-clips")
        try:
            a.decode_ms = {str(k): float(v) for k, v in
                           json.loads(open(a.decode_ms_file).read()).items()}
        except (OSError, ValueError, AttributeError, TypeError) as e:
            ap.error(f"--decode-ms {a.decode_ms_file}: {e}")
        missing = [c for c in a.clips if c not in a.decode_ms]
        if missing:
            ap.error(f"--decode-ms {a.decode_ms_file}: no time for "
                     f"{missing[0]}")
    for k in ("frames", "batch_size", "workers_per_rank", "workers_total",
              "prefetch", "batches", "loaded_batches", "ranks"):
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


def make_source(a, system, rank, addr=None, rows=None):
    rows = rows if rows is not None else null_rows(a)
    if system == "dh-ddl":  # the run's index; addr: its Coordinator
        return Epochs(sources.DatahelixSource(
            cfg_for(a, "dh-ddl", rank=rank, index=a.index, coordinator=addr,
                    telemetry=None), None))
    if system == "native":
        return sources.TorchSource(cfg_for(a, "native", rank=rank), rows)
    return sources.DaskSource(cfg_for(a, "dask-pool", rank=rank, dask=addr),
                              rows)


class Epochs:
    """A datahelix source over as many epochs of the run's index as the
    loaded measure takes (a short run's index holds a few batches a
    rank); every rank of the job moves to the next epoch at the same
    step, as its plan has the same length on every rank."""

    def __init__(self, src):
        self.src, self.epoch = src, 0

    def next(self):
        try:
            return self.src.next()
        except StopIteration:
            self.epoch += 1
            self.src.loader.set_epoch(self.epoch)
            self.src.it = iter(self.src.loader)
            return self.src.next()

    def close(self):
        self.src.close()


def loaded_rows(a, system):
    """The run's clips (its manifest's rows, cycled), as many as a rank of
    the loaded measure can take (loaded_plan) with its prefetch; for
    datahelix, which plans the run's index, its ids' rows."""
    if system == "dh-ddl":
        return a.id_rows
    n = (sum(loaded_plan(a)) + 2 * a.prefetch + 2) * a.batch_size * a.ranks
    return [{"path": a.load_paths[i % len(a.load_paths)], "est_tokens": 1}
            for i in range(n)]


def loaded_plan(a):
    """(lead-in, window, most after) batches of a rank in the loaded
    measure: the lead-in fills every rank's prefetch and reaches the steady
    state (each rank's pipeline full, the CPUs the bottleneck); rank 0's
    next `window` batches are the window; the other ranks go on until it
    ends, up to `most after` more."""
    return a.prefetch + 2, a.loaded_batches, 2 * a.loaded_batches


def take_until(src, rows, most, stop):
    """Up to `most` batches back to back, until `stop` is set; each batch's
    (time taken, sample paths)."""
    out = []
    for _ in range(most):
        if stop.is_set():
            break
        ids = src.next()[1]
        out.append((time.time(), [rows[i]["path"] for i in ids]))
    return out


def join_ranks(a, system, rank, port):
    """datahelix's ranks form a gloo group, as the bench's do: its loader
    shares its job key and plan through it."""
    if system != "dh-ddl":
        return
    from datetime import timedelta

    import torch.distributed as dist
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                      GLOO_SOCKET_IFNAME="lo")
    dist.init_process_group("gloo", rank=rank, world_size=a.ranks,
                            timeout=timedelta(seconds=120))


def leave_ranks(system):
    if system == "dh-ddl":
        import torch.distributed as dist
        if dist.is_initialized():
            dist.destroy_process_group()


def loaded_child(a, system, rank, addr, port, barrier, stop, q):
    """A rank of the loaded CPU measure (spawned): meet the others, then
    batches back to back until rank 0's window ends; their times and
    paths into q."""
    try:
        join_ranks(a, system, rank, port)
        rows = loaded_rows(a, system)
        src = make_source(a, system, rank, addr, rows)
        try:
            barrier.wait(timeout=300)
            q.put(take_until(src, rows, sum(loaded_plan(a)), stop))
        finally:
            src.close()
            leave_ranks(system)
    except Exception as e:  # noqa: BLE001 - reported by the parent
        barrier.abort()
        q.put(f"rank {rank}: {type(e).__name__}: {e}")


def decode_alone_ms(a):
    """{path: decode ms} of the load clips alone (`datahelix decode`,
    median of 3, on this process's CPUs), unless --decode-ms gave them."""
    if a.decode_ms is not None:
        return a.decode_ms
    from datahelix_bench import validate
    return validate.clip_decode_ms(a, a.clips)


def measure_loaded_cpu(a, system, addr=None):
    """cpu_ms: CPU per sample of all the system's processes less the decode
    of the samples, with --ranks ranks taking the run's clips back to back
    (module docstring).  Sources prefetch from their start, so the ranks
    meet first and the window opens only once every pipeline is full:
    then the samples taken in it are, to a batch or so, the samples its
    CPU decoded."""
    import multiprocessing as mp
    alone = decode_alone_ms(a)
    lead, window, _ = loaded_plan(a)
    ctx = mp.get_context("spawn")
    barrier, stop, q = ctx.Barrier(a.ranks), ctx.Event(), ctx.Queue()
    port = processes.free_port()
    kids = [ctx.Process(target=loaded_child,
                        args=(a, system, r, addr, port, barrier, stop, q))
            for r in range(1, a.ranks)]
    rows = loaded_rows(a, system)
    src = None
    try:
        for k in kids:
            k.start()
        join_ranks(a, system, 0, port)
        src = make_source(a, system, 0, addr, rows)
        barrier.wait(timeout=300)
        take_until(src, rows, lead, stop)
        pids = [os.getpid(), *processes.descendants(os.getpid())]
        c0, t0 = cpu_s(pids), time.time()
        taken = take_until(src, rows, window, stop)
        c1, t1 = cpu_s(pids), time.time()
        stop.set()
        for _ in kids:
            got = q.get(timeout=300)
            if isinstance(got, str):
                raise RuntimeError(got)
            taken += [b for b in got if t0 < b[0] <= t1]
    finally:
        stop.set()
        barrier.abort()
        for k in kids:
            k.join(timeout=60)
            if k.is_alive():
                k.kill()
                k.join(timeout=10)
        if src is not None:
            src.close()
        leave_ranks(system)
    paths = [p for _, b in taken for p in b]
    decode_ms = sum(alone[p] for p in paths)
    return {"cpu_ms": max(0.0, ((c1 - c0) * 1e3 - decode_ms) / len(paths)),
            "loaded_samples": len(paths),
            "loaded_samples_per_s": len(paths) / (t1 - t0),
            "loaded_cpu_ms_per_sample": (c1 - c0) * 1e3 / len(paths),
            "decode_alone_ms_per_sample": decode_ms / len(paths)}


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
        out["cpu_null_ms"] = out["cpu_ms"] = measure_cpu(src, a)
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
    """datahelix: next() on a ready batch of one real DataLoader rank; with
    the run's clips, the loaded CPU measure on --ranks ranks of one job
    (a Coordinator with the bench's dh-ddl policy, a gloo group)."""
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
    out = {"cpu_ms": 0.0, "cpu_null_ms": 0.0, "samples": 0, "ranks": 1,
           "next_ms": statistics.median(times),
           "batches_ready": len(times), "load_streams": load_streams(a)}
    if a.clips:
        import tempfile

        from datahelix._loader import ABLATIONS
        services = processes.Services()
        with tempfile.TemporaryDirectory() as tmp:
            try:
                addr = services.coordinator(
                    a, ABLATIONS["ddl"]["policy"],
                    pathlib.Path(tmp) / "coordinator.jsonl")
                out.update(measure_loaded_cpu(a, "dh-ddl", addr))
            finally:
                services.stop()
    return out


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
    if system == "dh-ddl":
        return measure_dh(a, process_load(a))
    services = processes.Services()
    try:
        addr = (services.dask(a.workers_total) if system == "dask-pool"
                else None)
        out = measure(a, system, dask_load(a, addr) if addr
                      else process_load(a), addr)
        if a.clips:
            out.update(measure_loaded_cpu(a, system, addr))
        return out
    finally:
        services.stop()


def main(argv=None):
    a = parse_args(argv)
    res = {}
    for s in a.systems:
        t = time.monotonic()
        res[s] = calibrate(a, s)
        print(f"calibrate-handover: {s}: {res[s]['cpu_ms']:.2f} ms CPU per "
              f"sample ({res[s]['cpu_null_ms']:.2f} with a null decode), "
              f"next() on a ready batch {res[s]['next_ms']:.2f} ms "
              f"({time.monotonic() - t:.1f} s)", file=sys.stderr, flush=True)
    if a.json:
        print(json.dumps(res))
    else:
        print("| system | CPU ms / sample | null decode | next() ms on a "
              "ready batch |")
        print("|---|---:|---:|---:|")
        for s, r in res.items():
            print(f"| {s} | {r['cpu_ms']:.2f} | {r['cpu_null_ms']:.2f} | "
                  f"{r['next_ms']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
