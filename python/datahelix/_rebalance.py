"""Tier-2 rebalancing (DDLB) for DataLoader(load_balance=...): the round
buffer, the all-gather of features, the cost gate (the C code of
src/core/rebalance.c through _C.rebalance) and one all_to_all_single per
round (issue 17; paper Sec. 3.4-3.5; docs/rebalance.md "In the loader").

A round is the next R = buffer_size // batch_size batches of every rank of
a group (client_ranks).  Each rank computes its samples' features
(feature_fn; default: actual tokens from the decoded shape, and bytes),
all-gathers them with the group's measured per-token step time and
collective bandwidth, and every rank runs the same gate on the same
inputs, so all reach the same verdict with no further message.  When the
gate moves samples, each rank packs its outgoing ones per destination into
one buffer and one all_to_all_single completes the exchange; a sample never
leaves its step, so every step keeps its size and every sample of the
epoch is still yielded once.

Measured, not assumed: the per-token step time is the time the training
loop spends between next() calls over the tokens of that step's slowest
rank (the step waits for it; EWMA); the bandwidth and latency come from a
probe collective on the group before its first round, then from every
exchange (EWMA).  The first round has no step time yet: it is
"unmeasured" and kept.

Every collective runs on the group's own gloo process group created with
the loader's timeout (DistComm), or without a process group over the C
fallback, ZeroMQ on ipc:// (ZmqComm, datahelix/rb_link.h), bounded by the
same timeout: a rank that dies or stalls mid-exchange is a DataError on
every other rank of the group within that timeout, never a hang.
Thread-safety: one iterator at a time, like the loader.
"""
import array
import datetime
import json
import math
import os
import time

import torch

from . import _C

_KEYS = {"feature_fn", "sort_fn", "client_ranks", "buffer_size", "args"}
_ARGS = {"margin", "probe_bytes", "patch", "ewma"}
# per sample: tokens, bytes, step, id, estimated tokens, valid frames,
# measured prepare ms
_COLS = 7
# per rank: n samples, steps, ms_per_token, bytes_per_ms, latency_ms
_HEAD = 5
# an arena slot: its tensor's bytes and the decoder's padding
# (DH_MEDIA_DST_PAD), rounded up to the ring's alignment (DH_ARENA_ALIGN),
# as the client sizes its default arena
_SLOT_PAD, _SLOT_ALIGN = 64, 64


def held_steps(steps):
    """Steps of arena slots the round buffer may hold beyond the loader's
    prefetch, rounds of `steps`: a round, the next round's batch pulled
    early, and a slot the ring may lose to its wrap (the client's default
    arena adds two more: the user's batch and the one it holds while in
    next())."""
    return steps + 2


def check(cfg, batch_size, world_size):
    """The load_balance= dict, checked and completed (ValueError naming
    the key)."""
    if not isinstance(cfg, dict):
        raise ValueError("load_balance= must be a dict with keys "
                         f"{sorted(_KEYS)}, not {type(cfg).__name__}")
    bad = set(cfg) - _KEYS
    if bad:
        raise ValueError(f"load_balance: unknown key(s) {sorted(bad)}; "
                         f"known: {sorted(_KEYS)}")
    for k in ("feature_fn", "sort_fn"):
        if cfg.get(k) is not None and not callable(cfg[k]):
            raise ValueError(f"load_balance[{k!r}] must be callable")
    buf = cfg.get("buffer_size", 4 * batch_size)
    if not isinstance(buf, int) or buf < batch_size:
        raise ValueError(f"load_balance['buffer_size']={buf!r}: an int >= "
                         f"batch_size ({batch_size}), samples per rank in "
                         "a round")
    groups = cfg.get("client_ranks") or [list(range(world_size))]
    flat = sorted(r for g in groups for r in g)
    if flat != list(range(world_size)) or any(not g for g in groups):
        raise ValueError(f"load_balance['client_ranks']={groups!r}: "
                         "groups of ranks covering 0.."
                         f"{world_size - 1} once each")
    args = dict(cfg.get("args") or {})
    bad = set(args) - _ARGS
    if bad:
        raise ValueError(f"load_balance['args']: unknown key(s) "
                         f"{sorted(bad)}; known: {sorted(_ARGS)}")
    margin = float(args.get("margin", 1.5))
    if not margin >= 0:
        raise ValueError(f"load_balance['args']['margin']={margin}: >= 0")
    return {"feature_fn": cfg.get("feature_fn"),
            "sort_fn": cfg.get("sort_fn"), "groups": groups,
            "steps": buf // batch_size, "margin": margin,
            "probe_bytes": int(args.get("probe_bytes", 4 << 20)),
            "patch": int(args.get("patch", 16)),
            "ewma": float(args.get("ewma", 0.3)), "args": args}


