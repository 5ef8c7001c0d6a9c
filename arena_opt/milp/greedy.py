"""Greedy feasible selection: the fallback when the solver returns no incumbent, and the repair
step after shards are merged. Packs with the occupancy engine (arena_opt/occupancy.py) on the
problem's per-node free counts, so its result is feasible by construction."""

from __future__ import annotations

import numpy as np

from arena_opt.milp.problem import ClusterProblem
from arena_opt.occupancy import Layout, Occupancy


class _Free:
    """The problem's free GPUs as an occupancy: per pool one slot per node (occupied nodes first, then
    empty ones), the GPUs of the kept jobs held."""

    def __init__(self, p: ClusterProblem, kept: set[int]):
        layout, held = {}, []
        for key, pi in p.pools.items():
            ids = [f"{key}/{i}" for i in range(len(pi.occupied) + pi.empty_nodes)]
            layout[key] = (ids, pi.gpus_per_node)
            for nid, users in zip(ids, pi.occupied.values()):
                n = sum(n for j, n in users if j in kept)
                if n:
                    held.append({nid: list(range(n))})
        self.occ = Occupancy(Layout(layout))
        for i, pl in enumerate(held):
            self.occ.occupy(f"kept/{i}", pl)
        self._n = 0

    def take(self, key: tuple, units: int) -> bool:
        g = self.occ.gpus_per_node(key)
        pl = self.occ.find_shape(key, units // g, g) if units > g else self.occ.find_shape(key, 1, units)
        if pl is None:
            return False
        self._n += 1
        self.occ.hold(f"grid/{self._n}", pl)
        return True


def greedy_select(p: ClusterProblem, fixed: dict[int, int] | None = None, keep_running: bool = True) -> dict[int, int]:
    sel: dict[int, int] = dict(fixed or {})
    if keep_running:
        for k in np.flatnonzero(p.current):
            sel.setdefault(int(p.job_of[k]), int(k))
    kept = {j for j, k in sel.items() if p.current[k]}
    free = _Free(p, kept)
    # place what is already selected, largest first, as the placement step will
    for j, k in sorted(sel.items(), key=lambda jk: -p.units[jk[1]]):
        if not p.current[k] and not free.take(p.pool_of[k], int(p.units[k])):
            raise RuntimeError(f"fixed selection does not pack (job {p.job_ids[j]})")
    moved = sum(1 for j in np.flatnonzero(p.running) if j not in sel or not p.current[sel[j]])
    # each job's grids (ascending, as p.grids_of) found once: p.grids_of scans every grid, which at
    # 10,000 jobs x 173,000 grids made this loop most of the round's greedy start
    by_k = np.argsort(p.job_of, kind="stable")
    cut = np.searchsorted(p.job_of[by_k], np.arange(p.num_jobs + 1))
    of = [by_k[cut[j]:cut[j + 1]] for j in range(p.num_jobs)]
    density = np.full(p.num_jobs, -np.inf)  # best value per unit of each job's grids
    np.maximum.at(density, p.job_of, p.value / np.maximum(p.units, 1))
    order = [int(j) for j in np.argsort(-density, kind="stable") if int(j) not in sel and len(of[j])]
    for j in order:
        if p.running[j] and p.max_reconfigs is not None and moved > p.max_reconfigs:
            continue
        for k in sorted(of[j], key=lambda k: -p.value[k]):
            if p.value[k] <= 0 and not p.running[j]:
                break
            if p.current[k]:
                continue  # its GPUs were counted free above: it can only restart, not stay
            if free.take(p.pool_of[k], int(p.units[k])):
                sel[j] = int(k)
                break
    return sel
