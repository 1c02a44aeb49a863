"""The run's data: generated clips (cached per workload, clips and seed
under --data-dir) or the shared set, probed with the model's tokens, the
clips every decoder can take, repeated under new ids into a manifest
that one epoch of the run covers, and its .dhx index.
"""
import hashlib
import json
import os
import pathlib
import subprocess

from .common import ROOT, log
from .sources import pyav_decode


def run_quiet(cmd, what, timeout=900):
    p = subprocess.run([str(c) for c in cmd], capture_output=True, text=True,
                       timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"{what} failed ({p.returncode}): "
                           f"{p.stderr.strip()[-500:]}")
    return p


def decodable(a, rows):
    """The rows whose clip decodes at the run's frames and size (with the
    C decode, and with PyAV when native-pyav runs); each one left out is
    logged with the decoder's reason (the shared set holds a deliberately
    corrupt clip, which would stop every system's first rank that meets
    it, and a clip with out-of-order timestamps PyAV cannot seek in)."""
    paths = sorted({r["path"] for r in rows})
    # One decode over every clip: it goes on past a failure, printing a
    # JSON line per clip it decoded and the reason for each one it did not.
    p = subprocess.run([a.bin, "decode", "--json", "--frames",
                        str(a.frames), "--size", f"{a.size[0]}x{a.size[1]}",
                        *paths], capture_output=True, text=True,
                       timeout=120 + 10 * len(paths))
    ok = {json.loads(x).get("path") for x in p.stdout.splitlines()}
    err = p.stderr.strip().splitlines()
    bad = {}
    for path in paths:
        if path not in ok:
            bad[path] = next((x for x in err if path in x),
                             f"{path}: not decoded (exit status "
                             f"{p.returncode})")
        elif "native-pyav" in a.systems:
            # Every system gets the same samples: a clip the PyAV peer
            # cannot decode is left out for all, and said.
            try:
                pyav_decode(path, a.frames, a.size[0], a.size[1])
            except ImportError:
                pass  # native-pyav reports PyAV missing itself
            except Exception as e:  # noqa: BLE001 - any PyAV failure
                bad[path] = f"{path}: PyAV (native-pyav): {e}"
    for why in bad.values():
        log(f"left out of the run: {why}")
    return [r for r in rows if r["path"] not in bad]


def shard_table(a, d, probed):
    """The clips of `probed` written as shards of at most a.shards bytes
    (cached beside them), probed with the same tokens: the same rows in
    the same order, read in place from the shards."""
    out = d / f"shards-{a.shards}"
    table = d / f"probe-{a.model}-shards-{a.shards}.jsonl"
    if not table.exists():
        log(f"writing shards of {a.shards} bytes into {out}")
        run_quiet([a.bin, "shard", "--quiet", "--shard-bytes", a.shards,
                   "--out", out, probed], "shard")
        tmp = d / f"{table.name}.tmp{os.getpid()}"
        run_quiet([a.bin, "probe", "--quiet", "--tokens", a.model, "--out",
                   tmp, *sorted(out.glob("*.tar"))], "probe of the shards")
        os.replace(tmp, table)
    return table


def prepare_data(a, need):
    """The manifest (JSONL, `need` samples: the probed clips repeated with
    new ids) and its .dhx index.  Generated clips are cached per
    (workload, clips, seed)."""
    base = pathlib.Path(a.data_dir or (ROOT / "bench" / "out" / "live-data"))
    base.mkdir(parents=True, exist_ok=True)
    if a.workload == "shared":
        videos = pathlib.Path(os.environ.get(
            "DATAHELIX_SHARED_VIDEOS", ROOT.parent / "shared" / "data" /
            "videos"))
        if not videos.is_dir():
            raise RuntimeError(f"{videos}: not found (the shared workload "
                               "needs ../shared/data/videos)")
        d = base / "shared"
    else:
        d = base / f"{a.workload}-{a.clips}-s{a.seed}"
        videos = d / "videos"
        if not (d / "done").exists():
            log(f"generating {a.clips} {a.workload} clips into {videos}")
            run_quiet([a.bin, "gen-data", "--out", videos, "--profiles",
                       a.workload, "--count", a.clips, "--seed",
                       a.seed + 1], "gen-data")
            (d / "done").write_text("ok\n")
    d.mkdir(parents=True, exist_ok=True)
    probed = d / f"probe-{a.model}.jsonl"
    if not probed.exists():
        log(f"probing {videos} (--tokens {a.model})")
        tmp = d / f"probe-{a.model}.jsonl.tmp{os.getpid()}"
        run_quiet([a.bin, "probe", "--quiet", "--tokens", a.model,
                   "--out", tmp, videos], "probe")
        os.replace(tmp, probed)
    if a.shards:
        probed = shard_table(a, d, probed)
    lines = probed.read_text().splitlines()
    header = [x for x in lines if '"datahelix_header"' in x]
    rows = [json.loads(x) for x in lines if '"datahelix_header"' not in x]
    if a.workload == "shared":
        rows = decodable(a, rows)
    if not rows:
        raise RuntimeError(f"{probed}: no samples")
    # Named by the clips it repeats: which shared clips are kept depends on
    # the frames, the size and the systems of the run.
    kept = hashlib.sha1("\n".join(r["path"] + ":" + r.get("member", "")
                                  for r in rows).encode())
    stem = f"m-{a.model}-n{need}-{kept.hexdigest()[:12]}"
    m = d / f"{stem}.jsonl"
    dhx = m.with_suffix(".dhx")
    if not dhx.exists():
        tmp = d / f"{stem}.tmp{os.getpid()}.jsonl"
        with open(tmp, "w") as f:
            for h in header:
                f.write(h + "\n")
            for k in range(need):
                r = dict(rows[k % len(rows)])
                r["id"] = k
                f.write(json.dumps(r) + "\n")
        os.replace(tmp, m)
        tmpx = d / f"{stem}.tmp{os.getpid()}.dhx"
        run_quiet([a.bin, "index", m, "-o", tmpx], "index")
        os.replace(tmpx, dhx)
    return m, dhx, len(rows)
