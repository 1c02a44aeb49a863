"""`datahelix probe`: descriptors agree with ffprobe, bad files are reported
and left out, the table is well formed (DESIGN 4.1, 4.2)."""
import json
import os
import random
import shutil
import subprocess

import pytest

from conftest import SHARED_DATA, run_dh


def read_table(path):
    header, rows = None, []
    with open(path) as f:
        for line in f:
            o = json.loads(line)
            if "datahelix_header" in o:
                assert header is None and not rows, "header must come first"
                header = o["datahelix_header"]
            else:
                rows.append(o)
    return header, rows


def ffprobe_facts(ffprobe, path):
    out = subprocess.run(
        [ffprobe, "-v", "error", "-select_streams", "v:0", "-count_packets",
         "-show_entries", "stream=codec_name,width,height,duration,"
         "nb_read_packets:format=duration", "-of", "json", str(path)],
        capture_output=True, text=True, timeout=60, check=True)
    j = json.loads(out.stdout)
    st = j["streams"][0]
    dur = st.get("duration") or j["format"].get("duration")
    return {"codec": st["codec_name"], "width": st["width"],
            "height": st["height"], "frames": int(st["nb_read_packets"]),
            "duration_s": float(dur) if dur not in (None, "N/A") else 0.0}


def probe(tmp_path, *inputs, extra=(), check=True, binary=None):
    out = tmp_path / "m.jsonl"
    p = run_dh("probe", "--out", out, *extra, *inputs, check=check,
               binary=binary)
    return p, out


def assert_matches_ffprobe(ffprobe, row):
    want = ffprobe_facts(ffprobe, row["path"])
    for k in ("codec", "width", "height", "frames"):
        assert row[k] == want[k], f"{row['path']}: {k} {row[k]} != {want[k]}"
    if want["duration_s"] > 0:
        assert row["duration_s"] == pytest.approx(want["duration_s"],
                                                  abs=2e-3), row["path"]
    else:  # no duration in the header: where the packets end
        assert row["duration_s"] == pytest.approx(
            row["frames"] / row["fps"], abs=1.5 / row["fps"]), row["path"]


def test_gen_set_agrees_with_ffprobe(tmp_path, gen_set, ffprobe):
    p, out = probe(tmp_path, gen_set)
    header, rows = read_table(out)
    files = sorted(f for f in os.listdir(gen_set) if f.endswith(".mp4"))
    assert [os.path.basename(r["path"]) for r in rows] == files
    assert [r["id"] for r in rows] == list(range(len(files)))
    for r in rows:
        assert r["kind"] == "video"
        assert_matches_ffprobe(ffprobe, r)
        assert r["bytes"] == os.path.getsize(r["path"])
        assert r["est_cpu_ms"] > 0 and r["est_tokens"] > 0
        assert r["est_out_bytes"] > 0
    # The default plan (8 fps, native size) gives the paper's profiles.
    by_kind = {os.path.basename(r["path"])[7]: r["profile"] for r in rows}
    assert by_kind == {"S": "16x224", "M": "32x336", "L": "64x448"}
    assert header["plan"] == {"frames": "fps:8", "max_frames": 256,
                              "size": "native", "max_side": 0}
    assert header["tokens"] == "qwen-vl"
    assert "6 probed, 0 failed" in p.stderr


def test_real_clips_agree_with_ffprobe(tmp_path, shared_videos, ffprobe):
    p, out = probe(tmp_path, shared_videos)
    _, rows = read_table(out)
    media = [f for f in shared_videos.rglob("*") if f.is_file()
             and f.suffix.lower() in (".mp4", ".mkv", ".webm", ".mov", ".avi")]
    assert len(rows) == len(media), p.stderr
    assert "datahelix:" not in p.stderr
    for r in rows:
        assert_matches_ffprobe(ffprobe, r)
    rot = {os.path.basename(r["path"]): r.get("rotation", 0) for r in rows}
    assert rot["decord__video_0.mov"] == 0
    assert {rot["decord__video_90.mov"], rot["decord__video_180.mov"],
            rot["decord__video_270.mov"]} == {90, 180, 270}


