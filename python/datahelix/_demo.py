"""`datahelix demo` / `make demo`'s training run (issue 18 item 1): a short
4-rank torchrun job on CPU training a small video model twice, once with
torch.utils.data.DataLoader over a plain PyAV decode (its usual setting:
DistributedSampler, worker processes) and once with datahelix.DataLoader,
then a side-by-side table and a PNG of every rank's input wait and step
time.

    datahelix demo [--out DIR] [--manifest M.jsonl] [--count 48]
        [--ranks 4] [--epochs 2] [--batch-size 2] [--frames 8]
        [--size 112] [--workers 2]

Without --manifest it first makes one in DIR: `datahelix gen-data` (a
mixed set of --count clips with captions), then `datahelix probe` with the
token estimate of the sampling the loaders use.

Each rank measures the same things around the same loop, whichever loader
feeds it: the input wait (time blocked in next()), the step (forward,
backward, DDP all-reduce, optimiser), and the loop's wall time.  The first
step of a run is left out of the wait figures (it holds start-up) and
reported apart as "first batch".

The GPU step is emulated by default (--gpu-step-ms, issue 41 item 7): a
training job's model step runs on its GPU, not on the CPUs that decode,
but this machine has no GPU and two cores, so a model step on the CPU
would take the decoders' cores and measure CPU contention, not input
delivery.  Each step then waits --gpu-step-ms (the GPU's time) and does
DDP's gradient all-reduce (a real one, over gloo), so ranks stay in
lockstep as they do under DDP.  --cpu-model trains the small model on the
CPU instead (the earlier demo).
"""
import argparse
import json
import os
import pathlib
import socket
import statistics
import subprocess
import sys
import time

LOADERS = (("torch", "torch DataLoader + PyAV"),
           ("datahelix", "datahelix.DataLoader"))
DDL_MS = 1.0  # a step is a deadline miss when its input waited longer
GPU_STEP_MS = 400.0  # the emulated GPU step (see the top)


# ---- the rank's side -------------------------------------------------------

def pyav_frames(path, frames, size):
    """What a torch user usually writes: decode the stream in order, keep
    `frames` uniform frames (stopping after the last one needed), resize
    the shorter side and centre-crop to size x size, uint8 [T, H, W, 3]."""
    import av
    import numpy as np
    with av.open(path) as c:
        s = c.streams.video[0]
        n = s.frames or 0
        if n <= 0:  # no count in the header: count by demuxing once
            n = sum(1 for p in c.demux(s) if p.size)
            c.seek(0)
        targets = [min(int((i + 0.5) * n / frames), n - 1)
                   for i in range(frames)]
        want, last, out = set(targets), max(targets), {}
        for i, f in enumerate(c.decode(s)):
            if i in want:
                r = size / min(f.width, f.height)
                w = max(size, round(f.width * r))
                h = max(size, round(f.height * r))
                a = f.to_ndarray(format="rgb24", width=w, height=h)
                y, x = (h - size) // 2, (w - size) // 2
                out[i] = a[y:y + size, x:x + size]
            if i >= last:
                break
    picked = [out.get(t) for t in targets]
    if any(p is None for p in picked):
        raise RuntimeError(f"{path}: decoded {len(out)} of {len(want)} "
                           "frames")
    return np.ascontiguousarray(np.stack(picked))


def torch_loader(rows, a, rank, world):
    import torch
    import torch.utils.data as tud

    class Clips(tud.Dataset):
        def __len__(self):
            return len(rows)

        def __getitem__(self, i):
            v = torch.from_numpy(pyav_frames(rows[i]["path"], a.frames,
                                             a.size))
            return {"video": v, "ids": i}

    sampler = tud.distributed.DistributedSampler(
        Clips(), num_replicas=world, rank=rank, shuffle=True, seed=0,
        drop_last=True)
    return tud.DataLoader(Clips(), batch_size=a.batch_size, sampler=sampler,
                          num_workers=a.workers, drop_last=True,
                          persistent_workers=True), sampler


def model(classes=10):
    import torch.nn as nn

    class TinyVideoNet(nn.Module):
        """Two 3-D convolutions and a linear head: a real forward and
        backward over the clip, sized for a CPU step of tens of ms."""

        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(
                nn.Conv3d(3, 16, (3, 5, 5), stride=(1, 2, 2),
                          padding=(1, 2, 2)), nn.ReLU(),
                nn.Conv3d(16, 32, 3, stride=2, padding=1), nn.ReLU(),
                nn.AdaptiveAvgPool3d(1), nn.Flatten(), nn.Linear(32, classes))

        def forward(self, video):  # uint8 [B, T, H, W, 3]
            x = video.permute(0, 4, 1, 2, 3).float().div_(255)
            return self.net(x)

    return TinyVideoNet()


