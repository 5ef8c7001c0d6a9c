"""The JSON of `sinfo --json` / `squeue --json` (Slurm 22.05, openapi v0.0.38: plain numbers, node
state as a word plus `state_flags`) and of `scontrol show nodes --json` / `squeue --json` (23.02 and
later: numbers as {set, infinite, number}, states as lists, features and partitions as lists; 24.x
moved job_resources' node list under `nodes.list` / `nodes.allocation`), read into one shape.

Only the fields the snapshot needs are read; the rest is ignored. A field of the wrong type is a
SlurmFormatError naming the command, the record and the field.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError


from arena_opt.slurm.gres import SlurmFormatError


def _number(v: Any) -> Any:
    """22.05: 7; 23.02+: {"set": true, "infinite": false, "number": 7} (unset or infinite -> None)."""
    if isinstance(v, dict) and "number" in v:
        return v["number"] if v.get("set", True) and not v.get("infinite", False) else None
    return v


def _csv(v: Any) -> Any:
    """22.05: "a,b"; 23.02+: ["a", "b"]."""
    if v is None:
        return []
    if isinstance(v, str):
        return [x for x in v.split(",") if x]
    return v


def _states(v: Any) -> Any:
    """22.05: "RUNNING" (jobs) / "idle" (nodes); 23.02+: lists. Upper case."""
    if isinstance(v, str):
        v = [v]
    return [str(x).upper() for x in v] if isinstance(v, list) else v


Num = Annotated[int | None, BeforeValidator(_number)]
Csv = Annotated[list[str], BeforeValidator(_csv)]
States = Annotated[list[str], BeforeValidator(_states)]


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore")


class SlurmNode(_Lenient):
    name: str
    address: str | None = None
    hostname: str | None = None
    state: States
    state_flags: States = Field(default_factory=list, description="22.05 only: DRAIN, NOT_RESPONDING, ...")
    gres: str | None = ""
    gres_used: str | None = ""
    features: Csv = Field(default_factory=list)
    active_features: Csv = Field(default_factory=list)
    partitions: Csv = Field(default_factory=list)
    reason: str | None = ""

    @property
    def all_states(self) -> set[str]:
        return set(self.state) | set(self.state_flags)


class SlurmJob(_Lenient):
    job_id: int
    name: str = ""
    job_state: States
    state_reason: str | None = ""
    comment: str | None = ""
    nodes: str | None = ""
    gres_detail: list[str] = Field(default_factory=list)
    tres_per_node: str | None = ""
    het_job_id: Num = 0
    het_job_offset: Num = 0
    submit_time: Num = 0
    start_time: Num = 0
    partition: str | None = ""
    features: str | None = ""
    required_nodes: str | None = ""
    user_name: str | None = ""
    current_working_directory: str | None = ""
    priority: Num = None
    exit_code: Any = None

    @property
    def state(self) -> str:
        # 23.02+ lists the base state first, then flags (e.g. ["PENDING", "REQUEUED"])
        return self.job_state[0] if self.job_state else "UNKNOWN"

    @property
    def leader(self) -> int:
        """The id the job is known by: the het job id of every component, else its own."""
        return self.het_job_id or self.job_id


def _load(text: str, command: str, key: str) -> tuple[list[dict], dict]:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise SlurmFormatError(f"`{command}`: output is not JSON (line {e.lineno}, column {e.colno}: {e.msg})") \
            from None
    if not isinstance(doc, dict):
        raise SlurmFormatError(f"`{command}`: expected a JSON object with {key!r}, got {type(doc).__name__}")
    errors = doc.get("errors") or []
    if errors:
        first = errors[0] if isinstance(errors[0], dict) else {"description": str(errors[0])}
        raise SlurmFormatError(f"`{command}`: Slurm reported an error: "
                               f"{first.get('description') or first.get('error') or first}")
    records = doc.get(key)
    if records is None:
        raise SlurmFormatError(f"`{command}`: field {key!r} missing from the output")
    if not isinstance(records, list):
        raise SlurmFormatError(f"`{command}`: field {key!r} is {type(records).__name__}, expected a list")
    return records, doc


def _model(cls, raw: object, command: str, where: str):
    try:
        return cls.model_validate(raw)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(x) for x in err["loc"])
        value = err.get("input")
        shown = repr(value) if not isinstance(value, (dict, list)) else type(value).__name__
        raise SlurmFormatError(f"`{command}`: {where}: field {loc}: {err['msg']} (value {shown[:80]})") from None


def parse_nodes(text: str, command: str) -> list[SlurmNode]:
    records, _ = _load(text, command, "nodes")
    out = []
    for i, r in enumerate(records):
        name = r.get("name") if isinstance(r, dict) else None
        out.append(_model(SlurmNode, r, command, f"nodes[{i}]" + (f" ({name})" if name else "")))
    return out


def parse_jobs(text: str, command: str) -> list[SlurmJob]:
    records, _ = _load(text, command, "jobs")
    out = []
    for i, r in enumerate(records):
        jid = r.get("job_id") if isinstance(r, dict) else None
        out.append(_model(SlurmJob, r, command, f"jobs[{i}]" + (f" (job {jid})" if jid is not None else "")))
    return out
