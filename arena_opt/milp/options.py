"""Options of the policies: the fields every policy shares, those of the policies that solve a program,
and the arena policy's objective weights and solver discipline, each with its default's reason.
(The baselines' own models are in arena_opt/policies/options.py.)"""

from __future__ import annotations

from typing import Literal

from pydantic import (ConfigDict, Field, NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt,
                      field_validator)

from arena_opt.edge import EdgeModel
from arena_opt.linkloads import ColocationOptions
from arena_opt.reconfig import PRESETS, ReconfigModel


class PolicyOptions(EdgeModel):
    """What every policy is configured with. Frozen: a policy is configured by its constructor only."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    reconfig: ReconfigModel = Field(
        default_factory=lambda: PRESETS["checkpoint"].model_copy(),
        description="what a (re)start costs on this cluster (a model, or a preset name: "
                    + ", ".join(PRESETS) + "); checkpoint: restart plus a sharded checkpoint save and load, "
                    "the cost of an elastic restart on real hardware")
    colocation: ColocationOptions | None = Field(
        default_factory=ColocationOptions,
        description="co-location slowdown model of placement and of the decision's estimates (None: off, "
                    "est_slowdown null). On by default: jobs that share a PCIe fabric or a rack uplink do slow "
                    "each other. Every policy places through the occupancy engine with it")

    caution: float | None = Field(
        0.9, ge=0.5, lt=1.0,
        description="quantile of each estimate's error band (arena_opt/perf/band.py) that grids are priced at, "
                    "where the estimator carries a band; None: the estimate itself. 0.9 is the upper edge of the "
                    "80% band `arena-opt plan` shows, so a policy decides on the time it displays as the likely "
                    "worst case: a plan the model has never seen measured (other micro-batch counts, more GPUs) "
                    "must beat a measured-like plan by more than the model's own error to be chosen")

    @field_validator("reconfig", mode="before")
    @classmethod
    def _preset(cls, v):
        if isinstance(v, str):
            if v not in PRESETS:
                raise ValueError(f"unknown reconfiguration preset {v!r}; known: {', '.join(PRESETS)}")
            return PRESETS[v].model_copy()
        return v


class SolverOptions(PolicyOptions):
    """Solver discipline of the policies that solve a program every round: always a time limit and a gap."""

    time_limit_s: PositiveFloat = Field(
        10.0, description="wall-clock limit of one round's solve, s: a decision well inside a 300 s round")
    mip_gap: NonNegativeFloat = Field(
        1e-4, description="relative gap at which HiGHS stops; 1e-4 is HiGHS's own default, cheap for the "
                          "baselines' small programs (one binary per job and GPU type)")


class ArenaOptions(SolverOptions):
    # --- objective -------------------------------------------------------------------------
    sjf_exponent: NonNegativeFloat = Field(
        1.0, description="value of a job scales with (median remaining time / its remaining time)^this; "
                         "1 = the Smith-rule weighting that minimizes average completion time, 0 = off")
    sjf_clip: PositiveFloat = Field(100.0, description="cap on that ratio, so a nearly finished job "
                                                       "cannot dominate the whole round")
    aging_per_hour: NonNegativeFloat = Field(
        0.25, description="a job gains this fraction of its value per hour spent waiting (queued or preempted; "
                          "Job.waited_s), and keeps it while it runs, so nothing starves")
    max_aging: NonNegativeFloat = Field(20.0, description="cap on the aging multiplier")
    horizon_s: PositiveFloat = Field(
        300.0, description="planning horizon (the scheduling interval): a restart of R seconds loses "
                           "R/horizon of the job's value this round")
    deadline_weight: NonNegativeFloat = Field(
        10.0, description="penalty per unit of missing fraction of the throughput a deadline needs, in units "
                         "of the most valuable job's value (x the job's weight)")
    makespan_guard: bool = Field(
        True, description="the job that would finish last even on its fastest grid (and any within one "
                          "horizon of it), when that is later than the whole cluster could drain the remaining "
                          "work, sets the makespan: it gets a deadline-like need of its fastest grid's "
                          "throughput, so SJF weighting cannot starve the critical path")
    makespan_weight: NonNegativeFloat = Field(
        1.0, description="penalty per unit of missing fraction of that throughput, in units of the most "
                         "valuable job's value: as much as that job (a deadline weighs deadline_weight)")
    gpu_epsilon: NonNegativeFloat = Field(
        1e-3, description="per-GPU tie-breaker: of two grids with equal value, take the smaller")
    max_reconfigs_per_round: NonNegativeInt | None = Field(
        None, description="cap on running jobs reshaped, migrated or preempted in one round")
    max_gpus_per_job: PositiveInt = Field(
        16, description="largest GPU count offered to a job that does not set its own max_gpus (Job.max_gpus): "
                        "the largest grid the baselines' caches enumerate too")
    candidate_factor: PositiveFloat | None = Field(
        2.0, description="waiting jobs enter the MILP in order of value per GPU until their smallest grids "
                         "add up to this many times the cluster's GPUs (running jobs and jobs with a "
                         "deadline or makespan target always enter); the rest wait this round. None = every job enters")
    # --- solver (time_limit_s as in SolverOptions) ------------------------------------------
    mip_gap: NonNegativeFloat = Field(0.01, description="relative gap; 1e-2 is 5-7x faster than 1e-3 "
                                                        "at 1,000 jobs for 0.6% objective (shared/MEASURED.md)")
    threads: PositiveInt = Field(1, description="HiGHS threads; fixed per process after the first solve")
    standing_share: NonNegativeFloat = Field(
        0.0, description="after the solve, moved running jobs go back to their standing grid where that packs "
                         "and loses nothing (milp/standing.py); above 0, also where all such reverts lose at most "
                         "this share of the objective and the decision stays within mip_gap of its bound (on "
                         "Arena's Philly trace fewer restarts, but a longer average JCT: docs/BENCHMARK.md)")
    pyomo_max_grids: PositiveInt | None = Field(
        20_000, description="models with more grids go to HiGHS as arrays even with backend pyomo: Pyomo's "
                            "hand-off grows to seconds at 60,000 binaries and past a 10 s limit at 170,000")
    highs_max_grids: PositiveInt | None = Field(
        100_000, description="models with more grids are not handed to HiGHS: the greedy start and the local "
                             "improvement (milp/local.py) decide with the whole time limit. HiGHS's MIP setup "
                             "at 173,000 binaries ran past 90 s with no LP iteration, on the level-1 model and "
                             "on its pure-capacity form alike, while at 58,000 it solves in about 4 s (gap 1e-2, "
                             "shared/MEASURED.md); None = always hand the model to HiGHS")
    lp_certificate_max_grids: NonNegativeInt = Field(
        20_000, description="rounds solved as arrays (backend highspy) with at most this many grids solve the LP "
                            "relaxation first and skip the MIP when its optimum is integral or the greedy start is "
                            "within mip_gap of its bound (milp/certify.py): in simulated Philly rounds that is 97% "
                            "of them, at 3% of the MIP's time; 0 = off. Larger rounds go to the MIP directly: at "
                            "170,000 binaries the relaxation alone takes seconds (bench/round_bound.py)")
    shards: PositiveInt = Field(1, description="split level 1 into this many independent job/node shards")
    backend: Literal["pyomo", "highspy"] = Field(
        "pyomo", description="pyomo: the model is built and solved through Pyomo; highspy: the same rows go to "
                             "HiGHS as arrays (less overhead per round, for long simulations)")
    seed: int = Field(0, description="seed of the random tie-breaks when jobs are split into shards: "
                                     "fixed, so that a round decides the same every time")
