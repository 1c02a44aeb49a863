"""torch.utils.data.DataLoader's semantics, checked on
datahelix.DistributedDataLoader (issue 16; docs/python.md
"DistributedDataLoader").  Every test taking `make` runs twice: against
torch's own DataLoader (it must pass there: the test is right) and against
ours.  IterableDataset streams, get_worker_info(), seeds, worker_init_fn,
shipping __main__-style objects (local classes, lambdas, closures),
argument validation, typing, killed workers, collections, timeouts; then
what only ours has: state_dict() resume (map- and iterable-style, across a
kill -9 of the training process), stats(), zero copy.
"""
import json
import multiprocessing
import os
import pathlib
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
import warnings

import pytest

from conftest import ROOT
from procs import arena_mapping

torch = pytest.importorskip("torch")
sys.path.insert(0, str(ROOT / "python"))
HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import datahelix  # noqa: E402
import sem_datasets as sd  # noqa: E402
from both_loaders import binary_env, make  # noqa: E402,F401
from torch.utils.data import ChainDataset  # noqa: E402


def rr(streams):
    """torch's order: the workers in turn, each left out once it ends."""
    out, its = [], [iter(s) for s in streams]
    live = list(range(len(its)))
    while live:
        for w in list(live):
            try:
                out.append(next(its[w]))
            except StopIteration:
                live.remove(w)
    return out


def flat(batches):
    return [b.tolist() for b in batches]


# ---- IterableDataset ------------------------------------------------------


def test_a_stream_is_split_by_worker_and_batched_in_turn(make):
    got = flat(make(sd.Stream(11), batch_size=2))
    w0, w1 = list(range(0, 11, 2)), list(range(1, 11, 2))
    want = rr([[w0[i:i + 2] for i in range(0, len(w0), 2)],
               [w1[i:i + 2] for i in range(0, len(w1), 2)]])
    assert got == want
    assert got[-1] == [9]  # the last batch of worker 1 is short


def test_streams_that_end_at_different_times_leave_the_turn(make):
    got = flat(make(sd.Uneven(2), batch_size=1, num_workers=3))
    want = rr([[[100 * w + j] for j in range((w + 1) * 2)]
               for w in range(3)])
    assert got == want and len(got) == 12


def test_a_stream_with_drop_last_and_unbatched(make):
    assert flat(make(sd.Stream(9), batch_size=2, drop_last=True)) == \
        [[0, 2], [1, 3], [4, 6], [5, 7]]
    got = list(make(sd.Stream(5), batch_size=None))
    assert [int(x) for x in got] == [0, 1, 2, 3, 4]


def test_num_workers_0_iterates_in_the_main_process_view(make):
    # get_worker_info() is None: the dataset does not split itself.
    assert flat(make(sd.Stream(5), batch_size=2, num_workers=0,
                     timeout=0)) == [[0, 1], [2, 3], [4]]


def test_a_chain_of_streams(make):
    ds = ChainDataset([sd.Stream(4), sd.Stream(3)])
    got = sorted(x for b in make(ds, batch_size=2) for x in b.tolist())
    assert got == sorted(list(range(4)) + list(range(3)))


def test_len_of_a_stream_and_the_warning_when_it_yields_more(make):
    loader = make(sd.Unsplit(4), batch_size=None)
    assert len(loader) == 4
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        got = sorted(int(x) for x in loader)
    assert got == sorted(list(range(4)) * 2)
    assert any("Length of IterableDataset" in str(x.message) and
               "was reported to be 4" in str(x.message) for x in w), \
        [str(x.message) for x in w]
    sized = make(sd.Sized(7), batch_size=2, drop_last=True)
    assert len(sized) == 3
    assert len(make(sd.Sized(7), batch_size=2)) == 4
    with pytest.raises(TypeError):
        len(make(sd.Stream(3)))


def test_an_error_in_iter_carries_its_traceback(make):
    with pytest.raises(ValueError, match="(?s)Caught ValueError.*"
                       "no stream today") as ei:
        list(make(sd.RaisesInIter(), batch_size=2, num_workers=1))
    assert "raise ValueError" in str(ei.value)


def test_an_error_mid_stream_then_the_stream_ends(make):
    it = iter(make(sd.RaisesAt(6, bad=3), batch_size=1, num_workers=1))
    assert [next(it).tolist() for _ in range(3)] == [[0], [1], [2]]
    with pytest.raises(KeyError, match="item 3 is bad"):
        next(it)
    assert list(it) == []  # a generator that raised is done


