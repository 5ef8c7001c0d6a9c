"""Why a job has no grid at all, named by its true cause (the cluster's size or types before memory)."""

from __future__ import annotations

from arena_opt.snapshot import ClusterSnapshot, Job


def pool_totals(snapshot: ClusterSnapshot) -> dict[str, int]:
    """GPUs per type in the snapshot (computed once per round: a reason is asked for per job)."""
    out: dict[str, int] = {}
    for n in snapshot.nodes:
        out[n.gpu_type] = out.get(n.gpu_type, 0) + n.num_gpus
    return out


def no_grid_reason(job: Job, snapshot: ClusterSnapshot, totals: dict[str, int] | None = None) -> str:
    """`totals`: `pool_totals(snapshot)`, when the caller asks for many jobs."""
    per_all = pool_totals(snapshot) if totals is None else totals
    allowed = [t for t in (job.allowed_gpu_types or sorted(per_all)) if t in per_all]
    if not allowed:
        return (f"none of its allowed GPU types ({', '.join(job.allowed_gpu_types or [])}) is in the cluster "
                f"(it has {', '.join(sorted(per_all)) or 'no nodes'})")
    per_type = {t: per_all[t] for t in allowed}
    most = max(per_type.values())
    if job.min_gpus > most:
        t = max(per_type, key=per_type.get)
        return f"needs at least {job.min_gpus} GPUs (min_gpus), more than any pool offers (largest: {most} x {t})"
    if job.min_gpus > job.batch_size:
        return f"min_gpus {job.min_gpus} exceeds batch_size {job.batch_size}: no data-parallel split fits"
    return "no grid fits: the model does not fit in memory on any allowed GPU type and count"
