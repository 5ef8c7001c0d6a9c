"""The Slurm backend against a real Slurm (fixture `slurm`, tests/slurm_cluster.py): a 2-node job
as one heterogeneous sbatch, reshaped to the other GPU type with the loss continuing; a node drained
under a job -> the job keeps running there; a node set DOWN under a job -> the job re-planned
elsewhere from its checkpoint by the live loop; a generation left
pending by Slurm is reported pending; a runner (or `arena-opt run`) killed with SIGKILL and started
again takes its running launch over. Tiny models on CPU (gloo)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from arena_opt.decision import Decision, JobDecision
from arena_opt.plan import Plan
from runners.base import JobSpec
from runners.reference import reference_losses
from runners.slurm import SlurmRunner
from runners.spec import resolve_arch
from tests.runner_status import wait_for_status
from tests.slurm_cluster import (LoopCommands, WhenRunning, controller_outage, one_job_loop, set_node_states,
                                 timed_status)

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
TOL = 1e-3  # see tests/test_runners_local.py


def decide(job: str, action: str, gpu: str, placement: dict[str, list[int]], plan: Plan) -> Decision:
    return Decision(policy="test", jobs=[JobDecision(job_id=job, action=action, gpu_type=gpu, num_gpus=plan.num_gpus,
                                                     num_nodes=len(placement), placement=placement, plan=plan)])


def wait(r, job: str, pred, timeout: float = 120.0, what: str = ""):
    return wait_for_status(r, job, pred, timeout, what, poll_s=0.3)


def test_two_node_job_then_reshape_to_the_other_gpu_type(slurm, tmp_path):
    r = SlurmRunner(tmp_path / "work", device="cpu", tag="t1")
    try:
        spec = JobSpec(job_id="m", model="gpt-350M", global_batch=8, total_steps=8, step_delay_s=0.3)
        r.add_job(spec)
        nodes = {n.id: n for n in r.cluster_nodes()}
        assert set(nodes) == {"n1", "n2", "n3", "n4"}
        # a foreign job holds n1's first device: Slurm gives ours device 1, reported as index 0 of 3
        slurm.run("sbatch", "--nodelist=n1", "-N1", "--gres=gpu:a100:1", "--wrap", "sleep 300")
        slurm.wait_for(lambda: "RUNNING" in slurm.run("squeue", "-h", "-o", "%T").stdout, 20)
        assert next(n for n in r.cluster_nodes() if n.id == "n1").gpu_ids == [1, 2, 3]
        r.apply(decide("m", "start", "a100-40gb", {"n1": [0], "n2": [0]}, Plan(dp=2)))
        st = wait(r, "m", lambda s: s.step >= 2 or s.state not in ("running", "pending"), what="steps on 2 nodes")
        assert st.state == "running", st.message
        assert st.placement == {"n1": [0], "n2": [0]}
        sid = r.slurm_id("m")
        detail = slurm.run("scontrol", "show", "job", "-d", sid).stdout
        assert "gpu:a100:1(IDX:1)" in detail and "gpu:a100:1(IDX:0)" in detail  # one component per node
        # reshape to v100 on one node
        r.apply(decide("m", "reshape", "v100-32gb", {"n3": [0, 1]}, Plan(dp=2)))
        st = wait(r, "m", lambda s: s.state not in ("running", "pending"), what="finish")
        assert st.state == "finished", st.message
        assert st.gpu_type == "v100-32gb" and st.placement == {"n3": [0, 1]}
        events = r.events("m")
        saved = [e["step"] for e in events if e["event"] == "checkpoint"]
        loaded = [e["step"] for e in events if e["event"] == "loaded"]
        assert loaded and loaded[0] == saved[0] and [e["step"] for e in events if e["event"] == "step"] == \
            list(range(1, 9))
        got = r.losses("m")
        ref = reference_losses(resolve_arch(spec.model, spec.scale), 8, spec.global_batch, seed=spec.seed, lr=spec.lr)
        assert max(abs(got[s] - ref[s - 1]) for s in got) < TOL
    finally:
        r.shutdown()
    assert not [l for l in slurm.run("squeue", "-h", "-o", "%j %T").stdout.splitlines() if l.startswith("arena-t1-")
                and "RUNNING" in l]


def test_pending_generation_is_reported_pending(slurm, tmp_path):
    r = SlurmRunner(tmp_path / "work", device="cpu", tag="t2")
    try:
        r.add_job(JobSpec(job_id="p", model="gpt-350M", global_batch=4, total_steps=50, step_delay_s=0.3))
        r.cluster_nodes()
        # a foreign job takes 3 of n4's GPUs after the decision for 2 of them was made
        slurm.run("sbatch", "--nodelist=n4", "-N1", "--gres=gpu:v100:3", "--wrap", "sleep 300")
        slurm.wait_for(lambda: "RUNNING" in slurm.run("squeue", "-h", "-o", "%T").stdout, 20)
        r.apply(decide("p", "start", "v100-32gb", {"n4": [0, 1]}, Plan(dp=2)))
        st = wait(r, "p", lambda s: s.state == "pending", timeout=20, what="pending")
        assert st.placement == {} and "pending" in st.message
        # the next decision puts it elsewhere: the pending generation is cancelled, the new one runs
        r.apply(decide("p", "start", "v100-32gb", {"n3": [0, 1]}, Plan(dp=2)))
        st = wait(r, "p", lambda s: s.step >= 1 or s.state in ("failed", "crashed"), what="running on n3")
        assert st.state == "running" and st.placement == {"n3": [0, 1]}
    finally:
        r.shutdown()


def _live_run_with_node_event(slurm, tmp_path, *states: str):
    """One job on the Slurm runner; once it has run a few steps, its node is set to each of `states`."""
    r = SlurmRunner(tmp_path / "work", device="cpu", tag=f"t{states[0][:2].lower()}", ckpt_interval=2)
    loop = one_job_loop(r, tmp_path / "out", "d", iterations=30, interval_s=3, duration_s=100)

    def fail(o):
        node = next(iter(o.placement))
        set_node_states(slurm, node, *states, reason="test")
        return node

    with WhenRunning(loop, "d", 4, fail) as hit:
        res = loop.run()
    assert hit.result is not None, f"never set {states}"
    rec = {j["id"]: j for j in res.jobs}["d"]
    assert rec["status"] == "done", rec
    return r, hit.result


def test_live_loop_drained_node_keeps_its_job(slurm, tmp_path):
    # Slurm's DRAIN lets running jobs finish: the job keeps its GPUs, no restart, no lost step
    r, node = _live_run_with_node_event(slurm, tmp_path, "DRAIN")
    starts = [e for e in r.events("d") if e["event"] == "start"]
    assert len(starts) == 1, starts
    assert node in r.jobs["d"].log_paths[0]


def test_live_loop_down_node_replans_from_checkpoint(slurm, tmp_path):
    # a DOWN node kills its jobs: re-planned elsewhere, resumed from the last checkpoint, not from scratch.
    # The test cluster returns a DOWN node to service as soon as its slurmd registers again
    # (ReturnToService=2), so DRAIN keeps it out, as an operator taking a failed node out would.
    r, node = _live_run_with_node_event(slurm, tmp_path, "DOWN", "DRAIN")
    starts = [e for e in r.events("d") if e["event"] == "start"]
    assert len(starts) == 2 and starts[1]["step"] > 0, starts
    logs = r.jobs["d"].log_paths  # the last generation's
    assert node not in logs[0], (node, logs)


def test_cli_run_backend_slurm(slurm, tmp_path):
    import json
    import os
    import subprocess
    import sys

    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps({"id": "c1", "submit_time": 0, "model": "gpt-350M", "batch_size": 4,
                                 "iterations": 6, "num_gpus": 2}) + "\n")
    p = subprocess.run([sys.executable, "-m", "arena_opt.cli", "run", "--backend", "slurm", "--trace", str(trace),
                        "--policy", "fcfs", "--interval", "3", "--time-scale", "1", "--iter-scale", "1",
                        "--batch-divisor", "1", "--model-size", "scaled", "--device", "cpu", "--duration", "120",
                        "--workdir", str(tmp_path / "w"), "--out", str(tmp_path / "out")],
                       capture_output=True, text=True, timeout=200, env={**os.environ, "ARENA_OPT_CACHE": ""})
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    m = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert m["finished"] == 1
    batch = next((tmp_path / "w").rglob("g0.sbatch")).read_text()  # the job directory is runners.managed.job_root
    assert "--gres=gpu:" in batch and "srun" in batch


def _cli_run(tmp_path: Path, out: str, **popen) -> "subprocess.Popen":
    """`arena-opt run --backend slurm` (fcfs) on work dir tmp_path/w with one 1-GPU job `k` of 40 steps, paced
    (--step-delay) so that it runs long enough to be killed mid-run."""
    import json
    import os
    import subprocess
    import sys

    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps({"id": "k", "submit_time": 0, "model": "gpt-350M", "batch_size": 4,
                                 "iterations": 40, "num_gpus": 1}) + "\n")
    return subprocess.Popen(
        [sys.executable, "-m", "arena_opt.cli", "run", "--backend", "slurm", "--trace", str(trace), "--policy", "fcfs",
         "--interval", "2", "--time-scale", "1", "--iter-scale", "1", "--batch-divisor", "1", "--model-size",
         "scaled", "--device", "cpu", "--duration", "240", "--ckpt-interval", "2", "--ckpt-every-s", "0",
         "--step-delay", "0.3", "--workdir", str(tmp_path / "w"), "--out", str(tmp_path / out)],
        env={**os.environ, "ARENA_OPT_CACHE": ""}, text=True, **popen)


def test_cli_run_killed_then_run_again_takes_over_the_running_launch(slurm, tmp_path):
    """`arena-opt run` killed with SIGKILL mid-run leaves its Slurm launch running; `arena-opt run` again on the
    same work directory takes that launch over: the same Slurm job runs on to the end (never relaunched, no
    second Slurm job for the job), every step once, and its checkpoint step only grows."""
    import json
    import signal
    import subprocess

    from runners.checkpoint import newest_complete
    from runners.managed import job_root
    from runners.names import safe_name
    from runners.progress import ProgressReader

    root = job_root(tmp_path / "w", "k")
    first = _cli_run(tmp_path, "out1", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        slurm.wait_for(lambda: ProgressReader(root / "run").poll().step >= 5 or first.poll() is not None, 180,
                       "5 steps of the first run")
        assert first.poll() is None, "the first run ended before it was killed"
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    live = slurm.run("squeue", "-h", "-o", "%i %j %T").stdout.split("\n")
    ours = [line.split() for line in live if f"-{safe_name('k')}-g0" in line]
    assert len(ours) == 1 and ours[0][2] == "RUNNING", live  # outlived the CLI
    old_id = ours[0][0]
    saved = newest_complete(root / "ckpt")
    assert saved is not None and saved[0] >= 2  # what the kill must not lose

    second = _cli_run(tmp_path, "out2", stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out, _ = second.communicate(timeout=300)
    assert second.returncode == 0, out[-3000:]
    events = [json.loads(line) for line in (tmp_path / "out2" / "events.jsonl").read_text().splitlines()]
    launches = [e["details"] for e in events if e["kind"] == "launch" and e["job"] == "k"]
    assert len(launches) == 1 and launches[0].get("taken_over") and launches[0]["slurm_id"] == int(old_id), launches
    assert not [e for e in events if e["kind"] == "exit" and e["details"].get("leftover")]  # nothing stopped
    assert json.loads((tmp_path / "out2" / "metrics.json").read_text())["finished"] == 1
    progress = ProgressReader(root / "run").poll().events
    assert [e["generation"] for e in progress if e["event"] == "start"] == [0]  # launched once, never again
    assert not [e for e in progress if e["event"] == "loaded"]  # nothing resumed: it ran on
    assert sorted(e["step"] for e in progress if e["event"] == "step") == list(range(1, 41))
    ckpts = [e["step"] for e in progress if e["event"] == "checkpoint"]
    assert ckpts == sorted(ckpts) and saved[0] in ckpts and ckpts[-1] > saved[0], ckpts
    assert sorted(p.name for p in (root / "logs").glob("*.sbatch")) == ["g0.sbatch"]  # one Slurm job for k
    assert not slurm.run("squeue", "-h", "-o", "%i").stdout.strip()


# ids that broke the batch script when they were written into `#SBATCH --job-name=` as they are: a space
# ends the directive ("Invalid directive"), a newline ends the directives (the GPUs asked for are lost)
SLURM_HOSTILE = ["a b\tc\n-g0", "x\n#SBATCH --nodelist=n4", "$(touch pwned)", "../../up", "-rf"]


def test_hostile_job_ids_run_where_decided(slurm, tmp_path):
    r = SlurmRunner(tmp_path / "work dir", device="cpu", tag="th")
    places = [{"n1": [0]}, {"n1": [1]}, {"n2": [0]}, {"n3": [0]}, {"n3": [1]}]
    try:
        for jid in SLURM_HOSTILE:
            r.add_job(JobSpec(job_id=jid, model="gpt-350M", global_batch=4, total_steps=2, step_delay_s=0.2))
        r.cluster_nodes()
        d = Decision(policy="test", jobs=[
            JobDecision(job_id=jid, action="start", gpu_type="v100-32gb" if "n3" in p else "a100-40gb",
                        num_gpus=1, num_nodes=1, placement=p, plan=Plan(dp=1))
            for jid, p in zip(SLURM_HOSTILE, places)])
        r.apply(d)
        names = slurm.run("squeue", "-h", "-o", "%j|%N").stdout.splitlines()
        for jid, p in zip(SLURM_HOSTILE, places):
            for _ in range(3):
                st = wait(r, jid, lambda s: s.state not in ("running", "pending"), what=f"{jid!r} finishes")
                if st.state != "crashed":
                    break
                # every "node" of the test cluster is this host: five launches at once can race for a free
                # rendezvous port; the next decision relaunches a crashed job, as the live loop's would
                log = Path(st.message.rsplit("log: ", 1)[-1]).read_text()
                assert "RendezvousConnectionError" in log, (jid, st.message)
                r.apply(d)
            assert st.state == "finished", (jid, st.message)
            # the directives held: the decided node and GPU count (Slurm picks the device indices itself, and a
            # relaunch may get another index on the node)
            assert set(st.placement) == set(p) and sum(map(len, st.placement.values())) == 1, (jid, st.placement)
        assert len(names) == len(SLURM_HOSTILE) and all(n.split("|")[1] != "n4" for n in names), names
        assert all(n.startswith("arena-th-") and " " not in n.split("|")[0] for n in names), names
        assert not (tmp_path / "pwned").exists() and not any(tmp_path.rglob("pwned"))
    finally:
        r.shutdown()


_KILLED_RUNNER = """
import sys, time
from arena_opt.decision import Decision, JobDecision
from arena_opt.plan import Plan
from runners.base import JobSpec
from runners.slurm import SlurmRunner
r = SlurmRunner(sys.argv[1], device="cpu", tag="told", ckpt_interval=2)
r.add_job(JobSpec(job_id="k", model="gpt-350M", global_batch=4, total_steps=40, step_delay_s=0.3))
r.cluster_nodes()
r.apply(Decision(policy="t", jobs=[JobDecision(job_id="k", action="start", gpu_type="v100-32gb", num_gpus=1,
                                               num_nodes=1, placement={"n3": [0]}, plan=Plan(dp=1))]))
