"""Fit the analytical model's efficiencies to measured iteration times (Arena's `alpa_optimal` table).

Each measured row is the iteration time of the best plan a runtime found for (model, batch, GPU
type, nodes x GPUs per node); the model's counterpart is the fastest plan of that runtime's plan
space (`RuntimeSpace`), each plan with its exact stage split.

A plan's time with a fixed stage split is max over stages of (coefficients . rates), linear in the
rates of `analytical.RATE_NAMES`. The fit enumerates every candidate plan once, keeps its per-stage
coefficient rows, and minimizes a robust loss on log(predicted / measured) over the log-parameters
with Nelder-Mead on these matrices (milliseconds per evaluation). The best split of a plan moves with
the rates, so candidates are re-enumerated at the new rates and refitted until the loss settles.

What is fitted (`FitSpec`):
- one compute efficiency shared by all GPU types (fraction of each type's data-sheet peak), with
  which the other parameters are fitted;
- then, optionally (`per_type`), one efficiency per GPU type with a row some plan covers, and their
  trend with peak FLOP/s (`peak_trend`): what a GPU type the fit has not seen, or saw only in rows no
  plan covers, is priced with;
- properties of the software stack and cluster shared by all types: fp32 efficiency relative to
  tensor cores, memory-bandwidth efficiency, per-layer launch overhead and saturation work, the
  efficiency of each intra-node link kind seen in the data, and of the network;
- the prices of the knobs the planner turns and the measured runtime held fixed (it always ran 16
  micro-batches with rematerialisation): the fixed cost per micro-batch slot and stage, and the
  share of a forward pass that rematerialisation costs. The reference space cannot pin them; the
  envelope term does: the planner's fastest plan (its own space) may not undercut the measured
  optimum (`FitSpec.envelope`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from arena_opt.gpus import BUILTIN_GPUS, GpuSpec
from arena_opt.perf.analytical import (EFF_BOUNDS, EFF_REF_TFLOPS, GIB, CostParams, cost_table, intra_link_kind, layer_terms, links_for,
                                       rate_vector)
from arena_opt.perf.compose import evaluate_split, split_stages
from arena_opt.perf.table import PerfTable, PlanComputeTime
from arena_opt.plan import Plan
from arena_opt.perf.planner import microbatch_counts, tp_degrees
from models.catalog import ARCHITECTURES, Arch

# (low, high) of every fitted parameter; values are fitted in log space
_BOUNDS = {"eff": EFF_BOUNDS, "fp32_eff_scale": (0.05, 5.0), "mem_eff": (0.05, 1.0),
           "layer_overhead_s": (1e-6, 5e-3), "saturation_samples": (1e-3, 1e3), "intra_eff": (0.01, 1.0),
           "inter_comm_eff": (0.002, 1.0), "recompute_cost": (0.01, 1.5), "microbatch_overhead_s": (1e-6, 0.1)}
_START = {"saturation_samples": 0.5, "microbatch_overhead_s": 1e-3}  # where the uncalibrated default (0) is no starting point in log space
# Priors (center, sd of the log): published or typical values, so that a parameter the data hardly
# constrains (three GPU types with near-equal bandwidth-to-FLOP ratios cannot separate compute from
# memory time) stays physical instead of wandering to a bound. The fit is a MAP estimate.
PRIORS: dict[str, tuple[float, float]] = {
    "default_compute_eff": (0.6, 0.5),  # tensor-core GEMMs reach 60-80% of peak; whole layers less
    "compute_eff": (0.6, 0.5),
    "fp32_eff_scale": (1.0, 0.5),
    "mem_eff": (0.8, 0.5),  # streaming kernels reach 80-90% of HBM bandwidth
    "layer_overhead_s": (40e-6, 1.5),  # tens of microseconds of launches per layer pass
    "saturation_samples": (0.5, 2.0),
    "intra_eff": (0.8, 1.0),  # published link efficiencies; wide, PCIe through the host is often far slower
    "inter_comm_eff": (0.7, 3.0),  # the catalog's NIC figures are nominal; testbeds vary widely
    # a whole forward is redone under layer-boundary rematerialisation; wide, the data pins it
    "recompute_cost": (1.0, 1.0),
    # pipeline runtimes spend 0.1-10 ms per micro-batch and stage on dispatch and send/recv handshakes
    "microbatch_overhead_s": (1e-3, 2.5),
}


@dataclass(frozen=True)
class Observation:
    arch: Arch
    batch: int
    gpu_type: str
    gpu: GpuSpec
    intra_link: str | None
    nodes: int
    gpus_per_node: int
    measured_s: float

    @property
    def num_gpus(self) -> int:
        return self.nodes * self.gpus_per_node


def observations(table: PerfTable, gpus: dict[str, GpuSpec] | None = None,
                 intra_links: dict[str, str | None] | None = None) -> list[Observation]:
    """Rows of a table with a finite time whose model and GPU type the catalogs know."""
    gpus = gpus or BUILTIN_GPUS
    intra_links = intra_links or {}
    out = []
    for (model, batch, gpu_type, nodes, gpn), t in sorted(table.times.items()):
        if t is None or t > table.max_iter_time_s or model not in ARCHITECTURES or gpu_type not in gpus:
            continue
        out.append(Observation(ARCHITECTURES[model], batch, gpu_type, gpus[gpu_type], intra_links.get(gpu_type),
                               nodes, gpn, t))
    return out


@dataclass(frozen=True)
class RuntimeSpace:
    """The plan space of the runtime whose measurements are fitted. Efficiencies are properties of
    hardware and software stack; which plans exist is a property of the runtime, so the fit searches
    the measured runtime's plans, not the planner's."""

    microbatches: int | None = None  # fixed count (capped by the per-replica batch); None = the planner's
    recompute: str = "auto"  # "auto": only when the plain plan does not fit (as the planner); "always"


PLANNER_SPACE = RuntimeSpace()
# Arena's profiling scripts (runtime/jaxpr/crius_profiler.sh) run Alpa with 16 micro-batches, and its
# trainers always use Alpa's coarse-grained rematerialization
ARENA_SPACE = RuntimeSpace(microbatches=16, recompute="always")


def _microbatches(space: RuntimeSpace, per_replica: int, pp: int) -> list[int]:
    if space.microbatches is None:
        return microbatch_counts(per_replica, pp)
    m = min(space.microbatches, per_replica)
    while per_replica % m:
        m -= 1
    return [m]


@dataclass
class _Candidates:
    """Per-stage coefficient rows of every candidate plan of every observation."""

    coef: np.ndarray  # (stage rows, rates)
    plan_of_stage: np.ndarray  # stage row -> plan index
    obs_of_plan: np.ndarray  # plan index -> observation index
    num_obs: int
    covered: np.ndarray  # observations with at least one feasible plan
    plans: list[Plan]  # plan index -> plan

    def __post_init__(self):
        # first stage row of each plan and first plan of each covered observation (both arrays are sorted)
        self.stage_start = np.flatnonzero(np.r_[True, np.diff(self.plan_of_stage) != 0])
        self.plan_start = np.flatnonzero(np.r_[True, np.diff(self.obs_of_plan) != 0])
        self.obs_with_plans = self.obs_of_plan[self.plan_start] if self.plans else self.plan_start


def _enumerate(obs: list[Observation], params: CostParams, space: RuntimeSpace) -> _Candidates:
    rows, plan_of_stage, obs_of_plan, plans = [], [], [], []
    covered = np.zeros(len(obs), dtype=bool)
    for oi, o in enumerate(obs):
        table = cost_table(o.arch, params)
        links = links_for(o.gpu, o.intra_link, params)
        rates = rate_vector(params, o.gpu_type, o.gpu.peak_tflops, table.dtype, links.intra_kind, o.arch.family)
        cap = (o.gpu.memory_gib - params.mem_reserve_gib) * GIB
        n = o.num_gpus
        pp = 1
        while pp <= min(n, table.num_layers):
            for tp in tp_degrees(o.arch, o.gpus_per_node, n // pp):
                dp = n // (pp * tp)
                if o.batch % dp:
                    continue
                for m in _microbatches(space, o.batch // dp, pp):
                    for rc in ((True,) if space.recompute == "always" else (False, True)):
                        terms = layer_terms(table, o.gpu, links, nodes=o.nodes, gpus_per_node=o.gpus_per_node,
                                            batch=o.batch, dp=dp, tp=tp, m=m, recompute=rc)
                        lc = terms.costs(rates)
                        if pp == 1:
                            split = evaluate_split(lc, [(0, table.num_layers)], m)
                            split = split if split.mem_bytes[0] <= cap else None
                        else:
                            split = split_stages(lc, pp, m, cap)
                        if split is None:
                            continue
                        pi = len(plans)
                        obs_of_plan.append(oi)
                        plans.append(Plan(pp=pp, dp=dp, tp=tp, num_microbatches=m, stages=split.stages,
                                          recompute=rc))
                        for k, (a, b) in enumerate(split.stages):
                            rows.append(terms.stage_row(a, b, m, pp, sends=k < pp - 1))
                            plan_of_stage.append(pi)
                        covered[oi] = True
                        break  # recomputation only pays when the plain plan does not fit (as the planner)
            pp *= 2
    return _Candidates(np.array(rows), np.array(plan_of_stage), np.array(obs_of_plan), len(obs), covered, plans)


def _rate_keys(obs: list[Observation], params: CostParams, per_type: bool) -> list[tuple]:
    return [(o.gpu_type if per_type else "", o.gpu.peak_tflops, params.dtype(o.arch.family),
             intra_link_kind(o.gpu, o.intra_link), o.arch.family) for o in obs]


def _rate_rows(keys: list[tuple], params: CostParams) -> np.ndarray:
    uniq, index = _key_index(tuple(keys))
    return np.stack([rate_vector(params, *k) for k in uniq])[index]


@lru_cache(maxsize=16)
def _key_index(keys: tuple) -> tuple[list, np.ndarray]:
    uniq = sorted(set(keys))
    pos = {k: i for i, k in enumerate(uniq)}
    return uniq, np.array([pos[k] for k in keys])


def _plan_times(c: _Candidates, rate_rows: np.ndarray) -> np.ndarray:
    if not c.plans:
        return np.full(0, -np.inf)
    stage_t = np.einsum("ij,ij->i", c.coef, rate_rows[c.obs_of_plan[c.plan_of_stage]])
    # _enumerate appends each plan's stage rows together and the plans of one observation together,
    # so both reductions run over contiguous runs (reduceat: several times faster than ufunc.at, which
    # the fit's objective spent most of its time in)
    return np.maximum.reduceat(stage_t, c.stage_start)


def _fastest(c: _Candidates, rate_rows: np.ndarray) -> np.ndarray:
    obs_t = np.full(c.num_obs, np.inf)
    if c.plans:
        obs_t[c.obs_with_plans] = np.minimum.reduceat(_plan_times(c, rate_rows), c.plan_start)
    return obs_t


def predict(obs: list[Observation], params: CostParams, space: RuntimeSpace) -> list[tuple[float, Plan | None]]:
    """Iteration time and plan of the fastest plan of each observation's shape in `space`
    ((inf, None) where nothing fits)."""
    c = _enumerate(obs, params, space)
    plan_t = _plan_times(c, _rate_rows(_rate_keys(obs, params, True), params))
    out: list[tuple[float, Plan | None]] = [(math.inf, None)] * len(obs)
    for pi, (oi, t) in enumerate(zip(c.obs_of_plan, plan_t)):
        if t < out[oi][0]:
            out[oi] = (float(t), c.plans[pi])
    return out


# candidate values of a family's saturation (samples); the grid's step is 1% of s
_SATURATION_GRID = np.geomspace(1e-3, 1e2, 1200)


def fit_saturation(times: list[PlanComputeTime], space: RuntimeSpace = ARENA_SPACE) -> dict[str, float]:
    """Per model family, the saturation (`CostParams.saturation_samples`) that best explains how the
    compute time of one grid's pure data-parallel plans (pp = tp = 1) grows when dp splits the batch
    into smaller micro-batches: GPU-seconds dp * t_comp go as (1 + s / b) with b = batch / (dp * m).

    Why from these rows: the measured optima hold the micro-batch size nearly fixed per placement and
    leave s to trade against the slot cost and the efficiencies (folds fitted 0.15 to 3.5 samples for
    Wide-ResNet); Arena's per-plan compute times (profiled stages, no communication) vary b at one
    grid. Each grid's own level is eliminated (only ratios within a grid count), so the GPU type's
    speed does not enter; families with no grid of two dp values are left out."""
    groups: dict[tuple, dict[int, float]] = {}
    for t in times:
        if t.pp == 1 and t.tp == 1 and t.model in ARCHITECTURES and t.batch % t.dp == 0:
            g = groups.setdefault((t.model, t.batch, t.gpu_type), {})
            g[t.dp] = min(g.get(t.dp, math.inf), t.dp * t.comp_s)  # repeated estimates: the best run
    by_family: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
    for (model, batch, _), g in groups.items():
        if len(g) < 2:
            continue
        dps = sorted(g)
        b = np.array([(batch // d) / _microbatches(space, batch // d, 1)[0] for d in dps])
        y = np.log([g[d] for d in dps])
        by_family.setdefault(ARCHITECTURES[model].family, []).append((b, y - y.mean()))
    out = {}
    for fam, rows in sorted(by_family.items()):
        sse = np.zeros_like(_SATURATION_GRID)
        for b, y in rows:
            f = np.log1p(_SATURATION_GRID[:, None] / b[None, :])
            sse += ((f - f.mean(axis=1, keepdims=True) - y) ** 2).sum(axis=1)
        out[fam] = float(_SATURATION_GRID[int(np.argmin(sse))])
    return out


def _pseudo_huber(r: np.ndarray, delta: float) -> np.ndarray:
    return delta * delta * (np.sqrt(1.0 + (r / delta) ** 2) - 1.0)


def nelder_mead(f, x0: np.ndarray, step: float = 0.3, iters: int = 3000, tol: float = 1e-10) -> np.ndarray:
    """Minimize f from x0 (standard coefficients: reflect 1, expand 2, contract and shrink 0.5)."""
    n = len(x0)
    simplex = [np.array(x0, dtype=float)] + [x0 + step * np.eye(n)[i] for i in range(n)]
    vals = [f(x) for x in simplex]
    for _ in range(iters):
        order = np.argsort(vals)
        simplex = [simplex[i] for i in order]
        vals = [vals[i] for i in order]
        if abs(vals[-1] - vals[0]) <= tol * (abs(vals[0]) + tol):
            break
        centroid = np.mean(simplex[:-1], axis=0)
        xr = centroid + (centroid - simplex[-1])
        fr = f(xr)
        if fr < vals[0]:
            xe = centroid + 2 * (centroid - simplex[-1])
            fe = f(xe)
            simplex[-1], vals[-1] = (xe, fe) if fe < fr else (xr, fr)
        elif fr < vals[-2]:
            simplex[-1], vals[-1] = xr, fr
        else:
            xc = centroid + 0.5 * (simplex[-1] - centroid)
            fc = f(xc)
            if fc < vals[-1]:
                simplex[-1], vals[-1] = xc, fc
            else:
                best = simplex[0]
                simplex = [best] + [best + 0.5 * (s - best) for s in simplex[1:]]
                vals = [vals[0]] + [f(s) for s in simplex[1:]]
    return simplex[int(np.argmin(vals))]


@dataclass(frozen=True)
class FitSpec:
    per_type: bool = True
    fit_globals: tuple[str, ...] = ("fp32_eff_scale", "mem_eff", "layer_overhead_s", "saturation_samples",
                                    "intra_eff", "inter_comm_eff", "recompute_cost", "microbatch_overhead_s")
    space: RuntimeSpace = ARENA_SPACE
    # The measured time is the best plan the runtime's own search found: a plan of the planner's space
    # priced faster than that is a model error until shown otherwise. This space's fastest plan is
    # penalised (same robust loss) where it undercuts the measurement ("hinge") or wherever it misses it
    # ("match"); it is what pins the knobs the reference space holds fixed (micro-batch count,
    # recomputation). None: fit the reference space alone.
    envelope_space: RuntimeSpace | None = PLANNER_SPACE
    envelope: str = "hinge"
    envelope_weight: float = 1.0
    # an unseen type's efficiency follows the fitted types' trend with peak FLOP/s (`peak_trend`), not
    # their mean: measured leave-one-type-out, per-type bias of the planner's plans A100 -1.9% / V100 -3.7%
    # against +9.1% / -8.3% with the mean
    peak_trend: bool = True
    rounds: int = 4
    huber_delta: float = 0.05  # log units: about L1 beyond 5% error, so single odd rows do not steer
    use_priors: bool = True
    # one efficiency for every intra-node link kind: with a single type per kind in some folds, a
    # per-kind factor is not identified and wanders (measured: leave-one-type-out 10.3% vs 10.6%)
    shared_link_eff: bool = True

    def __post_init__(self) -> None:
        if self.rounds < 1:  # no round: no enumeration, nothing fitted and no rows known to be covered
            raise ValueError(f"FitSpec.rounds must be at least 1, got {self.rounds}")


@dataclass
class FitResult:
    params: CostParams  # per-type efficiencies for fitted types, their peak trend (`peak_trend`) for the rest
    shared_params: CostParams  # one efficiency for all types, with which the other parameters were fitted
    loss: float
    fitted: list[str] = field(default_factory=list)  # names of the fitted parameters


class _Vector:
    """Maps a flat log-vector to and from named CostParams entries ("mem_eff", "intra_eff:pcie",
    "compute_eff:a40", "default_compute_eff")."""

    def __init__(self, names: list[str]):
        self.names = names

    @staticmethod
    def _bound(name: str) -> tuple[float, float]:
        base = name.split(":")[0]
        return _BOUNDS["eff"] if base in ("compute_eff", "default_compute_eff") else _BOUNDS[base]

    def prior(self) -> tuple[np.ndarray, np.ndarray]:
        """log-centers and log-sds of the parameters' priors."""
        c, sd = zip(*(PRIORS[n.split(":")[0]] for n in self.names))
        return np.log(np.array(c)), np.array(sd)

    def get(self, params: CostParams) -> np.ndarray:
        out = []
        for name in self.names:
            base, _, key = name.partition(":")
            if base == "compute_eff":
                v = params.compute_eff.get(key, params.default_compute_eff)
            elif base == "intra_eff":
                v = params.link_eff("pcie" if key == "*" else key)
            elif base == "saturation_samples":
                v = params.saturation_samples.get(key) or _START[base]
            else:
                v = getattr(params, base) or _START.get(base, 1.0)
            lo, hi = self._bound(name)
            out.append(math.log(min(max(v, lo), hi)))
        return np.array(out)

    def set(self, params: CostParams, theta: np.ndarray) -> CostParams:
        upd: dict = {"compute_eff": dict(params.compute_eff), "intra_eff": dict(params.intra_eff),
                     "saturation_samples": dict(params.saturation_samples)}
        for name, x in zip(self.names, theta):
            lo, hi = self._bound(name)
            v = min(max(math.exp(x), lo), hi)
            base, _, key = name.partition(":")
            if key == "*":
                upd[base] = {k: v for k in ("nvlink", "pcie")}
            elif key:
                upd[base][key] = v
            else:
                upd[base] = v
        return params.model_copy(update=upd)


