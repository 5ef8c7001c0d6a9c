"""Per-round decision time of the arena policy vs jobs and GPUs; monolithic vs sharded objective.

    python bench/solve.py [--out bench/results] [--rounds 3] [--quick]

Each case generates a seeded snapshot (Arena's node mix, scaled), warms the plan cache with one
round (as a running scheduler has), then times `rounds` rounds: wall and CPU (the process's, HiGHS's
thread included) per round, and the load average beside each case. On a shared 2-core host the wall time
of a round is its CPU stretched by the share of a core it gets, and once that reaches the time limit the
status turns `time_limit` with the same code: compare CPU across runs. Writes solve.json and solve.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

from rich.progress import Progress

from arena_opt.instances import ARENA_CLUSTER, generate_snapshot
from arena_opt.milp.options import ArenaOptions
from arena_opt.perf.estimator import PerfEstimator
from arena_opt.policies.arena import ArenaPolicy
from _provenance import machine, write_result


def scaled(factor: int) -> dict[str, tuple[int, int]]:
    return {t: (n * factor, g) for t, (n, g) in ARENA_CLUSTER.items()}


CASES = [  # (jobs, cluster scale: 1 = 1,280 GPUs, 8 = 10,240 GPUs)
    (50, 1), (150, 1), (1000, 1), (1000, 8), (2000, 8)]
SHARDS = [1, 4, 8]


def run_case(jobs: int, scale: int, shards: int, rounds: int, est: PerfEstimator, time_limit: float) -> dict:
    snap = generate_snapshot(scaled(scale), jobs, seed=jobs + scale)
    pol = ArenaPolicy(ArenaOptions(shards=shards, time_limit_s=time_limit), estimator=est)
    t0 = time.perf_counter()
    pol.decide(snap)  # warm-up: plans of every grid are cached from here on
    warm = time.perf_counter() - t0
    totals, cpus, builds, solves, last = [], [], [], [], None
    load = os.getloadavg()[0]
    for _ in range(rounds):
        t0, c0 = time.perf_counter(), time.process_time()
        d = pol.decide(snap)
        totals.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
        builds.append(d.stats.build_s)
        solves.append(d.stats.solve_s)
        last = d
    return {"jobs": jobs, "gpus": sum(n.num_gpus for n in snap.nodes), "shards": shards,
            "grids": last.stats.num_grids, "first_round_s": warm, "median_round_s": statistics.median(totals),
            "max_round_s": max(totals), "median_cpu_s": statistics.median(cpus), "load_1min": load,
            "median_build_s": statistics.median(builds),
            "median_solve_s": statistics.median(solves), "status": last.stats.status,
            "objective": last.stats.objective, "bound": last.stats.bound, "gap": last.stats.gap,
            "running": sum(j.runs for j in last.jobs)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--time-limit", type=float, default=10.0)
    ap.add_argument("--quick", action="store_true", help="only the 1,280-GPU cases")
    args = ap.parse_args(argv)
    cases = [c for c in CASES if not args.quick or c[1] == 1]
    est = PerfEstimator()
    rows = []
    with Progress() as prog:
        task = prog.add_task("cases", total=len(cases) * len(SHARDS))
        for jobs, scale in cases:
            for shards in SHARDS:
                if shards > 1 and jobs < 150:
                    prog.advance(task)
                    continue
                rows.append(run_case(jobs, scale, shards, args.rounds, est, args.time_limit))
                prog.advance(task)
    mono = {(r["jobs"], r["gpus"]): r["objective"] for r in rows if r["shards"] == 1}
    for r in rows:
        m = mono.get((r["jobs"], r["gpus"]))
        r["objective_vs_monolithic"] = r["objective"] / m if m else None
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"command": " ".join([Path(sys.executable).name, *sys.argv]), "machine": machine(),
            "time_limit_s": args.time_limit, "mip_gap": ArenaOptions().mip_gap}
    lines = [f"# Per-round solve time\n\nCommand: `{meta['command']}`  \nMachine: {meta['machine']}  \n"
             f"Time limit {args.time_limit} s, gap {meta['mip_gap']}, HiGHS 1 thread.\n",
             "| jobs | GPUs | shards | grids | first round s | median round s | max round s | median CPU s | load | build s | "
             "solve s | status | objective | gap | vs monolithic |", "|" + "---|" * 15]
    for r in rows:
        gap = "-" if r["gap"] is None else f"{r['gap']:.2%}"
        vs = "-" if r["objective_vs_monolithic"] is None else f"{r['objective_vs_monolithic']:.4f}"
        lines.append(f"| {r['jobs']} | {r['gpus']} | {r['shards']} | {r['grids']} | {r['first_round_s']:.2f} | "
                     f"{r['median_round_s']:.2f} | {r['max_round_s']:.2f} | {r['median_cpu_s']:.2f} | {r['load_1min']:.1f} | "
                     f"{r['median_build_s']:.2f} | "
                     f"{r['median_solve_s']:.2f} | {r['status']} | {r['objective']:.2f} | {gap} | {vs} |")
    write_result(out / "solve.json", {"meta": meta, "rows": rows}, "\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
