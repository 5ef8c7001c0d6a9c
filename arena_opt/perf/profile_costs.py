"""Iteration time of any plan from a profile: measured per-layer compute at the plan's micro-batch
and tp shard, plus the collectives the runtime issues, composed by `arena_opt.perf.compose` (the
same min-max stage split and 1F1B formula as the analytical model).

Collectives follow what `runners.parallelize` runs (DTensor tensor parallelism, DDP or FSDP2,
torch pipelining), each timed with the alpha-beta model of the link it crosses: a measured fit
from the profile database when there is one (per group size if measured so), else the link kind's
published default.

Per layer under tp (activations h = b x seq x hidden values):
- embedding (vocabulary-parallel rows): forward all-reduce of h;
- block: forward 2 all-reduces of h (attention and MLP row-parallel outputs); backward one per
  column-parallel input (q, k, v, and w1 [+ w3]);
- MoE block: attention as a block, and one forward and 1-2 backward all-reduces per expert of the
  tokens it received;
- head: forward all-gather of the vocabulary-sharded logits, backward all-reduce of h.
Data parallelism: DDP (pp = tp = 1) all-reduces all gradients once per step; FSDP2 (dp with pp or
tp) all-gathers each layer's parameters in forward and backward of every micro-batch and
reduce-scatters gradients once per step.

Measured pieces beyond the layers' own forward and backward (see `profiling.layers`): tp samples
include the runtime's DTensor work, FSDP2 plans use the layers' dp > 1 samples (FSDP2's forward and
backward work, `sync_s` once per step, the sharded optimizer step) when the profile has them (the
nearest measured dp degree), the last layer includes the loss, and a stage pays the optimizer's
fixed per-call cost (`optim_call_s`) once instead of once per layer.

Processes that outnumber the host's cores share them. `layer_costs` scales compute by
(world + background) / cores when above 1, where background is the co-located load in cores (the
`perf.sharing` module computes it for jobs that share a host or a link); `plan_time` on a host with
`cores` set instead runs the plan's 1F1B schedule as a processor-sharing simulation (`ps_schedule`):
every rank that computes at an instant gets min(1, cores / (computing ranks + background)) of a core,
ranks waiting on a collective, a transfer or a pipeline dependency use none. Without pipelining this
is the same scaling; with it, ranks idle in the pipeline bubble leave their share to the others.
On a host shared with other tenants, `host_background` turns the share of a core a run's computing ranks
measurably got (kernel run-queue accounting, `profiling.measure`) into the background that gives the same
share in the schedule, which places a dedicated-host estimate on the host as that run found it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from arena_opt.errors import InputError
from arena_opt.perf.comm import AlphaBeta, default_alpha_beta
from arena_opt.perf.compose import LayerCosts, StageSplit, evaluate_split
from arena_opt.plan import Plan
from arena_opt.perf.profile_db import LayerSample, ModelProfile, ProfileDB

BYTES_PER_PARAM_FP32_ADAM = 4 + 4 + 8  # weights, gradients, Adam m and v
DDP_BUCKET_BYTES = 25 * 2 ** 20


@dataclass(frozen=True)
class CommModel:
    """Alpha-beta per (link, collective, group size); `None` group = any group size."""

    fits: dict[tuple[str, str, int | None], AlphaBeta] = field(default_factory=dict)
    defaults: dict[str, AlphaBeta] = field(default_factory=dict)
    # per-rank CPU time of a collective (fit, cores of the host it was measured on): CPU hosts only
    cpu_fits: dict[tuple[str, str, int | None], tuple[AlphaBeta, int | None]] = field(default_factory=dict)

    def time(self, collective: str, nbytes: float, n: int, link: str) -> float:
        if nbytes <= 0 or (n <= 1 and collective != "p2p"):
            return 0.0
        ab = self.fits.get((link, collective, n)) or self.fits.get((link, collective, None))
        if ab is None:
            ab = self.defaults.get(link)
        if ab is None:
            ab = default_alpha_beta(link) if link in ("nvlink", "pcie", "infiniband", "ethernet") else None
        if ab is None:
            raise InputError(f"no alpha-beta parameters for {collective} over link {link!r}: run "
                             "`arena-opt profile --comm` on this host or name a known link kind")
        return float(ab.time(collective, nbytes, n))  # type: ignore[arg-type]

    def split(self, collective: str, nbytes: float, n: int, link: str) -> tuple[float, float, float]:
        """(wall, cpu, wait) seconds of a collective: `cpu` the CPU time each rank spends on it, `wait`
        the rest. The micro-benchmark ran n ranks on `cores` cores and nothing else, so its wall time is
        cpu * max(1, n / cores) + wait; without a CPU fit everything is wait."""
        wall = self.time(collective, nbytes, n, link)
        hit = self.cpu_fits.get((link, collective, n)) or self.cpu_fits.get((link, collective, None))
        if wall <= 0 or hit is None:
            return wall, 0.0, wall
        ab, cores = hit
        share = max(1.0, n / cores) if cores else 1.0
        cpu = min(float(ab.time(collective, nbytes, n)), wall / share)  # type: ignore[arg-type]
        return wall, cpu, wall - cpu * share


def comm_model(db: ProfileDB, device: str, backend: str | None = None,
               defaults: dict[str, AlphaBeta] | None = None) -> CommModel:
    return CommModel(db.comm_fits(device, backend), defaults or {}, db.comm_cpu_fits(device, backend))


@dataclass(frozen=True)
class Topology:
    """Which link each group crosses. On one host every group is `intra`."""

    nodes: int = 1
    gpus_per_node: int = 1
    intra: str = "loopback"
    inter: str = "ethernet"
    cores: int | None = None  # CPU cores the ranks of one host share; None = one device per rank
    background: float = 0.0  # cores busy with co-located work on average (other jobs, other tenants)

    def link(self, group_span: int) -> str:
        """Link of a group of consecutive ranks spanning `group_span` ranks."""
        return self.inter if self.nodes > 1 and group_span > self.gpus_per_node else self.intra


def _interp(samples: list[LayerSample], b: float, attr: str) -> float:
    """Piecewise-linear in the micro-batch size, linear extrapolation past the measured range."""
    xs = np.array([s.micro_batch for s in samples], dtype=float)
    ys = np.array([getattr(s, attr) for s in samples], dtype=float)
    if len(xs) == 1:
        return float(ys[0] * b / xs[0])
    if b <= xs[0]:
        slope = (ys[1] - ys[0]) / (xs[1] - xs[0])
        return float(max(ys[0] + slope * (b - xs[0]), ys[0] * b / xs[0], 0.0))
    if b >= xs[-1]:
        slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
        return float(max(ys[-1] + slope * (b - xs[-1]), 0.0))
    return float(np.interp(b, xs, ys))


@dataclass(frozen=True)
class RuntimeSemantics:
    """Behaviour of the training runtime that changes which collectives run."""

    dp_mode: str = "ddp"  # "ddp": DDP for pure dp, FSDP2 with tp or pp (runners' default); "fsdp": always
    ddp_overlap: float = 0.0  # fraction of the last backward that hides DDP's all-reduce (0 = none)


def _tp_collectives(prof: ModelProfile, kind: str, tp: int, b: float, out_bytes: float
                    ) -> tuple[list[tuple[str, float]], list[tuple[str, float]]]:
    """(forward, backward) collectives of one layer under tp: (collective, bytes) each."""
    if tp <= 1:
        return [], []
    a = prof.arch
    h = b * a.seq_len * a.hidden * 4
    if kind == "embed":
        return [("all_reduce", h)], []
    mlp_in = 2 if a.gated_mlp else 1
    if kind == "block":
        return [("all_reduce", h)] * 2, [("all_reduce", h)] * (3 + mlp_in)
    if kind == "moe_block":
        e = a.num_experts
        per_expert = h * min(a.moe_top_k, e) / e
        return ([("all_reduce", h)] + [("all_reduce", per_expert)] * e,
                [("all_reduce", h)] * 3 + [("all_reduce", per_expert)] * (e * mlp_in))
    if kind == "head":
        return [("all_gather", out_bytes * tp)], [("all_reduce", h)]
    raise InputError(f"tensor parallelism of {kind!r} layers is not modelled (the runners do not shard them)")


@dataclass(frozen=True)
class LayerParts:
    """Per-layer pieces of one micro-batch (compute unscaled) and of the step's tail."""

    fwd_s: np.ndarray  # forward compute (+ loss on the last layer)
    bwd_s: np.ndarray  # backward compute (+ recomputed forward)
    comm_fwd_s: np.ndarray  # tp collectives and FSDP all-gather in forward (wall time)
    comm_bwd_s: np.ndarray  # ... in backward
    p2p_s: np.ndarray  # one transfer of this layer's output (or of its gradient) to the next stage
    dp_s: np.ndarray  # gradient synchronisation once per step (DDP all-reduce, FSDP reduce-scatter)
    # the same collectives split into per-rank CPU time and the rest (`CommModel.split`)
    comm_cpu_fwd_s: np.ndarray
    comm_wait_fwd_s: np.ndarray
    comm_cpu_bwd_s: np.ndarray
    comm_wait_bwd_s: np.ndarray
    dp_cpu_s: np.ndarray
    dp_wait_s: np.ndarray
    tail_cpu_s: np.ndarray  # once per step: optimizer (less the per-call cost) + FSDP sync work
    static_bytes: np.ndarray
    act_bytes: np.ndarray
    peak_bytes: np.ndarray
    call_s: float  # optimizer step call, once per stage


