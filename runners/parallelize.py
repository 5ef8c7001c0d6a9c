"""The one place that maps a Plan onto a model: a (pp, dp, tp) DeviceMesh, the
pipeline stage this rank holds (layers `plan.stages[pp_rank]`), tensor
parallelism on attention / MLP / experts / embedding / head, data parallelism
(DDP or FSDP2) and the 1F1B schedule that drives one training step.

Ranks are laid out (pp, dp, tp) row-major, so tensor-parallel peers are
consecutive ranks (torchrun gives one node consecutive ranks: tp stays inside a node).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from arena_opt.plan import Plan
from models.catalog import Arch
from models.torch_layers import (MLP, Embedding, Head, LayerStack, TransformerBlock, layer_kinds, loss_fn,
                                 training_autocast, training_precision)
from arena_opt.stages import PlanError, check_plan


def _check_world(plan: Plan) -> None:
    world = dist.get_world_size()
    if world != plan.num_gpus:
        what = "pp*dp*tp" if plan.uniform else "the sum of stage dp*tp"
        raise PlanError(f"plan {what} = {plan.num_gpus} but torchrun started {world} processes")


def build_mesh(plan: Plan, device_type: str) -> DeviceMesh:
    _check_world(plan)
    return init_device_mesh(device_type, (plan.pp, plan.dp, plan.tp), mesh_dim_names=("pp", "dp", "tp"))


def _tensor_parallel(stack: LayerStack, tp_mesh: DeviceMesh) -> None:
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    for layer in stack.layers.values():
        plan: dict[str, object] = {}
        if isinstance(layer, Embedding):
            # vocabulary-parallel: each rank holds vocab/tp rows, the lookups are all-reduced
            plan["tok"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())
        elif isinstance(layer, Head):
            plan["out"] = ColwiseParallel(output_layouts=Replicate())
        elif isinstance(layer, TransformerBlock):
            plan.update({"attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(), "attn.v": ColwiseParallel(),
                         "attn.o": RowwiseParallel()})
            mlps = ([("ffn", layer.ffn)] if isinstance(layer.ffn, MLP)
                    else [(f"ffn.experts.{e}", m) for e, m in enumerate(layer.ffn.experts)])
            for prefix, mlp in mlps:
                plan[f"{prefix}.w1"] = ColwiseParallel()
                plan[f"{prefix}.w2"] = RowwiseParallel()
                if mlp.w3 is not None:
                    plan[f"{prefix}.w3"] = ColwiseParallel()
        if plan:
            parallelize_module(layer, tp_mesh, plan)  # type: ignore[arg-type]


@dataclass
class ParallelModel:
    arch: Arch
    plan: Plan
    mesh: DeviceMesh
    device: torch.device
    module: nn.Module  # this rank's stage (wrapped for data parallelism); state dicts come from it
    stage: tuple[int, int]
    step_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor | None]
    is_last_stage: bool
    dp_rank: int
    tp_rank: int
    # the batch share step_fn gets: (index, count) equal parts of the global batch; a per-stage plan's
    # schedule takes the whole batch and cuts each stage's shares itself
    batch_share: tuple[int, int]
    loss_replicas: int  # last-stage replicas whose mean losses make the batch's mean

    @property
    def reports_loss(self) -> bool:
        """The ranks whose losses, divided by loss_replicas, sum to the batch's mean loss."""
        return self.is_last_stage and self.tp_rank == 0

    def local_batch(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        index, count = self.batch_share
        n = x.shape[0] // count
        s = slice(index * n, (index + 1) * n)
        return x[s].to(self.device), y[s].to(self.device)

    def train_step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor | None:
        """Forward + backward of one global batch (gradients synchronised over dp);
        returns this dp shard's mean loss on last-stage ranks, None elsewhere."""
        xl, yl = self.local_batch(x, y)
        with training_autocast(self.device):
            return self.step_fn(xl, yl)


def parallelize(arch: Arch, plan: Plan, device: torch.device, dp_mode: str = "ddp", seed: int = 0) -> ParallelModel:
    stages = check_plan(arch, plan)
    if not plan.uniform:
        return _parallelize_shaped(arch, plan, stages, device, seed)
    mesh = build_mesh(plan, device.type)
    pp_rank = mesh["pp"].get_local_rank()
    dp_rank = mesh["dp"].get_local_rank()
    first, last = stages[pp_rank]
    # built on the device with weights that depend only on (seed, layer index): every plan starts equal
    with torch.device(device):
        stack = LayerStack(arch, first, last, seed=seed, recompute=plan.recompute)
    if plan.tp > 1:
        _tensor_parallel(stack, mesh["tp"])
    module: nn.Module = stack
    # DDP cannot hold DTensor parameters (tp > 1) and its bucket rebuild breaks under the
    # pipeline schedule's per-micro-batch backward (INTERNAL ASSERT in reducer.cpp, seen with
    # pp2 x dp2 on torch 2.13): 2-D/3-D plans shard data parallelism with FSDP2 instead
    use_fsdp = plan.dp > 1 and (dp_mode == "fsdp" or plan.tp > 1 or plan.pp > 1)
    if use_fsdp:
        from torch.distributed.fsdp import fully_shard

        for layer in [*stack.layers.values(), stack]:
            # registered before fully_shard, so it runs before FSDP2's post-forward hook sees the output
            layer.register_forward_hook(_own_storage)
            fully_shard(layer, mesh=mesh["dp"])
    elif plan.dp > 1:
        module = nn.parallel.DistributedDataParallel(
            stack, process_group=mesh["dp"].get_group(),
            device_ids=[device.index] if device.type == "cuda" else None)
    nm = plan.num_microbatches
    is_last = pp_rank == plan.pp - 1

    if plan.pp == 1:
        def step_fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            total = torch.zeros((), device=device)
            for i, (xc, yc) in enumerate(zip(x.chunk(nm), y.chunk(nm))):
                final = i == nm - 1
                _sync(module, final)
                loss = loss_fn(module(xc), yc) / nm
                loss.backward()
                total += loss.detach()
            _sync(module, True)
            return total
    else:
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B

        schedules: dict[tuple[int, ...], Schedule1F1B] = {}

        def schedule_for(x: torch.Tensor) -> Schedule1F1B:
            # built once per micro-batch shape: a stage with example inputs and outputs skips the
            # library's shape inference, which runs the stage's forward on uninitialised buffers;
            # MoE routing on that garbage differs between tp ranks, their expert shapes with it, and
            # the DTensor collectives then mismatch (gloo size error) or hang
            key = tuple(x.shape)
            if key not in schedules:
                examples = _stage_examples(arch, (first, last), x, nm, device)
                stage = PipelineStage(module, pp_rank, plan.pp, device, group=mesh["pp"].get_group(),
                                      **(examples or {}))
                # scale_grads: gradients are the mean over micro-batches, as in the other plans
                schedules[key] = Schedule1F1B(stage, n_microbatches=nm, loss_fn=loss_fn, scale_grads=True)
            return schedules[key]

        def step_fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor | None:
            schedule = schedule_for(x)
            if pp_rank == 0:
                schedule.step(x)
                return None
            if is_last:
                losses: list[torch.Tensor] = []
                schedule.step(target=y, losses=losses)
                return torch.stack([t.detach() for t in losses]).mean()
            schedule.step()
            return None

    return ParallelModel(arch, plan, mesh, device, module, (first, last), step_fn, is_last, dp_rank,
                         mesh["tp"].get_local_rank(), (dp_rank, plan.dp), plan.dp)


def _parallelize_shaped(arch: Arch, plan: Plan, stages: list[tuple[int, int]], device: torch.device,
                        seed: int) -> ParallelModel:
    """A per-stage plan (runners/pipeline.py): the stage's layers, tp over the replica's own ranks,
    replicas kept in step by the schedule's gradient sum (no DDP/FSDP wrapper: the module stays the
    plain stack, so checkpoints reshard to and from any plan by parameter name)."""
    from runners.pipeline import Layout, ShapedPipeline, build_groups

    _check_world(plan)
    layout = Layout(plan.shapes)
    groups = build_groups(layout)
    first, last = stages[groups.stage]
    with torch.device(device):
        stack = LayerStack(arch, first, last, seed=seed, recompute=plan.recompute)
    dp, tp = plan.shapes[groups.stage]
    tp_mesh = DeviceMesh.from_group(groups.tp_group, device.type)
    if tp > 1:
        _tensor_parallel(stack, tp_mesh)
    pipe = ShapedPipeline(arch, plan, stack, layout, groups, device, loss_fn)
    is_last = groups.stage == plan.pp - 1
    return ParallelModel(arch, plan, tp_mesh, device, stack, (first, last), pipe.step, is_last, groups.replica,
                         groups.tp_rank, (0, 1), plan.shapes[-1][0])


def _stage_examples(arch: Arch, layers: tuple[int, int], x: torch.Tensor, nm: int, device: torch.device
                    ) -> dict[str, torch.Tensor] | None:
    """Example input and output of a transformer stage for one micro-batch of this rank's batch `x`
    (tokens in, hidden states between stages, vocabulary logits out); None for conv stacks, whose
    shapes do not depend on the data, so the library's shape inference is harmless there."""
    if arch.family == "wide_resnet":
        return None
    first, last = layers
    mb = x.shape[0] // nm
    hidden = (mb, arch.seq_len, arch.hidden)
    # activations carry gradients back across the stage boundary: the examples say so
    inp = (torch.zeros((mb, *x.shape[1:]), dtype=x.dtype, device=device) if first == 0
           else torch.zeros(hidden, device=device, requires_grad=True))
    if last == len(layer_kinds(arch)):  # the head's logits: a matrix product's output, in the step's precision
        out = torch.zeros((mb, arch.seq_len, arch.vocab), dtype=training_precision(device), device=device,
                          requires_grad=True)
    else:  # the residual stream stays fp32 under autocast
        out = torch.zeros(hidden, device=device, requires_grad=True)
    return {"input_args": inp, "output_args": out}


def _own_storage(module: nn.Module, args, output):
    """A view output of an FSDP2-wrapped module (tensor-parallel embedding and head return one:
    DTensor.to_local is a view) carries FSDP2's pre-backward hook on a tensor whose base an in-place op
    could replace, silently skipping the all-gather in backward: hand FSDP2 a tensor of its own."""
    if isinstance(output, torch.Tensor) and output._base is not None:
        return output.clone()
    return None


def _sync(module: nn.Module, enabled: bool) -> None:
    """Gradient synchronisation only on the last micro-batch of a step."""
    if isinstance(module, nn.parallel.DistributedDataParallel):
        module.require_backward_grad_sync = enabled
    elif hasattr(module, "set_requires_gradient_sync"):  # FSDP2 (not imported unless the plan uses it)
        module.set_requires_gradient_sync(enabled)
