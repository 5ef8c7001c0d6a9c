"""Level 1 as plain data: one binary per grid, packing per node pool, objective values.

The Pyomo model, the greedy fallback, the shard splitter and the brute-force tests all
read this one description, so they agree on what is feasible and what it is worth.

Exact node packing. In a pool with G GPUs per node, grids take power-of-two units
(sub-node grids their GPU count inside one node, multi-node grids G per whole node).
Items whose sizes divide each other fit into bins of free capacities c_b iff for every
size threshold s: sum of units of items >= s <= sum_b s * floor(c_b / s)
(largest-first best-fit achieves it). Free capacity of a node depends on which running
jobs keep their place, so floor(c_b / s) is an integer variable w[b, s] with
s * w[b, s] + (GPUs kept on b) <= G.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import chain

import numpy as np

from arena_opt.grids import Grid, pools
from arena_opt.milp.options import ArenaOptions
from arena_opt.reasons import no_grid_reason, pool_totals
from arena_opt.snapshot import ClusterSnapshot


@dataclass
class PoolInfo:
    key: tuple
    gpus_per_node: int
    empty_nodes: int  # nodes that no running job occupies
    occupied: dict[str, list[tuple[int, int]]]  # node id -> [(job index, GPUs it holds there)]
    thresholds: list[int]


@dataclass
class ClusterProblem:
    job_ids: list[str]
    grids: list[Grid]
    job_of: np.ndarray  # grid -> job index
    value: np.ndarray  # objective coefficient of each grid
    units: np.ndarray  # node units the grid takes in its pool
    pool_of: list[tuple]
    current: np.ndarray  # grid is its job's running allocation
    throughput: np.ndarray
    pools: dict[tuple, PoolInfo]
    running: np.ndarray  # job is running now
    preempt_penalty: np.ndarray  # per job, paid when a running job gets no grid
    deadline_need: np.ndarray  # samples/s a job needs to meet its deadline (0 = none or hopeless)
    deadline_weight: np.ndarray  # per job penalty per unit of missing fraction
    max_reconfigs: int | None
    guard_need: np.ndarray  # samples/s the makespan guard asks for (0 = not critical, or the guard off)
    guard_weight: np.ndarray
    waiting_reason: dict[str, str] = field(default_factory=dict)

    def soft_targets(self) -> list[tuple[str, np.ndarray, np.ndarray]]:
        """(name, need, weight) of every soft throughput target: penalty weight * missing fraction."""
        return [("deadline", self.deadline_need, self.deadline_weight),
                ("makespan", self.guard_need, self.guard_weight)]

    def gain(self) -> np.ndarray:
        """Per grid: what choosing it adds to `objective` over leaving its job without a grid (its value,
        the preemption penalty a running job then avoids, the soft-target penalty it removes), the
        score the greedy selection orders by: at 10,000 jobs most of the objective is deadline penalty,
        which grid values alone do not see."""
        j = self.job_of
        out = self.value + np.where(self.running[j], self.preempt_penalty[j], 0.0)
        for _, need, weight in self.soft_targets():
            has = need[j] > 0
            out = out + np.where(has, weight[j] * np.minimum(1.0, self.throughput / np.where(has, need[j], 1.0)), 0.0)
        return out

    def targeted(self) -> np.ndarray:
        return np.logical_or.reduce([need > 0 for _, need, _ in self.soft_targets()])

    @property
    def num_jobs(self) -> int:
        return len(self.job_ids)

    def grids_of(self, j: int) -> np.ndarray:
        return np.flatnonzero(self.job_of == j)

    # --- evaluation, shared by greedy, shards and tests ----------------------------------------
    def objective(self, sel: dict[int, int]) -> float:
        """Objective of a selection job index -> grid index (jobs absent get nothing)."""
        total = float(sum(self.value[k] for k in sel.values()))
        for j in np.flatnonzero(self.running):
            if j not in sel:
                total -= self.preempt_penalty[j]
        for _, need, weight in self.soft_targets():
            for j in np.flatnonzero(need > 0):
                got = self.throughput[sel[j]] if j in sel else 0.0
                total -= weight[j] * max(0.0, 1 - got / need[j])
        return total

    def feasible(self, sel: dict[int, int]) -> bool:
        if self.max_reconfigs is not None:
            moved = sum(1 for j in np.flatnonzero(self.running) if j not in sel or not self.current[sel[j]])
            if moved > self.max_reconfigs:
                return False
        kept = {j for j, k in sel.items() if self.current[k]}
        for key, p in self.pools.items():
            items = [self.units[k] for k in sel.values() if self.pool_of[k] == key and not self.current[k]]
            caps = [p.gpus_per_node] * p.empty_nodes
            for users in p.occupied.values():
                caps.append(p.gpus_per_node - sum(g for j, g in users if j in kept))
            for s in p.thresholds:
                if sum(u for u in items if u >= s) > sum(s * (c // s) for c in caps):
                    return False
        return True


def _thresholds(g: int) -> list[int]:
    out, s = [], 1
    while s < g:
        out.append(s)
        s *= 2
    out.append(g)
    return out


def critical_jobs(job_of: np.ndarray, tput: np.ndarray, gpus: np.ndarray, rem_samples: np.ndarray,
                  best: np.ndarray, total_gpus: int, float_s: float) -> np.ndarray:
    """Jobs on the makespan's critical path: the longest job on its fastest grid, and any other whose
    float (how much later than the longest it would finish) is under `float_s`, provided that this
    exceeds the time the whole cluster needs to drain all remaining work at every job's most
    GPU-efficient grid. Every second such a job runs below its best speed pushes back the time the
    last job finishes; a job with more float than one round can wait this round at no such cost."""
    return _critical(gpu_seconds_per_sample(job_of, tput, gpus, len(best)), rem_samples, best, total_gpus, float_s)


def gpu_seconds_per_sample(job_of: np.ndarray, tput: np.ndarray, gpus: np.ndarray, num_jobs: int) -> np.ndarray:
    """Per job: GPU-seconds per sample on its most GPU-efficient grid (inf without one)."""
    out = np.full(num_jobs, np.inf)
    ok = tput > 0
    np.minimum.at(out, job_of[ok], gpus[ok] / tput[ok])
    return out


def _critical(gpu_s_per_sample: np.ndarray, rem_samples: np.ndarray, best: np.ndarray, total_gpus: int,
              float_s: float) -> np.ndarray:
    has = np.isfinite(gpu_s_per_sample) & (best > 0) & (rem_samples > 0)
    if not has.any() or total_gpus <= 0:
        return np.array([], dtype=int)
    drain_s = float((rem_samples[has] * gpu_s_per_sample[has]).sum()) / total_gpus
    own_s = np.where(has, rem_samples / np.maximum(best, 1e-12), 0.0)
    return np.flatnonzero(has & (own_s >= drain_s) & (own_s >= own_s.max() - float_s))


@dataclass
class JobStats:
    """Per job, what the job-level terms read of all its grids: its fastest throughput (0 without grids),
    GPU-seconds per sample on its most GPU-efficient grid, and whether it has any grid at all. Given to
    `build_problem` with the grids of only some jobs, it stands for the others' grids (the round's
    candidate filter, milp/candidates.py)."""

    best: np.ndarray
    gpu_s: np.ndarray
    has_grids: np.ndarray

    @classmethod
    def of(cls, jobs, grids: dict[str, list[Grid]], blocks: GridBlocks | None = None) -> JobStats:
        return _GridArrays.of(jobs, grids, blocks).stats(len(jobs))


@dataclass
class JobTerms:
    """The job-level terms of a round, over every job of the snapshot."""

    stats: JobStats
    rem_samples: np.ndarray
    base: np.ndarray  # job_priority
    deadline_need: np.ndarray
    deadline_weight: np.ndarray
    guard_need: np.ndarray
    guard_weight: np.ndarray

    def targeted(self) -> np.ndarray:
        """Jobs with a soft throughput target (as ClusterProblem.targeted)."""
        return (self.deadline_need > 0) | (self.guard_need > 0)


def job_terms(snapshot: ClusterSnapshot, stats: JobStats, opts: ArenaOptions) -> JobTerms:
    jobs = snapshot.jobs
    rem_samples = np.array([j.remaining_iterations * j.batch_size for j in jobs], dtype=float)
    base = job_priority(snapshot, stats.best, rem_samples, opts)
    need, dweight = deadline_targets(snapshot, stats.best, rem_samples, base, opts)
    gneed, gweight = makespan_targets(jobs, stats, rem_samples, base, sum(n.num_gpus for n in snapshot.nodes), opts)
    return JobTerms(stats, rem_samples, base, need, dweight, gneed, gweight)


def build_problem(snapshot: ClusterSnapshot, grids: dict[str, list[Grid]], opts: ArenaOptions,
                  terms: JobTerms | None = None, blocks: GridBlocks | None = None) -> ClusterProblem:
    """`terms`: the job-level terms when `grids` holds only some jobs' grids (job_terms over all of them);
    None: computed from `grids`, which then hold every job's. `blocks`: grid lists already read this round."""
    jobs = snapshot.jobs
    g = _GridArrays.of(jobs, grids, blocks)
    if terms is None:
        terms = job_terms(snapshot, g.stats(len(jobs)), opts)
    value = grid_values(jobs, g, terms, opts)
    pinfo = pool_occupancy(snapshot, pools(snapshot))
    without = [j for j, has in zip(jobs, terms.stats.has_grids) if not has]
    totals = pool_totals(snapshot) if without else None
    reasons = {j.id: no_grid_reason(j, snapshot, totals) for j in without}
    return ClusterProblem(
        job_ids=[j.id for j in jobs], grids=g.flat, job_of=g.job_of, value=value, units=g.units,
        pool_of=[x.pool for x in g.flat], current=g.current, throughput=g.tput, pools=pinfo,
        running=np.array([j.running is not None for j in jobs], dtype=bool),
        preempt_penalty=preemption_penalty(jobs, g, value, opts), deadline_need=terms.deadline_need,
        deadline_weight=terms.deadline_weight, max_reconfigs=opts.max_reconfigs_per_round, waiting_reason=reasons,
        guard_need=terms.guard_need, guard_weight=terms.guard_weight)


