"""Per-stage plans on CPU gloo processes (runners/pipeline.py): every rank of every stage, whatever
its (dp, tp), ends a step with the single-process model's gradients, and the last stage's replicas
report the batch's mean loss. Micro-batches are cut and joined between stages of different width."""

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402
from gloo_ranks import init_rank, run_ranks  # noqa: E402

pytestmark = pytest.mark.slow
BATCH = 8


def _worker(rank: int, world: int, port: int, model: str, plan_json: str, queue) -> None:
    try:
        init_rank(rank, world, port)
        from torch.distributed.tensor import DTensor

        from arena_opt.plan import Plan
        from models.catalog import get_arch
        from models.torch_layers import scaled_arch, synthetic_batch
        from runners.parallelize import parallelize

        arch = scaled_arch(get_arch(model))
        pm = parallelize(arch, Plan.model_validate_json(plan_json), torch.device("cpu"))
        loss = pm.train_step(*synthetic_batch(arch, 0, BATCH))
        grads = {}
        for name, p in pm.module.named_parameters():
            g = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad  # a collective over tp
            grads[name] = g.detach().numpy().copy()
        share = float(loss) / pm.loss_replicas if pm.reports_loss and loss is not None else None
        queue.put((rank, grads, share, None))
        dist.destroy_process_group()
    except Exception:
        import traceback

        queue.put((rank, None, None, traceback.format_exc()))


def _run(model: str, plan) -> list:
    out = run_ranks(_worker, plan.num_gpus, model, plan.model_dump_json())
    errors = [e for *_, e in out if e]
    assert not errors, errors[0]
    return sorted(out, key=lambda o: o[0])


def _reference(model: str):
    from models.catalog import get_arch
    from models.torch_layers import build_layers, loss_fn, scaled_arch, synthetic_batch

    arch = scaled_arch(get_arch(model))
    ref = build_layers(arch, seed=0)
    x, y = synthetic_batch(arch, 0, BATCH)
    loss = loss_fn(ref(x), y)
    loss.backward()
    return float(loss.detach()), {n: p.grad for n, p in ref.named_parameters()}


@pytest.mark.parametrize("model,plan_kw", [
    # dp 2 -> dp 1: two replicas' halves of each micro-batch joined, the gradient split back
    pytest.param("gpt-350M", {"pp": 2, "num_microbatches": 2, "stage_shapes": [(2, 1), (1, 1)]}, id="dp2-dp1"),
    # 2 -> 1 -> 2 replicas: a join into a tp pair (both tp ranks receive), a cut out of it (tp rank 0
    # sends), and a last stage of two replicas (each share's loss weighs 1 / (micro-batches x 2))
    pytest.param("llama-70B", {"pp": 3, "num_microbatches": 4, "stage_shapes": [(2, 1), (1, 2), (2, 1)]},
                 id="dp2-tp2-dp2-gqa"),
])
def test_per_stage_plan_gradients_equal_the_single_process_model(model, plan_kw):
    from arena_opt.plan import Plan
    from arena_opt.stages import default_stages
    from models.catalog import get_arch
    from models.torch_layers import scaled_arch

    plan = Plan(**plan_kw)
    out = _run(model, plan)
    ref_loss, ref = _reference(model)
    stages = default_stages(scaled_arch(get_arch(model)), plan.pp)
    seen = set()
    for rank, grads, _, _ in out:
        seen |= grads.keys()
        for name, g in grads.items():
            torch.testing.assert_close(torch.from_numpy(g), ref[name], rtol=1e-4, atol=1e-6,
                                       msg=lambda m: f"rank {rank} {name}: {m}")
    assert seen == ref.keys() and len(stages) == plan.pp  # every stage's parameters were checked
    shares = [s for _, _, s, _ in out if s is not None]
    assert len(shares) == plan.shapes[-1][0]
    assert sum(shares) == pytest.approx(ref_loss, rel=1e-5)
