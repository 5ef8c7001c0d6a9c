"""How well this host reproduces its own measurements: the same plans' measured step times launch to
launch. An estimate cannot be shown closer to the measurement than the measurement is to itself.

    python bench/repeatability.py RUN.json [--out bench/results]
    python bench/repeatability.py OLD.json NEW.json [--out bench/results]

With one `bench/estimator_accuracy.py` run: its rounds, side by side. Every round launches each world size
afresh (new processes, new gloo group, the plans rebuilt), rounds interleaved over the world sizes, so two
rounds of a plan are two independent measurements some minutes apart on the same code and profile: every
pair of a plan's rounds gives one difference (later / earlier - 1, of the rounds' median steps). The
estimates are not compared: one run profiles once.
With two runs (e.g. `git show <rev>:bench/results/estimator_accuracy.json > /tmp/old.json` for an earlier
one): the plans' measured medians (over each run's rounds) and their estimates, which come from a fresh
profile in every run, itself a measurement.
Writes repeatability.json and .md.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from collections import defaultdict
from pathlib import Path

_HERE = Path(__file__).resolve().parent
if sys.path and Path(sys.path[0]).resolve() == _HERE:
    sys.path.append(sys.path.pop(0))
sys.path.insert(0, str(_HERE.parent))

from _perf_common import command, err_stats, err_table, fmt_pct, md_table, write  # noqa: E402


def round_pairs(run: dict) -> list[dict]:
    """One row per pair of rounds of every plan of `run` (an estimator_accuracy payload): the rounds'
    median steps and later / earlier - 1."""
    rows = []
    for r in run["rows"]:
        for (i, a), (j, b) in itertools.combinations(enumerate(r.get("round_s") or []), 2):
            rows.append({"arch": r["arch"], "world": r["world"], "plan": r["plan"], "rounds": [i + 1, j + 1],
                         "old_s": a, "new_s": b, "rel_diff": b / a - 1})
    return rows


def run_pairs(old_run: dict, new_run: dict) -> list[dict]:
    """One row per plan measured in both runs: measured medians and estimates, new / old - 1."""
    old = {(r["arch"], r["world"], r["plan"]): r for r in old_run["rows"]}
    rows = []
    for r in new_run["rows"]:
        o = old.get((r["arch"], r["world"], r["plan"]))
        if o is None:
            continue
        rows.append({"arch": r["arch"], "world": r["world"], "plan": r["plan"], "old_s": o["measured_s"],
                     "new_s": r["measured_s"], "rel_diff": r["measured_s"] / o["measured_s"] - 1,
                     "old_estimate_s": o["estimate_s"], "new_estimate_s": r["estimate_s"],
                     "rel_diff_estimate": r["estimate_s"] / o["estimate_s"] - 1})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", type=Path, nargs="+", metavar="RUN.json", help="one run (its rounds) or two (OLD NEW)")
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    args = ap.parse_args(argv)
    if len(args.runs) > 2:
        print(f"error: give one or two estimator_accuracy results, got {len(args.runs)}", file=sys.stderr)
        return 2
    runs = []
    for p in args.runs:
        try:
            runs.append(json.loads(p.read_text()))
        except (OSError, json.JSONDecodeError) as e:
            print(f"error: {p}: {e}", file=sys.stderr)
            return 2
    if not isinstance(runs[-1].get("rows"), list):
        print(f"error: {args.runs[-1]}: no 'rows' (not an estimator_accuracy result)", file=sys.stderr)
        return 2
    two = len(runs) == 2
    rows = run_pairs(*runs) if two else round_pairs(runs[0])
    by_world, by_world_est = defaultdict(list), defaultdict(list)
    for r in rows:
        by_world[r["world"]].append(r["rel_diff"])
        if two:
            by_world_est[r["world"]].append(r["rel_diff_estimate"])
    payload = {"command": command(), "mode": "runs" if two else "rounds",
               "runs": [{"path": str(p), "git": run.get("git"), "rounds": run.get("rounds")}
                        for p, run in zip(args.runs, runs)],
               "machine": runs[-1].get("machine"),
               "per_world": {str(w): err_stats(v) for w, v in sorted(by_world.items())},
               "per_world_estimate": {str(w): err_stats(v) for w, v in sorted(by_world_est.items())},
               "all": err_stats([r["rel_diff"] for r in rows]), "rows": rows}
    md = render(payload, runs)
    write(args.out, "repeatability", payload, md, inputs=args.runs)
    print(md)
    return 0


def render(p: dict, runs: list[dict]) -> str:
    m = p["machine"] or {}
    host = f"{m.get('cpu_model', m.get('processor', '?'))} ({runs[-1].get('cores')} cores, shared)"
    if p["mode"] == "runs":
        head = [f"Command: `{p['command']}`: the measured median step of the same plans in the "
                f"`bench/estimator_accuracy.py` run of git {runs[0].get('git')} and of git {runs[1].get('git')}, "
                f"both on {host}. Where the two revisions are equal, or differ outside the measured path "
                "(`arena_opt.profiling.measure`, `runners/`), any difference is the host's.\n",
                "## Relative difference per process count (new / old - 1)\n"]
    else:
        head = [f"Command: `{p['command']}`: the rounds of one `bench/estimator_accuracy.py` run (git "
                f"{runs[0].get('git')}, {runs[0].get('rounds')} rounds, {runs[0].get('steps')} timed steps after "
                f"{runs[0].get('warmup')} warm-up per plan and round) on {host}. Every round launches each world "
                "size afresh (new processes and gloo group, plans rebuilt), rounds interleaved over the world "
                "sizes: two rounds of a plan are two independent measurements minutes apart with the same code "
                "and profile, so any difference is the host's. One difference per pair of a plan's rounds, of "
                "one round's median step each (a run's measured time is the median over its rounds, so it "
                "varies less than one round does).\n",
                "## Relative difference per process count (later round / earlier round - 1)\n"]
    out = ["# Run-to-run repeatability of the measured plans (CPU, gloo)\n", *head,
           err_table(p["per_world"], "diff", "plans" if p["mode"] == "runs" else "pairs"),
           f"\nAll {p['all']['n']} pairs: mean |diff| {fmt_pct(p['all'].get('mean'))}, max "
           f"{fmt_pct(p['all'].get('max'))}.\n"]
    if p["mode"] == "runs":
        out += ["## The estimates of the same plans (each run profiles afresh)\n",
                err_table(p["per_world_estimate"], "diff"), "## Every plan\n",
                md_table(["model", "processes", "plan", "measured old s", "measured new s", "diff", "estimate old s",
                          "estimate new s", "diff"],
                         [[r["arch"], r["world"], r["plan"], f"{r['old_s']:.3f}", f"{r['new_s']:.3f}",
                           fmt_pct(r["rel_diff"]), f"{r['old_estimate_s']:.3f}", f"{r['new_estimate_s']:.3f}",
                           fmt_pct(r["rel_diff_estimate"])] for r in p["rows"]])]
    else:
        out += ["## Every pair of rounds\n",
                md_table(["model", "processes", "plan", "rounds", "earlier s", "later s", "diff"],
                         [[r["arch"], r["world"], r["plan"], f"{r['rounds'][0]} / {r['rounds'][1]}",
                           f"{r['old_s']:.3f}", f"{r['new_s']:.3f}", fmt_pct(r["rel_diff"])] for r in p["rows"]])]
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
