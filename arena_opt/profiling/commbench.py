"""Collective micro-benchmarks with torch.distributed (gloo on CPU, NCCL on GPUs): all-reduce,
all-gather, reduce-scatter and point-to-point over a range of message sizes and group sizes, then a
latency-bandwidth (alpha-beta) fit per collective (`arena_opt.perf.comm.fit_alpha_beta`).

Sizes are bytes of the collective's full buffer (all-reduce input, all-gather output, reduce-scatter
input, p2p message). A point's time is the slowest rank's median over `repeats` calls after
`warmup`; p2p is half a ping-pong between ranks 0 and 1. Each point also records the CPU time a
rank's process spends on the collective (mean over ranks, median over calls; all threads, gloo's
included): on a CPU host the collectives' copies, reductions and socket work compete with compute
for the cores, and a second alpha-beta fit of these CPU times lets the composition charge them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from arena_opt.perf.comm import COLLECTIVES, fit_alpha_beta
from arena_opt.perf.profile_db import CommFit
from arena_opt.profiling.measure import launch
from runners.launch import free_port
from arena_opt.io import atomic_write

DEFAULT_SIZES = tuple(4 ** k * 1024 for k in range(0, 8))  # 1 KiB .. 16 MiB


def _bench(rank: int, world: int, port: int, sizes: list[int], warmup: int, repeats: int, out: str,
           device: str) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dev = torch.device("cuda", rank) if device == "cuda" else torch.device("cpu")
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    dist.init_process_group("nccl" if dev.type == "cuda" else "gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=rank, world_size=world)

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    points = []
    for nbytes in sizes:
        n = max(world, nbytes // 4 // world * world)  # float32 elements, divisible by the group
        x = torch.ones(n, device=dev)
        ops = {
            "all_reduce": lambda: dist.all_reduce(x),
            "all_gather": lambda: dist.all_gather_into_tensor(torch.empty(n, device=dev), x[: n // world]),
            "reduce_scatter": lambda: dist.reduce_scatter_tensor(torch.empty(n // world, device=dev), x),
        }
        if world >= 2:
            def p2p() -> None:
                if rank == 0:
                    dist.send(x, 1)
                    dist.recv(x, 1)
                elif rank == 1:
                    dist.recv(x, 0)
                    dist.send(x, 0)
            ops["p2p"] = p2p
        for name, op in ops.items():
            times, cpus = [], []
            for r in range(warmup + repeats):
                dist.barrier()
                sync()
                c0, t0 = time.process_time(), time.perf_counter()
                op()
                sync()
                dt = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
                dc = torch.tensor([time.process_time() - c0], dtype=torch.float64)
                dist.all_reduce(dt, op=dist.ReduceOp.MAX)
                dist.all_reduce(dc)
                if r >= warmup:
                    half = 2 if name == "p2p" else 1
                    times.append(float(dt) / half)
                    # p2p: only ranks 0 and 1 take part
                    cpus.append(float(dc) / (2 if name == "p2p" else world) / half)
            points.append({"collective": name, "group": 2 if name == "p2p" else world, "bytes": n * 4,
                           "seconds": statistics.median(times), "cpu_seconds": statistics.median(cpus)})
    if rank == 0:
        atomic_write(out, json.dumps(points))
    dist.destroy_process_group()


def run(world_sizes: tuple[int, ...] = (2, 4), sizes: tuple[int, ...] = DEFAULT_SIZES, warmup: int = 2,
        repeats: int = 5, device: str = "cpu", timeout_s: float = 900, progress=None) -> list[dict]:
    """Measured points of every collective at every (group size, message size)."""
    points = []
    for w in world_sizes:
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "points.json")
            launch("arena_opt.profiling.commbench", w,
                   ["--port", str(free_port()), "--sizes", ",".join(map(str, sizes)), "--warmup", str(warmup),
                    "--repeats", str(repeats), "--out", out, "--device", device], timeout_s)
            points += json.loads(Path(out).read_text())
        if progress:
            progress(f"[profile] collectives over {w} processes: {len(sizes)} sizes x {len(COLLECTIVES)} "
                     f"collectives in {time.perf_counter() - t0:.0f} s")
    return points


def fit(points: list[dict], device: str, backend: str, link: str, cores: int | None = None) -> list[CommFit]:
    """Alpha-beta fits per collective: one over all group sizes (through the ring factors) and one
    per group size. Processes sharing fewer cores than they are (4 ranks on 2 CPU cores) pay
    scheduling delays the ring factors do not describe; the per-group fits keep them. Points with
    `cpu_seconds` get a fit of the per-rank CPU time too; `cores`: the host's cores they ran on."""
    out = []
    for coll in COLLECTIVES:
        pts = [p for p in points if p["collective"] == coll]
        groups = sorted({p["group"] for p in pts})
        for group in [None, *groups] if len(groups) > 1 else [None]:
            sel = [p for p in pts if group is None or p["group"] == group]
            if len(sel) < 2:
                continue
            ab, err = fit_alpha_beta(coll, [p["group"] for p in sel], [p["bytes"] for p in sel],
                                     [p["seconds"] for p in sel])
            cpu = {}
            if all(p.get("cpu_seconds", 0) > 0 for p in sel):
                cab, cerr = fit_alpha_beta(coll, [p["group"] for p in sel], [p["bytes"] for p in sel],
                                           [p["cpu_seconds"] for p in sel])
                cpu = dict(cpu_alpha_s=cab.alpha_s, cpu_bandwidth_bps=cab.bandwidth_bps, cpu_mean_rel_err=cerr,
                           cores=cores, cpu_points=[(p["group"], p["bytes"], p["cpu_seconds"]) for p in sel])
            out.append(CommFit(device=device, backend=backend, link=link, collective=coll, group=group,
                               alpha_s=ab.alpha_s, bandwidth_bps=ab.bandwidth_bps, mean_rel_err=err,
                               points=[(p["group"], p["bytes"], p["seconds"]) for p in sel], **cpu))
    return out


def _main() -> None:
    ap = argparse.ArgumentParser()
    for name, typ in (("--rank", int), ("--world", int), ("--port", int), ("--sizes", str), ("--warmup", int),
                      ("--repeats", int), ("--out", str), ("--device", str)):
        ap.add_argument(name, type=typ, required=True)
    a = ap.parse_args()
    _bench(a.rank, a.world, a.port, [int(s) for s in a.sizes.split(",")], a.warmup, a.repeats, a.out, a.device)


if __name__ == "__main__":
    _main()
