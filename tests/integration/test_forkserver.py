"""The fork server's side of its protocol (python/datahelix/_forkserver.py,
src/runtime/forkserver.h), driven from here as a DataServer would: bad
requests are answered, not obeyed; a worker's exit comes back as a
notice; it ends with its connection, or alone when nobody connects."""
import os
import socket
import sys
import tempfile
import time

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "python"))
from datahelix import _forkserver  # noqa: E402


def wait_exit(pid, secs):
    end = time.monotonic() + secs
    while time.monotonic() < end:
        got, status = os.waitpid(pid, os.WNOHANG)
        if got:
            return status
        time.sleep(0.02)
    return None


def connect(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.settimeout(20)
    s.connect(path)
    return s


def test_requests_answers_and_exit_notices():
    d = tempfile.mkdtemp(prefix="dh-fs-test-")
    path = os.path.join(d, "fork.sock")
    fs = _forkserver.ForkServer(path, {"dataset": None}, "nowhere.pkl")
    try:
        s = connect(path)
        # malformed: too few fields, then the wrong number of descriptors
        s.send(b"F 0 1")
        assert s.recv(512).startswith(b"E malformed request")
        r, w = os.pipe()
        socket.send_fds(s, [b"F 0 1 0 1000 1"], [r])
        assert s.recv(512).startswith(b"E malformed request")
        # a well-formed request whose "arena" is a pipe: the worker starts,
        # cannot map it, says so on its socket and exits 1
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        err_r, err_w = os.pipe()
        socket.send_fds(s, [b"F 3 4 7 1000 9"], [theirs.fileno(), r, 1, err_w])
        theirs.close()
        os.close(err_w)
        msg, fds, _, _ = socket.recv_fds(s, 512, 4)
        assert msg.startswith(b"P ") and len(fds) == 1, msg
        pid = int(msg.split()[1])
        os.close(fds[0])
        mine.settimeout(20)
        assert mine.recv(8192).startswith(b"DHPF")
        assert s.recv(512) == b"X %d %d" % (pid, 1 << 8)  # exit status 1
        # the worker wrote its reason to the stderr it was handed
        with os.fdopen(err_r, "rb") as f:
            assert b"python worker 3" in f.read()
        os.close(r)
        os.close(w)
        # EOF on its connection: it ends by itself
        s.close()
        assert wait_exit(fs.pid, 10) == 0
        fs.pid = None
        assert not os.path.exists(path)  # the name went at accept
    finally:
        fs.stop()
        os.rmdir(d)


def test_nobody_connects_it_ends_alone(monkeypatch):
    monkeypatch.setattr(_forkserver, "ACCEPT_S", 1.0)
    d = tempfile.mkdtemp(prefix="dh-fs-test-")
    path = os.path.join(d, "fork.sock")
    fs = _forkserver.ForkServer(path, {}, "nowhere.pkl")
    try:
        assert wait_exit(fs.pid, 10) == 0
        fs.pid = None
        assert not os.path.exists(path)
    finally:
        fs.stop()
        os.rmdir(d)


class FakeForkServer:
    """Stands in for the loader's fork server and answers every request
    with `answer` (None: closes the connection at the first request): the
    DataServer must warn and exec its workers, and every batch arrive."""

    answer = None

    def __init__(self, path, cfg, dataset):
        import threading
        from datahelix import _forkserver
        self.path, self.pid = path, None
        r, w = os.pipe()
        os.close(w)  # it forks nothing, so it tells nothing
        self.events = _forkserver.Events(r)
        self.lst = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.lst.bind(path)
        self.lst.listen(1)
        self.lst.settimeout(30)
        self.t = threading.Thread(target=self.serve, daemon=True)
        self.t.start()

    def serve(self):
        try:
            conn, _ = self.lst.accept()
        except OSError:
            return
        with conn:
            conn.settimeout(30)
            try:
                msg, fds, _, _ = socket.recv_fds(conn, 512, 8)
            except OSError:
                return
            for f in fds:
                os.close(f)
            if self.answer is not None:
                conn.send(self.answer)
                conn.recv(512)  # until the DataServer closes it

    def stop(self, grace=0):
        self.lst.close()
        self.t.join(10)


@pytest.mark.parametrize("answer", [b"E refused by the test", b"P 12x",
                                    b"Q what", b"X 0 0", None])
def test_a_fork_server_that_fails_leaves_exec_d_workers(monkeypatch, capfd,
                                                        answer):
    import datahelix
    import dist_datasets as dd
    monkeypatch.setattr(FakeForkServer, "answer", answer)
    monkeypatch.setattr(_forkserver, "ForkServer", FakeForkServer)
    loader = datahelix.DistributedDataLoader(dd.Range(8), batch_size=2,
                                             num_workers=2, timeout=60)
    try:
        assert sum((b.tolist() for b in loader), []) == list(range(8))
    finally:
        loader.close()
    err = capfd.readouterr().err
    assert "python fork server" in err and \
        "workers start as fresh interpreters" in err, err
