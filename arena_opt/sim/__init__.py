"""Trace-driven simulator: replay a job trace on a simulated cluster through `Policy.decide`.
Traces and cluster specs are read by `arena_opt.trace` and `arena_opt.cluster` (the live loop reads them too)."""

__all__ = ["Simulator", "SimOptions", "SimResult", "SimulationError", "simulate"]


def __getattr__(name: str):
    # imported on first use: the CLI loads this package for its subcommands' flags only (`arena-opt solve`
    # would otherwise import the whole simulator)
    if name == "simulate":
        from arena_opt.sim.run import simulate

        return simulate
    if name in __all__:
        from arena_opt.sim import engine

        return getattr(engine, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
