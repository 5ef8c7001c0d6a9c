"""What the Slurm runner keeps through the faults of a real cluster, measured on a real Slurm (Debian's
slurm-wlm, started on this host by tests/slurm_cluster.py, as the tests do):

- `controller`: slurmctld stops for --outage-s under a running job and starts again, twice: once at a
  time not tied to the loop (a seeded random delay of up to two rounds after the job's third step was
  seen), once just as the loop's thread starts a Slurm query (a launch's `squeue -h -j`) whose ping
  answered: the query the ping cannot guard, which only its timeout ends. Measured: the runner's
  status() calls before, during and after the outage and the longest gap between two during it (the
  time the loop was blind), what the loop was running when the controller went, launches of the job,
  steps run twice or never, and the outage the runner recorded.
- `node_down`: the job's node goes DOWN (then DRAIN, so it stays out). Measured: seconds from the fault to
  the first step of the relaunch elsewhere, steps run twice (since the checkpoint), steps never run.

    python bench/slurm_faults.py [--outage-s 15] [--seed 0] [--out bench/results]

Writes slurm_faults.json and .md. Exits 2 with the reason when Slurm cannot start here.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(_ROOT))
sys.path.insert(0, str(_ROOT / "tests"))

from _provenance import command, git_rev, machine, write_result  # noqa: E402
from slurm_cluster import (LoopCommands, WhenRunning, controller_outage, one_job_loop,  # noqa: E402
                           set_node_states, timed_status)

HARNESS = _ROOT / "tests" / "slurm_cluster.py"
INTERVAL_S = 2.0  # the loop's round; it samples the runner about once a second between rounds


def _steps(r, job: str) -> tuple[list[int], list[dict]]:
    ev = r.events(job)
    return [e["step"] for e in ev if e["event"] == "step"], ev


def _step_counts(steps: list[int], iterations: int) -> dict:
    seen = set(steps)
    return {"steps_run": len(steps), "steps_twice": len(steps) - len(seen),
            "steps_never": sum(1 for s in range(1, iterations + 1) if s not in seen)}


def _stats(xs: list[float]) -> dict:
    return {"calls": len(xs), "median_s": statistics.median(xs) if xs else None, "max_s": max(xs) if xs else None}


def _longest_gap(starts: list[float], t0: float, t1: float) -> float:
    """Longest stretch of [t0, t1] without the start of a status() call."""
    pts = [t0, *sorted(s for s in starts if t0 < s < t1), t1]
    return max(b - a for a, b in zip(pts, pts[1:]))


def outage_under_a_job(slurm, work: Path, outage_s: float, trigger: str, seed: int = 0,
                       iterations: int = 60) -> dict:
    """trigger "at_time": the outage starts a seeded random delay (up to two rounds) after the job's third
    step was seen; "in_query": just before the loop's next `squeue -h -j` of the launch, after its ping."""
    from runners.slurm import SlurmRunner

    r = SlurmRunner(work / "w", device="cpu", tag="bctl", ckpt_interval=5)
    loop = one_job_loop(r, work / "out", "c", iterations=iterations, interval_s=INTERVAL_S,
                        duration_s=outage_s + 200)
    calls = timed_status(r)
    delay = random.Random(seed).uniform(0, 2 * INTERVAL_S)

    def at_time(o):
        time.sleep(delay)
        return controller_outage(slurm, outage_s)

    def in_query(o):
        cmds.arm(f"squeue -h -j {r.slurm_id('c')}", outage_s)
        return True

    with LoopCommands(slurm) as cmds:
        with WhenRunning(loop, "c", 3, at_time if trigger == "at_time" else in_query) as fault:
            res = loop.run()
    window = fault.result if trigger == "at_time" else cmds.window
    if not fault.result or not window:
        raise RuntimeError("the job never ran 3 steps: no outage was made")
    t0, t_down, t1 = window
    rec = {j["id"]: j for j in res.jobs}["c"]
    events = [json.loads(line) for line in (work / "out" / "events.jsonl").read_text().splitlines()]
    back = [e for e in events if e["kind"] == "controller_back"]
    steps, _ = _steps(r, "c")
    return {
        "fault": "controller", "trigger": trigger, "delay_s": round(delay, 2) if trigger == "at_time" else None,
        "loop_at_stop": cmds.hit if trigger == "in_query" else cmds.inside(t0),
        "stop_s": round(t_down - t0, 1), "down_s": round(t1 - t_down, 1),
        "query_timeout_s": r.options.query_timeout_s,
        "job_status": rec["status"],
        "launches": sum(1 for e in events if e["kind"] == "launch" and e["job"] == "c"),
        "status_before": _stats([d for s, d in calls if s + d < t0]),
        "status_during": _stats([d for s, d in calls if s < t1 and s + d > t0]),
        "status_after": _stats([d for s, d in calls if s >= t1]),
        "longest_gap_during_s": round(_longest_gap([s for s, _ in calls], t_down, t1), 2),
        "lost_events": sum(1 for e in events if e["kind"] == "controller_lost"),
        "back_events": len(back),
        "recorded_outage_s": back[0]["details"].get("outage_s") if back else None,
        **_step_counts(steps, iterations),
    }


