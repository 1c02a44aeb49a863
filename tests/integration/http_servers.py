"""Real HTTP servers for the remote-source tests (issue 37): Debian's nginx
on loopback (HTTP/1.1, and HTTPS with HTTP/2 and a certificate the test
makes), and a small threaded server of the test's own that serves byte
ranges and misbehaves on request (503 SlowDown with Retry-After, a reset
mid-body, a stall, no Range support), counting what it was asked.

Each server is started by the test and ended by pid; nothing binds beyond
127.0.0.1.
"""
import http.server
import os
import pathlib
import re
import shutil
import socket
import socketserver
import subprocess
import threading
import time

import pytest

from procs import free_port, wait_until

NGINX = shutil.which("nginx") or "/usr/sbin/nginx"


def _accepts(port):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def make_cert(d):
    """A self-signed certificate for 127.0.0.1 (its own CA): (cert, key)."""
    d = pathlib.Path(d)
    cert, key = d / "cert.pem", d / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048",
                    "-nodes", "-days", "2", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True, timeout=60)
    return cert, key


class Nginx:
    """nginx serving `root` on 127.0.0.1: `url` (HTTP/1.1) and, with a
    certificate, `tls_url` (HTTPS, HTTP/2).  The access log records each
    request's connection serial and protocol (`requests()`)."""

    def __init__(self, root, workdir, cert=None):
        if not os.access(NGINX, os.X_OK):
            pytest.fail("nginx not installed: run scripts/setup-deps.sh")
        self.dir = pathlib.Path(workdir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.tls_port = free_port() if cert else None
        self.log = self.dir / "access.log"
        tls = ""
        if cert:
            tls = (f"server {{ listen 127.0.0.1:{self.tls_port} ssl http2; "
                   f"ssl_certificate {cert[0]}; "
                   f"ssl_certificate_key {cert[1]}; root {root}; }}")
        temps = " ".join(f"{k}_temp_path {self.dir}/{k};" for k in
                         ("client_body", "proxy", "fastcgi", "uwsgi",
                          "scgi"))
        user = "user root;" if os.geteuid() == 0 else ""
        conf = f"""{user}
daemon off;
worker_processes 1;
pid {self.dir}/nginx.pid;
error_log {self.dir}/error.log warn;
events {{ worker_connections 256; }}
http {{
  log_format dh '$connection $connection_requests $server_protocol '
                '$status "$request" $http_range';
  access_log {self.log} dh;
  keepalive_requests 10000;
  {temps}
  server {{ listen 127.0.0.1:{self.port}; root {root}; }}
  {tls}
}}
"""
        (self.dir / "nginx.conf").write_text(conf)
        self.proc = subprocess.Popen(
            [NGINX, "-c", str(self.dir / "nginx.conf"), "-p", str(self.dir),
             "-e", str(self.dir / "error.log")],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        ok = wait_until(lambda: _accepts(self.port) and
                        (not cert or _accepts(self.tls_port)), 10)
        if not ok:
            self.stop()
            raise AssertionError("nginx did not start: " +
                                 (self.dir / "error.log").read_text()
                                 if (self.dir / "error.log").exists()
                                 else "no error log")
        self.url = f"http://127.0.0.1:{self.port}"
        self.tls_url = f"https://127.0.0.1:{self.tls_port}" if cert else None

    def requests(self):
        """[(connection, n-th request on it, protocol, status, request)]"""
        out = []
        if self.log.exists():
            for line in self.log.read_text().splitlines():
                m = re.match(r'(\d+) (\d+) (\S+) (\d+) "([^"]*)"', line)
                if m:
                    out.append((int(m[1]), int(m[2]), m[3], int(m[4]),
                                m[5]))
        return out

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()  # nginx: fast shutdown, workers too
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


class Faults:
    """What the fault server does, per path (shared with its threads)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.fail_first = 0       # answer `status` to the first N requests
        self.status = 503
        self.retry_after = None   # Retry-After value sent with them
        self.reset_after = None   # cut the connection after N body bytes
        self.resets = 0           # ... for the first N ranged answers
        self.stall = False        # accept, read the request, never answer
        self.no_ranges = False    # answer 200 with the whole object
        self.delay = 0.0          # seconds before each answer
        self.inflight = 0         # answers under way now, and the most
        self.max_inflight = 0     # at once
        self.version = 1          # ETag "vN" of every object; If-Match
        self.bump_after = None    # checked (412); N: version += 1 after
                                  # the N-th answer
        self.seen = {}            # path -> requests seen
        self.ranges = []          # Range headers, in order
        self.spans = []           # (Range, start, end) of each answer


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):  # quiet
        pass

    def do_GET(self):
        f = self.server.faults
        with f.lock:
            f.inflight += 1
            f.max_inflight = max(f.max_inflight, f.inflight)
        t0 = time.monotonic()
        try:
            self._get(f)
        finally:
            with f.lock:
                f.inflight -= 1
                f.spans.append((self.headers.get("Range"), t0,
                                time.monotonic()))

    def _get(self, f):
        path = self.path.split("?", 1)[0]
        with f.lock:
            n = f.seen.get(path, 0) + 1
            f.seen[path] = n
            f.ranges.append(self.headers.get("Range"))
            stall, fail, delay = f.stall, n <= f.fail_first, f.delay
            etag = f'"v{f.version}"'
            total = sum(f.seen.values())
            if f.bump_after is not None and total == f.bump_after:
                f.version += 1
            reset = f.reset_after if f.resets > 0 else None
            if reset is not None:
                f.resets -= 1
        if delay:
            self.server.stop_evt.wait(delay)
        if stall:
            self.server.stop_evt.wait(60)
            self.close_connection = True
            return
        if fail:
            body = (b"<?xml version='1.0'?><Error><Code>SlowDown</Code>"
                    b"<Message>Please reduce your request rate.</Message>"
                    b"</Error>")
            self.send_response(f.status)
            if f.retry_after is not None:
                self.send_header("Retry-After", f.retry_after)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        file = self.server.root / path.lstrip("/")
        if not file.is_file():
            self.send_error(404)
            return
        match = self.headers.get("If-Match")
        if match is not None and match != etag:
            self.send_error(412)
            return
        data = file.read_bytes()
        rng = self.headers.get("Range")
        m = re.match(r"bytes=(\d+)-(\d*)$", rng or "")
        if m and not f.no_ranges:
            a = int(m[1])
            b = min(int(m[2]) if m[2] else len(data) - 1, len(data) - 1)
            if a >= len(data):
                self.send_error(416)
                return
            part = data[a:b + 1]
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {a}-{b}/{len(data)}")
        else:
            part = data
            self.send_response(200)
        self.send_header("Content-Length", str(len(part)))
        self.send_header("ETag", etag)
        self.end_headers()
        if reset is not None and reset < len(part):
            self.wfile.write(part[:reset])
            self.wfile.flush()
            # a reset, not a clean close: RST on the client's next read
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                       b"\x01\x00\x00\x00\x00\x00\x00\x00")
            self.close_connection = True
            return
        self.wfile.write(part)


class _Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def handle_error(self, request, client_address):
        pass  # a client that hung up on a stalled or cut answer


class FaultServer:
    """The test's own HTTP server over `root` on 127.0.0.1, faults set
    through `faults`; stop() ends it and any stalled answer."""

    def __init__(self, root):
        self.faults = Faults()
        self.srv = _Server(("127.0.0.1", 0), _Handler)
        self.srv.root = pathlib.Path(root)
        self.srv.faults = self.faults
        self.srv.stop_evt = threading.Event()
        self.url = f"http://127.0.0.1:{self.srv.server_address[1]}"
        self.thread = threading.Thread(target=self.srv.serve_forever,
                                       kwargs={"poll_interval": 0.05},
                                       daemon=True)
        self.thread.start()

    def stop(self):
        self.srv.stop_evt.set()
        self.srv.shutdown()
        self.srv.server_close()
        self.thread.join(timeout=10)


def elapsed(fn):
    t0 = time.monotonic()
    r = fn()
    return r, time.monotonic() - t0
