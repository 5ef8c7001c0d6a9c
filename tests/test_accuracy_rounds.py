"""bench/estimator_accuracy.py's rounds: one plan's launches combined into one measurement (median of the
rounds' medians, their spread), and rank pinning in the direct measurement."""

import importlib.util
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _bench(monkeypatch):
    monkeypatch.setattr(sys, "path", [*sys.path, str(ROOT / "bench")])  # after the runners package
    spec = importlib.util.spec_from_file_location("bench_accuracy", ROOT / "bench" / "estimator_accuracy.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _run(iter_s, cpu, steps=4, **kw):
    return {"iter_s": iter_s, "times": [iter_s] * steps, "own_cpu_s": cpu * steps, "probe_s": 0.01,
            "ambient_runnable": kw.get("bg"), "ambient_cores": 0.5}


def test_rounds_combine_to_their_median_and_spread(monkeypatch):
    combine = _bench(monkeypatch).combine
    r = combine([_run(1.0, 0.8), _run(3.0, 0.9, bg=2.0), _run(1.2, 1.0)])
    assert r["iter_s"] == 1.2 and r["round_s"] == [1.0, 3.0, 1.2]
    assert r["spread"] == pytest.approx((3.0 - 1.0) / 1.2)
    assert r["own_cpu_step_s"] == pytest.approx(0.9) and len(r["times"]) == 12
    assert r["ambient_runnable"] == 2.0  # the rounds that sampled it
    # a round that failed is left out; a plan failed in every round keeps its error
    err = {"plan": {}, "error": "boom"}
    assert combine([err, _run(2.0, 1.0)])["iter_s"] == 2.0
    assert combine([err, err]) is err


@pytest.mark.slow
def test_pinned_ranks_measure_a_plan():
    from arena_opt.plan import Plan
    from arena_opt.profiling.measure import Case, measure
    from models.catalog import get_arch
    from models.torch_layers import scaled_arch

    arch = scaled_arch(get_arch("gpt-350M"), max_hidden=32, max_layers=2, seq_len=16, max_heads=2, max_vocab=128)
    r = measure([Case(arch, Plan(dp=2, num_microbatches=1), 4)], steps=2, warmup=1, pin=True)[0]
    assert len(r["times"]) == 2 and r["iter_s"] > 0 and r["own_cpu_s"] > 0
    assert r["rank0_cores"] == sorted(os.sched_getaffinity(0))[:1]  # rank 0 on the first core it may use
    free = measure([Case(arch, Plan(dp=2, num_microbatches=1), 4)], steps=1, warmup=0)[0]
    assert free["rank0_cores"] == sorted(os.sched_getaffinity(0))  # unpinned: every core