def _nearest(values: list[int], want: int) -> int:
    return min(values, key=lambda v: (abs(math.log(v / want)), v))


def layer_parts(prof: ModelProfile, comm: CommModel, topo: Topology, *, batch: int, dp: int, tp: int, m: int,
                pp: int, recompute: bool = False, semantics: RuntimeSemantics = RuntimeSemantics(),
                stack: bool = False) -> LayerParts:
    """Per-layer pieces of one micro-batch of batch / (dp * m) samples from measured samples at tp.
    `stack`: every layer's forward and backward scaled by the profile's whole-stack over layer-sum ratio at
    this micro-batch size (`ModelProfile.stack_scale`); off by default: on session 7's run it mended
    wide_resnet's whole-model plans but made its pipeline stages and every gpt plan worse (CPU work)."""
    if tp not in prof.tp_degrees:
        raise InputError(f"profile of {prof.model} on {prof.device} has no tp = {tp} samples "
                         f"(measured: {prof.tp_degrees})")
    b = batch / (dp * m)
    layers = prof.layer_of()
    n = len(layers)
    world = pp * dp * tp
    tp_link = topo.link(tp)
    dp_link = topo.link(dp * tp)
    pp_link = topo.link(world) if pp > 1 else topo.intra
    fsdp = dp > 1 and (semantics.dp_mode == "fsdp" or tp > 1 or pp > 1)
    call = prof.optim_call_s
    stack_k = prof.stack_scale(b) if stack else 1.0

    fwd, bwd, cf, cb, p2p, dps, tail = (np.zeros(n) for _ in range(7))
    cfc, cfw, cbc, cbw, dpc, dpw = (np.zeros(n) for _ in range(6))
    static, act, peak = (np.zeros(n) for _ in range(3))

    def add(coll: list[tuple[str, float, int, str]]) -> np.ndarray:
        return np.sum([comm.split(c, nb, g, link) for c, nb, g, link in coll], axis=0) if coll else np.zeros(3)

    for i, lp in enumerate(layers):
        base = lp.at(tp)
        measured_dp = lp.dp_degrees(tp) if fsdp else []
        samples = lp.at(tp, _nearest(measured_dp, dp)) if measured_dp else base
        f, bw = stack_k * _interp(samples, b, "fwd_s"), stack_k * _interp(samples, b, "bwd_s")
        out_b = _interp(base, b, "out_bytes")
        params = base[0].params
        fwd[i], bwd[i] = f, bw + (f if recompute else 0.0)
        f_coll, b_coll = _tp_collectives(prof, lp.kind, tp, b, out_b)
        f_all = [(c, nb, tp, tp_link) for c, nb in f_coll]
        b_all = [(c, nb, tp, tp_link) for c, nb in b_coll]
        pbytes = params * 4.0
        if fsdp:
            f_all.append(("all_gather", pbytes, dp, dp_link))
            b_all.append(("all_gather", pbytes, dp, dp_link))
            dps[i], dpc[i], dpw[i] = add([("reduce_scatter", pbytes, dp, dp_link)])
        cf[i], cfc[i], cfw[i] = add(f_all)
        cb[i], cbc[i], cbw[i] = add(b_all)
        full_out = out_b * (tp if lp.kind == "head" else 1)
        p2p[i] = comm.time("p2p", full_out, 2, pp_link) if pp > 1 else 0.0
        optim = max(0.0, samples[0].optim_s - call) if params else 0.0
        if fsdp and not measured_dp:  # an old profile: the 1/dp shard of the layer's measured step
            optim /= dp
        tail[i] = optim + _interp(samples, b, "sync_s")
        static[i] = params * BYTES_PER_PARAM_FP32_ADAM / (dp if fsdp else 1)
        act[i] = _interp(base, b, "act_bytes")
        if recompute:
            act[i], peak[i] = _interp(base, b, "out_bytes"), act[i]
    if dp > 1 and not fsdp:
        # DDP: gradients in 25 MiB buckets, all-reduced once per step after the last backward
        total = float(sum(lp.at(tp)[0].params for lp in layers)) * 4.0
        buckets = max(1, math.ceil(total / DDP_BUCKET_BYTES))
        t_ar, c_ar, w_ar = (buckets * x for x in comm.split("all_reduce", total / buckets, dp, dp_link))
        last_bwd = stack_k * float(sum(_interp(lp.at(tp), b, "bwd_s") for lp in layers))
        exposed = max(t_ar - semantics.ddp_overlap * last_bwd, t_ar / buckets)
        weights = np.array([lp.at(tp)[0].params for lp in layers], dtype=float)
        w = weights / max(weights.sum(), 1.0)
        hidden = 1.0 - exposed / t_ar if t_ar > 0 else 0.0  # the part under the backward costs no wait
        dps, dpc, dpw = exposed * w, c_ar * w, max(0.0, w_ar - hidden * t_ar) * w
    return LayerParts(fwd_s=fwd, bwd_s=bwd, comm_fwd_s=cf, comm_bwd_s=cb, p2p_s=p2p, dp_s=dps, tail_cpu_s=tail,
                      comm_cpu_fwd_s=cfc, comm_wait_fwd_s=cfw, comm_cpu_bwd_s=cbc, comm_wait_bwd_s=cbw,
                      dp_cpu_s=dpc, dp_wait_s=dpw, static_bytes=static, act_bytes=act, peak_bytes=peak,
                      call_s=call)


