"""Issue 38 items 1, 2 and 4: `DataLoader(audio=True)` puts each sample's
sound - the span its sampled frames cover, resampled - into the batch
beside its frames (`audio` [B, C, S] zero-padded, `audio_lengths`,
`audio_mask`), from the DataServer's slot without a copy.

The clips are made here with the ffmpeg CLI: frame k's grey level says k,
and the soundtrack has a click at the time of every fifth frame, so a test
can tell from the batch alone which frames were sampled and where their
clicks must lie in the sound.
"""
import subprocess
import sys

import pytest

from conftest import ROOT, run_dh
from test_audio_probe import _ffmpeg_f32, ffmpeg_of

sys.path.insert(0, str(ROOT / "python"))

FPS = 25
SRC_RATE = 48000
CLICK_EVERY = 5  # frames


def make_clip(ffprobe, path, seconds, vcodec="ffv1", acodec="pcm_s16le",
              extra=()):
    """A clip whose frame k shows k in binary (eight bars, bar b white
    when bit b is set), with a click (one sample of 0.9) at the time of
    every CLICK_EVERY-th frame."""
    period = SRC_RATE // FPS * CLICK_EVERY
    subprocess.run([
        ffmpeg_of(ffprobe), "-v", "error", "-y", "-f", "lavfi", "-i",
        f"color=black:s=64x48:r={FPS}:d={seconds},"
        "geq=lum='if(bitand(N\\,pow(2\\,trunc(X/8)))\\,235\\,16)'"
        ":cb=128:cr=128", "-f", "lavfi", "-i",
        f"aevalsrc='if(eq(mod(n\\,{period})\\,0)\\,0.9\\,0)'"
        f":s={SRC_RATE}:d={seconds}",
        "-c:v", vcodec, "-pix_fmt", "yuv420p", "-c:a", acodec, *extra,
        str(path)], check=True, timeout=120)


def probe(folder):
    table = folder / "t.jsonl"
    run_dh("probe", folder, "-o", table, check=True)
    return table


def frame_index(frame):
    """The clip's frame number from its bars ([H, W, 3] at the clip's own
    64 x 48: bar b is columns 8b..8b+7)."""
    return sum(1 << b for b in range(8)
               if float(frame[:, 8 * b + 2:8 * b + 6].float().mean()) > 128)


def loader(table, **kw):
    import datahelix
    args = dict(batch_size=2, frames=8, size=(48, 64), shuffle=False,
                balance="none", drop_last=False, audio=True,
                audio_seconds=4, timeout=60)
    args.update(kw)
    return datahelix.DataLoader(str(table), **args)


def clicks(row, n):
    return [i for i in range(n) if abs(float(row[i])) > 0.1]


@pytest.mark.parametrize("rate", [48000, 16000])
def test_clicks_fall_where_the_frames_say(tmp_path, ffprobe, rate):
    """Alignment: for each sample of each batch, the row starts at its
    first sampled frame's time and ends with its last frame; every click
    of that span lies at (click time - first frame's time) x rate, within
    one sample - in MKV (PCM, FLAC) and in MPEG-TS, whose clock starts at
    1.4 s."""
    for i, secs in enumerate((2.4, 1.6, 3.2)):
        make_clip(ffprobe, tmp_path / f"c{i}.mkv", secs)
    make_clip(ffprobe, tmp_path / "flac.mkv", 2.0, acodec="flac")
    # MPEG-TS: its clock starts at 1.4 s; PCM in TS is SMPTE 302M
    make_clip(ffprobe, tmp_path / "offset.ts", 2.0, vcodec="mpeg2video",
              acodec="s302m", extra=("-ac", "2", "-strict", "-2", "-q:v",
                                     "2", "-f", "mpegts"))
    with loader(probe(tmp_path), audio_rate=rate) as dl:
        seen = 0
        for b in dl:
            assert b["audio"].dtype.is_floating_point
            assert b["audio"].shape[:2] == (len(b["ids"]), 1)
            assert b["audio"].shape[2] == 4 * rate
            for k in range(len(b["ids"])):
                valid = int(b["valid_frames"][k])
                idx = [frame_index(b["video"][k][t]) for t in range(valid)]
                assert idx == sorted(idx), idx
                first, last = idx[0], idx[-1]
                n = int(b["audio_lengths"][k])
                want = (last + 1 - first) * rate // FPS
                assert abs(n - want) <= 1, (n, want, idx)
                assert bool(b["audio_mask"][k])
                row = b["audio"][k][0]
                assert float(row[n:].abs().sum()) == 0  # zero-padded
                expect = [(f - first) * rate // FPS
                          for f in range(first, last + 1)
                          if f % CLICK_EVERY == 0]
                got = clicks(row, n)
                # a resampled click spreads over neighbours: its peak
                peaks = [max((j for j in got if abs(j - x) <= 2),
                             key=lambda j: abs(float(row[j])), default=None)
                         for x in expect]
                assert all(p is not None and abs(p - x) <= 1
                           for p, x in zip(peaks, expect)), (expect, got)
                seen += 1
        assert seen == 5


