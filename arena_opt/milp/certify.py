"""The LP relaxation of the level-1 MILP as a cheap certificate, tried before the MIP.

In simulated rounds the MIP mostly proves what is already known: on 600 rounds sampled from the whole
Philly trace the relaxation's bound was within the 1e-3 gap of the greedy start in 583 (its optimum
mostly integral), at 1.8 ms CPU against 62 ms for HiGHS's MIP, whose presolve, symmetry detection and
heuristics are its cost at 1,000 binaries, not the search. A relaxation optimum that is integral is the
MILP's optimum; a selection within the gap of the relaxation's bound is optimal within the gap, which is
what the MIP's own `optimal` means. Otherwise the caller runs the MIP as before.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from arena_opt.milp.linear import to_highs
from arena_opt.milp.model import level1_model, model_constant, selection_from
from arena_opt.milp.problem import ClusterProblem
from arena_opt.milp.solve import SolveResult, run_highs

# the relaxation's integer columns count as integral within this (HiGHS's own mip_feasibility_tolerance)
_INTEGRAL_TOL = 1e-6
WITHIN_GAP = "optimal_within_gap"  # status of a start certified by the relaxation's bound


@dataclass
class Relaxation:
    bound: float  # the relaxation's optimum, in ClusterProblem.objective units: >= every feasible selection's
    selection: dict[int, int] | None  # its optimum when every integer column is integral (the MILP's optimum)
    build_s: float
    solve_s: float

    def optimum(self, p: ClusterProblem) -> SolveResult | None:
        """The integral relaxation optimum as the round's solution (status `optimal`), else None."""
        if self.selection is None:
            return None
        obj = p.objective(self.selection)
        return SolveResult(dict(self.selection), "optimal", obj, self.bound, _gap(self.bound, obj),
                           self.build_s, self.solve_s)

    def certify(self, p: ClusterProblem, start: dict[int, int], mip_gap: float) -> SolveResult | None:
        """`start` when its objective is within `mip_gap` of the bound (status `optimal_within_gap`, with the
        bound and the gap), else None: the relaxation proves nothing, the MIP has to."""
        obj = p.objective(start)
        gap = _gap(self.bound, obj)
        if gap > mip_gap:
            return None
        return SolveResult(dict(start), WITHIN_GAP, obj, self.bound, gap, self.build_s, self.solve_s)


def relax(p: ClusterProblem, *, threads: int, deadline: float | None = None,
          time_limit_s: float = 10.0) -> Relaxation | None:
    """Solve the LP relaxation of `level1_model(p)` (None: no grids, or HiGHS did not reach its optimum
    within the time limit or by the deadline)."""
    if not p.grids:
        return None
    t0 = time.perf_counter()
    lm = level1_model(p)
    lp = to_highs(lm)
    integer = np.array(lm.kinds()) != "C"
    lp.integrality_ = []  # every column continuous
    t1 = time.perf_counter()
    word, info, x = run_highs(lp, time_limit_s=time_limit_s, mip_gap=0.0, threads=threads, deadline=deadline)
    t2 = time.perf_counter()
    if word != "Optimal" or x is None:
        return None
    bound = float(info.objective_function_value) + model_constant(p)
    integral = bool(np.all(np.abs(x[integer] - np.round(x[integer])) <= _INTEGRAL_TOL))
    # an integral optimum satisfies every row with integral integer columns: a feasible selection
    return Relaxation(bound, selection_from(x, p) if integral else None, t1 - t0, t2 - t1)


def _gap(bound: float, obj: float) -> float:
    """Relative gap as solve_problem reports it (never below 0: the bound is an upper bound)."""
    return max(0.0, bound - obj) / max(abs(obj), 1e-9)