def rank_main(a):
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    rows = [json.loads(x) for x in open(a.manifest) if x.strip()]
    rows = [r for r in rows if "path" in r]
    torch.manual_seed(0)
    net = DDP(model())
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    grads = torch.zeros(sum(p.numel() for p in net.parameters()))
    out = pathlib.Path(a.out)
    prog = out / f"progress.{a.loader}.{rank}"
    if a.loader == "torch":
        loader, sampler = torch_loader(rows, a, rank, world)
    else:
        import datahelix
        loader = datahelix.DataLoader(a.manifest, batch_size=a.batch_size,
                                      frames=a.frames,
                                      size=(a.size, a.size),
                                      num_workers=a.workers, shuffle=True)
        sampler = None
    total = len(loader) * a.epochs
    steps = []
    t_start = time.perf_counter()
    try:
        for ep in range(a.epochs):
            if sampler is not None:
                sampler.set_epoch(ep)
            elif hasattr(loader, "set_epoch"):
                loader.set_epoch(ep)
            it = iter(loader)
            while True:
                t0 = time.perf_counter()
                try:
                    b = next(it)
                except StopIteration:
                    break
                t1 = time.perf_counter()
                if a.cpu_model:
                    loss = F.cross_entropy(net(b["video"]),
                                           b["ids"].long() % 10)
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
                else:  # the GPU's time, then DDP's gradient all-reduce
                    time.sleep(a.gpu_step_ms / 1e3)
                    grads[0] = float(b["video"].shape[0])
                    dist.all_reduce(grads)
                t2 = time.perf_counter()
                del b
                steps.append({"epoch": ep, "wait_ms": (t1 - t0) * 1e3,
                              "step_ms": (t2 - t1) * 1e3,
                              "t": t2 - t_start})
                prog.write_text(f"{len(steps)} {total}\n")
    finally:
        if hasattr(loader, "close"):
            loader.close()
    elapsed = time.perf_counter() - t_start
    (out / f"{a.loader}.rank{rank}.json").write_text(json.dumps(
        {"rank": rank, "world": world, "batch_size": a.batch_size,
         "elapsed_s": elapsed, "steps": steps}))
    dist.barrier()
    dist.destroy_process_group()


# ---- the driver's side -----------------------------------------------------

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(a, loader, label):
    """One torchrun job; a progress line every 5 s; bounded in time."""
    out = pathlib.Path(a.out)
    for p in out.glob(f"progress.{loader}.*"):
        p.unlink()
    log = out / f"{loader}.log"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node",
           str(a.ranks), "--master_port", str(free_port()),
           # Debian's torch 1.13 on Python 3.11 cannot parse its own
           # default "0" for these (enum.Flag iteration changed in 3.11).
           "--redirects", "1", "--tee", "1",
           "-m", "datahelix._demo", "--rank-main", "--loader", loader,
           "--manifest", a.manifest, "--out", a.out, "--epochs",
           str(a.epochs), "--batch-size", str(a.batch_size), "--frames",
           str(a.frames), "--size", str(a.size), "--workers", str(a.workers),
           "--gpu-step-ms", str(a.gpu_step_ms)] + (
               ["--cpu-model"] if a.cpu_model else [])
    env = dict(os.environ)
    here = str(pathlib.Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = here + (os.pathsep + env["PYTHONPATH"]
                                if env.get("PYTHONPATH") else "")
    env.setdefault("OMP_NUM_THREADS", "1")
    t0 = time.monotonic()
    with open(log, "w") as f:
        p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL, env=env)
        try:
            while p.poll() is None:
                try:
                    p.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass
                if time.monotonic() - t0 > a.timeout:
                    p.kill()
                    p.wait(10)
                    raise RuntimeError(f"{label}: not done after "
                                       f"{a.timeout:.0f} s (log: {log})")
                done = []
                for q in sorted(out.glob(f"progress.{loader}.*")):
                    try:
                        done.append(q.read_text().split())
                    except OSError:
                        pass
                if done and p.poll() is None:
                    k = min(int(d[0]) for d in done if len(d) == 2)
                    n = int(done[0][1])
                    print(f"   {label}: step {k}/{n} on every rank, "
                          f"{time.monotonic() - t0:.0f} s", flush=True)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait(10)
    if p.returncode != 0:
        tail = log.read_text()[-3000:]
        raise RuntimeError(f"{label}: the training job failed (exit "
                           f"{p.returncode}; log {log}):\n{tail}")
    return [json.loads((out / f"{loader}.rank{r}.json").read_text())
            for r in range(a.ranks)], time.monotonic() - t0


