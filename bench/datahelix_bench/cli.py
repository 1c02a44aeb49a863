"""`datahelix bench`'s command line: the one place that parses and checks
the arguments (src/cli/cmd_bench.c hands them over unparsed).  Bad
arguments are one line `datahelix: bench: <what>: <why>` on stderr and
exit status 2, before anything starts; --help prints USAGE on stdout.
The messages and bounds are the ones the C front end used to apply.
"""
import argparse
import math
import os
import pathlib
import re
import signal
import sys

from .common import CMD, DDL_MS, HERE, MODELS, ROOT, SYSTEMS, WORKLOADS

USAGE = """\
usage: datahelix bench [--systems LIST] [--ranks R] [--steps N]
                       [--warmup W] [--workload S|M|L|mixed|shared]
                       [--model videomae|qwen-vl|dit] [--workers N]
                       [--batch-size B] [--json] [--out DIR] [--plots]
                       [--validate] [--gpu [--gpu-device D]] [--trace]

Runs data-loading systems side by side, one after the other in one
run, each as R training-rank processes (torch.distributed, gloo)
that per step take a batch, hold an emulated GPU window (a sleep
sized from the batch under --model) and all-reduce; same samples
mix, same number of decode workers, same CPUs.  Prints the paper's
metrics (Sec. 5.1) per system and dh-ddl's ratios to native and
dask-pool.

  --systems LIST     comma-separated, or all (default):
                     native       torch DataLoader per rank, C decode
                     native-pyav  the same, PyAV decode
                     dask-pool    a Dask LocalCluster serving all ranks
                                  (skipped without python3-distributed)
                     dh-base, dh-transport, dh-prefetch, dh-ddl
                                  datahelix.DataLoader(ablation=...)
  --ranks R          training ranks (default 4)
  --steps N          measured steps per rank (default 40)
  --warmup W         warm-up steps left out (default 5)
  --workload W       gen-data profiles S, M, L or mixed (default),
                     or shared (../shared/data/videos)
  --model M          GPU window: videomae (frames x batch, default),
                     qwen-vl (tokens + quadratic attention), dit
                     (latents)
  --workers N        CPU budget: decode workers in total for every
                     system, every process pinned to N CPUs when
                     there are more (default 2; at least one per
                     rank for rank-local loaders)
  --batch-size B     samples per rank and step (default 2)
  --frames N         frames per sample (default 16)
  --size WxH         output size (default 224x224)
  --prefetch K       batches in flight per rank for native,
                     native-pyav, dask-pool (default 4; the dh-*
                     rungs use their presets)
  --clips N          distinct clips generated (default 24)
  --seed S           data and plan seed (default 0)
  --gpu-scale X      multiplies every GPU window (default 1)
  --step-order O     the dh-* rungs' plan: alternate (default) or
                     sorted (docs/planner.md "Step order")
  --cpu-pools on|off the dh-* rungs' Coordinator: local DataServers
                     sharing CPUs run as many tasks at once as the
                     CPUs can, earliest due first, under the deadline
                     policy (default on; docs/placement.md "CPU pools")
  --timeout S        bound on one system's run (default 180 + 20
                     per step)
  --out DIR          results.json, table.md, per-rank records,
                     telemetry, plots (default bench/out/live)
  --shards BYTES     read the clips from WebDataset shards of at most
                     BYTES each (datahelix shard) instead of the
                     files, in place (dh-* systems only; 0: files,
                     the default; docs/shards.md)
  --serve S          local (default), http or s3: the clips served by
                     nginx / s3rver on loopback and read by URL by
                     every system (docs/remote.md "Benchmark")
  --rtt-ms N         with --serve: a proxy adds N ms of round trip
                     (default 0)
  --serve-port P     with --serve: the proxy's port (default: a free
                     one; the same port keeps http:// URLs, and so the
                     cache's keys, the same across runs)
  --cache-dir DIR    dh-* systems: the host-local cache of remote
                     objects (cold when DIR is new, warm when a run
                     filled it)
  --data-dir DIR     where generated clips are cached
                     (default bench/out/live-data)
  --json             print the results as one JSON object
  --plots            PNGs into --out (needs python3-matplotlib)
  --trace            dh-* systems: each rank writes a Chrome trace
                     (Perfetto) into --out: SYSTEM/trace-rankR.json
                     (docs/trace.md); the late-step causes are
                     reported either way
  --ddl-ms MS        the data deadline: a rank-step whose input
                     wait exceeds it is a DDL miss (default 1:
                     the batch was not ready when asked)
  --gpu              a real step of a small video transformer
                     (bench/gpu_model.py: forward, backward,
                     optimizer) on --gpu-device instead of the
                     emulated window; exit 2 without CUDA
  --gpu-device D     cuda (default: rank r on cuda:r mod count),
                     cuda:N, or cpu (the same model on the CPU, which
                     it then shares with decode: a check of the
                     path, not a measurement)
  --validate         also simulate the same configuration with
                     `datahelix sim` (this machine's decode times,
                     the same GPU window) and print how far the
                     simulated native, pool and datahelix are from
                     the live native, dask-pool and dh-ddl
  --bin PATH         the datahelix program the ranks' data servers and
                     the harness run (default $DATAHELIX_BIN, which
                     `datahelix bench` sets to itself)
  -h, --help         this text

`datahelix bench` runs this harness, the bench/datahelix_bench package
(found from that program's location, or $DATAHELIX_BENCH_DIR), as
`/usr/bin/python3 -m datahelix_bench` ($DATAHELIX_PYTHON), its arguments
passed on unparsed.
Exit 0 when at least one system ran; 1 otherwise; 2 for bad arguments.
"""


