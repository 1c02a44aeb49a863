"""datahelix.DataLoader(transform=...) (issue 15 item 4): the transform runs
on the local DataServer's Python workers, not in the training process;
what it makes equals the transform applied here to the plain loader's
frames; its errors are sample errors (raise at the step, or the sample
substituted under on_error="skip"), named.

Every wait is bounded: loaders run with a timeout.
"""
import os
import sys
import textwrap
import threading

import pytest

from conftest import ROOT, _binary
from test_loader_habits import SMALL, corrupt_copy, plan, sets  # noqa: F401
from test_python import two_ranks

torch = pytest.importorskip("torch")
sys.path.insert(0, str(ROOT / "python"))
import datahelix  # noqa: E402


@pytest.fixture(autouse=True)
def binary_env(monkeypatch):
    monkeypatch.setenv("DATAHELIX_BIN", _binary())
    monkeypatch.delenv("DATAHELIX_COORDINATOR", raising=False)


def to_float(v):
    """uint8 [T, H, W, 3] -> float32 [3, T, H-4, W-4]: a crop, a flip and a
    normalisation, as a real eval transform."""
    v = v[:, 2:-2, 2:-2].flip(2)
    return v.permute(3, 0, 1, 2).float().div_(255).sub_(0.5)


def with_pid(v):
    """The frames as floats, flattened, with the pid that ran it last."""
    return torch.cat([v.flatten().float(),
                      torch.tensor([float(os.getpid())])])


def fails_on(path):
    """A transform that raises ValueError on the frames of the clip at
    `path` (told apart by their bytes: a transform sees no id)."""
    bad = datahelix._C.decode(str(path), SMALL["frames"], *SMALL["size"])

    def transform(v):
        if v.numpy().tobytes() == bad:
            raise ValueError("this clip is rejected by the transform")
        return to_float(v)
    return transform


def test_transform_runs_outside_the_training_process(sets):
    m = sets / "val.jsonl"
    with datahelix.DataLoader(m, transform=with_pid, num_workers=2,
                              **SMALL) as loader:
        batches = list(loader)
        st = loader.stats()
    assert len(batches) == len(plan(m, 1, 2))
    pids = {int(p) for b in batches for p in b["video"][:, -1].tolist()}
    assert pids and os.getpid() not in pids
    assert st["transform_ms"] > 0 and st["epoch"]["transform_ms"] > 0
    assert sorted(batches[0]) == ["epoch", "ids", "step", "substituted",
                                  "text", "tokens", "valid_frames", "video"]


def test_transform_output_equals_it_applied_here_to_the_plain_frames(sets):
    m = sets / "train.jsonl"
    for kw in ({}, {"random_crop": True, "seed": 5}):
        with datahelix.DataLoader(m, **kw, **SMALL) as plain:
            want = [(b["ids"].tolist(), b["valid_frames"].tolist(),
                     b["tokens"].tolist(), b["text"],
                     torch.stack([to_float(v) for v in b["video"]]))
                    for b in plain]
        with datahelix.DataLoader(m, transform=to_float, **kw,
                                  **SMALL) as loader:
            got = [(b["ids"].tolist(), b["valid_frames"].tolist(),
                    b["tokens"].tolist(), b["text"], b["video"])
                   for b in loader]
        assert [g[:4] for g in got] == [w[:4] for w in want]
        assert got[0][4].dtype == torch.float32
        assert tuple(got[0][4].shape) == (2, 3, 4, 28, 28)
        for g, w in zip(got, want):
            assert torch.equal(g[4], w[4])


def test_transform_with_collate_fn_both_on_the_workers(sets):
    m = sets / "val.jsonl"

    def collate(samples):
        return {"ids": [s["id"] for s in samples], "pid": os.getpid(),
                "video": torch.stack([s["video"] for s in samples])}

    with datahelix.DataLoader(m, transform=to_float, collate_fn=collate,
                              **SMALL) as loader:
        got = list(loader)
    assert [g["ids"] for g in got] == [s[0] for s in plan(m, 1, 2)]
    assert all(g["pid"] != os.getpid() for g in got)
    assert tuple(got[0]["video"].shape) == (2, 3, 4, 28, 28)


