"""Node and GPU health, applied once for every policy: the policy decides on a view of the snapshot in which
every node and GPU it sees is usable and every running job may stay where it is; its decision is then mapped
back onto the real snapshot.

- a `down` node is gone from the view; jobs on it are lost: re-planned as waiting jobs, so they come back
  as `migrate`/`reshape` (restarted elsewhere) or `preempt`, with the reason;
- an unavailable GPU is gone from its node (the node offers the others); a job holding one is lost;
- a `drain` node offers only the GPUs its running jobs hold: they keep running until moved, nothing new
  starts there (GPUs a moved job leaves on it stay empty);
- a running job on a GPU type its `allowed_gpu_types` no longer lists is re-planned the same way
  (a normal `migrate`/`reshape` or `preempt` decision with a reason, not an infeasible one).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from arena_opt.decision import Decision, JobDecision
from arena_opt.snapshot import ClusterSnapshot, Job, Node


@dataclass
class HealthView:
    snapshot: ClusterSnapshot  # what the policy decides on
    index: dict[str, list[int]] = field(default_factory=dict)  # node id -> real GPU index of each view index
    moved: dict[str, str] = field(default_factory=dict)  # running job id -> why it cannot stay
    drained: set[tuple[str, int]] = field(default_factory=set)  # (node, real GPU) only its holder may keep

    def restore(self, original: ClusterSnapshot, d: Decision) -> Decision:
        """The view's decision in the real snapshot's terms (GPU indices, actions of re-planned jobs)."""
        jobs = {j.id: j for j in original.jobs}
        out = []
        for jd in d.jobs:
            job = jobs[jd.job_id]
            placement = {n: [self.index[n][g] for g in gs] if n in self.index else list(gs)
                         for n, gs in jd.placement.items()}
            jd = jd.model_copy(update={"placement": placement})
            if jd.runs and _takes_drained(self, job, jd):
                why = f"{self.moved[jd.job_id]}; " if jd.job_id in self.moved else ""
                jd = JobDecision(job_id=jd.job_id, action="preempt" if job.running else "wait",
                                 reason=why + "its grid's GPUs are on a drained node (left by a job moved this "
                                              "round); re-planned next round")
            elif jd.job_id in self.moved:
                why = self.moved[jd.job_id]
                if jd.runs:
                    r = job.running
                    same = jd.num_gpus == r.num_gpus and jd.gpu_type == r.gpu_type and jd.plan == r.plan
                    jd = jd.model_copy(update={"action": "migrate" if same else "reshape", "reason": why})
                else:
                    jd = jd.model_copy(update={"action": "preempt", "reason": f"{why}; {jd.reason}"})
            out.append(jd)
        return d.model_copy(update={"jobs": out})


def _takes_drained(view: HealthView, job: Job, jd: JobDecision) -> bool:
    held = set() if job.running is None or job.id in view.moved else \
        {(n, g) for n, gs in job.running.placement.items() for g in gs}
    return any((n, g) in view.drained and (n, g) not in held for n, gs in jd.placement.items() for g in gs)


def _why_moved(job: Job, nodes: dict[str, Node], healthy: bool) -> str | None:
    r = job.running
    if r is None:
        return None
    # on healthy nodes no placement is lost: only a type no longer allowed moves a job
    for nid, gpus in (() if healthy else r.placement.items()):
        node = nodes[nid]
        if node.state == "down":
            return f"lost: node {nid} is down"
        bad = sorted(set(gpus) & set(node.unavailable_gpus))
        if bad:
            return f"lost: GPU {nid}:{bad[0]} is unavailable"
    if job.allowed_gpu_types and r.gpu_type not in job.allowed_gpu_types:
        return f"moved: runs on {r.gpu_type}, which allowed_gpu_types no longer lists"
    return None


def health_view(snap: ClusterSnapshot) -> HealthView | None:
    """The view a policy decides on, or None when the snapshot is already one (the common case: no
    copy made)."""
    healthy = all(n.state == "available" and not n.unavailable_gpus for n in snap.nodes)
    # asked every round of a simulator: only running jobs can move, and on healthy nodes (no node read)
    # only one whose allowed types changed
    nodes = {} if healthy else {n.id: n for n in snap.nodes}
    moved = {j.id: why for j in snap.jobs if j.running is not None and (j.allowed_gpu_types or not healthy)
             and (why := _why_moved(j, nodes, healthy)) is not None}
    if not moved and healthy:
        return None
    held: dict[str, set[int]] = {}
    for j in snap.jobs:
        if j.running is not None and j.id not in moved:
            for nid, gpus in j.running.placement.items():
                held.setdefault(nid, set()).update(gpus)
    view = HealthView(snapshot=snap, moved=moved)
    new_nodes = []
    for n in snap.nodes:
        if n.state == "down":
            continue
        keep = sorted(set(n.usable_gpus()) | held.get(n.id, set()))
        if n.state == "drain":
            view.drained.update((n.id, g) for g in range(n.num_gpus))
        if not keep:
            continue
        if keep == list(range(n.num_gpus)) and n.state == "available":
            new_nodes.append(n)
            continue
        view.index[n.id] = keep
        ids = None if n.gpu_ids is None else [n.gpu_ids[g] for g in keep]
        new_nodes.append(n.model_copy(update={"num_gpus": len(keep), "gpu_ids": ids, "state": "available",
                                              "unavailable_gpus": []}))
    new_jobs = []
    for j in snap.jobs:
        if j.id in moved:
            # waiting from now on (None would count its whole life as waiting)
            new_jobs.append(j.model_copy(update={"running": None, "waited_s": j.waited_s or 0.0}))
        elif j.running is not None and any(nid in view.index for nid in j.running.placement):
            pos = {nid: {g: i for i, g in enumerate(view.index[nid])} for nid in j.running.placement
                   if nid in view.index}
            placement = {nid: [pos[nid][g] for g in gs] if nid in pos else gs
                         for nid, gs in j.running.placement.items()}
            new_jobs.append(j.model_copy(update={"running": j.running.model_copy(update={"placement": placement})}))
        else:
            new_jobs.append(j)
    view.snapshot = snap.model_copy(update={"nodes": new_nodes, "jobs": new_jobs})
    return view
