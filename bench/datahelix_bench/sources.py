"""The loaders compared, as a rank uses them: each source's next()
returns (batch, sample ids, their est_tokens, batch-ready ms or None,
payload bytes shipped), and close() ends what it started.

Every system decodes 'frames' uniform frames, shorter side resized,
centre crop to 'size', uint8 THWC:
  native        one torch.utils.data.DataLoader per rank (DistributedSampler:
                a random split), worker processes running the C decode
                (datahelix._C.decode)                         TorchSource
  native-pyav   the same with a PyAV decode in __getitem__    TorchSource
  dask-pool     a Dask LocalCluster of the budget's workers serving every
                rank's per-sample tasks (the scheduler hands each task to a
                free worker); the same C decode; payloads come back by TCP
                                                              DaskSource
  dh-base, dh-transport, dh-prefetch, dh-ddl
                datahelix.DataLoader(ablation=...) per rank, one Coordinator
                per system run with the rung's placement policy
                                                              DatahelixSource
  dh-ddlb       dh-ddl plus Tier 2 (load_balance=: rounds of 4 steps, the
                default cost gate with margin 1.5, over the ranks' gloo
                group; docs/rebalance.md)                     DatahelixSource

The decoders here also run in loader worker processes and Dask workers,
which find this module by its package name (PYTHONPATH holds bench/).
"""
import os
import time


# calibrate_handover.py's stand-in clip: a zeroed payload of the run's
# size instead of a decode, so that only the system's own work is left.
NULL_CLIP = "<null-decode>"


def c_decode(path, frames, w, h):
    if path == NULL_CLIP:
        return bytes(frames * w * h * 3)
    from datahelix import _C
    return _C.decode(path, frames, w, h)


def uniform(n, k):
    """datahelix's uniform plan: the middle frame of k equal segments."""
    return [min(int((i + 0.5) * n / k), n - 1) for i in range(k)]


_s3 = None


def _s3_object(url):
    """An s3:// object as torch users read it: botocore's get_object into
    memory (the endpoint and keys from the AWS variables)."""
    import io

    import botocore.session
    global _s3
    if _s3 is None:
        _s3 = botocore.session.get_session().create_client(
            "s3", endpoint_url=os.environ.get("AWS_ENDPOINT_URL"),
            region_name=os.environ.get("AWS_REGION", "us-east-1"))
    bucket, key = url[5:].split("/", 1)
    return io.BytesIO(_s3.get_object(Bucket=bucket, Key=key)["Body"].read())


def pyav_decode(path, frames, w, h):
    """PyAV: exact uniform frames (seek to the keyframe before a target,
    decode forward), shorter side resized to fit, centre crop: the same
    output as the C decode's default geometry.  One decoder thread."""
    import bisect

    import av
    import numpy as np
    if path.startswith("s3://"):
        c = av.open(_s3_object(path))
    elif path.startswith(("http://", "https://")):
        try:  # one more try on a dropped connection, as datahelix retries
            c = av.open(path, timeout=60)
        except (av.error.EOFError, OSError):
            c = av.open(path, timeout=60)
    else:
        c = av.open(path)
    try:
        s = c.streams.video[0]
        s.codec_context.thread_type = "NONE"
        s.codec_context.thread_count = 1
        pts, keys = [], []
        for p in c.demux(s):
            if p.size == 0 or p.pts is None:
                continue
            pts.append(p.pts)
            if p.is_keyframe:
                keys.append(p.pts)
        if not pts:
            raise RuntimeError(f"{path}: no video packets")
        pts.sort()
        keys = sorted(keys) or pts[:1]
        cc = s.codec_context
        sw = sh = None
        out, packets, cur = [], None, None
        for t in [pts[i] for i in uniform(len(pts), frames)]:
            if out and t == cur:
                out.append(out[-1])
                continue
            kt = keys[max(bisect.bisect_right(keys, t) - 1, 0)]
            if packets is None or cur is None or kt > cur:
                c.seek(kt, backward=True, any_frame=False, stream=s)
                packets = c.demux(s)
            f = None
            for p in packets:
                for fr in cc.decode(p):
                    if fr.pts is not None and fr.pts >= t:
                        f = fr
                        break
                if f is not None:
                    break
            if f is None:
                raise RuntimeError(f"{path}: pts {t} not reached")
            cur = f.pts
            if sw is None:
                r = max(w / f.width, h / f.height)
                sw, sh = max(w, round(f.width * r)), max(h, round(f.height * r))
            a = f.to_ndarray(format="rgb24", width=sw, height=sh)
            y0, x0 = (sh - h) // 2, (sw - w) // 2
            out.append(a[y0:y0 + h, x0:x0 + w])
        return np.ascontiguousarray(np.stack(out))
    finally:
        c.close()


def dask_decode(path, frames, w, h):
    """A Dask task: one clip through the C decode; bytes come back."""
    return c_decode(path, frames, w, h)


