"""`arena-opt simulate` and `bench` stopped by SIGTERM: a message, exit 143
(128 + SIGTERM), the previous result file untouched, a bench keeping the
policies it finished and marking the rest as not run, no worker left."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runners.process import descendants, pid_alive

ROOT = Path(__file__).resolve().parents[1]


def _cli(*args: str, **kw) -> subprocess.Popen:
    env = {**os.environ, "ARENA_OPT_CACHE": ""}
    return subprocess.Popen([sys.executable, "-m", "arena_opt.cli", *args], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a live process (Linux /proc)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _gen_trace(path: Path, jobs: int) -> Path:
    p = _cli("gen-trace", "--cluster", "a100:4x8", "-o", str(path), "--jobs", str(jobs), "--seed", "1")
    assert p.wait(120) == 0, p.stderr.read()
    return path


@pytest.fixture(scope="module")
def trace(tmp_path_factory) -> Path:
    return _gen_trace(tmp_path_factory.mktemp("trace") / "t.jsonl", 300)


@pytest.fixture(scope="module")
def long_trace(tmp_path_factory) -> Path:
    # 300 jobs on 32 GPUs simulate in under 6 s since the greedy start got faster: the SIGTERM must land
    # inside the run whatever the host's speed, so this run is made to last minutes
    return _gen_trace(tmp_path_factory.mktemp("trace") / "long.jsonl", 4000)


def test_sigterm_of_simulate_keeps_the_previous_result(tmp_path, long_trace):
    out = tmp_path / "sim"
    out.mkdir()
    (out / "arena.json").write_text('{"previous": true}')
    p = _cli("simulate", "--trace", str(long_trace), "--cluster", "a100:4x8", "--policy", "arena", "-o", str(out),
             "--quiet")
    # well inside the simulation (it runs for minutes): counted in the process's CPU time, not wall
    # time, since under load a fixed sleep can end before the CLI has imported and set its handlers
    deadline = time.time() + 300
    while p.poll() is None and _cpu_s(p.pid) < 4.0 and time.time() < deadline:
        time.sleep(0.2)
    assert p.poll() is None, p.communicate()
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 143, err
    assert "interrupted by SIGTERM" in err and "Traceback" not in err
    assert json.loads((out / "arena.json").read_text()) == {"previous": True}
    assert [f.name for f in out.iterdir()] == ["arena.json"]


def test_interrupted_bench_keeps_finished_policies_and_marks_the_rest(tmp_path, trace):
    out = tmp_path / "bench"
    p = _cli("bench", "--trace", str(trace), "--cluster", "a100:4x8", "--policies", "fcfs,arena", "-o", str(out),
             "--quiet", "--parallel", "1")  # one after another: arena waits while fcfs runs
    seen: set[int] = set()
    deadline = time.time() + 120
    while time.time() < deadline and not (out / "fcfs.json").exists():
        seen.update(descendants(p.pid))
        time.sleep(0.2)
    assert (out / "fcfs.json").exists(), p.communicate()
    time.sleep(1.0)
    seen.update(descendants(p.pid))  # the arena worker
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 143, err
    assert "not run: arena" in err and "Traceback" not in err
    status = json.loads((out / "status.json").read_text())
    assert status["fcfs"] == "finished" and status["arena"].startswith("not run (interrupted by SIGTERM")
    md = (out / "results.md").read_text()
    assert "| fcfs |" in md and "arena: not run" in md
    assert not (out / "arena.json").exists()
    assert json.loads((out / "fcfs.json").read_text())["policy"] == "fcfs"
    assert not [q for q in seen if pid_alive(q)], "a bench worker outlived the bench"
