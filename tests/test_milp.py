import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from arena_opt.feasibility import check_decision
from arena_opt.grids import enumerate_grids
from arena_opt.instances import generate_snapshot
from arena_opt.milp.greedy import greedy_select
from arena_opt.milp.options import ArenaOptions
from arena_opt.milp.problem import build_problem
from arena_opt.milp.solve import solve_problem
from arena_opt.perf.estimator import PerfEstimator
from arena_opt.placement import place
from arena_opt.policies.arena import ArenaPolicy

EST = PerfEstimator()  # shared: plans are cached across tests
TINY_MODELS = ["bert-760M", "moe-690M", "wide_resnet-500M", "bert-1.3B"]


def tiny(seed, spec=None, jobs=4):
    spec = spec or {"a100": (2, 4), "a10": (2, 2)}
    return generate_snapshot(spec, jobs, seed=seed, running_fraction=0.6, deadline_fraction=0.5, models=TINY_MODELS)


def all_selections(p):
    choices = [[None, *p.grids_of(j)] for j in range(p.num_jobs)]
    for combo in itertools.product(*choices):
        yield {j: int(k) for j, k in enumerate(combo) if k is not None}


@pytest.mark.parametrize("seed", range(6))
def test_milp_optimum_equals_brute_force(seed):
    snap = tiny(seed)
    opts = ArenaOptions(max_gpus_per_job=4, mip_gap=0.0)
    p = build_problem(snap, enumerate_grids(snap, EST, max_gpus_default=4), opts)
    best = max((p.objective(s) for s in all_selections(p) if p.feasible(s)))
    res = solve_problem(p, time_limit_s=30, mip_gap=0.0, threads=1)
    assert res.selection is not None and p.feasible(res.selection)
    assert res.objective == pytest.approx(best, rel=1e-6, abs=1e-6)
    assert res.bound == pytest.approx(best, rel=1e-5, abs=1e-5)


@pytest.mark.parametrize("seed", range(4))
def test_every_packing_feasible_selection_can_be_placed(seed):
    """The packing constraints are exact in the direction that matters: whatever they admit, placement packs."""
    snap = tiny(seed, spec={"a100": (2, 4), "v100": (1, 8)}, jobs=4)
    p = build_problem(snap, enumerate_grids(snap, EST, max_gpus_default=8), ArenaOptions(max_gpus_per_job=8))
    n = 0
    for sel in all_selections(p):
        if not p.feasible(sel):
            continue
        chosen = {p.job_ids[j]: p.grids[k] for j, k in sel.items()}
        placed = place(snap, chosen)
        for jid, g in chosen.items():
            assert sum(len(v) for v in placed[jid].values()) == g.num_gpus
        n += 1
    assert n > 1


def test_packing_rejects_fragmented_capacity():
    """Two half-free nodes do not make one free node: a type-level GPU sum would accept this."""
    from arena_opt.plan import Plan
    from arena_opt.snapshot import ClusterSnapshot, Job, Node, RunningState

    nodes = [Node(id=f"n{i}", gpu_type="a100", num_gpus=4) for i in range(2)]
    run = lambda nid: RunningState(gpu_type="a100", placement={nid: [0, 1]}, plan=Plan(dp=2))  # noqa: E731
    jobs = [Job(id="r0", model="bert-760M", batch_size=128, total_iterations=100, remaining_iterations=50,
                running=run("n0"), min_gpus=2, max_gpus=2),
            Job(id="r1", model="bert-760M", batch_size=128, total_iterations=100, remaining_iterations=50,
                running=run("n1"), min_gpus=2, max_gpus=2),
            Job(id="new", model="bert-760M", batch_size=128, total_iterations=100, remaining_iterations=100,
                min_gpus=4, max_gpus=4)]
    snap = ClusterSnapshot(nodes=nodes, jobs=jobs)
    p = build_problem(snap, enumerate_grids(snap, EST), ArenaOptions())
    keep = {j: int(k) for j in range(2) for k in p.grids_of(j) if p.current[k]}
    (k_new,) = p.grids_of(2)
    sel = {**keep, 2: int(k_new)}
    assert sum(p.units[k] for k in sel.values() if not p.current[k]) <= 4  # GPU totals would fit
    assert not p.feasible(sel)
    with pytest.raises(Exception):
        place(snap, {p.job_ids[j]: p.grids[k] for j, k in sel.items()})
    res = solve_problem(p, time_limit_s=10, mip_gap=0.0, threads=1)
    assert p.feasible(res.selection)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), a100=st.integers(0, 4), a40=st.integers(0, 6), v100=st.integers(0, 2),
       jobs=st.integers(1, 14), shards=st.sampled_from([1, 2, 3]), cap=st.sampled_from([None, 0, 2]))
