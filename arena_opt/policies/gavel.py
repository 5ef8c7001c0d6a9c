"""Gavel (max-sum-throughput, heterogeneity-aware): every job keeps its GPU count; an integer
program picks each job's GPU type to maximize the cluster's total throughput (samples/s).

As in Arena's Gavel baseline: waiting jobs are admitted in submission order when they fit next to
the jobs already admitted (an admitted job is never preempted), and at most `max_migrations`
running jobs change type per round. The type choice of all admitted jobs is one 0/1 program
solved by HiGHS; placement then packs the chosen (type, count) at compact locality."""

from __future__ import annotations

from arena_opt.decision import SolverStats
from arena_opt.grids import Grid
from arena_opt.policies.common import PackedPolicy, admit_fifo, place_changes
from arena_opt.policies.options import GavelOptions
from arena_opt.policies.type_assignment import assign_types


class GavelPolicy(PackedPolicy):
    name = "gavel"
    Options = GavelOptions
    options: GavelOptions

    def __init__(self, options: GavelOptions | dict | None = None, estimator=None):
        super().__init__(options, estimator)
        self.max_migrations = self.options.max_migrations
        self._offers: dict[str, tuple] = {}  # running job id -> (its options, its running grid, its offer)

    def _cands(self, job, n: int | None) -> list[Grid]:
        """The job's grids at count n, fastest type first."""
        return self.catalog.derived(job, self._snapshot, ("count", n), lambda opts: sorted(
            (g for (t, c), g in opts.items() if c == n), key=lambda g: (-g.throughput, g.shape.gpu_type)))

    def _count(self, job, cur: Grid | None, opts) -> int | None:
        if cur is not None:
            return cur.num_gpus
        g = self.requested(job)
        return None if g is None else g.num_gpus

    def plan(self, snapshot):
        pack, current, held = self.start_state(snapshot)
        start = pack.mark()
        if len(self._offers) > 2 * len(snapshot.jobs):  # finished jobs' offers
            ids = {j.id for j in snapshot.jobs}
            self._offers = {j: v for j, v in self._offers.items() if j in ids}

        # admission: submission order, tentatively placed on the fastest type where the count fits
        def offers(job, cur):
            opts = self.grid_options(job)
            # the same options object and running grid give the same offer: a running job's is kept
            hit = self._offers.get(job.id) if cur is not None else None
            if hit is not None and hit[0] is opts and hit[1] is cur:
                return hit[2]
            n = self._count(job, cur, opts)
            cands = self._cands(job, n)
            if cur is not None:
                # a running job is offered only the types faster than its own: a move to a slower
                # type lowers the objective unless it makes room for a newcomer, which admission
                # (newcomers only take free GPUs) and the migration cap make rare
                cands = [cur] + [g for g in cands if g.shape.gpu_type != cur.shape.gpu_type
                                 and g.throughput > cur.throughput]
                self._offers[job.id] = (opts, cur, (cands, cands, ("", f"{n} GPUs of no type are free")))
            if not cands:
                why = self.no_grid(job) if not opts else "no feasible grid at its GPU count"
                return cands, cands, (why, "")
            return cands, cands, ("", f"{n} GPUs of no type are free")

        admitted, tentative, reasons = admit_fifo(snapshot, pack, current, offers)
        chosen, stats = self._types(snapshot, admitted, current, tentative)
        pack.rollback(start)  # back to the running jobs alone
        out, placements, more = place_changes(pack, chosen, current, held, tentative)
        reasons.update(more)
        return out, placements, reasons, stats

    def _types(self, snapshot, admitted, current, tentative) -> tuple[dict[str, Grid], SolverStats]:
        # jobs with a single option are constants of the program: their GPUs leave the capacity
        fixed = {j: opts[0] for j, opts in admitted.items() if len(opts) == 1}
        var: list[tuple[str, Grid]] = [(j, g) for j, opts in admitted.items() if len(opts) > 1 for g in opts]
        if not var:
            return fixed, SolverStats(solver="highs", status="nothing to choose")
        if all(j not in current and tentative[j] is admitted[j][0] for j, _ in var):
            # only newcomers, each on its fastest type: no assignment has more throughput
            return {**fixed, **{j: tentative[j] for j, _ in var}}, SolverStats(solver="highs", status="greedy optimal")
        # equal throughput: do not move
        utility = [g.throughput + (1e-6 * max(g.throughput, 1.0) if g.current else 0.0) for _, g in var]
        # without a feasible assignment everyone stays where the admission put them
        return assign_types(var, utility, self.pools, fixed, self.max_migrations, self.options.time_limit_s,
                            self.options.mip_gap, fallback={**current, **tentative})