def test_rows_equal_ffmpeg_decode_of_the_span(tmp_path, ffprobe):
    """Sample exactness: when every frame is sampled the span is the whole
    clip, and the row is ffmpeg's own decode of it (AAC with its priming,
    in MP4; stereo kept), sample for sample."""
    import numpy as np
    clip = tmp_path / "aac.mp4"
    make_clip(ffprobe, clip, 2.0, vcodec="mpeg4", acodec="aac",
              extra=("-ac", "2", "-q:v", "2"))
    with loader(probe(tmp_path), frames=50, batch_size=1, audio_rate=24000,
                audio_channels=2) as dl:
        (b,) = list(dl)
    n = int(b["audio_lengths"][0])
    assert n == 2 * 24000
    ref = np.frombuffer(_ffmpeg_f32(ffprobe, clip, 24000, 2),
                        dtype=np.float32).reshape(-1, 2).T
    got = b["audio"][0].numpy()
    assert got.shape == (2, 4 * 24000)
    m = min(n, ref.shape[1])
    assert m >= n - 1
    assert float(np.abs(got[:, :m] - ref[:, :m]).max()) <= 1e-4


def test_a_clip_without_sound(tmp_path, ffprobe):
    """audio_missing="zeros": an empty row, audio_mask False, the other
    samples as ever; "error": a SampleError naming the sample's file."""
    import datahelix
    make_clip(ffprobe, tmp_path / "a.mkv", 1.2)
    subprocess.run([ffmpeg_of(ffprobe), "-v", "error", "-f", "lavfi", "-i",
                    f"color=black:s=64x48:r={FPS}:d=1.2", "-c:v", "ffv1",
                    str(tmp_path / "b_silent.mkv")], check=True, timeout=120)
    table = probe(tmp_path)
    with loader(table) as dl:
        (b,) = list(dl)
    by_path = {dl._index.path(int(i)).rsplit("/", 1)[1]: k
               for k, i in enumerate(b["ids"])}
    silent, sound = by_path["b_silent.mkv"], by_path["a.mkv"]
    assert int(b["audio_lengths"][silent]) == 0
    assert not bool(b["audio_mask"][silent])
    assert float(b["audio"][silent].abs().sum()) == 0
    assert bool(b["audio_mask"][sound])
    assert int(b["audio_lengths"][sound]) > 0
    with loader(table, audio_missing="error") as dl:
        with pytest.raises(datahelix.SampleError,
                           match=r"b_silent\.mkv.*no audio stream"):
            list(dl)


def test_a_row_holds_audio_seconds(tmp_path, ffprobe):
    """A span longer than audio_seconds keeps its first audio_seconds (the
    row's bound), its length says so, and nothing overflows the row."""
    make_clip(ffprobe, tmp_path / "long.mkv", 3.2)
    with loader(probe(tmp_path), batch_size=1, audio_rate=8000,
                audio_seconds=1.0) as dl:
        (b,) = list(dl)
    assert b["audio"].shape == (1, 1, 8000)
    assert int(b["audio_lengths"][0]) == 8000
    row = b["audio"][0][0]
    assert clicks(row, 8000)[0] <= 1  # frame 0's click starts the row


