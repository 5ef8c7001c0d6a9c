"""One simulation's inputs as a validated record: what `simulate` and every `bench` worker run."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import ConfigDict, Field, NonNegativeFloat, PositiveFloat, PositiveInt

from arena_opt.edge import EdgeModel
from arena_opt.cluster import load_cluster
from arena_opt.sim.engine import SimOptions
from arena_opt.sim.results import result_dict
from arena_opt.sim.run import make_estimators, simulate
from arena_opt.trace import load_trace


class RunConfig(EdgeModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    trace: str
    cluster: str
    policy: str = "arena"
    perf_table: str | None = Field(None, description="measured table; None = the analytical model is the truth")
    table_mode: Literal["strict", "override"] = "strict"
    rounds: PositiveInt | None = None
    interval_s: PositiveFloat = 300.0
    reconfig: str = "checkpoint"
    iter_scale: PositiveInt = 1
    deadline_stretch: PositiveFloat = 1.0
    noise: NonNegativeFloat = 0.0
    seed: int = 0
    replan: Literal["auto", "events", "every-tick"] = "auto"
    replan_on_ready: bool = False
    limit_jobs: PositiveInt | None = None
    plan_cache: str | None = Field(None, description="plan cache file to start from (Planner.load_cache)")
    policy_options: dict[str, Any] = Field(
        default_factory=dict, description="overrides of the policy's options (fields of its options model), "
                                          "on top of the simulator's preset (sim.run.SIM_PRESETS)")


def load_inputs(cfg: RunConfig):
    cluster = load_cluster(cfg.cluster)
    trace = load_trace(cfg.trace, iter_scale=cfg.iter_scale, deadline_stretch=cfg.deadline_stretch,
                       catalog=cluster.catalog, limit=cfg.limit_jobs)
    truth, estimate = make_estimators(cfg.perf_table, cfg.noise, cfg.seed, cfg.table_mode)
    if cfg.plan_cache:
        truth.planner.load_cache(cfg.plan_cache)  # the noisy estimate shares this planner
    return trace, cluster, truth, estimate


def run_config(cfg: RunConfig, progress=None, save_plans: str | Path | None = None) -> dict:
    t0 = time.perf_counter()
    trace, cluster, truth, estimate = load_inputs(cfg)
    opts = SimOptions(interval_s=cfg.interval_s, rounds=cfg.rounds, replan=cfg.replan,
                      replan_on_ready=cfg.replan_on_ready)
    res = simulate(trace, cluster, cfg.policy, reconfig=cfg.reconfig, options=opts, truth=truth, estimate=estimate,
                   progress=progress, policy_options=cfg.policy_options)
    out = result_dict(res, cfg.model_dump())
    out["total_wall_s"] = time.perf_counter() - t0
    if save_plans is not None:
        try:
            truth.planner.save_cache(save_plans)
        except OSError:
            pass  # a read-only cache location only costs the next run its warm start
    return out


def warm_plan_cache(cfg: RunConfig, path: str | Path) -> float:
    """Plan every grid of every workload in the trace once (starting from `cfg.plan_cache`, e.g. the
    user's plan cache) and write the plans to `path`, so that policies run in separate processes do
    not each pay the cold planner. Returns the seconds spent."""
    from arena_opt.grids import GridCatalog

    t0 = time.perf_counter()
    trace, cluster, truth, _ = load_inputs(cfg)
    catalog = GridCatalog.of(truth)
    for tj in trace:
        catalog.options(tj.to_job(), cluster)
    truth.planner.save_cache(path)
    if not Path(path).exists() and cfg.plan_cache and Path(cfg.plan_cache).is_file():
        shutil.copyfile(cfg.plan_cache, path)  # nothing new was planned: the start cache has it all
    return time.perf_counter() - t0


def user_plan_cache() -> Path | None:
    """The lead's on-disk plan cache ($ARENA_OPT_CACHE, else ~/.cache/arena-opt/plans.json)."""
    from arena_opt.perf.planner import plan_cache_path

    return plan_cache_path()


def check_policy(name: str) -> None:
    from arena_opt.policies import check_name

    check_name(name)
