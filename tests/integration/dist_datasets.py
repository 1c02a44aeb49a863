"""Datasets for tests/integration/test_distributed.py.  A module of their
own, light to import: DistributedDataLoader's workers import the classes
by reference, as torch's spawned workers would."""
import os
import signal
import threading
import time

import torch
from torch.utils.data import Dataset, get_worker_info

INIT_MARK = None


def init_fn(worker_id):
    global INIT_MARK
    INIT_MARK = 100 + worker_id


class Range(Dataset):
    """Sample i is i (an int): batches collate to int64 tensors."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return i


class Nested(Dataset):
    """A tuple of a tensor and a dict of an int, a string and a tensor."""

    def __len__(self):
        return 6

    def __getitem__(self, i):
        return (torch.full((2, 3), float(i)),
                {"id": i, "name": f"s{i}", "mask": torch.tensor([i, -i])})


class Failing(Dataset):
    """Raises `exc` (ValueError by default) for index `bad`."""

    def __init__(self, n, bad, exc=ValueError):
        self.n, self.bad, self.exc = n, bad, exc

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i == self.bad:
            raise self.exc(f"bad index {i}")
        return i


class WorkerInfoSet(Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        info = get_worker_info()
        return {"i": i, "id": info.id, "num_workers": info.num_workers,
                "base": info.seed - info.id,
                "own_copy": info.dataset is self, "mark": INIT_MARK}


class Sleepy(Dataset):
    """Sleeps `secs` on index `slow` (bounded, so nothing waits forever)."""

    def __init__(self, n, slow, secs):
        self.n, self.slow, self.secs = n, slow, secs

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i == self.slow:
            time.sleep(self.secs)  # the slow sample under test, not a wait
        return i


class Suicidal(Dataset):
    """SIGKILLs its own process on index `bad` (a crashing decoder)."""

    def __init__(self, n, bad):
        self.n, self.bad = n, bad

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i == self.bad:
            os.kill(os.getpid(), signal.SIGKILL)
        return i


class Random(Dataset):
    """A random draw per sample, from torch's generator."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        return torch.rand(())


class Images(Dataset):
    """Larger tensors (zero-copy checks) and a numpy array."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        return torch.full((3, 64, 64), i, dtype=torch.uint8)


class Costed(Range):
    def estimate_cost(self, i):
        return 1.0 + i


class Unpicklable(Range):
    def __init__(self, n):
        super().__init__(n)
        self.lock = threading.Lock()


class BrokenOnLoad(Range):
    """Pickles, but cannot be unpickled (as a dataset whose module the
    worker cannot import)."""

    def __setstate__(self, state):
        raise ImportError("no module named 'private_codec'")


class Blob(Dataset):
    """Sample i: `size` bytes of value i % 251 (as a uint8 tensor)."""

    def __init__(self, n, size):
        self.n, self.size = n, size

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.full((self.size,), i % 251, dtype=torch.uint8)
