"""Issue 38 item 1, audio-only samples: a .wav, .flac, .mp3, .m4a or
.ogg file is a sample of kind "audio" - probed (its sound, its tokens),
planned, and decoded by the loaders into its row (no frames), beside
video samples in the same batch.
"""
import json
import math
import subprocess
import sys

import pytest

from conftest import ROOT, run_dh
from test_audio_probe import ffmpeg_of

sys.path.insert(0, str(ROOT / "python"))

FILES = [("a.wav", "pcm_s16le", 22050, 3.0), ("b.flac", "flac", 44100, 2.0),
         ("c.mp3", "libmp3lame", 44100, 7.0), ("d.m4a", "aac", 48000, 4.0),
         ("e.ogg", "libopus", 48000, 1.5)]


def make(tmp_path, ffprobe):
    ff = ffmpeg_of(ffprobe)
    for name, codec, rate, secs in FILES:
        subprocess.run([ff, "-v", "error", "-f", "lavfi", "-i",
                        f"sine=frequency=330:sample_rate={rate}:duration="
                        f"{secs}", "-c:a", codec, str(tmp_path / name)],
                       check=True, timeout=120)
    subprocess.run([ff, "-v", "error", "-f", "lavfi", "-i",
                    "testsrc=size=64x48:rate=10:duration=2", "-c:v", "ffv1",
                    str(tmp_path / "v.mkv")], check=True, timeout=120)


def rows(table):
    return {r["path"].rsplit("/", 1)[1]: r for r in map(
        json.loads, table.read_text().splitlines()) if "path" in r}


def test_probe_makes_audio_samples(tmp_path, ffprobe):
    make(tmp_path, ffprobe)
    t = tmp_path / "t.jsonl"
    run_dh("probe", "--quiet", tmp_path, "--out", t, check=True)
    got = rows(t)
    assert got["v.mkv"]["kind"] == "video"
    for name, _, rate, secs in FILES:
        r = got[name]
        assert r["kind"] == "audio" and r["frames"] == 0, r
        assert r["audio_rate"] == rate and r["profile"] == "audio"
        assert abs(r["audio_duration_s"] - secs) < 0.1, r
        # no model named: counted at Whisper's 50 tokens a second
        assert r["est_tokens"] == math.ceil(r["audio_duration_s"] * 50 -
                                            1e-9)
        # the sound's decode in the cost model: 1.5 ms a second of it
        assert r["est_cpu_ms"] >= 1.5 * r["audio_duration_s"] - 1e-3
    run_dh("probe", "--quiet", "--audio-tokens", "qwen-audio", tmp_path,
           "--out", t, check=True)
    r = rows(t)["c.mp3"]
    assert r["est_tokens"] == math.ceil(r["audio_duration_s"] * 25 - 1e-9)
    run_dh("index", t, "-o", tmp_path / "t.dhx", check=True)


def test_loader_decodes_audio_samples_beside_video(tmp_path, ffprobe):
    """Each audio sample's row is its sound from the start (the first
    audio_seconds of it), equal to decode_audio's; its frames are zeros
    with valid_frames 0; a video sample in the same batch is as ever.
    Without audio=True an audio sample is a SampleError naming it."""
    import datahelix
    make(tmp_path, ffprobe)
    t = tmp_path / "t.jsonl"
    run_dh("probe", "--quiet", tmp_path, "--out", t, check=True)
    seen = {}
    with datahelix.DataLoader(str(t), batch_size=3, frames=4,
                              size=(48, 64), shuffle=False, balance="none",
                              drop_last=False, audio=True, audio_rate=16000,
                              audio_seconds=5) as dl:
        for b in dl:
            for k, i in enumerate(b["ids"].tolist()):
                seen[dl._index.path(i).rsplit("/", 1)[1]] = (
                    b["video"][k].clone(), int(b["valid_frames"][k]),
                    int(b["audio_lengths"][k]), b["audio"][k].clone())
    assert sorted(seen) == sorted([f[0] for f in FILES] + ["v.mkv"])
    assert seen["v.mkv"][1] == 4
    for name, _, _, secs in FILES:
        video, valid, n, row = seen[name]
        assert valid == 0 and int(video.abs().sum()) == 0
        ref = datahelix.decode_audio(tmp_path / name, rate=16000,
                                     channels=1)
        assert n == min(5 * 16000, ref.shape[1]), (name, n)
        assert float((row[:, :n] - ref[:, :n]).abs().max()) <= 1e-6
        assert float(row[:, n:].abs().sum()) == 0
    with datahelix.DataLoader(str(t), batch_size=6, frames=4, size=(48, 64),
                              shuffle=False, balance="none") as dl:
        with pytest.raises(datahelix.SampleError,
                           match=r"an audio sample.*audio=True"):
            list(dl)


def test_audio_crop_windows(tmp_path, ffprobe):
    """audio_crop: "center" takes the window in the middle of the sound
    (decode_audio's samples of that span, within a sample of its start);
    "random" draws the window from (seed, epoch, id): the same for the
    same seed, elsewhere for another; a sound shorter than the window is
    all of it."""
    import datahelix
    import numpy as np
    make(tmp_path, ffprobe)
    t = tmp_path / "t.jsonl"
    run_dh("probe", "--quiet", tmp_path, "--out", t, check=True)
    info = rows(t)

    def windows(crop, seed=0):
        out = {}
        with datahelix.DataLoader(str(t), batch_size=6, frames=4,
                                  size=(48, 64), shuffle=False,
                                  balance="none", audio=True,
                                  audio_rate=16000, audio_seconds=2,
                                  audio_crop=crop, seed=seed) as dl:
            (b,) = list(dl)
            for k, i in enumerate(b["ids"].tolist()):
                out[dl._index.path(i).rsplit("/", 1)[1]] = (
                    b["audio"][k][0].numpy().copy(),
                    int(b["audio_lengths"][k]))
        return out
    start, center = windows("start"), windows("center")
    r1, r2, other = windows("random", 5), windows("random", 5), \
        windows("random", 6)
    r = info["c.mp3"]  # 7 s: 5 s of room for a 2 s window
    t0 = r["audio_start_s"] + (r["audio_duration_s"] - 2) / 2
    ref = datahelix.decode_audio(tmp_path / "c.mp3", start=t0, end=t0 + 2,
                                 rate=16000, channels=1).numpy()[0]
    got, n = center["c.mp3"]
    assert n == 32000
    assert min(float(np.abs(got[max(0, s):n + min(0, s)] -
                            ref[max(0, -s):n - max(0, s)]).max())
               for s in (-1, 0, 1)) <= 1e-4
    assert float(np.abs(center["c.mp3"][0] - start["c.mp3"][0]).max()) > 0.1
    assert np.array_equal(r1["c.mp3"][0], r2["c.mp3"][0])
    assert float(np.abs(r1["c.mp3"][0] - other["c.mp3"][0]).max()) > 0.1
    # e.ogg is 1.5 s: shorter than the window, all of it whatever the crop
    for w in (start, center, r1):
        assert abs(w["e.ogg"][1] - 24000) <= 1
    with pytest.raises(ValueError, match="audio_crop"):
        datahelix.DataLoader(str(t), audio=True, audio_crop="middle")
