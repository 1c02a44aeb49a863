"""The job key of an embedded job (docs/security.md "Embedded jobs").

A loader that starts its own Coordinator also makes the job's CURVE key:
every process of the job (the Coordinator, each rank's client and local
DataServer) then authenticates with it and encrypts its traffic, and a
peer without it is refused.  The key lives in a 0600 file inside a 0700
private directory of this process, is handed to the children by path
(`--keyfile`, never by value on a command line or in an environment), and
is removed with that directory when the loader closes.  After a kill -9 the
directory stays behind, readable by this user only, holding the key of a
job that no longer runs.

One rank: made here with `datahelix keygen`.  Several ranks (torchrun):
rank 0 makes it and hands it to the others through the job's own
rendezvous, the torch.distributed store - the default process group's if
it is initialised, else torchrun's agent store on MASTER_ADDR:MASTER_PORT -
and the last rank to read it deletes it there.  Without either (ranks
started by hand) the key cannot be shared: a loopback MASTER_ADDR then
runs without one (DESIGN.md 9: loopback may), any other is refused.
"""
import os
import shutil
import tempfile
from datetime import timedelta

STORE_TIMEOUT_S = 120   # a rank waits this long for rank 0's key


def _loopback(host):
    return host in ("localhost", "::1") or host.startswith("127.")


def _store(world_size):
    """The job's rendezvous store, or None when there is none."""
    try:
        import torch.distributed as dist
    except ImportError:
        return None
    if dist.is_available() and dist.is_initialized():
        from torch.distributed import distributed_c10d as c10d
        return c10d._get_default_store()
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        # What torch.distributed's env:// init does under torchrun: a
        # client of the agent's store, under this restart's prefix.
        store = dist.TCPStore(
            os.environ.get("MASTER_ADDR", "127.0.0.1"),
            int(os.environ["MASTER_PORT"]), world_size, False,
            timedelta(seconds=STORE_TIMEOUT_S))
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        return dist.PrefixStore(f"/worker/attempt_{attempt}", store)
    return None


def store_wait_get(store, name):
    """store.get(name) once another rank has set it, waiting at most
    STORE_TIMEOUT_S (a store's own timeout may be 30 minutes); the store's
    RuntimeError when it is not set by then."""
    store.wait([name], timedelta(seconds=STORE_TIMEOUT_S))
    return store.get(name)


class JobKey:
    """A key file for one loader: `path` (None: the job runs without a
    key) and close(), which removes what was made here."""

    def __init__(self, path=None, owned_dir=None):
        self.path = path
        self._dir = owned_dir
        self._bytes = None
        self._handed = None  # hand_over(remove=False)'s folder

    @classmethod
    def resolve(cls, keyfile, embedded, rank, world_size, ordinal, binary,
                coordinator_addr):
        """The key of a loader: `keyfile`, else $DATAHELIX_KEYFILE, else
        - when the loader's own Coordinator serves the job (`embedded`) -
        one made for this job (shared through the store when world_size >
        1), else none."""
        given = keyfile or os.environ.get("DATAHELIX_KEYFILE") or None
        if given:
            return cls(os.fspath(given))
        if not embedded:
            return cls(None)
        d = tempfile.mkdtemp(prefix="datahelix-key-")  # 0700
        try:
            path = os.path.join(d, "job.key")
            if world_size == 1:
                _keygen(binary, path)
                return cls(path, d)
            store = _store(world_size)
            if store is None:
                host = os.environ.get("MASTER_ADDR", "127.0.0.1")
                shutil.rmtree(d, ignore_errors=True)
                if _loopback(host):
                    return cls(None)
                raise RuntimeError(
                    f"datahelix: rank {rank}: the Coordinator at "
                    f"{coordinator_addr} would be reachable from other hosts "
                    "without a job key, and there is no rendezvous store to "
                    "share one: run under torchrun, call torch.distributed."
                    "init_process_group() before creating the loader, or "
                    "give every rank the same key file (keyfile= or "
                    "$DATAHELIX_KEYFILE; datahelix keygen FILE)")
            name = f"datahelix/job-key/{ordinal}"
            if rank == 0:
                _keygen(binary, path)
                with open(path, "rb") as f:
                    store.set(name, f.read())
            else:
                _write_private(path, store_wait_get(store, name))
                # the last rank to read it takes it out of the store
                if store.add(name + "/read", 1) == world_size - 1:
                    try:
                        store.delete_key(name)
                    except (AttributeError, RuntimeError):
                        pass
            return cls(path, d)
        except BaseException:
            shutil.rmtree(d, ignore_errors=True)
            raise

    @property
    def owned_dir(self):
        """The folder made here for the key (None: the user's key, or
        none), which the services remove when they end cleanly."""
        return self._dir

    def copy_into(self, folder):
        """A copy of the key in `folder` (private, of a process that
        removes it when it ends: a DataServer's per-start folder), its
        path; the key as given when it is the user's (or None)."""
        if self._dir is None and self._bytes is None:
            return self.path
        if self._bytes is None:
            with open(self.path, "rb") as f:
                self._bytes = f.read()
        path = os.path.join(folder, "job.key")
        _write_private(path, self._bytes)
        return path

    def hand_over(self, remove):
        """The folder made here is removed now (`remove`), or left to
        whoever was told to remove it (a Coordinator's --remove-at-exit):
        copy_into() serves from memory from then on, so no folder of this
        loader's outlives a kill -9 of its process."""
        if self._dir is not None and self._bytes is None:
            with open(self.path, "rb") as f:
                self._bytes = f.read()
        if remove and self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
        elif self._dir is not None:
            self._handed = self._dir  # close() removes it if still there
        self._dir = None
        self.path = None

    def close(self):
        """Removes what was made here, a folder handed over included (its
        taker - a Coordinator - may have been killed)."""
        self._bytes = None
        if self._handed is not None:
            shutil.rmtree(self._handed, ignore_errors=True)
            self._handed = None
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
        self.path = None


def _keygen(binary, path):
    """A new job key at `path`, made in this process as `binary keygen`
    would make it (without the binary's start: about 65 ms here)."""
    from . import _C
    try:
        _C.keygen(path)
    except OSError as e:
        raise RuntimeError(str(e)) from e


def _write_private(path, data):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
                 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, data)
    finally:
        os.close(fd)
