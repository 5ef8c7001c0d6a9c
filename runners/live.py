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
re-plans them from their last checkpoint.

Accounting is the run record's (arena_opt/record.py), by the simulator's rules:
decisions write starts, reconfigurations and preemptions at the round's time;
observations write what the runner saw happen (a launch that reports steps is
ready, a job that stopped without being asked crashed, finished, failed). The
output folder gets events.jsonl as events happen and, at the end, record.json
and metrics.json (arena_opt/metrics.py, the simulator's definitions).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from pydantic import BaseModel, ConfigDict, Field, NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt

from arena_opt.decision import Decision
from arena_opt.io import write_json, write_model
from arena_opt.metrics import compute
from arena_opt.policies.base import Policy
from arena_opt.record import RUNNER_KINDS, RUNNING, WAITING, JobRecord, Recorder, RunRecord, model_name
from arena_opt.snapshot import ClusterSnapshot, Job, Node, RunningState
from runners.base import JobSpec, ObservedJob, Runner
from runners.events import EventLog
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
    rec: JobRecord  # what happened to it (submit and deadline on the loop's clock)
    added: bool = False
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
            rec = JobRecord(id=tj.id, model=model_name(tj.model), batch_size=batch, iterations=steps,
                            submit=(tj.submit_time - t0) / options.time_scale, deadline=deadline,
                            requested_gpu_type=tj.gpu_type, requested_num_gpus=tj.num_gpus)
            self.jobs[tj.id] = _LiveJob(tj, spec, rec)
        (self.out / "events.jsonl").write_text("")
        self.recorder = Recorder(RunRecord(policy=policy.name, interval_s=options.interval_s,
                                           total_gpus=sum(n.num_gpus for n in cluster.nodes),
                                           options=options.model_dump(mode="json"),
                                           policy_options=policy.options.model_dump(mode="json")),
                                 events_path=self.out / "events.jsonl")
        for j in self.jobs.values():
            self.recorder.add_job(j.rec)
        # the runner's facts into the record (and events.jsonl), every one also a console line
        runner.set_event_log(EventLog(echo=log, sink=self._runner_event))
        self.decisions: list[dict] = self.recorder.record.decisions
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
        return self._finish(self.now())

    def _round(self, t: float) -> None:
        self._apply_removals(t)
        current = self.runner.cluster_nodes()
        if current is not None:
            # the engine's view (Slurm), node states included: the policies' health view keeps jobs on a
            # drained node and re-plans those on a down one
            self.nodes = [n for n in current if n.id not in self._removed]
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
        self.recorder.sample(t)  # the timeline changes with the decision, not at the next sample
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
                        if j.rec.status == RUNNING:
                            self.recorder.crash(t, j.rec, f"node {node} left")
                self.recorder.note(t, None, "node_lost", node=node)
                self.log(f"[{t:7.1f}s] node {node} left the cluster")

    def _runner_event(self, kind: str, job: str | None, details: dict) -> None:
        # crash and fail are counted transitions: _account_observed records them from the runner's
        # state and message (which carries the failing rank and its last lines)
        if kind in RUNNER_KINDS:
            self.recorder.note(self.now(), job, kind, **details)  # type: ignore[arg-type]

    def _observe(self, t: float) -> dict[str, ObservedJob]:
        """Sample the runner: jobs whose submission has come are added, what it saw happen goes into
        the record (decisions are accounted in _account_decision) and the timeline gets a point."""
        for j in self.jobs.values():
            if not j.added and j.rec.submit <= t:
                self.runner.add_job(j.spec)
                j.added = True
                self.recorder.submit(j.rec.submit, j.rec)
        obs = {o.job_id: o for o in self.runner.status()}
        self._record_finishes(t, obs)
        for jid, j in self.jobs.items():
            o = obs.get(jid)
            if o is not None:
                j.last_obs = o
                self._account_observed(t, j, o)
        self.recorder.sample(t)
        return obs

    def _record_finishes(self, t: float, obs: dict[str, ObservedJob]) -> None:
        """Jobs the runner saw finish, at the time they exited (in order, each with its timeline point:
        the GPUs they held count until then, in the job's record and in the cluster's timeline)."""
        tl = self.recorder.record.timeline["t"]
        last = tl[-1] if tl else 0.0
        ended = sorted((min(t, max(last, self._finish_time(jid, t))), jid) for jid, o in obs.items()
                       if o.state == "finished" and self.jobs[jid].rec.status in (RUNNING, WAITING))
        for tf, jid in ended:
            self.recorder.finish(tf, self.jobs[jid].rec)
            self.recorder.sample(tf)

    def _account_observed(self, t: float, j: _LiveJob, o: ObservedJob) -> None:
        r, rec = j.rec, self.recorder
        if o.state == "failed" and r.status in (RUNNING, WAITING):
            rec.fail(t, r, o.message or "failed")
        elif r.status != RUNNING:
            return
        elif o.state not in ("running", "stopping"):
            # it holds GPUs by the last decision but does not run: its launch failed or its processes died
            rec.crash(t, r, o.message or f"the runner reports it {o.state}")
        elif o.state == "running" and o.samples_per_s:
            # productive once the current launch reports steps (the simulator's "past its reconfiguration")
            r.ref_throughput = self._ref_throughput(j)
            if r.ready:
                rec.speed(t, r, o.samples_per_s)
            else:
                rec.ready(t, r, o.samples_per_s)
        else:
            rec.advance(t, r)

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
            write_json(self.out / "corrections.json",
                       {f"{m}|{g}": f for (m, g), f in getattr(est, "correction", {}).items()})

    def _snapshot(self, t: float, obs: dict[str, ObservedJob]) -> ClusterSnapshot:
        down = self.runner.down_nodes()  # lost, not (yet) back: nothing is placed there
        nodes = [n for n in self.nodes if n.id not in down]
        live_nodes = {n.id for n in nodes}
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
            tj = j.trace
            jobs.append(Job(
                id=jid, model=j.spec.model, batch_size=j.spec.global_batch, total_iterations=j.spec.total_steps,
                remaining_iterations=remaining, submit_time=j.rec.submit, deadline=j.rec.deadline,
                weight=tj.weight, allowed_gpu_types=tj.allowed_gpu_types, min_gpus=tj.min_gpus,
                max_gpus=tj.max_gpus, requested_gpu_type=tj.gpu_type,
                requested_num_gpus=tj.num_gpus, running=running, attained_service_s=j.rec.gpu_seconds,
                waited_s=j.rec.waited_until(t)))
        return ClusterSnapshot(time=t, gpu_catalog=self.cluster.gpu_catalog, nodes=nodes, jobs=jobs)

    def _account_decision(self, t: float, decision: Decision, obs: dict[str, ObservedJob]) -> None:
        for jd in decision.jobs:
            j = self.jobs[jd.job_id]
            r = j.rec
            if jd.runs:
                target = (jd.gpu_type, dict(jd.placement), jd.plan)
                # by the record's rules whatever the action says: a job without GPUs starts (a crashed
                # one the runner relaunches on "keep" too), a running one given others reconfigures
                if r.status == WAITING:
                    self.recorder.start(t, r, jd.num_gpus, action=jd.action, gpu_type=jd.gpu_type)
                elif r.status == RUNNING and jd.action != "keep":
                    self.recorder.reconfigure(t, r, jd.num_gpus, action=jd.action, gpu_type=jd.gpu_type)
                if target != j.decided and jd.est_iter_time_s:
                    j.est_base_s = jd.est_iter_time_s / self._factor(model_name(j.spec.model), jd.gpu_type or "")
                    j.est_gpu = jd.gpu_type or ""
                j.decided = target
                j.lost = False
            else:
                if jd.action == "preempt" and r.status == RUNNING:
                    self.recorder.preempt(t, r)
                j.decided = None

    def _factor(self, model: str, gpu_type: str) -> float:
        return self.policy.estimator.correction.get((model, gpu_type), 1.0)

    def _ref_throughput(self, j: _LiveJob) -> float:
        """Normalisation of a job's throughput (the simulator's ref_throughput): samples/s of the
        policy's estimate for the job's last allocation under the current online correction."""
        if j.est_base_s:
            return j.spec.global_batch / (j.est_base_s * self._factor(model_name(j.spec.model), j.est_gpu))
        return 1.0

    def _done(self, obs: dict[str, ObservedJob]) -> bool:
        return all(j.added and obs.get(jid) is not None and obs[jid].state in ("finished", "failed")
                   for jid, j in self.jobs.items())

    # ------------------------------------------------------------------ results

    def _finish(self, end: float) -> LiveResult:
        obs = {o.job_id: o for o in self.runner.status()}
        self._record_finishes(end, obs)
        for jid, j in self.jobs.items():
            o, r = obs.get(jid), j.rec
            r.ref_throughput = self._ref_throughput(j)
            r.remaining = float(j.spec.total_steps - (o.step if o else 0))
            r.log_path = o.log_path if o else None
        record = self.recorder.close(max(end, 1e-6), stalled=self.stalled, wall_s=end)
        metrics = compute(record)
        metrics["time_scale"] = self.opt.time_scale
        metrics["measured"] = True
        write_json(self.out / "metrics.json", metrics)
        write_model(record, self.out / "record.json")
        return LiveResult(metrics, record.job_dicts(), self.decisions)
