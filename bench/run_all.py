"""Rerun the benches whose results lie in bench/results: all of them, or only the stale ones.

    python bench/run_all.py [--stale] [--only NAME,...] [--skip NAME,...] [--dry-run]

A result is stale when a file its provenance names changed (bench/_provenance.py; tests/test_bench_fresh.py
fails on it). Each bench runs with the command its result was made with (BENCHES; the freshness test checks
that every result records exactly that command), from the repository root, one at a time: most of them time
something on this machine, so nothing runs beside them. A bench that reads another's result runs after it
(proxy_quality after estimator, bound-philly after simulate); with --stale the staleness is computed again
after each run, so a result that a rerun made stale is rerun too. A bench that fails is reported and the
next one runs (a bench past --limit-factor times its expected time is stopped, children included); the
results it would have written keep their old content (every result file is written
atomically, the JSON with the provenance last). Exit status 1 when any bench failed.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

_HERE = Path(__file__).resolve().parent
if sys.path and Path(sys.path[0]).resolve() == _HERE:
    sys.path.append(sys.path.pop(0))
sys.path.insert(0, str(_HERE.parent))

import _provenance as prov  # noqa: E402


@dataclass(frozen=True)
class Bench:
    result: str  # the JSON in bench/results that carries the provenance
    steps: tuple[str, ...]  # command lines run from the repository root; {tmp}: a scratch folder
    expected_s: float  # about how long on the 2-core machine (from the last recorded run)
    after: tuple[str, ...] = ()  # results this one reads
    writes: tuple[str, ...] = ()  # its files beside the JSON and the Markdown

    @property
    def name(self) -> str:
        return self.result.removesuffix(".json")

    @property
    def files(self) -> tuple[str, ...]:
        return (self.result, f"{self.name}.md", *self.writes)

    @property
    def command(self) -> str:
        """The command its result records (the last step)."""
        return self.steps[-1]


BENCHES = (
    # first: it writes the committed band model arena_opt/perf/band.json (outside bench/results), which
    # every bench that loads arena_opt.perf records as code
    Bench("band.json", ("python bench/band.py",), 80),
    Bench("estimator.json", ("python bench/estimator.py",), 60, writes=("calibrated_params.json",)),
    Bench("proxy_quality.json", ("python bench/proxy_quality.py",), 30, after=("estimator.json",)),
    # the estimator's folds with the held-out type's efficiency from its single-GPU rows (a one-device profile)
    Bench("estimator_profiled.json", ("python bench/estimator_profiled.py",), 10, after=("estimator.json",)),
    Bench("stage_shapes.json", ("python bench/stage_shapes.py",), 300, after=("estimator.json",)),
    Bench("jct_bound.json", ("python bench/jct_bound.py",), 20),
    Bench("bound-tiny.json", ("python bench/bound.py --parts tiny --name bound-tiny",), 30),
    Bench("bound-small.json", ("python bench/bound.py --parts small --name bound-small",), 400),
    Bench("speed.json", ("python bench/speed.py",), 120),
    # issue 14's round of 10,000 jobs on 40,960 GPUs, 10% of the GPUs busy and all free
    Bench("speed-10k.json", ("python bench/speed.py --name speed-10k"
                             " --gen a100:2560x4,v100:640x16,a40:5120x2,a10:5120x2/10000/7/0.1"
                             " --gen a100:2560x4,v100:640x16,a40:5120x2,a10:5120x2/10000/7/0.0",), 200),
    # issue 13.5's 150,000-job snapshot (`gen-instance --preset large --jobs 150000 --seed 3`), cold and warm
    # the bound on those two rounds' objective (LP relaxations, the MILP for 60 s) and their CLI objectives
    # (read from speed-10k) against it
    Bench("round_bound.json", ("python bench/round_bound.py"
                               " --gen a100:2560x4,v100:640x16,a40:5120x2,a10:5120x2/10000/7/0.1"
                               " --gen a100:2560x4,v100:640x16,a40:5120x2,a10:5120x2/10000/7/0.0"
                               " --speed bench/results/speed-10k.json",), 300, after=("speed-10k.json",)),
    Bench("speed-150k.json", ("python bench/speed.py --name speed-150k"
                              " --gen a100:80x4,v100:20x16,a40:160x2,a10:160x2/150000/3/0.5",), 300),
    Bench("solve.json", ("python bench/solve.py --rounds 3",), 150),
    Bench("overload.json", ("python bench/overload.py",), 200),
    Bench("speed_drift.json", ("python bench/speed_drift.py --seconds 60",), 70),
    Bench("colocation.json", ("python bench/colocation.py",), 190),
    Bench("slurm_faults.json", ("python bench/slurm_faults.py",), 150),
    Bench("runners.json", ("python bench/runners.py --faults-only --out-dir bench/results --ckpt-run-s 70",), 240),
    Bench("estimator_accuracy.json", ("python bench/estimator_accuracy.py",), 630,
          writes=("estimator_accuracy_profiles.json",)),
    # how well this host reproduces itself: estimator_accuracy's own rounds (separate launches), side by side
    Bench("repeatability.json", ("python bench/repeatability.py bench/results/estimator_accuracy.json",), 5,
          after=("estimator_accuracy.json",)),
    Bench("simulate.json", ("python bench/simulate.py",), 420),
    # issue 14's "all six together": the comparison a user runs on this 2-core machine, two policies at a time
    # (arena, the longest, first); run with nothing beside it
    Bench("simulate-parallel.json", ("python bench/simulate.py --policies arena,arena-greedy,gavel,sia,elasticflow,"
                                     "fcfs --modes full --parallel 2 --name simulate-parallel",), 150),
    Bench("simulate-baselines-timing.json", ("python bench/simulate.py --policies fcfs,gavel,sia,elasticflow,"
                                             "arena-greedy --modes full --name simulate-baselines-timing",), 240),
    Bench("bound-philly.json", ("python bench/bound.py --parts philly --name bound-philly --time-limit 1200",),
          900, after=("simulate.json",)),
)


def command_matches(bench: Bench, recorded: str) -> bool:
    """Whether a recorded command is the bench's own (any scratch folder standing for {tmp})."""
    pattern = re.escape(bench.command).replace(re.escape("{tmp}"), r"\S+")
    return re.fullmatch(pattern, recorded) is not None


