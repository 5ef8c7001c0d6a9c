"""Which layers each pipeline stage holds, and whether a plan can run a model at
all; torch-free so the scheduler side can reject a plan before launching it."""

from __future__ import annotations

from arena_opt.plan import Plan
from models.catalog import Arch
from models.layers import layer_table


class PlanError(ValueError):
    """The plan cannot run this model (sizes not divisible, unsupported combination)."""


def default_stages(arch: Arch, pp: int) -> list[tuple[int, int]]:
    """Contiguous split balancing forward FLOPs (each stage gets at least one layer)."""
    flops = layer_table(arch).flops_fwd
    n = len(flops)
    if pp > n:
        raise PlanError(f"pp = {pp} exceeds the {n} layers of {arch.name}")
    total = float(flops.sum()) or 1.0
    cuts, acc, k = [0], 0.0, 1
    for i, f in enumerate(flops[:-1]):
        acc += float(f)
        # cut when this stage reached its share, leaving one layer for every later stage
        if k < pp and (acc >= total * k / pp or n - (i + 1) == pp - k):
            cuts.append(i + 1)
            k += 1
    cuts.append(n)
    return [(cuts[i], cuts[i + 1]) for i in range(pp)]


def check_plan(arch: Arch, plan: Plan) -> list[tuple[int, int]]:
    """Stages the plan runs with; raises PlanError naming the field and value."""
    stages = list(plan.stages) or default_stages(arch, plan.pp)
    n = layer_table(arch).num_layers
    if stages[-1][1] != n:
        raise PlanError(f"plan.stages {stages} must end at layer {n} (the {arch.name} layer count)")
    tp = plan.tp
    if tp > 1:
        if arch.family == "wide_resnet":
            raise PlanError("plan.tp: tensor parallelism over convolution channels is not implemented "
                            f"in the runners (tp = {tp} for {arch.name})")
        kv = arch.kv_heads or arch.heads
        for what, v in (("heads", arch.heads), ("kv_heads", kv), ("ffn", arch.ffn_size), ("vocab", arch.vocab)):
            if v % tp:
                raise PlanError(f"plan.tp = {tp} does not divide {arch.name} {what} = {v}")
    return stages


def scale_plan(plan: Plan, full: Arch, scaled: Arch) -> Plan:
    """The plan with its stage split carried from the catalog model's layers onto a
    scaled-down model's (proportional cuts, each stage kept non-empty): a decision made
    for the full model runs on the CPU-sized one with the same shape."""
    if not plan.stages or full == scaled:
        return plan
    n, m = layer_table(full).num_layers, layer_table(scaled).num_layers
    if plan.pp > m:
        raise PlanError(f"plan.pp = {plan.pp} exceeds the {m} layers of the scaled model {scaled.name}; "
                        "scale it with more layers")
    cuts = [round(a * m / n) for a, _ in plan.stages] + [m]
    for k in range(1, plan.pp):
        cuts[k] = max(cuts[k], cuts[k - 1] + 1)
    for k in range(plan.pp - 1, 0, -1):
        cuts[k] = min(cuts[k], cuts[k + 1] - 1)
    return plan.model_copy(update={"stages": [(cuts[k], cuts[k + 1]) for k in range(plan.pp)]})
