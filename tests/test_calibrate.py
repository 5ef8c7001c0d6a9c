"""Calibration: the linearized plan times equal the planner's, a fit recovers parameters it generated
measurements with, and a held-out GPU type gets only the other types' efficiency trend with peak."""

import numpy as np
import pytest

from arena_opt.gpus import BUILTIN_GPUS
from arena_opt.perf import calibrate as cal
from arena_opt.perf.analytical import (EFF_BOUNDS, PEAK_TREND_REACH, CostParams, cost_table, layer_costs, layer_terms,
                                       links_for, rate_vector)
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
    via = terms.costs(rate_vector(p, "a40", gpu.peak_tflops, table.dtype, links.intra_kind, arch.family))
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
    # the truth lets the planner's plans beat the measured ones, so no envelope (see the envelope test)
    spec = cal.FitSpec(per_type=False, fit_globals=("fp32_eff_scale", "mem_eff", "inter_comm_eff"), rounds=2,
                       use_priors=False, envelope_space=None)
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


def _measured(cases, truth, space):
    times = [t for t, _ in cal.predict(cases, truth, space)]
    return [cal.Observation(o.arch, o.batch, o.gpu_type, o.gpu, o.intra_link, o.nodes, o.gpus_per_node, t)
            for o, t in zip(cases, times)]


def test_fit_recovers_a_per_microbatch_overhead():
    truth = CostParams(default_compute_eff=0.5, microbatch_overhead_s=3e-3, moe_einsum_group=2048)
    # batches of 128 to 512 at 16 micro-batches: the fixed part per micro-batch is not proportional to work
    cases = CASES + [obs("bert-760M", "a100-40gb", 1, 2, 64), obs("bert-2.6B", "v100-32gb", 2, 8, 128)]
    measured = _measured(cases, truth, cal.ARENA_SPACE)
    spec = cal.FitSpec(per_type=False, fit_globals=("microbatch_overhead_s",), rounds=2, use_priors=False,
                       envelope_space=None)
    res = cal.fit(measured, CostParams(moe_einsum_group=2048), spec)
    assert res.params.microbatch_overhead_s == pytest.approx(3e-3, rel=0.1)
    assert res.params.default_compute_eff == pytest.approx(0.5, rel=0.05)


def test_envelope_prices_recomputation_the_reference_space_cannot_see():
    """Measurements made in a runtime whose rematerialisation is nearly free: the reference space
    (always recompute) cannot tell, the envelope (the planner's own space may not undercut them) can."""
    truth = CostParams(default_compute_eff=0.5, recompute_cost=0.1, moe_einsum_group=2048)
    measured = _measured(CASES, truth, cal.ARENA_SPACE)
    base = CostParams(moe_einsum_group=2048)
    ref_only = cal.fit(measured, base, cal.FitSpec(per_type=False, fit_globals=("recompute_cost",), rounds=2,
                                                   use_priors=False, envelope_space=None))
    env = cal.fit(measured, base, cal.FitSpec(per_type=False, fit_globals=("recompute_cost",), rounds=2,
                                              use_priors=False))
    def undercut(params):  # how far the planner's own best plan undercuts the measured optimum
        pred = cal.predict(measured, params, cal.PLANNER_SPACE)
        return float(np.mean([max(0.0, np.log(o.measured_s / t)) for o, (t, _) in zip(measured, pred)]))

    assert undercut(env.params) < 0.5 * undercut(ref_only.params)
    assert env.params.recompute_cost < 0.3 < ref_only.params.recompute_cost


def test_leave_one_type_out_never_sees_the_held_out_type():
    spec = cal.FitSpec(per_type=True, fit_globals=("mem_eff",), rounds=1, envelope_space=None)
    cases = _measured(CASES, CostParams(default_compute_eff=0.4, mem_eff=0.6), cal.ARENA_SPACE)
    folds = cal.leave_one_type_out(cases, CostParams(), spec)
    assert set(folds) == {o.gpu_type for o in cases}
    # the held-out type's measurements changed beyond recognition: its fold is the same fit
    changed = [cal.Observation(o.arch, o.batch, o.gpu_type, o.gpu, o.intra_link, o.nodes, o.gpus_per_node,
                               o.measured_s * (1.6 if o.gpu_type == "a40" else 1.0)) for o in cases]
    again = cal.leave_one_type_out(changed, CostParams(), spec)
    assert again["a40"].params == folds["a40"].params
    assert again["a10"].params != folds["a10"].params  # a fold that trains on a40 sees the change
    res = cal.loto_residuals(cases, folds, cal.ARENA_SPACE)
    assert len(res) == len(cases) and all(r.config()["pp"] >= 1 for r in res)
    held = [r for r in res if r.obs.gpu_type == "a40"]
    assert held[0].predicted_s == pytest.approx(cal.predict([held[0].obs], folds["a40"].params,
                                                            cal.ARENA_SPACE)[0][0])


