"""One policy factory with typed options: every policy by name, validation errors that name field and
value, the options recorded in decisions and results JSON, the command-line flags reaching every policy."""

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from arena_opt.cli import main
from arena_opt.decision import Decision
from arena_opt.errors import InputError
from arena_opt.feasibility import check_decision
from arena_opt.milp.options import ArenaOptions, PolicyOptions
from arena_opt.perf.estimator import PerfEstimator
from arena_opt.policies import REGISTRY, make_policy, options_model, policy_class
from arena_opt.policies.options import GavelOptions, SiaOptions
from arena_opt.reconfig import PRESETS
from arena_opt.sim.config import RunConfig, run_config
from arena_opt.sim.results import write_result
from arena_opt.sim.run import SIM_PRESETS
from arena_opt.snapshot import ClusterSnapshot
from runners.cli import live_options

ROOT = Path(__file__).resolve().parents[1]
SMALL = ROOT / "instances" / "small.json"
SMALL_TRACE = ROOT / "instances" / "traces" / "philly-like-small.jsonl"
SMALL_CLUSTER = ROOT / "instances" / "clusters" / "small.json"
EST = PerfEstimator()


@pytest.fixture(scope="module")
def snap():
    return ClusterSnapshot.model_validate_json(SMALL.read_text())


@pytest.mark.parametrize("name", list(REGISTRY))
def test_factory_builds_every_policy_and_its_decision_records_the_options(name, snap):
    opts = {"reconfig": "arena-artifact"}
    pol = make_policy(name, opts, estimator=EST)
    assert type(pol) is policy_class(name) and pol.name == name and pol.estimator is EST
    assert type(pol.options) is options_model(name) and pol.options.reconfig == PRESETS["arena-artifact"]
    d = pol.decide(snap)
    check_decision(snap, d)
    assert d.policy == name and d.policy_options == pol.options.model_dump(mode="json")
    # round trip: the decision's JSON configures the same policy again
    back = Decision.model_validate_json(d.model_dump_json())
    assert back == d
    assert make_policy(back.policy, back.policy_options).options == pol.options


def test_factory_takes_a_model_as_is_and_defaults_when_none():
    o = GavelOptions(max_migrations=0, time_limit_s=2)
    assert make_policy("gavel", o).options is o
    assert make_policy("sia").options == SiaOptions()
    assert make_policy("arena").options == ArenaOptions()


def test_unknown_policy_names_the_known_ones():
    with pytest.raises(InputError, match="unknown policy 'magic'; known: arena, fcfs, gavel, sia, elasticflow, "
                                         "arena-greedy"):
        make_policy("magic")


@pytest.mark.parametrize("name, options, msg", [
    ("gavel", {"max_migrations": -1}, "field max_migrations: Input should be greater than or equal to 0 (value -1)"),
    ("fcfs", {"shards": 4}, "field shards: Extra inputs are not permitted (value 4)"),
    ("arena", {"mip_gap": "tight"}, "field mip_gap: Input should be a valid number"),
    ("sia", {"reconfig": "slow"}, "unknown reconfiguration preset 'slow'; known: checkpoint"),
    ("elasticflow", {"colocation": {"uplink_oversubscription": 0}}, "field colocation.uplink_oversubscription"),
])
def test_bad_option_is_an_input_error_naming_field_and_value(name, options, msg):
    with pytest.raises(InputError) as e:
        make_policy(name, options)
    assert msg in str(e.value) and f"policy {name!r} options" in str(e.value)


def test_another_policys_model_is_refused():
    with pytest.raises(InputError, match="policy 'gavel' options"):
        make_policy("gavel", SiaOptions())


def test_options_are_set_by_the_constructor_only():
    pol = make_policy("arena")
    with pytest.raises(ValidationError, match="frozen"):
        pol.options.mip_gap = 0.5
    for model in {options_model(n) for n in REGISTRY}:
        assert issubclass(model, PolicyOptions) and model.model_config["extra"] == "forbid"
        for field, info in model.model_fields.items():  # each default with its reason
            assert info.description, f"{model.__name__}.{field} has no description"


