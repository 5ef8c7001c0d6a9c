"""Arena's published heuristic (EuroSys'26, the artifact's "crius" scheduler), for comparing with
the paper's own system through the same interface.

Each round:
1. Waiting jobs in submission order. A job starts on its requested GPU type and count at its best
   locality when that is free; else partially used nodes are consolidated by migrating the jobs on
   the fewest nodes elsewhere; else a search of depth `depth` over modifications of running jobs
   (halve the GPU count of a job on the wanted type, move a job to another type with free GPUs,
   or halve the new job itself; the `breadth` cheapest modifications per step) applies the set
   with the largest total throughput gain that lets the job start. A job that still does not fit
   waits; later jobs that fit run opportunistically, and are preempted (latest first) when the
   earlier job can start with their GPUs.
2. Then, at most `max_upgrades` times, the single best upgrade (double a job's GPUs on its type,
   or move it to a faster type at its count) is applied while it raises the total throughput
   (raw samples/s summed over jobs). Types where a job waits are left to that job.

The search is bounded (`max_searches` per round, one failed search per GPU type) where the
artifact needed 5-300 s per round."""

from __future__ import annotations

from dataclasses import replace
from itertools import combinations

from arena_opt.decision import SolverStats
from arena_opt.grids import Grid
from arena_opt.occupancy import Occupancy, Placement
from arena_opt.policies.common import PackedPolicy, fifo
from arena_opt.policies.options import ArenaGreedyOptions


