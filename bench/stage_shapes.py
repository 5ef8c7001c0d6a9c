"""Per-stage shapes (issue 16.4): how often a per-stage (dp, tp) plan beats the grid's uniform plan
under the cost model, by how much, and what the bounded search costs the planner.

    python bench/stage_shapes.py [--params bench/results/calibrated_params.json] [--out bench/results]

Grids: every pipelined grid (pp >= 2) of Arena's table (model, batch, GPU type, nodes x GPUs per node)
and of instances/large.json's jobs on its pools. For each, the uniform planner and the per-stage
planner (perf/stage_shapes.py, margin 0 to count every win, and as shipped: past the committed error
band's margin, `stage_shapes.margin`).
Writes stage_shapes.json/.md.
"""

from __future__ import annotations

import csv
import statistics
import sys
import time
from pathlib import Path

_HERE = Path(__file__).resolve().parent
if sys.path and Path(sys.path[0]).resolve() == _HERE:
    sys.path.append(sys.path.pop(0))
sys.path.insert(0, str(_HERE.parent))

from _perf_common import command, git_rev, machine, md_table, table_and_params, table_parser, write  # noqa: E402

from arena_opt.gpus import canonical_gpu  # noqa: E402
from arena_opt.grids import compact_shape, gpu_counts, pools  # noqa: E402
from arena_opt.perf import stage_shapes  # noqa: E402
from arena_opt.perf.analytical import CostParams  # noqa: E402
from arena_opt.perf.band import default_band  # noqa: E402
from arena_opt.perf.planner import Planner  # noqa: E402
from arena_opt.snapshot import ClusterSnapshot  # noqa: E402
from models.catalog import ARCHITECTURES, arena_model_name  # noqa: E402


def arena_grids(table: Path) -> set[tuple]:
    from arena_opt.gpus import BUILTIN_GPUS

    out = set()
    with table.open(newline="") as f:
        for r in csv.DictReader(f):
            if r["flavour"] in ("alpa_optimal", "arena_estimated") and r["status"] == "ok":
                name = arena_model_name(f"{r['model']}__{r['param_size']}")
                g = canonical_gpu(r["gpu_type"])
                if name in ARCHITECTURES and g in BUILTIN_GPUS:
                    out.add((ARCHITECTURES[name], int(r["batch_size"]), g, BUILTIN_GPUS[g], None,
                             int(r["num_nodes"]), int(r["gpus_per_node"])))
    return out


def instance_grids(path: Path) -> set[tuple]:
    snap = ClusterSnapshot.model_validate_json(path.read_text())
    cat, out = snap.catalog, set()
    for j in snap.jobs:
        for pool in pools(snap).values():
            for c in gpu_counts(j, pool, 16):
                nodes, gpn = compact_shape(c, pool.gpus_per_node)
                out.add((j.arch, j.batch_size, pool.gpu_type, cat[pool.gpu_type], pool.intra_link, nodes, gpn))
    return out


