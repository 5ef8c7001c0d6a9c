"""Solve linear models with HiGHS, with a time limit, a gap and full reporting: the level-1 MILP
(`solve_problem`) and any LinearModel (`solve_linear`, also the baselines' 0/1 programs).

`backend="pyomo"` (the MILP's default) emits the named blocks and families as a Pyomo model and solves
it through Pyomo's HiGHS interface; `backend="highspy"` hands the same matrix to highspy as arrays,
which avoids Pyomo's per-expression overhead (most of a small round's time) for simulations of
thousands of rounds.
"""

from __future__ import annotations

import contextlib
import gc
import math
import os
import threading
import time
from dataclasses import dataclass

import numpy as np

from arena_opt.milp.linear import HighsArrays, LinearModel, highs_arrays, pyomo_values, to_pyomo
from arena_opt.milp.model import level1_model, model_constant, selection_from, start_vector
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
    abandoned: bool = False  # HiGHS was still in its run at the deadline and was left behind (see _run_until)


ABANDONED = "Abandoned at the deadline"  # run_highs's word for a run left behind, no result
_PYOMO_STATUS = {"convergenceCriteriaSatisfied": "optimal", "maxTimeLimit": "time_limit",
                 "provenInfeasible": "infeasible", "locallyInfeasible": "infeasible"}
_HIGHS_STATUS = {"Optimal": "optimal", "Time limit reached": "time_limit", "Infeasible": "infeasible",
                 ABANDONED: "time_limit"}


def solve_problem(p: ClusterProblem, *, time_limit_s: float, mip_gap: float, threads: int,
                  backend: str = "pyomo", start: dict[int, int] | None = None,
                  deadline: float | None = None) -> SolveResult:
    """`start`: a feasible selection (job -> grid) handed to HiGHS as its first incumbent (highspy
    backend only): the search then prunes against it from the root; the selection returned is never worse. `deadline`: a time.perf_counter()
    value the solve must end by, model build and hand-off included (HiGHS gets what is left of it)."""
    if not p.grids:
        return SolveResult({}, "empty", p.objective({}), p.objective({}), 0.0, 0.0, 0.0)
    t0 = time.perf_counter()
    with no_gc():
        lm = level1_model(p)
    t_model = time.perf_counter() - t0
    start_x = None
    if start is not None:
        # only the grid binaries are given; HiGHS completes the integer and slack columns itself
        start_x = start_vector(lm, p, start)
    res = solve_linear(lm, time_limit_s=time_limit_s, mip_gap=mip_gap, threads=threads, backend=backend,
                       start=start_x, deadline=deadline)
    const = model_constant(p)
    sel = obj = bound = gap = None
    if res.x is not None:
        sel = selection_from(res.x, p)
        obj = p.objective(sel)
    if start is not None:
        # never less than the feasible start: a run left behind at the deadline has no result
        # (`abandoned` tells a caller that HiGHS added nothing), the pyomo backend does not hand the start
        # to HiGHS, and a run stopped at its limit before it took the start has a worse incumbent or none
        start_obj = p.objective(start)
        if obj is None or obj < start_obj:
            sel, obj = dict(start), start_obj
    if res.bound is not None:
        bound = res.bound + const
    if obj is not None and bound is not None:
        gap = abs(bound - obj) / max(abs(obj), 1e-9)
    return SolveResult(sel, res.status, obj, bound, gap, t_model + res.build_s, res.solve_s, res.abandoned)


@dataclass
class LinearResult:
    status: str  # optimal, time_limit, infeasible, ... (or the solver's own word)
    x: np.ndarray | None  # column values; None: the solver has no incumbent
    objective: float | None  # of the model as stated
    bound: float | None
    build_s: float  # emission (Pyomo model or highspy arrays)
    solve_s: float
    abandoned: bool = False


