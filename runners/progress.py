"""Progress channel from a running job to the scheduler side: rank 0 appends
one JSON object per line to `RUN_DIR/progress.jsonl`; the runner tails it.
A file (not a socket) survives restarts of either side, works for ranks on
other nodes via a shared run directory, and never needs log parsing.

Events (all carry `event`, `time`, `generation`):
  start       world_size, plan, step (first step this launch runs), resumed_from
  step        step (steps completed), loss, iter_time_s, samples_per_s, peak_mem_bytes
  checkpoint  step, path, save_s
  loaded      step, load_s
  exit        reason ("finished" | "stopped"), step
  error       message

The control direction is a file too: the runner creates `RUN_DIR/control/stop`
and the job saves a checkpoint and exits at its next step boundary.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PROGRESS_FILE = "progress.jsonl"
STOP_FILE = "control/stop"


class ProgressWriter:
    def __init__(self, run_dir: str | Path, generation: int) -> None:
        self.path = Path(run_dir) / PROGRESS_FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.generation = generation

    def emit(self, event: str, **fields: Any) -> None:
        rec = {"event": event, "time": time.time(), "generation": self.generation, **fields}
        line = json.dumps(rec, separators=(",", ":")) + "\n"
        # one write() of a short line under O_APPEND: a reader never sees half a record
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)


@dataclass
class JobProgress:
    """What the events of one job say so far (the reader folds them into this)."""

    generation: int = -1
    started: bool = False
    step: int = 0
    loss: float | None = None
    iter_time_s: float | None = None
    samples_per_s: float | None = None
    peak_mem_bytes: int | None = None
    world_size: int | None = None
    plan: dict | None = None
    last_checkpoint_step: int | None = None
    exit_reason: str | None = None
    error: str | None = None
    losses: dict[int, float] = field(default_factory=dict)
    iter_times: list[float] = field(default_factory=list)  # of the current generation's steps, in order
    events: list[dict] = field(default_factory=list)
    last_time: float = 0.0


class ProgressReader:
    """Incremental reader: each `poll()` reads only the bytes appended since the last one."""

    def __init__(self, run_dir: str | Path, keep_events: bool = True) -> None:
        self.path = Path(run_dir) / PROGRESS_FILE
        self.offset = 0
        self.state = JobProgress()
        self.keep_events = keep_events

    def poll(self) -> JobProgress:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return self.state
        end = data.rfind(b"\n")
        if end < 0:
            return self.state
        self.offset += end + 1
        for line in data[: end + 1].splitlines():
            if line.strip():
                self._fold(json.loads(line))
        return self.state

    def _fold(self, ev: dict) -> None:
        s = self.state
        if self.keep_events:
            s.events.append(ev)
        s.last_time = ev.get("time", s.last_time)
        kind = ev["event"]
        if kind == "start":
            s.generation = ev["generation"]
            s.started = True
            s.exit_reason = None
            s.error = None
            s.world_size = ev.get("world_size")
            s.plan = ev.get("plan")
            s.step = ev.get("step", s.step)
            s.iter_times = []
        elif kind == "step":
            s.step = ev["step"]
            s.loss = ev.get("loss")
            if s.loss is not None:
                s.losses[s.step] = s.loss
            s.iter_time_s = ev.get("iter_time_s")
            if s.iter_time_s is not None:
                s.iter_times.append(s.iter_time_s)
            s.samples_per_s = ev.get("samples_per_s")
            mem = ev.get("peak_mem_bytes")
            s.peak_mem_bytes = mem if s.peak_mem_bytes is None else max(s.peak_mem_bytes, mem or 0)
        elif kind == "checkpoint":
            s.last_checkpoint_step = ev["step"]
        elif kind == "exit":
            s.exit_reason = ev["reason"]
            s.step = ev.get("step", s.step)
        elif kind == "error":
            s.error = ev.get("message")


def request_stop(run_dir: str | Path) -> None:
    p = Path(run_dir) / STOP_FILE
    p.parent.mkdir(parents=True, exist_ok=True)
    p.touch()


def clear_stop(run_dir: str | Path) -> None:
    (Path(run_dir) / STOP_FILE).unlink(missing_ok=True)


def stop_requested(run_dir: str | Path) -> bool:
    return (Path(run_dir) / STOP_FILE).exists()
