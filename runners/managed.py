"""Job life cycle shared by every backend that really runs jobs (local,
Slurm): decisions become launches and save-and-exit requests, progress files
become observed state, exits become finished / stopped / crashed / failed, and
the fault handling below applies to all of them.

A reshape, migration or preemption is always: stop request -> every rank saves
a sharded checkpoint and exits -> (for reshape/migrate) a new launch with the
new plan and placement that loads the checkpoint, resharding it.

Faults, in the order they are met:
- a worker dies: torchrun restarts the worker group in place (`max_restarts`),
  which resumes from the newest intact checkpoint within seconds;
- torchrun gives up or dies: the launch crashed; the next decision that keeps
  the job running relaunches it, the second and later relaunches after a
  backoff that doubles; after `max_failures` crashes in a row without progress
  (a step beyond the best the job ever reported) the job is failed;
- a node vanishes (its processes gone without an exit status, or the backend
  says it is down): every launch on it is killed, the node is out of
  `down_nodes()` until a probe finds it back (then what is left of those
  launches is stopped), and nothing is launched on it meanwhile; its jobs
  resume elsewhere without that counting as their failure;
- anything else that goes wrong with one job (a directory that cannot be
  written, a launch exception, a bad spec, a loader error) fails that job with
  its reason and log, and the runner goes on with the others.
Each of these is an event (runners.events): a console line and a record.
"""

from __future__ import annotations

import abc
import re
import signal
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

from arena_opt.decision import Decision, JobDecision
from arena_opt.plan import Plan
from models.catalog import Arch
from runners.base import JobSpec, JobState, Measurement, ObservedJob, Runner, RunnerError, RunTarget, run_target
from runners.checkpoint import newest_complete
from runners.events import EventLog
from runners.launch_record import LaunchRecord, next_generation, write_launch_record
from runners.names import safe_name
from runners.progress import ProgressReader, clear_stop, request_stop
from runners.spec import TrainSpec, resolve_arch
from runners.workdir_lock import WorkdirLock
from arena_opt.io import atomic_write
from arena_opt.stages import check_plan, scale_plan

# torchrun's line for a failed worker (torch/distributed/elastic/multiprocessing/api.py)
_WORKER_FAILED = re.compile(r"failed \(exitcode: (-?\d+)\) local_rank: (\d+) \(pid: (\d+)\)")
LOG_TAIL_LINES = 5


class LaunchError(RuntimeError):
    """The backend could not start a launch (sbatch refused, node not offered): worth a retry."""


class LaunchDeferred(LaunchError):
    """Nothing was submitted, for a reason outside the job (the cluster's controller is away): no crash
    is counted, the generation number is not used up, and the next decision that runs the job tries again."""


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
    failures: int = 0  # crashes since the last progress
    ckpt_step: int | None = None  # newest checkpoint known (or the one a launch actually loaded)
    best_step: int = 0  # the furthest any launch got: progress is a step beyond it
    steps_lost: int = 0  # steps done again after restarts and relaunches, all launches together
    retry_at: float = 0.0  # wall time before which a crashed job is not relaunched (backoff)
    held: str | None = None  # why the last decision to run it was not carried out
    deferred: str | None = None  # why the last launch was put off by the backend (LaunchDeferred)
    killed: bool = False  # the current launch is being killed on the scheduler's word (node gone)
    message: str | None = None
    window: list[float] = field(default_factory=list)
    seen_steps: int = 0  # step events of the current launch already looked at
    seen_events: int = 0  # progress events already turned into runner events
    log_paths: list[str] = field(default_factory=list)
    timeline: list[tuple[str, float]] = field(default_factory=list)  # runner-side moments (launch, stop, exited)
    reader: ProgressReader = field(init=False)  # of run_dir: every job has one from the start

    def __post_init__(self) -> None:
        self.reader = ProgressReader(self.run_dir)

    @property
    def run_dir(self) -> Path:
        return self.root / "run"

    @property
    def ckpt_dir(self) -> Path:
        return self.root / "ckpt"


