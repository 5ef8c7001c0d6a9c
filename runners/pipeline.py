"""Per-stage plans on the runners: every pipeline stage its own (dp, tp) (`Plan.stage_shapes`).

torch's pipelining library and DeviceMesh assume one (pp, dp, tp) grid, so such a plan runs on its
own process groups and its own 1F1B schedule:

- Ranks: stage by stage; inside stage k its dp_k replicas row-major, tp peers consecutive (the
  uniform plan's layout, and what `Plan.tp_group_error` checks against the nodes).
- Batch: the global batch is cut into `num_microbatches` micro-batches; replica r of stage k runs
  the r-th of dp_k equal shares of every micro-batch. Between stages of different width the
  activations are cut or joined by sample range: each pair of replicas whose ranges overlap
  exchanges exactly that overlap (forward: activations; backward: their gradients, the same slice).
  Tensor-parallel ranks hold replicated activations, so tp rank 0 of a replica sends and every tp
  rank of the receiving replica receives.
- Gradients: the last stage scales each share's mean loss by 1 / (micro-batches x its replicas),
  so every sample weighs 1 / global batch in every stage; each stage then sums its gradients over
  its own replicas (one flat all-reduce). This is the uniform plans' mean gradient.
- Schedule: 1F1B (stage k runs pp - k - 1 warm-up forwards), blocking receives, asynchronous sends
  that are all waited for at the end of the step: no cycle, so no deadlock.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from arena_opt.plan import Plan
from models.catalog import Arch

_DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.int32, torch.float64]
_HEADER = 8  # dtype index, ndim, up to 6 dims


@dataclass(frozen=True)
class Layout:
    """Where every rank of a per-stage plan sits."""

    shapes: list[tuple[int, int]]

    @property
    def offsets(self) -> list[int]:
        out, acc = [], 0
        for dp, tp in self.shapes:
            out.append(acc)
            acc += dp * tp
        return out

    def locate(self, rank: int) -> tuple[int, int, int]:
        """(stage, replica, tp rank) of a global rank."""
        for k, ((dp, tp), off) in enumerate(zip(self.shapes, self.offsets)):
            if rank < off + dp * tp:
                return k, (rank - off) // tp, (rank - off) % tp
        raise ValueError(f"rank {rank} is outside the plan's {sum(d * t for d, t in self.shapes)} ranks")

    def ranks(self, k: int, replica: int) -> list[int]:
        dp, tp = self.shapes[k]
        base = self.offsets[k] + replica * tp
        return list(range(base, base + tp))

    def overlaps(self, k: int, replica: int, other: int, mb: int) -> list[tuple[int, int, int]]:
        """(replica of stage `other`, lo, hi): the sample ranges [lo, hi) of a micro-batch of `mb`
        samples that `replica` of stage k shares with each replica of stage `other`."""
        n, n_o = mb // self.shapes[k][0], mb // self.shapes[other][0]
        lo, hi = replica * n, (replica + 1) * n
        return [(q, max(lo, q * n_o), min(hi, (q + 1) * n_o)) for q in range(self.shapes[other][0])
                if max(lo, q * n_o) < min(hi, (q + 1) * n_o)]


@dataclass
class Groups:
    stage: int
    replica: int
    tp_rank: int
    dp_group: dist.ProcessGroup | None  # this rank's peers over the stage's replicas (same tp rank)
    tp_group: dist.ProcessGroup | None  # this rank's replica's tp ranks


def build_groups(layout: Layout) -> Groups:
    """Collective: every rank creates every group, in the same order (torch.distributed requires it)."""
    rank = dist.get_rank()
    k, r, t = layout.locate(rank)
    dp_group = tp_group = None
    for s, (dp, tp) in enumerate(layout.shapes):
        for ti in range(tp):
            ranks = [layout.ranks(s, ri)[ti] for ri in range(dp)]
            g = dist.new_group(ranks)
            if (s, ti) == (k, t):
                dp_group = g
        for ri in range(dp):
            g = dist.new_group(layout.ranks(s, ri))
            if (s, ri) == (k, r):
                tp_group = g
    return Groups(k, r, t, dp_group, tp_group)


def _send(t: torch.Tensor, dst: int, tag: int, works: list) -> None:
    t = t.detach().contiguous()
    works.append((dist.isend(t, dst, tag=tag), t))  # the tensor lives until the send is waited for


class ShapedPipeline:
    """One training step of this rank's stage under a per-stage plan (see the module doc)."""

    def __init__(self, arch: Arch, plan: Plan, module: nn.Module, layout: Layout, groups: Groups,
                 device: torch.device, loss_fn):
        self.arch, self.plan, self.module, self.layout, self.g = arch, plan, module, layout, groups
        self.device, self.loss_fn = device, loss_fn
        self.k, self.pp, self.m = groups.stage, plan.pp, plan.num_microbatches

    def _recv_input(self, i: int, mb: int) -> torch.Tensor:
        parts = []
        for r, lo, hi in self.layout.overlaps(self.k, self.g.replica, self.k - 1, mb):
            src = self.layout.ranks(self.k - 1, r)[0]
            head = torch.empty(_HEADER, dtype=torch.int64, device=self.device)
            dist.recv(head, src, tag=4 * i)
            dims = [int(v) for v in head[2:2 + int(head[1])]]
            buf = torch.empty(dims, dtype=_DTYPES[int(head[0])], device=self.device)
            dist.recv(buf, src, tag=4 * i + 1)
            parts.append(buf)
        return torch.cat(parts).requires_grad_(True)

    def _send_output(self, i: int, out: torch.Tensor, mb: int, works: list) -> None:
        if self.g.tp_rank:
            return
        n = mb // self.layout.shapes[self.k][0]
        base = self.g.replica * n
        for q, lo, hi in self.layout.overlaps(self.k, self.g.replica, self.k + 1, mb):
            piece = out[lo - base:hi - base]
            head = torch.zeros(_HEADER, dtype=torch.int64, device=self.device)
            head[0], head[1] = _DTYPES.index(piece.dtype), piece.dim()
            head[2:2 + piece.dim()] = torch.tensor(piece.shape)
            for dst in self.layout.ranks(self.k + 1, q):
                _send(head, dst, 4 * i, works)
                _send(piece, dst, 4 * i + 1, works)

    def _recv_grad(self, i: int, out: torch.Tensor, mb: int) -> torch.Tensor:
        n = mb // self.layout.shapes[self.k][0]
        base = self.g.replica * n
        grad = torch.empty_like(out)
        for q, lo, hi in self.layout.overlaps(self.k, self.g.replica, self.k + 1, mb):
            view = grad[lo - base:hi - base]
            buf = torch.empty_like(view)
            dist.recv(buf, self.layout.ranks(self.k + 1, q)[0], tag=4 * i + 2)
            view.copy_(buf)
        return grad

    def _send_grad(self, i: int, inp: torch.Tensor, mb: int, works: list) -> None:
        if self.g.tp_rank:
            return
        n = mb // self.layout.shapes[self.k][0]
        base = self.g.replica * n
        for r, lo, hi in self.layout.overlaps(self.k, self.g.replica, self.k - 1, mb):
            for dst in self.layout.ranks(self.k - 1, r):
                _send(inp.grad[lo - base:hi - base], dst, 4 * i + 2, works)

    def step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor | None:
        """Forward + backward of the global batch (x, y); the mean loss of this replica's shares on
        last-stage ranks, None elsewhere. Gradients are summed over the stage's replicas."""
        m, k, last = self.m, self.k, self.k == self.pp - 1
        mb = x.shape[0] // m
        dp = self.layout.shapes[k][0]
        n = mb // dp
        works: list = []
        saved: dict[int, tuple[torch.Tensor | None, torch.Tensor]] = {}
        total = torch.zeros((), device=self.device)

        def forward(i: int) -> None:
            nonlocal total
            lo = i * mb + self.g.replica * n
            if k == 0:
                inp = None
                out = self.module(x[lo:lo + n].to(self.device))
            else:
                inp = self._recv_input(i, mb)
                out = self.module(inp)
            if last:
                loss = self.loss_fn(out, y[lo:lo + n].to(self.device))
                total += loss.detach() / m
                out = loss / (m * dp)
            else:
                self._send_output(i, out, mb, works)
            saved[i] = (inp, out)

        def backward(i: int) -> None:
            inp, out = saved.pop(i)
            if last:
                out.backward()
            else:
                out.backward(self._recv_grad(i, out, mb))
            if inp is not None:
                self._send_grad(i, inp, mb, works)

        warm = min(self.pp - k - 1, m)
        for i in range(warm):
            forward(i)
        for i in range(m - warm):
            forward(warm + i)
            backward(i)
        for i in range(m - warm, m):
            backward(i)
        for w, _ in works:
            w.wait()
        self._sum_grads()
        return total if last else None

    def _sum_grads(self) -> None:
        if self.layout.shapes[self.k][0] == 1:
            return
        grads = [_local(p.grad) for p in self.module.parameters() if p.grad is not None]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=self.g.dp_group)
        at = 0
        for g in grads:
            g.copy_(flat[at:at + g.numel()].view_as(g))
            at += g.numel()


def _local(t: torch.Tensor) -> torch.Tensor:
    """The rank's own storage of a (possibly tensor-parallel DTensor) gradient."""
    return t._local_tensor if hasattr(t, "_local_tensor") else t