def default_features(sample, patch):
    """Actual tokens (valid frames x patches per frame of the decoded
    shape) and bytes of one decoded sample."""
    v = sample["video"]
    h, w = (v.shape[1], v.shape[2]) if v.shape[-1] == 3 else \
        (v.shape[2], v.shape[3])
    per_frame = -(-h // patch) * -(-w // patch)
    return {"tokens": float(sample["valid_frames"] * per_frame)}


class Rebalancer:
    """One loader's Tier 2 (see the module's notes)."""

    def __init__(self, cfg, loader):
        import torch.distributed as dist
        self.cfg, self.loader = cfg, loader
        self.rank = loader.rank
        self.group = next(sorted(g) for g in cfg["groups"]
                          if self.rank in g)
        self.me = self.group.index(self.rank)
        if dist.is_available() and dist.is_initialized():
            self.comm = DistComm(dist, cfg["groups"], self.rank,
                                 max(1.0, loader.timeout or 60))
        else:  # the C fallback over ZeroMQ (rb_link.h)
            self.comm = ZmqComm(loader, self.group, self.me,
                                max(1.0, loader.timeout or 60))
        self.queue = []
        self.round = 0
        self.ms_per_token = 0.0
        self.bytes_per_ms = 0.0
        self.latency_ms = 0.0
        self.held = None  # (time the batch left next(), its tokens)
        self.error = None  # a step's DataError, raised after the round
        self.next_step = None  # the step after the last one yielded
        self.totals = {"rounds": 0, "move": 0, "keep": 0, "unmeasured": 0,
                       "balanced": 0, "uneven": 0, "gain_ms": 0.0,
                       "cost_ms": 0.0, "bytes_moved": 0, "bytes_in": 0,
                       "samples_moved": 0, "exchange_ms": 0.0}
        self.ratio = [0.0, 0.0]
        self.last = None
        self.log = []  # per round, oldest first: [round, verdict, moved]
        # the queued round, when the gate decided it: (its first step, the
        # group's gate inputs); None for a round the gate did not decide
        self.decided = None
        self.replay = None  # load_state_dict()'s: (inputs, first step)
        self.ahead = None  # the next round, pulled ahead (_begin)
        self.early = self._no_early()  # its batches pulled before that
        self.keep = None  # whether the pass's batches stay views (_hold)
        self.first_step, self.round_in = None, 0  # the round's, telemetry

    # -- the training loop's clock ----------------------------------------

    def _step_time(self):
        """The training step that just ended: its ms per token."""
        if self.held is None:
            return
        t0, tokens = self.held
        self.held = None
        if tokens > 0:
            v = (time.perf_counter() - t0) * 1e3 / tokens
            a = self.cfg["ewma"]
            self.ms_per_token = v if self.ms_per_token == 0 else \
                (1 - a) * self.ms_per_token + a * v

    def next(self, pull):
        """The next batch: from the queue, or a new round from pull()
        (the loader's own next(); StopIteration at the end)."""
        self._step_time()
        while not self.queue:
            if self.error is not None:  # raised at its step, in order
                e, self.error = self.error, None
                raise e
            if not self._round(pull):
                raise StopIteration
        b, tokens = self.queue.pop(0)
        self.next_step = b["step"] + 1
        e = self.early
        if self.queue and not e["end"] and e["error"] is None and \
                len(e["batches"]) < self.cfg["steps"] - 1:
            # one batch of the next round per step of this one (it was
            # requested a round ahead), so that the round's last step has
            # one pull left to pay, not a round's (bench_tier2.py)
            self._pull_one(pull, e)
        if not self.queue and self.error is None:
            # The next round's batches are pulled and its all-gather set
            # off now, so that the collective runs while the user trains
            # on this last batch of the round (on a loaded 2-core host it
            # took 7-15 ms at the round's first step: bench_tier2.py)
            try:
                self.ahead = self._begin(pull)
            except _C.DataError as e:  # raised at the round's first step
                self.ahead = {"raise": e}
        self.held = (time.perf_counter(), tokens)
        return b

    def holds(self):
        """Whether batches pulled (or a round pulled ahead) are left."""
        return bool(self.queue) or self.ahead is not None

    def pending_step(self):
        """The first step pulled but not yielded (None: none)."""
        if self.queue:
            return self.queue[0][0]["step"]
        if self.ahead and self.ahead.get("batches"):
            return self.ahead["batches"][0]["step"]
        return None

    def state(self):
        """state_dict()["tier2"]: what the resumed run needs to decide as
        this one did: the round in progress (its number, first step and
        the group's gate inputs it was decided on) and this rank's
        running estimates."""
        busy = bool(self.queue)
        d = self.decided if busy else None
        # a round pulled ahead is undecided: the resumed run forms it
        # again from its first step, on the same estimates (they change
        # only once the step it was pulled at has ended)
        ahead = self.ahead is not None
        return {"round": self.round if busy or ahead else self.round + 1,
                "round_step": d[0] if d else None,
                "inputs": list(d[1]) if d else None,
                "estimates": [self.ms_per_token, self.bytes_per_ms,
                              self.latency_ms]}

    def resume(self, st):
        """Continues from state(): the interrupted round is formed again
        from its first step and decided on its saved inputs (the same
        verdict and moves), then its already yielded steps are dropped."""
        self.round = int(st["round"]) - 1
        self.ms_per_token, self.bytes_per_ms, self.latency_ms = \
            (float(v) for v in st["estimates"])
        if st.get("inputs") is not None:
            self.replay = (list(st["inputs"]), int(st["skip_to"]))

    def reset(self):
        """A new pass: nothing buffered, the step clock stopped."""
        self._drop_ahead()
        self.queue, self.held, self.next_step = [], None, None
        self.error = None
        self.early = self._no_early()
        self.keep = None

    def _drop_ahead(self):
        """A round pulled ahead that will not be used (the pass ended at
        its step count, or was left): its all-gather is waited for (every
        rank of the group set it off), its errors dropped."""
        a, self.ahead = self.ahead, None
        if a is not None:  # a round never formed: not counted
            self.round -= 1
        if a and a.get("wait"):
            try:
                a["wait"]()
            except (RuntimeError, _C.DataError):
                pass

    # -- one round ----------------------------------------------------------

    @staticmethod
    def _no_early():
        """The next round's batches pulled while this one is yielded: the
        batches, the error that ended them, whether the pass's end did."""
        return {"batches": [], "error": None, "end": False}

    def _pull_one(self, pull, into):
        """One batch into `into` (_no_early's shape), or its end."""
        try:
            b = pull()
        except StopIteration:
            into["end"] = True
            return
        except _C.DataError as e:  # the round ends here ("uneven")
            into["error"] = e
            return
        self._hold(b)
        into["batches"].append(b)

    def _hold(self, b):
        """Keeps the batch's arena slot (zero copy: the user gets the
        arena's memory, moved samples written into it) when the arena has
        room for everything the buffer may hold beside the loader's
        prefetch; else every batch of the pass is a copy (its slot goes
        back at once), or the server would wait for room only the buffer
        can free (ArenaExhausted).  All or none, decided at a pass's
        first batch: the arena is a ring, so a slot held blocks the
        reuse of every slot after it, copied or not.  The default arena
        has that room (client option `held`); a smaller arena_mb= or a
        round longer than `held` can hold gets copies."""
        v = b["video"]
        if v is None or not len(v) or not self.loader._arena_views():
            return
        if self.keep is None:
            # a full step's slot (the pass may start at a short one)
            nb = v[0].numel() * v.element_size() * \
                self.loader.batch_size + _SLOT_PAD
            nb = -(-nb // _SLOT_ALIGN) * _SLOT_ALIGN
            cap = self.loader._client.stats()["arena_bytes"]
            # what the client's default arena makes room for
            need = (held_steps(self.cfg["steps"]) + self.loader.prefetch +
                    2) * nb
            self.keep = need <= cap
        if not self.keep:
            b["video"] = v.clone()

    def _pull(self, pull):
        """The round's batches (those pulled early first) and the error
        that ended it early (raised at its step, after them), or None."""
        e, self.early = self.early, self._no_early()
        while not e["end"] and e["error"] is None and \
                len(e["batches"]) < self.cfg["steps"]:
            self._pull_one(pull, e)
        return e["batches"], e["error"]

    def _samples(self, batches):
        """This rank's samples of the round and their feature rows."""
        fn, patch = self.cfg["feature_fn"], self.cfg["patch"]
        samples, rows = [], []
        for t, b in enumerate(batches):
            for p in range(len(b["ids"])):
                s = {"video": b["video"][p],
                     "valid_frames": int(b["valid_frames"][p]),
                     "id": int(b["ids"][p]), "tokens": int(b["tokens"][p]),
                     "text": b["text"][p], "step": t,
                     "sample_ms": float(b["sample_ms"][p])}
                f = fn(s) if fn is not None else default_features(s, patch)
                tok = float(f["tokens"])
                if not tok >= 0:
                    raise ValueError(f"load_balance feature_fn: sample "
                                     f"{s['id']}: tokens={tok!r} (a number "
                                     ">= 0 expected)")
                nb = s["video"].numel() * s["video"].element_size()
                samples.append(s)
                rows.append([tok, float(nb), float(t), float(s["id"]),
                             float(s["tokens"]), float(s["valid_frames"]),
                             s["sample_ms"]])
        return samples, rows

    def _gather(self, rows, steps):
        """Sets off the all-gather of every group rank's header and rows;
        returns the function that waits for them (float64 tensors)."""
        cap = self.cfg["steps"] * self.loader.batch_size
        t = torch.zeros(_HEAD + cap * _COLS, dtype=torch.float64)
        t[:_HEAD] = torch.tensor([len(rows), steps, self.ms_per_token,
                                  self.bytes_per_ms, self.latency_ms],
                                 dtype=torch.float64)
        if rows:
            t[_HEAD:_HEAD + len(rows) * _COLS] = torch.tensor(
                rows, dtype=torch.float64).reshape(-1)
        what = "all-gather of features"
        wait = self._collective(what, lambda: self.comm.gather_async(t))
        rnd = self.round
        return lambda: self._collective(what, wait, rnd)

    def _collective(self, what, fn, rnd=None):
        try:
            return fn()
        except (RuntimeError, _C.DataError) as e:
            raise _C.DataError(
                f"rank {self.rank}: Tier-2 {what} of round "
                f"{self.round if rnd is None else rnd} "
                f"(group {self.group}) failed: {e}".strip()) from None

    def _probe(self):
        """The group's collective, measured: latency from 1-byte exchanges,
        bandwidth from probe_bytes per peer."""
        n = len(self.group)

        def a2a(per):
            s = torch.zeros(per * (n - 1), dtype=torch.uint8)
            r = torch.empty_like(s)
            t0 = time.perf_counter()
            self._collective("bandwidth probe", lambda: self.comm.a2a(
                r, s, [per * (j != self.me) for j in range(n)],
                [per * (j != self.me) for j in range(n)]))
            return (time.perf_counter() - t0) * 1e3
        small = min(a2a(1) for _ in range(3))
        per = max(1, self.cfg["probe_bytes"])
        big = min(a2a(per) for _ in range(2))
        self.latency_ms = small
        self.bytes_per_ms = per * (n - 1) / max(big - small, 1e-3)

    def _begin(self, pull):
        """A round's first half: its batches pulled, its features made and
        (more than one rank) their all-gather set off; _round ends it."""
        self.round += 1  # the round in progress, in messages
        if self.bytes_per_ms == 0 and len(self.group) > 1:
            self._probe()
        batches, error = self._pull(pull)
        samples, rows = self._samples(batches)
        r = {"batches": batches, "error": error, "samples": samples,
             "rows": rows, "wait": None}
        if len(self.group) > 1:
            r["wait"] = self._gather(rows, len(batches))
        return r

    def _round(self, pull):
        """Fills the queue with one round (the one pulled ahead, if any);
        False when every rank of the group is out of batches."""
        r, self.ahead = self.ahead, None
        if r is not None and "raise" in r:
            raise r["raise"]
        if r is None:
            r = self._begin(pull)
        self.decided = None
        ok = self._decide_round(r)
        if r["error"] is not None:  # raised once the round's are yielded
            self.error = r["error"]
        return ok

    def _decide_round(self, r):
        batches, samples, rows = r["batches"], r["samples"], r["rows"]
        # the round's telemetry record (_telemetry)
        self.first_step = batches[0]["step"] if batches else None
        self.round_in = 0
        if len(self.group) == 1:
            if not batches:
                self.round -= 1
                return False
            self._account({"verdict": "balanced"}, 0.0)
            self._queue(batches, rows)
            return True
        got = r["wait"]()
        heads = [g[:_HEAD].tolist() for g in got]
        steps = [int(h[1]) for h in heads]
        if not any(steps):
            self.round -= 1  # no round: every rank is done
            return False
        if len(set(steps)) > 1:  # the epoch's partial end: keep
            self._account({"verdict": "uneven"}, 0.0)
            self._queue(batches, rows)
            return True
        feats = self._features(got, heads)
        # a resumed round is decided on the inputs it was decided on
        replay, self.replay = self.replay, None
        inputs = replay[0] if replay else self._gate_inputs(heads)
        self.decided = (batches[0]["step"], inputs)
        d = self._decide(feats, nsteps=steps[0], inputs=inputs)
        dt = 0.0
        if d["verdict"] == "move":
            batches, rows, dt = self._exchange(batches, samples, rows, feats,
                                               d)
        self._account(d, dt)
        self._queue(batches, rows, step_max(feats, d["to"], steps[0]),
                    skip=replay[1] if replay else None)
        return True

    def _features(self, got, heads):
        """[(group rank, row)] of the round, in the group's order."""
        feats = []
        for j, (g, h) in enumerate(zip(got, heads)):
            rows = g[_HEAD:_HEAD + int(h[0]) * _COLS].reshape(-1, _COLS)
            feats.extend((j, r) for r in rows.tolist())
        return feats

    @staticmethod
    def _gate_inputs(heads):
        """The group's ms per token, bandwidth and latency: the ranks'
        means, 0 until every rank has measured one."""
        def mean(k):
            v = [h[k] for h in heads if h[k] > 0]
            return sum(v) / len(v) if len(v) == len(heads) else 0.0
        return [mean(2), mean(3), mean(4)]

    def _decide(self, feats, nsteps, inputs):
        to = None
        if self.cfg["sort_fn"] is not None:
            view = [{"rank": j, "step": int(r[2]), "tokens": r[0],
                     "bytes": int(r[1]), "id": int(r[3]),
                     "est_tokens": int(r[4]), "frames": int(r[5]),
                     "sample_ms": r[6]} for j, r in feats]
            prop = self.cfg["sort_fn"](view, self.cfg["args"])
            if prop is not None:
                prop = list(prop)
                if len(prop) != len(feats):
                    raise ValueError(f"load_balance sort_fn returned "
                                     f"{len(prop)} ranks for "
                                     f"{len(feats)} samples")
                to = array.array("I", prop).tobytes()
        return _C.rebalance(
            array.array("d", [r[0] for _, r in feats]).tobytes(),
            array.array("Q", [int(r[1]) for _, r in feats]).tobytes(),
            array.array("I", [j for j, _ in feats]).tobytes(),
            array.array("I", [int(r[2]) for _, r in feats]).tobytes(),
            len(self.group), nsteps, *inputs,
            self.cfg["margin"], to)

    def _exchange(self, batches, samples, rows, feats, d):
        """One all_to_all_single: this rank's new batches and rows."""
        n, me = len(self.group), self.me
        to = array.array("I", d["to"])
        split = array.array("Q", d["split"])
        mine = [i for i, (j, _) in enumerate(feats) if j == me]
        first = mine[0] if mine else 0
        out = sorted((to[i], i) for i in mine if to[i] != me)
        inc = sorted((j, i) for i, (j, _) in enumerate(feats)
                     if to[i] == me and j != me)
        flat = [samples[i - first]["video"].reshape(-1).view(torch.uint8)
                for _, i in out]
        send = torch.cat(flat) if flat else torch.empty(0, dtype=torch.uint8)
        recv = torch.empty(sum(split[s * n + me] for s in range(n)),
                           dtype=torch.uint8)
        t0 = time.perf_counter()
        self._collective("exchange", lambda: self.comm.a2a(
            recv, send, [split[s * n + me] for s in range(n)],  # in
            [split[me * n + x] for x in range(n)]))  # out
        dt = (time.perf_counter() - t0) * 1e3
        self.round_in = recv.numel()
        self.totals["bytes_in"] += recv.numel()  # this rank's cross-DS
        self._measured(d["max_rank_bytes"], dt)
        like = samples[0]["video"] if samples else None
        got, off = {}, 0
        for _, i in inc:
            nb = int(feats[i][1][1])
            v = recv[off:off + nb]
            if like is not None:
                v = v.view(like.dtype).reshape(like.shape)
            got[i] = v
            off += nb
        return self._rebuild(batches, samples, feats, to, got, first), \
            None, dt

    def _measured(self, nbytes, ms):
        if nbytes <= 0 or ms <= self.latency_ms:
            return
        a = self.cfg["ewma"]
        bw = nbytes / (ms - self.latency_ms)
        self.bytes_per_ms = (1 - a) * self.bytes_per_ms + a * bw

    def _rebuild(self, batches, samples, feats, to, got, first):
        """The round's batches of this rank after the exchange, each in
        its own memory (the arena slot, when the buffer holds it): step t
        keeps the samples the gate left here in their positions, and its
        arrivals, in the group's order, take the positions of the ones
        that left (a step's count never changes: dh_rb_decide)."""
        me, out = self.me, []
        lo = self.loader
        mine = {}  # step -> this rank's samples there, by position
        for i in range(first, first + len(samples)):
            mine.setdefault(int(feats[i][1][2]), []).append(i)
        for t, b in enumerate(batches):
            own = mine.get(t, [])
            inc = [i for i, (j, r) in enumerate(feats)
                   if int(r[2]) == t and to[i] == me and j != me]
            gone = [p for p, i in enumerate(own) if to[i] != me]
            if len(gone) != len(inc):
                raise _C.DataError(
                    f"rank {self.rank}: Tier-2 round {self.round} step "
                    f"{b['step']}: {len(gone)} samples left and "
                    f"{len(inc)} arrived (a step keeps its count)")
            idx = list(own)
            v = b["video"]
            for p, i in zip(gone, inc):
                v[p].copy_(got[i])  # lands in the slot itself
                idx[p] = i
            ids = [int(feats[i][1][3]) for i in idx]
            nb = dict(b)
            nb["ids"] = torch.tensor(ids, dtype=torch.int64)
            nb["tokens"] = torch.tensor([int(feats[i][1][4]) for i in idx],
                                        dtype=torch.int64)
            nb["valid_frames"] = torch.tensor(
                [int(feats[i][1][5]) for i in idx], dtype=torch.int32)
            nb["sample_ms"] = torch.tensor([feats[i][1][6] for i in idx],
                                           dtype=torch.float32)
            nb["text"] = [lo._index.text(i) for i in ids]
            nb["substituted"] = [x for x in b["substituted"]
                                 if x["substitute_id"] in ids]
            out.append(nb)
        return out

    def _queue(self, batches, rows, maxes=None, skip=None):
        """Queues the round's batches, each with the tokens its step time
        is divided by: the step's slowest rank's (maxes, when the group's
        features are known: the step waits for that rank), else this
        rank's own; a replayed round's steps before `skip` were yielded
        before the resume."""
        if maxes is not None:
            for t, b in enumerate(batches):
                if skip is None or b["step"] >= skip:  # yielded before
                    self.queue.append((b, maxes[t]))
            return
        per = {}
        for r in rows:
            per[int(r[2])] = per.get(int(r[2]), 0.0) + r[0]
        for t, b in enumerate(batches):
            self.queue.append((b, per.get(t, 0.0)))

    def _account(self, d, dt):
        v = d["verdict"]
        self.log.append([self.round, v, d.get("moved", 0)
                         if v == "move" else 0])
        s = self.totals
        s["rounds"] += 1
        s[v] += 1
        s["gain_ms"] += d.get("gain_ms", 0.0)
        s["cost_ms"] += d.get("cost_ms", 0.0)
        if v == "move":
            s["bytes_moved"] += d["moved_bytes"]
            s["samples_moved"] += d["moved"]
            s["exchange_ms"] += dt
        rb = d.get("ratio_before", 1.0)
        self.ratio[0] += rb
        self.ratio[1] += d.get("ratio_after", rb) if v == "move" else rb
        self.last = {"round": self.round, "verdict": v,
                     "gain_ms": d.get("gain_ms", 0.0),
                     "cost_ms": d.get("cost_ms", 0.0),
                     "bandwidth_bytes_per_ms": self.bytes_per_ms,
                     "latency_ms": self.latency_ms,
                     "ms_per_token": self.ms_per_token,
                     "bytes_moved": d.get("moved_bytes", 0)
                     if v == "move" else 0,
                     "max_mean_before": rb,
                     "max_mean_after": d.get("ratio_after", rb)
                     if v == "move" else rb,
                     "exchange_ms": dt}
        self._telemetry(d)

    def _telemetry(self, d):
        """One record per round in the loader's telemetry file, beside
        its per-step ones: the gate's inputs and what it decided
        (docs/rebalance.md "Telemetry").  The file is the client's, opened
        for append: one write per record keeps lines whole."""
        path = self.loader.telemetry
        if not path:
            return
        rec = dict(self.last, tier2_round=self.round, rank=self.rank,
                   group=self.group, epoch=self.loader._epoch,
                   first_step=self.first_step,
                   samples_moved=d.get("moved", 0)
                   if d["verdict"] == "move" else 0,
                   bytes_in=self.round_in)
        del rec["round"]
        for k, v in rec.items():  # JSON has no inf / nan
            if isinstance(v, float) and not math.isfinite(v):
                rec[k] = None
        line = (json.dumps(rec) + "\n").encode()
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT |
                     os.O_CLOEXEC, 0o644)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)

    def close(self):
        self._drop_ahead()
        self.comm.close()

    def stats(self):
        """stats()["tier2"]: sums over the rounds, the means of the
        max/mean token ratios, and the last round's gate inputs."""
        s = dict(self.totals)
        n = max(1, s["rounds"])
        s["max_mean_before"] = self.ratio[0] / n
        s["max_mean_after"] = self.ratio[1] / n
        s["bandwidth_bytes_per_ms"] = self.bytes_per_ms
        s["latency_ms"] = self.latency_ms
        s["ms_per_token"] = self.ms_per_token
        s["group"] = list(self.group)
        s["last"] = self.last
        s["verdicts"] = [x[1] for x in self.log]
        s["log"] = [list(x) for x in self.log]
        return s


