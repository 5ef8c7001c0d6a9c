"""`arena-opt slurm`: the cluster that $SLURM_CONF names, as arena-opt sees and changes it.

    arena-opt slurm snapshot -o SNAPSHOT.json [--gpu-map MAP.json] [--partition P]
    arena-opt slurm apply DECISION.json [--dry-run] [--gpu-map MAP.json]

`snapshot` reads nodes and jobs (arena_opt.slurm.snapshot); `apply` sets each held job that a
decision starts to its GPU type, count and nodes and releases it (arena_opt.slurm.apply).
"""

from __future__ import annotations

import argparse
import sys

from arena_opt.errors import InputError


def register(subparsers) -> None:
    s = subparsers.add_parser("slurm", help="read a snapshot from Slurm; apply a decision to held Slurm jobs",
                              description=__doc__.split("\n\n")[0],
                              formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n")[1])
    sub = s.add_subparsers(dest="slurm_command", required=True)
    sn = sub.add_parser("snapshot", help="cluster snapshot JSON from sinfo/scontrol and squeue")
    sn.add_argument("-o", "--output", help="write the snapshot here (default: print it)")
    _common(sn)
    sn.add_argument("--partition", help="only the nodes of this partition")
    sn.set_defaults(func=cmd_snapshot)
    ap = sub.add_parser("apply", help="set held jobs to a decision's GPU type, count and nodes, then release them")
    ap.add_argument("decision", help="decision JSON (arena-opt solve -o)")
    ap.add_argument("--dry-run", action="store_true", help="print the scontrol commands, change nothing")
    _common(ap)
    ap.set_defaults(func=cmd_apply)


def _common(p) -> None:
    from arena_opt.slurm.gres import DEFAULT_GPU_MAP_PATH, GPU_MAP_ENV

    p.add_argument("--gpu-map", help=f"JSON object GRES type -> catalog GPU name (default ${GPU_MAP_ENV}, else "
                                     f"{DEFAULT_GPU_MAP_PATH} if it exists, else built-in names)")


def read_view(gpu_map_path: str | None, partition: str | None = None):
    from arena_opt.slurm.gres import GpuMap
    from runners.slurm import read_view

    return read_view(GpuMap.load(gpu_map_path), partition)


def cmd_snapshot(args) -> int:
    from arena_opt.io import write_model

    view = read_view(args.gpu_map, args.partition)
    snap = view.snapshot
    if not snap.nodes:
        raise InputError("Slurm offers no GPU node" + (f" in partition {args.partition!r}" if args.partition else "")
                         + (": " + "; ".join(snap.notes) if snap.notes else ""))
    if args.output:
        write_model(snap, args.output)
        print(f"snapshot: {len(snap.nodes)} node(s), {sum(n.num_gpus for n in snap.nodes)} GPU(s), "
              f"{len(snap.jobs)} job(s) written to {args.output}")
        for note in snap.notes:
            print(f"  note: {note}")
    else:
        print(snap.model_dump_json(indent=1))
    return 0


def cmd_apply(args) -> int:
    from arena_opt.decision import Decision
    from arena_opt.io import load_model
    from arena_opt.slurm.apply import apply_decision

    decision = load_model(args.decision, Decision)
    view = read_view(args.gpu_map)
    report = apply_decision(decision, view, dry_run=args.dry_run)
    for line in report.lines:
        print(line)
    for line in report.errors:
        print(f"error: {line}", file=sys.stderr)
    return 1 if report.errors else 0