def test_microbatch_slot_cost_scales_with_the_gpu_peak():
    p = CostParams(microbatch_overhead_s=5e-3)
    arch = get_arch("bert-760M")
    slow = BUILTIN_GPUS["a40"].model_copy(update={"peak_tflops": 100.0})
    fast = slow.model_copy(update={"peak_tflops": 400.0})
    kw = dict(nodes=1, gpus_per_node=2, batch=64, dp=2, tp=1, m=4, recompute=False, params=p)
    table = cost_table(arch, p)
    at_ref = layer_costs(table, slow, "a40", links_for(slow, None, p), **kw)
    at_fast = layer_costs(table, fast, "a40", links_for(fast, None, p), **kw)
    assert at_ref.microbatch_s == pytest.approx(5e-3) and at_fast.microbatch_s == pytest.approx(5e-3 / 4)


def test_folds_in_processes_equal_folds_in_sequence():
    spec = cal.FitSpec(per_type=False, fit_globals=("mem_eff",), rounds=1, envelope_space=None)
    measured = [cal.Observation(o.arch, o.batch, o.gpu_type, o.gpu, o.intra_link, o.nodes, o.gpus_per_node, 2.0)
                for o in CASES]
    one = cal.leave_one_type_out(measured, CostParams(), spec, held=["a10", "a40"])
    two = cal.leave_one_type_out(measured, CostParams(), spec, held=["a10", "a40"], jobs=2)
    assert sorted(one) == ["a10", "a40"]
    assert {k: v.params for k, v in one.items()} == {k: v.params for k, v in two.items()}


def _moe_terms(expert_parallel: bool, *, nodes: int, gpn: int, dp: int, tp: int = 1, model: str = "moe-1.3B"):
    p = CostParams(moe_einsum_group=2048, moe_expert_parallel=expert_parallel)
    arch, gpu = get_arch(model), BUILTIN_GPUS["a100-40gb"]
    table = cost_table(arch, p)
    return table, layer_terms(table, gpu, links_for(gpu, None, p), nodes=nodes, gpus_per_node=gpn, batch=64, dp=dp,
                              tp=tp, m=2, recompute=False)


def test_expert_parallelism_shards_experts_and_prices_their_all_to_all():
    (plain_t, plain), (ep_t, ep) = _moe_terms(False, nodes=1, gpn=4, dp=4), _moe_terms(True, nodes=1, gpn=4, dp=4)
    moe = np.array([k == "moe_block" for k in ep_t.kinds])
    experts = ep_t.expert_params
    assert moe.any() and (experts[moe] > 0).all() and (experts[~moe] == 0).all()
    # a rank keeps a quarter of the experts' weights (and of their optimizer state), the rest as before
    assert np.allclose(plain.static_bytes - ep.static_bytes, experts * 0.75 * 16)
    assert np.allclose(plain.optim[1] - ep.optim[1], experts * 0.75 * 16 * 2 / (1555e9))
    # only the weights replicated over dp are all-reduced: the experts' gradients stay on their rank
    grads = lambda t: t.allreduce[3]  # noqa: E731 - intra-node bytes / bandwidth, per layer
    assert np.allclose(grads(ep)[~moe], grads(plain)[~moe]) and (grads(ep)[moe] < 0.2 * grads(plain)[moe]).all()
    # the all-to-all is paid per micro-batch on the intra-node link, only by MoE layers
    extra = ep.step[3] - plain.step[3]
    assert (extra[moe] > 0).all() and np.allclose(extra[~moe], 0.0)
    assert np.allclose(ep.step[4], plain.step[4])
    # across nodes (dp x tp larger than a node) it moves to the network rate
    _, plain2 = _moe_terms(False, nodes=2, gpn=4, dp=8)
    _, ep2 = _moe_terms(True, nodes=2, gpn=4, dp=8)
    assert (ep2.step[4] - plain2.step[4])[moe].min() > 0 and np.allclose(ep2.step[3], plain2.step[3])


