"""`import datahelix` (issue 5): the DataLoader over the real data plane.

Batches follow the epoch plan, hold exactly the bytes the media pipeline
decodes, and are views of the DataServer's shared memory (no copy); two
ranks started torchrun-style share one embedded Coordinator and see every
sample once; state_dict() resumes mid-epoch exactly; a corrupt clip raises
at its step or is skipped; len / set_epoch / iterating twice behave as in
torch; nothing outlives the training process, even after SIGKILL.
"""
import gc
import json
import os
import pathlib
import shutil
import subprocess
import sys
import textwrap
import time

import pytest

from conftest import ROOT, run_dh, _binary
from procs import (alive, arena_mapping, descendants, free_port, torchrun,
                   plan_steps, shm_names, shm_residue)

torch = pytest.importorskip("torch")
sys.path.insert(0, str(ROOT / "python"))
import datahelix  # noqa: E402

SMALL = dict(batch_size=2, frames=4, size=(32, 32))


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """12 short S clips with captions; the table (.jsonl) is what users
    pass, the loader compiles its index."""
    d = tmp_path_factory.mktemp("py")
    run_dh("gen-data", "--out", d / "videos", "--profiles", "S", "--count",
           12, "--seed", 5, "--captions", check=True, timeout=300)
    run_dh("probe", "--out", d / "m.jsonl", d / "videos" / "captions.jsonl",
           check=True)
    return d


@pytest.fixture(autouse=True)
def binary_env(monkeypatch):
    monkeypatch.setenv("DATAHELIX_BIN", _binary())
    monkeypatch.delenv("DATAHELIX_COORDINATOR", raising=False)


