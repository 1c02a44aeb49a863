#!/usr/bin/python3
"""Hand-over of a ready batch to the consuming process: datahelix's arena
vs torch.utils.data.DataLoader vs memcpy, side by side in one run (issue 4,
"Benchmarks").  Never pass/fail.

For each batch size (8, 64, 256 MiB):

datahelix (bench/bench_arena.c --json, run as a child of this script): a
  producer process has a ready batch in an arena slot; timed: it sends the
  20-byte slot reference over a SOCK_SEQPACKET socketpair, the consumer
  process looks the pointer up, reads one byte of a page it has not touched
  before (a real page fault in its mapping) and answers; the clock stops when
  the answer is back - a full round trip, an upper bound on the hand-over.
  Median of R hand-overs.
memcpy (same C run): memcpy of the same size into a warm (pre-faulted)
  buffer, and into a freshly malloc'd one.  Median of R.
DataLoader (this script): DataLoader(num_workers=1, prefetch_factor=1,
  persistent_workers=False, pin_memory=False, timeout=T).  The Dataset's
  __getitem__ returns one ready uint8 tensor of the batch size, created once
  in the worker on first use (that first batch is an untimed warm-up), so
  creation is never timed.
  * "collate" (the headline, DataLoader's standard path): batch_size=1, so
    the worker's default_collate copies the ready sample into a *new*
    shared-memory tensor for every batch (torch.stack into a _new_shared
    storage), pickles it (fd), queues it; the main process unpickles it,
    fetches the fd from the worker's resource-sharer thread and maps it.
  * "same storage" (DataLoader's best case): batch_size=None, the very same
    tensor handed back every time.  On the first send torch moves its
    storage into shared memory in place, so every later batch passes only
    the fd: no copy at all.
  Timed in the main process, from the next(it) call until the tensor is in
  hand and one byte of a not-yet-touched page of it has been read (as the
  datahelix consumer does).  Two measures:
  - "chain" (the headline figure): the main process asks for batch k+1 as
    soon as it holds batch k.  With prefetch_factor=1 and one worker there is
    exactly one batch in flight, and the worker receives index k+1 only when
    batch k is handed over, so each next() waits for the worker's whole
    per-batch work (collate copy into shared memory, pickling, queueing, fd
    passing, mapping).  Per repeat: wall time of B consecutive batches / B;
    reported: median over R repeats.  Nothing is subtracted.
  - "queued": before each next() the main process sleeps (3x the chain time
    + 20 ms) so the batch is already waiting in the result queue; what is
    left is the consumer side alone (queue read, unpickle, fd fetch, mmap,
    touch).  Median of R.  This is a lower bound: the worker's copy into
    shared memory still costs a core, just off the critical path.
Ratios are peer ms / datahelix ms (> 1: datahelix faster).  Memory: at most
about 3x the batch size is alive at once (the worker's cached sample, the
batch in flight and the one held); every wait is bounded, and the script
checks that no child process outlives its loader.

Usage: bench_handover.py [--bin build/bench_arena] [--reps 7] [--batches 5]
                         [--json]
"""
import argparse
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MIB = 1 << 20
SIZES_MIB = (8, 64, 256)
PAGE = 4096
TIMEOUT_S = 120          # DataLoader timeout per batch, C bench as a whole x3


# ---- datahelix and memcpy: the C bench ----

def run_c_bench(path, reps):
    p = subprocess.run([path, "--reps", str(reps), "--json"],
                       capture_output=True, text=True,
                       timeout=3 * TIMEOUT_S)
    if p.returncode:
        raise RuntimeError(f"{path} exit {p.returncode}: {p.stderr.strip()}")
    rows = {}
    for line in p.stdout.splitlines():
        if line.startswith("{"):
            r = json.loads(line)
            rows[r["mib"]] = r
    missing = [m for m in SIZES_MIB if m not in rows]
    if missing:
        raise RuntimeError(f"{path}: no result for {missing} MiB")
    return rows


# ---- DataLoader ----

