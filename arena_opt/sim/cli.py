"""Subcommands `simulate`, `bench` and `gen-trace` (registered into `arena-opt` by `register`)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from arena_opt.argtypes import bounded, positive_float, positive_int, seed
from arena_opt.errors import InputError
from arena_opt.io import check_output_dir, check_output_file
from arena_opt.policies.flags import add_policy_args, check_known, given_options, options_for


def _run_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trace", required=True, help="Arena trace CSV or our JSON Lines trace")
    p.add_argument("--cluster", required=True,
                   help="cluster spec JSON (ours, a job-free snapshot, or Arena's cluster_spec_derived.json) "
                        "or inline TYPE:NODESxGPUS,...")
    p.add_argument("--perf-table", help="measured table (prof_records.csv layout) used as the truth; "
                                        "default: the analytical model")
    p.add_argument("--table-mode", default="strict", choices=["strict", "override"],
                   help="strict: grids missing from the table are infeasible (Arena's simulator); "
                        "override: the model fills them in")
    p.add_argument("--rounds", type=positive_int, help="stop after N scheduling intervals (default: until all jobs finish)")
    p.add_argument("--interval", type=positive_float, default=300.0, help="scheduling interval, s (default 300)")
    p.add_argument("--reconfig", default="checkpoint",
                   choices=["checkpoint", "arena-artifact", "baseline-artifact", "artifact"],
                   help="restart cost model; artifact = Arena's constants (10 s/GPU cap 40 s for arena and "
                        "arena-greedy, 150 s/GPU cap 600 s for the baselines)")
    p.add_argument("--iter-scale", type=positive_int, default=1, help="divide iteration counts by this (Arena: 5)")
    p.add_argument("--deadline-stretch", type=positive_float, default=1.0, help="multiply deadline budgets (Arena: 5)")
    p.add_argument("--arena-scaling", action="store_true",
                   help="Arena's simulator scaling: --iter-scale 5 --deadline-stretch 5")
    p.add_argument("--noise", type=bounded(float, 0, 1, hi_open=True), default=0.0,
                   help="perturb the estimate the policy sees by up to +-this fraction (e.g. 0.2)")
    p.add_argument("--seed", type=seed, default=0, help="seed of the estimate noise")
    p.add_argument("--replan", default="auto", choices=["auto", "events", "every-tick"],
                   help="call the policy only after arrivals/completions (events; auto is the same) or at "
                        "every tick")
    p.add_argument("--replan-on-ready", action="store_true", help="also re-plan when a reconfiguration ends")
    p.add_argument("--limit-jobs", type=positive_int, help="only the first N jobs of the trace")
    add_policy_args(p)


def _config(args, policy: str, policy_options: dict | None = None):
    from pydantic import ValidationError

    from arena_opt.sim.config import RunConfig

    iter_scale, stretch = (5, 5.0) if args.arena_scaling else (args.iter_scale, args.deadline_stretch)
    from arena_opt.sim.config import user_plan_cache

    cache = user_plan_cache()
    try:
        return RunConfig(trace=args.trace, cluster=args.cluster, policy=policy, perf_table=args.perf_table,
                         table_mode=args.table_mode, rounds=args.rounds, interval_s=args.interval,
                         reconfig=args.reconfig, iter_scale=iter_scale, deadline_stretch=stretch, noise=args.noise,
                         seed=args.seed, replan=args.replan, replan_on_ready=args.replan_on_ready,
                         limit_jobs=args.limit_jobs, plan_cache=str(cache) if cache and cache.is_file() else None,
                         policy_options=policy_options or {})
    except ValidationError as e:
        err = e.errors()[0]
        raise InputError(f"--{str(err['loc'][0]).replace('_', '-')}: {err['msg']} (value {err.get('input')!r})") \
            from None


def cmd_simulate(args) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from arena_opt.sim.config import check_policy, run_config, user_plan_cache
    from arena_opt.sim.results import write_result

    check_policy(args.policy)
    check_output_dir(args.output_dir, "-o")
    cfg = _config(args, args.policy, options_for(args.policy, given_options(args)))
    if args.noise and not 0 <= args.noise < 1:
        raise InputError(f"--noise must be in [0, 1), got {args.noise}")
    from arena_opt.sim.engine import SimulationError

    with Progress(TextColumn(args.policy), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  disable=args.quiet) as prog:
        task = prog.add_task("jobs", total=None)
        try:
            out = run_config(cfg, lambda t, done, total: prog.update(task, completed=done, total=total),
                             save_plans=user_plan_cache())
        except SimulationError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
    path = Path(args.output_dir) / f"{args.policy}.json"
    write_result(path, out)
    _summary(Console(), [out])
    print(f"results written to {path}")
    return 0


def _default_parallel(policies: int) -> int:
    """Policies are independent processes with one thread each and their outcomes do not depend on how
    many run beside them (bench/results/simulate-parallel.md), so a comparison by default uses every
    core the process may run on: on a 2-core host six policies take about half the sequential time."""
    return max(1, min(policies, len(os.sched_getaffinity(0))))


def cmd_bench(args) -> int:
    from rich.console import Console

    from arena_opt.sim.bench import parse_policies, run_bench

    policies = parse_policies(args.policies)
    check_output_dir(args.output_dir, "-o")
    given = given_options(args)
    check_known(policies, given)
    per_policy = {p: options_for(p, given, strict=False) for p in policies}  # each takes the flags it has
    base = _config(args, policies[0], per_policy[policies[0]])
    bound = None if args.no_bound or args.rounds is not None else _bound_options(args)
    parallel = args.parallel or _default_parallel(len(policies))
    results, info = run_bench(base, policies, args.output_dir, parallel=parallel, show_progress=not args.quiet,
                              timeout_s=args.timeout, policy_options=per_policy, bound=bound)
    con = Console()
    if results:
        _summary(con, results)
    for p, why in info["failed"].items():
        con.print(f"[red]{p} failed:[/red] {why}")
    out = Path(args.output_dir)
    if "bound" in info and info["bound"]["avg_jct_bound_s"] is not None:
        print(f"LP lower bound on average JCT: {info['bound']['avg_jct_bound_s']:,.1f} s "
              f"({info['bound']['status']}, {info['bound']['total_s']:.1f} s); bound.json")
    print(f"planner warm-up {info['plan_warmup_s']:.1f} s; results in {out}/ (one JSON per policy, results.md, "
          f"status.json, {len(info.get('plots', []))} plots)")
    if "interrupted" in info:
        stop = info["interrupted"]
        print(f"interrupted by {stop['signal']}: not run: {', '.join(info['not_run'])}; the finished policies' "
              f"results are kept (exit {stop['exit_code']})", file=sys.stderr)
        return stop["exit_code"]
    return 1 if info["failed"] else 0


def _bound_options(args):
    from pydantic import ValidationError

    from arena_opt.bound import BoundOptions

    try:
        return BoundOptions(epsilon=args.epsilon, time_limit_s=args.bound_time_limit, method=args.bound_method)
    except ValidationError as e:
        err = e.errors()[0]
        name = {"epsilon": "epsilon", "time_limit_s": "bound-time-limit", "method": "bound-method"}.get(
            str(err["loc"][0]), str(err["loc"][0]))
        raise InputError(f"--{name}: {err['msg']} (value {err.get('input')!r})") from None


def cmd_bound(args) -> int:
    import json

    from arena_opt.sim.bound import config_bound

    cfg = _config(args, "arena")
    res, record = config_bound(cfg, _bound_options(args))
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(json.dumps(record, indent=1) + "\n")
    if res.avg_jct_bound_s is None:
        print(f"error: no bound: HiGHS ended with status {res.status!r} without usable duals", file=sys.stderr)
        return 1
    print(f"average JCT >= {res.avg_jct_bound_s:,.1f} s over {res.jobs} jobs ({res.rejected} rejected: no grid "
          f"runs them); contention-free {res.contention_free_s:,.1f} s; LP status {res.status}, "
          f"{res.columns:,} columns, {record['total_s']:.1f} s")
    return 0


def _bound_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--epsilon", type=positive_float, default=0.5,
                   help="LP time blocks at most this times the job's age (smaller: tighter, larger LP; default 0.5)")
    p.add_argument("--bound-time-limit", type=positive_float, default=900.0,
                   help="seconds for the LP (a valid but weaker bound comes back at the limit; default 900)")
    p.add_argument("--bound-method", default="full", choices=["colgen", "full"],
                   help="every LP column at once, by HiGHS's interior point (default), or column generation")


def _summary(con, results: list[dict]) -> None:
    from rich.table import Table

    from arena_opt.sim.results import COLUMNS

    keep = ["policy", "finished / arrived", "avg JCT (s)", "p95 JCT (s)", "avg queue (s)", "avg thr (samples/s)",
            "avg thr, rounds > 100 (samples/s)", "GPU util", "reconfigs/job", "deadlines met", "sim wall / CPU (s)"]
    tab = Table()
    cols = [c for c in COLUMNS if c[0] in keep]
    for c in cols:
        tab.add_column(c[0], justify="left" if c[0] == "policy" else "right")
    for m in results:
        tab.add_row(*[c[2](m) for c in cols])
    con.print(tab)


def cmd_gen_trace(args) -> int:
    from arena_opt.cluster import describe, load_cluster
    from arena_opt.sim.gen import DEFAULT_MODELS, GenOptions, generate
    from arena_opt.trace import write_trace

    if not 0 < args.load:
        raise InputError(f"--load must be > 0, got {args.load}")
    check_output_file(args.output, "-o")
    cluster = load_cluster(args.cluster)
    models = tuple(m.strip() for m in args.models.split(",")) if args.models else DEFAULT_MODELS
    opts = GenOptions(jobs=args.jobs, seed=args.seed, load=args.load, models=models,
                      duration_median_s=args.duration_median, deadlines=not args.no_deadlines)
    jobs = generate(cluster, opts)
    write_trace(args.output, jobs)
    span = jobs[-1].submit_time - jobs[0].submit_time
    print(f"wrote {args.output}: {len(jobs)} jobs over {span / 3600:.1f} h for {describe(cluster)}")
    return 0


def register(sub) -> None:
    s = sub.add_parser("simulate", help="replay a trace on a simulated cluster with one policy")
    _run_args(s)
    s.add_argument("--policy", default="arena", help="arena (default), arena-greedy, fcfs, gavel, sia, elasticflow")
    s.add_argument("-o", "--output-dir", default="results/sim", help="write <policy>.json here")
    s.add_argument("--quiet", action="store_true", help="no progress bar")
    s.set_defaults(func=cmd_simulate)

    b = sub.add_parser("bench", help="run several policies on the same trace and compare them")
    _run_args(b)
    b.add_argument("--policies", default="all", help="comma-separated names or 'all' (default)")
    b.add_argument("-o", "--output-dir", default="results/bench",
                   help="one JSON per policy, results.md and PNG plots go here")
    b.add_argument("--parallel", type=positive_int,
                   help="policies run at once (default: one per usable core, at most one per policy)")
    b.add_argument("--timeout", type=positive_float, help="give up on a policy after this many seconds")
    b.add_argument("--quiet", action="store_true", help="no progress bars")
    _bound_args(b)
    b.add_argument("--no-bound", action="store_true",
                   help="skip the LP lower bound on average JCT (computed after the policies of a run to completion)")
    b.set_defaults(func=cmd_bench)

    lb = sub.add_parser("bound", help="a provable lower bound on the average JCT of any schedule (LP relaxation)")
    _run_args(lb)
    _bound_args(lb)
    lb.add_argument("-o", "--output", help="write the bound's record (JSON) here")
    lb.set_defaults(func=cmd_bound)

    g = sub.add_parser("gen-trace", help="write a synthetic trace with Philly-like arrivals and sizes")
    g.add_argument("--cluster", required=True, help="cluster spec the jobs are sized for")
    g.add_argument("-o", "--output", required=True, help="JSON Lines file to write")
    g.add_argument("--jobs", type=positive_int, default=200)
    g.add_argument("--seed", type=seed, default=0)
    g.add_argument("--load", type=positive_float, default=0.8, help="offered load as a fraction of the GPUs (default 0.8)")
    g.add_argument("--duration-median", type=positive_float, default=3600.0, help="median job run time, s (default 3600)")
    g.add_argument("--models", help="comma-separated catalog models (default: a mix of GPT, BERT, MoE, WideResNet)")
    g.add_argument("--no-deadlines", action="store_true")
    g.set_defaults(func=cmd_gen_trace)
