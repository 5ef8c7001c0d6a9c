"""Benches that cannot go stale (issue 16.3): every file in bench/results/ was made by a bench of
bench/run_all.py with that bench's own command, from the code the working tree holds now.

`test_results_are_fresh` (marker `bench_fresh`) fails while any result is stale: it names the result, the
file that moved since the run and the command that remakes it (`python bench/run_all.py --stale` remakes
them all). It runs in CI's plain `python -m pytest`; helpers changing code leave it out with
`-m "not bench_fresh"`. The other tests check the mechanism itself and run everywhere.
"""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import _provenance as prov  # noqa: E402
import run_all  # noqa: E402


@pytest.mark.bench_fresh
def test_results_are_fresh():
    stale = run_all.stale(prov.problems())
    benches = {b.name: b for b in run_all.BENCHES}
    lines = [f"{name}: {'; '.join(why)}\n    rerun: {' && '.join(benches[name].steps)}" for name, why in stale.items()]
    assert not stale, (f"{len(stale)} stale result(s) in bench/results (all of them: python bench/run_all.py "
                       f"--stale):\n" + "\n".join(lines))


def test_every_result_file_belongs_to_a_bench():
    files = {p.name for p in (ROOT / prov.RESULTS).iterdir() if p.is_file()}
    known = {f for b in run_all.BENCHES for f in b.files}
    assert files - known == set(), "bench/results files that no bench of bench/run_all.py makes"
    assert len({b.name for b in run_all.BENCHES}) == len(run_all.BENCHES)
    for b in run_all.BENCHES:
        assert (ROOT / b.steps[-1].split()[1]).is_file(), b
        assert set(b.after) <= {x.result for x in run_all.BENCHES}, b


def test_python_hash_ignores_comments_docstrings_and_layout(tmp_path):
    a, b, c = tmp_path / "a.py", tmp_path / "b.py", tmp_path / "c.py"
    a.write_text('"""Doc."""\nimport os\n\n\ndef f(x):\n    """Why."""\n    return x + 1  # one\n')
    b.write_text('import os\ndef f(x):\n    # a comment\n    return (x +\n            1)\n')
    c.write_text('import os\ndef f(x):\n    return x + 2\n')
    assert prov.file_hash(a) == prov.file_hash(b) != prov.file_hash(c)
    assert prov.file_hash(a).startswith("py:")