def test_audio_with_collate_fn_gets_each_sample_s_row(tmp_path, ffprobe):
    """collate_fn= sees each sample's own row and length, as the batch
    without it holds them."""
    make_clip(ffprobe, tmp_path / "a.mkv", 1.2)
    make_clip(ffprobe, tmp_path / "b.mkv", 2.0)
    table = probe(tmp_path)
    with loader(table, audio_rate=8000) as dl:
        (plain,) = list(dl)
    want = {int(i): (int(n), plain["audio"][k].clone())
            for k, (i, n) in enumerate(zip(plain["ids"],
                                           plain["audio_lengths"]))}

    def collate(samples):
        return [(s["id"], s["audio"].clone(), s["audio_length"])
                for s in samples]
    with loader(table, audio_rate=8000, collate_fn=collate) as dl:
        (b,) = list(dl)
    assert len(b) == 2
    for i, row, n in b:
        assert n == want[i][0] > 0
        assert row.shape == (1, 4 * 8000)
        assert bool((row == want[i][1]).all())


def test_bad_audio_options_are_refused(tmp_path, ffprobe):
    make_clip(ffprobe, tmp_path / "a.mkv", 1.2)
    table = probe(tmp_path)
    for kw, msg in ((dict(audio_rate=100), "audio_rate"),
                    (dict(audio_channels=3), "audio_channels"),
                    (dict(audio_seconds=0), "audio_seconds"),
                    (dict(audio_seconds=1e6), "audio_seconds"),
                    (dict(audio_missing="drop"), "audio_missing")):
        with pytest.raises(ValueError, match=msg):
            loader(table, **kw)
    with pytest.raises(NotImplementedError, match="packed"):
        loader(table, size=None, frames="fps:2")


def test_decode_command_prints_the_sample_count(tmp_path, ffprobe):
    """`datahelix decode --audio`: the sound of the span the frames cover,
    counted (JSON and text); a clip without sound says so and passes."""
    import json
    clip = tmp_path / "a.mkv"
    make_clip(ffprobe, clip, 2.4)
    subprocess.run([ffmpeg_of(ffprobe), "-v", "error", "-f", "lavfi", "-i",
                    f"color=black:s=64x48:r={FPS}:d=1", "-c:v", "ffv1",
                    str(tmp_path / "silent.mkv")], check=True, timeout=120)
    p = run_dh("decode", "--audio", "--audio-rate", "8000", "--json", "-n",
               "8", clip, tmp_path / "silent.mkv", check=True)
    one, silent, _total = map(json.loads, p.stdout.splitlines())
    idx = one["indices"]
    assert one["audio_stream"] is True
    assert one["audio_samples"] == (idx[-1] + 1 - idx[0]) * 8000 // FPS
    assert abs(one["audio_start_s"] - idx[0] / FPS) < 1e-6
    assert silent["audio_stream"] is False and silent["audio_samples"] == 0
    p = run_dh("decode", "--audio", "-n", "8", clip, check=True)
    n = (idx[-1] + 1 - idx[0]) * 16000 // FPS
    assert f"audio {n} samples x 1 ch at 16000 Hz" in p.stderr
    p = run_dh("decode", "--audio-channels", "3", clip)
    assert p.returncode == 2 and "audio-channels" in p.stderr


