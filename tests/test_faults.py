"""Fault injection on real torchrun jobs (gloo on CPU, tiny models), one runner
and one set of launches for all of it, to stay within CI's budget:

kill -9 of one rank (torchrun restarts the group in place), kill -9 of a
torchrun (the scheduler relaunches), the newest checkpoint deleted and the next
two damaged (a truncated and a zeroed shard: the loader falls back to the
newest intact one), a job directory that cannot be written, hostile ids `a/b`
and `a_b` side by side, and node loss (every process of node n1 killed). Each
step checks the steps lost (at most those since the newest intact
checkpoint), the events written, and that the other jobs kept running."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from arena_opt.decision import Decision, JobDecision
from arena_opt.plan import Plan
from runners import checkpoint as ck
from runners.base import JobSpec
from runners.events import EventLog
from runners.local import LocalRunner
from runners.process import kill_all, pid_alive

pytestmark = pytest.mark.slow
EVERY = 2  # steps between checkpoints


def run(job: str, plan: Plan, node: str, gpus: list[int], action: str = "start") -> Decision:
    return Decision(policy="test", jobs=[JobDecision(job_id=job, action=action, gpu_type="cpu", num_gpus=plan.num_gpus,
                                                     placement={node: gpus}, plan=plan)])


def test_faults_are_contained_recovered_and_reported(tmp_path):
    events_path = tmp_path / "events.jsonl"
    lines: list[str] = []
    r = LocalRunner(tmp_path / "work", device="cpu", ckpt_interval=EVERY, keep_checkpoints=4, max_restarts=1,
                    node_recheck_s=3.0, events=EventLog(events_path, echo=lines.append))

    def st(job):
        return {o.job_id: o for o in r.status()}[job]

    def wait(pred, what, timeout=150.0):
        t0 = time.time()
        while time.time() - t0 < timeout:
            r.status()  # the runner digests progress and exits when asked
            if pred():
                return
            time.sleep(0.2)
        raise AssertionError(f"timed out waiting for {what}; events: {lines}")

    def events(kind=None, job=None):
        recs = [json.loads(x) for x in events_path.read_text().splitlines()]
        return [e for e in recs if (kind is None or e["kind"] == kind) and (job is None or e["job"] == job)]

    try:
        K, O, L = "a/b", "a_b", "l"  # K: the job hit by faults; O beside it on n0; L alone on n1
        for jid in (K, O, L):
            r.add_job(JobSpec(job_id=jid, model="gpt-350M", global_batch=4, total_steps=10_000, step_delay_s=0.3))
        r.apply(run(K, Plan(dp=2), "n0", [0, 1]))
        r.apply(run(O, Plan(), "n0", [2]))
        r.apply(run(L, Plan(), "n1", [0]))
        assert r.jobs[K].root != r.jobs[O].root
        wait(lambda: all(st(j).step >= 1 for j in (O, L)) and (st(K).last_checkpoint_step or 0) >= 2 * EVERY,
             "all three to train")
        o_step = st(O).step

        # 1. kill -9 of one rank: torchrun restarts the worker group in place from the newest checkpoint
        victim = max(r.worker_pids(K))
        os.kill(victim, signal.SIGKILL)
        wait(lambda: events("restart_in_place", K), "an in-place restart")
        ev = events("restart_in_place", K)[0]["details"]
        assert ev["rank"] == 1 and ev["exit_code"] == -signal.SIGKILL
        assert 0 <= ev["steps_lost"] <= EVERY
        assert st(K).state == "running" and st(K).generation == 0 and not pid_alive(victim)

        # 2. kill -9 of torchrun (O still runs on n0: a crash, not a node loss): the scheduler relaunches
        wait(lambda: len(ck.committed(r.jobs[K].ckpt_dir)) == 4, "four checkpoints")
        os.kill(r.jobs[K].handle.procs[0].pid, signal.SIGKILL)
        wait(lambda: st(K).state == "crashed", "crash detection")
        best = st(K).step
        assert not r.down_nodes() and not events("node_lost")
        assert "crashed" in st(K).message and st(K).failures == 1
        crash = [e for e in events("crash", K)][-1]["details"]
        assert crash["exit_codes"] == [-signal.SIGKILL]

        # 3. newest checkpoint deleted, the next truncated, the next zeroed: resume from the fourth
        (s4, p4), (s3, p3), (s2, p2), (s1, _) = ck.committed(r.jobs[K].ckpt_dir)
        import shutil

        shutil.rmtree(p4)
        shard3 = sorted(p3.glob("*.distcp"))[0]
        with open(shard3, "r+b") as f:
            f.truncate(shard3.stat().st_size // 2)
        shard2 = sorted(p2.glob("*.distcp"))[0]
        shard2.write_bytes(b"\0" * shard2.stat().st_size)
        r.apply(run(K, Plan(dp=2), "n0", [0, 1], action="keep"))
        wait(lambda: any(e["details"].get("resumed") for e in events("checkpoint_fallback", K)), "K to resume")
        skipped = [e["details"] for e in events("checkpoint_fallback", K) if "reason" in e["details"]]
        assert [(e["step"], e["reason"].split()[-1]) for e in skipped] == [(s3, "bytes"), (s2, "checksum")] or \
            [e["step"] for e in skipped] == [s3, s2], skipped
        assert shard3.name in skipped[0]["reason"]
        resumed = [e["details"] for e in events("checkpoint_fallback", K) if e["details"].get("resumed")][-1]
        assert resumed["step"] == s1 and resumed["steps_lost"] == best - s1
        # the steps lost are those since the newest intact checkpoint, no more
        assert best - s1 <= (best - s4) + 3 * EVERY
        loaded = [e["step"] for e in r.events(K) if e["event"] == "loaded"]
        assert loaded[-1] == s1 and st(K).last_checkpoint_step >= s1
        assert events("launch", K)[-1]["details"]["relaunch"] is True

        # 4. a job directory that cannot be written: that job fails with its reason, nothing else stops
        r.add_job(JobSpec(job_id="bad", model="gpt-350M", global_batch=4, total_steps=5))
        bad_root = r.jobs["bad"].root
        bad_root.parent.mkdir(parents=True, exist_ok=True)
        bad_root.write_text("not a directory")
        r.apply(run("bad", Plan(), "n1", [1]))
        bad = st("bad")
        assert bad.state == "failed" and str(bad_root) in bad.message, bad.message
        assert events("fail", "bad")
        assert all(st(j).state == "running" for j in (K, O, L))

        # 5. node loss: every process on n1 (L's torchrun and its worker) killed at once
        for pid in [r.jobs[L].handle.procs[0].pid, *r.worker_pids(L)]:
            os.kill(pid, signal.SIGKILL)
        wait(lambda: st(L).state == "crashed", "L's loss")
        assert r.down_nodes() == {"n1"} and events("node_lost")[0]["details"]["node"] == "n1"
        assert st(L).failures == 0 and "lost with node n1" in st(L).message
        l_best = st(L).step
        r.apply(run(L, Plan(), "n1", [0], action="keep"))  # nothing is launched on a node known to be gone
        assert r.jobs[L].handle is None and events("held", L)
        r.apply(run(L, Plan(), "n0", [3], action="start"))  # re-planned elsewhere, from its checkpoint
        wait(lambda: any(e["event"] == "step" and e["generation"] == 1 for e in r.events(L)), "L to resume on n0")
        l_start = [e for e in r.events(L) if e["event"] == "start"][-1]["step"]
        assert 0 <= l_best - l_start <= EVERY + 1
        wait(lambda: not r.down_nodes(), "n1 to come back")
        assert events("node_back")[0]["details"]["node"] == "n1"

        # O ran through all of it, untouched
        o = st(O)
        assert o.state == "running" and o.generation == 0 and o.failures == 0 and o.step > o_step
        assert not [e for e in events(job=O) if e["kind"] not in ("launch",)]
        assert any(line.startswith("[restart_in_place] job a/b:") for line in lines)
    finally:
        r.shutdown(save=False)
        kill_all()