def test_expert_parallelism_changes_nothing_without_dp_or_experts():
    for kw in (dict(nodes=1, gpn=4, dp=1, tp=4), dict(nodes=1, gpn=2, dp=2, model="bert-760M")):
        (_, plain), (_, ep) = _moe_terms(False, **kw), _moe_terms(True, **kw)
        for f in ("step", "p2p", "allreduce", "optim", "static_bytes", "act_bytes", "peak_bytes", "microbatch"):
            assert np.allclose(getattr(plain, f), getattr(ep, f)), (kw, f)


def test_sharded_optimizer_state_keeps_a_dp_share_of_the_replicated_weights_state():
    arch, gpu = get_arch("bert-760M"), BUILTIN_GPUS["a40"]
    kw = dict(nodes=1, gpus_per_node=4, batch=64, m=2, recompute=False, tp=1)

    def terms(sharded, dp):
        p = CostParams(optimizer_sharded=sharded)
        return layer_terms(cost_table(arch, p), gpu, links_for(gpu, None, p), dp=dp, **kw)

    full, sharded = terms(False, 4), terms(True, 4)
    params = cost_table(arch, CostParams()).params
    # 12 of a parameter's 16 bytes (master weights, Adam moments) split four ways; time terms unchanged
    assert np.allclose(full.static_bytes - sharded.static_bytes, params * 12 * 0.75)
    assert (sharded.optim[1] < full.optim[1]).all() and np.allclose(sharded.step, full.step)
    assert np.allclose(terms(True, 1).static_bytes, terms(False, 1).static_bytes)


def test_pipeline_boundaries_on_the_network_once_the_job_spans_nodes():
    arch, gpu = get_arch("bert-760M"), BUILTIN_GPUS["a40"]

    def p2p(crosses, nodes):
        p = CostParams(pipeline_crosses_nodes=crosses)
        return layer_terms(cost_table(arch, p), gpu, links_for(gpu, None, p), nodes=nodes, gpus_per_node=2, batch=64,
                           dp=1, tp=1, m=2, recompute=False).p2p

    group, crossing = p2p(False, 2), p2p(True, 2)  # one-GPU stages: no stage group fills a node
    assert (group[4] == 0).all() and (group[3] > 0).any()
    assert (crossing[3] == 0).all() and np.allclose(crossing[4] > 0, group[3] > 0)
    assert np.array_equal(p2p(True, 1), p2p(False, 1))  # one node: nothing crosses


def test_bench_base_variants_set_cost_params_fields_or_exit_2(monkeypatch, capsys):
    mod = _bench_estimator(monkeypatch)
    p = mod.with_fields(mod.ARENA_BASE, ["moe_expert_parallel=true", "mem_eff=0.5"])
    assert p.moe_expert_parallel and p.mem_eff == 0.5 and p.moe_einsum_group == mod.ARENA_BASE.moe_einsum_group
    for bad in ("nope=1", "moe_expert_parallel=maybe", "mem_eff=-1"):
        assert mod.main(["--loto-only", "--base", bad]) == 2
        assert bad.split("=")[0] in capsys.readouterr().err
    assert mod.main(["--loto-only", "--envelope-weight", "-1"]) == 2
    assert "--envelope-weight" in capsys.readouterr().err


def _pure_dp_times(family_s: dict[str, float], gpu: str = "a40", level: float = 2.0) -> list:
    """Per-plan compute times of pure data-parallel plans whose GPU-seconds grow as (1 + s / b)."""
    from arena_opt.perf.table import PlanComputeTime

    out = []
    for model, s in (("bert-760M", family_s["bert"]), ("wide_resnet-500M", family_s["wide_resnet"])):
        for batch in (256, 512):
            for dp in (1, 2, 4, 8):
                b = batch / dp / 16  # Arena's 16 micro-batches
                out.append(PlanComputeTime(model, batch, gpu, 1, dp, 1, level * batch * (1 + s / b) / dp))
    return out


def test_saturation_is_recovered_from_per_plan_compute_times():
    times = _pure_dp_times({"bert": 0.05, "wide_resnet": 3.5})
    # plans with a pipeline or tp do not enter (their compute is not a pure micro-batch effect)
    from arena_opt.perf.table import PlanComputeTime

    times.append(PlanComputeTime("bert-760M", 256, "a40", 1, 2, 2, 1e-6))
    sat = cal.fit_saturation(times)
    assert sat["bert"] == pytest.approx(0.05, rel=0.02)
    assert sat["wide_resnet"] == pytest.approx(3.5, rel=0.02)
    # a grid's own level (the GPU type's speed) does not move it
    assert cal.fit_saturation(_pure_dp_times({"bert": 0.05, "wide_resnet": 3.5}, level=7.0)) == sat


