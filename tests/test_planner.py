import itertools

import numpy as np
import pytest

from arena_opt.gpus import BUILTIN_GPUS
from arena_opt.milp.stage_split import solve_split
from arena_opt.perf.compose import LayerCosts, evaluate_split, split_stages
from arena_opt.perf.planner import Planner
from models import get_arch


def random_costs(rng, n):
    return LayerCosts(step_s=rng.uniform(0.1, 1.0, n), p2p_s=rng.uniform(0.0, 0.2, n),
                      allreduce_s=rng.uniform(0.0, 0.3, n), optim_s=rng.uniform(0, 0.05, n),
                      static_bytes=rng.uniform(1, 4, n), act_bytes=rng.uniform(0.1, 1, n),
                      peak_bytes=rng.uniform(0, 2, n) * (rng.random(n) < 0.3))


def brute_force(lc, pp, m, cap):
    n = lc.num_layers
    best = None
    for cuts in itertools.combinations(range(1, n), pp - 1):
        b = [0, *cuts, n]
        res = evaluate_split(lc, [(b[i], b[i + 1]) for i in range(pp)], m)
        if max(res.mem_bytes) <= cap and (best is None or res.iter_time_s < best.iter_time_s - 1e-12):
            best = res
    return best


@pytest.mark.parametrize("seed", range(12))
def test_stage_dp_equals_brute_force(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(3, 9))
    pp = int(rng.integers(1, min(n, 4) + 1))
    m = int(rng.choice([1, 2, 4, 8]))
    lc = random_costs(rng, n)
    cap = float(rng.uniform(3, 20))
    dp = split_stages(lc, pp, m, cap)
    bf = brute_force(lc, pp, m, cap)
    if bf is None:
        assert dp is None
    else:
        assert dp is not None
        assert dp.iter_time_s == pytest.approx(bf.iter_time_s, rel=1e-12)
        assert max(dp.mem_bytes) <= cap


@pytest.mark.parametrize("seed", range(4))
def test_stage_dp_equals_pyomo_milp(seed):
    rng = np.random.default_rng(100 + seed)
    n, pp, m = 7, 3, 4
    lc = random_costs(rng, n)
    cap = 12.0
    dp = split_stages(lc, pp, m, cap)
    stages, obj = solve_split(lc, pp, m, cap)
    if dp is None:
        assert stages is None
        return
    assert obj == pytest.approx(dp.iter_time_s, rel=1e-6)
    assert evaluate_split(lc, stages, m).iter_time_s == pytest.approx(dp.iter_time_s, rel=1e-6)


@pytest.mark.parametrize("model,batch,gpu,nodes,gpn", [
    ("bert-2.6B", 256, "a40", 2, 2), ("moe-10B", 256, "a100-40gb", 2, 4), ("wide_resnet-2B", 512, "a10", 4, 2),
    ("llama-13B", 512, "h100-80gb", 1, 8), ("gpt-760M", 128, "v100-32gb", 1, 1)])
def test_planner_plans_fit_and_use_the_grid(model, batch, gpu, nodes, gpn):
    planner = Planner()
    spec = BUILTIN_GPUS[gpu]
    any_plan = False
    for pp in (1, 2, 4, 8):
        if pp > nodes * gpn:
            break
        res = planner.plan(get_arch(model), batch, gpu, spec, None, nodes, gpn, pp)
        if res.proxy is None:
            continue
        any_plan = True
        assert res.proxy is res.pareto[0]
        for r in res.pareto:
            p = r.plan
            assert p.pp == pp and p.num_gpus == nodes * gpn
            assert gpn % p.tp == 0
            assert r.mem_gib <= spec.memory_gib
            assert batch % (p.dp * p.num_microbatches) == 0
            assert p.stages[0][0] == 0 and len(p.stages) == pp
        times = [r.iter_time_s for r in res.pareto]
        mems = [r.mem_gib for r in res.pareto]
        assert times == sorted(times) and mems == sorted(mems, reverse=True)
    assert any_plan


def test_too_big_model_has_no_plan():
    planner = Planner()
    res = planner.plan(get_arch("llama-70B"), 1024, "a10", BUILTIN_GPUS["a10"], None, 1, 1, 1)
    assert res.proxy is None and res.pareto == []


def test_plan_cache_round_trip(tmp_path):
    spec = BUILTIN_GPUS["a40"]
    a = Planner()
    fresh = a.plan(get_arch("bert-1.3B"), 128, "a40", spec, None, 1, 2, 2)
    a.save_cache(tmp_path / "plans.json")
    b = Planner()
    b.load_cache(tmp_path / "plans.json")
    again = b.plan(get_arch("bert-1.3B"), 128, "a40", spec, None, 1, 2, 2)
    assert again == fresh
    # other cost parameters never reuse the cached plans
    from arena_opt.perf.analytical import CostParams

    c = Planner(CostParams(default_compute_eff=0.1))
    c.load_cache(tmp_path / "plans.json")
    assert c._disk == {}
