"""Results files: one JSON per simulation (metrics at the top level) and the Markdown comparison."""

from __future__ import annotations

from pathlib import Path

from arena_opt.io import write_json
from arena_opt.metrics import compute, round_series
from arena_opt.record import RunRecord


def result_dict(res: RunRecord, config: dict) -> dict:
    out = compute(res)
    out["config"] = config
    out["policy_options"] = res.policy_options
    out["series"] = round_series(res)
    out["decisions"] = res.decisions
    out["job_records"] = res.job_dicts()
    out["events"] = res.event_dicts()
    return out


def write_result(path: str | Path, data: dict) -> None:
    write_json(path, data, default=_default)


def _default(o):
    if hasattr(o, "item"):
        return o.item()
    raise TypeError(f"not JSON serializable: {type(o).__name__}")


def _f(v, nd=0, scale=1.0):
    if v is None:
        return "-"
    return f"{v / scale:,.{nd}f}"


COLUMNS = [
    ("policy", "policy", lambda m: m["policy"]),
    ("finished / arrived", "finished", lambda m: f"{m['finished']}/{m['jobs'] - m['rejected'] - m['not_arrived']}"),
    ("avg JCT (s)", "avg_jct_s", lambda m: _f(m["avg_jct_s"])),
    ("avg JCT / LP bound", "jct_over_lp_bound", lambda m: _f(m.get("jct_over_lp_bound"), 2)),
    ("median JCT (s)", "median_jct_s", lambda m: _f(m["median_jct_s"])),
    ("p95 JCT (s)", "p95_jct_s", lambda m: _f(m["p95_jct_s"])),
    ("p99 JCT (s)", "p99_jct_s", lambda m: _f(m["p99_jct_s"])),
    ("avg queue (s)", "avg_queue_s", lambda m: _f(m["avg_queue_s"])),
    ("makespan (h)", "makespan_s", lambda m: _f(m["makespan_s"], 1, 3600)),
    ("avg thr (samples/s)", "avg_throughput", lambda m: _f(m["avg_throughput"])),
    ("avg thr, rounds > 100 (samples/s)", "avg_throughput_busy_rounds", lambda m: _f(m["avg_throughput_busy_rounds"])),
    ("peak thr (samples/s)", "peak_throughput", lambda m: _f(m["peak_throughput"])),
    ("norm. thr per job", "avg_job_norm_throughput", lambda m: _f(m["avg_job_norm_throughput"], 2)),
    ("GPU util", "gpu_util", lambda m: _f(m["gpu_util"] * 100, 1) + "%"),
    ("reconfigs/job", "reconfigs_per_job", lambda m: _f(m["reconfigs_per_job"], 2)),
    ("deadlines met", "deadline_satisfaction",
     lambda m: "-" if m["deadline_satisfaction"] is None else f"{m['deadline_satisfaction'] * 100:.1f}%"),
    ("FTF mean / p95", "ftf_mean", lambda m: f"{_f(m['ftf_mean'], 2)} / {_f(m['ftf_p95'], 2)}"),
    ("decision s mean / p99 / max", "decision_s_mean",
     lambda m: f"{_f(m['decision_s_mean'], 3)} / {_f(m['decision_s_p99'], 3)} / {_f(m['decision_s_max'], 3)}"),
    ("sim wall / CPU (s)", "sim_wall_s", lambda m: f"{_f(m['sim_wall_s'], 1)} / {_f(m.get('sim_cpu_s'), 1)}"),
]


def markdown_table(results: list[dict]) -> str:
    head = "| " + " | ".join(c[0] for c in COLUMNS) + " |"
    sep = "|" + "|".join("---" if i == 0 else "---:" for i in range(len(COLUMNS))) + "|"
    rows = ["| " + " | ".join(c[2](m) for c in COLUMNS) + " |" for m in results]
    return "\n".join([head, sep, *rows])
