import itertools
import json

import numpy as np
import pytest

from arena_opt.gpus import BUILTIN_GPUS
from arena_opt.milp.stage_split import solve_split
from arena_opt.perf.analytical import GIB, cost_table, layer_costs, layer_terms, links_for
from arena_opt.perf.compose import LayerCosts, evaluate_split, split_many, split_stages, stack
from arena_opt.perf.planner import Planner, microbatch_counts, tp_degrees
from models import get_arch


def random_costs(rng, n):
    return LayerCosts(step_s=rng.uniform(0.1, 1.0, n), p2p_s=rng.uniform(0.0, 0.2, n),
                      allreduce_s=rng.uniform(0.0, 0.3, n), optim_s=rng.uniform(0, 0.05, n),
                      static_bytes=rng.uniform(1, 4, n), act_bytes=rng.uniform(0.1, 1, n),
                      peak_bytes=rng.uniform(0, 2, n) * (rng.random(n) < 0.3))


def brute_force(lc, pp, m, cap):
    n = lc.num_layers
    best = None
    for cuts in itertools.combinations(range(1, n), pp - 1):
        b = [0, *cuts, n]
        res = evaluate_split(lc, [(b[i], b[i + 1]) for i in range(pp)], m)
        if max(res.mem_bytes) <= cap and (best is None or res.iter_time_s < best.iter_time_s - 1e-12):
            best = res
    return best


@pytest.mark.parametrize("seed", range(12))
def test_stage_dp_equals_brute_force(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(3, 9))
    pp = int(rng.integers(1, min(n, 4) + 1))
    m = int(rng.choice([1, 2, 4, 8]))
    lc = random_costs(rng, n)
    cap = float(rng.uniform(3, 20))
    dp = split_stages(lc, pp, m, cap)
    bf = brute_force(lc, pp, m, cap)
    if bf is None:
        assert dp is None
    else:
        assert dp is not None
        assert dp.iter_time_s == pytest.approx(bf.iter_time_s, rel=1e-12)
        assert max(dp.mem_bytes) <= cap


@pytest.mark.parametrize("seed", range(4))
def test_stage_dp_equals_pyomo_milp(seed):
    rng = np.random.default_rng(100 + seed)
    n, pp, m = 7, 3, 4
    lc = random_costs(rng, n)
    cap = 12.0
    dp = split_stages(lc, pp, m, cap)
    stages, obj = solve_split(lc, pp, m, cap)
    if dp is None:
        assert stages is None
        return
    assert obj == pytest.approx(dp.iter_time_s, rel=1e-6)
    assert evaluate_split(lc, stages, m).iter_time_s == pytest.approx(dp.iter_time_s, rel=1e-6)


@pytest.mark.parametrize("model,batch,gpu,nodes,gpn", [
    ("bert-2.6B", 256, "a40", 2, 2), ("moe-10B", 256, "a100-40gb", 2, 4), ("wide_resnet-2B", 512, "a10", 4, 2),
    ("llama-13B", 512, "h100-80gb", 1, 8), ("gpt-760M", 128, "v100-32gb", 1, 1)])
def test_planner_plans_fit_and_use_the_grid(model, batch, gpu, nodes, gpn):
    planner = Planner()
    spec = BUILTIN_GPUS[gpu]
    any_plan = False
    for pp in (1, 2, 4, 8):
        if pp > nodes * gpn:
            break
        res = planner.plan(get_arch(model), batch, gpu, spec, None, nodes, gpn, pp)
        if res.proxy is None:
            continue
        any_plan = True
        assert res.proxy is res.pareto[0]
        for r in res.pareto:
            p = r.plan
            assert p.pp == pp and p.num_gpus == nodes * gpn
            assert gpn % p.tp == 0
            assert r.mem_gib <= spec.memory_gib
            assert batch % (p.dp * p.num_microbatches) == 0
            assert p.stages[0][0] == 0 and len(p.stages) == pp
        times = [r.iter_time_s for r in res.pareto]
        mems = [r.mem_gib for r in res.pareto]
        assert times == sorted(times) and mems == sorted(mems, reverse=True)
    assert any_plan


def test_too_big_model_has_no_plan():
    planner = Planner()
    res = planner.plan(get_arch("llama-70B"), 1024, "a10", BUILTIN_GPUS["a10"], None, 1, 1, 1)
    assert res.proxy is None and res.pareto == []


