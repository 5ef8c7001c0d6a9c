"""Iteration time of any plan from a profile: measured per-layer compute at the plan's micro-batch
and tp shard, plus the collectives the runtime issues, composed by `arena_opt.perf.compose` (the
same min-max stage split and 1F1B formula as the analytical model).

Collectives follow what `runners.parallelize` runs (DTensor tensor parallelism, DDP or FSDP2,
torch pipelining), each timed with the alpha-beta model of the link it crosses: a measured fit
from the profile database when there is one (per group size if measured so), else the link kind's
published default.

Per layer under tp (activations h = b x seq x hidden values):
- embedding (vocabulary-parallel rows): forward all-reduce of h;
- block: forward 2 all-reduces of h (attention and MLP row-parallel outputs); backward one per
  column-parallel input (q, k, v, and w1 [+ w3]);
- MoE block: attention as a block, and one forward and 1-2 backward all-reduces per expert of the
  tokens it received;
- head: forward all-gather of the vocabulary-sharded logits, backward all-reduce of h.
Data parallelism: DDP (pp = tp = 1) all-reduces all gradients once per step; FSDP2 (dp with pp or
tp) all-gathers each layer's parameters in forward and backward of every micro-batch and
reduce-scatters gradients once per step.

Processes that outnumber the host's cores share them: compute is scaled by (world + background) /
cores when above 1, where background is the co-located load in cores (processor sharing; the
`colocation` module computes it for jobs that share a host or a link).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from arena_opt.errors import InputError
from arena_opt.perf.comm import AlphaBeta, default_alpha_beta
from arena_opt.perf.compose import LayerCosts, StageSplit, evaluate_split, split_stages
from arena_opt.plan import Plan
from arena_opt.profiling.db import LayerSample, ModelProfile, ProfileDB

BYTES_PER_PARAM_FP32_ADAM = 4 + 4 + 8  # weights, gradients, Adam m and v
DDP_BUCKET_BYTES = 25 * 2 ** 20


@dataclass(frozen=True)
class CommModel:
    """Alpha-beta per (link, collective, group size); `None` group = any group size."""

    fits: dict[tuple[str, str, int | None], AlphaBeta] = field(default_factory=dict)
    defaults: dict[str, AlphaBeta] = field(default_factory=dict)

    def time(self, collective: str, nbytes: float, n: int, link: str) -> float:
        if nbytes <= 0 or (n <= 1 and collective != "p2p"):
            return 0.0
        ab = self.fits.get((link, collective, n)) or self.fits.get((link, collective, None))
        if ab is None:
            ab = self.defaults.get(link)
        if ab is None:
            ab = default_alpha_beta(link) if link in ("nvlink", "pcie", "infiniband", "ethernet") else None
        if ab is None:
            raise InputError(f"no alpha-beta parameters for {collective} over link {link!r}: run "
                             "`arena-opt profile --comm` on this host or name a known link kind")
        return float(ab.time(collective, nbytes, n))  # type: ignore[arg-type]


def comm_model(db: ProfileDB, device: str, backend: str | None = None,
               defaults: dict[str, AlphaBeta] | None = None) -> CommModel:
    return CommModel(db.comm_fits(device, backend), defaults or {})


@dataclass(frozen=True)
class Topology:
    """Which link each group crosses. On one host every group is `intra`."""

    nodes: int = 1
    gpus_per_node: int = 1
    intra: str = "loopback"
    inter: str = "ethernet"
    cores: int | None = None  # CPU cores the ranks of one host share; None = one device per rank
    background: float = 0.0  # cores busy with co-located work on average (other jobs, other tenants)

    def link(self, group_span: int) -> str:
        """Link of a group of consecutive ranks spanning `group_span` ranks."""
        return self.inter if self.nodes > 1 and group_span > self.gpus_per_node else self.intra


def _interp(samples: list[LayerSample], b: float, attr: str) -> float:
    """Piecewise-linear in the micro-batch size, linear extrapolation past the measured range."""
    xs = np.array([s.micro_batch for s in samples], dtype=float)
    ys = np.array([getattr(s, attr) for s in samples], dtype=float)
    if len(xs) == 1:
        return float(ys[0] * b / xs[0])
    if b <= xs[0]:
        slope = (ys[1] - ys[0]) / (xs[1] - xs[0])
        return float(max(ys[0] + slope * (b - xs[0]), ys[0] * b / xs[0], 0.0))
    if b >= xs[-1]:
        slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
        return float(max(ys[-1] + slope * (b - xs[-1]), 0.0))
    return float(np.interp(b, xs, ys))


@dataclass(frozen=True)
class RuntimeSemantics:
    """Behaviour of the training runtime that changes which collectives run."""

    dp_mode: str = "ddp"  # "ddp": DDP for pure dp, FSDP2 with tp or pp (runners' default); "fsdp": always
    ddp_overlap: float = 0.0  # fraction of the last backward that hides DDP's all-reduce (0 = none)


def _tp_collectives(prof: ModelProfile, kind: str, tp: int, b: float, out_bytes: float
                    ) -> tuple[list[tuple[str, float]], list[tuple[str, float]]]:
    """(forward, backward) collectives of one layer under tp: (collective, bytes) each."""
    if tp <= 1:
        return [], []
    a = prof.arch
    h = b * a.seq_len * a.hidden * 4
    if kind == "embed":
        return [("all_reduce", h)], []
    mlp_in = 2 if a.gated_mlp else 1
    if kind == "block":
        return [("all_reduce", h)] * 2, [("all_reduce", h)] * (3 + mlp_in)
    if kind == "moe_block":
        e = a.num_experts
        per_expert = h * min(a.moe_top_k, e) / e
        return ([("all_reduce", h)] + [("all_reduce", per_expert)] * e,
                [("all_reduce", h)] * 3 + [("all_reduce", per_expert)] * (e * mlp_in))
    if kind == "head":
        return [("all_gather", out_bytes * tp)], [("all_reduce", h)]
    raise InputError(f"tensor parallelism of {kind!r} layers is not modelled (the runners do not shard them)")


def layer_costs(prof: ModelProfile, comm: CommModel, topo: Topology, *, batch: int, dp: int, tp: int, m: int,
                pp: int, recompute: bool = False, semantics: RuntimeSemantics = RuntimeSemantics(),
                compute_scale: np.ndarray | float = 1.0) -> LayerCosts:
    """Per-layer costs of one micro-batch of batch / (dp * m) samples from measured samples at tp.
    `compute_scale` multiplies measured compute per layer (core sharing, or a roofline transfer
    to another device from `transfer_scale`)."""
    if tp not in prof.tp_degrees:
        raise InputError(f"profile of {prof.model} on {prof.device} has no tp = {tp} samples "
                         f"(measured: {prof.tp_degrees})")
    b = batch / (dp * m)
    layers = prof.layer_of()
    n = len(layers)
    world = pp * dp * tp
    scale = np.broadcast_to(np.asarray(compute_scale, dtype=float), (n,))
    if topo.cores:
        scale = scale * max(1.0, (world + topo.background) / topo.cores)
    tp_link = topo.link(tp)
    dp_link = topo.link(dp * tp)
    pp_link = topo.link(world) if pp > 1 else topo.intra
    fsdp = dp > 1 and (semantics.dp_mode == "fsdp" or tp > 1 or pp > 1)

    step, p2p, ar, opt = (np.zeros(n) for _ in range(4))
    static, act, peak = (np.zeros(n) for _ in range(3))
    for i, lp in enumerate(layers):
        samples = lp.at(tp)
        fwd, bwd = _interp(samples, b, "fwd_s"), _interp(samples, b, "bwd_s")
        out_b = _interp(samples, b, "out_bytes")
        params = samples[0].params
        compute = (fwd + bwd + (fwd if recompute else 0.0)) * scale[i]
        f_coll, b_coll = _tp_collectives(prof, lp.kind, tp, b, out_b)
        comm_t = sum(comm.time(c, nb, tp, tp_link) for c, nb in f_coll + b_coll)
        pbytes = params * 4.0
        if fsdp:
            comm_t += 2 * comm.time("all_gather", pbytes, dp, dp_link)
            ar[i] = comm.time("reduce_scatter", pbytes, dp, dp_link)
        step[i] = compute + comm_t
        # the stage boundary after layer i sends its output forward and receives its gradient back
        full_out = out_b * (tp if lp.kind == "head" else 1)
        p2p[i] = 2 * comm.time("p2p", full_out, 2, pp_link)
        opt[i] = samples[0].optim_s / (dp if fsdp else 1)
        static[i] = params * BYTES_PER_PARAM_FP32_ADAM / (dp if fsdp else 1)
        act[i] = _interp(samples, b, "act_bytes")
        if recompute:
            act[i], peak[i] = _interp(samples, b, "out_bytes"), act[i]
    if dp > 1 and not fsdp:
        # DDP: gradients in 25 MiB buckets, all-reduced once per step after the last backward
        total = float(sum(lp.at(tp)[0].params for lp in layers)) * 4.0
        buckets = max(1, math.ceil(total / DDP_BUCKET_BYTES))
        t_ar = buckets * comm.time("all_reduce", total / buckets, dp, dp_link)
        last_bwd = float(sum(_interp(lp.at(tp), b, "bwd_s") for lp in layers))
        exposed = max(t_ar - semantics.ddp_overlap * last_bwd, t_ar / buckets)
        weights = np.array([lp.at(tp)[0].params for lp in layers], dtype=float)
        ar = exposed * weights / max(weights.sum(), 1.0)
    return LayerCosts(step_s=step, p2p_s=p2p, allreduce_s=ar, optim_s=opt, static_bytes=static, act_bytes=act,
                      peak_bytes=peak)


def plan_time(prof: ModelProfile, plan: Plan, batch: int, comm: CommModel, topo: Topology,
              semantics: RuntimeSemantics = RuntimeSemantics(), compute_scale: np.ndarray | float = 1.0
              ) -> StageSplit:
    """Iteration time of a plan with its stages (or the runners' default stages when it has none)."""
    from runners.stages import default_stages

    lc = layer_costs(prof, comm, topo, batch=batch, dp=plan.dp, tp=plan.tp, m=plan.num_microbatches, pp=plan.pp,
                     recompute=plan.recompute, semantics=semantics, compute_scale=compute_scale)
    stages = list(plan.stages) or default_stages(prof.arch, plan.pp)
    return evaluate_split(lc, stages, plan.num_microbatches)


def best_split(prof: ModelProfile, plan: Plan, batch: int, comm: CommModel, topo: Topology, mem_cap_bytes: float,
               semantics: RuntimeSemantics = RuntimeSemantics(), compute_scale: np.ndarray | float = 1.0
               ) -> StageSplit | None:
    """The fastest memory-feasible stage split of a plan's (pp, dp, tp, m) from the profile."""
    lc = layer_costs(prof, comm, topo, batch=batch, dp=plan.dp, tp=plan.tp, m=plan.num_microbatches, pp=plan.pp,
                     recompute=plan.recompute, semantics=semantics, compute_scale=compute_scale)
    if plan.pp == 1:
        res = evaluate_split(lc, [(0, lc.num_layers)], plan.num_microbatches)
        return res if res.mem_bytes[0] <= mem_cap_bytes else None
    return split_stages(lc, plan.pp, plan.num_microbatches, mem_cap_bytes)


def compute_seconds(prof: ModelProfile, plan: Plan, batch: int) -> float:
    """Seconds the busiest rank computes per iteration (forward, backward, recomputation, optimizer),
    without waiting or communication: its busy time on the device, for `colocation`."""
    from runners.stages import default_stages

    b = batch / (plan.dp * plan.num_microbatches)
    layers = prof.layer_of()
    per = []
    for i, lp in enumerate(layers):
        s = lp.at(plan.tp)
        fwd = _interp(s, b, "fwd_s")
        per.append(plan.num_microbatches * (fwd * (2 if plan.recompute else 1) + _interp(s, b, "bwd_s"))
                   + s[0].optim_s)
    stages = list(plan.stages) or default_stages(prof.arch, plan.pp)
    return max(sum(per[a:e]) for a, e in stages)
