"""Every user mistake: one message naming the flag or file, the field and the value, exit 2, no traceback,
nothing written (issue 13's examples, one test each)."""

import json
from pathlib import Path

import pytest

from arena_opt.cli import main

ROOT = Path(__file__).resolve().parents[1]
SMALL = ROOT / "instances" / "small.json"
TRACE = ROOT / "instances" / "traces" / "philly-like-small.jsonl"
CLUSTER = ROOT / "instances" / "clusters" / "small.json"


def _run(argv, capsys):
    rc = main([str(a) for a in argv])
    out = capsys.readouterr()
    return rc, out.err


def _expect_2(argv, capsys, *needles):
    rc, err = _run(argv, capsys)
    assert rc == 2, err
    assert "Traceback" not in err
    for n in needles:
        assert n in err, err
    return err


@pytest.mark.parametrize("flags, needles", [
    (["--time-limit", "-1"], ["--time-limit must be > 0", "-1"]),
    (["--gap", "nan"], ["--gap must be a finite number", "nan"]),
    (["--gap", "inf"], ["--gap must be a finite number"]),
    (["--shards", "0"], ["--shards must be > 0 (value 0)"]),
    (["--threads", "0"], ["--threads must be > 0 (value 0)"]),
    (["--threads", "two"], ["--threads not an integer", "'two'"]),
    (["--policy", "nosuch"], ["--policy", "unknown policy 'nosuch'"]),
    (["--rows", "-1"], ["--rows must be >= 0"]),
])
def test_solve_flags(flags, needles, capsys):
    _expect_2(["solve", SMALL, *flags], capsys, *needles)


@pytest.mark.parametrize("flags, needles", [
    (["--preset", "small", "--seed", "-1"], ["--seed must be >= 0 (value -1)"]),
    (["--preset", "small", "--seed", str(2**40)], ["--seed must be <="]),
    (["--cluster", "a100:2x4,a100:1x8"], ["--cluster", "given twice", "a100:1x8"]),
    (["--cluster", "a100:1x4,a100-40gb:1x4"], ["--cluster", "given twice"]),
    (["--cluster", "a100:1x1000"], ["--cluster", "gpus_per_node", "1000"]),
    (["--preset", "small", "--jobs", "-5"], ["--jobs must be > 0 (value -5)"]),
    (["--preset", "small", "--running-fraction", "1.5"], ["--running-fraction must be <= 1"]),
])
def test_gen_instance_flags(flags, needles, tmp_path, capsys):
    out = tmp_path / "x.json"
    _expect_2(["gen-instance", "-o", out, *flags], capsys, *needles)
    assert not out.exists()


@pytest.mark.parametrize("flags, needles", [
    (["--batch", "0", "--gpus", "4"], ["--batch must be > 0 (value 0)"]),
    (["--batch", "32", "--gpus", "0"], ["--gpus must be > 0 (value 0)"]),
])
def test_plan_flags(flags, needles, capsys):
    _expect_2(["plan", "--model", "gpt-1.3B", "--gpu", "a100", *flags], capsys, *needles)


@pytest.mark.parametrize("flags, needles", [
    (["--epsilon", "-1"], ["--epsilon must be > 0 (value -1"]),
    (["--epsilon", "nan"], ["--epsilon must be a finite number"]),
    (["--bound-time-limit", "0"], ["--bound-time-limit must be > 0 (value 0"]),
])
def test_bound_flags(flags, needles, tmp_path, capsys):
    out = tmp_path / "b.json"
    _expect_2(["bound", "--trace", TRACE, "--cluster", CLUSTER, "-o", out, *flags], capsys, *needles)
    assert not out.exists()


def _snap():
    return json.loads(SMALL.read_text())


def _write(tmp_path, data, name="s.json"):
    p = tmp_path / name
    p.write_text(json.dumps(data))
    return p