def test_plan_cache_round_trip(tmp_path):
    spec = BUILTIN_GPUS["a40"]
    a = Planner()
    fresh = a.plan(get_arch("bert-1.3B"), 128, "a40", spec, None, 1, 2, 2)
    a.save_cache(tmp_path / "plans.json")
    b = Planner()
    b.load_cache(tmp_path / "plans.json")
    again = b.plan(get_arch("bert-1.3B"), 128, "a40", spec, None, 1, 2, 2)
    assert again == fresh
    # other cost parameters never reuse the cached plans
    from arena_opt.perf.analytical import CostParams

    c = Planner(CostParams(default_compute_eff=0.1))
    c.load_cache(tmp_path / "plans.json")
    assert c._disk == {}



def test_plan_cache_round_trip_of_plans_shared_across_grids(tmp_path):
    """One plan_many pass shares a Plan object between grids (and save_cache dumps each object once): every
    grid's Pareto set comes back equal, and the file holds each entry's own plan."""
    arch = get_arch("bert-1.3B")
    # the same shapes on two GPU types: the same plans often win on both
    keys = [(arch, 128, name, BUILTIN_GPUS[name], "nvlink", nodes, gpn, pp) for name in ("a100-80gb", "a40")
            for nodes, gpn in ((1, 4), (2, 4), (1, 2)) for pp in (1, 2)]
    a = Planner()
    fresh = a.plan_many(keys)
    plans = [r.plan for gp in fresh for r in gp.pareto]
    assert len({id(p) for p in plans}) < len(plans)  # some Plan object is shared: the memo is exercised
    a.save_cache(tmp_path / "plans.json")
    b = Planner()
    b.load_cache(tmp_path / "plans.json")
    assert b.plan_many(keys) == fresh
    stored = json.loads((tmp_path / "plans.json").read_text())["plans"]
    for key, gp in zip(keys, fresh):
        as_json = [json.loads(json.dumps(r.plan.model_dump())) for r in gp.pareto]
        assert [e[0] for e in stored[a._disk_key(key)]] == as_json

# --- the stacked stage-split DP (compose.split_many) and stacked cost terms against references: brute
# force, the plain full-matrix DP (its tie-break), scalar layer_terms, the former one-candidate planner loop
FIELDS = ("step_s", "p2p_s", "allreduce_s", "optim_s", "static_bytes", "act_bytes", "peak_bytes")


def random_stack(rng, c, n, integers=False):
    def draw(lo, hi):
        x = rng.uniform(lo, hi, (c, n))
        return np.round(x * 4) if integers else x  # small integers: many exactly equal splits

    peak = draw(0, 2) * (rng.random((c, n)) < 0.3)
    return LayerCosts(draw(0.1, 1.0), draw(0, 0.2), draw(0, 0.3), draw(0, 0.05), draw(1, 4), draw(0.1, 1),
                      peak, stage_s=rng.uniform(0, 0.1, c))


def row(lc, i):
    return LayerCosts(*(getattr(lc, f)[i] for f in FIELDS), stage_s=float(lc.stage_s[i]))


def full_dp(lc, pp, m, cap):
    """The min-max DP over every (j, i) with the first minimising j, one candidate, plain loops."""
    n = lc.num_layers
    inf = float("inf")

    def cost_mem(k, j, i):
        t = sum(lc.step_s[j:i]) + (lc.p2p_s[i - 1] if k < pp - 1 else 0.0)
        cost = (m + pp - 1) * t + sum(lc.allreduce_s[j:i]) + sum(lc.optim_s[j:i]) + lc.stage_s
        mem = sum(lc.static_bytes[j:i]) + min(m, pp - k) * sum(lc.act_bytes[j:i]) + max(0.0, max(lc.peak_bytes[j:i]))
        return cost, mem

    f = [inf] * (n + 1)
    for i in range(1, n + 1):
        cost, mem = cost_mem(0, 0, i)
        f[i] = cost if mem <= cap else inf
    choice = {}
    for k in range(1, pp):
        g, arg = [inf] * (n + 1), [0] * (n + 1)
        for i in range(1, n + 1):
            for j in range(i):
                cost, mem = cost_mem(k, j, i)
                v = max(f[j], cost if mem <= cap else inf)
                if v < g[i]:
                    g[i], arg[i] = v, j
        f, choice[k] = g, arg
    if f[n] == inf:
        return None
    b = [n]
    for k in range(pp - 1, 0, -1):
        b.append(choice[k][b[-1]])
    b.append(0)
    return f[n], b[::-1]


