"""Runner events an operator must see: one console line and one record per
launch, exit, crash (failing rank and the last lines of its log), in-place
restart, relaunch, held relaunch, checkpoint fallback, failure and node loss.

Records have the run record's event shape (arena_opt.record: time, job, kind,
details) and its kinds: the runner facts in RUNNER_KINDS (a relaunch is a
`launch` with relaunch=True, a start from scratch a `checkpoint_fallback` with
scratch=True) and `crash` / `fail`. Inside the live loop the sink is the loop's
Recorder, which writes events.jsonl and counts crashes and failures itself from
what the runner reports; standalone, records go to a JSON Lines file.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Callable

Sink = Callable[[str, "str | None", dict], None]  # (kind, job, details)


class EventLog:
    def __init__(self, path: str | Path | None = None, echo: Callable[[str], None] | None = None,
                 sink: Sink | None = None) -> None:
        self.path = Path(path) if path is not None else None
        self.echo = echo
        self.sink = sink

    def emit(self, kind: str, job: str | None, message: str, **details: Any) -> None:
        details = {"message": message, **details}
        if self.sink is not None:
            self.sink(kind, job, details)
        elif self.path is not None:
            rec = {"time": time.time(), "job": job, "kind": kind, "details": details}
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                # one write() under O_APPEND: concurrent writers never interleave within a record
                fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                try:
                    os.write(fd, (json.dumps(rec, default=str) + "\n").encode())
                finally:
                    os.close(fd)
            except OSError as e:
                # a full or broken output disk must not stop the jobs; the console still says it
                message += f" (not written to {self.path}: {e.strerror})"
        if self.echo is not None:
            who = f"job {job}: " if job is not None else ""
            self.echo(f"[{kind}] {who}{message}")
