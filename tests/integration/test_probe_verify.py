"""`datahelix probe --verify`: every video and image decoded in full, the
files that fail left out with their reason, the header says so; verdicts
cached beside the table so that a re-run (also after kill -9) decodes only
what it has not seen or what changed."""
import json
import os
import re
import shutil
import signal
import subprocess
import time

import pytest

from conftest import SHARED_DATA, _binary, run_dh
from test_probe import read_table

CORRUPT = SHARED_DATA / "videos" / "decord__corrupted.mp4"
IMAGE = SHARED_DATA / "images" / "mmaction2__img_00001.jpg"


@pytest.fixture
def folder(tmp_path, gen_set):
    """The six generated clips, the shared clip of which 49 of 50 frames
    decode, an image and a text file."""
    if not CORRUPT.exists() or not IMAGE.exists():
        pytest.skip("shared/data clips missing")
    d = tmp_path / "in"
    d.mkdir()
    for f in sorted(gen_set.glob("*.mp4")):
        shutil.copy(f, d / f.name)
    shutil.copy(CORRUPT, d / "corrupted.mp4")
    shutil.copy(IMAGE, d / "frame.jpg")
    (d / "note.txt").write_text("a caption that is its own sample\n")
    return d


def cache_lines(out):
    p = out.with_name(out.name + ".verify.jsonl")
    return [json.loads(x) for x in p.read_text().splitlines()] \
        if p.exists() else []


def closing(stderr):
    m = re.search(r"^probe: verified (\d+) files?, (\d+) left out, (\d+) "
                  r"reused from the cache(?:; decoded (\d+) in .* files/s, "
                  r".* s of media = .*x real time)?$", stderr, re.M)
    assert m, stderr
    return tuple(int(x or 0) for x in m.groups())  # files, out, cached, dec


def test_corrupt_clip_left_out_only_with_verify(tmp_path, folder):
    bad = folder / "corrupted.mp4"
    plain = tmp_path / "plain.jsonl"
    run_dh("probe", "--out", plain, folder, check=True)
    header, rows = read_table(plain)
    assert "verified" not in header
    assert str(bad) in [r["path"] for r in rows]  # it probes fine
    assert not cache_lines(plain)

    out = tmp_path / "m.jsonl"
    p = run_dh("probe", "--verify", "--out", out, folder, check=True)
    header, rows = read_table(out)
    assert [r["path"] for r in rows] == [r["path"] for r in
                                         read_table(plain)[1]
                                         if r["path"] != str(bad)]
    assert [r["id"] for r in rows] == list(range(len(rows)))
    assert header["verified"] is True
    assert header["verify"] == {"files": 8, "left_out": 1}  # 7 videos, 1 jpg
    errs = [x for x in p.stderr.splitlines() if x.startswith("datahelix:")]
    assert len(errs) == 1 and errs[0].startswith(
        f"datahelix: probe: {bad}: frame "), p.stderr
    assert closing(p.stderr) == (8, 1, 0, 8)
    assert "8 probed, 0 failed, 1 left out by --verify" in p.stderr
    lines = {x["path"]: x for x in cache_lines(out)}
    assert len(lines) == 8 and str(folder / "note.txt") not in lines
    assert lines[str(bad)]["ok"] is False
    assert errs[0].endswith(lines[str(bad)]["reason"])
    good = lines[str(folder / "frame.jpg")]
    assert good["ok"] is True and good["frames"] == 1
    clip = next(r for r in rows if r["kind"] == "video")
    assert lines[clip["path"]]["frames"] == clip["frames"]


def test_rerun_reuses_the_cache_and_rechecks_changed_files(tmp_path, folder):
    out = tmp_path / "m.jsonl"
    run_dh("probe", "--verify", "--out", out, folder, check=True)
    table, cache = out.read_bytes(), cache_lines(out)

    p = run_dh("probe", "--verify", "--out", out, folder, check=True)
    assert closing(p.stderr) == (8, 1, 8, 0)
    assert "decoded" not in p.stderr
    assert f"datahelix: probe: {folder / 'corrupted.mp4'}: frame" in p.stderr
    assert out.read_bytes() == table and cache_lines(out) == cache

    # A good clip overwritten by the damaged one after the cache said ok:
    # its size and mtime differ, so it is decoded again and left out.
    victim = folder / "000000_S.mp4"
    shutil.copy(CORRUPT, victim)
    p = run_dh("probe", "--verify", "--out", out, folder, check=True)
    assert closing(p.stderr) == (8, 2, 7, 1)
    assert f"datahelix: probe: {victim}: frame" in p.stderr
    _, rows = read_table(out)
    assert str(victim) not in [r["path"] for r in rows]
    lines = cache_lines(out)
    assert len(lines) == 8  # the stale line was dropped
    entry = next(x for x in lines if x["path"] == str(victim))
    assert entry["ok"] is False and entry["size"] == CORRUPT.stat().st_size


