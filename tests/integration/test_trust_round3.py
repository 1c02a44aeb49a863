"""Trust, round 3 (issue 36): what the operating system can hand us.
A key or token file that is a FIFO is refused at once (it used to block
`coordinator`, `dataserver` and `consume` in open() for ever), and a
newline in a path cannot forge a log or error line."""
import os
import time

from conftest import run_dh


def test_a_fifo_key_or_token_file_is_refused_at_once(tmp_path):
    fifo = tmp_path / "key.fifo"
    os.mkfifo(fifo, 0o600)
    sock = tmp_path / "d"
    sock.mkdir(mode=0o700)
    # a real index, so that each command gets as far as its key
    (tmp_path / "t.jsonl").write_text('{"id": 0, "kind": "text", '
                                      '"text": "x"}\n')
    run_dh("index", tmp_path / "t.jsonl", "-o", tmp_path / "t.dhx",
           check=True)
    t0 = time.monotonic()
    for args in (
            ("coordinator", "--listen", f"ipc://{sock}/c.sock", "--keyfile",
             fifo),
            ("dataserver", "--coordinator", f"ipc://{sock}/c.sock",
             "--remote", "--index", tmp_path / "t.dhx", "--keyfile", fifo),
            ("consume", "--coordinator", f"ipc://{sock}/c.sock",
             "--manifest", tmp_path / "t.dhx", "--rank", 0,
             "--world-size", 1, "--batch-size", 1, "--keyfile", fifo),
            ("coordinator", "--listen", f"ipc://{sock}/c.sock",
             "--metrics-listen", "127.0.0.1:0", "--metrics-token-file",
             fifo)):
        p = run_dh(*args, timeout=30)
        assert p.returncode != 0, (args, p.stderr)
        assert "not a regular file" in p.stderr, (args, p.stderr)
    assert time.monotonic() - t0 < 60


def test_a_newline_in_a_path_cannot_forge_a_line(tmp_path):
    bad = tmp_path / "b\ndatahelix: coordinator: error: forged.mp4"
    bad.write_bytes(b"not a video")
    p = run_dh("probe", "--out", tmp_path / "m.jsonl", tmp_path)
    lines = p.stderr.splitlines()
    assert not any(x.startswith("datahelix: coordinator: error: forged")
                   for x in lines), p.stderr
    assert any("b\\ndatahelix: coordinator: error: forged.mp4" in x
               for x in lines), p.stderr


def test_telemetry_on_a_full_device_is_said_once(tmp_path):
    """Issue 36 item 6: a telemetry file on /dev/full used to lose every
    record silently, exit 0.  The client (a loader's or consume's) and the
    Coordinator each say it once, and the run goes on."""
    import json
    import subprocess
    import sys
    from conftest import ROOT, _binary
    run_dh("gen-data", "--out", tmp_path / "v", "--profiles", "S",
           "--count", 2, "--seed", 4, check=True, timeout=300)
    run_dh("probe", "--out", tmp_path / "m.jsonl", "--index",
           tmp_path / "m.dhx", tmp_path / "v", check=True)
    code = f"""
import sys
sys.path.insert(0, {str(ROOT / "python")!r})
import datahelix
with datahelix.DataLoader({str(tmp_path / "m.jsonl")!r}, batch_size=1,
                          frames=2, size=(16, 16), world_size=1, rank=0,
                          telemetry="/dev/full") as ld:
    print(sum(1 for _ in ld))
"""
    env = dict(os.environ, DATAHELIX_BIN=_binary())
    env.pop("DATAHELIX_LOG", None)
    p = subprocess.run([sys.executable, "-W", "ignore", "-c", code],
                       capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 0 and p.stdout.strip() == "2", p.stderr
    said = [x for x in p.stderr.splitlines()
            if "telemetry: a write failed" in x]
    assert len(said) == 1 and "client 0: warn:" in said[0], p.stderr
    d = tmp_path / "d"
    d.mkdir(mode=0o700)
    co = subprocess.Popen([_binary(), "coordinator", "--listen",
                           f"ipc://{d}/c.sock", "--telemetry", "/dev/full"],
                          stderr=subprocess.PIPE, text=True)
    try:
        end = time.monotonic() + 10
        while not (d / "c.sock").exists() and time.monotonic() < end:
            time.sleep(0.02)
        c = run_dh("consume", "--coordinator", f"ipc://{d}/c.sock",
                   "--manifest", tmp_path / "m.dhx", "--rank", 0,
                   "--world-size", 1, "--batch-size", 1, "--json",
                   timeout=120)
        assert c.returncode == 0, c.stderr
        summary = next(json.loads(x)["summary"] for x in
                       c.stdout.splitlines() if '"summary"' in x)
        assert summary["steps"] == 2
    finally:
        co.terminate()
        _, err = co.communicate(timeout=20)
    said = [x for x in err.splitlines() if "telemetry: a write failed" in x]
    assert len(said) == 1 and "coordinator: warn:" in said[0], err
