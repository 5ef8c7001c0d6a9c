"""Composition of plans from (synthetic) profiles, checked against iteration times computed by
hand; profiles feeding the planner; roofline transfer between GPU types."""

from dataclasses import replace

import numpy as np
import pytest

from arena_opt.gpus import BUILTIN_GPUS
from arena_opt.perf.comm import AlphaBeta
from arena_opt.perf.analytical import CostParams
from arena_opt.perf.estimator import GridShape, PerfEstimator
from arena_opt.plan import Plan
from arena_opt.perf.profile_costs import CommModel, Topology, layer_costs, plan_time
from arena_opt.perf.profile_db import LayerProfile, LayerSample, ModelProfile, ProfileDB
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
    from arena_opt.perf.profile_source import ProfileSource

    src = ProfileSource(db)
    lc = src(ARCH, "h200", gpu, src_links(gpu), nodes=1, gpus_per_node=2, batch=8, dp=r.plan.dp, tp=r.plan.tp,
             m=r.plan.num_microbatches, recompute=r.plan.recompute)
    from arena_opt.perf.compose import evaluate_split

    assert r.iter_time_s == pytest.approx(evaluate_split(lc, r.plan.stages, r.plan.num_microbatches).iter_time_s)
    # milliseconds of measured layers, not the analytical model's microseconds for this tiny model (the
    # uncalibrated one: the calibrated default adds its fixed per-micro-batch slot cost, whatever the layers)
    analytical = PerfEstimator(CostParams(), table_mode="off").grid(ARCH, 8, gpu, None, GridShape("h200", 1, 2, 1)).proxy
    assert r.iter_time_s > 100 * analytical.iter_time_s
    other = ARCH.model_copy(update={"name": "tiny-gpt-2"})
    assert est.grid(other, 8, gpu, None, GridShape("h200", 1, 2, 1)).proxy.iter_time_s == pytest.approx(
        PerfEstimator(table_mode="off").grid(other, 8, gpu, None, GridShape("h200", 1, 2, 1)).proxy.iter_time_s)


def test_planner_charges_the_optimizer_call_once_per_stage():
    from arena_opt.perf.compose import evaluate_split
    from arena_opt.perf.profile_source import ProfileSource

    call = 3 * MS
    db = ProfileDB(models=[fsdp_profile(call).model_copy(update={"device": "cuda", "device_name": "NVIDIA H200"})])
    gpu = BUILTIN_GPUS["h200"]
    lc = ProfileSource(db)(ARCH, "h200", gpu, src_links(gpu), nodes=1, gpus_per_node=2, batch=8, dp=1, tp=1, m=2,
                           recompute=False)
    assert lc.stage_s == call
    one = evaluate_split(lc, [(0, 4)], 2)
    two = evaluate_split(lc, [(0, 2), (2, 4)], 2)
    without = replace(lc, stage_s=0.0)
    assert one.iter_time_s == pytest.approx(evaluate_split(without, [(0, 4)], 2).iter_time_s + call)
    assert two.iter_time_s == pytest.approx(evaluate_split(without, [(0, 2), (2, 4)], 2).iter_time_s + call)


def src_links(gpu):
    from arena_opt.perf.analytical import CostParams, links_for

    return links_for(gpu, None, CostParams())


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_profile_transfers_to_another_gpu_by_roofline_loads(dtype):
    """At the profile's own precision: a bf16 profile (the runners' precision on GPUs) moves by tensor-core
    peaks, an fp32 one by CUDA-core peaks; the two ratios differ (H200/A10: 7.9x bf16, 4.3x fp32)."""
    from arena_opt.perf.analytical import cost_table, peak_flops, roofline_load_s
    from arena_opt.perf.profile_source import ProfileSource, gpu_type_of, params_at
    from models.catalog import get_arch

    assert gpu_type_of("NVIDIA H200") == "h200"
    assert gpu_type_of("NVIDIA A100-SXM4-40GB") == "a100-40gb"
    db = ProfileDB(models=[profile(device="cuda", device_name="NVIDIA H200").model_copy(update={"dtype": dtype})])
    src = ProfileSource(db)
    h200, a10 = BUILTIN_GPUS["h200"], BUILTIN_GPUS["a10"]
    kw = dict(nodes=1, gpus_per_node=1, batch=4, dp=1, tp=1, m=1, recompute=False)
    on_h200 = src(ARCH, "h200", h200, src_links(h200), **kw)
    on_a10 = src(ARCH, "a10", a10, src_links(a10), **kw)
    table = cost_table(ARCH, params_at(dtype))
    assert table.dtype == dtype
    ratio = roofline_load_s(table, a10, micro_batch_size=4) / roofline_load_s(table, h200, micro_batch_size=4)
    assert on_a10.step_s == pytest.approx(on_h200.step_s * ratio)
    assert (ratio > 1).all()
    # a full-size model at 64 samples: in fp32 its matrix products are bound by the CUDA-core peaks (4.3x);
    # in bf16 the tensor cores are 7.9x apart and every layer is bound by the bandwidths (8x)
    big = {d: cost_table(get_arch("gpt-350M"), params_at(d)) for d in ("fp32", "bf16")}
    loads = {d: roofline_load_s(t, a10, micro_batch_size=64) / roofline_load_s(t, h200, micro_batch_size=64)
             for d, t in big.items()}
    assert loads["fp32"].min() == pytest.approx(peak_flops(h200, "fp32") / peak_flops(a10, "fp32"), rel=1e-6)
    assert loads["bf16"].min() == pytest.approx(h200.mem_bw_gbs / a10.mem_bw_gbs, rel=1e-6)


