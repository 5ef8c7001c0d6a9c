"""HeldOccupancy: the occupancy brought from round to round is the one `Occupancy.of` builds afresh, and
simulations decide the same with it as without it."""

import numpy as np
import pytest

from arena_opt.cluster import load_cluster
from arena_opt.occupancy import HeldOccupancy, Layout, Occupancy
from arena_opt.perf.estimator import PerfEstimator
from arena_opt.policies import REGISTRY
from arena_opt.sim import SimOptions, simulate
from arena_opt.sim.gen import GenOptions, generate
from arena_opt.snapshot import ClusterSnapshot, Node


def _state(occ: Occupancy) -> dict:
    """Everything a find, hold, release or rollback reads (sets as sets: their inner order is not read)."""
    pools = {k: (p.count, p.stamp, [set(b) for b in p.bucket], p.total, {r: set(s) for r, s in p.whole.items()})
             for k, p in occ.pool.items()}
    nodes = occ.layout.where
    return {"pools": pools, "free": {n: occ.gpus_free(n) for n in nodes}, "where": list(occ.where.items()),
            "grid_of": list(occ.grid_of.items()), "jobs_on": {n: set(occ.jobs_on(n)) for n in nodes},
            "clock": next(occ._clock), "journal": occ._journal}


def _snapshot(rng) -> ClusterSnapshot:
    nodes = [Node(id=f"a{i}", gpu_type="a100", num_gpus=4, rack=f"r{int(rng.integers(0, 4))}") for i in range(12)]
    nodes += [Node(id=f"v{i}", gpu_type="v100", num_gpus=8, rack=f"s{int(rng.integers(0, 2))}") for i in range(5)]
    return ClusterSnapshot(nodes=nodes, jobs=[])


def _round(occ: Occupancy, rng, n: int) -> dict:
    """Random finds, holds and releases on a round's occupancy; returns the jobs held at the end."""
    pools = list(occ.pool)
    for _ in range(25):
        key = pools[int(rng.integers(len(pools)))]
        g = occ.gpus_per_node(key)
        if rng.random() < 0.3:
            pl = occ.find_shape(key, int(rng.integers(2, 4)), g)
        else:
            pl = occ.find_shape(key, 1, int(rng.choice([s for s in (1, 2, 4, 8) if s <= g])))
        if pl is not None:
            occ.hold(f"j{n}-{_}", pl)
        if occ.where and rng.random() < 0.3:
            occ.release(list(occ.where)[int(rng.integers(len(occ.where)))])
    return dict(occ.where)


@pytest.mark.parametrize("seed", range(5))
def test_held_occupancy_is_the_fresh_one_round_after_round(seed):
    """Rounds whose running jobs come, go, stay or move (the placements of a random round's finds):
    every round's held occupancy has the fresh one's state, and the round's finds on both agree."""
    rng = np.random.default_rng(seed)
    snap = _snapshot(rng)
    held = HeldOccupancy()
    running: dict = {}
    for n in range(30):
        order = list(running)
        rng.shuffle(order)  # the snapshot's job order changes too
        items = [(j, {nid: sorted(g) for nid, g in running[j].items()}, None) for j in order]
        fresh, kept = Occupancy.of(snap, items), held.of(snap, items)
        assert _state(kept) == _state(fresh)
        seed_round = int(rng.integers(1 << 30))
        got = _round(kept, np.random.default_rng(seed_round), n)
        assert got == _round(fresh, np.random.default_rng(seed_round), n)
        assert _state(kept) == _state(fresh)
        running = {j: pl for j, pl in got.items() if rng.random() < 0.9}
        if len(running) > 1:  # two jobs trade places: the same ids, moved
            a, b = rng.choice(list(running), size=2, replace=False)
            running[a], running[b] = running[b], running[a]


def test_held_occupancy_starts_over_after_a_bad_round():
    """Two jobs on one GPU is the error `Occupancy.of` raises; the next round is built from scratch."""
    snap = ClusterSnapshot(nodes=[Node(id="a", gpu_type="a100", num_gpus=4)], jobs=[])
    held = HeldOccupancy()
    held.of(snap, [("x", {"a": [0, 1]}, None)])
    with pytest.raises(ValueError):
        held.of(snap, [("x", {"a": [0, 1]}, None), ("y", {"a": [1, 2]}, None)])
    assert _state(held.of(snap, [("y", {"a": [1, 2]}, None)])) == _state(Occupancy.of(snap, [("y", {"a": [1, 2]}, None)]))
    with pytest.raises(ValueError, match="twice"):
        held.of(snap, [("y", {"a": [1]}, None), ("y", {"a": [2]}, None)])


def test_a_new_layout_starts_over():
    a = ClusterSnapshot(nodes=[Node(id="a", gpu_type="a100", num_gpus=4)], jobs=[])
    b = ClusterSnapshot(nodes=[Node(id="b", gpu_type="a40", num_gpus=2)], jobs=[])
    held = HeldOccupancy()
    held.of(a, [("x", {"a": [0]}, None)])
    assert _state(held.of(b, [("y", {"b": [1]}, None)])) == _state(Occupancy.of(b, [("y", {"b": [1]}, None)]))
    assert Layout.of(a) is not Layout.of(b)


@pytest.mark.parametrize("policy", list(REGISTRY))
def test_simulations_decide_the_same_with_and_without_the_held_occupancy(policy, monkeypatch):
    """Every policy, a loaded random trace (co-location on): the same allocations every round and the same
    record as when every round builds its occupancy afresh."""
    est = PerfEstimator(table_mode="off")
    cluster = load_cluster("a100:3x4,a40:4x2,v100:2x8")
    trace = generate(cluster, GenOptions(jobs=30, seed=3, load=1.5, models=("gpt-350M", "bert-760M", "moe-690M"),
                                         batch_sizes=(128,), duration_median_s=1800), est)

    def run():
        return simulate(trace, cluster, policy, truth=est, estimate=est, options=SimOptions(record_decisions=True))

    kept = run()
    monkeypatch.setattr(HeldOccupancy, "of", lambda self, snap, held=(), contention=None:
                        Occupancy.of(snap, held, contention))
    fresh = run()
    assert kept.decision_log == fresh.decision_log
    assert kept.model_dump(exclude={"wall_s", "cpu_s", "decisions"}) == \
        fresh.model_dump(exclude={"wall_s", "cpu_s", "decisions"})
    assert [{k: v for k, v in d.items() if k not in ("wall_s", "cpu_s", "solver_s")} for d in kept.decisions] == \
        [{k: v for k, v in d.items() if k not in ("wall_s", "cpu_s", "solver_s")} for d in fresh.decisions]
