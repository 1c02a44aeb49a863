"""The Coordinator's metrics endpoint and `datahelix top` (issue 18 items 2
and 3; docs/metrics.md).

While a small two-rank job runs, the endpoint parses as Prometheus text
(Debian's python3-prometheus-client parser), its counters move, and `top
--once` shows every DataServer and rank; in tmux a live frame renders, `q`
quits and the terminal is restored.  A bind beyond loopback without a
token is refused; with a token a wrong or missing one gets 401; hostile
HTTP (oversized headers, an idle half-sent request, wrong path or method)
gets an error or a closed connection and never stops the endpoint.  The
Python loader serves the endpoint with metrics_listen=.  Every wait is
bounded; each test ends only the processes it started, by pid.
"""
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from conftest import ROOT, probed_set, run_dh, _binary
from procs import wait_until
from test_runtime import Proc, consume_args

prom = pytest.importorskip("prometheus_client.parser")

sys.path.insert(0, str(ROOT / "python"))
import datahelix._top as top  # noqa: E402  (standard library only)


def metrics_addr(proc, seconds=10):
    """HOST:PORT from the Coordinator's "metrics on http://..." line."""
    found = []

    def seen():
        m = re.search(r"metrics on http://([^/\s]+)/metrics",
                      proc.err_so_far())
        if m:
            found.append(m.group(1))
        return bool(found) or proc.p.poll() is not None
    assert wait_until(seen, seconds), proc.err_so_far()
    assert found, proc.stop()
    return found[0]


def get(addr, path="/metrics", token=None, timeout=5):
    req = urllib.request.Request(f"http://{addr}{path}")
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def rank_steps(addr):
    """{rank label: datahelix_rank_steps} of the endpoint now."""
    f = families(get(addr)[1]).get("datahelix_rank_steps")
    return {s.labels["rank"]: s.value for s in f.samples} if f else {}


def families(text):
    return {f.name: f for f in prom.text_string_to_metric_families(text)}


def value(fams, name, **labels):
    """The sample `name` (a sample name: _total / _bucket included)."""
    for f in fams.values():
        for s in f.samples:
            if s.name == name and all(s.labels.get(k) == v
                                      for k, v in labels.items()):
                return s.value
    raise AssertionError(f"no sample {name} {labels}")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return probed_set(tmp_path_factory.mktemp("mx"), "S", 12, 3, index=True)


@pytest.fixture
def coordinator(tmp_path):
    addr = f"ipc://{tmp_path}/coord.sock"
    c = Proc("coordinator", "--listen", addr, "--heartbeat-timeout-ms", 1000,
             "--metrics-listen", "127.0.0.1:0", "--metrics-interval-ms", 100)
    assert wait_until(lambda: (tmp_path / "coord.sock").exists(), 10), \
        c.stop()
    yield addr, metrics_addr(c), c
    c.stop()


@pytest.fixture
def job(dataset, coordinator):
    """Two ranks consuming many short epochs (a 20 ms window per step),
    each with its embedded local DataServer; stopped by pid."""
    coord, maddr, c = coordinator
    ranks = [Proc(*consume_args(coord, dataset / "m.dhx", r, 2, 2,
                                "--epochs", 200, "--window-ms", 20))
             for r in (0, 1)]
    # Both ranks are stepping once both have reported a step (a rank's
    # first report comes with its first request, at 0 steps).
    def stepping():
        steps = rank_steps(maddr)
        return len(steps) == 2 and all(v > 0 for v in steps.values())

    assert wait_until(stepping, 60), \
        [p.stop() for p in ranks]
    yield maddr, ranks, c
    for p in ranks:
        p.p.send_signal(2)  # SIGINT: a clean end
    for p in ranks:
        p.stop()


# ---- the exposition while a job runs ----------------------------------------

