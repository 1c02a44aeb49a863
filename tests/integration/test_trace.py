"""The critical-path trace and the late-step causes (issue 18 item 4,
docs/trace.md), and the log levels (item 5, docs/usage.md "Logs").

The data: seven short S clips (400x224, ~2 s) and one XL clip (1280x720,
~8 s) whose 16 sampled frames cost ~10-50x more to decode.  One sample a
step, one step requested ahead and no window: every step waits for its
batch, and the XL clip's step waits longest; its cause must name that
clip, the server that decoded it and the decode stage.
"""
import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT, run_dh

XL_NAME = "000000_XL.mp4"


@pytest.fixture(scope="module")
def slow_set(tmp_path_factory):
    """7 S clips and one XL clip, probed and indexed; (index, xl id)."""
    d = tmp_path_factory.mktemp("slowset")
    run_dh("gen-data", "--out", d / "s", "--profiles", "S", "--count", 7,
           "--seed", 1, check=True, timeout=300)
    run_dh("gen-data", "--out", d / "xl", "--profiles", "XL", "--count", 1,
           "--seed", 2, check=True, timeout=300)
    run_dh("probe", "--out", d / "m.jsonl", d / "s", d / "xl", check=True,
           timeout=300)
    run_dh("index", d / "m.jsonl", "-o", d / "m.dhx", check=True)
    rows = [json.loads(x) for x in (d / "m.jsonl").read_text().splitlines()]
    xl = [r["id"] for r in rows if r.get("path", "").endswith(XL_NAME)]
    assert len(xl) == 1
    return d / "m.dhx", xl[0]


def consume(coord, index, *extra, env=None, timeout=180):
    return run_dh("consume", "--coordinator", coord, "--manifest", index,
                  "--rank", 0, "--world-size", 1, "--batch-size", 1,
                  "--prefetch", 1, "--json", *extra, timeout=timeout,
                  env=env)


def check_perfetto(doc):
    """The fields Perfetto's JSON importer needs, on every event."""
    ev = doc["traceEvents"]
    assert isinstance(ev, list) and ev
    names = {}
    for e in ev:
        assert e["ph"] in ("X", "M", "s", "f", "i"), e
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int), e
        assert isinstance(e["name"], str) and e["name"], e
        if e["ph"] == "M":
            assert e["name"] in ("process_name", "thread_name"), e
            names[(e["pid"], e["tid"], e["name"])] = e["args"]["name"]
            continue
        assert isinstance(e["ts"], (int, float)), e
        if e["ph"] == "X":
            assert isinstance(e["dur"], (int, float)) and e["dur"] >= 0, e
    # every track that has events is named
    for e in ev:
        if e["ph"] == "X":
            assert (e["pid"], 0, "process_name") in names, e
            assert (e["pid"], e["tid"], "thread_name") in names, e
    # flows: each id starts once and finishes once, not before it starts
    starts = {e["id"]: e for e in ev if e["ph"] == "s"}
    ends = {e["id"]: e for e in ev if e["ph"] == "f"}
    assert starts and set(starts) == set(ends)
    for i, s in starts.items():
        assert ends[i]["bp"] == "e"
        assert ends[i]["ts"] >= s["ts"] - 1, (s, ends[i])
    return names


