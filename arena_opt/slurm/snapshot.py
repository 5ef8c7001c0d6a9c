"""A ClusterSnapshot from what Slurm reports (parsed by arena_opt.slurm.jsonfmt).

Capacity: every node with typed GPU GRES. Slurm's node state maps onto `Node.state` (named in
`snapshot.notes` with Slurm's reason): DRAIN / DRAINING / DRAINED -> `drain` (its running jobs keep
running until moved, nothing new starts there, as Slurm itself does); DOWN, FAIL, NOT_RESPONDING, MAINT
and the powered-down, future, unknown, rebooting states -> `down` (offers nothing; a job placed on it is
lost and re-planned from its last checkpoint, with that reason).

Fixed occupants: GPUs held by jobs without arena metadata (arena_opt.slurm.meta) are not offered:
the node's `num_gpus` counts its other GPUs and `Node.gpu_ids` maps the snapshot's GPU indices to
Slurm's device indices, so every policy respects the occupant without knowing of it. A node whose
GPUs are all held is left out (noted).

Jobs: running and pending jobs with metadata, by Slurm job id (a heterogeneous job by its leader's).
A running job's placement is read from `gres_detail` (IDX) in snapshot indices; one on a node that
is left out is listed as waiting, to be re-planned from its last checkpoint.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Callable

from pydantic import ValidationError

from arena_opt.errors import InputError
from arena_opt.gpus import BUILTIN_GPUS
from arena_opt.io import format_validation_error
from arena_opt.plan import Plan
from arena_opt.slurm.gres import GpuMap, expand_hostlist, gpus_of, parse_gres
from arena_opt.slurm.jsonfmt import SlurmJob, SlurmNode
from arena_opt.slurm.meta import ArenaMeta, MetaError, has_meta, parse_meta
from arena_opt.snapshot import ClusterSnapshot, Job, Node, RunningState

UNAVAILABLE = frozenset({"DOWN", "DRAIN", "DRAINED", "DRAINING", "FAIL", "FAILING", "MAINT", "NOT_RESPONDING",
                         "NO_RESPOND", "POWERED_DOWN", "POWER_DOWN", "POWERING_DOWN", "FUTURE", "UNKNOWN",
                         "INVALID_REG", "REBOOT_ISSUED"})
DRAINING = frozenset({"DRAIN", "DRAINED", "DRAINING"})
HOLDING = frozenset({"RUNNING", "COMPLETING", "SUSPENDED", "CONFIGURING", "STOPPED", "RESIZING", "SIGNALING",
                     "STAGE_OUT"})
HELD_REASONS = frozenset({"JobHeldUser", "JobHeldAdmin"})
RACK_FEATURE = re.compile(r"^rack[_=:-](?P<rack>.+)$")


@dataclass
class SlurmJobView:
    """One Slurm job (all components of a heterogeneous one) as the snapshot reads it."""

    slurm_id: int
    name: str
    state: str
    held: bool
    meta: ArenaMeta | None
    devices: dict[str, list[int]]  # node -> Slurm device indices (gres_detail IDX), in node order
    gres_types: dict[str, str]  # node -> Slurm GRES type of the job's GPUs there
    components: list[SlurmJob]


@dataclass
class SlurmView:
    snapshot: ClusterSnapshot
    nodes: dict[str, SlurmNode]  # the nodes offered (in the snapshot)
    gres_type: dict[str, str]  # node -> its GRES type name (as Slurm spells it)
    jobs: dict[int, SlurmJobView]  # every job Slurm listed, by leader id
    left_out: dict[str, str] = field(default_factory=dict)  # node -> why it is not offered


def group_jobs(jobs: list[SlurmJob]) -> dict[int, SlurmJobView]:
    groups: dict[int, list[SlurmJob]] = {}
    for j in jobs:
        groups.setdefault(j.leader, []).append(j)
    out = {}
    for leader, comps in groups.items():
        comps.sort(key=lambda c: c.het_job_offset or 0)
        head = comps[0]
        devices: dict[str, list[int]] = {}
        types: dict[str, str] = {}
        for c in comps:
            if not c.nodes or not (set(c.job_state) & HOLDING):
                continue
            try:
                names = expand_hostlist(c.nodes)
            except ValueError as e:
                raise InputError(f"`squeue --json`: job {c.job_id}: field nodes: {e}") from None
            for node, detail in zip(names, c.gres_detail):
                try:
                    gpus = gpus_of(parse_gres(detail))
                except ValueError as e:
                    raise InputError(f"`squeue --json`: job {c.job_id}: field gres_detail: {e}") from None
                for g in gpus:
                    devices.setdefault(node, []).extend(g.indices or ())
                    if g.type:
                        types[node] = g.type
        meta = None
        held = head.state == "PENDING" and (head.state_reason in HELD_REASONS or head.priority == 0)
        out[leader] = SlurmJobView(leader, head.name, head.state, held, meta, devices, types, comps)
    return out


def build_snapshot(nodes: list[SlurmNode], jobs: list[SlurmJob], gpu_map: GpuMap, *, now: float | None = None,
                   partition: str | None = None, gpu_catalog: dict | None = None,
                   own: Callable[[SlurmJobView], bool] | None = None,
                   progress_of: Callable[[str], float | None] | None = None) -> SlurmView:
    """`own(job)`: jobs of the calling runner: neither occupants nor snapshot jobs (the runner reports
    them itself). `progress_of(run_dir)`: iterations done, read from a job's progress directory."""
    now = time.time() if now is None else now
    catalog = {**BUILTIN_GPUS, **(gpu_catalog or {})}
    notes: list[str] = []
    views = group_jobs(jobs)
    managed: dict[int, SlurmJobView] = {}  # jobs whose GPUs the snapshot schedules
    for v in views.values():
        comment = v.components[0].comment
        if own is not None and own(v):
            managed[v.slurm_id] = v
            continue
        if not has_meta(comment) or not (v.state in HOLDING or v.state == "PENDING"):
            continue
        try:
            v.meta = parse_meta(comment or "")
        except MetaError as e:
            notes.append(f"job {v.slurm_id} ({v.name}): {e}; held as a fixed occupant")
            continue
        managed[v.slurm_id] = v

    managed_dev: dict[str, set[int]] = {}
    for v in managed.values():
        if v.state in HOLDING:
            for node, idx in v.devices.items():
                managed_dev.setdefault(node, set()).update(idx)
    foreign_dev: dict[str, set[int]] = {}
    for v in views.values():
        if v.slurm_id not in managed and set().union(*(c.job_state for c in v.components)) & HOLDING:
            for node, idx in v.devices.items():
                foreign_dev.setdefault(node, set()).update(idx)

    out_nodes: list[Node] = []
    offered: dict[str, SlurmNode] = {}
    gres_type: dict[str, str] = {}
    left_out: dict[str, str] = {}
    no_gpu = 0
    for sn in nodes:
        if partition is not None and partition not in sn.partitions:
            continue
        try:
            gpus = gpus_of(parse_gres(sn.gres))
            used = gpus_of(parse_gres(sn.gres_used))
        except ValueError as e:
            raise InputError(f"Slurm node {sn.name}: field gres: {e}") from None
        if not gpus:
            no_gpu += 1
            continue
        bad = sorted(sn.all_states & UNAVAILABLE)
        state = "available" if not bad else ("drain" if set(bad) <= DRAINING else "down")
        if bad:
            why = "+".join(bad) + (f" ({sn.reason})" if sn.reason else "")
            notes.append(f"node {sn.name} {state}: {why}")
        if len({g.type for g in gpus}) > 1:
            why = f"GPUs of several types ({sn.gres}); one type per node is supported"
            left_out[sn.name] = why
            notes.append(f"node {sn.name} left out: {why}")
            continue
        gpu_type = gpu_map.resolve(gpus[0].type, catalog, sn.name, sn.gres or "")
        total = sum(g.count for g in gpus)
        held = set(foreign_dev.get(sn.name, set()))
        known_used = [i for g in used for i in (g.indices or ())]
        if any(g.indices is not None for g in used):
            held |= set(known_used)
        held -= managed_dev.get(sn.name, set())
        free_ids = [i for i in range(total) if i not in held]
        if held:
            notes.append(f"node {sn.name}: GPU(s) {sorted(held)} held by jobs without arena metadata "
                         "(fixed occupants)")
        if not free_ids:
            left_out[sn.name] = "every GPU held by fixed occupants"
            continue
        rack = next((m["rack"] for f in sn.features if (m := RACK_FEATURE.match(f))), None)
        link = "nvlink" if "nvlink" in sn.features else ("pcie" if "pcie" in sn.features else None)
        out_nodes.append(Node(id=sn.name, gpu_type=gpu_type, num_gpus=len(free_ids), rack=rack, intra_link=link,
                              gpu_ids=None if len(free_ids) == total else free_ids, state=state))
        offered[sn.name] = sn
        gres_type[sn.name] = gpus[0].type or ""
    if no_gpu:
        notes.append(f"{no_gpu} node(s) without GPU GRES not offered")

    index = {n.id: n for n in out_nodes}
    out_jobs: list[Job] = []
    for v in managed.values():
        if v.meta is None:
            continue  # the runner's own
        job = _job(v, v.meta, index, now, progress_of, notes)
        if job is not None:
            out_jobs.append(job)
    try:
        snap = ClusterSnapshot(time=now, gpu_catalog=gpu_catalog or {}, nodes=out_nodes, jobs=out_jobs, notes=notes)
    except ValidationError as e:
        raise InputError(format_validation_error("snapshot from Slurm", e)) from None
    return SlurmView(snap, offered, gres_type, views, left_out)


