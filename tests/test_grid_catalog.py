"""The grid catalogue: one cache of every job's grids per estimator, valid for one estimator version,
so that an online correction reaches every policy at once."""

import pytest

from arena_opt.feasibility import check_decision
from arena_opt.grids import GridCatalog
from arena_opt.perf.estimator import GridShape, PerfEstimator
from arena_opt.policies import REGISTRY, make_policy
from arena_opt.cluster import load_cluster
from arena_opt.snapshot import ClusterSnapshot, Job, RunningState

M, BATCH, GPU = "gpt-350M", 128, "a10"


@pytest.fixture(scope="module")
def base():
    return PerfEstimator(table_mode="off")


def _estimator(base: PerfEstimator) -> PerfEstimator:
    est = PerfEstimator(table_mode="off")
    est.planner = base.planner  # share the plan cache; corrections are the estimator's own
    return est


def _job(jid: str, gpus: int, t: float) -> Job:
    return Job(id=jid, model=M, batch_size=BATCH, total_iterations=10_000, remaining_iterations=10_000,
               submit_time=t, requested_num_gpus=gpus, requested_gpu_type=GPU)


def _snapshot(cluster: ClusterSnapshot, base: PerfEstimator) -> ClusterSnapshot:
    old = _job("old", 2, 0.0)
    plan = base.best(old.arch, BATCH, cluster.catalog[GPU], None, GPU, 1, 2).plan
    old = old.model_copy(update={"running": RunningState(gpu_type=GPU, placement={"a10-000": [0, 1]}, plan=plan)})
    return ClusterSnapshot(nodes=cluster.nodes, jobs=[old, _job("new", 2, 1.0)], time=600.0)


def _alone_s(est: PerfEstimator, cluster: ClusterSnapshot, jd) -> float:
    """Iteration time of the decision's grid (shape and pipeline depth) from `est`, uncached."""
    per = max(len(g) for g in jd.placement.values())
    shape = GridShape(jd.gpu_type, jd.num_nodes, per, jd.plan.pp)
    link = cluster.nodes[0].intra_link
    return est.grid(_job("x", 1, 0.0).arch, BATCH, cluster.catalog[jd.gpu_type], link, shape).proxy.iter_time_s


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_policy_decides_on_the_corrected_time(name, base):
    cluster = load_cluster("a10:2x4")
    est = _estimator(base)
    policy = make_policy(name, estimator=est)
    snap = _snapshot(cluster, base)
    before = policy.decide(snap)  # warms every cache the policy reads
    check_decision(snap, before)
    runs = [jd for jd in before.jobs if jd.runs]
    assert runs
    for jd in runs:
        assert jd.est_iter_time_s == pytest.approx(_alone_s(base, cluster, jd) * (jd.est_slowdown or 1.0))

    # the live loop measured every a10 job 2x slower than estimated
    t = runs[0].est_iter_time_s
    est.observe(M, GPU, t, 2 * t, weight=1.0)
    assert est.correction[(M, GPU)] == pytest.approx(2.0)
    fresh = _estimator(base)
    fresh.correction = dict(est.correction)

    for s in (snap, _snapshot(cluster, base)):  # the same snapshot object and a new one
        after = policy.decide(s)
        check_decision(s, after)
        runs = [jd for jd in after.jobs if jd.runs]
        assert {jd.job_id for jd in runs} == {"old", "new"}
        for jd in runs:
            alone = jd.est_iter_time_s / (jd.est_slowdown or 1.0)
            assert alone == pytest.approx(_alone_s(fresh, cluster, jd))
            assert alone == pytest.approx(2 * _alone_s(base, cluster, jd))


