"""The Slurm runner's guard against a controller that goes away, without Slurm: stand-in client commands
on PATH whose behaviour a flag file switches (`down`: slurmctld gone, the ping fails and every other
command cannot connect; `hang`: squeue and sinfo never answer, as a query that got past the ping just
before the controller went; `sbatch_hangs`: sbatch never answers, after it was accepted or not as
`sbatch_refuses` says). The job list squeue shows is a file (squeue.json): an accepted sbatch adds its job
there (RUNNING on n4), scancel ends a pending job at once and leaves a running one COMPLETING (its ranks
saving) until the test ends it. The same against a live Slurm: tests/test_slurm_runner.py."""

from __future__ import annotations

import json
import os
import stat
import sys
import time
from pathlib import Path

import pytest

from arena_opt.decision import Decision, JobDecision
from arena_opt.plan import Plan
from arena_opt.slurm.commands import SlurmOptions
from arena_opt.slurm.gres import GpuMap
from runners.base import JobSpec
from runners.launch_record import (LaunchFiles, LaunchRecord, LaunchRecordInvalid, read_launch_record,
                                   write_launch_record)
from runners.managed import job_root
from runners.names import safe_name
from runners.slurm import Controller, SlurmLaunch, SlurmRunner

FIX = Path(__file__).parent / "fixtures" / "slurm"
TIMEOUT_S = 2.0  # long beside a stand-in command's start on a loaded CI host: "answered at once" is < TIMEOUT_S
SUBMIT_TIMEOUT_S = TIMEOUT_S  # the cut of a stand-in sbatch that hangs
NO_CONTACT = "echo 'error: Unable to contact slurm controller (connect failure)' >&2; exit 1"


# the job list of the stand-in sbatch and scancel (squeue.json, the fixture's 22.05 format)
JOBS_PY = r"""
import json, sys
from pathlib import Path
d, cmd, args = Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
data = json.loads((d / "squeue.json").read_text())
if cmd == "sbatch":
    nxt = d / "next_id"
    jid = int(nxt.read_text()) if nxt.exists() else 99
    nxt.write_text(str(jid + 1))
    (d / "last_id").write_text(f"{jid}\n")
    script = Path(args[-1]).read_text()
    name = next(x.split("=", 1)[1] for x in script.split() if x.startswith("--job-name="))
    cwd = next(x.split("=", 1)[1] for x in args if x.startswith("--chdir="))
    job = dict(data["jobs"][0], job_id=jid, het_job_id=0, het_job_offset=0, name=name, job_state="RUNNING",
               current_working_directory=str(Path(cwd).resolve()), nodes="n4", gres_detail=["gpu:v100:1(IDX:0)"],
               comment="")
    data["jobs"].append(job)
else:
    name = next((a.split("=", 1)[1] for a in args if a.startswith("--name=")), None)
    for job in data["jobs"]:
        if job["name"] == name or str(job["job_id"]) == args[-1]:
            job["job_state"] = "COMPLETING" if job["job_state"] == "RUNNING" else "CANCELLED"
(d / "squeue.json").write_text(json.dumps(data))
"""


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """The flag directory of the stand-in commands (on PATH for the test)."""
    d, bin_ = tmp_path / "flags", tmp_path / "bin"
    d.mkdir()
    bin_.mkdir()
    # `exec sleep`: the command itself hangs, as Slurm's client does (a child left behind would keep the
    # pipe open after the timeout kills the shell)
    scripts = {
        "scontrol": f'[ "$1" = ping ] && {{ [ -e {d}/down ] && exit 1; echo UP; exit 0; }}\n'
                    f"[ -e {d}/down ] && {{ {NO_CONTACT}; }}\n"
                    "echo \"scontrol: unrecognized option '--json'\" >&2; exit 1",
        "sinfo": f"[ -e {d}/hang ] && exec sleep 60\n[ -e {d}/down ] && {{ {NO_CONTACT}; }}\n"
                 f"cat {FIX / 'sinfo-22.05.json'}",
        "squeue": f"[ -e {d}/hang ] && exec sleep 60\n[ -e {d}/down ] && {{ {NO_CONTACT}; }}\n"
                  f'[ "$1" = --json ] && exec cat {d}/squeue.json\n'
                  f'cat {d}/state-"$3" 2>/dev/null || cat {d}/state 2>/dev/null || echo RUNNING',
        "scancel": f'echo "$@" >> {d}/scancel.log\n[ -e {d}/down ] && {{ {NO_CONTACT}; }}\nfor a; do last=$a; done; echo CANCELLED > {d}/state-$last\n'
                   f'exec {sys.executable} {bin_}/jobs.py {d} scancel "$@"',
        "sbatch": f'echo "$@" >> {d}/sbatch.log\n[ -e {d}/down ] && {{ {NO_CONTACT}; }}\n'
                  f'[ -e {d}/sbatch_refuses ] || {sys.executable} {bin_}/jobs.py {d} sbatch "$@"\n'
                  f"[ -e {d}/sbatch_hangs ] && exec sleep 60\ncat {d}/last_id",
    }
    (bin_ / "jobs.py").write_text(JOBS_PY)
    for name, body in scripts.items():
        p = bin_ / name
        p.write_text(f"#!/bin/sh\n{body}\n")
        p.chmod(p.stat().st_mode | stat.S_IEXEC)
    (d / "squeue.json").write_text((FIX / "squeue-22.05.json").read_text())
    monkeypatch.setenv("PATH", f"{bin_}{os.pathsep}{os.environ['PATH']}")
    return d