def test_held_saturation_is_taken_from_plan_times_of_the_training_types_only():
    spec = cal.FitSpec(per_type=False, fit_globals=("saturation_samples",), rounds=1, envelope_space=None)
    cases = _measured(CASES, CostParams(default_compute_eff=0.4), cal.ARENA_SPACE)
    times = _pure_dp_times({"bert": 0.05, "wide_resnet": 3.5}, gpu="a10")
    times += _pure_dp_times({"bert": 9.0, "wide_resnet": 9.0}, gpu="a40")  # only the a40 fold must not see these
    folds = cal.leave_one_type_out(cases, CostParams(), spec, held=["a40", "v100-32gb"], plan_times=times)
    assert folds["a40"].params.saturation_samples["wide_resnet"] == pytest.approx(3.5, rel=0.02)
    assert folds["v100-32gb"].params.saturation_samples["wide_resnet"] > 3.5 * 1.2
    # held families are not fitted; a family without plan times still is
    assert "saturation_samples:wide_resnet" not in folds["a40"].fitted
    assert "saturation_samples:moe" in folds["a40"].fitted


def test_smaller_micro_batches_cost_more_with_saturation():
    """The held saturation prices the micro-batch count the planner turns: at one batch, more micro-batches
    (fewer samples each) cost more compute, and a larger saturation costs more."""
    arch, gpu = get_arch("wide_resnet-500M"), BUILTIN_GPUS["a40"]

    def compute(s, m):
        p = CostParams(saturation_samples={"wide_resnet": s})
        t, links = cost_table(arch, p), links_for(gpu, None, p)
        lc = layer_costs(t, gpu, "a40", links, params=p, nodes=1, gpus_per_node=1, batch=256, dp=1, tp=1, m=m,
                         recompute=False)
        return m * lc.step_s.sum()

    assert compute(3.5, 4) < compute(3.5, 16) < compute(3.5, 64)
    assert compute(0.1, 16) < compute(3.5, 16)


def test_plan_compute_times_load_and_name_a_bad_field(tmp_path):
    from arena_opt.errors import InputError
    from arena_opt.perf.table import load_plan_compute_times

    head = "flavour,model,param_size,batch_size,gpu_type,num_nodes,gpus_per_node,pp,dp,tp,iter_time_s,comp_time_s,status\n"
    good = "arena_estimated,bert,760M,128,a100,1,2,1.0,2.0,1.0,3.5,3.1,ok\n"
    other = "alpa_optimal,bert,760M,128,a100,1,2,,,,3.4,,ok\n"
    p = tmp_path / "t.csv"
    p.write_text(head + good + other)
    (row,) = load_plan_compute_times(p)
    assert (row.model, row.gpu_type, row.dp, row.comp_s) == ("bert-760M", "a100-40gb", 2, 3.1)
    p.write_text(head + good.replace(",2.0,", ",-2,"))
    with pytest.raises(InputError, match=r"t.csv:2: field dp"):
        load_plan_compute_times(p)