def test_worker_info_and_seeds(make):
    g = torch.Generator()
    g.manual_seed(7)
    got = sorted(make(sd.Info(), batch_size=None, generator=g),
                 key=lambda r: int(r["id"]))
    assert [int(r["id"]) for r in got] == [0, 1]
    assert all(int(r["num_workers"]) == 2 for r in got)
    assert all(r["dataset_is_copy"] == "Info" for r in got)
    s0, s1 = (int(r["seed"]) for r in got)
    assert s1 == s0 + 1  # base_seed + worker_id
    assert [int(r["initial_seed"]) for r in got] == [s0, s1]
    # The same generator seed: the same seeds and draws; another: others.
    g.manual_seed(7)
    again = sorted(make(sd.Info(), batch_size=None, generator=g),
                   key=lambda r: int(r["id"]))
    assert [int(r["seed"]) for r in again] == [s0, s1]
    assert [int(r["draw"]) for r in again] == [int(r["draw"]) for r in got]
    g.manual_seed(8)
    other = make(sd.Info(), batch_size=None, generator=g)
    assert sorted(int(r["seed"]) for r in other) != [s0, s1]


def test_worker_init_fn_sees_its_worker(make):
    got = sorted(int(r["mark"]) for r in make(
        sd.Info(), batch_size=None, worker_init_fn=sd.init_mark))
    assert got == [1000, 1001]


def test_persistent_workers_keep_their_processes(make):
    loader = make(sd.Pids(), batch_size=None, persistent_workers=True)
    first = sorted(int(p) for p in loader)
    assert sorted(int(p) for p in loader) == first and len(set(first)) == 2


# ---- shipping -------------------------------------------------------------


def test_local_classes_lambdas_and_closures_ship(make):
    offset = 40  # a closure's cell

    class Local(torch.utils.data.Dataset):  # not importable by name
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return i + offset

    got = list(make(Local(), batch_size=2,
                    collate_fn=lambda b: [x * 2 for x in b],
                    worker_init_fn=lambda w: None))
    assert got == [[80, 82], [84, 86]]


class _Holder(torch.utils.data.Dataset):
    def __init__(self):
        self.files = [1, threading.Lock()]
        self.count = multiprocessing.Value("i", 0)

    def __len__(self):
        return 4

    def __getitem__(self, i):
        with self.count.get_lock():
            self.count.value += 1
        return i


def test_what_cannot_be_shipped_is_named(tmp_path):
    """Workers of another interpreter (python=) cannot fork from this
    process: they must unpickle the dataset, and what cannot be pickled is
    named."""
    other = tmp_path / "python3"
    other.symlink_to(sys.executable)
    loader = datahelix.DistributedDataLoader(
        _Holder(), num_workers=1, python=str(other))
    try:
        with pytest.raises(TypeError, match=r"dataset\.files\[1\] \(a "
                           r"_thread\.lock\) cannot be"):
            iter(loader)
    finally:
        loader.close()


@pytest.mark.parametrize("ctx", [None, "spawn"])
def test_what_cannot_be_pickled_is_inherited_by_forked_workers(ctx):
    """Issue 41 item 6: forked workers inherit a dataset that cannot be
    pickled - a lock, a multiprocessing.Value they share with the training
    process - as torch's do (under spawn too, where torch hands it to its
    workers as they start: spawn cannot pickle it either); each pass forks
    them afresh, so they see the dataset as it is then."""
    ds = _Holder()
    loader = datahelix.DistributedDataLoader(ds, batch_size=2,
                                             num_workers=2,
                                             multiprocessing_context=ctx)
    try:
        assert [b.tolist() for b in loader] == [[0, 1], [2, 3]]
        assert ds.count.value == 4  # the workers' increments, shared
        ds.files.append("grown")
        assert sorted(x for b in loader for x in b.tolist()) == [0, 1, 2, 3]
        assert ds.count.value == 8
    finally:
        loader.close()


# ---- arguments, typing, attributes ----------------------------------------


