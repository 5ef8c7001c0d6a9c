"""Analytical estimator vs Arena's measured best-plan iteration times (`alpa_optimal`), calibrated
leave-one-GPU-type-out.

    python bench/estimator.py [--table PATH] [--out bench/results] [--jobs N]
    python bench/estimator.py --loto-only [--types a100-40gb,a40] [--by-shape] [--jobs N]   (iteration loop: prints
        the leave-one-type-out summary of those folds, writes nothing)
    python bench/estimator.py --loto-only --base moe_expert_parallel=true [--envelope-weight W]   (a variant:
        CostParams fields of the fit's starting point as JSON values, the weight of the fit's envelope term)

For each GPU type T: fit the cost model (`arena_opt.perf.calibrate.fit`) on the other three types,
then predict T's rows. T's compute efficiency (a fraction of T's data-sheet peak) is the other types'
efficiencies' trend with peak FLOP/s, read at T's peak (`calibrate.peak_trend`); nothing of T's data
is used but its catalog entry. Predictions are reported two ways:
- `reference space`: the fastest plan in the measured runtime's plan space (Alpa as Arena ran it:
  16 micro-batches, rematerialization), which is what the measurement is;
- `planner`: `PerfEstimator(table_mode="off").best(...)`, what the scheduler sees (the planner's own
  micro-batch and recomputation choices).
Also: the uncalibrated defaults, the in-sample fit (all four types) whose parameters are written to
`calibrated_params.json`, and Arena's own per-plan estimator (`arena_estimated`, best plan per grid)
against the same measurements for reference, and the time ratio when the same GPUs are spread over more
nodes, measured and planned (`spread_pairs`). Writes estimator.json and estimator.md; the in-sample
parameters also go to arena_opt/perf/calibrated_params.json (`--params-out`), the package data the planner
prices with by default (`analytical.calibrated_params`).
"""

from __future__ import annotations

import json
import math
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

_HERE = Path(__file__).resolve().parent
# run as `python bench/X.py`, bench/ comes first on sys.path and bench/runners.py would shadow the
# runners package: the repository root goes first, bench/ last
if sys.path and Path(sys.path[0]).resolve() == _HERE:
    sys.path.append(sys.path.pop(0))
sys.path.insert(0, str(_HERE.parent))

from pydantic import ValidationError  # noqa: E402

from _perf_common import (arena_estimates, command, err_stats, fmt_pct, git_rev, machine, md_table, table_parser,
                          table_path, write)

from arena_opt.cluster import ARENA_INTRA_LINKS
from arena_opt.perf import calibrate as cal
from arena_opt.perf.analytical import CALIBRATED_PATH, CostParams
from arena_opt.perf.estimator import PerfEstimator
from arena_opt.perf.table import PerfTable, load_plan_compute_times
from arena_opt.io import atomic_write  # noqa: E402

# Arena's runs use Alpa's GShard MoE (dense einsum dispatch, expert group 2048: Arena's configs.py)
ARENA_BASE = CostParams(moe_einsum_group=2048)


def with_fields(params: CostParams, assignments: list[str]) -> CostParams:
    """params with FIELD=JSON assignments applied, validated as CostParams (ValueError naming the bad one)."""
    upd = {}
    for a in assignments:
        name, sep, value = a.partition("=")
        if not sep or name not in CostParams.model_fields:
            raise ValueError(f"{a!r}: expected FIELD=JSON with FIELD one of CostParams' fields")
        try:
            upd[name] = json.loads(value)
        except json.JSONDecodeError as e:
            raise ValueError(f"{a!r}: the value is not JSON ({e.msg})") from None
    try:
        return CostParams.model_validate({**params.model_dump(), **upd})
    except ValidationError as e:
        raise ValueError(f"{', '.join(assignments)}: {e.errors()[0]['msg']}") from None


def log(msg: str) -> None:
    print(f"[estimator] {msg}", file=sys.stderr, flush=True)


