"""A DataServer's Python worker (not a public module): what
`datahelix dataserver --python-dataset FILE` starts for
datahelix.DistributedDataLoader (src/runtime/dataserver_python.c has the
protocol; docs/python.md "DistributedDataLoader").

    python -m datahelix._worker --fd 3 --arena-fd 4 --dataset FILE
        --worker-id I --num-workers N --seed S --alloc-timeout-ms MS
        --server-id ID

It loads the pickled dataset (only from a file of its own user that nobody
else may write: unpickling runs code), runs worker_init_fn, says ready,
then for each job - a header id (bit 63: the iteration's base seed) and
dataset indices - calls dataset[i] for each index (the random generators
of `random`, torch and numpy seeded from (base seed, index) first, so a
sample's random draws do not depend on which worker ran it), collates,
and writes the batch into a slot of the server's arena (datahelix._slot).
An IterableDataset's job is instead a step of this worker's own stream
(the second id, bit 63 too: the iteration, this worker, the step's place
in the stream): the worker iterates its copy of the dataset, forms
batches as torch's fetcher does, and writes the next one, or an "end"
slot once its stream is exhausted (Stream).
An exception of the dataset or collate_fn goes into the slot too, as text
(type name, message, traceback); the rank re-raises it.  A batch holding a
value the slot format cannot carry fails here, naming its place.  It ends
at EOF on its socket, and with the server in any case (PR_SET_PDEATHSIG).
"""
import argparse
import os
import pickle
import random
import socket
import stat
import struct
import sys
import traceback

HDR_BIT = 1 << 63
M64 = (1 << 64) - 1
MAX_TEXT = 4000
SEQ_MASK = (1 << 32) - 1
ITER_SHIFT = 38


def sample_seed(base, index):
    """splitmix64 of (base seed, sample index), 63 bits."""
    z = (base + (index + 1) * 0x9E3779B97F4A7C15) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return (z ^ (z >> 31)) & (M64 >> 1)


def _summary(exc):
    lines = traceback.format_exception_only(type(exc), exc)
    return "".join(lines).strip()[-MAX_TEXT:]


def _check_owner(path):
    """Unpickling runs code: the file and its folder must be this user's
    and writable by nobody else."""
    for p in (path, os.path.dirname(os.path.abspath(path))):
        st = os.stat(p)
        if st.st_uid != os.getuid() or st.st_mode & (stat.S_IWGRP |
                                                     stat.S_IWOTH):
            raise PermissionError(
                f"{p} is not owned by uid {os.getuid()} or is writable by "
                "others: refusing to unpickle the dataset from it")


def load_config(path):
    _check_owner(path)
    with open(path, "rb") as f:
        outer = pickle.load(f)  # plain types only
    if outer.get("version") != 1:
        raise ValueError(f"{path}: unknown dataset file version "
                         f"{outer.get('version')!r}")
    # The rank's import path, so that the dataset's classes import here
    # as they did there.
    sys.path[:] = list(outer["sys_path"]) + [p for p in sys.path
                                             if p not in outer["sys_path"]]
    if outer.get("payload") is None:
        raise ValueError(
            f"{path}: {outer.get('unpicklable') or 'no dataset'}; such a "
            "dataset reaches the workers only by fork, from the loader's "
            "fork server, which is gone")
    return pickle.loads(outer["payload"])


