"""Solve a level-1 model with HiGHS through Pyomo, with a time limit, a gap and full reporting."""

from __future__ import annotations

import gc
import math
import time
from dataclasses import dataclass

from arena_opt.milp.model import build_model, model_constant, selection
from arena_opt.milp.problem import ClusterProblem

_THREADS: int | None = None  # HiGHS fixes its thread pool per process at the first solve


def solver_threads(requested: int) -> int:
    """The thread count every HiGHS solve of this process must use: the first one asked for
    (a different count after the first solve makes HiGHS fail, shared/MEASURED.md)."""
    global _THREADS
    if _THREADS is None:
        _THREADS = requested
    return _THREADS


@dataclass
class SolveResult:
    selection: dict[int, int] | None  # None: the solver has no incumbent
    status: str
    objective: float | None  # in ClusterProblem.objective units
    bound: float | None
    gap: float | None
    build_s: float
    solve_s: float


def solve_problem(p: ClusterProblem, *, time_limit_s: float, mip_gap: float, threads: int) -> SolveResult:
    from pyomo.contrib.solver.solvers.highs import Highs

    threads = solver_threads(threads)
    if not p.grids:
        return SolveResult({}, "empty", p.objective({}), p.objective({}), 0.0, 0.0, 0.0)
    t0 = time.perf_counter()
    # Pyomo allocates many small objects; cyclic GC passes over them cost more than the build itself
    gc_was = gc.isenabled()
    gc.disable()
    try:
        m = build_model(p)
        t1 = time.perf_counter()
        res = Highs().solve(m, time_limit=time_limit_s, rel_gap=mip_gap, threads=threads, tee=False,
                            load_solutions=False, raise_exception_on_nonoptimal_result=False)
        t2 = time.perf_counter()
    finally:
        if gc_was:
            gc.enable()
    status = res.termination_condition.name
    const = model_constant(p)
    sel = None
    obj = bound = gap = None
    if res.incumbent_objective is not None:
        res.solution_loader.load_vars()
        sel = selection(m, p)
        obj = p.objective(sel)
    if res.objective_bound is not None and math.isfinite(res.objective_bound):
        bound = res.objective_bound + const
    if obj is not None and bound is not None:
        gap = abs(bound - obj) / max(abs(obj), 1e-9)
    return SolveResult(sel, status, obj, bound, gap, t1 - t0, t2 - t1)
