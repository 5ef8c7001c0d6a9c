"""Per-stage (dp, tp) plans (issue 16.4): the Plan model, the shaped stage-split DP against brute
force, the planner's bounded search, and the checks of snapshots, decisions and placement."""

import itertools
import json

import numpy as np
import pytest
from pydantic import ValidationError

from arena_opt.decision import Decision, JobDecision
from arena_opt.feasibility import InfeasibleDecision, check_decision
from arena_opt.gpus import BUILTIN_GPUS
from arena_opt.perf import stage_shapes
from arena_opt.perf.band import BandModel, ResidualRow, default_band
from arena_opt.perf.compose import evaluate_split, split_stages, split_stages_shaped
from arena_opt.perf.planner import Planner
from arena_opt.plan import Plan
from arena_opt.snapshot import ClusterSnapshot
from models import get_arch
from tests.test_planner import random_costs

SHAPED = Plan(pp=2, num_microbatches=2, stage_shapes=[(2, 1), (1, 2)])


def test_uniform_plan_serialises_as_before():
    p = Plan(pp=2, dp=2, num_microbatches=4, stages=[(0, 3), (3, 5)])
    assert json.loads(p.model_dump_json()) == {"pp": 2, "dp": 2, "tp": 1, "num_microbatches": 4,
                                               "stages": [[0, 3], [3, 5]], "recompute": False}
    assert "stage_shapes" not in p.model_dump()
    # equal shapes are the uniform plan, stored as one
    same = Plan(pp=2, num_microbatches=4, stages=[(0, 3), (3, 5)], stage_shapes=[(2, 1), (2, 1)])
    assert same == p and same.uniform


def test_per_stage_plan_round_trips_and_counts():
    assert SHAPED.num_gpus == 4 and SHAPED.stage_gpus == [2, 2] and (SHAPED.dp, SHAPED.tp) == (2, 2)
    assert Plan.model_validate_json(SHAPED.model_dump_json()) == SHAPED
    assert Plan.model_validate(SHAPED.model_dump()) == SHAPED
    assert SHAPED.describe() == "pp2x[dp2xtp1,dp1xtp2] mb2"
    assert Plan(pp=2, stage_shapes=[(4, 1), (1, 2)]).num_gpus == 6  # stages of different GPU counts


@pytest.mark.parametrize("kw,words", [
    ({"pp": 3, "stage_shapes": [(2, 1), (1, 2)]}, "stage_shapes has 2 entries but pp = 3"),
    ({"pp": 2, "dp": 1, "stage_shapes": [(2, 1), (1, 2)]}, "widest stage's, 2, 2"),
    ({"pp": 2, "stage_shapes": [(2, 0), (1, 2)]}, "stage_shapes.0.1"),
    ({"pp": 2, "dp": 1, "stage_shapes": [(2, 1), (2, 1)]}, "widest stage's, 2, 1"),
])
def test_bad_per_stage_plans_are_refused_naming_the_field(kw, words):
    with pytest.raises(ValidationError, match=words.replace("(", r"\(").replace(")", r"\)")):
        Plan(**kw)


def test_batch_and_tp_group_rules():
    assert SHAPED.batch_error(8) is None
    assert SHAPED.batch_error(6) == ("num_microbatches", "2 does not divide the per-replica batch 3 "
                                                         "(batch_size 6 / dp 2 (stage_shapes[0]))")
    assert Plan(pp=2, stage_shapes=[(3, 1), (1, 1)]).batch_error(8)[0] == "stage_shapes[0]"
    assert SHAPED.tp_group_error([2, 2]) is None
    assert "tp group 0 of stage 1 (tp 2, ranks 2-3) spans two nodes" in SHAPED.tp_group_error([3, 1])
    assert Plan(pp=2, stage_shapes=[(1, 2), (2, 1)]).tp_group_error([1, 3]) is not None


def brute_force_shaped(options, pp, m, cap):
    n = options[0].num_layers
    best = None
    for cuts in itertools.combinations(range(1, n), pp - 1):
        b = [0, *cuts, n]
        stages = [(b[i], b[i + 1]) for i in range(pp)]
        for picks in itertools.product(range(len(options)), repeat=pp):
            res = evaluate_split([options[o] for o in picks], stages, m)
            if max(res.mem_bytes) <= cap and (best is None or res.iter_time_s < best.iter_time_s - 1e-12):
                best = res
    return best


