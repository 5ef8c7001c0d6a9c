"""Level 2 of the decomposition: the best parallel plan inside one grid.

A grid shape is (model, global batch, GPU type, nodes x GPUs per node, pp).
For every dp x tp factorization (tp inside a node), micro-batch count and
recomputation choice, the exact stage-split DP of `perf.compose` gives the
fastest memory-feasible split; the fastest of all is the grid's proxy plan,
and the (time, memory) Pareto front is kept for the runners.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from arena_opt.gpus import GpuSpec
from arena_opt.perf import stage_shapes
from arena_opt.perf.analytical import GIB, CostParams, cost_table, layer_costs, links_for
from arena_opt.perf.compose import SCALAR_FIELDS, LayerCosts, Splits, split_many, stack
from arena_opt.plan import Plan
from models.catalog import Arch


@dataclass(frozen=True)
class PlanResult:
    plan: Plan
    iter_time_s: float
    mem_gib: float  # peak per-GPU memory, reserve included
    batch_size: int
    # the estimate's error band (arena_opt/perf/band.py) where the catalogue priced it; iter_time_s is
    # then the band's conservative time (band.nominal_s the model's own)
    band: object | None = field(default=None, compare=False)

    @property
    def throughput(self) -> float:
        """samples/s"""
        return self.batch_size / self.iter_time_s


@dataclass(frozen=True)
class GridPlans:
    proxy: PlanResult | None
    pareto: list[PlanResult] = field(default_factory=list)  # by time ascending, memory descending


def _pow2_upto(n: int) -> list[int]:
    out, x = [], 1
    while x <= n:
        out.append(x)
        x *= 2
    return out


def tp_degrees(arch: Arch, gpus_per_node: int, per_stage: int) -> list[int]:
    """tp stays inside a node, divides the stage's GPUs and the sharded dimension."""
    split_dim = arch.heads if arch.family != "wide_resnet" else arch.base_channels
    return [t for t in _pow2_upto(min(gpus_per_node, 8, per_stage))
            if per_stage % t == 0 and gpus_per_node % t == 0 and split_dim % t == 0]