def layer_costs(prof: ModelProfile, comm: CommModel, topo: Topology, *, batch: int, dp: int, tp: int, m: int,
                pp: int, recompute: bool = False, semantics: RuntimeSemantics = RuntimeSemantics(),
                compute_scale: np.ndarray | float = 1.0) -> LayerCosts:
    """Per-layer costs of one micro-batch of batch / (dp * m) samples from measured samples at tp.
    `compute_scale` multiplies measured compute per layer (core sharing, or a roofline transfer
    to another device from `transfer_scale`). The optimizer's per-call cost is not in `optim_s`
    (a stage pays it once: `plan_time` adds it)."""
    parts = layer_parts(prof, comm, topo, batch=batch, dp=dp, tp=tp, m=m, pp=pp, recompute=recompute,
                        semantics=semantics)
    return _costs(parts, topo, pp * dp * tp, compute_scale)


def _costs(parts: LayerParts, topo: Topology, world: int, compute_scale: np.ndarray | float) -> LayerCosts:
    n = len(parts.fwd_s)
    scale = np.broadcast_to(np.asarray(compute_scale, dtype=float), (n,))
    if topo.cores:
        scale = scale * max(1.0, (world + topo.background) / topo.cores)
    step = (parts.fwd_s + parts.bwd_s) * scale + parts.comm_fwd_s + parts.comm_bwd_s
    return LayerCosts(step_s=step, p2p_s=2 * parts.p2p_s, allreduce_s=parts.dp_s, optim_s=parts.tail_cpu_s,
                      static_bytes=parts.static_bytes, act_bytes=parts.act_bytes, peak_bytes=parts.peak_bytes,
                      stage_s=parts.call_s)


