"""arena-opt: joint GPU allocation and parallel-plan scheduling by MILP."""

import arena_opt.deadline  # noqa: F401  first: its clock is the process's entry (a call's time limit counts from it)
from arena_opt.decision import Decision, JobDecision, SolverStats
from arena_opt.plan import Plan
from arena_opt.snapshot import ClusterSnapshot, Job, Node

__all__ = ["ClusterSnapshot", "Job", "Node", "Plan", "Decision", "JobDecision", "SolverStats", "ArenaPolicy"]


def __getattr__(name: str):
    # Lazy: keeps `import arena_opt` free of pyomo until a policy is asked for.
    if name == "ArenaPolicy":
        from arena_opt.policies.arena import ArenaPolicy

        return ArenaPolicy
    raise AttributeError(name)