class GridBlocks:
    """Per distinct grid list, its grids' columns (Grid.columns) as an (n, 4) array, made once per list:
    waiting jobs of one workload hold the same grid objects, a round reads the running jobs' grids twice
    (the candidate ranking, then the model), and a running job's grids are the same objects round after
    round (`next`). A list is known by the ids of its grids; the block keeps the grids alive, so an id
    cannot be reused by another grid while it is cached."""

    def __init__(self, last: GridBlocks | None = None):
        self._blocks: dict[tuple, tuple[list, np.ndarray]] = {}
        self._last = {} if last is None else last._blocks

    def of(self, gs) -> np.ndarray:
        key = tuple(map(id, gs))
        hit = self._blocks.get(key)
        if hit is None:
            hit = self._last.get(key)
            if hit is None:
                hit = (list(gs), np.array([g.columns for g in gs], dtype=float).reshape(len(gs), 4))
            self._blocks[key] = hit
        return hit[1]

    def next(self) -> GridBlocks:
        """The next round's blocks: it reuses the lists this round read, and keeps only those it reads."""
        return GridBlocks(self)


@dataclass
class _GridArrays:
    """Every job's grids in one flat list, with the per-grid arrays the parts below read."""

    flat: list[Grid]
    job_of: np.ndarray
    tput: np.ndarray
    gpus: np.ndarray
    current: np.ndarray

    units: np.ndarray  # node units in its pool (Grid.node_units)

    @classmethod
    def of(cls, jobs, grids: dict[str, list[Grid]], blocks: GridBlocks | None = None) -> _GridArrays:
        """`blocks`: the columns of lists already read this round (e.g. by the candidate ranking)."""
        blocks = GridBlocks() if blocks is None else blocks
        lists = [grids.get(j.id, ()) for j in jobs]
        flat = list(chain.from_iterable(lists))
        # whose a grid is comes from the list it is in: waiting jobs of one workload share grid objects,
        # so each distinct list is read once (a few dozen among 150,000 jobs)
        job_of = np.repeat(np.arange(len(jobs), dtype=int), [len(gs) for gs in lists])
        # most jobs of a big round have no grids in the model (left out by the candidate filter)
        c = np.concatenate([np.zeros((0, 4))] + [blocks.of(gs) for gs in lists if gs])
        return cls(flat, job_of, c[:, 0].copy(), c[:, 1].copy(), c[:, 2] > 0, c[:, 3].astype(int))

    def stats(self, num_jobs: int) -> JobStats:
        best = np.zeros(num_jobs)
        if len(self.flat):
            np.maximum.at(best, self.job_of, self.tput)
        return JobStats(best, gpu_seconds_per_sample(self.job_of, self.tput, self.gpus, num_jobs),
                        np.bincount(self.job_of, minlength=num_jobs) > 0)