def test_invalid_arguments_raise_torch_s_errors(make):
    C = make.cls
    r = sd.Range(4)
    bad = [
        (dict(num_workers=-1), "num_workers option should be non-negative"),
        (dict(timeout=-1), "timeout option should be non-negative"),
        (dict(prefetch_factor=3), "prefetch_factor option could only"),
        (dict(persistent_workers=True), "persistent_workers option needs"),
        (dict(shuffle=True, sampler=[0, 1]), "mutually exclusive"),
        (dict(batch_sampler=[[0]], batch_size=2), "mutually exclusive"),
        (dict(batch_size=None, drop_last=True), "mutually exclusive"),
        (dict(multiprocessing_context="spawn"), "can only be used with"),
    ]
    for kw, msg in bad:
        with pytest.raises(ValueError, match=msg):
            C(r, **kw)
    with pytest.raises(ValueError, match="valid start method"):
        C(r, num_workers=1, multiprocessing_context="nonsense")
    with pytest.raises(TypeError, match="valid context"):
        C(r, num_workers=1, multiprocessing_context=3)
    s = sd.Stream(3)
    for kw, what in ((dict(shuffle=True), "shuffle"),
                     (dict(sampler=[0]), "sampler"),
                     (dict(batch_sampler=[[0]]), "batch_sampler")):
        with pytest.raises(ValueError, match="IterableDataset: expected "
                           f"unspecified {what} option"):
            C(s, **kw)
    loader = make(r, num_workers=1)
    for attr in ("batch_size", "sampler", "dataset", "drop_last",
                 "batch_sampler", "persistent_workers"):
        with pytest.raises(ValueError, match=f"{attr} attribute should not "
                           "be set after"):
            setattr(loader, attr, None)
    loader.num_workers = 1  # others may be set


def test_generic_typing_and_a_context_object(make):
    assert make.cls[int] is not None
    import multiprocessing
    loader = make(sd.Range(4), batch_size=2, num_workers=1,
                  multiprocessing_context=multiprocessing.get_context(
                      "fork"))
    assert flat(loader) == [[0, 1], [2, 3]]


KILLED_UNDER_TORCH = """
import sys
sys.path.insert(0, sys.argv[1])
import torch, sem_datasets as sd
try:
    for _ in torch.utils.data.DataLoader(sd.Killer(6, bad=2), batch_size=1,
                                         num_workers=1, timeout=60):
        pass
except Exception as e:
    print(type(e).__name__ + ": " + str(e))
"""


def test_a_worker_killed_by_a_signal_is_reported_as_torch_does(make):
    if make.kind == "torch":
        # In a process of its own: torch's loader installs a SIGCHLD handler
        # that raises from wherever the main thread is while a dead
        # worker's iterator lives (pytest's traceback keeps it), which
        # would fail unrelated later tests.  Its reader sometimes meets the
        # dying worker's half-written message first (ConnectionResetError,
        # its own race); ours must always say which worker died and how.
        p = subprocess.run([sys.executable, "-c", KILLED_UNDER_TORCH,
                            str(HERE)], capture_output=True, text=True,
                           timeout=120)
        said = p.stdout.strip()
        assert said.startswith("ConnectionResetError") or re.search(
            r"RuntimeError: DataLoader worker \(pid(\(s\))? \d+", said), \
            (said, p.stderr[-2000:])
        return
    with pytest.raises(RuntimeError) as ei:
        for _ in make(sd.Killer(6, bad=2), batch_size=1, num_workers=1):
            pass
    assert re.search(r"DataLoader worker \(pid(\(s\))? \d+",
                     str(ei.value)), ei.value
    assert "is killed by signal: Killed" in str(ei.value), ei.value


def test_timeout_raises_as_torch_does(make):
    # Sample 0 comes at once (ours: its first batch may take longer while
    # the workers start), sample 1 takes 30 s.
    it = iter(make(sd.Slow(2), num_workers=1, timeout=2))
    assert next(it).tolist() == [0]
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="DataLoader timed out after 2"):
        next(it)
    assert time.monotonic() - t0 < 20


def test_collections_convert_as_default_collate_does(make):
    b = next(iter(make(sd.Collections(4), batch_size=2)))
    assert b["t"].tolist() == [[0, 0], [1, 1]]
    assert type(b["p"]).__name__ == "Point" and b["p"]._fields == ("x", "y")
    assert b["p"].x.tolist() == [0, 1] and b["p"].y.tolist() == [0.0, 0.5]
    assert isinstance(b["l"], list) and b["l"][0].tolist() == [0, 1] and \
        list(b["l"][1]) == ["0", "1"]
    assert list(b["s"]) == ["s0", "s1"]
    assert [t.tolist() for t in b["none_free"]] == [[0, 1], [1, 2]]
    # batch_size=None: each sample converted, not collated.
    assert [int(x) for x in make(sd.Range(3), batch_size=None)] == [0, 1, 2]


