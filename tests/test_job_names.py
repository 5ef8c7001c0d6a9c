"""Hostile job ids at every backend: each id gets its own directory inside the
work directory and a rendezvous id torch can use as a file name; `a/b` and
`a_b` never share anything. The local backend really trains two of them side
by side (slow test in tests/test_faults.py); here the naming and dry-run."""

from __future__ import annotations

import io
import re
import shlex

from arena_opt.decision import Decision, JobDecision
from arena_opt.plan import Plan
from runners.base import JobSpec
from runners.dry_run import DryRunRunner
from runners.local import LocalRunner
from runners.managed import job_root
from runners.names import safe_name

HOSTILE = ["a/b", "a_b", ".", "..", "../../etc/passwd", "x/../../y", "ünï/cødé", "雪", "a b\tc\n", "-rf",
           "x" * 200, "y" * 200 + "z", "A", "a", "job-1", "~root", "$(touch pwned)"]


def test_every_id_gets_a_distinct_safe_name_inside_the_workdir(tmp_path):
    names = [safe_name(j) for j in HOSTILE]
    assert len(set(names)) == len(HOSTILE)
    for jid, n in zip(HOSTILE, names):
        assert re.fullmatch(r"[A-Za-z0-9_-]{1,60}", n), (jid, n)
        root = job_root(tmp_path, jid)
        assert root.parent == tmp_path / "jobs" and root.resolve().parent == (tmp_path / "jobs").resolve()
    assert safe_name("job-1").startswith("job-1-")  # readable where the id allows


def test_local_backend_keeps_hostile_ids_apart(tmp_path):
    r = LocalRunner(tmp_path / "work", device="cpu")
    for jid in HOSTILE:
        r.add_job(JobSpec(job_id=jid, model="gpt-350M", global_batch=4, total_steps=1))
    roots = {j.root for j in r.jobs.values()}
    assert len(roots) == len(HOSTILE) and all(p.parent == r.workdir / "jobs" for p in roots)
    assert [o.job_id for o in r.status()] == HOSTILE


def test_dry_run_commands_for_hostile_ids_are_safe(tmp_path):
    out = io.StringIO()
    r = DryRunRunner(tmp_path / "runs", out=out)
    jobs = []
    for i, jid in enumerate(HOSTILE):
        r.add_job(JobSpec(job_id=jid, model="gpt-350M", global_batch=4, total_steps=10))
        jobs.append(JobDecision(job_id=jid, action="start", gpu_type="a100", num_gpus=1,
                                placement={f"n{i}": [0]}, plan=Plan()))
    r.apply(Decision(policy="t", jobs=jobs))
    rdzv, dirs = set(), set()
    for line in out.getvalue().splitlines():
        if line.startswith("mkdir"):
            d = shlex.split(line)[2]
            assert d.startswith(str((tmp_path / "runs" / "jobs").resolve()) + "/")
            dirs.add(d)
        if "torchrun" in line and not line.startswith("#"):
            argv = shlex.split(line)
            rid = next(a.split("=", 1)[1] for a in argv if a.startswith("--rdzv-id="))
            assert re.fullmatch(r"[A-Za-z0-9_-]+-g0", rid), rid
            rdzv.add(rid)
    assert len(rdzv) == len(dirs) == len(HOSTILE)