def test_catalog_is_one_per_estimator_and_follows_its_version(base):
    cluster = load_cluster("a10:1x4")
    est = _estimator(base)
    cat = GridCatalog.of(est)
    assert GridCatalog.of(est) is cat and GridCatalog.of(_estimator(base)) is not cat
    j = _job("a", 1, 0.0)
    opts = cat.options(j, cluster)
    assert cat.options(j, cluster) is opts  # cached while the estimator does not change
    t = opts[(GPU, 1)].result.iter_time_s
    v = est.version
    est.observe(M, GPU, t, 3 * t, weight=1.0)
    assert est.version == v + 1
    again = cat.options(j, cluster)
    assert again is not opts and again[(GPU, 1)].result.iter_time_s == pytest.approx(3 * t)
    # every lookup of the catalogue sees the same version: grids, requested grid and shape plans
    assert cat.requested(j, cluster).result.iter_time_s == pytest.approx(3 * t)
    g = next(g for g in cat.grids(j, cluster) if g.num_gpus == 1)
    assert g.result.iter_time_s == pytest.approx(3 * t)
    assert cat.plans(j.arch, BATCH, cluster.catalog[GPU], cluster.nodes[0].intra_link, g.shape).proxy.iter_time_s == pytest.approx(
        g.result.iter_time_s)


def test_grid_lists_kept_across_rounds_follow_the_running_allocation(base):
    """A job's grid list is reused while its workload and running allocation stand, and is what a fresh
    catalogue computes in every round: new when the job starts, moves or the estimator changes."""
    cluster = load_cluster("a10:2x4")
    est = _estimator(base)
    cat = GridCatalog.of(est)
    snap = _snapshot(cluster, base)
    old = snap.jobs[0]

    def fresh(snapshot, job):
        return GridCatalog(est).grids(job, snapshot, prune=True)

    first = cat.grids(old, snap, prune=True)
    first.clear()  # the caller's list is its own: the catalogue's copy must not change with it
    again = cat.grids(old, snap, prune=True)
    assert again == fresh(snap, old) and any(g.current for g in again)
    # the same allocation in a new RunningState object (another round's snapshot): still the same grids
    same = old.model_copy(update={"running": old.running.model_copy()})
    assert cat.grids(same, snap, prune=True) == again
    # moved to two other GPUs of another node: the current grid follows the placement's shape
    moved = old.model_copy(update={"running": old.running.model_copy(update={"placement": {"a10-001": [2, 3]}})})
    assert cat.grids(moved, snap, prune=True) == fresh(snap, moved)
    # stopped: no current grid any more
    waiting = old.model_copy(update={"running": None})
    assert cat.grids(waiting, snap, prune=True) == fresh(snap, waiting)
    assert not any(g.current for g in cat.grids(waiting, snap, prune=True))
    # an estimator correction reaches the kept lists too
    g = next(g for g in again if g.current)
    est.observe(M, GPU, g.result.iter_time_s, 2 * g.result.iter_time_s, weight=1.0)
    now = cat.grids(old, snap, prune=True)
    assert now == fresh(snap, old) and now != again


def test_a_kept_running_list_is_served_without_reading_the_allocation_again(base, monkeypatch):
    """The same running state object as when the list was made: the kept list, and the allocation's shape
    (nodes, GPUs per node) is not read again; a new state object of the same allocation is read once and
    gets the same list; a moved one is read and gets what a fresh catalogue gives."""
    import arena_opt.grids as grids

    cluster = load_cluster("a10:2x4")
    est = _estimator(base)  # held here: the catalogue keeps only a weak reference
    cat = GridCatalog(est)
    snap = _snapshot(cluster, base)
    old = snap.jobs[0]
    reads = []
    shape = grids._current_shape
    monkeypatch.setattr(grids, "_current_shape", lambda job, node_map: reads.append(job.id) or shape(job, node_map))
    first = cat.grids(old, snap, prune=True)
    assert reads == ["old"]
    assert cat.grids(old, snap, prune=True) == first and reads == ["old"]
    same = old.model_copy(update={"running": old.running.model_copy()})
    assert cat.grids(same, snap, prune=True) == first and reads == ["old", "old"]
    moved = old.model_copy(update={"running": old.running.model_copy(update={"placement": {"a10-001": [2, 3]}})})
    assert cat.grids(moved, snap, prune=True) == GridCatalog(est).grids(moved, snap, prune=True)
    assert reads[:3] == ["old"] * 3
