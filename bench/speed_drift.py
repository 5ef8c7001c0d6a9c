"""How much this host's speed drifts, and how much of it the speed probe takes out.

    python bench/speed_drift.py [--out bench/results] [--seconds 60] [--window 1.0]

One thread times, over and over, one transformer block's forward (the gpt scale of
bench/estimator_accuracy.py) and the speed probe (`arena_opt.profiling.speed.SpeedProbe`, also per
part: matmul and buffer scale), all on the CPU-time clock. Per window: the median of each. Reported:
the coefficient of variation over windows of the block's time alone and of the block's time over
each probe (what is left after normalising by it). A small ratio CV next to a large block CV is
what makes profiles taken at different moments comparable. Writes speed_drift.json and .md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

_HERE = Path(__file__).resolve().parent
if sys.path and Path(sys.path[0]).resolve() == _HERE:
    sys.path.append(sys.path.pop(0))
sys.path.insert(0, str(_HERE.parent))

from _perf_common import command, git_rev, machine, md_table, write  # noqa: E402

from arena_opt.profiling.speed import SpeedProbe  # noqa: E402
from models.catalog import get_arch  # noqa: E402
from models.torch_layers import build_layer, scaled_arch  # noqa: E402

SCALE = dict(max_hidden=256, max_layers=6, seq_len=128, max_heads=4, max_vocab=2048)


def cv(v: np.ndarray) -> float:
    return float(v.std() / v.mean())


def main(argv: list[str] | None = None) -> int:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--window", type=float, default=1.0)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    arch = scaled_arch(get_arch("gpt-350M"), **SCALE)
    block = build_layer(arch, 1, 1, seed=0)
    x = torch.randn(8, arch.seq_len, arch.hidden)
    probe = SpeedProbe("cpu")
    windows = []
    t_end = time.perf_counter() + args.seconds
    while time.perf_counter() < t_end:
        blk, pr, mm, sc = [], [], [], []
        w0 = time.perf_counter()
        while time.perf_counter() - w0 < args.window:
            t0 = time.thread_time()
            with torch.no_grad():
                block(x)
            blk.append(time.thread_time() - t0)
            pr.append(probe.probe())
            a, b = probe.parts()
            mm.append(a)
            sc.append(b)
        windows.append([statistics.median(v) for v in (blk, pr, mm, sc)])
        print(f"[speed_drift] window {len(windows)}: block {1e3 * windows[-1][0]:.2f} ms, probe "
              f"{1e3 * windows[-1][1]:.3f} ms", file=sys.stderr, flush=True)
    w = np.array(windows)
    res = {"windows": len(w), "cv_block": cv(w[:, 0]), "cv_probe": cv(w[:, 1]), "cv_block_over_probe": cv(w[:, 0] / w[:, 1]),
           "cv_block_over_matmul": cv(w[:, 0] / w[:, 2]), "cv_block_over_scale": cv(w[:, 0] / w[:, 3]),
           "block_ms_range": [1e3 * float(w[:, 0].min()), 1e3 * float(w[:, 0].max())]}
    payload = {"command": command(), "git": git_rev(), "machine": machine(), "seconds": args.seconds,
               "window_s": args.window, "arch": arch.name, **res, "medians_s": w.tolist()}
    m = payload["machine"]
    md = "\n".join([
        "# Host speed drift and the speed probe\n",
        f"Command: `{payload['command']}` (git {payload['git']}) on {m.get('cpu_model', m['processor'])}, "
        f"torch {m.get('torch')}. One thread, CPU-time clock; {res['windows']} windows of {args.window:g} s; "
        f"per window the median of each timing. Layer: one block of {arch.name}, micro-batch 8, forward.\n",
        md_table(["quantity", "coefficient of variation over windows"],
                 [["block time", f"{100 * res['cv_block']:.1f}%"],
                  ["block / speed probe (matmul + scale)", f"{100 * res['cv_block_over_probe']:.1f}%"],
                  ["block / matmul part only", f"{100 * res['cv_block_over_matmul']:.1f}%"],
                  ["block / scale part only", f"{100 * res['cv_block_over_scale']:.1f}%"],
                  ["speed probe time", f"{100 * res['cv_probe']:.1f}%"]]),
        f"\nBlock forward per window: {res['block_ms_range'][0]:.2f} to {res['block_ms_range'][1]:.2f} ms.\n"])
    jp, mp = write(args.out, "speed_drift", payload, md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
