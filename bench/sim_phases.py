"""CPU seconds of each phase of arena's decisions over a simulation of Arena's Philly trace, in one process
(issue 14's whole-trace target).

    python bench/sim_phases.py [--rounds N] [--limit-jobs N] [--policy arena] [--data DIR]

The simulate bench's setup (bench/_perf_common.py philly_config), started from the plan cache
$ARENA_OPT_CACHE when it exists. Each phase function the arena policy and the simulator call
(`round_problem`, `relax`, `greedy_start`, `improve`, `solve_problem`, `place`, `build_decision`,
`check_decision`, ...) is wrapped to add up its `time.process_time()`: CPU time, the figure that compares
across runs on a shared host. Prints the whole run's CPU and wall seconds, the average JCT, the decisions
by status and the CPU per phase. A probe for before/after comparisons (run it from each tree with
PYTHONPATH set to that tree, both at once so they share the load): it writes no result file and is not
in run_all; bench/simulate.py times the policies' simulations.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time
from collections import Counter, defaultdict

from _perf_common import philly_config


def wrap(mod, name: str, acc: dict, cnt: dict) -> None:
    f = getattr(mod, name)

    @functools.wraps(f)
    def timed(*a, **k):
        c = time.process_time()
        try:
            return f(*a, **k)
        finally:
            acc[name] += time.process_time() - c
            cnt[name] += 1

    setattr(mod, name, timed)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=None)
    ap.add_argument("--rounds", type=int, default=None, help="stop after N rounds (default: run to completion)")
    ap.add_argument("--limit-jobs", type=int, default=None, help="only the first N jobs of the trace")
    ap.add_argument("--policy", default="arena")
    args = ap.parse_args(argv)
    base = philly_config(args.data)
    if base is None:
        return 2
    import arena_opt.policies.arena as arena
    import arena_opt.policies.base as policy_base
    import arena_opt.sim.engine as engine
    from arena_opt.sim.config import run_config

    acc: dict = defaultdict(float)
    cnt: dict = defaultdict(int)
    for name in ("round_problem", "relax", "greedy_start", "improve", "solve_problem"):
        wrap(arena, name, acc, cnt)
    for name in ("place", "build_decision", "health_view"):
        wrap(policy_base, name, acc, cnt)
    wrap(engine, "check_decision", acc, cnt)
    cache = os.environ.get("ARENA_OPT_CACHE")
    cfg = base.model_copy(update={"rounds": args.rounds, "limit_jobs": args.limit_jobs, "policy": args.policy,
                                  "plan_cache": cache if cache and os.path.isfile(cache) else None})
    load0 = os.getloadavg()[0]
    c0, w0 = time.process_time(), time.perf_counter()
    r = run_config(cfg)
    cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    dec = r.get("decisions") or []
    print(f"load {load0:.1f} -> {os.getloadavg()[0]:.1f}; CPU {cpu:.1f} s, wall {wall:.1f} s; average JCT "
          f"{r['avg_jct_s']:,.1f} s; {r['finished']} finished; {len(dec)} decisions "
          f"(max {max((d['cpu_s'] for d in dec), default=0):.3f} s CPU, "
          f"{max((d['wall_s'] for d in dec), default=0):.3f} s wall)")
    print("status:", dict(Counter(d["status"] for d in dec)))
    for name, s in sorted(acc.items(), key=lambda kv: -kv[1]):
        print(f"  {name:16s} {s:8.2f} s CPU  {cnt[name]:6d} calls")
    return 0


if __name__ == "__main__":
    sys.exit(main())
