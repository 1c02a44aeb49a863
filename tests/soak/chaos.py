"""Chaos soak (issue 13 item 9): a 4-rank job with remote sidecars on two
other hosts (Linux network namespaces), while processes are killed with
SIGKILL at random, links flap, and corrupt clips sit in the manifest.

    /usr/bin/python3 tests/soak/chaos.py --seconds 600 [--seed S]
        [--kinds sidecar,dataserver,coordinator,link,worker] [--out DIR]

(`make soak SOAK_SECONDS=600`; CI runs a 60-second version through
tests/integration/test_chaos.py.)  Needs root for `ip netns`.

At the end it checks what the issue promises: every rank exits 0; per
epoch every planned sample is delivered exactly once or reported bad (a
corrupt clip, replaced by its reported substitute); nothing hung (every
wait here is bounded); the long-lived processes' RSS and open fds are flat;
no process of the job is left (in the namespaces or under us); nothing
new in /dev/shm.  It prints a table and writes DIR/chaos.json.

Kinds of chaos (each picked at random, one every 1.5-4 s):
  worker       kill -9 of a Python worker of rank 3 (a PyTorch loop over
               DataLoader(transform=...), tests/soak/py_rank.py)
  sidecar      kill -9 of a remote sidecar on B or C; a new one starts
  dataserver   kill -9 of a rank's local DataServer (its client restarts
               it; at most --max-restarts per rank)
  coordinator  kill -9 of the Coordinator; a new one on the same address
  link         host B's or C's link down for 0.5-2 s, then up

And all along, an insider (issue 36; build/dh_insider, on host C): a
process holding the job's key that registers as sidecar 150, answers
every other task placed on it with a forged "corrupt media" and never
answers the rest, and races sidecar 101 at the ranks' payload endpoints
(learnt from the Routes it gets) with forged payloads and payloads for
tasks nobody placed.  Nothing it does may lose, duplicate or fail a
sample (--no-insider leaves it out).
"""
import argparse
import collections
import json
import os
import pathlib
import random
import re
import signal
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "integration"))

from conftest import run_dh  # noqa: E402
from procs import FileProc, alive, children, descendants, plan_ids, \
    read_ids, shm_names, shm_residue, wait_until  # noqa: E402
from test_multihost import Hosts, ip, listening  # noqa: E402

KINDS = ("sidecar", "dataserver", "coordinator", "link", "worker")
RANKS = 4
BATCH = 2
CLIPS = 24
BAD = 2                         # corrupt clips in the manifest
PORT = 7500
REMOTE_IDS = {"B": 101, "C": 102}
INSIDER_ID = 150
SMALL = ["--frames", "4", "--size", "32x32"]
SUB_RE = re.compile(r"substituted: epoch (\d+) step (\d+) position \d+: "
                    r"sample (\d+) failed .* sample (\d+) delivered")
SKIP_RE = re.compile(r"skipped: rank (\d+) epoch (\d+) step (\d+):")


def log(msg):
    print(f"chaos: {msg}", file=sys.stderr, flush=True)


def make_data(d, seed):
    """CLIPS short clips, indexed; then BAD of them damaged on disk (the
    index still lists them, as a clip that rots after probing would be)."""
    run_dh("gen-data", "--out", d / "videos", "--profiles", "S", "--count",
           CLIPS, "--seed", seed, check=True, timeout=600)
    run_dh("probe", "--out", d / "m.jsonl", "--index", d / "m.dhx",
           d / "videos", check=True, timeout=600)
    rows = [json.loads(x) for x in (d / "m.jsonl").read_text().splitlines()
            if x.strip()]
    rows = [r for r in rows if "path" in r]
    rng = random.Random(seed)
    bad = sorted(rng.sample(range(len(rows)), BAD))
    for i in bad:
        p = pathlib.Path(rows[i]["path"])
        if not p.is_absolute():
            p = d / p
        data = p.read_bytes()
        # Keep the container's first KiB (it still opens), drop the rest:
        # no frame can be decoded.
        p.write_bytes(data[:1024])
    return d / "m.dhx", {rows[i].get("id", i) for i in bad}


class NsPython(FileProc):
    """`/usr/bin/python3 ARGS` inside namespace `ns`, output to files, as
    NsProc runs datahelix (the pid is the interpreter's)."""

    def __init__(self, ns, name, outdir, *args):
        super().__init__(["ip", "netns", "exec", ns, "/usr/bin/python3",
                          *args], name, outdir)


def proc_stats(pid):
    """(RSS KiB, open fds) of `pid`, or None."""
    try:
        rss = 0
        for line in pathlib.Path(f"/proc/{pid}/status").read_text() \
                .splitlines():
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
        fds = len(os.listdir(f"/proc/{pid}/fd"))
        return rss, fds
    except OSError:
        return None


