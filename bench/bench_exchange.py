#!/usr/bin/python3
"""Tier-2's exchange (issue 17 "Benchmarks"; docs/rebalance.md "The
exchange"): redistributing 64 decoded-size samples across 4 ranks under
torch.distributed, one all_to_all_single vs one-by-one point-to-point
forwarding, beside the loopback TCP bandwidth measured in the same run.
Never pass/fail.

4 ranks (processes, gloo on CPU, loopback), 16 samples per rank of
--mb MiB each (default 16 frames x 224 x 224 x 3 uint8 = 2.3 MiB, a decoded
clip); every sample moves: sample j of rank r goes to rank
(r + 1 + j mod 3) mod 4, so each rank sends 16 and receives 16.
  * all_to_all_single: each rank packs its outgoing samples per destination
    into one contiguous send buffer (the copy is timed: it is part of the
    exchange), one collective with split sizes into one receive buffer,
    then reads its samples out of it (views, no copy).  Both buffers are
    allocated and touched once, before timing, as a loader keeps them
    between rounds.
  * one-by-one: the 64 samples in global order, each one dist.send by its
    sender and dist.recv by its receiver into the same reused receive
    buffer (the paper's legacy forwarding, without its serialization).
  * loopback TCP: rank 0 sends rank 1 the same total bytes over one
    127.0.0.1 socket (sendall / recv_into), the link's single-stream limit.
Each timing starts after a barrier and ends when the slowest rank is done
(the max over ranks); R repeats interleaved, medians reported.  Every
received sample is checked (its first and last byte carry its id).  Every
wait is bounded; children are ended by pid if the run exceeds --timeout.

Usage: bench_exchange.py [--reps 5] [--mb 2.297] [--ranks 4] [--json]
"""
import argparse
import datetime
import json
import multiprocessing as mp
import os
import socket
import statistics
import sys
import tempfile
import time

SAMPLES = 64


def plan(world, per_rank):
    """(src, dst, global index) of every sample, in global order."""
    out = []
    for r in range(world):
        for j in range(per_rank):
            dst = (r + 1 + j % (world - 1)) % world
            out.append((r, dst, r * per_rank + j))
    return out


def make_samples(torch, rank, per_rank, nbytes):
    """This rank's samples: sample id k filled with k % 251 (checkable)."""
    out = []
    for j in range(per_rank):
        k = rank * per_rank + j
        out.append(torch.full((nbytes,), k % 251, dtype=torch.uint8))
    return out


def check(t, k, what):
    v = k % 251
    if int(t[0]) != v or int(t[-1]) != v:
        raise RuntimeError(f"{what}: sample {k} arrived corrupt "
                           f"({int(t[0])}, {int(t[-1])}, expected {v})")


def a2a(torch, dist, rank, world, mine, moves, nbytes, stage):
    """One all_to_all_single: pack per destination into the reused send
    buffer, exchange into the reused receive buffer, unpack as views."""
    out = sorted((d, k) for s, d, k in moves if s == rank)
    inc = sorted((s, k) for s, d, k in moves if d == rank)
    send_split = [sum(1 for d, _ in out if d == x) * nbytes
                  for x in range(world)]
    recv_split = [sum(1 for s, _ in inc if s == x) * nbytes
                  for x in range(world)]
    per_rank = len(mine)
    send = stage["send"][:sum(send_split)]
    recv = stage["recv"][:sum(recv_split)]
    torch.cat([mine[k - rank * per_rank] for _, k in out], out=send)
    dist.all_to_all_single(recv, send, recv_split, send_split)
    got = [recv[i * nbytes:(i + 1) * nbytes] for i in range(len(inc))]
    return [(k, g) for (_, k), g in zip(inc, got)]


def p2p(torch, dist, rank, mine, moves, nbytes, stage):
    """The samples one by one, in global order: send / recv pairs (into
    the same reused receive buffer)."""
    per_rank = len(mine)
    got = []
    for s, d, k in moves:
        if s == rank:
            dist.send(mine[k - rank * per_rank], dst=d)
        elif d == rank:
            buf = stage["recv"][len(got) * nbytes:(len(got) + 1) * nbytes]
            dist.recv(buf, src=s)
            got.append((k, buf))
    return got


def tcp_pair(store, rank, total, chunk):
    """Rank 1 receives `total` bytes rank 0 sends on one loopback socket."""
    if rank == 1:
        ls = socket.socket()
        ls.bind(("127.0.0.1", 0))
        ls.listen(1)
        ls.settimeout(60)
        store.set("tcp_port", str(ls.getsockname()[1]))
        c, _ = ls.accept()
        c.settimeout(60)
        buf = bytearray(chunk)
        view = memoryview(buf)
        left = total
        while left:
            n = c.recv_into(view, min(chunk, left))
            if n == 0:
                raise RuntimeError("loopback TCP: sender closed early")
            left -= n
        c.sendall(b"k")
        c.close()
        ls.close()
    elif rank == 0:
        port = int(store.get("tcp_port"))
        c = socket.create_connection(("127.0.0.1", port), timeout=60)
        data = bytes(chunk)
        left = total
        while left:
            n = min(chunk, left)
            c.sendall(data[:n] if n < chunk else data)
            left -= n
        if c.recv(1) != b"k":
            raise RuntimeError("loopback TCP: no acknowledgement")
        c.close()
        store.delete_key("tcp_port")


