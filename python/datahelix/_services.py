"""The processes a loader needs besides itself: the `datahelix` binary, an
embedded Coordinator when the user names none, and the index of a JSONL
manifest.  Every process started here is ended by pid, and also ends on its
own if this process dies (`coordinator --exit-with-parent`; the local
DataServer watches its link, see docs/client.md).
"""
import collections
import hashlib
import itertools
import logging
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import weakref

from . import _C
from ._log import LOGGER, env_level, line_level


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


def service_binary():
    """`datahelix-svc` beside binary(), else binary() itself: the program
    of the Coordinator and of a DistributedDataLoader's DataServer.  It has
    the same coordinator / dataserver / keygen commands, linked without
    FFmpeg (src/cli/main_svc.c), so that a start costs ~7 ms, not ~45
    (docs/python.md "Start-up"); a DataServer that decodes video runs
    binary()."""
    b = binary()
    svc = os.path.join(os.path.dirname(b), "datahelix-svc")
    return svc if os.access(svc, os.X_OK) else b


def _index_version(dhx):
    """The format version of the .dhx file `dhx` (0 when unreadable): one
    written by another build is compiled again from its table."""
    try:
        with open(dhx, "rb") as f:
            head = f.read(12)
    except OSError:
        return 0
    if len(head) < 12 or head[:8] != b"DHXINDEX":
        return 0
    return int.from_bytes(head[8:12], "little")


# What reads remote data needs (DataServers); the Coordinator never does.
STORAGE_SECRETS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                   "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN")


def without_storage_secrets(environ):
    """`environ` for a child that reads no remote data: no credentials."""
    return {k: v for k, v in environ.items() if k not in STORAGE_SECRETS}


def ensure_index(manifest):
    """Path of the .dhx index for `manifest` (.dhx, or a .jsonl table that
    is compiled beside it - or in a temporary folder if that one is not
    writable - when the index is missing or older than the table)."""
    manifest = os.fspath(manifest)
    if "://" in manifest:
        raise NotImplementedError(
            f"datahelix: manifest {manifest}: a table at a URL is not "
            "supported yet: the table is a local file, and its rows may "
            "name http(s):// objects and shards (`datahelix probe --out "
            "m.jsonl https://host/clip.mp4 ...` writes one)")
    if not os.path.exists(manifest):
        raise FileNotFoundError(f"datahelix: manifest {manifest} not found")
    if manifest.endswith(".dhx"):
        return manifest
    if not manifest.endswith(".jsonl"):
        what = ("a tar shard" if manifest.endswith(".tar") else
                "a folder" if os.path.isdir(manifest) else "not a table")
        raise ValueError(f"datahelix: manifest {manifest}: {what}; a loader "
                         "reads a .jsonl descriptor table or its .dhx index: "
                         f"run `datahelix probe --out m.jsonl {manifest}` "
                         "first and give it m.jsonl")
    dhx = manifest[: -len(".jsonl")] + ".dhx"
    if not os.access(os.path.dirname(os.path.abspath(dhx)), os.W_OK):
        key = hashlib.sha1(os.path.abspath(manifest).encode()).hexdigest()
        dhx = os.path.join(tempfile.gettempdir(),
                           f"datahelix-{os.getuid()}-{key[:16]}.dhx")
    if (os.path.exists(dhx) and
            os.path.getmtime(dhx) >= os.path.getmtime(manifest) and
            _index_version(dhx) == _C.INDEX_FORMAT_VERSION):
        return dhx
    # Several ranks may race here: each builds its own file, the renames
    # are atomic and the contents identical.
    tmp = f"{dhx}.tmp.{os.getpid()}"
    try:
        _C.build_index(manifest, tmp)
        os.replace(tmp, dhx)
    except _C.DataError as e:
        if ":1: missing field 'id'" in str(e) or \
                ":1: missing field 'kind'" in str(e):
            # a {"path", "text"} list (gen-data's captions.jsonl) given
            # where a probed table is wanted
            raise _C.DataError(
                f"{e}: {manifest} is not a descriptor table (a list of "
                "{\"path\", \"text\"}?): run `datahelix probe --out "
                f"table.jsonl {manifest}` first and give the loader "
                "table.jsonl") from None
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


