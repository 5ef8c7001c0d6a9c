"""Performance sources of a simulation: the truth that advances jobs and the estimate policies see."""

from __future__ import annotations

import hashlib
from pathlib import Path

from arena_opt.errors import InputError
from arena_opt.gpus import GpuSpec
from arena_opt.perf.estimator import GridShape, PerfEstimator, _scaled
from arena_opt.perf.table import PerfTable
from arena_opt.perf.planner import GridPlans
from models.catalog import Arch


class NoisyEstimator(PerfEstimator):
    """The base estimator's plans with iteration times scaled by a factor in [1-noise, 1+noise].

    The factor is a deterministic hash of (seed, model, batch, GPU type, nodes, GPUs per node): the
    estimator interface is keyed by workload and grid, not by job id, so every job of the same
    workload sees the same error on the same grid (a consistent model error, as a mis-calibrated
    profiler would make). Feasibility is unchanged; only speeds are wrong."""

    def __init__(self, base: PerfEstimator, noise: float, seed: int = 0):
        if not 0 <= noise < 1:
            raise InputError(f"estimate noise must be in [0, 1), got {noise}")
        super().__init__(base.params, base.table, base.table_mode)
        self.planner = base.planner  # share the plan cache
        self.base = base
        self.noise = noise
        self.seed = seed
        self._memo: dict[tuple, GridPlans] = {}

    def factor(self, model: str, batch: int, shape: GridShape) -> float:
        key = f"{self.seed}|{model}|{batch}|{shape.gpu_type}|{shape.nodes}|{shape.gpus_per_node}".encode()
        u = int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big") / 2 ** 64
        return 1.0 + self.noise * (2.0 * u - 1.0)

    def grid(self, arch: Arch, batch: int, gpu: GpuSpec, intra_link: str | None, shape: GridShape) -> GridPlans:
        key = (arch.name, batch, gpu, intra_link, shape)
        hit = self._memo.get(key)
        if hit is None:
            plans = self.base.grid(arch, batch, gpu, intra_link, shape)
            hit = self._memo[key] = plans if plans.proxy is None else _scaled(plans, self.factor(arch.name, batch,
                                                                                                shape))
        return hit


def make_truth(perf_table: str | Path | None, table_mode: str = "strict") -> PerfEstimator:
    """The truth: a measured table (strict: grids it lacks are infeasible, as Arena's simulator does)
    or, without a table, the analytical model."""
    if perf_table is None:
        return PerfEstimator(table_mode="off")
    return PerfEstimator(table=PerfTable.load(perf_table), table_mode=table_mode)
