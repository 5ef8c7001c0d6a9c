"""Co-located jobs on one host: predicted vs observed slowdown of two training jobs that run at
the same time and share this machine's CPU cores.

    python bench/colocation.py [--out bench/results] [--steps 6]

For each pair: profile both models, measure each job alone, then both at once (two launches of
`arena_opt.profiling.measure` started together). Observed slowdown = iteration time together /
alone. Predicted: `arena_opt.perf.sharing` with each job's iteration time and per-rank
compute time from its profile composition, the other job as co-located load, and the load of
other tenants of the host measured during each run (runnable tasks that are not ours) as background.
Writes colocation.json and colocation.md.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

_HERE = Path(__file__).resolve().parent
if sys.path and Path(sys.path[0]).resolve() == _HERE:
    sys.path.append(sys.path.pop(0))
sys.path.insert(0, str(_HERE.parent))

from _perf_common import command, fmt_pct, git_rev, machine, md_table, write  # noqa: E402

from arena_opt.plan import Plan  # noqa: E402
from arena_opt.perf import sharing as co  # noqa: E402
from arena_opt.profiling import commbench  # noqa: E402
from arena_opt.perf import profile_costs as pc  # noqa: E402
from arena_opt.perf import profile_db as pdb  # noqa: E402
from arena_opt.profiling.layers import cpu_cores, profile_model  # noqa: E402
from arena_opt.profiling.measure import Case, measure  # noqa: E402
from models.catalog import get_arch  # noqa: E402
from models.torch_layers import scaled_arch  # noqa: E402

BATCH = 16
JOBS = {
    "gpt-dp1": ("gpt-350M", dict(max_hidden=256, max_layers=4, seq_len=128, max_vocab=2048), Plan(num_microbatches=2)),
    "moe-dp1": ("moe-690M", dict(max_hidden=128, max_layers=4, seq_len=128, max_vocab=2048),
                Plan(num_microbatches=2)),
    "gpt-dp2": ("gpt-350M", dict(max_hidden=256, max_layers=4, seq_len=128, max_vocab=2048),
                Plan(dp=2, num_microbatches=2)),
    "moe-pp2": ("moe-690M", dict(max_hidden=128, max_layers=4, seq_len=128, max_vocab=2048),
                Plan(pp=2, num_microbatches=4)),
}
PAIRS = [("gpt-dp1", "moe-dp1"), ("gpt-dp2", "moe-pp2")]


def log(msg: str) -> None:
    print(f"[colocation] {msg}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    ap.add_argument("--steps", type=int, default=6)
    args = ap.parse_args(argv)
    t_start = time.perf_counter()
    cores = cpu_cores()
    db = pdb.ProfileDB()
    for f in commbench.fit(commbench.run((2,), repeats=7, progress=log), "cpu", "gloo", "loopback"):
        db.put_comm(f)
    comm = pc.comm_model(db, "cpu")
    profiles, cases = {}, {}
    for key, (model, scale, plan) in JOBS.items():
        arch = scaled_arch(get_arch(model), **scale)
        if arch.name not in profiles:
            profiles[arch.name] = profile_model(arch, micro_batches=(1, 2, 4, 8), tp_degrees=(1,), progress=None)
        if plan.pp > 1:
            from arena_opt.stages import check_plan

            plan = plan.model_copy(update={"stages": check_plan(arch, plan)})
        cases[key] = Case(arch, plan, BATCH)
    log("profiled")

    def model_job(key: str) -> co.JobLoads:
        c = cases[key]
        prof = profiles[c.arch.name]
        t = pc.plan_time(prof, c.plan, BATCH, comm, pc.Topology(cores=cores)).iter_time_s
        busy = pc.compute_seconds(prof, c.plan, BATCH) * max(1.0, c.plan.num_gpus / cores)
        return co.cpu_job(key, t, busy, c.plan.num_gpus)

    rows = []
    for a, b in PAIRS:
        alone: dict[str, list[dict]] = {a: [], b: []}

        def run_alone() -> None:
            for key in (a, b):
                alone[key].append(measure([cases[key]], steps=args.steps, warmup=2)[0])
                log(f"{key} alone: {alone[key][-1]['iter_s']:.3f} s (other tenants: "
                    f"{alone[key][-1]['ambient_runnable']:.1f} runnable tasks)")

        together: dict[str, dict] = {}

        def run(key: str) -> None:
            together[key] = measure([cases[key]], steps=args.steps, warmup=2)[0]

        # alone, together, alone again: the host's other load drifts, both sides of the run average it
        run_alone()
        threads = [threading.Thread(target=run, args=(k,)) for k in (a, b)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        run_alone()
        alone_avg = {k: {"iter_s": sum(r["iter_s"] for r in v) / len(v),
                         "ambient_runnable": sum(r["ambient_runnable"] or 0.0 for r in v) / len(v)}
                     for k, v in alone.items()}
        jobs = [model_job(a), model_job(b)]
        cap = {"cpu": float(cores)}
        for i, key in enumerate((a, b)):
            other = (a, b)[1 - i]
            # the other job's ranks are ours, not background: remove them from the measured run queue
            bg_alone = alone_avg[key]["ambient_runnable"]
            other_job = jobs[1 - i]
            other_runnable = cases[other].plan.num_gpus * min(1.0, other_job.loads["cpu"].busy_s / other_job.iter_s)
            bg_together = max(0.0, (together[key]["ambient_runnable"] or 0.0) - other_runnable)
            t_alone = co.alone_time(jobs[i], cap, {"cpu": bg_alone})
            t_together = co.iteration_times(jobs, cap, {"cpu": bg_together})[i]
            observed = together[key]["iter_s"] / alone_avg[key]["iter_s"]
            predicted = t_together / t_alone
            rows.append({"job": key, "with": other, "alone_s": alone_avg[key]["iter_s"],
                         "together_s": together[key]["iter_s"], "observed_slowdown": observed,
                         "predicted_slowdown": predicted, "predicted_alone_s": t_alone,
                         "predicted_together_s": t_together, "background_alone": bg_alone,
                         "background_together": bg_together, "rel_err": predicted / observed - 1})
            log(f"{key} with {other}: observed x{observed:.2f}, predicted x{predicted:.2f}")
    payload = {"command": command(), "git": git_rev(), "machine": machine(), "cores": cores,
               "seconds": time.perf_counter() - t_start, "rows": rows,
               "jobs": {k: {"model": c.arch.name, "plan": c.plan.describe()} for k, c in cases.items()}}
    md = "\n".join([
        "# Co-located jobs: predicted vs observed slowdown (CPU host)\n",
        f"Command: `{payload['command']}` (git {payload['git']}), {payload['seconds']:.0f} s, {cores} cores shared "
        "with other tenants (their runnable tasks are measured during every run and enter the prediction as "
        "background load).\n",
        md_table(["job", "plan", "with", "alone s", "together s", "observed", "predicted", "error"],
                 [[r["job"], payload["jobs"][r["job"]]["plan"], r["with"], f"{r['alone_s']:.3f}",
                   f"{r['together_s']:.3f}", f"x{r['observed_slowdown']:.2f}", f"x{r['predicted_slowdown']:.2f}",
                   fmt_pct(r["rel_err"])] for r in rows]),
    ])
    jp, mp = write(args.out, "colocation", payload, md)
    print(md)
    log(f"wrote {jp} and {mp}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
