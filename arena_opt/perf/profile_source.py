"""Profiles as the planner's per-layer cost source: when the database holds a profile of the model
measured on a GPU, the planner composes plans from it; otherwise (no profile, a tp degree not
measured) it falls back to the analytical model.

A profile measured on one GPU type serves the others through Arena's roofline loads: each layer's
measured time is scaled by load(target) / load(profiled), the layer's time at attainable
performance min(peak, intensity x bandwidth) on each GPU (`perf.analytical.roofline_load_s`), at
the precision the profile was timed at.
Collectives use the database's NCCL fits for that device, else the link kind's published
alpha-beta at the GPU's catalog bandwidth.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from arena_opt.gpus import BUILTIN_GPUS, GpuSpec
from arena_opt.perf.analytical import CostParams, Links, cost_table, intra_link_kind, roofline_load_s
from arena_opt.perf.comm import AlphaBeta, LINK_DEFAULTS
from arena_opt.perf.compose import LayerCosts
from arena_opt.perf.profile_costs import CommModel, Topology, layer_costs
from arena_opt.perf.profile_db import ModelProfile, ProfileDB
from models.catalog import ARCHITECTURES, Arch


def gpu_type_of(device_name: str, catalog: dict[str, GpuSpec] | None = None) -> str | None:
    """Catalog GPU type whose name appears in a CUDA device name ('NVIDIA H200' -> 'h200')."""
    catalog = catalog or BUILTIN_GPUS
    name = device_name.lower().replace(" ", "").replace("-", "")
    best = None
    for key in catalog:
        base = key.split("-")[0]  # 'a100-40gb' -> 'a100'
        if base in name and (best is None or len(base) > len(best.split("-")[0])):
            best = key
    return best


@dataclass
class ProfileSource:
    """Callable the planner asks for LayerCosts; None means 'use the analytical model'."""

    db: ProfileDB
    catalog: dict[str, GpuSpec] = field(default_factory=lambda: dict(BUILTIN_GPUS))

    def __post_init__(self) -> None:
        self._by_model: dict[str, list[tuple[str, ModelProfile]]] = {}
        for m in self.db.models:
            if m.device != "cuda":
                continue  # CPU profiles say nothing about a GPU's layers
            gtype = gpu_type_of(m.device_name, self.catalog)
            if gtype is not None:
                self._by_model.setdefault(m.model, []).append((gtype, m))
        self.digest = hashlib.sha1(self.db.model_dump_json().encode()).hexdigest()[:16]

    def profile_for(self, arch: Arch, gpu_name: str) -> tuple[str, ModelProfile] | None:
        cands = [(g, m) for g, m in self._by_model.get(arch.name, []) if m.arch == arch]
        if not cands:
            return None
        same = [c for c in cands if c[0] == gpu_name]
        return (same or cands)[0]

    def _comm(self, prof: ModelProfile, gpu: GpuSpec, links: Links) -> CommModel:
        fits = self.db.comm_fits("cuda")
        intra = LINK_DEFAULTS[links.intra_kind]
        defaults = {links.intra_kind: AlphaBeta(alpha_s=intra.alpha_s, bandwidth_bps=links.intra_bw * intra.efficiency),
                    "network": AlphaBeta(alpha_s=LINK_DEFAULTS["ethernet"].alpha_s,
                                         bandwidth_bps=links.inter_bw * LINK_DEFAULTS["infiniband"].efficiency)}
        return CommModel(fits, defaults)

    def __call__(self, arch: Arch, gpu_name: str, gpu: GpuSpec, links: Links, *, nodes: int, gpus_per_node: int,
                 batch: int, dp: int, tp: int, m: int, recompute: bool) -> LayerCosts | None:
        found = self.profile_for(arch, gpu_name)
        if found is None:
            return None
        src_type, prof = found
        if tp not in prof.tp_degrees:
            return None
        scale: np.ndarray | float = 1.0
        if src_type != gpu_name:
            src = self.catalog[src_type]
            table = cost_table(arch, params_at(prof.dtype))
            b = batch / (dp * m)
            scale = (roofline_load_s(table, gpu, micro_batch_size=b, tp=tp)
                     / roofline_load_s(table, src, micro_batch_size=b, tp=tp))
        topo = Topology(nodes=nodes, gpus_per_node=gpus_per_node, intra=links.intra_kind, inter="network")
        return layer_costs(prof, self._comm(prof, gpu, links), topo, batch=batch, dp=dp, tp=tp, m=m,
                           pp=max(1, (nodes * gpus_per_node) // (dp * tp)), recompute=recompute,
                           compute_scale=scale)


@lru_cache(maxsize=4)
def params_at(dtype: str) -> CostParams:
    """Cost parameters under which every model family trains at `dtype`: a profile's loads compare the
    rooflines of the precision it was timed at (`ModelProfile.dtype`: bf16 on GPUs, as the runners train
    there, so tensor-core peaks; an fp32 profile compares the CUDA-core peaks)."""
    return CostParams(dtype_by_family={a.family: dtype for a in ARCHITECTURES.values()})


__all__ = ["ProfileSource", "gpu_type_of", "intra_link_kind", "params_at"]