def _fit_stage(obs: list[Observation], params: CostParams, names: list[str], per_type: bool,
               spec: FitSpec) -> tuple[CostParams, float, np.ndarray]:
    """(fitted params, loss, the observations some plan of the last enumeration covers)"""
    meas = np.log(np.array([o.measured_s for o in obs]))
    keys = _rate_keys(obs, params, per_type)
    vec = _Vector(names)
    mu, sd = vec.prior()
    loss = math.inf
    # The envelope's space (every micro-batch count and depth) costs ~10x the reference space to
    # enumerate: its splits are taken once, at the stage's starting rates (a fixed split can only
    # overprice a plan, so the envelope stays a valid lower-side check)
    env = _enumerate(obs, params, spec.envelope_space) if spec.envelope_space is not None else None
    for _ in range(spec.rounds):
        cand = _enumerate(obs, params, spec.space)
        mask = cand.covered
        if not mask.any():  # nothing to fit: the mean over no rows would be NaN and steer nothing
            raise ValueError(f"none of the {len(obs)} observations has a plan that fits in memory in the fit's space")
        # Laplace likelihood of scale delta (the pseudo-Huber's L1 regime) against the Gaussian log-priors,
        # over the rows the data term averages (a row no plan covers adds no evidence)
        prior_w = 0.5 * spec.huber_delta ** 2 / max(int(mask.sum()), 1) if spec.use_priors else 0.0

        def objective(theta: np.ndarray) -> float:
            rows = _rate_rows(keys, vec.set(params, theta))
            pred = _fastest(cand, rows)
            data = np.mean(_pseudo_huber(np.log(pred[mask]) - meas[mask], spec.huber_delta))
            if env is not None:
                r = np.log(_fastest(env, rows)[env.covered]) - meas[env.covered]
                if spec.envelope == "hinge":
                    r = np.minimum(r, 0.0)
                data += spec.envelope_weight * np.mean(_pseudo_huber(r, spec.huber_delta))
            return float(data + prior_w * np.sum(((theta - mu) / sd) ** 2))

        theta = nelder_mead(objective, vec.get(params), step=0.7)
        theta = nelder_mead(objective, theta, step=0.2)  # restart: Nelder-Mead stalls in flat valleys
        new_loss = objective(theta)
        settled = abs(new_loss - loss) <= 1e-3 * new_loss
        params, loss = vec.set(params, theta), new_loss
        if settled:
            break
    return params, loss, mask


