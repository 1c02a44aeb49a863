"""Only the bytes we mean to read (issue 36 item 4): an input that names
other inputs - an HLS or DASH playlist, an ffconcat list - opens none of
them.  A playlist whose segment is a FIFO used to block probe, decode and
a DataServer's worker in open() (the watchdog cannot reach a worker stuck
in a syscall); one naming /etc/passwd would read it.  Now each is refused
at once, naming the file and why, and under a loader it is a SampleError
like any bad sample."""
import json
import os
import sys
import time

import pytest

from conftest import ROOT, run_dh

torch = pytest.importorskip("torch")
sys.path.insert(0, str(ROOT / "python"))
import datahelix  # noqa: E402
from both_loaders import binary_env  # noqa: E402,F401 (autouse)

HLS = "#EXTM3U\n#EXT-X-TARGETDURATION:2\n#EXTINF:2,\n{seg}\n#EXT-X-ENDLIST\n"


@pytest.fixture
def lists(tmp_path):
    fifo = tmp_path / "seg.ts"
    os.mkfifo(fifo)
    made = {
        "fifo.m3u8": HLS.format(seg="seg.ts"),
        "passwd.m3u8": HLS.format(seg="/etc/passwd"),
        "url.m3u8": HLS.format(seg="http://127.0.0.1:9/x.ts"),
        "fifo.ffconcat": "ffconcat version 1.0\nfile seg.ts\n",
        "passwd.ffconcat": "ffconcat version 1.0\nfile /etc/passwd\n",
    }
    for name, text in made.items():
        (tmp_path / name).write_text(text)
    return tmp_path, sorted(tmp_path / n for n in made)


def test_probe_and_decode_refuse_at_once(lists):
    d, files = lists
    t0 = time.monotonic()
    p = run_dh("probe", "--out", d / "m.jsonl", *files, timeout=60)
    assert p.returncode == 1 and time.monotonic() - t0 < 30
    for f in files:
        assert f"{f}: " in p.stderr and "those are not opened" in p.stderr
    assert "root:" not in p.stderr  # nothing of /etc/passwd
    p = run_dh("decode", *files, timeout=60)
    assert p.returncode == 1
    assert p.stderr.count("those are not opened") == len(files)


def test_a_loader_fails_the_sample_and_never_blocks(lists, tmp_path):
    d, files = lists
    rows = [json.dumps({"id": i, "path": str(f), "kind": "video",
                        "bytes": f.stat().st_size, "frames": 50,
                        "width": 64, "height": 64, "fps": 25,
                        "duration_s": 2, "est_tokens": 10})
            for i, f in enumerate(files)]
    (tmp_path / "t.jsonl").write_text("\n".join(rows) + "\n")
    t0 = time.monotonic()
    with datahelix.DataLoader(str(tmp_path / "t.jsonl"), batch_size=1,
                              frames=2, size=(16, 16), world_size=1, rank=0,
                              shuffle=False, timeout=30) as loader:
        it = iter(loader)
        errors = 0
        for _ in files:
            with pytest.raises(datahelix.SampleError) as ei:
                next(it)
            assert "those are not opened" in str(ei.value)
            errors += 1
    assert errors == len(files) and time.monotonic() - t0 < 60
