"""Arena's Philly trace on Arena's 1,280-GPU cluster, every policy, as Arena's artifact runs it.

    python bench/simulate.py [--data DIR] [--out bench/results] [--policies all] [--modes 500,full] [--name simulate]
                             [--parallel N]

Setup (the artifact's): Alpa-optimal table as the truth for every policy (grids it lacks are
infeasible), iterations / 5 and deadline budgets x 5, 300 s rounds, restart cost 10 s/GPU (cap
40 s) for arena and arena-greedy and 150 s/GPU (cap 600 s) for the baselines. Modes: `500` stops
after 500 rounds (the artifact's figures), `full` runs until every submitted job has finished.
Each policy runs in its own process with a warm plan cache (the one-time planner warm-up is
reported apart). `--parallel N` runs N policies at a time in the given order, as `arena-opt bench --parallel N`
does (the wall time of the whole comparison is then what a user waits; each policy's CPU seconds still
compare). Writes <name>.json (metrics, wall and CPU times, machine, command) and <name>.md;
full per-policy results and plots go to results/bench-philly-<mode>/<name>/ (not committed).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

from _perf_common import philly_config
from arena_opt.argtypes import positive_int
from arena_opt.sim.bench import parse_policies, run_bench
from arena_opt.sim.results import markdown_table
from _provenance import write_result

# Artifact's own simulator on this setup, 500 rounds (finished jobs, avg JCT of finished jobs in s,
# avg throughput in samples/s over rounds with > 100), as given in issue 3
ARTIFACT_500 = {"arena-greedy": (222, 17551, 4704), "sia": (189, 17246, 4096), "gavel": (160, 22864, 3387),
                "elasticflow": (138, 21863, 2763), "fcfs": (123, 22205, 2786)}
SPEED_BUDGET_S = {"arena": 60.0}  # issue 14: arena <= 60 s for the whole trace, as every baseline
DROP = ("config", "series", "decisions", "job_records", "events")


def machine() -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"python": platform.python_version(), "platform": platform.platform(), "cpus": os.cpu_count(),
            "cpu": cpu, "load_avg_at_start": os.getloadavg()}


def timing_table(rows: list[dict], process_wall: dict[str, float], trace: str, parallel: int = 1,
                 bench_wall_s: float | None = None) -> list[str]:
    """Markdown lines: per policy its simulation's wall and CPU seconds, decisions and decision seconds (wall),
    then all policies together (their simulations and their worker processes, run one after another, or
    `parallel` at a time: then the whole comparison's wall, `bench_wall_s`)."""
    out = [f"Simulation time per policy (Philly, {trace}; decision s is wall time per policy call):", "",
           "| policy | trace | wall s | CPU s | decisions | decision s mean / max |", "|---|---|---:|---:|---:|---:|"]
    f = lambda v, nd: "-" if v is None else f"{v:,.{nd}f}"  # noqa: E731  (a run without decisions has none)
    for r in rows:
        out.append(f"| {r['policy']} | Philly, {trace} | {f(r['sim_wall_s'], 1)} | {f(r.get('sim_cpu_s'), 1)} | "
                   f"{r['policy_calls']:,} | {f(r['decision_s_mean'], 3)} / {f(r['decision_s_max'], 3)} |")
    if len(rows) > 1:
        out.append(f"| all {len(rows)} together | Philly, {trace} | {sum(r['sim_wall_s'] for r in rows):.1f} | "
                   f"{sum(r.get('sim_cpu_s') or 0.0 for r in rows):.1f} | {sum(r['policy_calls'] for r in rows):,} | - |")
        out.append("")
        if parallel > 1:
            out.append(f"All {len(rows)} worker processes, {parallel} at a time in the order given (`--parallel "
                       f"{parallel}`): the whole comparison took {bench_wall_s:.1f} s wall (plan warm-up, load, "
                       f"plan cache and write included).")
        else:
            out.append(f"All {len(rows)} worker processes one after another (load, plan cache and write included): "
                       f"{sum(process_wall.get(r['policy'], 0.0) for r in rows):.1f} s wall.")
    return out + [""]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=None, help="Arena data folder (default: $ARENA_OPT_DATA or ../shared/data/arena)")
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--policies", default="all")
    ap.add_argument("--modes", default="500,full")
    ap.add_argument("--timeout", type=float, default=3600.0, help="give up on a policy after this many seconds")
    ap.add_argument("--name", default="simulate", help="stem of the written files (default simulate)")
    ap.add_argument("--parallel", type=positive_int, default=1, help="policies run at once, in the order given (default 1)")
    args = ap.parse_args(argv)
    base = philly_config(args.data)
    if base is None:
        return 2
    policies = parse_policies(args.policies)
    meta = {"command": " ".join(["python", *sys.argv]), "machine": machine(), "config": base.model_dump(),
            "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    report: dict = {"meta": meta, "modes": {}}
    md = [f"# Arena's Philly trace, {len(policies)} policies\n", f"Command: `{meta['command']}`  ",
          f"Machine: {meta['machine']['cpu']}, {meta['machine']['cpus']} cores, Python {meta['machine']['python']}, "
          f"load average at start {meta['machine']['load_avg_at_start'][0]:.2f} (the machine is shared)  ",
          "Setup: Alpa-optimal table (strict) as the truth, iterations / 5, deadlines x 5, 300 s rounds, "
          "restart 10 s/GPU cap 40 s (arena, arena-greedy) and 150 s/GPU cap 600 s (baselines).\n"]
    for mode in args.modes.split(","):
        rounds = None if mode == "full" else int(mode)
        cfg = base.model_copy(update={"rounds": rounds})
        out_dir = Path("results") / f"bench-philly-{mode}" / args.name
        t0 = time.perf_counter()
        results, info = run_bench(cfg, policies, out_dir, timeout_s=args.timeout, parallel=args.parallel)
        wall = time.perf_counter() - t0
        rows = [{k: v for k, v in r.items() if k not in DROP} for r in results]
        for r in rows:
            r["process_wall_s"] = info["process_wall_s"].get(r["policy"])
            budget = SPEED_BUDGET_S.get(r["policy"], 60.0)
            r["speed_budget_s"] = budget
            r["within_budget"] = r["sim_wall_s"] <= budget
        report["modes"][mode] = {"rounds": rounds, "rows": rows, "failed": info["failed"],
                                 "plan_warmup_s": info["plan_warmup_s"], "wall_s": wall, "parallel": args.parallel}
        title = "run to completion" if rounds is None else f"first {rounds} rounds"
        md += [f"## {title}\n", markdown_table(results), ""]
        md.append(f"One-time planner warm-up (all grids of the trace's workloads, cold cache): "
                  f"{info['plan_warmup_s']:.1f} s. Per-policy process wall time (s): " +
                  ", ".join(f"{p} {w:.1f}" for p, w in info["process_wall_s"].items()) + ".\n")
        md += timing_table(rows, info["process_wall_s"], title, args.parallel, wall)
        for p, why in info["failed"].items():
            md.append(f"- **{p} did not finish**: {why}")
        if rounds is None and rows:
            bound = rows[0].get("avg_jct_bound_s")
            if bound:
                md.append(f"Contention-free bound (every job alone on its fastest grid from submission, never "
                          f"restarted): average JCT >= {bound:,.0f} s for any policy. " +
                          ", ".join(f"{r['policy']} {r['avg_jct_s'] / bound:.2f}x" for r in rows) + ".\n")
        if rounds == 500:
            md += ["", "Artifact's own simulator, same setup (finished / avg JCT s / avg throughput over rounds "
                       "> 100):", "",
                   "| policy | artifact | ours |", "|---|---|---|"]
            ours = {r["policy"]: r for r in rows}
            for p, (f, j, t) in ARTIFACT_500.items():
                o = ours.get(p)
                mine = "-" if o is None else (f"{o['finished']} / {o['avg_jct_s']:,.0f} / "
                                              f"{o['avg_throughput_busy_rounds']:,.0f}")
                label = "Arena (its greedy)" if p == "arena-greedy" else p
                md.append(f"| {label} | {f} / {j:,} / {t:,} | {mine} |")
            md.append("")
    write_result(Path(args.out) / f"{args.name}.json", report, "\n".join(md) + "\n")
    print("\n".join(md))
    return 0 if not any(m["failed"] for m in report["modes"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
