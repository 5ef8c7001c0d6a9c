"""What a launch runs, beside its logs (`logs/gG.launch.json`): the decision it carries out. A runner
started again on the work directory takes a launch that is still running over from its record instead of
stopping it (runners/slurm.py). The record is written by the runner itself, but it lies on a shared file
system for as long as the job lives: a record that exists and does not read back (cut by a full disk, edited,
written by another version) is an error the caller reports, never a silent "no record"."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from pydantic import ConfigDict, Field, ValidationError

from arena_opt.edge import EdgeModel
from arena_opt.io import atomic_write
from arena_opt.plan import Plan
from runners.names import safe_name


class LaunchRecord(EdgeModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    generation: int = Field(ge=0)
    gpu_type: str = Field(min_length=1)
    placement: dict[str, list[int]] = Field(min_length=1)  # node -> GPU indices, as decided
    plan: Plan


class LaunchRecordInvalid(ValueError):
    """A launch record that exists but is not the record of its launch."""

    def __init__(self, path: Path, error: str) -> None:
        super().__init__(f"{path}: {error}")
        self.path, self.error = path, error


@dataclass(frozen=True)
class LaunchFiles:
    """The one place a launch's file names are made: every file launch `generation` of the job at `root` writes
    under logs/ starts with gN (then '-' or '.'), which is what next_generation counts on."""

    root: Path
    generation: int

    def _file(self, tail: str) -> Path:
        return self.root / "logs" / f"g{self.generation}{tail}"

    @property
    def record(self) -> Path:
        return self._file(".launch.json")

    def node_log(self, node: str) -> Path:
        return self._file(f"-{safe_name(node)}.log")

    def exit_code(self, component: int) -> Path:
        return self._file(f"-{component}.rc")

    @property
    def batch_log(self) -> Path:
        return self._file("-batch.log")

    @property
    def batch_script(self) -> Path:
        return self._file(".sbatch")


_LAUNCH_FILE = re.compile(r"g(\d+)[-.]")


def next_generation(root: Path) -> int:
    """The first generation number no earlier launch in the job directory `root` used (LaunchFiles: every
    file a launch writes under logs/ starts with gN). A runner started again on the same work directory
    numbers its launches on from there, so it never overwrites an earlier launch's logs and record, and never
    reads an earlier launch's progress as its own."""
    try:
        names = [p.name for p in (root / "logs").iterdir()]
    except FileNotFoundError:
        return 0
    used = [int(m.group(1)) for n in names if (m := _LAUNCH_FILE.match(n))]
    return max(used) + 1 if used else 0


def write_launch_record(root: Path, record: LaunchRecord) -> None:
    p = LaunchFiles(root, record.generation).record
    p.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(p, record.model_dump_json())


def read_launch_record(root: Path, generation: int) -> LaunchRecord | None:
    """Launch `generation`'s record; None when it has none. LaunchRecordInvalid when the file cannot be read,
    does not validate, or is the record of another launch."""
    p = LaunchFiles(root, generation).record
    try:
        text = p.read_text()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as e:
        raise LaunchRecordInvalid(p, f"unreadable: {e}") from None
    try:
        rec = LaunchRecord.model_validate_json(text)
    except ValidationError as e:
        raise LaunchRecordInvalid(p, _first_error(e)) from None
    if rec.generation != generation:
        raise LaunchRecordInvalid(p, f"generation: {rec.generation}, not {generation} as its name says")
    return rec


def _first_error(e: ValidationError) -> str:
    """The validation error in one line (field path: message), as an operator reads it in an event."""
    errs = e.errors()
    first = errs[0]
    where = ".".join(str(x) for x in first["loc"]) or "record"
    more = f" (and {len(errs) - 1} more)" if len(errs) > 1 else ""
    return f"{where}: {first['msg']}{more}"