def two_ranks(script, manifest, port=None):
    """Runs `script` as ranks 0 and 1 of one job (torchrun's environment,
    the Coordinator on MASTER_PORT+1 = `port`, None: a free one); each
    prints one JSON object with its "rank".  {rank: that object}; a rank
    that fails fails the test."""
    port = port or free_port()
    procs = []
    for r in range(2):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE="2",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port - 1))
        procs.append(subprocess.Popen(
            [sys.executable, "-c", script, str(ROOT / "python"),
             str(manifest)], env=env, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=180) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
    return {json.loads(o)["rank"]: json.loads(o) for o, _ in outs}


def plan(manifest, world, batch, epoch=0):
    return plan_steps(manifest, world, batch, epoch)


def rows(manifest):
    return {r["id"]: r for r in map(json.loads,
                                     pathlib.Path(manifest).read_text()
                                     .splitlines()) if "id" in r}


def test_epoch_follows_plan_bytes_match_decode_zero_copy(dataset, tmp_path):
    m = dataset / "m.jsonl"
    want = plan(m, 1, 2)
    table = rows(m)
    with datahelix.DataLoader(m, **SMALL) as loader:
        assert len(loader) == len(want)
        got = []
        for k, b in enumerate(loader):
            assert b["step"] == k and b["epoch"] == 0
            assert b["video"].shape == (2, 4, 32, 32, 3)
            assert b["video"].dtype == torch.uint8
            assert b["valid_frames"].tolist() == [4, 4]
            # measured on the server: read + decode + scale, each sample
            assert b["sample_ms"].dtype == torch.float32
            assert b["sample_ms"].shape == (2,)
            assert (b["sample_ms"] > 0).all(), b["sample_ms"]
            ids = b["ids"].tolist()
            assert ids == want[k][0]
            assert b["text"] == [table[i].get("text") for i in ids]
            assert b["tokens"].tolist() == [table[i]["est_tokens"]
                                            for i in ids]
            # Zero copy: the tensor is the arena's memory (a memfd).
            line = arena_mapping(b["video"].data_ptr())
            assert "memfd:datahelix-arena" in line, line
            if k == 0:  # exactly the media pipeline's bytes
                out = tmp_path / "ref.raw"
                for j, i in enumerate(ids):
                    run_dh("decode", "--frames", 4, "--size", "32x32",
                           "--out", out, table[i]["path"], check=True)
                    ref = torch.frombuffer(bytearray(out.read_bytes()),
                                           dtype=torch.uint8)
                    assert torch.equal(b["video"][j].reshape(-1), ref)
            got.append(ids)
        assert got == [s[0] for s in want]
        st = loader.stats()
        assert st["steps"] == len(want) and st["errors"] == 0


def test_len_iterate_twice_set_epoch_float_ablation(dataset, tmp_path):
    m = dataset / "m.jsonl"
    with datahelix.DataLoader(m, **SMALL) as loader:
        first = [b["ids"].tolist() for b in loader]
        again = [b["ids"].tolist() for b in loader]
        assert first == again and len(first) == len(loader) == 6
        loader.set_epoch(1)
        e1 = [b["ids"].tolist() for b in loader]
        assert e1 == [s[0] for s in plan(m, 1, 2, epoch=1)]
        assert e1 != first
    with datahelix.DataLoader(m, step_deadline_ms=300, telemetry=tmp_path / "t.jsonl",
                              ablation="base", **SMALL) as loader:
        b = next(iter(loader))  # base: copied out of the arena, not a view
        assert "memfd:datahelix-arena" not in arena_mapping(
            b["video"].data_ptr())
        rec = json.loads((tmp_path / "t.jsonl").read_text().splitlines()[0])
        assert rec["deadline_ms"] == 300
    # step_order="sorted": the plan `datahelix plan --step-order sorted`
    # prints (one window of 6 steps: heaviest first), not the default's.
    p = run_dh("plan", "--manifest", m, "--world-size", 1, "--batch-size", 2,
               "--step-order", "sorted", "--json", check=True)
    steps = [json.loads(x) for x in p.stdout.splitlines() if '"ranks"' in x]
    tokens = [s["tokens"][0] for s in steps]
    assert tokens == sorted(tokens, reverse=True) and tokens[0] > tokens[-1]
    with datahelix.DataLoader(m, step_order="sorted", **SMALL) as loader:
        got = [b["ids"].tolist() for b in loader]
        assert got == [s["ranks"][0] for s in steps] != first
    with datahelix.DataLoader(m, dtype="float32", layout="TCHW",
                              **SMALL) as loader:
        b = next(iter(loader))
        assert b["video"].dtype == torch.float32
        assert b["video"].shape == (2, 4, 3, 32, 32)
        assert torch.isfinite(b["video"]).all()


def test_state_dict_resumes_exactly(dataset):
    m = dataset / "m.jsonl"
    with datahelix.DataLoader(m, **SMALL) as full:
        ref = [(b["ids"].tolist(), b["video"].clone()) for b in full]
    with datahelix.DataLoader(m, **SMALL) as a:
        it = iter(a)
        for _ in range(2):
            next(it)
        state = a.state_dict()
    assert state["step"] == 2
    with datahelix.DataLoader(m, **SMALL) as b:
        b.load_state_dict(state)
        rest = [(x["ids"].tolist(), x["video"].clone()) for x in b]
    assert [r[0] for r in rest] == [r[0] for r in ref[2:]]
    for (_, v), (_, w) in zip(rest, ref[2:]):
        assert torch.equal(v, w)
    with pytest.raises(ValueError, match="seed"):
        datahelix.DataLoader(m, seed=1, **SMALL).load_state_dict(state)


def test_resume_on_another_world_size_repeats_and_skips_nothing(
        dataset, coordinator):
    """2 ranks consume one step, save; 3 ranks resume from that state: the
    rest of the epoch is re-planned over 3 ranks, and the union of what was
    consumed is the epoch, once."""
    m = dataset / "m.jsonl"
    first = [datahelix.DataLoader(m, rank=r, world_size=2,
                                  coordinator=coordinator, **SMALL)
             for r in range(2)]
    its = [iter(x) for x in first]
    seen = [i for it in its for i in next(it)["ids"].tolist()]
    state = first[0].state_dict()
    assert state["step"] == 1 and state["world_size"] == 2
    for x in first:
        x.close()
    second = [datahelix.DataLoader(m, rank=r, world_size=3,
                                   coordinator=coordinator, **SMALL)
              for r in range(3)]
    for x in second:
        x.load_state_dict(state)
    steps = [[b["step"] for b in _collect(x, seen)] for x in second]
    for x in second:
        assert x.state_dict()["replanned"] == [[2, 2, 1]]
        x.close()
    assert sorted(seen) == list(range(12)), seen  # none repeated or lost
    assert all(s and s[0] == 1 for s in steps), steps  # numbering goes on


def test_replanned_rest_keeps_random_crops(dataset, coordinator):
    """A task's epoch travels beside its id (docs/wire-protocol.md "Task
    ids"): the re-planned rest after a resume on another world size is a
    pass of its own, yet draws its random crops from (seed, epoch, sample
    id) like any pass, so every sample has an uninterrupted run's bytes
    (with the epoch bit-packed into the id, the DataServer drew them from
    another epoch)."""
    m = dataset / "m.jsonl"
    kw = dict(SMALL, random_crop=True)

    def videos(loader):
        return {i: v.clone() for b in loader
                for i, v in zip(b["ids"].tolist(), b["video"])}

    with datahelix.DataLoader(m, **kw) as full:
        ref = videos(full)
    with datahelix.DataLoader(m, **kw) as other:
        other.set_epoch(1)
        assert any(not torch.equal(v, ref[i])
                   for i, v in videos(other).items())  # crops do vary
    first = [datahelix.DataLoader(m, rank=r, world_size=2,
                                  coordinator=coordinator, **kw)
             for r in range(2)]
    for x in first:
        next(iter(x))
    state = first[0].state_dict()
    for x in first:
        x.close()
    with datahelix.DataLoader(m, rank=0, world_size=1,
                              coordinator=coordinator, **kw) as y:
        y.load_state_dict(state)
        got = videos(y)
        assert y.state_dict()["replanned"] == [[2, 2, 1]]
    assert len(got) == 8 and len(ref) == 12
    for i, v in got.items():
        assert torch.equal(v, ref[i]), i


def test_resume_refuses_another_manifest_seed_or_sampling(dataset,
                                                          tmp_path):
    """state_dict() fingerprints the manifest and the plan's inputs; a
    state loaded into a loader that would give its step other samples, or
    sample them otherwise, is a ValueError naming both values."""
    m = dataset / "m.jsonl"
    with datahelix.DataLoader(m, **SMALL) as a:
        it = iter(a)
        next(it)
        state = a.state_dict()
    assert state["plan"] == {"balance": "fixed", "drop_last": True,
                             "step_order": "alternate",
                             "sampling": {"frames": 4, "size": [32, 32],
                                          "random_crop": False}}
    json.dumps(state)  # plain data: any checkpoint format holds it
    lines = m.read_text().splitlines(keepends=True)
    head = [x for x in lines if "datahelix_header" in x]
    body = [x for x in lines if "datahelix_header" not in x]
    ten = tmp_path / "ten.jsonl"
    ten.write_text("".join(head + body[:10]))
    with pytest.raises(ValueError, match=r"state_dict: saved with another "
                       r"manifest, of 12 samples .*this loader has 10 "
                       r"samples"):
        datahelix.DataLoader(ten, **SMALL).load_state_dict(state)
    with pytest.raises(ValueError, match=r"state_dict: saved with seed=0, "
                       r"this loader has seed=3"):
        datahelix.DataLoader(m, seed=3, **SMALL).load_state_dict(state)
    with pytest.raises(ValueError, match=r"state_dict: saved with frames=4, "
                       r"this loader has frames=8"):
        datahelix.DataLoader(m, **dict(SMALL, frames=8)).load_state_dict(
            state)
    with pytest.raises(ValueError, match=r"saved with size=\[32, 32\], "
                       r"this loader has size=\[48, 48\]"):
        datahelix.DataLoader(m, **dict(SMALL, size=(48, 48))
                             ).load_state_dict(state)
    with pytest.raises(ValueError, match=r"saved with random_crop=False, "
                       r"this loader has random_crop=True"):
        datahelix.DataLoader(m, random_crop=True, **SMALL).load_state_dict(
            state)
    # Mid-epoch, how samples go into steps matters too ...
    with pytest.raises(ValueError, match=r"saved with balance='fixed', "
                       r"this loader has balance='free'"):
        datahelix.DataLoader(m, balance="free", **SMALL).load_state_dict(
            state)
    with pytest.raises(ValueError, match=r"saved with drop_last=True, "
                       r"this loader has drop_last=False"):
        datahelix.DataLoader(m, drop_last=False, **SMALL).load_state_dict(
            state)
    with pytest.raises(ValueError, match=r"saved with step_order='alternate'"
                       r", this loader has step_order='sorted'"):
        datahelix.DataLoader(m, step_order="sorted", **SMALL
                             ).load_state_dict(state)
    # ... but not before the first step (nothing consumed yet).
    with datahelix.DataLoader(m, **SMALL) as fresh:
        start = fresh.state_dict()
    with datahelix.DataLoader(m, balance="free", **SMALL) as x:
        x.load_state_dict(start)
        assert x.state_dict()["step"] == 0
    # Knowingly: without the fingerprint, the step is taken as it is.
    with datahelix.DataLoader(m, **dict(SMALL, frames=8)) as x:
        x.load_state_dict({k: v for k, v in state.items() if k != "plan"})
        assert x.state_dict()["step"] == 1


def test_end_of_epoch_resumes_at_the_next_epoch_on_any_world_size(
        dataset, coordinator):
    """A state saved once its epoch was consumed (2 ranks) resumes at
    epoch + 1, step 0: on 3 ranks (it failed with "the manifest has no
    samples") every sample of the next epoch comes exactly once, in that
    epoch's plan; on the same world size too."""
    m = dataset / "m.jsonl"
    first = [datahelix.DataLoader(m, rank=r, world_size=2,
                                  coordinator=coordinator, **SMALL)
             for r in range(2)]
    done = [[b["ids"].tolist() for b in x] for x in first]
    assert sorted(i for d in done for s in d for i in s) == list(range(12))
    state = first[0].state_dict()
    assert (state["epoch"], state["step"]) == (0, 3)
    for x in first:
        x.close()
    second = [datahelix.DataLoader(m, rank=r, world_size=3,
                                   coordinator=coordinator, **SMALL)
              for r in range(3)]
    for x in second:
        x.load_state_dict(state)
        assert (x.state_dict()["epoch"], x.state_dict()["step"]) == (1, 0)
        assert x.state_dict()["replanned"] == []
        x.set_epoch(1)  # what a training loop calls: no change
    got = [[(b["epoch"], b["step"], b["ids"].tolist()) for b in x]
           for x in second]
    for x in second:
        x.close()
    ids = [i for g in got for _, _, s in g for i in s]
    assert sorted(ids) == list(range(12)), ids  # once each
    assert all(e == 1 for g in got for e, _, _ in g)
    for r, g in enumerate(got):  # epoch 1's own plan at 3 ranks
        assert [s for _, _, s in g] == [
            x[r] for x in plan(m, 3, 2, epoch=1)]
    with datahelix.DataLoader(m, **SMALL) as one:  # same world size
        end = [b for b in one][-1]["step"] + 1
        s1 = one.state_dict()
        assert s1["step"] == end
    with datahelix.DataLoader(m, **SMALL) as one:
        one.load_state_dict(s1)
        e1 = [b["ids"].tolist() for b in one]
    assert e1 == [s[0] for s in plan(m, 1, 2, epoch=1)]


def _collect(loader, into):
    out = []
    for b in loader:
        into.extend(b["ids"].tolist())
        out.append(b)
    return out


@pytest.fixture
def corrupt(dataset, tmp_path):
    """The dataset with clip 3 truncated after probing: (table, path)."""
    d = tmp_path / "bad"
    shutil.copytree(dataset / "videos", d / "videos")
    run_dh("probe", "--out", d / "m.jsonl", d / "videos", check=True)
    victim = rows(d / "m.jsonl")[3]["path"]
    data = pathlib.Path(victim).read_bytes()
    pathlib.Path(victim).write_bytes(data[: len(data) // 3])
    return d / "m.jsonl", victim


def test_corrupt_clip_raises_at_its_step_or_is_skipped(corrupt):
    m, victim = corrupt
    steps = plan(m, 1, 2)
    bad = next(k for k, s in enumerate(steps) if 3 in s[0])
    with datahelix.DataLoader(m, **SMALL) as loader:
        it = iter(loader)
        seen = [next(it)["step"] for _ in range(bad)]
        with pytest.raises(datahelix.SampleError) as ei:
            next(it)
        assert seen == list(range(bad))
        e = ei.value
        assert victim in str(e) and "sample 3" in str(e)
        assert isinstance(e, datahelix.DataError)
        assert not isinstance(e, (TimeoutError, datahelix.ArenaExhausted))
        assert (e.sample_id, e.path, e.step, e.rank) == (3, victim, bad, 0)
        assert e.stage in ("decode", "read") and e.cause and e.cause in str(e)
        assert e.code < 0 and e.server >= 1
        # As torch's iterator after a worker's exception: the same
        # iterator goes on with the next step.
        assert [b["step"] for b in it] == list(range(bad + 1, len(steps)))
    # skip: the clip is replaced in its position by a spare of this rank's
    # plan; every step comes, full-size; the batch says what was replaced.
    with datahelix.DataLoader(m, on_error="skip", **SMALL) as loader:
        got = [(b["step"], b["ids"].tolist(), b["substituted"])
               for b in loader]
        assert [k for k, _, _ in got] == list(range(len(steps)))
        mine = [i for s in steps for i in s[0]]
        for k, ids, subs in got:
            assert len(ids) == 2
            if k != bad:
                assert ids == steps[k][0] and subs == []
                continue
            (x,) = subs
            pos = steps[k][0].index(3)
            assert (x["position"], x["failed_id"]) == (pos, 3)
            assert x["stage"] in ("decode", "read") and x["code"] < 0
            assert isinstance(x["cause"], str) and x["cause"]
            sub = x["substitute_id"]
            assert sub != 3 and sub in mine and sub not in steps[k][0]
            assert ids == [sub if i == 3 else i for i in steps[k][0]]
        st = loader.stats()
        assert st["substituted"] == 1 and st["skipped"] == 0
        assert st["errors"] == 0 and st["quarantine"] == [3]


SKIP_SCRIPT = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, sys.argv[1])
    import datahelix
    loader = datahelix.DataLoader(sys.argv[2], batch_size=2, frames=4,
                                  size=(32, 32), timeout=60, on_error="skip")
    out = [{"step": b["step"], "ids": b["ids"].tolist(),
            "shape": list(b["video"].shape), "subs": b["substituted"]}
           for b in loader]
    print(json.dumps({"rank": loader.rank, "steps": out,
                      "substituted": loader.stats()["substituted"]}),
          flush=True)
    loader.close()
""")


def test_skip_keeps_two_ranks_in_lockstep(corrupt):
    """Issue 15 item 2: two DataLoader ranks (separate processes, one
    Coordinator), a corrupt clip in one rank's share, on_error="skip":
    both ranks yield the same number of steps, every one of the planned
    size, and the rank with the clip reports its substitute (from its own
    share).  The old skip dropped that step: one rank took a step fewer."""
    m, _ = corrupt
    datahelix.DataLoader(m, **SMALL).close()  # compile the index once
    want = plan(m, 2, 2)
    bad_rank = next(r for r in range(2) if any(3 in s[r] for s in want))
    res = two_ranks(SKIP_SCRIPT, m)
    assert len(res[0]["steps"]) == len(res[1]["steps"]) == len(want)
    for r in range(2):
        mine = [i for s in want for i in s[r]]
        for k, b in enumerate(res[r]["steps"]):
            assert b["step"] == k and b["shape"] == [2, 4, 32, 32, 3]
            if r != bad_rank or 3 not in want[k][r]:
                assert b["ids"] == want[k][r] and b["subs"] == []
                continue
            (x,) = b["subs"]
            assert x["failed_id"] == 3 and x["substitute_id"] in mine
            assert b["ids"] == [x["substitute_id"] if i == 3 else i
                                for i in want[k][r]]
        assert res[r]["substituted"] == (1 if r == bad_rank else 0)


def test_manifest_with_a_line_removed(dataset, tmp_path):
    """A table that lost a line: the loader names the gap and the command
    that renumbers it; after that command the same .jsonl gives the n-1
    remaining samples under dense ids, and a checkpoint of the full table
    is refused rather than resumed on other samples."""
    lines = (dataset / "m.jsonl").read_text().splitlines(keepends=True)
    head = [x for x in lines if "datahelix_header" in x]
    body = [x for x in lines if "datahelix_header" not in x]
    cut = tmp_path / "cut.jsonl"
    cut.write_text("".join(head + body[:4] + body[5:]))
    kept = [json.loads(x)["path"] for x in body[:4] + body[5:]]
    with pytest.raises(datahelix.DataError) as ei:
        datahelix.DataLoader(cut, **SMALL)
    msg = str(ei.value)
    assert "ids are not dense: id 4 is missing" in msg, msg
    dhx = tmp_path / "cut.dhx"
    assert f"datahelix index --renumber {cut} -o {dhx}" in msg, msg
    run_dh("index", "--renumber", cut, "-o", dhx, check=True)
    with datahelix.DataLoader(dataset / "m.jsonl", **SMALL) as full:
        state = full.state_dict()
    assert state["manifest"]["samples"] == 12
    with datahelix.DataLoader(cut, drop_last=False, **SMALL) as loader:
        assert loader.index_path == str(dhx)
        assert [loader._index.path(i) for i in range(11)] == kept
        ids = [i for b in loader for i in b["ids"].tolist()]
        assert sorted(ids) == list(range(11))
        assert loader.state_dict()["manifest"]["samples"] == 11
        with pytest.raises(ValueError, match="another manifest"):
            loader.load_state_dict(state)
        state.pop("manifest")   # knowingly: that step of this plan
        loader.load_state_dict(state)


RANK_SCRIPT = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, sys.argv[1])
    import datahelix
    loader = datahelix.DataLoader(sys.argv[2], batch_size=2, frames=4,
                                  size=(32, 32), timeout=60)
    ids = [b["ids"].tolist() for b in loader]
    print(json.dumps({"rank": loader.rank, "ids": ids}), flush=True)
    loader.close()
""")


def test_two_ranks_torchrun_style_share_one_coordinator(dataset, tmp_path):
    m = dataset / "m.jsonl"
    datahelix.DataLoader(m, **SMALL).close()  # compile the index once
    port = free_port()
    res = {r: out["ids"]
           for r, out in two_ranks(RANK_SCRIPT, m, port=port).items()}
    want = plan(m, 2, 2)
    for r in range(2):
        assert res[r] == [s[r] for s in want]
    every = sorted(i for r in range(2) for s in res[r] for i in s)
    assert every == list(range(12))
    # Rank 0's Coordinator outlives rank 0 while others need it, then ends
    # by itself once no rank's DataServer is left.
    addr = f"tcp://127.0.0.1:{port}"
    end = time.monotonic() + 15
    while time.monotonic() < end and coordinators_at(addr):
        time.sleep(0.1)
    assert not coordinators_at(addr), "the shared coordinator never ended"


def coordinators_at(addr):
    """Live `datahelix coordinator --listen addr` processes."""
    found = []
    for d in pathlib.Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            argv = (d / "cmdline").read_bytes().split(b"\0")
            st = (d / "stat").read_text()
        except OSError:
            continue
        if b"coordinator" in argv and addr.encode() in argv and \
                st[st.rindex(")") + 2:].split()[0] != "Z":
            found.append(int(d.name))
    return found


KILL_SCRIPT = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[1])
    import datahelix
    loader = datahelix.DataLoader(sys.argv[2], batch_size=2, frames=4,
                                  size=(32, 32))
    held = next(iter(loader))
    print("ready", flush=True)
    sys.stdin.read()  # until killed