def _flag(d: Path, name: str, on: bool) -> None:
    if on:
        (d / name).touch()
    else:
        (d / name).unlink(missing_ok=True)


def _controller() -> tuple[Controller, list[tuple[str, dict]]]:
    events: list[tuple[str, dict]] = []
    return Controller(lambda kind, msg, **kw: events.append((kind, kw)), TIMEOUT_S), events


def test_query_that_hangs_past_the_ping_falls_back_at_the_timeout(fake):
    c, events = _controller()
    h = SlurmLaunch("7", [], [], c)
    assert h.states() == {"RUNNING"}
    _flag(fake, "hang", True)  # the ping answers, the query never does
    t0 = time.monotonic()
    assert h.states() == {"RUNNING"}  # what Slurm said last
    assert time.monotonic() - t0 < TIMEOUT_S + 5.0  # not squeue's 60 s
    assert [k for k, _ in events] == ["controller_lost"] and "squeue" in events[0][1]["reason"]
    _flag(fake, "down", True)  # then the ping fails too: answered at once from what Slurm said last
    t0 = time.monotonic()
    assert h.states() == {"RUNNING"} and time.monotonic() - t0 < TIMEOUT_S
    _flag(fake, "hang", False)
    _flag(fake, "down", False)
    (fake / "state").write_text("COMPLETED\n")
    assert h.states() == {"COMPLETED"}  # the first answer ends the outage
    assert [k for k, _ in events] == ["controller_lost", "controller_back"]
    assert 0 < events[1][1]["outage_s"] < 10


def test_launch_with_no_answer_yet_is_not_over_while_the_controller_is_away(fake, tmp_path):
    c, events = _controller()
    _flag(fake, "down", True)
    h = SlurmLaunch("8", [tmp_path / "g0-0.rc"], [], c)
    assert h.poll() == [None]  # not over: its exit code may still come
    assert not h.pending()  # not known to be pending: a decision does not replace it
    (tmp_path / "g0-0.rc").write_text("0\n")
    assert h.poll() == [0]  # exit codes arrive as files, controller or not
    assert [k for k, _ in events] == ["controller_lost"]


