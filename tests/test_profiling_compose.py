"""Composition of plans from (synthetic) profiles, checked against iteration times computed by
hand; profiles feeding the planner; roofline transfer between GPU types."""

import pytest

from arena_opt.gpus import BUILTIN_GPUS
from arena_opt.perf.comm import AlphaBeta
from arena_opt.perf.estimator import GridShape, PerfEstimator
from arena_opt.plan import Plan
from arena_opt.profiling.compose import CommModel, Topology, layer_costs, plan_time
from arena_opt.profiling.db import LayerProfile, LayerSample, ModelProfile, ProfileDB
from models.catalog import Arch

# 4 layers: embed, block, block, head; seq 4, hidden 8 -> one micro-batch of b samples carries
# b * 4 * 8 * 4 bytes of fp32 activations
ARCH = Arch(name="tiny-gpt", family="gpt", num_layers=2, hidden=8, heads=2, vocab=16, seq_len=4)
MS = 1e-3
ALPHA, BW = 1e-3, 1e9


def sample(tp, b, fwd, bwd, params, out_bytes, optim=0.5 * MS, act=1000):
    return LayerSample(tp=tp, micro_batch=b, fwd_s=fwd, bwd_s=bwd, optim_s=optim, act_bytes=act * b,
                       out_bytes=out_bytes, params=params)