class UsageError(Exception):
    """A bad argument: one line, exit status 2."""


def die_usage(msg):
    print(f"datahelix: {CMD}: {msg}", file=sys.stderr)
    sys.exit(2)


# ---------------------------------------------------------------------------
# one value each: these raise argparse.ArgumentTypeError with the message
# the user sees (calibrate_handover.py uses size_arg too)

_INT = re.compile(r"\s*[+-]?[0-9]+")


def integer(name, lo, hi):
    def conv(s):
        if not _INT.fullmatch(s) or not lo <= int(s) <= hi:
            raise argparse.ArgumentTypeError(
                f"{name} must be an integer in [{lo}, {hi}], not '{s}'")
        return int(s)
    return conv


def number(name, lo, hi, bounds):
    def conv(s):
        try:
            v = float(s)
        except ValueError:
            v = math.nan
        if not (math.isfinite(v) and lo <= v <= hi):
            raise argparse.ArgumentTypeError(
                f"{name} must be a number in {bounds}, not '{s}'")
        return v
    return conv


def one_of(name, names, expected):
    def conv(s):
        if s not in names:
            raise argparse.ArgumentTypeError(
                f"{name} '{s}': expected {expected}")
        return s
    return conv


def size_arg(s):
    """"WxH", each side 1..16384, as (w, h)."""
    w, _, h = s.partition("x")
    if not (_INT.fullmatch(w) and _INT.fullmatch(h) and
            1 <= int(w) <= 16384 and 1 <= int(h) <= 16384):
        raise argparse.ArgumentTypeError(
            f"--size '{s}': expected WxH, each 1..16384")
    return (int(w), int(h))


def systems_arg(s):
    """"native,dh-ddl" or "all": every name known, at least one."""
    if s == "all":
        return list(SYSTEMS)
    names = [x for x in s.split(",") if x]
    for x in names:
        if x not in SYSTEMS:
            raise argparse.ArgumentTypeError(
                f"--systems: unknown system '{x}' (expected "
                f"{', '.join(SYSTEMS)} or all)")
    if not names:
        raise argparse.ArgumentTypeError("--systems: empty list")
    return list(dict.fromkeys(names))


def gpu_device_arg(s):
    """cuda, cuda:N or cpu (whether the device is there: check_gpu)."""
    if s in ("cpu", "cuda") or re.fullmatch(r"cuda:[0-9]+", s):
        return s
    raise argparse.ArgumentTypeError(
        f"--gpu-device must be cuda, cuda:N or cpu, not '{s}'")


# ---------------------------------------------------------------------------
# the parser

class Parser(argparse.ArgumentParser):
    """argparse, its errors in the getopt words of every other datahelix
    subcommand, raised rather than printed."""

    def error(self, message):
        m = re.fullmatch(r"argument (\S+): expected one argument", message)
        if m:
            raise UsageError(f"option '{m.group(1).split('/')[-1]}' needs "
                             "a value")
        # "argument --ranks: <the converter's own message>"
        m = re.fullmatch(r"argument \S+: (.*)", message, re.S)
        raise UsageError(m.group(1) if m else message)