def _bench_estimator(monkeypatch):
    import importlib.util
    import sys
    from pathlib import Path

    bench = Path(__file__).resolve().parents[1] / "bench"
    monkeypatch.setattr(sys, "path", [*sys.path, str(bench)])  # after the runners package
    spec = importlib.util.spec_from_file_location("bench_estimator", bench / "estimator.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_arena_a40_rows_are_priced_on_pcie(monkeypatch, tmp_path):
    """Arena's A40 pairs all-reduce at PCIe speed: the bench's observations price their intra-node traffic on
    PCIe, the A100s' on NVLink, so a dp all-reduce inside an A40 node costs more than the catalog's bridge."""
    mod = _bench_estimator(monkeypatch)
    head = "flavour,model,param_size,batch_size,gpu_type,num_nodes,gpus_per_node,iter_time_s,status\n"
    p = tmp_path / "t.csv"
    p.write_text(head + "alpa_optimal,bert,760M,128,a40,1,2,7.5,ok\nalpa_optimal,bert,760M,128,a100,1,2,3.4,ok\n")
    _, rows = mod.measured_observations(p)
    by_type = {o.gpu_type: o for o in rows}
    assert by_type["a40"].intra_link == "pcie" and by_type["a100-40gb"].intra_link is None
    o = by_type["a40"]
    cost = {}
    for link in (None, o.intra_link):
        links = links_for(o.gpu, link, CostParams())
        lc = layer_costs(cost_table(o.arch, CostParams()), o.gpu, "a40", links, params=CostParams(), nodes=1,
                         gpus_per_node=2, batch=128, dp=2, tp=1, m=1, recompute=False)
        cost[link] = lc.allreduce_s.sum()
    assert cost["pcie"] > 1.5 * cost[None]


def _law(peak, a=0.45, k=0.2):
    return a * (peak / 100.0) ** k


def test_unseen_type_follows_the_fitted_types_peak_trend():
    types = ("a10", "a40", "a100-40gb")
    fitted = CostParams(compute_eff={t: _law(BUILTIN_GPUS[t].peak_tflops) for t in types}, default_compute_eff=0.9)
    rows = [obs("bert-760M", t, 1, 1) for t in types for _ in range(2)]
    p = cal.peak_trend(fitted, rows)
    assert p.compute_eff_peak_exponent == pytest.approx(0.2) and p.default_compute_eff == pytest.approx(0.45)
    assert p.compute_eff_peak_range == (125.0, 312.0)
    assert p.eff("l20", 119.5) == pytest.approx(_law(119.5))  # inside the reach: on the trend
    assert p.eff("a40", BUILTIN_GPUS["a40"].peak_tflops) == fitted.compute_eff["a40"]  # a fitted type keeps its own
    # an H100 (989 TFLOP/s) lies 3.2x beyond the fitted 312: priced at the edge of the reach, not extrapolated
    edge = _law(312.0 * PEAK_TREND_REACH)
    assert p.eff("h100-80gb", 989.0) == pytest.approx(edge) and edge < 0.95 * _law(989.0)
    assert p.eff("h100-80gb", 989.0, "fp32") == pytest.approx(edge * p.fp32_eff_scale)
    assert p.eff("slow", 10.0) == pytest.approx(_law(125.0 / PEAK_TREND_REACH))
    # each type weighs by its rows: more rows of a type off the line pull the line towards it
    off = fitted.model_copy(update={"compute_eff": {**fitted.compute_eff, "a10": 0.3}})
    few = cal.peak_trend(off, rows)
    many = cal.peak_trend(off, rows + [obs("bert-760M", "a10", 1, 1)] * 8)
    assert many.eff("x", 125.0) < few.eff("x", 125.0) and many.eff("x", 125.0) > 0.3


def test_the_reach_covers_what_the_a100_fold_checked():
    # the fold without the A100 reads the trend at the A100's peak, from the other three types' range; that
    # reading is what bench/estimator.py validates, so the reach must include it
    others = max(BUILTIN_GPUS[t].peak_tflops for t in ("a10", "a40", "v100-32gb"))
    assert BUILTIN_GPUS["a100-40gb"].peak_tflops / others <= PEAK_TREND_REACH


def test_unseen_efficiency_stays_inside_the_fit_bounds():
    steep = CostParams(default_compute_eff=0.05, compute_eff_peak_exponent=-1.0)
    assert steep.eff("h100-80gb", 989.0) == EFF_BOUNDS[0]  # 0.05 * 100 / 989 would be 0.005
    flat = CostParams(default_compute_eff=0.9, compute_eff_peak_exponent=1.0)
    assert flat.eff("h100-80gb", 989.0) == EFF_BOUNDS[1]


def _too_big(n: int, gpu_type: str = "a10") -> list:
    """n rows of a 27B-parameter MoE on one A10 (24 GB), named `gpu_type`: no plan fits, whatever their time"""
    return [cal.Observation(get_arch("moe-27B"), 256, gpu_type, BUILTIN_GPUS["a10"], None, 1, 1, 100.0)] * n


def _fit_without_and_with(extra: list) -> tuple[CostParams, CostParams]:
    """the per-type fit of CASES on their trend's law, without and with `extra` rows"""
    truth = CostParams(compute_eff={o.gpu_type: _law(o.gpu.peak_tflops) for o in CASES})
    cases = _measured(CASES, truth, cal.ARENA_SPACE)
    assert not any(np.isfinite(t) for t, _ in cal.predict(extra[:1], truth, cal.ARENA_SPACE))
    spec = cal.FitSpec(fit_globals=(), rounds=1, envelope_space=None)
    return cal.fit(cases, CostParams(), spec).params, cal.fit(cases + extra, CostParams(), spec).params


def test_rows_no_plan_covers_do_not_weigh_in_the_trend():
    plain, padded = _fit_without_and_with(_too_big(12))
    assert padded.compute_eff_peak_exponent == pytest.approx(plain.compute_eff_peak_exponent, rel=1e-9)
    assert padded.default_compute_eff == pytest.approx(plain.default_compute_eff, rel=1e-9)


def test_a_type_no_plan_covers_is_priced_by_the_trend_not_by_its_prior():
    # a lab's own A10s whose only rows are a model too big for one of them: the fit has no evidence of their
    # efficiency, so they must not come out with one fitted to the prior and be priced as if measured
    plain, padded = _fit_without_and_with(_too_big(4, "a10-lab"))
    assert "a10-lab" not in padded.compute_eff and set(padded.compute_eff) == set(plain.compute_eff)
    peak = BUILTIN_GPUS["a10"].peak_tflops
    assert padded.eff("a10-lab", peak) == pytest.approx(plain.eff("a10-lab", peak), rel=1e-9)


def test_a_fit_with_no_row_any_plan_covers_is_refused():
    with pytest.raises(ValueError, match="none of the 3 observations has a plan that fits in memory"):
        cal.fit(_too_big(3), CostParams(), cal.FitSpec(fit_globals=(), rounds=1, envelope_space=None))


def test_a_fit_needs_at_least_one_round():
    with pytest.raises(ValueError, match="rounds must be at least 1, got 0"):
        cal.FitSpec(rounds=0)


def test_an_inverted_peak_range_is_refused_by_name():
    with pytest.raises(ValueError, match=r"compute_eff_peak_range must be \(lowest, highest\), got \[312.0, 125.0\]"):
        CostParams(compute_eff_peak_range=(312.0, 125.0))
    assert CostParams(compute_eff_peak_range=(125.0, 125.0)).eff("x", 989.0) > 0  # one fitted peak is a range


def test_one_peak_gives_no_trend_and_the_rows_weighted_mean():
    fitted = CostParams(compute_eff={"a10": 0.4, "v100-32gb": 0.6})  # both 125 TFLOP/s
    rows = [obs("bert-760M", "a10", 1, 1)] * 3 + [obs("bert-760M", "v100-32gb", 1, 1)]
    p = cal.peak_trend(fitted, rows)
    assert p.compute_eff_peak_exponent == 0.0
    assert p.default_compute_eff == pytest.approx(np.exp((3 * np.log(0.4) + np.log(0.6)) / 4))
    assert cal.peak_trend(CostParams(), rows) == CostParams()  # nothing fitted: nothing to follow


def test_held_out_type_is_priced_from_the_trend_of_the_others():
    truth = CostParams(compute_eff={o.gpu_type: _law(o.gpu.peak_tflops) for o in CASES})
    cases = _measured(CASES, truth, cal.ARENA_SPACE)
    a100 = BUILTIN_GPUS["a100-40gb"].peak_tflops
    for trend, tol in ((True, 0.03), (False, None)):
        spec = cal.FitSpec(fit_globals=(), rounds=1, envelope_space=None, peak_trend=trend)
        fold = cal.leave_one_type_out(cases, CostParams(), spec, held=["a100-40gb"])["a100-40gb"].params
        err = fold.eff("a100-40gb", a100) / _law(a100) - 1
        if trend:
            assert abs(err) < tol
        else:  # the other types' mean sits 15% and more below the A100's efficiency
            assert err < -0.1


def test_bench_spread_pairs_compare_placements_of_the_same_gpus(monkeypatch):
    mod = _bench_estimator(monkeypatch)

    def row(model, nodes, gpn, measured, planned, gpu="a40"):
        return {"gpu_type": gpu, "model": model, "batch": 128, "nodes": nodes, "gpus_per_node": gpn,
                "measured_s": measured, "planner_s": planned}

    rows = [row("bert-760M", 1, 2, 2.0, 2.0), row("bert-760M", 2, 1, 2.2, 3.0), row("bert-760M", 1, 1, 9.0, 9.0),
            row("bert-1.3B", 1, 2, 4.0, 4.0), row("bert-1.3B", 2, 1, 4.0, 5.0),
            row("gpt-1.3B", 1, 2, 4.0, float("inf")), row("gpt-1.3B", 2, 1, 1.0, 1.0),  # no plan: no pair
            row("bert-760M", 1, 2, 2.0, 2.0, "a10")]  # no spread placement of this type
    assert mod.spread_pairs(rows) == [{"gpu_type": "a40", "packed": "1x2", "spread": "2x1", "pairs": 2,
                                       "measured_ratio": pytest.approx(1.05), "planner_ratio": pytest.approx(1.375)}]