while True:
    st = {o.job_id: o for o in r.status()}["k"]
    if st.step >= 5:
        print(r.slurm_id("k"), flush=True)
        time.sleep(600)
    time.sleep(0.2)
"""


def _killed_runner(slurm, work: Path) -> str:
    """The Slurm id of the launch a runner killed with SIGKILL left running (5 steps done, on n3)."""
    import signal
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    p = subprocess.Popen([sys.executable, "-c", _KILLED_RUNNER, str(work)], stdout=subprocess.PIPE, text=True,
                         cwd=root, env={**slurm.env, "PYTHONPATH": str(root)})
    try:
        old_id = p.stdout.readline().strip()
        assert old_id, "the first runner never reported 5 steps"
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
    assert "RUNNING" in slurm.run("squeue", "-h", "-j", old_id, "-o", "%T").stdout  # outlived its runner
    return old_id


def _runner_events(work: Path, kind: str) -> list[dict]:
    import json

    return [e["details"] for e in map(json.loads, (work / "events.jsonl").read_text().splitlines())
            if e["kind"] == kind]


def test_runner_killed_then_restarted_takes_over_its_running_launch(slurm, tmp_path):
    """A runner killed with SIGKILL leaves its Slurm launch running; the next runner on the work directory
    takes it over as the job's launch (its record says what it runs): the same decision keeps it, so the
    job is never relaunched, runs every step once and never twice at once."""
    work = tmp_path / "work"
    old_id = _killed_runner(slurm, work)
    r = SlurmRunner(work, device="cpu", tag="tnew", ckpt_interval=2)  # the lock died with the runner
    try:
        r.add_job(JobSpec(job_id="k", model="gpt-350M", global_batch=4, total_steps=40, step_delay_s=0.3))
        assert r.slurm_id("k") == old_id
        taken = [e for e in _runner_events(work, "launch") if e.get("taken_over")]
        assert len(taken) == 1 and taken[0]["slurm_id"] == int(old_id) and taken[0]["generation"] == 0, taken
        o = {o.job_id: o for o in r.status()}["k"]
        assert o.state == "running" and o.placement == {"n3": [0]} and o.generation == 0 and o.step >= 5
        # the snapshot counts its GPU as the job's, not as a foreign occupant's
        n3 = next(n for n in r.cluster_nodes() if n.id == "n3")
        assert n3.num_gpus == 4, n3
        r.apply(decide("k", "start", "v100-32gb", {"n3": [0]}, Plan(dp=1)))  # what it runs: kept
        st = wait(r, "k", lambda s: s.state not in ("running", "pending"), timeout=180, what="finish")
        assert st.state == "finished" and r.slurm_id("k") is None, st.message
        events = r.events("k")
        assert [e["generation"] for e in events if e["event"] == "start"] == [0]  # launched once, never again
        steps = [e["step"] for e in events if e["event"] == "step"]
        assert sorted(steps) == list(range(1, 41))
        assert not [e for e in _runner_events(work, "exit") if e.get("leftover")]  # nothing stopped
    finally:
        r.shutdown()
    assert not [l for l in slurm.run("squeue", "-h", "-o", "%j %T").stdout.splitlines() if "RUNNING" in l]


def test_runner_restarted_without_the_launch_record_stops_the_launch_and_resumes_once(slurm, tmp_path):
    """The same without the launch's record (a runner of an older version, a record lost): the next runner
    stops the launch (its ranks save) before launching the job again, which resumes from that checkpoint:
    the job never runs twice at once and loses no step it saved."""
    work = tmp_path / "work"
    old_id = _killed_runner(slurm, work)
    for rec in (work / "jobs").glob("*/logs/g*.launch.json"):
        rec.unlink()
    r = SlurmRunner(work, device="cpu", tag="tnew", ckpt_interval=2)
    try:
        r.add_job(JobSpec(job_id="k", model="gpt-350M", global_batch=4, total_steps=40, step_delay_s=0.3))
        assert not slurm.run("squeue", "-h", "-j", old_id, "-o", "%T", check=False).stdout.strip() or \
            set(slurm.run("squeue", "-h", "-j", old_id, "-o", "%T").stdout.split()) <= {"COMPLETING"}
        left = [e for e in _runner_events(work, "exit") if e.get("leftover")]
        assert len(left) == 1 and left[0]["slurm_id"] == int(old_id) and left[0]["stopped"], left
        r.cluster_nodes()
        r.apply(decide("k", "start", "v100-32gb", {"n4": [0]}, Plan(dp=1)))
        st = wait(r, "k", lambda s: s.state not in ("running", "pending"), timeout=180, what="finish")
        assert st.state == "finished", st.message
        events = r.events("k")
        saved = [e["step"] for e in events if e["event"] == "checkpoint"]
        loaded = [e["step"] for e in events if e["event"] == "loaded"]
        # the stopped launch saved at SIGTERM (>= the 5 steps seen); the new launch loaded that save
        assert loaded and loaded[-1] >= 5 and loaded[-1] in saved
        steps = [e["step"] for e in events if e["event"] == "step"]
        assert max(steps) == 40 and set(range(1, 41)) <= set(steps)
    finally:
        r.shutdown()
    assert not [l for l in slurm.run("squeue", "-h", "-o", "%j %T").stdout.splitlines() if "RUNNING" in l]


def test_live_loop_rides_out_a_controller_restart(slurm, tmp_path):
    """slurmctld goes away for longer than several rounds and comes back: the job keeps running on its
    node the whole time (one launch, every step once), and the outage is two events in the record."""
    import json

    r = SlurmRunner(tmp_path / "work", device="cpu", tag="tctl", ckpt_interval=5)
    loop = one_job_loop(r, tmp_path / "out", "c", iterations=60, interval_s=2, duration_s=200)
    # 15 s: several rounds of the loop
    with WhenRunning(loop, "c", 3, lambda o: controller_outage(slurm, 15)) as done:
        res = loop.run()
    assert done.result, "the controller was never stopped"
    rec = {j["id"]: j for j in res.jobs}["c"]
    assert rec["status"] == "done", rec
    events = [json.loads(line) for line in (tmp_path / "out" / "events.jsonl").read_text().splitlines()]
    kinds = [e["kind"] for e in events]
    assert kinds.count("controller_lost") == 1 and kinds.count("controller_back") == 1, kinds
    assert [e for e in events if e["kind"] == "launch" and e["job"] == "c"].__len__() == 1, kinds
    steps = [e["step"] for e in r.events("c") if e["event"] == "step"]
    assert steps == list(range(1, 61))  # never restarted: no step run twice, none lost


def test_live_loop_keeps_polling_when_the_controller_goes_inside_a_query(slurm, tmp_path):
    """slurmctld stops while the loop is inside a Slurm query that passed its ping (the query would wait
    until the controller is back, the loop blind for the whole outage): the query's timeout ends it, the
    loop keeps polling on what Slurm said last through the outage, the outage is two events, the job
    runs on (one launch, every step once)."""
    import json

    from arena_opt.slurm.commands import SlurmOptions

    timeout_s = 2.0
    r = SlurmRunner(tmp_path / "work", device="cpu", tag="tq", ckpt_interval=5,
                    options=SlurmOptions(query_timeout_s=timeout_s))
    loop = one_job_loop(r, tmp_path / "out", "c", iterations=60, interval_s=2, duration_s=200)
    calls = timed_status(r)
    outage_s = 15.0
    with LoopCommands(slurm) as cmds:
        # the next state query of the launch (status and apply ask it) meets a controller that is gone
        with WhenRunning(loop, "c", 3, lambda o: cmds.arm(f"squeue -h -j {r.slurm_id('c')}", outage_s) or True) as armed:
            res = loop.run()
    assert armed.result and cmds.window, "the controller was never stopped"
    t0, t_down, t_back = cmds.window
    # the query the controller went under: cut at the timeout, not answered when it came back
    a, b = next((a, b) for a, b, cmd in cmds.log if cmd.startswith("squeue -h -j") and a >= t_down)
    assert timeout_s - 0.1 < b - a < timeout_s + 1.0 and b < t_back, (a, b, cmds.window)
    inside = [s for s, d in calls if t_down + timeout_s + 1.0 < s < t_back]
    # polled about once a second after the cut query; 4 is far below that and far above none
    assert len(inside) >= 4, (inside, cmds.window, calls[-40:])
    rec = {j["id"]: j for j in res.jobs}["c"]
    assert rec["status"] == "done", rec
    events = [json.loads(line) for line in (tmp_path / "out" / "events.jsonl").read_text().splitlines()]
    kinds = [e["kind"] for e in events]
    assert kinds.count("controller_lost") == 1 and kinds.count("controller_back") == 1, kinds
    lost = next(e for e in events if e["kind"] == "controller_lost")
    assert "squeue" in lost["details"]["reason"], lost  # found by the query's timeout, not by a ping
    back = next(e for e in events if e["kind"] == "controller_back")
    # from the cut query to the first one answered again
    assert outage_s - timeout_s - 1.0 < back["details"]["outage_s"] < outage_s + 10.0, back
    assert kinds.count("launch") == 1, kinds
    steps = [e["step"] for e in r.events("c") if e["event"] == "step"]
    assert steps == list(range(1, 61))  # never restarted: no step run twice, none lost
