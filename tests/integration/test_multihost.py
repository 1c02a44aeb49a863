"""The data plane across hosts (DESIGN 7; issue 4 item 8), with Linux network
namespaces as hosts.

Host A (one namespace) runs the Coordinator and both ranks' consumers, each
with its local DataServer taking remote payloads on A's address; hosts B and
C (two more namespaces) each run a remote DataServer sidecar.  B and C reach
A over veth pairs plugged into a bridge in A, on a /24 the test assigns, so
remote payloads really cross a network interface, and nothing can leave the
namespaces (no other interface, no default route).  Every namespace, and
with it every link, is deleted at teardown, also after a failure.

Needs root (`ip netns add`); skipped otherwise, with the reason.  Every wait
is bounded; processes are ended by pid (SIGTERM, then SIGKILL).
"""
import itertools
import json
import os
import pathlib
import secrets
import signal
import subprocess
import time

import pytest

from conftest import run_dh, _binary
from procs import FileProc, alive, children, plan_ids, read_ids, wait_until

SMALL = ["--frames", "4", "--size", "32x32"]
PORT = 7500                     # free by construction: A is a fresh namespace
REMOTE_IDS = {"B": 101, "C": 102}
_RUN = itertools.count()


# ---- helpers ---------------------------------------------------------------

