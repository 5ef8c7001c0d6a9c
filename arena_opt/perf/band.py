"""Error bands of estimated iteration times, from the calibration's residuals of similar configurations.

A residual is r = log(measured / estimated) of one measured grid, the estimate made by a model fitted
without that grid's GPU type (leave-one-type-out, as bench/estimator.py calibrates): every residual is
out of sample, so the band describes how wrong the model is on a type it has not seen, and holds for a
type it has seen too (conservatively). Two kinds of rows feed the model:

- `reference` rows: the model's estimate of the very configuration that was measured (the measured
  runtime's plan space: Arena ran 16 micro-batches with rematerialisation). They set the band inside
  the calibrated region: the empirical quantiles (1 - level) / 2 and (1 + level) / 2 of the residuals of
  the configuration's group.
- `planner` rows: the planner's own best plan of each measured grid against the same measurement. The
  planner varies what was never measured (micro-batch counts), so its plans lie outside the region; the
  widening per octave of distance from it is fitted on these rows, each side on its own, as the least
  widening whose band still leaves at most (1 - level) / 2 of them beyond that side.

Groups ("similar configurations"): model family x GPU count class (1, 2-4, 8+): the error differs most by
family (wide_resnet's median error is three times bert's) and grows with the GPU count (communication);
GPU type is not a group key because the leave-one-type-out residual of a type is what transfers to an
unseen type. A group with fewer than `min_group` residuals falls back to its family, then to all rows.

Honest coverage (conformal calibration of the quantile levels). A type's residuals are not distributed
like the other types' (each fold's fit leaves its own bias), so the other types' plain quantiles cover a
held-out type less often than nominal (69% at 80% before this). The scores are, for every reference
residual, its mid-rank position inside its group of a model built without its GPU type (leave-one-type-
out again, one level inside the fit's); a quantile q of a band or a caution is read at the level
`calibrated(q)`: the q-quantile of those scores, never less extreme than q itself. Where the types agree,
the scores are uniform and the levels stay nominal. The scores are derived from `rows` (not stored), so
a committed model and a freshly built one calibrate alike.

Which parameters: the residuals are those of the fold's calibrated parameters (bench/band.py fits
`calibrate.fit` from bench/estimator.py's ARENA_BASE on the other types), so a band is the error of the
calibrated model; `source["params"]` records it. The planner prices with the committed all-types fit
(`analytical.calibrated_params`, arena_opt/perf/calibrated_params.json, written by the same bench) unless
given other parameters; an estimator at other parameters gets bands that describe the calibrated model's
error, not its own (the estimator warns of nothing).

Distance from the calibrated region, in octaves: the micro-batch count's distance from the nearest count
the measurements ran, plus the GPU count's distance beyond the measured range. A family no measurement
has gets the pooled group of all families (and is named in `Band.outside`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from arena_opt.edge import built

Kind = Literal["reference", "planner"]


class ResidualRow(BaseModel):
    """One measured grid against one estimate of it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Kind
    family: str
    gpu_type: str
    num_gpus: int
    microbatches: int  # of the estimated plan
    log_ratio: float  # log(measured / estimated)


def count_class(num_gpus: int) -> str:
    return "1" if num_gpus <= 1 else "2-4" if num_gpus <= 4 else "8+"


def residuals(kind: Kind, calibrated: Iterable) -> list[ResidualRow]:
    """Rows of `calibrate.Residual`s (an observation, its estimate and the estimate's plan); grids without
    a finite estimate are left out."""
    out = []
    for c in calibrated:
        t, plan, o = c.predicted_s, c.plan, c.obs
        if plan is None or not math.isfinite(t) or t <= 0:
            continue
        out.append(ResidualRow(kind=kind, family=o.arch.family, gpu_type=o.gpu_type, num_gpus=o.num_gpus,
                               microbatches=plan.num_microbatches, log_ratio=math.log(o.measured_s / t)))
    return out


@dataclass(frozen=True)
class Band:
    """The band of one estimate: measured time within [lo_s, hi_s] with probability `level` (nominal);
    `decided_s` is the conservative time policies decide on (the band's `caution` quantile)."""

    nominal_s: float
    lo_s: float
    hi_s: float
    decided_s: float
    level: float
    caution: float | None
    group: str  # the residual group it comes from
    n: int  # residuals in that group
    octaves: float  # distance from the calibrated region
    outside: tuple[str, ...] = ()  # what of the configuration lies outside it

    def describe(self) -> str:
        s = f"{self.lo_s:.3f}-{self.hi_s:.3f} s ({100 * self.level:.0f}%, {self.group}, n={self.n})"
        return s + (f"; outside: {', '.join(self.outside)}" if self.outside else "")