# ---------------------------------------------------------------- runtime pieces measured on one device


def fsdp_profile(call=0.0):
    """`profile()` plus FSDP2 (dp = 2) samples at tp 1: forward 1.5x, backward 1.25x the plain layer,
    sync work 2 ms, optimizer 0.4 ms on the shard, and an optimizer call cost."""
    base = profile()
    layers = []
    for lp in base.layers:
        extra = [s.model_copy(update={"dp": 2, "fwd_s": 1.5 * s.fwd_s, "bwd_s": 1.25 * s.bwd_s, "sync_s": 2 * MS,
                                      "optim_s": 0.4 * MS}) for s in lp.samples if s.tp == 1]
        layers.append(lp.model_copy(update={"samples": lp.samples + extra}))
    return base.model_copy(update={"layers": layers, "optim_call_s": call})


def test_fsdp_plan_uses_the_measured_fsdp_samples_and_one_optimizer_call_per_stage():
    # pp 2 x dp 2 x tp 1 (FSDP2), b = 8 / (2 * 2) = 2: the dp = 2 samples at b = 2 are
    # fwd 1.5 * (fwd at b=2), bwd 1.25 * (bwd at b=2) (profile(): at b = 2 fwd/bwd are the base values)
    call = 0.1 * MS
    plan = Plan(pp=2, dp=2, tp=1, num_microbatches=2, stages=[(0, 2), (2, 4)])
    res = plan_time(fsdp_profile(call), plan, 8, comm(), Topology())
    embed = 1.5 * 1 * MS + 1.25 * 2 * MS + 2 * ag(1000 * 4)
    block = 1.5 * 10 * MS + 1.25 * 20 * MS + 2 * ag(2000 * 4)
    head = 1.5 * 5 * MS + 1.25 * 10 * MS + 2 * ag(500 * 4)
    h = 2 * 4 * 8 * 4
    t0 = embed + block + 2 * (ALPHA + h / BW)
    t1 = block + head
    # tail per layer: reduce-scatter + sync work + measured shard optimizer step less the call cost
    tail = {p: ag(p * 4) + 2 * MS + (0.4 * MS - call) for p in (1000, 2000, 500)}
    expected = max(3 * t0 + tail[1000] + tail[2000], 3 * t1 + tail[2000] + tail[500]) + call
    assert res.stage_time_s == pytest.approx([t0, t1], rel=1e-12)
    assert res.iter_time_s == pytest.approx(expected, rel=1e-12)


def test_profile_without_fsdp_samples_falls_back_to_the_sharded_optimizer():
    plan = Plan(pp=2, dp=2, tp=1, num_microbatches=2, stages=[(0, 2), (2, 4)])
    lc = layer_costs(profile(), comm(), Topology(), batch=8, dp=2, tp=1, m=2, pp=2)
    assert lc.optim_s == pytest.approx([0.25 * MS] * 4)  # 0.5 ms measured step / dp
    lc2 = layer_costs(fsdp_profile(), comm(), Topology(), batch=8, dp=2, tp=1, m=2, pp=2)
    assert lc2.optim_s == pytest.approx([2.4 * MS] * 4)  # sync 2 ms + shard step 0.4 ms
    assert plan.num_gpus == 4


