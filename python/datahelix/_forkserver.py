"""A DistributedDataLoader's fork server (not a public module): how its
DataServer's Python workers start in milliseconds, as torch's forked
workers do, instead of as fresh interpreters that import torch (seconds).

The rank's process forks it (ForkServer) before it starts the DataServer,
so it holds torch, datahelix and the dataset (as the loader has it then)
already.  It takes one connection on a Unix socket in the loader's
private folder - the DataServer's, started with `--python-forkserver
SOCK` - and forks a worker for each request; the worker runs
datahelix._worker with the dataset it inherited (nothing is unpickled).
Protocol: src/runtime/forkserver.h.  It is single-threaded, and what it
does between forks is small: the workers' copy-on-write pages stay
shared.

Lifetime: it ends when the DataServer's connection closes (killing the
workers it forked first), when the rank's process has gone (its parent
changes; checked every second), or when nobody connects within
ACCEPT_S.  A worker dies with it (PR_SET_PDEATHSIG: it is single-
threaded, so the signal means the process).  The loader reaps it
(stop()).  A DataServer whose fork server is gone exec's its workers
(dataserver_python.c).
"""
import argparse
import ctypes
import gc
import os
import select
import signal
import socket
import stat
import sys
import time
import traceback

ACCEPT_S = 120.0  # the DataServer connects as it starts (PY_START_TIMEOUT_MS)
STOP_S = 2.0  # stop(): its own exit, after its DataServer's, then SIGKILL
END_S = 1.0  # its workers' own exits, once their DataServer has gone
MAX_MSG = 512
FDS = 4  # a request's: the worker's socket, the arena, stdout, stderr
_PR_SET_PDEATHSIG = 1
_available = None


def available():
    """Fork servers need os.fork, pidfds and SCM_RIGHTS from Python."""
    global _available
    if _available is None:
        try:
            os.close(os.pidfd_open(os.getpid()))
            _available = hasattr(socket, "send_fds") and hasattr(os, "fork")
        except (AttributeError, OSError):
            _available = False
    return _available


def _flush_std():
    for f in (sys.stdout, sys.stderr):
        try:
            f.flush()
        except (AttributeError, ValueError, OSError):
            pass


class Events:
    """What the fork server tells the rank's process on a pipe of their
    own: each worker it forks ("F wid pid") and how each ended ("X pid
    status", the waitpid status), so that the rank can name its workers'
    processes as torch's iterator does (`_workers`) although they are not
    its children.  Read without blocking; the pipe holds what was written
    after the fork server has gone."""

    def __init__(self, fd):
        self.fd = fd
        os.set_blocking(fd, False)
        self.pids = {}    # worker id -> its current process
        self.status = {}  # pid -> waitpid status
        self._buf = b""

    def poll(self, timeout=0.0):
        """Reads what has come (waiting up to `timeout` s for some)."""
        if self.fd is None:
            return
        if timeout > 0:
            select.select([self.fd], [], [], timeout)
        while True:
            try:
                b = os.read(self.fd, 65536)
            except BlockingIOError:
                break
            if not b:
                os.close(self.fd)
                self.fd = None
                break
            self._buf += b
        *lines, self._buf = self._buf.split(b"\n")
        for line in lines:
            p = line.split()
            if len(p) == 3 and p[0] == b"F":
                self.pids[int(p[1])] = int(p[2])
            elif len(p) == 3 and p[0] == b"X":
                self.status[int(p[1])] = int(p[2])

    def wait_workers(self, n, seconds):
        """True once n workers (ids 0..n-1) have been forked."""
        end = time.monotonic() + seconds
        while True:
            self.poll()
            if all(i in self.pids for i in range(n)):
                return True
            left = end - time.monotonic()
            if left <= 0 or self.fd is None:
                return False
            self.poll(min(left, 0.05))

    def __del__(self):
        if getattr(self, "fd", None) is not None:
            os.close(self.fd)
            self.fd = None