def ps_schedule(parts: LayerParts, stages: list[tuple[int, int]], m: int, ranks_per_stage: int, cores: float,
                background: float = 0.0, compute_scale: np.ndarray | float = 1.0, stats: dict | None = None
                ) -> float:
    """Iteration time of a 1F1B schedule on `cores` shared cores (processor sharing).

    Stage k runs, in torch's 1F1B order, min(pp - k - 1, m) warm-up forwards, then forward /
    backward pairs, then the remaining backwards, then its tail (optimizer and sync work, then the
    gradient synchronisation). A forward of micro-batch i on stage k starts once stage k - 1 has
    finished it and its output has crossed (p2p); a backward once stage k + 1 has finished its
    backward and the gradient has crossed. Each operation computes (its layers and the CPU work of
    its collectives), then waits for the rest of its collectives.
    All `ranks_per_stage` ranks of a stage (dp x tp) move in step; while c ranks compute, each
    progresses at min(1, cores / (c + background)) of a core. `stats`, if given, receives the
    rank-seconds ranks were computing (`runnable_s`) and the core-seconds they got (`cpu_s`): their
    ratio is the share of a core a computing rank had, what the kernel's run-queue accounting
    measures on a real run (`host_background`)."""
    pp = len(stages)
    runnable_s = cpu_s = 0.0
    n = len(parts.fwd_s)
    scale = np.broadcast_to(np.asarray(compute_scale, dtype=float), (n,))
    ops: list[list[tuple[str, int, float, float]]] = []  # (kind, micro-batch, cpu s, wait s)
    send_f, send_b = [], []
    for k, (a, e) in enumerate(stages):
        fc = float((parts.fwd_s[a:e] * scale[a:e]).sum() + parts.comm_cpu_fwd_s[a:e].sum())
        bc = float((parts.bwd_s[a:e] * scale[a:e]).sum() + parts.comm_cpu_bwd_s[a:e].sum())
        fw, bw = float(parts.comm_wait_fwd_s[a:e].sum()), float(parts.comm_wait_bwd_s[a:e].sum())
        send_f.append(float(parts.p2p_s[e - 1]) if k < pp - 1 else 0.0)
        send_b.append(float(parts.p2p_s[a - 1]) if k > 0 else 0.0)
        w = min(pp - k - 1, m)
        seq = [("F", i, fc, fw) for i in range(w)]
        for i in range(m - w):
            seq += [("F", w + i, fc, fw), ("B", i, bc, bw)]
        seq += [("B", i, bc, bw) for i in range(m - w, m)]
        seq.append(("T", -1, float(parts.tail_cpu_s[a:e].sum() + parts.dp_cpu_s[a:e].sum()) + parts.call_s,
                    float(parts.dp_wait_s[a:e].sum())))
        ops.append(seq)
    done: dict[tuple[str, int, int], float] = {}  # (kind, stage, micro-batch) -> finish time
    pos = [0] * pp
    phase = ["idle"] * pp  # idle (waiting for a dependency), cpu, wait, done
    left = [0.0] * pp
    t = 0.0

    def ready_at(k: int) -> float | None:
        kind, i, _, _ = ops[k][pos[k]]
        if kind == "F" and k > 0:
            d = done.get(("F", k - 1, i))
            return None if d is None else d + send_f[k - 1]
        if kind == "B" and k < pp - 1:
            d = done.get(("B", k + 1, i))
            return None if d is None else d + send_b[k + 1]
        return t

    for _ in range(8 * pp * (2 * m + 1) + 8):
        for k in range(pp):  # start whatever is ready now
            if phase[k] == "idle":
                r = ready_at(k)
                if r is not None and r <= t + 1e-15:
                    phase[k], left[k] = "cpu", ops[k][pos[k]][2]
        if all(ph == "done" for ph in phase):
            break
        busy = sum(ranks_per_stage for ph in phase if ph == "cpu")
        rate = min(1.0, cores / (busy + background)) if busy else 1.0
        steps = [left[k] / rate if phase[k] == "cpu" else left[k] for k in range(pp) if phase[k] in ("cpu", "wait")]
        steps += [r - t for k in range(pp) if phase[k] == "idle" and (r := ready_at(k)) is not None and r > t]
        if not steps:
            raise RuntimeError("pipeline schedule deadlocked")  # cannot happen for 1F1B
        dt = max(0.0, min(steps))
        t += dt
        runnable_s, cpu_s = runnable_s + busy * dt, cpu_s + busy * rate * dt
        for k in range(pp):
            if phase[k] == "cpu":
                left[k] -= dt * rate
                if left[k] <= 1e-12:
                    phase[k], left[k] = "wait", ops[k][pos[k]][3]
            elif phase[k] == "wait":
                left[k] -= dt
            if phase[k] == "wait" and left[k] <= 1e-12:
                kind, i, _, _ = ops[k][pos[k]]
                done[(kind, k, i)] = t
                pos[k] += 1
                phase[k] = "done" if pos[k] == len(ops[k]) else "idle"
    else:
        raise RuntimeError("pipeline schedule simulation did not finish")
    if stats is not None:
        stats.update(runnable_s=runnable_s, cpu_s=cpu_s)
    return t


