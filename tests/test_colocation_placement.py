"""Co-location slowdown in placement and decisions: link loads from the cost model, tie-breaking on
predicted slowdown (in `place` and in the baselines, through the one occupancy engine), est_slowdown
in decisions."""

import json

import pytest

from arena_opt.contention import Contention
from arena_opt.decision import Decision, JobDecision, SolverStats
from arena_opt.feasibility import check_decision
from arena_opt.grids import job_grids
from arena_opt.linkloads import ColocationOptions, CommShares, LinkLoads
from arena_opt.occupancy import Occupancy, rack_map
from arena_opt.perf.estimator import PerfEstimator
from arena_opt.placement import place
from arena_opt.plan import Plan
from arena_opt.policies import make_policy
from arena_opt.policies.base import GridPolicy
from arena_opt.report import print_decision
from arena_opt.snapshot import ClusterSnapshot, Job, Node, RunningState

EST = PerfEstimator()
MODEL = "bert-1.3B"


class Fixed(GridPolicy):
    """Chooses the given grids; placement and the decision are GridPolicy's."""

    name = "fixed"

    def __init__(self, chosen, colocation=ColocationOptions()):
        super().__init__({"colocation": colocation}, EST)
        self.chosen = chosen

    def choose(self, snapshot):
        return dict(self.chosen), {}, SolverStats()


def _job(jid, running=None, batch=256, **kw):
    return Job(id=jid, model=MODEL, batch_size=batch, total_iterations=100, remaining_iterations=100,
               running=running, **kw)


def _grid(snap, jid, nodes, gpus):
    job = next(j for j in snap.jobs if j.id == jid)
    gs = [g for g in job_grids(job, snap, EST) if g.shape.nodes == nodes and g.num_gpus == gpus]
    cur = [g for g in gs if g.current]
    return (cur or gs)[0]


# ---- uplinks: a spanning job avoids the racks a running spanning job crosses ---------------------------
def _racks_snapshot():
    racks = {"A": 4, "B": 2, "C": 2, "D": 2}
    nodes = [Node(id=f"{r.lower()}{i}", gpu_type="a100", num_gpus=4, rack=r) for r, n in racks.items()
             for i in range(n)]
    free = ClusterSnapshot(nodes=nodes, jobs=[_job("x"), _job("y")])
    plan = _grid(free, "x", 4, 16).result.plan
    x_running = RunningState(gpu_type="a100", plan=plan,
                             placement={n: [0, 1, 2, 3] for n in ("a0", "a1", "c0", "c1")})
    # y asks for what it is given below, so that a baseline starts it on that grid too
    return ClusterSnapshot(nodes=nodes, jobs=[_job("x", x_running),
                                              _job("y", submit_time=1.0, requested_num_gpus=16,
                                                   requested_gpu_type="a100")])


def test_spanning_job_goes_to_racks_whose_uplinks_are_free():
    snap = _racks_snapshot()
    chosen = {"x": _grid(snap, "x", 4, 16), "y": _grid(snap, "y", 4, 16)}
    assert chosen["x"].current and not chosen["y"].current
    # racks A, B and D each have two free nodes: packing alone takes the first two (A and B), so y
    # would cross rack A's uplink, which x (racks A and C) already loads
    assert sorted(place(snap, chosen)["y"]) == ["a2", "a3", "b0", "b1"]
    # rack A's uplink carries one node's bandwidth (4 nodes at 4:1): x and y would share it
    d = Fixed(chosen, ColocationOptions(uplink_oversubscription=4.0)).decide(snap)
    check_decision(snap, d)
    by = d.by_job()
    assert sorted(by["y"].placement) == ["b0", "b1", "d0", "d1"]
    assert by["x"].placement == snap.jobs[0].running.placement  # kept where it runs
    assert by["x"].est_slowdown == pytest.approx(1.0) and by["y"].est_slowdown == pytest.approx(1.0)
    # a non-blocking network (the default) predicts nothing: the packing order stands
    d0 = Fixed(chosen).decide(snap)
    assert sorted(d0.by_job()["y"].placement) == ["a2", "a3", "b0", "b1"]
    assert d0.by_job()["y"].est_slowdown == 1.0


def test_forced_uplink_sharing_is_predicted_and_reported():
    snap = _racks_snapshot()
    # y placed by packing alone crosses rack A's uplink beside x: both are predicted slower
    chosen = {"x": _grid(snap, "x", 4, 16), "y": _grid(snap, "y", 4, 16)}
    opts = ColocationOptions(uplink_oversubscription=4.0)
    pol = Fixed(chosen, opts)
    cont = pol.contention(snap)
    pl = place(snap, chosen)
    for jid in ("x", "y"):
        cont.add(jid, chosen[jid], pl[jid])
    slow = cont.slowdowns()
    assert slow["x"] > 1.0 and slow["y"] > 1.0
    assert cont.rack_cost("y", chosen["y"], "rack:A") > 0.0 == cont.rack_cost("y", chosen["y"], "rack:D")


