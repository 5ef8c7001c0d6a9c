"""Compose a plan's iteration time and per-GPU memory from per-layer costs.

Both estimators feed this one composition: the analytical model (FLOPs on a
roofline) and the profiler (measured per-layer times). Everything per layer is
already for the plan's tp degree and micro-batch size.

Timeline model (1F1B, uniform dp x tp per stage): stage k spends
T_k = sum(fwd + bwd + tp collectives of its layers) + its outgoing p2p + a fixed
per-micro-batch cost (dispatch, send/recv synchronisation) per micro-batch; it runs m micro-batches plus a bubble of (pp-1) micro-batch slots,
then all-reduces its gradients across dp. The iteration ends when the slowest
stage has finished:

    iter = max_k [ (m + pp - 1) * T_k + AR_k + OPT_k ]

`split_many` finds the contiguous layer split that minimizes this under the
memory limit exactly (min-max dynamic program over prefixes), for a whole stack
of candidate plans at once (numpy over candidates x split points); `split_stages`
is the same for one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np


@dataclass(frozen=True)
class LayerCosts:
    """Per-layer costs of one (model, batch, GPU, shape, dp, tp, micro-batches, recompute) choice, or of a
    stack of such choices: every array then has a leading candidate axis, (candidates, layers)."""

    step_s: np.ndarray  # fwd + bwd (+ recompute fwd) + tp collectives, one micro-batch
    p2p_s: np.ndarray  # sending this layer's output to the next stage, fwd + bwd, one micro-batch
    allreduce_s: np.ndarray  # dp gradient all-reduce of this layer's parameters (what is not hidden)
    optim_s: np.ndarray  # optimizer update of this layer's shard
    static_bytes: np.ndarray  # weights + grads + optimizer state on one GPU
    act_bytes: np.ndarray  # activations kept per in-flight micro-batch on one GPU
    peak_bytes: np.ndarray  # transient working memory while this layer runs (recompute, logits)
    stage_s: float | np.ndarray = 0.0  # paid once per stage and step whatever its layers: the optimizer step call
    # paid by every stage in every micro-batch slot whatever its layers: the pipeline's per-micro-batch
    # dispatch and send/recv synchronisation (calibrated: `CostParams.microbatch_overhead_s`)
    microbatch_s: float | np.ndarray = 0.0

    @property
    def num_layers(self) -> int:
        return self.step_s.shape[-1]


# per-candidate scalars of LayerCosts (every other field is per layer)
SCALAR_FIELDS = ("stage_s", "microbatch_s")


def stack(costs: Sequence[LayerCosts]) -> LayerCosts:
    """One stack of candidates from single ones or stacks of them (all with the same layers)."""
    costs = [_stacked(c) for c in costs]
    if len(costs) == 1:
        return costs[0]
    return LayerCosts(**{f: np.concatenate([getattr(c, f) for c in costs]) for f in LayerCosts.__dataclass_fields__
                         if f not in SCALAR_FIELDS},
                      **{f: np.concatenate([_per_candidate(c, f) for c in costs]) for f in SCALAR_FIELDS})


def take(lc: LayerCosts, rows) -> LayerCosts:
    """Candidates `rows` of a stack (an index array or a slice: a stack; one index: a single candidate)."""
    return LayerCosts(**{f: getattr(lc, f)[rows] for f in LayerCosts.__dataclass_fields__ if f not in SCALAR_FIELDS},
                      **{f: _per_candidate(lc, f)[rows] for f in SCALAR_FIELDS})


def _per_candidate(lc: LayerCosts, f: str) -> np.ndarray:
    """A scalar field of a stack, one value per candidate."""
    return np.broadcast_to(np.asarray(getattr(lc, f), dtype=float), lc.step_s.shape[:1])


@dataclass(frozen=True)
class StageSplit:
    stages: list[tuple[int, int]]
    iter_time_s: float
    stage_time_s: list[float]  # T_k
    mem_bytes: list[float]  # per GPU, per stage


@dataclass(frozen=True)
class Splits:
    """The best split of every candidate of a stack (rows where `feasible` is False hold no split)."""

    feasible: np.ndarray  # (C,) bool
    bounds: np.ndarray  # (C, pp + 1) layer boundaries: stage k is [bounds[k], bounds[k + 1])
    iter_time_s: np.ndarray  # (C,)
    stage_time_s: np.ndarray  # (C, pp) T_k
    mem_bytes: np.ndarray  # (C, pp) per GPU

    def split(self, c: int) -> StageSplit | None:
        if not self.feasible[c]:
            return None
        b = [int(x) for x in self.bounds[c]]
        return StageSplit([(b[k], b[k + 1]) for k in range(len(b) - 1)], float(self.iter_time_s[c]),
                          [float(x) for x in self.stage_time_s[c]], [float(x) for x in self.mem_bytes[c]])


def _prefix(x: np.ndarray) -> np.ndarray:
    out = np.zeros(x.shape[:-1] + (x.shape[-1] + 1,))
    np.cumsum(x, axis=-1, out=out[..., 1:])
    return out


def _stacked(lc: LayerCosts) -> LayerCosts:
    """A stack of one from a single candidate (a stack is returned as it is)."""
    if lc.step_s.ndim == 2:
        return lc
    fields = {f: getattr(lc, f)[None] for f in LayerCosts.__dataclass_fields__ if f not in SCALAR_FIELDS}
    return LayerCosts(**fields, **{f: np.array([float(getattr(lc, f))]) for f in SCALAR_FIELDS})


class _Segments:
    """Sums over segments [j, i) of layers, for every candidate of a stack, from prefix sums: a row
    (segments starting at layer 0), a column (segments ending at the last layer) or the full
    (C, L+1, L+1) arrays (only pipelines of 3+ stages need them); invalid segments (i <= j) cost +inf."""

    def __init__(self, lc: LayerCosts, pp: int, m: np.ndarray):
        c, n = lc.step_s.shape
        self.n, self.pp = n, pp
        self.slots = (m + (pp - 1)).reshape(c, 1)  # micro-batch slots of a stage, bubble included
        self.m = m.reshape(c, 1)
        self.S = _prefix(lc.step_s)
        self.AR = _prefix(lc.allreduce_s)
        self.OPT = _prefix(lc.optim_s)
        self.ST = _prefix(lc.static_bytes)
        self.ACT = _prefix(lc.act_bytes)
        self.stage_s = np.broadcast_to(np.asarray(lc.stage_s, dtype=float), (c,)).reshape(c, 1)
        self.mb = np.broadcast_to(np.asarray(lc.microbatch_s, dtype=float), (c,)).reshape(c, 1)
        self.p2p_end = np.concatenate([np.zeros((c, 1)), lc.p2p_s], axis=1)  # sent by a segment ending at i
        self.peak = lc.peak_bytes
        # no layer has transient memory (plans without recomputation): every segment's running max is 0,
        # and adding 0.0 changes no sum, so the (C, L, L) running maxima are skipped (same bits)
        self.no_peak = not np.any(self.peak > 0)

    def _terms(self, k, d, end, peak, memory=True):
        """(T, cost, memory) of stage k over some segments: d maps prefix arrays to their segment sums, end
        picks each segment's last layer (its p2p), peak is their transient memory."""
        t = d(self.S)
        t = t + (self.mb if t.ndim == 2 else self.mb[:, :, None])
        if k < self.pp - 1:
            t = t + end(self.p2p_end)
        slots = self.slots if t.ndim == 2 else self.slots[:, :, None]
        stage = self.stage_s if t.ndim == 2 else self.stage_s[:, :, None]
        cost = slots * t + (d(self.AR) + d(self.OPT) + stage)
        if not memory:
            return t, cost, None
        inflight = np.minimum(self.m, self.pp - k)
        if t.ndim == 3:
            inflight = inflight[:, :, None]
        mem = d(self.ST) + inflight * d(self.ACT) + peak
        return t, cost, mem

    def row(self, k: int):
        """Stage k over [0, i) for every i (i = 0 is empty: +inf)."""
        run = np.maximum(np.maximum.accumulate(np.concatenate([np.full((len(self.S), 1), -np.inf), self.peak],
                                                              axis=1), axis=1), 0.0)
        t, cost, mem = self._terms(k, lambda P: P - P[:, :1], lambda P: P, run)
        empty = np.zeros(self.n + 1, dtype=bool)
        empty[0] = True
        return np.where(empty, np.inf, t), np.where(empty, np.inf, cost), np.where(empty, np.inf, mem)

    def col(self, k: int):
        """Stage k over [j, n) for every j (j = n is empty: +inf)."""
        rev = np.maximum.accumulate(self.peak[:, ::-1], axis=1)[:, ::-1]
        run = np.maximum(np.concatenate([rev, np.full((len(self.S), 1), -np.inf)], axis=1), 0.0)
        n = self.n
        t, cost, mem = self._terms(k, lambda P: P[:, n:] - P, lambda P: P[:, n:], run)
        empty = np.zeros(n + 1, dtype=bool)
        empty[n] = True
        return np.where(empty, np.inf, t), np.where(empty, np.inf, cost), np.where(empty, np.inf, mem)

    def full(self):
        """Middle-stage segments [j, i) as (C, L+1, L+1) arrays: cost (the same for every middle stage),
        static and activation bytes, transient memory (running max), and the validity mask."""
        n = self.n
        valid = (np.arange(n + 1)[None, :] > np.arange(n + 1)[:, None])[None]

        def seg(P):
            return P[:, None, :] - P[:, :, None]

        peak = np.where(valid, np.concatenate([np.zeros((len(self.S), 1)), self.peak], axis=1)[:, None, :], -np.inf)
        t, cost, _ = self._terms(0, seg, lambda P: P[:, None, :], None, memory=False)
        return valid, cost, seg(self.ST), seg(self.ACT), np.maximum(np.maximum.accumulate(peak, axis=2), 0.0)

    def first_fitting(self, cap: np.ndarray) -> np.ndarray:
        """(C, pp - 2, n - pp + 1): for middle stage k (k - 1 on axis 1) and each last layer i of its band
        (i = k + 1 + x, x on axis 2), the first j in [k, i) whose segment [j, i) fits in memory as stage k,
        i where none does; for stacks without negative bytes, where a segment's memory never grows as j
        moves right, so a bisection finds it. Each probe is the sum `split_many`'s memory test computes for
        that segment, the same operations in the same order, so it answers alike for every (j, i)."""
        c, pp, n = len(self.S), self.pp, self.n
        ks = np.arange(1, pp - 1)[:, None]
        i = ks + 1 + np.arange(n - pp + 1)[None, :]  # (K, W)
        a = np.broadcast_to(ks, (c, *i.shape)).copy()
        b = np.broadcast_to(i, (c, *i.shape)).copy()
        rows = np.arange(c)[:, None, None]
        st, act = self.ST[rows, i], self.ACT[rows, i]
        inflight = np.minimum(self.m[:, :, None], pp - ks)  # (C, K, 1)
        cap = cap.reshape(c, 1, 1)
        table = None if self.no_peak else self._peak_table()
        while True:
            open_ = a < b
            if not open_.any():
                return a
            mid = (a + b) // 2
            mem = inflight * (act - self.ACT[rows, mid])
            mem += st - self.ST[rows, mid]
            if table is not None:
                # max over the layers mid..i-1 from two entries of the table (mid = i only where the
                # bisection is closed: the probe is then unused)
                level = np.log2(np.maximum(i - mid, 1)).astype(int)
                mem += np.maximum(np.maximum(table[level, rows, mid],
                                             table[level, rows, np.maximum(i - (1 << level), mid)]), 0.0)
            fits = mem <= cap
            b = np.where(open_ & fits, mid, b)
            a = np.where(open_ & ~fits, mid + 1, a)

    def _peak_table(self) -> np.ndarray:
        """(levels, C, L): at level e and layer j, the largest transient memory of layers j..j+2^e-1 (cut
        at the last layer): the max over any range of layers from two entries."""
        levels = [self.peak]
        while (1 << len(levels)) <= self.n:
            prev, w = levels[-1], 1 << (len(levels) - 1)
            nxt = prev.copy()
            np.maximum(prev[:, :-w], prev[:, w:], out=nxt[:, :-w])
            levels.append(nxt)
        return np.stack(levels)

    def middle(self, memory: bool):
        """The segments [j, i) a middle stage can hold (1 <= j <= n - 2, 2 <= i <= n - 1) as (C, i, j)
        arrays, so that the DP's minimum over j runs along the last, contiguous axis: cost (the same for
        every middle stage; +inf where j >= i) and, with `memory`, static and activation bytes and
        transient memory (running max). The same sums as `full`, bit for bit."""
        n = self.n
        ii, jj = slice(2, n), slice(1, n - 1)
        valid = (np.arange(2, n)[:, None] > np.arange(1, n - 1)[None, :])[None]

        def seg(P):
            return P[:, ii, None] - P[:, None, jj]

        # `_terms`' cost, slots * (S + mb + p2p) + ((AR + OPT) + stage), in place: the same operations in
        # the same order (these arrays are the planner's largest, and fresh temporaries cost more than
        # the arithmetic)
        cost = seg(self.S)
        cost += self.mb[:, :, None]
        if self.pp > 1:
            cost += self.p2p_end[:, ii, None]
        cost *= self.slots[:, :, None]
        fixed = seg(self.AR)
        fixed += seg(self.OPT)
        fixed += self.stage_s[:, :, None]
        cost += fixed
        del fixed
        np.copyto(cost, np.inf, where=~valid)
        if not memory:
            return cost, None, None, None
        if self.no_peak:
            return cost, seg(self.ST), seg(self.ACT), None
        # max over the layers j..i-1: running max along j from i - 1 down
        layers = np.where(valid, self.peak[:, None, jj], -np.inf)
        peak = np.maximum(np.maximum.accumulate(layers[:, :, ::-1], axis=2)[:, :, ::-1], 0.0)
        return cost, seg(self.ST), seg(self.ACT), peak


