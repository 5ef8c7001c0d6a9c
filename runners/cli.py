"""`arena-opt run`: make decisions real.

    arena-opt run --backend dry-run --snapshot SNAPSHOT.json       # decide once, print torchrun commands
    arena-opt run --trace TRACE --cluster SPEC --backend local      # live loop on this host
    arena-opt run --trace TRACE --backend slurm                     # live loop on the Slurm that $SLURM_CONF names

The lead's `arena_opt.cli` calls `register(subparsers)`.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path

from arena_opt.argtypes import nonneg_float, nonneg_int, positive_float, positive_int
from arena_opt.errors import InputError, Interrupted
from arena_opt.policies.flags import add_policy_args
from arena_opt.slurm.commands import SlurmOptions
from runners.spec import DEFAULT_CKPT_EVERY_S


def register(subparsers) -> None:
    r = subparsers.add_parser("run", help="apply decisions to torchrun jobs (local, dry-run or Slurm)",
                              description=__doc__.split("\n\n")[0],
                              formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n")[1])
    r.add_argument("--backend", choices=["local", "dry-run", "slurm"], default="local",
                   help="local: this host; dry-run: print the commands and sbatch scripts; slurm: one heterogeneous "
                        "sbatch per launch on the cluster $SLURM_CONF names (nodes from Slurm unless --cluster)")
    r.add_argument("--snapshot", help="cluster snapshot JSON: dry-run decides on it once; live backends run its jobs")
    r.add_argument("--trace", help="job trace (Arena CSV or JSON Lines) for the live loop")
    r.add_argument("--cluster", help="cluster spec for the live loop (TYPE:NODESxGPUS,... or JSON)")
    r.add_argument("--policy", default="arena", help="policy name (default arena)")
    r.add_argument("--workdir", default="arena-runs", help="job run/checkpoint directories (shared by all nodes)")
    r.add_argument("--out", default="results/live", help="metrics, decisions and timeline of the live loop")
    r.add_argument("--interval", type=positive_float, default=15.0, help="scheduling interval, wall seconds (default 15)")
    r.add_argument("--time-scale", type=positive_float, default=100.0, help="trace seconds per wall second (default 100)")
    r.add_argument("--iter-scale", type=positive_int, default=10, help="divide trace iterations by this (default 10)")
    r.add_argument("--batch-divisor", type=positive_int, default=8, help="divide trace batch sizes by this (default 8)")
    r.add_argument("--max-jobs", type=positive_int, help="first N jobs of the trace")
    r.add_argument("--duration", type=positive_float, help="stop the live loop after this many wall seconds")
    r.add_argument("--model-size", choices=["full", "scaled"],
                   help="catalog-size or scaled-down models (default: full for dry-run and on CUDA hosts, "
                        "scaled on CPU)")
    r.add_argument("--ckpt-every-s", type=nonneg_float, default=DEFAULT_CKPT_EVERY_S,
                   help=f"wall seconds between checkpoints (default {DEFAULT_CKPT_EVERY_S:g}: saving then costs a few "
                        "percent of training time, measured by bench/runners.py; 0 = off)")
    r.add_argument("--ckpt-interval", type=nonneg_int, default=0, help="also checkpoint every N steps (default 0 = off)")
    r.add_argument("--keep-checkpoints", type=positive_int, default=2, help="committed checkpoints kept per job (default 2)")
    r.add_argument("--max-restarts", type=nonneg_int, default=1,
                   help="in-place restarts torchrun makes after a worker fails, before the scheduler relaunches "
                        "(default 1)")
    r.add_argument("--max-failures", type=positive_int, default=3,
                   help="crashed launches in a row without progress before a job is marked failed (default 3)")
    r.add_argument("--retry-backoff", type=nonneg_float, default=10.0,
                   help="seconds before the second relaunch of a crashed job, doubling after each (default 10)")
    r.add_argument("--step-delay", type=nonneg_float, default=0.0, metavar="SECONDS",
                   help="live: every job sleeps this long after each training step, so a short job lasts long "
                        "enough to be watched, stopped or killed (tests and demos on CPU; default 0)")
    r.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    r.add_argument("--remove-node", action="append", default=[], metavar="NODE@SECONDS",
                   help="node leaves the cluster at that wall second (fault drill; repeatable)")
    r.add_argument("--gpu-map", help="slurm: GRES type -> catalog GPU name JSON (see `arena-opt slurm snapshot -h`)")
    r.add_argument("--partition", help="slurm: only the nodes of this partition")
    qt = SlurmOptions.model_fields["query_timeout_s"]
    r.add_argument("--slurm-query-timeout", type=positive_float, default=qt.default,
                   help=f"slurm: {qt.description} (default {qt.default:g})")
    r.add_argument("--node-addr", help="dry-run: NODE=HOST,... rendezvous host of each node (default: the node id)")
    r.add_argument("--restart-s", type=nonneg_float, default=20.0,
                   help="live: seconds a (re)start costs, for the policy's penalty (default 20, measured on "
                        "2 CPU cores by bench/runners.py)")
    add_policy_args(r)
    r.set_defaults(func=cmd_run)


def _pairs(text: str | None, opt: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in (text or "").split(","):
        if not part.strip():
            continue
        if "=" not in part:
            raise InputError(f"{opt}: cannot read {part!r}; expected NODE=VALUE")
        k, v = part.split("=", 1)
        out[k.strip()] = v.strip()
    return out


def live_options(policy: str, interval: float, restart_s: float, scaled: bool) -> dict:
    """A live run's option overrides (plain data; the command line's flags go on top): the arena policy's
    horizon and restart penalty follow the run instead of a GPU cluster's defaults."""
    if policy != "arena":
        return {}
    # the MILP values a restart of R s as a loss of R/horizon of a round: with the horizon at a
    # CPU interval (seconds) below the restart time nothing would ever be worth starting
    return {"horizon_s": max(interval, 4 * restart_s),
            # a scaled model's checkpoint is a few MB: only the process restart costs time
            "reconfig": {"restart_s": restart_s, **({"storage_gbs_per_gpu": 1e3} if scaled else {})}}


