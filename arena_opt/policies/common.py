"""Shared machinery of the baseline policies: admission in submission order and the change of a
round's choice into placements. Their grids come from the estimator's `GridCatalog`.

Baselines place jobs while they decide (they reason about concrete free GPUs, like the schedulers
they reproduce), on the occupancy engine every placement uses (arena_opt/occupancy.py: the same
rules, racks and co-location tie-breaks as `placement.place`), and hand the placements with their
predicted co-location slowdowns to the shared Decision builder."""

from __future__ import annotations

import time
from abc import abstractmethod

from arena_opt.decision import Decision, SolverStats
from arena_opt.grids import Grid, GridCatalog, Pool
from arena_opt.occupancy import Occupancy, Placement
from arena_opt.perf.estimator import PerfEstimator
from arena_opt.policies.base import GridPolicy, build_decision
from arena_opt.reasons import no_grid_reason, pool_totals
from arena_opt.milp.options import PolicyOptions
from arena_opt.snapshot import ClusterSnapshot, Job


class PackedPolicy(GridPolicy):
    """A grid policy that places jobs itself while it decides (see module doc)."""

    name = "packed"

    def __init__(self, options: PolicyOptions | dict | None = None, estimator: PerfEstimator | None = None):
        super().__init__(options, estimator)
        self.reconfig = self.options.reconfig
        self._snapshot: ClusterSnapshot | None = None
        self._occupancy: Occupancy | None = None  # this round's (start_state), with its contention
        self._totals: tuple[ClusterSnapshot, dict[str, int]] | None = None  # GPUs per type, for reasons
        self._catalog: tuple[PerfEstimator, float | None, GridCatalog] | None = None  # see `catalog`
        self._sorted: dict[str, tuple[Placement, Placement]] = {}  # last round's, see `_sorted_placement`

    @property
    def catalog(self) -> GridCatalog:
        # asked once per job per round: the estimator's catalogue is kept while estimator and caution
        # stand, instead of GridCatalog.of's weak-keyed lookup every time
        est, caution = self.estimator, self.options.caution
        hit = self._catalog
        if hit is None or hit[0] is not est or hit[1] != caution:
            hit = self._catalog = (est, caution, GridCatalog.of(est, caution))
        return hit[2]

    @property
    def pools(self) -> dict[tuple, Pool]:
        return self.catalog.cluster(self._snapshot).pool_map

    def decide_usable(self, snapshot: ClusterSnapshot) -> Decision:
        t0 = time.perf_counter()
        self._snapshot = snapshot
        chosen, placements, reasons, stats = self.plan(snapshot)
        occ, self._occupancy = self._occupancy, None
        if occ is None or occ.where.keys() != placements.keys():
            raise RuntimeError(f"policy {self.name}: its placements are not what it holds")
        slow = None if occ.contention is None else occ.contention.slowdowns()  # of the final placement
        stats.total_s = time.perf_counter() - t0
        stats.num_grids = len(chosen)
        return build_decision(snapshot, self.name, chosen, placements, reasons, stats, slow, self._options_json,
                              self._last)

    def grid_options(self, job: Job) -> dict[tuple[str, int], Grid]:
        """The job's grids by (GPU type, count) on this round's cluster (`GridCatalog.options`)."""
        return self.catalog.options(job, self._snapshot)

    def requested(self, job: Job) -> Grid | None:
        """The user's request as a grid (`grids.requested_grid`)."""
        return self.catalog.requested(job, self._snapshot)

    def no_grid(self, job: Job) -> str:
        """Why `job` has no grid on this round's cluster, by its true cause (arena_opt/reasons.py)."""
        if self._totals is None or self._totals[0] is not self._snapshot:
            self._totals = (self._snapshot, pool_totals(self._snapshot))
        return no_grid_reason(job, self._snapshot, self._totals[1])

    @abstractmethod
    def plan(self, snapshot: ClusterSnapshot) -> tuple[dict[str, Grid], dict[str, Placement], dict[str, str],
                                                       SolverStats]:
        """Chosen grid and placement per job that runs, a reason per job that does not, stats."""

    # helpers shared by the subclasses
    def start_state(self, snapshot: ClusterSnapshot) -> tuple[Occupancy, dict[str, Grid], dict[str, Placement]]:
        """The occupancy with every running job held where it is (and registered with the round's
        contention), and each running job's current grid and placement."""
        chosen: dict[str, Grid] = {}
        placements: dict[str, Placement] = {}
        catalog, last = self.catalog, self._sorted
        self._sorted = {}
        for j in snapshot.jobs:
            r = j.running
            if r is None:
                continue
            g = catalog.current(j, snapshot)
            if g is None:  # the estimate says the running allocation is infeasible: let it go
                continue
            chosen[j.id] = g
            placements[j.id] = self._sorted_placement(j.id, r.placement, last)
        occ = self._occupancy = self._held.of(snapshot, [(j, pl, chosen[j]) for j, pl in placements.items()],
                                              self.contention(snapshot))
        return occ, chosen, placements

    def _sorted_placement(self, job_id: str, placement: Placement, last: dict[str, tuple[Placement, Placement]]
                          ) -> Placement:
        """The running placement with each node's GPUs in order. An allocation that stands is the same
        object round after round (a simulator's, a live loop's own), so last round's sorted copy serves
        (no policy edits a placement: occupancy and decisions copy or replace them), and the occupancy's
        comparison with last round's holdings finds the same lists."""
        hit = last.get(job_id)
        if hit is None or hit[0] is not placement:
            hit = (placement, {nid: sorted(gs) for nid, gs in placement.items()})
        self._sorted[job_id] = hit
        return hit[1]