# ---- only ours: zero copy, stats(), resume --------------------------------


def _ours(*args, **kw):
    kw.setdefault("num_workers", 2)
    kw.setdefault("timeout", 60)
    return datahelix.DistributedDataLoader(*args, **kw)


def test_stream_batches_are_arena_views_and_other_leaves_survive():
    with _ours(sd.Stream(6), batch_size=3,
               collate_fn=lambda b: {"t": torch.tensor(b), "n": len(b),
                                     "s": str(b), "x": None}) as loader:
        got = list(loader)
    assert [g["t"].tolist() for g in got] == [[0, 2, 4], [1, 3, 5]]
    assert [(g["n"], g["s"], g["x"]) for g in got] == \
        [(3, "[0, 2, 4]", None), (3, "[1, 3, 5]", None)]
    assert "memfd:datahelix-arena" in arena_mapping(got[0]["t"].data_ptr())


def _doc_stats_fields():
    text = (ROOT / "docs" / "python.md").read_text()
    sec = text.split("\n## stats()\n", 1)[1].split("\n## ", 1)[0]
    out = set()
    for line in sec.splitlines():
        if line.startswith("| `"):
            cell = line.split("|")[1]
            out |= {f for f in cell.split("`")[1::2]}
    return out


def test_stats_has_the_dataloader_s_fields():
    with _ours(sd.Range(8), batch_size=2) as loader:
        assert loader.stats()["epoch"] is None
        assert len(list(loader)) == 4
        s = loader.stats()
    fields = _doc_stats_fields()
    assert {"steps", "misses", "input_wait_p95_ms"} <= fields
    top = fields - {"epoch", "pass", "elapsed_s", "late", "late_by_stage"}
    missing = {f for f in top if f not in s}
    assert not missing, missing
    assert s["steps"] == 4 and s["passes"] == 1
    assert s["epochs"][0]["steps"] == 4 and s["epochs"][0]["pass"] == 1
    # A stream's ends are steps on the wire, not batches.
    with _ours(sd.Uneven(2), batch_size=1, num_workers=3) as loader:
        assert len(list(loader)) == 12
        s = loader.stats()
    assert s["steps"] == 12 and s["epochs"][0]["steps"] == 12, s


RESUME = textwrap.dedent("""
    import json, os, sys
    sys.path[:0] = [{py!r}, {here!r}]
    import torch, datahelix, sem_datasets as sd
    kind, out, state_in = sys.argv[1], sys.argv[2], sys.argv[3]
    if kind == "map":
        g = torch.Generator(); g.manual_seed(5)
        loader = datahelix.DistributedDataLoader(
            sd.Noisy(23), batch_size=2, shuffle=True, generator=g,
            num_workers=2, timeout=60)
    else:
        ds = sd.Counter(23) if kind == "stateful" else sd.Uneven(3)
        loader = datahelix.DistributedDataLoader(
            ds, batch_size=2, num_workers=3, timeout=60)
    if state_in != "-":
        with open(state_in) as f:
            lines = f.read().splitlines()
        loader.load_state_dict(json.loads(lines[-1])["state"])
    with open(out, "a") as f:
        for b in loader:
            f.write(json.dumps({{"b": b.tolist(),
                                 "state": loader.state_dict()}}) + "\\n")
            f.flush()
            if os.environ.get("SLOW"):
                import time; time.sleep(0.3)
    loader.close()
""")


def _run(script, kind, out, state="-", env=None):
    return subprocess.Popen([sys.executable, str(script), kind, str(out),
                             str(state)], env=env)


