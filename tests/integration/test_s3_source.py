"""Data in S3 buckets (issue 37): `probe` of s3:// objects, prefixes
(ListObjectsV2) and shards, `decode` and the loaders reading them with
SigV4-signed ranged GETs.  A real S3 API: s3rver behind a front that
checks every signature with botocore (s3_servers.py), so wrong, missing
and expired credentials are refused as S3 refuses them.

Credentials come the way AWS's tools find them: the environment, the
shared credentials and config files with profiles, and per-source settings
($DATAHELIX_S3_SOURCES) so that two buckets with two credentials are read
in one job.  No secret appears in any output.
"""
import json
import os
import pathlib
import sys
import urllib.request

import pytest

from conftest import ROOT, SHARED_DATA, run_dh
from procs import wait_until
from s3_servers import S3, wait_listed

torch = pytest.importorskip("torch")
sys.path.insert(0, str(ROOT / "python"))
import datahelix  # noqa: E402
from both_loaders import binary_env  # noqa: E402,F401 (autouse)
from table_checks import (rest_after_resume, rows,  # noqa: E402
                          without_path)

AK_A, SK_A = "AKIAAAAAAAAAAAAAAAAA", "secretAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
AK_B, SK_B = "AKIABBBBBBBBBBBBBBBB", "secretBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBB"
AK_T, SK_T, TOKEN = ("ASIATTTTTTTTTTTTTTTT", "secretTTTTTTTTTTTTTTTTTTTTTTTTTTTTTT",
                     "tokenTTTTTTTTTTTTTTTTTTTTTTTTTTTTTTTTTTTTTTTTTTTTTTT")
AK_X, SK_X, TOKEN_X = ("ASIAXXXXXXXXXXXXXXXX", "secretXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXX",
                       "tokenXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXX")
SECRETS = [SK_A, SK_B, SK_T, TOKEN, SK_X, TOKEN_X]
DECODE = ("--frames", 4, "--size", "48x40")
PROBE = ("probe", "--frames", 4, "--size", "32x32")
SMALL = dict(batch_size=2, frames=4, size=(32, 32), timeout=60,
             world_size=1, rank=0)
SHARED = ["decord__video_90.mov", "moviepy__big_buck_bunny_0_30.webm",
          "mmaction2__test.avi"]
AWS_VARS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
            "AWS_PROFILE", "AWS_REGION", "AWS_DEFAULT_REGION",
            "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_CONFIG_FILE",
            "AWS_SHARED_CREDENTIALS_FILE", "DATAHELIX_S3_SOURCES",
            "DATAHELIX_S3_ADDRESSING")


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    d = tmp_path_factory.mktemp("s3clips")
    run_dh("gen-data", "--out", d / "gen", "--profiles", "S", "--count", 4,
           "--seed", 9, check=True, timeout=300)
    files = sorted((d / "gen").glob("*.mp4"))
    for name in SHARED:
        if (SHARED_DATA / "videos" / name).exists():
            files.append(SHARED_DATA / "videos" / name)
    run_dh("shard", "-q", "--out", d / "sh", *files[:4], check=True)
    return d, files


@pytest.fixture(scope="module")
def s3(clips, tmp_path_factory):
    d, files = clips
    work = tmp_path_factory.mktemp("s3")
    keys = {AK_A: (SK_A, None, False), AK_B: (SK_B, None, False),
            AK_T: (SK_T, TOKEN, False), AK_X: (SK_X, TOKEN_X, True)}
    srv = S3(work, keys, ["bucket-a", "bucket-b"])
    a, b = srv.client(AK_A), srv.client(AK_B)
    for f in files:
        a.put_object(Bucket="bucket-a", Key=f"clips/{f.name}",
                     Body=f.read_bytes())
    a.put_object(Bucket="bucket-a", Key="clips/notes.md", Body=b"not media")
    for f in sorted((d / "sh").glob("*.tar")):
        b.put_object(Bucket="bucket-b", Key=f"shards/{f.name}",
                     Body=f.read_bytes())
    assert wait_listed(a, "bucket-a", len(files) + 1)
    yield srv
    srv.stop()


def aws_env(s3, tmp_path, **kw):
    """The environment of a job: no AWS setting but those given."""
    env = {k: v for k, v in os.environ.items() if k not in AWS_VARS}
    env["HOME"] = str(tmp_path)  # no ~/.aws of the machine's
    env["AWS_ENDPOINT_URL"] = s3.endpoint
    env.update({k: str(v) for k, v in kw.items()})
    return env


def decoded(*inputs, env):
    out = pathlib.Path(os.environ.get("TMPDIR", "/tmp")) / f"sd-{os.getpid()}"
    try:
        p = run_dh("decode", *DECODE, "-o", out, *inputs, env=env)
        assert p.returncode == 0, p.stderr
        return out.read_bytes()
    finally:
        out.unlink(missing_ok=True)