def compare(grids: set[tuple], params: CostParams) -> dict:
    uni, raw = Planner(params, per_stage=False), Planner(params, per_stage=True, stage_band=None)
    saved = stage_shapes.PER_STAGE_MARGIN
    shipped = Planner(params, per_stage=True)
    n, gains, kept, t_uni, t_per, examples, needs = 0, [], 0, 0.0, 0.0, [], []
    for arch, batch, gname, gpu, link, nodes, gpn in sorted(grids, key=str):
        pp = 2
        while pp <= nodes * gpn:
            t0 = time.perf_counter()
            a = uni.plan(arch, batch, gname, gpu, link, nodes, gpn, pp)
            t1 = time.perf_counter()
            c = shipped.plan(arch, batch, gname, gpu, link, nodes, gpn, pp)
            t2 = time.perf_counter()
            t_uni, t_per = t_uni + t1 - t0, t_per + t2 - t1
            stage_shapes.PER_STAGE_MARGIN = 0.0
            try:
                b = raw.plan(arch, batch, gname, gpu, link, nodes, gpn, pp)
            finally:
                stage_shapes.PER_STAGE_MARGIN = saved
            if a.proxy is not None:
                n += 1
                needs.append(stage_shapes.margin(shipped.stage_band, arch.family, nodes * gpn,
                                                 a.proxy.plan.num_microbatches))
                if not b.proxy.plan.uniform:
                    g = 1 - b.proxy.iter_time_s / a.proxy.iter_time_s
                    gains.append(g)
                    examples.append((g, f"{arch.name} b{batch} {gname} {nodes}x{gpn}", a.proxy.plan.describe(),
                                     b.proxy.plan.describe()))
                kept += not c.proxy.plan.uniform
            pp *= 2
    examples.sort(reverse=True)
    return {"pipelined_grids": n, "wins_any": len(gains), "wins_past_margin": kept,
            "margin_median": statistics.median(needs) if needs else None,
            "margin_min": min(needs, default=None),
            "gain_median": statistics.median(gains) if gains else None, "gain_max": max(gains, default=None),
            "plan_seconds_uniform": t_uni, "plan_seconds_per_stage": t_per,
            "top": [{"gain": g, "grid": s, "uniform": u, "per_stage": p} for g, s, u, p in examples[:8]]}


def main(argv: list[str] | None = None) -> int:
    ap = table_parser(__doc__, params=True)
    ap.add_argument("--instance", type=Path, default=Path("instances/large.json"))
    args = ap.parse_args(argv)
    if (inputs := table_and_params(args)) is None:
        return 2
    table, params, params_from = inputs
    t0 = time.perf_counter()
    sets = {"arena_table": compare(arena_grids(Path(table)), params),
            str(args.instance): compare(instance_grids(args.instance), params)}
    payload = {"command": command(), "git": git_rev(), "machine": machine(), "seconds": time.perf_counter() - t0,
               "params": params_from,
               "margin": "error band (arena_opt/perf/band.json)" if default_band() else stage_shapes.PER_STAGE_MARGIN,
               "sets": sets}
    md = render(payload)
    jp, mp = write(args.out, "stage_shapes", payload, md, inputs=[args.params, args.instance])
    print(md)
    print(f"wrote {jp} and {mp}", file=sys.stderr)
    return 0


def pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def render(p: dict) -> str:
    rows = [[k, s["pipelined_grids"], s["wins_any"], pct(s["gain_median"]), pct(s["gain_max"]),
             f"{pct(s.get('margin_min'))} / {pct(s.get('margin_median'))}",
             s["wins_past_margin"], f"{s['plan_seconds_uniform']:.1f} / {s['plan_seconds_per_stage']:.1f}"]
            for k, s in p["sets"].items()]
    top = [[pct(t["gain"]), t["grid"], t["uniform"], t["per_stage"]] for s in p["sets"].values() for t in s["top"][:4]]
    return "\n".join([
        "# Per-stage shapes (issue 16.4)\n",
        f"`{p['command']}` at {p['git']}, params {p['params']}, {p['machine'].get('cpu_model', '')}, "
        f"{p['seconds']:.0f} s.\n",
        "Pipelined grids (pp >= 2) where a per-stage (dp, tp) plan is faster than the grid's uniform plan under "
        "the cost model; margin = the win a per-stage plan needs (its estimate at the upper edge of its error "
        "band below the uniform plan's, perf/stage_shapes.margin), min / median over the grids; kept = past it. "
        f"Shipped margin: {p['margin'] if isinstance(p['margin'], str) else pct(p['margin'])}. "
        "Plan seconds: uniform planner / per-stage planner (at the margin), cold caches.\n",
        md_table(["grids", "pipelined", "per-stage faster", "median gain", "max gain", "margin min / median", "kept",
                  "plan s"], rows),
        "Largest gains:\n",
        md_table(["gain", "grid", "uniform plan", "per-stage plan"], top),
    ])


if __name__ == "__main__":
    sys.exit(main())
