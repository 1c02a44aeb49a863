"""bench_ddl.py's dataset, in a module of its own: DistributedDataLoader's
workers import it by reference."""
import time

import torch
from torch.utils.data import Dataset


class Images(Dataset):
    """Sample i: a uint8 3 x side x side image made from i, after
    `work_ms` of CPU (a decode's stand-in)."""

    def __init__(self, n, side, work_ms):
        self.n, self.side, self.work_s = n, side, work_ms / 1e3

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        end = time.perf_counter() + self.work_s
        while time.perf_counter() < end:
            pass
        g = torch.Generator().manual_seed(i)
        return torch.randint(0, 256, (3, self.side, self.side),
                             dtype=torch.uint8, generator=g), i
