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


def test_rounds_combine_the_host_share_and_the_step_cpu(monkeypatch):
    combine = _bench(monkeypatch).combine
    # a round's share pools its steps: on-CPU / (on-CPU + run-queue delay) of the compute threads
    a = {**_run(1.0, 0.8), "step_cpu_s": [0.5, 0.7], "step_main_cpu_s": [0.5, 0.5], "step_wait_s": [0.5, 1.5]}
    b = {**_run(1.0, 0.8), "step_cpu_s": [0.9, 0.9], "step_main_cpu_s": [1.0, 1.0], "step_wait_s": [0.0, 0.0]}
    c = {**_run(1.0, 0.8), "step_cpu_s": [0.8, 0.8], "step_main_cpu_s": [1.0, 1.0], "step_wait_s": [1.0, 1.0]}
    r = combine([a, b, c])
    assert r["host_share"] == pytest.approx(0.5)  # rounds 0.25, 1.0, 0.5
    assert r["step_cpu_s"] == pytest.approx(0.8)  # round means 0.6, 0.9, 0.8
    # runs without the scheduler accounting: no share, and the window's CPU time stands in
    assert combine([_run(1.0, 0.8)])["host_share"] is None


def test_sched_times_count_this_threads_cpu_and_nothing_while_it_sleeps():
    from arena_opt.profiling.measure import sched_times

    if not os.path.exists("/proc/thread-self/schedstat"):
        pytest.skip("no scheduler accounting on this host")
    import time

    a = sched_times()
    t0 = time.thread_time()
    while time.thread_time() - t0 < 0.05:
        pass
    b = sched_times()
    time.sleep(0.1)
    c = sched_times()
    assert b[1] - a[1] == pytest.approx(0.05, abs=0.02) and b[0] - a[0] >= b[1] - a[1] - 1e-3
    # asleep: neither on a core nor waiting for one. Waking up waits for a core on a loaded host (21 ms
    # seen at load 8), which is run-queue delay; a sleep counted as waiting would add the whole 100 ms
    assert c[1] - b[1] < 0.01 and c[2] - b[2] < 0.05
    assert all(y >= x for x, y in zip(a, c))


@pytest.mark.slow
def test_pinned_ranks_measure_a_plan():
    from arena_opt.plan import Plan
    from arena_opt.profiling.measure import Case, measure
    from models.catalog import get_arch
    from models.torch_layers import scaled_arch

    arch = scaled_arch(get_arch("gpt-350M"), max_hidden=32, max_layers=2, seq_len=16, max_heads=2, max_vocab=128)
    r = measure([Case(arch, Plan(dp=2, num_microbatches=1), 4)], steps=2, warmup=1, pin=True)[0]
    assert len(r["times"]) == 2 and r["iter_s"] > 0 and r["own_cpu_s"] > 0
    # every timed step's CPU and run-queue delay, summed over the ranks
    assert len(r["step_cpu_s"]) == len(r["step_wait_s"]) == 2
    assert all(c >= m > 0 for c, m in zip(r["step_cpu_s"], r["step_main_cpu_s"])) and min(r["step_wait_s"]) >= 0
    assert r["rank0_cores"] == sorted(os.sched_getaffinity(0))[:1]  # rank 0 on the first core it may use
    free = measure([Case(arch, Plan(dp=2, num_microbatches=1), 4)], steps=1, warmup=0)[0]
    assert free["rank0_cores"] == sorted(os.sched_getaffinity(0))  # unpinned: every core


def test_repeatability_of_one_run_pairs_every_plans_rounds(tmp_path):
    import json
    import subprocess

    run = {"git": "abc", "rounds": 3, "steps": 5, "warmup": 1, "cores": 2, "machine": {"processor": "x"},
           "rows": [{"arch": "a", "world": 2, "plan": "p1", "round_s": [1.0, 2.0, 1.5]},
                    {"arch": "a", "world": 4, "plan": "p2", "round_s": [2.0]},  # one round: no pair
                    {"arch": "b", "world": 4, "plan": "p3", "round_s": [1.0, 0.5]}]}
    src = tmp_path / "estimator_accuracy.json"
    src.write_text(json.dumps(run))
    out = tmp_path / "out"
    subprocess.run([sys.executable, "bench/repeatability.py", str(src), "--out", str(out)], cwd=ROOT, check=True,
                   capture_output=True)
    rep = json.loads((out / "repeatability.json").read_text())
    assert rep["mode"] == "rounds"
    assert [(r["plan"], r["rounds"]) for r in rep["rows"]] == [("p1", [1, 2]), ("p1", [1, 3]), ("p1", [2, 3]),
                                                                ("p3", [1, 2])]
    assert [r["rel_diff"] for r in rep["rows"]] == pytest.approx([1.0, 0.5, -0.25, -0.5])
    assert rep["per_world"]["2"]["n"] == 3 and rep["per_world"]["4"]["mean"] == pytest.approx(0.5)
    assert rep["per_world_estimate"] == {}  # one profile: no estimate to compare
    # three runs, or a file that is no estimator_accuracy result: exit 2 naming it
    bad = subprocess.run([sys.executable, "bench/repeatability.py", str(src), str(src), str(src), "--out", str(out)],
                         cwd=ROOT, capture_output=True, text=True)
    assert bad.returncode == 2 and "one or two" in bad.stderr
    other = tmp_path / "other.json"
    other.write_text("{}")
    bad = subprocess.run([sys.executable, "bench/repeatability.py", str(other), "--out", str(out)], cwd=ROOT,
                         capture_output=True, text=True)
    assert bad.returncode == 2 and str(other) in bad.stderr


def test_micro_batches_are_those_the_plans_run(monkeypatch):
    mod = _bench(monkeypatch)
    from models.catalog import get_arch
    from models.torch_layers import scaled_arch

    arch = scaled_arch(get_arch("gpt-350M"), **mod.SCALES["gpt-350M"])
    plans = [p for w in (1, 2, 4) for p in mod.plans_for(arch, w)]
    assert mod.micro_batches(plans) == (2, 4, 8)  # batch 16 over dp x micro-batches: never 1 sample
    assert mod.micro_batches(mod.plans_for(arch, 1)) == (8,)
