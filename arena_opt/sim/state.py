"""Per-job simulation state: the mechanics of progress. What happened to the job (status, starts,
GPU time, waiting) is its run record (`rec`, arena_opt/record.py), written through the engine's Recorder.
Progress is integrated lazily: a job's remaining iterations are brought up to date (`sync`) only when
its allocation changes, it completes, or a snapshot needs them."""

from __future__ import annotations

from dataclasses import dataclass, field

from arena_opt.plan import Plan
from arena_opt.record import RUNNING, JobRecord
from arena_opt.snapshot import Job, RunningState


@dataclass(slots=True, eq=False)
class SimJob:
    index: int
    spec: Job  # validated once at load, never replaced; snapshots copy it with the live fields
    total: int
    batch: int
    rec: JobRecord
    remaining: float = 0.0
    # allocation (RUNNING only)
    gpu_type: str | None = None
    placement: dict[str, list[int]] = field(default_factory=dict)
    plan: Plan | None = None
    num_gpus: int = 0
    rate: float = 0.0  # iterations/s on the allocation (truth); no progress before ready_at
    ready_at: float = 0.0  # reconfiguration ends; no progress before
    since: float = 0.0  # when the current allocation was applied
    synced_at: float = 0.0
    version: int = 0  # bumps on every allocation change; stale events carry an old one
    # the running state object reused while the allocation does not change (see Simulator._tick)
    snap_version: int = -1
    running_state: RunningState | None = None
    # the spec's field values and given fields, which every round's snapshot of the job copies
    # (Simulator._tick): read once here instead of through pydantic's instance slots each round
    spec_values: dict = field(init=False, repr=False)
    spec_fields: frozenset = field(init=False, repr=False)

    def __post_init__(self):
        self.spec_values = self.spec.__dict__
        self.spec_fields = frozenset(self.spec.__pydantic_fields_set__)

    @property
    def throughput(self) -> float:
        """samples/s on the current allocation once it is ready (truth)."""
        return self.rate * self.batch

    def sync(self, t: float) -> None:
        """Integrate progress exactly up to time t: iterations done are never re-valued later (GPU time
        is the record's: the engine advances it at the same times)."""
        if self.rec.status != RUNNING or t <= self.synced_at:
            self.synced_at = max(self.synced_at, t)
            return
        start = max(self.synced_at, self.ready_at)
        if t > start:
            self.remaining -= self.rate * (t - start)
        self.synced_at = t

    def completion_time(self) -> float:
        return self.ready_at + self.remaining / self.rate if self.synced_at <= self.ready_at else \
            self.synced_at + self.remaining / self.rate
