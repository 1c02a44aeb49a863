"""Authentication and encryption (issue 13 item 1, docs/security.md), as
processes: `datahelix keygen`, and a Coordinator, DataServers and consumers
that share a job key.

Peers without the key, with another job's key, or that are not ZeroMQ at
all are refused - by the Coordinator and by a DataServer's payload endpoint
- and each refusal is counted and logged with the peer's address, while the
job's own epoch beside them completes exactly once.  A bind other hosts
could reach is refused without a key and warned with --insecure; a key file
others can read is refused.  Servers bind loopback; every wait is bounded;
every process is ended by pid.
"""
import os
import re
import socket
import stat
import subprocess
import time

import sys

import pytest

from conftest import ROOT, run_dh, _binary
from procs import free_port, log_file, plan_ids, read_ids, torchrun, \
    wait_until

sys.path.insert(0, str(ROOT / "python"))
import datahelix  # noqa: E402

SMALL = ["--frames", "4", "--size", "32x32"]


class Proc:
    """A daemon of one test, stderr to a file (never a pipe that fills);
    ended by pid (SIGTERM, then SIGKILL)."""

    def __init__(self, *args, env=None):
        self.errf = log_file()
        self.p = subprocess.Popen([_binary(), *map(str, args)],
                                  stdin=subprocess.DEVNULL,
                                  stdout=subprocess.PIPE, stderr=self.errf,
                                  text=True, env=env)

    def err(self):
        self.errf.seek(0)
        return self.errf.read()

    def stop(self):
        if self.p.poll() is None:
            self.p.terminate()
            try:
                self.p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait(timeout=5)
        out = self.p.stdout.read()
        self.p.stdout.close()
        err = self.err()
        self.errf.close()
        return self.p.returncode, out, err


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    d = tmp_path_factory.mktemp("auth")
    run_dh("gen-data", "--out", d / "videos", "--profiles", "S", "--count",
           6, "--seed", 5, check=True, timeout=300)
    run_dh("probe", "--out", d / "m.jsonl", "--index", d / "m.dhx",
           "--frames", 4, "--size", "32x32", d / "videos", check=True)
    return d


def keygen(path):
    p = run_dh("keygen", path, check=True)
    assert "mode 0600" in p.stdout
    return path


def secret_of(path):
    return re.search(r"secret-key = (\S+)", path.read_text()).group(1)


# ---- key files -------------------------------------------------------------

def test_keygen_writes_an_owner_only_key_and_keeps_an_existing_one(tmp_path):
    k = keygen(tmp_path / "job.key")
    st = os.stat(k)
    assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == os.getuid()
    text = k.read_text()
    pub = re.search(r"public-key = (\S{40})\n", text).group(1)
    sec = secret_of(k)
    assert len(sec) == 40 and sec != pub
    assert sec not in run_dh("keygen", tmp_path / "b.key").stdout  # never
    p = run_dh("keygen", k)                      # printed, never replaced
    assert p.returncode == 1 and "already exists" in p.stderr
    assert k.read_text() == text
    run_dh("keygen", "--force", k, check=True)
    assert secret_of(k) != sec
    assert not [f for f in os.listdir(tmp_path) if ".tmp." in f]
    assert run_dh("keygen", "--help").returncode == 0
    assert run_dh("keygen").returncode == 2


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660])
def test_a_key_file_others_can_read_is_refused(dataset, tmp_path, mode):
    k = keygen(tmp_path / "job.key")
    os.chmod(k, mode)
    want = f"mode {mode:04o}"
    p = run_dh("coordinator", "--listen", f"tcp://127.0.0.1:{free_port()}",
               "--keyfile", k, timeout=20)
    assert p.returncode == 1 and str(k) in p.stderr and want in p.stderr, \
        p.stderr
    # the same through the environment, for a DataServer and a consumer
    env = dict(os.environ, DATAHELIX_KEYFILE=str(k))
    p = run_dh("dataserver", "--remote", "--coordinator",
               "tcp://127.0.0.1:9", "--index", dataset / "m.dhx",
               env=env, timeout=20)
    assert p.returncode == 1 and want in p.stderr, p.stderr
    p = run_dh("consume", "--coordinator", "tcp://127.0.0.1:9",
               "--manifest", dataset / "m.dhx", "--rank", 0, "--world-size",
               1, "--batch-size", 2, *SMALL, env=env, timeout=20)
    assert p.returncode == 1 and want in p.stderr, p.stderr
    os.chmod(k, 0o600)
    p = run_dh("coordinator", "--listen", f"tcp://127.0.0.1:{free_port()}",
               "--keyfile", tmp_path / "missing.key", timeout=20)
    assert p.returncode == 1 and "missing.key" in p.stderr, p.stderr


