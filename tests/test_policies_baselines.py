"""Each baseline on small hand-built snapshots: the behaviour its module promises."""

import pytest

from arena_opt.feasibility import check_decision
from arena_opt.grids import GridCatalog, compact_shape, requested_grid
from arena_opt.perf.estimator import GridShape, PerfEstimator
from arena_opt.policies import make_policy
from arena_opt.reconfig import ReconfigModel
from arena_opt.cluster import load_cluster
from arena_opt.snapshot import ClusterSnapshot, Job, RunningState

M = "gpt-350M"


@pytest.fixture(scope="module")
def est():
    return PerfEstimator(table_mode="off")


def job(jid, gpus, gtype="a100", t=0.0, iters=10_000, **kw):
    return Job(id=jid, model=M, batch_size=128, total_iterations=iters, remaining_iterations=iters, submit_time=t,
               requested_num_gpus=gpus, requested_gpu_type=gtype, **kw)


def running(j: Job, cluster: ClusterSnapshot, est, placement: dict[str, list[int]]) -> Job:
    node = next(n for n in cluster.nodes if n.id in placement)
    n = sum(len(g) for g in placement.values())
    nodes, per = len(placement), max(len(g) for g in placement.values())
    r = est.best(j.arch, j.batch_size, cluster.catalog[node.gpu_type], None, node.gpu_type, nodes, per)
    assert r is not None and r.plan.num_gpus == n
    return j.model_copy(update={"running": RunningState(gpu_type=node.gpu_type, placement=placement, plan=r.plan)})


def snap(cluster, jobs, t=0.0):
    return ClusterSnapshot(nodes=cluster.nodes, jobs=jobs, time=t)


def decide(name, s, est, **kw):
    d = make_policy(name, kw, estimator=est).decide(s)
    check_decision(s, d)
    return d.by_job()


# ---- FCFS ------------------------------------------------------------------------------------------
def test_fcfs_runs_the_request_in_order_and_blocks_per_type(est):
    cl = load_cluster("a100:2x4,a40:2x2")
    s = snap(cl, [job("a", 8, t=0), job("b", 4, t=1), job("c", 2, "a40", t=2), job("d", 1, t=3)])
    d = decide("fcfs", s, est)
    assert d["a"].action == "start" and d["a"].num_gpus == 8 and d["a"].num_nodes == 2  # whole nodes
    # b does not fit (a holds all a100s); d would fit nowhere either, and must not overtake b anyway
    assert d["b"].action == "wait" and d["d"].action == "wait"
    assert d["c"].action == "start" and d["c"].gpu_type == "a40" and d["c"].num_gpus == 2


def test_fcfs_no_backfilling_and_no_preemption(est):
    cl = load_cluster("a100:1x4")
    s0 = snap(cl, [])
    r = running(job("old", 2, t=5), s0, est, {cl.nodes[0].id: [0, 1]})
    s = snap(cl, [r, job("big", 4, t=0), job("small", 1, t=9)])
    d = decide("fcfs", s, est)
    assert d["old"].action == "keep"  # never preempted, although "big" came first
    assert d["big"].action == "wait"
    assert d["small"].action == "wait"  # 2 GPUs are free, but "big" is first in line


def test_requested_grid_substitutes_the_nearest_feasible_count(est):
    cl = load_cluster("a100:1x4,a40:1x2")
    cache = GridCatalog.of(est)
    j = job("x", 8, "a40")  # 8 a40s do not exist here
    g = requested_grid(j, cache.options(j, cl))
    assert (g.shape.gpu_type, g.num_gpus) == ("a40", 2)
    j = job("y", 2, "h100")  # a type the cluster lacks: fastest type at that count
    g = requested_grid(j, cache.options(j, cl))
    fastest = max((cache.options(j, cl)[(t, 2)] for t in ("a100-40gb", "a40")), key=lambda g: g.throughput)
    assert g == fastest


# ---- Gavel -----------------------------------------------------------------------------------------
def test_gavel_keeps_the_count_and_picks_the_faster_type(est):
    cl = load_cluster("a100:1x4,a10:2x2")
    s = snap(cl, [job("a", 2, "a10")])
    d = decide("gavel", s, est)
    assert d["a"].num_gpus == 2 and d["a"].gpu_type == "a100-40gb"  # requested a10; a100 is faster


def test_gavel_migration_cap(est):
    cl = load_cluster("a100:1x4,a10:2x2")
    s0 = snap(cl, [])
    r = running(job("a", 2, "a10"), s0, est, {"a10-000": [0, 1]})
    assert decide("gavel", snap(cl, [r]), est)["a"].action in ("migrate", "reshape")
    d = decide("gavel", snap(cl, [r]), est, max_migrations=0)
    assert d["a"].action == "keep"


def test_gavel_admits_in_submission_order(est):
    cl = load_cluster("a100:1x4")
    s = snap(cl, [job("first", 4, t=0), job("second", 2, t=1), job("third", 2, t=2)])
    d = decide("gavel", s, est)
    assert d["first"].action == "start" and d["second"].action == "wait" and d["third"].action == "wait"