@pytest.mark.parametrize("seed", range(12))
def test_shaped_dp_equals_brute_force(seed):
    rng = np.random.default_rng(300 + seed)
    n = int(rng.integers(3, 8))
    pp = int(rng.integers(2, min(n, 4) + 1))
    m = int(rng.choice([1, 2, 4, 8]))
    options = [random_costs(rng, n) for _ in range(int(rng.integers(2, 4)))]
    cap = float(rng.uniform(3, 20))
    got = split_stages_shaped(options, [range(len(options))] * pp, m, cap)
    bf = brute_force_shaped(options, pp, m, cap)
    if bf is None:
        assert got is None
        return
    split, picks = got
    assert split.iter_time_s == pytest.approx(bf.iter_time_s, rel=1e-12)
    again = evaluate_split([options[o] for o in picks], split.stages, m)
    assert again.iter_time_s == pytest.approx(split.iter_time_s) and max(again.mem_bytes) <= cap


def test_shaped_dp_with_one_option_is_the_uniform_dp():
    rng = np.random.default_rng(7)
    lc = random_costs(rng, 7)
    split, picks = split_stages_shaped([lc], [[0]] * 3, 4, 15.0)
    ref = split_stages(lc, 3, 4, 15.0)
    assert picks == [0, 0, 0] and split.stages == ref.stages
    assert split.iter_time_s == pytest.approx(ref.iter_time_s, rel=1e-12)


# grids of instances/large.json where the planner's default (calibrated) model prices a per-stage plan more
# than 5% faster (bench/results/stage_shapes.md lists them)
WINNING_GRIDS = [("wide_resnet-500M", 256, "a10", 8, 2, 2), ("wide_resnet-4B", 512, "a10", 4, 2, 4)]


@pytest.mark.parametrize("model,batch,gpu,nodes,gpn,pp", WINNING_GRIDS)
def test_planner_takes_per_stage_plans_only_past_the_margin(model, batch, gpu, nodes, gpn, pp):
    arch, spec = get_arch(model), BUILTIN_GPUS[gpu]
    uni = Planner(per_stage=False).plan(arch, batch, gpu, spec, None, nodes, gpn, pp)
    per = Planner(per_stage=True, stage_band=None).plan(arch, batch, gpu, spec, None, nodes, gpn, pp)
    assert uni.proxy.plan.uniform and not per.proxy.plan.uniform
    assert per.proxy.iter_time_s < uni.proxy.iter_time_s * (1 - stage_shapes.PER_STAGE_MARGIN)
    plan = per.proxy.plan
    assert plan.num_gpus == nodes * gpn and plan.batch_error(batch) is None
    assert len(set(plan.stage_gpus)) == 1  # the grid's shape is kept: every stage the same GPU count
    # the planner's figure is the composition of the stages' own costs
    assert per.proxy.mem_gib <= spec.memory_gib


def test_planner_without_a_win_past_the_margin_keeps_the_uniform_plan(monkeypatch):
    model, batch, gpu, nodes, gpn, pp = WINNING_GRIDS[0]
    arch, spec = get_arch(model), BUILTIN_GPUS[gpu]
    uni = Planner(per_stage=False).plan(arch, batch, gpu, spec, None, nodes, gpn, pp)
    monkeypatch.setattr(stage_shapes, "PER_STAGE_MARGIN", 0.5)
    per = Planner(per_stage=True, stage_band=None).plan(arch, batch, gpu, spec, None, nodes, gpn, pp)
    assert per.proxy == uni.proxy


def _band(half_width: float, family: str) -> BandModel:
    """A band model whose reference residuals spread evenly over +-half_width (log units), on two types."""
    rows = [ResidualRow(kind="reference", family=family, gpu_type=t, num_gpus=n, microbatches=m,
                        log_ratio=half_width * (2 * i / 19 - 1))
            for t in ("a", "b") for n in (1, 2, 4, 8, 16) for m in (1, 2, 4, 8, 16, 32, 64) for i in range(20)]
    return BandModel.build(rows, level=0.8)


