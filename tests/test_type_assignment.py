"""The baselines' shared 0/1 type assignment (Gavel, Sia): optimum equals enumeration, names kept."""

import itertools

import numpy as np
import pytest

from arena_opt.grids import enumerate_grids, pools
from arena_opt.instances import generate_snapshot
from arena_opt.milp.linear import to_highs
from arena_opt.perf.estimator import PerfEstimator
from arena_opt.policies.type_assignment import assign_types, type_assignment_model, type_capacity_left

EST = PerfEstimator()


def instance(seed: int):
    snap = generate_snapshot({"a100": (2, 4), "a40": (2, 2)}, 5, seed=seed, running_fraction=0.9,
                             models=["bert-760M", "moe-690M", "wide_resnet-500M"])
    rng = np.random.default_rng(seed)
    options = []  # each job's options together: its current grid (if it runs) and up to three others
    for jid, gs in enumerate_grids(snap, EST, max_gpus_default=4).items():
        others = [g for g in gs if not g.current]
        options += [(jid, g) for g in gs if g.current]
        options += [(jid, others[int(i)]) for i in rng.permutation(len(others))[:3]]
    return snap, options, rng.uniform(0.5, 2.0, len(options))


@pytest.mark.parametrize("seed", range(5))
def test_type_assignment_optimum_equals_enumeration(seed):
    snap, options, util = instance(seed)
    pmap = pools(snap)
    cap = type_capacity_left(pmap, {})
    max_mig = seed % 2
    by_job = {}
    for i, (j, _) in enumerate(options):
        by_job.setdefault(j, []).append(i)
    stays = [i for i, (_, g) in enumerate(options) if g.current]
    assert len(stays) > max_mig  # the migration cap binds
    best = None
    for pick in itertools.product(*by_job.values()):
        used = {}
        for i in pick:
            g = options[i][1]
            used[g.shape.gpu_type] = used.get(g.shape.gpu_type, 0) + g.node_units(g.pool[1])
        if any(u > cap[t] for t, u in used.items()):
            continue
        if len(stays) > max_mig and len(set(pick) & set(stays)) < len(stays) - max_mig:
            continue
        v = float(sum(util[i] for i in pick))
        best = v if best is None else max(best, v)
    fallback = {"fallback": options[0][1]}
    chosen, stats = assign_types(options, util, pmap, {}, max_mig, time_limit_s=10, mip_gap=0.0, fallback=fallback)
    if best is None:
        assert stats.fallback and chosen is fallback
        return
    assert stats.status == "optimal" and not stats.fallback
    assert set(chosen) == set(by_job)
    assert stats.objective == pytest.approx(best, rel=1e-9, abs=1e-9)
    got = sum(util[i] for i, (j, g) in enumerate(options) if chosen[j] is g)
    assert got == pytest.approx(best, rel=1e-9, abs=1e-9)


def test_type_assignment_families_are_named():
    snap, options, util = instance(1)
    lm = type_assignment_model(options, util, type_capacity_left(pools(snap), {}), max_migrations=0)
    jobs = list(dict.fromkeys(j for j, _ in options))
    types = list(dict.fromkeys(g.shape.gpu_type for _, g in options))
    assert [f.name for f in lm.families] == ["one_grid_per_job", "type_capacity", "migration_cap"]
    lp = to_highs(lm, names=True)
    names = list(lp.row_names_)
    assert names == ([f"one_grid_per_job[{j}]" for j in jobs] + [f"type_capacity[{t}]" for t in types]
                     + ["migration_cap"])


def test_type_programs_leave_the_shared_highs_options_as_found():
    """The programs run without feasibility jump (type_assignment.HIGHS_OPTIONS) on the process's one HiGHS
    instance, which the arena MILP solves on next: the option is back to what it was after each solve."""
    from arena_opt.milp.solve import _highs
    from arena_opt.policies.type_assignment import HIGHS_OPTIONS

    snap, options, util = instance(1)
    pmap = pools(snap)
    h = _highs()
    before = {k: h.getOptionValue(k)[1] for k in HIGHS_OPTIONS}
    assert before != HIGHS_OPTIONS  # the default is on: otherwise this test would check nothing
    chosen, stats = assign_types(options, util, pmap, {}, 1, time_limit_s=10, mip_gap=0.0, fallback={})
    assert stats.status == "optimal"
    assert {k: _highs().getOptionValue(k)[1] for k in HIGHS_OPTIONS} == before