# ---- the node fabric: two identical jobs on one PCIe node --------------------------------------------
def _pcie_snapshot(jobs):
    nodes = [Node(id=f"n{i}", gpu_type="a100", num_gpus=8, intra_link="pcie", rack="r") for i in range(2)]
    return ClusterSnapshot(nodes=nodes, jobs=jobs)


def _four_gpu_plan():
    snap = _pcie_snapshot([_job("p")])
    return _grid(snap, "p", 1, 4).result.plan


def test_two_identical_jobs_on_one_link_match_processor_sharing():
    plan = _four_gpu_plan()
    jobs = [_job(j, RunningState(gpu_type="a100", plan=plan, placement={"n0": gpus}))
            for j, gpus in (("a", [0, 1, 2, 3]), ("b", [4, 5, 6, 7]))]
    snap = _pcie_snapshot(jobs)
    chosen = {j: _grid(snap, j, 1, 4) for j in ("a", "b")}
    d = Fixed(chosen).decide(snap)
    share = CommShares(EST.params)(jobs[0].arch, 256, "a100-40gb", snap.catalog["a100-40gb"], "pcie", 1, 4,
                                   plan)
    f = share.intra
    assert 0.0 < f < 1.0 and share.inter == 0.0
    # each job sends a fraction f of its time; while it sends it meets the other with probability p,
    # which then holds half the link: T = T0 (1 + f p) with p = f (1 + p) / (1 + f p), i.e.
    # f p^2 + (1 - f) p - f = 0
    p = (-(1 - f) + ((1 - f) ** 2 + 4 * f * f) ** 0.5) / (2 * f)
    for j in ("a", "b"):
        jd = d.by_job()[j]
        assert jd.est_slowdown == pytest.approx(1 + f * p, rel=1e-6)
        assert jd.est_throughput == pytest.approx(chosen[j].throughput / jd.est_slowdown)
        assert jd.est_iter_time_s == pytest.approx(chosen[j].result.iter_time_s * jd.est_slowdown)
    # an NVLink node gives each GPU its own links: nothing to share
    nv = Fixed(chosen, ColocationOptions(fabric_rings={"pcie": None})).decide(snap)
    assert [jd.est_slowdown for jd in nv.jobs] == [1.0, 1.0]


def test_new_job_goes_to_the_node_without_communicating_neighbours():
    plan = _four_gpu_plan()
    one = Plan()
    jobs = [_job("busy", RunningState(gpu_type="a100", plan=plan, placement={"n0": [0, 1, 2, 3]}))]
    jobs += [_job(f"s{i}", RunningState(gpu_type="a100", plan=one, placement={"n1": [i]})) for i in range(4)]
    jobs.append(_job("new"))
    snap = _pcie_snapshot(jobs)
    chosen = {j.id: _grid(snap, j.id, 1, 1 if j.id.startswith("s") else 4) for j in jobs}
    # both nodes have 4 free GPUs; packing alone takes the first, beside the communicating job
    assert list(place(snap, chosen)["new"]) == ["n0"]
    d = Fixed(chosen).decide(snap)
    assert list(d.by_job()["new"].placement) == ["n1"]
    assert all(jd.est_slowdown == 1.0 for jd in d.jobs)


# ---- decisions -------------------------------------------------------------------------------------
def test_decision_round_trips_with_slowdown(capsys):
    plan = _four_gpu_plan()
    jobs = [_job(j, RunningState(gpu_type="a100", plan=plan, placement={"n0": gpus}))
            for j, gpus in (("a", [0, 1, 2, 3]), ("b", [4, 5, 6, 7]))]
    snap = _pcie_snapshot(jobs + [_job("w")])
    chosen = {j: _grid(snap, j, 1, 4) for j in ("a", "b")}
    d = Fixed(chosen).decide(snap)
    assert d.by_job()["a"].est_slowdown > 1.0 and d.by_job()["w"].est_slowdown is None
    back = Decision.model_validate_json(d.model_dump_json())
    assert back == d
    assert json.loads(d.model_dump_json())["jobs"][0]["est_slowdown"] == d.jobs[0].est_slowdown
    assert "est_slowdown" in Decision.model_json_schema()["$defs"]["JobDecision"]["properties"]
    print_decision(snap, d)
    assert "fixed decision" in capsys.readouterr().out
    # older decisions without the field still load; a factor below 1 is refused
    old = json.loads(d.model_dump_json())
    del old["jobs"][0]["est_slowdown"]
    assert Decision.model_validate(old).jobs[0].est_slowdown is None
    with pytest.raises(ValueError):
        JobDecision(job_id="a", action="wait", est_slowdown=0.5)
    # the model switched off: no factor, alone estimates
    off = Fixed(chosen, None).decide(snap)
    assert off.by_job()["a"].est_slowdown is None
    assert off.by_job()["a"].est_throughput == pytest.approx(chosen["a"].throughput)