def schedule_share(prof: ModelProfile, plan: Plan, batch: int, comm: CommModel, topo: Topology,
                   compute_scale: np.ndarray | float = 1.0) -> float:
    """The share of a core a computing rank gets in the processor-sharing run of the plan on
    `topo` (1 where the ranks never outnumber the cores and nothing else runs)."""
    from arena_opt.stages import default_stages

    if not topo.cores:
        raise ValueError("schedule_share needs a host with `cores` set")
    parts, lc = _plan_costs(prof, plan, batch, comm, topo, RuntimeSemantics(), compute_scale)
    stages = list(plan.stages) or default_stages(prof.arch, plan.pp)
    res = evaluate_split(lc, stages, plan.num_microbatches)
    st: dict = {}
    ps_schedule(parts, list(res.stages), plan.num_microbatches, plan.dp * plan.tp, topo.cores, topo.background,
                compute_scale, st)
    return st["cpu_s"] / st["runnable_s"] if st["runnable_s"] > 0 else 1.0


def host_background(prof: ModelProfile, plan: Plan, batch: int, comm: CommModel, topo: Topology, share: float,
                    compute_scale: np.ndarray | float = 1.0, max_background: float = 64.0) -> float:
    """Other tenants' runnable tasks (`Topology.background`) under which a computing rank of the plan
    gets `share` of a core in the processor-sharing schedule: the host's contention, read off a run's
    measured share (its compute thread's on-CPU time over on-CPU plus run-queue delay), so that a
    dedicated-host estimate can be placed on the host as the run found it. 0 where the ranks got at
    least what they get alone. Bisection: the share falls as the background grows."""
    base = replace(topo, background=0.0)
    if not 0 < share or schedule_share(prof, plan, batch, comm, base, compute_scale) <= share:
        return 0.0 if share > 0 else max_background
    lo, hi = 0.0, max_background
    for _ in range(40):
        mid = 0.5 * (lo + hi)
        if schedule_share(prof, plan, batch, comm, replace(topo, background=mid), compute_scale) > share:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def plan_time(prof: ModelProfile, plan: Plan, batch: int, comm: CommModel, topo: Topology,
              semantics: RuntimeSemantics = RuntimeSemantics(), compute_scale: np.ndarray | float = 1.0
              ) -> StageSplit:
    """Iteration time of a plan with its stages (or the runners' default stages when it has none).
    On a host with `topo.cores` set the time is the processor-sharing run of the schedule
    (`ps_schedule`); stage times and memory come from the closed form either way."""
    from arena_opt.stages import default_stages

    parts, lc = _plan_costs(prof, plan, batch, comm, topo, semantics, compute_scale)
    stages = list(plan.stages) or default_stages(prof.arch, plan.pp)
    return _timed(evaluate_split(lc, stages, plan.num_microbatches), parts, prof, plan, topo, compute_scale)


