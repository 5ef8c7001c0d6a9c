"""One runner per work directory: two runners (or a runner and a restarted copy of itself) driving
the same job directories would launch the same job twice and write one checkpoint directory from
two places. An exclusive `flock` on WORKDIR/runner.lock says who holds it; the kernel drops the
lock when the holder dies, however it dies, so a killed runner never leaves a stale lock behind.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from arena_opt.errors import InputError

LOCK_NAME = "runner.lock"


class WorkdirLock:
    def __init__(self, workdir: Path) -> None:
        self.path = workdir / LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise InputError(f"work directory {self.path.parent}: in use by another arena-opt runner "
                             f"(pid {holder}, lock {self.path}); stop it or choose another --workdir") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None

    @property
    def held(self) -> bool:
        return self._fd is not None
