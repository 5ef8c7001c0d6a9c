"""The simulator on Arena's own data (skipped when ../shared/data/arena is absent)."""

import pytest

from arena_opt.grids import compact_shape

from arena_opt.cluster import load_cluster
from arena_opt.sim import SimOptions, simulate
from arena_opt.trace import load_trace
from arena_opt.metrics import compute
from arena_opt.sim.run import make_estimators

pytestmark = pytest.mark.shared_data


def test_arena_trace_and_cluster_load_as_they_are(arena_data):
    jobs = load_trace(arena_data / "traces" / "simulate_trace_philly.csv", iter_scale=5, deadline_stretch=5)
    assert len(jobs) == 1938
    cl = load_cluster(arena_data / "cluster_spec_derived.json")
    assert sum(n.num_gpus for n in cl.nodes) == 1280 and len(cl.nodes) == 420
    assert {n.gpu_type for n in cl.nodes} == {"a100-40gb", "v100-32gb", "a40", "a10"}


def test_fcfs_on_the_first_jobs_with_the_measured_table(arena_data):
    jobs = load_trace(arena_data / "traces" / "simulate_trace_philly.csv", iter_scale=5, deadline_stretch=5,
                      limit=12)
    cl = load_cluster(arena_data / "cluster_spec_derived.json")
    truth, est = make_estimators(arena_data / "prof_records.csv")
    res = simulate(jobs, cl, "fcfs", truth=truth, estimate=est, reconfig="artifact", options=SimOptions())
    m = compute(res)
    assert m["finished"] + m["rejected"] == 12 and not m["stalled"]
    # FCFS runs the request as it is: a finished job took the artifact's restart (150 s/GPU, cap 600 s)
    # plus its iterations at the table's time for that grid, exactly
    gpn = {n.gpu_type: n.num_gpus for n in cl.nodes}
    checked = 0
    for r in res.job_dicts():
        if r["status"] != "done":
            continue
        n, t = r["requested_num_gpus"], r["requested_gpu_type"]
        nodes, per = compact_shape(n, gpn[t])
        it = truth.table.lookup(r["model"], r["batch_size"], t, nodes, per)
        if it is None:
            continue  # request substituted by the nearest feasible count
        assert r["finish"] - r["first_start"] == pytest.approx(min(150 * n, 600) + r["iterations"] * it, rel=1e-9)
        checked += 1
    assert checked >= 8
