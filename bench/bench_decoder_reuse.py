#!/usr/bin/python3
"""What reusing a decoder across files saves (issue 21 item 2), side by
side in one run.

`datahelix decode --json` over a set of files, the whole process pinned to
one CPU, with decoders taken over from the previous file (the default) and
with one opened per file (`--no-decoder-reuse`), the two interleaved round
by round so that a drift of the shared machine favours neither.  Sets:
  same-S   gen-data S clips only: every file has the parameters of the one
           before it (a set written by one encoder at one size)
  mixed    gen-data S/M/L in a shuffled order: files share parameters only
           by chance, so most opens are fresh either way
  same-S 1 frame   the same-S set, one frame a file: the open and close
           are then most of a file's CPU, so what reuse saves shows in it
Every file is closed before the next opens; with reuse a decoder that the
next file cannot take is freed inside that file's open, so `open_ms` moves
the previous file's decoder free into the open (mixed): the CPU per file
is the figure to compare.
Decoder threads: 1 on one CPU (what a DataServer's worker uses), and 2 on
two CPUs (frame threads: starting and joining them is part of every
fresh open and close).
Per set and mode: the median over rounds of the median per-file open_ms
(container, frame table, decoder: everything before the first frame), of
the process's CPU per file (user + sys, RUSAGE_CHILDREN), and the decoder
counts.  Never pass/fail.
"""
import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def gen(binary, out, profiles, count, seed):
    if not os.path.isdir(out) or len(
            [f for f in os.listdir(out) if f.endswith(".mp4")]) < count:
        subprocess.run([binary, "gen-data", "--out", out, "--profiles",
                        profiles, "--count", str(count), "--seed", str(seed)],
                       check=True, stdout=subprocess.DEVNULL, timeout=900)
    return sorted(os.path.join(out, f) for f in os.listdir(out)
                  if f.endswith(".mp4"))


def run_once(binary, paths, frames, threads, reuse, cpus):
    cmd = ["taskset", "-c", cpus, binary, "decode", "--json",
           "--frames", str(frames), "--size", "224x224",
           "--threads", str(threads),
           *([] if reuse else ["--no-decoder-reuse"]), *paths]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    out, err = p.communicate(timeout=600)
    if p.returncode != 0:
        sys.exit(f"bench_decoder_reuse: {' '.join(cmd[:6])}...: {err}")
    lines = [json.loads(x) for x in out.splitlines()]
    files, total = lines[:-1], lines[-1]
    return {
        "open_ms": statistics.median(f["open_ms"] for f in files),
        "decode_ms": statistics.median(f["decode_ms"] for f in files),
        "opens": total["decoder_opens"],
        "reuses": total["decoder_reuses"],
    }


def cpu_ms_per_file(binary, paths, frames, threads, reuse, cpus):
    """One run's result with the child's CPU per file (the difference of
    RUSAGE_CHILDREN around it: the child is waited for inside)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    r = run_once(binary, paths, frames, threads, reuse, cpus)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = (after.ru_utime - before.ru_utime) + \
        (after.ru_stime - before.ru_stime)
    r["cpu_ms_file"] = cpu_s * 1e3 / len(paths)
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "datahelix"))
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "out",
                                                  "decoder-reuse"))
    ap.add_argument("--files", type=int, default=24)
    ap.add_argument("--rounds", type=int, default=7)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    same = gen(a.bin, os.path.join(a.out, "same-s"), "S", a.files, 3)
    mixed = gen(a.bin, os.path.join(a.out, "mixed"), "mixed", a.files, 3)
    random.Random(0).shuffle(mixed)
    sets = [("same-S", same, 16), ("mixed", mixed, 16),
            ("same-S 1 frame", same, 1)]
    rows = []
    for name, paths, frames in sets:
        for threads, cpus in ((1, "0"), (2, "0,1")):
            res = {True: [], False: []}
            for i in range(a.rounds):
                for reuse in ((True, False) if i % 2 == 0 else (False, True)):
                    res[reuse].append(cpu_ms_per_file(
                        a.bin, paths, frames, threads, reuse, cpus))
            med = {k: {f: statistics.median(r[f] for r in v)
                       for f in ("open_ms", "decode_ms", "cpu_ms_file")}
                   for k, v in res.items()}
            for k in (True, False):
                med[k]["opens"] = res[k][0]["opens"]
                med[k]["reuses"] = res[k][0]["reuses"]
            rows.append((name, threads, med))
            print(f"{name} threads={threads}: done", file=sys.stderr)
    print(f"\n{a.files} files a set, {a.rounds} rounds, one thread on CPU 0 "
          f"and two on CPUs 0-1; medians over rounds\n")
    print("| set | threads | mode | decoders opened / taken over | "
          "open ms (median file) | decode ms (median file) | "
          "CPU ms / file |")
    print("|---|---:|---|---:|---:|---:|---:|")
    for name, threads, med in rows:
        for k, label in ((False, "a decoder per file"), (True, "reuse")):
            m = med[k]
            print(f"| {name} | {threads} | {label} | {m['opens']} / "
                  f"{m['reuses']} | {m['open_ms']:.3f} | "
                  f"{m['decode_ms']:.1f} | {m['cpu_ms_file']:.1f} |")
    print()
    for name, threads, med in rows:
        on, off = med[True], med[False]
        print(f"{name}, threads {threads}: open {off['open_ms']:.3f} -> "
              f"{on['open_ms']:.3f} ms ({on['open_ms'] / off['open_ms']:.2f}x)"
              f", CPU/file {off['cpu_ms_file']:.1f} -> "
              f"{on['cpu_ms_file']:.1f} ms "
              f"({(on['cpu_ms_file'] / off['cpu_ms_file'] - 1) * 100:+.1f} %)")
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump([{"set": n, "threads": t,
                    "reuse": m[True], "per_file": m[False]}
                   for n, t, m in rows], f, indent=1)


if __name__ == "__main__":
    main()
