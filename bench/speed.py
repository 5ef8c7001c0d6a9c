"""Wall time of one arena round, whole CLI call included, cold (empty plan cache) and warm, per instance.

    python bench/speed.py [--out bench/results] [--time-limit 10] [--name speed] [--gen SPEC ...] [SNAPSHOT.json ...]

`--gen CLUSTER/JOBS/SEED/RUNNING_FRACTION` adds a snapshot made by `arena-opt gen-instance` (deterministic
by its seed) in a scratch folder, e.g. the issue-14 round of 10,000 jobs on 40,960 GPUs:
`--gen a100:2560x4,v100:640x16,a40:5120x2,a10:5120x2/10000/7/0.1`.

Each snapshot is solved by `arena-opt solve` in a fresh process, once with ARENA_OPT_CACHE empty (cold:
every plan is planned) and once with a plan cache that the cold run wrote (warm). The decision's stats
give the phases (grids and plans, model + hand-off, solve, the rest of the round: placement and the
decision); /usr/bin/time-like figures (wall, CPU, peak memory) come from the child's rusage. The load
average is recorded beside every timing: the machine this runs on is shared, and CPU s / wall s is the
share of a core the run got. Writes NAME.json and NAME.md.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from _provenance import git_rev, machine, write_result

DEFAULT = ["instances/medium.json", "instances/large.json"]


def one_call(snapshot: str, cache: str, time_limit: float) -> dict:
    """One `arena-opt solve` in a child process: its wall time, CPU, peak memory and the decision's stats."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "decision.json"
        env = dict(os.environ, ARENA_OPT_CACHE=cache)
        load = os.getloadavg()[0]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "arena_opt.cli", "solve", snapshot, "--time-limit", str(time_limit),
                        "-o", str(out)], env=env, check=True, stdout=subprocess.DEVNULL)
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        stats = json.loads(out.read_text())["stats"]
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": wall, "cpu_s": cpu, "peak_rss_mib": after.ru_maxrss / 1024, "load_1min": load,
            "round_s": stats["total_s"], "grids_s": stats["build_s"], "solve_s": stats["solve_s"],
            "status": stats["status"], "fallback": stats["fallback"], "objective": stats["objective"],
            "bound": stats["bound"], "grids": stats["num_grids"], "over_s": stats.get("over_s"),
            "cut_short": stats.get("cut_short", []), "phases": stats.get("phases", {})}


def generated(spec: str, folder: str) -> str:
    """The snapshot `arena-opt gen-instance` makes from CLUSTER/JOBS/SEED/RUNNING_FRACTION, in `folder`."""
    cluster, jobs, seed, frac = spec.split("/")
    path = str(Path(folder) / f"gen-{jobs}-{seed}-{frac}.json")
    subprocess.run([sys.executable, "-m", "arena_opt.cli", "gen-instance", "--cluster", cluster, "--jobs", jobs,
                    "--seed", seed, "--running-fraction", frac, "-o", path], check=True, stdout=subprocess.DEVNULL)
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("snapshots", nargs="*")
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--time-limit", type=float, default=10.0)
    ap.add_argument("--name", default="speed")
    ap.add_argument("--gen", action="append", default=[], metavar="CLUSTER/JOBS/SEED/RUNNING_FRACTION")
    args = ap.parse_args(argv)
    files = args.snapshots or ([] if args.gen else DEFAULT)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        snaps = [(s, s) for s in files] + [(f"gen-instance {g}", generated(g, tmp)) for g in args.gen]
        for label, snap in snaps:
            jobs_gpus = _size(snap)
            cache = str(Path(tmp) / (Path(snap).stem + ".plan-cache.json"))
            # cold: planning from scratch, the plans kept in `cache` for the warm call (the CLI writes it)
            cold = one_call(snap, "", args.time_limit)
            one_call(snap, cache, args.time_limit)
            warm = one_call(snap, cache, args.time_limit)
            for kind, r in (("cold", cold), ("warm", warm)):
                rows.append({"snapshot": label, "kind": kind, **jobs_gpus, **r})
    # peak_rss_mib is the largest child so far (rusage of children is a running maximum)
    meta = {"command": " ".join(["python", *sys.argv]), "machine": machine(), "commit": git_rev(),
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "time_limit_s": args.time_limit}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    lines = [f"# Round wall time, cold and warm\n\nCommand: `{meta['command']}`  \nMachine: {meta['machine']}  \n"
             f"Commit {meta['commit']}, {meta['date']}, time limit {args.time_limit} s.\n",
             "| snapshot | jobs | GPUs | grids | plans | call wall s | CPU s | load | round s | grids+plans s | "
             "solve s | status | fallback | objective | peak MiB | wall / limit | cut short |", "|" + "---|" * 17]
    for r in rows:
        lines.append(f"| {r['snapshot']} | {r['jobs']} | {r['gpus']} | {r['grids']} | {r['kind']} | {r['wall_s']:.2f} | "
                     f"{r['cpu_s']:.2f} | {r['load_1min']:.1f} | {r['round_s']:.2f} | {r['grids_s']:.2f} | "
                     f"{r['solve_s']:.2f} | {r['status']} | {r['fallback']} | {r['objective']:.6g} | {r['peak_rss_mib']:.0f} | "
                     f"{r['wall_s'] / args.time_limit:.2f} | {', '.join(r['cut_short']) or '-'} |")
    write_result(out / f"{args.name}.json", {"meta": meta, "rows": rows}, "\n".join(lines) + "\n",
                 inputs=files)
    print("\n".join(lines))
    return 0


def _size(path: str) -> dict:
    d = json.loads(Path(path).read_text())
    return {"jobs": len(d["jobs"]), "gpus": sum(n["num_gpus"] for n in d["nodes"])}


if __name__ == "__main__":
    sys.exit(main())
