"""How well this host reproduces its own measurements: the same plans' measured step times in two
runs of `bench/estimator_accuracy.py`, side by side, and their estimates (which come from a fresh
profile in every run, itself a measurement). An estimate cannot be shown closer to the measurement
than the measurement is to itself.

    python bench/repeatability.py OLD.json NEW.json [--out bench/results]

e.g. `git show <rev>:bench/results/estimator_accuracy.json > /tmp/old.json` for an earlier run.
Writes repeatability.json and .md.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

_HERE = Path(__file__).resolve().parent
if sys.path and Path(sys.path[0]).resolve() == _HERE:
    sys.path.append(sys.path.pop(0))
sys.path.insert(0, str(_HERE.parent))

from _perf_common import command, err_stats, err_table, fmt_pct, md_table, write  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old", type=Path)
    ap.add_argument("new", type=Path)
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    args = ap.parse_args(argv)
    runs = []
    for p in (args.old, args.new):
        try:
            runs.append(json.loads(p.read_text()))
        except (OSError, json.JSONDecodeError) as e:
            print(f"error: {p}: {e}", file=sys.stderr)
            return 2
    old = {(r["arch"], r["world"], r["plan"]): r for r in runs[0]["rows"]}
    rows, by_world, by_world_est = [], defaultdict(list), defaultdict(list)
    for r in runs[1]["rows"]:
        o = old.get((r["arch"], r["world"], r["plan"]))
        if o is None:
            continue
        d = r["measured_s"] / o["measured_s"] - 1
        de = r["estimate_s"] / o["estimate_s"] - 1
        rows.append({"arch": r["arch"], "world": r["world"], "plan": r["plan"], "old_s": o["measured_s"],
                     "new_s": r["measured_s"], "rel_diff": d, "old_estimate_s": o["estimate_s"],
                     "new_estimate_s": r["estimate_s"], "rel_diff_estimate": de})
        by_world[r["world"]].append(d)
        by_world_est[r["world"]].append(de)
    payload = {"command": command(), "old": {"path": str(args.old), "git": runs[0].get("git")},
               "new": {"path": str(args.new), "git": runs[1].get("git")}, "machine": runs[1].get("machine"),
               "per_world": {str(w): err_stats(v) for w, v in sorted(by_world.items())},
               "per_world_estimate": {str(w): err_stats(v) for w, v in sorted(by_world_est.items())},
               "all": err_stats([r["rel_diff"] for r in rows]), "rows": rows}
    m = payload["machine"] or {}
    md = "\n".join([
        "# Run-to-run repeatability of the measured plans (CPU, gloo)\n",
        f"Command: `{payload['command']}`: the measured median step of the same plans in the "
        f"`bench/estimator_accuracy.py` run of git {runs[0].get('git')} and of git {runs[1].get('git')}, "
        f"both on {m.get('cpu_model', m.get('processor', '?'))} ({runs[1].get('cores')} cores, shared). "
        "Where the two revisions are equal, or differ outside the measured path (`arena_opt.profiling.measure`, "
        "`runners/`), any difference is the host's.\n",
        "## Relative difference per process count (new / old - 1)\n",
        err_table(payload["per_world"], "diff"),
        f"\nAll {payload['all']['n']} plans: mean |diff| {fmt_pct(payload['all']['mean'])}, max "
        f"{fmt_pct(payload['all']['max'])}.\n",
        "## The estimates of the same plans (each run profiles afresh)\n",
        err_table(payload["per_world_estimate"], "diff"),
        "## Every plan\n",
        md_table(["model", "processes", "plan", "measured old s", "measured new s", "diff", "estimate old s",
                  "estimate new s", "diff"],
                 [[r["arch"], r["world"], r["plan"], f"{r['old_s']:.3f}", f"{r['new_s']:.3f}", fmt_pct(r["rel_diff"]),
                   f"{r['old_estimate_s']:.3f}", f"{r['new_estimate_s']:.3f}", fmt_pct(r["rel_diff_estimate"])]
                  for r in rows])])
    write(args.out, "repeatability", payload, md, inputs=[args.old, args.new])
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