@pytest.mark.parametrize("make, needles", [
    (lambda p: p.write_bytes(SMALL.read_text().replace('"job-0000"', '"job-caf\xe9"', 1).encode("latin-1")),
     ["not UTF-8", "0xe9", "line"]),
    (lambda p: p.write_bytes(b"\x00\xff" * 50), ["binary data"]),
    (lambda p: p.write_text("[" * 100000 + "]" * 100000), ["nested too deeply"]),
    (lambda p: p.write_text('{"nodes": [}'), ["malformed JSON at line 1"]),
    (lambda p: p.write_text(SMALL.read_text()[:200]), ["malformed JSON"]),
])
def test_unreadable_snapshots(make, needles, tmp_path, capsys):
    p = tmp_path / "s.json"
    make(p)
    for cmd in ("validate", "solve"):
        _expect_2([cmd, p], capsys, str(p), *needles)


def _running(s):
    return next(j for j in s["jobs"] if j.get("running"))


@pytest.mark.parametrize("mutate, needles", [
    (lambda s: s.update(time=float("inf")), ["field time", "finite", "inf"]),
    (lambda s: s["jobs"][0].update(weight=float("inf")), ["jobs.0.weight", "finite"]),
    (lambda s: s["jobs"][0].update(weight=float("nan")), ["jobs.0.weight", "finite"]),
    (lambda s: s["jobs"][0].update(batch_size=10**30), ["jobs.0.batch_size", "16777216"]),
    (lambda s: s["nodes"][0].update(num_gpus=1000), ["nodes.0.num_gpus", "64", "1000"]),
    (lambda s: s.update(gpu_catalog={"x": {"name": "x", "peak_tflops": float("inf"), "memory_gib": 1, "mem_bw_gbs": 1,
                                           "pcie_bw_gbs": 1, "inter_node_bw_gbs": 1}}),
     ["gpu_catalog.x.peak_tflops", "finite"]),
    (lambda s: s.update(gpu_catalog={"x": {"name": "x", "peak_tflops": 312000000, "memory_gib": 1, "mem_bw_gbs": 1,
                                           "pcie_bw_gbs": 1, "inter_node_bw_gbs": 1}}),
     ["gpu_catalog.x.peak_tflops", "100000", "312000000"]),
    (lambda s: s.update(gpu_catalog={"x": {"name": "x", "peak_tflops": 312, "memory_gib": 40960, "mem_bw_gbs": 1,
                                           "pcie_bw_gbs": 1, "inter_node_bw_gbs": 1}}),
     ["gpu_catalog.x.memory_gib", "16384", "40960"]),
    (lambda s: _running(s)["running"]["plan"]["stages"][-1].__setitem__(1, 10000), ["stages", "10000", "layers"]),
    (lambda s: _running(s)["running"]["plan"].update(num_microbatches=1000000),
     ["num_microbatches", "1000000", "does not divide"]),
    (lambda s: _running(s)["running"]["plan"].update(dp=1, tp=2, stages=[]), ["tp"]),
    (lambda s: s["nodes"][0].update(state="broken"), ["nodes.0.state", "broken"]),
    (lambda s: s["nodes"][0].update(unavailable_gpus=[7]), ["unavailable_gpus", "7"]),
    # pydantic reads true as 1: a "1-GPU node" whose error, if any, named a job's placement instead
    (lambda s: s["nodes"][0].update(num_gpus=True), ["nodes.0", "num_gpus: true is not a number"]),
    (lambda s: s["jobs"][0].update(batch_size=False), ["jobs.0", "batch_size: false is not a number"]),
    (lambda s: _running(s)["running"]["plan"].update(dp=True), ["plan", "dp: true is not a number"]),
])
def test_semantic_snapshot_errors(mutate, needles, tmp_path, capsys):
    s = _snap()
    mutate(s)
    p = tmp_path / "s.json"
    p.write_text(json.dumps(s))  # json writes NaN/Infinity literals as Python reads them
    _expect_2(["validate", p], capsys, *needles)


