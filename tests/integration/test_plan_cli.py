"""`datahelix plan`: the Tier-1 plan of an epoch from a table or an index,
its --json format (issue 6 item 5), exactly-once delivery, and errors."""
import json
import random

import pytest

from conftest import run_dh


def probed_table(tmp_path, gen_set):
    out = tmp_path / "m.jsonl"
    run_dh("probe", "--out", out, gen_set / "captions.jsonl", check=True)
    return out


def synthetic_table(tmp_path, n=500, seed=3):
    """A heavy-tailed table written directly (no media needed)."""
    rng = random.Random(seed)
    out = tmp_path / "syn.jsonl"
    with open(out, "w") as f:
        for i in range(n):
            k = rng.choices(range(4), weights=[50, 25, 15, 10])[0]
            prof = ["16x224", "32x336", "64x448", "64x720"][k]
            tok = [896, 4032, 14336, 38272][k] + rng.randrange(200)
            f.write(json.dumps({"id": i, "path": f"v{i}.mp4", "kind": "video",
                                "profile": prof, "est_tokens": tok}) + "\n")
    return out


def tokens_of(table):
    rows = [json.loads(l) for l in open(table)]
    rows = [r for r in rows if "datahelix_header" not in r]
    return {r["id"]: r.get("est_tokens", 0) for r in rows}


def plan_json(manifest, *extra):
    p = run_dh("plan", "--manifest", manifest, *extra, "--json", check=True)
    lines = [json.loads(l) for l in p.stdout.splitlines()]
    return lines[:-1], lines[-1]["summary"]


def check_plan(steps, summary, tokens, world, batch, drop_last=True):
    n = len(tokens)
    seen = []
    ratios = []
    assert [s["step"] for s in steps] == list(range(len(steps)))
    for s in steps:
        assert len(s["ranks"]) == world and len(s["tokens"]) == world
        for ids, tok in zip(s["ranks"], s["tokens"]):
            assert sum(tokens[i] for i in ids) == tok
            seen.extend(ids)
        if drop_last or s is not steps[-1]:
            assert all(len(ids) == batch for ids in s["ranks"])
        total = sum(s["tokens"])
        ratios.append(max(s["tokens"]) * world / total if total else 1.0)
    kept = n // (world * batch) * world * batch if drop_last else n
    assert len(seen) == len(set(seen)) == kept  # every id exactly once
    assert set(seen) <= set(tokens)
    assert summary["steps"] == len(steps)
    assert summary["max_mean_avg"] == pytest.approx(sum(ratios) / len(ratios))
    assert summary["max_mean_worst"] == pytest.approx(max(ratios))
    return summary


def test_probed_set_plans_every_id_once(tmp_path, gen_set):
    table = probed_table(tmp_path, gen_set)
    steps, summary = plan_json(table, "--world-size", 2, "--batch-size", 3)
    check_plan(steps, summary, tokens_of(table), 2, 3)
    assert summary["steps"] == 1


@pytest.mark.parametrize("balance", ["fixed", "none"])
@pytest.mark.parametrize("drop_last", [True, False])
def test_table_and_index_agree(tmp_path, balance, drop_last):
    table = synthetic_table(tmp_path)
    dhx = tmp_path / "syn.dhx"
    run_dh("index", table, "-o", dhx, check=True)
    args = ["--world-size", 4, "--batch-size", 6, "--seed", 9,
            "--balance", balance] + ([] if drop_last else ["--no-drop-last"])
    a = plan_json(table, *args)
    b = plan_json(dhx, *args)
    assert a == b  # same manifest, same plan, whatever the file kind
    check_plan(*a, tokens_of(table), 4, 6, drop_last)


def test_window_beats_random_split(tmp_path):
    table = synthetic_table(tmp_path, n=2000)
    base = ["--world-size", 8, "--batch-size", 4, "--seed", 1]
    _, none = plan_json(table, *base, "--balance", "none")
    _, greedy = plan_json(table, *base, "--window", 1)
    _, win = plan_json(table, *base)
    assert win["max_mean_avg"] <= greedy["max_mean_avg"] \
        < none["max_mean_avg"]
    assert win["max_mean_avg"] <= 1.10
    s0, _ = plan_json(table, *base)
    s1, _ = plan_json(table, *base, "--epoch", 1)
    assert s0 != s1
    # --step-order sorted: the same balance, the steps in another order.
    s2, srt = plan_json(table, *base, "--step-order", "sorted")
    assert srt["max_mean_avg"] == win["max_mean_avg"] and s2 != s0


def test_human_output_compares(tmp_path):
    table = synthetic_table(tmp_path)
    p = run_dh("plan", "--manifest", table, "--world-size", 4,
               "--batch-size", 4, check=True)
    assert "none (random split)" in p.stdout
    assert "per-step greedy (window 1)" in p.stdout
    h = run_dh("plan", "--help", check=True)
    assert h.stdout.startswith("usage: datahelix plan")


@pytest.mark.parametrize("args, code", [
    (["--manifest", "/nonexistent/m.jsonl", "--world-size", 2,
      "--batch-size", 2], 1),
    (["--manifest", "M", "--world-size", 0, "--batch-size", 2], 2),
    (["--manifest", "M", "--world-size", 2, "--batch-size", 1000], 1),
    (["--manifest", "M", "--world-size", 2], 2),
    (["--manifest", "M", "--world-size", 2, "--batch-size", 2,
      "--balance", "best"], 2),
    (["--manifest", "M", "--world-size", 2, "--batch-size", 2,
      "--step-order", "random"], 2),
    (["--bogus"], 2),
])
def test_errors_are_one_line(tmp_path, args, code):
    table = synthetic_table(tmp_path, n=50)
    args = [table if a == "M" else a for a in args]
    p = run_dh("plan", *args)
    assert p.returncode == code
    assert p.stdout == ""
    lines = p.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("datahelix: plan: ")
