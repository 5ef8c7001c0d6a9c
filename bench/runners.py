"""Runner benchmarks on this host (not timed tests): time to first step per
plan and world size, steps/s per plan, and reshape time split into save,
process exit, restart and load.

    .venv/bin/python bench/runners.py                       # CPU, scaled-down gpt-350M
    .venv/bin/python bench/runners.py --model llama-7B --full --device cuda   # on a GPU host

Writes a JSON report (default results/bench_runners.json) and prints a table.
Target on CPU with the small test model: a reshape completes in <= 30 s.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from arena_opt.decision import Decision, JobDecision  # noqa: E402
from arena_opt.plan import Plan  # noqa: E402
from runners.base import JobSpec  # noqa: E402
from runners.local import LocalRunner  # noqa: E402
from runners.process import kill_all  # noqa: E402
from runners.spec import Scale  # noqa: E402

PLANS = {
    "dp1": Plan(), "dp2": Plan(dp=2), "tp2": Plan(tp=2), "pp2": Plan(pp=2, num_microbatches=2),
    "dp4": Plan(dp=4), "dp2xtp2": Plan(dp=2, tp=2), "pp2xdp2": Plan(pp=2, dp=2, num_microbatches=2),
    "pp4": Plan(pp=4, num_microbatches=4),
}
RESHAPES = [("dp4", "tp2"), ("tp2", "pp2xdp2"), ("dp2", "dp4")]


def _decision(job: str, plan: Plan, action: str) -> Decision:
    return Decision(policy="bench", jobs=[JobDecision(job_id=job, action=action, gpu_type="local", num_gpus=plan.num_gpus,
                                                      placement={"n0": list(range(plan.num_gpus))}, plan=plan)])


def _wait(r: LocalRunner, job: str, pred, timeout: float = 600) -> None:
    t0 = time.time()
    while time.time() - t0 < timeout:
        st = {o.job_id: o for o in r.status()}[job]
        if pred(st):
            return
        time.sleep(0.05)
    raise TimeoutError(job)


def bench_plan(work: Path, name: str, args) -> dict:
    plan = PLANS[name]
    with LocalRunner(work / name, device=args.device) as r:
        r.add_job(JobSpec(job_id=name, model=args.model, global_batch=args.batch, total_steps=args.steps,
                          scale=None if args.full else Scale()))
        r.apply(_decision(name, plan, "start"))
        _wait(r, name, lambda s: s.state != "running")
        st = {o.job_id: o for o in r.status()}[name]
        ev = r.events(name)
        launch = r.timeline(name)[0][1]
        steps = [e for e in ev if e["event"] == "step"]
        exit_ev = next(e for e in ev if e["event"] == "exit")
        exited = next(t for k, t in r.timeline(name) if k == "exited")
        if st.state != "finished":
            return {"plan": name, "error": st.message}
        start = next(e for e in ev if e["event"] == "start")
        steady = [e["iter_time_s"] for e in steps[1:]]
        return {"plan": name, "world_size": plan.num_gpus,
                "first_step_s": steps[0]["time"] - launch,
                "launch_to_setup_s": start["time"] - launch, "setup_s": start["setup_s"],
                "steps_per_s": 1.0 / statistics.median(steady),
                "samples_per_s": args.batch / statistics.median(steady),
                "exit_s": exited - exit_ev["time"]}


def bench_reshape(work: Path, a: str, b: str, args) -> dict:
    job = f"{a}-{b}"
    with LocalRunner(work / job, device=args.device) as r:
        r.add_job(JobSpec(job_id=job, model=args.model, global_batch=args.batch, total_steps=10_000,
                          scale=None if args.full else Scale()))
        r.apply(_decision(job, PLANS[a], "start"))
        _wait(r, job, lambda s: s.step >= 3)
        t0 = time.time()
        r.apply(_decision(job, PLANS[b], "reshape"))
        _wait(r, job, lambda s: s.generation == 1 and s.step > s.last_checkpoint_step)
        t_done = time.time()
        ev = r.events(job)
        tl = r.timeline(job)
        r.shutdown(save=False)
    stop = next(t for k, t in tl if k == "stop")
    exited = next(t for k, t in tl if k == "exited")
    relaunch = [t for k, t in tl if k == "launch"][1]
    ck = next(e for e in ev if e["event"] == "checkpoint")
    exit_ev = next(e for e in ev if e["event"] == "exit")
    loaded = next(e for e in ev if e["event"] == "loaded")
    start1 = next(e for e in ev if e["event"] == "start" and e["generation"] == 1)
    first1 = next(e for e in ev if e["event"] == "step" and e["generation"] == 1)
    return {
        "reshape": f"{a} -> {b}",
        "total_s": first1["time"] - stop,  # stop request -> first step under the new plan
        "to_step_boundary_s": ck["time"] - ck["save_s"] - stop,  # the stop is seen at the next step's end
        "save_s": ck["save_s"],
        "process_exit_s": exited - exit_ev["time"],
        "restart_s": start1["time"] - relaunch - loaded["load_s"],  # torchrun, imports, rendezvous, model build
        "load_s": loaded["load_s"],
        "first_step_s": first1["time"] - start1["time"],
        "wall_check_s": t_done - t0,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="gpt-350M")
    ap.add_argument("--full", action="store_true", help="catalog size instead of the scaled-down test model")
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--plans", default=",".join(PLANS))
    ap.add_argument("--no-reshape", action="store_true")
    ap.add_argument("--out", default="results/bench_runners.json")
    args = ap.parse_args()
    rows, reshapes = [], []
    try:
        with tempfile.TemporaryDirectory(prefix="bench-runners-") as tmp:
            work = Path(tmp)
            for name in args.plans.split(","):
                rows.append(bench_plan(work, name, args))
                print(json.dumps(rows[-1]), flush=True)
            if not args.no_reshape:
                for a, b in RESHAPES:
                    reshapes.append(bench_reshape(work, a, b, args))
                    print(json.dumps(reshapes[-1]), flush=True)
    finally:
        kill_all()
    print(f"\n{'plan':10s} {'procs':>5s} {'first step s':>12s} {'steps/s':>8s} {'exit s':>7s}")
    for r in rows:
        if "error" in r:
            print(f"{r['plan']:10s} error: {r['error']}")
            continue
        print(f"{r['plan']:10s} {r['world_size']:5d} {r['first_step_s']:12.1f} {r['steps_per_s']:8.1f} {r['exit_s']:7.1f}")
    if reshapes:
        print(f"\n{'reshape':16s} {'total':>6s} {'to step':>8s} {'save':>5s} {'exit':>5s} {'restart':>8s} {'load':>5s} {'1st step':>8s}")
        for r in reshapes:
            print(f"{r['reshape']:16s} {r['total_s']:6.1f} {r['to_step_boundary_s']:8.2f} {r['save_s']:5.2f} "
                  f"{r['process_exit_s']:5.1f} {r['restart_s']:8.1f} {r['load_s']:5.2f} {r['first_step_s']:8.2f}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"host": platform.node(), "cpus": os.cpu_count(), "model": args.model,
                               "full": args.full, "batch": args.batch, "plans": rows, "reshapes": reshapes,
                               "load_avg_1m": os.getloadavg()[0]}, indent=1))
    print(f"\nwritten to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
