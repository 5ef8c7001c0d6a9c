"""Options of the arena policy: objective weights and solver discipline, each with its default's reason."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt

from arena_opt.reconfig import PRESETS, ReconfigModel


class ArenaOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

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
    reconfig: ReconfigModel = Field(default_factory=lambda: PRESETS["checkpoint"].model_copy())
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
    max_gpus_per_job: PositiveInt = 16
    candidate_factor: PositiveFloat | None = Field(
        2.0, description="waiting jobs enter the MILP in order of value per GPU until their smallest grids "
                         "add up to this many times the cluster's GPUs (running jobs and jobs with a "
                         "deadline or makespan target always enter); the rest wait this round. None = every job enters")
    # --- solver ----------------------------------------------------------------------------
    time_limit_s: PositiveFloat = 10.0
    mip_gap: NonNegativeFloat = Field(0.01, description="relative gap; 1e-2 is 5-7x faster than 1e-3 "
                                                        "at 1,000 jobs for 0.6% objective (shared/MEASURED.md)")
    threads: PositiveInt = Field(1, description="HiGHS threads; fixed per process after the first solve")
    shards: PositiveInt = Field(1, description="split level 1 into this many independent job/node shards")
    backend: Literal["pyomo", "highspy"] = Field(
        "pyomo", description="pyomo: the model is built and solved through Pyomo; highspy: the same rows go to "
                             "HiGHS as arrays (less overhead per round, for long simulations)")
    seed: int = 0
