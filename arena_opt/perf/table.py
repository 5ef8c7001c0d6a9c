"""Measured iteration times in the column layout of Arena's `prof_records.csv`."""

from __future__ import annotations

import csv
import io
import os
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, PositiveFloat, PositiveInt, ValidationError, field_validator

from arena_opt.errors import InputError
from arena_opt.gpus import canonical_gpu
from arena_opt.io import read_text
from models.catalog import arena_model_name

ENV_TABLE = "ARENA_OPT_PERF_TABLE"
ENV_DATA = "ARENA_OPT_DATA"  # folder holding Arena's artifact data (prof_records.csv, traces/, ...)


class TableRow(BaseModel):
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    flavour: str
    model: str
    param_size: str
    batch_size: PositiveInt
    gpu_type: str
    num_nodes: PositiveInt
    gpus_per_node: PositiveInt
    iter_time_s: PositiveFloat | None = None
    status: str = "ok"

    @field_validator("iter_time_s", mode="before")
    @classmethod
    def _empty(cls, v):
        return None if v in ("", None) else v

    @field_validator("gpu_type")
    @classmethod
    def _canon(cls, v: str) -> str:
        return canonical_gpu(v)


def _validated(model: type[TableRow], raw: dict, path: Path, lineno: int):
    try:
        return model.model_validate(raw)
    except ValidationError as e:
        err = e.errors()[0]
        raise InputError(f"{path}:{lineno}: field {'.'.join(map(str, err['loc']))}: {err['msg']} "
                         f"(value {err.get('input')!r})") from None


Key = tuple[str, int, str, int, int]  # (catalog model, batch, gpu type, nodes, gpus per node)


@dataclass
class PerfTable:
    """iteration time per (model, batch, GPU type, nodes, GPUs per node); None = measured infeasible (OOM)."""

    times: dict[Key, float | None]
    source: str = ""
    max_iter_time_s: float = 300.0  # Arena's simulator treats slower entries as infeasible

    def lookup(self, model: str, batch: int, gpu: str, nodes: int, gpus_per_node: int) -> float | None:
        t = self.times.get((model, batch, gpu, nodes, gpus_per_node))
        return t if t is not None and t <= self.max_iter_time_s else None

    def has(self, model: str, batch: int, gpu: str, nodes: int, gpus_per_node: int) -> bool:
        return (model, batch, gpu, nodes, gpus_per_node) in self.times

    @classmethod
    def load(cls, path: str | Path, flavour: str = "alpa_optimal") -> "PerfTable":
        path = Path(path)
        if not path.is_file():
            raise InputError(f"{path}: performance table not found")
        times: dict[Key, float | None] = {}
        text = read_text(path, "performance table")
        with io.StringIO(text, newline="") as f:
            reader = csv.DictReader(f)
            need = {"flavour", "model", "param_size", "batch_size", "gpu_type", "num_nodes", "gpus_per_node",
                    "iter_time_s", "status"}
            missing = need - set(reader.fieldnames or [])
            if missing:
                raise InputError(f"{path}: missing columns {', '.join(sorted(missing))}")
            for lineno, raw in enumerate(reader, start=2):
                if raw.get("flavour") != flavour:
                    continue
                row = _validated(TableRow, raw, path, lineno)
                name = arena_model_name(f"{row.model}__{row.param_size}")
                key = (name, row.batch_size, row.gpu_type, row.num_nodes, row.gpus_per_node)
                times[key] = row.iter_time_s if row.status == "ok" else None
        return cls(times, source=str(path))


def default_data_dir() -> Path | None:
    """Arena's artifact data: $ARENA_OPT_DATA, else ../shared/data/arena next to the checkout."""
    env = os.environ.get(ENV_DATA)
    if env:
        return Path(env)
    here = Path(__file__).resolve().parents[3] / "shared" / "data" / "arena"
    return here if here.is_dir() else None


def default_table_path() -> Path | None:
    env = os.environ.get(ENV_TABLE)
    if env:
        return Path(env)
    d = default_data_dir()
    return d / "prof_records.csv" if d and (d / "prof_records.csv").is_file() else None


class PlanTimeRow(TableRow):
    """An `arena_estimated` row: one plan's shape and the compute part of its estimated iteration time."""

    pp: PositiveInt
    dp: PositiveInt
    tp: PositiveInt
    comp_time_s: PositiveFloat | None = None

    @field_validator("pp", "dp", "tp", mode="before")
    @classmethod
    def _count(cls, v):
        return int(float(v)) if isinstance(v, str) and v.strip() else v

    @field_validator("comp_time_s", mode="before")
    @classmethod
    def _empty_comp(cls, v):
        return None if v in ("", None) else v


@dataclass(frozen=True)
class PlanComputeTime:
    """Compute time (no communication) of one plan of one grid, as Arena's profiler composed it from
    per-stage measurements."""

    model: str  # catalog name
    batch: int
    gpu_type: str
    pp: int
    dp: int
    tp: int
    comp_s: float


def load_plan_compute_times(path: str | Path, flavour: str = "arena_estimated") -> list[PlanComputeTime]:
    """Every `flavour` row of Arena's table with a compute time (an InputError naming the line and field
    where a row is malformed)."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: performance table not found")
    out = []
    with io.StringIO(read_text(path, "performance table"), newline="") as f:
        reader = csv.DictReader(f)
        missing = {"flavour", "pp", "dp", "tp", "comp_time_s"} - set(reader.fieldnames or [])
        if missing:
            raise InputError(f"{path}: missing columns {', '.join(sorted(missing))}")
        for lineno, raw in enumerate(reader, start=2):
            if raw.get("flavour") != flavour or raw.get("status", "ok") != "ok":
                continue
            row = _validated(PlanTimeRow, raw, path, lineno)
            if row.comp_time_s is not None:
                out.append(PlanComputeTime(arena_model_name(f"{row.model}__{row.param_size}"), row.batch_size,
                                           row.gpu_type, row.pp, row.dp, row.tp, row.comp_time_s))
    return out
