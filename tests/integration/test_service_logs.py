"""Logs never block, SIGPIPE kills nothing (issue 13 item 7): the
Coordinator a Python loader starts has its stderr drained by a thread
(datahelix._services._Drain) that shows its lines with a prefix, and caps
its own log (a flood of strangers refused at the CURVE handshake gives a
few lines and a count), so neither a flood nor a long job's log stops it; the drain itself reads a child that writes > 1 MiB to
its end; and a service whose stderr reader went away goes on serving."""
import os
import subprocess
import sys

import pytest

from conftest import ROOT, _binary, stop_process
from procs import alive, wait_until, zmtp_dealer, zmtp_send

torch = pytest.importorskip("torch")
sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import datahelix  # noqa: E402
import dist_datasets as dd  # noqa: E402
from datahelix import _services  # noqa: E402
from both_loaders import binary_env  # noqa: E402,F401


def flood(path, n):
    """n malformed messages at the Coordinator on ipc socket `path`."""
    s = zmtp_dealer(path)
    try:
        for i in range(0, n, 500):
            for _ in range(min(500, n - i)):
                zmtp_send(s, [b"\x00not a datahelix message, " + b"x" * 40])
    finally:
        s.close()


def test_a_flood_at_the_coordinator_neither_blocks_nor_floods_its_log(capfd):
    """The loader's Coordinator speaks CURVE with the job's key (even on
    ipc), so a stranger's raw ZMTP peer is refused at its handshake: 2,000
    of them give a few log lines and a count, and the job goes on."""
    n = 2000
    with datahelix.DistributedDataLoader(dd.Range(40), batch_size=2,
                                         num_workers=1, timeout=20) as dl:
        it = iter(dl)
        assert next(it).tolist() == [0, 1]
        coord = dl._coord
        assert coord.listen.startswith("ipc://")
        refused = 0
        for _ in range(n):
            try:
                zmtp_dealer(coord.listen[len("ipc://"):], timeout=5).close()
            except (ConnectionError, OSError):
                refused += 1
        assert refused == n  # no keyless peer gets through
        # The job goes on meanwhile: the rest of this epoch and another.
        assert [b.tolist() for b in it][-1] == [38, 39]
        assert sum(len(b) for b in dl) == 40
        assert coord.proc.poll() is None
        # Its log said so in a few lines, not one a stranger.
        assert coord.proc.drain.lines < n // 4, coord.proc.drain.lines
    err = capfd.readouterr().err
    assert "datahelix: coordinator (pid" in err and "refused a peer" in err


def test_the_drain_reads_a_child_to_its_end_and_keeps_the_tail():
    code = ("import sys\nfor i in range(20000):\n"
            "    sys.stderr.write(f'line {i} ' + 'y' * 80 + '\\n')\n")
    p = subprocess.Popen([sys.executable, "-c", code],
                         stderr=subprocess.PIPE)

    class Sink:
        text = []

        def write(self, s):
            self.text.append(s)

        def flush(self):
            pass
    sink = Sink()
    d = _services._Drain(p.stderr, "child", out=sink)
    try:
        assert p.wait(timeout=60) == 0  # > 1 MiB, never blocked
    finally:
        if p.poll() is None:
            stop_process(p)
    tail = d.text()
    assert d.lines == 20000 and tail.endswith("line 19999 " + "y" * 80)
    shown = "".join(sink.text)
    assert shown.startswith("child: line 0 ") and "not shown" in shown


def test_a_coordinator_whose_stderr_reader_is_gone_keeps_serving(tmp_path):
    sock = tmp_path / "c.sock"
    # Python's subprocess gives the child SIGPIPE's default action: without
    # the service ignoring it, its next log line would kill it.
    p = subprocess.Popen([_binary(), "coordinator", "--listen",
                          f"ipc://{sock}"], stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        assert wait_until(sock.exists, 10)
        p.stderr.close()  # nobody reads its log any more
        flood(sock, 50)   # it logs 50 lines into the closed pipe
        s = zmtp_dealer(sock)  # and still answers a new peer
        s.close()
        ended = wait_until(lambda: p.poll() is not None, 1)
        assert not ended and alive(p.pid), \
            f"the coordinator ended: {p.returncode} (-13: SIGPIPE)"
    finally:
        stop_process(p)