def _uniform_parts(n_layers, fwd, bwd, tail=0.0, comm_f=0.0):
    from arena_opt.perf.profile_costs import LayerParts

    z = np.zeros(n_layers)
    return LayerParts(fwd_s=z + fwd, bwd_s=z + bwd, comm_fwd_s=z + comm_f, comm_bwd_s=z.copy(), p2p_s=z.copy(),
                      dp_s=z.copy(), tail_cpu_s=z + tail, comm_cpu_fwd_s=z.copy(), comm_wait_fwd_s=z + comm_f,
                      comm_cpu_bwd_s=z.copy(), comm_wait_bwd_s=z.copy(), dp_cpu_s=z.copy(), dp_wait_s=z.copy(),
                      static_bytes=z.copy(), act_bytes=z.copy(), peak_bytes=z.copy(), call_s=0.0)


def test_processor_sharing_schedule_by_hand():
    from arena_opt.perf.profile_costs import ps_schedule

    # 2 stages of one layer each, forward 1 s, backward 2 s, 2 micro-batches, no communication.
    parts = _uniform_parts(2, 1.0, 2.0)
    # a core per rank: the 1F1B closed form (m + pp - 1) * (F + B) = 3 * 3
    assert ps_schedule(parts, [(0, 1), (1, 2)], 2, 1, cores=2) == pytest.approx(9.0)
    # one core for both ranks: F0 alone (1), F1 | F0' shared (2), B0' alone (2), B0 | F1' shared (2),
    # B0 | B1' shared (2), B1' alone (1), B1 alone (2): 12 = all the work on one core, nothing idle
    assert ps_schedule(parts, [(0, 1), (1, 2)], 2, 1, cores=1) == pytest.approx(12.0)
    # no pipelining, 4 ranks on 2 cores: compute at half speed, waits (collectives) at full speed
    flat = _uniform_parts(1, 1.0, 2.0, tail=0.5, comm_f=0.25)
    assert ps_schedule(flat, [(0, 1)], 2, 4, cores=2) == pytest.approx(2 * (1 / 0.5 + 0.25 + 2 / 0.5) + 0.5 / 0.5)
    # a background load of one busy core among 2 cores for 1 rank: 2 / (1 + 1) = full speed still
    assert ps_schedule(flat, [(0, 1)], 2, 1, cores=2, background=1.0) == pytest.approx(2 * 3.25 + 0.5)


def test_plan_time_on_a_shared_host_is_the_processor_sharing_schedule():
    from arena_opt.perf.profile_costs import layer_parts, ps_schedule

    plan = Plan(pp=1, dp=4, tp=1, num_microbatches=1)
    topo = Topology(cores=2)
    parts = layer_parts(profile(), comm(), topo, batch=8, dp=4, tp=1, m=1, pp=1)
    t = plan_time(profile(), plan, 8, comm(), topo).iter_time_s
    assert t == pytest.approx(ps_schedule(parts, [(0, 4)], 1, 4, cores=2))
    # no pipeline: the processor-sharing run equals compute x world / cores plus the rest
    lc = layer_costs(profile(), comm(), topo, batch=8, dp=4, tp=1, m=1, pp=1)
    assert t == pytest.approx(lc.step_s.sum() + lc.allreduce_s.sum() + 2 * lc.optim_s.sum())


def test_collective_cpu_time_competes_for_cores():
    from arena_opt.perf.profile_costs import ps_schedule

    # measured on 2 cores: all-reduce over 4 ranks, wall alpha-beta ALPHA / BW, per-rank CPU 0.5 ms per
    # alpha step and bandwidth 2 GB/s -> at 4 ranks on 2 cores, wall = cpu * 2 + wait
    cpu_ab = AlphaBeta(alpha_s=0.5 * MS, bandwidth_bps=2e9)
    cm = CommModel(comm().fits, {}, {("loopback", "all_reduce", None): (cpu_ab, 2)})
    h = 1e6
    wall, cpu, wait = cm.split("all_reduce", h, 4, "loopback")
    assert wall == pytest.approx(ar(h, 4))
    assert cpu == pytest.approx(6 * 0.5 * MS + 1.5 * h / 2e9)
    assert wait == pytest.approx(wall - 2 * cpu)
    # 2 ranks on 2 cores: each has a core, wall = cpu + wait
    wall2, cpu2, wait2 = cm.split("all_reduce", h, 2, "loopback")
    assert wait2 == pytest.approx(wall2 - cpu2) and cpu2 > 0
    # a CPU fit larger than the wall time allows is capped: no negative wait
    greedy = CommModel(comm().fits, {}, {("loopback", "all_reduce", None): (AlphaBeta(alpha_s=1.0, bandwidth_bps=1e9), 2)})
    assert greedy.split("all_reduce", h, 4, "loopback") == pytest.approx((ar(h, 4), ar(h, 4) / 2, 0.0))
    # in the schedule the CPU part is shared with computing ranks, the wait part is not
    from arena_opt.perf.profile_costs import LayerParts

    z = np.zeros(1)

    lp = LayerParts(fwd_s=z + 1.0, bwd_s=z + 2.0, comm_fwd_s=z + 0.5, comm_bwd_s=z.copy(), p2p_s=z.copy(),
                    dp_s=z.copy(), tail_cpu_s=z.copy(), comm_cpu_fwd_s=z + 0.2, comm_wait_fwd_s=z + 0.1,
                    comm_cpu_bwd_s=z.copy(), comm_wait_bwd_s=z.copy(), dp_cpu_s=z.copy(), dp_wait_s=z.copy(),
                    static_bytes=z.copy(), act_bytes=z.copy(), peak_bytes=z.copy(), call_s=0.0)
    # 4 ranks, 2 cores: (1 + 0.2) * 2 + 0.1 forward, 2 * 2 backward
    assert ps_schedule(lp, [(0, 1)], 1, 4, cores=2) == pytest.approx(1.2 * 2 + 0.1 + 4.0)


