"""The layer profiler on a tiny model: every layer covered once, shard shapes and memory that follow
the tp degree and micro-batch, and `arena-opt profile` writing a loadable database."""

import pytest

torch = pytest.importorskip("torch")

from arena_opt.perf import profile_db as pdb  # noqa: E402
from arena_opt.profiling.layers import _at_speed, distinct_layers, profile_model  # noqa: E402
from arena_opt.profiling.speed import SpeedProbe, contention  # noqa: E402
from models.catalog import get_arch  # noqa: E402
from models.layers import layer_table  # noqa: E402
from models.torch_layers import scaled_arch  # noqa: E402


def test_distinct_layers_group_identical_rows():
    arch = scaled_arch(get_arch("gpt-350M"), max_layers=3)
    groups = distinct_layers(arch)
    assert [k for k, _ in groups] == ["embed", "block", "head"]
    assert groups[1][1] == [1, 2, 3]
    wrn = scaled_arch(get_arch("wide_resnet-1B"))
    assert sum(len(i) for _, i in distinct_layers(wrn)) == layer_table(wrn).num_layers


@pytest.mark.parametrize("name", ["gpt-350M", "moe-690M", "wide_resnet-1B"])
def test_profile_covers_layers_and_scales_with_shapes(name):
    arch = scaled_arch(get_arch(name), max_layers=2)
    tps = (1, 2) if arch.family != "wide_resnet" else (1,)
    prof = profile_model(arch, micro_batches=(2, 8), tp_degrees=tps, warmup=0, repeats=1, whole_stack=True,
                         progress=None)
    assert prof.tp_degrees == list(tps)
    assert [lp.kind for lp in prof.layer_of()] == list(layer_table(arch).kinds)
    for lp in prof.layers:
        s1, s4 = lp.at(1)  # micro-batches 2 and 8
        assert s4.act_bytes > s1.act_bytes and s4.out_bytes == 4 * s1.out_bytes
        if 2 in tps and lp.kind in ("block", "moe_block"):
            assert lp.at(2)[0].params < s1.params  # the tp shard holds fewer parameters
        # FSDP2 samples (dp = 2, fake process group) at every tp and micro-batch, same shapes
        assert [(s.tp, s.micro_batch) for s in lp.samples if s.dp == 2] == [(t, b) for t in tps for b in (2, 8)]
        assert [s.params for s in lp.at(1, 2)] == [s.params for s in lp.at(1)]
        assert all(s.sync_s == 0.0 for s in lp.at(1))
    assert prof.optim_call_s > 0
    assert prof.probe_s is not None and prof.probe_s > 0  # the speed the samples are stored at
    # the whole model at every micro-batch size, against the sum of its layers at that size
    assert [s.micro_batch for s in prof.stack] == [2, 8]
    for st in prof.stack:
        assert st.layers_s == pytest.approx(sum(s.fwd_s + s.bwd_s for lp in prof.layers for _ in lp.indices
                                                for s in lp.samples if (s.tp, s.dp, s.micro_batch) ==
                                                (1, 1, st.micro_batch)))
    pdb.ProfileDB(models=[prof])  # validates


def test_max_ranks_leaves_out_the_shapes_of_more_ranks_only():
    arch = scaled_arch(get_arch("gpt-350M"), max_layers=1)
    prof = profile_model(arch, micro_batches=(2,), tp_degrees=(1, 2, 4), dp_degrees=(2,), max_ranks=4, warmup=0,
                         repeats=1, progress=None)
    full = profile_model(arch, micro_batches=(2,), tp_degrees=(1, 2, 4), dp_degrees=(2,), warmup=0, repeats=1,
                         progress=None)
    for lp, lf in zip(prof.layers, full.layers):
        shapes = {(s.tp, s.dp) for s in lp.samples}
        assert shapes == {(s.tp, s.dp) for s in lf.samples if s.tp * s.dp <= 4}, lp.kind
    assert {(s.tp, s.dp) for lp in prof.layers if lp.kind == "block" for s in lp.samples} == {
        (1, 1), (2, 1), (4, 1), (1, 2), (2, 2)}
    assert (4, 2) in {(s.tp, s.dp) for lp in full.layers if lp.kind == "block" for s in lp.samples}


def test_samples_rescale_to_the_reference_speed_and_probe_is_timed():
    s = pdb.LayerSample(tp=1, micro_batch=2, fwd_s=1.0, bwd_s=2.0, sync_s=0.5, optim_s=0.25, act_bytes=10,
                        out_bytes=20, params=30)
    t = _at_speed(s, 0.5)  # a sample that ran while the probe took twice the reference time
    assert (t.fwd_s, t.bwd_s, t.sync_s, t.optim_s) == (0.5, 1.0, 0.25, 0.125)
    assert (t.act_bytes, t.out_bytes, t.params, t.tp, t.micro_batch) == (10, 20, 30, 1, 2)
    probe = SpeedProbe("cpu")
    mm, scale = probe.parts()
    assert mm > 0 and scale > 0 and probe.probe() > 0
    assert contention(2, seconds=0.2) > 0  # both processes report a probe time


def test_profile_without_speed_probe_keeps_raw_times():
    arch = scaled_arch(get_arch("gpt-350M"), max_layers=1)
    prof = profile_model(arch, micro_batches=(1,), tp_degrees=(1,), dp_degrees=(), warmup=0, repeats=1,
                         speed_probe=False, progress=None)
    assert prof.probe_s is None and prof.stack == []  # the whole stack is timed only when asked


def test_profile_command_writes_a_database(tmp_path):
    from arena_opt.cli import main

    out = tmp_path / "p.json"
    rc = main(["profile", "--model", "bert-350M", "--batch", "1,2", "--tp", "1,2", "--repeats", "1", "--warmup", "0",
               "--max-layers", "2", "--quiet", "--out", str(out)])
    assert rc == 0
    db = pdb.load(out)
    assert db.models[0].model.startswith("bert-350M@") and db.models[0].clock == "thread"
    assert db.models[0].stack == []  # the correction is off by default, so its samples are not paid for


def test_profile_command_times_the_whole_stack_when_asked(tmp_path):
    from arena_opt.cli import main

    out = tmp_path / "p.json"
    assert main(["profile", "--model", "gpt-350M", "--batch", "1,2", "--tp", "1", "--repeats", "1", "--warmup", "0",
                 "--max-layers", "1", "--whole-stack", "--quiet", "--out", str(out)]) == 0
    assert [s.micro_batch for s in pdb.load(out).models[0].stack] == [1, 2]


def test_saved_bytes_leave_out_autocasts_weight_copies(monkeypatch):
    """Under autocast (bf16 on GPUs; here CPU's bf16 autocast stands in) each weight's low-precision copy is
    saved for backward: cast once per step and cached, it is no activation of the micro-batch, and a profile
    that counted it would price 2 bytes per parameter into every micro-batch in flight."""
    import torch

    import models.torch_layers as tl
    from arena_opt.profiling.layers import _saved_bytes

    monkeypatch.setattr(tl, "training_precision", lambda device: torch.bfloat16)
    layer = torch.nn.Linear(256, 256)
    x = torch.randn(2, 256, requires_grad=True)
    out, kept = _saved_bytes(layer, x)
    assert out.dtype == torch.bfloat16  # autocast did run
    weight_copy = 256 * 256 * 2
    assert 0 < kept < weight_copy / 8  # the bf16 input only (1 KiB), not the 128 KiB weight copy
