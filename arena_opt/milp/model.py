"""The level-1 MILP, built from a ClusterProblem (see problem.py for the packing argument).

One function per variable block and per constraint family, each built whole with numpy; the
families keep their names in both emissions (Pyomo components `m.<family>[label]`, highspy row
ranges `LinearModel.row_ranges()`):

    x[k]                  binary: grid k runs                                          grid_choice
    node_free_slots[b,s]  integer: floor(free GPUs of node b / s), nodes shared by running jobs
    deadline_slack[j], makespan_slack[j]   continuous: throughput short of a target

    max  sum_k value_k x_k - sum_{j running} pen_j (1 - sum_{k in j} x_k) - sum_j dw_j slack_j / need_j
    s.t. one_grid_per_job[j]     sum_{k in j} x_k <= 1
         node_capacity[b,s]      s w_{b,s} + sum_{j on b} gpus_{j,b} x_{cur(j)} <= G
         pool_packing[p,s]       sum_{k in pool p, new, units_k >= s} units_k x_k
                                     <= s*floor(G/s)*empty_p + sum_{b occupied} s*floor(free_b/s)
         deadline[j]             sum_{k in j} tput_k x_k + deadline_slack_j >= need_j     (soft)
         makespan_guard[j]       sum_{k in j} tput_k x_k + makespan_slack_j >= guard_j    (soft)
         reconfiguration_cap     sum_{j running} (1 - x_{cur(j)}) <= max_reconfigs         (optional)

`solve.solve_problem` emits the model to Pyomo (solved through Pyomo's HiGHS interface) or hands
the same matrix to highspy directly, which skips Pyomo's per-expression overhead in the
simulator's many rounds.
"""

from __future__ import annotations

import numpy as np

from arena_opt.milp.linear import LinearModel, VarBlock
from arena_opt.milp.problem import ClusterProblem


def level1_model(p: ClusterProblem) -> LinearModel:
    lm = LinearModel(sense="max")
    x = grid_choice(lm, p)
    one_grid_per_job(lm, p, x)
    w = node_capacity(lm, p, x)
    pool_packing(lm, p, x, w)
    deadline(lm, p, x)
    makespan_guard(lm, p, x)
    reconfiguration_cap(lm, p, x)
    return lm


def current_grid(p: ClusterProblem) -> np.ndarray:
    """Per job, the index of the grid it runs on now (-1: none)."""
    cur = np.full(p.num_jobs, -1, dtype=np.int64)
    ks = np.flatnonzero(p.current)
    cur[p.job_of[ks]] = ks
    return cur


def grid_choice(lm: LinearModel, p: ClusterProblem) -> VarBlock:
    """x[k]: the grid binaries. A running job's preemption penalty is paid unless one of its grids is
    chosen: its selection-dependent part is a bonus on those grids (the constant is `model_constant`)."""
    bonus = np.where(p.running[p.job_of], p.preempt_penalty[p.job_of], 0.0) if len(p.grids) else np.zeros(0)
    return lm.add_vars("x", "B", p.value + bonus)


def one_grid_per_job(lm: LinearModel, p: ClusterProblem, x: VarBlock) -> None:
    jobs, row = np.unique(p.job_of, return_inverse=True)
    lm.add_rows("one_grid_per_job", row, x.col(np.arange(len(p.grids))), 1.0, hi=1.0,
                labels=[p.job_ids[j] for j in jobs])


def node_capacity(lm: LinearModel, p: ClusterProblem, x: VarBlock) -> dict[tuple, int]:
    """Nodes shared by several running jobs: s * node_free_slots[b, s] + GPUs kept on b <= G, one row
    per size threshold s. Returns the model column of each (pool key, node, s) slot variable.
    (A node held by one running job needs no variable: pool_packing states it linearly in x.)"""
    cur = current_grid(p)
    labels, bounds, rows, cols, vals, slot_of = [], [], [], [], [], {}
    start = lm.num_cols
    for key, pi in p.pools.items():
        for nid, users in pi.occupied.items():
            if len(users) < 2:
                continue
            kept = [(int(cur[j]), float(g)) for j, g in users if cur[j] >= 0]
            for s in pi.thresholds:
                r = len(labels)
                slot_of[(key, nid, s)] = start + r
                labels.append((nid, s))
                bounds.append(pi.gpus_per_node)
                rows.append(r), cols.append(start + r), vals.append(float(s))
                for k, g in kept:
                    rows.append(r), cols.append(x.start + k), vals.append(g)
    lm.add_vars("node_free_slots", "I", np.zeros(len(labels)), labels)
    lm.add_rows("node_capacity", rows, cols, vals, hi=bounds, labels=labels)
    return slot_of


