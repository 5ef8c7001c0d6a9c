"""One simulation from names and paths: truth and estimate, policy, reconfiguration preset."""

from __future__ import annotations

import inspect
from pathlib import Path

from arena_opt.errors import InputError
from arena_opt.perf.estimator import PerfEstimator
from arena_opt.policies import REGISTRY, get_policy
from arena_opt.policies.base import Policy
from arena_opt.reconfig import PRESETS, ReconfigModel
from arena_opt.sim.engine import SimOptions, SimResult, Simulator
from arena_opt.sim.perf import NoisyEstimator, make_truth
from arena_opt.trace import TraceJob
from arena_opt.snapshot import ClusterSnapshot

# `--reconfig artifact`: Arena's artifact charges its own system 10 s/GPU (cap 40 s) and every
# baseline 150 s/GPU (cap 600 s) of Alpa re-planning at each (re)start
ARENA_POLICIES = ("arena", "arena-greedy")
RECONFIG_CHOICES = (*PRESETS, "artifact")


def reconfig_for(policy: str, preset: str) -> ReconfigModel:
    if preset == "artifact":
        return PRESETS["arena-artifact" if policy in ARENA_POLICIES else "baseline-artifact"]
    try:
        return PRESETS[preset]
    except KeyError:
        raise InputError(f"unknown reconfiguration preset {preset!r}; known: {', '.join(RECONFIG_CHOICES)}") from None


def make_policy(name: str, estimator: PerfEstimator, reconfig: ReconfigModel, **kwargs) -> Policy:
    if name not in REGISTRY:
        raise InputError(f"unknown policy {name!r}; known: {', '.join(REGISTRY)}")
    mod, cls = REGISTRY[name].split(":")
    import importlib

    klass = getattr(importlib.import_module(mod), cls)
    params = inspect.signature(klass).parameters
    if "reconfig" in params and "reconfig" not in kwargs:
        kwargs["reconfig"] = reconfig
    if name == "arena" and "options" not in kwargs:
        from arena_opt.milp.options import ArenaOptions

        # the same MILP rows, handed to HiGHS as arrays: thousands of rounds without Pyomo's per-round
        # overhead (tests/test_milp.py checks that both backends reach the same optimum). Simulated
        # rounds hold far fewer grids than the 1,000-job snapshots the 1e-2 default is sized for
        # (bench/results/solve.md), so a 1e-3 gap costs little and leaves less room for arbitrary
        # reshuffles of near-equal solutions inside the gap
        kwargs["options"] = ArenaOptions(backend="highspy", mip_gap=1e-3)
    return get_policy(name, estimator=estimator, **kwargs)


def make_estimators(perf_table: str | Path | None, noise: float = 0.0, seed: int = 0,
                    table_mode: str = "strict") -> tuple[PerfEstimator, PerfEstimator]:
    truth = make_truth(perf_table, table_mode)
    estimate = truth if noise == 0 else NoisyEstimator(truth, noise, seed)
    return truth, estimate


def simulate(trace: list[TraceJob], cluster: ClusterSnapshot, policy: str, *, perf_table: str | Path | None = None,
             noise: float = 0.0, seed: int = 0, reconfig: str = "checkpoint", options: SimOptions | None = None,
             truth: PerfEstimator | None = None, estimate: PerfEstimator | None = None, progress=None,
             policy_kwargs: dict | None = None) -> SimResult:
    if truth is None:
        truth, estimate = make_estimators(perf_table, noise, seed)
    elif estimate is None:
        estimate = truth if noise == 0 else NoisyEstimator(truth, noise, seed)
    model = reconfig_for(policy, reconfig)
    opts = options or SimOptions()
    opts.reconfig = model
    pol = make_policy(policy, estimate, model, **(policy_kwargs or {}))
    return Simulator(cluster, trace, pol, truth=truth, options=opts, progress=progress).run()
