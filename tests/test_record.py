"""The run record: its counting rules on a hand-computed script, GPU-time conservation, the JSON round
trip, and the same run written by the simulator and by the live loop giving the same metrics."""

import json

import pytest

from arena_opt.cluster import load_cluster
from arena_opt.decision import Decision, SolverStats
from arena_opt.grids import job_grids
from arena_opt.io import load_model, write_model
from arena_opt.metrics import Timeline, compute
from arena_opt.perf.estimator import PerfEstimator
from arena_opt.perf.table import PerfTable
from arena_opt.policies.base import GridPolicy, Policy
from arena_opt.reconfig import ReconfigModel
from arena_opt.record import JobRecord, RecordError, Recorder, RunRecord
from arena_opt.sim import SimOptions, Simulator
from arena_opt.trace import TraceJob
from runners.base import ObservedJob, Runner
from runners.live import LiveLoop, LiveOptions

MODEL, BATCH = "gpt-350M", 128
TIMES = {1: 3.0, 2: 1.5, 4: 1.0}  # s per iteration on one a100 node
RECONFIG = ReconfigModel(mode="per_gpu", per_gpu_s=10, cap_s=40)


def scripted_record(tmp_path=None):
    """Job A on a 4-GPU cluster: start, reshape, crash and relaunch, preemption and resume, finish.
    Job B: submitted, never started."""
    rec = Recorder(RunRecord(policy="script", interval_s=100.0, total_gpus=4),
                   events_path=None if tmp_path is None else tmp_path / "events.jsonl")
    a = rec.add_job(JobRecord(id="A", model=MODEL, batch_size=BATCH, iterations=100, submit=0.0, ref_throughput=50.0))
    b = rec.add_job(JobRecord(id="B", model=MODEL, batch_size=BATCH, iterations=100, submit=30.0))
    rec.submit(0.0, a)
    rec.sample(0.0)
    rec.start(10.0, a, 2, action="start")
    rec.sample(10.0)
    rec.ready(20.0, a, 100.0)
    rec.sample(20.0)
    rec.submit(30.0, b)
    rec.sample(30.0)
    rec.reconfigure(50.0, a, 4, action="reshape")
    rec.sample(50.0)
    rec.ready(60.0, a, 180.0)
    rec.sample(60.0)
    rec.crash(80.0, a, "rank 0 died")
    rec.sample(80.0)
    rec.start(100.0, a, 4, action="keep")  # the runner relaunches a crashed job the decision kept
    rec.sample(100.0)
    rec.ready(110.0, a, 180.0)
    rec.sample(110.0)
    rec.preempt(150.0, a)
    rec.sample(150.0)
    rec.start(200.0, a, 4, action="start")
    rec.sample(200.0)
    rec.ready(205.0, a, 180.0)
    rec.sample(205.0)
    rec.finish(300.0, a)
    rec.sample(300.0)
    return rec.close(320.0)


def test_counting_rules_on_a_script():
    r = scripted_record()
    a, b = r.jobs
    # three starts (first, crash-relaunch, resume), two of them restarts; a restart is a reconfiguration,
    # and so is the reshape
    assert (a.starts, a.restarts, a.reconfigs, a.crashes, a.preemptions) == (3, 2, 3, 1, 1)
    assert (a.first_start, a.finish, a.status) == (10.0, 300.0, "done")
    assert a.waited_s == 10 + (100 - 80) + (200 - 150)
    assert a.gpu_seconds == 2 * 40 + 4 * 30 + 4 * 50 + 4 * 100
    assert a.productive_gpu_seconds == 2 * 30 + 4 * 20 + 4 * 40 + 4 * 95
    assert a.restart_seconds == 10 + 10 + 10 + 5  # wall seconds held before ready
    assert (b.status, b.starts, b.first_start, b.waited_until(320.0)) == ("waiting", 0, None, 290.0)
    kinds = [(e.job, e.kind) for e in r.events]
    assert kinds.count(("A", "start")) == 3 and kinds.count(("A", "crash")) == 1 and kinds[-1] == ("A", "finish")
    assert [e.details["restart"] for e in r.events if e.kind == "start"] == [False, True, True]

    m = compute(r)
    assert m["finished"] == 1 and m["unfinished"] == 1
    assert m["avg_jct_s"] == 300.0 and m["avg_queue_s"] == 10.0
    assert m["reconfigs_per_job"] == 3 and m["preemptions_per_job"] == 1 and m["crashes_per_job"] == 1
    # GPU time is conserved: the cluster timeline integrates to the jobs' GPU-seconds
    tl = Timeline(r.timeline)
    assert tl.integral("alloc_gpus", 0, 320) == a.gpu_seconds
    assert tl.integral("productive_gpus", 0, 320) == a.productive_gpu_seconds
    assert m["gpu_util"] == pytest.approx(a.productive_gpu_seconds / (4 * 320))
    assert tl.integral("waiting", 0, 320) == a.waited_s + 290.0
    # samples done: 100 samples/s for 30 s, then 180 for 20 + 40 + 95 s
    assert tl.integral("throughput", 0, 320) == pytest.approx(100 * 30 + 180 * (20 + 40 + 95))