def test_random_decisions_are_feasible(seed, a100, a40, v100, jobs, shards, cap):
    spec = {k: v for k, v in {"a100": (a100, 4), "a40": (a40, 2), "v100": (v100, 8)}.items() if v[0] > 0}
    if not spec:
        spec = {"a10": (1, 2)}
    snap = generate_snapshot(spec, jobs, seed=seed, running_fraction=0.5, models=TINY_MODELS)
    pol = ArenaPolicy(ArenaOptions(shards=shards, max_reconfigs_per_round=cap, time_limit_s=5), estimator=EST)
    d = pol.decide(snap)
    check_decision(snap, d)  # capacity, one grid per job, placement = counts, memory, whole nodes
    assert len(d.jobs) == len(snap.jobs)
    if cap is not None:
        moved = sum(1 for jd in d.jobs if jd.action in ("reshape", "migrate", "preempt"))
        assert moved <= cap or d.stats.shards > 1 and moved <= cap + shards
    if not d.stats.fallback and d.stats.shards == 1:
        assert d.stats.objective is not None and d.stats.bound is not None
        assert d.stats.objective <= d.stats.bound + 1e-6 * max(1.0, abs(d.stats.bound))


@pytest.mark.parametrize("seed", range(3))
def test_greedy_fallback_is_feasible(seed):
    snap = tiny(seed, jobs=8)
    p = build_problem(snap, enumerate_grids(snap, EST), ArenaOptions())
    sel = greedy_select(p)
    assert p.feasible(sel)
    place(snap, {p.job_ids[j]: p.grids[k] for j, k in sel.items()})


def test_sharded_close_to_monolithic():
    # without deadlines (nor the makespan guard's deadline-like needs): a shard that holds a deadline
    # job but too few nodes pays its full penalty, which says nothing about how well shards pack
    snap = generate_snapshot({"a100": (12, 4), "a40": (16, 2), "v100": (3, 8)}, 48, seed=5, deadline_fraction=0,
                             models=TINY_MODELS)
    mono = ArenaPolicy(ArenaOptions(mip_gap=0.0, makespan_guard=False), estimator=EST).decide(snap)
    sharded = ArenaPolicy(ArenaOptions(shards=3, makespan_guard=False), estimator=EST).decide(snap)
    check_decision(snap, sharded)
    assert sharded.stats.shards == 3 and sharded.stats.bound is None
    assert sharded.stats.objective <= mono.stats.objective + 1e-6
    assert sharded.stats.objective >= 0.9 * mono.stats.objective


def test_running_job_kept_in_place_when_nothing_changes():
    snap = tiny(1, jobs=3)
    d = ArenaPolicy(estimator=EST).decide(snap)
    jobs = {j.id: j for j in snap.jobs}
    for jd in d.jobs:
        if jd.action == "keep":
            assert jd.placement == {k: sorted(v) for k, v in jobs[jd.job_id].running.placement.items()}


def test_deadline_job_gets_throughput_it_needs():
    snap = generate_snapshot({"a100": (2, 4)}, 3, seed=3, running_fraction=0.0, deadline_fraction=0.0,
                             models=["bert-760M"])
    est = EST
    # give job 0 a deadline that needs more than one GPU's speed
    j0 = snap.jobs[0]
    grids = enumerate_grids(snap, est)[j0.id]
    one = max(g.throughput for g in grids if g.num_gpus == 1)
    best = max(g.throughput for g in grids)
    need = (one + best) / 2
    deadline = snap.time + j0.remaining_iterations * j0.batch_size / need
    snap = snap.model_copy(update={"jobs": [j0.model_copy(update={"deadline": deadline}), *snap.jobs[1:]]})
    # the deadline is soft: weighted heavily, the round must give the job the speed it needs
    d = ArenaPolicy(ArenaOptions(deadline_weight=1000.0), estimator=est).decide(snap)
    jd = d.by_job()[j0.id]
    assert jd.runs and jd.est_throughput >= need * (1 - 1e-9)