def test_a_trace_names_the_slow_clip_its_server_and_stage(slow_set,
                                                          coordinator,
                                                          tmp_path):
    index, xl = slow_set
    trace = tmp_path / "t.json"
    p = consume(coordinator, index, "--trace", trace)
    assert p.returncode == 0, p.stderr
    summary = json.loads(p.stdout.splitlines()[-1])["summary"]
    doc = json.loads(trace.read_text())
    names = check_perfetto(doc)
    assert doc["otherData"]["truncated"] is False
    assert doc["otherData"]["steps"] == summary["steps"] == 8

    # the late step that waited longest is the XL clip's, and says why
    waits = [e for e in doc["traceEvents"]
             if e["ph"] == "X" and e["cat"] == "wait"]
    assert len(waits) == 8
    worst = max(waits, key=lambda e: e["dur"])
    late = worst["args"]["late"]
    assert late["sample"] == xl, late
    assert late["path"].endswith(XL_NAME)
    assert late["stage"] == "decode", late
    assert late["stage_ms"] > 0.5 * late["input_wait_ms"], late
    # the server named is the one whose track holds that clip's decode
    dec = [e for e in doc["traceEvents"]
           if e["ph"] == "X" and e["name"] == f"decode {xl}"]
    assert len(dec) == 1
    assert dec[0]["pid"] == 100000 + late["server"]
    assert names[(dec[0]["pid"], 0, "process_name")] == \
        f"DataServer {late['server']} (local)"
    # and its decode is the longest of the run
    decodes = [e for e in doc["traceEvents"] if e.get("cat") == "decode"]
    assert max(decodes, key=lambda e: e["dur"]) is dec[0]
    # the late marker and the summary say the same
    marks = [e for e in doc["traceEvents"] if e["ph"] == "i"]
    assert any(f"decode of sample {xl} on server {late['server']}" in
               e["name"] for e in marks), marks
    assert summary["late"]["worst"]["sample"] == xl
    assert summary["late"]["worst"]["stage"] == "decode"
    assert summary["late"]["steps"] == summary["misses"]


def test_the_telemetry_says_why_a_missed_step_was_late(slow_set, coordinator,
                                                      tmp_path):
    index, xl = slow_set
    tel = tmp_path / "tel.jsonl"
    p = consume(coordinator, index, "--telemetry", tel)
    assert p.returncode == 0, p.stderr
    recs = [json.loads(x) for x in tel.read_text().splitlines()]
    assert len(recs) == 8 and all(r["miss"] for r in recs)
    worst = max(recs, key=lambda r: r["input_wait_ms"])
    assert worst["late"]["sample"] == xl, worst
    assert worst["late"]["stage"] == "decode" and worst["late"]["server"] >= 1


def test_a_steps_server_spans_lie_between_request_and_wait_end(slow_set,
                                                               coordinator,
                                                               tmp_path):
    """Spans of one machine's processes share CLOCK_MONOTONIC: a task's
    queue..collate run after the step was requested and end before the
    step's wait does."""
    index, _ = slow_set
    trace = tmp_path / "t.json"
    p = consume(coordinator, index, "--trace", trace)
    assert p.returncode == 0, p.stderr
    ev = json.loads(trace.read_text())["traceEvents"]
    by_step = {}
    for e in ev:
        if e["ph"] == "X":
            step = (e.get("args") or {}).get("step")
            if e["cat"] == "wait":
                step = int(e["name"].rsplit(" ", 1)[1])
            by_step.setdefault(step, []).append(e)
    for step in range(8):
        spans = by_step[step]
        wait = next(e for e in spans if e["cat"] == "wait")
        work = [e for e in spans if e["cat"] in ("queue", "read", "decode",
                                                  "scale")]
        assert {e["cat"] for e in work} == {"queue", "read", "decode",
                                            "scale"}, step
        end = wait["ts"] + wait["dur"]
        for e in work:
            assert e["ts"] + e["dur"] <= end + 1000, (step, e, wait)
        q = next(e for e in work if e["cat"] == "queue")
        r = next(e for e in work if e["cat"] == "read")
        assert q["ts"] + q["dur"] <= r["ts"] + 1  # in worker order


def test_a_trace_is_bounded_and_says_when_it_was_cut(slow_set, coordinator,
                                                     tmp_path):
    index, _ = slow_set
    trace = tmp_path / "t.json"
    env = dict(os.environ, DATAHELIX_TRACE_MAX_STEPS="3")
    p = consume(coordinator, index, "--trace", trace, env=env)
    assert p.returncode == 0, p.stderr
    doc = json.loads(trace.read_text())
    check_perfetto(doc)
    o = doc["otherData"]
    assert o["truncated"] is True and o["steps"] == 3, o
    assert o["dropped_steps"] == 5 and o["max_steps"] == 3, o
    assert "truncated after 3 steps (5 left out)" in p.stderr, p.stderr
    # the causes are kept past the trace's bound
    assert o["late_steps"] == 8