def test_images_and_text(tmp_path):
    images = SHARED_DATA / "images"
    if not images.is_dir():
        pytest.skip("shared/data/images missing")
    txt = tmp_path / "doc.txt"
    txt.write_text("hello world " * 10)
    _, out = probe(tmp_path, images, txt)
    _, rows = read_table(out)
    kinds = {os.path.basename(r["path"]): r for r in rows}
    jpg = kinds["mmaction2__img_00001.jpg"]
    assert jpg["kind"] == "image" and jpg["frames"] == 1
    assert jpg["width"] > 0 and jpg["profile"].startswith("1x")
    assert kinds["doc.txt"]["kind"] == "text"
    assert kinds["doc.txt"]["est_tokens"] == 30  # 120 bytes / 4


def test_caption_list_input(tmp_path, gen_set):
    _, out = probe(tmp_path, gen_set / "captions.jsonl")
    _, rows = read_table(out)
    src = [json.loads(l) for l in open(gen_set / "captions.jsonl")]
    assert [r["text"] for r in rows] == [s["text"] for s in src]
    assert all(os.path.isabs(r["path"]) or os.path.exists(r["path"])
               for r in rows)
    # Caption tokens are counted on top of the visual tokens.
    _, out2 = probe(tmp_path, gen_set)
    _, plain = read_table(out2)
    for with_text, without in zip(rows, plain):
        extra = -(-len(with_text["text"].encode()) // 4)
        assert with_text["est_tokens"] == without["est_tokens"] + extra


def make_bad_files(d, good):
    d.mkdir()
    data = open(good, "rb").read()
    (d / "a_truncated.mp4").write_bytes(data[: len(data) // 3])
    rnd = random.Random(5)
    (d / "b_garbage.mp4").write_bytes(bytes(rnd.getrandbits(8)
                                            for _ in range(5000)))
    (d / "c_empty.mp4").write_bytes(b"")
    (d / "d_text_as_video.mkv").write_text("not a video at all\n" * 50)
    shutil.copy(good, d / "e_good.mp4")


@pytest.mark.parametrize("which", ["release", "asan"])
def test_bad_files_reported_and_left_out(tmp_path, gen_set, which):
    binary = None
    if which == "asan":
        binary = os.environ.get("DATAHELIX_ASAN_BIN")
        if not binary or not os.access(binary, os.X_OK):
            pytest.skip("ASan binary not built (make test builds it)")
    good = sorted(gen_set.glob("*_S.mp4"))[0]
    make_bad_files(tmp_path / "in", good)
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=1")
    p = run_dh("probe", "--out", tmp_path / "m.jsonl", tmp_path / "in",
               binary=binary, env=env)
    assert p.returncode == 0, p.stderr
    _, rows = read_table(tmp_path / "m.jsonl")
    assert [os.path.basename(r["path"]) for r in rows] == ["e_good.mp4"]
    assert rows[0]["id"] == 0
    errs = [l for l in p.stderr.splitlines() if l.startswith("datahelix:")]
    assert len(errs) == 4, p.stderr
    for name in ("a_truncated", "b_garbage", "c_empty", "d_text_as_video"):
        assert any(name in l for l in errs), (name, p.stderr)
    assert "1 probed, 4 failed" in p.stderr
    assert "AddressSanitizer" not in p.stderr and "runtime error" not in p.stderr


def test_all_bad_or_fail_fast_exits_1(tmp_path, gen_set):
    good = sorted(gen_set.glob("*_S.mp4"))[0]
    make_bad_files(tmp_path / "in", good)
    (tmp_path / "in" / "e_good.mp4").unlink()
    p = run_dh("probe", "--out", tmp_path / "m.jsonl", tmp_path / "in")
    assert p.returncode == 1
    assert "no table written" in p.stderr
    assert not (tmp_path / "m.jsonl").exists()
    shutil.copy(good, tmp_path / "in" / "e_good.mp4")
    p = run_dh("probe", "--fail-fast", "--jobs", "1", "--out",
               tmp_path / "m.jsonl", tmp_path / "in")
    assert p.returncode == 1
    assert "a_truncated" in p.stderr


def test_input_errors_are_one_line(tmp_path):
    (tmp_path / "empty").mkdir()
    cases = [
        (["--out", tmp_path / "m.jsonl", tmp_path / "empty"], 1,
         "no media files"),
        (["--out", tmp_path / "m.jsonl", tmp_path / "nope.mp4"], 1,
         "No such file"),
        ([tmp_path / "empty"], 2, "--out is required"),
        (["--out", tmp_path / "m.jsonl"], 2, "no INPUT"),
        (["--tokens", "gpt", "--out", "x", "y"], 2, "token model 'gpt'"),
        (["--frames", "fps:0", "--out", "x", "y"], 2, "frames 'fps:0'"),
        (["--size", "big", "--out", "x", "y"], 2, "size 'big'"),
        (["--jobs", "0", "--out", "x", "y"], 2, "--jobs"),
        (["--bogus"], 2, "bad option"),
    ]
    for args, code, text in cases:
        p = run_dh("probe", *args)
        assert p.returncode == code, (args, p.stderr)
        lines = p.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("datahelix: probe:"), \
            (args, p.stderr)
        assert text in lines[0], (args, lines)


def test_malformed_caption_list_names_the_line(tmp_path):
    lst = tmp_path / "list.jsonl"
    lst.write_text('{"path": "a.mp4"}\n{"path": 3}\n')
    p = run_dh("probe", "--out", tmp_path / "m.jsonl", lst)
    assert p.returncode == 1
    assert f"{lst}:2:" in p.stderr


def test_token_models_and_fixed_plan(tmp_path, gen_set):
    rows = {}
    for model in ("qwen-vl", "videomae", "dit", "patch=32,tpatch=4"):
        _, out = probe(tmp_path, gen_set, extra=("--tokens", model, "--frames",
                                                 "16", "--size", "224x224"))
        header, rows[model] = read_table(out)
        assert header["tokens"] == model
    assert {r["est_tokens"] for r in rows["qwen-vl"]} == {8 * 8 * 8}
    assert {r["est_tokens"] for r in rows["videomae"]} == {8 * 14 * 14}
    assert {r["est_tokens"] for r in rows["dit"]} == {5 * 14 * 14}
    assert {r["est_tokens"] for r in rows["patch=32,tpatch=4"]} == {4 * 7 * 7}
    assert {r["est_out_bytes"] for r in rows["dit"]} == {16 * 224 * 224 * 3}


def test_calibrate_fits_and_records_the_model(tmp_path, gen_set):
    p, out = probe(tmp_path, gen_set, extra=("--calibrate", "2"))
    header, rows = read_table(out)
    cm = header["cost_model"]
    assert cm["calibrated"] is True and cm["fit_samples"] == 6, p.stderr
    assert min(cm[k] for k in ("base_ms", "ms_per_src_mpx", "ms_per_in_mb",
                               "ms_per_out_mpx")) >= 0
    assert "cost model from 6 decodes" in p.stderr
    # Bigger profiles must be predicted to cost more.
    cost = {}
    for r in rows:
        cost.setdefault(r["profile"], []).append(r["est_cpu_ms"])
    assert max(cost["16x224"]) < min(cost["64x448"])


def test_stdout_output_and_help(tmp_path, gen_set):
    p = run_dh("probe", "--quiet", "--out", "-", gen_set, check=True)
    lines = p.stdout.splitlines()
    assert json.loads(lines[0]).get("datahelix_header")
    assert len(lines) == 7 and p.stderr == ""
    h = run_dh("probe", "--help", check=True)
    assert "usage: datahelix probe" in h.stdout


def test_truncated_matroska_reported(tmp_path, shared_videos):
    """Without an index, a cut-off file shows as packets that stop short."""
    src = shared_videos / "decord__flipping_a_pancake.mkv"
    if not src.exists():
        pytest.skip("clip missing")
    bad = tmp_path / "cut.mkv"
    bad.write_bytes(src.read_bytes()[:200000])
    p = run_dh("probe", "--out", tmp_path / "m.jsonl", bad, src)
    assert p.returncode == 0
    assert f"{bad}: truncated or damaged" in p.stderr
    _, rows = read_table(tmp_path / "m.jsonl")
    assert [r["path"] for r in rows] == [str(src)]


def test_awkward_names_and_links(tmp_path, gen_set, ffprobe):
    """Names FFmpeg would read as URLs, names JSON cannot hold, dangling
    links and link loops: reported per file, never fatal for the run."""
    d = tmp_path / "in"
    d.mkdir()
    good = sorted(gen_set.glob("*_S.mp4"))[0]
    shutil.copy(good, d / "x:y.mp4")
    shutil.copy(good, d / "ok file é.mp4")
    shutil.copy(good, os.path.join(os.fsencode(d), b"caf\xe9.mp4"))
    os.symlink("/nonexistent", d / "dangling.mp4")
    os.symlink("/nonexistent", d / "README")
    os.symlink("loopb.mp4", d / "loopa.mp4")
    os.symlink("loopa.mp4", d / "loopb.mp4")
    p = run_dh("probe", "--out", tmp_path / "m.jsonl", d,
               errors="surrogateescape")
    assert p.returncode == 0, p.stderr
    _, rows = read_table(tmp_path / "m.jsonl")
    assert sorted(os.path.basename(r["path"]) for r in rows) == \
        ["ok file é.mp4", "x:y.mp4"]
    for r in rows:
        assert r["frames"] == ffprobe_facts(ffprobe, "file:" + r["path"])[
            "frames"]
    err = p.stderr
    assert "not valid UTF-8" in err and "dangling.mp4" in err
    assert "loopa.mp4" in err and "README" not in err
    assert "2 probed, 4 failed" in err


def test_fragmented_mp4_frames_are_counted(tmp_path, gen_set, ffprobe):
    src = sorted(gen_set.glob("*_L.mp4"))[0]
    frag = tmp_path / "frag.mp4"
    subprocess.run(["ffmpeg", "-v", "error", "-i", src, "-c", "copy",
                    "-movflags", "frag_keyframe+empty_moov+default_base_moof"
                    "+global_sidx", "-y", frag], check=True, timeout=60)
    _, out = probe(tmp_path, frag)
    _, rows = read_table(out)
    assert rows[0]["frames"] == ffprobe_facts(ffprobe, frag)["frames"]
    assert rows[0]["frames"] == ffprobe_facts(ffprobe, src)["frames"]


def test_frames_all_is_not_capped(tmp_path, shared_videos):
    clip = shared_videos / "moviepy__big_buck_bunny_0_30.webm"
    _, out = probe(tmp_path, clip, extra=("--frames", "all", "--size",
                                          "224x224"))
    _, rows = read_table(out)
    assert rows[0]["est_out_bytes"] == rows[0]["frames"] * 224 * 224 * 3
    assert rows[0]["frames"] > 256


def test_outputs_checked_before_work(tmp_path, gen_set):
    p = run_dh("probe", "--out", tmp_path / "no" / "m.jsonl", gen_set)
    assert p.returncode == 1
    assert p.stderr.strip() == (f"datahelix: probe: cannot write "
                                f"{tmp_path}/no/m.jsonl: {tmp_path}/no: "
                                "No such file or directory")
    p = run_dh("probe", "--out", "-", "--index", tmp_path / "x.dhx", gen_set)
    assert p.returncode == 2 and p.stdout == ""
    p = run_dh("probe", "--out")
    assert p.returncode == 2 and "needs a value" in p.stderr