def test_other_files_hash_as_git_blobs(tmp_path):
    p = tmp_path / "x.json"
    p.write_text('{"a": 1}\n')
    try:
        git = subprocess.run(["git", "hash-object", str(p)], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("git not available")
    assert prov.file_hash(p) == "blob:" + git.strip()


def test_code_files_follow_imports_subprocess_modules_and_bench_siblings():
    speed = prov.code_files(ROOT / "bench/speed.py", loaded=False)
    # speed.py runs `python -m arena_opt.cli solve` in a child process: the CLI and what it imports count
    assert {"bench/speed.py", "arena_opt/cli.py", "arena_opt/milp/solve.py", "arena_opt/__init__.py"} <= set(speed)
    est = prov.code_files(ROOT / "bench/estimator.py", loaded=False)
    assert {"bench/_perf_common.py", "arena_opt/perf/planner.py", "models/catalog.py"} <= set(est)
    # the recorders measure nothing; a sibling bench named like a package (runners.py) is not `runners`
    assert not prov.RECORDERS & set(speed) | prov.RECORDERS & set(est)
    assert "bench/runners.py" not in est and "bench/run_all.py" not in est


def _run_bench(tmp_path: Path) -> Path:
    """bench/repeatability.py for real (the fastest bench), on the committed estimator_accuracy.json twice."""
    src = ROOT / prov.RESULTS / "estimator_accuracy.json"
    old = tmp_path / "old.json"
    old.write_text(src.read_text())
    out = tmp_path / "results"
    subprocess.run([sys.executable, "bench/repeatability.py", str(old), str(src), "--out", str(out)], cwd=ROOT,
                   check=True, capture_output=True)
    return out


def test_a_bench_records_its_provenance_and_a_change_is_named(tmp_path):
    out = _run_bench(tmp_path)
    data = json.loads((out / "repeatability.json").read_text())
    rec = data["provenance"]
    assert rec["command"].startswith("python bench/repeatability.py ")
    assert rec["argv"][0] == "bench/repeatability.py"
    assert {"bench/repeatability.py", "bench/_perf_common.py"} <= set(rec["code"])
    assert all(prov.file_hash(ROOT / f) == h for f, h in rec["code"].items())
    assert f"{prov.RESULTS}/estimator_accuracy.json" in rec["inputs"]
    assert set(rec["outputs"]) == {str(out / "repeatability.json"), str(out / "repeatability.md")}
    assert (out / "repeatability.md").read_text().rstrip().endswith("freshness: tests/test_bench_fresh.py.")
    assert prov.problems(out) == {}
    me = str(out / "repeatability.json")

    # a module the bench ran moved since
    rec["code"]["bench/_perf_common.py"] = "py:0"
    (out / "repeatability.json").write_text(json.dumps({**data, "provenance": rec}))
    assert prov.problems(out) == {me: ["bench/_perf_common.py changed"]}

    # the Markdown of another run, a file no run claims
    rec["code"]["bench/_perf_common.py"] = prov.file_hash(ROOT / "bench/_perf_common.py")
    (out / "repeatability.json").write_text(json.dumps({**data, "provenance": rec}))
    (out / "repeatability.md").write_text("# edited by hand\n")
    (out / "stray.json").write_text("[]\n")
    assert prov.problems(out) == {me: [f"{out / 'repeatability.md'} is not the file this run wrote"],
                                  str(out / "stray.json"): ["records no provenance (no result's provenance "
                                                            "names it)"]}


def test_a_result_copied_from_elsewhere_is_not_fresh(tmp_path):
    out = _run_bench(tmp_path)
    elsewhere = tmp_path / "copy"
    shutil.copytree(out, elsewhere)
    found = prov.problems(elsewhere)
    assert set(found) == {str(elsewhere / "repeatability.json"), str(elsewhere / "repeatability.md")}
    assert found[str(elsewhere / "repeatability.json")][-1].startswith("written elsewhere")


def test_run_all_matches_commands_and_orders_readers_after_writers():
    bench = next(b for b in run_all.BENCHES if b.name == "repeatability")
    assert run_all.command_matches(bench, "python bench/repeatability.py bench/results/estimator_accuracy.json")
    assert not run_all.command_matches(bench, "python bench/repeatability.py /tmp/a.json /tmp/b.json")
    # a step with a scratch folder: any folder stands for {tmp}, nothing else does
    scratch = run_all.Bench("repeatability.json", ("python bench/estimator_accuracy.py --out {tmp}",
                                                   "python bench/repeatability.py {tmp}/estimator_accuracy.json "
                                                   "bench/results/estimator_accuracy.json"), 1)
    assert run_all.command_matches(scratch, "python bench/repeatability.py /tmp/x1/estimator_accuracy.json "
                                            "bench/results/estimator_accuracy.json")
    assert not run_all.command_matches(scratch, "python bench/repeatability.py /tmp/a.json /tmp/b.json")
    order = [b.result for b in run_all.BENCHES]
    for b in run_all.BENCHES:
        assert all(order.index(a) < order.index(b.result) for a in b.after), b


def test_run_all_reports_a_failing_step_and_stops_a_hung_one():
    from rich.console import Console

    console = Console(file=io.StringIO())
    failing = run_all.Bench("x.json", ("python -c 'import sys; sys.exit(3)'", "python -c 'never runs'"), 1)
    ok, secs = run_all.run_one(failing, console, 1.0)
    assert not ok and secs < 60
    t0 = time.monotonic()
    assert run_all._run_step([sys.executable, "-c", "import time; time.sleep(60)"], 1.0) == "stopped after 1 s"
    assert time.monotonic() - t0 < 30


def test_the_footer_names_the_uncommitted_files_a_run_used(tmp_path, monkeypatch):
    """A result made from files that differ from the commit says which: a rerun after a regenerated data file
    (arena_opt/perf/band.json) is told apart from one on edited code."""
    if shutil.which("git") is None:
        pytest.skip("git not available")
    repo = tmp_path / "repo"
    repo.mkdir()
    for args in (["init", "-q"], ["config", "user.email", "t@t"], ["config", "user.name", "t"]):
        subprocess.run(["git", *args], cwd=repo, check=True)
    (repo / "a.py").write_text("x = 1\n")
    (repo / "b.json").write_text("{}\n")
    subprocess.run(["git", "add", "."], cwd=repo, check=True)
    subprocess.run(["git", "commit", "-qm", "c"], cwd=repo, check=True)
    monkeypatch.setattr(prov, "ROOT", repo)
    assert prov.uncommitted(["a.py", "b.json"]) == []
    (repo / "b.json").write_text('{"x": 1}\n')
    (repo / "c.py").write_text("y = 2\n")
    assert prov.uncommitted(["a.py", "b.json", "c.py"]) == ["b.json", "c.py"]
    rec = {"command": "python bench/x.py", "commit": "0" * 40, "dirty": True, "uncommitted": ["b.json", "c.py"],
           "date": "d", "seconds": 1, "load_avg_start": [1.0], "load_avg_end": [1.0]}
    assert "(uncommitted: b.json, c.py)," in prov.footer(rec)
    assert "uncommitted" not in prov.footer({**rec, "dirty": False, "uncommitted": []})