class ReadyTensor:
    """A map-style Dataset whose every item is the same ready uint8 tensor,
    created on first use in the process that calls __getitem__ (the
    worker), never in the main process."""

    def __init__(self, nbytes, length):
        self.nbytes, self.length, self.cache = nbytes, length, None

    def __len__(self):
        return self.length

    def __getitem__(self, i):
        if self.cache is None:
            import torch
            self.cache = torch.full((self.nbytes,), 0x5A, dtype=torch.uint8)
        return self.cache


def children():
    """Pids of this process's live children (from /proc)."""
    me, out = os.getpid(), []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                s = f.read()
        except OSError:
            continue
        fields = s[s.rfind(")") + 2:].split()
        if fields[0] != "Z" and int(fields[1]) == me:
            out.append(int(d))
    return out


def wait_no_children(limit_s=10.0):
    """Bounded wait for every child to be gone; kill (by pid) and complain
    if one outlives its loader."""
    import multiprocessing
    deadline = time.monotonic() + limit_s
    while True:
        multiprocessing.active_children()  # reaps finished ones
        left = children()
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if left:
        raise RuntimeError(f"DataLoader worker(s) {left} outlived the loader")


def touch(b, i):
    """Read one byte of a page of b the consumer has not touched yet."""
    flat = b.reshape(-1)
    npages = max(1, flat.numel() // PAGE)
    return int(flat[((i * 7919 + 1) % npages) * PAGE % flat.numel()])


def measure_dataloader(nbytes, mode, reps, batches):
    """(chain ms, queued ms): medians, see the module docstring."""
    from torch.utils.data import DataLoader

    ds = ReadyTensor(nbytes, 1 + reps * batches + reps)
    kw = dict(batch_size=1) if mode == "collate" else dict(batch_size=None)
    dl = DataLoader(ds, shuffle=False, num_workers=1, prefetch_factor=1,
                    persistent_workers=False, pin_memory=False,
                    timeout=TIMEOUT_S, **kw)
    it = iter(dl)
    try:
        b = next(it)  # warm-up: the worker creates the ready sample
        if b.numel() != nbytes or touch(b, 0) != 0x5A:
            raise RuntimeError("DataLoader handed back a wrong tensor")
        del b
        k = 1
        chain = []
        for _ in range(reps):
            t0 = time.perf_counter()
            for _ in range(batches):
                b = next(it)
                if touch(b, k) != 0x5A:
                    raise RuntimeError("bad byte")
                del b
                k += 1
            chain.append((time.perf_counter() - t0) / batches)
        chain_ms = statistics.median(chain) * 1e3
        queued = []
        for _ in range(reps):
            time.sleep(3 * chain_ms / 1e3 + 0.02)
            t0 = time.perf_counter()
            b = next(it)
            v = touch(b, k)
            queued.append(time.perf_counter() - t0)
            del b
            k += 1
            if v != 0x5A:
                raise RuntimeError("bad byte")
        try:
            next(it)
            raise RuntimeError("DataLoader yielded more batches than asked")
        except StopIteration:  # the loader shuts its worker down here
            pass
    finally:
        if hasattr(it, "_shutdown_workers"):  # idempotent; ends the worker
            it._shutdown_workers()                # even after an exception
        del it, dl
        wait_no_children()
    return chain_ms, statistics.median(queued) * 1e3


# ---- report ----

def ms(v):
    if v >= 100:
        return f"{v:,.0f}"
    if v >= 10:
        return f"{v:.1f}"
    if v >= 1:
        return f"{v:.2f}"
    return f"{v:.3f}"


def ratio(v):
    return f"{v:,.0f}×" if v >= 10 else f"{v:.1f}×"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", default=os.path.join(ROOT, "build",
                                                  "bench_arena"),
                    help="the bench_arena binary (default: build/)")
    ap.add_argument("--reps", type=int, default=7,
                    help="repeats; every figure is a median over them")
    ap.add_argument("--batches", type=int, default=5,
                    help="DataLoader batches per chain repeat")
    ap.add_argument("--json", action="store_true",
                    help="one JSON object per size instead of the table")
    a = ap.parse_args()
    if not os.access(a.bin, os.X_OK):
        sys.exit(f"bench_handover: {a.bin} not built (make build)")
    if not 1 <= a.reps <= 101 or a.batches < 1:
        sys.exit("bench_handover: --reps 1..101, --batches >= 1")

    t_start = time.perf_counter()
    c = run_c_bench(a.bin, a.reps)
    import torch  # after the C run: the bench's numbers not disturbed by it
    rows = []
    for mib in SIZES_MIB:
        dl_chain, dl_queued = measure_dataloader(mib * MIB, "collate",
                                                 a.reps, a.batches)
        same_chain, same_queued = measure_dataloader(mib * MIB, "same",
                                                     a.reps, a.batches)
        r = c[mib]
        dh = r["handover_ms"]
        rows.append(dict(
            mib=mib, reps=a.reps, batches=a.batches,
            datahelix_ms=dh,
            dataloader_ms=dl_chain, dataloader_queued_ms=dl_queued,
            dataloader_same_ms=same_chain,
            dataloader_same_queued_ms=same_queued,
            memcpy_ms=r["memcpy_warm_ms"],
            memcpy_fresh_ms=r["memcpy_fresh_ms"],
            datahelix_attach_once_ms=r["attach_ms"],
            dataloader_over_datahelix=dl_chain / dh,
            dataloader_queued_over_datahelix=dl_queued / dh,
            dataloader_same_over_datahelix=same_chain / dh,
            memcpy_over_datahelix=r["memcpy_warm_ms"] / dh,
            memcpy_fresh_over_datahelix=r["memcpy_fresh_ms"] / dh))
    wait_no_children()
    self_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    child_rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    wall = time.perf_counter() - t_start

    if a.json:
        for r in rows:
            r.update(torch=torch.__version__, max_rss_self_mib=round(self_rss),
                     max_rss_child_mib=round(child_rss))
            print(json.dumps(r))
        return

    print(f"## Hand-over of a ready batch to the consuming process "
          f"(medians of {a.reps})\n")
    print("| batch | datahelix arena | DataLoader, 1 worker | memcpy "
          "(warm dst) | DataLoader / datahelix | memcpy / datahelix |")
    print("|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['mib']} MiB | {ms(r['datahelix_ms'])} ms "
              f"| {ms(r['dataloader_ms'])} ms | {ms(r['memcpy_ms'])} ms "
              f"| {ratio(r['dataloader_over_datahelix'])} "
              f"| {ratio(r['memcpy_over_datahelix'])} |")
    print("\nMore peers (ms; ratio to datahelix):\n")
    print("| batch | DataLoader collate, batch already queued | DataLoader "
          "same storage resent (no copy) | same storage, already queued "
          "| memcpy (fresh dst) | arena attach, once |")
    print("|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        dh = r["datahelix_ms"]
        print(f"| {r['mib']} MiB "
              f"| {ms(r['dataloader_queued_ms'])} "
              f"({ratio(r['dataloader_queued_ms'] / dh)}) "
              f"| {ms(r['dataloader_same_ms'])} "
              f"({ratio(r['dataloader_same_ms'] / dh)}) "
              f"| {ms(r['dataloader_same_queued_ms'])} "
              f"({ratio(r['dataloader_same_queued_ms'] / dh)}) "
              f"| {ms(r['memcpy_fresh_ms'])} "
              f"({ratio(r['memcpy_fresh_ms'] / dh)}) "
              f"| {ms(r['datahelix_attach_once_ms'])} |")
    flat = max(r["datahelix_ms"] for r in rows) / min(r["datahelix_ms"]
                                                      for r in rows)
    print(f"\ndatahelix: a round trip (producer sends a 20-byte slot ref, the "
          f"consumer maps and touches one new page, answers).\nDataLoader: "
          f"next() to tensor in hand + one new page read; num_workers=1, "
          f"prefetch_factor=1, batch_size=1\n(default_collate copies the "
          f"ready sample into a new shared-memory tensor per batch), "
          f"{a.batches} batches per repeat,\nthe next one asked for at once "
          f"(nothing subtracted).  See the docstring of "
          f"bench/bench_handover.py.\ndatahelix largest / smallest over "
          f"8-256 MiB: {flat:.2f}×.  torch {torch.__version__}, "
          f"{os.cpu_count()} CPUs; max RSS: this process {self_rss:.0f} MiB, "
          f"a child {child_rss:.0f} MiB; {wall:.0f} s.")


if __name__ == "__main__":
    main()
