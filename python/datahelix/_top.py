"""`datahelix top ADDR`: a live terminal view of a running job, read from
its Coordinator's metrics endpoint (`coordinator --metrics-listen`,
docs/metrics.md): per DataServer alive/dead, queue depth, busy workers,
task latency EWMA, bytes/s out and in, errors; per rank the window,
input-wait p95, misses and steps.  Refreshes every second; `q` quits;
`--once` prints one frame and exits (for scripts and logs).

Design: three pure parts, unit tested (tests/integration/test_top.py):
parse() reads Prometheus text exposition, model() gathers the samples
into servers, ranks and job totals, render() lays a frame out as lines
of at most `width` characters.  The loop around them is the only I/O:
an HTTP GET (urllib, bounded by a timeout), then the frame drawn with
plain ANSI codes (home, clear to end of line / screen, the alternate
screen, cursor hidden), so it works over ssh and in tmux; the terminal
is put in cbreak mode to read `q` without Enter and restored on every
exit path (q, Ctrl-C, SIGTERM, an error).

This file imports nothing from the datahelix package (whose __init__
loads torch): `datahelix top` runs it by path (src/cli/cmd_top.c), so it
starts at once and needs no torch.
"""
import argparse
import math
import os
import select
import shutil
import signal
import stat
import sys
import time
import urllib.error
import urllib.request

TIMEOUT_S = 2.0

# ---- parsing the exposition text ------------------------------------------


def _labels(s, i):
    """Parses `{a="x",b="y"}` starting at s[i] == '{'; (dict, next i)."""
    out = {}
    i += 1
    while True:
        while i < len(s) and s[i] in " ,":
            i += 1
        if i < len(s) and s[i] == "}":
            return out, i + 1
        eq = s.index("=", i)
        name = s[i:eq].strip()
        if s[eq + 1] != '"':
            raise ValueError(f"label {name}: value not quoted")
        j, val = eq + 2, []
        while s[j] != '"':
            if s[j] == "\\":
                j += 1
                val.append({"n": "\n", "\\": "\\", '"': '"'}.get(s[j],
                                                                 s[j]))
            else:
                val.append(s[j])
            j += 1
        out[name] = "".join(val)
        i = j + 1


def parse(text):
    """{metric name: [(labels dict, float value)]}; comments skipped.  A
    malformed line raises ValueError naming it."""
    out = {}
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        try:
            brace, space = line.find("{"), line.find(" ")
            if brace >= 0 and (space < 0 or brace < space):
                name = line[:brace]
                labels, i = _labels(line, brace)
                rest = line[i:].split()
            else:
                name, labels, rest = line[:space], {}, line[space:].split()
            out.setdefault(name, []).append((labels, float(rest[0])))
        except (ValueError, IndexError) as e:
            raise ValueError(f"line {n}: {line[:80]!r}: {e}") from None
    return out


def quantile(buckets, q):
    """The q-quantile from cumulative histogram buckets [(le, count)],
    linear within its bucket (as Prometheus' histogram_quantile); None
    without observations.  Above the last finite bound: that bound."""
    buckets = sorted(buckets)
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank, lo, prev = q * buckets[-1][1], 0.0, 0.0
    for le, cum in buckets:
        if cum >= rank:
            if math.isinf(le):
                return lo
            width = cum - prev
            return lo + (le - lo) * ((rank - prev) / width if width else 1)
        lo, prev = le, cum
    return lo


# ---- the model --------------------------------------------------------------