class ForkServer:
    """Forks the fork server (listening on `path`, a new name in a private
    folder) from this process.  `cfg`: the dataset file's contents, as
    datahelix._worker.load_config() would return them; `dataset`: that
    file's path, for the workers' messages.  `events`: what it says of
    its workers (Events)."""

    def __init__(self, path, cfg, dataset):
        self.path = path
        lst = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        r, w = os.pipe2(os.O_CLOEXEC)
        try:
            lst.bind(path)
            lst.listen(1)
            _flush_std()  # or the copies would write it again
            parent = os.getpid()
            self.pid = os.fork()
            if self.pid == 0:
                code = 1
                try:
                    os.close(r)
                    os.set_blocking(w, False)
                    code = _Zygote(lst, path, parent, cfg, dataset,
                                   w).run()
                except BaseException:
                    try:
                        traceback.print_exc()
                    except BaseException:
                        pass
                finally:
                    _flush_std()
                    os._exit(code)
        except BaseException:
            os.close(r)
            raise
        finally:
            lst.close()
            os.close(w)
        self.events = Events(r)

    def stop(self, grace=STOP_S):
        """Waits up to `grace` s for it to end, which it does once its
        DataServer has gone, then kills it; reaps it (bounded).  Its
        workers die with it."""
        if self.pid is None:
            return
        end = time.monotonic() + grace
        killed = False
        while True:
            try:
                pid, _ = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                break
            if pid:
                break
            if not killed and time.monotonic() >= end:
                os.kill(self.pid, signal.SIGKILL)
                killed = True
                end += STOP_S  # a SIGKILLed process exits at once
            elif killed and time.monotonic() >= end:
                break  # not ours to wait for any longer (never seen)
            time.sleep(0.005)
        self.pid = None
        try:
            os.unlink(self.path)
        except OSError:
            pass