def pct(xs, q):
    if not xs:
        return 0.0
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def summarise(ranks):
    waits = [s["wait_ms"] for r in ranks for s in r["steps"][1:]]
    first = max(r["steps"][0]["wait_ms"] for r in ranks if r["steps"]) / 1e3
    samples = sum(len(r["steps"]) * r["batch_size"] for r in ranks)
    # Throughput after start-up: from the end of the first step (every
    # rank waits there for the slowest first batch, in the all-reduce) to
    # the slowest rank's end.
    warm = max(r["elapsed_s"] - r["steps"][0]["t"]
               for r in ranks if r["steps"])
    warm_samples = samples - sum(r["batch_size"] for r in ranks)
    idle = statistics.mean(
        sum(s["wait_ms"] for s in r["steps"][1:]) /
        max(1e-9, sum(s["wait_ms"] + s["step_ms"] for s in r["steps"][1:]))
        for r in ranks)
    return {"samples_per_s": warm_samples / warm if warm > 0 else 0.0,
            "wait_p50_ms": pct(waits, 0.5), "wait_p95_ms": pct(waits, 0.95),
            "ddl_miss": sum(w > DDL_MS for w in waits) / max(1, len(waits)),
            "idle_share": idle, "first_batch_s": first,
            "step_ms": statistics.median(s["step_ms"] for r in ranks
                                         for s in r["steps"][1:]),
            "steps": min(len(r["steps"]) for r in ranks)}


def table(res):
    rows = [("samples/s (after the first batch)", "samples_per_s", "%.2f"),
            ("input wait p50 (ms)", "wait_p50_ms", "%.1f"),
            ("input wait p95 (ms)", "wait_p95_ms", "%.1f"),
            (f"DDL miss (steps waiting > {DDL_MS:g} ms)", "ddl_miss",
             "%.0f%%"),
            ("compute idle (GPU-idle share)", "idle_share", "%.0f%%"),
            ("model step p50 (ms)", "step_ms", "%.0f"),
            ("first batch (s)", "first_batch_s", "%.1f"),
            ("steps per rank", "steps", "%d")]
    names = [label for _, label in LOADERS] + ["ratio"]
    w0 = max(len(r[0]) for r in rows)
    ws = [max(len(n), 10) for n in names]
    lines = ["   " + " " * w0 + "  " + "  ".join(
        n.rjust(w) for n, w in zip(names, ws))]
    t, d = res["torch"], res["datahelix"]
    for title, key, fmt in rows:
        vals = []
        for k, _ in LOADERS:
            v = res[k][key]
            vals.append(fmt % (v * 100 if fmt.endswith("%%") else v))
        if key == "samples_per_s" and t[key] > 0:
            vals.append("%.2fx" % (d[key] / t[key]))
        else:
            vals.append("")
        lines.append("   " + title.ljust(w0) + "  " + "  ".join(
            v.rjust(w) for v, w in zip(vals, ws)))
    return "\n".join(lines)


