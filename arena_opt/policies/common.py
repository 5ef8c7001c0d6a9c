"""Shared machinery of the baseline policies: per-job grid cache, GPU-level packing, the user's request.

Baselines place jobs themselves (they reason about concrete free GPUs, like the schedulers they
reproduce) and hand the placements to the shared Decision builder."""

from __future__ import annotations

import time
from abc import abstractmethod
from dataclasses import replace

from arena_opt.decision import Decision, SolverStats
from arena_opt.grids import Grid, Pool, job_grids, pools
from arena_opt.perf.estimator import GridShape, PerfEstimator
from arena_opt.policies.base import GridPolicy, build_decision
from arena_opt.milp.options import PolicyOptions
from arena_opt.snapshot import ClusterSnapshot, Job

Placement = dict[str, list[int]]


class GridCache:
    """All grids of a job (compact shapes, best pipeline depth), computed once per workload.

    `job_grids` walks the estimator for every pool, count and depth; jobs of the same workload on the
    same cluster have the same grids, so the walk happens once per (model, batch, limits)."""

    def __init__(self, estimator: PerfEstimator, max_gpus_default: int = 16):
        self.estimator = estimator
        self.max_gpus_default = max_gpus_default
        self._by_workload: dict[tuple, list[Grid]] = {}
        self._by_job: dict[str, tuple[tuple, dict[tuple[str, int], Grid]]] = {}
        self._current: dict[str, tuple] = {}
        self._nodes: list | None = None
        self._catalog: dict | None = None
        self._pool_sig: tuple = ()
        self.pools: dict[tuple, Pool] = {}

    def bind(self, snapshot: ClusterSnapshot) -> None:
        """Call once per snapshot: grids depend on the cluster's pools."""
        if self._nodes is snapshot.nodes and self._catalog is snapshot.gpu_catalog:
            return
        self.pools = pools(snapshot)
        sig = (tuple((k, len(p.node_ids)) for k, p in self.pools.items()),
               tuple(sorted((k, v.model_dump_json()) for k, v in snapshot.gpu_catalog.items())))
        if sig != self._pool_sig:
            self._by_workload.clear()
            self._by_job.clear()
            self._current.clear()
            self._pool_sig = sig
        self._nodes, self._catalog = snapshot.nodes, snapshot.gpu_catalog
        self._snapshot = snapshot
        self.node_of = {n.id: n for n in snapshot.nodes}

    def options(self, job: Job) -> dict[tuple[str, int], Grid]:
        """(gpu_type, num_gpus) -> the fastest grid of that type and count over the type's pools."""
        sig = (job.model if isinstance(job.model, str) else job.model.model_dump_json(), job.batch_size,
               tuple(job.allowed_gpu_types or ()), job.min_gpus, job.max_gpus)
        hit = self._by_job.get(job.id)
        if hit is not None and hit[0] == sig:
            return hit[1]
        base = self._by_workload.get(sig)
        if base is None:
            bare = job.model_copy(update={"running": None, "id": "_"})
            base = self._by_workload[sig] = job_grids(bare, self._snapshot, self.estimator,
                                                      max_gpus_default=self.max_gpus_default)
        out: dict[tuple[str, int], Grid] = {}
        for g in base:
            key = (g.shape.gpu_type, g.num_gpus)
            if key not in out or g.throughput > out[key].throughput:
                out[key] = replace(g, job_id=job.id)
        self._by_job[job.id] = (sig, out)
        return out

    def current(self, job: Job, snapshot: ClusterSnapshot) -> Grid | None:
        """The grid of the job's running allocation, flagged `current` (choosing it keeps the job)."""
        r = job.running
        if r is None or not r.placement:
            return None
        hit = self._current.get(job.id)
        if hit is not None and hit[0] is r.placement and hit[1] == r.plan:
            return hit[2]
        g = self._current_grid(job, r)
        self._current[job.id] = (r.placement, r.plan, g)
        return g

    def _current_grid(self, job: Job, r) -> Grid | None:
        first = self.node_of[next(iter(r.placement))]
        pool_key = (first.gpu_type, first.num_gpus, first.intra_link)
        per_node = max(len(g) for g in r.placement.values())
        shape = GridShape(first.gpu_type, len(r.placement), per_node, r.plan.pp)
        for g in self.options(job).values():
            if g.pool == pool_key and g.shape == shape:
                return replace(g, current=True)
        spec = self._snapshot.catalog[first.gpu_type]
        plans = self.estimator.grid(job.arch, job.batch_size, spec, first.intra_link, shape)
        if plans.proxy is None:
            return None
        return Grid(job.id, pool_key, shape, plans.proxy, tuple(plans.pareto), True)


