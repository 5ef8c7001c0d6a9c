"""A GPU type the fit never saw, profiled on one device: how much of the leave-one-type-out error is the
unknown device and how much the multi-GPU model.

    python bench/estimator_profiled.py [--table PATH] [--out bench/results]

Reads the leave-one-type-out folds of bench/results/estimator.json (each fitted without type T). For each T,
the fold's parameters are kept and T's compute efficiency alone is fitted on T's single-GPU measured rows:
the stand-in, in Arena's table, for profiling one device of a new type (what `arena-opt profile` does on a
real cluster) before any multi-GPU run of it. T's multi-GPU rows are then priced in the planner's own plan
space, as the scheduler sees them, and compared with the pure fold (the other types' efficiency trend
with peak FLOP/s, read at T's peak: `calibrate.peak_trend`) on the same rows. If the per-type bias of
the pure fold were the device's unknown efficiency, the profiled fold would remove it; what remains is
the multi-GPU part of the model.

The measured table's own scaling is shown beside it, computed from the rows: configurations where a job
runs more than linearly faster on more GPUs of one type (a cost model prices that only through memory:
recomputation or a deeper pipeline forced at the smaller count), and where the same GPU count spread over
more nodes runs faster (no model whose inter-node links are slower than its intra-node ones can price
it). Writes estimator_profiled.json and .md.
"""

from __future__ import annotations

import json
import sys
import time
from collections import defaultdict
from pathlib import Path

_HERE = Path(__file__).resolve().parent
if sys.path and Path(sys.path[0]).resolve() == _HERE:
    sys.path.append(sys.path.pop(0))
sys.path.insert(0, str(_HERE.parent))

from _perf_common import command, err_stats, fmt_pct, git_rev, machine, md_table, table_parser, write  # noqa: E402
from estimator import measured_observations, planner_predictions, rel_errors  # noqa: E402

from arena_opt.perf import calibrate as cal  # noqa: E402
from arena_opt.perf.analytical import CostParams  # noqa: E402

ESTIMATOR = _HERE / "results" / "estimator.json"
LINEAR_SLACK = 0.05  # a speed-up this much beyond linear, or a spread this much faster, counts


def profiled(fold: CostParams, held: str, single: list[cal.Observation]) -> CostParams:
    """The fold with `held`'s compute efficiency fitted on its single-GPU rows, everything else kept."""
    spec = cal.FitSpec(fit_globals=(), per_type=False)
    eff = cal.fit(single, fold, spec).params.default_compute_eff
    return fold.model_copy(update={"compute_eff": {**fold.compute_eff, held: eff}})


def scaling_irregularities(obs: list[cal.Observation]) -> dict:
    """Pairs of measured rows of one (model, batch, type) that no model of the class above can price."""
    by_job: dict = defaultdict(dict)
    for o in obs:
        by_job[(o.arch.name, o.batch, o.gpu_type)][(o.nodes, o.gpus_per_node)] = o.measured_s
    super_linear, spread_faster = [], []
    for (model, batch, gpu), runs in sorted(by_job.items()):
        shapes = sorted(runs, key=lambda s: (s[0] * s[1], s[0]))
        for i, a in enumerate(shapes):
            for b in shapes[i + 1:]:
                na, nb = a[0] * a[1], b[0] * b[1]
                row = {"model": model, "batch": batch, "gpu_type": gpu, "from": f"{a[0]}x{a[1]}",
                       "to": f"{b[0]}x{b[1]}", "from_s": runs[a], "to_s": runs[b]}
                if nb > na and runs[a] / runs[b] > (nb / na) * (1 + LINEAR_SLACK):
                    super_linear.append({**row, "speedup": runs[a] / runs[b], "gpus_ratio": nb / na})
                elif nb == na and b[0] > a[0] and runs[b] < runs[a] * (1 - LINEAR_SLACK):
                    spread_faster.append({**row, "speedup": runs[a] / runs[b]})
    return {"jobs": len(by_job), "super_linear": super_linear, "more_nodes_faster": spread_faster}