def timed(torch, dist, fn):
    dist.barrier()
    t0 = time.perf_counter()
    res = fn()
    dt = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
    dist.all_reduce(dt, op=dist.ReduceOp.MAX)
    return float(dt[0]), res


def worker(rank, world, init, reps, nbytes, out_path):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank,
                            world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    store = dist.distributed_c10d._get_default_store()
    per_rank = SAMPLES // world
    moves = plan(world, per_rank)
    mine = make_samples(torch, rank, per_rank, nbytes)
    want = sorted(k for s, d, k in moves if d == rank)
    total = SAMPLES * nbytes
    res = {"a2a": [], "p2p": [], "tcp": []}
    # staging buffers allocated once and touched (a loader keeps them
    # between rounds): page faults are not the exchange's
    stage = {"send": torch.zeros(per_rank * nbytes, dtype=torch.uint8),
             "recv": torch.zeros(per_rank * nbytes, dtype=torch.uint8)}
    for rep in range(reps + 1):  # rep 0: warm-up, untimed
        ta, got = timed(torch, dist,
                        lambda: a2a(torch, dist, rank, world, mine, moves,
                                    nbytes, stage))
        if sorted(k for k, _ in got) != want:
            raise RuntimeError(f"rank {rank}: all_to_all_single delivered "
                               f"{sorted(k for k, _ in got)}, not {want}")
        for k, g in got:
            check(g, k, "all_to_all_single")
        tp, got = timed(torch, dist,
                        lambda: p2p(torch, dist, rank, mine, moves, nbytes,
                                    stage))
        for k, g in got:
            check(g, k, "send/recv")
        tt, _ = timed(torch, dist,
                      lambda: tcp_pair(store, rank, total, 4 << 20))
        if rep:
            res["a2a"].append(ta)
            res["p2p"].append(tp)
            res["tcp"].append(tt)
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(res, f)
    dist.barrier()
    dist.destroy_process_group()


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def run(args):
    nbytes = int(args.mb * (1 << 20))
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="dh-bench-exchange-") as tmp:
        out = os.path.join(tmp, "res.json")
        init = f"tcp://127.0.0.1:{free_port()}"
        procs = [ctx.Process(target=worker,
                             args=(r, args.ranks, init, args.reps, nbytes,
                                   out))
                 for r in range(args.ranks)]
        for p in procs:
            p.start()
        deadline = time.monotonic() + args.timeout
        for p in procs:
            p.join(max(0.1, deadline - time.monotonic()))
        bad = [p for p in procs if p.exitcode != 0]
        for p in procs:
            if p.is_alive():
                os.kill(p.pid, 9)
                p.join(5)
        if bad:
            sys.exit(f"bench_exchange: rank(s) "
                     f"{[procs.index(p) for p in bad]} failed or timed out "
                     f"after {args.timeout} s")
        with open(out) as f:
            res = json.load(f)
    total = SAMPLES * nbytes
    med = {k: statistics.median(v) for k, v in res.items()}
    return {
        "ranks": args.ranks, "samples": SAMPLES, "sample_bytes": nbytes,
        "moved_bytes": total, "reps": args.reps,
        "a2a_s": med["a2a"], "p2p_s": med["p2p"], "tcp_s": med["tcp"],
        "a2a_all_s": res["a2a"], "p2p_all_s": res["p2p"],
        "tcp_all_s": res["tcp"],
        "speedup": med["p2p"] / med["a2a"],
        "a2a_gbps": total / med["a2a"] / 1e9,
        "p2p_gbps": total / med["p2p"] / 1e9,
        "tcp_gbps": total / med["tcp"] / 1e9,
        "a2a_vs_tcp": med["tcp"] / med["a2a"],
        "cpus": os.cpu_count(),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--mb", type=float, default=16 * 224 * 224 * 3 / 2**20,
                    help="MiB per sample (default: 16x224x224x3 uint8)")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.ranks < 2 or SAMPLES % args.ranks:
        sys.exit("bench_exchange: --ranks must be >= 2 and divide 64")
    r = run(args)
    if args.json:
        print(json.dumps(r))
        return
    print(f"Tier-2 exchange: {r['samples']} samples x "
          f"{r['sample_bytes'] / 2**20:.2f} MiB = "
          f"{r['moved_bytes'] / 1e9:.3f} GB over {r['ranks']} ranks "
          f"(gloo, CPU, loopback; {r['cpus']} CPUs); medians of "
          f"{r['reps']}")
    print(f"  {'path':<34} {'s':>8} {'GB/s':>7}")
    print(f"  {'one all_to_all_single':<34} {r['a2a_s']:8.3f} "
          f"{r['a2a_gbps']:7.2f}")
    print(f"  {'one-by-one send/recv':<34} {r['p2p_s']:8.3f} "
          f"{r['p2p_gbps']:7.2f}")
    print(f"  {'loopback TCP, one socket':<34} {r['tcp_s']:8.3f} "
          f"{r['tcp_gbps']:7.2f}")
    print(f"  all_to_all_single vs one-by-one: {r['speedup']:.2f}x; "
          f"vs loopback TCP: {100 * r['a2a_vs_tcp']:.0f} % of its "
          f"bandwidth")


if __name__ == "__main__":
    main()
