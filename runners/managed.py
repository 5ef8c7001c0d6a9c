"""Job life cycle shared by the backends that really run jobs (local, agents):
decisions become launches and save-and-exit requests, progress files become
observed state, exits become finished / stopped / crashed / failed.

A reshape, migration or preemption is always: stop request -> every rank saves
a sharded checkpoint and exits -> (for reshape/migrate) a new launch with the
new plan and placement that loads the checkpoint, resharding it. A crashed job
(a launch that exited without its `exit` event) is relaunched from its last
checkpoint by the next decision that keeps it running; after `max_failures`
crashes without a new checkpoint in between, it is marked failed.
"""

from __future__ import annotations

import abc
import re
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

from arena_opt.decision import Decision, JobDecision
from arena_opt.plan import Plan
from models.catalog import Arch
from runners.base import JobSpec, JobState, Measurement, ObservedJob, Runner, RunnerError
from runners.progress import ProgressReader, clear_stop, request_stop
from runners.spec import TrainSpec, resolve_arch
from arena_opt.stages import check_plan, scale_plan

_SAFE = re.compile(r"[^A-Za-z0-9_.-]")


class LaunchError(RuntimeError):
    """The backend could not start a launch (agent unreachable, node unknown)."""


class LaunchHandle(abc.ABC):
    """The processes of one launch of a job (one torchrun per node)."""

    log_paths: list[str]

    @abc.abstractmethod
    def poll(self) -> list[int | None]:
        """Exit code per node, None while running."""

    @abc.abstractmethod
    def terminate(self, timeout: float) -> None:
        """SIGTERM then SIGKILL every process of the launch; returns when all are gone."""

    @abc.abstractmethod
    def kill(self) -> None:
        """SIGKILL every process of the launch at once (no chance to save); returns when all are gone."""


@dataclass
class _Job:
    spec: JobSpec
    root: Path
    state: JobState = "pending"
    generation: int = 0  # of the next launch
    handle: LaunchHandle | None = None
    gpu_type: str | None = None
    placement: dict[str, list[int]] = field(default_factory=dict)
    plan: Plan | None = None
    reader: ProgressReader | None = None
    failures: int = 0
    ckpt_step: int | None = None
    message: str | None = None
    window: list[float] = field(default_factory=list)
    seen_steps: int = 0  # step events of the current launch already looked at
    log_paths: list[str] = field(default_factory=list)
    timeline: list[tuple[str, float]] = field(default_factory=list)  # runner-side moments (launch, stop, exited)

    @property
    def run_dir(self) -> Path:
        return self.root / "run"

    @property
    def ckpt_dir(self) -> Path:
        return self.root / "ckpt"