def main(argv: list[str] | None = None) -> int:
    ap = table_parser(__doc__)
    ap.add_argument("--estimator", type=Path, default=ESTIMATOR,
                    help="the estimator bench's result whose folds are profiled (default %(default)s)")
    args = ap.parse_args(argv)
    t_start = time.perf_counter()
    loaded = measured_observations(args.table)
    if loaded is None:
        return 2
    path, obs = loaded
    try:
        saved = json.loads(args.estimator.read_text())["fold_params"]
        folds = {t: CostParams.model_validate(p) for t, p in saved.items()}
    except (OSError, ValueError, KeyError) as e:
        print(f"{args.estimator}: no leave-one-type-out folds to profile ({e}); run bench/estimator.py first",
              file=sys.stderr)
        return 2
    per_type, pure_all, prof_all, multi_obs = {}, [], [], []
    for held, fold in sorted(folds.items()):
        rows = [o for o in obs if o.gpu_type == held]
        single = [o for o in rows if o.num_gpus == 1]
        multi = [o for o in rows if o.num_gpus > 1]
        if not single:
            per_type[held] = {"single_gpu_rows": 0, "note": "no single-GPU row to profile with"}
            continue
        prof = profiled(fold, held, single)
        pure = rel_errors(multi, planner_predictions(multi, fold))
        own = rel_errors(multi, planner_predictions(multi, prof))
        pure_all += pure
        prof_all += own
        multi_obs += multi
        per_type[held] = {"single_gpu_rows": len(single), "multi_gpu_rows": len(multi),
                          "eff_unseen": fold.eff(held, single[0].gpu.peak_tflops),
                          "eff_profiled": prof.compute_eff[held],
                          "pure": err_stats(pure), "profiled": err_stats(own)}
    by_gpus: dict = defaultdict(lambda: ([], []))
    for o, a, b in zip(multi_obs, pure_all, prof_all):
        by_gpus[o.num_gpus][0].append(a)
        by_gpus[o.num_gpus][1].append(b)
    irregular = scaling_irregularities(obs)
    payload = {"command": command(), "git": git_rev(), "machine": machine(), "table": str(path),
               "estimator": str(args.estimator), "seconds": time.perf_counter() - t_start,
               "per_type": per_type, "all_multi_gpu": {"pure": err_stats(pure_all), "profiled": err_stats(prof_all)},
               "by_num_gpus": {str(n): {"pure": err_stats(a), "profiled": err_stats(b)}
                               for n, (a, b) in sorted(by_gpus.items())},
               "measured_scaling": irregular}
    md = render(payload)
    jp, mp = write(args.out, "estimator_profiled", payload, md, inputs=[args.estimator])
    print(md)
    print(f"wrote {jp} and {mp}", file=sys.stderr)
    return 0


def render(p: dict) -> str:
    def stats(s: dict) -> list[str]:
        return [fmt_pct(s["median"]), fmt_pct(s["p90"]), fmt_pct(s["median_signed"])]

    rows = []
    for t, r in p["per_type"].items():
        if "pure" not in r:
            rows.append([t, 0, "-", "-", "-", "-", "-", "-", "-", "-"])
            continue
        rows.append([t, r["single_gpu_rows"], r["multi_gpu_rows"], f"{r['eff_unseen']:.3f}",
                     f"{r['eff_profiled']:.3f}", *stats(r["pure"]), *stats(r["profiled"])[:: 2]])
    a = p["all_multi_gpu"]
    rows.append(["all", sum(r.get("single_gpu_rows", 0) for r in p["per_type"].values()), a["pure"]["n"], "", "",
                 *stats(a["pure"]), *stats(a["profiled"])[:: 2]])
    head = ["held-out type", "1-GPU rows", "multi-GPU rows", "eff (unseen: trend)", "eff (profiled)",
            "pure: median |err|", "p90", "median signed", "profiled: median |err|", "median signed"]
    by_n = [[n, r["pure"]["n"], *stats(r["pure"]), *stats(r["profiled"])] for n, r in p["by_num_gpus"].items()]
    m = p["measured_scaling"]
    ex = sorted(m["super_linear"], key=lambda r: -r["speedup"] / r["gpus_ratio"])[:5]
    ex2 = sorted(m["more_nodes_faster"], key=lambda r: -r["speedup"])[:5]
    n_super = len(m["super_linear"])
    n_spread = len(m["more_nodes_faster"])
    return "\n".join([
        "# Leave-one-type-out with the held-out type profiled on one device",
        "",
        f"Command: `{p['command']}` (git {p['git']}), {p['seconds']:.0f} s on {p['machine']}. "
        f"Folds: `{p['estimator']}`; table `{p['table']}`.",
        "",
        "Each fold's parameters come from the other three types; `profiled` fits only the held-out type's compute "
        "efficiency on its single-GPU rows (a one-device profile). Errors: the planner's own best plan "
        "(`PerfEstimator(table_mode='off').best`) on the held-out type's multi-GPU rows, predicted / measured - 1.",
        "",
        md_table(head, rows),
        "By GPU count (multi-GPU rows of every held-out type):",
        "",
        md_table(["GPUs", "rows", "pure: median |err|", "p90", "median signed", "profiled: median |err|", "p90",
                  "median signed"], by_n),
        f"## The measured scaling ({m['jobs']} (model, batch, type) jobs of the table)",
        "",
        f"- {n_super} pairs of rows run more than {1 + LINEAR_SLACK:.2f}x linearly faster on more GPUs of one "
        "type (a cost model prices that only through memory: recomputation or a deeper pipeline forced at the "
        "smaller count); the largest, by speed-up over the GPU ratio:",
        "",
        md_table(["model", "batch", "type", "from", "to", "s", "s", "speed-up", "GPUs x"],
                 [[r["model"], r["batch"], r["gpu_type"], r["from"], r["to"], f"{r['from_s']:.2f}",
                   f"{r['to_s']:.2f}", f"{r['speedup']:.2f}", f"{r['gpus_ratio']:.0f}"] for r in ex]),
        f"- {n_spread} pairs run more than {LINEAR_SLACK:.0%} faster with the same GPUs spread over more nodes "
        "(a model with slower inter-node links than intra-node ones cannot price them):",
        "",
        md_table(["model", "batch", "type", "fewer nodes", "more nodes", "s", "s", "speed-up"],
                 [[r["model"], r["batch"], r["gpu_type"], r["from"], r["to"], f"{r['from_s']:.2f}",
                   f"{r['to_s']:.2f}", f"{r['speedup']:.2f}"] for r in ex2]),
    ])


if __name__ == "__main__":
    raise SystemExit(main())
