"""datahelix.DistributedDataLoader (DESIGN.md 4.3 and 8; docs/python.md
"DistributedDataLoader"): any map-style torch Dataset, loaded by Python
worker processes of the rank's local DataServer, handed over through the
shared-memory arena.

The semantics suite runs the same assertions against
torch.utils.data.DataLoader and against ours (parametrized over the two):
order, shuffle, drop_last, len, iterating twice, break, collate, custom
collate_fn, batch_sampler, exceptions with the worker's traceback,
get_worker_info(), worker_init_fn, timeout.  Then what only ours has:
zero copy, ranks' shares, the cost hints in the index, a worker killed or
hung mid-batch, a dataset that cannot be loaded, and no process or file
left behind after close() or SIGKILL of the training process.
"""
import json
import os
import pathlib
import signal
import struct
import subprocess
import sys
import textwrap
import time

import pytest

from conftest import ROOT, run_dh
from procs import alive, arena_mapping, children, descendants, wait_until

torch = pytest.importorskip("torch")
sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import datahelix  # noqa: E402
import dist_datasets as dd  # noqa: E402
from both_loaders import binary_env, make  # noqa: E402,F401
from torch.utils.data import (BatchSampler, DistributedSampler,  # noqa: E402
                              SequentialSampler, SubsetRandomSampler)


@pytest.fixture
def ours():
    made = []

    def mk(*args, **kw):
        kw.setdefault("num_workers", 2)
        kw.setdefault("timeout", 60)
        loader = datahelix.DistributedDataLoader(*args, **kw)
        made.append(loader)
        return loader

    yield mk
    for loader in made:
        loader.close()


def lists(loader):
    return [b.tolist() for b in loader]


def flat(loader):
    return [i for b in loader for i in b.tolist()]


# ---- the semantics suite: torch's DataLoader and ours --------------------

def test_order_len_drop_last(make):
    loader = make(dd.Range(10), batch_size=4)
    assert len(loader) == 3
    assert lists(loader) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    loader = make(dd.Range(10), batch_size=4, drop_last=True)
    assert len(loader) == 2
    assert lists(loader) == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_shuffle_with_a_seeded_generator_is_reproducible(make):
    a = make(dd.Range(20), batch_size=3, shuffle=True,
             generator=torch.Generator().manual_seed(7))
    first, second = flat(a), flat(a)
    assert sorted(first) == sorted(second) == list(range(20))
    assert first != second  # the generator moved on, as torch's does
    b = make(dd.Range(20), batch_size=3, shuffle=True,
             generator=torch.Generator().manual_seed(7))
    assert flat(b) == first and flat(b) == second


def test_distributed_sampler_set_epoch(make):
    ds = dd.Range(17)
    loader = make(ds, batch_size=4,
                  sampler=DistributedSampler(ds, num_replicas=1, rank=0,
                                             shuffle=True, seed=3))
    e0 = flat(loader)
    loader.sampler.set_epoch(1)
    e1 = flat(loader)
    want = list(DistributedSampler(ds, num_replicas=1, rank=0, seed=3))
    assert e0 == want and sorted(e1) == list(range(17)) and e1 != e0


def test_iterate_twice_and_break_then_iterate_again(make):
    loader = make(dd.Range(9), batch_size=2)
    first = lists(loader)
    for k, b in enumerate(loader):
        if k == 1:
            break
    assert lists(loader) == first == [[0, 1], [2, 3], [4, 5], [6, 7], [8]]
    it = iter(loader)
    assert len(it) == len(loader) == 5
    assert next(it).tolist() == [0, 1]


def test_collate_of_tuples_and_dicts(make):
    batches = list(make(dd.Nested(), batch_size=4))
    assert len(batches) == 2
    x, d = batches[0]
    assert x.shape == (4, 2, 3) and x.dtype == torch.float32
    assert x[:, 0, 0].tolist() == [0, 1, 2, 3]
    assert d["id"].tolist() == [0, 1, 2, 3]
    assert d["name"] == ["s0", "s1", "s2", "s3"]
    assert d["mask"].tolist() == [[0, 0], [1, -1], [2, -2], [3, -3]]
    assert batches[1][1]["id"].tolist() == [4, 5]


