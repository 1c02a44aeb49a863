"""Issue 38 item 3 (Tests: Balance): clips of equal video cost whose
soundtracks differ in length.  With `probe --audio-tokens` the audio tokens
join est_tokens and Tier 1 balances them: the true tokens of every step
(video + audio, each sample's) are within 1.10 of the step's mean on every
rank; planned on video tokens alone the same set is far off (> 1.3).
"""
import json
import shutil
import subprocess

from conftest import run_dh
from test_audio_probe import ffmpeg_of

WORLD, BATCH = 4, 2


def plan(table):
    """[(step, [[ids of rank r]...])] of `datahelix plan --json`."""
    p = run_dh("plan", "--manifest", table, "--world-size", WORLD,
               "--batch-size", BATCH, "--seed", 3, "--json", check=True)
    return [json.loads(line)["ranks"] for line in p.stdout.splitlines()
            if '"step"' in line]


def tokens(table):
    return {r["id"]: r["est_tokens"] for r in map(
        json.loads, table.read_text().splitlines()) if "id" in r}


def worst_ratio(steps, true):
    worst = 0.0
    for ranks in steps:
        per = [sum(true[i] for i in ids) for ids in ranks]
        worst = max(worst, max(per) / (sum(per) / len(per)))
    return worst


def test_audio_tokens_balance_the_steps(tmp_path, ffprobe):
    ff = ffmpeg_of(ffprobe)
    src = tmp_path / "src"
    src.mkdir()
    video = ["-f", "lavfi", "-i", "testsrc=size=32x32:rate=8:duration=4"]
    for name, secs in (("long", 4), ("short", 0.25)):
        subprocess.run([ff, "-v", "error", *video, "-f", "lavfi", "-i",
                        f"sine=frequency=300:sample_rate=16000:duration="
                        f"{secs}", "-c:v", "mpeg4", "-c:a", "pcm_s16le",
                        str(src / f"{name}.mkv")], check=True, timeout=120)
    clips = tmp_path / "clips"
    clips.mkdir()
    for k in range(32):  # the same two clips, 16 times each
        shutil.copy(src / ("long.mkv" if k % 2 else "short.mkv"),
                    clips / f"c{k:02d}.mkv")
    common = ["--quiet", "--frames", "2", "--size", "32x32"]
    av, v = tmp_path / "av.jsonl", tmp_path / "v.jsonl"
    run_dh("probe", *common, "--audio-tokens", "whisper", "--out", av,
           clips, check=True)
    run_dh("probe", *common, "--out", v, clips, check=True)
    true = tokens(av)  # video + the sound's tokens, per sample
    # with audio counted the sound's decode joins est_cpu_ms too
    cpu = {k: [json.loads(x)["est_cpu_ms"] for x in t.read_text()
               .splitlines() if '"id"' in x] for k, t in (("av", av),
                                                        ("v", v))}
    assert all(a > b for a, b in zip(cpu["av"], cpu["v"]))
    assert len(set(tokens(v).values())) == 1  # equal video cost
    assert max(true.values()) - min(true.values()) >= 150  # 4 s vs 0.25 s
    balanced = worst_ratio(plan(av), true)
    blind = worst_ratio(plan(v), true)
    print(f"max/mean true tokens per step: {balanced:.3f} with audio tokens, "
          f"{blind:.3f} without")
    assert balanced <= 1.10, balanced
    assert blind > 1.3, blind
