"""On-disk profile database: measured per-layer costs and fitted link parameters, one JSON file.

Format (`format = "arena-opt-profile"`, `version = 1`):

    {
      "format": "arena-opt-profile", "version": 1,
      "models": [                                   # keyed by (model, device, dtype)
        {"model": "gpt-350M@h64l4", "arch": {...},  # the exact architecture profiled
         "device": "cpu", "device_name": "AMD EPYC ...", "dtype": "fp32", "threads": 1,
         "torch": "2.13.0", "created": "2026-...Z", "clock": "thread", "warmup": 2, "repeats": 5,
         "optim_call_s": ...,                       # fixed cost of one optimizer step call
         "probe_s": ...,                            # speed probe time the samples are scaled to (optional)
         "stack": [{"micro_batch": 2, "stack_s": ..., "layers_s": ...}],  # whole model (optional)
         "layers": [                                # one entry per distinct layer shape
           {"indices": [1, 2, 3, 4], "kind": "block",
            "samples": [                            # keyed by (tp, dp, micro_batch)
              {"tp": 1, "dp": 1, "micro_batch": 2, "fwd_s": ..., "bwd_s": ..., "sync_s": 0, "optim_s": ...,
               "act_bytes": ..., "out_bytes": ..., "params": ...}]}]}],
      "comm": [                                     # keyed by (device, backend, link, collective, group)
        {"device": "cpu", "backend": "gloo", "link": "loopback", "collective": "all_reduce",
         "group": 4, "alpha_s": ..., "bandwidth_bps": ..., "mean_rel_err": ...,
         "points": [[group_size, bytes, seconds], ...],
         "cpu_alpha_s": ..., "cpu_bandwidth_bps": ..., "cpu_mean_rel_err": ..., "cores": 2,  # optional
         "cpu_points": [[group_size, bytes, cpu_seconds_per_rank], ...]}]
    }

Times are medians in seconds for one micro-batch on one rank (`fwd_s`, `bwd_s` of the layer's
shard under tp, as the runtime wraps it (DTensor) where it does, the last layer's including the
loss; `optim_s` one optimizer step of its parameters). Samples with `dp` > 1 ran under FSDP2 over dp
ranks (collectives excluded): forward and backward of a micro-batch without gradient sync,
`sync_s` the extra backward work of the micro-batch that synchronises, `optim_s` the step on the
1/dp shard. `optim_call_s` is the fixed cost of one optimizer step call that every layer's
`optim_s` includes once. `act_bytes` are the bytes autograd
keeps for the backward pass, `out_bytes` the layer output (what a pipeline stage sends), `params`
the parameters one tp rank holds. `probe_s` is the time of the speed probe
(`arena_opt.profiling.speed`) at the host speed every sample was rescaled to; a run that times the
same probe is estimated at its own speed by scaling compute with the ratio of the two.
`stack` (optional) holds whole-model samples per micro-batch size: forward, loss and backward of the
chained layers against the sum of the layers' own samples (`stack_s`, `layers_s`); the composition can
scale every layer's forward and backward by their ratio at the micro-batch size it runs (`layer_parts(stack=True)`).
`dp`, `sync_s`, `optim_call_s` and `probe_s` are optional (profiles written
before they existed read as dp = 1, no sync work, no per-call cost). Files are JSON only (never pickle); a file of another format or
version, or with a bad field, is rejected with the file, field and value in the message.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import (BaseModel, ConfigDict, Field, NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt,
                      ValidationError, model_validator)

from arena_opt.errors import InputError
from arena_opt.io import load_json
from arena_opt.perf.comm import COLLECTIVES, AlphaBeta, Collective
from models.catalog import Arch
from arena_opt.io import atomic_write

FORMAT = "arena-opt-profile"
VERSION = 1


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class LayerSample(_Strict):
    tp: PositiveInt
    dp: PositiveInt = 1
    micro_batch: PositiveInt
    fwd_s: PositiveFloat
    bwd_s: PositiveFloat
    sync_s: NonNegativeFloat = 0.0
    optim_s: NonNegativeFloat
    act_bytes: NonNegativeInt
    out_bytes: NonNegativeInt
    params: NonNegativeInt


class LayerProfile(_Strict):
    indices: list[NonNegativeInt] = Field(min_length=1, description="layers of the table with this shape")
    kind: str
    samples: list[LayerSample] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique(self) -> "LayerProfile":
        keys = [(s.tp, s.dp, s.micro_batch) for s in self.samples]
        if len(set(keys)) != len(keys):
            raise ValueError("samples repeat a (tp, dp, micro_batch) shape")
        return self

    def at(self, tp: int, dp: int = 1) -> list[LayerSample]:
        return sorted((s for s in self.samples if s.tp == tp and s.dp == dp), key=lambda s: s.micro_batch)

    @property
    def tp_degrees(self) -> list[int]:
        return sorted({s.tp for s in self.samples if s.dp == 1})

    def dp_degrees(self, tp: int) -> list[int]:
        """FSDP degrees measured at this tp (dp > 1 only)."""
        return sorted({s.dp for s in self.samples if s.tp == tp and s.dp > 1})


class StackSample(_Strict):
    """The whole model (tp 1, one process) at one micro-batch size: forward, loss and backward as one
    chain (`stack_s`), and the sum of its layers' own samples at that size (`layers_s`), both at the
    profile's reference speed. Their ratio is what the layers do differently alone than in the chain
    (caches warm from the previous layer, per-layer timing), measured, not fitted."""

    micro_batch: PositiveInt
    stack_s: PositiveFloat
    layers_s: PositiveFloat


class ModelProfile(_Strict):
    model: str
    arch: Arch
    device: str = Field(description="'cpu' or 'cuda'")
    device_name: str = ""
    dtype: Literal["fp32", "bf16", "fp16"] = Field("fp32", description="precision the layers were timed at")
    threads: PositiveInt = 1
    torch: str = ""
    created: str = ""
    clock: Literal["wall", "thread"] = "wall"
    warmup: NonNegativeInt = 0
    repeats: PositiveInt = 1
    optim_call_s: NonNegativeFloat = 0.0
    probe_s: PositiveFloat | None = Field(None, description="the speed probe's time at the speed every sample "
                                          "is stored at (arena_opt.profiling.speed); None: not probed")
    layers: list[LayerProfile] = Field(min_length=1)
    stack: list[StackSample] = Field(default_factory=list, description="whole-model samples; [] in old profiles")

    def stack_scale(self, b: float) -> float:
        """Whole stack over the sum of its layers at micro-batch size `b`: piecewise linear between the
        measured sizes, the nearest one's beyond them; 1 without stack samples."""
        import numpy as np

        if not self.stack:
            return 1.0
        got = sorted(self.stack, key=lambda s: s.micro_batch)
        return float(np.interp(b, [s.micro_batch for s in got], [s.stack_s / s.layers_s for s in got]))

    @model_validator(mode="after")
    def _cover(self) -> "ModelProfile":
        from models.layers import layer_table

        if self.arch.name != self.model:
            raise ValueError(f"model {self.model!r} does not match arch.name {self.arch.name!r}")
        n = layer_table(self.arch).num_layers
        seen = sorted(i for lp in self.layers for i in lp.indices)
        if seen != list(range(n)):
            raise ValueError(f"layers must cover indices 0..{n - 1} of {self.model} exactly once")
        return self

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.model, self.device, self.dtype)

    def layer_of(self) -> list[LayerProfile]:
        """The profile entry of every layer index."""
        out: list[LayerProfile | None] = [None] * sum(len(lp.indices) for lp in self.layers)
        for lp in self.layers:
            for i in lp.indices:
                out[i] = lp
        return out  # type: ignore[return-value]

    @property
    def tp_degrees(self) -> list[int]:
        """tp degrees measured for every layer."""
        sets = [set(lp.tp_degrees) for lp in self.layers]
        return sorted(set.intersection(*sets))


