"""`datahelix bench`: help, argument errors, and a tiny side-by-side run
(2 ranks, native and dh-ddl, 3 measured steps of S clips) whose JSON has
every metric per system, with nothing left running afterwards."""
import json
import math
import os
import pathlib
import time

import pytest

from conftest import run_dh


def test_help_lists_the_systems_and_metrics_options():
    p = run_dh("bench", "--help", check=True)
    assert p.stdout.startswith("usage: datahelix bench")
    for word in ("--systems", "native-pyav", "dask-pool", "dh-ddl",
                 "--workload", "--model", "--workers", "--plots"):
        assert word in p.stdout


@pytest.mark.parametrize("args,why", [
    (["--ranks", "0"], "--ranks must be an integer in [1, 64], not '0'"),
    (["--systems", "native,ray"], "unknown system 'ray'"),
    (["--workload", "XL"], "--workload 'XL': expected S, M, L, mixed"),
    (["--model", "gpt"], "--model 'gpt': expected videomae, qwen-vl or dit"),
    (["--steps"], "option '--steps' needs a value"),
    (["--size", "0x10"], "--size"),
    (["--gpu-scale", "x"], "--gpu-scale must be a number"),
    (["--ddl-ms", "-1"], "--ddl-ms must be a number in [0, 1e9]"),
    (["stray"], "unexpected argument 'stray'"),
    (["--frobnicate"], "bad option '--frobnicate'"),
    (["--gpu"], "--gpu (a small real model on CUDA instead of the emulated "
                "window) is not implemented"),
])
def test_bad_arguments_exit_2_with_one_line(args, why):
    p = run_dh("bench", *args, timeout=30)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("datahelix: bench: ")
    assert why in lines[0]


def test_missing_harness_is_a_clear_error(tmp_path):
    env = dict(os.environ, DATAHELIX_BENCH_SCRIPT=str(tmp_path / "nope.py"))
    p = run_dh("bench", "--steps", "1", timeout=30, env=env)
    assert p.returncode == 1
    assert "nope.py" in p.stderr and "DATAHELIX_BENCH_SCRIPT" in p.stderr


def processes_naming(text):
    """Live processes whose command line contains `text`."""
    found = []
    for d in pathlib.Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            argv = (d / "cmdline").read_bytes()
            st = (d / "stat").read_text()
        except OSError:
            continue
        if text.encode() in argv and st[st.rindex(")") + 2:].split()[0] != "Z":
            found.append((int(d.name), argv.replace(b"\0", b" ")[:200]))
    return found


def test_tiny_run_reports_the_paper_metrics_and_leaves_nothing(tmp_path):
    out, data = tmp_path / "out", tmp_path / "data"
    t0 = time.monotonic()
    p = run_dh("bench", "--systems", "native,dh-ddl", "--ranks", 2,
               "--steps", 3, "--warmup", 1, "--workload", "S", "--clips", 4,
               "--batch-size", 2, "--frames", 4, "--size", "64x64",
               "--out", out, "--data-dir", data, "--json", "--timeout", 120,
               "--validate", "--ddl-ms", 2.5, timeout=240)
    took = time.monotonic() - t0
    assert p.returncode == 0, p.stderr
    res = json.loads(p.stdout)
    assert took < 120, f"the tiny run took {took:.0f} s"
    assert set(res["systems"]) == {"native", "dh-ddl"}
    assert res["config"]["ddl_ms"] == 2.5
    for name, m in res["systems"].items():
        assert m["status"] == "ok", (name, m)
        for key in ("throughput_samples_per_s", "input_wait_p95_ms",
                    "batch_ready_p95_ms", "ddl_miss_rate",
                    "cross_ds_gb_per_100_steps", "scheduler_overhead_us"):
            assert key in m, (name, key)
        assert m["throughput_samples_per_s"] > 0
        assert 0 <= m["ddl_miss_rate"] <= 1
        assert m["input_wait_p95_ms"] >= 0
        assert m["measured_steps"] == 3 and m["samples"] == 2 * 2 * 3
        assert m["cross_ds_gb_per_100_steps"] == 0  # local only
    assert res["systems"]["native"]["scheduler_overhead_us"] is None
    dh = res["systems"]["dh-ddl"]
    assert dh["scheduler_overhead_us"] is not None
    assert dh["batch_ready_p95_ms"] is not None
    assert "dh-ddl_vs_native" in res["comparisons"]
    assert (out / "results.json").exists() and (out / "table.md").exists()
    # --validate: the same configuration simulated, system by system.
    v = res["validation"]
    assert "--gpu-ms" in v["command"] and v["mean_decode_ms"] > 0
    assert set(v["systems"]) == {"native", "dh-ddl"}
    for name, r in v["systems"].items():
        live = res["systems"][name]["throughput_samples_per_s"]
        assert r["live_throughput"] == live
        assert r["sim_throughput"] > 0
        assert math.isclose(r["throughput_diff"],
                             r["sim_throughput"] / live - 1)
        assert r["within_tolerance"] == (abs(r["throughput_diff"]) <= 0.15)
    assert "Simulated" in (out / "table.md").read_text()
    # Every rank, DataLoader worker, DataServer and Coordinator is gone.
    end = time.monotonic() + 10
    while processes_naming(str(tmp_path)) and time.monotonic() < end:
        time.sleep(0.2)
    assert processes_naming(str(tmp_path)) == []


# ---- harness pieces ---------------------------------------------------------

def bench_live():
    import importlib.util
    path = pathlib.Path(__file__).resolve().parents[2] / "bench" / \
        "bench_live.py"
    spec = importlib.util.spec_from_file_location("bench_live", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_failing_rank_is_named_not_its_peers():
    b = bench_live()
    gloo = ("RuntimeError: [./gloo/transport/tcp/pair.cc:598] Connection "
            "closed by peer [127.0.0.1]:31874")
    logs = {0: gloo, 1: "datahelix._C.DataError: /v/x.mp4: decoding near "
            "frame 27", 2: gloo.replace("closed", "reset")}
    assert b.root_cause([0, 1, 2], logs) == 1
    assert b.root_cause([0, 2], logs) == 0  # only echoes: the first


def test_undecodable_clips_are_left_out_with_the_reason(tmp_path, capsys):
    """The shared set's deliberately corrupt clip would stop the first
    rank that meets it: the bench leaves it out and says why."""
    from conftest import SHARED_DATA, _binary
    videos = SHARED_DATA / "videos"
    bad, good = videos / "decord__corrupted.mp4", videos / "decord__video_0.mov"
    if not bad.exists() or not good.exists():
        pytest.fail(f"{videos}: the shared clips are missing")
    b = bench_live()

    class A:
        bin, frames, size, systems = _binary(), 4, (64, 64), ()
    rows = [{"id": 0, "path": str(bad)}, {"id": 1, "path": str(good)}]
    assert b.decodable(A, rows) == [rows[1]]
    err = capsys.readouterr().err
    assert "left out of the run" in err and str(bad) in err