def requested_grid(job: Job, options: dict[tuple[str, int], Grid]) -> Grid | None:
    """The user's request as a grid: requested type and count at compact locality.

    When that grid is infeasible (the measured table lacks it, or it does not fit in memory) the
    nearest feasible count on the requested type is used, larger first (Arena's simulator likewise
    substitutes a neighbouring table entry). No requested type, or none of its grids is feasible:
    the fastest type at that count, else the nearest count on the fastest type."""
    if not options:
        return None
    n = job.requested_num_gpus or job.min_gpus
    types = sorted({t for t, _ in options})
    if job.requested_gpu_type not in types:
        at_n = [options[(t, n)] for t in types if (t, n) in options]
        if at_n:
            return max(at_n, key=lambda g: g.throughput)
        t = max(types, key=lambda t: (max(g.throughput for (tt, _), g in options.items() if tt == t), t))
    else:
        t = job.requested_gpu_type
        if (t, n) in options:
            return options[(t, n)]
    counts = sorted(c for tt, c in options if tt == t)
    larger = [c for c in counts if c > n]
    return options[(t, larger[0] if larger else counts[-1])]


class Packing:
    """Free GPUs per node with the rules of `placement.place`: sub-node grids best-fit into one node
    (the job's previous node first), multi-node grids take whole free nodes."""

    _static: tuple = (None, None)  # (pool_map, its node index), shared by every Packing of a round

    def __init__(self, snapshot: ClusterSnapshot, pool_map: dict[tuple, Pool],
                 held: dict[str, Placement] | None = None):
        if Packing._static[0] is not pool_map:
            node_pool, node_pos, cap, ranges = {}, {}, {}, {}
            for key, p in pool_map.items():
                cap[key] = p.gpus_per_node
                ranges[key] = list(range(p.gpus_per_node))
                for i, nid in enumerate(p.node_ids):
                    node_pool[nid] = key
                    node_pos[nid] = i
            Packing._static = (pool_map, (node_pool, node_pos, cap, ranges))
        self.node_pool, self.node_pos, self.cap, ranges = Packing._static[1]
        self.pool_map = pool_map
        self.free_count = {key: [p.gpus_per_node] * len(p.node_ids) for key, p in pool_map.items()}
        self.free_total = {key: p.num_gpus for key, p in pool_map.items()}  # sum of free_count, kept in step
        self._ranges = ranges
        self.free: dict[str, list[int]] = {}  # free GPU indices of the nodes touched so far (see gpus_free)
        self.where: dict[str, Placement] = {}
        self.node_jobs: dict[str, set[str]] = {}
        self._journal: list[tuple[str, str, Placement]] | None = None
        for jid, pl in (held or {}).items():
            for nid, gpus in pl.items():
                fl = self.gpus_free(nid)
                for g in gpus:
                    fl.remove(g)
                self.free_count[self.node_pool[nid]][self.node_pos[nid]] -= len(gpus)
                self.free_total[self.node_pool[nid]] -= len(gpus)
                self.node_jobs.setdefault(nid, set()).add(jid)
            self.where[jid] = pl

    def gpus_free(self, nid: str) -> list[int]:
        """Free GPU indices of a node; lists are made on first touch (a round touches few nodes)."""
        fl = self.free.get(nid)
        if fl is None:
            fl = self.free[nid] = self._ranges[self.node_pool[nid]][:]
        return fl

    def copy(self) -> "Packing":
        c = object.__new__(Packing)
        c.pool_map, c.node_pool, c.node_pos, c.cap = self.pool_map, self.node_pool, self.node_pos, self.cap
        c._ranges = self._ranges
        c.free_count = {k: v[:] for k, v in self.free_count.items()}
        c.free_total = dict(self.free_total)
        c.free = {k: v[:] for k, v in self.free.items()}
        c.where = dict(self.where)
        c.node_jobs = {k: set(v) for k, v in self.node_jobs.items() if v}
        c._journal = None
        return c

    def mark(self) -> int:
        """Start (or continue) recording holds and releases; `rollback(mark)` undoes those after it."""
        if self._journal is None:
            self._journal = []
        return len(self._journal)

    def rollback(self, mark: int) -> None:
        journal, self._journal = self._journal, None  # undo without recording
        while len(journal) > mark:
            op, jid, pl = journal.pop()
            if op == "hold":
                self.release(jid)
            else:
                self.hold(jid, pl)
        self._journal = journal

    def jobs_on(self, nid: str) -> set[str]:
        return self.node_jobs.get(nid, set())

    def free_gpus(self, pool_key: tuple) -> int:
        return self.free_total[pool_key]

    def free_nodes(self, pool_key: tuple) -> int:
        cap = self.cap[pool_key]
        return sum(1 for c in self.free_count[pool_key] if c == cap)

    def hold(self, job_id: str, placement: Placement) -> None:
        for nid, gpus in placement.items():
            fl = self.gpus_free(nid)
            for g in gpus:
                fl.remove(g)
            self.free_count[self.node_pool[nid]][self.node_pos[nid]] -= len(gpus)
            self.free_total[self.node_pool[nid]] -= len(gpus)
            self.node_jobs.setdefault(nid, set()).add(job_id)
        self.where[job_id] = placement
        if self._journal is not None:
            self._journal.append(("hold", job_id, placement))

    def release(self, job_id: str) -> Placement | None:
        placement = self.where.pop(job_id, None)
        if placement is None:
            return None
        for nid, gpus in placement.items():
            self.free[nid] = sorted(self.gpus_free(nid) + list(gpus))
            self.free_count[self.node_pool[nid]][self.node_pos[nid]] += len(gpus)
            self.free_total[self.node_pool[nid]] += len(gpus)
            self.node_jobs[nid].discard(job_id)
        if self._journal is not None:
            self._journal.append(("release", job_id, placement))
        return placement

    def find(self, grid: Grid, prev: Placement | None = None) -> Placement | None:
        key = grid.pool
        fc = self.free_count.get(key)
        if fc is None or self.free_total[key] < grid.node_units(self.cap[key]):
            return None
        ids = self.pool_map[key].node_ids
        cap = self.cap[key]
        if grid.multi_node:
            k = grid.shape.nodes
            whole = [ids[i] for i, c in enumerate(fc) if c == cap]
            if len(whole) < k:
                return None
            if prev:
                whole.sort(key=lambda n: n not in prev)
            return {nid: self.gpus_free(nid)[: grid.shape.gpus_per_node] for nid in whole[:k]}
        n = grid.num_gpus
        if prev:
            for nid in prev:
                if self.node_pool.get(nid) == key and fc[self.node_pos[nid]] >= n:
                    return {nid: self.gpus_free(nid)[:n]}
        best, best_c = -1, cap + 1
        for i, c in enumerate(fc):
            if n <= c < best_c:  # tightest node, lowest id on ties
                best, best_c = i, c
                if c == n:
                    break
        if best < 0:
            return None
        nid = ids[best]
        return {nid: self.gpus_free(nid)[:n]}

    def take(self, job_id: str, grid: Grid, prev: Placement | None = None) -> Placement | None:
        pl = self.find(grid, prev)
        if pl is not None:
            self.hold(job_id, pl)
        return pl


