"""The LP lower bound on average JCT: below every simulated policy, below the exhaustive optimum of tiny
instances, above the contention-free bound; its reductions and solve methods agree."""

import json
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from arena_opt.bound import BoundGrid, BoundInstance, BoundJob, BoundOptions, build_instance, frontier, solve
from arena_opt.bound.exact import TinyInstance, TinyJob, optimum
from arena_opt.bound.lp import _lagrangian, build
from arena_opt.cli import main
from arena_opt.perf.estimator import PerfEstimator
from arena_opt.policies import REGISTRY
from arena_opt.reconfig import PRESETS
from arena_opt.cluster import load_cluster
from arena_opt.sim import SimOptions, simulate
from arena_opt.sim.gen import GenOptions, generate
from arena_opt.metrics import compute

FULL = BoundOptions(method="full", solver="simplex")


@st.composite
def tiny_instances(draw):
    gpus = draw(st.integers(2, 4))
    jobs = []
    for _ in range(draw(st.integers(2, 4))):
        counts = sorted(set(draw(st.lists(st.integers(1, gpus), min_size=1, max_size=gpus))))
        steps = draw(st.lists(st.integers(1, 3), min_size=len(counts), max_size=len(counts)))
        speed = tuple(zip(counts, np.cumsum(steps).tolist()))  # speeds rise with GPUs
        jobs.append(TinyJob(draw(st.integers(0, 3)), draw(st.integers(1, 6)), speed))
    if all(j.arrival > 0 for j in jobs):
        jobs[0] = TinyJob(0, jobs[0].work, jobs[0].speed)
    return TinyInstance(gpus, 60.0, tuple(jobs))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tiny_instances())
def test_bound_below_exhaustive_optimum(ti):
    opt = optimum(ti)
    inst = ti.bound_instance()
    full = solve(inst, FULL)
    cg = solve(inst, BoundOptions())
    assert full.status == cg.status == "optimal"
    assert full.avg_jct_bound_s <= opt * (1 + 1e-9) + 1e-6
    assert full.avg_jct_bound_s >= full.contention_free_s - 1e-6
    # the duals' Lagrangian value is the LP optimum, and column generation reaches the same LP
    assert full.avg_jct_bound_s == pytest.approx(full.lp_objective_s, rel=1e-6, abs=1e-6)
    assert cg.avg_jct_bound_s == pytest.approx(full.avg_jct_bound_s, rel=1e-6, abs=1e-6)


def test_contention_shows_in_the_bound():
    # two jobs, one GPU each run time 600 s, one GPU: one must wait for the other (average >= 900 s)
    ti = TinyInstance(1, 60.0, (TinyJob(0, 10, ((1, 1),)), TinyJob(0, 10, ((1, 1),))))
    res = solve(ti.bound_instance(), FULL)
    assert res.contention_free_s == pytest.approx(600.0)
    assert optimum(ti) == pytest.approx(900.0)
    assert 600.0 + 1.0 < res.avg_jct_bound_s <= 900.0 + 1e-6


def test_lagrangian_is_below_the_lp_for_any_duals():
    ti = TinyInstance(3, 60.0, (TinyJob(0, 5, ((1, 1), (2, 2), (3, 2))), TinyJob(1, 4, ((1, 2),)),
                                TinyJob(1, 6, ((2, 1), (3, 3)))))
    inst = ti.bound_instance()
    res = solve(inst, FULL)
    m = build(inst, FULL, int(res.horizon_s / inst.interval_s))
    rng = np.random.default_rng(0)
    opt_cells = (res.lp_objective_s - (inst.origin - np.mean([j.submit for j in inst.jobs]))) / inst.interval_s
    for _ in range(50):
        lag = _lagrangian(m, rng.normal(scale=0.5, size=len(m.row_lo)))
        assert lag <= opt_cells + 1e-9


def test_frontier_keeps_the_hull():
    g = [BoundGrid("a", 1, 100.0), BoundGrid("a", 2, 60.0), BoundGrid("a", 3, 59.0), BoundGrid("a", 4, 30.0),
         BoundGrid("a", 8, 40.0), BoundGrid("b", 2, 50.0)]
    pareto = frontier(g, hull=False)
    assert [(x.gpu_type, x.gpus) for x in pareto] == [("a", 1), ("a", 2), ("a", 3), ("a", 4), ("b", 2)]
    # speed 1/100, 1/60, 1/59, 1/30 at 1..4 GPUs: 2 and 3 GPUs lie under the chord from 1 to 4
    assert [(x.gpu_type, x.gpus) for x in frontier(g)] == [("a", 1), ("a", 4), ("b", 2)]


