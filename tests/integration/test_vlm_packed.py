"""Sampling for VLMs (issue 15 item 5): frames="fps:F", size=None.

Each sample keeps its own T and H x W (native size, bounded and rounded to
the patch), the batch's samples lie back to back in one arena slot after a
small table, and every tensor the loader yields is a view of that slot:
the per-sample shapes and bytes are what `datahelix decode --size native`
gives for that file, and the slot holds nothing but the table and the
samples.

Tier 1 balances the tokens of this sampling: the loader warns that the
manifest's est_tokens were made with the probe's sampling, re-estimates
them with the probe's own code and the decoder's rules, and those equal
the tokens of the decoded shapes; a plan by them beats a random split.
"""
import array
import ctypes
import json
import pathlib
import sys

import pytest

from conftest import ROOT, probed_set, run_dh, _binary
from procs import arena_mapping

torch = pytest.importorskip("torch")
sys.path.insert(0, str(ROOT / "python"))
import datahelix  # noqa: E402
from datahelix import _C, _packed  # noqa: E402

# fps 1, at most 8 frames, the longer side <= 600, 28-multiples: S clips
# (400x224, ~2 s) come out 392x224, M clips (600x336, ~4 s) 588x336.
NATIVE = dict(frames="fps:1", max_frames=8, size=None, max_side=600,
              patch=28)
DECODE = ["--plan", "fps:1", "--frames", 8, "--size", "native",
          "--max-side", 600, "--patch", 28]


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    """12 clips, S and M alternating: two resolutions, several lengths."""
    return probed_set(tmp_path_factory.mktemp("vlm"), "S,M", 12, 7)


@pytest.fixture(autouse=True)
def binary_env(monkeypatch):
    monkeypatch.setenv("DATAHELIX_BIN", _binary())
    monkeypatch.delenv("DATAHELIX_COORDINATOR", raising=False)


def rows(manifest):
    return {r["id"]: r for r in map(json.loads,
                                     pathlib.Path(manifest).read_text()
                                     .splitlines()) if "id" in r}


def decoded(path, tmp_path):
    """(T, H, W, bytes) of `path` by `datahelix decode --size native`."""
    out = tmp_path / "ref.raw"
    p = run_dh("decode", *DECODE, "--json", "--out", out, path, check=True)
    rec = json.loads(p.stdout.splitlines()[0])
    return rec["frames"], rec["height"], rec["width"], out.read_bytes()


