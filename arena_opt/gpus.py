"""Built-in GPU catalog (vendor data sheets) and link-kind defaults.

Peak numbers are dense (no sparsity) fp16/bf16 tensor-core TFLOP/s. Bandwidths
are GB/s per GPU in one direction: NVLink = aggregate NVLink bandwidth / 2,
PCIe = x16 link of the generation the card ships with, inter-node = a typical
NIC of the generation divided over the GPUs that share it (one NIC per GPU on
HGX boards). Any entry can be replaced in a snapshot's `gpu_catalog`.
"""

from __future__ import annotations

import functools
from typing import Literal

from pydantic import ConfigDict, Field, PositiveFloat

from arena_opt.edge import EdgeModel
from models.hashed import HashedOnce

LinkKind = Literal["nvlink", "pcie", "infiniband", "ethernet"]


# Sane upper limits of a catalog entry: about 20-100x the largest part of 2026 (B200: 2,250 dense fp16
# TFLOP/s, 192 GiB, 8,000 GB/s, NVLink 900 GB/s), so a real GPU of the next years passes and a unit slip
# (TFLOP/s given in GFLOP/s, memory in MiB) is an error naming the field rather than a plausible estimate.
MAX_TFLOPS = 100_000.0
MAX_MEMORY_GIB = 16_384.0
MAX_BW_GBS = 100_000.0


class GpuSpec(EdgeModel, HashedOnce):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    name: str = Field(min_length=1)
    peak_tflops: PositiveFloat = Field(le=MAX_TFLOPS, description="dense fp16/bf16 tensor TFLOP/s")
    memory_gib: PositiveFloat = Field(le=MAX_MEMORY_GIB)
    mem_bw_gbs: PositiveFloat = Field(le=10 * MAX_BW_GBS, description="HBM/GDDR bandwidth, GB/s")
    nvlink_bw_gbs: PositiveFloat | None = Field(None, le=MAX_BW_GBS,
                                                description="per GPU, one direction; None = no NVLink")
    pcie_bw_gbs: PositiveFloat = Field(le=MAX_BW_GBS, description="host link, x16, one direction")
    inter_node_bw_gbs: PositiveFloat = Field(le=MAX_BW_GBS, description="network bandwidth available to one GPU")
    fp32_tflops: PositiveFloat | None = Field(
        None, le=MAX_TFLOPS, description="fp32 FMA TFLOP/s without tensor cores, for models trained in fp32; "
                                         "None = peak_tflops")


# Sources: NVIDIA A100 (2021), V100 (2020), A40 (2022), A10 (2021), L20 (2023),
# H100 (2023) and H200 (2024) product data sheets. fp32_tflops of the GA10x/AD10x parts
# (A40, A10, L20) is half the data-sheet figure: that figure counts a second FP32
# datapath which is shared with INT32 (NVIDIA Ampere GA102 white paper), and GEMM and
# convolution kernels, whose index arithmetic runs on it, issue at the single-path rate.
BUILTIN_GPUS: dict[str, GpuSpec] = {
    g.name: g
    for g in [
        GpuSpec(name="a100-40gb", peak_tflops=312, memory_gib=40, mem_bw_gbs=1555, nvlink_bw_gbs=300,
                pcie_bw_gbs=32, inter_node_bw_gbs=25, fp32_tflops=19.5),
        GpuSpec(name="a100-80gb", peak_tflops=312, memory_gib=80, mem_bw_gbs=2039, nvlink_bw_gbs=300,
                pcie_bw_gbs=32, inter_node_bw_gbs=25, fp32_tflops=19.5),
        GpuSpec(name="v100-32gb", peak_tflops=125, memory_gib=32, mem_bw_gbs=900, nvlink_bw_gbs=150,
                pcie_bw_gbs=16, inter_node_bw_gbs=12.5, fp32_tflops=15.7),
        GpuSpec(name="a40", peak_tflops=149.7, memory_gib=48, mem_bw_gbs=696, nvlink_bw_gbs=56.25,
                pcie_bw_gbs=32, inter_node_bw_gbs=12.5, fp32_tflops=18.7),
        GpuSpec(name="a10", peak_tflops=125, memory_gib=24, mem_bw_gbs=600, pcie_bw_gbs=32,
                inter_node_bw_gbs=12.5, fp32_tflops=15.6),
        GpuSpec(name="l20", peak_tflops=119.5, memory_gib=48, mem_bw_gbs=864, pcie_bw_gbs=32,
                inter_node_bw_gbs=12.5, fp32_tflops=29.9),
        GpuSpec(name="h100-80gb", peak_tflops=989, memory_gib=80, mem_bw_gbs=3350, nvlink_bw_gbs=450,
                pcie_bw_gbs=64, inter_node_bw_gbs=50, fp32_tflops=67),
        GpuSpec(name="h200", peak_tflops=989, memory_gib=141, mem_bw_gbs=4800, nvlink_bw_gbs=450,
                pcie_bw_gbs=64, inter_node_bw_gbs=50, fp32_tflops=67),
    ]
}

# Names used by Arena's traces and tables.
GPU_ALIASES = {"a100": "a100-40gb", "v100": "v100-32gb", "h100": "h100-80gb"}


@functools.lru_cache(maxsize=4096)  # once per job and node of a snapshot: 150,000 calls for a handful of names
def canonical_gpu(name: str) -> str:
    n = name.strip().lower()
    return GPU_ALIASES.get(n, n)
