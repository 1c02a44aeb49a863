#!/usr/bin/python3
"""`datahelix bench` / `make bench-live`: data-loading systems side by side
in one run, under the same CPU budget, measured with the paper's metrics
(Sec. 5.1).

Every system runs R training-rank processes (RANK / WORLD_SIZE /
MASTER_ADDR / MASTER_PORT, a fresh port per system).  Each rank, per step:
takes its batch (input wait = time blocked in next()), holds a GPU window
emulated by time.sleep() (no CPU burnt) whose length comes from the batch
under the chosen model, then a real torch.distributed all_reduce (gloo) of
a small tensor, so the wait for the slowest rank is real.  Warm-up steps
are left out of every metric.

Systems (all decode 'frames' uniform frames, shorter side resized, centre
crop to 'size', uint8 THWC):
  native        one torch.utils.data.DataLoader per rank (DistributedSampler:
                a random split), worker processes running the C decode
                (datahelix._C.decode)
  native-pyav   the same with a PyAV decode in __getitem__
  dask-pool     a Dask LocalCluster of the budget's workers serving every
                rank's per-sample tasks (the scheduler hands each task to a
                free worker); the same C decode; payloads come back by TCP
  dh-base, dh-transport, dh-prefetch, dh-ddl
                datahelix.DataLoader(ablation=...) per rank, one Coordinator
                per system run with the rung's placement policy

The CPU budget: --workers N decode workers in total for every system
(split across the ranks of rank-local systems, at least one each; the pool
gets the same total), and every process of the run pinned to N CPUs when
the machine has more.

The GPU window, per rank and step, from the batch (est_tokens = the
manifest's estimate, probed with --tokens MODEL):
  videomae   VIDEOMAE_MS_PER_FRAME x frames x batch
  qwen-vl    sum over samples of QWEN_MS_PER_TOKEN x t + QWEN_MS_PER_TOKEN2 x t^2
  dit        DIT_MS_PER_LATENT x sum of latents
(times --gpu-scale).  With --gpu the window is instead a real training
step of a small video transformer on the rank's batch (gpu_model.py) on
--gpu-device, its measured wall time.

Metrics (paper 5.1, over measured steps of all ranks): throughput
(samples/s), input-wait p50/p95, batch-ready p95 (request -> ready:
datahelix from its client telemetry; torch from the batch sampler's
hand-out to the worker's collate end; Dask from submit to the last task's
completion), DDL miss rate (the share of rank-steps whose input wait
exceeds 1 ms: the batch was not ready when the step began), cross-DS GB
per 100 steps (datahelix telemetry cross_ds_bytes; payload bytes a pool
ships from its workers; 0 for rank-local loaders), scheduler overhead
(datahelix: the Coordinator's decide_us per decision from its telemetry;
n/a for the others).
"""
import argparse
import hashlib
import json
import math
import os
import pathlib
import re
import signal
import socket
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
HERE = pathlib.Path(__file__).resolve().parent
CMD = "bench"

SYSTEMS = ("native", "native-pyav", "dask-pool", "dh-base", "dh-transport",
           "dh-prefetch", "dh-ddl")
WORKLOADS = ("S", "M", "L", "mixed", "shared")
MODELS = ("videomae", "qwen-vl", "dit")
DDL_MS = 1.0  # default data deadline: the batch was not ready when asked

# GPU-window constants (ms).  Chosen on this project's 2-core machine so
# that, for the default mixed set (16 frames at 224x224; S/M/L decode in
# about 19 / 78 / 220 ms, 106 ms mean, with datahelix's C decode on one
# core), the mean window of a rank is about 1.25x what the 2-core budget
# needs to decode its batch when 4 ranks share it:
# 4 ranks x 106 ms / 2 cores = 212 ms per sample -> ~265 ms per sample.
VIDEOMAE_MS_PER_FRAME = 16.5      # per frame per sample: 16 x 16.5 = 264 ms
QWEN_MS_PER_TOKEN = 0.0286        # visual tokens (mixed mean 6,478): 70 %
QWEN_MS_PER_TOKEN2 = 1.04e-6      # attention, per token^2 of a sample: 30 %
DIT_MS_PER_LATENT = 0.025         # latents (mixed mean 10,590)


def die_usage(msg):
    print(f"datahelix: {CMD}: {msg}", file=sys.stderr)
    sys.exit(2)


