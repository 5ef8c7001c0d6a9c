"""One GPU's check of the estimates (issue 16's prepared script for a lent device).

On one device: the profiler's per-layer times and the planner's single-GPU plans of two models, each
measured, against the estimates the scheduler decides on; then the device's cost parameters fitted from
those measurements.

    python bench/device_check.py [--out DIR] [--models gpt-350M,wide_resnet-500M] [--batch 16]
                                 [--device cuda] [--gpu-type NAME] [--steps 5] [--warmup 2] [--scaled]

On a lent machine (its python3 holds torch with CUDA but not pydantic; carry pydantic's wheels for Python
3.12 in `.whl`, as the device tool's README says: pydantic, pydantic-core, annotated-types, typing-inspection),
with `carry: [".whl"]`:

    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
    PYTHONUNBUFFERED=1 python3 bench/device_check.py --out $OUT

Per model (catalog size; `--scaled`: the CPU test's scaled-down one):
1. the profiler (`arena_opt.profiling.layers.profile_model`, wall clock, the runners' precision: bf16 on GPUs)
   times every distinct layer at every micro-batch size the plans below run; each layer's forward + backward
   is set against the analytical model's (`perf/analytical.py`, the committed calibrated parameters);
2. every plan of the planner's single-GPU space (each power-of-two micro-batch count dividing the batch, with
   and without rematerialisation) is priced three ways: the analytical model at the device's catalog entry
   (the calibrated types' trend with peak FLOP/s where the calibration never saw the type), the profile composed
   (`perf/profile_costs.plan_time`), and measured: the runners' own training step (`profiling/measure.py`,
   one process; a plan that runs out of memory is reported, not dropped silently).
   On GPUs each plan's peak allocated memory is set against the planner's memory model (what decides
   which plans fit).
3. the device's parameters are fitted on the measured plans: its compute efficiency, each family's
   saturation (the micro-batch size at which layers run at half rate: what the micro-batch count trades)
   and the share of a forward that rematerialisation costs. On one GPU the per-slot cost moves with the
   micro-batch count exactly as saturation does, so it is kept at its calibrated value, not fitted. In
   sample and leave-one-model-out (fitted on the other model's plans only).
The analytical model prices the runners' runtime here, not Arena's: every family at bf16 (Arena's Wide-ResNet
ran fp32), MoE experts dispatched by index (no GShard einsum) and fused attention, which keeps no score
matrix for backward (the catalog's transformers keep Alpa's: on the CPU the runners' gpt-350M keeps 1.5 GiB
for backward at one sample, the catalog's model 6.1 GiB, the fused-attention model 2.4 GiB).

Writes device_check.json, device_check.md and device_params.json: the fitted parameters whole (a CostParams:
the committed ones in the runners' settings above, with the device's efficiency, saturations and recompute
share as fitted together; the efficiency alone would not carry over to the committed set, whose Wide-ResNet
runs in fp32 and whose knob prices are Arena's runtime's).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from pathlib import Path

_HERE = Path(__file__).resolve().parent
# run as `python bench/X.py`, bench/ comes first on sys.path and bench/runners.py would shadow the
# runners package: the repository root goes first, bench/ last
if sys.path and Path(sys.path[0]).resolve() == _HERE:
    sys.path.append(sys.path.pop(0))
sys.path.insert(0, str(_HERE.parent))

import numpy as np  # noqa: E402
from _perf_common import command, err_stats, fmt_pct, git_rev, machine, md_table, write  # noqa: E402
from estimator_accuracy import SCALES  # noqa: E402

from arena_opt.gpus import BUILTIN_GPUS, GpuSpec, canonical_gpu  # noqa: E402
from arena_opt.io import atomic_write  # noqa: E402
from arena_opt.perf import calibrate as cal  # noqa: E402
from arena_opt.perf import profile_costs as pc  # noqa: E402
from arena_opt.perf import profile_db as pdb  # noqa: E402
from arena_opt.perf.analytical import (GIB, CostParams, calibrated_params, cost_table, layer_costs,  # noqa: E402
                                       layer_terms, links_for, rate_vector)
from arena_opt.perf.compose import evaluate_split  # noqa: E402
from arena_opt.perf.planner import microbatch_counts  # noqa: E402
from arena_opt.plan import Plan  # noqa: E402
from models.catalog import Arch, get_arch  # noqa: E402

DEFAULT_MODELS = "gpt-350M,wide_resnet-500M"
HUBER = 0.05  # log units, as the calibration's fit (calibrate.FitSpec.huber_delta)


def log(msg: str) -> None:
    print(f"[device] {msg}", file=sys.stderr, flush=True)


def device_gpu_type(device_name: str) -> str | None:
    """The catalog entry a torch device name stands for ("NVIDIA H100 80GB HBM3" -> h100-80gb), or None
    where no entry, or more than one, fits it."""
    n = device_name.lower()
    hits = [g for g in BUILTIN_GPUS if g.partition("-")[0] in n]
    if len(hits) > 1:  # "a10" is in every A100's name: the entry whose memory the name gives too
        hits = [g for g in hits if g.partition("-")[2] and g.partition("-")[2] in n] or hits
    return hits[0] if len(hits) == 1 else None


def runner_arch(arch: Arch) -> Arch:
    """The architecture as the runners run it: their attention is torch's fused scaled-dot-product kernel,
    which keeps no s x s score matrix for backward (the catalog's transformers keep Alpa's, as Arena ran them)."""
    return arch if arch.family == "wide_resnet" else arch.model_copy(update={"flash_attention": True})


def runner_params(base: CostParams) -> CostParams:
    """The calibrated parameters as the runners' runtime runs a model: every family at bf16, MoE by index."""
    return base.model_copy(update={"dtype_by_family": {}, "moe_einsum_group": None})


