"""WebDataset tar shards read in place (issue 35): shards written with GNU
tar and with Python's tarfile (ustar, GNU long names, pax) holding video,
image, caption, JSON metadata and audio members.  Each sample decodes to
the bytes the same file gives unpacked, captions are kept, the loader's
epoch and resume are those of the unpacked set, and a damaged shard keeps
its good members and names the bad one.
"""
import io
import json
import os
import pathlib
import shutil
import socket
import subprocess
import sys
import tarfile
import time

import pytest

from conftest import ROOT, SHARED_DATA, run_dh, _binary

torch = pytest.importorskip("torch")
sys.path.insert(0, str(ROOT / "python"))
import datahelix  # noqa: E402
from both_loaders import binary_env  # noqa: E402,F401 (autouse)
from table_checks import rest_after_resume, rows  # noqa: E402

SMALL = dict(batch_size=2, frames=4, size=(32, 32), timeout=60,
             world_size=1, rank=0)
DECODE = ("--frames", 5, "--size", "48x40")


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    """Six generated clips and two images of shared/data (when present),
    each with a caption: the unpacked folder the shards are made from."""
    d = tmp_path_factory.mktemp("clips")
    run_dh("gen-data", "--out", d / "gen", "--profiles", "S", "--count", 6,
           "--seed", 11, check=True, timeout=300)
    files = sorted((d / "gen").glob("*.mp4"))
    imgs = SHARED_DATA / "images"
    if imgs.is_dir():
        files += [imgs / "mmaction2__img_00001.jpg",
                  imgs / "moviepy__afterimage.png"]
    return files


def caption(i):
    return f"clip number {i} \u00e9t\u00e9"


def key_of(i, long=False):
    k = f"{i:06d}"
    # a name over ustar's 100 bytes in a folder over its 155-byte prefix:
    # GNU writes a long-name record, pax a path record
    return ("d" * 160 + "/" + "k" * 110 + k) if long else k


def make_pytar(path, files, fmt, long=False, meta_json=False, audio=False):
    """A shard by tarfile; the caption as KEY.txt or in KEY.json."""
    with tarfile.open(path, "w", format=fmt) as t:
        for i, f in enumerate(files):
            k = key_of(i, long)
            t.add(str(f), arcname=k + pathlib.Path(f).suffix)
            if meta_json:
                b = json.dumps({"caption": caption(i), "n": i}).encode()
                ext = ".json"
            else:
                b = caption(i).encode()
                ext = ".txt"
            ti = tarfile.TarInfo(k + ext)
            ti.size = len(b)
            t.addfile(ti, io.BytesIO(b))
            if audio:
                ti = tarfile.TarInfo(k + ".cls")
                ti.size = 1
                t.addfile(ti, io.BytesIO(b"7"))
            if audio and i == 0:  # a clip with its soundtrack beside it
                ti = tarfile.TarInfo(k + ".wav")
                ti.size = 44
                t.addfile(ti, io.BytesIO(b"RIFF" + bytes(40)))
        if audio:  # a key with only a soundtrack: reported, not a sample
            ti = tarfile.TarInfo("speech.wav")
            ti.size = 44
            t.addfile(ti, io.BytesIO(b"RIFF" + bytes(40)))


def make_gnutar(path, files, tmp):
    """A shard by GNU tar (its default format) from a staged folder."""
    stage = tmp / "stage"
    stage.mkdir()
    names = []
    for i, f in enumerate(files):
        k = key_of(i)
        shutil.copy(f, stage / (k + pathlib.Path(f).suffix))
        (stage / (k + ".txt")).write_text(caption(i))
        names += [k + pathlib.Path(f).suffix, k + ".txt"]
    subprocess.run(["tar", "-cf", str(path), "-C", str(stage), *names],
                   check=True, timeout=60)


def decoded(*inputs):
    """`datahelix decode -o` of INPUTS: the raw tensors, one per item."""
    out = pathlib.Path(os.environ.get("TMPDIR", "/tmp")) / f"dec-{os.getpid()}"
    try:
        run_dh("decode", *DECODE, "-o", out, *inputs, check=True)
        return out.read_bytes()
    finally:
        out.unlink(missing_ok=True)


@pytest.mark.parametrize("kind", ["gnutar", "ustar", "gnu-long", "pax-long",
                                  "pax-json"])