def fit(obs: list[Observation], base: CostParams | None = None, spec: FitSpec | None = None,
        plan_times: list[PlanComputeTime] | None = None) -> FitResult:
    """Fit the shared efficiency and the global parameters, then (optionally) one efficiency per type with
    a row some plan covers and their trend with peak FLOP/s (`FitSpec.peak_trend`), which prices the rest.
    ValueError when no row has a plan that fits in memory.
    With `plan_times` (Arena's per-plan compute times of the same types), each family's saturation is
    taken from them (`fit_saturation`) and held, not fitted on the measured optima."""
    spec = spec or FitSpec()
    base = (base or CostParams()).model_copy(update={"compute_eff": {}, "compute_eff_peak_exponent": 0.0,
                                                     "compute_eff_peak_range": None})
    held_sat = fit_saturation(plan_times) if plan_times else {}
    if held_sat:
        base = base.model_copy(update={"saturation_samples": {**base.saturation_samples, **held_sat}})
    names = ["default_compute_eff"]
    for g in spec.fit_globals:
        if g == "intra_eff" and spec.shared_link_eff:
            names.append("intra_eff:*")
        elif g == "intra_eff":
            # only link kinds some multi-GPU row crosses; the others keep their published default
            names += [f"intra_eff:{k}" for k in sorted({intra_link_kind(o.gpu, o.intra_link) for o in obs
                                                        if o.gpus_per_node > 1})]
        elif g == "saturation_samples":
            names += [f"saturation_samples:{f}" for f in sorted({o.arch.family for o in obs} - set(held_sat))]
        elif g == "inter_comm_eff":
            names += [g] if any(o.nodes > 1 for o in obs) else []
        else:
            names.append(g)
    shared, loss, covered = _fit_stage(obs, base, names, False, spec)
    params = shared
    if spec.per_type:
        # A type none of whose rows a plan covers has no evidence of its own: an efficiency fitted to the
        # prior alone would price it as if measured, so it is left to the trend like an unseen type.
        # Whether a plan fits is a matter of memory, which neither stage fits, so the shared stage's coverage
        # (of the reference space; rows only the envelope's wider space covers give no type its own) holds.
        types = sorted({o.gpu_type for o, c in zip(obs, covered, strict=True) if c})
        start = shared.model_copy(update={"compute_eff": {t: shared.default_compute_eff for t in types}})
        params, loss, covered = _fit_stage(obs, start, [f"compute_eff:{t}" for t in types], True, spec)
        if spec.peak_trend:  # a row no plan covers did not move its type's efficiency: it does not weigh
            params = peak_trend(params, [o for o, c in zip(obs, covered, strict=True) if c])
    return FitResult(params=params, shared_params=shared, loss=loss, fitted=names)


