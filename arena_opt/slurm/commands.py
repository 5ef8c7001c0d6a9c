"""Running Slurm's commands (the ones on PATH, for the cluster $SLURM_CONF names) and reading
the cluster: nodes from `scontrol show nodes --json` (23.02 and later) or `sinfo --json` (22.05),
jobs from `squeue --json`."""

from __future__ import annotations

import shutil
import subprocess

from pydantic import BaseModel, ConfigDict, Field, PositiveFloat

from typing import TYPE_CHECKING

from arena_opt.errors import InputError

if TYPE_CHECKING:
    from arena_opt.slurm.jsonfmt import SlurmJob, SlurmNode

# Bound on a command without a fallback (a one-shot CLI read, sbatch): Slurm's own retries end first
# (a client retries the controller for MessageTimeout, measured 9-18 s at the default 10 s)
TIMEOUT_S = 60.0
# the client's words when it never reached slurmctld: nothing was submitted or changed
NOT_REACHED = "Unable to contact slurm controller (connect failure)"


class SlurmOptions(BaseModel):
    """How long the runner waits for Slurm's commands."""

    model_config = ConfigDict(extra="forbid")

    query_timeout_s: PositiveFloat = Field(
        5.0, description="seconds a guarded Slurm command (scontrol ping, sinfo, squeue, scancel) may take; past "
                         "it slurmctld counts as away and the runner keeps what Slurm said last (queries take "
                         "0.01-0.25 s on the test cluster)")
    submit_timeout_s: PositiveFloat = Field(
        TIMEOUT_S, description="seconds sbatch may take before the runner stops waiting for its answer; longer "
                               "than Slurm's own retries (MessageTimeout) because a submit cut short may still "
                               "have been accepted: the runner then looks for it by its job name and adopts it")


class SlurmCommandError(InputError):
    """A Slurm command that could not run or failed; carries Slurm's own message."""

    def __init__(self, argv: list[str], message: str) -> None:
        self.argv = argv
        self.slurm_message = message
        super().__init__(f"`{' '.join(argv)}` failed: {message}")


class SlurmTimeout(SlurmCommandError):
    """No answer within the caller's timeout: the command was killed, its effect (if any) unknown."""

    def __init__(self, argv: list[str], timeout: float) -> None:
        self.timeout = timeout
        super().__init__(argv, f"no answer within {timeout:g} s (is slurmctld up?)")


def slurm(*argv: str, input: str | None = None, timeout: float = TIMEOUT_S) -> str:
    """stdout of a Slurm command; SlurmCommandError (with Slurm's stderr) when it fails, SlurmTimeout when
    it does not end within `timeout` seconds."""
    args = list(argv)
    if shutil.which(args[0]) is None:
        raise SlurmCommandError(args, f"{args[0]} not found on PATH (install Slurm's client commands, "
                                      "e.g. apt-get install slurm-client, and set SLURM_CONF)")
    try:
        p = subprocess.run(args, capture_output=True, text=True, input=input, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise SlurmTimeout(args, timeout) from None
    if p.returncode != 0:
        msg = (p.stderr.strip() or p.stdout.strip() or f"exit code {p.returncode}").splitlines()
        raise SlurmCommandError(args, "; ".join(msg[-3:]))
    return p.stdout


def controller_up(timeout: float = TIMEOUT_S) -> bool:
    """Whether slurmctld answers (`scontrol ping`, which answers at once when the controller is gone; a
    query such as squeue waits out MessageTimeout first and, with `--json`, exits 0 with an unspecific
    error). A ping that does not end within `timeout` (a hung controller, a lost network) is a no."""
    try:
        p = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return p.returncode == 0


def read_nodes(timeout: float = TIMEOUT_S) -> list[SlurmNode]:
    # the reader's models are imported here: every CLI call imports this module (the runner's flags read
    # SlurmOptions), and building them is 8 ms of a `solve` that never reads Slurm
    from arena_opt.slurm.jsonfmt import parse_nodes

    try:
        out = slurm("scontrol", "show", "nodes", "--json", timeout=timeout)
        return parse_nodes(out, "scontrol show nodes --json")
    except SlurmTimeout:
        raise
    except SlurmCommandError as e:
        if "unrecognized option" not in e.slurm_message and "invalid option" not in e.slurm_message:
            raise
    # 22.05 has no `scontrol --json`
    return parse_nodes(slurm("sinfo", "--json", timeout=timeout), "sinfo --json")


def read_jobs(timeout: float = TIMEOUT_S) -> list[SlurmJob]:
    from arena_opt.slurm.jsonfmt import parse_jobs

    return parse_jobs(slurm("squeue", "--json", timeout=timeout), "squeue --json")
