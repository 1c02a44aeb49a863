"""The processes of a run: each system's rank processes and the services
they use (a Coordinator for the datahelix rungs, a Dask LocalCluster for
the pool), started here, watched with bounded waits, and ended by pid,
each one by itself (SIGTERM, then SIGKILL after a grace period): never by
name, so that nothing else on the machine is touched.

A rank that fails makes its peers' all-reduce fail too; root_cause()
names the rank whose log is not such an echo.  Everything a system's
ranks started (DataLoader workers, DataServers) is noted while it runs
(note_descendants) and ended before the next system starts, so that
nothing runs into the next measurement.
"""
import json
import os
import pathlib
import re
import signal
import socket
import subprocess
import sys
import time

from .common import ablation_of, log


def pin_cpus(n):
    """Confines this process (and so every child) to n CPUs when the
    machine has more; returns the CPUs used."""
    have = sorted(os.sched_getaffinity(0))
    if n < len(have):
        os.sched_setaffinity(0, have[:n])
        return have[:n]
    return have


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_port_pair():
    """p such that p and p + 1 are both free now (MASTER_PORT and the
    datahelix convention of a Coordinator one port up)."""
    for _ in range(64):
        p = free_port()
        try:
            with socket.socket() as s:
                s.bind(("127.0.0.1", p + 1))
            return p
        except OSError:
            continue
    raise RuntimeError("no two adjacent free TCP ports on 127.0.0.1")


def read_proc(path):
    """A small /proc file as text (one os.read: the harness reads
    hundreds a second on the run's CPUs, at 12 us each instead of
    pathlib's 30); OSError when it is gone."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, 4096).decode(errors="replace")
    finally:
        os.close(fd)


def proc_stat(pid):
    """The fields of /proc/PID/stat after the command name (state first,
    then ppid, ...; utime and stime at 11 and 12), or None if it is gone."""
    try:
        st = read_proc(f"/proc/{pid}/stat")
    except OSError:
        return None
    return st[st.rindex(")") + 2:].split()


def process_tree():
    """{parent pid: [child pids]} of every live process: one walk of /proc.
    The harness shares the run's CPUs, so while ranks run one walk serves
    every lookup of a reading (each walk reads every process's stat:
    ~3-5 ms of CPU here, taken from the decode on a 1-CPU run)."""
    kids = {}
    for d in os.scandir("/proc"):
        fields = proc_stat(d.name) if d.name.isdigit() else None
        if fields is None or fields[0] == "Z":
            continue
        kids.setdefault(int(fields[1]), []).append(int(d.name))
    return kids


def descendants(pid, tree=None):
    """Every live descendant of `pid` (in `tree`, else a walk of /proc)."""
    kids = process_tree() if tree is None else tree
    out, todo = [], [pid]
    while todo:
        for c in kids.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def kill_pids(pids, grace=5.0):
    """SIGTERM, then SIGKILL after `grace` s, each pid by itself."""
    live = []
    for p in pids:
        try:
            os.kill(p, signal.SIGTERM)
            live.append(p)
        except ProcessLookupError:
            pass
    end = time.monotonic() + grace
    while live and time.monotonic() < end:
        live = [p for p in live if alive(p)]
        time.sleep(0.05)
    for p in live:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


def alive(pid):
    fields = proc_stat(pid)
    return fields is not None and fields[0] != "Z"


def cmdline(pid):
    try:
        return pathlib.Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None


def note_descendants(procs, seen, tree=None):
    """Remembers every live descendant of the ranks with its command line
    (a DataServer outlives its rank by a moment, reparented)."""
    tree = process_tree() if tree is None else tree
    for p in procs:
        for c in descendants(p.pid, tree):
            if c not in seen:
                cmd = cmdline(c)
                if cmd:
                    seen[c] = cmd


class Services:
    """What one system run needs besides its ranks: a Coordinator for the
    datahelix rungs, a Dask LocalCluster for the pool."""

    def __init__(self):
        self.coord = None
        self.cluster = None

    def coordinator(self, a, policy, telemetry):
        port = free_port()
        addr = f"tcp://127.0.0.1:{port}"
        self.coord = subprocess.Popen(
            [a.bin, "coordinator", "--listen", addr, "--policy", policy,
             "--telemetry", str(telemetry), "--heartbeat-timeout-ms", "3000",
             "--cpu-pools", getattr(a, "cpu_pools", "on"),
             "--exit-with-parent"], stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True)
        return addr

    def dask(self, n):
        import logging

        from distributed import LocalCluster
        self.cluster = LocalCluster(
            n_workers=n, threads_per_worker=1, processes=True,
            dashboard_address=None, scheduler_port=0, host="127.0.0.1",
            silence_logs=logging.ERROR, memory_limit=0)
        return self.cluster.scheduler_address

    def stop(self):
        if self.cluster is not None:
            try:
                self.cluster.close(timeout=20)
            except Exception as e:  # noqa: BLE001 - cleanup goes on
                log(f"dask cluster close: {e}")
            self.cluster = None
        if self.coord is not None:
            kill_pids([self.coord.pid])
            self.coord.wait(timeout=10)
            self.coord = None


def sample_cpu(acct, seen, tree=None):
    """One reading of the run's threads: everything below this process,
    and the ranks' children that outlived them (reparented)."""
    acct.sample(set(descendants(os.getpid(), tree)) |
                {p for p, cmd in seen.items() if cmdline(p) == cmd})