def peak_trend(params: CostParams, obs: list[Observation]) -> CostParams:
    """`params` whose unseen-type efficiency follows the fitted types' efficiencies as a power of their dense
    fp16 peak: least squares of log(eff) on log(peak / EFF_REF_TFLOPS), each type weighted by its rows.

    Why: the types' efficiencies are not spread at random around one mean; on Arena's table they rise
    with peak (A100 0.59 at 312 TFLOP/s, A40 0.51 at 150, V100 0.48 and A10 0.50 at 125), and every
    leave-one-type-out fold fits about the same exponent (0.16-0.23), so the trend transfers where the
    mean does not. Fewer than two distinct peaks: exponent 0 and the weighted geometric mean. The fitted
    peaks' range goes with the trend: `CostParams.eff` reads it no further than `PEAK_TREND_REACH` beyond
    them, as far as a fold has checked it (an H100 is not priced from types 3x slower at 3x)."""
    counts: dict[str, int] = {}
    peaks: dict[str, float] = {}
    for o in obs:
        if o.gpu_type in params.compute_eff:
            counts[o.gpu_type] = counts.get(o.gpu_type, 0) + 1
            peaks[o.gpu_type] = o.gpu.peak_tflops
    if not counts:
        return params
    types = sorted(counts)
    w = np.array([counts[t] for t in types], dtype=float)
    x = np.log([peaks[t] / EFF_REF_TFLOPS for t in types])
    y = np.log([params.compute_eff[t] for t in types])
    k = 0.0
    if np.ptp(x) > 0:
        xm, ym = np.average(x, weights=w), np.average(y, weights=w)
        k = float(np.clip(np.sum(w * (x - xm) * (y - ym)) / np.sum(w * (x - xm) ** 2), -1.0, 1.0))
    lo, hi = _BOUNDS["eff"]
    a = float(np.clip(np.average(y - k * x, weights=w), math.log(lo), math.log(hi)))
    return params.model_copy(update={"default_compute_eff": math.exp(a), "compute_eff_peak_exponent": k,
                                     "compute_eff_peak_range": (float(min(peaks.values())), float(max(peaks.values())))})


