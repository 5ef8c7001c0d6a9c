"""The event loop: arrivals, completions, reconfiguration ends and scheduling ticks, in time order.

At a tick the simulator builds a ClusterSnapshot from its state and calls `policy.decide(snapshot)`
(the very call `arena-opt solve` makes), checks the Decision (`feasibility.check_decision` plus the
actions against the simulator's state) and applies it. An infeasible decision stops the run with
an error; nothing is repaired.

Ticks fall on `origin + k * interval` (origin = first submission). Between ticks nothing is
decided; the loop jumps from event to event. With `replan="events"` a tick calls the policy only
when something happened since the last decision (an arrival, a completion, a reconfiguration that
ended); otherwise the snapshot differs only in time and remaining iterations, and a policy whose
decision depends on neither would decide the same again. A run whose policy ages jobs or looks at
remaining work between events uses `replan="every-tick"`. The default "auto" is "events" (no policy
asks for more; the name stays so that recorded configurations load).
"""

from __future__ import annotations

import contextlib
import gc
import heapq
import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Literal

from pydantic import Field

from arena_opt.decision import Decision
from arena_opt.edge import unvalidated
from arena_opt.feasibility import InfeasibleDecision, check_decision
from arena_opt.grids import GridCatalog
from arena_opt.perf.estimator import GridShape, PerfEstimator
from arena_opt.policies.base import Policy
from arena_opt.reconfig import PRESETS, ReconfigModel
from arena_opt.record import NOT_ARRIVED, REJECTED, RUNNING, WAITING, JobRecord, Recorder, RunRecord, model_name
from arena_opt.sim.state import SimJob
from arena_opt.trace import TraceJob
from arena_opt.snapshot import ClusterSnapshot, Job, RunningState

# event kinds; at equal times completions free GPUs first, then reconfigurations end, then arrivals
COMPLETION, READY, ARRIVAL = 0, 1, 2
_EPS = 1e-9
# CPython's first-generation threshold during a run (default 700): a round's survivors (the policy's
# kept LP basis, records) are walked at every 700 net allocations, and with most of them dead a round
# later, 50,000 lets refcounting free them unwalked; fewer young passes also mean fewer full passes over
# the catalogue's long-lived grids and plans (measured: docs/BENCHMARK.md, "Kept (session 12)")
_RUN_GC_THRESHOLD0 = 50_000


class SimulationError(RuntimeError):
    """The policy returned a decision the simulator must not apply."""


@dataclass
class SimOptions:
    interval_s: float = 300.0
    rounds: int | None = None  # stop after this many scheduling intervals; None = until every job finished
    reconfig: ReconfigModel = field(default_factory=lambda: PRESETS["checkpoint"])
    replan: Literal["auto", "events", "every-tick"] = "auto"  # auto = events (see module doc)
    # a reconfiguration that ended changes nothing in the snapshot but time and remaining work
    replan_on_ready: bool = False
    record_decisions: bool = False  # keep every applied allocation (tests)

    def __post_init__(self):
        if self.interval_s <= 0:
            raise ValueError("interval_s must be > 0")
        if self.rounds is not None and self.rounds < 1:
            raise ValueError("rounds must be >= 1")


class SimResult(RunRecord):
    """The run record of a simulation, with the applied allocations when asked for (tests)."""

    decision_log: list[Any] | None = Field(None, exclude=True)


