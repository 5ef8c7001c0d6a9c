"""Training entry point that torchrun starts on every rank:

    torchrun ... -m runners.train --spec SPEC.json      (or --spec-json '{...}')

Builds the catalog model (scaled down when the spec says so), applies the plan
with `runners.parallelize`, resumes from the newest intact checkpoint in the
spec's checkpoint directory if there is one (reporting every newer one it had
to skip, and why), trains on deterministic synthetic data
and reports progress through `runners.progress`. A stop request (the control
file, SIGTERM or SIGINT) makes every rank save a checkpoint at the same step
boundary and exit 0; all ranks learn of it through the per-step all-reduce.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import resource
import signal
import sys
import time
from typing import Sequence

import torch
import torch.distributed as dist

from runners.progress import ProgressWriter, stop_requested
from runners import checkpoint
from runners.spec import SpecError, TrainSpec, load_spec, parse_spec

EXIT_BAD_SPEC = 2
EXIT_INJECTED_FAULT = 13

_signalled = False


def _on_signal(signum: int, frame: object) -> None:
    global _signalled
    _signalled = True


def _die_with_parent() -> None:
    # torchrun starts each worker in its own session; if torchrun itself is
    # SIGKILLed the workers would live on, so ask the kernel to kill us with it.
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _peak_mem_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def _device(spec: TrainSpec) -> torch.device:
    if spec.device == "cuda" or (spec.device == "auto" and torch.cuda.is_available()):
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    return torch.device("cpu")


def parse_args(argv: Sequence[str] | None) -> TrainSpec:
    ap = argparse.ArgumentParser(prog="runners.train", description=__doc__.split("\n\n")[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--spec", help="path of a TrainSpec JSON file")
    src.add_argument("--spec-json", help="the TrainSpec as inline JSON")
    a = ap.parse_args(argv)
    if a.spec:
        return load_spec(a.spec)
    import json

    try:
        return parse_spec(json.loads(a.spec_json), "--spec-json")
    except json.JSONDecodeError as e:
        raise SpecError(f"--spec-json: not JSON: {e}") from None


def main(argv: Sequence[str] | None = None) -> int:
    _die_with_parent()
    try:
        spec = parse_args(argv)
    except SpecError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_SPEC
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    device = _device(spec)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    try:
        return _train(spec, device)
    finally:
        dist.destroy_process_group()


def _train(spec: TrainSpec, device: torch.device) -> int:
    from models.torch_layers import synthetic_batch
    from runners.parallelize import PlanError, parallelize

    rank = dist.get_rank()
    writer = ProgressWriter(spec.run_dir, spec.generation) if rank == 0 else None
    t_launch = time.time()
    arch = spec.arch()
    try:
        pm = parallelize(arch, spec.plan, device, spec.dp_mode, spec.seed)
    except PlanError as e:
        if writer:
            writer.emit("error", message=str(e))
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_SPEC
    optim = torch.optim.AdamW(pm.module.parameters(), lr=spec.lr)

    def skipped(s: checkpoint.Skipped) -> None:
        if writer:
            writer.emit("ckpt_skipped", step=s.step, path=s.path, reason=s.reason)

    step, path, load_s, skips, touched = checkpoint.load_newest_intact(pm.module, optim, spec.ckpt_dir, skipped)
    resumed_from = None
    if path is not None:
        resumed_from = str(path)
        if writer:
            writer.emit("loaded", step=step, load_s=load_s, path=resumed_from, skipped=len(skips))
    else:
        step = 0
        if touched:  # a failed load may have written part of a checkpoint into the weights
            pm = parallelize(arch, spec.plan, device, spec.dp_mode, spec.seed)
            optim = torch.optim.AdamW(pm.module.parameters(), lr=spec.lr)
    if writer:
        writer.emit("start", step=step, world_size=dist.get_world_size(), plan=spec.plan.model_dump(),
                    resumed_from=resumed_from, setup_s=time.time() - t_launch, pid=os.getpid(),
                    restart=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0)), skipped=len(skips))
    reports_loss = pm.reports_loss
    meta = {"job_id": spec.job_id, "plan": spec.plan.model_dump(), "world_size": dist.get_world_size(),
            "model": arch.name, "samples": 0}
    last_ckpt, last_ckpt_t = step, time.monotonic()
    while step < spec.total_steps:
        if spec.fail_at_step is not None and step == spec.fail_at_step and rank == spec.fail_rank:
            print(f"injected fault at step {step} on rank {rank}", file=sys.stderr, flush=True)
            os._exit(EXIT_INJECTED_FAULT)
        t0 = time.perf_counter()
        x, y = synthetic_batch(arch, step, spec.global_batch, spec.seed)
        loss = pm.train_step(x, y)
        optim.step()
        optim.zero_grad(set_to_none=True)
        # one SUM all-reduce carries the loss (mean over dp shards) and the stop votes
        stop = _signalled or (rank == 0 and stop_requested(spec.run_dir))
        # rank 0's clock decides a timed checkpoint, so every rank saves at the same step
        timed = rank == 0 and spec.ckpt_every_s > 0 and time.monotonic() - last_ckpt_t >= spec.ckpt_every_s
        red = torch.tensor([float(loss) / pm.loss_replicas if reports_loss and loss is not None else 0.0, float(stop),
                            float(timed)], dtype=torch.float64, device=device)
        dist.all_reduce(red)
        mem = torch.tensor([_peak_mem_bytes(device)], dtype=torch.int64, device=device)
        dist.all_reduce(mem, op=dist.ReduceOp.MAX)
        dt = time.perf_counter() - t0
        step += 1
        if writer:
            writer.emit("step", step=step, loss=float(red[0]), iter_time_s=dt,
                        samples_per_s=spec.global_batch / dt, peak_mem_bytes=int(mem[0]))
        stopping = bool(red[1] > 0)
        # with periodic checkpoints on, the final weights are kept too
        periodic = spec.ckpt_interval > 0 or spec.ckpt_every_s > 0
        due = (red[2] > 0 or (spec.ckpt_interval and step % spec.ckpt_interval == 0)
               or (periodic and step == spec.total_steps))
        if (stopping or due) and step != last_ckpt:
            path, save_s = checkpoint.save(pm.module, optim, step, spec.ckpt_dir,
                                           {**meta, "samples": step * spec.global_batch}, spec.keep_checkpoints)
            last_ckpt, last_ckpt_t = step, time.monotonic()
            if writer:
                writer.emit("checkpoint", step=step, path=str(path), save_s=save_s)
        if stopping and step < spec.total_steps:
            if writer:
                writer.emit("exit", reason="stopped", step=step)
            return 0
        if spec.step_delay_s:
            time.sleep(spec.step_delay_s)
    if writer:
        writer.emit("exit", reason="finished", step=step)
    return 0


if __name__ == "__main__":
    rc = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # skip interpreter teardown (3-5 s with torch loaded on a busy 2-core host): the process group
    # is destroyed and every file this process wrote is closed, and a reshape waits for this exit
    os._exit(rc)
