"""A parallel plan: how one job runs on its GPUs (shared by planner, decision and runners)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, PositiveInt, model_validator


class Plan(BaseModel):
    """pp pipeline stages, each replicated dp times and sharded tp ways; the global batch is split
    into dp shards and each shard into `num_microbatches` micro-batches run 1F1B.
    `stages[k] = [first, last)` are the layer indices of `models.layer_table` that stage k holds."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    pp: PositiveInt = 1
    dp: PositiveInt = 1
    tp: PositiveInt = 1
    num_microbatches: PositiveInt = 1
    stages: list[tuple[NonNegativeInt, NonNegativeInt]] = Field(default_factory=list)
    recompute: bool = Field(False, description="activation recomputation (store only stage inputs)")

    @model_validator(mode="after")
    def _check(self) -> "Plan":
        if self.stages:
            if len(self.stages) != self.pp:
                raise ValueError(f"stages has {len(self.stages)} entries but pp = {self.pp}")
            prev = self.stages[0][0]
            if prev != 0:
                raise ValueError("stages must start at layer 0")
            for a, b in self.stages:
                if a != prev or b <= a:
                    raise ValueError(f"stages must be contiguous and non-empty, got {self.stages}")
                prev = b
        return self

    @property
    def num_gpus(self) -> int:
        return self.pp * self.dp * self.tp

    def describe(self) -> str:
        return f"pp{self.pp}xdp{self.dp}xtp{self.tp} mb{self.num_microbatches}" + (" rc" if self.recompute else "")
