"""Co-location slowdown of placed jobs: the jobs placement has put on shared links, the slowdown a
candidate node or rack would predict (`perf.sharing`, processor sharing), and every placed
job's slowdown factor for its decision."""

from __future__ import annotations

from arena_opt.grids import Grid
from arena_opt.linkloads import CommShares, JobComm, LinkLoads
from arena_opt.perf.sharing import JobLoads, Load, slowdowns
from arena_opt.snapshot import ClusterSnapshot


class Contention:
    """One round's shared-link state. `add` registers a placed job; `node_cost` and `rack_cost` score a
    candidate (its own slowdown - 1 plus the slowdown it adds to the jobs already there); `slowdowns`
    gives every registered job's factor."""

    def __init__(self, snapshot: ClusterSnapshot, links: LinkLoads, shares: CommShares):
        self.links = links
        self.shares = shares
        self.catalog = snapshot.catalog
        self.jobs = {j.id: j for j in snapshot.jobs}
        self.placed: dict[str, JobLoads] = {}
        self.users: dict[str, list[str]] = {}  # resource -> job ids, in placement order
        self._comm: dict[tuple, JobComm] = {}
        # job id -> its place in placement order: a number never given twice (a count of the jobs
        # registered would repeat one after a removal, and a tie would leave the order to set iteration)
        self._order: dict[str, int] = {}
        self._placed_count = 0

    def comm(self, job_id: str, grid: Grid) -> JobComm:
        key = (job_id, grid.pool, grid.shape, grid.current)  # a policy may try one job on several grids
        hit = self._comm.get(key)
        if hit is None:
            hit = self._comm[key] = self._job_comm(job_id, grid)
        return hit

    def _job_comm(self, job_id: str, grid: Grid) -> JobComm:
        job, shape = self.jobs[job_id], grid.shape
        gpu, intra_link = self.catalog[shape.gpu_type], grid.pool[2]
        kind = self._kind(grid)
        iter_s = grid.result.iter_time_s
        if not self._may_share(grid):  # nothing it could share: skip the cost model
            return JobComm(iter_s, 0.0, 0.0, kind, 0.0)
        plan = job.running.plan if grid.current else grid.result.plan
        share = self.shares(job.arch, job.batch_size, shape.gpu_type, gpu, intra_link, shape.nodes,
                            shape.gpus_per_node, plan)
        return JobComm(iter_s, share.intra * iter_s, share.inter * iter_s, kind,
                       self.links.node_net_bps(shape.gpu_type, shape.gpus_per_node, intra_link))

    def _kind(self, grid: Grid) -> str:
        return self.links.kind(grid.shape.gpu_type, grid.pool[2])

    def _may_share(self, grid: Grid) -> bool:
        """Whether a job on this grid can load a shared link at all: a multi-node one where uplinks can
        be oversubscribed, a sub-node one with several GPUs on a fabric of limited capacity."""
        if grid.multi_node:
            return self.links.uplinks_shared
        return grid.num_gpus > 1 and self.links.fabric_rings(self._kind(grid)) is not None

    # ---- candidates ----------------------------------------------------------------------------
    def sensitive(self, job_id: str, grid: Grid) -> bool:
        """Whether the job would load any shared link (else every candidate scores 0)."""
        c = self.comm(job_id, grid)
        return (c.inter_busy_s if grid.multi_node else c.intra_busy_s) > 0

    def node_cost(self, job_id: str, grid: Grid, node: str) -> float:
        return self._cost(job_id, grid, self.links.fabric(self.comm(job_id, grid), node))

    def rack_cost(self, job_id: str, grid: Grid, rack: str) -> float:
        """Cost of the job crossing `rack`'s uplink (a spanning job crosses the uplink of every rack it uses)."""
        return self._cost(job_id, grid, self.links.uplink(self.comm(job_id, grid), rack))

    def _cost(self, job_id: str, grid: Grid, loads: dict[str, Load]) -> float:
        if not loads:
            return 0.0
        cand = JobLoads(job_id, self.comm(job_id, grid).iter_s, loads)
        others = self._component(loads)
        if not others:
            return self._slowdowns([cand])[0] - 1.0
        before = self._slowdowns(others)
        after = self._slowdowns(others + [cand])
        return (after[-1] - 1.0) + sum(a - b for a, b in zip(after, before))

    # ---- registered jobs -----------------------------------------------------------------------
    def add(self, job_id: str, grid: Grid, placement: dict[str, list[int]]) -> None:
        if not self._may_share(grid):
            return
        loads = self.links.loads(self.comm(job_id, grid), placement)
        if not loads:
            return
        self.placed[job_id] = JobLoads(job_id, self.comm(job_id, grid).iter_s, loads)
        self._queue_last(job_id)
        for r in loads:
            self.users.setdefault(r, []).append(job_id)

    def remove(self, job_id: str) -> None:
        """Unregister a job (its GPUs were given back); nothing if it was not registered."""
        jl = self.placed.pop(job_id, None)
        if jl is None:
            return
        del self._order[job_id]
        for r in jl.loads:
            self.users[r].remove(job_id)

    def requeue(self, job_id: str) -> None:
        """Put a registered job last in placement order, as `remove` then `add` with the same grid and
        placement would (its loads do not change), without recomputing them; nothing if unregistered."""
        jl = self.placed.get(job_id)
        if jl is None:
            return
        self._queue_last(job_id)
        self.placed[job_id] = self.placed.pop(job_id)
        for r in jl.loads:
            users = self.users[r]
            users.remove(job_id)
            users.append(job_id)

    def _queue_last(self, job_id: str) -> None:
        self._order[job_id] = self._placed_count
        self._placed_count += 1

    def slowdowns(self) -> dict[str, float]:
        """Slowdown factor (>= 1) of every registered job that loads a shared link; others run at 1."""
        out: dict[str, float] = {}
        for jid, jl in self.placed.items():
            if jid in out:
                continue
            comp = self._component(jl.loads)
            out.update(zip((j.name for j in comp), self._slowdowns(comp)))
        return out

    def _component(self, loads: dict[str, Load]) -> list[JobLoads]:
        """Registered jobs connected to `loads`' links through shared links, in placement order."""
        seen: set[str] = set()
        todo = [r for r in loads if r in self.users]
        done_r: set[str] = set(todo)
        while todo:
            r = todo.pop()
            for jid in self.users[r]:
                if jid not in seen:
                    seen.add(jid)
                    for r2 in self.placed[jid].loads:
                        if r2 not in done_r:
                            done_r.add(r2)
                            todo.append(r2)
        return [self.placed[jid] for jid in sorted(seen, key=self._order.__getitem__)]

    def _slowdowns(self, jobs: list[JobLoads]) -> list[float]:
        caps = {r: self.links.capacity(r) for j in jobs for r in j.loads}
        if len(jobs) == 1 and all(ld.demand <= caps[r] for r, ld in jobs[0].loads.items()):
            return [1.0]  # alone within every link's capacity
        return [max(1.0, s) for s in slowdowns(jobs, caps)] if jobs else []


__all__ = ["Contention"]
