"""The torchrun command (argv + environment) each node runs for one launch of a
job. Shared by the dry-run printer, the local and the Slurm backends, so
what dry-run prints is what the other backends execute."""

from __future__ import annotations

import random
import shlex
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path

from runners.names import safe_name
from runners.spec import TrainSpec

DEFAULT_PORT = 29500


@dataclass(frozen=True)
class NodeLaunch:
    job_id: str
    node_id: str
    node_rank: int
    nnodes: int
    nproc: int
    gpus: tuple[int, ...]
    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)

    def shell(self) -> str:
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()))
        return f"{env} {shlex.join(self.argv)}"


def torchrun_exe() -> list[str]:
    """The torchrun of this interpreter's environment (same torch as the scheduler)."""
    exe = Path(sys.executable).parent / "torchrun"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "torch.distributed.run"]


# Ports handed out by this process, newest last: two launches started together must not get the same one
_HANDED: list[int] = []
_LOW_PORT = 20000


def _ephemeral_range() -> tuple[int, int]:
    try:
        lo, hi = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
        return lo, hi
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def free_port(host: str = "127.0.0.1") -> int:
    """A port for a rendezvous, free on `host` now. Drawn below the ephemeral range, not from bind(0):
    a port bind(0) returns is released at once and is exactly the kind the kernel hands to the next
    outgoing connection (every gloo/TCPStore client on the host makes such connections), so a launch
    could lose it before torchrun binds it. Never one this process handed out recently."""
    lo, _ = _ephemeral_range()
    top = lo - 1 if lo - 1 > _LOW_PORT + 1000 else 32767
    rng = random.Random()  # not the global one: callers seed that for their experiments
    for _ in range(200):
        port = rng.randint(_LOW_PORT, top)
        if port in _HANDED:
            continue
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue  # taken
        _HANDED.append(port)
        del _HANDED[:-256]
        return port
    with socket.socket() as s:  # a host with the whole low range in use: fall back to the kernel's pick
        s.bind((host, 0))
        return s.getsockname()[1]


def node_launches(spec: TrainSpec, placement: dict[str, list[int]], endpoint: str, *,
                  spec_path: str | None = None, use_gpus: bool = True, max_restarts: int = 0,
                  log_dir: str | None = None) -> list[NodeLaunch]:
    """One NodeLaunch per node of `placement`, in placement order (= node rank).
    `spec_path`: pass the spec as a file (it must exist on every node); otherwise inline JSON,
    which makes the printed command self-contained. `max_restarts`: torchrun restarts the worker
    group in place this many times after a worker fails (each restart loads the newest intact
    checkpoint). `log_dir`: torchrun's own files (it makes one sub-directory per launch) go there
    instead of /tmp."""
    if not placement:
        raise ValueError(f"job {spec.job_id}: empty placement")
    nproc_total = sum(len(g) for g in placement.values())
    if nproc_total != spec.plan.num_gpus:
        raise ValueError(f"job {spec.job_id}: placement holds {nproc_total} GPUs but plan "
                         f"{spec.plan.describe()} needs {spec.plan.num_gpus}")
    nnodes = len(placement)
    rdzv_id = f"{safe_name(spec.job_id)}-g{spec.generation}"
    target = ["--spec", spec_path] if spec_path else ["--spec-json", spec.model_dump_json()]
    out = []
    for rank, (node, gpus) in enumerate(placement.items()):
        argv = [*torchrun_exe(), f"--nnodes={nnodes}", f"--nproc-per-node={len(gpus)}", f"--node-rank={rank}",
                "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}", f"--rdzv-id={rdzv_id}",
                f"--max-restarts={max_restarts}",
                # rank-prefixed output ("[default3]:...") tells the failing rank's last lines apart
                "--tee=3", *([f"--log-dir={log_dir}"] if log_dir else []),
                "-m", "runners.train", *target]
        env = {
            # without it torchrun restarts on "Gloo connectFullMesh failed" (../shared/MEASURED.md)
            "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
            "PYTHONUNBUFFERED": "1",
            "OMP_NUM_THREADS": "1",
        }
        if use_gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpus)
        out.append(NodeLaunch(spec.job_id, node, rank, nnodes, len(gpus), tuple(gpus), tuple(argv), env))
    return out


if __name__ == "__main__":
    # `python -m runners.launch --free-port`: a rendezvous port free on this host, for a batch script
    # that runs on the launch's first node (runners/slurm.py)
    if sys.argv[1:] != ["--free-port"]:
        sys.exit("usage: python -m runners.launch --free-port")
    print(free_port(""))
