"""`datahelix bench --serve http|s3 [--rtt-ms N]`: the run's clips served
by a real server on loopback - Debian's nginx (HTTP) or s3rver (S3; the
npm package scripts/setup-deps.sh installs into .deps/) - behind a TCP
proxy that delays every byte by half the round trip each way, and a
manifest whose rows name them by URL.  Every system reads the same
objects: the dh-* rungs with datahelix's own client (and --cache-dir's
cache), native-pyav as torch users do (PyAV's own HTTP reads; for S3 a
botocore get_object into memory), native with datahelix's C decode.

The proxy is asyncio in the harness process: each chunk read from one
side is written to the other rtt/2 after it arrived, in order, so latency
is added without changing bandwidth (this kernel has no netem).
"""
import asyncio
import json
import os
import pathlib
import shutil
import socket
import subprocess
import threading
import time

from .common import ROOT, log

S3RVER = ROOT / ".deps" / "node_modules" / ".bin" / "s3rver"
BUCKET = "bench-clips"


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_port(port, seconds=30):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return True
        except OSError:
            time.sleep(0.05)
    return False


class DelayProxy:
    """127.0.0.1:port -> 127.0.0.1:upstream, each direction delayed by
    delay_s (the round trip is twice it)."""

    def __init__(self, upstream, delay_s, port=0):
        self.upstream, self.delay = upstream, delay_s
        self.down = 0  # bytes served to the clients
        self.port = port or _free_port()
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._main, daemon=True)
        self.thread.start()
        if not self.ready.wait(10):
            raise RuntimeError("delay proxy did not start")

    async def _pump(self, r, w, down=False):
        q = asyncio.Queue()

        async def writer():
            while True:
                t, data = await q.get()
                if data is None:
                    break
                wait = t + self.delay - self.loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                w.write(data)
                await w.drain()
            w.close()
        task = asyncio.ensure_future(writer())
        try:
            while True:
                data = await r.read(65536)
                if down:
                    self.down += len(data)
                await q.put((self.loop.time(), data or None))
                if not data:
                    break
        except (ConnectionError, OSError):
            await q.put((self.loop.time(), None))
        try:
            await task
        except (ConnectionError, OSError):
            pass

    async def _serve(self, cr, cw):
        try:
            ur, uw = await asyncio.open_connection("127.0.0.1", self.upstream)
        except OSError as e:
            log(f"delay proxy: upstream: {e}")
            cw.close()
            return
        await asyncio.gather(self._pump(cr, uw), self._pump(ur, cw, True))

    def _main(self):
        asyncio.set_event_loop(self.loop)
        srv = self.loop.run_until_complete(
            asyncio.start_server(self._serve, "127.0.0.1", self.port,
                                 reuse_address=True))
        self.server = srv
        self.ready.set()
        self.loop.run_forever()
        srv.close()

    def stop(self):
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)


class Served:
    """The data of a run served over http or s3 (see the module's doc)."""

    def __init__(self, a, manifest, workdir):
        self.a, self.procs, self.proxy = a, [], None
        self.dir = pathlib.Path(workdir)
        if self.dir.exists():
            shutil.rmtree(self.dir)
        self.dir.mkdir(parents=True)
        rows = [json.loads(x) for x in
                pathlib.Path(manifest).read_text().splitlines()]
        paths = sorted({r["path"] for r in rows if "path" in r})
        self.root = os.path.commonpath([os.path.dirname(p) for p in paths])
        port = self._nginx() if a.serve == "http" else self._s3(paths)
        # always through the proxy (0 ms: no delay): it counts the bytes
        self.proxy = DelayProxy(port, a.rtt_ms / 2000.0,
                                getattr(a, "serve_port", 0))
        port = self.proxy.port
        if a.serve == "http":
            base = f"http://127.0.0.1:{port}/"
        else:
            base = f"s3://{BUCKET}/"
            os.environ.update(AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}",
                              AWS_ACCESS_KEY_ID="S3RVER",
                              AWS_SECRET_ACCESS_KEY="S3RVER",
                              AWS_REGION="us-east-1")
        self.manifest = self.dir / "remote.jsonl"
        with open(self.manifest, "w") as f:
            for r in rows:
                if "path" in r:
                    r = dict(r, path=base + os.path.relpath(r["path"],
                                                             self.root))
                f.write(json.dumps(r) + "\n")
        self.index = self.dir / "remote.dhx"
        subprocess.run([a.bin, "index", str(self.manifest), "-o",
                        str(self.index)], check=True, capture_output=True,
                       timeout=300)
        log(f"serving {len(paths)} clips over {a.serve} at "
            f"{a.rtt_ms:g} ms RTT ({base})")

    def _nginx(self):
        port = _free_port()
        d = self.dir / "nginx"
        d.mkdir()
        temps = " ".join(f"{k}_temp_path {d}/{k};" for k in
                         ("client_body", "proxy", "fastcgi", "uwsgi",
                          "scgi"))
        user = "user root;" if os.geteuid() == 0 else ""
        (d / "nginx.conf").write_text(
            f"{user}\ndaemon off;\nworker_processes 1;\npid {d}/nginx.pid;\n"
            f"error_log {d}/error.log warn;\nevents {{ worker_connections "
            f"1024; }}\nhttp {{ access_log off; keepalive_requests 100000; "
            f"{temps} server {{ listen 127.0.0.1:{port}; "
            f"root {self.root}; }} }}\n")
        nginx = shutil.which("nginx") or "/usr/sbin/nginx"
        self.procs.append(subprocess.Popen(
            [nginx, "-c", str(d / "nginx.conf"), "-p", str(d), "-e",
             str(d / "error.log")], stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL))
        if not _wait_port(port):
            self.stop()
            raise RuntimeError("nginx did not start")
        return port

    def _s3(self, paths):
        import botocore.session
        if not os.access(S3RVER, os.X_OK):
            raise RuntimeError(f"{S3RVER}: not installed (scripts/"
                               "setup-deps.sh installs it)")
        port = _free_port()
        self.procs.append(subprocess.Popen(
            [str(S3RVER), "-d", str(self.dir / "s3"), "-a", "127.0.0.1",
             "-p", str(port), "-s", "--no-vhost-buckets",
             "--configure-bucket", BUCKET],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        if not _wait_port(port):
            self.stop()
            raise RuntimeError("s3rver did not start")
        c = botocore.session.get_session().create_client(
            "s3", endpoint_url=f"http://127.0.0.1:{port}",
            region_name="us-east-1", aws_access_key_id="S3RVER",
            aws_secret_access_key="S3RVER")
        for p in paths:
            with open(p, "rb") as f:
                c.put_object(Bucket=BUCKET, Key=os.path.relpath(p, self.root),
                             Body=f.read())
        return port

    def stop(self):
        if self.proxy:
            self.proxy.stop()
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(timeout=10)