def grouped(obs: list[cal.Observation], rel: list[float]) -> dict:
    out: dict[str, dict] = {"all": err_stats(rel)}
    for key, attr in (("gpu_type", lambda o: o.gpu_type), ("num_gpus", lambda o: o.num_gpus),
                      ("family", lambda o: o.arch.family)):
        groups: dict = defaultdict(list)
        for o, r in zip(obs, rel):
            groups[attr(o)].append(r)
        out[key] = {str(k): err_stats(v) for k, v in sorted(groups.items())}
    return out


def measured_observations(table: Path | None) -> tuple[Path, list[cal.Observation]] | None:
    """Arena's measured best-plan rows (`alpa_optimal`) of --table, else of the shared data, as the calibration's
    observations; None (after saying so) when there is no table: the bench exits 2."""
    path = table_path(table)
    if path is None:
        return None
    return path, cal.observations(PerfTable.load(path, "alpa_optimal"), intra_links=ARENA_INTRA_LINKS)


def planner_predictions(obs: list[cal.Observation], params: CostParams) -> list[float]:
    est = PerfEstimator(params, table_mode="off")
    out = []
    for o in obs:
        r = est.best(o.arch, o.batch, o.gpu, o.intra_link, o.gpu_type, o.nodes, o.gpus_per_node)
        out.append(r.iter_time_s if r is not None else float("inf"))
    return out


def rel_errors(obs: list[cal.Observation], pred: list[float]) -> list[float]:
    return [p / o.measured_s - 1.0 for o, p in zip(obs, pred)]


def arena_reference(path: Path, obs: list[cal.Observation]) -> dict:
    """Arena's own estimate of each grid's best plan (min over its per-plan estimates) vs the same
    measured rows, where Arena estimated that grid."""
    best = {key: min(plans.values()) for key, plans in arena_estimates(path).items()}
    sel, rel = [], []
    for o in obs:
        key = (o.arch.name, o.batch, o.gpu_type, o.nodes, o.gpus_per_node)
        if key in best:
            sel.append(o)
            rel.append(best[key] / o.measured_s - 1.0)
    return grouped(sel, rel)