def test_solver_without_incumbent_falls_back_to_flagged_greedy(monkeypatch):
    import arena_opt.policies.arena as arena_mod
    from arena_opt.milp.solve import SolveResult

    monkeypatch.setattr(arena_mod, "solve_problem",
                        lambda p, **kw: SolveResult(None, "maxTimeLimit", None, None, None, 0.0, 0.0))
    snap = tiny(2, jobs=6)
    d = ArenaPolicy(estimator=EST).decide(snap)
    check_decision(snap, d)
    assert d.stats.fallback and "greedy" in d.stats.note and d.stats.objective is not None
    assert any(j.runs for j in d.jobs)


def test_inline_architecture_and_catalog_override():
    from arena_opt.gpus import BUILTIN_GPUS
    from models.catalog import Arch

    snap = tiny(4, jobs=2)
    arch = Arch(name="my-gpt", family="gpt", num_layers=6, hidden=512, heads=8, vocab=32000, seq_len=512)
    job = snap.jobs[0].model_copy(update={"model": arch, "running": None,
                                          "remaining_iterations": float(snap.jobs[0].total_iterations)})
    slow = BUILTIN_GPUS["a10"].model_copy(update={"peak_tflops": 1.0})
    snap2 = snap.model_validate({**snap.model_dump(), "jobs": [job.model_dump(), snap.jobs[1].model_dump()],
                                 "gpu_catalog": {"a10": slow.model_dump()}})
    est = PerfEstimator()
    grids = enumerate_grids(snap2, est)[job.id]
    assert grids, "an inline architecture gets grids"
    fast = {g.shape.gpu_type: g.throughput for g in enumerate_grids(snap, est)[snap.jobs[1].id] if g.num_gpus == 1}
    slowed = {g.shape.gpu_type: g.throughput for g in enumerate_grids(snap2, est)[snap.jobs[1].id] if g.num_gpus == 1}
    assert slowed["a10"] < fast["a10"]  # the override reached the estimate
    check_decision(snap2, ArenaPolicy(estimator=est).decide(snap2))


def test_candidate_pruning_keeps_running_jobs_and_explains_the_rest():
    snap = generate_snapshot({"a100": (2, 4), "a40": (2, 2)}, 30, seed=11, models=TINY_MODELS, deadline_fraction=0)
    full = ArenaPolicy(ArenaOptions(candidate_factor=None), estimator=EST).decide(snap)
    pruned = ArenaPolicy(ArenaOptions(candidate_factor=1.0), estimator=EST).decide(snap)
    check_decision(snap, pruned)
    assert "left out" in pruned.stats.note
    queued = [j for j in pruned.jobs if j.reason and j.reason.startswith("queued")]
    assert queued
    running = {j.id for j in snap.jobs if j.running}
    assert not running & {j.job_id for j in queued}
    assert pruned.stats.objective <= full.stats.objective + 1e-6


@pytest.mark.parametrize("seed", range(4))
def test_pyomo_and_highspy_backends_agree(seed):
    snap = tiny(20 + seed, jobs=6)
    p = build_problem(snap, enumerate_grids(snap, EST), ArenaOptions())
    a = solve_problem(p, time_limit_s=20, mip_gap=0.0, threads=1, backend="pyomo")
    b = solve_problem(p, time_limit_s=20, mip_gap=0.0, threads=1, backend="highspy")
    assert a.status == b.status == "optimal"
    assert a.objective == pytest.approx(b.objective, rel=1e-7, abs=1e-7)
    assert p.feasible(b.selection)
    assert b.bound == pytest.approx(b.objective, rel=1e-6, abs=1e-6)
    # a greedy first incumbent changes where the search starts, not the optimum it proves
    start = greedy_select(p)
    c = solve_problem(p, time_limit_s=20, mip_gap=0.0, threads=1, backend="highspy", start=start)
    assert c.status == "optimal" and p.feasible(c.selection)
    assert c.objective == pytest.approx(a.objective, rel=1e-7, abs=1e-7)
    assert c.objective >= p.objective(start) - 1e-9


