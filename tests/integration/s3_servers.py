"""A real S3 API for the tests (issue 37): s3rver (npm, installed by
scripts/setup-deps.sh into .deps/) behind a front that checks every
request's SigV4 signature with botocore's own signer and refuses what S3
would refuse (403 InvalidAccessKeyId / SignatureDoesNotMatch /
AccessDenied, 400 ExpiredToken), then forwards it unsigned, path-style, to
s3rver.  s3rver alone does not check signatures (a wrong secret still
reads an object), so without the front a test of credentials could not
fail.

Buckets are filled with botocore through the front, signed like any
client.  Both servers bind to 127.0.0.1 and are ended by pid.
"""
import hmac
import http.client
import http.server
import os
import re
import socketserver
import subprocess
import threading
import time

import pytest

from conftest import ROOT
from procs import free_port, wait_until
from http_servers import _accepts

S3RVER = ROOT / ".deps" / "node_modules" / ".bin" / "s3rver"
AUTH_RE = re.compile(r"AWS4-HMAC-SHA256 Credential=([^/]+)/(\d{8})/([^/]+)/"
                     r"s3/aws4_request, ?SignedHeaders=([^,]+), ?"
                     r"Signature=([0-9a-f]{64})$")


def _xml_error(code, message):
    return (f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>{code}"
            f"</Code><Message>{message}</Message></Error>").encode()


class Front:
    """Checks SigV4 for `keys` ({access key: (secret, token or None,
    expired)}), forwards to s3rver; records each request's
    (method, path, access key or None, status)."""

    def __init__(self, upstream_port, keys, region="us-east-1"):
        self.keys = keys
        self.region = region
        self.upstream = upstream_port
        self.log = []
        self.lock = threading.Lock()
        front = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_GET(self):
                front.handle(self, "GET")

            def do_HEAD(self):
                front.handle(self, "HEAD")

            def do_PUT(self):
                front.handle(self, "PUT")

        class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
            daemon_threads = True
            allow_reuse_address = True

            def handle_error(self, request, client_address):
                pass

        self.srv = Server(("127.0.0.1", 0), Handler)
        self.port = self.srv.server_address[1]
        self.thread = threading.Thread(target=self.srv.serve_forever,
                                       kwargs={"poll_interval": 0.05},
                                       daemon=True)
        self.thread.start()

    def _verify(self, h, method, body):
        """(status, code, message) of a refusal, or None."""
        from botocore.auth import S3SigV4Auth
        from botocore.awsrequest import AWSRequest
        from botocore.credentials import Credentials

        auth = h.headers.get("Authorization")
        if not auth:
            return 403, "AccessDenied", "Access Denied"
        m = AUTH_RE.match(auth)
        if not m:
            return 400, "AuthorizationHeaderMalformed", "malformed"
        akid, day, region, signed, sig = m.groups()
        if akid not in self.keys:
            return (403, "InvalidAccessKeyId", "The AWS Access Key Id you "
                    "provided does not exist in our records.")
        secret, token, expired = self.keys[akid]
        if token is not None and h.headers.get("x-amz-security-token") != \
                token:
            return (403, "InvalidToken", "The provided token is malformed "
                    "or otherwise invalid.")
        if expired:
            return 400, "ExpiredToken", "The provided token has expired."
        names = signed.split(";")
        if "host" not in names or "x-amz-date" not in names or \
                "x-amz-content-sha256" not in names:
            return 403, "AccessDenied", "required headers are not signed"
        headers = {n: h.headers.get(n, "") for n in names}
        amz_date = headers["x-amz-date"]
        if not amz_date.startswith(day) or region != self.region:
            return (403, "SignatureDoesNotMatch", "credential scope does "
                    "not match")
        req = AWSRequest(method=method,
                         url=f"http://{headers['host']}{h.path}",
                         headers=headers, data=body)
        req.context["timestamp"] = amz_date
        signer = S3SigV4Auth(Credentials(akid, secret, token), "s3",
                             self.region)
        canonical = signer.canonical_request(req)
        want = signer.signature(signer.string_to_sign(req, canonical), req)
        if not hmac.compare_digest(want, sig):
            return (403, "SignatureDoesNotMatch", "The request signature we "
                    "calculated does not match the signature you provided. "
                    "Check your key and signing method.")
        return None

    def handle(self, h, method):
        n = int(h.headers.get("Content-Length") or 0)
        body = h.rfile.read(n) if n else b""
        refused = self._verify(h, method, body)
        auth = h.headers.get("Authorization") or ""
        akid = auth.split("Credential=")[1].split("/")[0] \
            if "Credential=" in auth else None
        path = h.path
        host = (h.headers.get("Host") or "").split(":")[0]
        if host.endswith(".localhost"):  # virtual-host style
            path = "/" + host[:-len(".localhost")] + path
        with self.lock:
            self.log.append((method, path, akid,
                             refused[0] if refused else 0))
        if refused:
            status, code, msg = refused
            data = _xml_error(code, msg)
            h.send_response(status)
            h.send_header("Content-Type", "application/xml")
            h.send_header("Content-Length", str(len(data)))
            h.end_headers()
            if method != "HEAD":
                h.wfile.write(data)
            return
        c = http.client.HTTPConnection("127.0.0.1", self.upstream, timeout=30)
        try:
            fwd = {k: v for k, v in h.headers.items()
                   if k.lower() in ("range", "content-type",
                                    "content-length")}
            c.request(method, path, body=body or None, headers=fwd)
            r = c.getresponse()
            data = r.read()
            h.send_response(r.status)
            for k in ("Content-Type", "Content-Range", "ETag",
                      "Last-Modified", "Accept-Ranges"):
                if r.getheader(k):
                    h.send_header(k, r.getheader(k))
            h.send_header("Content-Length", str(len(data)))
            h.end_headers()
            if method != "HEAD":
                h.wfile.write(data)
        finally:
            c.close()

    def requests(self):
        with self.lock:
            return list(self.log)

    def stop(self):
        self.srv.shutdown()
        self.srv.server_close()
        self.thread.join(timeout=10)


