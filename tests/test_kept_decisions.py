"""What a policy keeps from round to round to decide faster must not change a decision: last round's
JobDecisions (policies/base.py LastDecisions) serve only while what they were made from stands, and the
grid catalogue's per-job memo of its workload entry follows the job's fields."""

import pytest

from arena_opt.cluster import load_cluster
from arena_opt.decision import SolverStats
from arena_opt.grids import GridCatalog
from arena_opt.perf.estimator import PerfEstimator
from arena_opt.policies.base import LastDecisions, build_decision
from arena_opt.snapshot import ClusterSnapshot, Job, RunningState

M, BATCH, GPU = "gpt-350M", 128, "a10"


@pytest.fixture(scope="module")
def est():
    return PerfEstimator(table_mode="off")


def _job(jid: str, gpus: int, t: float, **kw) -> Job:
    return Job(id=jid, model=M, batch_size=BATCH, total_iterations=10_000, remaining_iterations=10_000,
               submit_time=t, requested_num_gpus=gpus, requested_gpu_type=GPU, **kw)


def _round(jobs: list[Job], t: float, cluster: ClusterSnapshot) -> ClusterSnapshot:
    # the next round's snapshot as a simulator makes it: fresh job objects with their live fields moved on,
    # the running state kept while the allocation stands
    return ClusterSnapshot(nodes=cluster.nodes, jobs=[j.model_copy(update={"remaining_iterations": 9_000.0})
                                                      for j in jobs], time=t)


def _decide(snap, chosen, placements, reasons, slow, last=None):
    return build_decision(snap, "p", chosen, placements, reasons, SolverStats(solver="t", status="ok"), slow,
                          None, last)


@pytest.fixture()
def setting(est):
    cluster = load_cluster("a10:2x4")
    old, new = _job("old", 2, 0.0), _job("new", 2, 1.0)
    plan = est.best(old.arch, BATCH, cluster.catalog[GPU], None, GPU, 1, 2).plan
    old = old.model_copy(update={"running": RunningState(gpu_type=GPU, placement={"a10-000": [0, 1]}, plan=plan)})
    jobs = [old, new, _job("w", 4, 2.0)]
    snap = ClusterSnapshot(nodes=cluster.nodes, jobs=jobs, time=600.0)
    cat = GridCatalog.of(est)
    chosen = {"old": cat.current(old, snap), "new": cat.requested(new, snap)}
    placements = {"old": old.running.placement, "new": {"a10-001": [0, 1]}}
    return cluster, jobs, snap, chosen, placements


def test_a_kept_decision_is_last_rounds_object_and_what_a_fresh_build_gives(setting):
    cluster, jobs, snap, chosen, placements = setting
    last = LastDecisions()
    reasons = {"w": "queued behind earlier jobs"}
    first = _decide(snap, chosen, placements, reasons, {"old": 1.25}, last)
    snap2 = _round(jobs, 900.0, cluster)
    # an equal reason made anew (policies format theirs each round)
    again = _decide(snap2, chosen, placements, {"w": "queued behind " + "earlier jobs"}, {"old": 1.25}, last)
    assert [jd.action for jd in again.jobs] == ["keep", "start", "wait"]
    assert all(a is b for a, b in zip(again.jobs, first.jobs))
    assert again.jobs == _decide(snap2, chosen, placements, reasons, {"old": 1.25}).jobs
    assert again.time == 900.0


@pytest.mark.parametrize("change", ["slowdown", "reason", "placement", "running", "grid", "modelled"])
def test_a_decision_is_built_anew_when_what_it_is_made_from_changes(setting, est, change):
    cluster, jobs, snap, chosen, placements = setting
    last = LastDecisions()
    reasons, slow = {"w": "queued behind earlier jobs"}, {"old": 1.25}
    first = _decide(snap, chosen, placements, reasons, slow, last)
    chosen, placements, reasons, slow = dict(chosen), dict(placements), dict(reasons), dict(slow)
    if change == "slowdown":
        slow["old"] = 1.5
    elif change == "reason":
        reasons["w"] = "GPUs fragmented: no placement this round"
    elif change == "placement":
        placements["new"] = {"a10-001": [2, 3]}
    elif change == "running":
        # `new` started last round on the same GPUs; a grid that is not its current one now moves it
        r = RunningState(gpu_type=GPU, placement={"a10-001": [0, 1]}, plan=chosen["new"].result.plan)
        jobs = [jobs[0], jobs[1].model_copy(update={"running": r}), jobs[2]]
    elif change == "grid":
        chosen["new"] = GridCatalog.of(est).options(jobs[1], snap)[(GPU, 4)]
        placements["new"] = {"a10-001": [0, 1, 2, 3]}
    else:
        slow = None
    snap2 = _round(jobs, 900.0, cluster)
    again = _decide(snap2, chosen, placements, reasons, slow, last)
    assert again.jobs == _decide(snap2, chosen, placements, reasons, slow).jobs
    assert again.jobs != first.jobs
    changed = {"slowdown": {"old"}, "reason": {"w"}, "placement": {"new"}, "running": {"new"}, "grid": {"new"},
               "modelled": {"old", "new"}}[change]
    assert {a.job_id for a, b in zip(again.jobs, first.jobs) if a is not b} == changed
    if change == "running":
        assert again.jobs[1].action == "migrate"


def test_the_catalogues_job_memo_follows_the_jobs_fields(est):
    cluster = load_cluster("a10:2x4,v100-32gb:2x4")
    snap = ClusterSnapshot(nodes=cluster.nodes, jobs=[], time=0.0)
    job = _job("j", 2, 0.0)
    cat = GridCatalog.of(est)
    both = cat.options(job, snap)
    assert {t for t, _ in both} == {"a10", "v100-32gb"}
    req = cat.requested(job, snap)
    # a later round's copy of the same job: the memo's entry, options and derived view serve
    moved = job.model_copy(update={"remaining_iterations": 5.0})
    assert cat.options(moved, snap) is both and cat.requested(moved, snap) is req

    for changed in (job.model_copy(update={"allowed_gpu_types": ["v100-32gb"]}),
                    job.model_copy(update={"batch_size": 32}),
                    job.model_copy(update={"max_gpus": 1})):
        opts = cat.options(changed, snap)
        ref = GridCatalog(est)  # one that never saw the job
        assert opts == ref.options(changed, snap)
        assert cat.requested(changed, snap) == ref.requested(changed, snap)
        assert opts != both
    # the job's own list edited in place after the memo saw it
    allowed = job.model_copy(update={"allowed_gpu_types": ["a10", "v100-32gb"]})
    assert {t for t, _ in cat.options(allowed, snap)} == {"a10", "v100-32gb"}
    allowed.allowed_gpu_types.remove("a10")
    assert {t for t, _ in cat.options(allowed, snap)} == {"v100-32gb"}
    assert cat.requested(allowed, snap).shape.gpu_type == "v100-32gb"
