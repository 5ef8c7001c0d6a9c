"""The independent decision check catches every kind of infeasible decision (each one fed on purpose),
and passes a feasible one."""

import pytest

from arena_opt.decision import Decision, JobDecision
from arena_opt.feasibility import InfeasibleDecision, check_decision
from arena_opt.plan import Plan
from arena_opt.snapshot import ClusterSnapshot

TP2 = Plan(dp=2, tp=2, num_microbatches=2)  # 4 GPUs
DP2 = Plan(dp=2, num_microbatches=2)
SHAPED = Plan(pp=2, num_microbatches=2, stage_shapes=[(1, 1), (1, 2)])  # 3 GPUs, a tp pair in stage 1


def snapshot(**nodes_state) -> ClusterSnapshot:
    nodes = [{"id": "a0", "gpu_type": "a100-40gb", "num_gpus": 4}, {"id": "a1", "gpu_type": "a100-40gb", "num_gpus": 4},
             {"id": "b0", "gpu_type": "a40", "num_gpus": 2}, {"id": "c0", "gpu_type": "a100-40gb", "num_gpus": 2},
             {"id": "c1", "gpu_type": "a100-40gb", "num_gpus": 1}]
    for n in nodes:
        n.update(nodes_state.get(n["id"], {}))
    job = {"model": "gpt-350M", "batch_size": 8, "total_iterations": 10, "remaining_iterations": 10}
    jobs = [dict(job, id="run", running={"gpu_type": "a100-40gb", "placement": {"a1": [0, 1]}, "plan": DP2.model_dump()}),
            dict(job, id="new"), dict(job, id="only40", allowed_gpu_types=["a40"])]
    return ClusterSnapshot.model_validate({"time": 1.0, "nodes": nodes, "jobs": jobs})


def start(job="new", placement=None, plan=TP2, gpu_type="a100-40gb", **kw) -> JobDecision:
    placement = {"a0": [0, 1, 2, 3]} if placement is None else placement
    return JobDecision(job_id=job, action=kw.pop("action", "start"), gpu_type=gpu_type,
                       num_gpus=kw.pop("num_gpus", plan.num_gpus), num_nodes=len(placement), placement=placement,
                       plan=plan, **kw)


KEEP = JobDecision(job_id="run", action="keep", gpu_type="a100-40gb", num_gpus=2, num_nodes=1, placement={"a1": [0, 1]},
                   plan=DP2)
WAIT = JobDecision(job_id="only40", action="wait")


def decide(*jobs) -> Decision:
    return Decision(policy="test", jobs=list(jobs))


def test_a_feasible_decision_passes():
    check_decision(snapshot(), decide(KEEP, start(), WAIT))
    check_decision(snapshot(), decide(KEEP, start(placement={"c1": [0], "c0": [0, 1]}, plan=SHAPED), WAIT))
    # a draining node keeps what its job holds
    check_decision(snapshot(a1={"state": "drain"}), decide(KEEP, start(), WAIT))