def test_endpoint_parses_and_its_counters_move(job):
    maddr, _, _ = job
    status, t1 = get(maddr)
    assert status == 200
    f1 = families(t1)
    # Types as docs/metrics.md lists them.
    assert f1["datahelix_decisions"].type == "counter"
    assert f1["datahelix_decision_us"].type == "histogram"
    assert f1["datahelix_rank_input_wait_ms"].type == "histogram"
    assert f1["datahelix_server_queue_depth"].type == "gauge"
    assert f1["datahelix_server_up"].type == "gauge"
    servers = {s.labels["server"] for s in f1["datahelix_server_up"].samples}
    assert len(servers) == 2, servers
    time.sleep(1.5)
    f2 = families(get(maddr)[1])
    for name in ("datahelix_requests_total", "datahelix_results_total",
                 "datahelix_decision_us_count", "datahelix_heartbeats_total",
                 "datahelix_payload_bytes_total"):
        assert value(f2, name) > value(f1, name), name
    for r in ("0", "1"):
        assert value(f2, "datahelix_rank_steps", rank=r) > \
            value(f1, "datahelix_rank_steps", rank=r)
        assert value(f2, "datahelix_rank_input_wait_ms_count", rank=r) > 0
    for sid in servers:
        assert value(f2, "datahelix_server_tasks_total", server=sid) > \
            value(f1, "datahelix_server_tasks_total", server=sid)
        assert value(f2, "datahelix_server_up", server=sid) == 1
        assert value(f2, "datahelix_server_workers", server=sid) == 2
    assert sum(value(f2, "datahelix_server_out_bytes_per_second", server=s)
               for s in servers) > 0
    # Histogram buckets are cumulative and end at the count.
    b = [s.value for s in f2["datahelix_decision_us"].samples
         if s.name.endswith("_bucket")]
    assert b == sorted(b) and b[-1] == value(f2, "datahelix_decision_us_count")


def test_top_once_shows_every_dataserver_and_rank(job):
    maddr, _, _ = job
    p = run_dh("top", maddr, "--once", timeout=30)
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert "DATASERVERS (2 alive of 2)" in out, out
    assert "RANKS (2)" in out, out
    srv = [ln for ln in out.splitlines() if "local:rank-" in ln]
    assert len(srv) == 2 and all(" alive " in ln for ln in srv), out
    rows = out.split("RANKS (2)", 1)[1].splitlines()[2:]
    assert [int(r.split()[0]) for r in rows if r.strip()] == [0, 1], out
    assert all(int(r.split()[1]) > 0 for r in rows if r.strip()), out


def test_top_in_tmux_renders_and_q_quits_restoring_the_terminal(job,
                                                                tmp_path):
    maddr, _, _ = job
    if not shutil.which("tmux"):
        pytest.skip("tmux is not installed (scripts/setup-deps.sh)")
    sock = f"dh-top-{os.getpid()}"
    stty = tmp_path / "stty.txt"
    # The shell traps SIGINT (Ctrl-C reaches the whole foreground group)
    # so that it outlives top and records how the terminal was left.
    script = (f"trap true INT; {_binary()} top {maddr}; "
              f"echo \"rc=$?\" > {stty}.rc; stty -a > {stty}; sleep 30")
    tm = ["tmux", "-L", sock]
    subprocess.run(tm + ["-f", "/dev/null", "new-session", "-d", "-x", "120",
                         "-y", "40", "sh", "-c", script], check=True,
                   timeout=10)
    try:
        def pane():
            return subprocess.run(tm + ["capture-pane", "-p"],
                                  capture_output=True, text=True,
                                  timeout=10).stdout
        assert wait_until(lambda: "DATASERVERS (2 alive of 2)" in pane()
                          and "RANKS (2)" in pane(), 20), pane()
        subprocess.run(tm + ["send-keys", "q"], check=True, timeout=10)
        assert wait_until(lambda: stty.exists() and stty.read_text(), 10), \
            pane()
        assert (tmp_path / "stty.txt.rc").read_text().strip() == "rc=0"
        modes = stty.read_text().split()
        assert "icanon" in modes and "echo" in modes, modes  # restored
        # Ctrl-C quits too (130), the terminal restored the same way.
        stty.unlink()
        subprocess.run(tm + ["new-window", "sh", "-c", script], check=True,
                       timeout=10)
        assert wait_until(lambda: "RANKS (2)" in pane(), 20), pane()
        subprocess.run(tm + ["send-keys", "C-c"], check=True, timeout=10)
        assert wait_until(lambda: stty.exists() and stty.read_text(), 10), \
            pane()
        assert (tmp_path / "stty.txt.rc").read_text().strip() == "rc=130"
        modes = stty.read_text().split()
        assert "icanon" in modes and "echo" in modes, modes
    finally:
        subprocess.run(tm + ["kill-server"], timeout=10)


