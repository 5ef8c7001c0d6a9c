"""The live loop: the arena policy on the wall clock driving real jobs on this
host, a node that leaves, measured iteration times feeding the estimator, the
simulator's metrics written from the measured run, and `arena-opt run`
stopped with Ctrl-C leaving nothing behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from arena_opt.policies import make_policy
from arena_opt.cluster import load_cluster
from arena_opt.trace import TraceJob
from runners.live import LiveLoop, LiveOptions
from runners.local import LocalRunner
from runners.managed import job_root
from runners.process import descendants, kill_all, pid_alive

pytestmark = pytest.mark.slow
RUNTIME_TRACE = Path(__file__).resolve().parents[2] / "shared" / "data" / "arena" / "traces" / "runtime_trace.csv"


def _arena_policy():
    from arena_opt.milp.options import ArenaOptions
    from arena_opt.reconfig import ReconfigModel

    # horizon 4 x the restart time, as `arena-opt run` sets it (a shorter one makes no start worth it)
    return make_policy("arena", ArenaOptions(time_limit_s=5, threads=1, horizon_s=60.0,
                                             reconfig=ReconfigModel(restart_s=15, storage_gbs_per_gpu=1e3)))


def test_live_loop_replans_jobs_of_a_lost_node_and_measures(tmp_path):
    cluster = load_cluster("a10:2x1")  # nodes a10-000 and a10-001, one "GPU" (process) each
    trace = [TraceJob(id=j, submit_time=0, model="gpt-350M", batch_size=64, iterations=200, num_gpus=1, gpu_type="a10")
             for j in ("A", "B")]
    opts = LiveOptions(interval_s=4.0, time_scale=1.0, iter_scale=10, batch_divisor=8, step_delay_s=0.5)
    runner = LocalRunner(tmp_path / "work", device="cpu", ckpt_interval=2)
    policy = _arena_policy()
    lines: list[str] = []
    loop = LiveLoop(cluster, trace, runner, policy, opts, tmp_path / "out", log=lines.append)
    result: list = []
    th = threading.Thread(target=lambda: result.append(loop.run()), daemon=True)
    th.start()
    try:
        # the node leaves once the job on it has a checkpoint (the launch time on a busy host varies)
        lost = None
        deadline = time.time() + 150
        while time.time() < deadline and th.is_alive():
            if lost is None and (tmp_path / "out" / "decisions.jsonl").exists():
                first = json.loads((tmp_path / "out" / "decisions.jsonl").read_text().splitlines()[0])["decision"]
                lost = next((j["job_id"] for j in first["jobs"] if "a10-000" in j["placement"]), None)
            prog = job_root(tmp_path / "work", str(lost)) / "run" / "progress.jsonl"
            if lost and prog.exists() and '"event":"checkpoint"' in prog.read_text():
                removed_at = loop.now()
                loop.remove_node("a10-000")
                break
            time.sleep(0.2)
        else:
            raise AssertionError(f"the job on a10-000 never checkpointed: {lines}")
        th.join(240)
        assert not th.is_alive()
    finally:
        if th.is_alive():
            runner.shutdown(save=False)
        kill_all()
    res = result[0]
    decisions = [json.loads(x) for x in (tmp_path / "out" / "decisions.jsonl").read_text().splitlines()]
    first = {d["job_id"]: d for d in decisions[0]["decision"]["jobs"]}
    assert {first["A"]["action"], first["B"]["action"]} == {"start"}
    # after the node left, nothing is placed on it and the lost job is started again elsewhere
    later = [d for d in decisions if d["t"] >= removed_at]
    assert all("a10-000" not in jd["placement"] for d in later for jd in d["decision"]["jobs"])
    assert any(jd["job_id"] == lost and jd["action"] == "start" for d in later for jd in d["decision"]["jobs"])
    m = res.metrics
    assert m["finished"] == 2 and m["failed"] == 0 and not m["stalled"], lines
    rec = {r["id"]: r for r in res.jobs}
    assert rec[lost]["starts"] == 2 and rec[lost]["reconfigs"] >= 1
    events = runner.events(lost)
    gen0 = [e for e in events if e["generation"] == 0]
    assert not any(e["event"] == "exit" for e in gen0)  # killed with its node, no orderly exit
    saved = [e["step"] for e in gen0 if e["event"] == "checkpoint"]
    loaded = [e["step"] for e in events if e["event"] == "loaded"]
    # resumed from its last periodic checkpoint (every 2 steps): nothing was saved when the node died
    assert saved and loaded == saved[-1:] and all(s % 2 == 0 for s in saved)
    lost_steps = max(e["step"] for e in gen0 if e["event"] == "step") - loaded[0]
    assert 0 <= lost_steps <= 2 + 8  # the checkpoint interval + steps run before the next round acted
    # the estimator now knows the measured speed of gpt-350M on "a10" (this host)
    factor = policy.estimator.correction[("gpt-350M", "a10")]
    assert factor != 1.0
    assert json.loads((tmp_path / "out" / "corrections.json").read_text())["gpt-350M|a10"] == factor
    on_disk = json.loads((tmp_path / "out" / "metrics.json").read_text())
    for key in ("avg_jct_s", "makespan_s", "avg_throughput", "gpu_util", "deadline_satisfaction"):
        assert key in on_disk
    assert 0 < on_disk["gpu_util"] <= 1 and on_disk["avg_jct_s"] > 0
    assert (runner.workdir / "measurements.jsonl").exists()


@pytest.mark.shared_data
def test_ctrl_c_stops_arena_opt_run_and_everything_it_started(tmp_path):
    if not RUNTIME_TRACE.is_file():
        pytest.skip(f"{RUNTIME_TRACE} not found")
    cmd = [sys.executable, "-m", "arena_opt.cli", "run", "--trace", str(RUNTIME_TRACE), "--cluster", "a10:1x2,a40:1x2",
           "--backend", "local", "--max-jobs", "3", "--interval", "5", "--batch-divisor", "16", "--device", "cpu",
           "--workdir", str(tmp_path / "work"), "--out", str(tmp_path / "out"), "--time-limit", "5"]
    # SIGINT as at a terminal: a shell without job control starts background commands with SIGINT
    # ignored, which their children (this test's pytest, then arena-opt) inherit (a CI-like run got exit 0)
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         cwd=Path(__file__).resolve().parents[1],
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        seen: set[int] = set()
        t0 = time.time()
        out = []
        # wait until training processes run, remembering every process the run started
        while time.time() - t0 < 120:
            seen.update(descendants(p.pid))
            progress = list((tmp_path / "work").glob("jobs/*/run/progress.jsonl"))
            if any('"event":"step"' in f.read_text() for f in progress):
                break
            time.sleep(0.3)
        else:
            raise AssertionError("no job trained within 120 s")
        seen.update(descendants(p.pid))
        assert len(seen) >= 2  # torchrun and at least one worker
        p.send_signal(signal.SIGINT)
        out.append(p.communicate(timeout=120)[0])
    finally:
        if p.poll() is None:
            p.kill()
        kill_all()
    assert p.returncode == 130, out
    left = [q for q in seen if pid_alive(q)]
    assert not left, f"processes left after Ctrl-C: {left}"
    # the jobs that were running saved their state on the way out
    assert list((tmp_path / "work").glob("jobs/*/ckpt/latest"))
    assert os.path.exists(tmp_path / "out" / "decisions.jsonl")
