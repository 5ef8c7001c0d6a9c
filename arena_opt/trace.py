"""Job traces: Arena's CSV and our own JSON Lines format, validated once at load.

JSON Lines format (one job per line, `#` lines and blank lines ignored):

    {"id": "j0", "submit_time": 0, "model": "gpt-1.3B", "batch_size": 256, "iterations": 2000,
     "num_gpus": 4, "gpu_type": "a100", "deadline": 7200}

| field | meaning |
| --- | --- |
| `id` | unique job id |
| `submit_time` | seconds, >= 0 |
| `model` | catalog name (`arena-opt models`) or Arena's `model__size` |
| `batch_size` | global batch, samples per iteration |
| `iterations` | training iterations to run |
| `num_gpus`, `gpu_type` | optional: the user's request (FCFS runs exactly this; others may change it) |
| `deadline` | optional: absolute time in seconds, > submit_time |
| `weight` | optional, default 1 |
| `allowed_gpu_types`, `min_gpus`, `max_gpus` | optional limits for the policies |

Arena CSV (`job_id, submission_time, num_iteration, model_name, deadline, batch_size, num_gpu,
gpu_type`) maps onto the same record. Arena's simulator divides `num_iteration` by 5 and stretches
the deadline budget 5x before simulating: `iter_scale=5, deadline_stretch=5` reproduces that.
"""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

from pydantic import (ConfigDict, Field, NonNegativeFloat, PositiveFloat, PositiveInt, ValidationError,
                      field_validator, model_validator)

from arena_opt.edge import EdgeModel
from arena_opt.errors import InputError
from arena_opt.io import atomic_write, parse_json, read_text
from arena_opt.gpus import BUILTIN_GPUS, GpuSpec, canonical_gpu
from arena_opt.snapshot import MAX_BATCH_SIZE, MAX_GPUS, MAX_ITERATIONS, MAX_TIME_S, Job
from models.catalog import ARCHITECTURES, arena_model_name

ARENA_COLUMNS = ("job_id", "submission_time", "num_iteration", "model_name", "deadline", "batch_size", "num_gpu",
                 "gpu_type")


