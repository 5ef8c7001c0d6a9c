"""Sharded checkpoints with torch.distributed.checkpoint (DCP), loadable at
another world size and plan.

Layout: CKPT_DIR/step_000012/ (DCP shards + meta.json), CKPT_DIR/latest
(name of the newest complete checkpoint, replaced atomically after every rank
finished writing, so a crash during a save leaves the previous one in force).

State is keyed by parameter FQN, which does not depend on the plan (see
models.torch_layers.LayerStack), so DCP reshards between DDP, FSDP2, TP and
any pipeline split. The optimizer is saved per parameter (exp_avg, exp_avg_sq,
step) without its param_groups: loading param_groups saved under another
pipeline split fails (`KeyError: 'betas'`, ../shared/MEASURED.md) and they hold
only hyper-parameters that the spec sets anyway. The data position is the
step: synthetic data is a function of the step.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

LATEST = "latest"


def latest_checkpoint(ckpt_dir: str | Path) -> Path | None:
    p = Path(ckpt_dir) / LATEST
    try:
        name = p.read_text().strip()
    except FileNotFoundError:
        return None
    path = Path(ckpt_dir) / name
    return path if (path / "meta.json").exists() else None


def read_meta(path: str | Path) -> dict:
    return json.loads((Path(path) / "meta.json").read_text())


def save(module: nn.Module, optim: torch.optim.Optimizer, step: int, ckpt_dir: str | Path, meta: dict,
         keep: int = 2) -> tuple[Path, float]:
    """Collective: every rank calls it. Returns (path, seconds)."""
    # imported here: DCP costs 2-3 s of start-up that jobs which never save should not pay
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    t0 = time.perf_counter()
    ckpt_dir = Path(ckpt_dir)
    path = ckpt_dir / f"step_{step:09d}"
    state = {"model": get_model_state_dict(module),
             "optim": get_optimizer_state_dict(module, optim)["state"]}
    dcp.save(state, checkpoint_id=str(path))
    dist.barrier()
    if dist.get_rank() == 0:
        (path / "meta.json").write_text(json.dumps({**meta, "step": step, "time": time.time()}))
        tmp = ckpt_dir / f".{LATEST}.tmp"
        tmp.write_text(path.name)
        os.replace(tmp, ckpt_dir / LATEST)
        old = sorted(p for p in ckpt_dir.glob("step_*") if p.is_dir() and p != path)
        for p in old[: max(0, len(old) - (keep - 1))]:
            shutil.rmtree(p, ignore_errors=True)
    dist.barrier()
    return path, time.perf_counter() - t0


def load(module: nn.Module, optim: torch.optim.Optimizer, path: str | Path) -> tuple[int, float]:
    """Collective: load a checkpoint saved under any plan into this rank's shards.
    Returns (step, seconds)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (get_model_state_dict, get_optimizer_state_dict,
                                                         set_model_state_dict, set_optimizer_state_dict)

    t0 = time.perf_counter()
    meta = read_meta(path)
    model_sd = get_model_state_dict(module)
    # creates the optimizer state (zeros, lr 0 step) so there are tensors to load into
    optim_sd = get_optimizer_state_dict(module, optim)
    state = {"model": model_sd, "optim": optim_sd["state"]}
    dcp.load(state, checkpoint_id=str(path))
    set_model_state_dict(module, state["model"])
    set_optimizer_state_dict(module, optim, {"state": state["optim"], "param_groups": optim_sd["param_groups"]})
    return int(meta["step"]), time.perf_counter() - t0