def why_no_plan(arch: Arch, batch: int, n_gpus: int, gpus_per_node: int, pp: int, layers: int) -> str:
    """Why the grid (n_gpus GPUs, pp stages) has no plan, by the first rule of `_plan` it breaks; memory
    only when every split exists but none fits."""
    if n_gpus % pp:
        return f"{n_gpus} GPUs do not split into {pp} pipeline stages"
    if pp > layers:
        return f"{pp} stages exceed the model's {layers} layers"
    splits = [(tp, n_gpus // (pp * tp)) for tp in tp_degrees(arch, gpus_per_node, n_gpus // pp)]
    if not splits:
        return f"no tensor-parallel degree divides {n_gpus // pp} GPUs per stage within a node"
    if not any(batch % dp == 0 and microbatch_counts(batch // dp, pp) for _, dp in splits):
        dps = ", ".join(str(dp) for _, dp in splits)
        return f"batch {batch} does not split into dp {dps} replicas of at least {pp} micro-batches"
    return "no plan fits in memory"


def microbatch_counts(per_replica_batch: int, pp: int) -> list[int]:
    # Every power of two that divides the per-replica batch (at least pp when pipelining): a coarser
    # ladder jumps from a few micro-batches straight to one-sample micro-batches on memory-bound grids
    # and loses up to 9% of proxy-plan quality (bench/results/proxy_quality.md).
    out, m = [], 1
    while m <= per_replica_batch:
        if per_replica_batch % m == 0 and m >= pp:
            out.append(m)
        m *= 2
    if per_replica_batch not in out and per_replica_batch >= pp:
        out.append(per_replica_batch)
    return out


def plan_cache_path() -> Path | None:
    """Plans are cached across runs: $ARENA_OPT_CACHE (a file; empty = off), else ~/.cache/arena-opt/plans.json."""
    env = os.environ.get("ARENA_OPT_CACHE")
    if env is not None:
        return Path(env) if env else None
    return Path.home() / ".cache" / "arena-opt" / "plans.json"


def _code_version() -> str:
    """Hash of the sources a plan depends on: a cached plan from other code is never reused."""
    here = Path(__file__).resolve().parent  # arena_opt/perf
    root = here.parent.parent
    files = [here / "planner.py", here / "analytical.py", here / "compose.py", here / "stage_shapes.py",
             root / "models" / "layers.py", root / "models" / "catalog.py"]
    h = hashlib.sha1()
    for f in files:
        h.update(f.read_bytes() if f.is_file() else b"")
    return h.hexdigest()[:16]


class Planner:
    def __init__(self, params: CostParams | None = None, layer_source=None, per_stage: bool | None = None):
        self.params = params or CostParams()
        # per-stage (dp, tp) plans (perf/stage_shapes.py); None = $ARENA_OPT_PER_STAGE decides
        self.per_stage = stage_shapes.enabled() if per_stage is None else per_stage
        # optional callable (arena_opt.perf.profile_source.ProfileSource) giving measured LayerCosts;
        # it returns None where it has no profile and the analytical model is used
        self.layer_source = layer_source
        self._cache: dict[tuple, GridPlans] = {}
        self._disk: dict[str, list] = {}
        self._disk_dirty = False

    # --- on-disk cache: plans are deterministic in (code, params, model, batch, GPU, shape) --------------------
    def _disk_key(self, arch: Arch, batch, gpu: GpuSpec, intra_link, nodes, gpus_per_node, pp) -> str:
        return "|".join([arch.model_dump_json(), str(batch), gpu.model_dump_json(), str(intra_link), str(nodes),
                         str(gpus_per_node), str(pp)])

    def load_cache(self, path) -> None:
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            return  # a missing or damaged cache is only a slower start
        if data.get("version") == _code_version() and data.get("params") == self._params_key():
            self._disk = data.get("plans", {})

    def save_cache(self, path) -> None:
        from arena_opt.io import atomic_write

        if not self._disk_dirty:
            return

        atomic_write(path, json.dumps({"version": _code_version(), "params": self._params_key(),
                                       "plans": self._disk}))
        self._disk_dirty = False

    def _params_key(self) -> str:
        return (self.params.model_dump_json() + "|" + str(getattr(self.layer_source, "digest", ""))
                + ("|per-stage" if self.per_stage else ""))

    def mem_cap_bytes(self, gpu: GpuSpec) -> float:
        return (gpu.memory_gib - self.params.mem_reserve_gib) * GIB

    def plan(self, arch: Arch, batch: int, gpu_name: str, gpu: GpuSpec, intra_link: str | None, nodes: int,
             gpus_per_node: int, pp: int) -> GridPlans:
        key = (arch, batch, gpu_name, gpu, intra_link, nodes, gpus_per_node, pp)
        hit = self._cache.get(key)
        if hit is None:
            dkey = self._disk_key(arch, batch, gpu, intra_link, nodes, gpus_per_node, pp) + "|" + gpu_name
            stored = self._disk.get(dkey)
            if stored is not None:
                pareto = [PlanResult(Plan.model_validate(p), t, mem, batch) for p, t, mem in stored]
                hit = GridPlans(pareto[0] if pareto else None, pareto)
            else:
                hit = self._plan(arch, batch, gpu_name, gpu, intra_link, nodes, gpus_per_node, pp)
                self._disk[dkey] = [(r.plan.model_dump(), r.iter_time_s, r.mem_gib) for r in hit.pareto]
                self._disk_dirty = True
            self._cache[key] = hit
        return hit

    def _plan(self, arch, batch, gpu_name, gpu, intra_link, nodes, gpus_per_node, pp) -> GridPlans:
        n_gpus = nodes * gpus_per_node
        table = cost_table(arch, self.params)
        if n_gpus % pp or pp > table.num_layers:
            return GridPlans(None)
        links = links_for(gpu, intra_link, self.params)
        cap = self.mem_cap_bytes(gpu)
        cands = [(tp, dp, m) for tp in tp_degrees(arch, gpus_per_node, n_gpus // pp)
                 for dp in (n_gpus // (pp * tp),) if batch % dp == 0 for m in microbatch_counts(batch // dp, pp)]
        if not cands:
            return GridPlans(None)
        tp, dp, m = (np.array(x) for x in zip(*cands))
        # every candidate's split in one pass; recomputation only pays when the plain plan does not fit,
        # so only the candidates without a plain split are tried with it
        plain = self._splits(arch, table, gpu_name, gpu, links, nodes, gpus_per_node, batch, dp, tp, m, False, pp,
                             cap)
        rows = {c: (plain, c, False) for c in np.flatnonzero(plain.feasible)}
        redo = np.flatnonzero(~plain.feasible)
        if len(redo):
            rec = self._splits(arch, table, gpu_name, gpu, links, nodes, gpus_per_node, batch, dp[redo], tp[redo],
                               m[redo], True, pp, cap)
            rows.update({int(c): (rec, i, True) for i, c in enumerate(redo) if rec.feasible[i]})
        if not rows:
            return GridPlans(None)
        reserve = self.params.mem_reserve_gib
        order = sorted(rows)  # candidate order (tp, then micro-batches): the tie-break of equal plans

        def measures(c):
            sp, i, _ = rows[c]
            return float(sp.iter_time_s[i]), float(sp.mem_bytes[i].max()) / GIB + reserve

        found = sorted(((*measures(c), c) for c in order), key=lambda r: (r[0], r[1]))
        pareto, best_mem = [], float("inf")
        for t, mem, c in found:
            if mem < best_mem - 1e-9:
                sp, i, rc = rows[c]
                stages = sp.split(i).stages
                plan = Plan(pp=pp, dp=int(dp[c]), tp=int(tp[c]), num_microbatches=int(m[c]), stages=stages,
                            recompute=rc)
                pareto.append(PlanResult(plan, t, mem, batch))
                best_mem = mem
        if self.per_stage:
            pareto = self._per_stage(arch, table, gpu_name, gpu, links, nodes, gpus_per_node, batch, pp, cap, pareto)
        return GridPlans(pareto[0], pareto)

    def _per_stage(self, arch, table, gpu_name, gpu, links, nodes, gpus_per_node, batch, pp, cap,
                   pareto: list[PlanResult]) -> list[PlanResult]:
        """The Pareto set with the per-stage plan of `stage_shapes.best_shaped` in front where it wins."""
        n_gpus = nodes * gpus_per_node

        def costs(dp: int, tp: int, m: int, rc: bool) -> LayerCosts:
            lc = None
            if self.layer_source is not None:
                lc = self.layer_source(arch, gpu_name, gpu, links, nodes=nodes, gpus_per_node=gpus_per_node,
                                       batch=batch, dp=dp, tp=tp, m=m, recompute=rc)
            if lc is None:
                lc = _row(layer_costs(table, gpu, gpu_name, links, nodes=nodes, gpus_per_node=gpus_per_node,
                                      batch=batch, dp=np.array([dp]), tp=np.array([tp]), m=np.array([m]),
                                      recompute=np.array([rc]), params=self.params), 0)
            return lc

        shapes = [(n_gpus // (pp * tp), tp) for tp in tp_degrees(arch, gpus_per_node, n_gpus // pp)]
        base = pareto[0]
        got = stage_shapes.best_shaped(costs, shapes, batch, pp, base.plan, base.iter_time_s, cap,
                                       stage_shapes.margin(arch.name, gpu_name))
        if got is None:
            return pareto
        best = PlanResult(got[0], got[1], got[2] / GIB + self.params.mem_reserve_gib, batch)
        return [best, *(r for r in pareto if r.mem_gib < best.mem_gib - 1e-9)]

    def _splits(self, arch, table, gpu_name, gpu, links, nodes, gpus_per_node, batch, dp, tp, m, rc: bool, pp,
                cap) -> Splits:
        """Best split of each (dp[c], tp[c], m[c]) candidate: analytical costs for all of them at once,
        measured layers (`layer_source`) where a profile has them."""
        lc = layer_costs(table, gpu, gpu_name, links, nodes=nodes, gpus_per_node=gpus_per_node, batch=batch,
                         dp=dp, tp=tp, m=m, recompute=np.full(len(m), rc), params=self.params)
        if self.layer_source is not None:
            rows = [self.layer_source(arch, gpu_name, gpu, links, nodes=nodes, gpus_per_node=gpus_per_node,
                                      batch=batch, dp=int(d), tp=int(t), m=int(k), recompute=rc)
                    for d, t, k in zip(dp, tp, m)]
            if any(r is not None for r in rows):
                lc = stack([r if r is not None else _row(lc, c) for c, r in enumerate(rows)])
        return split_many(lc, pp, m, cap)


def _row(lc: LayerCosts, c: int) -> LayerCosts:
    return LayerCosts(**{f: getattr(lc, f)[c] for f in LayerCosts.__dataclass_fields__ if f not in SCALAR_FIELDS},
                      **{f: float(np.broadcast_to(getattr(lc, f), lc.step_s.shape[:1])[c]) for f in SCALAR_FIELDS})
