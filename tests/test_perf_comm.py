"""Alpha-beta link model: ring factors and the least-squares fit recovering known parameters."""

import numpy as np
import pytest

from arena_opt.perf.comm import AlphaBeta, algo_factors, default_alpha_beta, fit_alpha_beta


def test_ring_factors():
    assert algo_factors("all_reduce", 4) == (6.0, 1.5)
    assert algo_factors("all_gather", 4) == (3.0, 0.75)
    assert algo_factors("reduce_scatter", 8) == (7.0, 7 / 8)
    assert algo_factors("p2p", 2) == (1.0, 1.0)
    assert algo_factors("all_reduce", 1) == (0.0, 0.0)


@pytest.mark.parametrize("coll", ["all_reduce", "all_gather", "reduce_scatter", "p2p"])
@pytest.mark.parametrize("noise", [0.0, 0.03])
def test_fit_recovers_known_parameters(coll, noise):
    true = AlphaBeta(alpha_s=25e-6, bandwidth_bps=12e9)
    rng = np.random.default_rng(1)
    groups = [2] * 8 if coll == "p2p" else [2, 4, 8] * 8
    sizes = np.geomspace(1e3, 1e9, len(groups))
    t = np.array([true.time(coll, b, n) for n, b in zip(groups, sizes)])
    t *= 1 + noise * rng.standard_normal(len(t))
    fit, err = fit_alpha_beta(coll, groups, sizes, t)
    tol = 1e-6 if noise == 0 else 0.15
    assert fit.alpha_s == pytest.approx(true.alpha_s, rel=tol)
    assert fit.bandwidth_bps == pytest.approx(true.bandwidth_bps, rel=tol)
    assert err <= (1e-9 if noise == 0 else 0.05)


def test_latency_only_points_give_alpha_and_no_negative_bandwidth():
    fit, _ = fit_alpha_beta("p2p", [2, 2, 2], [8, 16, 32], [1e-4, 1e-4, 1e-4])
    assert fit.alpha_s == pytest.approx(1e-4)
    assert fit.bandwidth_bps > 0


def test_defaults_scale_with_the_nominal_bandwidth():
    nv = default_alpha_beta("nvlink", 300)
    pcie = default_alpha_beta("pcie", 32)
    assert nv.bandwidth_bps > 8 * pcie.bandwidth_bps
    assert default_alpha_beta("ethernet").alpha_s > default_alpha_beta("infiniband").alpha_s