def test_options_recorded_in_results_json_round_trip(tmp_path):
    cfg = RunConfig(trace=str(SMALL_TRACE), cluster=str(SMALL_CLUSTER), policy="arena", limit_jobs=6, rounds=3,
                    reconfig="artifact", policy_options={"time_limit_s": 3.0})
    out = run_config(cfg)
    write_result(tmp_path / "arena.json", out)
    on_disk = json.loads((tmp_path / "arena.json").read_text())
    opts = ArenaOptions.model_validate(on_disk["policy_options"])
    # the simulator's preset, the run's restart model and the caller's override all reached the policy
    assert SIM_PRESETS["arena"] and all(getattr(opts, k) == v for k, v in SIM_PRESETS["arena"].items())
    assert opts.reconfig == PRESETS["arena-artifact"] and opts.time_limit_s == 3.0
    assert on_disk["config"]["policy_options"] == {"time_limit_s": 3.0}
    assert make_policy("arena", on_disk["policy_options"]).options == opts


def test_run_config_rejects_a_bad_override():
    cfg = RunConfig(trace=str(SMALL_TRACE), cluster=str(SMALL_CLUSTER), policy="fcfs", limit_jobs=2, rounds=1,
                    policy_options={"time_limit_s": 3.0})
    with pytest.raises(InputError, match="policy 'fcfs' options: field time_limit_s"):
        run_config(cfg)


def test_live_preset_reaches_the_arena_policy_only():
    arena = make_policy("arena", live_options("arena", 15.0, 20.0, True))
    assert arena.options.horizon_s == 80.0
    assert arena.options.reconfig.restart_s == 20.0 and arena.options.reconfig.storage_gbs_per_gpu == 1e3
    assert live_options("gavel", 15.0, 20.0, True) == {}


# ---- command line --------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(REGISTRY))
def test_no_colocation_reaches_every_policy(name, tmp_path, capsys):
    out = tmp_path / "d.json"
    assert main(["solve", str(SMALL), "--policy", name, "--no-colocation", "-o", str(out)]) == 0
    d = Decision.model_validate_json(out.read_text())
    assert d.policy_options["colocation"] is None
    assert all(j.est_slowdown is None for j in d.jobs)
    assert main(["solve", str(SMALL), "--policy", name, "--uplink-oversubscription", "3", "-o", str(out)]) == 0
    d = Decision.model_validate_json(out.read_text())
    assert d.policy_options["colocation"]["uplink_oversubscription"] == 3.0


def test_solver_flags_build_the_options_model(tmp_path):
    out = tmp_path / "d.json"
    assert main(["solve", str(SMALL), "--policy", "gavel", "--time-limit", "4", "--gap", "0.02", "-o", str(out)]) == 0
    o = GavelOptions.model_validate(Decision.model_validate_json(out.read_text()).policy_options)
    assert (o.time_limit_s, o.mip_gap, o.max_migrations) == (4.0, 0.02, GavelOptions().max_migrations)
    # flags left out keep each policy's own default (gavel's gap is not arena's)
    assert main(["solve", str(SMALL), "--policy", "gavel", "-o", str(out)]) == 0
    assert Decision.model_validate_json(out.read_text()).policy_options["mip_gap"] == GavelOptions().mip_gap


def test_simulate_flags_reach_the_policy(tmp_path):
    assert main(["simulate", "--trace", str(SMALL_TRACE), "--cluster", str(SMALL_CLUSTER), "--policy", "sia",
                 "--limit-jobs", "4", "--rounds", "2", "--no-colocation", "--time-limit", "2", "-o", str(tmp_path),
                 "--quiet"]) == 0
    out = json.loads((tmp_path / "sia.json").read_text())
    assert out["policy_options"]["colocation"] is None and out["policy_options"]["time_limit_s"] == 2.0


