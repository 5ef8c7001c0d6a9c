"""Greedy feasible selection: the fallback when the solver returns no incumbent, and the repair
step after shards are merged. Packs by the occupancy engine's rules (arena_opt/occupancy.py) on the
problem's per-node free counts, so its result is feasible by construction."""

from __future__ import annotations

import functools
import heapq
import time

import numpy as np

from arena_opt.milp.problem import ClusterProblem


class _Free:
    """The problem's free GPUs per node, for the greedy's takes, with the placement rules of
    `Occupancy.find_shape` (arena_opt/occupancy.py) on the problem's nodes: per pool one slot per node
    (occupied nodes first, then empty ones, all in one rack), the GPUs of the kept jobs held. Only
    counts are kept, and the takes only hold (never release), so each rule is a pointer or a heap:
    - a multi-node take gets the free whole nodes of smallest id (slot ids "POOL/i" in string order,
      `_fewest_racks` in one rack);
    - a sub-node take gets, of the nodes with the fewest free GPUs that fit, the one whose count changed
      least recently (an untouched whole node: the lowest slot).
    The same selections as the Occupancy packer (tests/test_greedy.py keeps it as the oracle), which
    scanned every whole free node of the pool per multi-node take: 2 s CPU of a 10,000-job variant."""

    def __init__(self, p: ClusterProblem, kept: set[int]):
        self.g: dict[tuple, int] = {}
        self.count: dict[tuple, list[int]] = {}
        self.stamp: dict[tuple, list[int]] = {}
        self.heaps: dict[tuple, list[list[tuple[int, int]]]] = {}  # free count -> (stamp, slot), lazily
        self.whole: dict[tuple, int] = {}  # number of untouched nodes
        self.by_id: dict[tuple, tuple[int, ...]] = {}  # slots in string order of their id
        self.at_id: dict[tuple, int] = {}  # first position of by_id that may still be whole
        self.at_slot: dict[tuple, int] = {}  # lowest slot that may still be whole
        self.homes: dict[int, list[tuple[tuple, int, int]]] = {}  # running job -> (pool, slot, GPUs there)
        for key, pi in p.pools.items():
            g, n = pi.gpus_per_node, len(pi.occupied) + pi.empty_nodes
            self.g[key], self.count[key], self.stamp[key] = g, [g] * n, list(range(n))
            self.heaps[key] = [[] for _ in range(g + 1)]
            self.by_id[key] = _by_id(n)
            self.at_id[key] = self.at_slot[key] = 0
            self.whole[key] = n
            homes = self.homes
            for i, users in enumerate(pi.occupied.values()):
                held = 0
                for j, m in users:
                    if j in kept:
                        held += m
                    if j in homes:
                        homes[j].append((key, i, m))
                    else:
                        homes[j] = [(key, i, m)]
                if held:
                    self._move(key, i, held, None)
        self._clock = sum(len(c) for c in self.count.values())  # as Occupancy's: after every first stamp
        # per pool, the fewest units a take failed for: free capacity only shrinks here (holds, no
        # releases), and a shape that does not fit means no larger one does (a sub-node grid of u GPUs
        # finds no node with u free, so no whole free node either), so later takes of as many units or
        # more fail without a search
        self._fails: dict[tuple, int] = {}

    def _move(self, key: tuple, i: int, gpus: int, stamp: int | None) -> None:
        count = self.count[key]
        if count[i] == self.g[key]:
            self.whole[key] -= 1
        count[i] -= gpus
        if stamp is not None:
            self.stamp[key][i] = stamp
        heapq.heappush(self.heaps[key][count[i]], (self.stamp[key][i], i))

    def _hold(self, key: tuple, i: int, gpus: int) -> None:
        self._move(key, i, gpus, self._clock)
        self._clock += 1

    def _first_whole(self, key: tuple) -> int:
        count, g, i = self.count[key], self.g[key], self.at_slot[key]
        while count[i] != g:
            i += 1
        self.at_slot[key] = i
        return i

    def take(self, key: tuple, units: int) -> bool:
        if units >= self._fails.get(key, 1 << 62):
            return False
        g = self.g[key]
        if units // g > 1:
            k = units // g
            if self.whole[key] < k:
                self._fails[key] = units
                return False
            count, order, pos = self.count[key], self.by_id[key], self.at_id[key]
            for _ in range(k):
                while count[order[pos]] != g:
                    pos += 1
                self._hold(key, order[pos], g)
                pos += 1
            self.at_id[key] = pos
            return True
        need = min(units, g)
        count, stamp, heaps = self.count[key], self.stamp[key], self.heaps[key]
        for c in range(need, g):
            h = heaps[c]
            while h and (count[h[0][1]] != c or stamp[h[0][1]] != h[0][0]):
                heapq.heappop(h)  # a node that has changed since this entry
            if h:
                self._hold(key, h[0][1], need)
                return True
        if self.whole[key]:
            self._hold(key, self._first_whole(key), need)
            return True
        self._fails[key] = units
        return False

    def full(self) -> bool:
        """Every pool has had a take of one unit fail: no node has a free GPU (holds only, so for good)."""
        return len(self._fails) == len(self.g) and all(u <= 1 for u in self._fails.values())

    def stay(self, j: int) -> bool:
        """Running job j keeps its place: its GPUs on each of its nodes, if they are still free there."""
        home = self.homes.get(j, [])
        if not home or any(self.count[key][i] < m for key, i, m in home):
            return False
        for key, i, m in home:
            self._hold(key, i, m)
        return True