# ---- exposed binds -----------------------------------------------------------

@pytest.mark.parametrize("host", ["0.0.0.0", "*"])
def test_wildcard_bind_needs_a_key_or_insecure(dataset, tmp_path, host):
    port = free_port()
    addr = f"tcp://{host}:{port}"
    p = run_dh("coordinator", "--listen", addr, timeout=20)
    assert p.returncode == 1, p.stderr
    assert f"refusing to listen on {addr} without a key" in p.stderr
    assert "--insecure" in p.stderr and "--keyfile" in p.stderr

    for extra, warned in ((["--insecure"], True),
                          (["--keyfile", keygen(tmp_path / "k")], False)):
        c = Proc("coordinator", "--listen", addr, *extra)
        try:
            assert wait_until(lambda: "listening on" in c.err()
                              or c.p.poll() is not None, 10), c.err()
            assert c.p.poll() is None, c.err()
        finally:
            rc, _, err = c.stop()
        assert rc == 0, err
        assert (": warn: listening on" in err) == warned, err
        if warned:
            assert f"listening on {addr} without authentication" in err
            assert "owns this job" in err

    # a DataServer's payload endpoint alike
    p = run_dh("dataserver", "--coordinator", "tcp://127.0.0.1:9", "--rank",
               0, "--index", dataset / "m.dhx", "--listen", addr,
               "--advertise", f"tcp://127.0.0.1:{port}", timeout=20)
    assert p.returncode == 1
    assert f"refusing to listen on {addr}" in p.stderr, p.stderr


# ---- strangers beside a job ------------------------------------------------

# A ZeroMQ 3.0 greeting for the NULL mechanism: a peer with no key at all.
NULL_GREETING = (b"\xff" + b"\0" * 8 + b"\x7f" + b"\x03\x00" +
                 b"NULL".ljust(20, b"\0") + b"\0" + b"\0" * 31)