def test_objects_and_a_prefix_equal_the_local_files(clips, s3, tmp_path):
    _, files = clips
    env = aws_env(s3, tmp_path, AWS_ACCESS_KEY_ID=AK_A,
                  AWS_SECRET_ACCESS_KEY=SK_A)
    urls = [f"s3://bucket-a/clips/{f.name}" for f in files]
    run_dh(*PROBE, "--out", tmp_path / "o.jsonl", *urls, env=env, check=True)
    run_dh(*PROBE, "--out", tmp_path / "l.jsonl", *files, check=True)
    assert [r["path"] for r in rows(tmp_path / "o.jsonl")] == urls
    assert without_path(rows(tmp_path / "o.jsonl")) == \
        without_path(rows(tmp_path / "l.jsonl"))
    # a prefix is listed: media objects in key order, others left out
    p = run_dh(*PROBE, "--out", tmp_path / "p.jsonl", "s3://bucket-a/clips/",
               env=env)
    assert p.returncode == 0, p.stderr
    assert [r["path"] for r in rows(tmp_path / "p.jsonl")] == sorted(urls)
    assert decoded(*urls, env=env) == decoded(*files, env=env)
    signed = [r for r in s3.front.requests() if r[2] == AK_A]
    assert signed and all(st == 0 for *_, st in signed)


def test_profiles_session_tokens_and_virtual_hosts(clips, s3, tmp_path):
    _, files = clips
    (tmp_path / "creds").write_text(
        "[default]\naws_access_key_id = nobody\n"
        "aws_secret_access_key = nothing\n\n"
        f"# a temporary one\n[temp]\naws_access_key_id={AK_T}\n"
        f"aws_secret_access_key = {SK_T}\naws_session_token = {TOKEN}\n")
    (tmp_path / "config").write_text(
        "[profile temp]\nregion = us-east-1\ns3 =\n"
        "  addressing_style = virtual\n")
    # virtual-host addressing: bucket-a.localhost (libcurl resolves
    # *.localhost to loopback itself)
    env = aws_env(s3, tmp_path, AWS_PROFILE="temp",
                  AWS_SHARED_CREDENTIALS_FILE=tmp_path / "creds",
                  AWS_CONFIG_FILE=tmp_path / "config",
                  AWS_ENDPOINT_URL=s3.endpoint.replace("127.0.0.1",
                                                       "localhost"))
    url = f"s3://bucket-a/clips/{files[0].name}"
    before = len(s3.front.requests())
    assert decoded(url, env=env) == decoded(files[0], env=env)
    reqs = s3.front.requests()[before:]
    assert reqs and all(r[2] == AK_T and r[3] == 0 for r in reqs)


def test_wrong_missing_and_expired_credentials_are_refused(clips, s3,
                                                           tmp_path):
    _, files = clips
    url = f"s3://bucket-a/clips/{files[0].name}"
    cases = [
        (dict(AWS_ACCESS_KEY_ID=AK_A, AWS_SECRET_ACCESS_KEY=SK_B),
         "HTTP 403 Forbidden (SignatureDoesNotMatch"),
        (dict(AWS_ACCESS_KEY_ID="AKIAUNKNOWNUNKNOWN00",
              AWS_SECRET_ACCESS_KEY=SK_A), "(InvalidAccessKeyId"),
        (dict(), "HTTP 403 Forbidden (AccessDenied"),  # no credentials
        (dict(AWS_ACCESS_KEY_ID=AK_X, AWS_SECRET_ACCESS_KEY=SK_X,
              AWS_SESSION_TOKEN=TOKEN_X), "(ExpiredToken"),
        (dict(AWS_PROFILE="nope"), "no credentials for profile 'nope'"),
    ]
    for kw, words in cases:
        env = aws_env(s3, tmp_path, **kw)
        p = run_dh("probe", "--out", tmp_path / "x.jsonl", url, env=env)
        assert p.returncode == 1, (kw, p.stderr)
        lines = [x for x in p.stderr.splitlines() if url in x]
        assert len(lines) == 1 and words in lines[0], (kw, p.stderr)
        assert not any(s in p.stderr for s in SECRETS), p.stderr
    # 403 is final: tried once, not six times
    env = aws_env(s3, tmp_path, AWS_ACCESS_KEY_ID=AK_A,
                  AWS_SECRET_ACCESS_KEY=SK_B)
    before = len(s3.front.requests())
    run_dh("probe", "--out", tmp_path / "x.jsonl", url, env=env)
    assert len(s3.front.requests()) - before == 1
    # a key that is not there
    env = aws_env(s3, tmp_path, AWS_ACCESS_KEY_ID=AK_A,
                  AWS_SECRET_ACCESS_KEY=SK_A)
    p = run_dh("probe", "--out", tmp_path / "x.jsonl",
               "s3://bucket-a/clips/none.mp4", env=env)
    assert "HTTP 404 Not Found (NoSuchKey" in p.stderr
    p = run_dh("probe", "--out", tmp_path / "x.jsonl", "s3://bucket-a/nix/",
               env=env)
    assert "no media objects or shards under this prefix" in p.stderr


