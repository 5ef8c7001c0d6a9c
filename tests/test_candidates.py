"""The round's candidate filter (milp/candidates.py) and the grid lists waiting jobs of one workload share."""

import itertools
from dataclasses import replace

import numpy as np
import pytest

from arena_opt.grids import GridCatalog
from arena_opt.instances import generate_snapshot
from arena_opt.milp.candidates import candidates, problem_ranking, round_problem, workload_ranking
from arena_opt.milp.options import ArenaOptions
from arena_opt.milp.problem import GridBlocks, build_problem
from arena_opt.milp.shards import restrict
from arena_opt.milp.solve import solve_problem
from arena_opt.perf.estimator import PerfEstimator
from arena_opt.placement import place
from arena_opt.snapshot import ClusterSnapshot

EST = PerfEstimator()
MODELS = ["bert-760M", "moe-690M", "wide_resnet-500M", "bert-1.3B"]
ARRAYS = ["job_of", "value", "units", "current", "throughput", "running", "preempt_penalty", "deadline_need",
          "deadline_weight", "guard_need", "guard_weight"]


def crowded(seed: int, jobs: int = 60, **kw) -> ClusterSnapshot:
    """More waiting work than the cluster holds: running jobs, deadlines, and waiting jobs that resume from a
    checkpoint (preempted ones: partly done, not running)."""
    snap = generate_snapshot({"a100": (2, 4), "a10": (3, 2)}, jobs, seed=seed, running_fraction=0.4,
                             deadline_fraction=0.15, models=MODELS, **kw)
    rng = np.random.default_rng(seed)
    out = [j if j.running or rng.random() < 0.7 else
           j.model_copy(update={"remaining_iterations": j.total_iterations * 0.5}) for j in snap.jobs]
    return snap.model_copy(update={"jobs": out})


def grid_key(g):
    return (g.pool, g.shape, g.result, g.current)


def assert_same_problem(a, b):
    assert a.job_ids == b.job_ids
    for name in ARRAYS:
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and np.array_equal(x, y), name  # exactly: same floats, not approximately
    assert [grid_key(g) for g in a.grids] == [grid_key(g) for g in b.grids]
    assert a.pool_of == b.pool_of and a.pools == b.pools and a.max_reconfigs == b.max_reconfigs


@pytest.mark.parametrize("seed,factor", [(0, 2.0), (1, 2.0), (2, 1.0), (3, 0.5), (4, None), (5, 50.0)])
def test_filter_before_grids_equals_filter_of_the_full_problem(seed, factor):
    """Ranking waiting jobs on their workload's arrays picks the jobs that filtering the problem of every
    job's grids picks, and their model is that problem restricted to them, float for float."""
    snap = crowded(seed)
    opts = ArenaOptions(candidate_factor=factor, max_gpus_per_job=8)
    cat = GridCatalog.of(EST, opts.caution)
    full = build_problem(snap, cat.all_grids(snap, max_gpus_default=8), opts)
    want = candidates(full, factor)
    got_full, got = round_problem(snap, cat, opts)
    # the ranking itself, exactly, for every job that does not always enter
    r, w = problem_ranking(full), workload_ranking(snap, cat, opts).ranking
    assert np.array_equal(r.must, w.must) and np.array_equal(r.smallest, w.smallest) and r.total_gpus == w.total_gpus
    assert np.array_equal(r.density[~r.must], w.density[~w.must])
    if factor in (2.0, 1.0, 0.5):
        assert want is not None and len(want) < len(snap.jobs)  # the filter leaves jobs out here
    if factor is None or factor == 50.0:
        assert want is None
    assert (got is None) == (want is None)
    assert got_full.waiting_reason == full.waiting_reason and got_full.job_ids == full.job_ids
    if want is None:
        assert_same_problem(got_full, full)
    else:
        assert got.tolist() == want.tolist()
        assert_same_problem(restrict(got_full, got), restrict(full, want))
        # the problem round_problem hands back has grids only for the jobs that enter
        assert set(np.unique(got_full.job_of).tolist()) <= set(got.tolist())


def test_waiting_jobs_of_one_workload_share_their_grids_and_decide_as_with_copies():
    """Identical waiting jobs get the same grid objects; the model and the decision are those of every job
    having its own copies."""
    base = crowded(7, jobs=6)
    twins = [j.model_copy(update={"id": f"{j.id}-twin{k}"}) for j in base.jobs if j.running is None for k in range(3)]
    snap = base.model_copy(update={"jobs": base.jobs + twins})
    opts = ArenaOptions(max_gpus_per_job=8, mip_gap=0.0, candidate_factor=None)
    shared = GridCatalog.of(EST, opts.caution).all_grids(snap, max_gpus_default=8)
    waiting = [j for j in base.jobs if j.running is None]
    assert waiting
    for j in waiting:
        assert shared[j.id] and all(a is b for a, b in zip(shared[j.id], shared[f"{j.id}-twin0"]))
    copies = {jid: [replace(g, job_id=jid) for g in gs] for jid, gs in shared.items()}
    p, q = build_problem(snap, shared, opts), build_problem(snap, copies, opts)
    assert_same_problem(p, q)
    a = solve_problem(p, time_limit_s=60, mip_gap=0.0, threads=1)
    b = solve_problem(q, time_limit_s=60, mip_gap=0.0, threads=1)
    assert a.selection == b.selection and a.objective == b.objective
    pick = lambda pr, sel: {pr.job_ids[j]: pr.grids[k] for j, k in sel.items()}  # noqa: E731
    assert place(snap, pick(p, a.selection)) == place(snap, pick(q, b.selection))