def victim(manifest, step=1):
    """(id, path) of the first sample of `step` of the one-rank plan."""
    sid = plan(manifest, 1, 2)[step][0][0]
    import json
    rows = [json.loads(x) for x in open(manifest)]
    return sid, next(r["path"] for r in rows if r.get("id") == sid)


def test_a_failing_transform_with_skip_is_substituted(sets):
    m = sets / "train.jsonl"
    sid, path = victim(m)
    want = plan(m, 1, 2)
    with datahelix.DataLoader(m, transform=fails_on(path), on_error="skip",
                              **SMALL) as loader:
        got = list(loader)
        st = loader.stats()
    assert len(got) == len(want)  # the planned steps, full size
    assert all(b["ids"].shape == (2,) for b in got)
    subs = [s for b in got for s in b["substituted"]]
    assert len(subs) == 1, subs
    s = subs[0]
    assert s["failed_id"] == sid and s["stage"] == "transform"
    assert "rejected by the transform" in s["cause"]
    assert s["substitute_id"] != sid
    assert got[1]["ids"][s["position"]].item() == s["substitute_id"]
    assert [b["ids"].tolist() for k, b in enumerate(got) if k != 1] == \
        [w[0] for k, w in enumerate(want) if k != 1]
    assert st["substituted"] == 1 and st["skipped"] == 0
    assert st["quarantine"] == [sid]


def test_a_failing_transform_raises_at_its_step_then_goes_on(sets):
    m = sets / "train.jsonl"
    sid, path = victim(m)
    want = [s[0] for s in plan(m, 1, 2)]
    with datahelix.DataLoader(m, transform=fails_on(path),
                              **SMALL) as loader:
        it, got = iter(loader), []
        while True:
            try:
                got.append(next(it)["ids"].tolist())
            except datahelix.SampleError as e:
                assert isinstance(e, ValueError)  # the transform's own type
                assert e.step == 1 and e.sample_id == sid
                assert e.stage == "transform" and e.path == path
                assert str(sid) in str(e) and path in str(e)
                assert "rejected by the transform" in str(e)
                got.append("error")
            except StopIteration:
                break
    assert got == want[:1] + ["error"] + want[2:]


def test_a_corrupt_clip_with_transform_and_skip(sets, tmp_path):
    m = corrupt_copy(sets / "train", tmp_path, 3)
    with datahelix.DataLoader(m, transform=to_float, on_error="skip",
                              **SMALL) as loader:
        got = list(loader)
    assert len(got) == len(plan(m, 1, 2))
    subs = [s for b in got for s in b["substituted"]]
    assert [(s["failed_id"], s["stage"]) for s in subs] == [(3, "decode")]
    assert subs[0]["code"] < 0 and "000003" in subs[0]["cause"]
    with datahelix.DataLoader(m, transform=to_float, **SMALL) as loader:
        with pytest.raises(datahelix.SampleError) as ei:
            list(loader)
    assert ei.value.sample_id == 3 and ei.value.stage == "decode"


def test_transform_must_be_picklable_and_batchable(sets):
    m = sets / "val.jsonl"
    lock = threading.Lock()
    with pytest.raises(TypeError, match="must be picklable"):
        datahelix.DataLoader(m, transform=lambda v: (lock, v), **SMALL)
    with pytest.raises(ValueError, match="microbatches=1"):
        datahelix.DataLoader(m, transform=to_float, microbatches=2, **SMALL)
    with pytest.raises(ValueError, match="listen="):
        datahelix.DataLoader(m, transform=to_float, listen="tcp://127.0.0.1:0",
                             **SMALL)

    def ragged(v, _n=[0]):  # a shape per call: a step cannot stack
        _n[0] += 1
        return v[:1 + _n[0] % 2]

    with datahelix.DataLoader(m, transform=ragged, **SMALL) as loader:
        with pytest.raises(datahelix.SampleError,
                           match="different shapes"):
            for _ in loader:
                pass


