"""Error bands of the estimates (arena_opt/perf/band.py): wider outside the calibrated region, covering
held-out measurements at about their nominal rate, and the price the policies decide on."""

import importlib.util
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

from arena_opt.cluster import load_cluster
from arena_opt.feasibility import check_decision
from arena_opt.grids import GridCatalog
from arena_opt.perf.band import Band, BandModel, ResidualRow, default_band
from arena_opt.perf.estimator import PerfEstimator
from arena_opt.policies import REGISTRY, make_policy
from arena_opt.snapshot import ClusterSnapshot, Job

ROOT = Path(__file__).resolve().parent.parent


def _rows(spread: float = 0.1, planner_excess: float = 0.3) -> list[ResidualRow]:
    """Reference residuals at 16 micro-batches on 1-16 GPUs (evenly spread over +-spread), and planner
    residuals at 64 micro-batches that lie `planner_excess` above them."""
    ref = [ResidualRow(kind="reference", family=f, gpu_type=t, num_gpus=n, microbatches=16,
                    log_ratio=spread * (2 * i / 19 - 1))
           for f in ("bert", "moe") for t in ("a", "b") for n in (1, 2, 4, 8, 16) for i in range(20)]
    pl = [ResidualRow(kind="planner", family="bert", gpu_type="a", num_gpus=4, microbatches=64,
                   log_ratio=planner_excess + 0.01 * i) for i in range(20)]
    return ref + pl


def test_band_inside_region_is_the_group_quantiles():
    model = BandModel.build(_rows(), level=0.8)
    b = model.band(2.0, "bert", 4, 16)
    v = np.array([r.log_ratio for r in model.rows if r.kind == "reference" and r.family == "bert"
                  and r.num_gpus in (2, 4)])
    assert b.group == "bert/2-4" and b.n == len(v) and b.octaves == 0 and b.outside == ()
    assert b.lo_s == pytest.approx(2.0 * math.exp(np.quantile(v, 0.1)))
    assert b.hi_s == pytest.approx(2.0 * math.exp(np.quantile(v, 0.9)))
    assert b.decided_s == 2.0  # no caution: the estimate itself
    assert model.band(2.0, "bert", 4, 16, caution=0.9).decided_s == pytest.approx(b.hi_s)
    assert model.band(2.0, "bert", 4, 16, caution=0.5).decided_s == pytest.approx(2.0 * math.exp(np.median(v)))


def test_band_widens_outside_the_calibrated_region():
    model = BandModel.build(_rows(), level=0.8)
    assert model.widen_hi > 0 and model.widen_lo == 0  # planner rows lie above, never below
    inside = model.band(1.0, "bert", 8, 16)
    widths = {}
    for m in (16, 32, 64, 4, 1):
        b = model.band(1.0, "bert", 8, m)
        widths[m] = b.hi_s / b.lo_s
        assert (b.octaves > 0) == (m != 16) and (m != 16) == any("micro-batches" in o for o in b.outside)
    assert widths[16] < widths[32] < widths[64]
    assert widths[16] < widths[4] < widths[1]
    far = model.band(1.0, "bert", 64, 16)  # more GPUs than any measurement
    assert far.octaves == pytest.approx(2) and far.hi_s > inside.hi_s and "64 GPUs" in far.outside[0]
    unseen = model.band(1.0, "gpt", 4, 16)  # a family never measured: every family's residuals
    assert unseen.group == "all" and "family gpt" in unseen.outside
    # the widening is the least that keeps the planner rows' upper tail at its nominal share
    b = model.band(1.0, "bert", 4, 64)
    above = [r for r in model.rows if r.kind == "planner" and math.exp(r.log_ratio) > b.hi_s]
    assert len(above) <= 0.1 * 20 + 1e-9
    tighter = model.model_copy(update={"widen_hi": 0.9 * model.widen_hi}).band(1.0, "bert", 4, 64)
    assert sum(math.exp(r.log_ratio) > tighter.hi_s for r in model.rows if r.kind == "planner") > 2


def test_bands_of_one_configuration_scale_with_the_estimate():
    """A band is kept as factors of its configuration: any estimate's band equals a fresh model's, bit for
    bit, and a copy with another widening does not reuse the original's factors."""
    model = BandModel.build(_rows())
    for nominal in (1.0, 2.5, 0.37, 1234.5):
        for args in (("bert", 4, 64, 0.9), ("bert", 4, 16, None), ("moe", 16, 1, 0.2), ("gpt", 2, 8, 0.5)):
            assert model.band(nominal, *args) == BandModel.build(_rows()).band(nominal, *args)
    wider = model.model_copy(update={"widen_hi": 2 * model.widen_hi})
    assert wider.band(1.0, "bert", 4, 64).hi_s > model.band(1.0, "bert", 4, 64).hi_s


