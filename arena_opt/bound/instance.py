"""What the bound needs to know of a trace on a cluster: per job its earliest productive second and
the run time of its whole work on every grid the simulator would accept, and per GPU type the GPUs.

"Would accept" follows the simulator and `feasibility.check_decision`, not what one policy proposes:
a job may run on any GPU count of one node or on whole nodes of one type (any count, not only the
powers of two the policies enumerate, and above the policies' 16-GPU default), with any pipeline
depth that divides its GPUs; its speed is the truth's proxy plan for that shape and depth (strict
table mode: shapes the table lacks are infeasible). `min_gpus`/`max_gpus` are policy hints the
simulator does not enforce, so they do not limit the bound; `allowed_gpu_types` is enforced, so it does.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

from arena_opt.perf.estimator import GridShape, PerfEstimator
from arena_opt.grids import GridCatalog
from arena_opt.reconfig import ReconfigModel
from arena_opt.snapshot import ClusterSnapshot, Job

# the simulator's tick rounding (sim/engine.py): a tick within this fraction of an interval after an
# arrival counts as the arrival's tick
_TICK_EPS = 1e-9


@dataclass(frozen=True)
class BoundGrid:
    gpu_type: str
    gpus: int  # GPUs the grid holds (a lower bound on them where a type mixes node sizes)
    seconds: float  # the job's whole work on this grid, restart-free


@dataclass(frozen=True)
class BoundJob:
    id: str
    submit: float
    release: float  # earliest second the job can make progress: first tick at or after submit + first start delay
    grids: tuple[BoundGrid, ...]  # Pareto frontier per type: no other grid of the type is as fast on fewer GPUs

    @property
    def p_min(self) -> float:
        return min(g.seconds for g in self.grids)


@dataclass
class BoundInstance:
    jobs: list[BoundJob]
    capacity: dict[str, int]  # GPUs per type
    origin: float  # the simulator's origin: first submission (ticks fall on origin + k * interval)
    interval_s: float
    rejected: list[str]  # jobs no grid of the truth runs (the simulator rejects them too)
    grids_before_frontier: int = 0


def frontier(grids: list[BoundGrid], hull: bool = True) -> list[BoundGrid]:
    """Per type, the grids on the upper concave hull of (GPUs, speed) from the origin (with `hull`), else
    only those that no other grid of the type beats on GPUs and speed at once. Either way the LP's value
    is still a bound: time on a dropped grid maps to less time on one or two kept grids of the type with
    the same work, no more GPUs and a work spread that is no larger (docs/BOUND.md)."""
    by_type: dict[str, list[BoundGrid]] = defaultdict(list)
    for g in grids:
        by_type[g.gpu_type].append(g)
    out = []
    for t in sorted(by_type):
        pareto, best = [], math.inf
        for g in sorted(by_type[t], key=lambda g: (g.gpus, g.seconds)):
            if g.seconds < best:
                pareto.append(g)
                best = g.seconds
        if hull:
            kept: list[BoundGrid] = []
            for g in pareto:  # speeds rise with GPUs along the Pareto list: a monotone-chain upper hull
                while kept and _below(kept[-2] if len(kept) > 1 else None, kept[-1], g):
                    kept.pop()
                kept.append(g)
            pareto = kept
        out.extend(pareto)
    return out


def _below(a: BoundGrid | None, b: BoundGrid, c: BoundGrid) -> bool:
    """b lies on or under the segment from a (None: the origin) to c in the (GPUs, speed) plane."""
    ax, ay = (0.0, 0.0) if a is None else (a.gpus, 1.0 / a.seconds)
    bx, by, cx, cy = b.gpus, 1.0 / b.seconds, c.gpus, 1.0 / c.seconds
    return (bx - ax) * (cy - ay) - (by - ay) * (cx - ax) >= 0


def _shapes(cluster: ClusterSnapshot) -> dict[str, list[tuple[int, int, int, str | None]]]:
    """Per type every (nodes, GPUs per node, GPUs held, intra link) a placement can have.

    One node: any count up to its size. Several nodes: whole nodes, so the shape's per-node count is
    the largest node's size and the GPUs held are at least that node plus the smallest others."""
    sizes: dict[str, list[int]] = defaultdict(list)
    links: dict[str, dict[int, set]] = defaultdict(lambda: defaultdict(set))
    for n in cluster.nodes:
        sizes[n.gpu_type].append(n.num_gpus)
        links[n.gpu_type][n.num_gpus].add(n.intra_link)
    out: dict[str, list] = {}
    for t, ss in sizes.items():
        ss.sort()
        shapes = set()
        for size in sorted(set(ss)):
            small = [s for s in ss if s <= size]  # nodes a multi-node placement led by a `size` node may use
            rest = small[:-1]  # without the leader (sorted: the last one is a `size` node)
            lk = set().union(*(links[t][s] for s in set(small)))
            for link in links[t][size]:
                for c in range(1, size + 1):
                    shapes.add((1, c, c, link))
            for k in range(2, len(small) + 1):
                held = size + sum(rest[: k - 1])
                for link in lk:  # the simulator reads the link of the placement's first node
                    shapes.add((k, size, held, link))
        out[t] = sorted(shapes, key=lambda s: (s[2], s[0], s[1], str(s[3])))
    return out


