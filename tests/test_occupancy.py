"""The occupancy engine every placer shares: every policy's decision carries est_slowdown, and
`colocation=None` (`--no-colocation`) turns the model off for all of them. The baselines' racks and
co-location tie-breaks, and the engine's rollback: tests/test_colocation_placement.py."""

import pytest

from arena_opt.feasibility import check_decision
from arena_opt.perf.estimator import PerfEstimator
from arena_opt.policies import REGISTRY, make_policy
from arena_opt.snapshot import ClusterSnapshot, Job, Node

EST = PerfEstimator()


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_policy_reports_est_slowdown_unless_colocation_is_off(name):
    nodes = [Node(id=f"n{i}", gpu_type="a10", num_gpus=4, rack="r0") for i in range(2)]
    jobs = [Job(id=f"j{i}", model="gpt-350M", batch_size=128, total_iterations=1000, remaining_iterations=1000,
                submit_time=float(i), requested_num_gpus=2, requested_gpu_type="a10") for i in range(3)]
    snap = ClusterSnapshot(nodes=nodes, jobs=jobs)
    pol = make_policy(name, estimator=EST)
    d = pol.decide(snap)
    check_decision(snap, d)
    runs = [j for j in d.jobs if j.runs]
    assert runs and all(j.est_slowdown is not None and j.est_slowdown >= 1.0 for j in runs)
    for j in runs:
        alone = j.est_iter_time_s / j.est_slowdown
        assert j.est_throughput == pytest.approx(128 / alone / j.est_slowdown)
    off = make_policy(name, {"colocation": None}, estimator=EST).decide(snap)
    check_decision(snap, off)
    assert any(j.runs for j in off.jobs) and all(j.est_slowdown is None for j in off.jobs)


@pytest.mark.parametrize("name", ["fcfs", "gavel", "sia", "elasticflow", "arena-greedy"])
def test_solve_colocation_flags_reach_the_baselines(tmp_path, name):
    from pathlib import Path

    from arena_opt.cli import main
    from arena_opt.decision import Decision

    small = Path(__file__).resolve().parents[1] / "instances" / "small.json"
    on, off = tmp_path / "on.json", tmp_path / "off.json"
    assert main(["solve", str(small), "--policy", name, "-o", str(on), "--uplink-oversubscription", "3"]) == 0
    assert main(["solve", str(small), "--policy", name, "-o", str(off), "--no-colocation"]) == 0
    d_on, d_off = (Decision.model_validate_json(p.read_text()) for p in (on, off))
    runs_on = [j for j in d_on.jobs if j.runs]
    assert runs_on and all(j.est_slowdown is not None and j.est_slowdown >= 1 for j in runs_on)
    assert all(j.est_slowdown is None for j in d_off.jobs)


def test_rack_map_is_each_nodes_rack_in_the_topology():
    from arena_opt.occupancy import rack_map, topology

    snap = ClusterSnapshot(nodes=[Node(id="a", gpu_type="a100", num_gpus=4, rack="r1"),
                                  Node(id="b", gpu_type="a100", num_gpus=4, rack="r2"),
                                  Node(id="c", gpu_type="a40", num_gpus=2)], jobs=[])
    topo, racks = topology(snap), rack_map(snap)
    assert racks == {"a": "rack:r1", "b": "rack:r2", "c": "rack:default"}
    for nid, rack in racks.items():
        assert list(topo.neighbors(nid)) == [rack] and set(topo.neighbors(rack)) >= {nid, "cluster"}


def _old_multi_node_find(occ, pool_key, nodes, prev=(), rack_cost=None):
    """Occupancy.find_shape's multi-node rule as it was before whole nodes were kept by rack: every whole
    free node of the pool scanned per find (the oracle of the rack-kept version)."""
    from arena_opt.occupancy import _fewest_racks

    p = occ.pool[pool_key]
    whole = p.bucket[p.g]
    if len(whole) < nodes:
        return None
    by_rack, first = {}, {}
    for i in whole:
        r = occ.layout.rack_of[p.ids[i]]
        by_rack.setdefault(r, set()).add(i)
        first[r] = min(first.get(r, p.stamp[i]), p.stamp[i])
    by_rack = {r: by_rack[r] for r in sorted(by_rack, key=first.__getitem__)}
    pick = _fewest_racks(by_rack, p.ids, nodes, set(prev), rack_cost)
    return {n: occ.gpus_free(n)[:p.g] for n in pick}