def test_critical_jobs_hand_computed():
    from arena_opt.milp.problem import critical_jobs

    # job 0: 1,000 samples, fastest grid 2 samples/s on 2 GPUs, 1 GPU-s per sample at best; job 1: 100
    # samples, same grids. On 2 GPUs the drain takes (1000 + 100) / 2 = 550 s; job 0 alone needs 500 s
    job_of = np.array([0, 0, 1, 1])
    tput = np.array([1.0, 2.0, 1.0, 2.0])
    gpus = np.array([1.0, 2.0, 1.0, 2.0])
    best = np.array([2.0, 2.0])
    assert critical_jobs(job_of, tput, gpus, np.array([1000.0, 100.0]), best, 2, 0.0).tolist() == []
    # on 4 GPUs the drain halves (275 s) and job 0's own 500 s sets the makespan
    assert critical_jobs(job_of, tput, gpus, np.array([1000.0, 100.0]), best, 4, 0.0).tolist() == [0]
    # job 1 (own 400 s) has 100 s of float: critical only when a round is longer than that
    assert critical_jobs(job_of, tput, gpus, np.array([1000.0, 800.0]), best, 100, 99.0).tolist() == [0]
    assert critical_jobs(job_of, tput, gpus, np.array([1000.0, 800.0]), best, 100, 100.0).tolist() == [0, 1]
    # a job with no work left is never critical
    assert critical_jobs(job_of, tput, gpus, np.array([0.0, 100.0]), best, 1000, 0.0).tolist() == [1]


def test_makespan_guard_keeps_the_critical_job_at_full_speed():
    snap = generate_snapshot({"a100": (2, 4)}, 4, seed=3, running_fraction=0.0, deadline_fraction=0.0,
                             models=["bert-760M"])
    jobs = [j.model_copy(update={"remaining_iterations": j.remaining_iterations * (200 if i == 0 else 1),
                                 "total_iterations": j.total_iterations * (200 if i == 0 else 1)})
            for i, j in enumerate(snap.jobs)]
    snap = snap.model_copy(update={"jobs": jobs})
    long_id = jobs[0].id
    best = max(g.throughput for g in enumerate_grids(snap, EST)[long_id])
    off = ArenaPolicy(ArenaOptions(makespan_guard=False, mip_gap=0.0), estimator=EST).decide(snap)
    # weighted like deadlines (the default weighs it as one most valuable job: here its fastest grid
    # would take the whole cluster from three short jobs, which that weight does not buy)
    opts = ArenaOptions(mip_gap=0.0, makespan_weight=10.0)
    p = ArenaPolicy(opts, estimator=EST).problem(snap)
    assert np.flatnonzero(p.guard_need > 0).tolist() == [p.job_ids.index(long_id)]
    on = ArenaPolicy(opts, estimator=EST).decide(snap)
    check_decision(snap, on)
    # shortest-first weighting alone starves the long job of GPUs; the guard gives it its fastest grid
    assert (off.by_job()[long_id].est_throughput or 0.0) < best * (1 - 1e-6)
    assert on.by_job()[long_id].est_throughput >= best * (1 - 1e-9)


def test_aging_follows_a_job_that_starts():
    snap = generate_snapshot({"a100": (2, 4)}, 1, seed=4, running_fraction=1.0, deadline_fraction=0.0,
                             models=["bert-760M"])
    job = snap.jobs[0]
    assert job.running is not None
    opts = ArenaOptions(aging_per_hour=0.25)

    def current_value(j):
        s = snap.model_copy(update={"jobs": [j]})
        p = build_problem(s, enumerate_grids(s, EST), opts)
        return float(p.value[p.current][0])

    # 2 h of waiting before it started: worth 1 + 0.25 * 2 times as much while it runs
    assert current_value(job.model_copy(update={"waited_s": 7200.0})) == pytest.approx(1.5 * current_value(job))


