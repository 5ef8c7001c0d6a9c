"""The best bound HiGHS proves on one round's monolithic level-1 model, given as long as it takes.

    python bench/round_bound.py [SNAPSHOT.json ...] [--gen CLUSTER/JOBS/SEED/RUNNING_FRACTION ...]
                                [--time-limit 1800] [--no-mip] [--out bench/results]

The arena round the CLI solves under a 10 s limit is compared against this (issue 14: objective within 1%
of the bound). The model is the one `ArenaPolicy.choose` hands to HiGHS unsharded (candidate cut
included), as arrays, once as its LP relaxation (a bound in seconds to minutes) and once as the MILP with
the greedy start and the long limit, and the LP relaxation of its pure-capacity form (`capacity_lp`, exact
where no node is shared by running jobs, and tighter); every bound is valid, the smallest one is reported.
The greedy start and its local improvement (10 s) are reported against it. `--gen` as in bench/speed.py. Writes round_bound.json and round_bound.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from _provenance import write_result
from speed import generated

from arena_opt.io import load_model  # noqa: E402
from arena_opt.milp.candidates import candidates  # noqa: E402
from arena_opt.milp.greedy import greedy_start  # noqa: E402
from arena_opt.milp.linear import to_highs  # noqa: E402
from arena_opt.milp.local import Packing, improve  # noqa: E402
from arena_opt.milp.linear import LinearModel  # noqa: E402
from arena_opt.milp.model import level1_model, model_constant, start_vector  # noqa: E402
from arena_opt.milp.shards import restrict  # noqa: E402
from arena_opt.milp.solve import run_highs  # noqa: E402
from arena_opt.perf.band import default_band  # noqa: E402
from arena_opt.perf.estimator import PerfEstimator  # noqa: E402
from arena_opt.perf.planner import plan_cache_path  # noqa: E402
from arena_opt.policies import make_policy  # noqa: E402
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


def capacity_lp(p, sel: dict, time_limit: float, threads: int) -> dict:
    """LP relaxation of the round in its pure-capacity form (milp/local.py `Packing`): one binary per grid
    worth its gain, one grid per job, the pool-threshold rows. Where no node is shared by running jobs
    this has the same integer points and objective as the monolithic model, and its relaxation is
    tighter (a grid's deadline penalty is exact in its gain, not a slack over mixed grids), so its
    optimum bounds the round; with shared nodes it fixes their jobs' kept status and bounds nothing."""
    pk = Packing(p, sel)
    if pk.pinned.any():
        return {"status": "not_run (nodes shared by running jobs)", "seconds": 0.0, "bound": None}
    lm = LinearModel(sense="max")
    x = lm.add_vars("x", "B", np.r_[p.gain()])
    jobs, row = np.unique(p.job_of, return_inverse=True)
    lm.add_rows("one_grid_per_job", row, x.col(np.arange(len(p.grids))), 1.0, hi=1.0, labels=list(jobs))
    r, c = np.nonzero(pk.vec[:-1].T)
    lm.add_rows("pool_threshold", r, x.col(c), pk.vec[:-1].T[r, c], hi=pk.cap, labels=list(range(len(pk.cap))))
    t0 = time.perf_counter()
    word, info, _ = run_highs(to_highs(lm), time_limit_s=time_limit, mip_gap=0.0, threads=threads,
                              options={"solve_relaxation": True})
    const = p.objective({})  # no grid at all: every preemption and soft-target penalty paid
    return {"status": word, "seconds": time.perf_counter() - t0,
            "bound": float(info.objective_function_value) + const if info is not None and word == "Optimal" else None}


def bound_of(snapshot_path: str, time_limit: float, mip: bool = True) -> dict:
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
    out["capacity_lp"] = capacity_lp(p, sel, time_limit, o.threads)
    out["mip"] = {"status": "not_run", "seconds": 0.0, "time_limit_s": 0.0, "bound": None, "objective": None}
    if mip:
        t0 = time.perf_counter()
        word, info, x = run_highs(lp, time_limit_s=time_limit, mip_gap=1e-4, threads=o.threads,
                                  start=start_vector(lm, p, sel))
        mb = info.mip_dual_bound if info is not None else None
        out["mip"] = {"status": word, "seconds": time.perf_counter() - t0, "time_limit_s": time_limit,
                      "bound": float(mb) + const if mb is not None and abs(mb) < 1e30 else None,
                      "objective": float(info.objective_function_value) + const if x is not None else None}
    bounds = [b for b in (out["lp"]["bound"], out["capacity_lp"]["bound"], out["mip"]["bound"]) if b is not None]
    out["best_bound"] = min(bounds) if bounds else None
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("snapshots", nargs="*")
    ap.add_argument("--gen", action="append", default=[], metavar="CLUSTER/JOBS/SEED/RUNNING_FRACTION")
    ap.add_argument("--time-limit", type=float, default=1800.0)
    ap.add_argument("--no-mip", action="store_true", help="the LP bounds only (the MILP takes up to the limit)")
    # not in bench/run_all.py (a MILP of up to 30 minutes): its result goes to a scratch folder unless asked
    ap.add_argument("--out", default="/tmp/round_bound")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for label, snap in [(s, s) for s in args.snapshots] + [(f"gen-instance {g}", generated(g, tmp))
                                                              for g in args.gen]:
            rows.append({**bound_of(snap, args.time_limit, mip=not args.no_mip), "snapshot": label})
    f = lambda v: "-" if v is None else f"{v:.6g}"  # noqa: E731
    lines = [f"# Best bound HiGHS proves on the monolithic round model\n\nCommand: `python {' '.join(sys.argv)}`\n",
             "| snapshot | jobs | grids | rows | LP bound | LP s | capacity LP bound | capacity LP s | MILP status | MILP s | MILP bound | MILP incumbent "
             "| greedy start | improved (10 s) | best bound | greedy / bound | improved / bound | load |", "|" + "---|" * 18]
    for r in rows:
        ratio = lambda v: "-" if not r["best_bound"] else f"{v / r['best_bound']:.4f}"  # noqa: E731
        lines.append(f"| {r['snapshot']} | {r['jobs']} | {r['grids']} | {r['rows']} | {f(r['lp']['bound'])} | "
                     f"{r['lp']['seconds']:.0f} | {f(r['capacity_lp']['bound'])} | {r['capacity_lp']['seconds']:.0f} | "
                     f"{r['mip']['status']} | {r['mip']['seconds']:.0f} | "
                     f"{f(r['mip']['bound'])} | {f(r['mip']['objective'])} | {f(r['greedy_objective'])} | "
                     f"{f(r['improved_objective'])} | {f(r['best_bound'])} | {ratio(r['greedy_objective'])} | "
                     f"{ratio(r['improved_objective'])} | {r['load_1min']:.1f} |")
    write_result(out / "round_bound.json", {"time_limit_s": args.time_limit, "rows": rows}, "\n".join(lines) + "\n",
                 inputs=args.snapshots, default=float)
    print("\n".join(lines))
    return 0

if __name__ == "__main__":
    sys.exit(main())