class BandModel(BaseModel):
    """Residuals, the calibrated region they span and the widening outside it (see the module doc)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    level: float = Field(0.8, gt=0, lt=1, description="nominal coverage of a band")
    min_group: int = Field(20, ge=1, description="fewest residuals a group needs to be used on its own")
    rows: list[ResidualRow]
    widen_lo: float = Field(0.0, ge=0, description="log-units the lower edge moves down per octave outside")
    widen_hi: float = Field(0.0, ge=0, description="log-units the upper edge moves up per octave outside")
    source: dict = Field(default_factory=dict, description="what made the residuals (command, commit, params)")
    _cache: dict = PrivateAttr(default_factory=dict)  # reference rows and sorted groups, derived once

    @classmethod
    def build(cls, rows: list[ResidualRow], *, level: float = 0.8, min_group: int = 20,
              source: dict | None = None) -> "BandModel":
        """The model of `rows`, with its levels calibrated on held-out types and the widening fitted on its
        planner rows."""
        base = cls(level=level, min_group=min_group, rows=rows, source=source or {})
        out = [(r, base._base(r.family, r.num_gpus), base.octaves(r.num_gpus, r.microbatches)[0])
               for r in rows if r.kind == "planner"]
        out = [(r, b, d) for r, b, d in out if d > 0]
        tail = (1 - level) / 2
        hi = _least_widening([(r.log_ratio - b[2], d) for r, b, d in out], tail)
        lo = _least_widening([(b[1] - r.log_ratio, d) for r, b, d in out], tail)
        return base.model_copy(update={"widen_lo": lo, "widen_hi": hi})

    # ---- the calibrated region ------------------------------------------------------------------
    def _reference(self) -> list[ResidualRow]:
        ref = self._cache.get("ref")
        if ref is None:
            ref = self._cache["ref"] = [r for r in self.rows if r.kind == "reference"]
        return ref

    def octaves(self, num_gpus: int, microbatches: int) -> tuple[float, tuple[str, ...]]:
        """Distance of (GPU count, micro-batch count) from the calibrated region, and what lies outside."""
        memo = self._cache.setdefault("octaves", {})
        hit = memo.get((num_gpus, microbatches))
        if hit is None:
            hit = memo[(num_gpus, microbatches)] = self._octaves(num_gpus, microbatches)
        return hit

    def _octaves(self, num_gpus: int, microbatches: int) -> tuple[float, tuple[str, ...]]:
        region = self._cache.get("region")
        if region is None:
            ref = self._reference()
            region = self._cache["region"] = (
                (frozenset(r.microbatches for r in ref), min(r.num_gpus for r in ref), max(r.num_gpus for r in ref),
                 frozenset(r.family for r in ref)) if ref else None)
        if region is None:
            return 0.0, ()
        ms, lo, hi, _ = region
        outside = []
        d_m = min(abs(math.log2(microbatches) - math.log2(m)) for m in ms)
        if d_m > 0:
            outside.append(f"{microbatches} micro-batches (measured: {', '.join(map(str, sorted(ms)))})")
        d_n = max(0.0, math.log2(lo / num_gpus), math.log2(num_gpus / hi))
        if d_n > 0:
            outside.append(f"{num_gpus} GPUs (measured: {lo}-{hi})")
        return d_m + d_n, tuple(outside)

    # ---- bands ----------------------------------------------------------------------------------
    def _groups(self) -> dict[tuple, np.ndarray]:
        g = self._cache.get("groups")
        if g is None:
            acc: dict[tuple, list[float]] = {}
            for r in self._reference():
                for key in ((r.family, count_class(r.num_gpus)), (r.family,), ()):
                    acc.setdefault(key, []).append(r.log_ratio)
            g = self._cache["groups"] = {k: np.sort(np.array(v)) for k, v in acc.items()}
        return g

    def _group(self, family: str, num_gpus: int) -> tuple[str, np.ndarray, float, float]:
        """(name, sorted residuals, lower and upper band quantile) of the configuration's group."""
        key = (family, count_class(num_gpus))
        hit = self._cache.setdefault("chosen", {}).get(key)
        if hit is None:
            groups = self._groups()
            for k in (key, (family,), ()):
                v = groups.get(k)
                if v is not None and len(v) >= min(self.min_group, len(groups.get((), ()))):
                    tail = (1 - self.level) / 2
                    hit = ("/".join(k) or "all", v, float(np.quantile(v, self.calibrated(tail))),
                           float(np.quantile(v, self.calibrated(1 - tail))))
                    break
            else:
                raise ValueError("a band model needs reference residuals")
            self._cache["chosen"][key] = hit
        return hit

    def calibrated(self, q: float) -> float:
        """The level at which the quantile q of a group is read so that it holds on a held-out type: the
        q-quantile of the held-out scores, moved only outwards from the median (q where no scores)."""
        scores = self._cache.get("scores")
        if scores is None:
            scores = self._cache["scores"] = _held_out_scores(self.rows, self.level, self.min_group)
        if not scores:
            return q
        memo = self._cache.setdefault("levels", {})
        hit = memo.get(q)
        if hit is None:
            c = float(np.quantile(scores, q))
            hit = memo[q] = max(q, c) if q >= 0.5 else min(q, c)
        return hit

    def _base(self, family: str, num_gpus: int) -> tuple[np.ndarray, float, float]:
        return self._group(family, num_gpus)[1:]

    def _quantile(self, name: str, v: np.ndarray, q: float) -> float:
        qs = self._cache.setdefault("q", {})
        hit = qs.get((name, q))
        if hit is None:
            hit = qs[(name, q)] = float(np.quantile(v, q))
        return hit

    def band(self, nominal_s: float, family: str, num_gpus: int, microbatches: int,
             caution: float | None = None) -> Band:
        """The band of an estimate of `nominal_s` seconds; `caution` (a quantile, e.g. 0.9) sets
        `decided_s`, None decides on the nominal estimate."""
        return self.bands([nominal_s], family, num_gpus, [microbatches], caution)[0]

    def bands(self, nominals_s, family: str, num_gpus: int, microbatches, caution: float | None = None
              ) -> list[Band]:
        """`band` of several estimates of one family and GPU count (`microbatches` one per estimate), the
        model's caches read once (a private attribute of a pydantic model is a slow lookup)."""
        # every edge is nominal_s times a factor of the configuration: the factors are kept (a cold plan
        # prices thousands of plans of a few configurations)
        level, widen = self.level, (self.widen_lo, self.widen_hi)
        memo = self._cache.setdefault("factors", {}).setdefault((family, num_gpus, caution, level, *widen), {})
        out = []
        for t, m in zip(nominals_s, microbatches):
            f = memo.get(m)  # per micro-batch count
            if f is None:
                f = memo[m] = self._factors(family, num_gpus, m, caution)
            name, n, d, outside, lo, hi, dec = f
            # Band's fields in order, without the frozen dataclass's per-field setattr (4,600 bands a cold
            # medium round)
            out.append(built(Band, {"nominal_s": t, "lo_s": t * lo, "hi_s": t * hi,
                                    "decided_s": t if dec is None else t * dec, "level": level, "caution": caution,
                                    "group": name, "n": n, "octaves": d, "outside": outside}))
        return out

    def _factors(self, family: str, num_gpus: int, microbatches: int, caution: float | None) -> tuple:
        """(group, residuals in it, octaves, outside, lower edge, upper edge, decided time) of a band, the
        three times per second of nominal estimate (decided None: the nominal estimate itself)."""
        name, v, q_lo, q_hi = self._group(family, num_gpus)
        d, outside = self.octaves(num_gpus, microbatches)
        if family not in self._cache["region"][3]:
            outside = (*outside, f"family {family}")
        decided = None
        if caution is not None:
            # inside the band the residuals' own quantile; the widening grows linearly to the band's edge
            side = self.widen_hi if caution >= 0.5 else self.widen_lo
            decided = math.exp(self._quantile(name, v, self.calibrated(caution))
                               + math.copysign(side * d * abs(2 * caution - 1) / self.level, caution - 0.5))
        return (name, len(v), d, outside, math.exp(q_lo - self.widen_lo * d), math.exp(q_hi + self.widen_hi * d),
                decided)

    # ---- files ------------------------------------------------------------------------------------
    def save(self, path: str | Path) -> None:
        from arena_opt.io import atomic_write

        atomic_write(path, self.model_dump_json(indent=0) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> "BandModel":
        from arena_opt.io import load_model

        return load_model(path, cls)


def _held_out_scores(rows: list[ResidualRow], level: float, min_group: int) -> list[float]:
    """Each reference residual's mid-rank (ties count half) within its group of a model of the other GPU
    types' rows; empty with fewer than two types (nothing to hold out)."""
    types = sorted({r.gpu_type for r in rows if r.kind == "reference"})
    if len(types) < 2:
        return []
    out = []
    for held in types:
        inner = BandModel(level=level, min_group=min_group, rows=[r for r in rows if r.gpu_type != held])
        inner._cache["scores"] = []  # its plain quantiles: the scores measure how they transfer
        for r in rows:
            if r.kind == "reference" and r.gpu_type == held:
                v = inner._group(r.family, r.num_gpus)[1]
                below = np.searchsorted(v, r.log_ratio, "left")
                upto = np.searchsorted(v, r.log_ratio, "right")
                out.append(float((below + upto) / 2 / len(v)))
    return out


def _least_widening(excess: list[tuple[float, float]], tail: float) -> float:
    """Least w >= 0 with at most `tail` of the rows' (excess over the edge, octaves) beyond edge + w * octaves."""
    if not excess:
        return 0.0
    need = [max(0.0, e / d) for e, d in excess]  # the widening each row needs to lie inside
    return float(np.quantile(need, 1 - tail))


DEFAULT_PATH = Path(__file__).with_name("band.json")


def default_band() -> BandModel | None:
    """The committed band model (written by bench/band.py), None where it is not there."""
    return BandModel.load(DEFAULT_PATH) if DEFAULT_PATH.is_file() else None


__all__ = ["Band", "BandModel", "DEFAULT_PATH", "ResidualRow", "count_class", "default_band", "residuals"]