def _hold(occ, held, job, placement) -> bool:
    """A found placement (None: nothing found) held by a new job."""
    if placement is None:
        return False
    occ.hold(job, placement)
    held.append(job)
    return True


@pytest.mark.parametrize("seed", range(6))
def test_multi_node_find_keeps_its_rules_under_holds_releases_and_rollbacks(seed):
    """Racks of uneven size, sub-node and multi-node holds, releases, rollbacks, previous nodes and a rack
    cost: every multi-node find is the one the full scan of whole nodes gives."""
    import numpy as np

    from arena_opt.occupancy import Layout, Occupancy

    rng = np.random.default_rng(seed)
    ids = [f"n{i}" for i in range(60)]
    rack_of = {n: f"r{int(rng.integers(0, 9))}" for n in ids}
    occ = Occupancy(Layout({"p": (ids, 4)}, rack_of))
    costs = {f"r{i}": float(rng.integers(0, 3)) for i in range(9)}
    held, marks, n, finds = [], [], 0, 0
    for _ in range(400):
        op = rng.random()
        if op < 0.45:
            k = int(rng.integers(2, 7))
            prev = list(rng.choice(ids, size=int(rng.integers(0, 4)), replace=False))
            cost = costs.__getitem__ if rng.random() < 0.5 else None
            want = _old_multi_node_find(occ, "p", k, prev, cost)
            got = occ.find_shape("p", k, 4, prev, rack_cost=cost)
            assert got == want
            finds += want is not None
            n += _hold(occ, held, f"m{n + 1}", got)
        elif op < 0.7:
            n += _hold(occ, held, f"s{n + 1}", occ.find_shape("p", 1, int(rng.choice([1, 2, 4]))))
        elif op < 0.85 and held:
            occ.release(held.pop(int(rng.integers(len(held)))))
        elif op < 0.93:
            marks.append((occ.mark(), list(held)))
        elif marks:
            m, was = marks.pop()
            occ.rollback(m)
            held = [j for j in was if j in occ.where]
            marks = [(mm, w) for mm, w in marks if mm <= m]
    assert finds > 20


@pytest.mark.parametrize("seed", range(6))
def test_fits_answers_what_find_and_a_release_then_rollback_give(seed):
    """Two pools, sub-node and multi-node holds, releases and rollbacks: `fits_shape` says whether
    `find_shape` places the shape, and with a held job's GPUs given back whether releasing it, finding
    and rolling back would have (and leaves the free GPUs as they were)."""
    import numpy as np

    from arena_opt.occupancy import Layout, Occupancy

    rng = np.random.default_rng(seed)
    pools = {"a": ([f"a{i}" for i in range(12)], 4), "b": ([f"b{i}" for i in range(6)], 8)}
    occ = Occupancy(Layout(pools, {n: f"r{int(rng.integers(0, 3))}" for ids, _ in pools.values() for n in ids}))
    held, n, asked = [], 0, {True: 0, False: 0}
    for _ in range(300):
        key = str(rng.choice(["a", "b"]))
        g = pools[key][1]
        nodes = int(rng.integers(1, 5))
        per = g if nodes > 1 else int(rng.choice([1, 2, g // 2, g, g + 1]))
        want = occ.find_shape(key, nodes, per) is not None
        assert occ.fits_shape(key, nodes, per) is want
        asked[want] += 1
        if held:
            j = held[int(rng.integers(len(held)))]
            free = {k: list(occ.pool[k].count) for k in pools}
            m = occ.mark()
            want = occ.find_shape(key, nodes, per, occ.release(j)) is not None
            occ.rollback(m)
            assert occ.fits_shape(key, nodes, per, occ.where[j]) is want
            assert {k: list(occ.pool[k].count) for k in pools} == free
        op = rng.random()
        if op < 0.5:
            n += _hold(occ, held, f"j{n + 1}", occ.find_shape(key, nodes, min(per, g)))
        elif op < 0.8 and held:
            occ.release(held.pop(int(rng.integers(len(held)))))
    assert asked[True] > 20 and asked[False] > 20
