"""The run record: what happened to every job of one run, simulated or live, counted by one set of rules.

The simulator (arena_opt/sim/engine.py) and the live loop (runners/live.py) both drive a `Recorder`
and keep no counts of their own; metrics are computed from the finished `RunRecord`
(arena_opt/metrics.py), so a simulated and a live run of the same events give the same numbers.
A record round-trips through JSON (`arena_opt.io.write_model` / `load_model(path, RunRecord)`).

A record holds, per job, a `JobRecord` (submitted, started, reconfigured, preempted, crashed, finished,
GPU-seconds, restarts) and, for the run, the list of `Event(time, job, kind, details)` and the
cluster's step-function timeline.

Counting rules (the only ones):
- submit: the job is known to the scheduler; it waits from its submission time.
- start: a job that holds no GPUs is given some: its first launch, a resume after a preemption, a
  relaunch after a crash. `starts` counts every one; `first_start` is the time of the first.
- restart: a start other than the first (the job resumes from its checkpoint): restarts = starts - 1.
- reconfiguration: a started job's allocation changes through a checkpoint: every restart and every
  reshape or migration of a running job: reconfigs = restarts + reshapes + migrations.
- preemption: the scheduler takes a running job's GPUs; the job waits again.
- crash: a job that holds GPUs stops running without the scheduler asking (a process died, its launch
  failed, its node left). It releases its GPUs and waits, like a preemption, counted in `crashes`.
- crash-relaunch: the start after a crash, whatever action the decision named (a `start`, or a `keep`
  of a job the runner saw crashed): a restart like any other, so one start, one restart and one
  reconfiguration. A restart in place (torchrun restarting a worker group on the GPUs the job holds)
  is none of these: the job never released its GPUs; it is an uncounted runner event.
- ready: the current allocation begins to make progress (the end of the reconfiguration delay in the
  simulator; the first step a launch reports in a live run). Time held before it is restart time.
- finish / fail / reject: done; given up by the runner (failed); never runnable on this cluster.

GPU time: a job holds `num_gpus` from a start or reconfiguration until it is preempted, crashes,
finishes, fails or is reconfigured again. `advance(t, job)` integrates up to t: gpu_seconds += held GPUs
x elapsed, productive_gpu_seconds the part after ready, restart_seconds the wall seconds (not
GPU-seconds) held before ready. Every transition advances first, so writers may advance whenever they
like (the simulator when it syncs a job, the live loop at every sample). waited_s sums the waiting
spells, from submission, a preemption or a crash to the next start.

Cluster timeline: step functions, value[i] holds on [t[i], t[i+1]): throughput (samples/s of ready
jobs), alloc_gpus, productive_gpus (held by ready jobs), waiting and running (jobs holding GPUs) job
counts, norm_sum (sum over ready jobs of throughput / ref_throughput). The recorder updates them on
every transition (and on `speed`, a measured throughput that changed); `sample(t)` appends a point.

Runner facts: `note(t, job, kind, **details)` adds an uncounted event (kinds in RUNNER_KINDS: launches,
exits, in-place restarts, checkpoint fallbacks, relaunches held back, node losses, cluster controller outages,
cancels put off while the controller was away and their sending, submits whose answer was lost and what came of
them, launch records that did not validate). With `events_path` every event is also appended, as it happens, as
one JSON line to that file (`events.jsonl` in a live run's output folder).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.dataclasses import dataclass

# job status (also the simulator's state names)
NOT_ARRIVED, WAITING, RUNNING, DONE, REJECTED, FAILED = "not_arrived", "waiting", "running", "done", "rejected", \
    "failed"
Status = Literal["not_arrived", "waiting", "running", "done", "rejected", "failed"]

COUNTED_KINDS = ("submit", "reject", "start", "reconfigure", "ready", "preempt", "crash", "finish", "fail")
RUNNER_KINDS = ("launch", "exit", "restart_in_place", "checkpoint_fallback", "held", "node_lost", "node_back",
                "controller_lost", "controller_back", "cancel_owed", "sbatch_unanswered", "launch_unrecorded")
EventKind = Literal["submit", "reject", "start", "reconfigure", "ready", "preempt", "crash", "finish", "fail",
                    "launch", "exit", "restart_in_place", "checkpoint_fallback", "held", "node_lost", "node_back",
                    "controller_lost", "controller_back", "cancel_owed", "sbatch_unanswered", "launch_unrecorded"]

TIMELINE_KEYS = ("t", "throughput", "alloc_gpus", "productive_gpus", "waiting", "running", "norm_sum")


def model_name(model: object) -> str:
    """The catalog name a job's model is recorded by (an inline architecture by its own name)."""
    return model if isinstance(model, str) else getattr(model, "name", str(model))


