"""The level-1 MILP in Pyomo, built from a ClusterProblem (see problem.py for the packing argument).

    max  sum_k value_k x_k - sum_{j running} pen_j (1 - sum_{k in j} x_k) - sum_j dw_j slack_j / need_j
    s.t. sum_{k in j} x_k <= 1                                             one grid per job
         sum_{k in pool p, new, units_k >= s} units_k x_k
             <= s*floor(G/s)*empty_p + sum_{b occupied} s w_{b,s}            for every pool p, size s
         s w_{b,s} + sum_{j on b} gpus_{j,b} x_{cur(j)} <= G                 free capacity of occupied nodes
         sum_{k in j} tput_k x_k + slack_j >= need_j                        soft deadlines
         sum_{j running} (1 - x_{cur(j)}) <= max_reconfigs                  optional
"""

from __future__ import annotations

from collections import defaultdict

import pyomo.environ as pyo

from arena_opt.milp.problem import ClusterProblem


def build_model(p: ClusterProblem) -> pyo.ConcreteModel:
    m = pyo.ConcreteModel(name="arena_level1")
    K = range(len(p.grids))
    m.K = pyo.Set(initialize=K)
    m.x = pyo.Var(m.K, domain=pyo.Binary)

    by_job: dict[int, list[int]] = defaultdict(list)
    for k, j in enumerate(p.job_of):
        by_job[int(j)].append(k)
    m.J = pyo.Set(initialize=sorted(by_job))
    m.one_grid = pyo.Constraint(m.J, rule=lambda m, j: sum(m.x[k] for k in by_job[j]) <= 1)

    cur_of = {int(p.job_of[k]): k for k in K if p.current[k]}

    # Packing. A node held by one running job j (g GPUs) has s*floor(free/s) = s*floor(G/s) when j moves and
    # s*floor((G-g)/s) when j stays: linear in x[cur(j)], no variable needed. Nodes shared by several running
    # jobs get one integer w[b, s] = floor(free/s) per threshold.
    shared = [(key, nid, s) for key, pi in p.pools.items() for nid, users in pi.occupied.items()
              if len(users) > 1 for s in pi.thresholds]
    m.W = pyo.Set(initialize=range(len(shared)))
    m.w = pyo.Var(m.W, domain=pyo.NonNegativeIntegers)
    w_index = {t: i for i, t in enumerate(shared)}

    def node_rule(m, i):
        key, nid, s = shared[i]
        pi = p.pools[key]
        kept = sum(g * m.x[cur_of[j]] for j, g in pi.occupied[nid] if j in cur_of)
        return s * m.w[i] + kept <= pi.gpus_per_node

    m.node_free = pyo.Constraint(m.W, rule=node_rule)

    new_by_pool: dict[tuple, list[int]] = defaultdict(list)
    for k in K:
        if not p.current[k]:
            new_by_pool[p.pool_of[k]].append(k)
    pack = [(key, s) for key, pi in p.pools.items() for s in pi.thresholds
            if any(p.units[k] >= s for k in new_by_pool[key])]
    m.P = pyo.Set(initialize=range(len(pack)))

    def pack_rule(m, i):
        key, s = pack[i]
        pi = p.pools[key]
        G = pi.gpus_per_node
        full = s * (G // s)
        lhs = sum(int(p.units[k]) * m.x[k] for k in new_by_pool[key] if p.units[k] >= s)
        const = full * pi.empty_nodes
        freed: dict[int, int] = defaultdict(int)  # job -> capacity it holds at this threshold while it stays
        shared_w = []
        for nid, users in pi.occupied.items():
            if len(users) > 1:
                shared_w.append(s * m.w[w_index[(key, nid, s)]])
                continue
            (j, g), = users
            const += full
            held = full - s * ((G - g) // s)
            if j in cur_of and held:  # a running job without a current grid cannot stay: node is free
                freed[j] += held
        rhs = const - sum(h * m.x[cur_of[j]] for j, h in freed.items()) + sum(shared_w)
        return lhs <= rhs

    m.pack = pyo.Constraint(m.P, rule=pack_rule)

    dl = [j for j in range(p.num_jobs) if p.deadline_need[j] > 0 and j in by_job]
    m.D = pyo.Set(initialize=dl)
    m.slack = pyo.Var(m.D, domain=pyo.NonNegativeReals)
    m.deadline = pyo.Constraint(m.D, rule=lambda m, j: sum(float(p.throughput[k]) * m.x[k] for k in by_job[j])
                                + m.slack[j] >= float(p.deadline_need[j]))

    run_cur = [j for j in range(p.num_jobs) if p.running[j]]
    if p.max_reconfigs is not None and run_cur:
        m.reconf = pyo.Constraint(expr=sum(1 - (m.x[cur_of[j]] if j in cur_of else 0) for j in run_cur)
                                  <= p.max_reconfigs)

    obj = sum(float(p.value[k]) * m.x[k] for k in K)
    # preemption penalty: constant part left out, the selection-dependent part kept
    obj += sum(float(p.preempt_penalty[j]) * m.x[k] for j in run_cur for k in by_job.get(j, []))
    obj -= sum(float(p.deadline_weight[j] / p.deadline_need[j]) * m.slack[j] for j in dl)
    m.obj = pyo.Objective(expr=obj, sense=pyo.maximize)
    m._pack_index = pack
    return m


def selection(m: pyo.ConcreteModel, p: ClusterProblem) -> dict[int, int]:
    sel = {}
    for k in m.K:
        v = m.x[k].value
        if v is not None and v > 0.5:
            sel[int(p.job_of[k])] = int(k)
    return sel


def model_constant(p: ClusterProblem) -> float:
    """What the model's objective leaves out: add to its objective to get `ClusterProblem.objective`."""
    run = [j for j in range(p.num_jobs) if p.running[j]]
    return -float(sum(p.preempt_penalty[j] for j in run))