def ip(*args, check=True, timeout=20):
    p = subprocess.run(["ip", *map(str, args)], capture_output=True,
                       text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise RuntimeError(f"ip {' '.join(map(str, args))}: {p.stderr.strip()}")
    return p


def end_pid(pid, seconds=5):
    """SIGTERM, then SIGKILL after `seconds`; for pids we are not the parent
    of (a consumer's embedded server after its consumer died)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        if wait_until(lambda: not alive(pid), seconds):
            return


def read_jsonl(path):
    p = pathlib.Path(path)
    if not p.exists():
        return []
    text = p.read_text()
    if not text.endswith("\n"):  # a line still being written
        text = text[:text.rfind("\n") + 1]
    return [json.loads(x) for x in text.splitlines() if x.strip()]


class NsProc(FileProc):
    """`datahelix ARGS` inside namespace `ns`.  `ip netns exec` execs the
    command without forking, so the pid is datahelix's own.  Output goes to
    files (no pipe can fill up and stall the process)."""

    def __init__(self, ns, name, outdir, *args):
        super().__init__(["ip", "netns", "exec", ns, _binary(), *args], name,
                         outdir)


class Hosts:
    """Three namespaces A, B, C: a bridge in A with A's address, a veth pair
    from the bridge into B and into C, each with its address; loopback up
    everywhere, no default route anywhere."""

    def __init__(self, tmp):
        self.tmp = tmp
        tag = f"{os.getpid() % 100000}-{next(_RUN)}-{secrets.token_hex(2)}"
        self.ns = {h: f"dhmh-{tag}-{h}" for h in "ABC"}
        octet = (os.getpid() + 31 * next(_RUN)) % 250 + 2
        self.net = f"10.77.{octet}"
        self.addr = {"A": f"{self.net}.1", "B": f"{self.net}.2",
                     "C": f"{self.net}.3"}
        self.procs = []
        self.extra_pids = []      # embedded servers seen under consumers
        self.made = []

    def setup(self):
        for h in "ABC":
            p = ip("netns", "add", self.ns[h], check=False)
            if p.returncode != 0:
                if not self.made:
                    pytest.skip(f"`ip netns add` failed: {p.stderr.strip()}")
                raise RuntimeError(f"ip netns add {self.ns[h]}: {p.stderr}")
            self.made.append(self.ns[h])
        a = self.ns["A"]
        ip("-n", a, "link", "add", "br0", "type", "bridge")
        for h in "BC":
            # Made inside A with the peer created straight in B / C, so the
            # names never meet the root namespace's.
            ip("-n", a, "link", "add", f"v{h.lower()}", "type", "veth",
               "peer", "name", "eth0", "netns", self.ns[h])
            ip("-n", a, "link", "set", f"v{h.lower()}", "master", "br0")
            ip("-n", self.ns[h], "addr", "add", f"{self.addr[h]}/24", "dev",
               "eth0")
        ip("-n", a, "addr", "add", f"{self.addr['A']}/24", "dev", "br0")
        for h in "ABC":
            ip("-n", self.ns[h], "link", "set", "lo", "up")
        for dev in ("br0", "vb", "vc"):
            ip("-n", a, "link", "set", dev, "up")
        for h in "BC":
            ip("-n", self.ns[h], "link", "set", "eth0", "up")
        for h in "ABC":  # nothing can leave: no route beyond the /24
            routes = ip("-n", self.ns[h], "-4", "route", "show").stdout
            assert "default" not in routes, routes

    def start(self, host, name, *args):
        # Every process of the job holds its key (the Coordinator and the
        # DataServers bind routable addresses: refused without one).
        key = self.tmp / "job.key"
        if not key.exists():
            run_dh("keygen", key, check=True)
        p = NsProc(self.ns[host], name, self.tmp, args[0], "--keyfile", key,
                   *args[1:])
        self.procs.append(p)
        return p

    def tx_bytes(self, host):
        """Bytes sent by host B's / C's only interface."""
        out = ip("-j", "-s", "-n", self.ns[host], "link", "show", "dev",
                 "eth0").stdout
        return int(json.loads(out)[0]["stats64"]["tx"]["bytes"])

    def tcp_sent_to(self, host, addr, port):
        """Bytes host B / C sent on its established TCP connections to
        ADDR:PORT (`ss -ti`), or None if ss is missing."""
        try:
            p = subprocess.run(
                ["ip", "netns", "exec", self.ns[host], "ss", "-tinH",
                 "state", "established", "dst", f"{addr}:{port}"],
                capture_output=True, text=True, timeout=20)
        except FileNotFoundError:
            return None
        if p.returncode != 0:
            return None
        return sum(int(x.split(":")[1]) for x in p.stdout.split()
                   if x.startswith("bytes_sent:"))

    def ns_pids(self, host):
        p = ip("netns", "pids", self.ns[host], check=False)
        return [int(x) for x in p.stdout.split()] if p.returncode == 0 else []

    def teardown(self):
        problems = []
        for p in reversed(self.procs):  # consumers first, coordinator last
            try:
                p.stop()
            except Exception as e:  # keep tearing down
                problems.append(f"{p.name} {p.pid}: {e}")
        # Embedded servers stop with their consumer; give them a bound.
        for pid in self.extra_pids:
            if not wait_until(lambda: not alive(pid), 5):
                problems.append(f"embedded dataserver {pid} outlived its "
                                "consumer")
                end_pid(pid)
        # Anything else still inside our private namespaces is ours too.
        for ns in self.made:
            h = ns[-1]
            for pid in self.ns_pids(h):
                if alive(pid):
                    problems.append(f"pid {pid} still in namespace {ns}")
                    end_pid(pid)
        for ns in reversed(self.made):
            p = ip("netns", "del", ns, check=False)
            if p.returncode != 0:
                problems.append(f"ip netns del {ns}: {p.stderr.strip()}")
        left = ip("netns", "list", check=False).stdout
        for ns in self.made:
            if ns in left.split():
                problems.append(f"namespace {ns} still listed")
        return problems


@pytest.fixture(scope="module")
def netns_capable():
    """Skips the module, before any data is generated, unless this process
    may create network namespaces."""
    if os.geteuid() != 0:
        pytest.skip("needs root to create network namespaces (ip netns add)")
    name = f"dhmh-probe-{os.getpid()}-{secrets.token_hex(2)}"
    try:
        p = ip("netns", "add", name, check=False)
    except (OSError, subprocess.SubprocessError) as e:
        pytest.skip(f"`ip netns add` failed: {e}")
    if p.returncode != 0:
        pytest.skip(f"`ip netns add` failed: {p.stderr.strip()}")
    ip("netns", "del", name, check=False)


@pytest.fixture
def hosts(netns_capable, tmp_path):
    h = Hosts(tmp_path)
    try:
        h.setup()
        yield h
    finally:
        problems = h.teardown()
    assert not problems, problems


@pytest.fixture(scope="module")
def dataset(netns_capable, tmp_path_factory):
    """12 short S clips and their index (decoding them is quick)."""
    d = tmp_path_factory.mktemp("mh")
    run_dh("gen-data", "--out", d / "videos", "--profiles", "S", "--count",
           12, "--seed", 3, check=True, timeout=300)
    run_dh("probe", "--out", d / "m.jsonl", "--index", d / "m.dhx",
           d / "videos", check=True)
    return d


def listening(pid, port):
    """True once process `pid` has a TCP socket listening on `port` (read
    in its own network namespace, /proc/PID/net/tcp)."""
    try:
        lines = pathlib.Path(f"/proc/{pid}/net/tcp").read_text().splitlines()
    except OSError:
        return False
    want = f":{port:04X}"
    return any(f[1].endswith(want) and f[3] == "0A"
               for f in (x.split() for x in lines[1:]))


def start_cluster(hosts, manifest, coord_args=()):
    """Coordinator in A, remote sidecars in B and C (registered)."""
    coord = f"tcp://{hosts.addr['A']}:{PORT}"
    c = hosts.start("A", "coordinator", "coordinator", "--listen", coord,
                    "--policy", "round-robin", "--heartbeat-timeout-ms", 1000,
                    *coord_args)
    assert wait_until(lambda: listening(c.pid, PORT) or c.p.poll() is not None,
                      10) and c.p.poll() is None, c.stderr()
    remotes = {}
    for h in "BC":
        remotes[h] = hosts.start(h, f"remote{h}", "dataserver", "--remote",
                                 "--coordinator", coord, "--index", manifest,
                                 "--workers", 1, "--server-id", REMOTE_IDS[h])
    for h, r in remotes.items():
        assert wait_until(lambda: "registered" in r.stderr()
                          or r.p.poll() is not None, 15), r.stderr()
        assert r.p.poll() is None, r.stderr()
    return coord, c, remotes


def start_ranks(hosts, coord, manifest, *extra):
    ranks = []
    for r in range(2):
        ranks.append(hosts.start(
            "A", f"rank{r}", "consume", "--coordinator", coord, "--manifest",
            manifest, "--rank", r, "--world-size", 2, "--batch-size", 2,
            *SMALL, "--listen", f"tcp://{hosts.addr['A']}:0", "--json",
            "--ids-out", hosts.tmp / f"ids{r}", "--telemetry",
            hosts.tmp / f"tel{r}.jsonl", "--timeout-ms", 20000, *extra))
    return ranks


def steps_printed(proc):
    return [x for x in proc.stdout().splitlines() if x.startswith('{"epoch"')]


def note_embedded(hosts, ranks):
    """Remember each consumer's embedded server (ended at teardown if it
    outlives its consumer)."""
    for p in ranks:
        for pid in children(p.pid):
            if pid not in hosts.extra_pids:
                hosts.extra_pids.append(pid)


def finish(ranks, seconds=60):
    end = time.monotonic() + seconds
    for p in ranks:
        rc = p.wait(max(0.1, end - time.monotonic()))
        assert rc == 0, f"{p.name} exit {rc}:\n{p.stderr()}\n{p.stdout()}"


def check_exactly_once(hosts, manifest, epochs):
    want = [[], []]
    for ep in range(epochs):
        per_rank, _ = plan_ids(manifest, 2, 2, epoch=ep)
        for r in range(2):
            want[r].extend(per_rank[r])
    got = [read_ids(hosts.tmp / f"ids{r}") for r in range(2)]
    assert got == want  # each rank: the plan's ids, in its step order
    per_epoch = len(want[0]) // epochs
    for ep in range(epochs):  # every id of an epoch once across the ranks
        ids = got[0][ep * per_epoch:(ep + 1) * per_epoch] + \
            got[1][ep * per_epoch:(ep + 1) * per_epoch]
        assert sorted(ids) == list(range(12)), (ep, ids)


def remote_bytes(hosts):
    """Payload bytes the ranks' telemetry attributes to each remote server
    (one part per step: the step's cross_ds_bytes are its server's)."""
    by = {h: 0 for h in REMOTE_IDS}
    steps = {h: 0 for h in REMOTE_IDS}
    local = 0
    for r in range(2):
        for rec in read_jsonl(hosts.tmp / f"tel{r}.jsonl"):
            assert len(rec["servers"]) == 1, rec
            srv = rec["servers"][0]
            for h, sid in REMOTE_IDS.items():
                if srv == sid:
                    by[h] += rec["cross_ds_bytes"]
                    steps[h] += 1
                    assert rec["cross_ds_bytes"] > 0, rec
                    break
            else:
                assert srv == r + 1, rec  # the rank's own local server
                assert rec["cross_ds_bytes"] == 0, rec
                local += 1
    return by, steps, local


# ---- tests -----------------------------------------------------------------

def test_two_hosts_of_sidecars_serve_an_epoch_exactly_once(dataset, hosts):
    m = dataset / "m.dhx"
    coord, c, remotes = start_cluster(hosts, m)
    before = {h: hosts.tx_bytes(h) for h in "BC"}
    ranks = start_ranks(hosts, coord, m, "--epochs", 2)
    wait_until(lambda: all(children(p.pid) for p in ranks)
               or any(p.p.poll() is not None for p in ranks), 10)
    note_embedded(hosts, ranks)
    finish(ranks)
    after = {h: hosts.tx_bytes(h) for h in "BC"}
    to_coord = {h: hosts.tcp_sent_to(h, hosts.addr["A"], PORT) for h in "BC"}

    check_exactly_once(hosts, m, 2)
    by, steps, local = remote_bytes(hosts)
    assert steps["B"] + steps["C"] + local == 12
    for h in "BC":
        sent = after[h] - before[h]
        print(f"host {h}: {steps[h]} steps, payload {by[h]} B, "
              f"veth tx {sent} B, to the coordinator {to_coord[h]} B")
        # Round-robin over {the rank's local server, B, C}: every third
        # request goes to each remote.
        assert steps[h] >= 2 and by[h] > 0, (steps, by)
        # Those payloads left B / C through its veth: at least the
        # tensors' bytes, and not wildly more (framing, TCP/IP headers,
        # acks, heartbeats).
        assert sent >= by[h], (h, sent, by[h])
        assert sent < 1.5 * by[h] + 64 * 1024, (h, sent, by[h])
        # ... and went to the ranks' servers, not through the Coordinator
        # (heartbeats only: a few bytes each).
        if to_coord[h] is not None:
            assert 0 < to_coord[h] < min(by[h] // 4, 16 * 1024), \
                (h, to_coord[h], by[h])
    for h, r in remotes.items():
        assert r.p.poll() is None, r.stderr()
    assert c.p.poll() is None, c.stderr()


def test_kill9_of_a_remote_sidecar_mid_epoch(dataset, hosts):
    m = dataset / "m.dhx"
    coord, c, remotes = start_cluster(
        hosts, m, ("--telemetry", hosts.tmp / "decisions.jsonl"))
    ranks = start_ranks(hosts, coord, m, "--epochs", 2, "--window-ms", 300,
                        "--prefetch", 1)
    assert wait_until(lambda: steps_printed(ranks[0])
                      or ranks[0].p.poll() is not None, 30), \
        ranks[0].stderr()
    note_embedded(hosts, ranks)
    victim = remotes["B"]
    os.kill(victim.pid, signal.SIGKILL)
    t_kill = time.monotonic()
    assert victim.wait(5) == -signal.SIGKILL
    printed_at_kill = [len(steps_printed(p)) for p in ranks]
    finish(ranks)
    elapsed = time.monotonic() - t_kill

    check_exactly_once(hosts, m, 2)
    assert printed_at_kill[0] < 6, "the run was over before the kill"
    sid = REMOTE_IDS["B"]
    # The Coordinator noticed B's silence and said so (bounded).
    assert wait_until(lambda: any(
        f"server {sid} " in x and "declared dead" in x
        for x in c.stderr().splitlines()), 5), c.stderr()
    # Tasks placed on B after it died were placed again elsewhere.
    chosen = {}
    for d in read_jsonl(hosts.tmp / "decisions.jsonl"):
        chosen.setdefault(d["task"], []).append(d["chosen"])
    rerouted = [t for t, s in chosen.items() if len(s) > 1 and sid in s[:-1]]
    print(f"killed B after {printed_at_kill} steps; re-routed from B: "
          f"{len(rerouted)} tasks; ranks done {elapsed:.1f} s after the kill")
    assert rerouted, chosen
    assert all(chosen[t][-1] != sid for t in rerouted), chosen
    assert remotes["C"].p.poll() is None, remotes["C"].stderr()
    assert elapsed < 30, elapsed
