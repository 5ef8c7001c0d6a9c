"""PNG plots comparing policies: JCT CDF, throughput, queue length and GPU utilization over time."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from arena_opt.io import atomic_path


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(plt, fig, path: Path) -> Path:
    """Every plot is written whole or not at all (a half-written PNG never replaces the last one)."""
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=120, format="png")
    plt.close(fig)
    return path


def plot_all(results: list[dict], out_dir: str | Path) -> list[Path]:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    return [_jct_cdf(results, out_dir / "jct_cdf.png"),
            _series(results, "throughput", "cluster throughput (samples/s)", out_dir / "throughput.png"),
            _series(results, "queue_len", "waiting jobs", out_dir / "queue_length.png"),
            _series(results, "gpu_util", "GPU utilization (productive)", out_dir / "gpu_util.png", scale=100,
                    ylabel="%")] + ([_bound_ratio(results, out_dir / "jct_over_bound.png")]
                                    if any(r.get("jct_over_lp_bound") for r in results) else [])


def _bound_ratio(results: list[dict], path: Path) -> Path:
    """Each policy's average JCT as a multiple of the LP lower bound (1 = provably optimal)."""
    plt = _plt()
    rows = [(r["policy"], r["jct_over_lp_bound"]) for r in results if r.get("jct_over_lp_bound")]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.bar([p for p, _ in rows], [v for _, v in rows], color="tab:blue")
    for i, (_, v) in enumerate(rows):
        ax.text(i, v, f"{v:.2f}", ha="center", va="bottom")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_ylabel("average JCT / LP lower bound")
    ax.set_title(f"distance from the bound ({results[0]['lp_bound_s']:,.0f} s)")
    ax.grid(alpha=0.3, axis="y")
    return _save(plt, fig, path)


def _jct_cdf(results: list[dict], path: Path) -> Path:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in results:
        jct = np.sort([j["finish"] - j["submit"] for j in r["job_records"] if j["status"] == "done"]) / 3600
        if len(jct):
            ax.step(jct, np.arange(1, len(jct) + 1) / len(jct), where="post", label=r["policy"])
    ax.set_xscale("log")
    ax.set_xlabel("job completion time (h, log scale)")
    ax.set_ylabel("fraction of finished jobs")
    ax.grid(alpha=0.3)
    ax.legend()
    return _save(plt, fig, path)


def _series(results: list[dict], key: str, title: str, path: Path, scale: float = 1.0, ylabel: str | None = None,
            max_points: int = 2000) -> Path:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9, 4))
    for r in results:
        s = r["series"]
        t = np.asarray(s["t_hours"])
        y = np.asarray(s[key]) * scale
        if len(t) > max_points:  # average consecutive rounds so long runs stay readable
            k = int(np.ceil(len(t) / max_points))
            n = len(t) // k * k
            t, y = t[:n].reshape(-1, k)[:, 0], y[:n].reshape(-1, k).mean(axis=1)
        ax.plot(t, y, label=r["policy"], lw=0.9)
    ax.set_xlabel("time since first submission (h)")
    ax.set_ylabel(ylabel or title)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    return _save(plt, fig, path)