def test_hull_reduction_stays_below_the_optimum():
    # speeds 1, 1.2, 3 units/tick at 1, 2, 3 GPUs: the 2-GPU grid is off the hull
    ti = TinyInstance(3, 60.0, (TinyJob(0, 6, ((1, 1), (2, 2), (3, 3))), TinyJob(0, 3, ((1, 1), (2, 1), (3, 2))),
                                TinyJob(1, 4, ((1, 1), (2, 3), (3, 3)))))
    inst = ti.bound_instance()
    hull = BoundInstance([BoundJob(j.id, j.submit, j.release, tuple(frontier(list(j.grids)))) for j in inst.jobs],
                         inst.capacity, inst.origin, inst.interval_s, [])
    opt = optimum(ti)
    assert solve(hull, FULL).avg_jct_bound_s <= solve(inst, FULL).avg_jct_bound_s + 1e-6 <= opt + 2e-6


# ---- against the simulator ---------------------------------------------------------------------------------
MODELS = ("gpt-350M", "bert-760M", "moe-690M")


@pytest.fixture(scope="module")
def setup():
    """A small two-type cluster and one analytical truth (its plan cache shared by every example)."""
    return load_cluster("a100:2x4,a40:2x2"), PerfEstimator(table_mode="off")


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10_000), jobs=st.integers(2, 8), load=st.floats(0.5, 2.5),
       interval=st.sampled_from([60.0, 300.0]))
def test_bound_below_every_policy(seed, jobs, load, interval, setup):
    cluster, estimator = setup
    trace = generate(cluster, GenOptions(jobs=jobs, seed=seed, load=load, models=MODELS, batch_sizes=(128,),
                                         duration_median_s=1200, duration_max_s=4 * 3600), estimator)
    inst = build_instance([t.to_job() for t in trace], cluster, estimator, interval_s=interval,
                          reconfig=[PRESETS["checkpoint"]])
    res = solve(inst, BoundOptions(epsilon=0.5))
    assert res.status == "optimal"
    for policy in REGISTRY:
        sim = simulate(trace, cluster, policy, truth=estimator, estimate=estimator,
                       options=SimOptions(interval_s=interval))
        m = compute(sim)
        assert m["finished"] == len(inst.jobs), policy
        assert res.avg_jct_bound_s <= m["avg_jct_s"] * (1 + 1e-9), policy
        # every job alone on its fastest grid (of the grids the policies enumerate) from submission
        assert res.avg_jct_bound_s >= m["avg_jct_bound_s"] - 1e-6, policy


def test_release_waits_for_the_first_tick_and_the_restart():
    cluster = load_cluster("a100:1x4")
    trace = generate(cluster, GenOptions(jobs=3, seed=3, models=MODELS, batch_sizes=(128,)), None)
    est = PerfEstimator(table_mode="off")
    inst = build_instance([t.to_job() for t in trace], cluster, est, interval_s=300.0,
                          reconfig=[PRESETS["checkpoint"], PRESETS["arena-artifact"]])
    origin = min(t.submit_time for t in trace)
    for j in inst.jobs:
        tick = origin + math.ceil((j.submit - origin) / 300.0 - 1e-9) * 300.0
        # arena-artifact: 10 s per GPU (the fastest way in is one GPU), below checkpoint's 30 s restart
        assert j.release == pytest.approx(max(tick, j.submit) + 10.0)


def test_cli_bound(tmp_path, capsys):
    out = tmp_path / "bound.json"
    rc = main(["bound", "--trace", "instances/traces/philly-like-small.jsonl", "--cluster",
               "instances/clusters/small.json", "--limit-jobs", "12", "-o", str(out)])
    assert rc == 0
    rec = json.loads(out.read_text())
    assert rec["status"] == "optimal" and rec["jobs"] == 12
    assert rec["contention_free_s"] - 1e-6 <= rec["avg_jct_bound_s"] <= rec["lp_objective_s"] + 1e-6
    assert "average JCT >=" in capsys.readouterr().out


