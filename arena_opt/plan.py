"""A parallel plan: how one job runs on its GPUs (shared by planner, decision and runners)."""

from __future__ import annotations

from typing import Any

from pydantic import (ConfigDict, Field, NonNegativeInt, PositiveInt, model_serializer,
                      model_validator)


from arena_opt.edge import EdgeModel
class Plan(EdgeModel):
    """pp pipeline stages, each replicated dp times and sharded tp ways; the global batch is split
    into dp shards and each shard into `num_microbatches` micro-batches run 1F1B.
    `stages[k] = [first, last)` are the layer indices of `models.layer_table` that stage k holds.

    `stage_shapes[k] = (dp_k, tp_k)` gives stage k its own shape (Arena's per-stage submeshes): the
    global batch is split into `num_microbatches` micro-batches and stage k's dp_k replicas each run
    an equal share of every micro-batch, so activations are split or merged between stages of
    different width. `dp` and `tp` then hold the widest stage's degrees (filled in when omitted).
    A plan whose shapes are all equal is the uniform plan and is stored as one (`stage_shapes` None):
    it serialises exactly as before per-stage shapes existed."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    pp: PositiveInt = 1
    dp: PositiveInt = 1
    tp: PositiveInt = 1
    num_microbatches: PositiveInt = 1
    stages: list[tuple[NonNegativeInt, NonNegativeInt]] = Field(default_factory=list)
    recompute: bool = Field(False, description="activation recomputation (store only stage inputs)")
    stage_shapes: list[tuple[PositiveInt, PositiveInt]] | None = Field(
        None, description="per-stage (dp, tp), one per stage; None = every stage runs dp x tp")

    @model_validator(mode="before")
    @classmethod
    def _canonical(cls, data: Any) -> Any:
        if not isinstance(data, dict) or not data.get("stage_shapes"):
            return data
        shapes = [tuple(s) if isinstance(s, (list, tuple)) else s for s in data["stage_shapes"]]
        if not all(isinstance(s, tuple) and len(s) == 2 and all(isinstance(v, int) for v in s) for s in shapes):
            return data  # field validation names the bad entry
        data = dict(data)
        given = (data.get("dp", shapes[0][0]), data.get("tp", shapes[0][1]))
        if len(set(shapes)) == 1 and len(shapes) == data.get("pp", 1) and given == shapes[0]:
            data["dp"], data["tp"] = shapes[0]
            data["stage_shapes"] = None
        else:
            data.setdefault("dp", max(s[0] for s in shapes))
            data.setdefault("tp", max(s[1] for s in shapes))
        return data

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
        if self.stage_shapes is not None:
            if len(self.stage_shapes) != self.pp:
                raise ValueError(f"stage_shapes has {len(self.stage_shapes)} entries but pp = {self.pp}")
            widest = (max(s[0] for s in self.stage_shapes), max(s[1] for s in self.stage_shapes))
            if (self.dp, self.tp) != widest:
                raise ValueError(f"dp, tp = {self.dp}, {self.tp} but a per-stage plan's dp and tp are its widest "
                                 f"stage's, {widest[0]}, {widest[1]} (stage_shapes {self.stage_shapes})")
        return self

    @model_serializer(mode="wrap")
    def _dump(self, handler):
        out = handler(self)
        if self.stage_shapes is None and isinstance(out, dict):
            out.pop("stage_shapes", None)  # a uniform plan's JSON is what it was before per-stage shapes
        return out

    @property
    def uniform(self) -> bool:
        return self.stage_shapes is None

    @property
    def shapes(self) -> list[tuple[int, int]]:
        """(dp, tp) of every stage."""
        return [tuple(s) for s in self.stage_shapes] if self.stage_shapes is not None else [(self.dp, self.tp)] * self.pp

    @property
    def stage_gpus(self) -> list[int]:
        return [d * t for d, t in self.shapes]

    @property
    def num_gpus(self) -> int:
        if self.stage_shapes is None:  # pp equal stages (read for every job of every round)
            return self.pp * self.dp * self.tp
        return sum(self.stage_gpus)

    def batch_error(self, batch: int) -> tuple[str, str] | None:
        """(field, why) when the global batch does not split into every stage's replicas and each
        replica's share into whole micro-batches; None when it does."""
        m = self.num_microbatches
        # a uniform plan has one dp to check (and no stage to name); a per-stage plan names the stage.
        # Checked for every running job of every round: the common pass builds no list and no message
        if self.stage_shapes is None and not batch % self.dp and not (batch // self.dp) % m:
            return None
        stages = [(None, self.dp)] if self.stage_shapes is None else \
            [(k, dp) for k, (dp, _) in enumerate(self.stage_shapes)]
        for k, dp in stages:
            of = "" if k is None else f" (stage_shapes[{k}])"
            if batch % dp:
                return "dp" if k is None else f"stage_shapes[{k}]", f"dp {dp}{of} does not divide batch_size {batch}"
            if (batch // dp) % m:
                return "num_microbatches", (f"{m} does not divide the per-replica batch {batch // dp} "
                                            f"(batch_size {batch} / dp {dp}{of})")
        return None

    def tp_group_error(self, gpus_per_node: list[int]) -> str | None:
        """Why a tensor-parallel group would span nodes when the ranks fill nodes holding
        `gpus_per_node` GPUs in order (stage by stage, replicas row-major, tp peers consecutive)."""
        node_of = [n for n, c in enumerate(gpus_per_node) for _ in range(c)]
        if len(node_of) != self.num_gpus:
            return f"the nodes hold {len(node_of)} GPUs, the plan needs {self.num_gpus}"
        rank = 0
        for k, (dp, tp) in enumerate(self.shapes):
            for r in range(dp):
                if node_of[rank] != node_of[rank + tp - 1]:
                    where = "" if self.uniform else f" of stage {k}"
                    return f"tp group {r}{where} (tp {tp}, ranks {rank}-{rank + tp - 1}) spans two nodes"
                rank += tp
        return None

    def describe(self) -> str:
        shape = (f"pp{self.pp}xdp{self.dp}xtp{self.tp}" if self.uniform else
                 f"pp{self.pp}x[" + ",".join(f"dp{d}xtp{t}" for d, t in self.shapes) + "]")
        return shape + f" mb{self.num_microbatches}" + (" rc" if self.recompute else "")
