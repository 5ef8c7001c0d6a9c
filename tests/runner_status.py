"""Waiting on a runner's observed state in the runner tests (local and Slurm backends)."""

from __future__ import annotations

import time


def wait_for_status(runner, job: str, pred, timeout: float, what: str = "", poll_s: float = 0.2):
    """The job's first `ObservedJob` for which `pred` holds; an AssertionError naming `what` after `timeout` s."""
    t0 = time.time()
    while time.time() - t0 < timeout:
        st = {o.job_id: o for o in runner.status()}[job]
        if pred(st):
            return st
        time.sleep(poll_s)
    raise AssertionError(f"timed out waiting for {what or pred}: {st}")