def test_transitions_the_rules_do_not_allow_are_errors():
    rec = Recorder(RunRecord(policy="x", interval_s=1.0, total_gpus=1))
    j = rec.add_job(JobRecord(id="J", model=MODEL, batch_size=1, iterations=1, submit=0.0))
    with pytest.raises(RecordError, match="start while not_arrived"):
        rec.start(0.0, j, 1)
    rec.submit(0.0, j)
    rec.start(1.0, j, 1)
    with pytest.raises(RecordError, match="start while running"):
        rec.start(2.0, j, 1)
    with pytest.raises(RecordError, match="counted transition"):
        rec.note(2.0, "J", "crash")


def test_json_round_trip_and_events_file(tmp_path):
    r = scripted_record(tmp_path)
    write_model(r, tmp_path / "record.json")
    back = load_model(tmp_path / "record.json", RunRecord)
    assert back.model_dump() == r.model_dump()
    assert compute(back) == compute(r)
    lines = [json.loads(x) for x in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert lines == r.event_dicts() and len(lines) == len(r.events)


# ---- the same run through the simulator and through the live loop ------------------------------------

@pytest.fixture(scope="module")
def truth():
    table = PerfTable({(MODEL, BATCH, "a100-40gb", 1, n): t for n, t in TIMES.items()}, source="test")
    return PerfEstimator(table=table, table_mode="strict")


class Scripted(GridPolicy):
    """A on 2 GPUs, reshaped to 4 at t=300, preempted at 600 for B (4 GPUs), resumed on 4 at 900."""

    name = "scripted"

    def choose(self, snapshot):
        t = snapshot.time
        want = {"A": 2 if t < 300 else 4 if t < 600 or t >= 900 else None, "B": 4 if t >= 600 else None}
        chosen = {}
        for j in snapshot.jobs:
            if want[j.id] is None:
                continue
            grids = [g for g in job_grids(j, snapshot, self.estimator) if g.num_gpus == want[j.id]]
            chosen[j.id] = max(grids, key=lambda g: (g.current, g.throughput))
        return chosen, {}, SolverStats()


class Recording(Scripted):
    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.made: dict[float, Decision] = {}

    def decide(self, snapshot):
        self.made[snapshot.time] = d = super().decide(snapshot)
        return d


class Replay(Policy):
    """The simulator's decisions, round by round."""

    name = "scripted"

    def __init__(self, made, estimator):
        super().__init__(estimator=estimator)
        self.made = made

    def decide(self, snapshot):
        return self.made.get(snapshot.time, Decision(time=snapshot.time, policy=self.name, jobs=[]))


class TruthRunner(Runner):
    """Trains jobs by the simulator's truth on the test's clock (`now`): a launch makes no progress for
    the reconfiguration delay, then runs at the table's speed; `crash_at` kills a job's launch then."""

    def __init__(self, crash_at: dict[str, float] | None = None):
        self.now = 0.0
        self.crash_at = dict(crash_at or {})
        self.jobs: dict[str, dict] = {}

    def add_job(self, job):
        self.jobs[job.job_id] = {"spec": job, "state": "pending", "done": 0.0, "gen": -1, "alloc": None,
                                 "n": 0, "rate": 0.0, "ready": 0.0, "synced": 0.0, "end": None}

    def apply(self, decision):
        for jd in decision.jobs:
            j = self.jobs[jd.job_id]
            if j["state"] in ("finished", "failed"):
                continue
            if jd.runs:
                alloc = (jd.gpu_type, jd.placement, jd.plan)
                if j["state"] == "running" and alloc == j["alloc"]:
                    continue
                self._sync(j, self.now)
                n = jd.num_gpus
                j.update(state="running", alloc=alloc, n=n, rate=1.0 / TIMES[n], gen=j["gen"] + 1, synced=self.now,
                         ready=self.now + RECONFIG.delay_s(None, n, resumed=j["gen"] >= 0))
                j["end"] = j["ready"] + (j["spec"].total_steps - j["done"]) / j["rate"]
            elif j["state"] == "running":
                self._sync(j, self.now)
                j["state"] = "stopped"

    def _sync(self, j, t):
        if j["state"] == "running":
            start = max(j["synced"], j["ready"])
            if t > start:
                j["done"] += j["rate"] * (t - start)
            j["synced"] = t

    def status(self):
        out = []
        for jid, j in self.jobs.items():
            if j["state"] == "running" and self.crash_at.get(jid, float("inf")) <= self.now:
                self._sync(j, self.crash_at.pop(jid))
                j["state"] = "crashed"
            if j["state"] == "running" and self.now >= j["end"]:
                j["state"], j["done"] = "finished", float(j["spec"].total_steps)
            run = j["state"] == "running"
            gpu_type, placement, plan = j["alloc"] or (None, {}, None)
            out.append(ObservedJob(
                job_id=jid, state=j["state"], step=int(j["done"]), total_steps=j["spec"].total_steps,
                samples_per_s=j["rate"] * j["spec"].global_batch if run and self.now >= j["ready"] else None,
                gpu_type=gpu_type, num_gpus=j["n"], placement=placement, plan=plan, generation=max(0, j["gen"])))
        return out

    def stop(self, job_id, save=True):
        self.jobs[job_id]["state"] = "stopped"

    def events(self, job_id):
        j = self.jobs[job_id]
        return [{"event": "exit", "reason": "finished", "time": j["end"]}] if j["state"] == "finished" else []

    def upcoming(self):
        """Times at which something will happen: launches getting ready, finishes, crashes."""
        ts = list(self.crash_at.values())
        for j in self.jobs.values():
            if j["state"] == "running":
                ts += [x for x in (j["ready"], j["end"]) if x > self.now]
        return ts


def run_sim(truth, trace):
    policy = Recording(estimator=truth)
    res = Simulator(load_cluster("a100:1x4"), trace, policy, truth=truth,
                    options=SimOptions(interval_s=300, reconfig=RECONFIG, replan="every-tick")).run()
    return res, policy.made


def run_live(truth, trace, made, tmp_path, crash_at=None):
    runner = TruthRunner(crash_at)
    opts = LiveOptions(interval_s=300, time_scale=1, iter_scale=1, batch_divisor=1, scale=None)
    loop = LiveLoop(load_cluster("a100:1x4"), trace, runner, Replay(made, truth), opts, tmp_path, log=lambda s: None)
    loop.t0 = 0.0
    next_round = 0.0
    submits = [tj.submit_time for tj in trace]
    while True:
        t = min([next_round, *runner.upcoming(), *(s for s in submits if s > runner.now)])
        runner.now = t
        if t == next_round:  # a round observes, then decides: no sample after it
            loop._round(t)
            next_round += opts.interval_s
            continue
        obs = loop._observe(t)
        if loop._done(obs):
            return loop._finish(t), loop


# what only one side knows: the truth's contention-free bound and its requested-grid speed (the
# simulator's normalisation) against the estimate of the last allocation (the live loop's)
NOT_COMPARED = {"avg_jct_bound_s", "avg_job_norm_throughput", "ftf_mean", "ftf_p95", "ftf_max", "policy",
                "decision_s_mean", "decision_s_p99", "decision_s_max", "decision_s_total", "decision_cpu_s_total",
                "sim_wall_s", "sim_cpu_s", "time_scale", "measured"}


def assert_same(sim: dict, live: dict, differ=()):
    for k, v in sim.items():
        if k in NOT_COMPARED or k in differ:
            continue
        assert live[k] == (pytest.approx(v, rel=1e-9, abs=1e-9) if isinstance(v, float) else v), k


@pytest.mark.parametrize("crash", [False, True])
def test_simulator_and_live_loop_write_the_same_record(truth, tmp_path, crash):
    trace = [TraceJob(id="A", submit_time=0, model=MODEL, batch_size=BATCH, iterations=1000, num_gpus=2,
                      gpu_type="a100"),
             TraceJob(id="B", submit_time=100, model=MODEL, batch_size=BATCH, iterations=150, num_gpus=4,
                      gpu_type="a100")]
    res, made = run_sim(truth, trace)
    sim = {j.id: j for j in res.jobs}
    a = sim["A"]
    assert (a.starts, a.restarts, a.reconfigs, a.preemptions) == (2, 1, 2, 1)  # reshape + resume
    # A crashes at the round that would have preempted it: the live loop relaunches it at 900 as the
    # simulator resumes it, so everything agrees but what the pause is called
    live, loop = run_live(truth, trace, made, tmp_path, crash_at={"A": 600.0} if crash else None)
    ms, ml = compute(res), live.metrics
    if crash:
        assert (ms["preemptions_per_job"], ms["crashes_per_job"]) == (0.5, 0.0)
        assert (ml["preemptions_per_job"], ml["crashes_per_job"]) == (0.0, 0.5)
    assert_same(ms, ml, differ={"preemptions_per_job", "crashes_per_job"} if crash else ())
    lj = {j["id"]: j for j in live.jobs}
    for jid, s in sim.items():
        for k in ("status", "first_start", "finish", "starts", "restarts", "reconfigs", "gpu_seconds",
                  "productive_gpu_seconds", "restart_seconds", "waited_s", "remaining"):
            v = getattr(s, k)
            assert lj[jid][k] == (pytest.approx(v, rel=1e-9) if isinstance(v, float) else v), (jid, k)
    assert lj["A"]["preemptions"] + lj["A"]["crashes"] == 1 and lj["A"]["crashes"] == int(crash)
    # the live record is on disk and reads back to the same metrics; its events were streamed
    back = load_model(tmp_path / "record.json", RunRecord)
    assert compute(back)["avg_jct_s"] == ml["avg_jct_s"]
    kinds = [json.loads(x)["kind"] for x in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert kinds.count("start") == 3 and kinds.count("crash") == int(crash) and kinds.count("finish") == 2