def test_scancel_while_the_controller_is_away_is_owed_then_sent_once(fake):
    c, events = _controller()
    h = SlurmLaunch("7", [], [], c)
    assert h.states() == {"RUNNING"}
    _flag(fake, "down", True)
    t0 = time.monotonic()
    h.terminate(timeout=30.0)
    assert time.monotonic() - t0 < 5.0  # no wait on states that cannot change while it is away
    assert c.owes("7") and not (fake / "scancel.log").exists()
    h.terminate(timeout=30.0)  # asked again: still one cancel owed
    assert [k for k, _ in events] == ["controller_lost", "cancel_owed"] and not events[1][1]["sent"]
    _flag(fake, "down", False)
    assert h.states() == {"CANCELLED"}  # the owed cancel went before the query
    assert (fake / "scancel.log").read_text().split() == ["7"] and not c.owes("7")
    assert [k for k, _ in events] == ["controller_lost", "cancel_owed", "cancel_owed", "controller_back"]
    assert events[2][1]["sent"] and events[2][1]["command"] == ["scancel", "7"]


def _decision(node: str) -> Decision:
    return Decision(policy="t", jobs=[JobDecision(job_id="j", action="start", gpu_type="v100-32gb", num_gpus=1,
                                                  num_nodes=1, placement={node: [0]}, plan=Plan(dp=1))])


def _runner(tmp_path) -> SlurmRunner:
    return SlurmRunner(tmp_path / "w", gpu_map=GpuMap({}), device="cpu", tag="u", stop_timeout_s=0.5,
                       options=SlurmOptions(query_timeout_s=TIMEOUT_S, submit_timeout_s=SUBMIT_TIMEOUT_S))


@pytest.fixture
def r(fake, tmp_path):
    """A runner of the stand-in cluster holding job j, the cluster read once."""
    r = _runner(tmp_path)
    try:
        r.add_job(JobSpec(job_id="j", model="gpt-350M", global_batch=4, total_steps=5))
        r.cluster_nodes()
        yield r
    finally:
        r.shutdown(save=False)


def _events(r: SlurmRunner) -> list[dict]:
    return [json.loads(line) for line in (r.workdir / "events.jsonl").read_text().splitlines()]


def test_sbatch_waits_while_the_controller_is_away_then_goes_once(fake, r):
    _flag(fake, "down", True)
    for _ in range(2):
        r.apply(_decision("n4"))
        j = r.jobs["j"]
        # nothing submitted, nothing counted against the job, its generation number not used up
        assert j.state == "pending" and j.failures == 0 and j.generation == 0 and j.handle is None
    assert not (fake / "sbatch.log").exists()
    held = [e for e in _events(r) if e["kind"] == "held"]
    assert len(held) == 1 and held[0]["details"]["deferred"], held  # one event, not one per round
    _flag(fake, "down", False)
    r.apply(_decision("n4"))
    assert r.jobs["j"].state == "running" and r.slurm_id("j") == "99" and r.jobs["j"].generation == 1
    assert len((fake / "sbatch.log").read_text().splitlines()) == 1
    kinds = [e["kind"] for e in _events(r)]
    assert kinds.count("launch") == 1 and kinds.count("controller_lost") == kinds.count("controller_back") == 1


def test_no_second_launch_while_an_earlier_one_lives_in_the_jobs_directory(fake, r):
    # a launch of this job that the runner does not hold (a submit whose answer was lost) shows up
    jobs = json.loads((fake / "squeue.json").read_text())
    for sj in jobs["jobs"]:
        if sj["job_id"] == 4:
            sj["current_working_directory"] = str(r.jobs["j"].root.resolve())
    (fake / "squeue.json").write_text(json.dumps(jobs))
    r.apply(_decision("n4"))
    j = r.jobs["j"]
    assert j.handle is None and j.failures == 0 and not (fake / "sbatch.log").exists()
    assert (fake / "scancel.log").read_text().split() == ["4"]
    assert "still alive" in (j.message or "")


def test_query_timeout_flag_reads_its_default_from_the_options_and_refuses_a_non_positive_value(capsys, monkeypatch):
    from arena_opt.cli import main

    monkeypatch.setattr(SlurmOptions.model_fields["query_timeout_s"], "default", 7.25)
    assert main(["run", "-h"]) == 0
    assert "(default 7.25)" in " ".join(capsys.readouterr().out.split())
    rc = main(["run", "--backend", "slurm", "--slurm-query-timeout", "0"])
    err = capsys.readouterr().err
    assert rc == 2 and "--slurm-query-timeout" in err and "Traceback" not in err, err


