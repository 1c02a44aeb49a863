"""The processes a loader needs besides itself: the `datahelix` binary, an
embedded Coordinator when the user names none, and the index of a JSONL
manifest.  Every process started here is ended by pid, and also ends on its
own if this process dies (`coordinator --exit-with-parent`; the local
DataServer watches its link, see docs/client.md).
"""
import hashlib
import itertools
import os
import shutil
import signal
import subprocess
import tempfile
import time
import weakref

from . import _C


def binary():
    """The `datahelix` program: $DATAHELIX_BIN, else the one a pip install
    put in the package (datahelix/bin/), else `datahelix` on PATH."""
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin",
                        "datahelix")
    b = (os.environ.get("DATAHELIX_BIN") or
         (here if os.access(here, os.X_OK) else None) or
         shutil.which("datahelix"))
    if not b or not os.access(b, os.X_OK):
        raise FileNotFoundError(
            "datahelix: the `datahelix` program was not found: install it "
            "(make install) or set DATAHELIX_BIN to its path")
    return b


def ensure_index(manifest):
    """Path of the .dhx index for `manifest` (.dhx, or a .jsonl table that
    is compiled beside it - or in a temporary folder if that one is not
    writable - when the index is missing or older than the table)."""
    manifest = os.fspath(manifest)
    if not os.path.exists(manifest):
        raise FileNotFoundError(f"datahelix: manifest {manifest} not found")
    if manifest.endswith(".dhx"):
        return manifest
    if not manifest.endswith(".jsonl"):
        raise ValueError(f"datahelix: manifest {manifest}: expected a .jsonl "
                         "descriptor table or a .dhx index")
    dhx = manifest[: -len(".jsonl")] + ".dhx"
    if not os.access(os.path.dirname(os.path.abspath(dhx)), os.W_OK):
        key = hashlib.sha1(os.path.abspath(manifest).encode()).hexdigest()
        dhx = os.path.join(tempfile.gettempdir(),
                           f"datahelix-{os.getuid()}-{key[:16]}.dhx")
    if (os.path.exists(dhx) and
            os.path.getmtime(dhx) >= os.path.getmtime(manifest)):
        return dhx
    # Several ranks may race here: each builds its own file, the renames
    # are atomic and the contents identical.
    tmp = f"{dhx}.tmp.{os.getpid()}"
    try:
        _C.build_index(manifest, tmp)
        os.replace(tmp, dhx)
    except _C.DataError as e:
        if "ids are not dense" not in str(e):
            raise
        # Not renumbered here: batch ids would then silently stop matching
        # the table's `id`s.  The command below writes the index this
        # function picks up next time (beside the table, newer than it).
        raise _C.DataError(f"{e}: run `datahelix index --renumber "
                           f"{manifest} -o {dhx}` (ids become positions in "
                           "file order; paths stay the stable key), then "
                           "open the loader again") from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return dhx


