"""Run a worker function as `world` CPU gloo ranks in spawned processes and collect what each put on
the queue; a worker reports its exception as text rather than losing it in a child's stderr."""

from __future__ import annotations

import os
import socket


def init_rank(rank: int, world: int, port: int) -> None:
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)


def run_ranks(worker, world: int, *args, timeout_s: float = 240) -> list:
    """`worker(rank, world, port, *args, queue)` in `world` processes; the items they put, one each."""
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, world, port, *args, queue)) for r in range(world)]
    for p in procs:
        p.start()
    try:
        return [queue.get(timeout=timeout_s) for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