def _die_with_parent(parent):
    """SIGKILL when the parent ends; exits at once if it already has."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # the socket's EOF ends it then
    if os.getppid() != parent:
        os._exit(0)


def _blank_inherited(keep):
    """The training process's sockets and pipes, copied by fork, point at
    /dev/null from now on: holding them would keep its connections (other
    loaders' DataServers, the Coordinator) from seeing EOF.  The numbers
    stay taken, so a Python object that still owns one closes /dev/null,
    not a descriptor opened here later.  Files and devices are kept, as in
    torch's forked workers."""
    null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    try:
        for name in os.listdir("/proc/self/fd"):
            fd = int(name)
            if fd in keep or fd == null:
                continue
            try:
                mode = os.fstat(fd).st_mode
            except OSError:
                continue  # the listing's own descriptor, now closed
            if stat.S_ISSOCK(mode) or stat.S_ISFIFO(mode):
                os.dup2(null, fd, inheritable=False)
    finally:
        os.close(null)


class _Zygote:
    def __init__(self, lst, path, parent, cfg, dataset, events):
        self.lst, self.path, self.parent = lst, path, parent
        self.cfg, self.dataset, self.events = cfg, dataset, events
        self.conn = None
        self.children = {}  # pidfd -> pid

    def run(self):
        # Ctrl-C reaches the whole process group: the rank handles it and
        # closes the loader; this process ends with its DataServer.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        for s in (signal.SIGTERM, signal.SIGCHLD, signal.SIGUSR1,
                  signal.SIGUSR2, signal.SIGHUP):
            signal.signal(s, signal.SIG_DFL)
        _blank_inherited({0, 1, 2, self.lst.fileno(), self.events})
        gc.freeze()  # the inherited objects: never collected, never copied
        if not self.accept():
            return 0
        try:
            while self.turn():
                pass
        finally:
            self.end_children()
        return 0

    def accept(self):
        end = time.monotonic() + ACCEPT_S
        self.lst.settimeout(1.0)
        try:
            while time.monotonic() < end and os.getppid() == self.parent:
                try:
                    conn, _ = self.lst.accept()
                except socket.timeout:
                    continue
                cred = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                       12)
                if int.from_bytes(cred[4:8], sys.byteorder) != os.getuid():
                    conn.close()  # the folder is private; still, refuse
                    continue
                conn.setblocking(True)
                self.conn = conn
                return True
            return False
        finally:
            self.lst.close()
            try:
                os.unlink(self.path)
            except OSError:
                pass

    def send(self, data, fds=()):
        """False if the DataServer has gone (then it is time to end)."""
        try:
            if fds:
                socket.send_fds(self.conn, [data], list(fds))
            else:
                self.conn.sendall(data)
            return True
        except OSError:
            return False

    def turn(self):
        """One wait: a request, a worker's exit, or a second passing.
        False once it is to end."""
        fds = [self.conn.fileno(), *self.children]
        ready, _, _ = select.select(fds, [], [], 1.0)
        if os.getppid() != self.parent:
            return False
        for fd in ready:
            if fd == self.conn.fileno():
                try:
                    msg, got, _, _ = socket.recv_fds(self.conn, MAX_MSG, 8)
                except OSError:
                    return False
                if not msg:
                    for f in got:
                        os.close(f)
                    return False  # the DataServer has gone
                if not self.request(msg, got):
                    return False
            else:
                pid = self.children.pop(fd)
                os.close(fd)
                _, status = os.waitpid(pid, 0)
                self.tell(b"X %d %d" % (pid, status))
                if not self.send(b"X %d %d" % (pid, status)):
                    return False
        return True

    def request(self, msg, fds):
        """Forks a worker for one request and answers it; False if the
        answer could not be sent."""
        try:
            parts = msg.split()
            if len(parts) != 6 or parts[0] != b"F" or len(fds) != FDS:
                raise ValueError(f"{len(parts)} fields, {len(fds)} "
                                 "descriptors")
            args = [int(x) for x in parts[1:]]
        except ValueError as e:
            for f in fds:
                os.close(f)
            return self.send(b"E malformed request: " +
                             str(e).encode()[:200])
        me = os.getpid()
        try:
            pid = os.fork()
        except OSError as e:
            for f in fds:
                os.close(f)
            return self.send(b"E fork: " + str(e).encode()[:200])
        if pid == 0:
            code = 1
            try:
                code = self.worker(me, fds, *args)
            except BaseException:
                traceback.print_exc()
            finally:
                _flush_std()
                os._exit(code)
        for f in fds:
            os.close(f)
        try:
            pidfd = os.pidfd_open(pid)
        except OSError as e:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return self.send(b"E pidfd_open: " + str(e).encode()[:200])
        self.children[pidfd] = pid
        self.tell(b"F %d %d" % (args[0], pid))
        return self.send(b"P %d" % pid, [pidfd])

    def tell(self, line):
        """To the rank's process (Events); dropped if its pipe is full."""
        try:
            os.write(self.events, line + b"\n")
        except OSError:
            pass

    def worker(self, zygote, fds, wid, n, seed, alloc_ms, server_id):
        """In the new worker: this process's own descriptors go, the
        request's take their places, and datahelix._worker runs."""
        _die_with_parent(zygote)
        self.conn.close()
        os.close(self.events)
        for f in self.children:
            os.close(f)
        sock, arena, out, err = fds
        os.dup2(out, 1)
        os.dup2(err, 2)
        os.close(out)
        os.close(err)
        # What it prints goes where an exec'd worker's would (the
        # DataServer's stdout and stderr), not to the objects the training
        # process had put in sys.stdout / sys.stderr.
        sys.stdout = open(1, "w", buffering=1, closefd=False)
        sys.stderr = open(2, "w", buffering=1, closefd=False,
                          errors="backslashreplace")
        signal.signal(signal.SIGINT, signal.default_int_handler)
        from . import _worker
        a = argparse.Namespace(fd=sock, arena_fd=arena, dataset=self.dataset,
                               worker_id=wid, num_workers=n, seed=seed,
                               alloc_timeout_ms=alloc_ms, server_id=server_id)
        return _worker.run(a, self.cfg)

    def end_children(self):
        """Its DataServer has gone, so each worker sees EOF and ends
        (exit 0, as torch's do at shutdown); those that have not within
        END_S are killed."""
        end = time.monotonic() + END_S
        while self.children and time.monotonic() < end:
            ready, _, _ = select.select(list(self.children), [], [],
                                        max(0.0, end - time.monotonic()))
            for fd in ready:
                self.reap(fd)
        for pidfd in list(self.children):
            try:
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            except OSError:
                pass
            self.reap(pidfd)

    def reap(self, pidfd):
        pid = self.children.pop(pidfd)
        try:
            _, status = os.waitpid(pid, 0)
            self.tell(b"X %d %d" % (pid, status))
        except ChildProcessError:
            pass
        os.close(pidfd)