# ---- trust and hostile HTTP -------------------------------------------------

def test_beyond_loopback_is_refused_without_a_token(tmp_path):
    p = run_dh("coordinator", "--listen", f"ipc://{tmp_path}/c.sock",
               "--metrics-listen", "0.0.0.0:0", timeout=20)
    assert p.returncode != 0
    assert "refusing to listen on 0.0.0.0:0 without a token" in p.stderr
    assert "--metrics-token-file" in p.stderr
    p = run_dh("coordinator", "--listen", f"ipc://{tmp_path}/c.sock",
               "--metrics-token-file", tmp_path / "t", timeout=20)
    assert p.returncode != 0 and "need --metrics-listen" in p.stderr


@pytest.fixture
def token_coordinator(tmp_path):
    tok = tmp_path / "token"
    tok.write_text("a-long-enough-secret-token\n")
    tok.chmod(0o600)
    c = Proc("coordinator", "--listen", f"ipc://{tmp_path}/c.sock",
             "--metrics-listen", "127.0.0.1:0", "--metrics-token-file", tok)
    yield metrics_addr(c), tok, c
    c.stop()


def test_token_is_required_and_checked(token_coordinator, tmp_path):
    addr, tok, _ = token_coordinator
    assert get(addr)[0] == 401
    assert get(addr, token="a-long-enough-secret-tokem")[0] == 401
    assert get(addr, token="a-long-enough-secret-token-")[0] == 401
    status, text = get(addr, token="a-long-enough-secret-token")
    assert status == 200 and "datahelix_requests_total" in text
    p = run_dh("top", addr, "--once", timeout=30)
    assert p.returncode == 1 and "HTTP 401" in p.stderr, p.stderr
    p = run_dh("top", addr, "--once", "--token-file", tok, timeout=30)
    assert p.returncode == 0 and "DATASERVERS (0 alive of 0)" in p.stdout
    loose = tmp_path / "loose"
    loose.write_text("a-long-enough-secret-token\n")
    loose.chmod(0o644)
    p = run_dh("coordinator", "--listen", f"ipc://{tmp_path}/d.sock",
               "--metrics-listen", "127.0.0.1:0", "--metrics-token-file",
               loose, timeout=20)
    assert p.returncode != 0 and "chmod 600" in p.stderr


def raw(addr, data, seconds=8):
    """Sends `data`, returns what comes back until the server closes."""
    host, port = addr.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=seconds) as s:
        s.sendall(data)
        got = b""
        try:
            while chunk := s.recv(65536):
                got += chunk
        except (ConnectionResetError, socket.timeout):
            pass
        return got


def test_hostile_http_never_stops_the_endpoint(coordinator):
    _, addr, c = coordinator
    assert get(addr, "/nope")[0] == 404
    host, port = addr.rsplit(":", 1)
    # An idle half-sent request holds one connection until the timeout.
    idle = socket.create_connection((host, int(port)), timeout=10)
    idle.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
    t0 = time.monotonic()
    assert get(addr)[0] == 200  # served meanwhile
    try:  # the server closes it (5 s); a socket.timeout here fails
        assert idle.recv(1024) == b""
    except ConnectionResetError:
        pass
    assert time.monotonic() - t0 < 9
    idle.close()
    # Oversized headers: an error status, never a served body.
    big = b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 65536 + \
        b"\r\n\r\n"
    try:
        got = raw(addr, big)
        assert not got or re.match(rb"HTTP/1\.[01] 4\d\d", got), got[:200]
    except (BrokenPipeError, ConnectionResetError):
        pass
    resp = raw(addr, b"POST /metrics HTTP/1.0\r\nContent-Length: 3\r\n\r\nabc")
    assert resp.startswith(b"HTTP/1.0 405") or resp.startswith(b"HTTP/1.1 405")
    resp = raw(addr, b"garbage\r\n\r\n")
    assert not resp or re.match(rb"HTTP/1\.[01] 4\d\d", resp), resp[:200]
    assert get(addr)[0] == 200
    assert c.p.poll() is None


# ---- the pure parts of top ----------------------------------------------------