class _Drain:
    """Reads a child's stderr to its end on a thread of its own, so that
    the child never blocks in write(2) on a full pipe: each line goes to
    this process's stderr with a prefix (at most BURST lines, then RATE a
    second; the lines left out are counted and said), and the last TAIL
    lines are kept for the error messages that name why it ended."""

    BURST, RATE, TAIL = 200, 20.0, 40

    def __init__(self, pipe, prefix, strip="", out=None):
        self.pipe, self.prefix, self.strip = pipe, prefix, strip
        self.out = out
        self.tail = collections.deque(maxlen=self.TAIL)
        self.lines = 0          # read
        self.dropped = 0        # not shown
        self._tokens, self._t = float(self.BURST), time.monotonic()
        self.thread = threading.Thread(target=self._run, daemon=True,
                                       name=f"datahelix-drain-{prefix}")
        self.thread.start()

    def _show(self, text):
        if self.out is None:  # the "datahelix" logger (_log.py)
            line = text.rstrip("\n")
            LOGGER.log(line_level(line), "%s", line)
            return
        try:
            self.out.write(text)
            self.out.flush()
        except (OSError, ValueError):  # our own stderr is gone: still read
            pass

    def _run(self):
        try:
            for raw in iter(self.pipe.readline, b""):
                line = raw.decode(errors="replace").rstrip("\n")
                if self.strip and line.startswith(self.strip):
                    line = line[len(self.strip):]
                self.lines += 1
                self.tail.append(line)
                now = time.monotonic()
                self._tokens = min(self.BURST, self._tokens +
                                   (now - self._t) * self.RATE)
                self._t = now
                if self._tokens < 1:
                    self.dropped += 1
                    continue
                self._tokens -= 1
                if self.dropped:
                    self._show(f"{self.prefix}: ({self.dropped} log lines "
                               "not shown: more than "
                               f"{self.RATE:g} a second)\n")
                    self.dropped = 0
                self._show(f"{self.prefix}: {line}\n")
        except (OSError, ValueError):
            pass
        finally:
            if self.dropped:
                self._show(f"{self.prefix}: ({self.dropped} log lines not "
                           "shown)\n")
            try:
                self.pipe.close()
            except OSError:
                pass

    def text(self, timeout=5.0):
        """The kept lines, once the child's stderr has ended (bounded)."""
        self.thread.join(timeout)
        return "\n".join(self.tail)


class PortInUse(RuntimeError):
    """The Coordinator could not bind: another process holds its port."""


# How long a DataServer may be silent before its Coordinator declares it
# dead and re-routes its tasks.  Heartbeats come every 500 ms, but a loaded
# node (a training node's normal state: load 12 on 2 cores was seen) delays
# them by seconds; a live server declared dead costs re-routes and noise.
DEFAULT_HEARTBEAT_TIMEOUT_MS = 3000


