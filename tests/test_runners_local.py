"""Real torchrun jobs on this host (gloo, 1-4 processes, tiny models): launch and
progress, every plan mode, reshape across world sizes and plans, crash recovery,
repeated failure and clean shutdown.

Loss tolerance. Every plan computes the same mean gradient over the same global
batch and the same AdamW update; only the order of floating-point reductions
differs (all-reduce, sharded matmuls, micro-batch accumulation). Measured
across all plans here the losses agree with the single-process reference to
~1e-5 after 9 steps. A restart that lost the Adam moments moves the loss by
~1e-2 within two steps (the negative control below checks this on the same
run), and a repeated or skipped step by the per-step loss change (>= 2e-2).
TOL = 1e-3 sits two orders of magnitude above the noise and an order below
the smallest error it must catch.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from arena_opt.decision import Decision, JobDecision
from arena_opt.plan import Plan
from runners.base import JobSpec
from runners.local import LocalRunner
from runners.managed import job_root
from runners.process import kill_all, pid_alive
from runners.reference import reference_losses
from runners.spec import resolve_arch
from tests.runner_status import wait_for_status

pytestmark = pytest.mark.slow
TOL = 1e-3


@pytest.fixture
def runner(tmp_path):
    r = LocalRunner(tmp_path / "work", device="cpu", stop_timeout_s=90)
    try:
        yield r
    finally:
        r.shutdown(save=False)
        kill_all()


def decide(job: str, action: str, plan: Plan | None = None, nodes: dict[str, int] | None = None) -> Decision:
    if plan is None:
        return Decision(policy="test", jobs=[JobDecision(job_id=job, action=action)])
    nodes = nodes or {"n0": plan.num_gpus}
    placement = {n: list(range(k)) for n, k in nodes.items()}
    return Decision(policy="test", jobs=[JobDecision(job_id=job, action=action, gpu_type="cpu",
                                                     num_gpus=plan.num_gpus, placement=placement, plan=plan)])


def wait(r: LocalRunner, job: str, pred, timeout: float = 150.0, what: str = ""):
    return wait_for_status(r, job, pred, timeout, what)


def reference(spec: JobSpec, steps: int, chunks: int = 1, **kw) -> list[float]:
    return reference_losses(resolve_arch(spec.model, spec.scale), steps, spec.global_batch, seed=spec.seed,
                            lr=spec.lr, chunks=chunks, **kw)


def assert_losses(got: dict[int, float], ref: list[float]) -> None:
    assert sorted(got) == list(range(1, len(ref) + 1)), f"missing or extra steps: {sorted(got)}"
    worst = max(abs(got[s] - ref[s - 1]) for s in got)
    assert worst < TOL, f"max |loss - reference| = {worst:.2e}: {got} vs {ref}"


# Plan modes not already run by the reshape (DDP dp4, TP, FSDP2 x PP) and crash (DDP) tests:
# (model, plan, chunks of the global batch the reference must use)
PLAN_MODES = [
    # FSDP2 x TP on GQA attention and SwiGLU, with gradient accumulation over 2 micro-batches
    pytest.param("llama-70B", Plan(dp=2, tp=2, num_microbatches=2), 1, id="dp2xtp2-fsdp2-gqa-swiglu"),
    # 1F1B x TP on MoE experts, with the catalog model's stage split carried onto the scaled one
    pytest.param("moe-690M", Plan(pp=2, tp=2, num_microbatches=2, stages=[(0, 10), (10, 10 + 16)]), 1,
                 id="pp2xtp2-moe"),
]


@pytest.mark.parametrize("model,plan,chunks", PLAN_MODES)
def test_plan_modes_train_like_one_process(runner, model, plan, chunks):
    spec = JobSpec(job_id="j", model=model, global_batch=8, total_steps=3)
    runner.add_job(spec)
    runner.apply(decide("j", "start", plan))
    st = wait(runner, "j", lambda s: s.state != "running", what="job to finish")
    assert st.state == "finished", st.message
    assert_losses(runner.losses("j"), reference(spec, 3, chunks))


def test_reshape_4_2_4_dp_tp_pp_keeps_training_state(runner):
    spec = JobSpec(job_id="r", model="gpt-350M", global_batch=8, total_steps=9, step_delay_s=0.3)
    runner.add_job(spec)
    runner.apply(decide("r", "start", Plan(dp=4)))
    wait(runner, "r", lambda s: s.step >= 2, what="step 2 under dp4")
    runner.apply(decide("r", "reshape", Plan(tp=2)))
    wait(runner, "r", lambda s: s.generation == 1 and s.step >= 5 or s.state != "running", what="steps under tp2")
    runner.apply(decide("r", "reshape", Plan(pp=2, dp=2, num_microbatches=2)))
    st = wait(runner, "r", lambda s: s.state != "running", what="job to finish")
    assert st.state == "finished", st.message
    events = runner.events("r")
    saved = [e["step"] for e in events if e["event"] == "checkpoint"]
    loaded = [e["step"] for e in events if e["event"] == "loaded"]
    starts = [(e["world_size"], e["step"]) for e in events if e["event"] == "start"]
    assert len(saved) == 2 and loaded == saved, (saved, loaded)
    assert starts == [(4, 0), (2, saved[0]), (4, saved[1])]
    # every step reported exactly once, in order: no step lost or repeated across the reshapes
    assert [e["step"] for e in events if e["event"] == "step"] == list(range(1, 10))
    got = runner.losses("r")
    assert_losses(got, reference(spec, 9))
    # negative control: an optimizer state lost at the first reshape would be caught
    lost = reference(spec, 9, reset_optimizer_at=saved[0])
    assert max(abs(got[s] - lost[s - 1]) for s in got) > 5 * TOL


def test_launch_progress_worker_crash_and_restart_from_checkpoint(tmp_path):
    # no in-place restart: this is the scheduler's relaunch (the second line; tests/test_faults.py has the first)
    r = LocalRunner(tmp_path / "work", device="cpu", ckpt_interval=2, max_failures=3, max_restarts=0)
    try:
        # wide-resnet under DDP: convolutions, and BatchNorm statistics per data-parallel shard
        spec = JobSpec(job_id="c", model="wide_resnet-1B", global_batch=8, total_steps=8, step_delay_s=0.4)
        r.add_job(spec)
        r.apply(decide("c", "start", Plan(dp=2)))
        st = wait(r, "c", lambda s: (s.last_checkpoint_step or 0) >= 2, what="first checkpoint")
        # progress as the scheduler sees it
        assert st.state == "running" and st.num_gpus == 2 and st.plan == Plan(dp=2) and st.generation == 0
        assert st.iter_time_s and st.iter_time_s > 0 and st.samples_per_s and st.peak_mem_gib > 0.01
        start = next(e for e in r.events("c") if e["event"] == "start")
        assert start["world_size"] == 2 and start["step"] == 0
        # kill one training process
        workers = r.worker_pids("c")
        assert len(workers) == 2
        os.kill(max(workers), signal.SIGKILL)
        st = wait(r, "c", lambda s: s.state != "running", timeout=60, what="crash detection")
        assert st.state == "crashed" and st.failures == 1
        assert "crashed" in st.message and st.log_path and os.path.exists(st.log_path)
        ckpt = st.last_checkpoint_step
        lost = st.step - ckpt
        assert 0 <= lost <= 2, f"lost {lost} steps with a checkpoint every 2"
        assert not any(pid_alive(p) for p in workers)
        # the next round keeps the job: it restarts from its checkpoint
        r.apply(decide("c", "keep", Plan(dp=2)))
        st = wait(r, "c", lambda s: s.state != "running", what="job to finish")
        assert st.state == "finished" and st.step == 8, st.message
        events = r.events("c")
        assert [e["step"] for e in events if e["event"] == "loaded"] == [ckpt]
        assert [e["step"] for e in events if e["event"] == "step" and e["generation"] == 1] == list(range(ckpt + 1, 9))
        assert events[-1]["event"] == "exit" and events[-1]["reason"] == "finished"
        assert_losses(r.losses("c"), reference(spec, 8, chunks=2))
        # measured iteration times for the estimator, first step of each launch (warm-up) left out
        ms = r.measurements()
        assert ms and all(m.model == "wide_resnet-1B" and m.gpu_type == "cpu" and m.num_gpus == 2 for m in ms)
        assert sum(m.steps for m in ms) == 8 + lost - 2
        assert (r.workdir / "measurements.jsonl").read_text().count("\n") == len(ms)
    finally:
        r.shutdown(save=False)
        kill_all()


def test_job_that_keeps_failing_is_marked_failed(tmp_path):
    r = LocalRunner(tmp_path / "work", device="cpu", max_failures=2, max_restarts=0)
    try:
        r.add_job(JobSpec(job_id="f", model="gpt-350M", global_batch=4, total_steps=5, fail_at_step=0))
        for _ in range(3):
            r.apply(decide("f", "keep", Plan()))
            st = wait(r, "f", lambda s: s.state != "running", timeout=90, what="launch to end")
        assert st.state == "failed" and st.failures == 2 and st.generation == 1
        assert "failed 2 times" in st.message and st.log_path in st.message
        assert "injected fault" in open(st.log_path).read()
        # a plan the model cannot run is refused before anything starts
        r.add_job(JobSpec(job_id="w", model="wide_resnet-1B", global_batch=4, total_steps=2))
        r.apply(decide("w", "start", Plan(tp=2)))
        st = {o.job_id: o for o in r.status()}["w"]
        assert st.state == "pending" and "tensor parallelism" in st.message and r.jobs["w"].handle is None
    finally:
        r.shutdown(save=False)
        kill_all()


def test_preempt_saves_and_shutdown_leaves_nothing_running(runner):
    for jid, plan in (("a", Plan()), ("b", Plan(dp=2)), ("c", Plan())):
        runner.add_job(JobSpec(job_id=jid, model="gpt-350M", global_batch=4, total_steps=1000, step_delay_s=0.2))
        runner.apply(decide(jid, "start", plan))
    for jid in ("a", "b", "c"):
        wait(runner, jid, lambda s: s.step >= 1, what=f"{jid} to train")
    # SIGKILL of torchrun: its workers die with it (PR_SET_PDEATHSIG), without the runner's help
    b_workers = runner.worker_pids("b")
    assert len(b_workers) == 2
    os.kill(runner.jobs["b"].handle.procs[0].pid, signal.SIGKILL)
    deadline = time.time() + 20
    while time.time() < deadline and any(pid_alive(p) for p in b_workers):
        time.sleep(0.1)
    assert not any(pid_alive(p) for p in b_workers)
    assert wait(runner, "b", lambda s: s.state != "running", what="crash detection").state == "crashed"
    # preempt = save and stop
    a_pids = runner.worker_pids("a") + [runner.jobs["a"].handle.procs[0].pid]
    assert len(a_pids) == 2
    runner.apply(decide("a", "preempt"))
    a = {o.job_id: o for o in runner.status()}["a"]
    assert a.state == "stopped" and a.last_checkpoint_step == a.step >= 1
    assert not [p for p in a_pids if pid_alive(p)]
    assert (runner.jobs["a"].ckpt_dir / "latest").exists()
    # and shutdown stops (saving) whatever still runs; nothing is left
    c_pids = runner.worker_pids("c") + [runner.jobs["c"].handle.procs[0].pid]
    runner.shutdown()
    assert not [p for p in c_pids if pid_alive(p)]
    c = {o.job_id: o for o in runner.status()}["c"]
    assert c.state == "stopped" and c.last_checkpoint_step == c.step >= 1


def test_per_stage_plans_train_like_the_uniform_plan_and_reshape_through_checkpoints(runner):
    # dp2 -> dp1 stages (3 processes), then the uniform pp2 plan (2), then tp2 -> dp2 stages (4): each
    # launch loads the previous one's checkpoint, and every step's loss is the uniform plans' one
    spec = JobSpec(job_id="s", model="gpt-350M", global_batch=8, total_steps=6, step_delay_s=0.3)
    runner.add_job(spec)
    runner.apply(decide("s", "start", Plan(pp=2, num_microbatches=2, stage_shapes=[(2, 1), (1, 1)])))
    wait(runner, "s", lambda s: s.step >= 2 or s.state != "running", what="step 2 under [dp2, dp1]")
    runner.apply(decide("s", "reshape", Plan(pp=2, num_microbatches=2)))
    wait(runner, "s", lambda s: s.generation == 1 and s.step >= 4 or s.state != "running", what="steps under pp2")
    runner.apply(decide("s", "reshape", Plan(pp=2, num_microbatches=2, stage_shapes=[(1, 2), (2, 1)])))
    st = wait(runner, "s", lambda s: s.state != "running", what="job to finish")
    assert st.state == "finished", st.message
    events = runner.events("s")
    saved = [e["step"] for e in events if e["event"] == "checkpoint"]
    starts = [(e["world_size"], e["step"]) for e in events if e["event"] == "start"]
    assert [w for w, _ in starts] == [3, 2, 4] and [s for _, s in starts[1:]] == saved[:2], (starts, saved)
    assert [e["step"] for e in events if e["event"] == "step"] == list(range(1, 7))
    assert_losses(runner.losses("s"), reference(spec, 6))


def test_runner_started_again_on_its_work_directory_numbers_launches_on(tmp_path):
    # an operator stops the runner (the job saves) and starts a new one on the same directory: the job
    # resumes from its checkpoint as the next generation, and the first launch's logs and record stay as they were
    work = tmp_path / "work"
    spec = JobSpec(job_id="a", model="gpt-350M", global_batch=4, total_steps=6, step_delay_s=0.3)
    r = LocalRunner(work, device="cpu", ckpt_interval=2)
    try:
        r.add_job(spec)
        r.apply(decide("a", "start", Plan()))
        wait(r, "a", lambda s: (s.last_checkpoint_step or 0) >= 2, what="first checkpoint")
    finally:
        r.shutdown(save=True)
        kill_all()
    saved = max(e["step"] for e in r.events("a") if e["event"] == "checkpoint")
    logs = job_root(work, "a") / "logs"
    first = {p.name: p.read_bytes() for p in logs.iterdir() if p.is_file()}
    assert "g0.launch.json" in first and not any(n.startswith("g1") for n in first)
    r2 = LocalRunner(work, device="cpu", ckpt_interval=2)
    try:
        r2.add_job(spec)
        r2.apply(decide("a", "start", Plan()))
        st = wait(r2, "a", lambda s: s.state != "running", what="job to finish")
        assert st.state == "finished" and st.step == 6 and st.generation == 1, st.message
        after = {p.name: p.read_bytes() for p in logs.iterdir() if p.is_file()}
        assert {n: after[n] for n in first} == first, "the first launch's files were overwritten"
        assert "g1.launch.json" in after
        events = r2.events("a")
        assert [e["step"] for e in events if e["event"] == "loaded"] == [saved]
        assert [e["step"] for e in events if e["event"] == "step" and e["generation"] == 1] == \
            list(range(saved + 1, 7))
        assert_losses(r2.losses("a"), reference(spec, 6))
    finally:
        r2.shutdown(save=False)
        kill_all()
