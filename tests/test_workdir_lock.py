"""One runner per work directory: a second runner (the CLI's or the library's) on a directory in use is
a user mistake named with the holder's pid, exit 2, before anything starts; the lock dies with its
holder, so a killed runner never blocks the next one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from arena_opt.errors import InputError
from runners.local import LocalRunner
from runners.workdir_lock import LOCK_NAME

ROOT = Path(__file__).resolve().parents[1]


def test_second_runner_on_a_workdir_in_use_is_refused_until_the_first_shuts_down(tmp_path):
    a = LocalRunner(tmp_path / "w", device="cpu")
    with pytest.raises(InputError) as e:
        LocalRunner(tmp_path / "w", device="cpu")
    assert str(tmp_path / "w") in str(e.value) and f"pid {os.getpid()}" in str(e.value)
    LocalRunner(tmp_path / "other", device="cpu").shutdown()  # another directory is free
    a.shutdown()
    b = LocalRunner(tmp_path / "w", device="cpu")  # released by shutdown
    b.shutdown()


def test_a_killed_runner_leaves_no_stale_lock(tmp_path):
    code = ("import sys, time\nfrom runners.local import LocalRunner\n"
            "r = LocalRunner(sys.argv[1], device='cpu')\nprint('held', flush=True)\ntime.sleep(600)\n")
    p = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "w")], stdout=subprocess.PIPE, text=True,
                         cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert p.stdout.readline().strip() == "held"
        with pytest.raises(InputError, match=f"pid {p.pid}"):
            LocalRunner(tmp_path / "w", device="cpu")
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
    LocalRunner(tmp_path / "w", device="cpu").shutdown()
    assert (tmp_path / "w" / LOCK_NAME).exists()  # the file stays; the lock was the holder's


def test_cli_run_on_a_workdir_in_use_exits_2_and_starts_nothing(tmp_path):
    holder = LocalRunner(tmp_path / "w", device="cpu")
    try:
        out = tmp_path / "out"
        p = subprocess.run([sys.executable, "-m", "arena_opt.cli", "run", "--snapshot", "instances/small.json",
                            "--backend", "local", "--device", "cpu", "--workdir", str(tmp_path / "w"),
                            "--out", str(out), "--max-jobs", "1"], cwd=ROOT, capture_output=True, text=True,
                           timeout=300)
    finally:
        holder.shutdown()
    assert p.returncode == 2, p.stderr
    assert "in use by another arena-opt runner" in p.stderr and "Traceback" not in p.stderr
    assert not (tmp_path / "w" / "jobs").exists()  # no job directory, no launch


_KILLED_LOCAL_RUNNER = """
import sys, time
from arena_opt.decision import Decision, JobDecision
from arena_opt.plan import Plan
from runners.base import JobSpec
from runners.local import LocalRunner
r = LocalRunner(sys.argv[1], device="cpu")
r.add_job(JobSpec(job_id="k", model="gpt-350M", global_batch=4, total_steps=5000, step_delay_s=0.3))
r.apply(Decision(policy="t", jobs=[JobDecision(job_id="k", action="start", gpu_type="cpu", num_gpus=1,
                                               placement={"n0": [0]}, plan=Plan(dp=1))]))
while True:
    st = {o.job_id: o for o in r.status()}["k"]
    if st.step >= 3:
        print("step", st.step, flush=True)
        time.sleep(600)
    time.sleep(0.2)
"""


@pytest.mark.slow
def test_a_killed_local_runner_takes_its_launches_down_saving(tmp_path):
    """SIGKILL of the runner: torchrun gets SIGTERM from the kernel (PDEATHSIG), every rank saves and exits,
    so nothing runs on beside the next runner, and the next launch resumes from that save."""
    from runners import checkpoint as ck
    from runners.managed import job_root
    from runners.process import descendants, pid_alive

    work = tmp_path / "w"
    p = subprocess.Popen([sys.executable, "-c", _KILLED_LOCAL_RUNNER, str(work)], stdout=subprocess.PIPE, text=True,
                         cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        line = p.stdout.readline().split()
        assert line and line[0] == "step", "the runner never reported 3 steps"
        seen = int(line[1])
        kids = descendants(p.pid)
        assert kids  # torchrun and its worker
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
    deadline = time.time() + 90
    while time.time() < deadline and any(pid_alive(k) for k in kids):
        time.sleep(0.5)
    assert not [k for k in kids if pid_alive(k)], "the launch outlived its runner"
    saved = ck.newest_complete(job_root(work, "k") / "ckpt")
    assert saved is not None and saved[0] >= seen, saved  # the ranks saved on the way out
