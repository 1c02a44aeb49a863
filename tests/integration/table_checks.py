"""What the shard and remote-data tests check of a table and a loader
over it: its rows, rows compared without their place (the same clips at
another place), and the rest of an epoch after a resume.
"""
import json
import pathlib
import sys

from conftest import ROOT

sys.path.insert(0, str(ROOT / "python"))
import datahelix  # noqa: E402


def rows(table):
    """The table's sample rows (its header record left out)."""
    return [json.loads(x) for x in pathlib.Path(table).read_text()
            .splitlines() if '"datahelix_header"' not in x]


def without_path(rs):
    """The rows without what says where the file is: its path, and a local
    file's mtime (an object at a URL has none: its ETag is checked)."""
    return [{k: v for k, v in r.items() if k not in ("path", "mtime_ns")}
            for r in rs]


def rest_after_resume(table, **kw):
    """The steps' ids a DataLoader(table, **kw) gives after one step, a
    state_dict() and a new loader that loads it."""
    with datahelix.DataLoader(str(table), **kw) as ld:
        it = iter(ld)
        next(it)
        state = ld.state_dict()
    with datahelix.DataLoader(str(table), **kw) as ld:
        ld.load_state_dict(state)
        return [b["ids"].tolist() for b in ld]