@pytest.mark.parametrize("kind", ["map", "iterable", "stateful"])
def test_resume_after_kill_9_gives_the_same_stream(kind, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(RESUME.format(py=str(ROOT / "python"),
                                    here=str(HERE)))
    full = tmp_path / "full.jsonl"
    assert _run(script, kind, full).wait(timeout=120) == 0
    want = [json.loads(x)["b"] for x in full.read_text().splitlines()]
    assert len(want) >= 6
    cut = tmp_path / "cut.jsonl"
    p = _run(script, kind, cut, env=dict(os.environ, SLOW="1"))
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and (
            not cut.exists() or len(cut.read_text().splitlines()) < 3):
        time.sleep(0.05)
    os.kill(p.pid, signal.SIGKILL)
    p.wait(timeout=30)
    lines = cut.read_text().splitlines()
    try:
        json.loads(lines[-1])
    except ValueError:  # killed mid-line
        lines = lines[:-1]
        cut.write_text("".join(x + "\n" for x in lines))
    assert 3 <= len(lines) < len(want)
    head = [json.loads(x)["b"] for x in lines]
    rest = tmp_path / "rest.jsonl"
    assert _run(script, kind, rest, cut).wait(timeout=120) == 0
    tail = [json.loads(x)["b"] for x in rest.read_text().splitlines()]
    assert head + tail == want


def test_a_stream_is_split_over_ranks_and_their_workers(coordinator):
    """world 2 x 2 workers: get_worker_info() says 4 workers, rank r's
    are r * 2 and r * 2 + 1, so the shards are disjoint and cover all."""
    loaders = [_ours(sd.Stream(13), batch_size=None, rank=r, world_size=2,
                     coordinator=coordinator) for r in range(2)]
    try:
        its = [iter(x) for x in loaders]
        got = [[], []]
        live = [0, 1]
        while live:  # the ranks step together, as DDP's would
            for r in list(live):
                try:
                    got[r].append(int(next(its[r])))
                except StopIteration:
                    live.remove(r)
    finally:
        for x in loaders:
            x.close()
    assert got[0] == rr([range(0, 13, 4), range(1, 13, 4)])
    assert got[1] == rr([range(2, 13, 4), range(3, 13, 4)])


def test_a_dataset_that_grows_between_epochs(make):
    ds = sd.Growing(3)
    loader = make(ds, batch_size=None)
    assert [tuple(x) for x in loader] == [(i, 3) for i in range(3)]
    ds.grow(2)  # non-persistent workers see the dataset as it is now
    assert [tuple(x) for x in loader] == [(i, 5) for i in range(5)]


def test_load_state_dict_on_a_running_loader():
    with _ours(sd.Stream(10), batch_size=2) as loader:
        it = iter(loader)
        first = [next(it).tolist() for _ in range(2)]
        st = loader.state_dict()
        rest = [b.tolist() for b in it]
        loader.load_state_dict(st)  # restarts its workers with the state
        assert [b.tolist() for b in loader] == rest
        assert first + rest == [[0, 2], [1, 3], [4, 6], [5, 7], [8], [9]]


def test_a_stream_worker_killed_once_is_replayed_to_its_step(tmp_path):
    marker = tmp_path / "killed"
    with _ours(sd.KilledOnceStream(12, bad=7, marker=marker),
               batch_size=2) as loader:
        got = flat(loader)
    assert marker.exists()  # it did die, at worker 1's third item
    assert got == [[0, 2], [1, 3], [4, 6], [5, 7], [8, 10], [9, 11]]


def test_start_warms_the_workers_and_iter_sees_the_dataset_as_it_is():
    ds = sd.Growing(2)
    with _ours(ds, batch_size=None, persistent_workers=True) as loader:
        assert loader.start() is loader
        ds.grow(1)  # after start(), before the first iter(): shipped again
        assert [tuple(x) for x in loader] == [(i, 3) for i in range(3)]
        ds.grow(1)  # persistent workers keep their first pass's copy
        assert [tuple(x) for x in loader] == [(i, 3) for i in range(4)]


def test_datapipes_are_sharded_and_shuffled_as_torch_does(make):
    from torch.utils.data.datapipes.iter import IterableWrapper

    pipe = IterableWrapper(range(10)).sharding_filter()
    assert [int(x) for x in make(pipe, batch_size=None)] == list(range(10))
    # Without a sharding_filter every worker yields all of it.
    whole = IterableWrapper(range(3))
    assert sorted(int(x) for x in make(whole, batch_size=None)) == \
        [0, 0, 1, 1, 2, 2]
    runs = []
    for _ in range(2):
        g = torch.Generator()
        g.manual_seed(3)
        shuffled = IterableWrapper(range(20)).shuffle().sharding_filter()
        runs.append([int(x) for x in make(shuffled, batch_size=None,
                                          shuffle=True, generator=g)])
    assert sorted(runs[0]) == list(range(20)) and runs[0] == runs[1]
    assert runs[0] != list(range(20))


def test_an_error_in_worker_init_fn_is_raised_at_next(make):
    with pytest.raises(ValueError, match="cannot start today"):
        next(iter(make(sd.Range(4), num_workers=1,
                       worker_init_fn=sd.init_fails)))


def test_random_split_subsets_and_in_order(make):
    g = torch.Generator()
    g.manual_seed(1)
    a, b = torch.utils.data.random_split(sd.Range(10), [7, 3], generator=g)
    got = [x for t in make(b, batch_size=2) for x in t.tolist()]
    assert got == [int(i) for i in b.indices] and len(got) == 3
    if make.kind == "datahelix":  # torch 2.6's in_order: ours keeps order
        assert flat(make(sd.Range(5), batch_size=2, in_order=False)) == \
            [[0, 1], [2, 3], [4]]


def test_break_then_a_new_pass_of_a_stream_starts_it_again(make):
    loader = make(sd.Stream(9), batch_size=2)
    full = flat(loader)
    for i, _ in enumerate(loader):
        if i == 1:
            break
    assert flat(loader) == full
    it = iter(loader)
    assert next(it).tolist() == full[0]
    assert flat(iter(loader)) == full  # a new iter() supersedes the old


# ---- issue 41 item 6: torch's own DataLoader suite, the held-out cases ----

def test_timeout_counts_the_first_batch_too(make):
    """timeout= counts from next(), the first batch's included, as torch's
    (datahelix allowed the workers' start-up on top: it never raised)."""
    it = iter(make(sd.Sleepy(4, 3.0), batch_size=2, timeout=1))
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="DataLoader timed out after 1"):
        next(it)
    assert time.monotonic() - t0 < 20