def _policy(args, preset: dict | None = None):
    from arena_opt.policies import check_name, make_policy
    from arena_opt.policies.flags import given_options, options_for

    check_name(args.policy, "--policy: ")
    return make_policy(args.policy, {**(preset or {}), **options_for(args.policy, given_options(args))})


def _live_scale(model_size: str | None):
    from runners.spec import Scale

    if model_size is None:
        import torch

        model_size = "full" if torch.cuda.is_available() else "scaled"
    return None if model_size == "full" else Scale()


def cmd_run(args) -> int:
    from arena_opt.io import load_model
    from arena_opt.snapshot import ClusterSnapshot

    for opt, v in (("--interval", args.interval), ("--time-scale", args.time_scale)):
        if v <= 0:
            raise InputError(f"{opt} must be > 0, got {v}")
    for opt, v in (("--iter-scale", args.iter_scale), ("--batch-divisor", args.batch_divisor),
                   ("--keep-checkpoints", args.keep_checkpoints), ("--max-failures", args.max_failures)):
        if v < 1:
            raise InputError(f"{opt} must be >= 1, got {v}")
    for opt, v in (("--ckpt-every-s", args.ckpt_every_s), ("--ckpt-interval", args.ckpt_interval),
                   ("--max-restarts", args.max_restarts), ("--retry-backoff", args.retry_backoff),
                   ("--step-delay", args.step_delay)):
        if v < 0:
            raise InputError(f"{opt} must be >= 0, got {v}")
    snap = load_model(args.snapshot, ClusterSnapshot) if args.snapshot else None
    if args.backend == "dry-run":
        if snap is None:
            raise InputError("--backend dry-run needs --snapshot SNAPSHOT.json")
        return _dry_run(args, snap)
    if snap is None and not (args.trace and (args.cluster or args.backend == "slurm")):
        raise InputError("a live run needs --trace and --cluster (or --snapshot; --backend slurm reads the nodes "
                         "from Slurm)")
    return _live(args, snap)


def _dry_run(args, snap) -> int:
    from arena_opt.feasibility import check_decision
    from runners.dry_run import DryRunRunner, jobs_from_snapshot
    from runners.spec import Scale

    runner = DryRunRunner(args.workdir, node_addrs=_pairs(args.node_addr, "--node-addr"),
                          ckpt_interval=args.ckpt_interval, device=args.device, ckpt_every_s=args.ckpt_every_s,
                          keep_checkpoints=args.keep_checkpoints, max_restarts=args.max_restarts)
    for spec, running in jobs_from_snapshot(snap, Scale() if args.model_size == "scaled" else None):
        runner.add_job(spec, running)
    decision = _policy(args).decide(snap)
    check_decision(snap, decision)
    runner.apply(decision)
    return 0


