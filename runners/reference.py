"""Single-process reference training: the loss sequence an uninterrupted run of
a job yields, computed in this process without torch.distributed. Every plan
computes the same mathematics (mean gradient over the global batch, AdamW), so
distributed runs, resumed or reshaped, are compared against it.

`chunks` reproduces the batch split of a plan (dp x micro-batches): it only
matters for models with BatchNorm, whose statistics are per chunk.
`reset_optimizer_at` re-creates the optimizer before that step: the failure a
checkpoint that lost the optimizer state would produce (a negative control).
"""

from __future__ import annotations

import torch

from models.catalog import Arch
from models.torch_layers import build_layers, loss_fn, synthetic_batch


def reference_losses(arch: Arch, steps: int, global_batch: int, *, seed: int = 0, lr: float = 1e-3,
                     chunks: int = 1, reset_optimizer_at: int | None = None) -> list[float]:
    """Loss after each step 1..steps (the value the runners report for that step)."""
    threads = torch.get_num_threads()
    # one thread: the reference must not slow down (or be slowed by) the training processes beside it
    torch.set_num_threads(1)
    try:
        return _run(arch, steps, global_batch, seed, lr, chunks, reset_optimizer_at)
    finally:
        torch.set_num_threads(threads)


def _run(arch: Arch, steps: int, global_batch: int, seed: int, lr: float, chunks: int,
         reset_optimizer_at: int | None) -> list[float]:
    model = build_layers(arch, seed=seed)
    optim = torch.optim.AdamW(model.parameters(), lr=lr)
    out = []
    for step in range(steps):
        if reset_optimizer_at is not None and step == reset_optimizer_at:
            optim = torch.optim.AdamW(model.parameters(), lr=lr)
        x, y = synthetic_batch(arch, step, global_batch, seed)
        total = 0.0
        for xc, yc in zip(x.chunk(chunks), y.chunk(chunks)):
            loss = loss_fn(model(xc), yc) / chunks
            loss.backward()
            total += loss.item()
        optim.step()
        optim.zero_grad(set_to_none=True)
        out.append(total)
    return out