G0 = f"arena-u-{safe_name('j')}-g0"  # the Slurm name of job j's launch 0


def _jobs(d: Path) -> dict[int, dict]:
    return {j["job_id"]: j for j in json.loads((d / "squeue.json").read_text())["jobs"]}


def _set_state(d: Path, slurm_id: int, state: str) -> None:
    data = json.loads((d / "squeue.json").read_text())
    for j in data["jobs"]:
        if j["job_id"] == slurm_id:
            j["job_state"] = state
    (d / "squeue.json").write_text(json.dumps(data))
    (d / f"state-{slurm_id}").write_text(state + "\n")  # what `squeue -h -j` says


def _live(d: Path, root: Path) -> list[int]:
    """The Slurm jobs alive in a job's directory."""
    return [i for i, j in _jobs(d).items() if j["current_working_directory"] == str(root.resolve())
            and j["job_state"] not in ("CANCELLED", "COMPLETED", "FAILED")]


def _lines(p: Path) -> list[str]:
    return p.read_text().splitlines() if p.exists() else []


def _outcomes(r: SlurmRunner) -> list[str]:
    return [e["details"]["outcome"] for e in _events(r) if e["kind"] == "sbatch_unanswered"]


def test_cut_sbatch_that_slurm_accepted_is_adopted_as_that_launch(fake, r):
    _flag(fake, "sbatch_hangs", True)  # Slurm takes the job, its answer never comes
    r.apply(_decision("n4"))
    j = r.jobs["j"]
    assert j.state == "running" and r.slurm_id("j") is None and j.generation == 1 and j.failures == 0
    _flag(fake, "sbatch_hangs", False)
    for _ in range(2):
        r.apply(_decision("n4"))  # the same decision: the launch is found, not submitted again
    assert r.slurm_id("j") == "99" and len(_lines(fake / "sbatch.log")) == 1 and not _lines(fake / "scancel.log")
    o = r.status()[0]
    assert o.state == "running" and o.placement == {"n4": [0]} and o.generation == 0
    assert _live(fake, j.root) == [99]
    assert _outcomes(r) == ["unknown", "adopted"]
    kinds = [e["kind"] for e in _events(r)]
    assert kinds.count("launch") == 1 and kinds.count("controller_lost") == kinds.count("controller_back") == 1


def test_cut_sbatch_replaced_by_a_new_decision_is_cancelled_before_the_next_submit(fake, r):
    _flag(fake, "sbatch_hangs", True)
    r.apply(_decision("n4"))
    _flag(fake, "sbatch_hangs", False)
    _flag(fake, "down", True)  # the controller goes: the cut submit cannot be looked for
    r.apply(_decision("n3"))  # a new decision replaces launch 0 before anyone knew its Slurm id
    j = r.jobs["j"]
    assert j.state == "pending" and j.handle is None and len(_lines(fake / "sbatch.log")) == 1
    assert r.controller.owes(f"--name={G0}")
    _flag(fake, "down", False)
    r.apply(_decision("n3"))  # the owed cancel by name goes first; launch 0 is still saving
    assert _lines(fake / "scancel.log") == [f"--name={G0}"] and _live(fake, j.root) == [99]
    assert len(_lines(fake / "sbatch.log")) == 1 and j.handle is None  # not while launch 0 lives
    _set_state(fake, 99, "CANCELLED")
    r.apply(_decision("n3"))
    assert r.slurm_id("j") == "100" and j.generation == 2 and _live(fake, j.root) == [100]
    assert f"arena-u-{safe_name('j')}-g1" in (j.root / "logs" / "g1.sbatch").read_text()
    assert _lines(fake / "scancel.log") == [f"--name={G0}"] and j.failures == 0


