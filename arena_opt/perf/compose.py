"""Compose a plan's iteration time and per-GPU memory from per-layer costs.

Both estimators feed this one composition: the analytical model (FLOPs on a
roofline) and the profiler (measured per-layer times). Everything per layer is
already for the plan's tp degree and micro-batch size.

Timeline model (1F1B, uniform dp x tp per stage): stage k spends
T_k = sum(fwd + bwd + tp collectives of its layers) + its outgoing p2p per
micro-batch; it runs m micro-batches plus a bubble of (pp-1) micro-batch slots,
then all-reduces its gradients across dp. The iteration ends when the slowest
stage has finished:

    iter = max_k [ (m + pp - 1) * T_k + AR_k ] + optimizer step

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
    allreduce_s: np.ndarray  # dp gradient all-reduce of this layer's parameters
    optim_s: np.ndarray  # optimizer update of this layer's shard
    static_bytes: np.ndarray  # weights + grads + optimizer state on one GPU
    act_bytes: np.ndarray  # activations kept per in-flight micro-batch on one GPU
    peak_bytes: np.ndarray  # transient working memory while this layer runs (recompute, logits)

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
    return np.concatenate([[0.0], np.cumsum(x)])


def segment_matrices(lc: LayerCosts, pp: int, m: int):
    """Cost and memory of every segment [j, i) as (L+1) x (L+1) matrices for each stage index.
    Invalid segments (i <= j) are +inf."""
    n = lc.num_layers
    j = np.arange(n + 1)[:, None]
    i = np.arange(n + 1)[None, :]
    valid = i > j
    ps, pa, po, pstat = (_prefix(lc.step_s), _prefix(lc.allreduce_s), _prefix(lc.optim_s),
                         _prefix(lc.static_bytes))
    pact = _prefix(lc.act_bytes)
    # outgoing p2p: output of the segment's last layer (i - 1)
    p2p_last = np.concatenate([[0.0], lc.p2p_s])[i]
    step = ps[i] - ps[j]
    ar = pa[i] - pa[j]
    opt = po[i] - po[j]
    static = pstat[i] - pstat[j]
    act = pact[i] - pact[j]
    # running max of transient memory over the segment
    peak = np.full((n + 1, n + 1), 0.0)
    for a in range(n):
        peak[a, a + 1:] = np.maximum.accumulate(lc.peak_bytes[a:])
    out = []
    for k in range(pp):
        t = step + (p2p_last if k < pp - 1 else 0.0)
        cost = (m + pp - 1) * t + ar + opt
        inflight = min(m, pp - k)
        mem = static + inflight * act + peak
        out.append((np.where(valid, cost, np.inf), np.where(valid, mem, np.inf), np.where(valid, t, np.inf)))
    return out


def split_stages(lc: LayerCosts, pp: int, m: int, mem_cap_bytes: float) -> StageSplit | None:
    """Exact min-max contiguous split into pp stages with every stage within memory; None if none fits."""
    n = lc.num_layers
    if pp > n:
        return None
    mats = segment_matrices(lc, pp, m)
    inf = np.inf
    # f[i] = best bottleneck for the first i layers in k+1 stages
    cost0, mem0, _ = mats[0]
    f = np.where(mem0[0] <= mem_cap_bytes, cost0[0], inf)
    choice = [np.zeros(n + 1, dtype=int)]
    for k in range(1, pp):
        cost, mem, _ = mats[k]
        c = np.where(mem <= mem_cap_bytes, cost, inf)
        cand = np.maximum(f[:, None], c)  # [j, i]
        arg = np.argmin(cand, axis=0)
        f = cand[arg, np.arange(n + 1)]
        choice.append(arg)
    if not np.isfinite(f[n]):
        return None
    bounds = [n]
    for k in range(pp - 1, 0, -1):
        bounds.append(int(choice[k][bounds[-1]]))
    bounds.append(0)
    bounds.reverse()
    stages = [(bounds[k], bounds[k + 1]) for k in range(pp)]
    return evaluate_split(lc, stages, m, mats)


def evaluate_split(lc: LayerCosts, stages: list[tuple[int, int]], m: int, mats=None) -> StageSplit:
    """Iteration time and memory of a given split (the same formula the DP minimizes)."""
    pp = len(stages)
    mats = mats or segment_matrices(lc, pp, m)
    costs = [float(mats[k][0][a, b]) for k, (a, b) in enumerate(stages)]
    mems = [float(mats[k][1][a, b]) for k, (a, b) in enumerate(stages)]
    times = [float(mats[k][2][a, b]) for k, (a, b) in enumerate(stages)]
    return StageSplit(stages=list(stages), iter_time_s=max(costs), stage_time_s=times, mem_bytes=mems)