def main(argv: list[str] | None = None) -> int:
    ap = table_parser(__doc__)
    ap.add_argument("--jobs", type=int, default=1, help="fit the folds in this many processes (same results)")
    ap.add_argument("--loto-only", action="store_true",
                    help="only the leave-one-type-out folds; print their summary, write no result")
    ap.add_argument("--types", default=None, help="with --loto-only: comma-separated held-out types")
    ap.add_argument("--by-shape", action="store_true",
                    help="with --loto-only: also one line per held-out type and placement (nodes x GPUs per node)")
    ap.add_argument("--params-out", type=Path, default=CALIBRATED_PATH,
                    help="where the in-sample parameters go as the package's default (also written to --out)")
    ap.add_argument("--envelope-weight", type=float, default=cal.FitSpec.envelope_weight,
                    help="weight of the fit's envelope term (the planner's fastest plan may not undercut the "
                         "measured optimum), relative to the data term; default %(default)s")
    ap.add_argument("--params-only", action="store_true",
                    help="only the in-sample fit: write calibrated_params.json (--out and --params-out), no result")
    ap.add_argument("--base", action="append", default=[], metavar="FIELD=JSON",
                    help="set a CostParams field of the fit's starting point (ARENA_BASE), e.g. "
                         "moe_expert_parallel=false: measure a variant of the model from the repository")
    t_start = time.perf_counter()
    args = ap.parse_args(argv)
    try:
        base = with_fields(ARENA_BASE, args.base)
    except ValueError as e:
        print(f"--base: {e}", file=sys.stderr)
        return 2
    if not (math.isfinite(args.envelope_weight) and args.envelope_weight >= 0):
        print(f"--envelope-weight: {args.envelope_weight} is not a finite number >= 0", file=sys.stderr)
        return 2
    spec = cal.FitSpec(envelope_weight=args.envelope_weight)
    loaded = measured_observations(args.table)
    if loaded is None:
        return 2
    path, obs = loaded
    types = sorted({o.gpu_type for o in obs})
    # Arena's per-plan compute times pin each family's saturation (calibrate.fit_saturation); a fold
    # gets those of its training types only
    plan_times = load_plan_compute_times(path)
    log(f"{len(obs)} measured rows, GPU types {types}, {len(plan_times)} per-plan compute times")

    if args.loto_only:
        held = args.types.split(",") if args.types else None
        unknown = sorted(set(held or ()) - set(types))
        if unknown:
            print(f"--types: no measured rows of {', '.join(unknown)} (have {', '.join(types)})", file=sys.stderr)
            return 2
        print(loto_summary(obs, cal.leave_one_type_out(obs, base, spec, held=held, jobs=args.jobs,
                                                                plan_times=plan_times),
                           by_shape=args.by_shape))
        return 0

    if args.params_only:
        log("in-sample fit on all types")
        write_params(cal.fit(obs, base, spec, plan_times).params, args.out, args.params_out)
        return 0

    # uncalibrated defaults (what the estimator uses without a calibration)
    default_pred = [t for t, _ in cal.predict(obs, base, cal.ARENA_SPACE)]
    uncal = grouped(obs, rel_errors(obs, default_pred))

    log("in-sample fit on all types")
    full = cal.fit(obs, base, spec, plan_times)
    insample_pred = [t for t, _ in cal.predict(obs, full.params, cal.ARENA_SPACE)]
    insample = grouped(obs, rel_errors(obs, insample_pred))
    insample_planner = grouped(obs, rel_errors(obs, planner_predictions(obs, full.params)))

    loo_obs: list[cal.Observation] = []
    loo_ref: list[float] = []
    loo_plan: list[float] = []
    rows = []
    fold_params = {}
    t0 = time.perf_counter()
    # each fit sees the other types' rows only
    folds = cal.leave_one_type_out(obs, base, spec, jobs=args.jobs, plan_times=plan_times)
    log(f"{len(folds)} leave-one-type-out fits, {time.perf_counter() - t0:.0f} s")
    by_key = {}
    for space_name, space in (("reference", cal.ARENA_SPACE), ("planner", cal.PLANNER_SPACE)):
        for r in cal.loto_residuals(obs, folds, space):
            by_key.setdefault(id(r.obs), {})[space_name] = r
    for held, res in folds.items():
        fold_params[held] = res.params.model_dump()
        test = [o for o in obs if o.gpu_type == held]
        for o, tp in zip(test, planner_predictions(test, res.params)):
            ref, own = by_key[id(o)]["reference"], by_key[id(o)]["planner"]
            loo_obs.append(o)
            loo_ref.append(ref.predicted_s)
            loo_plan.append(tp)
            # per-configuration out-of-sample residuals (log predicted/measured) for error bands
            rows.append({"model": o.arch.name, "batch": o.batch, "gpu_type": o.gpu_type, "nodes": o.nodes,
                         "gpus_per_node": o.gpus_per_node, "measured_s": o.measured_s, "predicted_s": ref.predicted_s,
                         "planner_s": tp, "plan": ref.plan.describe() if ref.plan else None,
                         "planner_plan": own.config(), "log_error_reference": ref.log_error,
                         "log_error_planner": math.log(tp / o.measured_s) if math.isfinite(tp) else None})

    loo = grouped(loo_obs, rel_errors(loo_obs, loo_ref))
    loo_planner = grouped(loo_obs, rel_errors(loo_obs, loo_plan))
    knobs: dict = defaultdict(list)  # planner-space error by the knobs its plan turned
    for row, r in zip(rows, rel_errors(loo_obs, loo_plan)):
        pl = row["planner_plan"]
        if pl["pp"] is not None:
            knobs[f"recompute={pl['recompute']}"].append(r)
            knobs[f"microbatches={'<16' if pl['num_microbatches'] < 16 else '16' if pl['num_microbatches'] == 16 else '>16'}"].append(r)
            knobs[f"pp={pl['pp']}"].append(r)
    loo_planner["plan_knobs"] = {k: err_stats(v) for k, v in sorted(knobs.items())}
    arena_ref = arena_reference(Path(path), obs)
    write_params(full.params, args.out, args.params_out)

    payload = {"command": command(), "git": git_rev(), "machine": machine(), "table": str(path),
               "seconds": time.perf_counter() - t_start, "rows": len(obs),
               "leave_one_type_out": loo, "leave_one_type_out_planner": loo_planner, "in_sample": insample,
               "in_sample_planner": insample_planner,
               "uncalibrated": uncal, "arena_own_estimator": arena_ref, "calibrated_params": full.params.model_dump(),
               "fold_params": fold_params, "spread_pairs": spread_pairs(rows), "predictions": rows}
    md = render(payload)
    jp, mp = write(args.out, "estimator", payload, md, written=[args.out / "calibrated_params.json", args.params_out])
    print(md)
    log(f"wrote {jp} and {mp}")
    return 0


