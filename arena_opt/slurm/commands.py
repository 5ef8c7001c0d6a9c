"""Running Slurm's commands (the ones on PATH, for the cluster $SLURM_CONF names) and reading
the cluster: nodes from `scontrol show nodes --json` (23.02 and later) or `sinfo --json` (22.05),
jobs from `squeue --json`."""

from __future__ import annotations

import shutil
import subprocess

from arena_opt.errors import InputError
from arena_opt.slurm.jsonfmt import SlurmJob, SlurmNode, parse_jobs, parse_nodes

TIMEOUT_S = 60.0


class SlurmCommandError(InputError):
    """A Slurm command that could not run or failed; carries Slurm's own message."""

    def __init__(self, argv: list[str], message: str) -> None:
        self.argv = argv
        self.slurm_message = message
        super().__init__(f"`{' '.join(argv)}` failed: {message}")


def slurm(*argv: str, input: str | None = None, timeout: float = TIMEOUT_S) -> str:
    """stdout of a Slurm command; SlurmCommandError (with Slurm's stderr) when it fails."""
    args = list(argv)
    if shutil.which(args[0]) is None:
        raise SlurmCommandError(args, f"{args[0]} not found on PATH (install Slurm's client commands, "
                                      "e.g. apt-get install slurm-client, and set SLURM_CONF)")
    try:
        p = subprocess.run(args, capture_output=True, text=True, input=input, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise SlurmCommandError(args, f"no answer within {timeout:.0f} s (is slurmctld up?)") from None
    if p.returncode != 0:
        msg = (p.stderr.strip() or p.stdout.strip() or f"exit code {p.returncode}").splitlines()
        raise SlurmCommandError(args, "; ".join(msg[-3:]))
    return p.stdout


def controller_up() -> bool:
    """Whether slurmctld answers (`scontrol ping`, which answers at once either way; a query such as
    squeue waits out MessageTimeout first and, with `--json`, exits 0 with an unspecific error)."""
    try:
        p = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return p.returncode == 0


def read_nodes() -> list[SlurmNode]:
    try:
        out = slurm("scontrol", "show", "nodes", "--json")
        return parse_nodes(out, "scontrol show nodes --json")
    except SlurmCommandError as e:
        if "unrecognized option" not in e.slurm_message and "invalid option" not in e.slurm_message:
            raise
    # 22.05 has no `scontrol --json`
    return parse_nodes(slurm("sinfo", "--json"), "sinfo --json")


def read_jobs() -> list[SlurmJob]:
    return parse_jobs(slurm("squeue", "--json"), "squeue --json")
