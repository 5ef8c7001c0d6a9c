"""Sharded checkpoints with torch.distributed.checkpoint (DCP), loadable at
another world size and plan, committed atomically and verified on load.

Layout under the job's own CKPT_DIR (nothing outside it is read or written):

    .tmp-step_000000012/   a save in progress (DCP shards), never loaded
    step_000000012/        a committed checkpoint: DCP shards + manifest.json
    latest                 name of the newest committed checkpoint (for operators; loading scans)

A save writes into the temporary directory, every rank checksums a share of the
files, rank 0 writes the manifest (step, samples seen, size and SHA-256 of every
file) and renames the directory into place: a crash at any point leaves the
previous checkpoints as they were. Loading walks the committed checkpoints from
the newest, verifies sizes and checksums (again shared over the ranks) and loads
the first intact one; one whose DCP load fails is skipped too. Each skipped
checkpoint is reported with why, so the caller can say which step it really
resumed from.

State is keyed by parameter FQN, which does not depend on the plan (see
models.torch_layers.LayerStack), so DCP reshards between DDP, FSDP2, TP and
any pipeline split. The optimizer is saved per parameter (exp_avg, exp_avg_sq,
step) without its param_groups: loading param_groups saved under another
pipeline split fails (`KeyError: 'betas'`, ../shared/MEASURED.md) and they hold
only hyper-parameters that the spec sets anyway. The data position is the
step: synthetic data is a function of the step.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn

from arena_opt.io import atomic_write

LATEST = "latest"
MANIFEST = "manifest.json"
TMP_PREFIX = ".tmp-"
_STEP_DIR = re.compile(r"^step_(\d{9,})$")


def step_name(step: int) -> str:
    return f"step_{step:09d}"


def committed(ckpt_dir: str | Path) -> list[tuple[int, Path]]:
    """Committed checkpoint directories, newest first (whether intact is for `verify` to say)."""
    d = Path(ckpt_dir)
    try:
        names = os.listdir(d)
    except (FileNotFoundError, NotADirectoryError):
        return []
    out = []
    for name in names:
        m = _STEP_DIR.match(name)
        if m and (d / name).is_dir() and not (d / name).is_symlink():
            out.append((int(m.group(1)), d / name))
    return sorted(out, reverse=True)


def read_manifest(path: str | Path) -> dict:
    return json.loads((Path(path) / MANIFEST).read_text())


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and p.name != MANIFEST)


def _check_files(root: Path, files: dict[str, dict], names: list[str], checksums: bool) -> str | None:
    for name in names:
        want = files[name]
        p = root / name
        try:
            size = p.stat().st_size
        except OSError:
            return f"{name} is missing"
        if size != want["size"]:
            return f"{name} has {size} bytes, the manifest says {want['size']}"
        if checksums and _sha256(p) != want["sha256"]:
            return f"{name} does not match its checksum"
    return None


def verify(path: str | Path, checksums: bool = True, share: tuple[int, int] = (0, 1)) -> str | None:
    """Why the checkpoint at `path` is not intact, or None. `share` = (index, count): check only
    every count-th file from index (each rank of a collective check takes its own share)."""
    path = Path(path)
    try:
        man = read_manifest(path)
        files = man["files"]
        int(man["step"])
    except FileNotFoundError:
        return "no manifest"
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"unreadable manifest ({e})"
    names = sorted(files)
    if not names:
        return "the manifest lists no files"
    if share == (0, 1):
        extra = set(_files(path)) - set(names)
        if extra:
            return f"files the manifest does not list: {sorted(extra)[:3]}"
    return _check_files(path, files, names[share[0]::share[1]], checksums)


def newest_complete(ckpt_dir: str | Path) -> tuple[int, Path] | None:
    """The newest committed checkpoint whose files all have the manifest's sizes (no checksums:
    cheap enough for the scheduler side to say where a relaunch will resume)."""
    for step, path in committed(ckpt_dir):
        if verify(path, checksums=False) is None:
            return step, path
    return None


def save(module: nn.Module, optim: torch.optim.Optimizer, step: int, ckpt_dir: str | Path, meta: dict,
         keep: int = 2) -> tuple[Path, float]:
    """Collective: every rank calls it. Returns (path, seconds)."""
    # imported here: DCP costs 2-3 s of start-up that jobs which never save should not pay
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    t0 = time.perf_counter()
    rank, world = dist.get_rank(), dist.get_world_size()
    ckpt_dir = Path(ckpt_dir)
    final = ckpt_dir / step_name(step)
    tmp = ckpt_dir / (TMP_PREFIX + final.name)
    if rank == 0:
        ckpt_dir.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)  # left by a launch that died while saving this step
    dist.barrier()
    state = {"model": get_model_state_dict(module),
             "optim": get_optimizer_state_dict(module, optim)["state"]}
    try:
        dcp.save(state, checkpoint_id=str(tmp))  # fsyncs every file it writes
        dist.barrier()
        names = _files(tmp)
        mine = {n: {"size": (tmp / n).stat().st_size, "sha256": _sha256(tmp / n)} for n in names[rank::world]}
        shares: list = [None] * world
        dist.all_gather_object(shares, mine)
        if rank == 0:
            files = {k: v for s in shares for k, v in s.items()}
            atomic_write(tmp / MANIFEST, json.dumps({**meta, "step": step, "time": time.time(), "files": files},
                                                    indent=1))
            _commit(tmp, final)
    except BaseException as e:
        # a full disk (DCP raises it wrapped, on every rank): the partial shards go at once, not at the next
        # save, so the space they took is there for the jobs that share the file system; the committed
        # checkpoints, `latest` included, are as they were
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        raise SaveError(_save_failure(step, ckpt_dir, e)) from e
    if rank == 0:
        atomic_write(ckpt_dir / LATEST, final.name)
        _prune(ckpt_dir, keep, final)
    dist.barrier()
    return final, time.perf_counter() - t0


class SaveError(RuntimeError):
    """A checkpoint save that failed; the committed checkpoints are untouched."""


def _save_failure(step: int, ckpt_dir: Path, e: BaseException) -> str:
    # torch reports a full disk inside a zip writer as "unexpected pos 704 vs 598": say what the disk has
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    try:
        free = f"{shutil.disk_usage(ckpt_dir).free / 2**20:.1f} MiB free there"
    except OSError as err:
        free = f"free space unknown: {err.strerror}"
    return (f"checkpoint save of step {step} to {ckpt_dir} failed ({free}): {type(e).__name__}: "
            f"{lines[-1] if lines else e!r}; the committed checkpoints are unchanged")


def _commit(tmp: Path, final: Path) -> None:
    if final.exists():  # the same step saved again by a later launch: the new copy wins
        old = final.with_name(TMP_PREFIX + "old-" + final.name)
        shutil.rmtree(old, ignore_errors=True)
        os.rename(final, old)
        os.rename(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, final)
    fd = os.open(final.parent, os.O_RDONLY)
    try:
        os.fsync(fd)  # the rename itself must survive a crash of the host
    finally:
        os.close(fd)


def _prune(ckpt_dir: Path, keep: int, newest: Path) -> None:
    for _, p in committed(ckpt_dir)[max(1, keep):]:
        if p != newest:
            shutil.rmtree(p, ignore_errors=True)
    for p in ckpt_dir.glob(TMP_PREFIX + "*"):  # saves that a crash interrupted
        shutil.rmtree(p, ignore_errors=True)


@dataclass
class Skipped:
    step: int
    path: str
    reason: str


def load_newest_intact(module: nn.Module, optim: torch.optim.Optimizer, ckpt_dir: str | Path,
                       on_skip: Callable[[Skipped], None] | None = None
                       ) -> tuple[int | None, Path | None, float, list[Skipped], bool]:
    """Collective: load the newest intact checkpoint of `ckpt_dir`.

    Returns (step, path, seconds, skipped, touched): step and path are None when no checkpoint is
    intact (the caller starts from scratch); `touched` says that a failed DCP load may have written
    into the module or optimizer, so a from-scratch start must rebuild them."""
    from torch.distributed.checkpoint.api import CheckpointException

    t0 = time.perf_counter()
    rank, world = dist.get_rank(), dist.get_world_size()
    # every rank must walk the same list: rank 0's listing is the one
    listing = [committed(ckpt_dir) if rank == 0 else None]
    dist.broadcast_object_list(listing, src=0)
    skipped: list[Skipped] = []
    touched = False
    for step, path in listing[0]:
        why = verify(path, share=(rank, world))
        whys: list = [None] * world
        dist.all_gather_object(whys, why)
        reason = next((w for w in whys if w), None)
        if reason is None:
            try:
                got = load(module, optim, path)
            # DCP raises on every rank when any rank fails; its CheckpointException is a BaseException
            except (Exception, CheckpointException) as e:
                touched = True
                lines = [x.strip() for x in str(e).splitlines() if x.strip()]
                # DCP puts the cause last, after the per-rank traceback
                reason = f"DCP load failed: {lines[-1][:300] if lines else type(e).__name__}"
            else:
                return got, path, time.perf_counter() - t0, skipped, touched
        s = Skipped(step, str(path), reason)
        skipped.append(s)
        if on_skip is not None:
            on_skip(s)
    return None, None, time.perf_counter() - t0, skipped, touched


def load(module: nn.Module, optim: torch.optim.Optimizer, path: str | Path) -> int:
    """Collective: load a checkpoint saved under any plan into this rank's shards; returns its step."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (get_model_state_dict, get_optimizer_state_dict,
                                                         set_model_state_dict, set_optimizer_state_dict)

    man = read_manifest(path)
    model_sd = get_model_state_dict(module)
    # creates the optimizer state (zeros, lr 0 step) so there are tensors to load into
    optim_sd = get_optimizer_state_dict(module, optim)
    state = {"model": model_sd, "optim": optim_sd["state"]}
    dcp.load(state, checkpoint_id=str(path))
    set_model_state_dict(module, state["model"])
    set_optimizer_state_dict(module, optim, {"state": state["optim"], "param_groups": optim_sd["param_groups"]})
    return int(man["step"])