def spread_pairs(rows: list[dict]) -> list[dict]:
    """Where the network model sits against the data: for each GPU type and pair of placements of the same GPU
    count (fewer nodes -> more nodes) of one model and batch, the median time ratio spread / packed, measured
    and as the held-out fold's planner prices it. A ratio the model cannot follow across types (one network
    efficiency for all) shows here before it shows in the error table."""
    by: dict = defaultdict(dict)
    for r in rows:
        by[(r["gpu_type"], r["model"], r["batch"])][(r["nodes"], r["gpus_per_node"])] = r
    pairs: dict = defaultdict(list)
    for (gpu, _, _), runs in by.items():
        for (n1, g1), a in runs.items():
            for (n2, g2), b in runs.items():
                if n1 * g1 == n2 * g2 and n2 > n1 and math.isfinite(a["planner_s"]) and math.isfinite(b["planner_s"]):
                    pairs[(gpu, f"{n1}x{g1}", f"{n2}x{g2}")].append(
                        (b["measured_s"] / a["measured_s"], b["planner_s"] / a["planner_s"]))
    return [{"gpu_type": g, "packed": pk, "spread": sp, "pairs": len(v),
             "measured_ratio": statistics.median(m for m, _ in v), "planner_ratio": statistics.median(e for _, e in v)}
            for (g, pk, sp), v in sorted(pairs.items())]


def write_params(params: CostParams, out: Path, params_out: Path) -> None:
    """The in-sample parameters into the results folder and the package's default (the same text)."""
    text = params.model_dump_json(indent=1) + "\n"
    for path in (out / "calibrated_params.json", params_out):
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, text)


def loto_summary(obs: list[cal.Observation], folds: dict[str, cal.FitResult], by_shape: bool = False) -> str:
    """One line per plan space and group (all, each held-out type; with `by_shape` also each held-out
    type and placement) of the given folds' rows."""
    lines = []
    for space_name, space in (("reference", cal.ARENA_SPACE), ("planner", None)):
        sel, pred = [], []
        for held, res in folds.items():
            test = [o for o in obs if o.gpu_type == held]
            sel += test
            pred += (planner_predictions(test, res.params) if space is None
                     else [t for t, _ in cal.predict(test, res.params, space)])
        rel = rel_errors(sel, pred)
        g = grouped(sel, rel)
        named = [("all", g["all"])] + [(f"gpu_type={k}", v) for k, v in g["gpu_type"].items()]
        if by_shape:  # where the error sits: held-out type x placement (nodes x GPUs per node)
            shapes: dict = defaultdict(list)
            for o, r in zip(sel, rel):
                shapes[(o.gpu_type, o.nodes * o.gpus_per_node, o.nodes)].append(r)
            named += [(f"{t} {k}x{n // k}", err_stats(v)) for (t, n, k), v in sorted(shapes.items())]
        for name, st in named:
            lines.append(f"{space_name:9s} {name:22s} n={st['n']:3d} median {fmt_pct(st['median'])} "
                         f"p90 {fmt_pct(st['p90'])} signed {fmt_pct(st['median_signed'])}")
    knobs = {k: (v.params.microbatch_overhead_s, v.params.recompute_cost, v.params.compute_eff_peak_exponent)
             for k, v in folds.items()}
    lines.append("per fold (micro-batch slot, recompute share, efficiency's peak exponent): "
                 + "; ".join(f"{k} {a * 1e3:.2f} ms, {b:.2f}, {c:.2f}" for k, (a, b, c) in knobs.items()))
    return "\n".join(lines)