def profile(device="cpu", device_name="test cpu", scale=1.0):
    def s(tp, b, fwd, bwd, params, out):
        return sample(tp, b, fwd * scale, bwd * scale, params, out)

    layers = []
    for kind, idx, fwd, bwd, params in (("embed", [0], 1 * MS, 2 * MS, 1000), ("block", [1, 2], 10 * MS, 20 * MS, 2000),
                                        ("head", [3], 5 * MS, 10 * MS, 500)):
        samples = []
        for tp in (1, 2):
            for b in (2, 4):
                out = b * 4 * (16 // tp if kind == "head" else 8) * 4
                # time linear in b through the measured points: at b, fwd * b / 2
                samples.append(s(tp, b, fwd * b / 2 / tp, bwd * b / 2 / tp, params // tp, out))
        layers.append(LayerProfile(indices=idx, kind=kind, samples=samples))
    return ModelProfile(model=ARCH.name, arch=ARCH, device=device, device_name=device_name, layers=layers)


def comm():
    ab = AlphaBeta(alpha_s=ALPHA, bandwidth_bps=BW)
    return CommModel({("loopback", c, None): ab for c in ("all_reduce", "all_gather", "reduce_scatter", "p2p")})


def ar(nbytes, n=2):
    return 2 * (n - 1) * ALPHA + 2 * (n - 1) / n * nbytes / BW


def ag(nbytes, n=2):
    return (n - 1) * ALPHA + (n - 1) / n * nbytes / BW


def test_two_stage_tp2_dp2_plan_matches_hand_computation():
    # pp 2 x dp 2 x tp 2, 2 micro-batches of batch 8 -> b = 8 / (2 * 2) = 2 samples per micro-batch
    plan = Plan(pp=2, dp=2, tp=2, num_microbatches=2, stages=[(0, 2), (2, 4)])
    res = plan_time(profile(), plan, 8, comm(), Topology())
    h = 2 * 4 * 8 * 4  # activation bytes at b = 2
    # tp = 2 shard times: fwd / 2, bwd / 2; FSDP (dp with tp): 2 all-gathers of the tp-local params per
    # micro-batch per layer, one reduce-scatter per step; optimizer step of the 1/dp shard
    embed = (1 * MS + 2 * MS) / 2 + ar(h) + 2 * ag(500 * 4)
    block = (10 * MS + 20 * MS) / 2 + 2 * ar(h) + 4 * ar(h) + 2 * ag(1000 * 4)
    head = (5 * MS + 10 * MS) / 2 + ag(2 * 4 * 16 * 4) + ar(h) + 2 * ag(250 * 4)
    p2p = 2 * (ALPHA + h / BW)  # stage 0 sends the block's output and receives its gradient
    t0 = embed + block + p2p
    t1 = block + head
    tail0 = ag(500 * 4) + ag(1000 * 4) + (0.5 * MS + 0.5 * MS) / 2  # reduce-scatter (same factors) + optimizer
    tail1 = ag(1000 * 4) + ag(250 * 4) + (0.5 * MS + 0.5 * MS) / 2
    m, pp = 2, 2
    expected = max((m + pp - 1) * t0 + tail0, (m + pp - 1) * t1 + tail1)
    assert res.stage_time_s == pytest.approx([t0, t1], rel=1e-12)
    assert res.iter_time_s == pytest.approx(expected, rel=1e-12)


def test_ddp_allreduce_once_per_step_and_interpolation():
    # pp 1 x dp 2 x tp 1 (DDP), b = 12 / (2 * 2) = 3: halfway between the measured 2 and 4
    plan = Plan(pp=1, dp=2, tp=1, num_microbatches=2)
    res = plan_time(profile(), plan, 12, comm(), Topology())
    compute = (1 + 2 + 2 * (10 + 20) + 5 + 10) * MS * 3 / 2
    grads = (1000 + 2 * 2000 + 500) * 4
    expected = 2 * compute + ar(grads) + 4 * 0.5 * MS
    assert res.iter_time_s == pytest.approx(expected, rel=1e-12)


def test_core_sharing_scales_compute_only():
    plan = Plan(pp=1, dp=4, tp=1, num_microbatches=1)
    free = layer_costs(profile(), comm(), Topology(cores=None), batch=8, dp=4, tp=1, m=1, pp=1)
    shared = layer_costs(profile(), comm(), Topology(cores=2), batch=8, dp=4, tp=1, m=1, pp=1)
    assert shared.step_s == pytest.approx(2 * free.step_s)
    assert shared.allreduce_s == pytest.approx(free.allreduce_s)
    assert plan.num_gpus == 4


def test_missing_tp_degree_is_a_clear_error():
    from arena_opt.errors import InputError

    with pytest.raises(InputError, match="no tp = 4 samples"):
        layer_costs(profile(), comm(), Topology(), batch=8, dp=1, tp=4, m=1, pp=1)


def test_planner_uses_a_gpu_profile_and_falls_back_without_one():
    db = ProfileDB(models=[profile(device="cuda", device_name="NVIDIA H200")])
    est = PerfEstimator(table_mode="off", profiles=db)
    gpu = BUILTIN_GPUS["h200"]
    r = est.grid(ARCH, 8, gpu, None, GridShape("h200", 1, 2, 1)).proxy
    assert r is not None
    from arena_opt.profiling.source import ProfileSource

    src = ProfileSource(db)
    lc = src(ARCH, "h200", gpu, src_links(gpu), nodes=1, gpus_per_node=2, batch=8, dp=r.plan.dp, tp=r.plan.tp,
             m=r.plan.num_microbatches, recompute=r.plan.recompute)
    from arena_opt.perf.compose import evaluate_split

    assert r.iter_time_s == pytest.approx(evaluate_split(lc, r.plan.stages, r.plan.num_microbatches).iter_time_s)
    # milliseconds of measured layers, not the analytical model's microseconds for this tiny model
    analytical = PerfEstimator(table_mode="off").grid(ARCH, 8, gpu, None, GridShape("h200", 1, 2, 1)).proxy
    assert r.iter_time_s > 100 * analytical.iter_time_s
    other = ARCH.model_copy(update={"name": "tiny-gpt-2"})
    assert est.grid(other, 8, gpu, None, GridShape("h200", 1, 2, 1)).proxy.iter_time_s == pytest.approx(
        PerfEstimator(table_mode="off").grid(other, 8, gpu, None, GridShape("h200", 1, 2, 1)).proxy.iter_time_s)


def src_links(gpu):
    from arena_opt.perf.analytical import CostParams, links_for

    return links_for(gpu, None, CostParams())


def test_profile_transfers_to_another_gpu_by_roofline_loads():
    from arena_opt.perf.analytical import cost_table, roofline_load_s
    from arena_opt.profiling.source import _FP32, ProfileSource, gpu_type_of

    assert gpu_type_of("NVIDIA H200") == "h200"
    assert gpu_type_of("NVIDIA A100-SXM4-40GB") == "a100-40gb"
    db = ProfileDB(models=[profile(device="cuda", device_name="NVIDIA H200")])
    src = ProfileSource(db)
    h200, a10 = BUILTIN_GPUS["h200"], BUILTIN_GPUS["a10"]
    kw = dict(nodes=1, gpus_per_node=1, batch=4, dp=1, tp=1, m=1, recompute=False)
    on_h200 = src(ARCH, "h200", h200, src_links(h200), **kw)
    on_a10 = src(ARCH, "a10", a10, src_links(a10), **kw)
    table = cost_table(ARCH, _FP32)
    ratio = roofline_load_s(table, a10, micro_batch_size=4) / roofline_load_s(table, h200, micro_batch_size=4)
    assert on_a10.step_s == pytest.approx(on_h200.step_s * ratio)
    assert (ratio > 1).all()