def poke(port, data):
    """A raw TCP peer: connects, sends `data`, reads what comes back until
    the server hangs up (bounded)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        # the server reads a peer's address when it accepts the
        # connection: a peer gone within microseconds is logged as "?"
        time.sleep(0.2)
        s.sendall(data)
        s.settimeout(5)
        try:
            while s.recv(4096):
                pass
        except (socket.timeout, ConnectionResetError):
            pass


def test_strangers_are_refused_while_the_job_completes(dataset, tmp_path):
    m = dataset / "m.dhx"
    key, other = keygen(tmp_path / "job.key"), keygen(tmp_path / "other.key")
    port, pay = free_port(), free_port()
    coord = f"tcp://127.0.0.1:{port}"
    co = Proc("coordinator", "--listen", coord, "--keyfile", key,
              "--policy", "round-robin", "--heartbeat-timeout-ms", 1000)
    procs = [co]
    try:
        assert wait_until(lambda: "listening on" in co.err(), 10), co.err()
        assert "CURVE" in co.err()
        # the job's sidecar, and a sidecar and a rank-0 impostor of others
        side = Proc("dataserver", "--remote", "--coordinator", coord,
                    "--index", m, "--workers", 1, "--server-id", 101,
                    "--keyfile", key)
        fake_side = Proc("dataserver", "--remote", "--coordinator", coord,
                         "--index", m, "--workers", 1, "--server-id", 102,
                         "--keyfile", other)
        fake_local = Proc("dataserver", "--coordinator", coord, "--rank", 0,
                          "--index", m, "--server-id", 1)
        procs += [side, fake_side, fake_local]
        assert wait_until(lambda: "registered" in side.err(), 15), side.err()

        job = subprocess.Popen(
            [_binary(), "consume", "--coordinator", coord, "--manifest",
             str(m), "--rank", "0", "--world-size", "1", "--batch-size", "2",
             *SMALL, "--epochs", "3", "--window-ms", "150", "--listen",
             f"tcp://127.0.0.1:{pay}", "--keyfile", str(key), "--ids-out",
             str(tmp_path / "ids"), "--telemetry", str(tmp_path / "tel"),
             "--json"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            line = job.stdout.readline()  # the first step: it is running
            assert line.startswith('{"epoch"'), line
            # no ZeroMQ at all, and ZeroMQ without a key, at the rank's
            # payload endpoint and at the Coordinator
            for target in (pay, port):
                poke(target, b"GET / HTTP/1.0\r\n\r\n" * 4)
                poke(target, NULL_GREETING)
            # clients without the key / with another job's key
            for extra in ([], ["--keyfile", str(other)]):
                p = run_dh("consume", "--coordinator", coord, "--manifest",
                           m, "--rank", 0, "--world-size", 1,
                           "--batch-size", 2, *SMALL, "--start-timeout-ms",
                           1500, *extra, timeout=60)
                assert p.returncode == 1, p.stderr
                assert "did not answer" in p.stderr, p.stderr
            out, err = job.communicate(timeout=120)
        finally:
            if job.poll() is None:
                job.kill()
                job.wait(timeout=5)
        assert job.returncode == 0, err
        want, _ = plan_ids(m, 1, 2, epoch=0)
        ids = read_ids(tmp_path / "ids")
        assert len(ids) == 3 * len(want[0])
        for ep in range(3):  # every epoch once, in plan order
            got = ids[ep * 6:(ep + 1) * 6]
            assert got == plan_ids(m, 1, 2, epoch=ep)[0][0]
        # the job's sidecar took part, over the keyed payload endpoint
        assert '"servers":[101]' in (tmp_path / "tel").read_text()
        # the rank's DataServer refused and logged the keyless ZeroMQ peer
        # (a peer that does not speak ZMTP 3 is dropped by ZeroMQ before
        # any event: never delivered, not always counted)
        refused = re.findall(r"dataserver: warn: refused a peer from "
                             r"(?:127\.0\.0\.1:\d+|\?): .* \((\d+) refused",
                             err)
        assert refused, err
        assert "registered" not in fake_side.err()
        assert "registered" not in fake_local.err()
    finally:
        results = {id(p): p.stop() for p in procs}
    cerr = results[id(co)][2]
    # (a peer gone before its address was read is logged as "?": zap.c)
    n = re.findall(r"coordinator: warn: refused a peer from "
                   r"(?:127\.0\.0\.1(?::\d+)?|\?):"
                   r" .* \((\d+) refused so far\)", cerr)
    # two clients, two servers, a keyless ZeroMQ peer: five at least, each
    # attempt of a retrying peer counted; the log stops after a burst per
    # 10 s
    assert n and int(n[-1]) >= 5, cerr
    assert len(n) <= 5 + 5 * 12, cerr


def test_keyed_two_ranks_with_a_striped_sidecar_deliver_exactly_once(
        dataset, tmp_path):
    """The cost-of-security fix on the real path (docs/dataserver.md
    "Striped payloads"): a keyed 2-rank job whose sidecar cuts each batch
    (2 x 4 frames at 256x256, 1.5 MiB) into 3 parts over 3 CURVE
    connections; every rank gets every sample of its plan exactly once, in
    order, the sidecar's batches went as parts, and the ranks' DataServers
    put them back together without one refused message."""
    m = dataset / "m.dhx"
    key = keygen(tmp_path / "job.key")
    port = free_port()
    coord = f"tcp://127.0.0.1:{port}"
    env = dict(os.environ, DATAHELIX_PAYLOAD_STRIPES="3")
    co = Proc("coordinator", "--listen", coord, "--keyfile", key,
              "--policy", "round-robin", "--heartbeat-timeout-ms", 2000)
    procs, jobs = [co], []
    try:
        assert wait_until(lambda: "listening on" in co.err(), 10), co.err()
        side = Proc("dataserver", "--remote", "--coordinator", coord,
                    "--index", m, "--workers", 1, "--server-id", 101,
                    "--keyfile", key, "--payload-stripes", 3)
        procs.append(side)
        assert wait_until(lambda: "registered" in side.err(), 15), side.err()
        for r in range(2):
            jobs.append(subprocess.Popen(
                [_binary(), "consume", "--coordinator", coord, "--manifest",
                 str(m), "--rank", str(r), "--world-size", "2",
                 "--batch-size", "2", "--frames", "4", "--size", "256x256",
                 "--epochs", "2", "--listen", f"tcp://127.0.0.1:{free_port()}",
                 "--keyfile", str(key), "--ids-out", str(tmp_path / f"ids{r}"),
                 "--telemetry", str(tmp_path / f"tel{r}"), "--json"],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                env=env))
        outs = [j.communicate(timeout=240) for j in jobs]
    finally:
        for j in jobs:
            if j.poll() is None:
                j.kill()
                j.wait(timeout=5)
        results = {id(p): p.stop() for p in procs}
    for j, (out, err) in zip(jobs, outs):
        assert j.returncode == 0, err
        assert "malformed" not in err.replace("0 malformed", ""), err
    for r in range(2):  # each epoch's plan, once, in order
        want = [i for ep in range(2) for i in plan_ids(m, 2, 2, epoch=ep)[0][r]]
        assert read_ids(tmp_path / f"ids{r}") == want
    tel = "".join((tmp_path / f"tel{r}").read_text() for r in range(2))
    assert '"servers":[101]' in tel  # the sidecar took part
    serr = results[id(side)][2]
    sent = re.search(r"remote server 101 forwarded (\d+) batches \((\d+) "
                     r"bytes; (\d+) payload parts\)", serr)
    assert sent, serr
    batches, nbytes, parts = map(int, sent.groups())
    assert batches >= 1 and parts == 3 * batches, serr
    assert nbytes == batches * 2 * 4 * 256 * 256 * 3
    took = [re.search(r"took (\d+) payloads from remote servers \((\d+) "
                      r"bytes; (\d+) payload parts\), 0 malformed", e)
            for _, e in outs]
    assert all(took), [e[-2000:] for _, e in outs]
    assert sum(int(t.group(1)) for t in took) == batches
    assert sum(int(t.group(3)) for t in took) == parts


# ---- embedded jobs: the key made per job, shared through the store ---------

TORCHRUN_SCRIPT = r'''
import json, os, re, stat, subprocess, sys
sys.path.insert(0, sys.argv[1])
sys.path.insert(0, sys.argv[3])
import datahelix
from procs import descendants

rank = int(os.environ["RANK"])
loader = datahelix.DataLoader(sys.argv[2], batch_size=1, frames=4,
                              size=(32, 32))
it = iter(loader)
ids = next(it)["ids"].tolist()
key = loader._key.path
text = open(key).read()
secret = re.search(r"secret-key = (\S+)", text).group(1)
st, dst = os.stat(key), os.stat(os.path.dirname(key))
seen = {"cmdline": [], "environ": []}
# no process of this rank (its DataServer, rank 0: the Coordinator) holds
# the key by value on its command line or in its environment
for pid in descendants(os.getpid()):
    for what in ("cmdline", "environ"):
        try:
            data = open(f"/proc/{pid}/{what}", "rb").read().decode(
                errors="replace")
        except OSError:
            continue
        seen[what].append(secret in data)
cmdlines = []
for pid in descendants(os.getpid()):
    try:
        cmdlines.append(open(f"/proc/{pid}/cmdline", "rb").read()
                        .decode(errors="replace").split("\0"))
    except OSError:
        pass
stranger = None
if rank == 0:
    # a client without the key at the job's Coordinator: refused
    p = subprocess.run([os.environ["DATAHELIX_BIN"], "consume",
                        "--coordinator", loader._client_addr, "--manifest",
                        loader.index_path, "--rank", "0", "--world-size",
                        "2", "--batch-size", "1", "--frames", "4", "--size",
                        "32x32", "--start-timeout-ms", "1500"],
                       capture_output=True, text=True, timeout=60)
    stranger = [p.returncode, p.stderr[-300:]]
for b in it:
    ids += b["ids"].tolist()
loader.close()
out = {"rank": rank, "ids": ids, "addr": loader._client_addr,
       "public": re.search(r"public-key = (\S+)", text).group(1),
       "mode": stat.S_IMODE(st.st_mode), "dir_mode": stat.S_IMODE(dst.st_mode),
       "owner": st.st_uid == os.getuid(), "gone": not os.path.exists(key),
       "dir_gone": not os.path.exists(os.path.dirname(key)),
       "seen": seen, "stranger": stranger,
       "keyfile_args": [c[c.index("--keyfile") + 1] if "--keyfile" in c
                        else None for c in cmdlines if "datahelix" in c[0]
                        or c[0].endswith("datahelix")]}
with open(os.path.join(sys.argv[4], f"rank{rank}.json"), "w") as f:
    json.dump(out, f)
'''


def test_torchrun_ranks_share_a_key_made_per_job(dataset, tmp_path):
    m = dataset / "m.jsonl"
    datahelix.DataLoader(m, batch_size=1, frames=4, size=(32, 32)).close()
    script = tmp_path / "train.py"
    script.write_text(TORCHRUN_SCRIPT)
    res = torchrun(2, script, tmp_path, m, ROOT / "tests" / "integration",
                   timeout=240)
    r0, r1 = res
    assert r0["addr"].startswith("tcp://127.0.0.1:")  # MASTER_ADDR, keyed
    assert r0["public"] == r1["public"]                # one key, shared
    for r in res:
        assert r["mode"] == 0o600 and r["dir_mode"] == 0o700 and r["owner"]
        assert r["gone"] and r["dir_gone"]             # removed at close
        assert r["seen"]["cmdline"] and not any(r["seen"]["cmdline"])
        assert not any(r["seen"]["environ"])
        assert r["keyfile_args"] and all(r["keyfile_args"]), r
    assert r0["stranger"][0] == 1 and "did not answer" in r0["stranger"][1]
    assert sorted(r0["ids"] + r1["ids"]) == sorted(set(r0["ids"] +
                                                       r1["ids"]))
    assert len(r0["ids"]) == len(r1["ids"]) > 0


def test_single_process_loader_makes_and_removes_a_private_key(dataset):
    m = dataset / "m.jsonl"
    with datahelix.DataLoader(m, batch_size=2, frames=4,
                              size=(32, 32)) as loader:
        n = sum(1 for _ in loader)
        key = loader._key.path
        assert key and os.stat(key).st_mode & 0o777 == 0o600
        assert os.stat(os.path.dirname(key)).st_mode & 0o777 == 0o700
    assert n == 3 and not os.path.exists(key)
    # the user's key file, given, is used as is and left in place
    k = keygen(dataset / "mine.key")
    with datahelix.DataLoader(m, batch_size=2, frames=4, size=(32, 32),
                              keyfile=k) as loader:
        assert sum(1 for _ in loader) == 3
        assert loader._key.path == str(k)
    assert k.exists()
    os.chmod(k, 0o644)  # and refused if others can read it
    with pytest.raises(Exception, match="mode 0644"):
        with datahelix.DataLoader(m, batch_size=2, frames=4, size=(32, 32),
                                  keyfile=k) as loader:
            next(iter(loader))
    k.unlink()
