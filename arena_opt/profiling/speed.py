"""Speed probe: the time of a fixed reference kernel, taken beside every measurement, so that
measurements made at different moments on a host whose speed drifts can be compared.

On a shared host the speed of a core moves with what the other tenants do: on this project's
2-core VM the same layer's CPU time (thread clock, so not time spent descheduled) varies by 11.6%
(coefficient of variation over one-second windows) and its ratio to the probe by 3.5%
(`bench/speed_drift.py`, bench/results/speed_drift.md). A profile taken over a minute then mixes layers measured at different
speeds, and an end-to-end run compared with it is timed at yet another speed.

The reference kernel mixes a compute-bound part (a 384 x 384 fp32 matmul) and a memory-bound part
(an in-place scale of an 8 MiB buffer, larger than a core's L2), because layers are a mix of both
and the two parts drift differently: a layer's time over the probe's time varies less than over
either part alone (`bench/speed_drift.py` reports all three).

Use: the profiler times the probe before every timed repeat of a layer and stores each sample at
the profile's reference speed (`t * ref_s / median probe of the sample`, `ref_s` the median probe
of the whole profile, kept as `probe_s`).
A run that times the probe too can be estimated at its own speed: compose with
`compute_scale = probe_during_run / profile.probe_s`.
"""

from __future__ import annotations

import statistics
import time


class SpeedProbe:
    """The reference kernel on one device; `probe()` returns its median time over `repeats` runs
    (thread CPU time on a CPU, so a probe that is descheduled is not counted slow; synchronized
    wall time on CUDA)."""

    MATMUL_N = 384
    BUFFER_BYTES = 8 * 2**20

    def __init__(self, device: str = "cpu"):
        import torch

        self._torch = torch
        self.device = torch.device(device)
        g = torch.Generator().manual_seed(0)
        self._a = torch.randn(self.MATMUL_N, self.MATMUL_N, generator=g).to(self.device)
        self._c = torch.empty_like(self._a)
        self._buf = torch.ones(self.BUFFER_BYTES // 4).to(self.device)
        self._clock = time.thread_time if self.device.type == "cpu" else time.perf_counter
        for _ in range(3):
            self._once()

    def _sync(self) -> None:
        if self.device.type == "cuda":
            self._torch.cuda.synchronize(self.device)

    def parts(self) -> tuple[float, float]:
        """One run, timed per part: (matmul, buffer scale)."""
        self._sync()
        t0 = self._clock()
        self._torch.mm(self._a, self._a, out=self._c)  # into a kept buffer: no allocator work, no page faults
        self._sync()
        t1 = self._clock()
        self._buf.mul_(1.0)
        self._sync()
        return t1 - t0, self._clock() - t1

    def _once(self) -> float:
        return sum(self.parts())

    def probe(self, repeats: int = 3) -> float:
        # one untimed run first: what ran before evicted the probe's data from the core's caches,
        # and a probe is to time the core, not the cache misses of its first run
        self._once()
        return statistics.median(self._once() for _ in range(repeats))



def _contend(device: str, seconds: float, barrier, out) -> None:
    import torch

    torch.set_num_threads(1)
    probe = SpeedProbe(device)
    barrier.wait()
    times, end = [], time.perf_counter() + seconds
    while time.perf_counter() < end:
        times.append(probe.probe())
    out.put(statistics.median(times))


def contention(processes: int, seconds: float = 3.0, device: str = "cpu") -> float:
    """Median probe time (s) while `processes` single-thread processes run the probe at once: what
    ranks of one host do to each other's speed through what they share (last-level cache, memory
    bandwidth, and beyond one per core the switches between them). The ratio to `contention(1)`
    is the compute slowdown of a plan's ranks on this host, as the colocation model's input."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")  # a fresh interpreter per process: no torch state forked
    barrier, out = ctx.Barrier(processes), ctx.Queue()
    procs = [ctx.Process(target=_contend, args=(device, seconds, barrier, out), daemon=True)
             for _ in range(processes)]
    for p in procs:
        p.start()
    try:
        times = [out.get(timeout=seconds + 300) for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()
    return statistics.median(times)


__all__ = ["SpeedProbe", "contention"]
