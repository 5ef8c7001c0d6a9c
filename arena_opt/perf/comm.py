"""Latency-bandwidth (alpha-beta) model of links and collectives.

Collective times follow the ring algorithms NCCL and gloo use for large messages
(Thakur et al. 2005; Patarasuk & Yuan 2009), for n ranks and a message of B bytes:

    all-reduce      2(n-1) alpha + 2(n-1)/n * B / bw
    all-gather      (n-1) alpha  + (n-1)/n * B / bw     (B = gathered size)
    reduce-scatter  (n-1) alpha  + (n-1)/n * B / bw     (B = input size)
    p2p             alpha + B / bw

Published defaults per link kind (one direction, per GPU); `efficiency` is the
fraction of the nominal bandwidth that collectives reach in practice. Measured
fits (`arena-opt profile`) replace them.
- NVLink: A100 NVLink3 300 GB/s, H100 NVLink4 450 GB/s (NVIDIA data sheets); nccl-tests
  all-reduce bus bandwidth on DGX A100 about 230 GB/s (0.77).
- PCIe: 4.0 x16 32 GB/s, 5.0 x16 64 GB/s; about 0.8 of it after protocol overhead
  (PCI-SIG; NVIDIA p2pBandwidthLatencyTest).
- InfiniBand / RoCE: HDR 200 Gb/s (25 GB/s), NDR 400 Gb/s; nccl-tests over IB about 0.9
  of line rate, a few microseconds per message.
- Ethernet (TCP sockets): 25-100 GbE; TCP stacks reach about 0.7 of line rate and cost
  tens of microseconds per message.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, NonNegativeFloat, PositiveFloat

Collective = Literal["all_reduce", "all_gather", "reduce_scatter", "p2p"]
COLLECTIVES: tuple[Collective, ...] = ("all_reduce", "all_gather", "reduce_scatter", "p2p")


class AlphaBeta(BaseModel):
    """t = alpha per message step + bytes / bandwidth."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    alpha_s: NonNegativeFloat
    bandwidth_bps: PositiveFloat = Field(description="bytes per second, one direction")

    def time(self, collective: Collective, nbytes, n: int):
        a, b = algo_factors(collective, n)
        return a * self.alpha_s + b * np.asarray(nbytes, dtype=float) / self.bandwidth_bps


class LinkDefault(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    nominal_gbs: PositiveFloat = Field(description="GB/s one direction, used when no GPU spec gives one")
    efficiency: PositiveFloat = Field(le=1.0)
    alpha_s: NonNegativeFloat


LINK_DEFAULTS: dict[str, LinkDefault] = {
    "nvlink": LinkDefault(nominal_gbs=300, efficiency=0.77, alpha_s=5e-6),
    "pcie": LinkDefault(nominal_gbs=32, efficiency=0.8, alpha_s=10e-6),
    "infiniband": LinkDefault(nominal_gbs=25, efficiency=0.9, alpha_s=5e-6),
    "ethernet": LinkDefault(nominal_gbs=12.5, efficiency=0.7, alpha_s=30e-6),
}


def default_alpha_beta(kind: str, nominal_gbs: float | None = None) -> AlphaBeta:
    d = LINK_DEFAULTS[kind]
    return AlphaBeta(alpha_s=d.alpha_s, bandwidth_bps=(nominal_gbs or d.nominal_gbs) * 1e9 * d.efficiency)


def algo_factors(collective: Collective, n: int) -> tuple[float, float]:
    """(alpha multiplier, bytes multiplier) of the ring algorithm for n ranks."""
    if collective == "p2p":
        return 1.0, 1.0
    if n <= 1:
        return 0.0, 0.0
    if collective == "all_reduce":
        return 2.0 * (n - 1), 2.0 * (n - 1) / n
    if collective in ("all_gather", "reduce_scatter"):
        return float(n - 1), (n - 1) / n
    raise ValueError(f"unknown collective {collective!r}")


def fit_alpha_beta(collective: Collective, group_sizes, nbytes, times_s) -> tuple[AlphaBeta, float]:
    """Least-squares alpha and 1/bandwidth from measured (group size, bytes, seconds) points of one
    collective on one link, weighted by 1/t so small and large messages count alike (relative error).
    Returns the fit and the mean relative error of the fitted model on the points."""
    n = np.asarray(group_sizes, dtype=float)
    b = np.asarray(nbytes, dtype=float)
    t = np.asarray(times_s, dtype=float)
    if len(t) < 2:
        raise ValueError("need at least two measurements to fit alpha and beta")
    fa = np.array([algo_factors(collective, int(k))[0] for k in n])
    fb = np.array([algo_factors(collective, int(k))[1] for k in n]) * b
    w = 1.0 / t
    A = np.stack([fa * w, fb * w], axis=1)
    (alpha, inv_bw), *_ = np.linalg.lstsq(A, np.ones_like(t), rcond=None)
    if inv_bw <= 0:
        # latency-only data (all messages tiny): bandwidth is not identifiable; refit alpha alone
        inv_bw = 1e-15
        alpha = float(np.sum(fa * w) / np.sum(fa * fa * w * w))
    if alpha < 0:
        alpha = 0.0
        inv_bw = float(np.sum(fb * w) / np.sum(fb * fb * w * w))
    ab = AlphaBeta(alpha_s=float(alpha), bandwidth_bps=float(1.0 / inv_bw))
    pred = fa * ab.alpha_s + fb / ab.bandwidth_bps
    return ab, float(np.mean(np.abs(pred - t) / t))
