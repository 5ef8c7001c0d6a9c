"""FCFS: the user's requested GPU type and count at compact (whole-node first) locality, in
submission order, never preempting. A job that does not fit blocks the later jobs of its GPU
type (no backfilling), as in Arena's FCFS baseline; jobs of other types go on."""

from __future__ import annotations

from arena_opt.decision import SolverStats
from arena_opt.policies.common import PackedPolicy, fifo
from arena_opt.policies.options import FcfsOptions


class FCFSPolicy(PackedPolicy):
    name = "fcfs"
    Options = FcfsOptions

    def plan(self, snapshot):
        pack, chosen, placements = self.start_state(snapshot)
        reasons: dict[str, str] = {}
        blocked: set[str] = set()
        types = {p[0] for p in self.pools}
        for job in fifo([j for j in snapshot.jobs if j.id not in chosen]):
            if len(blocked) == len(types):
                reasons[job.id] = "queued behind earlier jobs (first come, first served per GPU type)"
                continue
            g = self.requested(job)
            if g is None:
                reasons[job.id] = self.no_grid(job)
                continue
            t = g.shape.gpu_type
            if t in blocked:
                reasons[job.id] = f"queued behind an earlier {t} job (first come, first served per GPU type)"
                continue
            pl = pack.take(job.id, g)
            if pl is None:
                blocked.add(t)
                reasons[job.id] = f"{g.num_gpus} x {t} not free at compact locality"
                continue
            chosen[job.id] = g
            placements[job.id] = pl
        return chosen, placements, reasons, SolverStats(solver="fifo", status="ok")
