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
    # Progress while it ran, and the two lines that say what it means.
    assert "== 3. training" in p.stdout and "What it means here" in p.stdout