def single_gpu_plans(batch: int) -> list[Plan]:
    """The planner's plan space on one GPU: every micro-batch count it tries, with and without recomputation."""
    return [Plan(pp=1, dp=1, tp=1, num_microbatches=m, recompute=rc)
            for m in microbatch_counts(batch, 1) for rc in (False, True)]


def plan_row_coefficients(arch: Arch, gpu: GpuSpec, params: CostParams, batch: int, plan: Plan) -> np.ndarray:
    """The plan's iteration time as coefficients of `analytical.RATE_NAMES` (one stage, pp = 1): time =
    coefficients . rate_vector, so the fit below moves rates without re-deriving the plan."""
    table = cost_table(arch, params)
    t = layer_terms(table, gpu, links_for(gpu, None, params), nodes=1, gpus_per_node=1,
                    batch=batch, dp=1, tp=1, m=plan.num_microbatches, recompute=plan.recompute)
    return t.stage_row(0, table.num_layers, plan.num_microbatches, 1, sends=False)


def analytical_plan(arch: Arch, gpu: GpuSpec, gpu_type: str, params: CostParams, batch: int,
                    plan: Plan) -> tuple[float, float]:
    """(iteration s, peak GiB) of a one-GPU plan under the analytical model."""
    table = cost_table(arch, params)
    lc = layer_costs(table, gpu, gpu_type, links_for(gpu, None, params), nodes=1, gpus_per_node=1, batch=batch,
                     dp=1, tp=1, m=plan.num_microbatches, recompute=plan.recompute, params=params)
    split = evaluate_split(lc, [(0, table.num_layers)], plan.num_microbatches)
    return split.iter_time_s, split.mem_bytes[0] / GIB + params.mem_reserve_gib


def layer_rows(prof: pdb.ModelProfile, arch: Arch, gpu: GpuSpec, gpu_type: str, params: CostParams) -> list[dict]:
    """Each profiled (layer, micro-batch) sample's forward + backward against the analytical layer's."""
    table = cost_table(arch, params)
    links = links_for(gpu, None, params)
    step_s = {b: layer_costs(table, gpu, gpu_type, links, nodes=1, gpus_per_node=1, batch=b, dp=1, tp=1, m=1,
                             recompute=False, params=params).step_s
              for b in {s.micro_batch for lp in prof.layers for s in lp.at(1)}}  # every layer at once, per size
    rows = []
    for lp in prof.layers:
        for s in lp.at(1):
            est = float(step_s[s.micro_batch][lp.indices[0]])
            rows.append({"model": arch.name, "layer": lp.indices[0], "kind": lp.kind, "count": len(lp.indices),
                         "micro_batch": s.micro_batch, "profiled_s": s.fwd_s + s.bwd_s, "analytical_s": est,
                         "rel_err": est / (s.fwd_s + s.bwd_s) - 1.0})
    return rows


