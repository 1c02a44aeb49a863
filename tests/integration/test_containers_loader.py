"""The containers training video is kept in, through the whole loader.

The same x264 streams stream-copied into MPEG-TS, fragmented MP4, FLV and
Matroska must give the very tensors the MP4 gives (the container changes
nothing about which picture is frame i), and `datahelix.DataLoader` over a
table of all of them, MPEG-2 in TS and PS included, takes the epoch with no
error and the bytes `datahelix decode` gives (issue "Real-world media":
these failed at frame 0 in the loader).
"""
import json
import subprocess
import sys

import pytest

from conftest import ROOT, run_dh, _binary

torch = pytest.importorskip("torch")
sys.path.insert(0, str(ROOT / "python"))
import datahelix  # noqa: E402

REMUX = {  # suffix: ffmpeg output options
    "ts": ["-c", "copy", "-f", "mpegts"],
    "offset.ts": ["-c", "copy", "-f", "mpegts", "-output_ts_offset", "10"],
    "frag.mp4": ["-c", "copy", "-movflags", "frag_keyframe+empty_moov"],
    "flv": ["-c", "copy"],
    "mkv": ["-c", "copy"],
}
REENCODE = {
    "mpeg2.ts": ["-c:v", "mpeg2video", "-g", "12", "-bf", "2", "-f",
                 "mpegts"],
    "mpg": ["-c:v", "mpeg2video", "-g", "12", "-bf", "2", "-f", "vob"],
}
PLAN = ["--frames", "6", "--size", "32x32"]  # the loader's crop geometry


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    d = tmp_path_factory.mktemp("containers")
    run_dh("gen-data", "--out", d / "src", "--profiles", "S", "--count", 3,
           "--seed", 11, check=True, timeout=300)
    srcs = sorted((d / "src").glob("*.mp4"))
    assert len(srcs) == 3
    made = {}
    for src in srcs:
        for suffix, args in {**REMUX, **REENCODE}.items():
            out = d / f"{src.stem}.{suffix}"
            subprocess.run(["ffmpeg", "-nostdin", "-v", "error", "-y", "-i",
                            src, "-map", "0:v:0", *args, out], check=True,
                           timeout=120)
            made[out] = (src, suffix)
    return d, srcs, made


def decode_bytes(tmp_path, path):
    out = tmp_path / "o.raw"
    p = run_dh("decode", *PLAN, "--json", "--out", out, path)
    assert p.returncode == 0, p.stderr
    return out.read_bytes(), json.loads(p.stdout.splitlines()[0])


def test_stream_copies_decode_to_the_mp4s_tensors(tmp_path, clips):
    _, srcs, made = clips
    want = {src: decode_bytes(tmp_path, src)[0] for src in srcs}
    for path, (src, suffix) in made.items():
        if suffix not in REMUX:
            continue
        got, obj = decode_bytes(tmp_path, path)
        assert got == want[src], f"{path.name}: not {src.name}'s frames " \
                                 f"(indices {obj['indices']})"


def test_loader_epoch_over_every_container(tmp_path, clips, monkeypatch):
    d, srcs, made = clips
    monkeypatch.setenv("DATAHELIX_BIN", _binary())
    monkeypatch.delenv("DATAHELIX_COORDINATOR", raising=False)
    files = srcs + sorted(made)
    m = tmp_path / "m.jsonl"
    run_dh("probe", "--quiet", "--out", m, *files, check=True)
    paths = {r["id"]: r["path"] for r in map(json.loads,
                                             m.read_text().splitlines())
             if "id" in r}
    assert len(paths) == len(files)
    seen = []
    assert len(files) % 3 == 0  # drop_last must drop nothing
    with datahelix.DataLoader(m, batch_size=3, frames=6, size=(32, 32),
                              timeout=120) as loader:
        for b in loader:
            for j, i in enumerate(b["ids"].tolist()):
                seen.append(i)
                ref, _ = decode_bytes(tmp_path, paths[i])
                assert bytes(b["video"][j].reshape(-1).numpy()) == ref, \
                    paths[i]
        assert loader.stats()["errors"] == 0
    assert sorted(seen) == sorted(paths)
