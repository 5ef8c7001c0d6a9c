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
