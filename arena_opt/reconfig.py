"""How long a job makes no progress when it is (re)started: shared by the policies'
restart penalty and the simulator's reconfiguration delay."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, NonNegativeFloat, PositiveFloat

from models.catalog import Arch
from models.layers import param_count

# fp16 weights + fp32 master weights and Adam moments, as a sharded checkpoint holds them
CKPT_BYTES_PER_PARAM = 2 + 12


class ReconfigModel(BaseModel):
    """`checkpoint`: restart constant + save and load of the sharded checkpoint over storage bandwidth
    shared by the job's GPUs. `per_gpu`: Arena's artifact constants (per GPU, capped); presets below."""

    model_config = ConfigDict(extra="forbid")

    mode: Literal["checkpoint", "per_gpu"] = "checkpoint"
    restart_s: NonNegativeFloat = Field(30.0, description="process launch, rendezvous, warm-up")
    storage_gbs_per_gpu: PositiveFloat = Field(1.0, description="checkpoint write/read GB/s per GPU")
    per_gpu_s: NonNegativeFloat = 10.0
    cap_s: NonNegativeFloat = 40.0

    def delay_s(self, arch: Arch, num_gpus: int, *, resumed: bool) -> float:
        """Seconds without progress when a job starts on `num_gpus`; `resumed` if it has state to load."""
        if self.mode == "per_gpu":
            return min(self.per_gpu_s * num_gpus, self.cap_s)
        if not resumed:
            return self.restart_s
        ckpt = param_count(arch) * CKPT_BYTES_PER_PARAM
        # save on the old GPUs and load on the new ones, each rank moving its shard
        return self.restart_s + 2 * ckpt / (self.storage_gbs_per_gpu * 1e9 * max(num_gpus, 1))


PRESETS = {
    "checkpoint": ReconfigModel(),
    "arena-artifact": ReconfigModel(mode="per_gpu", per_gpu_s=10, cap_s=40),
    "baseline-artifact": ReconfigModel(mode="per_gpu", per_gpu_s=150, cap_s=600),
}