def test_shard_rows_and_tensors_equal_the_unpacked_files(clips, tmp_path,
                                                         kind):
    shard = tmp_path / "s-000.tar"
    if kind == "gnutar":
        make_gnutar(shard, clips, tmp_path)
    else:
        fmt = {"ustar": tarfile.USTAR_FORMAT, "gnu-long": tarfile.GNU_FORMAT,
               "pax-long": tarfile.PAX_FORMAT,
               "pax-json": tarfile.PAX_FORMAT}[kind]
        make_pytar(shard, clips, fmt, long=kind.endswith("long"),
                   meta_json=kind == "pax-json")
    p = run_dh("probe", "--out", tmp_path / "s.jsonl", shard, check=True)
    got = rows(tmp_path / "s.jsonl")
    assert len(got) == len(clips), p.stderr
    with tarfile.open(shard) as t:  # offsets and sizes are tarfile's
        members = {m.name: m for m in t.getmembers()}
    for i, (r, f) in enumerate(zip(got, clips)):
        m = members[r["member"]]
        assert r["path"] == str(shard) and r["id"] == i
        assert pathlib.Path(r["member"]).name.startswith(
            pathlib.Path(key_of(i, kind.endswith("long"))).name)
        assert (r["offset"], r["bytes"]) == (m.offset_data, m.size)
        assert r["text"] == caption(i)
        assert r["kind"] == ("image" if f.suffix in (".jpg", ".png")
                             else "video")
    # the same rows, frame for frame, as the files themselves
    unpacked = run_dh("probe", "--out", tmp_path / "f.jsonl", *clips,
                      check=True)
    assert unpacked.returncode == 0
    for a, b in zip(got, rows(tmp_path / "f.jsonl")):
        for k in ("kind", "codec", "width", "height", "frames", "fps",
                  "duration_s", "est_cpu_ms"):
            assert a[k] == b[k], (k, a, b)
    want = decoded(*clips)
    assert decoded(shard) == want
    assert decoded(tmp_path / "s.jsonl") == want


def test_index_keeps_each_shard_path_once(clips, tmp_path):
    shard = tmp_path / "a-shard-with-a-rather-long-name-000000.tar"
    make_pytar(shard, clips * 4, tarfile.GNU_FORMAT)
    run_dh("probe", "--out", tmp_path / "s.jsonl", "--index",
           tmp_path / "s.dhx", shard, check=True)
    blob = (tmp_path / "s.dhx").read_bytes()
    assert blob.count(str(shard).encode() + b"\0") == 1
    assert len(rows(tmp_path / "s.jsonl")) == 4 * len(clips)
    ix = datahelix._C.Index(str(tmp_path / "s.dhx"))
    assert ix.path(5) == str(shard)


def test_folder_of_shards_and_audio_and_metadata(clips, tmp_path):
    d = tmp_path / "shards"
    d.mkdir()
    make_pytar(d / "b-001.tar", clips[3:], tarfile.PAX_FORMAT, audio=True)
    make_pytar(d / "a-000.tar", clips[:3], tarfile.GNU_FORMAT)
    p = run_dh("probe", "--out", tmp_path / "m.jsonl", d)
    # the audio-only key is named, the rest is a table (exit 0: keep-going)
    assert p.returncode == 0, p.stderr
    assert "b-001.tar: sample 'speech': an audio-only sample" in p.stderr
    got = rows(tmp_path / "m.jsonl")
    assert [pathlib.Path(r["path"]).name for r in got] == \
        ["a-000.tar"] * 3 + ["b-001.tar"] * (len(clips) - 3)
    assert [r["text"] for r in got] == [caption(i) for i in range(3)] + \
        [caption(i) for i in range(len(clips) - 3)]
    # the soundtrack member is kept in its row for the audio decode
    with tarfile.open(d / "b-001.tar") as t:
        wav = t.getmember("000000.wav")
    assert (got[3]["audio_member"], got[3]["audio_offset"],
            got[3]["audio_bytes"]) == ("000000.wav", wav.offset_data, 44)
    assert all("audio_member" not in r for r in got[:3] + got[4:])
    p = run_dh("probe", "--fail-fast", "--out", tmp_path / "n.jsonl", d)
    assert p.returncode != 0 and not (tmp_path / "n.jsonl").exists()


