"""A launched torchrun process and the means to end it with all its workers.

torchrun puts each worker in its own session, so neither a process-group kill
nor a SIGKILL of torchrun reaches them (../shared/MEASURED.md). Stopping is
therefore: SIGTERM to torchrun (it forwards SIGTERM to its workers and waits
for them), then SIGKILL to every descendant found under /proc. Workers also
ask the kernel to die with torchrun (runners.train), and every process started
here is registered for an exit-time sweep.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import signal
import subprocess
import threading
import time
import weakref
from pathlib import Path

_LIVE: "weakref.WeakSet[Proc]" = weakref.WeakSet()


def _children_map() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # the command name may contain spaces and parentheses: fields start after the last ')'
        ppid = int(stat[stat.rindex(b")") + 2:].split()[1])
        kids.setdefault(ppid, []).append(int(d))
    return kids


def descendants(pid: int) -> list[int]:
    kids = _children_map()
    out, todo = [], [pid]
    while todo:
        for c in kids.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def _start_time(pid: int) -> int | None:
    """Kernel start time of pid (clock ticks since boot): tells a process from a later one with its pid."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    return int(stat[stat.rindex(b")") + 2:].split()[19])


def pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rindex(b")") + 2:][:1] != b"Z"


def _term_with_parent() -> None:
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class Proc:
    def __init__(self, argv: list[str] | tuple[str, ...], env: dict[str, str], log_path: str | Path,
                 cwd: str | Path | None = None) -> None:
        self.log_path = Path(log_path)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")
        self.started = time.time()
        # own session (a signal to the runner's group must not hit the job), but SIGTERM when the runner dies:
        # torchrun passes it on, every rank saves and exits, so a killed runner leaves no launch running beside
        # the next runner's. The kernel ties PDEATHSIG to the forking *thread*: only set from the main thread,
        # where it means the process
        pdeath = _term_with_parent if threading.current_thread() is threading.main_thread() else None
        self.popen = subprocess.Popen(list(argv), env={**os.environ, **env}, cwd=cwd, stdout=self._log,
                                      stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                                      preexec_fn=pdeath)
        self.pid = self.popen.pid
        self._known: dict[int, int | None] = {}  # pid -> start time
        _LIVE.add(self)

    def poll(self) -> int | None:
        rc = self.popen.poll()
        if rc is None:
            # remember the workers while torchrun is alive, to reach them should it die first
            self._remember()
        else:
            self._log.close()
        return rc

    @property
    def returncode(self) -> int | None:
        return self.popen.returncode

    def _remember(self) -> None:
        for p in descendants(self.pid):
            if p not in self._known:
                self._known[p] = _start_time(p)

    def workers(self) -> list[int]:
        return descendants(self.pid)

    def terminate(self, timeout: float = 40.0) -> int:
        """SIGTERM to torchrun, then SIGKILL whatever is left of the tree after `timeout`."""
        if self.poll() is None:
            self._remember()
            try:
                os.kill(self.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        self.kill()
        return self.popen.returncode if self.popen.returncode is not None else -signal.SIGKILL

    def kill(self) -> None:
        """SIGKILL torchrun and every process it started; waits until they are gone."""
        if self.popen.poll() is None:
            self._remember()
            os.kill(self.pid, signal.SIGKILL)
        # only processes that are still the ones we saw: a pid may have been reused since
        pids = {p for p, t in self._known.items() if t is not None and _start_time(p) == t}
        for p in pids:
            try:
                os.kill(p, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        try:
            self.popen.wait(10)
        except subprocess.TimeoutExpired:
            pass
        deadline = time.time() + 10
        while time.time() < deadline and any(pid_alive(p) for p in pids):
            time.sleep(0.05)
        self._known.clear()
        if not self._log.closed:
            self._log.close()


@atexit.register
def _sweep() -> None:
    for p in list(_LIVE):
        p.kill()


def kill_all() -> None:
    """Kill every process tree this interpreter started through Proc."""
    _sweep()
