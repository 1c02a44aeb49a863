"""`datahelix demo` (the engine of `make demo`; issue 18 item 1) with a tiny
set: both loaders train the same job, the side-by-side table has numbers
for both, and the figure is a real PNG."""
import json
import re
import subprocess

from conftest import _binary


def test_demo_trains_with_both_loaders_and_draws_the_figure(tmp_path):
    out = tmp_path / "demo"
    p = subprocess.run([_binary(), "demo", "--out", str(out), "--count", "8",
                        "--epochs", "1", "--ranks", "2", "--frames", "4",
                        "--size", "64", "--workers", "1", "--timeout", "240"],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    lines = p.stdout.splitlines()
    header = [x for x in lines if "torch DataLoader + PyAV" in x and
              "datahelix.DataLoader" in x and "ratio" in x]
    assert header, p.stdout
    row = [x for x in lines if x.strip().startswith("samples/s")]
    assert row, p.stdout
    nums = re.findall(r"\d+\.\d+", row[0])
    assert len(nums) == 3 and all(float(n) > 0 for n in nums[:2]), row[0]
    res = json.loads((out / "demo.json").read_text())
    for k in ("torch", "datahelix"):
        assert res[k]["steps"] == 2, res  # 8 clips / 2 ranks / batch 2
        assert res[k]["samples_per_s"] > 0
        assert 0 <= res[k]["ddl_miss"] <= 1 and 0 <= res[k]["idle_share"] <= 1
    png = (out / "demo.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10000
    # Progress while it ran, and the line that says what regime it ran in,
    # with the emulated GPU step said as such (issue 41 item 7).
    assert "== 3. training" in p.stdout, p.stdout
    regime = [x for x in lines if x.strip().startswith("Regime:")]
    assert len(regime) == 1, p.stdout
    assert "400 ms GPU step (emulated" in regime[0], regime[0]
    assert "ask for 10 samples/s" in regime[0], regime[0]  # 2 x 2 / 0.4 s


def test_the_regime_line_names_who_could_not_keep_up():
    import sys
    import types
    from conftest import ROOT
    sys.path.insert(0, str(ROOT / "python"))
    from datahelix._demo import regime
    a = types.SimpleNamespace(ranks=4, batch_size=2, gpu_step_ms=400.0,
                              cpu_model=False)
    need = 20.0  # 4 ranks x 2 samples / 0.4 s

    def line(t, d):
        return regime(a, {"torch": {"samples_per_s": t},
                          "datahelix": {"samples_per_s": d}}, 2)
    assert "input-bound for both" in line(11.7, 17.5)
    assert "input-bound for torch only" in line(11.7, need)
    assert "input-bound for datahelix only" in line(need, 11.7)
    assert "GPU-bound for both" in line(need * 0.96, need)
    assert "ask for 20 samples/s from 2 CPU cores" in line(1, 1)
    assert "emulated" in line(1, 1)
    a.cpu_model = True
    assert line(1, 2).startswith("Regime: CPU-bound")