def test_bands_of_many_estimates_are_each_ones_band():
    """`bands` (one family and GPU count, a micro-batch count per estimate: what pricing a grid's Pareto set
    asks) gives each estimate the band `band` gives it on a fresh model, bit for bit."""
    model = BandModel.build(_rows())
    nominals, counts = [1.0, 2.5, 0.37, 1234.5, 2.5], [64, 16, 1, 64, 8]
    for family, gpus, caution in (("bert", 4, 0.9), ("moe", 16, None), ("gpt", 2, 0.2)):
        got = model.bands(nominals, family, gpus, counts, caution)
        assert got == [BandModel.build(_rows()).band(t, family, gpus, m, caution) for t, m in zip(nominals, counts)]
        for b in got:  # built without Band's __init__: the state the constructor gives, fields in order
            made = Band(**vars(b))
            assert made == b and list(vars(made).items()) == list(vars(b).items()) and hash(made) == hash(b)


def _held_out_coverage(rows: list[ResidualRow], level: float = 0.8) -> float:
    """Share of each type's reference residuals inside the bands of a model built without that type."""
    inside = n = 0
    for held in sorted({r.gpu_type for r in rows}):
        model = BandModel.build([r for r in rows if r.gpu_type != held], level=level)
        for r in rows:
            if r.gpu_type == held and r.kind == "reference":
                b = model.band(1.0, r.family, r.num_gpus, r.microbatches)
                inside += b.lo_s <= math.exp(r.log_ratio) <= b.hi_s
                n += 1
    return inside / n


def test_levels_calibrated_on_held_out_types_cover_at_the_nominal_rate():
    """Each type off by its own bias (as each fold's fit leaves one): the other types' plain quantiles
    under-cover a held-out type; the levels read from held-out scores cover at least nominally."""
    rng = np.random.default_rng(3)
    rows = [ResidualRow(kind="reference", family="bert", gpu_type=t, num_gpus=n, microbatches=16,
                        log_ratio=bias + 0.1 * rng.standard_normal())
            for t, bias in zip("abcde", (-0.2, -0.1, 0.0, 0.1, 0.2)) for n in (1, 2, 4, 8) for _ in range(15)]
    model = BandModel.build(rows, level=0.8)
    assert model.calibrated(0.9) > 0.9 and model.calibrated(0.1) < 0.1 and model.calibrated(0.5) == 0.5
    assert _held_out_coverage(rows) >= 0.8
    plain = []
    for r in rows:
        m = BandModel(level=0.8, rows=[x for x in rows if x.gpu_type != r.gpu_type])
        m._cache["scores"] = []  # nominal levels (set before any band is read): the band before this calibration
        b = m.band(1.0, r.family, r.num_gpus, r.microbatches)
        plain.append(b.lo_s <= math.exp(r.log_ratio) <= b.hi_s)
    assert np.mean(plain) < 0.8  # what the calibration repairs
    # the caution quantile is read at the same calibrated level as the band's edge
    assert model.band(1.0, "bert", 4, 16, caution=0.9).decided_s == pytest.approx(model.band(1.0, "bert", 4, 16).hi_s)


def test_committed_band_covers_held_out_types():
    # the held-out coverage of the committed rows estimates the band's coverage with a binomial sampling error;
    # the calibration targets the level in expectation (the synthetic test above holds it strictly), so the
    # committed model may fall short of it by two standard errors at most: one would fail a model calibrated
    # exactly one time in six (at 1d02ca9: 79.7% of 628 at 80%; at the session-13 refit 78.1%, 1.2 errors short)
    rows = default_band().rows
    level = default_band().level
    assert _held_out_coverage(rows) >= level - 2 * math.sqrt(level * (1 - level) / len(rows))


def test_small_group_falls_back_to_family_then_all():
    rows = [r for r in _rows() if not (r.family == "moe" and r.num_gpus == 1)]
    model = BandModel.build(rows, min_group=20)
    assert model.band(1.0, "moe", 1, 16).group == "moe"
    assert model.band(1.0, "moe", 2, 16).group == "moe/2-4"


def test_band_model_round_trips(tmp_path):
    model = BandModel.build(_rows())
    model.save(tmp_path / "band.json")
    back = BandModel.load(tmp_path / "band.json")
    assert back.model_dump() == model.model_dump()
    assert back.band(1.5, "moe", 8, 32, 0.9) == model.band(1.5, "moe", 8, 32, 0.9)


def test_committed_band_model_loads():
    model = default_band()
    assert model is not None and model.rows and model.widen_hi >= 0
    assert {r.kind for r in model.rows} == {"reference", "planner"}


