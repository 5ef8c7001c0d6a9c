"""Per-job simulation state. Progress is integrated lazily: a job's remaining iterations are brought
up to date (`sync`) only when its allocation changes, it completes, or a snapshot needs them."""

from __future__ import annotations

from dataclasses import dataclass, field

from arena_opt.plan import Plan
from arena_opt.snapshot import Job, RunningState

FUTURE, WAITING, RUNNING, DONE, REJECTED = "future", "waiting", "running", "done", "rejected"


@dataclass(slots=True, eq=False)
class SimJob:
    index: int
    spec: Job  # validated once at load; snapshots copy it with the live fields
    total: int
    submit: float
    deadline: float | None
    batch: int
    status: str = FUTURE
    remaining: float = 0.0
    # allocation (RUNNING only)
    gpu_type: str | None = None
    placement: dict[str, list[int]] = field(default_factory=dict)
    plan: Plan | None = None
    num_gpus: int = 0
    rate: float = 0.0  # iterations/s on the allocation (truth); no progress before ready_at
    productive: bool = False  # running and past its reconfiguration
    ready_at: float = 0.0  # reconfiguration ends; no progress before
    since: float = 0.0  # when the current allocation was applied
    synced_at: float = 0.0
    version: int = 0  # bumps on every allocation change; stale events carry an old one
    # accounting
    first_start: float | None = None
    finish: float | None = None
    starts: int = 0
    reconfigs: int = 0  # reshape, migrate, or resume after preemption
    preemptions: int = 0
    gpu_seconds: float = 0.0  # allocated GPU-seconds (restart time included)
    productive_gpu_seconds: float = 0.0
    restart_seconds: float = 0.0
    ref_throughput: float = 0.0  # samples/s on the requested grid (truth), for normalization
    waited: float = 0.0  # seconds waited (queued or preempted) before wait_since
    wait_since: float = 0.0  # start of the current waiting spell
    best_throughput: float = 0.0  # samples/s on its fastest grid (truth): the contention-free bound
    reject_reason: str | None = None
    # the running state object reused while the allocation does not change (see Simulator._tick)
    snap_version: int = -1
    running_state: RunningState | None = None

    @property
    def throughput(self) -> float:
        """samples/s on the current allocation once it is ready (truth)."""
        return self.rate * self.batch

    def sync(self, t: float) -> None:
        """Integrate progress exactly up to time t: iterations done are never re-valued later."""
        if self.status != RUNNING or t <= self.synced_at:
            self.synced_at = max(self.synced_at, t)
            return
        start = max(self.synced_at, self.ready_at)
        if t > start:
            self.remaining -= self.rate * (t - start)
            self.productive_gpu_seconds += self.num_gpus * (t - start)
        self.gpu_seconds += self.num_gpus * (t - self.synced_at)
        self.restart_seconds += max(0.0, min(t, self.ready_at) - self.synced_at)
        self.synced_at = t

    def completion_time(self) -> float:
        return self.ready_at + self.remaining / self.rate if self.synced_at <= self.ready_at else \
            self.synced_at + self.remaining / self.rate