def test_cut_sbatch_slurm_never_took_is_given_up_and_a_late_one_is_cancelled(fake, r, monkeypatch):
    import runners.slurm as rs

    monkeypatch.setattr(rs, "SUBMIT_GRACE_S", 0.0)
    _flag(fake, "sbatch_hangs", True)
    _flag(fake, "sbatch_refuses", True)  # never reached Slurm's job list
    r.apply(_decision("n4"))
    _flag(fake, "sbatch_hangs", False)
    _flag(fake, "sbatch_refuses", False)
    time.sleep(0.6)  # past the view's cache: an answer read after the cut
    r.apply(_decision("n4"))  # Slurm answers without it: given up, launched again as generation 1
    j = r.jobs["j"]
    assert _outcomes(r) == ["unknown", "not_accepted"] and j.failures == 0
    assert r.slurm_id("j") == "99" and j.generation == 2 and len(_lines(fake / "sbatch.log")) == 2
    # slurmctld takes the cut submit of generation 0 after all: cancelled, generation 1 runs on
    data = json.loads((fake / "squeue.json").read_text())
    late = dict(_jobs(fake)[99], job_id=7777, name=G0)
    data["jobs"].append(late)
    (fake / "squeue.json").write_text(json.dumps(data))
    time.sleep(0.6)
    r.status()
    assert _lines(fake / "scancel.log") == [f"--name={G0}", "7777"]
    assert r.slurm_id("j") == "99" and _jobs(fake)[7777]["job_state"] == "COMPLETING"  # saving, ending
    r.status()
    assert _lines(fake / "scancel.log") == [f"--name={G0}", "7777"]  # once, not each round
    assert [e["details"]["slurm_id"] for e in _events(r) if e["details"].get("stray")] == [7777]


def test_replaced_pending_launch_that_starts_before_its_owed_cancel_saves_and_runs_alone(fake, r):
    r.apply(_decision("n4"))
    j = r.jobs["j"]
    _set_state(fake, 99, "PENDING")  # a foreign job took the GPUs first
    assert r.status()[0].state == "pending"
    _flag(fake, "down", True)
    r.apply(_decision("n3"))  # replaced while slurmctld is away: the cancel is owed
    assert j.handle is None and r.controller.owes("99") and not _lines(fake / "scancel.log")
    _set_state(fake, 99, "RUNNING")  # slurmctld, back, starts it before the owed cancel lands
    _flag(fake, "down", False)
    r.apply(_decision("n3"))
    # the owed cancel is a plain scancel (SIGTERM: the ranks save), sent once, and nothing is
    # submitted while launch 0 is still saving
    assert _lines(fake / "scancel.log") == ["99"] and _live(fake, j.root) == [99]
    assert len(_lines(fake / "sbatch.log")) == 1 and j.handle is None
    r.apply(_decision("n3"))
    assert _lines(fake / "scancel.log") == ["99"] and len(_lines(fake / "sbatch.log")) == 1
    _set_state(fake, 99, "CANCELLED")  # saved and gone
    r.apply(_decision("n3"))
    assert r.slurm_id("j") == "100" and _live(fake, j.root) == [100] and j.failures == 0


def test_controller_that_answers_ping_and_scancel_but_not_queries_is_one_outage(fake, r):
    r.apply(_decision("n4"))
    assert r.status()[0].state == "running"
    _flag(fake, "hang", True)
    r.status()
    r.stop("j")  # its scancel is taken while every query still hangs: the same outage
    r.status()
    assert _lines(fake / "scancel.log") == ["99"]
    _flag(fake, "hang", False)
    r.status()
    kinds = [e["kind"] for e in _events(r) if e["kind"].startswith("controller_")]
    assert kinds == ["controller_lost", "controller_back"], kinds


# ---------------------------------------------------------------- a launch an earlier runner left running

LEFT_ID = 7700
RECORD = LaunchRecord(generation=0, gpu_type="v100-32gb", placement={"n4": [0]}, plan=Plan(dp=1))


def _left_running(fake: Path, tmp_path: Path) -> Path:
    """Launch 0 of job j, left RUNNING on n4 by a runner of tag `old` that was killed; its job directory."""
    root = job_root(tmp_path / "w", "j")
    root.mkdir(parents=True)
    data = json.loads((fake / "squeue.json").read_text())
    data["jobs"].append(dict(data["jobs"][0], job_id=LEFT_ID, name=f"arena-old-{safe_name('j')}-g0", nodes="n4",
                             gres_detail=["gpu:v100:1(IDX:0)"], current_working_directory=str(root.resolve()),
                             comment=""))
    (fake / "squeue.json").write_text(json.dumps(data))
    return root


