"""The level-1 MILP, built from a ClusterProblem (see problem.py for the packing argument).

    max  sum_k value_k x_k - sum_{j running} pen_j (1 - sum_{k in j} x_k) - sum_j dw_j slack_j / need_j
    s.t. sum_{k in j} x_k <= 1                                             one grid per job
         sum_{k in pool p, new, units_k >= s} units_k x_k
             <= s*floor(G/s)*empty_p + sum_{b occupied} s*floor(free_b/s)    for every pool p, size s
         s w_{b,s} + sum_{j on b} gpus_{j,b} x_{cur(j)} <= G                 nodes shared by running jobs
         sum_{k in j} tput_k x_k + slack_j >= need_j          soft deadlines, makespan guard
         sum_{j running} (1 - x_{cur(j)}) <= max_reconfigs                  optional

The rows are generated once (`level1_rows`) as plain sparse data; `to_pyomo` states them as a Pyomo
model (the default path, solved through Pyomo's HiGHS interface) and `solve.py` can also hand the same
rows to highspy directly, which skips Pyomo's per-expression overhead in the simulator's many rounds.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from arena_opt.milp.problem import ClusterProblem


@dataclass
class LinearModel:
    """max c.x subject to row_lo <= A x <= row_hi; x_k for k < num_grids are the grid binaries."""

    num_grids: int
    kinds: list[str] = field(default_factory=list)  # "B" binary, "I" integer >= 0, "C" continuous >= 0
    obj: list[float] = field(default_factory=list)
    rows: list[tuple[list[int], list[float]]] = field(default_factory=list)
    row_lo: list[float] = field(default_factory=list)
    row_hi: list[float] = field(default_factory=list)
    names: list[str] = field(default_factory=list)  # row names, for reading a model dump

    def add_var(self, kind: str, c: float = 0.0) -> int:
        self.kinds.append(kind)
        self.obj.append(c)
        return len(self.kinds) - 1

    def add_row(self, name: str, terms: dict[int, float], lo: float = -np.inf, hi: float = np.inf) -> None:
        idx = [i for i, v in terms.items() if v != 0]
        self.rows.append((idx, [terms[i] for i in idx]))
        self.row_lo.append(lo)
        self.row_hi.append(hi)
        self.names.append(name)


def level1_rows(p: ClusterProblem) -> LinearModel:
    K = len(p.grids)
    lm = LinearModel(num_grids=K)
    by_job: dict[int, list[int]] = defaultdict(list)
    for k, j in enumerate(p.job_of):
        by_job[int(j)].append(k)
    run_jobs = [j for j in range(p.num_jobs) if p.running[j]]
    # preemption penalty: the selection-dependent part; its constant lives in model_constant
    bonus = np.zeros(K)
    for j in run_jobs:
        bonus[by_job.get(j, [])] = p.preempt_penalty[j]
    for k in range(K):
        lm.add_var("B", float(p.value[k] + bonus[k]))
    for j in sorted(by_job):
        lm.add_row(f"one_grid[{p.job_ids[j]}]", {k: 1.0 for k in by_job[j]}, hi=1.0)

    cur_of = {int(p.job_of[k]): k for k in range(K) if p.current[k]}

    # Packing. A node held by one running job j (g GPUs) has s*floor(free/s) = s*floor(G/s) when j moves and
    # s*floor((G-g)/s) when j stays: linear in x[cur(j)], no variable needed. Nodes shared by several running
    # jobs get one integer w[b, s] = floor(free/s) per threshold.
    w_of: dict[tuple, int] = {}
    for key, pi in p.pools.items():
        for nid, users in pi.occupied.items():
            if len(users) < 2:
                continue
            kept = {cur_of[j]: float(g) for j, g in users if j in cur_of}
            for s in pi.thresholds:
                w = w_of[(key, nid, s)] = lm.add_var("I")
                lm.add_row(f"node_free[{nid},{s}]", {w: float(s), **kept}, hi=float(pi.gpus_per_node))

    new_by_pool: dict[tuple, list[int]] = defaultdict(list)
    for k in range(K):
        if not p.current[k]:
            new_by_pool[p.pool_of[k]].append(k)
    for key, pi in p.pools.items():
        G = pi.gpus_per_node
        for s in pi.thresholds:
            items = [k for k in new_by_pool[key] if p.units[k] >= s]
            if not items:
                continue
            full = s * (G // s)
            terms: dict[int, float] = {k: float(p.units[k]) for k in items}
            const = float(full * pi.empty_nodes)
            for nid, users in pi.occupied.items():
                if len(users) > 1:
                    terms[w_of[(key, nid, s)]] = -float(s)
                    continue
                (j, g), = users
                const += full
                held = full - s * ((G - g) // s)
                if j in cur_of and held:  # a running job without a current grid cannot stay: node is free
                    terms[cur_of[j]] = terms.get(cur_of[j], 0.0) + float(held)
            lm.add_row(f"pack[{key[0]},{key[1]},{s}]", terms, hi=const)

    for name, need, weight in p.soft_targets():
        for j in range(p.num_jobs):
            if need[j] > 0 and j in by_job:
                sl = lm.add_var("C", -float(weight[j] / need[j]))
                lm.add_row(f"{name}[{p.job_ids[j]}]", {**{k: float(p.throughput[k]) for k in by_job[j]}, sl: 1.0},
                           lo=float(need[j]))

    if p.max_reconfigs is not None and run_jobs:
        kept = {cur_of[j]: -1.0 for j in run_jobs if j in cur_of}
        lm.add_row("reconfigs", kept, hi=float(p.max_reconfigs - len(run_jobs)))
    return lm


def to_pyomo(lm: LinearModel):
    import pyomo.environ as pyo

    m = pyo.ConcreteModel(name="arena_level1")
    domain = {"B": pyo.Binary, "I": pyo.NonNegativeIntegers, "C": pyo.NonNegativeReals}
    m.V = pyo.Set(initialize=range(len(lm.kinds)))
    m.v = pyo.Var(m.V, domain=lambda mm, i: domain[lm.kinds[i]])
    m.R = pyo.Set(initialize=range(len(lm.rows)))

    def row(mm, r):
        idx, vals = lm.rows[r]
        body = pyo.quicksum((c * mm.v[i] for i, c in zip(idx, vals)))
        lo = None if lm.row_lo[r] == -np.inf else lm.row_lo[r]
        hi = None if lm.row_hi[r] == np.inf else lm.row_hi[r]
        return (lo, body, hi)

    m.rows = pyo.Constraint(m.R, rule=row)
    m.obj = pyo.Objective(expr=pyo.quicksum((c * m.v[i] for i, c in enumerate(lm.obj) if c)),
                          sense=pyo.maximize)
    return m


def selection_from(values, p: ClusterProblem) -> dict[int, int]:
    sel = {}
    for k in range(len(p.grids)):
        v = values[k]
        if v is not None and v > 0.5:
            sel[int(p.job_of[k])] = int(k)
    return sel


def model_constant(p: ClusterProblem) -> float:
    """What the model's objective leaves out: add to its objective to get `ClusterProblem.objective`."""
    return -float(sum(p.preempt_penalty[j] for j in range(p.num_jobs) if p.running[j]))
