"""What every module of the harness shares: names, paths, logging."""
import pathlib
import sys

PKG = pathlib.Path(__file__).resolve().parent
HERE = PKG.parent          # bench/: gpu_model.py, calibrate_handover.py
ROOT = HERE.parent         # the source tree: python/, build/
CMD = "bench"

SYSTEMS = ("native", "native-pyav", "dask-pool", "dh-base", "dh-transport",
           "dh-prefetch", "dh-ddl", "dh-ddlb")
WORKLOADS = ("S", "M", "L", "mixed", "shared")


def ablation_of(system):
    """The datahelix.DataLoader ablation preset of a dh-* system: its name
    after "dh-"; dh-ddlb is dh-ddl with Tier 2 on (sources.py)."""
    rung = system[3:]
    return "ddl" if rung == "ddlb" else rung
MODELS = ("videomae", "qwen-vl", "dit")
DDL_MS = 1.0  # default data deadline: the batch was not ready when asked


def log(msg):
    print(f"bench: {msg}", file=sys.stderr, flush=True)
