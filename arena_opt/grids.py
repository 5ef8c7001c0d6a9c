"""Grids: the joint (GPU type, GPU count and node shape, pipeline depth) options of each job,
each with its proxy plan from the planner. Level 1 chooses among these."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from arena_opt.gpus import GpuSpec
from arena_opt.perf.estimator import GridShape, PerfEstimator
from arena_opt.perf.planner import PlanResult
from arena_opt.snapshot import ClusterSnapshot, Job, Node


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
    job_id: str
    pool: tuple[str, int, str | None]
    shape: GridShape
    result: PlanResult
    pareto: tuple[PlanResult, ...] = field(default=(), compare=False)
    current: bool = False  # the job's running allocation: choosing it keeps the job where it is

    @property
    def num_gpus(self) -> int:
        return self.shape.num_gpus

    @property
    def multi_node(self) -> bool:
        return self.shape.nodes > 1

    @property
    def throughput(self) -> float:
        return self.result.throughput

    def node_units(self, gpus_per_node: int) -> int:
        """GPUs this grid takes from its pool's nodes: whole nodes when it spans several."""
        return self.shape.nodes * gpus_per_node if self.multi_node else self.shape.num_gpus


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


def job_grids(job: Job, snapshot: ClusterSnapshot, estimator: PerfEstimator, *, max_gpus_default: int = 16,
              prune: bool = False, pool_map: dict[tuple, Pool] | None = None,
              node_map: dict[str, Node] | None = None, context: tuple | None = None) -> list[Grid]:
    """All grids of one job: compact shapes on every allowed pool and power-of-two count. Only the best
    pipeline depth of each (pool, count) is kept (the others use the same GPUs for less);
    `prune` also drops dominated grids (see drop_dominated). The running allocation is
    always kept as the `current` grid."""
    pool_map = pool_map if pool_map is not None else pools(snapshot)
    node_map = node_map if node_map is not None else {n.id: n for n in snapshot.nodes}
    context = context if context is not None else _context(snapshot, pool_map)
    cur_key = _current_shape(job, node_map)
    model_key = job.model if isinstance(job.model, str) else job.arch
    key = (model_key, job.batch_size, job.min_gpus, job.max_gpus, tuple(job.allowed_gpu_types or ()),
           max_gpus_default, context)
    cache = estimator.job_grid_cache
    entry = cache.get(key)
    if entry is None:
        entry = cache[key] = _JobOptions(_options(job, snapshot, estimator, pool_map, max_gpus_default))
    # jobs of one workload share these; a round only stamps the job id and the running grid on them
    cands = entry.pruned() if prune else entry.best()
    out = [Grid(job.id, pk, shape, proxy, pareto, cur_key == (pk, shape.nodes, shape.gpus_per_node, shape.pp))
           for pk, (shape, proxy, pareto) in cands]
    if cur_key is not None and not any(g.current for g in out):
        hit = next(((pk, c) for pk, cs in entry.per_pool for c in cs
                    if cur_key == (pk, c[0].nodes, c[0].gpus_per_node, c[0].pp)), None)
        if hit is not None:
            shape, proxy, pareto = hit[1]
            out.append(Grid(job.id, hit[0], shape, proxy, pareto, True))
        else:
            g = _current_grid(job, snapshot, estimator, snapshot.catalog[job.running.gpu_type], cur_key)
            if g is not None:
                out.append(g)
    return out


class _JobOptions:
    """A workload's grid options: every pipeline depth per (pool, count), and the subsets a round uses."""

    def __init__(self, per_pool: list[tuple[tuple, list]]):
        self.per_pool = per_pool
        self._best = None
        self._pruned = None

    def best(self) -> list[tuple]:
        if self._best is None:
            self._best = [(pk, max(cs, key=lambda c: c[1].throughput)) for pk, cs in self.per_pool]
        return self._best

    def pruned(self) -> list[tuple]:
        if self._pruned is None:
            grids = [Grid("", pk, *c) for pk, c in self.best()]
            keep = {id(g) for g in drop_dominated(grids)}
            self._pruned = [pc for pc, g in zip(self.best(), grids) if id(g) in keep]
        return self._pruned


def _context(snapshot: ClusterSnapshot, pool_map: dict[tuple, Pool]) -> tuple:
    """What a job's grid options depend on besides the job: pool sizes and GPU catalog overrides."""
    overrides = tuple(sorted((k, v.model_dump_json()) for k, v in snapshot.gpu_catalog.items()))
    return (tuple((k, len(p.node_ids)) for k, p in pool_map.items()), overrides)


def _options(job: Job, snapshot: ClusterSnapshot, estimator: PerfEstimator, pool_map: dict[tuple, Pool],
             max_gpus_default: int) -> list[tuple[tuple, list]]:
    """Per (pool, GPU count) the feasible (shape, proxy, Pareto) of every pipeline depth."""
    catalog = snapshot.catalog
    allowed = set(job.allowed_gpu_types) if job.allowed_gpu_types else None
    out = []
    for pool in pool_map.values():
        if allowed is not None and pool.gpu_type not in allowed:
            continue
        spec = catalog[pool.gpu_type]
        for n in gpu_counts(job, pool, max_gpus_default):
            nodes, gpn = compact_shape(n, pool.gpus_per_node)
            cands = []
            pp = 1
            while pp <= n:
                shape = GridShape(pool.gpu_type, nodes, gpn, pp)
                plans = estimator.grid(job.arch, job.batch_size, spec, pool.intra_link, shape)
                if plans.proxy is not None:
                    cands.append((shape, plans.proxy, tuple(plans.pareto)))
                pp *= 2
            if cands:
                out.append((pool.key, cands))
    return out


def _current_shape(job: Job, node_map: dict[str, Node]):
    if job.running is None:
        return None
    used = [node_map[nid] for nid in job.running.placement]
    if not used:
        return None
    first = used[0]
    per_node = max(len(g) for g in job.running.placement.values())
    return ((first.gpu_type, first.num_gpus, first.intra_link), len(used), per_node, job.running.plan.pp)


def _current_grid(job: Job, snapshot: ClusterSnapshot, estimator: PerfEstimator, spec: GpuSpec, key) -> Grid | None:
    """A running allocation that is not a compact shape (e.g. placed by another scheduler)."""
    pool_key, nodes, gpn, pp = key
    shape = GridShape(pool_key[0], nodes, gpn, pp)
    plans = estimator.grid(job.arch, job.batch_size, spec, pool_key[2], shape)
    if plans.proxy is None:
        return None
    return Grid(job.id, pool_key, shape, plans.proxy, tuple(plans.pareto), True)


def enumerate_grids(snapshot: ClusterSnapshot, estimator: PerfEstimator, **kw) -> dict[str, list[Grid]]:
    pool_map = pools(snapshot)
    node_map = {n.id: n for n in snapshot.nodes}
    ctx = _context(snapshot, pool_map)
    return {j.id: job_grids(j, snapshot, estimator, prune=True, pool_map=pool_map, node_map=node_map, context=ctx, **kw)
            for j in snapshot.jobs}


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