def test_two_buckets_two_credentials_one_job_exactly_once(clips, s3,
                                                          tmp_path):
    """bucket-a read with A's key, bucket-b (shards) with B's, chosen per
    source; the loader's epoch holds each sample once, equal to the local
    files', resume exact; no secret in any log, trace, telemetry or
    metrics."""
    d, files = clips
    (tmp_path / "creds").write_text(
        f"[a]\naws_access_key_id = {AK_A}\naws_secret_access_key = {SK_A}\n"
        f"[b]\naws_access_key_id = {AK_B}\naws_secret_access_key = {SK_B}\n")
    (tmp_path / "sources.json").write_text(json.dumps({
        "s3://bucket-a/": {"profile": "a"},
        "s3://bucket-b/": {"profile": "b", "region": "us-east-1",
                           "endpoint_url": s3.endpoint}}))
    env = aws_env(s3, tmp_path, AWS_SHARED_CREDENTIALS_FILE=tmp_path / "creds",
                  DATAHELIX_S3_SOURCES=tmp_path / "sources.json")
    shards = sorted((d / "sh").glob("*.tar"))
    inputs = [f"s3://bucket-a/clips/{f.name}" for f in files[4:]] + \
        ["s3://bucket-b/shards/"]
    run_dh(*PROBE, "--out", tmp_path / "r.jsonl", *inputs, env=env,
           check=True)
    run_dh(*PROBE, "--out", tmp_path / "l.jsonl", *files[4:], *shards,
           check=True)
    r = rows(tmp_path / "r.jsonl")
    assert without_path(r) == without_path(rows(tmp_path / "l.jsonl"))
    assert any(x["path"].startswith("s3://bucket-b/shards/") and "member" in x
               for x in r)
    old = os.environ.copy()
    os.environ.clear()
    os.environ.update(env)
    logs = tmp_path / "logs"
    logs.mkdir()
    try:
        a, b = [], []
        for table, out in ((tmp_path / "r.jsonl", a),
                           (tmp_path / "l.jsonl", b)):
            with datahelix.DataLoader(
                    str(table), seed=2, trace=str(logs / "trace.json"),
                    metrics_listen="127.0.0.1:0",
                    **{**SMALL, "batch_size": 1}) as ld:
                for x in ld:
                    out.append((x["ids"].tolist(), x["video"].clone()))
                addr = wait_until(lambda: ld.metrics_address, 10)
                with urllib.request.urlopen(f"http://{addr}/metrics",
                                            timeout=10) as m:
                    metrics = m.read().decode()
                stats = json.dumps(ld.stats(), default=str)
        rest = rest_after_resume(tmp_path / "r.jsonl", seed=2,
                                 **{**SMALL, "batch_size": 1})
    finally:
        os.environ.clear()
        os.environ.update(old)
    assert sorted(i for x in a for i in x[0]) == list(range(len(r)))
    assert [x[0] for x in a] == [x[0] for x in b]
    assert all(torch.equal(x[1], y[1]) for x, y in zip(a, b))
    assert rest == [x[0] for x in b[1:]] and rest
    used = {(m, ak) for m, p_, ak, st in s3.front.requests()
            if st == 0 and ak}
    assert ("GET", AK_A) in used and ("GET", AK_B) in used
    text = stats + metrics + "".join(
        f.read_text(errors="replace") for f in logs.rglob("*") if f.is_file())
    assert text and not any(s in text for s in SECRETS)


def test_no_secret_reaches_a_command_line_or_the_coordinator(clips, s3,
                                                             tmp_path):
    _, files = clips
    env = aws_env(s3, tmp_path, AWS_ACCESS_KEY_ID=AK_A,
                  AWS_SECRET_ACCESS_KEY=SK_A)
    run_dh(*PROBE, "--out", tmp_path / "r.jsonl",
           f"s3://bucket-a/clips/{files[0].name}", env=env, check=True)
    old = os.environ.copy()
    os.environ.update(env)
    try:
        with datahelix.DataLoader(str(tmp_path / "r.jsonl"),
                                  **{**SMALL, "batch_size": 1}) as ld:
            next(iter(ld))
            pids = [ld._coord.proc.pid] if getattr(ld, "_coord", None) \
                else []
            seen = []
            for pid in os.listdir("/proc"):
                if not pid.isdigit():
                    continue
                try:
                    seen.append((int(pid), pathlib.Path(
                        f"/proc/{pid}/cmdline").read_bytes()))
                except OSError:
                    pass
            coord_env = [pathlib.Path(f"/proc/{p}/environ").read_bytes()
                         for p in pids]
    finally:
        os.environ.clear()
        os.environ.update(old)
    for _, cmd in seen:
        assert SK_A.encode() not in cmd
    assert pids, "the loader's Coordinator was not found"
    for e in coord_env:
        assert SK_A.encode() not in e and AK_A.encode() not in e
