"""Oracle for the stage-split DP: every stack the planner hands `split_many` while it plans every grid of the
shipped instances is split again by the plainest form of the same DP (full (j, i) matrices for every stage,
no band, no memory shortcuts, no windows, no chunks) and must come out bit for bit the same."""

from pathlib import Path

import numpy as np
import pytest

import arena_opt.perf.planner as planner_mod
from arena_opt.perf.compose import _Segments, _stacked, split_many

INSTANCES = Path(__file__).parent.parent / "instances"


def plain_dp(lc, pp, m, caps):
    """f_k[i] = min_j max(f_{k-1}[j], cost_k[j, i]) over every (j, i), the first minimising j, on the same
    per-segment sums the planner's DP compares (`_Segments._terms`: the cost and memory formulas)."""
    lc = _stacked(lc)
    c, n = lc.step_s.shape
    m = np.broadcast_to(np.asarray(m), (c,))
    caps = np.broadcast_to(np.asarray(caps, dtype=float), (c,))
    s = _Segments(lc, pp, m)
    valid, _, _, _, peak = s.full()

    def seg(P):  # [c, j, i]
        return P[:, None, :] - P[:, :, None]

    rows = np.arange(c)
    f, choice, terms = None, {}, []
    for k in range(pp):
        t, cost, mem = s._terms(k, seg, lambda P: P[:, None, :], peak)
        terms.append((t, mem))
        cost = np.where(valid & (mem <= caps[:, None, None]), cost, np.inf)
        if k == 0:
            f = cost[:, 0, :]
            continue
        cand = np.maximum(f[:, :, None], cost)
        choice[k] = np.argmin(cand, axis=1)  # [c, i]
        f = np.min(cand, axis=1)
    bounds = np.zeros((c, pp + 1), dtype=int)
    bounds[:, pp] = n
    for k in range(pp - 1, 0, -1):
        bounds[:, k] = choice[k][rows, bounds[:, k + 1]]
    # each stage's T_k and memory at the chosen split
    times = np.stack([t[rows, bounds[:, k], bounds[:, k + 1]] for k, (t, _) in enumerate(terms)], axis=1)
    mems = np.stack([mem[rows, bounds[:, k], bounds[:, k + 1]] for k, (_, mem) in enumerate(terms)], axis=1)
    return np.isfinite(f[:, n]), f[:, n], bounds, times, mems


def recorded_stacks(monkeypatch, instance):
    """The (costs, pp, m, caps) of every split_many call of a cold arena round on the instance."""
    from arena_opt.grids import GridCatalog
    from arena_opt.io import load_model
    from arena_opt.perf.estimator import PerfEstimator
    from arena_opt.snapshot import ClusterSnapshot

    calls = []

    def record(lc, pp, m, caps):
        calls.append((lc, pp, m, caps))
        return split_many(lc, pp, m, caps)

    monkeypatch.setattr(planner_mod, "split_many", record)
    est = PerfEstimator()  # the catalogue holds its estimator weakly
    GridCatalog.of(est).all_grids(load_model(INSTANCES / f"{instance}.json", ClusterSnapshot))
    return calls


@pytest.mark.parametrize("instance", ["small", "medium", "large"])
def test_split_many_equals_the_plain_dp_on_every_stack_of_a_shipped_instance(instance, monkeypatch):
    calls = recorded_stacks(monkeypatch, instance)
    assert calls
    depths, feasible = set(), 0
    for lc, pp, m, caps in calls:
        got = split_many(lc, pp, m, caps)
        ok, best, bounds, times, mems = plain_dp(lc, pp, m, caps)
        assert np.array_equal(got.feasible, ok), pp
        assert np.array_equal(got.iter_time_s, best), pp  # +inf where there is no split
        assert np.array_equal(got.bounds[ok], bounds[ok]), pp
        assert got.stage_time_s[ok].tobytes() == times[ok].tobytes(), pp
        assert got.mem_bytes[ok].tobytes() == mems[ok].tobytes(), pp
        assert np.all(got.mem_bytes[ok].max(axis=1) <= np.broadcast_to(caps, ok.shape)[ok])
        depths.add(pp)
        feasible += int(ok.sum())
    assert feasible > 0
    if instance != "small":
        assert {1, 2, 4, 8, 16} <= depths


@pytest.mark.parametrize("seed", range(8))
def test_bisected_memory_test_equals_the_plain_dp_on_wide_random_stacks(seed, monkeypatch):
    """Stacks whose middle-stage band is wide enough for `first_fitting`'s bisection, with transient
    memory on some layers, small-integer costs and caps (many equal splits, segments that fill memory
    exactly) on odd seeds, and caps well below the whole model's need (fitting boundaries inside the
    band): bit for bit the plain DP, and the bisection did decide."""
    import arena_opt.perf.compose as compose
    from arena_opt.perf.compose import LayerCosts

    rng = np.random.default_rng(500 + seed)
    c, n = int(rng.integers(6, 30)), int(rng.integers(30, 41))
    pp = int(rng.choice([3, 4, 6]))

    def draw(lo, hi):
        x = rng.uniform(lo, hi, (c, n))
        return np.round(x * 4) if seed % 2 else x

    peak = draw(0, 6) * (rng.random((c, n)) < 0.3)
    lc = LayerCosts(draw(0.1, 1.0), draw(0, 0.2), draw(0, 0.3), draw(0, 0.05), draw(1, 4), draw(0.1, 1), peak,
                    stage_s=rng.uniform(0, 0.1, c))
    m = rng.choice([pp, 2 * pp, 4 * pp], c)
    whole = lc.static_bytes.sum(axis=1) + pp * lc.act_bytes.sum(axis=1)
    caps = whole * rng.uniform(0.25, 0.9, c)
    if seed % 2:  # integer caps on integer bytes: segments that fit exactly, at the bisection's boundary
        caps = np.floor(caps)
    # the bisection's boundaries against every segment's memory: the first fitting j of each (stage, i)
    s = _Segments(lc, pp, m)
    _, _, static, act, peak = s.full()  # [c, j, i]
    first = s.first_fitting(caps.reshape(c, 1))
    for k in range(1, pp - 1):
        fits = static + np.minimum(m, pp - k)[:, None, None] * act + peak <= caps[:, None, None]
        for x, i in enumerate(range(k + 1, n - (pp - 1 - k) + 1)):
            js = [j for j in range(k, i)]
            want = np.array([next((j for j in js if fits[r, j, i]), i) for r in range(c)])
            assert np.array_equal(first[:, k - 1, x], want), (k, i)
    used = []
    bisect = compose._Segments.first_fitting
    monkeypatch.setattr(compose._Segments, "first_fitting", lambda s, cap: used.append(1) or bisect(s, cap))
    got = split_many(lc, pp, m, caps)
    ok, best, bounds, times, mems = plain_dp(lc, pp, m, caps)
    assert used and ok.any()
    assert np.array_equal(got.feasible, ok)
    assert np.array_equal(got.iter_time_s, best)
    assert np.array_equal(got.bounds[ok], bounds[ok])
    assert got.stage_time_s[ok].tobytes() == times[ok].tobytes()
    assert got.mem_bytes[ok].tobytes() == mems[ok].tobytes()
