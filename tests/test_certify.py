"""The LP relaxation as a certificate of the greedy start (milp/certify.py): what it returns is feasible,
optimal within the gap it was given (brute force on tiny rounds), and the policy reports it as such."""

import pytest

from arena_opt.feasibility import check_decision
from arena_opt.grids import enumerate_grids
from arena_opt.instances import generate_snapshot
from arena_opt.milp.certify import WITHIN_GAP, relax
from arena_opt.milp.greedy import greedy_start
from arena_opt.milp.model import level1_model
from arena_opt.milp.options import ArenaOptions
from arena_opt.milp.problem import build_problem
from arena_opt.policies.arena import ArenaPolicy
from test_milp import EST, TINY_MODELS, all_selections, shared_nodes, tiny


def rounds():
    for seed in range(8):
        snap = tiny(seed, jobs=4)
        yield snap, ArenaOptions(max_gpus_per_job=4)
    for seed in range(3):
        yield shared_nodes(seed)


@pytest.mark.parametrize("gap", [0.0, 1e-3, 0.05])
def test_certificate_is_optimal_within_its_gap(gap):
    seen = {"optimal": 0, WITHIN_GAP: 0, None: 0}
    for snap, opts in rounds():
        p = build_problem(snap, enumerate_grids(snap, EST, max_gpus_default=4), opts)
        best = max(p.objective(s) for s in all_selections(p) if p.feasible(s))
        start = greedy_start(p)
        lp = relax(p, threads=1)
        assert lp.bound >= best - 1e-6  # an upper bound on every feasible selection
        r = lp.optimum(p) or lp.certify(p, start, gap)
        seen[None if r is None else r.status] += 1
        if r is None:
            continue
        assert p.feasible(r.selection)
        assert r.objective == pytest.approx(p.objective(r.selection), rel=1e-9, abs=1e-9)
        assert best - r.objective <= gap * abs(r.objective) + 1e-6
        assert r.gap == pytest.approx(max(0.0, r.bound - r.objective) / max(abs(r.objective), 1e-9))
        if r.status == "optimal":
            assert r.objective == pytest.approx(best, rel=1e-6, abs=1e-6)
        else:
            assert r.selection == start and r.gap <= gap
    assert seen["optimal"] > 0  # the relaxation is integral on some of these rounds ...
    if gap == 0.0:
        assert seen[None] > 0  # ... and at no gap it proves nothing on others, which the MIP then solves
    if gap == 0.05:
        assert seen[WITHIN_GAP] > 0  # a fractional optimum whose bound proves the greedy start


def test_policy_with_certificate_decides_within_the_gap():
    """Rounds with and without running jobs and deadlines: where the relaxation proves the round, the MIP is
    not run and the decision says so; either way it is feasible and within the gap of the MIP's."""
    used = set()
    for seed in range(4):
        for running, deadlines in ((0.0, 0.0), (0.3, 0.0), (0.6, 0.5)):
            snap = generate_snapshot({"a100": (4, 4), "a10": (4, 2)}, 6, seed=seed, running_fraction=running,
                                     deadline_fraction=deadlines, models=TINY_MODELS)
            opts = dict(backend="highspy", mip_gap=1e-3, max_gpus_per_job=4)
            on = ArenaPolicy(ArenaOptions(**opts), estimator=EST).decide(snap)
            off = ArenaPolicy(ArenaOptions(lp_certificate_max_grids=0, **opts), estimator=EST).decide(snap)
            check_decision(snap, on)
            s = on.stats
            assert s.status in ("optimal", WITHIN_GAP) and not s.fallback
            assert s.bound is not None and s.gap is not None and s.gap <= 1e-3
            assert s.objective >= off.stats.objective - 1e-3 * abs(off.stats.objective) - 1e-9
            assert s.bound >= off.stats.objective - 1e-6
            certified = "LP relaxation" in s.solver
            assert certified == ("MIP not run" in (s.note or ""))
            assert "LP relaxation" not in off.stats.solver
            used.add(s.status if certified else "mip")
    assert {"optimal", "mip"} <= used  # both paths run on these rounds (the start's certificate: above)


