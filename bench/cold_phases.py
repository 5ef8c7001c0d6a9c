"""CPU seconds of each phase of a cold arena round, in one process (issue 14's cold-planning target).

    python bench/cold_phases.py instances/medium.json instances/large.json

Per snapshot, with an empty plan cache (ARENA_OPT_CACHE is pointed at a file that does not exist): the
imports and CLI parser (first snapshot only), grids and plans (`GridCatalog.all_grids` of the arena policy),
the round's problem and level-1 model, the Pyomo import (first snapshot only) and its hand-off
(`to_pyomo`). CPU time (`time.process_time`) rather than wall time: on a shared host it is the figure that
compares across runs. The first snapshot also pays Pyomo's first-use costs in `to_pyomo`: one snapshot per
call gives each its cold-process figures. A probe for before/after comparisons (run it from each tree with PYTHONPATH set to
that tree): it writes no result file and is not in run_all; bench/speed.py times whole CLI calls.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("snapshots", nargs="+")
    args = ap.parse_args(argv)
    os.environ["ARENA_OPT_CACHE"] = str(Path(tempfile.mkdtemp()) / "none.json")  # cold: nothing to load
    c0 = time.process_time()
    from arena_opt.cli import _estimator, build_parser

    build_parser()
    from arena_opt.grids import GridCatalog
    from arena_opt.io import load_model
    from arena_opt.milp.model import level1_model
    from arena_opt.milp.problem import build_problem
    from arena_opt.policies import make_policy
    from arena_opt.policies.flags import options_for
    from arena_opt.snapshot import ClusterSnapshot

    imports = time.process_time() - c0
    print("| snapshot | imports + CLI parser | grids + plans | problem + level 1 | Pyomo import | to_pyomo | grids "
          "| load |\n|---|---:|---:|---:|---:|---:|---:|---:|")
    for path in args.snapshots:
        snap = load_model(path, ClusterSnapshot)
        est = _estimator(argparse.Namespace(perf_table=None, table_mode="override"))
        o = make_policy("arena", options_for("arena", {}), estimator=est).options
        c1 = time.process_time()
        grids = GridCatalog.of(est, o.caution).all_grids(snap, max_gpus_default=o.max_gpus_per_job)
        c2 = time.process_time()
        lm = level1_model(p := build_problem(snap, grids, o))
        c3 = time.process_time()
        from pyomo.contrib.solver.solvers.highs import Highs  # noqa: F401 - the import the solve pays

        from arena_opt.milp.linear import to_pyomo

        c4 = time.process_time()
        to_pyomo(lm)
        c5 = time.process_time()
        load = os.getloadavg()[0]
        print(f"| {path} | {imports:.3f} | {c2 - c1:.3f} | {c3 - c2:.3f} | {c4 - c3:.3f} | {c5 - c4:.3f} "
              f"| {len(p.grids)} | {load:.1f} |")
        imports = 0.0
    return 0


if __name__ == "__main__":
    sys.exit(main())
