"""Synthetic traces with Philly-like arrivals and sizes (`arena-opt gen-trace`), so that every
command runs on a fresh machine without Arena's data.

Shape of the Microsoft Philly trace (Jeon et al., ATC'19) and of Arena's Philly-derived trace:
- arrivals come in bursts (a user submits several jobs at once) on a diurnal cycle;
- most jobs ask for few GPUs, a tail asks for 8-16;
- run times are heavy-tailed (log-normal: many minutes-long jobs, some lasting days).
Each job's iteration count is its drawn run time at its requested allocation under the
analytical model; its deadline gives it a random slack over that run time. The arrival rate is set
so that the offered load (requested GPU-seconds per second) is `load` times the cluster's GPUs.
"""

from __future__ import annotations

import math

import numpy as np
from pydantic import ConfigDict, Field, PositiveFloat, PositiveInt

from arena_opt.edge import EdgeModel
from arena_opt.errors import InputError
from arena_opt.grids import compact_shape
from arena_opt.perf.estimator import PerfEstimator
from arena_opt.trace import TraceJob
from arena_opt.snapshot import ClusterSnapshot
from models.catalog import ARCHITECTURES

DEFAULT_MODELS = ("gpt-350M", "gpt-1.3B", "gpt-2.6B", "bert-760M", "bert-1.3B", "moe-690M", "moe-1.3B", "moe-2.4B",
                  "wide_resnet-500M", "wide_resnet-1B")


class GenOptions(EdgeModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    jobs: PositiveInt = 200
    seed: int = 0
    load: PositiveFloat = Field(0.8, description="offered load as a fraction of the cluster's GPUs")
    models: tuple[str, ...] = DEFAULT_MODELS
    batch_sizes: tuple[PositiveInt, ...] = (128, 256)
    gpu_counts: dict[int, float] = Field(default_factory=lambda: {1: 0.30, 2: 0.15, 4: 0.25, 8: 0.20, 16: 0.10})
    duration_median_s: PositiveFloat = 3600.0
    duration_sigma: PositiveFloat = 1.2
    duration_min_s: PositiveFloat = 300.0
    duration_max_s: PositiveFloat = 2 * 86400.0
    burst_mean: float = Field(1.5, ge=1.0, description="mean jobs per submission burst")
    diurnal_amplitude: float = Field(0.5, ge=0.0, lt=1.0)
    deadline_slack: tuple[float, float] = (1.5, 4.0)
    deadlines: bool = True


def generate(cluster: ClusterSnapshot, options: GenOptions | None = None,
             estimator: PerfEstimator | None = None) -> list[TraceJob]:
    o = options or GenOptions()
    for m in o.models:
        if m not in ARCHITECTURES:
            raise InputError(f"--models: unknown model {m!r} (see `arena-opt models`)")
    rng = np.random.default_rng(o.seed)
    est = estimator or PerfEstimator(table_mode="off")
    catalog = cluster.catalog
    shapes: dict[str, tuple[int, str | None]] = {}  # GPU type -> (GPUs per node, link) of its largest nodes
    weight: dict[str, int] = {}
    for n in cluster.nodes:
        if n.num_gpus >= shapes.get(n.gpu_type, (0, None))[0]:
            shapes[n.gpu_type] = (n.num_gpus, n.intra_link)
        weight[n.gpu_type] = weight.get(n.gpu_type, 0) + n.num_gpus
    types = sorted(weight)
    type_p = np.array([weight[t] for t in types], dtype=float)
    type_p /= type_p.sum()
    counts = sorted(o.gpu_counts)
    count_p = np.array([o.gpu_counts[c] for c in counts], dtype=float)
    count_p /= count_p.sum()
    memo: dict[tuple, float | None] = {}

    def iter_time(model: str, batch: int, t: str, n: int) -> float | None:
        key = (model, batch, t, n)
        if key not in memo:
            gpn, link = shapes[t]
            if n > gpn and n % gpn:
                memo[key] = None
            else:
                nodes, per = compact_shape(n, gpn)
                r = est.best(ARCHITECTURES[model], batch, catalog[t], link, t, nodes, per)
                memo[key] = None if r is None else r.iter_time_s
        return memo[key]

    drawn = []
    while len(drawn) < o.jobs:
        model = o.models[rng.integers(len(o.models))]
        batch = int(o.batch_sizes[rng.integers(len(o.batch_sizes))])
        t = types[rng.choice(len(types), p=type_p)]
        want = counts[rng.choice(len(counts), p=count_p)]
        # the drawn count if it fits in memory, else the nearest count that does (larger first)
        order = [c for c in counts if c >= want] + [c for c in reversed(counts) if c < want]
        n, it = next(((c, x) for c in order if (x := iter_time(model, batch, t, c)) is not None), (None, None))
        if n is None:
            continue
        dur = float(np.clip(rng.lognormal(math.log(o.duration_median_s), o.duration_sigma), o.duration_min_s,
                            o.duration_max_s))
        drawn.append((model, batch, t, n, dur, max(1, round(dur / it))))

    demand = sum(n * dur for _, _, _, n, dur, _ in drawn)
    total_gpus = sum(weight.values())
    span = demand / (o.load * total_gpus)
    arrivals = _arrivals(rng, o, len(drawn), span)
    out = []
    for k, ((model, batch, t, n, dur, iters), sub) in enumerate(zip(drawn, arrivals)):
        ddl = None
        if o.deadlines:
            ddl = round(sub + dur * rng.uniform(*o.deadline_slack), 1)
        out.append(TraceJob(id=f"job-{k:05d}", submit_time=round(sub, 1), model=model, batch_size=batch,
                            iterations=iters, num_gpus=n, gpu_type=t, deadline=ddl))
    return out


def _arrivals(rng: np.random.Generator, o: GenOptions, n: int, span: float) -> list[float]:
    """n submission times on [0, span]: bursts whose epochs follow a diurnal Poisson process."""
    sizes = []
    while sum(sizes) < n:
        sizes.append(int(rng.geometric(1.0 / o.burst_mean)))
    sizes[-1] -= sum(sizes) - n
    epochs = []
    peak = 1.0 + o.diurnal_amplitude
    while len(epochs) < len(sizes):  # thinning of a rate modulated over the day
        x = rng.uniform(0, span)
        if rng.uniform(0, peak) <= 1.0 + o.diurnal_amplitude * math.sin(2 * math.pi * x / 86400.0):
            epochs.append(x)
    epochs.sort()
    out = []
    for e, s in zip(epochs, sizes):
        out.extend(e + float(rng.uniform(0, 60)) for _ in range(s))  # a burst lands within a minute
    return sorted(out)
