"""The composition charges exactly the tensor-parallel collectives the runtime issues: the runners'
DTensor sharding (`runners.parallelize`) runs one micro-batch on a fake process group while a
dispatch mode records every collective, and the list is compared with `_tp_collectives`."""

from collections import Counter
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from arena_opt.perf.profile_costs import _tp_collectives  # noqa: E402
from arena_opt.profiling.layers import fake_group  # noqa: E402
from models.catalog import get_arch  # noqa: E402
from models.layers import layer_table  # noqa: E402
from models.torch_layers import LayerStack, loss_fn, scaled_arch, synthetic_batch  # noqa: E402

COLLECTIVES = ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all")
NAMES = {"all_gather_into_tensor": "all_gather", "reduce_scatter_tensor": "reduce_scatter"}


class _Record(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.phase = "fwd"
        self.seen: list[tuple[str, str, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in COLLECTIVES:
            t = args[0]
            nbytes = t.numel() * t.element_size()
            if name == "all_gather_into_tensor":  # sized like the collective fits: the gathered buffer
                nbytes *= args[1]
            self.seen.append((self.phase, NAMES.get(name, name), nbytes))
        return func(*args, **(kwargs or {}))


def _runtime_collectives(arch, tp: int, b: int) -> list[tuple[str, str, int]]:
    from runners.parallelize import _tensor_parallel

    with fake_group(tp) as meshes:
        if meshes is None:
            pytest.skip("no fake process group in this torch")
        stack = LayerStack(arch, seed=0)
        _tensor_parallel(stack, meshes.get("cpu", 1, tp)["tp"])
        x, y = synthetic_batch(arch, 0, b)
        rec = _Record()
        with rec:
            loss = loss_fn(stack(x), y)
            rec.phase = "bwd"
            loss.backward()
    return rec.seen


def _composed_collectives(arch, tp: int, b: int) -> list[tuple[str, str, int]]:
    table = layer_table(arch)
    prof = SimpleNamespace(arch=arch)
    out = []
    for kind in table.kinds:
        out_bytes = b * arch.seq_len * arch.vocab // tp * 4 if kind == "head" else 0
        f, bw = _tp_collectives(prof, kind, tp, b, out_bytes)
        out += [("fwd", c, int(n)) for c, n in f] + [("bwd", c, int(n)) for c, n in bw]
    return out


@pytest.mark.parametrize("name", ["gpt-350M", "llama-7B"])
@pytest.mark.parametrize("tp", [2, 4])
def test_dense_models_collectives_match_the_runtime(name, tp):
    arch = scaled_arch(get_arch(name), max_hidden=64, max_layers=2, seq_len=16, max_heads=4, max_vocab=256)
    assert Counter(_runtime_collectives(arch, tp, 4)) == Counter(_composed_collectives(arch, tp, 4))


def test_moe_collective_counts_match_the_runtime():
    # per-expert sizes follow the routing of each batch; the composition charges their mean, so the
    # number of collectives per phase and kind must match and their total bytes come close
    arch = scaled_arch(get_arch("moe-690M"), max_hidden=64, max_layers=2, seq_len=16, max_heads=4, max_vocab=256,
                       max_experts=4)
    run, comp = _runtime_collectives(arch, 2, 4), _composed_collectives(arch, 2, 4)
    assert Counter((p, c) for p, c, _ in run) == Counter((p, c) for p, c, _ in comp)
    assert sum(n for *_, n in run) == pytest.approx(sum(n for *_, n in comp), rel=0.25)