class Simulator:
    def __init__(self, cluster: ClusterSnapshot, trace: list[TraceJob], policy: Policy, *,
                 truth: PerfEstimator | None = None, options: SimOptions | None = None,
                 progress: Callable[[float, int, int], None] | None = None):
        if cluster.jobs:
            raise ValueError("the cluster snapshot must not contain jobs")
        if not trace:
            raise ValueError("empty trace")
        self.cluster = cluster
        self.policy = policy
        self.truth = truth or policy.estimator
        self.opt = options or SimOptions()
        self.progress = progress
        self.node_of = {n.id: n for n in cluster.nodes}
        self.catalog = cluster.catalog
        self.total_gpus = sum(n.num_gpus for n in cluster.nodes)
        self.truth_grids = GridCatalog.of(self.truth)
        order = sorted(range(len(trace)), key=lambda i: (trace[i].submit_time, i))
        self.jobs = [SimJob(index=k, spec=trace[i].to_job(), total=trace[i].iterations, batch=trace[i].batch_size,
                            rec=_job_record(trace[i])) for k, i in enumerate(order)]
        self.by_id = {sj.spec.id: sj for sj in self.jobs}
        self.every_tick = self.opt.replan == "every-tick"

    # ---- main loop -------------------------------------------------------------------------------
    def run(self) -> SimResult:
        with _fewer_collections():
            return self._run()

    def _run(self) -> SimResult:
        wall0, cpu0 = time.perf_counter(), time.process_time()
        opt = self.opt
        self.heap: list[tuple] = []
        self.seq = 0
        origin = self.jobs[0].rec.submit
        self.rec = Recorder(SimResult(policy=self.policy.name, options=_options_dict(opt), origin=origin,
                                      interval_s=opt.interval_s, total_gpus=self.total_gpus,
                                      policy_options=self.policy.options.model_dump(mode="json")))
        for sj in self.jobs:
            self.rec.add_job(sj.rec)
            self._push(sj.rec.submit, ARRIVAL, sj.index, 0)
        end = origin + opt.rounds * opt.interval_s if opt.rounds else math.inf
        self.t = origin
        self.active: dict[int, SimJob] = {}  # arrived and not finished, by submission order
        self.decisions: list[dict] = self.rec.record.decisions
        self.decision_log: list | None = [] if opt.record_decisions else None
        self.finished = 0
        k_last = -1
        dirty_t: float | None = None
        while True:
            te = self.heap[0][0] if self.heap else math.inf
            tt = math.inf
            if not self.active:
                dirty_t = None  # nothing to decide for
            if dirty_t is not None or (self.every_tick and self.active):
                k = max(k_last + 1, math.ceil((max(dirty_t if dirty_t is not None else self.t, self.t) - origin)
                                              / opt.interval_s - _EPS))
                tt = origin + k * opt.interval_s
                if tt >= end - _EPS:
                    tt = math.inf
            if te <= tt:
                if te > end or te == math.inf:
                    break
                ev = heapq.heappop(self.heap)
                changed = self._handle(ev)
                if changed is None:
                    continue  # superseded by a later decision
                if changed:
                    dirty_t = ev[0] if dirty_t is None else dirty_t
                self.rec.sample(self.t)
            else:
                self.t = tt
                self._tick(tt)
                k_last = k
                dirty_t = None
                self.rec.sample(self.t)
                if self.progress:
                    self.progress(tt, self.finished, len(self.jobs))
                if self.rec.running == 0 and not any(e[1] == ARRIVAL for e in self.heap):
                    break  # idle cluster, no arrivals to come: nothing can change any more
        final = end if end < math.inf else self.t
        for sj in self.active.values():
            self._sync(sj, final)
        self.t = final
        for sj in self.jobs:
            r = sj.rec
            r.remaining = float(sj.total) if r.status in (NOT_ARRIVED, REJECTED) else max(0.0, sj.remaining)
        stalled = opt.rounds is None and any(sj.rec.status == WAITING for sj in self.active.values())
        res = self.rec.close(final, stalled=stalled, wall_s=time.perf_counter() - wall0,
                             cpu_s=time.process_time() - cpu0)
        res.decision_log = self.decision_log
        return res

    def _push(self, t: float, kind: int, index: int, version: int) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, kind, self.seq, index, version))

    def _handle(self, ev: tuple) -> bool | None:
        """Process one event: True when it changes what a policy would see, None when a later
        decision superseded it."""
        t, kind, _, index, version = ev
        sj = self.jobs[index]
        if kind != ARRIVAL and (version != sj.version or sj.rec.status != RUNNING):
            return None
        self.t = t
        if kind == ARRIVAL:
            return self._arrive(sj, t)
        if kind == COMPLETION:
            self._complete(sj, t)
            return True
        self._sync(sj, t)
        self.rec.ready(t, sj.rec, sj.throughput)
        return self.opt.replan_on_ready

    def _arrive(self, sj: SimJob, t: float) -> bool:
        options = self.truth_grids.options(sj.spec, self.cluster)
        if not options:
            self.rec.reject(t, sj.rec, "no feasible grid on this cluster (truth)")
            return False
        ref = self.truth_grids.requested(sj.spec, self.cluster)
        sj.rec.ref_throughput = ref.throughput
        sj.rec.best_throughput = max(g.throughput for g in options.values())
        self.rec.submit(t, sj.rec)
        sj.remaining = float(sj.total)
        sj.synced_at = t
        self.active[sj.index] = sj
        return True

    def _complete(self, sj: SimJob, t: float) -> None:
        self._sync(sj, t)
        self.rec.finish(t, sj.rec)
        self._release(sj)
        sj.remaining = 0.0
        del self.active[sj.index]
        self.finished += 1

    # ---- ticks -----------------------------------------------------------------------------------
    def _tick(self, t: float) -> None:
        jobs = []
        add, sync = jobs.append, self._sync  # once per active job per round: bound here
        for sj in self.active.values():
            rec = sj.rec
            running = rec.status == RUNNING
            if running:
                sync(sj, t)
                if sj.running_state is None or sj.snap_version != sj.version:
                    sj.running_state = RunningState.model_construct(gpu_type=sj.gpu_type, placement=sj.placement,
                                                                    plan=sj.plan, since=sj.since)
            sj.snap_version = sj.version
            add(_job_now(sj, min(float(sj.total), max(0.0, sj.remaining)),
                         sj.running_state if running else None, rec.gpu_seconds, rec.waited_until(t)))
        # every field given: a default left to model_construct costs an inspect.signature per round
        snap = ClusterSnapshot.model_construct(version=1, time=t, gpu_catalog=self.cluster.gpu_catalog,
                                               nodes=self.cluster.nodes, jobs=jobs, notes=[])
        w0, c0 = time.perf_counter(), time.process_time()
        decision = self.policy.decide(snap)
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
        try:
            check_decision(snap, decision)
        except InfeasibleDecision as e:
            raise SimulationError(f"t={t:.0f}s: policy {self.policy.name!r} returned an infeasible decision: "
                                  f"{e}") from None
        changed = self._apply(decision, t)
        st = decision.stats
        self.decisions.append({"t": t, "wall_s": wall, "cpu_s": cpu, "jobs": len(jobs), "changed": changed,
                               "status": st.status,
                               "solver_s": st.solve_s, "fallback": st.fallback})

    def _apply(self, decision: Decision, t: float) -> int:
        todo = []
        def error(d, msg):
            return SimulationError(f"t={t:.0f}s: policy {self.policy.name!r}, job {d.job_id!r}: {msg}")

        by_id = self.by_id
        for d in decision.jobs:
            sj = by_id[d.job_id]
            running = sj.rec.status == RUNNING
            action = d.action
            # the two actions of nearly every job of a round first, each with its own rule
            if action == "wait":
                if running:
                    raise error(d, "action 'wait' for a running job")
                continue
            if action == "keep":
                if not running:
                    raise error(d, "action 'keep' for a job that is not running")
                same = d.gpu_type == sj.gpu_type and (d.plan is sj.plan or d.plan == sj.plan) and (
                    d.placement == sj.placement or {n: sorted(g) for n, g in d.placement.items()} == sj.placement)
                if not same:
                    raise error(d, "'keep' but the allocation differs from the running one")
                continue
            if action == "start" and running:
                raise error(d, f"action {action!r} for a running job")
            if action in ("reshape", "migrate", "preempt") and not running:
                raise error(d, f"action {action!r} for a job that is not running")
            if action == "preempt":
                todo.append((sj, d, None, 0.0))
                continue
            placement = {n: sorted(g) for n, g in d.placement.items()}
            nodes = len(placement)
            per_node = max(len(g) for g in placement.values())
            rate = self._truth_rate(sj, d.gpu_type, placement, nodes, per_node, d.plan.pp)
            if rate is None:
                raise error(d, f"{d.gpu_type} {nodes}x{per_node} pp={d.plan.pp} is infeasible in the performance "
                               f"truth (out of memory or not in the table)")
            resumed = running or sj.rec.starts > 0
            delay = self.opt.reconfig.delay_s(sj.spec.arch, d.num_gpus, resumed=resumed)
            todo.append((sj, d, (placement, rate), delay))
        # all releases first: a decision may hand one job's GPUs to another
        for sj, d, _, _ in todo:
            if sj.rec.status == RUNNING:
                if d.action == "preempt":
                    self.rec.preempt(t, sj.rec)
                else:
                    self.rec.reconfigure(t, sj.rec, d.num_gpus, action=d.action, gpu_type=d.gpu_type)
                self._release(sj)
        for sj, d, alloc, delay in todo:
            if alloc is None:
                continue
            placement, rate = alloc
            if d.action == "start":
                self.rec.start(t, sj.rec, d.num_gpus, gpu_type=d.gpu_type)
            sj.gpu_type, sj.placement, sj.plan, sj.num_gpus, sj.rate = d.gpu_type, placement, d.plan, d.num_gpus, rate
            sj.since = t
            sj.synced_at = t
            sj.ready_at = t + delay
            sj.version += 1
            if delay <= 0:
                self.rec.ready(t, sj.rec, sj.throughput)
            else:
                self._push(sj.ready_at, READY, sj.index, sj.version)
            self._push(sj.completion_time(), COMPLETION, sj.index, sj.version)
        if self.decision_log is not None:
            self.decision_log.append({
                "t": t,
                "alloc": {sj.spec.id: (sj.gpu_type, {n: list(g) for n, g in sj.placement.items()})
                          for sj in self.active.values() if sj.rec.status == RUNNING},
                "remaining": {sj.spec.id: sj.remaining for sj in self.active.values()}})
        return len(todo)

    # ---- bookkeeping -----------------------------------------------------------------------------
    def _truth_rate(self, sj: SimJob, gpu_type: str, placement, nodes: int, per_node: int, pp: int) -> float | None:
        link = self.node_of[next(iter(placement))].intra_link
        plans = self.truth_grids.plans(sj.spec.arch, sj.batch, self.catalog[gpu_type], link,
                                       GridShape(gpu_type, nodes, per_node, pp))
        return None if plans.proxy is None else 1.0 / plans.proxy.iter_time_s

    def _sync(self, sj: SimJob, t: float) -> None:
        self.rec.advance(t, sj.rec)
        sj.sync(t)

    def _release(self, sj: SimJob) -> None:
        """The job's allocation is gone (the record has released its GPUs already)."""
        sj.placement = {}
        sj.gpu_type, sj.plan, sj.num_gpus, sj.rate = None, None, 0, 0.0
        sj.version += 1