class Worker:
    def __init__(self, a, sock, cfg=None):
        import torch
        from torch.utils.data._utils import collate as tcollate
        from torch.utils.data._utils import worker as tworker

        from . import _C, _slot

        self.torch, self.tworker, self.slot = torch, tworker, _slot
        self.a, self.sock = a, sock
        self.id, self.n = a.worker_id, a.num_workers
        self.arena = _C.Arena(a.arena_fd)
        os.close(a.arena_fd)
        torch.set_num_threads(1)
        if cfg is None:  # exec'd, not forked from the fork server
            cfg = load_config(a.dataset)
        self.dataset = cfg["dataset"]
        self.collate_fn = cfg["collate_fn"]
        self.auto = cfg["auto_collation"]
        self.default_collate = self.collate_fn in (tcollate.default_collate,
                                                   tcollate.default_convert)
        self.cfg = cfg
        self.iterable = cfg.get("iterable", False)
        # An IterableDataset's shards: over ranks too (each rank's workers
        # are workers of one pool), and none in the main process's place.
        # A map-style dataset's workers are the rank's own, as torch's.
        rank, world = (cfg.get("rank", 0), cfg.get("world_size", 1)) \
            if self.iterable else (0, 1)
        self.info_id = rank * self.n + self.id
        self.info_n = world * self.n
        self.main_process = cfg.get("main_process", False)
        self.stream = None
        self.base = None
        self.set_base(a.seed)
        self.seed_all(a.seed + self.id)  # as torch seeds a worker
        self.datapipe = self.shard_datapipe()
        # A worker_init_fn that seeds torch takes the seeding over, as in
        # torch's workers: no per-sample (or per-pass) seeding then.
        self.user_seeded = False
        if cfg.get("worker_init_fn") is not None:
            cfg["worker_init_fn"](self.info_id)
            self.user_seeded = torch.initial_seed() != \
                (a.seed + self.id) & M64

    def shard_datapipe(self):
        """A datapipe's sharding_filter, as torch's DataLoader sets it in
        its workers (_sharding_worker_init_fn: over ranks first, then
        workers); True for a datapipe."""
        dp = self.torch.utils.data.datapipes.datapipe
        if not isinstance(self.dataset, (dp.IterDataPipe, dp.MapDataPipe)):
            return False
        world, rank = self.cfg.get("world_size", 1), self.cfg.get("rank", 0)
        n = 1 if self.main_process else self.n
        self.torch.utils.data.graph_settings.apply_sharding(
            self.dataset, n * world, self.id * world + rank)
        return True

    def set_base(self, base):
        """A new iteration's base seed: get_worker_info().seed follows."""
        self.base = base
        self.info = self.tworker.WorkerInfo(id=self.info_id,
                                            num_workers=self.info_n,
                                            seed=base + self.info_id,
                                            dataset=self.dataset)
        self.tworker._worker_info = None if self.main_process else self.info

    def seed_all(self, s):
        random.seed(s)
        self.torch.manual_seed(s)
        np = sys.modules.get("numpy")
        if np is not None:
            np.random.seed(s & 0xFFFFFFFF)

    # -- messages --

    def send(self, data):
        self.sock.sendall(data)

    def progress(self, task, i):
        try:  # advisory: names the sample if this worker dies on it
            self.sock.send(b"DHPS" + struct.pack("<QQ", task, i),
                           socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            pass

    def fail(self, task, sample, code, text):
        self.send(b"DHPE" + struct.pack("<QQi", task, sample, code) +
                  text.encode("utf-8", "replace")[:MAX_TEXT])

    def recv_job(self):
        """(task, ids), or None at EOF."""
        m = self.sock.recv(65536)
        if not m:
            return None
        if len(m) < 16 or m[:4] != b"DHPJ":
            raise RuntimeError("protocol: expected a job")
        n, task = struct.unpack_from("<IQ", m, 4)
        ids = list(struct.unpack_from(f"<{(len(m) - 16) // 8}Q", m, 16))
        while len(ids) < n:
            c = self.sock.recv(65536)
            if not c:
                return None
            if c[:4] != b"DHPC":
                raise RuntimeError("protocol: expected the rest of a job")
            (k,) = struct.unpack_from("<I", c, 4)
            ids += struct.unpack_from(f"<{k}Q", c, 8)
        return task, ids

    # -- a job --

    def collate(self, data):
        if not self.default_collate:
            return self.collate_fn(data)
        # torch's default_collate puts its output in shared memory when it
        # runs in a worker; here the batch is copied into the arena anyway.
        self.tworker._worker_info = None
        try:
            return self.collate_fn(data)
        finally:
            self.tworker._worker_info = None if self.main_process \
                else self.info

    def load(self, task, ids):
        """The batch, or raises with `self.failed` = the index that did."""
        base = ids[0] & ~HDR_BIT
        if base != self.base:
            self.set_base(base)
        data = []
        for i in ids[1:]:
            self.failed = i
            self.progress(task, i)
            if not self.user_seeded:
                self.seed_all(sample_seed(base, i))
            data.append(self.dataset[i])
        self.failed = None
        return self.collate(data if self.auto else data[0])

    def stream_step(self, ids):
        """(batch, dataset state or None) of this worker's stream at the
        step's place, or Stream.END."""
        base, m = ids[0] & ~HDR_BIT, ids[1] & ~HDR_BIT
        it, seq = m >> ITER_SHIFT, m & SEQ_MASK
        if self.stream is None or self.stream.iteration != it:
            # A new iteration: seeded as torch seeds a worker (base seed +
            # worker id), then a fresh iter(dataset).
            self.stream = None
            self.set_base(base)
            if not self.user_seeded:
                self.seed_all(base + self.info_id)
            self.stream = Stream(self, it)
        return self.stream.step(seq)

    def put(self, task, plan):
        """Writes `plan` into a new slot and hands it over (DHPD)."""
        try:
            ref = self.arena.alloc(plan.nbytes, self.a.alloc_timeout_ms)
        except Exception as e:  # ArenaExhausted, too big
            self.fail(task, self.failed_or_none(),
                      getattr(e, "code", -3), f"{_summary(e)} (a batch of "
                      f"{plan.nbytes} bytes)")
            return
        # The server now knows the slot: if this process dies, it goes back.
        self.send(b"DHPA" + struct.pack("<QQQI", task, *ref))
        try:
            plan.write(self.arena.view(*ref))
        except Exception as e:
            self.fail(task, self.failed_or_none(), -3,
                      f"writing the batch into the arena: {_summary(e)}")
            return
        self.send(b"DHPD" + struct.pack("<QQQI", task, *ref))

    def failed_or_none(self):
        return self.failed if self.failed is not None else (1 << 64) - 1

    def run_job(self, task, ids):
        self.failed = None
        if not ids or not ids[0] & HDR_BIT:
            self.fail(task, (1 << 64) - 1, -2, "protocol: a job without its "
                      "header id (is this server started by a "
                      "DistributedDataLoader?)")
            return
        where = f"in DataServer {self.a.server_id} Python worker {self.id}"
        state = None
        try:
            if len(ids) == 2 and ids[1] & HDR_BIT:
                got = self.stream_step(ids)
                if got is Stream.END:
                    self.put(task, self.slot.plan_end(self.info_id))
                    return
                batch, state = got
            else:
                batch = self.load(task, ids)
        except Exception:
            plan = self.slot.plan_error(sys.exc_info(), self.id, os.getpid(),
                                        self.failed, where)
        else:
            try:  # a value the slot format cannot carry: named here
                plan = self.slot.plan_batch(batch) if state is None \
                    else self.slot.plan_batch(batch, state)
            except Exception:
                plan = self.slot.plan_error(sys.exc_info(), self.id,
                                            os.getpid(), None, where,
                                            stage="encode")
            del batch
        del ids
        self.put(task, plan)

    def serve(self):
        self.send(b"DHPR" + struct.pack("<I", os.getpid()))
        while True:
            job = self.recv_job()
            if job is None:
                return 0
            self.run_job(*job)


class Stream:
    """One iteration of this worker's copy of an IterableDataset, in
    batches formed as torch's _IterableDatasetFetcher forms them (batch_size
    items, the last one short unless drop_last; batch_size None: each item
    converted).  Steps come in their order; a step ahead of the stream
    (the first a respawned worker gets, or the first after a resume
    without the dataset's state) skips the batches before it, loading but
    not collating them: the rank has them already."""
    END = object()

    def __init__(self, w, iteration):
        self.w, self.iteration = w, iteration
        self.next = 0
        self.ended = False
        self.stateful = callable(getattr(w.dataset, "state_dict", None))
        if w.datapipe:  # its shuffles, alike in every worker (torch's)
            g = w.torch.Generator()
            g.manual_seed(w.base)
            w.dataset = w.torch.utils.data.graph_settings.apply_random_seed(
                w.dataset, g)
        cfg = w.cfg
        self.bs, self.drop_last = cfg.get("batch_size"), cfg.get("drop_last")
        self.it = None
        r = cfg.get("resume")
        if r and r["iteration"] == iteration:
            mine = r["workers"].get(w.info_id)
            if mine is not None:
                if mine.get("state") is not None and \
                        callable(getattr(w.dataset, "load_state_dict", None)):
                    w.dataset.load_state_dict(mine["state"])
                    self.next = mine["seq"]
                if mine.get("ended"):
                    self.ended = True

    def items(self):
        """The next batch's items (a list; [] at the end of the stream)."""
        if self.it is None:
            self.it = iter(self.w.dataset)
        if self.bs is None:
            for x in self.it:
                return [x]
            return []
        out = []
        for x in self.it:
            out.append(x)
            if len(out) == self.bs:
                break
        if self.drop_last and len(out) < self.bs:
            return []
        return out

    def step(self, seq):
        if seq < self.next:
            raise RuntimeError(f"stream step {seq} asked after step "
                               f"{self.next - 1} (steps of a worker come "
                               "in order)")
        while not self.ended and self.next < seq:
            if not self.items():
                self.ended = True
            self.next += 1
        if self.ended:
            return Stream.END
        try:
            data = self.items()
        except BaseException:
            self.next += 1
            raise
        self.next += 1
        if not data:
            self.ended = True
            return Stream.END
        batch = self.w.collate(data if self.bs is not None else data[0])
        state = self.w.dataset.state_dict() if self.stateful else None
        return batch, state


def parser():
    p = argparse.ArgumentParser(prog="python -m datahelix._worker")
    p.add_argument("--fd", type=int, required=True)
    p.add_argument("--arena-fd", type=int, required=True)
    p.add_argument("--dataset", required=True)
    p.add_argument("--worker-id", type=int, required=True)
    p.add_argument("--num-workers", type=int, required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--alloc-timeout-ms", type=int, default=30000)
    p.add_argument("--server-id", type=int, default=0)
    return p


def run(a, cfg=None):
    """A worker's life on socket a.fd; cfg: the loaded dataset file (the
    fork server's, which holds it already), else read from a.dataset."""
    sock = socket.socket(fileno=a.fd)
    # Sends are bounded: a server that stops reading for a minute is gone.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO,
                    struct.pack("ll", 60, 0))
    try:
        w = Worker(a, sock, cfg)
    except BaseException as e:
        sys.stderr.write(f"datahelix: python worker {a.worker_id} (pid "
                         f"{os.getpid()}) could not load the dataset "
                         f"{a.dataset}:\n{traceback.format_exc()}")
        try:
            sock.sendall(b"DHPF" + _summary(e).encode("utf-8", "replace"))
        except OSError:
            pass
        return 1
    try:
        return w.serve()
    except (BrokenPipeError, ConnectionResetError):
        return 0  # the server went away
    except OSError as e:  # a send that timed out
        sys.stderr.write(f"datahelix: python worker {a.worker_id} (pid "
                         f"{os.getpid()}): {e}; exiting\n")
        return 1


def main(argv=None):
    return run(parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