class TraceJob(EdgeModel):
    """One job of a trace (the JSON Lines record)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    id: str = Field(min_length=1)
    submit_time: NonNegativeFloat = Field(le=MAX_TIME_S)
    model: str
    batch_size: PositiveInt = Field(le=MAX_BATCH_SIZE)
    iterations: PositiveInt = Field(le=MAX_ITERATIONS)
    num_gpus: PositiveInt | None = Field(None, le=MAX_GPUS)
    gpu_type: str | None = None
    deadline: PositiveFloat | None = None
    weight: PositiveFloat = 1.0
    allowed_gpu_types: list[str] | None = None
    min_gpus: PositiveInt = Field(1, le=MAX_GPUS)
    max_gpus: PositiveInt | None = Field(None, le=MAX_GPUS)

    @field_validator("model")
    @classmethod
    def _known_model(cls, v: str) -> str:
        name = arena_model_name(v)
        if name not in ARCHITECTURES:
            raise ValueError(f"unknown model {v!r} (see `arena-opt models`)")
        return name

    @field_validator("gpu_type")
    @classmethod
    def _canon(cls, v: str | None) -> str | None:
        return None if v is None else canonical_gpu(v)

    @field_validator("allowed_gpu_types")
    @classmethod
    def _canon_list(cls, v: list[str] | None) -> list[str] | None:
        return None if v is None else [canonical_gpu(x) for x in v]

    @model_validator(mode="after")
    def _check(self) -> "TraceJob":
        if self.deadline is not None and self.deadline <= self.submit_time:
            raise ValueError(f"deadline {self.deadline} is not after submit_time {self.submit_time}")
        if self.max_gpus is not None and self.max_gpus < self.min_gpus:
            raise ValueError(f"max_gpus {self.max_gpus} is below min_gpus {self.min_gpus}")
        return self

    def to_job(self) -> Job:
        return Job(id=self.id, model=self.model, batch_size=self.batch_size, total_iterations=self.iterations,
                   remaining_iterations=self.iterations, submit_time=self.submit_time, deadline=self.deadline,
                   weight=self.weight, allowed_gpu_types=self.allowed_gpu_types, min_gpus=self.min_gpus,
                   max_gpus=self.max_gpus, requested_gpu_type=self.gpu_type, requested_num_gpus=self.num_gpus)


def load_trace(path: str | Path, *, iter_scale: int = 1, deadline_stretch: float = 1.0,
               catalog: dict[str, GpuSpec] | None = None, limit: int | None = None) -> list[TraceJob]:
    """Jobs of a trace, by submit time (stable). `.csv` is read as Arena's format, anything else as
    JSON Lines. `iter_scale` divides iteration counts (integer division, at least 1) and
    `deadline_stretch` multiplies each deadline's budget after submission."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: trace file not found")
    if iter_scale < 1:
        raise InputError(f"iter_scale must be >= 1, got {iter_scale}")
    if deadline_stretch <= 0:
        raise InputError(f"deadline_stretch must be > 0, got {deadline_stretch}")
    raw = _read_csv(path) if path.suffix.lower() == ".csv" else _read_jsonl(path)
    jobs: list[TraceJob] = []
    seen: dict[str, int] = {}
    known = catalog or BUILTIN_GPUS
    for lineno, rec in raw:
        if limit is not None and len(jobs) >= limit:
            break
        try:
            tj = TraceJob.model_validate(rec)
        except ValidationError as e:
            err = e.errors()[0]
            loc = ".".join(map(str, err["loc"])) or "record"
            raise InputError(f"{path}:{lineno}: field {loc}: {err['msg']} (value {err.get('input')!r})") from None
        for field, t in [("gpu_type", tj.gpu_type), *(("allowed_gpu_types", x) for x in tj.allowed_gpu_types or [])]:
            if t is not None and t not in known:
                raise InputError(f"{path}:{lineno}: field {field}: unknown GPU type {t!r}; known: "
                                 f"{', '.join(sorted(known))}")
        if tj.id in seen:
            raise InputError(f"{path}:{lineno}: duplicate job id {tj.id!r} (first on line {seen[tj.id]})")
        seen[tj.id] = lineno
        update: dict = {}
        if iter_scale != 1:
            update["iterations"] = max(1, tj.iterations // iter_scale)
        if deadline_stretch != 1.0 and tj.deadline is not None:
            update["deadline"] = tj.submit_time + (tj.deadline - tj.submit_time) * deadline_stretch
        jobs.append(tj.model_copy(update=update) if update else tj)
    jobs.sort(key=lambda j: j.submit_time)
    if not jobs:
        raise InputError(f"{path}: trace has no jobs")
    return jobs


def _read_jsonl(path: Path) -> list[tuple[int, dict]]:
    out = []
    for lineno, line in enumerate(read_text(path, "trace").splitlines(), start=1):
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        rec = parse_json(s, f"{path}:{lineno}")
        if not isinstance(rec, dict):
            raise InputError(f"{path}:{lineno}: expected a JSON object, got {type(rec).__name__}")
        out.append((lineno, rec))
    return out


def _csv_number(path: Path, lineno: int, col: str, text: str | None) -> int:
    """A whole, finite number of an Arena CSV cell ('120' or '120.0'; not '2.7', 'inf' or '')."""
    try:
        v = float(text)
    except (TypeError, ValueError):
        raise InputError(f"{path}:{lineno}: field {col}: not a number (value {text!r})") from None
    if not math.isfinite(v):
        raise InputError(f"{path}:{lineno}: field {col}: must be a finite number (value {text!r})")
    if v != int(v):
        raise InputError(f"{path}:{lineno}: field {col}: must be a whole number (value {text!r})")
    return int(v)


def _read_csv(path: Path) -> list[tuple[int, dict]]:
    out = []
    try:
        rows = list(csv.reader(io.StringIO(read_text(path, "trace"), newline="")))
    except csv.Error as e:
        raise InputError(f"{path}: malformed CSV ({e})") from None
    header = rows[0] if rows else []
    missing = set(ARENA_COLUMNS) - set(header)
    if missing:
        raise InputError(f"{path}: missing columns {', '.join(sorted(missing))} (Arena trace format: "
                         f"{', '.join(ARENA_COLUMNS)})")
    for lineno, cells in enumerate(rows[1:], start=2):
        if not cells:
            continue
        if len(cells) != len(header):
            raise InputError(f"{path}:{lineno}: {len(cells)} cells, the header has {len(header)}")
        r = dict(zip(header, cells))
        ints = {col: _csv_number(path, lineno, col, r[col])
                for col in ("submission_time", "num_iteration", "deadline", "batch_size", "num_gpu")}
        out.append((lineno, {
            "id": r["job_id"], "submit_time": ints["submission_time"], "model": r["model_name"],
            "batch_size": ints["batch_size"], "iterations": ints["num_iteration"],
            "num_gpus": ints["num_gpu"], "gpu_type": r["gpu_type"],
            "deadline": ints["deadline"],
        }))
    return out


def write_trace(path: str | Path, jobs: list[TraceJob]) -> None:
    atomic_write(path, "".join(json.dumps(j.model_dump(exclude_none=True, exclude_defaults=True) | {
        "id": j.id, "submit_time": j.submit_time, "model": j.model, "batch_size": j.batch_size,
        "iterations": j.iterations}) + "\n" for j in jobs))