def test_schedule_share_and_the_host_background_that_explains_a_measured_share():
    from arena_opt.perf.profile_costs import host_background, schedule_share

    one = Plan(pp=1, dp=1, tp=1, num_microbatches=1)
    topo = Topology(cores=2)
    # one rank on 2 cores alone: a full core; with b other runnable tasks 2 / (1 + b) of one
    assert schedule_share(profile(), one, 8, comm(), topo) == pytest.approx(1.0)
    assert schedule_share(profile(), one, 8, comm(), replace(topo, background=3.0)) == pytest.approx(0.5)
    assert host_background(profile(), one, 8, comm(), topo, 0.5) == pytest.approx(3.0, rel=1e-6)
    # and the time on that host is the dedicated one at half speed for compute, waits unchanged
    t0 = plan_time(profile(), one, 8, comm(), topo).iter_time_s
    t3 = plan_time(profile(), one, 8, comm(), replace(topo, background=3.0)).iter_time_s
    assert t3 == pytest.approx(2 * t0)  # no collectives at one rank: everything is compute
    # ranks that got at least their share alone: no other tenants
    four = Plan(pp=1, dp=4, tp=1, num_microbatches=1)
    alone = schedule_share(profile(), four, 8, comm(), topo)
    assert alone == pytest.approx(0.5)  # 4 ranks on 2 cores, all computing at once
    assert host_background(profile(), four, 8, comm(), topo, alone) == 0.0
    assert host_background(profile(), four, 8, comm(), topo, 0.9) == 0.0
    # round trip on a pipelined plan: the background found reproduces the share it was given
    pp2 = Plan(pp=2, dp=1, tp=1, num_microbatches=4)
    want = schedule_share(profile(), pp2, 8, comm(), replace(topo, background=1.7))
    assert want < 1.0
    bg = host_background(profile(), pp2, 8, comm(), topo, want)
    assert bg == pytest.approx(1.7, rel=1e-4)


def test_whole_stack_correction_scales_compute_at_the_plans_micro_batch_only_when_asked():
    from arena_opt.perf.profile_costs import layer_parts
    from arena_opt.perf.profile_db import StackSample

    prof = profile()
    assert prof.stack == [] and prof.stack_scale(3) == 1.0  # an old profile: no correction
    stacked = prof.model_copy(update={"stack": [StackSample(micro_batch=4, stack_s=0.9, layers_s=1.0),
                                                StackSample(micro_batch=2, stack_s=0.6, layers_s=1.0)]})
    assert stacked.stack_scale(2) == pytest.approx(0.6) and stacked.stack_scale(4) == pytest.approx(0.9)
    assert stacked.stack_scale(3) == pytest.approx(0.75)  # linear between the sizes
    assert stacked.stack_scale(1) == pytest.approx(0.6) and stacked.stack_scale(16) == pytest.approx(0.9)
    topo = Topology(intra="loopback", cores=2)
    kw = dict(batch=8, dp=2, tp=1, m=2, pp=1)  # micro-batch 2
    plain, off, on = (layer_parts(p, comm(), topo, **kw, stack=st) for p, st in
                      ((prof, True), (stacked, False), (stacked, True)))
    np.testing.assert_allclose(off.fwd_s, plain.fwd_s)  # off by default and without samples
    np.testing.assert_allclose(on.fwd_s, 0.6 * plain.fwd_s)
    np.testing.assert_allclose(on.bwd_s, 0.6 * plain.bwd_s)
    np.testing.assert_allclose(on.tail_cpu_s, plain.tail_cpu_s)  # the optimizer is not layer compute
    np.testing.assert_allclose(on.dp_cpu_s, plain.dp_cpu_s)  # nor the gradient all-reduce