def test_candidate_factor_flag_reaches_arena_and_bounds_its_milp(tmp_path):
    """--candidate-factor sets arena's option; a small factor leaves waiting jobs out of the MILP (the
    decision says so) and the decision stays feasible."""
    from arena_opt.feasibility import check_decision
    from arena_opt.snapshot import ClusterSnapshot

    out = tmp_path / "d.json"
    assert main(["solve", str(SMALL), "--candidate-factor", "0.05", "-o", str(out)]) == 0
    d = Decision.model_validate_json(out.read_text())
    assert d.policy_options["candidate_factor"] == 0.05
    assert "left out of the MILP (candidate_factor 0.05)" in (d.stats.note or "")
    check_decision(ClusterSnapshot.model_validate_json(SMALL.read_text()), d)
    assert main(["simulate", "--trace", str(SMALL_TRACE), "--cluster", str(SMALL_CLUSTER), "--limit-jobs", "4",
                 "--rounds", "2", "--candidate-factor", "1.5", "-o", str(tmp_path), "--quiet"]) == 0
    assert json.loads((tmp_path / "arena.json").read_text())["policy_options"]["candidate_factor"] == 1.5


def test_bench_gives_each_policy_the_flags_it_has(tmp_path):
    assert main(["bench", "--trace", str(SMALL_TRACE), "--cluster", str(SMALL_CLUSTER), "--policies", "fcfs,gavel",
                 "--limit-jobs", "4", "--time-limit", "2", "--no-colocation", "-o", str(tmp_path),
                 "--quiet"]) == 0
    fcfs = json.loads((tmp_path / "fcfs.json").read_text())["policy_options"]
    gavel = json.loads((tmp_path / "gavel.json").read_text())["policy_options"]
    assert "time_limit_s" not in fcfs and gavel["time_limit_s"] == 2.0
    assert fcfs["colocation"] is None and gavel["colocation"] is None


@pytest.mark.parametrize("argv, msg", [
    (["solve", str(SMALL), "--policy", "fcfs", "--shards", "2"], "--shards: policy 'fcfs' has no such option"),
    (["solve", str(SMALL), "--gap", "-1"], "--gap must be >= 0 (value -1.0)"),
    (["solve", str(SMALL), "--threads", "0"], "--threads must be > 0 (value 0)"),
    (["solve", str(SMALL), "--candidate-factor", "0"], "--candidate-factor must be > 0"),
    (["solve", str(SMALL), "--policy", "sia", "--candidate-factor", "2"],
     "--candidate-factor: policy 'sia' has no such option"),
    (["solve", str(SMALL), "--no-colocation", "--uplink-oversubscription", "2"], "contradict"),
    (["solve", str(SMALL), "--policy", "magic"], "unknown policy 'magic'"),
    (["simulate", "--trace", str(SMALL_TRACE), "--cluster", str(SMALL_CLUSTER), "--policy", "fcfs",
      "--time-limit", "5"], "--time-limit: policy 'fcfs' has no such option"),
    (["bench", "--trace", str(SMALL_TRACE), "--cluster", str(SMALL_CLUSTER), "--policies", "fcfs,elasticflow",
      "--shards", "2"], "--shards: none of the policies fcfs, elasticflow has this option"),
])
def test_bad_policy_flag_exits_2_naming_flag_and_value(argv, msg, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert msg in err and "Traceback" not in err


def test_flag_help_shows_the_defaults_the_options_models_hold(monkeypatch):
    """The help of the policy flags reads each default from the options model: move a default and the help
    moves with it (they were typed in, and could drift from what runs)."""
    import argparse

    from arena_opt.policies.flags import add_policy_args

    def help_of(flag: str) -> str:
        p = argparse.ArgumentParser()
        add_policy_args(p)
        return next(a.help for a in p._actions if flag in a.option_strings)

    assert "default 2;" in help_of("--candidate-factor") and "arena: 10;" in help_of("--time-limit")
    monkeypatch.setattr(ArenaOptions.model_fields["candidate_factor"], "default", 3.5)
    monkeypatch.setattr(ArenaOptions.model_fields["time_limit_s"], "default", 7.0)
    assert "default 3.5;" in help_of("--candidate-factor") and "arena: 7;" in help_of("--time-limit")