def test_custom_collate_fn_and_batch_size_none(make):
    loader = make(dd.Range(7), batch_size=3,
                  collate_fn=lambda b: {"n": len(b), "sum": sum(b)})
    assert list(loader) == [{"n": 3, "sum": 3}, {"n": 3, "sum": 12},
                            {"n": 1, "sum": 6}]
    loader = make(dd.Range(3), batch_size=None)
    assert list(loader) == [0, 1, 2] and len(loader) == 3


def test_batch_sampler_and_sampler(make):
    loader = make(dd.Range(10), batch_sampler=[[3, 1], [0], [2, 4, 5]])
    assert len(loader) == 3
    assert lists(loader) == [[3, 1], [0], [2, 4, 5]]
    sub = [9, 2, 7, 4]
    loader = make(dd.Range(10), batch_size=3, sampler=SubsetRandomSampler(
        sub, generator=torch.Generator().manual_seed(1)))
    assert sorted(flat(loader)) == sorted(sub) and len(loader) == 2
    loader = make(dd.Range(10), batch_sampler=BatchSampler(
        SequentialSampler(range(5)), 2, drop_last=True))
    assert lists(loader) == [[0, 1], [2, 3]]


@pytest.mark.parametrize("exc", [ValueError, KeyError])
def test_exception_reaches_its_own_next_with_the_traceback(make, exc):
    it = iter(make(dd.Failing(10, 5, exc), batch_size=2))
    assert next(it).tolist() == [0, 1]
    assert next(it).tolist() == [2, 3]
    with pytest.raises(exc) as ei:
        next(it)
    msg = str(ei.value)
    assert f"Caught {exc.__name__}" in msg, msg
    assert "Traceback (most recent call last)" in msg, msg
    assert "in __getitem__" in msg and "bad index 5" in msg, msg
    assert not msg.startswith("'"), msg  # KeyError: readable, not a repr
    # The step is consumed; the next ones come as if nothing happened.
    assert next(it).tolist() == [6, 7]
    assert next(it).tolist() == [8, 9]
    with pytest.raises(StopIteration):
        next(it)


def test_get_worker_info_and_worker_init_fn(make):
    rows = []
    for b in make(dd.WorkerInfoSet(), batch_size=2,
                  worker_init_fn=dd.init_fn):
        rows += [dict(zip(b, v)) for v in zip(*(
            b[k].tolist() for k in b))]
    assert [r["i"] for r in rows] == list(range(8))
    for r in rows:
        assert r["num_workers"] == 2 and r["id"] in (0, 1), r
        assert r["own_copy"] and r["mark"] == 100 + r["id"], r
    assert len({r["base"] for r in rows}) == 1  # seed = base + worker id
    assert torch.utils.data.get_worker_info() is None


def test_timeout(make):
    loader = make(dd.Sleepy(4, slow=1, secs=8), batch_size=1, num_workers=1,
                  timeout=1)
    it = iter(loader)
    assert next(it).tolist() == [0]
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="timed out after 1"):
        next(it)
    assert time.monotonic() - t0 < 5


def test_pin_memory_is_accepted(make):
    b = next(iter(make(dd.Images(), batch_size=2, pin_memory=True)))
    assert b.shape == (2, 3, 64, 64)
    assert b.is_pinned() == torch.cuda.is_available()


# ---- ours ----------------------------------------------------------------

def test_batches_are_views_of_the_arena(ours):
    import numpy as np

    loader = ours(dd.Images(), batch_size=4)
    b = next(iter(loader))
    assert b.shape == (4, 3, 64, 64) and b[3].eq(3).all()
    assert "memfd:datahelix-arena" in arena_mapping(b.data_ptr())
    # A numpy array in a batch (the slot format's arrays): no copy.
    loader = ours(dd.Range(6), batch_size=3,
                  collate_fn=lambda x: {"np": np.array(x, dtype=np.int64),
                                        "t": torch.tensor(x)})
    got = list(loader)
    assert [g["np"].tolist() for g in got] == [[0, 1, 2], [3, 4, 5]]
    ptr = got[1]["np"].__array_interface__["data"][0]
    assert "memfd:datahelix-arena" in arena_mapping(ptr)
    assert "memfd:datahelix-arena" in arena_mapping(got[1]["t"].data_ptr())


