"""Against a real Slurm (the throwaway cluster of tests/slurm_cluster.py, fixture `slurm` in
conftest.py): snapshot with a foreign job and a drained node, solve on it, `slurm apply` on held
jobs (one refused), no job and no daemon left afterwards."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from arena_opt.decision import Decision, JobDecision
from arena_opt.plan import Plan
from arena_opt.snapshot import ClusterSnapshot

pytestmark = pytest.mark.slurm


def arena(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "arena_opt.cli", *args], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "ARENA_OPT_CACHE": ""})


def sbatch(slurm, *args: str) -> str:
    return slurm.run("sbatch", "--parsable", *args).stdout.strip().split(";")[0]


def meta(**kw) -> str:
    return "--comment=arena:" + json.dumps({"model": "gpt-350M", "batch_size": 8, "total_iterations": 50, **kw})


def test_snapshot_with_foreign_job_and_drained_node_then_solve(slurm, tmp_path):
    foreign = sbatch(slurm, "--nodelist=n1", "-N1", "--gres=gpu:a100:3", "--wrap", "sleep 300")
    ours = sbatch(slurm, "--nodelist=n3", "-N1", "--gres=gpu:v100:2", meta(progress=10), "--wrap", "sleep 300")
    held = sbatch(slurm, "--hold", "-N1", "--gres=gpu:a100:1", meta(), "--wrap", "sleep 300")
    slurm.run("scontrol", "update", "NodeName=n2", "State=DRAIN", "Reason=disk check")
    out = tmp_path / "snap.json"
    r = arena("slurm", "snapshot", "-o", str(out))
    assert r.returncode == 0, r.stderr
    snap = ClusterSnapshot.model_validate_json(out.read_text())
    nodes = {n.id: n for n in snap.nodes}
    assert set(nodes) == {"n1", "n2", "n3", "n4"}, snap.notes
    assert nodes["n2"].state == "drain" and "node n2 drain: DRAIN (disk check)" in snap.notes
    # Slurm gave the foreign job the lowest devices: n1 offers the one left
    assert nodes["n1"].num_gpus == 1 and nodes["n1"].gpu_ids == [3]
    jobs = {j.id: j for j in snap.jobs}
    assert foreign not in jobs and set(jobs) == {ours, held}
    assert jobs[ours].running.placement == {"n3": [0, 1]} and jobs[ours].remaining_iterations == 40
    assert jobs[held].running is None
    d = tmp_path / "d.json"
    r = arena("solve", str(out), "--time-limit", "5", "-o", str(d))
    assert r.returncode == 0, r.stderr
    decision = Decision.model_validate_json(d.read_text())
    for jd in decision.jobs:
        for nid, gpus in jd.placement.items():
            assert nid in nodes and all(g < nodes[nid].num_gpus for g in gpus)
            assert nid != "n2", f"new work on the drained node: {jd}"


def _start(job_id: str, gpu: str, placement: dict[str, list[int]]) -> JobDecision:
    n = sum(len(g) for g in placement.values())
    return JobDecision(job_id=job_id, action="start", gpu_type=gpu, num_gpus=n, num_nodes=len(placement),
                       placement=placement, plan=Plan(dp=n))


def test_apply_on_held_jobs_including_a_refused_update(slurm, tmp_path):
    grow = sbatch(slurm, "--hold", "-N1", meta(), "--wrap", "sleep 300")  # no GPU request: arena-opt sets it
    waits = sbatch(slurm, "--hold", "-N1", "--gres=gpu:a100:1", meta(), "--wrap", "sleep 300")
    # a typed request of another type: refused before Slurm is asked (it would never run the job)
    retype = sbatch(slurm, "--hold", "-N1", "--gres=gpu:v100:1", meta(), "--wrap", "sleep 300")
    # submitted with an untyped GPU request: Slurm refuses a typed one in an update
    untyped = sbatch(slurm, "--hold", "-N1", "--gres=gpu:1", meta(), "--wrap", "sleep 300")
    decision = Decision(policy="test", jobs=[
        _start(grow, "v100-32gb", {"n3": [0, 1, 2, 3], "n4": [0, 1, 2, 3]}),
        JobDecision(job_id=waits, action="wait", reason="no GPUs free"),
        _start(untyped, "a100-40gb", {"n1": [0, 1]}),
        _start(retype, "a100-40gb", {"n2": [0]}),
    ])
    path = tmp_path / "d.json"
    path.write_text(decision.model_dump_json())
    dry = arena("slurm", "apply", str(path), "--dry-run")
    assert dry.returncode == 1 and f"job {retype}: it asks for GPU type 'v100'" in dry.stderr, dry.stderr
    assert f"scontrol update JobId={grow} NumNodes=2-2" in dry.stdout
    assert f"scontrol update JobId={grow} TresPerNode=gres:gpu:v100:4" in dry.stdout
    assert f"scontrol release {grow}" in dry.stdout and f"# job {waits}: wait: stays held" in dry.stdout
    assert set(slurm.run("squeue", "-h", "-o", "%r").stdout.split()) == {"JobHeldUser"}  # dry run changed nothing

    r = arena("slurm", "apply", str(path))
    assert r.returncode == 1
    assert f"job {untyped}: `scontrol update JobId={untyped} TresPerNode=gres:gpu:a100:2` refused by Slurm: " in r.stderr
    assert "Invalid GRES specification" in r.stderr and "the job stays held" in r.stderr
    state = {l.split()[0]: l.split()[1:] for l in slurm.run("squeue", "-h", "-o", "%i %T %r %N").stdout.splitlines()}
    assert f"job {retype}: it asks for GPU type 'v100'" in r.stderr
    for j in (waits, untyped, retype):
        assert state[j][:2] == ["PENDING", "JobHeldUser"], (j, state[j])
    slurm.wait_for(lambda: slurm.run("squeue", "-h", "-j", grow, "-o", "%T").stdout.strip() == "RUNNING", 30)
    detail = slurm.run("scontrol", "show", "job", "-d", grow).stdout
    assert "Nodes=n[3-4]" in detail and "gpu:v100:4(IDX:0-3)" in detail
    # the job reads its plan back from its comment
    comment = slurm.run("squeue", "-h", "-j", grow, "-o", "%k").stdout.strip()
    assert json.loads(comment.removeprefix("arena:"))["plan"]["dp"] == 8


def test_cleanup_leaves_no_job_and_no_daemon():
    from slurm_cluster import SlurmCluster, unavailable_reason

    from runners.process import pid_alive

    why = unavailable_reason()
    if why:
        pytest.skip(why)
    c = SlurmCluster().start()
    try:
        c.run("sbatch", "--nodelist=n1", "-N1", "--gres=gpu:a100:4", "--wrap", "sleep 300")
        c.wait_for(lambda: c.run("squeue", "-h", "-o", "%T").stdout.split() == ["RUNNING"], 30)
        pids = c.daemon_pids()
        root = c.root
        steps = [p for p in c.processes() if p not in pids]
        assert steps, "the job's step daemon and script run"
    finally:
        c.stop()
    assert not [p for p in pids + steps if pid_alive(p)]
    assert not root.exists()