def step_max(feats, to, nsteps):
    """Per step of the round, the most tokens one rank holds there under
    the final assignment `to` (uint32 bytes)."""
    ranks = array.array("I", to)
    load = {}
    for i, (_, r) in enumerate(feats):
        k = (int(r[2]), ranks[i])
        load[k] = load.get(k, 0.0) + r[0]
    out = [0.0] * nsteps
    for (t, _), v in load.items():
        out[t] = max(out[t], v)
    return out


class DistComm:
    """The group's collectives on its own gloo process group (every rank
    creates every group's, in order, with the loader's timeout)."""

    def __init__(self, dist, groups, rank, timeout_s):
        self.dist, self.pg, self.n = dist, None, 0
        td = datetime.timedelta(seconds=timeout_s)
        for g in groups:
            pg = dist.new_group(sorted(g), timeout=td, backend="gloo")
            if rank in g:
                self.pg, self.n = pg, len(g)

    def gather_async(self, t):
        """The all-gather set off; returns the function that waits for it
        (within the group's timeout) and returns its tensors."""
        got = [torch.empty_like(t) for _ in range(self.n)]
        work = self.dist.all_gather(got, t, group=self.pg, async_op=True)

        def wait():
            work.wait()
            return got
        return wait

    def a2a(self, recv, send, in_split, out_split):
        self.dist.all_to_all_single(recv, send, in_split, out_split,
                                    group=self.pg)

    def close(self):
        pass