def test_every_leaf_kind_travels_and_tensors_stay_views(ours):
    import numpy as np

    got = [s for b in ours(dd.Leaves(), batch_size=2, collate_fn=dd.keep)
           for s in b]
    assert len(got) == 4
    for i, s in enumerate(got):
        assert s["t"].tolist() == [[float(i)] * 3] * 2
        assert s["np"].dtype == np.int16 and s["np"].tolist() == \
            list(range(i, i + 4))
        assert type(s["scalar"]) is np.float32 and s["scalar"] == i / 2
        assert s["plain"] == (i, i / 4, i % 2 == 0, None, f"s{i}",
                              bytes([i, 0, 255]))
        assert type(s["pair"]).__name__ == "Pair" and \
            s["pair"]._fields == ("left", "right")
        assert s["pair"].left.tolist() == [i] and s["pair"].right == [f"r{i}"]
        for ptr in (s["t"].data_ptr(), s["pair"].left.data_ptr(),
                    s["np"].__array_interface__["data"][0]):
            assert "memfd:datahelix-arena" in arena_mapping(ptr)


def test_a_value_the_format_cannot_carry_fails_in_the_worker(ours):
    it = iter(ours(dd.Opaque(4), batch_size=1, collate_fn=dd.keep,
                   num_workers=1))
    assert [next(it)[0]["id"] for _ in range(2)] == [0, 1]
    with pytest.raises(datahelix.SampleError) as ei:
        next(it)
    msg = str(ei.value)
    assert isinstance(ei.value, TypeError), type(ei.value).__mro__
    assert "batch[0]['meta'][2]: type dist_datasets.Thing" in msg, msg
    assert "allowed: None, bool, int" in msg, msg
    assert "writing the batch into its slot" in msg, msg
    assert ei.value.stage == "encode" and (ei.value.rank,
                                           ei.value.step) == (0, 2)
    assert next(it)[0]["id"] == 3  # the next step comes as usual


def test_a_hostile_slot_is_refused_and_never_unpickled(ours, tmp_path):
    import pickle

    mark = tmp_path / "pwned"
    payload = pickle.dumps(Marker(mark))
    def raw(meta, data=b"\0" * 64):
        m = json.dumps(meta).encode()
        h = b"DHPYSLT2" + len(m).to_bytes(8, "little") + m
        return h + b"\0" * (-len(h) % 64) + data

    def tensor(entry):
        return raw({"v": 2, "kind": "batch", "root": {"T": 0},
                    "tensors": [entry]})

    hostile = [b"DHPYSLT1" + len(payload).to_bytes(8, "little") + payload,
               b"DHPYSLT2" + len(payload).to_bytes(8, "little") + payload,
               b"DHPYSLT2" + (1 << 40).to_bytes(8, "little"),
               tensor(["uint8", [1 << 40], 0, 64]),
               tensor(["object", [8], 0, 64]),
               tensor(["uint8", [64], 1 << 30, 64])]
    it = iter(ours(dd.Range(8), batch_size=1, num_workers=1,
                   worker_init_fn=dd.HostileSlots(hostile)))
    causes = []
    for _ in hostile:
        with pytest.raises(datahelix.DataError) as ei:
            next(it)
        causes.append(str(ei.value))
    for k, c in enumerate(causes):
        assert f"rank 0 epoch 0 step {k}: the batch in its arena slot" in c, c
    assert "bad magic" in causes[0] and "not JSON" in causes[1], causes
    assert "runs past the slot" in causes[2], causes
    assert "tensor 0: shape [1099511627776] of uint8" in causes[3], causes
    assert "dtype 'object' is not allowed" in causes[4], causes
    assert "outside the slot" in causes[5], causes
    assert not mark.exists()
    # The loader goes on: later steps are the worker's own batches.
    assert [b.tolist() for b in it] == [[6], [7]]