def test_a_remote_sidecar_sends_the_sound_too(tmp_path, ffprobe):
    """Round-robin between the rank's own DataServer and a remote sidecar:
    the sidecar's batches carry their rows and lengths (the sound is part
    of the slot's bytes it sends), equal to a run on the local server
    alone."""
    import json
    import socket
    import time
    from conftest import _binary, start_coordinator, stop_process
    for i, secs in enumerate((2.4, 1.6, 3.2, 2.0)):
        make_clip(ffprobe, tmp_path / f"c{i}.mkv", secs)
    table = probe(tmp_path)
    run_dh("index", table, "-o", tmp_path / "t.dhx", check=True)

    def rows(**kw):
        with loader(table, batch_size=1, audio_rate=16000, **kw) as dl:
            return {int(b["ids"][0]): (b["audio"][0].clone(),
                                       int(b["audio_lengths"][0]))
                    for b in dl}
    alone = rows()
    sock = tmp_path / "c.sock"
    procs = [start_coordinator(sock, "--policy", "round-robin")]
    try:
        procs.append(subprocess.Popen(
            [_binary(), "dataserver", "--remote", "--coordinator",
             f"ipc://{sock}", "--index", tmp_path / "t.dhx", "--server-id",
             "77"], stderr=subprocess.DEVNULL))
        remote, trace = [], tmp_path / "trace.json"
        deadline = time.monotonic() + 60
        while not remote and time.monotonic() < deadline:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            got = rows(coordinator=f"ipc://{sock}", trace=str(trace),
                       listen=f"tcp://127.0.0.1:{port}", prefetch=1)
            assert sorted(got) == sorted(alone)
            for i, (row, n) in got.items():
                assert n == alone[i][1] > 0
                assert bool((row == alone[i][0]).all()), i
            ev = json.loads(trace.read_text())["traceEvents"]
            remote = [e for e in ev if e["pid"] == 100077]
    finally:
        for x in reversed(procs):
            stop_process(x)
    assert remote, "the sidecar took no task"


def test_packed_layout_with_cu_seqlens(tmp_path, ffprobe):
    """audio_layout="packed": the rows' valid samples end on end, [C,
    total], cut by audio_cu_seqlens (also given with the padded layout)."""
    import torch
    for i, secs in enumerate((2.4, 1.6, 3.2)):
        make_clip(ffprobe, tmp_path / f"c{i}.mkv", secs)
    table = probe(tmp_path)
    with loader(table, batch_size=3, audio_rate=8000) as dl:
        (padded,) = list(dl)
    with loader(table, batch_size=3, audio_rate=8000,
                audio_layout="packed") as dl:
        (packed,) = list(dl)
    n = padded["audio_lengths"]
    cu = padded["audio_cu_seqlens"]
    assert cu.dtype == torch.int32 and cu.tolist()[0] == 0
    assert torch.equal(cu, packed["audio_cu_seqlens"])
    assert packed["audio"].shape == (1, int(n.sum()))
    for k in range(3):
        a, b = int(cu[k]), int(cu[k + 1])
        assert b - a == int(n[k]) > 0
        assert torch.equal(packed["audio"][:, a:b],
                           padded["audio"][k, :, :int(n[k])])
    with pytest.raises(ValueError, match="audio_layout"):
        loader(table, audio_layout="ragged")


def test_the_trace_has_an_audio_stage(tmp_path, ffprobe):
    """Each sample's sound is a span of its own in the trace ("audio", after
    its read, decode and scale), and counts in sample_ms; a loader without
    sound draws none."""
    import json
    for i, secs in enumerate((2.4, 1.6)):
        make_clip(ffprobe, tmp_path / f"c{i}.mkv", secs)
    table = probe(tmp_path)
    for sound in (True, False):
        trace = tmp_path / f"t{sound}.json"
        with loader(table, audio=sound, trace=str(trace)) as dl:
            (b,) = list(dl)
            ms = b["sample_ms"]
        ev = [e for e in json.loads(trace.read_text())["traceEvents"]
              if e.get("ph") == "X"]
        audio = [e for e in ev if e["name"].startswith("audio ")]
        decode = [e for e in ev if e["name"].startswith("decode ")]
        if not sound:
            assert audio == [] and len(decode) == 2
            continue
        assert sorted(e["args"]["sample"] for e in audio) == \
            sorted(b["ids"].tolist())
        assert all(e["dur"] > 0 for e in audio)
        for k, i in enumerate(b["ids"].tolist()):
            mine = [e for e in ev if e.get("args", {}).get("sample") == i]
            total = sum(e["dur"] for e in mine) / 1e3  # us -> ms
            assert abs(total - float(ms[k])) <= 0.05 * total + 0.05