def run_system(name, a, data, sysdir, split):
    """Runs one system's ranks; returns ([rank results], error or None,
    wall seconds).  Writes the run's CPU account (cpuacct.py) to
    SYSDIR/cpu.json."""
    from .cpuacct import CpuAccount
    acct = CpuAccount()
    sysdir.mkdir(parents=True, exist_ok=True)
    for f in sysdir.iterdir():
        if f.is_file():
            f.unlink()
    svc = Services()
    procs, logs, seen = [], [], {}
    t_start = time.monotonic()
    err = None
    try:
        cfg = {"system": name, "manifest": str(data["manifest"]),
               "index": str(data["index"]), "batch": a.batch_size,
               "frames": a.frames, "size": list(a.size),
               "prefetch": a.prefetch, "seed": a.seed,
               "warmup": a.warmup, "steps": a.steps, "model": a.model,
               "gpu_scale": a.gpu_scale, "workers_per_rank": split,
               "step_order": getattr(a, "step_order", "alternate"),
               "cache_dir": getattr(a, "cache_dir", None),
               "gpu": a.gpu_device if a.gpu else None,
               "batch_timeout": 120.0, "dist_timeout": 120,
               "result": str(sysdir / "rank{rank}.json"),
               "telemetry": str(sysdir / "telemetry-rank{rank}.jsonl"),
               "trace": str(sysdir / "trace-rank{rank}.json")
               if getattr(a, "trace", False) else None,
               "coordinator": None, "dask": None}
        if name.startswith("dh-"):
            from datahelix._loader import ABLATIONS
            policy = ABLATIONS[ablation_of(name)]["policy"]
            cfg["coordinator"] = svc.coordinator(
                a, policy, sysdir / "coordinator.jsonl")
            acct.note(svc.coord.pid, "coordinator")
        if name == "dask-pool":
            cfg["dask"] = svc.dask(sum(split))
        cpath = sysdir / "config.json"
        cpath.write_text(json.dumps(cfg))
        port = free_port_pair()
        env = dict(os.environ, WORLD_SIZE=str(a.ranks),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
        env.pop("DATAHELIX_COORDINATOR", None)
        for r in range(a.ranks):
            lf = open(sysdir / f"rank{r}.log", "w")
            logs.append(lf)
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "datahelix_bench.rank", str(cpath)], env=dict(env, RANK=str(r)),
                stdin=subprocess.DEVNULL, stdout=lf, stderr=lf,
                start_new_session=True))
            acct.note(procs[-1].pid, "client")
        limit = a.timeout or (180 + 20 * (a.warmup + a.steps))
        err = wait_ranks(procs, t_start + limit, limit, sysdir, seen, name,
                         acct)
    except Exception as e:  # noqa: BLE001 - reported per system
        err = f"{type(e).__name__}: {e}"
    finally:
        tree = process_tree()
        note_descendants(procs, seen, tree)
        sample_cpu(acct, seen, tree)  # the last reading before anything ends
        kill_pids([p.pid for p in procs if p.poll() is None])
        # Children the ranks started (DataLoader workers, DataServers) that
        # outlived them: by pid, if still the same process.
        kill_pids([pid for pid, cmd in seen.items() if cmdline(pid) == cmd])
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        svc.stop()
        # Nothing of this system may run into the next one's measurement:
        # whatever this process still has below it (a Dask worker that
        # ignored close()) ends here, by pid.
        # The servers of --serve (remote.py) serve every system: kept.
        keep = set(data.get("keep_pids", ()))
        for k in list(keep):
            keep |= set(descendants(k))
        kill_pids([p for p in descendants(os.getpid()) if p not in keep])
        for lf in logs:
            lf.close()
        (sysdir / "cpu.json").write_text(json.dumps(acct.result()))
    wall = time.monotonic() - t_start
    results = []
    if err is None:
        for r in range(a.ranks):
            results.append(json.loads((sysdir / f"rank{r}.json").read_text()))
    return results, err, wall


