#!/usr/bin/python3
"""The peer of the .dhx index: a descriptor table held the way a
torch.utils.data Dataset usually holds it, as a Python list of dicts parsed
from JSONL, and what each DataLoader worker pays for it.

Measures, for N rows (default 1,000,000): parse time, bytes of Python heap
per sample (RSS growth), and the copy-on-read effect: a forked worker that
only *reads* every record (as __getitem__ does) dirties private copies of the
pages holding them (reference counts are written), measured as the child's
Private_Dirty growth.  bench_index reports the .dhx side; never pass/fail.
"""
import argparse
import gc
import json
import os
import sys
import time


def rss_kib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def private_dirty_kib():
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            if line.startswith("Private_Dirty:"):
                return int(line.split()[1])
    return 0


def write_jsonl(path, n):
    with open(path, "w") as f:
        for i in range(n):
            prof = ("16x224", "32x336", "64x448")[i % 3]
            f.write(json.dumps({
                "id": i, "path": f"videos/{i:09d}.mp4", "kind": "video",
                "bytes": 100000 + i % 5000000, "codec": "h264",
                "width": 400 + 200 * (i % 3), "height": 224 + 112 * (i % 3),
                "fps": 25.0, "duration_s": 2.0 * (1 + i % 3),
                "frames": 50 * (1 + i % 3), "profile": prof,
                "est_cpu_ms": 26.5 + i % 300, "est_out_bytes": 4569600,
                "est_tokens": 1008 * (1 + i % 3)}) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=1_000_000)
    ap.add_argument("--tmp", default=os.environ.get("TMPDIR", "/tmp"))
    a = ap.parse_args()
    path = os.path.join(a.tmp, f"dh-bench-py-{os.getpid()}.jsonl")
    write_jsonl(path, a.count)
    try:
        gc.collect()
        r0 = rss_kib()
        t0 = time.perf_counter()
        with open(path) as f:
            rows = [json.loads(line) for line in f]
        parse_s = time.perf_counter() - t0
        heap_kib = rss_kib() - r0
        gc.freeze()  # the best case: keep the collector off those pages
        rd, wr = os.pipe()
        pid = os.fork()
        if pid == 0:
            before = private_dirty_kib()
            tokens = 0
            for r in rows:  # what __getitem__ does: read fields
                tokens += r["est_tokens"]
            os.write(wr, str(private_dirty_kib() - before).encode())
            os._exit(0)
        os.close(wr)
        child = int(os.read(rd, 64) or b"0")
        os.waitpid(pid, 0)
    finally:
        os.unlink(path)
    n = a.count
    print(f"\nPython list-of-dicts table: {n:,} rows")
    print("| measure | value |")
    print("|---|---:|")
    print(f"| parse JSONL into a list | {parse_s:.2f} s "
          f"({parse_s / n * 1e9:,.0f} ns/sample) |")
    print(f"| heap per sample (RSS growth) | {heap_kib * 1024 / n:,.0f} B |")
    print(f"| per worker: private copies made by reading every row | "
          f"{child * 1024 / n:,.0f} B/sample ({child / 1024:,.0f} MiB) |")


if __name__ == "__main__":
    sys.exit(main())
