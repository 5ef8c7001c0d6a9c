"""Dry-run backend: prints, per decision, the exact torchrun command and
environment each node would run (and the stop requests for preemptions and
reshapes) and the Slurm batch script of each launch instead of running anything. This is also the hand-off to an
existing launcher: every printed command is self-contained (inline spec).

Paths in the commands (run and checkpoint directories) must be on a file
system every node of the job shares, as for any multi-node DCP checkpoint.
"""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from arena_opt.decision import Decision, JobDecision
from arena_opt.slurm.gres import GpuMap
from arena_opt.plan import Plan
from arena_opt.snapshot import ClusterSnapshot
from runners.base import JobSpec, ObservedJob, Runner, RunnerError, RunTarget, run_target
from runners.launch import DEFAULT_PORT, NodeLaunch, node_launches
from runners.launch_record import LaunchFiles
from runners.managed import job_root, make_train_spec
from runners.progress import STOP_FILE
from runners.slurm import sbatch_script
from runners.spec import Scale


@dataclass
class _DryJob:
    spec: JobSpec
    running: tuple[str | None, dict[str, list[int]], Plan] | None = None
    generation: int = 0
    state: str = "pending"
    launches: list[NodeLaunch] = field(default_factory=list)


class DryRunRunner(Runner):
    def __init__(self, workdir: str | Path, out: TextIO | None = None, node_addrs: dict[str, str] | None = None,
                 base_port: int = DEFAULT_PORT, ckpt_interval: int = 0, device: str = "auto",
                 ckpt_every_s: float = 0.0, keep_checkpoints: int = 2, max_restarts: int = 1) -> None:
        self.workdir = Path(workdir).resolve()
        self.out = out or sys.stdout
        self.node_addrs = node_addrs or {}
        self.base_port = base_port
        self.ckpt_interval = ckpt_interval
        self.ckpt_every_s = ckpt_every_s
        self.keep_checkpoints = keep_checkpoints
        self.max_restarts = max_restarts
        self.device = device
        self.jobs: dict[str, _DryJob] = {}
        self.gpu_map = GpuMap.load()

    def add_job(self, job: JobSpec, running: tuple[str | None, dict[str, list[int]], Plan] | None = None) -> None:
        if job.job_id in self.jobs:
            raise RunnerError(f"job {job.job_id!r} was already added")
        self.jobs[job.job_id] = _DryJob(job, running, generation=1 if running else 0,
                                        state="running" if running else "pending")

    def apply(self, decision: Decision) -> None:
        p = self._print
        p(f"# decision at t={decision.time:g} by {decision.policy}: {len(decision.jobs)} job(s)")
        for port_index, jd in enumerate(decision.jobs):
            j = self.jobs.get(jd.job_id)
            if j is None:
                raise RunnerError(f"decision names job {jd.job_id!r} that the runner does not know")
            if jd.runs:
                t = run_target(jd)
                if j.running == t:
                    p(f"# job {jd.job_id}: {jd.action}: already running {t.plan.describe()}, nothing to run")
                    continue
                if j.running is not None:
                    self._print_stop(j, f"{jd.action} to {t.plan.describe()}")
                self._print_launch(j, jd, t, self.base_port + port_index)
            else:
                if j.running is not None:
                    self._print_stop(j, jd.action + (f" ({jd.reason})" if jd.reason else ""))
                    j.running, j.state = None, "stopped"
                else:
                    p(f"# job {jd.job_id}: {jd.action}" + (f" ({jd.reason})" if jd.reason else ""))
        self.out.flush()

    def status(self) -> list[ObservedJob]:
        out = []
        for jid, j in self.jobs.items():
            gpu, placement, plan = j.running if j.running else (None, {}, None)
            out.append(ObservedJob(job_id=jid, state=j.state, total_steps=j.spec.total_steps,  # type: ignore[arg-type]
                                   gpu_type=gpu, placement=placement, plan=plan,
                                   num_gpus=plan.num_gpus if plan else 0, generation=j.generation,
                                   message="dry run: nothing was started"))
        return out

    def stop(self, job_id: str, save: bool = True) -> None:
        j = self.jobs[job_id]
        if j.running is not None:
            self._print_stop(j, "stop")
            j.running, j.state = None, "stopped"

    # ------------------------------------------------------------------ printing

    def _print(self, line: str) -> None:
        print(line, file=self.out)

    def _print_stop(self, j: _DryJob, why: str) -> None:
        run_dir = job_root(self.workdir, j.spec.job_id) / "run"
        self._print(f"# job {j.spec.job_id}: {why}: save a checkpoint and stop the running launch")
        self._print(f"touch {shlex.quote(str(run_dir / STOP_FILE))}  # every rank saves at the next step, "
                    "then torchrun exits 0")

    def _print_launch(self, j: _DryJob, jd: JobDecision, t: RunTarget, port: int) -> None:
        root = job_root(self.workdir, j.spec.job_id)
        try:
            spec = make_train_spec(j.spec, t.plan, root, self.ckpt_interval, j.generation, self.device,
                                   ckpt_every_s=self.ckpt_every_s, keep=self.keep_checkpoints)
        except ValueError as e:
            self._print(f"# job {jd.job_id}: {jd.action} {t.plan.describe()}: cannot run: {e}")
            return
        first = next(iter(t.placement))
        endpoint = f"{self.node_addrs.get(first, first)}:{port}"
        launches = node_launches(spec, t.placement, endpoint, use_gpus=True, max_restarts=self.max_restarts)
        resume = " (loads its latest checkpoint)" if j.generation else ""
        self._print(f"# job {jd.job_id}: {jd.action} {t.plan.describe()} on {t.gpu_type}, {t.plan.num_gpus} GPU(s) "
                    f"on {len(launches)} node(s), rendezvous {endpoint}{resume}")
        self._print(f"mkdir -p {shlex.quote(str(root / 'run'))} && rm -f {shlex.quote(str(root / 'run' / STOP_FILE))}")
        for nl in launches:
            self._print(f"# node {nl.node_id} (node rank {nl.node_rank} of {nl.nnodes}, {nl.nproc} process(es))")
            self._print(nl.shell())
        self._print_sbatch(j, t, spec, endpoint)
        j.launches = launches
        j.running = (t.gpu_type, dict(t.placement), t.plan)
        j.generation += 1
        j.state = "running"


    def _print_sbatch(self, j: _DryJob, t: RunTarget, spec, endpoint: str) -> None:
        """The same launch as `--backend slurm` submits it (Slurm sets CUDA_VISIBLE_DEVICES itself)."""
        gres = self.gpu_map.gres_name(t.gpu_type)
        g = spec.generation
        files = LaunchFiles(job_root(self.workdir, j.spec.job_id), g)
        script = sbatch_script(node_launches(spec, t.placement, endpoint, use_gpus=False),
                               {n: gres for n in t.placement}, name=f"arena-{j.spec.job_id}-g{g}",
                               logs=[str(files.node_log(n)) for n in t.placement],
                               rc_files=[str(files.exit_code(k)) for k in range(len(t.placement))],
                               batch_log=str(files.batch_log))
        self._print("# as a Slurm batch script (sbatch, --backend slurm):")
        self._print("cat > " + shlex.quote(str(files.batch_script)) + " <<'SBATCH'")
        self.out.write(script)
        self._print("SBATCH")


def jobs_from_snapshot(snap: ClusterSnapshot, scale: Scale | None = None) -> list[tuple[JobSpec, tuple | None]]:
    """JobSpecs for a snapshot's jobs (full size unless `scale`), with their running (gpu, placement, plan)."""
    out = []
    for job in snap.jobs:
        spec = JobSpec(job_id=job.id, model=job.model, global_batch=job.batch_size,
                       total_steps=job.total_iterations, scale=scale)
        running = (job.running.gpu_type, dict(job.running.placement), job.running.plan) if job.running else None
        out.append((spec, running))
    return out