""")


def test_sigkill_of_training_process_leaves_nothing(dataset):
    m = dataset / "m.jsonl"
    datahelix.DataLoader(m, **SMALL).close()
    shm = shm_names()
    p = subprocess.Popen([sys.executable, "-c", KILL_SCRIPT,
                          str(ROOT / "python"), str(m)],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "ready", p.stderr.read()
        kids = descendants(p.pid)
        assert len(kids) == 2  # the coordinator and the local DataServer
        p.kill()
        p.wait(timeout=10)
    finally:
        if p.poll() is None:
            p.kill()
    end = time.monotonic() + 5
    while time.monotonic() < end and any(alive(k) for k in kids):
        time.sleep(0.05)
    assert not any(alive(k) for k in kids), "a child outlived the training process"
    assert shm_residue(shm) == []


def test_bad_arguments(dataset, tmp_path):
    m = dataset / "m.jsonl"
    with pytest.raises(ValueError):
        datahelix.DataLoader(m, on_error="ignore")
    with pytest.raises(ValueError):
        datahelix.DataLoader(m, rank=2, world_size=2)
    with pytest.raises(ValueError, match=r"step_order='random': one of "
                       r"\['alternate', 'sorted'\]"):
        datahelix.DataLoader(m, step_order="random")
    with pytest.raises(FileNotFoundError):
        datahelix.DataLoader(tmp_path / "missing.jsonl")


TRAIN_SCRIPT = textwrap.dedent("""
    import json, os, sys
    import torch, torch.distributed as dist
    sys.path.insert(0, sys.argv[1])
    import datahelix
    dist.init_process_group("gloo")
    loader = datahelix.DataLoader(sys.argv[2], batch_size=1, frames=4,
                                  size=(32, 32))
    ids = []
    for b in loader:   # a training step: the gradient sync is real
        t = b["video"].float().mean().reshape(1)
        dist.all_reduce(t)
        ids += b["ids"].tolist()
    with open(os.path.join(sys.argv[3], f"rank{dist.get_rank()}.json"),
              "w") as f:
        json.dump({"ids": ids, "len": len(loader),
                   "world": loader.world_size}, f)
    loader.close()
    dist.destroy_process_group()
