"""The performance source the scheduler sees: plans from the planner, iteration times
from a measured table where it has the grid, and online corrections from observed runs."""

from __future__ import annotations

from dataclasses import dataclass, replace

from arena_opt.gpus import GpuSpec
from arena_opt.perf.analytical import CostParams
from arena_opt.perf.table import PerfTable
from arena_opt.perf.planner import GridPlans, Planner, PlanResult
from models.catalog import Arch


@dataclass(frozen=True)
class GridShape:
    gpu_type: str
    nodes: int
    gpus_per_node: int
    pp: int

    @property
    def num_gpus(self) -> int:
        return self.nodes * self.gpus_per_node


class PerfEstimator:
    """`table_mode`: "override" uses the table's time where the table has the grid and the model
    elsewhere; "strict" makes grids missing from the table infeasible (Arena's simulator does this);
    "off" ignores the table."""

    def __init__(self, params: CostParams | None = None, table: PerfTable | None = None,
                 table_mode: str = "override", profiles=None, band=None):
        """`profiles`: an `arena_opt.perf.profile_db.ProfileDB`; models profiled on a GPU are planned from
        their measured layers, everything else from the analytical model. `band`: an
        `arena_opt.perf.band.BandModel`, the error band of the modelled (not measured) times."""
        if table_mode not in ("override", "strict", "off"):
            raise ValueError(f"table_mode must be override, strict or off, not {table_mode!r}")
        source = None
        if profiles is not None:
            from arena_opt.perf.profile_source import ProfileSource

            source = ProfileSource(profiles)
        self.planner = Planner(params, layer_source=source)
        self.table = table
        self.table_mode = table_mode
        self.band = band
        # observed/estimated iteration-time ratio per (model, gpu type), from runners
        self.correction: dict[tuple[str, str], float] = {}
        # bumped by every change of the estimates (observe): caches of them (grids.GridCatalog) are
        # valid for one version
        self.version = 0

    @property
    def params(self) -> CostParams:
        return self.planner.params

    def grid(self, arch: Arch, batch: int, gpu: GpuSpec, intra_link: str | None, shape: GridShape) -> GridPlans:
        if not self.in_scope(arch.name, batch, shape.gpu_type, shape.nodes, shape.gpus_per_node):
            return GridPlans(None)
        plans = self.planner.plan(arch, batch, shape.gpu_type, gpu, intra_link, shape.nodes, shape.gpus_per_node,
                                  shape.pp)
        return self._adjust(arch, batch, gpu, intra_link, shape, plans)

    def plan_ahead(self, grids: list[tuple]) -> None:
        """Plans every (arch, batch, gpu, intra_link, shape) of `grids` in one planner pass
        (`Planner.plan_many`: all of them at once is much faster than one at a time); `grid` then
        finds them cached."""
        self.planner.plan_many([(arch, batch, s.gpu_type, gpu, link, s.nodes, s.gpus_per_node, s.pp)
                                for arch, batch, gpu, link, s in grids
                                if self.in_scope(arch.name, batch, s.gpu_type, s.nodes, s.gpus_per_node)])

    def in_scope(self, model: str, batch: int, gpu_type: str, nodes: int, gpus_per_node: int) -> bool:
        """False when `grid` is infeasible for this shape whatever the planner finds (strict mode, shape
        not in the table): callers walking many shapes skip the planner there."""
        return not (self.table is not None and self.table_mode == "strict"
                    and not self.table.has(model, batch, gpu_type, nodes, gpus_per_node))

    def measured(self, model: str, batch: int, shape: GridShape) -> bool:
        """Whether the grid's time comes from the measured table (it then carries no model error band)."""
        return (self.table is not None and self.table_mode != "off"
                and self.table.has(model, batch, shape.gpu_type, shape.nodes, shape.gpus_per_node))

    def best(self, arch: Arch, batch: int, gpu: GpuSpec, intra_link: str | None, gpu_type: str, nodes: int,
             gpus_per_node: int) -> PlanResult | None:
        """Fastest plan over all pipeline depths for one (type, shape)."""
        best = None
        n = nodes * gpus_per_node
        pp = 1
        while pp <= n:
            r = self.grid(arch, batch, gpu, intra_link, GridShape(gpu_type, nodes, gpus_per_node, pp)).proxy
            if r is not None and (best is None or r.iter_time_s < best.iter_time_s):
                best = r
            pp *= 2
        return best

    def _adjust(self, arch: Arch, batch: int, gpu: GpuSpec, intra_link: str | None, shape: GridShape,
                plans: GridPlans) -> GridPlans:
        factor = self.correction.get((arch.name, shape.gpu_type), 1.0)
        if self.table is not None and self.table_mode != "off":
            key = (arch.name, batch, shape.gpu_type, shape.nodes, shape.gpus_per_node)
            if self.table.has(*key):
                measured = self.table.lookup(*key)
                model_best = self._model_best_time(arch, batch, gpu, intra_link, shape)
                if measured is None or plans.proxy is None or model_best is None:
                    return GridPlans(None)
                # The table holds the shape's best plan (its plan is not recorded): the model's fastest
                # pipeline depth gets the measured time, the others keep their modelled ratio to it.
                return _scaled(plans, measured / model_best * factor)
        return plans if factor == 1.0 else _scaled(plans, factor)

    def _model_best_time(self, arch, batch, gpu, intra_link, shape: GridShape) -> float | None:
        times = []
        pp = 1
        while pp <= shape.num_gpus:
            r = self.planner.plan(arch, batch, shape.gpu_type, gpu, intra_link, shape.nodes, shape.gpus_per_node,
                                  pp).proxy
            if r is not None:
                times.append(r.iter_time_s)
            pp *= 2
        return min(times) if times else None

    def observe(self, model: str, gpu_type: str, estimated_s: float, measured_s: float, weight: float = 0.5):
        """Online correction: move the (model, GPU type) factor toward measured/estimated."""
        if estimated_s <= 0 or measured_s <= 0:
            return
        self.version += 1
        old = self.correction.get((model, gpu_type), 1.0)
        ratio = measured_s / (estimated_s / old)
        self.correction[(model, gpu_type)] = (1 - weight) * old + weight * ratio


def _scaled(plans: GridPlans, scale: float) -> GridPlans:
    def s(r: PlanResult) -> PlanResult:
        return replace(r, iter_time_s=r.iter_time_s * scale)

    return GridPlans(s(plans.proxy) if plans.proxy else None, [s(r) for r in plans.pareto])
