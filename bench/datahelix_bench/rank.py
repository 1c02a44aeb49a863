"""A training rank of one system: the child entry point,
`python3 -m datahelix_bench.rank CONFIG.json`, started by
processes.run_system() with RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT
set.  Per step: next() (the input wait), the GPU window (emulated, or
--gpu's real model step), an all_reduce; writes its step records as JSON
for the harness (metrics.py).
"""
import json
import os
import pathlib
import sys
import time

from .sources import DaskSource, DatahelixSource, TorchSource
from .window import window_ms


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
    if cfg.get("trace"):
        cfg["trace"] = cfg["trace"].format(rank=cfg["rank"])
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


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python3 -m datahelix_bench.rank CONFIG.json "
                 "(started by `datahelix bench`, one per rank)")
    rank_main(sys.argv[1])