class Marker:
    """Unpickling this creates the file `path` (it calls open())."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_private_files_and_the_ipc_endpoint_live_in_0700_folders(ours):
    import stat

    loader = ours(dd.Range(4), batch_size=2)
    it = iter(loader)
    assert next(it).tolist() == [0, 1]

    def mode(p):
        return stat.S_IMODE(os.stat(p).st_mode)
    assert loader._coord.listen == \
        f"ipc://{loader._coord_dir}/coordinator.sock"
    assert mode(loader._coord_dir) == 0o700
    assert mode(loader._dir) == 0o700
    assert mode(os.path.join(loader._dir, "dataset.pkl")) == 0o600
    # Whoever else could reach the socket file: nobody but this user.
    assert os.stat(loader._coord_dir).st_uid == os.getuid()


def test_ours_matches_torch_order_with_a_seeded_generator(ours):
    def passes(loader):
        return [flat(loader), flat(loader)]

    want = passes(torch.utils.data.DataLoader(
        dd.Range(23), batch_size=4, shuffle=True,
        generator=torch.Generator().manual_seed(11)))
    got = passes(ours(dd.Range(23), batch_size=4, shuffle=True,
                      generator=torch.Generator().manual_seed(11)))
    assert got == want


def test_shuffle_from_seed_and_set_epoch(ours):
    ds = dd.Range(19)
    loader = ours(ds, batch_size=5, shuffle=True, seed=4)
    e0, again = flat(loader), flat(loader)
    loader.set_epoch(3)
    e3 = flat(loader)

    def ref(epoch):
        s = DistributedSampler(ds, num_replicas=1, rank=0, seed=4)
        s.set_epoch(epoch)
        return list(s)
    assert e0 == again == ref(0) and e3 == ref(3) != e0


def test_random_draws_per_sample_follow_seed_and_epoch(ours):
    a = ours(dd.Random(), batch_size=4, seed=9)
    b = ours(dd.Random(), batch_size=2, num_workers=1, seed=9)
    ra, rb = flat(a), flat(b)
    assert ra == rb and len(set(ra)) == 8  # not which worker ran it
    a.set_epoch(1)
    assert flat(a) != ra


def test_each_rank_gets_its_distributed_sampler_share(ours, coordinator,
                                                      monkeypatch):
    ds = dd.Range(11)
    loaders = [ours(ds, batch_size=2, shuffle=True, seed=5, rank=r,
                    world_size=2, coordinator=coordinator, num_workers=1)
               for r in range(2)]
    its = [iter(x) for x in loaders]
    got = [[], []]
    for _ in range(len(loaders[0])):
        for r in range(2):
            got[r] += next(its[r]).tolist()
    for r in range(2):
        assert got[r] == list(DistributedSampler(ds, num_replicas=2, rank=r,
                                                 seed=5))
        with pytest.raises(StopIteration):
            next(its[r])
    assert sorted(set(got[0] + got[1])) == list(range(11))
    # rank and world from the environment (torchrun's), as DataLoader.
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("DATAHELIX_COORDINATOR", coordinator)
    for x in loaders:
        x.close()
    env = ours(ds, batch_size=2, num_workers=1)
    assert (env.rank, env.world_size) == (1, 2)
    assert flat(env) == list(DistributedSampler(ds, num_replicas=2, rank=1,
                                                shuffle=False))


RANK_SCRIPT = textwrap.dedent("""
    import json, sys
    sys.path[:0] = sys.argv[1:3]
    import datahelix, dist_datasets
    with datahelix.DistributedDataLoader(dist_datasets.Range(10),
                                         batch_size=2, shuffle=True, seed=1,
                                         num_workers=1, timeout=60) as loader:
        ids = [i for b in loader for i in b.tolist()]
    print(json.dumps({"rank": loader.rank, "ids": ids}), flush=True)
""")


def test_two_ranks_torchrun_style(tmp_path):
    """RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT as torchrun sets them:
    rank 0 starts the Coordinator, each rank gets its share."""
    import json
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for r in range(2):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE="2",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port - 1))
        procs.append(subprocess.Popen(
            [sys.executable, "-c", RANK_SCRIPT, str(ROOT / "python"),
             str(pathlib.Path(__file__).resolve().parent)],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True))
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=120))
        finally:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
    got = {json.loads(o)["rank"]: json.loads(o)["ids"] for o, _ in outs}
    for r in range(2):
        assert got[r] == list(DistributedSampler(dd.Range(10), num_replicas=2,
                                                 rank=r, seed=1))
    assert sorted(got[0] + got[1]) == list(range(10))


def index_est_cpu_ms(path):
    """Section 1 (est_cpu_ms, f32) of a .dhx (docs/index-format.md)."""
    data = pathlib.Path(path).read_bytes()
    n = struct.unpack_from("<Q", data, 24)[0]
    off, size = struct.unpack_from("<QQ", data, 64 + 16 * 1)
    return list(struct.unpack_from(f"<{n}f", data, off))


def test_passes_are_task_ids_of_their_own_and_never_wrap(ours,
                                                         monkeypatch):
    """Every iteration is a new pass of the wire's task id (pass, step,
    rank, part), handed to the client in chunks that continue it; passes
    come from one per-process counter, and the one after the last a rank
    may start (65,535) is a clear error, not a wrap onto pass 0's ids."""
    from datahelix import _distributed, _passes
    import itertools
    monkeypatch.setattr(_distributed, "_CHUNK", 2)  # 5 steps: 3 chunks
    loader = ours(dd.Range(9), batch_size=2)
    want = [[0, 1], [2, 3], [4, 5], [6, 7], [8]]
    assert lists(loader) == want
    before = next(_passes._count)
    assert lists(loader) == want
    assert next(_passes._count) == before + 2  # that pass, then this draw
    monkeypatch.setattr(_passes, "_count", itertools.count(65535))
    assert lists(loader) == want  # pass 65,535: the last one
    with pytest.raises(datahelix.DataError, match="pass 65536"):
        lists(loader)