class RecordError(RuntimeError):
    """A transition the counting rules do not allow (a writer's bug: e.g. starting a running job)."""


@dataclass(slots=True)
class Event:
    time: float
    job: str | None  # None: a cluster-wide fact (a node left)
    kind: EventKind
    details: dict[str, Any] = Field(default_factory=dict)


@dataclass(slots=True, eq=True)
class JobRecord:
    """One job's timeline. The first block is the job as submitted, the second what happened to it;
    the last fields are the recorder's working state (not written out)."""

    id: str
    model: str
    batch_size: int
    iterations: int
    submit: float
    deadline: float | None = None
    requested_gpu_type: str | None = None
    requested_num_gpus: int | None = None
    ref_throughput: float = 0.0  # samples/s that normalise its throughput (the requested grid's)
    best_throughput: float = 0.0  # samples/s on its fastest grid, when known (the simulator's truth)

    status: Status = NOT_ARRIVED
    first_start: float | None = None
    finish: float | None = None
    remaining: float | None = None  # iterations left when the record was closed
    starts: int = 0
    restarts: int = 0
    reconfigs: int = 0
    preemptions: int = 0
    crashes: int = 0
    gpu_seconds: float = 0.0
    productive_gpu_seconds: float = 0.0
    restart_seconds: float = 0.0
    waited_s: float = 0.0
    reject_reason: str | None = None  # why it was rejected or failed
    log_path: str | None = None

    num_gpus: int = Field(0, exclude=True)  # held now
    ready: bool = Field(False, exclude=True)
    synced_at: float = Field(0.0, exclude=True)
    wait_since: float = Field(0.0, exclude=True)
    thr: float = Field(0.0, exclude=True)  # its part of the cluster's throughput and norm_sum now
    norm: float = Field(0.0, exclude=True)

    def waited_until(self, t: float) -> float:
        """Seconds waited up to t, the current spell included."""
        return self.waited_s + (t - self.wait_since if self.status == WAITING else 0.0)


class RunRecord(BaseModel):
    """One run: its jobs, events, cluster timeline and the scheduler's calls (`decisions`: dicts with
    at least `wall_s`, the seconds a call took)."""

    model_config = ConfigDict(extra="forbid")

    policy: str
    interval_s: float = Field(gt=0, description="scheduling interval: the rounds metrics bin by")
    total_gpus: int = Field(ge=0)
    origin: float = 0.0
    end: float = 0.0
    options: dict[str, Any] = Field(default_factory=dict, description="the run's own options (simulator, live loop)")
    policy_options: dict[str, Any] | None = Field(None, description="the options the policy ran with (as JSON)")
    jobs: list[JobRecord] = Field(default_factory=list)
    events: list[Event] = Field(default_factory=list)
    timeline: dict[str, list[float]] = Field(default_factory=lambda: {k: [] for k in TIMELINE_KEYS})
    decisions: list[dict[str, Any]] = Field(default_factory=list)
    stalled: bool = False
    wall_s: float = 0.0
    cpu_s: float = 0.0  # CPU time of the writing process (on a shared machine, closer to an idle one's)

    def job_dicts(self) -> list[dict]:
        """The per-job records as results files store them (`job_records`)."""
        return self.model_dump(mode="json", include={"jobs"})["jobs"]

    def event_dicts(self) -> list[dict]:
        return self.model_dump(mode="json", include={"events"})["events"]