# ---- Sia -------------------------------------------------------------------------------------------
def test_sia_scales_jobs_and_never_preempts(est):
    cl = load_cluster("a100:2x4")
    s0 = snap(cl, [])
    r = running(job("old", 1, t=0), s0, est, {"a100-40gb-000": [0]})
    s = snap(cl, [r, job("new", 1, t=10)], t=3600)
    d = decide("sia", s, est)
    assert d["old"].runs and d["new"].runs
    assert d["old"].num_gpus + d["new"].num_gpus > 2  # the idle GPUs are handed out


def test_sia_restart_factor_keeps_young_jobs_in_place(est):
    cl = load_cluster("a100:2x4")
    s0 = snap(cl, [])
    r = running(job("old", 1, t=0), s0, est, {"a100-40gb-000": [0]})
    # the job is 10 s old and a move costs an hour: r = 0.01, nothing is worth moving it
    slow = ReconfigModel(mode="per_gpu", per_gpu_s=3600, cap_s=3600)
    d = decide("sia", snap(cl, [r], t=10), est, reconfig=slow)
    assert d["old"].action == "keep"
    d = decide("sia", snap(cl, [r], t=10 * 86400), est, reconfig=ReconfigModel(mode="per_gpu", per_gpu_s=1, cap_s=1))
    assert d["old"].action == "reshape" and d["old"].num_gpus > 1


# ---- ElasticFlow -----------------------------------------------------------------------------------
def test_elasticflow_minimum_share_meets_the_deadline(est):
    cl = load_cluster("a100:4x4")
    j = job("x", 1, iters=20_000)
    opts = GridCatalog.of(est).options(j, cl)
    times = {n: opts[("a100-40gb", n)].result.iter_time_s for n in (1, 2, 4, 8, 16)}
    # a deadline that 4 GPUs meet and 2 do not
    ddl = 30 + 20_000 * (times[4] + times[2]) / 2
    j = job("x", 1, iters=20_000, deadline=ddl)
    other = job("y", 1, t=1)  # no deadline: smallest share, after the deadline job
    d = decide("elasticflow", snap(cl, [j, other]), est)
    assert d["x"].num_gpus >= 4 and d["x"].gpu_type == "a100-40gb"
    assert d["y"].runs
    # leftover GPUs were doubled out: both together hold more than their shares
    assert d["x"].num_gpus + d["y"].num_gpus > 5


def test_elasticflow_kept_rungs_give_the_share_computed_afresh(est):
    """ElasticFlow keeps each job's rung delays and times while its ladder and running count stay: round after
    round (time and remaining work moving, the job starting and being resized) the share and the running rung
    equal a plain pass over the ladder."""
    cl = load_cluster("a100:4x4")
    pol = make_policy("elasticflow", {}, estimator=est)
    pol.reconfig = ReconfigModel()  # checkpoint mode: delays depend on the count and on a resume
    base = job("x", 1, iters=20_000)
    opts = GridCatalog.of(est).options(base, cl)
    ladder = sorted((g for (t, _), g in opts.items() if t == "a100-40gb"), key=lambda g: g.num_gpus)
    assert len(ladder) >= 4

    def plain(j, lad, cur, now):
        for i, g in enumerate(lad):
            same = cur is not None and g.num_gpus == cur.num_gpus
            delay = 0.0 if same else pol.reconfig.delay_s(j.arch, g.num_gpus, resumed=j.running is not None)
            if now + delay + j.remaining_iterations * g.result.iter_time_s <= j.deadline:
                return i, True
        return 0, False

    waiting = job("x", 1, iters=20_000, deadline=30 + 20_000 * ladder[2].result.iter_time_s)
    on_two = running(waiting, cl, est, {cl.nodes[0].id: [0, 1]})
    on_four = running(waiting, cl, est, {cl.nodes[0].id: [0, 1, 2, 3]})
    seen = set()
    for j, cur in ((waiting, None), (on_two, ladder[1]), (on_two, ladder[1]), (on_four, ladder[2]),
                   (waiting, None)):
        for rem in (20_000, 15_000, 9_000, 100):
            for now in (0.0, 600.0, 6_000.0, 60_000.0):
                jj = j.model_copy(update={"remaining_iterations": float(rem)})
                want = plain(jj, ladder, cur, now)
                assert pol._share(jj, ladder, cur, now) == want
                seen.add(want)
        held = next((k for k, g in enumerate(ladder) if cur is not None and g.num_gpus == cur.num_gpus), 0)
        assert pol._rungs(j, ladder, cur)[1] == held
    assert len(seen) >= 3  # several rungs won, and none at all
    # another ladder object (the catalog derived it anew) is not served the kept rungs
    other = ladder[1:]
    assert pol._share(waiting, other, None, 0.0) == plain(waiting, other, None, 0.0)