# ---------------------------------------------------------------------------- the device's fit


def _with(params: CostParams, gpu_type: str, theta: np.ndarray, families: list[str]) -> CostParams:
    eff, rc, *sat = np.exp(theta)
    return params.model_copy(update={
        "compute_eff": {**params.compute_eff, gpu_type: float(min(eff, 1.0))},
        "recompute_cost": float(min(max(rc, 1e-3), 1.5)),
        "saturation_samples": {**params.saturation_samples, **{f: float(s) for f, s in zip(families, sat)}}})


def _eff(params: CostParams, gpu_type: str) -> float:
    """The catalog type's compute efficiency under `params` (its own, else the fitted types' peak trend)."""
    return params.eff(gpu_type, BUILTIN_GPUS[gpu_type].peak_tflops)


def _row_rates(rows: list[dict], archs: dict[str, Arch], gpu_type: str, params: CostParams) -> np.ndarray:
    """`rate_vector` of every row's model under `params` (one GPU: no link is crossed, "nvlink" is a placeholder)."""
    fams = [archs[r["model"]].family for r in rows]
    peak = BUILTIN_GPUS[gpu_type].peak_tflops
    return np.stack([rate_vector(params, gpu_type, peak, params.dtype(f), "nvlink", f) for f in fams])


def fit_device(rows: list[dict], coef: dict[int, np.ndarray], archs: dict[str, Arch], gpu_type: str,
               params: CostParams) -> CostParams:
    """The device's compute efficiency, rematerialisation share and each family's saturation fitted on
    measured one-GPU plans (robust loss on log(predicted / measured), as the calibration); the other
    parameters kept. Families without a measured row keep their saturation."""
    families = sorted({archs[r["model"]].family for r in rows})
    C = np.stack([coef[r["index"]] for r in rows])
    meas = np.log([r["measured_s"] for r in rows])
    has_rc = any(r["plan"]["recompute"] for r in rows)

    def loss(theta: np.ndarray) -> float:
        rates = _row_rates(rows, archs, gpu_type, _with(params, gpu_type, theta, families))
        r = np.log(np.maximum(np.einsum("ij,ij->i", C, rates), 1e-12)) - meas
        # a share no row measures stays where it was (weak pull to the committed value)
        pull = 0.0 if has_rc else (theta[1] - math.log(params.recompute_cost)) ** 2
        return float(np.mean(HUBER ** 2 * (np.sqrt(1 + (r / HUBER) ** 2) - 1)) + pull)

    x0 = np.log([_eff(params, gpu_type), params.recompute_cost]
                + [params.saturation_samples.get(f) or 0.5 for f in families])
    theta = cal.nelder_mead(loss, x0, step=0.5)
    return _with(params, gpu_type, cal.nelder_mead(loss, theta, step=0.1), families)


def predict_rows(rows: list[dict], coef: dict[int, np.ndarray], archs: dict[str, Arch], gpu_type: str,
                 params: CostParams) -> list[float]:
    return [float(coef[r["index"]] @ rates) for r, rates in zip(rows, _row_rates(rows, archs, gpu_type, params))]


