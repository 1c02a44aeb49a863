"""Shared fixtures for the integration tests: the built binary, a runner that
bounds every call in time, and a small generated data set shared by a session.
"""
import os
import pathlib
import shutil
import subprocess
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SHARED_DATA = ROOT.parent / "shared" / "data"


def _binary():
    b = os.environ.get("DATAHELIX_BIN", str(ROOT / "build" / "datahelix"))
    if not os.access(b, os.X_OK):
        pytest.exit(f"datahelix binary not found at {b}: run `make build` "
                    "first (or `make test`)", returncode=1)
    return b


@pytest.fixture(scope="session")
def dh_bin():
    return _binary()


def run_dh(*args, timeout=120, check=False, binary=None, **kw):
    """Runs `datahelix ARGS`, bounded in time; returns CompletedProcess."""
    cmd = [binary or _binary(), *map(str, args)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                       **kw)
    if check and p.returncode != 0:
        raise AssertionError(f"{cmd} exited {p.returncode}:\n{p.stderr}")
    return p


def stop_process(p, timeout=5):
    """Ends a process this test started: SIGTERM, then SIGKILL after
    `timeout` seconds; reaped either way."""
    if p.poll() is None:
        p.terminate()
    try:
        p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait(timeout=timeout)


def probed_set(d, profiles, count, seed, index=False):
    """gen-data COUNT clips of PROFILES into d/videos, probed into
    d/m.jsonl (and its index d/m.dhx with `index`); returns d."""
    run_dh("gen-data", "--out", d / "videos", "--profiles", profiles,
           "--count", count, "--seed", seed, check=True, timeout=300)
    run_dh("probe", "--out", d / "m.jsonl",
           *(("--index", d / "m.dhx") if index else ()), d / "videos",
           check=True)
    return d


@pytest.fixture(scope="session")
def gen_set(tmp_path_factory):
    """A small mixed S/M/L set with captions, made once per test session."""
    out = tmp_path_factory.mktemp("genset")
    run_dh("gen-data", "--out", out, "--profiles", "mixed", "--count", 6,
           "--seed", 7, "--captions", check=True, timeout=300)
    return out


@pytest.fixture(scope="session")
def shared_videos():
    d = SHARED_DATA / "videos"
    if not d.is_dir():
        pytest.skip(f"{d} not present (shared/ must sit beside the repo)")
    return d


@pytest.fixture(scope="session")
def ffprobe():
    exe = shutil.which("ffprobe")
    assert exe, "ffprobe missing: scripts/setup-deps.sh installs ffmpeg"
    return exe


def start_coordinator(sock, *args):
    """A `datahelix coordinator ARGS` listening on ipc socket `sock` (a
    path in a folder of the test's own), once its socket is there (at
    most 10 s); the caller ends it (stop_process)."""
    p = subprocess.Popen([_binary(), "coordinator", "--listen",
                          f"ipc://{sock}", *map(str, args)],
                         stderr=subprocess.DEVNULL)
    end = time.monotonic() + 10
    while not sock.exists() and time.monotonic() < end:
        time.sleep(0.01)
    return p


@pytest.fixture
def coordinator(tmp_path):
    """A `datahelix coordinator` on an ipc socket of this test's own; its
    address.  Ended by pid (SIGTERM, then SIGKILL) afterwards."""
    sock = tmp_path / "c.sock"
    p = start_coordinator(sock)
    yield f"ipc://{sock}"
    stop_process(p)
