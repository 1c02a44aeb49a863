"""Datasets for tests/integration/test_distributed.py.  A module of their
own, light to import: DistributedDataLoader's workers import the classes
by reference, as torch's spawned workers would."""
import collections
import os
import signal
import threading
import time

import numpy as np
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


class KilledOnce(Suicidal):
    """SIGKILLs its process on index `bad` the first time only (a worker
    killed from outside, an OOM kill): `marker` records that it did."""

    def __init__(self, n, bad, marker):
        super().__init__(n, bad)
        self.marker = str(marker)

    def __getitem__(self, i):
        if i == self.bad and not os.path.exists(self.marker):
            open(self.marker, "w").close()
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


def keep(samples):
    """A collate_fn that keeps the list of samples as it is."""
    return samples


Pair = collections.namedtuple("Pair", ["left", "right"])


class Leaves(Dataset):
    """Sample i: every kind of value the slot format carries."""

    def __len__(self):
        return 4

    def __getitem__(self, i):
        return {"t": torch.full((2, 3), float(i)),
                "np": np.arange(i, i + 4, dtype=np.int16),
                "scalar": np.float32(i / 2),
                "plain": (i, i / 4, i % 2 == 0, None, f"s{i}",
                          bytes([i, 0, 255])),
                "pair": Pair(torch.tensor([i]), [f"r{i}"])}


class Thing:
    pass


class Opaque(Range):
    """Sample 2 holds an object the slot format cannot carry."""

    def __getitem__(self, i):
        return {"id": i, "meta": [1, 2, Thing() if i == 2 else 3]}


class RawPlan:
    """What datahelix._slot.plan_batch returns, with bytes of our choice."""

    def __init__(self, data):
        self.data, self.nbytes = data, len(data)

    def write(self, view):
        view[0:self.nbytes] = self.data


class HostileSlots:
    """worker_init_fn: the worker's first len(slots) batches are written as
    the given raw slot bytes instead (a compromised writer)."""

    def __init__(self, slots):
        self.slots = list(slots)

    def __call__(self, worker_id):
        from datahelix import _slot
        real, queue = _slot.plan_batch, list(self.slots)

        def plan(obj):
            return RawPlan(queue.pop(0)) if queue else real(obj)
        _slot.plan_batch = plan


class TableClips(Dataset):
    """Each sample of a datahelix table (files or shard members) as
    (frames, caption), decoded by datahelix.decode in the worker: a user's
    own Dataset on the C pipeline (issue 35 item 5)."""

    def __init__(self, table, frames, size):
        self.table, self.frames, self.size = table, frames, size
        self._t = None

    def _open(self):
        import datahelix
        if self._t is None:
            self._t = datahelix.Table(self.table)
        return self._t

    def __len__(self):
        return len(self._open())

    def __getitem__(self, i):
        import datahelix
        t = self._open()
        return (datahelix.decode(t.source(i), frames=self.frames,
                                 size=self.size), t.text(i))

    def __getstate__(self):
        return {"table": self.table, "frames": self.frames,
                "size": self.size, "_t": None}
