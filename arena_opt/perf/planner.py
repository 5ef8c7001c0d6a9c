"""Level 2 of the decomposition: the best parallel plan inside one grid.

A grid shape is (model, global batch, GPU type, nodes x GPUs per node, pp).
For every dp x tp factorization (tp inside a node), micro-batch count and
recomputation choice, the exact stage-split DP of `perf.compose` gives the
fastest memory-feasible split; the fastest of all is the grid's proxy plan,
and the (time, memory) Pareto front is kept for the runners.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from arena_opt.edge import built, unvalidated
from arena_opt.gpus import GpuSpec
from arena_opt.perf import stage_shapes
from arena_opt.perf.analytical import GIB, CostParams, calibrated_params, cost_table, layer_costs, links_for
from arena_opt.perf.band import default_band
from arena_opt.perf.compose import LayerCosts, Splits, may_fit, split_many, stack, take
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

    @classmethod
    def of(cls, plan: Plan, iter_time_s: float, mem_gib: float, batch_size: int, band=None) -> "PlanResult":
        """The constructor without its per-field setattr, for the planner's and the pricing's loops (a cold
        medium round makes 8,700 of them)."""
        return built(cls, {"plan": plan, "iter_time_s": iter_time_s, "mem_gib": mem_gib, "batch_size": batch_size,
                           "band": band})


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
    return list(_tp_degrees(_split_dim(arch), gpus_per_node, per_stage))


def _split_dim(arch: Arch) -> int:
    """The dimension tensor parallelism shards."""
    return arch.heads if arch.family != "wide_resnet" else arch.base_channels


@functools.lru_cache(maxsize=4096)
def _tp_degrees(split_dim: int, gpus_per_node: int, per_stage: int) -> tuple[int, ...]:
    return tuple(t for t in _pow2_upto(min(gpus_per_node, 8, per_stage))
                 if per_stage % t == 0 and gpus_per_node % t == 0 and split_dim % t == 0)


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


@functools.lru_cache(maxsize=4096)
def _microbatch_counts(per_replica_batch: int, pp: int) -> tuple[int, ...]:
    return tuple(microbatch_counts(per_replica_batch, pp))


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
    def __init__(self, params: CostParams | None = None, layer_source=None, per_stage: bool | None = None,
                 stage_band="default"):
        self.params = params or calibrated_params()
        # per-stage (dp, tp) plans (perf/stage_shapes.py); None = $ARENA_OPT_PER_STAGE decides
        self.per_stage = stage_shapes.enabled() if per_stage is None else per_stage
        # the error band a per-stage plan must win by (stage_shapes.margin): the committed band model by
        # default, None for the fixed stage_shapes.PER_STAGE_MARGIN
        if isinstance(stage_band, str):  # "default": loaded only where per-stage plans are searched
            stage_band = default_band() if self.per_stage else None
        self.stage_band = stage_band
        # optional callable (arena_opt.perf.profile_source.ProfileSource) giving measured LayerCosts;
        # it returns None where it has no profile and the analytical model is used
        self.layer_source = layer_source
        self._cache: dict[tuple, GridPlans] = {}
        self._disk: dict[str, list | GridPlans] = {}  # stored lists, or plans of this run (serialised on save)
        self._disk_dirty = False

    # --- on-disk cache: plans are deterministic in (code, params, model, batch, GPU, shape) --------------------
    def _disk_key(self, grid: tuple) -> str:
        arch, batch, gpu_name, gpu, intra_link, nodes, gpus_per_node, pp = grid
        return "|".join([_json(arch), str(batch), _json(gpu), str(intra_link), str(nodes), str(gpus_per_node),
                         str(pp), gpu_name])

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

        dumped: dict[int, dict] = {}  # id(Plan) -> its dump: grids share Plan objects (_plan_all's `made`)
        atomic_write(path, json.dumps({"version": _code_version(), "params": self._params_key(),
                                       "plans": {k: _stored(v, dumped) for k, v in self._disk.items()}}))
        self._disk_dirty = False

    def _params_key(self) -> str:
        band = ""
        if self.per_stage and self.stage_band is not None:  # the margin moves per-stage plans
            band = "|band:" + hashlib.sha1(self.stage_band.model_dump_json().encode()).hexdigest()[:16]
        return (self.params.model_dump_json() + "|" + str(getattr(self.layer_source, "digest", ""))
                + ("|per-stage" if self.per_stage else "") + band)

    def mem_cap_bytes(self, gpu: GpuSpec) -> float:
        return (gpu.memory_gib - self.params.mem_reserve_gib) * GIB

    def plan(self, arch: Arch, batch: int, gpu_name: str, gpu: GpuSpec, intra_link: str | None, nodes: int,
             gpus_per_node: int, pp: int) -> GridPlans:
        key = (arch, batch, gpu_name, gpu, intra_link, nodes, gpus_per_node, pp)
        hit = self._cache.get(key)
        return hit if hit is not None else self.plan_many([key])[0]

    def plan_many(self, grids: Sequence[tuple]) -> list[GridPlans]:
        """`plan` of every grid (`plan`'s arguments as one tuple); the grids in neither cache are planned
        together (`_plan_all`)."""
        out: list[GridPlans | None] = []
        todo: dict[tuple, list[int]] = {}
        loaded: dict[str, Plan] = {}  # a stored plan's text -> its validated Plan (most recur across grids)

        def stored_plan(p: dict) -> Plan:
            text = repr(p)
            plan = loaded.get(text)
            if plan is None:
                plan = loaded[text] = Plan.model_validate(p)
            return plan

        for i, key in enumerate(grids):
            hit = self._cache.get(key)
            if hit is None:
                stored = self._disk.get(self._disk_key(key))
                if isinstance(stored, GridPlans):  # planned in this run under another key object
                    hit = self._cache[key] = stored
                elif stored is not None:
                    batch = key[1]
                    pareto = [PlanResult(stored_plan(p), t, mem, batch) for p, t, mem in stored]
                    hit = self._cache[key] = GridPlans(pareto[0] if pareto else None, pareto)
                else:
                    todo.setdefault(key, []).append(i)
            out.append(hit)
        if todo:
            for key, hit in zip(todo, self._plan_all(list(todo))):
                self._cache[key] = hit
                self._disk[self._disk_key(key)] = hit
                self._disk_dirty = True
                for i in todo[key]:
                    out[i] = hit
        return out

    def _plan_all(self, grids: list[tuple]) -> list[GridPlans]:
        """Plans of grids, all at once. Every grid's candidates (tp, dp = GPUs / (pp tp), micro-batches) are
        costed in one `layer_costs` call per (model, GPU, link) and split in one `split_many` call per
        (layer count, pp), across grids and models: numpy's cost per call, not the arithmetic, was the
        planner's time, and each candidate's split is independent of the others in its stack.
        Recomputation only pays when the plain plan does not fit, so only the candidates without a plain
        split are tried with it."""
        cand = ([], [], [], [])  # grid, tp, dp, m; by grid, then tp, then m: the tie-break of equal plans
        groups: dict[tuple, int] = {}  # (model, GPU name, GPU, link) -> its cost group
        group_of = np.zeros(len(grids), dtype=int)
        # per model object (hashing a model is not free): its layers and the dimension tp shards
        models: dict[int, tuple[int, int]] = {}
        shapes: dict[tuple, tuple] = {}  # (sharded dim, GPUs per node, GPUs, pp, batch) -> (tp, dp, m) lists
        for g, (arch, batch, gpu_name, gpu, intra_link, nodes, gpn, pp) in enumerate(grids):
            n_gpus = nodes * gpn
            model = models.get(id(arch))
            if model is None:
                model = models[id(arch)] = (cost_table(arch, self.params).num_layers, _split_dim(arch))
            n_layers, split_dim = model
            if n_gpus % pp or pp > n_layers:
                continue
            group_of[g] = groups.setdefault((arch, gpu_name, gpu, intra_link), len(groups))
            key = (split_dim, gpn, n_gpus, pp, batch)
            tdm = shapes.get(key)
            if tdm is None:
                tdm = shapes[key] = tuple(map(list, zip(*(
                    (tp, dp, m) for tp in _tp_degrees(split_dim, gpn, n_gpus // pp)
                    if batch % (dp := n_gpus // (pp * tp)) == 0 for m in _microbatch_counts(batch // dp, pp))))) \
                    or ([], [], [])
            cand[0].extend([g] * len(tdm[0]))
            for col, x in zip(cand[1:], tdm):
                col.extend(x)
        out = [GridPlans(None)] * len(grids)
        if not cand[0]:
            return out
        g, tp, dp, m = (np.array(x) for x in cand)
        shape = {k: np.array([x[i] for x in grids]) for k, i in (("batch", 1), ("nodes", 5), ("gpn", 6), ("pp", 7))}
        caps = np.array([self.mem_cap_bytes(x[3]) for x in grids])
        plain = self._split_rows(list(groups), group_of, shape, caps, (g, tp, dp, m), np.arange(len(g)), False)
        ok = np.zeros(len(g), dtype=bool)
        hopeless = np.zeros(len(g), dtype=bool)
        for sp, rows, lc in plain:
            ok[rows] = sp.feasible
            # recomputation changes activations only: where the weights, gradients and optimizer state
            # alone fit in no split it cannot help (measured layers may differ in static bytes: tried)
            if self.layer_source is None and np.all(lc.static_bytes >= 0):
                hopeless[rows] = ~may_fit(lc.static_bytes, lc.static_bytes, shape["pp"][g[rows]], caps[g[rows]])
        found = [(sp, rows, False) for sp, rows, _ in plain]
        redo = np.flatnonzero(~ok & ~hopeless)
        if len(redo):
            found += [(sp, rows, True) for sp, rows, _ in self._split_rows(list(groups), group_of, shape, caps,
                                                                           (g, tp, dp, m), redo, True)]
        # per candidate: time, memory, recompute and where its best split is (candidates without one are
        # left out); a candidate has one split at most (recomputation only where the plain one fails). The
        # bounds are read for the Pareto entries only (medium: 4,112 of 9,825 feasible candidates)
        idx, times, mems, rcs, parts, at_part = [], [], [], [], [], []
        reserve = self.params.mem_reserve_gib
        for part, (sp, rows, rc) in enumerate(found):
            f = np.flatnonzero(sp.feasible)
            idx.append(rows[f])
            times.append(sp.iter_time_s[f])
            mems.append(sp.mem_bytes[f].max(axis=1) / GIB + reserve)
            rcs.append(np.full(len(f), rc))
            parts.append(np.full(len(f), part))
            at_part.append(f)
        if not idx:
            return out
        idx, times, mems, rcs, parts, at_part = (np.concatenate(x) for x in (idx, times, mems, rcs, parts, at_part))
        # by grid, then (time, memory), ties in candidate order: each grid's rows in the order that
        # a stable sort of its candidates by (time, memory) gives
        order = np.lexsort((idx, mems, times, g[idx]))
        idx, times, mems, rcs, parts, at_part = (x[order].tolist() for x in (idx, times, mems, rcs, parts, at_part))
        split_bounds = [sp.bounds for sp, _, _ in found]
        gl, tpl, dpl, ml = g.tolist(), tp.tolist(), dp.tolist(), m.tolist()
        made: dict[tuple, Plan] = {}
        at = 0
        while at < len(idx):
            x = gl[idx[at]]
            arch, batch, gpu_name, gpu, intra_link, nodes, gpn, pp = grids[x]
            pareto, best_mem = [], float("inf")
            while at < len(idx) and gl[idx[at]] == x:
                c, t, mem = idx[at], times[at], mems[at]
                if mem < best_mem - 1e-9:
                    b = split_bounds[parts[at]][at_part[at]].tolist()
                    # one (frozen) Plan per distinct plan: grids of other GPUs or shapes often share one
                    # (medium: 1,214 distinct among 4,112 Pareto entries)
                    key = (pp, dpl[c], tpl[c], ml[c], rcs[at], *b)
                    plan = made.get(key)
                    if plan is None:
                        plan = made[key] = _plan(pp, dpl[c], tpl[c], ml[c], [(b[j], b[j + 1]) for j in range(pp)],
                                                 rcs[at])
                    pareto.append(PlanResult.of(plan, t, mem, batch))
                    best_mem = mem
                at += 1
            if self.per_stage:
                pareto = self._per_stage(arch, cost_table(arch, self.params), gpu_name, gpu,
                                         links_for(gpu, intra_link, self.params), nodes, gpn, batch, pp,
                                         self.mem_cap_bytes(gpu), pareto)
            out[x] = GridPlans(pareto[0], pareto)
        return out

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
                lc = take(layer_costs(table, gpu, gpu_name, links, nodes=nodes, gpus_per_node=gpus_per_node,
                                      batch=batch, dp=np.array([dp]), tp=np.array([tp]), m=np.array([m]),
                                      recompute=np.array([rc]), params=self.params), 0)
            return lc

        shapes = [(n_gpus // (pp * tp), tp) for tp in tp_degrees(arch, gpus_per_node, n_gpus // pp)]
        base = pareto[0]
        got = stage_shapes.best_shaped(costs, shapes, batch, pp, base.plan, base.iter_time_s, cap,
                                       stage_shapes.margin(self.stage_band, arch.family, n_gpus,
                                                           base.plan.num_microbatches))
        if got is None:
            return pareto
        best = PlanResult(got[0], got[1], got[2] / GIB + self.params.mem_reserve_gib, batch)
        return [best, *(r for r in pareto if r.mem_gib < best.mem_gib - 1e-9)]

    def _split_rows(self, groups: list[tuple], group_of: np.ndarray, shape: dict[str, np.ndarray], caps: np.ndarray,
                    cols: tuple[np.ndarray, ...], rows: np.ndarray, rc: bool) -> list[tuple[Splits, np.ndarray]]:
        """Best split of each candidate of `rows` (indices into `cols`: grid, tp, dp, m), with or without
        recomputation. Analytical costs of a cost group's (model, GPU, link) candidates in one pass (the
        grids' nodes, GPUs per node and batch as arrays: `layer_terms` is elementwise in them), measured
        layers (`layer_source`) where a profile has them, then one DP per (layer count, pp). Returns
        (splits, the candidates they are of, their costs) triples."""
        g, tp, dp, m = cols
        grp = group_of[g[rows]]
        by_layers: dict[int, list[tuple[LayerCosts, np.ndarray]]] = {}
        for k in np.unique(grp).tolist():
            cs = rows[grp == k]
            arch, gpu_name, gpu, intra_link = groups[k]
            table = cost_table(arch, self.params)
            links = links_for(gpu, intra_link, self.params)
            batch, nodes, gpn = (shape[f][g[cs]] for f in ("batch", "nodes", "gpn"))
            lc = layer_costs(table, gpu, gpu_name, links, nodes=nodes[:, None], gpus_per_node=gpn[:, None],
                             batch=batch, dp=dp[cs], tp=tp[cs], m=m[cs], recompute=np.full(len(cs), rc),
                             params=self.params)
            if self.layer_source is not None:
                measured = [self.layer_source(arch, gpu_name, gpu, links, nodes=int(nodes[i]),
                                              gpus_per_node=int(gpn[i]), batch=int(batch[i]), dp=int(dp[c]),
                                              tp=int(tp[c]), m=int(m[c]), recompute=rc) for i, c in enumerate(cs)]
                if any(r is not None for r in measured):
                    lc = stack([r if r is not None else take(lc, i) for i, r in enumerate(measured)])
            # models of one layer count share a stack: each candidate's split is its own, and numpy's cost
            # per call, not the arithmetic, is most of split_many's time
            by_layers.setdefault(lc.num_layers, []).append((lc, cs))
        out = []
        for parts in by_layers.values():
            cs = np.concatenate([c for _, c in parts])
            lc = stack([lc for lc, _ in parts])
            pp = shape["pp"][g[cs]]
            for p in np.unique(pp).tolist():
                at = np.flatnonzero(pp == p)
                part = take(lc, at)
                out.append((split_many(part, p, m[cs[at]], caps[g[cs[at]]]), cs[at], part))
        return out


_PLAN_SET = frozenset({"pp", "dp", "tp", "num_microbatches", "stages", "recompute"})


def _plan(pp: int, dp: int, tp: int, m: int, stages: list[tuple[int, int]], recompute: bool) -> Plan:
    """The uniform Plan of a split the DP found, unvalidated: its values are Python ints and a bool, pp
    contiguous non-empty stages from layer 0 (what Plan's validators check), and validation was most of
    the Pareto loop's cost (tests/test_planner.py compares every such plan with the validated one)."""
    return unvalidated(Plan, {"pp": pp, "dp": dp, "tp": tp, "num_microbatches": m, "stages": stages,
                              "recompute": recompute, "stage_shapes": None}, _PLAN_SET)


def _stored(plans: list | GridPlans, dumped: dict[int, dict]) -> list:
    """A disk-cache entry: [(plan, time, memory)] of the Pareto set; `dumped` keeps each Plan's dump by
    object (the plans are alive for the whole save, so no id is reused): a cold large round dumps 10,700
    Pareto entries of a few thousand distinct plans, and the dumps were half of the save's CPU."""
    if isinstance(plans, GridPlans):
        out = []
        for r in plans.pareto:
            d = dumped.get(id(r.plan))
            if d is None:
                d = dumped[id(r.plan)] = r.plan.model_dump()
            out.append((d, r.iter_time_s, r.mem_gib))
        return out
    return plans


_JSON: dict = {}


def _json(model) -> str:
    """A (frozen, hashable) model's JSON, kept: every disk-cache key holds the model's and the GPU's."""
    s = _JSON.get(model)
    if s is None:
        s = _JSON[model] = model.model_dump_json()
    return s