""")


def test_torchrun_four_cpu_ranks_gloo(dataset, tmp_path):
    m = dataset / "m.jsonl"
    datahelix.DataLoader(m, **SMALL).close()  # compile the index once
    script = tmp_path / "train.py"
    script.write_text(TRAIN_SCRIPT)
    res = torchrun(4, script, tmp_path, m, timeout=240)
    want = plan(m, 4, 1)
    for r in range(4):
        assert res[r]["world"] == 4 and res[r]["len"] == len(want)
        assert res[r]["ids"] == [s[r][0] for s in want]
    assert sorted(i for x in res for i in x["ids"]) == list(range(12))


RESUME_SCRIPT = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, sys.argv[1])
    import datahelix
    loader = datahelix.DataLoader(sys.argv[2], batch_size=2, frames=4,
                                  size=(32, 32))
    if len(sys.argv) > 3:
        loader.load_state_dict(json.loads(sys.argv[3]))
    for b in loader:   # the checkpoint is written after the step is used
        print(json.dumps({"ids": b["ids"].tolist(),
                          "state": loader.state_dict()}), flush=True)
    print("done", flush=True)
""")


def test_resume_after_kill9_consumes_the_epoch_once(dataset):
    m = dataset / "m.jsonl"
    datahelix.DataLoader(m, **SMALL).close()
    args = [sys.executable, "-c", RESUME_SCRIPT, str(ROOT / "python"),
            str(m)]
    p = subprocess.Popen(args, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    consumed, state = [], None
    try:
        for _ in range(2):
            rec = json.loads(p.stdout.readline())
            consumed += rec["ids"]
            state = rec["state"]
        p.kill()  # SIGKILL mid-epoch, after the checkpoint of step 1
        p.wait(timeout=10)
    finally:
        if p.poll() is None:
            p.kill()
    assert state["step"] == 2
    p = subprocess.run(args + [json.dumps(state)], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[-1] == "done"
    for line in lines[:-1]:
        consumed += json.loads(line)["ids"]
    assert sorted(consumed) == list(range(12)), consumed
    assert consumed == [i for s in plan(m, 1, 2) for i in s[0]]


def test_holding_the_whole_arena_raises_at_once(dataset):
    """Batches kept past the arena (arena_mb): ArenaExhausted at once
    (not the server's 30 s wait, not a sample error), the step still
    next; once they are dropped, every step comes exactly once."""
    m = dataset / "m.jsonl"
    want = [s[0] for s in plan(m, 1, 2)]
    # 2 x 8 x 128 x 128 x 3 = 768 KiB a batch: 3.5 MiB hold four, what
    # prefetch 2 needs (two ready, one in hand, one being written)
    with datahelix.DataLoader(m, batch_size=2, frames=8, size=(128, 128),
                              prefetch=2, arena_mb=3.5) as loader:
        held, steps = [], []
        it = iter(loader)
        t0 = time.monotonic()
        with pytest.raises(datahelix.ArenaExhausted) as ei:
            for _ in range(len(want)):
                b = next(it)
                held.append(b)
                steps.append(b["step"])
        e = ei.value
        assert time.monotonic() - t0 < 15
        assert not isinstance(e, datahelix.SampleError)
        assert e.consumed is False and e.sample_id is None
        assert e.stage == "arena" and "still held by the consumer" in str(e)
        st = loader.stats()
        assert 0 < st["held_bytes"] <= st["arena_bytes"] <= 4 << 20
        assert len(steps) >= 3
        del held, b, e, ei  # the traceback's frames hold a batch too
        gc.collect()
        # The step was not consumed: the same iterator goes on at it.
        rest = [(b["step"], b["ids"].tolist()) for b in it]
        assert steps + [k for k, _ in rest] == list(range(len(want)))
        assert [ids for _, ids in rest] == want[len(steps):]
