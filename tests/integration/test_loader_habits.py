"""datahelix.DataLoader in a real training job (issue 15): several loaders
per process and per torchrun job, each isolated; iteration as torch's
DataLoader (a new `for` after `break` starts the epoch again, a SampleError
leaves the iterator usable); torch's constructor vocabulary; stats() and
telemetry per rank.

Every wait is bounded: loaders run with a timeout, subprocesses with one.
"""
import json
import os
import pathlib
import shutil
import subprocess
import sys
import textwrap

import pytest

from conftest import ROOT, run_dh, _binary
from procs import arena_mapping, free_port, torchrun

torch = pytest.importorskip("torch")
sys.path.insert(0, str(ROOT / "python"))
import datahelix  # noqa: E402

SMALL = dict(batch_size=2, frames=4, size=(32, 32), timeout=30)


@pytest.fixture(scope="module")
def sets(tmp_path_factory):
    """A train set (12 clips) and a val set (5 clips) of their own files."""
    d = tmp_path_factory.mktemp("habits")
    for name, count, seed in (("train", 12, 5), ("val", 5, 9)):
        run_dh("gen-data", "--out", d / name, "--profiles", "S", "--count",
               count, "--seed", seed, "--captions", check=True, timeout=300)
        run_dh("probe", "--out", d / f"{name}.jsonl",
               d / name / "captions.jsonl", check=True)
    return d


@pytest.fixture(autouse=True)
def binary_env(monkeypatch):
    monkeypatch.setenv("DATAHELIX_BIN", _binary())
    monkeypatch.delenv("DATAHELIX_COORDINATOR", raising=False)


def plan(manifest, world, batch, epoch=0, drop_last=True, seed=0):
    """`datahelix plan --json`: per step, the ids of every rank."""
    args = ["plan", "--manifest", manifest, "--world-size", world,
            "--batch-size", batch, "--epoch", epoch, "--seed", seed, "--json"]
    p = run_dh(*args, *([] if drop_last else ["--no-drop-last"]), check=True)
    return [json.loads(x)["ranks"] for x in p.stdout.splitlines()
            if '"ranks"' in x]


def ids_of(batches):
    return [b["ids"].tolist() for b in batches]


# -- many loaders ------------------------------------------------------------

def test_train_and_val_interleaved_in_one_process(sets):
    """Two loaders of different manifests, val run in the middle of each
    train epoch, for 2 epochs: each yields exactly its own plan."""
    tr = datahelix.DataLoader(sets / "train.jsonl", **SMALL)
    va = datahelix.DataLoader(sets / "val.jsonl", drop_last=False, **SMALL)
    with tr, va:
        for epoch in range(2):
            tr.set_epoch(epoch)
            va.set_epoch(epoch)
            want_tr = [s[0] for s in plan(sets / "train.jsonl", 1, 2, epoch)]
            want_va = [s[0] for s in plan(sets / "val.jsonl", 1, 2, epoch,
                                          drop_last=False)]
            got_tr, got_va = [], []
            for k, b in enumerate(tr):
                got_tr.append(b["ids"].tolist())
                if k % 2 == 1:  # val inside the train epoch, twice over
                    got_va.append(ids_of(va))
            assert got_tr == want_tr
            assert len(got_va) == 3 and all(v == want_va for v in got_va)
            assert max(i for s in got_va[0] for i in s) < 5


def test_one_coordinator_per_loader_and_rank(sets, coordinator):
    """Two live loaders of one process naming the same Coordinator for the
    same rank would take each other's batches: the second is refused; a
    loader closed frees its place."""
    a = datahelix.DataLoader(sets / "train.jsonl", coordinator=coordinator,
                             **SMALL)
    b = datahelix.DataLoader(sets / "val.jsonl", coordinator=coordinator,
                             **SMALL)
    try:
        next(iter(a))
        with pytest.raises(datahelix.DataError, match="one Coordinator "
                           "serves one loader"):
            iter(b)
        a.close()
        # A closed loader's unfinished tasks go to the next client of its
        # rank there (taken for it restarted): only the same manifest and
        # plan may follow it on that Coordinator.
        with pytest.raises(datahelix.DataError, match="another manifest"):
            iter(b)
        with datahelix.DataLoader(sets / "train.jsonl",
                                  coordinator=coordinator, **SMALL) as c:
            assert ids_of(c) == [s[0] for s in plan(sets / "train.jsonl",
                                                    1, 2)]
    finally:
        a.close()
        b.close()