SERVER_FIELDS = {
    "datahelix_server_up": "up",
    "datahelix_server_dead": "dead",
    "datahelix_server_queue_depth": "queue",
    "datahelix_server_busy_workers": "busy",
    "datahelix_server_workers": "workers",
    "datahelix_server_latency_ewma_ms": "latency_ms",
    "datahelix_server_out_bytes_per_second": "out_bps",
    "datahelix_server_in_bytes_per_second": "in_bps",
    "datahelix_server_errors_total": "errors",
    "datahelix_server_tasks_total": "tasks",
    "datahelix_server_fetched_bytes_total": "fetched",
    "datahelix_server_cache_hits_total": "cache_hits",
    "datahelix_server_cache_misses_total": "cache_misses",
}
RANK_FIELDS = {
    "datahelix_rank_steps": "steps",
    "datahelix_rank_misses": "misses",
    "datahelix_rank_window_ms": "window_ms",
    "datahelix_rank_last_input_wait_ms": "last_wait_ms",
    "datahelix_rank_requests_total": "requests",
    "datahelix_rank_late_total": "late",
    "datahelix_rank_inflight_tasks": "inflight",
}
JOB_FIELDS = {
    "datahelix_requests_total": "requests",
    "datahelix_results_total": "results",
    "datahelix_pending_requests": "pending",
    "datahelix_inflight_tasks": "inflight",
    "datahelix_deadline_misses_total": "late",
    "datahelix_task_errors_total": "errors",
    "datahelix_rerouted_total": "rerouted",
    "datahelix_dead_servers_total": "dead",
    "datahelix_uptime_seconds": "uptime_s",
}


def _buckets(samples, key=None):
    """{label value of `key` (None: one group): [(le, count)]}."""
    out = {}
    for lb, v in samples:
        k = lb.get(key) if key else None
        out.setdefault(k, []).append((float(lb["le"]), v))
    return out


def model(m):
    """Servers (by id), ranks (by rank) and job totals from parse()."""
    servers, ranks, job = {}, {}, {}
    for name, field in SERVER_FIELDS.items():
        for lb, v in m.get(name, []):
            s = servers.setdefault(int(lb["server"]), {
                "id": int(lb["server"]), "role": lb.get("role", "?"),
                "rank": lb.get("rank"), "addr": lb.get("addr", "")})
            s[field] = v
    for name, field in RANK_FIELDS.items():
        for lb, v in m.get(name, []):
            ranks.setdefault(int(lb["rank"]), {"rank": int(lb["rank"])})[
                field] = v
    for r, b in _buckets(m.get("datahelix_rank_input_wait_ms_bucket", []),
                         "rank").items():
        ranks.setdefault(int(r), {"rank": int(r)})["wait_p95_ms"] = \
            quantile(b, 0.95)
    for name, field in JOB_FIELDS.items():
        if m.get(name):
            job[field] = m[name][0][1]
    job["decisions"] = sum(v for _, v in m.get("datahelix_decisions_total",
                                                []))
    dec = _buckets(m.get("datahelix_decision_us_bucket", [])).get(None)
    job["decision_p95_us"] = quantile(dec, 0.95) if dec else None
    return {"servers": servers, "ranks": ranks, "job": job}


# ---- rendering ----------------------------------------------------------------

def _bytes(v):
    if v is None:
        return "-"
    for unit in ("B", "kB", "MB", "GB"):
        if abs(v) < 1000 or unit == "GB":
            return f"{v:.0f} {unit}/s" if unit == "B" else f"{v:.1f} {unit}/s"
        v /= 1000
    return "-"


def _ms(v):
    if v is None:
        return "-"
    return f"{v:.2f}ms" if v < 10 else f"{v:.0f}ms"


def _n(v):
    return "-" if v is None else f"{int(v)}"


def _dur(s):
    s = int(s or 0)
    return f"{s // 3600}h{s // 60 % 60:02d}m" if s >= 3600 else \
        f"{s // 60}m{s % 60:02d}s"


def _state(s):
    if s.get("up"):
        return "alive"
    return "dead" if s.get("dead") else "left"


