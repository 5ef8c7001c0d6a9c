"""Command-line flags of the policies' options, shared by `solve`, `simulate`, `bench` and `run`: each flag
given becomes one field of the options model (flags left out leave the policy's own default)."""

from __future__ import annotations

import argparse
from typing import Any

from pydantic import ValidationError

from arena_opt.argtypes import finite_float, nonneg_float, nonneg_int, positive_float, positive_int
from arena_opt.errors import InputError
from arena_opt.policies import options_model

# flag -> (argparse dest, options field)
FLAGS = {
    "--time-limit": ("time_limit", "time_limit_s"),
    "--gap": ("gap", "mip_gap"),
    "--shards": ("shards", "shards"),
    "--threads": ("threads", "threads"),
    "--max-reconfigs": ("max_reconfigs", "max_reconfigs_per_round"),
    "--uplink-oversubscription": ("uplink_oversubscription", "colocation"),
    "--no-colocation": ("no_colocation", "colocation"),
    "--caution": ("caution", "caution"),
    "--candidate-factor": ("candidate_factor", "candidate_factor"),
    "--standing-share": ("standing_share", "standing_share"),
}


def _default(model, field: str):
    return model.model_fields[field].default


def add_policy_args(p: argparse.ArgumentParser) -> None:
    # the defaults shown are read from the options models, so the help cannot drift from what runs
    from arena_opt.linkloads import ColocationOptions as C
    from arena_opt.policies.options import ArenaOptions as A, GavelOptions as G, SiaOptions as S

    g = p.add_argument_group("policy options (default: each policy's own; see arena_opt/policies/options.py)")
    g.add_argument("--time-limit", type=positive_float,
                   help=f"solver time limit per round, s (arena: {_default(A, 'time_limit_s'):g}; gavel: "
                        f"{_default(G, 'time_limit_s'):g}; sia: {_default(S, 'time_limit_s'):g})")
    g.add_argument("--gap", type=nonneg_float,
                   help=f"relative MIP gap (arena: {_default(A, 'mip_gap'):g}; gavel: {_default(G, 'mip_gap'):g}; "
                        f"sia: {_default(S, 'mip_gap'):g})")
    g.add_argument("--shards", type=positive_int,
                   help=f"arena: split level 1 into N shards (default {_default(A, 'shards')})")
    g.add_argument("--threads", type=positive_int, help=f"arena: HiGHS threads (default {_default(A, 'threads')})")
    g.add_argument("--max-reconfigs", type=nonneg_int, help="arena: cap on running jobs changed per round")
    g.add_argument("--uplink-oversubscription", type=positive_float,
                   help="rack nodes' network bandwidth over the rack uplink's (default "
                        f"{_default(C, 'uplink_oversubscription'):g}; 1 is non-blocking); above 1 "
                        "placement keeps cross-rack jobs off shared uplinks and decisions predict their slowdown")
    g.add_argument("--caution", type=finite_float,
                   help=f"quantile of each estimate's error band the grids are priced at (0.5-1; default "
                        f"{_default(A, 'caution'):g}, the 80%% band's upper edge; the estimator of solve and plan "
                        "carries a band)")
    g.add_argument("--standing-share", type=nonneg_float,
                   help="arena: share of a round's objective that putting moved running jobs back on their "
                        f"standing grid may cost, within the gap (default {_default(A, 'standing_share'):g}: "
                        "only where it costs nothing)")
    g.add_argument("--candidate-factor", type=positive_float,
                   help="arena: waiting jobs enter the MILP until their smallest grids add up to this many times "
                        f"the cluster's GPUs (default {_default(A, 'candidate_factor'):g}; lower bounds a round's "
                        "work when the queue is long)")
    g.add_argument("--no-colocation", action="store_true",
                   help="no co-location model: placement ignores other jobs' traffic, est_slowdown is null")


def given_options(args: argparse.Namespace) -> dict[str, tuple[str, Any]]:
    """The options the flags set: field -> (flag, value), only for flags given."""
    if args.no_colocation and args.uplink_oversubscription is not None:
        raise InputError("--no-colocation and --uplink-oversubscription contradict each other: give one")
    out: dict[str, tuple[str, Any]] = {}
    for flag, (dest, field) in FLAGS.items():
        v = getattr(args, dest)
        if v is None or v is False or field in out:
            continue
        if dest == "no_colocation":
            out[field] = (flag, None)
        elif dest == "uplink_oversubscription":
            out[field] = (flag, {"uplink_oversubscription": v})
        else:
            out[field] = (flag, v)
    return out


def options_for(name: str, given: dict[str, tuple[str, Any]], *, strict: bool = True) -> dict[str, Any]:
    """The flags' fields that policy `name` has, validated (an error names the flag and value). `strict`:
    a flag the policy has no option for is an error (one policy); else it is left to the policies that
    have it (a bench of several)."""
    model = options_model(name)
    fields = {f: v for f, (flag, v) in given.items() if f in model.model_fields}
    missing = [flag for f, (flag, _) in given.items() if f not in model.model_fields]
    if strict and missing:
        raise InputError(f"{missing[0]}: policy {name!r} has no such option (its options: "
                         f"{', '.join(model.model_fields)})")
    try:
        model.model_validate(fields)
    except ValidationError as e:
        err = e.errors()[0]
        flag = given[err["loc"][0]][0] if err["loc"] and err["loc"][0] in given else "options"
        raise InputError(_message(flag, err)) from None
    return fields


_BOUNDS = {"greater_than": ("gt", ">"), "greater_than_equal": ("ge", ">="), "less_than": ("lt", "<"),
           "less_than_equal": ("le", "<=")}


def _message(flag: str, err: dict) -> str:
    if err["type"] in _BOUNDS:
        key, op = _BOUNDS[err["type"]]
        bound = err["ctx"][key]
        return f"{flag} must be {op} {bound:g} (value {err.get('input')!r})"
    return f"{flag}: {err['msg']} (value {err.get('input')!r})"


def check_known(names: list[str], given: dict[str, tuple[str, Any]]) -> None:
    """Each flag given must be an option of at least one of the policies `names`."""
    for f, (flag, _) in given.items():
        if not any(f in options_model(n).model_fields for n in names):
            raise InputError(f"{flag}: none of the policies {', '.join(names)} has this option")