def test_torchrun_default_ports_one_per_loader(monkeypatch):
    from datahelix import _services
    monkeypatch.setenv("MASTER_ADDR", "localhost")
    monkeypatch.setenv("MASTER_PORT", "40000")
    got = [_services.coordinator_address(r, 2, i) for i in range(3)
           for r in range(2)]
    assert got == [("tcp://127.0.0.1:40001", True),
                   ("tcp://127.0.0.1:40001", False),
                   ("tcp://127.0.0.1:40002", True),
                   ("tcp://127.0.0.1:40002", False),
                   ("tcp://127.0.0.1:40003", True),
                   ("tcp://127.0.0.1:40003", False)]
    a = _services.loader_ordinal()
    assert _services.loader_ordinal() == a + 1  # never reused


def test_both_loader_classes_share_one_ordinal_count(sets):
    """A DataLoader and a DistributedDataLoader of one process take
    consecutive ordinals, so under torchrun they never share a port."""
    x = datahelix.DataLoader(sets / "val.jsonl", **SMALL)
    y = datahelix.DistributedDataLoader(list(range(4)), batch_size=2)
    z = datahelix.DataLoader(sets / "val.jsonl", **SMALL)
    assert (y._instance, z._ordinal) == (x._ordinal + 1, x._ordinal + 2)
    for loader in (x, y, z):
        loader.close()


TORCHRUN_SCRIPT = textwrap.dedent("""
    import json, os, sys
    import torch, torch.distributed as dist
    sys.path.insert(0, sys.argv[1])
    import datahelix
    dist.init_process_group("gloo")
    kw = dict(batch_size=1, frames=4, size=(32, 32), timeout=60)
    train = datahelix.DataLoader(sys.argv[2], **kw)
    val = datahelix.DataLoader(sys.argv[3], drop_last=False, **kw)
    out = {"train": [], "val": [], "ports": []}
    for epoch in range(2):
        train.set_epoch(epoch)
        val.set_epoch(epoch)
        tr, va = [], []
        for k, b in enumerate(train):
            t = b["video"].float().mean().reshape(1)
            dist.all_reduce(t)          # a real gradient sync per step
            tr.append(b["ids"].tolist())
            if k == 1:
                va.append([v["ids"].tolist() for v in val])
        va.append([v["ids"].tolist() for v in val])  # and after the epoch
        out["train"].append(tr)
        out["val"].append(va)
    out["addr"] = [train._client_addr, val._client_addr]
    with open(os.path.join(sys.argv[4], f"rank{dist.get_rank()}.json"),
              "w") as f:
        json.dump(out, f)
    train.close()
    val.close()
    dist.destroy_process_group()
""")


def _torchrun_ok():
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run",
                        "--help"], capture_output=True, timeout=60)
    return p.returncode == 0


def test_torchrun_two_ranks_train_and_val_interleaved(sets, tmp_path):
    if not _torchrun_ok():
        pytest.skip("torch.distributed.run is not usable here")
    for m in ("train", "val"):  # compile the indexes once, not per rank
        datahelix.DataLoader(sets / f"{m}.jsonl", **SMALL).close()
    script = tmp_path / "train.py"
    script.write_text(TORCHRUN_SCRIPT)
    port = free_port()
    res = torchrun(2, script, tmp_path, sets / "train.jsonl",
                   sets / "val.jsonl", port=port)
    for r in range(2):
        assert res[r]["addr"] == [f"tcp://127.0.0.1:{port + 1}",
                                  f"tcp://127.0.0.1:{port + 2}"]
        for epoch in range(2):
            tr = plan(sets / "train.jsonl", 2, 1, epoch)
            va = plan(sets / "val.jsonl", 2, 1, epoch, drop_last=False)
            assert res[r]["train"][epoch] == [s[r] for s in tr]
            want_va = [s[r] for s in va if s[r]]
            assert res[r]["val"][epoch] == [want_va, want_va]
    every = sorted(i for r in range(2) for s in res[r]["val"][0][0]
                   for i in s)
    assert every == list(range(5))