@pytest.mark.parametrize("seed", range(20))
def test_split_many_equals_brute_force(seed):
    rng = np.random.default_rng(seed)
    c, n = int(rng.integers(1, 6)), int(rng.integers(2, 9))
    pp = int(rng.integers(1, min(n, 5) + 1))
    m = rng.choice([1, 2, 4, 8], c)  # one micro-batch count per candidate
    lc = random_stack(rng, c, n)
    cap = float(rng.uniform(3, 25))  # some candidates fit, some do not
    res = split_many(lc, pp, m, cap)
    for i in range(c):
        bf = brute_force(row(lc, i), pp, int(m[i]), cap)
        assert bool(res.feasible[i]) == (bf is not None)
        if bf is None:
            continue
        got = res.split(i)
        assert got.iter_time_s == pytest.approx(bf.iter_time_s, rel=1e-12)
        again = evaluate_split(row(lc, i), got.stages, int(m[i]))
        assert again.iter_time_s == pytest.approx(got.iter_time_s, rel=1e-12)
        assert got.mem_bytes == pytest.approx(again.mem_bytes, rel=1e-12)
        assert max(got.mem_bytes) <= cap


@pytest.mark.parametrize("seed", range(20))
def test_split_many_keeps_the_full_dp_tie_break(seed):
    rng = np.random.default_rng(1000 + seed)
    c, n = 4, int(rng.integers(3, 10))
    pp = int(rng.integers(2, min(n, 5) + 1))
    m = rng.choice([pp, 2 * pp], c)
    lc = random_stack(rng, c, n, integers=True)
    cap = float(rng.uniform(10, 40))
    res = split_many(lc, pp, m, cap)
    for i in range(c):
        ref = full_dp(row(lc, i), pp, int(m[i]), cap)
        assert bool(res.feasible[i]) == (ref is not None)
        if ref is not None:
            assert res.iter_time_s[i] == ref[0]
            assert list(res.bounds[i]) == ref[1]
        one = split_stages(row(lc, i), pp, int(m[i]), cap)
        assert (one is None) == (ref is None)
        if one is not None:
            assert [a for a, _ in one.stages] + [n] == ref[1]


def test_stack_of_rows_is_the_stack():
    rng = np.random.default_rng(7)
    lc = random_stack(rng, 3, 6)
    again = stack([row(lc, i) for i in range(3)])
    for f in FIELDS + ("stage_s",):
        assert np.array_equal(getattr(again, f), getattr(lc, f))


@pytest.mark.parametrize("model,gpu,nodes,gpn", [("bert-2.6B", "a40", 2, 2), ("moe-10B", "a100-40gb", 2, 4),
                                                 ("wide_resnet-2B", "a10", 4, 2), ("gpt-760M", "v100-32gb", 1, 8)])
def test_stacked_layer_terms_equal_single_ones(model, gpu, nodes, gpn):
    arch, spec = get_arch(model), BUILTIN_GPUS[gpu]
    planner = Planner()
    table = cost_table(arch, planner.params)
    links = links_for(spec, None, planner.params)
    cands = [(dp, tp, m, rc) for tp in (1, 2) for dp in (1, 2, 4) for m in (1, 4) for rc in (False, True)]
    dp, tp, m, rc = (np.array(x) for x in zip(*cands))
    kw = dict(nodes=nodes, gpus_per_node=gpn, batch=256)
    many = layer_terms(table, spec, links, dp=dp, tp=tp, m=m, recompute=rc, **kw)
    many_costs = layer_costs(table, spec, gpu, links, dp=dp, tp=tp, m=m, recompute=rc, params=planner.params, **kw)
    for i, (d, t, k, r) in enumerate(cands):
        one = layer_terms(table, spec, links, dp=d, tp=t, m=k, recompute=r, **kw)
        for f in ("step", "p2p", "allreduce", "optim", "static_bytes", "act_bytes", "peak_bytes"):
            assert np.array_equal(getattr(many, f)[i], getattr(one, f)), f
        one_costs = layer_costs(table, spec, gpu, links, dp=d, tp=t, m=k, recompute=r, params=planner.params, **kw)
        for f in FIELDS:
            assert np.array_equal(getattr(many_costs, f)[i], getattr(one_costs, f)), f