class PackedPolicy(GridPolicy):
    """A grid policy that places jobs itself while it decides (see module doc)."""

    name = "packed"

    def __init__(self, options: PolicyOptions | dict | None = None, estimator: PerfEstimator | None = None):
        super().__init__(options, estimator)
        # places jobs itself, without the co-location model (options.colocation unused, est_slowdown null)
        self.reconfig = self.options.reconfig
        self.cache = GridCache(self.estimator)
        self._requested: dict[str, tuple] = {}

    def decide(self, snapshot: ClusterSnapshot) -> Decision:
        t0 = time.perf_counter()
        self.cache.bind(snapshot)
        chosen, placements, reasons, stats = self.plan(snapshot)
        stats.total_s = time.perf_counter() - t0
        stats.num_grids = len(chosen)
        return build_decision(snapshot, self.name, chosen, placements, reasons, stats, options=self._options_json)

    def requested(self, job: Job) -> Grid | None:
        """`requested_grid` of the job, computed once per job."""
        opts = self.cache.options(job)
        hit = self._requested.get(job.id)
        if hit is None or hit[0] is not opts:
            hit = self._requested[job.id] = (opts, requested_grid(job, opts))
        return hit[1]

    def choose(self, snapshot: ClusterSnapshot):
        self.cache.bind(snapshot)
        chosen, _, reasons, stats = self.plan(snapshot)
        return chosen, reasons, stats

    @abstractmethod
    def plan(self, snapshot: ClusterSnapshot) -> tuple[dict[str, Grid], dict[str, Placement], dict[str, str],
                                                       SolverStats]:
        """Chosen grid and placement per job that runs, a reason per job that does not, stats."""

    # helpers shared by the subclasses
    def start_state(self, snapshot: ClusterSnapshot) -> tuple[Packing, dict[str, Grid], dict[str, Placement]]:
        """Packing with every running job held where it is, and each running job's current grid and
        placement."""
        chosen: dict[str, Grid] = {}
        placements: dict[str, Placement] = {}
        for j in snapshot.jobs:
            if j.running is None:
                continue
            g = self.cache.current(j, snapshot)
            if g is None:  # the estimate says the running allocation is infeasible: let it go
                continue
            chosen[j.id] = g
            placements[j.id] = {nid: sorted(gs) for nid, gs in j.running.placement.items()}
        return Packing(snapshot, self.cache.pools, placements), chosen, placements


