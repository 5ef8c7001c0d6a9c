import json
import subprocess
import sys
from pathlib import Path

import pytest

from arena_opt.cli import COMPACT_DECISION_JOBS, main, write_decision
from arena_opt.decision import Decision
from arena_opt.snapshot import ClusterSnapshot

ROOT = Path(__file__).resolve().parents[1]
SMALL = ROOT / "instances" / "small.json"


def test_shipped_instances_validate():
    for name in ("small", "medium", "large"):
        assert main(["validate", str(ROOT / "instances" / f"{name}.json")]) == 0


def test_solve_writes_a_decision_that_round_trips(tmp_path, capsys):
    out = tmp_path / "d.json"
    assert main(["solve", str(SMALL), "-o", str(out), "--time-limit", "5"]) == 0
    text = capsys.readouterr().out
    assert "status" in text and "objective" in text
    d = Decision.model_validate_json(out.read_text())
    assert Decision.model_validate_json(d.model_dump_json()) == d
    snap = ClusterSnapshot.model_validate_json(SMALL.read_text())
    assert {j.job_id for j in d.jobs} == {j.id for j in snap.jobs}
    assert all(j.reason for j in d.jobs if j.action == "wait")


def test_big_decisions_are_written_compact_and_round_trip(tmp_path):
    """Above COMPACT_DECISION_JOBS jobs the decision file is one line, below it indented; both read back as
    the same decision, every field (None ones too) and float included."""
    out = tmp_path / "d.json"
    assert main(["solve", str(SMALL), "-o", str(out), "--time-limit", "5", "--quiet"]) == 0
    small = Decision.model_validate_json(out.read_text())
    assert out.read_text().count("\n") > len(small.jobs)
    jobs = [j.model_copy(update={"job_id": f"{j.job_id}-{i}"}) for i in range(COMPACT_DECISION_JOBS)
            for j in small.jobs[:1]]
    for d, lines in ((small.model_copy(update={"jobs": jobs[:-1]}), COMPACT_DECISION_JOBS),
                     (small.model_copy(update={"jobs": jobs + small.jobs}), 0)):
        write_decision(d, out)
        text = out.read_text()
        assert (text.count("\n") > lines) if lines else "\n" not in text
        assert Decision.model_validate_json(text) == d
        assert json.loads(text) == json.loads(d.model_dump_json())


def test_snapshot_round_trip():
    snap = ClusterSnapshot.model_validate_json((ROOT / "instances" / "medium.json").read_text())
    again = ClusterSnapshot.model_validate_json(snap.model_dump_json())
    assert again == snap


@pytest.mark.parametrize("name", ["snapshot", "decision"])
def test_schema_export(name, capsys):
    assert main(["schema", name]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert schema["type"] == "object" and "properties" in schema


def test_plan_command(capsys):
    assert main(["plan", "--model", "bert-1.3B", "--batch", "128", "--gpu", "a100", "--gpus", "4"]) == 0
    assert "proxy" in capsys.readouterr().out


def _bad(tmp_path, data) -> Path:
    p = tmp_path / "bad.json"
    p.write_text(data if isinstance(data, str) else json.dumps(data))
    return p


def _snap():
    return json.loads(SMALL.read_text())


def _run_cli(*args):
    """Through a real process: a user mistake must exit non-zero with a message, no traceback."""
    r = subprocess.run([sys.executable, "-m", "arena_opt.cli", *args], capture_output=True, text=True, cwd=ROOT)
    return r.returncode, r.stdout + r.stderr


@pytest.mark.parametrize("mutate,expect", [
    (lambda s: "{not json", "malformed JSON"),
    (lambda s: {**s, "nodes": [{**s["nodes"][0], "gpu_type": "tpu-v9"}, *s["nodes"][1:]]}, "tpu-v9"),
    (lambda s: {**s, "nodes": [s["nodes"][0], {**s["nodes"][1], "id": s["nodes"][0]["id"]}]}, "duplicate id"),
    (lambda s: {**s, "nodes": [{**s["nodes"][0], "num_gpus": 0}, *s["nodes"][1:]]}, "nodes.0.num_gpus"),
    (lambda s: {**s, "jobs": [{**s["jobs"][0], "model": "gpt-9T"}, *s["jobs"][1:]]}, "gpt-9T"),
    (lambda s: {**s, "jobs": [{**s["jobs"][0], "batch_size": -4}, *s["jobs"][1:]]}, "jobs.0.batch_size"),
])
def test_bad_snapshot_is_a_clear_error(tmp_path, mutate, expect):
    p = _bad(tmp_path, mutate(_snap()))
    code, out = _run_cli("validate", str(p))
    assert code == 2
    assert "Traceback" not in out
    assert str(p) in out and expect in out


def test_overlapping_placements_rejected(tmp_path):
    s = _snap()
    running = [j for j in s["jobs"] if j.get("running")]
    assert running, "the small instance ships running jobs"
    r = running[0]["running"]
    clone = {**running[0], "id": "clone", "running": r}
    s["jobs"].append(clone)
    code, out = _run_cli("validate", str(_bad(tmp_path, s)))
    assert code == 2 and "also used by job" in out


def test_placement_beyond_node_rejected(tmp_path):
    s = _snap()
    j = next(j for j in s["jobs"] if j.get("running"))
    nid = next(iter(j["running"]["placement"]))
    j["running"]["placement"][nid] = [0, 99]
    code, out = _run_cli("validate", str(_bad(tmp_path, s)))
    assert code == 2 and "exceeds node" in out


def test_missing_file_is_a_clear_error():
    code, out = _run_cli("solve", "/nonexistent/snap.json")
    assert code == 2 and "file not found" in out and "Traceback" not in out


def test_import_and_solve_do_not_import_torch():
    code = ("import sys, arena_opt; from arena_opt import ArenaPolicy, ClusterSnapshot; "
            f"s = ClusterSnapshot.model_validate_json(open({str(SMALL)!r}).read()); ArenaPolicy().decide(s); "
            "assert 'torch' not in sys.modules, 'torch imported'")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_cli_solve_leaves_the_simulator_torch_and_networkx_unimported(tmp_path):
    # every CLI call pays for what its parser and policy import: the simulator and networkx (0.3 s) and
    # the Slurm readers' models (8 ms) are not needed to solve a round
    out = tmp_path / "d.json"
    code = ("import sys; from arena_opt.cli import main; "
            f"assert main(['solve', {str(SMALL)!r}, '-o', {str(out)!r}, '--quiet']) == 0; "
            "left = [m for m in ('torch', 'networkx', 'arena_opt.sim.engine', 'arena_opt.slurm.jsonfmt') "
            "if m in sys.modules]; "
            "assert not left, left")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_solve_colocation_flags(tmp_path):
    on, off = tmp_path / "on.json", tmp_path / "off.json"
    assert main(["solve", str(SMALL), "-o", str(on), "--time-limit", "5", "--uplink-oversubscription", "3"]) == 0
    assert main(["solve", str(SMALL), "-o", str(off), "--time-limit", "5", "--no-colocation"]) == 0
    d_on, d_off = (Decision.model_validate_json(p.read_text()) for p in (on, off))
    runs_on = [j for j in d_on.jobs if j.runs]
    assert runs_on and all(j.est_slowdown is not None and j.est_slowdown >= 1 for j in runs_on)
    assert all(j.est_slowdown is None for j in d_off.jobs)


def test_solve_rejects_a_bad_oversubscription(capsys):
    assert main(["solve", str(SMALL), "--uplink-oversubscription", "0"]) != 0
    assert "--uplink-oversubscription must be > 0 (value 0.0)" in capsys.readouterr().err
