"""The probe's cheap completeness checks never reject a valid file and still
catch a cut-off one (issue "Real-world media", item 2).

Header durations are off from the packets by up to two frames in valid
files (FLV counts one past the last packet); an audio track seconds longer
than the video makes the container's duration not the video's.  A file cut
in half stops every stream short, which is what gives it away.
"""
import json
import subprocess

import pytest

from conftest import run_dh


def ffmpeg(*args):
    subprocess.run(["ffmpeg", "-nostdin", "-v", "error", "-y",
                    *map(str, args)], check=True, timeout=120)


def rows(path):
    return [r for r in map(json.loads, path.read_text().splitlines())
            if "path" in r]


VIDEO = ["-f", "lavfi", "-i", "testsrc2=size=160x120:rate=25:duration=2"]
AUDIO = ["-f", "lavfi", "-i", "sine=frequency=440:duration=6"]


@pytest.mark.parametrize("ext,extra", [
    ("flv", []),
    ("ts", ["-f", "mpegts"]),
    ("mkv", []),
])
def test_audio_longer_than_video_is_valid(tmp_path, ext, extra):
    f = tmp_path / f"long_audio.{ext}"
    ffmpeg(*VIDEO, *AUDIO, "-map", "0:v", "-map", "1:a", "-c:v", "libx264",
           "-c:a", "aac", *extra, f)
    out = tmp_path / "m.jsonl"
    p = run_dh("probe", "--out", out, f)
    assert p.returncode == 0, p.stderr
    (r,) = rows(out)
    assert r["frames"] == 50
    # The video's 2 s, not the 6 s audio track's.
    assert r["duration_s"] == pytest.approx(2.0, abs=0.1)


def test_flv_header_a_frame_past_the_packets_is_valid(tmp_path):
    f = tmp_path / "v.flv"
    ffmpeg(*VIDEO, "-c:v", "libx264", "-bf", "2", f)
    out = tmp_path / "m.jsonl"
    run_dh("probe", "--out", out, f, check=True)
    assert rows(out)[0]["frames"] == 50
    d = run_dh("decode", "--plan", "all", "--size", "32x32", f)
    assert d.returncode == 0, d.stderr


def test_cut_file_with_audio_is_still_caught(tmp_path):
    whole = tmp_path / "whole.mkv"
    ffmpeg("-f", "lavfi", "-i", "testsrc2=size=160x120:rate=25:duration=6",
           *AUDIO, "-map", "0:v", "-map", "1:a", "-c:v", "libx264", "-c:a",
           "aac", whole)
    cut = tmp_path / "cut.mkv"
    cut.write_bytes(whole.read_bytes()[:whole.stat().st_size // 2])
    out = tmp_path / "m.jsonl"
    p = run_dh("probe", "--out", out, cut, whole)
    assert p.returncode == 0
    assert f"{cut}: truncated or damaged: its packets end at" in p.stderr
    assert [r["path"] for r in rows(out)] == [str(whole)]


def test_files_nothing_can_check_are_called_unchecked(tmp_path):
    """An elementary stream has no index, no duration, no frame count: the
    probe keeps it and says it could not be checked, rather than calling it
    damaged or staying silent; a file with a duration is not counted."""
    raw = tmp_path / "v.h264"
    ffmpeg(*VIDEO, "-c:v", "libx264", raw)
    mp4 = tmp_path / "v.mp4"
    ffmpeg(*VIDEO, "-c:v", "libx264", mp4)
    out = tmp_path / "m.jsonl"
    p = run_dh("probe", "--out", out, raw, mp4, check=True)
    assert len(rows(out)) == 2
    assert ", 1 unchecked for truncation (" in p.stderr, p.stderr
    p = run_dh("probe", "--out", out, mp4, check=True)
    assert "unchecked" not in p.stderr