def _plan_costs(prof: ModelProfile, plan: Plan, batch: int, comm: CommModel, topo: Topology,
                semantics: RuntimeSemantics, compute_scale) -> tuple[LayerParts, LayerCosts]:
    parts = layer_parts(prof, comm, topo, batch=batch, dp=plan.dp, tp=plan.tp, m=plan.num_microbatches, pp=plan.pp,
                        recompute=plan.recompute, semantics=semantics)
    return parts, _costs(parts, topo, plan.pp * plan.dp * plan.tp, compute_scale)


def _uniform_only(plan: Plan) -> None:
    # the processor-sharing schedule models one shape for every rank; a per-stage plan would be mispriced
    if not plan.uniform:
        raise ValueError(f"plan {plan.describe()}: the profile model prices uniform plans only")


def _timed(res: StageSplit, parts: LayerParts, prof: ModelProfile, plan: Plan, topo: Topology,
           compute_scale) -> StageSplit:
    """The split's iteration time: the processor-sharing schedule on a host with `topo.cores`, else the
    closed form (which charges the optimizer's per-call cost once per stage, `LayerCosts.stage_s`)."""
    if topo.cores:
        t = ps_schedule(parts, list(res.stages), plan.num_microbatches, plan.dp * plan.tp, topo.cores,
                        topo.background, compute_scale)
        return replace(res, iter_time_s=t)
    return res


def compute_seconds(prof: ModelProfile, plan: Plan, batch: int) -> float:
    """Seconds the busiest rank computes per iteration (forward, backward, recomputation, optimizer),
    without waiting or communication: its busy time on the device, for `perf.sharing`."""
    from arena_opt.stages import default_stages

    _uniform_only(plan)
    b = batch / (plan.dp * plan.num_microbatches)
    layers = prof.layer_of()
    per = []
    for i, lp in enumerate(layers):
        s = lp.at(plan.tp)
        fwd = _interp(s, b, "fwd_s")
        per.append(plan.num_microbatches * (fwd * (2 if plan.recompute else 1) + _interp(s, b, "bwd_s"))
                   + s[0].optim_s)
    stages = list(plan.stages) or default_stages(prof.arch, plan.pp)
    return max(sum(per[a:e]) for a, e in stages)