def build_parser():
    ap = Parser(prog="datahelix bench", add_help=False)
    add = ap.add_argument
    add("-h", "--help", action="store_true")
    add("--systems", type=systems_arg, default=list(SYSTEMS))
    add("--ranks", type=integer("--ranks", 1, 64), default=4)
    add("--steps", type=integer("--steps", 1, 100000), default=40)
    add("--warmup", type=integer("--warmup", 0, 100000), default=5)
    add("--workload", default="mixed", type=one_of(
        "--workload", WORKLOADS, "S, M, L, mixed or shared"))
    add("--model", default="videomae", type=one_of(
        "--model", MODELS, "videomae, qwen-vl or dit"))
    add("--workers", type=integer("--workers", 1, 1024), default=2)
    add("--batch-size", type=integer("--batch-size", 1, 1024), default=2)
    add("--frames", type=integer("--frames", 1, 1024), default=16)
    add("--size", type=size_arg, default=(224, 224))
    add("--prefetch", type=integer("--prefetch", 1, 64), default=4)
    add("--clips", type=integer("--clips", 1, 100000), default=24)
    add("--seed", type=integer("--seed", 0, 2**31 - 1), default=0)
    add("--gpu-scale", type=number("--gpu-scale", 0, 1e6, "[0, 1e6]"),
        default=1.0)
    add("--cpu-pools", choices=("on", "off"), default="on")
    add("--step-order", choices=("alternate", "sorted"), default="alternate")
    add("--timeout", type=integer("--timeout", 10, 86400), default=0)
    add("--json", action="store_true")
    add("--out", default=str(ROOT / "bench" / "out" / "live"))
    add("--data-dir", default=None)
    add("--shards", type=integer("--shards", 0, 2**50), default=0)
    add("--serve", choices=("local", "http", "s3"), default="local")
    add("--rtt-ms", type=integer("--rtt-ms", 0, 10000), default=0)
    add("--serve-port", type=integer("--serve-port", 0, 65535), default=0)
    add("--cache-dir", default=None)
    add("--plots", action="store_true")
    add("--trace", action="store_true")
    add("--validate", action="store_true")
    add("--ddl-ms", type=number("--ddl-ms", 0, 1e9, "[0, 1e9]"),
        default=DDL_MS)
    add("--gpu", action="store_true")
    add("--gpu-device", type=gpu_device_arg, default="cuda")
    add("--bin", default=None)
    return ap


def parse_args(argv=None):
    """The checked arguments (an argparse.Namespace), or UsageError; a
    Namespace with help=True when -h / --help was given."""
    a, rest = build_parser().parse_known_args(argv)
    if a.help:
        return a
    if rest:
        x = rest[0]
        raise UsageError(f"bad option '{x}'" if x.startswith("-") and
                         x != "-" else f"unexpected argument '{x}'")
    if a.gpu and a.validate:
        raise UsageError("--validate simulates the emulated GPU window; it "
                         "does not take --gpu")
    if a.shards and any(not s.startswith("dh-") for s in a.systems):
        raise UsageError("--shards: the dh-* systems only (the peers read "
                         "files by path); e.g. --systems dh-ddl")
    if a.rtt_ms and a.serve == "local":
        raise UsageError("--rtt-ms: with --serve http or s3")
    if a.cache_dir and a.serve == "local":
        raise UsageError("--cache-dir: with --serve http or s3 (it caches "
                         "remote objects)")
    if a.batch_size * a.ranks > 4096:
        raise UsageError("--ranks x --batch-size must be at most 4096")
    return a


# ---------------------------------------------------------------------------
# what the arguments name: checked before anything starts

def find_bin(a):
    b = a.bin or os.environ.get("DATAHELIX_BIN") or \
        str(ROOT / "build" / "datahelix")
    if not os.access(b, os.X_OK):
        raise UsageError(f"the datahelix program was not found at {b}: run "
                         "`make build` or set DATAHELIX_BIN")
    return os.path.abspath(b)


def check_gpu(a):
    """--gpu: the device must be there (torch says; bench/gpu_model.py)."""
    if not a.gpu:
        return
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    from gpu_model import cuda_missing
    why = cuda_missing(a.gpu_device)
    if why:
        raise UsageError(why)


def check_out(a):
    out = pathlib.Path(a.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"--out {out}: {e.strerror}") from None


def main(argv=None):
    try:
        a = parse_args(argv)
        if a.help:
            sys.stdout.write(USAGE)
            return 0
        a.bin = find_bin(a)
        check_gpu(a)
        check_out(a)
    except UsageError as e:
        die_usage(str(e))
    signal.signal(signal.SIGTERM, _interrupted)
    from .harness import run
    return run(a)


def _interrupted(signum, _frame):
    # Unwinds through run_system's cleanup: every rank, DataServer,
    # Coordinator and Dask worker of the run ends by pid.
    raise KeyboardInterrupt(f"signal {signum}")
