"""The occupancy engine every placer shares: the baselines place by the rules of `placement.place`
(racks, co-location tie-breaks), every policy's decision carries est_slowdown, and `colocation=None`
turns the model off for all of them."""

import pytest

from arena_opt.contention import Contention
from arena_opt.feasibility import check_decision
from arena_opt.grids import GridCatalog
from arena_opt.linkloads import ColocationOptions, CommShares, LinkLoads
from arena_opt.occupancy import Occupancy, rack_map
from arena_opt.perf.estimator import PerfEstimator
from arena_opt.placement import place
from arena_opt.policies import REGISTRY, make_policy
from arena_opt.snapshot import ClusterSnapshot, Job, Node, RunningState

EST = PerfEstimator()
MODEL = "bert-1.3B"


def _job(jid, gpus=16, running=None, t=0.0):
    return Job(id=jid, model=MODEL, batch_size=256, total_iterations=100, remaining_iterations=100, submit_time=t,
               requested_num_gpus=gpus, requested_gpu_type="a100", running=running)


def _grid(snap, jid, nodes, gpus):
    job = next(j for j in snap.jobs if j.id == jid)
    gs = [g for g in GridCatalog.of(EST).grids(job, snap) if g.shape.nodes == nodes and g.num_gpus == gpus]
    cur = [g for g in gs if g.current]
    return (cur or gs)[0]


def _racks_snapshot():
    """x spans racks A and C; racks A, B and D have two free nodes each."""
    racks = {"A": 4, "B": 2, "C": 2, "D": 2}
    nodes = [Node(id=f"{r.lower()}{i}", gpu_type="a100", num_gpus=4, rack=r) for r, n in racks.items()
             for i in range(n)]
    free = ClusterSnapshot(nodes=nodes, jobs=[_job("x"), _job("y")])
    plan = _grid(free, "x", 4, 16).result.plan
    x_running = RunningState(gpu_type="a100", plan=plan,
                             placement={n: [0, 1, 2, 3] for n in ("a0", "a1", "c0", "c1")})
    return ClusterSnapshot(nodes=nodes, jobs=[_job("x", running=x_running), _job("y", t=1.0)])


@pytest.mark.parametrize("name", ["fcfs", "arena-greedy"])
def test_baselines_place_by_the_rules_of_place(name):
    snap = _racks_snapshot()
    chosen = {"x": _grid(snap, "x", 4, 16), "y": _grid(snap, "y", 4, 16)}
    packing_only = sorted(place(snap, chosen)["y"])
    assert packing_only == ["a2", "a3", "b0", "b1"]  # fewest racks, then the first of equally free ones
    extra = {"max_upgrades": 0} if name == "arena-greedy" else {}
    pol = make_policy(name, extra, estimator=EST)
    d = pol.decide(snap)
    check_decision(snap, d)
    by = d.by_job()
    assert by["x"].action == "keep" and by["y"].action == "start"
    assert sorted(by["y"].placement) == packing_only and by["y"].est_slowdown == 1.0
    # rack A's uplink carries one node's bandwidth (4 nodes at 4:1): y keeps off the uplink x loads
    pol = make_policy(name, {**extra, "colocation": ColocationOptions(uplink_oversubscription=4.0)}, estimator=EST)
    by = pol.decide(snap).by_job()
    assert sorted(by["y"].placement) == ["b0", "b1", "d0", "d1"]
    assert by["x"].est_slowdown == pytest.approx(1.0) and by["y"].est_slowdown == pytest.approx(1.0)


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


def test_rollback_restores_the_contention_and_the_order_of_ties():
    snap = _racks_snapshot()
    x, y = _grid(snap, "x", 4, 16), _grid(snap, "y", 4, 16)
    links = LinkLoads({n.id: n for n in snap.nodes}, rack_map(snap), snap.catalog, EST.params,
                      ColocationOptions(uplink_oversubscription=4.0))
    c = Contention(snap, links, CommShares(EST.params))
    occ = Occupancy.of(snap, [("x", snap.jobs[0].running.placement, x)], c)
    assert set(c.placed) == {"x"}
    one = _grid(snap, "y", 1, 4)
    first = occ.find(one)
    m = occ.mark()
    pl = occ.take("y", y)
    assert sorted(pl) == ["b0", "b1", "d0", "d1"] and set(c.placed) == {"x", "y"}
    occ.release("x")
    assert set(c.placed) == {"y"} and occ.free_gpus(x.pool) == 4 * 6
    occ.rollback(m)
    assert set(c.placed) == {"x"} and occ.where == {"x": snap.jobs[0].running.placement}
    assert occ.find(one) == first
    # a release and a new hold count as changes: the node that changed goes last among equals
    m = occ.mark()
    occ.hold("z", first)
    occ.release("z")
    assert occ.find(one) != first
    occ.rollback(m)
    assert occ.find(one) == first


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
