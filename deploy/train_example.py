"""A small, real training loop that the deploy/ recipes launch
(docs/deploy.md): one rank of a torchrun job (gloo on CPU, nccl when CUDA is
there), DistributedDataParallel over a tiny video model, fed by
datahelix.DataLoader.

What a recipe gives each rank, through the environment:
  DATAHELIX_COORDINATOR  the job's Coordinator (tcp://HEAD:PORT)
  DATAHELIX_KEYFILE      the job key
  DH_LISTEN_ADDR         this node's address: the rank's local DataServer
                         takes the sidecars' batches on it (unset: none come)
torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT.

  train_example.py --manifest m.dhx [--steps N] [--out DIR]

With --out, each rank writes DIR/rank{R}.json (its sample ids per step,
the steps' servers from the loader's telemetry, the job's total of samples
from an all_reduce) and DIR/tel{R}.jsonl."""
import argparse
import json
import os
import pathlib

import torch
import torch.distributed as dist

import datahelix


class TinyVideoNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv3d(3, 8, kernel_size=3, padding=1)
        self.head = torch.nn.Linear(8, 4)

    def forward(self, video):  # [B, T, H, W, 3] uint8
        x = video.permute(0, 4, 1, 2, 3).float() / 255
        x = torch.relu(self.conv(x)).mean(dim=(2, 3, 4))
        return self.head(x)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--manifest", required=True)
    ap.add_argument("--steps", type=int, default=0, help="0: the epoch")
    ap.add_argument("--batch-size", type=int, default=2)
    ap.add_argument("--frames", type=int, default=4)
    ap.add_argument("--size", type=int, default=32)
    ap.add_argument("--out")
    a = ap.parse_args()

    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) \
        if cuda else torch.device("cpu")
    model = torch.nn.parallel.DistributedDataParallel(
        TinyVideoNet().to(dev), device_ids=[dev.index] if cuda else None)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    out = pathlib.Path(a.out) if a.out else None
    tel = str(out / f"tel{rank}.jsonl") if out else None
    addr = os.environ.get("DH_LISTEN_ADDR")
    loader = datahelix.DataLoader(
        a.manifest, batch_size=a.batch_size, frames=a.frames,
        size=(a.size, a.size), rank=rank, world_size=world,
        listen=f"tcp://{addr}:0" if addr else None, telemetry=tel)
    ids = []
    for step, batch in enumerate(loader):
        if a.steps and step >= a.steps:
            break
        video = batch["video"].to(dev, non_blocking=True)
        target = torch.as_tensor(batch["ids"], device=dev) % 4
        loss = torch.nn.functional.cross_entropy(model(video), target)
        opt.zero_grad()
        loss.backward()
        opt.step()
        ids.append([int(i) for i in batch["ids"]])
    stats = loader.stats()
    loader.close()
    total = torch.tensor([sum(len(s) for s in ids)], device=dev)
    dist.all_reduce(total)
    print(f"rank {rank}/{world}: {len(ids)} steps, job total "
          f"{int(total.item())} samples, input wait p95 "
          f"{stats['epoch'].get('input_wait_p95_ms')} ms", flush=True)
    if out:
        servers = [json.loads(x)["servers"]
                   for x in pathlib.Path(tel).read_text().splitlines()
                   if x.strip()]
        (out / f"rank{rank}.json").write_text(json.dumps(
            {"rank": rank, "world": world, "ids": ids, "servers": servers,
             "total": int(total.item())}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