def test_relaxation_solves_after_earlier_solves_ran_past_its_time_limit():
    """HiGHS's LP solver counts its time limit on the instance's clock, which every earlier solve of the
    process advances: run_highs gives an LP its limit from now."""
    from arena_opt.milp.solve import _highs, solve_problem

    snap, opts = shared_nodes(0)
    p = build_problem(snap, enumerate_grids(snap, EST, max_gpus_default=4), opts)
    while _highs().getRunTime() < 0.3:
        solve_problem(p, time_limit_s=10, mip_gap=0.0, threads=1, backend="highspy")
    assert relax(p, threads=1, time_limit_s=0.25) is not None


@pytest.mark.parametrize("gap", [1e-3, 0.05])
def test_rounded_relaxation_is_feasible_and_certified_within_its_gap(gap):
    """The relaxation's optimum rounded (integral grids kept, the rest greedy) is a feasible selection; where
    the bound certifies it, it is within the gap of the brute-force optimum."""
    seen = {"certified": 0, "not": 0}
    for snap, opts in rounds():
        p = build_problem(snap, enumerate_grids(snap, EST, max_gpus_default=4), opts)
        best = max(p.objective(s) for s in all_selections(p) if p.feasible(s))
        lp = relax(p, threads=1)
        sel = lp.rounded(p)
        if sel is None:
            continue
        assert p.feasible(sel)
        assert p.objective(sel) <= best + 1e-6
        r = lp.certify(p, sel, gap)
        seen["not" if r is None else "certified"] += 1
        if r is not None:
            assert r.selection == sel and best - r.objective <= gap * abs(r.objective) + 1e-6
    assert seen["certified"] > 0


def test_warm_started_relaxation_has_the_cold_optimum():
    """A relaxation started from the last round's basis (LpBasis) reaches the same optimum as one solved
    cold, over a sequence of rounds whose jobs come, go and progress (and rounds it has nothing in common with)."""
    from arena_opt.milp.certify import LpBasis

    opts = ArenaOptions(max_gpus_per_job=4)
    base = generate_snapshot({"a100": (6, 4), "a10": (6, 2)}, 24, seed=3, running_fraction=0.5,
                             deadline_fraction=0.3, models=TINY_MODELS)
    seq = []
    for i in range(6):
        jobs = [j.model_copy(update={"remaining_iterations": j.remaining_iterations * (1 - 0.1 * i)})
                for j in base.jobs[i: 18 + i]]  # one job leaves and one arrives each round
        seq.append(base.model_copy(update={"time": base.time + 300 * i, "jobs": jobs}))
    seq += [tiny(s, jobs=4) for s in range(2)]
    warm, used = LpBasis(), 0
    for snap in seq:
        p = build_problem(snap, enumerate_grids(snap, EST, max_gpus_default=4), opts)
        cold = relax(p, threads=1)
        used += warm.cols is not None
        hot = relax(p, threads=1, warm=warm)
        assert hot.bound == pytest.approx(cold.bound, rel=1e-7, abs=1e-7)
        assert warm.cols is not None and len(warm.cols) == len(LpBasis.keys(p, level1_model(p))[0])
        if hot.selection is not None:
            assert p.feasible(hot.selection)
            assert p.objective(hot.selection) == pytest.approx(hot.bound, rel=1e-6, abs=1e-6)
    assert used == len(seq) - 1