@pytest.mark.parametrize("model,batch,gpu,nodes,gpn,pp", WINNING_GRIDS)
def test_per_stage_plans_win_only_past_the_error_band(model, batch, gpu, nodes, gpn, pp):
    """The margin is the band's: a per-stage plan whose estimate at the band's upper edge still beats the
    uniform plan replaces it; a band wider than the win keeps the uniform plan."""
    arch, spec = get_arch(model), BUILTIN_GPUS[gpu]
    uni = Planner(per_stage=False).plan(arch, batch, gpu, spec, None, nodes, gpn, pp)
    free = Planner(per_stage=True, stage_band=None).plan(arch, batch, gpu, spec, None, nodes, gpn, pp)
    win = 1 - free.proxy.iter_time_s / uni.proxy.iter_time_s
    m = uni.proxy.plan.num_microbatches
    narrow, wide = _band(0.2 * win, arch.family), _band(3 * win, arch.family)
    need_narrow = stage_shapes.margin(narrow, arch.family, nodes * gpn, m)
    need_wide = stage_shapes.margin(wide, arch.family, nodes * gpn, m)
    assert need_narrow == pytest.approx(1 - 1 / narrow.band(1.0, arch.family, nodes * gpn, m).hi_s)
    assert 0 < need_narrow < win < need_wide
    taken = Planner(per_stage=True, stage_band=narrow).plan(arch, batch, gpu, spec, None, nodes, gpn, pp)
    assert not taken.proxy.plan.uniform
    assert taken.proxy.iter_time_s * narrow.band(1.0, arch.family, nodes * gpn, m).hi_s < uni.proxy.iter_time_s
    kept = Planner(per_stage=True, stage_band=wide).plan(arch, batch, gpu, spec, None, nodes, gpn, pp)
    assert kept.proxy == uni.proxy
    # the committed band model is the default, and its margin holds for whatever the planner keeps
    shipped = Planner(per_stage=True)
    assert shipped.stage_band is not None and shipped.stage_band == default_band()
    got = shipped.plan(arch, batch, gpu, spec, None, nodes, gpn, pp).proxy
    need = stage_shapes.margin(shipped.stage_band, arch.family, nodes * gpn, m)
    assert got == uni.proxy or got.iter_time_s < uni.proxy.iter_time_s * (1 - need)
    # a band model is part of the plan cache's key: plans made at one margin are not reused at another
    assert Planner(per_stage=True, stage_band=narrow)._params_key() != Planner(
        per_stage=True, stage_band=wide)._params_key()


def test_per_stage_flag_keys_the_plan_cache(tmp_path, monkeypatch):
    model, batch, gpu, nodes, gpn, pp = WINNING_GRIDS[0]
    arch, spec = get_arch(model), BUILTIN_GPUS[gpu]
    a = Planner(per_stage=True, stage_band=None)
    a.plan(arch, batch, gpu, spec, None, nodes, gpn, pp)
    a.save_cache(tmp_path / "c.json")
    b = Planner(per_stage=True, stage_band=None)
    b.load_cache(tmp_path / "c.json")
    assert b._disk and not b.plan(arch, batch, gpu, spec, None, nodes, gpn, pp).proxy.plan.uniform
    c = Planner(per_stage=False)
    c.load_cache(tmp_path / "c.json")
    assert not c._disk  # a uniform-only planner never reads per-stage plans
    monkeypatch.setenv(stage_shapes.ENV_FLAG, "1")
    assert Planner().per_stage


def _snapshot(running: tuple[Plan, dict[str, list[int]]] | None = None, batch: int = 8,
              sizes: tuple[int, ...] = (2, 2)) -> ClusterSnapshot:
    job = {"id": "j", "model": "gpt-350M", "batch_size": batch, "total_iterations": 10,
           "remaining_iterations": 10}
    if running is not None:
        plan, placement = running
        job["running"] = {"gpu_type": "a100-40gb", "placement": placement, "plan": plan.model_dump()}
    return ClusterSnapshot.model_validate({
        "time": 1.0, "nodes": [{"id": f"n{i}", "gpu_type": "a100-40gb", "num_gpus": k} for i, k in enumerate(sizes)],
        "jobs": [job]})


