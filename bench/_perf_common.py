"""Shared pieces of the benches: error statistics, tables, report writing (with _provenance's record)."""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

import numpy as np

from arena_opt.gpus import canonical_gpu
from arena_opt.perf.analytical import CostParams
from models.catalog import arena_model_name
import _provenance
from _provenance import write_result

# the benches take these from here; _provenance holds the one implementation
command, git_rev, machine = _provenance.command, _provenance.git_rev, _provenance.machine


def err_stats(rel: list[float] | np.ndarray) -> dict:
    """|relative error| statistics of a list of signed relative errors (pred / meas - 1)."""
    a = np.asarray(rel, dtype=float)
    if a.size == 0:
        return {"n": 0}
    ab = np.abs(a)
    return {"n": int(a.size), "median": float(np.median(ab)), "p90": float(np.percentile(ab, 90)),
            "mean": float(ab.mean()), "max": float(ab.max()), "median_signed": float(np.median(a))}


def fmt_pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def write(out_dir: Path, stem: str, payload: dict, markdown: str, written: list[Path] = (),
          inputs: list = ()) -> tuple[Path, Path]:
    """stem.json and stem.md with their provenance (_provenance.write_result); `written`: other files the
    bench wrote, `inputs`: repository files it read (another bench's result)."""
    jp = Path(out_dir) / f"{stem}.json"
    write_result(jp, payload, markdown, written, inputs, default=float)
    return jp, jp.with_suffix(".md")


def md_table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def philly_config(data_arg: str | None):
    """The simulator setup every Philly bench shares (Arena's trace, cluster and measured table, strict),
    or None with a message when Arena's data is not found."""
    from arena_opt.perf.table import default_data_dir
    from arena_opt.sim.config import RunConfig

    data = Path(data_arg) if data_arg else default_data_dir()
    if data is None or not (data / "traces" / "simulate_trace_philly.csv").is_file():
        print("Arena data not found (give --data or set ARENA_OPT_DATA); nothing to run", file=sys.stderr)
        return None
    return RunConfig(trace=str(data / "traces" / "simulate_trace_philly.csv"),
                     cluster=str(data / "cluster_spec_derived.json"), perf_table=str(data / "prof_records.csv"),
                     table_mode="strict", iter_scale=5, deadline_stretch=5.0, reconfig="artifact", interval_s=300.0)


def err_table(per_world: dict, what: str = "err", counted: str = "plans") -> str:
    """Markdown table of `err_stats` per process count: how many (`counted`), mean and max |what|, median signed."""
    return md_table(["processes", counted, f"mean |{what}|", f"max |{what}|", "median signed"],
                    [[w, s["n"], fmt_pct(s["mean"]), fmt_pct(s["max"]), fmt_pct(s["median_signed"])]
                     for w, s in per_world.items()])


def arena_estimates(path: Path) -> dict[tuple, dict[tuple[int, int, int], float]]:
    """Arena's own per-plan estimates (`arena_estimated` rows of prof_records.csv):
    (catalog model, batch, GPU type, nodes, GPUs per node) -> {(pp, dp, tp): iteration time s}."""
    out: dict[tuple, dict] = {}
    with Path(path).open(newline="") as f:
        for r in csv.DictReader(f):
            if r["flavour"] != "arena_estimated" or r["status"] != "ok" or r["key_consistent"] != "True":
                continue
            key = (arena_model_name(f"{r['model']}__{r['param_size']}"), int(r["batch_size"]),
                   canonical_gpu(r["gpu_type"]), int(r["num_nodes"]), int(r["gpus_per_node"]))
            plan = (int(float(r["pp"])), int(float(r["dp"])), int(float(r["tp"])))
            t = float(r["iter_time_s"])
            plans = out.setdefault(key, {})
            plans[plan] = min(plans.get(plan, t), t)  # repeated estimates: the best run
    return out


def table_parser(doc: str, params: bool = False) -> argparse.ArgumentParser:
    """The options every bench over Arena's table takes: --table, --out and, with `params`, --params (the
    estimator bench's calibrated CostParams, defaults when that file is absent)."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--table", type=Path, default=None, help="prof_records.csv (default: shared data)")
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    if params:
        ap.add_argument("--params", type=Path, default=Path("bench/results/calibrated_params.json"))
    return ap


def table_path(arg: Path | None) -> Path | None:
    """--table, else the shared data's table; None (after saying so) when there is none: the bench exits 2."""
    from arena_opt.perf.table import default_table_path

    path = arg or default_table_path()
    if path is None or not Path(path).is_file():
        print("no measured table: pass --table or set ARENA_OPT_DATA", file=sys.stderr)
        return None
    return Path(path)


def table_and_params(args: argparse.Namespace) -> tuple[Path, CostParams, str] | None:
    """(table, cost parameters, where they came from) of a `table_parser(params=True)` bench: the calibrated
    parameters --params names, the defaults when the estimator bench has not written them; None: exit 2."""
    path = table_path(args.table)
    if path is None:
        return None
    if Path(args.params).is_file():
        return path, CostParams.model_validate_json(Path(args.params).read_text()), str(args.params)
    return path, CostParams(), "defaults"