# ---- policies decide on the conservative time ------------------------------------------------------
def _flip_band() -> BandModel:
    """Calibrated only at 16 micro-batches; the planner's other counts were 30% slower than estimated."""
    ref = [ResidualRow(kind="reference", family="bert", gpu_type="x", num_gpus=n, microbatches=16,
                    log_ratio=0.01 * (i % 5 - 2)) for n in (1, 2, 4, 8, 16) for i in range(10)]
    pl = [ResidualRow(kind="planner", family="bert", gpu_type="x", num_gpus=4, microbatches=64, log_ratio=0.3)
          for _ in range(10)]
    return BandModel.build(ref + pl)


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_policies_rank_by_the_conservative_time(name):
    # bert-760M at batch 256 on 4 a40s: the model's fastest plan runs 8 micro-batches (never measured);
    # priced at the band's upper edge it loses to the 16-micro-batch plan the calibration did measure
    cluster = load_cluster("a40:1x4,v100-32gb:1x4")
    job = Job(id="j", model="bert-760M", batch_size=256, total_iterations=1000, remaining_iterations=1000,
              submit_time=0.0, requested_num_gpus=4, min_gpus=4, max_gpus=4)
    snap = ClusterSnapshot(nodes=cluster.nodes, jobs=[job], time=0.0)
    band = _flip_band()
    plain = PerfEstimator(table_mode="off")
    banded = PerfEstimator(table_mode="off", band=band)
    banded.planner = plain.planner
    nominal = make_policy(name, estimator=plain).decide(snap).jobs[0]
    cautious_d = make_policy(name, {"caution": 0.9}, estimator=banded).decide(snap)
    check_decision(snap, cautious_d)
    cautious = cautious_d.jobs[0]
    assert nominal.plan.num_microbatches == 8 and nominal.est_band is None
    assert cautious.plan.num_microbatches == 16
    b = cautious.est_band
    assert b is not None and b.caution == 0.9 and b.outside == []
    assert cautious.est_iter_time_s == pytest.approx(b.decided_s * (cautious.est_slowdown or 1.0))
    assert b.lo_s <= b.nominal_s <= b.decided_s <= b.hi_s
    # the nominal winner, priced the same way, is slower than the plan chosen
    shape_plans = plain.grid(job.arch, 256, cluster.catalog[nominal.gpu_type], None,
                             GridCatalog.of(plain).grids(job, snap)[0].shape)
    m8 = next(r for r in shape_plans.pareto if r.plan.num_microbatches == 8)
    assert band.band(m8.iter_time_s, "bert", 4, 8, 0.9).decided_s > b.decided_s
    # caution None: the same banded estimator decides on the model's own times again
    again = make_policy(name, {"caution": None}, estimator=banded).decide(snap).jobs[0]
    assert again.plan.num_microbatches == 8 and again.est_iter_time_s == pytest.approx(nominal.est_iter_time_s)


def test_measured_grids_carry_no_band():
    """Where the measured table has the grid, its time is a measurement, not the model's."""
    from arena_opt.perf.table import PerfTable

    table = PerfTable({("bert-760M", 256, "a40", 1, 4): 9.0})
    est = PerfEstimator(table=table, band=_flip_band())
    cluster = load_cluster("a40:1x4")
    job = Job(id="j", model="bert-760M", batch_size=256, total_iterations=10, remaining_iterations=10,
              submit_time=0.0, requested_num_gpus=4, min_gpus=4, max_gpus=4)
    snap = ClusterSnapshot(nodes=cluster.nodes, jobs=[job], time=0.0)
    d = make_policy("fcfs", estimator=est).decide(snap).jobs[0]
    assert d.est_band is None


# ---- coverage on Arena's measured table ----------------------------------------------------------
def _bench_band(monkeypatch):
    # bench/ last on the path: its runners.py must not shadow the runners package
    monkeypatch.setattr(sys, "path", [*sys.path, str(ROOT / "bench")])
    spec = importlib.util.spec_from_file_location("bench_band", ROOT / "bench" / "band.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.shared_data
def test_band_covers_held_out_types_at_about_its_level(arena_data, monkeypatch):
    """Leave one GPU type out twice: residuals at the fold's fitted parameters (bench/results/band.json),
    recomputed with this tree's planner, and each type's bands from the other types' residuals only."""
    from arena_opt.perf import calibrate as cal
    from arena_opt.perf.analytical import CostParams
    from arena_opt.perf.table import PerfTable

    folds = json.loads((ROOT / "bench" / "results" / "band.json").read_text())["fold_params"]
    bench = _bench_band(monkeypatch)
    obs = cal.observations(PerfTable.load(arena_data / "prof_records.csv", "alpa_optimal"))
    rows = []
    for held, params in folds.items():
        rows += bench.fold_residuals([o for o in obs if o.gpu_type == held], CostParams.model_validate(params))
    cov = bench.coverage(rows, 0.8)
    for kind in ("reference", "planner"):
        assert cov["all"][kind]["n"] >= 300
        assert 0.65 <= cov["all"][kind]["coverage"] <= 0.95, (kind, cov["all"][kind])
    # the widened planner bands are wider than the in-region ones, and earn their coverage
    assert cov["median_width"]["planner"] > cov["median_width"]["reference"]
