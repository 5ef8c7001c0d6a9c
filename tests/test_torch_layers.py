"""The torch modules agree with the parameter table they are built from, run at
tensor-parallel shard shapes, and initialise independently of how layers are grouped."""

from __future__ import annotations

import warnings

import pytest
import torch

from models.catalog import ARCHITECTURES, get_arch
from models.layers import layer_table, param_count
from models.torch_layers import (LayerStack, _resnet_blocks, build_layer, build_layers, loss_fn, scaled_arch,
                                 synthetic_batch)

FAMILY_REPS = ["gpt-350M", "bert-1.3B", "moe-690M", "llama-70B", "wide_resnet-1B"]


@pytest.fixture(autouse=True)
def _one_thread():
    # on a shared 2-core host two intra-op threads per test process only contend
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _nparams(m: torch.nn.Module) -> int:
    return sum(p.numel() for p in m.parameters())


def _documented_gap(arch, kind: str) -> int:
    """Parameters the modules have minus the table's, by the differences the module docstring lists."""
    h = arch.hidden
    if kind == "head" and arch.family in ("gpt", "bert", "moe"):
        return arch.vocab * h  # untied output projection
    if arch.family == "llama" and kind in ("block", "moe_block"):
        return -2 * h  # two RMSNorms of h instead of LayerNorms of 2h
    if arch.family == "llama" and kind == "head":
        return -h
    return 0


@pytest.mark.parametrize("name", FAMILY_REPS)
def test_layers_match_parameter_table(name):
    arch = scaled_arch(get_arch(name))
    table = layer_table(arch)
    model = build_layers(arch)
    assert len(model.layers) == table.num_layers
    for i, kind in enumerate(table.kinds):
        got = _nparams(model.layers[str(i)])
        if arch.family == "wide_resnet":
            # conv and fc weights exactly; the table adds 4 BatchNorm numbers per inner channel
            weights = sum(p.numel() for p in model.layers[str(i)].parameters() if p.dim() > 1)
            bn_in_table = 0
            if kind == "conv_block":
                _, width, cout, _ = _resnet_blocks(arch)[i - 1]
                bn_in_table = 4 * (2 * width + cout)
            if kind == "head":
                weights = got  # the table counts the classifier's bias
            assert weights == table.params[i] - bn_in_table, (i, kind)
            continue
        assert got - table.params[i] == _documented_gap(arch, kind), (i, kind)


@pytest.mark.parametrize("name", FAMILY_REPS)
def test_full_model_trains_one_step(name):
    arch = scaled_arch(get_arch(name))
    model = build_layers(arch)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for step in range(3):
        x, y = synthetic_batch(arch, 0, 4)  # same batch: the loss must fall
        loss = loss_fn(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]