@functools.lru_cache(maxsize=64)
def _by_id(n: int) -> tuple[int, ...]:
    """Slots 0..n-1 in string order of their id ("POOL/i"): the same for every pool of n nodes, and only read."""
    return tuple(sorted(range(n), key=str))


def greedy_select(p: ClusterProblem, fixed: dict[int, int] | None = None, keep_running: bool = True,
                  price: np.ndarray | float = 0.0) -> dict[int, int]:
    """`price`: per grid, the worth of the node units it takes (`unit_prices`), taken off its gain when
    jobs and their grids are ranked, so that a job takes the smallest grid that earns nearly as much as
    its largest (a deadline met on 2 GPUs rather than 16) once GPUs are scarce."""
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
    gain = p.gain()  # the objective a grid adds, deadline and preemption penalties included
    score = gain - price * p.units
    # each job's grids, best score first (ties: ascending index), in one stable sort: p.grids_of scans
    # every grid, and a sort per job was most of a 150,000-job round's greedy
    by_k = np.lexsort((-score, p.job_of))
    cut = np.searchsorted(p.job_of[by_k], np.arange(p.num_jobs + 1))
    of = [by_k[cut[j]:cut[j + 1]].tolist() for j in range(p.num_jobs)]
    density = np.full(p.num_jobs, -np.inf)  # best gain per unit of each job's grids
    np.maximum.at(density, p.job_of, (gain if np.all(price == 0) else score) / np.maximum(p.units, 1))
    order = [int(j) for j in np.argsort(-density, kind="stable") if int(j) not in sel and len(of[j])]
    for j in order:
        if free.full():
            break  # no pool has a free GPU left: no take nor stay can succeed for any later job
        if p.running[j] and p.max_reconfigs is not None and moved > p.max_reconfigs:
            continue
        for k in of[j]:
            if gain[k] <= 0 and not p.running[j]:
                break
            if p.current[k]:
                if free.stay(j):  # its place, if no job placed before it took those GPUs
                    sel[j] = int(k)
                    break
                continue
            if free.take(p.pool_of[k], int(p.units[k])):
                sel[j] = int(k)
                break
    return sel



