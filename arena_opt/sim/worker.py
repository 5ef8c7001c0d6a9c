"""One bench run in its own process: `python -m arena_opt.sim.worker CONFIG.json OUT.json`.

Each policy gets a fresh process so that timings do not share caches or memory, and so that the
process-wide HiGHS thread setting of one policy cannot clash with another's. Progress goes to
stdout as `progress <finished> <total>` lines."""

from __future__ import annotations

import json
import sys
import time

from arena_opt.errors import InputError
from arena_opt.sim.config import RunConfig, run_config
from arena_opt.sim.engine import SimulationError
from arena_opt.sim.results import write_result


def main(argv: list[str]) -> int:
    cfg = RunConfig.model_validate(json.loads(open(argv[0]).read()))
    last = [0.0]

    def progress(t, finished, total):
        now = time.monotonic()
        if now - last[0] > 0.5:
            last[0] = now
            print(f"progress {finished} {total}", flush=True)

    try:
        out = run_config(cfg, progress)
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except SimulationError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    write_result(argv[1], out)
    print(f"progress {out['finished']} {out['jobs']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
