"""Local improvement of a feasible selection: single-job moves and pairs of moves, vectorised.

The objective is a constant plus the sum of the chosen grids' gains (`ClusterProblem.gain`), and with
the kept status of the running jobs on shared nodes fixed, feasibility is linear: every option of a job
(a grid, or none) takes a vector of pool-threshold units (problem.py's exact packing rows: a new grid its
units at every threshold s <= units, a running job's current grid on nodes it holds alone the s-slots
its GPUs block there), and the selection is feasible iff the sum of its vectors stays under the pools'
capacities. So a move (one job from one option to another) has a gain change and a vector change, and a
pair of moves of two jobs is feasible iff their vector changes add up to no more than the slack.

Moves with equal vector changes form a pattern (few: a move's vector depends only on the pools and unit
sizes it leaves and enters), so pairs are searched pattern by pattern, not move by move: an upgrade of
one job paid for by a downgrade, a move to another pool or an eviction of another, best pairs first.
Every applied move keeps the selection feasible and raises the objective; the search stops when no
move or pair gains or at the deadline.
"""

from __future__ import annotations

import time

import numpy as np

from arena_opt.milp.problem import ClusterProblem

_EPS = 1e-9


class Packing:
    """Pool-threshold vectors of every grid and the capacities they share (see the module docstring)."""

    def __init__(self, p: ClusterProblem, sel: dict[int, int]):
        cols: dict[tuple, int] = {}
        for key, pi in p.pools.items():
            for s in pi.thresholds:
                cols[(key, s)] = len(cols)
        n, t = len(p.grids), len(cols)
        self.vec = np.zeros((n + 1, t))  # the last row: no grid
        self.cap = np.zeros(t)
        self.pinned = np.zeros(p.num_jobs, dtype=bool)  # running jobs on shared nodes: their choice is fixed
        cur = np.full(p.num_jobs, -1, dtype=np.int64)
        cur[p.job_of[p.current]] = np.flatnonzero(p.current)
        first = {key: cols[(key, pi.thresholds[0])] for key, pi in p.pools.items()}
        pool_of = np.array([first[key] for key in p.pool_of], dtype=np.int64)
        new = ~p.current
        for key, pi in p.pools.items():
            g = pi.gpus_per_node
            ks = np.flatnonzero(new & (pool_of == first[key]))
            single = 0
            for users in pi.occupied.values():
                if len(users) > 1:
                    continue
                single += 1
                j, held = users[0]
                for s in pi.thresholds:
                    if cur[j] >= 0:
                        self.vec[cur[j], cols[(key, s)]] += g - s * ((g - held) // s)
            for s in pi.thresholds:
                c = cols[(key, s)]
                self.vec[ks, c] = np.where(p.units[ks] >= s, p.units[ks], 0)
                self.cap[c] = g * (pi.empty_nodes + single)
            for users in pi.occupied.values():
                if len(users) < 2:
                    continue
                kept = 0
                for j, held in users:
                    self.pinned[j] = True
                    if cur[j] >= 0 and sel.get(j) == cur[j]:
                        kept += held
                for s in pi.thresholds:
                    self.cap[cols[(key, s)]] += s * ((g - kept) // s)
        self.none = n

    def slack(self, sel: dict[int, int]) -> np.ndarray:
        """Capacity left per pool threshold under `sel` (all >= 0 iff `sel` packs, for the kept status of
        the pinned jobs this packing was made with)."""
        at = np.full(len(self.pinned), self.none, dtype=np.int64)
        at[list(sel)] = list(sel.values())
        return self.cap - self.vec[at].sum(axis=0)


def improve(p: ClusterProblem, sel: dict[int, int], until: float | None = None, max_rounds: int = 200,
            stats: dict | None = None) -> dict[int, int]:
    """A selection at least as good as the feasible `sel` (job -> grid), found by moves and pairs of moves
    until none gains or time.perf_counter() passes `until`. Under a cap on reconfigurations the selection
    comes back as it is (the moves do not count them). `stats` gets the rounds, moves and pairs made and
    `cut`: whether the deadline stopped the search before it ran out of gaining moves."""
    if stats is not None:
        stats.update(rounds=0, singles=0, pairs=0, cut=False)
    if p.max_reconfigs is not None or not len(p.grids):
        return dict(sel)
    if until is not None and time.perf_counter() >= until:
        if stats is not None:
            stats["cut"] = True
        return dict(sel)
    pk = Packing(p, sel)
    n = len(p.grids)
    gain = np.r_[p.gain(), 0.0]
    at = np.full(p.num_jobs, n, dtype=np.int64)  # each job's option: a grid, or n for none
    at[list(sel)] = list(sel.values())
    slack = pk.slack(sel)
    if np.any(slack < -_EPS):
        raise ValueError("improve needs a feasible selection")
    # every move: job -> one of its grids, or to none
    free = ~pk.pinned
    ks = np.flatnonzero(free[p.job_of])
    m_job = np.r_[p.job_of[ks], np.flatnonzero(free)]
    m_to = np.r_[ks, np.full(int(free.sum()), n)]
    # a vector change's pattern key: integer weights, so that equal changes get equal keys exactly (a
    # collision of two patterns costs nothing but a missed pair: every pair is checked on its own vectors)
    weights = np.random.default_rng(0).integers(1, 1 << 40, pk.vec.shape[1])
    vkey = pk.vec.astype(np.int64) @ weights
    rounds = singles = pairs = 0
    cut = False
    while rounds < max_rounds:
        if until is not None and time.perf_counter() >= until:
            cut = True
            break
        rounds += 1
        frm = at[m_job]
        live = m_to != frm
        dg = gain[m_to] - gain[frm]
        dv = pk.vec[m_to] - pk.vec[frm]
        dkey = vkey[m_to] - vkey[frm]
        touched = np.zeros(p.num_jobs, dtype=bool)
        changed = False

        def apply(i: int) -> None:
            nonlocal slack
            slack = slack - dv[i]
            at[m_job[i]] = m_to[i]
            touched[m_job[i]] = True

        # moves that gain on their own, best first
        fits = live & (dg > _EPS) & np.all(dv <= slack + _EPS, axis=1)
        for i in np.flatnonzero(fits)[np.argsort(-dg[fits], kind="stable")]:
            if not touched[m_job[i]] and np.all(dv[i] <= slack + _EPS):
                apply(i)
                singles += 1
                changed = True
        # pairs: a gaining move that needs room, paid for by a move of another job that makes it
        up = np.flatnonzero(live & (dg > _EPS) & ~touched[m_job])
        down = np.flatnonzero(live & (dg <= _EPS) & np.any(dv < -_EPS, axis=1) & ~touched[m_job])
        if len(up) and len(down):
            u_pat, u_lists, u_best = _patterns(up, dkey, dg)
            d_pat, d_lists, d_best = _patterns(down, dkey, dg)
            ok = np.all(dv[u_pat][:, None, :] + dv[d_pat][None, :, :] <= slack + _EPS, axis=2)
            value = np.where(ok, u_best[:, None] + d_best[None, :], -np.inf)
            for a, b in zip(*np.unravel_index(np.argsort(-value, axis=None), value.shape)):
                if value[a, b] <= _EPS:
                    break
                if until is not None and time.perf_counter() >= until:
                    cut = True
                    break
                ua, db = u_lists[a], d_lists[b]
                iu = idb = 0
                while iu < len(ua) and idb < len(db):
                    i, r = ua[iu], db[idb]
                    if touched[m_job[i]]:
                        iu += 1
                        continue
                    if touched[m_job[r]] or m_job[r] == m_job[i]:
                        idb += 1
                        continue
                    if dg[i] + dg[r] <= _EPS:
                        break
                    if not np.all(dv[i] + dv[r] <= slack + _EPS):
                        break
                    apply(i)
                    apply(r)
                    pairs += 1
                    changed = True
        if not changed:
            break
    if stats is not None:
        stats.update(rounds=rounds, singles=singles, pairs=pairs, cut=cut)
    return {int(j): int(at[j]) for j in range(p.num_jobs) if at[j] < n}


def _patterns(idx: np.ndarray, dkey: np.ndarray, dg: np.ndarray):
    """Moves `idx` grouped by their vector change (`dkey`): one representative move per pattern, each
    pattern's moves best first, and each pattern's best gain change."""
    key = dkey[idx]
    order = np.lexsort((-dg[idx], key))
    key, idx = key[order], idx[order]
    starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    lists = np.split(idx, starts[1:])
    return idx[starts], lists, dg[idx[starts]]
