"""Local backend: every launch is torchrun processes on this host (gloo on CPU,
NCCL when CUDA is present). A placement over several nodes starts one torchrun
per node here, joined by c10d rendezvous on localhost, exactly as the Slurm backend on
real nodes does."""

from __future__ import annotations

from pathlib import Path

from runners.launch import free_port, node_launches
from runners.launch_record import LaunchFiles
from runners.managed import LaunchHandle, ManagedRunner, _Job
from runners.process import Proc
from runners.spec import TrainSpec


class LocalLaunch(LaunchHandle):
    def __init__(self, procs: list[Proc]) -> None:
        self.procs = procs
        self.log_paths = [str(p.log_path) for p in procs]

    def poll(self) -> list[int | None]:
        return [p.poll() for p in self.procs]

    def terminate(self, timeout: float) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.terminate(timeout)
            else:
                p.kill()  # torchrun is gone; make sure its workers are too

    def kill(self) -> None:
        for p in self.procs:
            p.kill()

    def worker_pids(self) -> list[int]:
        return [w for p in self.procs for w in p.workers()]


class LocalRunner(ManagedRunner):
    def _start(self, job: _Job, spec: TrainSpec, placement: dict[str, list[int]]) -> LaunchHandle:
        spec_path = job.run_dir / f"spec-g{spec.generation}.json"
        spec_path.write_text(spec.model_dump_json(indent=1))
        endpoint = f"127.0.0.1:{free_port()}"
        import torch

        launches = node_launches(spec, placement, endpoint, spec_path=str(spec_path),
                                 use_gpus=torch.cuda.is_available() and self.device != "cpu",
                                 max_restarts=self.max_restarts, log_dir=str(job.root / "logs" / "torchrun"))
        procs = [Proc(nl.argv, nl.env, LaunchFiles(job.root, spec.generation).node_log(nl.node_id), cwd=_repo_root())
                 for nl in launches]
        return LocalLaunch(procs)

    def worker_pids(self, job_id: str) -> list[int]:
        """PIDs of the job's training processes (for fault-injection tests and diagnostics)."""
        h = self.jobs[job_id].handle
        return h.worker_pids() if isinstance(h, LocalLaunch) else []


def _repo_root() -> Path:
    return Path(__file__).resolve().parent.parent
