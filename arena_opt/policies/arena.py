"""arena-opt's policy: grids with proxy plans (level 2), then the level-1 MILP every round."""

from __future__ import annotations

import time
from dataclasses import replace

from arena_opt.deadline import CallClock
from arena_opt.decision import Decision, SolverStats
from arena_opt.grids import Grid, GridCatalog
from arena_opt.milp.candidates import round_problem
from arena_opt.milp.certify import WITHIN_GAP, LpBasis, relax
from arena_opt.milp.greedy import greedy_start, greedy_variants
from arena_opt.milp.local import improve
from arena_opt.milp.options import ArenaOptions
from arena_opt.milp.problem import ClusterProblem, GridBlocks, build_problem
from arena_opt.milp.shards import merge, restrict, split
from arena_opt.milp.standing import keep_standing, relative_gap
from arena_opt.milp.solve import SolveResult, no_gc, solve_problem
from arena_opt.policies.base import GridPolicy
from arena_opt.snapshot import ClusterSnapshot


_LP_SHARE = 0.25  # most of the time left that the LP relaxation may take before the greedy start and the MIP
_PROVED = {"optimal": "the LP relaxation's optimum is integral: the MILP's optimum, MIP not run",
           WITHIN_GAP: "greedy start within the gap of the LP relaxation's bound: MIP not run",
           "rounded": "the LP relaxation's optimum, rounded, within the gap of its bound: MIP not run"}