def _job_record(tj: TraceJob) -> JobRecord:
    return JobRecord(id=tj.id, model=model_name(tj.model), batch_size=tj.batch_size, iterations=tj.iterations,
                     submit=tj.submit_time, deadline=tj.deadline, requested_gpu_type=tj.gpu_type,
                     requested_num_gpus=tj.num_gpus)


def _job_now(sj: SimJob, remaining: float, running: RunningState | None, attained: float, waited: float) -> Job:
    """A shallow copy of a job's spec with its live fields set, without validation (`model_copy` does the
    same through slower generic paths; one per active job per round). Only for the simulator's own state,
    which was validated when the trace was loaded."""
    d = sj.spec_values.copy()
    d["remaining_iterations"], d["running"], d["attained_service_s"], d["waited_s"] = remaining, running, attained, waited
    return unvalidated(type(sj.spec), d, sj.spec_fields)


def _options_dict(opt: SimOptions) -> dict:
    d = asdict(opt)
    d["reconfig"] = opt.reconfig.model_dump()
    return d


@contextlib.contextmanager
def _fewer_collections():
    """The cyclic collector's first threshold raised to _RUN_GC_THRESHOLD0 for the run (restored after)."""
    old = gc.get_threshold()
    gc.set_threshold(max(old[0], _RUN_GC_THRESHOLD0), *old[1:])
    try:
        yield
    finally:
        gc.set_threshold(*old)
