"""The optimum average JCT of a tiny instance by exhaustive search over the simulator's ticks: one node
of `gpus` GPUs of one type, restart-free, every job on any GPU count it has a speed for. At each tick
every arrived, unfinished job gets a count (or none) with the counts summing to at most the node;
it then runs at that speed until the next tick or until it finishes (its GPUs stay idle until the next
tick, as in the simulator). This is every schedule the simulator can produce on such an instance, so
the search's optimum is what the LP bound must not exceed (tests/test_bound.py, bench/bound.py)."""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass

from arena_opt.bound.instance import BoundGrid, BoundInstance, BoundJob


@dataclass(frozen=True)
class TinyJob:
    arrival: int  # tick of submission
    work: int  # units of work
    speed: tuple[tuple[int, int], ...]  # (GPUs, units per tick), speeds rising with GPUs


@dataclass(frozen=True)
class TinyInstance:
    gpus: int
    tick_s: float
    jobs: tuple[TinyJob, ...]

    def bound_instance(self) -> BoundInstance:
        """The same instance for the LP (one type "gpu", its GPUs; no restart cost)."""
        first = min(j.arrival for j in self.jobs)
        jobs = [BoundJob(f"j{i}", j.arrival * self.tick_s, j.arrival * self.tick_s,
                         tuple(BoundGrid("gpu", n, j.work / u * self.tick_s) for n, u in j.speed))
                for i, j in enumerate(self.jobs)]
        jobs.sort(key=lambda b: b.submit)
        return BoundInstance(jobs, {"gpu": self.gpus}, first * self.tick_s, self.tick_s, [])


def optimum(inst: TinyInstance) -> float:
    """The least average JCT over every tick schedule, in seconds."""
    jobs = inst.jobs
    n = len(jobs)
    last_arrival = max(j.arrival for j in jobs)
    options = [((0, 0),) + tuple((g, u) for g, u in j.speed if g <= inst.gpus) for j in jobs]

    def assignments(t: int, rem: tuple[int | float, ...]):
        live = [i for i in range(n) if rem[i] > 0 and jobs[i].arrival <= t]
        for pick in itertools.product(*(options[i] for i in live)):
            if sum(g for g, _ in pick) <= inst.gpus:
                yield live, pick

    @functools.lru_cache(maxsize=None)
    def best(t: int, rem: tuple) -> float:
        """Least sum of completion times (in ticks) of the unfinished jobs from tick t on."""
        if all(r <= 0 for r in rem):
            return 0.0
        if t > last_arrival:
            # no more arrivals: the future only shifts with t (each unfinished job pays one tick per tick)
            return (t - last_arrival - 1) * sum(1 for r in rem if r > 0) + after(rem)
        return step(t, rem)

    @functools.lru_cache(maxsize=None)
    def after(rem: tuple) -> float:
        return step(last_arrival + 1, rem)

    def step(t: int, rem: tuple) -> float:
        out = float("inf")
        for live, pick in assignments(t, rem):
            if all(u == 0 for _, u in pick) and t >= last_arrival:
                continue  # idling everything after the last arrival never helps
            new = list(rem)
            done = 0.0
            for i, (_, u) in zip(live, pick):
                if u and rem[i] <= u:
                    done += t + rem[i] / u
                    new[i] = 0
                elif u:
                    new[i] = rem[i] - u
            out = min(out, done + best(t + 1, tuple(new)))
        return out

    total = best(min(j.arrival for j in jobs), tuple(j.work for j in jobs))
    return (total - sum(j.arrival for j in jobs)) * inst.tick_s / n
