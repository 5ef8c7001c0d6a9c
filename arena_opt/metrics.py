"""Metrics of one run, simulated or live, computed from its RunRecord (arena_opt/record.py): the per-job
records and the cluster's piecewise-constant timeline."""

from __future__ import annotations

import numpy as np

from arena_opt.record import DONE, FAILED, NOT_ARRIVED, REJECTED, RUNNING, WAITING, RunRecord

# Arena's artifact averages cluster throughput over the rounds whose throughput exceeds this (samples/s)
ARTIFACT_BUSY_ROUND_THR = 100.0


class Timeline:
    """Step functions: value[i] holds on [t[i], t[i+1])."""

    def __init__(self, timeline: dict[str, list[float]]):
        t = np.asarray(timeline["t"], dtype=float)
        self.t = t
        self.values = {k: np.asarray(v, dtype=float) for k, v in timeline.items() if k != "t"}

    def integral(self, key: str, a: float, b: float) -> float:
        return float(self._cum(key, np.array([b]))[0] - self._cum(key, np.array([a]))[0])

    def bin_means(self, key: str, edges: np.ndarray) -> np.ndarray:
        cum = self._cum(key, edges)
        return np.diff(cum) / np.diff(edges)

    def _cum(self, key: str, x: np.ndarray) -> np.ndarray:
        t, v = self.t, self.values[key]
        seg = np.diff(t) * v[:-1]
        cum = np.concatenate([[0.0], np.cumsum(seg)])
        i = np.clip(np.searchsorted(t, x, side="right") - 1, 0, len(t) - 1)
        return cum[i] + v[i] * np.maximum(x - t[i], 0.0)


def _edges(res: RunRecord, max_bins: int | None = None) -> np.ndarray:
    """Round boundaries origin + k * interval (the last round may be cut short by the end); with
    `max_bins`, consecutive rounds are merged into at most that many bins."""
    interval = float(res.interval_s)
    n = max(1, int(np.ceil((res.end - res.origin) / interval - 1e-9)))
    if max_bins is not None and n > max_bins:
        k = int(np.ceil(n / max_bins))
        interval *= k
        n = int(np.ceil(n / k))
    edges = res.origin + interval * np.arange(n + 1, dtype=float)
    edges[-1] = max(res.end, edges[-2] + 1e-9)
    return edges


def _pct(x: np.ndarray, q: float) -> float | None:
    return float(np.percentile(x, q)) if len(x) else None


def _mean(x: np.ndarray) -> float | None:
    return float(np.mean(x)) if len(x) else None


