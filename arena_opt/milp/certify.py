"""The LP relaxation of the level-1 MILP as a cheap certificate, tried before the MIP.

In simulated rounds the MIP mostly proves what is already known: on 600 rounds sampled from the whole
Philly trace the relaxation's bound was within the 1e-3 gap of the greedy start in 583 (its optimum
mostly integral), at 1.8 ms CPU against 62 ms for HiGHS's MIP, whose presolve, symmetry detection and
heuristics are its cost at 1,000 binaries, not the search. A relaxation optimum that is integral is the
MILP's optimum; a selection within the gap of the relaxation's bound is optimal within the gap, which is
what the MIP's own `optimal` means. Otherwise the caller runs the MIP as before.

The start the bound is checked against first is the relaxation's own, rounded (`rounded`): its integral
grid columns fixed, the rest filled by the greedy. On the whole Philly trace it is within the gap in most
rounds whose optimum is fractional, for one greedy pass instead of the greedy start's several orders and
their local improvement.

Consecutive rounds' relaxations differ in a few jobs' columns and rows and in the values: `LpBasis` keeps
the last optimal basis by column and row key (job and grid object, family and label), and the next
relaxation starts its simplex from it (columns it has not seen at zero, rows it has not seen basic;
HiGHS completes the basis). The optimum's value is the same; only fewer simplex iterations lead there.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from arena_opt.milp.greedy import greedy_select
from arena_opt.milp.linear import LinearModel, highs_arrays
from arena_opt.milp.model import level1_model, model_constant, selection_from
from arena_opt.milp.problem import ClusterProblem
from arena_opt.milp.solve import SolveResult, highs_basis, run_highs
from arena_opt.milp.standing import relative_gap

# the relaxation's integer columns count as integral within this (HiGHS's own mip_feasibility_tolerance)
_INTEGRAL_TOL = 1e-6
WITHIN_GAP = "optimal_within_gap"  # status of a start certified by the relaxation's bound


@dataclass
class Relaxation:
    bound: float  # the relaxation's optimum, in ClusterProblem.objective units: >= every feasible selection's
    selection: dict[int, int] | None  # its optimum when every integer column is integral (the MILP's optimum)
    build_s: float
    solve_s: float
    x: np.ndarray | None = None  # the grid columns of its optimum (ClusterProblem.grids order)
    dropped: str | None = None  # why `rounded` gave no selection (for the decision's note), once it was asked

    def optimum(self, p: ClusterProblem) -> SolveResult | None:
        """The integral relaxation optimum as the round's solution (status `optimal`), else None."""
        if self.selection is None:
            return None
        obj = p.objective(self.selection)
        return SolveResult(dict(self.selection), "optimal", obj, self.bound, relative_gap(self.bound, obj),
                           self.build_s, self.solve_s)

    def rounded(self, p: ClusterProblem) -> dict[int, int] | None:
        """A feasible selection read off the relaxation's optimum: every grid at 1 in it is kept, the other
        jobs are filled in by `greedy_select` (running jobs first where they are); None when those grids do
        not pack on the nodes (the relaxed free-slot columns of shared nodes can promise GPUs that a node
        split does not give): then `dropped` says so."""
        if self.x is None:
            return None
        fixed = {int(p.job_of[k]): int(k) for k in np.flatnonzero(self.x >= 1.0 - _INTEGRAL_TOL)}
        try:
            return greedy_select(p, fixed=fixed)
        except RuntimeError as e:
            self.dropped = (f"the LP relaxation's rounded optimum dropped: its {len(fixed)} whole grids do not "
                            f"pack on the nodes ({e})")
            return None

    def certify(self, p: ClusterProblem, start: dict[int, int], mip_gap: float) -> SolveResult | None:
        """`start` when its objective is within `mip_gap` of the bound (status `optimal_within_gap`, with the
        bound and the gap), else None: the relaxation proves nothing, the MIP has to."""
        obj = p.objective(start)
        gap = relative_gap(self.bound, obj)
        if gap > mip_gap:
            return None
        return SolveResult(dict(start), WITHIN_GAP, obj, self.bound, gap, self.build_s, self.solve_s)


class LpBasis:
    """The last optimal relaxation's basis, by column and row key, as the next relaxation's start."""

    def __init__(self):
        self.cols: dict | None = None
        self.rows: dict | None = None

    @staticmethod
    def keys(p: ClusterProblem, lm: LinearModel) -> tuple[list, list]:
        """A key per model column and row that names the same thing in another round's model: a grid by
        its job and its object (a workload's shared grids and a running job's own are the same objects
        round after round in GridCatalog; a key that names another grid only makes a worse start), the
        other columns and the rows by block or family and label."""
        cols: list = []
        for b in lm.blocks:
            if b.name == "x":
                ids = p.job_ids
                cols += [(ids[j], id(g)) for j, g in zip(p.job_of.tolist(), p.grids)]
            else:
                cols += [(b.name, lab) for lab in (b.labels if b.labels is not None else range(b.size))]
        rows = [(f.name, lab) for f in lm.families for lab in (f.labels if f.labels is not None else (None,))]
        return cols, rows

    def start(self, cols: list, rows: list):
        """The kept basis on these keys (a highspy HighsBasis, `alien`: HiGHS completes it), or None."""
        if self.cols is None:
            return None
        import highspy

        S = highspy.HighsBasisStatus
        b = highspy.HighsBasis()
        b.col_status = [self.cols.get(k, S.kLower) for k in cols]
        b.row_status = [self.rows.get(k, S.kBasic) for k in rows]
        b.valid, b.alien = True, True
        return b

    def keep(self, cols: list, rows: list, basis) -> None:
        if basis is None or not basis.valid:
            self.cols = self.rows = None
            return
        self.cols, self.rows = dict(zip(cols, basis.col_status)), dict(zip(rows, basis.row_status))


def relax(p: ClusterProblem, *, threads: int, deadline: float | None = None,
          time_limit_s: float = 10.0, warm: LpBasis | None = None) -> Relaxation | None:
    """Solve the LP relaxation of `level1_model(p)` (None: no grids, or HiGHS did not reach its optimum
    within the time limit or by the deadline). `warm`: the basis kept from the last relaxation, started
    from and replaced by this one's."""
    if not p.grids:
        return None
    t0 = time.perf_counter()
    lm = level1_model(p)
    lp = highs_arrays(lm, relaxed=True)
    integer = lm.kinds() != "C"
    keys = LpBasis.keys(p, lm) if warm is not None else None
    t1 = time.perf_counter()
    word, info, x = run_highs(lp, time_limit_s=time_limit_s, mip_gap=0.0, threads=threads, deadline=deadline,
                              basis=None if warm is None else warm.start(*keys))
    t2 = time.perf_counter()
    if word != "Optimal" or x is None:
        if warm is not None:
            warm.keep(*keys, None)
        return None
    if warm is not None:
        warm.keep(*keys, highs_basis())
    bound = float(info.objective_function_value) + model_constant(p)
    integral = bool(np.all(np.abs(x[integer] - np.round(x[integer])) <= _INTEGRAL_TOL))
    # an integral optimum satisfies every row with integral integer columns: a feasible selection
    return Relaxation(bound, selection_from(x, p) if integral else None, t1 - t0, t2 - t1, x[: len(p.grids)])