def test_torchrun_a_held_default_port_moves_the_coordinator(sets, tmp_path):
    """Another process holds MASTER_PORT + 1 (the first loader's default
    Coordinator port): rank 0 serves that loader on a port the system
    picks and tells rank 1 through the rendezvous store; both ranks get
    exactly their plan, the second loader keeps its default port."""
    import socket
    if not _torchrun_ok():
        pytest.skip("torch.distributed.run is not usable here")
    for m in ("train", "val"):
        datahelix.DataLoader(sets / f"{m}.jsonl", **SMALL).close()
    script = tmp_path / "train.py"
    script.write_text(TORCHRUN_SCRIPT)
    for _ in range(20):  # a free port P whose P + 1 we can hold
        port = free_port()
        held = socket.socket()
        try:
            held.bind(("127.0.0.1", port + 1))
            break
        except OSError:
            held.close()
    else:
        pytest.skip("no free pair of ports")
    held.listen(1)
    try:
        res = torchrun(2, script, tmp_path, sets / "train.jsonl",
                       sets / "val.jsonl", port=port)
    finally:
        held.close()
    train_addr = res[0]["addr"][0]
    assert train_addr != f"tcp://127.0.0.1:{port + 1}"
    for r in range(2):
        assert res[r]["addr"] == [train_addr, f"tcp://127.0.0.1:{port + 2}"]
        for epoch in range(2):
            tr = plan(sets / "train.jsonl", 2, 1, epoch)
            assert res[r]["train"][epoch] == [s[r] for s in tr]


# -- iteration ---------------------------------------------------------------

def test_break_then_a_new_for_starts_the_epoch_again(sets):
    m = sets / "train.jsonl"
    want = [s[0] for s in plan(m, 1, 2)]
    with datahelix.DataLoader(m, **SMALL) as loader:
        for rnd in range(3):  # break at once: steps are still in flight
            for k, b in enumerate(loader):
                if k == rnd:
                    break
            assert b["ids"].tolist() == want[rnd]
        assert ids_of(loader) == want            # a whole pass
        it = iter(loader)
        next(it)
        next(it)
        state = loader.state_dict()
        assert state["step"] == 2
        loader.load_state_dict(state)
        assert ids_of(loader) == want[2:]        # just loaded: resumes
        assert ids_of(loader) == want            # then whole passes again
        a = iter(loader)
        next(a)
        b = iter(loader)
        assert next(b)["ids"].tolist() == want[0]
        with pytest.raises(RuntimeError, match="superseded"):
            next(a)
        assert len(b) == len(loader) == len(want)