class CommFit(_Strict):
    device: str
    backend: str
    link: str = Field(description="link kind the points crossed: nvlink, pcie, infiniband, ethernet, loopback")
    collective: Collective
    group: PositiveInt | None = Field(None, description="fitted on this group size only; None = all group sizes "
                                                        "through the ring algorithm's factors")
    alpha_s: NonNegativeFloat
    bandwidth_bps: PositiveFloat
    mean_rel_err: NonNegativeFloat
    points: list[tuple[PositiveInt, PositiveInt, PositiveFloat]] = Field(default_factory=list)
    # per-rank CPU time of the collective (same alpha-beta form), measured on a host of `cores` cores
    cpu_alpha_s: NonNegativeFloat | None = None
    cpu_bandwidth_bps: PositiveFloat | None = None
    cpu_mean_rel_err: NonNegativeFloat | None = None
    cores: PositiveInt | None = None
    cpu_points: list[tuple[PositiveInt, PositiveInt, PositiveFloat]] = Field(default_factory=list)

    @property
    def key(self) -> tuple[str, str, str, str, int | None]:
        return (self.device, self.backend, self.link, self.collective, self.group)

    def alpha_beta(self) -> AlphaBeta:
        return AlphaBeta(alpha_s=self.alpha_s, bandwidth_bps=self.bandwidth_bps)

    def cpu_alpha_beta(self) -> AlphaBeta | None:
        if self.cpu_alpha_s is None or self.cpu_bandwidth_bps is None:
            return None
        return AlphaBeta(alpha_s=self.cpu_alpha_s, bandwidth_bps=self.cpu_bandwidth_bps)