def test_a_cut_shard_keeps_its_good_members(clips, tmp_path):
    shard = tmp_path / "cut.tar"
    make_pytar(shard, clips, tarfile.GNU_FORMAT)
    with tarfile.open(shard) as t:
        victim = [m for m in t.getmembers() if m.name.endswith(".mp4")][3]
    data = shard.read_bytes()
    shard.write_bytes(data[:victim.offset_data + victim.size // 2])
    p = run_dh("probe", "--out", tmp_path / "m.jsonl", shard, timeout=60)
    assert p.returncode == 0, p.stderr
    assert f"member '{victim.name}'" in p.stderr and "cut off" in p.stderr
    assert str(shard) in p.stderr
    assert [r["member"] for r in rows(tmp_path / "m.jsonl")] == \
        [f"{key_of(i)}.mp4" for i in range(3)]


def test_a_corrupt_header_is_named_and_ends_the_walk(clips, tmp_path):
    shard = tmp_path / "bad.tar"
    make_pytar(shard, clips, tarfile.USTAR_FORMAT)
    with tarfile.open(shard) as t:
        victim = [m for m in t.getmembers()][4]  # key 2's video header
    data = bytearray(shard.read_bytes())
    data[victim.offset + 10] ^= 0xFF  # its name: the checksum breaks
    shard.write_bytes(bytes(data))
    p = run_dh("probe", "--out", tmp_path / "m.jsonl", shard, timeout=60)
    assert p.returncode == 0, p.stderr
    assert f"byte {victim.offset}" in p.stderr
    assert "checksum" in p.stderr and "after member '000001.txt'" in p.stderr
    assert len(rows(tmp_path / "m.jsonl")) == 2
    # an MPEG-TS-looking payload never passes for a tar member: a file of
    # junk named .tar is a problem, not a clip
    junk = tmp_path / "junk.tar"
    junk.write_bytes(b"G" + bytes(187) * 40)
    p = run_dh("probe", "--out", tmp_path / "j.jsonl", junk, timeout=60)
    assert p.returncode != 0 and "junk.tar" in p.stderr
    # an empty shard among good ones is reported, the rest probed
    (tmp_path / "empty.tar").write_bytes(b"")
    p = run_dh("probe", "--out", tmp_path / "e.jsonl", tmp_path / "empty.tar",
               tmp_path / "bad.tar", timeout=60)
    assert p.returncode == 0 and "empty.tar: empty file" in p.stderr
    assert len(rows(tmp_path / "e.jsonl")) == 2
    # a compressed shard cannot be read in place: said so
    gz = tmp_path / "c.tar.gz"
    with tarfile.open(gz, "w:gz") as t:
        t.add(str(clips[0]), arcname="000000.mp4")
    p = run_dh("probe", "--out", tmp_path / "g.jsonl", gz, timeout=60)
    assert p.returncode != 0 and "decompress it to a .tar" in p.stderr


def loader_run(table, **kw):
    with datahelix.DataLoader(str(table), **{**SMALL, **kw}) as loader:
        return [(b["ids"].tolist(), b["video"].clone(), list(b["text"]))
                for b in loader]


def test_loader_epoch_and_resume_from_shards(clips, tmp_path):
    make_pytar(tmp_path / "s.tar", clips, tarfile.GNU_FORMAT)
    run_dh("probe", "--out", tmp_path / "s.jsonl", tmp_path / "s.tar",
           check=True)
    folder = tmp_path / "files"
    folder.mkdir()
    lst = []
    for i, f in enumerate(clips):  # the same clips and captions, unpacked
        shutil.copy(f, folder / (key_of(i) + f.suffix))
        lst.append(json.dumps({"path": key_of(i) + f.suffix,
                               "text": caption(i)}))
    (folder / "list.jsonl").write_text("\n".join(lst) + "\n")
    run_dh("probe", "--out", tmp_path / "f.jsonl", folder / "list.jsonl",
           check=True)
    a = loader_run(tmp_path / "s.jsonl", seed=4)
    b = loader_run(tmp_path / "f.jsonl", seed=4)
    assert [x[0] for x in a] == [x[0] for x in b]  # the plan's order
    ids = sorted(i for x in a for i in x[0])
    assert ids == sorted(set(ids))  # each sample once
    for (ia, va, ta), (ib, vb, tb) in zip(a, b):
        assert torch.equal(va, vb) and ta == tb
    assert a[0][2][0] == caption(a[0][0][0])
    # resume mid-epoch gives the rest of the same epoch
    rest = rest_after_resume(tmp_path / "s.jsonl", seed=4, **SMALL)
    assert rest == [x[0] for x in a[1:]]


def test_a_shard_cut_after_probe_is_a_sample_error(clips, tmp_path):
    """Members past the cut name the shard, the member and the cause;
    under skip the epoch still comes whole, substituted."""
    shard = tmp_path / "s.tar"
    make_pytar(shard, clips[:6], tarfile.GNU_FORMAT)
    run_dh("probe", "--out", tmp_path / "s.jsonl", shard, check=True)
    last = rows(tmp_path / "s.jsonl")[-1]
    shard.write_bytes(shard.read_bytes()[:last["offset"] + 100])
    p = run_dh("decode", *DECODE, tmp_path / "s.jsonl")
    assert p.returncode == 1
    assert f"{shard}:{last['member']}" in p.stderr
    assert "changed since probe" in p.stderr
    with pytest.raises(datahelix.SampleError) as ex:
        loader_run(tmp_path / "s.jsonl", batch_size=6)
    assert last["member"] in str(ex.value)
    got = loader_run(tmp_path / "s.jsonl", on_error="skip")
    assert sum(len(x[0]) for x in got) == 6


def test_shard_command_round_trip_and_resume(clips, tmp_path):
    """folder -> shards -> table -> loader gives the folder's tensors; the
    shards list with GNU tar and read with tarfile; a second run writes
    only the shard that is missing, the same bytes as the first."""
    folder = tmp_path / "in"
    folder.mkdir()
    lst = []
    for i, f in enumerate(clips):
        shutil.copy(f, folder / f"c{i}{f.suffix}")
        lst.append(json.dumps({"path": f"c{i}{f.suffix}",
                               "text": caption(i)}))
    (folder / "list.jsonl").write_text("\n".join(lst) + "\n")
    run_dh("probe", "--out", tmp_path / "f.jsonl", folder / "list.jsonl",
           check=True)
    out = tmp_path / "shards"
    size = sum(f.stat().st_size for f in clips) // 3
    p = run_dh("shard", "--out", out, "--shard-bytes", size, "--table",
               tmp_path / "s.jsonl", tmp_path / "f.jsonl", check=True)
    shards = sorted(out.glob("*.tar"))
    assert [s.name for s in shards] == \
        [f"shard-{k:06d}.tar" for k in range(len(shards))]
    assert len(shards) >= 3, p.stderr
    assert not list(out.glob(".*"))  # no temporary left
    names = []
    for s in shards:
        listed = subprocess.run(["tar", "-tf", str(s)], check=True,
                                capture_output=True, text=True,
                                timeout=60).stdout.split()
        with tarfile.open(s) as t:
            assert t.getnames() == listed
            for m in t.getmembers():
                if m.name.endswith(".txt"):
                    i = int(m.name.split(".")[0])
                    assert t.extractfile(m).read().decode() == caption(i)
                if m.name.endswith(".json"):
                    src = json.loads(t.extractfile(m).read())["source"]
                    assert src.startswith(str(folder))
        names += listed
    assert [n for n in names if n.split(".")[1] not in ("txt", "json")] == \
        [f"{i:09d}{f.suffix}" for i, f in enumerate(clips)]
    a = loader_run(tmp_path / "s.jsonl", seed=2)
    b = loader_run(tmp_path / "f.jsonl", seed=2)
    assert [x[0] for x in a] == [x[0] for x in b]
    for (ia, va, ta), (ib, vb, tb) in zip(a, b):
        assert torch.equal(va, vb) and ta == tb
    assert decoded(tmp_path / "s.jsonl") == decoded(tmp_path / "f.jsonl")
    # resume: one shard gone, a stale partial file beside it
    first = {s.name: s.read_bytes() for s in shards}
    shards[1].unlink()
    (out / ".shard-000001.tar.part").write_bytes(b"half")
    p = run_dh("shard", "--out", out, "--shard-bytes", size,
               tmp_path / "f.jsonl", check=True)
    assert f"1 written, {len(shards) - 1} already whole" in p.stderr
    assert {s.name: s.read_bytes() for s in sorted(out.glob("*.tar"))} == \
        first
    # a shard of the wrong size is written again
    shards[0].write_bytes(first[shards[0].name][:1000])
    p = run_dh("shard", "--out", out, "--shard-bytes", size,
               tmp_path / "f.jsonl", check=True)
    assert "1 written" in p.stderr
    assert shards[0].read_bytes() == first[shards[0].name]


def test_shard_command_errors(clips, tmp_path):
    p = run_dh("shard", "--out", tmp_path / "o", tmp_path / "missing.mp4")
    assert p.returncode == 1 and "missing.mp4" in p.stderr
    p = run_dh("shard", tmp_path)
    assert p.returncode == 2 and "--out" in p.stderr
    p = run_dh("shard", "--out", tmp_path / "o", "--shard-bytes", "12",
               clips[0])
    assert p.returncode == 2 and "--shard-bytes" in p.stderr
    noext = tmp_path / "noext"
    shutil.copy(clips[0], noext)
    p = run_dh("shard", "--out", tmp_path / "o", noext)
    assert p.returncode == 1 and "no file extension" in p.stderr
    # a shard cut since probe: named, and no shard of it is left behind
    make_pytar(tmp_path / "s.tar", clips[:3], tarfile.GNU_FORMAT)
    run_dh("probe", "--out", tmp_path / "s.jsonl", tmp_path / "s.tar",
           check=True)
    (tmp_path / "s.tar").write_bytes((tmp_path / "s.tar").read_bytes()[:2000])
    p = run_dh("shard", "--out", tmp_path / "o2", tmp_path / "s.jsonl")
    assert p.returncode == 1 and "changed since probe" in p.stderr
    assert not list((tmp_path / "o2").iterdir())


def test_python_decode_api(clips, tmp_path):
    """datahelix.decode / open / Table / Source on files, shard members,
    table rows and bytes: the tensors `datahelix decode` writes, the bytes
    tarfile extracts; errors name the shard and the member."""
    make_pytar(tmp_path / "s.tar", clips, tarfile.PAX_FORMAT)
    run_dh("probe", "--out", tmp_path / "s.jsonl", tmp_path / "s.tar",
           check=True)
    table = datahelix.Table(tmp_path / "s.jsonl")
    assert len(table) == len(clips)
    want = decoded(tmp_path / "s.jsonl")
    each = [datahelix.decode(table.source(i), frames=5, size=(40, 48))
            for i in range(len(table))]
    assert b"".join(v.numpy().tobytes() for v in each) == want
    rows_ = rows(tmp_path / "s.jsonl")
    with tarfile.open(tmp_path / "s.tar") as t:
        for i, r in enumerate(rows_):
            src = datahelix.Source.of(r)
            assert src == table.source(i) and table.text(i) == caption(i)
            member = t.extractfile(r["member"]).read()
            with datahelix.open(src) as f:
                assert f.read() == member
                f.seek(-10, 2)
                assert f.read() == member[-10:]
            v = datahelix.decode(member, frames=5, size=(40, 48))
            assert torch.equal(v, each[i])
    # a file path and a fps plan at native size, with the facts
    v, info = datahelix.decode(clips[0], frames="fps:4", size=None,
                               info=True)
    assert v.shape[0] == info["frames"] == len(info["indices"])
    assert v.shape[1:] == (info["clip"]["height"], info["clip"]["width"], 3)
    assert info["clip"]["kind"] == "video" and info["valid_frames"] >= 1
    f32 = datahelix.decode(clips[0], frames=2, size=(8, 8), dtype="float32",
                           layout="tchw")
    assert f32.dtype == torch.float32 and f32.shape == (2, 3, 8, 8)
    idx = datahelix.decode(clips[0], indices=[3, 0], size=(8, 8))
    assert torch.equal(idx[1], datahelix.decode(clips[0], indices=[0],
                                                size=(8, 8))[0])
    # errors
    with pytest.raises(OSError) as ex:  # as open() would
        datahelix.decode(tmp_path / "nope.mp4")
    assert "nope.mp4" in str(ex.value)
    cut = tmp_path / "cut.tar"
    cut.write_bytes((tmp_path / "s.tar").read_bytes()[:rows_[2]["offset"]])
    bad = datahelix.Source(cut, rows_[2]["member"], rows_[2]["offset"],
                           rows_[2]["bytes"])
    with pytest.raises(datahelix.DataError) as ex:
        datahelix.decode(bad)
    assert f"{cut}:{rows_[2]['member']}" in str(ex.value)
    with pytest.raises(OSError, match="changed since probe"):
        datahelix.open(bad)
    with pytest.raises(ValueError):
        datahelix.Source(cut, "m.mp4", 0, 0)
    with pytest.raises(ValueError):
        datahelix.decode(clips[0], frames="sometimes")
    with pytest.raises(IndexError):
        table.source(len(table))


def test_distributed_loader_dataset_decodes_shards(clips, tmp_path):
    """The issue's case: a custom DistributedDataLoader dataset (frames +
    caption) reads shard members through datahelix.decode."""
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
    import dist_datasets as dd
    make_pytar(tmp_path / "s.tar", clips, tarfile.GNU_FORMAT)
    run_dh("probe", "--out", tmp_path / "s.jsonl", tmp_path / "s.tar",
           check=True)
    ds = dd.TableClips(str(tmp_path / "s.jsonl"), 3, (16, 16))
    with datahelix.DistributedDataLoader(ds, batch_size=2, num_workers=2,
                                         timeout=60) as loader:
        got = [(v.clone(), list(t)) for v, t in loader]
    assert sum(len(t) for _, t in got) == len(clips)
    k = 0
    for v, texts in got:
        for j, text in enumerate(texts):
            assert text == caption(k)
            assert torch.equal(v[j], datahelix.decode(
                clips[k], frames=3, size=(16, 16)))
            k += 1


def metric_sum(addr, name):
    """The sum over servers of sample `name` at a loader's metrics."""
    import urllib.request
    from prometheus_client.parser import text_string_to_metric_families
    with urllib.request.urlopen(f"http://{addr}/metrics", timeout=5) as r:
        text = r.read().decode()
    return sum(s.value for f in text_string_to_metric_families(text)
               for s in f.samples if s.name == name)


def test_read_stage_in_stats_trace_telemetry_and_metrics(clips, tmp_path):
    """Issue 35 item 4: each sample's read (bytes, ms) reaches the trace,
    stats(), the step telemetry and the Coordinator's metrics, and they
    agree with one another."""
    make_pytar(tmp_path / "s.tar", clips, tarfile.GNU_FORMAT)
    run_dh("probe", "--out", tmp_path / "s.jsonl", tmp_path / "s.tar",
           check=True)
    tel, trace = tmp_path / "tel.jsonl", tmp_path / "trace.json"
    with datahelix.DataLoader(str(tmp_path / "s.jsonl"), telemetry=str(tel),
                              trace=str(trace), metrics_listen="127.0.0.1:0",
                              **SMALL) as loader:
        steps = sum(1 for _ in loader)
        st = loader.stats()
        # the servers' totals arrive with their heartbeats
        deadline = time.monotonic() + 15
        mbytes = 0
        while time.monotonic() < deadline and mbytes < st["read_bytes"]:
            mbytes = metric_sum(loader.metrics_address,
                                "datahelix_server_read_bytes_total")
            time.sleep(0.2)
        reads = metric_sum(loader.metrics_address,
                           "datahelix_server_reads_total")
        secs = metric_sum(loader.metrics_address,
                          "datahelix_server_read_seconds_total")
    assert st["read_samples"] == steps * SMALL["batch_size"]
    assert st["read_bytes"] > 0 and st["read_ms"] > 0
    assert st["epoch"]["read_bytes"] == st["read_bytes"]
    spans = [e for e in json.loads(trace.read_text())["traceEvents"]
             if e.get("ph") == "X" and e.get("name", "").startswith("read ")]
    assert len(spans) == st["read_samples"]
    assert sum(e["args"]["bytes"] for e in spans) == st["read_bytes"]
    recs = [json.loads(x) for x in tel.read_text().splitlines()]
    assert sum(r["read_bytes"] for r in recs) == st["read_bytes"]
    # the server read at least what the delivered samples did (the local
    # server's totals also count a prefetched step nobody consumed)
    assert mbytes >= st["read_bytes"] and reads > 0 and secs > 0


def test_a_slow_source_is_named_as_the_cause_of_late_steps(clips, tmp_path,
                                                           monkeypatch):
    """Every read of the shard sleeps 40 ms (DATAHELIX_READ_DELAY_MS, a
    store with that latency): the late steps' stage is read, not decode."""
    make_pytar(tmp_path / "s.tar", clips, tarfile.GNU_FORMAT)
    run_dh("probe", "--out", tmp_path / "s.jsonl", tmp_path / "s.tar",
           check=True)
    monkeypatch.setenv("DATAHELIX_READ_DELAY_MS", "40")
    with datahelix.DataLoader(str(tmp_path / "s.jsonl"), **SMALL) as loader:
        for _ in loader:
            pass
        st = loader.stats()
    by = st["late_by_stage"]
    assert by and max(by, key=by.get) == "read", by
    # each sample's reads took at least the delay
    assert st["read_ms"] >= 40 * st["read_samples"]


def test_an_index_of_another_version_is_compiled_again(clips, tmp_path):
    """A .dhx left beside its table by a build before shards (format
    version 1), newer than the table, is rebuilt, not refused."""
    run_dh("probe", "--out", tmp_path / "m.jsonl", *clips[:2], check=True)
    old = tmp_path / "m.dhx"
    old.write_bytes(b"DHXINDEX" + (1).to_bytes(4, "little") + bytes(500))
    os.utime(old, (time.time() + 10, time.time() + 10))
    table = datahelix.Table(tmp_path / "m.jsonl")
    assert len(table) == 2 and table.path(0) == str(clips[0])
    head = old.read_bytes()[:12]
    assert int.from_bytes(head[8:], "little") == \
        datahelix._C.INDEX_FORMAT_VERSION


def test_torchrun_two_ranks_skip_a_damaged_member_in_step(clips, tmp_path):
    """2 ranks under torchrun on a shard whose member 3 was damaged after
    probe (its first bytes zeroed: it no longer opens), on_error="skip",
    DDP's all-reduce each step, 2 epochs: both ranks take every planned
    step and the member is substituted once an epoch, on the rank that
    had it."""
    from procs import torchrun
    from test_loader_habits import DDP_SKIP_SCRIPT, _torchrun_ok, plan
    if not _torchrun_ok():
        pytest.skip("torch.distributed.run is not usable here")
    make_pytar(tmp_path / "s.tar", clips, tarfile.GNU_FORMAT)
    m = tmp_path / "s.jsonl"
    run_dh("probe", "--out", m, tmp_path / "s.tar", check=True)
    bad = rows(m)[3]
    with open(tmp_path / "s.tar", "r+b") as f:
        f.seek(bad["offset"])
        f.write(bytes(4096))
    run_dh("probe", "--out", tmp_path / "v.jsonl", *clips[:2], check=True)
    for t in (m, tmp_path / "v.jsonl"):  # compile the indexes once
        datahelix.Table(t)
    script = tmp_path / "ddp.py"
    script.write_text(DDP_SKIP_SCRIPT)
    res = torchrun(2, script, tmp_path, m, tmp_path / "v.jsonl")
    planned = [len(plan(m, 2, 1, e)) for e in range(2)]
    assert res[0]["steps"] == res[1]["steps"] == planned
    assert sorted(res[0]["subs"] + res[1]["subs"]) == [3, 3]


def test_a_remote_sidecar_reads_shard_members(clips, tmp_path):
    """A remote sidecar DataServer over the shard table's index (round-
    robin beside the rank's local server): its tasks read the members in
    place (read spans with bytes on its own track) and every step comes."""
    from conftest import start_coordinator, stop_process
    make_pytar(tmp_path / "s.tar", clips, tarfile.GNU_FORMAT)
    run_dh("probe", "--out", tmp_path / "s.jsonl", "--index",
           tmp_path / "s.dhx", tmp_path / "s.tar", check=True)
    binary = _binary()
    sock = tmp_path / "c.sock"
    procs = [start_coordinator(sock, "--policy", "round-robin")]
    try:
        procs.append(subprocess.Popen(
            [binary, "dataserver", "--remote", "--coordinator",
             f"ipc://{sock}", "--index", tmp_path / "s.dhx", "--server-id",
             "77"], stderr=subprocess.DEVNULL))
        trace = tmp_path / "t.json"
        remote = []
        deadline = time.monotonic() + 60
        while not remote and time.monotonic() < deadline:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            p = run_dh("consume", "--coordinator", f"ipc://{sock}",
                       "--manifest", tmp_path / "s.dhx", "--rank", 0,
                       "--world-size", 1, "--batch-size", 1, "--prefetch", 1,
                       "--json", "--listen", f"tcp://127.0.0.1:{port}",
                       "--trace", trace, timeout=180)
            assert p.returncode == 0, p.stderr
            ev = json.loads(trace.read_text())["traceEvents"]
            remote = [e for e in ev if e["pid"] == 100077 and
                      e.get("ph") == "X" and e.get("cat") == "read"]
    finally:
        for x in reversed(procs):
            stop_process(x)
    assert remote, "the sidecar took no task"
    assert all(e["args"]["bytes"] > 0 for e in remote)
    summary = next(json.loads(x)["summary"] for x in p.stdout.splitlines()
                   if '"summary"' in x)
    assert summary["steps"] == len(clips), summary


def probed_copies(clips, tmp_path):
    """tmp_path/v holding the clips as 0.mp4, 1.mp4, ..., probed into
    tmp_path/m.jsonl; the folder."""
    d = tmp_path / "v"
    d.mkdir()
    for i, f in enumerate(clips):
        shutil.copy(f, d / f"{i}.mp4")
    run_dh("probe", "--out", tmp_path / "m.jsonl", d, check=True)
    return d


def test_a_file_replaced_after_probe_is_a_sample_error(clips, tmp_path):
    """Issue 41 item 4: a row whose file was replaced after probing (its
    size is not the table's) is a SampleError saying so and what to do,
    never silently another clip; skip substitutes it."""
    d = probed_copies(clips[:4], tmp_path)
    victim = d / "2.mp4"
    shutil.copy(clips[5], victim)  # another clip, another size
    assert victim.stat().st_size != clips[2].stat().st_size
    with pytest.raises(datahelix.SampleError) as ei:
        loader_run(tmp_path / "m.jsonl", batch_size=4)
    assert ei.value.sample_id == 2
    assert "changed since probe" in str(ei.value) and \
        "datahelix probe" in str(ei.value) and str(victim) in str(ei.value)
    got = loader_run(tmp_path / "m.jsonl", on_error="skip")
    assert sum(len(x[0]) for x in got) == 4 and \
        2 not in [i for x in got for i in x[0]]
    with pytest.raises(datahelix.DataError, match="changed since probe"):
        datahelix.decode(datahelix.Table(tmp_path / "m.jsonl").source(2))
    assert datahelix.decode(victim, frames=2, size=(8, 8)).shape[0] == 2


def test_a_file_rewritten_at_the_same_size_is_a_sample_error(clips,
                                                             tmp_path):
    """Issue 41 item 4, the rest: the table records each file's mtime
    (mtime_ns) besides its size, so a file rewritten at the same size is
    a SampleError too, saying so and what to do; the same time again and
    it decodes."""
    d = probed_copies(clips[:4], tmp_path)
    victim = d / "1.mp4"
    st = victim.stat()
    row = next(r for r in rows(tmp_path / "m.jsonl")
               if r["path"].endswith("1.mp4"))
    assert row["mtime_ns"] == st.st_mtime_ns
    victim.write_bytes(victim.read_bytes())  # rewritten, same size
    os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))
    assert victim.stat().st_size == st.st_size
    with pytest.raises(datahelix.SampleError) as ei:
        loader_run(tmp_path / "m.jsonl", batch_size=4)
    msg = str(ei.value)
    assert ei.value.sample_id == row["id"] and str(victim) in msg
    assert "changed since probe" in msg and "5.000 s after" in msg and \
        "datahelix probe" in msg
    with pytest.raises(datahelix.DataError, match="changed since probe"):
        datahelix.decode(datahelix.Table(tmp_path / "m.jsonl").source(
            row["id"]))
    p = run_dh("decode", *DECODE, tmp_path / "m.jsonl")
    assert p.returncode == 1 and "changed since probe" in p.stderr
    os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns))
    got = loader_run(tmp_path / "m.jsonl", batch_size=4)
    assert sorted(i for x in got for i in x[0]) == [0, 1, 2, 3]


def test_a_file_dated_before_1970_gets_no_mtime_and_reads_back(clips,
                                                               tmp_path):
    """A time the table's field cannot hold (negative: before 1970, as in
    some unpacked archives) is not recorded, so the table probe writes
    reads back and the file decodes (its size is still checked)."""
    d = tmp_path / "v"
    d.mkdir()
    shutil.copy(clips[0], d / "old.mp4")
    os.utime(d / "old.mp4", ns=(0, -315_619_200 * 10**9))  # 1960
    run_dh("probe", "--out", tmp_path / "m.jsonl", d, check=True)
    row = rows(tmp_path / "m.jsonl")[0]
    assert "mtime_ns" not in row and row["bytes"] > 0
    got = loader_run(tmp_path / "m.jsonl", batch_size=1)
    assert [x[0] for x in got] == [[0]]
