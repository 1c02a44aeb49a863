"""The data plane end to end, as processes: `datahelix coordinator`, the
local DataServers that `datahelix consume` starts (or attaches to), and the
consumers themselves (issue 4).

Every sample of an epoch arrives exactly once, in the order the plan gives
each rank; a corrupt clip is an error at its step naming its path; a killed
local DataServer is restarted (embedded) or a clear error (external); no
child process and no /dev/shm entry outlives the job, after a normal end,
SIGINT, or SIGKILL of the consumer; an unreachable or dead Coordinator is a
clear error within the timeout.  Every wait is bounded.
"""
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import time

import pytest

from conftest import probed_set, run_dh, _binary
from procs import (children, log_file, plan_ids, read_ids, wait_gone,
                   wait_until, shm_names, shm_residue)

SMALL = ["--frames", "4", "--size", "32x32"]


# ---- helpers ---------------------------------------------------------------

def summary_of(stdout):
    for line in stdout.splitlines():
        if line.startswith('{"summary"'):
            return json.loads(line)["summary"]
    raise AssertionError(f"no summary in:\n{stdout}")


class Proc:
    """A daemon started for one test, ended by pid (SIGTERM, then SIGKILL).
    Its stderr goes to a file, so that a test can wait for a line in it
    while it runs (err_so_far()) without a pipe filling up."""

    def __init__(self, *args, **kw):
        self.errf = log_file()
        self.p = subprocess.Popen([_binary(), *map(str, args)],
                                  stdout=subprocess.PIPE,
                                  stderr=self.errf, text=True, **kw)

    def err_so_far(self):
        self.errf.seek(0)
        return self.errf.read()

    def stop(self):
        if hasattr(self, "result"):
            return self.result
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait(timeout=5)
        out, _ = self.p.communicate(timeout=5)
        self.result = (self.p.returncode, out, self.err_so_far())
        self.errf.close()
        return self.result


def consume_args(coord, manifest, rank=0, world=1, batch=2, *extra):
    return ["consume", "--coordinator", coord, "--manifest", manifest,
            "--rank", rank, "--world-size", world, "--batch-size", batch,
            "--json", *SMALL, *extra]