def test_a_jobs_header_carries_epoch_and_step_apart():
    """The header id of a step's job: bit 63, then epoch and global step
    in fields of their own (the worker's per-sample seeds derive from it:
    two steps, or one step of two epochs, never share one)."""
    from datahelix import _video
    seen = set()
    for epoch in (0, 1, 2, 4095, 4096, (1 << 38) - 1):
        for step in (0, 1, (1 << 24) - 1):
            h = _video.header(epoch, step)
            assert h & _video.HDR and not h & _video.SPARE
            assert _video._epoch_of(h & ~_video.HDR) == epoch
            assert h & ((1 << 24) - 1) == step
            seen.add(h)
    assert len(seen) == 18


def test_resume_mid_epoch_with_transform(sets):
    """state_dict() keeps its meaning: a loader with transform= resumed at
    step 2 yields exactly the rest of the plan, transformed."""
    m = sets / "train.jsonl"
    want = [s[0] for s in plan(m, 1, 2)]
    with datahelix.DataLoader(m, transform=to_float, **SMALL) as loader:
        it = iter(loader)
        first = [next(it)["ids"].tolist() for _ in range(2)]
        state = loader.state_dict()
    with datahelix.DataLoader(m, transform=to_float, **SMALL) as loader:
        loader.load_state_dict(state)
        rest = [b["ids"].tolist() for b in loader]
        again = [b["ids"].tolist() for b in loader]  # a new pass: all
    assert first == want[:2] and rest == want[2:] and again == want


TWO_RANKS = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, sys.argv[1])
    import datahelix

    def half(v):  # defined in __main__: travels by value (cloudpickle)
        return v[:, ::2, ::2].float()

    tx = half if TX_ON else None
    loader = datahelix.DataLoader(sys.argv[2], batch_size=2, frames=4,
                                  size=(32, 32), timeout=60, on_error="skip",
                                  transform=tx)
    out = [{"step": b["step"], "ids": b["ids"].tolist(),
            "shape": list(b["video"].shape),
            "subs": [(x["position"], x["failed_id"], x["substitute_id"],
                      x["stage"], x["code"]) for x in b["substituted"]]}
           for b in loader]
    print(json.dumps({"rank": loader.rank, "steps": out,
                      "substituted": loader.stats()["substituted"]}),
          flush=True)
    loader.close()
""")


def test_skip_with_transform_keeps_two_ranks_in_lockstep(sets, tmp_path):
    """Two ranks (separate processes, one Coordinator), a corrupt clip in
    one rank's share, transform= and on_error="skip": both ranks take
    every planned step, full size, and the substitute is the one the C
    pool picks without a transform (the same spares, from the plan)."""
    m = corrupt_copy(sets / "train", tmp_path, 3)
    datahelix.DataLoader(m, **SMALL).close()  # compile the index once
    want = plan(m, 2, 2)
    plain = two_ranks(TWO_RANKS.replace("TX_ON", "False"), m)
    tx = two_ranks(TWO_RANKS.replace("TX_ON", "True"), m)
    for r in range(2):
        assert len(tx[r]["steps"]) == len(plain[r]["steps"]) == len(want)
        for a, b in zip(tx[r]["steps"], plain[r]["steps"]):
            assert (a["step"], a["ids"], a["subs"]) == \
                (b["step"], b["ids"], b["subs"])
            assert a["shape"] == [2, 4, 16, 16, 3]
        assert tx[r]["substituted"] == plain[r]["substituted"]
    assert sorted(tx[r]["substituted"] for r in range(2)) == [0, 1]