class ManagedRunner(Runner):
    def __init__(self, workdir: str | Path, *, device: str = "auto", ckpt_interval: int = 0,
                 ckpt_every_s: float = 0.0, keep_checkpoints: int = 2, max_failures: int = 3,
                 max_restarts: int = 1, backoff_s: float = 10.0, backoff_max_s: float = 300.0,
                 node_recheck_s: float = 30.0, stop_timeout_s: float = 120.0, measure_window: int = 5,
                 events: EventLog | None = None) -> None:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._lock = WorkdirLock(self.workdir)
        self._lock.acquire()
        self.device = device
        self.ckpt_interval = ckpt_interval
        self.ckpt_every_s = ckpt_every_s
        self.keep_checkpoints = keep_checkpoints
        self.max_failures = max_failures
        self.max_restarts = max_restarts
        self.backoff_s = backoff_s
        self.backoff_max_s = backoff_max_s
        self.node_recheck_s = node_recheck_s
        self.stop_timeout_s = stop_timeout_s
        self.measure_window = measure_window
        self.event_log = events or EventLog(self.workdir / "events.jsonl")
        self.jobs: dict[str, _Job] = {}
        self.down: dict[str, tuple[float, str]] = {}  # node -> (since, why)
        self._orphans: dict[str, list[LaunchHandle]] = {}  # launches that had processes on a lost node
        self._measured: list[Measurement] = []
        self._measure_log = self.workdir / "measurements.jsonl"

    # ------------------------------------------------------------------ backend hooks

    @abc.abstractmethod
    def _start(self, job: _Job, spec: TrainSpec, placement: dict[str, list[int]]) -> LaunchHandle: ...

    def _vanished_nodes(self, polled: dict[str, list[int | None]]) -> set[str]:
        """Nodes that are gone, from this round's exit codes (job id -> code per node of its launch).
        Default: a node where every launch's torchrun vanished without an exit status (SIGKILL) at
        once. One killed torchrun beside healthy ones is that job's crash; with nothing else on the
        node the two cannot be told apart here and it counts as the node's loss. Backends that can
        ask the cluster (Slurm: DOWN, DRAIN, not responding) add what it says."""
        verdict: dict[str, bool] = {}
        for jid, rcs in polled.items():
            for node, rc in zip(self.jobs[jid].placement, rcs):
                verdict[node] = verdict.get(node, True) and rc == -signal.SIGKILL
        return {n for n, gone in verdict.items() if gone}

    def _node_up(self, node: str) -> bool:
        """Probe of a node out of service; the local host is always reachable again."""
        return True

    # ------------------------------------------------------------------ Runner API

    def set_event_log(self, log: EventLog) -> None:
        self.event_log = log

    def down_nodes(self) -> set[str]:
        """Nodes lost and not yet back: keep them out of the snapshot."""
        self._recheck_nodes()
        return set(self.down)

    def add_job(self, job: JobSpec) -> None:
        if job.job_id in self.jobs:
            raise RunnerError(f"job {job.job_id!r} was already added")
        root = job_root(self.workdir, job.job_id)
        self.jobs[job.job_id] = _Job(job, root, generation=next_generation(root))

    def apply(self, decision: Decision) -> None:
        self._refresh()
        to_stop: list[_Job] = []
        to_launch: list[tuple[_Job, RunTarget, TrainSpec]] = []
        for jd in decision.jobs:
            j = self.jobs.get(jd.job_id)
            if j is None:
                raise RunnerError(f"decision names job {jd.job_id!r} that the runner does not know")
            if j.state in ("finished", "failed"):
                continue
            if jd.runs:
                t = self._check(jd)
                if j.state == "running" and t == (j.gpu_type, j.placement, j.plan):
                    continue
                try:
                    spec = self._spec(j, t.plan)
                except ValueError as e:
                    # checked before stopping anything: a running job keeps its current plan
                    self._reject(j, f"plan {t.plan.describe()} cannot run {j.spec.job_id}: {e}")
                    continue
                if j.state != "running" and self._hold(j, t):
                    continue
                if j.state == "running":
                    to_stop.append(j)
                to_launch.append((j, t, spec))
            elif j.state == "running":
                to_stop.append(j)
        self._stop_many(to_stop)
        for j, t, spec in to_launch:
            if j.state not in ("finished", "failed"):
                self._launch(j, t, spec)

    def status(self) -> list[ObservedJob]:
        self._refresh()
        return [self._observe(j) for j in self.jobs.values()]

    def stop(self, job_id: str, save: bool = True) -> None:
        j = self.jobs.get(job_id)
        if j is None:
            raise RunnerError(f"unknown job {job_id!r}")
        self._refresh()
        if j.state != "running" or j.handle is None:
            return  # no launch to stop
        if save:
            self._stop_many([j])
        else:
            j.killed = True  # the scheduler's call (its node left): not the job's failure
            j.handle.kill()
            self._settle(j, stopping=True)

    def measurements(self) -> list[Measurement]:
        self._refresh()
        out, self._measured = self._measured, []
        return out

    def shutdown(self, save: bool = True, timeout_s: float | None = None) -> None:
        """Stop all jobs (saving a checkpoint unless save=False), killing what does not exit in time."""
        try:
            running = [j for j in self.jobs.values() if j.handle is not None]
            if save:
                self._stop_many(running, timeout_s)
            for j in running:
                if j.handle is not None:
                    j.handle.terminate(timeout=5.0)
                    self._settle(j, stopping=True)
            for handles in self._orphans.values():
                for h in handles:
                    h.kill()
        finally:
            self._lock.release()

    # ------------------------------------------------------------------ internals

    @staticmethod
    def _check(jd: JobDecision) -> RunTarget:
        t = run_target(jd)
        n = sum(len(g) for g in t.placement.values())
        if n != t.plan.num_gpus:
            raise RunnerError(f"decision for job {jd.job_id!r}: placement holds {n} GPUs, plan "
                              f"{t.plan.describe()} needs {t.plan.num_gpus}")
        return t

    def _spec(self, j: _Job, plan: Plan) -> TrainSpec:
        return make_train_spec(j.spec, plan, j.root, self.ckpt_interval, j.generation, self.device,
                               ckpt_every_s=self.ckpt_every_s, keep=self.keep_checkpoints)

    def _emit(self, kind: str, j: _Job | None, message: str, **fields) -> None:
        self.event_log.emit(kind, j.spec.job_id if j is not None else None, message, **fields)

    def _hold(self, j: _Job, t: RunTarget) -> bool:
        """True when a decision to (re)start j must wait: a node of its placement is down, or the
        backoff after repeated crashes has not run out. One event per reason, not per round."""
        gone = sorted(set(t.placement) & self.down_nodes())
        if gone:
            key = why = f"not started: node(s) {', '.join(gone)} down"
        elif j.state == "crashed" and time.time() < j.retry_at:
            key = f"backoff after {j.failures} crashes"
            why = f"relaunch held back {j.retry_at - time.time():.0f} s more ({key} in a row)"
        else:
            j.held = None
            return False
        if j.held != key:
            self._emit("held", j, why)
        j.held, j.message = key, why
        return True

    def _launch(self, j: _Job, t: RunTarget, spec: TrainSpec) -> None:
        spec = spec.model_copy(update={"generation": j.generation})
        relaunch = j.state == "crashed"
        j.timeline.append(("launch", time.time()))
        try:
            _inside(j.root, self.workdir / "jobs")
            j.run_dir.mkdir(parents=True, exist_ok=True)
            clear_stop(j.run_dir)
            j.handle = self._start(j, spec, t.placement)
        except LaunchDeferred as e:
            j.timeline.pop()
            if j.deferred != str(e):  # one event per reason, not per round
                self._emit("held", j, f"launch {j.generation} put off: {e}", deferred=True)
            j.deferred = j.message = str(e)
            return
        except LaunchError as e:
            j.generation += 1
            self._crashed(j, f"launch {j.generation - 1} could not start: {e}", counts=True)
            return
        except Exception as e:  # noqa: BLE001 - whatever it is, it is this job's alone
            j.generation += 1
            self._fail(j, f"launch {j.generation - 1} could not start: {type(e).__name__}: {e}")
            return
        self._running(j, j.handle, j.generation, t.gpu_type, t.placement, t.plan,
                      f" after {j.failures} crash(es)" if relaunch else "", relaunch=relaunch)
        try:
            write_launch_record(j.root, LaunchRecord(generation=j.generation - 1, gpu_type=t.gpu_type,
                                                     placement=t.placement, plan=t.plan))
        except OSError:
            pass  # without it a runner started again stops this launch (saving) instead of taking it over

    def _running(self, j: _Job, handle: LaunchHandle, generation: int, gpu_type: str,
                 placement: dict[str, list[int]], plan: Plan, note: str = "", **details) -> None:
        """Launch `generation` (started now, or found running) is the job's current one."""
        j.handle = handle
        j.log_paths = list(handle.log_paths)
        j.generation = generation + 1
        j.deferred = None
        j.state = "running"
        j.killed = False
        j.gpu_type, j.placement, j.plan = gpu_type, dict(placement), plan
        j.message = None
        j.window, j.seen_steps = [], 0
        where = ", ".join(f"{n}:{len(g)}" for n, g in placement.items())
        self._emit("launch", j, f"launch {generation}: {plan.describe()} on {where}{note}",
                   generation=generation, plan=plan.describe(), placement=placement,
                   log=j.log_paths[0] if j.log_paths else None, **details)

    def _reject(self, j: _Job, msg: str) -> None:
        if j.state == "running":
            j.message = msg  # it goes on with the plan it has
            return
        j.failures += 1
        if j.failures >= self.max_failures:
            self._fail(j, f"{msg} (rejected {j.failures} times)")
        else:
            j.message = msg

    def _fail(self, j: _Job, msg: str) -> None:
        if j.handle is not None:
            try:
                j.handle.kill()
            except Exception:  # noqa: BLE001 - it is being given up anyway
                pass
            j.handle = None
        j.state, j.message = "failed", msg
        self._emit("fail", j, msg, log=j.log_paths[0] if j.log_paths else None)

    def _crashed(self, j: _Job, msg: str, counts: bool) -> None:
        if counts:
            j.failures += 1
        if counts and j.failures >= self.max_failures:
            self._fail(j, f"failed {j.failures} times in a row without progress; last: {msg}")
            return
        # the first relaunch goes at once (torchrun's in-place restarts came first); then it doubles
        delay = 0.0 if j.failures <= 1 else min(self.backoff_max_s, self.backoff_s * 2 ** (j.failures - 2))
        j.retry_at = time.time() + delay
        j.state, j.message = "crashed", msg

    def _stop_many(self, jobs: list[_Job], timeout_s: float | None = None) -> None:
        jobs = [j for j in jobs if j.handle is not None]
        for j in jobs:
            try:
                request_stop(j.run_dir)
            except OSError:
                pass  # the launch is terminated below, as it would be after the timeout
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
        self._recheck_nodes()
        polled: dict[str, list[int | None]] = {}
        for jid, j in self.jobs.items():
            if j.handle is None:
                continue
            try:
                j.reader.poll()
                self._digest_progress(j)
                self._collect_measurements(j)
                polled[jid] = j.handle.poll()
            except Exception as e:  # noqa: BLE001 - one job's trouble must not stop the others
                self._fail(j, f"runner error while watching launch {j.generation - 1}: {type(e).__name__}: {e}")
        for node in sorted(self._vanished_nodes(polled)):
            self._node_lost(node, "every process there vanished without an exit status")
        for jid, rcs in polled.items():
            j = self.jobs[jid]
            if j.handle is None:
                continue  # settled with its node
            try:
                if all(rc is not None for rc in rcs):
                    self._settle(j, stopping=False)
                elif any(rc not in (None, 0) for rc in rcs):
                    # one node's torchrun failed: the others cannot go on without its ranks
                    j.handle.terminate(timeout=10.0)
                    self._settle(j, stopping=False)
            except Exception as e:  # noqa: BLE001
                self._fail(j, f"runner error while ending launch {j.generation - 1}: {type(e).__name__}: {e}")

    def _digest_progress(self, j: _Job) -> None:
        """Turn the new progress events of the current launch into job state and runner events."""
        events = j.reader.state.events
        gen = j.generation - 1
        for ev in events[j.seen_events:]:
            kind = ev["event"]
            if ev.get("generation") != gen:
                continue
            if kind == "step":
                if ev["step"] > j.best_step:
                    j.best_step = ev["step"]
                    j.failures = 0  # progress: the crash counter starts again
            elif kind in ("checkpoint", "loaded"):
                # a load is the truth about what is on disk: it may be older than the newest saved
                j.ckpt_step = ev["step"]
            elif kind == "ckpt_skipped":
                self._emit("checkpoint_fallback", j, f"checkpoint of step {ev['step']} skipped: {ev['reason']}",
                           step=ev["step"], path=ev.get("path"), reason=ev["reason"])
            elif kind == "start":
                start = ev.get("step", 0)
                lost = max(0, j.best_step - start)
                j.steps_lost += lost
                if ev.get("skipped") and ev.get("resumed_from") is None:
                    j.ckpt_step = None
                    self._emit("checkpoint_fallback", j, "no intact checkpoint: starts again from step 0",
                               scratch=True, step=0, steps_lost=lost)
                elif ev.get("skipped"):
                    self._emit("checkpoint_fallback", j, f"resumed from step {start}, the newest intact checkpoint "
                                                         f"({ev['skipped']} newer skipped), {lost} step(s) lost",
                               resumed=True, step=start, steps_lost=lost)
                if ev.get("restart"):
                    j.seen_steps, j.window = 0, []
                    rank, rc, tail = self._failed_rank(j)
                    who = f"rank {rank} exited {rc}" if rank is not None else "a worker failed"
                    self._emit("restart_in_place", j, f"restarted in place by torchrun (restart {ev['restart']}): {who}; "
                                             f"resumed from step {start}, {lost} step(s) lost"
                               + (f"; last lines: {' | '.join(tail)}" if tail else ""),
                               restart=ev["restart"], rank=rank, exit_code=rc, step=start, steps_lost=lost,
                               log_tail=tail)
        j.seen_events = len(events)

    def _failed_rank(self, j: _Job) -> tuple[int | None, int | None, list[str]]:
        """(global rank, exit code, last lines of its output) of the newest worker failure torchrun
        logged for the current launch, from the node logs (rank-prefixed by --tee)."""
        best = None
        offset = 0
        for node, log in zip(j.placement, j.log_paths):
            text = _tail(log)
            for m in _WORKER_FAILED.finditer(text):
                best = (offset + int(m.group(2)), int(m.group(1)), text[: m.start()], int(m.group(2)))
            offset += len(j.placement[node])
        if best is None:
            return None, None, []
        rank, rc, before, local = best
        prefix = f"[default{local}]:"
        lines = [x[len(prefix):] for x in before.splitlines() if x.startswith(prefix)]
        return rank, rc, lines[-LOG_TAIL_LINES:]

    def _node_lost(self, node: str, why: str) -> None:
        if node not in self.down:
            self.down[node] = (time.time(), why)
            self._emit("node_lost", None, f"node {node} lost: {why}; nothing runs there until it is back",
                       node=node)
        for j in self.jobs.values():
            if j.handle is None or node not in j.placement:
                continue
            self._orphans.setdefault(node, []).append(j.handle)
            j.killed = True
            j.handle.kill()  # the ranks elsewhere cannot go on without the node's
            self._settle(j, stopping=False, node_lost=node)

    def _recheck_nodes(self) -> None:
        now = time.time()
        for node, (since, _) in list(self.down.items()):
            if now - since < self.node_recheck_s or not self._node_up(node):
                continue
            del self.down[node]
            left = self._orphans.pop(node, [])
            for h in left:
                h.kill()  # what a lost launch left there must not run beside new work
            self._emit("node_back", None, f"node {node} is back after {now - since:.0f} s; "
                                          f"{len(left)} lost launch(es) there stopped", node=node)

    def _settle(self, j: _Job, stopping: bool, node_lost: str | None = None) -> None:
        """The launch is over: decide what it was from its exit codes and progress events."""
        if j.handle is None:
            return  # settled already (with its node, say)
        j.handle.terminate(timeout=5.0)  # a no-op for a clean exit; reaps stray workers of a crash
        rcs = j.handle.poll()
        j.timeline.append(("exited", time.time()))
        p = j.reader.poll()
        self._digest_progress(j)
        self._collect_measurements(j, flush=True)
        gen = j.generation - 1
        current = p.generation == gen
        logs = ", ".join(j.handle.log_paths)
        j.handle = None
        killed, j.killed = j.killed, False
        if current and p.exit_reason == "finished":
            j.state, j.message = "finished", None
            self._emit("exit", j, f"launch {gen} finished at step {p.step}", reason="finished", step=p.step)
        elif current and p.exit_reason == "stopped" and all(rc == 0 for rc in rcs):
            j.state, j.message = "stopped", None
            self._emit("exit", j, f"launch {gen} stopped at step {p.step} (saved)", reason="stopped", step=p.step)
        elif current and p.error:
            # a plan the model cannot run fails the same way every time: do not retry
            self._fail(j, f"{p.error} (log: {logs})")
        elif stopping and not killed and all(rc == 0 for rc in rcs):
            j.state, j.message = "stopped", None
            self._emit("exit", j, f"launch {gen} stopped", reason="stopped", step=p.step)
        else:
            resume = newest_complete(j.ckpt_dir)
            # sizes only (checksums are the loader's job): the step really loaded is reported then
            where = (f"its newest intact checkpoint (newest complete on disk: step {resume[0]})" if resume
                     else "step 0 (no complete checkpoint)")
            if node_lost:
                what = f"lost with node {node_lost}"
            elif killed or stopping:
                what = "was stopped without saving"
            else:
                rank, rc, tail = self._failed_rank(j)
                what = (f"crashed: rank {rank} exited {rc}" if rank is not None else "crashed") \
                    + f" (torchrun exit codes {rcs})" + (f"; last lines: {' | '.join(tail)}" if tail else "")
            msg = f"launch {gen} {what} at step {p.step}; resumes from {where}; log: {logs}"
            # a node's loss or the scheduler's kill is not the job's failure
            self._crashed(j, msg, counts=not (node_lost or killed))
            self._emit("crash", j, msg, generation=gen, exit_codes=rcs, step=p.step,
                       resume_step=resume[0] if resume else 0, node_lost=node_lost, log=logs)

    def _collect_measurements(self, j: _Job, flush: bool = False) -> None:
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
        p = j.reader.state
        cur = p.iter_times if p.generation == j.generation - 1 else []
        recent = cur[1:][-20:] or cur
        it = statistics.median(recent) if recent else None
        return ObservedJob(
            job_id=j.spec.job_id, state=j.state, step=p.step, total_steps=j.spec.total_steps, loss=p.loss,
            iter_time_s=it, samples_per_s=(j.spec.global_batch / it) if it else None,
            peak_mem_gib=(p.peak_mem_bytes / 2**30) if p.peak_mem_bytes else None,
            gpu_type=j.gpu_type, num_gpus=j.plan.num_gpus if j.plan else 0, placement=j.placement, plan=j.plan,
            generation=max(0, j.generation - 1), failures=j.failures, steps_lost=j.steps_lost,
            last_checkpoint_step=j.ckpt_step,
            log_path=j.log_paths[0] if j.log_paths else None,
            message=j.message)

    def losses(self, job_id: str) -> dict[int, float]:
        """Loss by step as reported (the last report wins when steps are repeated after a crash)."""
        j = self.jobs[job_id]
        j.reader.poll()
        return dict(j.reader.state.losses)

    def timeline(self, job_id: str) -> list[tuple[str, float]]:
        """Runner-side moments of a job: ("launch" | "stop" | "exited", wall time)."""
        return list(self.jobs[job_id].timeline)

    def events(self, job_id: str) -> list[dict]:
        j = self.jobs[job_id]
        j.reader.poll()
        return list(j.reader.state.events)


