"""Datasets for tests/integration/test_torch_semantics.py (and the resume
scripts it runs): light to import, since torch's spawned workers and
DistributedDataLoader's workers import them by reference."""
import collections
import os
import signal
import time

import torch
from torch.utils.data import IterableDataset, get_worker_info

from dist_datasets import Range  # noqa: F401 (sample i is i; also ours)

Point = collections.namedtuple("Point", "x y")


def shard(n):
    """This worker's share of range(n) (all of it in the main process)."""
    wi = get_worker_info()
    lo, step = (0, 1) if wi is None else (wi.id, wi.num_workers)
    return range(lo, n, step)


class Stream(IterableDataset):
    """range(n) split over the workers by get_worker_info()."""

    def __init__(self, n, secs=0.0):
        self.n, self.secs = n, secs

    def __iter__(self):
        for i in shard(self.n):
            if self.secs:
                time.sleep(self.secs)
            yield i


class Sized(Stream):
    def __len__(self):
        return self.n


class Unsplit(IterableDataset):
    """Every worker yields all of range(n): len() says n, so a loader
    with 2 workers fetches 2n (torch warns)."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __iter__(self):
        return iter(range(self.n))


class Uneven(IterableDataset):
    """Worker w yields (w + 1) * k items, 100 * w + j: the streams end at
    different times."""

    def __init__(self, k):
        self.k = k

    def __iter__(self):
        wi = get_worker_info()
        w = 0 if wi is None else wi.id
        return iter([100 * w + j for j in range((w + 1) * self.k)])


class Info(IterableDataset):
    """One item per worker: what get_worker_info() and the seeds say."""

    def __iter__(self):
        wi = get_worker_info()
        yield {"id": wi.id, "num_workers": wi.num_workers, "seed": wi.seed,
               "initial_seed": torch.initial_seed(),
               "dataset_is_copy": type(wi.dataset).__name__,
               "draw": torch.randint(0, 1 << 30, (1,)).item(),
               "mark": getattr(wi.dataset, "mark", None)}


class RaisesInIter(IterableDataset):
    def __iter__(self):
        raise ValueError("no stream today")


class RaisesAt(IterableDataset):
    def __init__(self, n, bad):
        self.n, self.bad = n, bad

    def __iter__(self):
        for i in range(self.n):
            if i == self.bad:
                raise KeyError(f"item {i} is bad")
            yield i


class Counter(IterableDataset):
    """range(n) split by worker, with its position as its own state
    (the StatefulDataLoader contract: state_dict / load_state_dict)."""

    def __init__(self, n):
        self.n, self.pos = n, 0
        self.loaded = None

    def __iter__(self):
        s = list(shard(self.n))
        while self.pos < len(s):
            self.pos += 1
            yield s[self.pos - 1]
        self.pos = 0

    def state_dict(self):
        return {"pos": self.pos}

    def load_state_dict(self, st):
        self.pos = int(st["pos"])
        self.loaded = dict(st)


class Pids(IterableDataset):
    def __iter__(self):
        yield os.getpid()


class Noisy(Range):
    """Sample i with a random draw: the same on a resume (ours: the draws
    follow (base seed, index))."""

    def __getitem__(self, i):
        return torch.tensor([i, torch.randint(0, 1000, (1,)).item()])


class Killer(Range):
    """Sample `bad` kills its worker with SIGKILL, every time."""

    def __init__(self, n, bad):
        super().__init__(n)
        self.bad = bad

    def __getitem__(self, i):
        if i == self.bad:
            os.kill(os.getpid(), signal.SIGKILL)
        return i


class Slow(Range):
    """Every sample but the first takes 30 s."""

    def __getitem__(self, i):
        if i:
            time.sleep(30)
        return i


class Collections(Range):
    """Every kind default_collate converts: a namedtuple, a dict, a list,
    strings, floats, tensors."""

    def __getitem__(self, i):
        return {"t": torch.full((2,), i), "p": Point(i, float(i) / 2),
                "l": [i, str(i)], "s": f"s{i}", "none_free": (i, i + 1)}


def init_mark(worker_id):
    wi = get_worker_info()
    wi.dataset.mark = 1000 + worker_id


class Growing(Range):
    """A map-style dataset the training loop extends between epochs;
    sample i says the length of the copy that loaded it."""

    def __getitem__(self, i):
        return (i, self.n)

    def grow(self, k):
        self.n += k


class KilledOnceStream(IterableDataset):
    """range(n) split by worker; the worker reaching item `bad` kills
    itself with SIGKILL the first time (`marker` says it did)."""

    def __init__(self, n, bad, marker):
        self.n, self.bad, self.marker = n, bad, str(marker)

    def __iter__(self):
        for i in shard(self.n):
            if i == self.bad and not os.path.exists(self.marker):
                open(self.marker, "w").close()
                os.kill(os.getpid(), signal.SIGKILL)
            yield i


def init_fails(worker_id):
    raise ValueError(f"worker {worker_id} cannot start today")


class Sleepy(Range):
    """Every sample takes `secs` seconds."""

    def __init__(self, n, secs):
        super().__init__(n)
        self.secs = secs

    def __getitem__(self, i):
        time.sleep(self.secs)
        return i


class Together(Range):
    """Each sample waits until `n` workers hold one at once (a
    multiprocessing.Barrier, shared by inheritance: it cannot be pickled),
    then says which process loaded it."""

    def __init__(self, n):
        import multiprocessing
        super().__init__(n)
        self.barrier = multiprocessing.get_context("fork").Barrier(n)

    def __getitem__(self, i):
        self.barrier.wait(30)  # BrokenBarrierError: fewer ran at once
        return os.getpid()


class WhoLoads(Range):
    """Sample i is the pid of the process that loaded it."""

    def __getitem__(self, i):
        return os.getpid()


def seed_12345(worker_id):
    torch.manual_seed(12345)


class InitialSeed(Range):
    """Sample i is torch.initial_seed() in the worker that loaded it."""

    def __getitem__(self, i):
        return torch.initial_seed()


class Nested(Range):
    """Batches of a namedtuple made in a class body, whose __qualname__
    is its typename alone ("Pair"), not "Nested.Pair"."""
    Pair = collections.namedtuple("Pair", ["a", "b"])

    def __getitem__(self, i):
        return Nested.Pair(i, -i)
