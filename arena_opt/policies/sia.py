"""Sia (heterogeneity- and adaptivity-aware, goodput-optimized): one 0/1 program over every job's
(GPU type, GPU count) maximizing the sum of normalized goodput raised to the power p (a p-norm
with p = 0.5, Sia's fairness setting in Arena's baseline), with a restart factor for running jobs
that would change configuration.

Normalized goodput of a configuration is its throughput over the job's slowest feasible one
(goodput = throughput: batch sizes are fixed in these traces). As in Arena's Sia baseline,
waiting jobs are admitted in submission order when their smallest configuration fits, admitted
jobs are never preempted, and at most `max_migrations` running jobs change configuration per
round. Restart factor (Sia): r = max((age - restarts * delay) / (age + delay), 0.01) with age the
time since submission and delay the reconfiguration time of the new configuration.

For speed, a running job is offered only configurations that raise its utility, and only the
`candidates x max_migrations` running jobs with the largest possible gain are variables of the
program; the others keep their configuration as constants (shrinking a running job to grow a
newcomer is not considered)."""

from __future__ import annotations

from collections import defaultdict

from arena_opt.decision import SolverStats
from arena_opt.grids import Grid
from arena_opt.policies.common import PackedPolicy, admit_fifo, place_changes
from arena_opt.policies.options import SiaOptions
from arena_opt.policies.type_assignment import assign_types


class SiaPolicy(PackedPolicy):
    name = "sia"
    Options = SiaOptions
    options: SiaOptions

    def __init__(self, options: SiaOptions | dict | None = None, estimator=None):
        super().__init__(options, estimator)
        o = self.options
        self.p, self.clip, self.max_migrations, self.candidates = o.p, o.clip, o.max_migrations, o.candidates
        self.time_limit_s, self.mip_gap = o.time_limit_s, o.mip_gap
        self._restarts: dict[str, int] = defaultdict(int)  # configuration changes this policy ordered
        self._offers: dict[str, tuple] = {}  # job id -> (its options, its running grid, what offers gave)

    def plan(self, snapshot):
        pack, current, held = self.start_state(snapshot)
        start = pack.mark()
        if len(self._offers) > 2 * len(snapshot.jobs):  # finished jobs' offers
            ids = {j.id for j in snapshot.jobs}
            self._offers = {j: v for j, v in self._offers.items() if j in ids}

        def offers(job, cur):
            grids = self.grid_options(job)
            # the same options object and running grid give the same offer: kept while both are (a running
            # job's, round after round)
            hit = self._offers.get(job.id)
            if hit is not None and hit[0] is grids and hit[1] is cur:
                return hit[2]
            opts = list(grids.values())
            if cur is not None:
                # utility grows with throughput and r <= 1: only faster configurations can improve on it
                out = ([cur] + [g for g in opts if (g.shape.gpu_type, g.num_gpus) != (cur.shape.gpu_type, cur.num_gpus)
                                and g.throughput > cur.throughput], [], ())
            elif not opts:
                return opts, [], (self.no_grid(job), "its smallest configuration (0 GPUs) is not free")
            else:
                smallest = sorted(opts, key=lambda g: (g.num_gpus, -g.throughput))
                tries = [g for g in smallest if g.num_gpus == smallest[0].num_gpus]
                out = (opts, tries, ("", f"its smallest configuration ({smallest[0].num_gpus} GPUs) is not free"))
            self._offers[job.id] = (grids, cur, out)
            return out

        admitted, tentative, reasons = admit_fifo(snapshot, pack, current, offers)
        chosen, stats = self._solve(snapshot, admitted, current, tentative)
        pack.rollback(start)  # back to the running jobs alone
        out, placements, more = place_changes(pack, chosen, current, held, tentative)
        reasons.update(more)
        for j, g in out.items():
            if j in current and not g.current:
                self._restarts[j] += 1
        return out, placements, reasons, stats

    def _utility(self, job, g: Grid, base: float, now: float) -> float:
        r = 1.0
        if job.running is not None and not g.current:
            delay = self.reconfig.delay_s(job.arch, g.num_gpus, resumed=True)
            age = max(now - job.submit_time, 0.0)
            r = max((age - self._restarts[job.id] * delay) / (age + delay), 0.01)
        return min((g.throughput / base * r) ** self.p, self.clip)

    def _solve(self, snapshot, admitted, current, tentative):
        jobs = {j.id: j for j in snapshot.jobs}
        # a running job's admitted options are its current one and the faster ones (offers)
        base = {j: self.catalog.derived(jobs[j], snapshot, "sia-slowest",
                                        lambda opts: min(g.throughput for g in opts.values())) for j in admitted}
        util = {j: [self._utility(jobs[j], g, base[j], snapshot.time) for g in admitted[j]] for j in admitted}
        # At most max_migrations running jobs change per round: only the running jobs with the largest
        # possible gain (and only their improving configurations) are decided; the rest are constants.
        gain = {}
        for j in current:
            if j in admitted:
                u0 = util[j][0]  # the current configuration comes first
                better = [k for k in range(1, len(util[j])) if util[j][k] > u0]
                admitted[j] = [admitted[j][0]] + [admitted[j][k] for k in better]
                util[j] = [u0] + [util[j][k] for k in better]
                if better:
                    gain[j] = max(util[j]) - u0
        movable = set(sorted(gain, key=lambda j: (-gain[j], j))[: self.candidates * self.max_migrations])
        fixed = {j: admitted[j][0] for j in current if j in admitted and j not in movable}
        var = [(j, g, u) for j in admitted if j not in fixed for g, u in zip(admitted[j], util[j])]
        if not var:
            return fixed, SolverStats(solver="highs", status="nothing to choose")
        return assign_types([(j, g) for j, g, _ in var], [u for _, _, u in var], self.pools, fixed,
                            self.max_migrations, self.time_limit_s, self.mip_gap, fallback={**current, **tentative})