# elements of one (candidates, L+1, L+1) middle-stage array: larger stacks are split in chunks of rows
_FULL_CHUNK = 1 << 18
# the narrowest middle-stage band (n - pp + 1 split points) where the bisection beats the memory arrays
# (cold medium round's stacks: 35 layers at pp 4 and 8 faster by 0-25%; 18 or 26 layers, or pp 16, slower)
_BISECT_BAND = 24


def split_many(lc: LayerCosts, pp: int, m, mem_cap_bytes) -> Splits:
    """Exact min-max contiguous split into pp stages with every stage within memory, for every candidate of
    a stack at once (`m` one micro-batch count per candidate, or one for all; `mem_cap_bytes` likewise, so
    grids of different GPUs share one call): the dynamic program over prefixes,
    f_k[i] = min_j max(f_{k-1}[j], cost_k[j, i]), on (candidates x split points) arrays.

    Stage 0 only starts at layer 0 and the last stage only ends at layer n, so they need one row and one
    column of segments; a middle stage k only the band of split points that leave every other stage a
    layer (k <= j < i <= n - (pp - 1 - k)). Outside it f is +inf, so the first minimum (the tie-break
    of the full DP) is the same.

    Rounding is monotone, so with no negative bytes a segment's memory only shrinks as its first layer j
    moves right: the middle-stage segments [j, i) that fit are those from the first fitting j on,
    bisected for the whole stack at once (`_Segments.first_fitting`) instead of (C, L, L) memory arrays
    in every chunk; the same sums, so the same result."""
    lc = _stacked(lc)
    c, n = lc.step_s.shape
    m = np.broadcast_to(np.asarray(m), (c,))
    caps = np.broadcast_to(np.asarray(mem_cap_bytes, dtype=float), (c,))
    first = None
    if 2 < pp and n - pp + 1 >= _BISECT_BAND and np.all(lc.static_bytes >= 0) and np.all(lc.act_bytes >= 0):
        s = _Segments(lc, pp, m)
        if not _roomy(lc, s, pp, caps):
            first = s.first_fitting(caps.reshape(c, 1))
    return _split_many(lc, pp, m, caps, first)


