"""The best bound HiGHS proves on one round's monolithic level-1 model, given as long as it takes.

    python bench/round_bound.py [SNAPSHOT.json ...] [--gen CLUSTER/JOBS/SEED/RUNNING_FRACTION ...]
                                [--time-limit 1800] [--out bench/results]

The arena round the CLI solves under a 10 s limit is compared against this (issue 14: objective within 1%
of the bound). The model is the one `ArenaPolicy.choose` hands to HiGHS unsharded (candidate cut
included), as arrays, once as its LP relaxation (a bound in seconds to minutes) and once as the MILP with
the greedy start and the long limit; both bounds are valid, the smaller one is reported. `--gen` as in
bench/speed.py. Writes round_bound.json and round_bound.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from _provenance import write_result
from speed import generated

from arena_opt.io import load_model  # noqa: E402
from arena_opt.milp.greedy import greedy_start  # noqa: E402
from arena_opt.milp.linear import to_highs  # noqa: E402
from arena_opt.milp.local import improve  # noqa: E402
from arena_opt.milp.model import level1_model, model_constant, start_vector  # noqa: E402
from arena_opt.milp.shards import restrict  # noqa: E402
from arena_opt.milp.solve import run_highs  # noqa: E402
from arena_opt.perf.band import default_band  # noqa: E402
from arena_opt.perf.estimator import PerfEstimator  # noqa: E402
from arena_opt.perf.planner import plan_cache_path  # noqa: E402
from arena_opt.policies import make_policy  # noqa: E402
from arena_opt.policies.arena import candidates  # noqa: E402
from arena_opt.snapshot import ClusterSnapshot  # noqa: E402


IMPROVE_S = 10.0  # local improvement of the greedy start (the CLI's round gets what its limit leaves)


def round_model(snapshot_path: str):
    snap = load_model(snapshot_path, ClusterSnapshot)
    est = PerfEstimator(band=default_band())  # as the CLI's (arena_opt/cli.py `_estimator`): grids at the band's caution
    if plan_cache_path() is not None:
        est.planner.load_cache(plan_cache_path())
    pol = make_policy("arena", {}, estimator=est)
    p = pol.problem(snap)
    cand = candidates(p, pol.options.candidate_factor)
    return (restrict(p, cand) if cand is not None else p), pol.options


def bound_of(snapshot_path: str, time_limit: float) -> dict:
    p, o = round_model(snapshot_path)
    lm = level1_model(p)
    const = model_constant(p)
    greedy = greedy_start(p)
    sel = improve(p, greedy, until=time.perf_counter() + IMPROVE_S)
    out = {"snapshot": snapshot_path, "jobs": p.num_jobs, "grids": len(p.grids), "rows": lm.num_rows,
           "cols": lm.num_cols, "greedy_objective": p.objective(greedy), "improved_objective": p.objective(sel),
           "improve_s": IMPROVE_S, "load_1min": os.getloadavg()[0]}
    lp = to_highs(lm)
    t0 = time.perf_counter()
    word, info, _ = run_highs(lp, time_limit_s=time_limit, mip_gap=0.0, threads=o.threads,
                              options={"solve_relaxation": True})
    out["lp"] = {"status": word, "seconds": time.perf_counter() - t0,
                 "bound": float(info.objective_function_value) + const if info is not None else None}
    t0 = time.perf_counter()
    word, info, x = run_highs(lp, time_limit_s=time_limit, mip_gap=1e-4, threads=o.threads,
                              start=start_vector(lm, p, sel))
    mb = info.mip_dual_bound if info is not None else None
    out["mip"] = {"status": word, "seconds": time.perf_counter() - t0, "time_limit_s": time_limit,
                  "bound": float(mb) + const if mb is not None and abs(mb) < 1e30 else None,
                  "objective": float(info.objective_function_value) + const if x is not None else None}
    bounds = [b for b in (out["lp"]["bound"], out["mip"]["bound"]) if b is not None]
    out["best_bound"] = min(bounds) if bounds else None
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("snapshots", nargs="*")
    ap.add_argument("--gen", action="append", default=[], metavar="CLUSTER/JOBS/SEED/RUNNING_FRACTION")
    ap.add_argument("--time-limit", type=float, default=1800.0)
    # not in bench/run_all.py (a MILP of up to 30 minutes): its result goes to a scratch folder unless asked
    ap.add_argument("--out", default="/tmp/round_bound")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for label, snap in [(s, s) for s in args.snapshots] + [(f"gen-instance {g}", generated(g, tmp))
                                                              for g in args.gen]:
            rows.append({**bound_of(snap, args.time_limit), "snapshot": label})
    f = lambda v: "-" if v is None else f"{v:.6g}"  # noqa: E731
    lines = [f"# Best bound HiGHS proves on the monolithic round model\n\nCommand: `python {' '.join(sys.argv)}`\n",
             "| snapshot | jobs | grids | rows | LP bound | LP s | MILP status | MILP s | MILP bound | MILP incumbent "
             "| greedy start | improved (10 s) | best bound | greedy / bound | improved / bound | load |", "|" + "---|" * 16]
    for r in rows:
        ratio = lambda v: "-" if not r["best_bound"] else f"{v / r['best_bound']:.4f}"  # noqa: E731
        lines.append(f"| {r['snapshot']} | {r['jobs']} | {r['grids']} | {r['rows']} | {f(r['lp']['bound'])} | "
                     f"{r['lp']['seconds']:.0f} | {r['mip']['status']} | {r['mip']['seconds']:.0f} | "
                     f"{f(r['mip']['bound'])} | {f(r['mip']['objective'])} | {f(r['greedy_objective'])} | "
                     f"{f(r['improved_objective'])} | {f(r['best_bound'])} | {ratio(r['greedy_objective'])} | "
                     f"{ratio(r['improved_objective'])} | {r['load_1min']:.1f} |")
    write_result(out / "round_bound.json", {"time_limit_s": args.time_limit, "rows": rows}, "\n".join(lines) + "\n",
                 inputs=args.snapshots, default=float)
    print("\n".join(lines))
    return 0

if __name__ == "__main__":
    sys.exit(main())
