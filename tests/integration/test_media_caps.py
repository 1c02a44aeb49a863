"""Caps on what one sample may cost (issue "Real-world media", item 5).

A plan whose output (frames x width x height) is over the per-sample pixel
cap is one clear error line before anything is decoded or allocated, so a
mistyped `--size` cannot grow a worker to 12 GB; a header that claims a
picture size FFmpeg cannot decode is refused at probe time, not planned as
millions of tokens.
"""
import json
import subprocess
import sys

import pytest

from conftest import run_dh

CAP = 1 << 28  # DH_MEDIA_MAX_PIXELS


def ffmpeg(*args):
    subprocess.run(["ffmpeg", "-v", "error", "-y", *map(str, args)],
                   check=True, timeout=120)


@pytest.fixture(scope="module")
def long_clip(tmp_path_factory):
    """600 tiny frames: `--plan all` at 1024x1024 is 629 M pixels."""
    out = tmp_path_factory.mktemp("caps") / "long.mp4"
    ffmpeg("-f", "lavfi", "-i", "testsrc2=size=32x32:rate=50:duration=12",
           "-c:v", "libx264", "-g", "50", out)
    return out


def peak_rss_of(cmd, timeout=120):
    """Runs cmd in a child Python that reports the grandchild's peak RSS
    (ru_maxrss of its children only, so this process's own size is out)."""
    probe = ("import resource,subprocess,sys,json;"
             "p=subprocess.run(sys.argv[1:],capture_output=True,text=True);"
             "r=resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss;"
             "print(json.dumps([p.returncode,p.stderr,r]))")
    out = subprocess.run([sys.executable, "-c", probe, *map(str, cmd)],
                         capture_output=True, text=True, timeout=timeout,
                         check=True).stdout
    rc, err, kib = json.loads(out)
    return rc, err, kib * 1024


def test_plan_all_over_the_cap_is_one_line_and_rss_stays_small(dh_bin,
                                                                 long_clip):
    rc, err, rss = peak_rss_of([dh_bin, "decode", "--plan", "all", "--size",
                                "1024x1024", long_clip])
    assert rc == 1
    lines = err.strip().splitlines()
    assert len(lines) == 2, err  # the file's error, then the closing line
    assert str(long_clip) in lines[0] and "over the cap" in lines[0]
    assert "600 frames of 1024x1024" in lines[0]
    assert rss < 200 << 20, f"peak RSS {rss >> 20} MiB"


def test_fixed_plan_over_the_cap_is_a_usage_error(dh_bin, long_clip):
    rc, err, rss = peak_rss_of([dh_bin, "decode", "--frames", "4096",
                                "--size", "16384x16384", long_clip])
    assert rc == 2
    assert "4096 frames of 16384x16384" in err and "over the cap" in err
    assert len(err.strip().splitlines()) == 1
    assert rss < 100 << 20


def test_max_pixels_moves_the_cap(tmp_path, long_clip):
    small = run_dh("decode", "--frames", "16", "--size", "64x64",
                   "--max-pixels", 16 * 64 * 64 - 1, long_clip)
    assert small.returncode == 2 and "over the cap of 65535" in small.stderr
    ok = run_dh("decode", "--frames", "16", "--size", "64x64",
                "--max-pixels", 16 * 64 * 64, long_clip)
    assert ok.returncode == 0, ok.stderr
    # --plan all: the count is the clip's, so the cap is checked when the
    # file is open; exactly at the cap it decodes, one pixel under it not.
    raised = run_dh("decode", "--plan", "all", "--size", "32x32",
                    "--max-pixels", 600 * 32 * 32, long_clip)
    assert raised.returncode == 0, raised.stderr
    lowered = run_dh("decode", "--plan", "all", "--size", "32x32",
                     "--max-pixels", 600 * 32 * 32 - 1, long_clip)
    assert lowered.returncode == 1 and "over the cap" in lowered.stderr
    bad = run_dh("decode", "--max-pixels", "0", long_clip)
    assert bad.returncode == 2 and "--max-pixels" in bad.stderr


def claimed_size_clip(tmp_path, w, h):
    """A valid MP4 whose sample description claims w x h pictures."""
    src = tmp_path / "src.mp4"
    ffmpeg("-f", "lavfi", "-i", "testsrc2=size=160x120:rate=25:duration=1",
           "-c:v", "libx264", src)
    b = bytearray(src.read_bytes())
    entry = b.find(b"avc1", b.find(b"stsd"))
    assert entry > 0
    # size(4) type(4) | reserved(6) dref(2) predefined(2) reserved(2)
    # predefined(12) | width(2) height(2)
    at = entry + 4 + 6 + 2 + 2 + 2 + 12
    b[at:at + 4] = w.to_bytes(2, "big") + h.to_bytes(2, "big")
    out = tmp_path / f"claims_{w}x{h}.mp4"
    out.write_bytes(b)
    return out


def test_claimed_size_beyond_ffmpeg_is_refused_at_probe(tmp_path):
    bad = claimed_size_clip(tmp_path, 65535, 65535)
    table = tmp_path / "m.jsonl"
    p = run_dh("probe", "--out", table, bad)
    assert p.returncode == 1
    assert f"{bad}: the header claims 65535x65535 pictures, beyond what " \
           "FFmpeg decodes" in p.stderr
    d = run_dh("decode", bad)
    assert d.returncode == 1 and "beyond what FFmpeg decodes" in d.stderr


def test_claimed_size_within_limits_is_probed_as_claimed(tmp_path):
    """The same edit to a size FFmpeg accepts is only a (wrong) header: the
    probe reports it, and the estimate stays within the pixel cap."""
    odd = claimed_size_clip(tmp_path, 16000, 16000)
    table = tmp_path / "m.jsonl"
    run_dh("probe", "--out", table, odd, check=True)
    row = [json.loads(x) for x in table.read_text().splitlines()][1]
    assert (row["width"], row["height"]) == (16000, 16000)
    assert row["est_out_bytes"] <= 3 * CAP