class S3:
    """s3rver on a folder, behind a SigV4-checking Front; `endpoint` is
    the front's URL, `client(akid)` a botocore client through it."""

    def __init__(self, workdir, keys, buckets, region="us-east-1"):
        if not os.access(S3RVER, os.X_OK):
            pytest.fail(f"{S3RVER} not installed: run scripts/setup-deps.sh")
        self.dir = workdir
        self.up_port = free_port()
        argv = [str(S3RVER), "-d", str(workdir / "data"), "-a", "127.0.0.1",
                "-p", str(self.up_port), "-s", "--no-vhost-buckets"]
        for b in buckets:
            argv += ["--configure-bucket", b]
        (workdir / "data").mkdir(parents=True, exist_ok=True)
        self.err = open(workdir / "s3rver.log", "w")
        self.proc = subprocess.Popen(argv, stdout=self.err, stderr=self.err)
        if not wait_until(lambda: _accepts(self.up_port), 30):
            self.stop()
            raise AssertionError("s3rver did not start: " +
                                 (workdir / "s3rver.log").read_text())
        self.front = Front(self.up_port, keys, region)
        self.endpoint = f"http://127.0.0.1:{self.front.port}"
        self.keys = keys
        self.region = region

    def client(self, akid):
        import botocore.session
        from botocore.config import Config
        secret, token, _ = self.keys[akid]
        s = botocore.session.get_session()
        return s.create_client(
            "s3", endpoint_url=self.endpoint, region_name=self.region,
            aws_access_key_id=akid, aws_secret_access_key=secret,
            aws_session_token=token,
            config=Config(s3={"addressing_style": "path"},
                          retries={"max_attempts": 2}))

    def stop(self):
        if hasattr(self, "front"):
            self.front.stop()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.err.close()


def wait_listed(client, bucket, n, seconds=10):
    """s3rver lists what was put at once; bounded anyway."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        r = client.list_objects_v2(Bucket=bucket)
        if r.get("KeyCount", 0) >= n:
            return True
        time.sleep(0.05)
    return False