def corrupt_copy(src, dst, victim_id):
    shutil.copytree(src, dst / "videos")
    run_dh("probe", "--out", dst / "m.jsonl", dst / "videos", check=True)
    rows = [json.loads(x) for x in (dst / "m.jsonl").read_text()
            .splitlines()]
    path = next(r["path"] for r in rows if r.get("id") == victim_id)
    data = pathlib.Path(path).read_bytes()
    pathlib.Path(path).write_bytes(data[: len(data) // 3])
    return dst / "m.jsonl"


def test_sample_error_then_the_same_iterator_goes_on(sets, tmp_path):
    m = corrupt_copy(sets / "train", tmp_path, 3)
    want = [s[0] for s in plan(m, 1, 2)]
    bad = next(k for k, s in enumerate(want) if 3 in s)
    with datahelix.DataLoader(m, **SMALL) as loader:
        for _ in range(2):  # each pass raises once, at its step, then goes on
            it = iter(loader)
            got = []
            while True:
                try:
                    b = next(it)
                except datahelix.SampleError as e:
                    assert e.step == bad and e.sample_id == 3
                    assert loader.state_dict()["step"] == bad + 1
                    got.append("error")
                    continue
                except StopIteration:
                    break
                got.append(b["ids"].tolist())
            assert got == want[:bad] + ["error"] + want[bad + 1:]


# -- torch's vocabulary -------------------------------------------------------

def test_every_torch_argument_is_ours_or_refused_with_a_way_out(sets):
    import inspect
    ours = inspect.signature(datahelix.DataLoader).parameters
    theirs = inspect.signature(torch.utils.data.DataLoader).parameters
    missing = [n for n in theirs if n != "dataset" and n not in ours]
    assert not missing, missing   # each one taken or refused by name
    m = sets / "train.jsonl"
    for name, value, hint in (
            ("sampler", [0, 1], "DistributedDataLoader"),
            ("batch_sampler", [[0, 1]], "DistributedDataLoader"),
            ("worker_init_fn", lambda i: None, "transform="),
            ("multiprocessing_context", "spawn", "drop the argument")):
        with pytest.raises(ValueError, match=f"{name}= is not supported") \
                as ei:
            datahelix.DataLoader(m, **{name: value})
        assert hint in str(ei.value)
    with pytest.raises(TypeError, match="DistributedDataLoader"):
        datahelix.DataLoader(torch.utils.data.TensorDataset(
            torch.zeros(3)))
    with pytest.raises(ValueError, match="batch_size=1"):
        datahelix.DataLoader(m, batch_size=None)
    with pytest.raises(ValueError, match="non-negative|wait without bound"):
        datahelix.DataLoader(m, timeout=-1)
    with pytest.raises(ValueError, match="callable"):
        datahelix.DataLoader(m, collate_fn=3)
    with pytest.raises(ValueError, match="callable"):
        datahelix.DataLoader(m, transform="flip")
    with pytest.raises(ValueError, match="pin_memory_device"):
        datahelix.DataLoader(m, pin_memory_device="cpu")
    with pytest.raises(ValueError, match="one of them"):
        datahelix.DataLoader(m, seed=1, generator=torch.Generator())
    with pytest.raises(ValueError, match="both given"):
        datahelix.DataLoader(m, prefetch=4, prefetch_factor=2)
    with pytest.raises(ValueError, match="alias"):
        datahelix.DataLoader(m, num_workers=2, workers=3)
    with pytest.raises(ValueError, match="torch.uint8 or torch.float32"):
        datahelix.DataLoader(m, dtype=torch.int16)
    # Accepted with torch's meaning (or, where ours cannot differ, as is).
    x = datahelix.DataLoader(m, num_workers=0, prefetch_factor=3,
                             persistent_workers=False, in_order=False,
                             timeout=0)
    assert (x.num_workers, x.prefetch) == (1, 3)  # 0: one decode thread
    assert x._timeout_ms == -1                   # torch's 0: no bound
    y = datahelix.DataLoader(m, workers=3)
    assert (y.num_workers, y.prefetch) == (3, 6)  # 2 batches per worker
    assert datahelix.DataLoader(m).prefetch == 4  # 2 x 2, as before


def test_num_workers_are_the_dataservers_decode_threads(sets):
    from procs import descendants
    with datahelix.DataLoader(sets / "val.jsonl", num_workers=3,
                              **SMALL) as loader:
        next(iter(loader))
        argvs = []
        for pid in descendants(os.getpid()):
            try:
                argvs.append(pathlib.Path(f"/proc/{pid}/cmdline")
                             .read_bytes().split(b"\0"))
            except OSError:
                pass
        ds = [a for a in argvs if b"dataserver" in a and
              str(loader.index_path).encode() in a]
        assert ds, argvs
        assert ds[0][ds[0].index(b"--workers") + 1] == b"3"


def test_size_is_height_width_and_a_non_square_one_is_not_transposed(
        sets, tmp_path):
    m = sets / "val.jsonl"
    kw = dict(batch_size=2, frames=4, timeout=30)
    with datahelix.DataLoader(m, size=(24, 40), **kw) as loader:
        assert loader.size == (24, 40)
        b = next(iter(loader))
        assert tuple(b["video"].shape) == (2, 4, 24, 40, 3)  # [B,T,H,W,3]
        path = json.loads((m).read_text().splitlines()[1 + b["ids"][0]])
        out = tmp_path / "ref.raw"
        run_dh("decode", "--frames", 4, "--size", "40x24", "--out", out,
               path["path"], check=True)
        ref = torch.frombuffer(bytearray(out.read_bytes()),
                               dtype=torch.uint8)
        assert torch.equal(b["video"][0].reshape(-1), ref)
    with datahelix.DataLoader(m, size=(24, 40), layout="TCHW",
                              dtype=torch.float32, **kw) as loader:
        b = next(iter(loader))
        assert tuple(b["video"].shape) == (2, 4, 3, 24, 40)
        assert b["video"].dtype == torch.float32
    with datahelix.DataLoader(m, size=32, **kw) as loader:
        assert loader.size == (32, 32)
    for bad in ("40x24", (24,), (0, 32), (24.0, 40), (1, 16385)):
        with pytest.raises(ValueError, match="size="):
            datahelix.DataLoader(m, size=bad)
    with pytest.raises(ValueError, match=r"\(H, W\)"):
        datahelix.DataLoader(m, size="40x24")


def unshuffled_bytes(steps):
    import array
    return array.array("Q", [i for st in steps for i in st]).tobytes()


def test_shuffle_false_is_the_manifest_order(sets, coordinator):
    m = sets / "train.jsonl"
    with datahelix.DataLoader(m, shuffle=False, **SMALL) as loader:
        assert loader.balance == "none"
        e0 = ids_of(loader)
        loader.set_epoch(1)
        assert ids_of(loader) == e0 == [[2 * k, 2 * k + 1]
                                        for k in range(6)]
    # Each rank's share, as balance='none' cuts the identity order: 12
    # ids, 2 ranks of 5: one full step, then the remainder split.
    want = {True: [[[0, 1, 2, 3, 4]], [[5, 6, 7, 8, 9]]],
            False: [[[0, 1, 2, 3, 4], [10]], [[5, 6, 7, 8, 9], [11]]]}
    for drop in (True, False):
        for r in range(2):  # a rank runs alone: it waits on no other
            with datahelix.DataLoader(
                    m, shuffle=False, rank=r, world_size=2, batch_size=5,
                    frames=4, size=(32, 32), drop_last=drop,
                    coordinator=coordinator, timeout=30) as x:
                assert len(x) == len(want[drop][r])
                assert ids_of(x) == want[drop][r]
                assert x._schedule(0)[0] == unshuffled_bytes(
                    want[drop][r])
    with pytest.raises(ValueError, match="balance='none'"):
        datahelix.DataLoader(m, shuffle=False, balance="fixed")


def test_generator_seeds_the_plan(sets):
    m = sets / "train.jsonl"
    g = torch.Generator().manual_seed(7)
    seed = int(torch.empty((), dtype=torch.int64).random_(
        generator=torch.Generator().manual_seed(7)).item())
    with datahelix.DataLoader(m, generator=g, **SMALL) as loader:
        assert loader.seed == seed
        assert ids_of(loader) == [s[0] for s in plan(m, 1, 2, seed=seed)]
    again = datahelix.DataLoader(m, generator=torch.Generator()
                                 .manual_seed(7))
    assert again.seed == seed  # every rank seeds its generator alike


def test_collate_fn_runs_per_sample_in_this_process(sets):
    """collate_fn without transform: here, on views of the arena (with
    transform=, both run on the DataServer's workers:
    test_loader_transform.py)."""
    m = sets / "val.jsonl"
    seen = []

    def collate(samples):
        assert [sorted(s) for s in samples] == [
            ["epoch", "id", "step", "text", "tokens", "valid_frames",
             "video"]] * len(samples)
        seen.extend(arena_mapping(s["video"].data_ptr()) for s in samples)
        return ([s["id"] for s in samples],
                torch.stack([s["video"] for s in samples]))

    want = [s[0] for s in plan(m, 1, 2)]
    with datahelix.DataLoader(m, collate_fn=collate, **SMALL) as loader:
        got = list(loader)
        assert [g[0] for g in got] == want
        assert tuple(got[0][1].shape) == (2, 4, 32, 32, 3)
        assert loader.stats()["collate_ms"] > 0
    assert len(seen) == 2 * len(want) and all(
        "memfd:datahelix-arena" in s for s in seen), seen


def test_pin_memory_without_cuda_warns_and_works(sets):
    assert not torch.cuda.is_available()  # this machine: the no-CUDA path
    with pytest.warns(UserWarning, match="CUDA is not available"):
        loader = datahelix.DataLoader(sets / "val.jsonl", pin_memory=True,
                                      **SMALL)
    with loader:
        assert loader.pin_memory is False
        b = next(iter(loader))
        assert "memfd:datahelix-arena" in arena_mapping(
            b["video"].data_ptr())


def test_pin_memory_registers_the_arena_once_and_unregisters_on_close(
        sets):
    """The CUDA path with torch's cudart stood in for: the arena mapping
    under batch["video"] is registered once (its whole run, portable),
    other tensors pinned by copy, all unregistered by close() before the
    client unmaps the arena."""
    from datahelix import _options
    calls = []

    class FakeCudart:
        def cudaHostRegister(self, ptr, size, flags):
            calls.append(("register", ptr, size, flags))
            return 0

        def cudaHostUnregister(self, ptr):
            calls.append(("unregister", ptr, loader._client is not None))
            return 0

    class FakePinner(_options.Pinner):
        def _cudart(self):
            return FakeCudart()

        def _pin_copy(self, t):
            calls.append(("copy", tuple(t.shape)))
            return t

    loader = datahelix.DataLoader(sets / "train.jsonl", **SMALL)
    loader._pinner = FakePinner()
    ptrs = []
    with loader:
        for b in loader:
            ptrs.append((b["video"].data_ptr(),
                         b["video"].numel()))
    regs = [c for c in calls if c[0] == "register"]
    assert len(regs) == 1, calls
    _, start, size, flags = regs[0]
    assert flags == 1 and start % 4096 == 0 and size % 4096 == 0
    assert all(start <= p and p + n <= start + size for p, n in ptrs)
    assert ("unregister", start, True) in calls  # client still open then
    assert {c[1] for c in calls if c[0] == "copy"} == {(2,)}


# -- stats() and telemetry ---------------------------------------------------

def test_stats_per_pass_and_cumulative(sets, tmp_path):
    m = corrupt_copy(sets / "train", tmp_path, 3)
    with datahelix.DataLoader(m, on_error="skip", **SMALL) as loader:
        assert loader.stats()["epoch"] is None
        n1 = len(list(loader))
        n2 = len(list(loader))
        st = loader.stats()
    # skip substitutes the bad clip: every planned step comes, full size
    assert n1 == n2 == len(plan(m, 1, 2))
    assert st["passes"] == 2 and len(st["epochs"]) == 1
    for p in (st["epoch"], st["epochs"][0]):
        assert (p["steps"], p["errors"], p["skipped"]) == (n1, 0, 0)
        assert p["requests"] == n1
        assert p["misses"] <= p["steps"] + p["errors"]
        assert 0 <= p["input_wait_p50_ms"] <= p["input_wait_p95_ms"] <= \
            p["input_wait_max_ms"]
    assert (st["steps"], st["errors"], st["skipped"]) == (2 * n1, 0, 0)
    assert st["substituted"] == 2  # once a pass
    assert st["misses"] <= st["steps"] + st["errors"]
    assert st["epoch"]["pass"] == 2 and st["epochs"][0]["pass"] == 1
    assert st["quarantine"] == [3]
    # stats() after close(): the figures close() left
    assert loader.stats()["steps"] == st["steps"]


def test_telemetry_per_rank_appended(sets, tmp_path):
    path = tmp_path / "run-{rank}.jsonl"
    mine = tmp_path / "run-0.jsonl"
    mine.write_text('{"earlier": true}\n')
    for _ in range(2):  # two runs given one path: both kept
        with datahelix.DataLoader(sets / "val.jsonl", telemetry=path,
                                  **SMALL) as loader:
            assert loader.telemetry == str(mine)
            n = len(list(loader))
    lines = mine.read_text().splitlines()
    assert lines[0] == '{"earlier": true}'
    recs = [json.loads(x) for x in lines[1:]]
    assert len(recs) == 2 * n and all(r["rank"] == 0 for r in recs)


DDP_SKIP_SCRIPT = textwrap.dedent("""
    import json, os, sys
    import torch, torch.distributed as dist
    sys.path.insert(0, sys.argv[1])
    import datahelix
    dist.init_process_group("gloo")
    kw = dict(batch_size=1, frames=4, size=(32, 32), timeout=60)
    train = datahelix.DataLoader(sys.argv[2], on_error="skip", **kw)
    val = datahelix.DataLoader(sys.argv[3], drop_last=False, **kw)
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Linear(3, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    out = {"steps": [], "subs": [], "val": []}
    for epoch in range(2):
        train.set_epoch(epoch)
        n = 0
        for b in train:
            x = b["video"].float().mean(dim=(1, 2, 3))   # [B, 3]
            loss = model(x).square().mean()
            opt.zero_grad()
            loss.backward()                              # DDP all-reduce
            opt.step()
            n += 1
            out["subs"] += [s["failed_id"] for s in b["substituted"]]
        out["steps"].append(n)
        out["val"].append(sum(len(v["ids"]) for v in val))
    out["substituted"] = train.stats()["substituted"]
    with open(os.path.join(sys.argv[4], f"rank{dist.get_rank()}.json"),
              "w") as f:
        json.dump(out, f)
    train.close()
    val.close()
    dist.destroy_process_group()
""")


def test_torchrun_ddp_with_a_bad_clip_and_skip_keeps_ranks_in_step(
        sets, tmp_path):
    """Issue 15's test: 2 ranks under torchrun, train (a truncated clip,
    on_error="skip") and val interleaved for 2 epochs, DDP's all-reduce
    each step: both ranks take every planned step, the job ends (a rank one
    step short would hang DDP until the timeout), the clip is reported as
    substituted on the rank that had it, once an epoch."""
    if not _torchrun_ok():
        pytest.skip("torch.distributed.run is not usable here")
    m = corrupt_copy(sets / "train", tmp_path / "bad", 3)
    for t in (m, sets / "val.jsonl"):  # compile the indexes once
        datahelix.DataLoader(t, **SMALL).close()
    script = tmp_path / "ddp.py"
    script.write_text(DDP_SKIP_SCRIPT)
    res = torchrun(2, script, tmp_path, m, sets / "val.jsonl")
    planned = [len(plan(m, 2, 1, e)) for e in range(2)]
    assert res[0]["steps"] == res[1]["steps"] == planned
    assert all(v > 0 for r in range(2) for v in res[r]["val"])
    # clip 3 is in one rank's share each epoch: substituted there, once
    assert sorted(res[0]["subs"] + res[1]["subs"]) == [3, 3]
    assert [res[r]["substituted"] for r in range(2)] == \
        [len(res[r]["subs"]) for r in range(2)]


def test_a_coordinator_port_someone_holds_is_an_error_at_once():
    """Under torchrun rank 0 serves its Coordinator on MASTER_PORT + 1 + i;
    when another process holds that port, the Coordinator cannot bind and
    exits.  The loader must say so, naming the address, at once - not let
    the ranks talk to the port's holder until their timeout."""
    import socket
    import time
    from datahelix import _services
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    addr = f"tcp://127.0.0.1:{s.getsockname()[1]}"
    t0 = time.monotonic()
    try:
        with pytest.raises(RuntimeError) as ei:
            _services.Coordinator(addr, "deadline", timeout=20)
    finally:
        s.close()
    msg = str(ei.value)
    assert addr in msg and "did not start" in msg, msg
    assert "in use" in msg, msg
    assert time.monotonic() - t0 < 10
