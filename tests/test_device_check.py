"""bench/device_check.py, the prepared one-GPU check of issue 16: its pieces (device names, the plan
space, the linearised plan time its fit moves, the fit itself) and one end-to-end run on the CPU with
scaled-down models (what a lent GPU runs at full size)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import device_check as dc  # noqa: E402

from arena_opt.gpus import BUILTIN_GPUS  # noqa: E402
from arena_opt.perf.analytical import CostParams, calibrated_params  # noqa: E402
from models.catalog import get_arch  # noqa: E402


@pytest.mark.parametrize("name,entry", [("NVIDIA H100 80GB HBM3", "h100-80gb"), ("NVIDIA H200", "h200"),
                                        ("NVIDIA A100-SXM4-40GB", "a100-40gb"), ("NVIDIA A100 80GB PCIe", "a100-80gb"),
                                        ("NVIDIA A10", "a10"), ("Tesla V100-SXM2-32GB", "v100-32gb"),
                                        ("NVIDIA GeForce RTX 4090", None)])
def test_device_names_map_to_one_catalog_entry_or_none(name, entry):
    assert dc.device_gpu_type(name) == entry


def test_the_plan_space_is_the_planners_on_one_gpu():
    plans = dc.single_gpu_plans(16)
    assert {(p.num_microbatches, p.recompute) for p in plans} == {(m, rc) for m in (1, 2, 4, 8, 16)
                                                                   for rc in (False, True)}
    assert all((p.pp, p.dp, p.tp) == (1, 1, 1) for p in plans)


@pytest.mark.parametrize("model", ["gpt-350M", "wide_resnet-500M", "moe-690M"])
def test_linearised_plan_time_is_the_priced_plan_time(model):
    """The fit moves rates on coefficient rows; those rows must give the time the analytical model prices."""
    from arena_opt.perf.analytical import rate_vector

    arch, gpu = get_arch(model), BUILTIN_GPUS["h100-80gb"]
    params = dc.runner_params(calibrated_params())
    for plan in dc.single_gpu_plans(16):
        t, _ = dc.analytical_plan(arch, gpu, "h100-80gb", params, 16, plan)
        row = dc.plan_row_coefficients(arch, gpu, params, 16, plan)
        lin = row @ rate_vector(params, "h100-80gb", 989.0, params.dtype(arch.family), "nvlink", arch.family)
        assert lin == pytest.approx(t, rel=1e-9)


def test_fit_recovers_the_parameters_that_made_the_measurements():
    """Measurements made by the model with a known device (efficiency, recompute share, saturation) are
    fitted back to it, from the committed parameters as the start."""
    gpu = BUILTIN_GPUS["h100-80gb"]
    start = dc.runner_params(calibrated_params())
    truth = start.model_copy(update={"compute_eff": {**start.compute_eff, "h100-80gb": 0.37}, "recompute_cost": 0.6,
                                     "saturation_samples": {**start.saturation_samples, "gpt": 1.5,
                                                            "wide_resnet": 0.8}})
    archs = {"gpt-350M": get_arch("gpt-350M"), "wide_resnet-500M": get_arch("wide_resnet-500M")}
    rows, coef = [], {}
    for name, arch in archs.items():
        for plan in dc.single_gpu_plans(16):
            i = len(rows)
            coef[i] = dc.plan_row_coefficients(arch, gpu, start, 16, plan)
            t, _ = dc.analytical_plan(arch, gpu, "h100-80gb", truth, 16, plan)
            rows.append({"index": i, "model": name, "plan": plan.model_dump(), "measured_s": t})
    fitted = dc.fit_device(rows, coef, archs, "h100-80gb", start)
    assert fitted.eff("h100-80gb", 989.0) == pytest.approx(0.37, rel=0.02)
    assert fitted.recompute_cost == pytest.approx(0.6, rel=0.05)
    assert fitted.saturation_samples["gpt"] == pytest.approx(1.5, rel=0.1)
    pred = dc.predict_rows(rows, coef, archs, "h100-80gb", fitted)
    assert np.max(np.abs(np.array(pred) / [r["measured_s"] for r in rows] - 1)) < 0.01
    # the fit changed only what it fits
    assert fitted.microbatch_overhead_s == start.microbatch_overhead_s
    assert fitted.compute_eff["a100-40gb"] == start.compute_eff["a100-40gb"]


def test_user_mistakes_exit_2(capsys):
    assert dc.main(["--device", "cpu", "--out", "/nonexistent/x"]) == 2  # no GPU type for a CPU
    assert "--gpu-type" in capsys.readouterr().err
    assert dc.main(["--device", "cpu", "--gpu-type", "tpu-v9"]) == 2
    assert "no catalog GPU" in capsys.readouterr().err
    assert dc.main(["--device", "cpu", "--gpu-type", "a10", "--models", "no-such-model"]) == 2
    assert "no-such-model" in capsys.readouterr().err


@pytest.mark.slow
def test_cpu_run_measures_every_plan_and_writes_loadable_parameters(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "out"
    run = subprocess.run([sys.executable, "bench/device_check.py", "--device", "cpu", "--gpu-type", "a10", "--scaled",
                          "--models", "gpt-350M", "--batch", "2", "--steps", "1", "--warmup", "0", "--repeats", "1",
                          "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    res = json.loads((out / "device_check.json").read_text())
    plans = {p.describe() for p in dc.single_gpu_plans(2)}
    assert {r["describe"] for r in res["rows"]} | {r["describe"] for r in res["failed"]} == plans
    for r in res["rows"]:
        assert r["measured_s"] > 0 and r["analytical_s"] > 0 and r["profile_s"] > 0
        assert r["rel_err"] == pytest.approx(r["analytical_s"] / r["measured_s"] - 1)
    assert res["layers"] and all(r["profiled_s"] > 0 for r in res["layers"])
    params = CostParams.model_validate_json((out / "device_params.json").read_text())
    assert params.compute_eff["a10"] == pytest.approx(res["fitted"]["compute_eff"])
    assert params.recompute_cost == pytest.approx(res["fitted"]["recompute_cost"])
    # the set as it was fitted: the runners' settings, not Arena's (fp32 Wide-ResNet, GShard MoE)
    assert params.dtype_by_family == {} and params.moe_einsum_group is None
    assert (out / "device_check.md").read_text().rstrip().endswith("freshness: tests/test_bench_fresh.py.")


@pytest.mark.parametrize("model", ["gpt-350M", "bert-760M", "moe-690M", "llama-7B"])
def test_runner_semantics_price_what_the_runner_keeps_for_backward(model):
    """The device check prices the runners' fused attention: its activation model then stays at or above
    what the runners' stack keeps for backward (no plan it calls feasible runs out of memory on that
    account) and within 2x of it, where the catalog's stored score matrices are far above it at full length."""
    torch = pytest.importorskip("torch")
    from arena_opt.perf.analytical import cost_table, micro_batch
    from arena_opt.profiling.layers import _saved_bytes
    from models.torch_layers import LayerStack, scaled_arch, synthetic_batch

    arch = scaled_arch(get_arch(model))
    assert dc.runner_arch(arch).flash_attention and not dc.runner_arch(get_arch("wide_resnet-1B")).flash_attention
    params = CostParams(dtype_by_family={})
    torch.manual_seed(0)
    for b in (1, 4):
        _, kept = _saved_bytes(LayerStack(arch, seed=0), synthetic_batch(arch, 0, b)[0])
        modelled = 2 * micro_batch(cost_table(dc.runner_arch(arch), params), b, 1).full_act.sum()  # fp32 on CPUs
        assert kept <= modelled <= 2 * kept, (b, kept, modelled)