def truth_grids(job: Job, cluster: ClusterSnapshot, truth: PerfEstimator,
                shapes: dict[str, list] | None = None) -> list[tuple[str, int, float]]:
    """(type, GPUs held, iteration time) of every grid the simulator accepts for `job`: per (type, GPUs
    held) the fastest shape, link and pipeline depth of the truth."""
    shapes = shapes if shapes is not None else _shapes(cluster)
    catalog = cluster.catalog
    arch = job.arch
    allowed = set(job.allowed_gpu_types) if job.allowed_gpu_types else None
    best: dict[tuple[str, int], float] = {}
    for t, ts in shapes.items():
        if allowed is not None and t not in allowed:
            continue
        for nodes, gpn, held, link in ts:
            if not truth.in_scope(arch.name, job.batch_size, t, nodes, gpn):
                continue
            n = nodes * gpn
            for pp in (d for d in range(1, n + 1) if n % d == 0):
                r = truth.grid(arch, job.batch_size, catalog[t], link, GridShape(t, nodes, gpn, pp)).proxy
                if r is not None and r.iter_time_s < best.get((t, held), math.inf):
                    best[(t, held)] = r.iter_time_s
    return [(t, n, s) for (t, n), s in best.items()]


def first_start_delay(reconfig: list[ReconfigModel], job: Job, gpus: int) -> float:
    """The least delay before a job's first progress on `gpus` GPUs under any of the models (with
    Arena's artifact constants arena and the baselines pay different prices; the bound takes the lower)."""
    return min(m.delay_s(job.arch, gpus, resumed=False) for m in reconfig)


def build_instance(jobs: list[Job], cluster: ClusterSnapshot, truth: PerfEstimator, *, interval_s: float,
                   reconfig: list[ReconfigModel], hull: bool = True) -> BoundInstance:
    """`jobs`: the trace as the simulator loads it (iteration scaling applied)."""
    if not jobs:
        raise ValueError("no jobs")
    if interval_s <= 0:
        raise ValueError("interval_s must be > 0")
    origin = min(j.submit_time for j in jobs)
    shapes = _shapes(cluster)
    cap: dict[str, int] = defaultdict(int)
    for n in cluster.nodes:
        cap[n.gpu_type] += n.num_gpus
    # the simulator rejects a job on arrival when none of the policies' grids runs it (sim/engine.py):
    # such a job is in no policy's average, so it is left out of the bound's too
    admitted = GridCatalog.of(truth)
    memo: dict[tuple, list[tuple[str, int, float]]] = {}
    out, rejected, before = [], [], 0
    for j in sorted(jobs, key=lambda j: j.submit_time):
        key = (j.model if isinstance(j.model, str) else j.arch.name, j.batch_size, tuple(j.allowed_gpu_types or ()))
        if key not in memo:
            memo[key] = truth_grids(j, cluster, truth, shapes)
        grids = [BoundGrid(t, n, j.total_iterations * it) for t, n, it in memo[key]]
        if not grids or not admitted.options(j, cluster):
            rejected.append(j.id)
            continue
        before += len(grids)
        # decisions happen only at ticks (sim/engine.py), the first one at or after the arrival
        k = math.ceil((j.submit_time - origin) / interval_s - _TICK_EPS)
        tick = max(j.submit_time, origin + k * interval_s)
        delay = min(first_start_delay(reconfig, j, g.gpus) for g in grids)
        out.append(BoundJob(j.id, j.submit_time, tick + delay, tuple(frontier(grids, hull))))
    return BoundInstance(out, dict(cap), origin, interval_s, rejected, before)
