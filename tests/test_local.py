"""Local improvement (milp/local.py): its packing vectors say what problem.feasible says, its moves never
lower the objective or break feasibility, and they find optima the greedy start misses."""

import time

import numpy as np
import pytest

from arena_opt.feasibility import check_decision
from arena_opt.grids import enumerate_grids
from arena_opt.milp.greedy import greedy_start
from arena_opt.milp.local import Packing, _Moves, improve
from arena_opt.milp.options import ArenaOptions
from arena_opt.milp.problem import build_problem
from arena_opt.policies.arena import ArenaPolicy
from test_milp import EST, all_selections, shared_nodes, tiny


def shared_node_problems():
    """Rounds with running jobs sharing nodes."""
    for seed in (0, 1):
        snap, opts = shared_nodes(seed, cap=None)
        yield build_problem(snap, enumerate_grids(snap, EST, max_gpus_default=4), opts)


def problems():
    """Tiny rounds small enough to enumerate: two cluster shapes, and one with running jobs sharing nodes."""
    for seed in (2, 3, 6):
        snap = tiny(seed, spec={"a100": (1, 4), "v100": (1, 8)}, jobs=5)
        yield build_problem(snap, enumerate_grids(snap, EST, max_gpus_default=8), ArenaOptions(max_gpus_per_job=8))
    yield from shared_node_problems()


@pytest.mark.parametrize("p", list(problems()), ids=lambda p: f"{len(p.grids)}grids")
def test_packing_vectors_say_what_feasible_says(p):
    n = 0
    for sel in all_selections(p):
        assert bool(np.all(Packing(p, sel).slack(sel) >= -1e-9)) == p.feasible(sel)
        n += 1
    assert n > 100


@pytest.mark.parametrize("p", list(problems()), ids=lambda p: f"{len(p.grids)}grids")
def test_improve_never_lowers_the_objective_nor_breaks_feasibility(p):
    feasible = [s for s in all_selections(p) if p.feasible(s)]
    best = max(p.objective(s) for s in feasible)
    rng = np.random.default_rng(0)
    for i in rng.choice(len(feasible), size=min(40, len(feasible)), replace=False):
        sel = feasible[i]
        out = improve(p, sel)
        assert p.feasible(out)
        assert set(out.values()) <= set(range(len(p.grids)))
        assert all(p.job_of[k] == j for j, k in out.items())
        assert p.objective(out) >= p.objective(sel) - 1e-9
        assert p.objective(out) <= best + 1e-9


def test_improve_reaches_the_optimum_the_greedy_start_misses():
    """Seed 11 on one 4-GPU a100 node and one 8-GPU v100 node: the greedy start leaves 14.82 of 46.90 on the
    table; the moves close it. (Seed 2, this test's case under the uncalibrated model, greedy 8.06 -> 10.61, now
    stops at 8.42 of 10.19 under the calibrated one: local moves are a heuristic.)"""
    snap = tiny(11, spec={"a100": (1, 4), "v100": (1, 8)}, jobs=5)
    p = build_problem(snap, enumerate_grids(snap, EST, max_gpus_default=8), ArenaOptions(max_gpus_per_job=8))
    best = max(p.objective(s) for s in all_selections(p) if p.feasible(s))
    start = greedy_start(p)
    assert p.objective(start) < best - 1e-3
    out = improve(p, start)
    assert p.feasible(out)
    assert p.objective(out) == pytest.approx(best, rel=1e-9, abs=1e-9)


def test_improve_at_a_passed_deadline_returns_the_selection():
    snap = tiny(2, spec={"a100": (1, 4), "v100": (1, 8)}, jobs=5)
    p = build_problem(snap, enumerate_grids(snap, EST, max_gpus_default=8), ArenaOptions(max_gpus_per_job=8))
    start = greedy_start(p)
    assert improve(p, start, until=time.perf_counter() - 1) == start


def test_improve_refuses_an_infeasible_selection():
    snap = tiny(2, spec={"a100": (1, 4), "v100": (1, 8)}, jobs=5)
    p = build_problem(snap, enumerate_grids(snap, EST, max_gpus_default=8), ArenaOptions(max_gpus_per_job=8))
    bad = next(s for s in all_selections(p) if not p.feasible(s))
    with pytest.raises(ValueError):
        improve(p, bad)


def test_round_past_highs_max_grids_decides_without_highs():
    """A model above highs_max_grids is not handed to HiGHS: the improved greedy start decides, flagged."""
    snap = tiny(2, spec={"a100": (1, 4), "v100": (1, 8)}, jobs=5)
    opts = ArenaOptions(max_gpus_per_job=8, highs_max_grids=1, backend="highspy")
    d = ArenaPolicy(opts, estimator=EST).decide(snap)
    check_decision(snap, d)
    p = build_problem(snap, enumerate_grids(snap, EST, max_gpus_default=8), opts)
    best = max(p.objective(s) for s in all_selections(p) if p.feasible(s))
    assert d.stats.status == "not_run" and d.stats.fallback and "highs_max_grids" in d.stats.note
    assert d.stats.objective == pytest.approx(best, rel=1e-9, abs=1e-9)


