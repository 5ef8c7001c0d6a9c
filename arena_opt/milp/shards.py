"""Split level 1 into independent shards (disjoint jobs and nodes), solve each, merge, repair.

Jobs that share a node through their running placements stay in one shard with that node;
empty nodes of every pool are dealt evenly. Shards are feasible on disjoint capacity, so
their union is feasible; the greedy repair then fills capacity a shard left unused with
jobs of other shards."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from arena_opt.milp.greedy import greedy_select
from arena_opt.milp.problem import ClusterProblem, PoolInfo


def _components(p: ClusterProblem) -> list[list[int]]:
    parent = list(range(p.num_jobs))

    def find(a: int) -> int:
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    for pi in p.pools.values():
        for users in pi.occupied.values():
            for j, _ in users[1:]:
                parent[find(j)] = find(users[0][0])
    comps: dict[int, list[int]] = {}
    for j in range(p.num_jobs):
        comps.setdefault(find(j), []).append(j)
    return list(comps.values())


def split(p: ClusterProblem, shards: int, seed: int = 0) -> list[tuple[ClusterProblem, np.ndarray]]:
    """Sub-problems and, for each, the original job index of its jobs."""
    rng = np.random.default_rng(seed)
    comps = _components(p)
    rng.shuffle(comps)  # ties in the sort below are broken at random (seeded)
    best = np.zeros(p.num_jobs)
    if len(p.grids):
        np.maximum.at(best, p.job_of, p.value)
    # deal in snake order over comparable components (deadline jobs first, then by value), so every shard
    # gets a like share of deadlines, of valuable jobs and of nodes' worth of demand
    targeted = p.targeted()
    comps.sort(key=lambda c: (-sum(targeted[j] for j in c), -sum(best[j] for j in c)))
    members: list[list[int]] = [[] for _ in range(shards)]
    order = list(range(shards)) + list(range(shards - 1, -1, -1))
    for i, c in enumerate(comps):
        members[order[i % len(order)]].extend(c)
    out = []
    for s, jobs in enumerate(members):
        jobs_arr = np.array(sorted(jobs), dtype=int)
        out.append((restrict(p, jobs_arr, s, shards), jobs_arr))
    return out


def restrict(p: ClusterProblem, jobs: np.ndarray, s: int = 0, shards: int = 1) -> ClusterProblem:
    """The sub-problem of `jobs` (original indices, sorted) on shard s of `shards` of the empty nodes,
    with the nodes those jobs occupy."""
    new_j = {int(j): i for i, j in enumerate(jobs)}
    remap = np.full(p.num_jobs, -1)
    remap[jobs] = np.arange(len(jobs))
    ks = np.flatnonzero(remap[p.job_of] >= 0)
    pools = {}
    for key, pi in p.pools.items():
        occ = {nid: [(new_j[j], g) for j, g in users] for nid, users in pi.occupied.items()
               if users[0][0] in new_j}
        share = pi.empty_nodes // shards + (1 if s < pi.empty_nodes % shards else 0)
        pools[key] = PoolInfo(key, pi.gpus_per_node, share, occ, pi.thresholds)
    take = lambda a: a[jobs]  # noqa: E731
    return replace(
        p, job_ids=[p.job_ids[j] for j in jobs], grids=[p.grids[k] for k in ks],
        job_of=remap[p.job_of[ks]], value=p.value[ks], units=p.units[ks],
        pool_of=[p.pool_of[k] for k in ks], current=p.current[ks], throughput=p.throughput[ks], pools=pools,
        running=take(p.running), preempt_penalty=take(p.preempt_penalty), deadline_need=take(p.deadline_need),
        deadline_weight=take(p.deadline_weight),
        guard_need=take(p.guard_need), guard_weight=take(p.guard_weight),
        max_reconfigs=None if p.max_reconfigs is None else max(0, p.max_reconfigs // shards))


def merge(p: ClusterProblem, parts: list[tuple[dict[int, int], np.ndarray, ClusterProblem]]) -> dict[int, int]:
    """Map shard selections back to the full problem and repair with the greedy fill."""
    sel: dict[int, int] = {}
    for sub_sel, jobs, sub in parts:
        for j_sub, k_sub in sub_sel.items():
            j = int(jobs[j_sub])
            g = sub.grids[k_sub]
            k = next(k for k in p.grids_of(j) if p.grids[k] is g)
            sel[j] = int(k)
    return greedy_select(p, fixed=sel, keep_running=False)
