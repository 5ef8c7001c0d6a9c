"""The 0/1 type-assignment program Gavel and Sia share: every admitted job with a choice takes exactly
one of its offered grids, GPU types hold what they hold, few running jobs move.

    max  sum_i u_i x_i                                      x_i in {0, 1}: job(i) runs on grid i
    s.t. one_grid_per_job[j]   sum_{i of j} x_i = 1
         type_capacity[t]      sum_{i of type t} units_i x_i <= GPUs of type t - GPUs of the fixed jobs
         migration_cap         sum_{i current} x_i >= #current - max_migrations   (when #current > max_migrations)

Stated with the MILP's named families (milp/linear.py) and solved by its solve path
(`milp.solve.solve_linear`, highspy arrays: the baselines solve one per round and Pyomo's build costs
40-60x more than the arrays, shared/MEASURED.md). The policies differ only in the utilities u and in
which options they offer.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from arena_opt.decision import SolverStats
from arena_opt.grids import Grid
from arena_opt.milp.linear import LinearModel, VarBlock
from arena_opt.milp.solve import solve_linear


# HiGHS's feasibility-jump heuristic costs more than the whole search on these programs of a few hundred
# binaries: without it, Gavel's 923 programs of Philly's first 3,000 rounds solved in 3.9 s CPU instead of
# 6.8 s, each to the same objective (98 of them to another optimum of equal value: a tie broken otherwise)
HIGHS_OPTIONS = {"mip_heuristic_run_feasibility_jump": False}


def type_assignment_model(options: list[tuple[str, Grid]], utility, capacity: dict[str, int],
                          max_migrations: int) -> LinearModel:
    lm = LinearModel(sense="max")
    x = lm.add_vars("x", "B", utility)
    one_grid_per_job(lm, options, x)
    type_capacity(lm, options, x, capacity)
    migration_cap(lm, options, x, max_migrations)
    return lm


def _groups(keys: list) -> tuple[list, np.ndarray]:
    """Distinct keys in order of first appearance, and each item's group number."""
    order: dict = {}
    group = np.array([order.setdefault(k, len(order)) for k in keys], dtype=np.int64)
    return list(order), group


def one_grid_per_job(lm: LinearModel, options: list[tuple[str, Grid]], x: VarBlock) -> None:
    jobs, row = _groups([j for j, _ in options])
    lm.add_rows("one_grid_per_job", row, x.col(np.arange(len(options))), 1.0, lo=1.0, hi=1.0, labels=jobs)


def type_capacity(lm: LinearModel, options: list[tuple[str, Grid]], x: VarBlock, capacity: dict[str, int]) -> None:
    types, row = _groups([g.shape.gpu_type for _, g in options])
    units = [g.node_units(g.pool[1]) for _, g in options]
    lm.add_rows("type_capacity", row, x.col(np.arange(len(options))), units, hi=[capacity[t] for t in types],
                labels=types)


def migration_cap(lm: LinearModel, options: list[tuple[str, Grid]], x: VarBlock, max_migrations: int) -> None:
    stays = [i for i, (_, g) in enumerate(options) if g.current]
    if len(stays) > max_migrations:
        lm.add_rows("migration_cap", np.zeros(len(stays)), x.col(stays), 1.0, lo=len(stays) - max_migrations)


def type_capacity_left(pools, fixed: dict[str, Grid]) -> dict[str, int]:
    """GPUs per type in the cluster's pools less those the fixed jobs (constants of the program) take."""
    cap: dict[str, int] = defaultdict(int)
    for p in pools.values():
        cap[p.gpu_type] += p.num_gpus
    for g in fixed.values():
        cap[g.shape.gpu_type] -= g.node_units(g.pool[1])
    return cap


def assign_types(options: list[tuple[str, Grid]], utility, pools, fixed: dict[str, Grid], max_migrations: int,
                 time_limit_s: float, mip_gap: float, fallback: dict[str, Grid]) -> tuple[dict[str, Grid], SolverStats]:
    """The grid of every job: `fixed` ones (constants of the program) and the program's choice among
    `options` ((job id, grid) per variable, each job's options together); `fallback`, flagged in the
    stats, when the solver finds no feasible assignment."""
    lm = type_assignment_model(options, utility, type_capacity_left(pools, fixed), max_migrations)
    res = solve_linear(lm, time_limit_s=time_limit_s, mip_gap=mip_gap, threads=1, backend="highspy",
                       options=HIGHS_OPTIONS)
    x = None if res.x is None else np.round(res.x).astype(np.int64)
    stats = SolverStats(solver="highs", status=res.status, objective=None if x is None else float(lm.cost() @ x),
                        bound=res.bound, build_s=res.build_s, solve_s=res.solve_s)
    if x is None:
        stats.fallback = True
        return fallback, stats
    return {**fixed, **{options[i][0]: options[i][1] for i in np.flatnonzero(x)}}, stats
