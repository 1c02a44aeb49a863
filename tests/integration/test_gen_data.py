"""`datahelix gen-data`: real, decodable, deterministic synthetic video sets.

Uses the session's `gen_set` (6 mixed files, seed 7, with captions) for the
media checks; the other runs are tiny S-only sets so the file stays fast.
"""
import json
import pathlib
import shutil
import subprocess

import pytest

from conftest import run_dh

PROFILES = {"S": (400, 224, 2.0), "M": (600, 336, 4.0), "L": (800, 448, 8.0),
            "XL": (1280, 720, 8.0)}


def videos(d):
    return sorted(pathlib.Path(d).glob("*.mp4"))


def one_error_line(p):
    lines = p.stderr.splitlines()
    assert len(lines) == 1, p.stderr
    assert lines[0].startswith("datahelix: gen-data: "), p.stderr


def ffprobe_json(ffprobe, f):
    p = subprocess.run(
        [ffprobe, "-v", "error", "-select_streams", "v:0", "-show_entries",
         "stream=codec_name,width,height,nb_frames:format=duration",
         "-of", "json", str(f)],
        capture_output=True, text=True, timeout=60, check=True)
    return json.loads(p.stdout)


def gray_frame(f, index, w, h):
    """Decodes frame `index` of f as 8-bit gray bytes."""
    ffmpeg = shutil.which("ffmpeg")
    p = subprocess.run(
        [ffmpeg, "-v", "error", "-i", str(f), "-vf",
         f"select=eq(n\\,{index})", "-frames:v", "1", "-f", "rawvideo",
         "-pix_fmt", "gray", "-"],
        capture_output=True, timeout=60, check=True)
    assert len(p.stdout) == w * h
    return p.stdout


def test_help_exits_zero(dh_bin):
    p = run_dh("gen-data", "--help")
    assert p.returncode == 0
    assert "usage: datahelix gen-data" in p.stdout
    assert p.stderr == ""


@pytest.mark.parametrize("args", [
    [],
    ["--profiles", "S"],
    ["--out", "{d}", "--profiles", "Q"],
    ["--out", "{d}", "--profiles", "S,,M"],
    ["--out", "{d}", "--count", "0"],
    ["--out", "{d}", "--count", "abc"],
    ["--out", "{d}", "--count", "100001"],
    ["--out", "{d}", "--seed", "-1"],
    ["--out", "{d}", "--bogus"],
    ["--out", "{d}", "extra"],
    ["--out"],
])
def test_bad_arguments_one_line_exit_2(dh_bin, tmp_path, args):
    d = tmp_path / "out"
    p = run_dh("gen-data", *[a.format(d=d) for a in args])
    assert p.returncode == 2, p.stderr
    one_error_line(p)
    assert not d.exists()  # usage errors never touch the disk


def test_unwritable_dir_is_runtime_error(dh_bin, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    p = run_dh("gen-data", "--out", blocker / "sub", "--count", 1,
               "--profiles", "S")
    assert p.returncode == 1
    one_error_line(p)


def test_same_seed_gives_identical_bytes(dh_bin, gen_set, tmp_path):
    # Same options as the gen_set fixture; covers S->M->L transitions.
    again = tmp_path / "again"
    p = run_dh("gen-data", "--out", again, "--profiles", "mixed", "--count",
               6, "--seed", 7, "--captions", check=True, timeout=300)
    assert "6 files" in p.stderr
    names = [f.name for f in videos(gen_set)]
    assert names == [f.name for f in videos(again)]
    for n in names + ["captions.jsonl"]:
        assert (gen_set / n).read_bytes() == (again / n).read_bytes(), n


def test_different_seed_gives_different_bytes(dh_bin, tmp_path):
    for s in (1, 2):
        run_dh("gen-data", "--out", tmp_path / str(s), "--count", 1,
               "--profiles", "S", "--seed", s, check=True)
    a = (tmp_path / "1" / "000000_S.mp4").read_bytes()
    b = (tmp_path / "2" / "000000_S.mp4").read_bytes()
    assert a != b


def test_names_cycle_and_dir_reused(dh_bin, tmp_path):
    out = tmp_path / "a" / "b"
    out.mkdir(parents=True)
    (out / "000001_M.mp4").write_text("stale")
    p = run_dh("gen-data", "--out", out, "--count", 3, "--profiles", "S,m",
               check=True)
    assert [f.name for f in videos(out)] == \
        ["000000_S.mp4", "000001_M.mp4", "000002_S.mp4"]
    assert (out / "000001_M.mp4").stat().st_size > 1000
    assert not [f for f in out.iterdir() if f.name.startswith(".")]
    summary = p.stderr.splitlines()
    assert len(summary) == 1 and "3 files" in summary[0]


def test_every_file_decodes_with_expected_stream(gen_set, ffprobe):
    ffmpeg = shutil.which("ffmpeg")
    files = videos(gen_set)
    assert [f.stem.split("_")[1] for f in files] == list("SMLSML")
    for f in files:
        p = subprocess.run([ffmpeg, "-v", "error", "-i", str(f), "-f", "null",
                            "-"], capture_output=True, text=True, timeout=120)
        assert p.returncode == 0 and p.stderr == "", (f, p.stderr)
        info = ffprobe_json(ffprobe, f)
        w, h, secs = PROFILES[f.stem.split("_")[1]]
        st = info["streams"][0]
        assert (st["codec_name"], st["width"], st["height"]) == ("h264", w, h)
        dur = float(info["format"]["duration"])
        assert 0.8 * secs - 0.05 <= dur <= 1.2 * secs + 0.05, (f, dur)
        assert abs(int(st["nb_frames"]) - dur * 25) <= 1


def test_content_moves(gen_set):
    f = gen_set / "000000_S.mp4"
    a = gray_frame(f, 0, 400, 224)
    b = gray_frame(f, 30, 400, 224)
    changed = sum(1 for x, y in zip(a, b) if abs(x - y) > 8)
    assert changed > 0.3 * len(a)


def test_captions_parse_and_point_at_files(gen_set):
    lines = (gen_set / "captions.jsonl").read_text().splitlines()
    assert len(lines) == len(videos(gen_set))
    lengths = set()
    for line in lines:
        obj = json.loads(line)
        assert set(obj) == {"path", "text"}
        assert (gen_set / obj["path"]).is_file()
        words = obj["text"].split()
        assert 5 <= len(words) <= 120
        lengths.add(len(words))
    assert len(lengths) > 1
    assert not [f for f in gen_set.iterdir() if f.name.startswith(".")]


def test_progress_is_a_plain_line_off_a_terminal(tmp_path):
    """stderr a pipe (a cluster log): no bar, but a progress line every
    DATAHELIX_PROGRESS_S seconds, with the facts the bar has; 0: none."""
    import os
    env = dict(os.environ, DATAHELIX_PROGRESS_S="0.001")
    p = run_dh("gen-data", "--out", tmp_path / "a", "--profiles", "S",
               "--count", 3, "--seed", 2, check=True, env=env)
    lines = [x for x in p.stderr.splitlines() if "%)" in x]
    assert lines, p.stderr
    assert "\r" not in p.stderr and "\033[" not in p.stderr
    assert lines[0].startswith("gen-data: 1/3 (33%)"), lines
    assert "/s, ETA" in lines[0]
    env["DATAHELIX_PROGRESS_S"] = "0"
    q = run_dh("gen-data", "--out", tmp_path / "b", "--profiles", "S",
               "--count", 3, "--seed", 2, check=True, env=env)
    assert not [x for x in q.stderr.splitlines() if "%)" in x], q.stderr