class TorchSource:
    """native / native-pyav: torch.utils.data.DataLoader on this rank."""

    def __init__(self, cfg, rows):
        import torch
        import torch.utils.data as tud
        torch.set_num_threads(1)
        self.rows = rows
        T, (w, h) = cfg["frames"], cfg["size"]
        pyav = cfg["system"] == "native-pyav"

        class DecodeDataset(tud.Dataset):
            def __len__(self):
                return len(rows)

            def __getitem__(self, i):
                path = rows[i]["path"]
                if pyav:
                    v = torch.from_numpy(pyav_decode(path, T, w, h))
                else:
                    raw = c_decode(path, T, w, h)
                    v = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
                    v = v.view(T, h, w, 3)
                return {"video": v, "ids": i}

        def collate(samples):
            b = tud.default_collate(samples)
            b["ready_t"] = time.time()
            return b

        class TimedBatchSampler:
            """Records when each batch's indices go to a worker (the
            request), in the main process."""

            def __init__(self, sampler, batch):
                self.bs = tud.BatchSampler(sampler, batch, drop_last=True)
                self.req = {}

            def __iter__(self):
                for b in self.bs:
                    self.req[tuple(b)] = time.time()
                    yield b

            def __len__(self):
                return len(self.bs)

        sampler = tud.distributed.DistributedSampler(
            range(len(rows)), num_replicas=cfg["world"], rank=cfg["rank"],
            shuffle=True, seed=cfg["seed"], drop_last=True)
        self.bsamp = TimedBatchSampler(sampler, cfg["batch"])
        nw = cfg["workers_rank"]
        self.loader = tud.DataLoader(
            DecodeDataset(), batch_sampler=self.bsamp, num_workers=nw,
            collate_fn=collate, timeout=cfg["batch_timeout"],
            prefetch_factor=max(1, -(-cfg["prefetch"] // nw)),
            multiprocessing_context="fork")
        self.it = iter(self.loader)

    def next(self):
        b = next(self.it)
        ids = b["ids"].tolist()
        req = self.bsamp.req.pop(tuple(ids), None)
        ready = (b["ready_t"] - req) * 1e3 if req is not None else None
        tokens = [self.rows[i]["est_tokens"] for i in ids]
        return b, ids, tokens, ready, 0

    def close(self):
        self.it = None
        self.loader = None


class DaskSource:
    """dask-pool: per-sample tasks on a shared Dask LocalCluster, kept
    `prefetch` batches ahead; this rank's samples from a random split."""

    def __init__(self, cfg, rows):
        import collections
        import threading

        import torch
        import torch.utils.data as tud
        from distributed import Client
        torch.set_num_threads(1)
        # By reference (datahelix_bench.sources.dask_decode): the workers
        # import it by that name.
        self.fn = dask_decode
        self.rows, self.cfg = rows, cfg
        self.client = Client(cfg["dask"], timeout=60, set_as_default=False)
        sampler = tud.distributed.DistributedSampler(
            range(len(rows)), num_replicas=cfg["world"], rank=cfg["rank"],
            shuffle=True, seed=cfg["seed"], drop_last=True)
        self.batches = iter(tud.BatchSampler(sampler, cfg["batch"],
                                             drop_last=True))
        self.q = collections.deque()
        self.lock = threading.Lock()
        for _ in range(cfg["prefetch"]):
            self._submit()

    def _submit(self):
        ids = next(self.batches, None)
        if ids is None:
            return
        T, (w, h) = self.cfg["frames"], self.cfg["size"]
        done = []
        futs = [self.client.submit(self.fn, self.rows[i]["path"], T, w, h,
                                   pure=False) for i in ids]
        t_req = time.time()

        def cb(_f):
            with self.lock:
                done.append(time.time())
        for f in futs:
            f.add_done_callback(cb)
        self.q.append((ids, futs, t_req, done))

    def next(self):
        import numpy as np
        import torch
        if not self.q:
            raise StopIteration
        ids, futs, t_req, done = self.q.popleft()
        raws = [f.result(timeout=self.cfg["batch_timeout"]) for f in futs]
        T, (w, h) = self.cfg["frames"], self.cfg["size"]
        v = torch.from_numpy(np.stack([np.frombuffer(r, np.uint8)
                                       for r in raws]))
        v = v.view(len(ids), T, h, w, 3)
        with self.lock:
            ready = ((max(done) - t_req) * 1e3
                     if len(done) == len(futs) else None)
        nbytes = sum(len(r) for r in raws)
        self._submit()
        tokens = [self.rows[i]["est_tokens"] for i in ids]
        return {"video": v}, ids, tokens, ready, nbytes

    def close(self):
        for _, futs, _, _ in self.q:
            for f in futs:
                f.cancel()
        self.q.clear()
        self.client.close(timeout=10)


class DatahelixSource:
    """dh-*: datahelix.DataLoader(ablation=rung) on this rank."""

    def __init__(self, cfg, rows):
        import torch
        torch.set_num_threads(1)
        import datahelix
        from .common import ablation_of
        tier2 = None
        if cfg["system"] == "dh-ddlb":  # the ladder's last rung
            tier2 = {"buffer_size": 4 * cfg["batch"],
                     "args": {"margin": 1.5}}
        self.loader = datahelix.DataLoader(
            cfg["index"], batch_size=cfg["batch"], frames=cfg["frames"],
            size=(cfg["size"][1], cfg["size"][0]),  # (H, W)
            rank=cfg["rank"],
            world_size=cfg["world"], coordinator=cfg["coordinator"],
            seed=cfg["seed"], workers=cfg["workers_rank"],
            timeout=cfg["batch_timeout"], telemetry=cfg["telemetry"],
            trace=cfg.get("trace"), ablation=ablation_of(cfg["system"]),
            load_balance=tier2,
            step_order=cfg.get("step_order", "alternate"),
            cache_dir=cfg.get("cache_dir"))
        self.it = iter(self.loader)

    def next(self):
        b = next(self.it)
        return b, b["ids"].tolist(), b["tokens"].tolist(), None, 0

    def close(self):
        self.stats = self.loader.stats()
        self.it = None
        self.loader.close()


def dask_available():
    try:
        import distributed  # noqa: F401
        return None
    except ImportError as e:
        return (f"python3-distributed is not importable ({e}); "
                "install it with scripts/setup-deps.sh bench")