def solve_linear(lm: LinearModel, *, time_limit_s: float, mip_gap: float, threads: int, backend: str = "highspy",
                 start: np.ndarray | None = None, deadline: float | None = None,
                 options: dict | None = None) -> LinearResult:
    """Solve a LinearModel with HiGHS, through Pyomo or as highspy arrays: the one solve path of the
    level-1 MILP and of the baselines' 0/1 programs. `start`: values of the first len(start) columns
    as a first incumbent (highspy only). `deadline`: see `solve_problem`. `options`: further HiGHS
    options for this solve (highspy only; `run_highs`)."""
    if backend not in ("pyomo", "highspy"):
        raise ValueError(f"backend must be pyomo or highspy, not {backend!r}")
    threads = solver_threads(threads)
    t0 = time.perf_counter()
    word = None
    with no_gc():
        if backend == "pyomo":
            from pyomo.contrib.solver.solvers.highs import Highs

            m = to_pyomo(lm)
            t1 = time.perf_counter()
            res = Highs().solve(m, time_limit=_left(time_limit_s, deadline), rel_gap=mip_gap, threads=threads, tee=False,
                                load_solutions=False, raise_exception_on_nonoptimal_result=False)
            status = _PYOMO_STATUS.get(res.termination_condition.name, res.termination_condition.name)
            x = obj = None
            if res.incumbent_objective is not None:
                res.solution_loader.load_vars()
                x, obj = pyomo_values(m, lm), float(res.incumbent_objective)
            bound = res.objective_bound
        else:
            lp = highs_arrays(lm)
            t1 = time.perf_counter()
            word, info, x = run_highs(lp, time_limit_s=time_limit_s, mip_gap=mip_gap, threads=threads, start=start,
                                      deadline=deadline, options=options)
            status = _HIGHS_STATUS.get(word, word)
            obj = float(info.objective_function_value) if x is not None else None
            bound = info.mip_dual_bound if info is not None else None
        t2 = time.perf_counter()
    bound = float(bound) if bound is not None and math.isfinite(bound) else None
    return LinearResult(status, x, obj, bound, t1 - t0, t2 - t1, word == ABANDONED)


def _left(time_limit_s: float, deadline: float | None) -> float:
    """HiGHS's time limit: the solve's own limit, cut to what is left before the call's deadline
    (at least 10 ms: HiGHS then stops at once with its start or nothing)."""
    if deadline is None:
        return float(time_limit_s)
    return max(0.01, min(float(time_limit_s), deadline - time.perf_counter()))