def test_estimate_cost_feeds_the_index(ours):
    loader = ours(dd.Costed(5), batch_size=2)
    assert flat(loader) == [0, 1, 2, 3, 4]
    assert index_est_cpu_ms(os.path.join(loader._dir, "index.dhx")) == \
        [1.0, 2.0, 3.0, 4.0, 5.0]
    loader = ours(dd.Range(3), batch_size=2, estimate_cost=lambda i: 10 * i)
    iter(loader)
    assert index_est_cpu_ms(os.path.join(loader._dir, "index.dhx")) == \
        [0.0, 10.0, 20.0]
    loader = ours(dd.Range(3), batch_size=2)  # unknown: 0, the defaults
    iter(loader)
    assert index_est_cpu_ms(os.path.join(loader._dir, "index.dhx")) == \
        [0.0, 0.0, 0.0]


def test_errors_are_data_errors_naming_the_sample(ours):
    it = iter(ours(dd.Failing(6, 3), batch_size=2))
    next(it)
    with pytest.raises(datahelix.SampleError) as ei:
        next(it)
    e = ei.value
    assert isinstance(e, ValueError) and isinstance(e, datahelix.DataError)
    assert e.sample_id == 3 and (e.epoch, e.step, e.rank) == (0, 1, 0)
    assert e.stage == "dataset" and "ValueError" in e.cause
    assert "sample 3" in str(e) and "raise self.exc" in e.worker_traceback


def test_a_killed_worker_fails_its_batch_and_is_replaced(ours):
    it = iter(ours(dd.Suicidal(10, bad=4), batch_size=2, num_workers=1))
    assert [next(it).tolist() for _ in range(2)] == [[0, 1], [2, 3]]
    with pytest.raises(datahelix.SampleError) as ei:
        next(it)
    msg = str(ei.value)
    assert "sample 4" in msg and "killed by signal 9" in msg, msg
    assert ei.value.sample_id == 4 and ei.value.server >= 1
    assert [b.tolist() for b in it] == [[6, 7], [8, 9]]


def test_a_worker_killed_once_costs_a_retry_not_the_batch(ours, tmp_path,
                                                         capfd):
    """A kill -9 of a worker is not the samples' fault: its batch runs
    again on the next worker (once), and every batch arrives."""
    marker = tmp_path / "killed"
    loader = ours(dd.KilledOnce(10, bad=4, marker=marker), batch_size=2,
                  num_workers=1)
    assert [b.tolist() for b in loader] == \
        [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]
    assert marker.exists()  # it did die
    assert "runs again on a new worker (retry 1 of 1)" in \
        capfd.readouterr().err


def test_a_hung_worker_is_killed_by_the_watchdog(ours):
    t0 = time.monotonic()
    it = iter(ours(dd.Sleepy(5, slow=2, secs=60), batch_size=1,
                   num_workers=1, worker_timeout=2, timeout=30))
    assert [next(it).tolist() for _ in range(2)] == [[0], [1]]
    with pytest.raises(datahelix.SampleError,
                       match="sample 2.*still busy after 2000 ms") as ei:
        next(it)
    assert ei.value.stage == "watchdog" and ei.value.sample_id == 2
    assert [b.tolist() for b in it] == [[3], [4]]
    assert time.monotonic() - t0 < 30


