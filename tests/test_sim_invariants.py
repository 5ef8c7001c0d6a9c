"""Invariants of whole simulations on random traces, for every policy of the registry."""

from collections import defaultdict

import pytest

from arena_opt.perf.estimator import PerfEstimator
from arena_opt.policies import REGISTRY
from arena_opt.cluster import load_cluster
from arena_opt.sim import SimOptions, simulate
from arena_opt.sim.gen import GenOptions, generate
from arena_opt.metrics import Timeline, compute

MODELS = ("gpt-350M", "bert-760M", "moe-690M")


@pytest.fixture(scope="module")
def estimator():
    return PerfEstimator(table_mode="off")  # one plan cache for the whole module


@pytest.fixture(scope="module")
def cluster():
    return load_cluster("a100:2x4,a40:4x2,v100:1x8")


def trace_for(cluster, estimator, seed, jobs=24):
    return generate(cluster, GenOptions(jobs=jobs, seed=seed, load=1.2, models=MODELS, batch_sizes=(128,),
                                        duration_median_s=1800), estimator)


def run(cluster, estimator, trace, policy, **opts):
    return simulate(trace, cluster, policy, truth=estimator, estimate=estimator,
                    options=SimOptions(record_decisions=True, **opts))


@pytest.mark.parametrize("policy", list(REGISTRY))
@pytest.mark.parametrize("seed", [1, 2])
def test_invariants(policy, seed, cluster, estimator):
    trace = trace_for(cluster, estimator, seed)
    res = run(cluster, estimator, trace, policy)
    cap = {n.id: (n.gpu_type, n.num_gpus) for n in cluster.nodes}

    # no GPU given twice, none beyond a node's capacity, none of another type, in any round
    for entry in res.decision_log:
        used = set()
        for jid, (gtype, placement) in entry["alloc"].items():
            for nid, gpus in placement.items():
                assert cap[nid][0] == gtype
                for g in gpus:
                    assert 0 <= g < cap[nid][1]
                    assert (nid, g) not in used, f"t={entry['t']}: GPU {nid}:{g} over-committed"
                    used.add((nid, g))

    # progress is monotone: remaining work never grows
    seen: dict[str, list[float]] = defaultdict(list)
    for entry in res.decision_log:
        for jid, rem in entry["remaining"].items():
            seen[jid].append(rem)
    for jid, xs in seen.items():
        assert all(b <= a + 1e-9 for a, b in zip(xs, xs[1:])), f"{jid}: remaining went up: {xs}"

    # run to completion: every job finished, nothing left, and the run ends with the last one
    jobs = res.job_dicts()
    assert not res.stalled
    assert all(j["status"] == "done" and j["remaining"] == 0 for j in jobs)
    assert res.end == max(j["finish"] for j in jobs)

    # busy GPU-seconds of the cluster timeline == the sum of every job's allocation over time
    tl = Timeline(res.timeline)
    busy = tl.integral("alloc_gpus", res.origin, res.end)
    assert busy == pytest.approx(sum(j["gpu_seconds"] for j in jobs), rel=1e-9)
    productive = tl.integral("productive_gpus", res.origin, res.end)
    assert productive == pytest.approx(sum(j["productive_gpu_seconds"] for j in jobs), rel=1e-9)
    # and the throughput integral is exactly the work of the trace
    samples = tl.integral("throughput", res.origin, res.end)
    assert samples == pytest.approx(sum(j["iterations"] * j["batch_size"] for j in jobs), rel=1e-6)

    # no job finishes sooner than alone on its fastest grid (the bound reported as avg_jct_bound_s);
    # its time spent waiting covers at least the queue before its first start, and at most its JCT
    for j in jobs:
        assert j["first_start"] - j["submit"] - 1e-9 <= j["waited_s"] <= j["finish"] - j["submit"] + 1e-9
        alone = j["iterations"] * j["batch_size"] / j["best_throughput"]
        assert j["finish"] - j["submit"] >= alone * (1 - 1e-9), j["id"]

    m = compute(res)
    assert m["finished"] == len(trace)
    assert m["avg_jct_s"] >= m["avg_jct_bound_s"] * (1 - 1e-9)
    assert 0 < m["gpu_util"] <= m["gpu_alloc_util"] <= 1 + 1e-9


