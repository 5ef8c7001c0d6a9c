"""Is the contention-free JCT bound reachable on Arena's cluster? Demand of the ideal schedule.

    python bench/jct_bound.py [--data DIR] [--out bench/results]

The simulator reports `avg_jct_bound_s`: every job alone on the cluster, on its fastest grid (of
the same truth the simulator advances jobs with: Alpa-optimal table, strict, compact shapes, at
most 16 GPUs) from the second it is submitted, never restarted. A policy reaches that bound only if
every job runs that way, so the bound is reachable only if the jobs alive at each moment of that
ideal schedule fit the cluster. This script sums their fastest grids' GPUs over time, per GPU type
and in total, and reports peak demand, hours over capacity and the excess GPU-hours. Same setup as
bench/simulate.py (iterations / 5). Writes jct_bound.json and .md.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

_HERE = Path(__file__).resolve().parent
if sys.path and Path(sys.path[0]).resolve() == _HERE:
    sys.path.append(sys.path.pop(0))
sys.path.insert(0, str(_HERE.parent))

import numpy as np  # noqa: E402
from _perf_common import command, git_rev, machine, md_table, philly_config, write  # noqa: E402

from arena_opt.grids import GridCatalog  # noqa: E402
from arena_opt.sim.config import load_inputs  # noqa: E402


def over_capacity(events: list[tuple[float, int]], cap: int) -> dict:
    """Peak of a step function given as (time, +-GPUs) events, time above `cap`, and its excess area."""
    events = sorted(events)
    cur, peak, over_s, excess = 0, 0, 0.0, 0.0
    prev = events[0][0] if events else 0.0
    for t, d in events:
        if cur > cap:
            over_s += t - prev
            excess += (cur - cap) * (t - prev)
        cur += d
        prev = t
        peak = max(peak, cur)
    return {"capacity": cap, "peak_demand": peak, "hours_over": over_s / 3600, "excess_gpu_hours": excess / 3600}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=None, help="Arena data folder (default: $ARENA_OPT_DATA or ../shared/data/arena)")
    ap.add_argument("--out", default="bench/results")
    args = ap.parse_args(argv)
    cfg = philly_config(args.data)
    if cfg is None:
        return 2
    trace, cluster, truth, _ = load_inputs(cfg)
    grids = GridCatalog.of(truth)  # the simulator's own view of the truth (sim/engine.py, on arrival)
    cap: dict[str, int] = defaultdict(int)
    for n in cluster.nodes:
        cap[n.gpu_type] += n.num_gpus
    by_type: dict[str, list] = defaultdict(list)
    alone = []
    for tj in trace:
        opts = grids.options(tj.to_job(), cluster)
        if not opts:
            continue  # rejected by the simulator too
        best = max(g.throughput for g in opts.values())
        g = min((g for g in opts.values() if g.throughput >= best * (1 - 1e-12)), key=lambda g: g.num_gpus)
        life = tj.iterations * tj.batch_size / best
        alone.append(life)
        by_type[g.shape.gpu_type] += [(tj.submit_time, g.num_gpus), (tj.submit_time + life, -g.num_gpus)]
    rows = {t: over_capacity(ev, cap[t]) for t, ev in sorted(by_type.items())}
    rows["all types"] = over_capacity([e for ev in by_type.values() for e in ev], sum(cap.values()))
    payload = {"command": command(), "git": git_rev(), "machine": machine(), "jobs": len(alone),
               "avg_jct_bound_s": float(np.mean(alone)), "demand": rows}
    md = ["# Contention-free JCT bound vs the cluster\n", f"Command: `{command()}` (git {git_rev()})\n",
          f"{len(alone)} runnable jobs; the bound on average JCT is {np.mean(alone):,.0f} s. Demand of the ideal "
          "schedule (each job on its fastest grid, from submission, for its contention-free lifetime):\n",
          md_table(["GPU type", "GPUs", "peak demand", "hours over capacity", "excess GPU-hours"],
                   [[t, r["capacity"], r["peak_demand"], f"{r['hours_over']:,.1f}", f"{r['excess_gpu_hours']:,.0f}"]
                    for t, r in rows.items()])]
    write(Path(args.out), "jct_bound", payload, "\n".join(md))
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