def test_a_dataset_that_cannot_load_fails_every_step_at_once(ours):
    # Fresh interpreters unpickle it (forked workers inherit it, as
    # torch's forked workers do, and would not fail).
    it = iter(ours(dd.BrokenOnLoad(4), batch_size=2, timeout=30,
                   multiprocessing_context="spawn"))
    t0 = time.monotonic()
    with pytest.raises(datahelix.DataError,
                       match="cannot load the dataset.*private_codec"):
        next(it)
    with pytest.raises(datahelix.DataError, match="cannot load"):
        next(it)
    assert time.monotonic() - t0 < 25


def test_bad_arguments(ours):
    # forked workers inherit what cannot be pickled (a lock), as torch's;
    # workers of another interpreter could not (test_torch_semantics)
    assert [b.tolist() for b in ours(dd.Unpicklable(4), batch_size=2)] == \
        [[0, 1], [2, 3]]
    with pytest.raises(ValueError, match="mutually exclusive"):
        datahelix.DistributedDataLoader(dd.Range(4), batch_sampler=[[0]],
                                        batch_size=2)
    with pytest.raises(ValueError, match="mutually exclusive"):
        datahelix.DistributedDataLoader(dd.Range(4), shuffle=True,
                                        sampler=[0, 1])
    with pytest.raises(ValueError, match="map-style"):
        datahelix.DistributedDataLoader(iter(range(3)))
    with pytest.raises(ValueError):
        datahelix.DistributedDataLoader(dd.Range(4), timeout=-1)
    # A DataServer unpickles only what the client that started it names.
    p = run_dh("dataserver", "--coordinator", "ipc:///nonexistent", "--rank",
               0, "--index", "x.dhx", "--python-dataset", "ds.pkl")
    assert p.returncode != 0 and "needs --client-fd" in p.stderr, p.stderr
    # ... and takes no payloads from the network (its rank reads every slot
    # as a Python batch).
    p = run_dh("dataserver", "--coordinator", "ipc:///nonexistent", "--rank",
               0, "--index", "x.dhx", "--python-dataset", "ds.pkl",
               "--client-fd", 3, "--listen", "tcp://127.0.0.1:0")
    assert p.returncode != 0 and \
        "--python-dataset excludes --listen" in p.stderr, p.stderr
    # One pass at a time: an older iterator refuses to go on.
    loader = ours(dd.Range(4), batch_size=1)
    old = iter(loader)
    next(old)
    new = iter(loader)
    with pytest.raises(RuntimeError, match="superseded"):
        next(old)
    assert next(new).tolist() == [0]


# ---- nothing left behind -------------------------------------------------


def survivors(pids, secs=5):
    """The pids still alive after waiting up to `secs` for all to go."""
    wait_until(lambda: not any(alive(p) for p in pids), secs)
    return [p for p in pids if alive(p)]


@pytest.mark.parametrize("ctx,n", [(None, 5), ("spawn", 4)])
def test_close_leaves_no_process_and_no_file(ctx, n):
    before = set(descendants(os.getpid()))
    loader = datahelix.DistributedDataLoader(dd.Range(6), batch_size=2,
                                             num_workers=2, timeout=60,
                                             multiprocessing_context=ctx)
    assert flat(loader) == list(range(6))
    kids = set(descendants(os.getpid())) - before
    # the coordinator, the DataServer, its two Python workers (and the
    # fork server they came from, where torch's would fork)
    assert len(kids) == n, kids
    d = loader._dir
    loader.close()
    assert survivors(kids) == []
    assert not os.path.exists(d)


def cmdline(pid):
    try:
        return pathlib.Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def python_workers(loader):
    """The pids of the loader's DataServer's Python workers: the fork
    server's children, or the exec'd ones."""
    if loader._fs is not None:
        return children(loader._fs.pid)
    return [k for k in descendants(os.getpid())
            if b"datahelix._worker" in cmdline(k)]


@pytest.mark.parametrize("ctx", [None, "spawn"])
def test_a_killed_dataserver_is_restarted_and_its_workers_die(ours, ctx):
    before = set(descendants(os.getpid()))
    loader = ours(dd.Range(12), batch_size=2, num_workers=2,
                  multiprocessing_context=ctx)
    it = iter(loader)
    assert next(it).tolist() == [0, 1]
    kids = set(descendants(os.getpid())) - before
    server = [k for k in kids if b"dataserver" in cmdline(k)]
    workers = python_workers(loader)
    assert len(server) == 1 and len(workers) == 2, kids
    os.kill(server[0], signal.SIGKILL)
    # PR_SET_PDEATHSIG; forked: the fork server kills them as its
    # DataServer's socket closes
    assert survivors(workers) == []
    # The client starts a new DataServer (and it new workers) and asks
    # again for the steps it had no answer for.
    assert [b.tolist() for b in it] == [[2, 3], [4, 5], [6, 7], [8, 9],
                                        [10, 11]]


