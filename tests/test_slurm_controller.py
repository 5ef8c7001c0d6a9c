"""The Slurm runner's guard against a controller that goes away, without Slurm: stand-in client commands
on PATH whose behaviour a flag file switches (`down`: slurmctld gone, the ping fails and every other
command cannot connect; `hang`: squeue and sinfo never answer, as a query that got past the ping just
before the controller went). The same against a live Slurm: tests/test_slurm_runner.py."""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path

import pytest

from arena_opt.decision import Decision, JobDecision
from arena_opt.plan import Plan
from arena_opt.slurm.commands import SlurmOptions
from arena_opt.slurm.gres import GpuMap
from runners.base import JobSpec
from runners.slurm import Controller, SlurmLaunch, SlurmRunner

FIX = Path(__file__).parent / "fixtures" / "slurm"
TIMEOUT_S = 2.0  # long beside a stand-in command's start on a loaded CI host: "answered at once" is < TIMEOUT_S
NO_CONTACT = "echo 'error: Unable to contact slurm controller (connect failure)' >&2; exit 1"


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
                  f"cat {d}/state 2>/dev/null || echo RUNNING",
        "scancel": f'echo "$@" >> {d}/scancel.log\n[ -e {d}/down ] && {{ {NO_CONTACT}; }}\necho CANCELLED > {d}/state',
        "sbatch": f'echo "$@" >> {d}/sbatch.log\n[ -e {d}/down ] && {{ {NO_CONTACT}; }}\necho 99',
    }
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
                       options=SlurmOptions(query_timeout_s=TIMEOUT_S))


def _events(r: SlurmRunner) -> list[dict]:
    return [json.loads(line) for line in (r.workdir / "events.jsonl").read_text().splitlines()]


def test_sbatch_waits_while_the_controller_is_away_then_goes_once(fake, tmp_path):
    r = _runner(tmp_path)
    try:
        r.add_job(JobSpec(job_id="j", model="gpt-350M", global_batch=4, total_steps=5))
        r.cluster_nodes()
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
    finally:
        r.shutdown(save=False)


def test_no_second_launch_while_an_earlier_one_lives_in_the_jobs_directory(fake, tmp_path):
    r = _runner(tmp_path)
    try:
        r.add_job(JobSpec(job_id="j", model="gpt-350M", global_batch=4, total_steps=5))
        r.cluster_nodes()
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
    finally:
        r.shutdown(save=False)


def test_query_timeout_flag_reads_its_default_from_the_options_and_refuses_a_non_positive_value(capsys, monkeypatch):
    from arena_opt.cli import main

    monkeypatch.setattr(SlurmOptions.model_fields["query_timeout_s"], "default", 7.25)
    assert main(["run", "-h"]) == 0
    assert "(default 7.25)" in " ".join(capsys.readouterr().out.split())
    rc = main(["run", "--backend", "slurm", "--slurm-query-timeout", "0"])
    err = capsys.readouterr().err
    assert rc == 2 and "--slurm-query-timeout" in err and "Traceback" not in err, err
