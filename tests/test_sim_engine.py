"""The simulator on hand-computed scenarios: iteration times come from a table we write, so every
completion time below is arithmetic on the scenario, checked exactly."""

import pytest

from arena_opt.decision import Decision, JobDecision, SolverStats
from arena_opt.grids import job_grids
from arena_opt.perf.estimator import PerfEstimator
from arena_opt.perf.table import PerfTable
from arena_opt.policies.base import GridPolicy
from arena_opt.policies.fcfs import FCFSPolicy
from arena_opt.reconfig import ReconfigModel
from arena_opt.cluster import load_cluster
from arena_opt.sim import SimOptions, SimulationError, Simulator
from arena_opt.trace import TraceJob
from arena_opt.metrics import compute
from arena_opt.sim.perf import NoisyEstimator

MODEL, BATCH = "gpt-350M", 128
# seconds per iteration on one a100 node with 1, 2 and 4 GPUs
TIMES = {1: 3.0, 2: 1.5, 4: 1.0}


@pytest.fixture(scope="module")
def truth():
    table = PerfTable({(MODEL, BATCH, "a100-40gb", 1, n): t for n, t in TIMES.items()}, source="test")
    return PerfEstimator(table=table, table_mode="strict")


@pytest.fixture(scope="module")
def node4():
    return load_cluster("a100:1x4")


def job(jid, t, iters, gpus, deadline=None):
    return TraceJob(id=jid, submit_time=t, model=MODEL, batch_size=BATCH, iterations=iters, num_gpus=gpus,
                    gpu_type="a100", deadline=deadline)


def by_id(res):
    return {j["id"]: j for j in res.job_dicts()}


def test_fcfs_completion_times_exact(truth, node4):
    trace = [job("A", 0, 1000, 4), job("B", 10, 100, 2), job("C", 20, 200, 2)]
    res = Simulator(node4, trace, FCFSPolicy(estimator=truth), truth=truth, options=SimOptions()).run()
    r = by_id(res)
    restart = ReconfigModel().restart_s  # a fresh start pays the restart constant only
    # A starts at the first tick (t=0) on all 4 GPUs
    assert r["A"]["finish"] == pytest.approx(restart + 1000 * TIMES[4], rel=1e-12)
    # B and C wait for A; A ends at 1030, the next tick is 1200; both start there, 2 GPUs each
    assert r["B"]["first_start"] == 1200 and r["C"]["first_start"] == 1200
    assert r["B"]["finish"] - r["B"]["submit"] == pytest.approx(1200 + restart + 100 * TIMES[2] - 10, rel=1e-12)
    assert r["C"]["finish"] - r["C"]["submit"] == pytest.approx(1200 + restart + 200 * TIMES[2] - 20, rel=1e-12)
    m = compute(res)
    assert m["finished"] == 3 and m["avg_jct_s"] == pytest.approx((1030 + 1370 + 1510) / 3, rel=1e-12)
    assert m["avg_queue_s"] == pytest.approx((0 + 1190 + 1180) / 3)
    # the policy ran at t=0, 300 (B and C arrived), 1200 (A finished at 1030) and 1500 (B finished at
    # 1380): never in a round where nothing happened, nor after the last job (C, 1530) left
    assert [d["t"] for d in res.decisions] == [0, 300, 1200, 1500]
    assert res.end == r["C"]["finish"]


class Scripted(GridPolicy):
    """Runs job A on 2 GPUs before t=300 and on 4 GPUs from then on."""

    name = "scripted"

    def choose(self, snapshot):
        chosen = {}
        for j in snapshot.jobs:
            want = 2 if snapshot.time < 300 else 4
            grids = [g for g in job_grids(j, snapshot, self.estimator) if g.num_gpus == want]
            chosen[j.id] = max(grids, key=lambda g: (g.current, g.throughput))
        return chosen, {}, SolverStats()