class ArenaGreedyPolicy(PackedPolicy):
    name = "arena-greedy"
    Options = ArenaGreedyOptions
    options: ArenaGreedyOptions

    def __init__(self, options: ArenaGreedyOptions | dict | None = None, estimator=None):
        super().__init__(options, estimator)
        o = self.options
        self.depth, self.breadth, self.max_upgrades, self.max_searches = o.depth, o.breadth, o.max_upgrades, o.max_searches
        # job -> (its options, its grid, the blocked types, its upgrades): most jobs keep all three round
        # after round, and the upgrade loop asks for every job's upgrades up to max_upgrades times a round
        # (see `_upgrades`)
        self._known: dict[str, tuple[dict, Grid, frozenset[str], list[Grid]]] = {}

    def plan(self, snapshot):
        pack, alloc, held = self.start_state(snapshot)
        self.jobs = {j.id: j for j in snapshot.jobs}
        self.alloc = alloc  # job -> grid it runs on after this round (current ones keep their flag)
        reasons: dict[str, str] = {}
        blocked: set[str] = set()  # GPU types on which an earlier job waits
        failed_search: set[str] = set()
        searches = 0
        pack.mark()  # the building blocks try changes and roll back the ones that do not work
        for job in fifo([j for j in snapshot.jobs if j.id not in alloc]):
            target = self.requested(job)
            if target is None:
                reasons[job.id] = self.no_grid(job)
                continue
            t = target.shape.gpu_type
            grid = self._fit(pack, job.id, target)
            if grid is None:
                grid = self._consolidate(pack, job.id, target)
            if grid is None and t not in failed_search and searches < self.max_searches:
                searches += 1
                grid = self._search(pack, job, target)
                if grid is None:
                    failed_search.add(t)
            if grid is None:
                grid = self._preempt_later(pack, job, target, reasons)
            if grid is None:
                blocked.add(t)
                reasons[job.id] = f"{target.num_gpus} x {t} not available (waits first in line for {t})"
                continue
            alloc[job.id] = grid
        self._upgrades(pack, blocked)
        placements = {j: pack.where[j] for j in alloc}
        chosen = {j: self._flag(j, g, placements[j], held.get(j)) for j, g in alloc.items()}
        return chosen, placements, reasons, SolverStats(solver="greedy", status="ok", note=f"{searches} searches")

    # ---- building blocks: each changes `pack` in place on success and leaves it as it was otherwise ----
    @staticmethod
    def _fit(pack: Occupancy, jid: str, grid: Grid) -> Grid | None:
        return grid if pack.take(jid, grid) is not None else None

    def _consolidate(self, pack: Occupancy, jid: str, grid: Grid, changed: dict[str, Grid] | None = None):
        """Clear the cheapest node(s) of the grid's pool by migrating their sub-node jobs elsewhere.
        `changed`: grids of jobs already modified in `pack` but not yet in `self.alloc`."""
        alloc = {**self.alloc, **changed} if changed else self.alloc
        key = grid.pool
        if pack.free_gpus(key) < grid.num_gpus:
            return None
        ids = pack.nodes(key)
        cap = pack.gpus_per_node(key)
        need_nodes = grid.shape.nodes if grid.multi_node else 1
        need = cap if grid.multi_node else grid.num_gpus

        def movable(nid):  # sub-node jobs only: whole-node jobs stay
            return all(not alloc[j].multi_node for j in pack.jobs_on(nid))

        # cheapest nodes first: fewest GPUs to move off them
        cands = sorted((need - pack.node_free(nid), nid) for nid in ids if movable(nid))
        if grid.multi_node:
            tries = [[nid for _, nid in cands[:need_nodes]]] if len(cands) >= need_nodes else []
        else:
            tries = [[nid] for cost, nid in cands if cost > 0][:4]
        for target_nodes in tries:
            m = pack.mark()
            evict = sorted({j for n in target_nodes for j in pack.jobs_on(n)}, key=lambda j: (-alloc[j].num_gpus, j))
            if not grid.multi_node:  # move the fewest jobs: largest first, until the job fits
                free = pack.node_free(target_nodes[0])
                keep = []
                for j in evict:
                    if free >= need:
                        keep.append(j)
                    else:
                        free += alloc[j].num_gpus
                evict = [j for j in evict if j not in keep]
            for j in evict:
                pack.release(j)
            per = grid.shape.gpus_per_node if grid.multi_node else grid.num_gpus
            pack.hold(jid, {n: pack.gpus_free(n)[:per] for n in target_nodes}, grid)
            ok = True
            for j in evict:
                if pack.take(j, alloc[j]) is None:
                    ok = False
                    break
            if ok:
                return grid
            pack.rollback(m)
        return None

    def _mods(self, pack: Occupancy, job, target: Grid) -> list[tuple[float, str, Grid]]:
        """Candidate modifications (throughput lost, job, its new grid), cheapest first."""
        out: list[tuple[float, str, Grid]] = []
        t = target.shape.gpu_type
        for j, g in self.alloc.items():
            if g.shape.gpu_type != t:
                continue
            jo = self.grid_options(self.jobs[j])
            half = jo.get((t, g.num_gpus // 2)) if g.num_gpus > 1 else None
            if half is not None:
                out.append((g.throughput - half.throughput, j, half))
            for (t2, c), g2 in jo.items():
                if t2 != t and c == g.num_gpus and pack.fits(g2):
                    out.append((g.throughput - g2.throughput, j, g2))
        half = self.grid_options(job).get((t, target.num_gpus // 2)) if target.num_gpus > 1 else None
        if half is not None:
            out.append((target.throughput - half.throughput, job.id, half))
        out.sort(key=lambda m: (m[0], m[1]))
        return out[: self.breadth]

    def _search(self, pack: Occupancy, job, target: Grid) -> Grid | None:
        mods = self._mods(pack, job, target)
        best = None
        for d in range(1, self.depth + 1):
            for combo in combinations(mods, d):
                if len({m[1] for m in combo}) < d:
                    continue
                # a set that cannot gain more than the best is not tried: only with nothing registered
                # with the contention, whose placement order a try and its rollback would change
                if best is not None and pack.no_contention and _gain(job.id, target, combo)[1] <= best[1]:
                    continue
                m = pack.mark()
                res = self._apply_mods(pack, job.id, target, combo)
                pack.rollback(m)
                if res is not None and (best is None or res[1] > best[1]):
                    best = (combo, res[1])
        if best is None:
            return None
        grid, _ = self._apply_mods(pack, job.id, target, best[0])  # replay the winner for real
        for _, j, g in best[0]:
            if j != job.id:
                self.alloc[j] = g
        return grid

    def _apply_mods(self, pack: Occupancy, jid: str, target: Grid, combo) -> tuple[Grid, float] | None:
        """Apply a set of modifications and place the job; (its grid, total throughput gain) or None
        (then `pack` may be half changed: the caller rolls back)."""
        changed: dict[str, Grid] = {}
        for _, j, g in combo:
            if j == jid:
                continue
            old = pack.release(j)
            if pack.take(j, g, old) is None:
                return None
            changed[j] = g
        grid, gain = _gain(jid, target, combo)
        if self._fit(pack, jid, grid) is None and self._consolidate(pack, jid, grid, changed) is None:
            return None
        return grid, gain

    def _preempt_later(self, pack: Occupancy, job, target: Grid, reasons: dict[str, str]) -> Grid | None:
        """Preempt jobs submitted after this one on the wanted pool, latest first, if that lets it start."""
        victims = sorted((j for j, g in self.alloc.items()
                          if g.pool == target.pool and self.jobs[j].submit_time > job.submit_time),
                         key=lambda j: (-self.jobs[j].submit_time, j))
        if not victims:
            return None
        m = pack.mark()
        for k, v in enumerate(victims):
            pack.release(v)
            if self._fit(pack, job.id, target) is not None:
                for f in victims[: k + 1]:
                    del self.alloc[f]
                    reasons[f] = f"preempted: earlier job {job.id} takes its GPUs"
                return target
        pack.rollback(m)
        return None

    def _upgrades(self, pack: Occupancy, blocked: set[str]) -> None:
        # last round's upgrades stand for the jobs whose options and blocked types are the same
        self._known = {j: hit for j, hit in self._known.items()
                       if j in self.alloc and hit[0] is self.grid_options(self.jobs[j]) and hit[2] == blocked}
        for _ in range(self.max_upgrades):
            best = None
            for j, g in self.alloc.items():
                for g2 in self._upgrade_grids(j, g, blocked):
                    gain = g2.throughput - g.throughput
                    if gain <= 0 or (best is not None and gain <= best[0]):
                        continue
                    if pack.fits_released(g2, j):  # would it fit with the job's own GPUs given back?
                        best = (gain, j, g2)
            if best is None:
                return
            _, j, g2 = best
            pack.take(j, g2, pack.release(j))
            self.alloc[j] = g2

    def _upgrade_grids(self, j: str, g: Grid, blocked: set[str]) -> list[Grid]:
        """Upgrades of job j on grid g, in the order they are weighed: double its GPUs, then a faster type
        at its count; none on types in `blocked` (those of this round's `_upgrades`)."""
        hit = self._known.get(j)
        if hit is not None and hit[1] is g:
            return hit[3]
        jo = self.grid_options(self.jobs[j])
        t = g.shape.gpu_type
        cands = []
        up = jo.get((t, g.num_gpus * 2))
        if up is not None and t not in blocked:
            cands.append(up)
        cands += [g2 for (t2, c), g2 in jo.items()
                  if c == g.num_gpus and t2 != t and t2 not in blocked and g2.throughput > g.throughput]
        self._known[j] = (jo, g, frozenset(blocked), cands)
        return cands

    def _flag(self, jid: str, grid: Grid, placement: Placement, prev: Placement | None) -> Grid:
        """A job left on exactly its old GPUs with its old grid keeps running (`current`); a job that
        moved loses the flag and is migrated."""
        if grid.current and placement != prev:
            return replace(grid, current=False)
        return grid


def _gain(jid: str, target: Grid, combo) -> tuple[Grid, float]:
    """The grid a set of modifications starts job `jid` on (`target`, or its own halving) and the total
    throughput gain if it starts (known before trying: the set fixes every grid)."""
    grid, lost = target, 0.0
    for loss, j, g in combo:
        lost += loss
        if j == jid:
            grid = g
    return grid, grid.throughput - lost
