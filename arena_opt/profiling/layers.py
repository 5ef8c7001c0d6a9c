"""Per-layer profiler: forward, backward and optimizer-step time and activation memory of every
distinct layer of a model, on one device, for several micro-batch sizes and for the shard a layer
has under tensor parallelism of degree 2, 4, 8 (`models.torch_layers.build_layer(tp_degree=...)`
builds one rank's shard; its collectives are not run here, the composition adds them).

Layers with identical rows in the layer table have identical shapes (e.g. all blocks of a GPT), so
one of each is measured. Each measurement: `warmup` untimed runs, then the median of `repeats`.
Activation memory is what autograd saves for the backward pass (saved-tensor hooks), which does
not depend on the device's allocator.
"""

from __future__ import annotations

import os
import platform
import statistics
import sys
import time
from datetime import datetime, timezone
from typing import Callable

from arena_opt.profiling.db import LayerProfile, LayerSample, ModelProfile
from models.catalog import Arch
from models.layers import layer_table

Progress = Callable[[str], None]


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def distinct_layers(arch: Arch) -> list[tuple[str, list[int]]]:
    """(kind, indices) of each distinct layer shape, in table order."""
    t = layer_table(arch)
    groups: dict[tuple, list[int]] = {}
    for i, kind in enumerate(t.kinds):
        sig = (kind, float(t.params[i]), float(t.tp_params[i]), float(t.flops_fwd[i]), float(t.act_shard[i]),
               float(t.act_rep[i]), float(t.act_in[i]), float(t.tp_comm[i]))
        groups.setdefault(sig, []).append(i)
    return [(sig[0], idx) for sig, idx in groups.items()]


def _input_shapes(arch: Arch, wanted: set[int], device) -> dict[int, tuple[tuple[int, ...], bool]]:
    """(shape at micro-batch 1, is integer) of the input of each wanted layer."""
    import torch

    from models.torch_layers import build_layer, synthetic_batch

    if arch.family != "wide_resnet":
        return {i: (((1, arch.seq_len), True) if i == 0 else ((1, arch.seq_len, arch.hidden), False))
                for i in wanted}
    # conv shapes follow from running the stack once (batch 2: training-mode batch norm needs more
    # than one value per channel where the spatial size has shrunk to 1 x 1)
    x, _ = synthetic_batch(arch, 0, 2, device=device)
    out = {}
    with torch.no_grad():
        for i in range(max(wanted) + 1):
            if i in wanted:
                out[i] = ((1, *x.shape[1:]), False)
            x = build_layer(arch, i, 1, seed=0).to(device)(x)
    return out


def _make_input(shape: tuple[int, ...], integer: bool, b: int, arch: Arch, device):
    import torch

    full = (b, *shape[1:])
    if integer:
        return torch.randint(0, arch.vocab, full, device=device)
    return torch.randn(full, device=device, requires_grad=True)


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _saved_bytes(layer, x) -> tuple[object, int]:
    """Forward once, counting the distinct storages autograd saves that are not parameters."""
    import torch

    params = {p.untyped_storage().data_ptr() for p in layer.parameters()}
    seen: dict[int, int] = {}

    def pack(t):
        try:
            st = t.untyped_storage()
            if st.data_ptr() not in params:
                seen.setdefault(st.data_ptr(), st.nbytes())
        except (RuntimeError, NotImplementedError):  # storage-less tensor subclasses: nothing to count
            pass
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = layer(x)
    return out, sum(seen.values())


