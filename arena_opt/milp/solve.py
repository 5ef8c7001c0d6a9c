"""Solve a level-1 model with HiGHS, with a time limit, a gap and full reporting.

`backend="pyomo"` (default) states the rows as a Pyomo model and solves it through Pyomo's HiGHS
interface; `backend="highspy"` hands the same rows to highspy as arrays, which avoids Pyomo's
per-expression overhead (most of a small round's time) for simulations of thousands of rounds.
"""

from __future__ import annotations

import contextlib
import gc
import math
import os
import time
from dataclasses import dataclass

import numpy as np

from arena_opt.milp.model import LinearModel, level1_rows, model_constant, selection_from, to_pyomo
from arena_opt.milp.problem import ClusterProblem

_THREADS: int | None = None  # HiGHS fixes its thread pool per process at the first solve
_HIGHS = None  # one highspy instance per process: creating one prints a banner


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
    status: str  # optimal, time_limit, infeasible, ... (or the solver's own word)
    objective: float | None  # in ClusterProblem.objective units
    bound: float | None
    gap: float | None
    build_s: float
    solve_s: float


_PYOMO_STATUS = {"convergenceCriteriaSatisfied": "optimal", "maxTimeLimit": "time_limit",
                 "provenInfeasible": "infeasible", "locallyInfeasible": "infeasible"}
_HIGHS_STATUS = {"Optimal": "optimal", "Time limit reached": "time_limit", "Infeasible": "infeasible"}


def solve_problem(p: ClusterProblem, *, time_limit_s: float, mip_gap: float, threads: int,
                  backend: str = "pyomo", start: dict[int, int] | None = None) -> SolveResult:
    """`start`: a feasible selection (job -> grid) handed to HiGHS as its first incumbent (highspy
    backend only): the search then prunes against it from the root."""
    threads = solver_threads(threads)
    if not p.grids:
        return SolveResult({}, "empty", p.objective({}), p.objective({}), 0.0, 0.0, 0.0)
    t0 = time.perf_counter()
    # Pyomo allocates many small objects; cyclic GC passes over them cost more than the build itself
    gc_was = gc.isenabled()
    gc.disable()
    try:
        lm = level1_rows(p)
        if backend == "highspy":
            t1 = time.perf_counter()
            status, values, obj_model, bound_model = _solve_highspy(lm, time_limit_s, mip_gap, threads, start)
        elif backend == "pyomo":
            status, values, obj_model, bound_model, t1 = _solve_pyomo(lm, time_limit_s, mip_gap, threads)
        else:
            raise ValueError(f"backend must be pyomo or highspy, not {backend!r}")
        t2 = time.perf_counter()
    finally:
        if gc_was:
            gc.enable()
    const = model_constant(p)
    sel = obj = bound = gap = None
    if values is not None:
        sel = selection_from(values, p)
        obj = p.objective(sel)
    if bound_model is not None and math.isfinite(bound_model):
        bound = bound_model + const
    if obj is not None and bound is not None:
        gap = abs(bound - obj) / max(abs(obj), 1e-9)
    return SolveResult(sel, status, obj, bound, gap, t1 - t0, t2 - t1)


def _solve_pyomo(lm: LinearModel, time_limit_s: float, mip_gap: float, threads: int):
    from pyomo.contrib.solver.solvers.highs import Highs

    m = to_pyomo(lm)
    t1 = time.perf_counter()
    res = Highs().solve(m, time_limit=time_limit_s, rel_gap=mip_gap, threads=threads, tee=False,
                        load_solutions=False, raise_exception_on_nonoptimal_result=False)
    status = _PYOMO_STATUS.get(res.termination_condition.name, res.termination_condition.name)
    values = None
    if res.incumbent_objective is not None:
        res.solution_loader.load_vars()
        values = [m.v[k].value for k in range(lm.num_grids)]
    return status, values, res.incumbent_objective, res.objective_bound, t1