class Coordinator:
    """A `datahelix coordinator` started for this process."""

    def __init__(self, listen, policy, telemetry=None, timeout=10.0,
                 shared=False, keyfile=None):
        """shared: other ranks use it too, so it must outlive this process
        until they are done: it stops when no rank's local DataServer is
        left (they end with their ranks), not with this process."""
        self.listen = listen
        self.shared = shared
        cmd = [binary(), "coordinator", "--listen", listen, "--policy",
               policy, "--heartbeat-timeout-ms", "1000"]
        cmd += (["--exit-when-unused", "2000"] if shared
                else ["--exit-with-parent"])
        if telemetry:
            cmd += ["--telemetry", os.fspath(telemetry)]
        if keyfile:  # the path; the key never travels by value
            cmd += ["--keyfile", os.fspath(keyfile)]
        # Its own process group: a Ctrl-C reaches the training process,
        # which then closes this cleanly.
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE,
                                     start_new_session=True)
        if listen.startswith("ipc://"):
            path = listen[len("ipc://"):]
            end = time.monotonic() + timeout
            while not os.path.exists(path) and time.monotonic() < end:
                if self.proc.poll() is not None:
                    break
                time.sleep(0.005)
            if not os.path.exists(path):
                err = self._stop_and_read()
                raise RuntimeError(f"datahelix: the coordinator at {listen} "
                                   f"did not start: {err.strip()}")

    def _stop_and_read(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        try:
            return self.proc.stderr.read().decode(errors="replace")
        finally:
            self.proc.stderr.close()

    def stop(self):
        """Ends a private Coordinator now; a shared one is left to end
        when the last rank's DataServer is gone."""
        if self.proc is not None:
            if self.shared:
                self.proc.stderr.close()
            else:
                self._stop_and_read()
            self.proc = None


# Loaders of this process, counted in creation order (DataLoader and
# DistributedDataLoader alike).  Under torchrun every rank runs the same
# script, so the i-th loader of rank 0 and the i-th loader of rank 1 are
# the same loader: they agree on its Coordinator's port without talking.
_ordinals = itertools.count()


def loader_ordinal():
    """The next loader's ordinal in this process: 0, 1, 2, ... (never
    reused, so a loader created after another was closed does not meet
    the old one's Coordinator, which may linger for 2 s)."""
    return next(_ordinals)


def coordinator_address(rank, world_size, ordinal=0):
    """(address, whether this rank starts it) when the user gave none.

    One rank: a private ipc socket.  Several: $DATAHELIX_COORDINATOR if set
    (someone else runs it), else rank 0 serves the loader of ordinal i on
    MASTER_ADDR at MASTER_PORT + 1 + i (torchrun's rendezvous address, one
    port up per loader): each loader its own Coordinator, so requests of
    one never reach another's DataServers."""
    env = os.environ.get("DATAHELIX_COORDINATOR")
    if env:
        return env, False
    if world_size == 1:
        d = tempfile.mkdtemp(prefix="datahelix-")
        return f"ipc://{d}/coordinator.sock", True
    host = os.environ.get("MASTER_ADDR", "127.0.0.1")
    port = int(os.environ.get("MASTER_PORT", "29500")) + 1 + int(ordinal)
    if port > 65535:
        raise ValueError(
            f"datahelix: loader {ordinal} of this process would serve its "
            f"Coordinator on port {port} (MASTER_PORT + 1 + {ordinal}): "
            "pass coordinator= or set $DATAHELIX_COORDINATOR")
    if host == "localhost":
        host = "127.0.0.1"
    return f"tcp://{host}:{port}", rank == 0


# (coordinator address, rank) -> (the live loader of this process using
# it, or None once closed; what its tasks contain).  A Coordinator has no
# namespaces, and a client that registers a rank it already knows is taken
# for that rank's client restarted (after kill -9, to resume): it inherits
# the unfinished tasks.  So two live loaders on one (address, rank) would
# take each other's batches, and a later loader there inherits a closed
# one's tasks - harmless only if the same task id means the same samples.
_claims = {}


def claim_coordinator(addr, rank, owner, content=None):
    """Records that `owner` (a loader) uses `addr` as `rank`.  DataError if
    a live loader of this process already does, or if a closed one did
    whose tasks meant other samples (`content`: what names a task's
    samples - manifest digest and plan inputs; None: not compared)."""
    key = (addr, rank)
    ref, had = _claims.get(key, (None, None))
    other = ref() if ref is not None else None
    if other is not None and other is not owner:
        raise _C.DataError(
            f"datahelix: coordinator {addr} already serves rank {rank} of "
            "another loader of this process: one Coordinator serves one "
            "loader (a second one's requests would reach the first one's "
            "DataServer).  Give each loader its own: leave coordinator=None "
            "and $DATAHELIX_COORDINATOR unset (each loader then gets one), "
            "or pass a different coordinator= address to each")
    if other is None and None not in (had, content) and had != content:
        raise _C.DataError(
            f"datahelix: coordinator {addr} served rank {rank} of a loader "
            "of another manifest or plan earlier in this process; it takes "
            "a new client of that rank for the old one restarted and hands "
            "it the old one's unfinished tasks, which name other samples "
            "here.  One Coordinator serves one loader: give this one its "
            "own (coordinator=None, or another address)")
    _claims[key] = (weakref.ref(owner), content if content is not None
                    else had)
    return key


def release_coordinator(key):
    """The loader of `key` is closed; what its tasks meant is kept."""
    if key is not None and key in _claims:
        _claims[key] = (None, _claims[key][1])


class Closing:
    """A loader's lifetime: `with` closes it, and so does the garbage
    collector, quietly (close() must be idempotent)."""

    def close(self):
        raise NotImplementedError

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