def pool_packing(lm: LinearModel, p: ClusterProblem, x: VarBlock, slot_of: dict[tuple, int]) -> None:
    """Per pool and size threshold s: units of new grids of size >= s fit the s-slots of the pool's
    free capacity. A node held by one running job j (g GPUs) has s*floor(G/s) slots when j moves and
    s*floor((G-g)/s) when it stays: the difference moves to the left side on x[cur(j)]."""
    cur = current_grid(p)
    pos = {key: i for i, key in enumerate(p.pools)}
    pool_idx = np.array([pos[k] for k in p.pool_of], dtype=np.int64)
    new = ~p.current
    labels, bounds, rows, cols, vals = [], [], [], [], []
    for key, pi in p.pools.items():
        G = pi.gpus_per_node
        in_pool = np.flatnonzero(new & (pool_idx == pos[key]))
        single = [users[0] for users in pi.occupied.values() if len(users) == 1]
        shared = [nid for nid, users in pi.occupied.items() if len(users) > 1]
        s_job = np.array([j for j, _ in single], dtype=np.int64)
        s_gpus = np.array([g for _, g in single], dtype=np.int64)
        s_cur = cur[s_job] if len(single) else np.zeros(0, dtype=np.int64)
        for s in pi.thresholds:
            items = in_pool[p.units[in_pool] >= s]
            if not len(items):
                continue
            r = len(labels)
            full = s * (G // s)
            labels.append((*key, s))
            bounds.append(float(full * (pi.empty_nodes + len(single))))
            held = full - s * ((G - s_gpus) // s)
            stays = (s_cur >= 0) & (held != 0)  # a running job without a current grid cannot stay
            c = np.concatenate([x.col(items), x.col(s_cur[stays]),
                                np.array([slot_of[(key, nid, s)] for nid in shared], dtype=np.int64)])
            v = np.concatenate([p.units[items].astype(float), held[stays].astype(float), np.full(len(shared), -float(s))])
            rows.append(np.full(len(c), r)), cols.append(c), vals.append(v)
    cat = lambda a, t: np.concatenate(a) if a else np.zeros(0, dtype=t)  # noqa: E731
    lm.add_rows("pool_packing", cat(rows, np.int64), cat(cols, np.int64), cat(vals, float), hi=bounds, labels=labels)


def _throughput_target(lm: LinearModel, p: ClusterProblem, x: VarBlock, name: str, need: np.ndarray,
                       weight: np.ndarray) -> None:
    """Soft target: sum_{k in j} tput_k x_k + slack_j >= need_j, slack costs weight_j / need_j per unit,
    for every job with a need and a grid."""
    has_grid = np.zeros(p.num_jobs, dtype=bool)
    has_grid[p.job_of] = True
    jobs = np.flatnonzero((need > 0) & has_grid)
    row_of = np.full(p.num_jobs, -1, dtype=np.int64)
    row_of[jobs] = np.arange(len(jobs))
    ks = np.flatnonzero(row_of[p.job_of] >= 0)
    labels = [p.job_ids[j] for j in jobs]
    slack = lm.add_vars(f"{name}_slack", "C", -weight[jobs] / need[jobs], labels)
    lm.add_rows(name, np.concatenate([row_of[p.job_of[ks]], np.arange(len(jobs))]),
                np.concatenate([x.col(ks), slack.col(np.arange(len(jobs)))]),
                np.concatenate([p.throughput[ks], np.ones(len(jobs))]), lo=need[jobs], labels=labels)


def deadline(lm: LinearModel, p: ClusterProblem, x: VarBlock) -> None:
    _throughput_target(lm, p, x, "deadline", p.deadline_need, p.deadline_weight)


def makespan_guard(lm: LinearModel, p: ClusterProblem, x: VarBlock) -> None:
    _throughput_target(lm, p, x, "makespan_guard", p.guard_need, p.guard_weight)


def reconfiguration_cap(lm: LinearModel, p: ClusterProblem, x: VarBlock) -> None:
    """At most max_reconfigs running jobs leave their current grid: sum_{j running} -x_cur(j) <= cap - #running."""
    running = np.flatnonzero(p.running)
    if p.max_reconfigs is None or not len(running):
        return
    cur = current_grid(p)[running]
    cur = cur[cur >= 0]
    lm.add_rows("reconfiguration_cap", np.zeros(len(cur)), x.col(cur), -1.0, hi=float(p.max_reconfigs - len(running)))


def selection_from(values, p: ClusterProblem) -> dict[int, int]:
    """Job -> grid of the grid binaries set in a solution (`values` in model column order)."""
    x = np.asarray(values[: len(p.grids)], dtype=float)
    return {int(p.job_of[k]): int(k) for k in np.flatnonzero(x > 0.5)}


def start_vector(lm: LinearModel, p: ClusterProblem, sel: dict[int, int]) -> np.ndarray:
    """Every column's value for a feasible selection, so that HiGHS takes it as an incumbent as it is
    (a start of the grid binaries alone makes HiGHS search for the rest, which at 10,000 jobs it may
    not finish in time): x as selected, each node's free slots at their largest, slacks at the shortfall."""
    v = np.zeros(lm.num_cols)
    v[list(sel.values())] = 1.0
    cur = current_grid(p)
    for b in lm.blocks:
        if b.name == "node_free_slots":
            nodes = {nid: (pi.gpus_per_node, users) for pi in p.pools.values() for nid, users in pi.occupied.items()}
            for i, (nid, s) in enumerate(b.labels):
                G, users = nodes[nid]
                kept = sum(g for j, g in users if cur[j] >= 0 and sel.get(j) == cur[j])
                v[b.start + i] = (G - kept) // s
        elif b.name.endswith("_slack"):
            need = p.deadline_need if b.name == "deadline_slack" else p.guard_need
            jobs = np.flatnonzero(need > 0)
            jobs = jobs[np.isin(jobs, p.job_of)]
            got = np.array([p.throughput[sel[j]] if j in sel else 0.0 for j in jobs])
            v[b.col(np.arange(len(jobs)))] = np.maximum(0.0, need[jobs] - got)
    return v


def model_constant(p: ClusterProblem) -> float:
    """What the model's objective leaves out: add to its objective to get `ClusterProblem.objective`."""
    return -float(sum(p.preempt_penalty[j] for j in range(p.num_jobs) if p.running[j]))
