"""`datahelix-svc` (src/cli/main_svc.c): the coordinator, dataserver and
keygen commands linked without FFmpeg, which the Python loaders start
instead of `datahelix` for the processes that decode nothing (docs/python.md
"Start-up").  What it must keep: the commands' own behaviour, no FFmpeg
library among its needs (the reason it exists), and a clear refusal where
a command would decode media."""
import os
import pathlib
import subprocess
import time

import pytest

from conftest import _binary, probed_set, run_dh, stop_process


@pytest.fixture(scope="module")
def svc():
    p = pathlib.Path(_binary()).resolve().parent / "datahelix-svc"
    assert os.access(p, os.X_OK), f"{p} missing: `make build` makes it"
    return str(p)


def needed(path):
    p = subprocess.run(["readelf", "-d", path], capture_output=True,
                       text=True, timeout=30, check=True)
    return [line.split("[")[1].rstrip("]") for line in p.stdout.splitlines()
            if "(NEEDED)" in line]


def test_help_version_and_only_the_service_commands(svc):
    h = run_dh("--help", binary=svc, check=True)
    listed = [ln.split()[0] for ln in h.stdout.split("commands:\n")[1]
              .splitlines() if ln.strip()]
    assert listed == ["coordinator", "dataserver", "keygen"], h.stdout
    assert h.stdout.startswith("usage: datahelix-svc <command>")
    v = run_dh("--version", binary=svc, check=True)
    full = run_dh("--version", check=True)
    assert v.stdout.split()[1] == full.stdout.split()[1]
    for cmd in ("probe", "decode", "bench", "nonsense"):
        p = run_dh(cmd, binary=svc)
        assert p.returncode == 2 and p.stdout == ""
        assert f"datahelix: {cmd}: unknown command (see datahelix-svc " \
            "--help); media commands are `datahelix`'s" in p.stderr, \
            p.stderr
    # each command's own --help is the full program's
    for cmd in ("coordinator", "dataserver", "keygen"):
        a = run_dh(cmd, "--help", binary=svc, check=True)
        b = run_dh(cmd, "--help", check=True)
        assert a.stdout == b.stdout and a.stdout


def test_it_links_no_ffmpeg_and_the_full_program_does(svc):
    mine = needed(svc)
    assert mine and not [n for n in mine if n.startswith(
        ("libav", "libsw"))], mine
    assert "libzmq.so.5" in mine
    assert any(n.startswith("libavcodec") for n in needed(_binary()))


def test_keygen_writes_a_key_the_full_program_s_coordinator_takes(
        svc, tmp_path):
    key = tmp_path / "job.key"
    run_dh("keygen", key, binary=svc, check=True)
    assert (key.stat().st_mode & 0o777) == 0o600
    sock = tmp_path / "c.sock"
    p = subprocess.Popen([_binary(), "coordinator", "--listen",
                          f"ipc://{sock}", "--keyfile", str(key)],
                         stderr=subprocess.PIPE, text=True)
    try:
        end = time.monotonic() + 20
        while not sock.exists() and time.monotonic() < end \
                and p.poll() is None:
            time.sleep(0.02)
        assert sock.exists() and p.poll() is None
    finally:
        stop_process(p)


def test_a_video_dataserver_is_refused_at_its_start(svc, tmp_path,
                                                    coordinator):
    d = probed_set(tmp_path, "mixed", 2, 3, index=True)
    p = run_dh("dataserver", "--coordinator", coordinator, "--rank", 0,
               "--index", d / "m.dhx", "--client-socket",
               f"dh-test-{os.getpid()}-svc", binary=svc, timeout=60)
    assert p.returncode == 1, (p.returncode, p.stderr)
    assert "datahelix-svc decodes no media" in p.stderr and \
        "run `datahelix dataserver` for video" in p.stderr, p.stderr
