"""Where a system run's CPU went (issue 21 item 1), by process kind, from
/proc/PID/task/TID/stat (utime + stime of every thread):

  decode           the DataServers' decode threads (named dh-decode) and
                   the processes under a DataServer (Python workers); under
                   a rank, its loader worker processes (native); under the
                   harness, the Dask pool's processes
  dataserver_loop  every other thread of a DataServer: its event loop and
                   ZeroMQ's I/O threads
  coordinator      the Coordinator process
  client           the rank processes: the training loop, the datahelix
                   client, torch, gloo
  harness          this process (sampling, the Dask scheduler, metrics)
  other            a process the rules above do not place

Threads are read every SAMPLE_S while the ranks run and once more before
anything is ended, keeping each thread's last reading: a thread's last
< SAMPLE_S before it exits is not seen, so the account's sum is a little
under the run's real CPU.  The independent total beside it is
getrusage(): this process's own time plus its reaped children's (their
reaped descendants included).  outside_run_s is what the run's CPUs spent
on other processes meanwhile (/proc/stat busy time less the run's own): on
a shared machine, the capacity the ceiling assumed but the run did not
have.
"""
import os
import pathlib
import resource

from .processes import cmdline, read_proc

SAMPLE_S = 0.5
KINDS = ("decode", "dataserver_loop", "coordinator", "client", "harness",
         "other")
TICK = os.sysconf("SC_CLK_TCK")


def thread_ticks(pid):
    """{tid: (name, utime + stime ticks)} of pid's live threads."""
    out = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for t in tids:
        try:
            st = read_proc(f"/proc/{pid}/task/{t}/stat")
        except OSError:
            continue
        f = st[st.rindex(")") + 2:].split()
        out[int(t)] = (st[st.index("(") + 1:st.rindex(")")],
                       int(f[11]) + int(f[12]))
    return out


def parent_of(pid):
    try:
        st = read_proc(f"/proc/{pid}/stat")
    except OSError:
        return None
    return int(st[st.rindex(")") + 2:].split()[1])


def is_dataserver(cmd):
    argv = cmd.split(b"\0") if cmd else []
    return len(argv) > 1 and argv[1] == b"dataserver"


def cpus_busy_s(cpus):
    """Busy seconds (all but idle and iowait) of the given CPUs since
    boot, from /proc/stat; None if unreadable."""
    want = {f"cpu{c}" for c in cpus}
    busy = 0
    try:
        lines = pathlib.Path("/proc/stat").read_text().splitlines()
    except OSError:
        return None
    for ln in lines:
        f = ln.split()
        if f and f[0] in want:
            v = [int(x) for x in f[1:]]
            busy += sum(v[:8]) - v[3] - v[4]
    return busy / TICK


def usage_s():
    """CPU seconds of this process and its reaped descendants."""
    s = resource.getrusage(resource.RUSAGE_SELF)
    c = resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


class CpuAccount:
    """One system run's account: note the processes (ranks, services),
    sample() while it runs, result() after everything is reaped."""

    def __init__(self):
        self.me = os.getpid()
        self.kind = {self.me: "harness"}
        self.last = {}       # (pid, tid) -> (kind, ticks)
        self.usage0 = usage_s()
        self.cpus = sorted(os.sched_getaffinity(0))
        self.busy0 = cpus_busy_s(self.cpus)
        self.seen_before = {(self.me, t): v[1]
                            for t, v in thread_ticks(self.me).items()}

    def note(self, pid, kind):
        self.kind.setdefault(pid, kind)

    def kind_of(self, pid):
        """A process's kind from its own command line or its parent's."""
        if pid in self.kind:
            return self.kind[pid]
        cmd = cmdline(pid)
        if is_dataserver(cmd):
            k = "dataserver"
        else:
            up = parent_of(pid)
            pk = self.kind_of(up) if up and up != pid and up > 1 else None
            k = ("decode" if pk in ("dataserver", "client", "harness",
                                    "decode") else "other")
        self.kind[pid] = k
        return k

    def sample(self, pids):
        """Reads every thread of this process and of `pids` (the live
        processes of the run)."""
        for pid in [self.me] + [p for p in pids if p != self.me]:
            k = self.kind_of(pid)
            for tid, (name, ticks) in thread_ticks(pid).items():
                kk = k
                if k == "dataserver":
                    kk = ("decode" if name.startswith("dh-decode")
                          else "dataserver_loop")
                key = (pid, tid)
                # The harness's threads count from the run's start only.
                base = self.seen_before.get(key, 0)
                self.last[key] = (kk, max(0, ticks - base))

    def result(self):
        """{kind: CPU s, ..., total_s, usage_total_s} for the run."""
        out = {k: 0.0 for k in KINDS}
        for kk, ticks in self.last.values():
            out[kk if kk in out else "other"] += ticks / TICK
        out = {k: round(v, 3) for k, v in out.items()}
        out["total_s"] = round(sum(out[k] for k in KINDS), 3)
        out["usage_total_s"] = round(usage_s() - self.usage0, 3)
        busy = cpus_busy_s(self.cpus)
        # What the run's CPUs did for other processes meanwhile (a shared
        # machine): their busy time less the run's own.
        out["outside_run_s"] = (
            None if busy is None or self.busy0 is None else
            round(max(0.0, busy - self.busy0 - out["usage_total_s"]), 3))
        out["sample_s"] = SAMPLE_S
        return out