def _add_j(tmp_path: Path) -> SlurmRunner:
    r = _runner(tmp_path)
    r.add_job(JobSpec(job_id="j", model="gpt-350M", global_batch=4, total_steps=5))
    return r


def test_launch_record_reads_back_what_was_written(tmp_path):
    write_launch_record(tmp_path, RECORD)
    assert read_launch_record(tmp_path, 0) == RECORD
    assert read_launch_record(tmp_path, 1) is None  # no record: not an error


@pytest.mark.parametrize("text, error", [
    (RECORD.model_dump_json()[:40], "Invalid JSON"),  # cut short (a full disk)
    (RECORD.model_dump_json().replace('"generation":0', '"generation":true'), "not a number"),
    (RECORD.model_dump_json().replace('"placement":{"n4":[0]}', '"placement":{}'), "placement"),
    (RECORD.model_dump_json().replace('"generation":0', '"generation":3'), "generation: 3, not 0"),
], ids=["truncated", "bool", "no_placement", "other_generation"])
def test_launch_record_that_does_not_validate_is_an_error_naming_the_file(tmp_path, text, error):
    LaunchFiles(tmp_path, 0).record.parent.mkdir(parents=True)
    LaunchFiles(tmp_path, 0).record.write_text(text)
    with pytest.raises(LaunchRecordInvalid) as e:
        read_launch_record(tmp_path, 0)
    assert e.value.path == LaunchFiles(tmp_path, 0).record and str(e.value.path) in str(e.value)
    assert error in e.value.error, e.value.error


def test_leftover_launch_with_its_record_is_taken_over_not_stopped(fake, tmp_path):
    root = _left_running(fake, tmp_path)
    write_launch_record(root, RECORD)
    r = _add_j(tmp_path)
    try:
        j = r.jobs["j"]
        assert r.slurm_id("j") == str(LEFT_ID) and j.generation == 1 and j.placement == {"n4": [0]}
        assert not _lines(fake / "scancel.log") and _live(fake, root) == [LEFT_ID]
        assert [e["details"]["slurm_id"] for e in _events(r) if e["details"].get("taken_over")] == [LEFT_ID]
    finally:
        r.shutdown(save=False)


def test_leftover_launch_whose_record_does_not_validate_is_stopped_with_an_event_saying_why(fake, tmp_path):
    root = _left_running(fake, tmp_path)
    write_launch_record(root, RECORD)
    path = LaunchFiles(root, 0).record
    path.write_text(path.read_text()[:-20])  # truncated
    r = _add_j(tmp_path)
    try:
        assert r.slurm_id("j") is None and r.jobs["j"].state == "pending"
        assert _lines(fake / "scancel.log") == [str(LEFT_ID)]  # stopped (saving) as without a record
        # the job's next launch is 1: launch 0's logs, exit codes and record are not overwritten
        assert r.jobs["j"].generation == 1
        ev = [e for e in _events(r) if e["kind"] == "launch_unrecorded"]
        assert len(ev) == 1 and ev[0]["job"] == "j", ev
        d = ev[0]["details"]
        assert d["slurm_id"] == LEFT_ID and d["record"] == str(path) and str(path) in d["message"]
        assert "Invalid JSON" in d["error"], d
        assert not [e for e in _events(r) if e["details"].get("taken_over")]
    finally:
        r.shutdown(save=False)


@pytest.mark.parametrize("controller, name", [(None, "arena-u-j-g0"), ("c", None)], ids=["no_controller", "no_name"])
def test_launch_without_a_slurm_id_needs_its_name_and_the_controller(controller, name):
    from runners.base import RunnerError

    c = _controller()[0] if controller else None
    with pytest.raises(RunnerError, match="without a Slurm id needs its job name"):
        SlurmLaunch(None, [], [], c, name=name)
    assert SlurmLaunch(None, [], [], _controller()[0], name="arena-u-j-g0").pending()  # both: looked for by name
