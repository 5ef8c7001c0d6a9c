"""Trace-driven simulator: replay a job trace on a simulated cluster through `Policy.decide`.
Traces and cluster specs are read by `arena_opt.trace` and `arena_opt.cluster` (the live loop reads them too)."""

from arena_opt.sim.engine import SimOptions, SimResult, SimulationError, Simulator
from arena_opt.sim.run import simulate

__all__ = ["Simulator", "SimOptions", "SimResult", "SimulationError", "simulate"]
