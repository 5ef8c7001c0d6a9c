"""The per-job training facts arena-opt needs, carried in the Slurm job's comment:

    sbatch --hold --comment='arena:{"model":"gpt-350M","batch_size":64,"total_iterations":1000}' job.sh

`arena:` followed by one JSON object (ArenaMeta). A job whose comment does not start with `arena:`
is a fixed occupant: its GPUs are taken, it is never moved. `progress` is the iterations done
(the job, or arena-opt's runner, updates it with `scontrol update JobId=ID Comment=...`);
when `run_dir` names the progress directory of a job arena-opt launched, the snapshot reads the
steps from its progress file instead. `plan` is the plan the job runs (arena-opt's runner and
`slurm apply` write it; absent = data parallel over its GPUs).
"""

from __future__ import annotations

import json

from pydantic import (ConfigDict, Field, NonNegativeFloat, PositiveFloat, PositiveInt, ValidationError,
                      field_validator, model_validator)

from arena_opt.edge import EdgeModel
from arena_opt.io import format_validation_error
from arena_opt.plan import Plan
from models.catalog import ARCHITECTURES, arena_model_name

PREFIX = "arena:"


class ArenaMeta(EdgeModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    model: str = Field(description="catalog model name (`arena-opt models`)")
    batch_size: PositiveInt = Field(description="global batch, samples per iteration")
    total_iterations: PositiveInt
    progress: NonNegativeFloat = Field(0, description="iterations done")
    deadline: PositiveFloat | None = Field(None, description="absolute time (s since epoch)")
    weight: PositiveFloat = 1.0
    gpu_type: str | None = Field(None, description="the GPU type the job must run on (catalog name)")
    num_gpus: PositiveInt | None = Field(None, description="the GPU count the job must run on")
    min_gpus: PositiveInt = 1
    max_gpus: PositiveInt | None = None
    allowed_gpu_types: list[str] | None = None
    plan: Plan | None = None
    run_dir: str | None = Field(None, description="progress directory of a job arena-opt launched")
    runner: str | None = Field(None, description="tag of the arena-opt runner that launched the job")
    job: str | None = Field(None, description="the job's id in that runner")

    @field_validator("model")
    @classmethod
    def _known(cls, v: str) -> str:
        if arena_model_name(v) not in ARCHITECTURES:
            raise ValueError(f"unknown model {v!r} (see `arena-opt models`)")
        return v

    @model_validator(mode="after")
    def _check(self) -> "ArenaMeta":
        if self.max_gpus is not None and self.max_gpus < self.min_gpus:
            raise ValueError(f"max_gpus {self.max_gpus} is below min_gpus {self.min_gpus}")
        return self


class MetaError(ValueError):
    pass


def has_meta(comment: str | None) -> bool:
    return bool(comment) and comment.lstrip().startswith(PREFIX)


def parse_meta(comment: str) -> ArenaMeta:
    body = comment.lstrip()[len(PREFIX):]
    try:
        raw = json.loads(body)
    except json.JSONDecodeError as e:
        raise MetaError(f"comment after {PREFIX!r} is not JSON ({e.msg} at column {e.colno})") from None
    try:
        return ArenaMeta.model_validate(raw)
    except ValidationError as e:
        raise MetaError(format_validation_error("comment", e, limit=1)) from None


def format_meta(meta: ArenaMeta) -> str:
    return PREFIX + json.dumps(meta.model_dump(mode="json", exclude_none=True, exclude_defaults=True), separators=(",", ":"))
