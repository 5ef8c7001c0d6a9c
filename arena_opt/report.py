"""Readable terminal output (rich) for decisions and plans."""

from __future__ import annotations

from collections import Counter

from rich.console import Console
from rich.table import Table

from arena_opt.decision import Decision
from arena_opt.snapshot import ClusterSnapshot


def _fmt(x: float | None, spec: str = ".3g") -> str:
    return "-" if x is None else format(x, spec)


def _placement(pl: dict[str, list[int]], limit: int = 3) -> str:
    items = [f"{n}:{','.join(map(str, g))}" for n, g in pl.items()]
    return " ".join(items[:limit]) + (f" +{len(items) - limit} nodes" if len(items) > limit else "")


def _console() -> Console:
    # wide enough for the decision table when output goes to a file or pipe
    c = Console()
    return c if c.is_terminal else Console(width=160)


def print_decision(snap: ClusterSnapshot, d: Decision, console: Console | None = None, rows: int = 0) -> None:
    """The decision as a table; with `rows` > 0 only the first `rows` jobs get a row and the rest one
    summary line (a table of 100k rows takes minutes to lay out and nobody reads it)."""
    console = console or _console()
    jobs = {j.id: j for j in snap.jobs}
    t = Table(title=f"{d.policy} decision at t={d.time:.0f}s", show_lines=False)
    for col in ("job", "model", "action", "GPUs", "plan", "iter s", "samples/s", "GiB/GPU", "placement / reason"):
        t.add_column(col)
    shown = d.jobs if rows <= 0 else d.jobs[:rows]
    for jd in shown:
        j = jobs[jd.job_id]
        gpus = f"{jd.num_gpus}x{jd.gpu_type}" if jd.runs else "-"
        plan = jd.plan.describe() if jd.plan and jd.runs else "-"
        t.add_row(jd.job_id, j.arch.name, jd.action, gpus, plan, _fmt(jd.est_iter_time_s), _fmt(jd.est_throughput),
                  _fmt(jd.est_mem_per_gpu_gib, ".1f"), _placement(jd.placement) if jd.runs else (jd.reason or ""))
    console.print(t)
    rest = d.jobs[len(shown):]
    if rest:
        counts = Counter(jd.action for jd in rest)
        console.print(f"... and {len(rest)} more jobs ({', '.join(f'{n} {a}' for a, n in counts.most_common())}); "
                      f"--rows 0 shows all, --json or -o gives every field")
    s = d.stats
    used = sum(jd.num_gpus for jd in d.jobs if jd.runs)
    total = sum(n.num_gpus for n in snap.nodes)
    console.print(f"solver {s.solver}: status {s.status}, objective {_fmt(s.objective, '.6g')}, bound "
                  f"{_fmt(s.bound, '.6g')}, gap {_fmt(s.gap, '.2%') if s.gap is not None else '-'}, grids "
                  f"{s.num_grids}, shards {s.shards}, build {s.build_s:.2f}s, solve {s.solve_s:.2f}s, total "
                  f"{s.total_s:.2f}s" + (" [GREEDY FALLBACK]" if s.fallback else ""))
    if s.note:
        console.print(f"note: {s.note}")
    console.print(f"GPUs allocated {used}/{total}; jobs running {sum(jd.runs for jd in d.jobs)}/{len(d.jobs)}")


def print_plans(arch, batch: int, gpu: str, nodes: int, per_node: int, rows, console: Console | None = None) -> None:
    console = console or _console()
    t = Table(title=f"{arch.name} batch {batch} on {nodes}x{per_node} {gpu}")
    bands = [r.band for _, plans, _ in rows for r in plans.pareto if r.band is not None]
    level = f" ({100 * bands[0].level:.0f}%)" if bands else ""
    cols = ["grid pp", "", "plan", "stages (layers)", "iter s", f"band s{level}", "decided s", "samples/s", "GiB/GPU"]
    for col in cols:
        t.add_column(col)
    reasons = []
    for pp, plans, why in rows:
        if plans.proxy is None:
            # the reason goes under the table, whole: a wide table would wrap it mid-sentence
            t.add_row(str(pp), "", "no plan (below)", *[""] * (len(cols) - 3))
            reasons.append(f"pp {pp}: {why or 'no plan fits in memory'}")
            continue
        for r in plans.pareto:
            tag = "proxy" if r is plans.proxy else "pareto"
            bd = r.band
            # samples/s at the decided (conservative) time: what the policies rank by
            t.add_row(str(pp), tag, r.plan.describe(), " ".join(f"{a}-{b - 1}" for a, b in r.plan.stages),
                      f"{bd.nominal_s if bd else r.iter_time_s:.3f}",
                      f"{bd.lo_s:.3f}-{bd.hi_s:.3f}" + ("*" if bd.outside else "") if bd else "-",
                      f"{r.iter_time_s:.3f}", f"{r.throughput:.1f}", f"{r.mem_gib:.1f}")
    console.print(t)
    for line in reasons:
        console.print(line, soft_wrap=True)
    outside = sorted({o for b in bands for o in b.outside})
    if outside:
        console.print("* outside the calibrated region, band widened: " + "; ".join(outside), soft_wrap=True)
