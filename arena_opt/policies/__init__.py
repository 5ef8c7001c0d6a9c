"""Policies behind one interface (`Policy.decide(snapshot) -> Decision`), built by name with typed options."""

from __future__ import annotations

import importlib
from typing import Any

from pydantic import ValidationError

from arena_opt.errors import InputError
from arena_opt.io import format_validation_error
from arena_opt.milp.options import PolicyOptions
from arena_opt.perf.estimator import PerfEstimator
from arena_opt.policies.base import GridPolicy, Policy

# name -> "module:Class"; imported on demand so that listing policies stays cheap
REGISTRY = {
    "arena": "arena_opt.policies.arena:ArenaPolicy",
    "fcfs": "arena_opt.policies.fcfs:FCFSPolicy",
    "gavel": "arena_opt.policies.gavel:GavelPolicy",
    "sia": "arena_opt.policies.sia:SiaPolicy",
    "elasticflow": "arena_opt.policies.elasticflow:ElasticFlowPolicy",
    "arena-greedy": "arena_opt.policies.arena_greedy:ArenaGreedyPolicy",
}


def check_name(name: str, where: str = "") -> None:
    """InputError (prefixed with `where`, e.g. the flag) unless `name` is a policy's name."""
    if name not in REGISTRY:
        raise InputError(f"{where}unknown policy {name!r}; known: {', '.join(REGISTRY)}")


def policy_class(name: str) -> type[Policy]:
    check_name(name)
    mod, cls = REGISTRY[name].split(":")
    return getattr(importlib.import_module(mod), cls)


def options_model(name: str) -> type[PolicyOptions]:
    """The options model of policy `name` (e.g. GavelOptions for "gavel")."""
    return policy_class(name).Options


def policy_options(name: str, options: PolicyOptions | dict[str, Any] | None = None) -> PolicyOptions:
    """`options` validated into the policy's model; a bad field or value is an InputError naming both."""
    model = options_model(name)
    try:
        return model.model_validate({} if options is None else options)
    except ValidationError as e:
        known = ", ".join(model.model_fields)
        raise InputError(f"{format_validation_error(f'policy {name!r} options', e)}\n"
                         f"policy {name!r} options are: {known}") from None


def make_policy(name: str, options: PolicyOptions | dict[str, Any] | None = None, *,
                estimator: PerfEstimator | None = None) -> Policy:
    """The one way to build a policy by name: `options` is the policy's options model or a dict of its
    fields (None: every default); `estimator` the cost model it decides on (None: the analytical one)."""
    return policy_class(name)(policy_options(name, options), estimator)


__all__ = ["Policy", "GridPolicy", "REGISTRY", "check_name", "make_policy", "options_model", "policy_class", "policy_options"]
