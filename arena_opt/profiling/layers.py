"""Per-layer profiler: forward, backward and optimizer-step time and activation memory of every
distinct layer of a model, on one device, for several micro-batch sizes and for the shard a layer
has under tensor parallelism of degree 2, 4, 8 (`models.torch_layers.build_layer(tp_degree=...)`
builds one rank's shard; its collectives are not run here, the composition adds them).

Layers with identical rows in the layer table have identical shapes (e.g. all blocks of a GPT), so
one of each is measured. Each measurement: `warmup` untimed runs, then the median of `repeats`,
each repeat on fresh inputs (a new batch every step, as in training: MoE routing, and with it the
shapes every expert sees, changes from step to step). Activation memory is what autograd saves for
the backward pass (saved-tensor hooks), which does not depend on the device's allocator.

What the runtime adds around a layer is profiled on the one device too, on a fake process group
(`torch.distributed` "fake" backend: every collective returns at once, the composition adds their
time from the collective fits):
- tensor parallelism (tp > 1) times the layer as `runners.parallelize` shards it (DTensor
  `parallelize_module` over a tp-rank mesh): the local shard's compute plus DTensor's dispatch,
  sharding propagation and redistribution work, which the hand-built shard alone does not show;
- FSDP2 (`dp_degrees`, samples with dp > 1): the layer under `fully_shard` over a dp-rank mesh (on
  top of tp): parameter all-gather copy-in/out and hooks in forward and backward of a micro-batch
  that does not synchronise gradients, `sync_s` the extra backward work of the one that does, and
  the optimizer step on the sharded (DTensor) parameters;
- the loss (cross-entropy of the last layer's output, as `models.torch_layers.loss_fn`) is part of
  the last layer's forward and backward;
- `optim_call_s`: the fixed cost of one optimizer step call (AdamW on a one-element parameter); each
  layer's `optim_s` includes it once, a pipeline stage pays it once for all its layers.
Without a fake backend (or with a process group already initialised) tp samples fall back to the
hand-built shards and no dp samples are taken.
"""

from __future__ import annotations

import contextlib
import math
import os
import platform
import statistics
import sys
import time
from datetime import datetime, timezone
from typing import Callable

from arena_opt.perf.profile_db import LayerProfile, LayerSample, ModelProfile, StackSample
from arena_opt.profiling.speed import SpeedProbe
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


# backward nodes of ops that only view their one input (a transposed weight is what a linear layer saves)
_VIEW_BACKWARDS = {"TBackward0", "TransposeBackward0", "PermuteBackward0", "ViewBackward0", "UnsafeViewBackward0",
                   "ExpandBackward0", "AsStridedBackward0", "AliasBackward0"}


def _saved_bytes(layer, x) -> tuple[object, int]:
    """Forward once, counting the distinct storages autograd saves that are not parameters."""
    import torch

    from models.torch_layers import training_autocast

    params = {p.untyped_storage().data_ptr() for p in layer.parameters()}
    seen: dict[int, int] = {}

    def weight_cast(t) -> bool:
        # autocast's low-precision copy of a weight, or a view of it (cast once per step and cached: not an
        # activation of the micro-batch, which the composition multiplies by the micro-batches in flight)
        fn = t.grad_fn
        while fn is not None and type(fn).__name__ in _VIEW_BACKWARDS:
            nexts = [nf for nf, _ in fn.next_functions if nf is not None]
            fn = nexts[0] if len(nexts) == 1 else None
        if fn is None or type(fn).__name__ != "ToCopyBackward0":
            return False
        leaves = [getattr(nf, "variable", None) for nf, _ in fn.next_functions if nf is not None]
        return any(v is not None and v.untyped_storage().data_ptr() in params for v in leaves)

    def pack(t):
        try:
            st = t.untyped_storage()
            if st.data_ptr() not in params and not weight_cast(t):
                seen.setdefault(st.data_ptr(), st.nbytes())
        except (RuntimeError, NotImplementedError):  # storage-less tensor subclasses: nothing to count
            pass
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), training_autocast(x.device):
        out = layer(x)
    return out, sum(seen.values())


def _fresh_input(shape, integer: bool, b: int, arch: Arch, device, gen, grad: bool = True):
    """A new input batch; `grad`: whether backward computes its gradient (not for the model's input)."""
    import torch

    full = (b, *shape[1:])
    if integer:
        return torch.randint(0, arch.vocab, full, generator=gen).to(device)
    return torch.randn(full, generator=gen).to(device).requires_grad_(grad)


