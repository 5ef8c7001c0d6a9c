"""Compose a plan's iteration time and per-GPU memory from per-layer costs.

Both estimators feed this one composition: the analytical model (FLOPs on a
roofline) and the profiler (measured per-layer times). Everything per layer is
already for the plan's tp degree and micro-batch size.

Timeline model (1F1B, uniform dp x tp per stage): stage k spends
T_k = sum(fwd + bwd + tp collectives of its layers) + its outgoing p2p per
micro-batch; it runs m micro-batches plus a bubble of (pp-1) micro-batch slots,
then all-reduces its gradients across dp. The iteration ends when the slowest
stage has finished:

    iter = max_k [ (m + pp - 1) * T_k + AR_k + OPT_k ]

`split_stages` finds the contiguous layer split that minimizes this under the
memory limit exactly (min-max dynamic program over prefixes).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class LayerCosts:
    """Per-layer costs of one (model, batch, GPU, shape, dp, tp, micro-batches, recompute) choice."""

    step_s: np.ndarray  # fwd + bwd (+ recompute fwd) + tp collectives, one micro-batch
    p2p_s: np.ndarray  # sending this layer's output to the next stage, fwd + bwd, one micro-batch
    allreduce_s: np.ndarray  # dp gradient all-reduce of this layer's parameters (what is not hidden)
    optim_s: np.ndarray  # optimizer update of this layer's shard
    static_bytes: np.ndarray  # weights + grads + optimizer state on one GPU
    act_bytes: np.ndarray  # activations kept per in-flight micro-batch on one GPU
    peak_bytes: np.ndarray  # transient working memory while this layer runs (recompute, logits)
    stage_s: float = 0.0  # paid once per stage and step whatever its layers: the optimizer step call

    @property
    def num_layers(self) -> int:
        return len(self.step_s)


@dataclass(frozen=True)
class StageSplit:
    stages: list[tuple[int, int]]
    iter_time_s: float
    stage_time_s: list[float]  # T_k
    mem_bytes: list[float]  # per GPU, per stage


def _prefix(x: np.ndarray) -> np.ndarray:
    out = np.zeros(len(x) + 1)
    np.cumsum(x, out=out[1:])
    return out


class _Segments:
    """Sums over every segment [j, i) as (L+1) x (L+1) matrices; invalid segments (i <= j) are +inf.
    Only two cost matrices exist (the last stage sends no p2p) and memory differs per stage only by
    the number of micro-batches in flight, so stage matrices are formed on demand."""

    def __init__(self, lc: LayerCosts, pp: int, m: int):
        n = lc.num_layers
        j = np.arange(n + 1)[:, None]
        i = np.arange(n + 1)[None, :]
        self.valid = i > j
        self.pp, self.m = pp, m

        def seg(x: np.ndarray) -> np.ndarray:
            p = _prefix(x)
            return p[None, :] - p[:, None]

        step = seg(lc.step_s)
        tail = seg(lc.allreduce_s) + seg(lc.optim_s) + lc.stage_s
        p2p_last = np.concatenate([[0.0], lc.p2p_s])[None, :]  # output of the segment's last layer
        self.t_mid = np.where(self.valid, step + p2p_last, np.inf)
        self.t_last = np.where(self.valid, step, np.inf)
        self.cost_mid = (m + pp - 1) * self.t_mid + tail
        self.cost_last = (m + pp - 1) * self.t_last + tail
        self.static = seg(lc.static_bytes)
        self.act = seg(lc.act_bytes)
        # running max of transient memory from j to i - 1, one vectorized accumulate along rows
        peak = np.where(self.valid, np.concatenate([[0.0], lc.peak_bytes])[None, :], -np.inf)
        self.peak = np.maximum(np.maximum.accumulate(peak, axis=1), 0.0)

    def cost(self, k: int) -> np.ndarray:
        return self.cost_last if k == self.pp - 1 else self.cost_mid

    def time(self, k: int) -> np.ndarray:
        return self.t_last if k == self.pp - 1 else self.t_mid

    def mem(self, k: int) -> np.ndarray:
        inflight = min(self.m, self.pp - k)
        return np.where(self.valid, self.static + inflight * self.act + self.peak, np.inf)


def segment_matrices(lc: LayerCosts, pp: int, m: int):
    """(cost, memory, T) matrices over segments [j, i) for each stage index (invalid = +inf)."""
    s = _Segments(lc, pp, m)
    return [(s.cost(k), s.mem(k), s.time(k)) for k in range(pp)]


def split_stages(lc: LayerCosts, pp: int, m: int, mem_cap_bytes: float) -> StageSplit | None:
    """Exact min-max contiguous split into pp stages with every stage within memory; None if none fits."""
    n = lc.num_layers
    if pp > n:
        return None
    s = _Segments(lc, pp, m)
    # f[i] = best bottleneck for the first i layers in k+1 stages
    f = np.where(s.mem(0)[0] <= mem_cap_bytes, s.cost(0)[0], np.inf)
    choice = [np.zeros(n + 1, dtype=int)]
    cols = np.arange(n + 1)
    for k in range(1, pp):
        c = np.where(s.mem(k) <= mem_cap_bytes, s.cost(k), np.inf)
        cand = np.maximum(f[:, None], c)  # [j, i]
        arg = np.argmin(cand, axis=0)
        f = cand[arg, cols]
        choice.append(arg)
    if not np.isfinite(f[n]):
        return None
    bounds = [n]
    for k in range(pp - 1, 0, -1):
        bounds.append(int(choice[k][bounds[-1]]))
    bounds.append(0)
    bounds.reverse()
    return _evaluate(lc, [(bounds[k], bounds[k + 1]) for k in range(pp)], m)


def evaluate_split(lc: LayerCosts, stages: list[tuple[int, int]], m: int, mats=None) -> StageSplit:
    """Iteration time and memory of a given split (the same formula the DP minimizes).
    `mats` is accepted for backward compatibility and ignored: direct sums are cheaper."""
    return _evaluate(lc, list(stages), m)


def _evaluate(lc: LayerCosts, stages: list[tuple[int, int]], m: int) -> StageSplit:
    pp = len(stages)
    costs, mems, times = [], [], []
    for k, (a, b) in enumerate(stages):
        t = float(lc.step_s[a:b].sum()) + (float(lc.p2p_s[b - 1]) if k < pp - 1 else 0.0)
        costs.append((m + pp - 1) * t + float(lc.allreduce_s[a:b].sum()) + float(lc.optim_s[a:b].sum())
                     + lc.stage_s)
        inflight = min(m, pp - k)
        mems.append(float(lc.static_bytes[a:b].sum()) + inflight * float(lc.act_bytes[a:b].sum())
                    + max(0.0, float(lc.peak_bytes[a:b].max())))
        times.append(t)
    return StageSplit(stages=stages, iter_time_s=max(costs), stage_time_s=times, mem_bytes=mems)
