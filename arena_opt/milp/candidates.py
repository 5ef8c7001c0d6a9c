"""Which jobs enter a round's MILP (ArenaOptions.candidate_factor), chosen before their grids are made.

Waiting jobs enter in order of value per GPU until their smallest grids add up to `candidate_factor`
times the cluster's GPUs; running jobs and jobs with a deadline or makespan target always enter. On a
150,000-job snapshot one job in six enters, and making every job's grids and model arrays first took
most of the round (2.6 million grids). `round_problem` ranks the waiting jobs on their workload's arrays
instead (GridCatalog.workload: one per model, batch and limits, shared by all its jobs) and makes grids
for the jobs that enter only. It ranks on the values the model would give them (`grid_value`, the same
operations), so the jobs that enter and their model are exactly those of filtering the full problem
(`candidates`)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from arena_opt.grids import GridCatalog, WorkloadOptions
from arena_opt.milp.options import ArenaOptions
from arena_opt.milp.problem import (ClusterProblem, GridBlocks, JobStats, JobTerms, build_problem, grid_value,
                                    job_terms)
from arena_opt.snapshot import ClusterSnapshot


@dataclass
class Ranking:
    """Per job its best value per node unit (`density`; -inf where not ranked), fewest node units
    (`smallest`, inf without a grid), whether it always enters (`must`), and the cluster's GPUs."""

    density: np.ndarray
    smallest: np.ndarray
    must: np.ndarray
    total_gpus: int

    def select(self, factor: float) -> np.ndarray | None:
        """The jobs that enter (sorted indices), or None when all do."""
        must, smallest = self.must, self.smallest
        order = np.argsort(-self.density, kind="stable")
        waiting = order[~must[order] & np.isfinite(smallest[order])].tolist()
        budget = factor * self.total_gpus - float(smallest[must & np.isfinite(smallest)].sum())
        chosen = np.flatnonzero(must).tolist()
        for j in waiting:
            if budget <= 0:
                break
            chosen.append(j)
            budget -= smallest[j]
        if len(chosen) == len(must):
            return None
        return np.array(sorted(chosen), dtype=int)


def problem_ranking(p: ClusterProblem) -> Ranking:
    """The ranking of a problem built with every job's grids."""
    total = sum(pi.gpus_per_node * (pi.empty_nodes + len(pi.occupied)) for pi in p.pools.values())
    density = np.full(p.num_jobs, -np.inf)
    smallest = np.full(p.num_jobs, np.inf)
    np.maximum.at(density, p.job_of, p.value / np.maximum(p.units, 1))
    np.minimum.at(smallest, p.job_of, p.units.astype(float))
    return Ranking(density, smallest, p.running | p.targeted(), total)


def candidates(p: ClusterProblem, factor: float | None) -> np.ndarray | None:
    """The jobs of a problem built with every job's grids that enter the MILP, or None when all do."""
    if factor is None or not len(p.grids):
        return None
    return problem_ranking(p).select(factor)


@dataclass
class _Workloads:
    """What round_problem reads before any waiting job has grids."""

    ranking: Ranking
    terms: JobTerms
    own: dict[str, list]  # running job id -> its grids
    entry_of: dict[int, WorkloadOptions]  # waiting job index -> its workload
    blocks: GridBlocks  # the running jobs' grid lists as arrays, read again by the round's model


