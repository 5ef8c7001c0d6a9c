"""Grids: the joint (GPU type, GPU count and node shape, pipeline depth) options of each job,
each with its proxy plan from the planner. Level 1 chooses among these; the baselines choose a
(type, count) among them. `GridCatalog` is the only place they are computed and cached."""

from __future__ import annotations

import weakref
from collections import defaultdict
from dataclasses import dataclass, field
from functools import cached_property
from typing import Callable

import numpy as np

from arena_opt.gpus import GpuSpec
from arena_opt.perf.band import BandModel
from arena_opt.perf.estimator import GridShape, PerfEstimator
from arena_opt.perf.planner import GridPlans, PlanResult
from arena_opt.snapshot import ClusterSnapshot, Job, Node
from models.catalog import Arch


@dataclass(frozen=True)
class Pool:
    """Interchangeable nodes: same GPU type, GPUs per node and intra-node link."""

    gpu_type: str
    gpus_per_node: int
    intra_link: str | None
    node_ids: tuple[str, ...]

    @property
    def key(self) -> tuple[str, int, str | None]:
        return (self.gpu_type, self.gpus_per_node, self.intra_link)

    @property
    def num_gpus(self) -> int:
        return self.gpus_per_node * len(self.node_ids)


@dataclass(frozen=True)
class Grid:
    # the job it was made for; "" on the grids one workload's waiting jobs share (GridCatalog.grids):
    # whose a grid is in a round is the problem's job_of, not this
    job_id: str
    pool: tuple[str, int, str | None]
    shape: GridShape
    result: PlanResult
    pareto: tuple[PlanResult, ...] = field(default=(), compare=False)
    current: bool = False  # the job's running allocation: choosing it keeps the job where it is

    # cached: the baselines read these of every option of every job every round (sia: millions of reads
    # over Arena's Philly trace), and a grid's shape and result never change
    @cached_property
    def num_gpus(self) -> int:
        return self.shape.num_gpus

    @cached_property
    def multi_node(self) -> bool:  # read for every running job of every round (the contention's may-share test)
        return self.shape.nodes > 1

    @cached_property
    def throughput(self) -> float:
        return self.result.throughput

    def node_units(self, gpus_per_node: int) -> int:
        """GPUs this grid takes from its pool's nodes: whole nodes when it spans several."""
        return self.shape.nodes * gpus_per_node if self.multi_node else self.shape.num_gpus

    @cached_property
    def columns(self) -> tuple[float, int, bool, int]:
        """(throughput, GPUs, current, node units in its pool): what every round's problem arrays read of
        it. Computed once: a running job's grids and a workload's shared ones are the same objects round
        after round (GridCatalog), and a simulated round read four properties of each of ~1,500 grids
        twice (workload_ranking and build_problem)."""
        return (self.result.throughput, self.shape.num_gpus, self.current, self.node_units(self.pool[1]))


def pools(snapshot: ClusterSnapshot) -> dict[tuple, Pool]:
    groups: dict[tuple, list[Node]] = defaultdict(list)
    for n in snapshot.nodes:
        groups[(n.gpu_type, n.num_gpus, n.intra_link)].append(n)
    return {k: Pool(k[0], k[1], k[2], tuple(n.id for n in v)) for k, v in sorted(groups.items(), key=lambda kv: str(kv[0]))}


def gpu_counts(job: Job, pool: Pool, max_gpus_default: int) -> list[int]:
    hi = min(job.max_gpus or max_gpus_default, pool.num_gpus)
    out, n = [], 1
    while n <= hi:
        if n >= job.min_gpus and (n <= pool.gpus_per_node or n % pool.gpus_per_node == 0):
            out.append(n)
        n *= 2
    return out