def _fold(args: tuple) -> FitResult:
    held, obs, base, spec, plan_times = args
    train_times = [t for t in plan_times if t.gpu_type != held] if plan_times else None
    res = fit([o for o in obs if o.gpu_type != held], base, spec, train_times)
    if held in res.params.compute_eff:
        raise AssertionError(f"fold {held}: the held-out type got its own efficiency")
    return res


def leave_one_type_out(obs: list[Observation], base: CostParams | None = None, spec: FitSpec | None = None,
                       held: list[str] | None = None, jobs: int = 1,
                       plan_times: list[PlanComputeTime] | None = None) -> dict[str, FitResult]:
    """One fit per GPU type T on the rows of the other types only: T's rows (measured and, with
    `plan_times`, Arena's per-plan compute times) never reach its fit, and T is priced as an unseen type
    (the other types' efficiency trend with peak FLOP/s at T's peak: `peak_trend`). `held`: only these folds; `jobs` > 1 fits folds in
    that many processes (the folds are independent: same results)."""
    types = sorted({o.gpu_type for o in obs}) if held is None else sorted(held)
    work = [(t, obs, base, spec, plan_times) for t in types]
    if jobs > 1 and len(work) > 1:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(min(jobs, len(work))) as pool:
            return dict(zip(types, pool.map(_fold, work)))
    return {t: _fold(w) for t, w in zip(types, work)}


