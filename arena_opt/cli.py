"""`arena-opt` command line. Every subcommand returns an exit code; user mistakes print one
clear message (file, field, value) and exit 2, never a traceback."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
import traceback

from arena_opt.argtypes import Parser, band_quantile, fraction, nonneg_int, positive_int, seed
from arena_opt.errors import InputError, Interrupted


PRESETS = {
    # name: (GPU type -> (nodes, GPUs per node), jobs)
    "small": ({"a100-40gb": (1, 4), "a40": (1, 2)}, 4),
    "medium": ({"a100-40gb": (8, 4), "v100-32gb": (2, 8), "a10": (8, 2)}, 40),
    "large": ({"a100": (80, 4), "v100": (20, 16), "a40": (160, 2), "a10": (160, 2)}, 150),
}
# a decision of more jobs than this is written on one line: such a file is read by programs (runners,
# `slurm apply`), not by eye (`jq .` indents it), and indenting a file of a hundred thousand jobs makes it
# larger and slower to write inside the call's time limit; a smaller decision keeps its indented
# layout, which people do read
COMPACT_DECISION_JOBS = 1000
# subcommands other modules contribute: module with register(subparsers)
PLUGINS = ["arena_opt.sim.cli", "arena_opt.profiling.cli", "runners.cli", "runners.slurm_cli"]


def _estimator(args):
    from arena_opt.perf.estimator import PerfEstimator
    from arena_opt.perf.planner import plan_cache_path
    from arena_opt.perf.table import PerfTable

    from arena_opt.perf.band import default_band

    table = PerfTable.load(args.perf_table) if getattr(args, "perf_table", None) else None
    est = PerfEstimator(table=table, table_mode=getattr(args, "table_mode", "override"), band=default_band())
    path = plan_cache_path()
    if path is not None:
        est.planner.load_cache(path)
    return est


def _save_plans(est) -> None:
    from arena_opt.perf.planner import plan_cache_path

    path = plan_cache_path()
    if path is not None:
        try:
            est.planner.save_cache(path)
        except OSError:
            pass  # a read-only home only costs the next run its warm start


def cmd_solve(args) -> int:
    from arena_opt.milp.solve import no_gc

    # no cyclic GC in the call: reading a 150,000-job snapshot makes as many long-lived objects, and every
    # full collection walks them again (0.4 s CPU of the read alone); the process leaves at once after
    with no_gc():
        return _solve(args)


def _solve(args) -> int:
    from arena_opt.feasibility import check_decision
    from arena_opt.io import check_output_file, load_model
    from arena_opt.policies import check_name, make_policy
    from arena_opt.policies.flags import given_options, options_for
    from arena_opt.report import print_decision
    from arena_opt.snapshot import ClusterSnapshot

    t0 = time.perf_counter()
    check_name(args.policy, "--policy: ")
    if args.output:
        check_output_file(args.output, "-o")
    options = options_for(args.policy, given_options(args))
    snap = load_model(args.snapshot, ClusterSnapshot)
    est = _estimator(args)
    policy = make_policy(args.policy, options, estimator=est)
    if hasattr(policy, "started"):
        from arena_opt.deadline import ENTRY, ENTRY_CPU

        # the time limit holds for the whole call, from process entry: reading and planning included
        policy.started, policy.started_cpu = ENTRY, ENTRY_CPU
    decision = policy.decide(snap)
    t1 = time.perf_counter()
    _save_plans(est)
    check_decision(snap, decision)
    # the whole call (reading, planning, deciding, checking), not only the policy's own part
    now = time.perf_counter()
    decision.stats.total_s = now - t0
    decision.stats.phases["check"] = now - t1
    if decision.stats.time_limit_s is not None and hasattr(policy, "started"):
        decision.stats.over_s = now - policy.started - decision.stats.time_limit_s
    if args.output:
        write_decision(decision, args.output)
    if args.json:
        print(decision.model_dump_json(indent=1))
    elif not args.quiet:
        print_decision(snap, decision, rows=args.rows)
    if args.output and not args.json:
        print(f"decision written to {args.output}")
    global _EXIT_NOW
    _EXIT_NOW = True  # the decision is out: the time limit must not pay for freeing every object of the round
    return 0


def write_decision(decision, path) -> None:
    """The decision file of `solve -o`: compact above COMPACT_DECISION_JOBS jobs."""
    from arena_opt.io import write_model

    write_model(decision, path, compact=len(decision.jobs) > COMPACT_DECISION_JOBS)


def cmd_plan(args) -> int:
    from arena_opt.gpus import BUILTIN_GPUS, canonical_gpu
    from arena_opt.grids import GridCatalog, compact_shape
    from arena_opt.milp.options import PolicyOptions
    from arena_opt.perf.analytical import cost_table
    from arena_opt.perf.estimator import GridShape
    from arena_opt.perf.planner import why_no_plan
    from arena_opt.report import print_plans
    from models.catalog import get_arch

    try:
        arch = get_arch(args.model)
    except KeyError as e:
        raise InputError(f"--model: {e.args[0]}") from None
    gpu = canonical_gpu(args.gpu)
    if gpu not in BUILTIN_GPUS:
        raise InputError(f"--gpu: unknown GPU type {args.gpu!r}; known: {', '.join(BUILTIN_GPUS)}")
    gpn = args.gpus_per_node or min(args.gpus, 8)
    if args.gpus > gpn and args.gpus % gpn:
        raise InputError(f"--gpus {args.gpus} is not a multiple of --gpus-per-node {gpn}")
    nodes, per = compact_shape(args.gpus, gpn)
    est = _estimator(args)
    caution = args.caution if args.caution is not None else PolicyOptions.model_fields["caution"].default
    catalog = GridCatalog.of(est, caution)
    layers = cost_table(arch, est.planner.params).num_layers
    rows = []
    pp = 1
    while pp <= args.gpus:
        if args.gpus % pp == 0:
            plans = catalog.plans(arch, args.batch, BUILTIN_GPUS[gpu], None, GridShape(gpu, nodes, per, pp))
            why = None if plans.proxy else why_no_plan(arch, args.batch, args.gpus, per, pp, layers)
            rows.append((pp, plans, why))
        pp *= 2
    _save_plans(est)
    print_plans(arch, args.batch, gpu, nodes, per, rows)
    return 0


def cmd_validate(args) -> int:
    from arena_opt.io import load_model
    from arena_opt.snapshot import ClusterSnapshot

    snap = load_model(args.snapshot, ClusterSnapshot)
    gpus = sum(n.num_gpus for n in snap.nodes)
    running = sum(1 for j in snap.jobs if j.running)
    print(f"{args.snapshot}: valid snapshot: {len(snap.nodes)} nodes, {gpus} GPUs, {len(snap.jobs)} jobs "
          f"({running} running)")
    return 0


def cmd_schema(args) -> int:
    from arena_opt.decision import Decision
    from arena_opt.snapshot import ClusterSnapshot

    cls = {"snapshot": ClusterSnapshot, "decision": Decision}[args.name]
    print(json.dumps(cls.model_json_schema(), indent=1))
    return 0


def cmd_gen_instance(args) -> int:
    from arena_opt.instances import generate_snapshot
    from arena_opt.io import check_output_file, write_model

    check_output_file(args.output, "-o")
    spec, jobs = PRESETS[args.preset] if args.preset else ({}, 0)
    if args.cluster:
        from arena_opt.cluster import parse_inline

        spec = {t: (g.nodes, g.gpus_per_node) for t, g in parse_inline(args.cluster).items()}
    if not spec:
        raise InputError("gen-instance: give --preset or --cluster")
    jobs = args.jobs if args.jobs is not None else (jobs or 20)
    snap = generate_snapshot(spec, jobs, seed=args.seed, running_fraction=args.running_fraction)
    write_model(snap, args.output)
    print(f"wrote {args.output}: {len(snap.nodes)} nodes, {sum(n.num_gpus for n in snap.nodes)} GPUs, "
          f"{len(snap.jobs)} jobs")
    return 0


def cmd_models(args) -> int:
    from models.catalog import ARCHITECTURES
    from models.layers import param_count

    for name, a in ARCHITECTURES.items():
        print(f"{name:20s} {a.family:12s} {param_count(a) / 1e9:7.2f}B params")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from arena_opt.policies.flags import add_policy_args

    ap = Parser(prog="arena-opt", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)

    s = sub.add_parser("solve", help="decide one round on a cluster snapshot")
    s.add_argument("snapshot", help="snapshot JSON (see `arena-opt schema snapshot`)")
    s.add_argument("-o", "--output", help="write the decision JSON here")
    s.add_argument("--policy", default="arena", help="arena (default), fcfs, gavel, sia, elasticflow, arena-greedy")
    s.add_argument("--perf-table", help="measured table (prof_records.csv layout)")
    s.add_argument("--table-mode", default="override", choices=["override", "strict", "off"])
    s.add_argument("--json", action="store_true", help="print the decision as JSON instead of a table")
    s.add_argument("--quiet", action="store_true", help="no table (with -o: only the line naming the file)")
    s.add_argument("--rows", type=nonneg_int, default=40,
                   help="table rows shown before the rest is summarised (default 40; 0 = all)")
    add_policy_args(s)
    s.set_defaults(func=cmd_solve)

    p = sub.add_parser("plan", help="grids, proxy plans and Pareto plans of one job")
    p.add_argument("--model", required=True)
    p.add_argument("--batch", type=positive_int, required=True)
    p.add_argument("--gpu", required=True)
    p.add_argument("--gpus", type=positive_int, required=True)
    p.add_argument("--gpus-per-node", type=positive_int)
    p.add_argument("--perf-table")
    p.add_argument("--caution", type=band_quantile,
                   help="band quantile the 'decided s' column prices each plan at, as the policies do "
                        "(default: PolicyOptions.caution, the band's upper edge)")
    p.set_defaults(func=cmd_plan)

    v = sub.add_parser("validate", help="check a snapshot")
    v.add_argument("snapshot")
    v.set_defaults(func=cmd_validate)

    sc = sub.add_parser("schema", help="print the JSON Schema of a format")
    sc.add_argument("name", choices=["snapshot", "decision"])
    sc.set_defaults(func=cmd_schema)

    g = sub.add_parser("gen-instance", help="write a synthetic snapshot")
    g.add_argument("-o", "--output", required=True)
    g.add_argument("--preset", choices=list(PRESETS))
    g.add_argument("--cluster", help="TYPE:NODESxGPUS,... e.g. a100:8x4,a40:4x2")
    g.add_argument("--jobs", type=positive_int)
    g.add_argument("--seed", type=seed, default=0)
    g.add_argument("--running-fraction", type=fraction, default=0.5)
    g.set_defaults(func=cmd_gen_instance)

    m = sub.add_parser("models", help="list the workload catalog")
    m.set_defaults(func=cmd_models)

    for mod in PLUGINS:
        try:
            register = importlib.import_module(mod).register
        except ImportError as e:
            # a plugin package absent from this tree; tests cover each plugin's commands
            if e.name and e.name.startswith(mod.rsplit(".", 1)[0]):
                continue
            raise
        register(sub)
    return ap


EXIT_OK, EXIT_FAILED, EXIT_INPUT, EXIT_BUG = 0, 1, 2, 3


def _interrupt(signum: int, frame: object) -> None:
    raise Interrupted(signum)


def _add_debug(ap: argparse.ArgumentParser) -> None:
    """`--debug` before or after the subcommand: a traceback for every error, not only for bugs."""
    ap.add_argument("--debug", action="store_true", help="show the traceback of any error")
    for action in ap._actions:
        if isinstance(action, argparse._SubParsersAction):
            for p in action.choices.values():
                p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                               help="show the traceback of any error")


def main(argv: list[str] | None = None) -> int:
    """Exit codes: 0 done; 1 the work ran and failed (a simulation error, a policy that failed in a
    bench); 2 a user mistake (bad flag, file, field, value or output path; nothing was written);
    3 a bug in arena-opt (with its traceback); 130 / 143 stopped by SIGINT / SIGTERM (finished results
    kept, no result file written half-way)."""
    ap = build_parser()
    _add_debug(ap)
    try:
        args = ap.parse_args(argv)
    except SystemExit as e:  # argparse: --help (0) or a bad flag (2, message printed)
        return int(e.code or 0)
    debug = getattr(args, "debug", False)
    import signal

    # SIGTERM as SIGINT: both unwind through the commands' cleanup (a bench stops its workers)
    old = signal.signal(signal.SIGTERM, _interrupt)
    try:
        return int(args.func(args) or 0)
    except InputError as e:
        if debug:
            traceback.print_exc()
        print(f"error: {e}", file=sys.stderr)
        return EXIT_INPUT
    except KeyboardInterrupt as e:
        if debug:
            traceback.print_exc()
        code = e.exit_code if isinstance(e, Interrupted) else 130
        name = str(e) if isinstance(e, Interrupted) else "SIGINT"
        print(f"interrupted by {name}: stopped; result files already written are complete, none was "
              f"written half-way (exit {code})", file=sys.stderr)
        return code
    except Exception as e:  # noqa: BLE001 - the one place a bug becomes a report instead of a crash
        traceback.print_exc()
        print(f"error: internal error in arena-opt ({type(e).__name__}: {e}); this is a bug in arena-opt, not in "
              f"your input: please report it with the traceback above", file=sys.stderr)
        return EXIT_BUG
    finally:
        signal.signal(signal.SIGTERM, old)


_EXIT_NOW = False  # set by `solve` once its output is complete (see entry)


def _interrupted_with_highs(code: int) -> bool:
    """A signal stopped a process that has used HiGHS, and no child of ours is left to reap: the results
    are written, and the interpreter's teardown of HiGHS's thread pool after an interrupted round aborted
    once (SIGABRT after the "interrupted by SIGTERM" message, at load 12) where os._exit cannot."""
    if code not in (130, 143) or "highspy" not in sys.modules:
        return False
    import multiprocessing

    return not multiprocessing.active_children()


def entry() -> None:
    """The `arena-opt` program: main's exit code, kept even when a HiGHS run is still going. After `solve`
    the process leaves at once: the interpreter's teardown of a 10,000-job round's objects took 0.3-0.5 s
    wall on a loaded host, past the call's time limit (every file is closed by then)."""
    code = main()
    from arena_opt.milp.solve import solve_running

    if solve_running() or _EXIT_NOW or _interrupted_with_highs(code):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    entry()