BAD = [
    ("unknown job", lambda: decide(KEEP, start(), WAIT, JobDecision(job_id="ghost", action="wait")), {},
     "decision for unknown job 'ghost'"),
    ("two decisions", lambda: decide(KEEP, start(), WAIT, WAIT), {}, "job 'only40' has two decisions"),
    ("missing", lambda: decide(KEEP, start()), {}, r"no decision for jobs \['only40'\]"),
    ("waits holding GPUs", lambda: decide(KEEP, start(), JobDecision(job_id="only40", action="wait",
                                                                      placement={"b0": [0]})), {},
     "is wait but holds GPUs"),
    ("no plan", lambda: decide(KEEP, JobDecision(job_id="new", action="start", gpu_type="a100-40gb", num_gpus=4,
                                                 placement={"a0": [0, 1, 2, 3]}), WAIT), {},
     "runs without a plan or GPU type"),
    ("disallowed type", lambda: decide(KEEP, start(job="only40"), JobDecision(job_id="new", action="wait")), {},
     "placed on disallowed type a100-40gb"),
    ("unknown node", lambda: decide(KEEP, start(placement={"zz": [0, 1, 2, 3]}), WAIT), {},
     "placed on unknown node 'zz'"),
    ("node down", lambda: decide(KEEP, start(), WAIT), {"a0": {"state": "down"}}, "a0, which is down"),
    ("unavailable GPU", lambda: decide(KEEP, start(), WAIT), {"a0": {"unavailable_gpus": [2]}},
     "unavailable GPU a0:2"),
    ("new work on a draining node", lambda: decide(KEEP, start(), WAIT), {"a0": {"state": "drain"}},
     "new GPUs on node a0, which is draining"),
    ("wrong GPU type", lambda: decide(KEEP, start(gpu_type="a40", placement={"a0": [0, 1, 2, 3]}),
                                      JobDecision(job_id="only40", action="wait")), {}, "node a0 is a100-40gb, not a40"),
    ("GPU index past the node", lambda: decide(KEEP, start(placement={"a0": [0, 1, 2, 4]}), WAIT), {},
     "GPU a0:4 does not exist"),
    ("a GPU given to two jobs", lambda: decide(KEEP, start(placement={"a1": [1, 2], "a0": [0, 1]}, plan=DP2.model_copy(
        update={"dp": 4})), WAIT), {}, "GPU a1:1 given to 'run' and 'new'"),
    ("a GPU given twice to one job", lambda: decide(KEEP, start(placement={"a0": [0, 0, 1, 2]}), WAIT), {},
     "GPU a0:0 given to 'new' and 'new'"),
    ("count vs decision", lambda: decide(KEEP, start(num_gpus=3), WAIT), {}, "decision says 3, plan needs 4"),
    ("count vs plan", lambda: decide(KEEP, start(placement={"a0": [0, 1]}, num_gpus=2), WAIT), {},
     "placement holds 2 GPUs, decision says 2, plan needs 4"),
    ("spans without whole nodes", lambda: decide(KEEP, start(placement={"a0": [0, 1], "c0": [0, 1]}), WAIT), {},
     "spans nodes without taking them whole"),
    ("tp across nodes", lambda: decide(KEEP, start(placement={"c0": [0, 1], "c1": [0]}, plan=Plan(tp=3)), WAIT),
     {}, "tp=3 groups cross nodes"),
    ("per-stage tp across nodes", lambda: decide(KEEP, start(placement={"c0": [0, 1], "c1": [0]}, plan=SHAPED), WAIT),
     {}, "tp group 0 of stage 1 .* spans two nodes"),
    ("micro-batches do not split the replica's share",
     lambda: decide(KEEP, start(plan=Plan(dp=4, num_microbatches=4)), WAIT), {},
     r"plan.num_microbatches: 4 does not divide the per-replica batch 2 \(batch_size 8 / dp 4\)"),
    ("dp does not divide the batch", lambda: decide(KEEP, start(plan=Plan(dp=3), placement={"a0": [0, 1, 2]}), WAIT),
     {}, "plan.dp: dp 3 does not divide batch_size 8"),
    ("memory", lambda: decide(KEEP, start(est_mem_per_gpu_gib=41.0), WAIT), {}, "41.0 GiB per GPU exceeds 40"),
]


@pytest.mark.parametrize("what,make,state,message", BAD, ids=[b[0] for b in BAD])
def test_every_kind_of_infeasible_decision_is_caught(what, make, state, message):
    with pytest.raises(InfeasibleDecision, match=message):
        check_decision(snapshot(**state), make())


# the unvalidated constructors build_decision uses: the very decision validation makes, or validation
PLACED = dict(job_id="new", action="start", gpu_type="a100-40gb", num_gpus=4, num_nodes=1, placement={"a0": [0, 1, 2, 3]},
              plan=TP2, est_iter_time_s=0.5, est_throughput=16.0, est_slowdown=1.25, est_mem_per_gpu_gib=9.0,
              est_band=None)


def same_model(a: JobDecision, b: JobDecision) -> None:
    assert a == b
    assert list(a.__dict__) == list(b.__dict__)
    assert a.model_fields_set == b.model_fields_set
    assert a.model_dump_json() == b.model_dump_json()
    assert a.model_dump_json(exclude_unset=True) == b.model_dump_json(exclude_unset=True)


def test_idle_and_placed_are_the_validated_decisions():
    same_model(JobDecision.idle("new", "wait", "queued"), JobDecision(job_id="new", action="wait", reason="queued"))
    same_model(JobDecision.placed(**PLACED), JobDecision(**PLACED))
    a, b = JobDecision.idle("x", "preempt", "r"), JobDecision.idle("y", "wait", "r")
    a.placement["a0"] = [0]
    assert b.placement == {}  # each its own default


@pytest.mark.parametrize("field, value", [("est_throughput", -1.0), ("est_slowdown", 0.5), ("num_gpus", -4),
                                          ("action", "run"), ("plan", {"dp": 0})])
def test_placed_validates_what_it_cannot_trust(field, value):
    with pytest.raises(ValueError, match=field):
        JobDecision.placed(**dict(PLACED, **{field: value}))


def test_idle_validates_what_it_cannot_trust():
    with pytest.raises(ValueError, match="action"):
        JobDecision.idle("new", "start-now", "r")
    assert JobDecision.idle("new", "wait", "r").action == "wait"
