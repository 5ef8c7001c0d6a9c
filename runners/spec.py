"""What one torchrun launch of a job trains: the contract between the scheduler
side (runners) and the training entry point (`runners.train`). Validated with
pydantic on both sides, so a bad spec fails before any process starts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import (BaseModel, ConfigDict, Field, NonNegativeFloat, NonNegativeInt, PositiveFloat,
                      PositiveInt, ValidationError, field_validator, model_validator)

from arena_opt.plan import Plan
from models.catalog import ARCHITECTURES, Arch, arena_model_name


# wall seconds between checkpoints by default: bench/runners.py measured 0.17 s per save of the
# scaled CPU job (0.5% of training at 30 s, bench/results/runners.md); 30 s keeps saves up to ~1 s (a
# loaded host) within a few percent while losing at most 30 s of work to a crash
DEFAULT_CKPT_EVERY_S = 30.0


class Scale(BaseModel):
    """Arguments of `models.torch_layers.scaled_arch`; absent = the catalog size."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    max_hidden: PositiveInt = 64
    max_layers: PositiveInt = 4
    seq_len: PositiveInt = 32
    max_heads: PositiveInt = 4
    max_vocab: PositiveInt = 512
    max_experts: PositiveInt = 4
    image_size: PositiveInt = 32
    max_channels: PositiveInt = 8


class TrainSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    job_id: str = Field(min_length=1)
    model: str | Arch
    scale: Scale | None = Field(default_factory=Scale, description="None = full size")
    plan: Plan
    global_batch: PositiveInt = Field(description="samples per step, split over dp and micro-batches")
    total_steps: PositiveInt
    lr: PositiveFloat = 1e-3
    seed: NonNegativeInt = 0
    dp_mode: Literal["ddp", "fsdp"] = Field(
        "ddp", description="ddp: DistributedDataParallel for pure data parallel plans, FSDP2 when combined "
                      "with tp or pp; fsdp: FSDP2 always")
    device: Literal["auto", "cpu", "cuda"] = "auto"
    run_dir: str = Field(description="progress.jsonl and the control file live here")
    ckpt_dir: str
    ckpt_interval: NonNegativeInt = Field(0, description="steps between checkpoints (and one at the end); 0 = off")
    ckpt_every_s: NonNegativeFloat = Field(0.0, description="wall seconds between checkpoints (and one at the end); "
                                                            "0 = off; with both off only a stop saves")
    keep_checkpoints: PositiveInt = Field(2, description="committed checkpoints kept (older ones deleted)")
    generation: NonNegativeInt = Field(0, description="launch counter of the job, reported with progress")
    step_delay_s: NonNegativeFloat = Field(
        0.0, description="sleep per step; lets CPU tests watch a job run without training a bigger model")
    fail_at_step: NonNegativeInt | None = Field(
        None, description="fault injection: rank `fail_rank` exits hard when reaching this step")
    fail_rank: NonNegativeInt = 0

    @field_validator("model")
    @classmethod
    def _known(cls, v: str | Arch) -> str | Arch:
        return check_model_name(v)

    @model_validator(mode="after")
    def _check(self) -> "TrainSpec":
        if not self.plan.uniform:
            bad = self.plan.batch_error(self.global_batch)
            if bad is not None:
                raise ValueError(f"global_batch {self.global_batch} is not divisible: plan.{bad[0]}: {bad[1]}")
            return self
        split = self.plan.dp * self.plan.num_microbatches
        if self.global_batch % split:
            raise ValueError(f"global_batch {self.global_batch} is not divisible by dp x num_microbatches "
                             f"= {self.plan.dp} x {self.plan.num_microbatches}")
        return self

    def arch(self) -> Arch:
        return resolve_arch(self.model, self.scale)

    @property
    def world_size(self) -> int:
        return self.plan.num_gpus


def resolve_arch(model: str | Arch, scale: Scale | None) -> Arch:
    """The architecture a job trains: the catalog's (or inline) one, scaled down unless scale is None."""
    from models.torch_layers import scaled_arch

    base = model if isinstance(model, Arch) else ARCHITECTURES[arena_model_name(model)]
    return base if scale is None else scaled_arch(base, **scale.model_dump())


def check_model_name(model: str | Arch) -> str | Arch:
    if isinstance(model, str):
        if arena_model_name(model) not in ARCHITECTURES:
            raise ValueError(f"unknown model {model!r}")
        return arena_model_name(model)
    return model


class SpecError(ValueError):
    """A spec file that is missing or invalid; the message names file, field and value."""


def load_spec(path: str | Path) -> TrainSpec:
    p = Path(path)
    try:
        raw = json.loads(p.read_text())
    except OSError as e:
        raise SpecError(f"{p}: cannot read spec: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise SpecError(f"{p}: not JSON: {e}") from None
    return parse_spec(raw, str(p))


def parse_spec(raw: object, where: str) -> TrainSpec:
    try:
        return TrainSpec.model_validate(raw)
    except ValidationError as e:
        raise SpecError(f"{where}: {format_validation_error(e)}") from None


def format_validation_error(e: ValidationError) -> str:
    parts = []
    for err in e.errors():
        loc = ".".join(str(x) for x in err["loc"]) or "(top level)"
        value = err.get("input")
        shown = repr(value) if not isinstance(value, (dict, list)) else type(value).__name__
        parts.append(f"{loc}: {err['msg']} (value {shown})")
    return "; ".join(parts)
