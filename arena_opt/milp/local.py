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
        cur_of = cur.tolist()
        index = {key: i for i, key in enumerate(p.pools)}
        pool_of = np.array([index[key] for key in p.pool_of], dtype=np.int64)
        new = ~p.current
        pinned: list[int] = []
        # a shared node's capacity depends on which of its running jobs stay (sel): kept apart, so that
        # another selection's capacities are a sum over the shared nodes, not a new packing
        self._shared: list[tuple[list[int], list[int], int, list[tuple[int, int]]]] = []
        for key, pi in p.pools.items():
            g, ths = pi.gpus_per_node, list(pi.thresholds)
            cs = [cols[(key, s)] for s in ths]
            th = np.array(ths)[None, :]
            single, own, held = 0, [], []  # nodes a running job holds alone: its current grid, its GPUs there
            for users in pi.occupied.values():
                if len(users) > 1:
                    pinned += [j for j, _ in users]
                    self._shared.append((cs, ths, g, users))
                    continue
                single += 1
                j, m = users[0]
                if cur_of[j] >= 0:
                    own.append(cur_of[j])
                    held.append(m)
            # the s-slots each such node's GPUs block, added per node as arrays (integers: exact in the
            # float vectors in any order; a numpy element update per node and threshold was most of
            # this constructor, 1.4 ms of a Philly round)
            if own:
                block = g - th * ((g - np.array(held)[:, None]) // th)
                np.add.at(self.vec, (np.array(own)[:, None], np.array(cs)[None, :]), block)
            ks = np.flatnonzero(new & (pool_of == index[key]))
            units = p.units[ks][:, None]
            self.vec[np.ix_(ks, cs)] = np.where(units >= th, units, 0)
            self.cap[cs] = g * (pi.empty_nodes + single)
        self.pinned[pinned] = True
        self._free_cap, self._cur = self.cap, cur_of
        self.cap = self.caps(sel)
        self.none = n

    def caps(self, sel: dict[int, int]) -> np.ndarray:
        """The capacity per pool threshold when `sel`'s running jobs on shared nodes are the ones kept."""
        cap = self._free_cap.copy()
        cur = self._cur  # a list: element reads in this loop, not numpy's
        for cs, ths, g, users in self._shared:
            kept = 0
            for j, held in users:
                if cur[j] >= 0 and sel.get(j) == cur[j]:
                    kept += held
            for c, s in zip(cs, ths):
                cap[c] += s * ((g - kept) // s)
        return cap

    def slack(self, sel: dict[int, int], cap: np.ndarray | None = None) -> np.ndarray:
        """Capacity left per pool threshold under `sel` (all >= 0 iff `sel` packs, for the kept status of
        the pinned jobs this packing was made with, or the capacities `cap`)."""
        at = np.full(len(self.pinned), self.none, dtype=np.int64)
        at[list(sel)] = list(sel.values())
        return (self.cap if cap is None else cap) - self.vec[at].sum(axis=0)


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
    mv = _Moves(pk.vec, gain, pk.vec.astype(np.int64) @ weights, m_job, m_to, at)
    rounds = singles = pairs = 0
    cut = False
    while rounds < max_rounds:
        if until is not None and time.perf_counter() >= until:
            cut = True
            break
        rounds += 1
        live, dg, dv = mv.live, mv.dg, mv.dv
        touched = np.zeros(p.num_jobs, dtype=bool)
        changed = False

        def apply(i: int) -> None:
            nonlocal slack
            slack = slack - dv[i]
            at[m_job[i]] = m_to[i]
            touched[m_job[i]] = True

        # moves that gain on their own, best first
        gaining = live & (dg > _EPS)
        fits = np.flatnonzero(gaining)
        fits = fits[np.all(dv[fits] <= slack + _EPS, axis=1)]
        for i in fits[np.argsort(-dg[fits], kind="stable")]:
            if not touched[m_job[i]] and np.all(dv[i] <= slack + _EPS):
                apply(i)
                singles += 1
                changed = True
        # pairs: a gaining move that needs room, paid for by a move of another job that makes it
        idle = ~touched[m_job]
        up = gaining & idle
        down = live & (dg <= _EPS) & mv.frees & idle
        if up.any() and down.any():
            u_pat, u_lists, u_best = mv.patterns(up)
            d_pat, d_lists, d_best = mv.patterns(down)
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
        mv.moved(np.flatnonzero(touched), at)
    if stats is not None:
        stats.update(rounds=rounds, singles=singles, pairs=pairs, cut=cut)
    return {int(j): int(at[j]) for j in range(p.num_jobs) if at[j] < n}


class _Moves:
    """Every move's gain change, vector change and pattern under the options `at`, kept across the rounds
    of `improve`: a round moves few jobs (10,000-job round: about 90 of 10,000), so only their moves are
    recomputed, with the same operations as recomputing all (the same values exactly).

    The pair search groups moves by pattern (their vector change's key), each pattern's moves by gain change,
    best first, ties by move index. Sorting the round's 100,000-200,000 moves so took most of a big round's
    time; the moves are kept instead in that order of gain change (`order`, merged with the moved jobs' new
    moves each round) and a pattern's key by its rank among the keys seen (`rank`, a 16-bit count where it
    fits): a round's grouping is then a filter of `order` and a stable counting sort on ranks."""

    def __init__(self, vec: np.ndarray, gain: np.ndarray, vkey: np.ndarray, m_job: np.ndarray,
                 m_to: np.ndarray, at: np.ndarray):
        self.vec, self.gain, self.vkey, self.m_job, self.m_to = vec, gain, vkey, m_job, m_to
        m = len(m_job)
        self.by_job = np.argsort(m_job, kind="stable")  # move indices, job by job
        self.job_start = np.searchsorted(m_job[self.by_job], np.arange(len(at) + 1))
        self.live = np.empty(m, dtype=bool)
        self.dg = np.empty(m)
        self.dv = np.empty((m, vec.shape[1]))
        self.dkey = np.empty(m, dtype=np.int64)
        self.frees = np.empty(m, dtype=bool)  # the move frees room in some pool threshold
        every = np.arange(m)
        self._set(every, at)
        self.keys = np.unique(self.dkey)  # every key seen, sorted: a key's rank orders as the key
        self.rank = self._ranks(self.dkey)
        self.order = np.argsort(-self.dg, kind="stable")

    def _set(self, rows: np.ndarray, at: np.ndarray) -> None:
        to, frm = self.m_to[rows], at[self.m_job[rows]]
        self.live[rows] = to != frm
        self.dg[rows] = self.gain[to] - self.gain[frm]
        dv = self.dv[rows] = self.vec[to] - self.vec[frm]
        self.dkey[rows] = self.vkey[to] - self.vkey[frm]
        self.frees[rows] = np.any(dv < -_EPS, axis=1)

    def _ranks(self, dkey: np.ndarray) -> np.ndarray:
        r = np.searchsorted(self.keys, dkey)
        return r.astype(np.uint16) if len(self.keys) <= 1 << 16 else r

    def moved(self, jobs: np.ndarray, at: np.ndarray) -> None:
        """The jobs `jobs` took new options (`at`): their moves' changes, ranks and places in `order`."""
        rows = np.sort(np.concatenate([self.by_job[self.job_start[j]:self.job_start[j + 1]] for j in jobs]))
        self._set(rows, at)
        new = self.dkey[rows]
        pos = np.searchsorted(self.keys, new)
        if np.any(pos >= len(self.keys)) or np.any(self.keys[np.minimum(pos, len(self.keys) - 1)] != new):
            self.keys = np.union1d(self.keys, new)
            self.rank = self._ranks(self.dkey)
        else:
            self.rank[rows] = pos
        # merge the moved rows, in (-gain change, index) order, into the others' order
        stay = np.ones(len(self.dg), dtype=bool)
        stay[rows] = False
        rest = self.order[stay[self.order]]
        add = rows[np.argsort(-self.dg[rows], kind="stable")]
        nd_rest, nd_add = -self.dg[rest], -self.dg[add]
        at_pos = np.searchsorted(nd_rest, nd_add, "left")
        tied = at_pos < np.searchsorted(nd_rest, nd_add, "right")
        if tied.any():
            # among equal gain changes the lower index comes first: ties are runs of `rest` sorted by index
            block = np.r_[0, np.cumsum(nd_rest[1:] != nd_rest[:-1])]
            m = len(self.dg)
            at_pos[tied] = np.searchsorted(block * m + rest, block[at_pos[tied]] * m + add[tied])
        self.order = np.insert(rest, at_pos, add)

    def patterns(self, mask: np.ndarray):
        """The moves of `mask` grouped by pattern, in key order: one representative move per pattern (its
        best), each pattern's moves best first (ties: lower index first), and each pattern's best gain
        change."""
        seq = self.order[mask[self.order]]
        seq = seq[np.argsort(self.rank[seq], kind="stable")]
        key = self.rank[seq]
        starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
        return seq[starts], np.split(seq, starts[1:]), self.dg[seq[starts]]
