"""The one interface every policy implements, and the shared path from chosen grids to a Decision."""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from typing import ClassVar

from arena_opt.contention import Contention
from arena_opt.decision import Decision, EstimateBand, JobDecision, SolverStats
from arena_opt.grids import Grid
from arena_opt.health import health_view
from arena_opt.linkloads import CommShares, LinkLoads
from arena_opt.milp.options import PolicyOptions
from arena_opt.occupancy import HeldOccupancy, rack_map
from arena_opt.perf.estimator import PerfEstimator
from arena_opt.placement import place
from arena_opt.snapshot import ClusterSnapshot, Job


class Policy(ABC):
    """`decide(snapshot) -> Decision` is all a caller (CLI, simulator, runner loop, user code) needs.
    Configured by its constructor only: `options` (an `Options` model, or a dict validated into one;
    pydantic's ValidationError names the field and value) and the estimator it decides on."""

    name: ClassVar[str] = "policy"
    Options: ClassVar[type[PolicyOptions]] = PolicyOptions

    def __init__(self, options: PolicyOptions | dict | None = None, estimator: PerfEstimator | None = None):
        self.options = self.Options.model_validate({} if options is None else options)
        self.estimator = estimator or PerfEstimator()
        self._options_json = self.options.model_dump(mode="json")  # what every Decision records

    @abstractmethod
    def decide(self, snapshot: ClusterSnapshot) -> Decision: ...


class GridPolicy(Policy):
    """A policy that picks at most one grid per job; the co-location state and the Decision are shared.
    Either it implements `choose` and `decide_usable` places the chosen grids with `placement.place`, or
    it places while it decides and overrides `decide_usable` (the baselines: policies/common.py).
    `options.colocation`: the co-location slowdown model placement and the decision's estimates use (None: off)."""

    def __init__(self, options: PolicyOptions | dict | None = None, estimator: PerfEstimator | None = None):
        super().__init__(options, estimator)
        self._comm_shares: CommShares | None = None  # plans' link shares, kept across rounds
        self._held = HeldOccupancy()  # the running jobs' occupancy, brought from round to round
        self._last = LastDecisions()  # last round's job decisions, for those whose inputs stand

    def decide(self, snapshot: ClusterSnapshot) -> Decision:
        """The decision for `snapshot`, node and GPU health applied (arena_opt/health.py): `decide_usable`
        sees only usable nodes and GPUs and running jobs that may stay where they are."""
        view = health_view(snapshot)
        if view is None:
            return self.decide_usable(snapshot)
        return view.restore(snapshot, self.decide_usable(view.snapshot))

    def decide_usable(self, snapshot: ClusterSnapshot) -> Decision:
        t0 = time.perf_counter()
        chosen, reasons, stats = self.choose(snapshot)
        t1 = time.perf_counter()
        contention = self.contention(snapshot)
        placements = place(snapshot, chosen, contention, self._held)
        slow = None if contention is None else contention.slowdowns()
        t2 = time.perf_counter()
        stats.total_s = t2 - t0
        d = build_decision(snapshot, self.name, chosen, placements, reasons, stats, slow, self._options_json,
                           self._last)
        d.stats.phases.update(place=t2 - t1, decision=time.perf_counter() - t2)
        return d

    def contention(self, snapshot: ClusterSnapshot) -> Contention | None:
        colocation = self.options.colocation
        if colocation is None:
            return None
        est = self.estimator
        shares = self._comm_shares
        if shares is None or shares.params is not est.params:
            shares = self._comm_shares = CommShares(est.params)
        links = LinkLoads({n.id: n for n in snapshot.nodes}, rack_map(snapshot), snapshot.catalog, est.params,
                          colocation)
        return Contention(snapshot, links, shares)

    def choose(self, snapshot: ClusterSnapshot) -> tuple[dict[str, Grid], dict[str, str], SolverStats]:
        """Chosen grid per running/started job, a reason per job left without one, solver stats.
        Needed only by the `decide_usable` above; a policy that overrides it does not implement this."""
        raise NotImplementedError(f"policy {self.name}: neither choose() nor decide_usable() is implemented")


def action_without_grid(job: Job) -> str:
    return "preempt" if job.running else "wait"


