"""A full disk under a running job's checkpoint directory (a real small tmpfs mounted there; skipped
where none can be mounted): the save that hits it fails, the checkpoint before it stays committed, and the
job, relaunched once the disk has room again, resumes from that checkpoint and finishes with every step.
tests/test_checkpoint_integrity.py holds the save itself; this is the job's side of it."""

from __future__ import annotations

import os
import subprocess

import pytest

from arena_opt.decision import Decision, JobDecision
from arena_opt.plan import Plan
from runners import checkpoint as ck
from runners.base import JobSpec
from runners.local import LocalRunner
from runners.managed import job_root
from runners.process import kill_all
from tests.runner_status import wait_for_status

pytestmark = pytest.mark.slow


def _decide(action: str) -> Decision:
    return Decision(policy="test", jobs=[JobDecision(job_id="f", action=action, gpu_type="cpu", num_gpus=1,
                                                     placement={"n0": [0]}, plan=Plan(dp=1))])


def test_full_disk_at_a_save_keeps_the_last_checkpoint_and_the_job_resumes_from_it(tmp_path):
    work = tmp_path / "work"
    disk = job_root(work, "f") / "ckpt"
    disk.mkdir(parents=True)
    m = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256m", "tmpfs", str(disk)], capture_output=True)
    if m.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {m.stderr.decode().strip()}")
    r = LocalRunner(work, device="cpu", ckpt_interval=3, max_failures=3, max_restarts=0)
    try:
        r.add_job(JobSpec(job_id="f", model="gpt-350M", global_batch=4, total_steps=9, step_delay_s=1.0))
        r.apply(_decide("start"))
        wait_for_status(r, "f", lambda s: (s.last_checkpoint_step or 0) >= 3, 150.0, "first checkpoint")
        first = ck.committed(disk)
        assert [s for s, _ in first] == [3]
        # the disk fills up before the save of step 6: less room left than one checkpoint takes
        size = sum(p.stat().st_size for p in first[0][1].iterdir())
        free = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize
        with open(disk / "filler", "wb") as f:
            f.truncate(0)
            f.write(b"\0" * (free - size // 4))
        st = wait_for_status(r, "f", lambda s: s.state != "running", 150.0, "the failed save")
        assert st.state == "crashed" and st.step >= 6, (st.state, st.message)
        log = open(st.log_path).read()
        assert "save of step 6" in log and "free there" in log, log[-2000:]
        assert [s for s, _ in ck.committed(disk)] == [3] and ck.verify(disk / ck.step_name(3)) is None
        assert (disk / ck.LATEST).read_text().strip() == ck.step_name(3)
        (disk / "filler").unlink()  # the operator makes room
        r.apply(_decide("keep"))
        st = wait_for_status(r, "f", lambda s: s.state != "running", 150.0, "the job to finish")
        assert st.state == "finished" and st.step == 9, st.message
        events = r.events("f")
        assert [e["step"] for e in events if e["event"] == "loaded"] == [3]
        assert [e["step"] for e in events if e["event"] == "step" and e["generation"] == 1] == list(range(4, 10))
    finally:
        r.shutdown(save=False)
        kill_all()
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)