def job_priority(snapshot: ClusterSnapshot, best: np.ndarray, rem_samples: np.ndarray, opts: ArenaOptions) -> np.ndarray:
    """Per job: weight x SJF factor (median remaining time over its own, at its best speed) x aging."""
    jobs = snapshot.jobs
    rem_time = np.where(best > 0, rem_samples / np.maximum(best, 1e-12), np.inf)
    finite = rem_time[np.isfinite(rem_time) & (rem_time > 0)]
    med = float(np.median(finite)) if len(finite) else 1.0
    sjf = np.clip(med / np.maximum(rem_time, 1e-9), 1.0 / opts.sjf_clip, opts.sjf_clip) ** opts.sjf_exponent
    # a job keeps the priority it earned by waiting once it runs: aging that restarts from zero at
    # every start would preempt it again next round, then restart it, and so on
    waited_h = np.array([(j.waited_s if j.waited_s is not None else
                          0.0 if j.running else max(0.0, snapshot.time - j.submit_time)) / 3600 for j in jobs])
    aging = 1 + np.minimum(opts.aging_per_hour * waited_h, opts.max_aging)
    weight = np.array([j.weight for j in jobs])
    return weight * sjf * aging


def grid_values(jobs, g: _GridArrays, terms: JobTerms, opts: ArenaOptions) -> np.ndarray:
    """Per grid: its job's priority x its speed relative to the job's best, less the share of the round a
    restart onto it loses, less a per-GPU tie-breaker."""
    base, best = terms.base, terms.stats.best
    restart = np.zeros(len(g.flat))
    moved = np.flatnonzero(~g.current)
    if len(moved):
        # a restart's delay depends on the job only through its architecture and whether it resumes: one
        # delay per such kind and GPU count (a few dozen), not per grid
        kinds: dict[tuple, int] = {}
        reps = []  # per kind: (architecture, resumed)
        kind = np.zeros(len(jobs), dtype=int)
        for j in np.unique(g.job_of[moved]).tolist():
            job = jobs[j]
            resumed = job.total_iterations > job.remaining_iterations
            kind[j] = kinds.setdefault((id(job.arch), resumed), len(kinds))
            if kind[j] == len(reps):
                reps.append((job.arch, resumed))
        n = g.gpus[moved].astype(int)
        width = int(n.max()) + 1
        pairs, inv = np.unique(kind[g.job_of[moved]] * width + n, return_inverse=True)
        delays = [opts.reconfig.delay_s(reps[c // width][0], c % width, resumed=reps[c // width][1])
                  for c in pairs.tolist()]
        restart[moved] = np.array(delays)[inv.reshape(-1)]
    return grid_value(base[g.job_of], g.tput / np.maximum(best[g.job_of], 1e-12), restart / opts.horizon_s, g.gpus,
                      opts)


def grid_value(base, speed, restart_share, gpus, opts: ArenaOptions):
    """The value formula, elementwise (arrays that broadcast): priority x speed relative to the job's best,
    less the lost share of the round (`restart_share`, restart delay over the horizon), less the per-GPU
    tie-breaker. The candidate filter evaluates it for jobs whose grids it never builds: the same
    operations in the same order, so it ranks on exactly the values the model gets."""
    value = base * speed
    value = value - value * np.minimum(1.0, restart_share)
    return value - opts.gpu_epsilon * base * gpus / opts.max_gpus_per_job


def preemption_penalty(jobs, g: _GridArrays, value: np.ndarray, opts: ArenaOptions) -> np.ndarray:
    """Per running job: paid when it gets no grid (its current value for the round plus a restart later)."""
    preempt = np.zeros(len(jobs))
    cur = np.flatnonzero(g.current)
    if len(cur):
        j = g.job_of[cur]
        # the resumed restart delay depends on the job only through its architecture: one per (arch, GPUs)
        memo: dict[tuple, float] = {}
        delays = []
        for i, n in zip(j.tolist(), g.gpus[cur].astype(int).tolist()):
            arch = jobs[i].arch
            d = memo.get((id(arch), n))
            if d is None:
                d = memo[(id(arch), n)] = opts.reconfig.delay_s(arch, n, resumed=True)
            delays.append(d)
        preempt[j] = np.maximum(0.0, value[cur]) * np.minimum(1.0, np.array(delays) / opts.horizon_s)
    return preempt


def deadline_targets(snapshot: ClusterSnapshot, best: np.ndarray, rem_samples: np.ndarray, base: np.ndarray,
                     opts: ArenaOptions) -> tuple[np.ndarray, np.ndarray]:
    """Per job: the throughput its deadline needs and the weight of missing it; only deadlines that some
    grid can still meet are enforced (0 otherwise)."""
    n = len(snapshot.jobs)
    need, weight = np.zeros(n), np.zeros(n)
    top = float(base.max()) if n else 0.0
    for i, j in enumerate(snapshot.jobs):
        if j.deadline is None or best[i] <= 0:
            continue
        left = j.deadline - snapshot.time
        req = rem_samples[i] / left if left > 0 else np.inf
        if req <= best[i]:
            need[i] = req
            # scaled by the largest job value so that a reachable deadline outweighs any one job's value
            weight[i] = opts.deadline_weight * top * j.weight
    return need, weight


def makespan_targets(jobs, stats: JobStats, rem_samples: np.ndarray, base: np.ndarray, total_gpus: int,
                     opts: ArenaOptions) -> tuple[np.ndarray, np.ndarray]:
    """Per job: the makespan guard's need (its fastest grid's throughput, for `critical_jobs`) and weight."""
    n = len(jobs)
    need, weight = np.zeros(n), np.zeros(n)
    if opts.makespan_guard and stats.has_grids.any():
        crit = _critical(stats.gpu_s, rem_samples, stats.best, total_gpus, opts.horizon_s)
        need[crit] = stats.best[crit]
        weight[crit] = opts.makespan_weight * float(base.max()) * np.array([j.weight for j in jobs])[crit]
    return need, weight


def pool_occupancy(snapshot: ClusterSnapshot, pool_map: dict) -> dict[tuple, PoolInfo]:
    """Per pool: its nodes no running job occupies, and per occupied node the running jobs' GPUs there."""
    pinfo: dict[tuple, PoolInfo] = {}
    node_pool = {}
    for key, p in pool_map.items():
        pinfo[key] = PoolInfo(key, p.gpus_per_node, 0, {}, _thresholds(p.gpus_per_node))
        for nid in p.node_ids:
            node_pool[nid] = key
    for i, j in enumerate(snapshot.jobs):
        if j.running:
            for nid, gs in j.running.placement.items():
                pinfo[node_pool[nid]].occupied.setdefault(nid, []).append((i, len(gs)))
    for key, p in pool_map.items():  # the occupied nodes are the pool's own
        pinfo[key].empty_nodes = len(p.node_ids) - len(pinfo[key].occupied)
    return pinfo