def render(mdl, width, title, clock=None):
    """The frame as lines of at most `width` characters."""
    job, lines = mdl["job"], []
    clock = clock or time.strftime("%H:%M:%S")
    lines.append(f"datahelix top  {title}  up {_dur(job.get('uptime_s'))}  "
                 f"{clock}   (q quits)")
    p95 = job.get("decision_p95_us")
    lines.append(
        f"requests {_n(job.get('requests'))}  results "
        f"{_n(job.get('results'))}  pending {_n(job.get('pending'))}  "
        f"inflight {_n(job.get('inflight'))}  decisions "
        f"{_n(job.get('decisions'))} (p95 "
        f"{'-' if p95 is None else f'{p95:.0f}'} us)  late "
        f"{_n(job.get('late'))}  errors {_n(job.get('errors'))}  re-routed "
        f"{_n(job.get('rerouted'))}  dead {_n(job.get('dead'))}")
    lines.append("")
    srv = mdl["servers"]
    lines.append(f"DATASERVERS ({sum(1 for s in srv.values() if s.get('up'))}"
                 f" alive of {len(srv)})")
    lines.append(f"{'ID':>6} {'ROLE':<6} {'RANK':>4} {'STATE':<5} "
                 f"{'QUEUE':>5} {'BUSY':>9} {'LAT EWMA':>9} {'OUT':>11} "
                 f"{'IN':>11} {'ERRORS':>6} {'CACHE':>5} {'FETCHED':>9}  "
                 "ADDR")
    for sid in sorted(srv):
        s = srv[sid]
        busy = f"{_n(s.get('busy'))}/{_n(s.get('workers'))}"
        lines.append(
            f"{sid:>6} {s['role']:<6} {s.get('rank') or '-':>4} "
            f"{_state(s):<5} {_n(s.get('queue')):>5} {busy:>9} "
            f"{_ms(s.get('latency_ms')):>9} {_bytes(s.get('out_bps')):>11} "
            f"{_bytes(s.get('in_bps')):>11} {_n(s.get('errors')):>6} "
            f"{_hit_rate(s):>5} {_total(s.get('fetched')):>9}  "
            f"{s['addr']}")
    lines.append("")
    rk = mdl["ranks"]
    lines.append(f"RANKS ({len(rk)})")
    lines.append(f"{'RANK':>6} {'STEPS':>7} {'MISSES':>6} {'WAIT P95':>9} "
                 f"{'LAST WAIT':>9} {'WINDOW':>8} {'INFLIGHT':>8} "
                 f"{'LATE':>6}")
    for r in sorted(rk):
        x = rk[r]
        lines.append(
            f"{r:>6} {_n(x.get('steps')):>7} {_n(x.get('misses')):>6} "
            f"{_ms(x.get('wait_p95_ms')):>9} {_ms(x.get('last_wait_ms')):>9} "
            f"{_ms(x.get('window_ms')):>8} {_n(x.get('inflight')):>8} "
            f"{_n(x.get('late')):>6}")
    return [ln[:width] for ln in lines]


# ---- I/O ------------------------------------------------------------------------

def url_of(addr):
    """HOST:PORT or http://HOST:PORT[/PATH] -> the metrics URL."""
    if not addr.startswith(("http://", "https://")):
        addr = "http://" + addr
    scheme, rest = addr.split("://", 1)
    if "/" not in rest:
        rest += "/metrics"
    return f"{scheme}://{rest}"


def read_token(path):
    """The first line of an owner-only file (as the Coordinator reads it)."""
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode) or st.st_mode & 0o077:
        raise SystemExit(f"datahelix top: token file {path}: must be a "
                         "regular file that group and others cannot read "
                         f"(chmod 600 {path})")
    with open(path, encoding="utf-8") as f:
        return f.readline().strip()