def log(msg):
    print(f"bench: {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------
# arguments

class Parser(argparse.ArgumentParser):
    def error(self, message):
        die_usage(message)


def positive(name, lo=1, hi=1 << 20):
    def conv(s):
        try:
            v = int(s)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{name} must be an integer in [{lo}, {hi}], not '{s}'")
        if not lo <= v <= hi:
            raise argparse.ArgumentTypeError(
                f"{name} must be an integer in [{lo}, {hi}], not '{s}'")
        return v
    return conv


def size_arg(s):
    try:
        w, h = (int(x) for x in s.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--size '{s}': expected WxH")
    if not (1 <= w <= 16384 and 1 <= h <= 16384):
        raise argparse.ArgumentTypeError(f"--size '{s}': sides in [1, 16384]")
    return (w, h)


def systems_arg(s):
    names = [x.strip() for x in s.split(",") if x.strip()]
    if s.strip() == "all":
        return list(SYSTEMS)
    bad = [x for x in names if x not in SYSTEMS]
    if bad or not names:
        raise argparse.ArgumentTypeError(
            f"--systems '{s}': unknown system '{bad[0] if bad else ''}' "
            f"(expected a comma-separated list of {', '.join(SYSTEMS)}, "
            "or all)")
    return list(dict.fromkeys(names))


def parse_args(argv=None):
    ap = Parser(prog="datahelix bench",
                description=__doc__.split("\n\n")[0])
    ap.add_argument("--systems", type=systems_arg, default=list(SYSTEMS))
    ap.add_argument("--ranks", type=positive("--ranks", 1, 64), default=4)
    ap.add_argument("--steps", type=positive("--steps", 1, 100000),
                    default=40)
    ap.add_argument("--warmup", type=positive("--warmup", 0, 100000),
                    default=5)
    ap.add_argument("--workload", choices=WORKLOADS, default="mixed")
    ap.add_argument("--model", choices=MODELS, default="videomae")
    ap.add_argument("--workers", type=positive("--workers", 1, 1024),
                    default=2)
    ap.add_argument("--batch-size", type=positive("--batch-size", 1, 1024),
                    default=2)
    ap.add_argument("--frames", type=positive("--frames", 1, 1024),
                    default=16)
    ap.add_argument("--size", type=size_arg, default=(224, 224))
    ap.add_argument("--prefetch", type=positive("--prefetch", 1, 64),
                    default=4)
    ap.add_argument("--clips", type=positive("--clips", 1, 100000),
                    default=24)
    ap.add_argument("--seed", type=positive("--seed", 0, 1 << 31), default=0)
    ap.add_argument("--gpu-scale", type=float, default=1.0)
    ap.add_argument("--timeout", type=positive("--timeout", 10, 86400),
                    default=0)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--out", default=str(ROOT / "bench" / "out" / "live"))
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--plots", action="store_true")
    ap.add_argument("--validate", action="store_true")
    ap.add_argument("--ddl-ms", type=float, default=DDL_MS)
    ap.add_argument("--gpu", action="store_true")
    ap.add_argument("--gpu-device", default="cuda")
    ap.add_argument("--bin", default=None)
    a = ap.parse_args(argv)
    if a.gpu and a.validate:
        die_usage("--validate simulates the emulated GPU window; it does "
                  "not take --gpu")
    if not (a.ddl_ms >= 0 and math.isfinite(a.ddl_ms)):
        die_usage(f"--ddl-ms must be a number >= 0, not '{a.ddl_ms}'")
    if not (a.gpu_scale >= 0 and math.isfinite(a.gpu_scale)):
        die_usage(f"--gpu-scale must be a number >= 0, not '{a.gpu_scale}'")
    if a.batch_size * a.ranks > 4096:
        die_usage("--ranks x --batch-size must be at most 4096")
    return a


# ---------------------------------------------------------------------------
# the GPU window

def window_ms(model, tokens, frames, scale):
    """The emulated GPU step of one rank's batch (ms)."""
    if model == "videomae":
        ms = VIDEOMAE_MS_PER_FRAME * frames * len(tokens)
    elif model == "qwen-vl":
        ms = sum(QWEN_MS_PER_TOKEN * t + QWEN_MS_PER_TOKEN2 * t * t
                 for t in tokens)
    else:
        ms = DIT_MS_PER_LATENT * sum(tokens)
    return ms * scale


def gpu_model_doc(model):
    return {
        "videomae": {"ms_per_frame_per_sample": VIDEOMAE_MS_PER_FRAME},
        "qwen-vl": {"ms_per_token": QWEN_MS_PER_TOKEN,
                    "ms_per_token_squared": QWEN_MS_PER_TOKEN2},
        "dit": {"ms_per_latent": DIT_MS_PER_LATENT},
    }[model]


# ---------------------------------------------------------------------------
# --validate: the same configuration in `datahelix sim`

# live system -> the simulator's model of it
SIM_OF = {"native": "native", "dask-pool": "pool", "dh-ddl": "datahelix"}
VALIDATE_TOLERANCE = 0.15  # issue 7: throughput within 15 %


def sim_gpu_ms(a):
    """--gpu-ms A,B,C that reproduces window_ms() sample by sample."""
    g = a.gpu_scale
    if a.model == "videomae":
        return (VIDEOMAE_MS_PER_FRAME * a.frames * g, 0.0, 0.0)
    if a.model == "qwen-vl":
        return (0.0, QWEN_MS_PER_TOKEN * g, QWEN_MS_PER_TOKEN2 * g)
    return (0.0, DIT_MS_PER_LATENT * g, 0.0)


def live_order(a, rank_files):
    """The manifest rows in the order a live system's ranks took them, from
    their step records: row ((k R + r) B + j) is rank r's j-th sample of
    step k, the layout `datahelix sim --replay-order` splits by.  None when
    a step did not hold B samples (nothing to replay exactly)."""
    per = [json.loads(pathlib.Path(f).read_text())["steps"]
           for f in rank_files]
    order = []
    for k in range(min(len(x) for x in per)):
        for steps in per:
            ids = steps[k].get("ids")
            if ids is None or len(ids) != a.batch_size:
                return None
            order += ids
    return order


def clip_decode_ms(a, paths):
    """{path: this machine's decode ms} (`datahelix decode`, median of 3,
    the run's frames and size)."""
    r = subprocess.run([a.bin, "decode", "--json", "--repeat", "3",
                        "--frames", str(a.frames), "--size",
                        f"{a.size[0]}x{a.size[1]}", *paths],
                       capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f"decode: {r.stderr.strip()[-300:]}")
    ms = {}
    for x in r.stdout.splitlines():
        j = json.loads(x)
        if "decode_ms" in j:
            ms[j["path"]] = j["decode_ms"]
    missing = [p for p in paths if p not in ms]
    if missing:
        raise RuntimeError(f"decode: no time for {missing[0]}")
    return ms


def measured_manifest(header, rows, ms, order, f):
    """The run's manifest (its header lines and rows) into f with
    est_cpu_ms replaced by each clip's measured decode ms (the simulator
    then costs what the live run cost), its rows in `order` (row ids) when
    given: the live split, replayed.  On a small set a few long clips on
    one rank move throughput by +-15 %, so only the live split compares
    like for like."""
    if order is not None:
        rows = [rows[i] for i in order]
    with open(f, "w") as w:
        for x in header:
            w.write(x + "\n")
        for pos, row in enumerate(rows):  # ids dense again, in order
            w.write(json.dumps(dict(row, id=pos, live_id=row["id"],
                                    est_cpu_ms=ms[row["path"]])) + "\n")
    return f


def calibrate_handover(a, names, man, index, split, max_ms):
    """Each live system's hand-over, measured apart from the run by
    calibrate_handover.py (null decode, same sources, the other ranks'
    decode load from the run's clips): {name: {"cpu_ms", "next_ms",
    ...}}."""
    cmd = [sys.executable, str(HERE / "calibrate_handover.py"), "--json",
           "--frames", str(a.frames), "--size", f"{a.size[0]}x{a.size[1]}",
           "--batch-size", str(a.batch_size), "--workers-per-rank",
           str(max(split)), "--workers-total", str(sum(split)),
           "--prefetch", str(a.prefetch), "--systems", ",".join(names),
           "--index", str(index), "--load-clips", str(man), "--bin", a.bin,
           "--ranks", str(a.ranks),
           # long enough for a prefetched dh batch of the longest clips
           # to be ready
           "--dh-ready-sleep-ms",
           f"{min(2000, 100 + 2 * a.batch_size * max_ms):.0f}"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise RuntimeError(f"calibrate_handover: {r.stderr.strip()[-300:]}")
    return json.loads(r.stdout)


def handover_arg(sim, terms):
    """`datahelix sim --handover SIM=A,B,C,D` for the four terms."""
    return ["--handover", f"{sim}=" + ",".join(f"{x:.6g}" for x in terms)]


def handover_args(cal):
    """--handover for the simulator from a calibration: per sample CPU and
    next() per batch, at the run's (fixed) sample size, so the per-MB
    terms are 0."""
    out = []
    for n, c in cal.items():
        out += handover_arg(SIM_OF[n], (c["cpu_ms"], 0, c["next_ms"], 0))
    return out


def validate(a, systems, man, index, split, cpus, out, live_dir):
    """Simulates the live configuration, each system replaying its own live
    split (its ranks' step records in live_dir) with its hand-over
    measured apart (calibrate_handover.py), and compares, system by
    system.  None when no comparable live system ran."""
    live = {n: systems[n] for n in SIM_OF
            if systems.get(n, {}).get("status") == "ok"}
    if not live:
        return None
    out.mkdir(parents=True, exist_ok=True)
    lines = pathlib.Path(man).read_text().splitlines()
    header = [x for x in lines if '"datahelix_header"' in x]
    rows_all = [json.loads(x) for x in lines
                if '"datahelix_header"' not in x]
    ms = clip_decode_ms(a, sorted({r["path"] for r in rows_all}))
    mean_ms = sum(ms[r["path"]] for r in rows_all) / len(rows_all)
    cal = calibrate_handover(a, list(live), man, index, split,
                             max(ms.values()))
    # CPUs shared by more workers than there are CPUs: each worker runs at
    # CPUs / workers of full speed when all are busy (the model's servers
    # own their cores).
    scale = max(1.0, sum(split) / len(cpus))
    rows, cmds = {}, {}
    for n, m in live.items():
        order = live_order(a, [live_dir / n / f"rank{r}.json"
                               for r in range(a.ranks)])
        simman = measured_manifest(header, rows_all, ms, order,
                                   out / f"sim-{n}.jsonl")
        cmd = [a.bin, "sim", "--manifest", str(simman), "--ranks",
               str(a.ranks), "--local", str(a.ranks), "--remote", "0",
               "--cores", str(round(sum(split) / a.ranks)), "--batch-size",
               str(a.batch_size), "--steps", str(a.steps), "--warmup",
               str(a.warmup), "--prefetch", str(a.prefetch), "--ddl-ms",
               str(a.ddl_ms), "--cpu-scale", f"{scale:g}", "--noise", "0.1",
               "--gpu-ms", ",".join(f"{x:.9g}" for x in sim_gpu_ms(a)),
               "--seed", str(a.seed + 1),
               *(["--replay-order"] if order is not None else []),
               "--systems", SIM_OF[n], *handover_args({n: cal[n]}), "--json"]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            raise RuntimeError(f"sim: {r.stderr.strip()[-300:]}")
        cmds[n] = cmd
        s = json.loads(r.stdout)["aggregate"][SIM_OF[n]]
        t_live, t_sim = m["throughput_samples_per_s"], s["throughput"]
        rows[n] = {
            "sim_system": SIM_OF[n],
            "live_throughput": t_live, "sim_throughput": t_sim,
            "throughput_diff": t_sim / t_live - 1 if t_live else None,
            "live_input_wait_p95_ms": m["input_wait_p95_ms"],
            "sim_input_wait_p95_ms": 1000 * s["input_wait_p95_s"],
            "live_ddl_miss_rate": m["ddl_miss_rate"],
            "sim_ddl_miss_rate": s["ddl_miss_rate"],
            "live_ready_p95_ms": m.get("batch_ready_p95_ms"),
            "sim_ready_p95_ms": 1000 * s["ready_p95_s"],
        }
        d = rows[n]["throughput_diff"]
        rows[n]["within_tolerance"] = (d is not None and
                                       abs(d) <= VALIDATE_TOLERANCE)
        rows[n]["replayed_split"] = order is not None
    return {"commands": cmds, "cpu_scale": scale,
            "mean_decode_ms": mean_ms, "tolerance": VALIDATE_TOLERANCE,
            "handover": cal, "systems": rows}


def validation_table(v):
    if not v:
        return ""
    out = ["| live system | sim system | hand-over: CPU ms / sample, next() "
           "ms | samples/s live | sim | sim vs live "
           "| input-wait p95 ms live / sim | DDL miss live / sim "
           "| batch-ready p95 ms live / sim |",
           "|---|---|---|---:|---:|---:|---|---|---|"]
    for n, r in v["systems"].items():
        h = v.get("handover", {}).get(n)
        hand = f"{h['cpu_ms']:.1f}, {h['next_ms']:.1f}" if h else "n/a"
        d = r["throughput_diff"]
        ok = ("" if r["within_tolerance"] else
              f" (over {100 * v['tolerance']:g} %)")
        ready = r["live_ready_p95_ms"]
        out.append(
            f"| {n} | {r['sim_system']} | {hand} | "
            f"{r['live_throughput']:.2f} | "
            f"{r['sim_throughput']:.2f} | "
            f"{fmt(None if d is None else 100 * d, '+.1f')} %{ok} | "
            f"{r['live_input_wait_p95_ms']:.1f} / "
            f"{r['sim_input_wait_p95_ms']:.1f} | "
            f"{100 * r['live_ddl_miss_rate']:.1f} / "
            f"{100 * r['sim_ddl_miss_rate']:.1f} % | "
            f"{fmt(ready, '.0f')} / {r['sim_ready_p95_ms']:.0f} |")
    return "\n".join(out)


# ---------------------------------------------------------------------------
# statistics

def pct(values, q):
    v = sorted(x for x in values if x is not None)
    if not v:
        return None
    if len(v) == 1:
        return v[0]
    k = (len(v) - 1) * q / 100.0
    lo = int(math.floor(k))
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


# ---------------------------------------------------------------------------
# decoders (run in loader worker processes / Dask workers)

# calibrate_handover.py's stand-in clip: a zeroed payload of the run's
# size instead of a decode, so that only the system's own work is left.
NULL_CLIP = "<null-decode>"


def c_decode(path, frames, w, h):
    if path == NULL_CLIP:
        return bytes(frames * w * h * 3)
    from datahelix import _C
    return _C.decode(path, frames, w, h)


def uniform(n, k):
    """datahelix's uniform plan: the middle frame of k equal segments."""
    return [min(int((i + 0.5) * n / k), n - 1) for i in range(k)]


def pyav_decode(path, frames, w, h):
    """PyAV: exact uniform frames (seek to the keyframe before a target,
    decode forward), shorter side resized to fit, centre crop: the same
    output as the C decode's default geometry.  One decoder thread."""
    import bisect

    import av
    import numpy as np
    c = av.open(path)
    try:
        s = c.streams.video[0]
        s.codec_context.thread_type = "NONE"
        s.codec_context.thread_count = 1
        pts, keys = [], []
        for p in c.demux(s):
            if p.size == 0 or p.pts is None:
                continue
            pts.append(p.pts)
            if p.is_keyframe:
                keys.append(p.pts)
        if not pts:
            raise RuntimeError(f"{path}: no video packets")
        pts.sort()
        keys = sorted(keys) or pts[:1]
        cc = s.codec_context
        sw = sh = None
        out, packets, cur = [], None, None
        for t in [pts[i] for i in uniform(len(pts), frames)]:
            if out and t == cur:
                out.append(out[-1])
                continue
            kt = keys[max(bisect.bisect_right(keys, t) - 1, 0)]
            if packets is None or cur is None or kt > cur:
                c.seek(kt, backward=True, any_frame=False, stream=s)
                packets = c.demux(s)
            f = None
            for p in packets:
                for fr in cc.decode(p):
                    if fr.pts is not None and fr.pts >= t:
                        f = fr
                        break
                if f is not None:
                    break
            if f is None:
                raise RuntimeError(f"{path}: pts {t} not reached")
            cur = f.pts
            if sw is None:
                r = max(w / f.width, h / f.height)
                sw, sh = max(w, round(f.width * r)), max(h, round(f.height * r))
            a = f.to_ndarray(format="rgb24", width=sw, height=sh)
            y0, x0 = (sh - h) // 2, (sw - w) // 2
            out.append(a[y0:y0 + h, x0:x0 + w])
        return np.ascontiguousarray(np.stack(out))
    finally:
        c.close()


def dask_decode(path, frames, w, h):
    """A Dask task: one clip through the C decode; bytes come back."""
    return c_decode(path, frames, w, h)


# ---------------------------------------------------------------------------
# rank side: one training rank of one system

class TorchSource:
    """native / native-pyav: torch.utils.data.DataLoader on this rank."""

    def __init__(self, cfg, rows):
        import torch
        import torch.utils.data as tud
        torch.set_num_threads(1)
        self.rows = rows
        T, (w, h) = cfg["frames"], cfg["size"]
        pyav = cfg["system"] == "native-pyav"

        class DecodeDataset(tud.Dataset):
            def __len__(self):
                return len(rows)

            def __getitem__(self, i):
                path = rows[i]["path"]
                if pyav:
                    v = torch.from_numpy(pyav_decode(path, T, w, h))
                else:
                    raw = c_decode(path, T, w, h)
                    v = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
                    v = v.view(T, h, w, 3)
                return {"video": v, "ids": i}

        def collate(samples):
            b = tud.default_collate(samples)
            b["ready_t"] = time.time()
            return b

        class TimedBatchSampler:
            """Records when each batch's indices go to a worker (the
            request), in the main process."""

            def __init__(self, sampler, batch):
                self.bs = tud.BatchSampler(sampler, batch, drop_last=True)
                self.req = {}

            def __iter__(self):
                for b in self.bs:
                    self.req[tuple(b)] = time.time()
                    yield b

            def __len__(self):
                return len(self.bs)

        sampler = tud.distributed.DistributedSampler(
            range(len(rows)), num_replicas=cfg["world"], rank=cfg["rank"],
            shuffle=True, seed=cfg["seed"], drop_last=True)
        self.bsamp = TimedBatchSampler(sampler, cfg["batch"])
        nw = cfg["workers_rank"]
        self.loader = tud.DataLoader(
            DecodeDataset(), batch_sampler=self.bsamp, num_workers=nw,
            collate_fn=collate, timeout=cfg["batch_timeout"],
            prefetch_factor=max(1, -(-cfg["prefetch"] // nw)),
            multiprocessing_context="fork")
        self.it = iter(self.loader)

    def next(self):
        b = next(self.it)
        ids = b["ids"].tolist()
        req = self.bsamp.req.pop(tuple(ids), None)
        ready = (b["ready_t"] - req) * 1e3 if req is not None else None
        tokens = [self.rows[i]["est_tokens"] for i in ids]
        return b, ids, tokens, ready, 0

    def close(self):
        self.it = None
        self.loader = None


class DaskSource:
    """dask-pool: per-sample tasks on a shared Dask LocalCluster, kept
    `prefetch` batches ahead; this rank's samples from a random split."""

    def __init__(self, cfg, rows):
        import collections
        import threading

        import torch
        import torch.utils.data as tud
        from distributed import Client
        torch.set_num_threads(1)
        sys.path.insert(0, str(HERE))
        import bench_live
        self.fn = bench_live.dask_decode
        self.rows, self.cfg = rows, cfg
        self.client = Client(cfg["dask"], timeout=60, set_as_default=False)
        sampler = tud.distributed.DistributedSampler(
            range(len(rows)), num_replicas=cfg["world"], rank=cfg["rank"],
            shuffle=True, seed=cfg["seed"], drop_last=True)
        self.batches = iter(tud.BatchSampler(sampler, cfg["batch"],
                                             drop_last=True))
        self.q = collections.deque()
        self.lock = threading.Lock()
        for _ in range(cfg["prefetch"]):
            self._submit()

    def _submit(self):
        ids = next(self.batches, None)
        if ids is None:
            return
        T, (w, h) = self.cfg["frames"], self.cfg["size"]
        done = []
        futs = [self.client.submit(self.fn, self.rows[i]["path"], T, w, h,
                                   pure=False) for i in ids]
        t_req = time.time()

        def cb(_f):
            with self.lock:
                done.append(time.time())
        for f in futs:
            f.add_done_callback(cb)
        self.q.append((ids, futs, t_req, done))

    def next(self):
        import numpy as np
        import torch
        if not self.q:
            raise StopIteration
        ids, futs, t_req, done = self.q.popleft()
        raws = [f.result(timeout=self.cfg["batch_timeout"]) for f in futs]
        T, (w, h) = self.cfg["frames"], self.cfg["size"]
        v = torch.from_numpy(np.stack([np.frombuffer(r, np.uint8)
                                       for r in raws]))
        v = v.view(len(ids), T, h, w, 3)
        with self.lock:
            ready = ((max(done) - t_req) * 1e3
                     if len(done) == len(futs) else None)
        nbytes = sum(len(r) for r in raws)
        self._submit()
        tokens = [self.rows[i]["est_tokens"] for i in ids]
        return {"video": v}, ids, tokens, ready, nbytes

    def close(self):
        for _, futs, _, _ in self.q:
            for f in futs:
                f.cancel()
        self.q.clear()
        self.client.close(timeout=10)


class DatahelixSource:
    """dh-*: datahelix.DataLoader(ablation=rung) on this rank."""

    def __init__(self, cfg, rows):
        import torch
        torch.set_num_threads(1)
        import datahelix
        self.loader = datahelix.DataLoader(
            cfg["index"], batch_size=cfg["batch"], frames=cfg["frames"],
            size=tuple(cfg["size"]), rank=cfg["rank"],
            world_size=cfg["world"], coordinator=cfg["coordinator"],
            seed=cfg["seed"], workers=cfg["workers_rank"],
            timeout=cfg["batch_timeout"], telemetry=cfg["telemetry"],
            ablation=cfg["system"][3:])
        self.it = iter(self.loader)

    def next(self):
        b = next(self.it)
        return b, b["ids"].tolist(), b["tokens"].tolist(), None, 0

    def close(self):
        self.stats = self.loader.stats()
        self.it = None
        self.loader.close()


def rank_main(cfg_path):
    """One training rank: W + N steps of next() / GPU window / all_reduce;
    writes its step records as JSON."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    cfg = json.loads(pathlib.Path(cfg_path).read_text())
    cfg["rank"] = int(os.environ["RANK"])
    cfg["world"] = int(os.environ["WORLD_SIZE"])
    cfg["workers_rank"] = cfg["workers_per_rank"][cfg["rank"]]
    cfg["telemetry"] = cfg["telemetry"].format(rank=cfg["rank"])
    rows = [json.loads(x) for x in open(cfg["manifest"])]
    rows = [r for r in rows if "id" in r]
    dist.init_process_group("gloo", rank=cfg["rank"],
                            world_size=cfg["world"],
                            timeout=timedelta(seconds=cfg["dist_timeout"]))
    kind = cfg["system"]
    src = (TorchSource if kind.startswith("native") else
           DaskSource if kind == "dask-pool" else DatahelixSource)(cfg, rows)
    x = torch.zeros(1)
    steps = []
    total = cfg["warmup"] + cfg["steps"]
    gpu = None
    if cfg.get("gpu"):
        from gpu_model import GpuStep
        gpu = GpuStep(cfg["gpu"], cfg["rank"], cfg["frames"],
                      cfg["size"], cfg["seed"])
    try:
        for k in range(total):
            t0 = time.time()
            p0 = time.perf_counter()
            b, ids, tokens, ready, nbytes = src.next()
            p1 = time.perf_counter()
            if gpu is not None:
                win, _ = gpu.step(b["video"])
            else:
                win = window_ms(cfg["model"], tokens, cfg["frames"],
                                cfg["gpu_scale"])
                time.sleep(win / 1e3)
            p2 = time.perf_counter()
            dist.all_reduce(x)
            p3 = time.perf_counter()
            del b
            steps.append({"step": k, "t0": t0, "t_end": t0 + (p3 - p0),
                          "wait_ms": (p1 - p0) * 1e3, "window_ms": win,
                          "sync_ms": (p3 - p2) * 1e3,
                          "step_ms": (p3 - p0) * 1e3, "samples": len(ids),
                          "ids": [int(i) for i in ids],
                          "tokens": sum(tokens), "ready_ms": ready,
                          "payload_bytes": nbytes})
    finally:
        src.close()
    res = {"rank": cfg["rank"], "steps": steps,
           "stats": getattr(src, "stats", None),
           "gpu": gpu.describe() if gpu is not None else None}
    tmp = cfg["result"].format(rank=cfg["rank"]) + ".tmp"
    with open(tmp, "w") as f:
        json.dump(res, f, default=str)
    os.replace(tmp, cfg["result"].format(rank=cfg["rank"]))
    dist.barrier()
    dist.destroy_process_group()


# ---------------------------------------------------------------------------
# harness: data

def run_quiet(cmd, what, timeout=900):
    p = subprocess.run([str(c) for c in cmd], capture_output=True, text=True,
                       timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"{what} failed ({p.returncode}): "
                           f"{p.stderr.strip()[-500:]}")
    return p


def decodable(a, rows):
    """The rows whose clip decodes at the run's frames and size (with the
    C decode, and with PyAV when native-pyav runs); each one left out is
    logged with the decoder's reason (the shared set holds a deliberately
    corrupt clip, which would stop every system's first rank that meets
    it, and a clip with out-of-order timestamps PyAV cannot seek in)."""
    paths = sorted({r["path"] for r in rows})
    # One decode over every clip: it goes on past a failure, printing a
    # JSON line per clip it decoded and the reason for each one it did not.
    p = subprocess.run([a.bin, "decode", "--json", "--frames",
                        str(a.frames), "--size", f"{a.size[0]}x{a.size[1]}",
                        *paths], capture_output=True, text=True,
                       timeout=120 + 10 * len(paths))
    ok = {json.loads(x).get("path") for x in p.stdout.splitlines()}
    err = p.stderr.strip().splitlines()
    bad = {}
    for path in paths:
        if path not in ok:
            bad[path] = next((x for x in err if path in x),
                             f"{path}: not decoded (exit status "
                             f"{p.returncode})")
        elif "native-pyav" in a.systems:
            # Every system gets the same samples: a clip the PyAV peer
            # cannot decode is left out for all, and said.
            try:
                pyav_decode(path, a.frames, a.size[0], a.size[1])
            except ImportError:
                pass  # native-pyav reports PyAV missing itself
            except Exception as e:  # noqa: BLE001 - any PyAV failure
                bad[path] = f"{path}: PyAV (native-pyav): {e}"
    for why in bad.values():
        log(f"left out of the run: {why}")
    return [r for r in rows if r["path"] not in bad]


def prepare_data(a, need):
    """The manifest (JSONL, `need` samples: the probed clips repeated with
    new ids) and its .dhx index.  Generated clips are cached per
    (workload, clips, seed)."""
    base = pathlib.Path(a.data_dir or (ROOT / "bench" / "out" / "live-data"))
    base.mkdir(parents=True, exist_ok=True)
    if a.workload == "shared":
        videos = pathlib.Path(os.environ.get(
            "DATAHELIX_SHARED_VIDEOS", ROOT.parent / "shared" / "data" /
            "videos"))
        if not videos.is_dir():
            raise RuntimeError(f"{videos}: not found (the shared workload "
                               "needs ../shared/data/videos)")
        d = base / "shared"
    else:
        d = base / f"{a.workload}-{a.clips}-s{a.seed}"
        videos = d / "videos"
        if not (d / "done").exists():
            log(f"generating {a.clips} {a.workload} clips into {videos}")
            run_quiet([a.bin, "gen-data", "--out", videos, "--profiles",
                       a.workload, "--count", a.clips, "--seed",
                       a.seed + 1], "gen-data")
            (d / "done").write_text("ok\n")
    d.mkdir(parents=True, exist_ok=True)
    probed = d / f"probe-{a.model}.jsonl"
    if not probed.exists():
        log(f"probing {videos} (--tokens {a.model})")
        tmp = d / f"probe-{a.model}.jsonl.tmp{os.getpid()}"
        run_quiet([a.bin, "probe", "--quiet", "--tokens", a.model,
                   "--out", tmp, videos], "probe")
        os.replace(tmp, probed)
    lines = probed.read_text().splitlines()
    header = [x for x in lines if '"datahelix_header"' in x]
    rows = [json.loads(x) for x in lines if '"datahelix_header"' not in x]
    if a.workload == "shared":
        rows = decodable(a, rows)
    if not rows:
        raise RuntimeError(f"{probed}: no samples")
    # Named by the clips it repeats: which shared clips are kept depends on
    # the frames, the size and the systems of the run.
    kept = hashlib.sha1("\n".join(r["path"] for r in rows).encode())
    stem = f"m-{a.model}-n{need}-{kept.hexdigest()[:12]}"
    m = d / f"{stem}.jsonl"
    dhx = m.with_suffix(".dhx")
    if not dhx.exists():
        tmp = d / f"{stem}.tmp{os.getpid()}.jsonl"
        with open(tmp, "w") as f:
            for h in header:
                f.write(h + "\n")
            for k in range(need):
                r = dict(rows[k % len(rows)])
                r["id"] = k
                f.write(json.dumps(r) + "\n")
        os.replace(tmp, m)
        tmpx = d / f"{stem}.tmp{os.getpid()}.dhx"
        run_quiet([a.bin, "index", m, "-o", tmpx], "index")
        os.replace(tmpx, dhx)
    return m, dhx, len(rows)


# ---------------------------------------------------------------------------
# harness: processes

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_port_pair():
    """p such that p and p + 1 are both free now (MASTER_PORT and the
    datahelix convention of a Coordinator one port up)."""
    for _ in range(64):
        p = free_port()
        try:
            with socket.socket() as s:
                s.bind(("127.0.0.1", p + 1))
            return p
        except OSError:
            continue
    raise RuntimeError("no two adjacent free TCP ports on 127.0.0.1")


def proc_stat(pid):
    """The fields of /proc/PID/stat after the command name (state first,
    then ppid, ...; utime and stime at 11 and 12), or None if it is gone."""
    try:
        st = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return st[st.rindex(")") + 2:].split()


def descendants(pid):
    """Every live descendant of `pid` (walks /proc)."""
    kids = {}
    for d in pathlib.Path("/proc").iterdir():
        fields = proc_stat(d.name) if d.name.isdigit() else None
        if fields is None or fields[0] == "Z":
            continue
        kids.setdefault(int(fields[1]), []).append(int(d.name))
    out, todo = [], [pid]
    while todo:
        for c in kids.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def kill_pids(pids, grace=5.0):
    """SIGTERM, then SIGKILL after `grace` s, each pid by itself."""
    live = []
    for p in pids:
        try:
            os.kill(p, signal.SIGTERM)
            live.append(p)
        except ProcessLookupError:
            pass
    end = time.monotonic() + grace
    while live and time.monotonic() < end:
        live = [p for p in live if alive(p)]
        time.sleep(0.05)
    for p in live:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


def alive(pid):
    fields = proc_stat(pid)
    return fields is not None and fields[0] != "Z"


class Services:
    """What one system run needs besides its ranks: a Coordinator for the
    datahelix rungs, a Dask LocalCluster for the pool."""

    def __init__(self):
        self.coord = None
        self.cluster = None

    def coordinator(self, a, policy, telemetry):
        port = free_port()
        addr = f"tcp://127.0.0.1:{port}"
        self.coord = subprocess.Popen(
            [a.bin, "coordinator", "--listen", addr, "--policy", policy,
             "--telemetry", str(telemetry), "--heartbeat-timeout-ms", "3000",
             "--exit-with-parent"], stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True)
        return addr

    def dask(self, n):
        import logging

        from distributed import LocalCluster
        self.cluster = LocalCluster(
            n_workers=n, threads_per_worker=1, processes=True,
            dashboard_address=None, scheduler_port=0, host="127.0.0.1",
            silence_logs=logging.ERROR, memory_limit=0)
        return self.cluster.scheduler_address

    def stop(self):
        if self.cluster is not None:
            try:
                self.cluster.close(timeout=20)
            except Exception as e:  # noqa: BLE001 - cleanup goes on
                log(f"dask cluster close: {e}")
            self.cluster = None
        if self.coord is not None:
            kill_pids([self.coord.pid])
            self.coord.wait(timeout=10)
            self.coord = None


def dask_available():
    try:
        import distributed  # noqa: F401
        return None
    except ImportError as e:
        return (f"python3-distributed is not importable ({e}); "
                "install it with scripts/setup-deps.sh bench")


def worker_split(total, ranks):
    """Decode workers per rank: `total` spread over the ranks, at least
    one each (a rank-local loader cannot share a worker)."""
    return [max(1, total // ranks + (1 if r < total % ranks else 0))
            for r in range(ranks)]


def run_system(name, a, data, sysdir, split):
    """Runs one system's ranks; returns ([rank results], error or None,
    wall seconds)."""
    sysdir.mkdir(parents=True, exist_ok=True)
    for f in sysdir.iterdir():
        if f.is_file():
            f.unlink()
    svc = Services()
    procs, logs, seen = [], [], {}
    t_start = time.monotonic()
    err = None
    try:
        cfg = {"system": name, "manifest": str(data["manifest"]),
               "index": str(data["index"]), "batch": a.batch_size,
               "frames": a.frames, "size": list(a.size),
               "prefetch": a.prefetch, "seed": a.seed,
               "warmup": a.warmup, "steps": a.steps, "model": a.model,
               "gpu_scale": a.gpu_scale, "workers_per_rank": split,
               "gpu": a.gpu_device if a.gpu else None,
               "batch_timeout": 120.0, "dist_timeout": 120,
               "result": str(sysdir / "rank{rank}.json"),
               "telemetry": str(sysdir / "telemetry-rank{rank}.jsonl"),
               "coordinator": None, "dask": None}
        if name.startswith("dh-"):
            from datahelix._loader import ABLATIONS
            policy = ABLATIONS[name[3:]]["policy"]
            cfg["coordinator"] = svc.coordinator(
                a, policy, sysdir / "coordinator.jsonl")
        if name == "dask-pool":
            cfg["dask"] = svc.dask(sum(split))
        cpath = sysdir / "config.json"
        cpath.write_text(json.dumps(cfg))
        port = free_port_pair()
        env = dict(os.environ, WORLD_SIZE=str(a.ranks),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
        env.pop("DATAHELIX_COORDINATOR", None)
        for r in range(a.ranks):
            lf = open(sysdir / f"rank{r}.log", "w")
            logs.append(lf)
            procs.append(subprocess.Popen(
                [sys.executable, str(pathlib.Path(__file__).resolve()),
                 "--_rank", str(cpath)], env=dict(env, RANK=str(r)),
                stdin=subprocess.DEVNULL, stdout=lf, stderr=lf,
                start_new_session=True))
        limit = a.timeout or (180 + 20 * (a.warmup + a.steps))
        err = wait_ranks(procs, t_start + limit, limit, sysdir, seen)
    except Exception as e:  # noqa: BLE001 - reported per system
        err = f"{type(e).__name__}: {e}"
    finally:
        note_descendants(procs, seen)
        kill_pids([p.pid for p in procs if p.poll() is None])
        # Children the ranks started (DataLoader workers, DataServers) that
        # outlived them: by pid, if still the same process.
        kill_pids([pid for pid, cmd in seen.items() if cmdline(pid) == cmd])
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        svc.stop()
        # Nothing of this system may run into the next one's measurement:
        # whatever this process still has below it (a Dask worker that
        # ignored close()) ends here, by pid.
        kill_pids(descendants(os.getpid()))
        for lf in logs:
            lf.close()
    wall = time.monotonic() - t_start
    results = []
    if err is None:
        for r in range(a.ranks):
            results.append(json.loads((sysdir / f"rank{r}.json").read_text()))
    return results, err, wall


def cmdline(pid):
    try:
        return pathlib.Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None


def note_descendants(procs, seen):
    """Remembers every live descendant of the ranks with its command line
    (a DataServer outlives its rank by a moment, reparented)."""
    for p in procs:
        for c in descendants(p.pid):
            if c not in seen:
                cmd = cmdline(c)
                if cmd:
                    seen[c] = cmd


PEER_GONE = re.compile(r"Connection (closed|reset) by peer|Broken pipe|"
                       r"Read error|Socket Timeout")


def root_cause(bad, logs):
    """Of the failed ranks, the one to report: a rank that fails makes its
    peers' all-reduce fail too, so the first whose log is not such an
    echo (else the first)."""
    return next((r for r in bad if not PEER_GONE.search(logs[r])), bad[0])


def wait_ranks(procs, deadline, limit, sysdir, seen):
    """None when every rank exited 0 in time; else why not."""
    failed_at = None
    next_scan = 0.0
    while True:
        if time.monotonic() >= next_scan:
            note_descendants(procs, seen)
            next_scan = time.monotonic() + 1.0
        codes = [p.poll() for p in procs]
        if all(c == 0 for c in codes):
            return None
        bad = [r for r, c in enumerate(codes) if c not in (None, 0)]
        now = time.monotonic()
        if bad and failed_at is None:
            failed_at = now
        if bad and (all(c is not None for c in codes) or
                    now - failed_at > 15):
            logs = {r: tail(sysdir / f"rank{r}.log") for r in bad}
            r = root_cause(bad, logs)
            return f"rank {r} exited {codes[r]}: {logs[r]}"
        if now > deadline:
            return (f"timed out after {limit:.0f} s "
                    f"(ranks still running: "
                    f"{[r for r, c in enumerate(codes) if c is None]})")
        time.sleep(0.2)


def tail(path, n=600):
    try:
        t = pathlib.Path(path).read_text(errors="replace").strip()
    except OSError:
        return "(no log)"
    lines = [x for x in t.splitlines() if x.strip()]
    return " | ".join(lines[-4:])[-n:]


# ---------------------------------------------------------------------------
# harness: metrics

def read_jsonl(path):
    out = []
    try:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line:
                    try:
                        out.append(json.loads(line))
                    except ValueError:
                        pass
    except OSError:
        pass
    return out


def metrics(name, results, a, sysdir, wall, split):
    W, N = a.warmup, a.steps
    recs = []
    for res in results:
        r = res["rank"]
        tel = {}
        if name.startswith("dh-"):
            for t in read_jsonl(sysdir / f"telemetry-rank{r}.jsonl"):
                tel[t.get("step")] = t
        for s in res["steps"]:
            if s["step"] < W:
                continue
            s = dict(s, rank=r)
            t = tel.get(s["step"])
            if t is not None:
                s["ready_ms"] = t.get("ready_latency_ms")
                s["cross_bytes"] = t.get("cross_ds_bytes", 0)
            else:
                s["cross_bytes"] = s.get("payload_bytes", 0)
            recs.append(s)
    if not recs:
        return {"status": "failed", "reason": "no measured steps"}
    t0 = min(s["t0"] for s in recs)
    t1 = max(s["t_end"] for s in recs)
    samples = sum(s["samples"] for s in recs)
    waits = [s["wait_ms"] for s in recs]
    ready = [s["ready_ms"] for s in recs if s.get("ready_ms") is not None]
    cross = sum(s["cross_bytes"] or 0 for s in recs)
    m = {
        "status": "ok",
        "throughput_samples_per_s": samples / (t1 - t0),
        "input_wait_p50_ms": pct(waits, 50),
        "input_wait_p95_ms": pct(waits, 95),
        "batch_ready_p95_ms": pct(ready, 95) if ready else None,
        "ddl_miss_rate": sum(1 for w in waits if w > a.ddl_ms) / len(waits),
        "miss_rate_over_10ms": sum(1 for w in waits if w > 10) / len(waits),
        "step_miss_rate": None,
        "cross_ds_gb_per_100_steps": cross / 1e9 / N * 100,
        "scheduler_overhead_us": None,
        "scheduler_decisions": None,
        "step_ms_p50": pct([s["step_ms"] for s in recs], 50),
        "sync_wait_p95_ms": pct([s["sync_ms"] for s in recs], 95),
        "window_ms_mean": sum(s["window_ms"] for s in recs) / len(recs),
        "measured_steps": N, "ranks": a.ranks, "samples": samples,
        "decode_workers": sum(split), "wall_s": wall,
    }
    # A global step missed if any rank waited.
    by_step = {}
    for s in recs:
        by_step[s["step"]] = by_step.get(s["step"], False) or \
            s["wait_ms"] > a.ddl_ms
    m["step_miss_rate"] = sum(by_step.values()) / len(by_step)
    gm = [r["gpu"] for r in results if r.get("gpu")]
    if gm:
        m["gpu_model"] = gm[0]
    if name.startswith("dh-"):
        dec = [d["decide_us"] for d in read_jsonl(sysdir / "coordinator.jsonl")
               if "decide_us" in d]
        if dec:
            m["scheduler_overhead_us"] = sum(dec) / len(dec)
            m["scheduler_decisions"] = len(dec)
            m["scheduler_overhead_us_p95"] = pct(dec, 95)
    m["per_rank_wait"] = {str(r): [(s["step"], s["wait_ms"]) for s in recs
                                   if s["rank"] == r]
                          for r in range(a.ranks)}
    return m


def ratio(x, y):
    if x is None or y is None or y == 0:
        return None
    return x / y


def comparisons(systems):
    """dh-ddl against native and dask-pool, and the issue's targets."""
    dh = systems.get("dh-ddl", {})
    out = {}
    for peer in ("native", "dask-pool"):
        p = systems.get(peer, {})
        if dh.get("status") != "ok" or p.get("status") != "ok":
            continue
        c = {
            "throughput_x": ratio(dh["throughput_samples_per_s"],
                                  p["throughput_samples_per_s"]),
            "input_wait_p95_change": change(dh["input_wait_p95_ms"],
                                            p["input_wait_p95_ms"]),
            "ddl_miss_change": change(dh["ddl_miss_rate"],
                                      p["ddl_miss_rate"]),
            "batch_ready_p95_change": change(dh["batch_ready_p95_ms"],
                                             p["batch_ready_p95_ms"]),
        }
        if peer == "native":
            c["targets"] = {
                "ddl_miss_-70%": met(c["ddl_miss_change"], lambda v: v <= -0.70),
                "input_wait_p95_-90%": met(c["input_wait_p95_change"],
                                           lambda v: v <= -0.90),
                "throughput_1.3x": met(c["throughput_x"], lambda v: v >= 1.3),
            }
        else:
            c["targets"] = {
                "throughput_1.2x": met(c["throughput_x"], lambda v: v >= 1.2),
                "lower_ddl_miss": dh["ddl_miss_rate"] < p["ddl_miss_rate"],
            }
        out[f"dh-ddl_vs_{peer}"] = c
    return out


def change(x, y):
    """Relative change of x against y (-0.7 = 70 % lower)."""
    if x is None or y is None:
        return None
    if y == 0:
        return 0.0 if x == 0 else None
    return x / y - 1.0


def met(v, test):
    return None if v is None else bool(test(v))


# ---------------------------------------------------------------------------
# harness: output

def fmt(v, spec, none="n/a"):
    return none if v is None else format(v, spec)


def table(systems, a):
    nat = systems.get("native", {})
    base = nat.get("throughput_samples_per_s") if nat.get("status") == "ok" \
        else None
    lines = ["| system | samples/s | vs native | input-wait p50 / p95 ms | "
             "batch-ready p95 ms | DDL miss (rank-steps) | steps with a miss | "
             "cross-DS GB / 100 steps | sched. µs / decision | step p50 ms |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name in a.systems:
        m = systems.get(name, {})
        if m.get("status") != "ok":
            lines.append(f"| {name} | {m.get('status', '?')}: "
                         f"{m.get('reason', '')} |||||||||")
            continue
        tp = m["throughput_samples_per_s"]
        lines.append(
            f"| {name} | {tp:.2f} | "
            f"{fmt(ratio(tp, base), '.2f')}{'×' if base else ''} | "
            f"{m['input_wait_p50_ms']:.1f} / {m['input_wait_p95_ms']:.1f} | "
            f"{fmt(m['batch_ready_p95_ms'], '.0f')} | "
            f"{100 * m['ddl_miss_rate']:.1f} % | "
            f"{100 * m['step_miss_rate']:.1f} % | "
            f"{m['cross_ds_gb_per_100_steps']:.2f} | "
            f"{fmt(m['scheduler_overhead_us'], '.2f')} | "
            f"{m['step_ms_p50']:.0f} |")
    return "\n".join(lines)


def comparison_text(comp):
    out = []
    for key, c in comp.items():
        peer = key.split("_vs_")[1]
        tg = ", ".join(f"{k}: {'met' if v else 'not met' if v is not None else 'n/a'}"
                       for k, v in c["targets"].items())
        out.append(
            f"dh-ddl vs {peer}: throughput {fmt(c['throughput_x'], '.2f')}×, "
            f"input-wait p95 {pct_change(c['input_wait_p95_change'])}, "
            f"DDL miss {pct_change(c['ddl_miss_change'])}, "
            f"batch-ready p95 {pct_change(c['batch_ready_p95_change'])} "
            f"({tg})")
    return "\n".join(out)


def pct_change(v):
    return "n/a" if v is None else f"{100 * v:+.0f} %"


def plots(systems, a, out):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        log(f"--plots: matplotlib is not importable ({e}); no plots "
            "(scripts/setup-deps.sh bench installs python3-matplotlib)")
        return []
    ok = [n for n in a.systems if systems.get(n, {}).get("status") == "ok"]
    if not ok:
        return []
    files = []
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.bar(ok, [systems[n]["throughput_samples_per_s"] for n in ok])
    ax.set_ylabel("samples/s")
    ax.set_title(f"throughput, {a.ranks} ranks, {a.workers}-CPU budget, "
                 f"{a.workload}/{a.model}")
    ax.tick_params(axis="x", rotation=30)
    fig.tight_layout()
    files.append(out / "throughput.png")
    fig.savefig(files[-1])
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(8, 4))
    ax.bar(ok, [100 * systems[n]["ddl_miss_rate"] for n in ok])
    ax.set_ylabel("DDL miss rate, % of rank-steps")
    ax.set_title(f"DDL misses (input wait > {a.ddl_ms:g} ms)")
    ax.tick_params(axis="x", rotation=30)
    fig.tight_layout()
    files.append(out / "miss_rate.png")
    fig.savefig(files[-1])
    plt.close(fig)

    fig, axes = plt.subplots(len(ok), 1, figsize=(9, 2.2 * len(ok)),
                             sharex=True, squeeze=False)
    for ax, n in zip(axes[:, 0], ok):
        for r, pts in sorted(systems[n]["per_rank_wait"].items()):
            ax.plot([p[0] for p in pts], [p[1] for p in pts],
                    label=f"rank {r}", lw=1)
        ax.set_ylabel("wait ms")
        ax.set_title(n, fontsize=9)
    axes[-1, 0].set_xlabel("step")
    axes[0, 0].legend(fontsize=7, ncol=min(a.ranks, 8))
    fig.tight_layout()
    files.append(out / "input_wait_timeline.png")
    fig.savefig(files[-1])
    plt.close(fig)
    return files


# ---------------------------------------------------------------------------

def find_bin(a):
    b = a.bin or os.environ.get("DATAHELIX_BIN") or \
        str(ROOT / "build" / "datahelix")
    if not os.access(b, os.X_OK):
        die_usage(f"the datahelix program was not found at {b}: run `make "
                  "build` or set DATAHELIX_BIN")
    return os.path.abspath(b)


def pin_cpus(n):
    """Confines this process (and so every child) to n CPUs when the
    machine has more; returns the CPUs used."""
    have = sorted(os.sched_getaffinity(0))
    if n < len(have):
        os.sched_setaffinity(0, have[:n])
        return have[:n]
    return have


def interrupted(signum, _frame):
    # Unwinds through run_system's cleanup: every rank, DataServer,
    # Coordinator and Dask worker of the run ends by pid.
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv=None):
    a = parse_args(argv)
    signal.signal(signal.SIGTERM, interrupted)
    a.bin = find_bin(a)
    if a.gpu:
        from gpu_model import cuda_missing  # beside this script
        why = cuda_missing(a.gpu_device)
        if why:
            die_usage(why)
    out = pathlib.Path(a.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        die_usage(f"--out {out}: {e.strerror}")
    cpus = pin_cpus(a.workers)
    # Every child (ranks, Dask workers) imports datahelix and this file.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT / "python"), str(HERE)] +
        ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []))
    os.environ["DATAHELIX_BIN"] = a.bin
    sys.path[:0] = [str(ROOT / "python"), str(HERE)]
    split = worker_split(a.workers, a.ranks)
    need = a.ranks * a.batch_size * (a.warmup + a.steps + 2)
    t_all = time.monotonic()
    try:
        man, dhx, distinct = prepare_data(a, need)
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        print(f"datahelix: {CMD}: data: {e}", file=sys.stderr)
        return 1
    data = {"manifest": man, "index": dhx}
    if sum(split) != a.workers:
        log(f"{a.workers} decode workers for {a.ranks} ranks: a rank-local "
            f"loader needs one per rank, so every system gets {sum(split)} "
            f"workers, all on the same {len(cpus)} CPUs")
    systems = {}
    for name in a.systems:
        if name == "dask-pool":
            why = dask_available()
            if why:
                log(f"dask-pool skipped: {why}")
                systems[name] = {"status": "skipped", "reason": why}
                continue
        log(f"{name}: {a.ranks} ranks x {a.warmup}+{a.steps} steps ...")
        results, err, wall = run_system(name, a, data, out / name, split)
        if err:
            log(f"{name}: failed: {err}")
            systems[name] = {"status": "failed", "reason": err,
                             "wall_s": wall}
            continue
        systems[name] = metrics(name, results, a, out / name, wall, split)
        m = systems[name]
        log(f"{name}: {m['throughput_samples_per_s']:.2f} samples/s, "
            f"wait p95 {m['input_wait_p95_ms']:.1f} ms, miss "
            f"{100 * m['ddl_miss_rate']:.0f} % ({wall:.0f} s)")
    comp = comparisons(systems)
    val = None
    if a.validate:
        try:
            val = validate(a, systems, man, dhx, split, cpus,
                           out / "validate", out)
        except (RuntimeError, subprocess.TimeoutExpired, ValueError,
                KeyError) as e:
            val = {"error": str(e)}
            log(f"validate: failed: {e}")
    res = {
        "config": {"systems": a.systems, "ranks": a.ranks,
                   "steps": a.steps, "warmup": a.warmup,
                   "workload": a.workload, "model": a.model,
                   "workers": a.workers, "decode_workers_per_rank": split,
                   "cpus": cpus, "batch_size": a.batch_size,
                   "frames": a.frames, "size": list(a.size),
                   "prefetch": a.prefetch, "clips": distinct,
                   "samples_in_manifest": need, "seed": a.seed,
                   "ddl_ms": a.ddl_ms, "gpu_scale": a.gpu_scale,
                   "gpu_model": gpu_model_doc(a.model),
                   "gpu_device": a.gpu_device if a.gpu else None},
        "systems": systems, "comparisons": comp,
        "wall_s": time.monotonic() - t_all,
    }
    if val is not None:
        res["validation"] = val
    md = table(systems, a)
    if val and "systems" in val:
        md += ("\n\nSimulated (`datahelix sim`, the same configuration, "
               f"decode {val['mean_decode_ms']:.1f} ms a sample measured "
               f"here, CPU scale {val['cpu_scale']:g}) against live:\n\n" +
               validation_table(val))
    text = comparison_text(comp)
    (out / "results.json").write_text(json.dumps(res, indent=1))
    (out / "table.md").write_text(md + "\n\n" + text + "\n")
    if a.plots:
        for f in plots(systems, a, out):
            log(f"wrote {f}")
    if a.json:
        slim = json.loads(json.dumps(res))
        for m in slim["systems"].values():
            m.pop("per_rank_wait", None)
        print(json.dumps(slim))
    else:
        print(f"{a.ranks} ranks x batch {a.batch_size}, {a.workload} "
              f"({distinct} clips), {a.model} window, {a.workers} decode "
              f"workers budget ({sum(split)} used) on {len(cpus)} CPUs, "
              f"{a.warmup} warm-up + {a.steps} measured steps\n")
        print(md)
        if text:
            print("\n" + text)
    ok = [n for n, m in systems.items() if m.get("status") == "ok"]
    return 0 if ok else 1


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--_rank":
        rank_main(sys.argv[2])
    else:
        try:
            sys.exit(main())
        except KeyboardInterrupt:
            print(f"datahelix: {CMD}: interrupted", file=sys.stderr)
            sys.exit(130)