def _job(v: SlurmJobView, m: ArenaMeta, nodes: dict[str, Node], now: float,
         progress_of: Callable[[str], float | None] | None, notes: list[str]) -> Job | None:
    done = m.progress
    if m.run_dir and progress_of is not None:
        p = progress_of(m.run_dir)
        done = p if p is not None else done
    remaining = max(0.0, m.total_iterations - done)
    if remaining == 0:
        return None
    running = None
    if v.state in ("RUNNING", "SUSPENDED", "CONFIGURING"):
        lost = [n for n in v.devices if n not in nodes]
        if lost:
            notes.append(f"job {v.slurm_id} ({v.name}) runs on left-out node(s) {', '.join(lost)}: "
                         "listed as waiting, to be re-planned from its last checkpoint")
        elif v.devices:
            placement = {n: sorted(nodes[n].gpu_ids.index(d) if nodes[n].gpu_ids else d for d in idx)
                         for n, idx in v.devices.items()}
            n_gpus = sum(len(g) for g in placement.values())
            plan = m.plan if m.plan is not None and m.plan.num_gpus == n_gpus else Plan(dp=n_gpus)
            types = {nodes[n].gpu_type for n in placement}
            if len(types) == 1:
                running = RunningState(gpu_type=types.pop(), placement=placement, plan=plan,
                                       since=float(v.components[0].start_time or 0))
    sub = v.components[0]
    try:
        return Job(id=str(v.slurm_id), model=m.model, batch_size=m.batch_size, total_iterations=m.total_iterations,
                   remaining_iterations=remaining, submit_time=float(sub.submit_time or 0), deadline=m.deadline,
                   weight=m.weight, allowed_gpu_types=m.allowed_gpu_types, min_gpus=m.min_gpus, max_gpus=m.max_gpus,
                   requested_gpu_type=m.gpu_type, requested_num_gpus=m.num_gpus, running=running)
    except ValidationError as e:
        err = e.errors()[0]
        notes.append(f"job {v.slurm_id} ({v.name}): metadata field {'.'.join(map(str, err['loc']))}: {err['msg']}; "
                     "not scheduled")
        return None