def test_rounding_that_does_not_pack_is_recorded_in_the_decision(monkeypatch):
    """Where the relaxation's whole grids do not pack (greedy_select refuses the fixed set), `rounded` gives no
    selection, says why (`dropped`), and the policy's decision, still feasible and solved, carries the why."""
    import arena_opt.milp.certify as certify

    def refuse(p, fixed=None, **kw):
        raise RuntimeError(f"fixed selection does not pack (job {p.job_ids[next(iter(fixed))]})")

    monkeypatch.setattr(certify, "greedy_select", refuse)
    noted = 0
    for seed in range(4):
        for running, deadlines in ((0.0, 0.0), (0.3, 0.0), (0.6, 0.5)):
            snap = generate_snapshot({"a100": (4, 4), "a10": (4, 2)}, 6, seed=seed, running_fraction=running,
                                     deadline_fraction=deadlines, models=TINY_MODELS)
            opts = ArenaOptions(backend="highspy", mip_gap=1e-3, max_gpus_per_job=4)
            p = build_problem(snap, enumerate_grids(snap, EST, max_gpus_default=4), opts)
            lp = relax(p, threads=1)
            fractional = lp.selection is None
            if fractional:
                assert lp.rounded(p) is None and "do not pack" in lp.dropped
            d = ArenaPolicy(opts, estimator=EST).decide(snap)
            check_decision(snap, d)
            assert not d.stats.fallback
            said = "rounded optimum dropped" in (d.stats.note or "")
            assert said == fractional
            noted += said
    assert noted > 0


def test_relaxation_arrays_hand_highs_the_model_of_its_highs_lp():
    """The arrays the relaxation passes HiGHS (linear.highs_arrays) make in HiGHS the model's costs, bounds and
    matrix, every column continuous, as to_highs's HighsLp does, and it solves to the same optimum and basis."""
    import highspy
    import numpy as np

    from arena_opt.milp.linear import highs_arrays, to_highs
    from arena_opt.milp.solve import _highs, highs_basis, run_highs

    snap = generate_snapshot({"a100": (6, 4), "a10": (6, 2)}, 24, seed=3, running_fraction=0.5,
                             deadline_fraction=0.3, models=TINY_MODELS)
    p = build_problem(snap, enumerate_grids(snap, EST, max_gpus_default=4), ArenaOptions(max_gpus_per_job=4))
    lm = level1_model(p)
    assert (lm.kinds() != "C").any()  # a MILP: the relaxation drops its integrality
    lo, hi = lm.row_bounds()

    def dense(m, rows, cols):  # HiGHS keeps the matrix column-wise or row-wise, whichever it was given
        out = np.zeros((rows, cols))
        rowwise = m.format_ == highspy.MatrixFormat.kRowwise
        st = list(m.start_)
        for a, (b, e) in enumerate(zip(st[:-1], st[1:])):
            for i, v in zip(list(m.index_)[b:e], list(m.value_)[b:e]):
                out[(a, i) if rowwise else (i, a)] = v
        return out

    starts, index, value = lm.csr()
    want = np.zeros((lm.num_rows, lm.num_cols))
    for r in range(lm.num_rows):
        want[r, index[starts[r]:starts[r + 1]]] = value[starts[r]:starts[r + 1]]
    got = []
    for lp in (to_highs(lm, relaxed=True), highs_arrays(lm, relaxed=True)):
        word, info, x = run_highs(lp, time_limit_s=10.0, mip_gap=0.0, threads=1)
        held = _highs().getLp()
        m = held.a_matrix_
        assert np.array_equal(held.col_cost_, lm.cost()) and np.array_equal(held.col_upper_, lm.upper())
        assert np.array_equal(held.col_lower_, np.zeros(lm.num_cols))
        assert np.array_equal(held.row_lower_, lo) and np.array_equal(held.row_upper_, hi)
        assert np.array_equal(dense(m, held.num_row_, held.num_col_), want)
        assert not {int(v) for v in held.integrality_} - {0}  # none integer
        got.append((word, x, [int(s) for s in highs_basis().col_status]))
    assert got[0][0] == got[1][0] == "Optimal"
    assert np.array_equal(got[0][1], got[1][1]) and got[0][2] == got[1][2]
    mip = highs_arrays(lm)
    assert not mip.is_lp and mip.integrality.sum() == (lm.kinds() != "C").sum()
