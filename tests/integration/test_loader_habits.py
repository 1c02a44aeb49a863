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
import warnings

import pytest

from conftest import ROOT, run_dh, _binary
from procs import arena_mapping, free_port

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
        assert ids_of(b)[0] == plan(sets / "val.jsonl", 1, 2)[0][0]
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
    p = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node",
         "2", "--redirects", "1", "--tee", "1", "--master_port", str(port),
         str(script), str(ROOT / "python"), str(sets / "train.jsonl"),
         str(sets / "val.jsonl"), str(tmp_path)],
        capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    res = [json.loads((tmp_path / f"rank{r}.json").read_text())
           for r in range(2)]
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