def measure_layer(arch: Arch, index: int, tp: int, b: int, shape, integer: bool, device, warmup: int,
                  repeats: int, clock=time.perf_counter) -> LayerSample:
    import torch

    from models.torch_layers import build_layer

    layer = build_layer(arch, index, tp, seed=0).to(device)
    x = _make_input(shape, integer, b, arch, device)
    out, act = _saved_bytes(layer, x)
    grad = torch.ones_like(out)
    out.backward(grad)
    opt = torch.optim.AdamW(layer.parameters(), lr=1e-4)
    fwd, bwd, stp = [], [], []
    for r in range(warmup + repeats):
        if x.requires_grad:
            x.grad = None
        _sync(device)
        t0 = clock()
        out = layer(x)
        _sync(device)
        t1 = clock()
        out.backward(grad)
        _sync(device)
        t2 = clock()
        opt.step()
        _sync(device)
        t3 = clock()
        opt.zero_grad(set_to_none=False)
        if r >= warmup:
            fwd.append(t1 - t0)
            bwd.append(t2 - t1)
            stp.append(t3 - t2)
    n_params = sum(p.numel() for p in layer.parameters())
    return LayerSample(tp=tp, micro_batch=b, fwd_s=statistics.median(fwd), bwd_s=statistics.median(bwd),
                       optim_s=statistics.median(stp) if n_params else 0.0, act_bytes=act,
                       out_bytes=out.numel() * out.element_size(), params=n_params)


def _tp_ok(arch: Arch, index: int, tp: int) -> bool:
    from models.torch_layers import build_layer

    if tp == 1:
        return True
    try:
        build_layer(arch, index, tp, seed=0)
    except ValueError:  # a dimension is not divisible by tp
        return False
    return True


def profile_model(arch: Arch, *, device: str = "cpu", micro_batches: tuple[int, ...] = (1, 2, 4, 8),
                  tp_degrees: tuple[int, ...] = (1, 2, 4, 8), warmup: int = 2, repeats: int = 5,
                  threads: int | None = 1, clock: str | None = None,
                  progress: Progress | None = _stderr) -> ModelProfile:
    """Measure every distinct layer of `arch` at every (tp, micro-batch) that its shapes allow.

    `clock`: "wall" (synchronized wall time; the default on CUDA) or "thread" (CPU time of the one
    compute thread; the default on CPU, where it does not count the time other tenants of the host
    hold the core, so a profile does not depend on what else runs)."""
    import torch

    dev = torch.device(device)
    clock = clock or ("thread" if dev.type == "cpu" else "wall")
    if clock == "thread" and (dev.type != "cpu" or (threads or torch.get_num_threads()) != 1):
        raise ValueError("clock='thread' needs a CPU device and threads=1 (one compute thread)")
    clock_fn = time.thread_time if clock == "thread" else time.perf_counter
    if dev.type == "cpu" and threads:
        torch.set_num_threads(threads)
    groups = distinct_layers(arch)
    shapes = _input_shapes(arch, {idx[0] for _, idx in groups}, dev)
    todo = [(kind, idx, tp) for kind, idx in groups for tp in tp_degrees if _tp_ok(arch, idx[0], tp)]
    total = len(todo) * len(micro_batches)
    done, t_start = 0, time.perf_counter()
    layers = []
    by_group: dict[int, list[LayerSample]] = {}
    for kind, idx, tp in todo:
        shape, integer = shapes[idx[0]]
        for b in micro_batches:
            s = measure_layer(arch, idx[0], tp, b, shape, integer, dev, warmup, repeats, clock_fn)
            by_group.setdefault(idx[0], []).append(s)
            done += 1
            if progress:
                el = time.perf_counter() - t_start
                progress(f"[profile] {done}/{total} layer {idx[0]} ({kind}, x{len(idx)}) tp={tp} mb={b}: "
                         f"fwd {1e3 * s.fwd_s:.2f} ms, bwd {1e3 * s.bwd_s:.2f} ms, act {s.act_bytes / 2**20:.2f} MiB"
                         f"  [{el:.0f} s, eta {el / done * (total - done):.0f} s]")
    for kind, idx in groups:
        layers.append(LayerProfile(indices=idx, kind=kind, samples=by_group[idx[0]]))
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else (platform.processor() or platform.machine())
    if dev.type == "cpu":
        try:
            with open("/proc/cpuinfo") as f:
                name = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), name)
        except OSError:
            pass
    return ModelProfile(model=arch.name, arch=arch, device=dev.type, device_name=name, dtype="fp32",
                        threads=torch.get_num_threads() if dev.type == "cpu" else 1, torch=torch.__version__,
                        created=datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), clock=clock, warmup=warmup,
                        repeats=repeats, layers=layers)


def cpu_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1