@pytest.mark.parametrize("args, word", [(["--epsilon", "2"], "--epsilon"), (["--rounds", "3"], "--rounds"),
                                        (["--trace", "nope.jsonl"], "nope.jsonl")])
def test_cli_bound_bad_input(args, word, capsys):
    base = {"--trace": "instances/traces/philly-like-small.jsonl", "--cluster": "instances/clusters/small.json"}
    for k, v in zip(args[::2], args[1::2]):
        base[k] = v
    rc = main(["bound", *[x for kv in base.items() for x in kv]])
    assert rc == 2
    assert word in capsys.readouterr().err


@pytest.mark.shared_data
def test_philly_grids_cover_the_policies_grids(arena_data):
    """The bound's grids on Arena's setup include every grid the policies can pick: its fastest run time per
    job is at most the contention-free one the simulator reports, and equal on this table."""
    from arena_opt.grids import GridCatalog
    from arena_opt.sim.config import RunConfig, load_inputs

    cfg = RunConfig(trace=str(arena_data / "traces" / "simulate_trace_philly.csv"),
                    cluster=str(arena_data / "cluster_spec_derived.json"),
                    perf_table=str(arena_data / "prof_records.csv"), iter_scale=5, limit_jobs=200)
    trace, cluster, truth, _ = load_inputs(cfg)
    inst = build_instance([t.to_job() for t in trace], cluster, truth, interval_s=300.0,
                          reconfig=[PRESETS["arena-artifact"]])
    cache = GridCatalog.of(truth)
    by_id = {t.id: t for t in trace}
    for j in inst.jobs:
        tj = by_id[j.id]
        best = max(g.throughput for g in cache.options(tj.to_job(), cluster).values())
        assert j.p_min == pytest.approx(tj.iterations * tj.batch_size / best, rel=1e-9)


def test_cli_bench_reports_the_bound(tmp_path):
    rc = main(["bench", "--trace", "instances/traces/philly-like-small.jsonl", "--cluster",
               "instances/clusters/small.json", "--policies", "fcfs,sia", "--limit-jobs", "12", "-o", str(tmp_path),
               "--quiet"])
    assert rc == 0
    bound = json.loads((tmp_path / "bound.json").read_text())["avg_jct_bound_s"]
    table = (tmp_path / "results.md").read_text()
    assert "avg JCT / LP bound" in table
    assert (tmp_path / "jct_over_bound.png").stat().st_size > 0
    ratios = [float(row.split("|")[4]) for row in table.splitlines()[2:]]
    assert len(ratios) == 2 and all(r >= 1.0 for r in ratios) and bound > 0


def test_share_knapsack_matches_a_greedy_by_hand():
    from arena_opt.bound.lp import _share_knapsack

    rng = np.random.default_rng(1)
    for _ in range(20):
        n = int(rng.integers(1, 30))
        e, cap, job = rng.normal(size=n), rng.uniform(0, 0.8, size=n), rng.integers(0, 4, size=n)
        want = 0.0
        for j in set(job.tolist()):
            left = 1.0
            for i in sorted(np.flatnonzero((job == j) & (e < 0)), key=lambda i: e[i]):
                take = min(left, cap[i])
                want += e[i] * take
                left -= take
        assert _share_knapsack(e, cap, job) == pytest.approx(want, abs=1e-12)


def test_coarse_pass_first_and_the_best_valid_bound_kept():
    ti = TinyInstance(3, 60.0, (TinyJob(0, 5, ((1, 1), (2, 2), (3, 2))), TinyJob(1, 4, ((1, 2),)),
                                TinyJob(1, 6, ((2, 1), (3, 3))), TinyJob(2, 3, ((1, 1), (3, 2)))))
    inst = ti.bound_instance()
    res = solve(inst, BoundOptions(epsilon=0.25, solver="simplex"))
    assert [p["epsilon"] for p in res.passes][:2] == [1.0, 0.25]
    assert res.avg_jct_bound_s == pytest.approx(max(p["bound_s"] for p in res.passes), abs=1e-9)
    assert res.avg_jct_bound_s <= optimum(ti) * (1 + 1e-9) + 1e-6
    alone = solve(inst, BoundOptions(epsilon=0.25, solver="simplex", first_epsilon=None))
    assert [p["epsilon"] for p in alone.passes] == [0.25] * len(alone.passes)
