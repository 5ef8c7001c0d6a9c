"""Error bands of the estimates (arena_opt/perf/band.py) on Arena's measured table, leave-one-type-out.

    python bench/band.py [--table PATH] [--out bench/results] [--level 0.8]

For each GPU type T the cost model is fitted on the other three types (`calibrate.fit`, as
bench/estimator.py does) and T's grids are estimated twice: in the measured runtime's plan space
(`reference` residuals) and by the planner (`planner` residuals, the plans the scheduler sees). All
these out-of-sample residuals make the committed band model `arena_opt/perf/band.json`, which
`arena-opt plan` shows and the policies decide on.

Coverage is checked one level further out: T's bands come from a model built on the other types'
residuals only, and the share of T's measured times inside them is reported against the nominal level.
Writes band.json and band.md (with the fold parameters, which tests/test_band.py reuses).
"""

from __future__ import annotations

import math
import sys
import time
from collections import defaultdict
from pathlib import Path

_HERE = Path(__file__).resolve().parent
if sys.path and Path(sys.path[0]).resolve() == _HERE:
    sys.path.append(sys.path.pop(0))
sys.path.insert(0, str(_HERE.parent))

import numpy as np  # noqa: E402
from _perf_common import command, git_rev, machine, md_table, table_parser, write  # noqa: E402
# the calibration's base parameters and measured rows: the same folds
from estimator import ARENA_BASE, measured_observations  # noqa: E402

from arena_opt.perf import calibrate as cal  # noqa: E402
from arena_opt.perf.analytical import CostParams  # noqa: E402
from arena_opt.perf.band import DEFAULT_PATH, BandModel, ResidualRow, residuals  # noqa: E402
from arena_opt.perf.estimator import PerfEstimator  # noqa: E402
from arena_opt.perf.table import load_plan_compute_times  # noqa: E402


def log(msg: str) -> None:
    print(f"[band] {msg}", file=sys.stderr, flush=True)


def fold_residuals(test: list[cal.Observation], params: CostParams) -> list[ResidualRow]:
    """Reference and planner residuals of one held-out type's grids at its fold's parameters; the planner's
    are `PerfEstimator.best`, the estimate the scheduler sees."""
    est = PerfEstimator(params, table_mode="off")
    planned = []
    for o in test:
        r = est.best(o.arch, o.batch, o.gpu, o.intra_link, o.gpu_type, o.nodes, o.gpus_per_node)
        planned.append(cal.Residual(o, r.iter_time_s, r.plan) if r is not None else cal.Residual(o, float("inf"), None))
    return residuals("reference", cal.residuals(test, params, cal.ARENA_SPACE)) + residuals("planner", planned)


def coverage(rows: list[ResidualRow], level: float, min_group: int = 20) -> dict:
    """Leave-one-type-out coverage: each type's residuals against a model of the other types'."""
    out: dict = {"by_type": {}, "by_family": defaultdict(lambda: [0, 0])}
    tot = {"reference": [0, 0], "planner": [0, 0]}
    widths = {"reference": [], "planner": []}
    for held in sorted({r.gpu_type for r in rows}):
        model = BandModel.build([r for r in rows if r.gpu_type != held], level=level, min_group=min_group)
        per = {"reference": [0, 0], "planner": [0, 0]}
        for r in (r for r in rows if r.gpu_type == held):
            b = model.band(1.0, r.family, r.num_gpus, r.microbatches)
            meas = math.exp(r.log_ratio)
            inside = b.lo_s <= meas <= b.hi_s
            for acc in (per[r.kind], tot[r.kind], out["by_family"][(r.kind, r.family)]):
                acc[0] += inside
                acc[1] += 1
            widths[r.kind].append(b.hi_s / b.lo_s)
        out["by_type"][held] = {k: {"inside": v[0], "n": v[1], "coverage": v[0] / v[1] if v[1] else None}
                                for k, v in per.items()}
        out["by_type"][held]["widen"] = [model.widen_lo, model.widen_hi]
    out["all"] = {k: {"inside": v[0], "n": v[1], "coverage": v[0] / v[1] if v[1] else None} for k, v in tot.items()}
    out["by_family"] = {f"{k}/{f}": {"inside": v[0], "n": v[1], "coverage": v[0] / v[1]}
                        for (k, f), v in sorted(out["by_family"].items())}
    out["median_width"] = {k: float(np.median(v)) if v else None for k, v in widths.items()}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = table_parser(__doc__)
    ap.add_argument("--model-out", type=Path, default=DEFAULT_PATH, help="where the band model goes")
    ap.add_argument("--level", type=float, default=0.8)
    args = ap.parse_args(argv)
    t_start = time.perf_counter()
    loaded = measured_observations(args.table)
    if loaded is None:
        return 2
    path, obs = loaded
    # each fit sees the other types' rows only, as bench/estimator.py's folds
    folds = cal.leave_one_type_out(obs, ARENA_BASE, plan_times=load_plan_compute_times(path))
    fold_params = {held: res.params.model_dump() for held, res in folds.items()}
    rows: list[ResidualRow] = []
    for held, res in folds.items():
        rows += fold_residuals([o for o in obs if o.gpu_type == held], res.params)
    log(f"{len(folds)} folds fitted, {time.perf_counter() - t_start:.0f} s")
    source = {"command": command(), "git": git_rev(), "table": str(path), "rows": len(obs),
              "params": "each type's residuals at calibrate.fit of the other types (from bench/estimator.py's "
                        "ARENA_BASE): the calibrated model's error"}
    model = BandModel.build(rows, level=args.level, source=source)
    model.save(args.model_out)
    cov = coverage(rows, args.level)
    groups = {}
    for fam in sorted({r.family for r in rows}):
        for n in (1, 2, 8):
            b = model.band(1.0, fam, n, 16)
            groups[f"{b.group}"] = {"lo": b.lo_s, "hi": b.hi_s, "n": b.n}
    payload = {"command": command(), "git": git_rev(), "machine": machine(), "table": str(path),
               "seconds": time.perf_counter() - t_start, "level": args.level, "widen_lo": model.widen_lo,
               "widen_hi": model.widen_hi, "groups": groups,
               "levels": {"lo": model.calibrated((1 - args.level) / 2), "hi": model.calibrated((1 + args.level) / 2)}, "coverage": cov, "fold_params": fold_params,
               "model": _shown(args.model_out)}
    md = render(payload)
    jp, mp = write(args.out, "band", payload, md, written=[args.model_out])
    print(md)
    log(f"wrote {jp}, {mp} and {args.model_out}")
    return 0