def test_top_parser_agrees_with_prometheus_client():
    text = ('# HELP x_total A.\n# TYPE x_total counter\n'
            'x_total{a="q\\"uo\\\\te",b="n\\nl"} 3\nx_total 4.5\n'
            'h_bucket{le="1"} 2\nh_bucket{le="10"} 10\n'
            'h_bucket{le="+Inf"} 10\n')
    mine = top.parse(text)
    theirs = [s for f in prom.text_string_to_metric_families(text)
              for s in f.samples if s.name == "x_total"]
    assert [(lb, v) for lb, v in mine["x_total"]] == \
        [(s.labels, s.value) for s in theirs]
    assert mine["x_total"][0][0] == {"a": 'q"uo\\te', "b": "n\nl"}
    b = [(float(lb["le"]), v) for lb, v in mine["h_bucket"]]
    assert top.quantile(b, 0.5) == pytest.approx(1 + 9 * (3 / 8))
    assert top.quantile(b, 0.1) == pytest.approx(0.5)
    assert top.quantile([(1.0, 0), (float("inf"), 0)], 0.95) is None
    assert top.quantile([(1.0, 0), (float("inf"), 4)], 0.95) == 1.0
    with pytest.raises(ValueError, match="line 1"):
        top.parse('x{a=unquoted} 1\n')


def test_top_render_fits_the_width_and_names_states():
    mdl = top.model(top.parse(
        'datahelix_server_up{server="3",role="remote",addr="tcp://h:1"} 0\n'
        'datahelix_server_dead{server="3",role="remote",addr="tcp://h:1"} 1\n'
        'datahelix_server_up{server="1",role="local",rank="0",addr="l"} 1\n'
        'datahelix_rank_steps{rank="0"} 7\n'
        'datahelix_rank_input_wait_ms_bucket{rank="0",le="1"} 1\n'
        'datahelix_rank_input_wait_ms_bucket{rank="0",le="+Inf"} 1\n'))
    lines = top.render(mdl, 40, "t", clock="00:00:00")
    assert all(len(ln) <= 40 for ln in lines)
    wide = top.render(mdl, 500, "t", clock="00:00:00")
    s1 = next(ln for ln in wide if ln.split()[:1] == ["1"])
    s3 = next(ln for ln in wide if ln.split()[:1] == ["3"])
    assert " alive " in s1 and " dead " in s3
    assert "DATASERVERS (1 alive of 2)" in wide
    assert top.url_of("127.0.0.1:9") == "http://127.0.0.1:9/metrics"
    assert top.url_of("http://h:9/x") == "http://h:9/x"


# ---- the Python loader ------------------------------------------------------------

def test_dataloader_serves_metrics(dataset, monkeypatch):
    pytest.importorskip("torch")
    import datahelix
    monkeypatch.setenv("DATAHELIX_BIN", _binary())
    monkeypatch.delenv("DATAHELIX_COORDINATOR", raising=False)
    with pytest.raises(ValueError, match="metrics_token_file= needs"):
        datahelix.DataLoader(dataset / "m.jsonl", batch_size=2, frames=4,
                             size=(32, 32), metrics_token_file="x")
    with pytest.raises(ValueError, match="it starts none"):
        datahelix.DataLoader(dataset / "m.jsonl", batch_size=2, frames=4,
                             size=(32, 32), coordinator="ipc:///nowhere",
                             metrics_listen="127.0.0.1:0")
    with pytest.raises(ValueError, match="metrics_token_file= needs"):
        datahelix.DistributedDataLoader([1, 2, 3], metrics_token_file="x")
    with datahelix.DataLoader(dataset / "m.jsonl", batch_size=2, frames=4,
                              size=(32, 32),
                              metrics_listen="127.0.0.1:0") as loader:
        n = sum(1 for _ in loader)
        addr = loader.metrics_address
        assert addr and addr.startswith("127.0.0.1:")
        assert wait_until(lambda: "0" in rank_steps(addr), 10)
        fams = families(get(addr)[1])
        # Every step's request, and the steps as of the last one (sent
        # `prefetch` steps ahead: the report lags by about that many).
        assert value(fams, "datahelix_rank_requests_total", rank="0") == n
        assert 0 < value(fams, "datahelix_rank_steps", rank="0") < n