@pytest.mark.parametrize("name", ["gpt-350M", "moe-690M", "llama-7B"])
def test_tensor_parallel_shard_shapes(name):
    arch = scaled_arch(get_arch(name))
    table = layer_table(arch)
    for i, kind in enumerate(table.kinds):
        full, half = build_layer(arch, i, 1), build_layer(arch, i, 2)
        if kind in ("embed", "block", "moe_block"):
            # everything the table calls tp-sharded is halved, the rest replicated; the
            # table counts the MoE router as sharded, the modules replicate it (it is tiny
            # and every rank must route tokens the same way)
            router = arch.hidden * arch.num_experts if kind == "moe_block" else 0
            assert _nparams(full) - _nparams(half) == (table.tp_params[i] - router) / 2, (i, kind)
    x, _ = synthetic_batch(arch, 0, 2)
    h = x
    for i in range(table.num_layers):
        h = build_layer(arch, i, 2)(h)
    assert h.shape == (2, arch.seq_len, arch.vocab // 2)


def test_wide_resnet_shard_shapes_run():
    arch = scaled_arch(get_arch("wide_resnet-1B"))
    x, _ = synthetic_batch(arch, 0, 2)
    for i in range(1, 4):
        full, shard = build_layer(arch, i, 1), build_layer(arch, i, 2)
        convs = lambda m: sum(p.numel() for p in m.parameters() if p.dim() > 1)  # noqa: E731
        assert convs(shard) * 2 == convs(full)
    h = build_layer(arch, 0)(x)
    assert build_layer(arch, 1, 2)(h).shape[1] == build_layer(arch, 1, 1)(h).shape[1] // 2


def test_init_does_not_depend_on_stage_split():
    arch = scaled_arch(get_arch("gpt-350M"))
    whole = build_layers(arch, seed=3).state_dict()
    a, b = LayerStack(arch, 0, 2, seed=3).state_dict(), LayerStack(arch, 2, None, seed=3).state_dict()
    assert set(a) | set(b) == set(whole) and not set(a) & set(b)
    for k, v in {**a, **b}.items():
        assert torch.equal(v, whole[k]), k
    other = build_layers(arch, seed=4).state_dict()
    assert not torch.equal(other["layers.1.attn.q.weight"], whole["layers.1.attn.q.weight"])


def test_synthetic_data_is_a_function_of_step():
    arch = scaled_arch(get_arch("bert-350M"))
    x0, y0 = synthetic_batch(arch, 5, 8)
    x1, y1 = synthetic_batch(arch, 5, 8)
    x2, _ = synthetic_batch(arch, 6, 8)
    assert torch.equal(x0, x1) and torch.equal(y0, y1) and not torch.equal(x0, x2)


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_scaled_arch_keeps_structure(name):
    arch = get_arch(name)
    s = scaled_arch(arch)
    assert s.family == arch.family
    assert len(layer_table(s).kinds) <= len(layer_table(arch).kinds)
    if arch.family != "wide_resnet":
        assert s.hidden <= 64 and s.num_layers <= 4 and s.hidden % (4 * s.heads) == 0
        assert s.gated_mlp == arch.gated_mlp
        assert (s.kv_heads is None) == (arch.kv_heads is None or arch.kv_heads == arch.heads)
        assert set(layer_table(s).kinds) == set(layer_table(arch).kinds)
    assert param_count(s) < 2e6


def _saved_bytes_and_grads(arch, recompute: bool):
    """Bytes autograd keeps for backward over one forward, then the loss and every gradient."""
    stack = build_layers(arch, seed=0)
    stack.recompute = recompute
    x, y = synthetic_batch(arch, 0, 4)
    saved = []

    def pack(t):
        saved.append(t.numel() * t.element_size())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = loss_fn(stack(x), y)
    kept = sum(saved)  # what the forward left for backward (recomputation's own saves come later)
    loss.backward()
    state = {**{n: p.grad.clone() for n, p in stack.named_parameters()},
             **{f"buffer:{n}": b.clone() for n, b in stack.named_buffers()}}  # batch norm's running statistics
    return kept, float(loss.detach()), state


@pytest.mark.parametrize("name", FAMILY_REPS)
def test_recompute_keeps_less_for_backward_and_gives_the_same_gradients(name):
    """Plan.recompute: autograd keeps less for backward outside the checkpointed layers than the plain forward
    keeps, and the stack trains exactly as without it: the same loss, gradients and batch-norm statistics (the
    recomputed forward does not fold its batch in a second time)."""
    arch = scaled_arch(get_arch(name))
    plain_bytes, plain_loss, plain = _saved_bytes_and_grads(arch, False)
    remat_bytes, remat_loss, remat = _saved_bytes_and_grads(arch, True)
    assert remat_bytes < plain_bytes
    assert remat_loss == plain_loss
    assert plain.keys() == remat.keys()
    for n, g in plain.items():
        torch.testing.assert_close(remat[n], g, msg=lambda m: f"{n}: {m}")


def test_profiler_times_layers_at_the_runners_precision(monkeypatch):
    """A profile taken at another precision than the training steps it prices is off by the ratio of the
    two: the profiler enters the runners' `training_autocast` around every timed forward, and records its
    precision; on GPUs that is bf16."""
    import models.torch_layers as tl
    import runners.parallelize as par
    from arena_opt.profiling.layers import profile_model

    assert par.training_autocast is tl.training_autocast  # the runners' step uses the same helper
    with warnings.catch_warnings():  # torch says autocast is off without a GPU; the context still names bf16
        warnings.simplefilter("ignore")
        ctx = tl.training_autocast("cuda")
    assert ctx.fast_dtype == torch.bfloat16 and tl.training_dtype("cuda") == "bf16"
    assert tl.training_dtype("cpu") == "fp32" and not tl.training_autocast("cpu")._enabled
    assert par.training_precision is tl.training_precision  # the pipeline's examples read the same precision
    seen = []
    real = tl.training_autocast

    def spy(device):
        seen.append(torch.device(device).type)
        return real(device)

    monkeypatch.setattr(tl, "training_autocast", spy)
    prof = profile_model(scaled_arch(get_arch("gpt-350M")), micro_batches=(1,), tp_degrees=(1,), dp_degrees=(),
                         repeats=1, warmup=0, speed_probe=False, progress=None)
    timed_passes = sum(len(lp.samples) for lp in prof.layers) * 2  # every sample: its saved-bytes pass, a repeat
    assert len(seen) >= timed_passes and set(seen) == {"cpu"}
    assert prof.dtype == "fp32"