def compute(res: RunRecord) -> dict:
    jobs = res.jobs
    interval = float(res.interval_s)
    span = max(res.end - res.origin, 1e-9)
    tl = Timeline(res.timeline)

    done = [j for j in jobs if j.status == DONE]
    started = [j for j in jobs if j.first_start is not None]
    jct = np.array([j.finish - j.submit for j in done])
    queue = np.array([j.first_start - j.submit for j in started])
    ideal = np.array([j.iterations * j.batch_size / j.ref_throughput for j in done])
    ftf = jct / ideal if len(done) else np.array([])
    # each job alone on the cluster, on its fastest grid from submission, never restarted: no policy
    # can finish a job sooner (within the grids' GPU limit), so no average JCT can be lower
    # (a live run of real jobs knows no such truth: no bound then)
    alone = np.array([j.iterations * j.batch_size / j.best_throughput for j in done if j.best_throughput])
    alone = alone if len(alone) == len(done) else np.array([])

    with_ddl = [j for j in jobs if j.deadline is not None and j.status not in (REJECTED, NOT_ARRIVED)]
    met = sum(1 for j in with_ddl if j.finish is not None and j.finish <= j.deadline + 1e-6)
    missed = sum(1 for j in with_ddl if (j.finish is not None and j.finish > j.deadline + 1e-6)
                 or (j.finish is None and j.deadline < res.end))

    round_thr = tl.bin_means("throughput", _edges(res))
    busy = round_thr[round_thr > ARTIFACT_BUSY_ROUND_THR]

    running = tl.values["running"]
    norm_t = np.where(running > 0, tl.values["norm_sum"] / np.maximum(running, 1), 0.0)
    seg = np.diff(tl.t)
    busy_time = float((seg * (running[:-1] > 0)).sum())
    avg_norm = float((seg * norm_t[:-1]).sum() / busy_time) if busy_time > 0 else None

    dec_wall = np.array([d["wall_s"] for d in res.decisions])
    reconf = np.array([j.reconfigs for j in started])
    pre = np.array([j.preemptions for j in started])
    crashes = np.array([j.crashes for j in started])
    finishes = [j.finish for j in done]
    return {
        "policy": res.policy,
        "jobs": len(jobs),
        "finished": len(done),
        "unfinished": sum(1 for j in jobs if j.status in (WAITING, RUNNING)),
        "rejected": sum(1 for j in jobs if j.status == REJECTED),
        "not_arrived": sum(1 for j in jobs if j.status == NOT_ARRIVED),
        "failed": sum(1 for j in jobs if j.status == FAILED),
        "failed_jobs": {j.id: j.reject_reason for j in jobs if j.status == FAILED},
        "stalled": res.stalled,
        "avg_jct_s": _mean(jct),
        "median_jct_s": _pct(jct, 50),
        "p95_jct_s": _pct(jct, 95),
        "p99_jct_s": _pct(jct, 99),
        "avg_jct_bound_s": _mean(alone),
        "avg_queue_s": _mean(queue),
        "median_queue_s": _pct(queue, 50),
        "p95_queue_s": _pct(queue, 95),
        "makespan_s": (max(finishes) - res.origin) if finishes else None,
        "sim_span_s": span,
        "rounds": int(np.ceil(span / interval - 1e-9)),
        "avg_throughput": tl.integral("throughput", res.origin, res.end) / span,
        "avg_throughput_busy_rounds": _mean(busy),
        "peak_throughput": float(round_thr.max()) if len(round_thr) else 0.0,
        "avg_job_norm_throughput": avg_norm,
        "gpu_util": tl.integral("productive_gpus", res.origin, res.end) / (res.total_gpus * span),
        "gpu_alloc_util": tl.integral("alloc_gpus", res.origin, res.end) / (res.total_gpus * span),
        "avg_queue_len": tl.integral("waiting", res.origin, res.end) / span,
        "reconfigs_per_job": _mean(reconf),
        "preemptions_per_job": _mean(pre),
        "crashes_per_job": _mean(crashes),
        "deadline_jobs": met + missed,
        "deadline_met": met,
        "deadline_satisfaction": met / (met + missed) if met + missed else None,
        "ftf_mean": _mean(ftf),
        "ftf_p95": _pct(ftf, 95),
        "ftf_max": float(ftf.max()) if len(ftf) else None,
        "policy_calls": len(res.decisions),
        "decision_s_mean": _mean(dec_wall),
        "decision_s_p99": _pct(dec_wall, 99),
        "decision_s_max": float(dec_wall.max()) if len(dec_wall) else None,
        "decision_s_total": float(dec_wall.sum()),
        "decision_cpu_s_total": float(sum(d.get("cpu_s", 0.0) for d in res.decisions)),
        "sim_wall_s": res.wall_s,
        "sim_cpu_s": res.cpu_s,
    }


def round_series(res: RunRecord, max_bins: int = 3000) -> dict[str, list[float]]:
    """Per scheduling interval (merged into at most `max_bins` bins for long runs): mean throughput,
    queue length, running jobs and GPU utilization."""
    tl = Timeline(res.timeline)
    edges = _edges(res, max_bins)
    return {
        "bin_s": float(edges[1] - edges[0]),
        "t_hours": ((edges[:-1] - res.origin) / 3600).tolist(),
        "throughput": tl.bin_means("throughput", edges).tolist(),
        "queue_len": tl.bin_means("waiting", edges).tolist(),
        "running": tl.bin_means("running", edges).tolist(),
        "gpu_util": (tl.bin_means("productive_gpus", edges) / res.total_gpus).tolist(),
        "gpu_alloc_util": (tl.bin_means("alloc_gpus", edges) / res.total_gpus).tolist(),
    }
