"""Runner events an operator must see: one console line and one JSON record in
`events.jsonl` per launch, exit, crash (failing rank and the last lines of its
log), in-place restart, relaunch, checkpoint fallback, failure and node loss.

Kinds: launch, exit, crash, restart, relaunch, held, ckpt_fallback, scratch,
failed, node_lost, node_back. Every record has time, kind, job (None for node
events) and message; the rest depends on the kind.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Callable


class EventLog:
    def __init__(self, path: str | Path | None, echo: Callable[[str], None] | None = None) -> None:
        self.path = Path(path) if path is not None else None
        self.echo = echo
        self.records: list[dict] = []

    def emit(self, kind: str, job: str | None, message: str, **fields: Any) -> dict:
        rec = {"time": time.time(), "kind": kind, "job": job, "message": message, **fields}
        self.records.append(rec)
        if self.path is not None:
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
                rec["not_written"] = str(e)
        if self.echo is not None:
            who = f"job {job}: " if job is not None else ""
            self.echo(f"[{kind}] {who}{message}")
        return rec