def workload_ranking(snapshot: ClusterSnapshot, catalog: GridCatalog, opts: ArenaOptions,
                     blocks: GridBlocks | None = None) -> _Workloads:
    """The ranking of `problem_ranking` (density of the jobs that do not always enter), read off the
    running jobs' grids and the waiting jobs' workload arrays. `blocks`: the round's grid lists as arrays
    (GridBlocks; new ones when None)."""
    mgd = opts.max_gpus_per_job
    jobs = snapshot.jobs
    n = len(jobs)
    running = np.array([j.running is not None for j in jobs], dtype=bool)
    entry_list = catalog.workloads(jobs, snapshot, max_gpus_default=mgd)  # new workloads planned in one pass
    # running jobs get their own grids (the running allocation is one of them); the others are read off
    # their workload's arrays, grouped by workload and whether a start resumes from a checkpoint (the
    # restart delay depends on it)
    own = {jobs[i].id: catalog.grids(jobs[i], snapshot, max_gpus_default=mgd, prune=True)
           for i in np.flatnonzero(running)}
    groups: dict[tuple, list[int]] = defaultdict(list)
    entries = {}
    waiting = np.flatnonzero(~running).tolist()
    for i in waiting:
        e = entry_list[i]
        entries[id(e)] = e
        groups[(id(e), jobs[i].total_iterations > jobs[i].remaining_iterations)].append(i)
    stats = JobStats(np.zeros(n), np.full(n, np.inf), np.zeros(n, dtype=bool))
    smallest = np.full(n, np.inf)
    run_idx = np.flatnonzero(running)
    blocks = GridBlocks() if blocks is None else blocks
    if len(run_idx):
        sub = JobStats.of([jobs[i] for i in run_idx], own, blocks)
        stats.best[run_idx], stats.gpu_s[run_idx], stats.has_grids[run_idx] = sub.best, sub.gpu_s, sub.has_grids
        for i in run_idx:
            gs = own[jobs[i].id]
            if gs:  # column 3: node units (the block JobStats.of just read)
                smallest[i] = float(blocks.of(gs)[:, 3].min())
    for (eid, _), idx in groups.items():
        s = entries[eid].summary()
        if not len(s.throughput):
            continue
        ok = s.throughput > 0
        stats.best[idx] = s.throughput.max()
        stats.gpu_s[idx] = (s.gpus[ok] / s.throughput[ok]).min() if ok.any() else np.inf
        stats.has_grids[idx] = True
        smallest[idx] = float(s.units.min())
    terms = job_terms(snapshot, stats, opts)
    must = running | terms.targeted()
    density = np.full(n, -np.inf)
    for (eid, resumed), idx in groups.items():
        idx = [i for i in idx if not must[i]]
        s = entries[eid].summary()
        if not idx or not len(s.throughput):
            continue
        arch = jobs[idx[0]].arch
        share = np.array([opts.reconfig.delay_s(arch, int(c), resumed=resumed) for c in s.gpus]) / opts.horizon_s
        base = terms.base[idx][:, None]
        value = grid_value(base, (s.throughput / np.maximum(stats.best[idx[0]], 1e-12))[None, :], share[None, :],
                           s.gpus[None, :], opts)
        density[idx] = (value / np.maximum(s.units, 1)[None, :]).max(axis=1)
    total = sum(n.num_gpus for n in snapshot.nodes)  # every pool's GPUs, without grouping the nodes again
    entry_of = {i: entries[eid] for (eid, _), idx in groups.items() for i in idx}
    return _Workloads(Ranking(density, smallest, must, total), terms, own, entry_of, blocks)


def round_problem(snapshot: ClusterSnapshot, catalog: GridCatalog, opts: ArenaOptions,
                  blocks: GridBlocks | None = None) -> tuple[ClusterProblem, np.ndarray | None]:
    """The round's problem and the jobs that enter its MILP (None: all). When some are left out, the
    problem has every job (job-level terms, reasons) but grids only for those that enter:
    `shards.restrict(problem, jobs)` is the MILP's (equal to restricting the problem of all grids).
    `blocks`: this round's GridBlocks (a policy passes the last round's `next()`)."""
    jobs = snapshot.jobs
    if opts.candidate_factor is None:
        return build_problem(snapshot, catalog.all_grids(snapshot, max_gpus_default=opts.max_gpus_per_job), opts,
                             blocks=blocks), None
    w = workload_ranking(snapshot, catalog, opts, blocks)
    cand = w.ranking.select(opts.candidate_factor) if w.terms.stats.has_grids.any() else None
    enter = range(len(jobs)) if cand is None else cand.tolist()
    # a waiting job's grids are its workload's shared ones (GridCatalog.grids of a job that does not run)
    grids = {jobs[i].id: w.own[jobs[i].id] if i not in w.entry_of else list(w.entry_of[i].shared(True))
             for i in enter}
    return build_problem(snapshot, grids, opts, w.terms, w.blocks), cand
