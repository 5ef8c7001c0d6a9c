"""arena-opt's policy: grids with proxy plans (level 2), then the level-1 MILP every round."""

from __future__ import annotations

import time

from arena_opt.decision import SolverStats
from arena_opt.grids import Grid, enumerate_grids
from arena_opt.milp.greedy import greedy_select
from arena_opt.milp.options import ArenaOptions
from arena_opt.milp.problem import ClusterProblem, build_problem
from arena_opt.milp.shards import merge, split
from arena_opt.milp.solve import SolveResult, solve_problem
from arena_opt.perf.estimator import PerfEstimator
from arena_opt.policies.base import GridPolicy
from arena_opt.snapshot import ClusterSnapshot


class ArenaPolicy(GridPolicy):
    name = "arena"

    def __init__(self, options: ArenaOptions | dict | None = None, estimator: PerfEstimator | None = None):
        super().__init__(estimator)
        self.options = options if isinstance(options, ArenaOptions) else ArenaOptions(**(options or {}))

    def problem(self, snapshot: ClusterSnapshot) -> ClusterProblem:
        grids = enumerate_grids(snapshot, self.estimator, max_gpus_default=self.options.max_gpus_per_job)
        return build_problem(snapshot, grids, self.options)

    def choose(self, snapshot: ClusterSnapshot):
        o = self.options
        t0 = time.perf_counter()
        p = self.problem(snapshot)
        t_grids = time.perf_counter() - t0
        if o.shards > 1 and p.num_jobs >= 2 * o.shards:
            res = self._solve_sharded(p)
        else:
            res = solve_problem(p, time_limit_s=o.time_limit_s, mip_gap=o.mip_gap, threads=o.threads)
        stats = SolverStats(solver="highs", status=res.status, objective=res.objective, bound=res.bound,
                            gap=res.gap, build_s=t_grids + res.build_s, solve_s=res.solve_s,
                            shards=o.shards if o.shards > 1 and p.num_jobs >= 2 * o.shards else 1,
                            num_grids=len(p.grids))
        sel = res.selection
        if sel is None:
            sel = greedy_select(p)
            stats.fallback = True
            stats.objective = p.objective(sel)
            stats.note = f"solver returned no solution ({res.status}); greedy feasible decision used"
        chosen: dict[str, Grid] = {p.job_ids[j]: p.grids[k] for j, k in sel.items()}
        reasons = dict(p.waiting_reason)
        return chosen, reasons, stats

    def _solve_sharded(self, p: ClusterProblem) -> SolveResult:
        o = self.options
        parts, build, solve, statuses = [], 0.0, 0.0, []
        for sub, jobs in split(p, o.shards, o.seed):
            r = solve_problem(sub, time_limit_s=o.time_limit_s / o.shards, mip_gap=o.mip_gap, threads=o.threads)
            build += r.build_s
            solve += r.solve_s
            statuses.append(r.status)
            parts.append((r.selection if r.selection is not None else greedy_select(sub), jobs, sub))
        sel = merge(p, parts)
        status = statuses[0] if len(set(statuses)) == 1 else "mixed:" + ",".join(sorted(set(statuses)))
        # shard bounds do not bound the whole problem: no bound or gap is claimed for a merged result
        return SolveResult(sel, status, p.objective(sel), None, None, build, solve)