class Recorder:
    """Applies the counting rules to a RunRecord; the one writer API of the simulator and the live loop."""

    __slots__ = ("record", "events_path", "thr", "norm", "alloc", "productive", "waiting", "running")

    def __init__(self, record: RunRecord, events_path: str | Path | None = None):
        self.record = record
        self.events_path = Path(events_path) if events_path is not None else None
        self.thr = self.norm = 0.0
        self.alloc = self.productive = self.waiting = self.running = 0

    def add_job(self, job: JobRecord) -> JobRecord:
        self.record.jobs.append(job)
        return job

    # ---- transitions ----------------------------------------------------------------------------
    def submit(self, t: float, j: JobRecord) -> None:
        self._expect(j, "submit", NOT_ARRIVED)
        j.status = WAITING
        j.wait_since = j.synced_at = t
        self.waiting += 1
        self._event(t, j, "submit")

    def reject(self, t: float, j: JobRecord, reason: str) -> None:
        self._expect(j, "reject", NOT_ARRIVED)
        j.status, j.reject_reason = REJECTED, reason
        self._event(t, j, "reject", reason=reason)

    def start(self, t: float, j: JobRecord, num_gpus: int, **details: Any) -> None:
        """A waiting job is given GPUs (first start, resume, crash-relaunch)."""
        self._expect(j, "start", WAITING)
        if j.starts:
            j.restarts += 1
            j.reconfigs += 1
        else:
            j.first_start = t
        j.starts += 1
        j.waited_s += t - j.wait_since
        j.status = RUNNING
        self.waiting -= 1
        self.running += 1
        self._hold(t, j, num_gpus)
        self._event(t, j, "start", num_gpus=num_gpus, restart=j.starts > 1, **details)

    def reconfigure(self, t: float, j: JobRecord, num_gpus: int, **details: Any) -> None:
        """A running job moves to another allocation (reshape, migrate) through its checkpoint."""
        self._expect(j, "reconfigure", RUNNING)
        self._release(t, j)
        j.reconfigs += 1
        self._hold(t, j, num_gpus)
        self._event(t, j, "reconfigure", num_gpus=num_gpus, **details)

    def ready(self, t: float, j: JobRecord, throughput: float) -> None:
        """The current allocation makes progress from t on, at `throughput` samples/s."""
        self._expect(j, "ready", RUNNING)
        self.advance(t, j)
        j.ready = True
        self.productive += j.num_gpus
        self._set_speed(j, throughput)
        self._event(t, j, "ready", throughput=throughput)

    def speed(self, t: float, j: JobRecord, throughput: float) -> None:
        """A ready job's measured throughput changed (not an event: a live run measures it every sample)."""
        if j.ready:
            self.advance(t, j)
            self.thr -= j.thr
            self.norm -= j.norm
            self._set_speed(j, throughput)

    def preempt(self, t: float, j: JobRecord) -> None:
        self._expect(j, "preempt", RUNNING)
        self._stop(t, j)
        j.preemptions += 1
        self._event(t, j, "preempt")

    def crash(self, t: float, j: JobRecord, reason: str) -> None:
        self._expect(j, "crash", RUNNING)
        self._stop(t, j)
        j.crashes += 1
        self._event(t, j, "crash", reason=reason)

    def finish(self, t: float, j: JobRecord) -> None:
        """Done at t; from waiting too (a live job can complete its last step while being stopped)."""
        self._expect(j, "finish", RUNNING, WAITING)
        self._leave(t, j)
        j.status, j.finish = DONE, t
        self._event(t, j, "finish")

    def fail(self, t: float, j: JobRecord, reason: str) -> None:
        self._expect(j, "fail", WAITING, RUNNING)
        self._leave(t, j)
        j.status, j.reject_reason = FAILED, reason
        self._event(t, j, "fail", reason=reason)

    def note(self, t: float, job: str | None, kind: EventKind, **details: Any) -> None:
        """An uncounted runner fact (see RUNNER_KINDS)."""
        if kind in COUNTED_KINDS:
            raise RecordError(f"{kind!r} is a counted transition: use Recorder.{kind}()")
        self._append(Event(t, job, kind, details))

    # ---- time -----------------------------------------------------------------------------------
    def advance(self, t: float, j: JobRecord) -> None:
        """Integrate the job's GPU time up to t."""
        if j.status != RUNNING or t <= j.synced_at:
            if t > j.synced_at:
                j.synced_at = t
            return
        dt = t - j.synced_at
        if j.ready:
            j.productive_gpu_seconds += j.num_gpus * dt
        else:
            j.restart_seconds += dt
        j.gpu_seconds += j.num_gpus * dt
        j.synced_at = t

    def sample(self, t: float) -> None:
        """Append the cluster's current values to the timeline at time t."""
        tl = self.record.timeline
        tl["t"].append(t)
        tl["throughput"].append(max(0.0, self.thr))
        tl["alloc_gpus"].append(self.alloc)
        tl["productive_gpus"].append(self.productive)
        tl["waiting"].append(self.waiting)
        tl["running"].append(self.running)
        tl["norm_sum"].append(max(0.0, self.norm))

    def close(self, end: float, **fields: Any) -> RunRecord:
        """Integrate every job up to `end`, add the last timeline point and set the run's fields."""
        for j in self.record.jobs:
            self.advance(end, j)
        self.sample(end)
        self.record.end = end
        for k, v in fields.items():
            setattr(self.record, k, v)
        return self.record

    # ---- internals ------------------------------------------------------------------------------
    def _hold(self, t: float, j: JobRecord, num_gpus: int) -> None:
        j.num_gpus = num_gpus
        j.ready = False
        j.synced_at = t
        self.alloc += num_gpus

    def _release(self, t: float, j: JobRecord) -> None:
        self.advance(t, j)
        if j.ready:
            self.thr -= j.thr
            self.norm -= j.norm
            self.productive -= j.num_gpus
            j.ready = False
        j.thr = j.norm = 0.0
        self.alloc -= j.num_gpus
        j.num_gpus = 0

    def _stop(self, t: float, j: JobRecord) -> None:
        self._release(t, j)
        j.status = WAITING
        j.wait_since = t
        self.running -= 1
        self.waiting += 1

    def _leave(self, t: float, j: JobRecord) -> None:
        """The job ends (finished or failed) while running or waiting."""
        if j.status == RUNNING:
            self._release(t, j)
            self.running -= 1
        else:
            j.waited_s += max(0.0, t - j.wait_since)
            self.waiting -= 1

    def _set_speed(self, j: JobRecord, throughput: float) -> None:
        j.thr = throughput
        j.norm = throughput / j.ref_throughput if j.ref_throughput else 0.0
        self.thr += j.thr
        self.norm += j.norm

    @staticmethod
    def _expect(j: JobRecord, what: str, *allowed: str) -> None:
        if j.status not in allowed:
            raise RecordError(f"job {j.id!r}: {what} while {j.status} (allowed from {', '.join(allowed)})")

    def _event(self, t: float, j: JobRecord, kind: EventKind, **details: Any) -> None:
        self._append(Event(t, j.id, kind, details))

    def _append(self, ev: Event) -> None:
        self.record.events.append(ev)
        if self.events_path is not None:
            with open(self.events_path, "a") as f:
                f.write(json.dumps({"time": ev.time, "job": ev.job, "kind": ev.kind, "details": ev.details},
                                   default=str) + "\n")