class ArenaPolicy(GridPolicy):
    name = "arena"
    Options = ArenaOptions
    options: ArenaOptions
    # perf_counter() and process_time() values the round's time limit counts from when the caller started
    # its clock before the snapshot reached the policy (the CLI: process entry, so reading the snapshot counts)
    started: float | None = None
    started_cpu: float | None = None
    _end: float | None = None  # the last round's time limit as a perf_counter() value
    # the last round's LP relaxation basis, the next relaxation's start (milp/certify.py LpBasis)
    _lp_basis: LpBasis | None = None
    # the last round's grid lists as arrays (milp/problem.py GridBlocks): a running job's are the same
    _blocks: GridBlocks | None = None

    def decide_usable(self, snapshot: ClusterSnapshot) -> Decision:
        # no cyclic GC inside the call: its full passes walk every grid, plan and decision object made so far
        # (10,000-job cold call: 0.3-0.4 s CPU of ~5); the few cycles a round makes are collected after it
        with no_gc():
            d = super().decide_usable(snapshot)
        if self._end is not None:
            d.stats.over_s = time.perf_counter() - self._end
        return d

    def problem(self, snapshot: ClusterSnapshot) -> ClusterProblem:
        grids = GridCatalog.of(self.estimator, self.options.caution).all_grids(
            snapshot, max_gpus_default=self.options.max_gpus_per_job)
        return build_problem(snapshot, grids, self.options)

    def choose(self, snapshot: ClusterSnapshot):
        o = self.options
        # the time limit holds for the whole call: reading (when the caller's clock started before), grids,
        # model, hand-off, solve, and the phases after the choice (placement, decision, check), for which
        # the clock keeps a reserve scaled to the round's jobs and this process's share of a core
        clock = CallClock(o.time_limit_s, self.started, self.started_cpu if self.started is not None else None)
        self._end = clock.end
        if self.started is not None:
            clock.lap("read")
        # grids only for the jobs that enter the MILP (milp/candidates.py)
        self._blocks = GridBlocks() if self._blocks is None else self._blocks.next()
        full, cand = round_problem(snapshot, GridCatalog.of(self.estimator, o.caution), o, self._blocks)
        clock.lap("grids")
        t_grids = clock.phases["grids"]
        p, jobs, note = full, None, None
        if cand is not None:
            jobs, p = cand, restrict(p, cand)
            note = (f"{full.num_jobs - len(cand)} waiting jobs of lower value per GPU left out of the MILP "
                    f"(candidate_factor {o.candidate_factor})")
        gpus = sum(pi.gpus_per_node * (pi.empty_nodes + len(pi.occupied)) for pi in p.pools.values())
        # until a selection is known, as many jobs run as could (one GPU each at least)
        deadline = clock.end - clock.after_choice_s(full.num_jobs, min(p.num_jobs, gpus))
        sharded = o.shards > 1 and p.num_jobs >= 2 * o.shards
        # Pyomo's hand-off of 170,000 binaries alone takes longer than a 10 s limit: large models go as arrays
        backend = o.backend if o.pyomo_max_grids is None or len(p.grids) <= o.pyomo_max_grids else "highspy"
        # past highs_max_grids HiGHS's setup alone outlasts the limit: the greedy start, improved, decides
        heuristic = o.highs_max_grids is not None and len(p.grids) > o.highs_max_grids
        start, skipped, solver = None, False, f"highs via {backend}"
        if sharded:
            res = self._solve_sharded(p, backend, deadline)
            clock.lap("highs")
        else:
            res, start, skipped, proved, dropped = self._solve_whole(p, backend, heuristic, clock, full.num_jobs,
                                                                     deadline)
            note = "; ".join(filter(None, [note, dropped])) or None
            if proved:
                solver, note = "highs LP relaxation via highspy", "; ".join(filter(None, [note, proved]))
        stats = SolverStats(solver=solver, status=res.status, objective=res.objective, bound=res.bound,
                            gap=res.gap, build_s=t_grids + res.build_s, solve_s=res.solve_s,
                            shards=o.shards if sharded else 1,
                            num_grids=len(p.grids), note=note, time_limit_s=o.time_limit_s)
        sel = res.selection
        if sel is None or res.abandoned:  # an abandoned run hands back only the start it was given
            if start is None:
                start = greedy_start(p)
                clock.lap("greedy")
                start = _improve_lapped(p, start, clock.end - clock.after_choice_s(full.num_jobs, len(start)),
                                        clock, report_cut=True)
            sel = start
            stats.fallback = True
            stats.objective = p.objective(sel)
            why = (f" (HiGHS not run: {len(p.grids)} grids, more than highs_max_grids {o.highs_max_grids})"
                   if heuristic else
                   " (HiGHS was still in its run at the deadline: left behind)" if res.abandoned else
                   " (the deadline passed before HiGHS started)" if skipped else "")
            stats.note = "; ".join(filter(None, [note, f"solver returned no solution ({res.status}){why}; greedy "
                                                       f"feasible decision used (improved by local moves)"]))
        sel = _keep_standing(p, sel, None if stats.fallback else stats.bound, o, stats,
                             until=clock.end - clock.after_choice_s(full.num_jobs, len(sel)))
        clock.lap("standing")
        stats.phases, stats.cut_short = dict(clock.phases), list(clock.cut)
        chosen: dict[str, Grid] = {p.job_ids[j]: p.grids[k] for j, k in sel.items()}
        reasons = dict(full.waiting_reason)
        if jobs is not None:
            kept = set(jobs.tolist())
            for j in range(full.num_jobs):
                if j not in kept and full.job_ids[j] not in reasons:
                    reasons[full.job_ids[j]] = "queued: jobs of higher value per GPU already fill the cluster"
        return chosen, reasons, stats

    def _solve_whole(self, p: ClusterProblem, backend: str, heuristic: bool, clock: CallClock, jobs: int,
                     deadline: float):
        """One model for the whole round: (result, greedy start or None, whether the deadline passed before
        HiGHS started, what proved the round without the MIP or None, why the relaxation's rounded optimum
        was dropped or None). `jobs`: the snapshot's, for the reserve of the phases after the choice."""
        o = self.options
        lp = rounded = dropped = None
        if backend == "highspy" and not heuristic and len(p.grids) <= o.lp_certificate_max_grids:
            # the LP relaxation first (milp/certify.py), with a quarter of the time left at most: on simulated
            # rounds its optimum is mostly integral (the MILP's own), and then neither the greedy start nor
            # the MIP is needed; otherwise its bound may still prove the greedy start optimal within the gap
            t = time.perf_counter()
            if self._lp_basis is None:
                self._lp_basis = LpBasis()
            lp = relax(p, threads=o.threads, deadline=t + (deadline - t) * _LP_SHARE, time_limit_s=o.time_limit_s,
                       warm=self._lp_basis)
            clock.lap("lp")
            res = lp.optimum(p) if lp is not None else None
            if res is not None:
                return res, None, False, _PROVED["optimal"], None
            # its optimum rounded (integral grids kept, the rest greedy) is often within the gap of its
            # bound already: one greedy pass instead of the greedy start's orders and local moves
            rounded = lp.rounded(p) if lp is not None and p.max_reconfigs is None else None
            dropped = None if lp is None else lp.dropped
            res = None if rounded is None else lp.certify(p, rounded, o.mip_gap)
            clock.lap("rounded")
            if res is not None:
                return res, rounded, False, _PROVED["rounded"], None
        # the greedy selection (greedy_start: the best of a few orders), improved by local moves, as HiGHS's
        # first incumbent: the search prunes from the root, and a round whose best move gains less than
        # the gap keeps it; it is also the decision when the deadline passes before HiGHS has anything
        start = None
        if backend == "highspy":
            # half of what is left at most for the greedy variants (the first alone where HiGHS is not run:
            # local moves gain more in that time than other orders), then up to half of the rest for the
            # local improvement, the rest for HiGHS
            t_greedy, runs = time.perf_counter(), []
            start = greedy_start(p, until=t_greedy if heuristic else t_greedy + (deadline - t_greedy) / 2,
                                 runs_s=runs)
            clock.lap("greedy")
            if not heuristic and len(runs) < greedy_variants(p):
                clock.cut_short("greedy")
            # the selection is known: the reserve for its placement and decision
            deadline = clock.end - clock.after_choice_s(jobs, len(start))
            t = time.perf_counter()
            # cut short only where it decides alone: otherwise HiGHS goes on from it
            start = _improve_lapped(p, start, deadline if heuristic else t + (deadline - t) / 2, clock,
                                    report_cut=heuristic)
            if rounded is not None and p.objective(rounded) > p.objective(start):
                start = rounded
        if lp is not None and start is not None:
            res = lp.certify(p, start, o.mip_gap)
            if res is not None:
                return res, start, False, _PROVED[WITHIN_GAP], dropped
        if heuristic:
            return SolveResult(None, "not_run", None, None, None, 0.0, 0.0), start, False, None, dropped
        if time.perf_counter() >= deadline:
            clock.cut_short("highs")
            return SolveResult(None, "time_limit", None, None, None, 0.0, 0.0), start, True, None, dropped
        res = solve_problem(p, time_limit_s=o.time_limit_s, mip_gap=o.mip_gap, threads=o.threads, backend=backend,
                            start=start, deadline=deadline)
        if lp is not None:  # the relaxation that proved nothing counts as model time
            res.build_s += lp.build_s + lp.solve_s
        if res.abandoned or res.status == "time_limit":
            clock.cut_short("highs")
        if res.selection is not None and res.status != "optimal" and not res.abandoned:
            # an abandoned run hands back the start, which choose() reports as the fallback anyway
            res = _improved(p, res, until=deadline)
        clock.lap("highs")
        return res, start, False, None, dropped

    def _solve_sharded(self, p: ClusterProblem, backend: str, deadline: float) -> SolveResult:
        o = self.options
        parts, build, solve, statuses = [], 0.0, 0.0, []
        subs = split(p, o.shards, o.seed)
        for i, (sub, jobs) in enumerate(subs):
            # each shard gets an equal share of what is left, so a slow one cannot starve the rest
            share = time.perf_counter() + (deadline - time.perf_counter()) / (len(subs) - i)
            r = solve_problem(sub, time_limit_s=o.time_limit_s / o.shards, mip_gap=o.mip_gap, threads=o.threads,
                              backend=backend, deadline=share)
            build += r.build_s
            solve += r.solve_s
            statuses.append(r.status)
            parts.append((r.selection if r.selection is not None else greedy_start(sub), jobs, sub))
        sel = improve(p, merge(p, parts), until=deadline)
        status = statuses[0] if len(set(statuses)) == 1 else "mixed:" + ",".join(sorted(set(statuses)))
        # shard bounds do not bound the whole problem: no bound or gap is claimed for a merged result
        return SolveResult(sel, status, p.objective(sel), None, None, build, solve)


