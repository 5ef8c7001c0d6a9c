"""FSDP2 (alone and with tensor parallelism) computes the unsharded model's gradients, and hands
FSDP2 no view tensors (whose in-place use would silently skip an all-gather in backward); a plan with
rematerialisation (Plan.recompute) computes them too, under DDP, FSDP2, FSDP2 x TP and the pipeline
schedule. Processes on CPU over gloo, a scaled-down model, one step."""

import warnings

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402
from gloo_ranks import init_rank, run_ranks  # noqa: E402

pytestmark = pytest.mark.slow


def _worker(rank: int, world: int, port: int, model: str, plan_kw: dict, dp_mode: str, queue) -> None:
    try:
        init_rank(rank, world, port)
        from torch.distributed.tensor import DTensor

        from arena_opt.plan import Plan
        from models.catalog import get_arch
        from models.torch_layers import scaled_arch, synthetic_batch
        from runners.parallelize import parallelize

        arch = scaled_arch(get_arch(model))
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            pm = parallelize(arch, Plan(**plan_kw), torch.device("cpu"), dp_mode=dp_mode)
            pm.train_step(*synthetic_batch(arch, 0, 8))
        grads = {}
        for name, p in pm.module.named_parameters():
            g = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
            # by value: shared tensors die with the process; DDP's wrapper prefixes the stack's names
            grads[name.removeprefix("module.")] = g.detach().numpy().copy()
        stack = getattr(pm.module, "module", pm.module)  # under DDP's wrapper
        grads["recompute"] = stack.recompute  # what the rank's stack was built to do
        queue.put((rank, [str(w.message) for w in seen], grads, None))
        dist.destroy_process_group()
    except Exception as e:  # reported to the test rather than lost in a child's stderr
        queue.put((rank, [], None, repr(e)))


def _run(model: str, world: int, plan_kw: dict, dp_mode: str = "fsdp"):
    out = run_ranks(_worker, world, model, plan_kw, dp_mode)
    errors = [e for _, _, _, e in out if e]
    assert not errors, errors
    grads: dict = {}
    for _, _, g, _ in sorted(out, key=lambda o: o[0]):  # a pipeline's stages hold the model between them
        grads = {**g, **grads}
    return [w for _, ws, _, _ in out for w in ws], grads


def _reference_grads(model: str, chunks: int) -> dict:
    from models.catalog import get_arch
    from models.torch_layers import build_layers, loss_fn, scaled_arch, synthetic_batch

    arch = scaled_arch(get_arch(model))
    ref = build_layers(arch, seed=0)
    x, y = synthetic_batch(arch, 0, 8)
    for xc, yc in zip(x.chunk(chunks), y.chunk(chunks)):
        (loss_fn(ref(xc), yc) / chunks).backward()
    return {n: p.grad for n, p in ref.named_parameters()}


@pytest.mark.parametrize("model,world,plan_kw", [
    pytest.param("gpt-350M", 2, {"dp": 2}, id="fsdp2-dp2"),
    pytest.param("llama-70B", 4, {"dp": 2, "tp": 2, "num_microbatches": 2}, id="fsdp2-dp2xtp2"),
])
def test_fsdp2_gradients_equal_the_unsharded_model_and_no_view_warning(model, world, plan_kw):
    seen, grads = _run(model, world, plan_kw)
    assert grads.pop("recompute") is False
    assert not [w for w in seen if "view tensor" in w], seen
    ref = _reference_grads(model, plan_kw["dp"] * plan_kw.get("num_microbatches", 1))
    assert grads.keys() == ref.keys()
    for name, g in grads.items():
        torch.testing.assert_close(torch.from_numpy(g), ref[name], rtol=1e-4, atol=1e-6, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("model,world,plan_kw,dp_mode", [
    pytest.param("gpt-350M", 2, {"dp": 2, "recompute": True}, "ddp", id="ddp-dp2"),
    pytest.param("moe-690M", 2, {"dp": 2, "num_microbatches": 2, "recompute": True}, "fsdp", id="fsdp2-dp2"),
    pytest.param("llama-70B", 4, {"dp": 2, "tp": 2, "num_microbatches": 2, "recompute": True}, "fsdp",
                 id="fsdp2-dp2xtp2"),
    pytest.param("gpt-350M", 2, {"pp": 2, "num_microbatches": 2, "recompute": True}, "ddp", id="pp2"),
])
def test_recompute_plans_compute_the_unsharded_model_gradients(model, world, plan_kw, dp_mode):
    """A plan that rematerialises (the planner's choice where activations do not fit otherwise) trains as
    the plain model does on every parallel form the runners build."""
    _, grads = _run(model, world, plan_kw, dp_mode)
    assert grads.pop("recompute") is True
    ref = _reference_grads(model, plan_kw.get("dp", 1) * plan_kw.get("num_microbatches", 1))
    assert grads.keys() == ref.keys()
    for name, g in grads.items():
        torch.testing.assert_close(torch.from_numpy(g), ref[name], rtol=1e-4, atol=1e-6, msg=lambda m: f"{name}: {m}")
