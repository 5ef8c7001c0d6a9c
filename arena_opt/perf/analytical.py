"""Analytical per-layer costs: FLOPs and bytes on each GPU type's roofline, collectives
on the link they cross (alpha-beta), memory of mixed-precision Adam training.

Every time is linear in a few rates (`RATE_NAMES`): a layer's forward pass on a micro-batch
of b samples is

    (flops + saturation * flops / b) / (compute_eff * peak) + bytes / (mem_eff * mem_bw) + overhead

(matrix products run at the compute roof, the element-wise operations around them at the
memory roof: the per-operator roofline summed over a layer; small micro-batches do not fill
the GPU); rematerialisation adds `recompute_cost` of a forward's matrix products and every
stage pays `microbatch_overhead_s` per micro-batch slot; a collective is bytes / (link efficiency * bandwidth) + messages * alpha.
`layer_terms` returns the coefficients of each rate, `LayerTerms.costs` multiplies them out;
`calibrate` fits the rates to measured tables on these same coefficients.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, NonNegativeFloat, PositiveFloat, PositiveInt, model_validator

from arena_opt.gpus import GpuSpec
from arena_opt.perf.comm import LINK_DEFAULTS
from arena_opt.perf.compose import LayerCosts, take
from models.catalog import Arch
from models.layers import BYTES_FP16, LayerTable, layer_table

GIB = 1024 ** 3
# fp16 weights + fp16 grads + fp32 master weights, Adam m and v (Rajbhandari et al., ZeRO);
# fp32 training holds 4 + 4 + 8, the same 16 bytes
BYTES_PER_PARAM_TRAIN = 2 + 2 + 12
OPTIMIZER_BYTES_PER_PARAM = 12  # of which the fp32 master weights and Adam moments
# element-wise traffic of a forward pass per stored activation byte: written once, read once
EW_TRAFFIC_PER_ACT_BYTE = 2.0
# dense fp16 TFLOP/s of the GPU on which `microbatch_overhead_s` is the slot's cost
MICROBATCH_REF_TFLOPS = 100.0
# dense fp16 TFLOP/s at which `default_compute_eff` is an unseen type's efficiency
EFF_REF_TFLOPS = 100.0
# (lowest, highest) compute efficiency a GPU type is priced with, fitted or read off the peak trend
EFF_BOUNDS = (0.02, 1.0)
# How far beyond the fitted types' peaks the trend is read, as a ratio: the leave-one-type-out fold
# without the A100 reads it at 312 / 149.7 = 2.08x the highest peak it was fitted on and prices the A100
# within 2% (bench/results/estimator.md); further out nothing has checked it, so a faster unseen type
# (an H100, 989 TFLOP/s, against types up to 312) is priced at the edge of that reach, not beyond
PEAK_TREND_REACH = 2.1

Dtype = Literal["fp16", "bf16", "fp32"]
RATE_NAMES = ("compute", "memory", "launch", "intra", "inter", "fixed", "saturation", "recompute", "microbatch")


class CostParams(BaseModel):
    """Tunable constants of the analytical model; `calibrate` fits the efficiencies to measured tables."""

    model_config = ConfigDict(extra="forbid")

    compute_eff: dict[str, PositiveFloat] = Field(default_factory=dict,
                                                   description="achieved fraction of peak FLOP/s per GPU type")
    default_compute_eff: PositiveFloat = Field(0.45, description=(
        "efficiency of a GPU type without its own entry, at EFF_REF_TFLOPS peak (see compute_eff_peak_exponent)"))
    compute_eff_peak_exponent: float = Field(0.0, ge=-1.0, le=1.0, description=(
        "a type without its own efficiency gets default_compute_eff * (peak / EFF_REF_TFLOPS) ** this: the "
        "trend of the fitted types' efficiencies with their dense fp16 peak (0: one efficiency for all)"))
    compute_eff_peak_range: tuple[PositiveFloat, PositiveFloat] | None = Field(None, description=(
        "(lowest, highest) dense fp16 peak, TFLOP/s, of the types the trend was fitted on: an unseen type's "
        "peak is read within [lowest / PEAK_TREND_REACH, highest * PEAK_TREND_REACH]; None: anywhere"))
    fp32_eff_scale: PositiveFloat = Field(1.0, description="fp32 (CUDA-core) efficiency relative to the "
                                                           "tensor-core one, shared by all GPU types")
    mem_eff: PositiveFloat = 0.7  # achieved fraction of memory bandwidth
    intra_eff: dict[str, PositiveFloat] = Field(
        default_factory=lambda: {k: LINK_DEFAULTS[k].efficiency for k in ("nvlink", "pcie")},
        description="achieved fraction of the intra-node link bandwidth in collectives, per link kind")
    inter_comm_eff: PositiveFloat = 0.7  # achieved fraction of the network bandwidth
    alpha_intra_s: NonNegativeFloat = 10e-6  # per-message latency inside a node
    alpha_inter_s: NonNegativeFloat = 30e-6  # per-message latency across nodes
    mem_reserve_gib: float = Field(1.5, ge=0, description="CUDA context, allocator slack, workspace")
    layer_overhead_s: float = Field(40e-6, ge=0, description="kernel launches per layer and pass")
    microbatch_overhead_s: float = Field(0.0, ge=0, description=(
        "fixed cost of one micro-batch slot on one stage whatever its layers: the pipeline runtime's "
        "per-micro-batch kernels, send/recv synchronisation, per-step bookkeeping; paid (m + pp - 1) "
        "times per stage, so many small micro-batches are not free; seconds on a GPU of "
        "MICROBATCH_REF_TFLOPS dense fp16 TFLOP/s, a GPU of peak P pays MICROBATCH_REF_TFLOPS / P of it"))
    recompute_cost: float = Field(1.0, gt=0, le=1.5, description=(
        "matrix-product work of rematerialisation, as a fraction of one forward pass (1 = the whole forward "
        "is redone; less where the runtime keeps some activations or overlaps the recomputation); what "
        "dropping recomputation saves"))
    saturation_samples: dict[str, NonNegativeFloat] = Field(default_factory=dict, description=(
        "per model family, the micro-batch (samples per GPU) at which a layer runs at half its achieved "
        "rate: each layer pass costs as many samples' FLOPs more, so micro-batches of b samples run at "
        "b / (b + this) of the rate; a property of the kernels, the same on every GPU type"))
    # Alpa's Wide-ResNet suite (the runs behind Arena's tables) trains in fp32; transformers in fp16
    dtype_by_family: dict[str, Dtype] = Field(default_factory=lambda: {"wide_resnet": "fp32"})
    moe_einsum_group: PositiveInt | None = Field(
        None, description="GShard-style dense einsum dispatch with this expert group size (Alpa/Arena: "
                          "2048) costs 8*group*hidden FLOPs per token; None = index dispatch (no FLOPs)")
    pipeline_crosses_nodes: bool = Field(False, description=(
        "price every stage boundary on the network once the job spans nodes: stages are laid out node by "
        "node, so some boundary crosses a node whenever pp > 1 and nodes > 1, and the pipeline runs at the "
        "pace of its slowest stage; off: a boundary crosses only where one stage's dp x tp group fills a "
        "node"))
    optimizer_sharded: bool = Field(False, description=(
        "optimizer state (fp32 master weights, Adam moments: 12 of the 16 bytes a parameter costs) of the "
        "weights replicated over dp sharded over the dp ranks (ZeRO stage 1; the gradient all-reduce becomes a "
        "reduce-scatter plus an all-gather of the same bytes): each rank holds and updates 1/dp of it"))
    moe_expert_parallel: bool = Field(False, description=(
        "experts of every MoE layer sharded over the stage's data-parallel ranks (GShard expert "
        "parallelism, what Alpa's sharding pass finds for Arena's MoE runs): a rank holds and updates "
        "num_experts/dp experts, their gradients are not all-reduced over dp, and each MoE layer pays two "
        "all-to-alls of its routed tokens per pass on the dp group's link; off: experts replicated like "
        "any weight (this project's torch runners)"))

    @model_validator(mode="after")
    def _peak_range_ordered(self) -> CostParams:
        r = self.compute_eff_peak_range
        if r is not None and r[0] > r[1]:
            raise ValueError(f"compute_eff_peak_range must be (lowest, highest), got {list(r)}")
        return self

    def eff(self, gpu: str, peak_tflops: float, dtype: str = "fp16") -> float:
        """Achieved fraction of peak of GPU type `gpu` (dense fp16 peak `peak_tflops`) in `dtype`."""
        e = self.compute_eff.get(gpu)
        if e is None:
            if self.compute_eff_peak_range is not None:
                lo, hi = self.compute_eff_peak_range
                peak_tflops = min(max(peak_tflops, lo / PEAK_TREND_REACH), hi * PEAK_TREND_REACH)
            e = self.default_compute_eff * (peak_tflops / EFF_REF_TFLOPS) ** self.compute_eff_peak_exponent
            e = min(max(e, EFF_BOUNDS[0]), EFF_BOUNDS[1])
        return e * self.fp32_eff_scale if dtype == "fp32" else e

    def link_eff(self, kind: str) -> float:
        return self.intra_eff.get(kind, LINK_DEFAULTS[kind].efficiency)

    def dtype(self, family: str) -> Dtype:
        return self.dtype_by_family.get(family, "fp16")


# the parameters calibrated on Arena's measured table, all GPU types (bench/estimator.py writes them)
CALIBRATED_PATH = Path(__file__).with_name("calibrated_params.json")


@lru_cache(maxsize=1)
def _calibrated_json() -> str | None:
    return CALIBRATED_PATH.read_text() if CALIBRATED_PATH.is_file() else None


def calibrated_params() -> CostParams:
    """The committed calibrated parameters: what the planner prices with unless given others, so the
    scheduler decides on the model fitted to measurements and the committed error band (perf/band.py,
    residuals of the same fit) describes the parameters in use. They keep the fit's setting of the measured
    runtime (Alpa's GShard einsum dispatch for MoE, fp32 Wide-ResNet): efficiencies fitted on those FLOPs
    hold only with them. `CostParams()` (uncalibrated) where the file is not there. A fresh copy each call."""
    text = _calibrated_json()
    return CostParams.model_validate_json(text) if text is not None else CostParams()


@dataclass(frozen=True)
class Links:
    """Nominal bandwidths (bytes/s, before `comm_eff`) and latencies (s) one job sees on its shape."""

    intra_bw: float
    inter_bw: float
    alpha_intra: float
    alpha_inter: float
    intra_kind: str = "nvlink"
    pipeline_crosses_nodes: bool = False  # CostParams.pipeline_crosses_nodes


def intra_link_kind(gpu: GpuSpec, intra_link: str | None) -> str:
    return "nvlink" if (intra_link in (None, "nvlink") and gpu.nvlink_bw_gbs) else "pcie"


def links_for(gpu: GpuSpec, intra_link: str | None, params: CostParams) -> Links:
    kind = intra_link_kind(gpu, intra_link)
    intra = (gpu.nvlink_bw_gbs if kind == "nvlink" else gpu.pcie_bw_gbs) * 1e9
    # inter-node traffic also crosses PCIe to reach the NIC
    inter = min(gpu.inter_node_bw_gbs, gpu.pcie_bw_gbs) * 1e9
    return Links(intra, inter, params.alpha_intra_s, params.alpha_inter_s, kind, params.pipeline_crosses_nodes)


def allreduce_s(nbytes: np.ndarray | float, n: int, bw: float, alpha: float) -> np.ndarray | float:
    """Ring all-reduce of nbytes among n ranks."""
    if n <= 1:
        return 0.0 * nbytes
    return 2 * (n - 1) / n * nbytes / bw + 2 * (n - 1) * alpha


@dataclass(frozen=True)
class CostTable(LayerTable):
    """A layer table as one runtime executes it: precision and implementation-specific FLOPs."""

    dtype: Dtype = "fp16"
    family: str = ""
    extra_flops: np.ndarray | None = None  # forward FLOPs per sample the layer table does not count
    # under expert parallelism: expert FFN parameters per layer (sharded over dp) and bytes per sample
    # of one all-to-all of the routed tokens (top-k copies of each token's hidden state)
    expert_params: np.ndarray | None = None
    a2a_bytes: np.ndarray | None = None
    optimizer_sharded: bool = False  # CostParams.optimizer_sharded

    @property
    def bytes_scale(self) -> float:
        return 2.0 if self.dtype == "fp32" else 1.0  # the layer table counts 2-byte values


@lru_cache(maxsize=None)
def _cost_table(arch: Arch, dtype: Dtype, moe_group: int | None, expert_parallel: bool = False,
                optimizer_sharded: bool = False) -> CostTable:
    t = layer_table(arch)
    extra = np.zeros(t.num_layers)
    is_moe = np.array([k == "moe_block" for k in t.kinds])
    if moe_group is not None and arch.family != "wide_resnet":
        # dispatch einsum GSEC,GSM->EGCM and combine GSEC,GECM->GSM with capacity C = 2S/E:
        # 4*S*h FLOPs per token each (Alpa's compute_moe_tflops counts the same)
        extra = np.where(is_moe, 8.0 * moe_group * arch.hidden * arch.seq_len, 0.0)
    extra.setflags(write=False)
    experts = a2a = None
    if expert_parallel and is_moe.any():
        mlp = (3 if arch.gated_mlp else 2) * arch.hidden * arch.ffn_size
        experts = np.where(is_moe, float(mlp * arch.num_experts), 0.0)
        # capacity 2S/E per expert of top-2 routing: the dispatched tensor holds k token copies
        a2a = np.where(is_moe, float(min(arch.moe_top_k, arch.num_experts) * arch.seq_len * arch.hidden
                                     * BYTES_FP16), 0.0)
        experts.setflags(write=False)
        a2a.setflags(write=False)
    fields = {f: getattr(t, f) for f in t.__dataclass_fields__}
    return CostTable(**fields, dtype=dtype, family=arch.family, extra_flops=extra, expert_params=experts,
                     a2a_bytes=a2a, optimizer_sharded=optimizer_sharded)


def cost_table(arch: Arch, params: CostParams) -> CostTable:
    return _cost_table(arch, params.dtype(arch.family), params.moe_einsum_group, params.moe_expert_parallel,
                       params.optimizer_sharded)


def peak_flops(gpu: GpuSpec, dtype: str) -> float:
    tflops = gpu.fp32_tflops if dtype == "fp32" and gpu.fp32_tflops else gpu.peak_tflops
    return tflops * 1e12


@dataclass(frozen=True)
class LayerTerms:
    """Coefficients (rates x layers) of each time field of `LayerCosts`, plus memory (bytes)."""

    step: np.ndarray
    p2p: np.ndarray
    allreduce: np.ndarray
    optim: np.ndarray
    static_bytes: np.ndarray
    act_bytes: np.ndarray
    peak_bytes: np.ndarray
    microbatch: np.ndarray  # (..., rates): per stage and micro-batch slot, whatever the stage's layers

    def costs(self, rates: np.ndarray) -> LayerCosts:
        return LayerCosts(step_s=rates @ self.step, p2p_s=rates @ self.p2p, allreduce_s=rates @ self.allreduce,
                          optim_s=rates @ self.optim, static_bytes=self.static_bytes, act_bytes=self.act_bytes,
                          peak_bytes=self.peak_bytes, microbatch_s=self.microbatch @ rates)

    def stage_row(self, first: int, last: int, m: int, pp: int, sends: bool) -> np.ndarray:
        """Coefficients of `RATE_NAMES` of one stage's time (layers [first, last), m micro-batches, pp stages):
        (m + pp - 1) slots of its layers' step, its boundary send (`sends`: not the last stage) and the slot's
        fixed cost, then its all-reduce and optimizer step. `compose.evaluate_split` prices the same sum."""
        slot = self.step[:, first:last].sum(axis=1) + self.microbatch
        if sends:
            slot = slot + self.p2p[:, last - 1]
        return (m + pp - 1) * slot + self.allreduce[:, first:last].sum(axis=1) + self.optim[:, first:last].sum(axis=1)


def rate_vector(params: CostParams, gpu_name: str, peak_tflops: float, dtype: str = "fp16",
                intra_kind: str = "nvlink", family: str = "") -> np.ndarray:
    """Values of `RATE_NAMES` for one GPU type (dense fp16 peak `peak_tflops`), training precision,
    intra-node link and model family."""
    inv_eff = 1.0 / params.eff(gpu_name, peak_tflops, dtype)
    return np.array([inv_eff, 1.0 / params.mem_eff, params.layer_overhead_s, 1.0 / params.link_eff(intra_kind),
                     1.0 / params.inter_comm_eff, 1.0, params.saturation_samples.get(family, 0.0) * inv_eff,
                     params.recompute_cost * inv_eff, params.microbatch_overhead_s])


@dataclass(frozen=True)
class MicroBatch:
    """Per-layer quantities of one micro-batch on one GPU of a tp group (bytes already in the dtype); with
    arrays of b and tp, one row per candidate."""

    b: np.ndarray  # samples, shaped to broadcast against the layer axis
    flops: np.ndarray  # forward FLOPs
    ew_bytes: np.ndarray  # forward memory traffic: weights + element-wise activation traffic
    tp_bytes: np.ndarray  # bytes of one tp all-reduce set, forward
    out_bytes: np.ndarray  # layer output sent to the next stage
    shard_params: np.ndarray
    full_act: np.ndarray
    in_act: np.ndarray
    dp_params: np.ndarray  # of shard_params, those replicated over dp (their gradients are all-reduced)
    a2a_bytes: np.ndarray  # bytes one rank sends in one expert all-to-all (0 without expert parallelism)


def micro_batch(table: LayerTable, b, tp, ep=1) -> MicroBatch:
    """Quantities for a micro-batch of b samples on one rank of a tp group whose experts are sharded ep
    ways (b, tp, ep: numbers, or arrays of one value per candidate: the results get a leading candidate
    axis)."""
    b = np.asarray(b, dtype=float)[..., None]
    tp = np.asarray(tp)[..., None]
    ep = np.asarray(ep)[..., None]
    scale = getattr(table, "bytes_scale", 1.0)
    extra = getattr(table, "extra_flops", None)
    shard_frac = np.where(table.params > 0, table.tp_params / np.maximum(table.params, 1), 1.0)
    flops = table.flops_fwd * b * (shard_frac / tp + (1 - shard_frac))
    if extra is not None:
        flops = flops + extra * b / tp
    shard_params = table.tp_params / tp + (table.params - table.tp_params)
    experts = getattr(table, "expert_params", None)
    a2a = getattr(table, "a2a_bytes", None)
    dp_params = shard_params
    if experts is not None:
        # experts are tp-sharded weights; ep ranks each keep 1/ep of them (and of their gradients)
        expert_shard = experts / tp / ep
        shard_params = shard_params - experts / tp + expert_shard
        dp_params = np.where(ep > 1, shard_params - expert_shard, shard_params)
    a2a_bytes = (a2a * b / tp * scale * (ep > 1)) if a2a is not None else np.zeros_like(shard_params * b)
    full_act = (table.act_shard / tp + table.act_rep) * b * scale
    ew = shard_params * BYTES_FP16 * scale + EW_TRAFFIC_PER_ACT_BYTE * full_act
    out_bytes = np.concatenate([table.act_in[1:], table.act_in[-1:]]) * b / tp * scale
    return MicroBatch(b, flops, ew, table.tp_comm * b * scale, out_bytes, shard_params, full_act,
                      table.act_in * b * scale, dp_params, a2a_bytes)


def _crossings(nodes, gpus_per_node, dp, tp, links: Links):
    """(the dp gradient all-reduce crosses nodes, a stage boundary crosses nodes): the only way a grid's
    nodes and GPUs per node enter a layer's costs."""
    # the dp group spans nodes once a stage's dp x tp group is larger than a node
    crosses = (nodes > 1) & (dp * tp > gpus_per_node)
    # stage boundaries cross nodes once a stage's dp x tp group fills a node
    p2p_inter = (nodes > 1) & ((dp * tp >= gpus_per_node) | links.pipeline_crosses_nodes)
    return crosses, p2p_inter


def layer_terms(table: LayerTable, gpu: GpuSpec, links: Links, *, nodes: int, gpus_per_node: int, batch: int,
                dp, tp, m, recompute) -> LayerTerms:
    """Per-layer coefficients for one micro-batch of batch/(dp*m) samples under tp-way sharding.

    dp, tp, m, recompute are numbers (one candidate plan: rates x layers arrays) or equal-length arrays
    (a stack of candidates: candidates x rates x layers), so the planner prices all of a grid's
    candidates in one pass; every rule below is written elementwise for that reason."""
    dp, tp, m = np.asarray(dp), np.asarray(tp), np.asarray(m)
    q = micro_batch(table, batch / (dp * m), tp, dp)  # experts (if sharded at all) over the dp ranks
    n = table.num_layers
    V = len(RATE_NAMES)
    lead = np.broadcast_shapes(dp.shape, tp.shape, m.shape, np.shape(recompute))
    dp, tp, rc = dp[..., None], tp[..., None], np.asarray(recompute)[..., None]
    peak = peak_flops(gpu, getattr(table, "dtype", "fp16"))
    mbw = gpu.mem_bw_gbs * 1e9
    passes = np.where(rc, 4.0, 3.0)  # backward = 2 forwards, recomputation one more

    step = np.zeros(lead + (V, n))
    # the recomputed forward's matrix products are priced by their own rate (`recompute_cost`): what
    # dropping recomputation saves is calibrated, not assumed to be a whole forward pass
    step[..., 0, :] = 3.0 * q.flops / peak
    step[..., 7, :] = (passes - 3.0) * q.flops / peak
    step[..., 1, :] = passes * q.ew_bytes / mbw
    step[..., 2, :] = passes
    step[..., 6, :] = passes * q.flops / np.maximum(q.b, 1e-12) / peak  # one more sample's FLOPs per layer pass
    # forward and backward each all-reduce the tp partial sums (nothing at tp = 1)
    a, f = 2 * (tp - 1), 2 * (tp - 1) / tp
    step[..., 3, :] += 2 * f * q.tp_bytes / links.intra_bw
    step[..., 5, :] += 2 * a * links.alpha_intra * (q.tp_bytes > 0)

    crosses, p2p_inter = _crossings(nodes, gpus_per_node, dp, tp, links)
    # expert parallelism: dispatch and combine all-to-all in every pass (forward, backward, recomputed
    # forward), (dp - 1) / dp of the routed tokens leave the rank, on the dp group's slowest link
    a2a = np.where(rc, 6.0, 4.0) * (dp - 1) / dp * q.a2a_bytes
    step[..., 4, :] += np.where(crosses, a2a / links.inter_bw, 0.0)
    step[..., 3, :] += np.where(crosses, 0.0, a2a / links.intra_bw)
    step[..., 5, :] += (np.where(rc, 6.0, 4.0) * (dp - 1) * np.where(crosses, links.alpha_inter, links.alpha_intra)
                        * (q.a2a_bytes > 0))

    p2p = np.zeros(lead + (V, n))
    sent = 2 * q.out_bytes / np.where(p2p_inter, links.inter_bw, links.intra_bw)
    p2p[..., 4, :] = np.where(p2p_inter, sent, 0.0)
    p2p[..., 3, :] = np.where(p2p_inter, 0.0, sent)
    p2p[..., 5, :] = 2 * np.where(p2p_inter, links.alpha_inter, links.alpha_intra)

    # dp gradient all-reduce (nothing at dp = 1)
    ar = np.zeros(lead + (V, n))
    grad_bytes = q.dp_params * BYTES_FP16 * getattr(table, "bytes_scale", 1.0)
    reduced = 2 * (dp - 1) / dp * grad_bytes / np.where(crosses, links.inter_bw, links.intra_bw)
    ar[..., 4, :] = np.where(crosses, reduced, 0.0)
    ar[..., 3, :] = np.where(crosses, 0.0, reduced)
    ar[..., 5, :] = 2 * (dp - 1) * np.where(crosses, links.alpha_inter, links.alpha_intra) * (grad_bytes > 0)

    # the optimizer state a rank holds (and reads and writes once a step): all of its weights' state, or
    # 1/dp of what dp replicates when it is sharded over dp
    state = q.shard_params * BYTES_PER_PARAM_TRAIN
    if getattr(table, "optimizer_sharded", False):
        state = state - q.dp_params * (1 - 1 / dp) * OPTIMIZER_BYTES_PER_PARAM
    optim = np.zeros(lead + (V, n))
    optim[..., 1, :] = state * 2 / mbw  # read + write of the optimizer state and weights the rank updates

    static = np.broadcast_to(state, lead + (n,))
    # with recomputation one layer's activations are rebuilt during its backward
    act = np.broadcast_to(np.where(rc, q.in_act, q.full_act), lead + (n,))
    transient = np.broadcast_to(np.where(rc, q.full_act, 0.0), lead + (n,))
    microbatch = np.zeros(lead + (V,))
    # the slot's fixed work runs on the GPU (per-micro-batch kernels, buffer copies, the boundary's
    # resharding), so a faster GPU pays less of it: microbatch_overhead_s is its time on a GPU of
    # MICROBATCH_REF_TFLOPS. Measured: priced in seconds whatever the GPU, the fit without the A100 rows
    # takes 40 ms a slot and over-prices the A100 by 20% (bench/results/estimator.md)
    microbatch[..., 8] = MICROBATCH_REF_TFLOPS / gpu.peak_tflops
    return LayerTerms(step, p2p, ar, optim, static, act, transient, microbatch)


def layer_costs(table: LayerTable, gpu: GpuSpec, gpu_name: str, links: Links, *, nodes: int,
                gpus_per_node: int, batch: int, dp, tp, m, recompute, params: CostParams) -> LayerCosts:
    """Per-layer costs for one micro-batch of batch/(dp*m) samples under tp-way sharding (a stack of
    candidates when dp, tp, m, recompute are arrays, as in `layer_terms`)."""
    rates = rate_vector(params, gpu_name, gpu.peak_tflops, getattr(table, "dtype", "fp16"), links.intra_kind,
                        getattr(table, "family", ""))
    args = {"nodes": nodes, "gpus_per_node": gpus_per_node, "batch": batch, "dp": dp, "tp": tp, "m": m,
            "recompute": recompute}
    first, inverse = _distinct_candidates(links, **args)
    if first is None:
        return layer_terms(table, gpu, links, **args).costs(rates)
    # a stack's candidates repeat (grids of one model on other pipeline depths, node shapes or batches that
    # give one micro-batch: a cold medium round's 18,100 are 5,500 distinct): each is costed once, and the
    # rows are the same bits as costing every candidate (elementwise rules)
    at = {k: v if np.ndim(v) == 0 else np.asarray(v)[first] for k, v in args.items()}
    return take(layer_terms(table, gpu, links, **at).costs(rates), inverse)


def _distinct_candidates(links: Links, *, nodes, gpus_per_node, batch, dp, tp, m, recompute):
    """(first candidate of each distinct cost, each candidate's distinct cost) of a stack whose arrays all
    have the candidates on their first axis, or (None, None) where there is nothing to share. Two
    candidates cost the same when they agree on every quantity `layer_terms` reads: the micro-batch
    (computed as there), tp, dp, recomputation and where the collectives cross nodes."""
    dp, tp, m = np.asarray(dp), np.asarray(tp), np.asarray(m)
    c = len(dp) if dp.ndim == 1 else 0
    # layer_terms' shapes: per-candidate values as (C,), the grid's nodes and GPUs per node as (C, 1)
    if c < 2 or any(np.shape(x) not in ((), (c,)) for x in (batch, tp, m, recompute)) or any(
            np.shape(x) not in ((), (c, 1)) for x in (nodes, gpus_per_node)):
        return None, None
    crosses, p2p_inter = _crossings(nodes, gpus_per_node, dp[:, None], tp[:, None], links)
    cols = [np.broadcast_to(x, (c,)) for x in (batch / (dp * m), tp, dp, recompute, crosses[:, 0], p2p_inter[:, 0])]
    order = np.lexsort(cols[::-1])
    ranked = np.stack([x[order] for x in cols], axis=1).astype(float)
    new = np.ones(c, dtype=bool)
    new[1:] = np.any(ranked[1:] != ranked[:-1], axis=1)
    if new.all():
        return None, None
    group = np.cumsum(new) - 1
    inverse = np.empty(c, dtype=int)
    inverse[order] = group
    return order[new], inverse


def roofline_load_s(table: LayerTable, gpu: GpuSpec, *, micro_batch_size: float, tp: int = 1,
                    compute_eff: float = 1.0, mem_eff: float = 1.0) -> np.ndarray:
    """Arena's per-layer computation load: forward time of each layer at its attainable
    performance min(peak, arithmetic intensity x memory bandwidth) on this GPU."""
    q = micro_batch(table, micro_batch_size, tp)
    peak = peak_flops(gpu, getattr(table, "dtype", "fp16")) * compute_eff
    bw = gpu.mem_bw_gbs * 1e9 * mem_eff
    intensity = q.flops / np.maximum(q.ew_bytes, 1.0)
    attainable = np.minimum(peak, intensity * bw)
    return np.where(q.flops > 0, q.flops / np.maximum(attainable, 1.0), q.ew_bytes / bw)


__all__ = ["CALIBRATED_PATH", "EFF_BOUNDS", "GIB", "PEAK_TREND_REACH", "CostParams", "CostTable", "Links", "LayerTerms", "RATE_NAMES", "allreduce_s", "calibrated_params", "cost_table",
           "layer_costs", "layer_terms", "links_for", "peak_flops", "rate_vector", "roofline_load_s"]
