"""Independent check of a Decision against its snapshot: every policy's output passes it or is an error."""

from __future__ import annotations

from arena_opt.decision import RUNNING_ACTIONS, Decision
from arena_opt.snapshot import ClusterSnapshot


class InfeasibleDecision(RuntimeError):
    pass


def check_decision(snapshot: ClusterSnapshot, decision: Decision) -> None:
    # a simulator checks every round (thousands of jobs, most waiting or kept): each job's checks read
    # plain locals read from the models' __dict__ (a pydantic model's attribute goes through its class's
    # attribute lookup first), and a node's health is looked at in full only when it is not plainly available
    nodes = {n.id: n for n in snapshot.nodes}
    jobs = {j.id: j for j in snapshot.jobs}
    catalog = snapshot.catalog
    seen: set[str] = set()
    # node id -> GPU -> the job given it: a round hands out thousands of GPUs, each looked up by its index
    # in its node's table rather than by a (node, GPU) tuple built and hashed per GPU
    used: dict[str, dict[int, str]] = {}
    for d in decision.jobs:
        dd = d.__dict__
        jid = dd["job_id"]
        job = jobs.get(jid)
        if job is None:
            raise InfeasibleDecision(f"decision for unknown job {jid!r}")
        if jid in seen:
            raise InfeasibleDecision(f"job {jid!r} has two decisions")
        seen.add(jid)
        placement = dd["placement"]
        if dd["action"] not in RUNNING_ACTIONS:
            if placement:
                raise InfeasibleDecision(f"job {jid!r} is {d.action} but holds GPUs")
            continue
        plan, gpu_type = dd["plan"], dd["gpu_type"]
        if plan is None or gpu_type is None:
            raise InfeasibleDecision(f"job {jid!r} runs without a plan or GPU type")
        jd = job.__dict__
        allowed = jd["allowed_gpu_types"]
        if allowed and gpu_type not in allowed:
            raise InfeasibleDecision(f"job {jid!r} placed on disallowed type {gpu_type}")
        count = 0
        running = jd["running"]
        held = {} if running is None else running.placement
        for nid, gpus in placement.items():
            node = nodes.get(nid)
            if node is None:
                raise InfeasibleDecision(f"job {jid!r} placed on unknown node {nid!r}")
            if node.state != "available" or node.unavailable_gpus:
                _check_health(jid, node, gpus, held.get(nid, []))
            if node.gpu_type != gpu_type:
                raise InfeasibleDecision(f"job {jid!r}: node {nid} is {node.gpu_type}, not {gpu_type}")
            num = node.num_gpus
            taken = used.get(nid)
            if taken is None:
                taken = used[nid] = {}
            count += len(gpus)
            if gpus:
                # the rule, checked on whole lists: each GPU exists, is in the list once and is not given
                # to another job; `_gpu_fault` only names the GPU at fault
                mine = dict.fromkeys(gpus, jid)
                if not (0 <= min(gpus) and max(gpus) < num and len(mine) == len(gpus)
                        and taken.keys().isdisjoint(mine)):
                    raise InfeasibleDecision(_gpu_fault(jid, nid, gpus, num, taken))
                taken.update(mine)
        if count != dd["num_gpus"] or count != plan.num_gpus:
            raise InfeasibleDecision(f"job {jid!r}: placement holds {count} GPUs, decision says "
                                     f"{d.num_gpus}, plan needs {plan.num_gpus}")
        if len(placement) > 1 and placement != held and \
                any(len(g) != len(nodes[n].usable_gpus()) for n, g in placement.items()):
            raise InfeasibleDecision(f"job {jid!r} spans nodes without taking them whole")
        if plan.stage_shapes is None:
            if plan.tp > 1 and any(len(g) % plan.tp for g in placement.values()):
                raise InfeasibleDecision(f"job {jid!r}: tp={plan.tp} groups cross nodes")
        else:
            why = plan.tp_group_error([len(g) for g in placement.values()])
            if why:
                raise InfeasibleDecision(f"job {jid!r}: plan {plan.describe()}: {why}")
        bad = plan.batch_error(jd["batch_size"])
        if bad is not None:
            raise InfeasibleDecision(f"job {jid!r}: plan.{bad[0]}: {bad[1]}")
        mem = dd["est_mem_per_gpu_gib"]
        if mem is not None and mem > catalog[gpu_type].memory_gib + 1e-6:
            raise InfeasibleDecision(f"job {jid!r}: {mem:.1f} GiB per GPU exceeds "
                                     f"{catalog[gpu_type].memory_gib} GiB")
    if len(seen) != len(jobs):
        raise InfeasibleDecision(f"no decision for jobs {sorted(set(jobs) - seen)}")


def _gpu_fault(job_id: str, nid: str, gpus: list[int], num: int, taken: dict[int, str]) -> str:
    """What is wrong with a placement's GPU list on node `nid` that `check_decision` rejected: the first GPU
    that does not exist or was given twice (to another job, or twice in the list)."""
    given = dict(taken)
    for g in gpus:
        if not 0 <= g < num:
            return f"job {job_id!r}: GPU {nid}:{g} does not exist"
        other = given.get(g)
        if other is not None:
            return f"GPU {nid}:{g} given to {other!r} and {job_id!r}"
        given[g] = job_id
    return f"job {job_id!r}: GPUs {gpus} of node {nid} rejected"  # not reached: the rule names each fault


def _check_health(job_id: str, node, gpus: list[int], held: list[int]) -> None:
    """New work only on usable GPUs; a job may keep the GPUs it holds on a drained node."""
    if node.state == "down":
        raise InfeasibleDecision(f"job {job_id!r} placed on node {node.id}, which is down")
    bad = sorted(set(gpus) & set(node.unavailable_gpus))
    if bad:
        raise InfeasibleDecision(f"job {job_id!r} placed on unavailable GPU {node.id}:{bad[0]}")
    if node.state == "drain" and not set(gpus) <= set(held):
        raise InfeasibleDecision(f"job {job_id!r} given new GPUs on node {node.id}, which is draining")