def test_workers_fork_from_the_fork_server_where_torch_would_fork(ours):
    """Where torch's workers fork, ours come from a fork server forked
    from this process (docs/python.md "Start-up"): they have this
    process's command line and the fork server for their parent; with
    'spawn' they are fresh interpreters of the DataServer."""
    forked = ours(dd.Range(8), batch_size=2, num_workers=2)
    assert next(iter(forked)).tolist() == [0, 1]
    zygote = forked._fs.pid
    assert cmdline(zygote) == cmdline(os.getpid())
    workers = children(zygote)
    assert len(workers) == 2 and all(
        cmdline(w) == cmdline(os.getpid()) for w in workers), workers
    spawned = ours(dd.Range(8), batch_size=2, num_workers=2,
                   multiprocessing_context="spawn")
    assert next(iter(spawned)).tolist() == [0, 1]
    assert spawned._fs is None
    assert len(python_workers(spawned)) == 2


def test_a_killed_fork_server_leaves_exec_d_workers_and_every_batch(
        ours, capfd):
    """kill -9 of the fork server: its workers die with it
    (PR_SET_PDEATHSIG), their batches run again on workers the DataServer
    now exec's, and every batch arrives once."""
    loader = ours(dd.Range(40), batch_size=2, num_workers=2)
    it = iter(loader)
    got = [next(it).tolist() for _ in range(3)]
    workers = children(loader._fs.pid)
    assert len(workers) == 2
    os.kill(loader._fs.pid, signal.SIGKILL)
    assert survivors(workers) == []
    got += [b.tolist() for b in it]
    assert sum(got, []) == list(range(40))
    assert "python fork server" in capfd.readouterr().err
    # a second pass: exec'd workers serve it
    assert flat(loader) == list(range(40))


def test_a_killed_forked_worker_is_reported_as_torch_s_and_replaced(ours):
    """A forked worker's exit status comes from the fork server: a kill
    -9 reads "killed by signal 9" as an exec'd worker's does."""
    it = iter(ours(dd.Suicidal(10, bad=4), batch_size=2, num_workers=1))
    assert [next(it).tolist() for _ in range(2)] == [[0, 1], [2, 3]]
    with pytest.raises(datahelix.SampleError, match="killed by signal 9"):
        next(it)
    assert [b.tolist() for b in it] == [[6, 7], [8, 9]]


KILL_SCRIPT = textwrap.dedent("""
    import sys
    sys.path[:0] = sys.argv[1:3]
    import datahelix, dist_datasets
    loader = datahelix.DistributedDataLoader(dist_datasets.Range(8),
                                             batch_size=2, num_workers=2)
    held = next(iter(loader))
    print(loader._dir, loader._key.owned_dir, loader._coord_dir, flush=True)
    sys.stdin.read()  # until killed
""")