@dataclass(frozen=True)
class Residual:
    """One observation priced by one parameter set in one plan space: log(predicted / measured) and the
    plan's knobs, so error bands can be drawn from residuals of similar configurations."""

    obs: Observation
    predicted_s: float
    plan: Plan | None

    @property
    def log_error(self) -> float:
        return math.log(self.predicted_s / self.obs.measured_s) if math.isfinite(self.predicted_s) else math.inf

    def config(self) -> dict:
        p = self.plan
        return {"model": self.obs.arch.name, "family": self.obs.arch.family, "batch": self.obs.batch,
                "gpu_type": self.obs.gpu_type, "nodes": self.obs.nodes, "gpus_per_node": self.obs.gpus_per_node,
                "pp": p.pp if p else None, "dp": p.dp if p else None, "tp": p.tp if p else None,
                "num_microbatches": p.num_microbatches if p else None, "recompute": p.recompute if p else None}


def residuals(obs: list[Observation], params: CostParams, space: RuntimeSpace) -> list[Residual]:
    return [Residual(o, t, plan) for o, (t, plan) in zip(obs, predict(obs, params, space))]


def loto_residuals(obs: list[Observation], folds: dict[str, FitResult], space: RuntimeSpace) -> list[Residual]:
    """Out-of-sample residuals: each type's rows priced by the fold that did not see them."""
    out = []
    for held, res in folds.items():
        out += residuals([o for o in obs if o.gpu_type == held], res.params, space)
    return out


__all__ = ["ARENA_SPACE", "PLANNER_SPACE", "FitResult", "FitSpec", "Observation", "Residual", "RuntimeSpace", "fit",
           "fit_saturation",
           "leave_one_type_out", "peak_trend", "loto_residuals", "nelder_mead", "observations", "predict", "residuals"]