# ---------------------------------------------------------------------------- the run


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "out/device_check"))
    ap.add_argument("--models", default=DEFAULT_MODELS)
    ap.add_argument("--batch", type=int, default=16, help="global batch of every plan (samples)")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--gpu-type", default=None, help="catalog entry the device is priced as (default: from the "
                                                      "device's name; required on cpu)")
    ap.add_argument("--steps", type=int, default=5, help="timed steps per plan")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps per plan")
    ap.add_argument("--repeats", type=int, default=5, help="profiler repeats per layer shape")
    ap.add_argument("--scaled", action="store_true", help="the scaled-down models (CPU test)")
    args = ap.parse_args(argv)
    t_start = time.perf_counter()
    import torch

    from arena_opt.profiling.layers import profile_model
    from arena_opt.profiling.measure import Case, measure_each
    from models.torch_layers import scaled_arch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("--device cuda: no CUDA device is visible to torch here (use --device cpu --gpu-type T for the "
              "CPU run)", file=sys.stderr)
        return 2
    device_name = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"
    gpu_type = canonical_gpu(args.gpu_type) if args.gpu_type else device_gpu_type(device_name)
    if gpu_type not in BUILTIN_GPUS:
        print(f"--gpu-type: {args.gpu_type or device_name!r} is no catalog GPU (one of "
              f"{', '.join(sorted(BUILTIN_GPUS))})", file=sys.stderr)
        return 2
    if args.batch < 1 or args.steps < 1 or args.warmup < 0:
        print("--batch and --steps must be >= 1, --warmup >= 0", file=sys.stderr)
        return 2
    gpu = BUILTIN_GPUS[gpu_type]
    committed = calibrated_params()
    params = runner_params(committed)
    log(f"{device_name} priced as {gpu_type} (compute efficiency {_eff(params, gpu_type):.3f}"
        f"{'' if gpu_type in params.compute_eff else ', by the fitted types peak trend'})")

    archs: dict[str, Arch] = {}
    for name in args.models.split(","):
        try:
            arch = get_arch(name)
        except (KeyError, ValueError) as e:
            print(f"--models: {name!r}: {e}", file=sys.stderr)
            return 2
        # the CPU accuracy bench's sizes where it has them (a Wide-ResNet image large enough for one-sample
        # batch norm)
        archs[name] = scaled_arch(arch, **SCALES.get(name, {})) if args.scaled else arch
    plans = single_gpu_plans(args.batch)
    sizes = tuple(sorted({args.batch // p.num_microbatches for p in plans}))

    layer_out, profiles, profile_s = [], {}, {}
    for name, arch in archs.items():
        t0 = time.perf_counter()
        profiles[name] = prof = profile_model(arch, device=args.device, micro_batches=sizes, tp_degrees=(1,),
                                              dp_degrees=(), repeats=args.repeats, warmup=2,
                                              threads=1 if args.device == "cpu" else None, progress=None)
        profile_s[name] = time.perf_counter() - t0
        layer_out += layer_rows(prof, runner_arch(arch), gpu, gpu_type, params)
        log(f"{arch.name}: {len(prof.layers)} distinct layers profiled in {profile_s[name]:.0f} s")

    names = [n for n in archs for _ in plans]
    cases = [Case(archs[n], p, args.batch) for n in archs for p in plans]
    t0 = time.perf_counter()
    measured = measure_each(cases, steps=args.steps, warmup=args.warmup, device=args.device)
    measure_s = time.perf_counter() - t0
    log(f"{len(cases)} plans measured in {measure_s:.0f} s")

    comm = pc.comm_model(pdb.ProfileDB(), args.device)  # one device: no collective runs
    topo = pc.Topology(intra="nvlink" if args.device == "cuda" else "loopback")
    rows, failed, coef = [], [], {}
    for i, (name, case, r) in enumerate(zip(names, cases, measured)):
        priced = runner_arch(case.arch)
        est_s, mem_gib = analytical_plan(priced, gpu, gpu_type, params, args.batch, case.plan)
        coef[i] = plan_row_coefficients(priced, gpu, params, args.batch, case.plan)
        row = {"index": i, "model": name, "arch": case.arch.name, "plan": case.plan.model_dump(),
               "describe": case.plan.describe(), "analytical_s": est_s, "analytical_mem_gib": mem_gib,
               "profile_s": pc.plan_time(profiles[name], case.plan, args.batch, comm, topo).iter_time_s}
        if "error" in r:
            failed.append({**row, "error": r["error"]})
            log(f"  {case.arch.name} {case.plan.describe()}: did not run: {r['error']}")
            continue
        peak = r.get("peak_mem_bytes")  # on GPUs: the allocator's peak, without CUDA's context (the reserve)
        row.update(measured_s=r["iter_s"], times=r["times"], rel_err=est_s / r["iter_s"] - 1.0,
                   rel_err_profile=row["profile_s"] / r["iter_s"] - 1.0,
                   measured_peak_gib=peak / GIB if peak else None,
                   mem_rel_err=(mem_gib - params.mem_reserve_gib) * GIB / peak - 1.0 if peak else None)
        rows.append(row)
        log(f"  {case.arch.name} {case.plan.describe():18s} measured {r['iter_s']:.4f} s, analytical "
            f"{est_s:.4f} s ({fmt_pct(row['rel_err'])}), profile {row['profile_s']:.4f} s "
            f"({fmt_pct(row['rel_err_profile'])})")
    if not rows:
        print("no plan ran on the device; nothing to fit (see the errors above)", file=sys.stderr)
        return 1

    fitted = fit_device(rows, coef, archs, gpu_type, params)
    for r, t in zip(rows, predict_rows(rows, coef, archs, gpu_type, fitted)):
        r["fitted_s"], r["rel_err_fitted"] = t, t / r["measured_s"] - 1.0
    held_out = {}
    for name in archs:  # the device's fit on the other models' plans, priced on this one's
        train = [r for r in rows if r["model"] != name]
        test = [r for r in rows if r["model"] == name]
        if not train or not test:
            continue
        # a family no training row has keeps the committed saturation (fit_device fits only the rows' families)
        fold = fit_device(train, coef, archs, gpu_type, params)
        held_out[name] = {"compute_eff": _eff(fold, gpu_type), "rel_err": [
            t / r["measured_s"] - 1.0 for r, t in zip(test, predict_rows(test, coef, archs, gpu_type, fold))]}

    # the fitted set whole: its efficiency was fitted together with its knob prices, in the runners' settings
    params_path = args.out / "device_params.json"
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write(params_path, fitted.model_dump_json(indent=1) + "\n")

    knobs = knob_table(rows)
    payload = {"command": command(), "git": git_rev(), "machine": machine(), "device": device_name,
               "gpu_type": gpu_type, "batch": args.batch, "steps": args.steps, "warmup": args.warmup,
               "scaled": args.scaled, "seconds": time.perf_counter() - t_start, "profile_s": profile_s,
               "measure_s": measure_s, "compute_eff_committed": _eff(params, gpu_type),
               "fitted": {"compute_eff": _eff(fitted, gpu_type), "recompute_cost": fitted.recompute_cost,
                          "saturation_samples": {f: fitted.saturation_samples.get(f) for f in
                                                 sorted({a.family for a in archs.values()})},
                          "microbatch_overhead_s": fitted.microbatch_overhead_s},
               "errors": {"analytical": err_stats([r["rel_err"] for r in rows]),
                          "profile": err_stats([r["rel_err_profile"] for r in rows]),
                          "fitted": err_stats([r["rel_err_fitted"] for r in rows]),
                          "held_out": {n: err_stats(v["rel_err"]) for n, v in held_out.items()},
                          "layers": err_stats([r["rel_err"] for r in layer_out]),
                          "memory": err_stats([r["mem_rel_err"] for r in rows if r["mem_rel_err"] is not None])},
               "held_out": held_out, "knobs": knobs, "rows": rows, "failed": failed, "layers": layer_out}
    jp, mp = write(args.out, "device_check", payload, render(payload), written=[params_path])
    print(render(payload))
    log(f"wrote {jp}, {mp} and {params_path}")
    return 0


def knob_table(rows: list[dict]) -> list[dict]:
    """What each knob the planner turns does on the device, measured and modelled: every plan's time over its
    model's plan with the fewest micro-batches and no recomputation (the plain plan)."""
    out = []
    for model in sorted({r["model"] for r in rows}):
        mine = [r for r in rows if r["model"] == model]
        plain = [r for r in mine if not r["plan"]["recompute"]]
        if not plain:
            continue
        ref = min(plain, key=lambda r: r["plan"]["num_microbatches"])
        for r in mine:
            if r is ref:
                continue
            out.append({"model": model, "plan": r["describe"], "against": ref["describe"],
                        "measured_ratio": r["measured_s"] / ref["measured_s"],
                        "analytical_ratio": r["analytical_s"] / ref["analytical_s"]})
    return out


def render(p: dict) -> str:
    e = p["errors"]
    out = [f"# Device check: {p['device']} priced as {p['gpu_type']}\n",
           f"Command: `{p['command']}` (git {p['git']}), {p['seconds']:.0f} s; batch {p['batch']}, "
           f"{p['warmup']} untimed and {p['steps']} timed steps per plan"
           + (" (scaled-down models: a test of the script, not of a GPU)" if p["scaled"] else "") + ".\n",
           "Relative error = estimate / measured - 1. Analytical: the committed calibrated parameters in the "
           "runners' precision, compute efficiency "
           f"{p['compute_eff_committed']:.3f}; profile: the per-layer profile composed; fitted: this device's "
           f"efficiency {p['fitted']['compute_eff']:.3f}, recompute share {p['fitted']['recompute_cost']:.3f}, "
           "saturation " + ", ".join(f"{k} {v:.3g}" for k, v in p["fitted"]["saturation_samples"].items())
           + " samples (in sample).\n",
           md_table(["estimate", "plans", "median |err|", "p90 |err|", "median signed"],
                    [[k, e[k]["n"], fmt_pct(e[k].get("median")), fmt_pct(e[k].get("p90")),
                      fmt_pct(e[k].get("median_signed"))] for k in ("analytical", "profile", "fitted")]
                    + [[f"fitted without {n}", s["n"], fmt_pct(s.get("median")), fmt_pct(s.get("p90")),
                        fmt_pct(s.get("median_signed"))] for n, s in e["held_out"].items()]),
           "\n## Every plan\n",
           md_table(["model", "plan", "measured s", "analytical s", "err", "profile s", "err", "fitted err",
                     "model GiB", "measured peak GiB", "memory err"],
                    [[r["arch"], r["describe"], f"{r['measured_s']:.4f}", f"{r['analytical_s']:.4f}",
                      fmt_pct(r["rel_err"]), f"{r['profile_s']:.4f}", fmt_pct(r["rel_err_profile"]),
                      fmt_pct(r["rel_err_fitted"]), f"{r['analytical_mem_gib']:.1f}",
                      "-" if r["measured_peak_gib"] is None else f"{r['measured_peak_gib']:.1f}",
                      fmt_pct(r["mem_rel_err"])] for r in p["rows"]]),
           "\nModel GiB includes the reserve for CUDA's context and allocator slack "
           "(`CostParams.mem_reserve_gib`); the memory error sets the model without it against the allocator's "
           "peak (`torch.cuda.max_memory_allocated`; not measured on CPUs).\n",
           "\n## The knobs: each plan against its model's plain plan (fewest micro-batches, no recomputation)\n",
           md_table(["model", "plan", "against", "measured", "analytical"],
                    [[k["model"], k["plan"], k["against"], f"x{k['measured_ratio']:.3f}", f"x{k['analytical_ratio']:.3f}"]
                     for k in p["knobs"]]),
           "\n## Per layer: profiled forward + backward against the analytical layer\n",
           md_table(["model", "layer", "kind", "layers like it", "micro-batch", "profiled ms", "analytical ms", "err"],
                    [[r["model"], r["layer"], r["kind"], r["count"], r["micro_batch"], f"{1e3 * r['profiled_s']:.3f}",
                      f"{1e3 * r['analytical_s']:.3f}", fmt_pct(r["rel_err"])] for r in p["layers"]])]
    if p["failed"]:
        out += ["\n## Plans that did not run\n",
                md_table(["model", "plan", "model GiB", "error"],
                         [[r["arch"], r["describe"], f"{r['analytical_mem_gib']:.1f}", r["error"][:160]]
                          for r in p["failed"]])]
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
