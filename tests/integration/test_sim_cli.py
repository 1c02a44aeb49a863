"""`datahelix sim` (docs/sim.md): the --json shape and keys, the paper's
11-workload matrix, the human tables, and one-line errors for bad input.
Small configurations keep the whole file well under 30 s."""
import json
import math

from conftest import run_dh

KEYS = {"throughput", "input_wait_p95_s", "ready_p95_s", "ddl_miss_rate",
        "cross_ds_gb_per_100_steps"}
SYSTEMS = {"native", "pool", "datahelix"}
SMALL = ["--steps", 10, "--warmup", 2]


def sim_json(*args):
    p = run_dh("sim", *args, "--json", timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.count("\n") == 1  # one JSON object
    return json.loads(p.stdout)


def uniform_manifest(tmp_path, n, **fields):
    """n identical 16x224 rows (1 ms of CPU, 1,000 tokens) into m.jsonl,
    `fields` overriding."""
    m = tmp_path / "m.jsonl"
    rows = [dict({"id": i, "path": f"v{i}.mp4", "kind": "video",
                  "profile": "16x224", "est_cpu_ms": 1.0,
                  "est_out_bytes": 1000, "est_tokens": 1000}, **fields)
            for i in range(n)]
    m.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return m


def check_metrics(m):
    assert set(m) == KEYS
    for k, v in m.items():
        assert isinstance(v, (int, float)) and math.isfinite(v), (k, v)
        assert v >= 0
    assert m["throughput"] > 0
    assert m["ddl_miss_rate"] <= 1


def test_json_shape():
    d = sim_json("--workload", "kinetics-mixed", *SMALL)
    assert set(d) == {"workloads", "aggregate"}
    assert list(d["workloads"]) == ["kinetics-mixed"]
    for sysm in [d["workloads"]["kinetics-mixed"], d["aggregate"]]:
        assert set(sysm) == SYSTEMS
        for m in sysm.values():
            check_metrics(m)
    assert d["workloads"]["kinetics-mixed"]["native"][
        "cross_ds_gb_per_100_steps"] == 0


def test_systems_subset_and_determinism():
    a = sim_json("--systems", "datahelix,native", "--seed", 5, *SMALL)
    b = sim_json("--systems", "native,datahelix", "--seed", 5, *SMALL)
    assert a == b
    assert set(a["aggregate"]) == {"native", "datahelix"}


def test_paper_matrix():
    d = sim_json("--workload", "paper", *SMALL)
    assert len(d["workloads"]) == 11
    names = set(d["workloads"])
    assert "kinetics-mixed/qwen-vl" in names
    assert "openvid-mixed/wan-dit" in names
    for sysm in d["workloads"].values():
        assert set(sysm) == SYSTEMS
        for m in sysm.values():
            check_metrics(m)
    # Table 2: geometric mean of throughput, arithmetic means of the rest
    for s in SYSTEMS:
        thr = [w[s]["throughput"] for w in d["workloads"].values()]
        geo = math.exp(sum(map(math.log, thr)) / len(thr))
        assert math.isclose(d["aggregate"][s]["throughput"], geo,
                            rel_tol=1e-4)
        miss = [w[s]["ddl_miss_rate"] for w in d["workloads"].values()]
        assert math.isclose(d["aggregate"][s]["ddl_miss_rate"],
                            sum(miss) / len(miss), rel_tol=1e-4,
                            abs_tol=1e-6)


def test_human_table():
    p = run_dh("sim", "--workload", "openvid-mixed", "--model", "dit",
               *SMALL, check=True)
    assert "workload openvid-mixed (model dit)" in p.stdout
    for s in SYSTEMS:
        assert s in p.stdout
    assert "vs native" in p.stdout


def test_manifest(tmp_path):
    m = tmp_path / "m.jsonl"
    rows = [{"id": i, "path": f"v{i}.mp4", "kind": "video",
             "profile": "32x336" if i % 2 else "16x224",
             "est_cpu_ms": 80.0 if i % 2 else 20.0,
             "est_out_bytes": 20000000, "est_tokens": 4000 + 4000 * (i % 2)}
            for i in range(50)]
    m.write_text("".join(json.dumps(r) + "\n" for r in rows))
    d = sim_json("--manifest", m, "--ranks", 2, "--remote", 2, *SMALL)
    assert list(d["workloads"]) == [str(m)]
    for v in d["workloads"][str(m)].values():
        check_metrics(v)


def test_gpu_ms_sets_the_window(tmp_path):
    """--gpu-ms A,B,C: with decode nearly free, one rank of batch 1 steps
    once per sample's GPU time, A + B t + C t^2 ms (t = est_tokens)."""
    m = uniform_manifest(tmp_path, 40, est_out_bytes=1000)
    base = ["--manifest", m, "--ranks", 1, "--remote", 0, "--batch-size", 1,
            "--cpu-scale", 0.001, "--systems", "native", *SMALL]
    for gpu, step_ms in (("100,0,0", 100), ("0,0.05,0", 50),
                         ("10,0.01,0.00002", 40)):
        d = sim_json(*base, "--gpu-ms", gpu)
        t = d["aggregate"]["native"]["throughput"]
        assert math.isclose(t, 1000 / step_ms, rel_tol=1e-3), (gpu, t)
    assert "--gpu-ms" in one_line_error("--gpu-ms", "1,2")
    assert "--gpu-ms" in one_line_error("--gpu-ms", "1,-2,3")


def test_native_cores_sets_natives_workers():
    """--native-cores N: native's ranks get N workers each instead of an
    equal share of (local + remote) x cores; the other systems keep the
    budget.  CPU-bound here, so fewer workers is slower."""
    base = ["--workload", "kinetics-mixed", "--ranks", 4, "--remote", 4,
            "--cpu-scale", 20, "--prefetch", 8, *SMALL]
    eq = sim_json(*base)["aggregate"]
    rd0 = sim_json(*base, "--native-cores", 1)["aggregate"]
    assert rd0["native"]["throughput"] < 0.8 * eq["native"]["throughput"]
    assert rd0["pool"] == eq["pool"] and rd0["datahelix"] == eq["datahelix"]
    assert "--native-cores" in one_line_error("--native-cores", 0)


def test_handover_charges_only_its_system(tmp_path):
    """--handover SYS=A,B,C,D: with decode nearly free and the window
    fixed at 100 ms, one rank of batch 1 steps every 100 + C + D*MB ms
    (next() blocks before compute) when the CPU part A + B*MB stays under
    the window; a CPU part over the window makes the step the service
    time instead.  Only the named system pays."""
    m = uniform_manifest(tmp_path, 40, est_out_bytes=4000000)
    base = ["--manifest", m, "--ranks", 1, "--remote", 0, "--batch-size", 1,
            "--cores", 1, "--cpu-scale", 0.001, "--gpu-ms", "100,0,0",
            "--noise", 0,
            "--systems", "native,pool", *SMALL]
    d = sim_json(*base, "--handover", "pool=1,1,10,5")["aggregate"]
    assert math.isclose(d["native"]["throughput"], 10, rel_tol=1e-3)
    assert math.isclose(d["pool"]["throughput"], 1000 / 130, rel_tol=1e-3)
    assert math.isclose(d["pool"]["input_wait_p95_s"], 0.030, rel_tol=1e-3)
    # 1000 + 100 x 4 ms of CPU per sample at --cpu-scale 0.001: 1.4 ms
    d = sim_json(*base, "--handover", "native=1000,100,0,0")["aggregate"]
    assert math.isclose(d["native"]["throughput"], 10, rel_tol=1e-3)
    # ... and at --cpu-scale 1, 1 + 200 ms: the core, not the window, sets
    # the step
    cpu_bound = [x if x != 0.001 else 1 for x in base]
    d = sim_json(*cpu_bound, "--handover", "native=100,25,0,0")["aggregate"]
    assert math.isclose(d["native"]["throughput"], 1000 / 201, rel_tol=1e-3)
    assert "--handover" in one_line_error("--handover", "pool=1,2,3")
    assert "unknown system" in one_line_error("--handover", "ray=1,2,3,4")
    assert "--handover" in one_line_error("--handover", "pool=1,2,3,-4")


def test_replay_order_splits_in_manifest_order(tmp_path):
    """--replay-order: native's 2 ranks of batch 1 take the manifest's
    samples in turn, so rank 0 gets every 100 ms clip and sets the pace
    (one step per 100 ms); without it the random split is faster."""
    m = tmp_path / "m.jsonl"
    rows = [{"id": i, "path": f"v{i}.mp4", "kind": "video",
             "profile": "16x224", "est_cpu_ms": 10.0 if i % 2 else 100.0,
             "est_out_bytes": 1000, "est_tokens": 1000} for i in range(60)]
    m.write_text("".join(json.dumps(r) + "\n" for r in rows))
    base = ["--manifest", m, "--ranks", 2, "--remote", 0, "--cores", 1,
            "--batch-size", 1, "--gpu-ms", "1,0,0", "--noise", 0,
            "--systems", "native", "--steps", 20, "--warmup", 2]
    t = sim_json(*base, "--replay-order")["aggregate"]["native"]
    assert math.isclose(t["throughput"], 20, rel_tol=1e-3)
    t = sim_json(*base)["aggregate"]["native"]
    assert t["throughput"] > 21
    assert "--replay-order" in one_line_error("--replay-order")


def test_help():
    p = run_dh("sim", "--help")
    assert p.returncode == 0
    assert "usage: datahelix sim" in p.stdout
    assert p.stderr == ""


def one_line_error(*args):
    p = run_dh("sim", *args)
    assert p.returncode != 0
    assert p.stdout == ""
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert lines[0].startswith("datahelix: sim: "), lines[0]
    return lines[0]


def test_bad_arguments(tmp_path):
    assert "--ranks" in one_line_error("--ranks", 0)
    assert "--steps" in one_line_error("--steps", "ten")
    assert "unknown workload" in one_line_error("--workload", "nope")
    assert "--model" in one_line_error("--model", "gpt")
    assert "unknown system" in one_line_error("--systems", "native,ray")
    assert "exclude" in one_line_error("--workload", "kinetics-s",
                                       "--manifest", "x.jsonl")
    assert "--local" in one_line_error("--ranks", 2, "--local", 4)
    one_line_error("--bogus")
    one_line_error("--seed")
    one_line_error("extra")
    one_line_error("--manifest", tmp_path / "missing.jsonl")


# ---- Tier 2 (docs/rebalance.md "In the simulator") ----
T2 = ["--systems", "native,datahelix", "--ranks", 4, "--remote", 4,
      "--batch-size", 4, "--steps", 40, "--warmup", 4]
T2_KEYS = {"rounds", "moved", "kept", "unmeasured", "balanced",
           "moved_samples", "moved_bytes", "gain_ms", "cost_ms",
           "ratio_before", "ratio_after"}


def tier2_pair(*args):
    """The same run with Tier 2 off and on: (off, on) datahelix metrics."""
    off = sim_json(*T2, *args)["workloads"]["kinetics-mixed"]
    on = sim_json(*T2, *args, "--tier2")["workloads"]["kinetics-mixed"]
    # Tier 2 is datahelix's alone (the step times come with --est-error > 0
    # or --tier2)
    assert off["native"] == {k: on["native"][k] for k in off["native"]}
    assert "tier2" not in on["native"] and "step_p95_ms" in on["native"]
    assert set(on["datahelix"]["tier2"]) == T2_KEYS
    return off["datahelix"], on["datahelix"]


def test_tier2_corrects_wrong_estimates():
    off, on = tier2_pair("--est-error", 0.8)
    t = on["tier2"]
    assert t["rounds"] == 11  # 44 steps in rounds of 4
    assert t["unmeasured"] == 1  # the first round only measures
    assert t["moved"] >= 1 and t["moved_bytes"] > 0
    assert t["gain_ms"] > 0 and t["cost_ms"] > 0
    assert t["ratio_after"] < t["ratio_before"]
    # the moved bytes are cross-DS traffic; the run is faster, not slower
    assert on["cross_ds_gb_per_100_steps"] > off["cross_ds_gb_per_100_steps"]
    assert on["throughput"] > off["throughput"]


def test_tier2_keeps_when_moving_costs_more():
    # a 1 Mbit/s collective: every move costs more than it gains
    off, on = tier2_pair("--est-error", 0.8, "--link-gbps", 0.001)
    t = on["tier2"]
    assert t["moved"] == 0 and t["moved_bytes"] == 0
    assert t["kept"] >= 1 and t["cost_ms"] > t["gain_ms"]
    assert t["ratio_after"] == t["ratio_before"]
    assert {k: v for k, v in on.items() if k != "tier2"} == off


def test_tier2_right_estimates_no_worse():
    off, on = tier2_pair("--est-error", 0)
    assert on["throughput"] >= off["throughput"]
    assert on["tier2"]["rounds"] == 11


def test_tier2_margin_and_round_length():
    _, one = tier2_pair("--est-error", 0.8, "--tier2-rounds", 1)
    assert one["tier2"]["rounds"] == 44
    _, never = tier2_pair("--est-error", 0.8, "--tier2-margin", 1e6)
    assert never["tier2"]["moved"] == 0


def test_tier2_bad_arguments():
    assert "--est-error" in one_line_error("--est-error", -1)
    assert "--est-error" in one_line_error("--est-error", "x")
    assert "--tier2-rounds" in one_line_error("--tier2-rounds", 0)
    assert "--tier2-margin" in one_line_error("--tier2-margin", -2)