def test_len_follows_a_dataset_that_grows_under_shuffle(make):
    ds = sd.Growing(4)
    loader = make(ds, batch_size=1, shuffle=True)
    assert len(loader) == 4
    ds.grow(1)
    assert len(loader) == 5
    assert sorted(int(b[0][0]) for b in loader) == [0, 1, 2, 3, 4]


def test_more_than_four_workers_hold_samples_at_once(make):
    """Six workers, each waiting until all six hold a sample: every worker
    gets work at once (the DataServer registered 1 worker with the
    Coordinator, whose cap of 4 tasks per worker left two idle)."""
    pids = [int(b) for b in make(sd.Together(6), batch_size=None,
                                 num_workers=6)]
    assert len(set(pids)) == 6


def test_the_iterator_names_its_workers_and_they_end_with_it(make):
    """`it._workers` (torch's iterator attribute, read by its own tests):
    the workers' processes by worker id, alive while the loader is; they
    end, exit code 0, once the iterator and the loader are dropped (no
    close(): ours held its pass strongly, a cycle only the garbage
    collector broke)."""
    loader = make.cls(sd.WhoLoads(8), batch_size=None, num_workers=2,
                      timeout=60)
    it = iter(loader)
    seen = {int(next(it)) for _ in range(4)}
    workers = it._workers
    assert len(workers) == 2 and seen <= {w.pid for w in workers}
    assert all(w.is_alive() and w.exitcode is None for w in workers)
    del it, loader
    for w in workers:
        w.join(30)
        assert not w.is_alive() and w.exitcode == 0


def test_a_worker_init_fn_that_seeds_torch_rules_the_seeds(make):
    """torch's test_worker_init_fn: worker_init_fn calls
    torch.manual_seed(12345), so every sample sees that seed (datahelix's
    per-sample seeding stands aside once the user seeds)."""
    got = [int(x) for b in make(sd.InitialSeed(6), batch_size=2,
                                worker_init_fn=sd.seed_12345) for x in b]
    assert got == [12345] * 6


def test_a_namedtuple_made_in_a_class_body_comes_back_as_itself(make):
    # num_workers=0: torch's workers could not pickle it back (its
    # qualname does not find it); ours run the dataset in a worker anyway
    b = next(iter(make(sd.Nested(4), batch_size=2, num_workers=0,
                       timeout=0)))
    assert type(b) is sd.Nested.Pair
    assert b.a.tolist() == [0, 1] and b.b.tolist() == [0, -1]
