"""Analytical per-layer costs: FLOPs and bytes on each GPU type's roofline, collectives
on the link they cross (alpha-beta), memory of mixed-precision Adam training."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, PositiveFloat

from arena_opt.gpus import GpuSpec
from arena_opt.perf.compose import LayerCosts
from models.layers import BYTES_FP16, LayerTable

GIB = 1024 ** 3
# fp16 weights + fp16 grads + fp32 master weights, Adam m and v (Rajbhandari et al., ZeRO)
BYTES_PER_PARAM_TRAIN = 2 + 2 + 12


class CostParams(BaseModel):
    """Tunable constants of the analytical model; `calibrate` fits the efficiencies to measured tables."""

    model_config = ConfigDict(extra="forbid")

    compute_eff: dict[str, PositiveFloat] = Field(default_factory=dict,
                                                   description="achieved fraction of peak FLOP/s per GPU type")
    default_compute_eff: PositiveFloat = 0.45
    mem_eff: PositiveFloat = 0.7  # achieved fraction of memory bandwidth
    comm_eff: PositiveFloat = 0.7  # achieved fraction of link bandwidth in collectives
    alpha_intra_s: PositiveFloat = 10e-6  # per-message latency inside a node
    alpha_inter_s: PositiveFloat = 30e-6  # per-message latency across nodes
    mem_reserve_gib: float = Field(1.5, ge=0, description="CUDA context, allocator slack, workspace")
    layer_overhead_s: float = Field(40e-6, ge=0, description="kernel launches per layer and pass")

    def eff(self, gpu: str) -> float:
        return self.compute_eff.get(gpu, self.default_compute_eff)


@dataclass(frozen=True)
class Links:
    """Bandwidths (bytes/s) and latencies (s) one job sees on its shape."""

    intra_bw: float
    inter_bw: float
    alpha_intra: float
    alpha_inter: float


def links_for(gpu: GpuSpec, intra_link: str | None, params: CostParams) -> Links:
    nv = gpu.nvlink_bw_gbs if (intra_link in (None, "nvlink") and gpu.nvlink_bw_gbs) else None
    intra = (nv or gpu.pcie_bw_gbs) * 1e9 * params.comm_eff
    # inter-node traffic also crosses PCIe to reach the NIC
    inter = min(gpu.inter_node_bw_gbs, gpu.pcie_bw_gbs) * 1e9 * params.comm_eff
    return Links(intra, inter, params.alpha_intra_s, params.alpha_inter_s)


def allreduce_s(nbytes: np.ndarray | float, n: int, bw: float, alpha: float) -> np.ndarray | float:
    """Ring all-reduce of nbytes among n ranks."""
    if n <= 1:
        return 0.0 * nbytes
    return 2 * (n - 1) / n * nbytes / bw + 2 * (n - 1) * alpha


def layer_costs(table: LayerTable, gpu: GpuSpec, gpu_name: str, links: Links, *, nodes: int,
                gpus_per_node: int, batch: int, dp: int, tp: int, m: int, recompute: bool,
                params: CostParams) -> LayerCosts:
    """Per-layer costs for one micro-batch of batch/(dp*m) samples under tp-way sharding."""
    b = batch / (dp * m)
    peak = gpu.peak_tflops * 1e12 * params.eff(gpu_name)
    mbw = gpu.mem_bw_gbs * 1e9 * params.mem_eff

    shard_frac = np.where(table.params > 0, table.tp_params / np.maximum(table.params, 1), 1.0)
    flops = table.flops_fwd * b * (shard_frac / tp + (1 - shard_frac))
    w_bytes = (table.tp_params / tp + (table.params - table.tp_params)) * BYTES_FP16
    act_traffic = (table.act_shard / tp + table.act_rep) * b
    # roofline per layer, plus launch overhead that dominates tiny micro-batches
    fwd = np.maximum(flops / peak, (w_bytes + act_traffic) / mbw) + params.layer_overhead_s
    bwd = 2 * fwd
    tp_comm = allreduce_s(table.tp_comm * b, tp, links.intra_bw, links.alpha_intra) if tp > 1 else 0 * fwd
    step = fwd + bwd + (fwd if recompute else 0.0) + 2 * tp_comm

    # stage boundaries cross nodes once a stage's dp x tp group fills a node
    p2p_bw, p2p_alpha = ((links.inter_bw, links.alpha_inter) if nodes > 1 and dp * tp >= gpus_per_node
                         else (links.intra_bw, links.alpha_intra))
    out_bytes = np.concatenate([table.act_in[1:], table.act_in[-1:]]) * b / tp
    p2p = 2 * (out_bytes / p2p_bw + p2p_alpha)

    shard_params = table.tp_params / tp + (table.params - table.tp_params)
    grad_bytes = shard_params * BYTES_FP16
    dp_crosses = nodes > 1 and dp * tp > gpus_per_node
    bw, alpha = (links.inter_bw, links.alpha_inter) if dp_crosses else (links.intra_bw, links.alpha_intra)
    ar = allreduce_s(grad_bytes, dp, bw, alpha) if dp > 1 else 0 * grad_bytes
    optim = shard_params * BYTES_PER_PARAM_TRAIN * 2 / mbw  # read + write of all optimizer state

    static = shard_params * BYTES_PER_PARAM_TRAIN
    full_act = (table.act_shard / tp + table.act_rep) * b
    if recompute:
        act = table.act_in * b
        transient = full_act  # one layer's activations are rebuilt during its backward
    else:
        act = full_act
        transient = np.zeros_like(full_act)
    return LayerCosts(step_s=step, p2p_s=p2p, allreduce_s=ar, optim_s=optim, static_bytes=static,
                      act_bytes=act, peak_bytes=transient)