class Coordinator:
    """A `datahelix coordinator` started for this process, and restarted by
    it if it dies (docs/exactly-once.md "Restarts"): at most RESTARTS
    times, after a backoff that doubles from BACKOFF_S up to BACKOFF_MAX_S,
    each restart logged on stderr.  The new one listens on the same
    address; the clients and DataServers refill it themselves.  Each one's
    stderr is drained by a thread (_Drain): lines are shown with the prefix
    "datahelix: coordinator (pid N)", so that its log never fills a pipe
    and blocks it (issue 13 item 7)."""

    RESTARTS = 5
    BACKOFF_S = 0.1
    BACKOFF_MAX_S = 2.0

    def __init__(self, listen, policy, telemetry=None, timeout=10.0,
                 shared=False, keyfile=None, metrics_listen=None,
                 metrics_token_file=None,
                 heartbeat_timeout_ms=DEFAULT_HEARTBEAT_TIMEOUT_MS,
                 remove_at_exit=()):
        """shared: other ranks use it too, so it must outlive this process
        until they are done: it stops when no rank's local DataServer is
        left (they end with their ranks), not with this process.
        metrics_listen: HOST:PORT of its metrics endpoint (docs/metrics.md;
        port 0: any, see metrics_address); metrics_token_file: the bearer
        token that endpoint requires."""
        self.listen = listen
        self.shared = shared
        self.timeout = timeout
        self.restarts = 0
        cmd = [service_binary(), "coordinator", "--listen", listen, "--policy",
               policy, "--heartbeat-timeout-ms", str(int(heartbeat_timeout_ms))]
        cmd += (["--exit-when-unused", "2000"] if shared
                else ["--exit-with-parent"])
        if telemetry:  # (a restarted one writes the file anew)
            cmd += ["--telemetry", os.fspath(telemetry)]
        if keyfile:  # the path; the key never travels by value
            cmd += ["--keyfile", os.fspath(keyfile)]
        cmd += remove_args(remove_at_exit)
        if metrics_listen:
            cmd += ["--metrics-listen", str(metrics_listen)]
            if metrics_token_file:
                cmd += ["--metrics-token-file",
                        os.fspath(metrics_token_file)]
        elif metrics_token_file:
            raise ValueError("metrics_token_file= needs metrics_listen=")
        self.metrics_address = None  # HOST:PORT once serving
        self._cmd = cmd
        self._lock = threading.Lock()  # self.proc, self._closing
        self._closing = False
        self._bound = None  # from its "listening on" line
        self.proc = self._spawn()
        err = self._ready(self.proc)
        if err is None and metrics_listen:
            err = self._metrics_ready(self.proc)
        if err is not None:
            err = self._stop_and_read() or err
            kind = PortInUse if "in use" in err else RuntimeError
            raise kind(f"datahelix: the coordinator at {listen} "
                       f"did not start: {err.strip()}")
        # The endpoint it bound (port 0: the one it was given); a restart
        # binds that same one, so the ranks' clients find it again.
        self.listen = self._bound or listen
        self._cmd[self._cmd.index("--listen") + 1] = self.listen
        self._watcher = threading.Thread(
            target=self._watch, name="datahelix-coordinator-watch",
            daemon=True)
        self._watcher.start()

    def _spawn(self):
        # Its own process group: a Ctrl-C reaches the training process,
        # which then closes this cleanly.
        # At info at least, whatever $DATAHELIX_LOG says: _tcp_ready reads
        # its "listening on" line; the drain hands each line to the
        # "datahelix" logger, whose level is the user's.
        env = without_storage_secrets(os.environ)
        if env_level() > logging.INFO:
            env["DATAHELIX_LOG"] = "info"
        proc = subprocess.Popen(self._cmd, stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE,
                                start_new_session=True, env=env)
        proc.drain = _Drain(proc.stderr,
                            f"datahelix: coordinator (pid {proc.pid})",
                            strip="datahelix: coordinator: ")
        return proc

    def _ready(self, proc):
        """None once `proc` listens (an ipc socket file exists; a TCP one
        says "listening on" once bound), else why not, within
        self.timeout.  A TCP port someone else holds makes it exit: say so
        here, rather than let the ranks talk to that other process until
        their timeout."""
        if not self.listen.startswith("ipc://"):
            return self._tcp_ready(proc)
        path = self.listen[len("ipc://"):]
        end = time.monotonic() + self.timeout
        while not os.path.exists(path) and time.monotonic() < end:
            if proc.poll() is not None:
                break
            time.sleep(0.005)
        return None if os.path.exists(path) else "no socket file"

    def _tcp_ready(self, proc):
        end = time.monotonic() + self.timeout
        while time.monotonic() < end:
            for ln in list(proc.drain.tail):
                if "listening on " in ln:
                    self._bound = ln.split("listening on ", 1)[1].split()[0]
                    return None
            if proc.poll() is not None:
                proc.drain.text(1.0)  # its last lines say why
                return "it exited"
            time.sleep(0.005)
        return "it never said it was listening"

    def _metrics_ready(self, proc):
        """None once `proc` says where its metrics endpoint listens (its
        "metrics on http://ADDR/metrics" line), else why not (bounded)."""
        end = time.monotonic() + self.timeout
        while time.monotonic() < end:
            for line in list(proc.drain.tail):
                if line.startswith("metrics on http://"):
                    self.metrics_address = \
                        line.split("http://", 1)[1].split("/", 1)[0]
                    return None
            if proc.poll() is not None:
                return "it exited"
            time.sleep(0.005)
        return "no metrics endpoint"

    def _watch(self):
        """Restarts the Coordinator when it dies by a signal or fails (not
        when it ends cleanly: asked to, or every rank is gone)."""
        while True:
            with self._lock:
                proc = None if self._closing else self.proc
            if proc is None:
                return
            try:
                rc = proc.wait(timeout=0.1)
            except subprocess.TimeoutExpired:
                continue
            with self._lock:
                if self._closing:  # stop() ended it
                    return
            if rc == 0 or not self._restart(proc, rc):
                return

    def _restart(self, dead, rc):
        """Starts a new Coordinator on the same address after `dead` ended
        with `rc`; False once the restarts are used up or it is closing."""
        why = (f"killed by signal {-rc}" if rc < 0 else f"exit status {rc}")
        last = dead.drain.text().strip()
        last = last.splitlines()[-1] if last else ""
        while True:
            if self.restarts >= self.RESTARTS:
                LOGGER.error(
                    "datahelix: loader: error: the coordinator at %s ended "
                    "(%s) and its %d restarts are used up; its ranks will "
                    "time out", self.listen, why, self.RESTARTS)
                return False
            self.restarts += 1
            delay = min(self.BACKOFF_MAX_S,
                        self.BACKOFF_S * 2 ** (self.restarts - 1))
            said = f'; its last line: "{last}"' if last else ""
            LOGGER.warning(
                "datahelix: loader: warn: the coordinator at %s ended (%s%s); "
                "restarting it in %.1f s (restart %d of %d)", self.listen,
                why, said, delay, self.restarts, self.RESTARTS)
            time.sleep(delay)
            with self._lock:
                if self._closing:
                    return False
                try:
                    proc = self._spawn()
                except OSError as e:
                    why = f"could not start: {e}"
                    continue
                self.proc = proc
            self._ready(proc)  # bounded; a live one, even slow, will do
            if proc.poll() is None:
                if self.metrics_address is not None:  # (port 0: a new one)
                    self._metrics_ready(proc)
                return True
            rc = proc.wait()  # it exited at once: counts as a restart
            why = (f"killed by signal {-rc}" if rc < 0
                   else f"exit status {rc}")

    def _stop_and_read(self):
        with self._lock:
            self._closing = True
            proc = self.proc
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        return proc.drain.text()

    def kill(self):
        """Ends a private Coordinator at once (SIGKILL), so that what it
        would remove at a clean end (--remove-at-exit: the loader's key and
        socket folders) stays for the Coordinator that replaces it."""
        if self.proc is None:
            return
        with self._lock:
            self._closing = True
            proc = self.proc
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=5)
        proc.drain.text()
        self._watcher.join(timeout=5)
        self.proc = None

    def stop(self):
        """Ends a private Coordinator now; a shared one is left to end
        when the last rank's DataServer is gone (its stderr drained until
        then, or until this process ends: it ignores SIGPIPE)."""
        if self.proc is not None:
            if self.shared:
                with self._lock:
                    self._closing = True
            else:
                self._stop_and_read()
            self._watcher.join(timeout=5)
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