class Job:
    """The cluster: Coordinator + ranks in A, sidecars in B and C."""

    def __init__(self, hosts, manifest, epochs, max_restarts, keyfile,
                 extra):
        self.h = hosts
        self.m = manifest
        self.coord = f"tcp://{hosts.addr['A']}:{PORT}"
        self.epochs = epochs
        self.max_restarts = max_restarts
        self.keyfile = keyfile
        # options every process of the job takes
        self.extra = ["--keyfile", keyfile, *extra]
        self.generation = collections.Counter()
        self.sidecars = {}
        self.c = None
        self.ranks = []
        self.python_rank = None

    def start_coordinator(self):
        n = self.generation["coordinator"]
        self.generation["coordinator"] += 1
        c = self.h.start("A", f"coordinator.{n}", "coordinator", "--listen",
                         self.coord, "--policy", "round-robin",
                         "--heartbeat-timeout-ms", 1000, *self.extra)
        if not (wait_until(lambda: listening(c.pid, PORT)
                           or c.p.poll() is not None, 15)
                and c.p.poll() is None):
            raise RuntimeError(f"coordinator did not start:\n{c.stderr()}")
        self.c = c

    def start_sidecar(self, host):
        n = self.generation[host]
        self.generation[host] += 1
        s = self.h.start(host, f"sidecar{host}.{n}", "dataserver", "--remote",
                         "--coordinator", self.coord, "--index", self.m,
                         "--workers", 1, "--server-id", REMOTE_IDS[host],
                         *self.extra)
        self.sidecars[host] = s

    def start_ranks(self, python_rank):
        """consume ranks; with python_rank the last one is a PyTorch loop
        (py_rank.py: DataLoader with transform=, on Python workers)."""
        for r in range(RANKS):
            if python_rank and r == RANKS - 1:
                p = NsPython(self.h.ns["A"], f"rank{r}", self.h.tmp,
                             HERE / "py_rank.py", HERE.parents[1] / "python",
                             self.m.with_suffix(".jsonl"), self.coord, r,
                             RANKS, BATCH, self.epochs, self.keyfile,
                             self.h.tmp / f"ids{r}")
                self.h.procs.append(p)
                self.ranks.append(p)
                self.python_rank = r
                continue
            self.ranks.append(self.h.start(
                "A", f"rank{r}", "consume", "--coordinator", self.coord,
                "--manifest", self.m, "--rank", r, "--world-size", RANKS,
                "--batch-size", BATCH, *SMALL, "--epochs", self.epochs,
                "--listen", f"tcp://{self.h.addr['A']}:0", "--json",
                "--on-error", "skip", "--window-ms", 100, "--prefetch", 2,
                "--ids-out", self.h.tmp / f"ids{r}", "--timeout-ms", 30000,
                "--max-restarts", self.max_restarts, *self.extra))

    def start_insider(self, seconds):
        """The key-holding insider on host C, for `seconds`."""
        path = pathlib.Path(os.environ.get("DATAHELIX_BIN", "build/x")) \
            .resolve().parent / "dh_insider"
        p = FileProc(["ip", "netns", "exec", self.h.ns["C"], path,
                      self.keyfile, self.coord, seconds, INSIDER_ID,
                      REMOTE_IDS["B"]], "insider", self.h.tmp)
        self.h.procs.append(p)
        return p

    def running(self):
        return [p for p in self.ranks if p.p.poll() is None]

    def local_server(self, rank):
        kids = children(self.ranks[rank].pid)
        for k in kids:
            if k not in self.h.extra_pids:
                self.h.extra_pids.append(k)
        return kids[0] if kids else None


def kill9(pid):
    try:
        os.kill(pid, signal.SIGKILL)
        return True
    except ProcessLookupError:
        return False


