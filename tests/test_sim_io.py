"""Trace and cluster loaders, the generator, and the simulate / bench / gen-trace commands."""

import json
from pathlib import Path

import pytest

from arena_opt.cli import main
from arena_opt.cluster import load_cluster
from arena_opt.errors import InputError
from arena_opt.grids import compact_shape
from arena_opt.perf.estimator import PerfEstimator
from arena_opt.sim.gen import GenOptions, generate
from arena_opt.trace import load_trace, write_trace

ROOT = Path(__file__).resolve().parents[1]
SMALL_TRACE = ROOT / "instances" / "traces" / "philly-like-small.jsonl"
SMALL_CLUSTER = ROOT / "instances" / "clusters" / "small.json"
CSV_HEAD = "job_id,submission_time,num_iteration,model_name,deadline,batch_size,num_gpu,gpu_type\n"


def test_arena_csv_with_artifact_scaling(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text(CSV_HEAD + "b,200,17,moe__690M,1200,256,4,a10\na,100,1000,bert__2.6B,1100,256,4,a40\n")
    jobs = load_trace(p)
    assert [j.id for j in jobs] == ["a", "b"]  # by submission time
    a = jobs[0]
    assert (a.model, a.iterations, a.gpu_type, a.num_gpus, a.deadline) == ("bert-2.6B", 1000, "a40", 4, 1100)
    scaled = {j.id: j for j in load_trace(p, iter_scale=5, deadline_stretch=5)}
    assert scaled["a"].iterations == 200 and scaled["b"].iterations == 3  # integer division, as the artifact
    assert scaled["a"].deadline == 100 + 1000 * 5


@pytest.mark.parametrize("line, where", [
    ('{"id": "a", "submit_time": 0, "model": "gpt-9T", "batch_size": 8, "iterations": 10}', "field model"),
    ('{"id": "a", "submit_time": -1, "model": "gpt-350M", "batch_size": 8, "iterations": 10}', "field submit_time"),
    ('{"id": "a", "submit_time": 0, "model": "gpt-350M", "batch_size": 8, "iterations": 10, "gpu_type": "tpu"}',
     "unknown GPU type 'tpu'"),
    ('{"id": "a", "submit_time": 5, "model": "gpt-350M", "batch_size": 8, "iterations": 10, "deadline": 5}',
     "deadline"),
    ('{"id": "a", "submit_time": 0, "model": "gpt-350M", "batch_size": 8, "iterations": 10, "colour": 1}',
     "field colour"),
    ("[1, 2]", "expected a JSON object"),
    ("{not json", "not valid JSON"),
])
def test_jsonl_errors_name_file_line_and_field(tmp_path, line, where):
    p = tmp_path / "t.jsonl"
    p.write_text('# a comment\n{"id": "ok", "submit_time": 0, "model": "gpt-350M", "batch_size": 8, '
                 '"iterations": 10}\n' + line + "\n")
    with pytest.raises(InputError, match=rf"t.jsonl:3: .*{where}"):
        load_trace(p)


def test_csv_errors(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("job_id,submission_time\nx,1\n")
    with pytest.raises(InputError, match="missing columns"):
        load_trace(p)
    p.write_text(CSV_HEAD + "a,soon,10,bert__2.6B,100,256,4,a40\n")
    with pytest.raises(InputError, match=r"t.csv:2: field submission_time.*'soon'"):
        load_trace(p)
    p.write_text(CSV_HEAD + "a,1,10,bert__2.6B,100,256,4,a40\na,2,10,bert__2.6B,100,256,4,a40\n")
    with pytest.raises(InputError, match="duplicate job id 'a'"):
        load_trace(p)
    with pytest.raises(InputError, match="not found"):
        load_trace(tmp_path / "missing.csv")


def test_cluster_formats(tmp_path):
    inline = load_cluster("a100:2x4,a40:3x2")
    assert sum(n.num_gpus for n in inline.nodes) == 14 and len(inline.nodes) == 5
    ours = load_cluster(SMALL_CLUSTER)
    assert sum(n.num_gpus for n in ours.nodes) == 64
    arena = tmp_path / "derived.json"
    arena.write_text(json.dumps({"description": "x", "gpu_types": {
        "a100": {"node_num": 2, "gpus_per_node": 4, "max_mem_gb": 40.0}, "a10": {"node_num": 3, "gpus_per_node": 2}},
        "total_gpus": 14}))
    a = load_cluster(arena)
    assert sorted((n.gpu_type, n.num_gpus) for n in a.nodes)[0] == ("a10", 2) and len(a.nodes) == 5
    snap = tmp_path / "snap.json"
    snap.write_text(inline.model_dump_json())
    assert load_cluster(snap).nodes == inline.nodes


def test_arena_spec_nodes_get_the_testbed_links(tmp_path):
    """Arena's spec names no link; its A40 pairs communicate over PCIe (cluster.ARENA_INTRA_LINKS), the
    other types keep the catalog's link, and the inline and our formats are not touched."""
    arena = tmp_path / "derived.json"
    arena.write_text(json.dumps({"gpu_types": {"a100": {"node_num": 1, "gpus_per_node": 4},
                                               "a40": {"node_num": 2, "gpus_per_node": 2}}}))
    links = {(n.gpu_type, n.intra_link) for n in load_cluster(arena).nodes}
    assert links == {("a100-40gb", None), ("a40", "pcie")}
    assert {n.intra_link for n in load_cluster("a40:2x2").nodes} == {None}


@pytest.mark.parametrize("content, msg", [
    ('[{"a100": {"node_num": 80}}]', "has no GPUs per node"),
    ('{"gpus": {"a100": {"nodes": 0, "gpus_per_node": 4}}}', "field gpus.a100.nodes"),
    ('{"gpus": {"tpu": {"nodes": 1, "gpus_per_node": 4}}}', "unknown GPU type 'tpu'"),
    ('{"whatever": 1}', "unknown cluster spec format"),
    ('{"nodes": [{"id": "n", "gpu_type": "a100", "num_gpus": 4}], "jobs": [{"id": "j"}]}', "must not contain jobs"),
])
def test_cluster_errors(tmp_path, content, msg):
    p = tmp_path / "c.json"
    p.write_text(content)
    with pytest.raises(InputError, match=msg):
        load_cluster(p)
    with pytest.raises(InputError, match="cannot read"):
        load_cluster("a100:4by4")


def test_generator_is_philly_like_and_round_trips(tmp_path):
    cl = load_cluster(SMALL_CLUSTER)
    jobs = generate(cl, GenOptions(jobs=150, seed=4, models=("gpt-350M", "moe-690M"), batch_sizes=(128,)))
    assert len(jobs) == 150 and [j.submit_time for j in jobs] == sorted(j.submit_time for j in jobs)
    counts = [j.num_gpus for j in jobs]
    assert counts.count(1) > counts.count(16) > 0  # many small jobs, a tail of large ones
    gaps = [b.submit_time - a.submit_time for a, b in zip(jobs, jobs[1:])]
    assert sum(g < 60 for g in gaps) > 0.2 * len(gaps)  # bursts
    assert all(j.deadline > j.submit_time for j in jobs)
    # offered load: the requested GPU-seconds over the arrival span are near 0.8 of the 64 GPUs
    est = PerfEstimator(table_mode="off")
    demand = 0.0
    for j in jobs:
        nodes, per = compact_shape(j.num_gpus, max(n.num_gpus for n in cl.nodes if n.gpu_type == j.gpu_type))
        r = est.best(j.to_job().arch, j.batch_size, cl.catalog[j.gpu_type], None, j.gpu_type, nodes, per)
        demand += j.num_gpus * j.iterations * r.iter_time_s
    load = demand / ((jobs[-1].submit_time - jobs[0].submit_time) * 64)
    assert 0.6 < load < 1.1
    p = tmp_path / "t.jsonl"
    write_trace(p, jobs)
    assert load_trace(p) == jobs


def test_shipped_trace_loads():
    jobs = load_trace(SMALL_TRACE)
    assert len(jobs) == 120 and all(j.num_gpus and j.gpu_type for j in jobs)


def test_cli_simulate_writes_results(tmp_path, capsys):
    rc = main(["simulate", "--trace", str(SMALL_TRACE), "--cluster", str(SMALL_CLUSTER), "--policy", "fcfs",
               "--limit-jobs", "30", "-o", str(tmp_path), "--quiet"])
    assert rc == 0
    out = json.loads((tmp_path / "fcfs.json").read_text())
    assert out["finished"] == 30 and out["avg_jct_s"] > 0 and out["avg_throughput"] > 0
    assert out["config"]["policy"] == "fcfs" and len(out["job_records"]) == 30
    assert "results written" in capsys.readouterr().out


def test_cli_bench_writes_table_and_plots(tmp_path):
    rc = main(["bench", "--trace", str(SMALL_TRACE), "--cluster", str(SMALL_CLUSTER), "--policies",
               "fcfs,elasticflow", "--limit-jobs", "20", "-o", str(tmp_path), "--quiet"])
    assert rc == 0
    table = (tmp_path / "results.md").read_text()
    assert table.count("\n") == 4 and "| fcfs |" in table and "| elasticflow |" in table
    for name in ("fcfs.json", "elasticflow.json", "jct_cdf.png", "throughput.png", "queue_length.png",
                 "gpu_util.png"):
        assert (tmp_path / name).stat().st_size > 0


@pytest.mark.parametrize("cores, flag, want", [({0, 1, 2}, [], 2), ({5}, [], 1), ({0, 1, 2}, ["--parallel", "1"], 1),
                                              (set(range(16)), ["--policies", "all"], 6)])
def test_cli_bench_runs_one_policy_per_core_by_default(tmp_path, monkeypatch, cores, flag, want):
    import arena_opt.sim.bench as bench

    seen = {}

    def fake_run_bench(base, policies, out_dir, *, parallel, **kw):
        seen["parallel"] = parallel
        return [], {"failed": {}, "plan_warmup_s": 0.0}

    monkeypatch.setattr(bench, "run_bench", fake_run_bench)
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: cores)
    argv = ["bench", "--trace", str(SMALL_TRACE), "--cluster", str(SMALL_CLUSTER), "--policies", "fcfs,gavel",
            "-o", str(tmp_path), "--quiet", *flag]
    assert main(argv) == 0
    assert seen["parallel"] == want


def test_cli_gen_trace(tmp_path, capsys):
    out = tmp_path / "g.jsonl"
    assert main(["gen-trace", "--cluster", "a100:2x4", "--jobs", "12", "--seed", "1", "-o", str(out),
                 "--models", "gpt-350M"]) == 0
    assert len(load_trace(out)) == 12


@pytest.mark.parametrize("argv, msg", [
    (["simulate", "--trace", "nope.jsonl", "--cluster", "a100:1x4"], "nope.jsonl: trace file not found"),
    (["simulate", "--trace", str(SMALL_TRACE), "--cluster", "a100:1x4", "--policy", "magic"], "unknown policy"),
    (["simulate", "--trace", str(SMALL_TRACE), "--cluster", "a100:1x4", "--rounds", "0"], "--rounds"),
    (["bench", "--trace", str(SMALL_TRACE), "--cluster", "a100:1x4", "--policies", "fcfs,magic"], "magic"),
    (["gen-trace", "--cluster", "a100:1x4", "-o", "x.jsonl", "--models", "gpt-9T"], "unknown model"),
])
def test_cli_user_errors_exit_2_without_traceback(argv, msg, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert msg in err and "Traceback" not in err