def test_without_a_trace_nothing_is_written_and_causes_are_kept(
        slow_set, coordinator, tmp_path):
    index, xl = slow_set
    p = consume(coordinator, index)
    assert p.returncode == 0, p.stderr
    assert not list(tmp_path.glob("*.json"))
    late = json.loads(p.stdout.splitlines()[-1])["summary"]["late"]
    assert late["worst"]["sample"] == xl


def test_the_python_loader_traces_and_reports_late_causes(slow_set, tmp_path):
    index, xl = slow_set
    code = f"""
import json, sys, datahelix
ld = datahelix.DataLoader({str(index)!r}, batch_size=1, frames=16,
                          size=(112, 112), rank=0, world_size=1, prefetch=1,
                          trace={str(tmp_path / 'trace-{rank}.json')!r})
for b in ld:
    pass
s = ld.stats()
ld.close()
after = ld.stats()
print(json.dumps({{"late": s["late"], "by": s["late_by_stage"],
                   "n": s["late_steps"], "misses": s["misses"],
                   "after": after["late_steps"]}}))
"""
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python"))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True,
                       text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout.splitlines()[-1])
    assert r["n"] == r["misses"] == len(r["late"]) == r["after"]
    assert sum(r["by"].values()) == r["n"]
    worst = max(r["late"], key=lambda e: e["input_wait_ms"])
    assert worst["sample"] == xl and worst["stage"] == "decode", worst
    assert worst["path"].endswith(XL_NAME) and worst["server"] >= 1
    doc = json.loads((tmp_path / "trace-0.json").read_text())
    check_perfetto(doc)
    assert doc["otherData"]["rank"] == 0


def test_trace_argument_is_checked():
    code = ("import datahelix\n"
            "try:\n"
            "    datahelix.DataLoader('x.jsonl', trace=3)\n"
            "except (TypeError, ValueError, FileNotFoundError) as e:\n"
            "    print(type(e).__name__, e)\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python"))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True,
                       text=True, timeout=60, env=env)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip(), p.stderr


# ---- logs -----------------------------------------------------------------

PER_BATCH = ("routed to server", " ready (", " in, waited ")


def logged_run(slow_set, tmp_path, level):
    """A Coordinator and a consumer at DATAHELIX_LOG=level; both stderrs."""
    index, _ = slow_set
    env = dict(os.environ)
    env.pop("DATAHELIX_LOG", None)
    if level is not None:
        env["DATAHELIX_LOG"] = level
    sock = tmp_path / f"c-{level}.sock"
    co = subprocess.Popen([os.environ.get("DATAHELIX_BIN",
                                          str(ROOT / "build" / "datahelix")),
                           "coordinator", "--listen", f"ipc://{sock}"],
                          stderr=subprocess.PIPE, text=True, env=env)
    try:
        for _ in range(500):
            if sock.exists():
                break
            subprocess.run(["sleep", "0.01"])
        p = consume(f"ipc://{sock}", index, env=env)
        assert p.returncode == 0, p.stderr
    finally:
        co.terminate()
        _, cerr = co.communicate(timeout=20)
    return cerr + p.stderr


def test_log_levels_select_what_is_written(slow_set, tmp_path):
    default = logged_run(slow_set, tmp_path, None)
    debug = logged_run(slow_set, tmp_path, "debug")
    error = logged_run(slow_set, tmp_path, "error")
    # the events that matter, one line each, with level and who
    for needle in ("coordinator: info: listening on",
                   "coordinator: info: server 1 (", "joined: local to rank 0",
                   "coordinator: info: rank 0's client joined",
                   "dataserver: info: rank 0 (server 1) registered",
                   "coordinator: info: server 1 (local:rank-0) left"):
        assert needle in default, (needle, default)
    # nothing per batch at the default level; debug has it per task
    assert not any(x in default for x in PER_BATCH), default
    for x in PER_BATCH:
        assert debug.count(x) >= 8, (x, debug)
    assert len(debug.splitlines()) > len(default.splitlines()) + 16
    # error hides info (and this run has no error)
    assert ": info: " not in error and error.strip() == "", error
    for line in default.splitlines() + debug.splitlines():
        if line.startswith("datahelix: "):
            assert any(f": {lv}: " in line
                       for lv in ("debug", "info", "warn", "error")), line


