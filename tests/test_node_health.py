"""Node and GPU health for every policy: nothing new on a drained or down node or an unavailable GPU, a job on a
drained node keeps running until moved, one on a down node (or on a type it may no longer use) is re-planned with a
reason, and every decision passes the independent checker."""

import pytest

from arena_opt.cluster import load_cluster
from arena_opt.feasibility import InfeasibleDecision, check_decision
from arena_opt.health import health_view
from arena_opt.perf.estimator import PerfEstimator
from arena_opt.policies import REGISTRY, make_policy
from arena_opt.snapshot import ClusterSnapshot, Job, RunningState

POLICIES = sorted(REGISTRY)
M = "gpt-350M"


@pytest.fixture(scope="module")
def est():
    return PerfEstimator(table_mode="off")


def job(jid, gpus, t=0.0, **kw):
    return Job(id=jid, model=M, batch_size=128, total_iterations=10_000, remaining_iterations=10_000, submit_time=t,
               requested_num_gpus=gpus, requested_gpu_type=kw.pop("gtype", "a100-40gb"), **kw)


def run_on(j: Job, est, gtype: str, placement: dict[str, list[int]], cluster) -> Job:
    n = sum(len(g) for g in placement.values())
    r = est.best(j.arch, j.batch_size, cluster.catalog[gtype], None, gtype, len(placement),
                 max(len(g) for g in placement.values()))
    assert r is not None and r.plan.num_gpus == n
    return j.model_copy(update={"running": RunningState(gpu_type=gtype, placement=placement, plan=r.plan),
                                "requested_gpu_type": gtype})


def nodes(state=None, unavailable=None):
    cl = load_cluster("a100:2x4,a40:1x2")
    out = []
    for n in cl.nodes:
        upd = {}
        if state and n.id in state:
            upd["state"] = state[n.id]
        if unavailable and n.id in unavailable:
            upd["unavailable_gpus"] = unavailable[n.id]
        out.append(n.model_copy(update=upd))
    return cl, out


def decide(name, snap, est):
    # through model validation, as a snapshot from a file would be
    snap = ClusterSnapshot.model_validate(snap.model_dump())
    d = make_policy(name, {}, estimator=est).decide(snap)
    check_decision(snap, d)
    return snap, d.by_job()


def _gpus_used(d, node_id):
    return {g for jd in d.values() if jd.runs for g in jd.placement.get(node_id, [])}


@pytest.mark.parametrize("policy", POLICIES)
def test_down_node_offers_nothing_and_its_job_is_replanned(policy, est):
    cl, ns = nodes(state={"a100-40gb-000": "down"})
    a, b = ns[0].id, ns[1].id
    lost = run_on(job("lost", 4), est, "a100-40gb", {a: [0, 1, 2, 3]}, cl)
    snap = ClusterSnapshot(nodes=ns, jobs=[lost, job("new", 2, t=1)])
    snap, d = decide(policy, snap, est)
    assert not _gpus_used(d, a)
    assert d["lost"].action in ("migrate", "reshape", "preempt")
    assert "node a100-40gb-000 is down" in d["lost"].reason
    if d["lost"].runs:
        # anywhere healthy: the A100 node left or, where the policy's estimates favour it, the A40s
        assert a not in d["lost"].placement and set(d["lost"].placement) <= {n.id for n in ns if n.state == "available"}
        assert b in d["lost"].placement or d["lost"].gpu_type != "a100-40gb"


@pytest.mark.parametrize("policy", POLICIES)
def test_drained_node_keeps_its_job_and_starts_nothing(policy, est):
    cl, ns = nodes(state={"a100-40gb-000": "drain"})
    a = ns[0].id
    stay = run_on(job("stay", 2), est, "a100-40gb", {a: [0, 1]}, cl)
    snap = ClusterSnapshot(nodes=ns, jobs=[stay, job("new", 2, t=1), job("new2", 2, t=2)])
    snap, d = decide(policy, snap, est)
    used = _gpus_used(d, a)
    assert used <= {0, 1}  # the free GPUs 2, 3 of the drained node stay empty
    for jid, jd in d.items():
        if jid != "stay" and jd.runs:
            assert a not in jd.placement
    if d["stay"].action == "keep":
        assert d["stay"].placement == {a: [0, 1]}


@pytest.mark.parametrize("policy", POLICIES)
def test_unavailable_gpus_are_never_given_out(policy, est):
    cl, ns = nodes(unavailable={"a100-40gb-000": [1], "a100-40gb-001": [0, 3]})
    a, b = ns[0].id, ns[1].id
    hurt = run_on(job("hurt", 2), est, "a100-40gb", {b: [0, 1]}, cl)
    snap = ClusterSnapshot(nodes=ns, jobs=[hurt, *(job(f"w{i}", 1, t=i + 1) for i in range(6))])
    snap, d = decide(policy, snap, est)
    assert 1 not in _gpus_used(d, a) and not {0, 3} & _gpus_used(d, b)
    assert d["hurt"].action in ("migrate", "reshape", "preempt") and "unavailable" in d["hurt"].reason


@pytest.mark.parametrize("policy", POLICIES)
def test_running_on_a_type_no_longer_allowed_is_a_normal_decision(policy, est):
    cl, ns = nodes()
    c = ns[2].id  # the a40 node
    j = run_on(job("j", 2, gtype="a40"), est, "a40", {c: [0, 1]}, cl)
    j = j.model_copy(update={"allowed_gpu_types": ["a100-40gb"]})
    snap, d = decide(policy, ClusterSnapshot(nodes=ns, jobs=[j]), est)
    assert d["j"].action in ("migrate", "reshape", "preempt")
    assert "allowed_gpu_types" in d["j"].reason
    if d["j"].runs:
        assert d["j"].gpu_type == "a100-40gb"


def test_healthy_snapshot_is_decided_as_it_is():
    cl, ns = nodes()
    assert health_view(ClusterSnapshot(nodes=ns, jobs=[job("x", 1)])) is None


def test_checker_refuses_new_work_on_unusable_gpus(est):
    from arena_opt.decision import Decision, JobDecision

    cl, ns = nodes(state={"a100-40gb-000": "drain"}, unavailable={"a100-40gb-001": [2]})
    j = job("j", 1)
    plan = est.best(j.arch, j.batch_size, cl.catalog["a100-40gb"], None, "a100-40gb", 1, 1).plan
    for node, gpu, msg in ((ns[0].id, 0, "draining"), (ns[1].id, 2, "unavailable GPU")):
        d = Decision(policy="x", jobs=[JobDecision(job_id="j", action="start", gpu_type="a100-40gb", num_gpus=1,
                                                   num_nodes=1, placement={node: [gpu]}, plan=plan)])
        with pytest.raises(InfeasibleDecision, match=msg):
            check_decision(ClusterSnapshot(nodes=ns, jobs=[j]), d)
