"""Policies behind one interface (`Policy.decide(snapshot) -> Decision`), by name."""

from __future__ import annotations

import importlib

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


def get_policy(name: str, **kwargs) -> Policy:
    try:
        mod, cls = REGISTRY[name].split(":")
    except KeyError:
        raise KeyError(f"unknown policy {name!r}; known: {', '.join(REGISTRY)}") from None
    return getattr(importlib.import_module(mod), cls)(**kwargs)


__all__ = ["Policy", "GridPolicy", "REGISTRY", "get_policy"]