def compact_shape(n: int, gpus_per_node: int) -> tuple[int, int]:
    return (1, n) if n <= gpus_per_node else (n // gpus_per_node, gpus_per_node)


class GridCatalog:
    """The one place where a job's grids and their estimated speeds are computed and cached.

    Every user asks the estimator's catalogue (`GridCatalog.of(estimator)`): the policies, the
    simulator's truth lookups, `arena-opt plan`, the plan-cache warmers and the live loop (through its
    policy). Entries hold for one `PerfEstimator.version`; `observe()` bumps it and the next lookup
    starts over, so an online correction reaches every policy at once, whatever snapshot comes next.

    A workload's options (every pipeline depth per pool and power-of-two count) are computed once per
    (model, batch, limits, cluster pools); a round only stamps a job id and the running grid on them."""

    _of: "weakref.WeakKeyDictionary[PerfEstimator, dict[float | None, GridCatalog]]" = weakref.WeakKeyDictionary()

    @classmethod
    def of(cls, estimator: PerfEstimator, caution: float | None = None) -> "GridCatalog":
        """`caution`: the quantile of each estimate's error band that its grid is priced at (policies
        pass their `PolicyOptions.caution`); None, or an estimator without a band, prices the estimate
        itself (the simulator's truth)."""
        per = cls._of.get(estimator)
        if per is None:
            per = cls._of[estimator] = {}
        cat = per.get(caution)
        if cat is None:
            cat = per[caution] = cls(estimator, caution)
        return cat

    def __init__(self, estimator: PerfEstimator, caution: float | None = None):
        self._estimator = weakref.ref(estimator)  # the catalogue must not keep its estimator alive
        self.caution = caution
        self._version = estimator.version
        self._plans: dict[tuple, GridPlans] = {}
        self._workloads: dict[tuple, WorkloadOptions] = {}
        self._by_job: dict[str, tuple] = {}  # job id -> (its workload entry, options by (type, count))
        self._current: dict[str, tuple] = {}  # job id -> (entry, placement, plan, running grid)
        # job id -> (what its workload entry depends on, the entry, its derived views by name): a round asks
        # for a job's entry several times (options, current grid, requested grid), each a workload key to build
        # and hash; the job's own fields compared with its last key are cheaper
        self._jobs: dict[str, tuple] = {}
        self._grids: dict[tuple, tuple] = {}  # (job id, prune) -> (entry, running state, its shape, grids)
        self._ahead: set[tuple] = set()  # workloads whose grid shapes were handed to the planner together
        self._cluster: _Cluster | None = None
        self._contexts: dict[tuple, int] = {}  # cluster context -> a small key for the workload entries

    @property
    def estimator(self) -> PerfEstimator:
        return self._estimator()

    def _fresh(self) -> None:
        """Drop everything computed under an older estimator version."""
        v = self._estimator().version  # once per job per round: the weak reference without the property
        if v != self._version:
            self._plans.clear()
            self._workloads.clear()
            self._by_job.clear()
            self._current.clear()
            self._jobs.clear()
            self._grids.clear()
            self._ahead.clear()
            self._version = v

    # ---- estimates of one shape ------------------------------------------------------------------
    def plans(self, arch: Arch, batch: int, gpu: GpuSpec, intra_link: str | None, shape: GridShape) -> GridPlans:
        """The estimator's plans of one grid shape (proxy and Pareto set), at the current version, each
        priced at the catalogue's caution (`price`)."""
        self._fresh()
        key = (arch, batch, gpu, intra_link, shape)
        hit = self._plans.get(key)
        if hit is None:
            est = self.estimator
            hit = est.grid(arch, batch, gpu, intra_link, shape)
            if est.band is not None and hit.proxy is not None and not est.measured(arch.name, batch, shape):
                hit = price(hit, est.band, arch.family, shape.num_gpus, self.caution)
            self._plans[key] = hit
        return hit

    # ---- a job's grids -----------------------------------------------------------------------------
    def grids(self, job: Job, snapshot: ClusterSnapshot, *, max_gpus_default: int = 16,
              prune: bool = False) -> list[Grid]:
        """All grids of one job: compact shapes on every allowed pool and power-of-two count. Only the
        best pipeline depth of each (pool, count) is kept (the others use the same GPUs for less);
        `prune` also drops dominated grids (see drop_dominated). The running allocation is always
        kept, as the `current` grid."""
        cl = self.cluster(snapshot)
        entry = self._entry(job, cl, max_gpus_default)
        # a running job's grids change only with its workload entry or its running allocation: a simulator
        # or scheduler asks again every round for the same jobs (the running state is the same object while
        # the allocation stands, so most rounds skip even the shape: it was most of a running job's call,
        # 260,000 calls on Arena's Philly trace; a list is kept only for an allocation that has a shape)
        hit = self._grids.get((job.id, prune)) if job.running is not None else None
        if hit is not None and hit[0] is entry and hit[1] is job.running:
            return list(hit[3])
        cur_key = _current_shape(job, cl.node_map)
        if cur_key is None:
            # a job that does not run has its workload's grids: one list shared by all such jobs (150,000
            # waiting jobs of a few dozen workloads would otherwise stamp 2.6 million copies each round)
            return list(entry.shared(prune))
        if hit is not None and hit[0] is entry and hit[2] == cur_key:
            return list(hit[3])
        cands = entry.pruned() if prune else entry.best()
        out = [Grid(job.id, pk, shape, proxy, pareto, cur_key == (pk, shape.nodes, shape.gpus_per_node, shape.pp))
               for pk, (shape, proxy, pareto) in cands]
        if not any(g.current for g in out):
            g = self._running_grid(job, cl, entry, cur_key)
            if g is not None:
                out.append(g)
        self._grids[(job.id, prune)] = (entry, job.running, cur_key, out)
        return list(out)

    def all_grids(self, snapshot: ClusterSnapshot, *, max_gpus_default: int = 16) -> dict[str, list[Grid]]:
        """`grids(prune=True)` of every job of the snapshot (level 1's input)."""
        cl = self.cluster(snapshot)
        self._plan_ahead([j for j in snapshot.jobs if _workload(j, cl, max_gpus_default) not in self._ahead], cl,
                         max_gpus_default)
        return {j.id: self.grids(j, snapshot, max_gpus_default=max_gpus_default, prune=True) for j in snapshot.jobs}

    def options(self, job: Job, snapshot: ClusterSnapshot, *, max_gpus_default: int = 16
                ) -> dict[tuple[str, int], Grid]:
        """(gpu_type, num_gpus) -> the fastest grid of that type and count over the type's pools (the
        baselines' view: they choose a type and a count)."""
        cl = self.cluster(snapshot)
        entry = self._entry(job, cl, max_gpus_default)
        hit = self._by_job.get(job.id)
        if hit is not None and hit[0] is entry:
            return hit[1]
        out: dict[tuple[str, int], Grid] = {}
        for pk, (shape, proxy, pareto) in entry.best():
            key = (shape.gpu_type, shape.num_gpus)
            if key not in out or proxy.throughput > out[key].throughput:
                out[key] = Grid(job.id, pk, shape, proxy, pareto)
        self._by_job[job.id] = (entry, out)
        return out

    def workloads(self, jobs: list[Job], snapshot: ClusterSnapshot, *, max_gpus_default: int = 16
                  ) -> list["WorkloadOptions"]:
        """Each job's workload entry: the grids every job of its model, batch and limits shares on this
        cluster (`shared`: those of a job that does not run) and their arrays (`summary`), without
        stamping any grid for the job."""
        cl = self.cluster(snapshot)
        self._fresh()
        keys = [_workload(j, cl, max_gpus_default) for j in jobs]
        new = {k: j for k, j in zip(keys, jobs) if k not in self._workloads and k not in self._ahead}
        if new:
            self._plan_ahead(list(new.values()), cl, max_gpus_default)
        return [self._entry(j, cl, max_gpus_default, fresh=True, key=k) for j, k in zip(jobs, keys)]

    def current(self, job: Job, snapshot: ClusterSnapshot, *, max_gpus_default: int = 16) -> Grid | None:
        """The grid of the job's running allocation, flagged `current` (choosing it keeps the job); None
        when the job does not run or the estimate says its allocation is infeasible."""
        r = job.running
        if r is None or not r.placement:
            return None
        cl = self.cluster(snapshot)
        entry = self._entry(job, cl, max_gpus_default)
        hit = self._current.get(job.id)
        # the plan of an allocation that stands is the same object round after round: `is` before pydantic's ==
        if hit is not None and hit[0] is entry and hit[1] is r.placement and (hit[2] is r.plan or hit[2] == r.plan):
            return hit[3]
        g = self._running_grid(job, cl, entry, _current_shape(job, cl.node_map))
        self._current[job.id] = (entry, r.placement, r.plan, g)
        return g

    def requested(self, job: Job, snapshot: ClusterSnapshot, *, max_gpus_default: int = 16) -> Grid | None:
        """`requested_grid` over the job's options."""
        return self.derived(job, snapshot, "requested", lambda opts: requested_grid(job, opts),
                            max_gpus_default=max_gpus_default)

    def derived(self, job: Job, snapshot: ClusterSnapshot, what, compute: Callable[[dict], object], *,
                max_gpus_default: int = 16):
        """`compute(options)` of the job (a policy's view of its options, e.g. its grids of one count in
        order), cached as long as the job's options are: `what` names the view."""
        # kept with the workload entry its options come from (a new entry, new options): a round's hit asks
        # for the job's entry alone, not for the options too
        self._fresh()
        views = self._job(job, self.cluster(snapshot), max_gpus_default)[2]
        value = views.get(what, _MISSING)
        if value is _MISSING:
            value = views[what] = compute(self.options(job, snapshot, max_gpus_default=max_gpus_default))
        return value

    # ---- internals ---------------------------------------------------------------------------------
    def cluster(self, snapshot: ClusterSnapshot) -> "_Cluster":
        """Pools, nodes and GPU catalog of the snapshot's cluster (kept while the snapshot's node list
        and catalog are the same objects, as in a simulator's or scheduler's every round)."""
        cl = self._cluster
        if cl is None or cl.nodes is not snapshot.nodes or cl.gpu_catalog is not snapshot.gpu_catalog:
            pool_map = pools(snapshot)
            context = self._contexts.setdefault(_context(snapshot, pool_map), len(self._contexts))
            cl = self._cluster = _Cluster(snapshot.nodes, snapshot.gpu_catalog, pool_map,
                                          {n.id: n for n in snapshot.nodes}, snapshot.catalog, context)
        return cl

    def _entry(self, job: Job, cl: "_Cluster", max_gpus_default: int, fresh: bool = False,
               key: tuple | None = None) -> "WorkloadOptions":
        if not fresh:
            self._fresh()
        if key is None:
            return self._job(job, cl, max_gpus_default)[1]
        return self._workload_entry(job, cl, max_gpus_default, key)

    def _job(self, job: Job, cl: "_Cluster", max_gpus_default: int) -> tuple:
        """The job's memo (see `_jobs`), brought up to date with its fields and the cluster's context."""
        d = job.__dict__
        model, allowed = d["model"], d["allowed_gpu_types"]
        hit = self._jobs.get(d["id"])
        # an inline architecture is a mutable model that may be edited in place: its key is built every time
        if hit is not None and type(model) is str and hit[0] == _own_key(d, allowed, max_gpus_default, cl.context):
            return hit
        entry = self._workload_entry(job, cl, max_gpus_default, _workload(job, cl, max_gpus_default))
        views = hit[2] if hit is not None and hit[1] is entry else {}
        # the stored key holds a copy of the list: the memo must not change with an edit of the job's own
        stored = _own_key(d, None if allowed is None else list(allowed), max_gpus_default, cl.context)
        hit = self._jobs[d["id"]] = (stored, entry, views)
        return hit

    def _workload_entry(self, job: Job, cl: "_Cluster", max_gpus_default: int, key: tuple) -> "WorkloadOptions":
        entry = self._workloads.get(key)
        if entry is None:
            if key not in self._ahead:
                self._plan_ahead([job], cl, max_gpus_default)
            entry = self._workloads[key] = WorkloadOptions(self._options(job, cl, max_gpus_default))
        return entry

    def _plan_ahead(self, jobs: list[Job], cl: "_Cluster", max_gpus_default: int) -> None:
        """Every grid shape of the jobs (whose options are not known yet), planned in one planner pass
        (`PerfEstimator.plan_ahead`): `_options` then finds them cached."""
        self._fresh()
        want: dict[tuple, None] = {}
        for job in jobs:
            wk = _workload(job, cl, max_gpus_default)
            if wk in self._ahead:  # a job of a workload already here: the same shapes
                continue
            self._ahead.add(wk)
            for pool, spec, shapes in _shapes(job, cl, max_gpus_default):
                for shape in shapes:
                    key = (job.arch, job.batch_size, spec, pool.intra_link, shape)
                    if key not in self._plans:
                        want[key] = None
        if want:
            self.estimator.plan_ahead(list(want))

    def _options(self, job: Job, cl: "_Cluster", max_gpus_default: int) -> list[tuple[tuple, list]]:
        """Per (pool, GPU count) the feasible (shape, proxy, Pareto) of every pipeline depth."""
        out = []
        for pool, spec, shapes in _shapes(job, cl, max_gpus_default):
            cands = []
            for shape in shapes:
                plans = self.plans(job.arch, job.batch_size, spec, pool.intra_link, shape)
                if plans.proxy is not None:
                    cands.append((shape, plans.proxy, tuple(plans.pareto)))
            if cands:
                out.append((pool.key, cands))
        return out

    def _running_grid(self, job: Job, cl: "_Cluster", entry: "WorkloadOptions", key) -> Grid | None:
        """The running allocation as a grid: one of the workload's options, or (a shape that is not
        compact, e.g. placed by another scheduler) planned on its own."""
        if key is None:
            return None
        for pk, cs in entry.per_pool:
            for shape, proxy, pareto in cs:
                if key == (pk, shape.nodes, shape.gpus_per_node, shape.pp):
                    return Grid(job.id, pk, shape, proxy, pareto, True)
        pool_key, nodes, gpn, pp = key
        shape = GridShape(pool_key[0], nodes, gpn, pp)
        plans = self.plans(job.arch, job.batch_size, cl.catalog[pool_key[0]], pool_key[2], shape)
        if plans.proxy is None:
            return None
        return Grid(job.id, pool_key, shape, plans.proxy, tuple(plans.pareto), True)


@dataclass(frozen=True)
class _Cluster:
    nodes: list
    gpu_catalog: dict
    pool_map: dict[tuple, Pool]
    node_map: dict[str, Node]
    catalog: dict[str, GpuSpec]
    context: int  # one number per distinct (pool sizes, GPU catalog overrides)


class WorkloadOptions:
    """A workload's grid options: every pipeline depth per (pool, count), and the subsets a round uses."""

    def __init__(self, per_pool: list[tuple[tuple, list]]):
        self.per_pool = per_pool
        self._best = None
        self._pruned = None
        self._shared: dict[bool, list[Grid]] = {}
        self._summary: GridSummary | None = None

    def best(self) -> list[tuple]:
        if self._best is None:
            self._best = [(pk, max(cs, key=lambda c: c[1].throughput)) for pk, cs in self.per_pool]
        return self._best

    def pruned(self) -> list[tuple]:
        if self._pruned is None:
            grids = self.shared(False)
            keep = {id(g) for g in drop_dominated(grids)}
            self._pruned = [pc for pc, g in zip(self.best(), grids) if id(g) in keep]
            self._shared[True] = [g for g in grids if id(g) in keep]
        return self._pruned

    def shared(self, prune: bool) -> list[Grid]:
        """The grids of a job of this workload that does not run (job_id ""), made once for all of them;
        `prune` as in GridCatalog.grids."""
        if prune:
            self.pruned()
        elif False not in self._shared:
            self._shared[False] = [Grid("", pk, *c) for pk, c in self.best()]
        return self._shared[prune]

    def summary(self) -> "GridSummary":
        """The pruned grids as arrays (what a round's candidate filter reads for a waiting job)."""
        if self._summary is None:
            gs = self.shared(True)
            self._summary = GridSummary(np.array([g.throughput for g in gs], dtype=float),
                                        np.array([g.num_gpus for g in gs], dtype=float),
                                        np.array([g.node_units(g.pool[1]) for g in gs], dtype=int))
        return self._summary


@dataclass(frozen=True)
class GridSummary:
    """Per grid of a list: throughput, GPUs and node units in its pool (Grid.node_units)."""

    throughput: np.ndarray
    gpus: np.ndarray
    units: np.ndarray


_MISSING = object()


def _workload(job: Job, cl: _Cluster, max_gpus_default: int) -> tuple:
    """What a job's grid options depend on: its workload, limits and the cluster's context."""
    model_key = job.model if isinstance(job.model, str) else job.arch
    return (model_key, job.batch_size, job.min_gpus, job.max_gpus, tuple(job.allowed_gpu_types or ()),
            max_gpus_default, cl.context)


def _own_key(d: dict, allowed: list[str] | None, max_gpus_default: int, context) -> tuple:
    """The fields of a job (its `__dict__`) and of the call that its catalogue memo is valid for."""
    return (d["model"], d["batch_size"], d["min_gpus"], d["max_gpus"], allowed, max_gpus_default, context)


def _shapes(job: Job, cl: _Cluster, max_gpus_default: int):
    """Per allowed pool and power-of-two GPU count: (pool, its GPU spec, the compact shape at every
    pipeline depth)."""
    allowed = set(job.allowed_gpu_types) if job.allowed_gpu_types else None
    for pool in cl.pool_map.values():
        if allowed is not None and pool.gpu_type not in allowed:
            continue
        spec = cl.catalog[pool.gpu_type]
        for n in gpu_counts(job, pool, max_gpus_default):
            nodes, gpn = compact_shape(n, pool.gpus_per_node)
            shapes, pp = [], 1
            while pp <= n:
                shapes.append(GridShape(pool.gpu_type, nodes, gpn, pp))
                pp *= 2
            yield pool, spec, shapes


def _context(snapshot: ClusterSnapshot, pool_map: dict[tuple, Pool]) -> tuple:
    """What a job's grid options depend on besides the job: pool sizes and GPU catalog overrides."""
    overrides = tuple(sorted((k, v.model_dump_json()) for k, v in snapshot.gpu_catalog.items()))
    return (tuple((k, len(p.node_ids)) for k, p in pool_map.items()), overrides)


def _current_shape(job: Job, node_map: dict[str, Node]):
    if job.running is None:
        return None
    used = [node_map[nid] for nid in job.running.placement]
    if not used:
        return None
    first = used[0]
    per_node = max(len(g) for g in job.running.placement.values())
    return ((first.gpu_type, first.num_gpus, first.intra_link), len(used), per_node, job.running.plan.pp)


def price(plans: GridPlans, band: BandModel, family: str, num_gpus: int, caution: float | None) -> GridPlans:
    """Every plan with its error band and its time set to the band's `caution` quantile: the one place
    grid times become conservative. The proxy is the fastest plan at that price (the band can move it
    off a plan whose micro-batch count was never measured)."""
    bands = band.bands([r.iter_time_s for r in plans.pareto], family, num_gpus,
                       [r.plan.num_microbatches for r in plans.pareto], caution)
    priced = [PlanResult.of(r.plan, b.decided_s, r.mem_gib, r.batch_size, b) for r, b in zip(plans.pareto, bands)]
    priced.sort(key=lambda r: (r.iter_time_s, r.mem_gib))
    pareto, best_mem = [], float("inf")
    for r in priced:
        if r.mem_gib < best_mem - 1e-9:  # still a (time, memory) front at the new prices
            pareto.append(r)
            best_mem = r.mem_gib
    return GridPlans(pareto[0], pareto)


def job_grids(job: Job, snapshot: ClusterSnapshot, estimator: PerfEstimator, *, max_gpus_default: int = 16,
              prune: bool = False) -> list[Grid]:
    """`GridCatalog.grids` of the estimator's catalogue."""
    return GridCatalog.of(estimator).grids(job, snapshot, max_gpus_default=max_gpus_default, prune=prune)


def enumerate_grids(snapshot: ClusterSnapshot, estimator: PerfEstimator, *, max_gpus_default: int = 16
                    ) -> dict[str, list[Grid]]:
    """`GridCatalog.all_grids` of the estimator's catalogue."""
    return GridCatalog.of(estimator).all_grids(snapshot, max_gpus_default=max_gpus_default)


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


def drop_dominated(grids: list[Grid]) -> list[Grid]:
    """A grid is never worth choosing when a grid of the same pool takes no more GPUs and runs at least
    as fast (and it is not the running allocation, whose restart-free value is special)."""
    keep = []
    for g in grids:
        if not g.current and any(h is not g and h.pool == g.pool and h.num_gpus <= g.num_gpus
                                 and h.throughput >= g.throughput and (h.num_gpus, -h.throughput) < (g.num_gpus, -g.throughput)
                                 for h in grids):
            continue
        keep.append(g)
    return keep