def remove_args(dirs):
    """`--remove-at-exit DIR` for each folder a loader made for its job
    (its key, its ipc socket, its transform files): the service that ends
    cleanly last removes them, so a kill -9 of the loader leaves none
    behind (issue 41; the services check the folder is one of ours)."""
    return [x for d in dirs if d for x in ("--remove-at-exit", os.fspath(d))]


def metrics_args(listen, token_file, coordinator, heartbeat_timeout=None):
    """The Coordinator() keywords of a loader's metrics_listen=,
    metrics_token_file= (docs/metrics.md) and heartbeat_timeout= (seconds),
    checked."""
    kw = {}
    if heartbeat_timeout is not None:
        if coordinator is not None:
            raise ValueError(
                f"heartbeat_timeout={heartbeat_timeout!r}: it sets the "
                "Coordinator this loader starts, and with "
                f"coordinator={coordinator!r} it starts none: run that one "
                "with `datahelix coordinator --heartbeat-timeout-ms MS`")
        if isinstance(heartbeat_timeout, bool) or \
                not isinstance(heartbeat_timeout, (int, float)) or \
                not 0.1 <= heartbeat_timeout <= 3600:
            raise ValueError(f"heartbeat_timeout={heartbeat_timeout!r}: "
                             "seconds, 0.1 to 3600 (default 3)")
        kw["heartbeat_timeout_ms"] = int(round(heartbeat_timeout * 1000))
    if token_file and not listen:
        raise ValueError("metrics_token_file= needs metrics_listen=")
    if listen and coordinator is not None:
        raise ValueError(
            f"metrics_listen={listen!r}: the endpoint is served by the "
            "Coordinator this loader starts, and with "
            f"coordinator={coordinator!r} it starts none: run that one with "
            "`datahelix coordinator --metrics-listen ADDR`")
    if not listen:
        return kw
    return dict(kw, metrics_listen=str(listen),
                metrics_token_file=token_file)


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


