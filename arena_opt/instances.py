"""Synthetic cluster snapshots (`arena-opt gen-instance`): Arena-like job mixes on any node mix."""

from __future__ import annotations

import numpy as np

from arena_opt.gpus import canonical_gpu
from arena_opt.snapshot import ClusterSnapshot, Job, Node, RunningState

# the model sizes and batch sizes of Arena's traces
ARENA_MODELS = ["bert-760M", "bert-1.3B", "bert-2.6B", "bert-6.7B", "moe-690M", "moe-1.3B", "moe-2.4B", "moe-10B",
                "wide_resnet-500M", "wide_resnet-1B", "wide_resnet-2B", "wide_resnet-4B"]
ARENA_BATCHES = [128, 256, 512]

ARENA_CLUSTER = {"a100": (80, 4), "v100": (20, 16), "a40": (160, 2), "a10": (160, 2)}


def cluster_nodes(spec: dict[str, tuple[int, int]], racks_of: int = 16) -> list[Node]:
    """spec: GPU type -> (node count, GPUs per node). Nodes are grouped into racks of `racks_of`."""
    nodes = []
    for t, (count, gpn) in spec.items():
        t = canonical_gpu(t)
        for i in range(count):
            nodes.append(Node(id=f"{t}-{i:03d}", gpu_type=t, num_gpus=gpn, rack=f"{t}-r{i // racks_of}"))
    return nodes


def generate_snapshot(spec: dict[str, tuple[int, int]], num_jobs: int, *, seed: int = 0,
                      running_fraction: float = 0.5, deadline_fraction: float = 0.2,
                      models: list[str] | None = None) -> ClusterSnapshot:
    rng = np.random.default_rng(seed)
    models = models or ARENA_MODELS
    types = [canonical_gpu(t) for t in spec]
    now = 24 * 3600.0
    jobs = []
    for i in range(num_jobs):
        total = int(rng.choice([500, 1000, 2000, 5000, 10000, 20000]))
        rem = float(total if rng.random() > running_fraction else int(total * rng.uniform(0.1, 0.9)))
        submit = float(now - rng.exponential(3 * 3600))
        deadline = float(now + rng.uniform(2, 48) * 3600) if rng.random() < deadline_fraction else None
        jobs.append(Job(id=f"job-{i:04d}", model=str(rng.choice(models)), batch_size=int(rng.choice(ARENA_BATCHES)),
                        total_iterations=total, remaining_iterations=rem, submit_time=max(0.0, submit),
                        deadline=deadline, requested_gpu_type=str(rng.choice(types)),
                        requested_num_gpus=int(rng.choice([1, 2, 4, 8]))))
    snap = ClusterSnapshot(time=now, nodes=cluster_nodes(spec), jobs=jobs)
    return _with_running(snap, [j.id for j in jobs if j.remaining_iterations < j.total_iterations])


def _with_running(snap: ClusterSnapshot, started: list[str] | set[str]) -> ClusterSnapshot:
    """Give the partly-done jobs the placement a greedy round would give them, so that the
    snapshot has realistic running jobs (kept, reshaped or preempted by the next round)."""
    from arena_opt.grids import enumerate_grids
    from arena_opt.milp.greedy import greedy_select
    from arena_opt.milp.options import ArenaOptions
    from arena_opt.milp.problem import build_problem
    from arena_opt.perf.estimator import PerfEstimator
    from arena_opt.placement import place

    started = set(started)  # a set once: rebuilt per job it made a 150k-job instance take > 10 minutes
    sub = snap.model_copy(update={"jobs": [j for j in snap.jobs if j.id in started]})
    p = build_problem(sub, enumerate_grids(sub, PerfEstimator()), ArenaOptions())
    sel = greedy_select(p)
    chosen = {p.job_ids[j]: p.grids[k] for j, k in sel.items()}
    placed = place(sub, chosen)
    jobs = []
    for j in snap.jobs:
        if j.id in chosen:
            g = chosen[j.id]
            j = j.model_copy(update={"running": RunningState(gpu_type=g.shape.gpu_type, placement=placed[j.id],
                                                             plan=g.result.plan, since=snap.time - 600)})
        elif j.id in started:
            j = j.model_copy(update={"remaining_iterations": float(j.total_iterations)})
        jobs.append(j)
    return ClusterSnapshot.model_validate(snap.model_copy(update={"jobs": jobs}).model_dump())
