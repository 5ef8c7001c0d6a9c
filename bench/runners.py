"""Runner benchmarks on this host (not timed tests): time to first step per
plan and world size, steps/s per plan, reshape time split into save, process
exit, restart and load; and for faults: recovery time after kill -9 of a rank
(torchrun's in-place restart vs the scheduler's relaunch), steps lost per fault
kind, and what checkpointing costs as a share of training time at the default
interval (--ckpt-every-s of `arena-opt run`, runners.spec.DEFAULT_CKPT_EVERY_S).

    .venv/bin/python bench/runners.py                       # CPU, scaled-down gpt-350M
    .venv/bin/python bench/runners.py --faults-only --out-dir bench/results   # the fault part only
    .venv/bin/python bench/runners.py --model llama-7B --full --device cuda   # on a GPU host

Writes a JSON report (default results/bench_runners.json) and prints a table;
--out-dir writes runners.json + runners.md (machine, command, commit) instead.
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
from runners.spec import DEFAULT_CKPT_EVERY_S, Scale  # noqa: E402
from runners import checkpoint as ck  # noqa: E402
from arena_opt.io import write_json  # noqa: E402
from _provenance import command, git_rev, machine, write_result  # noqa: E402

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


def _spec(job: str, args, steps: int = 100_000, delay: float = 0.0) -> JobSpec:
    return JobSpec(job_id=job, model=args.model, global_batch=args.batch, total_steps=steps,
                   scale=None if args.full else Scale(), step_delay_s=delay)


def bench_fault(work: Path, kind: str, args) -> dict:
    """One fault on a dp2 job that checkpoints every 2 steps; recovery = fault -> first step after it."""
    in_place = kind == "kill -9 rank, in place"
    job = f"fault{FAULTS.index(kind)}"
    # node_recheck_s=0: a torchrun killed alone on its node counts as that node's loss locally; the
    # probe then finds it back at once, so this measures the relaunch, not the probe interval
    with LocalRunner(work / job, device=args.device, ckpt_interval=2, keep_checkpoints=3,
                     max_restarts=1 if in_place else 0, node_recheck_s=0.0) as r:
        r.add_job(_spec(job, args, delay=0.2))
        r.apply(_decision(job, PLANS["dp2"], "start"))
        _wait(r, job, lambda s: (s.last_checkpoint_step or 0) >= 6 and r.worker_pids(job))
        h = r.jobs[job].handle
        if kind.startswith("kill -9 torchrun"):
            pid = h.procs[0].pid
        else:
            pid = max(h.worker_pids())
        t_fault = time.time()
        os.kill(pid, 9)
        if in_place:
            _wait(r, job, lambda s: any(e["event"] == "start" and e.get("restart") for e in r.events(job)))
        else:
            _wait(r, job, lambda s: s.state == "crashed")
            best = {o.job_id: o for o in r.status()}[job].step
            if kind.endswith("newest checkpoint corrupted"):
                newest = ck.committed(r.jobs[job].ckpt_dir)[0][1]
                shard = sorted(newest.glob("*.distcp"))[0]
                shard.write_bytes(b"\0" * shard.stat().st_size)
            r.apply(_decision(job, PLANS["dp2"], "keep"))
        def resumed(s) -> bool:
            ev = r.events(job)
            starts = [i for i, e in enumerate(ev) if e["event"] == "start"]
            return len(starts) >= 2 and any(e["event"] == "step" for e in ev[starts[1]:])

        _wait(r, job, resumed)
        ev = r.events(job)
        starts = [i for i, e in enumerate(ev) if e["event"] == "start"]
        before = max(e["step"] for e in ev[:starts[1]] if e["event"] == "step")
        if not in_place:
            before = max(before, best)
        first = next(e for e in ev[starts[1]:] if e["event"] == "step")
        r.shutdown(save=False)
    return {"fault": kind, "recovery_s": first["time"] - t_fault, "resumed_step": ev[starts[1]]["step"],
            "step_at_fault": before, "steps_lost": before - ev[starts[1]]["step"],
            "ckpt_skipped": sum(1 for e in ev if e["event"] == "ckpt_skipped")}


def bench_ckpt_cost(work: Path, args) -> dict:
    """Train for `--ckpt-run-s` seconds at the default time interval: share of the wall spent saving."""
    job = "ckpt"
    with LocalRunner(work / job, device=args.device, ckpt_every_s=args.ckpt_every_s) as r:
        r.add_job(_spec(job, args))
        r.apply(_decision(job, PLANS["dp2"], "start"))
        _wait(r, job, lambda s: s.step >= 1)
        time.sleep(args.ckpt_run_s)
        r.stop(job)  # saves once more on the way out
        ev = r.events(job)
        newest = ck.committed(r.jobs[job].ckpt_dir)[0][1]
        size = sum(f.stat().st_size for f in newest.rglob("*") if f.is_file())
    steps = [e for e in ev if e["event"] == "step"]
    saves = [e["save_s"] for e in ev if e["event"] == "checkpoint"]
    periodic = saves[:-1]  # the last one is the stop's
    wall = steps[-1]["time"] - steps[0]["time"] + steps[0]["iter_time_s"]
    return {"interval_s": args.ckpt_every_s, "train_wall_s": wall, "steps": len(steps),
            "periodic_saves": len(periodic), "save_s_mean": statistics.mean(periodic) if periodic else None,
            "save_s_max": max(periodic) if periodic else None,
            "share_of_training": sum(periodic) / wall if periodic else None,
            "share_at_interval": statistics.mean(periodic) / args.ckpt_every_s if periodic else None,
            "ckpt_mb": size / 2**20}


FAULTS = ["kill -9 rank, in place", "kill -9 rank, relaunch", "kill -9 torchrun, relaunch",
          "kill -9 torchrun, relaunch, newest checkpoint corrupted"]


def _fault_markdown(meta: dict, faults: list[dict], cost: dict | None) -> str:
    out = [f"# Runner faults\n\nCommand: `{meta['command']}`  \nCommit: {meta['commit']}  \n"
           f"Machine: {meta['machine'].get('cpu_model', meta['machine']['processor'])}, {meta['machine']['cpus']} CPUs, "
           f"torch {meta['machine'].get('torch')}; load average {meta['load_avg_1m']:.1f} at the end.  \n"
           f"Job: {meta['model']} ({'full' if meta['full'] else 'scaled'}), batch {meta['batch']}, dp2 on gloo, "
           "checkpoint every 2 steps, 0.2 s pause per step. A torchrun killed alone on its node counts as the "
           "node's loss locally (probe at once here).\n",
           "| fault | recovery s (fault -> first step) | step at fault | resumed at | steps lost | checkpoints skipped |",
           "|---|---:|---:|---:|---:|---:|"]
    for f in faults:
        out.append(f"| {f['fault']} | {f['recovery_s']:.1f} | {f['step_at_fault']} | {f['resumed_step']} | "
                   f"{f['steps_lost']} | {f['ckpt_skipped']} |")
    if cost:
        out += ["", f"Checkpoint cost at --ckpt-every-s {cost['interval_s']:g} (dp2, no pause, "
                f"{cost['train_wall_s']:.0f} s of training, {cost['steps']} steps, {cost['ckpt_mb']:.1f} MB per checkpoint): "
                f"{cost['periodic_saves']} periodic "
                f"saves, {cost['save_s_mean']:.2f} s mean ({cost['save_s_max']:.2f} s max), "
                f"{100 * cost['share_of_training']:.1f}% of training time measured, "
                f"{100 * cost['share_at_interval']:.1f}% as mean save / interval."
                if cost["periodic_saves"] else f"Checkpoint cost: no periodic save in {cost['train_wall_s']:.0f} s."]
    return "\n".join(out) + "\n"


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
    ap.add_argument("--out-dir", help="write runners.json and runners.md here (e.g. bench/results)")
    ap.add_argument("--faults-only", action="store_true", help="only the fault and checkpoint-cost part")
    ap.add_argument("--no-faults", action="store_true")
    ap.add_argument("--ckpt-every-s", type=float, default=DEFAULT_CKPT_EVERY_S)
    ap.add_argument("--ckpt-run-s", type=float, default=75.0, help="training seconds of the checkpoint-cost run")
    args = ap.parse_args()
    if args.faults_only:
        args.plans, args.no_reshape = "", True
    rows, reshapes, faults, cost = [], [], [], None
    try:
        with tempfile.TemporaryDirectory(prefix="bench-runners-") as tmp:
            work = Path(tmp)
            if not args.no_faults:
                for kind in FAULTS:
                    faults.append(bench_fault(work, kind, args))
                    print(json.dumps(faults[-1]), flush=True)
                cost = bench_ckpt_cost(work, args)
                print(json.dumps(cost), flush=True)
            for name in filter(None, args.plans.split(",")):
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
    meta = {"command": command(), "commit": git_rev(), "machine": machine(), "host": platform.node(),
            "model": args.model, "full": args.full, "batch": args.batch, "load_avg_1m": os.getloadavg()[0]}
    payload = {**meta, "plans": rows, "reshapes": reshapes, "faults": faults, "ckpt_cost": cost}
    if args.out_dir:
        out = Path(args.out_dir) / "runners.json"
        write_result(out, payload, _fault_markdown(meta, faults, cost))
    else:
        out = Path(args.out)
        write_json(out, payload)
    if faults:
        print("\n" + _fault_markdown(meta, faults, cost))
    print(f"\nwritten to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