def test_elasticflow_keeps_the_type(est):
    cl = load_cluster("a100:1x4,a10:2x2")
    d = decide("elasticflow", snap(cl, [job("a", 1, "a10")]), est)
    assert d["a"].gpu_type == "a10"


# ---- Arena's heuristic -----------------------------------------------------------------------------
def test_arena_greedy_consolidates_fragmented_nodes(est):
    cl = load_cluster("a100:2x4")
    s0 = snap(cl, [])
    a = running(job("a", 1, t=0), s0, est, {"a100-40gb-000": [0]})
    b = running(job("b", 1, t=1), s0, est, {"a100-40gb-001": [0]})
    d = decide("arena-greedy", snap(cl, [a, b, job("w", 4, t=2)]), est, max_upgrades=0)
    assert d["w"].action == "start" and d["w"].num_gpus == 4
    moved = [x for x in ("a", "b") if d[x].action == "migrate"]
    assert len(moved) == 1 and all(d[x].runs for x in ("a", "b"))


def test_arena_greedy_halves_the_cheapest_job_to_start_a_new_one(est):
    cl = load_cluster("a100:1x4")
    s0 = snap(cl, [])
    a = running(job("a", 4, t=0), s0, est, {"a100-40gb-000": [0, 1, 2, 3]})
    d = decide("arena-greedy", snap(cl, [a, job("w", 2, t=5)]), est, max_upgrades=0)
    assert d["w"].runs and d["a"].runs
    assert d["a"].action == "reshape" and d["a"].num_gpus + d["w"].num_gpus <= 4


def test_arena_greedy_preempts_opportunistic_jobs_for_an_earlier_one(est):
    cl = load_cluster("a100:1x4")
    s0 = snap(cl, [])
    late = running(job("late", 1, t=10, min_gpus=1), s0, est, {"a100-40gb-000": [0]})
    # "early" needs the whole node at 4 GPUs and cannot run on fewer
    early = job("early", 4, t=0, min_gpus=4)
    d = decide("arena-greedy", snap(cl, [late, early], t=20), est, max_upgrades=0)
    assert d["early"].action == "start" and d["late"].action == "preempt"


def test_arena_greedy_upgrades_with_idle_gpus(est):
    cl = load_cluster("a100:1x4")
    s0 = snap(cl, [])
    a = running(job("a", 1, t=0), s0, est, {"a100-40gb-000": [0]})
    d = decide("arena-greedy", snap(cl, [a]), est)
    assert d["a"].num_gpus > 1 and d["a"].action == "reshape"
    assert decide("arena-greedy", snap(cl, [a]), est, max_upgrades=0)["a"].action == "keep"


def test_compact_shapes(est):
    # grids the baselines build on: compact shapes, whole nodes beyond one node
    assert compact_shape(8, 4) == (2, 4) and compact_shape(2, 4) == (1, 2)
    cl = load_cluster("a100:2x4")
    g = GridCatalog.of(est).options(job("x", 8), cl)[("a100-40gb", 8)]
    assert g.multi_node and g.shape == GridShape("a100-40gb", 2, 4, g.shape.pp)


def test_packing_bookkeeping_and_rollback(est):
    """The baselines' GPU packing (the occupancy engine): counts stay in step with the free lists, best
    fit and whole-node rules hold, and a rollback restores exactly the state of its mark."""
    from arena_opt.occupancy import Occupancy

    cl = load_cluster("a100:3x4,a40:2x2")
    cache = GridCatalog.of(est)
    s = snap(cl, [])
    pack = Occupancy.of(s, [("held", {"a100-40gb-001": [1, 2]}, None)])
    opts = cache.options(job("x", 1), cl)
    pool_keys = list(cache.cluster(cl).pool_map)

    def state(p):
        return ({n.id: p.node_free(n.id) for n in cl.nodes}, {k: p.free_gpus(k) for k in pool_keys},
                {n.id: p.gpus_free(n.id)[:] for n in cl.nodes}, dict(p.where),
                {k: p.pool[k].stamp[:] for k in pool_keys})

    def consistent(p):
        for key in pool_keys:
            assert p.free_gpus(key) == sum(p.node_free(nid) for nid in p.nodes(key))
            for nid in p.nodes(key):
                assert len(p.gpus_free(nid)) == p.node_free(nid)

    # best fit: a 2-GPU grid goes to the node with exactly 2 free, not to an empty one
    two = opts[("a100-40gb", 2)]
    assert pack.find(two) == {"a100-40gb-001": [0, 3]}
    before = state(pack)
    m = pack.mark()
    pack.hold("a", pack.find(two))
    pack.hold("b", pack.find(opts[("a100-40gb", 8)]))  # whole nodes only: the two empty ones
    assert set(pack.where["b"]) == {"a100-40gb-000", "a100-40gb-002"}
    assert pack.find(opts[("a100-40gb", 1)]) is None and pack.free_gpus(two.pool) == 0
    pack.release("held")
    consistent(pack)
    pack.rollback(m)
    consistent(pack)
    assert state(pack) == before