def place_changes(pack: Occupancy, chosen: dict[str, Grid], current: dict[str, Grid], held: dict[str, Placement],
                  fallback: dict[str, Grid] | None = None) -> tuple[dict[str, Grid], dict[str, Placement], dict[str, str]]:
    """Place a round's choice on `pack`, which holds every running job where it runs (the state
    `start_state` returns). Kept jobs stay; running jobs that change go first, largest first, then
    new jobs, largest first (a new job falls back to its `fallback` grid). A running job whose new
    grid cannot be placed is pinned where it was and the placement starts over, so policies that
    never preempt do not preempt by accident of fragmentation."""
    fallback = fallback or {}
    pinned: set[str] = set()
    start = pack.mark()
    while True:
        kept = {j: held[j] for j, g in chosen.items() if g.current or j in pinned}
        for j in current:
            if j not in kept:
                pack.release(j)
        out = {j: (current[j] if j in pinned else chosen[j]) for j in kept}
        placements = dict(kept)
        reasons: dict[str, str] = {}
        movers = sorted((j for j in chosen if j not in kept), key=lambda j: (j not in current, -chosen[j].num_gpus, j))
        retry = False
        for j in movers:
            pl = pack.take(j, chosen[j], held.get(j))
            if pl is None and j in fallback:
                pl = pack.take(j, fallback[j])
                if pl is not None:
                    out[j], placements[j] = fallback[j], pl
                    continue
            if pl is not None:
                out[j], placements[j] = chosen[j], pl
            elif j in current:
                pinned.add(j)
                retry = True
                break
            else:
                reasons[j] = "GPUs fragmented: no placement this round"
        if not retry:
            return out, placements, reasons
        pack.rollback(start)


def fifo(jobs: list[Job]) -> list[Job]:
    return sorted(jobs, key=lambda j: (j.submit_time, j.id))


def admit_fifo(snapshot: ClusterSnapshot, pack: Occupancy, current: dict[str, Grid], offers):
    """Admission in submission order. `offers(job, current grid or None)` returns (the options the
    job may be assigned, the grids to try placing it on in order, (why no option, why none fits)).
    A running job is admitted with its options as they are; a newcomer only if one of its tries is
    free now (it is then tentatively placed). Returns (admitted, tentative, reasons)."""
    admitted: dict[str, list[Grid]] = {}
    tentative: dict[str, Grid] = {}
    reasons: dict[str, str] = {}
    for job in fifo(snapshot.jobs):
        opts, tries, why = offers(job, current.get(job.id))
        if job.id in current:
            admitted[job.id] = opts
            continue
        if not opts:
            reasons[job.id] = why[0]
            continue
        for g in tries:
            if pack.take(job.id, g) is not None:
                admitted[job.id] = opts
                tentative[job.id] = g
                break
        else:
            reasons[job.id] = why[1]
    return admitted, tentative, reasons

