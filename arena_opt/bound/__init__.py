"""A provable lower bound on the average JCT of any schedule of a trace on a cluster (docs/BOUND.md)."""

from arena_opt.bound.instance import BoundGrid, BoundInstance, BoundJob, build_instance, frontier
from arena_opt.bound.lp import BoundOptions, BoundResult, solve

__all__ = ["BoundGrid", "BoundInstance", "BoundJob", "BoundOptions", "BoundResult", "build_instance", "frontier",
           "solve"]