def stale(problems: dict[str, list[str]]) -> dict[str, list[str]]:
    """{bench name: reasons} of the benches with a result that is stale or missing (`problems`:
    _provenance.problems())."""
    out: dict[str, list[str]] = {}
    recs = prov.records()
    for b in BENCHES:
        path = f"{prov.RESULTS}/{b.result}"
        why = [w for f in b.files for w in problems.get(f"{prov.RESULTS}/{f}", [])]
        rec = recs.get(path)
        if not (prov.ROOT / path).is_file():
            why.append("no result")
        elif rec is not None and not command_matches(b, rec.get("command", "")):
            why.append(f"made by `{rec.get('command')}`, not `{b.command}`")
        if why:
            out[b.name] = list(dict.fromkeys(why))
    return out


def _run_step(argv: list[str], limit_s: float) -> int | str:
    """Exit status of one step, or why it was stopped; the step runs in its own process group so that a
    stopped bench takes its children (simulator workers, torchrun) with it."""
    proc = subprocess.Popen(argv, cwd=prov.ROOT, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        return proc.wait(timeout=limit_s)
    except (subprocess.TimeoutExpired, KeyboardInterrupt) as e:
        for sig, wait_s in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
            try:
                os.killpg(proc.pid, sig)
                proc.wait(timeout=wait_s)
                break
            except ProcessLookupError:
                break
            except subprocess.TimeoutExpired:
                continue
        if isinstance(e, KeyboardInterrupt):
            raise
        return f"stopped after {limit_s:.0f} s"


def run_one(bench: Bench, console: Console, limit_factor: float) -> tuple[bool, float]:
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"bench-{bench.name}-") as tmp:
        for step in bench.steps:
            argv = shlex.split(step.format(tmp=tmp))
            argv[0] = sys.executable if argv[0] == "python" else argv[0]
            console.print(f"[bold]{bench.name}[/]: {step.format(tmp=tmp)}")
            try:
                rc = _run_step(argv, limit_factor * bench.expected_s + 600)
            except OSError as e:
                rc = f"could not start: {e}"
            if rc != 0:
                console.print(f"[red bold]{bench.name} FAILED[/] ({f'exit {rc}' if isinstance(rc, int) else rc}) "
                              f"in {time.monotonic() - t0:.0f} s: {step.format(tmp=tmp)}")
                return False, time.monotonic() - t0
    return True, time.monotonic() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stale", action="store_true", help="only the benches whose results are stale or missing")
    ap.add_argument("--only", default="", help="comma-separated bench names (result stems)")
    ap.add_argument("--skip", default="", help="comma-separated bench names to leave out")
    ap.add_argument("--dry-run", action="store_true", help="list what would run, with the reasons, and stop")
    ap.add_argument("--limit-factor", type=float, default=3.0,
                    help="stop a bench after this many times its expected seconds, plus 600 s (a hung bench)")
    args = ap.parse_args(argv)
    names = {b.name for b in BENCHES}
    only, skip = set(filter(None, args.only.split(","))), set(filter(None, args.skip.split(",")))
    if unknown := (only | skip) - names:
        print(f"error: --only/--skip: no bench named {', '.join(sorted(unknown))} "
              f"(known: {', '.join(sorted(names))})", file=sys.stderr)
        return 2
    chosen = [b for b in BENCHES if (not only or b.name in only) and b.name not in skip]
    console = Console(soft_wrap=True)  # whole lines in an unattended log

    def todo() -> dict[str, list[str]]:
        if not args.stale:
            return {b.name: ["rerun of every bench"] for b in chosen}
        reasons = stale(prov.problems())
        return {b.name: reasons[b.name] for b in chosen if b.name in reasons}

    pending = todo()
    if args.dry_run or not pending:
        for b in chosen:
            if b.name in pending:
                console.print(f"{b.name} (~{b.expected_s:.0f} s): {'; '.join(pending[b.name])}\n    {b.command}")
        total = sum(b.expected_s for b in chosen if b.name in pending)
        console.print(f"{len(pending)} of {len(chosen)} benches to run, about {total / 60:.0f} min")
        return 0
    done: dict[str, tuple[bool, float]] = {}
    by_result = {b.result: b for b in BENCHES}
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), console=console) as progress:
        task = progress.add_task("benches", total=len(pending))
        while pending:
            # first in BENCHES order whose inputs are not about to be remade
            ready = [b for b in chosen if b.name in pending and b.name not in done
                     and not any(by_result[a].name in pending and by_result[a].name not in done for a in b.after)]
            if not ready:
                break
            bench = ready[0]
            progress.update(task, description=f"{bench.name} (~{bench.expected_s:.0f} s; load "
                                              f"{os.getloadavg()[0]:.1f})")
            done[bench.name] = run_one(bench, console, args.limit_factor)
            ok, secs = done[bench.name]
            console.print(f"{'ok' if ok else 'FAILED'}: {bench.name} in {secs:.0f} s")
            progress.advance(task)
            pending = {n: w for n, w in todo().items() if n not in done}
            progress.update(task, total=len(done) + len(pending))
    table = Table(title="bench/run_all.py")
    for col in ("bench", "result", "wall s", "expected s"):
        table.add_column(col)
    for b in BENCHES:
        if b.name in done:
            ok, secs = done[b.name]
            table.add_row(b.name, "ok" if ok else "[red]FAILED[/]", f"{secs:.0f}", f"{b.expected_s:.0f}")
    console.print(table)
    console.print(f"total {sum(s for _, s in done.values()) / 60:.1f} min")
    left = stale(prov.problems())
    for n, why in left.items():
        if not only or n in only:
            console.print(f"[yellow]still stale[/]: {n}: {'; '.join(why)}")
    return 1 if any(not ok for ok, _ in done.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
