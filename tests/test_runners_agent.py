"""Multi-node backend with two agents on this host standing in for two nodes:
a job spread over both (c10d rendezvous, one torchrun per node: a pipeline
stage per node), and an agent that takes its launches down when it stops.
Moving a job between nodes is the reshape of tests/test_runners_local.py: the
same launch builder and checkpoint path, not repeated here for CI time."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from arena_opt.decision import Decision, JobDecision
from arena_opt.plan import Plan
from runners.agent import AgentError, AgentRunner, _call
from runners.base import JobSpec
from runners.process import kill_all, pid_alive
from runners.reference import reference_losses
from runners.spec import resolve_arch

pytestmark = pytest.mark.slow
TOL = 1e-3  # see tests/test_runners_local.py


@pytest.fixture
def agents(tmp_path):
    procs, addrs = [], {}
    try:
        for node in ("n0", "n1"):
            p = subprocess.Popen([sys.executable, "-m", "runners.agent", "--node-id", node, "--listen", "127.0.0.1:0",
                                  "--workdir", str(tmp_path / "agents")], stdout=subprocess.PIPE, text=True)
            procs.append(p)
            line = p.stdout.readline()  # "agent n0 listening on 127.0.0.1:PORT"
            addrs[node] = line.split()[-1]
        yield addrs, procs
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()
        kill_all()


def decide(action: str, plan: Plan, placement: dict[str, list[int]]) -> Decision:
    return Decision(policy="test", jobs=[JobDecision(job_id="m", action=action, gpu_type="cpu",
                                                     num_gpus=plan.num_gpus, placement=placement, plan=plan)])


def wait(r, pred, timeout=150.0):
    t0 = time.time()
    while time.time() - t0 < timeout:
        st = r.status()[0]
        if pred(st):
            return st
        time.sleep(0.2)
    raise AssertionError(f"timed out: {st}")


def test_job_over_two_agents_trains_and_dies_with_its_agent(tmp_path, agents):
    addrs, procs = agents
    assert _call(addrs["n1"], "/health")["node_id"] == "n1"
    with pytest.raises(AgentError, match="not in the placement"):
        _call(addrs["n1"], "/launch", {"spec": {"job_id": "x", "model": "gpt-350M", "plan": {}, "global_batch": 2,
                                                "total_steps": 1, "run_dir": "r", "ckpt_dir": "c"},
                                       "placement": {"n0": [0]}, "endpoint": "127.0.0.1:1", "node_id": "n1"})
    r = AgentRunner(tmp_path / "work", addrs, device="cpu")
    spec = JobSpec(job_id="m", model="gpt-350M", global_batch=8, total_steps=1000, step_delay_s=0.3)
    r.add_job(spec)
    # one pipeline stage per "node": the stages talk across the two torchruns
    r.apply(decide("start", Plan(pp=2, num_microbatches=2), {"n0": [0], "n1": [0]}))
    st = wait(r, lambda s: s.step >= 2 or s.state != "running")
    assert st.state == "running", st.message
    logs = r.jobs["m"].log_paths
    assert len(logs) == 2 and "agent-logs/n0" in logs[0] and "agent-logs/n1" in logs[1]
    start = next(e for e in r.events("m") if e["event"] == "start")
    assert start["world_size"] == 2
    got = r.losses("m")
    ref = reference_losses(resolve_arch(spec.model, spec.scale), max(got), 8)
    assert max(abs(got[s] - ref[s - 1]) for s in got) < TOL
    # an agent that is stopped takes its launches down with it
    workers = r.worker_pids("m")
    assert len(workers) == 2
    procs[1].send_signal(signal.SIGTERM)
    procs[1].wait(90)
    st = wait(r, lambda s: s.state != "running", timeout=60)
    # the SIGTERM reached the job's ranks on n1, the stop vote the ranks on n0: all saved at one step
    assert st.state in ("stopped", "crashed") and st.last_checkpoint_step == st.step
    deadline = time.time() + 30
    while time.time() < deadline and any(pid_alive(p) for p in workers):
        time.sleep(0.2)
    assert not [p for p in workers if pid_alive(p)]