def action_for(job: Job, grid: Grid | None, placement: dict[str, list[int]] | None) -> str:
    if grid is None:
        return action_without_grid(job)
    if job.running is None:
        return "start"
    if grid.current:
        return "keep"
    same_size = grid.num_gpus == job.running.num_gpus and grid.shape.gpu_type == job.running.gpu_type
    if same_size and grid.result.plan == job.running.plan:
        return "migrate"
    return "reshape"


def estimate_band(b) -> EstimateBand | None:
    """A grid's `perf.band.Band` as the decision records it."""
    if b is None:
        return None
    return EstimateBand(nominal_s=b.nominal_s, lo_s=b.lo_s, hi_s=b.hi_s, level=b.level, decided_s=b.decided_s,
                        caution=b.caution, group=b.group, outside=list(b.outside))


class LastDecisions:
    """A policy's JobDecisions of its last round by job id, each with what it was made from: most jobs of a
    simulator's or scheduler's round wait for the same reason or keep the same allocation as the round
    before, and their decision is then last round's object (building one is most of `build_decision`).
    Sharing them across rounds is safe because nothing edits a JobDecision (the health view and every
    other caller that changes one copies it), and what one is made from is compared by identity only where
    the object is never edited either: a Grid is frozen, a running state and a placement are replaced, not
    changed, when an allocation changes (`PackedPolicy._sorted_placement`)."""

    __slots__ = ("idle", "placed")

    def __init__(self):
        self.idle: dict[str, tuple] = {}  # job id -> (action, reason, JobDecision)
        self.placed: dict[str, tuple] = {}  # job id -> (grid, running state, placement, slowdown, JobDecision)


def build_decision(snapshot: ClusterSnapshot, policy: str, chosen: dict[str, Grid],
                   placements: dict[str, dict[str, list[int]]], reasons: dict[str, str],
                   stats: SolverStats, slowdowns: dict[str, float] | None = None,
                   options: dict | None = None, last: LastDecisions | None = None) -> Decision:
    """`slowdowns`: predicted co-location factor of the placed jobs (absent = 1); None = not modelled.
    `options`: the policy's options as JSON, recorded in the decision. `last`: the caller's decisions of
    its previous round, reused where their inputs stand, and replaced by this round's."""
    out = []
    unselected = "not selected: higher-value jobs use the capacity"
    idle, reason = JobDecision.idle, reasons.get  # once per job per round: bound here
    last_idle, last_placed = ({}, {}) if last is None else (last.idle, last.placed)
    new_idle: dict[str, tuple] = {}
    new_placed: dict[str, tuple] = {}
    for job in snapshot.jobs:
        jid = job.id
        g = chosen.get(jid)
        running = job.running
        if g is None:  # most jobs of a big round: the short rule, without action_for's arguments
            act = action_without_grid(job)
            why = reason(jid, unselected)
            hit = last_idle.get(jid)
            if hit is not None and hit[0] == act and hit[1] == why:
                jd = hit[2]
            else:
                jd = idle(jid, act, why)
            new_idle[jid] = (act, why, jd)
            out.append(jd)
            continue
        pl = placements.get(jid)
        slow = None if slowdowns is None else slowdowns.get(jid, 1.0)
        hit = last_placed.get(jid)
        # the action, plan and estimates follow from the grid, the running state and the placement
        if hit is not None and hit[0] is g and hit[1] is running and hit[2] is pl and hit[3] == slow:
            jd = hit[4]
        else:
            act = action_for(job, g, pl)
            plan = running.plan if g.current else g.result.plan
            jd = JobDecision.placed(jid, act, g.shape.gpu_type, g.num_gpus, len(pl), pl, plan,
                                    g.result.iter_time_s * (slow or 1.0), g.throughput / (slow or 1.0), slow,
                                    g.result.mem_gib, None if g.result.band is None else estimate_band(g.result.band))
        new_placed[jid] = (g, running, pl, slow, jd)
        out.append(jd)
    if last is not None:
        last.idle, last.placed = new_idle, new_placed
    return Decision(time=snapshot.time, policy=policy, jobs=out, stats=stats, policy_options=options)
