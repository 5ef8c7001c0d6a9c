"""The LP lower bound (arena_opt.bound) for one simulator setup: the trace, cluster, truth, tick interval
and restart costs a `RunConfig` names, so the bound is comparable to that setup's simulated policies."""

from __future__ import annotations

import time

from arena_opt.bound import BoundOptions, BoundResult, build_instance, solve
from arena_opt.errors import InputError
from arena_opt.reconfig import PRESETS, ReconfigModel
from arena_opt.sim.config import RunConfig, load_inputs
from arena_opt.sim.run import ARENA_POLICIES, reconfig_for


def restart_models(preset: str) -> list[ReconfigModel]:
    """The restart costs any policy of the setup pays (`artifact`: arena's and the baselines')."""
    if preset == "artifact":
        return [reconfig_for(ARENA_POLICIES[0], preset), reconfig_for("fcfs", preset)]
    if preset not in PRESETS:
        raise InputError(f"unknown reconfiguration preset {preset!r}; known: {', '.join([*PRESETS, 'artifact'])}")
    return [PRESETS[preset]]


def config_bound(cfg: RunConfig, opts: BoundOptions | None = None) -> tuple[BoundResult, dict]:
    """The bound of the setup and a JSON-ready record of it (setup, sizes, seconds)."""
    if cfg.rounds is not None:
        raise InputError("--rounds: the bound is on the average JCT of runs to completion; drop --rounds")
    t0 = time.perf_counter()
    trace, cluster, truth, _ = load_inputs(cfg)
    inst = build_instance([t.to_job() for t in trace], cluster, truth, interval_s=cfg.interval_s,
                          reconfig=restart_models(cfg.reconfig))
    t1 = time.perf_counter()
    if not inst.jobs:
        raise InputError(f"{cfg.trace}: no job of the trace runs on any grid of this cluster")
    res = solve(inst, opts)
    record = res.as_dict() | {"config": cfg.model_dump(exclude={"policy", "policy_options", "noise", "seed", "replan",
                                                                 "replan_on_ready", "plan_cache"}),
                              "grids": sum(len(j.grids) for j in inst.jobs),
                              "grids_before_reduction": inst.grids_before_frontier,
                              "instance_s": t1 - t0, "total_s": time.perf_counter() - t0}
    return res, record
