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

import heapq
import math
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Literal

from arena_opt.decision import Decision
from arena_opt.feasibility import InfeasibleDecision, check_decision
from arena_opt.perf.estimator import GridShape, PerfEstimator
from arena_opt.policies.base import Policy
from arena_opt.policies.common import GridCache, requested_grid
from arena_opt.reconfig import PRESETS, ReconfigModel
from arena_opt.sim.state import DONE, FUTURE, REJECTED, RUNNING, WAITING, SimJob
from arena_opt.trace import TraceJob
from arena_opt.snapshot import ClusterSnapshot, RunningState

# event kinds; at equal times completions free GPUs first, then reconfigurations end, then arrivals
COMPLETION, READY, ARRIVAL = 0, 1, 2
_EPS = 1e-9


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


@dataclass
class SimResult:
    policy: str
    options: dict
    origin: float
    end: float
    total_gpus: int
    jobs: list[dict]
    timeline: dict[str, list[float]]
    decisions: list[dict]
    stalled: bool
    wall_s: float
    cpu_s: float = 0.0  # CPU time of this process: on a shared machine, closer to what an idle one takes
    decision_log: list | None = None
    policy_options: dict | None = None  # the options the policy ran with (its options model as JSON)


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
        self.truth_grids = GridCache(self.truth)
        self.truth_grids.bind(cluster)
        self._rate_cache: dict[tuple, float | None] = {}
        order = sorted(range(len(trace)), key=lambda i: (trace[i].submit_time, i))
        self.jobs = [SimJob(index=k, spec=trace[i].to_job(), total=trace[i].iterations, submit=trace[i].submit_time,
                            deadline=trace[i].deadline, batch=trace[i].batch_size) for k, i in enumerate(order)]
        self.by_id = {sj.spec.id: sj for sj in self.jobs}
        self.every_tick = self.opt.replan == "every-tick"

    # ---- main loop -------------------------------------------------------------------------------
    def run(self) -> SimResult:
        wall0, cpu0 = time.perf_counter(), time.process_time()
        opt = self.opt
        self.heap: list[tuple] = []
        self.seq = 0
        for sj in self.jobs:
            self._push(sj.submit, ARRIVAL, sj.index, 0)
        origin = self.jobs[0].submit
        end = origin + opt.rounds * opt.interval_s if opt.rounds else math.inf
        self.t = origin
        self.active: dict[int, SimJob] = {}  # arrived and not finished, by submission order
        self.n_waiting = self.n_running = 0
        self.alloc_gpus = self.productive_gpus = 0
        self.thr_total = self.norm_sum = 0.0
        self.timeline: dict[str, list[float]] = {k: [] for k in
                                                 ("t", "throughput", "alloc_gpus", "productive_gpus", "waiting",
                                                  "running", "norm_sum")}
        self.decisions: list[dict] = []
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
                self._record()
            else:
                self.t = tt
                self._tick(tt)
                k_last = k
                dirty_t = None
                self._record()
                if self.progress:
                    self.progress(tt, self.finished, len(self.jobs))
                if self.n_running == 0 and not any(e[1] == ARRIVAL for e in self.heap):
                    break  # idle cluster, no arrivals to come: nothing can change any more
        final = end if end < math.inf else self.t
        for sj in self.active.values():
            sj.sync(final)
        self.t = final
        self._record()
        stalled = opt.rounds is None and any(sj.status == WAITING for sj in self.active.values())
        return SimResult(policy=self.policy.name, options=_options_dict(opt), origin=origin, end=final,
                         total_gpus=self.total_gpus, jobs=[self._job_record(sj) for sj in self.jobs],
                         timeline=self.timeline, decisions=self.decisions, stalled=stalled,
                         wall_s=time.perf_counter() - wall0, cpu_s=time.process_time() - cpu0,
                         decision_log=self.decision_log,
                         policy_options=self.policy.options.model_dump(mode="json"))

    def _push(self, t: float, kind: int, index: int, version: int) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, kind, self.seq, index, version))

    def _handle(self, ev: tuple) -> bool | None:
        """Process one event: True when it changes what a policy would see, None when a later
        decision superseded it."""
        t, kind, _, index, version = ev
        sj = self.jobs[index]
        if kind != ARRIVAL and (version != sj.version or sj.status != RUNNING):
            return None
        self.t = t
        if kind == ARRIVAL:
            return self._arrive(sj, t)
        if kind == COMPLETION:
            self._complete(sj, t)
            return True
        sj.sync(t)
        self._set_productive(sj, True)
        return self.opt.replan_on_ready

    def _arrive(self, sj: SimJob, t: float) -> bool:
        options = self.truth_grids.options(sj.spec)
        if not options:
            sj.status = REJECTED
            sj.reject_reason = "no feasible grid on this cluster (truth)"
            return False
        ref = requested_grid(sj.spec, options)
        sj.ref_throughput = ref.throughput
        sj.best_throughput = max(g.throughput for g in options.values())
        sj.status = WAITING
        sj.wait_since = t
        sj.remaining = float(sj.total)
        sj.synced_at = t
        self.active[sj.index] = sj
        self.n_waiting += 1
        return True

    def _complete(self, sj: SimJob, t: float) -> None:
        sj.sync(t)
        self._release(sj)
        sj.remaining = 0.0
        sj.status = DONE
        sj.finish = t
        self.n_running -= 1
        del self.active[sj.index]
        self.finished += 1

    # ---- ticks -----------------------------------------------------------------------------------
    def _tick(self, t: float) -> None:
        jobs = []
        for sj in self.active.values():
            if sj.status == RUNNING:
                sj.sync(t)
                if sj.running_state is None or sj.snap_version != sj.version:
                    sj.running_state = RunningState.model_construct(gpu_type=sj.gpu_type, placement=sj.placement,
                                                                    plan=sj.plan, since=sj.since)
            sj.snap_version = sj.version
            jobs.append(_copy(sj.spec, {"remaining_iterations": min(float(sj.total), max(0.0, sj.remaining)),
                                        "running": sj.running_state if sj.status == RUNNING else None,
                                        "attained_service_s": sj.gpu_seconds,
                                        "waited_s": sj.waited + (t - sj.wait_since if sj.status == WAITING else 0.0)}))
        snap = ClusterSnapshot.model_construct(version=1, time=t, gpu_catalog=self.cluster.gpu_catalog,
                                               nodes=self.cluster.nodes, jobs=jobs)
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

        for d in decision.jobs:
            sj = self.by_id[d.job_id]
            running = sj.status == RUNNING
            if d.action in ("wait", "start") and running:
                raise error(d, f"action {d.action!r} for a running job")
            if d.action in ("keep", "reshape", "migrate", "preempt") and not running:
                raise error(d, f"action {d.action!r} for a job that is not running")
            if d.action == "keep":
                same = d.gpu_type == sj.gpu_type and (d.plan is sj.plan or d.plan == sj.plan) and (
                    d.placement == sj.placement or {n: sorted(g) for n, g in d.placement.items()} == sj.placement)
                if not same:
                    raise error(d, "'keep' but the allocation differs from the running one")
                continue
            if d.action == "wait":
                continue
            if d.action == "preempt":
                todo.append((sj, d, None, 0.0))
                continue
            placement = {n: sorted(g) for n, g in d.placement.items()}
            nodes = len(placement)
            per_node = max(len(g) for g in placement.values())
            rate = self._truth_rate(sj, d.gpu_type, placement, nodes, per_node, d.plan.pp)
            if rate is None:
                raise error(d, f"{d.gpu_type} {nodes}x{per_node} pp={d.plan.pp} is infeasible in the performance "
                               f"truth (out of memory or not in the table)")
            resumed = running or sj.starts > 0
            delay = self.opt.reconfig.delay_s(sj.spec.arch, d.num_gpus, resumed=resumed)
            todo.append((sj, d, (placement, rate), delay))
        # all releases first: a decision may hand one job's GPUs to another
        for sj, d, _, _ in todo:
            if sj.status == RUNNING:
                self._release(sj)
                if d.action == "preempt":
                    sj.status = WAITING
                    sj.wait_since = t
                    sj.preemptions += 1
                    self.n_running -= 1
                    self.n_waiting += 1
        for sj, d, alloc, delay in todo:
            if alloc is None:
                continue
            placement, rate = alloc
            if d.action == "start":
                if sj.starts > 0:
                    sj.reconfigs += 1
                else:
                    sj.first_start = t
                sj.starts += 1
                sj.waited += t - sj.wait_since
                sj.status = RUNNING
                self.n_waiting -= 1
                self.n_running += 1
            else:
                sj.reconfigs += 1
            sj.gpu_type, sj.placement, sj.plan, sj.num_gpus, sj.rate = d.gpu_type, placement, d.plan, d.num_gpus, rate
            sj.since = t
            sj.synced_at = t
            sj.ready_at = t + delay
            sj.version += 1
            self.alloc_gpus += sj.num_gpus
            if delay <= 0:
                self._set_productive(sj, True)
            else:
                self._push(sj.ready_at, READY, sj.index, sj.version)
            self._push(sj.completion_time(), COMPLETION, sj.index, sj.version)
        if self.decision_log is not None:
            self.decision_log.append({
                "t": t,
                "alloc": {sj.spec.id: (sj.gpu_type, {n: list(g) for n, g in sj.placement.items()})
                          for sj in self.active.values() if sj.status == RUNNING},
                "remaining": {sj.spec.id: sj.remaining for sj in self.active.values()}})
        return len(todo)

    # ---- bookkeeping -----------------------------------------------------------------------------
    def _truth_rate(self, sj: SimJob, gpu_type: str, placement, nodes: int, per_node: int, pp: int) -> float | None:
        link = self.node_of[next(iter(placement))].intra_link
        key = (sj.spec.model, sj.batch, gpu_type, link, nodes, per_node, pp)
        if key not in self._rate_cache:
            plans = self.truth.grid(sj.spec.arch, sj.batch, self.catalog[gpu_type], link,
                                    GridShape(gpu_type, nodes, per_node, pp))
            self._rate_cache[key] = None if plans.proxy is None else 1.0 / plans.proxy.iter_time_s
        return self._rate_cache[key]

    def _set_productive(self, sj: SimJob, on: bool) -> None:
        if sj.productive == on:
            return
        sign = 1 if on else -1
        sj.productive = on
        self.thr_total += sign * sj.throughput
        self.norm_sum += sign * sj.throughput / sj.ref_throughput
        self.productive_gpus += sign * sj.num_gpus

    def _release(self, sj: SimJob) -> None:
        self._set_productive(sj, False)
        self.alloc_gpus -= sj.num_gpus
        sj.placement = {}
        sj.gpu_type, sj.plan, sj.num_gpus, sj.rate = None, None, 0, 0.0
        sj.version += 1

    def _record(self) -> None:
        tl = self.timeline
        tl["t"].append(self.t)
        tl["throughput"].append(max(0.0, self.thr_total))
        tl["alloc_gpus"].append(self.alloc_gpus)
        tl["productive_gpus"].append(self.productive_gpus)
        tl["waiting"].append(self.n_waiting)
        tl["running"].append(self.n_running)
        tl["norm_sum"].append(max(0.0, self.norm_sum))

    def _job_record(self, sj: SimJob) -> dict:
        return {
            "id": sj.spec.id, "model": sj.spec.model, "batch_size": sj.batch, "iterations": sj.total,
            "submit": sj.submit, "deadline": sj.deadline, "status": sj.status if sj.status != FUTURE else "not_arrived",
            "first_start": sj.first_start, "finish": sj.finish,
            "remaining": max(0.0, sj.remaining) if sj.status not in (FUTURE, REJECTED) else float(sj.total),
            "starts": sj.starts, "reconfigs": sj.reconfigs, "preemptions": sj.preemptions,
            "gpu_seconds": sj.gpu_seconds, "productive_gpu_seconds": sj.productive_gpu_seconds,
            "restart_seconds": sj.restart_seconds, "ref_throughput": sj.ref_throughput,
            "best_throughput": sj.best_throughput, "waited_s": sj.waited,
            "requested_gpu_type": sj.spec.requested_gpu_type, "requested_num_gpus": sj.spec.requested_num_gpus,
            "reject_reason": sj.reject_reason,
        }


def _copy(model, update: dict):
    """A shallow copy of a trusted pydantic model with some fields replaced, without validation
    (`model_copy` does the same through slower generic paths). Only for the simulator's own state,
    which was validated when the trace was loaded."""
    new = object.__new__(type(model))
    d = dict(model.__dict__)
    d.update(update)
    object.__setattr__(new, "__dict__", d)
    object.__setattr__(new, "__pydantic_fields_set__", model.__pydantic_fields_set__)
    object.__setattr__(new, "__pydantic_extra__", None)
    object.__setattr__(new, "__pydantic_private__", None)
    return new


def _options_dict(opt: SimOptions) -> dict:
    d = asdict(opt)
    d["reconfig"] = opt.reconfig.model_dump()
    return d