# ---- the occupancy engine: the baselines place by the same rules; rollback is exact ---------------------
@pytest.mark.parametrize("name", ["fcfs", "arena-greedy"])
def test_baselines_place_by_the_rules_of_place(name):
    snap = _racks_snapshot()
    chosen = {"x": _grid(snap, "x", 4, 16), "y": _grid(snap, "y", 4, 16)}
    packing_only = sorted(place(snap, chosen)["y"])
    assert packing_only == ["a2", "a3", "b0", "b1"]  # fewest racks, then the first of equally free ones
    extra = {"max_upgrades": 0} if name == "arena-greedy" else {}
    pol = make_policy(name, extra, estimator=EST)
    d = pol.decide(snap)
    check_decision(snap, d)
    by = d.by_job()
    assert by["x"].action == "keep" and by["y"].action == "start"
    assert sorted(by["y"].placement) == packing_only and by["y"].est_slowdown == 1.0
    # rack A's uplink carries one node's bandwidth (4 nodes at 4:1): y keeps off the uplink x loads
    pol = make_policy(name, {**extra, "colocation": ColocationOptions(uplink_oversubscription=4.0)}, estimator=EST)
    by = pol.decide(snap).by_job()
    assert sorted(by["y"].placement) == ["b0", "b1", "d0", "d1"]
    assert by["x"].est_slowdown == pytest.approx(1.0) and by["y"].est_slowdown == pytest.approx(1.0)


def test_rollback_restores_the_contention_and_the_order_of_ties():
    snap = _racks_snapshot()
    x, y = _grid(snap, "x", 4, 16), _grid(snap, "y", 4, 16)
    links = LinkLoads({n.id: n for n in snap.nodes}, rack_map(snap), snap.catalog, EST.params,
                      ColocationOptions(uplink_oversubscription=4.0))
    c = Contention(snap, links, CommShares(EST.params))
    occ = Occupancy.of(snap, [("x", snap.jobs[0].running.placement, x)], c)
    assert set(c.placed) == {"x"}
    one = _grid(snap, "y", 1, 4)
    first = occ.find(one)
    m = occ.mark()
    pl = occ.take("y", y)
    assert sorted(pl) == ["b0", "b1", "d0", "d1"] and set(c.placed) == {"x", "y"}
    occ.release("x")
    assert set(c.placed) == {"y"} and occ.free_gpus(x.pool) == 4 * 6
    occ.rollback(m)
    assert set(c.placed) == {"x"} and occ.where == {"x": snap.jobs[0].running.placement}
    assert occ.find(one) == first
    # a release and a new hold count as changes: the node that changed goes last among equals
    m = occ.mark()
    occ.hold("z", first)
    occ.release("z")
    assert occ.find(one) != first
    occ.rollback(m)
    assert occ.find(one) == first


def _contention_state(c):
    return list(c.placed), {j: c.placed[j].loads for j in c.placed}, dict(c._order), \
        {r: list(js) for r, js in c.users.items()}


def test_fits_released_leaves_the_contention_as_a_release_and_rollback_would():
    """A job asked about goes last in the contention's placement order, as giving its GPUs back and
    taking them again puts it (`Contention.requeue` instead of `remove` and `add`)."""
    snap = _racks_snapshot()
    x, y = _grid(snap, "x", 4, 16), _grid(snap, "y", 4, 16)
    links = LinkLoads({n.id: n for n in snap.nodes}, rack_map(snap), snap.catalog, EST.params,
                      ColocationOptions(uplink_oversubscription=4.0))
    occs = []
    for _ in range(2):
        c = Contention(snap, links, CommShares(EST.params))
        occ = Occupancy.of(snap, [("x", snap.jobs[0].running.placement, x)], c)
        occ.take("y", y)
        occs.append(occ)
    asked, done = occs
    assert list(asked.contention.placed) == ["x", "y"]
    for jid, grid in (("x", y), ("y", x), ("x", _grid(snap, "y", 1, 4))):
        m = done.mark()
        want = done.find(grid, done.release(jid)) is not None
        done.rollback(m)
        assert asked.fits_released(grid, jid) is want
        assert _contention_state(asked.contention) == _contention_state(done.contention)
    assert list(asked.contention.placed) == ["y", "x"]
    assert not asked.no_contention
    asked.release("x")
    asked.release("y")
    assert asked.no_contention


def test_placement_order_gives_no_two_jobs_one_place_after_a_removal():
    """The contention sums slowdowns in placement order: after a job leaves, the next one registered still
    goes after every job already there (a count of the registered jobs would give it the place of the
    last one, and the tie would be broken by set iteration, i.e. by the process's hash seed)."""
    snap = _racks_snapshot()
    x, y = _grid(snap, "x", 4, 16), _grid(snap, "y", 4, 16)
    links = LinkLoads({n.id: n for n in snap.nodes}, rack_map(snap), snap.catalog, EST.params,
                      ColocationOptions(uplink_oversubscription=4.0))
    c = Contention(snap, links, CommShares(EST.params))
    at_x = snap.jobs[0].running.placement
    occ = Occupancy.of(snap, [("x", at_x, x)], c)
    occ.take("y", y)
    assert list(c.placed) == ["x", "y"]
    c.remove("x")
    c.add("x", x, at_x)
    order = _contention_state(c)[2]
    assert list(c.placed) == ["y", "x"]
    assert len(set(order.values())) == len(order) and sorted(order, key=order.get) == ["y", "x"]