def shared_nodes(seed: int, cap: int | None = 1):
    """Running jobs that share nodes (node_capacity rows), one alone on a node, a deadline and waiting jobs."""
    from arena_opt.plan import Plan
    from arena_opt.snapshot import ClusterSnapshot, Job, Node, RunningState

    rng = np.random.default_rng(seed)
    nodes = [Node(id=f"n{i}", gpu_type="a100", num_gpus=4) for i in range(2)] + [Node(id="m0", gpu_type="a40", num_gpus=2)]
    held = {"r0": ("n0", [0]), "r1": ("n0", [1, 2]), "r2": ("n1", [0, 1]), "r3": ("m0", [0]), "r4": ("m0", [1])}
    jobs = []
    for jid, (nid, gs) in held.items():
        total = int(rng.integers(200, 2000))
        jobs.append(Job(id=jid, model=TINY_MODELS[int(rng.integers(len(TINY_MODELS)))], batch_size=64,
                        total_iterations=total, remaining_iterations=float(total // 2), min_gpus=1, max_gpus=2,
                        running=RunningState(gpu_type="a40" if nid == "m0" else "a100", placement={nid: gs},
                                             plan=Plan(dp=len(gs)))))
    jobs.append(Job(id="w0", model="bert-760M", batch_size=64, total_iterations=500, remaining_iterations=500,
                    min_gpus=2, max_gpus=4, submit_time=0.0, deadline=3600.0 * float(rng.uniform(0.5, 4))))
    snap = ClusterSnapshot(nodes=nodes, jobs=jobs, time=600.0)
    return snap, ArenaOptions(max_gpus_per_job=4, mip_gap=0.0, max_reconfigs_per_round=cap)


@pytest.mark.parametrize("seed", range(3))
def test_milp_optimum_equals_brute_force_on_shared_nodes(seed):
    snap, opts = shared_nodes(seed, cap=[None, 1, 2][seed])
    p = build_problem(snap, enumerate_grids(snap, EST, max_gpus_default=4), opts)
    assert any(len(u) > 1 for pi in p.pools.values() for u in pi.occupied.values())
    best = max((p.objective(s) for s in all_selections(p) if p.feasible(s)))
    for backend in ("pyomo", "highspy"):
        res = solve_problem(p, time_limit_s=30, mip_gap=0.0, threads=1, backend=backend)
        assert res.selection is not None and p.feasible(res.selection)
        assert res.objective == pytest.approx(best, rel=1e-6, abs=1e-6)


def test_milp_arrays_solve_as_the_highs_lp():
    """`solve_linear` hands HiGHS `highs_arrays` (not to_highs's HighsLp): HiGHS then holds the same integrality
    per column as to_highs's list, and solves to the same status, objective and column values, with and without
    a start."""
    from arena_opt.milp.linear import highs_arrays, to_highs
    from arena_opt.milp.model import level1_model, start_vector
    from arena_opt.milp.solve import _highs, run_highs, solve_linear

    snap, opts = shared_nodes(1)
    p = build_problem(snap, enumerate_grids(snap, EST, max_gpus_default=4), opts)
    lm = level1_model(p)
    ints = lm.kinds() != "C"
    assert ints.any() and not ints.all()  # binaries and continuous columns both
    lp = to_highs(lm)
    assert [int(v) for v in lp.integrality_] == highs_arrays(lm).integrality.tolist() == ints.astype(int).tolist()
    start = start_vector(lm, p, greedy_select(p))
    for x0 in (None, start):
        word, info, want = run_highs(lp, time_limit_s=30, mip_gap=0.0, threads=1, start=x0)
        held = [int(v) for v in _highs().getLp().integrality_]
        res = solve_linear(lm, time_limit_s=30, mip_gap=0.0, threads=1, start=x0)
        assert [int(v) for v in _highs().getLp().integrality_] == held == ints.astype(int).tolist()
        assert word == "Optimal" and res.status == "optimal"
        assert res.objective == info.objective_function_value and np.array_equal(res.x, want)


def test_constraint_families_named_alike_in_both_emissions():
    """Every family is one named Pyomo Constraint and one named row range of the highspy arrays,
    with the same rows (same coefficients on the same named variables, same bounds)."""
    from pyomo.repn import generate_standard_repn

    from arena_opt.milp.linear import to_highs, to_pyomo
    from arena_opt.milp.model import level1_model

    snap, opts = shared_nodes(0)
    opts = opts.model_copy(update={"makespan_weight": 1.0})
    p = build_problem(snap, enumerate_grids(snap, EST, max_gpus_default=4), opts)
    p.guard_need[0] = p.throughput[p.grids_of(0)].max()  # one makespan-guard row, whatever the instance
    p.guard_weight[0] = 1.0
    lm = level1_model(p)
    want = {"one_grid_per_job", "node_capacity", "pool_packing", "deadline", "makespan_guard", "reconfiguration_cap"}
    assert {f.name for f in lm.families} == want and all(f.num_rows for f in lm.families)
    m, lp = to_pyomo(lm), to_highs(lm, names=True)
    ranges = lm.row_ranges()
    assert sum(len(r) for r in ranges.values()) == lp.num_row_ == len(lp.row_names_)
    a = lp.a_matrix_
    cols = list(lp.col_names_)
    for f in lm.families:
        con = getattr(m, f.name)
        assert con.ctype.__name__ == "Constraint" and len(con) == f.num_rows == len(ranges[f.name])
        for r, c in zip(ranges[f.name], con.values()):
            assert lp.row_names_[r] == c.name
            repn = generate_standard_repn(c.body)
            py = {v.name: coef for v, coef in zip(repn.linear_vars, repn.linear_coefs)}
            hs = {cols[i]: v for i, v in zip(a.index_[a.start_[r]:a.start_[r + 1]], a.value_[a.start_[r]:a.start_[r + 1]])}
            assert py == hs
            assert (c.lower if c.has_lb() else -np.inf) == lp.row_lower_[r]
            assert (c.upper if c.has_ub() else np.inf) == lp.row_upper_[r]


@pytest.mark.parametrize("seed", range(3))
def test_start_vector_satisfies_every_row(seed):
    """The greedy start HiGHS gets up front sets every column (slots, slacks too) and satisfies every row,
    so HiGHS takes it as an incumbent as it is; its objective is the problem's objective of the selection."""
    from arena_opt.milp.model import level1_model, model_constant, start_vector

    snap, opts = shared_nodes(seed, cap=[None, 1, 2][seed])
    opts = opts.model_copy(update={"makespan_weight": 1.0})
    p = build_problem(snap, enumerate_grids(snap, EST, max_gpus_default=4), opts)
    p.guard_need[0] = p.throughput[p.grids_of(0)].max() * 2  # a shortfall, whatever the selection
    p.guard_weight[0] = 1.0
    sel = greedy_select(p)
    lm = level1_model(p)
    v = start_vector(lm, p, sel)
    starts, idx, val = lm.csr()
    rows = np.repeat(np.arange(lm.num_rows), np.diff(starts))
    ax = np.bincount(rows, weights=val * v[idx], minlength=lm.num_rows)
    lo, hi = lm.row_bounds()
    assert np.all(ax >= lo - 1e-9) and np.all(ax <= hi + 1e-9)
    assert float(lm.cost() @ v) + model_constant(p) == pytest.approx(p.objective(sel), rel=1e-9, abs=1e-9)


def test_deadline_already_passed_returns_the_start():
    """At a deadline already passed HiGHS runs for at most 10 ms: the greedy start comes back (or better)."""
    import time

    snap = tiny(5, jobs=6)
    p = build_problem(snap, enumerate_grids(snap, EST), ArenaOptions())
    start = greedy_select(p)
    r = solve_problem(p, time_limit_s=10, mip_gap=0.0, threads=1, backend="highspy", start=start,
                      deadline=time.perf_counter() - 1)
    assert r.selection is not None and p.feasible(r.selection)
    assert r.objective >= p.objective(start) - 1e-9


@pytest.mark.parametrize("incumbent", ["none", "worse"])
def test_a_solve_never_returns_less_than_its_feasible_start(monkeypatch, incumbent):
    """A run that stops at its limit with no incumbent, or with one worse than the start (HiGHS had not
    taken it yet, or the pyomo backend, which does not hand it over), still returns at least the start."""
    import arena_opt.milp.solve as solve_mod

    snap = tiny(5, jobs=6)
    p = build_problem(snap, enumerate_grids(snap, EST), ArenaOptions())
    start = greedy_select(p)
    assert p.objective(start) > p.objective({})  # the empty selection is worse: the case can fail
    real = solve_mod.solve_linear

    def stopped(lm, **kw):
        r = real(lm, **kw)
        r.status = "time_limit"
        r.x = None if incumbent == "none" else solve_mod.start_vector(lm, p, {})
        return r

    monkeypatch.setattr(solve_mod, "solve_linear", stopped)
    for backend in ("highspy", "pyomo"):
        r = solve_problem(p, time_limit_s=10, mip_gap=0.0, threads=1, backend=backend, start=start)
        assert r.status == "time_limit" and not r.abandoned
        assert r.selection == start and r.objective == p.objective(start)
        assert p.feasible(r.selection)


def test_pyomo_backend_returns_at_least_its_start():
    """The pyomo backend ignores the start as an incumbent; at a limit of 10 ms its result is still at least
    the improved greedy start."""
    import time

    from arena_opt.milp.local import improve

    snap = generate_snapshot({"a100": (8, 4), "a10": (8, 2)}, 40, seed=3, running_fraction=0.3)
    p = build_problem(snap, enumerate_grids(snap, EST), ArenaOptions())
    start = improve(p, greedy_select(p))
    r = solve_problem(p, time_limit_s=10, mip_gap=0.0, threads=1, backend="pyomo", start=start,
                      deadline=time.perf_counter() - 1)
    assert r.selection is not None and p.feasible(r.selection)
    assert r.objective >= p.objective(start) - 1e-9


def test_an_abandoned_run_hands_back_its_start(monkeypatch):
    """A run left behind at the deadline (a loaded host: HiGHS not done within the grace) still returns
    the feasible start it was given, marked abandoned so the policy reports HiGHS added nothing."""
    import time

    import arena_opt.milp.solve as solve_mod

    snap = tiny(5, jobs=6)
    p = build_problem(snap, enumerate_grids(snap, EST), ArenaOptions())
    start = greedy_select(p)
    monkeypatch.setattr(solve_mod, "_run_until", lambda h, deadline: False)
    r = solve_problem(p, time_limit_s=10, mip_gap=0.0, threads=1, backend="highspy", start=start,
                      deadline=time.perf_counter() + 5)
    assert r.abandoned and r.selection == start and r.objective == p.objective(start)
    assert r.bound is None and r.gap is None
    r = solve_problem(p, time_limit_s=10, mip_gap=0.0, threads=1, backend="highspy", deadline=time.perf_counter() + 5)
    assert r.abandoned and r.selection is None  # nothing known: the policy's fallback decides


def test_a_run_past_the_deadline_is_abandoned(monkeypatch):
    """A HiGHS run that ignores its time limit is left behind at the deadline, and the next solve gets a
    new instance (the abandoned one is still busy)."""
    import threading
    import time

    import arena_opt.milp.solve as solve_mod

    release = threading.Event()

    class Stuck:
        def run(self):
            release.wait(5)

        def cancelSolve(self):
            pass

    stuck = Stuck()
    monkeypatch.setattr(solve_mod, "_HIGHS", stuck)
    t0 = time.perf_counter()
    assert solve_mod._run_until(stuck, t0 + 0.05) is False
    assert time.perf_counter() - t0 < 1.0 and solve_mod._HIGHS is None
    release.set()
    assert solve_mod._run_until(stuck, time.perf_counter() + 1) is True


def test_arena_decision_leaves_gc_as_it_found_it():
    """The arena call runs without cyclic GC (its long-lived grids and plans are walked by every full pass)
    and gives GC back as it was: on to a caller that had it on, off to one that had it off."""
    import gc

    snap = tiny(3, jobs=5)
    was = gc.isenabled()
    try:
        for state in (True, False):
            (gc.enable if state else gc.disable)()
            d = ArenaPolicy(ArenaOptions(max_gpus_per_job=4), estimator=EST).decide(snap)
            check_decision(snap, d)
            assert gc.isenabled() is state
    finally:
        (gc.enable if was else gc.disable)()