def test_reconfiguration_costs_time_and_progress_is_never_revalued(truth, node4):
    per_gpu = ReconfigModel(mode="per_gpu", per_gpu_s=10, cap_s=40)
    opts = SimOptions(reconfig=per_gpu, replan="every-tick")
    res = Simulator(node4, [job("A", 0, 1000, 2)], Scripted(estimator=truth), truth=truth, options=opts).run()
    a = by_id(res)["A"]
    # t=0: start on 2 GPUs, 20 s restart; t=300: 280 s of progress at 1.5 s/iter is kept as is,
    # then 40 s of restart on 4 GPUs and the rest at 1.0 s/iter
    done = (300 - 20) / TIMES[2]
    assert a["finish"] == pytest.approx(300 + 40 + (1000 - done) * TIMES[4], rel=1e-12)
    assert a["reconfigs"] == 1 and a["starts"] == 1
    assert a["restart_seconds"] == pytest.approx(60)
    assert a["gpu_seconds"] == pytest.approx(2 * 300 + 4 * (a["finish"] - 300))
    assert a["productive_gpu_seconds"] == pytest.approx(2 * 280 + 4 * (a["finish"] - 340))


def test_checkpoint_reconfiguration_uses_the_model(truth, node4):
    model = ReconfigModel()  # checkpoint: restart + save/load of the sharded checkpoint
    opts = SimOptions(reconfig=model, replan="every-tick")
    res = Simulator(node4, [job("A", 0, 1000, 2)], Scripted(estimator=truth), truth=truth, options=opts).run()
    a = by_id(res)["A"]
    arch = TraceJob(id="x", submit_time=0, model=MODEL, batch_size=BATCH, iterations=1).to_job().arch
    d0 = model.delay_s(arch, 2, resumed=False)
    d1 = model.delay_s(arch, 4, resumed=True)
    assert d1 > d0 == model.restart_s
    done = (300 - d0) / TIMES[2]
    assert a["finish"] == pytest.approx(300 + d1 + (1000 - done) * TIMES[4], rel=1e-12)


def test_horizon_stops_after_n_rounds(truth, node4):
    trace = [job("A", 0, 1000, 4), job("B", 10, 100, 2)]
    res = Simulator(node4, trace, FCFSPolicy(estimator=truth), truth=truth, options=SimOptions(rounds=2)).run()
    assert res.end == 600
    r = by_id(res)
    assert r["A"]["status"] == "running" and r["A"]["remaining"] == pytest.approx(1000 - (600 - 30) / TIMES[4])
    assert r["B"]["status"] == "waiting"
    m = compute(res)
    assert m["finished"] == 0 and m["unfinished"] == 2 and m["rounds"] == 2


def test_noise_changes_what_the_policy_sees_not_the_truth(truth, node4):
    noisy = NoisyEstimator(truth, 0.2, seed=3)
    trace = [job("A", 0, 1000, 4), job("B", 10, 100, 2), job("C", 20, 200, 2)]
    plain = Simulator(node4, trace, FCFSPolicy(estimator=truth), truth=truth).run()
    perturbed = Simulator(node4, trace, FCFSPolicy(estimator=noisy), truth=truth).run()
    assert [j.finish for j in plain.jobs] == [j.finish for j in perturbed.jobs]  # FCFS ignores speeds
    arch = trace[0].to_job().arch
    spec = node4.catalog["a100-40gb"]
    from arena_opt.perf.estimator import GridShape

    for n in (1, 2, 4):
        shape = GridShape("a100-40gb", 1, n, 1)
        t_true = truth.grid(arch, BATCH, spec, None, shape).proxy.iter_time_s
        t_seen = noisy.grid(arch, BATCH, spec, None, shape).proxy.iter_time_s
        assert t_seen == pytest.approx(t_true * noisy.factor(MODEL, BATCH, shape))
        assert 0.8 <= t_seen / t_true <= 1.2
    assert NoisyEstimator(truth, 0.2, seed=3).factor(MODEL, BATCH, shape) == noisy.factor(MODEL, BATCH, shape)
    assert NoisyEstimator(truth, 0.2, seed=4).factor(MODEL, BATCH, shape) != noisy.factor(MODEL, BATCH, shape)