def test_tp_across_nodes_is_an_error(tmp_path, capsys):
    s = {"nodes": [{"id": "n0", "gpu_type": "a100", "num_gpus": 2}, {"id": "n1", "gpu_type": "a100", "num_gpus": 2}],
         "jobs": [{"id": "j", "model": "gpt-1.3B", "batch_size": 64, "total_iterations": 10, "remaining_iterations": 10,
                   "running": {"gpu_type": "a100", "placement": {"n0": [0], "n1": [0, 1]},
                               "plan": {"pp": 1, "dp": 1, "tp": 3}}}]}
    _expect_2(["validate", _write(tmp_path, s)], capsys, "tp 3", "n0")


@pytest.mark.parametrize("policy", ["arena", "fcfs", "gavel", "sia", "elasticflow", "arena-greedy"])
def test_min_gpus_beyond_the_cluster_names_the_true_reason(policy, tmp_path, capsys):
    s = _snap()
    s["jobs"][0]["min_gpus"] = 1000000
    out = tmp_path / "d.json"
    assert main(["solve", str(_write(tmp_path, s)), "-o", str(out), "--quiet", "--policy", policy]) == 0
    d = json.loads(out.read_text())
    j = next(x for x in d["jobs"] if x["job_id"] == s["jobs"][0]["id"])
    assert j["action"] == "wait" and "more than any pool offers" in j["reason"]
    assert "memory" not in j["reason"]


@pytest.mark.parametrize("text, needles", [
    ("job_id,submission_time,num_iteration,model_name,deadline,batch_size,num_gpu,gpu_type\n"
     "j,0,inf,gpt__350M,100,8,1,a10\n", ["t.csv:2", "num_iteration", "finite", "inf"]),
    ("job_id,submission_time,num_iteration,model_name,deadline,batch_size,num_gpu,gpu_type\n"
     "j,0,10,gpt__350M,100,8,2.7,a10\n", ["t.csv:2", "num_gpu", "whole number", "2.7"]),
    ("job_id,submission_time,num_iteration,model_name,deadline,batch_size,num_gpu,gpu_type\n"
     "j,0,10,gpt__350M,100,8\n", ["t.csv:2", "cells"]),
])
def test_csv_trace_errors(text, needles, tmp_path, capsys):
    p = tmp_path / "t.csv"
    p.write_text(text)
    _expect_2(["simulate", "--trace", p, "--cluster", "a10:1x2", "-o", tmp_path / "out", "--quiet"], capsys, *needles)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("content, needles", [
    (b"\x00\x01\x02", ["binary data"]),
    ('{"id": "j", "caf\xe9": 1}\n'.encode("latin-1"), ["not UTF-8"]),
    (b'{"id": "j", "submit_time": Infinity, "model": "gpt-1.3B", "batch_size": 8, "iterations": 5}\n',
     ["t.jsonl:1", "submit_time", "finite"]),
    (b"[" * 50000 + b"]" * 50000 + b"\n", ["t.jsonl:1", "nested too deeply"]),
    (b'{"id": "j", "submit_time": 0, "model": "gpt-1.3B", "batch_size": 8, "iterations": true}\n',
     ["t.jsonl:1", "iterations: true is not a number"]),
])
def test_jsonl_trace_errors(content, needles, tmp_path, capsys):
    p = tmp_path / "t.jsonl"
    p.write_bytes(content)
    _expect_2(["simulate", "--trace", p, "--cluster", "a10:1x2", "-o", tmp_path / "out", "--quiet"], capsys, *needles)


def test_binary_cluster_file(tmp_path, capsys):
    p = tmp_path / "c.json"
    p.write_bytes(b"\x00\xff" * 10)
    _expect_2(["simulate", "--trace", TRACE, "--cluster", p, "-o", tmp_path / "out"], capsys, str(p), "binary data")


