"""Level 2 as a Pyomo MILP: the contiguous layer-to-stage split of one plan.

The planner uses the exact dynamic program of `perf.compose.split_stages`; this model states the
same problem for HiGHS, and the tests check that both find the same optimum.

    min z
    s.t. z >= (m + pp - 1) * (sum_l step_l x_lk + [k < pp-1] sum_l p2p_l e_lk) + sum_l (ar_l + opt_l) x_lk
         sum_k x_lk = 1;  s_l = sum_k k x_lk;  s_0 = 0;  s_{L-1} = pp - 1;  0 <= s_{l+1} - s_l <= 1
         e_lk >= x_lk - x_{l+1,k}                      (layer l ends stage k: it sends the p2p)
         q_k >= peak_l x_lk
         sum_l (static_l + inflight_k act_l) x_lk + q_k <= cap
"""

from __future__ import annotations

import pyomo.environ as pyo

from arena_opt.milp.solve import solver_threads
from arena_opt.perf.compose import LayerCosts


def split_model(lc: LayerCosts, pp: int, m: int, cap: float) -> pyo.ConcreteModel:
    L = lc.num_layers
    mdl = pyo.ConcreteModel(name="stage_split")
    mdl.L = pyo.RangeSet(0, L - 1)
    mdl.K = pyo.RangeSet(0, pp - 1)
    mdl.x = pyo.Var(mdl.L, mdl.K, domain=pyo.Binary)
    mdl.e = pyo.Var(mdl.L, mdl.K, domain=pyo.NonNegativeReals)
    mdl.q = pyo.Var(mdl.K, domain=pyo.NonNegativeReals)
    mdl.z = pyo.Var(domain=pyo.Reals)
    s = {l: sum(k * mdl.x[l, k] for k in mdl.K) for l in mdl.L}
    mdl.assign = pyo.Constraint(mdl.L, rule=lambda mm, l: sum(mm.x[l, k] for k in mm.K) == 1)
    mdl.first = pyo.Constraint(expr=s[0] == 0)
    mdl.last = pyo.Constraint(expr=s[L - 1] == pp - 1)
    mdl.mono = pyo.Constraint(range(L - 1), rule=lambda mm, l: s[l + 1] >= s[l])
    mdl.step = pyo.Constraint(range(L - 1), rule=lambda mm, l: s[l + 1] <= s[l] + 1)
    mdl.ends = pyo.Constraint(range(L - 1), mdl.K, rule=lambda mm, l, k: mm.e[l, k] >= mm.x[l, k] - mm.x[l + 1, k])
    mdl.peak = pyo.Constraint(mdl.L, mdl.K, rule=lambda mm, l, k: mm.q[k] >= float(lc.peak_bytes[l]) * mm.x[l, k])

    def cost(mm, k):
        t = sum(float(lc.step_s[l]) * mm.x[l, k] for l in mm.L)
        if k < pp - 1:
            t = t + sum(float(lc.p2p_s[l]) * mm.e[l, k] for l in range(L - 1))
        tail = sum(float(lc.allreduce_s[l] + lc.optim_s[l]) * mm.x[l, k] for l in mm.L)
        return mm.z >= (m + pp - 1) * t + tail

    mdl.cost = pyo.Constraint(mdl.K, rule=cost)

    def mem(mm, k):
        inflight = min(m, pp - k)
        return sum(float(lc.static_bytes[l] + inflight * lc.act_bytes[l]) * mm.x[l, k] for l in mm.L) + mm.q[k] <= cap

    mdl.mem = pyo.Constraint(mdl.K, rule=mem)
    mdl.obj = pyo.Objective(expr=mdl.z, sense=pyo.minimize)
    return mdl


def solve_split(lc: LayerCosts, pp: int, m: int, cap: float, time_limit_s: float = 30.0,
                mip_gap: float = 1e-6) -> tuple[list[tuple[int, int]] | None, float | None]:
    """Optimal split [(first, last)) per stage and its bottleneck, or (None, None) if none fits."""
    from pyomo.contrib.solver.solvers.highs import Highs

    mdl = split_model(lc, pp, m, cap)
    res = Highs().solve(mdl, time_limit=time_limit_s, rel_gap=mip_gap, threads=solver_threads(1), tee=False,
                        load_solutions=False, raise_exception_on_nonoptimal_result=False)
    if res.incumbent_objective is None:
        return None, None
    res.solution_loader.load_vars()
    stage_of = [max(mdl.K, key=lambda k: mdl.x[l, k].value) for l in mdl.L]
    bounds = [0] + [l for l in range(1, lc.num_layers) if stage_of[l] != stage_of[l - 1]] + [lc.num_layers]
    return [(bounds[i], bounds[i + 1]) for i in range(pp)], float(res.incumbent_objective)