def plot(per_loader, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (apt install python3-matplotlib)"
    fig, ax = plt.subplots(2, 2, figsize=(11, 6.5), sharex="col",
                           sharey="row")
    for col, (key, label) in enumerate(LOADERS):
        for r in per_loader[key]:
            warm = r["steps"][1:]  # the first step holds start-up
            x = list(range(1, len(warm) + 1))
            ax[0][col].plot(x, [s["wait_ms"] for s in warm],
                            marker=".", label=f"rank {r['rank']}")
            ax[1][col].plot(x, [s["step_ms"] for s in warm],
                            marker=".", label=f"rank {r['rank']}")
        ax[0][col].set_title(label)
        ax[0][col].set_yscale("symlog", linthresh=1.0)
        ax[1][col].set_xlabel("step")
    ax[0][0].set_ylabel("input wait (ms)")
    ax[1][0].set_ylabel("model step (ms)")
    ax[0][1].legend(fontsize=8)
    fig.suptitle("every rank's input wait and model step after the first "
                 "batch: same job, same model, same CPUs")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return None


def make_manifest(a, out):
    """gen-data + probe into `out`, as a user would (README)."""
    from ._services import binary
    dh = binary()
    videos = out / "videos"
    print(f"== 1. gen-data: {a.count} synthetic clips with captions (S 224p "
          f"~2 s, M 336p ~4 s, L 448p ~8 s) -> {videos}", flush=True)
    subprocess.run([dh, "gen-data", "--out", str(videos), "--profiles",
                    "mixed", "--count", str(a.count), "--seed", "1",
                    "--captions"], check=True, stdout=subprocess.DEVNULL)
    m = out / "manifest.jsonl"
    print(f"== 2. probe: descriptors, tokens estimated for {a.frames} frames "
          f"at {a.size}x{a.size} (what the loaders deliver) -> {m}",
          flush=True)
    subprocess.run([dh, "probe", "--summary", "--frames", str(a.frames),
                    "--size", f"{a.size}x{a.size}", "--out", str(m),
                    str(videos / "captions.jsonl")], check=True)
    return str(m)


def drive(a):
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if a.manifest is None:
        try:
            a.manifest = make_manifest(a, out)
        except (subprocess.CalledProcessError, FileNotFoundError) as e:
            raise RuntimeError(f"making the demo set in {out}: {e}")
    print(f"== 3. training: a small video model (two Conv3d layers), "
          f"{a.ranks} ranks under torchrun (gloo, CPU), batch "
          f"{a.batch_size}, {a.frames} frames at {a.size}x{a.size}, "
          f"{a.epochs} epochs, fed by each loader in turn", flush=True)
    per_loader, res = {}, {}
    for key, label in LOADERS:
        print(f"   running {a.ranks} ranks x {a.epochs} epochs with {label} "
              f"({a.workers} decode workers per rank) ...", flush=True)
        ranks, wall = run_ranks(a, key, label)
        per_loader[key] = ranks
        res[key] = summarise(ranks)
        res[key]["wall_s"] = wall
    print()
    print(table(res))
    png = out / "demo.png"
    why = plot(per_loader, png)
    (out / "demo.json").write_text(json.dumps(res, indent=1))
    print()
    print(f"   figure: {png}" if why is None else f"   no figure: {why}")
    ncpu = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
        else (os.cpu_count() or 1)
    print("   " + regime(a, res, ncpu))
    return res


def regime(a, res, ncpu):
    """One line: what regime this machine puts the run in."""
    t, d = res["torch"]["samples_per_s"], res["datahelix"]["samples_per_s"]
    if a.cpu_model:
        return (f"Regime: CPU-bound - {a.ranks} ranks share {ncpu} CPU cores "
                f"for decoding and for the model step (--cpu-model), so some "
                f"waiting is unavoidable; torch delivered {t:.1f} samples/s, "
                f"datahelix {d:.1f}.")
    need = a.ranks * a.batch_size * 1e3 / a.gpu_step_ms
    short = [n for n, v in (("torch", t), ("datahelix", d))
             if v < 0.95 * need]  # the loaders that could not keep up
    kind = ("input-bound for both" if len(short) == 2 else
            f"input-bound for {short[0]} only" if short else
            "GPU-bound for both (the loaders keep up)")
    return (f"Regime: {kind} - {a.ranks} ranks at a {a.gpu_step_ms:g} ms GPU "
            f"step (emulated: no GPU here, and a CPU model step would take "
            f"the decoders' cores) ask for {need:.0f} samples/s from {ncpu} "
            f"CPU cores; torch delivered {t:.1f}, datahelix {d:.1f}.")


def main(argv=None):
    ap = argparse.ArgumentParser(
        prog="datahelix demo",
        description="Train a small video model on 4 CPU ranks twice (torch "
        "DataLoader + PyAV, then datahelix.DataLoader) and compare.")
    ap.add_argument("--manifest", default=None,
                    help="descriptor table (JSONL, from datahelix probe); "
                    "default: make one in --out")
    ap.add_argument("--out", default="datahelix-demo",
                    help="folder for the set and the results "
                    "(default ./datahelix-demo)")
    ap.add_argument("--count", type=int, default=48,
                    help="clips to generate without --manifest (default 48)")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--batch-size", type=int, default=2)
    ap.add_argument("--frames", type=int, default=8)
    ap.add_argument("--size", type=int, default=112)
    ap.add_argument("--workers", type=int, default=2,
                    help="decode workers per rank (both loaders)")
    ap.add_argument("--gpu-step-ms", type=float, default=GPU_STEP_MS,
                    help="the emulated GPU step per batch, ms (default "
                    f"{GPU_STEP_MS:g}; see --cpu-model)")
    ap.add_argument("--cpu-model", action="store_true",
                    help="train the small model on the CPU instead of "
                    "emulating the GPU step (the CPUs then also run the "
                    "model, as no GPU job would)")
    ap.add_argument("--timeout", type=float, default=600,
                    help="bound on each training job, seconds")
    ap.add_argument("--loader", choices=[k for k, _ in LOADERS],
                    help=argparse.SUPPRESS)
    ap.add_argument("--rank-main", action="store_true",
                    help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.manifest is not None and not pathlib.Path(a.manifest).is_file():
        ap.error(f"--manifest {a.manifest}: no such file")
    for k in ("ranks", "epochs", "batch_size", "frames", "size", "workers",
              "count"):
        if getattr(a, k) < 1:
            ap.error(f"--{k.replace('_', '-')} must be >= 1")
    if a.rank_main:
        rank_main(a)
        return 0
    try:
        drive(a)
    except RuntimeError as e:
        print(f"datahelix: demo: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