def start_consume(*args):
    return subprocess.Popen([_binary(), *map(str, args)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def first_step_line(proc, seconds=60):
    """Reads stdout until the first per-step JSON line (bounded)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        line = proc.stdout.readline()
        if not line:
            break
        if line.startswith('{"epoch"'):
            return json.loads(line)
    raise AssertionError("consume printed no step")


# ---- fixtures --------------------------------------------------------------

@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """12 short S clips and their index (decoding them is quick)."""
    return probed_set(tmp_path_factory.mktemp("rt"), "S", 12, 3, index=True)


@pytest.fixture
def coordinator(tmp_path):
    addr = f"ipc://{tmp_path}/coord.sock"
    c = Proc("coordinator", "--listen", addr, "--heartbeat-timeout-ms", 1000)
    # Ready when the socket file exists (bounded).
    assert wait_until(lambda: (tmp_path / "coord.sock").exists(), 10), \
        c.stop()
    yield addr, c
    c.stop()


# ---- exactly once, in order ------------------------------------------------

def test_two_ranks_two_epochs_exactly_once_in_plan_order(dataset,
                                                          coordinator,
                                                          tmp_path):
    coord, _ = coordinator
    m = dataset / "m.dhx"
    procs = [start_consume(*consume_args(coord, m, r, 2, 2, "--epochs", 2,
                                         "--ids-out", tmp_path / f"ids{r}"))
             for r in range(2)]
    outs = [p.communicate(timeout=180) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
    want = [[], []]
    for ep in range(2):
        per_rank, _ = plan_ids(m, 2, 2, epoch=ep)
        for r in range(2):
            want[r].extend(per_rank[r])
    got = [read_ids(tmp_path / f"ids{r}") for r in range(2)]
    assert got == want  # each rank: the plan's ids, in its request order
    for ep in range(2):  # every id of an epoch once across the ranks
        half = len(got[0]) // 2
        epoch_ids = got[0][ep * half:(ep + 1) * half] + \
            got[1][ep * half:(ep + 1) * half]
        assert sorted(epoch_ids) == list(range(12))
    s = summary_of(outs[0][0])
    assert s["steps"] == 6 and s["samples"] == 12 and s["errors"] == 0
    # The ranks' servers said goodbye: none is taken for dead.
    _, c = coordinator
    assert wait_until(lambda: c.p.poll() is None, 1)
    # Each consumer's server says goodbye as it ends; the Coordinator logs
    # it a moment later: wait (bounded) for both lines.
    wait_until(lambda: c.err_so_far().count(" left") >= 2, 10)
    _, _, cerr = c.stop()
    assert cerr.count(" left") == 2, cerr
    assert "declared dead" not in cerr, cerr


def test_microbatches_and_telemetry(dataset, coordinator, tmp_path):
    coord, _ = coordinator
    m = dataset / "m.dhx"
    tel = tmp_path / "tel.jsonl"
    p = run_dh(*consume_args(coord, m, 0, 1, 4, "--microbatches", 2,
                             "--ids-out", tmp_path / "ids", "--telemetry",
                             tel), timeout=180)
    assert p.returncode == 0, p.stderr
    assert read_ids(tmp_path / "ids") == plan_ids(m, 1, 4)[0][0]
    recs = [json.loads(x) for x in tel.read_text().splitlines()]
    assert [r["step"] for r in recs] == [0, 1, 2]
    for r in recs:
        assert r["samples"] == 4 and len(r["servers"]) == 2
        assert r["input_wait_ms"] >= 0 and isinstance(r["miss"], bool)
    # --step-deadline-ms fixes a step's period: a request for the step k
    # steps after the one being computed carries k x 250 ms of slack;
    # --ddl-ms is the miss threshold only (a day: no step is a miss).
    p = run_dh(*consume_args(coord, m, 0, 1, 2, "--step-deadline-ms", 250,
                             "--ddl-ms", 86400000, "--prefetch", 3,
                             "--telemetry", tel), timeout=180)
    assert p.returncode == 0, p.stderr
    recs = [json.loads(x) for x in tel.read_text().splitlines()]
    assert recs[0]["deadline_ms"] == 250
    assert all(r["deadline_ms"] in (250, 500, 750) for r in recs), recs
    assert not any(r["miss"] for r in recs)
    assert json.loads(p.stdout.splitlines()[-1])["summary"]["misses"] == 0


# ---- errors ----------------------------------------------------------------

@pytest.fixture
def corrupt_set(dataset, tmp_path):
    """The dataset with one clip truncated after probing: the manifest
    still lists it as good, the decode must fail."""
    d = tmp_path / "bad"
    shutil.copytree(dataset / "videos", d / "videos")
    run_dh("probe", "--out", d / "m.jsonl", "--index", d / "m.dhx",
           d / "videos", check=True)
    rows = [json.loads(x) for x in (d / "m.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "id" in r]
    victim = next(r for r in rows if r["id"] == 5)
    path = pathlib.Path(victim["path"])
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 3])
    return d / "m.dhx", 5, str(path)


def test_corrupt_clip_is_an_error_at_its_step(corrupt_set, coordinator,
                                              tmp_path):
    coord, _ = coordinator
    m, victim, path = corrupt_set
    _, steps = plan_ids(m, 1, 2)
    bad_step = next(i for i, s in enumerate(steps) if victim in s[0])
    p = run_dh(*consume_args(coord, m, 0, 1, 2), timeout=180)
    assert p.returncode == 1
    assert path in p.stderr and f"step {bad_step}" in p.stderr
    assert f"sample {victim}" in p.stderr
    done = [json.loads(x)["step"] for x in p.stdout.splitlines()
            if x.startswith('{"epoch"')]
    assert done == list(range(bad_step))  # nothing after, nothing lost before

    # skip: the sample is replaced in its position by a spare of this
    # rank's plan (another step's sample), so every step arrives full-size;
    # --ids-out lists the delivered ids.  In the second epoch the server
    # remembers the sample (quarantine) and substitutes it without
    # decoding it again.
    p = run_dh(*consume_args(coord, m, 0, 1, 2, "--on-error", "skip",
                             "--epochs", 2, "--ids-out", tmp_path / "ids"),
               timeout=180)
    assert p.returncode == 0, p.stderr
    subs = substitutions(p.stderr)
    assert [(e, k, f) for e, k, _, f, _ in subs] == [
        (0, bad_step, victim),
        (1, next(k for k, s in enumerate(plan_ids(m, 1, 2, epoch=1)[1])
                 if victim in s[0]), victim)]
    want = []
    for ep in (0, 1):
        _, st = plan_ids(m, 1, 2, epoch=ep)
        e_, k_, pos, _, sub = subs[ep]
        assert st[k_][0][pos] == victim
        assert sub != victim and sub in [i for s in st for i in s[0]]
        for k, s in enumerate(st):
            want += [sub if (k, j) == (k_, pos) else i
                     for j, i in enumerate(s[0])]
    assert read_ids(tmp_path / "ids") == want
    s = summary_of(p.stdout)
    assert s["steps"] == 2 * len(steps) and s["samples"] == 2 * 2 * len(steps)
    assert s["substituted"] == 2 and s["skipped"] == 0 and s["errors"] == 0
    assert s["quarantined"] == 1


def substitutions(stderr):
    """(epoch, step, position, failed id, delivered id) per substitution
    consume reported."""
    return [tuple(int(g) for g in x.groups()) for x in re.finditer(
        r"substituted: epoch (\d+) step (\d+) position (\d+): sample (\d+) "
        r"failed \(\w+, code -?\d+\), sample (\d+) delivered", stderr)]


def test_skip_keeps_two_ranks_in_lockstep(corrupt_set, coordinator, tmp_path):
    """Issue 15 item 2: two ranks, a corrupt clip in one rank's share,
    on_error=skip: both ranks take the same number of steps, each of the
    planned size (the failed clip replaced by a spare of that rank's own
    plan), and the substitute is reported.  Without substitution the
    rank holding the clip would take one step fewer (the old skip)."""
    coord, _ = coordinator
    m, victim, _ = corrupt_set
    ids, steps = plan_ids(m, 2, 2)
    bad_rank = next(r for r in range(2) if victim in ids[r])
    procs = [start_consume(*consume_args(coord, m, r, 2, 2, "--on-error",
                                         "skip", "--ids-out",
                                         tmp_path / f"ids{r}"))
             for r in range(2)]
    outs = [p.communicate(timeout=180) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
    sums = [summary_of(out) for out, _ in outs]
    assert sums[0]["steps"] == sums[1]["steps"] == len(steps)
    for r in range(2):
        assert sums[r]["samples"] == 2 * len(steps)  # the planned size
        assert sums[r]["errors"] == 0 and sums[r]["skipped"] == 0
        got = read_ids(tmp_path / f"ids{r}")
        assert len(got) == len(ids[r])
        if r != bad_rank:
            assert got == ids[r] and sums[r]["substituted"] == 0
            assert substitutions(outs[r][1]) == []
            continue
        (e, k, pos, failed, sub), = substitutions(outs[r][1])
        assert (e, failed) == (0, victim) and steps[k][r][pos] == victim
        assert sub in ids[r] and sub != victim  # this rank's own share
        assert sub not in ids[1 - r]
        assert got == [sub if i == victim else i for i in ids[r]]
        assert sums[r]["substituted"] == 1 and sums[r]["quarantined"] == 1


def test_unreachable_coordinator_is_a_clear_error(dataset, tmp_path):
    t0 = time.monotonic()
    p = run_dh(*consume_args(f"ipc://{tmp_path}/nobody.sock",
                             dataset / "m.dhx", 0, 1, 2,
                             "--start-timeout-ms", 500), timeout=30)
    assert p.returncode == 1
    assert "did not answer within 500 ms" in p.stderr
    assert time.monotonic() - t0 < 10


def test_dead_coordinator_is_an_error_within_the_timeout(dataset,
                                                         coordinator):
    coord, c = coordinator
    proc = start_consume(*consume_args(coord, dataset / "m.dhx", 0, 1, 2,
                                       "--window-ms", 300, "--prefetch", 1,
                                       "--timeout-ms", 2000))
    try:
        first_step_line(proc)
        c.p.kill()  # SIGKILL: no Shutdown reaches the client
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1
    assert "no batch for epoch 0 step" in err and coord in err


def test_usage_errors(dataset):
    p = run_dh("consume", "--manifest", dataset / "m.dhx")
    assert p.returncode == 2 and "required" in p.stderr
    p = run_dh(*consume_args("ipc:///x", dataset / "m.dhx", 2, 2, 2))
    assert p.returncode == 2 and "--rank 2" in p.stderr
    p = run_dh("dataserver", "--coordinator", "ipc:///x", "--rank", 0,
               "--index", dataset / "m.dhx", "--client-pid", 5)
    assert p.returncode == 2 and \
        "--client-pid needs --client-socket" in p.stderr, p.stderr
    p = run_dh("coordinator", "--listen", "ipc:///x", "--cpu-pools", "maybe")
    assert p.returncode == 2 and \
        "--cpu-pools must be on or off, not 'maybe'" in p.stderr, p.stderr


# ---- failures of the local DataServer ----------------------------------

def test_kill9_of_embedded_dataserver_restarts_it(dataset, coordinator,
                                                  tmp_path):
    coord, _ = coordinator
    m = dataset / "m.dhx"
    proc = start_consume(*consume_args(coord, m, 0, 1, 2, "--window-ms", 250,
                                       "--ids-out", tmp_path / "ids"))
    try:
        first_step_line(proc)
        kids = wait_until(lambda: children(proc.pid), 5)
        assert len(kids) == 1
        os.kill(kids[0], signal.SIGKILL)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "starting a new one" in err
    assert read_ids(tmp_path / "ids") == plan_ids(m, 1, 2)[0][0]
    s = summary_of(out)
    assert s["restarts"] == 1 and s["samples"] == 12


def test_kill9_of_external_dataserver_is_a_clear_error(dataset, coordinator):
    coord, _ = coordinator
    m = dataset / "m.dhx"
    name = f"dh-test-{os.getpid()}-ext"
    ds = Proc("dataserver", "--coordinator", coord, "--rank", 0, "--index",
              m, "--client-socket", name)
    try:
        proc = start_consume(*consume_args(coord, m, 0, 1, 2, "--window-ms",
                                           250, "--dataserver", name,
                                           "--timeout-ms", 5000,
                                           "--start-timeout-ms", 10000))
        try:
            first_step_line(proc)
            ds.p.kill()
            t0 = time.monotonic()
            out, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode == 1
        assert "went away" in err, err
        assert time.monotonic() - t0 < 15
    finally:
        ds.stop()


def test_external_link_hands_the_arena_only_to_the_named_pid(dataset,
                                                             coordinator):
    """`--client-pid P`: anyone may connect to an abstract name, so the
    server asks the kernel who connected (SO_PEERCRED) and hands its arena
    memfd to P only; anyone else of this user is turned away (without it:
    any process of this uid; see test_peer_cred for other uids)."""
    coord, _ = coordinator
    m = dataset / "m.dhx"
    name = f"dh-test-{os.getpid()}-pid"
    ds = Proc("dataserver", "--coordinator", coord, "--rank", 0, "--index",
              m, "--client-socket", name, "--client-pid", 1)
    try:
        assert wait_until(lambda: "registered" in ds.err_so_far(), 30), \
            ds.err_so_far()
        p = run_dh(*consume_args(coord, m, 0, 1, 2, "--dataserver", name,
                                 "--timeout-ms", 5000, "--start-timeout-ms",
                                 5000), timeout=60)
        assert p.returncode != 0, p.stdout
        assert "closed the link before handing over its arena" in p.stderr, \
            p.stderr
        assert wait_until(lambda: "refused: this link serves pid 1 only" in
                          ds.err_so_far(), 10), ds.err_so_far()
        assert ds.p.poll() is None  # it goes on serving
    finally:
        ds.stop()
    # The named pid gets it: consume first (it retries attaching within
    # its start bound), then a server for its pid.
    name += "2"
    proc = start_consume(*consume_args(coord, m, 0, 1, 2, "--dataserver",
                                       name, "--start-timeout-ms", 30000))
    ds = Proc("dataserver", "--coordinator", coord, "--rank", 0, "--index",
              m, "--client-socket", name, "--client-pid", proc.pid)
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=5)
        ds.stop()
    assert proc.returncode == 0, err
    assert summary_of(out)["steps"] > 0


@pytest.mark.parametrize("how", ["normal", "sigint", "sigkill"])
def test_nothing_left_behind(dataset, coordinator, how):
    coord, _ = coordinator
    before = shm_names()
    proc = start_consume(*consume_args(coord, dataset / "m.dhx", 0, 1, 2,
                                       "--window-ms", 100))
    try:
        first_step_line(proc)
        kids = wait_until(lambda: children(proc.pid), 5)
        assert len(kids) == 1
        if how == "sigint":
            proc.send_signal(signal.SIGINT)
        elif how == "sigkill":
            proc.kill()
        proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    if how == "normal":
        assert proc.returncode == 0
    elif how == "sigint":
        assert proc.returncode == 1  # "interrupted", cleanly
    # The server sees its link close and exits, whoever ended the client.
    assert wait_gone(kids[0], 5), f"dataserver {kids[0]} outlived its client"
    assert shm_residue(before) == []


# ---- the same processes under AddressSanitizer + UBSan ----------------------

def test_under_asan_two_ranks_with_a_killed_local_server(dataset, tmp_path):
    """Coordinator, consumers and their DataServers all from the ASan+UBSan
    build: an epoch over two ranks, one rank's server killed mid-epoch and
    restarted, every process ending cleanly with no sanitizer report (leak
    checks included)."""
    b = os.environ.get("DATAHELIX_ASAN_BIN")
    if not b or not os.access(b, os.X_OK):
        pytest.skip("DATAHELIX_ASAN_BIN not set (make test sets it)")
    env = dict(os.environ, DATAHELIX_BIN=b,
               ASAN_OPTIONS="detect_leaks=1:exitcode=86:abort_on_error=0",
               UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1")
    m = dataset / "m.dhx"
    sock = tmp_path / "c.sock"
    coord = subprocess.Popen([b, "coordinator", "--listen", f"ipc://{sock}"],
                             stderr=subprocess.PIPE, text=True, env=env)
    procs = []
    try:
        assert wait_until(sock.exists, 20)
        for r in range(2):
            procs.append(subprocess.Popen(
                [b, *map(str, consume_args(f"ipc://{sock}", m, r, 2, 2,
                                           "--window-ms", 200, "--ids-out",
                                           tmp_path / f"ids{r}"))],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                env=env))
        first_step_line(procs[0], 120)
        kids = wait_until(lambda: children(procs[0].pid), 10)
        assert len(kids) == 1
        os.kill(kids[0], signal.SIGKILL)
        outs = [p.communicate(timeout=300) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        coord.terminate()
        try:
            _, cerr = coord.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            coord.kill()
            _, cerr = coord.communicate(timeout=10)
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
        assert "AddressSanitizer" not in err and "runtime error" not in err, \
            err[-3000:]
    assert coord.returncode == 0, cerr[-3000:]
    assert "AddressSanitizer" not in cerr and "runtime error" not in cerr
    assert "starting a new one" in outs[0][1]
    want, _ = plan_ids(m, 2, 2)
    got = [read_ids(tmp_path / f"ids{r}") for r in range(2)]
    assert got == want
