"""One simulation from names and paths: truth and estimate, policy, reconfiguration preset."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from arena_opt.errors import InputError
from arena_opt.perf.estimator import PerfEstimator
from arena_opt.policies import make_policy
from arena_opt.reconfig import PRESETS, ReconfigModel
from arena_opt.sim.engine import SimOptions, SimResult, Simulator
from arena_opt.sim.perf import NoisyEstimator, make_truth
from arena_opt.trace import TraceJob
from arena_opt.snapshot import ClusterSnapshot

# `--reconfig artifact`: Arena's artifact charges its own system 10 s/GPU (cap 40 s) and every
# baseline 150 s/GPU (cap 600 s) of Alpa re-planning at each (re)start
ARENA_POLICIES = ("arena", "arena-greedy")
RECONFIG_CHOICES = (*PRESETS, "artifact")

# The simulator's option overrides per policy (plain data; the run's restart model and the caller's
# overrides go on top of them).
SIM_PRESETS: dict[str, dict[str, Any]] = {
    # the same MILP rows, handed to HiGHS as arrays: thousands of rounds without Pyomo's per-round
    # overhead (tests/test_milp.py checks that both backends reach the same optimum). The gap is the
    # default 1e-2: a tighter gap sends more rounds to the MIP, which on Arena's Philly trace cost far
    # more decision time than the little average JCT and the fewer restarts it bought (the side-by-side
    # runs and their command: docs/BENCHMARK.md, "Kept (session 12)")
    "arena": {"backend": "highspy"},
}


def reconfig_for(policy: str, preset: str) -> ReconfigModel:
    if preset == "artifact":
        return PRESETS["arena-artifact" if policy in ARENA_POLICIES else "baseline-artifact"]
    try:
        return PRESETS[preset]
    except KeyError:
        raise InputError(f"unknown reconfiguration preset {preset!r}; known: {', '.join(RECONFIG_CHOICES)}") from None


def sim_options(policy: str, reconfig: ReconfigModel, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """The options a simulated policy runs with: the simulator's preset, the run's restart model (the
    policy plans with what the simulator charges), then `overrides` (fields of the policy's options model)."""
    return {**SIM_PRESETS.get(policy, {}), "reconfig": reconfig, **(overrides or {})}


def make_estimators(perf_table: str | Path | None, noise: float = 0.0, seed: int = 0,
                    table_mode: str = "strict") -> tuple[PerfEstimator, PerfEstimator]:
    truth = make_truth(perf_table, table_mode)
    estimate = truth if noise == 0 else NoisyEstimator(truth, noise, seed)
    return truth, estimate


def simulate(trace: list[TraceJob], cluster: ClusterSnapshot, policy: str, *, perf_table: str | Path | None = None,
             noise: float = 0.0, seed: int = 0, reconfig: str = "checkpoint", options: SimOptions | None = None,
             truth: PerfEstimator | None = None, estimate: PerfEstimator | None = None, progress=None,
             policy_options: dict[str, Any] | None = None) -> SimResult:
    """`policy_options`: overrides of the policy's options (see `sim_options`)."""
    if truth is None:
        truth, estimate = make_estimators(perf_table, noise, seed)
    elif estimate is None:
        estimate = truth if noise == 0 else NoisyEstimator(truth, noise, seed)
    model = reconfig_for(policy, reconfig)
    opts = options or SimOptions()
    opts.reconfig = model
    pol = make_policy(policy, sim_options(policy, model, policy_options), estimator=estimate)
    return Simulator(cluster, trace, pol, truth=truth, options=opts, progress=progress).run()
