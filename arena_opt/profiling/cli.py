"""`arena-opt profile`: measure a catalog model's layers (and optionally the host's collectives) on
one device and store them in a profile database that `PerfEstimator(profiles=...)` plans from."""

from __future__ import annotations

import argparse
import sys
import time

from arena_opt.argtypes import nonneg_int, positive_int
from arena_opt.errors import InputError


def _int_list(text: str, what: str) -> tuple[int, ...]:
    try:
        vals = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise InputError(f"{what}: cannot read {text!r}; expected comma-separated integers, e.g. 1,2,4") from None
    if not vals or any(v <= 0 for v in vals):
        raise InputError(f"{what}: values must be positive integers (value {text!r})")
    return vals


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "profile", help="profile a model's layers (and collectives) on this device into a profile database",
        description=__doc__)
    p.add_argument("--model", required=False, help="catalog model, e.g. gpt-350M (or Arena's bert__1.3B)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--batch", default="1,2,4,8", help="micro-batch sizes to measure (default 1,2,4,8)")
    p.add_argument("--tp", default="1,2,4,8", help="tensor-parallel shard shapes to measure (default 1,2,4,8; "
                                                  "degrees a layer's dimensions do not divide are skipped)")
    p.add_argument("--full-size", action="store_true",
                   help="profile the catalog size (default on cuda); on cpu the default is the scaled-down "
                        "model the runners train (--max-hidden etc.)")
    p.add_argument("--max-hidden", type=positive_int, default=64)
    p.add_argument("--max-layers", type=positive_int, default=4)
    p.add_argument("--seq-len", type=positive_int, default=32)
    p.add_argument("--max-vocab", type=positive_int, default=512)
    p.add_argument("--warmup", type=nonneg_int, default=2)
    p.add_argument("--repeats", type=positive_int, default=5)
    p.add_argument("--threads", type=positive_int, default=1, help="intra-op threads on cpu (default 1, as the runners' "
                                                          "one-process-per-rank CPU runs)")
    p.add_argument("--whole-stack", action="store_true",
                   help="also time the whole model at every micro-batch size against the sum of its layers "
                        "(the whole-stack correction's samples; off by default, as the correction is)")
    p.add_argument("--comm", action="store_true", help="also benchmark collectives and fit alpha-beta")
    p.add_argument("--comm-only", action="store_true", help="only benchmark collectives")
    p.add_argument("--comm-worlds", default="2,4", help="process counts of the collective benchmark")
    p.add_argument("--link", default=None, help="link kind the collectives cross (default: loopback on cpu, "
                                                "nvlink on cuda)")
    p.add_argument("--out", default="profiles.json", help="profile database to create or update")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.set_defaults(func=handler)


def handler(args: argparse.Namespace) -> int:
    from arena_opt.perf import profile_db as pdb

    if not args.comm_only and not args.model:
        raise InputError("--model is required (or --comm-only)")
    if args.warmup < 0 or args.repeats <= 0 or args.threads <= 0:
        raise InputError(f"--warmup must be >= 0 and --repeats, --threads > 0 "
                         f"(values {args.warmup}, {args.repeats}, {args.threads})")
    micro = _int_list(args.batch, "--batch")
    tps = _int_list(args.tp, "--tp")
    worlds = _int_list(args.comm_worlds, "--comm-worlds")
    db = pdb.load_or_new(args.out)  # a bad existing file is reported before any measuring
    say = (lambda msg: None) if args.quiet else (lambda msg: print(msg, file=sys.stderr, flush=True))
    t0 = time.perf_counter()
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise InputError("--device cuda: no CUDA device is visible to torch on this host")
    if not args.comm_only:
        from models.catalog import get_arch

        try:
            arch = get_arch(args.model)
        except KeyError as e:
            raise InputError(f"--model: {e.args[0]}") from None
        if not args.full_size and args.device == "cpu":
            from models.torch_layers import scaled_arch

            arch = scaled_arch(arch, max_hidden=args.max_hidden, max_layers=args.max_layers, seq_len=args.seq_len,
                               max_vocab=args.max_vocab)
        from arena_opt.profiling.layers import profile_model

        prof = profile_model(arch, device=args.device, micro_batches=micro, tp_degrees=tps, warmup=args.warmup,
                             repeats=args.repeats, threads=args.threads if args.device == "cpu" else None,
                             whole_stack=args.whole_stack, progress=say)
        db.put_model(prof)
        pdb.save(db, args.out)
        print(f"{prof.model} on {prof.device} ({prof.device_name}): {len(prof.layers)} distinct layers, "
              f"tp {prof.tp_degrees}, micro-batches {list(micro)} -> {args.out}")
    if args.comm or args.comm_only:
        from arena_opt.profiling import commbench

        if args.device == "cuda":
            import torch

            worlds = tuple(w for w in worlds if w <= torch.cuda.device_count())
            if not worlds:
                raise InputError("--comm on cuda needs at least 2 visible GPUs")
        points = commbench.run(worlds, device=args.device, progress=say)
        link = args.link or ("loopback" if args.device == "cpu" else "nvlink")
        for f in commbench.fit(points, args.device, "gloo" if args.device == "cpu" else "nccl", link):
            db.put_comm(f)
            if f.group is None:
                print(f"{f.collective:>14} over {link}: alpha {1e6 * f.alpha_s:.1f} us, "
                      f"{f.bandwidth_bps / 1e9:.2f} GB/s (mean fit error {100 * f.mean_rel_err:.0f}%)")
        pdb.save(db, args.out)
    say(f"[profile] done in {time.perf_counter() - t0:.0f} s")
    return 0