def node_down(slurm, work: Path, iterations: int = 30) -> dict:
    from runners.slurm import SlurmRunner

    r = SlurmRunner(work / "w", device="cpu", tag="bdown", ckpt_interval=2)
    loop = one_job_loop(r, work / "out", "d", iterations=iterations, interval_s=3, duration_s=150)

    def fail(o):
        node, t = next(iter(o.placement)), time.time()
        set_node_states(slurm, node, "DOWN", "DRAIN", reason="bench")
        return node, t, o.step

    with WhenRunning(loop, "d", 4, fail) as fault:
        res = loop.run()
    if fault.result is None:
        raise RuntimeError("the job never ran 4 steps: no node was failed")
    node, t_fault, step_seen = fault.result
    rec = {j["id"]: j for j in res.jobs}["d"]
    steps, ev = _steps(r, "d")
    starts = [e for e in ev if e["event"] == "start"]
    resumed = [e for e in ev if e["event"] == "step" and e["time"] > t_fault and e.get("generation", 0) > 0]
    return {
        "fault": "node_down", "job_status": rec["status"], "launches": len(starts),
        "step_seen_at_fault": step_seen,
        "resumed_from_step": starts[-1].get("step") if len(starts) > 1 else None,
        "fault_to_first_step_s": round(resumed[0]["time"] - t_fault, 1) if resumed else None,
        "relaunched_elsewhere": node not in r.jobs["d"].log_paths[0],
        **_step_counts(steps, iterations),
    }


def render(p: dict) -> str:
    def s(x):
        return "-" if x is None else f"{x:.3f}"

    out = [f"# Slurm runner under faults (real slurm-wlm on one host)\n\nCommand: `{p['command']}`  \n"
           f"Commit {p['commit']}, {p['slurm']}; machine {p['machine']}.\n"]
    out += ["## slurmctld outage under a running job\n",
            f"The loop's round is {INTERVAL_S:g} s and it samples the runner about once a second; guarded Slurm "
            "queries time out after the runner's query timeout. \"at a time\": the outage starts a seeded random "
            "delay after the job's third step was seen; \"inside a query\": just as the loop starts a launch's "
            "`squeue -h -j` whose ping answered. Blind = the longest stretch of the outage without a status() "
            "call starting. Recorded outage: first failed ping or timed-out query to the first query answered.\n",
            "| trigger | loop at the stop | stop s | down s | query timeout s | status() calls before / during / "
            "after | max s during | blind s | lost / back events | recorded outage s | job | launches | steps run "
            "| twice | never |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in p["controller"]:
        trig = f"at a time (+{c['delay_s']} s)" if c["trigger"] == "at_time" else "inside a query"
        b, du, a = (c[f"status_{k}"] for k in ("before", "during", "after"))
        out.append(f"| {trig} | {c['loop_at_stop'] or 'between commands'} | {c['stop_s']} | {c['down_s']} | "
                   f"{c['query_timeout_s']:g} | {b['calls']} / {du['calls']} / {a['calls']} | {s(du['max_s'])} | "
                   f"{c['longest_gap_during_s']} | {c['lost_events']} / {c['back_events']} | "
                   f"{s(c['recorded_outage_s'])} | {c['job_status']} | {c['launches']} | {c['steps_run']} | "
                   f"{c['steps_twice']} | {c['steps_never']} |")
    d = p["node_down"]
    out += ["\n## The job's node goes DOWN\n",
            "| job | launches | step seen at the fault | resumed from step | fault to first step s | elsewhere | "
            "steps run | twice | never |", "|---|---|---|---|---|---|---|---|---|",
            f"| {d['job_status']} | {d['launches']} | {d['step_seen_at_fault']} | {d['resumed_from_step']} | "
            f"{d['fault_to_first_step_s']} | {d['relaunched_elsewhere']} | {d['steps_run']} | {d['steps_twice']} | "
            f"{d['steps_never']} |"]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--outage-s", type=float, default=15.0, help="how long slurmctld stays down")
    ap.add_argument("--seed", type=int, default=0, help="seed of the \"at a time\" outage's delay")
    ap.add_argument("--out", type=Path, default=_ROOT / "bench" / "results")
    args = ap.parse_args(argv)
    if args.outage_s <= 0:
        print(f"error: --outage-s: {args.outage_s} is not a positive number of seconds", file=sys.stderr)
        return 2
    from slurm_cluster import SlurmCluster, unavailable_reason

    if why := unavailable_reason():
        print(f"error: no Slurm cluster on this host: {why}", file=sys.stderr)
        return 2
    import os

    cluster = SlurmCluster().start()
    os.environ["SLURM_CONF"] = str(cluster.conf)
    try:
        version = cluster.run("sinfo", "--version").stdout.strip()
        with tempfile.TemporaryDirectory(prefix="bench-slurm-") as tmp:
            ctl = []
            for trigger in ("at_time", "in_query"):
                cluster.reset()
                ctl.append(outage_under_a_job(cluster, Path(tmp) / f"ctl-{trigger}", args.outage_s, trigger,
                                              seed=args.seed))
                print(json.dumps(ctl[-1]), flush=True)
            cluster.reset()
            down = node_down(cluster, Path(tmp) / "down")
            print(json.dumps(down), flush=True)
    finally:
        cluster.stop()
    payload = {"command": command(), "commit": git_rev(), "machine": machine(), "slurm": version,
               "controller": ctl, "node_down": down}
    md = render(payload)
    write_result(args.out / "slurm_faults.json", payload, md, inputs=[HARNESS])
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
