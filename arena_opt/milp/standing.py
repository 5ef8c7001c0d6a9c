"""After the solve: running jobs that the decision moves or preempts are put back on their standing
grid where the decision still packs and, by default, loses nothing.

Inside the default relative gap most simulated rounds end with a greedy start or a rounded relaxation optimum
certified within the gap of the LP bound (milp/certify.py), without the local moves or the MIP that would have
polished it, and those selections move running jobs for no gain (more reconfigurations per job than at a
tighter gap: docs/BENCHMARK.md, "Kept (session 13"). A move that gains nothing is a restart for nothing, so it
is undone, cheapest first (a revert may free room for another). `share` > 0 also undoes moves that gain
something, as long as all of them together give up at most that share of the objective and the decision stays
within `mip_gap` of its bound: fewer restarts still, but on Arena's Philly trace a longer average JCT (the
moves the objective prices as worth their restart were worth it). The objective is a constant plus the chosen
grids' gains (`ClusterProblem.gain`), so a revert's objective change is the difference of two gains; the
decision reports the objective and gap of the selection it returns.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from arena_opt.milp.local import Packing
from arena_opt.milp.problem import ClusterProblem

_EPS = 1e-9


@dataclass
class Kept:
    selection: dict[int, int]
    jobs: list[int]  # running jobs put back on their standing grid
    objective: float  # of `selection`
    change: float  # objective of `selection` less that of the selection given (<= 0)


def relative_gap(bound: float, obj: float) -> float:
    """Relative gap as the solver reports it (never below 0: the bound is an upper bound)."""
    return max(0.0, bound - obj) / max(abs(obj), 1e-9)


def keep_standing(p: ClusterProblem, sel: dict[int, int], bound: float | None, mip_gap: float,
                  share: float = 0.0, until: float | None = None) -> Kept:
    """`sel` (feasible) with as many moved running jobs back on their standing grid as fit, the cheapest
    first, each revert kept only when the selection still packs and loses nothing, or, with `share` > 0,
    loses at most `share` of the objective in all and stays within `mip_gap` of `bound` (never without a
    bound or with `sel` already past the gap). `until`: a time.perf_counter() value after which no further
    revert is tried."""
    obj = p.objective(sel)
    moved = _moved(p, sel)
    if not moved:
        return Kept(dict(sel), [], obj, 0.0)
    gain = p.gain()
    allowed = _allowed(obj, bound, mip_gap, share)
    out, total, kept = dict(sel), obj, []
    fits = None
    # cheapest first: the most reverts fit in the gap; a revert may free room for another, so repeat
    changed = True
    while changed:
        changed = False
        for j, k in sorted(moved.items(), key=lambda jk: _loss(gain, out, *jk)):
            if j in kept:
                continue
            if until is not None and time.perf_counter() >= until:
                changed = False
                break
            loss = _loss(gain, out, j, k)
            new = total - loss
            if not allowed(new):
                continue
            fits = fits or _Fits(p, out)  # made only when some revert is allowed
            if fits.revert(out, j, k):
                out[j], total = k, new
                kept.append(j)
                changed = True
    final = p.objective(out) if kept else obj
    return Kept(out, kept, final, final - obj)


class _Fits:
    """Whether a revert keeps the selection packed, on milp/local.py's pool-threshold vectors: a job
    alone on its nodes changes the slack by its two options' vectors; a job that shares a node changes
    that node's free capacity, so its revert is checked on the capacities `Packing.caps` gives for it (the
    same rows as `ClusterProblem.feasible`, at a sum over the shared nodes instead of a new packing)."""

    def __init__(self, p: ClusterProblem, sel: dict[int, int]):
        self.p = p
        self.pk = Packing(p, sel)
        self.slack = self.pk.slack(sel)

    def revert(self, sel: dict[int, int], j: int, k: int) -> bool:
        """Whether `sel` with job `j` on grid `k` packs; if so the slack is updated to it (`sel` is not)."""
        if self.pk.pinned[j]:
            trial = {**sel, j: k}
            cap = self.pk.caps(trial)
            slack = self.pk.slack(trial, cap)
            if np.any(slack < -_EPS):
                return False
            self.pk.cap, self.slack = cap, slack
            return True
        dv = self.pk.vec[k] - self.pk.vec[sel.get(j, self.pk.none)]
        if np.any(dv > self.slack + _EPS):
            return False
        self.slack = self.slack - dv
        return True


def _moved(p: ClusterProblem, sel: dict[int, int]) -> dict[int, int]:
    """Running job -> its standing grid, for the running jobs that `sel` moves or preempts."""
    out = {}
    for k in np.flatnonzero(p.current):
        j = int(p.job_of[k])
        if sel.get(j) != k:
            out[j] = int(k)
    return out


def _loss(gain: np.ndarray, sel: dict[int, int], j: int, k: int) -> float:
    """What putting job `j` back on grid `k` takes from the objective (a job without a grid gains 0)."""
    return float((gain[sel[j]] if j in sel else 0.0) - gain[k])


def _allowed(obj: float, bound: float | None, mip_gap: float, share: float):
    """Whether an objective may be returned instead of `obj`."""
    floor = obj - _EPS * max(1.0, abs(obj))
    if share <= 0 or bound is None or relative_gap(bound, obj) > mip_gap:
        return lambda new: new >= floor
    least = obj - share * abs(obj)
    return lambda new: new >= floor or (new >= least and relative_gap(bound, new) <= mip_gap)