def chaos_loop(job, kinds, rng, deadline, counts, notes):
    """Until the ranks are done or the deadline: one act of chaos every
    1.5-4 s, every kind once first (in a random order; one that found
    nothing to act on is tried again later), then at random.  Returns when
    no rank runs any more."""
    restarts = collections.Counter()
    todo = list(kinds)
    rng.shuffle(todo)
    while job.running() and time.monotonic() < deadline:
        wait_until(lambda: not job.running(), rng.uniform(1.5, 4.0), 0.05)
        if not job.running():
            break
        kind = todo.pop() if todo else rng.choice(kinds)
        before = counts[kind]
        if kind == "sidecar":
            host = rng.choice("BC")
            s = job.sidecars[host]
            if kill9(s.pid):
                s.wait(5)
                counts["sidecar"] += 1
            time.sleep(rng.uniform(0.2, 1.0))
            job.start_sidecar(host)
        elif kind == "dataserver":
            live = [r for r in range(RANKS) if job.ranks[r].p.poll() is None
                    and restarts[r] < (2 if r == job.python_rank
                                       else job.max_restarts - 1)]
            r = rng.choice(live) if live else None
            pid = job.local_server(r) if live else None
            if pid and kill9(pid):
                restarts[r] += 1
                counts["dataserver"] += 1
        elif kind == "coordinator":
            if kill9(job.c.pid):
                job.c.wait(5)
                counts["coordinator"] += 1
            time.sleep(rng.uniform(0.2, 1.0))
            job.start_coordinator()
        elif kind == "worker":  # a Python worker of the Python rank
            ds = (job.local_server(job.python_rank)
                  if job.python_rank is not None else None)
            workers = children(ds) if ds else []
            if workers and kill9(rng.choice(workers)):
                counts["worker"] += 1
        elif kind == "link":
            host = rng.choice("BC")
            dev = f"v{host.lower()}"
            ns = job.h.ns["A"]
            ip("-n", ns, "link", "set", dev, "down")
            time.sleep(rng.uniform(0.5, 2.0))
            ip("-n", ns, "link", "set", dev, "up")
            counts["link"] += 1
        if counts[kind] == before == 0:
            todo.insert(0, kind)  # nothing to act on yet: once more later
        notes.append((round(time.monotonic(), 2), kind))


def check_delivery(job, bad, epochs):
    """Per rank, epoch and step: delivered == planned, except that every
    reported failure of a corrupt clip is replaced by its reported
    substitute; a step the rank reports skipped (every spare failed) loses
    its samples, which is only right for corrupt clips.  Returns
    (delivered, bad reports, lost, duplicated, problems)."""
    problems = []
    delivered = lost = dup = reported = 0
    plans = [plan_ids(job.m, RANKS, BATCH, epoch=ep)[1]
             for ep in range(epochs)]
    for r, p in enumerate(job.ranks):
        got = read_ids(job.h.tmp / f"ids{r}")
        subs = collections.defaultdict(list)
        skipped = set()
        for line in p.stderr().splitlines():
            m = SUB_RE.search(line)
            if m:
                subs[(int(m.group(1)), int(m.group(2)))].append(
                    (int(m.group(3)), int(m.group(4))))
            m = SKIP_RE.search(line)
            if m and int(m.group(1)) == r:
                skipped.add((int(m.group(2)), int(m.group(3))))
        off = 0
        for ep in range(epochs):
            for st, ranks in enumerate(plans[ep]):
                planned = ranks[r]
                if (ep, st) in skipped:
                    good = [i for i in planned if i not in bad]
                    if good:
                        lost += len(good)
                        problems.append(f"rank {r} epoch {ep} step {st}: "
                                        f"skipped, losing good samples "
                                        f"{good}")
                    continue
                want = collections.Counter(planned)
                for failed, sub in subs[(ep, st)]:
                    reported += 1
                    if failed not in bad:
                        problems.append(f"rank {r} epoch {ep} step {st}: "
                                        f"good sample {failed} reported "
                                        "failed")
                    want[failed] -= 1
                    want[sub] += 1
                have = collections.Counter(got[off:off + len(planned)])
                off += len(planned)
                delivered += sum(have.values())
                for i in set(want) | set(have):
                    if have[i] != want[i]:
                        if have[i] < want[i]:
                            lost += want[i] - have[i]
                        else:
                            dup += have[i] - want[i]
                        problems.append(
                            f"rank {r} epoch {ep} step {st}: sample {i} "
                            f"delivered {have[i]}x, want {want[i]}x")
        if off != len(got):
            problems.append(f"rank {r}: {len(got)} ids delivered, the plan "
                            f"(less skipped steps) has {off}")
    return delivered, reported, lost, dup, problems