def _labels(arch: Arch, out, gen):
    """Labels for the loss on the last layer's output (tokens or classes)."""
    import torch

    n_cls = out.shape[-1]
    return torch.randint(0, n_cls, out.shape[:-1], generator=gen).to(out.device)


@contextlib.contextmanager
def fake_group(world: int):
    """A fake process group of `world` ranks in this process, or None when there is none to be had
    (no fake backend in this torch, or a process group is already initialised)."""
    import torch.distributed as dist

    if world <= 1 or not dist.is_available() or dist.is_initialized():
        yield None
        return
    try:
        from torch.testing._internal.distributed.fake_pg import FakeStore
    except ImportError:
        yield None
        return
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    try:
        yield _Meshes(world)
    finally:
        dist.destroy_process_group()


class _Meshes:
    """(dp, tp) device meshes over the fake group, built once each."""

    def __init__(self, world: int):
        self.world = world
        self._cache: dict[tuple[str, int, int], object] = {}

    def get(self, device_type: str, dp: int, tp: int):
        if self.world % (dp * tp):
            return None
        key = (device_type, dp, tp)
        if key not in self._cache:
            from torch.distributed.device_mesh import init_device_mesh

            self._cache[key] = init_device_mesh(device_type, (self.world // (dp * tp), dp, tp),
                                                mesh_dim_names=("rest", "dp", "tp"))
        return self._cache[key]


def runtime_shards(arch: Arch, index: int) -> bool:
    """Whether `runners.parallelize` shards this layer with DTensor under tp (the transformer layers)."""
    return arch.family != "wide_resnet" and layer_table(arch).kinds[index] in ("embed", "block", "moe_block",
                                                                               "head")


def _runtime_layer(arch: Arch, index: int, tp: int, dp: int, mesh, device):
    """Layer `index` wrapped as the runtime wraps it: DTensor tp over mesh["tp"], FSDP2 over mesh["dp"]."""
    import torch

    from models.torch_layers import LayerStack
    from runners.parallelize import _tensor_parallel

    with torch.device(device):
        stack = LayerStack(arch, index, index + 1, seed=0)
    if tp > 1:
        _tensor_parallel(stack, mesh["tp"])
    if dp > 1:
        from torch.distributed.fsdp import fully_shard

        for layer in stack.layers.values():
            fully_shard(layer, mesh=mesh["dp"])
        fully_shard(stack, mesh=mesh["dp"])
    return stack


def measure_layer(arch: Arch, index: int, tp: int, b: int, shape, integer: bool, device, warmup: int,
                  repeats: int, clock=time.perf_counter, *, dp: int = 1, mesh=None, loss: bool = False,
                  probe: SpeedProbe | None = None) -> tuple[LayerSample, float | None]:
    """One (tp, dp, micro-batch) sample of layer `index`. With a `mesh` (fake group) and tp > 1 or
    dp > 1 the layer runs as the runtime wraps it; memory and parameter counts always come from the
    hand-built tp shard. `loss`: the loss on the output is part of forward and backward. With a
    `probe`, timed before every repeat, also the median probe time (the speed the sample ran at)."""
    import torch

    from models.torch_layers import build_layer, loss_fn, training_autocast

    shard = build_layer(arch, index, tp, seed=0).to(device)
    x = _make_input(shape, integer, b, arch, device)
    out, act = _saved_bytes(shard, x)
    out_bytes = out.numel() * out.element_size()
    n_params = sum(p.numel() for p in shard.parameters())
    wrapped = mesh is not None and (dp > 1 or (tp > 1 and runtime_shards(arch, index)))
    layer = _runtime_layer(arch, index, tp, dp, mesh, device) if wrapped else shard
    del out
    gen = torch.Generator().manual_seed(1000 + index)
    opt = torch.optim.AdamW(layer.parameters(), lr=1e-4)

    def fwd_bwd(sync: bool) -> tuple[float, float]:
        xi = _fresh_input(shape, integer, b, arch, device, gen, grad=index > 0)
        if dp > 1:
            layer.set_requires_gradient_sync(sync)
        _sync(device)
        t0 = clock()
        with training_autocast(device):  # the runners' precision: bf16 on GPUs
            y = layer(xi)
        _sync(device)
        f = clock() - t0
        if loss:  # labels untimed, the loss timed as part of forward
            labels = _labels(arch, y, gen)
            t0 = clock()
            with training_autocast(device):
                y = loss_fn(y, labels)
            _sync(device)
            f += clock() - t0
        grad = None if loss else torch.ones_like(y)
        _sync(device)
        t1 = clock()
        y.backward(grad)
        _sync(device)
        return f, clock() - t1

    fwd, bwd, bsync, stp, probes = [], [], [], [], []
    for r in range(warmup + repeats):
        if probe is not None:
            probes.append(probe.probe())
        f, bw = fwd_bwd(sync=dp == 1)
        if dp > 1:  # a step of 2 micro-batches: the first without gradient sync, the second with it
            _, bs = fwd_bwd(sync=True)
        _sync(device)
        t2 = clock()
        opt.step()
        _sync(device)
        t3 = clock()
        opt.zero_grad(set_to_none=dp > 1)
        if r >= warmup:
            fwd.append(f)
            bwd.append(bw)
            stp.append(t3 - t2)
            if dp > 1:
                bsync.append(bs)
    sync_s = max(0.0, statistics.median(bsync) - statistics.median(bwd)) if bsync else 0.0
    return (LayerSample(tp=tp, dp=dp, micro_batch=b, fwd_s=statistics.median(fwd), bwd_s=statistics.median(bwd),
                        sync_s=sync_s, optim_s=statistics.median(stp) if n_params else 0.0, act_bytes=act,
                        out_bytes=out_bytes, params=n_params),
            statistics.median(probes) if probes else None)


def measure_stack(arch: Arch, b: int, device, warmup: int, repeats: int, clock=time.perf_counter,
                  probe: SpeedProbe | None = None) -> tuple[float, float | None] | None:
    """Forward, loss and backward of the whole model (tp 1, the layers chained as `runners` chain them)
    at micro-batch size `b`, a fresh batch every repeat: (median seconds, median probe time), or None
    where the model cannot run at that size (training-mode batch norm over one value per channel)."""
    import torch

    from models.torch_layers import LayerStack, loss_fn, synthetic_batch, training_autocast

    stack = LayerStack(arch, seed=0).to(device)
    times, probes = [], []
    for r in range(warmup + repeats):
        x, y = synthetic_batch(arch, 1000 + r, b, device=device)
        if probe is not None:
            probes.append(probe.probe())
        _sync(device)
        t0 = clock()
        try:
            with training_autocast(device):
                out = loss_fn(stack(x), y)
            out.backward()
        except ValueError:
            return None
        _sync(device)
        if r >= warmup:
            times.append(clock() - t0)
        stack.zero_grad(set_to_none=True)
    return statistics.median(times), statistics.median(probes) if probes else None


def _at_speed(s: LayerSample, k: float) -> LayerSample:
    """The sample's times scaled by k (from the speed it ran at to the profile's reference speed)."""
    return s.model_copy(update={f: k * getattr(s, f) for f in ("fwd_s", "bwd_s", "sync_s", "optim_s")})


def optimizer_call_s(device, repeats: int = 30, clock=time.perf_counter) -> float:
    """Fixed cost of one optimizer step call: AdamW over one one-element parameter (median)."""
    import torch

    p = torch.nn.Parameter(torch.zeros(1, device=device))
    opt = torch.optim.AdamW([p], lr=1e-4)
    times = []
    for r in range(5 + repeats):
        p.grad = torch.ones_like(p)
        _sync(device)
        t0 = clock()
        opt.step()
        _sync(device)
        if r >= 5:
            times.append(clock() - t0)
    return statistics.median(times)


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
                  tp_degrees: tuple[int, ...] = (1, 2, 4, 8), dp_degrees: tuple[int, ...] = (2,),
                  max_ranks: int | None = None, warmup: int = 2, repeats: int = 5,
                  threads: int | None = 1, clock: str | None = None, speed_probe: bool = True,
                  whole_stack: bool = False, progress: Progress | None = _stderr) -> ModelProfile:
    """Measure every distinct layer of `arch` at every (tp, micro-batch) that its shapes allow, and
    under FSDP2 over each of `dp_degrees` (dp > 1 samples, for plans that shard data parallelism).
    `max_ranks`: no (tp, dp) sample of more ranks than that (tp x dp), as no plan of as many ranks runs it.

    `clock`: "wall" (synchronized wall time; the default on CUDA) or "thread" (CPU time of the one
    compute thread; the default on CPU, where it does not count the time other tenants of the host
    hold the core, so a profile does not depend on what else runs). `speed_probe`: time the
    reference kernel of `arena_opt.profiling.speed` before every repeat and store every sample at
    the profile's median probe time (`probe_s`), so that layers timed a minute apart on a host
    whose speed drifts still add up. `whole_stack`: also time the whole model at every micro-batch size
    against the sum of its layers (`ModelProfile.stack`, the composition's per-size correction). Off by
    default because the correction that reads it (`layer_parts(stack=True)`) is off by default, and the
    whole model costs about as much to time again as all its layers."""
    import torch

    from models.torch_layers import training_dtype

    dev = torch.device(device)
    clock = clock or ("thread" if dev.type == "cpu" else "wall")
    if clock == "thread" and (dev.type != "cpu" or (threads or torch.get_num_threads()) != 1):
        raise ValueError("clock='thread' needs a CPU device and threads=1 (one compute thread)")
    clock_fn = time.thread_time if clock == "thread" else time.perf_counter
    if dev.type == "cpu" and threads:
        torch.set_num_threads(threads)
    groups = distinct_layers(arch)
    last = layer_table(arch).num_layers - 1
    shapes = _input_shapes(arch, {idx[0] for _, idx in groups}, dev)
    dps = [d for d in dp_degrees if d > 1]
    todo = [(kind, idx, tp, dp) for kind, idx in groups for tp in tp_degrees if _tp_ok(arch, idx[0], tp)
            for dp in [1, *dps] if max_ranks is None or tp * dp <= max_ranks]
    world = math.lcm(*(tp * dp for _, _, tp, dp in todo)) if todo else 1
    total = len(todo) * len(micro_batches)
    done, t_start = 0, time.perf_counter()
    layers = []
    by_group: dict[int, list[tuple[LayerSample, float | None]]] = {}  # (sample, its probe time)
    probe = SpeedProbe(device) if speed_probe else None
    with fake_group(world) as meshes:
        if meshes is None:
            todo = [t for t in todo if t[3] == 1]
            total = len(todo) * len(micro_batches)
        for kind, idx, tp, dp in todo:
            shape, integer = shapes[idx[0]]
            # a plain sample (tp = dp = 1) runs the hand-built layer: no mesh to build for it
            mesh = meshes.get(dev.type, dp, tp) if meshes is not None and tp * dp > 1 else None
            if dp > 1 and mesh is None:
                continue
            for b in micro_batches:
                s, p = measure_layer(arch, idx[0], tp, b, shape, integer, dev, warmup, repeats, clock_fn, dp=dp,
                                     mesh=mesh, loss=idx[0] == last, probe=probe)
                by_group.setdefault(idx[0], []).append((s, p))
                done += 1
                if progress:
                    el = time.perf_counter() - t_start
                    progress(f"[profile] {done}/{total} layer {idx[0]} ({kind}, x{len(idx)}) tp={tp} dp={dp} "
                             f"mb={b}: fwd {1e3 * s.fwd_s:.2f} ms, bwd {1e3 * s.bwd_s:.2f} ms, "
                             f"act {s.act_bytes / 2**20:.2f} MiB  [{el:.0f} s, eta {el / done * (total - done):.0f} s]")
    stacked = {b: got for b in micro_batches if whole_stack
               and (got := measure_stack(arch, b, dev, warmup, repeats, clock_fn, probe)) is not None}
    call_s = optimizer_call_s(dev, clock=clock_fn)
    # the reference speed is the probe's median over the whole profile, each probe taken in the same
    # state (right after layer work) as the probes of a measured run (right after a step)
    probed = [p for got in by_group.values() for _, p in got if p is not None]
    ref_s = statistics.median(probed) if probed else None
    for kind, idx in groups:
        samples = [_at_speed(s, ref_s / p) if ref_s else s for s, p in by_group[idx[0]]]
        layers.append(LayerProfile(indices=idx, kind=kind, samples=samples))
    stack = []
    for b, (t, p) in stacked.items():
        per_layer = {i: s for lp in layers for i in lp.indices for s in lp.samples
                     if (s.tp, s.dp, s.micro_batch) == (1, 1, b)}
        if len(per_layer) < layer_table(arch).num_layers:  # a size some layer was not measured at (alone)
            continue
        stack.append(StackSample(micro_batch=b, stack_s=t * ref_s / p if ref_s else t,
                                 layers_s=sum(s.fwd_s + s.bwd_s for s in per_layer.values())))
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else (platform.processor() or platform.machine())
    if dev.type == "cpu":
        try:
            with open("/proc/cpuinfo") as f:
                name = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), name)
        except OSError:
            pass
    return ModelProfile(model=arch.name, arch=arch, device=dev.type, device_name=name, dtype=training_dtype(dev),
                        threads=torch.get_num_threads() if dev.type == "cpu" else 1, torch=torch.__version__,
                        created=datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), clock=clock, warmup=warmup,
                        repeats=repeats, optim_call_s=call_s, probe_s=ref_s, layers=layers, stack=stack)


def cpu_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1
