"""The Runner interface: what the scheduler calls to make decisions real, and
what it reads back.

A runner knows the jobs it may run (`add_job`, a JobSpec: model, batch, steps),
applies a Decision (start / keep / reshape / migrate / preempt / wait), reports
observed jobs (`status`) and measured iteration times (`measurements`, for the
estimator's online correction), and stops everything on `shutdown`.
"""

from __future__ import annotations

import abc
from typing import Literal, NamedTuple

from pydantic import (BaseModel, ConfigDict, Field, NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt,
                      field_validator)

from arena_opt.decision import Decision, JobDecision
from arena_opt.plan import Plan
from arena_opt.snapshot import Node
from models.catalog import Arch
from runners.spec import Scale, check_model_name

JobState = Literal["pending", "running", "stopping", "stopped", "crashed", "finished", "failed"]


class JobSpec(BaseModel):
    """A job as the runner trains it; the plan and placement come from decisions."""

    model_config = ConfigDict(extra="forbid")

    job_id: str = Field(min_length=1)
    model: str | Arch
    global_batch: PositiveInt
    total_steps: PositiveInt
    scale: Scale | None = Field(default_factory=Scale, description="None = full size (GPUs)")
    lr: PositiveFloat = 1e-3
    seed: NonNegativeInt = 0
    dp_mode: Literal["ddp", "fsdp"] = "ddp"
    step_delay_s: NonNegativeFloat = 0.0
    fail_at_step: NonNegativeInt | None = None
    fail_rank: NonNegativeInt = 0

    @field_validator("model")
    @classmethod
    def _known(cls, v: str | Arch) -> str | Arch:
        return check_model_name(v)


class ObservedJob(BaseModel):
    model_config = ConfigDict(extra="forbid")

    job_id: str
    state: JobState
    step: NonNegativeInt = 0
    total_steps: NonNegativeInt = 0
    loss: float | None = None
    iter_time_s: float | None = Field(None, description="median of the recent steps of the current launch")
    samples_per_s: float | None = None
    peak_mem_gib: float | None = None
    gpu_type: str | None = None
    num_gpus: NonNegativeInt = 0
    placement: dict[str, list[int]] = Field(default_factory=dict)
    plan: Plan | None = None
    generation: NonNegativeInt = 0
    failures: NonNegativeInt = Field(0, description="crashes in a row since the job last made progress")
    steps_lost: NonNegativeInt = Field(0, description="steps run again after restarts, all launches together")
    last_checkpoint_step: NonNegativeInt | None = None
    log_path: str | None = None
    message: str | None = None


class Measurement(BaseModel):
    """One measured iteration time of a (model, gpu_type, num_gpus, plan): the record
    the performance estimator consumes for its online correction."""

    model_config = ConfigDict(extra="forbid")

    job_id: str
    model: str = Field(description="catalog name the scheduler knows the job by")
    arch: str = Field(description="the architecture actually trained (scaled name on CPU)")
    gpu_type: str
    num_gpus: PositiveInt
    plan: Plan
    global_batch: PositiveInt
    iter_time_s: PositiveFloat = Field(description="median over the steps of this window")
    steps: PositiveInt = Field(description="steps the median is over")
    time: float = Field(description="wall clock (s since epoch) at the end of the window")


class RunnerError(RuntimeError):
    """A decision the runner cannot apply (unknown job, inconsistent plan and placement)."""


class RunTarget(NamedTuple):
    """What a decision to run a job names: the GPU type, the placement and the plan, all of them set."""

    gpu_type: str
    placement: dict[str, list[int]]
    plan: Plan


def run_target(jd: JobDecision) -> RunTarget:
    """The GPU type, placement and plan of a decision that runs a job; RunnerError when one is missing."""
    missing = [name for name, v in (("gpu_type", jd.gpu_type), ("placement", jd.placement), ("plan", jd.plan))
               if not v]
    if missing or jd.gpu_type is None or jd.plan is None:
        raise RunnerError(f"decision for job {jd.job_id!r} ({jd.action}) has no {' or '.join(missing)}")
    return RunTarget(jd.gpu_type, jd.placement, jd.plan)


class Runner(abc.ABC):
    @abc.abstractmethod
    def add_job(self, job: JobSpec) -> None: ...

    @abc.abstractmethod
    def apply(self, decision: Decision) -> None: ...

    @abc.abstractmethod
    def status(self) -> list[ObservedJob]: ...

    @abc.abstractmethod
    def stop(self, job_id: str, save: bool = True) -> None: ...

    def measurements(self) -> list[Measurement]:
        """Measured iteration times collected since the last call."""
        return []

    def down_nodes(self) -> set[str]:
        """Nodes this runner found lost and not yet back: a snapshot must leave them out."""
        return set()

    def set_event_log(self, log) -> None:
        """Where the runner's events (runners.events.EventLog) go; a runner that runs nothing has none."""

    def cluster_nodes(self) -> "list[Node] | None":
        """The nodes the runner's cluster offers now (the engine's view: nodes down or drained are
        gone); None = the runner has no view of its own and the loop keeps its node list."""
        return None

    def shutdown(self) -> None:
        """Stop every job; nothing the runner started may outlive this call."""

    def __enter__(self) -> "Runner":
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