class ManagedRunner(Runner):
    def __init__(self, workdir: str | Path, *, device: str = "auto", ckpt_interval: int = 0,
                 max_failures: int = 3, stop_timeout_s: float = 120.0, measure_window: int = 5) -> None:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.device = device
        self.ckpt_interval = ckpt_interval
        self.max_failures = max_failures
        self.stop_timeout_s = stop_timeout_s
        self.measure_window = measure_window
        self.jobs: dict[str, _Job] = {}
        self._measured: list[Measurement] = []
        self._measure_log = self.workdir / "measurements.jsonl"

    # ------------------------------------------------------------------ backend hooks

    @abc.abstractmethod
    def _start(self, job: _Job, spec: TrainSpec, placement: dict[str, list[int]]) -> LaunchHandle: ...

    # ------------------------------------------------------------------ Runner API

    def add_job(self, job: JobSpec) -> None:
        if job.job_id in self.jobs:
            raise RunnerError(f"job {job.job_id!r} was already added")
        root = job_root(self.workdir, job.job_id)
        self.jobs[job.job_id] = _Job(job, root, reader=ProgressReader(root / "run"))

    def apply(self, decision: Decision) -> None:
        self._refresh()
        to_stop: list[_Job] = []
        to_launch: list[tuple[_Job, JobDecision, TrainSpec]] = []
        for jd in decision.jobs:
            j = self.jobs.get(jd.job_id)
            if j is None:
                raise RunnerError(f"decision names job {jd.job_id!r} that the runner does not know")
            if j.state in ("finished", "failed"):
                continue
            if jd.runs:
                self._check(jd)
                if j.state == "running" and (jd.gpu_type, jd.placement, jd.plan) == (j.gpu_type, j.placement, j.plan):
                    continue
                assert jd.plan is not None
                try:
                    spec = self._spec(j, jd.plan)
                except ValueError as e:
                    # checked before stopping anything: a running job keeps its current plan
                    self._reject(j, f"plan {jd.plan.describe()} cannot run {j.spec.job_id}: {e}")
                    continue
                if j.state == "running":
                    to_stop.append(j)
                to_launch.append((j, jd, spec))
            elif j.state == "running":
                to_stop.append(j)
        self._stop_many(to_stop)
        for j, jd, spec in to_launch:
            if j.state not in ("finished", "failed"):
                self._launch(j, jd, spec)

    def status(self) -> list[ObservedJob]:
        self._refresh()
        return [self._observe(j) for j in self.jobs.values()]

    def stop(self, job_id: str, save: bool = True) -> None:
        j = self.jobs.get(job_id)
        if j is None:
            raise RunnerError(f"unknown job {job_id!r}")
        self._refresh()
        if j.state != "running":
            return
        if save:
            self._stop_many([j])
        else:
            assert j.handle is not None
            j.handle.kill()
            self._settle(j, stopping=True)

    def measurements(self) -> list[Measurement]:
        self._refresh()
        out, self._measured = self._measured, []
        return out

    def shutdown(self, save: bool = True, timeout_s: float | None = None) -> None:
        """Stop all jobs (saving a checkpoint unless save=False), killing what does not exit in time."""
        running = [j for j in self.jobs.values() if j.handle is not None]
        if save:
            self._stop_many(running, timeout_s)
        for j in running:
            if j.handle is not None:
                j.handle.terminate(timeout=5.0)
                self._settle(j, stopping=True)

    # ------------------------------------------------------------------ internals

    @staticmethod
    def _check(jd: JobDecision) -> None:
        if jd.plan is None or not jd.placement:
            raise RunnerError(f"decision for job {jd.job_id!r} ({jd.action}) has no plan or placement")
        n = sum(len(g) for g in jd.placement.values())
        if n != jd.plan.num_gpus:
            raise RunnerError(f"decision for job {jd.job_id!r}: placement holds {n} GPUs, plan "
                              f"{jd.plan.describe()} needs {jd.plan.num_gpus}")

    def _spec(self, j: _Job, plan: Plan) -> TrainSpec:
        return make_train_spec(j.spec, plan, j.root, self.ckpt_interval, j.generation, self.device)

    def _launch(self, j: _Job, jd: JobDecision, spec: TrainSpec) -> None:
        spec = spec.model_copy(update={"generation": j.generation})
        clear_stop(j.run_dir)
        j.run_dir.mkdir(parents=True, exist_ok=True)
        j.timeline.append(("launch", time.time()))
        try:
            j.handle = self._start(j, spec, jd.placement)
        except LaunchError as e:
            j.failures += 1
            j.state = "failed" if j.failures >= self.max_failures else "crashed"
            j.message = f"launch {j.generation} could not start: {e}"
            j.generation += 1
            return
        j.log_paths = list(j.handle.log_paths)
        j.generation += 1
        j.state = "running"
        j.gpu_type, j.placement, j.plan = jd.gpu_type, dict(jd.placement), jd.plan
        j.message = None
        j.window, j.seen_steps = [], 0

    def _reject(self, j: _Job, msg: str) -> None:
        if j.state == "running":
            j.message = msg  # it goes on with the plan it has
            return
        j.failures += 1
        if j.failures >= self.max_failures:
            j.state, j.message = "failed", f"{msg} (rejected {j.failures} times)"
        else:
            j.message = msg

    def _stop_many(self, jobs: list[_Job], timeout_s: float | None = None) -> None:
        jobs = [j for j in jobs if j.handle is not None]
        for j in jobs:
            request_stop(j.run_dir)
            j.state = "stopping"
            j.timeline.append(("stop", time.time()))
        deadline = time.time() + (self.stop_timeout_s if timeout_s is None else timeout_s)
        pending = list(jobs)
        while pending and time.time() < deadline:
            pending = [j for j in pending if any(rc is None for rc in j.handle.poll())]  # type: ignore[union-attr]
            if pending:
                time.sleep(0.1)
        for j in jobs:
            if j in pending:
                j.handle.terminate(timeout=10.0)  # type: ignore[union-attr]
            self._settle(j, stopping=True)

    def _refresh(self) -> None:
        for j in self.jobs.values():
            if j.handle is None:
                continue
            assert j.reader is not None
            p = j.reader.poll()
            if p.last_checkpoint_step is not None and (j.ckpt_step is None or p.last_checkpoint_step > j.ckpt_step):
                j.ckpt_step = p.last_checkpoint_step
                j.failures = 0  # progress was made and kept
            self._collect_measurements(j)
            rcs = j.handle.poll()
            if all(rc is not None for rc in rcs):
                self._settle(j, stopping=False)
            elif any(rc not in (None, 0) for rc in rcs):
                # one node's torchrun failed: the others cannot go on without its ranks
                j.handle.terminate(timeout=10.0)
                self._settle(j, stopping=False)

    def _settle(self, j: _Job, stopping: bool) -> None:
        """The launch is over: decide what it was from its exit codes and progress events."""
        assert j.handle is not None and j.reader is not None
        j.handle.terminate(timeout=5.0)  # a no-op for a clean exit; reaps stray workers of a crash
        rcs = j.handle.poll()
        j.timeline.append(("exited", time.time()))
        p = j.reader.poll()
        self._collect_measurements(j, flush=True)
        gen = j.generation - 1
        current = p.generation == gen
        if p.last_checkpoint_step is not None and (j.ckpt_step is None or p.last_checkpoint_step > j.ckpt_step):
            j.ckpt_step = p.last_checkpoint_step
            j.failures = 0  # progress was made and kept
        logs = ", ".join(j.handle.log_paths)
        j.handle = None
        if current and p.exit_reason == "finished":
            j.state, j.message = "finished", None
        elif current and p.exit_reason == "stopped" and all(rc == 0 for rc in rcs):
            j.state, j.message = "stopped", None
        elif current and p.error:
            # a plan the model cannot run fails the same way every time: do not retry
            j.state, j.message = "failed", f"{p.error} (log: {logs})"
        elif stopping and all(rc == 0 for rc in rcs):
            j.state, j.message = "stopped", None
        else:
            j.failures += 1
            what = "was stopped without saving" if stopping else "crashed"
            msg = f"launch {gen} {what} (exit codes {rcs}); restarts from step {j.ckpt_step or 0}; log: {logs}"
            if j.failures >= self.max_failures:
                j.state, j.message = "failed", f"failed {j.failures} times in a row; last: {msg}"
            else:
                j.state, j.message = "crashed", msg

    def _collect_measurements(self, j: _Job, flush: bool = False) -> None:
        assert j.reader is not None
        p = j.reader.state
        if p.generation != j.generation - 1:
            return  # the current launch has not reported yet
        new = p.iter_times[max(j.seen_steps, 1):]  # the first step of a launch includes warm-up
        j.seen_steps = len(p.iter_times)
        j.window.extend(new)
        if j.window and (len(j.window) >= self.measure_window or flush) and j.plan and j.gpu_type:
            m = Measurement(job_id=j.spec.job_id, model=_model_name(j.spec.model), arch=_arch_name(j),
                            gpu_type=j.gpu_type, num_gpus=j.plan.num_gpus, plan=j.plan,
                            global_batch=j.spec.global_batch, iter_time_s=statistics.median(j.window),
                            steps=len(j.window), time=time.time())
            self._measured.append(m)
            with open(self._measure_log, "a") as f:
                f.write(m.model_dump_json() + "\n")
            j.window = []

    def _observe(self, j: _Job) -> ObservedJob:
        assert j.reader is not None
        p = j.reader.state
        cur = p.iter_times if p.generation == j.generation - 1 else []
        recent = cur[1:][-20:] or cur
        it = statistics.median(recent) if recent else None
        return ObservedJob(
            job_id=j.spec.job_id, state=j.state, step=p.step, total_steps=j.spec.total_steps, loss=p.loss,
            iter_time_s=it, samples_per_s=(j.spec.global_batch / it) if it else None,
            peak_mem_gib=(p.peak_mem_bytes / 2**30) if p.peak_mem_bytes else None,
            gpu_type=j.gpu_type, num_gpus=j.plan.num_gpus if j.plan else 0, placement=j.placement, plan=j.plan,
            generation=max(0, j.generation - 1), failures=j.failures, last_checkpoint_step=j.ckpt_step,
            log_path=j.log_paths[0] if j.log_paths else None,
            message=j.message)

    @staticmethod
    def log_path(j: _Job, generation: int, node: str) -> Path:
        return j.root / "logs" / f"g{generation}-{_SAFE.sub('_', node)}.log"

    def losses(self, job_id: str) -> dict[int, float]:
        """Loss by step as reported (the last report wins when steps are repeated after a crash)."""
        j = self.jobs[job_id]
        assert j.reader is not None
        j.reader.poll()
        return dict(j.reader.state.losses)

    def timeline(self, job_id: str) -> list[tuple[str, float]]:
        """Runner-side moments of a job: ("launch" | "stop" | "exited", wall time)."""
        return list(self.jobs[job_id].timeline)

    def events(self, job_id: str) -> list[dict]:
        j = self.jobs[job_id]
        assert j.reader is not None
        j.reader.poll()
        return list(j.reader.state.events)