def run(seconds, out, seed=0, kinds=KINDS, extra=(), insider=True):
    """The soak; returns its report (a dict).  Every process of the job
    holds the job's key (CURVE); `extra`: more options they all take;
    `insider`: the insider runs all along (see the top)."""
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    manifest, bad = make_data(out, seed)
    # The job's key: its Coordinator and payload endpoints bind on host
    # A's address, which is refused without one (docs/security.md).
    key = out / "job.key"
    if key.exists():
        key.unlink()
    run_dh("keygen", key, check=True)
    # ~0.3 s an epoch here (3 steps of 100 ms); enough epochs to outlast
    # the chaos window.
    epochs = max(2, int(seconds / 0.3))
    shm_before = shm_names()
    hosts = Hosts(out)
    counts = collections.Counter()
    notes = []
    report = {"seconds": seconds, "seed": seed, "kinds": list(kinds),
              "ranks": RANKS, "epochs": epochs, "bad_clips": sorted(bad)}
    problems = []
    t0 = time.monotonic()
    try:
        hosts.setup()
        job = Job(hosts, manifest, epochs, max_restarts=62, keyfile=key,
                  extra=extra)
        job.start_coordinator()
        for h in "BC":
            job.start_sidecar(h)
        ins = job.start_insider(seconds + 5) if insider else None
        job.start_ranks(python_rank="worker" in kinds)
        wait_until(lambda: all(job.local_server(r) for r in range(RANKS))
                   or not job.running(), 15)
        time.sleep(min(5.0, seconds / 10))  # warm: first RSS / fd sample
        first = {p.name: proc_stats(p.pid) for p in job.ranks}
        chaos_loop(job, list(kinds), rng, t0 + seconds, counts, notes)
        last = {p.name: proc_stats(p.pid) for p in job.running()}
        # The ranks finish their remaining epochs without more chaos.
        end = time.monotonic() + max(60.0, 1.5 * seconds)
        for p in job.ranks:
            rc = p.wait(max(0.1, end - time.monotonic()))
            if rc != 0:
                problems.append(f"{p.name} exit {rc}: "
                                f"{p.stderr()[-2000:]}")
        drift = {}
        for name, a in first.items():
            b = last.get(name)
            if a and b:
                drift[name] = {"rss_kib": b[0] - a[0], "fds": b[1] - a[1]}
                # Flat: allocator noise, not a leak per act of chaos.
                if b[0] - a[0] > 32 * 1024 or b[1] - a[1] > 8:
                    problems.append(f"{name}: RSS {a[0]} -> {b[0]} KiB, fds "
                                    f"{a[1]} -> {b[1]}")
        report["drift"] = drift
        if ins:
            ins.wait(30)
            report["insider"] = ins.stdout().strip()
        if not problems:
            d, rep, lost, dup, pr = check_delivery(job, bad, epochs)
            report.update(delivered=d, reported_bad=rep, lost=lost,
                          duplicated=dup)
            problems += pr
        kids = descendants(os.getpid())
        ours = [k for k in kids if alive(k)
                and not any(k == p.pid for p in hosts.procs)]
        if ours:
            problems.append(f"processes left under the soak: {ours}")
    finally:
        problems += hosts.teardown()
    report["kills"] = dict(counts)
    report["elapsed_s"] = round(time.monotonic() - t0, 1)
    new_shm = shm_residue(shm_before)
    if new_shm:
        problems.append(f"/dev/shm residue: {new_shm}")
    report["problems"] = problems
    report["events"] = notes
    (out / "chaos.json").write_text(json.dumps(report, indent=1))
    return report


def table(rep):
    k = rep.get("kills", {})
    rows = [("minutes", f"{rep['seconds'] / 60:.1f} "
             f"(elapsed {rep['elapsed_s']} s)"),
            ("ranks / epochs", f"{rep['ranks']} / {rep['epochs']}"),
            ("kills by kind", ", ".join(f"{n} {k.get(n, 0)}" for n in KINDS)),
            ("samples delivered", rep.get("delivered", "-")),
            ("reported bad (corrupt clips)", rep.get("reported_bad", "-")),
            ("lost / duplicated", f"{rep.get('lost', '-')} / "
             f"{rep.get('duplicated', '-')}"),
            ("RSS / fd drift (max over ranks)",
             "%s KiB / %s" % (max((d["rss_kib"] for d in
                                   rep.get("drift", {}).values()), default=0),
                              max((d["fds"] for d in
                                   rep.get("drift", {}).values()),
                                  default=0))),
            ("problems", len(rep["problems"]))]
    w = max(len(a) for a, _ in rows)
    return "\n".join(f"{a:<{w}}  {b}" for a, b in rows)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=600)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--kinds", default=",".join(KINDS),
                    help="comma-separated, of: " + ", ".join(KINDS))
    ap.add_argument("--no-insider", action="store_true",
                    help="leave the key-holding insider out")
    ap.add_argument("--out", default=None,
                    help="folder for data and logs (default: a temp dir)")
    a = ap.parse_args(argv)
    kinds = [k for k in a.kinds.split(",") if k]
    for k in kinds:
        if k not in KINDS:
            ap.error(f"unknown kind {k!r} (kinds: {', '.join(KINDS)})")
    if os.geteuid() != 0:
        print("chaos: needs root (ip netns add)", file=sys.stderr)
        return 2
    out = a.out or tempfile.mkdtemp(prefix="datahelix-chaos-")
    log(f"{a.seconds:.0f} s, kinds {','.join(kinds)}, logs in {out}")
    rep = run(a.seconds, out, a.seed, kinds, insider=not a.no_insider)
    print(table(rep))
    for p in rep["problems"]:
        print(f"problem: {p}")
    return 1 if rep["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