@pytest.mark.parametrize("seed", range(5))
def test_filter_drops_no_job_of_the_optimum_when_every_job_takes_one_gpu(seed):
    """Brute force over every selection: when each job has one grid of one GPU, a job the filter leaves out
    has at least as many kept jobs of higher value per GPU as there are GPUs, so no optimum needs it (with
    distinct values, no optimum holds it) and the filtered problem's optimum is the full one."""
    snap = generate_snapshot({"a10": (2, 2)}, 12, seed=seed, running_fraction=0.0, deadline_fraction=0.0,
                             models=MODELS)
    rng = np.random.default_rng(seed)
    jobs = [j.model_copy(update={"max_gpus": 1, "weight": float(rng.uniform(0.5, 2.0)),
                                 "remaining_iterations": j.total_iterations * (0.5 if rng.random() < 0.3 else 1.0)})
            for j in snap.jobs]
    snap = snap.model_copy(update={"jobs": jobs})
    opts = ArenaOptions(candidate_factor=1.0, max_gpus_per_job=1, makespan_guard=False)
    full, cand = round_problem(snap, GridCatalog.of(EST, opts.caution), opts)
    ref = build_problem(snap, GridCatalog.of(EST, opts.caution).all_grids(snap, max_gpus_default=1), opts)
    assert cand is not None and all(len(ref.grids_of(j)) <= 1 for j in range(ref.num_jobs))
    sub = restrict(full, cand)

    def optimum(p):
        sels = [{j: int(k) for j, k in enumerate(c) if k is not None}
                for c in itertools.product(*[[None, *p.grids_of(j)] for j in range(p.num_jobs)])]
        vals = [p.objective(s) if p.feasible(s) else -np.inf for s in sels]
        best = max(vals)
        return best, [s for s, v in zip(sels, vals) if v >= best - 1e-9]

    best_full, opt_sels = optimum(ref)
    best_sub, _ = optimum(sub)
    assert best_sub == pytest.approx(best_full, rel=1e-12, abs=1e-12)
    if len(np.unique(ref.value)) == len(ref.value):
        kept = set(cand.tolist())
        assert all(set(s) <= kept for s in opt_sels)


@pytest.mark.parametrize("seed,factor", [(0, 2.0), (4, None)])
def test_model_arrays_are_each_grids_own_figures(seed, factor):
    """The round's arrays, read per distinct grid list (GridBlocks, shared by the ranking and the model),
    hold each grid's own throughput, GPUs, node units and running flag, and each grid's job."""
    snap = crowded(seed)
    opts = ArenaOptions(candidate_factor=factor, max_gpus_per_job=8)
    cat = GridCatalog.of(EST, opts.caution)
    p, _ = round_problem(snap, cat, opts)
    assert len(p.grids) and p.running.any()
    assert p.throughput.tolist() == [g.throughput for g in p.grids]
    assert p.units.tolist() == [g.node_units(g.pool[1]) for g in p.grids]
    assert p.current.tolist() == [g.current for g in p.grids]
    assert np.all(np.diff(p.job_of) >= 0)
    for k, g in enumerate(p.grids):
        assert g.job_id in ("", p.job_ids[p.job_of[k]])
        assert (g.job_id == "") == (not p.running[p.job_of[k]])
    ref = build_problem(snap, cat.all_grids(snap, max_gpus_default=8), opts)
    run = np.flatnonzero(p.running)
    assert [grid_key(g) for j in run for g in (p.grids[k] for k in p.grids_of(j))] == \
        [grid_key(g) for j in run for g in (ref.grids[k] for k in ref.grids_of(j))]


def test_grid_blocks_know_a_list_by_its_grids():
    """A copy of a list (the same grid objects) reuses its block; other grids, or the same in another
    order, get their own."""
    snap = crowded(2)
    gs = next(v for v in GridCatalog.of(EST).all_grids(snap, max_gpus_default=8).values() if len(v) > 1)
    b = GridBlocks()
    first = b.of(gs)
    assert b.of(list(gs)) is first
    rev = b.of(gs[::-1])
    assert rev is not first and np.array_equal(rev, first[::-1])
    assert b.of([]).shape == (0, 4)
    assert first.tolist() == [[g.throughput, g.num_gpus, float(g.current), g.node_units(g.pool[1])] for g in gs]


def test_grid_blocks_carry_over_only_what_the_last_round_read():
    """`next()` reuses the arrays of the lists the last round read and drops the rest, so a list whose
    grids are gone is not kept alive for ever."""
    snap = crowded(3)
    lists = [v for v in GridCatalog.of(EST).all_grids(snap, max_gpus_default=8).values() if v]
    a, b = lists[0], next(v for v in lists if [id(g) for g in v] != [id(g) for g in lists[0]])
    r1 = GridBlocks()
    x, y = r1.of(a), r1.of(b)
    r2 = r1.next()
    assert r2.of(list(a)) is x  # read again: the same array
    r3 = r2.next()
    assert r3.of(a) is x and r3.of(b) is not y and np.array_equal(r3.of(b), y)  # b skipped a round: made anew
