"""Independent check of a Decision against its snapshot: every policy's output passes it or is an error."""

from __future__ import annotations

from arena_opt.decision import Decision
from arena_opt.snapshot import ClusterSnapshot


class InfeasibleDecision(RuntimeError):
    pass


def check_decision(snapshot: ClusterSnapshot, decision: Decision) -> None:
    nodes = {n.id: n for n in snapshot.nodes}
    jobs = {j.id: j for j in snapshot.jobs}
    catalog = snapshot.catalog
    seen: set[str] = set()
    used: dict[tuple[str, int], str] = {}
    for d in decision.jobs:
        if d.job_id not in jobs:
            raise InfeasibleDecision(f"decision for unknown job {d.job_id!r}")
        if d.job_id in seen:
            raise InfeasibleDecision(f"job {d.job_id!r} has two decisions")
        seen.add(d.job_id)
        job = jobs[d.job_id]
        if not d.runs:
            if d.placement:
                raise InfeasibleDecision(f"job {d.job_id!r} is {d.action} but holds GPUs")
            continue
        if d.plan is None or d.gpu_type is None:
            raise InfeasibleDecision(f"job {d.job_id!r} runs without a plan or GPU type")
        if job.allowed_gpu_types and d.gpu_type not in job.allowed_gpu_types:
            raise InfeasibleDecision(f"job {d.job_id!r} placed on disallowed type {d.gpu_type}")
        count = 0
        held = {} if job.running is None else job.running.placement
        for nid, gpus in d.placement.items():
            node = nodes.get(nid)
            if node is None:
                raise InfeasibleDecision(f"job {d.job_id!r} placed on unknown node {nid!r}")
            _check_health(d.job_id, node, gpus, held.get(nid, []))
            if node.gpu_type != d.gpu_type:
                raise InfeasibleDecision(f"job {d.job_id!r}: node {nid} is {node.gpu_type}, not {d.gpu_type}")
            for g in gpus:
                if not 0 <= g < node.num_gpus:
                    raise InfeasibleDecision(f"job {d.job_id!r}: GPU {nid}:{g} does not exist")
                if (nid, g) in used:
                    raise InfeasibleDecision(f"GPU {nid}:{g} given to {used[(nid, g)]!r} and {d.job_id!r}")
                used[(nid, g)] = d.job_id
                count += 1
        if count != d.num_gpus or count != d.plan.num_gpus:
            raise InfeasibleDecision(f"job {d.job_id!r}: placement holds {count} GPUs, decision says "
                                     f"{d.num_gpus}, plan needs {d.plan.num_gpus}")
        if len(d.placement) > 1 and d.placement != held and \
                any(len(g) != len(nodes[n].usable_gpus()) for n, g in d.placement.items()):
            raise InfeasibleDecision(f"job {d.job_id!r} spans nodes without taking them whole")
        if d.plan.uniform and d.plan.tp > 1 and any(len(g) % d.plan.tp for g in d.placement.values()):
            raise InfeasibleDecision(f"job {d.job_id!r}: tp={d.plan.tp} groups cross nodes")
        if not d.plan.uniform:
            why = d.plan.tp_group_error([len(g) for g in d.placement.values()])
            if why:
                raise InfeasibleDecision(f"job {d.job_id!r}: plan {d.plan.describe()}: {why}")
        bad = d.plan.batch_error(job.batch_size)
        if bad is not None:
            raise InfeasibleDecision(f"job {d.job_id!r}: plan.{bad[0]}: {bad[1]}")
        if d.est_mem_per_gpu_gib is not None and d.est_mem_per_gpu_gib > catalog[d.gpu_type].memory_gib + 1e-6:
            raise InfeasibleDecision(f"job {d.job_id!r}: {d.est_mem_per_gpu_gib:.1f} GiB per GPU exceeds "
                                     f"{catalog[d.gpu_type].memory_gib} GiB")
    missing = set(jobs) - seen
    if missing:
        raise InfeasibleDecision(f"no decision for jobs {sorted(missing)}")


def _check_health(job_id: str, node, gpus: list[int], held: list[int]) -> None:
    """New work only on usable GPUs; a job may keep the GPUs it holds on a drained node."""
    if node.state == "down":
        raise InfeasibleDecision(f"job {job_id!r} placed on node {node.id}, which is down")
    bad = sorted(set(gpus) & set(node.unavailable_gpus))
    if bad:
        raise InfeasibleDecision(f"job {job_id!r} placed on unavailable GPU {node.id}:{bad[0]}")
    if node.state == "drain" and not set(gpus) <= set(held):
        raise InfeasibleDecision(f"job {job_id!r} given new GPUs on node {node.id}, which is draining")
