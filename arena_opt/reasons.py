"""Why a job has no grid at all, named by its true cause (the cluster's size or types before memory)."""

from __future__ import annotations

from arena_opt.snapshot import ClusterSnapshot, Job


def no_grid_reason(job: Job, snapshot: ClusterSnapshot) -> str:
    types = {n.gpu_type for n in snapshot.nodes}
    allowed = [t for t in (job.allowed_gpu_types or sorted(types)) if t in types]
    if not allowed:
        return (f"none of its allowed GPU types ({', '.join(job.allowed_gpu_types or [])}) is in the cluster "
                f"(it has {', '.join(sorted(types)) or 'no nodes'})")
    per_type = {t: sum(n.num_gpus for n in snapshot.nodes if n.gpu_type == t) for t in allowed}
    most = max(per_type.values())
    if job.min_gpus > most:
        t = max(per_type, key=per_type.get)
        return f"needs at least {job.min_gpus} GPUs (min_gpus), more than any pool offers (largest: {most} x {t})"
    if job.min_gpus > job.batch_size:
        return f"min_gpus {job.min_gpus} exceeds batch_size {job.batch_size}: no data-parallel split fits"
    return "no grid fits: the model does not fit in memory on any allowed GPU type and count"