class DoubleBooker(GridPolicy):
    """Gives the same GPUs to every job: the simulator must refuse, not repair."""

    name = "double-booker"

    def choose(self, snapshot):
        raise NotImplementedError

    def decide(self, snapshot):
        node = snapshot.nodes[0].id
        plan = next(g for g in job_grids(snapshot.jobs[0], snapshot, self.estimator) if g.num_gpus == 2).result.plan
        return Decision(time=snapshot.time, policy=self.name, jobs=[
            JobDecision(job_id=j.id, action="start", gpu_type="a100-40gb", num_gpus=2, num_nodes=1,
                        placement={node: [0, 1]}, plan=plan) for j in snapshot.jobs])


def test_infeasible_decision_is_an_error(truth, node4):
    trace = [job("A", 0, 100, 2), job("B", 0, 100, 2)]
    with pytest.raises(SimulationError, match="infeasible decision.*given to"):
        Simulator(node4, trace, DoubleBooker(estimator=truth), truth=truth).run()


class Restarter(GridPolicy):
    """Says 'keep' while moving the job: the action and the allocation disagree."""

    name = "restarter"

    def choose(self, snapshot):
        raise NotImplementedError

    def decide(self, snapshot):
        j = snapshot.jobs[0]
        g = next(g for g in job_grids(j, snapshot, self.estimator) if g.num_gpus == 2)
        gpus = [0, 1] if snapshot.time < 300 else [2, 3]
        action = "start" if j.running is None else "keep"
        return Decision(time=snapshot.time, policy=self.name, jobs=[
            JobDecision(job_id=j.id, action=action, gpu_type="a100-40gb", num_gpus=2, num_nodes=1,
                        placement={snapshot.nodes[0].id: gpus}, plan=j.running.plan if j.running else g.result.plan)])


def test_keep_that_moves_the_job_is_an_error(truth, node4):
    with pytest.raises(SimulationError, match="'keep' but the allocation differs"):
        Simulator(node4, [job("A", 0, 1000, 2)], Restarter(estimator=truth), truth=truth,
                  options=SimOptions(replan="every-tick")).run()


def test_job_without_feasible_grid_is_rejected(truth, node4):
    # the table only has gpt-350M at batch 128: strict mode makes batch 256 infeasible everywhere
    trace = [job("A", 0, 100, 2), TraceJob(id="X", submit_time=5, model=MODEL, batch_size=256, iterations=10)]
    res = Simulator(node4, trace, FCFSPolicy(estimator=truth), truth=truth).run()
    r = by_id(res)
    assert r["X"]["status"] == "rejected" and "no feasible grid" in r["X"]["reject_reason"]
    assert r["A"]["status"] == "done"
    assert compute(res)["rejected"] == 1


def test_grid_the_truth_cannot_run_is_an_error(node4):
    # the truth only knows 4 GPUs; the policy's analytical estimate also offers 2
    truth = PerfEstimator(table=PerfTable({(MODEL, BATCH, "a100-40gb", 1, 4): 1.0}), table_mode="strict")
    estimate = PerfEstimator(table_mode="off")
    with pytest.raises(SimulationError, match="infeasible in the performance truth"):
        Simulator(node4, [job("A", 0, 100, 2)], FCFSPolicy(estimator=estimate), truth=truth).run()


def test_run_restores_the_collectors_thresholds_also_when_it_fails(truth, node4):
    import gc

    from arena_opt.sim.engine import _RUN_GC_THRESHOLD0

    before = gc.get_threshold()
    seen = []

    class Watcher(FCFSPolicy):
        def decide(self, snapshot):
            seen.append(gc.get_threshold())
            return super().decide(snapshot)

    Simulator(node4, [job("A", 0, 100, 2)], Watcher(estimator=truth), truth=truth).run()
    # raised inside the run only
    assert seen and all(t[0] == max(before[0], _RUN_GC_THRESHOLD0) and t[1:] == before[1:] for t in seen)
    assert gc.get_threshold() == before
    with pytest.raises(SimulationError):
        Simulator(node4, [job("A", 0, 100, 2), job("B", 0, 100, 2)], DoubleBooker(estimator=truth), truth=truth).run()
    assert gc.get_threshold() == before