def job_root(workdir: str | Path, job_id: str) -> Path:
    return Path(workdir) / "jobs" / _SAFE.sub("_", job_id)


def make_train_spec(s: JobSpec, plan: Plan, root: Path, ckpt_interval: int, generation: int,
                    device: str = "auto") -> TrainSpec:
    """The launch spec of a job under a decided plan; raises PlanError / ValueError when the
    plan cannot run the job's model."""
    full = resolve_arch(s.model, None)
    arch = resolve_arch(s.model, s.scale)
    plan = scale_plan(plan, full, arch)
    check_plan(arch, plan)
    return TrainSpec(job_id=s.job_id, model=s.model, scale=s.scale, plan=plan, global_batch=s.global_batch,
                     total_steps=s.total_steps, lr=s.lr, seed=s.seed, dp_mode=s.dp_mode, device=device,  # type: ignore[arg-type]
                     run_dir=str(root / "run"), ckpt_dir=str(root / "ckpt"), ckpt_interval=ckpt_interval,
                     generation=generation, step_delay_s=s.step_delay_s, fail_at_step=s.fail_at_step,
                     fail_rank=s.fail_rank)


def _model_name(model: str | Arch) -> str:
    return model if isinstance(model, str) else model.name


def _arch_name(j: _Job) -> str:
    return resolve_arch(j.spec.model, j.spec.scale).name
