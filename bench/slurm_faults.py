"""What the Slurm runner keeps through the faults of a real cluster, measured on a real Slurm (Debian's
slurm-wlm, started on this host by tests/slurm_cluster.py, as the tests do):

- `controller`: slurmctld stops for --outage-s under a running job and starts again. Measured: the runner's
  status() call before, during and after the outage (each call asks `scontrol ping` first and keeps what
  Slurm said last while the controller is down), launches of the job, steps run twice or never, and the
  outage the runner recorded.
- `node_down`: the job's node goes DOWN (then DRAIN, so it stays out). Measured: seconds from the fault to
  the first step of the relaunch elsewhere, steps run twice (since the checkpoint), steps never run.

    python bench/slurm_faults.py [--outage-s 15] [--out bench/results]

Writes slurm_faults.json and .md. Exits 2 with the reason when Slurm cannot start here.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(_ROOT))
sys.path.insert(0, str(_ROOT / "tests"))

from _provenance import command, git_rev, machine, write_result  # noqa: E402
from slurm_cluster import WhenRunning, controller_outage, one_job_loop, set_node_states  # noqa: E402

HARNESS = _ROOT / "tests" / "slurm_cluster.py"


def _timed_status(r) -> list[tuple[float, float]]:
    """Wrap r.status: (start time, seconds) of every call."""
    calls: list[tuple[float, float]] = []
    inner = r.status

    def status():
        t0 = time.time()
        try:
            return inner()
        finally:
            calls.append((t0, time.time() - t0))

    r.status = status
    return calls


def _steps(r, job: str) -> tuple[list[int], list[dict]]:
    ev = r.events(job)
    return [e["step"] for e in ev if e["event"] == "step"], ev


def _step_counts(steps: list[int], iterations: int) -> dict:
    seen = set(steps)
    return {"steps_run": len(steps), "steps_twice": len(steps) - len(seen),
            "steps_never": sum(1 for s in range(1, iterations + 1) if s not in seen)}


def _stats(xs: list[float]) -> dict:
    return {"calls": len(xs), "median_s": statistics.median(xs) if xs else None, "max_s": max(xs) if xs else None}


def outage_under_a_job(slurm, work: Path, outage_s: float, iterations: int = 60) -> dict:
    from runners.slurm import SlurmRunner

    r = SlurmRunner(work / "w", device="cpu", tag="bctl", ckpt_interval=5)
    loop = one_job_loop(r, work / "out", "c", iterations=iterations, interval_s=2, duration_s=outage_s + 200)
    calls = _timed_status(r)
    with WhenRunning(loop, "c", 3, lambda o: controller_outage(slurm, outage_s)) as fault:
        res = loop.run()
    if not fault.result:
        raise RuntimeError("the job never ran 3 steps: no outage was made")
    t0, t_down, t1 = fault.result
    rec = {j["id"]: j for j in res.jobs}["c"]
    events = [json.loads(line) for line in (work / "out" / "events.jsonl").read_text().splitlines()]
    back = [e for e in events if e["kind"] == "controller_back"]
    steps, _ = _steps(r, "c")
    return {
        "fault": "controller", "stop_s": round(t_down - t0, 1), "down_s": round(t1 - t_down, 1),
        "job_status": rec["status"],
        "launches": sum(1 for e in events if e["kind"] == "launch" and e["job"] == "c"),
        "status_before": _stats([d for s, d in calls if s + d < t0]),
        "status_during": _stats([d for s, d in calls if s < t1 and s + d > t0]),
        "status_after": _stats([d for s, d in calls if s >= t1]),
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
    c = p["controller"]
    out += ["## slurmctld outage under a running job\n",
            f"slurmctld took {c['stop_s']} s to stop and was then gone for {c['down_s']} s (until `scontrol ping` "
            f"answered again); the runner polls every 2 s. Job {c['job_status']}, {c['launches']} launch(es); "
            f"{c['steps_run']} steps run, {c['steps_twice']} twice, {c['steps_never']} never; "
            f"{c['lost_events']} controller_lost / {c['back_events']} controller_back event(s); the outage the "
            f"runner recorded (first failed ping to first answer): {s(c['recorded_outage_s'])} s.\n",
            "| runner status() calls | calls | median s | max s |", "|---|---|---|---|"]
    for k in ("before", "during", "after"):
        st = c[f"status_{k}"]
        out.append(f"| {k} the outage | {st['calls']} | {s(st['median_s'])} | {s(st['max_s'])} |")
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
            cluster.reset()
            ctl = outage_under_a_job(cluster, Path(tmp) / "ctl", args.outage_s)
            print(json.dumps(ctl), flush=True)
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
