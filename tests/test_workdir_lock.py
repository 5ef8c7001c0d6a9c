"""One runner per work directory: a second runner (the CLI's or the library's) on a directory in use is
a user mistake named with the holder's pid, exit 2, before anything starts; the lock dies with its
holder, so a killed runner never blocks the next one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
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
