"""Composed estimate (single-process layer profiles + collective fits) vs direct multi-process
measurement of the runners' training step, on this host's CPUs (gloo), for 1, 2 and 4 processes
and every (pp, dp, tp) plan shape that fits each model.

    python bench/estimator_accuracy.py [--out bench/results] [--steps 5] [--warmup 1] [--rounds 3]
                                       [--models gpt-350M,moe-690M,...]

Per model: profile its layers (`arena_opt.profiling.layers`, one thread, CPU-time clock; tp and FSDP2
samples as the runtime wraps the layer, on a fake process group; the micro-batch sizes and shapes the
plans run), benchmark the collectives (wall and per-rank CPU time) over 2 and 4 processes once, then
run every plan (all models' plans of one world size in one launch) with
`arena_opt.profiling.measure` (`runners.parallelize`: DDP, FSDP2, DTensor tp, 1F1B pipelining; one
thread per rank like the profiler) and compare with `arena_opt.perf.profile_costs.plan_time`
(processor-sharing run of the schedule on this host's cores). Nothing is fitted to the measured
plans: every term comes from the per-layer profiles and the collective micro-benchmarks. A measured
plan time is the median step after warm-up; the least disturbed step (minimum) is reported too,
since the host may be shared with other work. With --rounds R every world size is launched R times,
rounds interleaved over the world sizes (the host's drift falls on each alike): a plan's time is the
median of its rounds' medians, its spread (max - min) / median over the rounds is the measurement's
own repeatability, reported beside the error, with the load average (1, 5, 15 min) of every launch.
--pin pins rank r to core r mod cores (`measure(pin=True)`). Writes estimator_accuracy.json and .md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

_HERE = Path(__file__).resolve().parent
# run as `python bench/X.py`, bench/ comes first on sys.path and bench/runners.py would shadow the
# runners package: the repository root goes first, bench/ last
if sys.path and Path(sys.path[0]).resolve() == _HERE:
    sys.path.append(sys.path.pop(0))
sys.path.insert(0, str(_HERE.parent))

from _perf_common import command, err_stats, err_table, fmt_pct, git_rev, machine, md_table, write

from arena_opt.plan import Plan
from arena_opt.profiling import commbench
from arena_opt.perf import profile_costs as pc
from arena_opt.perf import profile_db as pdb
from arena_opt.profiling.layers import cpu_cores, profile_model
from arena_opt.profiling.measure import Case, measure_each
from arena_opt.profiling.speed import contention
from models.catalog import get_arch
from models.layers import layer_table
from models.torch_layers import scaled_arch
from arena_opt.stages import PlanError, check_plan

# sizes where a step takes a fraction of a second to seconds on one core: compute, not Python
# dispatch, dominates, as on GPUs
SCALES = {
    "gpt-350M": dict(max_hidden=256, max_layers=6, seq_len=128, max_heads=4, max_vocab=2048),
    "moe-690M": dict(max_hidden=128, max_layers=4, seq_len=128, max_heads=4, max_vocab=2048, max_experts=4),
    "wide_resnet-1B": dict(max_channels=16, max_width_factor=2, image_size=64, num_classes=10),
}
BATCH = 16


def log(msg: str) -> None:
    print(f"[accuracy] {msg}", file=sys.stderr, flush=True)


def plans_for(arch, world: int) -> list[Plan]:
    """Every (pp, dp, tp) with pp*dp*tp = world the runners accept; m = 2 (gradient accumulation)
    without pipelining, 2*pp micro-batches with it."""
    n_layers = layer_table(arch).num_layers
    out = []
    for pp in (1, 2, 4):
        for tp in (1, 2, 4):
            if world % (pp * tp) or pp > n_layers:
                continue
            dp = world // (pp * tp)
            m = 2 if pp == 1 else 2 * pp
            if BATCH % (dp * m):
                continue
            plan = Plan(pp=pp, dp=dp, tp=tp, num_microbatches=m)
            try:
                stages = check_plan(arch, plan)
            except PlanError:
                continue
            out.append(plan.model_copy(update={"stages": stages}) if pp > 1 else plan)
    return out


def micro_batches(plans) -> tuple[int, ...]:
    """The micro-batch sizes `plans` run at (global batch / (dp x micro-batches))."""
    return tuple(sorted({BATCH // (p.dp * p.num_microbatches) for p in plans}))


def cpu_work(prof, plan: Plan, comm, topo, scale: float = 1.0, stack: bool = False) -> float:
    """CPU seconds all ranks of a plan spend per step in the composition (layers, collectives' CPU
    time, optimizer; compute times `scale`; `stack`: with the profile's whole-stack correction): checked
    against the ranks' measured CPU time, it tells compute terms apart from scheduling."""
    from arena_opt.stages import default_stages

    p = pc.layer_parts(prof, comm, topo, batch=BATCH, dp=plan.dp, tp=plan.tp, m=plan.num_microbatches,
                       pp=plan.pp, recompute=plan.recompute, stack=stack)
    per_mb = scale * (p.fwd_s + p.bwd_s) + p.comm_cpu_fwd_s + p.comm_cpu_bwd_s
    stages = list(plan.stages) or default_stages(prof.arch, plan.pp)
    return plan.dp * plan.tp * sum(plan.num_microbatches * per_mb[a:e].sum() + scale * p.tail_cpu_s[a:e].sum()
                                   + p.dp_cpu_s[a:e].sum() + p.call_s for a, e in stages)


def evaluate(prof, plan: Plan, r: dict, comm, topo, contention_k: float = 1.0) -> dict:
    """One measured plan against its estimates: on a dedicated host, at the run's host speed (speed
    probe), with the contention micro-benchmark's slowdown, and on the host as the run found it (speed
    and the share of a core its computing ranks got, as other tenants' runnable tasks in the
    processor-sharing schedule: `profile_costs.host_background`); CPU work against the ranks' step CPU."""
    w = plan.num_gpus
    meas = r["iter_s"]
    est = pc.plan_time(prof, plan, BATCH, comm, topo).iter_time_s
    speed = r["probe_s"] / prof.probe_s  # the profile's compute at the host speed the run's probe saw
    est_speed = pc.plan_time(prof, plan, BATCH, comm, topo, compute_scale=speed).iter_time_s
    est_cont = pc.plan_time(prof, plan, BATCH, comm, topo, compute_scale=contention_k).iter_time_s
    share = r.get("host_share")
    bg = pc.host_background(prof, plan, BATCH, comm, topo, share, speed) if share else 0.0
    est_host = pc.plan_time(prof, plan, BATCH, comm, replace(topo, background=bg), compute_scale=speed).iter_time_s
    est_cpu, est_cpu_speed = cpu_work(prof, plan, comm, topo), cpu_work(prof, plan, comm, topo, speed)
    est_cpu_stack = cpu_work(prof, plan, comm, topo, stack=True)
    meas_cpu = r.get("step_cpu_s") or r["own_cpu_step_s"]  # old runs: the window's CPU, probes included
    return {"arch": prof.arch.name, "world": w, "plan": plan.describe(), "stages": plan.stages,
            "estimate_s": est, "measured_s": meas, "measured_min_s": min(r["times"]), "steps_s": r["times"],
            "round_s": r["round_s"], "spread": r["spread"], "cpu_share": meas_cpu / (meas * min(w, topo.cores)),
            "other_runnable": r.get("ambient_runnable") or 0.0, "other_cores_busy": r.get("ambient_cores"),
            "rel_err": est / meas - 1, "rel_err_min": est / min(r["times"]) - 1,
            "host_share": share, "host_background": bg, "estimate_host_s": est_host,
            "rel_err_host": est_host / meas - 1,
            "estimate_cpu_s": est_cpu, "measured_cpu_s": meas_cpu, "rel_err_cpu": est_cpu / meas_cpu - 1,
            "estimate_cpu_stack_s": est_cpu_stack, "rel_err_cpu_stack": est_cpu_stack / meas_cpu - 1,
            "speed_ratio": speed, "estimate_speed_s": est_speed, "rel_err_speed": est_speed / meas - 1,
            "rel_err_cpu_speed": est_cpu_speed / meas_cpu - 1,
            "contention": contention_k, "estimate_contended_s": est_cont, "rel_err_contended": est_cont / meas - 1}


def combine(runs: list[dict]) -> dict:
    """One plan's rounds as one measurement: the median of the rounds' median steps (`round_s`, their
    spread (max - min) / median), every timed step, and the rounds' medians of the per-step CPU time of
    all ranks, the speed probe and the other tenants' load; a plan failed in every round: its error."""
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return runs[0]
    med = statistics.median
    rounds = [r["iter_s"] for r in ok]

    def of(key):
        vals = [r[key] for r in ok if r.get(key) is not None]
        return med(vals) if vals else None

    def round_share(r):  # the compute threads' on-CPU time over on-CPU plus run-queue delay, pooled
        run, wait = sum(r.get("step_main_cpu_s") or []), sum(r.get("step_wait_s") or [])
        return run / (run + wait) if run > 0 and wait == wait else None

    shares = [x for r in ok if (x := round_share(r)) is not None]
    step_cpu = [statistics.fmean(r["step_cpu_s"]) for r in ok if r.get("step_cpu_s")]
    return {"iter_s": med(rounds), "round_s": rounds, "spread": (max(rounds) - min(rounds)) / med(rounds),
            "host_share": med(shares) if shares else None, "step_cpu_s": med(step_cpu) if step_cpu else None,
            "times": [t for r in ok for t in r["times"]], "own_cpu_step_s": med(r["own_cpu_s"] / len(r["times"])
                                                                                 for r in ok),
            "probe_s": of("probe_s"), "ambient_runnable": of("ambient_runnable"), "ambient_cores": of("ambient_cores")}


def loadavg() -> float:
    try:
        return os.getloadavg()[0]
    except OSError:
        return float("nan")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    ap.add_argument("--models", default=",".join(SCALES))
    ap.add_argument("--worlds", default="1,2,4")
    ap.add_argument("--steps", type=int, default=5)
    # one: only a plan's first step stood out (DTensor / FSDP2 caches, allocator: up to 3x the median at load
    # 4-9); the second was within the step-to-step spread of the later ones
    ap.add_argument("--warmup", type=int, default=1, help="untimed steps per plan")
    ap.add_argument("--repeats", type=int, default=5, help="profiler repeats per layer shape")
    ap.add_argument("--rounds", type=int, default=3, help="launches per world size (median over them)")
    ap.add_argument("--pin", action="store_true", help="pin rank r to core r mod cores")
    args = ap.parse_args(argv)
    t_start = time.perf_counter()
    cores = cpu_cores()
    worlds = [int(w) for w in args.worlds.split(",")]
    la_start = loadavg()
    log(f"{cores} CPU cores, load average {la_start:.1f}")

    t0 = time.perf_counter()
    points = commbench.run(tuple(w for w in worlds if w > 1), repeats=7, progress=log)
    db = pdb.ProfileDB()
    for f in commbench.fit(points, "cpu", "gloo", "loopback", cores=cores):
        db.put_comm(f)
    comm_s = time.perf_counter() - t0
    # ranks slow each other's compute through what they share; measured with the speed probe alone
    t0 = time.perf_counter()
    probe_runs = defaultdict(list)
    for k in sorted({1, *worlds}):
        probe_runs[k].append(contention(k))
    probe_k = {k: statistics.median(v) for k, v in probe_runs.items()}
    slowdown_k = {k: v / probe_k[1] for k, v in probe_k.items()}
    contention_s = time.perf_counter() - t0
    log("compute slowdown of k processes at once: " + ", ".join(f"{k}: x{v:.2f}" for k, v in slowdown_k.items()))
    comm = pc.comm_model(db, "cpu")
    topo = pc.Topology(intra="loopback", cores=cores)

    rows, failed = [], []
    profile_s, profiles, plans = {}, {}, {}
    max_world = max(worlds)
    for name in args.models.split(","):
        arch = scaled_arch(get_arch(name), **SCALES[name])
        plans[name] = {w: plans_for(arch, w) for w in worlds}
        t0 = time.perf_counter()
        # only the micro-batch sizes and (tp, dp) shapes the plans run: the estimate reads no other sample
        profiles[name] = prof = profile_model(
            arch, micro_batches=micro_batches(p for ps in plans[name].values() for p in ps),
            tp_degrees=(1, 2, 4), dp_degrees=(2,), max_ranks=max_world, repeats=args.repeats, warmup=2,
            threads=1, whole_stack=True, progress=None)
        profile_s[name] = time.perf_counter() - t0
        db.put_model(prof)
        log(f"{arch.name}: profiled in {profile_s[name]:.0f} s")
    # one launch per round and world size runs every model's plans (a launch costs ~10 s of interpreter and
    # gloo start on 2 cores); rounds interleaved over the world sizes, so the host's drift falls on each alike
    runs: dict[int, list[list[dict]]] = defaultdict(list)
    loads: dict[int, list[tuple]] = defaultdict(list)
    for rnd in range(args.rounds):
        for w in worlds:
            cases = [Case(profiles[n].arch, p, BATCH) for n in plans for p in plans[n][w]]
            if not cases:
                continue
            loads[w].append(os.getloadavg())
            t0 = time.perf_counter()
            runs[w].append(measure_each(cases, steps=args.steps, warmup=args.warmup, pin=args.pin))
            log(f"round {rnd + 1}: {len(cases)} plans on {w} processes measured in "
                f"{time.perf_counter() - t0:.0f} s, load average {loads[w][-1][0]:.1f}")
    for w in worlds:
        if not runs[w]:
            continue
        la = statistics.median(x[0] for x in loads[w])
        cases = [(n, p) for n in plans for p in plans[n][w]]
        for (name, plan), r in zip(cases, (combine(list(rs)) for rs in zip(*runs[w]))):
            prof = profiles[name]
            if "error" in r:
                failed.append({"model": name, "arch": prof.arch.name, "world": w, "plan": plan.describe(),
                               "error": r["error"]})
                log(f"  {plan.describe():22s} failed to run: {r['error']}")
                continue
            rows.append(evaluate(prof, plan, r, comm, topo, slowdown_k[w]))
            rows[-1].update(model=name, load_avg=la, load_avgs=loads[w])
            log(f"  {prof.arch.name} {plan.describe():22s} est {rows[-1]['estimate_s']:.3f} s, meas "
                f"{r['iter_s']:.3f} s (min {min(r['times']):.3f}), err {fmt_pct(rows[-1]['rel_err'])}; speed "
                f"x{rows[-1]['speed_ratio']:.2f}, host share {fmt_pct(rows[-1]['host_share'])} (background "
                f"{rows[-1]['host_background']:.1f}): est {rows[-1]['estimate_host_s']:.3f} s, err "
                f"{fmt_pct(rows[-1]['rel_err_host'])}; CPU est {rows[-1]['estimate_cpu_s']:.3f} / meas "
                f"{rows[-1]['measured_cpu_s']:.3f} s")
    rows.sort(key=lambda r: (list(plans).index(r["model"]), r["world"]))

    by_world = defaultdict(list)
    by_world_min = defaultdict(list)
    by_world_load = defaultdict(list)
    by_world_cpu = defaultdict(list)
    by_world_cpu_stack = defaultdict(list)
    by_world_speed = defaultdict(list)
    by_world_cpu_speed = defaultdict(list)
    by_world_cont = defaultdict(list)
    spread_by_world, share_by_world = defaultdict(list), defaultdict(list)
    for r in rows:
        spread_by_world[r["world"]].append(r["spread"])
        share_by_world[r["world"]].append(r["cpu_share"])
        by_world_cont[r["world"]].append(r["rel_err_contended"])
        by_world_speed[r["world"]].append(r["rel_err_speed"])
        by_world_cpu_speed[r["world"]].append(r["rel_err_cpu_speed"])
        by_world_cpu[r["world"]].append(r["rel_err_cpu"])
        by_world_cpu_stack[r["world"]].append(r["rel_err_cpu_stack"])
        by_world[r["world"]].append(r["rel_err"])
        by_world_min[r["world"]].append(r["rel_err_min"])
        by_world_load[r["world"]].append(r["rel_err_host"])
    payload = {"command": command(), "git": git_rev(), "machine": machine(), "cores": cores,
               "seconds": time.perf_counter() - t_start, "comm_bench_s": comm_s, "profile_s": profile_s,
               "batch": BATCH, "scales": SCALES,
               "per_world": {str(w): err_stats(v) for w, v in sorted(by_world.items())},
               "per_world_vs_min_step": {str(w): err_stats(v) for w, v in sorted(by_world_min.items())},
               "per_world_host": {str(w): err_stats(v) for w, v in sorted(by_world_load.items())},
               "per_world_cpu": {str(w): err_stats(v) for w, v in sorted(by_world_cpu.items())},
               "per_world_cpu_stack": {str(w): err_stats(v) for w, v in sorted(by_world_cpu_stack.items())},
               "stack_ratio": {n: {s.micro_batch: s.stack_s / s.layers_s for s in pr.stack}
                               for n, pr in profiles.items()},
               "per_world_speed": {str(w): err_stats(v) for w, v in sorted(by_world_speed.items())},
               "per_world_cpu_speed": {str(w): err_stats(v) for w, v in sorted(by_world_cpu_speed.items())},
               "per_world_contended": {str(w): err_stats(v) for w, v in sorted(by_world_cont.items())},
               "contention": {str(k): v for k, v in slowdown_k.items()}, "contention_probe_s": probe_runs,
               "contention_bench_s": contention_s,
               "load_avg_start": la_start, "load_avg_end": loadavg(), "steps": args.steps, "warmup": args.warmup,
               "rounds": args.rounds, "pin": args.pin,
               "spread_per_world": {str(w): {"median": statistics.median(v), "max": max(v)} for w, v in
                                    sorted(spread_by_world.items())},
               "cpu_share_per_world": {str(w): statistics.median(v) for w, v in sorted(share_by_world.items())},
               "all": err_stats([r["rel_err"] for r in rows]), "rows": rows, "failed": failed,
               "comm_fits": [f.model_dump(exclude={"points", "cpu_points"}) for f in db.comm]}
    args.out.mkdir(parents=True, exist_ok=True)
    pdb.save(db, args.out / "estimator_accuracy_profiles.json")
    md = render(payload)
    jp, mp = write(args.out, "estimator_accuracy", payload, md,
                   written=[args.out / "estimator_accuracy_profiles.json"])
    print(md)
    log(f"wrote {jp} and {mp}")
    return 0


def render(p: dict) -> str:
    m = p["machine"]
    out = ["# Composed estimate vs direct multi-process measurement (CPU, gloo)\n",
           f"Command: `{p['command']}` (git {p['git']}), {p['seconds']:.0f} s on {m.get('cpu_model', m['processor'])}"
           f" ({p['cores']} cores; load average {p['load_avg_start']:.1f} at the start, {p['load_avg_end']:.1f} at "
           f"the end), torch {m.get('torch')}. Global batch {p['batch']}; {p['warmup']} warm-up and {p['steps']} "
           "timed steps per plan.\n",
           "Estimate (`arena_opt.perf.profile_costs.plan_time`), every term measured on one process or by a "
           "micro-benchmark, nothing fitted to the plans below: per-layer forward/backward (one thread, CPU-time "
           "clock, fresh inputs per repeat; the last layer with the loss; tp > 1 through the runtime's DTensor "
           "sharding and FSDP2 (dp 2) samples through `fully_shard`, both on a fake process group), optimizer "
           "step per layer and its fixed per-call cost once per stage, gloo collectives as alpha-beta fits of "
           "wall time and of per-rank CPU time, and the 1F1B schedule run as processor sharing of the host's "
           "cores (ranks computing, or spending CPU in a collective, share the cores; waiting ranks do not). "
           "Measured: `runners.parallelize` training step (forward, backward, gradient sync, AdamW), slowest "
           "rank, median of the timed steps.\n",
           f"Profiling took {', '.join(f'{k} {v:.0f} s' for k, v in p['profile_s'].items())}; "
           f"the collective benchmark {p['comm_bench_s']:.0f} s.\n",
           "## On the host as the run found it (estimate / measured median - 1)\n",
           "The host is shared with other tenants, who take cores from the ranks for a varying part of every step. "
           "Every rank reads the kernel's scheduler accounting (`/proc/thread-self/schedstat`) of its compute "
           "thread around each timed step: its on-CPU time and its run-queue delay (runnable, but every core busy). "
           "Their ratio, on-CPU / (on-CPU + delay) pooled over a round's steps and ranks, is the share of a core a "
           "computing rank got (column `host share`; median over the rounds). The estimate is placed on that host: "
           "compute at the run's speed (speed probe, below), and other tenants' runnable tasks in the "
           "processor-sharing schedule as many as make a computing rank's share in the schedule equal the measured "
           "one (`profile_costs.host_background`, column `bg`; 0 where the ranks got what they get alone). Nothing "
           "is fitted to the step time: the share is a separate kernel counter, and the ranks' own sharing of the "
           "cores (4 ranks on 2 cores), their waits on each other and on collectives stay the schedule's.\n",
           err_table(p["per_world_host"]),
           "\n## On a dedicated host (estimate / measured median - 1)\n",
           "The estimate as the planner sees it (profile speed, no other tenants) against the same measurements: "
           "what this host's other tenants cost the runs.\n",
           err_table(p["per_world"]),
           f"\nRepeatability ({p.get('rounds', 1)} launches per world size, interleaved; pinned: "
           f"{'yes' if p.get('pin') else 'no'}): spread (max - min) / median of a plan's round medians, and the "
           "share of the cores the ranks' CPU time filled (CPU s per step / (wall s x min(ranks, cores))): "
           "below 1 the ranks waited, for each other or for the other tenants' processes.\n",
           md_table(["processes", "median spread", "max spread", "median CPU share"],
                    [[w, fmt_pct(v["median"]), fmt_pct(v["max"]), fmt_pct(p["cpu_share_per_world"][w])]
                     for w, v in p.get("spread_per_world", {}).items()]),
           "\nWith the contention micro-benchmark (a prediction: every rank's compute scaled by the speed "
           "probe's slowdown when as many processes as the plan has ranks run it at once, "
           "`arena_opt.profiling.speed.contention`; measured before any plan runs: "
           + ", ".join(f"{k} processes x{v:.2f}" for k, v in p["contention"].items()) + "):\n",
           err_table(p["per_world_contended"]),
           "\nAt the run's host speed: the host's speed drifts (other tenants; `bench/speed_drift.py`), so the "
           "profiler times a speed probe (`arena_opt.profiling.speed`) before every repeat and stores every layer "
           "at the profile's median probe time, every rank times the same probe before each timed step, and the estimate's compute is scaled by the ratio of the two "
           "probe times (column `speed` below); collectives are not scaled:\n",
           err_table(p["per_world_speed"]),
           "\nCPU work at the run's host speed (all ranks' CPU seconds per step, estimated vs measured):\n",
           err_table(p["per_world_cpu_speed"]),
           "\nCPU work (all ranks' CPU seconds per step, estimated vs measured: every thread's on-CPU time over the "
           "timed step (speed probes and barriers outside it), from the same scheduler accounting): separates the compute terms from scheduling:\n",
           err_table(p["per_world_cpu"]),
           "\nCPU work with the whole-stack correction (`layer_parts(stack=True)`: every layer's forward and "
           "backward times the profile's whole model over the sum of its layers at the plan's micro-batch size, "
           "measured by the profiler, nothing fitted to the plans; off in the planner's estimate): "
           + "; ".join(f"{n} " + ", ".join(f"mb {b} x{k:.2f}" for b, k in sorted(v.items(), key=lambda x: int(x[0])))
                       for n, v in p.get("stack_ratio", {}).items()) + ":\n",
           err_table(p["per_world_cpu_stack"]),
           "\nAgainst the least disturbed (minimum) step:\n",
           err_table(p["per_world_vs_min_step"]),
           "\n## Every plan\n",
           md_table(["model", "processes", "plan", "estimate s", "measured s (median)", "min step s",
                     "error", "host share", "bg", "on the host s", "error on the host", "with contention s",
                     "error with contention", "speed",
                     "at run speed s", "error at run speed", "other runnable", "CPU s est / meas", "spread",
                     "CPU share"],
                    [[r["arch"], r["world"], r["plan"], f"{r['estimate_s']:.3f}",
                      f"{r['measured_s']:.3f}", f"{r['measured_min_s']:.3f}", fmt_pct(r["rel_err"]),
                      fmt_pct(r["host_share"]), f"{r['host_background']:.1f}", f"{r['estimate_host_s']:.3f}",
                      fmt_pct(r["rel_err_host"]), f"{r['estimate_contended_s']:.3f}", fmt_pct(r["rel_err_contended"]),
                      f"x{r['speed_ratio']:.2f}", f"{r['estimate_speed_s']:.3f}",
                      fmt_pct(r["rel_err_speed"]), f"{r['other_runnable']:.1f}",
                      f"{r['estimate_cpu_s']:.2f} / {r['measured_cpu_s']:.2f}", fmt_pct(r.get("spread")),
                      fmt_pct(r.get("cpu_share"))] for r in p["rows"]]),
           "\nPlans the runners could not run: " + ("none" if not p["failed"] else "; ".join(
               f"{f['arch']} {f['plan']} on {f['world']} ({f['error'][-240:]})" for f in p["failed"])) + "\n",
           "\n## Collective fits (gloo, loopback)\n",
           md_table(["collective", "group", "alpha us", "GB/s", "mean fit error", "CPU alpha us", "CPU GB/s",
                     "CPU fit error"],
                    [[c["collective"], c["group"] or "all", f"{1e6 * c['alpha_s']:.0f}",
                      f"{c['bandwidth_bps'] / 1e9:.2f}", fmt_pct(c["mean_rel_err"]),
                      "-" if c.get("cpu_alpha_s") is None else f"{1e6 * c['cpu_alpha_s']:.0f}",
                      "-" if c.get("cpu_bandwidth_bps") is None else f"{c['cpu_bandwidth_bps'] / 1e9:.2f}",
                      fmt_pct(c.get("cpu_mean_rel_err"))] for c in p["comm_fits"]]),
           ]
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