def job_root(workdir: str | Path, job_id: str) -> Path:
    return Path(workdir) / "jobs" / safe_name(job_id)


def make_train_spec(s: JobSpec, plan: Plan, root: Path, ckpt_interval: int, generation: int,
                    device: str = "auto", ckpt_every_s: float = 0.0, keep: int = 2) -> TrainSpec:
    """The launch spec of a job under a decided plan; raises PlanError / ValueError when the
    plan cannot run the job's model."""
    full = resolve_arch(s.model, None)
    arch = resolve_arch(s.model, s.scale)
    plan = scale_plan(plan, full, arch)
    check_plan(arch, plan)
    return TrainSpec(job_id=s.job_id, model=s.model, scale=s.scale, plan=plan, global_batch=s.global_batch,
                     total_steps=s.total_steps, lr=s.lr, seed=s.seed, dp_mode=s.dp_mode, device=device,  # type: ignore[arg-type]
                     run_dir=str(root / "run"), ckpt_dir=str(root / "ckpt"), ckpt_interval=ckpt_interval,
                     ckpt_every_s=ckpt_every_s, keep_checkpoints=keep,
                     generation=generation, step_delay_s=s.step_delay_s, fail_at_step=s.fail_at_step,
                     fail_rank=s.fail_rank)


def _inside(path: Path, parent: Path) -> None:
    """A job directory must be where its name puts it (a symlink could point anywhere)."""
    real, top = path.resolve(), parent.resolve()
    if real.parent != top:
        raise PermissionError(f"job directory {path} resolves to {real}, outside {top}")


def _tail(path: str, limit: int = 65536) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - limit))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def _model_name(model: str | Arch) -> str:
    return model if isinstance(model, str) else model.name


def _arch_name(j: _Job) -> str:
    return resolve_arch(j.spec.model, j.spec.scale).name