def render(p: dict) -> str:
    def block(title: str, g: dict, note: str = "") -> str:
        s = f"### {title}\n\n{note}" + ("\n\n" if note else "")
        hdr = ["group", "rows", "median |err|", "p90 |err|", "median signed"]
        rows = [["all", g["all"]["n"], fmt_pct(g["all"]["median"]), fmt_pct(g["all"]["p90"]),
                 fmt_pct(g["all"]["median_signed"])]]
        for key in ("gpu_type", "num_gpus", "family", "plan_knobs"):
            for k, st in g.get(key, {}).items():
                rows.append([k if key == "plan_knobs" else f"{key}={k}", st["n"], fmt_pct(st["median"]), fmt_pct(st["p90"]),
                             fmt_pct(st["median_signed"])])
        return s + md_table(hdr, rows) + "\n"

    m = p["machine"]
    out = ["# Analytical estimator vs Arena's measured best-plan times (alpa_optimal)\n",
           f"Command: `{p['command']}` (git {p['git']}), {p['seconds']:.0f} s on {m.get('cpu_model', m['processor'])}"
           f" ({m['cpus']} CPUs), Python {m['python']}. Table: `{p['table']}`, {p['rows']} rows with a time.\n",
           "Relative error = predicted / measured - 1. Leave-one-GPU-type-out: fitted on the other three "
           "types; the held-out type's compute efficiency is the other types' trend with peak FLOP/s, read at its "
           "peak (`calibrate.peak_trend`).\n",
           "Knob prices (calibrated; `microbatch_overhead_s` per micro-batch slot and stage, `recompute_cost` "
           "as a share of a forward pass): "
           + "; ".join(f"{name} {q['microbatch_overhead_s'] * 1e3:.2f} ms, {q['recompute_cost']:.2f}"
                       for name, q in [("all types", p["calibrated_params"])]
                       + [(f"without {k}", v) for k, v in p["fold_params"].items()]) + ".\n",
           block("Leave-one-type-out, reference plan space (16 micro-batches, rematerialization)",
                 p["leave_one_type_out"]),
           block("Leave-one-type-out, arena-opt planner (`PerfEstimator(table_mode='off').best`)",
                 p["leave_one_type_out_planner"],
                 "The planner searches its own micro-batch counts and recomputation, so it finds plans the "
                 "measured runtime did not run; this is the estimate the scheduler sees. The last rows group "
                 "it by the knobs of the plan the planner picked."),
           "### Same GPUs over more nodes, leave-one-type-out planner\n\n"
           "Median time ratio spread / packed over the (model, batch) pairs measured in both placements and planned in both.\n\n"
           + md_table(["GPU type", "packed", "spread", "pairs", "measured", "planner"],
                      [[q["gpu_type"], q["packed"], q["spread"], q["pairs"], f"{q['measured_ratio']:.2f}",
                        f"{q['planner_ratio']:.2f}"] for q in p["spread_pairs"]]) + "\n",
           block("In-sample (fitted on all four types; parameters in calibrated_params.json), reference space",
                 p["in_sample"]),
           block("In-sample, planner space", p["in_sample_planner"]),
           block("Uncalibrated defaults (`CostParams(moe_einsum_group=2048)`)", p["uncalibrated"]),
           block("Reference: Arena's own per-plan estimator (best `arena_estimated` plan per grid)",
                 p["arena_own_estimator"], "Only grids Arena estimated (A100, A40, A10)."),
           ]
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
