"""ElasticFlow (elastic, deadline-aware, one GPU type per job): every job keeps its GPU type and
gets the smallest GPU count that still meets its deadline (its minimum satisfactory share); the
GPUs left over go, one doubling at a time, to the job whose throughput gains most per added GPU.

Admission as in ElasticFlow: jobs already running keep at least their share; a waiting job is
admitted (earliest deadline first, then submission order) only when its share fits next to the
shares of the jobs admitted before it. Jobs that cannot meet their deadline at any count, or
have none (or `use_deadlines=False`, Arena's "ElasticFlow-L" variant), get the smallest feasible
count and come after the deadline jobs. Counts are recomputed every round (a running job's share
is capped at what it holds in the admission pass; it may grow again in the doubling pass); a
running job whose count changes is resized and pays the reconfiguration."""

from __future__ import annotations

import heapq
import math
from collections import defaultdict

from arena_opt.decision import SolverStats
from arena_opt.grids import Grid
from arena_opt.policies.common import PackedPolicy, place_changes
from arena_opt.policies.options import ElasticFlowOptions


class ElasticFlowPolicy(PackedPolicy):
    name = "elasticflow"
    Options = ElasticFlowOptions
    options: ElasticFlowOptions

    def __init__(self, options: ElasticFlowOptions | dict | None = None, estimator=None):
        super().__init__(options, estimator)
        self.use_deadlines = self.options.use_deadlines
        self._rung_memo: dict[str, tuple] = {}  # job id -> (its ladder, (running count, resumed), _rungs)

    def _share(self, job, ladder: list[Grid], cur: Grid | None, now: float) -> tuple[int, bool]:
        """Index in the ladder of the smallest count meeting the deadline, and whether one does."""
        if not self.use_deadlines or job.deadline is None:
            return 0, False
        rem, deadline = job.remaining_iterations, job.deadline
        for i, (delay, t) in enumerate(self._rungs(job, ladder, cur)[0]):
            if now + delay + rem * t <= deadline:
                return i, True
        return 0, False

    def _rungs(self, job, ladder: list[Grid], cur: Grid | None) -> tuple[list[tuple[float, float]], int]:
        """(reconfiguration delay, seconds per iteration) of each rung of the job's ladder, and the rung of its
        running count (0 when none): the same round after round while its ladder and its running count are
        (kept per job: every job's ladder is looked at every round, hundreds of jobs per round)."""
        n, resumed = None if cur is None else cur.num_gpus, job.running is not None
        hit = self._rung_memo.get(job.id)
        if hit is not None and hit[0] is ladder and hit[1] == (n, resumed):
            return hit[2]
        rungs = [(0.0 if g.num_gpus == n else self.reconfig.delay_s(job.arch, g.num_gpus, resumed=resumed),
                  g.result.iter_time_s) for g in ladder]
        held = next((k for k, g in enumerate(ladder) if g.num_gpus == n), 0)
        self._rung_memo[job.id] = (ladder, (n, resumed), (rungs, held))
        return rungs, held

    def plan(self, snapshot):
        now = snapshot.time
        pack, current, held = self.start_state(snapshot)
        if len(self._rung_memo) > 2 * len(snapshot.jobs):  # finished jobs' rungs
            ids = {j.id for j in snapshot.jobs}
            self._rung_memo = {j: v for j, v in self._rung_memo.items() if j in ids}
        reasons: dict[str, str] = {}
        ladders: dict[str, list[Grid]] = {}
        entries = []
        for job in snapshot.jobs:
            cur = current.get(job.id)
            if cur is not None:
                t = cur.shape.gpu_type
            else:
                g = self.requested(job)
                if g is None:
                    reasons[job.id] = self.no_grid(job)
                    continue
                t = g.shape.gpu_type
            ladder = ladders[job.id] = self.catalog.derived(job, snapshot, ("type", t), lambda opts: sorted(
                (g for k, g in opts.items() if k[0] == t), key=lambda g: g.num_gpus))
            share, meets = self._share(job, ladder, cur, now)
            if cur is not None:
                rank = (0, 0.0, job.submit_time)
            elif meets:
                rank = (1, job.deadline, job.submit_time)
            else:
                rank = (2, 0.0, job.submit_time)
            entries.append((rank, job.id, job, share))
        entries.sort(key=lambda e: (e[0], e[1]))

        free: dict[str, int] = defaultdict(int)
        for p in self.pools.values():
            free[p.gpu_type] += p.num_gpus
        level: dict[str, int] = {}  # job -> index into its ladder
        for _, jid, job, share in entries:
            ladder = ladders[jid]
            t = ladder[0].shape.gpu_type
            cur = current.get(jid)
            if cur is not None:
                # running jobs come first and take at most what they hold, so they always fit
                share = min(share, self._rungs(job, ladder, cur)[1])
            if ladder[share].num_gpus <= free[t]:
                level[jid] = share
                free[t] -= ladder[share].num_gpus
            else:
                reasons[jid] = f"its share ({ladder[share].num_gpus} x {t}) does not fit next to admitted jobs"

        # leftover GPUs: repeatedly double the job with the largest throughput gain per added GPU
        heap = []
        for jid, i in level.items():
            self._push(heap, jid, ladders[jid], i)
        while heap:
            neg_gain, jid, i = heapq.heappop(heap)
            ladder = ladders[jid]
            if level[jid] != i:
                continue
            t = ladder[i].shape.gpu_type
            add = ladder[i + 1].num_gpus - ladder[i].num_gpus
            if add > free[t]:
                continue
            free[t] -= add
            level[jid] = i + 1
            self._push(heap, jid, ladder, i + 1)

        chosen: dict[str, Grid] = {}
        for jid, i in level.items():
            g = ladders[jid][i]
            cur = current.get(jid)
            chosen[jid] = cur if cur is not None and cur.num_gpus == g.num_gpus else g
        fallback = {jid: ladders[jid][0] for jid in level if jid not in current}
        out, placements, more = place_changes(pack, chosen, current, held, fallback)
        reasons.update(more)
        return out, placements, reasons, SolverStats(solver="greedy", status="ok")

    @staticmethod
    def _push(heap, jid: str, ladder: list[Grid], i: int) -> None:
        if i + 1 >= len(ladder):
            return
        gain = (ladder[i + 1].throughput - ladder[i].throughput) / (ladder[i + 1].num_gpus - ladder[i].num_gpus)
        if gain > 0 and math.isfinite(gain):
            heapq.heappush(heap, (-gain, jid, i))
