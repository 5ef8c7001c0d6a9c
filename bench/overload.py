"""arena on an overloaded trace: the queue in the thousands, every decision timed (issue 14's 2 s per decision).

    python bench/overload.py [--out bench/results] [--name overload] [--jobs 15000] [--rounds 80] [--time-limit 1.5]

A Philly-like trace three times the capacity of a 5,120-GPU cluster (`arena-opt gen-trace --load 3.0`), then
`arena-opt simulate --policy arena` for its first rounds (not to completion: by round 80 some 5,000 jobs wait or
run, which is the regime the target is about) with a per-call time limit below the 2 s target, both run as a user
runs them. Reported per decision: jobs in it, wall and CPU seconds, solver status and whether the greedy fallback
decided; how many decisions took over 2 s (wall and CPU). On a shared host wall time measures the load as much as
the code, so both clocks and the load are recorded. Writes <name>.json and <name>.md.
"""

from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_HERE = Path(__file__).resolve().parent
if sys.path and Path(sys.path[0]).resolve() == _HERE:
    sys.path.append(sys.path.pop(0))
sys.path.insert(0, str(_HERE.parent))

from _perf_common import command, machine, md_table, write  # noqa: E402

CLUSTER = "a100:320x4,v100:80x16,a40:640x2,a10:640x2"
TARGET_S = 2.0  # issue 14: every decision of the 15,000-job overloaded trace under 2 s


def _cli(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "arena_opt.cli", *args], check=True)


def summarise(decisions: list[dict]) -> dict:
    wall = [d["wall_s"] for d in decisions]
    cpu = [d["cpu_s"] for d in decisions]
    return {"decisions": len(decisions), "jobs_max": max(d["jobs"] for d in decisions),
            "jobs_last": decisions[-1]["jobs"],
            "wall_s_mean": sum(wall) / len(wall), "wall_s_max": max(wall),
            "cpu_s_mean": sum(cpu) / len(cpu), "cpu_s_max": max(cpu),
            "over_target_wall": sum(w > TARGET_S for w in wall), "over_target_cpu": sum(c > TARGET_S for c in cpu),
            "status": dict(collections.Counter(d["status"] for d in decisions)),
            "fallback": sum(bool(d["fallback"]) for d in decisions)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(_HERE / "results"))
    ap.add_argument("--name", default="overload")
    ap.add_argument("--jobs", type=int, default=15000)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--load", type=float, default=3.0)
    ap.add_argument("--rounds", type=int, default=80)
    ap.add_argument("--time-limit", type=float, default=1.5)
    a = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        trace = str(Path(tmp) / "over.jsonl")
        _cli("gen-trace", "--cluster", CLUSTER, "--jobs", str(a.jobs), "--seed", str(a.seed),
             "--load", str(a.load), "-o", trace)
        sim = [sys.executable, "-m", "arena_opt.cli", "simulate", "--trace", trace, "--cluster", CLUSTER,
               "--policy", "arena", "--rounds", str(a.rounds), "--time-limit", str(a.time_limit), "--quiet",
               "-o", str(Path(tmp) / "sim")]
        w0 = time.perf_counter()
        subprocess.run(sim, check=True)
        process_wall = time.perf_counter() - w0
        res = json.loads((Path(tmp) / "sim" / "arena.json").read_text())

    decisions = res["decisions"]
    s = summarise(decisions)
    payload = {"command": command(), "machine": machine(), "cluster": CLUSTER, "jobs": a.jobs, "seed": a.seed,
               "load": a.load, "rounds": a.rounds, "time_limit_s": a.time_limit, "target_s": TARGET_S,
               "summary": s, "within_target_cpu": s["over_target_cpu"] == 0,
               "within_target_wall": s["over_target_wall"] == 0,
               "sim_wall_s": res["sim_wall_s"], "sim_cpu_s": res["sim_cpu_s"], "process_wall_s": process_wall,
               "finished": res["finished"], "avg_jct_finished_s": res["avg_jct_s"],
               "decision_rows": [{k: d[k] for k in ("t", "jobs", "wall_s", "cpu_s", "status", "fallback")}
                                 for d in decisions]}
    status = ", ".join(f"{n} `{k}`" for k, n in sorted(s["status"].items(), key=lambda kv: -kv[1]))
    md = (f"# arena on an overloaded trace: {a.jobs:,} jobs (load {a.load}) on {CLUSTER} (5,120 GPUs), "
          f"first {a.rounds} rounds, time limit {a.time_limit} s per call\n\n"
          + md_table(["decisions", "jobs in the last / most", "CPU s per decision mean / max",
                      "wall s mean / max", f"> {TARGET_S:g} s CPU", f"> {TARGET_S:g} s wall", "status",
                      "greedy fallback decided", "finished, avg JCT of those (s)"],
                     [[s["decisions"], f"{s['jobs_last']:,} / {s['jobs_max']:,}",
                       f"{s['cpu_s_mean']:.2f} / {s['cpu_s_max']:.2f}", f"{s['wall_s_mean']:.2f} / {s['wall_s_max']:.2f}",
                       s["over_target_cpu"], s["over_target_wall"], status, s["fallback"],
                       f"{res['finished']:,}, " + ("-" if res["avg_jct_s"] is None else f"{res['avg_jct_s']:,.1f}")]])
          + f"\nSimulation {res['sim_wall_s']:.1f} s wall, {res['sim_cpu_s']:.1f} s CPU "
            f"(the simulate process {process_wall:.1f} s wall). Target: every decision under {TARGET_S:g} s: "
            f"{'met' if s['over_target_cpu'] == 0 else 'not met'} in CPU time, "
            f"{'met' if s['over_target_wall'] == 0 else 'not met'} in wall time on this host at its load.\n")
    write(Path(a.out), a.name, payload, md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
