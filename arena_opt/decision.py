"""Decision: the output of every policy, one entry per job plus the solver's account."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, NonNegativeFloat, NonNegativeInt

from arena_opt.edge import unvalidated
from arena_opt.plan import Plan

Action = Literal["start", "keep", "reshape", "migrate", "preempt", "wait"]
RUNNING_ACTIONS = ("start", "keep", "reshape", "migrate")


class EstimateBand(BaseModel):
    """The error band of a chosen grid's estimate (arena_opt/perf/band.py), seconds per iteration alone."""

    model_config = ConfigDict(extra="forbid")

    nominal_s: NonNegativeFloat = Field(description="the model's own estimate")
    lo_s: NonNegativeFloat
    hi_s: NonNegativeFloat
    level: float = Field(gt=0, lt=1, description="nominal coverage of [lo_s, hi_s]")
    decided_s: NonNegativeFloat = Field(description="the conservative time the policy decided on (est_iter_time_s "
                                                    "before co-location)")
    caution: float | None = Field(None, description="the band quantile decided_s is (PolicyOptions.caution)")
    group: str = Field(description="the calibration residuals it comes from (family / GPU count class)")
    outside: list[str] = Field(default_factory=list, description="what of the plan lies outside the measured region")


class JobDecision(BaseModel):
    model_config = ConfigDict(extra="forbid")

    job_id: str
    action: Action
    gpu_type: str | None = None
    num_gpus: NonNegativeInt = 0
    num_nodes: NonNegativeInt = 0
    placement: dict[str, list[NonNegativeInt]] = Field(default_factory=dict, description="node id -> GPU indices")
    plan: Plan | None = None
    est_iter_time_s: NonNegativeFloat | None = Field(
        None, description="seconds per iteration where the job is placed: the plan's time alone x est_slowdown")
    est_throughput: NonNegativeFloat | None = Field(
        None, description="samples/s where the job is placed, co-located jobs included: the plan's throughput "
                          "alone / est_slowdown")
    est_slowdown: float | None = Field(
        None, ge=1.0, description="predicted co-location slowdown (>= 1) from jobs sharing the node's GPU fabric "
                                  "or a rack uplink with this one; 1 = nothing shared; None = not modelled "
                                  "(est_iter_time_s and est_throughput are then the plan's alone)")
    est_mem_per_gpu_gib: NonNegativeFloat | None = None
    est_band: EstimateBand | None = Field(None, description="error band of the plan's estimate; None: measured "
                                                           "or the estimator has no band")
    reason: str | None = Field(None, description="why the job waits or was preempted")

    @property
    def runs(self) -> bool:
        return self.action in RUNNING_ACTIONS

    @classmethod
    def idle(cls, job_id: str, action: Literal["wait", "preempt"], reason: str) -> "JobDecision":
        """`JobDecision(job_id=, action=, reason=)` of a job that gets no GPUs. Policies make one per job
        per round (a simulator: hundreds of thousands per run), so it is built without validation when
        the values are what validation would keep (the id of a validated snapshot job, one of the two
        literals, a str); anything else goes through validation."""
        if type(job_id) is not str or action not in ("wait", "preempt") or type(reason) is not str:
            return cls(job_id=job_id, action=action, reason=reason)
        return unvalidated(cls, {"job_id": job_id, "action": action, "gpu_type": None, "num_gpus": 0, "num_nodes": 0,
                              "placement": {}, "plan": None, "est_iter_time_s": None, "est_throughput": None,
                              "est_slowdown": None, "est_mem_per_gpu_gib": None, "est_band": None,
                              "reason": reason}, _IDLE_SET)

    @classmethod
    def placed(cls, job_id: str, action: str, gpu_type: str, num_gpus: int, num_nodes: int,
               placement: dict[str, list[int]], plan: Plan, est_iter_time_s: float, est_throughput: float,
               est_slowdown: float | None, est_mem_per_gpu_gib: float, est_band: EstimateBand | None
               ) -> "JobDecision":
        """The JobDecision of a job that runs, as `build_decision` makes it, built without validation
        when every value is of the type and range validation would keep: validating it every round
        re-runs the plan's model validator (pydantic runs it on an instance too) for a plan that was
        validated when made. The placement is the policy's own (GPU indices of a validated snapshot's
        running placement or of the occupancy's nodes), and `check_decision` checks it independently."""
        values = {"job_id": job_id, "action": action, "gpu_type": gpu_type, "num_gpus": num_gpus,
                  "num_nodes": num_nodes, "placement": placement, "plan": plan, "est_iter_time_s": est_iter_time_s,
                  "est_throughput": est_throughput, "est_slowdown": est_slowdown,
                  "est_mem_per_gpu_gib": est_mem_per_gpu_gib, "est_band": est_band}
        plain = (type(job_id) is str and action in RUNNING_ACTIONS and type(gpu_type) is str
                 and type(num_gpus) is int and num_gpus >= 0 and type(num_nodes) is int and num_nodes >= 0
                 and type(placement) is dict and type(plan) is Plan and (est_band is None or type(est_band) is EstimateBand)
                 and type(est_iter_time_s) is float and est_iter_time_s >= 0
                 and type(est_throughput) is float and est_throughput >= 0
                 and type(est_mem_per_gpu_gib) is float and est_mem_per_gpu_gib >= 0
                 and (est_slowdown is None or (type(est_slowdown) is float and est_slowdown >= 1.0)))
        if not plain:
            return cls(**values)
        values["reason"] = None
        return unvalidated(cls, values, _PLACED_SET)


_IDLE_SET = frozenset({"job_id", "action", "reason"})
_PLACED_SET = frozenset(JobDecision.model_fields) - {"reason"}


class SolverStats(BaseModel):
    model_config = ConfigDict(extra="forbid")

    solver: str = "none"
    status: str = "not_run"
    objective: float | None = None
    bound: float | None = None
    gap: float | None = None
    build_s: NonNegativeFloat = 0.0
    solve_s: NonNegativeFloat = 0.0
    total_s: NonNegativeFloat = 0.0
    shards: NonNegativeInt = 1
    num_grids: NonNegativeInt = 0
    fallback: bool = Field(False, description="the decision comes from the greedy fallback, not the solver")
    note: str | None = None
    time_limit_s: float | None = Field(None, description="the limit the call was held to, from its start (the CLI: "
                                                         "process entry); None: the policy keeps none")
    phases: dict[str, NonNegativeFloat] = Field(
        default_factory=dict, description="wall seconds of the call's phases in order (read, grids, lp, greedy, "
                                          "improve, highs, place, decision, check; those that ran)")
    cut_short: list[str] = Field(default_factory=list,
                                 description="phases stopped early or skipped because the deadline came")
    over_s: float | None = Field(None, description="wall seconds past time_limit_s when the decision was complete "
                                                   "(the CLI: checked, not yet written); negative: time to spare")


class Decision(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: Literal[1] = 1
    time: NonNegativeFloat = 0.0
    policy: str
    jobs: list[JobDecision]
    stats: SolverStats = Field(default_factory=SolverStats)
    policy_options: dict[str, Any] | None = Field(
        None, description="the options the policy decided with (its options model as JSON: "
                          "make_policy(policy, policy_options) configures the same policy); None = not recorded")

    def by_job(self) -> dict[str, JobDecision]:
        return {j.job_id: j for j in self.jobs}