def test_sigkill_of_the_training_process_leaves_nothing():
    p = subprocess.Popen(
        [sys.executable, "-c", KILL_SCRIPT, str(ROOT / "python"),
         str(pathlib.Path(__file__).resolve().parent)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    try:
        dirs = p.stdout.readline().split()
        assert len(dirs) == 3, p.stderr.read()
        d = dirs[0]
        kids = descendants(p.pid)
        # coordinator, DataServer, fork server, 2 workers
        assert len(kids) == 5, kids
        p.kill()
        p.wait(timeout=10)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=10)
        p.stdin.close()
        p.stdout.close()
        p.stderr.close()
    assert survivors(kids) == [], "a child outlived the training process"
    end = time.monotonic() + 5
    while os.path.exists(d) and time.monotonic() < end:
        time.sleep(0.05)
    assert not os.path.exists(d), "the pickled dataset was left behind"
    # the job key's folder and the Coordinator's socket folder (issue 41
    # item 5): its Coordinator removes them at its end
    for x in dirs[1:]:
        assert "datahelix-" in x, dirs
        wait_until(lambda: not os.path.exists(x), 5)
        assert not os.path.exists(x), f"{x} was left behind"


RANK_KILL_SCRIPT = textwrap.dedent("""
    import sys
    sys.path[:0] = sys.argv[1:3]
    import torch.distributed as dist
    dist.init_process_group("gloo")
    import datahelix, dist_datasets
    loader = datahelix.DistributedDataLoader(dist_datasets.Range(16),
                                             batch_size=2, num_workers=1)
    held = next(iter(loader))
    print("ready", flush=True)
    sys.stdin.read()  # until killed
""")


def _our_folders():
    import tempfile
    t = tempfile.gettempdir()
    return {os.path.join(t, x) for x in os.listdir(t)
            if x.startswith("datahelix-")}


def test_sigkill_of_every_rank_of_a_two_rank_job_leaves_no_folder():
    """Issue 41 item 5, multi-rank: the shared Coordinator removes the key
    folder it was started with, and each rank's DataServer the copy of the
    key in its own folder, so a kill -9 of each rank leaves no key, socket
    or dataset folder (rank 1's key folder used to stay)."""
    from procs import free_port
    before = _our_folders()
    port = free_port()
    ranks = []
    try:
        for r in range(2):
            env = dict(os.environ, RANK=str(r), WORLD_SIZE="2",
                       LOCAL_RANK=str(r), MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=str(port))
            ranks.append(subprocess.Popen(
                [sys.executable, "-c", RANK_KILL_SCRIPT, str(ROOT / "python"),
                 str(pathlib.Path(__file__).resolve().parent)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, text=True, env=env))
        for p in ranks:
            assert p.stdout.readline().strip() == "ready", p.stderr.read()
        made = _our_folders() - before
        assert made, "the job made no folder: nothing was checked"
        kids = [k for p in ranks for k in descendants(p.pid)]
        for p in reversed(ranks):
            p.kill()
            p.wait(timeout=10)
    finally:
        for p in ranks:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
            for f in (p.stdin, p.stdout, p.stderr):
                f.close()
    assert survivors(kids) == [], "a child outlived its rank"
    wait_until(lambda: not (_our_folders() - before), 10)
    assert sorted(_our_folders() - before) == [], "left behind"


def rss_kib():
    for line in pathlib.Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def test_ten_thousand_batches_recycle_the_arena_and_keep_memory_flat():
    """10,000 batches of 64 KiB (625 MiB in all) through an 8 MiB arena:
    every slot must come back when its batch is freed, and the process's
    resident memory must not grow with the number of batches."""
    n, size, bs = 40000, 16384, 4
    loader = datahelix.DistributedDataLoader(dd.Blob(n, size), batch_size=bs,
                                             num_workers=1, arena_mb=8,
                                             timeout=120)
    try:
        rss0 = None
        for k, b in enumerate(loader):
            if k % 997 == 0:   # the bytes are the samples' own
                want = torch.arange(k * bs, (k + 1) * bs) % 251
                assert torch.equal(b[:, 0].long(), want)
                assert torch.equal(b[:, -1].long(), want)
            if k == 500:
                rss0 = rss_kib()
            del b
        assert k == n // bs - 1
        growth = rss_kib() - rss0
        assert growth < 16 * 1024, f"resident memory grew {growth} KiB"
    finally:
        loader.close()


def exe(pid):
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return ""


def test_the_coordinator_and_dataserver_run_datahelix_svc(ours, tmp_path,
                                                          monkeypatch):
    """datahelix-svc beside datahelix (no FFmpeg: ~7 ms a start, not ~45;
    docs/python.md "Start-up") runs the Coordinator and the DataServer;
    a `datahelix` alone in its folder runs them itself."""
    full = os.path.realpath(os.environ.get(
        "DATAHELIX_BIN", str(ROOT / "build" / "datahelix")))
    svc = os.path.join(os.path.dirname(full), "datahelix-svc")
    lone = tmp_path / "datahelix"
    lone.symlink_to(full)
    for prog, env in ((svc, None), (full, str(lone))):
        if env:
            monkeypatch.setenv("DATAHELIX_BIN", env)
        before = set(descendants(os.getpid()))
        loader = ours(dd.Range(8), batch_size=2)
        assert flat(loader) == list(range(8))
        kids = set(descendants(os.getpid())) - before
        server = [k for k in kids if b"dataserver" in cmdline(k)]
        assert exe(loader._coord.proc.pid) == prog
        assert [exe(k) for k in server] == [prog], (prog, server)
        loader.close()
