"""Advice mode: a decision carried out on the users' own held jobs (`sbatch --hold --comment=arena:...`).

Each held job that the decision starts gets its nodes, GPU type and count, and its plan (in the
comment's `plan`, which the job reads back with `squeue -h -j $SLURM_JOB_ID -o %k`), one
`scontrol update` per field (Slurm refuses some combinations in one update, e.g. a typed with an
untyped GPU request), then `scontrol release`. Held jobs are best submitted without --gres: a typed
request can change its count but not its type (Slurm 22.05 then never runs the job), and an untyped
one cannot become typed (Slurm refuses the update). A refused update stops that job's sequence: the job
stays held and the error names it with Slurm's message. Jobs told to wait stay held.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

from arena_opt.decision import Decision, JobDecision
from arena_opt.slurm.commands import SlurmCommandError, slurm
from arena_opt.slurm.gres import gpus_of, parse_gres
from arena_opt.slurm.meta import format_meta
from arena_opt.slurm.snapshot import SlurmJobView, SlurmView


@dataclass
class ApplyReport:
    lines: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    released: list[str] = field(default_factory=list)


def job_commands(v: SlurmJobView, jd: JobDecision, view: SlurmView) -> list[list[str]]:
    """The scontrol commands that give held job `v` the decision's allocation and release it."""
    assert jd.plan is not None and v.meta is not None
    missing = [n for n in jd.placement if n not in view.gres_type]
    if missing:
        raise ValueError(f"node(s) {', '.join(missing)} are not offered by Slurm now")
    types = {view.gres_type[n] for n in jd.placement}
    if len(types) != 1:
        raise ValueError(f"the decision's nodes have GPUs of several GRES types: {sorted(types)}")
    gres = types.pop()
    asked = [g.type for g in gpus_of(parse_gres(v.components[0].tres_per_node)) if g.type]
    if asked and asked[0] != gres:
        # measured on 22.05: after such an update the job is "never runnable" (BadConstraints)
        raise ValueError(f"it asks for GPU type {asked[0]!r} and Slurm does not run a held job whose GPU type "
                         f"was changed to {gres!r}; submit held jobs without --gres (arena-opt sets type and "
                         "count) or with the type to keep")
    nodes = list(jd.placement)
    per_node = max(len(g) for g in jd.placement.values())
    head = v.components[0]
    jid = f"JobId={v.slurm_id}"
    cmds = []
    if head.required_nodes:
        # a node list longer than the new node count is refused: clear it first
        cmds.append(["scontrol", "update", jid, "ReqNodeList="])
    # N-N: a plain N keeps the submitted maximum (-N1) and growing past it is refused
    cmds.append(["scontrol", "update", jid, f"NumNodes={len(nodes)}-{len(nodes)}"])
    cmds.append(["scontrol", "update", jid, f"ReqNodeList={','.join(nodes)}"])
    if head.features:
        cmds.append(["scontrol", "update", jid, "Features="])  # the nodes are named: constraints could only refuse
    cmds.append(["scontrol", "update", jid, f"TresPerNode=gres:gpu:{gres}:{per_node}"])
    meta = v.meta.model_copy(update={"plan": jd.plan})
    cmds.append(["scontrol", "update", jid, f"Comment={format_meta(meta)}"])
    cmds.append(["scontrol", "release", str(v.slurm_id)])
    return cmds


def apply_decision(decision: Decision, view: SlurmView, dry_run: bool = False) -> ApplyReport:
    rep = ApplyReport()
    for jd in decision.jobs:
        v = view.jobs.get(int(jd.job_id)) if jd.job_id.isdigit() else None
        if v is None:
            rep.errors.append(f"job {jd.job_id}: not in Slurm's queue")
            continue
        if not v.held:
            rep.lines.append(f"# job {jd.job_id}: {v.state.lower()}, not held: left as it is ({jd.action})")
            continue
        if not jd.runs:
            rep.lines.append(f"# job {jd.job_id}: {jd.action}: stays held" + (f" ({jd.reason})" if jd.reason else ""))
            continue
        if v.meta is None:
            rep.errors.append(f"job {jd.job_id}: has no arena metadata in its comment; left held")
            continue
        try:
            cmds = job_commands(v, jd, view)
        except ValueError as e:
            rep.errors.append(f"job {jd.job_id}: {e}; left held")
            continue
        assert jd.plan is not None
        rep.lines.append(f"# job {jd.job_id}: {jd.action} on {jd.num_gpus} x {jd.gpu_type} "
                         f"({', '.join(jd.placement)}), plan {jd.plan.describe()}")
        for argv in cmds:
            if dry_run:
                rep.lines.append(shlex.join(argv))
                continue
            try:
                slurm(*argv)
            except SlurmCommandError as e:
                rep.errors.append(f"job {jd.job_id}: `{shlex.join(argv)}` refused by Slurm: {e.slurm_message}; "
                                  "the job stays held")
                break
            rep.lines.append(shlex.join(argv))
        else:
            if not dry_run:
                rep.released.append(jd.job_id)
    return rep