@contextlib.contextmanager
def no_gc():
    """Pyomo allocates many small objects; cyclic GC passes over them cost more than the build itself. Also
    around a whole arena decision (policies/arena.py): its grids, plans and decision objects are long-lived,
    and every full collection walks them all again. Nested uses leave GC as the outermost found it."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


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


def run_highs(lp, *, time_limit_s: float, mip_gap: float, threads: int, start: np.ndarray | None = None,
              options: dict | None = None, deadline: float | None = None, basis=None):
    """Solve a highspy HighsLp or a `HighsArrays` on the process's one HiGHS instance (the arena MILP and
    the baselines' 0/1 programs alike). `start`: values of the first len(start) columns as an initial incumbent;
    `options`: further HiGHS options for this solve only (restored afterwards: the instance is shared);
    `basis`: a highspy HighsBasis to start the simplex from (an LP's warm start, milp/certify.py).
    Returns (HiGHS's status word, its info, the column values or None without a feasible point)."""
    h = _highs()
    h.clearModel()
    h.setOptionValue("mip_rel_gap", float(mip_gap))
    h.setOptionValue("threads", int(solver_threads(threads)))
    saved = {k: h.getOptionValue(k)[1] for k in options or {}}  # (status, value)
    for k, v in (options or {}).items():
        h.setOptionValue(k, v)
    try:
        if isinstance(lp, HighsArrays):
            lp.pass_to(h)
        else:
            h.passModel(lp)
        if start is not None:
            h.setSolution(len(start), np.arange(len(start), dtype=np.int32), np.asarray(start, dtype=float))
        if basis is not None:
            h.setBasis(basis)
        limit = _left(time_limit_s, deadline)  # after the hand-off, which the deadline counts
        if _is_lp(lp):
            # HiGHS's LP solver measures its time limit on the instance's clock, which runs on over every
            # solve of this process, the MIP solver from this run's start: an LP after some seconds of
            # earlier solves stopped at once ("Time limit reached", measured with highspy 1.16)
            limit += h.getRunTime()
        h.setOptionValue("time_limit", limit)
        done = _run_until(h, deadline)
    finally:
        if _HIGHS is h:  # not on an abandoned instance that is still running
            for k, v in saved.items():
                h.setOptionValue(k, v)
    if not done:
        return ABANDONED, None, None
    word = h.modelStatusToString(h.getModelStatus())
    info = h.getInfo()
    has = info.primal_solution_status >= 2  # feasible point available
    return word, info, (np.asarray(h.getSolution().col_value) if has else None)


def _is_lp(lp) -> bool:
    import highspy

    if isinstance(lp, HighsArrays):
        return lp.is_lp
    ints = lp.integrality_  # empty: every column continuous (to_highs of an LP, or relaxed)
    return not ints or all(v == highspy.HighsVarType.kContinuous for v in ints)


_LEFT_RUNNING = False  # a run was abandoned or interrupted: see solve_running
_GRACE_S = 0.05  # past the deadline before a run is abandoned: HiGHS's own limit stops most runs first


def _run_until(h, deadline: float | None) -> bool:
    """h.run(), abandoned at the deadline. HiGHS checks its time limit (and cancelSolve) only at points
    its MIP setup does not reach for a long time at 170,000 binaries (190 s past an 8 s limit measured,
    0 LP iterations): so with a deadline the run goes to a thread (highspy releases the GIL) and, if it
    is still going at the deadline, it is left to finish on its own while this process's next solve gets
    a new instance. False: abandoned, no result."""
    global _HIGHS
    if deadline is None:
        h.run()
        return True
    global _LEFT_RUNNING
    worker = threading.Thread(target=h.run, name="highs-run", daemon=True)
    worker.start()
    try:
        worker.join(max(0.0, deadline - time.perf_counter()) + _GRACE_S)
    except BaseException:  # a signal while waiting: the run goes on without us
        _LEFT_RUNNING = True
        raise
    if not worker.is_alive():
        return True
    _LEFT_RUNNING = True
    with contextlib.suppress(Exception):
        h.cancelSolve()
    _HIGHS = None  # the abandoned instance is still busy
    return False


def solve_running() -> bool:
    """A HiGHS run of this process was left running (abandoned at its deadline, or interrupted by a
    signal while the main thread waited on it). Such a process must leave through os._exit: a normal
    interpreter exit can destroy HiGHS's thread pool under that solve and abort (SIGABRT, measured on
    SIGTERM of `simulate`), even after the run's Python thread has ended."""
    return _LEFT_RUNNING


class shared_highs:
    """The process's HiGHS instance for a caller that drives it itself (adds columns, re-solves warm):
    `with shared_highs(...) as h: h.model.passModel(...)`; the options given are restored on exit."""

    def __init__(self, *, time_limit_s: float, threads: int, options: dict | None = None):
        self.model = _highs()
        self.model.clearModel()
        self.model.setOptionValue("time_limit", float(time_limit_s))
        self.model.setOptionValue("threads", int(solver_threads(threads)))
        self.options = options or {}
        self.saved = {k: self.model.getOptionValue(k)[1] for k in self.options}  # (status, value)

    def __enter__(self):
        for k, v in self.options.items():
            self.model.setOptionValue(k, v)
        return self

    def __exit__(self, *exc):
        for k, v in self.saved.items():
            self.model.setOptionValue(k, v)
        return False


def highs_basis():
    """The last `run_highs` solve's basis (highspy HighsBasis), or None before any."""
    return None if _HIGHS is None else _HIGHS.getBasis()


def highs_solution():
    """The last `run_highs` solve's full solution (row duals included), or None before any."""
    return None if _HIGHS is None else _HIGHS.getSolution()