def unit_prices(p: ClusterProblem, rounds: int = 40) -> np.ndarray:
    """Per grid, a price per node unit of its pool: per pool the price at which the jobs, each taking
    its grid of the best gain less price x units (none when that is not positive), ask for about the
    pool's capacity (bisection per pool, all jobs re-choosing at once each round: vectorised, 0.3 s at
    173,000 grids). The Lagrangian prices of the pools' total capacity, without the node packing."""
    if not len(p.grids):
        return np.zeros(0)
    gain, units = p.gain(), p.units.astype(float)
    keys = list(p.pools)
    pos = {k: i for i, k in enumerate(keys)}
    pool = np.array([pos[k] for k in p.pool_of], dtype=np.int64)
    cap = np.array([p.pools[k].gpus_per_node * (p.pools[k].empty_nodes + len(p.pools[k].occupied)) for k in keys],
                   dtype=float)
    # the grids as a job x grid table, each row one job's grids in index order and padded with grids of
    # no gain (-inf), so that a round's choice is a row maximum and its first position (argmax): the
    # same picks and the same sums, in the same job order, as reading the grids in job order, without
    # the per-round concatenations (1 ms of a Philly round's 2)
    order = np.argsort(p.job_of, kind="stable")
    job = p.job_of[order]
    starts = np.flatnonzero(np.r_[True, job[1:] != job[:-1]])
    sizes = np.diff(np.r_[starts, len(order)])
    row = np.repeat(np.arange(len(starts)), sizes)
    col = np.arange(len(order)) - np.repeat(starts, sizes)
    shape = (len(starts), int(sizes.max()))
    gain_t, units_t, pool_t = np.full(shape, -np.inf), np.zeros(shape), np.zeros(shape, dtype=np.int64)
    gain_t[row, col], units_t[row, col], pool_t[row, col] = gain[order], units[order], pool[order]
    lo, hi = np.zeros(len(keys)), np.full(len(keys), float(np.max(gain / np.maximum(units, 1))))
    lam = (lo + hi) / 2
    base = np.arange(shape[0]) * shape[1]  # flat position of each row's first grid
    units_f, pool_f = units_t.ravel(), pool_t.ravel()
    for _ in range(rounds):
        score = gain_t - lam[pool_t] * units_t
        at = base + score.argmax(axis=1)
        # a job whose best is not positive takes none: its units count 0 (adding 0.0 changes no sum)
        taken = np.where(score.ravel().take(at) > 0, units_f.take(at), 0.0)
        over = np.bincount(pool_f.take(at), weights=taken, minlength=len(keys)) > cap
        lo, hi = np.where(over, lam, lo), np.where(over, hi, lam)
        lam = (lo + hi) / 2
    return lam[pool]



PRICE_SHARES = (0.35, 0.75)  # unit prices x these, tried in order: measured best on a 10,000-job / 40,960-GPU
#                              round (0.35: 31,864, optimum 33,112) and on a full 1,400-job / 768-GPU one
#                              (0.75: -34,904, optimum -31,154); at the pools' clearing prices (1.0) the
#                              greedy packing leaves capacity unused (24,721 and -202,414)


def greedy_variants(p: ClusterProblem) -> int:
    """How many greedy selections `greedy_start` makes when no deadline stops it."""
    return 1 if p.max_reconfigs is not None or not len(p.grids) else len(PRICE_SHARES) + 1


def greedy_start(p: ClusterProblem, until: float | None = None, runs_s: list[float] | None = None) -> dict[int, int]:
    """The best of several greedy selections: every job competing at the pools' unit prices
    (`unit_prices` x PRICE_SHARES), a running job staying only if its place is still free when its turn
    comes, and running jobs kept where they are with the free GPUs filled (`greedy_select`). The priced
    orders move or stop running jobs for reachable deadlines and run many jobs on small grids: at
    10,000 jobs they are 31,864 against the kept-first -187,461 (-2,504,472 when grids were ranked by
    value alone). `until`: a time.perf_counter() value after which no further variant is started when
    the last one would not end by it (the first always runs); `runs_s` gets each one's wall time. Under a cap on reconfigurations only the
    kept-first one (the competing orders do not count them)."""
    if p.max_reconfigs is not None or not len(p.grids):
        return greedy_select(p)
    prices = unit_prices(p)
    runs = [lambda f=f: greedy_select(p, keep_running=False, price=f * prices) for f in PRICE_SHARES]
    runs.append(lambda: greedy_select(p))
    best, best_obj = None, -np.inf
    for run in runs:
        t = time.perf_counter()
        if best is not None and until is not None and t + last > until:
            break
        sel = run()
        last = time.perf_counter() - t
        if runs_s is not None:
            runs_s.append(last)
        obj = p.objective(sel)
        if obj > best_obj:
            best, best_obj = sel, obj
    return best