def _grouped(mask, dkey, dg):
    """The pattern grouping by definition: moves sorted by key, then gain change descending, then index."""
    idx = np.flatnonzero(mask)
    order = idx[np.lexsort((-dg[idx], dkey[idx]))]
    starts = np.flatnonzero(np.r_[True, dkey[order][1:] != dkey[order][:-1]])
    return order[starts], np.split(order, starts[1:]), dg[order[starts]]


@pytest.mark.parametrize("seed", range(6))
def test_moves_kept_across_rounds_equal_moves_recomputed(seed):
    """improve's move state, updated for the jobs that moved only, equals the state made afresh for the new
    options, and its pattern grouping is the sorted one; gains are small integers, so ties are everywhere."""
    rng = np.random.default_rng(seed)
    jobs, n, t = 40, 200, 5
    job_of = np.sort(rng.integers(0, jobs, n))
    vec = np.r_[rng.integers(0, 3, (n, t)).astype(float), np.zeros((1, t))]
    gain = np.r_[rng.integers(0, 4, n).astype(float), 0.0]
    vkey = vec.astype(np.int64) @ rng.integers(1, 1 << 40, t)
    m_job = np.r_[job_of, np.arange(jobs)]
    m_to = np.r_[np.arange(n), np.full(jobs, n)]
    at = np.full(jobs, n, dtype=np.int64)
    kept = _Moves(vec, gain, vkey, m_job, m_to, at)
    for _ in range(15):
        moved = rng.choice(jobs, size=rng.integers(1, 8), replace=False)
        for j in moved:
            at[j] = rng.choice(np.r_[np.flatnonzero(job_of == j), n])
        kept.moved(np.sort(moved), at)
        fresh = _Moves(vec, gain, vkey, m_job, m_to, at)
        for name in ("live", "dg", "dv", "dkey", "frees", "order"):
            assert np.array_equal(getattr(kept, name), getattr(fresh, name)), name
        mask = rng.random(len(m_job)) < 0.7
        got, want = kept.patterns(mask), _grouped(mask, fresh.dkey, fresh.dg)
        assert np.array_equal(got[0], want[0]) and np.array_equal(got[2], want[2])
        assert len(got[1]) == len(want[1]) and all(np.array_equal(a, b) for a, b in zip(got[1], want[1]))


def reference_packing(p, sel):
    """The pool-threshold vectors and capacities of the module docstring, grid by grid and node by node."""
    cols = [(key, s) for key, pi in p.pools.items() for s in pi.thresholds]
    vec, cap = np.zeros((len(p.grids) + 1, len(cols))), np.zeros(len(cols))
    cur = {int(p.job_of[k]): int(k) for k in np.flatnonzero(p.current)}
    for c, (key, s) in enumerate(cols):
        pi = p.pools[key]
        g = pi.gpus_per_node
        for k in range(len(p.grids)):
            if p.pool_of[k] == key and not p.current[k] and p.units[k] >= s:
                vec[k, c] = p.units[k]
        cap[c] = g * pi.empty_nodes
        for users in pi.occupied.values():
            if len(users) == 1:
                j, held = users[0]
                cap[c] += g
                if j in cur:
                    vec[cur[j], c] += g - s * ((g - held) // s)
            else:
                kept = sum(held for j, held in users if j in cur and sel.get(j) == cur[j])
                cap[c] += s * ((g - kept) // s)
    pinned = np.zeros(p.num_jobs, dtype=bool)
    for pi in p.pools.values():
        for users in pi.occupied.values():
            if len(users) > 1:
                pinned[[j for j, _ in users]] = True
    return vec, cap, pinned


def many_node_problems():
    """Rounds with running jobs alone on one or several nodes (multi-node grids) and some sharing nodes."""
    from arena_opt.instances import generate_snapshot
    from test_milp import TINY_MODELS

    for seed, jobs in ((1, 90), (3, 320)):
        snap = generate_snapshot({"a100": (24, 4), "v100": (12, 8), "a10": (30, 2)}, jobs, seed=seed,
                                 running_fraction=0.5, models=TINY_MODELS)
        yield build_problem(snap, enumerate_grids(snap, EST, max_gpus_default=32), ArenaOptions(max_gpus_per_job=32))
    yield from shared_node_problems()


@pytest.mark.parametrize("p", list(many_node_problems()), ids=lambda p: f"{len(p.grids)}grids")
def test_packing_vectors_are_the_documented_ones(p):
    """Packing's vectors, capacities and pinned jobs are the docstring's, for the greedy start and for a
    selection that drops every other job (the shared nodes' capacities follow which of their jobs stay)."""
    start = greedy_start(p)
    multi = 0
    for sel in (start, dict(list(start.items())[::2])):
        pk = Packing(p, sel)
        vec, cap, pinned = reference_packing(p, sel)
        assert np.array_equal(pk.vec, vec) and np.array_equal(pk.cap, cap) and np.array_equal(pk.pinned, pinned)
        assert np.array_equal(pk.caps(sel), cap)
    for pi in p.pools.values():
        alone = [users[0][0] for users in pi.occupied.values() if len(users) == 1]
        multi += len(alone) - len(set(alone))  # a running job alone on several nodes: its vector adds up
    assert multi > 0 or pinned.any()