def test_kill9_resumes_where_it_was(tmp_path, folder):
    """Killed mid-pass, the same command decodes only the files without a
    verdict, and writes the table an uninterrupted run writes."""
    for k in range(4):  # enough files that one thread is still busy
        for f in sorted(folder.glob("0*.mp4")):
            shutil.copy(f, folder / f"copy{k}_{f.name}")
    total = len(list(folder.glob("*.mp4"))) + 1  # + the jpg
    ref = tmp_path / "ref" / "m.jsonl"
    ref.parent.mkdir()
    run_dh("probe", "--verify", "--jobs", 2, "--out", ref, folder, check=True)

    out = tmp_path / "m.jsonl"
    proc = subprocess.Popen([_binary(), "probe", "--verify", "--jobs", "1",
                             "--out", str(out), str(folder)],
                            stderr=subprocess.DEVNULL)
    cache = out.with_name(out.name + ".verify.jsonl")
    end = time.monotonic() + 60
    while time.monotonic() < end and proc.poll() is None:
        if cache.exists() and cache.read_text().count("\n") >= 2:
            break
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    with open(cache, "a") as f:  # as if killed inside a write
        f.write('{"v":1,"path":"/tor')
    seen = len({x["path"] for x in map(json.loads,
                                       cache.read_text().splitlines()[:-1])})
    assert seen >= 2

    p = run_dh("probe", "--verify", "--out", out, folder, check=True)
    files, left, cached, decoded = closing(p.stderr)
    assert (files, left) == (total, 1)
    assert cached == min(seen, total) and decoded == total - cached
    assert read_table(out) == read_table(ref)
    assert len(cache_lines(out)) == total  # torn line gone


def test_progress_lines_when_stderr_is_not_a_terminal(tmp_path, folder):
    out = tmp_path / "m.jsonl"
    env = dict(os.environ, DATAHELIX_PROGRESS_S="0.01")
    p = run_dh("probe", "--verify", "--jobs", 1, "--out", out, folder,
               env=env, check=True)
    prog = [x for x in p.stderr.splitlines() if x.startswith("verify: ")]
    assert prog, p.stderr
    assert all(re.match(r"verify: \d+/8 \(\d+%\), [\d.]+/s, ETA \d+ s"
                        r"(, 1 failed)?, [\d.]+x real time$", x)
               for x in prog), prog
    out.with_name("m.jsonl.verify.jsonl").unlink()
    q = run_dh("probe", "--verify", "--quiet", "--jobs", 1, "--out", out,
               folder, env=env, check=True)
    assert q.stderr.splitlines() == [
        x for x in p.stderr.splitlines() if x.startswith("datahelix:")]


def test_fail_fast_stdout_and_help(tmp_path, folder):
    p = run_dh("probe", "--verify", "--fail-fast", "--out",
               tmp_path / "m.jsonl", folder)
    assert p.returncode == 1 and "no table written" in p.stderr
    assert not (tmp_path / "m.jsonl").exists()
    (tmp_path / "m.jsonl.verify.jsonl").unlink()  # what it had verified
    p = run_dh("probe", "--verify", "--quiet", "--out", "-", folder,
               check=True)  # no cache without a file to put it beside
    lines = p.stdout.splitlines()
    assert json.loads(lines[0])["datahelix_header"]["verify"]["left_out"] == 1
    assert len(lines) == 1 + 8  # 6 clips, the jpg, the text
    assert not list(tmp_path.glob("*.verify.jsonl"))
    h = run_dh("probe", "--help", check=True).stdout
    assert "--verify" in h and "OUT.verify.jsonl" in h


def ffmpeg(*args):
    subprocess.run(["ffmpeg", "-nostdin", "-v", "error", "-y",
                    *map(str, args)], check=True, timeout=120)


def test_flv_accepted_cut_ts_and_cut_jpeg_caught_by_verify(tmp_path):
    """A valid FLV (its header counts one frame past the last packet) passes
    the cheap checks and --verify; a TS cut at a 188-byte packet boundary
    inside its last picture, and a JPEG cut in half, pass the cheap checks
    (nothing in their headers can tell) and are left out by --verify."""
    d = tmp_path / "in"
    d.mkdir()
    src = ["-f", "lavfi", "-i", "testsrc2=size=320x240:rate=25:duration=2"]
    ffmpeg(*src, "-c:v", "libx264", "-g", "12", "-bf", "2", d / "ok.flv")
    ffmpeg(*src, "-c:v", "libx264", "-g", "12", "-bf", "2", tmp_path / "a.ts")
    whole = (tmp_path / "a.ts").read_bytes()
    (d / "cut.ts").write_bytes(whole[:len(whole) // 188 * 188 - 4 * 188])
    ffmpeg(*src[:4], "-frames:v", "1", tmp_path / "a.jpg")
    jpg = (tmp_path / "a.jpg").read_bytes()
    (d / "cut.jpg").write_bytes(jpg[:len(jpg) // 2])
    plain = tmp_path / "plain.jsonl"
    p = run_dh("probe", "--out", plain, d, check=True)
    _, rows = read_table(plain)
    assert sorted(os.path.basename(r["path"]) for r in rows) == \
        ["cut.jpg", "cut.ts", "ok.flv"], p.stderr
    out = tmp_path / "v.jsonl"
    p = run_dh("probe", "--verify", "--out", out, d)
    assert p.returncode == 0, p.stderr
    header, rows = read_table(out)
    assert [os.path.basename(r["path"]) for r in rows] == ["ok.flv"]
    assert header["verified"] is True
    for name in ("cut.ts", "cut.jpg"):
        line = next(ln for ln in p.stderr.splitlines()
                    if f"{d / name}:" in ln)
        assert line.startswith("datahelix: probe: ") and "frame" in line
    assert closing(p.stderr)[:2] == (3, 2)
