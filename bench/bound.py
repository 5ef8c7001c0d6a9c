"""The LP lower bound on average JCT (docs/BOUND.md): Philly, the shipped small trace, tiny exact instances.

    python bench/bound.py [--data DIR] [--out bench/results] [--parts philly,small,tiny]

- philly: Arena's setup exactly as bench/simulate.py runs it (philly_config), the bound and its seconds,
  and each policy's average JCT (run to completion) from the committed bench/results/simulate.json as a
  multiple of the bound.
- small: instances/traces/philly-like-small.jsonl on instances/clusters/small.json (simulate's defaults:
  analytical truth, 300 s rounds, checkpoint restarts): the bound under each reduction setting (epsilon,
  hull or Pareto grids, per-grid cuts), and every policy simulated on it as a multiple of the bound.
- tiny: seeded random instances (one node of 2-4 GPUs, 2-4 jobs) whose optimum over every tick schedule
  is found by exhaustive search (arena_opt.bound.exact): bound / optimum.
Writes <name>.json and <name>.md (default bound).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

_HERE = Path(__file__).resolve().parent
if sys.path and Path(sys.path[0]).resolve() == _HERE:
    sys.path.append(sys.path.pop(0))
sys.path.insert(0, str(_HERE.parent))

import numpy as np  # noqa: E402
from _perf_common import command, git_rev, machine, md_table, philly_config, write  # noqa: E402

from arena_opt.bound import BoundInstance, BoundJob, BoundOptions, frontier, solve  # noqa: E402
from arena_opt.bound.exact import TinyInstance, TinyJob, optimum  # noqa: E402
from arena_opt.sim.bound import config_bound  # noqa: E402
from arena_opt.sim.config import RunConfig  # noqa: E402

ROOT = _HERE.parent
SMALL = RunConfig(trace=str(ROOT / "instances/traces/philly-like-small.jsonl"),
                  cluster=str(ROOT / "instances/clusters/small.json"))
POLICIES = ["fcfs", "gavel", "sia", "elasticflow", "arena-greedy", "arena"]


def philly(data: str | None, opts: BoundOptions) -> dict | None:
    cfg = philly_config(data)
    if cfg is None:
        return None
    _, rec = config_bound(cfg, opts)
    committed = json.loads((ROOT / "bench/results/simulate.json").read_text())
    full = committed["modes"].get("full", {}).get("rows", [])
    print(f"philly: status {rec['status']}, bound {rec['avg_jct_bound_s']}, horizon {rec['horizon_s']:.0f} s, "
          f"tail {rec['tail_work']:.2e}, {rec['total_s']:.0f} s", flush=True)
    rec["policies"] = {r["policy"]: {"avg_jct_s": r["avg_jct_s"], "finished": r["finished"],
                                     "over_bound": r["avg_jct_s"] / rec["avg_jct_bound_s"]
                                     if rec["avg_jct_bound_s"] else None,
                                     "contention_free_s": r.get("avg_jct_bound_s")} for r in full}
    rec["policies_from"] = f"bench/results/simulate.json (run to completion, {committed['meta']['started']})"
    return rec


def small(opts: BoundOptions) -> dict:
    from arena_opt.metrics import compute
    from arena_opt.sim.config import load_inputs
    from arena_opt.sim.run import simulate

    settings = {"default": {}, "epsilon 1 (the coarse first pass alone)": {"epsilon": 1.0},
                "epsilon 0.25": {"epsilon": 0.25}, "epsilon 0.125": {"epsilon": 0.125},
                "fastest-grid cut only": {"grid_cuts": False},
                "horizon doubled on any spill (tail_tol 0)": {"tail_tol": 0.0}}
    out: dict = {"settings": {}}
    for name, upd in settings.items():
        _, rec = config_bound(SMALL, opts.model_copy(update=upd))
        out["settings"][name] = rec
    # Pareto grids instead of the hull: the same LP on the unreduced frontier
    from arena_opt.bound.instance import build_instance
    from arena_opt.sim.bound import restart_models

    trace, cluster, truth, _ = load_inputs(SMALL)
    jobs = [t.to_job() for t in trace]
    t0 = time.perf_counter()
    inst = build_instance(jobs, cluster, truth, interval_s=SMALL.interval_s, reconfig=restart_models(SMALL.reconfig),
                          hull=False)
    r = solve(inst, opts)
    out["settings"]["Pareto grids (no hull)"] = r.as_dict() | {"grids": sum(len(j.grids) for j in inst.jobs),
                                                                "total_s": time.perf_counter() - t0}
    bound = out["settings"]["default"]["avg_jct_bound_s"]
    out["policies"] = {}
    for p in POLICIES:
        t0 = time.perf_counter()
        m = compute(simulate(trace, cluster, p, truth=truth))
        out["policies"][p] = {"avg_jct_s": m["avg_jct_s"], "finished": m["finished"],
                              "over_bound": m["avg_jct_s"] / bound, "contention_free_s": m["avg_jct_bound_s"],
                              "sim_s": time.perf_counter() - t0}
    return out


def tiny_instances(n: int, seed: int = 0) -> list[TinyInstance]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        gpus = rng.choice([2, 3, 4])
        jobs = []
        for i in range(rng.choice([2, 3, 4])):
            counts = sorted(rng.sample(range(1, gpus + 1), rng.randint(1, gpus)))
            speed = tuple(zip(counts, np.cumsum([rng.randint(1, 3) for _ in counts]).tolist()))
            jobs.append(TinyJob(0 if i == 0 else rng.randint(0, 3), rng.randint(1, 6), speed))
        out.append(TinyInstance(gpus, 60.0, tuple(jobs)))
    return out


def tiny(opts: BoundOptions, n: int = 40) -> dict:
    rows = []
    for ti in tiny_instances(n):
        t0 = time.perf_counter()
        opt = optimum(ti)
        t1 = time.perf_counter()
        inst = ti.bound_instance()
        r = solve(inst, opts)
        hull = BoundInstance([BoundJob(j.id, j.submit, j.release, tuple(frontier(list(j.grids)))) for j in inst.jobs],
                             inst.capacity, inst.origin, inst.interval_s, [])
        rh = solve(hull, opts)
        rows.append({"gpus": ti.gpus, "jobs": len(ti.jobs), "optimum_s": opt, "bound_s": r.avg_jct_bound_s,
                     "bound_hull_s": rh.avg_jct_bound_s, "contention_free_s": r.contention_free_s,
                     "ratio": r.avg_jct_bound_s / opt, "ratio_hull": rh.avg_jct_bound_s / opt,
                     "search_s": t1 - t0})
    ratio = np.array([r["ratio"] for r in rows])
    return {"instances": rows, "ratio_mean": float(ratio.mean()), "ratio_min": float(ratio.min()),
            "ratio_median": float(np.median(ratio)), "exact": int((ratio > 1 - 1e-6).sum()),
            "violations": int((ratio > 1 + 1e-9).sum()),
            "ratio_hull_mean": float(np.mean([r["ratio_hull"] for r in rows])),
            "contention_free_ratio_mean": float(np.mean([r["contention_free_s"] / r["optimum_s"] for r in rows]))}


def _pass_table(passes: list[dict]) -> str:
    return md_table(["epsilon", "horizon (h)", "status", "bound (s)", "columns", "rows", "nonzeros", "build s",
                     "solve s", "work past horizon"],
                    [[p["epsilon"], f"{p['horizon_s'] / 3600:,.0f}", p["status"],
                      "-" if p["bound_s"] is None else f"{p['bound_s']:,.1f}", f"{p['columns']:,}", f"{p['rows']:,}",
                      f"{p['nonzeros']:,}", f"{p['build_s']:.1f}", f"{p['solve_s']:.1f}", f"{p['tail_work']:.1e}"]
                     for p in passes])


def _policy_rows(pol: dict) -> list[list]:
    return [[p, f"{v['avg_jct_s']:,.0f}", f"{v['over_bound']:.3f}",
             "-" if v.get("contention_free_s") is None else f"{v['avg_jct_s'] / v['contention_free_s']:.3f}"]
            for p, v in pol.items()]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=None, help="Arena data folder (default: $ARENA_OPT_DATA or ../shared/data/arena)")
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--parts", default="philly,small,tiny")
    ap.add_argument("--epsilon", type=float, default=0.5)
    ap.add_argument("--time-limit", type=float, default=900.0)
    ap.add_argument("--name", default="bound", help="stem of the written files (default bound)")
    args = ap.parse_args(argv)
    opts = BoundOptions(epsilon=args.epsilon, time_limit_s=args.time_limit)
    parts = args.parts.split(",")
    payload: dict = {"command": command(), "git": git_rev(), "machine": machine(),
                     "load_avg_at_start": os.getloadavg(), "started": time.strftime("%Y-%m-%d %H:%M:%S"),
                     "options": opts.model_dump()}
    md = ["# LP lower bound on average JCT\n", f"Command: `{command()}` (git {git_rev()}), started "
          f"{payload['started']}, load average {payload['load_avg_at_start'][0]:.1f} at the start on "
          f"{payload['machine'].get('cpus')} cores (the machine is shared). Proof and reductions: docs/BOUND.md.\n"]
    if "philly" in parts:
        rec = philly(args.data, opts)
        payload["philly"] = rec
        if rec is not None and rec["avg_jct_bound_s"] is None:
            md += ["## Philly (Arena's setup, as bench/simulate.py)\n",
                   f"No bound: HiGHS ended with status {rec['status']!r} without usable duals after "
                   f"{rec['total_s']:.0f} s ({rec['columns']:,} columns).\n", _pass_table(rec["passes"])]
        elif rec is not None:
            md += ["## Philly (Arena's setup, as bench/simulate.py)\n",
                   f"Bound: average JCT >= **{rec['avg_jct_bound_s']:,.0f} s** over {rec['jobs']} jobs "
                   f"({rec['rejected']} rejected by the truth), LP status {rec['status']}; contention-free "
                   f"{rec['contention_free_s']:,.0f} s (with first tick and restart). {rec['columns']:,} columns, "
                   f"{rec['rows']:,} rows; instance {rec['instance_s']:.1f} s, LP build {rec['build_s']:.1f} s, "
                   f"solve {rec['solve_s']:.1f} s, total {rec['total_s']:.1f} s. Work past the horizon: "
                   f"{rec['tail_work']:.2e}.\n",
                   "Every LP it solved (the coarse first pass, then the one asked for; a valid bound from each):\n",
                   _pass_table(rec["passes"]),
                   f"Policies from {rec['policies_from']}:\n",
                   md_table(["policy", "avg JCT (s)", "avg JCT / LP bound", "avg JCT / contention-free"],
                            _policy_rows(rec["policies"]))]
    if "small" in parts:
        s = small(opts)
        payload["small"] = s
        b = s["settings"]["default"]["avg_jct_bound_s"]
        md += ["## Shipped small trace (120 jobs, 64 GPUs, analytical truth, 300 s rounds, checkpoint restarts)\n",
               md_table(["LP setting", "bound (s)", "vs default", "grids", "columns", "seconds"],
                        [[k, f"{v['avg_jct_bound_s']:,.1f}", f"{v['avg_jct_bound_s'] / b:.4f}", v.get("grids", "-"),
                          f"{v['columns']:,}", f"{v['total_s']:.1f}"] for k, v in s["settings"].items()]),
               md_table(["policy", "avg JCT (s)", "avg JCT / LP bound", "avg JCT / contention-free"],
                        _policy_rows(s["policies"]))]
    if "tiny" in parts:
        t = tiny(opts)
        payload["tiny"] = t
        md += ["## Tiny exact instances (one node of 2-4 GPUs, 2-4 jobs, 60 s ticks, no restart cost)\n",
               f"{len(t['instances'])} seeded instances, optimum by exhaustive search over every tick schedule. "
               f"Bound / optimum: mean {t['ratio_mean']:.3f}, median {t['ratio_median']:.3f}, min "
               f"{t['ratio_min']:.3f}; exact on {t['exact']}; above the optimum on {t['violations']}. With the "
               f"hull reduction: mean {t['ratio_hull_mean']:.3f}. Contention-free / optimum: mean "
               f"{t['contention_free_ratio_mean']:.3f}.\n"]
    payload["load_avg_at_end"] = os.getloadavg()
    md.append(f"Load average at the end: {payload['load_avg_at_end'][0]:.1f}.\n")
    inputs = [ROOT / "bench/results/simulate.json"] if payload.get("philly") else []  # the policies' JCTs
    write(Path(args.out), args.name, payload, "\n".join(md) + "\n", inputs=inputs)
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