def _roomy(lc: LayerCosts, s: _Segments, pp: int, caps: np.ndarray) -> bool:
    """Every middle-stage segment of every candidate fits in memory: rounding is monotone, so with no
    negative bytes no segment needs more than the whole model with pp micro-batches in flight."""
    n = s.n
    return bool(np.all(lc.static_bytes >= 0) and np.all(lc.act_bytes >= 0) and np.all(
        s.ST[:, n] + np.minimum(s.m[:, 0], pp) * s.ACT[:, n] + np.maximum(s.peak.max(axis=1), 0.0) <= caps))


def _split_many(lc: LayerCosts, pp: int, m: np.ndarray, caps: np.ndarray, first: np.ndarray | None) -> Splits:
    """`split_many` of a stack (m, caps: one per candidate), `first` its `first_fitting` or None (then
    the memory test on every segment, unless every segment fits)."""
    c, n = lc.step_s.shape
    rows = np.arange(c)
    bounds = np.zeros((c, pp + 1), dtype=int)
    bounds[:, pp] = n
    if pp > n:
        empty = np.full((c, pp), np.inf)
        return Splits(np.zeros(c, dtype=bool), bounds, np.full(c, np.inf), empty, empty)
    chunk = max(1, _FULL_CHUNK // (n + 1) ** 2)
    if pp > 2 and c > chunk:  # every row is split on its own: chunks of rows give the same result
        parts = [_split_many(take(lc, slice(a, a + chunk)), pp, m[a:a + chunk], caps[a:a + chunk],
                             None if first is None else first[a:a + chunk]) for a in range(0, c, chunk)]
        return Splits(*(np.concatenate([getattr(p, f) for p in parts]) for f in Splits.__dataclass_fields__))
    cap = caps.reshape(c, 1)
    if pp > 2:
        fit = _fits(lc, pp, caps)
        if not fit.all():  # the DP only for candidates that some split fits in memory
            keep = np.flatnonzero(fit)
            out = Splits(np.zeros(c, dtype=bool), bounds, np.full(c, np.inf), np.full((c, pp), np.inf),
                         np.full((c, pp), np.inf))
            if len(keep):
                got = _split_many(take(lc, keep), pp, m[keep], caps[keep], None if first is None else first[keep])
                for f in Splits.__dataclass_fields__:
                    getattr(out, f)[keep] = getattr(got, f)
            return out
    s = _Segments(lc, pp, m)
    if pp == 1:
        t, cost, mem = (x[:, n] for x in s.row(0))
        return Splits(mem <= caps, bounds, np.where(mem <= caps, cost, np.inf), t[:, None], mem[:, None])
    _, cost0, mem0 = s.row(0)
    f = np.where(mem0 <= cap, cost0, np.inf)  # f[:, i] = best bottleneck for the first i layers in k+1 stages
    choice = {}
    if pp > 2:
        roomy = _roomy(lc, s, pp, caps)  # then the memory test is skipped (same result)
        cost, static, act, peak = s.middle(not roomy and first is None)
        for k in range(1, pp - 1):
            lo, hi = k, n - (pp - 1 - k)  # j in [lo, hi), i in (lo, hi]; middle()'s axes start at j = 1, i = 2
            band = (slice(None), slice(lo - 1, hi - 1), slice(lo - 1, hi - 1))
            seg = cost[band]
            cand = np.maximum(f[:, None, lo:hi], seg)  # [c, i, j]
            if first is not None and not roomy:
                np.copyto(cand, np.inf, where=np.arange(lo, hi)[None, None, :] < first[:, k - 1, :, None])
            elif not roomy:
                mem = np.minimum(s.m, pp - k)[:, :, None] * act[band]
                mem += static[band]  # static + inflight * act, as `_terms` sums it
                if peak is not None:
                    mem += peak[band]
                np.copyto(cand, np.inf, where=~(mem <= cap[:, :, None]))  # max(f, inf) = inf: as masking seg
                del mem
            arg = np.argmin(cand, axis=2)
            nf = np.full((c, n + 1), np.inf)
            nf[:, lo + 1:hi + 1] = np.take_along_axis(cand, arg[:, :, None], axis=2)[:, :, 0]
            f = nf
            full_arg = np.zeros((c, n + 1), dtype=int)
            full_arg[:, lo + 1:hi + 1] = arg + lo
            choice[k] = full_arg
    _, cost_n, mem_n = s.col(pp - 1)
    cand = np.maximum(f[:, pp - 1:n], np.where(mem_n[:, pp - 1:n] <= cap, cost_n[:, pp - 1:n], np.inf))
    arg = np.argmin(cand, axis=1)
    best = cand[rows, arg]
    bounds[:, pp - 1] = arg + (pp - 1)
    for k in range(pp - 2, 0, -1):
        bounds[:, k] = choice[k][rows, bounds[:, k + 1]]
    feasible = np.isfinite(best)
    times, mems = _stage_measures(s, bounds)
    return Splits(feasible, bounds, best, times, mems)


def may_fit(summed: np.ndarray, alone: np.ndarray, pp, caps) -> np.ndarray:
    """False where no split into pp stages can fit in memory (True: one may), for a stack whose stages hold
    at least the sum of `summed[c, l]` over their layers (non-negative bytes), and at least `alone[c, l]`
    for each of their layers: the largest stage holds 1/pp of the whole sum or more, and every layer lies
    in some stage. The DP's sums differ from these by rounding only, far inside the 1e-9 margin. `pp` and
    `caps`: one for all or one per candidate."""
    need = np.maximum(summed.sum(axis=1) / pp, alone.max(axis=1))
    return need <= np.asarray(caps) * (1 + 1e-9)


def _fits(lc: LayerCosts, pp: int, caps: np.ndarray) -> np.ndarray:
    """`may_fit` of a stack: every stage holds its layers' static and activation bytes at least once, and
    a layer's transient memory while it runs."""
    if np.any(lc.static_bytes < 0) or np.any(lc.act_bytes < 0):
        return np.ones(len(caps), dtype=bool)
    held = lc.static_bytes + lc.act_bytes
    return may_fit(held, held + np.maximum(lc.peak_bytes, 0.0), pp, caps)


def _stage_measures(s: _Segments, bounds: np.ndarray):
    """T_k and memory of each stage of the chosen splits (the same sums the DP compared), every stage at
    once: (C, pp) gathers instead of a pass per stage (the same operations, element for element)."""
    pp = bounds.shape[1] - 1
    a, b = bounds[:, :-1], bounds[:, 1:]

    def seg(P):
        return np.take_along_axis(P, b, axis=1) - np.take_along_axis(P, a, axis=1)

    times = seg(s.S) + s.mb
    times[:, :-1] += np.take_along_axis(s.p2p_end, b[:, :-1], axis=1)  # the last stage sends nothing on
    inflight = np.minimum(s.m, pp - np.arange(pp)[None, :])
    mems = seg(s.ST) + inflight * seg(s.ACT)
    if not s.no_peak:
        layer = np.arange(s.n)[None, None, :]
        inside = (layer >= a[:, :, None]) & (layer < b[:, :, None])
        mems += np.maximum(np.where(inside, s.peak[:, None, :], -np.inf).max(axis=2), 0.0)
    return times, mems


def split_stages(lc: LayerCosts, pp: int, m: int, mem_cap_bytes: float) -> StageSplit | None:
    """Exact min-max contiguous split of one candidate into pp stages with every stage within memory;
    None if none fits."""
    return split_many(lc, pp, np.array([m]), mem_cap_bytes).split(0)


def split_stages_shaped(options: Sequence[LayerCosts], allowed: Sequence[Sequence[int]], m: int,
                        mem_cap_bytes: float) -> tuple[StageSplit, list[int]] | None:
    """The exact min-max split where stage k also picks its own shape: `options[o]` are the per-layer
    costs under shape o (its dp x tp at micro-batch count m), `allowed[k]` the options stage k may use.
    A stage's choice does not constrain the others, so taking the cheapest memory-feasible allowed
    option per segment inside the DP is exact over all combinations. Returns (split, option per stage)."""
    pp, n = len(allowed), options[0].num_layers
    if pp > n:
        return None
    mats = [_shaped_matrices(lc, pp, m) for lc in options]

    def stage(k: int) -> tuple[np.ndarray, np.ndarray]:
        best = pick = None
        for o in allowed[k]:
            valid, cost, cost_last, static, act, peak = mats[o]
            c = cost_last if k == pp - 1 else cost
            ok = valid & (static + min(m, pp - k) * act + peak <= mem_cap_bytes)
            c = np.where(ok, c, np.inf)
            if best is None:
                best, pick = c, np.full(c.shape, o)
            else:
                better = c < best
                best, pick = np.where(better, c, best), np.where(better, o, pick)
        return best, pick

    c0, p0 = stage(0)
    f = c0[0]  # f[i] = best bottleneck for the first i layers in k+1 stages
    choice, picks = [np.zeros(n + 1, dtype=int)], [p0]
    cols = np.arange(n + 1)
    for k in range(1, pp):
        c, p = stage(k)
        cand = np.maximum(f[:, None], c)  # [j, i]
        arg = np.argmin(cand, axis=0)
        f = cand[arg, cols]
        choice.append(arg)
        picks.append(p)
    if not np.isfinite(f[n]):
        return None
    bounds = [n]
    for k in range(pp - 1, 0, -1):
        bounds.append(int(choice[k][bounds[-1]]))
    bounds.append(0)
    bounds.reverse()
    stages = [(bounds[k], bounds[k + 1]) for k in range(pp)]
    chosen = [int(picks[k][a, b]) for k, (a, b) in enumerate(stages)]
    return _evaluate([options[o] for o in chosen], stages, m), chosen


def _shaped_matrices(lc: LayerCosts, pp: int, m: int):
    """(valid, cost of a stage that sends on, cost of the last stage, static, activation, transient bytes)
    over every segment [j, i) of one candidate, as (L+1) x (L+1) arrays."""
    s = _Segments(_stacked(lc), pp, np.array([m]))
    valid, cost, static, act, peak = (x[0] for x in s.full())
    cost_last = cost - s.slots[0, 0] * s.p2p_end[0][None, :]  # the last stage sends no activations
    return valid, cost, cost_last, static, act, peak


def evaluate_split(lc: LayerCosts | Sequence[LayerCosts], stages: list[tuple[int, int]], m: int,
                   mats=None) -> StageSplit:
    """Iteration time and memory of a given split (the same formula the DP minimizes); `lc` one
    LayerCosts for every stage or one per stage (a per-stage plan).
    `mats` is accepted for backward compatibility and ignored: direct sums are cheaper."""
    lcs = list(lc) if isinstance(lc, (list, tuple)) else [lc] * len(stages)
    return _evaluate(lcs, list(stages), m)


def _evaluate(lcs: list[LayerCosts], stages: list[tuple[int, int]], m: int) -> StageSplit:
    pp = len(stages)
    costs, mems, times = [], [], []
    for k, (a, b) in enumerate(stages):
        lc = lcs[k]
        t = float(lc.step_s[a:b].sum()) + (float(lc.p2p_s[b - 1]) if k < pp - 1 else 0.0) + float(lc.microbatch_s)
        costs.append((m + pp - 1) * t + float(lc.allreduce_s[a:b].sum()) + float(lc.optim_s[a:b].sum())
                     + lc.stage_s)
        inflight = min(m, pp - k)
        mems.append(float(lc.static_bytes[a:b].sum()) + inflight * float(lc.act_bytes[a:b].sum())
                    + max(0.0, float(lc.peak_bytes[a:b].max())))
        times.append(t)
    return StageSplit(stages=stages, iter_time_s=max(costs), stage_time_s=times, mem_bytes=mems)