def _address_key(ordinal):
    return f"datahelix/coordinator/{ordinal}"


def serve_coordinator(addr, policy, world_size, ordinal, **kw):
    """Rank 0's Coordinator for the loader of `ordinal`, on `addr` (the
    default MASTER_PORT + 1 + ordinal) or - when another process holds
    that port and the job has a rendezvous store to tell the other ranks -
    on a port the system picks.  The address it serves is published in the
    store for the other ranks (find_coordinator)."""
    from ._jobkey import _store
    store = _store(world_size) if world_size > 1 else None
    try:
        coord = Coordinator(addr, policy, **kw)
    except PortInUse as e:
        if store is None or not addr.startswith("tcp://"):
            raise
        host = addr.rsplit(":", 1)[0]
        LOGGER.warning("datahelix: loader: warn: %s; serving the "
                       "Coordinator on a port of the system's choice "
                       "instead (the other ranks learn it from the "
                       "rendezvous store)", e)
        coord = Coordinator(f"{host}:0", policy, **kw)
    if store is not None:
        store.set(_address_key(ordinal), coord.listen)
    return coord


def find_coordinator(addr, world_size, ordinal):
    """For a rank other than 0 whose loader was given no coordinator: the
    address rank 0 serves the loader of `ordinal` on (what
    serve_coordinator published), else `addr` - when someone else runs
    the Coordinator ($DATAHELIX_COORDINATOR), or the job has no store
    (ranks started by hand: the default port, nothing to agree on)."""
    from ._jobkey import STORE_TIMEOUT_S, _store, store_wait_get
    if (world_size == 1 or os.environ.get("DATAHELIX_COORDINATOR") or
            not addr.startswith("tcp://")):
        return addr
    store = _store(world_size)
    if store is None:
        return addr
    try:
        return store_wait_get(store, _address_key(ordinal)).decode()
    except RuntimeError as e:
        raise TimeoutError(
            f"datahelix: rank 0 did not say within {STORE_TIMEOUT_S} s "
            f"where it serves the Coordinator of loader {ordinal} "
            f"(default {addr}): {e}") from e


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