@pytest.mark.parametrize("policy", ["fcfs", "sia", "arena-greedy"])
def test_deterministic(policy, cluster, estimator):
    trace = trace_for(cluster, estimator, 5)
    a, b = run(cluster, estimator, trace, policy), run(cluster, estimator, trace, policy)
    assert a.jobs == b.jobs
    assert [(d["t"], d["changed"]) for d in a.decisions] == [(d["t"], d["changed"]) for d in b.decisions]


def test_same_trace_same_seed_same_trace(cluster, estimator):
    assert trace_for(cluster, estimator, 9) == trace_for(cluster, estimator, 9)
    assert trace_for(cluster, estimator, 9) != trace_for(cluster, estimator, 10)


@pytest.mark.parametrize("policy", ["fcfs", "gavel", "arena-greedy"])
def test_skipping_quiet_rounds_changes_nothing(policy, cluster, estimator):
    """These policies decide from the jobs and the cluster, not from the clock or remaining work:
    calling them in rounds where nothing happened must give the same schedule as calling them only
    after events. (ElasticFlow's shares and Sia's restart factor do depend on the clock; like the
    originals they re-plan on events.)"""
    trace = trace_for(cluster, estimator, 3)
    events = run(cluster, estimator, trace, policy, replan="events")
    every = run(cluster, estimator, trace, policy, replan="every-tick")
    assert len(every.decisions) > len(events.decisions)
    for a, b in zip(events.job_dicts(), every.job_dicts()):
        assert a["finish"] == pytest.approx(b["finish"], rel=1e-12), a["id"]


@pytest.mark.parametrize("seed", range(10, 16))
def test_arena_greedy_search_paths_stay_feasible(seed, cluster, estimator):
    """A crowded cluster drives Arena's heuristic through consolidation, the modification search
    and preemption; every decision must still pass the simulator's checks and every job finish."""
    trace = generate(cluster, GenOptions(jobs=30, seed=seed, load=3.0, models=MODELS, batch_sizes=(128,),
                                         duration_median_s=1800, burst_mean=4.0), estimator)
    res = run(cluster, estimator, trace, "arena-greedy")
    assert all(j.status == "done" for j in res.jobs)
    assert sum(j.reconfigs for j in res.jobs) > 0


@pytest.mark.parametrize("seed", range(10, 13))
def test_arena_greedy_shortcuts_change_nothing(seed, cluster, estimator, monkeypatch):
    """The upgrades' `fits_released` and the search's sets skipped for gaining no more than the best give
    the schedule that releasing, finding and rolling back, and trying every set, give."""
    from arena_opt.occupancy import Occupancy

    trace = generate(cluster, GenOptions(jobs=30, seed=seed, load=3.0, models=MODELS, batch_sizes=(128,),
                                         duration_median_s=1800, burst_mean=4.0), estimator)
    quiet, asked = [], Occupancy.no_contention.fget
    monkeypatch.setattr(Occupancy, "no_contention", property(lambda occ: quiet.append(asked(occ)) or quiet[-1]))
    fast = run(cluster, estimator, trace, "arena-greedy")
    assert any(quiet)

    def released_find(occ, grid, job_id):
        m = occ.mark()
        found = occ.find(grid, occ.release(job_id)) is not None
        occ.rollback(m)
        return found

    monkeypatch.setattr(Occupancy, "fits_released", released_find)
    monkeypatch.setattr(Occupancy, "no_contention", property(lambda occ: False))
    slow = run(cluster, estimator, trace, "arena-greedy")
    assert fast.jobs == slow.jobs
    assert [(d["t"], d["changed"], d["jobs"]) for d in fast.decisions] == \
        [(d["t"], d["changed"], d["jobs"]) for d in slow.decisions]