def test_samples_match_decode_back_to_back_without_padding(mixed, tmp_path):
    m = mixed / "m.jsonl"
    table = rows(m)
    shapes = set()
    with datahelix.DataLoader(m, batch_size=3, shuffle=False,
                              **NATIVE) as loader:
        for b in loader:
            ids = b["ids"].tolist()
            videos = b["video"]
            assert isinstance(videos, list) and len(videos) == 3
            thw = b["thw"].tolist()
            seq = b["cu_seqlens"]
            assert seq.dtype == torch.int32 and seq.tolist()[0] == 0
            assert b["thw"].dtype == torch.int64 and len(thw) == 3
            base = videos[0].data_ptr()
            assert "memfd:datahelix-arena" in arena_mapping(base)
            total = 0
            for j, i in enumerate(ids):
                t, h, w, ref = decoded(table[i]["path"], tmp_path)
                v = videos[j]
                assert tuple(v.shape) == (t, h, w, 3) == (*thw[j], 3)
                assert h % 28 == 0 and w % 28 == 0
                assert bytes(v.reshape(-1).numpy()) == ref
                # Back to back: each sample starts where the last ended.
                assert v.data_ptr() == base + total
                total += len(ref)
                assert seq[j + 1] - seq[j] == t * (h // 28) * (w // 28)
                shapes.add((t, h, w))
            # packed is the same memory, one pixel row per RGB triple.
            packed = b["packed"]
            assert packed.data_ptr() == base
            assert tuple(packed.shape) == (total // 3, 3)
            assert b["valid_frames"].tolist() == [s[0] for s in thw]
    assert len({(h, w) for _, h, w in shapes}) >= 2   # mixed sizes
    assert len({t for t, _, _ in shapes}) >= 2        # mixed lengths


def test_slot_holds_the_table_and_the_samples_only(mixed):
    m = mixed / "m.jsonl"
    with datahelix.DataLoader(m, batch_size=2, shuffle=False,
                              **NATIVE) as loader:
        it = iter(loader)
        b = next(it)
        videos = b["video"]
        # The table sits right before sample 0: read the slot's header.
        n = len(videos)
        start = videos[0].data_ptr() - _packed.table_bytes(n)
        raw = ctypes.string_at(start, _packed.table_bytes(n))
        magic, count, used = _packed.header_used(raw)
        assert magic == 0x4b504844 and count == n
        sample_bytes = sum(v.numel() for v in videos)
        assert used == _packed.table_bytes(n) + sample_bytes
        del it


def test_native_arguments_are_checked(mixed):
    m = mixed / "m.jsonl"
    with pytest.raises(ValueError, match="bound a native size"):
        datahelix.DataLoader(m, size=(224, 224), max_side=448)
    with pytest.raises(ValueError, match="fps:F"):
        datahelix.DataLoader(m, frames="fps:0")
    with pytest.raises(ValueError, match="caps an fps plan"):
        datahelix.DataLoader(m, frames=8, max_frames=4)
    with pytest.raises(ValueError, match="THWC"):
        datahelix.DataLoader(m, size=None, layout="TCHW")
    with pytest.raises(ValueError, match="patch"):
        datahelix.DataLoader(m, size=None, patch=2048)


def real_tokens(t, h, w):
    """qwen-vl (the probe's default model): 2 x 28 x 28 patches."""
    return -(-t // 2) * (h // 28) * (w // 28)


def test_tokens_are_this_samplings_and_a_mismatch_warns(mixed):
    m = mixed / "m.jsonl"
    with pytest.warns(UserWarning, match="est_tokens were made with "
                      "frames='fps:8', this loader samples frames='fps:1'"):
        loader = datahelix.DataLoader(m, batch_size=3, shuffle=False,
                                      **NATIVE)
    stored = rows(m)
    real = {}
    with loader:
        for b in loader:
            for i, k, (t, h, w) in zip(b["ids"].tolist(),
                                       b["tokens"].tolist(),
                                       b["thw"].tolist()):
                assert k == real_tokens(t, h, w), (i, k, (t, h, w))
                real[i] = k
    assert len(real) == 12
    # The stored ones (fps:8, native) were not what is decoded.
    assert any(stored[i]["est_tokens"] != k for i, k in real.items())
    # Balance, measured on the real tokens: a plan by this sampling's
    # tokens beats the random split (balance="none"), world 2 x batch 2.
    from datahelix._loader import _BALANCE
    tok = loader._tokens.tobytes()

    def ratio(balance):
        worst = []
        for epoch in range(8):
            sums = []
            for r in range(2):
                ids, offs = _C.schedule(loader.index_path, 2, 2, r, epoch,
                                        0, _BALANCE[balance], True,
                                        tokens=tok)
                ids = array.array("Q", ids)
                offs = array.array("Q", offs)
                sums.append([sum(real[i] for i in ids[offs[k]:offs[k + 1]])
                             for k in range(len(offs) - 1)])
            for a, b in zip(*sums):
                worst.append(max(a, b) / ((a + b) / 2))
        return sum(worst) / len(worst)

    assert ratio("fixed") < ratio("none") - 0.05


def test_a_matching_manifest_does_not_warn(mixed, tmp_path):
    m = tmp_path / "same.jsonl"
    run_dh("probe", "--frames", "fps:1", "--max-frames", 8, "--size",
           "native", "--max-side", 600, "--out", m, mixed / "videos",
           check=True)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loader = datahelix.DataLoader(m, batch_size=2, frames="fps:1",
                                      max_frames=8, size=None, max_side=600)
    assert loader._tokens is None
    loader.close()


def test_resume_refuses_other_native_bounds(mixed):
    m = mixed / "m.jsonl"
    with pytest.warns(UserWarning):
        a = datahelix.DataLoader(m, batch_size=2, **NATIVE)
        b = datahelix.DataLoader(m, batch_size=2, **dict(NATIVE, patch=14))
    state = a.state_dict()
    assert state["plan"]["sampling"]["patch"] == 28
    with pytest.raises(ValueError, match="patch=28"):
        b.load_state_dict(state)
    a.close()
    b.close()