WHOLE = {"n0": [0, 1], "n1": [0, 1]}
# stage 0 one GPU, stage 1 a tp-2 pair: on nodes of 2 + 1 GPUs the pair straddles them
STRADDLE = Plan(pp=2, num_microbatches=2, stage_shapes=[(1, 1), (1, 2)])


def test_snapshot_checks_running_per_stage_plans():
    _snapshot((SHAPED, WHOLE))
    with pytest.raises(ValidationError, match=r"plan.num_microbatches: 2 does not divide the per-replica batch 3"):
        _snapshot((SHAPED, WHOLE), batch=6)
    with pytest.raises(ValidationError, match=r"plan.stage_shapes: tp group 0 of stage 1 \(tp 2, ranks 1-2\) spans"):
        _snapshot((STRADDLE, {"n0": [0, 1], "n1": [0]}), sizes=(2, 1))
    with pytest.raises(ValidationError, match=r"the sum of stage dp\*tp = 4 but the placement holds 3 GPUs"):
        _snapshot((SHAPED, {"n0": [0, 1], "n1": [0]}), sizes=(2, 1))


def _decision(plan: Plan, placement: dict[str, list[int]]) -> Decision:
    return Decision(policy="test", jobs=[JobDecision(job_id="j", action="start", gpu_type="a100-40gb",
                                                     num_gpus=plan.num_gpus, placement=placement, plan=plan)])


def test_feasibility_checks_per_stage_plans():
    check_decision(_snapshot(), _decision(SHAPED, WHOLE))
    with pytest.raises(InfeasibleDecision, match="tp group 0 of stage 1 .* spans two nodes"):
        check_decision(_snapshot(sizes=(2, 1)), _decision(STRADDLE, {"n0": [0, 1], "n1": [0]}))
    # the same GPUs in the other node order keep the pair on one node
    check_decision(_snapshot(sizes=(2, 1)), _decision(STRADDLE, {"n1": [0], "n0": [0, 1]}))
    with pytest.raises(InfeasibleDecision, match="plan.num_microbatches: 8 does not divide"):
        check_decision(_snapshot(), _decision(SHAPED.model_copy(update={"num_microbatches": 8}), WHOLE))


def test_decisions_carry_per_stage_plans_through_json():
    d = _decision(SHAPED, WHOLE)
    back = Decision.model_validate_json(d.model_dump_json())
    assert back == d and back.jobs[0].plan.shapes == [(2, 1), (1, 2)]
    # the same decision with a GPU count that is not the plan's is infeasible (the sum over stages)
    wrong = d.model_copy(update={"jobs": [d.jobs[0].model_copy(update={"num_gpus": 3})]})
    with pytest.raises(InfeasibleDecision, match="decision says 3, plan needs 4"):
        check_decision(_snapshot(), wrong)


def test_placement_refuses_a_per_stage_plan_whose_tp_group_straddles_nodes():
    from arena_opt.grids import Grid
    from arena_opt.perf.estimator import GridShape
    from arena_opt.perf.planner import PlanResult
    from arena_opt.placement import PlacementError, place

    snap = _snapshot()
    pool = ("a100-40gb", 2, None)
    ok = Plan(pp=2, num_microbatches=2, stage_shapes=[(2, 1), (1, 2)])
    # 1 + 2 + 1 GPUs: the middle stage's tp pair takes GPU 1 of one node and GPU 0 of the next
    bad = Plan(pp=3, num_microbatches=4, stage_shapes=[(1, 1), (1, 2), (1, 1)])
    shape = GridShape("a100-40gb", 2, 2, 2)
    got = place(snap, {"j": Grid("j", pool, shape, PlanResult(ok, 1.0, 1.0, 8))})
    assert sum(len(g) for g in got["j"].values()) == 4
    with pytest.raises(PlacementError, match="tp group 0 of stage 1 .* spans two nodes"):
        place(snap, {"j": Grid("j", pool, GridShape("a100-40gb", 2, 2, 3), PlanResult(bad, 1.0, 1.0, 8))})
