"""Slowdown of co-located jobs that share a resource: a node's CPU cores, its NVLink/PCIe fabric,
its network uplink.

Each job, run alone, keeps each shared resource busy for `busy_s` seconds per iteration and uses
`demand` units of its capacity meanwhile (cores = its compute processes; a link = 1, the whole
link). Resources are processor-shared: while a job uses a resource, the others use it with the
probability of their busy fraction, so the expected demand it meets is

    D = own demand + background + sum over the other jobs of demand x busy_s / iteration time,

and its busy time stretches by max(1, D / capacity) / max(1, own demand / capacity) (its alone time
already includes its own oversubscription). A job's busy fraction is its stretched busy time over
its stretched iteration time (a slowed job holds the resource longer); iteration times, stretches
and busy fractions depend on each other and a fixed-point iteration settles them. Loads of one job
that share a `group` happen at the same time (one transfer that crosses several links): the job waits
for the most stretched of them, not for each in turn. Communication that another job's traffic slows is
the load the scheduler should avoid putting on one uplink; `slowdowns` gives the factors to scale
grid throughputs by for a candidate placement.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Load:
    busy_s: float  # per iteration, when alone
    demand: float  # capacity units used while busy
    group: str | None = None  # loads of one job with the same group overlap in time (see module doc)


@dataclass(frozen=True)
class JobLoads:
    name: str
    iter_s: float  # alone
    loads: dict[str, Load] = field(default_factory=dict)  # resource -> load


def _stretch(demand: float, others: float, capacity: float) -> float:
    return max(1.0, (demand + others) / capacity) / max(1.0, demand / capacity)


def iteration_times(jobs: list[JobLoads], capacity: dict[str, float], background: dict[str, float] | None = None,
                    tol: float = 1e-9, max_iter: int = 200) -> list[float]:
    """Iteration time of every job when all run at once (and `background` units of each resource
    are taken by work outside the model)."""
    background = background or {}
    t = [j.iter_s for j in jobs]
    stretch = [{r: 1.0 for r in j.loads} for j in jobs]
    users: dict[str, list[tuple[int, Load]]] = {}  # resource -> (job index, load), by job index
    for b, k in enumerate(jobs):
        for r, ld in k.loads.items():
            users.setdefault(r, []).append((b, ld))
    for _ in range(max_iter):
        new_t, new_s = [], []
        for a, j in enumerate(jobs):
            x, s, grouped = j.iter_s, {}, {}
            for r, ld in j.loads.items():
                others = background.get(r, 0.0) + sum(
                    k.demand * min(1.0, k.busy_s * stretch[b][r] / t[b]) for b, k in users[r] if b != a)
                s[r] = _stretch(ld.demand, others, capacity[r])
                if ld.group is None:
                    x += ld.busy_s * (s[r] - 1.0)
                else:
                    grouped[ld.group] = max(grouped.get(ld.group, 0.0), ld.busy_s * (s[r] - 1.0))
            new_t.append(x + sum(grouped.values()))
            new_s.append(s)
        done = max(abs(n - o) / o for n, o in zip(new_t, t)) < tol
        t, stretch = new_t, new_s
        if done:
            break
    return t


def slowdowns(jobs: list[JobLoads], capacity: dict[str, float], background: dict[str, float] | None = None
              ) -> list[float]:
    """Iteration time together / alone, per job."""
    return [tt / j.iter_s for tt, j in zip(iteration_times(jobs, capacity, background), jobs)]


def alone_time(job: JobLoads, capacity: dict[str, float], background: dict[str, float]) -> float:
    """A job's iteration time with only `background` load beside it."""
    return iteration_times([job], capacity, background)[0]


def cpu_job(name: str, iter_s: float, compute_busy_s: float, processes: int) -> JobLoads:
    """A job whose ranks compute on a host's CPU cores (one thread each)."""
    return JobLoads(name, iter_s, {"cpu": Load(compute_busy_s, float(processes))})


__all__ = ["JobLoads", "Load", "alone_time", "cpu_job", "iteration_times", "slowdowns"]