class ZmqComm:
    """The same collectives over _C.RbLink (ZeroMQ PUSH/PULL on ipc://,
    datahelix/rb_link.h) when there is no process group: each rank binds
    a socket in a private folder and learns the others' through the job's
    rendezvous store (torchrun's agent store, as the job key is shared)."""

    def __init__(self, loader, group, me, timeout_s):
        import shutil
        import tempfile
        from datetime import timedelta
        from ._jobkey import STORE_TIMEOUT_S, _store
        store = _store(loader.world_size) if len(group) > 1 else None
        if store is None and len(group) > 1:
            raise NotImplementedError(
                "load_balance= without a torch.distributed process group "
                "needs the job's rendezvous store to find the other ranks "
                "(run under torchrun, or call torch.distributed."
                "init_process_group); none here")
        self.timeout_ms = int(timeout_s * 1000)
        self.round, self.n, self.me = 0, len(group), me
        self.dir = tempfile.mkdtemp(prefix="datahelix-rb-")
        self._rm = shutil.rmtree
        mine = f"ipc://{self.dir}/rb.sock"
        addrs = [mine] * self.n
        if store is not None:
            key = f"datahelix/rb/{loader._ordinal}/{loader._pass}"
            store.set(f"{key}/{group[me]}", mine)
            names = [f"{key}/{r}" for r in group]
            store.wait(names, timedelta(seconds=min(timeout_s,
                                                    STORE_TIMEOUT_S)))
            addrs = [store.get(k).decode() for k in names]
        self.link = _C.RbLink(addrs, me)

    def _exchange(self, send, out_split, in_split):
        self.round += 1
        return self.link.exchange(self.round, send, list(out_split),
                                  list(in_split), self.timeout_ms)

    def gather(self, t):
        b = t.numpy().tobytes()
        split = [len(b) * (j != self.me) for j in range(self.n)]
        data = self._exchange(b * (self.n - 1), split, split)
        out, off = [], 0
        for j in range(self.n):
            if j == self.me:
                out.append(t)
                continue
            out.append(torch.frombuffer(bytearray(data[off:off + len(b)]),
                                        dtype=t.dtype))
            off += len(b)
        return out

    def gather_async(self, t):
        got = self.gather(t)  # rb_link's exchange is synchronous
        return lambda: got

    def a2a(self, recv, send, in_split, out_split):
        data = self._exchange(send.numpy(), out_split, in_split)
        if data:
            recv.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))

    def close(self):
        if self.link is not None:
            self.link.close()
            self.link = None
        self._rm(self.dir, ignore_errors=True)
