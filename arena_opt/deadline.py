"""One call's time limit: a clock from the call's start (the CLI: process entry, so reading the snapshot
counts), the wall time of each phase, the phases cut short at the deadline, and the reserve the policy
keeps for the phases after its choice (placement, the decision's objects, the check), scaled to this
call's job counts and to the share of a core this process gets now.

`arena_opt/__init__.py` imports this module before anything else; ENTRY is the process's start (the
interpreter's startup and the imports, 0.3-1.2 s of a CLI call on a loaded host, count)."""

from __future__ import annotations

import os
import time


def _process_start() -> tuple[float, float]:
    """(perf_counter(), process_time()) values of the process's start: Linux's /proc start time (clock
    ticks since boot) against CLOCK_BOOTTIME, which counts from the same boot; elsewhere, now (the
    interpreter's own start, 0.05-0.2 s wall on a loaded host, is then not counted)."""
    now, cpu = time.perf_counter(), time.process_time()
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22, starttime
        since = time.clock_gettime(time.CLOCK_BOOTTIME) - started
    except (OSError, ValueError, IndexError, AttributeError):
        return now, cpu
    return (now - since, 0.0) if 0.0 <= since < 60.0 else (now, cpu)


ENTRY, ENTRY_CPU = _process_start()

# CPU of the phases after the policy's choice (placement, decision objects, check, JSON write), per job of
# the snapshot and per job given a grid, measured with CPU time (not wall) on this machine type (2 cores,
# Python 3.11) on the issue-14 rounds: 10,000 jobs, 5,000-5,600 given a grid, 0.77-0.84 s (all-free and busy);
# 150,000 jobs, 1,280 given a grid, 1.3-1.6 s (per-phase process_time(), load 5-7). With no cyclic GC in the
# call the check no longer pays a full collection (it was 14 + 190 us with one): about 8.5 + 130 us. Kept
# 1.25x above: at 10 + 140 us the 10,000-job rounds ended 0.1-0.5 s past the limit at load 7 (the last
# phases get a smaller share of a core than the call's average so far)
AFTER_CPU_PER_JOB_S = 12e-6
AFTER_CPU_PER_RUN_S = 165e-6
AFTER_MARGIN = 1.5  # the constants' spread between the two rounds and between runs under load
AFTER_MIN_S = 0.05  # at least this: a tiny round still builds and checks a decision


class CallClock:
    """`limit_s` from `start` (a time.perf_counter() value; default now) and `start_cpu` (the process's
    time.process_time() then). `lap(name)` records the wall time since the previous lap as a phase."""

    def __init__(self, limit_s: float, start: float | None = None, start_cpu: float | None = None):
        now = time.perf_counter()
        self.limit_s = float(limit_s)
        self.start = now if start is None else start
        self.start_cpu = time.process_time() if start_cpu is None else start_cpu
        self.end = self.start + self.limit_s
        self.phases: dict[str, float] = {}
        self.cut: list[str] = []
        self._last = self.start

    @staticmethod
    def from_entry(limit_s: float) -> "CallClock":
        """The clock of a whole process (the CLI's): from ENTRY."""
        return CallClock(limit_s, ENTRY, ENTRY_CPU)

    def lap(self, name: str) -> float:
        now = time.perf_counter()
        self.phases[name] = self.phases.get(name, 0.0) + now - self._last
        self._last = now
        return now

    def cut_short(self, phase: str) -> None:
        """`phase` stopped early or was skipped because the deadline came."""
        if phase not in self.cut:
            self.cut.append(phase)

    def left(self, reserve_s: float = 0.0) -> float:
        return self.end - reserve_s - time.perf_counter()

    def slowdown(self) -> float:
        """Wall seconds per CPU second of this process since the start (>= 1): the share of a core it gets
        on a loaded host, which stretches every later phase alike."""
        wall = time.perf_counter() - self.start
        cpu = time.process_time() - self.start_cpu
        return max(1.0, wall / max(cpu, 1e-3))

    def after_choice_s(self, jobs: int, runs: int) -> float:
        """Wall seconds to keep for the phases after the policy's choice, for a snapshot of `jobs` jobs of
        which `runs` get a grid: their measured CPU per job, x this process's slowdown now, x a margin."""
        cpu = AFTER_CPU_PER_JOB_S * jobs + AFTER_CPU_PER_RUN_S * runs
        return max(AFTER_MIN_S, cpu * self.slowdown() * AFTER_MARGIN)

    def over_s(self) -> float:
        """Wall seconds past the limit now (negative: time to spare)."""
        return time.perf_counter() - self.end