class ProfileDB(_Strict):
    format: Literal["arena-opt-profile"] = FORMAT
    version: Literal[1] = VERSION
    models: list[ModelProfile] = Field(default_factory=list)
    comm: list[CommFit] = Field(default_factory=list)

    def model(self, name: str, device: str | None = None, dtype: str | None = None) -> ModelProfile | None:
        for m in self.models:
            if m.model == name and device in (None, m.device) and dtype in (None, m.dtype):
                return m
        return None

    def put_model(self, prof: ModelProfile) -> None:
        self.models = [m for m in self.models if m.key != prof.key] + [prof]

    def put_comm(self, fit: CommFit) -> None:
        self.comm = [c for c in self.comm if c.key != fit.key] + [fit]

    def comm_fits(self, device: str, backend: str | None = None) -> dict[tuple[str, str, int | None], AlphaBeta]:
        """(link, collective, group size or None) -> fitted alpha-beta for one device (and backend)."""
        return {(c.link, c.collective, c.group): c.alpha_beta() for c in self.comm
                if c.device == device and backend in (None, c.backend)}

    def comm_cpu_fits(self, device: str, backend: str | None = None
                      ) -> dict[tuple[str, str, int | None], tuple[AlphaBeta, int | None]]:
        """(link, collective, group size or None) -> (fit of the per-rank CPU time, cores measured on)."""
        return {(c.link, c.collective, c.group): (ab, c.cores) for c in self.comm
                if c.device == device and backend in (None, c.backend) and (ab := c.cpu_alpha_beta()) is not None}


def load(path: str | Path) -> ProfileDB:
    path = Path(path)
    raw = load_json(path, "profile database")
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        got = raw.get("format") if isinstance(raw, dict) else type(raw).__name__
        raise InputError(f"{path}: field format: expected {FORMAT!r} (value {got!r})")
    if raw.get("version") != VERSION:
        raise InputError(f"{path}: field version: this arena-opt reads profile version {VERSION} "
                         f"(value {raw.get('version')!r}); re-run `arena-opt profile`")
    try:
        return ProfileDB.model_validate(raw)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(x) for x in err["loc"]) or "(top level)"
        value = err.get("input")
        shown = repr(value) if not isinstance(value, (dict, list)) else type(value).__name__
        raise InputError(f"{path}: field {loc}: {err['msg']} (value {shown})") from None


def load_or_new(path: str | Path) -> ProfileDB:
    return load(path) if Path(path).is_file() else ProfileDB()


def save(db: ProfileDB, path: str | Path) -> None:
    """Write atomically: a crash never leaves half a database."""
    atomic_write(path, db.model_dump_json(indent=1) + "\n")


__all__ = ["FORMAT", "VERSION", "CommFit", "LayerProfile", "LayerSample", "ModelProfile", "ProfileDB", "load",
           "load_or_new", "save", "COLLECTIVES"]