def test_an_unknown_log_level_is_said_once(slow_set, tmp_path):
    err = logged_run(slow_set, tmp_path, "loud")
    warned = [x for x in err.splitlines() if "DATAHELIX_LOG='loud'" in x]
    assert 1 <= len(warned) <= 3, err  # once per process
    assert ": info: " in err  # and info is used


def test_the_python_logger_carries_the_services_lines(slow_set, tmp_path):
    """The embedded Coordinator's lines go through logging.getLogger(
    "datahelix"): an application's handler sees them with their level."""
    index, _ = slow_set
    code = f"""
import json, logging, datahelix
got = []
class H(logging.Handler):
    def emit(self, r):
        got.append((r.levelname, r.getMessage()))
lg = logging.getLogger("datahelix")
lg.handlers[:] = [H()]
ld = datahelix.DataLoader({str(index)!r}, batch_size=1, frames=8,
                          size=(64, 64), rank=0, world_size=1)
for b in ld:
    pass
ld.close()
print(json.dumps(got))
"""
    # info on request (the loaders' default is warnings only)
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python"),
               DATAHELIX_LOG="info")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True,
                       text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout.splitlines()[-1])
    lines = [m for lv, m in got if lv == "INFO"]
    assert any("coordinator" in m and "listening on" in m for m in lines), got
    assert "listening on" not in p.stderr  # the handler took them


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_remote_sidecars_tasks_are_on_its_own_track(slow_set, tmp_path):
    """Round-robin over the rank's local server and a remote sidecar: the
    sidecar's tasks are drawn on its own process, named by its id, with
    their transfer; the local server's place and notify on the rank's
    delivery track; a late step of a remote part names the sidecar."""
    from conftest import stop_process
    index, _ = slow_set
    binary = os.environ.get("DATAHELIX_BIN", str(ROOT / "build" / "datahelix"))
    sock = tmp_path / "c.sock"
    co = subprocess.Popen([binary, "coordinator", "--listen", f"ipc://{sock}",
                           "--policy", "round-robin"],
                          stderr=subprocess.DEVNULL)
    procs = [co]
    try:
        for _ in range(500):
            if sock.exists():
                break
            subprocess.run(["sleep", "0.01"])
        procs.append(subprocess.Popen(
            [binary, "dataserver", "--remote", "--coordinator",
             f"ipc://{sock}", "--index", index, "--server-id", "77"],
            stderr=subprocess.DEVNULL))
        trace = tmp_path / "t.json"
        p = None
        for _ in range(50):  # until the sidecar has registered
            p = consume(f"ipc://{sock}", index, "--listen",
                        f"tcp://127.0.0.1:{free_port()}", "--trace", trace)
            assert p.returncode == 0, p.stderr
            doc = json.loads(trace.read_text())
            if any(e["pid"] == 100077 for e in doc["traceEvents"]):
                break
        names = check_perfetto(doc)
    finally:
        for x in reversed(procs):
            stop_process(x)
    assert names[(100077, 0, "process_name")] == "DataServer 77 (remote)"
    ev = doc["traceEvents"]
    remote = [e for e in ev if e["pid"] == 100077 and e["ph"] == "X"]
    assert {"queue", "read", "decode", "scale", "collate", "transfer"} <= \
        {e["cat"] for e in remote}
    assert any(e.get("cat") == "place" and e["pid"] == 1 for e in ev)
    for e in ev:
        late = (e.get("args") or {}).get("late")
        if late and late["remote"]:
            assert late["server"] == 77, late
