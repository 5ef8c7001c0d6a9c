"""Live loop: the scheduler on the wall clock driving real jobs through a Runner.

Every `interval_s` seconds: jobs of the trace whose (time-scaled) submission
has come are added; observed progress becomes the snapshot (remaining
iterations = total - steps done, running state = what the runner runs);
measured iteration times correct the policy's estimator per (model, GPU
type); the policy decides; the runner applies the decision. Between rounds
the loop samples the runner once a second for the metrics timeline.

Scaling a trace to a small machine: submission times and deadlines are
divided by `time_scale`, iteration counts by `iter_scale` and batch sizes by
`batch_divisor` (the snapshot carries the scaled batch, so plans divide it);
models are scaled down unless `scale` is None.

A node that leaves (`node_removals`) is dropped from the snapshot; its jobs
lose their processes without saving (as when a node dies) and the policy
re-plans them from their last checkpoint. At the end the same metrics as the
simulator are computed from what was measured (`arena_opt.sim.metrics`).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from pydantic import BaseModel, ConfigDict, Field, NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt

from arena_opt.decision import Decision
from arena_opt.policies.base import Policy
from arena_opt.snapshot import ClusterSnapshot, Job, Node, RunningState
from runners.base import JobSpec, ObservedJob, Runner
from runners.spec import Scale


class LiveOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    interval_s: PositiveFloat = 15.0
    time_scale: PositiveFloat = Field(100.0, description="trace seconds per wall second")
    iter_scale: PositiveInt = Field(10, description="trace iterations per run step")
    batch_divisor: PositiveInt = 8
    max_jobs: PositiveInt | None = None
    duration_s: PositiveFloat | None = Field(None, description="stop after this many wall seconds")
    scale: Scale | None = Field(default_factory=Scale)
    node_removals: list[tuple[str, NonNegativeFloat]] = Field(default_factory=list,
                                                             description="(node id, wall second) a node leaves")
    observe_weight: float = Field(0.5, gt=0, le=1)
    seed: NonNegativeInt = 0
    stall_rounds: PositiveInt = Field(3, description="stop when this many rounds in a row run nothing and "
                                                     "start nothing while jobs wait (they cannot be placed)")
    step_delay_s: NonNegativeFloat = Field(0.0, description="pace every job (tests and demos on CPU)")


@dataclass
class _LiveJob:
    trace: object  # arena_opt.trace.TraceJob
    spec: JobSpec
    submit: float
    deadline: float | None
    added: bool = False
    first_start: float | None = None
    finish: float | None = None
    starts: int = 0
    reconfigs: int = 0
    preemptions: int = 0
    gpu_seconds: float = 0.0
    productive_gpu_seconds: float = 0.0
    waited: float = 0.0  # seconds waited in finished waiting spells (queued or preempted)
    wait_since: float | None = None  # start of the current waiting spell; None while it runs
    decided: tuple | None = None  # (gpu_type, placement, plan) the last decision gave it
    est_base_s: float | None = None  # the policy's iteration time for `decided`, without online correction
    est_gpu: str = ""  # GPU type of that estimate
    last_obs: ObservedJob | None = None
    lost: bool = False  # its node left: not running, whatever the runner saw last


@dataclass
class LiveResult:
    metrics: dict
    jobs: list[dict]
    decisions: list[dict] = field(default_factory=list)


class LiveLoop:
    def __init__(self, cluster: ClusterSnapshot, trace: list, runner: Runner, policy: Policy, options: LiveOptions,
                 out_dir: str | Path, log: Callable[[str], None] = print) -> None:
        if cluster.jobs:
            raise ValueError("the cluster snapshot must not contain jobs")
        self.cluster = cluster
        self.nodes: list[Node] = list(cluster.nodes)
        self.runner = runner
        self.policy = policy
        self.opt = options
        self.out = Path(out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        self.log = log
        trace = sorted(trace, key=lambda t: t.submit_time)[: options.max_jobs]
        t0 = trace[0].submit_time if trace else 0.0
        self.jobs: dict[str, _LiveJob] = {}
        for tj in trace:
            steps = max(1, tj.iterations // options.iter_scale)
            batch = max(1, tj.batch_size // options.batch_divisor)
            spec = JobSpec(job_id=tj.id, model=tj.model, global_batch=batch, total_steps=steps,
                           scale=options.scale, seed=options.seed, step_delay_s=options.step_delay_s)
            deadline = None if tj.deadline is None else (tj.deadline - t0) / options.time_scale
            self.jobs[tj.id] = _LiveJob(tj, spec, (tj.submit_time - t0) / options.time_scale, deadline)
        self.timeline: dict[str, list[float]] = {k: [] for k in
                                                 ("t", "throughput", "alloc_gpus", "productive_gpus", "waiting",
                                                  "running", "norm_sum")}
        self.decisions: list[dict] = []
        self.t0 = 0.0
        self._removed: set[str] = set()
        self._removals = list(options.node_removals)  # appended to by remove_node() from other threads
        self._idle_rounds = 0
        self.stalled = False

    # ------------------------------------------------------------------ main loop

    def now(self) -> float:
        return time.time() - self.t0

    def run(self) -> LiveResult:
        self.t0 = time.time()
        next_round = 0.0
        try:
            while True:
                t = self.now()
                obs = self._observe(t)
                if self._done(obs) or (self.opt.duration_s is not None and t >= self.opt.duration_s):
                    break
                if t >= next_round:
                    self._round(t)
                    next_round = t + self.opt.interval_s
                    if self._idle_rounds >= self.opt.stall_rounds:
                        self.stalled = True
                        self.log(f"[{t:7.1f}s] stalled: {self._idle_rounds} rounds without anything to run")
                        break
                time.sleep(min(1.0, max(0.05, next_round - self.now())))
        finally:
            self.runner.shutdown()
        return self._finish()

    def _round(self, t: float) -> None:
        self._apply_removals(t)
        for j in self.jobs.values():
            if not j.added and j.submit <= t:
                self.runner.add_job(j.spec)
                j.added = True
        obs = self._observe(t)
        self._feed_estimator()
        snap = self._snapshot(t, obs)
        busy = any(o.state in ("running", "stopping") for o in obs.values())
        all_in = all(j.added for j in self.jobs.values())
        if not snap.jobs:
            self._idle_rounds = self._idle_rounds + 1 if all_in and not busy else 0
            return
        w0 = time.perf_counter()
        decision: Decision = self.policy.decide(snap)
        wall = time.perf_counter() - w0
        self._account_decision(t, decision, obs)
        self.runner.apply(decision)
        acts = {a: sum(1 for d in decision.jobs if d.action == a) for a in
                ("start", "keep", "reshape", "migrate", "preempt", "wait")}
        self.decisions.append({"t": t, "wall_s": wall, "apply_s": time.perf_counter() - w0 - wall, **acts})
        with open(self.out / "decisions.jsonl", "a") as f:
            f.write(json.dumps({"t": t, "decision": json.loads(decision.model_dump_json())}) + "\n")
        starts = any(d.runs and d.action != "keep" for d in decision.jobs)
        self._idle_rounds = self._idle_rounds + 1 if all_in and not busy and not starts else 0
        self.log(f"[{t:7.1f}s] round {len(self.decisions)}: {len(snap.jobs)} jobs, "
                 + ", ".join(f"{k} {v}" for k, v in acts.items() if v) + f" (decide {wall:.2f}s)")

    # ------------------------------------------------------------------ pieces

    def remove_node(self, node_id: str) -> None:
        """A node leaves now (applied at the next round); safe to call from another thread."""
        self._removals.append((node_id, 0.0))

    def _apply_removals(self, t: float) -> None:
        for node, at in list(self._removals):
            if at <= t and node not in self._removed:
                self._removed.add(node)
                self.nodes = [n for n in self.nodes if n.id != node]
                for jid, j in self.jobs.items():
                    o = j.last_obs
                    if o is not None and o.state == "running" and node in o.placement:
                        # the node is gone and with it this job's ranks: no checkpoint can be written now
                        self.runner.stop(jid, save=False)
                        j.lost = True
                self.log(f"[{t:7.1f}s] node {node} left the cluster")

    def _observe(self, t: float) -> dict[str, ObservedJob]:
        obs = {o.job_id: o for o in self.runner.status()}
        dt = (t - self.timeline["t"][-1]) if self.timeline["t"] else 0.0
        thr = norm = 0.0
        alloc = prod = running = waiting = 0
        for jid, j in self.jobs.items():
            o = obs.get(jid)
            if o is None:
                continue
            j.last_obs = o
            if o.state == "finished" and j.finish is None:
                j.finish = self._finish_time(jid, t)
            if o.state in ("running", "stopping"):
                alloc += o.num_gpus
                j.gpu_seconds += o.num_gpus * dt
                # productive once the current launch reports steps (the simulator's "past its reconfiguration")
                if o.state == "running" and o.samples_per_s:
                    running += 1
                    prod += o.num_gpus
                    thr += o.samples_per_s
                    norm += o.samples_per_s / max(self._ref_throughput(j), 1e-9)
                    j.productive_gpu_seconds += o.num_gpus * dt
            elif o.state in ("pending", "stopped", "crashed"):
                waiting += 1
        # what was observed happened since the previous sample: the simulator's step functions hold
        # value[i] on [t[i], t[i+1]), so the rates go to the previous sample and are carried forward
        tl = self.timeline
        vals = {"throughput": thr, "alloc_gpus": alloc, "productive_gpus": prod, "waiting": waiting,
                "running": running, "norm_sum": norm}
        for k, v in vals.items():
            if tl["t"]:
                tl[k][-1] = float(v)
            tl[k].append(float(v))
        tl["t"].append(t)
        return obs

    def _finish_time(self, jid: str, t: float) -> float:
        events = getattr(self.runner, "events", None)
        if events is not None:
            for e in reversed(events(jid)):
                if e["event"] == "exit" and e["reason"] == "finished":
                    return e["time"] - self.t0
        return t

    def _feed_estimator(self) -> None:
        est = self.policy.estimator
        for m in self.runner.measurements():
            j = self.jobs.get(m.job_id)
            if j is None or j.decided is None or j.est_base_s is None:
                continue
            if (m.gpu_type, m.plan) != (j.decided[0], j.decided[2]):
                continue
            # observe() expects the estimate under the current factor (it divides the factor out)
            est.observe(m.model, m.gpu_type, j.est_base_s * self._factor(m.model, m.gpu_type), m.iter_time_s,
                        weight=self.opt.observe_weight)
        if est is not None:
            (self.out / "corrections.json").write_text(json.dumps(
                {f"{m}|{g}": f for (m, g), f in getattr(est, "correction", {}).items()}, indent=1))

    def _snapshot(self, t: float, obs: dict[str, ObservedJob]) -> ClusterSnapshot:
        live_nodes = {n.id for n in self.nodes}
        jobs = []
        for jid, j in self.jobs.items():
            o = obs.get(jid)
            if not j.added or o is None or o.state in ("finished", "failed"):
                continue
            remaining = max(0, j.spec.total_steps - o.step)
            if remaining == 0:
                continue  # done, exiting
            running = None
            if (o.state == "running" and not j.lost and o.plan is not None and o.gpu_type
                    and set(o.placement) <= live_nodes):
                running = RunningState(gpu_type=o.gpu_type, placement=o.placement, plan=o.plan)
            # waiting spells as the rounds observe them: aging keeps what a job earned by waiting
            # once it runs (Job.waited_s), as in the simulator
            if running is None and j.wait_since is None:
                j.wait_since = j.submit if j.starts == 0 else t
            elif running is not None and j.wait_since is not None:
                j.waited += max(0.0, t - j.wait_since)
                j.wait_since = None
            waited = j.waited + (max(0.0, t - j.wait_since) if j.wait_since is not None else 0.0)
            tj = j.trace
            jobs.append(Job(
                id=jid, model=j.spec.model, batch_size=j.spec.global_batch, total_iterations=j.spec.total_steps,
                remaining_iterations=remaining, submit_time=j.submit, deadline=j.deadline,
                weight=tj.weight, allowed_gpu_types=tj.allowed_gpu_types, min_gpus=tj.min_gpus,
                max_gpus=tj.max_gpus, requested_gpu_type=tj.gpu_type,
                requested_num_gpus=tj.num_gpus, running=running, attained_service_s=j.gpu_seconds,
                waited_s=waited))
        return ClusterSnapshot(time=t, gpu_catalog=self.cluster.gpu_catalog, nodes=self.nodes, jobs=jobs)

    def _account_decision(self, t: float, decision: Decision, obs: dict[str, ObservedJob]) -> None:
        for jd in decision.jobs:
            j = self.jobs[jd.job_id]
            if jd.runs:
                target = (jd.gpu_type, dict(jd.placement), jd.plan)
                o = obs.get(jd.job_id)
                if jd.action == "keep" and o is not None and o.state == "crashed":
                    j.starts += 1  # the runner relaunches it from its checkpoint
                    j.reconfigs += 1
                elif jd.action == "start":
                    j.starts += 1
                    if j.first_start is None:
                        j.first_start = t
                    if j.starts > 1 or j.lost:
                        j.reconfigs += 1  # resume from a checkpoint
                elif jd.action in ("reshape", "migrate"):
                    j.reconfigs += 1
                if target != j.decided and jd.est_iter_time_s:
                    j.est_base_s = jd.est_iter_time_s / self._factor(_model(j.spec.model), jd.gpu_type or "")
                    j.est_gpu = jd.gpu_type or ""
                j.decided = target
                j.lost = False
            else:
                if jd.action == "preempt":
                    j.preemptions += 1
                j.decided = None

    def _factor(self, model: str, gpu_type: str) -> float:
        return self.policy.estimator.correction.get((model, gpu_type), 1.0)

    def _ref_throughput(self, j: _LiveJob) -> float:
        """Normalisation of a job's throughput (the simulator's ref_throughput): samples/s of the
        policy's estimate for the job's last allocation under the current online correction."""
        if j.est_base_s:
            return j.spec.global_batch / (j.est_base_s * self._factor(_model(j.spec.model), j.est_gpu))
        return 1.0

    def _done(self, obs: dict[str, ObservedJob]) -> bool:
        return all(j.added and obs.get(jid) is not None and obs[jid].state in ("finished", "failed")
                   for jid, j in self.jobs.items())

    # ------------------------------------------------------------------ results

    def _finish(self) -> LiveResult:
        end = self.now()
        obs = {o.job_id: o for o in self.runner.status()}
        records = []
        for jid, j in self.jobs.items():
            o = obs.get(jid)
            if not j.added:
                status = "not_arrived"
            elif o is not None and o.state == "finished":
                status = "done"
            elif o is not None and o.state == "failed":
                status = "failed"
            elif j.first_start is None:
                status = "waiting"
            else:
                status = "running"
            tj = j.trace
            records.append({
                "id": jid, "model": j.spec.model, "batch_size": j.spec.global_batch,
                "iterations": j.spec.total_steps, "submit": j.submit, "deadline": j.deadline, "status": status,
                "first_start": j.first_start, "finish": j.finish if status == "done" else None,
                "remaining": float(j.spec.total_steps - (o.step if o else 0)),
                "starts": j.starts, "reconfigs": j.reconfigs, "preemptions": j.preemptions,
                "gpu_seconds": j.gpu_seconds, "productive_gpu_seconds": j.productive_gpu_seconds,
                "restart_seconds": j.gpu_seconds - j.productive_gpu_seconds,
                "ref_throughput": self._ref_throughput(j),
                "requested_gpu_type": tj.gpu_type, "requested_num_gpus": tj.num_gpus,
                "reject_reason": (o.message if o and status == "failed" else None),
                "log_path": o.log_path if o else None,
            })
        metrics = _sim_metrics(self, records, end)
        metrics["failed"] = sum(1 for r in records if r["status"] == "failed")
        metrics["failed_jobs"] = {r["id"]: r["reject_reason"] for r in records if r["status"] == "failed"}
        metrics["time_scale"] = self.opt.time_scale
        metrics["measured"] = True
        (self.out / "metrics.json").write_text(json.dumps(metrics, indent=1))
        (self.out / "jobs.json").write_text(json.dumps(records, indent=1))
        (self.out / "timeline.json").write_text(json.dumps(self.timeline))
        return LiveResult(metrics, records, self.decisions)


def _model(model: object) -> str:
    return model if isinstance(model, str) else getattr(model, "name", str(model))


def _sim_metrics(loop: LiveLoop, records: list[dict], end: float) -> dict:
    """The simulator's metrics over the measured run (same definitions, wall seconds)."""
    from arena_opt.sim.engine import SimResult
    from arena_opt.sim.metrics import compute

    tl = {k: list(v) for k, v in loop.timeline.items()}
    if not tl["t"] or tl["t"][-1] < end:
        for k in tl:
            tl[k].append(end if k == "t" else (tl[k][-1] if tl[k] else 0.0))
    res = SimResult(policy=loop.policy.name,
                    options={"interval_s": loop.opt.interval_s, **loop.opt.model_dump(mode="json")},
                    origin=0.0, end=max(end, 1e-6), total_gpus=sum(n.num_gpus for n in loop.cluster.nodes),
                    jobs=records, timeline=tl, decisions=loop.decisions, stalled=loop.stalled, wall_s=end)
    return compute(res)