def fetch(url, token=None):
    """The exposition text; raises OSError with a message naming `url`."""
    req = urllib.request.Request(url)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT_S) as r:
            return r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        hint = (" (give --token-file with the Coordinator's "
                "--metrics-token-file)" if e.code == 401 else "")
        raise OSError(f"{url}: HTTP {e.code} {e.reason}{hint}") from None
    except (urllib.error.URLError, OSError, ValueError) as e:
        why = getattr(e, "reason", e)
        raise OSError(f"cannot reach {url}: {why} (is the Coordinator "
                      "running with --metrics-listen?)") from None


def _hit_rate(s):
    """Chunks of remote objects found in the host cache, of those looked
    for; "-" without remote reads."""
    h, m = s.get("cache_hits") or 0, s.get("cache_misses") or 0
    return f"{100 * h / (h + m):.0f}%" if h + m else "-"


def _total(b):
    """Bytes as B, kB, MB, GB; "-" for none."""
    if not b:
        return "-"
    for unit, k in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if b >= k:
            return f"{b / k:.1f} {unit}"
    return f"{b:.0f} B"


def frame(url, token, width):
    try:
        return render(model(parse(fetch(url, token))), width, url)
    except (OSError, ValueError) as e:
        return [f"datahelix top  {url}  {time.strftime('%H:%M:%S')}   "
                "(q quits)"[:width], "", str(e)[:width]]


def _on_term(signum, frm):
    raise SystemExit(128 + signum)


def live(url, token, interval):
    """Redraws every `interval` s until q (or Ctrl-C / SIGTERM); the
    terminal is restored on every way out."""
    import termios
    import tty

    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    old_term = signal.signal(signal.SIGTERM, _on_term)
    out = sys.stdout
    try:
        tty.setcbreak(fd)
        out.write("\x1b[?1049h\x1b[?25l")  # alternate screen, no cursor
        while True:
            cols, rows = shutil.get_terminal_size((100, 40))
            lines = frame(url, token, cols)[:rows]
            out.write("\x1b[H" + "".join(ln + "\x1b[K\r\n"
                                         for ln in lines[:-1]))
            out.write(lines[-1] + "\x1b[K\x1b[J")
            out.flush()
            end = time.monotonic() + interval
            while (left := end - time.monotonic()) > 0:
                ready, _, _ = select.select([fd], [], [], left)
                if ready and os.read(fd, 64).lower().find(b"q") >= 0:
                    return 0
    except KeyboardInterrupt:
        return 130
    finally:
        out.write("\x1b[?25h\x1b[?1049l")
        out.flush()
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)
        signal.signal(signal.SIGTERM, old_term)


def main(argv=None):
    ap = argparse.ArgumentParser(
        prog="datahelix top",
        description="Live view of a running job from its Coordinator's "
                    "metrics endpoint (datahelix coordinator "
                    "--metrics-listen ADDR; docs/metrics.md).  q quits.")
    ap.add_argument("addr", metavar="ADDR",
                    help="HOST:PORT or http://HOST:PORT[/PATH] of the "
                         "endpoint (path default /metrics)")
    ap.add_argument("--once", action="store_true",
                    help="print one frame and exit (non-zero if the "
                         "endpoint cannot be read)")
    ap.add_argument("--token-file", metavar="FILE",
                    help="bearer token file (mode 0600), as the "
                         "Coordinator's --metrics-token-file")
    ap.add_argument("--interval", type=float, default=1.0, metavar="S",
                    help="seconds between refreshes (default 1)")
    a = ap.parse_args(argv)
    if not a.interval > 0:
        ap.error("--interval must be > 0")
    url = url_of(a.addr)
    token = read_token(a.token_file) if a.token_file else None
    if a.once or not (sys.stdin.isatty() and sys.stdout.isatty()):
        try:
            text = fetch(url, token)
            lines = render(model(parse(text)), 10 ** 6, url)
        except (OSError, ValueError) as e:
            print(f"datahelix top: {e}", file=sys.stderr)
            return 1
        print("\n".join(lines))
        return 0
    return live(url, token, a.interval)


if __name__ == "__main__":
    sys.exit(main())