PEER_GONE = re.compile(r"Connection (closed|reset) by peer|Broken pipe|"
                       r"Read error|Socket Timeout")


def root_cause(bad, logs):
    """Of the failed ranks, the one to report: a rank that fails makes its
    peers' all-reduce fail too, so the first whose log is not such an
    echo (else the first)."""
    return next((r for r in bad if not PEER_GONE.search(logs[r])), bad[0])


def progress_period():
    """Seconds between progress lines ($DATAHELIX_PROGRESS_S, default 10;
    0: none), as every long datahelix command."""
    try:
        v = float(os.environ.get("DATAHELIX_PROGRESS_S", "10"))
    except ValueError:
        v = 10.0
    return v if v > 0 else None


def wait_ranks(procs, deadline, limit, sysdir, seen, name="system",
               acct=None):
    """None when every rank exited 0 in time; else why not.  A line on
    stderr every progress_period() seconds says it is alive; `acct` (a
    cpuacct.CpuAccount) reads the run's threads every SAMPLE_S."""
    from .cpuacct import SAMPLE_S
    failed_at = None
    next_scan = next_cpu = 0.0
    period = progress_period()
    t_start = time.monotonic()
    next_note = t_start + period if period else None
    while True:
        if next_note is not None and time.monotonic() >= next_note:
            running = sum(1 for p in procs if p.poll() is None)
            log(f"{name}: {time.monotonic() - t_start:.0f} s, "
                f"{running}/{len(procs)} ranks running "
                f"(bound {limit:.0f} s)")
            next_note += period
        now = time.monotonic()
        scan = now >= next_scan
        read_cpu = acct is not None and now >= next_cpu
        if scan or read_cpu:
            tree = process_tree()  # one walk for both
            if scan:
                note_descendants(procs, seen, tree)
                next_scan = now + 1.0
            if read_cpu:
                sample_cpu(acct, seen, tree)
                next_cpu = now + SAMPLE_S
        codes = [p.poll() for p in procs]
        if all(c == 0 for c in codes):
            return None
        bad = [r for r, c in enumerate(codes) if c not in (None, 0)]
        now = time.monotonic()
        if bad and failed_at is None:
            failed_at = now
        if bad and (all(c is not None for c in codes) or
                    now - failed_at > 15):
            logs = {r: tail(sysdir / f"rank{r}.log") for r in bad}
            r = root_cause(bad, logs)
            return f"rank {r} exited {codes[r]}: {logs[r]}"
        if now > deadline:
            return (f"timed out after {limit:.0f} s "
                    f"(ranks still running: "
                    f"{[r for r, c in enumerate(codes) if c is None]})")
        time.sleep(0.2)


def tail(path, n=600):
    try:
        t = pathlib.Path(path).read_text(errors="replace").strip()
    except OSError:
        return "(no log)"
    lines = [x for x in t.splitlines() if x.strip()]
    return " | ".join(lines[-4:])[-n:]
