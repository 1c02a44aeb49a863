"""Helpers the integration tests share: processes seen through /proc,
bounded waits, the epoch plan as the CLI prints it.  Tests end only the
processes they started, by pid (see each test)."""
import fcntl
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import tempfile
import time

from conftest import ROOT, run_dh


def _stat(pid):
    """(state, ppid) of `pid`, or None if it is gone."""
    try:
        st = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    f = st[st.rindex(")") + 2:].split()
    return f[0], int(f[1])


def alive(pid):
    """True if `pid` exists and is not a zombie."""
    s = _stat(pid)
    return s is not None and s[0] != "Z"


def children(pid):
    """Live pids whose parent is `pid`."""
    out = []
    for d in pathlib.Path("/proc").iterdir():
        if d.name.isdigit():
            s = _stat(d.name)
            if s and s[1] == pid and s[0] != "Z":
                out.append(int(d.name))
    return out


def descendants(pid):
    """Live pids below `pid`, at any depth."""
    out, frontier = [], [pid]
    while frontier:
        kids = children(frontier.pop())
        out += kids
        frontier += kids
    return out


def shm_names():
    """The names in /dev/shm now."""
    try:
        return set(os.listdir("/dev/shm"))
    except OSError:
        return set()


def _holders(names):
    """Names of `names` that a live process not of this checkout has open
    or mapped (/proc/PID/fd and /proc/PID/maps): not in this process's
    tree, and not one of this checkout's programs (an orphan of ours,
    reparented after a kill -9, still counts as ours)."""
    ours = set(descendants(os.getpid())) | {os.getpid()}
    paths = {"/dev/shm/" + n: n for n in names}
    held = set()
    for d in pathlib.Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) in ours:
            continue
        try:
            if str(ROOT).encode() in (d / "cmdline").read_bytes():
                continue
            seen = {os.readlink(f) for f in (d / "fd").iterdir()}
            seen |= {ln.split(None, 5)[-1] for ln in
                     (d / "maps").read_text().splitlines()
                     if "/dev/shm/" in ln}
        except OSError:
            continue
        held |= {paths[x] for x in seen if x in paths}
    return held


def shm_residue(before):
    """Entries new in /dev/shm since `before` (a shm_names() set) that are
    residue: other jobs on a shared machine (a torch DataLoader's
    semaphores, say) create and hold their own while a test runs, so a
    name some live process outside this test's tree still holds is
    theirs, not ours.  Our own leftovers are held by nobody, or by one of
    our processes (which the tests' orphan checks catch)."""
    new = shm_names() - before
    return sorted(new - _holders(new)) if new else []


def arena_mapping(ptr):
    """The /proc/self/maps line of the mapping holding address `ptr`."""
    for line in pathlib.Path("/proc/self/maps").read_text().splitlines():
        lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
        if lo <= ptr < hi:
            return line
    return ""


class FileProc:
    """Runs `argv` with stdout and stderr to files NAME.out / NAME.err in
    `outdir` (no pipe can fill up and stall it); ended by pid: SIGTERM,
    then SIGKILL."""

    def __init__(self, argv, name, outdir):
        self.name = name
        self.out = pathlib.Path(outdir) / f"{name}.out"
        self.err = pathlib.Path(outdir) / f"{name}.err"
        with open(self.out, "w") as o, open(self.err, "w") as e:
            self.p = subprocess.Popen([str(a) for a in argv],
                                      stdin=subprocess.DEVNULL, stdout=o,
                                      stderr=e)
        self.pid = self.p.pid

    def stdout(self):
        return self.out.read_text()

    def stderr(self):
        return self.err.read_text()

    def wait(self, seconds):
        try:
            return self.p.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, seconds=5):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(timeout=seconds)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait(timeout=seconds)
        return self.p.returncode


def log_file():
    """A temporary file for a daemon's stderr that this process reads while
    the daemon writes (seek(0), read()).  Opened O_APPEND: the daemon's
    descriptor shares the file's offset, so without it a line written just
    after a seek(0) lands at offset 0, over an earlier one (a test once
    missed the Coordinator's "metrics on" line, overwritten so)."""
    f = tempfile.TemporaryFile(mode="w+")
    fl = fcntl.fcntl(f.fileno(), fcntl.F_GETFL)
    fcntl.fcntl(f.fileno(), fcntl.F_SETFL, fl | os.O_APPEND)
    return f


