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