def _shown(path: Path) -> str:
    """The path relative to the checkout where it lies inside it."""
    try:
        return str(Path(path).resolve().relative_to(_HERE.parent))
    except ValueError:
        return str(path)


def render(p: dict) -> str:
    def pct(x):
        return "-" if x is None else f"{100 * x:.0f}%"

    cov = p["coverage"]
    rows = [[t, f"{pct(v['reference']['coverage'])} of {v['reference']['n']}",
             f"{pct(v['planner']['coverage'])} of {v['planner']['n']}", f"{v['widen'][0]:.3f} / {v['widen'][1]:.3f}"]
            for t, v in cov["by_type"].items()]
    rows.append(["all", f"{pct(cov['all']['reference']['coverage'])} of {cov['all']['reference']['n']}",
                 f"{pct(cov['all']['planner']['coverage'])} of {cov['all']['planner']['n']}",
                 f"{p['widen_lo']:.3f} / {p['widen_hi']:.3f} (all types)"])
    fam = [[k, f"{pct(v['coverage'])} of {v['n']}"] for k, v in cov["by_family"].items()]
    grp = [[k, f"{v['lo']:.2f}", f"{v['hi']:.2f}", v["n"]] for k, v in p["groups"].items()]
    m = p["machine"]
    return "\n".join([
        "# Error bands of the estimates (leave-one-type-out on Arena's measured table)\n",
        f"Command: `{p['command']}` (git {p['git']}), {p['seconds']:.0f} s on "
        f"{m.get('cpu_model', m['processor'])} ({m['cpus']} CPUs). Table: `{p['table']}`. "
        f"Nominal coverage {pct(p['level'])}, read at the held-out-calibrated quantile levels "
        f"{p['levels']['lo']:.3f} / {p['levels']['hi']:.3f} (conformal, perf/band.py). Model: `{p['model']}`. "
        "The residuals are the calibrated model's (each fold's fitted parameters).\n",
        "Coverage: the share of a held-out type's measured times inside the bands of a model built from "
        "the other types' residuals. `reference`: the estimate of the measured configuration (inside the "
        "calibrated region); `planner`: the planner's own best plan (outside it where its micro-batch "
        "count was never measured, priced with the widening). Widening: log-units per octave outside, "
        "lower / upper edge.\n",
        md_table(["held-out type", "reference", "planner", "widening lo / hi"], rows),
        "By family (all folds):\n",
        md_table(["kind/family", "coverage"], fam),
        "Bands inside the region (factor on the estimate, 16 micro-batches, all residuals):\n",
        md_table(["group", "lo", "hi", "residuals"], grp),
    ])


if __name__ == "__main__":
    sys.exit(main())
