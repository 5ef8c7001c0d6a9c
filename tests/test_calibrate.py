"""Calibration: the linearized plan times equal the planner's, a fit recovers parameters it generated
measurements with, and a held-out GPU type gets only the shared efficiency."""

import numpy as np
import pytest

from arena_opt.gpus import BUILTIN_GPUS
from arena_opt.perf import calibrate as cal
from arena_opt.perf.analytical import CostParams, cost_table, layer_costs, layer_terms, links_for, rate_vector
from arena_opt.perf.estimator import PerfEstimator
from models.catalog import get_arch


def obs(model, gpu, nodes, gpn, batch=256, t=1.0, link=None):
    return cal.Observation(get_arch(model), batch, gpu, BUILTIN_GPUS[gpu], link, nodes, gpn, t)


CASES = [obs("bert-760M", "a100-40gb", 1, 2), obs("bert-1.3B", "a40", 2, 2, 128), obs("moe-690M", "v100-32gb", 1, 4),
         obs("wide_resnet-500M", "a10", 2, 2), obs("bert-2.6B", "v100-32gb", 2, 8, 512),
         obs("moe-1.3B", "a100-40gb", 2, 4, 512), obs("wide_resnet-1B", "a40", 1, 2),
         obs("bert-760M", "a10", 4, 2, 512)]


def test_terms_times_rates_is_layer_costs():
    p = CostParams(moe_einsum_group=2048, saturation_samples={"moe": 1.5})
    arch, gpu = get_arch("moe-690M"), BUILTIN_GPUS["a40"]
    table, links = cost_table(arch, p), links_for(gpu, "pcie", p)
    kw = dict(nodes=2, gpus_per_node=2, batch=64, dp=2, tp=2, m=4, recompute=True)
    direct = layer_costs(table, gpu, "a40", links, params=p, **kw)
    terms = layer_terms(table, gpu, links, **kw)
    via = terms.costs(rate_vector(p, "a40", table.dtype, links.intra_kind, arch.family))
    assert np.allclose(direct.step_s, via.step_s) and np.allclose(direct.allreduce_s, via.allreduce_s)
    assert direct.step_s.sum() > 0


@pytest.mark.parametrize("params", [CostParams(), CostParams(default_compute_eff=0.3, mem_eff=0.5,
                                                             saturation_samples={"bert": 2.0})])
def test_linearized_fastest_plan_equals_the_planner(params):
    pred = cal.predict(CASES, params, cal.PLANNER_SPACE)
    est = PerfEstimator(params, table_mode="off")
    for o, (t, plan) in zip(CASES, pred):
        r = est.best(o.arch, o.batch, o.gpu, o.intra_link, o.gpu_type, o.nodes, o.gpus_per_node)
        assert t == pytest.approx(r.iter_time_s, rel=1e-9), o
        assert plan.pp == r.plan.pp and plan.dp == r.plan.dp and plan.tp == r.plan.tp


def test_fit_recovers_generating_parameters():
    truth = CostParams(default_compute_eff=0.4, fp32_eff_scale=0.6, mem_eff=0.7, intra_eff={"nvlink": 0.5, "pcie": 0.5},
                       inter_comm_eff=0.1, layer_overhead_s=40e-6, moe_einsum_group=2048)
    times = [t for t, _ in cal.predict(CASES, truth, cal.ARENA_SPACE)]
    measured = [cal.Observation(o.arch, o.batch, o.gpu_type, o.gpu, o.intra_link, o.nodes, o.gpus_per_node, t)
                for o, t in zip(CASES, times)]
    spec = cal.FitSpec(per_type=False, fit_globals=("fp32_eff_scale", "mem_eff", "inter_comm_eff"), rounds=2,
                       use_priors=False)
    res = cal.fit(measured, CostParams(moe_einsum_group=2048, intra_eff={"nvlink": 0.5, "pcie": 0.5}), spec)
    pred = [t for t, _ in cal.predict(measured, res.params, cal.ARENA_SPACE)]
    assert np.allclose(pred, times, rtol=0.02)
    assert res.params.default_compute_eff == pytest.approx(0.4, rel=0.1)
    assert res.params.fp32_eff_scale == pytest.approx(0.6, rel=0.1)


@pytest.mark.shared_data
def test_leave_one_type_out_on_arena_bert_rows(arena_data):
    from arena_opt.perf.table import PerfTable

    rows = [o for o in cal.observations(PerfTable.load(arena_data / "prof_records.csv", "alpa_optimal"))
            if o.arch.name in ("bert-760M", "bert-1.3B")]
    train = [o for o in rows if o.gpu_type != "a40"]
    test = [o for o in rows if o.gpu_type == "a40"]
    res = cal.fit(train, CostParams(), cal.FitSpec(rounds=2))
    assert "a40" not in res.params.compute_eff and set(res.params.compute_eff) == {o.gpu_type for o in train}
    err = [t / o.measured_s - 1 for o, (t, _) in zip(test, cal.predict(test, res.params, cal.ARENA_SPACE))]
    base = [t / o.measured_s - 1 for o, (t, _) in zip(test, cal.predict(test, CostParams(), cal.ARENA_SPACE))]
    assert np.median(np.abs(err)) < 0.15
    assert np.median(np.abs(err)) < np.median(np.abs(base))
