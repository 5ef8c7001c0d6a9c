"""Options of every policy by name: one pydantic model per policy, each default with its reason.

The shared fields (restart model, co-location model, a solver's time limit and gap) are in
arena_opt/milp/options.py (PolicyOptions, SolverOptions), beside the arena policy's ArenaOptions."""

from __future__ import annotations

from pydantic import Field, NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt

from arena_opt.milp.options import ArenaOptions, PolicyOptions, SolverOptions


class FcfsOptions(PolicyOptions):
    """FCFS has nothing of its own to set: the user's request, in submission order."""


class GavelOptions(SolverOptions):
    max_migrations: NonNegativeInt = Field(
        3, description="running jobs that may change GPU type in one round, as in Arena's Gavel baseline")


class SiaOptions(SolverOptions):
    time_limit_s: PositiveFloat = Field(
        5.0, description="Sia solves one program over every job's (type, count) configurations each round; "
                         "5 s keeps a round short (the committed simulation benchmarks ran with it)")
    mip_gap: NonNegativeFloat = Field(
        1e-2, description="relative gap; Sia's program is larger than Gavel's (one binary per configuration), "
                          "1e-2 keeps rounds short (the committed simulation benchmarks ran with it)")
    p: PositiveFloat = Field(0.5, description="exponent of the p-norm of normalized goodput: Sia's fairness "
                                              "setting in Arena's baseline")
    clip: PositiveFloat = Field(3000.0, description="cap on one configuration's utility, so no single job's "
                                                    "speed-up dominates the program")
    max_migrations: NonNegativeInt = Field(
        5, description="running jobs that may change configuration in one round, as in Arena's Sia baseline")
    candidates: PositiveInt = Field(
        3, description="the candidates x max_migrations running jobs with the largest possible gain are "
                       "variables of the program, the others constants: a program that size still holds every "
                       "job the migration cap could move, and several times more")


class ElasticFlowOptions(PolicyOptions):
    use_deadlines: bool = Field(
        True, description="share = smallest GPU count that meets the job's deadline (ElasticFlow); False is "
                          "Arena's ElasticFlow-L variant: every job gets its smallest feasible count")


class ArenaGreedyOptions(PolicyOptions):
    depth: PositiveInt = Field(
        2, description="most modifications of running jobs combined to start one job: every combination of up "
                       "to this many of the breadth cheapest is tried, so the search grows as breadth^depth")
    breadth: PositiveInt = Field(8, description="cheapest modifications the search combines")
    max_upgrades: NonNegativeInt = Field(
        10, description="single best upgrades applied per round after admission: bounds a round's changes")
    max_searches: NonNegativeInt = Field(
        16, description="searches per round (besides one failed search per GPU type): Arena's artifact, "
                        "unbounded, needed 5-300 s per round")


__all__ = ["PolicyOptions", "SolverOptions", "ArenaOptions", "FcfsOptions", "GavelOptions", "SiaOptions",
           "ElasticFlowOptions", "ArenaGreedyOptions"]