def wait_until(pred, seconds, step=0.02):
    """pred()'s first true value within `seconds`, else its last value."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        v = pred()
        if v:
            return v
        time.sleep(step)
    return pred()


def wait_gone(pid, seconds):
    return wait_until(lambda: not alive(pid), seconds)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def plan_steps(manifest, world, batch, epoch=0, seed=0):
    """`datahelix plan --json`: per step, the ids of every rank."""
    p = run_dh("plan", "--manifest", manifest, "--world-size", world,
               "--batch-size", batch, "--epoch", epoch, "--seed", seed,
               "--json", check=True)
    return [json.loads(x)["ranks"] for x in p.stdout.splitlines()
            if '"ranks"' in x]


def plan_ids(manifest, world, batch, epoch=0, seed=0):
    """(per rank the ids it gets in step order, the steps)."""
    steps = plan_steps(manifest, world, batch, epoch, seed)
    return [[i for s in steps for i in s[r]] for r in range(world)], steps


def read_ids(path):
    return [int(x) for x in pathlib.Path(path).read_text().split()]


def assert_two_ranks_got_their_plans(manifest, out_dir, epochs, samples):
    """The ids a 2-rank job (batch 2) wrote to out_dir/ids0 and ids1
    (consume --ids-out): each rank its plan, in order, epoch by epoch, and
    every one of the `samples` ids once per epoch."""
    got = [read_ids(pathlib.Path(out_dir) / f"ids{r}") for r in range(2)]
    per = samples // 2  # ids of one rank in one epoch
    for ep in range(epochs):
        per_rank, _ = plan_ids(manifest, 2, 2, epoch=ep)
        mine = [g[per * ep:per * (ep + 1)] for g in got]
        assert mine == per_rank, ep
        assert sorted(mine[0] + mine[1]) == list(range(samples))
    assert all(len(g) == per * epochs for g in got)


def torchrun(nproc, script, out_dir, *args, port=None, timeout=300):
    """Runs `script` under `python3 -m torch.distributed.run` with `nproc`
    ranks on `port` (None: a free one), argv = [python/, *args, out_dir];
    each rank
    writes out_dir/rank{r}.json.  Those objects, rank order; a failed job
    fails the test with its stderr's tail."""
    p = subprocess.run(
        # --redirects/--tee 1: Debian's torch 1.13 on Python 3.11 cannot
        # parse its own default "0" (enum.Flag iteration changed in 3.11).
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node",
         str(nproc), "--redirects", "1", "--tee", "1", "--master_port",
         str(port or free_port()), str(script), str(ROOT / "python"),
         *map(str, args), str(out_dir)],
        capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, p.stderr[-3000:]
    return [json.loads((pathlib.Path(out_dir) / f"rank{r}.json").read_text())
            for r in range(nproc)]


def _recv_exact(s, n):
    b = b""
    while len(b) < n:
        c = s.recv(n - len(b))
        if not c:
            raise ConnectionError(f"peer closed after {len(b)} of {n} bytes")
        b += c
    return b


def zmtp_dealer(ipc_path, timeout=10):
    """A raw ZMTP 3.0 DEALER (NULL mechanism) connected to the ipc:// socket
    file `ipc_path`, for sending frames no well-behaved peer would (the
    tests have no ZeroMQ binding).  zmtp_send(sock, frames) sends one
    message."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    s.connect(str(ipc_path))
    s.sendall(b"\xff" + b"\0" * 8 + b"\x7f" + bytes([3, 0]) +
              b"NULL".ljust(20, b"\0") + b"\0" * 32)
    _recv_exact(s, 64)  # the peer's greeting
    body = b"\x05READY\x0bSocket-Type" + (6).to_bytes(4, "big") + b"DEALER"
    s.sendall(b"\x04" + bytes([len(body)]) + body)
    flags = _recv_exact(s, 1)[0]  # the peer's READY
    n = _recv_exact(s, 8 if flags & 0x02 else 1)
    _recv_exact(s, int.from_bytes(n, "big"))
    return s


def zmtp_send(s, frames):
    out = b""
    for i, f in enumerate(frames):
        more = 0x01 if i + 1 < len(frames) else 0
        if len(f) < 256:
            out += bytes([more]) + bytes([len(f)]) + f
        else:
            out += bytes([more | 0x02]) + len(f).to_bytes(8, "big") + f
    s.sendall(out)