def _improve_lapped(p: ClusterProblem, sel: dict[int, int], until: float, clock: CallClock,
                    report_cut: bool) -> dict[int, int]:
    """`sel` improved by local moves until `until`, timed as the clock's phase `improve` (reported cut short
    when the deadline stopped the moves and `report_cut`)."""
    info: dict = {}
    sel = improve(p, sel, until=until, stats=info)
    clock.lap("improve")
    if info["cut"] and report_cut:
        clock.cut_short("improve")
    return sel


def _keep_standing(p: ClusterProblem, sel: dict[int, int], bound: float | None, o: ArenaOptions,
                   stats: SolverStats, until: float) -> dict[int, int]:
    """`sel` with the moved running jobs that fit back on their standing grid (milp/standing.py; at no
    loss, or within standing_share and the gap), until `until`; the stats' objective, gap and note then say
    what the selection returned is worth."""
    kept = keep_standing(p, sel, bound, o.mip_gap, o.standing_share, until=until)
    if kept.jobs:
        stats.objective = kept.objective
        stats.gap = None if bound is None else relative_gap(bound, kept.objective)
        stats.note = "; ".join(filter(None, [stats.note, f"{len(kept.jobs)} running jobs kept on their standing "
                                                         f"grid instead of moving (objective {kept.change:+.6g})"]))
    return kept.selection


def _improved(p: ClusterProblem, res: SolveResult, until: float) -> SolveResult:
    """HiGHS's incumbent at its limit, improved by local moves until `until` (objective and gap updated)."""
    sel = improve(p, res.selection, until=until)
    obj = p.objective(sel)
    gap = None if res.bound is None else abs(res.bound - obj) / max(abs(obj), 1e-9)
    return replace(res, selection=sel, objective=obj, gap=gap)
