"""Per-stage shapes (issue 16.4): each pipeline stage its own (dp, tp), as Arena's planner gives
each stage its own submesh, considered only where the model says it wins by more than its error.

The search is bounded to stay off the planning hot path: it runs only for pipelined grids whose
stage GPU count has at least two (dp, tp) factorizations, keeps every stage's GPU count (so a grid's
shape, its packing and its placement do not change), and reuses the uniform winner's micro-batch
count and recomputation choice. Inside those bounds one exact stage-split DP
(`perf.compose.split_stages_shaped`) picks a split and every stage's shape together.
"""

from __future__ import annotations

import os
from typing import Callable

from arena_opt.perf.band import BandModel
from arena_opt.perf.compose import LayerCosts, split_stages_shaped
from arena_opt.plan import Plan

# The margin a planner without an error band model uses (Planner(stage_band=None), or no committed
# arena_opt/perf/band.json): a per-stage plan must be faster than the uniform one by this fraction.
PER_STAGE_MARGIN = 0.05
ENV_FLAG = "ARENA_OPT_PER_STAGE"


def enabled() -> bool:
    """Per-stage plans are off unless $ARENA_OPT_PER_STAGE is 1 (see docs/ARCHITECTURE.md)."""
    return os.environ.get(ENV_FLAG, "") == "1"


def margin(band: BandModel | None, family: str, num_gpus: int, microbatches: int) -> float:
    """Relative win a per-stage plan needs over the uniform plan of its grid: its estimate raised to the
    upper edge of its error band (perf/band.py, at the configuration's family, GPU count and micro-batch
    count) must still be below the uniform plan's estimate, so need = 1 - estimate / upper edge. The
    band is the error of one estimate against its measurement; two plans of one grid share much of it,
    so this is the cautious reading (documented choice, issue 16.4). No band: PER_STAGE_MARGIN."""
    if band is None:
        return PER_STAGE_MARGIN
    return max(0.0, 1.0 - 1.0 / band.band(1.0, family, num_gpus, microbatches).hi_s)


def best_shaped(costs: Callable[[int, int, int, bool], LayerCosts], shapes: list[tuple[int, int]], batch: int,
                pp: int, base: Plan, base_time_s: float, cap_bytes: float, need: float):
    """The fastest per-stage plan over `shapes` (the grid's (dp, tp) per stage) at `base`'s micro-batch
    count and recomputation, as (plan, iter_time_s, peak bytes), when it beats `base_time_s` by more
    than the fraction `need`; None otherwise (also when the best choice is uniform)."""
    m, rc = base.num_microbatches, base.recompute
    shapes = [(dp, tp) for dp, tp in shapes if batch % dp == 0 and (batch // dp) % m == 0]
    if pp < 2 or len(shapes) < 2:
        return None
    found = split_stages_shaped([costs(dp, tp, m, rc) for dp, tp in shapes], [range(len(shapes))] * pp, m,
                                cap_bytes)
    if found is None:
        return None
    split, picks = found
    if len(set(picks)) == 1 or split.iter_time_s >= base_time_s * (1.0 - need):
        return None
    plan = Plan(pp=pp, num_microbatches=m, stages=split.stages, recompute=rc,
                stage_shapes=[shapes[o] for o in picks])
    return plan, split.iter_time_s, max(split.mem_bytes)