def _live(args, snap) -> int:
    from arena_opt.cluster import load_cluster
    from arena_opt.snapshot import ClusterSnapshot
    from arena_opt.trace import TraceJob, load_trace
    from runners.live import LiveLoop, LiveOptions

    kw = dict(device=args.device, ckpt_interval=args.ckpt_interval, ckpt_every_s=args.ckpt_every_s,
              keep_checkpoints=args.keep_checkpoints, max_restarts=args.max_restarts,
              max_failures=args.max_failures, backoff_s=args.retry_backoff)
    slurm_runner = None
    if args.backend == "slurm":
        from arena_opt.slurm.gres import GpuMap
        from runners.slurm import SlurmRunner

        slurm_runner = SlurmRunner(Path(args.workdir).resolve(), gpu_map=GpuMap.load(args.gpu_map),
                                   partition=args.partition,
                                   options=SlurmOptions(query_timeout_s=args.slurm_query_timeout), **kw)
    if args.cluster:
        cluster = load_cluster(args.cluster)
    elif slurm_runner is not None:
        cluster = ClusterSnapshot(nodes=slurm_runner.cluster_nodes())
    else:
        cluster = snap.model_copy(update={"jobs": []})
    trace: list = []
    if args.trace:
        trace = load_trace(args.trace, catalog=cluster.catalog)
    if snap is not None:
        trace += [TraceJob(id=j.id, submit_time=j.submit_time, model=j.model if isinstance(j.model, str)
                           else j.model.name, batch_size=j.batch_size, iterations=j.total_iterations,
                           num_gpus=j.requested_num_gpus, gpu_type=j.requested_gpu_type, deadline=j.deadline,
                           weight=j.weight) for j in snap.jobs]
    removals = []
    for item in args.remove_node:
        node, _, at = item.partition("@")
        try:
            removals.append((node, float(at)))
        except ValueError:
            raise InputError(f"--remove-node: cannot read {item!r}; expected NODE@SECONDS") from None
        if node not in {n.id for n in cluster.nodes}:
            raise InputError(f"--remove-node: unknown node {node!r}; nodes: {', '.join(n.id for n in cluster.nodes)}")
    opts = LiveOptions(interval_s=args.interval, time_scale=args.time_scale, iter_scale=args.iter_scale,
                       batch_divisor=args.batch_divisor, max_jobs=args.max_jobs, duration_s=args.duration,
                       scale=_live_scale(args.model_size), node_removals=removals, step_delay_s=args.step_delay)
    if args.backend == "slurm":
        runner = slurm_runner
    else:
        from runners.local import LocalRunner

        runner = LocalRunner(Path(args.workdir).resolve(), **kw)
    policy = _policy(args, live_options(args.policy, args.interval, args.restart_s, opts.scale is not None))
    loop = LiveLoop(cluster, trace, runner, policy, opts, args.out,
                    log=lambda s: print(s, flush=True))

    def _term(signum: int, frame: object) -> None:
        raise Interrupted(signum)  # the loop's finally stops every job; exit 143

    from runners.base import RunnerError

    old = signal.signal(signal.SIGTERM, _term)
    try:
        res = loop.run()
    except RunnerError as e:
        # a decision the runner cannot apply: a policy bug, reported without a traceback
        print(f"error: {e}", file=sys.stderr)
        return 1
    finally:
        signal.signal(signal.SIGTERM, old)
    m = res.metrics
    print(json.dumps({k: m[k] for k in ("jobs", "finished", "failed", "unfinished", "avg_jct_s", "makespan_s",
                                        "avg_throughput", "gpu_util", "deadline_satisfaction") if k in m}, indent=1))
    for jid, why in (m.get("failed_jobs") or {}).items():
        print(f"failed: job {jid}: {why}")
    print(f"metrics written to {Path(args.out) / 'metrics.json'}, events to {Path(args.out) / 'events.jsonl'}")
    # failed jobs are reported above; the exit status says whether the loop itself completed
    return 0