def one_at_a_time(planner, arch, batch, gpu_name, gpu, nodes, gpn, pp):
    """The planner's loop before the stacked DP: each candidate costed and split on its own, recomputation
    only where the plain plan does not fit, sorted by (time, memory), Pareto by memory."""
    n_gpus = nodes * gpn
    table = cost_table(arch, planner.params)
    if n_gpus % pp or pp > table.num_layers:
        return []
    links = links_for(gpu, None, planner.params)
    cap = planner.mem_cap_bytes(gpu)
    found = []
    for tp in tp_degrees(arch, gpn, n_gpus // pp):
        dp = n_gpus // (pp * tp)
        if batch % dp:
            continue
        for m in microbatch_counts(batch // dp, pp):
            for rc in (False, True):
                lc = layer_costs(table, gpu, gpu_name, links, nodes=nodes, gpus_per_node=gpn, batch=batch, dp=dp,
                                 tp=tp, m=m, recompute=rc, params=planner.params)
                res = brute_force(lc, pp, m, cap) if pp <= 3 else split_stages(lc, pp, m, cap)
                if res is None:
                    continue
                found.append((res.iter_time_s, max(res.mem_bytes) / GIB + planner.params.mem_reserve_gib,
                              (dp, tp, m, rc)))
                break
    found.sort(key=lambda r: (r[0], r[1]))
    pareto, best = [], float("inf")
    for t, mem, key in found:
        if mem < best - 1e-9:
            pareto.append((t, mem, key))
            best = mem
    return pareto


@pytest.mark.parametrize("model,batch,gpu,nodes,gpn,pp", [
    ("bert-2.6B", 256, "a40", 2, 2, 2), ("moe-10B", 256, "a100-40gb", 2, 4, 4), ("wide_resnet-2B", 512, "a10", 4, 2, 1),
    ("bert-6.7B", 128, "v100-32gb", 1, 8, 8), ("gpt-760M", 128, "a10", 3, 2, 3), ("moe-2.4B", 512, "a10", 4, 2, 2),
    ("bert-6.7B", 512, "v100-32gb", 1, 4, 4)])
def test_planner_equals_one_candidate_at_a_time(model, batch, gpu, nodes, gpn, pp):
    planner = Planner()
    arch, spec = get_arch(model), BUILTIN_GPUS[gpu]
    got = planner.plan(arch, batch, gpu, spec, None, nodes, gpn, pp).pareto
    ref = one_at_a_time(planner, arch, batch, gpu, spec, nodes, gpn, pp)
    assert ref and len(got) == len(ref)
    for r, (t, mem, (dp, tp, m, rc)) in zip(got, ref):
        assert (r.plan.dp, r.plan.tp, r.plan.num_microbatches, r.plan.recompute) == (dp, tp, m, rc)
        assert r.iter_time_s == pytest.approx(t, rel=1e-12)
        assert r.mem_gib == pytest.approx(mem, rel=1e-12)


@pytest.mark.parametrize("seed", range(6))
def test_microbatch_overhead_is_paid_per_slot_and_the_dp_stays_exact(seed):
    from dataclasses import replace

    rng = np.random.default_rng(100 + seed)
    n, pp, m = int(rng.integers(4, 9)), int(rng.integers(2, 4)), int(rng.choice([2, 4, 8]))
    lc = random_costs(rng, n)
    c = float(rng.uniform(0.05, 0.5))
    heavy = replace(lc, microbatch_s=c)
    stages = [(0, 1), (1, n)] + [] if pp == 2 else [(0, 1), (1, 2), (2, n)]
    a, b = evaluate_split(lc, stages, m), evaluate_split(heavy, stages, m)
    assert all(tb == pytest.approx(ta + c) for ta, tb in zip(a.stage_time_s, b.stage_time_s))
    assert b.iter_time_s == pytest.approx(a.iter_time_s + (m + len(stages) - 1) * c)
    dp, bf = split_stages(heavy, pp, m, 1e9), brute_force(heavy, pp, m, 1e9)
    assert dp.iter_time_s == pytest.approx(bf.iter_time_s)


# --- planning across grids (Planner.plan_many): one stack per (model, GPU, link) and per (model, pp)
def test_layer_terms_are_elementwise_in_the_grid_shape():
    """The planner costs many grids of one (model, GPU, link) in one call, with nodes, GPUs per node and
    batch as arrays: each row must equal that grid's own scalar call."""
    arch, spec = get_arch("moe-2.4B"), BUILTIN_GPUS["a100-40gb"]
    planner = Planner()
    table = cost_table(arch, planner.params)
    links = links_for(spec, None, planner.params)
    rows = [(nodes, gpn, batch, dp, tp, m, rc) for nodes, gpn in ((1, 1), (1, 4), (2, 4), (4, 4))
            for batch in (64, 256) for tp in (1, 2) for dp in (1, 2, 4) for m in (1, 4) for rc in (False, True)
            if dp * tp <= nodes * gpn]
    nodes, gpn, batch, dp, tp, m, rc = (np.array(x) for x in zip(*rows))
    many = layer_costs(table, spec, "a100-40gb", links, nodes=nodes[:, None], gpus_per_node=gpn[:, None],
                       batch=batch, dp=dp, tp=tp, m=m, recompute=rc, params=planner.params)
    for i, (n, g, b, d, t, k, r) in enumerate(rows):
        one = layer_costs(table, spec, "a100-40gb", links, nodes=n, gpus_per_node=g, batch=b, dp=d, tp=t, m=k,
                          recompute=r, params=planner.params)
        for f in FIELDS:
            assert np.array_equal(getattr(many, f)[i], getattr(one, f)), (rows[i], f)
        assert float(np.broadcast_to(many.microbatch_s, m.shape)[i]) == float(one.microbatch_s)


@pytest.mark.parametrize("model,variant", [("moe-2.4B", {}), ("moe-2.4B", {"moe_expert_parallel": True}),
                                           ("bert-2.6B", {"pipeline_crosses_nodes": True}),
                                           ("wide_resnet-2B", {"optimizer_sharded": True})])
def test_layer_costs_of_repeated_candidates_equal_costing_each(model, variant):
    """`layer_costs` costs each distinct candidate of a stack once (repeats: other pipeline depths, node
    shapes, batches giving the same micro-batch): every row must be the bits of that candidate's own call
    and of the plain stacked terms, under the rules where dp and the node shape enter the costs."""
    from arena_opt.perf.analytical import _distinct_candidates, calibrated_params, rate_vector

    params = calibrated_params().model_copy(update=variant)
    arch, spec = get_arch(model), BUILTIN_GPUS["a100-40gb"]
    table = cost_table(arch, params)
    links = links_for(spec, None, params)
    rows = [(nodes, gpn, batch, dp, tp, m, rc) for nodes, gpn in ((1, 4), (2, 4), (4, 4), (2, 2))
            for batch, m in ((64, 1), (128, 2), (128, 1), (256, 4)) for tp in (1, 2) for dp in (1, 2, 4)
            for rc in (False, True) if dp * tp <= nodes * gpn]
    nodes, gpn, batch, dp, tp, m, rc = (np.array(x) for x in zip(*rows))
    kw = dict(nodes=nodes[:, None], gpus_per_node=gpn[:, None], batch=batch, dp=dp, tp=tp, m=m, recompute=rc)
    first, _ = _distinct_candidates(links, **kw)
    assert first is not None and len(first) < len(rows) / 2  # the stack repeats candidates
    many = layer_costs(table, spec, "a100-40gb", links, params=params, **kw)
    rates = rate_vector(params, "a100-40gb", spec.peak_tflops, table.dtype, links.intra_kind, table.family)
    plain = layer_terms(table, spec, links, **kw).costs(rates)
    for f in FIELDS + ("microbatch_s",):
        assert getattr(many, f).tobytes() == getattr(plain, f).tobytes(), f
    for i, (n, g, b, d, t, k, r) in enumerate(rows):
        one = layer_costs(table, spec, "a100-40gb", links, nodes=n, gpus_per_node=g, batch=b, dp=d, tp=t, m=k,
                          recompute=r, params=params)
        for f in FIELDS:
            assert getattr(many, f)[i].tobytes() == getattr(one, f).tobytes(), (rows[i], f)
        assert float(many.microbatch_s[i]) == float(one.microbatch_s)


@pytest.mark.parametrize("seed", range(6))
def test_split_many_with_caps_per_candidate_and_in_chunks_equals_one_at_a_time(seed, monkeypatch):
    import arena_opt.perf.compose as compose

    rng = np.random.default_rng(300 + seed)
    c, n = int(rng.integers(5, 12)), int(rng.integers(3, 9))
    pp = int(rng.integers(1, min(n, 5) + 1))
    m = rng.choice([1, 2, 4, 8], c)
    lc = random_stack(rng, c, n, integers=bool(seed % 2))
    caps = rng.uniform(3, 30, c)
    monkeypatch.setattr(compose, "_FULL_CHUNK", (n + 1) ** 2 * 2)  # stacks of 3+ stages go in chunks of 2
    res = split_many(lc, pp, m, caps)
    for i in range(c):
        one = split_many(row(lc, i), pp, int(m[i]), float(caps[i]))
        assert res.feasible[i] == one.feasible[0]
        if one.feasible[0]:
            assert res.iter_time_s[i] == one.iter_time_s[0]
            assert list(res.bounds[i]) == list(one.bounds[0])
            assert np.array_equal(res.mem_bytes[i], one.mem_bytes[0])


def test_plan_many_equals_one_grid_at_a_time():
    """Grids of several models, GPUs, shapes, batches and depths planned together (duplicates and grids
    without a plan among them) get exactly the plans each gets planned alone, and those plans validate."""
    from arena_opt.plan import Plan

    grids = []
    for model, batch in (("bert-2.6B", 256), ("moe-10B", 256), ("gpt-760M", 128), ("wide_resnet-2B", 512),
                         ("llama-70B", 1024), ("bert-2.6B", 64)):
        for gpu, gpns in (("a40", (1, 2)), ("a100-40gb", (1, 4)), ("v100-32gb", (8,))):
            for gpn in gpns:
                for nodes in (1, 2):
                    for pp in (1, 2, 4, 8):
                        if pp <= nodes * gpn:
                            grids.append((get_arch(model), batch, gpu, BUILTIN_GPUS[gpu], None, nodes, gpn, pp))
    grids += grids[:5]
    together = Planner().plan_many(grids)
    planned = 0
    for g, got in zip(grids, together):
        alone = Planner().plan(*g)
        assert [(r.plan, r.iter_time_s, r.mem_gib) for r in got.pareto] == \
            [(r.plan, r.iter_time_s, r.mem_gib) for r in alone.pareto]
        assert got.proxy == alone.proxy
        for r in got.pareto:
            # the planner builds its plans unvalidated: the same instance state as the validated constructor
            valid = Plan(**r.plan.model_dump())
            assert valid == r.plan and vars(valid) == vars(r.plan)
            assert valid.model_fields_set == r.plan.model_fields_set
            assert valid.model_dump_json() == r.plan.model_dump_json()
            assert type(r.plan.stages[0]) is tuple and type(r.plan.recompute) is bool
        planned += bool(got.pareto)
    assert 20 < planned < len(grids)


@pytest.mark.parametrize("instance", ["medium", "large"])
def test_plan_many_on_a_shipped_instance_equals_one_grid_at_a_time(instance):
    """Every grid shape the arena round of a shipped instance plans (the catalogue hands them to plan_many
    together, one stack per model and depth) gets bit for bit the Pareto set of planning it alone, recompute
    flags and stage bounds included: the batched, chunked and masked DP changes no plan."""
    from pathlib import Path

    from arena_opt.grids import GridCatalog
    from arena_opt.io import load_model
    from arena_opt.perf.estimator import PerfEstimator
    from arena_opt.snapshot import ClusterSnapshot

    snap = load_model(Path(__file__).parent.parent / "instances" / f"{instance}.json", ClusterSnapshot)
    est = PerfEstimator()
    GridCatalog.of(est).all_grids(snap)
    keys = list(est.planner._cache)
    assert len(keys) > 1000
    step = 1 if instance == "medium" else 8  # every grid of medium, an eighth of large's (test time)
    feasible = 0
    for key in keys[::step]:
        got, alone = est.planner._cache[key], Planner().plan(*key)
        assert [(r.plan, r.iter_time_s, r.mem_gib) for r in got.pareto] == \
            [(r.plan, r.iter_time_s, r.mem_gib) for r in alone.pareto], key[1:]
        feasible += got.proxy is not None
    assert feasible > len(keys[::step]) // 2


@pytest.mark.parametrize("seed", range(12))
def test_split_many_memory_bound_only_drops_candidates_without_a_split(seed, monkeypatch):
    """split_many leaves out of its DP the candidates whose memory bound (1/pp of the model, or one layer,
    over the cap) no split can meet: the same result as the DP over all of them, and brute force agrees
    that those have no split."""
    import arena_opt.perf.compose as compose

    rng = np.random.default_rng(500 + seed)
    c, n = 8, int(rng.integers(3, 9))
    pp = int(rng.integers(3, min(n, 5) + 1))
    m = rng.choice([pp, 2 * pp], c)
    lc = random_stack(rng, c, n, integers=bool(seed % 2))
    if seed % 3 == 0:  # transient memory that dominates: it counts once per stage, not per layer
        lc = LayerCosts(*(getattr(lc, f) for f in FIELDS[:6]), peak_bytes=8 * lc.peak_bytes + 6, stage_s=lc.stage_s)
    caps = rng.uniform(2, 25, c)  # tight: many candidates fit nowhere
    fit = compose._fits(lc, pp, caps)
    for i in np.flatnonzero(~fit):
        assert brute_force(row(lc, i), pp, int(m[i]), float(caps[i])) is None
    got = split_many(lc, pp, m, caps)
    monkeypatch.setattr(compose, "_fits", lambda lc, pp, caps: np.ones(len(caps), dtype=bool))
    ref = split_many(lc, pp, m, caps)
    assert np.array_equal(got.feasible, ref.feasible)
    f = ref.feasible
    for field in ("bounds", "iter_time_s", "stage_time_s", "mem_bytes"):
        assert np.array_equal(getattr(got, field)[f], getattr(ref, field)[f])


def test_default_planner_prices_with_the_committed_calibration(monkeypatch):
    import json

    from arena_opt.perf import analytical
    from arena_opt.perf.analytical import CALIBRATED_PATH, CostParams, calibrated_params

    shipped = CostParams.model_validate_json(CALIBRATED_PATH.read_text())
    # what bench/estimator.py fits on all of Arena's types: one efficiency per measured type
    assert set(shipped.compute_eff) == {"a10", "a100-40gb", "a40", "v100-32gb"}
    assert shipped != CostParams()
    assert Planner().params == shipped
    arch, gpu = get_arch("bert-760M"), BUILTIN_GPUS["a100-40gb"]
    grid = (arch, 128, "a100-40gb", gpu, "nvlink", 1, 4, 1)
    assert Planner().plan(*grid).proxy.iter_time_s == Planner(shipped).plan(*grid).proxy.iter_time_s
    assert Planner().plan(*grid).proxy.iter_time_s != Planner(CostParams()).plan(*grid).proxy.iter_time_s
    # a fresh copy each call: a caller's change does not reach the next planner
    p = calibrated_params()
    p.compute_eff["a100-40gb"] = 0.01
    assert calibrated_params() == shipped
    # the bench writes the same parameters into its results and into the package
    bench_copy = CALIBRATED_PATH.parents[2] / "bench" / "results" / "calibrated_params.json"
    assert json.loads(bench_copy.read_text()) == json.loads(CALIBRATED_PATH.read_text())
    # and in the text the bench writes today: a field added to CostParams without regenerating the file fails
    # here, not in the next bench rerun (where the rewritten file made every result read before it stale)
    assert CALIBRATED_PATH.read_text() == shipped.model_dump_json(indent=1) + "\n"
    # without the file: the uncalibrated defaults
    analytical._calibrated_json.cache_clear()
    monkeypatch.setattr(analytical, "CALIBRATED_PATH", CALIBRATED_PATH.with_name("missing.json"))
    try:
        assert calibrated_params() == CostParams()
    finally:
        analytical._calibrated_json.cache_clear()