def test_binary_perf_table(tmp_path, capsys):
    p = tmp_path / "t.csv"
    p.write_bytes(b"\xff\xfe" * 10)
    _expect_2(["solve", SMALL, "--perf-table", p], capsys, str(p), "not UTF-8")


def test_solve_output_checked_before_the_work(tmp_path, capsys):
    d = tmp_path / "dir"
    d.mkdir()
    _expect_2(["solve", SMALL, "-o", d], capsys, "-o", str(d), "is a directory")
    assert list(tmp_path.iterdir()) == [d] and not list(d.iterdir())  # no DIR.tmp left behind
    _expect_2(["solve", SMALL, "-o", tmp_path / "no" / "such" / "d.json"], capsys, "does not exist")
    assert not (tmp_path / "no").exists()


def test_unwritable_output(tmp_path, capsys):
    import os

    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        if os.access(ro, os.W_OK):
            pytest.skip("running as a user who may write anywhere (root)")
        _expect_2(["solve", SMALL, "-o", ro / "d.json"], capsys, "not writable")
    finally:
        ro.chmod(0o700)


def test_simulate_output_dir_is_a_file_checked_first(tmp_path, capsys):
    f = tmp_path / "results"
    f.write_text("keep me")
    err = _expect_2(["simulate", "--trace", TRACE, "--cluster", "a100:1x4", "-o", f, "--quiet"], capsys,
                    "-o", str(f), "is a file")
    assert f.read_text() == "keep me"
    assert "jobs" not in err  # refused before the simulation ran


def test_existing_output_kept_on_a_bad_input(tmp_path, capsys):
    out = tmp_path / "d.json"
    out.write_text("previous")
    bad = _write(tmp_path, {**_snap(), "time": -1})
    _expect_2(["solve", bad, "-o", out], capsys, "field time")
    assert out.read_text() == "previous"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.json", "s.json"]


def test_a_bug_says_so_and_debug_shows_tracebacks(monkeypatch, capsys):
    import arena_opt.cli as cli

    def boom(args):
        raise ZeroDivisionError("x")

    monkeypatch.setattr(cli, "cmd_validate", boom)
    rc, err = _run(["validate", SMALL], capsys)
    assert rc == 3 and "Traceback" in err and "a bug in arena-opt" in err
    monkeypatch.undo()
    rc, err = _run(["validate", "/nonexistent.json", "--debug"], capsys)
    assert rc == 2 and "Traceback" in err and "/nonexistent.json: file not found" in err
    rc, err = _run(["--debug", "validate", "/nonexistent.json"], capsys)
    assert rc == 2 and "Traceback" in err


def test_large_decision_table_is_summarised(tmp_path, capsys):
    snap = tmp_path / "s.json"
    assert main(["gen-instance", "--cluster", "a100:4x4", "--jobs", "60", "-o", str(snap)]) == 0
    capsys.readouterr()
    assert main(["solve", str(snap), "--policy", "fcfs", "--rows", "5"]) == 0
    out = capsys.readouterr().out
    assert "... and 55 more jobs" in out and "--rows 0 shows all" in out
    assert main(["solve", str(snap), "--policy", "fcfs", "--quiet", "-o", str(tmp_path / "d.json")]) == 0
    out = capsys.readouterr().out
    assert "job-00" not in out and "decision written" in out
    d = json.loads((tmp_path / "d.json").read_text())
    assert len(d["jobs"]) == 60 and d["stats"]["total_s"] > 0


def test_plan_names_the_true_reason(capsys):
    assert main(["plan", "--model", "gpt-1.3B", "--batch", "32", "--gpu", "a100", "--gpus", "3"]) == 0
    out = capsys.readouterr().out
    assert "batch 32 does not split into dp 3" in out and "memory" not in out
    assert main(["plan", "--model", "gpt-1.3B", "--batch", "3", "--gpu", "a100", "--gpus", "4"]) == 0
    out = capsys.readouterr().out
    assert "at least 4 micro-batches" in out