def place_changes(pack: Packing, chosen: dict[str, Grid], current: dict[str, Grid], held: dict[str, Placement],
                  fallback: dict[str, Grid] | None = None) -> tuple[dict[str, Grid], dict[str, Placement], dict[str, str]]:
    """Place a round's choice on `pack`, which holds every running job where it runs (the state
    `start_state` returns). Kept jobs stay; running jobs that change go first, largest first, then
    new jobs, largest first (a new job falls back to its `fallback` grid). A running job whose new
    grid cannot be placed is pinned where it was and the placement starts over, so policies that
    never preempt do not preempt by accident of fragmentation."""
    fallback = fallback or {}
    pinned: set[str] = set()
    start = pack.mark()
    while True:
        kept = {j: held[j] for j, g in chosen.items() if g.current or j in pinned}
        for j in current:
            if j not in kept:
                pack.release(j)
        out = {j: (current[j] if j in pinned else chosen[j]) for j in kept}
        placements = dict(kept)
        reasons: dict[str, str] = {}
        movers = sorted((j for j in chosen if j not in kept), key=lambda j: (j not in current, -chosen[j].num_gpus, j))
        retry = False
        for j in movers:
            pl = pack.take(j, chosen[j], held.get(j))
            if pl is None and j in fallback:
                pl = pack.take(j, fallback[j])
                if pl is not None:
                    out[j], placements[j] = fallback[j], pl
                    continue
            if pl is not None:
                out[j], placements[j] = chosen[j], pl
            elif j in current:
                pinned.add(j)
                retry = True
                break
            else:
                reasons[j] = "GPUs fragmented: no placement this round"
        if not retry:
            return out, placements, reasons
        pack.rollback(start)


def fifo(jobs: list[Job]) -> list[Job]:
    return sorted(jobs, key=lambda j: (j.submit_time, j.id))


def admit_fifo(snapshot: ClusterSnapshot, pack: Packing, current: dict[str, Grid], offers):
    """Admission in submission order. `offers(job, current grid or None)` returns (the options the
    job may be assigned, the grids to try placing it on in order, (why no option, why none fits)).
    A running job is admitted with its options as they are; a newcomer only if one of its tries is
    free now (it is then tentatively placed). Returns (admitted, tentative, reasons)."""
    admitted: dict[str, list[Grid]] = {}
    tentative: dict[str, Grid] = {}
    reasons: dict[str, str] = {}
    for job in fifo(snapshot.jobs):
        opts, tries, why = offers(job, current.get(job.id))
        if job.id in current:
            admitted[job.id] = opts
            continue
        if not opts:
            reasons[job.id] = why[0]
            continue
        for g in tries:
            if pack.take(job.id, g) is not None:
                admitted[job.id] = opts
                tentative[job.id] = g
                break
        else:
            reasons[job.id] = why[1]
    return admitted, tentative, reasons

