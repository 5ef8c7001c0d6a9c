"""Trace-driven simulator: replay a job trace on a simulated cluster through `Policy.decide`."""

from arena_opt.sim.cluster import load_cluster
from arena_opt.sim.engine import SimOptions, SimResult, SimulationError, Simulator
from arena_opt.sim.run import simulate
from arena_opt.sim.trace import TraceJob, load_trace

__all__ = ["load_cluster", "load_trace", "TraceJob", "Simulator", "SimOptions", "SimResult", "SimulationError",
           "simulate"]