@contextlib.contextmanager
def _quiet_stdout():
    """highspy prints its banner from C++ on creation: silence file descriptor 1, not just sys.stdout."""
    try:
        fd = os.dup(1)
    except OSError:
        yield
        return
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
            yield
    finally:
        os.dup2(fd, 1)
        os.close(fd)


def _highs():
    global _HIGHS
    if _HIGHS is None:
        import highspy

        with _quiet_stdout():
            _HIGHS = highspy.Highs()
        _HIGHS.setOptionValue("output_flag", False)
    return _HIGHS


def _solve_highspy(lm: LinearModel, time_limit_s: float, mip_gap: float, threads: int,
                   start: dict[int, int] | None = None):
    import highspy

    n = len(lm.kinds)
    lp = highspy.HighsLp()
    lp.num_col_ = n
    lp.num_row_ = len(lm.rows)
    lp.sense_ = highspy.ObjSense.kMaximize
    lp.col_cost_ = np.asarray(lm.obj, dtype=float)
    lp.col_lower_ = np.zeros(n)
    lp.col_upper_ = np.array([1.0 if k == "B" else highspy.kHighsInf for k in lm.kinds])
    inf = highspy.kHighsInf
    lp.row_lower_ = np.array([-inf if v == -np.inf else v for v in lm.row_lo], dtype=float)
    lp.row_upper_ = np.array([inf if v == np.inf else v for v in lm.row_hi], dtype=float)
    starts = np.zeros(len(lm.rows) + 1, dtype=np.int32)
    starts[1:] = np.cumsum([len(idx) for idx, _ in lm.rows])
    lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
    lp.a_matrix_.num_col_ = n
    lp.a_matrix_.num_row_ = len(lm.rows)
    lp.a_matrix_.start_ = starts
    lp.a_matrix_.index_ = np.fromiter((i for idx, _ in lm.rows for i in idx), dtype=np.int32, count=int(starts[-1]))
    lp.a_matrix_.value_ = np.fromiter((v for _, vals in lm.rows for v in vals), dtype=float, count=int(starts[-1]))
    lp.integrality_ = [highspy.HighsVarType.kContinuous if k == "C" else highspy.HighsVarType.kInteger
                       for k in lm.kinds]
    start_x = None
    if start is not None:
        # only the grid binaries are given; HiGHS completes the integer and slack columns itself
        start_x = np.zeros(lm.num_grids)
        start_x[list(start.values())] = 1.0
    word, info, col_value = run_highs(lp, time_limit_s=time_limit_s, mip_gap=mip_gap, threads=threads,
                                      start=start_x)
    status = _HIGHS_STATUS.get(word, word)
    values = list(col_value[: lm.num_grids]) if col_value is not None else None
    obj = info.objective_function_value if col_value is not None else None
    return status, values, obj, info.mip_dual_bound


def run_highs(lp, *, time_limit_s: float, mip_gap: float, threads: int, start: np.ndarray | None = None):
    """Solve a highspy HighsLp on the process's one HiGHS instance (the arena MILP and the baselines'
    0/1 programs alike). `start`: values of the first len(start) columns as an initial incumbent.
    Returns (HiGHS's status word, its info, the column values or None without a feasible point)."""
    h = _highs()
    h.clearModel()
    h.setOptionValue("time_limit", float(time_limit_s))
    h.setOptionValue("mip_rel_gap", float(mip_gap))
    h.setOptionValue("threads", int(solver_threads(threads)))
    h.passModel(lp)
    if start is not None:
        h.setSolution(len(start), np.arange(len(start), dtype=np.int32), np.asarray(start, dtype=float))
    h.run()
    word = h.modelStatusToString(h.getModelStatus())
    info = h.getInfo()
    has = info.primal_solution_status >= 2  # feasible point available
    return word, info, (np.asarray(h.getSolution().col_value) if has else None)
